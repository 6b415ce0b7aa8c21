//! What the model's virtual cores complete of the lab's mix (80 % point reads of 2 ms, 10 %
//! range reads of 5 ms, 10 % writes of 3 ms) in real time, on two cores with 8 read and 8
//! write tickets, without wire or driver: the cores' own loss at each queue depth.
//!
//! ```sh
//! cargo run --release -p emulator --example core_throughput             # closed loops of 1 to 48
//! cargo run --release -p emulator --example core_throughput -- 1600 750 # open loop at 1,600/s, limiter 750/s
//! ```
//!
//! Closed: that many requests always in flight. Open: Poisson arrivals at the given rate with
//! `maxTimeMS` 100, through an ingress limiter at the second rate (no queue, burst 0.25 s),
//! as the lab's `sustained` sends them. Each run measures 4 s after 0.5 s of warm-up and prints
//! completions a second and the core time charged (`busyCoreMs`) out of 2,000 ms a second.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use emulator::model::{CommandInfo, CommandKind, Model, ModelConfig};
use rand::{Rng, SeedableRng};
use tokio::task::JoinSet;
use tokio::time::Instant;

const WARM_UP: Duration = Duration::from_millis(500);
const MEASURED: Duration = Duration::from_secs(4);

fn main() {
    let args: Vec<f64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("arguments are numbers"))
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async move {
        match args[..] {
            [] => {
                for depth in [1, 2, 3, 8, 16, 48] {
                    run(Load::Closed(depth)).await;
                }
            }
            [rate, limit] => run(Load::Open { rate, limit }).await,
            _ => eprintln!("usage: core_throughput [RATE LIMIT]"),
        }
    });
}

#[derive(Clone, Copy, Debug)]
enum Load {
    Closed(usize),
    Open { rate: f64, limit: f64 },
}

fn request(rng: &mut impl Rng) -> CommandInfo {
    let (kind, cost) = match rng.random_range(0..10) {
        0 => (CommandKind::RangeRead, 5.0),
        1 => (CommandKind::Write, 3.0),
        _ => (CommandKind::PointRead, 2.0),
    };
    CommandInfo::new("lab", kind, Instant::now()).with_cost_ms(cost)
}

async fn run(load: Load) {
    let mut cfg = ModelConfig {
        enabled: true,
        cores: 2,
        ..ModelConfig::default()
    };
    cfg.tickets.read = 8;
    cfg.tickets.write = 8;
    cfg.limiter.enabled = false;
    if let Load::Open { limit, .. } = load {
        cfg.limiter.enabled = true;
        cfg.limiter.rate_per_sec = limit;
        cfg.limiter.burst_capacity_secs = 0.25;
        cfg.limiter.max_queue_depth = 0;
    }
    let model = Model::new(cfg).expect("a valid model");
    let start = Instant::now();
    let (warm, end) = (start + WARM_UP, start + WARM_UP + MEASURED);
    let done = Arc::new(AtomicU64::new(0));
    let one = move |model: Arc<Model>, done: Arc<AtomicU64>, info: CommandInfo| async move {
        let Ok(admitted) = model.admit(&info).await else {
            return;
        };
        let ok = admitted.execute(std::future::pending()).await.is_ok();
        let now = Instant::now();
        if ok && now >= warm && now < end {
            done.fetch_add(1, Ordering::Relaxed);
        }
    };
    let mut tasks = JoinSet::new();
    match load {
        Load::Closed(depth) => {
            for worker in 0..depth {
                let (model, done) = (model.clone(), done.clone());
                tasks.spawn(async move {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(worker as u64);
                    while Instant::now() < end {
                        one(model.clone(), done.clone(), request(&mut rng)).await;
                    }
                });
            }
        }
        Load::Open { rate, .. } => {
            let (model, done) = (model.clone(), done.clone());
            tasks.spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(7);
                let mut requests = JoinSet::new();
                let mut at = start;
                while at < end {
                    let gap: f64 = -(1.0 - rng.random::<f64>()).ln() / rate;
                    at += Duration::from_secs_f64(gap);
                    tokio::time::sleep_until(at).await;
                    let info = request(&mut rng).with_max_time_ms(100);
                    requests.spawn(one(model.clone(), done.clone(), info));
                }
                while requests.join_next().await.is_some() {}
            });
        }
    }
    tokio::time::sleep_until(warm).await;
    let before = model.snapshot().counters;
    tokio::time::sleep_until(end).await;
    let after = model.snapshot().counters;
    while tasks.join_next().await.is_some() {}
    let secs = MEASURED.as_secs_f64();
    let per_sec = |a: f64, b: f64| (a - b) / secs;
    println!(
        "{load:?}: {:.0} completed/s, busyCoreMs {:.0}/s of 2000 (rejecting {:.0}, {:.0} rejections/s)",
        done.load(Ordering::Relaxed) as f64 / secs,
        per_sec(after.busy_core_ms, before.busy_core_ms),
        per_sec(after.rejection_work_ms, before.rejection_work_ms),
        per_sec(after.rejected as f64, before.rejected as f64),
    );
}
