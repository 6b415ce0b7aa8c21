//! The judged verdict (issue 55, "A judged verdict"): every scenario at a number of repetitions
//! declared before the run (at least [`MIN_REPETITIONS`]), each fork variant compared with the
//! best upstream configuration of the scenario by **paired** ratios.
//!
//! Why paired: repetition `r` of every variant draws its arrivals, keys and the server's random
//! rejections from the same seed (`arrivals::repetition_seed`), so the fork's run and
//! upstream's run of one repetition met the same requests and the same random faults. Their
//! ratio removes what the draw did to both; what is left is the difference between the
//! drivers plus the host's noise between two runs. The ratios of the repetitions are then
//! independent draws of that, and their geometric mean gets a 95 % interval from Student's t
//! on the logarithms (the ratio of two positive figures is closer to log-normal than to
//! normal, and the log makes `a ÷ b` and `b ÷ a` symmetric).
//!
//! The outcome is read off the interval, never off the point estimate: **lead** when the
//! interval lies above 1, **loss** when it lies below 1, **tie** otherwise. Which upstream
//! configuration is the best is decided by the median of the same figure over its valid
//! runs, before any ratio is taken. Nothing here reruns or drops a repetition because of its
//! result: a pair is left out only when one of its two runs is invalid (the lab's honesty
//! checks), and the count of pairs left out is reported beside the outcome.

use std::fmt::Write as _;

use serde::Serialize;

use super::config::{CONTROLS, RECOMMENDED};
use super::runner::LabRun;
use super::verdict::Primary;

/// The fewest repetitions a judged verdict may declare.
pub const MIN_REPETITIONS: usize = 10;

/// The fewest valid pairs an interval is computed from.
pub const MIN_PAIRS: usize = 3;

/// What a comparison's interval says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    /// The whole interval lies above 1.
    Lead,
    /// The interval contains 1.
    Tie,
    /// The whole interval lies below 1.
    Loss,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Outcome::Lead => "lead",
            Outcome::Tie => "tie",
            Outcome::Loss => "loss",
        })
    }
}

/// The paired ratios of one comparison and their interval.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PairedRatio {
    /// `(repetition, fork ÷ upstream)` of every pair used, in repetition order.
    pub ratios: Vec<(usize, f64)>,
    /// The geometric mean of the ratios.
    pub estimate: f64,
    /// The 95 % interval of the geometric mean.
    pub low: f64,
    pub high: f64,
    pub outcome: Outcome,
}

/// Student's t quantile at 0.975 for `df` degrees of freedom (the two-sided 95 % interval).
/// Exact to three decimals from tables for `df` ≤ 30; beyond, interpolated in `1 ÷ df`
/// between 30, 40, 60, 120 and the normal quantile, within 0.001 of the true value.
pub fn t_975(df: usize) -> Option<f64> {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    const TAIL: [(f64, f64); 4] = [(30.0, 2.042), (40.0, 2.021), (60.0, 2.000), (120.0, 1.980)];
    const NORMAL: f64 = 1.960;
    match df {
        0 => None,
        1..=30 => Some(TABLE[df - 1]),
        _ => {
            let x = 1.0 / df as f64;
            for w in TAIL.windows(2) {
                let ((d0, t0), (d1, t1)) = (w[0], w[1]);
                if df as f64 <= d1 {
                    let (x0, x1) = (1.0 / d0, 1.0 / d1);
                    return Some(t1 + (t0 - t1) * (x - x1) / (x0 - x1));
                }
            }
            // Between 120 and infinity (x = 0).
            let x0 = 1.0 / 120.0;
            Some(NORMAL + (1.980 - NORMAL) * x / x0)
        }
    }
}

