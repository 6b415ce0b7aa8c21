//! Virtual cores: a FIFO semaphore of `cores` permits. A request holds one permit for one
//! quantum of work (sleeping, not spinning), then queues again, which time-shares the cores
//! round-robin among runnable requests.
//!
//! Tokio's timers fire on millisecond ticks, so a quantum usually lasts a little longer than
//! asked. A request is charged only the work it needed; the excess core time is banked here and
//! paid back by shortening later quanta, so the cores' real throughput matches the configured
//! costs on average. (With a paused clock sleeps are exact and the bank stays empty.)

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};

#[derive(Debug)]
pub(crate) struct Cores {
    sem: Semaphore,
    total: Mutex<CoreCount>,
    busy: AtomicU32,
    /// Core time used beyond what requests needed (timer lateness), in ns.
    owed_ns: AtomicU64,
}

#[derive(Debug)]
struct CoreCount {
    total: u32,
    /// Permits still to be removed when they are released (the pool shrank while busy).
    debt: u32,
}

/// One core, held for one quantum.
pub(crate) struct Core<'a> {
    cores: &'a Cores,
    permit: Option<SemaphorePermit<'a>>,
}

impl Drop for Core<'_> {
    fn drop(&mut self) {
        self.cores.busy.fetch_sub(1, Ordering::Relaxed);
        if let Some(p) = self.permit.take() {
            let mut c = self.cores.lock();
            if c.debt > 0 {
                c.debt -= 1;
                p.forget();
            }
        }
    }
}

impl Cores {
    pub(crate) fn new(total: u32) -> Cores {
        Cores {
            sem: Semaphore::new(total as usize),
            total: Mutex::new(CoreCount { total, debt: 0 }),
            busy: AtomicU32::new(0),
            owed_ns: AtomicU64::new(0),
        }
    }

    /// Takes up to `max` of the banked excess, to be subtracted from the next sleep.
    pub(crate) fn repay(&self, max: Duration) -> Duration {
        let max = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        let mut took = 0;
        let _ = self
            .owed_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                took = v.min(max);
                Some(v - took)
            });
        Duration::from_nanos(took)
    }

    /// Banks core time used beyond need; the bank holds at most `cap`.
    pub(crate) fn bank(&self, excess: Duration, cap: Duration) {
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

    /// Waits for a core (FIFO). Cancel-safe.
    pub(crate) async fn acquire(&self) -> Core<'_> {
        // The semaphore is never closed, so acquire cannot fail.
        let permit = self.sem.acquire().await.ok();
        self.busy.fetch_add(1, Ordering::Relaxed);
        Core {
            cores: self,
            permit,
        }
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
    use super::*;

    #[tokio::test]
    async fn shrink_while_busy_then_grow() {
        let c = Cores::new(2);
        let a = c.acquire().await;
        let b = c.acquire().await;
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
