//! The figures of one variant run, and the median/spread over repeated runs.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::client::ForkStats;
use super::config::{Scenario, Variant};
use super::drive::DriveStats;
use super::metrics::{goodput, merged, pct_ms, recovery_time, ErrorClass, Second};

/// Steal time (the hypervisor giving the machine's cores to other guests) above which a run is
/// invalid: its figures then describe the host, not the drivers.
pub const MAX_STEAL_PCT: f64 = 10.0;

/// Process CPU (percent of all cores) below which a closed loop that should saturate the
/// machine (`fast-path`) is invalid: something else took the cores.
pub const MIN_CLOSED_LOOP_CPU_PCT: f64 = 75.0;

/// Goodput share of offered load that counts as recovered.
pub const RECOVERED_SHARE: f64 = 0.95;

/// p50 / p95 / p99 in ms (`None` = no sample).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
}

impl Percentiles {
    fn of(h: &hdrhistogram::Histogram<u64>) -> Percentiles {
        Percentiles {
            p50: pct_ms(h, 50.0),
            p95: pct_ms(h, 95.0),
            p99: pct_ms(h, 99.0),
        }
    }
}

/// The figures of one variant run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSummary {
    /// Variant name.
    pub variant: String,
    /// Driver.
    pub driver: String,
    /// The variant's URI options.
    pub uri_options: String,
    /// Repetition (0-based).
    pub rep: usize,
    /// Schedule length in seconds.
    pub secs: usize,
    /// Requests offered.
    pub offered: u64,
    /// Requests that succeeded within their deadline.
    pub good: u64,
    /// Mean goodput over the schedule (ops/s).
    pub goodput: f64,
    /// Mean goodput during the burst (or overload) phase (ops/s).
    pub burst_goodput: Option<f64>,
    /// Mean offered load during the burst phase (ops/s).
    pub burst_offered: Option<f64>,
    /// Commands started (all attempts).
    pub attempts: u64,
    /// Attempts per request (requests that reported, in time or late; an application's
    /// retries included).
    pub attempts_per_request: Option<f64>,
    /// Driver calls per request (above 1 when the application retries itself).
    pub tries_per_request: Option<f64>,
    /// Requests that sent more than one command (retried by the driver or the application).
    pub retried: u64,
    /// Requests that succeeded within their deadline ÷ requests offered.
    pub success_share: Option<f64>,
    /// Request errors by class.
    pub errors: BTreeMap<String, u64>,
    /// Attempt errors by class.
    pub attempt_errors: BTreeMap<String, u64>,
    /// Timed-out requests that later succeeded / failed.
    pub late_ok: u64,
    /// Timed-out requests that later failed.
    pub late_err: u64,
    /// Requests still running when the drain period ended.
    pub unfinished: u64,
    /// End-to-end latency as the application saw it.
    pub latency: Percentiles,
    /// Connection wait per request.
    pub conn_wait: Percentiles,
    /// Server queue wait (`None`: the server snapshot has no such figure).
    pub server_queue: Option<Percentiles>,
    /// Command time per request (server work + network + server queue).
    pub service: Percentiles,
    /// Connections opened / closed.
    pub conns_opened: u64,
    /// Connections closed.
    pub conns_closed: u64,
    /// Seconds after the burst until goodput stays ≥ 95 % of offered (`None`: never, or no
    /// burst).
    pub recovery_secs: Option<usize>,
    /// Whether the scenario has a burst at all.
    pub has_burst: bool,
    /// Server work wasted as a share of busy server work (`None`: no server model figures).
    pub wasted_share: Option<f64>,
    /// Server core time spent rejecting requests ÷ all server core time
    /// (`rejectionWorkMs ÷ busyCoreMs`; `None` without the model's figures).
    pub rejection_share: Option<f64>,
    /// Server counter deltas over the run (`serverStatus.labOverload.counters`).
    pub server: Option<BTreeMap<String, f64>>,
    /// Schedule lag p99 / max in ms.
    pub lag_p99_ms: Option<f64>,
    /// Worst schedule lag in ms.
    pub lag_max_ms: Option<f64>,
    /// Lag p99 above the limit: the run did not keep its schedule.
    pub invalid: bool,
    /// Mean process CPU over the run, percent of all cores.
    pub cpu_pct: Option<f64>,
    /// Highest per-second process CPU, percent of all cores.
    pub cpu_max_pct: Option<f64>,
    /// The machine was saturated (mean CPU ≥ 90 %): figures reflect the lab, not the drivers.
    pub saturated: bool,
    /// The fork's overload statistics over the run, summed over the instances (`None`:
    /// upstream).
    pub fork_stats: Option<ForkStats>,
    /// The machine's steal time over the run, percent of all CPU time (`None`: no
    /// `/proc/stat`).
    pub steal_pct: Option<f64>,
    /// Requests touching only the cold shards (persona `sharded`; `None` otherwise).
    pub cold_shards: Option<ColdShards>,
    /// Every reason this run does not count ([`RunSummary::invalid_reasons`], set by the
    /// runner once the run's figures are complete; empty: valid).
    pub invalid_why: Vec<String>,
}

