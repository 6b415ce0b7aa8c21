//! `cargo xtask upstream-tests`: upstream's own test suite on pristine 3.9.1 and on the fork,
//! against `labd`, per topology; the per-test comparison and the dated results file
//! (method: docs/upstream-tests.md).
//!
//! [`prepare`] makes the two crate copies, [`run`] builds, lists and runs one copy against one
//! `labd`, [`report`] compares and writes. This module only resolves where the tests come from
//! and keeps each run's outcomes so that runs made at different times (the fork's half in CI,
//! pristine once) can be reported together.

pub mod prepare;
pub mod report;
pub mod run;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};

use crate::fork::Workspace;
use crate::project::Project;
use prepare::Variant;
use report::{Outcome, RunOutcomes, TopologyResults};
use run::Topology;

/// Names the directory holding upstream's tests (CI: `../shared/upstream-rust-driver`).
pub const TESTS_DIR_VAR: &str = "UPSTREAM_TESTS_DIR";
/// Overrides the repository the pinned commit is fetched from.
pub const REPO_URL_VAR: &str = "UPSTREAM_TESTS_REPO_URL";
const DEFAULT_REPO_URL: &str = "https://github.com/mongodb/mongo-rust-driver.git";

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    pub topologies: Vec<Topology>,
    pub variants: Vec<Variant>,
    /// nextest filters (test name substrings), for running part of the suite while working.
    pub filters: Vec<String>,
    /// Write the dated results file into docs/results/.
    pub write_results: bool,
}

fn work_dir(project: &Project) -> PathBuf {
    project.root().join("target").join("upstream-tests")
}

/// The directory of upstream's tests, and a label saying where it came from.
pub fn resolve_tests_dir(project: &Project, env: Option<OsString>) -> Result<(PathBuf, String)> {
    if let Some(dir) = env.filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        let dir = if dir.is_absolute() {
            dir
        } else {
            project.root().join(dir)
        };
        prepare::check_tests_dir(&dir)
            .with_context(|| format!("{TESTS_DIR_VAR}={}", dir.display()))?;
        let source = fs::read_to_string(dir.join("SOURCE")).unwrap_or_default();
        let commit = source
            .lines()
            .find_map(|l| l.strip_prefix("commit: "))
            .map(|c| c.split_whitespace().next().unwrap_or(c).to_owned())
            .unwrap_or_else(|| "unknown commit".to_owned());
        return Ok((
            dir.clone(),
            format!("{} (upstream {commit})", dir.display()),
        ));
    }
    let commit = read_pin(project)?;
    let dir = work_dir(project).join("source").join(&commit);
    if prepare::check_tests_dir(&dir).is_err() {
        fetch_pinned(&dir, &commit)?;
    }
    Ok((
        dir,
        format!("mongodb/mongo-rust-driver at {commit} (fetched)"),
    ))
}

/// The pinned upstream commit (`upstream-tests/UPSTREAM_COMMIT`: one line of 40 hex digits).
pub fn read_pin(project: &Project) -> Result<String> {
    let path = project
        .root()
        .join("upstream-tests")
        .join("UPSTREAM_COMMIT");
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    crate::spec_fetch::parse_pin(&text).with_context(|| format!("in {}", path.display()))
}

/// A shallow, sparse fetch of the test tree at `commit` into `dir`.
fn fetch_pinned(dir: &Path, commit: &str) -> Result<()> {
    let url = std::env::var(REPO_URL_VAR)
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| DEFAULT_REPO_URL.to_owned());
    crate::fork::remove_dir_if_exists(dir)?;
    fs::create_dir_all(dir)?;
    let git = |args: &[&str]| -> Result<()> {
        let out = Command::new("git")
            .current_dir(dir)
            .env("GIT_TERMINAL_PROMPT", "0")
            .args(["-c", "advice.detachedHead=false"])
            .args(args)
            .output()
            .context("cannot run git (is it installed?)")?;
        ensure!(
            out.status.success(),
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(())
    };
    let fetched = (|| {
        git(&["init", "--quiet"])?;
        git(&[
            "sparse-checkout",
            "set",
            "--no-cone",
            "/driver/src/test.rs",
            "/driver/src/test/",
            "/spec/",
            "/.config/",
        ])?;
        git(&[
            "fetch",
            "--quiet",
            "--depth",
            "1",
            "--no-tags",
            &url,
            commit,
        ])?;
        git(&["checkout", "--quiet", "--detach", "FETCH_HEAD"])
    })();
    if let Err(err) = fetched {
        let _ = crate::fork::remove_dir_if_exists(dir);
        bail!(
            "cannot fetch upstream's tests at {commit} from {url}: {err:#}. Without network, set \
             {TESTS_DIR_VAR} to a directory holding them (CI: ../shared/upstream-rust-driver)."
        );
    }
    prepare::check_tests_dir(dir)
}

