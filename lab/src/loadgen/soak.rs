//! The soak run (`lab run --soak MINUTES`, `docs/lab.md` "Soak"): the fork on its recommended
//! settings (`fork-recommended`: `retryBudget=true&timeoutMS=<deadline>&adaptiveThrottle=true`)
//! under mixed load at 150 % of the calibrated capacity for minutes, with faults: the server
//! model's overload errors, connections closed at random before and after writes (`failCommand` and
//! `onPrimaryTransactionalWrite` fail points with `closeConnection`) and scheduled step-downs
//! (`replSetStepDown`) of a three-member replica set.
//!
//! Once a second it samples the process's resident memory, the driver's pooled connections
//! (from its CMAP events) and the server's, the operations in flight and the server's open
//! cursors and sessions. It ends with a drain check. The verdict: resident memory after the
//! baseline (the first minute) grows by at most [`RSS_GROWTH_LIMIT`], and the drain check
//! passes.
//!
//! The lab's per-second [`Recorder`] keeps histograms for every second, which would grow by
//! about 100 KB a second and hide what the soak measures; so the load runs in segments of
//! [`SEGMENT_SECS`] seconds, each with a recorder of its own that is reduced to a few counts
//! when the segment ends, and the driver's events go to a recorder that books everything into
//! one second that the sampler empties.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use indicatif::ProgressBar;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::calibrate::calibrate;
use super::client::{connect_instances, overload_stats_of, BoxFut, ForkStats, LabClient, OpSpec};
use super::config::{LabConfig, OpMix, Persona, Scenario, Variant, RECOMMENDED};
use super::control::{member_documents, model_document, Control};
use super::drive::{drive_all, RequestOpts};
use super::emulator_thread::EmulatorThread;
use super::members::{member_hosts, Drops, Members};
use super::metrics::{AttemptReport, ErrorClass, Recorder};
use super::schedule::{self, ScheduleSpec};
use emulator::{EmulatorConfig, Topology};

/// Offered load, as a multiple of the calibrated capacity.
pub const SOAK_LOAD: f64 = 1.5;
/// The soak's operation mix: no inserts, because the emulator runs in the same process and
/// keeps every inserted document, which would show as resident memory growth that is data, not
/// a leak. Updates are the writes (retryable, so the after-write drops exercise retries).
pub const SOAK_MIX: &str = "point=75,range=10,update=15";
/// Replica-set members (a step-down needs another electable member).
pub const SOAK_MEMBERS: usize = 3;
/// Length of one load segment (one schedule and one recorder each).
pub const SEGMENT_SECS: u64 = 10;
/// Share of `find`, `getMore` and `update` commands whose connection the server closes
/// without a reply (`failCommand` with `closeConnection`), on every member.
pub const DROP_BEFORE_SHARE: f64 = 0.002;
/// Share of writes applied on the primary whose connection is then closed before the reply
/// (`onPrimaryTransactionalWrite` with `closeConnection`): the retry must be recognised.
pub const DROP_AFTER_WRITE_SHARE: f64 = 0.005;
/// Default period of the scheduled step-downs.
pub const STEP_DOWN_EVERY_SECS: f64 = 30.0;
/// Most sessions the soak's server keeps (least recently used ones are forgotten beyond it).
/// A session used by a command that failed with a network error (the driver's own
/// `timeoutMS` expiring mid-reply included) is discarded by the driver without `endSessions`,
/// as the sessions spec says, and the server keeps it until it times out (30 minutes): at
/// 150 % with timeouts that is dozens a second. The emulator runs in this process, so its
/// session table is part of the resident memory measured; bounded here, it fills within the
/// first minute (before the baseline) instead of growing through the run. It stays above the
/// sessions in use at once (the drivers' pools held at most about 300 in the reference run), so
/// only sessions the driver has abandoned are forgotten.
pub const SOAK_MAX_SESSIONS: usize = 500;
/// Handshake records the soak's server keeps for `Emulator::client_metadata` (10,000 by
/// default). `timeoutMS` expiring mid-reply closes the connection, so the pools replace dozens
/// a second; their handshake records (each with the client's metadata document) would fill
/// 10,000 slots over the first five minutes, as resident memory growth of a table only tests
/// read (in the first 10-minute run, 2026-12-01, memory grew fastest until then).
pub const SOAK_MAX_METADATA_RECORDS: usize = 100;
/// Largest accepted growth of resident memory after the baseline (0.10 = 10 %).
pub const RSS_GROWTH_LIMIT: f64 = 0.10;
/// The baseline of resident memory is taken this long after the load starts (or at a third
/// of a shorter run).
pub const RSS_BASELINE_SECS: f64 = 60.0;

/// What a soak does.
#[derive(Debug, Clone, Serialize)]
pub struct SoakConfig {
    /// Length of the load.
    #[serde(serialize_with = "ser_secs")]
    pub length: Duration,
    /// The lab's settings: instances, pool size, deadline, seed, docs, capacity (0: calibrate).
    #[serde(skip)]
    pub lab: LabConfig,
    /// The variant (the fork's recommended settings by default).
    pub variant: Variant,
    /// Period of the step-downs, halved before the baseline (`None`: no step-downs).
    #[serde(serialize_with = "ser_opt_secs")]
    pub step_down_every: Option<Duration>,
    /// Wait after the load stops before the drain check.
    #[serde(serialize_with = "ser_secs")]
    pub grace: Duration,
}

fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn ser_opt_secs<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_f64(d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

impl SoakConfig {
    /// A soak of `length` on `lab`'s settings with the soak's mix (unless `lab` was given one
    /// explicitly by the caller afterwards), the fork's recommended variant, step-downs every
    /// 30 s and a grace period of the deadline plus 5 s.
    pub fn new(length: Duration, mut lab: LabConfig) -> SoakConfig {
        if let Ok(mix) = OpMix::parse(SOAK_MIX) {
            lab.mix = mix;
        }
        lab.persona = Persona::Replicaset;
        lab.members = SOAK_MEMBERS;
        let grace = lab.deadline + Duration::from_secs(5);
        SoakConfig {
            length,
            lab,
            // A builtin name, which `config`'s tests parse: this cannot fail at run time.
            variant: Variant::parse(RECOMMENDED)
                .expect("the recommended settings are a builtin variant"),
            step_down_every: Some(Duration::from_secs_f64(STEP_DOWN_EVERY_SECS)),
            grace,
        }
    }

    /// When the baseline of resident memory is taken, from the start of the load.
    pub fn rss_baseline_at(&self) -> Duration {
        Duration::from_secs_f64(RSS_BASELINE_SECS.min(self.length.as_secs_f64() / 3.0))
    }
}

/// One second's sample.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sample {
    /// Seconds since the load started.
    pub t: f64,
    /// Resident memory of the process (KiB).
    pub rss_kib: u64,
    /// Heap memory in use (KiB): what the allocator has handed out and not had back, as
    /// opposed to what it keeps from the system (glibc's `mallinfo2`; 0 elsewhere). Resident
    /// memory growing while this stays flat is the allocator's retention, not a leak.
    pub heap_kib: u64,
    /// The driver's pooled connections (created minus closed, from CMAP events).
    pub pool_connections: i64,
    /// The server's current connections (`serverStatus.connections.current`, every client).
    pub server_connections: i64,
    /// Driver calls in flight (started by the generator, not yet returned or dropped).
    pub in_flight: i64,
    /// The server's open cursors (`metrics.cursor.open.total`).
    pub cursors: i64,
    /// The server's sessions (`logicalSessionRecordCache.activeSessionsCount`).
    pub sessions: i64,
    /// Commands the driver started in this second (retries included).
    pub attempts: u64,
    /// Of those, failed with an overload error.
    pub overload_errors: u64,
    /// Of those, failed with a network error.
    pub network_errors: u64,
    /// Step-downs so far.
    pub step_downs: u64,
}

/// What one load segment's requests came to.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Totals {
    /// Requests sent.
    pub sent: u64,
    /// Succeeded within the deadline.
    pub good: u64,
    /// Failed, by class (`ErrorClass::ALL` order).
    pub errors: [u64; 6],
    /// Still running when the segment's drain period ended.
    pub unfinished: u64,
}

impl Totals {
    fn add(&mut self, o: &Totals) {
        self.sent += o.sent;
        self.good += o.good;
        for (a, b) in self.errors.iter_mut().zip(o.errors) {
            *a += b;
        }
        self.unfinished += o.unfinished;
    }
}

/// The drain check's findings.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Drain {
    /// Driver calls still in flight after the grace period (must be 0).
    pub in_flight: i64,
    /// Server connections that are no pool's (monitors, the lab's control clients) before
    /// the load and after the grace period: no more after than before when no connection was
    /// leaked outside the pools.
    pub outside_pools_before: i64,
    /// After the grace period.
    pub outside_pools_after: i64,
    /// The driver's pooled connections after the grace period (all idle: nothing in flight).
    pub pool_connections: i64,
    /// Most connections the clients' pools may hold (instances × members × maxPoolSize).
    pub pool_limit: i64,
    /// Open cursors after the grace period (must be 0: every cursor was exhausted or killed).
    pub cursors: i64,
    /// Sessions the server still holds after the clients shut down (they send endSessions for
    /// their pooled sessions; a session used by a command that failed with a network error,
    /// its own `timeoutMS` expiring included, is discarded without it, as the sessions spec
    /// says, and times out on the server).
    pub sessions_after_shutdown: i64,
    /// Connections the driver closed during the soak: a network error closes the connection
    /// it happened on, so this bounds the sessions the driver may have discarded.
    pub connections_closed: u64,
    /// Attempts that failed with a network error during the soak.
    pub network_errors: u64,
    /// Server connections after the clients shut down (the lab's control clients only).
    pub server_connections_after_shutdown: i64,
    /// Server connections before the soak's clients connected.
    pub server_connections_before_clients: i64,
    /// Each failed condition, in words.
    pub failures: Vec<String>,
}

