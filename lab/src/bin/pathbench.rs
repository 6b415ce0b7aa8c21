//! `pathbench`: what the fork costs on the fast path, measured side by side with upstream.
//!
//! One in-process emulator (no overload model) and one client per variant: upstream 3.9.1
//! with its defaults, and the fork with its defaults, with `timeoutMS` (100 ms), with
//! `retryBudget`, with both (the recommended settings) and with every control
//! (`adaptiveThrottle` and `adaptiveConcurrency` too). The variants take turns in short slices (`--slice-ms`, the
//! order shuffled every round) for `--rounds` rounds, each slice running `--tasks` tasks in a
//! closed loop of point operations (a `find` by `_id` and an `insert`, alternating). A
//! machine that is busy with other work slows every variant alike when the slices are short,
//! which a lab run of several seconds per variant cannot promise on a shared 2-core machine.
//!
//! Prints each variant's operations per second over all its slices, its ratio to upstream's,
//! the median and quartiles of the per-round ratios, and the process's CPU time per operation
//! (client, emulator and kernel together) with its ratio to upstream's.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use emulator::{Emulator, EmulatorConfig};
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// Fast-path throughput of the fork against upstream, interleaved in slices.
#[derive(Debug, Parser)]
#[command(name = "pathbench", about)]
struct Args {
    /// Rounds; each runs every variant for one slice.
    #[arg(long, default_value_t = 40)]
    rounds: usize,
    /// Length of one slice, in milliseconds.
    #[arg(long, default_value_t = 250)]
    slice_ms: u64,
    /// Concurrent tasks per slice (and the pool size).
    #[arg(long, default_value_t = 32)]
    tasks: usize,
    /// A further fork variant, `NAME=URI_OPTIONS` (e.g. `fork-t0=timeoutMS=0`); repeatable.
    #[arg(long = "fork-variant")]
    fork_variants: Vec<String>,
    /// Run only these variants (comma-separated names) besides `upstream-default`, which every
    /// ratio is taken against.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Instead of slices, run each variant named by `--only` (`upstream-default` only when
    /// named) for exactly this many operations after the warm-up, one after another, and
    /// print the process's CPU time per operation. Meant for instruction counts under
    /// `valgrind --tool=callgrind` (docs/lab.md, "Instructions per operation"): the
    /// difference of two runs' counts at two values is the instructions of the operations
    /// between them, setup and warm-up cancelled out.
    #[arg(long)]
    count: Option<u64>,
}

/// Documents seeded for the finds.
const DOCS: i64 = 1000;

