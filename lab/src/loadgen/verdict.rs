//! The suite's verdict (`lab run --suite`): per scenario, each variant's headline figures
//! (median and spread over the repetitions), the best upstream configuration and each fork
//! variant's ratio to it, written as `verdict.json` (keys documented in `docs/lab.md`, stable)
//! and `verdict.md`.

use std::fmt::Write as _;
use std::path::Path;

use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::client::ForkStats;
use super::config::Driver;
use super::runner::LabRun;
use super::summary::{RunSummary, Spread};

/// Version of `verdict.json`'s layout; raised when a key changes meaning or goes away.
pub const VERDICT_SCHEMA: u32 = 1;

/// The variant whose throughput the `throughputRatio` figures divide by.
pub const RATIO_BASE: &str = "upstream-default";

/// Which figure ranks the variants of a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Primary {
    /// Goodput ÷ capacity (overload scenarios).
    GoodputShare,
    /// Requests that succeeded within the deadline ÷ requests offered (`transient`).
    SuccessShare,
    /// Requests completed per second in a closed loop (`fast-path`).
    Throughput,
}

impl Primary {
    /// The primary figure of a scenario.
    pub fn of(scenario: &str) -> Primary {
        match scenario {
            "transient" => Primary::SuccessShare,
            "fast-path" => Primary::Throughput,
            _ => Primary::GoodputShare,
        }
    }

    fn key(self) -> &'static str {
        match self {
            Primary::GoodputShare => "goodputShare",
            Primary::SuccessShare => "successShare",
            Primary::Throughput => "throughput",
        }
    }
}

/// A run that does not count.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InvalidRun {
    /// Variant.
    pub variant: String,
    /// Repetition, 1-based.
    pub run: usize,
    /// Why (schedule lag, CPU saturated, unfinished requests).
    pub reasons: Vec<String>,
}

/// One variant's headline figures over its repetitions (`None` = not applicable or no sample).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VariantVerdict {
    /// Variant name.
    pub name: String,
    /// `fork` or `upstream`.
    pub driver: String,
    /// The variant's own URI options.
    pub uri_options: String,
    /// Runs.
    pub runs: usize,
    /// Runs that do not count (see the scenario's `invalidRuns`).
    pub invalid_runs: usize,
    /// Goodput ÷ capacity over the whole schedule.
    pub goodput_share: Option<Spread>,
    /// Goodput ÷ capacity during the burst or overload phase.
    pub burst_goodput_share: Option<Spread>,
    /// Requests completed within the deadline per second.
    pub throughput: Option<Spread>,
    /// Commands per request (driver retries and application retries).
    pub attempts_per_request: Option<Spread>,
    /// Driver calls per request (application retries).
    pub tries_per_request: Option<Spread>,
    /// Server core time wasted ÷ all server core time.
    pub wasted_share: Option<Spread>,
    /// Server core time spent rejecting ÷ all server core time.
    pub rejection_share: Option<Spread>,
    /// Seconds after the burst until goodput stays ≥ 95 % of offered (recovered runs only).
    pub recovery_secs: Option<Spread>,
    /// Runs that never recovered.
    pub not_recovered: usize,
    /// Successes within the deadline ÷ requests offered.
    pub success_share: Option<Spread>,
    /// Throughput ÷ `upstream-default`'s in the same repetition (`fast-path`; `None` without
    /// `upstream-default`).
    pub throughput_ratio: Option<Spread>,
    /// Throughput ÷ `upstream-default`'s over every second of every repetition, with its 95 %
    /// interval (`fast-path`, where it is the figure the target is judged on).
    pub throughput_ratio_pooled: Option<PooledRatio>,
    /// End-to-end latency p99 (ms).
    pub p99_ms: Option<Spread>,
    /// Request errors by class, median over the runs.
    pub errors: std::collections::BTreeMap<String, f64>,
    /// The fork's overload statistics per request offered, median over the runs (`None`:
    /// upstream).
    pub fork_stats_per_request: Option<ForkStatsPerRequest>,
}

/// A ratio of two variants' throughputs over all their paired seconds, with its 95 % interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PooledRatio {
    /// The variant's completed requests ÷ the base variant's, over all pairs.
    pub ratio: f64,
    /// The 2.5th and 97.5th percentiles of `ratio` over bootstrap resamples of the pairs.
    pub low: f64,
    pub high: f64,
    /// Paired seconds.
    pub pairs: usize,
}

