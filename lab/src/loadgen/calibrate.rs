//! Calibration: when no capacity is given in model mode, measures what the server model
//! actually completes with the run's operation mix.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::client::{self, OpSpec, Sink};
use super::config::{with_options, Driver, LabConfig};
use super::control::{COLL, DB};
use super::metrics::Recorder;

/// Measures what the server model completes per second with the run's operation mix: 48
/// closed-loop workers on one fork client (no retries) for 2 s, counting successes in the last
/// 1.5 s.
pub(crate) async fn calibrate(cfg: &LabConfig, uri: &str) -> Result<f64, String> {
    let recorder = Arc::new(Recorder::new(Instant::now()));
    let sink = Arc::new(Sink::new(recorder, Arc::new(AtomicU64::new(0))));
    let c = client::connect(
        Driver::Fork,
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
