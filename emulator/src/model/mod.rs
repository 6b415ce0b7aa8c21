//! The load-shedding server model: how a loaded mongod admits, queues, runs and abandons
//! requests (`emulator-notes.md` §5, seed 004).
//!
//! A request goes through two steps:
//!
//! 1. [`Model::admit`] — the ingress token bucket (`ingressRequestRateLimiter`). Rejects with
//!    462 IngressRequestRateLimitExceeded, or waits in a bounded queue for a token. Exempt
//!    commands (hello, ping, ...) pass at once.
//! 2. [`Admission::execute`] — a read or write ticket (non-FIFO wake-ups unless
//!    `tickets.wakeup` is `fifo`; an optional bounded waiter queue sheds with 433
//!    AdmissionQueueOverflow), then the command's cost in core
//!    time on a fixed number of virtual cores, in quanta that *sleep* (real-time emulation, no
//!    CPU burnt). Every `yieldPeriodMs` of work the request yields: it gives its ticket back and
//!    queues for it again.
//!
//! Like mongod, a request notices that its `maxTimeMS` (counted from arrival) has passed, or
//! that its client has gone, only at interrupt points (module `wait`): the ingress queue and the
//! ticket waits (interruptible: they wake at the deadline, and every `interruptCheckMs`) and
//! the yield points while running. Waiting for a core is not one. Stopping there costs
//! `costs.expiryMs` of core time on top of the work already done (→ 50 MaxTimeMSExpired, or
//! 279 ClientDisconnect for the kinds mongod kills on disconnect when `killOnClientDisconnect`
//! is on). Work done for expired, killed, orphaned (client gone) or failed requests is counted
//! as wasted, and so are the cost of stopping them and the optional cost of rejecting a request
//! (`costs.rejectionMs`). docs/emulator.md, "What mongod charges", gives the server source
//! behind each of these.
//!
//! Random draws (random rejections, ticket wake-ups) of a request that carries the lab's id
//! (`comment.labReq`) are keyed by the seed, that id and its attempt number (module `draws`), so
//! every lab variant meets the same luck for the same request; switching the model on restarts
//! them.
//!
//! The lab's load generator also tells the model when its application stops waiting
//! (`comment: {labDeadlineMs: <Unix epoch ms>}`). mongod cannot know this; the model uses it
//! only as a measuring oracle: a request that completes after that instant is *abandoned* and
//! its work wasted, which is how work done for applications that gave up shows in the figures.
//! The time data requests spend in the server's queues (ingress queue plus ticket waits) is
//! kept as a distribution, reset whenever the model is switched on.
//!
//! [`ModelConfig::default`] is "model off": both steps return at once. Everything is bounded:
//! every wait has a deadline (`maxTimeMS`, else `safetyTimeLimitMs`), the ingress queue and the
//! ticket waiter queues have caps, the time series is a ring. There are no background tasks:
//! probing and the per-second series advance on model events and on [`Model::snapshot`].
//! Time is `tokio::time`, so tests run with a paused clock.
//!
//! # Where the server calls it
//!
//! Every `server::Member` owns an `Arc<Model>` of its own, built from
//! `EmulatorConfig::member_overload[index]` or else `EmulatorConfig::overload`
//! ([`Model::for_member`], so members sharing a seed draw different random sequences).
//! `server::conn::serve` takes each request's arrival time right after reading it and passes a
//! disconnect future (the idle reader hitting EOF). `server::commands::handle` calls
//! [`Model::admit`] once the command name is known (before failCommand, like mongod's ingress
//! limiter) and [`Admission::execute`] just before the engine call, then
//! [`Model::record_failed`] when the engine returned an error. Rejections become error replies
//! with [`Rejection::fixed_labels`]: fixed labels for 462 and 433, the server's usual label rules
//! for 50 and 279 (so a transaction statement still gets `TransientTransactionError`). A request
//! that never reaches `execute` (failCommand answered, a parse error) just drops its
//! [`Admission`]. `serverStatus.labOverload` is the receiving member's [`Model::snapshot`]
//! (`labOverloadMembers` every member's); `setParameter` / `getParameter` of `labOverload` use
//! the receiving member's [`Model::set_parameters`] (partial documents merge into the current
//! configuration) and [`Model::config`], `labOverloadMembers` any member's.
//!
//! In a sharded deployment each logical shard owns a model too (`server::sharding`), built from
//! `EmulatorConfig::shard_overload[index]` or the sharded default (`EmulatorConfig::shards`
//! says which). A router calls [`Model::admit_forwarded`] and [`Admission::execute`] of every
//! target shard's model after its own (`server::routing`), once per attempt, with the client's
//! arrival and `maxTimeMS` (its deadline) and no disconnect future (the router's own model
//! watches the client); the shard times the attempt from its receipt;
//! `labOverloadShards` reads and sets them.

mod config;
mod cores;
mod delays;
mod draws;
mod histogram;
mod limiter;
mod probing;
mod rejection;
mod stats;
mod tickets;
mod wait;

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::SystemTime;

use bson::{Bson, Document};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::{Duration, Instant};

pub use config::{
    ConfigError, CostConfig, LimiterConfig, ModelConfig, ProbingConfig, TicketConfig, TicketMode,
    Wakeup, DEFAULT_EXEMPT_COMMANDS,
};
pub use delays::{DelayCounts, BOUNDS_US as DELAY_BOUNDS_US, NAMES as DELAY_BUCKET_NAMES};
pub use rejection::{Rejection, RejectionKind, RETRYABLE, SYSTEM_OVERLOADED};
pub use stats::{CounterSnapshot, GaugeSnapshot, ModelSnapshot, Sample, WaitPercentiles};

use cores::{Cores, SliceKind, SliceTimes};
use delays::TimedDelays;
use draws::{keyed, unit, AttemptCounter};
use limiter::{Bucket, Take};
use probing::Prober;
use stats::{add_ns, bump, Counters, Series, WaitHistogram};
use tickets::{AcquireError, Entry, TicketPool};
use wait::{Interrupt, Watch};

