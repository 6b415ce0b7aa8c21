//! The ingress token bucket with an optional bounded queue of borrowers.

use tokio::time::{Duration, Instant};

/// What the bucket says to one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Take {
    /// A token was available.
    Now,
    /// A token was borrowed; it becomes valid at this instant. The caller holds a queue slot
    /// and must call [`Bucket::leave_queue`] when it stops waiting.
    At(Instant),
    /// No token and no room in the queue.
    Reject,
}

/// Token bucket: `rate` tokens a second, at most `cap` tokens, starts full. Tokens may go
/// negative while requests wait in the queue (each waiter borrowed one).
#[derive(Debug)]
pub(crate) struct Bucket {
    tokens: f64,
    last: Instant,
    queued: u64,
}

impl Bucket {
    pub(crate) fn new(cap: f64, now: Instant) -> Bucket {
        Bucket {
            tokens: cap,
            last: now,
            queued: 0,
        }
    }

    fn refill(&mut self, now: Instant, rate: f64, cap: f64) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now.max(self.last);
        self.tokens = (self.tokens + dt * rate).min(cap);
    }

    /// Tries to take a token at `now`.
    pub(crate) fn take(&mut self, now: Instant, rate: f64, cap: f64, max_queue: u64) -> Take {
        self.refill(now, rate, cap);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Take::Now;
        }
        if self.queued >= max_queue {
            return Take::Reject;
        }
        // Borrow: the token is ours once the balance has climbed back to zero.
        self.tokens -= 1.0;
        self.queued += 1;
        let wait = (-self.tokens / rate).clamp(0.0, 1.0e7);
        Take::At(now + Duration::from_secs_f64(wait))
    }

    /// A queued request stops waiting; `refund` gives its borrowed token back (it gave up before
    /// the token became valid).
    pub(crate) fn leave_queue(&mut self, refund: bool, now: Instant, rate: f64, cap: f64) {
        self.queued = self.queued.saturating_sub(1);
        if refund {
            self.refill(now, rate, cap);
            self.tokens = (self.tokens + 1.0).min(cap);
        }
    }

    /// Fills the bucket (a limiter switched on starts full); waiters stay queued.
    pub(crate) fn fill(&mut self, cap: f64, now: Instant) {
        self.tokens = cap;
        self.last = now;
    }

    /// Requests waiting for a token.
    pub(crate) fn queued(&self) -> u64 {
        self.queued
    }

    /// Tokens at `now` (negative while borrowers wait).
    pub(crate) fn tokens_at(&self, now: Instant, rate: f64, cap: f64) -> f64 {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        (self.tokens + dt * rate).min(cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_full_then_refills_at_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(10.0, t0);
        for _ in 0..10 {
            assert_eq!(b.take(t0, 100.0, 10.0, 0), Take::Now);
        }
        assert_eq!(b.take(t0, 100.0, 10.0, 0), Take::Reject);
        let t1 = t0 + Duration::from_millis(10);
        assert_eq!(b.take(t1, 100.0, 10.0, 0), Take::Now);
        assert_eq!(b.take(t1, 100.0, 10.0, 0), Take::Reject);
    }

    #[test]
    fn queue_borrows_in_order_and_is_bounded() {
        let t0 = Instant::now();
        let mut b = Bucket::new(1.0, t0);
        assert_eq!(b.take(t0, 100.0, 1.0, 2), Take::Now);
        assert_eq!(
            b.take(t0, 100.0, 1.0, 2),
            Take::At(t0 + Duration::from_millis(10))
        );
        assert_eq!(
            b.take(t0, 100.0, 1.0, 2),
            Take::At(t0 + Duration::from_millis(20))
        );
        assert_eq!(b.take(t0, 100.0, 1.0, 2), Take::Reject);
        assert_eq!(b.queued(), 2);
        b.leave_queue(false, t0, 100.0, 1.0);
        b.leave_queue(true, t0, 100.0, 1.0);
        assert_eq!(b.queued(), 0);
        assert!((b.tokens_at(t0, 100.0, 1.0) + 1.0).abs() < 1e-9);
    }
}
