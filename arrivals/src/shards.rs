//! [`ShardKeys`]: which shards a scheduled request touches on a collection sharded on `_id` in
//! equal ranges of the schedule's keys, as the emulator's routers target it
//! (`docs/emulator.md`, "Targeting"). The lab counts its cold-shard goodput with it and the
//! simulator routes its requests with it, so both attribute every request alike.

use crate::mix::OpKind;

/// The keys `0..docs` split into `shards` equal ranges, range `i` on shard `i`, and the shard
/// the cold-shard figure leaves out. Small and `Copy`, so every request can carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardKeys {
    docs: i64,
    shards: usize,
    hot_index: usize,
}

impl ShardKeys {
    /// The layout of `0..docs` over `shards` shards (at least one), `hot_index` the hot one.
    pub fn new(docs: i64, shards: usize, hot_index: usize) -> Self {
        Self {
            docs,
            shards: shards.max(1),
            hot_index,
        }
    }

    /// Split point `i`: `docs × i / shards`, computed in 128 bits (no overflow for any `docs`),
    /// so shard `i` owns `[split i, split i+1)` (the first from MinKey, the last to MaxKey).
    pub fn split(&self, i: usize) -> i64 {
        let at = i128::from(self.docs) * i as i128 / self.shards as i128;
        i64::try_from(at).unwrap_or(i64::MAX)
    }

    /// The shard owning `key`: how many split points lie at or below it.
    pub fn shard_of(&self, key: i64) -> usize {
        // Bounded by the number of shards.
        (1..self.shards).filter(|&i| key >= self.split(i)).count()
    }

    /// The shards a request touches, lowest and highest (every shard between them too: shard
    /// `i` owns the `i`-th range). A point read or update: the key's shard. A range read of
    /// `{_id: {$gte: key, $lt: key + range_len}}`: from the key's shard to the shard of
    /// `key + range_len`, because the routers treat the exclusive bound as inclusive
    /// (conservative targeting), so a range ending exactly at a split point touches the next
    /// shard too. An insert: its `_id` is a driver-made ObjectId, which sorts after every
    /// number, so the last shard.
    pub fn touched(&self, kind: OpKind, key: i64, range_len: i64) -> (usize, usize) {
        match kind {
            OpKind::PointRead | OpKind::Update => {
                let s = self.shard_of(key);
                (s, s)
            }
            OpKind::RangeRead => (
                self.shard_of(key),
                self.shard_of(key.saturating_add(range_len.max(0))),
            ),
            OpKind::Insert => (self.shards - 1, self.shards - 1),
        }
    }

    /// Whether a request touches only cold shards (not the hot one): the requests the
    /// cold-shard figure counts.
    pub fn is_cold(&self, kind: OpKind, key: i64, range_len: i64) -> bool {
        let (low, high) = self.touched(kind, key, range_len);
        !(low..=high).contains(&self.hot_index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_shards_of_a_thousand_keys() {
        let k = ShardKeys::new(1000, 3, 1);
        assert_eq!((k.split(1), k.split(2)), (333, 666));
        assert_eq!(
            (k.shard_of(332), k.shard_of(333), k.shard_of(666)),
            (0, 1, 2)
        );
        // A range of 20 ending exactly at a split point touches the next shard too.
        assert_eq!(k.touched(OpKind::RangeRead, 312, 20), (0, 0));
        assert_eq!(k.touched(OpKind::RangeRead, 313, 20), (0, 1));
        assert_eq!(k.touched(OpKind::Insert, 0, 20), (2, 2));
        assert!(k.is_cold(OpKind::PointRead, 100, 20));
        assert!(!k.is_cold(OpKind::RangeRead, 313, 20));
        // No shards at all counts as one, which owns every key.
        assert_eq!(ShardKeys::new(1000, 0, 0).shard_of(999), 0);
    }
}