/// Defines a module that runs slices with one driver crate.
macro_rules! driver_slices {
    ($name:ident, $krate:ident) => {
        mod $name {
            use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
            use std::sync::Arc;

            use $krate::bson::{doc, Document};
            use $krate::options::ClientOptions;
            use $krate::{Client, Collection};

            /// A client of this driver on `uri` with `options` appended, its pool at `tasks`.
            pub async fn collection(
                uri: &str,
                options: &str,
                tasks: usize,
            ) -> Result<Collection<Document>, String> {
                let sep = if uri.contains('?') { '&' } else { '?' };
                let full = if options.is_empty() {
                    uri.to_owned()
                } else {
                    format!("{uri}{sep}{options}")
                };
                let mut opts = ClientOptions::parse(&full)
                    .await
                    .map_err(|e| e.to_string())?;
                let pool = u32::try_from(tasks).unwrap_or(u32::MAX);
                opts.max_pool_size = Some(pool);
                opts.min_pool_size = Some(pool);
                let client = Client::with_options(opts).map_err(|e| e.to_string())?;
                Ok(client.database("pathbench").collection("points"))
            }

            /// Seeds the documents the finds read.
            pub async fn seed(coll: &Collection<Document>, docs: i64) -> Result<(), String> {
                coll.drop().await.map_err(|e| e.to_string())?;
                let batch: Vec<Document> = (0..docs).map(|i| doc! { "_id": i, "v": i }).collect();
                coll.insert_many(batch).await.map_err(|e| e.to_string())?;
                Ok(())
            }

            /// One closed-loop task until `stop`, or until the tasks together have started
            /// `budget` operations: finds by `_id` and inserts, alternating. Inserted `_id`s
            /// start at `next_id`'s value, shared by every task and slice.
            pub async fn task(
                coll: Collection<Document>,
                stop: Arc<AtomicBool>,
                budget: Arc<AtomicI64>,
                ops: Arc<AtomicU64>,
                errors: Arc<AtomicU64>,
                next_id: Arc<AtomicU64>,
                docs: i64,
            ) {
                let mut i: i64 = 0;
                while !stop.load(Ordering::Relaxed) && budget.fetch_sub(1, Ordering::Relaxed) > 0 {
                    let ok = if i % 2 == 0 {
                        let id = (i / 2) % docs;
                        coll.find_one(doc! { "_id": id }).await.is_ok()
                    } else {
                        let id = next_id.fetch_add(1, Ordering::Relaxed) as i64;
                        coll.insert_one(doc! { "_id": id, "v": i }).await.is_ok()
                    };
                    let counter = if ok { &ops } else { &errors };
                    counter.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            }
        }
    };
}

driver_slices!(fork, mongodb);
driver_slices!(upstream, mongodb_upstream);

/// A variant's client, whichever driver.
enum Handle {
    Fork(mongodb::Collection<mongodb::bson::Document>),
    Upstream(mongodb_upstream::Collection<mongodb_upstream::bson::Document>),
}

struct Variant {
    name: String,
    handle: Handle,
    ops: u64,
    errors: u64,
    busy: Duration,
    /// The process's CPU time (client, emulator and kernel) spent during its slices.
    cpu: Duration,
    /// Operations per second of each round's slice.
    per_round: Vec<f64>,
}

/// The fork's options for each variant (upstream runs with its defaults).
const VARIANTS: [(&str, Option<&str>); 7] = [
    ("upstream-default", None),
    ("fork-default", Some("")),
    ("fork-timeout", Some("timeoutMS=100")),
    ("fork-budget", Some("retryBudget=true")),
    (
        "fork-budget-timeout",
        Some("retryBudget=true&timeoutMS=100"),
    ),
    (
        "fork-recommended",
        Some("retryBudget=true&timeoutMS=100&adaptiveThrottle=true"),
    ),
    (
        "fork-controls",
        Some("retryBudget=true&timeoutMS=100&adaptiveThrottle=true&adaptiveConcurrency=true"),
    ),
];

/// Runs one slice of `variant` with `tasks` tasks for `slice`.
async fn slice(variant: &mut Variant, tasks: usize, slice: Duration, next_id: &Arc<AtomicU64>) {
    run_tasks(variant, tasks, Some(slice), i64::MAX, next_id).await;
}

/// Runs `tasks` tasks of `variant` until `length` has passed (`None`: no limit) or they have
/// started `budget` operations, and adds up what they did.
async fn run_tasks(
    variant: &mut Variant,
    tasks: usize,
    length: Option<Duration>,
    budget: i64,
    next_id: &Arc<AtomicU64>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let budget = Arc::new(AtomicI64::new(budget));
    let ops = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let cpu_start = process_cpu();
    let mut handles = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        let (stop, budget, ops, errors, next_id) = (
            stop.clone(),
            budget.clone(),
            ops.clone(),
            errors.clone(),
            next_id.clone(),
        );
        handles.push(match &variant.handle {
            Handle::Fork(coll) => tokio::spawn(fork::task(
                coll.clone(),
                stop,
                budget,
                ops,
                errors,
                next_id,
                DOCS,
            )),
            Handle::Upstream(coll) => tokio::spawn(upstream::task(
                coll.clone(),
                stop,
                budget,
                ops,
                errors,
                next_id,
                DOCS,
            )),
        });
    }
    if let Some(length) = length {
        tokio::time::sleep(length).await;
        stop.store(true, Ordering::Relaxed);
    }
    for handle in handles {
        let _ = handle.await;
    }
    // Operations that finish after `stop` count too, over the time until the last finished.
    let elapsed = start.elapsed();
    let done = ops.load(Ordering::Relaxed);
    variant.ops += done;
    variant.errors += errors.load(Ordering::Relaxed);
    variant.busy += elapsed;
    variant.cpu += process_cpu().saturating_sub(cpu_start);
    variant
        .per_round
        .push(done as f64 / elapsed.as_secs_f64().max(1e-9));
}

/// The process's CPU time so far (zero where `/proc/self/stat` cannot be read).
fn process_cpu() -> Duration {
    lab::loadgen::sys::process_cpu().unwrap_or_default()
}

/// CPU microseconds per operation over a variant's slices: the machine's other work is not in
/// it, so it varies less than throughput (10 ms ticks, averaged over every slice).
fn cpu_per_op(variant: &Variant) -> f64 {
    variant.cpu.as_secs_f64() * 1e6 / (variant.ops.max(1) as f64)
}

fn quartiles(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let i = ((values.len().saturating_sub(1)) as f64 * q).round() as usize;
        values.get(i).copied().unwrap_or(f64::NAN)
    };
    (at(0.25), at(0.5), at(0.75))
}

