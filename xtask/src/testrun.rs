//! `cargo xtask test`: every test of the project, one final tally.
//!
//! Runs xtask's own tests, `cargo test --workspace` (which includes the spec suites, given the
//! directory [`resolve_spec_dir`] chose as `SPEC_DIR`; the driver's doctests left out), the fork's
//! doc examples in the driver ([`FORK_DOCTEST_FILTERS`]), and the patch-app example, then prints
//! `N passed, N failed, N skipped`.

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::io::{BufRead, BufReader};
use std::ops::AddAssign;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::dist::DistOptions;
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

/// Names that select the doc examples of the fork's public items among the driver's doctests
/// (libtest runs a test whose name contains any of them): everything in the fork's own files,
/// and the fork's fields and getters in upstream files (`ClientOptions::timeout`,
/// `ClientOptions::overload`, `Collection::timeout`, `SessionOptions::default_timeout`, …),
/// which upstream has no doc examples under (the builder setters of those fields repeat
/// `ClientOptions`'s own example, which runs too). No spaces: rustdoc splits test arguments at
/// whitespace. A run that selects none counts as a failure.
pub const FORK_DOCTEST_FILTERS: [&str; 4] =
    ["src/fork", "::timeout", "::overload", "::default_timeout"];

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
            // The driver has doctests on for the fork's examples only; upstream's would run
            // here too (hundreds, each compiled alone), so the next step runs the fork's by name.
            .args(["--exclude", "mongodb"])
            .env("SPEC_DIR", spec_dir);

        let mut fork_doctests = crate::project::cargo_command();
        fork_doctests
            .args(["test", "--doc", "-p", "mongodb", "--manifest-path"])
            .arg(root.join("Cargo.toml"))
            .arg("--")
            .args(FORK_DOCTEST_FILTERS);

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

        let title = "the fork's doc examples in the driver";
        let started = std::time::Instant::now();
        let (tally, ok) = run_step(title, fork_doctests)?;
        println!("{title}: {:.0?}", started.elapsed());
        if (!ok && tally.failed == 0) || tally.passed == 0 {
            // A build error, or filters that no longer select any example.
            broken.push(title);
            total.failed += 1;
        }
        total += tally;

        total += self.run_patch_app()?;
        total += self.check_bson_3_build()?;
        if !broken.is_empty() {
            eprintln!("failed to run: {}", broken.join(", "));
        }
        Ok(total)
    }

    /// Builds and runs the example application that swaps the fork in with `[patch.crates-io]`,
    /// through each way an application can take the fork: the path to `driver/` (as in
    /// examples/patch-app), and a release made by `cargo xtask dist` into a scratch repository,
    /// once by `git` and tag and once from its `.crate` file unpacked as a vendored directory.
    /// Each run must print the identity of the build it was given. Every app shares the
    /// workspace's target directory and starts from its lock file, so only the driver itself
    /// compiles again for each release form.
    pub fn run_patch_app(&self) -> Result<Tally> {
        let root = self.project.root();
        let upstream = self.project.upstream()?;
        let app = root.join("examples/patch-app");
        fs::copy(root.join("Cargo.lock"), app.join("Cargo.lock"))
            .context("cannot seed the patch-app lock file")?;
        let target = root.join("target");
        let mut tally = Tally::default();
        let path_identity = format!(
            "linked against mongodb-overload {} (upstream mongodb {})",
            crate::dist::overload_version(&self.project)?,
            upstream.version
        );
        tally += patch_app_way("path to driver/", &app, &target, &[&path_identity], false)?;

        let started = Instant::now();
        let proof = self.project.scratch_dir().join("dist-proof");
        crate::fork::remove_dir_if_exists(&proof)?;
        let repo = proof.join("releases.git");
        fs::create_dir_all(&repo)?;
        self.git.run(&repo, ["init", "--quiet", "--bare"])?;
        let options = DistOptions {
            repo: repo.clone(),
            out_dir: proof.join("crates"),
            verify: false,
        };
        let release = self.dist(&options)?;
        println!(
            "==> dist: {} on {} ({}), {}",
            release.tag,
            release.branch,
            release.commit,
            release.crate_file.display()
        );
        let again = self.dist(&options)?;
        let idempotent = !again.new_commit && again.commit == release.commit;
        println!(
            "dist again on unchanged sources: {}",
            if idempotent {
                "no new commit (ok)".to_owned()
            } else {
                format!("FAILED: made {}", again.commit)
            }
        );
        tally += Tally {
            passed: u64::from(idempotent),
            failed: u64::from(!idempotent),
            ..Tally::default()
        };
        println!("dist took {:.1} s", started.elapsed().as_secs_f64());

        let identity = format!(
            "linked against mongodb-overload {} (upstream mongodb {})",
            release.version, upstream.version
        );
        let handshake = format!("handshake fork version {}", release.version);
        let expected = [identity.as_str(), handshake.as_str()];
        let git_app = copy_app(
            &app,
            &proof.join("app-git"),
            &format!(
                "mongodb = {{ git = \"file://{}\", tag = \"{}\" }}",
                repo.display(),
                release.tag
            ),
            root,
        )?;
        tally += patch_app_way(
            "git = file://… with the release tag",
            &git_app,
            &target,
            &expected,
            true,
        )?;

        let vendor = proof.join("vendor");
        fs::create_dir_all(&vendor)?;
        let archive = fs::File::open(&release.crate_file)?;
        let mut unpacker = tar::Archive::new(flate2::read::GzDecoder::new(archive));
        // Fresh modification times: cargo fingerprints a path dependency by them, and the
        // archive's times could make an earlier run's build of another release look current.
        unpacker.set_preserve_mtime(false);
        unpacker
            .unpack(&vendor)
            .context("cannot unpack the release's .crate")?;
        let unpacked = vendor.join(format!("mongodb-{}", release.version));
        let crate_app = copy_app(
            &app,
            &proof.join("app-crate"),
            &format!("mongodb = {{ path = \"{}\" }}", unpacked.display()),
            root,
        )?;
        tally += patch_app_way(
            "the .crate file, vendored",
            &crate_app,
            &target,
            &expected,
            true,
        )?;
        println!(
            "patch-app through all three ways took {:.1} s",
            started.elapsed().as_secs_f64()
        );
        Ok(tally)
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

/// A copy of examples/patch-app whose `[patch.crates-io]` entry is `patch_line`, with the
/// workspace's lock file to start from.
fn copy_app(app: &Path, dest: &Path, patch_line: &str, root: &Path) -> Result<PathBuf> {
    let manifest = fs::read_to_string(app.join("Cargo.toml"))?;
    let (head, patch) = manifest
        .split_once("[patch.crates-io]")
        .context("examples/patch-app/Cargo.toml has no [patch.crates-io] section")?;
    let patch: Vec<&str> = patch
        .lines()
        .map(|line| {
            if line.trim_start().starts_with("mongodb =") {
                patch_line
            } else {
                line
            }
        })
        .collect();
    fs::create_dir_all(dest.join("src"))?;
    fs::write(
        dest.join("Cargo.toml"),
        format!("{head}[patch.crates-io]{}\n", patch.join("\n")),
    )?;
    fs::copy(app.join("src/main.rs"), dest.join("src/main.rs"))?;
    fs::copy(root.join("Cargo.lock"), dest.join("Cargo.lock"))?;
    Ok(dest.to_owned())
}

/// Builds and runs one patch-app; it passes when it exits 0 and prints every `expected` line.
/// With `moves_lock`, the app first does what an application does on taking a release: `cargo
/// fetch` (the only step that may use the network), then `cargo update -p mongodb` to move the
/// lock from upstream's version to the release's; the run itself is `--offline`.
fn patch_app_way(
    title: &str,
    app: &Path,
    target: &Path,
    expected: &[&str],
    moves_lock: bool,
) -> Result<Tally> {
    println!("==> patch-app through {title}");
    let started = Instant::now();
    let manifest = app.join("Cargo.toml");
    let cargo = |args: &[&str]| {
        let mut command = crate::project::cargo_command();
        command
            .args(args)
            .arg("--manifest-path")
            .arg(&manifest)
            .env("CARGO_TARGET_DIR", target)
            // The workspace's dev profile, which an app's own manifest does not inherit: with
            // the same debuginfo setting the dependencies `cargo test --workspace` just built
            // are reused, and only the driver compiles again.
            .env("CARGO_PROFILE_DEV_DEBUG", "line-tables-only")
            .stderr(Stdio::inherit());
        command
    };
    if moves_lock {
        for args in [
            &["fetch", "--quiet"][..],
            &["update", "--quiet", "--offline", "-p", "mongodb"],
        ] {
            let status = cargo(args).status().context("cannot run cargo")?;
            if !status.success() {
                println!("patch-app ({title}): FAILED at `cargo {}`", args.join(" "));
                return Ok(Tally {
                    failed: 1,
                    ..Tally::default()
                });
            }
        }
    }
    let out = cargo(&["run", "--quiet", "--offline"])
        .output()
        .context("cannot run cargo for the patch-app")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    let missing: Vec<&&str> = expected
        .iter()
        .chain(&["maxAdaptiveRetries=Some(3)"])
        .filter(|line| !stdout.lines().any(|l| l.contains(**line)))
        .collect();
    let ok = out.status.success() && missing.is_empty();
    if ok {
        println!(
            "patch-app ({title}): ok in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    } else {
        println!(
            "patch-app ({title}): FAILED (exit {}, missing {missing:?})",
            out.status
        );
    }
    Ok(Tally {
        passed: u64::from(ok),
        failed: u64::from(!ok),
        ..Tally::default()
    })
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