/// The paired ratio of `pairs` (`(repetition, fork figure, upstream figure)`).
///
/// # Errors
///
/// Fewer than [`MIN_PAIRS`] pairs, or a figure that is not finite and above 0 (a ratio of
/// such a figure has no logarithm, and dropping the pair would judge on the others alone).
pub fn paired_ratio(pairs: &[(usize, f64, f64)]) -> Result<PairedRatio, String> {
    if pairs.len() < MIN_PAIRS {
        return Err(format!(
            "{} valid pairs, at least {MIN_PAIRS} needed",
            pairs.len()
        ));
    }
    let mut ratios = Vec::with_capacity(pairs.len());
    for &(rep, fork, upstream) in pairs {
        if !(fork.is_finite() && fork > 0.0 && upstream.is_finite() && upstream > 0.0) {
            return Err(format!(
                "repetition {}: figures {fork} and {upstream} are not both above 0",
                rep + 1
            ));
        }
        ratios.push((rep, fork / upstream));
    }
    ratios.sort_by_key(|&(rep, _)| rep);
    let logs: Vec<f64> = ratios.iter().map(|&(_, r)| r.ln()).collect();
    let n = logs.len() as f64;
    let mean = logs.iter().sum::<f64>() / n;
    let var = logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let t = t_975(logs.len() - 1).ok_or("no degrees of freedom")?;
    let half = t * (var / n).sqrt();
    let (low, high) = ((mean - half).exp(), (mean + half).exp());
    let outcome = if low > 1.0 {
        Outcome::Lead
    } else if high < 1.0 {
        Outcome::Loss
    } else {
        Outcome::Tie
    };
    Ok(PairedRatio {
        ratios,
        estimate: mean.exp(),
        low,
        high,
        outcome,
    })
}

/// The median of `xs` (the mean of the middle two for an even count); `None` when empty.
fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let m = xs.len() / 2;
    Some(if xs.len().is_multiple_of(2) {
        (xs[m - 1] + xs[m]) / 2.0
    } else {
        xs[m]
    })
}

/// One fork variant against the scenario's best upstream configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Comparison {
    pub fork: String,
    pub upstream: String,
    /// Repetitions left out because the fork's or upstream's run of it was invalid.
    pub pairs_left_out: usize,
    /// The paired ratio, or why there is none.
    pub ratio: Result<PairedRatio, String>,
}

/// The judged verdict of one scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JudgedScenario {
    pub scenario: String,
    /// The repetitions declared for the run.
    pub repetitions: usize,
    /// The figure compared (`goodputShare`, `successShare`, `throughput`: the verdict's
    /// primary figure of the scenario; a ratio of goodput shares is a ratio of goodputs).
    pub figure: String,
    /// Invalid runs in the scenario, every variant's.
    pub invalid_runs: usize,
    /// The best upstream configuration by its median figure, with that median.
    pub best_upstream: Option<(String, f64)>,
    pub comparisons: Vec<Comparison>,
}

/// The figure of one run that the scenario is judged on (`None` when the run has none).
fn figure(summary: &super::summary::RunSummary, primary: Primary) -> Option<f64> {
    match primary {
        Primary::SuccessShare => summary.success_share,
        Primary::GoodputShare | Primary::Throughput => Some(summary.goodput),
    }
}

