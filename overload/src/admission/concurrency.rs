//! [`ConcurrencyLimit`]: an adaptive limit on the operations in flight on one server, lowered
//! when latency shows queueing or the server rejects work for overload.
//!
//! # Why a gradient, and which one
//!
//! The anchors (`overload-anchors.md` §3) offer two control laws:
//!
//! - **AIMD** (Netflix `AIMDLimit`): add one while all is well, multiply by 0.9 on a drop or
//!   when a sample's latency exceeds a fixed timeout (5 s by default).
//! - **Gradient** (Netflix `Gradient2Limit`, Envoy's adaptive concurrency filter): scale the
//!   limit by the ratio of a no-load latency to the current latency, so the limit shrinks in
//!   proportion to the queueing it causes.
//!
//! The overload the issue targets first shows no error at all: with mongod's ingress rate
//! limiter off (its default), an overloaded server only queues. AIMD needs a latency threshold
//! to see that, and no fixed number fits a driver whose operations range from a 1 ms point read
//! to a multi-second aggregation, on servers from a laptop to a sharded cluster. A gradient
//! needs no threshold: it compares the server with itself. So the limit follows a gradient, in
//! Envoy's form, with AIMD's multiplicative decrease for the one explicit signal a server can
//! send:
//!
//! ```text
//! gradient  = clamp(tolerance × baseline / latency, 0.5, 2.0)   (latency: the round's median)
//! target    = gradient × limit + 1                               (1: the queue allowance)
//! limit     ← limit + 0.2 × (target − limit)                     (once per round trip)
//! on overload error: limit ← 0.9 × limit      (once per round trip: only operations admitted
//!                                              after the last decrease can lower it again;
//!                                              only while ≥ 10 % of recent replies are
//!                                              overload errors)
//! ```
//!
//! clamped to `[min_limit, max_limit]`, where `max_limit` is the pool's `maxPoolSize`. At
//! `latency = tolerance × baseline` the gradient is 1; below it the limit grows (at most
//! 20 % per round trip), above it it shrinks (at most 10 % per round trip). For a server whose
//! latency grows in proportion to the operations queued beyond its capacity `c`, one client's
//! limit settles at `tolerance × c + 1`: with the default tolerance 1.5, the server holds half
//! its capacity in queue, enough to keep it busy, and latency stays at 1.5 × its no-load value
//! (`limit_settles_near_capacity_in_a_queueing_server`).
//!
//! The queue allowance (Gradient2's, 4 there, 1 here) is what makes clients sharing a server
//! fair. A pure gradient scales every client's limit by the same factor, so whatever split the
//! clients start with persists (a simulation of four clients ended at 55, 2, 2 and 2). With the
//! allowance, a client's limit is at rest only at `1 / (1 − gradient)`, the same for every
//! client seeing the same latency and holding the same baseline, so the limits converge towards
//! equal shares, as AIMD's additive increase makes them
//! (`clients_sharing_a_server_converge_to_fair_limits`). The rest point is steep near a
//! gradient of 1, though: in that simulation a baseline 5 % higher gave one client about twice
//! the others' share. The allowance's price is one queued operation per client: `n` clients
//! settle at `tolerance × c + n` in all.
//!
//! # Where the limit rests, and where a cut starts
//!
//! A healthy server needs no limit, so a new server's limit starts at `max_limit` and returns
//! there while the server is healthy: a round trip that used fewer than half the slots (it did
//! not test the limit; Netflix's rule) with latency within the tolerance moves the limit
//! towards `max_limit`, and one with latency above it does not grow it. When latency rises
//! above the tolerance, the cut starts from the slots the round used, not from a limit above
//! them (slots nobody used held nothing back), so a limit resting at the maximum binds within
//! a round trip of a queue forming. And a round in which a backlog arrived (the operations in
//! flight more than doubled) or drained (fewer in flight at its end than at its start, the limit
//! not binding) does not cut: the server is working off a backlog. A queue that persists is cut
//! from the next round trip on.
//!
//! Both follow from the lab's `faults` scenario (step-downs and dropped connections at half of
//! capacity). Each dropped connection marks the primary unknown to that client until its
//! monitor checks again, half a second later, so every client meets several outages a second
//! and releases the operations that queued in server selection at once when each ends. A
//! limit that started at 20, did not grow in the light traffic between outages and took those
//! backlogs' latency for a growing queue held each backlog back while its deadlines ran out:
//! with every control on, 7 points of success share below upstream's defaults, against about
//! 1 with the rules above. The price is the start of an overload: the limit binds a round trip
//! or two later than a limit resting at 20 would (`docs/admission.md` has the figures of
//! both).
//!
//! # The baseline, and how it is kept honest
//!
//! The baseline is the server's latency when this client adds no queue: the median of
//! [`BASELINE_SAMPLES`] samples. A baseline that follows ordinary traffic drifts: under a steady
//! queue every sample is slow, a baseline that follows them grows, the limit grows with it,
//! and after a few rounds the limit sits at `max_limit` (Netflix's Gradient2, whose long-term
//! average follows the short-term one, has this drift). So the baseline is measured apart from
//! ordinary traffic and kept as a minimum:
//!
//! - The first baseline comes from the first samples of ordinary traffic (the limit holds
//!   still until it exists), so a cold client is not slowed.
//! - Every `probe_interval` (default 30 s), like Envoy's minimum-RTT measurement and BBR's
//!   ProbeRTT, the limit admits only `min_limit` operations at a time for up to
//!   [`PROBE_MAX_DURATION`] and takes the median of the samples of operations admitted then.
//!   The limit in force before the probe is restored afterwards.
//! - A probe can **lower** the baseline (the first one was taken under load), but not raise
//!   it: a client is one of many, and its probe measures the queue the *other* clients keep;
//!   a baseline that rose with those measurements would ratchet every client's limit up to
//!   the maximum (`clients_sharing_a_server_converge_to_fair_limits` shows the bound).
//! - The exception, Envoy's rule: when the limit has sat at `min_limit` for a whole interval,
//!   the next probe's measurement replaces the baseline even if higher. A server that became
//!   slower for good (a heavier workload, a bigger data set) would otherwise pin the limit to
//!   its minimum forever.
//!
//! The probe's cost: for one round trip plus [`BASELINE_SAMPLES`] operations at `min_limit`
//! every 30 s, the client sends at most `min_limit` operations at a time to that server. At
//! 5 ms operations and the defaults, about 50 ms in 30 s.
//!
//! # Which latency: the median of a round trip's samples, at least 16 of them
//!
//! Each round trip's samples make one update, and the latency it compares with the baseline
//! is their median (Envoy's adaptive concurrency aggregates its samples at the 50th
//! percentile), not their mean. A server that queues slows every operation it serves, so the
//! median rises with the queue as the mean does. But one address can stand for several
//! independent queues: a mongos forwards each operation to the shard that owns its keys, and
//! when one shard sheds, mongos retries it there with backoff while the others answer at once.
//! The mean of such a mixture is set by the minority that waits (a third of the operations at
//! 100 ms and the rest at 5 ms average 37 ms, seven times the baseline), so a mean-driven
//! limit halved the router's slots and the operations for the healthy shards waited for them
//! (the lab's `hot-shard`, 2026-12-05: 600 to 1,200 slot waits a run, cold-shard goodput 1.5 %
//! down). The median is what most of the client's operations meet: it cuts when most of them
//! queue, and leaves a minority's slow shard to that shard's own rejections.
//!
//! A median needs samples, though. At the rate one client sent each router in `hot-shard`, a
//! round trip held one or two, and a round's own median was the slow one every few rounds
//! (230 to 560 slot waits a run, 0.2 to 0.7 % lost). A round with fewer than
//! [`MEDIAN_SAMPLES`] samples is topped up with the latest samples before it, so its median
//! is always of at least 16; a round that holds more uses only its own, so a busy client
//! still follows the server within one round trip. (A median over the latest 16 alone, tried
//! first, fixed `hot-shard` but made a busy client's latency a few milliseconds' worth of
//! operations instead of a round trip's.) A round keeps at most [`ROUND_SAMPLES`] samples,
//! spread evenly over the round: when its store is full it keeps every other sample and from
//! then on only every other new one.
//!
//! # Samples and outcomes
//!
//! A slot is released with an [`Outcome`]:
//!
//! - [`Outcome::Answered`] with the attempt's latency: the server replied, with a result or with
//!   an error that is not an overload error. The latency is a sample.
//! - [`Outcome::Overloaded`]: the server rejected the attempt for overload. Multiplicative
//!   decrease, once the overload errors make up a tenth of recent replies (an exponential
//!   average over about 32): scattered rejections (a rate limiter's noise, injected faults)
//!   would otherwise cut the limit every round trip and hold the server below its capacity,
//!   as the lab's `faults` scenario showed. The latency is not a sample (a fast rejection is
//!   not a fast server).
//! - [`Outcome::Abandoned`]: no reply (the deadline passed, the future was dropped, the
//!   connection failed). The time since the slot was taken is a lower bound on the latency; it
//!   is a sample only when it is at least the current latency estimate, since then it shows
//!   that latency is at least that high. This matters: when an overloaded server only queues,
//!   operations end at their deadlines without replies, and only the fast ones would otherwise
//!   be sampled.
//!
//! A [`ConcurrencyPermit`] dropped without being released is released as abandoned at the
//! limit's clock, so an operation whose future is cancelled never leaks its slot.
//!
//! # Waiting
//!
//! [`ConcurrencyLimit::try_acquire`] never waits: it returns `None` when no slot is free. The
//! crate stays runtime-agnostic; the driver waits with its own means (its connection pool
//! already has a wait queue with a deadline) and tries again when a permit is released or a
//! limit rises, giving up at the operation's deadline.
//!
//! # Bounds
//!
//! The limit is always within `[min_limit, max_limit]`, a successful `try_acquire` never leaves
//! more operations in flight than the limit in force, and no input panics: durations are read
//! as saturated nanoseconds, a zero latency counts as the fastest possible server, and a time
//! earlier than one already seen counts as the latest.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::{ClientLag, InvalidAdmissionConfig};

