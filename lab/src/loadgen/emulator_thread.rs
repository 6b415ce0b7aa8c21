//! Threads: the in-process emulator runs on a runtime and threads of its own.

use emulator::{Emulator, EmulatorConfig};

/// The emulator on a runtime (and threads) of its own, so that its synchronous work never
/// delays the generator's timers on the lab's runtime.
pub struct EmulatorThread {
    /// Connection string.
    pub uri: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl EmulatorThread {
    /// Starts the emulator on a new two-worker runtime.
    pub async fn start(config: EmulatorConfig) -> Result<EmulatorThread, String> {
        let (uri_tx, uri_rx) = tokio::sync::oneshot::channel::<Result<String, String>>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("lab-emulator".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("lab-emulator-worker")
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = uri_tx.send(Err(format!("emulator runtime: {e}")));
                        return;
                    }
                };
                rt.block_on(async move {
                    match Emulator::start(config).await {
                        Ok(emu) => {
                            let _ = uri_tx.send(Ok(emu.uri()));
                            let _ = stop_rx.await;
                            emu.shutdown().await;
                        }
                        Err(e) => {
                            let _ = uri_tx.send(Err(format!("cannot start the emulator: {e}")));
                        }
                    }
                });
                let _ = done_tx.send(());
            })
            .map_err(|e| format!("emulator thread: {e}"))?;
        let uri = uri_rx
            .await
            .map_err(|_| "the emulator thread ended early".to_string())??;
        Ok(EmulatorThread {
            uri,
            stop: Some(stop_tx),
            done: Some(done_rx),
        })
    }

    /// Shuts the emulator down and waits for its runtime to finish.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(d) = self.done.take() {
            let _ = d.await;
        }
    }
}