impl RunSummary {
    /// Total request errors.
    pub fn total_errors(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Sets [`RunSummary::invalid_why`] from the run's figures.
    pub fn judge_validity(&mut self, saturation_expected: bool) {
        self.invalid_why = self
            .invalid_reasons(saturation_expected)
            .into_iter()
            .map(str::to_string)
            .collect();
    }

    /// Whether the run counts ([`RunSummary::judge_validity`] must have run).
    pub fn is_valid(&self) -> bool {
        self.invalid_why.is_empty()
    }

    /// Why this run's figures cannot be trusted (empty: valid): the generator missed its
    /// schedule, the machine was saturated (unless `saturation_expected`, as in a closed loop
    /// meant to saturate the client), requests were still running after the drain, the
    /// hypervisor stole more than [`MAX_STEAL_PCT`] of the CPU time, or a closed loop meant to
    /// saturate the machine got less than [`MIN_CLOSED_LOOP_CPU_PCT`] of it.
    pub fn invalid_reasons(&self, saturation_expected: bool) -> Vec<&'static str> {
        let mut why = Vec::new();
        if self.invalid {
            why.push("schedule lag");
        }
        if self.saturated && !saturation_expected {
            why.push("CPU saturated");
        }
        if self.unfinished > 0 {
            why.push("unfinished requests");
        }
        if self.steal_pct.is_some_and(|s| s > MAX_STEAL_PCT) {
            why.push("steal time");
        }
        if saturation_expected && self.cpu_pct.is_some_and(|c| c < MIN_CLOSED_LOOP_CPU_PCT) {
            why.push("CPU taken by other processes");
        }
        why
    }
}

