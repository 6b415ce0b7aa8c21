//! `lab`: the overload lab. `lab run --help` lists the parameters; `docs/lab.md` explains
//! the method and the report.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use lab::loadgen::config::{
    Arrivals, LabConfig, Length, OnDeadline, OpMix, Persona, Scenario, ServerMode, ShardOptions,
    Variant,
};
use lab::loadgen::scenarios::{ScenarioName, ScenarioParams};
use lab::loadgen::{report, runner, verdict};

#[derive(Parser)]
#[command(
    name = "lab",
    about = "Open-loop overload lab: the fork against upstream 3.9.1"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the variants against an in-process emulator and writes the report.
    Run(Box<RunArgs>),
    /// Lists the built-in variants.
    Variants,
    /// Counts instructions per operation of upstream and the fork with callgrind (pathbench
    /// at two counts) and writes instructions.json for `lab run --suite --instructions`.
    Instructions(InstructionsArgs),
}

#[derive(Args)]
struct InstructionsArgs {
    /// Output folder (default lab-runs/<timestamp>-instructions).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Operations of the shorter run.
    #[arg(long, default_value_t = 1_000)]
    low: u64,
    /// Operations of the longer run.
    #[arg(long, default_value_t = 11_000)]
    high: u64,
    /// Variants to count (default: upstream-default, fork-default, fork-budget-timeout,
    /// fork-recommended, fork-controls).
    #[arg(long, value_delimiter = ',')]
    variants: Vec<String>,
}