/// Connection-string name of [`ConcurrencyConfig::min_limit`] (provisional).
pub const OPTION_MIN_LIMIT: &str = "adaptiveConcurrencyMinLimit";
/// Connection-string name of [`ConcurrencyConfig::max_limit`]: the pool's size.
pub const OPTION_MAX_LIMIT: &str = "maxPoolSize";
/// Connection-string name of [`ConcurrencyConfig::tolerance`] (provisional).
pub const OPTION_TOLERANCE: &str = "adaptiveConcurrencyTolerance";
/// Connection-string name of [`ConcurrencyConfig::probe_interval`], in milliseconds
/// (provisional).
pub const OPTION_PROBE_INTERVAL_MS: &str = "adaptiveConcurrencyProbeIntervalMS";

/// Default lowest limit: 2 operations at a time per server and client. Low, because a client
/// is one of many and the server's capacity is shared; not 1, so one slow operation does not
/// stall every other operation to that server.
pub const DEFAULT_MIN_LIMIT: u32 = 2;
/// Default highest limit: 100, `maxPoolSize`'s default. The driver passes the pool's size.
pub const DEFAULT_MAX_LIMIT: u32 = 100;
/// The highest `max_limit`. `maxPoolSize=0` (no pool limit) maps to it.
pub const MAX_MAX_LIMIT: u32 = 100_000;
/// Default tolerance: latency may reach 1.5 × the baseline before the limit shrinks (Netflix
/// Gradient2's `rttTolerance`). Envoy's 1.25 settles closer to capacity, but operations of a
/// MongoDB application differ more in latency than an HTTP route's requests, and the lab
/// decides whether the tighter value pays.
pub const DEFAULT_TOLERANCE: f64 = 1.5;
/// The smallest tolerance: at 1 the limit shrinks as soon as any queue forms.
pub const MIN_TOLERANCE: f64 = 1.0;
/// The largest tolerance.
pub const MAX_TOLERANCE: f64 = 10.0;
/// Default interval between baseline probes (Envoy re-measures on a configured interval,
/// BBR every 10 s; 30 s keeps the probes' cost under 0.2 %).
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(30);
/// The shortest probe interval.
pub const MIN_PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// The longest probe interval.
pub const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(600);

/// Samples in one baseline measurement: the median of 16 (the typical service time of
/// [`crate::deadline::ServiceTime`] uses as many).
pub const BASELINE_SAMPLES: usize = 16;
/// Samples one round trip keeps for its median: when a round sees more, it keeps an evenly
/// spread subset of them (every second, fourth, ... sample), so memory stays fixed however
/// many operations a round trip holds.
pub const ROUND_SAMPLES: usize = 32;
/// The fewest samples a round's median is taken of: a round with fewer is topped up with the
/// latest samples before it. With a third of the samples slow (one shard of three shedding
/// behind a router), the median of one or two samples is the slow one in a third to a half of
/// the updates, of 16 in 8 %.
pub const MEDIAN_SAMPLES: usize = 16;
/// A probe ends after this long even with fewer samples (a slow or idle server), using those
/// it has; with none it keeps the old baseline.
pub const PROBE_MAX_DURATION: Duration = Duration::from_secs(2);

/// The gradient's range (Envoy's): the limit at most halves or doubles its target per update.
const GRADIENT_MIN: f64 = 0.5;
const GRADIENT_MAX: f64 = 2.0;
/// Share of the gradient's target taken per update (Gradient2's smoothing).
const SMOOTHING: f64 = 0.2;
/// The queue allowance added to the gradient's target each round (Gradient2's `queueSize`,
/// which is 4 there): it makes clients sharing a server converge to equal limits.
const QUEUE_ALLOWANCE: f64 = 1.0;
/// Multiplicative decrease on an overload error (Netflix AIMD's `backoffRatio`).
const OVERLOAD_DECREASE: f64 = 0.9;
/// The share of recent replies that must be overload errors before one lowers the limit.
/// Below it, rejections are scattered (a rate limiter's noise, injected faults), and cutting
/// the limit for each would hold the server below its capacity: in the lab's `faults`
/// scenario (5 % of requests rejected at random, below capacity) the limit sat where the
/// server kept no queue at all while operations waited in the client until their deadlines.
/// A server that sheds for overload rejects far more (a third and up in `hot-member`).
const OVERLOAD_SHARE_TO_DECREASE: f64 = 0.1;
/// The weight of one reply in the overload share (an exponential average over about the last
/// 32 replies): at a 5 % random share the average exceeds 10 % in a few percent of rounds,
/// and a run of four rejections in a row lifts it from zero past 10 %.
const OVERLOAD_SHARE_WEIGHT: f64 = 1.0 / 32.0;

/// The options of a [`ConcurrencyLimit`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ConcurrencyConfig {
    /// `adaptiveConcurrencyMinLimit`: the lowest limit, and the limit during a baseline probe.
    /// From 1 to `max_limit`; default [`DEFAULT_MIN_LIMIT`].
    pub min_limit: u32,
    /// The highest limit, where a new server's limit starts: the pool's `maxPoolSize`. From 1
    /// to [`MAX_MAX_LIMIT`]; default [`DEFAULT_MAX_LIMIT`].
    pub max_limit: u32,
    /// `adaptiveConcurrencyTolerance`: the latency, as a multiple of the baseline, at which the
    /// limit holds still. From [`MIN_TOLERANCE`] to [`MAX_TOLERANCE`]; default
    /// [`DEFAULT_TOLERANCE`].
    pub tolerance: f64,
    /// `adaptiveConcurrencyProbeIntervalMS`: time between baseline probes. From
    /// [`MIN_PROBE_INTERVAL`] to [`MAX_PROBE_INTERVAL`]; default [`DEFAULT_PROBE_INTERVAL`].
    pub probe_interval: Duration,
}

impl Default for ConcurrencyConfig {
    /// Limits from 2 to 100, tolerance 1.5, a probe every 30 s.
    fn default() -> Self {
        Self {
            min_limit: DEFAULT_MIN_LIMIT,
            max_limit: DEFAULT_MAX_LIMIT,
            tolerance: DEFAULT_TOLERANCE,
            probe_interval: DEFAULT_PROBE_INTERVAL,
        }
    }
}

impl ConcurrencyConfig {
    /// Checks every option against its range.
    ///
    /// # Errors
    ///
    /// [`InvalidAdmissionConfig`] naming the first option out of range:
    /// - `maxPoolSize` 0 or above 100000 (the driver maps `maxPoolSize=0` to 100000);
    /// - `adaptiveConcurrencyMinLimit` 0 or above `maxPoolSize`;
    /// - `adaptiveConcurrencyTolerance` below 1, above 10, or not a number;
    /// - `adaptiveConcurrencyProbeIntervalMS` below 1000 or above 600000.
    pub fn validate(&self) -> Result<(), InvalidAdmissionConfig> {
        if !(1..=MAX_MAX_LIMIT).contains(&self.max_limit) {
            return Err(InvalidAdmissionConfig::new(
                OPTION_MAX_LIMIT,
                self.max_limit,
                "from 1 to 100000 connections for an adaptive concurrency limit",
            ));
        }
        if !(1..=self.max_limit).contains(&self.min_limit) {
            return Err(InvalidAdmissionConfig::new(
                OPTION_MIN_LIMIT,
                self.min_limit,
                "from 1 to maxPoolSize operations",
            ));
        }
        // `contains` is false for NaN, so NaN is refused here too.
        if !(MIN_TOLERANCE..=MAX_TOLERANCE).contains(&self.tolerance) {
            return Err(InvalidAdmissionConfig::new(
                OPTION_TOLERANCE,
                self.tolerance,
                "a number from 1 to 10 (multiples of the no-load latency)",
            ));
        }
        if !(MIN_PROBE_INTERVAL..=MAX_PROBE_INTERVAL).contains(&self.probe_interval) {
            return Err(InvalidAdmissionConfig::new(
                OPTION_PROBE_INTERVAL_MS,
                self.probe_interval.as_secs_f64() * 1000.0,
                "from 1000 to 600000 milliseconds",
            ));
        }
        Ok(())
    }
}

/// How an operation holding a slot ended; see the [module documentation](self).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The server replied (a result, or an error other than an overload error) after this long.
    Answered(Duration),
    /// The server rejected the attempt for overload (`SystemOverloadedError`).
    Overloaded,
    /// No reply: deadline, cancellation, network error.
    Abandoned,
}