/// What kind of work a command is, for its cost and its ticket pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CommandKind {
    /// A lookup by `_id` (read ticket).
    PointRead,
    /// A read of about 1,000 documents through an index, or a `getMore` (read ticket).
    RangeRead,
    /// A collection scan (read ticket).
    Scan,
    /// A write (write ticket).
    Write,
    /// Anything else: no ticket; costs `costs.commandMs` of core time (0 by default).
    Command,
    /// The start of an authentication conversation (`saslStart`, or a hello carrying
    /// `speculativeAuthenticate`): no ticket; costs `costs.authMs` of core time, once per
    /// conversation, so every new authenticated connection pays it.
    Authentication,
}

impl CommandKind {
    /// Classifies a command by name and shape: writes and DDL → `Write`; `find`, `count`,
    /// `distinct` and `aggregate` (by its leading `$match`) → `PointRead` when the filter
    /// pins `_id` to one value, `RangeRead` when it constrains `_id` with operators, `Scan`
    /// otherwise; `aggregate` with `$out`/`$merge` → `Write`; `getMore` → `RangeRead`;
    /// `saslStart` and a hello with `speculativeAuthenticate` → `Authentication`; the rest →
    /// `Command`.
    pub fn classify(name: &str, body: &Document) -> CommandKind {
        match name {
            "insert" | "update" | "delete" | "findAndModify" | "findandmodify" | "bulkWrite"
            | "create" | "drop" | "createIndexes" | "dropIndexes" | "dropDatabase"
            | "renameCollection" | "collMod" => CommandKind::Write,
            "find" => by_filter(body.get_document("filter").ok()),
            "count" | "distinct" => by_filter(body.get_document("query").ok()),
            "aggregate" => {
                let stages = body.get_array("pipeline").map(Vec::as_slice).unwrap_or(&[]);
                let writes = stages.iter().any(|s| {
                    matches!(s, Bson::Document(d) if d.contains_key("$out") || d.contains_key("$merge"))
                });
                if writes {
                    return CommandKind::Write;
                }
                match stages.first() {
                    Some(Bson::Document(d)) => by_filter(d.get_document("$match").ok()),
                    _ => CommandKind::Scan,
                }
            }
            "getMore" => CommandKind::RangeRead,
            "saslStart" => CommandKind::Authentication,
            "hello" | "isMaster" | "ismaster" if body.contains_key("speculativeAuthenticate") => {
                CommandKind::Authentication
            }
            _ => CommandKind::Command,
        }
    }
}

fn by_filter(filter: Option<&Document>) -> CommandKind {
    match filter.and_then(|f| f.get("_id")) {
        None => CommandKind::Scan,
        Some(Bson::Document(d)) => match d.keys().next() {
            Some(k) if k == "$eq" && d.len() == 1 => CommandKind::PointRead,
            Some(k) if k.starts_with('$') => CommandKind::RangeRead,
            _ => CommandKind::PointRead,
        },
        Some(_) => CommandKind::PointRead,
    }
}

/// The instant on the model's clock (tokio's, which paused-time tests drive) that corresponds to
/// the wall-clock time `at`. A command's comment can only carry wall-clock time, so it is mapped
/// once, when the command is read, and the abandonment check compares instants of one clock.
/// Deadlines more than a century away count as a century away; deadlines before the monotonic
/// clock's origin (before boot) count as now, which is already past when the request completes.
fn on_model_clock(at: SystemTime) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    let (wall, now) = (SystemTime::now(), Instant::now());
    match at.duration_since(wall) {
        Ok(ahead) => now + ahead.min(CENTURY),
        Err(behind) => now.checked_sub(behind.duration()).unwrap_or(now),
    }
}

/// What the model needs to know about one request.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandInfo {
    /// The command name (first key of the body), for the limiter's exemptions.
    pub name: String,
    /// Its kind.
    pub kind: CommandKind,
    /// `maxTimeMS` (None or 0: no limit but the model's safety limit).
    pub max_time_ms: Option<u64>,
    /// Cost in ms that replaces the kind's cost (`comment: {labCostMs: 7}`).
    pub cost_override_ms: Option<f64>,
    /// A transaction statement (`autocommit: false`): never yields.
    pub in_transaction: bool,
    /// When the request was read off the socket; `maxTimeMS` counts from here.
    pub arrival: Instant,
    /// When the application stops waiting (`comment.labDeadlineMs`), if it said so, on the
    /// model's clock (tokio's, like every other instant here).
    pub client_deadline: Option<Instant>,
    /// The lab's request id (`comment.labReq`): the key of this request's random draws, so
    /// that every lab variant meets the same luck for the same request and attempt.
    pub lab_req: Option<u64>,
}

impl CommandInfo {
    /// A request of `kind` without `maxTimeMS` or override.
    pub fn new(name: impl Into<String>, kind: CommandKind, arrival: Instant) -> CommandInfo {
        CommandInfo {
            name: name.into(),
            kind,
            max_time_ms: None,
            cost_override_ms: None,
            in_transaction: false,
            arrival,
            client_deadline: None,
            lab_req: None,
        }
    }

