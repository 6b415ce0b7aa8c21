//! Runs the variants one after another against one in-process emulator: starts it
//! (`emulator_thread`), seeds it and applies the server mode (`control`, `calibrate`), and for
//! each variant connects the clients and drives the schedules (`drive`) with the sampler
//! (`sampler`) and, in fail-point mode, the rate limiter (`failpoint_limiter`) running beside,
//! then summarizes. Closed loops (`fast-path`) run their variants interleaved instead
//! ([`run_interleaved`]).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use bson::Document;
use indicatif::ProgressBar;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::calibrate::calibrate;
use super::client::{connect_instances, overload_stats_of, ForkStats, LabClient};
use super::config::{Faults, LabConfig, Load, Persona, ServerMode, Variant};
use super::control::{
    counter_deltas, member_documents, model_document, set_router_parameters, Control,
};
use super::drive::{drive_all, drive_closed_from, ClosedLoop, DriveStats, RequestOpts};
use super::emulator_thread::EmulatorThread;
use super::failpoint_limiter::failpoint_controller;
use super::members::{Drops, Members};
use super::metrics::{Recorder, Second};
use super::sampler::sampler;
use super::schedule::{self, Arrival, ScheduleSpec};
use super::summary::{summarize, ColdShards, RunSummary};
use emulator::{EmulatorConfig, Topology};

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

