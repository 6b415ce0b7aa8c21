//! The sensitivity table of the model's unmeasured costs (`lab run --sensitivity`,
//! `docs/lab.md` "Sensitivity of the model's costs"): `flood` over the rejection cost and the
//! expiry cost at about ×0.3, ×1 and ×3 each, and `no-limiter` (which rejects nothing) over the
//! expiry cost, each cell one run of the scenario's variants; the table gives each cell's best
//! upstream configuration and the fork's ratios to it.

use std::fmt::Write as _;

use serde::Serialize;

use super::config::{CONTROLS, RECOMMENDED};
use super::scenarios::{ScenarioName, FLOOD_REJECTION_MS};
use super::verdict::ScenarioVerdict;

/// The model's default expiry cost (ms, `costs.expiryMs`), the ×1 of the table: read from the
/// emulator, so that the table follows the model's default when it changes.
pub fn model_expiry_ms() -> f64 {
    emulator::model::CostConfig::default().expiry_ms
}

/// The factors each cost is scaled by.
pub const FACTORS: [f64; 3] = [0.3, 1.0, 3.0];

/// One cell of the grid: a scenario at a rejection cost and an expiry cost.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cell {
    /// The scenario.
    #[serde(serialize_with = "ser_name")]
    pub scenario: ScenarioName,
    /// `costs.rejectionMs` (`None`: the scenario's own).
    pub rejection_ms: Option<f64>,
    /// `costs.expiryMs`.
    pub expiry_ms: f64,
}

fn ser_name<S: serde::Serializer>(n: &ScenarioName, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(n.name())
}

/// The grid: `flood` over both costs (nine cells), `no-limiter` over the expiry cost (three).
pub fn grid() -> Vec<Cell> {
    let mut cells = Vec::new();
    for r in FACTORS {
        for e in FACTORS {
            cells.push(Cell {
                scenario: ScenarioName::Flood,
                rejection_ms: Some(FLOOD_REJECTION_MS * r),
                expiry_ms: model_expiry_ms() * e,
            });
        }
    }
    for e in FACTORS {
        cells.push(Cell {
            scenario: ScenarioName::NoLimiter,
            rejection_ms: None,
            expiry_ms: model_expiry_ms() * e,
        });
    }
    cells
}

/// One cell's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// The cell.
    pub cell: Cell,
    /// The best judged upstream configuration and its primary figure.
    pub best_upstream: Option<(String, f64)>,
    /// The recommended settings ([`RECOMMENDED`]) ÷ the best upstream.
    pub recommended_ratio: Option<f64>,
    /// `fork-controls` ÷ the best upstream.
    pub controls_ratio: Option<f64>,
    /// `fork-controls`' share of server core time spent rejecting (median).
    pub controls_rejecting: Option<f64>,
    /// Every run of the cell counted.
    pub valid: bool,
}

impl Row {
    /// The row of `cell` from its scenario's verdict.
    pub fn of(cell: Cell, v: &ScenarioVerdict) -> Row {
        Row {
            cell,
            best_upstream: v
                .best_upstream
                .as_ref()
                .map(|b| (b.variant.clone(), b.value)),
            recommended_ratio: v.ratio_to_best(RECOMMENDED),
            controls_ratio: v.ratio_to_best(CONTROLS),
            controls_rejecting: v
                .variants
                .iter()
                .find(|x| x.name == CONTROLS)
                .and_then(|x| x.rejection_share)
                .map(|s| s.median),
            valid: v.valid,
        }
    }
}

/// `sensitivity.md`.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Sensitivity of the model's costs\n");
    let _ = writeln!(
        s,
        "Each row is one run of the scenario's variants (median over `--repeats`); ratios are \
         to the best judged upstream configuration of the row (\"not judged\": fewer than two \
         valid runs). ×1 is {FLOOD_REJECTION_MS} ms per rejection (`flood`) and \
         {} ms per expiry.\n",
        model_expiry_ms()
    );
    let _ = writeln!(
        s,
        "| scenario | rejectionMs | expiryMs | best upstream | {RECOMMENDED} ÷ best | {CONTROLS} ÷ best | {CONTROLS} rejecting % | valid |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    let ratio = |r: Option<f64>| r.map_or_else(|| "not judged".into(), |r| format!("{r:.3}"));
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {:.2} | {} | {} | {} | {} | {} |",
            r.cell.scenario.name(),
            r.cell
                .rejection_ms
                .map_or_else(|| "model's".into(), |v| format!("{v:.2}")),
            r.cell.expiry_ms,
            r.best_upstream
                .as_ref()
                .map_or_else(|| "not judged".into(), |(n, v)| format!("{n} {v:.3}")),
            ratio(r.recommended_ratio),
            ratio(r.controls_ratio),
            r.controls_rejecting
                .map_or_else(|| "–".into(), |v| format!("{:.1}", v * 100.0)),
            if r.valid { "yes" } else { "**INVALID runs**" },
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_spans_a_third_to_three_times_each_cost() {
        let g = grid();
        assert_eq!(g.len(), 12);
        let flood: Vec<&Cell> = g
            .iter()
            .filter(|c| c.scenario == ScenarioName::Flood)
            .collect();
        assert_eq!(flood.len(), 9);
        let rejections: Vec<f64> = flood.iter().filter_map(|c| c.rejection_ms).collect();
        let (lo, hi) = rejections
            .iter()
            .fold((f64::MAX, 0.0f64), |(a, b), x| (a.min(*x), b.max(*x)));
        assert!(
            (lo - 0.09).abs() < 1e-9 && (hi - 0.9).abs() < 1e-9,
            "{lo} {hi}"
        );
        assert!(g
            .iter()
            .filter(|c| c.scenario == ScenarioName::NoLimiter)
            .all(|c| c.rejection_ms.is_none()));
        let md = markdown(&[Row {
            cell: g[0],
            best_upstream: None,
            recommended_ratio: Some(1.5),
            controls_ratio: None,
            controls_rejecting: Some(0.12),
            valid: false,
        }]);
        assert!(md.contains("| flood | 0.09 | 0.15 | not judged | 1.500 | not judged | 12.0 | **INVALID runs** |"), "{md}");
    }
}
