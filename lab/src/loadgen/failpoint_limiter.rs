//! Fail-point rate limiting: in fail-point mode the server has no model, so the lab turns
//! `failCommand` into a rate limiter by adjusting its activation probability.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::control::Control;

/// Keeps the share of attempts the fail point rejects at `1 − capacity / attempt rate`, so the
/// attempts that get through stay at capacity (a rate limiter built from `failCommand`).
pub(crate) async fn failpoint_controller(
    control: Arc<Control>,
    attempts: Arc<AtomicU64>,
    capacity: f64,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut window: std::collections::VecDeque<(Instant, u64)> = Default::default();
    let mut current = 0.0f64;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        let now = Instant::now();
        window.push_back((now, attempts.load(Ordering::Relaxed)));
        while window.len() > 2 && now - window[0].0 > Duration::from_millis(500) {
            window.pop_front();
        }
        let (t0, a0) = window[0];
        let dt = (now - t0).as_secs_f64();
        if dt < 0.05 {
            continue;
        }
        let rate = (window[window.len() - 1].1 - a0) as f64 / dt;
        let p = if rate > capacity {
            (1.0 - capacity / rate).clamp(0.0, 0.95)
        } else {
            0.0
        };
        if (p - current).abs() >= 0.02 || (p == 0.0 && current != 0.0) {
            let p = (p * 100.0).round() / 100.0;
            if control.fail_point(p).await.is_ok() {
                current = p;
            }
        }
    }
    let _ = control.fail_point(0.0).await;
}
