//! The controller's per-server state (throttle, concurrency limit, service time), the answer to
//! "may this attempt start?" and the attempt's report of how it ended.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::{Controller, Decision, MAX_IDLE_SERVERS};
use crate::admission::{
    AdaptiveThrottle, ClientLag, ConcurrencyConfig, ConcurrencyLimit, ConcurrencyPermit, Outcome,
    ThrottleConfig, ThrottleDecision,
};
use crate::backoff::Jitter;
use crate::deadline::{Deadline, ServiceTime};
use crate::labels::Overload;
use crate::stats::{OverloadStats, OverloadStatsRecorder};

/// The longest a slot waiter waits between looks at its server's limit: a limit can rise
/// without any slot being released (a round of low latency, the end of a probe), and such a
/// rise wakes nobody.
pub const SLOT_RECHECK: Duration = Duration::from_millis(20);

/// Most times one attempt goes back to server selection because its server changed while it
/// waited for a slot ([`SlotRequest::after_wait`]); after that it waits on the server it was
/// given, as without the change. A server that keeps changing (a flapping member) cannot hold
/// an attempt in selection and admission for longer than that many waits.
pub const MAX_RESELECTIONS: u32 = 3;

/// What a server's slot waiters wait on: the caller's own primitive (the driver's is tokio's
/// `Notify`), signalled once for each slot released.
pub trait ReleaseSignal: Default + Send + Sync {
    /// A slot of the server was released: wake one waiter.
    fn slot_released(&self);
}

impl ReleaseSignal for () {
    fn slot_released(&self) {}
}

/// One client's admission controls.
pub(super) struct Admission<K, S> {
    throttle: Option<ThrottleConfig>,
    concurrency: Option<ConcurrencyConfig>,
    servers: RwLock<HashMap<K, Arc<ServerState<S>>>>,
    stats: Arc<OverloadStatsRecorder>,
    /// How long an operation without `timeoutMS` may wait for a slot.
    slot_wait: Duration,
    /// The client's own scheduling lag, which every concurrency limit reads.
    client_lag: Option<Arc<ClientLag>>,
    clock: fn() -> Instant,
}

/// One server's throttle and limit.
pub(super) struct ServerState<S> {
    /// The server, for logs and statistics.
    name: String,
    throttle: Option<AdaptiveThrottle>,
    limit: Option<ConcurrencyLimit>,
    /// Signalled whenever a slot of this server is released.
    released: Arc<S>,
    /// The limit last published, so that only changes are.
    published_limit: AtomicU32,
}