/// Computes the summary of one run from its seconds.
#[allow(clippy::too_many_arguments)]
pub fn summarize(
    variant: &Variant,
    rep: usize,
    seconds: &[Second],
    scenario: &Scenario,
    len: usize,
    stats: DriveStats,
    server: Option<&BTreeMap<String, f64>>,
    cpu_pct: Option<f64>,
    max_lag_p99: Duration,
) -> RunSummary {
    let sched = &seconds[..len.min(seconds.len())];
    let offered_v: Vec<u64> = sched.iter().map(|s| s.offered).collect();
    let good_v = goodput(sched);
    let offered: u64 = offered_v.iter().sum();
    let good: u64 = good_v.iter().sum();
    let mut errors = BTreeMap::new();
    let mut attempt_errors = BTreeMap::new();
    for c in ErrorClass::ALL {
        errors.insert(
            c.name().to_string(),
            seconds.iter().map(|s| s.error(c)).sum(),
        );
        attempt_errors.insert(
            c.name().to_string(),
            seconds.iter().map(|s| s.attempt_errors[c as usize]).sum(),
        );
    }
    let reported: u64 = seconds.iter().map(|s| s.reported).sum();
    let reported_attempts: u64 = seconds.iter().map(|s| s.reported_attempts).sum();
    let reported_tries: u64 = seconds.iter().map(|s| s.reported_tries).sum();
    let burst = scenario.burst.or(if scenario.phases.len() == 1 {
        Some(0)
    } else {
        None
    });
    let (burst_goodput, burst_offered) = match burst {
        Some(b) => {
            let from = scenario.phase_start(b).as_secs() as usize;
            let to = (scenario.phase_start(b + 1).as_secs() as usize).min(sched.len());
            if to > from {
                let n = (to - from) as f64;
                (
                    Some(good_v[from..to].iter().sum::<u64>() as f64 / n),
                    Some(offered_v[from..to].iter().sum::<u64>() as f64 / n),
                )
            } else {
                (None, None)
            }
        }
        None => (None, None),
    };
    let recovery_secs = scenario.burst_end().and_then(|end| {
        recovery_time(&offered_v, &good_v, end.as_secs() as usize, RECOVERED_SHARE)
    });
    let lag = merged(sched, |s| &s.lag);
    let lag_p99_ms = pct_ms(&lag, 99.0);
    let lag_max_ms = (!lag.is_empty()).then(|| lag.max() as f64 / 1000.0);
    let invalid = lag_p99_ms.is_some_and(|p| p > max_lag_p99.as_secs_f64() * 1000.0);
    let cpu_max_pct = sched
        .iter()
        .filter_map(|s| s.cpu_pct)
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    let wasted_share = server.and_then(|s| {
        let wasted = s.get("wastedWorkMs")?;
        let busy = s.get("busyCoreMs")?;
        (*busy > 0.0).then(|| wasted / busy)
    });
    RunSummary {
        variant: variant.name.clone(),
        driver: variant.driver.to_string(),
        uri_options: variant.uri_options.clone(),
        rep,
        secs: len,
        offered,
        good,
        goodput: if len > 0 {
            good as f64 / len as f64
        } else {
            0.0
        },
        burst_goodput,
        burst_offered,
        attempts: seconds.iter().map(|s| s.attempts).sum(),
        attempts_per_request: (reported > 0).then(|| reported_attempts as f64 / reported as f64),
        tries_per_request: (reported > 0).then(|| reported_tries as f64 / reported as f64),
        retried: seconds.iter().map(|s| s.reported_retried).sum(),
        success_share: (offered > 0).then(|| good as f64 / offered as f64),
        errors,
        attempt_errors,
        late_ok: seconds.iter().map(|s| s.late_ok).sum(),
        late_err: seconds.iter().map(|s| s.late_err).sum(),
        unfinished: stats.unfinished,
        latency: Percentiles::of(&merged(seconds, |s| &s.latency)),
        conn_wait: Percentiles::of(&merged(seconds, |s| &s.conn_wait)),
        server_queue: server.and_then(|s| {
            let get = |p: &str| s.get(&format!("queueWaitMs.{p}")).copied();
            let recorded = get("count").is_some_and(|n| n > 0.0);
            get("p99").filter(|_| recorded).map(|p99| Percentiles {
                p50: get("p50"),
                p95: get("p95"),
                p99: Some(p99),
            })
        }),
        service: Percentiles::of(&merged(seconds, |s| &s.service)),
        conns_opened: seconds.iter().map(|s| s.conns_opened).sum(),
        conns_closed: seconds.iter().map(|s| s.conns_closed).sum(),
        recovery_secs,
        has_burst: scenario.burst.is_some(),
        wasted_share,
        rejection_share: server.and_then(|s| {
            let rejecting = s.get("rejectionWorkMs")?;
            let busy = s.get("busyCoreMs")?;
            (*busy > 0.0).then(|| rejecting / busy)
        }),
        server: server.cloned(),
        lag_p99_ms,
        lag_max_ms,
        invalid,
        cpu_pct,
        cpu_max_pct,
        saturated: cpu_pct.is_some_and(|c| c >= 90.0),
        fork_stats: None,
        steal_pct: None,
        cold_shards: None,
        invalid_why: Vec::new(),
    }
}

/// The requests of a sharded run that touch only the cold shards (every shard but the
/// layout's hot one, `arrivals::ShardKeys::is_cold`), over the schedule's seconds as goodput is.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ColdShards {
    /// Such requests offered.
    pub offered: u64,
    /// Those that succeeded within their deadline.
    pub good: u64,
    /// `good` per second of the schedule: the cold-shard goodput (ops/s).
    pub goodput: f64,
}

impl ColdShards {
    /// Over the first `len` seconds (the schedule's, as [`summarize`] counts goodput).
    pub fn of(seconds: &[Second], len: usize) -> ColdShards {
        let sched = &seconds[..len.min(seconds.len())];
        let good: u64 = sched.iter().map(|s| s.cold_good).sum();
        ColdShards {
            offered: sched.iter().map(|s| s.cold_offered).sum(),
            good,
            goodput: if len > 0 {
                good as f64 / len as f64
            } else {
                0.0
            },
        }
    }
}

/// Median and spread (min, max) of a figure over repeated runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// Runs with a value.
    pub n: usize,
}

impl Spread {
    /// Of the values present; `None` when there is none.
    pub fn of(values: impl IntoIterator<Item = Option<f64>>) -> Option<Spread> {
        let mut v: Vec<f64> = values
            .into_iter()
            .flatten()
            .filter(|x| x.is_finite())
            .collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Spread {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        })
    }
}