#[derive(Args)]
struct RunArgs {
    /// Scenario (docs/lab.md describes each).
    #[arg(long, value_enum, default_value = "burst")]
    scenario: ScenarioName,
    /// Runs every scenario with its variants at the suite's lengths, `--repeats` times
    /// (default 3), and writes verdict.md and verdict.json.
    #[arg(long, conflicts_with_all = ["phases", "full"])]
    suite: bool,
    /// With --suite: only these scenarios (comma-separated names).
    #[arg(long, value_delimiter = ',', requires = "suite")]
    scenarios: Vec<String>,
    /// Custom phases `LOAD%:SECONDS,...` (e.g. `50:10,130:15,50:20`); replaces the
    /// scenario's schedule.
    #[arg(long)]
    phases: Option<String>,
    /// Short phases (about 12 s per variant).
    #[arg(long, conflicts_with = "long")]
    quick: bool,
    /// Seed 004's phase lengths (10 s + 15 s + 20 s; sustained 30 s).
    #[arg(long)]
    long: bool,
    /// Runs every variant three times and reports median and spread.
    #[arg(long)]
    full: bool,
    /// Runs of each variant (overrides --full's 3).
    #[arg(long)]
    repeats: Option<usize>,
    /// Comma-separated variants: built-in names or NAME:DRIVER[:URI_OPTIONS].
    #[arg(long, value_delimiter = ',')]
    variants: Vec<String>,
    /// Output folder (default lab-runs/<timestamp>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// RNG seed (arrivals, mix, keys, server model).
    #[arg(long, default_value_t = 4)]
    seed: u64,
    /// Operations per second the server sustains (100 % load); default derived from the
    /// server model (or 800 in failpoint mode).
    #[arg(long)]
    capacity: Option<f64>,
    /// Where overload comes from.
    #[arg(long, value_enum, default_value = "model")]
    server: ServerMode,
    /// Emulator persona.
    #[arg(long, value_enum, default_value = "replicaset")]
    persona: Persona,
    /// Arrival process.
    #[arg(long, value_enum, default_value = "poisson")]
    arrivals: Arrivals,
    /// Simulated service instances (one client each); default 4, 64 in the `fleet-*`
    /// scenarios.
    #[arg(long)]
    instances: Option<usize>,
    /// maxPoolSize of each instance.
    #[arg(long, default_value_t = 100)]
    max_pool_size: u32,
    /// minPoolSize of each instance.
    #[arg(long, default_value_t = 0)]
    min_pool_size: u32,
    /// Further URI options for every client (`k=v&k2=v2`).
    #[arg(long, default_value = "")]
    client_options: String,
    /// Application deadline per request, in ms; default 100, but 1000 in transient.
    #[arg(long)]
    deadline_ms: Option<u64>,
    /// Every variant's application sends maxTimeMS = deadline on finds, whatever the variant's
    /// own application does (an override: the report marks the variants it changes).
    #[arg(long)]
    max_time_ms: bool,
    /// Operation mix, e.g. `point=80,range=10,insert=5,update=5`.
    #[arg(long)]
    mix: Option<String>,
    /// Documents in the collection.
    #[arg(long, default_value_t = 1000)]
    docs: i64,
    /// The server model's ingress limiter rate as a share of capacity (0 turns it off);
    /// default 0.9, 0 in no-limiter.
    #[arg(long)]
    limiter_share: Option<f64>,
    /// What every variant's application does at its deadline, whatever the variant's own does
    /// (an override, marked in the report): `continue` lets the spawned driver call go on;
    /// `drop` drops the driver's future. Default: each variant's own, but `drop` in `flood`.
    #[arg(long, value_enum)]
    on_deadline: Option<OnDeadline>,
    /// transient: share of admitted data requests the server rejects at random.
    #[arg(long, default_value_t = lab::loadgen::scenarios::TRANSIENT_REJECT_SHARE)]
    reject_share: f64,
    /// app-retries: times the application retries an overload error within its deadline.
    #[arg(long, default_value_t = lab::loadgen::scenarios::APP_RETRIES)]
    app_retries: u32,
    /// flood: offered load in percent of capacity (at least 500).
    #[arg(long, default_value_t = lab::loadgen::scenarios::FLOOD_LOAD * 100.0)]
    flood_load: f64,
    #[command(flatten)]
    sharding: ShardOptions,
    /// Server core time per rejection (ms, the model's `costs.rejectionMs`): default 0.3 in
    /// flood, the model's own elsewhere.
    #[arg(long)]
    rejection_ms: Option<f64>,
    /// Server core time to stop an expired or disconnected request (ms, the model's
    /// `costs.expiryMs`): default the model's own. With --rejection-ms, for the sensitivity
    /// table of flood and no-limiter.
    #[arg(long)]
    expiry_ms: Option<f64>,
    /// Runs the sensitivity grid of the model's unmeasured costs instead of a scenario: flood
    /// over rejectionMs × expiryMs at ×0.3, ×1, ×3, and no-limiter over expiryMs, each cell
    /// with the scenario's variants (or --variants), at the suite's lengths; writes
    /// sensitivity.md.
    #[arg(long, conflicts_with_all = ["suite", "phases", "soak", "audit"])]
    sensitivity: bool,
    /// With --suite: the judged verdict (issue 55). Every scenario runs a number of
    /// repetitions declared here (`--repeats`, default and at least 10); each fork variant is
    /// compared with the scenario's best upstream configuration by ratios paired by
    /// repetition, with a 95 % interval and its outcome (lead, tie, loss), written to
    /// judged.md and judged.json beside the verdict. Up to 90 minutes: not for CI.
    #[arg(long, requires = "suite", conflicts_with = "publish")]
    judge: bool,
    /// With --suite: include instructions per operation from this `instructions.json`
    /// (written by `lab instructions`) in the verdict.
    #[arg(long, requires = "suite")]
    instructions: Option<PathBuf>,
    /// With --suite: also write a dated results file (commit, host, verdict) into DIR and
    /// rewrite DIR/current.md (e.g. `--publish docs/results`).
    #[arg(long, value_name = "DIR", requires = "suite")]
    publish: Option<PathBuf>,
    /// fast-path: closed-loop workers in all.
    #[arg(long, default_value_t = lab::loadgen::scenarios::FAST_PATH_WORKERS)]
    workers: usize,
    /// Extra server model settings (JSON object merged into `labOverload`).
    #[arg(long)]
    model_json: Option<String>,
    /// Schedule lag p99 (ms) above which a run is INVALID.
    #[arg(long, default_value_t = 5.0)]
    max_lag_ms: f64,
    /// Seconds to wait for late completions after the schedule.
    #[arg(long, default_value_t = 2.0)]
    drain_secs: f64,
    /// Soak for MINUTES instead of a scenario: the fork's recommended settings at 150 % with
    /// faults, sampled every second, then a drain check (docs/lab.md "Soak").
    #[arg(long, value_name = "MINUTES", conflicts_with_all = ["suite", "phases", "full"])]
    soak: Option<f64>,
    /// Runs the exactly-once audit with WRITES writes per driver instead of a scenario
    /// (docs/lab.md "Exactly-once audit").
    #[arg(long, value_name = "WRITES", conflicts_with_all = ["suite", "phases", "full", "soak"])]
    audit: Option<u64>,
    /// With --audit: the drivers (comma-separated: fork, fork-default, upstream).
    #[arg(long, value_delimiter = ',', requires = "audit")]
    audit_drivers: Vec<String>,
    /// With --soak: seconds between step-downs, half that before the baseline (0: none).
    #[arg(long, default_value_t = lab::loadgen::soak::STEP_DOWN_EVERY_SECS, requires = "soak")]
    step_down_secs: f64,
}