impl<K, S> Admission<K, S>
where
    K: Clone + Eq + Hash + std::fmt::Display,
    S: super::ReleaseSignal,
{
    pub(super) fn new(
        throttle: Option<ThrottleConfig>,
        concurrency: Option<ConcurrencyConfig>,
        slot_wait: Duration,
        stats: Arc<OverloadStatsRecorder>,
        clock: fn() -> Instant,
    ) -> Self {
        Self {
            throttle,
            concurrency,
            servers: RwLock::new(HashMap::new()),
            stats,
            slot_wait,
            client_lag: concurrency.map(|_| Arc::new(ClientLag::new())),
            clock,
        }
    }

    pub(super) fn client_lag(&self) -> Option<&Arc<ClientLag>> {
        self.client_lag.as_ref()
    }

    /// Servers whose limit has no free slot and, for a first attempt, whose throttle would
    /// reject it with some probability (a local rejection is final, where the same operation
    /// on another member, a read with `nearest` say, would be served). `None` when none.
    pub(super) fn busy_servers(&self, first_attempt: bool, now: Instant) -> Option<HashSet<K>> {
        let throttling = first_attempt && self.throttle.is_some();
        if self.concurrency.is_none() && !throttling {
            return None;
        }
        let servers = self.servers.read().unwrap_or_else(|e| e.into_inner());
        let busy: HashSet<K> = servers
            .iter()
            .filter(|(_, server)| {
                let full = server
                    .limit
                    .as_ref()
                    .is_some_and(|limit| !limit.has_free_slot());
                let rejecting = throttling
                    && server
                        .throttle
                        .as_ref()
                        .is_some_and(|throttle| throttle.rejection_probability(now) > 0.0);
                full || rejecting
            })
            .map(|(key, _)| key.clone())
            .collect();
        (!busy.is_empty()).then_some(busy)
    }

    /// The state of `key`, made at `now` on first use. Beyond [`MAX_IDLE_SERVERS`] entries,
    /// the idle ones (no attempt holds a reference) are dropped first.
    fn server(&self, key: &K, now: Instant) -> Arc<ServerState<S>> {
        if let Some(server) = self
            .servers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
        {
            return Arc::clone(server);
        }
        let mut servers = self.servers.write().unwrap_or_else(|e| e.into_inner());
        if servers.len() >= MAX_IDLE_SERVERS {
            servers.retain(|_, server| Arc::strong_count(server) > 1);
        }
        Arc::clone(servers.entry(key.clone()).or_insert_with(|| {
            // Both configurations were validated when the controller was made.
            let limit = self
                .concurrency
                .and_then(|config| ConcurrencyLimit::starting_at(config, now, self.clock).ok());
            if let (Some(limit), Some(lag)) = (limit.as_ref(), self.client_lag.as_ref()) {
                limit.read_client_lag(Arc::clone(lag));
            }
            Arc::new(ServerState {
                name: key.to_string(),
                throttle: self
                    .throttle
                    .and_then(|config| AdaptiveThrottle::starting_at(config, now).ok()),
                published_limit: AtomicU32::new(limit.as_ref().map_or(0, ConcurrencyLimit::limit)),
                limit,
                released: Arc::default(),
            })
        }))
    }

    /// The number of servers with state, for tests of the eviction.
    #[cfg(test)]
    pub(super) fn servers_kept(&self) -> usize {
        self.servers.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Adds each server's limit to `stats`.
    pub(super) fn fill(&self, stats: &mut OverloadStats) {
        let servers = self.servers.read().unwrap_or_else(|e| e.into_inner());
        for server in servers.values() {
            if let Some(ref limit) = server.limit {
                let snapshot = limit.snapshot();
                self.stats.record_concurrency_limit(&server.name, &snapshot);
                stats
                    .concurrency_limits
                    .insert(server.name.clone(), snapshot);
            }
        }
    }
}

/// The answer to "may this attempt start?".
pub enum StartAnswer<'c, K, S: super::ReleaseSignal> {
    /// Send it; report how it ended through the [`Attempt`].
    Send(Attempt<'c, K, S>),
    /// No slot is free: wait for a release of this server's slot ([`SlotRequest::signal`]) or
    /// until this instant, whichever comes first, then poll again.
    WaitUntil(Instant),
    /// Fail without sending: the server's throttle rejected the attempt, or no slot came free
    /// within the client's slot wait (`serverSelectionTimeoutMS`) of an operation without
    /// `timeoutMS`. The message says which, naming the option.
    RejectLocally(String),
    /// The deadline passed while waiting for a slot: fail with the timeout error. The string
    /// says where.
    TimedOut(String),
    /// The server this attempt was selected for changed while it waited for a slot
    /// ([`SlotRequest::after_wait`]): select a server again and ask anew. Nothing was
    /// sent, so this is not a retry.
    Reselect,
}

/// An attempt asking to start; see [`Controller::start_attempt`].
pub struct SlotRequest<'c, 'o, K, S> {
    controller: &'c Controller<K, S>,
    operation: &'o str,
    key: Option<K>,
    server: Option<Arc<ServerState<S>>>,
    throttled: bool,
    deadline: Option<Deadline>,
    started: Instant,
    /// When the wait gives up (`None`: never); set at the first look that finds no slot.
    give_up: Option<Option<Instant>>,
}

impl<'c, 'o, K, S> SlotRequest<'c, 'o, K, S>
where
    K: Clone + Eq + Hash + std::fmt::Display,
    S: super::ReleaseSignal,
{
    pub(super) fn new(
        controller: &'c Controller<K, S>,
        operation: &'o str,
        key: &K,
        kind: super::AttemptKind,
        deadline: Option<Deadline>,
        now: Instant,
    ) -> Self {
        let server = controller
            .admission
            .as_ref()
            .map(|admission| admission.server(key, now));
        // Only operations under a deadline read the service time, so only they sample it.
        let key = deadline.map(|_| key.clone());
        let throttled = kind == super::AttemptKind::First
            && crate::admission::throttles_command(operation)
            && server.as_ref().is_some_and(|s| s.throttle.is_some());
        Self {
            controller,
            operation,
            key,
            server,
            throttled,
            deadline,
            started: now,
            give_up: None,
        }
    }

    /// The signal this request's waits end on (`None` without admission controls, which never
    /// answer "wait"), shared with the server's attempts.
    pub fn signal(&self) -> Option<Arc<S>> {
        self.server
            .as_ref()
            .map(|server| Arc::clone(&server.released))
    }

    /// Looks at `now`: take a slot, then ask the throttle; or wait, reject or time out.
    pub fn poll(&mut self, now: Instant, jitter: &mut impl Jitter) -> StartAnswer<'c, K, S> {
        let Some(server) = self.server.clone() else {
            self.controller.attempt_sent(now);
            return StartAnswer::Send(self.attempt(None, now));
        };
        let permit = match server.limit {
            None => None,
            Some(ref limit) => match limit.try_acquire(now) {
                Some(permit) => {
                    if self.give_up.is_some() {
                        self.slot_wait_ended(&server, now, true, limit.limit());
                    }
                    Some(permit)
                }
                None => return self.no_slot(&server, limit, now),
            },
        };
        let attempt = self.attempt(permit, now);
        if self.throttled {
            if let Some(ref throttle) = server.throttle {
                if throttle.admit(now, jitter) == ThrottleDecision::Reject {
                    let probability = throttle.rejection_probability(now);
                    self.controller.publish(Decision::LocalRejection {
                        operation: self.operation,
                        server: &server.name,
                        probability,
                    });
                    // Dropping `attempt` gives the slot back unused: released as abandoned
                    // after no time, which the limit does not take as a latency sample.
                    drop(attempt);
                    return StartAnswer::RejectLocally(format!(
                        "{} was not sent to {}: the server rejected most recent requests for \
                         overload, so the client rejected this one itself (adaptiveThrottle)",
                        self.operation, server.name
                    ));
                }
            }
        }
        self.controller.attempt_sent(now);
        StartAnswer::Send(attempt)
    }

    fn no_slot(
        &mut self,
        server: &ServerState<S>,
        limit: &ConcurrencyLimit,
        now: Instant,
    ) -> StartAnswer<'c, K, S> {
        let started = self.started;
        let slot_wait = self
            .controller
            .admission
            .as_ref()
            .map_or(Duration::ZERO, |a| a.slot_wait);
        let deadline = self.deadline;
        let give_up = *self.give_up.get_or_insert_with(|| {
            let wait = match deadline.map(|deadline| deadline.remaining(started)) {
                Some(remaining) => remaining,
                None => Some(slot_wait),
            };
            // A wait too long for the clock to represent (a huge serverSelectionTimeoutMS) has
            // no end.
            wait.and_then(|wait| started.checked_add(wait))
        });
        match give_up {
            Some(end) if now >= end => {
                self.slot_wait_ended(server, now, false, limit.limit());
                if deadline.is_some() {
                    StartAnswer::TimedOut(format!(
                        "waiting for a concurrency slot on {}",
                        server.name
                    ))
                } else {
                    StartAnswer::RejectLocally(format!(
                        "{} was not sent: no concurrency slot on {} came free within \
                         serverSelectionTimeoutMS (adaptiveConcurrency)",
                        self.operation, server.name
                    ))
                }
            }
            Some(end) => StartAnswer::WaitUntil(end.min(now + SLOT_RECHECK)),
            None => StartAnswer::WaitUntil(now + SLOT_RECHECK),
        }
    }

    /// The driver's look after each wait ([`StartAnswer::WaitUntil`]): `server_changed` says
    /// whether the server this request waits for changed meanwhile (its pool was cleared, since
    /// a network error marks a server unknown, or its role changed, as a primary that stepped
    /// down). Unchanged, this is [`Self::poll`]. Changed, the selection that chose the server
    /// is stale: sent there once a slot came free, the attempt would meet a paused pool or a
    /// "not primary" error, and its retry would queue for a slot again, so the waits of a
    /// failover add up past the deadline. So the wait ends ([`StartAnswer::Reselect`]) and the
    /// attempt goes back to server selection, which waits for the server to be known again or
    /// picks the new primary, unless the attempt already went back `reselections` ≥
    /// [`MAX_RESELECTIONS`] times (or is not waiting): then this too is an ordinary look.
    pub fn after_wait(
        &mut self,
        now: Instant,
        server_changed: bool,
        reselections: u32,
        jitter: &mut impl Jitter,
    ) -> StartAnswer<'c, K, S> {
        if !server_changed {
            return self.poll(now, jitter);
        }
        let waiting = self.give_up.is_some();
        let Some(server) = self.server.as_ref().filter(|_| waiting) else {
            return self.poll(now, jitter);
        };
        if reselections >= MAX_RESELECTIONS {
            return self.poll(now, jitter);
        }
        self.controller.publish(Decision::SlotWaitAbandoned {
            operation: self.operation,
            server: &server.name,
            waited: now.saturating_duration_since(self.started),
        });
        StartAnswer::Reselect
    }

    fn slot_wait_ended(&self, server: &ServerState<S>, now: Instant, acquired: bool, limit: u32) {
        self.controller.publish(Decision::SlotWaitEnded {
            operation: self.operation,
            server: &server.name,
            waited: now.saturating_duration_since(self.started),
            acquired,
            limit,
        });
    }

    fn attempt(&mut self, permit: Option<ConcurrencyPermit>, now: Instant) -> Attempt<'c, K, S> {
        Attempt {
            controller: self.controller,
            server: self.server.take(),
            key: self.key.take(),
            permit,
            throttled: self.throttled,
            started: now,
        }
    }
}

