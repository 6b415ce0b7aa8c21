//! The server: a queueing model of one mongod under overload, mirroring the lab's emulator model
//! (`emulator/src/model`) step by step, in virtual time.
//!
//! 1. **Ingress limiter**: a token bucket of `rate_per_sec` holding `rate × burst_secs` tokens,
//!    no queue (the lab's `maxQueueDepth` 0): a request without a token is rejected with 462
//!    (`SystemOverloadedError` + `RetryableError`) after `rejection_ms` of core time.
//! 2. **Tickets**: reads take a read ticket, writes a write ticket (8 each). Waiters wait until
//!    their `maxTimeMS` (else the safety limit), an interrupt point: there they stop, which costs
//!    `expiry_ms` of core time (→ 50 `MaxTimeMSExpired`). A released ticket goes to a waiter
//!    drawn at random (the emulator's `wakeup: random`).
//! 3. **Cores**: a FIFO run queue over `cores` cores; a request runs `quantum_ms` slices and
//!    queues again, round robin. After `yield_period_ms` of work it reaches an interrupt point:
//!    stop if past its deadline, else give the ticket back and queue for it again. Waiting for
//!    a core is not an interrupt point, so a request that holds a ticket finishes its work.
//!    A slice that waited for a core holds it a hand-off longer than its work: the emulator's
//!    cores are tokio tasks taking turns at a semaphore, and a core given back to a waiter is
//!    idle until the host runs the waiter's task (`handoff_ms` for a request's slice,
//!    `rejection_handoff_ms` for work outside requests; see [`HANDOFF_MS`]). A slice that
//!    finds a core free starts at once, as the emulator's task then takes it without waiting.
//!    The emulator's slices are tokio sleeps, which end on the host timer's millisecond tick
//!    (a little late): a slice holds its core until then, and the time it slept beyond its
//!    work counts as the job's progress up to what the job had left, the rest going to a bank
//!    shared by the cores (at most four quanta per core) that later slices are paid from
//!    first. A slice paid in full takes no time. The cores so complete their configured costs
//!    on average, with the emulator's timing: work ends on ticks, in bursts.
//!
//! Work of requests that complete after their application stopped waiting, of expired requests
//! and of rejections is wasted, as the emulator counts it.

use std::collections::VecDeque;

use rand::rngs::StdRng;
use rand::Rng;

use crate::clock::{self, Nanos};
use crate::event::{Event, Reply, Request, Tag};
use crate::queue::{Handle, Queue, Slab};

/// The kind of one operation: the lab's own (a point or range read takes a read ticket and
/// `point_read_ms` or `range_read_ms`; an insert or update a write ticket and `write_ms`).
pub use arrivals::OpKind;

/// The server model's parameters; [`Default`] is the lab's server (`docs/lab.md`, "What runs").
#[derive(Clone, Debug, PartialEq)]
pub struct ServerConfig {
    /// Virtual cores (lab: 2; `flood`: 1).
    pub cores: u32,
    /// Core time of a point read, range read and write (ms; lab: 2, 5, 3).
    pub point_read_ms: f64,
    pub range_read_ms: f64,
    pub write_ms: f64,
    /// Core time to reject a request at the limiter (ms; lab: 0.3).
    pub rejection_ms: f64,
    /// Share of attempts rejected at random for overload before the limiter, at the same
    /// cost (the emulator's `randomRejectionShare`; 0: none).
    pub random_rejection: f64,
    /// Core time to stop an expired request at an interrupt point (ms; lab: 0.5).
    pub expiry_ms: f64,
    /// The ingress limiter's rate (requests/s); `None`: no limiter.
    pub limiter_rate: Option<f64>,
    /// Seconds of the rate the bucket holds (lab: 0.25).
    pub burst_secs: f64,
    /// Read and write tickets (lab: 8 and 8).
    pub read_tickets: u32,
    pub write_tickets: u32,
    /// Length of one slice on a core (ms; lab: 1).
    pub quantum_ms: f64,
    /// Work between interrupt points (ms; lab: 10).
    pub yield_period_ms: f64,
    /// The time limit of requests without `maxTimeMS` (ms; lab: 600,000).
    pub safety_limit_ms: f64,
    /// Half the network round trip: a request reaches the server and its reply the client this
    /// long after being sent.
    pub half_rtt: Nanos,
    /// Core time lost each time a slice of a request that waited for a core gets one, before
    /// its work starts (ms; the lab's emulator: [`HANDOFF_MS`]; 0: ideal cores). Not work: it counts in no figure
    /// of core time (the emulator's `busyCoreMs` does not see it either), it only holds the
    /// core.
    pub handoff_ms: f64,
    /// The same for a slice of work outside a request: a rejection, or the stop of an expired
    /// request (ms; the lab's emulator: [`REJECTION_HANDOFF_MS`]).
    pub rejection_handoff_ms: f64,
    /// How long a ticket waiter woken by a release takes to come and take the ticket (ms; the
    /// lab's emulator: [`TICKET_WAKE_MS`]). A request arriving meanwhile takes the free ticket
    /// first, and the woken waiter waits again, as in mongod 8.0's ticket pool. 0: the ticket
    /// goes straight to the woken waiter.
    pub ticket_wake_ms: f64,
    /// The host timer's tick (ms; the lab's emulator: [`TIMER_TICK_MS`]; 0: exact sleeps).
    /// The emulator's cores sleep their slices on tokio timers, which fire on the first tick
    /// at or after the deadline, `timer_lateness_ms` late: a slice holds its core until then.
    /// The time beyond the slice's work is banked and paid back by later slices, as the
    /// emulator's cores do (see [`Server`]).
    pub timer_tick_ms: f64,
    /// How long after its tick a timer's sleep ends (ms; [`TIMER_LATENESS_MS`]): the mean,
    /// with `timer_lateness_shape` its spread.
    pub timer_lateness_ms: f64,
    pub timer_lateness_shape: LatenessShape,
}

/// How the timer's lateness varies from tick to tick.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LatenessShape {
    /// The same at every tick (the model until 2026-12-05 13:00).
    Fixed,
    /// Exponential with the mean, cut at a tick, drawn once per tick: a runtime fires its
    /// timers when its thread next wakes after the tick, for an event or its own timeout.
    #[default]
    Exponential,
}

/// The lab's host timer tick (ms): tokio's timer wheel rounds a sleep's deadline up to the
/// next whole millisecond of its runtime's clock, and the emulator's cores sleep their slices
/// (`emulator/src/model/cores.rs`, whose bank this model's follows).
pub const TIMER_TICK_MS: f64 = 1.0;

/// How long after its tick a sleep of the emulator's cores ends, on average (ms).
///
/// Since 2026-12-05 13:00 the emulator counts how long each slice slept beyond what it asked
/// (`sliceOversleep`). In `flood` at 380 and 420 ops/s (`lab-runs/dist-flood-{380,420}`), 34
/// to 38 % of slices overslept by more than a tick, which a fixed lateness of this size gives
/// in 6 % and an exponential one (drawn per tick, [`LatenessShape::Exponential`]) in 34 %; the
/// mean oversleep is about half a tick plus this. Until then the model used 0.05 ms at every
/// tick, what the emulator's own test of its cores assumes.
pub const TIMER_LATENESS_MS: f64 = 0.37;

