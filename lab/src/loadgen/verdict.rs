//! The suite's verdict (`lab run --suite`): per scenario, each variant's headline figures
//! (median and spread over its *valid* repetitions), the best upstream configuration and each
//! fork variant's ratio to it; then the dominance tables (every upstream configuration against
//! the fork's recommended settings and against every control, per scenario) and the checks of
//! issue 27, each met, missed or not judged. Written as `verdict.json` (keys documented in
//! `docs/lab.md`, stable) and `verdict.md`.
//!
//! The verdict refuses to guess: a run that failed an honesty check (`RunSummary::invalid_why`)
//! counts for nothing, and a variant with fewer than [`MIN_VALID_RUNS`] valid runs in a
//! scenario is *not judged* there (no median, no ratio, not a candidate for best upstream).

use std::fmt::Write as _;
use std::path::Path;

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::client::ForkStats;
use super::config::{Driver, CONTROLS, RECOMMENDED};
use super::runner::LabRun;
use super::summary::{RunSummary, Spread};

/// Version of `verdict.json`'s layout; raised when a key changes meaning or goes away. 2: the
/// figures are over valid runs only, `throughputRatioPooled`'s interval resamples repetitions
/// and blocks of seconds, and the dominance tables and checks were added.
pub const VERDICT_SCHEMA: u32 = 2;

/// The variant whose throughput the `throughputRatio` figures divide by.
pub const RATIO_BASE: &str = "upstream-default";

/// Valid runs a variant needs in a scenario to be judged there.
pub const MIN_VALID_RUNS: usize = 2;

/// Which figure ranks the variants of a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Primary {
    /// Goodput ÷ capacity (overload scenarios).
    GoodputShare,
    /// Requests that succeeded within the deadline ÷ requests offered (`transient`, the
    /// `transient-N` sweep, `faults`).
    SuccessShare,
    /// Requests completed per second in a closed loop (`fast-path`).
    Throughput,
}

impl Primary {
    /// The primary figure of a scenario.
    pub fn of(scenario: &str) -> Primary {
        if is_success_scenario(scenario) {
            Primary::SuccessShare
        } else if scenario == "fast-path" {
            Primary::Throughput
        } else {
            Primary::GoodputShare
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

/// `hot-shard`: the scenario whose cold-shard goodput issue 30 protects.
pub const HOT_SHARD: &str = "hot-shard";

/// `even-shards`: `hot-shard` without a hot shard, the reference of its cold-shard check.
pub const HOT_SHARD_REFERENCE: &str = "even-shards";

/// Whether a scenario is only a reference for another's check (`even-shards`): it runs the
/// fork variants alone, so it has no best upstream, no place in the dominance tables and none
/// in the check of every scenario.
pub fn is_reference_scenario(scenario: &str) -> bool {
    scenario == HOT_SHARD_REFERENCE
}

/// Whether a scenario is judged on success share: `transient`, the `transient-N` sweep and
/// `faults`.
pub fn is_success_scenario(scenario: &str) -> bool {
    scenario == "transient" || scenario.starts_with("transient-") || scenario == "faults"
}

/// A run that does not count.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InvalidRun {
    /// Variant.
    pub variant: String,
    /// Repetition, 1-based.
    pub run: usize,
    /// Why (schedule lag, CPU saturated, unfinished requests, steal time, CPU taken by other
    /// processes).
    pub reasons: Vec<String>,
}

/// One variant's headline figures over its valid repetitions (`None` = not applicable, no
/// sample, or not judged).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VariantVerdict {
    /// Variant name.
    pub name: String,
    /// `fork` or `upstream`.
    pub driver: String,
    /// The variant's own URI options.
    pub uri_options: String,
    /// What its application did in this scenario, in words.
    pub application: String,
    /// Whether the run's options or the scenario changed the variant's own application.
    pub application_overridden: bool,
    /// Runs.
    pub runs: usize,
    /// Runs that do not count (see the scenario's `invalidRuns`).
    pub invalid_runs: usize,
    /// Runs that count.
    pub valid_runs: usize,
    /// At least [`MIN_VALID_RUNS`] valid runs: the figures below are over them. Otherwise
    /// every figure is `null` and the variant is "not judged" in this scenario.
    pub judged: bool,
    /// Goodput ÷ capacity over the whole schedule.
    pub goodput_share: Option<Spread>,
    /// Goodput ÷ capacity during the burst or overload phase.
    pub burst_goodput_share: Option<Spread>,
    /// Goodput of the requests touching only cold shards (ops/s; sharded scenarios).
    pub cold_goodput: Option<Spread>,
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
    /// Valid runs that never recovered.
    pub not_recovered: usize,
    /// Successes within the deadline ÷ requests offered.
    pub success_share: Option<Spread>,
    /// Throughput ÷ `upstream-default`'s in the same repetition (both runs valid; `None`
    /// without `upstream-default`).
    pub throughput_ratio: Option<Spread>,
    /// Throughput ÷ `upstream-default`'s over every paired second of every repetition where
    /// both runs are valid, with a 95 % interval that resamples repetitions and blocks of
    /// seconds (`fast-path`, where it is the figure the target is judged on).
    pub throughput_ratio_pooled: Option<PooledRatio>,
    /// End-to-end latency p99 (ms).
    pub p99_ms: Option<Spread>,
    /// Request errors by class, median over the valid runs.
    pub errors: std::collections::BTreeMap<String, f64>,
    /// The fork's overload statistics per request offered, median over the valid runs
    /// (`None`: upstream).
    pub fork_stats_per_request: Option<ForkStatsPerRequest>,
}

/// A ratio of two variants' throughputs over all their paired seconds, with its 95 % interval.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PooledRatio {
    /// The variant's completed requests ÷ the base variant's, over all pairs.
    pub ratio: f64,
    /// The 2.5th and 97.5th percentiles of `ratio` over bootstrap resamples: repetitions drawn
    /// with replacement, then within each drawn repetition its blocks of [`BLOCK_SECS`]
    /// consecutive paired seconds drawn with replacement.
    pub low: f64,
    pub high: f64,
    /// Paired seconds.
    pub pairs: usize,
    /// Repetitions the pairs come from.
    pub repetitions: usize,
    /// The ratio of each repetition alone, in order.
    pub rep_ratios: Vec<f64>,
}

