//! The lab's published four-instance figures the simulator is compared with, and the
//! comparison (`sim --compare-lab`).
//!
//! Each figure is the median of a suite's valid runs as its results file prints it (two
//! significant digits for goodput), from the suite of 2026-12-03 18:29 or, where that suite
//! left a variant not judged, the one before it (18:01). Their files,
//! `docs/results/2026-12-03-1829-suite.md` and `-1801-suite.md`, are in the git history of
//! `docs/results/` (`git show 78af4c2:docs/results/2026-12-03-1829-suite.md`). Each lab run calibrated its own capacity; the simulator runs each
//! comparison twice: at that capacity (load and limiter in the lab's ops/s, the model's cores
//! as modelled: their costs and the hand-off per slice) and at the model's nominal capacity
//! (every rate relative to what the model's cores complete).

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use crate::replay::LabSchedule;
use crate::scenario::{Length, ScenarioName};
use crate::variant::Variant;

/// One lab row: the medians of a variant in a scenario.
#[derive(Clone, Debug)]
pub struct LabRow {
    pub scenario: ScenarioName,
    /// The lab's name of the scenario (`fleet-sustained` runs the simulator's `sustained`).
    pub lab_scenario: Cow<'static, str>,
    pub variant: Variant,
    /// The suite it comes from (`docs/results/<suite>-suite.md`, or a `verdict.json` path).
    pub suite: Cow<'static, str>,
    /// The lab's instances (one client each).
    pub instances: u32,
    /// The capacity that suite calibrated for the scenario (ops/s).
    pub capacity: f64,
    pub goodput_share: f64,
    /// `burst ÷ cap` (burst only).
    pub burst_share: Option<f64>,
    pub attempts_per_request: f64,
    /// Core time spent rejecting (%).
    pub rejecting_pct: f64,
    /// Core time wasted (%).
    pub wasted_pct: f64,
    /// Requests that succeeded (%), `transient`'s figure (from a suite's `transient-30`).
    pub success_pct: Option<f64>,
    /// Cold-shard goodput (ops/s), the sharded scenarios' figure.
    pub cold_goodput: Option<f64>,
    /// The ingress limiter's rate as a share of capacity, where the lab's scenario sets its
    /// own (`no-limiter`: 0); `None`: the run's (`--limiter-share`, the lab's 0.9).
    pub limiter_share: Option<f64>,
    /// How the lab drew the scenario's arrivals (from a suite's `summary.json`), to replay
    /// them; `None` for the built-in figures, which the simulator meets with its own draws.
    pub schedule: Option<Arc<LabSchedule>>,
    /// The lab repetitions the figures are the median of (its valid runs), each replayed once.
    pub repetitions: Vec<usize>,
    /// The schedule length the lab ran: the suite's for the built-in figures; for a suite's
    /// rows, the one whose phases are its `summary.json`'s (`lab run --suite --quick` or
    /// `--long` runs the suite's variants at other lengths).
    pub length: Length,
    /// A sharded suite row's cluster as the lab ran it (`summary.json`'s `config.sharding`),
    /// which its replays run on instead of the scenario's own.
    pub cluster: Option<crate::scenario::Cluster>,
}

const fn row(
    scenario: ScenarioName,
    variant: Variant,
    suite: &'static str,
    capacity: f64,
    figures: (f64, Option<f64>, f64, f64, f64),
) -> LabRow {
    LabRow {
        scenario,
        lab_scenario: Cow::Borrowed(scenario.name()),
        variant,
        suite: Cow::Borrowed(suite),
        instances: 4,
        capacity,
        goodput_share: figures.0,
        burst_share: figures.1,
        attempts_per_request: figures.2,
        rejecting_pct: figures.3,
        wasted_pct: figures.4,
        success_pct: None,
        cold_goodput: None,
        limiter_share: None,
        schedule: None,
        repetitions: Vec::new(),
        length: LENGTH,
        cluster: None,
    }
}

