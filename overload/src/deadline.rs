//! Client-side operation timeouts (`timeoutMS`): the deadline of one operation, the `maxTimeMS`
//! it sends, the minimum round-trip time that `maxTimeMS` leaves for the network, and the
//! typical service time that decides whether a retry can still finish in time.
//!
//! Conventions follow tokio's: a *budget* is a [`Duration`] (the option's value), a *deadline*
//! is an [`Instant`], and the current time is always passed in, so every decision here is
//! tested without a clock or a server.
//!
//! - [`Deadline::start`] turns the budget resolved for an operation into its deadline. A zero
//!   budget means "no limit" (the CSOT specification's `timeoutMS=0`), and so does a budget so
//!   large that `now + budget` overflows [`Instant`]: no realistic deadline is lost by that.
//! - [`Deadline::max_time`] is the `maxTimeMS` to send: the remaining time minus the minimum
//!   round-trip time, or [`Expired`] when the network alone would use up what remains, in which
//!   case the command is not sent at all.
//! - [`MinRtt`] is the minimum of the last [`MIN_RTT_SAMPLES`] round-trip samples, zero until
//!   two exist (the CSOT specification's rule).
//! - [`ServiceTime`] estimates a server's *recent typical service time*: the median duration of
//!   its last [`SERVICE_TIME_SAMPLES`] successful attempts that are younger than
//!   [`SERVICE_TIME_MAX_AGE`]. The median is used, not a mean, so that one slow outlier does not
//!   make every retry look hopeless, and old samples are dropped so that an estimate from a
//!   past overload does not outlive it. With no recent success, the median of the recent
//!   overload rejections stands in, as a lower bound: an accepted request travels the same way
//!   to the server's admission as a rejected one, then does its work. Without it, a client too
//!   quiet to see successes (one of a fleet, or one whose server rejects nearly everything)
//!   had an estimate of zero and the gate open exactly when the server was slowest: in the
//!   simulator's `flood` at 1,000 clients, `timeoutMS` alone made 0.081 retries per first
//!   attempt (0.001 at four clients), and the extra rejections' work took the server from 0.066
//!   of capacity to 0.012 (`docs/simulator.md`).
//!
//! Retry admission under a deadline lives on [`crate::retry::RetryState`]
//! ([`crate::retry::RetryState::admit`]), which both of the driver's retry paths already keep.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use overload::deadline::{Deadline, Expired};
//!
//! let start = Instant::now();
//! let deadline = Deadline::start(start, Duration::from_millis(500));
//! let later = start + Duration::from_millis(100);
//! assert_eq!(deadline.remaining(later), Some(Duration::from_millis(400)));
//! // 400 ms remain and the network takes at least 30 ms: the server gets 370 ms.
//! assert_eq!(deadline.max_time(later, Duration::from_millis(30)), Ok(Some(Duration::from_millis(370))));
//! assert_eq!(deadline.max_time(later, Duration::from_millis(400)), Err(Expired));
//! assert_eq!(Deadline::start(start, Duration::ZERO).remaining(later), None, "0 means no limit");
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

/// The minimum round-trip time is taken over this many of the latest samples.
pub const MIN_RTT_SAMPLES: usize = 10;

/// The typical service time is the median of at most this many of the latest successes.
pub const SERVICE_TIME_SAMPLES: usize = 16;

/// Successful attempts older than this no longer count towards the typical service time.
pub const SERVICE_TIME_MAX_AGE: Duration = Duration::from_secs(60);

/// The deadline of one operation: an instant, or no limit at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Deadline {
    /// `None` when the budget was zero (no limit) or too large to represent.
    at: Option<Instant>,
}

/// The deadline has passed, or what remains of it cannot cover the round trip.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Expired;

impl fmt::Display for Expired {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the operation's timeoutMS deadline expired")
    }
}

impl std::error::Error for Expired {}

impl Deadline {
    /// The deadline of an operation that starts at `now` with `budget` to spend. A zero budget,
    /// and one whose end `now` cannot represent, mean no limit.
    pub fn start(now: Instant, budget: Duration) -> Self {
        if budget.is_zero() {
            return Self::unlimited();
        }
        Self {
            at: now.checked_add(budget),
        }
    }

    /// A deadline that never passes (`timeoutMS=0`).
    pub fn unlimited() -> Self {
        Self { at: None }
    }