/// Bootstrap resamples behind a [`PooledRatio`]'s interval.
const BOOTSTRAP_RESAMPLES: usize = 2000;

impl PooledRatio {
    /// The ratio of the sums of `pairs` (a variant's completed requests, the base variant's,
    /// in the same second of the same repetition), and its percentile-bootstrap 95 % interval:
    /// the pairs are resampled with replacement, with a fixed seed so that a verdict is
    /// reproducible. `None` without pairs or when the base completed nothing.
    ///
    /// Why pairs: in an interleaved closed loop (`fast-path`) the variants' second `n` come
    /// from the same rounds, so they saw the same machine; resampling pairs keeps that.
    pub fn of(pairs: &[(u64, u64)]) -> Option<PooledRatio> {
        let ratio_of = |sum: (u64, u64)| (sum.1 > 0).then(|| sum.0 as f64 / sum.1 as f64);
        let sum = |items: &mut dyn Iterator<Item = (u64, u64)>| {
            items.fold((0u64, 0u64), |acc, p| {
                (acc.0.saturating_add(p.0), acc.1.saturating_add(p.1))
            })
        };
        let ratio = ratio_of(sum(&mut pairs.iter().copied()))?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        let mut resampled: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
            .filter_map(|_| {
                let mut draws = (0..pairs.len()).map(|_| pairs[rng.random_range(0..pairs.len())]);
                ratio_of(sum(&mut draws))
            })
            .collect();
        resampled.sort_by(f64::total_cmp);
        let at = |q: f64| resampled[((resampled.len() - 1) as f64 * q).round() as usize];
        let (low, high) = if resampled.is_empty() {
            (ratio, ratio)
        } else {
            (at(0.025), at(0.975))
        };
        Some(PooledRatio {
            ratio,
            low,
            high,
            pairs: pairs.len(),
        })
    }
}

/// A fork variant's `Client::overload_stats` counters ÷ requests offered, median over the runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ForkStatsPerRequest {
    /// Driver retries sent.
    pub retries_made: f64,
    /// Driver retries the budget refused.
    pub retries_refused: f64,
    /// Application retries the shared budget admitted.
    pub app_retries_made: f64,
    /// Application retries the shared budget refused.
    pub app_retries_refused: f64,
    /// First attempts the adaptive throttle rejected locally.
    pub local_rejections: f64,
    /// Operations that waited for a concurrency slot.
    pub concurrency_waits: f64,
}

impl ForkStatsPerRequest {
    fn of(runs: &[&RunSummary]) -> Option<ForkStatsPerRequest> {
        let per_request = |f: fn(&ForkStats) -> u64| {
            spread(runs, |r| {
                let stats = r.fork_stats.as_ref()?;
                (r.offered > 0).then(|| f(stats) as f64 / r.offered as f64)
            })
            .map(|s| s.median)
        };
        Some(ForkStatsPerRequest {
            retries_made: per_request(|s| s.retries_made)?,
            retries_refused: per_request(|s| s.retries_refused)?,
            app_retries_made: per_request(|s| s.app_retries_made)?,
            app_retries_refused: per_request(|s| s.app_retries_refused)?,
            local_rejections: per_request(|s| s.local_rejections)?,
            concurrency_waits: per_request(|s| s.concurrency_waits)?,
        })
    }
}

/// The best upstream variant of a scenario by its primary figure.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Best {
    /// Variant.
    pub variant: String,
    /// Median of the primary figure.
    pub value: f64,
}

/// A fork variant against the best upstream variant.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ForkRatio {
    /// Variant.
    pub variant: String,
    /// Its median primary figure.
    pub value: f64,
    /// `value` ÷ the best upstream value.
    pub ratio: Option<f64>,
}

/// One scenario of the verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScenarioVerdict {
    /// Scenario name.
    pub name: String,
    /// Capacity (ops/s) and how it was found.
    pub capacity: f64,
    /// How the capacity was found.
    pub capacity_note: String,
    /// Phases as `LOAD%×SECONDS`.
    pub phases: Vec<String>,
    /// Repetitions per variant.
    pub repeats: usize,
    /// Wall time of the scenario (s).
    pub wall_secs: f64,
    /// Every run counted.
    pub valid: bool,
    /// Runs that did not count, and why.
    pub invalid_runs: Vec<InvalidRun>,
    /// The figure that ranks variants.
    pub primary: Primary,
    /// Per variant.
    pub variants: Vec<VariantVerdict>,
    /// The upstream variant with the best primary figure.
    pub best_upstream: Option<Best>,
    /// Each fork variant's primary figure against the best upstream one.
    pub fork_ratios: Vec<ForkRatio>,
}