    /// Reads name, kind ([`CommandKind::classify`]), `maxTimeMS`, `comment.labCostMs`,
    /// `comment.labDeadlineMs`, `comment.labReq` and `autocommit` from a command body.
    /// Malformed fields are ignored.
    pub fn from_command(body: &Document, arrival: Instant) -> CommandInfo {
        let name = body.keys().next().cloned().unwrap_or_default();
        let kind = CommandKind::classify(&name, body);
        let max_time_ms = match body.get("maxTimeMS") {
            Some(Bson::Int32(i)) if *i > 0 => Some(*i as u64),
            Some(Bson::Int64(i)) if *i > 0 => Some(*i as u64),
            Some(Bson::Double(d)) if d.is_finite() && *d >= 1.0 => Some(*d as u64),
            _ => None,
        };
        let comment = body.get_document("comment").ok();
        let comment_ms = |field: &str| match comment.and_then(|c| c.get(field)) {
            Some(Bson::Int32(i)) if *i >= 0 => Some(f64::from(*i)),
            Some(Bson::Int64(i)) if *i >= 0 => Some(*i as f64),
            Some(Bson::Double(d)) if d.is_finite() && *d >= 0.0 => Some(*d),
            _ => None,
        };
        let cost_override_ms = comment_ms("labCostMs");
        // Microseconds stay exact in an f64 for any epoch millisecond before the year 2255.
        let client_deadline = comment_ms("labDeadlineMs")
            .and_then(|ms| {
                SystemTime::UNIX_EPOCH
                    .checked_add(Duration::from_micros((ms.min(9e12) * 1000.0) as u64))
            })
            .map(on_model_clock);
        let in_transaction = matches!(body.get("autocommit"), Some(Bson::Boolean(false)));
        let lab_req = match comment.and_then(|c| c.get("labReq")) {
            Some(Bson::Int64(i)) => u64::try_from(*i).ok(),
            Some(Bson::Int32(i)) => u64::try_from(*i).ok(),
            _ => None,
        };
        CommandInfo {
            name,
            kind,
            max_time_ms,
            cost_override_ms,
            in_transaction,
            arrival,
            client_deadline,
            lab_req,
        }
    }

    /// Sets `maxTimeMS`.
    pub fn with_max_time_ms(mut self, ms: u64) -> CommandInfo {
        self.max_time_ms = (ms > 0).then_some(ms);
        self
    }

    /// Sets the cost override.
    pub fn with_cost_ms(mut self, ms: f64) -> CommandInfo {
        self.cost_override_ms = Some(ms);
        self
    }

    /// Sets the instant the application stops waiting.
    pub fn with_client_deadline(mut self, at: Instant) -> CommandInfo {
        self.client_deadline = Some(at);
        self
    }

    /// Sets the lab's request id.
    pub fn with_lab_req(mut self, id: u64) -> CommandInfo {
        self.lab_req = Some(id);
        self
    }

    /// A data request (anything that reads or writes documents), the kind random rejections
    /// and attempt counts apply to.
    fn is_data_request(&self) -> bool {
        !matches!(
            self.kind,
            CommandKind::Command | CommandKind::Authentication
        )
    }

    /// Whether mongod marks this request kill-on-client-disconnect: `find`, `count`,
    /// `distinct`, an `aggregate` without `$out`/`$merge` (those are `Write` here) and
    /// authentication do; writes do not; `getMore` did not in the test that lists them
    /// (docs/emulator.md, "What mongod charges").
    fn marked_kill_on_disconnect(&self) -> bool {
        match self.kind {
            CommandKind::PointRead | CommandKind::RangeRead | CommandKind::Scan => {
                self.name != "getMore"
            }
            CommandKind::Authentication => true,
            CommandKind::Write | CommandKind::Command => false,
        }
    }

    fn deadline(&self, cfg: &ModelConfig) -> Instant {
        // mongod accepts maxTimeMS up to INT32_MAX (about 24.8 days); capping keeps the
        // deadline representable whatever the caller put in.
        let ms = self
            .max_time_ms
            .unwrap_or(cfg.safety_time_limit_ms)
            .min(i32::MAX as u64);
        self.arrival + Duration::from_millis(ms)
    }

    fn cost_ms(&self, cfg: &ModelConfig) -> f64 {
        let c = &cfg.costs;
        let ms = self.cost_override_ms.unwrap_or(match self.kind {
            CommandKind::PointRead => c.point_read_ms,
            CommandKind::RangeRead => c.range_read_ms,
            CommandKind::Scan => c.scan_ms,
            CommandKind::Write => c.write_ms,
            CommandKind::Command => c.command_ms,
            CommandKind::Authentication => c.auth_ms,
        });
        if ms.is_finite() {
            ms.clamp(0.0, 3_600_000.0)
        } else {
            0.0
        }
    }
}

/// Where a finished request spent its time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ExecOutcome {
    /// Waiting in the ingress queue for a token.
    pub ingress_wait: Duration,
    /// Waiting for tickets (first and after each yield).
    pub ticket_wait: Duration,
    /// Waiting for a core while holding a ticket.
    pub core_wait: Duration,
    /// Core time used.
    pub work: Duration,
    /// Times the request yielded.
    pub yields: u32,
    /// From reaching this server (its arrival, or a router's child request's receipt) to the
    /// end of execution.
    pub total: Duration,
    /// The client had gone by the end (the work was wasted).
    pub client_disconnected: bool,
    /// The request completed after its application's deadline (the work was wasted).
    pub abandoned: bool,
}

/// The model of one server. Share it as `Arc<Model>`.
#[derive(Debug)]
pub struct Model {
    cfg: RwLock<Arc<ModelConfig>>,
    start: Instant,
    bucket: Mutex<Bucket>,
    read: TicketPool,
    write: TicketPool,
    cores: Cores,
    counters: Counters,
    queue_waits: WaitHistogram,
    completions: Mutex<CompletionTimes>,
    arrival_gaps: Mutex<ArrivalGaps>,
    in_flight: AtomicU64,
    prober: Mutex<Prober>,
    series: Mutex<Series>,
    /// Serializes reconfigurations (read-merge-write of `setParameter`).
    reconfiguring: Mutex<()>,
    /// Draws random rejections (`randomRejectShare`) for requests without a lab request id;
    /// seeded from `seed`, so a run with the same arrival order rejects the same requests.
    rejector: Mutex<StdRng>,
    /// Attempt numbers of lab request ids, the other half of their draws' key.
    attempts: Mutex<AttemptCounter>,
    /// Mixed into every seed, so that members built from one configuration draw different
    /// sequences (0 for member 0 and for [`Model::new`]: seeds exactly as configured).
    stream_salt: u64,
}

/// Where the time of requests that did all their work went: from reaching the server to
/// holding a ticket (the ingress queue and the ticket wait), and from then to completing (the
/// cores' run queue and the work). Whether a request completes before its deadline is decided
/// between the two; a model of the server (the simulator's) can be set against both.
#[derive(Debug, Default)]
struct CompletionTimes {
    waits: TimedDelays,
    runs: TimedDelays,
}

