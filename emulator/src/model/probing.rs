//! Throughput probing: find the ticket count that gets the most done.
//!
//! Every interval the prober measures throughput (completed requests per second). In the stable
//! phase it folds that into a moving average and then tries one step up (if the pools ran out of
//! tickets during the interval) or one step down (if they did not). After a probe interval it
//! keeps the new count if throughput beat the average (up) or did not fall below it (down), and
//! goes back otherwise.

use tokio::time::{Duration, Instant};

use super::config::ProbingConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Stable,
    Up { from: u32 },
    Down { from: u32 },
}

#[derive(Debug)]
pub(crate) struct Prober {
    current: u32,
    phase: Phase,
    ema: Option<f64>,
    last: Instant,
    completed_at_last: u64,
}

impl Prober {
    pub(crate) fn new(initial: u32, now: Instant, completed: u64) -> Prober {
        Prober {
            current: initial,
            phase: Phase::Stable,
            ema: None,
            last: now,
            completed_at_last: completed,
        }
    }

    pub(crate) fn current(&self) -> u32 {
        self.current
    }

    /// Keeps the count within new bounds.
    pub(crate) fn clamp(&mut self, cfg: &ProbingConfig) {
        self.current = self.current.clamp(cfg.min, cfg.max);
        self.phase = Phase::Stable;
    }

    /// Called on model events; returns the new ticket count per pool when it changes.
    /// `pressure`: reads whether the pools ran out of tickets since the last call (only called
    /// when an interval has ended).
    pub(crate) fn tick(
        &mut self,
        cfg: &ProbingConfig,
        now: Instant,
        completed: u64,
        pressure: impl FnOnce() -> bool,
    ) -> Option<u32> {
        let elapsed = now.saturating_duration_since(self.last);
        if elapsed < Duration::from_millis(cfg.interval_ms) {
            return None;
        }
        let tput = completed.saturating_sub(self.completed_at_last) as f64 / elapsed.as_secs_f64();
        self.last = now;
        self.completed_at_last = completed;
        let exhausted = pressure();
        let w = cfg.ema_weight;
        let before = self.current;
        match self.phase {
            Phase::Stable => {
                let avg = self.ema.map_or(tput, |e| e * (1.0 - w) + tput * w);
                self.ema = Some(avg);
                let step = ((f64::from(self.current) * cfg.step_fraction).round() as u32).max(1);
                if exhausted && self.current < cfg.max {
                    self.phase = Phase::Up { from: self.current };
                    self.current = self.current.saturating_add(step).min(cfg.max);
                } else if !exhausted && self.current > cfg.min {
                    self.phase = Phase::Down { from: self.current };
                    self.current = self.current.saturating_sub(step).max(cfg.min);
                }
            }
            Phase::Up { from } => {
                let avg = self.ema.unwrap_or(0.0);
                if tput > avg {
                    self.ema = Some(avg * (1.0 - w) + tput * w);
                } else {
                    self.current = from;
                }
                self.phase = Phase::Stable;
            }
            Phase::Down { from } => {
                let avg = self.ema.unwrap_or(0.0);
                if tput >= avg {
                    self.ema = Some(avg * (1.0 - w) + tput * w);
                } else {
                    self.current = from;
                }
                self.phase = Phase::Stable;
            }
        }
        (self.current != before).then_some(self.current)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_up_under_pressure_and_keeps_a_gain() {
        let cfg = ProbingConfig::default();
        let t0 = Instant::now();
        let mut p = Prober::new(10, t0, 0);
        let iv = Duration::from_millis(cfg.interval_ms);
        assert_eq!(p.tick(&cfg, t0 + iv, 100, || true), Some(11));
        // More throughput at 11: keep it.
        assert_eq!(p.tick(&cfg, t0 + iv * 2, 300, || true), None);
        assert_eq!(p.current(), 11);
        // Stable again, still under pressure: step up once more.
        assert_eq!(p.tick(&cfg, t0 + iv * 3, 500, || true), Some(12));
        // No gain: back to 11.
        assert_eq!(p.tick(&cfg, t0 + iv * 4, 510, || true), Some(11));
    }

    #[test]
    fn shrinks_to_min_without_pressure() {
        let cfg = ProbingConfig::default();
        let t0 = Instant::now();
        let mut p = Prober::new(8, t0, 0);
        let iv = Duration::from_millis(cfg.interval_ms);
        for i in 1..100u32 {
            p.tick(&cfg, t0 + iv * i, 0, || false);
            assert!(p.current() >= cfg.min);
        }
        assert_eq!(p.current(), cfg.min);
    }
}
