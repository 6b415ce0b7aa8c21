//! The spec test harness: one trial per case, named `<spec>/<file-stem>/<description>`, so a case
//! can be listed (`--list`), filtered and rerun alone. Skipped cases are reported as ignored with
//! their reason; a failure message starts with the test's description. After the run, one line
//! per file gives its counts and skip reasons.
//!
//! Data: `SPEC_DIR` (a checkout root holding `source/`), else `spec-tests/data/`, else the pinned
//! commit that `cargo xtask test` fetched (`discovery::data_root`). Without data the run fails.
//! Target: a fresh emulator per case, or `MONGODB_URI`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use spec_tests::discovery::{self, SpecFile};
use spec_tests::runner::{self, LoadedFile};
use spec_tests::target::{self, Mode};
use spec_tests::uri_options;
use spec_tests::valid_fail::{self, Verdict};

#[derive(Default)]
struct FileTally {
    passed: usize,
    failed: usize,
    skipped: BTreeMap<String, usize>,
    /// valid-fail only: cases the runner failed, but not for the reason the file describes.
    wrong_reason: usize,
}

type Tallies = Arc<Mutex<BTreeMap<String, FileTally>>>;

fn record(tallies: &Tallies, file: &str, outcome: Result<(), Option<&str>>) {
    if let Ok(mut t) = tallies.lock() {
        let tally = t.entry(file.to_string()).or_default();
        match outcome {
            Ok(()) => tally.passed += 1,
            Err(None) => tally.failed += 1,
            Err(Some(reason)) => *tally.skipped.entry(reason.to_string()).or_insert(0) += 1,
        }
    }
}