/// A soak's figures and verdict.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    /// The settings.
    pub config: SoakConfig,
    /// Capacity (ops/s) and how it was found.
    pub capacity: f64,
    /// How the capacity was found.
    pub capacity_note: String,
    /// Every second's sample.
    pub samples: Vec<Sample>,
    /// Requests over the whole soak.
    pub totals: Totals,
    /// Step-downs sent, and those that failed (no primary at the time, …).
    pub step_downs: u64,
    /// Step-down commands that failed.
    pub step_down_failures: u64,
    /// The fork's overload statistics, summed over the instances.
    pub fork_stats: Option<ForkStats>,
    /// Resident memory at the baseline and at the end of the load (KiB).
    pub rss_baseline_kib: u64,
    /// At the end of the load.
    pub rss_end_kib: u64,
    /// Largest after the baseline.
    pub rss_max_after_baseline_kib: u64,
    /// (end − baseline) / baseline.
    pub rss_growth: f64,
    /// Heap in use at the baseline, at the end and the largest after the baseline (KiB; 0
    /// where it is not known): it grows with a leak, while resident memory also keeps what
    /// the allocator holds on to.
    pub heap_baseline_kib: u64,
    pub heap_end_kib: u64,
    pub heap_max_after_baseline_kib: u64,
    /// The drain check.
    pub drain: Drain,
    /// RSS growth within the limit and the drain check passed.
    pub passed: bool,
}

/// Resident memory of this process in KiB (`VmRSS` of `/proc/self/status`).
pub fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_rss(&status)
}

/// Heap memory in use in KiB: glibc's `mallinfo2` (`uordblks`, the bytes of allocated chunks,
/// plus `hblkhd`, the bytes in mmapped chunks), over every arena.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn heap_in_use_kib() -> Option<u64> {
    // SAFETY: mallinfo2 takes no arguments and returns a plain struct by value; glibc locks
    // each arena while it reads it.
    let info = unsafe { libc::mallinfo2() };
    Some(((info.uordblks + info.hblkhd) / 1024) as u64)
}

/// Heap memory in use: not known outside glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn heap_in_use_kib() -> Option<u64> {
    None
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A client that counts its calls in flight: from the call until its future returns or is
/// dropped.
struct Counting {
    inner: Arc<dyn LabClient>,
    in_flight: Arc<AtomicI64>,
}

/// Decrements the in-flight count when the call's future ends or is dropped.
struct InFlight(Arc<AtomicI64>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl LabClient for Counting {
    fn run(&self, op: OpSpec) -> BoxFut<AttemptReport> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let guard = InFlight(self.in_flight.clone());
        let call = self.inner.run(op);
        Box::pin(async move {
            let _guard = guard;
            call.await
        })
    }
    fn warm_up(&self) -> BoxFut<Result<(), String>> {
        self.inner.warm_up()
    }
    fn shutdown(&self) -> BoxFut<()> {
        self.inner.shutdown()
    }
    fn forget(&self, req: u64) -> u32 {
        self.inner.forget(req)
    }
    fn app_may_retry(&self) -> bool {
        self.inner.app_may_retry()
    }
    fn overload_stats(&self) -> Option<ForkStats> {
        self.inner.overload_stats()
    }
}

/// The soak's drops.
const SOAK_DROPS: Drops = Drops {
    before_share: DROP_BEFORE_SHARE,
    before_commands: &["find", "getMore", "update"],
    after_share: DROP_AFTER_WRITE_SHARE,
};

/// The server's figures a sample takes.
#[derive(Debug, Clone, Copy, Default)]
struct ServerFigures {
    connections: i64,
    cursors: i64,
    sessions: i64,
}

async fn server_figures(member: &mongodb::Client) -> Option<ServerFigures> {
    let st = Members::admin(member, doc! { "serverStatus": 1 })
        .await
        .ok()?;
    let int = |path: &[&str]| -> i64 {
        let mut d = &st;
        for key in &path[..path.len() - 1] {
            match d.get_document(key) {
                Ok(inner) => d = inner,
                Err(_) => return -1,
            }
        }
        match d.get(path[path.len() - 1]) {
            Some(bson::Bson::Int32(v)) => i64::from(*v),
            Some(bson::Bson::Int64(v)) => *v,
            Some(bson::Bson::Double(v)) => *v as i64,
            _ => -1,
        }
    };
    Some(ServerFigures {
        connections: int(&["connections", "current"]),
        cursors: int(&["metrics", "cursor", "open", "total"]),
        sessions: int(&["logicalSessionRecordCache", "activeSessionsCount"]),
    })
}

/// The driver's events of every instance, all booked into one second (its start lies in the
/// future) that the sampler empties each second, so they take no memory over time.
struct Events {
    recorder: Arc<Recorder>,
    /// Pooled connections so far (created minus closed).
    pool: i64,
    /// Connections closed so far (each session discarded after a network error had its
    /// connection closed).
    closed: u64,
    network_errors: u64,
}

impl Events {
    fn new() -> Events {
        Events {
            recorder: Arc::new(Recorder::new(
                Instant::now() + Duration::from_secs(10 * 365 * 24 * 3600),
            )),
            pool: 0,
            closed: 0,
            network_errors: 0,
        }
    }

