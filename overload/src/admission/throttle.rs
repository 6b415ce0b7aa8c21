//! [`AdaptiveThrottle`]: client-side adaptive throttling of first attempts, after the Google SRE
//! book's chapter "Handling Overload".
//!
//! # The rule
//!
//! Over a trailing window the throttle counts `requests`, the first attempts the application
//! asked to send (including those the throttle itself rejected), and `accepts`, those the
//! server did not reject for overload. Each new first attempt is rejected locally, without
//! being sent, with probability
//!
//! ```text
//! p = max(0, (requests − K·accepts) / (requests + 1))
//! ```
//!
//! so a server that accepts fewer than `1/K` of the requests sees its traffic cut to about `K`
//! requests per request it accepts. The arithmetic at the SRE book's `K = 2`, the default
//! ([`DEFAULT_K`]):
//!
//! - nothing is rejected locally while at least half of the recent requests are accepted
//!   (`requests ≤ 2·accepts` makes the numerator zero); a server rejecting 30 % of requests, or
//!   one that rejects nothing but is slow, is never throttled;
//! - at a demand `D` against a server that accepts `C` per second (`D > 2C`), the throttle
//!   settles where `p ≈ 1 − 2C/D`: the server receives about `2C`, serves `C` and rejects `C`,
//!   where without the throttle it would reject `D − C`. At four times capacity that is a third
//!   of the rejections (and of the core time spent rejecting);
//! - locally rejected requests count as requests that were not accepted, which is what keeps
//!   `p` up while the overload lasts: the formula's fixed point is "send `K` times what is
//!   accepted".
//!
//! # Engaging only under sustained overload
//!
//! - The window (default 10 s) holds every request of the last 10 s, so a short spike of
//!   rejections on a busy client is averaged with the accepted requests around it: a client
//!   sending at a steady rate starts to throttle only when more than half of a whole window's
//!   requests were rejected.
//! - Below `min_requests` requests in the window (default 20) nothing is rejected: a client
//!   that just started, or one that sends a request a minute, has too few requests for a ratio
//!   to mean anything, and sends too little to harm a server anyway.
//! - `p` never exceeds [`MAX_REJECTION_PROBABILITY`] (0.9). The formula alone approaches 1
//!   when the server rejects everything; the throttle then sends almost nothing, hears of the
//!   server's recovery only through the trickle it sends, and keeps rejecting for many windows
//!   after the server has recovered. With at least a tenth of the demand sent, the sent share
//!   doubles about once per window once the server accepts again
//!   (`the_throttle_releases_after_the_overload_ends` measures it).
//!
//! # Sparse clients
//!
//! One instance of a fleet of thousands may send a request every few seconds, never
//! `min_requests` in a window, while the fleet together floods the server; with the window
//! alone such a client never throttles (the simulator's 10,000-client `flood` kept 0.13 of
//! capacity, no better than sending every request without retries). So the throttle also keeps
//! the same counts per whole window for [`HISTORY_WINDOWS`] windows (two minutes by default, the
//! SRE book's own window), and when the window holds fewer than `min_requests` it applies the
//! rule to that history instead, on two conditions:
//!
//! - the history holds at least `min_requests` requests: the same evidence a busy client
//!   needs, gathered over a longer time;
//! - the server's latest answer to this client was an overload rejection
//!   ([`AdaptiveThrottle::record_accept`] reports the others). A client that went quiet during
//!   an overload and comes back after it starts throttled on its old history, but only until
//!   the server accepts one of its requests; a client whose last answer was an acceptance is
//!   never throttled on old counts.
//!
//! The history's decisions are counted in the history only, not in the window: a busy client
//! coming back from idleness would otherwise fill its fresh window with local rejections made
//! on old counts and keep itself throttled for a window after the server recovered.
//!
//! # What counts as accepted
//!
//! A request is counted as accepted unless the server rejected it for overload (an error
//! labelled `SystemOverloadedError`) or the throttle rejected it locally: the counts need only
//! the overload rejections ([`AdaptiveThrottle::record_overload`]; the answers reported by
//! [`AdaptiveThrottle::record_accept`] serve the sparse rule above). Any other outcome,
//! a success, a duplicate-key error, a timeout, a network error, a cancelled operation, counts
//! as accepted, because none of them says that the server refused work to protect itself:
//!
//! - an ordinary server error is work the server did and answered;
//! - a timeout may be the application's deadline being too short for a healthy server, a slow
//!   query, or queueing; throttling on it would reject requests to a server that is not
//!   refusing anything. Queueing is the [`ConcurrencyLimit`](super::ConcurrencyLimit)'s signal;
//! - a network error is handled by server monitoring and the connection pool.
//!
//! Counting only explicit rejections also means a request still in flight counts as accepted,
//! so long latencies cannot masquerade as rejections (a pitfall of implementations that count
//! requests when they complete, `overload-anchors.md` §2).
//!
//! Only first attempts are counted and throttled. Retries are the retry budget's business,
//! and a retry that was throttled here would be counted twice against the same overload.
//!
//! # The window
//!
//! Counts are kept in ten slots of `window / 10`, like the retry budget's deposits
//! ([`crate::budget`]): a slot's counts expire together, between 90 % and 100 % of the window
//! after they were made. The counts are integers and `K` is held in thousandths, so the
//! comparison `requests ≤ K·accepts` is exact and nothing drifts over millions of requests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::InvalidAdmissionConfig;
use crate::backoff::Jitter;
use crate::tally::Tally;

