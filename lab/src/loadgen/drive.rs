//! Driving: walks the arrival schedules open-loop and books every request's outcome.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::task::JoinSet;
use tokio::time::Instant;

use rand::{Rng, SeedableRng};

use super::client::{LabClient, OpSpec};
use super::config::{OnDeadline, OpMix, ShardKeys};
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
    /// What the application does at its deadline.
    pub on_deadline: OnDeadline,
    /// Times the application retries an overload error before its deadline.
    pub app_retries: u32,
    /// Which shards each request touches (persona `sharded`), so that requests touching only
    /// cold shards are also booked as such (`Recorder::cold_request`); `None`: not sharded.
    pub shard_keys: Option<ShardKeys>,
}

impl RequestOpts {
    /// Options with the application's defaults: it waits `deadline`, lets the driver call go
    /// on after it (`continue`) and does not retry itself.
    pub fn new(deadline: Duration, drain: Duration, range_len: i64) -> RequestOpts {
        RequestOpts {
            deadline,
            drain,
            range_len,
            max_time: None,
            on_deadline: OnDeadline::Continue,
            app_retries: 0,
            shard_keys: None,
        }
    }
}

/// What [`drive_all`] saw besides the recorder's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriveStats {
    /// Requests sent.
    pub sent: u64,
    /// Requests still running when the drain period ended.
    pub unfinished: u64,
}

