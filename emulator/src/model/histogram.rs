//! A fixed-size log-linear histogram of waits in microseconds, for the queue-wait percentiles in
//! `serverStatus.labOverload`.
//!
//! The emulator keeps its own instead of linking a histogram crate so that its dependency graph
//! (which the spec runner inherits) stays small. Values below 2048 µs have one bucket each;
//! above that, every power of two is split into 1024 equal buckets, so a reported value is at
//! most 1/1024 (about 0.1 %) above the true one, which is what "3 significant digits" promises.
//! The bucket array has a fixed length, so memory does not grow with what is recorded.

/// Sub-buckets per power of two, as a bit count (1024).
const SUB_BITS: u32 = 10;
const SUB: u64 = 1 << SUB_BITS;
/// Values below this have a bucket each: the first power of two whose buckets would be wider
/// than one microsecond.
const EXACT_BELOW: u64 = 2 * SUB;
/// The largest value the histogram holds: larger values are recorded as this.
pub(crate) const MAX_US: u64 = u32::MAX as u64;
/// Buckets: the exact ones, then 1024 per power of two from 2^11 up to 2^31 inclusive.
const BUCKETS: usize = (EXACT_BELOW + (32 - SUB_BITS as u64 - 1) * SUB) as usize;

#[derive(Debug, Clone)]
pub(crate) struct LogHistogram {
    counts: Box<[u64]>,
    total: u64,
    max: u64,
}

impl Default for LogHistogram {
    fn default() -> Self {
        LogHistogram {
            counts: vec![0; BUCKETS].into_boxed_slice(),
            total: 0,
            max: 0,
        }
    }
}

/// The bucket that holds `v` (`v <= MAX_US`).
fn bucket_of(v: u64) -> usize {
    if v < EXACT_BELOW {
        return v as usize;
    }
    let exponent = 63 - v.leading_zeros(); // >= SUB_BITS + 1
    let shift = exponent - SUB_BITS;
    let sub = v >> shift; // in [SUB, 2 * SUB)
    (EXACT_BELOW + u64::from(exponent - SUB_BITS - 1) * SUB + (sub - SUB)) as usize
}

/// The largest value that lands in bucket `i`.
fn bucket_top(i: usize) -> u64 {
    let i = i as u64;
    if i < EXACT_BELOW {
        return i;
    }
    let k = i - EXACT_BELOW;
    let shift = k / SUB + 1;
    let sub = k % SUB + SUB;
    ((sub + 1) << shift) - 1
}

impl LogHistogram {
    /// Records one value; values above [`MAX_US`] count as `MAX_US`.
    pub(crate) fn record(&mut self, us: u64) {
        let v = us.min(MAX_US);
        let i = bucket_of(v);
        self.counts[i] = self.counts[i].saturating_add(1);
        self.total = self.total.saturating_add(1);
        self.max = self.max.max(v);
    }

    pub(crate) fn reset(&mut self) {
        self.counts.fill(0);
        self.total = 0;
        self.max = 0;
    }

    /// Values recorded.
    pub(crate) fn len(&self) -> u64 {
        self.total
    }

    /// The largest value recorded (exact), 0 when empty.
    pub(crate) fn max(&self) -> u64 {
        self.max
    }

    /// The smallest bucket top at or below which at least `q` (0..=1) of the values lie, capped
    /// at the exact maximum; 0 when empty.
    pub(crate) fn value_at_quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let wanted = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen = seen.saturating_add(c);
            if seen >= wanted {
                return bucket_top(i).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_tile_the_range_without_gaps() {
        // Every bucket starts right after the previous one ends, and each value maps to the
        // bucket whose range holds it.
        let mut next_start = 0u64;
        for i in 0..BUCKETS {
            assert_eq!(bucket_of(next_start), i, "start of bucket {i}");
            let top = bucket_top(i);
            assert!(top >= next_start, "bucket {i}");
            assert_eq!(bucket_of(top), i, "top of bucket {i}");
            next_start = top + 1;
        }
        assert_eq!(next_start, MAX_US + 1, "the last bucket ends at MAX_US");
    }

    #[test]
    fn bucket_width_stays_within_a_thousandth() {
        for v in [
            2047u64,
            2048,
            4095,
            51_000,
            1_000_000,
            3_600_000_000,
            MAX_US,
        ] {
            let top = bucket_top(bucket_of(v));
            assert!(top >= v);
            assert!((top - v) as f64 <= v as f64 / 1024.0, "{v} -> {top}");
        }
    }

    #[test]
    fn quantiles_follow_the_recorded_values() {
        let mut h = LogHistogram::default();
        assert_eq!(h.value_at_quantile(0.5), 0);
        for v in 1..=1000u64 {
            h.record(v);
        }
        assert_eq!(h.len(), 1000);
        assert_eq!(h.value_at_quantile(0.5), 500);
        assert_eq!(h.value_at_quantile(0.99), 990);
        assert_eq!(h.value_at_quantile(1.0), 1000);
        assert_eq!(h.value_at_quantile(0.0), 1);
        h.record(u64::MAX);
        assert_eq!(h.max(), MAX_US);
        assert_eq!(h.value_at_quantile(1.0), MAX_US);
        h.reset();
        assert_eq!((h.len(), h.max(), h.value_at_quantile(0.9)), (0, 0, 0));
    }
}