/// The regressions already triaged (`upstream-tests/known-regressions`: `<topology> <test>`
/// per line, `#` comments; each line's comment says why): the exit code counts only the others,
/// so CI fails on a new regression while the listed ones wait for their fix.
pub fn known_regressions(
    project: &Project,
) -> Result<std::collections::BTreeSet<(String, String)>> {
    let path = project
        .root()
        .join("upstream-tests")
        .join("known-regressions");
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    parse_known_regressions(&text).with_context(|| format!("in {}", path.display()))
}

fn parse_known_regressions(text: &str) -> Result<std::collections::BTreeSet<(String, String)>> {
    let mut known = std::collections::BTreeSet::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(topology), Some(test), None) = (words.next(), words.next(), words.next()) else {
            bail!("`{line}` is not `<topology> <test>`");
        };
        Topology::parse(topology)?;
        known.insert((topology.to_owned(), test.to_owned()));
    }
    Ok(known)
}

/// One stored run: a copy's outcomes in one topology, with when and on what it ran.
fn stored_path(project: &Project, variant: Variant, topology: Topology) -> PathBuf {
    work_dir(project)
        .join("outcomes")
        .join(format!("{}-{}.json", variant.name(), topology.name()))
}

/// Pristine's outcomes as last committed: a run of the fork alone (CI) is judged against them
/// when `target/` holds no pristine run of its own.
fn baseline_path(project: &Project, topology: Topology) -> PathBuf {
    project
        .root()
        .join("upstream-tests")
        .join("pristine")
        .join(format!("{}.json", topology.name()))
}

fn store(
    project: &Project,
    variant: Variant,
    topology: Topology,
    outcomes: &RunOutcomes,
) -> Result<()> {
    write_outcomes(&stored_path(project, variant, topology), outcomes)?;
    if variant == Variant::Pristine {
        write_outcomes(&baseline_path(project, topology), outcomes)?;
    }
    Ok(())
}

fn write_outcomes(path: &Path, outcomes: &RunOutcomes) -> Result<()> {
    fs::create_dir_all(path.parent().context("no parent")?)?;
    let map: serde_json::Map<String, serde_json::Value> = outcomes
        .iter()
        .map(|(name, o)| {
            let v = match o {
                Outcome::Passed => serde_json::json!({"outcome": "passed"}),
                Outcome::Failed(r) => serde_json::json!({"outcome": "failed", "reason": r}),
                Outcome::Skipped(r) => serde_json::json!({"outcome": "skipped", "reason": r}),
            };
            (name.clone(), v)
        })
        .collect();
    let mut text = serde_json::to_string_pretty(&map)?;
    text.push('\n');
    fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// A copy's last outcomes in a topology: the run in `target/`, else (pristine only) the
/// committed baseline.
fn load(project: &Project, variant: Variant, topology: Topology) -> Result<Option<RunOutcomes>> {
    let stored = read_outcomes(&stored_path(project, variant, topology))?;
    if stored.is_some() || variant == Variant::Fork {
        return Ok(stored);
    }
    let baseline = read_outcomes(&baseline_path(project, topology))?;
    if baseline.is_some() {
        println!(
            "pristine ({}): the committed baseline {}",
            topology.name(),
            baseline_path(project, topology).display()
        );
    }
    Ok(baseline)
}

fn read_outcomes(path: &Path) -> Result<Option<RunOutcomes>> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let map: BTreeMap<String, serde_json::Value> = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a stored run", path.display()))?;
    let mut outcomes = RunOutcomes::new();
    for (name, v) in map {
        let reason = v["reason"].as_str().unwrap_or("").to_owned();
        let outcome = match v["outcome"].as_str() {
            Some("passed") => Outcome::Passed,
            Some("failed") => Outcome::Failed(reason),
            Some("skipped") => Outcome::Skipped(reason),
            _ => bail!("{}: test {name} has no outcome", path.display()),
        };
        outcomes.insert(name, outcome);
    }
    Ok(Some(outcomes))
}

