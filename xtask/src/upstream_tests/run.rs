//! Running one prepared copy's tests against `labd`: build once with nextest, list every test
//! (with the reason each one the filter leaves out is not run), start `labd` in the topology, run
//! the tests with upstream's filter and read nextest's machine-readable events.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::prepare::{junit_file, profile_for, Variant, NEXTEST_PROFILE};
use super::report::{Outcome, RunOutcomes};

/// The deployments upstream's CI runs that `labd` can be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Topology {
    Standalone,
    ReplicaSet,
    Sharded,
}

impl Topology {
    pub const ALL: [Topology; 3] = [
        Topology::ReplicaSet,
        Topology::Standalone,
        Topology::Sharded,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Topology::Standalone => "standalone",
            Topology::ReplicaSet => "replicaset",
            Topology::Sharded => "sharded",
        }
    }

    pub fn parse(text: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.name() == text)
            .with_context(|| format!("unknown topology `{text}` (standalone, replicaset, sharded)"))
    }

    /// `labd` arguments: one mongod; three members; two routers (upstream's sharded CI shape).
    fn labd_args(self) -> [&'static str; 4] {
        match self {
            Topology::Standalone => ["--topology", "standalone", "--members", "1"],
            Topology::ReplicaSet => ["--topology", "replicaset", "--members", "3"],
            Topology::Sharded => ["--topology", "sharded", "--members", "2"],
        }
    }
}

/// A running `labd`; killed when dropped.
pub struct Labd {
    child: Child,
    pub uri: String,
}

impl Labd {
    /// Starts `labd` on ephemeral ports and waits (at most 60 s) for the URI it prints.
    pub fn start(program: &Path, topology: Topology) -> Result<Self> {
        let mut child = Command::new(program)
            .args(topology.labd_args())
            .args(["--port", "0"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        let stdout = child.stdout.take().context("labd has no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = tx.send(BufReader::new(stdout).read_line(&mut line).map(|_| line));
        });
        let mut labd = Labd {
            child,
            uri: String::new(),
        };
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(line)) if line.trim().starts_with("mongodb://") => {
                labd.uri = line.trim().to_owned();
                Ok(labd)
            }
            Ok(Ok(line)) => bail!("labd printed `{}` instead of its URI", line.trim()),
            Ok(Err(err)) => Err(err).context("cannot read labd's URI"),
            Err(_) => bail!("labd printed no URI within 60 s"),
        }
    }
}

impl Drop for Labd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds `labd` in the project's workspace and returns its path.
pub fn build_labd(project_root: &Path) -> Result<PathBuf> {
    let status = crate::project::cargo_command()
        .args(["build", "--quiet", "-p", "emulator", "--bin", "labd"])
        .arg("--manifest-path")
        .arg(project_root.join("Cargo.toml"))
        .status()
        .context("cannot run cargo to build labd")?;
    if !status.success() {
        bail!("building labd failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|d| {
            if d.is_absolute() {
                d
            } else {
                project_root.join(d)
            }
        })
        .unwrap_or_else(|| project_root.join("target"));
    let labd = target.join("debug").join("labd");
    if !labd.is_file() {
        bail!("cargo built labd but it is not at {}", labd.display());
    }
    Ok(labd)
}

fn nextest(krate: &Path, target_dir: &Path) -> Command {
    let mut cmd = crate::project::cargo_command();
    cmd.current_dir(krate)
        .env("CARGO_TARGET_DIR", target_dir)
        .arg("nextest");
    cmd
}

/// Fails with a clear message when cargo-nextest is missing.
pub fn ensure_nextest() -> Result<()> {
    let out = crate::project::cargo_command()
        .args(["nextest", "--version"])
        .output()
        .context("cannot run cargo")?;
    if !out.status.success() {
        bail!(
            "cargo-nextest is not installed; upstream's tests are filtered by its configuration. \
             Install it: `cargo install cargo-nextest --locked`"
        );
    }
    Ok(())
}

/// Compiles the copy's test binary (once; later runs reuse it).
pub fn build(krate: &Path, target_dir: &Path) -> Result<()> {
    let status = nextest(krate, target_dir)
        .args([
            "run",
            "--no-run",
            "--cargo-quiet",
            "--profile",
            NEXTEST_PROFILE,
        ])
        .status()
        .context("cannot run cargo nextest")?;
    if !status.success() {
        bail!(
            "upstream's tests do not compile in {} (an adaptation may be missing; see \
             docs/upstream-tests.md)",
            krate.display()
        );
    }
    Ok(())
}

/// Every test of the copy: `None` for those the filter runs, the reason for the others.
pub fn list(krate: &Path, target_dir: &Path) -> Result<BTreeMap<String, Option<String>>> {
    let out = nextest(krate, target_dir)
        .args(["list", "--cargo-quiet", "--profile", NEXTEST_PROFILE])
        .args(["--message-format", "json"])
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run cargo nextest list")?;
    if !out.status.success() {
        bail!("cargo nextest list failed");
    }
    parse_list(&String::from_utf8_lossy(&out.stdout))
}

