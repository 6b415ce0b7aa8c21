//! `cargo xtask mutants`: builds the fork with one named, deliberate defect at a time and runs the
//! spec, prose and defect suites against it, to show that the suites catch each defect.
//!
//! A mutant is the fork's driver (pristine upstream plus `patches/series`) and `overload/`, with
//! some patches left out of the series and some source text replaced. A replacement names the
//! exact text it expects to find once; when the driver or the policy crate changes so that the
//! text is gone or appears twice, the mutant fails loudly instead of quietly testing nothing.
//! `cargo xtask check` verifies every mutant against the current sources; `cargo xtask mutants
//! --check` also applies each mutant's reduced series to pristine upstream.
//!
//! Runs happen in a copy of the project, `target/mutants/project/`, never in `driver/` or the
//! working tree: the copy is rewritten file by file for each mutant, so only the files a mutant
//! changes look new to cargo, and every mutant builds in the same target directory,
//! `target/mutants/target/`, so the driver is rebuilt incrementally. The unmodified
//! fork runs first, as the control: a test that fails there says nothing about a mutant. A
//! mutant counts as caught only when one of its failing tests fails again when rerun alone.
//! See docs/mutants.md.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::fork::{base_message, remove_dir_if_exists, Workspace};
use crate::pristine;
use crate::series;

/// One source replacement: in `path` (relative to the project root, under `driver/` or
/// `overload/`), the text `find`, which must occur exactly once, becomes `replace`.
#[derive(Debug)]
pub struct Edit {
    pub path: &'static str,
    pub find: &'static str,
    pub replace: &'static str,
}

/// A named defect: the fork without some of its patches and with some source edits.
#[derive(Debug)]
pub struct Mutant {
    pub name: &'static str,
    /// What the defect is, in one sentence, for the listing and the report.
    pub defect: &'static str,
    /// Patch files left out of the series (each must be in it).
    pub drop_patches: &'static [&'static str],
    pub edits: &'static [Edit],
}