fn length(a: &RunArgs) -> Length {
    if a.quick {
        Length::Quick
    } else if a.long {
        Length::Long
    } else if a.suite {
        Length::Suite
    } else {
        Length::Default
    }
}

fn params(a: &RunArgs) -> Result<ScenarioParams, String> {
    let p = ScenarioParams {
        reject_share: a.reject_share,
        app_retries: a.app_retries,
        flood_load: a.flood_load / 100.0,
        rejection_ms: a.rejection_ms,
        expiry_ms: a.expiry_ms,
        workers: a.workers,
    };
    p.check()?;
    Ok(p)
}

/// The configuration of scenario `name`: the run's options, then the scenario's settings,
/// then the options that replace a scenario's own (phases, limiter share, variants).
fn config(a: &RunArgs, name: ScenarioName) -> Result<LabConfig, String> {
    config_with(a, name, &params(a)?, length(a))
}

/// [`config`] with the scenario parameters `p` and lengths `len` instead of the command
/// line's.
fn config_with(
    a: &RunArgs,
    name: ScenarioName,
    p: &ScenarioParams,
    len: Length,
) -> Result<LabConfig, String> {
    let model_overrides = match &a.model_json {
        Some(j) => Some(serde_json::from_str(j).map_err(|e| format!("--model-json: {e}"))?),
        None => None,
    };
    if !(a.max_lag_ms.is_finite() && a.max_lag_ms > 0.0) {
        return Err("--max-lag-ms must be positive".into());
    }
    if !(a.drain_secs.is_finite() && a.drain_secs >= 0.0) {
        return Err("--drain-secs must be >= 0".into());
    }
    if a.instances.is_some_and(|n| n == 0 || n > 256) {
        return Err("--instances must be in 1..=256".into());
    }
    let min_judged = lab::loadgen::judge::MIN_REPETITIONS;
    if a.judge && a.repeats.is_some_and(|n| n < min_judged) {
        return Err(format!(
            "--judge declares at least {min_judged} repetitions (--repeats)"
        ));
    }
    let mut cfg = LabConfig {
        repeats: a
            .repeats
            .unwrap_or(if a.judge {
                lab::loadgen::judge::MIN_REPETITIONS
            } else if a.full || a.suite || a.sensitivity {
                3
            } else {
                1
            })
            .max(1),
        capacity: match a.capacity {
            Some(c) if c.is_finite() && c > 0.0 => c,
            Some(_) => return Err("--capacity must be positive".into()),
            None => 0.0,
        },
        arrivals: a.arrivals,
        max_pool_size: a.max_pool_size,
        min_pool_size: a.min_pool_size,
        client_options: a.client_options.clone(),
        max_time_override: a.max_time_ms.then_some(true),
        drain: Duration::from_secs_f64(a.drain_secs),
        mix: match &a.mix {
            Some(m) => OpMix::parse(m)?,
            None => OpMix::default(),
        },
        docs: a.docs.max(1),
        seed: a.seed,
        server_mode: a.server,
        persona: a.persona,
        model_overrides,
        max_lag_p99: Duration::from_secs_f64(a.max_lag_ms / 1000.0),
        ..LabConfig::default()
    };
    name.apply(&mut cfg, len, p);
    name.apply_shard_options(&mut cfg, &a.sharding)?;
    if let Some(n) = a.instances {
        cfg.instances = n;
    }
    if let Some(on_deadline) = a.on_deadline {
        cfg.on_deadline_override = Some(on_deadline);
    }
    if let Some(ms) = a.deadline_ms {
        if ms == 0 {
            return Err("--deadline-ms must be positive".into());
        }
        cfg.deadline = Duration::from_millis(ms);
    }
    if let Some(p) = &a.phases {
        cfg.scenario = Scenario {
            name: cfg.scenario.name.clone(),
            ..Scenario::parse_custom(p)?
        };
    }
    if let Some(share) = a.limiter_share {
        if !(share.is_finite() && (0.0..=10.0).contains(&share)) {
            return Err("--limiter-share must be between 0 and 10".into());
        }
        cfg.limiter_share = share;
    }
    cfg.variants = if a.variants.is_empty() {
        name.default_variants()
    } else {
        a.variants
            .iter()
            .map(|v| Variant::parse(v))
            .collect::<Result<Vec<_>, _>>()?
    };
    Ok(cfg)
}

