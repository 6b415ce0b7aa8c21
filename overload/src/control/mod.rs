//! One overload controller per client: the place where the policies of this crate meet.
//!
//! # Why one controller
//!
//! Each policy of this crate answers one narrow question about one signal: [`crate::retry`]
//! counts failures and draws backoff, [`crate::budget`] caps retries against first attempts,
//! [`crate::deadline`] does `timeoutMS` arithmetic, [`crate::admission`] throttles first
//! attempts and limits operations in flight per server. An operation meets all of them, and the
//! order in which it meets them is itself a decision: whether a retry is refused by the deadline
//! or by the budget changes what the budget is charged and what error the application sees;
//! whether a slot is taken before or after the throttle decides what the throttle counts. That
//! order used to live in the driver's executor and in half a dozen wiring files, none with a
//! unit test of its own. [`Controller`] holds it in one type, with plain inputs (names,
//! addresses, labels, clock readings) and plain answers, so each rule is tested here with an
//! injected clock, and the driver only asks, waits, sends, and reports.
//!
//! # The questions
//!
//! The executor asks four things, at fixed points of an operation, and the pinned-connection
//! getMore retry asks the second one too, so both retry paths get the same answers:
//!
//! 1. **What deadline does the operation carry?** ([`Controller::deadline`]) `timeoutMS` from the
//!    operation, else its collection or database, else the client; for the commands that
//!    continue or end admitted work ([`EXEMPT_COMMANDS`], the same list the throttle exempts)
//!    only their own, which their cursor or transaction gives them, never an inherited one.
//!    Actions that run several commands under one deadline ask [`next_batch`] for
//!    each batch's share.
//! 2. **May this attempt start?** ([`Controller::start_attempt`], then [`SlotRequest::poll`])
//!    Answers: send (with an [`Attempt`] that holds the server's concurrency slot), wait until
//!    an instant (no slot is free; wait for a release or that instant, then ask again), reject
//!    locally (the throttle, or a slot wait without `timeoutMS` that reached
//!    `serverSelectionTimeoutMS`), or time out (a slot wait that reached the deadline). Before
//!    selection, [`Controller::avoided_servers`] says which servers to avoid while another
//!    suitable one can take the attempt.
//! 3. **May this retry be sent, and after what delay?** ([`Controller::may_retry`]) Answers:
//!    retry after a delay, return the last error, or time out (the deadline has passed).
//! 4. **What `maxTimeMS` does this command carry?** ([`Controller::max_time`]) The time left
//!    minus the server's minimum round-trip time (a cursor's commands may carry none, or
//!    `maxAwaitTimeMS` cut to it: [`crate::cursor`]), or time out without sending.
//!
//! And it is told every outcome: [`Attempt::finish`] after each attempt (the throttle's window,
//! the limit's latency samples, the service-time estimate), [`Controller::failure`] for each
//! failure (the statistics), [`Controller::send_retry`] for each retry about to be sent (the
//! budget's charge, the statistics), and [`Controller::succeeded`] for each operation that
//! succeeded (the budget's refund).
//!
//! # The order of gates
//!
//! Starting an attempt: **slot, then throttle**. The slot comes first so that the throttle counts
//! only requests that could be sent: one that timed out waiting for a slot never reached the
//! server, and counted as a request the server accepted it would lower the rejection
//! probability while the server rejects everything it receives. The throttle decides only first
//! attempts, outside transactions ([`AttemptKind`]), of commands that start new work
//! ([`crate::admission`]).
//!
//! A slot wait ends at the operation's deadline when it has one (a timeout error), else after
//! the slot wait the client was given (`serverSelectionTimeoutMS`; a local rejection, since no
//! `timeoutMS` was asked for). A wait too long for the clock to represent has no end. While it
//! waits, the caller looks again at least every [`SLOT_RECHECK`]: a limit can rise without any
//! slot being released (a round of low latency, the end of a probe), and such a rise wakes
//! nobody. A wait also ends when the caller reports that the server changed under it (its pool
//! cleared, a primary stepped down: [`SlotRequest::after_wait`]); the attempt then goes
//! back to server selection, at most [`MAX_RESELECTIONS`] times.
//!
//! Retrying, in order:
//!
//! 1. **the deadline** ([`crate::retry::RetryState::admit`]): passed → time out, caused by the
//!    last error; the backoff, or the backoff plus the server's typical service time, does not
//!    fit → return the last error without sleeping;
//! 2. **the cap** (one ordinary retry; `maxAdaptiveRetries` once an overload error was seen;
//!    unbounded by count under a deadline) → return the last error;
//! 3. **the budget**, asked only for retries after overload errors (the ordinary retry follows
//!    topology changes, not load, and the specifications require it): without a retry's worth
//!    of credit → return the last error at once, without sleeping;
//! 4. **the delay**: the backoff after an overload error (the very delay the deadline check saw),
//!    none after an ordinary one.
//!
//! The budget comes after the deadline and the cap so that a retry refused for another reason
//! never costs anything.
//!
//! The budget is *asked* at the decision and *pays* when the retry is sent, after its backoff
//! ([`Controller::send_retry`]; if another operation spent the last credit meanwhile, the
//! operation returns its last error then). Paying at the decision would hold a retry's worth
//! for every retry sleeping its backoff: at 30 % transient errors a freshly started client
//! holds more than its whole reserve that way, and the lab saw it refuse retries that the
//! budget's steady state pays for easily. An operation that then succeeds gets back what its
//! retries cost ([`Controller::succeeded`]) while the client's servers accepted at least half
//! of its recent attempts: the budget then bounds the retries of operations that fail anyway,
//! and below that line, where a server is shedding overload, every retry. `crate::budget` says
//! why, with the figures.
//!
//! A timeout error is never retried: the executor returns it at once, and a retry question
//! about it is answered "time out".
//!
//! # What each policy sees
//!
//! - The **budget** sees every operation's first attempt (a deposit, [`Controller::deposit`]),
//!   every retry after an overload error that the deadline and the cap admitted (a question,
//!   then a charge when it is sent), and the success of an operation it paid retries for (a
//!   refund).
//! - The **throttle** of a server sees the first attempts it admitted and the overload errors
//!   they met, and nothing else: not retries, not transaction statements, not continuations.
//! - The **concurrency limit** of a server sees every attempt that took a slot and how it ended:
//!   a reply's latency (a sample), an overload error (a decrease), or no reply at all (a lower
//!   bound: a network error, a timeout, a dropped future, a failed checkout).
//! - The **service-time estimate** of a server sees the latency of successful attempts and of
//!   overload rejections of operations under a deadline (the only ones that read it), and the
//!   retry gate reads it: the successes' median, or the rejections' while no success is recent.
//!
//! # Events
//!
//! Every decision is one [`Decision`], published once ([`event`]): on the `mongodb::overload`
//! tracing target, in the client's statistics (and the `metrics` feature's counters), and to an
//! optional observer the driver installs ([`Controller::observe`]).