    /// Empties the recorder: (attempts, overload errors, network errors) since the last call;
    /// updates the pool count.
    fn take(&mut self) -> (u64, u64, u64) {
        let mut out = (0, 0, 0);
        for s in self.recorder.take(0) {
            self.pool += s.conns_opened as i64 - s.conns_closed as i64;
            self.closed += s.conns_closed;
            out.0 += s.attempts;
            out.1 += s.attempt_errors[ErrorClass::Overload as usize];
            out.2 += s.attempt_errors[ErrorClass::Network as usize];
        }
        self.network_errors += out.2;
        out
    }
}

/// Reduces a segment's seconds to its totals.
fn segment_totals(seconds: &[super::metrics::Second], sent: u64, unfinished: u64) -> Totals {
    let mut t = Totals {
        sent,
        unfinished,
        ..Totals::default()
    };
    for s in seconds {
        t.good += s.good;
        for (a, b) in t.errors.iter_mut().zip(s.errors) {
            *a += b;
        }
    }
    t
}

/// Runs the soak; `progress` shows the seconds of load.
pub async fn run(cfg: &SoakConfig, progress: &ProgressBar) -> Result<SoakReport, String> {
    let emulator = EmulatorThread::start(EmulatorConfig {
        topology: Topology::ReplicaSet {
            name: "lab".into(),
            members: cfg.lab.members.max(2),
        },
        max_sessions: SOAK_MAX_SESSIONS,
        max_metadata_records: SOAK_MAX_METADATA_RECORDS,
        ..EmulatorConfig::default()
    })
    .await?;
    let uri = emulator.uri.clone();
    let result = run_against(cfg, &uri, progress).await;
    emulator.stop().await;
    result
}