/// Every mutant, in the order a run takes them. docs/mutants.md explains each.
pub const MUTANTS: &[Mutant] = &[
    Mutant {
        name: "retryable-error-alone",
        defect: "an error labelled RetryableError without SystemOverloadedError is taken for a \
                 retryable overload error",
        drop_patches: &[],
        edits: &[Edit {
            path: "overload/src/labels.rs",
            find: "(false, _) => Self::None,",
            replace: "(false, true) => Self::Retryable,\n            (false, false) => Self::None,",
        }],
    },
    Mutant {
        name: "no-backoff",
        defect: "retries after overload errors do not wait: the backoff is always zero",
        drop_patches: &[],
        edits: &[Edit {
            path: "overload/src/retry.rs",
            find: "self.backoff\n            .delay(self.retry_number(), self.last.server_base, jitter)",
            replace: "let _ = jitter;\n        Duration::ZERO",
        }],
    },
    Mutant {
        name: "third-retry",
        defect: "the overload retry cap is off by one: maxAdaptiveRetries + 1 retries",
        drop_patches: &[],
        edits: &[Edit {
            path: "overload/src/retry.rs",
            find: "self.max_retries = self.max_adaptive_retries;",
            replace: "self.max_retries = self.max_adaptive_retries.saturating_add(1);",
        }],
    },
    Mutant {
        name: "no-handshake-backpressure",
        defect: "hello and the handshake no longer carry the `backpressure` field",
        drop_patches: &[],
        edits: &[Edit {
            path: "driver/src/hello.rs",
            find: "    body.append(cstr!(\"backpressure\"), \"2\");\n",
            replace: "",
        }],
    },
    Mutant {
        name: "b1-reverted",
        defect: "defect B1 is back: create, drop, dropDatabase and the search-index commands are \
                 not retried on overload",
        drop_patches: &["retry-collection-database-and-search-index-commands-on-overload.patch"],
        edits: &[],
    },
    Mutant {
        name: "b2-reverted",
        defect: "defect B2 is back: a client bulkWrite whose results getMore failed for overload \
                 is sent again",
        // A later patch builds on this one's module, so the fix is undone at its call site
        // rather than by dropping the patch.
        drop_patches: &[],
        edits: &[Edit {
            path: "driver/src/operation/bulk_write.rs",
            find: ".with_source(iteration_result.err().map(crate::fork::bulk_write::unretryable));",
            replace: ".with_source(iteration_result.err());",
        }],
    },
    Mutant {
        name: "retargeting-ignored",
        defect: "enableOverloadRetargeting is ignored: overload retries go back to the server \
                 that failed",
        drop_patches: &[],
        edits: &[Edit {
            path: "driver/src/client/executor/retry.rs",
            find: "if client.is_sharded() || overloaded && enable_overload_retargeting {",
            replace: "if client.is_sharded() {",
        }],
    },
    Mutant {
        name: "server-base-ignored",
        defect: "the server's baseBackoffMS is ignored; the backoff always starts from 100 ms",
        drop_patches: &[],
        edits: &[Edit {
            path: "driver/src/fork/retry.rs",
            find: "Failure::new(Overload::of(labels), server_base)",
            replace: "Failure::new(Overload::of(labels), server_base.filter(|_| false))",
        }],
    },
    Mutant {
        name: "pinned-get-more-not-retried",
        defect: "the second half of B1 is back: in load-balanced mode the client bulkWrite results \
                 getMore on its pinned connection is not retried on overload",
        // Later patches touch the module list this patch extends, so the fix is undone inside
        // the pinned retry loop: no command is allowed to run again on its pinned connection.
        drop_patches: &[],
        edits: &[Edit {
            path: "driver/src/fork/pinned_retry.rs",
            find: "let allowed = op.is_backpressure_retryable(self.options());",
            replace: "let allowed = false && op.is_backpressure_retryable(self.options());",
        }],
    },
    Mutant {
        name: "cap-not-sticky",
        defect: "the adaptive cap is forgotten after an ordinary error that follows an overload \
                 error, so the operation gets only the ordinary single retry",
        drop_patches: &[],
        edits: &[Edit {
            path: "overload/src/retry.rs",
            find: "self.max_retries = self.max_adaptive_retries;\n        }\n",
            replace: "self.max_retries = self.max_adaptive_retries;\n        } else {\n            \
                      self.max_retries = MAX_ORDINARY_RETRIES;\n        }\n",
        }],
    },
    Mutant {
        name: "overload-label-alone",
        defect: "an error labelled SystemOverloadedError without RetryableError is taken for a \
                 retryable overload error, so commands the server did not allow are sent again",
        drop_patches: &[],
        edits: &[Edit {
            path: "overload/src/labels.rs",
            find: "(true, false) => Self::NotRetryable,",
            replace: "(true, false) => Self::Retryable,",
        }],
    },
    Mutant {
        name: "budget-refusal-ignored",
        defect: "the controller asks the retry budget but sends the retry it refused",
        drop_patches: &[],
        edits: &[Edit {
            path: "overload/src/control/mod.rs",
            find: "if !budget.has_credit_at(RetryOrigin::Driver, Some(question.operation), now) {",
            replace: "if !budget.has_credit_at(RetryOrigin::Driver, Some(question.operation), now) \
                      && false {",
        }],
    },
    Mutant {
        name: "budget-shedding-ignored",
        defect: "the retry budget keeps admitting retries while the client's servers reject most \
                 of its attempts for overload",
        drop_patches: &[],
        edits: &[Edit {
            path: "overload/src/budget/handle.rs",
            find: ".is_some_and(|acceptance| !acceptance.mostly_accepted(now))",
            replace: ".is_some_and(|acceptance| !acceptance.mostly_accepted(now) && false)",
        }],
    },
    Mutant {
        name: "budget-never-charged",
        defect: "a retry the budget admitted is sent without being paid for, so the budget never \
                 runs dry",
        drop_patches: &[],
        edits: &[Edit {
            path: "overload/src/control/mod.rs",
            find: "if !budget.withdraw_at(RetryOrigin::Driver, Some(operation), now) {",
            replace: "if false {",
        }],
    },
    Mutant {
        name: "budget-refund-ignored",
        defect: "an operation that succeeds after retries keeps them charged, so transient errors \
                 above the budget's share starve retries again",
        drop_patches: &[],
        edits: &[Edit {
            path: "driver/src/fork/control.rs",
            find: "        client.fork_control().succeeded(&retry.policy, now());\n",
            replace: "",
        }],
    },
    Mutant {
        name: "budget-no-deposit",
        defect: "first attempts no longer fund the retry budget: only its reserve admits retries",
        drop_patches: &[],
        edits: &[Edit {
            path: "driver/src/fork/control.rs",
            find: "        control.deposit(now());\n",
            replace: "",
        }],
    },
    Mutant {
        name: "throttle-deaf",
        defect: "the adaptive throttle never hears of the overload errors its first attempts met, \
                 so it never rejects",
        drop_patches: &[],
        edits: &[Edit {
            path: "overload/src/control/admission.rs",
            find: "                    _ if overloaded => throttle.record_overload(now),\n",
            replace: "                    _ if overloaded => {}\n",
        }],
    },
    Mutant {
        name: "throttle-decides-retries",
        defect: "the adaptive throttle decides retries too, not only first attempts",
        drop_patches: &[],
        edits: &[Edit {
            path: "overload/src/control/admission.rs",
            find: "let throttled = kind == super::AttemptKind::First\n",
            replace: "let throttled = kind != super::AttemptKind::InTransaction\n",
        }],
    },
    Mutant {
        name: "slot-wait-endless",
        defect: "a wait for a concurrency slot never ends at its deadline or at \
                 serverSelectionTimeoutMS",
        drop_patches: &[],
        edits: &[Edit {
            path: "overload/src/control/admission.rs",
            find: "Some(end) if now >= end => {",
            replace: "Some(end) if now >= end && false => {",
        }],
    },
    Mutant {
        name: "failed-checkout-sampled",
        defect: "a connection checkout that failed releases its concurrency slot as an answer \
                 after 0 ms, a false fast latency sample",
        drop_patches: &[],
        edits: &[Edit {
            path: "overload/src/control/admission.rs",
            find: "(AttemptEnd::Failed { replied: false, .. }, _) | (_, None) => Outcome::Abandoned,\n\
                   \x20           (_, Some(latency)) => Outcome::Answered(latency),",
            replace: "(AttemptEnd::Failed { replied: false, .. }, Some(_)) => Outcome::Abandoned,\n\
                      \x20           (_, latency) => Outcome::Answered(latency.unwrap_or_default()),",
        }],
    },
    Mutant {
        name: "retry-ignores-deadline",
        defect: "the retry gates do not see the operation's timeoutMS deadline, so a backoff that \
                 passes it is slept",
        drop_patches: &[],
        edits: &[Edit {
            path: "driver/src/fork/control.rs",
            find: "        server: Some(&pending.failed_server),\n        deadline,\n",
            replace: "        server: Some(&pending.failed_server),\n        \
                      deadline: deadline.filter(|_| false),\n",
        }],
    },
    Mutant {
        name: "timeout-precedence-reversed",
        defect: "a collection's or database's timeoutMS wins over the operation's own",
        drop_patches: &[],
        edits: &[Edit {
            path: "overload/src/control/mod.rs",
            find: ".operation\n            .or(timeouts.target)",
            replace: ".target\n            .or(timeouts.operation)",
        }],
    },
];

