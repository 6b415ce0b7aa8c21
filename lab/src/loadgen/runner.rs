//! Runs the variants one after another against one in-process emulator.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bson::{doc, Bson, Document};
use indicatif::ProgressBar;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::client::{self, LabClient, OpSpec, Sink};
use super::config::{with_options, LabConfig, OpKind, Persona, ServerMode, Variant, MODEL_CORES};
use super::metrics::{new_hist, rec, AttemptReport, ErrorClass, Recorder, Second};
use super::schedule::{self, Arrival, ScheduleSpec};
use super::summary::{summarize, RunSummary};
use super::sys::CpuMeter;
use emulator::{Emulator, EmulatorConfig, Topology};

/// Database and collection the lab uses.
pub const DB: &str = "lab";
/// Collection of the lab's documents.
pub const COLL: &str = "items";

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

/// One run of one variant.
#[derive(Debug, Clone)]
pub struct VariantRun {
    /// The variant.
    pub variant: Variant,
    /// Repetition (0-based).
    pub rep: usize,
    /// Per-second figures.
    pub seconds: Vec<Second>,
    /// The figures that matter.
    pub summary: RunSummary,
}

/// Everything a lab run produced.
#[derive(Debug, Clone)]
pub struct LabRun {
    /// The configuration.
    pub config: LabConfig,
    /// Capacity used (ops/s).
    pub capacity: f64,
    /// How the capacity was found (given, derived, calibrated).
    pub capacity_note: String,
    /// The server model configuration applied (model mode).
    pub model_config: Option<Document>,
    /// The connection string of the emulator.
    pub uri: String,
    /// Every variant run, in order.
    pub runs: Vec<VariantRun>,
    /// Wall-clock length of the whole run.
    pub wall: Duration,
}

/// The `labOverload` settings of model mode at `capacity`: the ingress limiter admits
/// `cfg.limiter_share × capacity` per second (off when the share is 0).
pub fn model_document(cfg: &LabConfig, capacity: f64) -> Result<Document, String> {
    let mut d = doc! {
        "enabled": true,
        "seed": cfg.seed as i64,
        "cores": MODEL_CORES as i64,
        "costs": {
            "pointReadMs": 2.0, "rangeReadMs": 5.0, "writeMs": 3.0, "scanMs": 30.0,
        },
        "tickets": { "mode": "fixed", "read": 8i64, "write": 8i64 },
        "limiter": {
            "enabled": cfg.limiter_share > 0.0,
            "ratePerSec": (capacity * cfg.limiter_share).max(1.0),
            "burstCapacitySecs": 0.25,
            "maxQueueDepth": 0i64,
        },
    };
    if let Some(v) = &cfg.model_overrides {
        let over = bson::to_bson(v).map_err(|e| format!("--model-json: {e}"))?;
        match over {
            Bson::Document(o) => merge(&mut d, &o),
            _ => return Err("--model-json must be a JSON object".into()),
        }
    }
    Ok(d)
}

