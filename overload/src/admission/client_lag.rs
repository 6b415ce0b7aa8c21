//! [`ClientLag`]: how late the client's own runtime runs a task that is ready, so that a
//! [`ConcurrencyLimit`](super::ConcurrencyLimit) can tell queueing at the server from queueing
//! in the client.
//!
//! # Why
//!
//! The limit reads the latency of operations as the server's queue: latency above the server's
//! no-load latency × tolerance lowers it. But a reply is timed when the client's task handles
//! it, and a client whose CPU is saturated (a closed loop of many tasks on few cores) handles
//! every reply late by its own run queue's length. Its latency then grows with its operations
//! in flight whatever the server does, and the limit, reading that as the server's queue, cuts
//! the operations in flight; the server was never the bottleneck, so nothing is gained and the
//! client loses the batching that many operations in flight give it (the lab's `pathbench`,
//! 32 tasks on 2 cores: the limit settled at 4 to 11 and throughput fell by 15 to 18 %).
//!
//! So the driver measures the client's lag directly, a few times a second: the time one task
//! takes to run again after yielding, which is how long a ready task waits for a worker (as a
//! task woken by a reply does). While that lag alone exceeds the queueing the limit tolerates
//! (`(tolerance − 1) × baseline`), a latency sample says more about the client than about the
//! server, and the limit ignores it: it neither grows nor shrinks on latency, and still falls on
//! overload errors, the server's own signal.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often the driver measures the lag. Often enough to follow a load that changes within a
/// second; rare enough to cost nothing (one yield each).
pub const CLIENT_LAG_PERIOD: Duration = Duration::from_millis(10);

/// Weight of a new measurement in the mean: 1/4, so the mean follows the last few measurements
/// (about 40 ms at [`CLIENT_LAG_PERIOD`]) without one late wake-up deciding alone.
const WEIGHT_SHIFT: u32 = 2;

/// The client's scheduling lag: an exponentially weighted mean of measurements. Shared between
/// the task that measures and every server's limit (through an `Arc`), lock-free.
#[derive(Debug, Default)]
pub struct ClientLag {
    /// The mean, in nanoseconds; 0 until the first measurement.
    mean_nanos: AtomicU64,
}

impl ClientLag {
    /// A lag with no measurement yet (zero).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one measurement: how long a task that yielded waited to run again.
    pub fn record(&self, measured: Duration) {
        let sample = u64::try_from(measured.as_nanos()).unwrap_or(u64::MAX);
        // `fetch_update` retries only when another measurement landed in between; the closure
        // always returns `Some`, so it cannot fail.
        let _ = self
            .mean_nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |mean| {
                Some(if mean == 0 {
                    sample
                } else {
                    mean - (mean >> WEIGHT_SHIFT) + (sample >> WEIGHT_SHIFT)
                })
            });
    }

    /// The current mean (zero before any measurement).
    pub fn current(&self) -> Duration {
        Duration::from_nanos(self.mean_nanos.load(Ordering::Relaxed))
    }

    /// Whether the lag alone exceeds `tolerated`, the queueing a limit accepts before it
    /// shrinks: its latency samples then measure the client.
    pub fn exceeds(&self, tolerated: Duration) -> bool {
        self.current() > tolerated
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_first_measurement_is_the_mean() {
        let lag = ClientLag::new();
        assert_eq!(lag.current(), Duration::ZERO);
        assert!(!lag.exceeds(Duration::ZERO));
        lag.record(4 * MS);
        assert_eq!(lag.current(), 4 * MS);
        assert!(lag.exceeds(3 * MS) && !lag.exceeds(4 * MS));
    }

    #[test]
    fn one_late_wake_up_moves_the_mean_by_a_quarter() {
        let lag = ClientLag::new();
        lag.record(Duration::from_micros(20));
        lag.record(Duration::from_micros(420));
        assert_eq!(lag.current(), Duration::from_micros(120));
        // And a run of them converges to their value.
        for _ in 0..40 {
            lag.record(Duration::from_micros(420));
        }
        let mean = lag.current().as_micros();
        assert!((415..=420).contains(&mean), "{mean} µs");
    }

    proptest! {
        /// The mean always lies between the smallest and the largest measurement.
        #[test]
        fn the_mean_stays_within_the_measurements(samples in prop::collection::vec(1u64..10_000_000, 1..50)) {
            let lag = ClientLag::new();
            for &s in &samples {
                lag.record(Duration::from_nanos(s));
            }
            let (lo, hi) = (samples.iter().min().unwrap(), samples.iter().max().unwrap());
            let mean = u64::try_from(lag.current().as_nanos()).unwrap();
            // The shifts round down by at most a few nanoseconds per measurement.
            prop_assert!(mean + 4 * samples.len() as u64 >= *lo && mean <= *hi, "{mean} not in [{lo}, {hi}]");
        }
    }
}