/// Reads `cargo nextest list --message-format json`.
pub fn parse_list(json: &str) -> Result<BTreeMap<String, Option<String>>> {
    let value: serde_json::Value =
        serde_json::from_str(json.trim()).context("nextest's test list is not JSON")?;
    let suites = value["rust-suites"]
        .as_object()
        .context("nextest's test list has no rust-suites")?;
    let mut tests = BTreeMap::new();
    for suite in suites.values() {
        let Some(cases) = suite["testcases"].as_object() else {
            continue;
        };
        for (name, case) in cases {
            let matched = case["filter-match"]["status"].as_str() == Some("matches");
            let reason = if matched {
                None
            } else {
                Some(skip_reason(name, case["filter-match"]["reason"].as_str()))
            };
            tests.insert(name.clone(), reason);
        }
    }
    Ok(tests)
}

/// Why upstream's filter leaves a test out, in upstream's own terms.
fn skip_reason(name: &str, nextest_reason: Option<&str>) -> String {
    if name.contains("skip_ci") {
        "upstream's filter: skip_ci module (needs infrastructure upstream's CI provides on its own: Atlas, KMS, OIDC, AWS, Kerberos, load balancer, happy-eyeballs server)".to_owned()
    } else if name.contains("skip_local") {
        "upstream's filter: skip_local module (needs infrastructure: in-use encryption's mongocryptd/KMS)".to_owned()
    } else if nextest_reason == Some("ignored") {
        "#[ignore] upstream".to_owned()
    } else {
        format!("not selected ({})", nextest_reason.unwrap_or("filter"))
    }
}

/// Runs the selected tests against `uri`; outcomes by test name for the tests that ran.
pub fn run(
    variant: Variant,
    topology: Topology,
    krate: &Path,
    target_dir: &Path,
    uri: &str,
    filters: &[String],
    log: &Path,
) -> Result<RunOutcomes> {
    let log_file =
        std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let profile = profile_for(topology.name());
    let mut child = nextest(krate, target_dir)
        .args([
            "run",
            "--cargo-quiet",
            "--no-fail-fast",
            "--profile",
            &profile,
        ])
        .args(["--message-format", "libtest-json-plus"])
        .args(["--success-output", "never", "--failure-output", "never"])
        .arg("--")
        .args(filters)
        .env("NEXTEST_EXPERIMENTAL_LIBTEST_JSON", "1")
        .env("MONGODB_URI", uri)
        // Upstream's log_uncaptured also writes to /dev/tty unless told otherwise.
        .env("LOG_UNCAPTURED", "/dev/null")
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(log_file)
        .spawn()
        .context("cannot run cargo nextest run")?;
    let stdout = child.stdout.take().context("nextest has no stdout")?;
    let mut outcomes = RunOutcomes::new();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if let Some((name, outcome)) = parse_event(&line) {
            println!(
                "  {:<4} {name}",
                match &outcome {
                    Outcome::Passed => "ok",
                    Outcome::Failed(_) => "FAIL",
                    Outcome::Skipped(_) => "skip",
                }
            );
            outcomes.insert(name, outcome);
        }
    }
    // Failing tests make nextest exit non-zero; that is a result, not an error of the run.
    let _ = child.wait();
    mark_run_time_skips(krate, variant, topology, &mut outcomes)?;
    Ok(outcomes)
}

/// The JUnit report of a copy's run in a topology. nextest keeps its reports under the
/// workspace root (its `store.dir`, `target/nextest`), not under CARGO_TARGET_DIR.
pub fn junit_path(krate: &Path, variant: Variant, topology: Topology) -> PathBuf {
    krate
        .join("target")
        .join("nextest")
        .join(profile_for(topology.name()))
        .join(junit_file(variant))
}

/// Turns each pass whose output says only that it skipped into a skip. libtest events carry no
/// output for passing tests; the run's JUnit report does.
pub fn mark_run_time_skips(
    krate: &Path,
    variant: Variant,
    topology: Topology,
    outcomes: &mut RunOutcomes,
) -> Result<()> {
    let junit = junit_path(krate, variant, topology);
    let outputs = match std::fs::read_to_string(&junit) {
        Ok(xml) => junit_outputs(&xml),
        Err(err) => bail!(
            "nextest wrote no JUnit report at {} ({err}); cannot tell run-time skips from passes",
            junit.display()
        ),
    };
    for (name, outcome) in outcomes.iter_mut() {
        if *outcome == Outcome::Passed {
            if let Some(reason) = outputs.get(name).and_then(|o| run_time_skip(name, o)) {
                *outcome = Outcome::Skipped(reason);
            }
        }
    }
    Ok(())
}