/// How the lab's requests reach the server in time: the gap from each first attempt to the
/// previous first attempt, and from each retry to the previous retry; and from each to the
/// previous attempt of the other kind. A client whose retries wait on a runtime's millisecond
/// timer sends those due in one millisecond together, so their gaps bunch near zero and near a
/// tick, and the ingress limiter's tokens are then shared unevenly between first attempts and
/// retries: which kind's bunch comes first after the tokens grew decides which kind they go
/// to. Indexed by kind: 0 for first attempts, 1 for retries.
#[derive(Debug, Default)]
struct ArrivalGaps {
    last: [Option<Instant>; 2],
    gaps: [TimedDelays; 2],
    after_other: [TimedDelays; 2],
}

impl ArrivalGaps {
    /// Attempt `attempt` (0 for the first) arrived at `now`.
    fn arrive(&mut self, attempt: u32, now: Instant) {
        let kind = usize::from(attempt > 0);
        if let Some(last) = self.last[kind] {
            self.gaps[kind].record(now.saturating_duration_since(last));
        }
        if let Some(last) = self.last[1 - kind] {
            self.after_other[kind].record(now.saturating_duration_since(last));
        }
        self.last[kind] = Some(now);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

const WRITE_SEED_SALT: u64 = 0x9e37_79b9_7f4a_7c15;
/// Keeps the random-rejection draws independent of the ticket pools' wake-up draws.
const REJECT_SEED_SALT: u64 = 0x5851_f42d_4c95_7f2d;
/// Salt of the fail points' draws ([`Admission::draws`]).
const FAIL_POINT_SEED_SALT: u64 = 0x2545_f491_4f6c_dd1d;
/// Lab request ids whose attempts are remembered (the oldest are forgotten beyond this).
const ATTEMPT_MEMORY: usize = 65_536;

/// The salt of member `index`'s random streams (0 for member 0).
fn stream_salt(index: usize) -> u64 {
    (index as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9)
}

impl Model {
    /// A model with a validated configuration.
    pub fn new(config: ModelConfig) -> Result<Arc<Model>, ConfigError> {
        Model::for_member(config, 0)
    }

    /// The model of member `index` of a deployment: as [`Model::new`], except that its random
    /// draws (ticket wake-ups, random rejections) are salted with the index, so members sharing
    /// one configuration and seed do not draw in lockstep. Member 0's model is `Model::new`'s.
    pub fn for_member(config: ModelConfig, index: usize) -> Result<Arc<Model>, ConfigError> {
        config.validate()?;
        let salt = stream_salt(index);
        let now = Instant::now();
        let (r, w) = match config.tickets.mode {
            TicketMode::Fixed => (config.tickets.read, config.tickets.write),
            TicketMode::Probing => (config.probing_initial(), config.probing_initial()),
        };
        let mw = config.tickets.max_waiters;
        let fifo = config.tickets.wakeup == Wakeup::Fifo;
        Ok(Arc::new(Model {
            start: now,
            bucket: Mutex::new(Bucket::new(config.burst_tokens(), now)),
            read: TicketPool::new(r, mw, config.seed ^ salt, fifo),
            write: TicketPool::new(w, mw, config.seed ^ salt ^ WRITE_SEED_SALT, fifo),
            cores: Cores::new(config.cores),
            counters: Counters::default(),
            queue_waits: WaitHistogram::default(),
            completions: Mutex::new(CompletionTimes::default()),
            arrival_gaps: Mutex::new(ArrivalGaps::default()),
            in_flight: AtomicU64::new(0),
            prober: Mutex::new(Prober::new(config.probing_initial(), now, 0)),
            series: Mutex::new(Series::new(config.series_capacity_secs as usize)),
            rejector: Mutex::new(StdRng::seed_from_u64(config.seed ^ salt ^ REJECT_SEED_SALT)),
            attempts: Mutex::new(AttemptCounter::new(ATTEMPT_MEMORY)),
            stream_salt: salt,
            cfg: RwLock::new(Arc::new(config)),
            reconfiguring: Mutex::new(()),
        }))
    }

    /// A model that lets everything through.
    pub fn disabled() -> Arc<Model> {
        // The default configuration is valid.
        Model::new(ModelConfig::default()).unwrap_or_else(|e| unreachable!("{e}"))
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<ModelConfig> {
        self.cfg.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the configuration at run time. Requests already waiting or running continue
    /// under the new limits; counters and the series are kept.
    pub fn reconfigure(&self, new: ModelConfig) -> Result<(), ConfigError> {
        let _one_at_a_time = lock(&self.reconfiguring);
        self.apply(new)
    }

    fn apply(&self, new: ModelConfig) -> Result<(), ConfigError> {
        new.validate()?;
        let old = self.config();
        let now = Instant::now();
        match new.tickets.mode {
            TicketMode::Fixed => {
                self.read.set_total(new.tickets.read);
                self.write.set_total(new.tickets.write);
            }
            TicketMode::Probing => {
                let mut p = lock(&self.prober);
                if old.tickets.mode != TicketMode::Probing || !old.enabled {
                    let done = self.counters.completed.load(Ordering::Relaxed);
                    *p = Prober::new(new.probing_initial(), now, done);
                } else {
                    p.clamp(&new.tickets.probing);
                }
                self.read.set_total(p.current());
                self.write.set_total(p.current());
            }
        }
        self.read.set_max_waiters(new.tickets.max_waiters);
        self.write.set_max_waiters(new.tickets.max_waiters);
        let fifo = new.tickets.wakeup == Wakeup::Fifo;
        self.read.set_fifo(fifo);
        self.write.set_fifo(fifo);
        let switched_on = new.enabled && !old.enabled;
        if new.seed != old.seed || switched_on {
            // Each lab variant switches the model on: its draws start where the previous
            // variant's started, so variants meet the same luck.
            let seed = new.seed ^ self.stream_salt;
            self.read.reseed(seed);
            self.write.reseed(seed ^ WRITE_SEED_SALT);
            *lock(&self.rejector) = StdRng::seed_from_u64(seed ^ REJECT_SEED_SALT);
            lock(&self.attempts).clear();
        }
        self.cores.resize(new.cores);
        lock(&self.series).set_capacity(new.series_capacity_secs as usize);
        if switched_on {
            // Each lab variant switches the model on; its wait figures start afresh.
            self.queue_waits.reset();
        }
        if new.limiter.enabled && !(old.limiter.enabled && old.enabled) {
            // A limiter switched on starts with a full bucket.
            lock(&self.bucket).fill(new.burst_tokens(), now);
        }
        *self.cfg.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(new);
        Ok(())
    }

    /// Applies a partial configuration document (`setParameter`) and returns the result.
    pub fn set_parameters(&self, changes: &Document) -> Result<Arc<ModelConfig>, ConfigError> {
        let _one_at_a_time = lock(&self.reconfiguring);
        let new = self.config().merged(changes)?;
        self.apply(new)?;
        Ok(self.config())
    }

    /// Step 1: the ingress limiter. May wait in the ingress queue (bounded by
    /// `maxQueueDepth` and by the request's deadline). Errors: 462, or 50 if the deadline
    /// passes in the queue. The request reached this server at `info.arrival`.
    pub async fn admit(self: &Arc<Self>, info: &CommandInfo) -> Result<Admission, Rejection> {
        self.admit_reached(info, info.arrival).await
    }

    /// Step 1 for a router's child request to a shard: as [`Model::admit`], but the request
    /// reaches this model now. `maxTimeMS` still counts from `info.arrival` (the client's
    /// arrival at the router: mongos forwards what is left of it), while the time before this
    /// attempt reached the shard (the router's own handling, and for a retry the shard's
    /// earlier rejections and the router's backoffs) is not this server's: the completed
    /// request's run (`completedRun*`), the arrival the ticket steals are timed from and the
    /// safety limit count from here.
    pub async fn admit_forwarded(
        self: &Arc<Self>,
        info: &CommandInfo,
    ) -> Result<Admission, Rejection> {
        self.admit_reached(info, Instant::now()).await
    }

    async fn admit_reached(
        self: &Arc<Self>,
        info: &CommandInfo,
        reached: Instant,
    ) -> Result<Admission, Rejection> {
        let cfg = self.config();
        let now = Instant::now();
        self.maintain(now, &cfg);
        let deadline = info.deadline(&cfg);
        let mut ingress_wait = Duration::ZERO;
        // The request's key for its random draws: its lab id and how many times it arrived.
        let draw_key = match info.lab_req {
            Some(id) if cfg.enabled && info.is_data_request() => {
                let attempt = lock(&self.attempts).arrive(id);
                lock(&self.arrival_gaps).arrive(attempt, now);
                Some((id, attempt))
            }
            _ => None,
        };
        let l = &cfg.limiter;
        if cfg.enabled && l.enabled && !l.exempt_commands.contains(&info.name) {
            let cap = cfg.burst_tokens();
            let take = lock(&self.bucket).take(now, l.rate_per_sec, cap, l.max_queue_depth);
            match take {
                Take::Now => {}
                Take::Reject => {
                    bump(&self.counters.rejected);
                    let mut r = Rejection::rate_limited(l.allow_retries, cfg.base_backoff_ms);
                    r.work = self.charge_rejection(deadline, &cfg).await;
                    return Err(r);
                }
                Take::At(valid) => {
                    let mut slot = QueueSlot {
                        model: self,
                        refund: true,
                    };
                    if valid > deadline {
                        // The queue's wait is interruptible and wakes at the deadline; then the
                        // request is unwound and answered like any expired one.
                        tokio::time::sleep_until(deadline).await;
                        drop(slot);
                        self.queue_waits.record(Instant::now() - now);
                        bump(&self.counters.expired);
                        let unwind = self.charge_expiry(&cfg).await;
                        return Err(Rejection::expired(unwind));
                    }
                    tokio::time::sleep_until(valid).await;
                    slot.refund = false;
                    drop(slot);
                    ingress_wait = Instant::now() - now;
                }
            }
        }
        if cfg.enabled && info.is_data_request() && self.draw_random_rejection(&cfg, draw_key) {
            bump(&self.counters.random_rejections);
            let mut r = Rejection::random(cfg.base_backoff_ms);
            r.work = self.charge_rejection(deadline, &cfg).await;
            return Err(r);
        }
        bump(&self.counters.admitted);
        Ok(Admission {
            model: self.clone(),
            kind: info.kind,
            cost_ms: info.cost_ms(&cfg),
            in_transaction: info.in_transaction,
            reached,
            client_deadline: info.client_deadline,
            deadline,
            ingress_wait,
            wake_key: draw_key.map(|(id, attempt)| keyed(&[id, u64::from(attempt)])),
            kill_marked: info.marked_kill_on_disconnect(),
            draws: draw_key.map(|(id, attempt)| {
                keyed(&[
                    cfg.seed ^ self.stream_salt ^ FAIL_POINT_SEED_SALT,
                    id,
                    u64::from(attempt),
                ])
            }),
        })
    }

    /// Whether this data request is one of the `randomRejectShare` rejected at random: a hash
    /// of the seed, its lab id and attempt when it has an id (`key`), else the next draw of the
    /// seeded generator. Draws nothing when the share is 0, so a configuration without random
    /// rejections leaves the generator where it was.
    fn draw_random_rejection(&self, cfg: &ModelConfig, key: Option<(u64, u32)>) -> bool {
        let share = cfg.random_reject_share;
        if share <= 0.0 || !share.is_finite() {
            return false;
        }
        match key {
            Some((id, attempt)) => {
                let seed = cfg.seed ^ self.stream_salt ^ REJECT_SEED_SALT;
                unit(keyed(&[seed, id, u64::from(attempt)])) < share
            }
            None => lock(&self.rejector).random::<f64>() < share,
        }
    }

    /// Charges `costs.expiryMs` of core time for stopping a request at an interrupt point
    /// (unwind, abort, error reply, slow-operation log; the reply waits for it) as wasted work
    /// and expiry work. Returns the time charged. Its deadline has passed, so the charge is
    /// bounded by the safety limit instead.
    async fn charge_expiry(&self, cfg: &ModelConfig) -> Duration {
        let bound = Instant::now() + Duration::from_millis(cfg.safety_time_limit_ms);
        let work = self.burn(cfg.costs.expiry_ms, bound, cfg).await;
        add_ns(&self.counters.wasted_ns, work);
        add_ns(&self.counters.expiry_ns, work);
        work
    }

    /// Charges `costs.rejectionMs` of core time for refusing a request (the reply waits for
    /// it) as wasted work and rejection work. Returns the time charged.
    async fn charge_rejection(&self, deadline: Instant, cfg: &ModelConfig) -> Duration {
        let work = self.burn(cfg.costs.rejection_ms, deadline, cfg).await;
        add_ns(&self.counters.wasted_ns, work);
        add_ns(&self.counters.rejection_ns, work);
        work
    }

    /// The server accepted a connection: charges `costs.connectionMs` of core time (TCP, TLS,
    /// handshake and a new thread in mongod) as overhead work. Returns the time charged.
    pub async fn connection_opened(&self) -> Duration {
        let cfg = self.config();
        if !cfg.enabled {
            return Duration::ZERO;
        }
        let deadline = Instant::now() + Duration::from_millis(cfg.safety_time_limit_ms);
        let work = self.burn(cfg.costs.connection_ms, deadline, &cfg).await;
        add_ns(&self.counters.overhead_ns, work);
        work
    }

    /// Runs `ms` of work outside any request (rejections, connection set-up): cores only, no
    /// ticket, no yields; gives up at `deadline`. Returns the core time used.
    async fn burn(&self, ms: f64, deadline: Instant, cfg: &ModelConfig) -> Duration {
        if !cfg.enabled || !ms.is_finite() || ms <= 0.0 {
            return Duration::ZERO;
        }
        let quantum = Duration::from_secs_f64(cfg.quantum_ms / 1000.0);
        let mut remaining = Duration::from_secs_f64(ms.min(3_600_000.0) / 1000.0);
        let mut used = Duration::ZERO;
        // Each turn charges at least min(quantum, remaining) > 0; the deadline ends it anyway.
        while !remaining.is_zero() {
            let Ok(core) =
                tokio::time::timeout_at(deadline, self.cores.acquire(SliceKind::Other)).await
            else {
                break;
            };
            let slice = remaining.min(quantum);
            let charged = self.quantum(slice, remaining, cfg).await;
            drop(core);
            used += charged;
            remaining -= charged;
        }
        used
    }

    /// Sleeps one quantum of `slice` on a core the caller holds and returns the work to charge
    /// (at most `remaining`). Earlier timer lateness is paid back first, with up to the whole
    /// slice, and lateness beyond `remaining` is banked (see `cores`).
    async fn quantum(&self, slice: Duration, remaining: Duration, cfg: &ModelConfig) -> Duration {
        let t0 = Instant::now();
        let repaid = self.cores.repay(slice);
        if repaid < slice {
            tokio::time::sleep(slice - repaid).await;
        }
        let quantum = Duration::from_secs_f64(cfg.quantum_ms / 1000.0);
        let charged = self.cores.settle(
            SliceTimes {
                slice,
                remaining,
                repaid,
                slept: Instant::now() - t0,
            },
            quantum * cfg.cores * 4,
        );
        add_ns(&self.counters.busy_ns, charged);
        charged
    }

    /// Everything the model knows now (also advances probing and the time series).
    pub fn snapshot(&self) -> ModelSnapshot {
        let cfg = self.config();
        let now = Instant::now();
        self.maintain(now, &cfg);
        ModelSnapshot {
            enabled: cfg.enabled,
            uptime_secs: (now - self.start).as_secs_f64(),
            counters: self.counter_snapshot(),
            gauges: self.gauges(now, &cfg),
            queue_wait_ms: self.queue_waits.percentiles(),
        }
    }

    /// The last `n` per-second samples, oldest first.
    pub fn series(&self, n: usize) -> Vec<Sample> {
        let cfg = self.config();
        self.maintain(Instant::now(), &cfg);
        lock(&self.series).last(n)
    }

    /// The server reports that a request the model completed then failed (e.g. a write error):
    /// its work moves from useful to wasted.
    pub fn record_failed(&self, outcome: &ExecOutcome) {
        bump(&self.counters.failed);
        if outcome.client_disconnected || outcome.abandoned {
            return; // already wasted
        }
        let ns = u64::try_from(outcome.work.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .counters
            .useful_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(ns))
            });
        self.counters.wasted_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The counters, with the ticket pools' wake-ups and the cores' hand-offs.
    fn counter_snapshot(&self) -> CounterSnapshot {
        let mut c = self.counters.read();
        let (r, w) = (self.read.wakeups(), self.write.wakeups());
        c.ticket_wakeups = r.woken + w.woken;
        c.ticket_races_lost = r.races_lost + w.races_lost;
        let mut wakes = r.wakes;
        wakes.add(&w.wakes);
        c.ticket_wake_ms = wakes.ms();
        c.ticket_wake_delays = wakes.sizes;
        let (request, other) = self.cores.handoffs();
        c.request_handoffs = request.count();
        c.request_handoff_ms = request.ms();
        c.request_handoff_delays = request.sizes;
        c.other_handoffs = other.count();
        c.other_handoff_ms = other.ms();
        c.other_handoff_delays = other.sizes;
        let mut steals = r.steals;
        steals.add(&w.steals);
        c.ticket_steals = steals.after_release;
        c.ticket_stealers_arrived_before = steals.arrived_before;
        c.ticket_stealers_arrived_after = steals.arrived_after;
        c.ticket_steals_by_yields = steals.by_yields;
        let over = self.cores.oversleep();
        c.slice_oversleep_ms = over.ms();
        c.slice_oversleep = over.sizes;
        let done = lock(&self.completions);
        c.completed_wait_ms = done.waits.ms();
        c.completed_waits = done.waits.sizes;
        c.completed_run_ms = done.runs.ms();
        c.completed_runs = done.runs.sizes;
        drop(done);
        let gaps = lock(&self.arrival_gaps);
        c.first_attempt_gap_ms = gaps.gaps[0].ms();
        c.first_attempt_gaps = gaps.gaps[0].sizes;
        c.retry_gap_ms = gaps.gaps[1].ms();
        c.retry_gaps = gaps.gaps[1].sizes;
        c.first_attempt_after_retry_gap_ms = gaps.after_other[0].ms();
        c.first_attempt_after_retry_gaps = gaps.after_other[0].sizes;
        c.retry_after_first_attempt_gap_ms = gaps.after_other[1].ms();
        c.retry_after_first_attempt_gaps = gaps.after_other[1].sizes;
        c
    }

    fn gauges(&self, now: Instant, cfg: &ModelConfig) -> GaugeSnapshot {
        let (queued, tokens) = {
            let b = lock(&self.bucket);
            (
                b.queued(),
                b.tokens_at(now, cfg.limiter.rate_per_sec, cfg.burst_tokens()),
            )
        };
        let r = self.read.counts();
        let w = self.write.counts();
        GaugeSnapshot {
            ingress_queue_depth: queued,
            ingress_tokens: tokens,
            read_waiters: r.waiters,
            write_waiters: w.waiters,
            read_tickets_in_use: r.in_use,
            read_tickets_total: r.total,
            write_tickets_in_use: w.in_use,
            write_tickets_total: w.total,
            cores_busy: self.cores.busy(),
            cores_total: self.cores.total(),
            in_flight: self.in_flight.load(Ordering::Relaxed),
        }
    }

    /// Advances throughput probing and the time series.
    fn maintain(&self, now: Instant, cfg: &ModelConfig) {
        if cfg.enabled && cfg.tickets.mode == TicketMode::Probing {
            let mut p = lock(&self.prober);
            let done = self.counters.completed.load(Ordering::Relaxed);
            let changed = p.tick(&cfg.tickets.probing, now, done, || {
                let r = self.read.take_pressure();
                let w = self.write.take_pressure();
                r || w
            });
            if let Some(n) = changed {
                tracing::debug!(tickets = n, "throughput probing");
                self.read.set_total(n);
                self.write.set_total(n);
            }
        }
        let secs = now.saturating_duration_since(self.start).as_secs();
        let due = lock(&self.series).due(secs);
        if due {
            let counters = self.counter_snapshot();
            let gauges = self.gauges(now, cfg);
            lock(&self.series).record(secs, counters, gauges);
        }
    }
}

/// A slot in the ingress queue; dropping it leaves the queue (refunding the borrowed token if
/// the request gave up before the token became valid).
struct QueueSlot<'a> {
    model: &'a Model,
    refund: bool,
}

impl Drop for QueueSlot<'_> {
    fn drop(&mut self) {
        let cfg = self.model.config();
        let now = Instant::now();
        lock(&self.model.bucket).leave_queue(
            self.refund,
            now,
            cfg.limiter.rate_per_sec,
            cfg.burst_tokens(),
        );
    }
}

/// A request past the ingress limiter, not yet run. Holds no resource: dropping it is fine
/// (e.g. when failCommand answers instead).
#[derive(Debug)]
pub struct Admission {
    model: Arc<Model>,
    kind: CommandKind,
    cost_ms: f64,
    in_transaction: bool,
    /// When the request reached this server: its arrival, or for a router's child request
    /// the moment the router sent this attempt ([`Model::admit_forwarded`]).
    reached: Instant,
    client_deadline: Option<Instant>,
    deadline: Instant,
    ingress_wait: Duration,
    /// Key of the request's ticket wake-up draws (`None`: the pool's generator draws it).
    wake_key: Option<u64>,
    /// mongod marks this kind of request kill-on-client-disconnect.
    kill_marked: bool,
    /// See [`Admission::draws`].
    draws: Option<u64>,
}

/// Accounting of one execution; dropping it unsettled (the future was cancelled) counts its work
/// as wasted. Dropping it records the request's queue wait, whatever the outcome.
struct Run<'a> {
    model: &'a Model,
    work: Duration,
    settled: bool,
    /// Ingress queue plus ticket waits so far; `None` for requests that take no ticket
    /// (commands without cost), which would only dilute the distribution.
    queued: Option<Duration>,
}