/// How an attempt ended, as the controller needs to know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptEnd {
    /// The server answered with a result.
    Succeeded,
    /// The attempt failed. `overload`: what its labels say about overload. `replied`: whether
    /// the server replied (a command error) rather than nothing arriving (a network error, a
    /// timeout, a failed connection checkout).
    Failed { overload: Overload, replied: bool },
}

/// An attempt that may be sent: holds its server's slot until [`Self::finish`] or drop.
pub struct Attempt<'c, K, S: super::ReleaseSignal> {
    controller: &'c Controller<K, S>,
    server: Option<Arc<ServerState<S>>>,
    /// The server, when the operation runs under a deadline (its service time is sampled).
    key: Option<K>,
    permit: Option<ConcurrencyPermit>,
    /// Whether the throttle counted this attempt (and so must hear of its overload error).
    throttled: bool,
    started: Instant,
}

impl<K, S> Attempt<'_, K, S>
where
    K: Clone + Eq + Hash + std::fmt::Display,
    S: super::ReleaseSignal,
{
    /// When the attempt was admitted.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Whether [`Self::finish`] has anything to record (a slot, a throttle, a service time to
    /// sample): when not, the caller may drop the attempt without reading the clock.
    pub fn reports(&self) -> bool {
        self.server.is_some() || self.key.is_some()
    }

    /// The attempt ended at `now` as `end`, having been sent at `sent` (`None`: never sent, the
    /// checkout failed). Tells the throttle whether the server answered or rejected it for
    /// overload, releases the slot with the outcome, and samples the service time of a success
    /// or of an overload rejection.
    pub fn finish(mut self, end: AttemptEnd, sent: Option<Instant>, now: Instant) {
        let latency = sent.map(|sent| now.saturating_duration_since(sent));
        let overloaded =
            matches!(end, AttemptEnd::Failed { overload, .. } if overload.is_overload());
        if let (Some(key), Some(latency)) = (self.key.as_ref(), latency) {
            let service_times = &self.controller.service_times;
            match end {
                AttemptEnd::Succeeded => service_times.record_success(key, latency, now),
                _ if overloaded => service_times.record_rejection(key, latency, now),
                AttemptEnd::Failed { .. } => {}
            }
        }
        let Some(server) = self.server.take() else {
            return;
        };
        if self.throttled {
            if let Some(ref throttle) = server.throttle {
                match end {
                    _ if overloaded => throttle.record_overload(now),
                    AttemptEnd::Succeeded | AttemptEnd::Failed { replied: true, .. } => {
                        throttle.record_accept(now)
                    }
                    // No answer says nothing about whether the server accepts work.
                    AttemptEnd::Failed { replied: false, .. } => {}
                }
            }
        }
        let Some(permit) = self.permit.take() else {
            return;
        };
        // Only a reply is a latency sample: a checkout that failed never reached the server with
        // a command, and a network error or a timeout has no reply to time.
        let outcome = match (end, latency) {
            _ if overloaded => Outcome::Overloaded,
            (AttemptEnd::Failed { replied: false, .. }, _) | (_, None) => Outcome::Abandoned,
            (_, Some(latency)) => Outcome::Answered(latency),
        };
        let limit = permit.release(now, outcome);
        server.released.slot_released();
        let published = server.published_limit.swap(limit, Ordering::Relaxed);
        if published != limit {
            self.controller.publish(Decision::LimitChanged {
                server: &server.name,
                from: published,
                to: limit,
            });
            if let Some(ref limits) = server.limit {
                // Only the `metrics` feature publishes anything here.
                self.controller
                    .stats
                    .record_concurrency_limit(&server.name, &limits.snapshot());
            }
        }
    }
}

