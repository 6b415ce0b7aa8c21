//! The event queue (a binary heap in virtual time) and the slab that holds operations and server
//! jobs under generation-checked handles, so that an event about something that has ended is
//! recognised and dropped.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::clock::Nanos;

/// A handle on a slab entry: its index and the generation it was inserted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle {
    pub index: u32,
    pub generation: u32,
}

/// Entries reused through a free list; a handle whose generation no longer matches is stale.
#[derive(Debug)]
pub struct Slab<T> {
    slots: Vec<(u32, Option<T>)>,
    free: Vec<u32>,
    live: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }
}

impl<T> Slab<T> {
    /// Stores `value` and returns its handle.
    pub fn insert(&mut self, value: T) -> Handle {
        self.live += 1;
        if let Some(index) = self.free.pop() {
            let slot = &mut self.slots[index as usize];
            slot.0 = slot.0.wrapping_add(1);
            slot.1 = Some(value);
            return Handle {
                index,
                generation: slot.0,
            };
        }
        // More than 2^32 entries alive at once would need more memory than any run has.
        let index = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
        self.slots.push((0, Some(value)));
        Handle {
            index,
            generation: 0,
        }
    }

    /// The entry of `handle`, unless it was removed.
    pub fn get_mut(&mut self, handle: Handle) -> Option<&mut T> {
        match self.slots.get_mut(handle.index as usize) {
            Some((generation, Some(value))) if *generation == handle.generation => Some(value),
            _ => None,
        }
    }

    /// The entry of `handle`, unless it was removed.
    pub fn get(&self, handle: Handle) -> Option<&T> {
        match self.slots.get(handle.index as usize) {
            Some((generation, Some(value))) if *generation == handle.generation => Some(value),
            _ => None,
        }
    }

    /// Removes and returns the entry of `handle`.
    pub fn remove(&mut self, handle: Handle) -> Option<T> {
        match self.slots.get_mut(handle.index as usize) {
            Some((generation, value)) if *generation == handle.generation && value.is_some() => {
                self.free.push(handle.index);
                self.live -= 1;
                value.take()
            }
            _ => None,
        }
    }

    /// Entries alive.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no entry is alive.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }
}

struct Entry<E> {
    at: Nanos,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl<E> Eq for Entry<E> {}

impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Entry<E> {
    /// Reversed: the heap's greatest entry is the earliest, ties in the order scheduled.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// Events in virtual time, earliest first; events at the same instant in the order scheduled,
/// so a run is a function of its seed.
pub struct Queue<E> {
    heap: BinaryHeap<Entry<E>>,
    seq: u64,
    peak: usize,
}

impl<E> Default for Queue<E> {
    fn default() -> Self {
        Self {
            heap: BinaryHeap::new(),
            seq: 0,
            peak: 0,
        }
    }
}

impl<E> Queue<E> {
    /// Schedules `event` at `at`.
    pub fn push(&mut self, at: Nanos, event: E) {
        self.seq += 1;
        self.heap.push(Entry {
            at,
            seq: self.seq,
            event,
        });
        self.peak = self.peak.max(self.heap.len());
    }

    /// The earliest event and its time.
    pub fn pop(&mut self) -> Option<(Nanos, E)> {
        self.heap.pop().map(|e| (e.at, e.event))
    }

    /// Events pending.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no event is pending.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// The most events pending at once so far.
    pub fn peak(&self) -> usize {
        self.peak
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_and_ties_in_order() {
        let mut q = Queue::default();
        q.push(5, 'c');
        q.push(1, 'a');
        q.push(5, 'd');
        q.push(1, 'b');
        let order: Vec<char> = std::iter::from_fn(|| q.pop().map(|(_, e)| e)).collect();
        assert_eq!(order, ['a', 'b', 'c', 'd']);
        assert_eq!(q.peak(), 4);
    }

    #[test]
    fn stale_handles_find_nothing() {
        let mut slab = Slab::default();
        let a = slab.insert(1);
        assert_eq!(slab.remove(a), Some(1));
        let b = slab.insert(2);
        assert_eq!(a.index, b.index);
        assert_eq!(slab.get_mut(a), None);
        assert_eq!(slab.remove(a), None);
        assert_eq!(slab.get(b), Some(&2));
        assert_eq!(slab.len(), 1);
    }
}