/// The limit's state at one moment, for stats and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConcurrencySnapshot {
    /// The limit in force (`min_limit` during a probe).
    pub limit: u32,
    /// Slots in use.
    pub in_flight: u32,
    /// The server's measured no-load latency, once measured.
    pub baseline: Option<Duration>,
    /// The median latency of the last round trip's samples (topped up to [`MEDIAN_SAMPLES`]), once
    /// there was one.
    pub latency: Option<Duration>,
    /// Whether a baseline probe is running.
    pub probing: bool,
    /// Whether the client's own scheduling lag exceeds the queueing the limit tolerates, so
    /// latency is not moving the limit ([`ClientLag`]).
    pub client_bound: bool,
}

/// An adaptive limit on one server's operations in flight; see the
/// [module documentation](self). Clones share the limit (one reference count each).
///
/// Thread safety: the state sits behind one [`Mutex`], taken once to acquire and once to
/// release a slot, for a few dozen instructions (sorting 16 samples at the end of a probe);
/// [`Self::has_free_slot`] reads an atomic both keep current.
#[derive(Clone)]
pub struct ConcurrencyLimit {
    shared: Arc<Shared>,
}

struct Shared {
    config: ConcurrencyConfig,
    /// The limit's bounds, as floats for the update.
    min: f64,
    max: f64,
    probe_interval: u64,
    probe_max: u64,
    /// Read when a permit is dropped without a time (a cancelled operation).
    clock: fn() -> Instant,
    /// The client's own scheduling lag, when the caller measures it
    /// ([`ConcurrencyLimit::read_client_lag`]).
    client_lag: OnceLock<Arc<ClientLag>>,
    state: Mutex<State>,
    /// Whether a slot was free after the last acquire or release, readable without the lock:
    /// server selection asks before every attempt ([`ConcurrencyLimit::has_free_slot`]).
    free_slot: AtomicBool,
}

#[derive(Debug)]
struct State {
    /// Times are kept as nanoseconds since this instant.
    origin: Instant,
    /// The latest time seen; earlier times count as this one.
    latest: u64,
    /// The limit, fractional so that small steps accumulate; always in `[min, max]`.
    limit: f64,
    in_flight: u32,
    /// The no-load latency in nanoseconds; `None` until the first samples are in.
    baseline: Option<u64>,
    /// Samples towards a baseline, during warm-up or a probe.
    pending: [u64; BASELINE_SAMPLES],
    pending_len: usize,
    probe: Option<Probe>,
    /// Numbers the probes, so a probe counts only operations admitted during it.
    probes_started: u64,
    /// When the next probe starts.
    next_probe: u64,
    round: Round,
    /// The latest [`MEDIAN_SAMPLES`] samples, across rounds: they top up a round with fewer.
    recent: RecentSamples,
    /// The median latency of the last completed round, in nanoseconds.
    latency: Option<u64>,
    /// When the limit was last lowered for an overload error.
    last_decrease: Option<u64>,
    /// The exponentially weighted share of replies that were overload errors.
    overload_share: f64,
    /// Whether the limit has stayed at `min_limit` since the last baseline measurement: then a
    /// probe may raise the baseline.
    floored: bool,
}

#[derive(Clone, Copy, Debug)]
struct Probe {
    number: u64,
    started: u64,
    /// The limit before the probe, restored after it.
    saved_limit: f64,
}

/// The samples of one round trip, whose median makes one update of the limit.
#[derive(Clone, Copy, Debug, Default)]
struct Round {
    started: u64,
    samples: RoundSamples,
    /// The most slots in use during the round: the limit grows only if it was half used, and
    /// a cut starts from it.
    peak_in_flight: u32,
    /// The slots in use when the round started: fewer at its end means the round drained, more
    /// than twice as many during it that a backlog arrived.
    in_flight_at_start: u32,
}

impl Round {
    /// A round that starts at `started` (ns) with `in_flight` slots in use and no samples.
    fn starting(started: u64, in_flight: u32) -> Round {
        Round {
            started,
            peak_in_flight: in_flight,
            in_flight_at_start: in_flight,
            ..Round::default()
        }
    }
}

/// An evenly spread subset of at most [`ROUND_SAMPLES`] of a round's samples: every
/// `stride`-th sample seen, the stride doubling (and every other kept sample dropped) each time
/// the store fills.
#[derive(Clone, Copy, Debug)]
struct RoundSamples {
    kept: [u64; ROUND_SAMPLES],
    len: usize,
    /// Samples seen, kept or not.
    seen: u64,
    stride: u64,
}

impl Default for RoundSamples {
    fn default() -> Self {
        RoundSamples {
            kept: [0; ROUND_SAMPLES],
            len: 0,
            seen: 0,
            stride: 1,
        }
    }
}

impl RoundSamples {
    fn push(&mut self, latency: u64) {
        if self.seen.is_multiple_of(self.stride) {
            if self.len == ROUND_SAMPLES {
                // Kept samples are seen numbers 0, s, 2s, ...: keep 0, 2s, 4s, ... The sample
                // now arriving is number ROUND_SAMPLES × s, a multiple of 2s (the store's size
                // is even), so it is kept below.
                for i in 0..ROUND_SAMPLES / 2 {
                    self.kept[i] = self.kept[2 * i];
                }
                self.len = ROUND_SAMPLES / 2;
                self.stride = self.stride.saturating_mul(2);
            }
            self.kept[self.len] = latency;
            self.len += 1;
        }
        self.seen = self.seen.saturating_add(1);
    }

    /// The upper median of the kept samples; 0 without any.
    fn median(&self) -> u64 {
        let mut kept = self.kept;
        median(&mut kept[..self.len])
    }
}

/// The last [`MEDIAN_SAMPLES`] latency samples, oldest overwritten first.
#[derive(Clone, Copy, Debug, Default)]
struct RecentSamples {
    kept: [u64; MEDIAN_SAMPLES],
    len: usize,
    next: usize,
}

impl RecentSamples {
    fn push(&mut self, latency: u64) {
        self.kept[self.next] = latency;
        self.next = (self.next + 1) % MEDIAN_SAMPLES;
        self.len = (self.len + 1).min(MEDIAN_SAMPLES);
    }

    /// The upper median of the kept samples; 0 without any.
    fn median(&self) -> u64 {
        let mut kept = self.kept;
        median(&mut kept[..self.len])
    }
}

impl fmt::Debug for ConcurrencyLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimit")
            .field("config", &self.shared.config)
            .field("state", &*self.shared.lock())
            .finish()
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

impl ConcurrencyLimit {
    /// A limit with these options, starting at its maximum, reading `clock` only when a permit is
    /// dropped without being released (the driver passes tokio's clock,
    /// `|| tokio::time::Instant::now().into_std()`, so a paused test clock governs it too).
    ///
    /// # Errors
    ///
    /// [`InvalidAdmissionConfig`] as [`ConcurrencyConfig::validate`] gives it.
    pub fn new(
        config: ConcurrencyConfig,
        clock: fn() -> Instant,
    ) -> Result<Self, InvalidAdmissionConfig> {
        Self::starting_at(config, clock(), clock)
    }

    /// As [`Self::new`], with the limit's time starting at `origin`: times before it count as
    /// `origin`.
    ///
    /// # Errors
    ///
    /// [`InvalidAdmissionConfig`] as [`ConcurrencyConfig::validate`] gives it.
    pub fn starting_at(
        config: ConcurrencyConfig,
        origin: Instant,
        clock: fn() -> Instant,
    ) -> Result<Self, InvalidAdmissionConfig> {
        config.validate()?;
        // A new server's limit holds nothing back until its latency says the server queues:
        // it starts at the maximum, and the first cut starts from the slots in use then.
        let initial = config.max_limit;
        Ok(Self {
            shared: Arc::new(Shared {
                config,
                min: f64::from(config.min_limit),
                max: f64::from(config.max_limit),
                probe_interval: nanos(config.probe_interval),
                probe_max: nanos(PROBE_MAX_DURATION),
                clock,
                client_lag: OnceLock::new(),
                state: Mutex::new(State {
                    origin,
                    latest: 0,
                    limit: f64::from(initial),
                    in_flight: 0,
                    baseline: None,
                    pending: [0; BASELINE_SAMPLES],
                    pending_len: 0,
                    probe: None,
                    probes_started: 0,
                    next_probe: 0,
                    round: Round::default(),
                    recent: RecentSamples::default(),
                    latency: None,
                    last_decrease: None,
                    overload_share: 0.0,
                    floored: false,
                }),
                // The initial limit is at least one and nothing is in flight.
                free_slot: AtomicBool::new(true),
            }),
        })
    }

    /// Makes the limit read the client's scheduling lag (see [`ClientLag`]): latency samples
    /// taken while the lag alone exceeds the queueing the limit tolerates are ignored. Set
    /// once; later calls change nothing.
    pub fn read_client_lag(&self, lag: Arc<ClientLag>) {
        let _ = self.shared.client_lag.set(lag);
    }

    /// The options the limit was built with.
    pub fn config(&self) -> ConcurrencyConfig {
        self.shared.config
    }