/// Connection-string name of [`ThrottleConfig::k`] (provisional).
pub const OPTION_K: &str = "adaptiveThrottleK";
/// Connection-string name of [`ThrottleConfig::window`], in milliseconds (provisional).
pub const OPTION_WINDOW_MS: &str = "adaptiveThrottleWindowMS";
/// Connection-string name of [`ThrottleConfig::min_requests`] (provisional).
pub const OPTION_MIN_REQUESTS: &str = "adaptiveThrottleMinRequests";

/// Default `K`: 2, the SRE book's value: the throttle engages once a server rejects more than
/// half of a client's requests, and then lets through two requests per request accepted. A
/// smaller `K` cuts a flood's rejections further but engages on transient rejections: the lab's
/// suite of 2026-12-04 14:30 measured `flood` goodput at 0.78 of capacity with both 2 and 1.5
/// (server core time spent rejecting 16.7 % against 12.6 %; 51–58 % without the throttle),
/// while at 30 % random rejections the throttle cost 1.9 points of success share against
/// upstream's defaults at 1.5 and 0.26 at 2 (added to the retry budget and `timeoutMS`;
/// `docs/admission.md`, "The recommended settings").
pub const DEFAULT_K: f64 = 2.0;
/// The smallest `K`. Below 1 the throttle would reject requests the server accepts.
pub const MIN_K: f64 = 1.0;
/// The largest `K`. At 10 the throttle engages only when over 90 % of requests are rejected;
/// beyond that it does nothing a server would notice.
pub const MAX_K: f64 = 10.0;

/// Default window: 10 s. The SRE book counts over two minutes and grpc-go's adaptive throttler
/// over 30 s; the longer the window, the longer local rejections continue after an overload
/// ends (they stop as the overloaded part of the window expires). Ten seconds holds thousands
/// of requests at the rates where throttling matters (hundreds per second per client), enough
/// for a stable ratio, and matches the retry budget's window (`retryBudgetWindowMS`).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);
/// The shortest window. Shorter windows follow single bursts rather than sustained overload.
pub const MIN_WINDOW: Duration = Duration::from_secs(1);
/// The longest window. Longer windows keep rejecting for too long after an overload ends.
pub const MAX_WINDOW: Duration = Duration::from_secs(60);

/// Default minimum: no local rejection with fewer than 20 requests in the window.
pub const DEFAULT_MIN_REQUESTS: u32 = 20;
/// The largest minimum (a minimum this high turns the throttle off for most clients).
pub const MAX_MIN_REQUESTS: u32 = 1_000_000;

/// The highest rejection probability: at least a tenth of the demand is always sent, so the
/// throttle notices that a server has recovered (see the module documentation).
pub const MAX_REJECTION_PROBABILITY: f64 = 0.9;

/// `K` is held in thousandths of a request.
const K_SCALE: u64 = 1000;
/// Counts are kept in this many slots of `window / SLOTS` each.
const SLOTS: usize = 10;
/// How many windows a sparse client's history holds: two minutes at the default window, the
/// SRE book's own window.
pub const HISTORY_WINDOWS: usize = crate::tally::HISTORY_WINDOWS;

/// Which counts a decision was made from, and so which counts it goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Counts {
    /// The window's: the client sends enough for them, or the server is not rejecting.
    Window,
    /// The history's only: a sparse client's decision, left out of the window so that a busy
    /// client's window never fills with decisions made on old counts.
    History,
}

/// The options of an [`AdaptiveThrottle`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ThrottleConfig {
    /// `adaptiveThrottleK`: requests sent per accepted request before the throttle engages.
    /// From [`MIN_K`] to [`MAX_K`], resolution 0.001; default [`DEFAULT_K`].
    pub k: f64,
    /// `adaptiveThrottleWindowMS`: how long a request counts. From [`MIN_WINDOW`] to
    /// [`MAX_WINDOW`]; default [`DEFAULT_WINDOW`].
    pub window: Duration,
    /// `adaptiveThrottleMinRequests`: requests the window must hold before anything is rejected
    /// locally. From 0 to [`MAX_MIN_REQUESTS`]; default [`DEFAULT_MIN_REQUESTS`].
    pub min_requests: u32,
}

impl Default for ThrottleConfig {
    /// K 2, a 10 s window, at least 20 requests.
    fn default() -> Self {
        Self {
            k: DEFAULT_K,
            window: DEFAULT_WINDOW,
            min_requests: DEFAULT_MIN_REQUESTS,
        }
    }
}

