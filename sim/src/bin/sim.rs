//! `sim`: runs a scenario × variant × client-count grid in virtual time and prints a markdown
//! document with one table per scenario; `--compare-lab` compares the simulator with the lab's
//! published four-instance figures instead, and `--lab-verdict` with a lab suite, replaying the
//! lab's own schedules (docs/simulator.md).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use sim::lab::{relative, LabRow, LAB};
use sim::replay::{ArrivalGaps, Completions, LabSchedule};
use sim::report::{row, series_csv, Report, HEADER, SERIES_HEADER};
use sim::server::LatenessShape;
use sim::variant::Overrides;
use sim::{Length, RunConfig, ScenarioName, Variant};

/// Runs the overload policies of many clients against a model of mongod in virtual time.
#[derive(Parser, Debug)]
#[command(name = "sim", version)]
struct Args {
    /// Scenarios, comma-separated: burst, sustained, flood, transient, or all (those four);
    /// hot-shard and even-shards (a sharded cluster) by name.
    #[arg(long, default_value = "all")]
    scenarios: String,
    /// Variants, comma-separated: upstream-default (upstream), upstream-no-retries,
    /// upstream-maxtime, upstream-best, upstream-best-no-retries, fork-budget, fork-timeout,
    /// fork-budget-timeout, fork-recommended (recommended), fork-controls, or all.
    #[arg(
        long,
        default_value = "upstream-best,upstream-best-no-retries,recommended,fork-controls"
    )]
    variants: String,
    /// Client counts, comma-separated, from 1 to 100,000 (`k` means thousands: 10k).
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
    /// The application's deadline (ms; default 100, `transient`'s 1000).
    #[arg(long)]
    deadline_ms: Option<f64>,
    /// Network round trip (ms).
    #[arg(long, default_value_t = 0.2)]
    rtt_ms: f64,
    /// 100 % load in ops/s (default: the model's nominal capacity, cores × 1000 ÷ the mix's
    /// mean time on a core).
    #[arg(long)]
    capacity: Option<f64>,
    /// Core time lost each time a request's slice that waited for a core gets one (ms;
    /// default: the lab emulator's, 0.045; 0: ideal cores).
    #[arg(long)]
    handoff_ms: Option<f64>,
    /// Core time lost each time a rejection or an expired request's stop that waited for a
    /// core gets one (ms; default: the lab emulator's, 0.04).
    #[arg(long)]
    rejection_handoff_ms: Option<f64>,
    /// How long a woken ticket waiter takes to come for its ticket (ms; default: the lab
    /// emulator's, 0.083; 0: the ticket goes straight to it).
    #[arg(long)]
    ticket_wake_ms: Option<f64>,
    /// The host's timer tick, on which the emulator's cores end their slices (ms; default:
    /// the lab host's, 1; 0: slices end exactly when their work does).
    #[arg(long)]
    timer_tick_ms: Option<f64>,
    /// How long after its tick a core's sleep ends, on average (ms; default: the lab host's,
    /// 0.37).
    #[arg(long)]
    timer_lateness_ms: Option<f64>,
    /// How that lateness varies from tick to tick (default: exponential, drawn per tick).
    #[arg(long, value_enum)]
    timer_lateness_shape: Option<LatenessShape>,
    /// Connections per client (the driver's `maxPoolSize`).
    #[arg(long, default_value_t = sim::engine::POOL_SIZE)]
    pool_size: u32,
    /// The ingress limiter's rate as a share of capacity (0: none).
    #[arg(long, default_value_t = 0.9)]
    limiter_share: f64,
    /// `retryBudgetMinPerSec` for every variant with the budget (default 1).
    #[arg(long)]
    budget_min_per_sec: Option<u32>,
    /// `retryBudgetPercent` for every variant with the budget (default 9).
    #[arg(long)]
    budget_percent: Option<f64>,
    /// `adaptiveThrottleMinRequests` for every variant with the throttle (default 20).
    #[arg(long)]
    throttle_min_requests: Option<u32>,
    /// On a sharded cluster: how many times a router retries a shard's overload error itself
    /// (mongos's `defaultClientMaxRetryAttempts`, default 3; 0: it passes every one on).
    #[arg(long, value_name = "N")]
    router_retries: Option<u32>,
    /// On a sharded cluster: the routers pass the shard's labels on (`RetryableError`
    /// included), as the emulator's `labRouterShardErrorLabels: "shard"`, instead of mongos's
    /// `SystemOverloadedError` alone.
    #[arg(long)]
    router_shard_labels: bool,
    /// On a sharded cluster: the number of shards (the lab's 3), each owning an equal range
    /// of the keys; shard 1 stays the hot one.
    #[arg(long, value_name = "N")]
    shards: Option<u32>,
    /// In `hot-shard`: the hot shard's limiter as a share of the others' (the lab's 1/3).
    #[arg(long, value_name = "SHARE")]
    hot_share: Option<f64>,
    /// Also draw the grid's goodput and retries per first attempt against the client count,
    /// one SVG per scenario and figure, into this directory (`sim::plot`).
    #[arg(long, value_name = "DIR")]
    plot: Option<std::path::PathBuf>,
    /// Also write every run's counters, second by second of virtual time, as CSV to this
    /// file (with `--lab-verdict`: the runs at the lab's capacity on each run's host, or on
    /// the model's where the lab run did not measure its own, one per repetition and
    /// replication; the `seed` column names the simulation's, the repetition's own for the
    /// first replication). For comparing with a lab run's `series.csv`.
    #[arg(long, value_name = "FILE")]
    series: Option<std::path::PathBuf>,
    /// Compare with the lab's four-instance figures instead of running the grid (uses
    /// `--seed` and the two seeds after it; the grid's options other than those of the model
    /// are ignored).
    #[arg(long)]
    compare_lab: bool,
    /// Compare with a lab suite's `verdict.json` instead (its `burst`, `sustained`, `flood`,
    /// `transient-30`, `no-limiter`, `hot-shard`, `even-shards` and `fleet-*` scenarios, at
    /// the lab's instances),
    /// replaying each valid lab repetition's own arrivals (from the scenarios' `summary.json`
    /// beside it; `--seed` is not used).
    #[arg(long, value_name = "PATH")]
    lab_verdict: Option<std::path::PathBuf>,
    /// With `--lab-verdict`: the instances the suite ran with (`lab run --instances N`). The
    /// scenarios' `summary.json` records them; a different count is refused.
    #[arg(long, value_name = "N")]
    lab_instances: Option<u32>,
    /// With `--lab-verdict`: simulations of each lab repetition, each with its own streams for
    /// the policies and the server (the lab's repetition's arrivals in every one). A lab
    /// repetition is one draw of the server's and the drivers' randomness; several
    /// simulations of it estimate what the model expects of that schedule.
    #[arg(long, value_name = "K", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    replications: u32,
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
            .filter(|n| (1..=sim::limits::MAX_CLIENTS).contains(n))
            .ok_or_else(|| {
                format!(
                    "--clients: {entry:?} is not a count from 1 to {}",
                    sim::limits::MAX_CLIENTS
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
            .chain(ScenarioName::SHARDED)
            .find(|s| s.name() == entry)
            .ok_or_else(|| {
                format!(
                    "--scenarios: unknown {entry:?}: use burst, sustained, flood, transient, \
                     hot-shard, even-shards or all"
                )
            })?;
        out.push(s);
    }
    if out.is_empty() {
        return Err("--scenarios: none given".into());
    }
    out.dedup();
    Ok(out)
}

fn millis(name: &str, ms: f64, max: f64) -> Result<Duration, String> {
    if ms.is_finite() && ms > 0.0 && ms <= max {
        Ok(Duration::from_secs_f64(ms / 1000.0))
    } else {
        Err(format!(
            "--{name}: {ms} is not above 0 and at most {max} ms"
        ))
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = if args.compare_lab || args.lab_verdict.is_some() {
        compare_lab(&args)
    } else {
        grid(&args)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sim: {e}");
            ExitCode::from(2)
        }
    }
}

/// A run's configuration from the command line's model options.
fn config(
    args: &Args,
    scenario: ScenarioName,
    length: Length,
    secs: Option<f64>,
    variant: Variant,
    clients: u32,
    seed: u64,
) -> Result<RunConfig, String> {
    let mut cfg = RunConfig::new(scenario.build(length, secs), variant, clients, seed);
    if let Some(ms) = args.deadline_ms {
        cfg.deadline = millis("deadline-ms", ms, 3_600_000.0)?;
    }
    cfg.rtt = millis("rtt-ms", args.rtt_ms, 10_000.0)?;
    cfg.capacity = args.capacity;
    cfg.limiter_share = args.limiter_share;
    // The host's latencies: each option given replaces the model's default.
    let server = &mut cfg.server;
    for (given, field) in [
        (args.handoff_ms, &mut server.handoff_ms),
        (args.rejection_handoff_ms, &mut server.rejection_handoff_ms),
        (args.ticket_wake_ms, &mut server.ticket_wake_ms),
        (args.timer_tick_ms, &mut server.timer_tick_ms),
        (args.timer_lateness_ms, &mut server.timer_lateness_ms),
    ] {
        if let Some(ms) = given {
            *field = ms;
        }
    }
    if let Some(shape) = args.timer_lateness_shape {
        cfg.server.timer_lateness_shape = shape;
    }
    if let Some(cluster) = &mut cfg.scenario.cluster {
        if let Some(n) = args.router_retries {
            cluster.router_retries = n;
        }
        cluster.shard_labels |= args.router_shard_labels;
        if let Some(n) = args.shards {
            cluster.shards = n;
        }
        if args.hot_share.is_some() {
            if cluster.hot_share.is_none() {
                return Err("--hot-share is for hot-shard (even-shards has no hot shard)".into());
            }
            cluster.hot_share = args.hot_share;
        }
    } else if args.router_retries.is_some()
        || args.router_shard_labels
        || args.shards.is_some()
        || args.hot_share.is_some()
    {
        return Err(format!(
            "--router-retries, --router-shard-labels, --shards and --hot-share are for a \
             sharded cluster, not {}",
            scenario.name()
        ));
    }
    cfg.pool_size = args.pool_size;
    cfg.overrides = Overrides {
        budget_min_per_sec: args.budget_min_per_sec,
        budget_percent: args.budget_percent,
        throttle_min_requests: args.throttle_min_requests,
    };
    cfg.series = args.series.is_some();
    cfg.validate()?;
    Ok(cfg)
}

fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("sim {}", args.join(" "))
}

