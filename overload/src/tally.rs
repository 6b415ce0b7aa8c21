//! [`Tally`]: counts of events and of refused events in a ring of time slots, the bookkeeping
//! the adaptive throttle and the retry budget's acceptance share, each in two sizes (a window
//! of ten slots, and a history of [`HISTORY_WINDOWS`] whole windows).

/// How many windows a sparse client's history holds: two minutes at the default 10 s window,
/// the SRE book's own window (`overload::admission::throttle`, "Sparse clients").
pub(crate) const HISTORY_WINDOWS: usize = 12;

/// Events and refused events per slot over the last `N` slots. Slot `n` (a time divided by the
/// slot's length, counted by the caller) lives at `n % N`.
#[derive(Debug)]
pub(crate) struct Tally<const N: usize> {
    newest: u64,
    events: [u64; N],
    refused: [u64; N],
}

impl<const N: usize> Tally<N> {
    /// An empty ring whose newest slot is 0.
    pub(crate) const fn new() -> Self {
        Self {
            newest: 0,
            events: [0; N],
            refused: [0; N],
        }
    }

    /// The newest slot's number.
    pub(crate) fn newest(&self) -> u64 {
        self.newest
    }

    /// Makes `slot` the newest, clearing the slots time has moved past; an earlier slot
    /// changes nothing (a clock that went back counts in the newest slot). Bounded however far
    /// time moved: after `N` steps every slot is clear.
    pub(crate) fn advance_to(&mut self, slot: u64) {
        if slot <= self.newest {
            return;
        }
        let to_clear = (slot - self.newest).min(N as u64);
        for step in 1..=to_clear {
            let index = self.index(self.newest + step);
            self.events[index] = 0;
            self.refused[index] = 0;
        }
        self.newest = slot;
    }

    /// Counts one event in the newest slot.
    pub(crate) fn add_event(&mut self) {
        let index = self.index(self.newest);
        self.events[index] = self.events[index].saturating_add(1);
    }

    /// Counts one refused event in the newest slot.
    pub(crate) fn add_refused(&mut self) {
        let index = self.index(self.newest);
        self.refused[index] = self.refused[index].saturating_add(1);
    }

    /// The events and the refused events over every slot. A refusal counted in a later slot
    /// than its event can outlive it by a slot, so refusals may exceed events at the ring's
    /// edge.
    pub(crate) fn sums(&self) -> (u64, u64) {
        let sum = |slots: &[u64; N]| slots.iter().fold(0u64, |s, n| s.saturating_add(*n));
        (sum(&self.events), sum(&self.refused))
    }

    fn index(&self, slot: u64) -> usize {
        (slot % N as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_expire_as_the_ring_moves_on() {
        let mut t = Tally::<3>::new();
        t.add_event();
        t.add_refused();
        t.advance_to(1);
        t.add_event();
        assert_eq!(t.sums(), (2, 1));
        t.advance_to(3);
        assert_eq!(t.sums(), (1, 0), "slot 0 cleared, slot 1 kept");
        t.advance_to(1);
        assert_eq!(t.newest(), 3, "an earlier slot changes nothing");
        t.advance_to(u64::MAX);
        assert_eq!(t.sums(), (0, 0));
    }

    #[test]
    fn refusals_may_exceed_events() {
        let mut t = Tally::<2>::new();
        t.add_refused();
        assert_eq!(t.sums(), (0, 1));
    }
}
