//! A ticket pool whose wake-ups are not FIFO.
//!
//! A request that finds a free ticket takes it at once, even if others are waiting. Giving a
//! ticket back wakes one waiter chosen at random; the woken waiter then has to take the ticket
//! itself and may find that a request that just arrived got it first, in which case it sleeps
//! again. So a later request can overtake an earlier one, as in mongod 8.0.
//!
//! The random choice is a contest: each sleeping waiter draws a priority and the highest wins.
//! A waiter's draw is a hash of the pool's seed, the waiter's key (from its lab request id and
//! attempt, or from the pool's seeded generator for requests without an id) and the number of
//! contests it has already lost, so each contest is a fresh uniform choice among the waiters,
//! and the same request has the same luck in every lab variant (`draws`).
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

use super::delays::{DelayCounts, TimedDelays};
use super::draws::keyed;
use super::wait::{Interrupt, Watch};

/// Why no ticket was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireError {
    /// The waiter queue was full (433).
    Shed,
    /// Deadline or disconnect while waiting.
    Interrupted(Interrupt),
}

/// How a request comes to a pool for a ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// A request that has just been admitted, which reached the server at the instant given;
    /// a full waiter queue sheds it.
    Arrival(Instant),
    /// A request coming back from a yield, which is never shed.
    Yield,
}

/// Tickets taken by requests while a woken waiter was still coming for them: the moments in
/// which a woken waiter loses its race. Counted to tell whether the requests that overtake
/// arrive in the wake-up's window or were already on their way when the ticket came free.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Steals {
    /// From the release that woke the waiter to the ticket being taken.
    pub(crate) after_release: DelayCounts,
    /// Arrivals that reached the server before that release, by how long before.
    pub(crate) arrived_before: DelayCounts,
    /// Arrivals that reached the server after it, by how long after.
    pub(crate) arrived_after: DelayCounts,
    /// Requests coming back from a yield (they gave the ticket back themselves).
    pub(crate) by_yields: u64,
}

impl Steals {
    /// Adds `other`'s counts (two pools' into one).
    pub(crate) fn add(&mut self, other: &Steals) {
        self.after_release.add(&other.after_release);
        self.arrived_before.add(&other.arrived_before);
        self.arrived_after.add(&other.arrived_after);
        self.by_yields = self.by_yields.saturating_add(other.by_yields);
    }
}

/// A waiter nobody has woken yet.
#[derive(Debug, Clone, Copy)]
struct Sleeper {
    id: u64,
    /// Its draws' key: from the request (`draws`), or from the pool's generator.
    key: u64,
    /// Contests it has lost so far.
    losses: u64,
}

#[derive(Debug)]
struct PoolState {
    total: u32,
    in_use: u32,
    max_waiters: u64,
    /// Waiters nobody has woken yet.
    sleeping: Vec<Sleeper>,
    /// Keys of waiters that are awake (woken, or racing for a ticket), by id, so that one that
    /// sleeps again keeps its key and losses.
    keys: HashMap<u64, (u64, u64)>,
    /// Waiters woken for a free ticket that have not yet tried to take it, with when.
    woken: Vec<(u64, Instant)>,
    notify: HashMap<u64, Arc<Notify>>,
    next_id: u64,
    /// Mixed into every draw; changes with the model's seed.
    seed: u64,
    /// Keys of waiters without a request key.
    rng: StdRng,
    /// Since the last [`TicketPool::take_pressure`]: all tickets were in use at some point.
    pressure: bool,
    /// FIFO hand-off instead of random wake-ups that race new arrivals.
    fifo: bool,
    /// Waiters woken so far, and how many of them found their ticket taken by a request that
    /// arrived meanwhile (they sleep again).
    wakeups: u64,
    races_lost: u64,
    /// From waking each waiter to its coming for the ticket: the host's scheduling delay,
    /// the window in which an arrival can overtake it.
    wakes: TimedDelays,
    steals: Steals,
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