impl ThrottleConfig {
    /// Checks every option against its range.
    ///
    /// # Errors
    ///
    /// [`InvalidAdmissionConfig`] naming the first option out of range:
    /// - `adaptiveThrottleK` below 1, above 10, or not a number;
    /// - `adaptiveThrottleWindowMS` below 1000 or above 60000;
    /// - `adaptiveThrottleMinRequests` above 1000000.
    pub fn validate(&self) -> Result<(), InvalidAdmissionConfig> {
        // `contains` is false for NaN, so NaN is refused here too.
        if !(MIN_K..=MAX_K).contains(&self.k) {
            return Err(InvalidAdmissionConfig::new(
                OPTION_K,
                self.k,
                "a number from 1 to 10 (requests per accepted request)",
            ));
        }
        if !(MIN_WINDOW..=MAX_WINDOW).contains(&self.window) {
            return Err(InvalidAdmissionConfig::new(
                OPTION_WINDOW_MS,
                self.window.as_secs_f64() * 1000.0,
                "from 1000 to 60000 milliseconds",
            ));
        }
        if self.min_requests > MAX_MIN_REQUESTS {
            return Err(InvalidAdmissionConfig::new(
                OPTION_MIN_REQUESTS,
                self.min_requests,
                "from 0 to 1000000 requests",
            ));
        }
        Ok(())
    }
}

/// What the throttle decided for one first attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThrottleDecision {
    /// Send it.
    Send,
    /// Do not send it: fail the operation with a local overload rejection.
    Reject,
}

/// The window's counts at one moment, for stats and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThrottleCounts {
    /// First attempts asked for in the window, locally rejected ones included.
    pub requests: u64,
    /// Those neither rejected locally nor by the server for overload.
    pub accepts: u64,
}

/// Client-side adaptive throttling of first attempts to one server; see the
/// [module documentation](self) for the rule and its arithmetic.
///
/// Thread safety: the counts sit behind one [`Mutex`], taken once per first attempt and once
/// per overload rejection for a few dozen instructions (at most 22 slots are cleared or
/// summed), the same trade as the retry budget's. [`Self::rejection_probability`] takes it only
/// when a refusal may still be in the window or the server's latest answer was a rejection.
#[derive(Debug)]
pub struct AdaptiveThrottle {
    config: ThrottleConfig,
    /// `K` in thousandths.
    k_milli: u64,
    slot_nanos: u64,
    window: Mutex<Window>,
    /// Times are kept as nanoseconds since this instant.
    origin: Instant,
    /// One more than the latest time (nanoseconds since `origin`) a request was refused, 0 for
    /// never: with `K ≥ 1` a window without refusals rejects nothing, so
    /// [`Self::rejection_probability`], asked before every first attempt's server selection,
    /// answers without the lock while the server refuses nothing.
    last_refusal: AtomicU64,
    /// One more than the latest time (nanoseconds since `origin`) the server rejected a request
    /// for overload, 0 for never.
    last_overload: AtomicU64,
    /// One more than the latest time the server answered a request without an overload error,
    /// recorded only for the first answer after an overload rejection (the only one that
    /// changes which came last), 0 for never. The two decide whether a sparse client reads its
    /// history.
    last_accept: AtomicU64,
}

#[derive(Debug)]
struct Window {
    /// The latest time seen; earlier times count as this one.
    latest: u64,
    /// Requests, and those not accepted (rejected locally, or by the server for overload), per
    /// slot of `window / SLOTS`; slot `n` is time / slot length.
    slots: Tally<SLOTS>,
    /// The sparse client's history: the same counts per whole window.
    history: Tally<HISTORY_WINDOWS>,
}

impl AdaptiveThrottle {
    /// A throttle with these options and an empty window.
    ///
    /// # Errors
    ///
    /// [`InvalidAdmissionConfig`] as [`ThrottleConfig::validate`] gives it.
    pub fn new(config: ThrottleConfig) -> Result<Self, InvalidAdmissionConfig> {
        Self::starting_at(config, Instant::now())
    }

    /// As [`Self::new`], with the throttle's clock starting at `origin`: times before it count
    /// as `origin`.
    ///
    /// # Errors
    ///
    /// [`InvalidAdmissionConfig`] as [`ThrottleConfig::validate`] gives it.
    pub fn starting_at(
        config: ThrottleConfig,
        origin: Instant,
    ) -> Result<Self, InvalidAdmissionConfig> {
        config.validate()?;
        // Validation bounds these: K ≤ 10 is ≤ 10000 thousandths, the window ≤ 60 s in nanos.
        let k_milli = (config.k * K_SCALE as f64).round() as u64;
        let window_nanos = config.window.as_nanos() as u64;
        Ok(Self {
            config,
            k_milli,
            slot_nanos: window_nanos / SLOTS as u64,
            window: Mutex::new(Window {
                latest: 0,
                slots: Tally::new(),
                history: Tally::new(),
            }),
            origin,
            last_refusal: AtomicU64::new(0),
            last_overload: AtomicU64::new(0),
            last_accept: AtomicU64::new(0),
        })
    }

    /// The options the throttle was built with.
    pub fn config(&self) -> ThrottleConfig {
        self.config
    }