/// Judges one scenario's run.
///
/// # Errors
///
/// The run declared fewer than [`MIN_REPETITIONS`] repetitions.
pub fn judge_scenario(run: &LabRun) -> Result<JudgedScenario, String> {
    let cfg = &run.config;
    let name = cfg.scenario.name.clone();
    if cfg.repeats < MIN_REPETITIONS {
        return Err(format!(
            "{name}: {} repetitions declared; a judged verdict needs at least {MIN_REPETITIONS}",
            cfg.repeats
        ));
    }
    let primary = Primary::of(&name);
    let valid_figure = |variant: &str, rep: usize| {
        run.runs
            .iter()
            .find(|r| r.variant.name == variant && r.rep == rep)
            .filter(|r| r.summary.is_valid())
            .and_then(|r| figure(&r.summary, primary))
    };
    let best_upstream = cfg
        .variants
        .iter()
        .filter(|v| v.is_upstream())
        .filter_map(|v| {
            let figures = (0..cfg.repeats)
                .filter_map(|rep| valid_figure(&v.name, rep))
                .collect();
            median(figures).map(|m| (v.name.clone(), m))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let comparisons = match &best_upstream {
        None => Vec::new(),
        Some((upstream, _)) => [RECOMMENDED, CONTROLS]
            .into_iter()
            .filter(|fork| cfg.variants.iter().any(|v| v.name == *fork))
            .map(|fork| {
                let mut pairs = Vec::new();
                let mut left_out = 0;
                for rep in 0..cfg.repeats {
                    match (valid_figure(fork, rep), valid_figure(upstream, rep)) {
                        (Some(f), Some(u)) => pairs.push((rep, f, u)),
                        _ => left_out += 1,
                    }
                }
                Comparison {
                    fork: fork.to_string(),
                    upstream: upstream.clone(),
                    pairs_left_out: left_out,
                    ratio: paired_ratio(&pairs),
                }
            })
            .collect(),
    };
    Ok(JudgedScenario {
        scenario: name,
        repetitions: cfg.repeats,
        figure: primary_name(primary).into(),
        invalid_runs: run.runs.iter().filter(|r| !r.summary.is_valid()).count(),
        best_upstream,
        comparisons,
    })
}

fn primary_name(p: Primary) -> &'static str {
    match p {
        Primary::GoodputShare => "goodputShare",
        Primary::SuccessShare => "successShare",
        Primary::Throughput => "throughput",
    }
}

/// The judged verdict as markdown: one row per scenario and fork variant.
pub fn markdown(judged: &[JudgedScenario]) -> String {
    let mut s = String::from(
        "# Judged verdict\n\nEach row: the fork variant ÷ the scenario's best upstream \
         configuration (by median), paired by repetition (same seed), geometric mean with its \
         95 % interval (Student's t on the logarithms). Lead: the interval lies above 1; loss: \
         below 1; tie: it contains 1.\n\n\
         | scenario | repetitions | invalid runs | fork | best upstream | pairs | ratio | 95 % interval | outcome |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for j in judged {
        if j.comparisons.is_empty() {
            let _ = writeln!(
                s,
                "| {} | {} | {} | – | {} | – | – | – | not judged |",
                j.scenario,
                j.repetitions,
                j.invalid_runs,
                j.best_upstream.as_ref().map_or("none", |b| b.0.as_str())
            );
        }
        for c in &j.comparisons {
            let row = match &c.ratio {
                Ok(r) => format!(
                    "{} | {:.3} | {:.3}–{:.3} | **{}**",
                    r.ratios.len(),
                    r.estimate,
                    r.low,
                    r.high,
                    r.outcome
                ),
                Err(e) => format!("– | – | – | not judged: {e}"),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {row} |",
                j.scenario, j.repetitions, j.invalid_runs, c.fork, c.upstream
            );
        }
    }
    s
}

/// Writes `judged.md` and `judged.json` into `out`.
///
/// # Errors
///
/// A file that could not be written, named.
pub fn write(judged: &[JudgedScenario], out: &std::path::Path) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let json = serde_json::to_string_pretty(judged).map_err(|e| e.to_string())?;
    for (name, body) in [("judged.md", markdown(judged)), ("judged.json", json)] {
        std::fs::write(out.join(name), body).map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(ratios: &[f64]) -> Vec<(usize, f64, f64)> {
        ratios
            .iter()
            .enumerate()
            .map(|(i, r)| (i, *r, 1.0))
            .collect()
    }

    #[test]
    fn t_quantiles_match_the_tables() {
        assert_eq!(t_975(0), None);
        assert_eq!(t_975(1), Some(12.706));
        assert_eq!(t_975(9), Some(2.262));
        assert_eq!(t_975(11), Some(2.201));
        // Interpolated: published values 2.030 (35), 2.009 (50), 1.990 (80), 1.984 (100),
        // 1.962 (1000).
        for (df, want) in [
            (35, 2.030),
            (50, 2.009),
            (80, 1.990),
            (100, 1.984),
            (1000, 1.962),
        ] {
            let got = t_975(df).unwrap();
            assert!((got - want).abs() < 0.002, "df {df}: {got} against {want}");
        }
        // Decreasing in the degrees of freedom, towards the normal quantile.
        let ts: Vec<f64> = (1..500).map(|d| t_975(d).unwrap()).collect();
        assert!(ts.windows(2).all(|w| w[1] <= w[0]));
        assert!(ts.iter().all(|&t| t > 1.96));
    }

    #[test]
    fn the_interval_is_students_on_the_logarithms() {
        // Ten ratios whose logarithms are ±0.1 around ln 1.05: mean ln 1.05, sd of the logs
        // 0.1 × sqrt(10/9).
        let logs: Vec<f64> = (0..10)
            .map(|i| 1.05f64.ln() + if i % 2 == 0 { 0.1 } else { -0.1 })
            .collect();
        let r = paired_ratio(&pairs(&logs.iter().map(|l| l.exp()).collect::<Vec<_>>())).unwrap();
        let half = 2.262 * 0.1 * (10.0f64 / 9.0).sqrt() / 10.0f64.sqrt();
        assert!((r.estimate - 1.05).abs() < 1e-12);
        assert!((r.low - (1.05f64.ln() - half).exp()).abs() < 1e-12);
        assert!((r.high - (1.05f64.ln() + half).exp()).abs() < 1e-12);
        // 1.05 × e^(±0.0754): the interval contains 1.
        assert_eq!(r.outcome, Outcome::Tie);
        // Symmetric: upstream ÷ fork has the reciprocal interval.
        let swapped: Vec<(usize, f64, f64)> =
            pairs(&logs.iter().map(|l| l.exp()).collect::<Vec<_>>())
                .into_iter()
                .map(|(i, f, u)| (i, u, f))
                .collect();
        let s = paired_ratio(&swapped).unwrap();
        assert!((s.low - 1.0 / r.high).abs() < 1e-12 && (s.high - 1.0 / r.low).abs() < 1e-12);
    }

    #[test]
    fn lead_tie_and_loss_follow_the_interval_not_the_estimate() {
        let lead = paired_ratio(&pairs(&[
            1.10, 1.12, 1.09, 1.11, 1.10, 1.13, 1.08, 1.10, 1.11, 1.12,
        ]))
        .unwrap();
        assert_eq!(lead.outcome, Outcome::Lead);
        assert!(lead.low > 1.0);
        let loss = paired_ratio(&pairs(&[
            0.97, 0.98, 0.96, 0.97, 0.98, 0.97, 0.96, 0.98, 0.97, 0.97,
        ]))
        .unwrap();
        assert_eq!(loss.outcome, Outcome::Loss);
        assert!(loss.high < 1.0);
        // An estimate of 1.03 whose pairs scatter widely is a tie, not a lead.
        let wide = paired_ratio(&pairs(&[
            1.30, 0.80, 1.25, 0.85, 1.20, 0.90, 1.15, 0.95, 1.10, 1.02,
        ]))
        .unwrap();
        assert!(wide.estimate > 1.0);
        assert_eq!(wide.outcome, Outcome::Tie);
        assert!(wide.low < 1.0 && wide.high > 1.0);
        // Identical pairs: a zero-width interval at the ratio.
        let same = paired_ratio(&pairs(&[1.02; 10])).unwrap();
        assert!((same.low - 1.02).abs() < 1e-12 && (same.high - 1.02).abs() < 1e-12);
        assert_eq!(same.outcome, Outcome::Lead);
    }

    #[test]
    fn pairing_removes_what_the_seed_does_to_both() {
        // Each repetition's seed moves both figures by up to ±40 %; the fork is 2 % ahead in
        // every one. Unpaired, the medians would differ by the draw; paired, it is a lead.
        let scale = [0.6, 1.4, 0.9, 1.2, 0.7, 1.3, 1.0, 0.8, 1.1, 1.35];
        let p: Vec<(usize, f64, f64)> = scale
            .iter()
            .enumerate()
            .map(|(i, s)| (i, 1.02 * s * (1.0 + 0.001 * (i % 3) as f64), *s))
            .collect();
        let r = paired_ratio(&p).unwrap();
        assert_eq!(r.outcome, Outcome::Lead);
        assert!(r.low > 1.015 && r.high < 1.025, "{r:?}");
    }

    #[test]
    fn too_few_pairs_or_a_figure_without_a_logarithm_is_not_judged() {
        assert!(paired_ratio(&pairs(&[1.1, 1.2]))
            .unwrap_err()
            .contains("at least 3"));
        let mut p = pairs(&[1.1, 1.2, 1.0, 1.1]);
        p[2].2 = 0.0;
        assert!(paired_ratio(&p).unwrap_err().contains("repetition 3"));
        p[2] = (2, f64::NAN, 1.0);
        assert!(paired_ratio(&p).is_err());
    }

    #[test]
    fn ratios_are_reported_in_repetition_order() {
        let p = vec![(2, 1.2, 1.0), (0, 1.0, 1.0), (1, 1.1, 1.0)];
        let r = paired_ratio(&p).unwrap();
        let reps: Vec<usize> = r.ratios.iter().map(|(rep, _)| *rep).collect();
        assert_eq!(reps, vec![0, 1, 2]);
    }

    /// Ten repetitions of `upstream-best`, `upstream-best-no-retries` and `fork-recommended`
    /// in `sustained` (goodput share per repetition; `invalid`: repetitions whose
    /// `fork-recommended` run is invalid).
    fn ten_repetitions(fork: [f64; 10], invalid: &[usize]) -> LabRun {
        let best = [0.60, 0.62, 0.58, 0.61, 0.59, 0.63, 0.60, 0.57, 0.62, 0.61];
        let weaker = [0.50; 10];
        let mut runs = Vec::new();
        for rep in 0..10 {
            runs.push(("upstream-best", best[rep], true));
            runs.push(("upstream-best-no-retries", weaker[rep], true));
            runs.push((RECOMMENDED, fork[rep], !invalid.contains(&rep)));
        }
        let mut run = super::super::verdict::tests::lab_run("sustained", &runs);
        run.config.repeats = 10;
        run
    }

    #[test]
    fn a_scenario_is_judged_against_its_best_upstream_pair_by_pair() {
        // The fork 3 % ahead of upstream-best in every repetition, whatever the draw.
        let best = [0.60, 0.62, 0.58, 0.61, 0.59, 0.63, 0.60, 0.57, 0.62, 0.61];
        let j = judge_scenario(&ten_repetitions(best.map(|b| b * 1.03), &[])).unwrap();
        assert_eq!(j.figure, "goodputShare");
        assert_eq!(j.repetitions, 10);
        assert_eq!(
            j.best_upstream.as_ref().map(|b| b.0.as_str()),
            Some("upstream-best")
        );
        assert_eq!(j.comparisons.len(), 1, "fork-controls did not run");
        let c = &j.comparisons[0];
        assert_eq!(
            (c.fork.as_str(), c.upstream.as_str()),
            (RECOMMENDED, "upstream-best")
        );
        let r = c.ratio.as_ref().unwrap();
        assert_eq!(r.ratios.len(), 10);
        assert!((r.estimate - 1.03).abs() < 1e-9);
        assert_eq!(r.outcome, Outcome::Lead);
        assert!(markdown(&[j])
            .contains("| sustained | 10 | 0 | fork-recommended | upstream-best | 10 | 1.030 |"));
    }

    #[test]
    fn invalid_runs_leave_their_pairs_out_and_are_counted() {
        let best = [0.60, 0.62, 0.58, 0.61, 0.59, 0.63, 0.60, 0.57, 0.62, 0.61];
        let j = judge_scenario(&ten_repetitions(best.map(|b| b * 0.97), &[1, 4])).unwrap();
        assert_eq!(j.invalid_runs, 2);
        let c = &j.comparisons[0];
        assert_eq!(c.pairs_left_out, 2);
        let r = c.ratio.as_ref().unwrap();
        assert_eq!(r.ratios.len(), 8);
        assert!(r.ratios.iter().all(|(rep, _)| *rep != 1 && *rep != 4));
        assert_eq!(r.outcome, Outcome::Loss);
    }

    #[test]
    fn fewer_than_ten_declared_repetitions_are_refused() {
        let mut run = ten_repetitions([0.6; 10], &[]);
        run.config.repeats = 9;
        let e = judge_scenario(&run).unwrap_err();
        assert!(
            e.contains("9 repetitions") && e.contains("at least 10"),
            "{e}"
        );
    }

    #[test]
    fn medians_of_even_and_odd_counts() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }
}
