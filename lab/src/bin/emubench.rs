//! `emubench`: throughput of the emulator as the fork driver sees it.
//!
//! Starts a standalone emulator in this process (or uses `--uri`), then runs three phases of
//! `--seconds` each with `--tasks` concurrent tasks sharing one client: `ping` round trips,
//! `insert` by `_id`, and `find` by `_id` (of the inserted documents). Prints operations per
//! second, mean latency and the ratio of point operations to pings.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use emulator::{Emulator, EmulatorConfig};
use mongodb::bson::{doc, Document};
use mongodb::options::ClientOptions;
use mongodb::{Client, Collection};

/// Emulator throughput benchmark (ping, insert by _id, find by _id).
#[derive(Debug, Parser)]
#[command(name = "emubench", about)]
struct Args {
    /// Seconds per phase.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Concurrent tasks.
    #[arg(long, default_value_t = 32)]
    tasks: usize,
    /// Benchmark this deployment instead of an in-process standalone emulator.
    #[arg(long)]
    uri: Option<String>,
    /// Driver connection pool size (default: the number of tasks).
    #[arg(long)]
    pool: Option<u32>,
    /// The find phase reads only the first N inserted `_id`s (default: every `_id` below the
    /// insert phase's contiguous prefix). A small N reads a hot set; lookups go through the
    /// `_id_` index either way.
    #[arg(long)]
    find_range: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Ping,
    Insert,
    Find,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Ping => "ping",
            Op::Insert => "insert by _id",
            Op::Find => "find by _id",
        }
    }
}

struct PhaseResult {
    op: Op,
    ops: u64,
    errors: u64,
    elapsed: Duration,
    /// Sum of per-operation latencies, in microseconds.
    latency_us: u64,
    /// The fewest successful operations of any one task. Task `t` writes `_id`s
    /// `t, t + tasks, t + 2·tasks, …`, so after the insert phase every `_id` below
    /// `min_task_ops × tasks` exists (the tasks run at different speeds, so the top is sparse).
    min_task_ops: u64,
}

impl PhaseResult {
    fn rate(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }

    fn mean_latency_us(&self) -> f64 {
        if self.ops == 0 {
            0.0
        } else {
            self.latency_us as f64 / self.ops as f64
        }
    }
}

/// Runs `op` on `tasks` tasks for `duration`. Task `t` uses `_id`s `t, t + tasks, ...`; the
/// find phase reads back ids below `inserted` (cycling).
async fn phase(
    client: &Client,
    coll: &Collection<Document>,
    op: Op,
    tasks: usize,
    duration: Duration,
    inserted: u64,
) -> PhaseResult {
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let latency = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    let start = Instant::now();
    for t in 0..tasks {
        let (client, coll) = (client.clone(), coll.clone());
        let (stop, ops, errors, latency) =
            (stop.clone(), ops.clone(), errors.clone(), latency.clone());
        handles.push(tokio::spawn(async move {
            let admin = client.database("admin");
            let mut i: u64 = 0;
            let mut succeeded: u64 = 0;
            while !stop.load(Ordering::Relaxed) {
                let id = (t as u64 + i * tasks as u64) as i64;
                let began = Instant::now();
                let ok = match op {
                    Op::Ping => admin.run_command(doc! { "ping": 1 }).await.is_ok(),
                    Op::Insert => coll
                        .insert_one(doc! { "_id": id, "v": id, "pad": "xxxxxxxxxxxxxxxx" })
                        .await
                        .is_ok(),
                    Op::Find => {
                        let id = if inserted == 0 {
                            id
                        } else {
                            id % inserted as i64
                        };
                        matches!(coll.find_one(doc! { "_id": id }).await, Ok(Some(_)))
                    }
                };
                latency.fetch_add(began.elapsed().as_micros() as u64, Ordering::Relaxed);
                if ok {
                    ops.fetch_add(1, Ordering::Relaxed);
                    succeeded += 1;
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
            }
            succeeded
        }));
    }
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut min_task_ops = u64::MAX;
    for h in handles {
        min_task_ops = min_task_ops.min(h.await.unwrap_or(0));
    }
    PhaseResult {
        min_task_ops,
        op,
        ops: ops.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        elapsed: start.elapsed(),
        latency_us: latency.load(Ordering::Relaxed),
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let duration = Duration::from_secs_f64(args.seconds.max(0.1));
    let tasks = args.tasks.max(1);
    let (emulator, uri) = match &args.uri {
        Some(uri) => (None, uri.clone()),
        None => {
            let emu = match Emulator::start(EmulatorConfig::default()).await {
                Ok(e) => e,
                Err(e) => {
                    eprintln!("emubench: cannot start the emulator: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            let uri = emu.uri();
            (Some(emu), uri)
        }
    };
    let mut opts = match ClientOptions::parse(&uri).await {
        Ok(o) => o,
        Err(e) => {
            eprintln!("emubench: bad uri {uri}: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let pool = args.pool.unwrap_or(tasks as u32).max(1);
    opts.max_pool_size = Some(pool);
    opts.min_pool_size = Some(pool);
    opts.app_name = Some("emubench".into());
    let client = match Client::with_options(opts) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("emubench: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let coll = client.database("emubench").collection::<Document>("points");
    if let Err(e) = coll.drop().await {
        eprintln!("emubench: cannot reach {uri}: {e}");
        return std::process::ExitCode::FAILURE;
    }
    // Warm the pool up.
    let _ = phase(
        &client,
        &coll,
        Op::Ping,
        tasks,
        Duration::from_millis(500),
        0,
    )
    .await;

    println!(
        "emubench: {uri} | {tasks} tasks, pool {pool}, {:.1} s per phase, {} cores",
        duration.as_secs_f64(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    let ping = phase(&client, &coll, Op::Ping, tasks, duration, 0).await;
    let insert = phase(&client, &coll, Op::Insert, tasks, duration, 0).await;
    // Only the contiguous prefix of `_id`s is read, so a miss is a lost write, counted as an error.
    let mut inserted = insert.min_task_ops.saturating_mul(tasks as u64);
    if let Some(n) = args.find_range {
        inserted = inserted.min(n.max(1));
    }
    let find = phase(&client, &coll, Op::Find, tasks, duration, inserted).await;

    println!();
    println!("find phase reads _id 0..{inserted}");
    println!(
        "{:<16} {:>12} {:>10} {:>14} {:>8}",
        "phase", "ops/s", "ops", "mean lat (us)", "errors"
    );
    for r in [&ping, &insert, &find] {
        println!(
            "{:<16} {:>12.0} {:>10} {:>14.0} {:>8}",
            r.op.name(),
            r.rate(),
            r.ops,
            r.mean_latency_us(),
            r.errors
        );
    }
    let point = (insert.rate() + find.rate()) / 2.0;
    println!();
    println!(
        "point ops/s (mean of insert and find): {point:.0}; point ops / ping = {:.2} (insert {:.2}, find {:.2})",
        point / ping.rate().max(1.0),
        insert.rate() / ping.rate().max(1.0),
        find.rate() / ping.rate().max(1.0)
    );
    drop(client);
    if let Some(emu) = emulator {
        emu.shutdown().await;
    }
    std::process::ExitCode::SUCCESS
}