mod admission;
pub mod event;

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

pub use admission::{
    Attempt, AttemptEnd, ReleaseSignal, SlotRequest, StartAnswer, MAX_RESELECTIONS, SLOT_RECHECK,
};
pub use event::{Decision, Observer, Refusal};

use crate::admission::{ClientLag, ConcurrencyConfig, ThrottleConfig};
use crate::backoff::Jitter;
use crate::budget::{Acceptance, RetryBudget, RetryBudgetConfig, RetryBudgetHandle, RetryOrigin};
use crate::cursor::ServerTimeLimit;
use crate::deadline::{Admission, Deadline, Declined};
use crate::retry::{Failure, RetryState};
use crate::stats::OverloadStatsRecorder;

/// Commands outside `timeoutMS` and outside the throttle: a cursor's later batches and
/// cleanup, a transaction's outcome, and the end of sessions. They continue or end work the
/// server already admitted; rejecting or cutting one would not spare the server that work, and
/// could strand it (an open cursor, a transaction holding its locks until it times out).
pub const EXEMPT_COMMANDS: [&str; 5] = [
    "getMore",
    "killCursors",
    "commitTransaction",
    "abortTransaction",
    "endSessions",
];

/// Whether the command `name` continues or ends admitted work ([`EXEMPT_COMMANDS`]).
pub fn is_exempt(name: &str) -> bool {
    EXEMPT_COMMANDS.contains(&name)
}