/// Runs the whole lab: starts the emulator, seeds it, runs every variant (`repeats` times),
/// and returns the figures.
pub async fn run(cfg: &LabConfig, progress: &ProgressBar) -> Result<LabRun, String> {
    let wall = std::time::Instant::now();
    let capacity = cfg.effective_capacity();
    let topology = match cfg.persona {
        Persona::Replicaset => Topology::ReplicaSet {
            name: "lab".into(),
            members: cfg.members.max(1),
        },
        Persona::Standalone => Topology::Standalone,
        Persona::Sharded => Topology::Sharded {
            routers: cfg.sharding.routers.max(1),
        },
    };
    // Shards matter only to the sharded persona (the emulator ignores them elsewhere).
    let shards = match cfg.persona {
        Persona::Sharded => cfg.sharding.shards.max(1),
        _ => 1,
    };
    let emulator = EmulatorThread::start(EmulatorConfig {
        topology,
        shards,
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

async fn run_against(
    cfg: &LabConfig,
    capacity: f64,
    uri: &str,
    progress: &ProgressBar,
) -> Result<Runs, String> {
    let control = Arc::new(Control::connect_for(uri, cfg).await?);
    if cfg.persona == Persona::Sharded {
        // Once for the whole run: the routers keep their parameters across the re-seeding
        // and model changes before each variant.
        set_router_parameters(uri, &cfg.sharding).await?;
    }
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
            // Nor random rejections: capacity is what the cores complete.
            unlimited.remove("randomRejectShare");
            control
                .set_model(&unlimited, &member_documents(cfg, capacity))
                .await?;
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
            let members = member_documents(cfg, capacity);
            control.set_model(&d, &members).await?;
            Some((d, members))
        }
        _ => None,
    };
    let duration = cfg.scenario.duration();
    let len = duration.as_secs_f64().ceil() as usize;
    let mut runs = Vec::new();
    for rep in 0..cfg.repeats.max(1) {
        if let Load::Closed { workers } = cfg.load {
            runs.extend(run_interleaved(cfg, uri, rep, workers, &control, progress).await?);
            continue;
        }
        let seed = schedule::repetition_seed(cfg.seed, rep);
        let schedules = schedule::build(&ScheduleSpec {
            phases: &cfg.scenario.phases,
            capacity,
            instances: cfg.instances,
            arrivals: cfg.arrivals,
            mix: &cfg.mix,
            docs: cfg.docs,
            seed,
        });
        // Each repetition starts at a different variant, so that whatever drifts over a run
        // (the collection grows by the inserts of every variant before) does not always
        // favour the variants listed first; and every variant starts from the seeded
        // collection.
        let first = rep % cfg.variants.len().max(1);
        let order = cfg.variants[first..].iter().chain(&cfg.variants[..first]);
        // The model's seed follows the schedule's: every variant of a repetition meets the same
        // random draws (they are keyed by request id and seed), and each repetition new ones.
        let model = model.as_ref().map(|(d, members)| {
            let mut d = d.clone();
            d.insert("seed", seed as i64);
            (d, members.clone())
        });
        for variant in order {
            if cfg.faults.is_some() {
                // Every variant starts on the same primary, so that the scheduled step-downs
                // hand over in the same order and each request meets the same member's
                // faults and rejections (common random numbers, issue 27).
                progress.set_message(format!("{}: restoring member 0 as primary", variant.name));
                restore_primary(uri).await?;
            }
            if let Some(m) = &model {
                progress.set_message(format!(
                    "{}: waiting for the server to go idle",
                    variant.name
                ));
                control.wait_idle(Duration::from_secs(10)).await;
                // Re-seeding goes around the model, which could reject it.
                control.set_model_enabled(false).await?;
                control.seed(cfg.docs).await?;
                control.set_model(&m.0, &m.1).await?;
            } else {
                control.seed(cfg.docs).await?;
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
            let (seconds, stats, cpu_total, fork_stats, steal_pct) = run;
            let mut summary = summarize(
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
            summary.fork_stats = fork_stats;
            summary.steal_pct = steal_pct;
            summary.cold_shards = cfg.shard_keys().map(|_| ColdShards::of(&seconds, len));
            summary.judge_validity(cfg.saturation_expected);
            runs.push(VariantRun {
                variant: variant.clone(),
                rep,
                seconds,
                summary,
            });
        }
    }
    if model.is_some() {
        let _ = control.set_model_enabled(false).await;
    }
    control.client.clone().shutdown().immediate(true).await;
    Ok((model.map(|m| m.0), runs, capacity, capacity_note))
}

/// What one variant run measured: per-second figures, the driver's view, mean process CPU
/// (percent of all cores), the fork's overload statistics summed over the instances, and the
/// machine's steal time (percent).
type VariantFigures = (
    Vec<Second>,
    DriveStats,
    Option<f64>,
    Option<ForkStats>,
    Option<f64>,
);

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
) -> Result<VariantFigures, String> {
    let attempts = Arc::new(AtomicU64::new(0));
    // The recorder's clock starts once the clients are connected (set below).
    let recorder = Arc::new(Recorder::new(Instant::now() + Duration::from_secs(3600)));
    let clients = connect_instances(cfg, uri, variant, &recorder, &attempts).await?;
    let start = Instant::now() + Duration::from_millis(100);
    recorder.set_start(start);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut helpers = JoinSet::new();
    helpers.spawn(sampler(
        recorder.clone(),
        control.clone(),
        clients.clone(),
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
    let faults = match &cfg.faults {
        Some(f) => Some(start_faults(f, uri, start, stop_rx.clone()).await?),
        None => None,
    };
    let cpu_start = super::sys::process_cpu();
    let ticks_start = super::sys::machine_ticks();
    let opts = request_opts(cfg, variant);
    // Closed loops run interleaved (`run_interleaved`), never through here.
    let stats = drive_all(&clients, schedules, recorder.clone(), opts).await;
    let cpu_end = super::sys::process_cpu();
    let steal_pct = match (ticks_start, super::sys::machine_ticks()) {
        (Some(a), Some(b)) => a.steal_pct_until(&b),
        _ => None,
    };
    let wall = Instant::now()
        .saturating_duration_since(start)
        .as_secs_f64();
    let _ = stop_tx.send(true);
    while helpers.join_next().await.is_some() {}
    if let Some((members, stepper)) = faults {
        let _ = stepper.await;
        // Off before the next variant seeds its collection.
        members.set_drops(None).await?;
        members.shutdown().await;
    }
    let fork_stats = overload_stats_of(&clients);
    for c in &clients {
        c.shutdown().await;
    }
    let cpu_total = match (cpu_start, cpu_end) {
        (Some(a), Some(b)) if wall > 0.0 => {
            Some(100.0 * b.saturating_sub(a).as_secs_f64() / wall / super::sys::cores() as f64)
        }
        _ => None,
    };
    let len = cfg.scenario.duration().as_secs_f64().ceil() as usize;
    Ok((recorder.take(len), stats, cpu_total, fork_stats, steal_pct))
}

/// Steps the replica set's primaries down until member 0, the primary the emulator starts
/// with, is primary again.
async fn restore_primary(uri: &str) -> Result<(), String> {
    let members = Members::connect(uri).await?;
    let restored = members.make_primary(0, RESTORE_PRIMARY_WITHIN).await;
    members.shutdown().await;
    restored
}

/// How long [`restore_primary`] may take: each step-down leaves the set without a primary for
/// a few hundred milliseconds, and it takes at most two.
const RESTORE_PRIMARY_WITHIN: Duration = Duration::from_secs(10);

/// Switches `faults`' connection drops on on every member and starts stepping the primary
/// down every `faults.step_down_every` from `start` until `stop` turns true. Returns the
/// members' connections (to switch the drops off) and the stepping task.
async fn start_faults(
    faults: &Faults,
    uri: &str,
    start: Instant,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(Members, tokio::task::JoinHandle<()>), String> {
    let members = Members::connect(uri).await?;
    members
        .set_drops(Some(&Drops {
            before_share: faults.drop_before,
            before_commands: &["insert", "update"],
            after_share: faults.drop_after,
        }))
        .await?;
    let every = faults.step_down_every.max(Duration::from_millis(100));
    let stepper_members = Members::connect(uri).await?;
    let stepper = tokio::spawn(async move {
        let mut next = start + every;
        // Bounded: ends when the run stops (the sender drops or sends `true`).
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {
                    // A step-down that finds no primary (mid-election) is skipped.
                    let _ = stepper_members.step_down().await;
                    next += every;
                }
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        break;
                    }
                }
            }
        }
        stepper_members.shutdown().await;
    });
    Ok((members, stepper))
}

/// How the generator treats each request of `variant` under `cfg`: the deadline, and what the
/// variant's application does with it ([`LabConfig::application`]).
fn request_opts(cfg: &LabConfig, variant: &Variant) -> RequestOpts {
    let app = cfg.application(variant);
    RequestOpts {
        deadline: cfg.deadline,
        drain: cfg.drain,
        range_len: cfg.mix.range_len,
        max_time: app.max_time.then_some(cfg.deadline),
        on_deadline: app.on_deadline,
        app_retries: cfg.app_retries,
        shard_keys: cfg.shard_keys(),
    }
}

/// Length of one variant's turn in an interleaved closed loop.
const SLICE: Duration = Duration::from_millis(250);

/// Slices booked into one second of a variant's figures: [`SLICE`] × this is one second, so
/// that each of a variant's seconds holds one second of its running time.
const SLICES_PER_SECOND: usize = 4;

/// One variant's clients and figures in an interleaved closed loop.
struct Turn<'a> {
    variant: &'a Variant,
    clients: Vec<Arc<dyn LabClient>>,
    recorder: Arc<Recorder>,
    stats: DriveStats,
    /// The process's CPU time and the wall time over the variant's counted slices.
    cpu: Duration,
    wall: Duration,
    /// The same over the slices of the second being booked.
    second_cpu: Duration,
    second_wall: Duration,
    /// The machine's ticks over the variant's counted slices, summed: all, and stolen.
    ticks: super::sys::MachineTicks,
}