async fn run(args: &Args) -> Result<(), String> {
    let emulator = Emulator::start(EmulatorConfig::default())
        .await
        .map_err(|e| format!("cannot start the emulator: {e}"))?;
    let uri = emulator.uri();
    let tasks = args.tasks.max(1);
    let mut specs: Vec<(String, Option<String>)> = VARIANTS
        .iter()
        .map(|(name, options)| (name.to_string(), options.map(str::to_owned)))
        .collect();
    for extra in &args.fork_variants {
        let (name, options) = extra
            .split_once('=')
            .ok_or_else(|| format!("--fork-variant {extra:?}: expected NAME=URI_OPTIONS"))?;
        specs.push((name.to_owned(), Some(options.to_owned())));
    }
    if !args.only.is_empty() {
        if let Some(unknown) = args
            .only
            .iter()
            .find(|n| !specs.iter().any(|(s, _)| s == *n))
        {
            return Err(format!("--only {unknown:?}: no such variant"));
        }
        specs.retain(|(name, options)| {
            (options.is_none() && args.count.is_none()) || args.only.contains(name)
        });
    }
    if specs.is_empty() {
        return Err("no variant to run: --count runs only the variants --only names".into());
    }
    let mut variants = Vec::new();
    for (name, fork_options) in specs {
        let handle = match fork_options {
            Some(options) => Handle::Fork(fork::collection(&uri, &options, tasks).await?),
            None => Handle::Upstream(upstream::collection(&uri, "", tasks).await?),
        };
        variants.push(Variant {
            name,
            handle,
            ops: 0,
            errors: 0,
            busy: Duration::ZERO,
            cpu: Duration::ZERO,
            per_round: Vec::new(),
        });
    }
    match &variants[0].handle {
        Handle::Upstream(coll) => upstream::seed(coll, DOCS).await?,
        Handle::Fork(coll) => fork::seed(coll, DOCS).await?,
    }
    let next_id = Arc::new(AtomicU64::new(DOCS as u64));
    // Warm-up: every pool fills and every code path runs once before anything counts.
    for variant in &mut variants {
        slice(variant, tasks, Duration::from_millis(300), &next_id).await;
        variant.ops = 0;
        variant.errors = 0;
        variant.busy = Duration::ZERO;
        variant.cpu = Duration::ZERO;
        variant.per_round.clear();
    }
    if let Some(count) = args.count {
        let budget = i64::try_from(count).map_err(|_| "--count is too large".to_string())?;
        for variant in &mut variants {
            run_tasks(variant, tasks, None, budget, &next_id).await;
            println!(
                "{}: {} operations ({} errors), {:.1} µs of CPU per operation",
                variant.name,
                variant.ops,
                variant.errors,
                cpu_per_op(variant)
            );
        }
        drop(variants);
        emulator.shutdown().await;
        return Ok(());
    }
    println!(
        "pathbench: {} variants, {} rounds of {} ms slices, {tasks} tasks, {} cores",
        variants.len(),
        args.rounds,
        args.slice_ms,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let slice_len = Duration::from_millis(args.slice_ms.max(10));
    let mut order: Vec<usize> = (0..variants.len()).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for _ in 0..args.rounds {
        // A new order every round, so that no variant always follows the same other one.
        order.shuffle(&mut rng);
        for &index in &order {
            slice(&mut variants[index], tasks, slice_len, &next_id).await;
        }
    }
    let base_rate = variants[0].ops as f64 / variants[0].busy.as_secs_f64().max(1e-9);
    let base_rounds = variants[0].per_round.clone();
    let base_cpu = cpu_per_op(&variants[0]);
    println!(
        "\n{:<22} {:>10} {:>9} {:>8} {:>26} {:>11} {:>9}",
        "variant",
        "ops/s",
        "ratio",
        "errors",
        "per-round ratio q1/median/q3",
        "cpu µs/op",
        "cpu ratio"
    );
    for v in &variants {
        let rate = v.ops as f64 / v.busy.as_secs_f64().max(1e-9);
        let ratios: Vec<f64> = v
            .per_round
            .iter()
            .zip(&base_rounds)
            .map(|(r, b)| r / b.max(1e-9))
            .collect();
        let (q1, median, q3) = quartiles(ratios);
        let cpu = cpu_per_op(v);
        println!(
            "{:<22} {:>10.0} {:>9.3} {:>8} {:>12.3} / {:.3} / {:.3} {:>11.1} {:>9.3}",
            v.name,
            rate,
            rate / base_rate.max(1e-9),
            v.errors,
            q1,
            median,
            q3,
            cpu,
            cpu / base_cpu.max(1e-9)
        );
    }
    for v in &variants {
        if let Handle::Fork(coll) = &v.handle {
            for (server, limit) in coll.client().overload_stats().concurrency_limits {
                println!(
                    "{}: concurrency limit on {server}: {} (baseline {:?}, latency {:?}, \
                     client-bound {})",
                    v.name, limit.limit, limit.baseline, limit.latency, limit.client_bound
                );
            }
        }
    }
    drop(variants);
    emulator.shutdown().await;
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pathbench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
