//! [`Acceptance`]: how much of what a client sent recently its servers accepted, which decides
//! whether the budget refunds the retries of an operation that succeeded, and whether it admits
//! a retry at all: below one half accepted, the servers are shedding load and the budget admits
//! none (`RetryBudgetHandle`, `Shared::shedding`).
//!
//! A refund says "this retry cost the server nothing it could not give". That holds when the
//! server rejects a share of requests while it has capacity to spare (random or transient
//! rejections), and fails under overload, where every retry that succeeds takes the place of
//! another request and every one that fails costs the server a rejection. Error labels cannot
//! tell the two apart; what the client sends and what comes back can, at least in the regime
//! that matters: a server shedding sustained overload with its rate limiter rejects more than
//! half of what reaches it once the load passes twice its capacity, and the Google SRE book's
//! client-side throttling draws the line there too (`K = 2`: a client starts throttling itself
//! when its requests exceed twice what the server accepts). So refunds are given while the
//! servers accepted at least half of the client's recent attempts, and withheld below that,
//! where the budget charges every retry as before and bounds attempts per request to about
//! `1 + share`.
//!
//! A sparse client, one of a fleet that sends fewer than `MIN_ATTEMPTS` (20) attempts a window,
//! is judged on its history instead: the same counts per whole window over the last twelve
//! windows (two minutes by default). With the window alone, a client that had sent one attempt
//! in it, rejected at random, read as a shedding server and had the retry of that very request
//! refused: in the simulator's `transient` (30 % of attempts rejected at random, half of
//! capacity) 1,000 clients kept 89 % of requests against upstream's 97 %, and 10,000 clients
//! 75 %.
//!
//! Between the two the rule converges rather than switches: while refunds raise the retries,
//! the share accepted falls towards one half, where refunds stop. A client at 150 % of
//! capacity can therefore send up to about twice the capacity in attempts, half of them
//! rejected; `docs/retry-budget.md` ("Why refunds") states what that costs.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::tally::{Tally, HISTORY_WINDOWS};

/// Slots of the window; each holds the counts of `window / SLOTS`.
const SLOTS: usize = 10;
/// Below this many attempts in the window, the history (the throttle's, twelve windows)
/// decides: the adaptive throttle's default minimum of requests
/// (`adaptiveThrottleMinRequests`), for the same reason.
pub const MIN_ATTEMPTS: u64 = crate::admission::throttle::DEFAULT_MIN_REQUESTS as u64;

/// The least share of recent attempts the servers must have accepted for refunds to be given.
pub const REFUND_MIN_ACCEPTED_SHARE: f64 = 0.5;

/// Attempts sent and overload rejections received over a sliding window, per slot.
#[derive(Debug)]
pub struct Acceptance {
    slot_nanos: u64,
    counts: Mutex<Counts>,
}

#[derive(Debug)]
struct Counts {
    origin: Instant,
    /// Attempts sent and rejected for overload per slot; slot `n` is time / slot length.
    window: Tally<SLOTS>,
    /// The same counts per whole window.
    history: Tally<HISTORY_WINDOWS>,
}

impl Acceptance {
    /// Counts over the last `window` (rounded to tenths), from `origin`.
    pub fn new(window: Duration, origin: Instant) -> Self {
        let slot_nanos = u64::try_from(window.as_nanos() / SLOTS as u128)
            .unwrap_or(u64::MAX)
            .max(1);
        Self {
            slot_nanos,
            counts: Mutex::new(Counts {
                origin,
                window: Tally::new(),
                history: Tally::new(),
            }),
        }
    }

    /// One attempt sent at `now` (a first attempt or a retry).
    pub fn sent(&self, now: Instant) {
        let mut counts = self.counts_at(now);
        counts.window.add_event();
        counts.history.add_event();
    }

    /// One attempt rejected for overload, answered at `now`.
    pub fn rejected(&self, now: Instant) {
        let mut counts = self.counts_at(now);
        counts.window.add_refused();
        counts.history.add_refused();
    }

    /// Whether the servers accepted at least [`REFUND_MIN_ACCEPTED_SHARE`] of the attempts of
    /// the window before `now`, or of the history when the window holds fewer than
    /// `MIN_ATTEMPTS` (20) (true when nothing was sent or rejected).
    pub fn mostly_accepted(&self, now: Instant) -> bool {
        let counts = self.counts_at(now);
        let (sent, rejected) = match counts.window.sums() {
            (sent, _) if sent < MIN_ATTEMPTS => counts.history.sums(),
            sums => sums,
        };
        // A rejection can be counted in a slot before its attempt's (the attempt was sent just
        // before a slot boundary), so the rejections may exceed the attempts by a few.
        rejected <= sent.saturating_sub(rejected)
    }