/// The test targets of `spec-tests` a mutant runs against, in order.
pub const SUITES: &[&str] = &[
    "spec",
    "prose",
    "defects",
    "controller",
    "admission",
    "budget",
    "timeouts",
];

/// The longest one suite may run against one build; the control took about 80 s for the first
/// three, and the wiring suites (controller, admission, budget, timeouts) add about 25 s.
const SUITE_TIMEOUT: Duration = Duration::from_secs(900);

/// How many of a mutant's failing tests are rerun alone to confirm that it is caught.
const CONFIRM_AT_MOST: usize = 3;

/// The mutants with these names, in the order given; all of them when `names` is empty.
pub fn select(names: &[String]) -> Result<Vec<&'static Mutant>> {
    if names.is_empty() {
        return Ok(MUTANTS.iter().collect());
    }
    names
        .iter()
        .map(|name| {
            MUTANTS.iter().find(|m| m.name == name).with_context(|| {
                let known: Vec<&str> = MUTANTS.iter().map(|m| m.name).collect();
                format!("no mutant `{name}`; known: {}", known.join(", "))
            })
        })
        .collect()
}

/// `text` with `edit` applied; fails unless `edit.find` occurs exactly once.
pub fn apply_edit(text: &str, edit: &Edit) -> Result<String> {
    let count = text.matches(edit.find).count();
    ensure!(
        count == 1,
        "{}: expected the text to replace exactly once, found it {count} times:\n{}",
        edit.path,
        edit.find
    );
    Ok(text.replacen(edit.find, edit.replace, 1))
}

/// The file an edit applies to, given where the mutant's driver and the project are.
fn edit_target(edit: &Edit, driver: &Path, project: &Path) -> Result<PathBuf> {
    match edit.path.strip_prefix("driver/") {
        Some(rest) => Ok(driver.join(rest)),
        None if edit.path.starts_with("overload/") => Ok(project.join(edit.path)),
        None => bail!("{}: a mutant edits driver/ or overload/ only", edit.path),
    }
}