    /// Takes a slot at `now` if one is free under the limit in force, or returns `None` (the
    /// caller waits by its own means and tries again; see the module documentation). The slot
    /// is held until the permit is released or dropped.
    pub fn try_acquire(&self, now: Instant) -> Option<ConcurrencyPermit> {
        let mut state = self.shared.state_at(now);
        if state.in_flight >= self.shared.limit_in_force(&state) {
            self.shared.publish_free_slot(&state);
            return None;
        }
        state.in_flight += 1;
        state.round.peak_in_flight = state.round.peak_in_flight.max(state.in_flight);
        let probe = state.probe.map(|p| p.number);
        self.shared.publish_free_slot(&state);
        drop(state);
        Some(ConcurrencyPermit {
            shared: Some(Arc::clone(&self.shared)),
            acquired_at: now,
            probe,
        })
    }

    /// The limit in force now: what [`Self::try_acquire`] enforces (`min_limit` during a probe).
    pub fn limit(&self) -> u32 {
        let state = self.shared.lock();
        self.shared.limit_in_force(&state)
    }

    /// Slots in use now. It can exceed [`Self::limit`] for a while after the limit falls:
    /// operations already running keep their slots.
    pub fn in_flight(&self) -> u32 {
        self.shared.lock().in_flight
    }

    /// Whether a slot was free after the last acquire or release (for server selection, which
    /// prefers servers with one), without taking the lock.
    pub fn has_free_slot(&self) -> bool {
        self.shared.free_slot.load(Ordering::Relaxed)
    }

    /// The limit's state now.
    pub fn snapshot(&self) -> ConcurrencySnapshot {
        let state = self.shared.lock();
        ConcurrencySnapshot {
            limit: self.shared.limit_in_force(&state),
            in_flight: state.in_flight,
            baseline: state.baseline.map(Duration::from_nanos),
            latency: state.latency.map(Duration::from_nanos),
            probing: state.probe.is_some(),
            client_bound: self.shared.client_bound(&state),
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock, so a poisoned lock still guards a consistent
        // state; recovering it keeps one panicking caller elsewhere from leaking every slot.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state brought up to `now`: a due probe started, an overdue one finished.
    fn state_at(&self, now: Instant) -> MutexGuard<'_, State> {
        let mut state = self.lock();
        let since_origin = nanos(now.saturating_duration_since(state.origin));
        let t = since_origin.max(state.latest);
        state.latest = t;
        match state.probe {
            Some(probe) if t - probe.started >= self.probe_max => self.finish_probe(&mut state),
            None if state.baseline.is_some() && t >= state.next_probe => {
                state.probes_started += 1;
                state.probe = Some(Probe {
                    number: state.probes_started,
                    started: t,
                    saved_limit: state.limit,
                });
                state.pending_len = 0;
            }
            _ => {}
        }
        state
    }

    fn limit_in_force(&self, state: &State) -> u32 {
        if state.probe.is_some() {
            self.config.min_limit
        } else {
            // `limit` is within [min_limit, max_limit], so the cast neither wraps nor drops
            // below one.
            state.limit as u32
        }
    }

    /// Frees one slot at `now` and learns from the outcome; returns the limit in force after.
    fn release(
        &self,
        now: Instant,
        acquired_at: Instant,
        probe: Option<u64>,
        outcome: Outcome,
    ) -> u32 {
        let mut state = self.state_at(now);
        // Every permit took one slot, so this never goes below zero; saturate regardless.
        state.in_flight = state.in_flight.saturating_sub(1);
        match outcome {
            Outcome::Answered(latency) => {
                state.overload_share *= 1.0 - OVERLOAD_SHARE_WEIGHT;
                self.sample(&mut state, nanos(latency), probe);
            }
            Outcome::Overloaded => {
                state.overload_share += OVERLOAD_SHARE_WEIGHT * (1.0 - state.overload_share);
                if state.overload_share >= OVERLOAD_SHARE_TO_DECREASE {
                    let admitted = nanos(acquired_at.saturating_duration_since(state.origin));
                    self.decrease(&mut state, admitted);
                }
            }
            Outcome::Abandoned => {
                let elapsed = nanos(now.saturating_duration_since(acquired_at));
                // A lower bound on the latency: informative only at or above the current
                // estimate. At it, too: operations that keep ending at their deadline must
                // keep the limit falling once the estimate has reached the deadline.
                if let Some(estimate) = state.latency.or(state.baseline) {
                    if elapsed >= estimate {
                        self.sample(&mut state, elapsed, None);
                    }
                }
            }
        }
        self.publish_free_slot(&state);
        self.limit_in_force(&state)
    }

    fn publish_free_slot(&self, state: &State) {
        let free = state.in_flight < self.limit_in_force(state);
        self.free_slot.store(free, Ordering::Relaxed);
    }

    fn sample(&self, state: &mut State, latency: u64, probe: Option<u64>) {
        let t = state.latest;
        if state.baseline.is_none() {
            // Warm-up: the first samples of ordinary traffic make the first baseline.
            if self.push_pending(state, latency) {
                state.baseline = Some(median(&mut state.pending));
                state.pending_len = 0;
                state.next_probe = t.saturating_add(self.probe_interval);
                state.round = Round::starting(t, state.in_flight);
            }
            return;
        }
        if let Some(current) = state.probe {
            // Only operations admitted during this probe ran at `min_limit`. (A client-bound
            // probe measures high, which cannot raise the baseline: see `finish_probe`.)
            if probe == Some(current.number) && self.push_pending(state, latency) {
                self.finish_probe(state);
            }
            return;
        }
        if self.client_bound(state) {
            // The latency is the client's own queue, not the server's (see `ClientLag`).
            return;
        }
        state.round.samples.push(latency);
        state.recent.push(latency);
        // A round lasts one round trip, so the limit moves once per round trip at most.
        let round_trip = state.latency.or(state.baseline).unwrap_or(0);
        if t - state.round.started >= round_trip {
            // The recent samples end with this round's: with fewer than `MEDIAN_SAMPLES` in the
            // round, they are the round topped up with the latest before it.
            let latency = if state.round.samples.seen >= MEDIAN_SAMPLES as u64 {
                state.round.samples.median()
            } else {
                state.recent.median()
            };
            self.update(state, latency);
        }
    }

    /// Whether the client's own scheduling lag exceeds the queueing the limit tolerates over
    /// its baseline, so that latency samples measure the client rather than the server.
    fn client_bound(&self, state: &State) -> bool {
        let (Some(lag), Some(baseline)) = (self.client_lag.get(), state.baseline) else {
            return false;
        };
        let tolerated = baseline as f64 * (self.config.tolerance - 1.0);
        lag.exceeds(Duration::from_nanos(tolerated as u64))
    }

    /// One round's update of the limit from its median latency (see the module documentation):
    ///
    /// - Latency above the tolerance cuts from the slots the round used, not from a limit
    ///   above them (those slots held nothing back), so a limit that rested at its maximum
    ///   binds within a round trip of a queue forming. No cut from a round that drained (fewer
    ///   operations in flight at its end than at its start, the limit not binding) or in which
    ///   they more than doubled: the server is working off a backlog, such as the one a client
    ///   releases when a failover or a cleared pool ends, and holding it back only makes its
    ///   deadlines pass. A queue that persists is cut from the next round on.
    /// - A round that used under half the slots did not test the limit: it does not grow
    ///   from it, except back towards its maximum, where it started, while latency is within
    ///   the tolerance.
    fn update(&self, state: &mut State, latency: u64) {
        let baseline = state.baseline.unwrap_or(latency) as f64;
        let gradient = if latency == 0 {
            GRADIENT_MAX
        } else {
            (self.config.tolerance * baseline / latency as f64).clamp(GRADIENT_MIN, GRADIENT_MAX)
        };
        let used = f64::from(state.round.peak_in_flight);
        let tested = used * 2.0 >= state.limit;
        let queueing = gradient < 1.0;
        // Drained: fewer in flight than when the round started, which the limit did not hold
        // back then (a limit that binds refills its slots at once, so only a lowered limit
        // makes its in-flight count fall).
        let at_start = state.round.in_flight_at_start;
        let draining = state.in_flight < at_start && f64::from(at_start) + 1.0 < state.limit;
        // A round whose operations in flight more than doubled met a backlog released at once
        // (the end of an outage), not yet a queue that persists: the next round decides.
        let jumped = f64::from(at_start) * 2.0 < used;
        let backlog = draining || jumped;
        let from = if queueing && !backlog {
            state.limit.min(used.max(self.min))
        } else {
            state.limit
        };
        let target = gradient * from + QUEUE_ALLOWANCE;
        let target = match (queueing, tested) {
            (true, _) if backlog => from,
            (true, false) => target.min(from),
            (false, false) => self.max,
            (_, true) => target,
        };
        state.limit = (from + SMOOTHING * (target - from)).clamp(self.min, self.max);
        // At the minimum means the limit in force (its integer part) is the minimum: the
        // fractional limit approaches the minimum without reaching it.
        if state.limit >= self.min + 1.0 {
            state.floored = false;
        }
        state.latency = Some(latency);
        state.round = Round::starting(state.latest, state.in_flight);
    }

    /// The multiplicative decrease on an overload error of an operation admitted at
    /// `admitted`, at most once per round trip: one overloaded moment fails every operation in
    /// flight, and lowering the limit once for each would collapse it to the minimum. As in
    /// TCP, only operations admitted after the last decrease can cause another one: those
    /// admitted before it were admitted under the limit already lowered for.
    fn decrease(&self, state: &mut State, admitted: u64) {
        if state.last_decrease.is_some_and(|d| admitted <= d) {
            return;
        }
        state.last_decrease = Some(state.latest);
        let lowered = |limit: f64| (limit * OVERLOAD_DECREASE).clamp(self.min, self.max);
        match &mut state.probe {
            Some(probe) => probe.saved_limit = lowered(probe.saved_limit),
            None => state.limit = lowered(state.limit),
        }
    }

    /// Adds a baseline sample; whether the measurement is complete.
    fn push_pending(&self, state: &mut State, latency: u64) -> bool {
        if state.pending_len < BASELINE_SAMPLES {
            state.pending[state.pending_len] = latency;
            state.pending_len += 1;
        }
        state.pending_len == BASELINE_SAMPLES
    }

    fn finish_probe(&self, state: &mut State) {
        let Some(probe) = state.probe.take() else {
            return;
        };
        if state.pending_len > 0 {
            let measured = median(&mut state.pending[..state.pending_len]);
            // The baseline only falls, unless the limit sat at its minimum for a whole interval
            // (see the module documentation): a probe's operations share the server with other
            // clients' queues, so a higher measurement usually means those, not a slower server.
            state.baseline = Some(match state.baseline {
                Some(old) if !state.floored => old.min(measured),
                _ => measured,
            });
        }
        state.pending_len = 0;
        state.limit = probe.saved_limit;
        state.floored = state.limit < self.min + 1.0;
        let t = state.latest;
        state.next_probe = t.saturating_add(self.probe_interval);
        state.round = Round::starting(t, state.in_flight);
    }
}

/// The upper median of a non-empty slice (reordering it).
fn median(samples: &mut [u64]) -> u64 {
    samples.sort_unstable();
    samples.get(samples.len() / 2).copied().unwrap_or(0)
}

/// One slot of a [`ConcurrencyLimit`], held while an operation is in flight on its server.
///
/// Release it with [`Self::release`] and the operation's outcome. Dropped without a release
/// (a cancelled operation, an early return, a panic), it frees its slot as
/// [`Outcome::Abandoned`] at the limit's clock.
#[must_use = "a permit holds its slot until released or dropped"]
pub struct ConcurrencyPermit {
    /// `None` once released.
    shared: Option<Arc<Shared>>,
    acquired_at: Instant,
    /// The probe it was admitted in, if any.
    probe: Option<u64>,
}

impl fmt::Debug for ConcurrencyPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyPermit")
            .field("acquired_at", &self.acquired_at)
            .field("probe", &self.probe)
            .finish_non_exhaustive()
    }
}