/// The lab's figures: (goodput ÷ cap, burst ÷ cap, attempts/req, rejecting %, wasted %).
pub const LAB: [LabRow; 16] = {
    use ScenarioName::{Burst, Flood, Sustained};
    use Variant::*;
    const A: &str = "2026-12-03-1829";
    const B: &str = "2026-12-03-1801";
    [
        row(
            Burst,
            UpstreamBest,
            B,
            789.0,
            (0.69, Some(0.88), 1.13, 4.7, 7.9),
        ),
        row(
            Burst,
            UpstreamBestNoRetries,
            A,
            687.0,
            (0.72, Some(0.92), 1.00, 2.9, 4.0),
        ),
        row(
            Burst,
            ForkBudgetTimeout,
            A,
            687.0,
            (0.71, Some(0.93), 1.13, 4.6, 5.7),
        ),
        row(
            Burst,
            ForkControls,
            A,
            687.0,
            (0.73, Some(0.95), 1.11, 4.4, 5.0),
        ),
        row(
            Sustained,
            UpstreamNoRetries,
            B,
            769.0,
            (0.35, None, 1.00, 12.1, 66.3),
        ),
        row(
            Sustained,
            UpstreamMaxtime,
            A,
            784.0,
            (0.13, None, 2.38, 46.6, 86.1),
        ),
        row(
            Sustained,
            UpstreamBest,
            B,
            769.0,
            (0.64, None, 1.30, 19.9, 37.4),
        ),
        row(
            Sustained,
            UpstreamBestNoRetries,
            B,
            769.0,
            (0.86, None, 1.00, 12.8, 15.9),
        ),
        row(
            Sustained,
            ForkBudgetTimeout,
            B,
            769.0,
            (0.79, None, 1.15, 16.2, 23.1),
        ),
        row(
            Sustained,
            ForkControls,
            A,
            784.0,
            (0.88, None, 0.86, 9.2, 13.6),
        ),
        row(
            Flood,
            UpstreamBest,
            A,
            381.0,
            (0.04, None, 1.03, 55.6, 96.0),
        ),
        row(
            Flood,
            UpstreamBestNoRetries,
            A,
            381.0,
            (0.06, None, 1.00, 53.5, 93.7),
        ),
        row(
            Flood,
            ForkBudgetTimeout,
            A,
            381.0,
            (0.05, None, 1.00, 53.9, 95.3),
        ),
        row(
            Flood,
            ForkControls,
            A,
            381.0,
            (0.74, None, 0.39, 11.6, 30.3),
        ),
        // The suite before: fork-controls' flood and burst in another calibration, as a check
        // on how much the lab itself moves between suites.
        row(
            Flood,
            ForkControls,
            "2026-12-03-1612",
            363.0,
            (0.79, None, 0.42, 13.4, 25.6),
        ),
        row(
            Burst,
            ForkControls,
            "2026-12-03-1612",
            776.0,
            (0.72, Some(0.94), 0.98, 2.5, 3.8),
        ),
    ]
};

/// The lab's schedule length of the suite.
pub const LENGTH: Length = Length::Suite;

/// Every length the lab runs.
const LENGTHS: [Length; 4] = [Length::Suite, Length::Quick, Length::Default, Length::Long];

/// Relative difference of `sim` from `lab` (0.1 = 10 %); `None` when the lab's figure is 0.
pub fn relative(sim: f64, lab: f64) -> Option<f64> {
    (lab != 0.0).then(|| (sim - lab) / lab)
}

/// The lab's scenario a suite scenario runs in the simulator, its instances, and its limiter
/// share if it sets one: `burst`, `sustained`, `flood`, `hot-shard` and `even-shards` as
/// themselves, `transient-30` as `transient`, `no-limiter` as `burst` without the limiter, the
/// `fleet-*` scenarios as their four-instance namesakes at 64 instances; `None` for scenarios
/// the simulator does not model.
fn simulated(name: &str) -> Option<(ScenarioName, u32, Option<f64>)> {
    let (base, instances, limiter_share) = match name.strip_prefix("fleet-") {
        Some(base) => (base, 64, None),
        None if name == "transient-30" => (ScenarioName::Transient.name(), 4, None),
        None if name == "no-limiter" => (ScenarioName::Burst.name(), 4, Some(0.0)),
        None => (name, 4, None),
    };
    let scenario = ScenarioName::ALL
        .into_iter()
        .chain(ScenarioName::SHARDED)
        .find(|s| s.name() == base)?;
    Some((scenario, instances, limiter_share))
}

