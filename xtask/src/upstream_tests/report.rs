//! What upstream's tests did: one outcome per test, per driver copy and topology; the comparison
//! of pristine and fork; the summary lines and the dated results file.
//!
//! Knows nothing of cargo, nextest or labd: the runner hands it parsed outcomes, so every rule
//! here (what counts as a regression, as skipped, as a failure category) is unit-tested on its own.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One test's result in one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    /// The first line of the failure that says why (panic message or nextest's reason).
    Failed(String),
    /// Not run, or returned early without testing anything; the reason says which.
    Skipped(String),
}

impl Outcome {
    fn word(&self) -> &'static str {
        match self {
            Outcome::Passed => "pass",
            Outcome::Failed(_) => "FAIL",
            Outcome::Skipped(_) => "skip",
        }
    }
}

/// Passed, failed and skipped counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
}

impl Counts {
    pub fn of<'a>(outcomes: impl IntoIterator<Item = &'a Outcome>) -> Self {
        let mut counts = Counts::default();
        for outcome in outcomes {
            match outcome {
                Outcome::Passed => counts.passed += 1,
                Outcome::Failed(_) => counts.failed += 1,
                Outcome::Skipped(_) => counts.skipped += 1,
            }
        }
        counts
    }

    /// Passed as a share of the tests that ran (passed + failed), in percent; `None` when none ran.
    pub fn pass_percent(&self) -> Option<f64> {
        let ran = self.passed + self.failed;
        (ran > 0).then(|| 100.0 * self.passed as f64 / ran as f64)
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        )
    }
}

/// Outcomes by test name for one driver copy in one topology.
pub type RunOutcomes = BTreeMap<String, Outcome>;

/// One topology's results: each copy's outcomes, either of which may be missing (not run).
#[derive(Clone, Debug, Default)]
pub struct TopologyResults {
    pub topology: String,
    pub pristine: Option<RunOutcomes>,
    pub fork: Option<RunOutcomes>,
}

impl TopologyResults {
    /// Tests that pass on pristine and do not pass on the fork (a fork failure or a fork skip of
    /// a test pristine ran and passed both count: either way upstream's check is lost).
    pub fn regressions(&self) -> Vec<(&str, &Outcome)> {
        let (Some(pristine), Some(fork)) = (&self.pristine, &self.fork) else {
            return Vec::new();
        };
        pristine
            .iter()
            .filter(|(_, o)| **o == Outcome::Passed)
            .filter_map(|(name, _)| match fork.get(name) {
                Some(Outcome::Passed) => None,
                Some(other) => Some((name.as_str(), other)),
                None => None,
            })
            .chain(
                // A test pristine passes that the fork's copy does not even list.
                pristine
                    .iter()
                    .filter(|(name, o)| **o == Outcome::Passed && !fork.contains_key(*name))
                    .map(|(name, _)| (name.as_str(), &MISSING_ON_FORK)),
            )
            .collect()
    }
}

static MISSING_ON_FORK: Outcome = Outcome::Failed(String::new());

/// The summary lines the command prints last for one topology.
pub fn summary_lines(results: &TopologyResults) -> Vec<String> {
    let mut lines = vec![format!("topology {}:", results.topology)];
    match (&results.pristine, &results.fork) {
        (Some(_), Some(_)) => lines.push(format!("regressions: {}", results.regressions().len())),
        _ => lines.push("regressions: not judged (needs both copies run)".to_owned()),
    }
    match &results.pristine {
        Some(p) => lines.push(format!("pristine: {}", Counts::of(p.values()))),
        None => lines.push("pristine: not run".to_owned()),
    }
    match &results.fork {
        Some(f) => lines.push(format!("fork: {}", Counts::of(f.values()))),
        None => lines.push("fork: not run".to_owned()),
    }
    lines
}

/// A failure's category: the reason's text with volatile parts (numbers, addresses, quoted
/// values) blanked, cut to a length that keeps failures of one cause together.
pub fn failure_category(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len());
    let mut last_was_digit = false;
    for c in reason.chars() {
        if c.is_ascii_digit() {
            if !last_was_digit {
                out.push('N');
            }
            last_was_digit = true;
        } else {
            last_was_digit = false;
            out.push(c);
        }
    }
    let trimmed: String = out.chars().take(110).collect();
    trimmed.trim().to_owned()
}

