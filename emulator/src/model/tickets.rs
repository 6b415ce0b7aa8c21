//! A ticket pool whose wake-ups are not FIFO.
//!
//! A request that finds a free ticket takes it at once, even if others are waiting. Giving a
//! ticket back wakes one waiter chosen at random (seeded); the woken waiter then has to take the
//! ticket itself and may find that a request that just arrived got it first, in which case it
//! sleeps again. So a later request can overtake an earlier one, as in mongod 8.0.
//!
//! With `tickets.wakeup: fifo` the pool is a fair queue instead: a release wakes the
//! longest-waiting request and new arrivals do not take tickets promised to it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::wait::{Interrupt, Watch};

/// Why no ticket was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireError {
    /// The waiter queue was full (433).
    Shed,
    /// Deadline or disconnect while waiting.
    Interrupted(Interrupt),
}

#[derive(Debug)]
struct PoolState {
    total: u32,
    in_use: u32,
    max_waiters: u64,
    /// Waiters nobody has woken yet.
    sleeping: Vec<u64>,
    /// Waiters woken for a free ticket that have not yet tried to take it.
    woken: Vec<u64>,
    notify: HashMap<u64, Arc<Notify>>,
    next_id: u64,
    rng: StdRng,
    /// Since the last [`TicketPool::take_pressure`]: all tickets were in use at some point.
    pressure: bool,
    /// FIFO hand-off instead of random wake-ups that race new arrivals.
    fifo: bool,
}

impl PoolState {
    fn waiters(&self) -> usize {
        self.sleeping.len() + self.woken.len()
    }

    fn free(&self) -> u32 {
        self.total.saturating_sub(self.in_use)
    }

    /// Whether a request arriving now may take a free ticket: always when unfair; in FIFO mode
    /// only if no one is waiting and no free ticket is promised to a woken waiter.
    fn arrival_may_take(&self) -> bool {
        if self.fifo {
            self.sleeping.is_empty() && self.free() as usize > self.woken.len()
        } else {
            self.free() > 0
        }
    }

    fn take(&mut self) {
        self.in_use += 1;
        if self.in_use >= self.total {
            self.pressure = true;
        }
    }

    /// Wakes random sleeping waiters until every free ticket has a woken waiter racing for it.
    fn wake(&mut self) {
        // Bounded by the number of sleeping waiters.
        while self.free() as usize > self.woken.len() && !self.sleeping.is_empty() {
            let i = if self.fifo {
                // Ids grow with arrival; a waiter keeps its id when it sleeps again.
                let (i, _) = self
                    .sleeping
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, id)| **id)
                    .unwrap_or((0, &0));
                i
            } else {
                self.rng.random_range(0..self.sleeping.len())
            };
            let id = self.sleeping.swap_remove(i);
            self.woken.push(id);
            if let Some(n) = self.notify.get(&id) {
                n.notify_one();
            }
        }
    }

    fn forget(&mut self, id: u64) -> bool {
        self.notify.remove(&id);
        if let Some(i) = self.woken.iter().position(|w| *w == id) {
            self.woken.swap_remove(i);
            return true;
        }
        if let Some(i) = self.sleeping.iter().position(|w| *w == id) {
            self.sleeping.swap_remove(i);
        }
        false
    }
}

/// One pool of tickets (read or write).
#[derive(Debug)]
pub(crate) struct TicketPool {
    st: Mutex<PoolState>,
}

/// A held ticket; dropping it gives it back.
#[derive(Debug)]
pub(crate) struct Ticket<'a> {
    pool: &'a TicketPool,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.pool.release();
    }
}

/// Counts of one pool at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PoolCounts {
    pub(crate) in_use: u32,
    pub(crate) total: u32,
    pub(crate) waiters: u32,
}