/// Runs what `options` asks and returns every topology's results (stored runs of the other copy
/// included), in the order of [`Topology::ALL`].
pub fn command(ws: &Workspace, options: &Options) -> Result<Vec<TopologyResults>> {
    let project = &ws.project;
    let (tests_dir, tests_label) = resolve_tests_dir(project, std::env::var_os(TESTS_DIR_VAR))?;
    println!("upstream's tests: {tests_label}");
    let target_dir = work_dir(project).join("target");
    // `--report-only` runs no copy and needs neither nextest nor labd.
    let labd = if options.variants.is_empty() {
        PathBuf::new()
    } else {
        run::ensure_nextest()?;
        run::build_labd(project.root())?
    };

    for &variant in &options.variants {
        let dest = work_dir(project).join(variant.name());
        println!(
            "preparing the {} copy in {}",
            variant.name(),
            dest.display()
        );
        let krate = prepare::prepare_copy(ws, variant, &tests_dir, &tests_label, &dest)?;
        println!(
            "building upstream's tests on the {} copy (once; reused later)",
            variant.name()
        );
        run::build(&krate, &target_dir)?;
        let listed = run::list(&krate, &target_dir)?;
        for &topology in &options.topologies {
            let server = run::Labd::start(&labd, topology)?;
            println!(
                "running upstream's tests on {} against labd ({}) at {}",
                variant.name(),
                topology.name(),
                server.uri
            );
            let log = work_dir(project).join(format!("{}-{}.log", variant.name(), topology.name()));
            let ran = run::run(
                variant,
                topology,
                &krate,
                &target_dir,
                &server.uri,
                &options.filters,
                &log,
            )?;
            drop(server);
            let mut outcomes = RunOutcomes::new();
            for (name, reason) in &listed {
                let outcome = match (reason, ran.get(name)) {
                    (Some(reason), _) => Outcome::Skipped(reason.clone()),
                    (None, Some(o)) => o.clone(),
                    (None, None) if !options.filters.is_empty() => continue,
                    (None, None) => Outcome::Failed(format!(
                        "selected but nextest reported no result (see {})",
                        log.display()
                    )),
                };
                outcomes.insert(name.clone(), outcome);
            }
            if options.filters.is_empty() {
                store(project, variant, topology, &outcomes)?;
            } else {
                println!("(a filtered run is not stored or written to docs/results)");
                let results = TopologyResults {
                    topology: topology.name().to_owned(),
                    pristine: (variant == Variant::Pristine).then(|| outcomes.clone()),
                    fork: (variant == Variant::Fork).then(|| outcomes.clone()),
                };
                for line in report::summary_lines(&results) {
                    println!("{line}");
                }
            }
        }
    }
    if !options.filters.is_empty() {
        return Ok(Vec::new());
    }

    let mut all = Vec::new();
    for topology in Topology::ALL {
        let mut runs = Vec::new();
        for variant in [Variant::Pristine, Variant::Fork] {
            let mut outcomes = load(project, variant, topology)?;
            // A run stored in target/ is read against its JUnit report again, so that a
            // refined skip rule applies to runs made before it.
            let krate = work_dir(project).join(variant.name()).join("driver");
            let junit = run::junit_path(&krate, variant, topology);
            if let Some(o) = outcomes.as_mut() {
                if junit.is_file() && stored_path(project, variant, topology).is_file() {
                    run::mark_run_time_skips(&krate, variant, topology, o)?;
                    store(project, variant, topology, o)?;
                }
            }
            runs.push(outcomes);
        }
        let fork = runs.pop().flatten();
        let pristine = runs.pop().flatten();
        let results = TopologyResults {
            topology: topology.name().to_owned(),
            pristine,
            fork,
        };
        if results.pristine.is_some() || results.fork.is_some() {
            all.push(results);
        }
    }
    if options.write_results {
        let stamp = utc_stamp()?;
        let path = project
            .root()
            .join("docs")
            .join("results")
            .join(format!("{stamp}-upstream-tests.md"));
        let series = crate::series::read(project)?.len();
        let triage = fs::read_to_string(project.root().join("upstream-tests").join("TRIAGE.md"))
            .unwrap_or_default();
        let info = report::RunInfo {
            date: &stamp,
            tests_source: &tests_label,
            fork_series: &format!("pristine 3.9.1 + patches/series ({series} patches)"),
            command: "cargo xtask upstream-tests",
            triage: &triage,
        };
        fs::write(&path, report::render_markdown(&info, &all))
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("results: {}", path.display());
    }
    Ok(all)
}

