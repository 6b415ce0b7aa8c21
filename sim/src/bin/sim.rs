//! `sim`: runs a scenario × variant × client-count grid in virtual time and prints a markdown
//! table (docs/simulator.md).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use sim::report::{row, HEADER};
use sim::{Length, RunConfig, ScenarioName, Variant};

/// Runs overload policies of many clients against a model of mongod in virtual time.
#[derive(Parser, Debug)]
#[command(name = "sim", version)]
struct Args {
    /// Scenarios, comma-separated: burst, sustained, flood (or all).
    #[arg(long, default_value = "all")]
    scenarios: String,
    /// Variants, comma-separated: upstream-default, upstream-best, upstream-best-no-retries,
    /// fork-budget, fork-budget-timeout (recommended), fork-controls, or all.
    #[arg(
        long,
        default_value = "upstream-best,upstream-best-no-retries,recommended,fork-controls"
    )]
    variants: String,
    /// Client counts, comma-separated (1 to 1,000,000; `_` and `,` in numbers are not allowed,
    /// `k` means thousands: 10k).
    #[arg(long, default_value = "4,16,64")]
    clients: String,
    /// The lab's schedule lengths.
    #[arg(long, value_enum, default_value = "default")]
    length: Length,
    /// Stretch every scenario's schedule to this many seconds (virtual).
    #[arg(long)]
    secs: Option<f64>,
    /// Seed of every random draw.
    #[arg(long, default_value_t = 4)]
    seed: u64,
    /// The application's deadline (ms).
    #[arg(long, default_value_t = 100.0)]
    deadline_ms: f64,
    /// Network round trip (ms).
    #[arg(long, default_value_t = 0.2)]
    rtt_ms: f64,
    /// 100 % load in ops/s (default: the model's nominal capacity, cores × 1000 ÷ mean cost).
    #[arg(long)]
    capacity: Option<f64>,
    /// The ingress limiter's rate as a share of capacity (0: none).
    #[arg(long, default_value_t = 0.9)]
    limiter_share: f64,
}

fn parse_clients(list: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (digits, factor) = match entry.strip_suffix(['k', 'K']) {
            Some(d) => (d, 1000u64),
            None => (entry, 1),
        };
        let n = digits
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(factor))
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| (1..=sim::engine::MAX_CLIENTS).contains(n))
            .ok_or_else(|| {
                format!(
                    "--clients: {entry:?} is not a count from 1 to {}",
                    sim::engine::MAX_CLIENTS
                )
            })?;
        out.push(n);
    }
    if out.is_empty() {
        return Err("--clients: no count given".into());
    }
    Ok(out)
}

fn parse_scenarios(list: &str) -> Result<Vec<ScenarioName>, String> {
    let mut out = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        if entry == "all" {
            out.extend(ScenarioName::ALL);
            continue;
        }
        let s = ScenarioName::ALL
            .into_iter()
            .find(|s| s.name() == entry)
            .ok_or_else(|| {
                format!("--scenarios: unknown {entry:?}: use burst, sustained, flood or all")
            })?;
        out.push(s);
    }
    if out.is_empty() {
        return Err("--scenarios: none given".into());
    }
    Ok(out)
}

fn millis(name: &str, ms: f64, max: f64) -> Result<Duration, String> {
    if ms.is_finite() && ms >= 0.0 && ms <= max {
        Ok(Duration::from_secs_f64(ms / 1000.0))
    } else {
        Err(format!("--{name}: {ms} is not from 0 to {max} ms"))
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sim: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let scenarios = parse_scenarios(&args.scenarios)?;
    let variants = Variant::parse_list(&args.variants).map_err(|e| format!("--variants: {e}"))?;
    let clients = parse_clients(&args.clients)?;
    if let Some(secs) = args.secs {
        if !(secs.is_finite() && secs > 0.0 && secs <= 86_400.0) {
            return Err(format!("--secs: {secs} is not from 0 to 86400"));
        }
    }
    let deadline = millis("deadline-ms", args.deadline_ms, 3_600_000.0)?;
    let rtt = millis("rtt-ms", args.rtt_ms, 10_000.0)?;
    let mut configs = Vec::new();
    for &scenario in &scenarios {
        for &n in &clients {
            for &variant in &variants {
                let mut cfg = RunConfig::new(
                    scenario.build(args.length, args.secs),
                    variant,
                    n,
                    args.seed,
                );
                cfg.deadline = deadline;
                cfg.rtt = rtt;
                cfg.capacity = args.capacity;
                cfg.limiter_share = args.limiter_share;
                cfg.validate()?;
                configs.push(cfg);
            }
        }
    }
    println!(
        "Seed {}, deadline {} ms, RTT {} ms, limiter {} × capacity, length {:?}{}.\n",
        args.seed,
        args.deadline_ms,
        args.rtt_ms,
        args.limiter_share,
        args.length,
        args.secs
            .map_or(String::new(), |s| format!(" stretched to {s} s")),
    );
    print!("{HEADER}");
    let started = Instant::now();
    for cfg in &configs {
        let report = sim::run(cfg)?;
        print!("{}", row(&report));
        if report.unfinished > 0 {
            eprintln!(
                "sim: {} {} {} clients: {} requests unfinished when the drain ended",
                report.scenario,
                report.variant.name(),
                report.clients,
                report.unfinished
            );
        }
    }
    println!(
        "\n{} runs in {:.1} s of real time.",
        configs.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