/// The core time the lab's emulator loses each time a core passes to a request's slice that
/// waited for one (ms), as its cores time it.
///
/// The emulator's virtual cores are a semaphore of tokio tasks that sleep their slices
/// (`emulator/src/model/cores.rs`): a core given back to a waiting task is idle until the host
/// runs that task, time that its `busyCoreMs` (work charged) does not count. Since 2026-12-05
/// 08:00 the cores time every such hand-off (`requestHandoffs`, `requestHandoffMs`; for other
/// work `otherHandoffs`, `otherHandoffMs`). In the lab run of that time (`lab-runs/host-0855`,
/// the suite's `burst` and `sustained`, 30 runs), the pooled means were 0.045 ms for requests'
/// slices, 0.040 for other work ([`REJECTION_HANDOFF_MS`]) and 0.083 for a ticket wake-up
/// ([`TICKET_WAKE_MS`]). They follow the host's load: a run's own means ranged from 0.034 to
/// 0.064 ms, and on `flood`'s one core the pooled means were 0.051, 0.050 and 0.136. `sim
/// --lab-verdict` can also run each lab run on its own (see `replay::HostLatencies`).
///
/// Until then the figure was a least-squares fit of the cores' lost time (`busyCoreMs` short
/// of `cores × 1000` in saturated seconds) on the slices run, charged on every slice (0.035 ms
/// for a request's, 0.0525 for other work, the suite of 2026-12-05 06:29); the emulator loses
/// nothing when a task finds a core free, which the model now follows.
pub const HANDOFF_MS: f64 = 0.045;

/// The same for a slice of work outside a request that waited for a core: a rejection, or an
/// expired request's stop (ms). Measured with [`HANDOFF_MS`].
pub const REJECTION_HANDOFF_MS: f64 = 0.040;

/// How long the lab's emulator takes to bring a woken ticket waiter to its ticket (ms): its
/// ticket pools time each wake-up (`ticketWakeMs` over `ticketWakeups`), the window in which a
/// request arriving takes the ticket (`ticketRacesLost`). Measured with [`HANDOFF_MS`]. Until
/// 2026-12-05 08:00 it was inferred from the races lost (0.08 ms: in a run of 07:00 3.6 to
/// 5.7 % of wake-ups lost in `burst` and `sustained`, and the model lost 4.0 to 5.8 %). At the
/// measured wake-up the model loses fewer races than the emulator where the host is busiest
/// (`flood`: 10 % in the lab at 0.14 ms, 5 % in the model), so the lab's arrivals are not
/// independent of its wake-ups there (`docs/simulator.md`).
pub const TICKET_WAKE_MS: f64 = 0.083;

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            cores: 2,
            point_read_ms: 2.0,
            range_read_ms: 5.0,
            write_ms: 3.0,
            rejection_ms: 0.3,
            random_rejection: 0.0,
            expiry_ms: 0.5,
            limiter_rate: None,
            burst_secs: 0.25,
            read_tickets: 8,
            write_tickets: 8,
            quantum_ms: 1.0,
            yield_period_ms: 10.0,
            safety_limit_ms: 600_000.0,
            half_rtt: 100_000,
            handoff_ms: HANDOFF_MS,
            rejection_handoff_ms: REJECTION_HANDOFF_MS,
            ticket_wake_ms: TICKET_WAKE_MS,
            timer_tick_ms: TIMER_TICK_MS,
            timer_lateness_ms: TIMER_LATENESS_MS,
            timer_lateness_shape: LatenessShape::Exponential,
        }
    }
}

impl ServerConfig {
    /// Core time of one request of `kind` (ms).
    pub fn cost_ms(&self, kind: OpKind) -> f64 {
        match kind {
            OpKind::PointRead => self.point_read_ms,
            OpKind::RangeRead => self.range_read_ms,
            OpKind::Insert | OpKind::Update => self.write_ms,
        }
    }

    /// The time one request of `kind` holds the cores when it runs without waiting (ms): its
    /// cost plus the hand-off of each of its slices (one per `quantum_ms` of work, and at least
    /// one per `yield_period_ms`).
    pub fn core_ms(&self, kind: OpKind) -> f64 {
        let cost = self.cost_ms(kind);
        let slices = (cost / self.quantum_ms.min(self.yield_period_ms))
            .ceil()
            .max(1.0);
        cost + slices * self.handoff_ms
    }

    /// Checks every parameter, naming the first one out of range.
    ///
    /// # Errors
    ///
    /// A message naming the parameter and its range.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("point read cost", self.point_read_ms),
            ("range read cost", self.range_read_ms),
            ("write cost", self.write_ms),
            ("quantum", self.quantum_ms),
            ("yield period", self.yield_period_ms),
            ("safety limit", self.safety_limit_ms),
        ];
        for (name, value) in positive {
            if !(value.is_finite() && value > 0.0 && value <= 3_600_000.0) {
                return Err(format!("{name}: {value} is not a number of ms above 0"));
            }
        }
        for (name, value) in [
            ("rejection cost", self.rejection_ms),
            ("expiry cost", self.expiry_ms),
            ("core hand-off", self.handoff_ms),
            ("rejection hand-off", self.rejection_handoff_ms),
            ("ticket wake-up", self.ticket_wake_ms),
            ("timer tick", self.timer_tick_ms),
            ("timer lateness", self.timer_lateness_ms),
        ] {
            if !(value.is_finite() && (0.0..=60_000.0).contains(&value)) {
                return Err(format!(
                    "{name}: {value} is not a number of ms from 0 to 60000"
                ));
            }
        }
        if !(1..=1024).contains(&self.cores) {
            return Err(format!("cores: {} is not from 1 to 1024", self.cores));
        }
        if !(1..=100_000).contains(&self.read_tickets)
            || !(1..=100_000).contains(&self.write_tickets)
        {
            return Err("tickets: each pool needs 1 to 100000".into());
        }
        if let Some(rate) = self.limiter_rate {
            if !(rate.is_finite() && rate > 0.0 && rate <= 1e9) {
                return Err(format!("limiter rate: {rate} is not a rate above 0"));
            }
        }
        if !(self.burst_secs.is_finite() && self.burst_secs >= 0.0 && self.burst_secs <= 60.0) {
            return Err(format!(
                "limiter burst: {} s is not from 0 to 60",
                self.burst_secs
            ));
        }
        Ok(())
    }
}

/// The longest a ticket wait's timeout event is scheduled ahead: waits for a far deadline (the
/// safety limit of requests without `maxTimeMS`) re-arm it, so the event heap holds no stale
/// timeout for longer than this.
const TIMEOUT_HORIZON: Nanos = 1_000_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Waiting for a ticket (the number identifies this wait for its timeout event).
    TicketWait(u32),
    /// In the run queue or on a core.
    Runnable,
}

#[derive(Debug)]
struct Job {
    tag: Tag,
    /// `None`: work outside a request (a rejection or the stop of an expired request), which
    /// replies `reply` when done.
    request: Option<(OpKind, usize)>,
    reply: Reply,
    remaining: Nanos,
    /// The slice on a core now: its work, the part of it paid from the bank, and when it
    /// started (after its hand-off).
    slice: Nanos,
    repaid: Nanos,
    started: Nanos,
    work: Nanos,
    since_check: Nanos,
    deadline: Nanos,
    client_deadline: Nanos,
    has_ticket: bool,
    stage: Stage,
    waits: u32,
    /// When the request reached the server, how long it has waited for tickets, and since
    /// when it waits now (the emulator's `completedWaitMs` and `completedRunMs`).
    arrived: Nanos,
    ticket_waited: Nanos,
    waiting_since: Nanos,
}