    /// The counts brought up to `now` (expired slots cleared). A time earlier than one already
    /// seen counts in the newest slot.
    fn counts_at(&self, now: Instant) -> MutexGuard<'_, Counts> {
        // No code panics while holding the lock; a poisoned one still holds consistent counts.
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let since = now.saturating_duration_since(counts.origin).as_nanos();
        let slot = u64::try_from(since).unwrap_or(u64::MAX) / self.slot_nanos;
        counts.window.advance_to(slot);
        // A history bucket is one whole window: SLOTS slots.
        let bucket = counts.window.newest() / SLOTS as u64;
        counts.history.advance_to(bucket);
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: Instant, millis: u64) -> Instant {
        start + Duration::from_millis(millis)
    }

    /// Sends `n` attempts at `now`, of which `rejected` are rejected for overload.
    fn traffic(a: &Acceptance, now: Instant, n: u64, rejected: u64) {
        for i in 0..n {
            a.sent(now);
            if i < rejected {
                a.rejected(now);
            }
        }
    }

    #[test]
    fn half_accepted_is_the_line() {
        let start = Instant::now();
        let a = Acceptance::new(Duration::from_secs(10), start);
        assert!(a.mostly_accepted(start), "nothing sent yet");
        traffic(&a, start, 100, 30);
        assert!(a.mostly_accepted(start), "30 % rejected: transient errors");
        traffic(&a, start, 100, 70);
        assert!(a.mostly_accepted(start), "exactly half rejected in all");
        traffic(&a, start, 10, 10);
        assert!(
            !a.mostly_accepted(start),
            "more than half rejected: overload"
        );
    }

    #[test]
    fn a_busy_window_decides_alone() {
        let start = Instant::now();
        let a = Acceptance::new(Duration::from_secs(10), start);
        traffic(&a, start, 100, 90);
        assert!(!a.mostly_accepted(at(start, 9_999)));
        // A window later the old counts are history, and a window of 20 attempts outweighs it.
        traffic(&a, at(start, 10_000), MIN_ATTEMPTS, 0);
        assert!(a.mostly_accepted(at(start, 10_000)));
        // Earlier times count as the latest: nothing comes back.
        assert!(a.mostly_accepted(start));
    }

    #[test]
    fn a_sparse_window_reads_two_minutes_of_history() {
        let start = Instant::now();
        let a = Acceptance::new(Duration::from_secs(10), start);
        // One attempt every 8 s for two minutes, a third of them rejected at random: a single
        // window may hold one rejected attempt of one, the history holds 15, 5 rejected.
        for i in 0..15 {
            traffic(&a, at(start, i * 8_000), 1, u64::from(i % 3 == 0));
        }
        assert!(
            a.mostly_accepted(at(start, 112_000)),
            "a third rejected over the history is not shedding"
        );
        // The same client while the server sheds: most of its history rejected.
        let b = Acceptance::new(Duration::from_secs(10), start);
        for i in 0..15 {
            traffic(&b, at(start, i * 8_000), 1, u64::from(i % 3 != 0));
        }
        assert!(!b.mostly_accepted(at(start, 112_000)));
        // Forgotten once the history has passed: twelve windows after the last bucket.
        assert!(!b.mostly_accepted(at(start, 119_999 + 10_000)));
        assert!(b.mostly_accepted(at(start, 240_000)));
    }

    #[test]
    fn rejections_counted_before_their_attempts_do_not_underflow() {
        let start = Instant::now();
        let a = Acceptance::new(Duration::from_secs(1), start);
        a.rejected(start);
        assert!(!a.mostly_accepted(start));
        a.sent(start);
        assert!(!a.mostly_accepted(start));
        a.sent(start);
        assert!(a.mostly_accepted(start));
    }

    #[test]
    fn never_panics_on_extreme_windows_or_times() {
        let start = Instant::now();
        for window in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
            let a = Acceptance::new(window, start);
            a.sent(start + Duration::from_secs(1 << 40));
            a.rejected(start);
            let _ = a.mostly_accepted(start + Duration::from_secs(1 << 41));
        }
    }
}