/// The servers a client keeps state for beyond which idle entries are dropped: addresses leave
/// the topology and new ones come, and the map must stay a bounded multiple of what is in use.
pub const MAX_IDLE_SERVERS: usize = 64;

/// The pool sizes the concurrency limit's ceiling comes from: the client's `maxPoolSize`, if
/// set, and the driver's default for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolSize {
    pub configured: Option<u32>,
    pub default: u32,
}

impl PoolSize {
    /// The ceiling of the concurrency limit: the pool's size (the driver cannot have more
    /// operations in flight on a server than connections to it); `maxPoolSize=0`, no limit on
    /// the pool, leaves the limit's own ceiling.
    pub fn limit_ceiling(self) -> u32 {
        let most = crate::admission::concurrency::MAX_MAX_LIMIT;
        match self.configured {
            Some(0) => most,
            Some(size) => size.min(most),
            None => self.default,
        }
    }
}

/// The concurrency options a client may set; unset ones take the limit's defaults.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ConcurrencyOptions {
    pub min_limit: Option<u32>,
    pub tolerance: Option<f64>,
    pub probe_interval: Option<Duration>,
}

impl ConcurrencyOptions {
    /// The limit's configuration for a pool of `pool` connections (not validated). The default
    /// minimum never exceeds the ceiling, so a small pool is valid without further options.
    pub fn config(self, pool: PoolSize) -> ConcurrencyConfig {
        let defaults = ConcurrencyConfig::default();
        let max_limit = pool.limit_ceiling();
        ConcurrencyConfig {
            min_limit: self.min_limit.unwrap_or(defaults.min_limit.min(max_limit)),
            max_limit,
            tolerance: self.tolerance.unwrap_or(defaults.tolerance),
            probe_interval: self.probe_interval.unwrap_or(defaults.probe_interval),
        }
    }
}

/// What a client's controller is made of, already validated by the caller.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// `maxAdaptiveRetries` (unset: the specification's default).
    pub max_adaptive_retries: Option<u32>,
    /// The retry budget, when `retryBudget=true`.
    pub budget: Option<RetryBudgetConfig>,
    /// The adaptive throttle, when `adaptiveThrottle=true`.
    pub throttle: Option<ThrottleConfig>,
    /// The adaptive concurrency limit, when `adaptiveConcurrency=true`.
    pub concurrency: Option<ConcurrencyConfig>,
    /// How long an operation without `timeoutMS` may wait for a slot: the client's
    /// `serverSelectionTimeoutMS`, resolved by the driver with its own default.
    pub slot_wait: Duration,
    /// The client's `timeoutMS`.
    pub client_timeout: Option<Duration>,
}

/// The `timeoutMS` settings that may apply to one operation, most specific first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timeouts {
    /// The operation's own option.
    pub operation: Option<Duration>,
    /// Its collection's or database's (which inherited the client's when they were made).
    pub target: Option<Duration>,
}

/// What the next batch of a multi-command action runs under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchTime {
    /// No limited deadline: the batch runs with the action's options as they are.
    AsGiven,
    /// The batch's `timeoutMS` is what remains of the action's deadline.
    Remaining(Duration),
    /// Nothing remains: fail with the timeout error before the batch.
    Expired,
}

/// The answer to "may this retry be sent?".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryAnswer {
    /// Send the retry after sleeping this long (zero after an ordinary error).
    RetryAfter(Duration),
    /// Do not retry: return the last error, for this reason.
    ReturnLastError(Refusal),
    /// The deadline has passed: return the timeout error caused by the last error.
    TimedOut,
}

/// The time the next batch of an action under `deadline` may take at `now`: every batch is its
/// own command with its own deadline, which must be what remains of the action's one deadline
/// rather than a fresh `timeoutMS`.
pub fn next_batch(deadline: Option<Deadline>, now: Instant) -> BatchTime {
    match deadline.and_then(|deadline| deadline.remaining(now)) {
        None => BatchTime::AsGiven,
        Some(remaining) if remaining.is_zero() => BatchTime::Expired,
        Some(remaining) => BatchTime::Remaining(remaining),
    }
}