impl Run<'_> {
    /// The request noticed `why` at an interrupt point: its work so far is wasted, and
    /// stopping costs `costs.expiryMs` more. The rejection's `work` is both.
    async fn stop(&mut self, why: Interrupt, cfg: &ModelConfig) -> Rejection {
        self.settled = true;
        add_ns(&self.model.counters.wasted_ns, self.work);
        match why {
            Interrupt::Deadline => bump(&self.model.counters.expired),
            Interrupt::Disconnected => bump(&self.model.counters.killed),
        }
        let work = self.work + self.model.charge_expiry(cfg).await;
        match why {
            Interrupt::Deadline => Rejection::expired(work),
            Interrupt::Disconnected => Rejection::disconnected(work),
        }
    }
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        if let Some(queued) = self.queued {
            self.model.queue_waits.record(queued);
        }
        self.model.in_flight.fetch_sub(1, Ordering::Relaxed);
        if !self.settled {
            add_ns(&self.model.counters.wasted_ns, self.work);
        }
    }
}

impl Admission {
    /// The key of this request's other random draws (the fail points'), when it carries the
    /// lab's id: the model's seed, the id and the attempt number, as for its rejection and
    /// ticket draws, so every variant meets the same luck there too (module `draws`).
    pub fn draws(&self) -> Option<u64> {
        self.draws
    }