    /// Decides one first attempt at `now` and counts it as a request: rejected with the
    /// probability of the [rule](self) computed from the window before it, using one value of
    /// `jitter` (uniform in `[0, 1)`; the driver passes
    /// [`RandomJitter`](crate::backoff::RandomJitter)). A jitter value outside `[0, 1)` is
    /// clamped into it and NaN sends the request: a broken random source must not reject.
    /// A rejected request also counts as not accepted.
    pub fn admit(&self, now: Instant, jitter: &mut impl Jitter) -> ThrottleDecision {
        let mut window = self.window_at(now);
        let (probability, from) = self.probability(&window);
        let draw = jitter.sample();
        let reject = !draw.is_nan() && draw.clamp(0.0, 1.0) < probability;
        window.count_request(from);
        if reject {
            window.count_refusal(from);
            self.note_refusal(&window);
            ThrottleDecision::Reject
        } else {
            ThrottleDecision::Send
        }
    }

    /// Counts, at `now`, a first attempt the server rejected for overload (an error labelled
    /// `SystemOverloadedError`). Every other outcome counts as accepted without a call; an
    /// answer is still worth [`Self::record_accept`] for a sparse client's history.
    pub fn record_overload(&self, now: Instant) {
        let mut window = self.window_at(now);
        window.count_refusal(Counts::Window);
        self.last_overload
            .fetch_max(window.latest.saturating_add(1), Ordering::Relaxed);
        self.note_refusal(&window);
    }

    /// Notes, at `now`, that the server answered a first attempt without an overload error.
    /// Only a sparse client's history needs it (module documentation, "Sparse clients"), and
    /// only the first answer after an overload rejection changes anything, so every other call
    /// costs two atomic loads.
    pub fn record_accept(&self, now: Instant) {
        if !self.answered_overloaded() {
            return;
        }
        let nanos = self.nanos_since_origin(now);
        self.last_accept
            .fetch_max(nanos.saturating_add(1), Ordering::Relaxed);
    }

    /// Whether the server's latest answer to this throttle's requests was an overload
    /// rejection.
    fn answered_overloaded(&self) -> bool {
        self.last_overload.load(Ordering::Relaxed) > self.last_accept.load(Ordering::Relaxed)
    }

    /// The probability with which a first attempt at `now` would be rejected, in
    /// `[0, MAX_REJECTION_PROBABILITY]`.
    pub fn rejection_probability(&self, now: Instant) -> f64 {
        // The window rejects only with a refusal in it, the history only while the latest
        // answer was a rejection.
        if self.no_refusal_in_window(now) && !self.answered_overloaded() {
            return 0.0;
        }
        let window = self.window_at(now);
        self.probability(&window).0
    }

    /// Records that the window's newest slot (at `window.latest`) holds a refusal.
    fn note_refusal(&self, window: &Window) {
        self.last_refusal
            .fetch_max(window.latest.saturating_add(1), Ordering::Relaxed);
    }

    /// Whether every slot the window can still hold at `now` is free of refusals: a refusal at
    /// time `t` is in slot `⌊t / slot⌋`, which is cleared once the newest slot is `SLOTS`
    /// later, by `t + window + slot` at the latest. Conservative: `false` answers nothing.
    fn no_refusal_in_window(&self, now: Instant) -> bool {
        let last = self.last_refusal.load(Ordering::Relaxed);
        if last == 0 {
            return true;
        }
        let span = self.slot_nanos.saturating_mul(SLOTS as u64 + 1);
        self.nanos_since_origin(now) >= (last - 1).saturating_add(span)
    }

    /// `now` as nanoseconds since the origin, saturated (times before it count as 0).
    fn nanos_since_origin(&self, now: Instant) -> u64 {
        let since_origin = now.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(since_origin).unwrap_or(u64::MAX)
    }

    /// The window's counts at `now`.
    pub fn counts(&self, now: Instant) -> ThrottleCounts {
        self.window_at(now).counts()
    }

    /// The rule applied to the window, or to the history for a sparse client (module
    /// documentation, "Sparse clients"), and which counts the decision goes to.
    fn probability(&self, window: &Window) -> (f64, Counts) {
        let counts = window.counts();
        if counts.requests >= u64::from(self.config.min_requests) {
            return (self.formula(counts), Counts::Window);
        }
        let history = Window::counts_of(&window.history);
        if !self.answered_overloaded() || history.requests < u64::from(self.config.min_requests) {
            return (0.0, Counts::Window);
        }
        (self.formula(history), Counts::History)
    }

    /// `max(0, (requests − K·accepts) / (requests + 1))`, capped.
    fn formula(&self, counts: ThrottleCounts) -> f64 {
        // In thousandths of a request, exactly: u64 × 10^4 fits in u128.
        let requests = u128::from(counts.requests) * u128::from(K_SCALE);
        let weighted_accepts = u128::from(counts.accepts) * u128::from(self.k_milli);
        let excess = requests.saturating_sub(weighted_accepts);
        if excess == 0 {
            return 0.0;
        }
        let denominator = (u128::from(counts.requests) + 1) * u128::from(K_SCALE);
        (excess as f64 / denominator as f64).min(MAX_REJECTION_PROBABILITY)
    }

