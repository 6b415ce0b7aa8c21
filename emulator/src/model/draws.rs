//! Random draws tied to a request rather than to a shared stream (common random numbers).
//!
//! The lab runs several variants (driver configurations) against the same schedule and compares
//! them. If the model drew its random rejections and ticket wake-ups from one generator that
//! runs on from request to request, two variants would meet different luck as soon as their
//! requests interleaved differently, and part of the difference between them would be noise.
//! So a request the lab names (`comment.labReq`) draws from a hash of the model's seed, its id
//! and how many times the model has seen that id (its attempt number): every variant meets the
//! same rejection for the same request and attempt. Requests without an id fall back to a
//! seeded generator.

use std::collections::{HashMap, VecDeque};

/// Mixes `x` into a well-spread 64-bit value (SplitMix64's finaliser): consecutive inputs give
/// unrelated outputs.
pub(crate) fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A draw keyed by `parts`, in order (each part is mixed into the previous result).
pub(crate) fn keyed(parts: &[u64]) -> u64 {
    parts.iter().fold(0, |h, p| mix(h ^ p))
}

/// A 64-bit draw as a number in [0, 1).
pub(crate) fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Counts how many times each request id has arrived, forgetting the oldest ids beyond `cap`
/// so memory stays bounded. A forgotten id that arrives again starts over at attempt 0; with
/// the lab's rates and a cap of tens of thousands, an id is forgotten only long after its
/// application stopped retrying it.
#[derive(Debug)]
pub(crate) struct AttemptCounter {
    counts: HashMap<u64, u32>,
    /// Ids in order of first arrival, for forgetting the oldest.
    order: VecDeque<u64>,
    cap: usize,
}

impl AttemptCounter {
    pub(crate) fn new(cap: usize) -> AttemptCounter {
        AttemptCounter {
            counts: HashMap::new(),
            order: VecDeque::new(),
            cap: cap.max(1),
        }
    }

    /// Records an arrival of `id` and returns its attempt number (0 for the first arrival).
    pub(crate) fn arrive(&mut self, id: u64) -> u32 {
        if let Some(n) = self.counts.get_mut(&id) {
            *n = n.saturating_add(1);
            return *n;
        }
        // Bounded: each arrival adds at most one id, and this removes down to the cap.
        while self.order.len() >= self.cap {
            if let Some(old) = self.order.pop_front() {
                self.counts.remove(&old);
            }
        }
        self.counts.insert(id, 0);
        self.order.push_back(id);
        0
    }

    /// Forgets every id (a new variant starts).
    pub(crate) fn clear(&mut self) {
        self.counts.clear();
        self.order.clear();
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.counts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_count_per_id_and_memory_is_bounded() {
        let mut a = AttemptCounter::new(3);
        assert_eq!(a.arrive(7), 0);
        assert_eq!(a.arrive(7), 1);
        assert_eq!(a.arrive(8), 0);
        assert_eq!(a.arrive(7), 2);
        assert_eq!(a.arrive(9), 0);
        // A fourth id forgets the oldest (7).
        assert_eq!(a.arrive(10), 0);
        assert_eq!(a.len(), 3);
        assert_eq!(a.arrive(8), 1);
        assert_eq!(a.arrive(7), 0, "forgotten ids start over");
        for id in 0..1000 {
            a.arrive(id);
        }
        assert_eq!(a.len(), 3);
        a.clear();
        assert_eq!(a.arrive(8), 0);
    }

    #[test]
    fn keyed_draws_depend_on_every_part_and_spread_over_the_unit_interval() {
        assert_eq!(keyed(&[1, 2, 3]), keyed(&[1, 2, 3]));
        assert_ne!(keyed(&[1, 2, 3]), keyed(&[1, 2, 4]));
        assert_ne!(keyed(&[1, 2, 3]), keyed(&[1, 3, 2]));
        assert_ne!(keyed(&[1, 2, 3]), keyed(&[2, 2, 3]));
        // Consecutive ids: the share below 0.05 is near 5 % (binomial(20000, 0.05): mean
        // 1000, sd 31; five deviations either side).
        let below = (0..20_000u64)
            .filter(|id| unit(keyed(&[4, *id, 0])) < 0.05)
            .count();
        assert!((845..=1155).contains(&below), "{below}");
        assert!((0..1000u64).all(|i| (0.0..1.0).contains(&unit(mix(i)))));
        assert!(unit(u64::MAX) < 1.0);
    }
}