/// Median/spread of the headline figures of one variant over its runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VariantAggregate {
    /// Variant name.
    pub variant: String,
    /// Runs.
    pub runs: usize,
    /// Goodput (ops/s).
    pub goodput: Option<Spread>,
    /// Cold-shard goodput (ops/s; persona `sharded` only).
    pub cold_goodput: Option<Spread>,
    /// Burst goodput (ops/s).
    pub burst_goodput: Option<Spread>,
    /// Latency p99 (ms).
    pub p99_ms: Option<Spread>,
    /// Attempts per request.
    pub attempts_per_request: Option<Spread>,
    /// Request errors.
    pub errors: Option<Spread>,
    /// Late successes.
    pub late_ok: Option<Spread>,
    /// Wasted server work share.
    pub wasted_share: Option<Spread>,
    /// Recovery time (s); runs that never recovered are left out (see `not_recovered`).
    pub recovery_secs: Option<Spread>,
    /// Runs that did not recover.
    pub not_recovered: usize,
    /// Runs that do not count (any reason of [`RunSummary::invalid_reasons`]).
    pub invalid: usize,
    /// Runs on a saturated machine.
    pub saturated: usize,
}

/// Groups runs by variant (in first-seen order) and aggregates each group.
pub fn aggregate(runs: &[&RunSummary]) -> Vec<VariantAggregate> {
    let mut order: Vec<String> = Vec::new();
    for r in runs {
        if !order.contains(&r.variant) {
            order.push(r.variant.clone());
        }
    }
    order
        .into_iter()
        .map(|name| {
            let g: Vec<&&RunSummary> = runs.iter().filter(|r| r.variant == name).collect();
            VariantAggregate {
                runs: g.len(),
                goodput: Spread::of(g.iter().map(|r| Some(r.goodput))),
                cold_goodput: Spread::of(g.iter().map(|r| r.cold_shards.map(|c| c.goodput))),
                burst_goodput: Spread::of(g.iter().map(|r| r.burst_goodput)),
                p99_ms: Spread::of(g.iter().map(|r| r.latency.p99)),
                attempts_per_request: Spread::of(g.iter().map(|r| r.attempts_per_request)),
                errors: Spread::of(g.iter().map(|r| Some(r.total_errors() as f64))),
                late_ok: Spread::of(g.iter().map(|r| Some(r.late_ok as f64))),
                wasted_share: Spread::of(g.iter().map(|r| r.wasted_share)),
                recovery_secs: Spread::of(g.iter().map(|r| r.recovery_secs.map(|s| s as f64))),
                not_recovered: g
                    .iter()
                    .filter(|r| r.has_burst && r.recovery_secs.is_none())
                    .count(),
                invalid: g.iter().filter(|r| !r.is_valid()).count(),
                saturated: g.iter().filter(|r| r.saturated).count(),
                variant: name,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread() {
        let s = Spread::of([Some(3.0), None, Some(1.0), Some(2.0)]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        let s = Spread::of([Some(1.0), Some(4.0)]).unwrap();
        assert_eq!(s.median, 2.5);
        assert!(Spread::of([None]).is_none());
    }

    #[test]
    fn every_reason_makes_a_run_invalid() {
        let s = Scenario::steady("t", "p", 0.5, 1.0);
        let v = Variant::new("v", super::super::config::Driver::Fork, "");
        let base = summarize(
            &v,
            0,
            &[Second::default()],
            &s,
            1,
            DriveStats::default(),
            None,
            Some(50.0),
            Duration::from_millis(5),
        );
        assert!(base.invalid_reasons(false).is_empty());
        let steal = RunSummary {
            steal_pct: Some(MAX_STEAL_PCT + 1.0),
            ..base.clone()
        };
        assert_eq!(steal.invalid_reasons(false), vec!["steal time"]);
        // A closed loop meant to saturate the machine that got half of it.
        assert_eq!(
            base.invalid_reasons(true),
            vec!["CPU taken by other processes"]
        );
        let saturated = RunSummary {
            saturated: true,
            cpu_pct: Some(95.0),
            ..base.clone()
        };
        assert_eq!(saturated.invalid_reasons(false), vec!["CPU saturated"]);
        assert!(saturated.invalid_reasons(true).is_empty());
        let unfinished = RunSummary {
            unfinished: 1,
            ..base
        };
        assert_eq!(
            unfinished.invalid_reasons(false),
            vec!["unfinished requests"]
        );
    }
}