async fn run_against(
    cfg: &SoakConfig,
    uri: &str,
    progress: &ProgressBar,
) -> Result<SoakReport, String> {
    let lab = &cfg.lab;
    let control = Arc::new(Control::connect(uri).await?);
    control.seed(lab.docs).await?;
    // The members' direct connections take the samples (every member reports the whole
    // deployment's connections, cursors and sessions) and set the faults. The control client
    // is not used again until the drain check is done: after a step-down it would connect to
    // the new primary, and the check counts every connection that is no pool's.
    let members = Members::connect(uri).await?;
    members.set_drops(None).await?;
    // Samples go over a client of their own, so that they never need a second connection
    // while the step-downs use the members' clients.
    let status = mongodb::Client::with_uri_str(format!(
        "mongodb://{}/?directConnection=true&appName=lab-soak-status",
        member_hosts(uri).first().cloned().unwrap_or_default()
    ))
    .await
    .map_err(|e| e.to_string())?;
    // Capacity as the lab's runs find it: calibrated without the limiter, unless given.
    let mut capacity = lab.effective_capacity();
    let mut capacity_note = if lab.capacity > 0.0 {
        "given".to_string()
    } else {
        "derived from the model's cores and costs".to_string()
    };
    let mut unlimited = model_document(lab, capacity)?;
    if let Ok(limiter) = unlimited.get_document_mut("limiter") {
        limiter.insert("enabled", false);
    }
    unlimited.remove("randomRejectShare");
    control
        .set_model(&unlimited, &member_documents(lab, capacity))
        .await?;
    if lab.capacity <= 0.0 {
        progress.set_message("calibrating the server model's capacity");
        let measured = calibrate(lab, uri).await?;
        if measured > 0.0 && measured < capacity {
            capacity_note = format!("calibrated: the model completed {measured:.0} ops/s");
            capacity = measured;
        }
    }
    control
        .set_model(
            &model_document(lab, capacity)?,
            &member_documents(lab, capacity),
        )
        .await?;
    let status = &status;
    // Every admin client's monitors connect (their RTT connections a little after the first
    // reply) before the baseline of connections.
    Members::admin(status, doc! { "ping": 1 }).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before_clients = server_figures(status).await.unwrap_or_default();

    // The clients, each counting its calls in flight.
    let in_flight = Arc::new(AtomicI64::new(0));
    let mut events = Events::new();
    let attempts = Arc::new(AtomicU64::new(0));
    let clients: Vec<Arc<dyn LabClient>> =
        connect_instances(lab, uri, &cfg.variant, &events.recorder, &attempts)
            .await?
            .into_iter()
            .map(|inner| {
                Arc::new(Counting {
                    inner,
                    in_flight: in_flight.clone(),
                }) as Arc<dyn LabClient>
            })
            .collect();
    // Lets the monitors connect to every member before the baseline of connections.
    tokio::time::sleep(Duration::from_secs(2)).await;
    events.take();
    let outside_before = server_figures(status)
        .await
        .map_or(-1, |f| f.connections - events.pool);
    members.set_drops(Some(&SOAK_DROPS)).await?;

    let start = Instant::now() + Duration::from_millis(200);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Step-downs on their schedule until the load stops.
    let step_downs = Arc::new(AtomicU64::new(0));
    let step_down_failures = Arc::new(AtomicU64::new(0));
    let members = Arc::new(members);
    let stepper = cfg.step_down_every.map(|every| {
        let (members, count, failures, mut stop) = (
            members.clone(),
            step_downs.clone(),
            step_down_failures.clone(),
            stop_rx.clone(),
        );
        let (baseline_at, length) = (cfg.rss_baseline_at(), cfg.length);
        tokio::spawn(async move {
            let mut previous = None;
            while let Some(at) = next_step_down(previous, every, baseline_at) {
                if at >= length {
                    break;
                }
                previous = Some(at);
                tokio::select! {
                    _ = tokio::time::sleep_until(start + at) => {}
                    _ = stop.changed() => break,
                }
                match members.step_down().await {
                    Ok(true) => count.fetch_add(1, Ordering::Relaxed),
                    _ => failures.fetch_add(1, Ordering::Relaxed),
                };
            }
        })
    });

    // The load: one segment after another, each driven from its own start; a segment's
    // stragglers overlap the next one's start, so the load never pauses.
    let segments = cfg.length.as_secs().div_ceil(SEGMENT_SECS).max(1);
    let opts = RequestOpts {
        deadline: lab.deadline,
        drain: lab.drain,
        range_len: lab.mix.range_len,
        max_time: None,
        on_deadline: lab.application(&cfg.variant).on_deadline,
        app_retries: 0,
        shard_keys: None,
    };
    let mut load = JoinSet::new();
    {
        let (clients, mix, seed, docs, instances, arrivals) = (
            clients.clone(),
            lab.mix.clone(),
            lab.seed,
            lab.docs,
            lab.instances,
            lab.arrivals,
        );
        let length = cfg.length;
        load.spawn(async move {
            let mut running = JoinSet::new();
            let mut totals = Totals::default();
            for k in 0..segments {
                let seg_start = start + Duration::from_secs(k * SEGMENT_SECS);
                let secs =
                    (length.as_secs_f64() - (k * SEGMENT_SECS) as f64).min(SEGMENT_SECS as f64);
                if secs <= 0.0 {
                    break;
                }
                let scenario = Scenario::steady("soak", "soak", SOAK_LOAD, secs);
                let schedules = schedule::build(&ScheduleSpec {
                    phases: &scenario.phases,
                    capacity,
                    instances,
                    arrivals,
                    mix: &mix,
                    docs,
                    seed: seed.wrapping_add(k * 7919),
                });
                // Built ahead of time, then waits for its start.
                tokio::time::sleep_until(
                    seg_start
                        .checked_sub(Duration::from_millis(100))
                        .unwrap_or(seg_start),
                )
                .await;
                let clients = clients.clone();
                running.spawn(async move {
                    let recorder = Arc::new(Recorder::new(seg_start));
                    let stats = drive_all(&clients, &schedules, recorder.clone(), opts).await;
                    let seconds = recorder.take(0);
                    segment_totals(&seconds, stats.sent, stats.unfinished)
                });
                while let Some(r) = running.try_join_next() {
                    if let Ok(t) = r {
                        totals.add(&t);
                    }
                }
            }
            while let Some(r) = running.join_next().await {
                if let Ok(t) = r {
                    totals.add(&t);
                }
            }
            totals
        });
    }

    // The sampler, once a second until the load is done.
    let mut samples: Vec<Sample> = Vec::new();
    let mut tick = tokio::time::interval_at(start + Duration::from_secs(1), Duration::from_secs(1));
    let base = progress.position();
    let totals = loop {
        tokio::select! {
            _ = tick.tick() => {}
            done = load.join_next() => {
                break done.and_then(Result::ok).unwrap_or_default();
            }
        }
        let t = Instant::now().saturating_duration_since(start);
        let (att, overload, network) = events.take();
        let server = server_figures(status).await.unwrap_or(ServerFigures {
            connections: -1,
            cursors: -1,
            sessions: -1,
        });
        let s = Sample {
            t: t.as_secs_f64(),
            rss_kib: rss_kib().unwrap_or(0),
            heap_kib: heap_in_use_kib().unwrap_or(0),
            pool_connections: events.pool,
            server_connections: server.connections,
            in_flight: in_flight.load(Ordering::Relaxed),
            cursors: server.cursors,
            sessions: server.sessions,
            attempts: att,
            overload_errors: overload,
            network_errors: network,
            step_downs: step_downs.load(Ordering::Relaxed),
        };
        progress.set_position(base + t.as_secs());
        progress.set_message(format!(
            "soak t={}s rss {} MiB in flight {} conns {} cursors {} sessions {}",
            t.as_secs(),
            s.rss_kib / 1024,
            s.in_flight,
            s.pool_connections,
            s.cursors,
            s.sessions
        ));
        // Bounded: one sample a second for the run's length (plus its drain).
        if samples.len() < 48 * 3600 {
            samples.push(s);
        }
    };
    let _ = stop_tx.send(true);
    if let Some(h) = stepper {
        let _ = h.await;
    }

    // The drain check: faults off, a grace period, then nothing may be left.
    members.set_drops(None).await?;
    progress.set_message("soak: drain check");
    tokio::time::sleep(cfg.grace).await;
    events.take();
    let at_drain = server_figures(status).await.unwrap_or(ServerFigures {
        connections: -1,
        cursors: -1,
        sessions: -1,
    });
    let mut drain = Drain {
        in_flight: in_flight.load(Ordering::Relaxed),
        outside_pools_before: outside_before,
        outside_pools_after: at_drain.connections - events.pool,
        pool_connections: events.pool,
        // A pool per member and client: after step-downs each client keeps connections to
        // the former primaries.
        pool_limit: (lab.instances.max(1) * lab.members.max(2)) as i64
            * i64::from(lab.max_pool_size),
        cursors: at_drain.cursors,
        server_connections_before_clients: before_clients.connections,
        ..Drain::default()
    };
    let fork_stats = overload_stats_of(&clients);
    for c in &clients {
        c.shutdown().await;
    }
    drop(clients);
    // The server notices closed sockets as their tasks end.
    tokio::time::sleep(Duration::from_millis(500)).await;
    events.take();
    drain.network_errors = events.network_errors;
    drain.connections_closed = events.closed;
    let after = server_figures(status).await.unwrap_or_default();
    drain.sessions_after_shutdown = after.sessions;
    drain.server_connections_after_shutdown = after.connections;
    drain.failures = drain_failures(&drain);

    if let Ok(m) = Arc::try_unwrap(members) {
        m.shutdown().await;
    }
    status.clone().shutdown().immediate(true).await;
    let _ = control.set_model_enabled(false).await;
    control.client.clone().shutdown().immediate(true).await;

    let (baseline, end, max_after) = memory_figures(&samples, cfg.rss_baseline_at(), |s| s.rss_kib);
    let (heap_baseline, heap_end, heap_max_after) =
        memory_figures(&samples, cfg.rss_baseline_at(), |s| s.heap_kib);
    let growth = if baseline > 0 {
        (end as f64 - baseline as f64) / baseline as f64
    } else {
        f64::INFINITY
    };
    let passed = growth <= RSS_GROWTH_LIMIT && drain.failures.is_empty();
    Ok(SoakReport {
        config: cfg.clone(),
        capacity,
        capacity_note,
        samples,
        totals,
        step_downs: step_downs.load(Ordering::Relaxed),
        step_down_failures: step_down_failures.load(Ordering::Relaxed),
        fork_stats,
        rss_baseline_kib: baseline,
        rss_end_kib: end,
        rss_max_after_baseline_kib: max_after,
        rss_growth: growth,
        heap_baseline_kib: heap_baseline,
        heap_end_kib: heap_end,
        heap_max_after_baseline_kib: heap_max_after,
        drain,
        passed,
    })
}

