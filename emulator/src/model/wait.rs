//! Waiting with a deadline and, optionally, the client's disconnect signal.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use tokio::time::Instant;

/// Why a wait ended without its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Interrupt {
    /// The request's deadline passed.
    Deadline,
    /// The client went away and the model kills such requests.
    Disconnected,
}

/// Watches the "client went away" future of one request.
pub(crate) struct Watch<'a, F> {
    fut: Pin<&'a mut F>,
    fired: bool,
    kill: bool,
}

impl<'a, F: Future<Output = ()>> Watch<'a, F> {
    pub(crate) fn new(fut: Pin<&'a mut F>, kill: bool) -> Self {
        Watch {
            fut,
            fired: false,
            kill,
        }
    }

    /// Whether the disconnect has been seen (by [`Watch::check`] or a wait).
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

    /// Should the request stop now because its client is gone?
    pub(crate) async fn killed(&mut self) -> bool {
        self.check().await && self.kill
    }

    /// Runs `work` until it finishes, the deadline passes, or (when killing on disconnect) the
    /// client goes away.
    pub(crate) async fn run<T>(
        &mut self,
        deadline: Instant,
        work: impl Future<Output = T>,
    ) -> Result<T, Interrupt> {
        let watch_disconnect = self.kill && !self.fired;
        let fut = &mut self.fut;
        let fired = &mut self.fired;
        tokio::select! {
            biased;
            _ = fut.as_mut(), if watch_disconnect => {
                *fired = true;
                Err(Interrupt::Disconnected)
            }
            _ = tokio::time::sleep_until(deadline) => Err(Interrupt::Deadline),
            v = work => Ok(v),
        }
    }
}