/// Failure categories with their tests, largest first.
pub fn categories(outcomes: &RunOutcomes) -> Vec<(String, Vec<&str>)> {
    let mut by_category: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (name, outcome) in outcomes {
        if let Outcome::Failed(reason) = outcome {
            by_category
                .entry(failure_category(reason))
                .or_default()
                .push(name);
        }
    }
    let mut list: Vec<_> = by_category.into_iter().collect();
    list.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
    list
}

/// Makes text safe inside one Markdown table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

/// What the results file says about where the run happened.
pub struct RunInfo<'a> {
    pub date: &'a str,
    pub tests_source: &'a str,
    pub fork_series: &'a str,
    pub command: &'a str,
    pub triage: &'a str,
}

/// The dated results file: summaries, failure categories, then every test, pristine beside fork.
pub fn render_markdown(info: &RunInfo<'_>, topologies: &[TopologyResults]) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Upstream's own tests on pristine 3.9.1 and on the fork, against labd ({})\n",
        info.date
    );
    let _ = writeln!(
        md,
        "Generated by `{}` (method: docs/upstream-tests.md). Tests: {}. Fork: {}.\n",
        info.command, info.tests_source, info.fork_series
    );
    let _ = writeln!(md, "## Summary\n");
    let _ = writeln!(
        md,
        "| topology | regressions | pristine passed | pristine failed | pristine skipped | pristine pass % of run | fork passed | fork failed | fork skipped |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    for t in topologies {
        let p = t.pristine.as_ref().map(|o| Counts::of(o.values()));
        let f = t.fork.as_ref().map(|o| Counts::of(o.values()));
        let num = |c: Option<Counts>, pick: fn(&Counts) -> usize| {
            c.map_or_else(|| "not run".to_owned(), |c| pick(&c).to_string())
        };
        let regressions = if t.pristine.is_some() && t.fork.is_some() {
            t.regressions().len().to_string()
        } else {
            "not judged".to_owned()
        };
        let percent = p
            .and_then(|c| c.pass_percent())
            .map_or_else(|| "n/a".to_owned(), |v| format!("{v:.1} %"));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            t.topology,
            regressions,
            num(p, |c| c.passed),
            num(p, |c| c.failed),
            num(p, |c| c.skipped),
            percent,
            num(f, |c| c.passed),
            num(f, |c| c.failed),
            num(f, |c| c.skipped),
        );
    }
    md.push('\n');
    if !info.triage.trim().is_empty() {
        let _ = writeln!(md, "## Triage\n\n{}\n", info.triage.trim());
    }
    for t in topologies {
        let _ = writeln!(md, "## {}\n", t.topology);
        let regressions = t.regressions();
        if !regressions.is_empty() {
            let _ = writeln!(md, "### Regressions (pass on pristine, not on the fork)\n");
            for (name, outcome) in &regressions {
                let why = match outcome {
                    Outcome::Failed(r) if r.is_empty() => {
                        "not listed in the fork's copy".to_owned()
                    }
                    Outcome::Failed(r) | Outcome::Skipped(r) => r.clone(),
                    Outcome::Passed => String::new(),
                };
                let _ = writeln!(md, "- `{name}`: {}", cell(&why));
            }
            md.push('\n');
        }
        for (label, outcomes) in [("pristine", &t.pristine), ("fork", &t.fork)] {
            let Some(outcomes) = outcomes else { continue };
            let cats = categories(outcomes);
            if cats.is_empty() {
                continue;
            }
            let _ = writeln!(md, "### Failure categories on {label}\n");
            let _ = writeln!(md, "| tests | category | tests (first five) |");
            let _ = writeln!(md, "|---|---|---|");
            for (category, names) in cats {
                let shown: Vec<String> = names.iter().take(5).map(|n| format!("`{n}`")).collect();
                let _ = writeln!(
                    md,
                    "| {} | {} | {} |",
                    names.len(),
                    cell(&category),
                    shown.join(", ")
                );
            }
            md.push('\n');
        }
        let _ = writeln!(md, "### Every test\n");
        let _ = writeln!(
            md,
            "| test | pristine | fork | reason (failure or skip; fork's when it differs) |"
        );
        let _ = writeln!(md, "|---|---|---|---|");
        let mut names: Vec<&String> = t
            .pristine
            .iter()
            .chain(t.fork.iter())
            .flat_map(|o| o.keys())
            .collect();
        names.sort();
        names.dedup();
        for name in names {
            let p = t.pristine.as_ref().and_then(|o| o.get(name));
            let f = t.fork.as_ref().and_then(|o| o.get(name));
            let word = |o: Option<&Outcome>| o.map_or("-", Outcome::word);
            let reason = |o: Option<&Outcome>| match o {
                Some(Outcome::Failed(r)) | Some(Outcome::Skipped(r)) => Some(r.clone()),
                _ => None,
            };
            let why = match (reason(p), reason(f)) {
                (Some(a), Some(b)) if a == b => a,
                (Some(a), Some(b)) => format!("{a} / fork: {b}"),
                (Some(a), None) => a,
                (None, Some(b)) => format!("fork: {b}"),
                (None, None) => String::new(),
            };
            let _ = writeln!(
                md,
                "| `{}` | {} | {} | {} |",
                name,
                word(p),
                word(f),
                cell(&why)
            );
        }
        md.push('\n');
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcomes(list: &[(&str, Outcome)]) -> RunOutcomes {
        list.iter()
            .map(|(n, o)| (n.to_string(), o.clone()))
            .collect()
    }

    #[test]
    fn a_regression_is_a_pristine_pass_the_fork_fails_skips_or_lacks() {
        let results = TopologyResults {
            topology: "replicaset".into(),
            pristine: Some(outcomes(&[
                ("a", Outcome::Passed),
                ("b", Outcome::Passed),
                ("c", Outcome::Failed("x".into())),
                ("d", Outcome::Passed),
                ("e", Outcome::Passed),
            ])),
            fork: Some(outcomes(&[
                ("a", Outcome::Passed),
                ("b", Outcome::Failed("boom".into())),
                ("c", Outcome::Failed("x".into())),
                ("d", Outcome::Skipped("why".into())),
            ])),
        };
        let names: Vec<&str> = results.regressions().iter().map(|(n, _)| *n).collect();
        assert_eq!(names, vec!["b", "d", "e"]);
        let lines = summary_lines(&results);
        assert_eq!(lines[1], "regressions: 3");
        assert_eq!(lines[2], "pristine: 4 passed, 1 failed, 0 skipped");
        assert_eq!(lines[3], "fork: 1 passed, 2 failed, 1 skipped");
    }

    #[test]
    fn without_both_copies_nothing_is_called_a_regression() {
        let results = TopologyResults {
            topology: "standalone".into(),
            pristine: None,
            fork: Some(outcomes(&[("a", Outcome::Failed("x".into()))])),
        };
        assert!(results.regressions().is_empty());
        assert!(summary_lines(&results)[1].contains("not judged"));
        assert_eq!(summary_lines(&results)[2], "pristine: not run");
    }

    #[test]
    fn categories_group_reasons_that_differ_only_in_numbers() {
        let run = outcomes(&[
            (
                "a",
                Outcome::Failed("no such command: 'explain' (code 59) port 5001".into()),
            ),
            (
                "b",
                Outcome::Failed("no such command: 'explain' (code 59) port 61234".into()),
            ),
            ("c", Outcome::Failed("other".into())),
            ("d", Outcome::Passed),
        ]);
        let cats = categories(&run);
        assert_eq!(cats.len(), 2);
        assert_eq!(cats[0].1, vec!["a", "b"]);
        assert_eq!(cats[0].0, "no such command: 'explain' (code N) port N");
    }

    #[test]
    fn pass_percent_counts_only_tests_that_ran() {
        let c = Counts {
            passed: 17,
            failed: 3,
            skipped: 100,
        };
        assert_eq!(c.pass_percent(), Some(85.0));
        assert_eq!(Counts::default().pass_percent(), None);
    }

    #[test]
    fn the_file_lists_every_test_and_keeps_tables_intact() {
        let results = TopologyResults {
            topology: "replicaset".into(),
            pristine: Some(outcomes(&[("t1", Outcome::Failed("a | b\nc".into()))])),
            fork: Some(outcomes(&[
                ("t1", Outcome::Failed("a | b\nc".into())),
                ("t2", Outcome::Passed),
            ])),
        };
        let info = RunInfo {
            date: "2026-12-07",
            tests_source: "here",
            fork_series: "49 patches",
            command: "cargo xtask upstream-tests",
            triage: "",
        };
        let md = render_markdown(&info, &[results]);
        assert!(md.contains("| `t1` | FAIL | FAIL | a \\| b c |"), "{md}");
        assert!(md.contains("| `t2` | - | pass |"), "{md}");
        assert!(
            md.contains("| replicaset | 0 | 0 | 1 | 0 | 0.0 % | 1 | 1 | 0 |"),
            "{md}"
        );
    }
}