/// Bootstrap resamples behind a [`PooledRatio`]'s interval.
const BOOTSTRAP_RESAMPLES: usize = 2000;

/// Consecutive seconds (16 interleaved rounds) resampled together: neighbouring seconds share
/// the machine's state (the hypervisor's share moves over seconds), so resampling seconds one
/// by one as if independent understated the scatter.
pub const BLOCK_SECS: usize = 2;

impl PooledRatio {
    /// The ratio of the sums of `reps` (per repetition, a variant's completed requests and the
    /// base variant's in the same second), and its two-level percentile-bootstrap 95 % interval
    /// with a fixed seed, so that a verdict is reproducible. `None` without pairs or when the
    /// base completed nothing.
    ///
    /// Why two levels: separate suites of the same code gave ratios 0.99–1.09, outside each
    /// other's intervals when seconds were resampled as independent. Drawing repetitions first
    /// lets the interval carry the scatter between repetitions (new clients, new connections,
    /// another stretch of the host's load), and blocks carry the scatter between neighbouring
    /// seconds. With few repetitions the interval is wide: that is what the data support.
    pub fn of(reps: &[Vec<(u64, u64)>]) -> Option<PooledRatio> {
        let ratio_of = |sum: (u64, u64)| (sum.1 > 0).then(|| sum.0 as f64 / sum.1 as f64);
        let add = |acc: (u64, u64), p: &(u64, u64)| {
            (acc.0.saturating_add(p.0), acc.1.saturating_add(p.1))
        };
        let reps: Vec<&Vec<(u64, u64)>> = reps.iter().filter(|r| !r.is_empty()).collect();
        let all = reps.iter().flat_map(|r| r.iter()).fold((0u64, 0u64), add);
        let ratio = ratio_of(all)?;
        let blocks: Vec<Vec<(u64, u64)>> = reps
            .iter()
            .map(|r| {
                r.chunks(BLOCK_SECS)
                    .map(|c| c.iter().fold((0u64, 0u64), add))
                    .collect()
            })
            .collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        let mut resampled: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
            .filter_map(|_| {
                let mut sum = (0u64, 0u64);
                for _ in 0..blocks.len() {
                    let rep = &blocks[rng.random_range(0..blocks.len())];
                    for _ in 0..rep.len() {
                        sum = add(sum, &rep[rng.random_range(0..rep.len())]);
                    }
                }
                ratio_of(sum)
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
            pairs: reps.iter().map(|r| r.len()).sum(),
            repetitions: reps.len(),
            rep_ratios: reps
                .iter()
                .filter_map(|r| ratio_of(r.iter().fold((0u64, 0u64), add)))
                .collect(),
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
    /// Retries given back to the budget by operations that then succeeded.
    pub retries_refunded: f64,
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
            retries_refunded: per_request(|s| s.retries_refunded)?,
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
    /// Whether the variants have a cold-shard goodput (sharded scenarios).
    pub has_cold_shards: bool,
    /// Per variant.
    pub variants: Vec<VariantVerdict>,
    /// The judged upstream variant with the best primary figure.
    pub best_upstream: Option<Best>,
    /// Each judged fork variant's primary figure against the best upstream one.
    pub fork_ratios: Vec<ForkRatio>,
}

/// Instructions per operation of each variant, counted by callgrind (`lab instructions`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstructionCounts {
    /// Operations the counts are over (the difference of two counts).
    pub ops: u64,
    /// Commit of the code counted.
    #[serde(default)]
    pub commit: String,
    /// Per variant.
    pub variants: Vec<InstructionCount>,
}

/// One variant's instructions per operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstructionCount {
    /// Variant (`pathbench`'s name).
    pub name: String,
    /// Instructions per operation, client and in-process emulator together.
    pub per_op: f64,
    /// `per_op` ÷ `upstream-default`'s (filled in by the verdict).
    #[serde(default)]
    pub ratio: Option<f64>,
}

impl InstructionCounts {
    /// Reads `instructions.json` (written by `lab instructions`) and fills in each ratio to
    /// `upstream-default`.
    pub fn read(path: &Path) -> Result<InstructionCounts, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut counts: InstructionCounts =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        counts.fill_ratios();
        Ok(counts)
    }

    /// Sets each variant's ratio to `upstream-default`'s count.
    pub fn fill_ratios(&mut self) {
        let base = self
            .variants
            .iter()
            .find(|v| v.name == RATIO_BASE)
            .map(|v| v.per_op)
            .filter(|b| *b > 0.0);
        for v in &mut self.variants {
            v.ratio = base.map(|b| v.per_op / b);
        }
    }
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Status {
    /// Every figure it needs was judged and meets it.
    Met,
    /// A judged figure misses it.
    Missed,
    /// Nothing misses it, but a figure it needs was not judged (invalid runs, a variant or
    /// scenario that did not run).
    NotJudged,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Met => "met",
            Status::Missed => "**missed**",
            Status::NotJudged => "not judged",
        }
    }

    /// Met only when every part is met; missed when one is missed.
    fn all(parts: impl IntoIterator<Item = Status>) -> Status {
        let mut out = Status::Met;
        for p in parts {
            match p {
                Status::Missed => return Status::Missed,
                Status::NotJudged => out = Status::NotJudged,
                Status::Met => {}
            }
        }
        out
    }

    fn at_least(value: Option<f64>, bound: f64) -> Status {
        match value {
            Some(v) if v >= bound => Status::Met,
            Some(_) => Status::Missed,
            None => Status::NotJudged,
        }
    }
}

/// One check of issue 27's "Done when".
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    /// What is checked.
    pub name: String,
    /// Met, missed or not judged.
    pub status: Status,
    /// The figures behind it.
    pub detail: String,
}

/// A fork variant against every upstream configuration, scenario by scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Dominance {
    /// The fork variant (the rows' numerator).
    pub fork_variant: String,
    /// The columns, in the order run.
    pub scenarios: Vec<String>,
    /// One row per upstream configuration that ran anywhere.
    pub rows: Vec<DominanceRow>,
}