impl ConcurrencyPermit {
    /// When the slot was taken.
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// Frees the slot at `now`, telling the limit how the operation ended. Returns the limit in
    /// force after the outcome was learnt from, so the caller can log or publish a change
    /// without taking the limit's lock again.
    pub fn release(mut self, now: Instant, outcome: Outcome) -> u32 {
        match self.shared.take() {
            Some(shared) => shared.release(now, self.acquired_at, self.probe, outcome),
            // Unreachable: only `release` and `drop` take `shared`, and both consume the permit.
            None => 0,
        }
    }
}

impl Drop for ConcurrencyPermit {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            let now = (shared.clock)();
            let _limit = shared.release(now, self.acquired_at, self.probe, Outcome::Abandoned);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;

    fn config(min: u32, max: u32) -> ConcurrencyConfig {
        ConcurrencyConfig {
            min_limit: min,
            max_limit: max,
            ..Default::default()
        }
    }

    fn limiter(config: ConcurrencyConfig) -> (ConcurrencyLimit, Instant) {
        let start = Instant::now();
        (
            ConcurrencyLimit::starting_at(config, start, Instant::now).unwrap(),
            start,
        )
    }

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    /// Acquires and answers `count` operations one at a time, each taking `latency`, starting
    /// at `*now` and advancing it.
    fn answer_serially(limit: &ConcurrencyLimit, now: &mut Instant, count: u32, latency: u64) {
        for _ in 0..count {
            let permit = limit.try_acquire(*now).expect("a free slot");
            *now += ms(latency);
            permit.release(*now, Outcome::Answered(ms(latency)));
        }
    }

    /// Acquires `width` operations at once and answers them all `latency` later, `rounds` times,
    /// starting at `*now` and advancing it.
    fn answer_in_rounds(
        limit: &ConcurrencyLimit,
        now: &mut Instant,
        rounds: u32,
        width: u32,
        latency: u64,
    ) {
        for _ in 0..rounds {
            let permits: Vec<_> = (0..width)
                .map(|_| limit.try_acquire(*now).expect("a free slot"))
                .collect();
            *now += ms(latency);
            for permit in permits {
                permit.release(*now, Outcome::Answered(ms(latency)));
            }
        }
    }

    /// A server whose latency grows with the operations in flight beyond its capacity, and
    /// clients that always have more work than their limits admit: every tick (1 ms) each
    /// client completes the operations that are done and starts as many as its limit allows.
    struct QueueingServer {
        capacity: u32,
        base_ms: f64,
        /// (client, end tick, latency, permit)
        running: Vec<(usize, u64, Duration, ConcurrencyPermit)>,
    }

    impl QueueingServer {
        fn new(capacity: u32, base_ms: f64) -> Self {
            Self {
                capacity,
                base_ms,
                running: Vec::new(),
            }
        }

        /// The latency of an operation that starts with `in_flight` operations on the server
        /// (itself included): the base, times the queue's length over capacity.
        fn latency(&self, in_flight: usize) -> Duration {
            let load = (in_flight as f64 / f64::from(self.capacity)).max(1.0);
            Duration::from_secs_f64(self.base_ms * load / 1000.0)
        }

        /// Runs one client from `start` for `ticks`; the limit in force after each tick.
        fn run(&mut self, limit: &ConcurrencyLimit, start: Instant, ticks: u64) -> Vec<u32> {
            self.run_clients(&[(limit.clone(), 0)], start, ticks)
                .into_iter()
                .map(|limits| limits[0])
                .collect()
        }

        /// Runs clients, each joining at its tick, from `start` for `ticks`; each client's
        /// limit in force after each tick.
        fn run_clients(
            &mut self,
            clients: &[(ConcurrencyLimit, u64)],
            start: Instant,
            ticks: u64,
        ) -> Vec<Vec<u32>> {
            let mut limits = Vec::new();
            for tick in 0..ticks {
                let now = start + ms(tick);
                let (done, running): (Vec<_>, Vec<_>) = self
                    .running
                    .drain(..)
                    .partition(|(_, end, _, _)| *end <= tick);
                self.running = running;
                for (_, _, latency, permit) in done {
                    permit.release(now, Outcome::Answered(latency));
                }
                for (client, (limit, joins)) in clients.iter().enumerate() {
                    if tick < *joins {
                        continue;
                    }
                    // Bounded: the limit never exceeds its maximum.
                    while let Some(permit) = limit.try_acquire(now) {
                        let latency = self.latency(self.running.len() + 1);
                        let end = tick + latency.as_millis().max(1) as u64;
                        self.running.push((client, end, latency, permit));
                    }
                    assert!(limit.in_flight() <= limit.config().max_limit);
                }
                limits.push(clients.iter().map(|(limit, _)| limit.limit()).collect());
            }
            limits
        }
    }

    #[test]
    fn defaults_are_the_documented_values() {
        let config = ConcurrencyConfig::default();
        assert_eq!(config.min_limit, 2);
        assert_eq!(config.max_limit, 100);
        assert_eq!(config.tolerance, 1.5);
        assert_eq!(config.probe_interval, Duration::from_secs(30));
        let (limit, _) = limiter(config);
        assert_eq!(
            limit.limit(),
            100,
            "a new server's limit starts at its maximum"
        );
        assert_eq!(limit.in_flight(), 0);
    }

    #[test]
    fn invalid_options_are_named_in_the_error() {
        let cases = [
            (config(1, 0), OPTION_MAX_LIMIT, "invalid maxPoolSize: 0 is not from 1 to 100000 connections for an adaptive concurrency limit"),
            (config(1, 100_001), OPTION_MAX_LIMIT, "invalid maxPoolSize: 100001 is not from 1 to 100000 connections for an adaptive concurrency limit"),
            (config(0, 10), OPTION_MIN_LIMIT, "invalid adaptiveConcurrencyMinLimit: 0 is not from 1 to maxPoolSize operations"),
            (config(11, 10), OPTION_MIN_LIMIT, "invalid adaptiveConcurrencyMinLimit: 11 is not from 1 to maxPoolSize operations"),
            (
                ConcurrencyConfig { tolerance: 0.99, ..Default::default() },
                OPTION_TOLERANCE,
                "invalid adaptiveConcurrencyTolerance: 0.99 is not a number from 1 to 10 (multiples of the no-load latency)",
            ),
            (
                ConcurrencyConfig { probe_interval: ms(999), ..Default::default() },
                OPTION_PROBE_INTERVAL_MS,
                "invalid adaptiveConcurrencyProbeIntervalMS: 999 is not from 1000 to 600000 milliseconds",
            ),
            (
                ConcurrencyConfig { probe_interval: ms(600_001), ..Default::default() },
                OPTION_PROBE_INTERVAL_MS,
                "invalid adaptiveConcurrencyProbeIntervalMS: 600001 is not from 1000 to 600000 milliseconds",
            ),
        ];
        for (config, option, message) in cases {
            let err = ConcurrencyLimit::new(config, Instant::now).unwrap_err();
            assert_eq!(err.option(), option);
            assert_eq!(err.to_string(), message);
        }
        let nan = ConcurrencyConfig {
            tolerance: f64::NAN,
            ..Default::default()
        };
        assert_eq!(nan.validate().unwrap_err().option(), OPTION_TOLERANCE);
    }