fn default_out() -> PathBuf {
    // `lab-runs/YYYYMMDD-HHMMSS` (UTC), from the RFC 3339 rendering of the current time.
    let now = bson::DateTime::now()
        .try_to_rfc3339_string()
        .unwrap_or_default();
    let digits: String = now.chars().filter(char::is_ascii_digit).take(14).collect();
    let name = match (digits.get(..8), digits.get(8..14)) {
        (Some(date), Some(time)) => format!("{date}-{time}"),
        _ => "run".to_string(),
    };
    PathBuf::from("lab-runs").join(name)
}

async fn run(a: RunArgs) -> Result<bool, String> {
    if let Some(minutes) = a.soak {
        return soak(&a, minutes).await;
    }
    if let Some(writes) = a.audit {
        return audit(&a, writes).await;
    }
    if a.suite {
        return suite(a).await;
    }
    if a.sensitivity {
        return sensitivity(&a).await;
    }
    let cfg = config(&a, a.scenario)?;
    let out = a.out.clone().unwrap_or_else(default_out);
    let total = cfg.scenario.duration().as_secs_f64().ceil() as u64
        * (cfg.variants.len() * cfg.repeats) as u64;
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len}s {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let result = runner::run(&cfg, &bar).await;
    bar.finish_and_clear();
    let run = result?;
    report::write_all(&run, &out)?;
    println!(
        "\nscenario {} · capacity {:.0} ops/s ({}) · server {:?} · {} instance(s) · deadline {} ms",
        cfg.scenario.name,
        run.capacity,
        run.capacity_note,
        cfg.server_mode,
        cfg.instances,
        cfg.deadline.as_millis()
    );
    println!("\n{}", report::text_table(&run));
    let overridden: Vec<String> = cfg
        .variants
        .iter()
        .filter(|v| cfg.app_overridden(v))
        .map(|v| {
            format!(
                "{} ({})",
                v.name,
                cfg.application(v).describe(&v.uri_options)
            )
        })
        .collect();
    if !overridden.is_empty() {
        println!(
            "application set by the scenario or --on-deadline/--max-time-ms, not the variant's \
             own: {}",
            overridden.join("; ")
        );
    }
    let invalid: Vec<String> = run
        .runs
        .iter()
        .filter(|r| !r.summary.is_valid())
        .map(|r| {
            format!(
                "{} #{} ({})",
                r.variant.name,
                r.rep + 1,
                r.summary.invalid_why.join(", ")
            )
        })
        .collect();
    if !invalid.is_empty() {
        println!("INVALID runs: {}.", invalid.join("; "));
    }
    let invalid = !invalid.is_empty();
    if cfg.saturation_expected {
        println!("(this scenario saturates the client on purpose: CPU saturation is expected)");
    } else if run.runs.iter().any(|r| r.summary.saturated) {
        println!("CPU SATURATED in some runs: the machine, not the driver, may limit them.");
    }
    println!("report: {}", out.join("report.md").display());
    Ok(!invalid)
}