/// The rows of a lab suite's `verdict.json` the simulator can compare with: every judged
/// variant it models in `burst`, `sustained`, `flood`, `transient-30`, `no-limiter`,
/// `hot-shard`, `even-shards` and the `fleet-*` scenarios.
/// `instances` overrides the scenario's own count (a suite run with `--instances N`, which
/// `verdict.json` does not record); `source` names the file in the rows.
///
/// # Errors
///
/// A message when the text is not a verdict (not JSON, or a scenario without its capacity).
pub fn from_verdict(
    json: &str,
    instances: Option<u32>,
    source: &str,
) -> Result<Vec<LabRow>, String> {
    let verdict: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("{source}: not a verdict.json: {e}"))?;
    let scenarios = verdict["scenarios"]
        .as_array()
        .ok_or_else(|| format!("{source}: no \"scenarios\" array"))?;
    let median = |v: &serde_json::Value, key: &str| v[key]["median"].as_f64();
    let mut rows = Vec::new();
    for s in scenarios {
        let name = s["name"].as_str().unwrap_or_default();
        let Some((scenario, own_instances, limiter_share)) = simulated(name) else {
            continue;
        };
        let capacity = s["capacity"]
            .as_f64()
            .ok_or_else(|| format!("{source}: scenario {name:?} has no capacity"))?;
        for v in s["variants"].as_array().into_iter().flatten() {
            let judged = v["judged"].as_bool() == Some(true);
            let variant = v["name"]
                .as_str()
                .and_then(|n| Variant::parse_list(n).ok())
                .and_then(|list| list.first().copied());
            let (Some(variant), true) = (variant, judged) else {
                continue;
            };
            let (Some(goodput), Some(attempts)) =
                (median(v, "goodputShare"), median(v, "attemptsPerRequest"))
            else {
                continue;
            };
            rows.push(LabRow {
                scenario,
                lab_scenario: Cow::Owned(name.to_owned()),
                variant,
                suite: Cow::Owned(format!("{source} ({name})")),
                instances: instances.unwrap_or(own_instances),
                capacity,
                goodput_share: goodput,
                burst_share: (scenario == ScenarioName::Burst)
                    .then(|| median(v, "burstGoodputShare"))
                    .flatten(),
                attempts_per_request: attempts,
                rejecting_pct: 100.0 * median(v, "rejectionShare").unwrap_or(0.0),
                wasted_pct: 100.0 * median(v, "wastedShare").unwrap_or(0.0),
                success_pct: (scenario == ScenarioName::Transient)
                    .then(|| median(v, "successShare").map(|s| 100.0 * s))
                    .flatten(),
                cold_goodput: ScenarioName::SHARDED
                    .contains(&scenario)
                    .then(|| median(v, "coldGoodput"))
                    .flatten(),
                limiter_share,
                schedule: None,
                repetitions: Vec::new(),
                length: LENGTH,
                cluster: None,
            });
        }
    }
    Ok(rows)
}

/// The rows of a lab suite (`from_verdict` on `<suite>/verdict.json`), each with the lab's
/// schedules to replay: `<suite>/<scenario>/summary.json`, which records the seed, instances,
/// mix and capacity the lab drew them with, and which runs were valid. `instances`, when given,
/// must be what the summaries record.
///
/// # Errors
///
/// A message when a file cannot be read or the verdict and a summary disagree.
pub fn from_suite(verdict: &Path, instances: Option<u32>) -> Result<Vec<LabRow>, String> {
    let source = verdict.display().to_string();
    let text = std::fs::read_to_string(verdict).map_err(|e| format!("{source}: {e}"))?;
    let mut rows = from_verdict(&text, instances, &source)?;
    let suite = verdict.parent().unwrap_or(Path::new("."));
    let mut schedules: Vec<(String, Arc<LabSchedule>)> = Vec::new();
    for row in &mut rows {
        let known = schedules.iter().find(|(name, _)| *name == row.lab_scenario);
        let schedule = match known {
            Some((_, s)) => s.clone(),
            None => {
                let path = suite.join(row.lab_scenario.as_ref()).join("summary.json");
                let shown = path.display().to_string();
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    format!("{shown}: {e} (the comparison replays the lab's own schedules)")
                })?;
                let s = Arc::new(LabSchedule::from_summary(&text, &shown)?);
                schedules.push((row.lab_scenario.to_string(), s.clone()));
                s
            }
        };
        attach(row, schedule, instances)?;
    }
    Ok(rows)
}

