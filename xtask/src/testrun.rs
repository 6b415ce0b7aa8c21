//! `cargo xtask test`: every test of the project, one final tally.
//!
//! Runs xtask's own tests, `cargo test --workspace` (which includes the spec suites, given the
//! directory [`resolve_spec_dir`] chose as `SPEC_DIR`), and the patch-app example, then prints
//! `N passed, N failed, N skipped`.

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::io::{BufRead, BufReader};
use std::ops::AddAssign;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::fork::{DriverOutcome, Workspace};
use crate::project::Project;
use crate::spec_fetch::{self, Fetcher};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub passed: u64,
    pub failed: u64,
    pub skipped: u64,
}

impl AddAssign for Tally {
    fn add_assign(&mut self, other: Self) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.skipped += other.skipped;
    }
}

/// Reads libtest's summary line (`test result: ok. 3 passed; 0 failed; 1 ignored; ...`), which
/// libtest-mimic harnesses print too. Ignored tests count as skipped.
pub fn parse_summary(line: &str) -> Option<Tally> {
    let rest = line.trim().strip_prefix("test result: ")?;
    let (_, counts) = rest.split_once(". ")?;
    let mut tally = Tally::default();
    for part in counts.split(';') {
        let mut words = part.split_whitespace();
        let (Some(n), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        match what {
            "passed" => tally.passed = n,
            "failed" => tally.failed = n,
            "ignored" => tally.skipped = n,
            _ => {}
        }
    }
    Some(tally)
}

/// Where a run's spec JSON came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpecOrigin {
    /// `SPEC_DIR`, which wins whenever it is set (CI sets it).
    EnvVar,
    /// `spec-tests/data`, filled by `cargo xtask sync-spec`.
    Synced,
    /// The commit pinned in `spec-tests/SPEC_COMMIT`, fetched by this run or by an earlier one.
    Pinned { commit: String, fetched: bool },
}

/// A directory holding the specifications' `source/`, and how it was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecData {
    pub dir: PathBuf,
    pub origin: SpecOrigin,
}

/// Finds the spec JSON, first match wins: `SPEC_DIR` when set (relative to the current
/// directory; it must hold `source/`, or the run stops rather than quietly using other data),
/// else `spec-tests/data` when it holds `source/`, else the pinned specifications commit, from
/// the cache or fetched into it.
pub fn resolve_spec_dir(
    project: &Project,
    env: Option<OsString>,
    fetcher: &Fetcher,
) -> Result<SpecData> {
    if let Some(dir) = env.filter(|dir| !dir.is_empty()) {
        let dir = PathBuf::from(dir);
        let absolute = if dir.is_absolute() {
            dir
        } else {
            std::env::current_dir()?.join(dir)
        };
        let dir = absolute
            .canonicalize()
            .with_context(|| format!("SPEC_DIR={} does not exist", absolute.display()))?;
        if !dir.join("source").is_dir() {
            bail!(
                "SPEC_DIR={} holds no spec test data (expected a `source/` directory): point it \
                 at a checkout of the specifications repository, or unset it to use the pinned \
                 commit",
                dir.display()
            );
        }
        return Ok(SpecData {
            dir,
            origin: SpecOrigin::EnvVar,
        });
    }
    let synced = project.root().join("spec-tests").join("data");
    if synced.join("source").is_dir() {
        return Ok(SpecData {
            dir: synced,
            origin: SpecOrigin::Synced,
        });
    }
    let commit = spec_fetch::read_pin(project)?;
    let cached = fetcher.ensure(project, &commit)?;
    Ok(SpecData {
        dir: cached.dir,
        origin: SpecOrigin::Pinned {
            commit,
            fetched: cached.fetched,
        },
    })
}

impl fmt::Display for SpecData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dir = self.dir.display();
        match &self.origin {
            SpecOrigin::EnvVar => write!(f, "{dir} (SPEC_DIR)"),
            SpecOrigin::Synced => write!(f, "{dir} (copied by `cargo xtask sync-spec`)"),
            SpecOrigin::Pinned {
                commit,
                fetched: true,
            } => write!(f, "{dir} (specifications commit {commit}, fetched now)"),
            SpecOrigin::Pinned {
                commit,
                fetched: false,
            } => write!(f, "{dir} (specifications commit {commit}, cached)"),
        }
    }
}

struct Step<'a> {
    title: &'a str,
    command: Command,
}

impl Workspace {
    pub fn test(&self, spec_dir: &Path) -> Result<Tally> {
        match self.build_driver(false)? {
            DriverOutcome::UpToDate => println!("driver/ is up to date"),
            DriverOutcome::Built { patches } => println!("built driver/ with {patches} patches"),
        }
        let root = self.project.root();
        let mut xtask_tests = crate::project::cargo_command();
        xtask_tests
            .args(["test", "--manifest-path"])
            .arg(root.join("xtask/Cargo.toml"));

        let mut workspace_tests = crate::project::cargo_command();
        workspace_tests
            .args(["test", "--workspace", "--no-fail-fast", "--manifest-path"])
            .arg(root.join("Cargo.toml"))
            .env("SPEC_DIR", spec_dir);

        let mut total = Tally::default();
        let mut broken = Vec::new();
        for step in [
            Step {
                title: "xtask's own tests",
                command: xtask_tests,
            },
            Step {
                title: "workspace tests and spec suites",
                command: workspace_tests,
            },
        ] {
            let (tally, ok) = run_step(step.title, step.command)?;
            if !ok && tally.failed == 0 {
                // Cargo failed without a failing test: a build error, or a harness that exited
                // early. Count it, or a broken build would look like a clean run.
                broken.push(step.title);
                total.failed += 1;
            }
            total += tally;
        }

        total += self.run_patch_app()?;
        total += self.check_bson_3_build()?;
        if !broken.is_empty() {
            eprintln!("failed to run: {}", broken.join(", "));
        }
        Ok(total)
    }