    /// A deadline at `at`.
    pub fn at(at: Instant) -> Self {
        Self { at: Some(at) }
    }

    /// The instant it passes, if it ever does.
    pub fn instant(&self) -> Option<Instant> {
        self.at
    }

    /// Whether it has no limit.
    pub fn is_unlimited(&self) -> bool {
        self.at.is_none()
    }

    /// The time left at `now`: zero once it has passed, `None` when there is no limit.
    pub fn remaining(&self, now: Instant) -> Option<Duration> {
        self.at.map(|at| at.saturating_duration_since(now))
    }

    /// Whether it has passed at `now`. The deadline instant itself counts as passed: nothing
    /// can be done in zero time.
    pub fn expired(&self, now: Instant) -> bool {
        self.at.is_some_and(|at| now >= at)
    }

    /// `limit`, shortened to what remains at `now`: how long a step with its own timeout
    /// (server selection, connection establishment) may take within the deadline. `None` as
    /// the limit, and as the result, means unbounded.
    pub fn bound(&self, now: Instant, limit: Option<Duration>) -> Option<Duration> {
        match (limit, self.remaining(now)) {
            (Some(limit), Some(remaining)) => Some(limit.min(remaining)),
            (limit, remaining) => limit.or(remaining),
        }
    }

    /// The `maxTimeMS` to send at `now` on a connection whose server's minimum round-trip time
    /// is `min_rtt`: the remaining time minus `min_rtt`, in whole milliseconds, or `None` when
    /// there is no limit. It is [`Expired`] when no whole millisecond would be left for the
    /// server, since `maxTimeMS: 0` would mean "no limit" to the server: the caller fails the
    /// operation without sending.
    pub fn max_time(&self, now: Instant, min_rtt: Duration) -> Result<Option<Duration>, Expired> {
        let Some(remaining) = self.remaining(now) else {
            return Ok(None);
        };
        let for_server = remaining.checked_sub(min_rtt).ok_or(Expired)?;
        let whole_millis = for_server.as_millis();
        if whole_millis == 0 {
            return Err(Expired);
        }
        // `as_millis` of a `Duration` fits in u64 milliseconds whenever the duration came from
        // an Instant difference; saturate anyway rather than wrap.
        let millis = u64::try_from(whole_millis).unwrap_or(u64::MAX);
        Ok(Some(Duration::from_millis(millis)))
    }

    /// The earlier of two deadlines (an unlimited one never wins).
    pub fn min(self, other: Self) -> Self {
        match (self.at, other.at) {
            (Some(a), Some(b)) => Self::at(a.min(b)),
            (a, b) => Self { at: a.or(b) },
        }
    }
}

/// The minimum round-trip time over the last [`MIN_RTT_SAMPLES`] samples, as the CSOT
/// specification asks the server monitor to keep it: zero until at least two samples exist, so
/// that a single slow first handshake does not eat into `maxTimeMS`. A fixed ring, so that it
/// is `Copy` like the monitor's other round-trip statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MinRtt {
    samples: [Duration; MIN_RTT_SAMPLES],
    /// How many of `samples` hold a sample (at most [`MIN_RTT_SAMPLES`]).
    len: usize,
    /// Where the next sample goes, overwriting the oldest once the ring is full.
    next: usize,
}

impl MinRtt {
    /// Records one round-trip sample, dropping the oldest beyond [`MIN_RTT_SAMPLES`].
    pub fn add_sample(&mut self, sample: Duration) {
        self.samples[self.next] = sample;
        self.next = (self.next + 1) % MIN_RTT_SAMPLES;
        self.len = (self.len + 1).min(MIN_RTT_SAMPLES);
    }

    /// The minimum of the kept samples, or zero with fewer than two.
    pub fn min(&self) -> Duration {
        if self.len < 2 {
            return Duration::ZERO;
        }
        // While the ring is filling, the kept samples are the first `len` slots.
        self.samples[..self.len]
            .iter()
            .copied()
            .min()
            .unwrap_or_default()
    }

    /// Forgets every sample (the monitor's reset after a failed check).
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

/// A server's recent typical service time: the median duration of its latest successful
/// attempts (at most [`SERVICE_TIME_SAMPLES`], none older than [`SERVICE_TIME_MAX_AGE`]), or,
/// while none is recent, of its latest overload rejections (a lower bound; see the module
/// documentation). Zero while nothing recent is known, so that an unknown server never has a
/// retry declined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceTime {
    /// Successful attempts, `(finished at, duration)`, oldest first.
    successes: VecDeque<(Instant, Duration)>,
    /// Attempts rejected for overload, the same way.
    rejections: VecDeque<(Instant, Duration)>,
    max_age: Duration,
}

