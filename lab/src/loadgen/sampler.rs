//! Sampling: once a second during a variant's run, the process's CPU share, the server
//! model's counters and the fork's concurrency limits go into the recorder, and the progress
//! bar shows the figures so far.

use std::sync::Arc;
use std::time::Duration;

use indicatif::ProgressBar;
use tokio::time::Instant;

use super::client::{overload_stats_of, LabClient};
use super::control::{counter_deltas, Control};
use super::metrics::Recorder;
use super::sys::CpuMeter;

/// Samples CPU, the server's counters and `clients`' concurrency limits once a second, and
/// updates the progress bar.
pub(crate) async fn sampler(
    recorder: Arc<Recorder>,
    control: Arc<Control>,
    clients: Vec<Arc<dyn LabClient>>,
    poll_server: bool,
    progress: ProgressBar,
    label: String,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut cpu = CpuMeter::new();
    let mut last_server = if poll_server {
        control.overload_status().await
    } else {
        None
    };
    let start = recorder.start();
    let mut waits_before = overload_stats_of(&clients).map_or(0, |s| s.concurrency_waits);
    let mut sec = 0usize;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let base = progress.position();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        let now = Instant::now();
        if now < start {
            continue;
        }
        let elapsed = now - start;
        progress.set_position(base + elapsed.as_secs());
        let s = elapsed.as_secs() as usize;
        if s > sec {
            // Second `sec` just ended.
            if let Some(p) = cpu.sample() {
                recorder.set_cpu(sec, p);
            }
            // Only the fork keeps statistics, and only with `adaptiveConcurrency` a limit (at
            // least one slot per server): without one the columns stay empty.
            if let Some(stats) = overload_stats_of(&clients).filter(|s| s.concurrency_limit > 0) {
                let waits = stats.concurrency_waits.saturating_sub(waits_before);
                recorder.set_concurrency(sec, stats.concurrency_limit, waits);
                waits_before = stats.concurrency_waits;
            }
            if poll_server {
                if let Some(now_status) = control.overload_status().await {
                    if let Some(prev) = &last_server {
                        recorder.add_server(sec, &counter_deltas(prev, &now_status));
                    }
                    last_server = Some(now_status);
                }
            }
            let (offered, good) = recorder.peek(sec);
            progress.set_message(format!(
                "{label}  t={s}s offered {offered}/s goodput {good}/s"
            ));
            sec = s;
        }
    }
}
