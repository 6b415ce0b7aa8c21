//! Interrupt points: where a request notices that its deadline has passed or its client has
//! gone, as mongod's `OperationContext::checkForInterrupt` does.
//!
//! mongod does not watch a request continuously. It checks at interrupt points: an
//! interruptible wait (the ticket wait wakes at the request's deadline and every ~500 ms), and
//! while running at yield points. A thread waiting for a CPU is not at one. The client is
//! checked only for requests marked kill-on-client-disconnect, at most once every 500 ms, the
//! first time 500 ms after the mark (docs/emulator.md, "What mongod charges").

use std::future::Future;
use std::pin::{pin, Pin};
use std::task::Poll;

use tokio::time::{Duration, Instant};

/// Why a request stopped at an interrupt point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Interrupt {
    /// The request's deadline passed.
    Deadline,
    /// The client went away and the request is killed on disconnect.
    Disconnected,
}

/// The interrupt state of one request: its deadline and, optionally, its client's disconnect
/// signal.
pub(crate) struct Watch<'a, F> {
    fut: Pin<&'a mut F>,
    fired: bool,
    /// The request is killed when its client goes (killOnClientDisconnect and a marked kind).
    kill: bool,
    /// Least time between two client checks, and between wake-ups of an interruptible wait.
    interval: Duration,
    /// The last client check (the mark, at first), like mongod's `_lastClientCheck`.
    last_client_check: Instant,
}

impl<'a, F: Future<Output = ()>> Watch<'a, F> {
    /// A watch whose kill-on-disconnect mark (if `kill`) is set at `marked_at`.
    pub(crate) fn new(
        fut: Pin<&'a mut F>,
        kill: bool,
        interval: Duration,
        marked_at: Instant,
    ) -> Self {
        Watch {
            fut,
            fired: false,
            kill,
            interval: interval.max(Duration::from_millis(1)),
            last_client_check: marked_at,
        }
    }

    /// Whether the disconnect has been seen.
    pub(crate) fn fired(&self) -> bool {
        self.fired
    }

    /// Polls the signal once without waiting; true once the client is gone.
    pub(crate) async fn check(&mut self) -> bool {
        if !self.fired {
            let fut = &mut self.fut;
            self.fired = std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(true),
                Poll::Pending => Poll::Ready(false),
            })
            .await;
        }
        self.fired
    }

    /// An interrupt point now: the deadline first (as `checkForInterrupt`), then, for a marked
    /// request whose last client check is more than `interval` ago, the client.
    pub(crate) async fn interrupt_point(&mut self, deadline: Instant) -> Option<Interrupt> {
        let now = Instant::now();
        if now >= deadline {
            return Some(Interrupt::Deadline);
        }
        if self.kill && now > self.last_client_check + self.interval {
            self.last_client_check = now;
            if self.check().await {
                return Some(Interrupt::Disconnected);
            }
        }
        None
    }

    /// An interruptible wait for `work`: wakes at `deadline` and every `interval` for an
    /// interrupt point, and ends early only there.
    pub(crate) async fn wait<T>(
        &mut self,
        deadline: Instant,
        work: impl Future<Output = T>,
    ) -> Result<T, Interrupt> {
        let mut work = pin!(work);
        // Each turn either ends or sleeps until the next wake-up, at least a millisecond later;
        // the deadline ends the loop.
        loop {
            let wake = deadline.min(Instant::now() + self.interval);
            if let Ok(v) = tokio::time::timeout_at(wake, work.as_mut()).await {
                return Ok(v);
            }
            if let Some(i) = self.interrupt_point(deadline).await {
                return Err(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_wait_wakes_at_its_deadline() {
        let t0 = Instant::now();
        let never = pin!(std::future::pending::<()>());
        let mut w = Watch::new(never, true, Duration::from_millis(500), t0);
        let r = w
            .wait(
                t0 + Duration::from_millis(120),
                std::future::pending::<()>(),
            )
            .await;
        assert_eq!(r, Err(Interrupt::Deadline));
        assert_eq!(t0.elapsed(), Duration::from_millis(120));
    }

    #[tokio::test(start_paused = true)]
    async fn a_disconnect_is_noticed_at_the_first_check_after_the_interval() {
        // The client goes at 10 ms; the first client check is allowed after 500 ms, and the
        // wait wakes every 500 ms: noticed at the wake-up at 1 s (500 ms is not "more than").
        let t0 = Instant::now();
        let gone = pin!(tokio::time::sleep(Duration::from_millis(10)));
        let mut w = Watch::new(gone, true, Duration::from_millis(500), t0);
        let r = w
            .wait(t0 + Duration::from_secs(5), std::future::pending::<()>())
            .await;
        assert_eq!(r, Err(Interrupt::Disconnected));
        assert_eq!(t0.elapsed(), Duration::from_secs(1));
        // Unmarked requests never notice.
        let t0 = Instant::now();
        let gone = pin!(tokio::time::sleep(Duration::from_millis(10)));
        let mut w = Watch::new(gone, false, Duration::from_millis(500), t0);
        let r = w
            .wait(t0 + Duration::from_secs(2), std::future::pending::<()>())
            .await;
        assert_eq!(r, Err(Interrupt::Deadline));
        assert!(!w.fired());
    }

    #[tokio::test(start_paused = true)]
    async fn work_that_finishes_is_returned() {
        let t0 = Instant::now();
        let never = pin!(std::future::pending::<()>());
        let mut w = Watch::new(never, true, Duration::from_millis(50), t0);
        let r = w
            .wait(t0 + Duration::from_secs(1), async {
                tokio::time::sleep(Duration::from_millis(170)).await;
                7
            })
            .await;
        assert_eq!(r, Ok(7));
        assert_eq!(t0.elapsed(), Duration::from_millis(170));
    }
}
