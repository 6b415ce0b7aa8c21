//! SVG plots of a grid's figures against the number of clients (`sim --plot DIR`): one chart
//! per scenario and figure, one line per variant, clients on a logarithmic axis, so the
//! fleet-scale predictions in `docs/simulator.md` can be read at a glance.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::report::Report;

/// A figure of a [`Report`] that a chart plots.
#[derive(Clone, Copy, Debug)]
pub struct Figure {
    /// Part of the file name: `<scenario>-<file>.svg`.
    pub file: &'static str,
    /// The y axis's label.
    pub label: &'static str,
    pub value: fn(&Report) -> f64,
    /// The y axis reaches at least this high, so small figures are read against their scale.
    pub y_floor: f64,
}

/// The figures `sim --plot` draws: goodput as a share of capacity, and driver retries per
/// first attempt (issue 30's two fleet targets).
pub const FIGURES: [Figure; 2] = [
    Figure {
        file: "goodput",
        label: "goodput ÷ capacity",
        value: Report::goodput_share,
        y_floor: 1.0,
    },
    Figure {
        file: "retries",
        label: "retries per first attempt",
        value: Report::retries_per_first,
        y_floor: 0.1,
    },
];

/// Draws every figure of [`FIGURES`] for every scenario in `reports` into `dir` (created if
/// missing); returns the files written. A scenario run at fewer than two client counts has no
/// line to draw and is skipped.
pub fn write_all(reports: &[Report], dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("--plot: cannot create {dir:?}: {e}"))?;
    let mut by_scenario: BTreeMap<&str, Vec<&Report>> = BTreeMap::new();
    for r in reports {
        by_scenario.entry(r.scenario.as_str()).or_default().push(r);
    }
    let mut written = Vec::new();
    for (scenario, runs) in by_scenario {
        let mut counts: Vec<u32> = runs.iter().map(|r| r.clients).collect();
        counts.sort_unstable();
        counts.dedup();
        if counts.len() < 2 {
            continue;
        }
        for figure in FIGURES {
            let path = dir.join(format!("{scenario}-{}.svg", figure.file));
            draw(&path, scenario, figure, &runs).map_err(|e| format!("--plot {path:?}: {e}"))?;
            written.push(path);
        }
    }
    Ok(written)
}

/// One line per variant, in the order the variants first appear.
fn lines(runs: &[&Report], figure: Figure) -> Vec<(&'static str, Vec<(f64, f64)>)> {
    let mut lines: Vec<(&'static str, Vec<(f64, f64)>)> = Vec::new();
    for r in runs {
        let point = (f64::from(r.clients), (figure.value)(r));
        match lines.iter_mut().find(|(name, _)| *name == r.variant.name()) {
            Some((_, points)) => points.push(point),
            None => lines.push((r.variant.name(), vec![point])),
        }
    }
    for (_, points) in &mut lines {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    lines
}

fn draw(
    path: &Path,
    scenario: &str,
    figure: Figure,
    runs: &[&Report],
) -> Result<(), Box<dyn std::error::Error>> {
    let lines = lines(runs, figure);
    let x_max = runs
        .iter()
        .map(|r| f64::from(r.clients))
        .fold(1.0, f64::max);
    let x_min = runs
        .iter()
        .map(|r| f64::from(r.clients))
        .fold(x_max, f64::min);
    let y_top = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(_, y)| y))
        .filter(|y| y.is_finite())
        .fold(0.0, f64::max);
    // Headroom above the highest point for the legend, in the upper right.
    let y_max = (y_top * 1.5).max(figure.y_floor);

    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{scenario}: {}", figure.label), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d((x_min..x_max).log_scale(), 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("clients (log scale)")
        .y_desc(figure.label)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    for (i, (name, points)) in lines.into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Length, RunConfig, ScenarioName, Variant};

    #[test]
    fn a_grid_over_client_counts_becomes_one_svg_per_scenario_and_figure() {
        let dir = std::env::temp_dir().join(format!("sim-plot-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut reports = Vec::new();
        for variant in Variant::parse_list("recommended,upstream-best").expect("variants") {
            for clients in [4, 64, 1000] {
                let scenario = ScenarioName::Sustained.build(Length::Quick, Some(2.0));
                let cfg = RunConfig::new(scenario, variant, clients, 4);
                reports.push(crate::run(&cfg).expect("a run"));
            }
        }
        let written = write_all(&reports, &dir).expect("plots");
        let scenario = reports[0].scenario.clone();
        assert_eq!(
            written,
            vec![
                dir.join(format!("{scenario}-goodput.svg")),
                dir.join(format!("{scenario}-retries.svg"))
            ]
        );
        let svg = std::fs::read_to_string(&written[0]).expect("the file");
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        assert!(svg.contains("recommended") && svg.contains("upstream-best"));
        // One client count is no line: nothing is drawn.
        let single: Vec<Report> = reports.iter().filter(|r| r.clients == 4).cloned().collect();
        let other = dir.join("single");
        assert!(write_all(&single, &other).expect("no plots").is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