    /// Builds the example application that swaps the fork in with `[patch.crates-io]` and checks
    /// that it reports the fork's identity. It shares the workspace's target directory and starts
    /// from the workspace's lock file, so it reuses the driver build instead of compiling it again.
    fn run_patch_app(&self) -> Result<Tally> {
        let root = self.project.root();
        let app = root.join("examples/patch-app");
        fs::copy(root.join("Cargo.lock"), app.join("Cargo.lock"))
            .context("cannot seed the patch-app lock file")?;
        println!("==> patch-app (mongodb = \"3\" with [patch.crates-io] to the fork)");
        let out = crate::project::cargo_command()
            .args(["run", "--quiet", "--manifest-path"])
            .arg(app.join("Cargo.toml"))
            .env("CARGO_TARGET_DIR", root.join("target"))
            .stderr(Stdio::inherit())
            .output()
            .context("cannot run cargo for the patch-app")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        print!("{stdout}");
        let identified = out.status.success() && stdout.contains("mongodb-overload");
        if identified {
            println!("patch-app: ok");
            Ok(Tally {
                passed: 1,
                ..Tally::default()
            })
        } else {
            println!("patch-app: FAILED (it must exit 0 and print the fork identity)");
            Ok(Tally {
                failed: 1,
                ..Tally::default()
            })
        }
    }

    /// Type-checks the fork with upstream's public `bson-3` feature, which swaps the bson major
    /// and with it some internal types (a command name is a `CStr` there, a `str` by default).
    /// The workspace builds only the default features, so without this step a patch that works
    /// with bson 2 can break every application that enables `bson-3`.
    fn check_bson_3_build(&self) -> Result<Tally> {
        let root = self.project.root();
        println!("==> the fork with upstream's bson-3 feature");
        let status = crate::project::cargo_command()
            .args([
                "check",
                "--quiet",
                "--lib",
                "-p",
                "mongodb",
                "--features",
                "bson-3",
            ])
            .arg("--manifest-path")
            .arg(root.join("Cargo.toml"))
            .status()
            .context("cannot run cargo check for the bson-3 build")?;
        let ok = status.success();
        println!("bson-3 build: {}", if ok { "ok" } else { "FAILED" });
        Ok(Tally {
            passed: u64::from(ok),
            failed: u64::from(!ok),
            ..Tally::default()
        })
    }
}

/// Runs one cargo command, echoing its output and adding up the summaries it prints.
fn run_step(title: &str, mut command: Command) -> Result<(Tally, bool)> {
    println!("==> {title}");
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start cargo for {title}"))?;
    let mut tally = Tally::default();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            println!("{line}");
            if let Some(summary) = parse_summary(&line) {
                tally += summary;
            }
        }
    }
    let status = child.wait()?;
    Ok((tally, status.success()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libtest_summaries() {
        let line = "test result: FAILED. 12 passed; 2 failed; 3 ignored; 0 measured; 5 filtered out; finished in 0.20s";
        assert_eq!(
            parse_summary(line),
            Some(Tally {
                passed: 12,
                failed: 2,
                skipped: 3
            })
        );
        assert_eq!(parse_summary("running 3 tests"), None);
        assert_eq!(
            parse_summary(
                "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out"
            ),
            Some(Tally::default())
        );
    }

    #[test]
    fn spec_dir_wins_and_must_hold_source() {
        let project_dir = tempfile::tempdir().unwrap();
        let project = Project::new(project_dir.path());
        // No fetch may happen while SPEC_DIR or spec-tests/data answers: this URL cannot work.
        let offline = Fetcher {
            git: "git".into(),
            url: "file:///nonexistent/specifications".into(),
        };
        let err = resolve_spec_dir(&project, Some("/nonexistent/spec".into()), &offline)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("SPEC_DIR=/nonexistent/spec does not exist"),
            "{err}"
        );
        let err = resolve_spec_dir(&project, Some(project_dir.path().into()), &offline)
            .unwrap_err()
            .to_string();
        assert!(err.contains("holds no spec test data"), "{err}");

        fs::create_dir_all(project_dir.path().join("spec/source")).unwrap();
        fs::create_dir_all(project_dir.path().join("spec-tests/data/source")).unwrap();
        let found = resolve_spec_dir(
            &project,
            Some(project_dir.path().join("spec").into()),
            &offline,
        )
        .unwrap();
        assert_eq!(found.origin, SpecOrigin::EnvVar);
        assert!(found.dir.is_absolute() && found.dir.ends_with("spec"));

        // Unset, or set to nothing: spec-tests/data comes next.
        for env in [None, Some(OsString::new())] {
            let found = resolve_spec_dir(&project, env, &offline).unwrap();
            assert_eq!(found.origin, SpecOrigin::Synced);
            assert!(found.dir.ends_with("spec-tests/data"));
        }
    }
}