/// The whole verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// [`VERDICT_SCHEMA`].
    pub schema: u32,
    /// Wall time of the suite (s).
    pub wall_secs: f64,
    /// Every run of every scenario counted.
    pub valid: bool,
    /// Per scenario, in the order run.
    pub scenarios: Vec<ScenarioVerdict>,
}

fn spread(runs: &[&RunSummary], f: impl Fn(&RunSummary) -> Option<f64>) -> Option<Spread> {
    Spread::of(runs.iter().map(|r| f(r)))
}

fn primary_value(v: &VariantVerdict, p: Primary) -> Option<f64> {
    match p {
        Primary::GoodputShare => v.goodput_share,
        Primary::SuccessShare => v.success_share,
        Primary::Throughput => v.throughput,
    }
    .map(|s| s.median)
}

/// The verdict of one scenario's run.
pub fn scenario_verdict(run: &LabRun) -> ScenarioVerdict {
    let cfg = &run.config;
    let name = cfg.scenario.name.clone();
    let primary = Primary::of(&name);
    let cap = run.capacity;
    let all: Vec<&RunSummary> = run.runs.iter().map(|r| &r.summary).collect();
    let invalid_runs: Vec<InvalidRun> = all
        .iter()
        .filter_map(|r| {
            let why = r.invalid_reasons(cfg.saturation_expected);
            (!why.is_empty()).then(|| InvalidRun {
                variant: r.variant.clone(),
                run: r.rep + 1,
                reasons: why.into_iter().map(str::to_string).collect(),
            })
        })
        .collect();
    // The ratio base's run in each repetition.
    let base_run = |rep: usize| {
        run.runs
            .iter()
            .find(|r| r.variant.name == RATIO_BASE && r.rep == rep)
    };
    let pooled = |variant: &str| {
        let pairs: Vec<(u64, u64)> = run
            .runs
            .iter()
            .filter(|r| r.variant.name == variant)
            .filter_map(|r| Some((&r.seconds, &base_run(r.rep)?.seconds)))
            .flat_map(|(own, base)| own.iter().zip(base).map(|(a, b)| (a.good, b.good)))
            .collect();
        PooledRatio::of(&pairs)
    };
    let base = |rep: usize| {
        base_run(rep)
            .map(|r| r.summary.goodput)
            .filter(|g| *g > 0.0)
    };
    let variants: Vec<VariantVerdict> = cfg
        .variants
        .iter()
        .map(|v| {
            let runs: Vec<&RunSummary> = all
                .iter()
                .copied()
                .filter(|r| r.variant == v.name)
                .collect();
            let share = |x: f64| (cap > 0.0).then(|| x / cap);
            let mut errors = std::collections::BTreeMap::new();
            for class in runs.first().map(|r| r.errors.keys()).into_iter().flatten() {
                if let Some(s) = spread(&runs, |r| r.errors.get(class).map(|n| *n as f64)) {
                    errors.insert(class.clone(), s.median);
                }
            }
            VariantVerdict {
                name: v.name.clone(),
                driver: v.driver.to_string(),
                uri_options: v.uri_options.clone(),
                runs: runs.len(),
                invalid_runs: invalid_runs.iter().filter(|i| i.variant == v.name).count(),
                goodput_share: spread(&runs, |r| share(r.goodput)),
                burst_goodput_share: spread(&runs, |r| r.burst_goodput.and_then(share)),
                throughput: spread(&runs, |r| Some(r.goodput)),
                attempts_per_request: spread(&runs, |r| r.attempts_per_request),
                tries_per_request: spread(&runs, |r| r.tries_per_request),
                wasted_share: spread(&runs, |r| r.wasted_share),
                rejection_share: spread(&runs, |r| r.rejection_share),
                recovery_secs: spread(&runs, |r| r.recovery_secs.map(|s| s as f64)),
                not_recovered: runs
                    .iter()
                    .filter(|r| r.has_burst && r.recovery_secs.is_none())
                    .count(),
                success_share: spread(&runs, |r| r.success_share),
                throughput_ratio: spread(&runs, |r| base(r.rep).map(|b| r.goodput / b)),
                throughput_ratio_pooled: (primary == Primary::Throughput)
                    .then(|| pooled(&v.name))
                    .flatten(),
                p99_ms: spread(&runs, |r| r.latency.p99),
                errors,
                fork_stats_per_request: ForkStatsPerRequest::of(&runs),
            }
        })
        .collect();
    let best_upstream = variants
        .iter()
        .filter(|v| v.driver == Driver::Upstream.to_string())
        .filter_map(|v| primary_value(v, primary).map(|x| (v, x)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(v, x)| Best {
            variant: v.name.clone(),
            value: x,
        });
    let fork_ratios = variants
        .iter()
        .filter(|v| v.driver == Driver::Fork.to_string())
        .filter_map(|v| {
            let value = primary_value(v, primary)?;
            let ratio = best_upstream
                .as_ref()
                .and_then(|b| (b.value > 0.0).then(|| value / b.value));
            Some(ForkRatio {
                variant: v.name.clone(),
                value,
                ratio,
            })
        })
        .collect();
    ScenarioVerdict {
        name,
        capacity: cap,
        capacity_note: run.capacity_note.clone(),
        phases: cfg
            .scenario
            .phases
            .iter()
            .map(|p| format!("{:.0}%×{:.0}", p.load * 100.0, p.duration.as_secs_f64()))
            .collect(),
        repeats: cfg.repeats,
        wall_secs: run.wall.as_secs_f64(),
        valid: invalid_runs.is_empty(),
        invalid_runs,
        primary,
        variants,
        best_upstream,
        fork_ratios,
    }
}

/// The verdict of a suite.
pub fn verdict(runs: &[LabRun], wall_secs: f64) -> Verdict {
    let scenarios: Vec<ScenarioVerdict> = runs.iter().map(scenario_verdict).collect();
    Verdict {
        schema: VERDICT_SCHEMA,
        wall_secs,
        valid: scenarios.iter().all(|s| s.valid),
        scenarios,
    }
}

fn cell(s: &Option<Spread>, digits: usize, scale: f64) -> String {
    match s {
        Some(s) if s.n > 1 => format!(
            "{:.d$} [{:.d$}–{:.d$}]",
            s.median * scale,
            s.min * scale,
            s.max * scale,
            d = digits
        ),
        Some(s) => format!("{:.d$}", s.median * scale, d = digits),
        None => "–".into(),
    }
}

/// `verdict.md`.
pub fn markdown(v: &Verdict) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Overload lab verdict\n");
    let _ = writeln!(
        s,
        "Suite wall time {:.0} s. {}\n",
        v.wall_secs,
        if v.valid {
            "Every run is valid."
        } else {
            "**INVALID runs** are listed per scenario; their scenario's figures are not \
             trustworthy."
        }
    );
    let _ = writeln!(
        s,
        "Figures: median [min–max] over the repetitions. Goodput and burst goodput ÷ \
         capacity; attempts and tries per request; wasted work and rejecting ÷ server core \
         time (%); recovery in seconds; success share (%) of requests offered; throughput ratio to \
         `{RATIO_BASE}` in the same repetition.\n"
    );
    for sc in &v.scenarios {
        let _ = writeln!(
            s,
            "## {}{}\n\nPhases {}, capacity {:.0} ops/s ({}), {} repetition(s), {:.0} s.\n",
            sc.name,
            if sc.valid { "" } else { " — INVALID" },
            sc.phases.join(" → "),
            sc.capacity,
            sc.capacity_note,
            sc.repeats,
            sc.wall_secs
        );
        let _ = writeln!(
            s,
            "| variant | goodput ÷ cap | burst ÷ cap | ops/s | attempts/req | tries/req | wasted % | rejecting % | recovery s | success % | ratio to {RATIO_BASE} | p99 ms |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
        for x in &sc.variants {
            let mut rec = cell(&x.recovery_secs, 0, 1.0);
            if x.not_recovered > 0 {
                rec = format!("{rec} ({} not recovered)", x.not_recovered);
            }
            let name = if x.invalid_runs > 0 {
                format!("{} ({} invalid)", x.name, x.invalid_runs)
            } else {
                x.name.clone()
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                name,
                cell(&x.goodput_share, 2, 1.0),
                cell(&x.burst_goodput_share, 2, 1.0),
                cell(&x.throughput, 0, 1.0),
                cell(&x.attempts_per_request, 2, 1.0),
                cell(&x.tries_per_request, 2, 1.0),
                cell(&x.wasted_share, 1, 100.0),
                cell(&x.rejection_share, 1, 100.0),
                rec,
                cell(&x.success_share, 1, 100.0),
                cell(&x.throughput_ratio, 3, 1.0),
                cell(&x.p99_ms, 1, 1.0),
            );
        }
        let _ = writeln!(s);
        match &sc.best_upstream {
            Some(b) => {
                let _ = writeln!(
                    s,
                    "Best upstream by {}: **{}** ({:.3}).",
                    sc.primary.key(),
                    b.variant,
                    b.value
                );
            }
            None => {
                let _ = writeln!(s, "No upstream variant ran.");
            }
        }
        for f in &sc.fork_ratios {
            let stats = sc
                .variants
                .iter()
                .find(|x| x.name == f.variant)
                .and_then(|x| x.fork_stats_per_request)
                .map(|st| {
                    format!(
                        " Per request: driver retries {:.3} made, {:.3} refused; application \
                         retries {:.3} made, {:.3} refused.",
                        st.retries_made,
                        st.retries_refused,
                        st.app_retries_made,
                        st.app_retries_refused
                    )
                })
                .unwrap_or_default();
            let pooled = sc
                .variants
                .iter()
                .find(|x| x.name == f.variant)
                .and_then(|x| x.throughput_ratio_pooled)
                .map(|p| {
                    format!(
                        " Pooled over every second: **{:.3} × {RATIO_BASE}** (95 % interval \
                         {:.3}–{:.3}, {} paired seconds).",
                        p.ratio, p.low, p.high, p.pairs
                    )
                })
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "- {}: {:.3}, {} the best upstream.{}{}",
                f.variant,
                f.value,
                f.ratio
                    .map(|r| format!("{r:.3} ×"))
                    .unwrap_or_else(|| "no ratio to".into()),
                pooled,
                stats
            );
        }
        for i in &sc.invalid_runs {
            let _ = writeln!(
                s,
                "- INVALID: {} run {} ({}).",
                i.variant,
                i.run,
                i.reasons.join(", ")
            );
        }
        let _ = writeln!(s);
    }
    s
}