impl<K, S: super::ReleaseSignal> Drop for Attempt<'_, K, S> {
    fn drop(&mut self) {
        // A cancelled operation: the permit releases itself as abandoned; wake a waiter.
        if self.permit.take().is_some() {
            if let Some(ref server) = self.server {
                server.released.slot_released();
            }
        }
    }
}

/// Each server's recent typical service time, for the retry gate under a deadline. One lock per
/// server, as each server's estimate had its own before the controller, so that operations on
/// different servers do not contend.
pub(super) struct ServiceTimes<K> {
    servers: RwLock<HashMap<K, Arc<Mutex<ServiceTime>>>>,
}

impl<K> Default for ServiceTimes<K> {
    fn default() -> Self {
        Self {
            servers: RwLock::new(HashMap::new()),
        }
    }
}

impl<K: Clone + Eq + Hash> ServiceTimes<K> {
    fn record_success(&self, key: &K, latency: Duration, now: Instant) {
        self.record(key, now, |service| service.record_success(now, latency));
    }

    fn record_rejection(&self, key: &K, latency: Duration, now: Instant) {
        self.record(key, now, |service| service.record_rejection(now, latency));
    }

    /// Records one sample. Skipped rather than waited for while another operation holds the
    /// server's lock: the estimate is a median of recent samples, and a missing one does not
    /// move it.
    fn record(&self, key: &K, now: Instant, sample: impl FnOnce(&mut ServiceTime)) {
        let known = self
            .servers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned();
        let service = match known {
            Some(service) => service,
            None => {
                let mut servers = self.servers.write().unwrap_or_else(|e| e.into_inner());
                if !servers.contains_key(key) && servers.len() >= MAX_IDLE_SERVERS {
                    // Bounded: forget the servers with no recent sample, then all if need be.
                    servers.retain(|_, service| {
                        service
                            .try_lock()
                            .is_ok_and(|service| !service.typical(now).is_zero())
                    });
                    if servers.len() >= MAX_IDLE_SERVERS {
                        servers.clear();
                    }
                }
                Arc::clone(servers.entry(key.clone()).or_default())
            }
        };
        // A poisoned or busy lock skips the sample; the result is dropped before the `Arc`.
        let recorded = service.try_lock().map(|mut service| sample(&mut service));
        drop(recorded);
    }

    pub(super) fn typical(&self, key: &K, now: Instant) -> Duration {
        let service = self
            .servers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned();
        service.map_or(Duration::ZERO, |service| {
            service
                .lock()
                .map(|service| service.typical(now))
                .unwrap_or_default()
        })
    }

    /// The number of servers with an estimate, for tests of the bound.
    #[cfg(test)]
    pub(super) fn servers_kept(&self) -> usize {
        self.servers.read().unwrap_or_else(|e| e.into_inner()).len()
    }
}