/// One upstream configuration's row of a [`Dominance`] table.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DominanceRow {
    /// The upstream variant.
    pub upstream: String,
    /// Per scenario (same order as the table's): the fork variant's median primary figure ÷
    /// this configuration's (`fast-path` against `upstream-default`: the pooled ratio); `null`
    /// where either did not run or is not judged.
    pub ratios: Vec<Option<f64>>,
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
    /// The recommended settings and every control against each upstream configuration.
    pub dominance: Vec<Dominance>,
    /// Instructions per operation (`--instructions`), the layout-insensitive figure beside the
    /// fast path's throughput.
    pub instructions: Option<InstructionCounts>,
    /// Issue 27's checks, and issue 30's fleet check.
    pub checks: Vec<Check>,
}

fn spread(runs: &[&RunSummary], f: impl Fn(&RunSummary) -> Option<f64>) -> Option<Spread> {
    Spread::of(runs.iter().map(|r| f(r)))
}

fn primary_value(v: &VariantVerdict, p: Primary) -> Option<f64> {
    if !v.judged {
        return None;
    }
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
    let invalid_runs: Vec<InvalidRun> = run
        .runs
        .iter()
        .map(|r| &r.summary)
        .filter(|r| !r.is_valid())
        .map(|r| InvalidRun {
            variant: r.variant.clone(),
            run: r.rep + 1,
            reasons: r.invalid_why.clone(),
        })
        .collect();
    // The ratio base's valid run in each repetition.
    let base_run = |rep: usize| {
        run.runs
            .iter()
            .find(|r| r.variant.name == RATIO_BASE && r.rep == rep && r.summary.is_valid())
    };
    let pooled = |variant: &str| {
        let reps: Vec<Vec<(u64, u64)>> = run
            .runs
            .iter()
            .filter(|r| r.variant.name == variant && r.summary.is_valid())
            .filter_map(|r| Some((&r.seconds, &base_run(r.rep)?.seconds)))
            .map(|(own, base)| {
                own.iter()
                    .zip(base)
                    .map(|(a, b)| (a.good, b.good))
                    .collect()
            })
            .collect();
        PooledRatio::of(&reps)
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
            let all: Vec<&RunSummary> = run
                .runs
                .iter()
                .map(|r| &r.summary)
                .filter(|r| r.variant == v.name)
                .collect();
            let valid: Vec<&RunSummary> = all.iter().copied().filter(|r| r.is_valid()).collect();
            let judged = valid.len() >= MIN_VALID_RUNS;
            // A variant not judged has no figures: none of them may be read as a result.
            let runs: Vec<&RunSummary> = if judged { valid.clone() } else { Vec::new() };
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
                application: cfg.application(v).describe(&v.uri_options),
                application_overridden: cfg.app_overridden(v),
                runs: all.len(),
                invalid_runs: all.len() - valid.len(),
                valid_runs: valid.len(),
                judged,
                goodput_share: spread(&runs, |r| share(r.goodput)),
                burst_goodput_share: spread(&runs, |r| r.burst_goodput.and_then(share)),
                cold_goodput: spread(&runs, |r| r.cold_shards.map(|c| c.goodput)),
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
                throughput_ratio_pooled: (judged && primary == Primary::Throughput)
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
        has_cold_shards: cfg.shard_keys().is_some(),
        variants,
        best_upstream,
        fork_ratios,
    }
}

impl ScenarioVerdict {
    fn variant(&self, name: &str) -> Option<&VariantVerdict> {
        self.variants.iter().find(|v| v.name == name)
    }

    /// `fork`'s primary figure ÷ `upstream`'s (both judged); in `fast-path` against the ratio
    /// base, the pooled ratio.
    pub fn ratio(&self, fork: &str, upstream: &str) -> Option<f64> {
        let f = self.variant(fork)?;
        if self.primary == Primary::Throughput && upstream == RATIO_BASE {
            if let Some(p) = &f.throughput_ratio_pooled {
                return Some(p.ratio);
            }
        }
        let fv = primary_value(f, self.primary)?;
        let uv = primary_value(self.variant(upstream)?, self.primary)?;
        (uv > 0.0).then(|| fv / uv)
    }

    /// `fork`'s primary figure ÷ the best upstream's.
    pub fn ratio_to_best(&self, fork: &str) -> Option<f64> {
        let best = self.best_upstream.as_ref()?;
        self.ratio(fork, &best.variant)
    }
}

/// The dominance table of `fork` over every upstream configuration that ran.
pub fn dominance(scenarios: &[ScenarioVerdict], fork: &str) -> Dominance {
    let mut upstreams: Vec<String> = Vec::new();
    for v in scenarios.iter().flat_map(|s| &s.variants) {
        if v.driver == Driver::Upstream.to_string() && !upstreams.contains(&v.name) {
            upstreams.push(v.name.clone());
        }
    }
    let judged: Vec<&ScenarioVerdict> = scenarios
        .iter()
        .filter(|s| !is_reference_scenario(&s.name))
        .collect();
    Dominance {
        fork_variant: fork.to_string(),
        scenarios: judged.iter().map(|s| s.name.clone()).collect(),
        rows: upstreams
            .into_iter()
            .map(|u| DominanceRow {
                ratios: judged.iter().map(|s| s.ratio(fork, &u)).collect(),
                upstream: u,
            })
            .collect(),
    }
}

/// Least ratio to the best upstream, in every scenario, for the one configuration.
pub const EVERYWHERE_RATIO: f64 = 0.98;
/// Lead over each upstream configuration somewhere.
pub const SOMEWHERE_RATIO: f64 = 1.05;
/// `fork-controls`' lead in `flood`.
pub const FLOOD_RATIO: f64 = 2.0;
/// Success share the fork may lose to `upstream-default` in the transient sweep and `faults`.
pub const SUCCESS_SLACK: f64 = 0.005;
/// Least lower bound of the fast path's interval.
pub const FAST_PATH_LOW: f64 = 0.97;
/// Most driver retries per request of a fleet under sustained overload (issue 30).
pub const FLEET_RETRIES: f64 = 0.10;
/// Least cold-shard goodput in `hot-shard`, as a share of the same variant's in `even-shards`
/// (issue 30).
pub const COLD_SHARD_SHARE: f64 = 0.95;
/// Least total goodput in `hot-shard`, as a ratio to the best upstream (issue 30).
pub const HOT_SHARD_RATIO: f64 = 1.0;

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "not judged".into(), |r| format!("{r:.3} ×"))
}