/// The step-down after the one at `previous` (`None`: the first), from the start of the load:
/// twice as often before the baseline of memory (every `every / 2`), then every `every` from
/// the baseline on. `None` when `every` is too short to halve or the time overflows. One at a
/// time, so that no period, however short, builds a schedule in memory.
///
/// Each step-down moves the writes to another member, whose pool then grows to the load's
/// concurrency while the old primary's connections stay pooled; the pooled connections (and the
/// memory they hold, in the driver and in the in-process emulator) reach their working set only
/// once every member has been primary. At one step-down every 30 s that took until after the
/// baseline (in the 10-minute runs of 2026-12-01 the heap in use peaked at 90 s), so the
/// criterion measured the working set filling, not a leak; the warm-up's faster step-downs let
/// it fill before the baseline, and the rest of the run keeps the configured period.
fn next_step_down(
    previous: Option<Duration>,
    every: Duration,
    baseline_at: Duration,
) -> Option<Duration> {
    let warm_up_every = every / 2;
    if warm_up_every.is_zero() {
        return None;
    }
    match previous {
        Some(previous) if previous >= baseline_at => previous.checked_add(every),
        _ => {
            let next = previous.map_or(Some(warm_up_every), |p| p.checked_add(warm_up_every))?;
            if next < baseline_at {
                Some(next)
            } else {
                baseline_at.checked_add(every)
            }
        }
    }
}

/// A memory figure (`kib` of each sample) at the baseline (the first sample at or after
/// `baseline_at`), at the end (the last sample) and the largest after the baseline, in KiB (0
/// when not measured).
fn memory_figures(
    samples: &[Sample],
    baseline_at: Duration,
    kib: fn(&Sample) -> u64,
) -> (u64, u64, u64) {
    let at = baseline_at.as_secs_f64();
    let Some(first) = samples.iter().position(|s| s.t >= at) else {
        return (0, 0, 0);
    };
    let baseline = kib(&samples[first]);
    let end = samples.last().map_or(0, kib);
    let max = samples[first..].iter().map(kib).max().unwrap_or(0);
    (baseline, end, max)
}

