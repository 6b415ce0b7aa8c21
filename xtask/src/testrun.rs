//! `cargo xtask test`: every test of the project, one final tally.
//!
//! Runs xtask's own tests, `cargo test --workspace` (which includes the spec suites, reading
//! `SPEC_DIR`), and the patch-app example, then prints `N passed, N failed, N skipped`.

use std::ffi::OsString;
use std::fs;
use std::io::{BufRead, BufReader};
use std::ops::AddAssign;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::fork::{DriverOutcome, Workspace};

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

/// Where the spec JSON is: `SPEC_DIR` (relative to the current directory) when set, else
/// `spec-tests/data`. Either must hold a `source/` directory, or nothing could be run.
pub fn resolve_spec_dir(project_root: &Path, env: Option<OsString>) -> Result<PathBuf> {
    let dir = match env {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            let absolute = if dir.is_absolute() {
                dir
            } else {
                std::env::current_dir()?.join(dir)
            };
            absolute
                .canonicalize()
                .with_context(|| format!("SPEC_DIR={} does not exist", absolute.display()))?
        }
        None => project_root.join("spec-tests").join("data"),
    };
    if !dir.join("source").is_dir() {
        bail!(
            "no spec test data in {} (expected a `source/` directory): set SPEC_DIR to a checkout of \
             the specifications repository, or run `cargo xtask sync-spec <dir>`",
            dir.display()
        );
    }
    Ok(dir)
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

        let app = self.run_patch_app()?;
        total += app;
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
    fn spec_dir_must_hold_source() {
        let empty = tempfile::tempdir().unwrap();
        let err = resolve_spec_dir(empty.path(), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no spec test data"), "{err}");
        let err = resolve_spec_dir(empty.path(), Some("/nonexistent/spec".into()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("SPEC_DIR=/nonexistent/spec does not exist"),
            "{err}"
        );

        fs::create_dir_all(empty.path().join("spec/source")).unwrap();
        let found = resolve_spec_dir(empty.path(), Some(empty.path().join("spec").into())).unwrap();
        assert!(found.is_absolute() && found.join("source").is_dir());
    }
}