#[derive(Debug)]
struct Pool {
    total: u32,
    in_use: u32,
    /// Waiters nobody has woken.
    waiters: Vec<Handle>,
    /// Waiters woken for a free ticket that have not yet come to take it.
    woken: Vec<Handle>,
}

/// Upper bounds (µs, inclusive) of the buckets delays are counted in, the emulator's
/// (`emulator/src/model/delays.rs`); a last bucket holds the rest.
pub const DELAY_BOUNDS_US: [u64; 10] = [
    100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000,
];

/// The buckets' names in the emulator's counters (`completedWaits.le100us`, ...).
pub const DELAY_NAMES: [&str; 11] = [
    "le100us",
    "le200us",
    "le500us",
    "le1ms",
    "le2ms",
    "le5ms",
    "le10ms",
    "le20ms",
    "le50ms",
    "le100ms",
    "over100ms",
];

/// Delays summed (ns) and counted by size in the emulator's buckets, shortest first: the
/// emulator's `TimedDelays`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delays {
    pub ns: u64,
    pub sizes: [u64; 11],
}

impl Delays {
    /// The counts by size, as the lab's counters read (floats).
    pub fn counts(&self) -> [f64; 11] {
        self.sizes.map(|n| n as f64)
    }

    fn record(&mut self, ns: Nanos) {
        self.ns += ns;
        let us = ns / 1000;
        let i = (DELAY_BOUNDS_US.iter().position(|&b| us <= b)).unwrap_or(DELAY_BOUNDS_US.len());
        self.sizes[i] += 1;
    }
}

/// Counters of one run; times in ns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    pub attempts: u64,
    pub admitted: u64,
    pub rejected: u64,
    pub completed: u64,
    /// Of the completed requests: the time from reaching the server to holding a ticket, and
    /// from then to completing (the emulator's `completedWait*` and `completedRun*`).
    pub completed_waits: Delays,
    pub completed_runs: Delays,
    /// The gap from each first attempt's arrival to the previous first attempt's, and from
    /// each retry's to the previous retry's (the emulator's `firstAttemptGap*` and
    /// `retryGap*`).
    pub first_attempt_gaps: Delays,
    pub retry_gaps: Delays,
    /// The gap from each first attempt to the previous retry, and from each retry to the
    /// previous first attempt (the emulator's `firstAttemptAfterRetryGap*` and
    /// `retryAfterFirstAttemptGap*`).
    pub first_attempt_after_retry_gaps: Delays,
    pub retry_after_first_attempt_gaps: Delays,
    pub expired: u64,
    pub abandoned: u64,
    pub busy_ns: u64,
    pub useful_ns: u64,
    pub wasted_ns: u64,
    pub rejection_ns: u64,
    pub expiry_ns: u64,
    /// Most jobs (requests and rejections) held at once.
    pub peak_jobs: u64,
    /// Ticket waiters woken by a release, and those of them that found the ticket taken by a
    /// request that arrived meanwhile.
    pub ticket_wakeups: u64,
    pub ticket_races_lost: u64,
    /// Slices that waited for a core and started after a hand-off (the emulator's
    /// `requestHandoffs` + `otherHandoffs`).
    pub handoffs: u64,
    /// Slices that slept, how long they slept beyond what they asked, summed, and how many
    /// of them by more than a tick (the emulator's `sliceOversleep` counters).
    pub oversleeps: u64,
    pub oversleep_ns: u64,
    pub oversleeps_beyond_tick: u64,
}

impl Delays {
    fn add(&mut self, other: &Delays) {
        self.ns += other.ns;
        for (mine, theirs) in self.sizes.iter_mut().zip(other.sizes) {
            *mine += theirs;
        }
    }
}

impl ServerStats {
    /// Adds another server's counters (the shards of a cluster, as one figure): sums, except
    /// the peak of jobs held at once, which is the larger (the servers' peaks need not
    /// coincide).
    pub fn add(&mut self, other: &ServerStats) {
        // Destructured whole, so that a counter added to the struct must be added here too.
        let ServerStats {
            attempts,
            admitted,
            rejected,
            completed,
            completed_waits,
            completed_runs,
            first_attempt_gaps,
            retry_gaps,
            first_attempt_after_retry_gaps,
            retry_after_first_attempt_gaps,
            expired,
            abandoned,
            busy_ns,
            useful_ns,
            wasted_ns,
            rejection_ns,
            expiry_ns,
            peak_jobs,
            ticket_wakeups,
            ticket_races_lost,
            handoffs,
            oversleeps,
            oversleep_ns,
            oversleeps_beyond_tick,
        } = other;
        for (mine, theirs) in [
            (&mut self.completed_waits, completed_waits),
            (&mut self.completed_runs, completed_runs),
            (&mut self.first_attempt_gaps, first_attempt_gaps),
            (&mut self.retry_gaps, retry_gaps),
            (
                &mut self.first_attempt_after_retry_gaps,
                first_attempt_after_retry_gaps,
            ),
            (
                &mut self.retry_after_first_attempt_gaps,
                retry_after_first_attempt_gaps,
            ),
        ] {
            mine.add(theirs);
        }
        for (mine, theirs) in [
            (&mut self.attempts, attempts),
            (&mut self.admitted, admitted),
            (&mut self.rejected, rejected),
            (&mut self.completed, completed),
            (&mut self.expired, expired),
            (&mut self.abandoned, abandoned),
            (&mut self.busy_ns, busy_ns),
            (&mut self.useful_ns, useful_ns),
            (&mut self.wasted_ns, wasted_ns),
            (&mut self.rejection_ns, rejection_ns),
            (&mut self.expiry_ns, expiry_ns),
            (&mut self.ticket_wakeups, ticket_wakeups),
            (&mut self.ticket_races_lost, ticket_races_lost),
            (&mut self.handoffs, handoffs),
            (&mut self.oversleeps, oversleeps),
            (&mut self.oversleep_ns, oversleep_ns),
            (&mut self.oversleeps_beyond_tick, oversleeps_beyond_tick),
        ] {
            *mine += *theirs;
        }
        self.peak_jobs = self.peak_jobs.max(*peak_jobs);
    }
}

/// One server's state.
pub struct Server {
    /// Which server this is (a shard's index; 0 alone): its events carry it.
    id: u32,
    cfg: ServerConfig,
    tokens: f64,
    last_refill: Nanos,
    pools: [Pool; 2],
    free_cores: u32,
    /// Jobs waiting for a core, each with whether it found none free (and so starts after a
    /// hand-off).
    run_queue: VecDeque<(Handle, bool)>,
    jobs: Slab<Job>,
    quantum: Nanos,
    yield_period: Nanos,
    handoff: Nanos,
    rejection_handoff: Nanos,
    ticket_wake: Nanos,
    timer: Timer,
    /// Core time slept beyond the slices' work, to pay back (the emulator's bank), and the
    /// most it holds.
    owed: Nanos,
    owed_cap: Nanos,
    /// When the last first attempt and the last retry arrived.
    last_arrival: [Option<Nanos>; 2],
    pub stats: ServerStats,
}