/// Which attempt of an operation wants to start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptKind {
    /// The operation's first attempt, outside a transaction: the only kind the throttle decides.
    First,
    /// A retry: the throttle already admitted the operation.
    Retry,
    /// A statement inside a transaction (first attempt or not): rejecting it would leave the
    /// transaction holding its locks until it times out, as for the continuations.
    InTransaction,
}

impl AttemptKind {
    /// The kind of an attempt after `failures` failures of its operation, `in_transaction` or not.
    pub fn of(failures: bool, in_transaction: bool) -> Self {
        match (failures, in_transaction) {
            (_, true) => Self::InTransaction,
            (true, false) => Self::Retry,
            (false, false) => Self::First,
        }
    }
}

/// What the retry gate needs to know about the operation whose attempt failed.
#[derive(Debug)]
pub struct RetryQuestion<'a, K> {
    /// The command name, for logs and the budget's log.
    pub operation: &'a str,
    /// The server the failed attempt went to (its typical service time).
    pub server: Option<&'a K>,
    /// The operation's deadline, when `timeoutMS` applies.
    pub deadline: Option<Deadline>,
}

impl<K> Clone for RetryQuestion<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for RetryQuestion<'_, K> {}

/// One client's overload controller; see the [module documentation](self). `K` is the key of
/// a server (the driver's address type); `S` is the signal a server's slot waiters wait on.
pub struct Controller<K, S = ()> {
    max_adaptive_retries: Option<u32>,
    client_timeout: Option<Duration>,
    /// The client's `serverSelectionTimeoutMS` (`Settings::slot_wait`), which also bounds a
    /// checkout under `timeoutMS`.
    server_selection_timeout: Duration,
    stats: Arc<OverloadStatsRecorder>,
    budget: Option<RetryBudgetHandle>,
    /// With the budget: how much of what the client sent its servers accepted, which decides
    /// whether the retries of an operation that succeeded are refunded.
    acceptance: Option<Arc<Acceptance>>,
    admission: Option<admission::Admission<K, S>>,
    service_times: admission::ServiceTimes<K>,
    clock: fn() -> Instant,
    observer: RwLock<Option<Observer>>,
}

impl<K, S> std::fmt::Debug for Controller<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("max_adaptive_retries", &self.max_adaptive_retries)
            .field("budget", &self.budget)
            .field("admission", &self.admission.is_some())
            .finish_non_exhaustive()
    }
}