    #[test]
    fn the_limit_starts_at_its_maximum() {
        assert_eq!(limiter(config(1, 5)).0.limit(), 5);
        assert_eq!(limiter(config(30, 50)).0.limit(), 50);
        assert_eq!(limiter(config(1, 1)).0.limit(), 1);
        assert_eq!(limiter(config(100_000, 100_000)).0.limit(), 100_000);
    }

    #[test]
    fn slots_beyond_the_limit_are_refused_until_one_is_released() {
        let (limit, start) = limiter(config(1, 3));
        let permits: Vec<_> = (0..3).map(|_| limit.try_acquire(start).unwrap()).collect();
        assert!(limit.try_acquire(start).is_none());
        assert!(!limit.has_free_slot());
        let mut permits = permits.into_iter();
        permits
            .next()
            .unwrap()
            .release(start + ms(1), Outcome::Answered(ms(1)));
        assert!(limit.has_free_slot());
        assert!(limit.try_acquire(start + ms(1)).is_some());
    }

    #[test]
    fn a_dropped_permit_releases_its_slot() {
        let (limit, start) = limiter(config(1, 2));
        let first = limit.try_acquire(start).unwrap();
        let second = limit.try_acquire(start).unwrap();
        assert!(limit.try_acquire(start).is_none());
        drop(first);
        assert_eq!(limit.in_flight(), 1);
        // A released permit is not released again when it goes out of scope.
        second.release(start, Outcome::Abandoned);
        assert_eq!(limit.in_flight(), 0);
    }

    #[test]
    fn a_permit_held_by_a_cancelled_future_is_released() {
        use std::future::Future;

        // An operation's future holding its permit across an await point, dropped unfinished.
        let (limit, start) = limiter(config(1, 1));
        let held = {
            let limit = limit.clone();
            async move {
                let permit = limit.try_acquire(start).expect("free");
                std::future::pending::<()>().await;
                drop(permit);
            }
        };
        let mut held = Box::pin(held);
        // Poll once so the future takes its slot, then cancel it.
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        assert!(held.as_mut().poll(&mut cx).is_pending());
        assert_eq!(limit.in_flight(), 1);
        drop(held);
        assert_eq!(limit.in_flight(), 0);
        assert!(limit.try_acquire(start).is_some());
    }

    #[test]
    fn scattered_overload_errors_do_not_lower_the_limit() {
        let (limit, start) = limiter(config(2, 100));
        let mut now = start;
        answer_serially(&limit, &mut now, BASELINE_SAMPLES as u32, 10);
        let before = limit.limit();
        // One reply in twenty an overload error, the rest at the baseline: a random 5 %.
        for i in 0..400u32 {
            let permit = limit.try_acquire(now).expect("a free slot");
            now += ms(10);
            let outcome = if i % 20 == 19 {
                Outcome::Overloaded
            } else {
                Outcome::Answered(ms(10))
            };
            permit.release(now, outcome);
        }
        assert!(limit.limit() >= before, "{} < {before}", limit.limit());
        // One in five is an overload: the limit falls.
        for i in 0..100u32 {
            let permit = limit.try_acquire(now).expect("a free slot");
            now += ms(10);
            let outcome = if i % 5 == 4 {
                Outcome::Overloaded
            } else {
                Outcome::Answered(ms(10))
            };
            permit.release(now, outcome);
        }
        assert!(limit.limit() < before, "{} !< {before}", limit.limit());
    }

    #[test]
    fn an_overload_error_lowers_the_limit_once_per_round_trip() {
        let (limit, start) = limiter(config(2, 100));
        let permits: Vec<_> = (0..10).map(|_| limit.try_acquire(start).unwrap()).collect();
        // All ten fail together: the limit falls once, by 10 %.
        for permit in permits {
            permit.release(start + ms(5), Outcome::Overloaded);
        }
        assert_eq!(limit.limit(), 90);
        // An operation admitted after the decrease can lower it again.
        let later = limit.try_acquire(start + ms(6)).unwrap();
        later.release(start + ms(8), Outcome::Overloaded);
        assert_eq!(limit.limit(), 81, "100 × 0.9 × 0.9");
        // Sustained rejections take it to the minimum and no lower.
        for i in 0..100u64 {
            let permit = limit.try_acquire(start + ms(10 + 2 * i)).unwrap();
            permit.release(start + ms(11 + 2 * i), Outcome::Overloaded);
        }
        assert_eq!(limit.limit(), 2);
    }

    #[test]
    fn healthy_latency_raises_the_limit_to_its_maximum() {
        let (limit, start) = limiter(config(2, 100));
        // A server that answers in 10 ms whatever the load, and a client with more work than
        // the limit: the limit grows by up to 10 % per round trip, to the maximum.
        let mut server = QueueingServer::new(u32::MAX, 10.0);
        let limits = server.run(&limit, start, 5_000);
        assert_eq!(*limits.last().unwrap(), 100);
        assert!(limits.windows(2).all(|w| w[1] >= w[0] || w[1] == 2));
    }

    /// Cuts the limit, from its baseline of 10 ms, with rounds of every slot in use at 30 ms.
    fn cut_by_a_queue(limit: &ConcurrencyLimit, now: &mut Instant, rounds: u32) {
        answer_serially(limit, now, BASELINE_SAMPLES as u32, 10);
        for _ in 0..rounds {
            let permits: Vec<_> = std::iter::from_fn(|| limit.try_acquire(*now)).collect();
            *now += ms(30);
            for permit in permits {
                permit.release(*now, Outcome::Answered(ms(30)));
            }
        }
    }

    #[test]
    fn a_lightly_used_limit_returns_to_its_maximum_only_while_the_server_is_healthy() {
        let (limit, start) = limiter(config(2, 100));
        let mut now = start;
        cut_by_a_queue(&limit, &mut now, 20);
        let cut = limit.limit();
        assert!(cut < 20, "the queue cut the limit: {cut}");
        // One operation at a time at three times the baseline: the server still queues, and a
        // round that used under half the slots does not raise the limit.
        answer_serially(&limit, &mut now, 200, 30);
        assert!(limit.limit() <= cut, "{} > {cut}", limit.limit());
        // One at a time at the baseline: healthy, so the limit goes back to where it started
        // (within a slot: it approaches the maximum by a fifth of the distance a round trip).
        answer_serially(&limit, &mut now, 200, 10);
        assert!(limit.limit() >= 99, "{}", limit.limit());
    }

    #[test]
    fn a_cut_starts_from_the_slots_in_use() {
        let (limit, start) = limiter(config(2, 100));
        let mut now = start;
        answer_serially(&limit, &mut now, BASELINE_SAMPLES as u32, 10);
        assert_eq!(limit.limit(), 100);
        // Ten operations in flight and latency three times the baseline. The first round, in
        // which they arrived at once, is a backlog's and holds; the second binds the limit
        // below the ten, instead of a tenth below 100.
        answer_in_rounds(&limit, &mut now, 1, 10, 30);
        assert_eq!(limit.limit(), 100);
        answer_in_rounds(&limit, &mut now, 1, 10, 30);
        assert!(limit.limit() < 10, "{}", limit.limit());
    }

    #[test]
    fn a_draining_backlog_is_not_cut() {
        let (limit, start) = limiter(config(2, 100));
        let mut now = start;
        answer_serially(&limit, &mut now, BASELINE_SAMPLES as u32, 2);
        // A backlog of 40 released at once (a failover ended), which the server works off one
        // every 2 ms: latencies from 2 to 80 ms against a 2 ms baseline.
        let mut permits: Vec<_> = (0..40).map(|_| limit.try_acquire(now).unwrap()).collect();
        let sent = now;
        permits.reverse();
        while let Some(permit) = permits.pop() {
            now += ms(2);
            permit.release(now, Outcome::Answered(now - sent));
        }
        // Neither the round the backlog arrived in (the operations in flight more than
        // doubled) nor those in which it drained cut the limit: the next backlog of that size
        // goes through.
        assert!(limit.limit() >= 99, "{}", limit.limit());
    }

    #[test]
    fn queueing_latency_lowers_the_limit() {
        let (limit, start) = limiter(config(2, 100));
        let mut now = start;
        // A 10 ms baseline, then latency triples (a queue): the limit falls to the minimum.
        cut_by_a_queue(&limit, &mut now, 200);
        assert_eq!(limit.snapshot().baseline, Some(ms(10)));
        assert_eq!(limit.limit(), 2);
    }

    #[test]
    fn abandoned_operations_show_latency_above_the_estimate() {
        let (limit, start) = limiter(config(2, 100));
        let mut now = start;
        answer_serially(&limit, &mut now, BASELINE_SAMPLES as u32, 10);
        // Operations that end without a reply after 100 ms (their deadline): a queue the
        // answered samples alone would not show.
        for _ in 0..50 {
            let permits: Vec<_> = std::iter::from_fn(|| limit.try_acquire(now)).collect();
            now += ms(100);
            for permit in permits {
                permit.release(now, Outcome::Abandoned);
            }
        }
        assert_eq!(limit.limit(), 2);
        // Fast abandonments (the application lost interest) say nothing.
        let (limit, start) = limiter(config(2, 100));
        let mut now = start;
        answer_serially(&limit, &mut now, BASELINE_SAMPLES as u32, 10);
        for _ in 0..50 {
            let permits: Vec<_> = std::iter::from_fn(|| limit.try_acquire(now)).collect();
            now += ms(1);
            drop(permits);
        }
        assert_eq!(limit.limit(), 100);
    }