impl Server {
    /// A server with a validated configuration, its bucket full.
    pub fn new(cfg: ServerConfig) -> Self {
        let tokens = cfg
            .limiter_rate
            .map_or(0.0, |rate| bucket_cap(rate, cfg.burst_secs));
        Self {
            id: 0,
            tokens,
            last_refill: 0,
            pools: [
                Pool {
                    total: cfg.read_tickets,
                    in_use: 0,
                    waiters: Vec::new(),
                    woken: Vec::new(),
                },
                Pool {
                    total: cfg.write_tickets,
                    in_use: 0,
                    waiters: Vec::new(),
                    woken: Vec::new(),
                },
            ],
            free_cores: cfg.cores,
            last_arrival: [None; 2],
            run_queue: VecDeque::new(),
            jobs: Slab::default(),
            quantum: clock::ms(cfg.quantum_ms).max(1),
            yield_period: clock::ms(cfg.yield_period_ms).max(1),
            handoff: clock::ms(cfg.handoff_ms),
            rejection_handoff: clock::ms(cfg.rejection_handoff_ms),
            ticket_wake: clock::ms(cfg.ticket_wake_ms),
            timer: Timer {
                tick: clock::ms(cfg.timer_tick_ms),
                lateness: clock::ms(cfg.timer_lateness_ms),
                shape: cfg.timer_lateness_shape,
                seed: 0,
            },
            owed: 0,
            // The emulator's cap: four quanta per core.
            owed_cap: clock::ms(cfg.quantum_ms).max(1) * u64::from(cfg.cores) * 4,
            stats: ServerStats::default(),
            cfg,
        }
    }

    /// The same server numbered `id`, which its events carry (one of several shards).
    pub fn numbered(self, id: u32) -> Self {
        Self { id, ..self }
    }

    /// Keys the timer's lateness at each tick with `seed` (0 until set).
    pub fn seed_timer(&mut self, seed: u64) {
        self.timer.seed = seed;
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.cfg
    }

    /// Requests and rejections the server holds now.
    pub fn jobs(&self) -> usize {
        self.jobs.len()
    }

    /// An attempt arrives at `now`.
    pub fn arrive(&mut self, now: Nanos, req: Request, q: &mut Queue<Event>) {
        self.stats.attempts += 1;
        let kind = usize::from(req.tag.attempt > 1);
        let (gaps, after_other) = match kind {
            0 => (
                &mut self.stats.first_attempt_gaps,
                &mut self.stats.first_attempt_after_retry_gaps,
            ),
            _ => (
                &mut self.stats.retry_gaps,
                &mut self.stats.retry_after_first_attempt_gaps,
            ),
        };
        if let Some(last) = self.last_arrival[kind] {
            gaps.record(now.saturating_sub(last));
        }
        if let Some(last) = self.last_arrival[1 - kind] {
            after_other.record(now.saturating_sub(last));
        }
        self.last_arrival[kind] = Some(now);
        let deadline = now.saturating_add(
            req.max_time
                .unwrap_or_else(|| clock::ms(self.cfg.safety_limit_ms)),
        );
        if req.rejection_draw < self.cfg.random_rejection {
            self.stats.rejected += 1;
            self.burn(now, req.tag, Reply::Overloaded, self.cfg.rejection_ms, q);
            return;
        }
        if let Some(rate) = self.cfg.limiter_rate {
            let cap = bucket_cap(rate, self.cfg.burst_secs);
            let dt = now.saturating_sub(self.last_refill) as f64 / 1e9;
            self.last_refill = self.last_refill.max(now);
            self.tokens = (self.tokens + dt * rate).min(cap);
            if self.tokens >= 1.0 {
                self.tokens -= 1.0;
            } else {
                self.stats.rejected += 1;
                self.burn(now, req.tag, Reply::Overloaded, self.cfg.rejection_ms, q);
                return;
            }
        }
        self.stats.admitted += 1;
        let pool = usize::from(!req.kind.is_read());
        let job = self.jobs.insert(Job {
            tag: req.tag,
            request: Some((req.kind, pool)),
            reply: Reply::Ok,
            remaining: clock::ms(self.cfg.cost_ms(req.kind)).max(1),
            slice: 0,
            repaid: 0,
            started: 0,
            work: 0,
            since_check: 0,
            deadline,
            client_deadline: req.client_deadline,
            has_ticket: false,
            stage: Stage::Runnable,
            waits: 0,
            arrived: now,
            ticket_waited: 0,
            waiting_since: now,
        });
        self.stats.peak_jobs = self.stats.peak_jobs.max(self.jobs.len() as u64);
        self.acquire_ticket(now, job, q);
    }

    /// Sends `reply` to `tag`'s attempt at `now`: it reaches the client (or its router) half a
    /// round trip later.
    fn send_reply(&self, now: Nanos, tag: Tag, reply: Reply, q: &mut Queue<Event>) {
        q.push(
            now + self.cfg.half_rtt,
            Event::Reply {
                server: self.id,
                tag,
                reply,
            },
        );
    }

    /// Work outside a request: `ms` of core time, then `reply`.
    fn burn(&mut self, now: Nanos, tag: Tag, reply: Reply, ms: f64, q: &mut Queue<Event>) {
        let remaining = clock::ms(ms);
        if remaining == 0 {
            self.send_reply(now, tag, reply, q);
            return;
        }
        let job = self.jobs.insert(Job {
            tag,
            request: None,
            reply,
            remaining,
            slice: 0,
            repaid: 0,
            started: 0,
            work: 0,
            since_check: 0,
            deadline: Nanos::MAX,
            client_deadline: Nanos::MAX,
            has_ticket: false,
            stage: Stage::Runnable,
            waits: 0,
            arrived: now,
            ticket_waited: 0,
            waiting_since: now,
        });
        self.stats.peak_jobs = self.stats.peak_jobs.max(self.jobs.len() as u64);
        self.run(now, job, q);
    }

    fn acquire_ticket(&mut self, now: Nanos, job: Handle, q: &mut Queue<Event>) {
        let Some(j) = self.jobs.get_mut(job) else {
            return;
        };
        let Some((_, pool)) = j.request else {
            return;
        };
        let p = &mut self.pools[pool];
        if p.in_use < p.total {
            p.in_use += 1;
            j.has_ticket = true;
            self.run(now, job, q);
        } else {
            j.waits = j.waits.wrapping_add(1);
            j.stage = Stage::TicketWait(j.waits);
            j.waiting_since = now;
            p.waiters.push(job);
            q.push(
                j.deadline.min(now.saturating_add(TIMEOUT_HORIZON)).max(now),
                Event::TicketTimeout {
                    server: self.id,
                    job,
                    wait: j.waits,
                },
            );
        }
    }

    fn release_ticket(&mut self, now: Nanos, pool: usize, q: &mut Queue<Event>, rng: &mut StdRng) {
        let p = &mut self.pools[pool];
        p.in_use = p.in_use.saturating_sub(1);
        self.wake(now, pool, q, rng);
    }

    /// Wakes waiters drawn at random until every free ticket has a woken waiter coming for it.
    /// Without a wake-up time the ticket goes to the woken waiter at once.
    fn wake(&mut self, now: Nanos, pool: usize, q: &mut Queue<Event>, rng: &mut StdRng) {
        // Bounded by the number of waiters.
        loop {
            let p = &mut self.pools[pool];
            let free = p.total.saturating_sub(p.in_use) as usize;
            if free <= p.woken.len() || p.waiters.is_empty() {
                return;
            }
            let pick = rng.random_range(0..p.waiters.len());
            let next = p.waiters.swap_remove(pick);
            self.stats.ticket_wakeups += 1;
            if self.ticket_wake == 0 {
                p.in_use += 1;
                if let Some(j) = self.jobs.get_mut(next) {
                    j.has_ticket = true;
                }
                self.run(now, next, q);
                continue;
            }
            p.woken.push(next);
            if let Some(j) = self.jobs.get(next) {
                if let Stage::TicketWait(wait) = j.stage {
                    q.push(
                        now + self.ticket_wake,
                        Event::TicketWake {
                            server: self.id,
                            job: next,
                            wait,
                        },
                    );
                }
            }
        }
    }