/// Each test case's captured output (stdout and stderr) from nextest's JUnit report.
pub fn junit_outputs(xml: &str) -> BTreeMap<String, String> {
    let mut outputs = BTreeMap::new();
    let mut rest = xml;
    while let Some(start) = rest.find("<testcase ") {
        rest = &rest[start..];
        let tag_end = rest.find('>').unwrap_or(rest.len());
        let tag = &rest[..tag_end];
        let name = attribute(tag, "name").map(|n| unescape(&n));
        let (body, next) = if tag.ends_with('/') {
            ("", &rest[tag_end..])
        } else {
            match rest.find("</testcase>") {
                Some(end) => (&rest[tag_end..end], &rest[end..]),
                None => (&rest[tag_end..], ""),
            }
        };
        if let Some(name) = name {
            let mut text = String::new();
            for element in ["system-out", "system-err"] {
                if let Some(content) = element_text(body, element) {
                    text.push_str(&content);
                    text.push('\n');
                }
            }
            outputs.insert(name, text);
        }
        rest = next.get(1..).unwrap_or("");
    }
    outputs
}

fn attribute(tag: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    let len = tag[start..].find('"')?;
    Some(tag[start..start + len].to_owned())
}

fn element_text(body: &str, element: &str) -> Option<String> {
    let open = format!("<{element}>");
    let close = format!("</{element}>");
    let start = body.find(&open)? + open.len();
    let len = body[start..].find(&close)?;
    let raw = &body[start..start + len];
    let text = raw
        .strip_prefix("<![CDATA[")
        .and_then(|r| r.strip_suffix("]]>"))
        .map_or_else(|| unescape(raw), str::to_owned);
    Some(text)
}

/// XML's five named entities and numeric character references.
fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let decoded = rest.find(';').filter(|&i| i <= 10).and_then(|semi| {
            let entity = &rest[1..semi];
            let c = match entity {
                "lt" => Some('<'),
                "gt" => Some('>'),
                "amp" => Some('&'),
                "quot" => Some('"'),
                "apos" => Some('\''),
                _ => entity
                    .strip_prefix("#x")
                    .and_then(|h| u32::from_str_radix(h, 16).ok())
                    .or_else(|| entity.strip_prefix('#').and_then(|d| d.parse().ok()))
                    .and_then(char::from_u32),
            };
            c.map(|c| (c, semi))
        });
        match decoded {
            Some((c, semi)) => {
                out.push(c);
                rest = &rest[semi + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// One libtest-json event: the test's name and outcome when it is a finished test.
pub fn parse_event(line: &str) -> Option<(String, Outcome)> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    if value["type"] != "test" {
        return None;
    }
    let raw = value["name"].as_str()?;
    // nextest names a test `<binary id>$<test name>`.
    let name = raw.split_once('$').map_or(raw, |(_, n)| n).to_owned();
    let stdout = value["stdout"].as_str().unwrap_or("");
    let outcome = match value["event"].as_str()? {
        "ok" => Outcome::Passed,
        "failed" => Outcome::Failed(failure_reason(stdout)),
        "timeout" => Outcome::Failed("timed out (2 x 60 s)".to_owned()),
        "ignored" => Outcome::Skipped("#[ignore] upstream".to_owned()),
        _ => return None,
    };
    Some((name, outcome))
}

/// A passing test that only printed a skip: upstream tests check the deployment first and return
/// early, saying so (`skipping <test> due to <why>`, `Skipping <test>: <why>`), when it lacks
/// what they need. Only a skip naming the test itself counts: a runner that skips one file of
/// many (`Skipping deserializing <file>`) still ran the rest.
fn run_time_skip(name: &str, output: &str) -> Option<String> {
    let own = name.rsplit("::").next().unwrap_or(name);
    let lines: Vec<&str> = output
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("running ") && !l.starts_with("test "))
        .filter(|l| !l.starts_with("test result:") && !l.starts_with("------------"))
        .filter(|l| *l != "(stdout and stderr are combined)")
        .collect();
    let first = lines.first()?;
    let all_skips = lines
        .iter()
        .all(|l| l.to_ascii_lowercase().starts_with("skipping"));
    let names_itself = lines.iter().any(|l| l.contains(own));
    (all_skips && names_itself).then(|| format!("skipped at run time: {first}"))
}

/// The line of a failure's output that says why: the panic message when there is one.
fn failure_reason(output: &str) -> String {
    let lines: Vec<&str> = output.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if let Some(rest) = line.split_once("panicked at ").map(|(_, r)| r) {
            // `panicked at src/x.rs:1:2:` is followed by the message on the next line.
            let next = lines.get(i + 1).map(|l| l.trim()).unwrap_or("");
            let message = if rest.trim_end().ends_with(':') && !next.is_empty() {
                next.to_owned()
            } else {
                rest.trim().to_owned()
            };
            return shorten(&message);
        }
    }
    lines
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| !l.is_empty())
        .map_or_else(|| "failed without output".to_owned(), shorten)
}