    #[test]
    fn a_probe_pins_the_limit_to_the_minimum_and_remeasures_the_baseline() {
        let config = ConcurrencyConfig {
            probe_interval: Duration::from_secs(1),
            ..config(2, 100)
        };
        let (limit, start) = limiter(config);
        let mut now = start;
        // The first baseline comes from traffic that was already queued: 40 ms.
        answer_serially(&limit, &mut now, BASELINE_SAMPLES as u32, 40);
        assert_eq!(limit.snapshot().baseline, Some(ms(40)));
        let before = limit.limit();
        now += Duration::from_secs(1);
        assert_eq!(
            limit.limit(),
            before,
            "the probe starts at the next decision"
        );
        let first = limit.try_acquire(now).unwrap();
        assert!(limit.snapshot().probing);
        assert_eq!(limit.limit(), 2);
        let second = limit.try_acquire(now).unwrap();
        assert!(
            limit.try_acquire(now).is_none(),
            "two at a time during a probe"
        );
        // Alone, the server answers in 10 ms.
        now += ms(10);
        first.release(now, Outcome::Answered(ms(10)));
        second.release(now, Outcome::Answered(ms(10)));
        answer_serially(&limit, &mut now, BASELINE_SAMPLES as u32 - 2, 10);
        let snapshot = limit.snapshot();
        assert!(!snapshot.probing);
        assert_eq!(snapshot.baseline, Some(ms(10)));
        assert_eq!(
            snapshot.limit, before,
            "the limit before the probe is restored"
        );
    }

    /// A probe's higher measurement is the other clients' queue, not this server's no-load
    /// latency: it does not raise the baseline.
    #[test]
    fn a_probe_does_not_raise_the_baseline_while_the_limit_is_above_its_minimum() {
        let config = ConcurrencyConfig {
            probe_interval: Duration::from_secs(1),
            ..config(2, 100)
        };
        let (limit, start) = limiter(config);
        let mut now = start;
        answer_serially(&limit, &mut now, BASELINE_SAMPLES as u32, 10);
        now += Duration::from_secs(1);
        answer_serially(&limit, &mut now, BASELINE_SAMPLES as u32, 14);
        let snapshot = limit.snapshot();
        assert!(!snapshot.probing);
        assert_eq!(snapshot.baseline, Some(ms(10)));
    }

    /// A server that became slower for good (every operation now takes 40 ms, at any load)
    /// pins the limit to its minimum; after a whole interval there, the next probe adopts the
    /// new latency as the baseline and the limit grows again.
    #[test]
    fn a_server_that_became_slower_is_rebaselined_after_an_interval_at_the_minimum() {
        let config = ConcurrencyConfig {
            probe_interval: Duration::from_secs(1),
            ..config(2, 100)
        };
        let (limit, start) = limiter(config);
        let mut now = start;
        answer_serially(&limit, &mut now, BASELINE_SAMPLES as u32, 10);
        let mut saw_minimum = false;
        // Saturating traffic at 40 ms for 10 s.
        for _ in 0..250 {
            let permits: Vec<_> = std::iter::from_fn(|| limit.try_acquire(now)).collect();
            now += ms(40);
            for permit in permits {
                permit.release(now, Outcome::Answered(ms(40)));
            }
            let snapshot = limit.snapshot();
            saw_minimum |= snapshot.limit == 2 && !snapshot.probing;
        }
        assert!(saw_minimum, "the slower server first pushed the limit down");
        let snapshot = limit.snapshot();
        assert_eq!(snapshot.baseline, Some(ms(40)));
        assert!(snapshot.limit > 20, "and then it grew again: {snapshot:?}");
    }

    #[test]
    fn a_probe_without_samples_ends_and_keeps_the_baseline() {
        let config = ConcurrencyConfig {
            probe_interval: Duration::from_secs(1),
            ..config(2, 100)
        };
        let (limit, start) = limiter(config);
        let mut now = start;
        answer_serially(&limit, &mut now, BASELINE_SAMPLES as u32, 10);
        now += Duration::from_secs(1);
        assert!(limit.try_acquire(now).is_some());
        assert!(limit.snapshot().probing);
        now += PROBE_MAX_DURATION;
        assert!(limit.try_acquire(now).is_some());
        let snapshot = limit.snapshot();
        assert!(!snapshot.probing);
        assert_eq!(snapshot.baseline, Some(ms(10)));
        assert_eq!(snapshot.limit, 100, "the limit before the probe, restored");
    }

    #[test]
    fn a_client_bound_by_its_own_lag_keeps_its_limit() {
        let (limit, start) = limiter(config(2, 100));
        let lag = Arc::new(ClientLag::new());
        limit.read_client_lag(Arc::clone(&lag));
        let mut now = start;
        // A 10 ms baseline, then ten at a time at 4 × the baseline: the limit falls...
        answer_serially(&limit, &mut now, BASELINE_SAMPLES as u32, 10);
        let before = limit.limit();
        answer_in_rounds(&limit, &mut now, 2, 10, 40);
        assert!(limit.limit() < before, "{} !< {before}", limit.limit());
        // ...unless the client's own lag (here 30 ms, above the 5 ms that tolerance 1.5
        // allows over 10 ms) explains it.
        lag.record(ms(30));
        let held = limit.limit();
        answer_in_rounds(&limit, &mut now, 50, 5, 40);
        assert_eq!(
            limit.limit(),
            held,
            "latency samples of a client-bound client are ignored"
        );
        // Overload errors are the server's own signal: a run of them still lowers the limit.
        for _ in 0..4 {
            let permit = limit.try_acquire(now).expect("a free slot");
            permit.release(now + ms(1), Outcome::Overloaded);
        }
        assert!(limit.limit() < held);
        // Once the lag is gone, latency counts again.
        for _ in 0..40 {
            lag.record(Duration::from_micros(10));
        }
        let lowered = limit.limit();
        now += ms(100);
        answer_serially(&limit, &mut now, 50, 40);
        assert!(limit.limit() < lowered, "{} !< {lowered}", limit.limit());
    }

    /// A server with capacity for 10 operations at once and 20 ms latency, whose latency grows
    /// in proportion beyond that, and a client that always wants more: the limit must settle
    /// near `tolerance × capacity + 1` (16), not at the maximum (100).
    /// The first baseline is taken under the initial limit of 20, so it is twice too high;
    /// the probe at 30 s corrects it.
    #[test]
    fn limit_settles_near_capacity_in_a_queueing_server() {
        let (limit, start) = limiter(config(2, 100));
        let mut server = QueueingServer::new(10, 20.0);
        let limits = server.run(&limit, start, 120_000);
        let settled = &limits[60_000..];
        let mean = settled.iter().map(|&l| f64::from(l)).sum::<f64>() / settled.len() as f64;
        // `tolerance × capacity + queue allowance` = 16; the probes' dips pull the mean down.
        assert!((14.0..=17.0).contains(&mean), "mean limit {mean}");
        let outside = settled.iter().filter(|&&l| !(8..=25).contains(&l)).count();
        assert!(
            outside * 100 <= settled.len(),
            "{outside} of {} ticks outside 8..=25 (probes pin it to 2)",
            settled.len()
        );
        assert!(settled.iter().all(|&l| l < 100));
        assert_eq!(
            limit.snapshot().baseline,
            Some(ms(20)),
            "the probe measured the no-load latency"
        );
    }

    /// Four clients join a server with capacity for 40 operations at 20 ms, 7.5 s apart, so
    /// their probes never coincide and each probe measures the others' queue; the late ones
    /// take their first baseline under the earlier ones' load. After a few probes their limits
    /// must together settle near `1.5 × 40 + 4` (not at 4 × 100), each near a fair share, with
    /// every baseline near the server's true no-load latency. (Run for 15 simulated minutes,
    /// the totals stay at 65.6: no ratchet.)
    #[test]
    fn clients_sharing_a_server_converge_to_fair_limits() {
        let start = Instant::now();
        let clients: Vec<_> = (0..4u64)
            .map(|i| {
                let joins = i * 7_500;
                let origin = start + ms(joins);
                let limit =
                    ConcurrencyLimit::starting_at(config(2, 100), origin, Instant::now).unwrap();
                (limit, joins)
            })
            .collect();
        let mut server = QueueingServer::new(40, 20.0);
        let limits = server.run_clients(&clients, start, 300_000);
        let settled = &limits[150_000..];
        let totals: Vec<u32> = settled.iter().map(|l| l.iter().sum()).collect();
        let mean = totals.iter().map(|&t| f64::from(t)).sum::<f64>() / totals.len() as f64;
        assert!((55.0..=75.0).contains(&mean), "mean total limit {mean}");
        for (client, (limit, _)) in clients.iter().enumerate() {
            let snapshot = limit.snapshot();
            let baseline = snapshot.baseline.unwrap_or_default();
            assert!(
                (ms(20)..=ms(24)).contains(&baseline),
                "client {client}: {snapshot:?}"
            );
            // Not exactly fair: a baseline 5 % higher (one probe taken beside the others'
            // queue) gives a client about twice the share of the others, and the late
            // joiners approach their share slowly. Judged on each client's mean limit over
            // the settled half rather than one instant's: 22.5, 18.2, 14.7 and 7.0 (with a
            // round's mean latency in place of its median: 32.0, 18.8, 7.2 and 7.2).
            let share =
                settled.iter().map(|l| f64::from(l[client])).sum::<f64>() / settled.len() as f64;
            assert!(
                (6.0..=32.0).contains(&share),
                "client {client}: {share:.1} of a fair 16 on average ({snapshot:?})"
            );
        }
    }