    /// The window brought up to `now`: slots that time has moved past are cleared.
    fn window_at(&self, now: Instant) -> MutexGuard<'_, Window> {
        // No code panics while holding the lock, so a poisoned lock still guards consistent
        // counts; recovering it keeps one panicking caller elsewhere from disabling the driver.
        let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let t = self.nanos_since_origin(now).max(window.latest);
        window.latest = t;
        window.slots.advance_to(t / self.slot_nanos);
        // A history bucket is one whole window: SLOTS slots.
        let bucket = window.slots.newest() / SLOTS as u64;
        window.history.advance_to(bucket);
        window
    }
}

impl Window {
    /// Counts a request in the history and, unless the history decided it, in the window.
    fn count_request(&mut self, from: Counts) {
        if from == Counts::Window {
            self.slots.add_event();
        }
        self.history.add_event();
    }

    /// Counts a request not accepted, likewise.
    fn count_refusal(&mut self, from: Counts) {
        if from == Counts::Window {
            self.slots.add_refused();
        }
        self.history.add_refused();
    }

    fn counts(&self) -> ThrottleCounts {
        Self::counts_of(&self.slots)
    }

    fn counts_of<const N: usize>(tally: &Tally<N>) -> ThrottleCounts {
        let (requests, refused) = tally.sums();
        // A rejection recorded in a later slot than its request can outlive it by a slot, so
        // the refusals can exceed the requests at the edge; never below zero accepts.
        let accepts = requests.saturating_sub(refused);
        ThrottleCounts { requests, accepts }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn throttle(k: f64, window_secs: u64, min_requests: u32) -> (AdaptiveThrottle, Instant) {
        let start = Instant::now();
        let config = ThrottleConfig {
            k,
            window: Duration::from_secs(window_secs),
            min_requests,
        };
        (AdaptiveThrottle::starting_at(config, start).unwrap(), start)
    }

    fn at(start: Instant, millis: u64) -> Instant {
        start + Duration::from_millis(millis)
    }

    /// A deterministic uniform source for simulations (xorshift64*), so runs are repeatable.
    struct Draws(u64);

    impl Jitter for Draws {
        fn sample(&mut self) -> f64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            let bits = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
            bits as f64 / (1u64 << 53) as f64
        }
    }

    /// `requests` first attempts at `now`, the first `overloaded` of which the server rejects.
    fn traffic(t: &AdaptiveThrottle, now: Instant, requests: u64, overloaded: u64) {
        for i in 0..requests {
            // A draw of 1.0 is clamped to just past every probability: always sent.
            assert_eq!(t.admit(now, &mut || 1.0), ThrottleDecision::Send);
            if i < overloaded {
                t.record_overload(now);
            }
        }
    }

    #[test]
    fn defaults_are_the_documented_values() {
        let config = ThrottleConfig::default();
        assert_eq!(config.k, 2.0);
        assert_eq!(config.window, Duration::from_secs(10));
        assert_eq!(config.min_requests, 20);
        assert!(config.validate().is_ok());
    }

    #[test]
    fn invalid_options_are_named_in_the_error() {
        let cases = [
            (
                ThrottleConfig {
                    k: 0.999,
                    ..Default::default()
                },
                OPTION_K,
                "invalid adaptiveThrottleK: 0.999 is not a number from 1 to 10 (requests per \
                 accepted request)",
            ),
            (
                ThrottleConfig {
                    k: 10.5,
                    ..Default::default()
                },
                OPTION_K,
                "invalid adaptiveThrottleK: 10.5 is not a number from 1 to 10 (requests per \
                 accepted request)",
            ),
            (
                ThrottleConfig {
                    window: Duration::from_millis(999),
                    ..Default::default()
                },
                OPTION_WINDOW_MS,
                "invalid adaptiveThrottleWindowMS: 999 is not from 1000 to 60000 milliseconds",
            ),
            (
                ThrottleConfig {
                    window: Duration::from_millis(60_001),
                    ..Default::default()
                },
                OPTION_WINDOW_MS,
                "invalid adaptiveThrottleWindowMS: 60001 is not from 1000 to 60000 milliseconds",
            ),
            (
                ThrottleConfig {
                    min_requests: 1_000_001,
                    ..Default::default()
                },
                OPTION_MIN_REQUESTS,
                "invalid adaptiveThrottleMinRequests: 1000001 is not from 0 to 1000000 requests",
            ),
        ];
        for (config, option, message) in cases {
            let err = AdaptiveThrottle::new(config).unwrap_err();
            assert_eq!(err.option(), option);
            assert_eq!(err.to_string(), message);
        }
        let nan = ThrottleConfig {
            k: f64::NAN,
            ..Default::default()
        };
        assert_eq!(nan.validate().unwrap_err().option(), OPTION_K);
    }

    #[test]
    fn range_bounds_are_accepted() {
        for (k, window, min) in [(1.0, 1_000, 0), (10.0, 60_000, 1_000_000)] {
            let config = ThrottleConfig {
                k,
                window: Duration::from_millis(window),
                min_requests: min,
            };
            assert!(AdaptiveThrottle::new(config).is_ok(), "{config:?}");
        }
    }

    #[test]
    fn nothing_is_rejected_below_the_minimum_of_requests() {
        let (t, start) = throttle(2.0, 10, 20);
        traffic(&t, start, 19, 19);
        assert_eq!(
            t.rejection_probability(start),
            0.0,
            "19 requests, all rejected by the server, are too few"
        );
        traffic(&t, start, 1, 1);
        // 20 requests, none accepted: 20/21, capped.
        assert_eq!(t.rejection_probability(start), MAX_REJECTION_PROBABILITY);
    }

