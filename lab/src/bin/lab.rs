//! `lab`: the overload lab. `lab run --help` lists the parameters; `docs/lab.md` explains
//! the method and the report.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use lab::loadgen::config::{
    Arrivals, LabConfig, Length, OpMix, Persona, Scenario, ServerMode, Variant,
};
use lab::loadgen::{report, runner};

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
}

#[derive(Clone, Copy, ValueEnum)]
enum ScenarioName {
    /// 50 % of capacity, 130 % burst, 50 %.
    Burst,
    /// 200 % of capacity throughout.
    Sustained,
}

#[derive(Args)]
struct RunArgs {
    /// Scenario.
    #[arg(long, value_enum, default_value = "burst")]
    scenario: ScenarioName,
    /// Custom phases `LOAD%:SECONDS,...` (e.g. `50:10,130:15,50:20`); overrides --scenario.
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
    /// Simulated service instances (one client each).
    #[arg(long, default_value_t = 4)]
    instances: usize,
    /// maxPoolSize of each instance.
    #[arg(long, default_value_t = 100)]
    max_pool_size: u32,
    /// minPoolSize of each instance.
    #[arg(long, default_value_t = 0)]
    min_pool_size: u32,
    /// Further URI options for every client (`k=v&k2=v2`).
    #[arg(long, default_value = "")]
    client_options: String,
    /// Application deadline per request, in ms.
    #[arg(long, default_value_t = 100)]
    deadline_ms: u64,
    /// Also send maxTimeMS = deadline on reads.
    #[arg(long)]
    max_time_ms: bool,
    /// Operation mix, e.g. `point=80,range=10,insert=5,update=5`.
    #[arg(long)]
    mix: Option<String>,
    /// Documents in the collection.
    #[arg(long, default_value_t = 1000)]
    docs: i64,
    /// The server model's ingress limiter rate as a share of capacity (0 turns it off).
    #[arg(long, default_value_t = 0.9)]
    limiter_share: f64,
    /// Extra server model settings (JSON object merged into `labOverload`).
    #[arg(long)]
    model_json: Option<String>,
    /// Schedule lag p99 (ms) above which a run is INVALID.
    #[arg(long, default_value_t = 5.0)]
    max_lag_ms: f64,
    /// Seconds to wait for late completions after the schedule.
    #[arg(long, default_value_t = 2.0)]
    drain_secs: f64,
}

fn config(a: &RunArgs) -> Result<LabConfig, String> {
    let len = if a.quick {
        Length::Quick
    } else if a.long {
        Length::Long
    } else {
        Length::Default
    };
    let scenario = match (&a.phases, a.scenario) {
        (Some(p), _) => Scenario::parse_custom(p)?,
        (None, ScenarioName::Burst) => Scenario::burst(len),
        (None, ScenarioName::Sustained) => Scenario::sustained(len),
    };
    let variants = if a.variants.is_empty() {
        Variant::defaults()
    } else {
        a.variants
            .iter()
            .map(|v| Variant::parse(v))
            .collect::<Result<Vec<_>, _>>()?
    };
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
    if a.instances == 0 || a.instances > 256 {
        return Err("--instances must be in 1..=256".into());
    }
    if a.deadline_ms == 0 {
        return Err("--deadline-ms must be positive".into());
    }
    if !(a.limiter_share.is_finite() && (0.0..=10.0).contains(&a.limiter_share)) {
        return Err("--limiter-share must be between 0 and 10".into());
    }
    Ok(LabConfig {
        scenario,
        variants,
        repeats: a.repeats.unwrap_or(if a.full { 3 } else { 1 }).max(1),
        capacity: match a.capacity {
            Some(c) if c.is_finite() && c > 0.0 => c,
            Some(_) => return Err("--capacity must be positive".into()),
            None => 0.0,
        },
        arrivals: a.arrivals,
        instances: a.instances,
        max_pool_size: a.max_pool_size,
        min_pool_size: a.min_pool_size,
        client_options: a.client_options.clone(),
        deadline: Duration::from_millis(a.deadline_ms),
        max_time_ms: a.max_time_ms,
        drain: Duration::from_secs_f64(a.drain_secs),
        mix: match &a.mix {
            Some(m) => OpMix::parse(m)?,
            None => OpMix::default(),
        },
        docs: a.docs.max(1),
        seed: a.seed,
        server_mode: a.server,
        persona: a.persona,
        limiter_share: a.limiter_share,
        model_overrides,
        max_lag_p99: Duration::from_secs_f64(a.max_lag_ms / 1000.0),
    })
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
    let cfg = config(&a)?;
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
    let invalid = run.runs.iter().any(|r| r.summary.invalid);
    if invalid {
        println!("INVALID: the generator missed its schedule (lag p99 > limit) in some runs.");
    }
    if run.runs.iter().any(|r| r.summary.saturated) {
        println!("CPU SATURATED in some runs: the machine, not the driver, may limit them.");
    }
    println!("report: {}", out.join("report.md").display());
    Ok(!invalid)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Variants => {
            for v in Variant::builtin() {
                println!("{:<22} {:<9} {}", v.name, v.driver, v.uri_options);
            }
            ExitCode::SUCCESS
        }
        Command::Run(a) => {
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