/// Gives `row` the lab's schedule of its scenario, after checking that the two describe the
/// same runs.
fn attach(
    row: &mut LabRow,
    schedule: Arc<LabSchedule>,
    instances: Option<u32>,
) -> Result<(), String> {
    let name = &row.lab_scenario;
    if (schedule.capacity - row.capacity).abs() > 1e-6 {
        return Err(format!(
            "{name}: the verdict's capacity {} is not the summary's {}",
            row.capacity, schedule.capacity
        ));
    }
    let recorded = schedule.instances as u32;
    if instances.is_some_and(|n| n != recorded) {
        return Err(format!(
            "{name}: --lab-instances {} but the lab ran {recorded} instances (summary.json)",
            instances.unwrap_or_default()
        ));
    }
    let same_phases =
        |length: Length| {
            let simulated = row.scenario.build(length, None);
            simulated.phases.len() == schedule.phases.len()
                && simulated.phases.iter().zip(&schedule.phases).all(|(s, l)| {
                    s.load == l.load && (s.secs - l.duration.as_secs_f64()).abs() < 1e-9
                })
        };
    let Some(length) = LENGTHS.into_iter().find(|l| same_phases(*l)) else {
        return Err(format!(
            "{name}: the lab's phases are not the simulator's {} at any of the lab's lengths",
            row.scenario.name()
        ));
    };
    row.length = length;
    let model = row.scenario.build(length, None);
    if !same_mix(&model.mix, &schedule.mix) {
        return Err(format!(
            "{name}: the lab ran another operation mix than the model's {} ({:?})",
            row.scenario.name(),
            schedule.mix
        ));
    }
    // A sharded run is replayed on the lab's own cluster (its layout, keys and routers'
    // settings), which must be the same kind as the model's scenario: with a hot shard for
    // `hot-shard`, without for `even-shards`.
    row.cluster = match (&model.cluster, schedule.sharding) {
        (None, None) => None,
        (Some(model), Some(lab)) if model.hot_share.is_some() == lab.hot_share.is_some() => {
            let cluster = lab.cluster(schedule.docs, schedule.mix.range_len);
            cluster
                .validate()
                .map_err(|e| format!("{name}: the lab's cluster: {e}"))?;
            Some(cluster)
        }
        (model, lab) => {
            return Err(format!(
                "{name}: the lab's cluster {lab:?} is not of the model's {} ({model:?})",
                row.scenario.name()
            ))
        }
    };
    row.repetitions = schedule.valid_repetitions(row.variant.name());
    if row.repetitions.is_empty() {
        return Err(format!(
            "{name}: the verdict judges {} but summary.json has no valid run of it",
            row.variant.name()
        ));
    }
    row.instances = recorded;
    row.schedule = Some(schedule);
    Ok(())
}

