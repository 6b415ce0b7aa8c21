//! Driving: walks the arrival schedules open-loop and books every request's outcome.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::client::{LabClient, OpSpec};
use super::metrics::{new_hist, rec, AttemptReport, ErrorClass, Recorder};
use super::schedule::{self, Arrival};

/// Per-request settings of the open-loop driver.
#[derive(Debug, Clone, Copy)]
pub struct RequestOpts {
    /// The application's deadline.
    pub deadline: Duration,
    /// How long to wait for late completions after the schedule ends.
    pub drain: Duration,
    /// Documents per range read.
    pub range_len: i64,
    /// `maxTimeMS` sent on reads.
    pub max_time: Option<Duration>,
}

/// What [`drive_all`] saw besides the recorder's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriveStats {
    /// Requests sent.
    pub sent: u64,
    /// Requests still running when the drain period ended.
    pub unfinished: u64,
}

/// Drives every instance's schedule open-loop from `recorder.start()`: each request is a task
/// that spawns the driver call and waits for it at most `deadline` (the way applications
/// enforce deadlines); a request that misses it is booked as a client-deadline error, and its
/// late completion separately. Returns once every request finished or the drain period ran
/// out.
///
/// The schedule is walked on a thread and single-threaded runtime of its own, so busy workers
/// of the caller's runtime (driver, event handlers) never delay a request's departure; the
/// requests themselves run on the caller's runtime.
pub async fn drive_all(
    clients: &[Arc<dyn LabClient>],
    schedules: &[Vec<Arrival>],
    recorder: Arc<Recorder>,
    opts: RequestOpts,
) -> DriveStats {
    let handle = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (c, s, r) = (clients.to_vec(), schedules.to_vec(), recorder.clone());
    let h = handle.clone();
    let spawned = std::thread::Builder::new()
        .name("lab-scheduler".into())
        .spawn(move || {
            let stats = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => Some(rt.block_on(drive_on(c, s, r, opts, h))),
                Err(_) => None,
            };
            let _ = tx.send(stats);
        });
    if spawned.is_ok() {
        if let Ok(Some(stats)) = rx.await {
            return stats;
        }
    }
    // No scheduler thread: walk the schedule on the caller's runtime.
    drive_on(clients.to_vec(), schedules.to_vec(), recorder, opts, handle).await
}

async fn drive_on(
    clients: Vec<Arc<dyn LabClient>>,
    schedules: Vec<Vec<Arrival>>,
    recorder: Arc<Recorder>,
    opts: RequestOpts,
    handle: tokio::runtime::Handle,
) -> DriveStats {
    let next_req = Arc::new(AtomicU64::new(1));
    let mut drivers = JoinSet::new();
    for (client, arrivals) in clients.into_iter().zip(schedules) {
        let recorder = recorder.clone();
        let next_req = next_req.clone();
        let handle = handle.clone();
        drivers.spawn(async move {
            let mut requests = JoinSet::new();
            let start = recorder.start();
            let mut sent = 0u64;
            // Offered load and lag are counted here and merged at the end, so the schedule
            // never waits for the recorder's lock.
            let mut local: Vec<(u64, hdrhistogram::Histogram<u64>)> = Vec::new();
            schedule::drive(start, &arrivals, |a, when, lag| {
                while requests.try_join_next().is_some() {}
                let sec = (a.at.as_secs() as usize).min(24 * 3600);
                if local.len() <= sec {
                    local.resize_with(sec + 1, || (0, new_hist()));
                }
                local[sec].0 += 1;
                rec(&mut local[sec].1, lag);
                sent += 1;
                let op = OpSpec {
                    req: next_req.fetch_add(1, Ordering::Relaxed),
                    kind: a.kind,
                    key: a.key,
                    range_len: opts.range_len,
                    max_time: opts.max_time,
                    give_up_at: None,
                };
                requests.spawn_on(
                    request(client.clone(), op, when, recorder.clone(), opts.deadline),
                    &handle,
                );
            })
            .await;
            recorder.merge_offered(local);
            let drained = tokio::time::timeout(opts.deadline + opts.drain, async {
                while requests.join_next().await.is_some() {}
            })
            .await;
            let unfinished = if drained.is_err() {
                requests.len() as u64
            } else {
                0
            };
            requests.abort_all();
            (sent, unfinished)
        });
    }
    let mut stats = DriveStats::default();
    while let Some(r) = drivers.join_next().await {
        if let Ok((sent, unfinished)) = r {
            stats.sent += sent;
            stats.unfinished += unfinished;
        }
    }
    stats
}

async fn request(
    client: Arc<dyn LabClient>,
    op: OpSpec,
    scheduled: Instant,
    recorder: Arc<Recorder>,
    deadline: Duration,
) {
    let begun = Instant::now();
    let op = OpSpec {
        give_up_at: SystemTime::now().checked_add(deadline),
        ..op
    };
    let mut call = tokio::spawn(client.run(op));
    let failed = |_| AttemptReport {
        outcome: Err(ErrorClass::Other),
        attempts: 0,
        conn_wait: Duration::ZERO,
        service: Duration::ZERO,
    };
    match tokio::time::timeout(deadline, &mut call).await {
        Ok(r) => {
            let report = r.unwrap_or_else(failed);
            recorder.in_time(scheduled, begun.elapsed(), &report);
        }
        Err(_) => {
            recorder.timed_out(scheduled, deadline);
            let report = call.await.unwrap_or_else(failed);
            recorder.late(scheduled, &report);
        }
    }
}