/// The id (`comment.labReq`) of the `index`-th request (0-based) of instance `instance`'s
/// schedule: the same for the same scheduled request in every variant of a repetition, whatever
/// order the instances' tasks ran in, because the server model keys its random draws
/// (rejections, ticket wake-ups) by it (common random numbers, issue 27). Never 0.
pub fn request_id(instance: usize, index: u64) -> u64 {
    ((instance as u64 & 0xffff) << 40) | ((index & ((1 << 40) - 1)) + 1)
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
    let mut drivers = JoinSet::new();
    for (instance, (client, arrivals)) in clients.into_iter().zip(schedules).enumerate() {
        let recorder = recorder.clone();
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
                    req: request_id(instance, sent - 1),
                    kind: a.kind,
                    key: a.key,
                    range_len: opts.range_len,
                    max_time: opts.max_time,
                    give_up_at: None,
                };
                requests.spawn_on(
                    request(client.clone(), op, when, recorder.clone(), opts),
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

/// What the application's driver calls for one request added up to, shared with the task
/// that makes them so that a call the application dropped still leaves its count.
#[derive(Debug, Default)]
struct Tally {
    attempts: AtomicU32,
    tries: AtomicU32,
    conn_wait_us: AtomicU64,
    service_us: AtomicU64,
}

impl Tally {
    fn add(&self, r: &AttemptReport) {
        self.attempts.fetch_add(r.attempts, Ordering::Relaxed);
        self.tries.fetch_add(1, Ordering::Relaxed);
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.conn_wait_us
            .fetch_add(us(r.conn_wait), Ordering::Relaxed);
        self.service_us.fetch_add(us(r.service), Ordering::Relaxed);
    }

    fn report(&self, outcome: Result<(), ErrorClass>) -> AttemptReport {
        AttemptReport {
            outcome,
            attempts: self.attempts.load(Ordering::Relaxed),
            conn_wait: Duration::from_micros(self.conn_wait_us.load(Ordering::Relaxed)),
            service: Duration::from_micros(self.service_us.load(Ordering::Relaxed)),
            tries: self.tries.load(Ordering::Relaxed),
        }
    }
}

/// The application's side of one request: calls the driver, and while the call failed with an
/// overload error, the application's deadline (`give_up`) has not passed, it has retries left
/// and the client's shared retry budget (the fork's, when on) admits one, calls it again at
/// once (as applications that retry "a few times" do).
async fn app_call(
    client: Arc<dyn LabClient>,
    op: OpSpec,
    give_up: Instant,
    retries: u32,
    tally: Arc<Tally>,
) -> AttemptReport {
    // Bounded: at most `retries + 1` driver calls.
    for tried in 0..=retries {
        let r = client.run(op.clone()).await;
        tally.add(&r);
        // The budget is asked last: admitting a retry charges it.
        let retry = r.outcome == Err(ErrorClass::Overload)
            && tried < retries
            && Instant::now() < give_up
            && client.app_may_retry();
        if !retry {
            return tally.report(r.outcome);
        }
    }
    tally.report(Err(ErrorClass::Overload))
}

async fn request(
    client: Arc<dyn LabClient>,
    op: OpSpec,
    scheduled: Instant,
    recorder: Arc<Recorder>,
    opts: RequestOpts,
) {
    let deadline = opts.deadline;
    let begun = Instant::now();
    // Decided from the request's keys before it runs: its outcome cannot change which shards
    // it touches.
    let cold = opts
        .shard_keys
        .is_some_and(|k| k.is_cold(op.kind, op.key, op.range_len));
    let op = OpSpec {
        give_up_at: SystemTime::now().checked_add(deadline),
        ..op
    };
    let req = op.req;
    let tally = Arc::new(Tally::default());
    let call = app_call(
        client.clone(),
        op,
        begun + deadline,
        opts.app_retries,
        tally.clone(),
    );
    match opts.on_deadline {
        OnDeadline::Continue => {
            let mut call = tokio::spawn(call);
            let failed = |_| AttemptReport {
                outcome: Err(ErrorClass::Other),
                attempts: 0,
                conn_wait: Duration::ZERO,
                service: Duration::ZERO,
                tries: 0,
            };
            match tokio::time::timeout(deadline, &mut call).await {
                Ok(r) => {
                    let report = r.unwrap_or_else(failed);
                    recorder.in_time(scheduled, begun.elapsed(), &report);
                    if cold {
                        recorder.cold_request(scheduled, report.outcome.is_ok());
                    }
                }
                Err(_) => {
                    recorder.timed_out(scheduled, deadline);
                    if cold {
                        recorder.cold_request(scheduled, false);
                    }
                    let report = call.await.unwrap_or_else(failed);
                    recorder.late(scheduled, &report);
                }
            }
        }
        OnDeadline::Drop => match tokio::time::timeout(deadline, call).await {
            Ok(report) => {
                recorder.in_time(scheduled, begun.elapsed(), &report);
                if cold {
                    recorder.cold_request(scheduled, report.outcome.is_ok());
                }
            }
            Err(_) => {
                // The driver's future is gone; the call in flight counts its attempts so far.
                recorder.timed_out(scheduled, deadline);
                if cold {
                    recorder.cold_request(scheduled, false);
                }
                let in_flight = client.forget(req);
                recorder.dropped(
                    scheduled,
                    tally.attempts.load(Ordering::Relaxed) + in_flight,
                    tally.tries.load(Ordering::Relaxed) + 1,
                );
            }
        },
    }
}

/// What a closed loop runs: `workers` tasks spread over the clients, each sending its next
/// request when the previous one finished, from `recorder.start()` for `length`.
#[derive(Debug, Clone)]
pub struct ClosedLoop {
    /// Workers in all.
    pub workers: usize,
    /// How long.
    pub length: Duration,
    /// Operation mix.
    pub mix: OpMix,
    /// Keys are drawn uniformly from `0..docs`.
    pub docs: i64,
    /// RNG seed; worker `w` uses `seed + w`.
    pub seed: u64,
}

/// Drives a closed loop (`fast-path`): every request is booked as offered in the second it
/// left, with no schedule lag (a closed loop has no schedule to miss). Returns once every
/// worker stopped, at most `deadline + drain` after the end.
pub async fn drive_closed(
    clients: &[Arc<dyn LabClient>],
    spec: &ClosedLoop,
    recorder: Arc<Recorder>,
    opts: RequestOpts,
) -> DriveStats {
    let start = recorder.start();
    drive_closed_from(clients, spec, recorder, opts, start).await
}

/// [`drive_closed`] from `start` rather than `recorder.start()`: for a slice of a run whose
/// recorder books it into a later second (`runner`'s interleaved closed loops).
pub async fn drive_closed_from(
    clients: &[Arc<dyn LabClient>],
    spec: &ClosedLoop,
    recorder: Arc<Recorder>,
    opts: RequestOpts,
    start: Instant,
) -> DriveStats {
    let end = start + spec.length;
    let next_req = Arc::new(AtomicU64::new(1));
    let mut workers = JoinSet::new();
    for w in 0..spec.workers.max(1) {
        let client = clients[w % clients.len().max(1)].clone();
        let (recorder, next_req, mix) = (recorder.clone(), next_req.clone(), spec.mix.clone());
        let (docs, seed) = (spec.docs.max(1), spec.seed.wrapping_add(w as u64));
        workers.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut sent = 0u64;
            tokio::time::sleep_until(start).await;
            // Bounded by the clock: each pass takes at least one request's round trip, and
            // the loop ends at `end`.
            loop {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                recorder.offered(now, Duration::ZERO);
                sent += 1;
                let op = OpSpec {
                    req: next_req.fetch_add(1, Ordering::Relaxed),
                    kind: mix.pick(rng.random::<f64>()),
                    key: rng.random_range(0..docs),
                    range_len: opts.range_len,
                    max_time: opts.max_time,
                    give_up_at: None,
                };
                request(client.clone(), op, now, recorder.clone(), opts).await;
            }
            sent
        });
    }
    let mut stats = DriveStats::default();
    let joined = tokio::time::timeout_at(end + opts.deadline + opts.drain, async {
        while let Some(r) = workers.join_next().await {
            stats.sent += r.unwrap_or(0);
        }
    })
    .await;
    if joined.is_err() {
        stats.unfinished = workers.len() as u64;
        workers.abort_all();
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::request_id;

    #[test]
    fn request_ids_name_a_scheduled_request_and_never_collide() {
        assert_eq!(request_id(0, 0), 1);
        assert_eq!(request_id(2, 5), request_id(2, 5));
        let mut seen = std::collections::HashSet::new();
        for instance in 0..8 {
            for index in 0..2_000 {
                assert!(
                    seen.insert(request_id(instance, index)),
                    "{instance} {index}"
                );
            }
        }
        assert!(!seen.contains(&0));
    }
}
