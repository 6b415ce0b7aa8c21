//! Virtual cores: a FIFO semaphore of `cores` permits. A request holds one permit for one
//! quantum of work (sleeping, not spinning), then queues again, which time-shares the cores
//! round-robin among runnable requests.
//!
//! Tokio's timers fire on millisecond ticks, so a quantum usually lasts a little longer than
//! asked, and a request's last quantum up to a tick longer than the work it had left. A request
//! is charged only the work it needed; the excess core time is banked here and paid back by
//! shortening later quanta, so the cores' real throughput matches the configured costs on
//! average. A quantum pays back up to all of its slice: a slice paid in full takes no time,
//! and its request still gives the core up and queues again. (Until 2026-12-05 a request's
//! quantum paid back at most half its slice. With requests alone on the cores the bank then
//! filled faster than it emptied and spilt over its cap: the lab's mix completed 751 to 767
//! a second at 8 to 48 requests in flight instead of 833. Rejections, which always paid in
//! full, hid it under overload.) With a paused clock sleeps are exact and the bank stays
//! empty.
//!
//! A core given back while requests wait for one passes to the first of them, but the host
//! has to run that waiter's task before its slice starts; meanwhile the core is held and does
//! no work. The cores measure that hand-off (from the release to the waiter starting) for
//! each kind of slice, so that a model of these cores (the simulator's) can be given what the
//! host cost in a run.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use super::delays::TimedDelays;

/// Release times kept for waiters that have not yet started; more means releases nobody took
/// (waiters that gave up), the oldest of which are dropped.
const RELEASES_KEPT: usize = 64;

#[derive(Debug)]
pub(crate) struct Cores {
    sem: Semaphore,
    total: Mutex<CoreCount>,
    busy: AtomicU32,
    /// Core time used beyond what requests needed (timer lateness), in ns.
    owed_ns: AtomicU64,
    /// Tasks waiting for a core.
    waiting: AtomicU32,
    handoffs: Mutex<HandoffLog>,
}

/// What a core is taken for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SliceKind {
    /// A slice of a request's work.
    Request,
    /// Work outside a request: a rejection, an expired request's stop, a connection's set-up.
    Other,
}

#[derive(Debug, Default)]
struct HandoffLog {
    /// When a core was given back while a task waited, oldest first.
    releases: VecDeque<Instant>,
    /// Hand-offs of cores to waiters of each kind of slice, from release to start.
    request: TimedDelays,
    other: TimedDelays,
    /// How long slices slept beyond what they asked.
    oversleep: TimedDelays,
}

#[derive(Debug)]
struct CoreCount {
    total: u32,
    /// Permits still to be removed when they are released (the pool shrank while busy).
    debt: u32,
}

/// What one quantum asked for and took.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SliceTimes {
    /// The work the quantum was to do.
    pub(crate) slice: Duration,
    /// The request's work left before the quantum (at least `slice`).
    pub(crate) remaining: Duration,
    /// Banked core time paid back instead of sleeping.
    pub(crate) repaid: Duration,
    /// How long the core was held, sleeping.
    pub(crate) slept: Duration,
}

/// One core, held for one quantum.
pub(crate) struct Core<'a> {
    cores: &'a Cores,
    permit: Option<SemaphorePermit<'a>>,
}

impl Drop for Core<'_> {
    fn drop(&mut self) {
        self.cores.busy.fetch_sub(1, Ordering::Relaxed);
        let Some(p) = self.permit.take() else {
            return;
        };
        {
            let mut c = self.cores.lock();
            if c.debt > 0 {
                c.debt -= 1;
                p.forget();
                return;
            }
        }
        // Logged before the permit goes, so that the waiter it goes to finds it.
        if self.cores.waiting.load(Ordering::Relaxed) > 0 {
            let mut log = self.cores.log();
            if log.releases.len() >= RELEASES_KEPT {
                log.releases.pop_front();
            }
            log.releases.push_back(Instant::now());
        }
        drop(p);
    }
}

/// Counts a task as waiting for a core while it lives.
struct Waiting<'a>(&'a AtomicU32);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Cores {
    pub(crate) fn new(total: u32) -> Cores {
        Cores {
            sem: Semaphore::new(total as usize),
            total: Mutex::new(CoreCount { total, debt: 0 }),
            busy: AtomicU32::new(0),
            owed_ns: AtomicU64::new(0),
            waiting: AtomicU32::new(0),
            handoffs: Mutex::new(HandoffLog::default()),
        }
    }