/// Records a valid-fail verdict: `passed` counts cases failed as required, `failed` cases
/// that wrongly passed.
fn record_valid_fail(tallies: &Tallies, file: &str, verdict: &Verdict) {
    if let Ok(mut t) = tallies.lock() {
        let tally = t.entry(file.to_string()).or_default();
        match verdict {
            Verdict::FailedAsRequired => tally.passed += 1,
            Verdict::WronglyPassed => tally.failed += 1,
            Verdict::FailedForAnotherReason { .. } => tally.wrong_reason += 1,
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, Failed> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failed::from(format!("cannot build a tokio runtime: {e}")))
}

fn skipped(name: String, file: String, reason: String, tallies: &Tallies) -> Trial {
    let tallies = tallies.clone();
    Trial::ignorable_test(name, move || {
        record(&tallies, &file, Err(Some(&reason)));
        Ok(Completion::ignored_with(reason))
    })
}

fn failing(name: String, message: String) -> Trial {
    Trial::test(name, move || Err(message.into()))
}

fn unified_trials(
    mode: &Arc<Mode>,
    files: &[SpecFile],
    tallies: &Tallies,
    trials: &mut Vec<Trial>,
) {
    for source in files {
        let file_name = source.name();
        let (loaded, cases): (Arc<LoadedFile>, _) = match runner::plan_file(source, mode) {
            Ok(plan) => plan,
            Err(e) => {
                let tallies = tallies.clone();
                let name = file_name.clone();
                trials.push(Trial::test(file_name.clone(), move || {
                    record(&tallies, &name, Err(None));
                    Err(format!("cannot load the file: {e}").into())
                }));
                continue;
            }
        };
        for case in cases {
            if let Some(reason) = case.skip {
                trials.push(skipped(case.name, file_name.clone(), reason, tallies));
                continue;
            }
            let (loaded, mode, tallies, file) = (
                loaded.clone(),
                mode.clone(),
                tallies.clone(),
                file_name.clone(),
            );
            trials.push(Trial::test(case.name, move || {
                let result = runtime()?.block_on(runner::run_case(&loaded, case.index, &mode));
                record(
                    &tallies,
                    &file,
                    result.as_ref().map(|_| ()).map_err(|_| None),
                );
                result.map_err(|e| format!("{}: {e}", case.description).into())
            }));
        }
    }
}

/// The trial for one valid-fail case: it passes when the runner failed the case for the
/// expected reason. `run` yields the runner's result for the case.
fn valid_fail_trial(
    name: String,
    file: String,
    expected: Option<&'static str>,
    tallies: &Tallies,
    run: impl FnOnce() -> Result<Result<(), String>, Failed> + Send + 'static,
) -> Trial {
    let tallies = tallies.clone();
    Trial::test(name, move || {
        let outcome = run()?;
        let verdict = valid_fail::judge(&outcome, expected);
        record_valid_fail(&tallies, &file, &verdict);
        match verdict {
            Verdict::FailedAsRequired => Ok(()),
            Verdict::WronglyPassed => Err("the runner passed a case the unified format's \
                 valid-fail suite requires it to fail"
                .into()),
            Verdict::FailedForAnotherReason { expected, message } => Err(format!(
                "the runner failed the case, but not for the reason the file tests: expected \
                 the failure to mention {expected:?}, it was: {message}"
            )
            .into()),
        }
    })
}

fn valid_fail_trials(
    mode: &Arc<Mode>,
    files: &[SpecFile],
    tallies: &Tallies,
    trials: &mut Vec<Trial>,
) {
    for source in files {
        let mut source = source.clone();
        source.spec = valid_fail::SUITE_NAME.to_string();
        let file_name = source.name();
        match runner::plan_file(&source, mode) {
            // A load error fails every case of the file, each judged on its own.
            Err(e) => {
                let message = format!("cannot load the file: {e}");
                let mut seen = BTreeMap::<String, usize>::new();
                for description in valid_fail::loose_descriptions(&source.path) {
                    let expected = valid_fail::expected_reason(&source.stem, &description);
                    let outcome = Err(message.clone());
                    // Unique trial names, as `plan_file` makes them for files that load.
                    let n = seen.entry(description.clone()).or_insert(0);
                    *n += 1;
                    let name = match *n {
                        1 => format!("{file_name}/{description}"),
                        n => format!("{file_name}/{description} [{n}]"),
                    };
                    trials.push(valid_fail_trial(
                        name,
                        file_name.clone(),
                        expected,
                        tallies,
                        move || Ok(outcome),
                    ));
                }
            }
            Ok((loaded, cases)) => {
                for case in cases {
                    if let Some(reason) = case.skip {
                        trials.push(skipped(case.name, file_name.clone(), reason, tallies));
                        continue;
                    }
                    let expected = valid_fail::expected_reason(&source.stem, &case.description);
                    let (loaded, mode) = (loaded.clone(), mode.clone());
                    trials.push(valid_fail_trial(
                        case.name,
                        file_name.clone(),
                        expected,
                        tallies,
                        move || {
                            Ok(runtime()?.block_on(runner::run_case(&loaded, case.index, &mode)))
                        },
                    ));
                }
            }
        }
    }
}

fn uri_trials(files: &[SpecFile], tallies: &Tallies, trials: &mut Vec<Trial>) {
    for source in files {
        let file_name = source.name();
        let cases = match uri_options::load(&source.path) {
            Ok(cases) => cases,
            Err(e) => {
                trials.push(failing(file_name, format!("cannot load the file: {e}")));
                continue;
            }
        };
        for case in cases {
            let name = format!("{file_name}/{}", case.description);
            if let Some(reason) = uri_options::skip_reason(&case, &name) {
                trials.push(skipped(name, file_name.clone(), reason, tallies));
                continue;
            }
            let (tallies, file) = (tallies.clone(), file_name.clone());
            trials.push(Trial::test(name, move || {
                let result = runtime()?.block_on(uri_options::run(&case));
                record(
                    &tallies,
                    &file,
                    result.as_ref().map(|_| ()).map_err(|_| None),
                );
                result.map_err(|e| format!("{}: {e}", case.description).into())
            }));
        }
    }
}

fn mode_from_env() -> Result<Mode, String> {
    match std::env::var("MONGODB_URI") {
        Ok(uri) if !uri.is_empty() => {
            let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
            let info = rt.block_on(target::probe(&uri))?;
            Ok(Mode::External { uri, info })
        }
        _ => Ok(Mode::Emulator),
    }
}

fn main() {
    let mut args = Arguments::from_args();
    let tallies: Tallies = Arc::default();
    let mut trials = Vec::new();
    match build(&mut args, &tallies, &mut trials) {
        Ok(()) => {}
        Err(message) => {
            eprintln!("spec tests: {message}");
            trials.push(failing("spec-data".to_string(), message));
        }
    }
    let conclusion = libtest_mimic::run(&args, trials);
    if !args.list {
        print_summary(&tallies);
    }
    conclusion.exit();
}

fn build(args: &mut Arguments, tallies: &Tallies, trials: &mut Vec<Trial>) -> Result<(), String> {
    let root = discovery::data_root()?;
    // On stderr, so that `--list` output and the summary lines stay as libtest prints them.
    eprintln!("spec data: {} ({})", root.path.display(), root.origin);
    let mode = Arc::new(mode_from_env()?);
    if matches!(*mode, Mode::External { .. }) {
        // Fail points are global to a deployment: cases must not overlap.
        args.test_threads = Some(1);
    }
    for suite in discovery::UNIFIED_SUITES {
        let files = discovery::suite_files(&root.path, *suite)?;
        unified_trials(&mode, &files, tallies, trials);
    }
    let files = discovery::suite_files(&root.path, discovery::VALID_FAIL_SUITE)?;
    valid_fail_trials(&mode, &files, tallies, trials);
    let files = discovery::suite_files(&root.path, discovery::URI_OPTIONS_SUITE)?;
    uri_trials(&files, tallies, trials);
    if trials.is_empty() {
        return Err(format!("no test cases found under {}", root.path.display()));
    }
    Ok(())
}

fn print_summary(tallies: &Tallies) {
    let Ok(tallies) = tallies.lock() else {
        return;
    };
    if tallies.is_empty() {
        return;
    }
    println!("\nper-file results:");
    let mut valid_fail_total = FileTally::default();
    for (file, t) in tallies.iter() {
        if file.starts_with(valid_fail::SUITE_NAME) {
            valid_fail_total.passed += t.passed;
            valid_fail_total.failed += t.failed;
            valid_fail_total.wrong_reason += t.wrong_reason;
            for (reason, n) in &t.skipped {
                *valid_fail_total.skipped.entry(reason.clone()).or_insert(0) += n;
            }
        }
        println!("  {}", tally_line(file, t));
    }
    if !valid_fail_total.is_empty() {
        println!("{}", tally_line(valid_fail::SUITE_NAME, &valid_fail_total));
    }
}

impl FileTally {
    fn is_empty(&self) -> bool {
        self.passed + self.failed + self.wrong_reason == 0 && self.skipped.is_empty()
    }
}

/// One tally line. valid-fail files count differently: their passes are cases the runner
/// failed as required, their failures cases it wrongly passed.
fn tally_line(file: &str, t: &FileTally) -> String {
    let skipped: usize = t.skipped.values().sum();
    let mut line = if file.starts_with(valid_fail::SUITE_NAME) {
        format!(
            "{file}: {} failed-as-required, {} wrongly passed, {} failed for another reason, \
             {skipped} skipped",
            t.passed, t.failed, t.wrong_reason
        )
    } else {
        format!(
            "{file}: {} passed, {} failed, {skipped} skipped",
            t.passed, t.failed
        )
    };
    if !t.skipped.is_empty() {
        let reasons: Vec<String> = t.skipped.iter().map(|(r, n)| format!("{n}× {r}")).collect();
        line.push_str(&format!(" ({})", reasons.join("; ")));
    }
    line
}