/// Problems with the mutants' definitions against this driver tree (the series applied) and
/// project: dropped patches missing from the series, edits whose text is not there exactly once.
pub fn problems(driver: &Path, project: &Path, series_files: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    for mutant in MUTANTS {
        for patch in mutant.drop_patches {
            if !series_files.iter().any(|f| f == patch) {
                problems.push(format!(
                    "mutant {}: drops {patch}, which is not in patches/series",
                    mutant.name
                ));
            }
        }
        // Edits of a mutant that also drops patches are checked on its own series only
        // (`cargo xtask mutants --check`): the full series may differ there.
        if !mutant.drop_patches.is_empty() {
            continue;
        }
        for edit in mutant.edits {
            let result = edit_target(edit, driver, project).and_then(|path| {
                let text = fs::read_to_string(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                apply_edit(&text, edit)
            });
            if let Err(err) = result {
                problems.push(format!("mutant {}: {err:#}", mutant.name));
            }
        }
    }
    problems
}

/// What one run of the suites against one build gave.
#[derive(Debug, Default)]
pub struct SuiteRun {
    /// Failing tests per suite, in the order they failed.
    pub failed: BTreeMap<String, Vec<String>>,
    /// Suites whose test binary exited unsuccessfully without naming a failing test.
    pub crashed: Vec<String>,
    pub passed: u64,
}

/// The verdict on one mutant.
#[derive(Debug)]
pub enum Verdict {
    /// These tests failed on the mutant and not on the control; `confirmed` of them failed
    /// again alone.
    Caught {
        tests: BTreeMap<String, Vec<String>>,
        confirmed: Vec<String>,
    },
    /// No test failed that passed on the control.
    Survived,
    /// Tests failed, but none failed again when rerun alone.
    Unconfirmed {
        tests: BTreeMap<String, Vec<String>>,
    },
}

impl Verdict {
    pub fn caught(&self) -> bool {
        matches!(self, Verdict::Caught { .. })
    }
}

/// Reads libtest's (and libtest-mimic's) per-test line `test <name> ... FAILED`. libtest-mimic
/// pads names to a common width; the padding is not part of the name `--exact` matches.
pub fn failed_test_name(line: &str) -> Option<&str> {
    Some(
        line.strip_prefix("test ")?
            .strip_suffix(" ... FAILED")?
            .trim_end(),
    )
}

/// The scratch directories of a run, all under `target/mutants/`.
struct Scratch {
    /// The project copy the suites build and run in.
    project: PathBuf,
    /// The copy's own target directory, kept between runs. Not the project's: cargo names a
    /// workspace member's artifacts by its path relative to the workspace root, so the copy's
    /// builds would overwrite the project's, and cargo could even take the one's artifacts as
    /// fresh for the other (it checks the sources the last build read, in the other tree).
    target: PathBuf,
    /// Where each mutant's driver is assembled before it is copied into the project.
    stage: PathBuf,
}

impl Workspace {
    /// Makes `dest` (which must not exist) a git repository holding pristine upstream plus the
    /// series without the patches `mutant` drops.
    fn mutant_driver(&self, mutant: Option<&Mutant>, dest: &Path) -> Result<()> {
        let upstream = self.project.upstream()?;
        let patches = series::read(&self.project)?;
        let drops = mutant.map(|m| m.drop_patches).unwrap_or_default();
        for drop in drops {
            ensure!(
                patches.iter().any(|p| p.file == *drop),
                "mutant drops {drop}, which is not in patches/series"
            );
        }
        pristine::unpack_verified(self.source.as_ref(), &upstream, dest)?;
        self.git.init_base(dest, &base_message(&upstream))?;
        for patch in patches.iter().filter(|p| !drops.contains(&p.file.as_str())) {
            self.git
                .am(dest, &self.project.patches_dir().join(&patch.file))
                .with_context(|| {
                    format!(
                        "patches/{} does not apply without {}",
                        patch.file,
                        drops.join(", ")
                    )
                })?;
        }
        Ok(())
    }

    /// `cargo xtask mutants --check`: every mutant's series applies to pristine upstream and
    /// every edit finds its text exactly once. Returns the problems found.
    pub fn check_mutants(&self) -> Result<Vec<String>> {
        self.git.ensure_available()?;
        let mut problems = Vec::new();
        for mutant in MUTANTS {
            let scratch = tempfile::tempdir()?;
            let driver = scratch.path().join("driver");
            if let Err(err) = self.mutant_driver(Some(mutant), &driver) {
                problems.push(format!("mutant {}: {err:#}", mutant.name));
                continue;
            }
            for edit in mutant.edits {
                let result = edit_target(edit, &driver, self.project.root()).and_then(|path| {
                    apply_edit(&fs::read_to_string(&path)?, edit)
                        .with_context(|| format!("in {}", path.display()))
                });
                if let Err(err) = result {
                    problems.push(format!("mutant {}: {err:#}", mutant.name));
                }
            }
        }
        Ok(problems)
    }

    fn scratch(&self) -> Scratch {
        let root = self.project.root().join("target").join("mutants");
        Scratch {
            project: root.join("project"),
            target: root.join("target"),
            stage: root.join("stage"),
        }
    }

    /// The project's files as git sees them (tracked and untracked, not ignored), relative to
    /// the root, without `driver/` (generated) — so a run tests uncommitted tests too.
    fn project_files(&self) -> Result<Vec<PathBuf>> {
        let root = self.project.root();
        let listing = self.git.run(
            root,
            [
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
        )?;
        Ok(listing
            .split('\0')
            .filter(|p| !p.is_empty() && !p.starts_with("driver/") && !p.starts_with("target/"))
            .map(PathBuf::from)
            // A tracked file deleted in the working tree is listed but gone.
            .filter(|p| root.join(p).is_file())
            .collect())
    }

    /// Lays out the project copy for `mutant` (the control when `None`) and returns it.
    fn prepare(&self, mutant: Option<&Mutant>, scratch: &Scratch) -> Result<()> {
        remove_dir_if_exists(&scratch.stage)?;
        let driver = scratch.stage.join("driver");
        self.mutant_driver(mutant, &driver)?;

        let mut wanted: BTreeMap<PathBuf, Vec<u8>> = BTreeMap::new();
        for rel in self.project_files()? {
            let bytes = fs::read(self.project.root().join(&rel))?;
            wanted.insert(rel, bytes);
        }
        for file in walk(&driver)? {
            let rel = file.strip_prefix(&driver)?;
            if rel.starts_with(".git") {
                continue;
            }
            wanted.insert(Path::new("driver").join(rel), fs::read(&file)?);
        }
        for edit in mutant.map(|m| m.edits).unwrap_or_default() {
            let rel = PathBuf::from(edit.path);
            let bytes = wanted
                .get(&rel)
                .with_context(|| format!("{} is not in the project", edit.path))?;
            let text = String::from_utf8(bytes.clone())
                .with_context(|| format!("{} is not UTF-8", edit.path))?;
            wanted.insert(rel, apply_edit(&text, edit)?.into_bytes());
        }
        sync(&wanted, &scratch.project)
    }

    /// Builds the suites in the project copy; a build failure is an error (a mutant that does
    /// not compile tests nothing).
    fn build_suites(&self, scratch: &Scratch) -> Result<()> {
        let out = self
            .suite_command(scratch, None)
            .arg("--no-run")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .context("cannot run cargo")?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
            bail!(
                "the suites do not build:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        Ok(())
    }

    /// `cargo test -p spec-tests` in the project copy, for one suite or (building) all.
    fn suite_command(&self, scratch: &Scratch, suite: Option<&str>) -> Command {
        let mut command = crate::project::cargo_command();
        command
            .current_dir(&scratch.project)
            // Not `--quiet`: cargo would pass it on, and libtest's terse output names no test.
            .args(["test", "-p", "spec-tests", "--manifest-path"])
            .arg(scratch.project.join("Cargo.toml"));
        match suite {
            Some(suite) => {
                command.args(["--test", suite]);
            }
            None => {
                for suite in SUITES {
                    command.args(["--test", suite]);
                }
            }
        }
        // One target directory for every mutant, so each rebuilds only what it changed.
        command.env("CARGO_TARGET_DIR", &scratch.target);
        command
    }

    /// Runs every suite and collects the failing tests.
    fn run_suites(&self, scratch: &Scratch, spec_dir: &Path) -> Result<SuiteRun> {
        let mut run = SuiteRun::default();
        for suite in SUITES {
            let mut command = self.suite_command(scratch, Some(suite));
            command
                .env("SPEC_DIR", spec_dir)
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            own_process_group(&mut command);
            let mut child = command.spawn().context("cannot run cargo test")?;
            // The output is read on a thread so that a mutant that makes a test hang cannot
            // stall the run: past the deadline the suite's process group is killed.
            let (lines_tx, lines_rx) = std::sync::mpsc::channel();
            let reader = child.stdout.take().map(|stdout| {
                std::thread::spawn(move || {
                    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                        if lines_tx.send(line).is_err() {
                            break;
                        }
                    }
                })
            });
            let deadline = Instant::now() + SUITE_TIMEOUT;
            let mut failed = Vec::new();
            let mut timed_out = false;
            loop {
                match lines_rx.recv_timeout(Duration::from_millis(200)) {
                    Ok(line) => {
                        if let Some(name) = failed_test_name(&line) {
                            failed.push(name.to_owned());
                        }
                        if let Some(tally) = crate::testrun::parse_summary(&line) {
                            run.passed += tally.passed;
                        }
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                }
                if Instant::now() >= deadline {
                    kill_group(&mut child);
                    timed_out = true;
                    break;
                }
            }
            let status = child.wait()?;
            if let Some(reader) = reader {
                if !timed_out {
                    let _ = reader.join();
                }
            }
            if timed_out {
                failed.push(format!("(timed out after {}s)", SUITE_TIMEOUT.as_secs()));
            } else if !status.success() && failed.is_empty() {
                run.crashed.push((*suite).to_owned());
            }
            if !failed.is_empty() {
                run.failed.insert((*suite).to_owned(), failed);
            }
        }
        Ok(run)
    }

    /// Whether `test` of `suite` fails when run alone.
    fn fails_alone(
        &self,
        scratch: &Scratch,
        spec_dir: &Path,
        suite: &str,
        test: &str,
    ) -> Result<bool> {
        let mut command = self.suite_command(scratch, Some(suite));
        command
            .env("SPEC_DIR", spec_dir)
            .args(["--", "--exact", test])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        own_process_group(&mut command);
        let mut child = command.spawn().context("cannot run cargo test")?;
        let deadline = Instant::now() + SUITE_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(!status.success());
            }
            if Instant::now() >= deadline {
                // Hanging again alone is failing again.
                kill_group(&mut child);
                let _ = child.wait();
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs the control and then each mutant; prints progress and returns the report.
    pub fn run_mutants(&self, mutants: &[&Mutant], spec_dir: &Path) -> Result<Report> {
        self.git.ensure_available()?;
        let scratch = self.scratch();
        println!("==> control: the fork as patches/series builds it");
        let started = Instant::now();
        self.prepare(None, &scratch)?;
        self.build_suites(&scratch).context("control")?;
        let control = self.run_suites(&scratch, spec_dir)?;
        let control_failures: BTreeSet<(String, String)> = control
            .failed
            .iter()
            .flat_map(|(suite, tests)| tests.iter().map(move |t| (suite.clone(), t.clone())))
            .collect();
        println!(
            "    {} passed, {} failed{} ({:.0?})",
            control.passed,
            control_failures.len(),
            if control.crashed.is_empty() {
                String::new()
            } else {
                format!(", crashed: {}", control.crashed.join(", "))
            },
            started.elapsed()
        );

        let mut results = Vec::new();
        for mutant in mutants {
            println!("==> mutant {}: {}", mutant.name, mutant.defect);
            let started = Instant::now();
            self.prepare(Some(mutant), &scratch)
                .with_context(|| format!("mutant {}", mutant.name))?;
            self.build_suites(&scratch)
                .with_context(|| format!("mutant {}", mutant.name))?;
            let run = self.run_suites(&scratch, spec_dir)?;
            let mut tests: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (suite, failed) in &run.failed {
                let new: Vec<String> = failed
                    .iter()
                    .filter(|t| !control_failures.contains(&(suite.clone(), (*t).clone())))
                    .cloned()
                    .collect();
                if !new.is_empty() {
                    tests.insert(suite.clone(), new);
                }
            }
            for suite in &run.crashed {
                if !control.crashed.contains(suite) {
                    tests
                        .entry(suite.clone())
                        .or_default()
                        .push("(the test binary failed without naming a test)".to_owned());
                }
            }
            let mut confirmed = Vec::new();
            let candidates = tests
                .iter()
                .flat_map(|(suite, names)| names.iter().map(move |n| (suite, n)))
                .filter(|(_, n)| !n.starts_with('('))
                .take(CONFIRM_AT_MOST);
            for (suite, name) in candidates {
                if self.fails_alone(&scratch, spec_dir, suite, name)? {
                    confirmed.push(format!("{suite}: {name}"));
                    break;
                }
            }
            let crashed_only = tests.values().flatten().all(|n| n.starts_with('('));
            let verdict = if tests.is_empty() {
                Verdict::Survived
            } else if confirmed.is_empty() && !crashed_only {
                Verdict::Unconfirmed { tests }
            } else {
                Verdict::Caught { tests, confirmed }
            };
            let elapsed = started.elapsed();
            println!("    {} ({elapsed:.0?})", verdict_word(&verdict));
            results.push(MutantResult {
                name: mutant.name,
                defect: mutant.defect,
                verdict,
                elapsed,
            });
        }
        Ok(Report {
            control_passed: control.passed,
            control_failures: control_failures
                .into_iter()
                .map(|(s, t)| format!("{s}: {t}"))
                .chain(control.crashed.iter().map(|s| format!("{s}: (crashed)")))
                .collect(),
            results,
        })
    }
}

pub struct MutantResult {
    pub name: &'static str,
    pub defect: &'static str,
    pub verdict: Verdict,
    pub elapsed: Duration,
}

pub struct Report {
    pub control_passed: u64,
    /// Tests that failed on the unmodified fork; they are not counted against any mutant.
    pub control_failures: Vec<String>,
    pub results: Vec<MutantResult>,
}

impl Report {
    /// A run is good when the control is clean and every mutant is caught.
    pub fn all_caught(&self) -> bool {
        self.control_failures.is_empty() && self.results.iter().all(|r| r.verdict.caught())
    }

    /// The table of mutant, verdict and failing tests (Markdown). With `full`, every failing
    /// test is named; otherwise at most a few per suite.
    pub fn table(&self, full: bool) -> String {
        let mut out = String::from(
            "| Mutant | Verdict | Failing tests (suite: count: names) |\n|---|---|---|\n",
        );
        for r in &self.results {
            let tests = match &r.verdict {
                Verdict::Caught { tests, .. } | Verdict::Unconfirmed { tests } => {
                    describe_tests(tests, full)
                }
                Verdict::Survived => "none".to_owned(),
            };
            let _ = writeln!(
                out,
                "| `{}` | {} | {tests} |",
                r.name,
                verdict_word(&r.verdict)
            );
        }
        out
    }
}

fn verdict_word(verdict: &Verdict) -> &'static str {
    match verdict {
        Verdict::Caught { .. } => "caught",
        Verdict::Survived => "SURVIVED",
        Verdict::Unconfirmed { .. } => "UNCONFIRMED (failures did not repeat alone)",
    }
}

/// `spec: 3: a, b, c; prose: 1: d`, shortened to a few names per suite unless `full`.
fn describe_tests(tests: &BTreeMap<String, Vec<String>>, full: bool) -> String {
    const SHOWN: usize = 4;
    tests
        .iter()
        .map(|(suite, names)| {
            let shown: Vec<String> = names
                .iter()
                .take(if full { usize::MAX } else { SHOWN })
                .map(|n| format!("`{}`", n.replace('|', "\\|")))
                .collect();
            let more = names.len().saturating_sub(shown.len());
            let tail = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!("{suite}: {}: {}{tail}", names.len(), shown.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Starts the command in a process group of its own, so that [`kill_group`] reaches the test
/// binary cargo starts as well as cargo.
fn own_process_group(command: &mut Command) {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        command.process_group(0);
    }
    #[cfg(not(unix))]
    let _ = command;
}

/// Kills `child` and, on Unix, every process of its group.
fn kill_group(child: &mut std::process::Child) {
    #[cfg(unix)]
    {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", child.id())])
            .status();
    }
    let _ = child.kill();
}

/// Every file below `dir`, recursively (symbolic links are not followed).
fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in
            fs::read_dir(&current).with_context(|| format!("cannot list {}", current.display()))?
        {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                pending.push(entry.path());
            } else if kind.is_file() {
                files.push(entry.path());
            }
        }
    }
    Ok(files)
}

/// Makes `dest` hold exactly `wanted` (relative path to content), writing only the files whose
/// content differs, so that unchanged files keep their modification times and cargo does not
/// rebuild what a mutant did not touch. Anything else under `dest` is removed, except cargo's
/// `target/` should a build have made one there.
fn sync(wanted: &BTreeMap<PathBuf, Vec<u8>>, dest: &Path) -> Result<()> {
    fs::create_dir_all(dest)?;
    for file in walk(dest)? {
        let rel = file.strip_prefix(dest)?;
        if !rel.starts_with("target") && !wanted.contains_key(rel) {
            fs::remove_file(&file)?;
        }
    }
    for (rel, bytes) in wanted {
        let path = dest.join(rel);
        if fs::read(&path).ok().as_deref() == Some(bytes.as_slice()) {
            continue;
        }
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// `cargo xtask mutants [NAME...] [--list] [--check]`.
pub fn command(ws: &Workspace, names: &[String], list: bool, check: bool) -> Result<ExitCode> {
    let mutants = select(names)?;
    if list {
        for m in &mutants {
            println!("{:<28} {}", m.name, m.defect);
        }
        return Ok(ExitCode::SUCCESS);
    }
    if check {
        let problems = ws.check_mutants()?;
        if problems.is_empty() {
            println!(
                "ok: all {} mutants apply to the current series",
                MUTANTS.len()
            );
            return Ok(ExitCode::SUCCESS);
        }
        bail!(
            "{} problem(s):\n- {}",
            problems.len(),
            problems.join("\n- ")
        );
    }
    let spec = crate::testrun::resolve_spec_dir(
        &ws.project,
        std::env::var_os("SPEC_DIR"),
        &crate::spec_fetch::Fetcher::from_env(),
    )?;
    println!("spec data: {spec}");
    let report = ws.run_mutants(&mutants, &spec.dir)?;
    let full = report.table(true);
    let path = ws.project.root().join("target/mutants/report.md");
    let mut text = format!(
        "control: {} passed, {} failed\n\n",
        report.control_passed,
        report.control_failures.len()
    );
    for failure in &report.control_failures {
        let _ = writeln!(text, "- control failure: {failure}");
    }
    text.push('\n');
    text.push_str(&full);
    fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    println!();
    print!("{}", report.table(false));
    if !report.control_failures.is_empty() {
        println!(
            "\nthe unmodified fork failed {} test(s), which count for no mutant:",
            report.control_failures.len()
        );
        for failure in &report.control_failures {
            println!("  {failure}");
        }
    }
    let caught = report.results.iter().filter(|r| r.verdict.caught()).count();
    println!(
        "\n{caught} of {} mutants caught; every failing test is named in {}",
        report.results.len(),
        path.display()
    );
    Ok(if report.all_caught() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutants_are_well_formed_and_uniquely_named() {
        let mut names = BTreeSet::new();
        for m in MUTANTS {
            assert!(names.insert(m.name), "duplicate mutant {}", m.name);
            assert!(
                !m.drop_patches.is_empty() || !m.edits.is_empty(),
                "{} changes nothing",
                m.name
            );
            for patch in m.drop_patches {
                assert!(patch.ends_with(".patch"), "{}: {patch}", m.name);
            }
            for edit in m.edits {
                assert!(
                    !edit.find.is_empty() && edit.find != edit.replace,
                    "{}",
                    m.name
                );
                assert!(
                    edit.path.starts_with("driver/") || edit.path.starts_with("overload/"),
                    "{}: {}",
                    m.name,
                    edit.path
                );
            }
        }
        for required in [
            "retryable-error-alone",
            "no-backoff",
            "third-retry",
            "no-handshake-backpressure",
            "b1-reverted",
        ] {
            assert!(names.contains(required), "issue 17 asks for {required}");
        }
    }

    #[test]
    fn an_edit_needs_its_text_exactly_once() {
        let edit = Edit {
            path: "overload/src/x.rs",
            find: "cap + 0",
            replace: "cap + 1",
        };
        assert_eq!(
            apply_edit("let n = cap + 0;", &edit).unwrap(),
            "let n = cap + 1;"
        );
        let missing = format!("{:#}", apply_edit("let n = cap;", &edit).unwrap_err());
        assert!(missing.contains("found it 0 times"), "{missing}");
        let twice = format!("{:#}", apply_edit("cap + 0; cap + 0", &edit).unwrap_err());
        assert!(twice.contains("found it 2 times"), "{twice}");
    }

    #[test]
    fn selection_keeps_the_order_given_and_names_unknown_mutants() {
        let picked = select(&["third-retry".to_owned(), "no-backoff".to_owned()]).unwrap();
        let names: Vec<&str> = picked.iter().map(|m| m.name).collect();
        assert_eq!(names, ["third-retry", "no-backoff"]);
        assert_eq!(select(&[]).unwrap().len(), MUTANTS.len());
        let err = format!("{:#}", select(&["typo".to_owned()]).unwrap_err());
        assert!(
            err.contains("no mutant `typo`") && err.contains("b1-reverted"),
            "{err}"
        );
    }

    #[test]
    fn reads_failing_test_lines_of_both_harnesses() {
        assert_eq!(
            failed_test_name(
                "test backpressure_3_overload_errors_retried_at_most_max_retries ... FAILED"
            ),
            Some("backpressure_3_overload_errors_retried_at_most_max_retries")
        );
        assert_eq!(
            failed_test_name(
                "test client-backpressure/getMore-retried/getMores are retried ... FAILED"
            ),
            Some("client-backpressure/getMore-retried/getMores are retried")
        );
        assert_eq!(
            failed_test_name("test client-backpressure/a/b      ... FAILED"),
            Some("client-backpressure/a/b")
        );
        assert_eq!(failed_test_name("test x ... ok"), None);
        assert_eq!(failed_test_name("failures:"), None);
    }

    #[test]
    fn sync_rewrites_only_changed_files_and_removes_stale_ones() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("copy");
        let mut wanted = BTreeMap::new();
        wanted.insert(PathBuf::from("a/keep.rs"), b"same".to_vec());
        wanted.insert(PathBuf::from("change.rs"), b"old".to_vec());
        wanted.insert(PathBuf::from("stale.rs"), b"gone soon".to_vec());
        sync(&wanted, &dest).unwrap();
        fs::create_dir_all(dest.join("target")).unwrap();
        fs::write(dest.join("target/artifact"), b"kept").unwrap();
        let kept_mtime = fs::metadata(dest.join("a/keep.rs"))
            .unwrap()
            .modified()
            .unwrap();

        std::thread::sleep(Duration::from_millis(20));
        wanted.remove(Path::new("stale.rs"));
        wanted.insert(PathBuf::from("change.rs"), b"new".to_vec());
        sync(&wanted, &dest).unwrap();
        assert_eq!(fs::read(dest.join("change.rs")).unwrap(), b"new");
        assert!(!dest.join("stale.rs").exists());
        assert!(dest.join("target/artifact").exists());
        assert_eq!(
            fs::metadata(dest.join("a/keep.rs"))
                .unwrap()
                .modified()
                .unwrap(),
            kept_mtime,
            "an unchanged file must keep its modification time"
        );
    }

    #[test]
    fn the_table_names_each_mutant_its_verdict_and_tests() {
        let mut tests = BTreeMap::new();
        tests.insert(
            "prose".to_owned(),
            (1..=6).map(|n| format!("t{n}")).collect::<Vec<_>>(),
        );
        let report = Report {
            control_passed: 10,
            control_failures: vec![],
            results: vec![
                MutantResult {
                    name: "a",
                    defect: "",
                    verdict: Verdict::Caught {
                        tests,
                        confirmed: vec!["prose: t1".to_owned()],
                    },
                    elapsed: Duration::ZERO,
                },
                MutantResult {
                    name: "b",
                    defect: "",
                    verdict: Verdict::Survived,
                    elapsed: Duration::ZERO,
                },
            ],
        };
        let short = report.table(false);
        assert!(
            short.contains("| `a` | caught | prose: 6: `t1`, `t2`, `t3`, `t4` and 2 more |"),
            "{short}"
        );
        assert!(short.contains("| `b` | SURVIVED | none |"), "{short}");
        assert!(report.table(true).contains("`t6`"));
        assert!(!report.all_caught());
    }
}
