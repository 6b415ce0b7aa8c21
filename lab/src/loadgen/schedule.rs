//! The open-loop schedule: when each request leaves, whatever came back before.
//!
//! The whole schedule is computed before the run (per instance: offset, phase, operation and
//! key), so the arrival process cannot be slowed by the system under test. [`drive`] walks one
//! instance's schedule: it sleeps until the next scheduled instant, hands the request to a
//! callback that must not wait for the reply (it spawns), and records how late it was.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::config::{Arrivals, OpKind, OpMix, Scenario};

/// One scheduled request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrival {
    /// Offset from the start of the run.
    pub at: Duration,
    /// Phase index.
    pub phase: usize,
    /// Operation.
    pub kind: OpKind,
    /// Document key (`_id`) the operation targets.
    pub key: i64,
}

/// What shapes a schedule.
#[derive(Debug, Clone)]
pub struct ScheduleSpec<'a> {
    /// Phases.
    pub scenario: &'a Scenario,
    /// Operations per second at 100 % load (all instances together).
    pub capacity: f64,
    /// Number of instances sharing the load equally.
    pub instances: usize,
    /// Arrival process.
    pub arrivals: Arrivals,
    /// Operation mix.
    pub mix: &'a OpMix,
    /// Keys are drawn uniformly from `0..docs`.
    pub docs: i64,
    /// RNG seed; instance `i` uses `seed + i`.
    pub seed: u64,
}

/// The schedule of every instance (index = instance), each sorted by offset.
pub fn build(spec: &ScheduleSpec<'_>) -> Vec<Vec<Arrival>> {
    let n = spec.instances.max(1);
    (0..n).map(|i| build_one(spec, i, n)).collect()
}

fn build_one(spec: &ScheduleSpec<'_>, instance: usize, n: usize) -> Vec<Arrival> {
    let mut rng = StdRng::seed_from_u64(spec.seed.wrapping_add(instance as u64));
    let mut out = Vec::new();
    let mut phase_start = 0.0f64;
    for (pi, phase) in spec.scenario.phases.iter().enumerate() {
        let len = phase.duration.as_secs_f64();
        let rate = phase.load * spec.capacity / n as f64;
        let phase_end = phase_start + len;
        if rate > 0.0 && len > 0.0 {
            let gap = 1.0 / rate;
            // Fixed arrivals of the instances are staggered across one gap.
            let mut t = match spec.arrivals {
                Arrivals::Fixed => phase_start + gap * (instance as f64 / n as f64),
                Arrivals::Poisson => phase_start + exp(&mut rng, rate),
            };
            while t < phase_end {
                let kind = spec.mix.pick(rng.random::<f64>());
                let key = if spec.docs > 0 {
                    rng.random_range(0..spec.docs)
                } else {
                    0
                };
                out.push(Arrival {
                    at: Duration::from_secs_f64(t),
                    phase: pi,
                    kind,
                    key,
                });
                t += match spec.arrivals {
                    Arrivals::Fixed => gap,
                    Arrivals::Poisson => exp(&mut rng, rate),
                };
            }
        }
        phase_start = phase_end;
    }
    out
}

/// An exponential variate with the given rate.
fn exp(rng: &mut StdRng, rate: f64) -> f64 {
    let u: f64 = rng.random::<f64>();
    -(1.0 - u).ln() / rate
}

/// Walks `arrivals` from `start`: at each scheduled instant calls `fire(arrival, scheduled,
/// lag)`, where `lag` is how late the call is. Requests that are already due are fired
/// without sleeping. `fire` must not wait for the request; the pace never depends on replies.
pub async fn drive<F>(start: Instant, arrivals: &[Arrival], mut fire: F)
where
    F: FnMut(&Arrival, Instant, Duration),
{
    for a in arrivals {
        let when = start + a.at;
        if Instant::now() < when {
            tokio::time::sleep_until(when).await;
        }
        let now = Instant::now();
        fire(a, when, now.saturating_duration_since(when));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loadgen::config::{Length, Phase};

    fn spec<'a>(s: &'a Scenario, mix: &'a OpMix, arrivals: Arrivals) -> ScheduleSpec<'a> {
        ScheduleSpec {
            scenario: s,
            capacity: 1000.0,
            instances: 4,
            arrivals,
            mix,
            docs: 100,
            seed: 7,
        }
    }

    #[test]
    fn fixed_rate_counts_per_phase() {
        let s = Scenario::burst(Length::Quick);
        let mix = OpMix::default();
        let all = build(&spec(&s, &mix, Arrivals::Fixed));
        assert_eq!(all.len(), 4);
        let total: usize = all.iter().map(Vec::len).sum();
        // 500/s × 2 s + 1300/s × 6 s + 500/s × 4 s = 10,800 (± one per instance and phase).
        assert!((total as i64 - 10_800).abs() <= 12, "{total}");
        for inst in &all {
            assert!(inst.windows(2).all(|w| w[0].at <= w[1].at));
            assert!(inst.iter().all(|a| a.key < 100));
        }
    }

    #[test]
    fn poisson_is_reproducible() {
        let s = Scenario {
            name: "x".into(),
            phases: vec![Phase::new("p", 1.0, 2.0)],
            burst: None,
        };
        let mix = OpMix::default();
        let a = build(&spec(&s, &mix, Arrivals::Poisson));
        let b = build(&spec(&s, &mix, Arrivals::Poisson));
        assert_eq!(a, b);
    }
}