/// Writes `verdict.json` and `verdict.md` into `dir`.
pub fn write(v: &Verdict, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let json = serde_json::to_string_pretty(v).map_err(|e| e.to_string())?;
    for (name, body) in [("verdict.json", json), ("verdict.md", markdown(v))] {
        let p = dir.join(name);
        std::fs::write(&p, body).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::PooledRatio;

    #[test]
    fn a_pooled_ratio_is_the_ratio_of_the_sums_and_lies_in_its_interval() {
        let pairs: Vec<(u64, u64)> = (0..200)
            .map(|i| {
                // The machine's speed changes from pair to pair; the variant is 10 % slower.
                let base = 4000 + (i * 7919 % 1500);
                (base * 9 / 10, base)
            })
            .collect();
        let p = PooledRatio::of(&pairs).unwrap();
        assert!((p.ratio - 0.9).abs() < 1e-3, "{p:?}");
        assert!(p.low <= p.ratio && p.ratio <= p.high, "{p:?}");
        assert!(
            p.high - p.low < 0.01,
            "a constant ratio has a narrow interval: {p:?}"
        );
        assert_eq!(p.pairs, 200);
    }

    #[test]
    fn a_noisier_pairing_has_a_wider_interval() {
        let pairs = |noise: u64| -> Vec<(u64, u64)> {
            (0..100u64)
                .map(|i| (4000 + (i * 7919 % noise), 4000 + (i * 104_729 % noise)))
                .collect()
        };
        let quiet = PooledRatio::of(&pairs(100)).unwrap();
        let noisy = PooledRatio::of(&pairs(2000)).unwrap();
        assert!(
            noisy.high - noisy.low > 2.0 * (quiet.high - quiet.low),
            "{quiet:?} {noisy:?}"
        );
    }

    #[test]
    fn no_pairs_or_no_base_requests_give_no_ratio() {
        assert_eq!(PooledRatio::of(&[]), None);
        assert_eq!(PooledRatio::of(&[(10, 0), (5, 0)]), None);
    }
}