fn grid(args: &Args) -> Result<(), String> {
    let scenarios = parse_scenarios(&args.scenarios)?;
    let variants = Variant::parse_list(&args.variants).map_err(|e| format!("--variants: {e}"))?;
    let clients = parse_clients(&args.clients)?;
    if let Some(secs) = args.secs {
        if !(secs.is_finite() && secs > 0.0 && secs <= 86_400.0) {
            return Err(format!("--secs: {secs} is not above 0 and at most 86400"));
        }
    }
    // Every configuration is checked before the first run.
    let mut runs = Vec::new();
    for &scenario in &scenarios {
        let mut configs = Vec::new();
        for &n in &clients {
            for &variant in &variants {
                configs.push(config(
                    args,
                    scenario,
                    args.length,
                    args.secs,
                    variant,
                    n,
                    args.seed,
                )?);
            }
        }
        runs.push((scenario, configs));
    }
    println!("Generated by `{}`.\n", command_line());
    println!(
        "Seed {}; deadline {} ms; RTT {} ms; ingress limiter at {} × capacity; schedule {:?}{}; \
         budget floor {}, share {} %, throttle minimum {} (unset: the fork's defaults).",
        args.seed,
        args.deadline_ms
            .map_or("100 (transient 1000)".to_owned(), |ms| ms.to_string()),
        args.rtt_ms,
        args.limiter_share,
        args.length,
        args.secs
            .map_or(String::new(), |s| format!(" stretched to {s} s")),
        args.budget_min_per_sec
            .map_or("1".to_owned(), |v| v.to_string()),
        args.budget_percent
            .map_or("9".to_owned(), |v| v.to_string()),
        args.throttle_min_requests
            .map_or("20".to_owned(), |v| v.to_string()),
    );
    let started = Instant::now();
    let mut total = 0;
    let mut reports = Vec::new();
    let mut series = String::from(SERIES_HEADER);
    for (scenario, configs) in &runs {
        let shape: Vec<String> = configs
            .first()
            .map(|c| {
                c.scenario
                    .phases
                    .iter()
                    .map(|p| format!("{:.0} % × {:.1} s", 100.0 * p.load, p.secs))
                    .collect()
            })
            .unwrap_or_default();
        let capacity = configs
            .first()
            .map_or(0.0, |c| c.effective_capacity(&c.server_config()));
        println!(
            "\n### {}\n\nPhases {}; capacity {capacity:.0} ops/s.\n",
            scenario.name(),
            shape.join(" → ")
        );
        print!("{HEADER}");
        let mut cold = String::new();
        for cfg in configs {
            let report = run_warned(cfg)?;
            print!("{}", row(&report));
            if cfg.scenario.cluster.is_some() {
                cold.push_str(&cold_row(&report));
            }
            series.push_str(&series_csv(&report));
            total += 1;
            if args.plot.is_some() {
                reports.push(report);
            }
        }
        if !cold.is_empty() {
            print!("\n{COLD_HEADER}{cold}");
        }
    }
    if let Some(dir) = &args.plot {
        for path in sim::plot::write_all(&reports, dir)? {
            eprintln!("plot: {}", path.display());
        }
    }
    write_series(args, &series)?;
    println!(
        "\n{total} runs in {:.1} s of real time (release build: `cargo build --release -p sim`).",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The header of [`cold_row`]'s table.
const COLD_HEADER: &str =
    "| clients | variant | cold-shard requests/s | cold-shard goodput (ops/s) | \
cold ÷ offered | router retries/req | overload errors to the clients/req |\n\
|---|---|---|---|---|---|---|\n";

/// A sharded run's cold-shard figures: the lab's headline of `hot-shard`, and what the routers
/// did with the shards' overload errors.
fn cold_row(r: &Report) -> String {
    let per_request = |n: u64| n as f64 / r.requests.max(1) as f64;
    format!(
        "| {} | {} | {:.0} | {:.0} | {:.3} | {:.3} | {:.3} |\n",
        r.clients,
        r.variant.name(),
        r.cold_requests as f64 / r.secs(),
        r.cold_goodput(),
        r.cold_success as f64 / r.cold_requests.max(1) as f64,
        per_request(r.router_retries),
        per_request(r.rejected),
    )
}

/// Writes the per-second series to `--series`'s file, when given.
fn write_series(args: &Args, csv: &str) -> Result<(), String> {
    let Some(path) = &args.series else {
        return Ok(());
    };
    std::fs::write(path, csv).map_err(|e| format!("--series {}: {e}", path.display()))?;
    eprintln!("series: {}", path.display());
    Ok(())
}

/// Runs `cfg`, telling on standard error when requests were still unfinished at the end.
fn run_warned(cfg: &RunConfig) -> Result<Report, String> {
    let r = sim::run(cfg)?;
    if r.unfinished > 0 {
        eprintln!(
            "sim: {} {} {} clients: {} requests unfinished when the drain ended",
            r.scenario,
            r.variant.name(),
            r.clients,
            r.unfinished
        );
    }
    Ok(r)
}

/// The median as the lab takes it (`Spread::of`): the middle value, or the mean of the two
/// middle ones.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The lab's figure, the simulator's, and their difference; bold beyond 10 %.
fn cell(lab: f64, sim: f64) -> String {
    match relative(sim, lab) {
        Some(d) if d.abs() > 0.10 => format!("{sim:.2} (**{:+.0} %**)", 100.0 * d),
        Some(d) => format!("{sim:.2} ({:+.0} %)", 100.0 * d),
        None => format!("{sim:.2}"),
    }
}

fn compare_lab(args: &Args) -> Result<(), String> {
    println!("Generated by `{}`.\n", command_line());
    if args.lab_verdict.is_some() {
        println!(
            "As many clients as the lab's instances, and the lab's own arrivals: for every valid \
             lab run of a variant, {} simulation(s) of the schedule that run's repetition sent \
             (the lab's generator, the `arrivals` crate, with the repetition's seed, the lab's \
             seed + 1000 × repetition, and the instances, mix and capacity of the scenario's \
             `summary.json`; each client sends its lab instance's requests; every replayed \
             schedule holds as many requests as the lab's run offered, checked; the \
             simulations of one repetition differ only in the policies' and the server's \
             random streams). Each figure is the median over those simulations, as the lab's \
             is over its valid runs. Sim at lab cap: load, schedule and limiter at the capacity \
             the lab calibrated for the scenario (once, for every repetition), on the model's \
             host latencies (its defaults: the core hand-offs, the ticket wake-up and the \
             timer's lateness it was built with); run's host: the same, with the host \
             latencies each lab run measured (its emulator's mean core hand-offs and ticket \
             wake-up, and since 2026-12-05 13:00 its timer's mean lateness, from \
             `summary.json`'s server counters; – for runs from before those counters; the \
             model's lateness for runs before 13:00), the validation since \
             2026-12-05 11:00 (`docs/simulator.md`); sim at nominal: the same seeds drawn at \
             the model's nominal capacity. In brackets: the simulator's difference from the \
             lab, bold beyond 10 %.\n",
            args.replications
        );
    } else {
        println!(
            "As many clients as the lab's instances, the lab's suite schedule, seeds {}, {} and \
             {} (median of the three); \
             each lab figure is the median of its suite's valid runs. Sim at lab cap: load and \
             limiter at the capacity that lab run calibrated; run's host: not measured for \
             these figures (–); sim at nominal: at the model's nominal capacity. In brackets: the simulator's difference from the lab, bold \
             beyond 10 %.\n",
            args.seed,
            args.seed.wrapping_add(1),
            args.seed.wrapping_add(2)
        );
    }
    println!(
        "| scenario | variant | clients | lab suite | figure | lab | sim at lab cap | \
         sim at lab cap, run's host | sim at nominal |\n\
         |---|---|---|---|---|---|---|---|---|"
    );
    let started = Instant::now();
    let rows = match &args.lab_verdict {
        Some(path) => {
            let rows = sim::lab::from_suite(path, args.lab_instances)?;
            if rows.is_empty() {
                return Err(format!(
                    "--lab-verdict {}: no judged variant of a scenario the simulator models",
                    path.display()
                ));
            }
            rows
        }
        None => LAB.to_vec(),
    };
    let mut series = String::from(SERIES_HEADER);
    let mut completions = Vec::new();
    let mut gaps = Vec::new();
    for lab in rows {
        let runs = match &lab.schedule {
            Some(schedule) => replayed_runs(args, &lab, schedule)?,
            None => drawn_runs(args, &lab)?,
        };
        print_rows(&lab, &runs);
        if let Some(rows) = completion_rows(&lab, &runs) {
            completions.push(rows);
        }
        if let Some(rows) = gap_rows(&lab, &runs) {
            gaps.push(rows);
        }
        // The validation's runs: on each lab run's host where it was measured.
        let validated = if runs.run_host.is_empty() {
            &runs.at_lab
        } else {
            &runs.run_host
        };
        for report in validated {
            series.push_str(&series_csv(report));
        }
    }
    write_series(args, &series)?;
    if !completions.is_empty() {
        println!(
            "\nWhich first attempts were refused (the share of requests that retried), and \
             where the completed requests' time went, on the run's host: from reaching the \
             server to holding a ticket (wait) and from then to completing (run), the mean per \
             run over the lab's valid runs (its emulator's `completedWaits` and \
             `completedRuns`, since 2026-12-05 17:50; – before) and over the simulations; the \
             shares are of the requests completed.\n\n\
             | scenario | variant | clients | | first attempts retried | completed | \
             mean wait (ms) | mean run (ms) | wait ≤ 0.1 ms | wait ≤ 20 ms | wait ≤ 50 ms | \
             run ≤ 20 ms | run ≤ 50 ms | run ≤ 100 ms |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for rows in completions {
            println!("{rows}");
        }
    }
    if !gaps.is_empty() {
        println!(
            "\nHow the attempts reached the server, on the run's host: the gap from each first \
             attempt or retry to the previous attempt of its kind, and of the other kind, as \
             shares of each kind's gaps by size, every run added up (the lab's emulator's \
             `firstAttemptGaps` and `retryGaps` since 2026-12-05 18:30, \
             `firstAttemptAfterRetryGaps` and `retryAfterFirstAttemptGaps` since 20:10).\n\n\
             | scenario | variant | clients | | gap | ≤ 0.1 ms | ≤ 0.2 ms | ≤ 0.5 ms | \
             ≤ 1 ms | ≤ 2 ms | more |\n\
             |---|---|---|---|---|---|---|---|---|---|---|"
        );
        for rows in gaps {
            println!("{rows}");
        }
    }
    println!(
        "\nIn {:.1} s of real time.",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The lab's and the simulator's rows of which first attempts were refused and where the
/// completed requests' time went, when the runs were simulated on their hosts; the time
/// columns are – for lab runs from before their counters.
fn completion_rows(lab: &LabRow, runs: &Runs) -> Option<String> {
    let schedule = lab.schedule.as_ref()?;
    if runs.run_host.is_empty() {
        return None;
    }
    // The share of requests whose first attempt was refused and retried.
    let (mut retried, mut offered) = (0.0, 0.0);
    for &rep in &lab.repetitions {
        let run = schedule.run(lab.variant.name(), rep)?;
        retried += run.retried? as f64;
        offered += run.offered as f64;
    }
    let lab_retried = retried / offered.max(1.0);
    let sim_retried = (runs.run_host.iter())
        .map(|r| r.retried_requests as f64 / (r.requests as f64).max(1.0))
        .sum::<f64>()
        / runs.run_host.len() as f64;
    let measured: Option<Vec<Completions>> = (lab.repetitions.iter())
        .map(|&rep| schedule.completions(lab.variant.name(), rep))
        .collect();
    let simulated: Vec<Completions> = (runs.run_host.iter())
        .map(|r| Completions::from_stats(&r.server))
        .collect();
    let row = |who: &str, retried: f64, c: Option<&Completions>| {
        let times = match c {
            None => "– | – | – | – | – | – | – | – | – | –".to_owned(),
            Some(c) => {
                let n = c.count();
                format!(
                    "{n:.0} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {}",
                    c.wait_ms / n.max(1.0),
                    c.run_ms / n.max(1.0),
                    share(&c.waits, 0..1),
                    share(&c.waits, 0..8),
                    share(&c.waits, 0..9),
                    share(&c.runs, 0..8),
                    share(&c.runs, 0..9),
                    share(&c.runs, 0..10),
                )
            }
        };
        format!(
            "{} {who} | {:.1} % | {times} |",
            row_key(lab),
            100.0 * retried
        )
    };
    let lab_mean = measured.map(|m| Completions::mean(&m));
    let sim_mean = Completions::mean(&simulated);
    Some(format!(
        "{}\n{}",
        row("lab", lab_retried, lab_mean.as_ref()),
        row("sim", sim_retried, Some(&sim_mean))
    ))
}

/// The lab's and the simulator's rows of how the attempts reached the server, when the runs
/// were simulated on their hosts and the lab counted the gaps (on one server).
fn gap_rows(lab: &LabRow, runs: &Runs) -> Option<String> {
    let schedule = lab.schedule.as_ref()?;
    // On a cluster the lab's shards count their routers' retries as retries, the model's do
    // not: the kinds would not compare.
    if runs.run_host.is_empty() || ScenarioName::SHARDED.contains(&lab.scenario) {
        return None;
    }
    let measured: Vec<ArrivalGaps> = (lab.repetitions.iter())
        .map(|&rep| schedule.run(lab.variant.name(), rep)?.arrival_gaps)
        .collect::<Option<_>>()?;
    let simulated: Vec<ArrivalGaps> = (runs.run_host.iter())
        .map(|r| ArrivalGaps::from_stats(&r.server))
        .collect();
    let mut rows = Vec::new();
    for (who, g) in [
        ("lab", ArrivalGaps::sum(&measured)),
        ("sim", ArrivalGaps::sum(&simulated)),
    ] {
        let kinds = [
            ("first attempt after first attempt", Some(g.first)),
            ("retry after retry", Some(g.retries)),
            ("first attempt after retry", g.first_after_retry),
            ("retry after first attempt", g.retry_after_first),
        ];
        for (gap, sizes) in kinds {
            let cells = match sizes {
                None => "– | – | – | – | – | –".to_owned(),
                Some(sizes) => [0..1, 1..2, 2..3, 3..4, 4..5, 5..11]
                    .map(|buckets| share(&sizes, buckets))
                    .join(" | "),
            };
            rows.push(format!("{} {who} | {gap} | {cells} |", row_key(lab)));
        }
    }
    Some(rows.join("\n"))
}

/// The share of delays counted by size that fall in `buckets` (0: within 0.1 ms, ...,
/// 10: over 100 ms), as a cell.
fn share(sizes: &[f64; 11], buckets: std::ops::Range<usize>) -> String {
    let all: f64 = sizes.iter().sum();
    let some: f64 = sizes[buckets].iter().sum();
    format!("{:.1} %", 100.0 * some / all.max(1.0))
}

/// The first cells of a lab row's lines in the side tables: scenario, variant, clients.
fn row_key(lab: &LabRow) -> String {
    format!(
        "| {} | {} | {} |",
        lab.scenario.name(),
        lab.variant.name(),
        lab.instances
    )
}

/// The simulator's runs for a lab row.
#[derive(Default)]
struct Runs {
    /// At the lab's capacity, on the model's host latencies.
    at_lab: Vec<Report>,
    /// At the lab's capacity, on the host latencies each lab run measured (empty unless every
    /// run recorded them).
    run_host: Vec<Report>,
    /// At the model's nominal capacity.
    nominal: Vec<Report>,
}

/// Splits a repetition's seed into one per replication (the first keeps the repetition's).
const REPLICATION_SALT: u64 = 0x5DEE_CE66_D1CE_4E5B;

/// A run of `lab`'s scenario and variant at its instances and length, with `seed`.
fn lab_config(args: &Args, lab: &LabRow, seed: u64) -> Result<RunConfig, String> {
    let mut cfg = config(
        args,
        lab.scenario,
        lab.length,
        None,
        lab.variant,
        lab.instances,
        seed,
    )?;
    if let Some(share) = lab.limiter_share {
        cfg.limiter_share = share;
    }
    if let Some(cluster) = &lab.cluster {
        cfg.scenario.cluster = Some(cluster.clone());
    }
    Ok(cfg)
}

/// `--replications` runs per valid lab repetition, each replaying that repetition's schedule.
fn replayed_runs(args: &Args, lab: &LabRow, schedule: &LabSchedule) -> Result<Runs, String> {
    let mut runs = Runs::default();
    let hosts: Vec<_> = (lab.repetitions.iter())
        .map(|&rep| schedule.host(lab.variant.name(), rep))
        .collect();
    let measured = hosts.iter().all(|h| h.recorded);
    for (&rep, host) in lab.repetitions.iter().zip(&hosts) {
        // Each repetition's schedules are drawn once, for all its replications.
        let replay = schedule.replay(rep, schedule.capacity);
        schedule.check(rep, &replay)?;
        let replay = Arc::new(replay);
        let nominal_replay = {
            let cfg = lab_config(args, lab, schedule.seed(rep))?;
            Arc::new(schedule.replay(rep, cfg.effective_capacity(&cfg.server_config())))
        };
        for k in 0..u64::from(args.replications) {
            // The policies' and the server's streams follow the repetition's seed too, as the
            // lab's emulator model does (`runner.rs`); further replications salt it.
            let mut cfg = lab_config(
                args,
                lab,
                schedule.seed(rep) ^ k.wrapping_mul(REPLICATION_SALT),
            )?;
            cfg.capacity = Some(schedule.capacity);
            cfg.replay = Some(replay.clone());
            runs.at_lab.push(run_warned(&cfg)?);
            if measured {
                let mut on_host = cfg.clone();
                host.apply(&mut on_host.server);
                runs.run_host.push(run_warned(&on_host)?);
            }
            cfg.capacity = None;
            cfg.replay = Some(nominal_replay.clone());
            runs.nominal.push(run_warned(&cfg)?);
        }
    }
    Ok(runs)
}

/// Three runs on the simulator's own draws: `--seed` and the two seeds after it.
fn drawn_runs(args: &Args, lab: &LabRow) -> Result<Runs, String> {
    let mut runs = Runs::default();
    for i in 0..3 {
        let seed = args.seed.wrapping_add(i);
        let mut cfg = lab_config(args, lab, seed)?;
        cfg.capacity = Some(lab.capacity);
        let r = run_warned(&cfg)?;
        runs.at_lab.push(r);
        cfg.capacity = None;
        let r = run_warned(&cfg)?;
        runs.nominal.push(r);
    }
    Ok(runs)
}

type Figure = fn(&Report) -> f64;

fn print_rows(lab: &LabRow, runs: &Runs) {
    let med = |runs: &[Report], f: Figure| -> f64 { median(runs.iter().map(f).collect()) };
    let mut figures: Vec<(&str, f64, Figure)> = vec![
        ("goodput ÷ cap", lab.goodput_share, Report::goodput_share),
        (
            "attempts/req",
            lab.attempts_per_request,
            Report::attempts_per_request,
        ),
        ("rejecting % (core)", lab.rejecting_pct, |r| {
            100.0 * r.rejecting_share()
        }),
        ("wasted % (core)", lab.wasted_pct, |r| {
            100.0 * r.wasted_share()
        }),
    ];
    if let Some(b) = lab.burst_share {
        figures.insert(1, ("burst ÷ cap", b, |r| r.burst_share().unwrap_or(0.0)));
    }
    if let Some(s) = lab.success_pct {
        figures.insert(1, ("success %", s, |r| 100.0 * r.success_share()));
    }
    if let Some(c) = lab.cold_goodput {
        figures.insert(1, ("cold-shard ops/s", c, Report::cold_goodput));
    }
    for (name, value, f) in figures {
        let on_run_host = match runs.run_host.is_empty() {
            true => "–".to_owned(),
            false => cell(value, med(&runs.run_host, f)),
        };
        println!(
            "| {} | {} | {} | {} | {name} | {value:.2} | {} | {on_run_host} | {} |",
            lab.scenario.name(),
            lab.variant.name(),
            lab.instances,
            lab.suite,
            cell(value, med(&runs.at_lab, f)),
            cell(value, med(&runs.nominal, f)),
        );
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use sim::server::{
        HANDOFF_MS, REJECTION_HANDOFF_MS, TICKET_WAKE_MS, TIMER_LATENESS_MS, TIMER_TICK_MS,
    };

    use super::Args;

    /// The help names the model's defaults, which are constants of `sim::server`.
    #[test]
    fn the_help_gives_the_models_own_defaults() {
        let cmd = Args::command();
        for (id, default) in [
            ("handoff_ms", HANDOFF_MS),
            ("rejection_handoff_ms", REJECTION_HANDOFF_MS),
            ("ticket_wake_ms", TICKET_WAKE_MS),
            ("timer_tick_ms", TIMER_TICK_MS),
            ("timer_lateness_ms", TIMER_LATENESS_MS),
        ] {
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_id() == id)
                .expect("the option exists");
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            assert!(
                [";", ")"]
                    .iter()
                    .any(|end| help.contains(&format!("'s, {default}{end}"))),
                "--{id}: {help}"
            );
        }
    }
}