/// Issue 27's checks, and issue 30's fleet check, over the scenarios that ran.
pub fn checks(scenarios: &[ScenarioVerdict], dominance: &[Dominance]) -> Vec<Check> {
    let mut out = Vec::new();
    for fork in [RECOMMENDED, CONTROLS] {
        // ≥ 0.98 × the best upstream in every scenario (a reference has no upstream).
        let parts: Vec<(String, Status)> = scenarios
            .iter()
            .filter(|s| !is_reference_scenario(&s.name))
            .map(|s| {
                let r = s.ratio_to_best(fork);
                (
                    format!("{} {}", s.name, fmt_ratio(r)),
                    Status::at_least(r, EVERYWHERE_RATIO),
                )
            })
            .collect();
        out.push(Check {
            name: format!("{fork} ≥ {EVERYWHERE_RATIO} × the best upstream in every scenario"),
            status: if parts.is_empty() {
                Status::NotJudged
            } else {
                Status::all(parts.iter().map(|p| p.1))
            },
            detail: parts
                .iter()
                .map(|p| p.0.clone())
                .collect::<Vec<_>>()
                .join("; "),
        });
        // For every upstream configuration, a scenario with ≥ 1.05 ×.
        if let Some(table) = dominance.iter().find(|d| d.fork_variant == fork) {
            let parts: Vec<(String, Status)> = table
                .rows
                .iter()
                .map(|row| {
                    let best = row
                        .ratios
                        .iter()
                        .zip(&table.scenarios)
                        .filter_map(|(r, s)| r.map(|r| (r, s)))
                        .max_by(|a, b| a.0.total_cmp(&b.0));
                    match best {
                        Some((r, s)) => (
                            format!("{}: {r:.3} × in {s}", row.upstream),
                            Status::at_least(Some(r), SOMEWHERE_RATIO),
                        ),
                        None => (format!("{}: not judged", row.upstream), Status::NotJudged),
                    }
                })
                .collect();
            out.push(Check {
                name: format!(
                    "{fork} ≥ {SOMEWHERE_RATIO} × every upstream configuration in some scenario"
                ),
                status: if parts.is_empty() {
                    Status::NotJudged
                } else {
                    Status::all(parts.iter().map(|p| p.1))
                },
                detail: parts
                    .iter()
                    .map(|p| p.0.clone())
                    .collect::<Vec<_>>()
                    .join("; "),
            });
        }
        // Success share in the transient sweep and faults.
        let parts: Vec<(String, Status)> = scenarios
            .iter()
            .filter(|s| s.name.starts_with("transient-") || s.name == "faults")
            .map(|s| {
                let share = |v: &str| {
                    let v = s.variant(v)?;
                    v.judged.then_some(v.success_share?.median)
                };
                match (share(fork), share(RATIO_BASE)) {
                    (Some(f), Some(u)) => (
                        format!("{} {:.2} % vs {:.2} %", s.name, f * 100.0, u * 100.0),
                        if f >= u - SUCCESS_SLACK {
                            Status::Met
                        } else {
                            Status::Missed
                        },
                    ),
                    _ => (format!("{} not judged", s.name), Status::NotJudged),
                }
            })
            .collect();
        out.push(Check {
            name: format!(
                "{fork}: success share ≥ {RATIO_BASE}'s − {} points in the transient sweep and faults",
                SUCCESS_SLACK * 100.0
            ),
            status: if parts.is_empty() {
                Status::NotJudged
            } else {
                Status::all(parts.iter().map(|p| p.1))
            },
            detail: if parts.is_empty() {
                "no transient-N or faults scenario ran".into()
            } else {
                parts
                    .iter()
                    .map(|p| p.0.clone())
                    .collect::<Vec<_>>()
                    .join("; ")
            },
        });
        // The fast path's interval.
        let low = scenarios
            .iter()
            .find(|s| s.name == "fast-path")
            .and_then(|s| s.variant(fork))
            .and_then(|v| v.throughput_ratio_pooled.clone());
        out.push(Check {
            name: format!("{fork}: fast-path interval's lower bound ≥ {FAST_PATH_LOW} ×"),
            status: Status::at_least(low.as_ref().map(|p| p.low), FAST_PATH_LOW),
            detail: low.map_or_else(
                || "not judged".into(),
                |p| format!("{:.3} × ({:.3}–{:.3})", p.ratio, p.low, p.high),
            ),
        });
    }
    // A fleet under sustained overload: the per-client floors must not add up to a retry
    // storm (issue 30).
    if let Some(fleet) = scenarios.iter().find(|s| s.name == "fleet-sustained") {
        for fork in [RECOMMENDED, CONTROLS] {
            let retries = fleet
                .variant(fork)
                .filter(|v| v.judged)
                .and_then(|v| v.fork_stats_per_request.as_ref())
                .map(|st| st.retries_made);
            out.push(Check {
                name: format!(
                    "{fork}: driver retries ≤ {FLEET_RETRIES} per request in fleet-sustained"
                ),
                status: match retries {
                    Some(r) if r <= FLEET_RETRIES => Status::Met,
                    Some(_) => Status::Missed,
                    None => Status::NotJudged,
                },
                detail: retries.map_or_else(|| "not judged".into(), |r| format!("{r:.3}")),
            });
        }
    }
    // A hot shard must not take the cold shards' goodput with it, nor cost total goodput
    // against upstream (issue 30).
    if scenarios
        .iter()
        .any(|s| s.name == HOT_SHARD || s.name == HOT_SHARD_REFERENCE)
    {
        out.extend(hot_shard_checks(scenarios));
    }
    let flood = scenarios
        .iter()
        .find(|s| s.name == "flood")
        .and_then(|s| s.ratio_to_best(CONTROLS));
    out.push(Check {
        name: format!("{CONTROLS} ≥ {FLOOD_RATIO} × the best upstream in flood"),
        status: Status::at_least(flood, FLOOD_RATIO),
        detail: fmt_ratio(flood),
    });
    out
}