fn merge(base: &mut Document, over: &Document) {
    for (k, v) in over {
        match (base.get_mut(k), v) {
            (Some(Bson::Document(b)), Bson::Document(o)) => merge(b, o),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Numeric fields of a document, flattened to dotted keys.
pub fn flatten_numbers(d: &Document) -> BTreeMap<String, f64> {
    fn walk(prefix: &str, d: &Document, out: &mut BTreeMap<String, f64>) {
        for (k, v) in d {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                Bson::Double(x) => {
                    out.insert(key, *x);
                }
                Bson::Int32(x) => {
                    out.insert(key, f64::from(*x));
                }
                Bson::Int64(x) => {
                    out.insert(key, *x as f64);
                }
                Bson::Document(sub) => walk(&key, sub, out),
                _ => {}
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", d, &mut out);
    out
}

/// The control connection to the emulator (the fork, without lab event handlers).
struct Control {
    client: mongodb::Client,
}

impl Control {
    async fn connect(uri: &str) -> Result<Control, String> {
        let client = mongodb::Client::with_uri_str(with_options(uri, "appName=lab-control"))
            .await
            .map_err(|e| e.to_string())?;
        Ok(Control { client })
    }

    async fn admin(&self, cmd: Document) -> Result<Document, String> {
        self.client
            .database("admin")
            .run_command(cmd)
            .await
            .map_err(|e| e.to_string())
    }

    async fn seed(&self, docs: i64) -> Result<(), String> {
        let coll = self.client.database(DB).collection::<Document>(COLL);
        coll.drop().await.map_err(|e| e.to_string())?;
        let pad = "x".repeat(200);
        let mut batch = Vec::new();
        for i in 0..docs {
            batch.push(doc! { "_id": i, "n": 0i32, "pad": pad.clone() });
            if batch.len() == 1000 || i == docs - 1 {
                coll.insert_many(std::mem::take(&mut batch))
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// `serverStatus.labOverload`, flattened; `None` when the server has no model section.
    async fn overload_status(&self) -> Option<BTreeMap<String, f64>> {
        let st = self.admin(doc! { "serverStatus": 1 }).await.ok()?;
        st.get_document("labOverload").ok().map(flatten_numbers)
    }

    /// Waits (at most `limit`) until the server model has no request in flight, so that one
    /// variant's leftovers do not load the next. True when idle (or without a model).
    async fn wait_idle(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            let busy = self
                .overload_status()
                .await
                .and_then(|m| m.get("gauges.inFlight").copied())
                .unwrap_or(0.0);
            if busy <= 0.0 {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn set_model(&self, model: &Document) -> Result<(), String> {
        self.admin(doc! { "setParameter": 1, "labOverload": { "enabled": false } })
            .await
            .and(
                self.admin(doc! { "setParameter": 1, "labOverload": model.clone() })
                    .await,
            )
            .map(|_| ())
            .map_err(|e| {
                let short = e.split(", labels:").next().unwrap_or(&e).to_string();
                format!("server model not available (setParameter labOverload failed: {short}); use --server failpoint")
            })
    }

    async fn fail_point(&self, probability: f64) -> Result<(), String> {
        let cmd = if probability <= 0.0 {
            doc! { "configureFailPoint": "failCommand", "mode": "off" }
        } else {
            doc! {
                "configureFailPoint": "failCommand",
                "mode": { "activationProbability": probability },
                "data": {
                    "failCommands": ["find", "insert", "update"],
                    "errorCode": 462i32,
                    "errorLabels": ["SystemOverloadedError", "RetryableError"],
                },
            }
        };
        self.admin(cmd).await.map(|_| ())
    }
}

/// Keeps the share of attempts the fail point rejects at `1 − capacity / attempt rate`, so the
/// attempts that get through stay at capacity (a rate limiter built from `failCommand`).
async fn failpoint_controller(
    control: Arc<Control>,
    attempts: Arc<AtomicU64>,
    capacity: f64,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut window: std::collections::VecDeque<(Instant, u64)> = Default::default();
    let mut current = 0.0f64;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        let now = Instant::now();
        window.push_back((now, attempts.load(Ordering::Relaxed)));
        while window.len() > 2 && now - window[0].0 > Duration::from_millis(500) {
            window.pop_front();
        }
        let (t0, a0) = window[0];
        let dt = (now - t0).as_secs_f64();
        if dt < 0.05 {
            continue;
        }
        let rate = (window[window.len() - 1].1 - a0) as f64 / dt;
        let p = if rate > capacity {
            (1.0 - capacity / rate).clamp(0.0, 0.95)
        } else {
            0.0
        };
        if (p - current).abs() >= 0.02 || (p == 0.0 && current != 0.0) {
            let p = (p * 100.0).round() / 100.0;
            if control.fail_point(p).await.is_ok() {
                current = p;
            }
        }
    }
    let _ = control.fail_point(0.0).await;
}

/// Samples CPU and the server's counters once a second, and updates the progress bar.
async fn sampler(
    recorder: Arc<Recorder>,
    control: Arc<Control>,
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

/// Deltas of the `counters.*` figures between two flattened snapshots.
pub fn counter_deltas(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter(|(k, _)| k.starts_with("counters."))
        .map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0.0);
            (k.trim_start_matches("counters.").to_string(), d.max(0.0))
        })
        .collect()
}

/// Runs the whole lab: starts the emulator, seeds it, runs every variant (`repeats` times),
/// and returns the figures.
pub async fn run(cfg: &LabConfig, progress: &ProgressBar) -> Result<LabRun, String> {
    let wall = std::time::Instant::now();
    let capacity = cfg.effective_capacity();
    let topology = match cfg.persona {
        Persona::Replicaset => Topology::ReplicaSet {
            name: "lab".into(),
            members: 1,
        },
        Persona::Standalone => Topology::Standalone,
    };
    let emulator = EmulatorThread::start(EmulatorConfig {
        topology,
        ..EmulatorConfig::default()
    })
    .await?;
    let uri = emulator.uri.clone();
    let result = run_against(cfg, capacity, &uri, progress).await;
    emulator.stop().await;
    let (model_config, runs, capacity, capacity_note) = result?;
    Ok(LabRun {
        config: cfg.clone(),
        capacity,
        capacity_note,
        model_config,
        uri,
        runs,
        wall: wall.elapsed(),
    })
}

type Runs = (Option<Document>, Vec<VariantRun>, f64, String);

/// Measures what the server model completes per second with the run's operation mix: 48
/// closed-loop workers on one fork client (no retries) for 2 s, counting successes in the last
/// 1.5 s.
async fn calibrate(cfg: &LabConfig, uri: &str) -> Result<f64, String> {
    use rand::{Rng, SeedableRng};
    let recorder = Arc::new(Recorder::new(Instant::now()));
    let sink = Arc::new(Sink::new(recorder, Arc::new(AtomicU64::new(0))));
    let c = client::connect(
        super::config::Driver::Fork,
        &with_options(uri, "maxPoolSize=64&maxAdaptiveRetries=0"),
        "lab-calibrate",
        DB,
        COLL,
        sink,
    )
    .await?;
    c.warm_up().await?;
    let done = Arc::new(AtomicU64::new(0));
    let warm = Instant::now() + Duration::from_millis(500);
    let window = Duration::from_millis(1500);
    let end = warm + window;
    let mut workers = JoinSet::new();
    for w in 0..48u64 {
        let (c, done, mix) = (c.clone(), done.clone(), cfg.mix.clone());
        let (docs, seed) = (cfg.docs.max(1), cfg.seed.wrapping_add(7919 * (w + 1)));
        workers.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut req = (w + 1) << 40;
            while Instant::now() < end {
                req += 1;
                let op = OpSpec {
                    req,
                    kind: mix.pick(rng.random::<f64>()),
                    key: rng.random_range(0..docs),
                    range_len: mix.range_len,
                    max_time: None,
                    give_up_at: None,
                };
                let r = c.run(op).await;
                let now = Instant::now();
                if r.outcome.is_ok() && now >= warm && now < end {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while workers.join_next().await.is_some() {}
    c.shutdown().await;
    Ok(done.load(Ordering::Relaxed) as f64 / window.as_secs_f64())
}

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

async fn run_against(
    cfg: &LabConfig,
    capacity: f64,
    uri: &str,
    progress: &ProgressBar,
) -> Result<Runs, String> {
    let control = Arc::new(Control::connect(uri).await?);
    control.seed(cfg.docs).await?;
    let mut capacity = capacity;
    let mut capacity_note = if cfg.capacity > 0.0 {
        "given".to_string()
    } else if cfg.server_mode == ServerMode::Model {
        "derived from the model's cores and costs".to_string()
    } else {
        "default for this server mode".to_string()
    };
    let model = match cfg.server_mode {
        ServerMode::Model => {
            // Calibration measures what the cores and tickets complete, so no limiter.
            let mut unlimited = model_document(cfg, capacity)?;
            if let Ok(limiter) = unlimited.get_document_mut("limiter") {
                limiter.insert("enabled", false);
            }
            control.set_model(&unlimited).await?;
            if cfg.capacity <= 0.0 {
                progress.set_message("calibrating the server model's capacity");
                let measured = calibrate(cfg, uri).await?;
                if measured > 0.0 && measured < capacity {
                    capacity_note = format!(
                        "calibrated: the model completed {measured:.0} ops/s of this mix \
                         (nominal {capacity:.0} from cores and costs)"
                    );
                    capacity = measured;
                }
            }
            let d = model_document(cfg, capacity)?;
            control.set_model(&d).await?;
            Some(d)
        }
        _ => None,
    };
    let duration = cfg.scenario.duration();
    let len = duration.as_secs_f64().ceil() as usize;
    let mut runs = Vec::new();
    for rep in 0..cfg.repeats.max(1) {
        let schedules = schedule::build(&ScheduleSpec {
            scenario: &cfg.scenario,
            capacity,
            instances: cfg.instances,
            arrivals: cfg.arrivals,
            mix: &cfg.mix,
            docs: cfg.docs,
            seed: cfg.seed.wrapping_add(rep as u64 * 1000),
        });
        for variant in &cfg.variants {
            if let Some(m) = &model {
                progress.set_message(format!(
                    "{}: waiting for the server to go idle",
                    variant.name
                ));
                control.wait_idle(Duration::from_secs(10)).await;
                control.set_model(m).await?;
            }
            let server_before = control.overload_status().await;
            let label = if cfg.repeats > 1 {
                format!("{} #{}", variant.name, rep + 1)
            } else {
                variant.name.clone()
            };
            progress.set_message(format!("{label}: connecting"));
            let run = run_variant(
                cfg, capacity, uri, variant, &schedules, &control, progress, &label,
            )
            .await?;
            let server_after = control.overload_status().await;
            let server_total = match (&server_before, &server_after) {
                (Some(b), Some(a)) => {
                    let mut m = counter_deltas(b, a);
                    // Percentiles the model may publish are taken as they are at the end.
                    m.extend(
                        a.iter()
                            .filter(|(k, _)| k.starts_with("queueWaitMs."))
                            .map(|(k, v)| (k.clone(), *v)),
                    );
                    Some(m)
                }
                _ => None,
            };
            let (seconds, stats, cpu_total) = run;
            let summary = summarize(
                variant,
                rep,
                &seconds,
                &cfg.scenario,
                len,
                stats,
                server_total.as_ref(),
                cpu_total,
                cfg.max_lag_p99,
            );
            runs.push(VariantRun {
                variant: variant.clone(),
                rep,
                seconds,
                summary,
            });
        }
    }
    if model.is_some() {
        let _ = control
            .admin(doc! { "setParameter": 1, "labOverload": { "enabled": false } })
            .await;
    }
    control.client.clone().shutdown().immediate(true).await;
    Ok((model, runs, capacity, capacity_note))
}

#[allow(clippy::too_many_arguments)]
async fn run_variant(
    cfg: &LabConfig,
    capacity: f64,
    uri: &str,
    variant: &Variant,
    schedules: &[Vec<Arrival>],
    control: &Arc<Control>,
    progress: &ProgressBar,
    label: &str,
) -> Result<(Vec<Second>, DriveStats, Option<f64>), String> {
    let attempts = Arc::new(AtomicU64::new(0));
    // The recorder's clock starts once the clients are connected (set below).
    let recorder = Arc::new(Recorder::new(Instant::now() + Duration::from_secs(3600)));
    let client_uri = with_options(uri, &cfg.uri_options(variant));
    let mut clients: Vec<Arc<dyn LabClient>> = Vec::new();
    let mut sinks = Vec::new();
    for i in 0..cfg.instances.max(1) {
        let sink = Arc::new(Sink::new(recorder.clone(), attempts.clone()));
        let c = client::connect(
            variant.driver,
            &client_uri,
            &format!("lab-{}-{i}", variant.name),
            DB,
            COLL,
            sink.clone(),
        )
        .await?;
        c.warm_up()
            .await
            .map_err(|e| format!("{}: instance {i}: {e}", variant.name))?;
        clients.push(c);
        sinks.push(sink);
    }
    let start = Instant::now() + Duration::from_millis(100);
    recorder.set_start(start);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut helpers = JoinSet::new();
    helpers.spawn(sampler(
        recorder.clone(),
        control.clone(),
        cfg.server_mode == ServerMode::Model,
        progress.clone(),
        label.to_string(),
        stop_rx.clone(),
    ));
    if cfg.server_mode == ServerMode::Failpoint {
        helpers.spawn(failpoint_controller(
            control.clone(),
            attempts.clone(),
            capacity,
            stop_rx.clone(),
        ));
    }
    let cpu_start = super::sys::process_cpu();
    let opts = RequestOpts {
        deadline: cfg.deadline,
        drain: cfg.drain,
        range_len: cfg.mix.range_len,
        max_time: cfg.max_time_ms.then_some(cfg.deadline),
    };
    let stats = drive_all(&clients, schedules, recorder.clone(), opts).await;
    let cpu_end = super::sys::process_cpu();
    let wall = Instant::now()
        .saturating_duration_since(start)
        .as_secs_f64();
    let _ = stop_tx.send(true);
    while helpers.join_next().await.is_some() {}
    for c in &clients {
        c.shutdown().await;
    }
    drop(sinks);
    let cpu_total = match (cpu_start, cpu_end) {
        (Some(a), Some(b)) if wall > 0.0 => {
            Some(100.0 * b.saturating_sub(a).as_secs_f64() / wall / super::sys::cores() as f64)
        }
        _ => None,
    };
    let len = cfg.scenario.duration().as_secs_f64().ceil() as usize;
    Ok((recorder.take(len), stats, cpu_total))
}

/// Operation kinds used by a mix (for the report).
pub fn kinds_in_use(cfg: &LabConfig) -> Vec<OpKind> {
    OpKind::ALL
        .into_iter()
        .filter(|k| cfg.mix.share(*k) > 0.0)
        .collect()
}