/// `--soak MINUTES`: the soak run and its verdict (`false` when it failed).
async fn soak(a: &RunArgs, minutes: f64) -> Result<bool, String> {
    use lab::loadgen::soak;
    if !(minutes.is_finite() && minutes > 0.0 && minutes <= 24.0 * 60.0) {
        return Err("--soak must be between 0 and 1440 minutes".into());
    }
    if !(a.step_down_secs.is_finite() && a.step_down_secs >= 0.0) {
        return Err("--step-down-secs must be >= 0".into());
    }
    let mut base = config(a, a.scenario)?;
    let mut cfg = soak::SoakConfig::new(Duration::from_secs_f64(minutes * 60.0), base.clone());
    // A mix given on the command line wins over the soak's.
    if a.mix.is_some() {
        base.persona = cfg.lab.persona;
        base.members = cfg.lab.members;
        cfg.lab = base;
    }
    // The scenario's settings do not apply: the soak has its own load and faults.
    cfg.lab.limiter_share = lab::loadgen::config::LabConfig::default().limiter_share;
    cfg.lab.model_overrides = None;
    cfg.lab.random_reject_share = 0.0;
    cfg.step_down_every = if a.step_down_secs > 0.0 {
        Some(
            Duration::try_from_secs_f64(a.step_down_secs)
                .map_err(|e| format!("--step-down-secs {}: {e}", a.step_down_secs))?,
        )
    } else {
        None
    };
    if !a.variants.is_empty() {
        cfg.variant = Variant::parse(&a.variants[0])?;
    }
    let out = a.out.clone().unwrap_or_else(default_out);
    let bar = ProgressBar::new(cfg.length.as_secs());
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len}s {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let result = soak::run(&cfg, &bar).await;
    bar.finish_and_clear();
    let report = result?;
    soak::write(&report, &out)?;
    println!("\n{}", soak::markdown(&report));
    println!("report: {}", out.join("soak.md").display());
    Ok(report.passed)
}

/// `--audit WRITES`: the exactly-once audit of each driver (`false` when one failed).
async fn audit(a: &RunArgs, writes: u64) -> Result<bool, String> {
    use lab::loadgen::audit::{self, AuditDriver, AuditPlan};
    if writes == 0 || writes > 10_000_000 {
        return Err("--audit must be between 1 and 10,000,000 writes".into());
    }
    let drivers = if a.audit_drivers.is_empty() {
        AuditDriver::ALL.to_vec()
    } else {
        a.audit_drivers
            .iter()
            .map(|d| AuditDriver::parse(d))
            .collect::<Result<Vec<_>, _>>()?
    };
    let plan = AuditPlan {
        seed: a.seed,
        ..AuditPlan::for_writes(writes)
    };
    let out = a.out.clone().unwrap_or_else(default_out);
    let mut runs = Vec::new();
    for d in drivers {
        println!("audit: {} ...", d.name());
        let run = audit::run_one(&plan, d).await?;
        println!("audit: {}: {} ({:.0} s)", d.name(), run.audit, run.seconds);
        runs.push(run);
        // Written after each driver, so a long run leaves its figures so far.
        audit::write(&plan, &runs, &out)?;
    }
    println!("\n{}", audit::markdown(&plan, &runs));
    println!("report: {}", out.join("audit.md").display());
    Ok(runs.iter().all(|r| r.failures(&plan).is_empty()))
}