/// The drain check's failed conditions.
fn drain_failures(d: &Drain) -> Vec<String> {
    let mut f = Vec::new();
    if d.in_flight != 0 {
        f.push(format!("{} driver calls still in flight", d.in_flight));
    }
    if d.cursors != 0 {
        f.push(format!("{} cursors still open on the server", d.cursors));
    }
    // Monitors may replace a connection (or not yet have replaced one) after a step-down, so
    // fewer is no leak; more means sockets the pools no longer know about.
    if d.outside_pools_after > d.outside_pools_before {
        f.push(format!(
            "server connections outside the pools: {} before the load, {} after it",
            d.outside_pools_before, d.outside_pools_after
        ));
    }
    if d.pool_connections > d.pool_limit {
        f.push(format!(
            "{} pooled connections, above the limit of {}",
            d.pool_connections, d.pool_limit
        ));
    }
    if d.sessions_after_shutdown < 0 || d.sessions_after_shutdown as u64 > d.connections_closed {
        f.push(format!(
            "{} sessions left on the server after the clients shut down, more than the {} \
             connections closed during the soak, each of which may have discarded one",
            d.sessions_after_shutdown, d.connections_closed
        ));
    }
    if d.server_connections_after_shutdown > d.server_connections_before_clients {
        f.push(format!(
            "{} server connections after the clients shut down, {} before they connected",
            d.server_connections_after_shutdown, d.server_connections_before_clients
        ));
    }
    f
}

/// `soak.md`: the settings, the figures and the verdict.
pub fn markdown(r: &SoakReport) -> String {
    let mib = |k: u64| k as f64 / 1024.0;
    let max = |f: fn(&Sample) -> i64| r.samples.iter().map(f).max().unwrap_or(0);
    let t = &r.totals;
    let mut out = String::new();
    out.push_str("# Soak\n\n");
    out.push_str(&format!(
        "{} s of load at {:.0} % of {:.0} ops/s ({}), variant `{}` (`{}`), {} instance(s), \
         maxPoolSize {}, deadline {} ms, mix `{}`; faults: overload (the server model), \
         connection drops ({:.1} % of find/getMore/update, {:.1} % after writes), step-downs \
         every {}.\n\n",
        r.config.length.as_secs(),
        SOAK_LOAD * 100.0,
        r.capacity,
        r.capacity_note,
        r.config.variant.name,
        r.config.lab.uri_options(&r.config.variant),
        r.config.lab.instances,
        r.config.lab.max_pool_size,
        r.config.lab.deadline.as_millis(),
        SOAK_MIX,
        DROP_BEFORE_SHARE * 100.0,
        DROP_AFTER_WRITE_SHARE * 100.0,
        r.config
            .step_down_every
            .map_or("never".to_string(), |d| format!(
                "{} s (every {} s before the baseline)",
                d.as_secs_f64(),
                d.as_secs_f64() / 2.0
            )),
    ));
    out.push_str(&format!(
        "**Verdict: {}.** Resident memory {:.1} MiB at {:.0} s, {:.1} MiB at the end \
         ({:+.1} %, limit {:+.0} %; largest after the baseline {:.1} MiB); drain check {}.\n\n",
        if r.passed { "PASS" } else { "FAIL" },
        mib(r.rss_baseline_kib),
        r.config.rss_baseline_at().as_secs_f64(),
        mib(r.rss_end_kib),
        r.rss_growth * 100.0,
        RSS_GROWTH_LIMIT * 100.0,
        mib(r.rss_max_after_baseline_kib),
        if r.drain.failures.is_empty() {
            "passed".to_string()
        } else {
            format!("FAILED: {}", r.drain.failures.join("; "))
        }
    ));
    out.push_str("| figure | value |\n|---|---|\n");
    let mut row = |k: &str, v: String| out.push_str(&format!("| {k} | {v} |\n"));
    row(
        "heap in use at the baseline / at the end / largest after the baseline",
        format!(
            "{:.1} / {:.1} / {:.1} MiB",
            mib(r.heap_baseline_kib),
            mib(r.heap_end_kib),
            mib(r.heap_max_after_baseline_kib)
        ),
    );
    row("requests sent", t.sent.to_string());
    row("succeeded within the deadline", t.good.to_string());
    let errors: BTreeMap<&str, u64> = ErrorClass::ALL
        .iter()
        .map(|c| (c.name(), t.errors[*c as usize]))
        .filter(|(_, n)| *n > 0)
        .collect();
    row("failed, by class", format!("{errors:?}"));
    row("unfinished at a segment's end", t.unfinished.to_string());
    row(
        "step-downs (failed)",
        format!("{} ({})", r.step_downs, r.step_down_failures),
    );
    row(
        "attempts failed with a network error / connections closed",
        format!(
            "{} / {}",
            r.drain.network_errors, r.drain.connections_closed
        ),
    );
    row(
        "max driver calls in flight",
        max(|s| s.in_flight).to_string(),
    );
    row(
        "max pooled connections",
        max(|s| s.pool_connections).to_string(),
    );
    row(
        "max server connections",
        max(|s| s.server_connections).to_string(),
    );
    row("max open cursors", max(|s| s.cursors).to_string());
    row("max server sessions", max(|s| s.sessions).to_string());
    if let Some(f) = &r.fork_stats {
        row(
            "fork: overload errors / retries made / refused",
            format!(
                "{} / {} / {}",
                f.overload_errors, f.retries_made, f.retries_refused
            ),
        );
    }
    let d = &r.drain;
    row(
        "drain: in flight / cursors / pooled connections",
        format!("{} / {} / {}", d.in_flight, d.cursors, d.pool_connections),
    );
    row(
        "drain: server connections outside the pools (before / after)",
        format!("{} / {}", d.outside_pools_before, d.outside_pools_after),
    );
    row(
        "after shutdown: sessions / server connections (before the clients)",
        format!(
            "{} / {} ({})",
            d.sessions_after_shutdown,
            d.server_connections_after_shutdown,
            d.server_connections_before_clients
        ),
    );
    out
}