/// One repetition of a closed-loop scenario (`fast-path`). Every variant's clients connect
/// once; then the variants take turns in [`SLICE`]s, in a new order every round, four rounds
/// for each second of the scenario, after one uncounted warm-up round. Four consecutive slices
/// of a variant make one of its seconds, so it is summarized as if it had run them back to
/// back, and its second `n` comes from the same four rounds as every other variant's.
///
/// Why slices: a closed loop saturates the CPU, and its figure is a ratio of throughputs. Run
/// one variant after another for seconds each, the 2-core machines' own drift (one variant's
/// ratio to upstream scattered from 0.83 to 1.20 over nine repetitions) swamps the 2 % the
/// `fast-path` target allows; slices taken in turn see the same machine.
///
/// Why short ones: the machine's speed changes within a second too (the hypervisor takes 8–26 %
/// of the cores' time, varying second to second), so two slices taken in turn still differ,
/// by 15–18 % (standard deviation of their ratio) whether they last one second or a quarter.
/// The scatter of a variant's mean falls with the number of slices, so quarter-second slices
/// give four times as many pairs in the same time and halve it (docs/lab.md, "How precise the
/// fast path is").
async fn run_interleaved(
    cfg: &LabConfig,
    uri: &str,
    rep: usize,
    workers: usize,
    control: &Control,
    progress: &ProgressBar,
) -> Result<Vec<VariantRun>, String> {
    control.seed(cfg.docs).await?;
    let seconds_len = cfg.scenario.duration().as_secs_f64().ceil().max(1.0) as usize;
    let rounds = seconds_len * SLICES_PER_SECOND;
    let mut turns = Vec::new();
    for variant in &cfg.variants {
        progress.set_message(format!("{} #{}: connecting", variant.name, rep + 1));
        let recorder = Arc::new(Recorder::new(Instant::now() + Duration::from_secs(3600)));
        let attempts = Arc::new(AtomicU64::new(0));
        let clients = connect_instances(cfg, uri, variant, &recorder, &attempts).await?;
        turns.push(Turn {
            variant,
            clients,
            recorder,
            stats: DriveStats::default(),
            cpu: Duration::ZERO,
            wall: Duration::ZERO,
            second_cpu: Duration::ZERO,
            second_wall: Duration::ZERO,
            ticks: super::sys::MachineTicks::default(),
        });
    }
    let mut order: Vec<usize> = (0..turns.len()).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed.wrapping_add(rep as u64 * 1000));
    // Round 0 warms every pool and code path up; its second is dropped below.
    for round in 0..=rounds {
        // A new order every round: rotating one order would have each variant follow the same
        // other variant in most rounds, and a slice can inherit its predecessor's leftover
        // work (one rotating run put `fork-default`, upstream's path, at 0.94–0.97).
        order.shuffle(&mut rng);
        for &index in &order {
            let turn = &mut turns[index];
            let start = Instant::now() + Duration::from_millis(10);
            // Round 0 books into second 0 (dropped below); round `r` into quarter
            // `(r - 1) % 4` of second `1 + (r - 1) / 4`.
            let second = round.div_ceil(SLICES_PER_SECOND);
            let quarter = round.saturating_sub(1) % SLICES_PER_SECOND;
            let booked_at = Duration::from_secs(second as u64) + SLICE * quarter as u32;
            let Some(origin) = start.checked_sub(booked_at) else {
                return Err("the clock is too close to its origin for the slices".into());
            };
            turn.recorder.set_start(origin);
            let spec = ClosedLoop {
                workers,
                length: SLICE,
                mix: cfg.mix.clone(),
                docs: cfg.docs,
                seed: cfg.seed.wrapping_add((rep * 1000 + round) as u64),
            };
            let cpu_start = super::sys::process_cpu();
            let ticks_start = super::sys::machine_ticks();
            let opts = request_opts(cfg, turn.variant);
            let stats =
                drive_closed_from(&turn.clients, &spec, turn.recorder.clone(), opts, start).await;
            let wall = Instant::now().saturating_duration_since(start);
            let cpu = match (cpu_start, super::sys::process_cpu()) {
                (Some(a), Some(b)) => b.saturating_sub(a),
                _ => Duration::ZERO,
            };
            if round == 0 {
                continue;
            }
            if let (Some(a), Some(b)) = (ticks_start, super::sys::machine_ticks()) {
                turn.ticks.total += b.total.saturating_sub(a.total);
                turn.ticks.steal += b.steal.saturating_sub(a.steal);
            }
            if quarter == 0 {
                (turn.second_cpu, turn.second_wall) = (Duration::ZERO, Duration::ZERO);
            }
            turn.second_cpu += cpu;
            turn.second_wall += wall;
            let cores = super::sys::cores() as f64;
            turn.recorder.set_cpu(
                second,
                100.0 * turn.second_cpu.as_secs_f64()
                    / turn.second_wall.as_secs_f64().max(1e-9)
                    / cores,
            );
            turn.stats.sent += stats.sent;
            turn.stats.unfinished += stats.unfinished;
            turn.cpu += cpu;
            turn.wall += wall;
            let (_, good) = turn.recorder.peek(second);
            progress.set_message(format!(
                "{} #{}: round {round}/{rounds}, {good} ops in second {second}",
                turn.variant.name,
                rep + 1
            ));
        }
    }
    let mut runs = Vec::new();
    for turn in turns {
        let fork_stats = overload_stats_of(&turn.clients);
        for c in &turn.clients {
            c.shutdown().await;
        }
        let mut seconds = turn.recorder.take(seconds_len + 1);
        seconds.remove(0);
        let cpu_total = (turn.wall > Duration::ZERO).then(|| {
            100.0 * turn.cpu.as_secs_f64() / turn.wall.as_secs_f64() / super::sys::cores() as f64
        });
        let mut summary = summarize(
            turn.variant,
            rep,
            &seconds,
            &cfg.scenario,
            seconds_len,
            turn.stats,
            None,
            cpu_total,
            cfg.max_lag_p99,
        );
        summary.fork_stats = fork_stats;
        summary.steal_pct = super::sys::MachineTicks::default().steal_pct_until(&turn.ticks);
        summary.cold_shards = cfg
            .shard_keys()
            .map(|_| ColdShards::of(&seconds, seconds_len));
        summary.judge_validity(cfg.saturation_expected);
        runs.push(VariantRun {
            variant: turn.variant.clone(),
            rep,
            seconds,
            summary,
        });
    }
    Ok(runs)
}