/// Issue 30's checks of `hot-shard`, for the recommended settings and every control: its
/// cold-shard goodput ≥ [`COLD_SHARD_SHARE`] × the same variant's in `even-shards` (the
/// scenarios are paired by name; a variant not judged in either is not judged), and its total
/// goodput ≥ [`HOT_SHARD_RATIO`] × the best upstream's.
fn hot_shard_checks(scenarios: &[ScenarioVerdict]) -> Vec<Check> {
    let hot = scenarios.iter().find(|s| s.name == HOT_SHARD);
    let reference = scenarios.iter().find(|s| s.name == HOT_SHARD_REFERENCE);
    let mut out = Vec::new();
    for fork in [RECOMMENDED, CONTROLS] {
        // Judged variants only: a variant not judged has no figures.
        let cold = |s: Option<&ScenarioVerdict>| {
            s.and_then(|s| s.variant(fork))
                .and_then(|v| v.cold_goodput)
                .map(|c| c.median)
        };
        let (in_hot, in_reference) = (cold(hot), cold(reference));
        let share = match (in_hot, in_reference) {
            (Some(h), Some(r)) if r > 0.0 => Some(h / r),
            _ => None,
        };
        let not_judged = |what: Option<f64>, name: &str| {
            what.map_or_else(
                || format!("{name} not judged"),
                |x| format!("{x:.0} ops/s in {name}"),
            )
        };
        out.push(Check {
            name: format!(
                "{fork}: cold-shard goodput in {HOT_SHARD} ≥ {COLD_SHARD_SHARE} × its own in \
                 {HOT_SHARD_REFERENCE}"
            ),
            status: Status::at_least(share, COLD_SHARD_SHARE),
            detail: match share {
                Some(x) => format!(
                    "{} vs {}: {x:.3} ×",
                    not_judged(in_hot, HOT_SHARD),
                    not_judged(in_reference, HOT_SHARD_REFERENCE)
                ),
                None => format!(
                    "{}; {}",
                    not_judged(in_hot, HOT_SHARD),
                    not_judged(in_reference, HOT_SHARD_REFERENCE)
                ),
            },
        });
        let total = hot.and_then(|s| s.ratio_to_best(fork));
        out.push(Check {
            name: format!(
                "{fork} ≥ {HOT_SHARD_RATIO} × the best upstream in {HOT_SHARD} (total goodput)"
            ),
            status: Status::at_least(total, HOT_SHARD_RATIO),
            detail: fmt_ratio(total),
        });
    }
    out
}