    /// The request's deadline (arrival + `maxTimeMS`, or the safety limit).
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Time spent in the ingress queue.
    pub fn ingress_wait(&self) -> Duration {
        self.ingress_wait
    }

    /// Step 2: ticket, cores, yields, deadline. `disconnected` completes when the client has
    /// gone away (use `std::future::pending()` if unknown). Errors: 433, 50, 279.
    ///
    /// The deadline and the client are checked only at interrupt points, as mongod checks
    /// them: the ticket wait (which wakes at the deadline and every `interruptCheckMs`) and
    /// every `yieldPeriodMs` of work (a yield point; a transaction statement checks there too
    /// but keeps its ticket). Waiting for a core is not an interrupt point (a thread in the
    /// run queue checks nothing); it is bounded by the safety limit. A request that reaches
    /// its end after its deadline without meeting an interrupt point completes.
    pub async fn execute<F: Future<Output = ()>>(
        self,
        disconnected: F,
    ) -> Result<ExecOutcome, Rejection> {
        let model = &*self.model;
        let cfg = model.config();
        let mut out = ExecOutcome {
            ingress_wait: self.ingress_wait,
            ..ExecOutcome::default()
        };
        let disconnected = pin!(disconnected);
        let mut watch = Watch::new(
            disconnected,
            cfg.kill_on_client_disconnect && self.kill_marked,
            Duration::from_millis(cfg.interrupt_check_ms),
            Instant::now(),
        );
        model.in_flight.fetch_add(1, Ordering::Relaxed);
        let cost_ms = if cfg.enabled { self.cost_ms } else { 0.0 };
        let pool = match self.kind {
            _ if cost_ms <= 0.0 => None,
            CommandKind::PointRead | CommandKind::RangeRead | CommandKind::Scan => {
                Some(&model.read)
            }
            CommandKind::Write => Some(&model.write),
            CommandKind::Command | CommandKind::Authentication => None,
        };
        let mut run = Run {
            model,
            work: Duration::ZERO,
            settled: false,
            queued: pool.map(|_| self.ingress_wait),
        };
        // Bounds the waits that are not interrupt points (cores).
        let safety =
            (self.reached + Duration::from_millis(cfg.safety_time_limit_ms)).max(self.deadline);
        let mut ticket = None;
        if let Some(p) = pool {
            let t0 = Instant::now();
            match p
                .acquire(
                    Entry::Arrival(self.reached),
                    self.deadline,
                    self.wake_key,
                    &mut watch,
                )
                .await
            {
                Ok(t) => ticket = Some(t),
                Err(AcquireError::Shed) => {
                    run.settled = true;
                    bump(&model.counters.shed);
                    let mut r = Rejection::queue_overflow(cfg.base_backoff_ms);
                    r.work = model.charge_rejection(self.deadline, &cfg).await;
                    return Err(r);
                }
                Err(AcquireError::Interrupted(i)) => return Err(run.stop(i, &cfg).await),
            }
            out.ticket_wait += Instant::now() - t0;
            run.queued = Some(self.ingress_wait + out.ticket_wait);
        }
        let quantum = Duration::from_secs_f64(cfg.quantum_ms / 1000.0);
        let check_period = Duration::from_secs_f64(cfg.yield_period_ms / 1000.0);
        let mut remaining = Duration::from_secs_f64(cost_ms / 1000.0);
        let mut since_check = Duration::ZERO;
        // Each turn removes at least min(quantum, remaining, time to the next interrupt point)
        // > 0 of work, and the safety limit stops it anyway.
        while !remaining.is_zero() {
            let t0 = Instant::now();
            let Ok(core) =
                tokio::time::timeout_at(safety, model.cores.acquire(SliceKind::Request)).await
            else {
                return Err(run.stop(Interrupt::Deadline, &cfg).await);
            };
            out.core_wait += Instant::now() - t0;
            let to_check = check_period.saturating_sub(since_check);
            let mut slice = remaining.min(quantum);
            if !to_check.is_zero() {
                slice = slice.min(to_check);
            }
            let charged = model.quantum(slice, remaining, &cfg).await;
            drop(core);
            run.work += charged;
            remaining -= charged;
            since_check += charged;
            if remaining.is_zero() {
                break;
            }
            if since_check < check_period {
                continue;
            }
            // Yield points and interrupt points are one and the same in mongod's query
            // execution; a transaction statement (INTERRUPT_ONLY) checks without yielding.
            since_check = Duration::ZERO;
            if let Some(i) = watch.interrupt_point(self.deadline).await {
                return Err(run.stop(i, &cfg).await);
            }
            if self.in_transaction {
                continue;
            }
            out.yields += 1;
            if let Some(p) = pool {
                drop(ticket.take());
                let t0 = Instant::now();
                match p
                    .acquire(Entry::Yield, self.deadline, self.wake_key, &mut watch)
                    .await
                {
                    Ok(t) => ticket = Some(t),
                    Err(AcquireError::Interrupted(i)) => return Err(run.stop(i, &cfg).await),
                    // Not sheddable; treat like running out of time if it ever happened.
                    Err(AcquireError::Shed) => {
                        return Err(run.stop(Interrupt::Deadline, &cfg).await)
                    }
                }
                out.ticket_wait += Instant::now() - t0;
                run.queued = Some(self.ingress_wait + out.ticket_wait);
            }
        }
        drop(ticket);
        let now = Instant::now();
        let gone = watch.check().await || watch.fired();
        let abandoned = !gone && self.client_deadline.is_some_and(|at| now > at);
        out.client_disconnected = gone;
        out.abandoned = abandoned;
        out.work = run.work;
        out.total = now.saturating_duration_since(self.reached);
        run.settled = true;
        bump(&model.counters.completed);
        if pool.is_some() {
            let waited = self.ingress_wait + out.ticket_wait;
            let mut done = lock(&model.completions);
            done.waits.record(waited);
            done.runs.record(out.total.saturating_sub(waited));
        }
        if gone {
            bump(&model.counters.orphaned);
            add_ns(&model.counters.wasted_ns, run.work);
        } else if abandoned {
            bump(&model.counters.abandoned);
            add_ns(&model.counters.wasted_ns, run.work);
        } else {
            add_ns(&model.counters.useful_ns, run.work);
        }
        drop(run);
        model.maintain(now, &cfg);
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