    /// The waiter `job`, woken for wait `wait`, comes for its ticket at `now`: it takes one if
    /// any is free, else (a request that arrived meanwhile took it) it waits again.
    pub fn ticket_wake(
        &mut self,
        now: Nanos,
        job: Handle,
        wait: u32,
        q: &mut Queue<Event>,
        rng: &mut StdRng,
    ) {
        let Some(j) = self.jobs.get_mut(job) else {
            return;
        };
        let (Stage::TicketWait(w), Some((_, pool))) = (j.stage, j.request) else {
            return;
        };
        if w != wait {
            return;
        }
        let p = &mut self.pools[pool];
        let Some(i) = p.woken.iter().position(|&w| w == job) else {
            return;
        };
        p.woken.swap_remove(i);
        if p.in_use < p.total {
            p.in_use += 1;
            j.has_ticket = true;
            self.run(now, job, q);
            // More free tickets than woken waiters (another waiter left meanwhile)?
            self.wake(now, pool, q, rng);
        } else {
            p.waiters.push(job);
            self.stats.ticket_races_lost += 1;
        }
    }

    /// Puts `job` in the run queue and starts what the free cores can take.
    fn run(&mut self, now: Nanos, job: Handle, q: &mut Queue<Event>) {
        if let Some(j) = self.jobs.get_mut(job) {
            if let Stage::TicketWait(_) = j.stage {
                j.ticket_waited += now.saturating_sub(j.waiting_since);
            }
            j.stage = Stage::Runnable;
        }
        self.enqueue(job);
        self.dispatch(now, q);
    }

    /// Queues `job` for a core. It waits if the free cores are all spoken for by the jobs
    /// queued before it; then a core comes to it from a slice that ends, after a hand-off.
    fn enqueue(&mut self, job: Handle) {
        let waits = self.run_queue.len() >= self.free_cores as usize;
        self.run_queue.push_back((job, waits));
    }

    fn dispatch(&mut self, now: Nanos, q: &mut Queue<Event>) {
        // Bounded: each pass takes one job off the queue.
        while self.free_cores > 0 {
            let Some((job, waited)) = self.run_queue.pop_front() else {
                break;
            };
            let Some(j) = self.jobs.get_mut(job) else {
                continue;
            };
            let mut slice = j.remaining.min(self.quantum);
            let mut handoff = self.rejection_handoff;
            if j.request.is_some() {
                handoff = self.handoff;
                let to_check = self.yield_period.saturating_sub(j.since_check);
                if to_check > 0 {
                    slice = slice.min(to_check);
                }
            }
            if waited {
                self.stats.handoffs += 1;
            } else {
                handoff = 0;
            }
            let slice = slice.max(1);
            let started = now + handoff;
            let repaid = self.owed.min(slice);
            self.owed -= repaid;
            let end = match slice - repaid {
                0 => started,
                sleep => self.timer.fires(started + sleep),
            };
            (j.slice, j.repaid, j.started) = (slice, repaid, started);
            self.free_cores -= 1;
            q.push(
                end,
                Event::SliceEnd {
                    server: self.id,
                    job,
                },
            );
        }
    }

    /// A slice of `job` ended at `now`.
    pub fn slice_end(&mut self, now: Nanos, job: Handle, q: &mut Queue<Event>, rng: &mut StdRng) {
        self.free_cores += 1;
        let Some(j) = self.jobs.get_mut(job) else {
            self.dispatch(now, q);
            return;
        };
        // The work done is what the slice slept plus what it was paid, at least the slice and
        // at most what the job had left; the rest of the time slept is banked.
        let slept = now.saturating_sub(j.started);
        if j.repaid < j.slice {
            let over = slept.saturating_sub(j.slice - j.repaid);
            self.stats.oversleeps += 1;
            self.stats.oversleep_ns += over;
            self.stats.oversleeps_beyond_tick += u64::from(over > self.timer.tick);
        }
        let progress = (slept + j.repaid).max(j.slice);
        let slice = progress.min(j.remaining);
        self.owed = (self.owed + (progress - slice)).min(self.owed_cap);
        j.remaining -= slice;
        j.work += slice;
        j.since_check += slice;
        self.stats.busy_ns += slice;
        match j.request {
            None => {
                if j.remaining == 0 {
                    let (tag, reply, work) = (j.tag, j.reply, j.work);
                    self.jobs.remove(job);
                    self.stats.wasted_ns += work;
                    match reply {
                        Reply::Overloaded => self.stats.rejection_ns += work,
                        _ => self.stats.expiry_ns += work,
                    }
                    self.send_reply(now, tag, reply, q);
                } else {
                    self.enqueue(job);
                }
            }
            Some((_, pool)) => {
                if j.remaining == 0 {
                    let (tag, work, late) = (j.tag, j.work, now > j.client_deadline);
                    let waited = j.ticket_waited;
                    let ran = now.saturating_sub(j.arrived).saturating_sub(waited);
                    self.jobs.remove(job);
                    self.stats.completed += 1;
                    self.stats.completed_waits.record(waited);
                    self.stats.completed_runs.record(ran);
                    if late {
                        self.stats.abandoned += 1;
                        self.stats.wasted_ns += work;
                    } else {
                        self.stats.useful_ns += work;
                    }
                    self.release_ticket(now, pool, q, rng);
                    self.send_reply(now, tag, Reply::Ok, q);
                } else if j.since_check >= self.yield_period {
                    // An interrupt point, where mongod also yields: the ticket goes back, and
                    // the request stops if past its deadline, else queues for a ticket again.
                    j.since_check = 0;
                    j.has_ticket = false;
                    let expired = now >= j.deadline;
                    self.release_ticket(now, pool, q, rng);
                    if expired {
                        self.expire(now, job, q);
                    } else {
                        self.acquire_ticket(now, job, q);
                    }
                } else {
                    self.enqueue(job);
                }
            }
        }
        self.dispatch(now, q);
    }

    /// The ticket wait `wait` of `job` reached its deadline at `now`.
    pub fn ticket_timeout(
        &mut self,
        now: Nanos,
        job: Handle,
        wait: u32,
        q: &mut Queue<Event>,
        rng: &mut StdRng,
    ) {
        let Some(j) = self.jobs.get_mut(job) else {
            return;
        };
        if j.stage != Stage::TicketWait(wait) {
            return;
        }
        if now < j.deadline {
            // A far deadline is looked at again every horizon rather than scheduled once, so
            // that a wait that ends early leaves no event behind for long.
            q.push(
                j.deadline.min(now.saturating_add(TIMEOUT_HORIZON)),
                Event::TicketTimeout {
                    server: self.id,
                    job,
                    wait,
                },
            );
            return;
        }
        if let Some((_, pool)) = j.request {
            let p = &mut self.pools[pool];
            p.waiters.retain(|&w| w != job);
            let woken = p.woken.len();
            p.woken.retain(|&w| w != job);
            if p.woken.len() < woken {
                // Woken for a free ticket: another waiter comes for it instead.
                self.expire(now, job, q);
                self.wake(now, pool, q, rng);
                return;
            }
        }
        self.expire(now, job, q);
    }