/// `--sensitivity`: the grid of the model's costs, one run of each cell's scenario.
async fn sensitivity(a: &RunArgs) -> Result<bool, String> {
    use lab::loadgen::sensitivity::{grid, markdown, Row};
    let out = a.out.clone().unwrap_or_else(default_out);
    let base = params(a)?;
    let cells = grid();
    let mut rows = Vec::new();
    for (i, cell) in cells.iter().enumerate() {
        let p = ScenarioParams {
            rejection_ms: cell.rejection_ms,
            expiry_ms: Some(cell.expiry_ms),
            ..base.clone()
        };
        // The suite's lengths unless --quick or --long: twelve cells must fit a sitting.
        let len = if a.quick || a.long {
            length(a)
        } else {
            Length::Suite
        };
        let cfg = config_with(a, cell.scenario, &p, len)?;
        println!(
            "sensitivity {}/{}: {} rejectionMs {} expiryMs {}",
            i + 1,
            cells.len(),
            cell.scenario.name(),
            cell.rejection_ms
                .map_or_else(|| "(the model's)".to_string(), |v| format!("{v:.2}")),
            cell.expiry_ms
        );
        let bar = ProgressBar::hidden();
        let run = runner::run(&cfg, &bar).await?;
        let dir = out.join(format!(
            "{}-r{}-e{}",
            cell.scenario.name(),
            cell.rejection_ms
                .map_or_else(|| "model".into(), |v| format!("{v:.2}")),
            cell.expiry_ms
        ));
        report::write_all(&run, &dir)?;
        rows.push(Row::of(*cell, &verdict::scenario_verdict(&run)));
        // Written after each cell, so a long run leaves its table so far.
        std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
        let path = out.join("sensitivity.md");
        std::fs::write(&path, markdown(&rows)).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    println!("\n{}", markdown(&rows));
    println!("table: {}", out.join("sensitivity.md").display());
    Ok(rows.iter().all(|r| r.valid))
}

/// The scenarios `--suite` runs: those named with `--scenarios`, else the suite's.
fn suite_names(a: &RunArgs) -> Result<Vec<ScenarioName>, String> {
    if a.scenarios.is_empty() {
        return Ok(ScenarioName::SUITE.to_vec());
    }
    a.scenarios.iter().map(|n| ScenarioName::parse(n)).collect()
}

/// Refuses the sharding options (`--shards`, ...) where a scenario the run configures has no
/// sharded cluster, before anything runs: [`config_with`] would refuse them too, but only
/// once the suite reached that scenario's configuration, and as a failed run rather than a
/// bad option.
fn check_shard_options(a: &RunArgs) -> Result<(), String> {
    if a.sharding.is_empty() {
        return Ok(());
    }
    if a.audit.is_some() {
        return Err("--shards, --hot-share and --router-* are not for --audit".into());
    }
    let names = if a.suite {
        suite_names(a)?
    } else if a.sensitivity {
        lab::loadgen::sensitivity::grid()
            .iter()
            .map(|c| c.scenario)
            .collect()
    } else {
        vec![a.scenario]
    };
    for name in names {
        let mut cfg = LabConfig {
            persona: a.persona,
            ..LabConfig::default()
        };
        name.apply(&mut cfg, length(a), &ScenarioParams::default());
        name.apply_shard_options(&mut cfg, &a.sharding)?;
    }
    Ok(())
}

/// `--suite`: every scenario (or those named) with its variants, then the verdict.
async fn suite(a: RunArgs) -> Result<bool, String> {
    let instructions = match &a.instructions {
        Some(p) => Some(verdict::InstructionCounts::read(p)?),
        None => None,
    };
    let names = suite_names(&a)?;
    let configs = names
        .iter()
        .map(|n| config(&a, *n))
        .collect::<Result<Vec<_>, _>>()?;
    let out = a.out.clone().unwrap_or_else(default_out);
    let total: u64 = configs
        .iter()
        .map(|c| {
            c.scenario.duration().as_secs_f64().ceil() as u64
                * (c.variants.len() * c.repeats) as u64
        })
        .sum();
    println!(
        "suite: {} scenario(s), {} s of schedules (plus calibration and set-up) → {}",
        configs.len(),
        total,
        out.display()
    );
    let wall = std::time::Instant::now();
    let host_before = lab::loadgen::publish::HostSample::now();
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len}s {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let mut runs = Vec::new();
    for cfg in &configs {
        bar.set_message(format!("{}: starting", cfg.scenario.name));
        let run = runner::run(cfg, &bar).await;
        let run = match run {
            Ok(r) => r,
            Err(e) => {
                bar.finish_and_clear();
                return Err(format!("scenario {}: {e}", cfg.scenario.name));
            }
        };
        report::write_all(&run, &out.join(&cfg.scenario.name))?;
        runs.push(run);
    }
    bar.finish_and_clear();
    let v = verdict::verdict(&runs, wall.elapsed().as_secs_f64(), instructions);
    verdict::write(&v, &out)?;
    if a.judge {
        let judged = runs
            .iter()
            .map(lab::loadgen::judge::judge_scenario)
            .collect::<Result<Vec<_>, _>>()?;
        lab::loadgen::judge::write(&judged, &out)?;
        println!("\n{}", lab::loadgen::judge::markdown(&judged));
        println!("judged verdict: {}", out.join("judged.md").display());
    }
    println!("\n{}", verdict::markdown(&v));
    println!("verdict: {}", out.join("verdict.md").display());
    if let Some(dir) = &a.publish {
        let host = lab::loadgen::publish::Host::between(&host_before);
        let dated = lab::loadgen::publish::publish(&v, &host, &out, dir)?;
        println!(
            "results: {} (and {})",
            dated.display(),
            dir.join("current.md").display()
        );
    }
    if !v.valid {
        println!("INVALID runs in some scenarios (see the verdict).");
    }
    Ok(v.valid)
}

/// `lab instructions`: callgrind counts of `pathbench`, written as `instructions.json`.
fn instructions(a: &InstructionsArgs) -> Result<(), String> {
    use lab::loadgen::instructions::{count_all, COUNTED};
    if a.high <= a.low {
        return Err("--high must be above --low".into());
    }
    let variants: Vec<_> = if a.variants.is_empty() {
        COUNTED.to_vec()
    } else {
        a.variants
            .iter()
            .map(|n| {
                COUNTED
                    .iter()
                    .find(|c| c.name == n.trim())
                    .cloned()
                    .ok_or_else(|| format!("--variants {n:?}: not one of the counted variants"))
            })
            .collect::<Result<_, _>>()?
    };
    let bench = std::env::current_exe()
        .map_err(|e| e.to_string())?
        .with_file_name("pathbench");
    if !bench.exists() {
        return Err(format!(
            "{} not found: build it with `cargo build --profile lab -p lab --bin pathbench`",
            bench.display()
        ));
    }
    let out = a.out.clone().unwrap_or_else(|| {
        let d = default_out();
        d.with_file_name(format!(
            "{}-instructions",
            d.file_name().and_then(|n| n.to_str()).unwrap_or("run")
        ))
    });
    let commit = lab::loadgen::publish::commit().unwrap_or_default();
    let counts = count_all(&bench, &out, &variants, a.low, a.high, commit, &|m| {
        println!("instructions: {m} under callgrind ...")
    })?;
    let json = serde_json::to_string_pretty(&counts).map_err(|e| e.to_string())?;
    let path = out.join("instructions.json");
    std::fs::write(&path, json).map_err(|e| format!("{}: {e}", path.display()))?;
    for c in &counts.variants {
        println!(
            "{:<22} {:>8.1} k instructions per operation{}",
            c.name,
            c.per_op / 1000.0,
            c.ratio
                .map(|r| format!(", {r:.3} × upstream-default"))
                .unwrap_or_default()
        );
    }
    println!(
        "written: {} (give it to `lab run --suite --instructions`)",
        path.display()
    );
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if std::env::var_os("RUST_LOG").is_some() {
        // The fork's overload events (`overload::trace`) and the emulator's, to stderr.
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    match cli.command {
        Command::Instructions(a) => match instructions(&a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("lab: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Variants => {
            for v in Variant::builtin() {
                let opts = if v.uri_options.is_empty() {
                    "-".to_string()
                } else {
                    v.uri_options.clone()
                };
                println!(
                    "{:<26} {:<9} {}\n    application: {}",
                    v.name,
                    v.driver,
                    opts,
                    v.app.describe(&v.uri_options)
                );
            }
            ExitCode::SUCCESS
        }
        Command::Run(a) => {
            // A bad combination of options is a usage error, as clap's own (exit code 2).
            if let Err(e) = check_shard_options(&a) {
                let mut cli = Cli::command();
                cli.build();
                let mut run = cli.find_subcommand("run").cloned().unwrap_or(cli);
                run.error(clap::error::ErrorKind::ArgumentConflict, e)
                    .exit();
            }
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("lab: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(run(*a)) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(3),
                Err(e) => {
                    eprintln!("lab: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_output_folder_is_named_by_utc_date_and_time() {
        let out = default_out();
        assert_eq!(out.parent(), Some(std::path::Path::new("lab-runs")));
        let name = out.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let (date, time) = name.split_once('-').expect("YYYYMMDD-HHMMSS");
        assert_eq!((date.len(), time.len()), (8, 6), "{name}");
        assert!(date.starts_with("20"), "{name}");
        assert!(
            name.chars().all(|c| c.is_ascii_digit() || c == '-'),
            "{name}"
        );
    }
}