impl<K, S> Controller<K, S>
where
    K: Clone + Eq + Hash + std::fmt::Display,
    S: ReleaseSignal,
{
    /// A controller with `settings`, reading the time from `clock` where a caller gives none
    /// (a dropped slot, the application's budget handle). Fails when a configuration is out of
    /// its range, naming the option.
    pub fn new(settings: Settings, clock: fn() -> Instant) -> Result<Self, String> {
        let stats = Arc::new(OverloadStatsRecorder::new());
        let (budget, acceptance) = match settings.budget {
            Some(config) => {
                let budget =
                    RetryBudget::starting_at(config, clock()).map_err(|e| e.to_string())?;
                let acceptance = Arc::new(Acceptance::new(config.window, clock()));
                let handle = RetryBudgetHandle::refusing_while_shed(
                    budget,
                    Arc::clone(&stats),
                    clock,
                    Arc::clone(&acceptance),
                );
                (Some(handle), Some(acceptance))
            }
            None => (None, None),
        };
        if let Some(throttle) = settings.throttle {
            throttle.validate().map_err(|e| e.to_string())?;
        }
        if let Some(concurrency) = settings.concurrency {
            concurrency.validate().map_err(|e| e.to_string())?;
        }
        let admission =
            (settings.throttle.is_some() || settings.concurrency.is_some()).then(|| {
                admission::Admission::new(
                    settings.throttle,
                    settings.concurrency,
                    settings.slot_wait,
                    Arc::clone(&stats),
                    clock,
                )
            });
        Ok(Self {
            max_adaptive_retries: settings.max_adaptive_retries,
            client_timeout: settings.client_timeout,
            server_selection_timeout: settings.slot_wait,
            stats,
            budget,
            acceptance,
            admission,
            service_times: admission::ServiceTimes::default(),
            clock,
            observer: RwLock::new(None),
        })
    }

    /// Installs `observer`, which hears every decision after the log and the statistics.
    pub fn observe(&self, observer: Observer) {
        *self.observer.write().unwrap_or_else(|e| e.into_inner()) = Some(observer);
    }

    fn publish(&self, decision: Decision<'_>) {
        event::publish(&decision, &self.stats);
        if let Some(observer) = self
            .observer
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            observer(&decision);
        }
    }

    /// The client's statistics, which the budget and the admission controls count into.
    pub fn stats(&self) -> &Arc<OverloadStatsRecorder> {
        &self.stats
    }

    /// The client's retry budget, for the application's own retry loops.
    pub fn budget(&self) -> Option<&RetryBudgetHandle> {
        self.budget.as_ref()
    }

    /// The client's lag gauge, when the concurrency limit reads one: the caller measures it
    /// every [`crate::admission::CLIENT_LAG_PERIOD`] for as long as it holds the returned
    /// reference.
    pub fn client_lag(&self) -> Option<&Arc<ClientLag>> {
        self.admission.as_ref().and_then(|a| a.client_lag())
    }

    /// The client's statistics now, with the budget's level and each server's limit.
    pub fn snapshot(&self) -> crate::stats::OverloadStats {
        let mut stats = match self.budget {
            Some(ref budget) => budget.snapshot(),
            None => self.stats.snapshot(None),
        };
        if let Some(ref admission) = self.admission {
            admission.fill(&mut stats);
        }
        stats
    }

    /// The retry state of an operation that has not failed yet.
    pub fn retry_state(&self) -> RetryState {
        RetryState::new(self.max_adaptive_retries)
    }

    /// Question 1: the deadline of an operation named `operation` with `timeouts`, starting at
    /// `now`; `None` when `timeoutMS` does not apply to it.
    pub fn deadline(&self, operation: &str, timeouts: Timeouts, now: Instant) -> Option<Deadline> {
        let budget = self.timeout(operation, timeouts)?;
        Some(Deadline::start(now, budget))
    }

    /// The `timeoutMS` in force for an operation named `operation` with `timeouts`: its own,
    /// else its collection's or database's, else the client's. Continuations run under the
    /// time their cursor or transaction gives them (their own option), never under an
    /// inherited one.
    pub fn timeout(&self, operation: &str, timeouts: Timeouts) -> Option<Duration> {
        if is_exempt(operation) {
            return timeouts.operation;
        }
        timeouts
            .operation
            .or(timeouts.target)
            .or(self.client_timeout)
    }

    /// Until when an attempt under `deadline` whose server selection started at
    /// `selection_started` may wait for its connection checkout, establishing a new connection
    /// included: the CSOT specification's `min(serverSelectionTimeoutMS, remaining timeoutMS)`,
    /// both counted from the start of selection, so that selection and checkout together never
    /// outlast `serverSelectionTimeoutMS` either. Past it the checkout ends with the timeout
    /// error. `None` without `timeoutMS`: the checkout then waits as upstream's does.
    pub fn checkout_deadline(
        &self,
        deadline: Option<Deadline>,
        selection_started: Instant,
    ) -> Option<Deadline> {
        let selection = Deadline::start(selection_started, self.server_selection_timeout);
        deadline.map(|deadline| deadline.min(selection))
    }

    /// Whether a command under `deadline` needs its server's minimum round-trip time for
    /// [`Self::max_time`]: an unlimited deadline sends no `maxTimeMS`, so the driver need not
    /// look it up.
    pub fn needs_min_rtt(&self, deadline: Deadline) -> bool {
        !deadline.is_unlimited()
    }

    /// Question 4: the `maxTimeMS` of a command sent at `now` under `deadline`, whose operation
    /// asks for `limit` (a cursor's commands differ, [`crate::cursor`]), on a server whose
    /// minimum round-trip time is `min_rtt` (`None`: send none). `Err` means time out without
    /// sending.
    pub fn max_time(
        &self,
        deadline: Deadline,
        limit: ServerTimeLimit,
        min_rtt: Duration,
        now: Instant,
    ) -> Result<Option<Duration>, crate::deadline::Expired> {
        limit.max_time(deadline, now, min_rtt)
    }

    /// Servers selection should avoid for an attempt while another suitable server can take it
    /// (first attempt: `first_attempt`): those whose limit has no free slot and, for a first
    /// attempt, those whose throttle would reject it with some probability; plus
    /// `deprioritized`, the retry loop's own. `None` when that adds nothing to `deprioritized`.
    pub fn avoided_servers(
        &self,
        first_attempt: bool,
        deprioritized: Option<&HashSet<K>>,
        now: Instant,
    ) -> Option<HashSet<K>> {
        let mut busy = self.admission.as_ref()?.busy_servers(first_attempt, now)?;
        busy.extend(deprioritized.into_iter().flatten().cloned());
        Some(busy)
    }

    /// An operation's first attempt is starting: the budget earns its share of a retry.
    pub fn deposit(&self, now: Instant) {
        if let Some(ref budget) = self.budget {
            budget.deposit_at(now);
        }
    }

    /// An attempt was answered "send" at `now`: it counts as sent for the refund rule (an
    /// attempt rejected locally or timed out waiting for a slot never reached a server).
    fn attempt_sent(&self, now: Instant) {
        if let Some(ref acceptance) = self.acceptance {
            acceptance.sent(now);
        }
    }

    /// Question 2: the attempt (`kind`) of `operation` on `server` wants to start at `now`.
    /// Poll the returned request until it answers.
    pub fn start_attempt<'o>(
        &self,
        operation: &'o str,
        server: &K,
        kind: AttemptKind,
        deadline: Option<Deadline>,
        now: Instant,
    ) -> SlotRequest<'_, 'o, K, S> {
        SlotRequest::new(self, operation, server, kind, deadline, now)
    }

    /// A failed attempt, as the statistics count it: overload errors by server code.
    pub fn failure(&self, failure: Failure, code: Option<i32>) {
        if failure.overload.is_overload() {
            self.stats.record_overload_error(code);
            if let Some(ref acceptance) = self.acceptance {
                acceptance.rejected(self.now());
            }
        }
    }

    /// Question 3: may the retry `state` calls for (its last failure recorded) be sent at
    /// `now`, and after what delay? See the module documentation for the order of the gates.
    /// The answer is published as a [`Decision`].
    pub fn may_retry(
        &self,
        state: &mut RetryState,
        question: RetryQuestion<'_, K>,
        now: Instant,
        jitter: &mut impl Jitter,
    ) -> RetryAnswer {
        let answer = self.retry_gates(state, question, now, jitter);
        let remaining = question.deadline.and_then(|d| d.remaining(now));
        match answer {
            RetryAnswer::RetryAfter(_) => {}
            RetryAnswer::ReturnLastError(reason) => self.publish(Decision::RetryRefused {
                operation: question.operation,
                reason,
                remaining,
            }),
            RetryAnswer::TimedOut => self.publish(Decision::RetryRefused {
                operation: question.operation,
                reason: Refusal::DeadlinePassed,
                remaining,
            }),
        }
        answer
    }

    fn retry_gates(
        &self,
        state: &mut RetryState,
        question: RetryQuestion<'_, K>,
        now: Instant,
        jitter: &mut impl Jitter,
    ) -> RetryAnswer {
        // Without a deadline, `admit` only draws the delay and keeps it, so that the delay the
        // caller sleeps (`RetryState::backoff`) is the one answered here.
        let mut typical = Duration::ZERO;
        if let Some(deadline) = question.deadline {
            state.set_deadline(deadline);
            if let Some(server) = question.server {
                typical = self.service_times.typical(server, now);
            }
        }
        match state.admit(now, jitter, typical) {
            Admission::Expired => return RetryAnswer::TimedOut,
            Admission::Decline(Declined::BackoffPastDeadline) => {
                return RetryAnswer::ReturnLastError(Refusal::BackoffPastDeadline)
            }
            Admission::Decline(Declined::CannotFinish) => {
                return RetryAnswer::ReturnLastError(Refusal::CannotFinish)
            }
            Admission::Decline(Declined::Exhausted) | Admission::Retry(_) => {}
        }
        if state.exhausted() {
            return RetryAnswer::ReturnLastError(Refusal::Exhausted);
        }
        let overloaded = state.last_failure().overload.is_overload();
        if overloaded {
            if let Some(ref budget) = self.budget {
                if !budget.has_credit_at(RetryOrigin::Driver, Some(question.operation), now) {
                    return RetryAnswer::ReturnLastError(Refusal::Budget);
                }
            }
            RetryAnswer::RetryAfter(state.backoff(jitter))
        } else {
            RetryAnswer::RetryAfter(Duration::ZERO)
        }
    }

    /// The operation `state` belongs to succeeded at `now`: the budget gets back the retries it
    /// paid for that operation, while the servers accepted at least half of the client's recent
    /// attempts (`crate::budget`, "Why refunds").
    pub fn succeeded(&self, state: &RetryState, now: Instant) {
        if let (Some(budget), Some(acceptance)) = (&self.budget, &self.acceptance) {
            if state.budget_paid() > 0 && acceptance.mostly_accepted(now) {
                budget.refund_at(state.budget_paid(), now);
            }
        }
    }

    /// The same question for a command that must run again on one pinned connection (the
    /// getMore of a client bulkWrite's results in load-balanced mode): only a retryable
    /// overload error that the command allows (`allowed`) is retried there, since an ordinary
    /// retryable error means the connection is gone. Records `failure` in `state` when it is
    /// retried; then the gates are the executor's.
    pub fn may_retry_pinned(
        &self,
        state: &mut RetryState,
        failure: Failure,
        allowed: bool,
        question: RetryQuestion<'_, K>,
        now: Instant,
        jitter: &mut impl Jitter,
    ) -> RetryAnswer {
        if !failure.overload.is_retryable() || !allowed {
            return RetryAnswer::ReturnLastError(Refusal::NotRetryable);
        }
        state.record_failure(failure);
        self.may_retry(state, question, now, jitter)
    }

    /// Whether anyone hears [`Self::retrying`]: the log at DEBUG, an observer, or the `metrics`
    /// feature's decision counter. When not, the caller need not assemble the event.
    pub fn hears_retries(&self) -> bool {
        cfg!(feature = "metrics")
            || crate::trace::retry_attempts_enabled()
            || self
                .observer
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .is_some()
    }

    /// A retry is about to be made (before its backoff); see [`Self::hears_retries`].
    pub fn retrying(&self, attempt: crate::trace::RetryAttempt<'_>) {
        self.publish(Decision::Retry(attempt));
    }

    /// The retry of `operation` that [`Self::may_retry`] admitted for `state` is about to be
    /// sent at `now`, after sleeping `backoff` (`None`: an ordinary retry, which sleeps none).
    /// A retry after an overload error is paid for here, from the budget. `false`: the budget
    /// ran dry while the retry slept (other operations spent the credit it had been answered
    /// with); the operation returns its last error instead, and the refusal is published.
    pub fn send_retry(
        &self,
        state: &mut RetryState,
        operation: &str,
        backoff: Option<Duration>,
        now: Instant,
    ) -> bool {
        if let Some(backoff) = backoff {
            self.stats.record_backoff(backoff);
        }
        if let (Some(budget), true) = (&self.budget, state.last_failure().overload.is_overload()) {
            if !budget.withdraw_at(RetryOrigin::Driver, Some(operation), now) {
                self.publish(Decision::RetryRefused {
                    operation,
                    reason: Refusal::Budget,
                    remaining: state.deadline().and_then(|d| d.remaining(now)),
                });
                return false;
            }
            state.record_budget_paid();
        }
        self.stats.record_retry_made();
        true
    }

    /// The typical service time of `server` at `now` (zero while unknown).
    pub fn typical_service(&self, server: &K, now: Instant) -> Duration {
        self.service_times.typical(server, now)
    }

    /// Now, on the controller's clock.
    pub fn now(&self) -> Instant {
        (self.clock)()
    }
}

#[cfg(test)]
mod tests;