impl Default for ServiceTime {
    fn default() -> Self {
        Self::new(SERVICE_TIME_MAX_AGE)
    }
}

impl ServiceTime {
    /// An empty estimate whose samples expire after `max_age`.
    pub fn new(max_age: Duration) -> Self {
        Self {
            successes: VecDeque::with_capacity(SERVICE_TIME_SAMPLES),
            rejections: VecDeque::with_capacity(SERVICE_TIME_SAMPLES),
            max_age,
        }
    }

    /// Records a successful attempt that took `duration` and finished at `now`.
    pub fn record_success(&mut self, now: Instant, duration: Duration) {
        keep_latest(&mut self.successes, now, duration);
    }

    /// Records an attempt rejected for overload that took `duration` and was answered at `now`.
    pub fn record_rejection(&mut self, now: Instant, duration: Duration) {
        keep_latest(&mut self.rejections, now, duration);
    }

    /// The median of the successes still recent at `now`, or when none is, of the rejections
    /// still recent (the upper median of an even count, erring towards declining a retry that
    /// would not fit); zero when neither is.
    pub fn typical(&self, now: Instant) -> Duration {
        recent_median(&self.successes, now, self.max_age)
            .or_else(|| recent_median(&self.rejections, now, self.max_age))
            .unwrap_or_default()
    }
}

/// Appends a sample, dropping the oldest beyond [`SERVICE_TIME_SAMPLES`].
fn keep_latest(samples: &mut VecDeque<(Instant, Duration)>, now: Instant, duration: Duration) {
    if samples.len() == SERVICE_TIME_SAMPLES {
        samples.pop_front();
    }
    samples.push_back((now, duration));
}

/// The upper median of the samples at most `max_age` old at `now` (`None`: there are none).
fn recent_median(
    samples: &VecDeque<(Instant, Duration)>,
    now: Instant,
    max_age: Duration,
) -> Option<Duration> {
    // On the stack: the driver asks under a lock, and an allocation there showed.
    let mut recent = [Duration::ZERO; SERVICE_TIME_SAMPLES];
    let mut len = 0;
    for (at, duration) in samples {
        if len < SERVICE_TIME_SAMPLES && now.saturating_duration_since(*at) <= max_age {
            recent[len] = *duration;
            len += 1;
        }
    }
    let recent = &mut recent[..len];
    recent.sort_unstable();
    recent.get(len / 2).copied()
}

/// Whether a retry may be made, as [`crate::retry::RetryState::admit`] decides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Retry after waiting this long (zero for a retry after an ordinary error).
    Retry(Duration),
    /// Do not retry; return the last error.
    Decline(Declined),
    /// The deadline has already passed: return a timeout error caused by the last error.
    Expired,
}