    /// Counts a request taking a free ticket at `now` that a woken waiter is coming for (every
    /// free ticket has one): the waiter will find it gone unless another comes free meanwhile.
    fn count_steal(&mut self, entry: Entry, now: Instant) {
        if self.fifo || self.free() as usize > self.woken.len() {
            return;
        }
        // The earliest wake-up is the release whose ticket is taken first.
        let Some(released) = self.woken.iter().map(|w| w.1).min() else {
            return;
        };
        let s = &mut self.steals;
        s.after_release
            .record(now.saturating_duration_since(released));
        match entry {
            Entry::Arrival(at) if at <= released => s.arrived_before.record(released - at),
            Entry::Arrival(at) => s.arrived_after.record(at - released),
            Entry::Yield => s.by_yields += 1,
        }
    }

    fn take(&mut self) {
        self.in_use += 1;
        if self.in_use >= self.total {
            self.pressure = true;
        }
    }

    /// Which sleeping waiter a wake-up goes to: the oldest in FIFO mode, else the winner of a
    /// contest of fresh draws (the losers' loss counts go up, so their next draws are new).
    fn choose(&mut self) -> usize {
        if self.fifo {
            // Ids grow with arrival; a waiter keeps its id when it sleeps again.
            return self
                .sleeping
                .iter()
                .enumerate()
                .min_by_key(|(_, s)| s.id)
                .map_or(0, |(i, _)| i);
        }
        let seed = self.seed;
        let draw = |s: &Sleeper| (keyed(&[seed, s.key, s.losses]), s.id);
        let winner = self
            .sleeping
            .iter()
            .enumerate()
            .max_by_key(|(_, s)| draw(s))
            .map_or(0, |(i, _)| i);
        for (i, s) in self.sleeping.iter_mut().enumerate() {
            if i != winner {
                s.losses = s.losses.saturating_add(1);
            }
        }
        winner
    }

    /// Wakes sleeping waiters until every free ticket has a woken waiter racing for it.
    fn wake(&mut self) {
        // Bounded by the number of sleeping waiters.
        while self.free() as usize > self.woken.len() && !self.sleeping.is_empty() {
            let i = self.choose();
            let s = self.sleeping.swap_remove(i);
            self.keys.insert(s.id, (s.key, s.losses));
            self.woken.push((s.id, Instant::now()));
            self.wakeups += 1;
            if let Some(n) = self.notify.get(&s.id) {
                n.notify_one();
            }
        }
    }

    /// Puts an awake waiter back to sleep, with its key and losses.
    fn sleep_again(&mut self, id: u64) {
        let (key, losses) = self.keys.remove(&id).unwrap_or((id, 0));
        self.sleeping.push(Sleeper { id, key, losses });
    }

    fn forget(&mut self, id: u64) -> bool {
        self.notify.remove(&id);
        self.keys.remove(&id);
        if let Some(i) = self.woken.iter().position(|w| w.0 == id) {
            self.woken.swap_remove(i);
            return true;
        }
        if let Some(i) = self.sleeping.iter().position(|w| w.id == id) {
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

/// A request in a pool's waiter queue; dropping it while armed takes the request out of the
/// queue and, if it had been woken for a ticket it will not take, passes the wake-up on.
struct Waiting<'a> {
    pool: &'a TicketPool,
    id: u64,
    armed: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut st = self.pool.lock();
            if st.forget(self.id) {
                st.wake();
            }
        }
    }
}