/// Whether the model's mix and the lab's draw the same kinds in the same shares (the lab's
/// weights need not add up to 1).
fn same_mix(model: &[(crate::server::OpKind, f64); 4], lab: &arrivals::OpMix) -> bool {
    use crate::server::OpKind;
    let total = lab.point + lab.range + lab.insert + lab.update;
    total > 0.0
        && model.iter().all(|&(kind, share)| {
            let weight = match kind {
                OpKind::PointRead => lab.point,
                OpKind::RangeRead => lab.range,
                OpKind::Insert => lab.insert,
                OpKind::Update => lab.update,
            };
            (weight / total - share).abs() < 1e-9
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `burst` suite row and a summary whose phases are `burst`'s at `secs`.
    fn burst_at(secs: [f64; 3]) -> (LabRow, Arc<LabSchedule>) {
        let json = format!(
            r#"{{"config": {{
                "scenario": {{"name": "burst", "phases": [
                    {{"name": "base", "load": 0.5, "duration": {}}},
                    {{"name": "burst", "load": 1.3, "duration": {}}},
                    {{"name": "after", "load": 0.5, "duration": {}}}]}},
                "arrivals": "poisson", "instances": 4, "docs": 1000, "seed": 4,
                "mix": {{"point": 80.0, "range": 10.0, "insert": 5.0, "update": 5.0,
                        "range_len": 20}}}},
              "capacity": 800.0,
              "runs": [{{"variant": "upstream-best", "rep": 0, "offered": 1, "invalid": false}}]
            }}"#,
            secs[0], secs[1], secs[2]
        );
        let schedule = LabSchedule::from_summary(&json, "summary.json").expect("a summary");
        let mut row = LAB
            .iter()
            .find(|r| r.scenario == ScenarioName::Burst && r.variant == Variant::UpstreamBest)
            .expect("a burst row")
            .clone();
        row.capacity = 800.0;
        (row, Arc::new(schedule))
    }

    #[test]
    fn a_suite_run_at_another_length_is_replayed_at_that_length() {
        let (mut row, schedule) = burst_at([2.0, 6.0, 4.0]);
        attach(&mut row, schedule, None).expect("the lab's quick burst");
        assert_eq!(row.length, Length::Quick);
        assert_eq!(row.repetitions, [0]);
        let (mut row, schedule) = burst_at([10.0, 15.0, 20.0]);
        attach(&mut row, schedule, None).expect("the lab's long burst");
        assert_eq!(row.length, Length::Long);
        let (mut row, schedule) = burst_at([1.0, 5.0, 3.0]);
        let err = attach(&mut row, schedule, None).expect_err("no lab length");
        assert!(err.contains("any of the lab's lengths"), "{err}");
    }

    #[test]
    fn the_labs_transient_30_is_the_models_transient_at_the_labs_lengths() {
        let at = |secs: f64| {
            let json = format!(
                r#"{{"config": {{
                    "scenario": {{"name": "transient-30", "phases": [
                        {{"name": "base", "load": 0.5, "duration": {secs}}}]}},
                    "arrivals": "poisson", "instances": 4, "docs": 1000, "seed": 4,
                    "mix": {{"point": 80.0, "range": 10.0, "insert": 5.0, "update": 5.0,
                            "range_len": 20}}}},
                  "capacity": 690.0,
                  "runs": [{{"variant": "fork-recommended", "rep": 0, "offered": 1,
                             "invalid": false}}]
                }}"#
            );
            let schedule = LabSchedule::from_summary(&json, "summary.json").expect("a summary");
            let verdict = r#"{"scenarios": [{"name": "transient-30", "capacity": 690.0,
                "variants": [{"name": "fork-recommended", "judged": true,
                "goodputShare": {"median": 0.49}, "attemptsPerRequest": {"median": 1.4},
                "successShare": {"median": 0.97}}]}]}"#;
            let mut rows = from_verdict(verdict, None, "v.json").expect("a verdict");
            let mut row = rows.remove(0);
            attach(&mut row, Arc::new(schedule), None).map(|()| row.length)
        };
        // The suite runs the sweep for 3 s, the other lengths as long as `sustained`.
        assert_eq!(at(3.0), Ok(Length::Suite));
        assert_eq!(at(20.0), Ok(Length::Default));
        assert!(at(5.0).is_err());
    }

    #[test]
    fn the_labs_hot_shard_is_replayed_on_the_models_cluster_and_no_other() {
        let at = |persona: &str, routers: u32, point: f64| {
            let json = format!(
                r#"{{"config": {{
                    "scenario": {{"name": "hot-shard", "phases": [
                        {{"name": "hot", "load": 1.5, "duration": 5.0}}]}},
                    "arrivals": "poisson", "instances": 4, "docs": 1000, "seed": 4,
                    "persona": "{persona}",
                    "sharding": {{"routers": {routers}, "shards": 3, "hotIndex": 1,
                                 "hotShare": 0.3333333333333333}},
                    "mix": {{"point": {point}, "range": 10.0, "insert": 0.0, "update": 0.0,
                            "range_len": 20}}}},
                  "capacity": 652.0,
                  "runs": [{{"variant": "fork-controls", "rep": 0, "offered": 1,
                             "invalid": false}}]
                }}"#
            );
            let schedule = LabSchedule::from_summary(&json, "summary.json").expect("a summary");
            let verdict = r#"{"scenarios": [{"name": "hot-shard", "capacity": 652.0,
                "variants": [{"name": "fork-controls", "judged": true,
                "goodputShare": {"median": 1.31}, "attemptsPerRequest": {"median": 1.0},
                "coldGoodput": {"median": 653.2}}]}]}"#;
            let mut rows = from_verdict(verdict, None, "v.json").expect("a verdict");
            let mut row = rows.remove(0);
            assert_eq!(row.scenario, ScenarioName::HotShard);
            assert_eq!(row.cold_goodput, Some(653.2));
            attach(&mut row, Arc::new(schedule), None).map(|()| row.cluster.expect("a cluster"))
        };
        let lab = at("sharded", 3, 90.0).expect("the lab's hot-shard");
        assert_eq!(lab, crate::scenario::Cluster::lab(Some(1.0 / 3.0)));
        // Another layout is replayed as the lab ran it; no cluster at all, one the model cannot
        // run, or another mix is refused.
        assert_eq!(at("sharded", 2, 90.0).expect("two routers").routers, 2);
        assert!(at("sharded", 0, 90.0).unwrap_err().contains("routers"));
        assert!(at("replicaset", 3, 90.0).unwrap_err().contains("cluster"));
        assert!(at("sharded", 3, 80.0).unwrap_err().contains("mix"));
    }

    #[test]
    fn a_verdict_gives_the_judged_rows_of_the_modelled_scenarios() {
        let json = r#"{"scenarios": [
            {"name": "fleet-sustained", "capacity": 700.0, "variants": [
                {"name": "fork-controls", "judged": true,
                 "goodputShare": {"median": 0.8}, "attemptsPerRequest": {"median": 0.9},
                 "rejectionShare": {"median": 0.1}, "wastedShare": {"median": 0.2}},
                {"name": "upstream-best", "judged": false}]},
            {"name": "burst", "capacity": 720.0, "variants": [
                {"name": "upstream-best", "judged": true,
                 "goodputShare": {"median": 0.7}, "burstGoodputShare": {"median": 0.9},
                 "attemptsPerRequest": {"median": 1.1}}]},
            {"name": "faults", "capacity": 680.0, "variants": []},
            {"name": "transient-30", "capacity": 690.0, "variants": [
                {"name": "fork-recommended", "judged": true,
                 "goodputShare": {"median": 0.49}, "attemptsPerRequest": {"median": 1.4},
                 "successShare": {"median": 0.97}}]},
            {"name": "transient-15", "capacity": 690.0, "variants": [
                {"name": "fork-recommended", "judged": true,
                 "goodputShare": {"median": 0.49}, "attemptsPerRequest": {"median": 1.2}}]},
            {"name": "no-limiter", "capacity": 700.0, "variants": [
                {"name": "upstream-default", "judged": true,
                 "goodputShare": {"median": 0.26}, "burstGoodputShare": {"median": 0.23},
                 "attemptsPerRequest": {"median": 1.0}}]}
        ]}"#;
        let rows = from_verdict(json, None, "v.json").expect("a verdict");
        assert_eq!(rows.len(), 4, "{rows:?}");
        // `no-limiter` is `burst` with the limiter off; the others keep the run's limiter.
        assert_eq!(rows[3].scenario, ScenarioName::Burst);
        assert_eq!(rows[3].lab_scenario, "no-limiter");
        assert_eq!(rows[3].limiter_share, Some(0.0));
        assert_eq!(rows[3].burst_share, Some(0.23));
        assert!(rows[..3].iter().all(|r| r.limiter_share.is_none()));
        // The simulator's `transient` is the lab's `transient-30`, with its success share;
        // other shares of the sweep are not modelled.
        assert_eq!(rows[2].scenario, ScenarioName::Transient);
        assert_eq!(rows[2].lab_scenario, "transient-30");
        assert_eq!(rows[2].success_pct.map(|s| s.round()), Some(97.0));
        assert_eq!(rows[0].success_pct, None);
        assert_eq!(rows[0].scenario, ScenarioName::Sustained);
        assert_eq!(rows[0].instances, 64);
        assert_eq!(rows[0].variant, Variant::ForkControls);
        assert!((rows[0].rejecting_pct - 10.0).abs() < 1e-9);
        assert_eq!(rows[0].burst_share, None);
        assert_eq!(rows[1].instances, 4);
        assert_eq!(rows[1].burst_share, Some(0.9));
        let sixteen = from_verdict(json, Some(16), "v.json").expect("a verdict");
        assert!(sixteen.iter().all(|r| r.instances == 16));
        assert!(from_verdict("{}", None, "v.json").is_err());
        assert!(from_verdict("not json", None, "v.json").is_err());
    }
}