    /// Sends one operation every `every` for 20 s to a server behind which a third of the
    /// operations take 100 ms and the rest 5 ms, whatever the load; returns the operations sent,
    /// those the limit held back after the first second (the baseline's warm-up), and the limit.
    fn slow_minority(every: Duration) -> (u64, u64, ConcurrencyLimit) {
        let (limit, start) = limiter(config(2, 100));
        let mut running: Vec<(Instant, ConcurrencyPermit, Duration)> = Vec::new();
        let (mut sent, mut refused) = (0u64, 0u64);
        let mut now = start;
        while now < start + Duration::from_secs(20) {
            let (done, still): (Vec<_>, Vec<_>) =
                running.drain(..).partition(|(end, _, _)| *end <= now);
            running = still;
            for (_, permit, latency) in done {
                permit.release(now, Outcome::Answered(latency));
            }
            match limit.try_acquire(now) {
                Some(permit) => {
                    let latency = if sent % 3 == 0 { ms(100) } else { ms(5) };
                    sent += 1;
                    running.push((now + latency, permit, latency));
                }
                None if now >= start + Duration::from_secs(1) => refused += 1,
                None => {}
            }
            now += every;
        }
        (sent, refused, limit)
    }

    /// A mongos in front of three shards, one of which sheds: a third of the operations wait
    /// 100 ms in the router's retries, the rest take 5 ms (the router itself queues nothing).
    /// The limit must not hold the healthy shards' operations back for the slow third. At
    /// 1,000 operations a second (about 37 in flight), a round's mean latency (about 37 ms,
    /// seven times the baseline) took the limit to its minimum. At 80 a second, the rate one
    /// client sent each router in the lab's `hot-shard`, a round trip holds one or two samples,
    /// and the median of the round's own, not topped up, held back 330 of 1,255 here.
    #[test]
    fn a_slow_minority_behind_one_address_does_not_cut_the_limit() {
        let (sent, refused, limit) = slow_minority(ms(1));
        assert_eq!(refused, 0, "{sent} sent; {:?}", limit.snapshot());
        assert!(limit.limit() >= 50, "{:?}", limit.snapshot());
        assert_eq!(limit.snapshot().latency, Some(ms(5)));
        let (sent, refused, limit) = slow_minority(Duration::from_micros(12_500));
        assert!(
            refused * 100 <= sent,
            "{refused} of {sent} held back; {:?}",
            limit.snapshot()
        );
    }

    #[test]
    fn the_recent_samples_are_the_latest_sixteen() {
        let mut recent = RecentSamples::default();
        for latency in [5, 1, 9] {
            recent.push(latency);
        }
        assert_eq!(recent.median(), 5);
        // 0 to 99 pushed after them: 84 to 99 kept, upper median 92.
        for latency in 0..100 {
            recent.push(latency);
        }
        assert_eq!(recent.len, MEDIAN_SAMPLES);
        assert_eq!(recent.median(), 92);
    }

    #[test]
    fn a_round_keeps_an_even_subset_of_its_samples_and_their_median() {
        let mut few = RoundSamples::default();
        for latency in [5, 1, 9] {
            few.push(latency);
        }
        assert_eq!(few.median(), 5);
        // 1,000 samples, 0 to 999: the store filled at 32, 64, 128, 256 and 512 samples, so
        // the kept ones are every 32nd, 0 to 992, and their median the middle one.
        let mut many = RoundSamples::default();
        for latency in 0..1_000 {
            many.push(latency);
        }
        assert_eq!(many.len, ROUND_SAMPLES);
        assert_eq!(many.stride, 32);
        let kept: Vec<u64> = (0..32).map(|i| i * 32).collect();
        assert_eq!(many.kept[..many.len], kept[..]);
        assert_eq!(many.median(), 512);
        // A third of slow samples anywhere in the round does not move the median.
        let mut mixed = RoundSamples::default();
        for i in 0..300u64 {
            mixed.push(if i % 3 == 0 { 100 } else { 5 });
        }
        assert_eq!(mixed.median(), 5);
    }

    #[test]
    fn extreme_latencies_and_times_keep_the_limit_in_bounds() {
        let (limit, start) = limiter(config(3, 50));
        let mut now = start;
        for latency in [Duration::ZERO, Duration::MAX, Duration::from_nanos(1)] {
            for _ in 0..100 {
                let permits: Vec<_> = std::iter::from_fn(|| limit.try_acquire(now)).collect();
                for permit in permits {
                    permit.release(now, Outcome::Answered(latency));
                }
                now += ms(1);
                let l = limit.limit();
                assert!((3..=50).contains(&l), "{l}");
            }
        }
        // Time far in the past, and at the edge of what Instant holds.
        let past = start
            .checked_sub(Duration::from_secs(3600))
            .unwrap_or(start);
        let permit = limit.try_acquire(past).unwrap();
        permit.release(past, Outcome::Abandoned);
        assert_eq!(limit.in_flight(), 0);
    }

    #[test]
    fn shared_across_threads_the_limit_is_never_exceeded() {
        let (limit, start) = limiter(config(2, 8));
        let peak = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|scope| {
            for thread in 0..4u64 {
                let (limit, peak) = (limit.clone(), &peak);
                scope.spawn(move || {
                    for i in 0..2000u64 {
                        let now = start + ms(i);
                        if let Some(permit) = limit.try_acquire(now) {
                            peak.fetch_max(limit.in_flight(), std::sync::atomic::Ordering::Relaxed);
                            let outcome = if (i + thread) % 7 == 0 {
                                Outcome::Overloaded
                            } else {
                                Outcome::Answered(ms(1 + i % 5))
                            };
                            permit.release(now + ms(1), outcome);
                        }
                    }
                });
            }
        });
        assert_eq!(limit.in_flight(), 0);
        assert!(peak.load(std::sync::atomic::Ordering::Relaxed) <= 8);
    }

    #[derive(Clone, Debug)]
    enum Event {
        Acquire,
        Answer(u64),
        Overload,
        Abandon,
        Drop,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            4 => Just(Event::Acquire),
            3 => prop_oneof![0u64..50_000_000, Just(0), Just(u64::MAX)].prop_map(Event::Answer),
            1 => Just(Event::Overload),
            1 => Just(Event::Abandon),
            1 => Just(Event::Drop),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Any sequence of acquisitions and releases with any outcomes, latencies and times
        /// (backwards included): the limit stays within its bounds, a successful acquisition
        /// never leaves more in flight than the limit in force, and `in_flight` always equals
        /// the permits alive.
        #[test]
        fn the_limit_keeps_its_invariants(
            min in 1u32..10,
            extra in 0u32..60,
            tolerance in 1.0f64..=10.0,
            probe_secs in 1u64..5,
            events in proptest::collection::vec(
                (prop_oneof![6 => 0i64..20, 1 => 0i64..5_000, 1 => -3_000i64..0], event()),
                1..400,
            ),
        ) {
            let max = min + extra;
            let config = ConcurrencyConfig {
                min_limit: min,
                max_limit: max,
                tolerance,
                probe_interval: Duration::from_secs(probe_secs),
            };
            let (limit, start) = limiter(config);
            let mut held: VecDeque<ConcurrencyPermit> = VecDeque::new();
            let mut clock = 0i64;
            for (step, event) in events {
                clock += step;
                let now = if clock >= 0 {
                    start + ms(clock as u64)
                } else {
                    start - ms(clock.unsigned_abs())
                };
                match event {
                    Event::Acquire => {
                        if let Some(permit) = limit.try_acquire(now) {
                            held.push_back(permit);
                            prop_assert!(limit.in_flight() <= limit.limit());
                        }
                    }
                    Event::Answer(nanos) => {
                        if let Some(permit) = held.pop_front() {
                            let after =
                                permit.release(now, Outcome::Answered(Duration::from_nanos(nanos)));
                            prop_assert_eq!(after, limit.limit(), "release reports the limit in force");
                        }
                    }
                    Event::Overload => {
                        if let Some(permit) = held.pop_front() {
                            permit.release(now, Outcome::Overloaded);
                        }
                    }
                    Event::Abandon => {
                        if let Some(permit) = held.pop_back() {
                            permit.release(now, Outcome::Abandoned);
                        }
                    }
                    Event::Drop => {
                        held.pop_back();
                    }
                }
                let snapshot = limit.snapshot();
                prop_assert!((min..=max).contains(&snapshot.limit), "{:?}", snapshot);
                prop_assert_eq!(snapshot.in_flight as usize, held.len());
                // The lock-free answer is the locked state's.
                prop_assert_eq!(limit.has_free_slot(), limit.in_flight() < limit.limit());
            }
            held.clear();
            prop_assert_eq!(limit.in_flight(), 0);
        }
    }
}
