//! The lab's published four-instance figures the simulator is compared with, and the
//! comparison (`sim --compare-lab`).
//!
//! Each figure is the median of a suite's valid runs as `docs/results/` prints it (two
//! significant digits for goodput), from the suite `docs/results/current.md` links
//! (2026-12-03-1829) or, where that suite left a variant not judged, the one before it
//! (2026-12-03-1801). Each lab run calibrated its own capacity; the simulator runs each
//! comparison twice: at that capacity (load and limiter in the lab's ops/s, the model's cores
//! at their nominal speed) and at the model's nominal capacity (every rate relative to what the
//! model's cores complete).

use crate::scenario::{Length, ScenarioName};
use crate::variant::Variant;

/// One lab row: the medians of a variant in a scenario.
#[derive(Clone, Copy, Debug)]
pub struct LabRow {
    pub scenario: ScenarioName,
    pub variant: Variant,
    /// The suite it comes from (`docs/results/<suite>-suite.md`).
    pub suite: &'static str,
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
        variant,
        suite,
        capacity,
        goodput_share: figures.0,
        burst_share: figures.1,
        attempts_per_request: figures.2,
        rejecting_pct: figures.3,
        wasted_pct: figures.4,
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

/// Relative difference of `sim` from `lab` (0.1 = 10 %); `None` when the lab's figure is 0.
pub fn relative(sim: f64, lab: f64) -> Option<f64> {
    (lab != 0.0).then(|| (sim - lab) / lab)
}