    /// Stops `job` past its deadline: its work is wasted, and stopping costs `expiry_ms`.
    fn expire(&mut self, now: Nanos, job: Handle, q: &mut Queue<Event>) {
        let Some(j) = self.jobs.remove(job) else {
            return;
        };
        self.stats.expired += 1;
        self.stats.wasted_ns += j.work;
        self.burn(now, j.tag, Reply::Expired, self.cfg.expiry_ms, q);
    }
}

/// The host's timer, on which the cores sleep their slices.
#[derive(Clone, Copy, Debug)]
struct Timer {
    /// 0: sleeps end exactly.
    tick: Nanos,
    /// How late after its tick the timer fires, on average, and how that varies.
    lateness: Nanos,
    shape: LatenessShape,
    /// Keys the lateness at each tick.
    seed: u64,
}

impl Timer {
    /// When a sleep until `deadline` ends: on the first timer tick at or after it, as late as
    /// the timer is at that tick; at the deadline itself without ticks (`tick` 0).
    fn fires(&self, deadline: Nanos) -> Nanos {
        if self.tick == 0 {
            return deadline;
        }
        let k = deadline.div_ceil(self.tick);
        k * self.tick + self.lateness_at(k)
    }

    /// How late the timer fires at tick `k`: every sleep ending on that tick ends together.
    fn lateness_at(&self, k: u64) -> Nanos {
        if self.shape == LatenessShape::Fixed || self.lateness == 0 {
            return self.lateness;
        }
        let u = keyed_unit(self.seed ^ k.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let x = -(self.lateness as f64) * (1.0 - u).ln();
        (x as Nanos).min(self.tick.saturating_sub(1))
    }
}

/// A uniform draw in `[0, 1)` keyed by `z`, not taken from a stream (so that every variant of
/// a run meets the same draw): splitmix64's finaliser over `z`.
pub(crate) fn keyed_unit(mut z: u64) -> f64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

fn bucket_cap(rate: f64, burst_secs: f64) -> f64 {
    (rate * burst_secs).max(1.0)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    /// Runs the server's own events to the end; returns every reply: the request's index,
    /// when the reply reached the client, and the reply.
    fn replies(
        server: &mut Server,
        q: &mut Queue<Event>,
        rng: &mut StdRng,
    ) -> Vec<(u32, Nanos, Reply)> {
        let mut replies = Vec::new();
        while let Some((now, event)) = q.pop() {
            match event {
                Event::ServerArrive(req) => server.arrive(now, req, q),
                Event::SliceEnd { job, .. } => server.slice_end(now, job, q, rng),
                Event::TicketTimeout { job, wait, .. } => {
                    server.ticket_timeout(now, job, wait, q, rng)
                }
                Event::TicketWake { job, wait, .. } => server.ticket_wake(now, job, wait, q, rng),
                Event::Reply { tag, reply, .. } => replies.push((tag.op.index, now, reply)),
                _ => unreachable!("the server schedules no other event"),
            }
        }
        replies
    }

    /// Runs the server's own events to the end; returns the replies by kind.
    fn drain(server: &mut Server, q: &mut Queue<Event>, rng: &mut StdRng) -> [u64; 3] {
        let mut counts = [0; 3];
        for (_, _, reply) in replies(server, q, rng) {
            counts[match reply {
                Reply::Ok => 0,
                Reply::Overloaded | Reply::RouterOverloaded => 1,
                Reply::Expired => 2,
            }] += 1;
        }
        counts
    }

    /// The lab's server with sleeps that end exactly when their work does (no timer ticks),
    /// for the tests of what the ticks do not change.
    fn exact() -> ServerConfig {
        ServerConfig {
            timer_tick_ms: 0.0,
            ..ServerConfig::default()
        }
    }

    /// The lab's server with the timer 0.05 ms late at every tick, for tests that time
    /// slices to the nanosecond.
    fn fixed_lateness() -> ServerConfig {
        ServerConfig {
            timer_lateness_ms: 0.05,
            timer_lateness_shape: LatenessShape::Fixed,
            ..ServerConfig::default()
        }
    }

    fn request(i: u32, kind: OpKind, max_time: Option<Nanos>) -> Request {
        Request {
            tag: Tag {
                op: Handle {
                    index: i,
                    generation: 0,
                },
                attempt: 1,
            },
            kind,
            key: 0,
            max_time,
            client_deadline: Nanos::MAX,
            rejection_draw: 1.0,
        }
    }

    #[test]
    fn the_limiter_admits_its_bucket_and_every_rejection_costs_core_time() {
        let mut server = Server::new(ServerConfig {
            limiter_rate: Some(100.0),
            ..ServerConfig::default()
        });
        let (mut q, mut rng) = (Queue::default(), StdRng::seed_from_u64(1));
        for i in 0..1000 {
            q.push(0, Event::ServerArrive(request(i, OpKind::PointRead, None)));
        }
        let replies = drain(&mut server, &mut q, &mut rng);
        // The bucket holds 100 × 0.25 tokens at the start; all arrive at once.
        assert_eq!(replies, [25, 975, 0]);
        let s = &server.stats;
        assert_eq!(s.rejection_ns, 975 * 300_000);
        assert_eq!(s.useful_ns, 25 * 2_000_000);
        assert_eq!(s.busy_ns, s.rejection_ns + s.useful_ns);
        assert_eq!(server.jobs(), 0);
    }

    #[test]
    fn attempts_are_timed_from_the_last_of_their_kind_and_of_the_other() {
        // A first attempt at 0, a retry at 0.5 ms, first attempts at 2 and 2.05 ms, a retry
        // at 3 ms.
        let mut server = Server::new(exact());
        let (mut q, mut rng) = (Queue::default(), StdRng::seed_from_u64(1));
        for (i, (at, attempt)) in [
            (0, 1),
            (500_000, 2),
            (2_000_000, 1),
            (2_050_000, 1),
            (3_000_000, 3),
        ]
        .into_iter()
        .enumerate()
        {
            let mut req = request(i as u32, OpKind::PointRead, None);
            req.tag.attempt = attempt;
            q.push(at, Event::ServerArrive(req));
        }
        drain(&mut server, &mut q, &mut rng);
        let s = &server.stats;
        // Of their own kind: first attempts 2 and 0.05 ms apart, retries 2.5 ms.
        assert_eq!(s.first_attempt_gaps.ns, 2_050_000);
        assert_eq!(
            s.first_attempt_gaps.sizes,
            [1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(s.retry_gaps.ns, 2_500_000);
        // Of the other kind: the two later first attempts 1.5 and 1.55 ms after the first
        // retry; the retries 0.5 ms after the first first attempt and 0.95 ms after the last.
        assert_eq!(s.first_attempt_after_retry_gaps.ns, 3_050_000);
        assert_eq!(
            s.first_attempt_after_retry_gaps.sizes,
            [0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(s.retry_after_first_attempt_gaps.ns, 1_450_000);
        assert_eq!(
            s.retry_after_first_attempt_gaps.sizes,
            [0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn a_slice_that_waited_for_a_core_holds_it_for_the_hand_off_which_is_not_work() {
        // One core, three point reads (two 1 ms slices each) at once, no network: round robin
        // runs A1 B1 C1 A2 B2 C2. A1 takes the free core; every later slice waited for it, so
        // it holds the core 1 ms of work plus the hand-off.
        let last_reply = |handoff_ms: f64| {
            let mut server = Server::new(ServerConfig {
                cores: 1,
                half_rtt: 0,
                handoff_ms,
                ..exact()
            });
            let (mut q, mut rng) = (Queue::default(), StdRng::seed_from_u64(3));
            for i in 0..3 {
                q.push(0, Event::ServerArrive(request(i, OpKind::PointRead, None)));
            }
            let done = replies(&mut server, &mut q, &mut rng);
            let last = done.iter().map(|&(_, at, _)| at).max().unwrap_or(0);
            (last, server.stats)
        };
        let (ideal, ideal_stats) = last_reply(0.0);
        assert_eq!(ideal, 6_000_000);
        let (slow, stats) = last_reply(0.5);
        assert_eq!(slow, 1_000_000 + 5 * 1_500_000);
        // The work charged is the same: the hand-off is in no figure of core time.
        assert_eq!(stats.busy_ns, 6_000_000);
        assert_eq!(stats.useful_ns, ideal_stats.useful_ns);
        assert_eq!(stats.busy_ns, ideal_stats.busy_ns);
    }

    #[test]
    fn a_request_alone_on_the_cores_pays_no_hand_off() {
        // Nobody waits: the emulator's task takes its core again at once, and nothing is lost.
        let mut server = Server::new(ServerConfig {
            cores: 1,
            half_rtt: 0,
            handoff_ms: 0.5,
            ..exact()
        });
        let (mut q, mut rng) = (Queue::default(), StdRng::seed_from_u64(3));
        q.push(0, Event::ServerArrive(request(0, OpKind::RangeRead, None)));
        assert_eq!(
            replies(&mut server, &mut q, &mut rng),
            [(0, 5_000_000, Reply::Ok)]
        );
    }

    #[test]
    fn a_request_arriving_while_a_woken_waiter_comes_takes_its_ticket() {
        // One read ticket, two cores. A holds the ticket (2 ms of work), B waits; A ends at
        // 2 ms and wakes B, who comes for the ticket 0.5 ms later; C arrives at 2.2 ms, takes
        // the free ticket first, and B waits again until C ends (4.2 ms), comes at 4.7 ms and
        // ends at 6.7 ms.
        let run = |ticket_wake_ms: f64| {
            let mut server = Server::new(ServerConfig {
                read_tickets: 1,
                half_rtt: 0,
                handoff_ms: 0.0,
                ticket_wake_ms,
                ..exact()
            });
            let (mut q, mut rng) = (Queue::default(), StdRng::seed_from_u64(3));
            q.push(0, Event::ServerArrive(request(0, OpKind::PointRead, None)));
            q.push(1, Event::ServerArrive(request(1, OpKind::PointRead, None)));
            q.push(
                2_200_000,
                Event::ServerArrive(request(2, OpKind::PointRead, None)),
            );
            let done = replies(&mut server, &mut q, &mut rng);
            let order: Vec<(u32, Nanos)> = done.iter().map(|&(i, at, _)| (i, at)).collect();
            (order, server.stats)
        };
        let (raced, stats) = run(0.5);
        assert_eq!(raced, [(0, 2_000_000), (2, 4_200_000), (1, 6_700_000)]);
        assert_eq!((stats.ticket_wakeups, stats.ticket_races_lost), (2, 1));
        // Handed straight over, the ticket goes to B at 2 ms and C waits.
        let (direct, stats) = run(0.0);
        assert_eq!(direct, [(0, 2_000_000), (1, 4_000_000), (2, 6_000_000)]);
        assert_eq!((stats.ticket_wakeups, stats.ticket_races_lost), (2, 0));
        // Where the completed requests' time went: A waited for nothing, B from 0.001 to 2 ms
        // and C from 2.2 to 4 ms; each then ran its 2 ms.
        assert_eq!(stats.completed_waits.ns, (2_000_000 - 1) + 1_800_000);
        assert_eq!(stats.completed_runs.ns, 3 * 2_000_000);
        // Three first attempts, 0.001 and 2.199 ms apart; no retry.
        assert_eq!(
            stats.first_attempt_gaps.sizes,
            [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
        );
        assert_eq!(stats.first_attempt_gaps.ns, 2_200_000);
        assert_eq!(stats.retry_gaps, Delays::default());
        assert_eq!(stats.first_attempt_after_retry_gaps, Delays::default());
        assert_eq!(stats.retry_after_first_attempt_gaps, Delays::default());
        // By size: A's wait of nothing, B's and C's of 1 to 2 ms; three runs of 1 to 2 ms.
        assert_eq!(
            stats.completed_waits.sizes,
            [1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            stats.completed_runs.sizes,
            [0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0]
        );
        // With the race: B waited from 0.001 ms to 4.7 ms, through its lost race.
        let (_, stats) = run(0.5);
        assert_eq!(stats.completed_waits.ns, 4_700_000 - 1);
        assert_eq!(stats.completed_runs.ns, 3 * 2_000_000);
    }

    #[test]
    fn a_rejection_holds_its_core_for_the_rejection_hand_off() {
        // One core and one token: a point read (two 1 ms slices) is admitted and takes the free
        // core; the next request is rejected (0.3 ms), waits, and runs between the read's
        // slices, each waiting slice with its own hand-off: 1, then 0.2 + 0.3, then 0.1 + 1 ms.
        let mut server = Server::new(ServerConfig {
            cores: 1,
            half_rtt: 0,
            limiter_rate: Some(4.0),
            handoff_ms: 0.1,
            rejection_handoff_ms: 0.2,
            ..exact()
        });
        let (mut q, mut rng) = (Queue::default(), StdRng::seed_from_u64(3));
        for i in 0..2 {
            q.push(0, Event::ServerArrive(request(i, OpKind::PointRead, None)));
        }
        assert_eq!(
            replies(&mut server, &mut q, &mut rng),
            [(1, 1_500_000, Reply::Overloaded), (0, 2_600_000, Reply::Ok)]
        );
        assert_eq!(server.stats.busy_ns, 2_300_000, "hand-offs are not work");
        assert_eq!(server.stats.handoffs, 2);
    }

    #[test]
    fn a_request_holds_the_cores_for_its_cost_and_a_hand_off_per_slice() {
        let cfg = ServerConfig {
            handoff_ms: 0.1,
            ..ServerConfig::default()
        };
        assert!((cfg.core_ms(OpKind::PointRead) - 2.2).abs() < 1e-9);
        assert!((cfg.core_ms(OpKind::RangeRead) - 5.5).abs() < 1e-9);
        assert!((cfg.core_ms(OpKind::Update) - 3.3).abs() < 1e-9);
        // A fraction of a quantum is one slice.
        let short = ServerConfig {
            point_read_ms: 0.4,
            ..cfg.clone()
        };
        assert!((short.core_ms(OpKind::PointRead) - 0.5).abs() < 1e-9);
        // The lab's emulator loses the measured hand-off; the validation refuses a negative one.
        assert_eq!(ServerConfig::default().handoff_ms, HANDOFF_MS);
        assert_eq!(
            ServerConfig::default().rejection_handoff_ms,
            REJECTION_HANDOFF_MS
        );
        assert_eq!(ServerConfig::default().ticket_wake_ms, TICKET_WAKE_MS);
        assert_eq!(ServerConfig::default().timer_tick_ms, TIMER_TICK_MS);
        let bad = ServerConfig {
            timer_tick_ms: -1.0,
            ..ServerConfig::default()
        };
        assert!(bad.validate().unwrap_err().contains("timer tick"));
        let bad = ServerConfig {
            handoff_ms: -1.0,
            ..ServerConfig::default()
        };
        assert!(bad.validate().unwrap_err().contains("core hand-off"));
        let bad = ServerConfig {
            rejection_handoff_ms: f64::NAN,
            ..ServerConfig::default()
        };
        assert!(bad.validate().unwrap_err().contains("rejection hand-off"));
    }

    #[test]
    fn ticket_waiters_expire_at_their_max_time_and_pay_for_stopping() {
        // One core, one read ticket, 5 ms reads, maxTimeMS 12: the first two run (0–5, 5–10),
        // the third gets the ticket at 10 and completes at 15 (waiting for a core is not an
        // interrupt point); the rest expire in the ticket queue at 12 ms.
        let mut server = Server::new(ServerConfig {
            cores: 1,
            read_tickets: 1,
            range_read_ms: 5.0,
            half_rtt: 0,
            ..ServerConfig::default()
        });
        let (mut q, mut rng) = (Queue::default(), StdRng::seed_from_u64(2));
        for i in 0..6 {
            q.push(
                0,
                Event::ServerArrive(request(i, OpKind::RangeRead, Some(12_000_000))),
            );
        }
        let replies = drain(&mut server, &mut q, &mut rng);
        assert_eq!(replies, [3, 0, 3]);
        assert_eq!(server.stats.expired, 3);
        assert_eq!(server.stats.expiry_ns, 3 * 500_000);
        assert_eq!(server.stats.useful_ns, 3 * 5_000_000);
    }

    /// The replies to requests that are all rejected (at random, at the rejection's cost), one
    /// arriving at each of `arrivals`, on one core without hand-offs or network.
    fn rejections(cfg: ServerConfig, arrivals: &[Nanos]) -> (Vec<(u32, Nanos, Reply)>, Server) {
        let mut server = Server::new(ServerConfig {
            cores: 1,
            half_rtt: 0,
            random_rejection: 1.0,
            handoff_ms: 0.0,
            rejection_handoff_ms: 0.0,
            ..cfg
        });
        let (mut q, mut rng) = (Queue::default(), StdRng::seed_from_u64(3));
        for (i, &at) in (0..).zip(arrivals) {
            let req = Request {
                rejection_draw: 0.0,
                ..request(i, OpKind::PointRead, None)
            };
            q.push(at, Event::ServerArrive(req));
        }
        (replies(&mut server, &mut q, &mut rng), server)
    }

    #[test]
    fn a_slice_ends_on_the_timer_tick_and_banks_what_it_slept_beyond_its_work() {
        // 1 ms ticks, sleeps 0.05 ms late at every tick. A rejection (0.3 ms) at 0.2 ms sleeps
        // until the tick at 1 ms: it holds the core until 1.05 and banks 0.55 ms. The one at
        // 2 ms is paid 0.3 from the bank and takes no time. The one at 3 ms is paid the 0.25
        // left and sleeps the other 0.05, until the tick at 4 ms.
        let (done, server) = rejections(fixed_lateness(), &[200_000, 2_000_000, 3_000_000]);
        // Two of the three slept: 0.55 and 1 ms beyond what they asked.
        assert_eq!(server.stats.oversleeps, 2);
        assert_eq!(server.stats.oversleep_ns, 550_000 + 1_000_000);
        assert_eq!(server.stats.oversleeps_beyond_tick, 0);
        let at: Vec<(u32, Nanos)> = done.iter().map(|&(i, at, _)| (i, at)).collect();
        assert_eq!(at, [(0, 1_050_000), (1, 2_000_000), (2, 4_050_000)]);
        // The work charged is the rejections' cost, whatever the ticks held.
        assert_eq!(server.stats.rejection_ns, 3 * 300_000);
        assert_eq!(server.stats.busy_ns, 3 * 300_000);
        // Without ticks each takes its 0.3 ms.
        let (done, _) = rejections(exact(), &[200_000, 2_000_000, 3_000_000]);
        let at: Vec<Nanos> = done.iter().map(|&(_, at, _)| at).collect();
        assert_eq!(at, [500_000, 2_300_000, 3_300_000]);
    }

    #[test]
    fn the_timers_lateness_is_drawn_per_tick_with_its_mean_and_under_a_tick() {
        let timer = |seed| Timer {
            tick: 1_000_000,
            lateness: 370_000,
            shape: LatenessShape::Exponential,
            seed,
        };
        let ticks = 20_000u64;
        let lateness: Vec<Nanos> = (1..=ticks).map(|k| timer(9).lateness_at(k)).collect();
        let mean = lateness.iter().sum::<u64>() as f64 / ticks as f64;
        // The cut at a tick takes e^(-1/0.37) × 0.37 ≈ 0.025 ms off the mean.
        assert!((330_000.0..360_000.0).contains(&mean), "mean {mean} ns");
        assert!(lateness.iter().all(|&l| l < 1_000_000));
        let beyond_half = lateness.iter().filter(|&&l| l > 500_000).count() as f64;
        // e^(-0.5/0.37) = 0.26.
        assert!((0.23..0.29).contains(&(beyond_half / ticks as f64)));
        // Every sleep that ends on one tick ends at the same instant; another seed draws
        // other lateness.
        assert_eq!(timer(9).fires(2_100_000), timer(9).fires(2_900_000));
        assert_ne!(
            (1..100)
                .map(|k| timer(9).lateness_at(k))
                .collect::<Vec<_>>(),
            (1..100)
                .map(|k| timer(10).lateness_at(k))
                .collect::<Vec<_>>()
        );
        // Fixed: the mean at every tick.
        let fixed = Timer {
            shape: LatenessShape::Fixed,
            ..timer(9)
        };
        assert_eq!(fixed.fires(2_100_000), 3_370_000);
    }

    #[test]
    fn the_bank_keeps_what_the_cores_complete_on_ticks() {
        // 100 rejections at once: each sleep ends on a tick, and the time slept beyond the
        // work pays for the next ones, so they end by 30 ms (100 × 0.3) plus the last tick
        // and its lateness (less than a tick), not after 100 ticks.
        let (done, server) = rejections(ServerConfig::default(), &[0; 100]);
        let last = done.iter().map(|&(_, at, _)| at).max().unwrap_or(0);
        assert!(
            (30_000_000..32_000_000).contains(&last),
            "last reply at {last} ns"
        );
        assert_eq!(server.stats.busy_ns, 100 * 300_000);
        // A slice paid in full from the bank takes no time: several end on each tick.
        let (done, _) = rejections(fixed_lateness(), &[0; 100]);
        let on_first_tick = done.iter().filter(|&&(_, at, _)| at == 1_050_000).count();
        assert_eq!(
            on_first_tick, 3,
            "one that slept and two paid from the bank"
        );
    }

    #[test]
    fn the_bank_holds_four_quanta_per_core_and_loses_the_rest() {
        // Quanta of 0.1 ms: the bank holds 0.4 ms. Rejections of 0.05 ms, no lateness: the
        // first sleeps until the tick at 1 ms and banks 0.4 of its 0.95 ms beyond the work;
        // that pays eight more at 1 ms; the tenth sleeps until 2 ms, and so on.
        let cfg = ServerConfig {
            quantum_ms: 0.1,
            rejection_ms: 0.05,
            timer_lateness_ms: 0.0,
            ..ServerConfig::default()
        };
        let (done, server) = rejections(cfg, &[0; 20]);
        let at = |t: Nanos| done.iter().filter(|&&(_, a, _)| a == t).count();
        assert_eq!((at(1_000_000), at(2_000_000), at(3_000_000)), (9, 9, 2));
        assert_eq!(server.stats.busy_ns, 20 * 50_000);
    }
}