/// Why a retry was declined while the deadline had not yet passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Declined {
    /// The retry cap (`maxAdaptiveRetries`, or one ordinary retry without `timeoutMS`) is used up.
    Exhausted,
    /// Waiting the backoff would take the operation past its deadline (Client Backpressure
    /// specification: raise the current error at once, without sleeping).
    BackoffPastDeadline,
    /// The backoff fits but the backoff plus the server's typical service time does not: the
    /// retry would most likely time out after making the server do the work anyway.
    CannotFinish,
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn zero_and_overflowing_budgets_mean_no_limit() {
        let now = Instant::now();
        assert!(Deadline::start(now, Duration::ZERO).is_unlimited());
        assert!(Deadline::start(now, Duration::MAX).is_unlimited());
        let limited = Deadline::start(now, ms(1));
        assert_eq!(limited.instant(), Some(now + ms(1)));
        assert!(!limited.expired(now));
        assert!(
            limited.expired(now + ms(1)),
            "the deadline instant counts as passed"
        );
        assert_eq!(limited.remaining(now + ms(5)), Some(Duration::ZERO));
        assert!(!Deadline::unlimited().expired(now + ms(10_000)));
    }

    #[test]
    fn bound_takes_the_smaller_of_limit_and_remaining() {
        let now = Instant::now();
        let deadline = Deadline::start(now, ms(300));
        assert_eq!(deadline.bound(now, Some(ms(30_000))), Some(ms(300)));
        assert_eq!(deadline.bound(now + ms(200), Some(ms(50))), Some(ms(50)));
        assert_eq!(deadline.bound(now, None), Some(ms(300)));
        assert_eq!(Deadline::unlimited().bound(now, Some(ms(7))), Some(ms(7)));
        assert_eq!(Deadline::unlimited().bound(now, None), None);
    }

    #[test]
    fn max_time_is_remaining_minus_min_rtt() {
        let now = Instant::now();
        let deadline = Deadline::start(now, ms(1_000));
        assert_eq!(deadline.max_time(now, ms(10)), Ok(Some(ms(990))));
        assert_eq!(
            deadline.max_time(now + ms(999), Duration::ZERO),
            Ok(Some(ms(1)))
        );
        assert_eq!(
            deadline.max_time(now + ms(990), ms(10)),
            Err(Expired),
            "min RTT = remaining"
        );
        assert_eq!(
            deadline.max_time(now + ms(995), ms(10)),
            Err(Expired),
            "min RTT > remaining"
        );
        // Less than a whole millisecond for the server: maxTimeMS 0 would mean no limit.
        let sub_milli = now + ms(999) + Duration::from_micros(500);
        assert_eq!(deadline.max_time(sub_milli, Duration::ZERO), Err(Expired));
        assert_eq!(Deadline::unlimited().max_time(now, ms(5)), Ok(None));
    }

    #[test]
    fn min_prefers_the_earlier_limited_deadline() {
        let now = Instant::now();
        let early = Deadline::start(now, ms(10));
        let late = Deadline::start(now, ms(20));
        assert_eq!(early.min(late), early);
        assert_eq!(late.min(early), early);
        assert_eq!(Deadline::unlimited().min(late), late);
        assert!(Deadline::unlimited()
            .min(Deadline::unlimited())
            .is_unlimited());
    }

    #[test]
    fn min_rtt_needs_two_samples_and_keeps_ten() {
        let mut rtt = MinRtt::default();
        assert_eq!(rtt.min(), Duration::ZERO);
        rtt.add_sample(ms(5));
        assert_eq!(rtt.min(), Duration::ZERO, "one sample is not enough");
        rtt.add_sample(ms(8));
        assert_eq!(rtt.min(), ms(5));
        // Ten larger samples push the 5 ms one out of the window.
        for _ in 0..MIN_RTT_SAMPLES {
            rtt.add_sample(ms(20));
        }
        assert_eq!(rtt.min(), ms(20));
        rtt.reset();
        assert_eq!(rtt.min(), Duration::ZERO);
    }

    #[test]
    fn service_time_is_the_median_of_recent_successes() {
        let start = Instant::now();
        let mut service = ServiceTime::new(Duration::from_secs(10));
        assert_eq!(service.typical(start), Duration::ZERO, "nothing known yet");
        for (i, millis) in [10, 12, 500, 11, 13].into_iter().enumerate() {
            service.record_success(start + ms(i as u64), ms(millis));
        }
        assert_eq!(
            service.typical(start + ms(5)),
            ms(12),
            "one outlier does not move it"
        );
        service.record_success(start + ms(6), ms(14));
        // Six samples 10, 11, 12, 13, 14, 500: the upper median.
        assert_eq!(service.typical(start + ms(6)), ms(13));
        // Eleven seconds later every sample is stale.
        assert_eq!(
            service.typical(start + Duration::from_secs(11)),
            Duration::ZERO
        );
    }

    #[test]
    fn successes_and_rejections_each_keep_only_their_latest_samples() {
        let record: [fn(&mut ServiceTime, Instant, Duration); 2] =
            [ServiceTime::record_success, ServiceTime::record_rejection];
        for record in record {
            let now = Instant::now();
            let mut service = ServiceTime::default();
            for _ in 0..SERVICE_TIME_SAMPLES {
                record(&mut service, now, ms(900));
            }
            for _ in 0..SERVICE_TIME_SAMPLES {
                record(&mut service, now, ms(3));
            }
            assert_eq!(service.typical(now), ms(3));
        }
    }

    #[test]
    fn rejections_stand_in_only_while_no_success_is_recent() {
        let start = Instant::now();
        let mut service = ServiceTime::new(Duration::from_secs(10));
        // A quiet client of an overloaded server: rejections only, each after 300 to 700 ms.
        for (i, millis) in [300, 700, 400].into_iter().enumerate() {
            service.record_rejection(start + ms(i as u64), ms(millis));
        }
        assert_eq!(service.typical(start + ms(3)), ms(400), "their median");
        // One success, however fast, is the better evidence of what a success takes.
        service.record_success(start + ms(4), ms(20));
        assert_eq!(service.typical(start + ms(5)), ms(20));
        // Once the success is stale and newer rejections are not, they stand in again.
        service.record_rejection(start + Duration::from_secs(12), ms(900));
        assert_eq!(service.typical(start + Duration::from_secs(15)), ms(900));
        // And nothing recent at all is zero: the gate declines nothing.
        assert_eq!(
            service.typical(start + Duration::from_secs(30)),
            Duration::ZERO
        );
    }

    proptest! {
        #[test]
        fn remaining_never_exceeds_the_budget(budget in 1u64..10_000_000, elapsed in 0u64..20_000_000) {
            let start = Instant::now();
            let deadline = Deadline::start(start, ms(budget));
            let now = start + ms(elapsed);
            let remaining = deadline.remaining(now).unwrap();
            prop_assert!(remaining <= ms(budget));
            prop_assert_eq!(remaining.is_zero(), deadline.expired(now));
            prop_assert_eq!(remaining, ms(budget.saturating_sub(elapsed)));
        }

        #[test]
        fn max_time_leaves_the_round_trip_and_never_sends_zero(
            budget in 1u64..100_000,
            elapsed_us in 0u64..200_000_000,
            rtt_us in 0u64..50_000_000,
        ) {
            let start = Instant::now();
            let deadline = Deadline::start(start, ms(budget));
            let now = start + Duration::from_micros(elapsed_us);
            let rtt = Duration::from_micros(rtt_us);
            match deadline.max_time(now, rtt) {
                Ok(Some(max_time)) => {
                    prop_assert!(max_time >= ms(1));
                    prop_assert!(max_time + rtt <= deadline.remaining(now).unwrap());
                    prop_assert_eq!(max_time.subsec_nanos() % 1_000_000, 0);
                }
                Ok(None) => prop_assert!(false, "a limited deadline always has a maxTimeMS"),
                Err(Expired) => {
                    prop_assert!(deadline.remaining(now).unwrap() < rtt + ms(1));
                }
            }
        }

        #[test]
        fn bound_never_exceeds_either_side(
            budget in 0u64..100_000,
            elapsed in 0u64..200_000,
            limit in proptest::option::of(0u64..100_000),
        ) {
            let start = Instant::now();
            let deadline = Deadline::start(start, ms(budget));
            let now = start + ms(elapsed);
            let bound = deadline.bound(now, limit.map(ms));
            if let Some(limit) = limit {
                prop_assert!(bound.unwrap() <= ms(limit));
            }
            if let Some(remaining) = deadline.remaining(now) {
                prop_assert!(bound.unwrap() <= remaining);
            }
            prop_assert_eq!(bound.is_none(), limit.is_none() && deadline.is_unlimited());
        }

        #[test]
        fn min_rtt_is_the_minimum_of_the_last_ten(samples in proptest::collection::vec(0u64..1_000, 0..40)) {
            let mut rtt = MinRtt::default();
            for sample in &samples {
                rtt.add_sample(ms(*sample));
            }
            let window = &samples[samples.len().saturating_sub(MIN_RTT_SAMPLES)..];
            let expected = if window.len() < 2 { 0 } else { *window.iter().min().unwrap() };
            prop_assert_eq!(rtt.min(), ms(expected));
        }

        #[test]
        fn typical_service_time_is_a_recent_sample(samples in proptest::collection::vec(0u64..10_000, 1..50)) {
            let now = Instant::now();
            let mut service = ServiceTime::default();
            for sample in &samples {
                service.record_success(now, ms(*sample));
            }
            let window = &samples[samples.len().saturating_sub(SERVICE_TIME_SAMPLES)..];
            let typical = service.typical(now);
            prop_assert!(window.contains(&(typical.as_millis() as u64)));
            // At least half of the window is at or below it, and at least half at or above.
            let at_most = window.iter().filter(|s| ms(**s) <= typical).count();
            let at_least = window.iter().filter(|s| ms(**s) >= typical).count();
            prop_assert!(2 * at_most >= window.len() && 2 * at_least >= window.len());
        }
    }
}