impl TicketPool {
    pub(crate) fn new(total: u32, max_waiters: u64, seed: u64, fifo: bool) -> TicketPool {
        TicketPool {
            st: Mutex::new(PoolState {
                total,
                in_use: 0,
                max_waiters,
                sleeping: Vec::new(),
                woken: Vec::new(),
                notify: HashMap::new(),
                next_id: 0,
                rng: StdRng::seed_from_u64(seed),
                pressure: false,
                fifo,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a ticket, waiting (non-FIFO) until `deadline` if none is free. `may_shed`: a full
    /// waiter queue rejects this request (false for requests coming back from a yield).
    pub(crate) async fn acquire<F: Future<Output = ()>>(
        &self,
        may_shed: bool,
        deadline: Instant,
        watch: &mut Watch<'_, F>,
    ) -> Result<Ticket<'_>, AcquireError> {
        let (id, notify) = {
            let mut st = self.lock();
            if st.arrival_may_take() {
                st.take();
                return Ok(Ticket { pool: self });
            }
            st.pressure = true;
            if may_shed && st.max_waiters > 0 && st.waiters() as u64 >= st.max_waiters {
                return Err(AcquireError::Shed);
            }
            let id = st.next_id;
            st.next_id += 1;
            let n = Arc::new(Notify::new());
            st.notify.insert(id, n.clone());
            st.sleeping.push(id);
            (id, n)
        };
        // Each turn ends with a ticket, an interruption, or a lost race; lost races only happen
        // after another request took a ticket, and the deadline bounds the whole wait.
        loop {
            match watch.run(deadline, notify.notified()).await {
                Ok(()) => {
                    let mut st = self.lock();
                    if let Some(i) = st.woken.iter().position(|w| *w == id) {
                        st.woken.swap_remove(i);
                    }
                    if st.free() > 0 {
                        st.notify.remove(&id);
                        st.take();
                        // More free tickets than woken waiters (e.g. the pool grew)?
                        st.wake();
                        return Ok(Ticket { pool: self });
                    }
                    // Someone else got there first: sleep again.
                    st.sleeping.push(id);
                }
                Err(i) => {
                    let mut st = self.lock();
                    if st.forget(id) {
                        // We were woken for a ticket we will not take: pass the wake-up on.
                        st.wake();
                    }
                    return Err(AcquireError::Interrupted(i));
                }
            }
        }
    }

    fn release(&self) {
        let mut st = self.lock();
        st.in_use = st.in_use.saturating_sub(1);
        st.wake();
    }

    /// Changes the number of tickets (requests holding more than the new total keep them).
    pub(crate) fn set_total(&self, total: u32) {
        let mut st = self.lock();
        st.total = total.max(1);
        st.wake();
    }

    pub(crate) fn set_max_waiters(&self, max: u64) {
        self.lock().max_waiters = max;
    }

    pub(crate) fn set_fifo(&self, fifo: bool) {
        let mut st = self.lock();
        st.fifo = fifo;
        st.wake();
    }

    pub(crate) fn reseed(&self, seed: u64) {
        self.lock().rng = StdRng::seed_from_u64(seed);
    }

    pub(crate) fn counts(&self) -> PoolCounts {
        let st = self.lock();
        PoolCounts {
            in_use: st.in_use,
            total: st.total,
            waiters: u32::try_from(st.waiters()).unwrap_or(u32::MAX),
        }
    }

    /// Whether the pool ran out of tickets since the last call.
    pub(crate) fn take_pressure(&self) -> bool {
        let mut st = self.lock();
        let p = st.pressure || st.waiters() > 0 || st.in_use >= st.total;
        st.pressure = false;
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::pin;
    use tokio::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn free_ticket_is_taken_at_once_and_shed_when_queue_full() {
        let pool = TicketPool::new(1, 1, 0, false);
        let never = pin!(std::future::pending::<()>());
        let mut w = Watch::new(never, false);
        let deadline = Instant::now() + Duration::from_millis(50);
        let t = pool.acquire(true, deadline, &mut w).await.unwrap();
        assert_eq!(pool.counts().in_use, 1);
        // One waiter fits, the second is shed, an exempt one still queues.
        let pool = &pool;
        let (a, b, c) = tokio::join!(
            async {
                let never = pin!(std::future::pending::<()>());
                let mut w = Watch::new(never, false);
                pool.acquire(true, deadline, &mut w).await.map(drop)
            },
            async {
                tokio::task::yield_now().await;
                let never = pin!(std::future::pending::<()>());
                let mut w = Watch::new(never, false);
                pool.acquire(true, deadline, &mut w).await.map(drop)
            },
            async {
                tokio::task::yield_now().await;
                tokio::task::yield_now().await;
                let never = pin!(std::future::pending::<()>());
                let mut w = Watch::new(never, false);
                pool.acquire(false, deadline, &mut w).await.map(drop)
            },
        );
        assert_eq!(
            a,
            Err(AcquireError::Interrupted(Interrupt::Deadline)),
            "ticket never released"
        );
        assert_eq!(b, Err(AcquireError::Shed));
        assert_eq!(c, Err(AcquireError::Interrupted(Interrupt::Deadline)));
        drop(t);
        assert_eq!(pool.counts(), PoolCounts::default_with_total(1));
    }

    impl PoolCounts {
        fn default_with_total(total: u32) -> PoolCounts {
            PoolCounts {
                total,
                ..PoolCounts::default()
            }
        }
    }
}
