//! Delays the host adds, counted by size: how the cores' hand-offs, the ticket wake-ups and
//! the slices' oversleep are spread, not only their means.
//!
//! The means (`requestHandoffMs` over `requestHandoffs` and the like) cannot tell a host that
//! is a little slow on every hand-off from one that stalls now and then for milliseconds while
//! it runs something else (the lab's load generator shares the machine). The two lose the
//! same core time but not the same requests: in a stall, arrivals pile up and overtake woken
//! ticket waiters, and queues grow that a steady delay never grows. So each delay is also
//! counted in one of a few buckets, fixed so that counts from any run can be added and
//! subtracted (per-second samples are differences of totals).

use std::time::Duration;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

/// Upper bounds of the buckets (µs), each inclusive; a last bucket holds the rest. Public for
/// readers of the counters (the simulator's copy is tested against it).
pub const BOUNDS_US: [u64; 10] = [
    100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000,
];

/// The buckets' names in `serverStatus.labOverload` (no dots: the lab flattens nested
/// documents into dotted keys).
pub const NAMES: [&str; BUCKETS] = [
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

const BUCKETS: usize = BOUNDS_US.len() + 1;

/// Delays counted by size. Monotonic in a snapshot's totals; [`DelayCounts::minus`] gives
/// the counts between two snapshots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DelayCounts {
    counts: [u64; BUCKETS],
}

impl DelayCounts {
    pub(crate) fn record(&mut self, delay: Duration) {
        let us = delay.as_micros();
        let i = BOUNDS_US
            .iter()
            .position(|&b| us <= u128::from(b))
            .unwrap_or(BUCKETS - 1);
        self.counts[i] = self.counts[i].saturating_add(1);
    }

    /// Delays counted in each bucket, shortest first (bounds [`BOUNDS_US`], then the rest).
    pub fn counts(&self) -> [u64; BUCKETS] {
        self.counts
    }

    /// Delays counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().fold(0, |a, &c| a.saturating_add(c))
    }

    /// Adds `other`'s counts (two pools' into one).
    pub(crate) fn add(&mut self, other: &DelayCounts) {
        for (c, o) in self.counts.iter_mut().zip(other.counts) {
            *c = c.saturating_add(o);
        }
    }

    /// The counts since `earlier`.
    pub(crate) fn minus(&self, earlier: &DelayCounts) -> DelayCounts {
        let mut out = *self;
        for (c, e) in out.counts.iter_mut().zip(earlier.counts) {
            *c = c.saturating_sub(e);
        }
        out
    }
}

/// Delays summed and counted by size: how many, how long in all, and how they are spread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TimedDelays {
    pub(crate) time: Duration,
    pub(crate) sizes: DelayCounts,
}

impl TimedDelays {
    pub(crate) fn record(&mut self, delay: Duration) {
        self.time = self.time.saturating_add(delay);
        self.sizes.record(delay);
    }

    /// Delays recorded.
    pub(crate) fn count(&self) -> u64 {
        self.sizes.total()
    }

    /// Their sum in milliseconds, as the counters report it.
    pub(crate) fn ms(&self) -> f64 {
        self.time.as_secs_f64() * 1000.0
    }

    /// Adds `other`'s delays (two pools' into one).
    pub(crate) fn add(&mut self, other: &TimedDelays) {
        self.time = self.time.saturating_add(other.time);
        self.sizes.add(&other.sizes);
    }
}

impl Serialize for DelayCounts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(BUCKETS))?;
        for (name, count) in NAMES.iter().zip(self.counts) {
            m.serialize_entry(name, &count)?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn each_delay_lands_in_the_first_bucket_whose_bound_holds_it() {
        let mut d = DelayCounts::default();
        for delay in [us(0), us(100), us(101), us(999), us(1_000), us(100_000)] {
            d.record(delay);
        }
        d.record(Duration::from_nanos(100_001));
        d.record(Duration::from_secs(3));
        let c = d.counts();
        // 100.001 µs counts as 100 µs: the bounds are whole microseconds.
        assert_eq!(c[0], 3);
        assert_eq!(c[1], 1);
        assert_eq!(c[3], 2);
        assert_eq!(c[9], 1);
        assert_eq!(c[10], 1);
        assert_eq!(d.total(), 8);
    }

    #[test]
    fn the_counts_between_two_snapshots_are_their_difference() {
        let mut a = DelayCounts::default();
        a.record(us(50));
        let mut b = a;
        b.record(us(50));
        b.record(us(7_000));
        let d = b.minus(&a);
        assert_eq!(d.counts()[0], 1);
        assert_eq!(d.counts()[6], 1);
        assert_eq!(d.total(), 2);
        // Never negative, even if the snapshots are swapped.
        assert_eq!(a.minus(&b).total(), 0);
    }

    #[test]
    fn timed_delays_sum_count_and_spread_what_they_record() {
        let mut a = TimedDelays::default();
        a.record(us(150));
        let mut b = TimedDelays::default();
        b.record(us(3_000));
        b.record(us(50));
        a.add(&b);
        assert_eq!(a.count(), 3);
        assert_eq!(a.time, us(3_200));
        assert!((a.ms() - 3.2).abs() < 1e-9);
        assert_eq!(
            (
                a.sizes.counts()[0],
                a.sizes.counts()[1],
                a.sizes.counts()[5]
            ),
            (1, 1, 1)
        );
    }

    #[test]
    fn it_serializes_as_a_document_of_named_buckets() {
        let mut d = DelayCounts::default();
        d.record(us(150));
        d.record(us(200_000));
        let doc = bson::to_document(&d).expect("serializes");
        assert_eq!(doc.len(), BUCKETS);
        assert_eq!(doc.get_i64("le200us").ok(), Some(1));
        assert_eq!(doc.get_i64("over100ms").ok(), Some(1));
        assert!(doc.keys().all(|k| !k.contains('.')));
    }
}