/// Writes `soak.csv` (the samples), `soak.json` (everything) and `soak.md` into `out`.
pub fn write(r: &SoakReport, out: &std::path::Path) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut csv = String::from(
        "t,rss_kib,heap_kib,pool_connections,server_connections,in_flight,cursors,sessions,\
         attempts,overload_errors,network_errors,step_downs\n",
    );
    for s in &r.samples {
        csv.push_str(&format!(
            "{:.1},{},{},{},{},{},{},{},{},{},{},{}\n",
            s.t,
            s.rss_kib,
            s.heap_kib,
            s.pool_connections,
            s.server_connections,
            s.in_flight,
            s.cursors,
            s.sessions,
            s.attempts,
            s.overload_errors,
            s.network_errors,
            s.step_downs
        ));
    }
    let json = serde_json::to_string_pretty(r).map_err(|e| e.to_string())?;
    for (name, body) in [
        ("soak.csv", csv),
        ("soak.json", json),
        ("soak.md", markdown(r)),
    ] {
        std::fs::write(out.join(name), body).map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vm_rss() {
        let status = "Name:\tlab\nVmPeak:\t  9000 kB\nVmRSS:\t   1234 kB\nThreads:\t4\n";
        assert_eq!(parse_vm_rss(status), Some(1234));
        assert_eq!(parse_vm_rss("VmRSS: x kB"), None);
        assert!(rss_kib().is_some_and(|k| k > 0));
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        assert!(heap_in_use_kib().is_some_and(|k| k > 0));
    }

    #[test]
    fn step_downs_come_twice_as_often_before_the_baseline() {
        let times = |every: f64, baseline_at: f64, length: f64| {
            let (every, baseline_at) = (
                Duration::from_secs_f64(every),
                Duration::from_secs_f64(baseline_at),
            );
            std::iter::successors(next_step_down(None, every, baseline_at), |&at| {
                next_step_down(Some(at), every, baseline_at)
            })
            .take_while(|at| at.as_secs_f64() < length)
            .map(|at| at.as_secs_f64())
            .collect::<Vec<_>>()
        };
        assert_eq!(
            times(30.0, 60.0, 180.0),
            [15.0, 30.0, 45.0, 90.0, 120.0, 150.0]
        );
        // The test's short soak: 12 s, a step-down every 3 s, the baseline at 4 s.
        assert_eq!(times(3.0, 4.0, 12.0), [1.5, 3.0, 7.0, 10.0]);
        // A period longer than twice the baseline: none before it.
        assert_eq!(times(200.0, 60.0, 600.0), [260.0, 460.0]);
        let minute = Duration::from_secs(60);
        assert_eq!(next_step_down(None, Duration::ZERO, minute), None);
        assert_eq!(next_step_down(None, Duration::from_nanos(1), minute), None);
        assert_eq!(next_step_down(Some(Duration::MAX), minute, minute), None);
    }

    #[test]
    fn memory_baselines_are_taken_after_the_first_minute() {
        let samples: Vec<Sample> = (1..=120)
            .map(|t| Sample {
                t: t as f64,
                rss_kib: 1000 + t as u64,
                // The heap peaks at 90 s and falls back.
                heap_kib: 500 - (t as u64).abs_diff(90),
                ..Sample::default()
            })
            .collect();
        let minute = Duration::from_secs(60);
        assert_eq!(
            memory_figures(&samples, minute, |s| s.rss_kib),
            (1060, 1120, 1120)
        );
        assert_eq!(
            memory_figures(&samples, minute, |s| s.heap_kib),
            (470, 470, 500)
        );
        assert_eq!(memory_figures(&[], minute, |s| s.rss_kib), (0, 0, 0));
    }

    #[test]
    fn drain_failures_name_each_leak() {
        let clean = Drain {
            outside_pools_before: 12,
            outside_pools_after: 12,
            pool_connections: 30,
            pool_limit: 400,
            connections_closed: 5,
            sessions_after_shutdown: 5,
            server_connections_after_shutdown: 4,
            server_connections_before_clients: 4,
            ..Drain::default()
        };
        assert!(drain_failures(&clean).is_empty());
        let leaky = Drain {
            in_flight: 1,
            cursors: 2,
            outside_pools_after: 13,
            sessions_after_shutdown: 6,
            ..clean
        };
        let f = drain_failures(&leaky);
        assert_eq!(f.len(), 4, "{f:?}");
        assert!(
            f[0].contains("in flight") && f[1].contains("cursors"),
            "{f:?}"
        );
    }
}