fn shorten(text: &str) -> String {
    let text = text.trim();
    if text.chars().count() <= 300 {
        text.to_owned()
    } else {
        format!("{}…", text.chars().take(300).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_outcomes_from_libtest_json_events() {
        let ok = r#"{"type":"test","event":"ok","name":"mongodb::mongodb$test::coll::insert","exec_time":0.1}"#;
        assert_eq!(
            parse_event(ok),
            Some(("test::coll::insert".to_owned(), Outcome::Passed))
        );
        let failed = r#"{"type":"test","event":"failed","name":"mongodb::mongodb$test::a","stdout":"running 1 test\nthread 'test::a' panicked at src/test/a.rs:3:5:\nno such command: 'explain'\nnote: run with RUST_BACKTRACE"}"#;
        assert_eq!(
            parse_event(failed),
            Some((
                "test::a".to_owned(),
                Outcome::Failed("no such command: 'explain'".to_owned())
            ))
        );
        assert_eq!(parse_event(r#"{"type":"suite","event":"started"}"#), None);
        assert_eq!(
            parse_event(r#"{"type":"test","event":"started","name":"m$x"}"#),
            None
        );
        assert_eq!(parse_event("not json"), None);
    }

    #[test]
    fn a_pass_that_only_printed_skips_is_a_skip() {
        assert_eq!(
            run_time_skip(
                "test::b",
                "\nrunning 1 test\nskipping b due to unsupported topology\n\n(stdout and stderr are combined)"
            ),
            Some("skipped at run time: skipping b due to unsupported topology".to_owned())
        );
        assert_eq!(
            run_time_skip("x::b", "Skipping one file\nran the rest\n"),
            None
        );
        assert_eq!(
            run_time_skip("x::run_tests", "Skipping deserializing \"spec/a.json\"\n"),
            None,
            "a runner that skipped one file ran the others"
        );
        assert_eq!(run_time_skip("x::b", ""), None);
    }

    #[test]
    fn reads_each_test_cases_output_from_the_junit_report() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites name="nextest-run" tests="3"><testsuite name="mongodb" tests="3">
<testcase name="test::a" classname="mongodb" time="0.1"><system-out>
running 1 test
</system-out><system-err>skipping a: needs &lt;sharded&gt; &amp; 4.4 &#x27;x&#39; &bogus x & y
</system-err></testcase>
<testcase name="test::b&amp;c" classname="mongodb" time="0.1"/>
<testcase name="test::d" classname="mongodb"><failure message="x">boom</failure><system-out><![CDATA[raw <out>]]></system-out></testcase>
</testsuite></testsuites>"#;
        let outputs = junit_outputs(xml);
        assert_eq!(outputs.len(), 3, "{outputs:?}");
        assert!(
            outputs["test::a"].contains("skipping a: needs <sharded> & 4.4 'x' &bogus x & y"),
            "{outputs:?}"
        );
        assert_eq!(outputs["test::b&c"], "");
        assert!(outputs["test::d"].contains("raw <out>"));
        assert!(run_time_skip("test::a", &outputs["test::a"]).is_some());
    }

    #[test]
    fn the_list_names_why_a_test_is_not_run() {
        let json = r#"{"rust-suites":{"mongodb":{"testcases":{
            "test::coll::insert":{"ignored":false,"filter-match":{"status":"matches"}},
            "test::csfle_skip_local::x":{"ignored":false,"filter-match":{"status":"mismatch","reason":"default-filter"}},
            "test::atlas_sfp_skip_ci::y":{"ignored":false,"filter-match":{"status":"mismatch","reason":"default-filter"}},
            "test::z":{"ignored":true,"filter-match":{"status":"mismatch","reason":"ignored"}}}}}}"#;
        let list = parse_list(json).unwrap();
        assert_eq!(list["test::coll::insert"], None);
        assert!(list["test::csfle_skip_local::x"]
            .as_deref()
            .unwrap()
            .contains("skip_local"));
        assert!(list["test::atlas_sfp_skip_ci::y"]
            .as_deref()
            .unwrap()
            .contains("skip_ci"));
        assert_eq!(list["test::z"].as_deref(), Some("#[ignore] upstream"));
        assert!(parse_list("{}").is_err());
    }

    #[test]
    fn topologies_parse_by_name() {
        for t in Topology::ALL {
            assert_eq!(Topology::parse(t.name()).unwrap(), t);
            assert!(super::super::prepare::TOPOLOGIES.contains(&t.name()));
        }
        assert!(Topology::parse("loadbalanced").is_err());
    }
}