    /// Pays back banked excess with up to the whole of a quantum's `slice`; the quantum then
    /// sleeps only for the rest.
    pub(crate) fn repay(&self, slice: Duration) -> Duration {
        let max = u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX);
        let mut took = 0;
        let _ = self
            .owed_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                took = v.min(max);
                Some(v - took)
            });
        Duration::from_nanos(took)
    }

    /// Settles one quantum: returns the work to charge (what the slice took, with what it
    /// repaid, at least the slice and at most `remaining`) and banks the rest; the bank holds
    /// at most `cap`. A slice that slept counts how long it slept beyond what it asked.
    pub(crate) fn settle(&self, t: SliceTimes, cap: Duration) -> Duration {
        if t.repaid < t.slice {
            let asked = t.slice - t.repaid;
            self.log().oversleep.record(t.slept.saturating_sub(asked));
        }
        let progress = (t.slept + t.repaid).max(t.slice);
        let charged = progress.min(t.remaining);
        self.bank(progress - charged, cap);
        charged
    }

    /// Banks core time used beyond need; the bank holds at most `cap`.
    fn bank(&self, excess: Duration, cap: Duration) {
        let add = u64::try_from(excess.as_nanos()).unwrap_or(u64::MAX);
        let cap = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .owed_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_add(add).min(cap))
            });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CoreCount> {
        self.total.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn log(&self) -> std::sync::MutexGuard<'_, HandoffLog> {
        self.handoffs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a core (FIFO) for a slice of `kind`. Cancel-safe.
    pub(crate) async fn acquire(&self, kind: SliceKind) -> Core<'_> {
        // A free core is only free when nobody waits: the semaphore gives released permits to
        // its waiters first.
        let permit = match self.sem.try_acquire() {
            Ok(p) => Some(p),
            Err(_) => {
                let since = Instant::now();
                self.waiting.fetch_add(1, Ordering::Relaxed);
                let waiting = Waiting(&self.waiting);
                // The semaphore is never closed, so acquire cannot fail.
                let permit = self.sem.acquire().await.ok();
                drop(waiting);
                self.handed_off(since, kind);
                permit
            }
        };
        self.busy.fetch_add(1, Ordering::Relaxed);
        Core {
            cores: self,
            permit,
        }
    }

    /// A task that began waiting at `since` got its core: the hand-off lasted from the first
    /// release since then until now. Releases before `since` went to earlier waiters that
    /// gave up or have not yet run; a core that came from a resize has no release to count.
    fn handed_off(&self, since: Instant, kind: SliceKind) {
        let now = Instant::now();
        let mut log = self.log();
        while log.releases.front().is_some_and(|t| *t < since) {
            log.releases.pop_front();
        }
        let Some(released) = log.releases.pop_front() else {
            return;
        };
        let h = match kind {
            SliceKind::Request => &mut log.request,
            SliceKind::Other => &mut log.other,
        };
        h.record(now.saturating_duration_since(released));
    }

    /// Hand-offs so far: to slices of requests, and to other work.
    pub(crate) fn handoffs(&self) -> (TimedDelays, TimedDelays) {
        let log = self.log();
        (log.request, log.other)
    }

    /// How long the slices that slept have slept beyond what they asked, so far.
    pub(crate) fn oversleep(&self) -> TimedDelays {
        self.log().oversleep
    }

    pub(crate) fn resize(&self, new: u32) {
        let mut c = self.lock();
        if new > c.total {
            let mut add = new - c.total;
            let repaid = add.min(c.debt);
            c.debt -= repaid;
            add -= repaid;
            self.sem.add_permits(add as usize);
        } else if new < c.total {
            let remove = c.total - new;
            let gone = self.sem.forget_permits(remove as usize) as u32;
            c.debt += remove - gone;
        }
        c.total = new;
    }

    pub(crate) fn busy(&self) -> u32 {
        self.busy.load(Ordering::Relaxed)
    }

    pub(crate) fn total(&self) -> u32 {
        self.lock().total
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    #[tokio::test]
    async fn shrink_while_busy_then_grow() {
        let c = Cores::new(2);
        let a = c.acquire(SliceKind::Request).await;
        let b = c.acquire(SliceKind::Request).await;
        assert_eq!(c.busy(), 2);
        c.resize(1);
        drop(a);
        // The released permit paid the debt: still no core free.
        assert_eq!(c.sem.available_permits(), 0);
        drop(b);
        assert_eq!(c.sem.available_permits(), 1);
        c.resize(3);
        assert_eq!(c.sem.available_permits(), 3);
        assert_eq!(c.total(), 3);
        assert_eq!(c.busy(), 0);
    }

    /// Real time: the releasing task blocks its thread for 5 ms after giving the core back, so
    /// the waiter's slice starts at least that late, and the cores count it for the waiter's
    /// kind. Taking a free core is no hand-off.
    #[tokio::test]
    async fn a_hand_off_is_timed_from_the_release_to_the_waiter_starting() {
        let c = std::sync::Arc::new(Cores::new(1));
        let held = c.acquire(SliceKind::Request).await;
        assert_eq!(c.handoffs(), Default::default());
        let waiter = {
            let c = c.clone();
            tokio::spawn(async move {
                drop(c.acquire(SliceKind::Other).await);
            })
        };
        // Bounded: the spawned task queues for the core within a few polls.
        for _ in 0..100 {
            if c.waiting.load(Ordering::Relaxed) == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(c.waiting.load(Ordering::Relaxed), 1, "the waiter waits");
        drop(held);
        std::thread::sleep(Duration::from_millis(5));
        waiter.await.expect("the waiter ran");
        let (request, other) = c.handoffs();
        assert_eq!(request, TimedDelays::default());
        assert_eq!(other.count(), 1);
        assert!(other.time >= Duration::from_millis(5), "{other:?}");
        assert!(other.time < Duration::from_secs(5), "{other:?}");
        // Counted by size too: in a bucket above 2 ms (5 ms and up), none below.
        assert_eq!(other.sizes.total(), 1);
        assert_eq!(
            other.sizes.counts()[..5].iter().sum::<u64>(),
            0,
            "{other:?}"
        );
        assert_eq!(c.waiting.load(Ordering::Relaxed), 0);
    }

    /// A slice that slept longer than it asked counts the excess by size; one paid in full
    /// from the bank slept nothing and counts nothing.
    #[test]
    fn a_slice_counts_how_long_it_slept_beyond_what_it_asked() {
        let c = Cores::new(1);
        let ms = Duration::from_millis;
        let times = |repaid, slept| SliceTimes {
            slice: ms(1),
            remaining: ms(2),
            repaid,
            slept,
        };
        c.settle(times(Duration::ZERO, ms(4)), ms(4));
        c.settle(
            times(Duration::from_micros(500), Duration::from_micros(550)),
            ms(4),
        );
        c.settle(times(ms(1), Duration::ZERO), ms(4));
        let over = c.oversleep();
        let counts = over.sizes.counts();
        assert_eq!(over.sizes.total(), 2);
        assert_eq!(over.time, Duration::from_micros(3_050));
        // 3 ms over (bucket up to 5 ms) and 50 µs over (up to 100 µs).
        assert_eq!((counts[0], counts[5]), (1, 1), "{counts:?}");
    }

    /// A run queue of `depth` closed-loop requests of the lab's mix (80 % 2 ms, 10 % 5 ms,
    /// 10 % 3 ms) on two cores, each sleep ending on the next millisecond tick plus 50 µs, as
    /// tokio's timer ends them: returns the work charged ÷ the time the cores were held.
    fn charged_share_on_ticks(depth: usize) -> f64 {
        const TICK_NS: u128 = 1_000_000;
        const HANDOFF: Duration = Duration::from_micros(30);
        let cores = Cores::new(2);
        let quantum = Duration::from_millis(1);
        let cap = quantum * 2 * 4;
        let cost = |n: usize| Duration::from_millis([2, 2, 2, 2, 2, 2, 2, 2, 5, 3][n % 10]);
        let mut queue: VecDeque<(Duration, usize)> = (0..depth).map(|n| (cost(n), n)).collect();
        let mut next = depth;
        let mut running: [Option<(Duration, usize)>; 2] = [None, None];
        let mut free_at = [Duration::ZERO; 2];
        let mut charged = Duration::ZERO;
        let mut held = Duration::ZERO;
        while free_at.iter().min().unwrap() < &Duration::from_secs(10) {
            let core = if free_at[0] <= free_at[1] { 0 } else { 1 };
            if let Some(request) = running[core].take() {
                queue.push_back(request);
            }
            let (remaining, n) = queue.pop_front().unwrap();
            let t0 = free_at[core] + HANDOFF;
            let slice = remaining.min(quantum);
            let repaid = cores.repay(slice);
            let mut slept = Duration::ZERO;
            if repaid < slice {
                let due = (t0 + slice - repaid).as_nanos().div_ceil(TICK_NS) * TICK_NS;
                let wait = due - t0.as_nanos();
                slept = Duration::from_nanos((wait.div_ceil(TICK_NS) * TICK_NS) as u64);
            }
            let times = SliceTimes {
                slice,
                remaining,
                repaid,
                slept,
            };
            let work = cores.settle(times, cap);
            charged += work;
            held += slept;
            free_at[core] = t0 + slept;
            running[core] = Some(if work == remaining {
                next += 1;
                (cost(next), next)
            } else {
                (remaining - work, n)
            });
        }
        charged.as_secs_f64() / held.as_secs_f64()
    }

    #[test]
    fn busy_cores_charge_all_their_time_at_any_queue_depth() {
        // Paying back at most half a slice (the rule until 2026-12-05) charged 95.4 % of the
        // time here at three in flight and 98.7 % at 48; in real time 90 to 92 % at 8 to 48.
        for depth in [2, 3, 8, 48] {
            let share = charged_share_on_ticks(depth);
            assert!(
                share > 0.995,
                "{depth} in flight: {share:.4} of core time charged"
            );
        }
    }

    #[test]
    fn bank_is_capped_and_repaid() {
        let c = Cores::new(1);
        c.bank(Duration::from_millis(3), Duration::from_millis(5));
        c.bank(Duration::from_millis(3), Duration::from_millis(5));
        assert_eq!(c.repay(Duration::from_millis(2)), Duration::from_millis(2));
        assert_eq!(c.repay(Duration::from_millis(9)), Duration::from_millis(3));
        assert_eq!(c.repay(Duration::from_millis(9)), Duration::ZERO);
    }
}