/// A pool's wake-ups so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Wakeups {
    pub(crate) woken: u64,
    pub(crate) races_lost: u64,
    /// From each wake-up to the woken waiter coming for its ticket (a waiter that gave up
    /// before coming is not in it).
    pub(crate) wakes: TimedDelays,
    /// Tickets taken while a woken waiter was coming for them.
    pub(crate) steals: Steals,
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
                keys: HashMap::new(),
                woken: Vec::new(),
                notify: HashMap::new(),
                next_id: 0,
                seed,
                rng: StdRng::seed_from_u64(seed),
                pressure: false,
                fifo,
                wakeups: 0,
                races_lost: 0,
                wakes: TimedDelays::default(),
                steals: Steals::default(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a ticket, waiting (non-FIFO) if none is free: an interruptible wait that wakes at
    /// `deadline` and at the watch's interval for an interrupt point. A full waiter queue
    /// rejects an arrival, never a request coming back from a yield. `key`: the request's key
    /// for wake-up draws (`None`: drawn from the pool's generator).
    pub(crate) async fn acquire<F: Future<Output = ()>>(
        &self,
        entry: Entry,
        deadline: Instant,
        key: Option<u64>,
        watch: &mut Watch<'_, F>,
    ) -> Result<Ticket<'_>, AcquireError> {
        let (id, notify) = {
            let mut st = self.lock();
            if st.arrival_may_take() {
                st.count_steal(entry, Instant::now());
                st.take();
                return Ok(Ticket { pool: self });
            }
            st.pressure = true;
            let may_shed = matches!(entry, Entry::Arrival(_));
            if may_shed && st.max_waiters > 0 && st.waiters() as u64 >= st.max_waiters {
                return Err(AcquireError::Shed);
            }
            let id = st.next_id;
            st.next_id += 1;
            let n = Arc::new(Notify::new());
            st.notify.insert(id, n.clone());
            let key = match key {
                Some(k) => k,
                None => st.rng.random(),
            };
            st.sleeping.push(Sleeper { id, key, losses: 0 });
            (id, n)
        };
        // Leaves the queue however the wait ends, also when the caller drops it.
        let mut waiting = Waiting {
            pool: self,
            id,
            armed: true,
        };
        // Each turn ends with a ticket, an interruption, or a lost race; lost races only happen
        // after another request took a ticket, and the deadline bounds the whole wait.
        loop {
            match watch.wait(deadline, notify.notified()).await {
                Ok(()) => {
                    let mut st = self.lock();
                    if let Some(i) = st.woken.iter().position(|w| w.0 == id) {
                        let (_, at) = st.woken.swap_remove(i);
                        st.wakes.record(at.elapsed());
                    }
                    if st.free() > 0 {
                        st.notify.remove(&id);
                        st.keys.remove(&id);
                        st.take();
                        // More free tickets than woken waiters (e.g. the pool grew)?
                        st.wake();
                        waiting.armed = false;
                        return Ok(Ticket { pool: self });
                    }
                    // Someone else got there first: sleep again.
                    st.races_lost += 1;
                    st.sleep_again(id);
                }
                Err(i) => return Err(AcquireError::Interrupted(i)),
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

    /// Restarts the pool's draws from `seed` (waiters already asleep keep their keys).
    pub(crate) fn reseed(&self, seed: u64) {
        let mut st = self.lock();
        st.seed = seed;
        st.rng = StdRng::seed_from_u64(seed);
    }

    /// Waiters woken so far, those that lost their ticket to a request that arrived before
    /// they came for it, and how long the woken took to come.
    pub(crate) fn wakeups(&self) -> Wakeups {
        let st = self.lock();
        Wakeups {
            woken: st.wakeups,
            races_lost: st.races_lost,
            wakes: st.wakes,
            steals: st.steals,
        }
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
        let mut w = Watch::new(never, false, Duration::from_millis(500), Instant::now());
        let deadline = Instant::now() + Duration::from_millis(50);
        let t = pool
            .acquire(Entry::Arrival(Instant::now()), deadline, None, &mut w)
            .await
            .unwrap();
        assert_eq!(pool.counts().in_use, 1);
        // One waiter fits, the second is shed, an exempt one still queues.
        let pool = &pool;
        let (a, b, c) = tokio::join!(
            async {
                let never = pin!(std::future::pending::<()>());
                let mut w = Watch::new(never, false, Duration::from_millis(500), Instant::now());
                pool.acquire(Entry::Arrival(Instant::now()), deadline, None, &mut w)
                    .await
                    .map(drop)
            },
            async {
                tokio::task::yield_now().await;
                let never = pin!(std::future::pending::<()>());
                let mut w = Watch::new(never, false, Duration::from_millis(500), Instant::now());
                pool.acquire(Entry::Arrival(Instant::now()), deadline, None, &mut w)
                    .await
                    .map(drop)
            },
            async {
                tokio::task::yield_now().await;
                tokio::task::yield_now().await;
                let never = pin!(std::future::pending::<()>());
                let mut w = Watch::new(never, false, Duration::from_millis(500), Instant::now());
                pool.acquire(Entry::Yield, deadline, None, &mut w)
                    .await
                    .map(drop)
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

    #[tokio::test(start_paused = true)]
    async fn an_arrival_overtakes_a_woken_waiter_which_waits_again_and_is_counted() {
        let pool = TicketPool::new(1, 0, 0, false);
        let deadline = Instant::now() + Duration::from_secs(1);
        let take = || take(&pool, deadline);
        let holder = take().await.unwrap();
        let (waited, ()) = tokio::join!(async { take().await.map(drop) }, async {
            // The waiter is asleep; the release wakes it, and a request arriving before it
            // runs takes the free ticket at once.
            tokio::task::yield_now().await;
            drop(holder);
            let overtaker = take().await.unwrap();
            assert_eq!(races(&pool), (1, 0));
            // Bounded: the waiter runs within a few polls of the joined futures.
            for _ in 0..10 {
                if races(&pool).1 == 1 {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert_eq!(races(&pool), (1, 1), "the woken waiter lost the race");
            drop(overtaker);
        });
        assert!(waited.is_ok(), "it sleeps again and gets the next ticket");
        assert_eq!(races(&pool), (2, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_ticket_taken_while_its_woken_waiter_comes_is_counted_with_when_the_taker_arrived() {
        let pool = TicketPool::new(1, 0, 0, false);
        let deadline = Instant::now() + Duration::from_secs(1);
        let holder = take(&pool, deadline).await.unwrap();
        let (waited, ()) = tokio::join!(async { take(&pool, deadline).await.map(drop) }, async {
            // The overtaker reached the server 1 ms before the release, and a request coming
            // back from a yield takes the next ticket the waiter was woken for.
            let arrived = Instant::now();
            tokio::time::sleep(Duration::from_millis(1)).await;
            drop(holder);
            let overtaker = enter(&pool, Entry::Arrival(arrived), deadline)
                .await
                .unwrap();
            let s = pool.wakeups().steals;
            assert_eq!(s.after_release.total(), 1);
            assert_eq!(s.arrived_before.counts()[3], 1, "1 ms before: {s:?}");
            assert_eq!((s.arrived_after.total(), s.by_yields), (0, 0));
            drop(overtaker);
            let yielder = enter(&pool, Entry::Yield, deadline).await.unwrap();
            assert_eq!(pool.wakeups().steals.by_yields, 1);
            drop(yielder);
        });
        assert!(waited.is_ok());
        // A ticket taken with nobody woken for it is no steal.
        let s = pool.wakeups().steals;
        drop(take(&pool, deadline).await.unwrap());
        assert_eq!(pool.wakeups().steals, s);
    }

    /// A request entering `pool` as `entry` and taking a ticket by `deadline`, never
    /// disconnected.
    async fn enter(
        pool: &TicketPool,
        entry: Entry,
        deadline: Instant,
    ) -> Result<Ticket<'_>, AcquireError> {
        let never = pin!(std::future::pending::<()>());
        let mut w = Watch::new(never, false, Duration::from_millis(500), Instant::now());
        pool.acquire(entry, deadline, None, &mut w).await
    }

    /// A request arriving now and taking a ticket from `pool` by `deadline`.
    async fn take(pool: &TicketPool, deadline: Instant) -> Result<Ticket<'_>, AcquireError> {
        enter(pool, Entry::Arrival(Instant::now()), deadline).await
    }

    fn races(pool: &TicketPool) -> (u64, u64) {
        let w = pool.wakeups();
        (w.woken, w.races_lost)
    }

    /// Real time: the waker blocks its thread for 5 ms after the release, so the woken waiter
    /// comes for its ticket at least that late, and the pool counts that time.
    #[tokio::test]
    async fn the_time_a_woken_waiter_takes_to_come_is_summed() {
        let pool = TicketPool::new(1, 0, 0, false);
        let deadline = Instant::now() + Duration::from_secs(10);
        let take = || take(&pool, deadline);
        let holder = take().await.unwrap();
        assert_eq!(pool.wakeups(), Wakeups::default(), "nobody woken yet");
        let (waited, ()) = tokio::join!(async { take().await.map(drop) }, async {
            tokio::task::yield_now().await;
            drop(holder);
            std::thread::sleep(Duration::from_millis(5));
        });
        assert!(waited.is_ok());
        let w = pool.wakeups();
        assert_eq!((w.woken, w.races_lost), (1, 0));
        assert!(w.wakes.time >= Duration::from_millis(5), "{w:?}");
        assert!(w.wakes.time < Duration::from_secs(5), "{w:?}");
        // Counted by size too, above 2 ms.
        assert_eq!(w.wakes.count(), 1);
        assert_eq!(w.wakes.sizes.counts()[..5].iter().sum::<u64>(), 0, "{w:?}");
    }

    /// The keys of waiters (arriving in the given order, all asleep) in the order one released
    /// ticket after another wakes them.
    fn wake_order(seed: u64, arrivals: &[u64]) -> Vec<u64> {
        let pool = TicketPool::new(1, 0, seed, false);
        let mut st = pool.lock();
        st.in_use = 1;
        for (id, key) in arrivals.iter().enumerate() {
            st.sleeping.push(Sleeper {
                id: id as u64,
                key: *key,
                losses: 0,
            });
        }
        let mut order = Vec::new();
        for _ in 0..arrivals.len() {
            st.in_use = 0;
            st.wake();
            let (id, _) = st.woken.pop().expect("one waiter woken per free ticket");
            st.keys.remove(&id);
            st.in_use = 1;
            order.push(arrivals[id as usize]);
        }
        order
    }

    #[test]
    fn wake_ups_depend_only_on_the_seed_and_the_waiters_keys() {
        let keys: Vec<u64> = (100..140).collect();
        let mut shuffled = keys.clone();
        shuffled.reverse();
        shuffled.swap(3, 17);
        let a = wake_order(4, &keys);
        // Every waiter is woken once.
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, keys);
        // The same waiters in another arrival order are woken in the same order.
        assert_eq!(wake_order(4, &shuffled), a);
        // Not arrival order (that would be FIFO), and another seed gives another order.
        assert_ne!(a, keys);
        assert_ne!(wake_order(5, &keys), a);
    }

    #[test]
    fn every_waiter_has_a_fair_chance_at_each_wake_up() {
        // Two waiters, one wake-up each round, the loser stays: each contest is a fresh draw,
        // so neither waiter wins (nearly) always, as a fixed priority would make it.
        let pool = TicketPool::new(1, 0, 9, false);
        let mut st = pool.lock();
        st.in_use = 1;
        let mut first_wins = 0;
        for round in 0..400u64 {
            st.sleeping.clear();
            st.sleeping.push(Sleeper {
                id: 0,
                key: 1,
                losses: round,
            });
            st.sleeping.push(Sleeper {
                id: 1,
                key: 2,
                losses: round,
            });
            st.in_use = 0;
            st.wake();
            if st.woken.pop().map(|w| w.0) == Some(0) {
                first_wins += 1;
            }
            st.keys.clear();
            st.in_use = 1;
        }
        // Binomial(400, 0.5): mean 200, sd 10; five deviations either side.
        assert!((150..=250).contains(&first_wins), "{first_wins}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_wait_leaves_the_queue_and_passes_its_wake_up_on() {
        let pool = TicketPool::new(1, 0, 0, false);
        let deadline = Instant::now() + Duration::from_secs(5);
        let never = pin!(std::future::pending::<()>());
        let mut w = Watch::new(never, false, Duration::from_millis(500), Instant::now());
        let held = pool
            .acquire(Entry::Arrival(Instant::now()), deadline, None, &mut w)
            .await
            .unwrap();
        let pool = &pool;
        let waiter = || async move {
            let never = pin!(std::future::pending::<()>());
            let mut w = Watch::new(never, false, Duration::from_millis(500), Instant::now());
            pool.acquire(Entry::Arrival(Instant::now()), deadline, None, &mut w)
                .await
                .map(drop)
        };
        // One waiter gives up after 10 ms (its future is dropped); the other gets the ticket
        // released at 20 ms.
        let (dropped, kept, ()) = tokio::join!(
            tokio::time::timeout(Duration::from_millis(10), waiter()),
            waiter(),
            async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                drop(held);
            },
        );
        assert!(dropped.is_err());
        assert_eq!(kept, Ok(()));
        assert_eq!(pool.counts(), PoolCounts::default_with_total(1));
        assert!(pool.lock().keys.is_empty() && pool.lock().notify.is_empty());
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