/// The verdict of a suite; `instructions` from `lab instructions`, if given.
pub fn verdict(
    runs: &[LabRun],
    wall_secs: f64,
    instructions: Option<InstructionCounts>,
) -> Verdict {
    let scenarios: Vec<ScenarioVerdict> = runs.iter().map(scenario_verdict).collect();
    let dominance: Vec<Dominance> = [RECOMMENDED, CONTROLS]
        .into_iter()
        .map(|f| dominance(&scenarios, f))
        .collect();
    let checks = checks(&scenarios, &dominance);
    Verdict {
        schema: VERDICT_SCHEMA,
        wall_secs,
        valid: scenarios.iter().all(|s| s.valid),
        scenarios,
        dominance,
        instructions,
        checks,
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

/// The dominance tables and the checks, in markdown (also the head of a published results
/// file).
pub fn markdown_judgement(v: &Verdict) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## Checks (issues 27 and 30)\n");
    for c in &v.checks {
        let _ = writeln!(s, "- {}: {}. {}", c.name, c.status.word(), c.detail);
    }
    let _ = writeln!(s);
    for d in &v.dominance {
        let _ = writeln!(
            s,
            "## Dominance: `{}` ÷ each upstream configuration\n\nPrimary figure of each \
             scenario; `fast-path` against `{RATIO_BASE}`: the pooled ratio. – : not run or \
             not judged.\n",
            d.fork_variant
        );
        let _ = writeln!(s, "| upstream | {} |", d.scenarios.join(" | "));
        let _ = writeln!(s, "|---|{}", "---|".repeat(d.scenarios.len()));
        for row in &d.rows {
            let cells: Vec<String> = row
                .ratios
                .iter()
                .map(|r| match r {
                    Some(r) if *r >= SOMEWHERE_RATIO => format!("**{r:.3}**"),
                    Some(r) => format!("{r:.3}"),
                    None => "–".into(),
                })
                .collect();
            let _ = writeln!(s, "| {} | {} |", row.upstream, cells.join(" | "));
        }
        let _ = writeln!(s);
    }
    if let Some(ins) = &v.instructions {
        let _ = writeln!(
            s,
            "## Instructions per operation (callgrind, {} operations{})\n",
            ins.ops,
            if ins.commit.is_empty() {
                String::new()
            } else {
                format!(", {}", ins.commit)
            }
        );
        let _ = writeln!(
            s,
            "| variant | instructions per operation | ÷ {RATIO_BASE} |"
        );
        let _ = writeln!(s, "|---|---|---|");
        for c in &ins.variants {
            let _ = writeln!(
                s,
                "| {} | {:.1} k | {} |",
                c.name,
                c.per_op / 1000.0,
                c.ratio.map_or_else(|| "–".into(), |r| format!("{r:.3}"))
            );
        }
        let _ = writeln!(s);
    }
    s
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
            "**INVALID runs** are listed per scenario and left out of every figure; a variant \
             with fewer than two valid runs in a scenario is not judged there."
        }
    );
    s.push_str(&markdown_judgement(v));
    let _ = writeln!(
        s,
        "Figures: median [min–max] over the valid repetitions. Goodput and burst goodput ÷ \
         capacity; attempts and tries per request; wasted work and rejecting ÷ server core \
         time (%); recovery in seconds; success share (%) of requests offered; throughput ratio to \
         `{RATIO_BASE}` in the same repetition.\n"
    );
    for sc in &v.scenarios {
        let _ = writeln!(
            s,
            "## {}{}\n\nPhases {}, capacity {:.0} ops/s ({}), {} repetition(s), {:.0} s.\n",
            sc.name,
            if sc.valid { "" } else { " — INVALID runs" },
            sc.phases.join(" → "),
            sc.capacity,
            sc.capacity_note,
            sc.repeats,
            sc.wall_secs
        );
        // Sharded scenarios add the cold shards' goodput after the total's.
        let cold_head = if sc.has_cold_shards {
            " cold-shard ops/s |"
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "| variant | valid runs | goodput ÷ cap | burst ÷ cap | ops/s |{cold_head} attempts/req | tries/req | wasted % | rejecting % | recovery s | success % | ratio to {RATIO_BASE} | p99 ms |"
        );
        let _ = writeln!(
            s,
            "|---|---|---|---|---|{}---|---|---|---|---|---|---|---|",
            if sc.has_cold_shards { "---|" } else { "" }
        );
        for x in &sc.variants {
            let mut rec = cell(&x.recovery_secs, 0, 1.0);
            if x.not_recovered > 0 {
                rec = format!("{rec} ({} not recovered)", x.not_recovered);
            }
            let runs = if x.judged {
                format!("{}/{}", x.valid_runs, x.runs)
            } else {
                format!("{}/{}: **not judged**", x.valid_runs, x.runs)
            };
            let cold = if sc.has_cold_shards {
                format!(" {} |", cell(&x.cold_goodput, 0, 1.0))
            } else {
                String::new()
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |{} {} | {} | {} | {} | {} | {} | {} | {} |",
                x.name,
                runs,
                cell(&x.goodput_share, 2, 1.0),
                cell(&x.burst_goodput_share, 2, 1.0),
                cell(&x.throughput, 0, 1.0),
                cold,
                cell(&x.attempts_per_request, 2, 1.0),
                cell(&x.tries_per_request, 2, 1.0),
                cell(&x.wasted_share, 1, 100.0),
                cell(&x.rejection_share, 1, 100.0),
                rec,
                cell(&x.success_share, 2, 100.0),
                cell(&x.throughput_ratio, 3, 1.0),
                cell(&x.p99_ms, 1, 1.0),
            );
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "Applications:");
        for x in &sc.variants {
            let _ = writeln!(
                s,
                "- {}: {}{}",
                x.name,
                x.application,
                if x.application_overridden {
                    " (set by the scenario or the run's options, not the variant's own)"
                } else {
                    ""
                }
            );
        }
        let _ = writeln!(s);
        match &sc.best_upstream {
            Some(b) => {
                let _ = writeln!(
                    s,
                    "Best upstream by {}: **{}** ({:.4}).",
                    sc.primary.key(),
                    b.variant,
                    b.value
                );
            }
            None => {
                let _ = writeln!(s, "No judged upstream variant.");
            }
        }
        for f in &sc.fork_ratios {
            let x = sc.variant(&f.variant);
            let stats = x
                .and_then(|x| x.fork_stats_per_request)
                .map(|st| {
                    format!(
                        " Per request: driver retries {:.3} made ({:.3} refunded), {:.3} \
                         refused; application retries {:.3} made, {:.3} refused.",
                        st.retries_made,
                        st.retries_refunded,
                        st.retries_refused,
                        st.app_retries_made,
                        st.app_retries_refused
                    )
                })
                .unwrap_or_default();
            let pooled = x
                .and_then(|x| x.throughput_ratio_pooled.clone())
                .map(|p| {
                    format!(
                        " Pooled: **{:.3} × {RATIO_BASE}** (95 % interval {:.3}–{:.3} over \
                         {} repetitions and blocks of {BLOCK_SECS} s, {} paired seconds; \
                         per repetition {}).",
                        p.ratio,
                        p.low,
                        p.high,
                        p.repetitions,
                        p.pairs,
                        p.rep_ratios
                            .iter()
                            .map(|r| format!("{r:.3}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "- {}: {:.4}, {} the best upstream.{}{}",
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
pub(crate) mod tests {
    use super::*;

    fn one_rep(pairs: Vec<(u64, u64)>) -> Vec<Vec<(u64, u64)>> {
        vec![pairs]
    }

    #[test]
    fn a_pooled_ratio_is_the_ratio_of_the_sums_and_lies_in_its_interval() {
        let reps: Vec<Vec<(u64, u64)>> = (0..3)
            .map(|r| {
                (0..60)
                    .map(|i| {
                        // The machine's speed changes from pair to pair; the variant is 10 %
                        // slower.
                        let base = 4000 + ((r * 60 + i) * 7919 % 1500);
                        (base * 9 / 10, base)
                    })
                    .collect()
            })
            .collect();
        let p = PooledRatio::of(&reps).unwrap();
        assert!((p.ratio - 0.9).abs() < 1e-3, "{p:?}");
        assert!(p.low <= p.ratio && p.ratio <= p.high, "{p:?}");
        assert!(
            p.high - p.low < 0.01,
            "a constant ratio has a narrow interval: {p:?}"
        );
        assert_eq!((p.pairs, p.repetitions, p.rep_ratios.len()), (180, 3, 3));
    }

    #[test]
    fn repetitions_that_disagree_widen_the_interval() {
        // Three repetitions, each steady within, but at 0.95, 1.00 and 1.05: resampling
        // seconds as independent would give a narrow interval around 1.00.
        let reps: Vec<Vec<(u64, u64)>> = [95u64, 100, 105]
            .iter()
            .map(|pct| (0..60).map(|_| (40 * pct, 4000)).collect())
            .collect();
        let p = PooledRatio::of(&reps).unwrap();
        assert!((p.ratio - 1.0).abs() < 1e-9, "{p:?}");
        assert!(p.low <= 0.97 && p.high >= 1.03, "{p:?}");
        let same: Vec<Vec<(u64, u64)>> = (0..3)
            .map(|_| (0..60).map(|_| (4000, 4000)).collect())
            .collect();
        let q = PooledRatio::of(&same).unwrap();
        assert!(q.high - q.low < 1e-9, "{q:?}");
    }

    #[test]
    fn no_pairs_or_no_base_requests_give_no_ratio() {
        assert_eq!(PooledRatio::of(&[]), None);
        assert_eq!(PooledRatio::of(&one_rep(vec![(10, 0), (5, 0)])), None);
    }

    /// A run of `scenario` where each `(variant, goodput, valid)` is one repetition's run
    /// (repetitions numbered per variant), at capacity 1 so that goodput is the share.
    pub(crate) fn lab_run(scenario: &str, runs: &[(&str, f64, bool)]) -> LabRun {
        use super::super::config::{LabConfig, Scenario, Variant};
        use super::super::metrics::Second;
        use super::super::runner::VariantRun;
        let mut cfg = LabConfig {
            scenario: Scenario::steady(scenario, "p", 2.0, 1.0),
            variants: Vec::new(),
            ..LabConfig::default()
        };
        let mut out = Vec::new();
        for (name, goodput, valid) in runs {
            let variant = Variant::parse(name).expect("built-in");
            if !cfg.variants.contains(&variant) {
                cfg.variants.push(variant.clone());
            }
            let rep = out
                .iter()
                .filter(|r: &&VariantRun| r.variant.name == *name)
                .count();
            let mut summary = super::super::summary::summarize(
                &variant,
                rep,
                &[Second::default()],
                &cfg.scenario,
                1,
                Default::default(),
                None,
                None,
                std::time::Duration::from_millis(5),
            );
            summary.goodput = *goodput;
            if !valid {
                summary.invalid_why = vec!["schedule lag".into()];
            }
            // Paired seconds for `fast-path`'s pooled ratio: goodput requests in each.
            let seconds = (0..4)
                .map(|_| Second {
                    good: *goodput as u64,
                    ..Second::default()
                })
                .collect();
            out.push(VariantRun {
                variant,
                rep,
                seconds,
                summary,
            });
        }
        LabRun {
            config: cfg,
            capacity: 1.0,
            capacity_note: "given".into(),
            model_config: None,
            uri: String::new(),
            runs: out,
            wall: std::time::Duration::ZERO,
        }
    }

    /// A sharded run: each `(variant, total goodput, cold-shard goodput, valid)`.
    fn sharded_run(scenario: &str, runs: &[(&str, f64, f64, bool)]) -> LabRun {
        let plain: Vec<(&str, f64, bool)> = runs.iter().map(|r| (r.0, r.1, r.3)).collect();
        let mut run = lab_run(scenario, &plain);
        run.config.persona = super::super::config::Persona::Sharded;
        for (r, (_, _, cold, _)) in run.runs.iter_mut().zip(runs) {
            r.summary.cold_shards = Some(super::super::summary::ColdShards {
                offered: 0,
                good: 0,
                goodput: *cold,
            });
        }
        run
    }

    #[test]
    fn hot_shard_is_judged_on_cold_goodput_against_its_reference_and_total_against_upstream() {
        let status = |v: &Verdict, fork: &str, what: &str| {
            v.checks
                .iter()
                .find(|c| c.name.starts_with(&format!("{fork}:")) && c.name.contains(what))
                .or_else(|| {
                    v.checks
                        .iter()
                        .find(|c| c.name.starts_with(fork) && c.name.contains(what))
                })
                .map(|c| c.status)
        };
        let hot = sharded_run(
            HOT_SHARD,
            &[
                ("upstream-best", 100.0, 50.0, true),
                ("upstream-best", 100.0, 50.0, true),
                // Met: 96 of 100 cold; total 1.1 × upstream.
                ("fork-recommended", 110.0, 96.0, true),
                ("fork-recommended", 110.0, 96.0, true),
                // Missed: 90 of 100 cold (total 1.0 × upstream: met, at the bound).
                ("fork-controls", 100.0, 90.0, true),
                ("fork-controls", 100.0, 90.0, true),
            ],
        );
        let reference = sharded_run(
            HOT_SHARD_REFERENCE,
            &[
                ("fork-recommended", 300.0, 100.0, true),
                ("fork-recommended", 300.0, 100.0, true),
                ("fork-controls", 300.0, 100.0, true),
                ("fork-controls", 300.0, 100.0, true),
            ],
        );
        let v = verdict(&[hot.clone(), reference.clone()], 1.0, None);
        assert_eq!(status(&v, RECOMMENDED, "cold-shard"), Some(Status::Met));
        assert_eq!(status(&v, CONTROLS, "cold-shard"), Some(Status::Missed));
        assert_eq!(
            status(&v, RECOMMENDED, "(total goodput)"),
            Some(Status::Met)
        );
        assert_eq!(status(&v, CONTROLS, "(total goodput)"), Some(Status::Met));
        // The reference has no upstream: it is in neither the check of every scenario nor
        // the dominance tables.
        assert_eq!(status(&v, RECOMMENDED, "every scenario"), Some(Status::Met));
        assert!(v
            .dominance
            .iter()
            .all(|d| !d.scenarios.iter().any(|s| s == HOT_SHARD_REFERENCE)));
        assert!(v.scenarios.iter().all(|s| s.has_cold_shards));
        assert!(markdown(&v).contains("cold-shard ops/s"));

        // Without the reference, or with its runs invalid, the cold-shard check is not judged.
        let v = verdict(std::slice::from_ref(&hot), 1.0, None);
        assert_eq!(
            status(&v, RECOMMENDED, "cold-shard"),
            Some(Status::NotJudged)
        );
        let mut invalid = reference.clone();
        for r in &mut invalid.runs {
            r.summary.invalid_why = vec!["schedule lag".into()];
        }
        let v = verdict(&[hot.clone(), invalid], 1.0, None);
        assert_eq!(
            status(&v, RECOMMENDED, "cold-shard"),
            Some(Status::NotJudged)
        );
        // A total below the best upstream's misses.
        let behind = sharded_run(
            HOT_SHARD,
            &[
                ("upstream-best", 100.0, 50.0, true),
                ("upstream-best", 100.0, 50.0, true),
                ("fork-recommended", 99.0, 96.0, true),
                ("fork-recommended", 99.0, 96.0, true),
            ],
        );
        let v = verdict(&[behind, reference], 1.0, None);
        assert_eq!(
            status(&v, RECOMMENDED, "(total goodput)"),
            Some(Status::Missed)
        );
        // Suites without either scenario get no such check.
        let v = verdict(
            &[lab_run("sustained", &[("upstream-best", 1.0, true)])],
            1.0,
            None,
        );
        assert!(v.checks.iter().all(|c| !c.name.contains(HOT_SHARD)));
    }

    #[test]
    fn invalid_runs_count_for_nothing_and_one_valid_run_is_not_judged() {
        let run = lab_run(
            "sustained",
            &[
                ("upstream-best", 0.5, true),
                ("upstream-best", 0.5, true),
                // An invalid run that would have made upstream look better.
                ("upstream-best", 0.9, false),
                ("fork-recommended", 0.6, true),
                ("fork-recommended", 0.6, true),
                ("fork-recommended", 0.1, false),
                ("fork-controls", 0.9, true),
                ("fork-controls", 0.9, false),
                ("fork-controls", 0.9, false),
            ],
        );
        let sv = scenario_verdict(&run);
        assert!(!sv.valid);
        assert_eq!(sv.invalid_runs.len(), 4);
        let best = sv.best_upstream.clone().expect("a best upstream");
        assert_eq!((best.variant.as_str(), best.value), ("upstream-best", 0.5));
        let ratio = sv.ratio_to_best(RECOMMENDED).expect("judged");
        assert!((ratio - 1.2).abs() < 1e-9, "{ratio}");
        let controls = sv.variant(CONTROLS).expect("ran");
        assert!(!controls.judged && controls.goodput_share.is_none());
        assert_eq!((controls.valid_runs, controls.runs), (1, 3));
        assert!(sv.fork_ratios.iter().all(|f| f.variant != CONTROLS));
        let v = verdict(&[run], 1.0, None);
        let check = |name: &str| {
            v.checks
                .iter()
                .find(|c| c.name.starts_with(name) && c.name.contains("every scenario"))
                .map(|c| c.status)
        };
        assert_eq!(check(RECOMMENDED), Some(Status::Met));
        assert_eq!(check(CONTROLS), Some(Status::NotJudged));
        // The dominance row of the only upstream configuration: 1.2, and 1.2 ≥ 1.05.
        let table = &v.dominance[0];
        assert_eq!(table.rows.len(), 1);
        assert_eq!(table.rows[0].upstream, "upstream-best");
        let somewhere = v
            .checks
            .iter()
            .find(|c| c.name.starts_with(RECOMMENDED) && c.name.contains("some scenario"))
            .expect("the check");
        assert_eq!(somewhere.status, Status::Met);
    }

    #[test]
    fn the_fast_path_is_judged_on_its_pooled_interval_over_valid_pairs() {
        let run = lab_run(
            "fast-path",
            &[
                ("upstream-default", 1000.0, true),
                ("fork-recommended", 990.0, true),
                ("upstream-default", 1000.0, true),
                ("fork-recommended", 1010.0, true),
                // An invalid repetition of the base takes its pair out of the ratio.
                ("upstream-default", 100.0, false),
                ("fork-recommended", 1000.0, true),
            ],
        );
        let sv = scenario_verdict(&run);
        assert_eq!(sv.primary, Primary::Throughput);
        let p = sv
            .variant(RECOMMENDED)
            .and_then(|v| v.throughput_ratio_pooled.clone())
            .expect("a pooled ratio");
        assert_eq!((p.repetitions, p.pairs), (2, 8));
        assert!((p.ratio - 1.0).abs() < 1e-9, "{p:?}");
        assert!(p.low <= 0.99 && p.high >= 1.01 && p.low >= 0.98, "{p:?}");
        assert_eq!(sv.ratio(RECOMMENDED, RATIO_BASE), Some(p.ratio));
        let v = verdict(&[run], 1.0, None);
        let check = v
            .checks
            .iter()
            .find(|c| c.name.starts_with(RECOMMENDED) && c.name.contains("fast-path"))
            .expect("the fast-path check");
        assert_eq!(check.status, Status::Met, "{check:?}");
    }

    #[test]
    fn a_missed_target_is_reported_missed() {
        let run = lab_run(
            "flood",
            &[
                ("upstream-best", 0.4, true),
                ("upstream-best", 0.4, true),
                ("fork-controls", 0.6, true),
                ("fork-controls", 0.6, true),
            ],
        );
        let v = verdict(&[run], 1.0, None);
        let flood = v
            .checks
            .iter()
            .find(|c| c.name.contains("in flood"))
            .expect("flood check");
        assert_eq!(flood.status, Status::Missed, "{flood:?}");
        assert!(markdown(&v).contains("**missed**"));
    }

    #[test]
    fn statuses_combine_missed_over_not_judged_over_met() {
        use Status::*;
        assert_eq!(Status::all([Met, Met]), Met);
        assert_eq!(Status::all([Met, NotJudged]), NotJudged);
        assert_eq!(Status::all([NotJudged, Missed, Met]), Missed);
        assert_eq!(Status::at_least(Some(0.98), 0.98), Met);
        assert_eq!(Status::at_least(Some(0.97), 0.98), Missed);
        assert_eq!(Status::at_least(None, 0.98), NotJudged);
    }

    #[test]
    fn instruction_ratios_are_to_upstream_default() {
        let mut c = InstructionCounts {
            ops: 10_000,
            commit: String::new(),
            variants: vec![
                InstructionCount {
                    name: "fork-default".into(),
                    per_op: 130_000.0,
                    ratio: None,
                },
                InstructionCount {
                    name: RATIO_BASE.into(),
                    per_op: 130_000.0 / 0.9,
                    ratio: None,
                },
            ],
        };
        c.fill_ratios();
        assert!((c.variants[0].ratio.unwrap() - 0.9).abs() < 1e-9);
        assert_eq!(c.variants[1].ratio, Some(1.0));
    }
}