    #[test]
    fn at_k_2_nothing_is_rejected_while_half_the_requests_are_accepted() {
        let (t, start) = throttle(2.0, 10, 0);
        traffic(&t, start, 100, 50);
        assert_eq!(
            t.counts(start),
            ThrottleCounts {
                requests: 100,
                accepts: 50
            }
        );
        assert_eq!(t.rejection_probability(start), 0.0);
        traffic(&t, start, 1, 1);
        // 101 requests, 50 accepted: (101 − 100) / 102.
        let p = t.rejection_probability(start);
        assert!((p - 1.0 / 102.0).abs() < 1e-12, "{p}");
    }

    #[test]
    fn the_formula_with_a_fractional_k() {
        let (t, start) = throttle(1.1, 10, 0);
        traffic(&t, start, 1000, 100);
        // (1000 − 1.1 × 900) / 1001 = 10 / 1001.
        let p = t.rejection_probability(start);
        assert!((p - 10.0 / 1001.0).abs() < 1e-12, "{p}");
    }

    #[test]
    fn the_draw_decides_against_the_probability() {
        let (t, start) = throttle(2.0, 10, 0);
        traffic(&t, start, 100, 100);
        let p = t.rejection_probability(start);
        assert_eq!(p, MAX_REJECTION_PROBABILITY);
        assert_eq!(t.admit(start, &mut || 0.0), ThrottleDecision::Reject);
        assert_eq!(t.admit(start, &mut || 0.899), ThrottleDecision::Reject);
        assert_eq!(t.admit(start, &mut || 0.9), ThrottleDecision::Send);
        assert_eq!(t.admit(start, &mut || f64::NAN), ThrottleDecision::Send);
        assert_eq!(t.admit(start, &mut || -3.0), ThrottleDecision::Reject);
        assert_eq!(t.admit(start, &mut || 7.0), ThrottleDecision::Send);
    }

    #[test]
    fn a_local_rejection_counts_as_a_request_not_accepted() {
        let (t, start) = throttle(2.0, 10, 0);
        traffic(&t, start, 10, 10);
        assert_eq!(t.admit(start, &mut || 0.0), ThrottleDecision::Reject);
        assert_eq!(
            t.counts(start),
            ThrottleCounts {
                requests: 11,
                accepts: 0
            }
        );
    }

    #[test]
    fn the_window_expiry_restores_admission() {
        let (t, start) = throttle(2.0, 10, 0);
        traffic(&t, start, 100, 100);
        assert!(t.rejection_probability(at(start, 8_999)) > 0.0);
        // The slot of time 0 expires at 10 s.
        assert_eq!(t.rejection_probability(at(start, 10_000)), 0.0);
        assert_eq!(t.counts(at(start, 10_000)), ThrottleCounts::default());
        assert_eq!(
            t.admit(at(start, 10_000), &mut || 0.0),
            ThrottleDecision::Send
        );
    }

    #[test]
    fn a_short_spike_on_a_busy_client_does_not_engage() {
        // 100 requests per second for 9 s, all accepted, then one second all rejected.
        let (t, start) = throttle(2.0, 10, 20);
        for second in 0..9 {
            traffic(&t, at(start, second * 1000), 100, 0);
        }
        traffic(&t, at(start, 9_000), 100, 100);
        assert_eq!(t.rejection_probability(at(start, 9_999)), 0.0);
    }

    #[test]
    fn time_going_backwards_counts_as_the_latest_time() {
        let (t, start) = throttle(2.0, 10, 0);
        traffic(&t, at(start, 20_000), 10, 10);
        // An earlier time must not clear the new counts nor resurrect old ones.
        assert_eq!(t.counts(at(start, 5_000)).requests, 10);
        assert_eq!(t.counts(start - Duration::from_secs(60)).requests, 10);
    }