/// `YYYY-MM-DD-HHMM` in UTC, from `date` (xtask has no date library).
fn utc_stamp() -> Result<String> {
    let out = Command::new("date")
        .args(["-u", "+%Y-%m-%d-%H%M"])
        .output()
        .context("cannot run `date`")?;
    ensure!(out.status.success(), "`date` failed");
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tests_dir_must_hold_upstreams_layout() {
        let project_dir = tempfile::tempdir().unwrap();
        let project = Project::new(project_dir.path());
        let err = resolve_tests_dir(&project, Some(project_dir.path().into())).unwrap_err();
        assert!(format!("{err:#}").contains("driver/src/test.rs"), "{err:#}");
        let tests = project_dir.path().join("t");
        for dir in ["driver/src/test", "spec", ".config"] {
            fs::create_dir_all(tests.join(dir)).unwrap();
        }
        fs::write(tests.join("driver/src/test.rs"), "").unwrap();
        fs::write(tests.join(".config/nextest.toml"), "").unwrap();
        fs::write(tests.join("SOURCE"), "commit: f050afa (2026)\n").unwrap();
        let (dir, label) = resolve_tests_dir(&project, Some(tests.clone().into())).unwrap();
        assert_eq!(dir, tests);
        assert!(label.contains("upstream f050afa"), "{label}");
    }

    #[test]
    fn known_regressions_are_topology_and_test_per_line() {
        let known =
            parse_known_regressions("# why\nreplicaset test::a # the reason\n\nsharded test::b\n")
                .unwrap();
        assert!(known.contains(&("replicaset".to_owned(), "test::a".to_owned())));
        assert!(known.contains(&("sharded".to_owned(), "test::b".to_owned())));
        assert_eq!(known.len(), 2);
        assert!(parse_known_regressions("replicaset\n").is_err());
        assert!(parse_known_regressions("replicaset a b\n").is_err());
        assert!(parse_known_regressions("loadbalanced test::a\n").is_err());
    }

    #[test]
    fn the_project_pins_an_upstream_commit() {
        assert_eq!(read_pin(&Project::from_build()).unwrap().len(), 40);
    }

    #[test]
    fn stored_runs_read_back_equal() {
        let project_dir = tempfile::tempdir().unwrap();
        let project = Project::new(project_dir.path());
        let mut outcomes = RunOutcomes::new();
        outcomes.insert("a".into(), Outcome::Passed);
        outcomes.insert("b".into(), Outcome::Failed("why".into()));
        outcomes.insert("c".into(), Outcome::Skipped("filter".into()));
        store(&project, Variant::Fork, Topology::Sharded, &outcomes).unwrap();
        assert_eq!(
            load(&project, Variant::Fork, Topology::Sharded).unwrap(),
            Some(outcomes)
        );
        assert_eq!(
            load(&project, Variant::Pristine, Topology::Sharded).unwrap(),
            None
        );
    }
}