    #[test]
    fn shared_across_threads_every_request_is_counted() {
        let (t, start) = throttle(2.0, 10, 0);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                let t = &t;
                scope.spawn(move || {
                    for _ in 0..1000 {
                        t.admit(start, &mut || 1.0);
                        t.record_overload(start);
                    }
                });
            }
        });
        assert_eq!(
            t.counts(start),
            ThrottleCounts {
                requests: 4000,
                accepts: 0
            }
        );
    }

    /// The server of the simulations: it accepts up to `capacity` requests per second and
    /// rejects the rest for overload.
    struct RateLimitedServer {
        capacity: u64,
        second: u64,
        accepted_this_second: u64,
    }

    impl RateLimitedServer {
        /// Whether it accepts a request arriving at `millis`.
        fn accepts(&mut self, millis: u64) -> bool {
            if millis / 1000 != self.second {
                self.second = millis / 1000;
                self.accepted_this_second = 0;
            }
            if self.accepted_this_second < self.capacity {
                self.accepted_this_second += 1;
                true
            } else {
                false
            }
        }
    }

    /// Runs `demand(second)` requests per second, evenly spaced, for `secs` seconds against a
    /// server accepting `capacity(second)` per second; returns, per second, (requests sent,
    /// rejected by the server, rejected locally).
    fn simulate(
        secs: u64,
        demand: impl Fn(u64) -> u64,
        capacity: impl Fn(u64) -> u64,
    ) -> Vec<(u64, u64, u64)> {
        let (t, start) = throttle(DEFAULT_K, 10, DEFAULT_MIN_REQUESTS);
        let mut server = RateLimitedServer {
            capacity: capacity(0),
            second: 0,
            accepted_this_second: 0,
        };
        let mut draws = Draws(0x9e37_79b9_7f4a_7c15);
        let mut per_second = Vec::new();
        for second in 0..secs {
            server.capacity = capacity(second);
            let rate = demand(second);
            let (mut sent, mut server_rejected, mut local) = (0, 0, 0);
            for i in 0..rate {
                let millis = second * 1000 + i * 1000 / rate;
                let now = at(start, millis);
                if t.admit(now, &mut draws) == ThrottleDecision::Reject {
                    local += 1;
                    continue;
                }
                sent += 1;
                if server.accepts(millis) {
                    t.record_accept(now);
                } else {
                    server_rejected += 1;
                    t.record_overload(now);
                }
            }
            per_second.push((sent, server_rejected, local));
        }
        per_second
    }

    /// A flood at four times capacity for a minute: without the throttle the server would
    /// reject 300 requests per second; with it the server receives about `K ×` what it
    /// accepts (K = 2), so it rejects about a third as many.
    #[test]
    fn a_flood_is_cut_to_k_times_what_the_server_accepts() {
        let runs = simulate(60, |_| 400, |_| 100);
        // Past the first window, the throttle has settled.
        let settled = &runs[20..];
        let sent: u64 = settled.iter().map(|r| r.0).sum();
        let rejected: u64 = settled.iter().map(|r| r.1).sum();
        let secs = settled.len() as f64;
        let (sent_rate, rejected_rate) = (sent as f64 / secs, rejected as f64 / secs);
        assert!(
            (180.0..=230.0).contains(&sent_rate),
            "about 2 × 100 sent per second: {sent_rate}"
        );
        assert!(
            rejected_rate <= 300.0 / 3.0 + 20.0,
            "a third of the 300 rejections per second: {rejected_rate}"
        );
        let accepted = sent - rejected;
        assert!(
            accepted as f64 / secs >= 99.0,
            "the server stays fully used: {}",
            accepted as f64 / secs
        );
    }

    /// A server rejecting up to 45 % of requests (transient or mild overload) is never
    /// throttled: at K = 2 the throttle needs over half rejected.
    #[test]
    fn mild_overload_is_never_throttled() {
        let runs = simulate(60, |_| 182, |_| 100);
        let local: u64 = runs.iter().map(|r| r.2).sum();
        assert_eq!(local, 0);
    }

    /// Thirty seconds at four times capacity, then demand drops to half of capacity. Local
    /// rejections continue while the flood's part of the window expires (local rejections
    /// count as requests not accepted, so each window the probability falls by `(K − 1) ×`
    /// what it lacks of 1: twice as fast at K = 2 as at 1.5). They must end within two
    /// windows (20 s) and fall below 10 % of the demand within one and a half.
    #[test]
    fn the_throttle_releases_after_the_overload_ends() {
        let runs = simulate(60, |s| if s < 30 { 400 } else { 50 }, |_| 100);
        let after: Vec<u64> = runs[30..].iter().map(|r| r.2).collect();
        let last_rejecting_second = after.iter().rposition(|&local| local > 0);
        assert!(
            last_rejecting_second.is_none_or(|s| s < 20),
            "local rejections per second after the flood: {after:?}"
        );
        assert!(
            after[15..].iter().all(|&local| local <= 5),
            "after one and a half windows, under 10 % of 50: {after:?}"
        );
    }

    /// A client sending one request every 2 s (five a window, under the minimum of 20) to a
    /// server that rejects them all: from its history once it holds 20 requests.
    #[test]
    fn a_sparse_client_throttles_from_its_history() {
        let (t, start) = throttle(DEFAULT_K, 10, DEFAULT_MIN_REQUESTS);
        for i in 0..19 {
            traffic(&t, at(start, i * 2_000), 1, 1);
        }
        assert_eq!(
            t.rejection_probability(at(start, 38_000)),
            0.0,
            "19 requests"
        );
        traffic(&t, at(start, 38_000), 1, 1);
        assert_eq!(
            t.rejection_probability(at(start, 39_000)),
            MAX_REJECTION_PROBABILITY
        );
        // The history's decisions stay out of the window: it still holds its five requests.
        assert_eq!(
            t.admit(at(start, 39_000), &mut || 0.0),
            ThrottleDecision::Reject
        );
        assert_eq!(t.counts(at(start, 39_000)).requests, 5);
        // One answer that is not an overload rejection ends the history's say.
        t.record_accept(at(start, 39_500));
        assert_eq!(t.rejection_probability(at(start, 40_000)), 0.0);
    }

    /// The same sparse client with a third of its requests rejected is never throttled.
    #[test]
    fn a_sparse_client_is_not_throttled_for_scattered_rejections() {
        let (t, start) = throttle(DEFAULT_K, 10, DEFAULT_MIN_REQUESTS);
        let mut local = 0;
        for i in 0..60u64 {
            let now = at(start, i * 2_000);
            if t.admit(now, &mut || 0.0) == ThrottleDecision::Reject {
                local += 1;
            } else if i % 3 == 0 {
                t.record_overload(now);
            } else {
                t.record_accept(now);
            }
        }
        assert_eq!(local, 0);
    }

    /// A busy client floods the server, goes idle while the overload ends, and comes back
    /// within the history's two minutes: its history still says "overloaded", and the last
    /// answer it had was a rejection, so it starts throttled; the first request the server
    /// accepts ends that, and the history's rejections never enter the new window.
    #[test]
    fn a_client_back_from_idleness_releases_at_its_first_accepted_request() {
        let runs = simulate(
            80,
            |s| match s {
                0..30 => 400,
                30..60 => 0,
                _ => 50,
            },
            |s| if s < 30 { 100 } else { 1000 },
        );
        let back: Vec<u64> = runs[60..].iter().map(|r| r.2).collect();
        assert!(back[0] <= 30, "local rejections after the return: {back:?}");
        assert!(
            back[1..].iter().all(|&local| local == 0),
            "local rejections after the return: {back:?}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// For any counts, the probability is in [0, 0.9] (so below 1), zero below the minimum
        /// of requests and whenever `K·accepts ≥ requests`, and the formula otherwise.
        #[test]
        fn the_probability_follows_the_rule(
            k_milli in 1_000u64..=10_000,
            min_requests in 0u32..50,
            requests in 0u64..5_000,
            refused in 0u64..5_000,
        ) {
            let k = k_milli as f64 / 1000.0;
            let (t, start) = throttle(k, 10, min_requests);
            let refused = refused.min(requests);
            traffic(&t, start, requests, refused);
            let p = t.rejection_probability(start);
            let accepts = requests - refused;
            prop_assert!((0.0..=MAX_REJECTION_PROBABILITY).contains(&p), "{p}");
            prop_assert!(p < 1.0);
            if requests < u64::from(min_requests) || k_milli * accepts >= 1000 * requests {
                prop_assert_eq!(p, 0.0);
            } else {
                let exact = (requests as f64 - k * accepts as f64) / (requests as f64 + 1.0);
                prop_assert!((p - exact.min(0.9)).abs() < 1e-9, "{} vs {}", p, exact);
            }
        }

        /// Any sequence of admissions, overload reports and times (backwards included): the
        /// probability stays in range, accepts never exceed requests, and once a whole window
        /// passes with no traffic, every request is admitted again.
        #[test]
        fn any_sequence_keeps_the_invariants(
            events in proptest::collection::vec(
                (prop_oneof![6 => 0i64..200, 1 => 0i64..20_000, 1 => -5_000i64..0],
                 0u8..3, 0.0f64..1.0),
                1..400,
            ),
        ) {
            let (t, start) = throttle(DEFAULT_K, 10, DEFAULT_MIN_REQUESTS);
            let (mut clock, mut latest) = (0i64, 0i64);
            for (step, event, draw) in events {
                clock += step;
                latest = latest.max(clock);
                let now = if clock >= 0 {
                    at(start, clock as u64)
                } else {
                    start - Duration::from_millis(clock.unsigned_abs())
                };
                match event {
                    0 => t.record_overload(now),
                    1 => t.record_accept(now),
                    _ => {
                        let p = t.rejection_probability(now);
                        let decision = t.admit(now, &mut || draw);
                        prop_assert_eq!(decision == ThrottleDecision::Reject, draw < p);
                    }
                }
                let p = t.rejection_probability(now);
                let counts = t.counts(now);
                prop_assert!(counts.accepts <= counts.requests);
                prop_assert!((0.0..1.0).contains(&p), "{p}");
                // The lock-free answer is the one taken under the lock.
                prop_assert_eq!(p, t.probability(&t.window_at(now)).0);
            }
            // The history ends twelve windows (and part of a thirteenth) after the latest time
            // the throttle saw.
            let later = at(start, latest as u64 + 130_000);
            prop_assert_eq!(t.rejection_probability(later), 0.0);
            prop_assert_eq!(t.admit(later, &mut || 0.0), ThrottleDecision::Send);
        }

        /// Instants far before the origin and far in the future never panic.
        #[test]
        fn never_panics_on_any_time_sequence(
            offsets in proptest::collection::vec((any::<bool>(), any::<u32>(), any::<bool>()), 1..200),
        ) {
            let (t, start) = throttle(DEFAULT_K, 10, 0);
            for (before, secs, overload) in offsets {
                let offset = Duration::from_secs(u64::from(secs));
                let now = if before {
                    start.checked_sub(offset).unwrap_or(start)
                } else {
                    start.checked_add(offset).unwrap_or(start)
                };
                if overload {
                    t.record_overload(now);
                } else {
                    t.admit(now, &mut || 0.5);
                }
                prop_assert!(t.rejection_probability(now) < 1.0);
            }
        }
    }
}
