//! The overload lab's load generator: open-loop schedule, arrival process, figures, and a tiny
//! end-to-end run against the emulator.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lab::loadgen::client::BoxFut;
use lab::loadgen::config::{
    Arrivals, Driver, LabConfig, OpMix, Phase, Scenario, ServerMode, Variant,
};
use lab::loadgen::drive::{drive_all, DriveStats, RequestOpts};
use lab::loadgen::metrics::{goodput, new_hist, pct_ms, recovery_time, Recorder, Second};
use lab::loadgen::schedule::{self, ScheduleSpec};
use lab::loadgen::summary::summarize;
use lab::loadgen::{report, runner, AttemptReport, LabClient, OpSpec};
use tokio::time::Instant;

/// A client that answers every request after `delay`, and notes when each call started.
struct SlowClient {
    delay: Duration,
    calls: Arc<Mutex<Vec<Instant>>>,
}

/// What a fake client reports for one call that succeeded after `service`, on its first try.
fn succeeded_after(service: Duration) -> AttemptReport {
    AttemptReport {
        outcome: Ok(()),
        attempts: 1,
        conn_wait: Duration::ZERO,
        service,
        tries: 1,
    }
}

impl LabClient for SlowClient {
    fn run(&self, _op: OpSpec) -> BoxFut<AttemptReport> {
        self.calls.lock().unwrap().push(Instant::now());
        let delay = self.delay;
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            succeeded_after(delay)
        })
    }

    fn warm_up(&self) -> BoxFut<Result<(), String>> {
        Box::pin(async { Ok(()) })
    }

    fn shutdown(&self) -> BoxFut<()> {
        Box::pin(async {})
    }
}

fn one_phase(load: f64, secs: f64) -> Scenario {
    Scenario {
        name: "t".into(),
        phases: vec![Phase::new("p", load, secs)],
        burst: None,
    }
}

/// A short end-to-end run of `variants`: two instances at 150 % of 60 ops/s for `secs`,
/// against the fail-point server.
fn small_failpoint_run(variants: &[&str], secs: f64) -> LabConfig {
    LabConfig {
        scenario: one_phase(1.5, secs),
        variants: variants
            .iter()
            .map(|v| Variant::parse(v).unwrap())
            .collect(),
        capacity: 60.0,
        instances: 2,
        server_mode: ServerMode::Failpoint,
        docs: 50,
        drain: Duration::from_millis(500),
        ..LabConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_keeps_its_schedule_whatever_the_client_does() {
    let scenario = one_phase(1.0, 1.0);
    let mix = OpMix::default();
    let schedules = schedule::build(&ScheduleSpec {
        phases: &scenario.phases,
        capacity: 200.0,
        instances: 1,
        arrivals: Arrivals::Fixed,
        mix: &mix,
        docs: 10,
        seed: 1,
    });
    assert_eq!(schedules[0].len(), 200);
    let calls = Arc::new(Mutex::new(Vec::new()));
    // Every reply takes 300 ms: a closed loop of one worker would send 4 requests a second.
    let client: Arc<dyn LabClient> = Arc::new(SlowClient {
        delay: Duration::from_millis(300),
        calls: calls.clone(),
    });
    let start = Instant::now() + Duration::from_millis(50);
    let recorder = Arc::new(Recorder::new(start));
    let stats = drive_all(
        &[client],
        &schedules,
        recorder.clone(),
        RequestOpts::new(Duration::from_millis(100), Duration::from_secs(1), 5),
    )
    .await;
    assert_eq!(
        stats,
        DriveStats {
            sent: 200,
            unfinished: 0
        }
    );
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 200);
    // Each call left close to its scheduled instant, not after the previous reply.
    let mut late = 0;
    for (call, a) in calls.iter().zip(&schedules[0]) {
        let scheduled = start + a.at;
        if call.saturating_duration_since(scheduled) > Duration::from_millis(25) {
            late += 1;
        }
    }
    assert!(late <= 4, "{late} of 200 calls left more than 25 ms late");
    let last = *calls.last().unwrap();
    assert!(last.saturating_duration_since(start) < Duration::from_millis(1100));
    let secs = recorder.take(1);
    let offered: u64 = secs.iter().map(|s| s.offered).sum();
    let timed_out: u64 = secs
        .iter()
        .map(|s| s.error(lab::loadgen::ErrorClass::ClientDeadline))
        .sum();
    let late_ok: u64 = secs.iter().map(|s| s.late_ok).sum();
    assert_eq!(offered, 200);
    // The application gave up on every request at 100 ms; each completed late.
    assert_eq!(timed_out, 200);
    assert_eq!(late_ok, 200);
    assert_eq!(goodput(&secs).iter().sum::<u64>(), 0);
}

fn synthetic(offered: &[u64], good: &[u64], lag_ms: u64) -> Vec<Second> {
    offered
        .iter()
        .zip(good)
        .map(|(o, g)| {
            let mut s = Second {
                offered: *o,
                good: *g,
                attempts: *o * 2,
                reported: *o,
                reported_attempts: *o * 2,
                latency: new_hist(),
                lag: new_hist(),
                ..Second::default()
            };
            for ms in 1..=100 {
                s.latency.record(ms * 1000).unwrap();
                s.lag.record(lag_ms * 1000).unwrap();
            }
            s
        })
        .collect()
}

#[test]
fn figures_on_synthetic_data() {
    let scenario = Scenario {
        name: "burst".into(),
        phases: vec![
            Phase::new("base", 0.5, 2.0),
            Phase::new("burst", 1.3, 2.0),
            Phase::new("after", 0.5, 4.0),
        ],
        burst: Some(1),
    };
    let offered = [50, 50, 130, 130, 50, 50, 50, 50];
    let good = [50, 50, 60, 40, 10, 49, 50, 48];
    assert_eq!(recovery_time(&offered, &good, 4, 0.95), Some(1));
    let secs = synthetic(&offered, &good, 1);
    let v = Variant::new("v", Driver::Fork, "");
    let sum = summarize(
        &v,
        0,
        &secs,
        &scenario,
        8,
        DriveStats::default(),
        None,
        Some(12.0),
        Duration::from_millis(5),
    );
    assert_eq!(sum.offered, 560);
    assert_eq!(sum.good, 357);
    assert!((sum.goodput - 357.0 / 8.0).abs() < 1e-9);
    assert_eq!(sum.burst_goodput, Some(50.0));
    assert_eq!(sum.recovery_secs, Some(1));
    assert_eq!(sum.attempts_per_request, Some(2.0));
    let p = |x: Option<f64>| x.unwrap();
    assert!((p(sum.latency.p50) - 50.0).abs() < 1.0);
    assert!((p(sum.latency.p99) - 99.0).abs() < 1.5);
    assert!(!sum.invalid);
    assert!(sum.wasted_share.is_none());
    // A generator that fell 8 ms behind is INVALID.
    let slow = summarize(
        &v,
        0,
        &synthetic(&offered, &good, 8),
        &scenario,
        8,
        DriveStats::default(),
        None,
        None,
        Duration::from_millis(5),
    );
    assert!(slow.invalid);
    let mut h = new_hist();
    for ms in [5u64, 5, 5, 5, 500] {
        h.record(ms * 1000).unwrap();
    }
    assert!((pct_ms(&h, 50.0).unwrap() - 5.0).abs() < 0.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_end_to_end_run_writes_the_report() {
    let cfg = small_failpoint_run(&["fork-default"], 2.0);
    let bar = indicatif::ProgressBar::hidden();
    let run = runner::run(&cfg, &bar).await.expect("lab run");
    assert_eq!(run.runs.len(), 1);
    let s = &run.runs[0].summary;
    assert!(s.offered > 100, "{s:?}");
    assert!(s.good > 0, "{s:?}");
    assert!(s.attempts >= s.offered, "{s:?}");
    let dir = std::env::temp_dir().join(format!("lab-loadgen-e2e-{}", std::process::id()));
    report::write_all(&run, &dir).expect("report");
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("fork-default"), "{md}");
    let csv = std::fs::read_to_string(dir.join("series.csv")).unwrap();
    assert!(csv.starts_with("variant,run,second,phase,offered"));
    assert!(csv.lines().count() >= 3, "{csv}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(json["runs"][0]["variant"], "fork-default");
    assert!(report::text_table(&run).contains("fork-default"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The series has the fork's concurrency limit, second by second, for a variant that has one
/// (`fork-controls`), and leaves the columns empty for upstream and for fork settings without
/// the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_series_records_the_concurrency_limit_each_second() {
    let cfg = small_failpoint_run(&["fork-controls", "upstream-best", "fork-recommended"], 3.0);
    let bar = indicatif::ProgressBar::hidden();
    let run = runner::run(&cfg, &bar).await.expect("lab run");
    let csv = report::csv(&run);
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let column = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (variant, limit, waits) = (
        column("variant"),
        column("concurrency_limit"),
        column("concurrency_waits"),
    );
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    let limits: Vec<u64> = rows
        .iter()
        .filter(|r| r[variant] == "fork-controls")
        .filter_map(|r| r[limit].parse().ok())
        .collect();
    // Two clients, one server each, the limit at least its minimum of 2 (the pool's size at
    // most): seconds of the run have a sample.
    assert!(limits.len() >= 2, "{csv}");
    assert!(limits.iter().all(|&l| (4..=200).contains(&l)), "{limits:?}");
    for r in rows.iter().filter(|r| r[variant] == "fork-controls") {
        assert!(
            r[waits].is_empty() || r[waits].parse::<u64>().is_ok(),
            "{r:?}"
        );
    }
    // Upstream keeps no statistics; the recommended settings have no concurrency limit.
    for r in rows
        .iter()
        .filter(|r| r[variant] == "upstream-best" || r[variant] == "fork-recommended")
    {
        assert!(r[limit].is_empty() && r[waits].is_empty(), "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_model_run_reads_the_server_snapshot() {
    let cfg = LabConfig {
        scenario: one_phase(1.5, 2.0),
        variants: vec![Variant::parse("upstream-no-retries").unwrap()],
        capacity: 100.0,
        instances: 2,
        server_mode: ServerMode::Model,
        docs: 50,
        drain: Duration::from_millis(500),
        // One ticket per kind: admitted requests queue behind each other often enough that the
        // queue-wait percentiles have waits to show.
        model_overrides: Some(serde_json::json!({ "tickets": { "read": 1, "write": 1 } })),
        ..LabConfig::default()
    };
    let bar = indicatif::ProgressBar::hidden();
    let run = runner::run(&cfg, &bar).await.expect("lab run");
    assert_eq!(run.capacity_note, "given");
    let model = run.model_config.as_ref().expect("model settings");
    // The limiter admits 90 % of capacity by default.
    let rate = model.get_document("limiter").unwrap().get_f64("ratePerSec");
    assert!(
        rate.as_ref().is_ok_and(|r| (r - 90.0).abs() < 1e-9),
        "{rate:?}"
    );
    let s = &run.runs[0].summary;
    let server = s.server.as_ref().expect("labOverload counters");
    assert!(
        server.get("admitted").copied().unwrap_or(0.0) > 0.0,
        "{server:?}"
    );
    assert!(s.wasted_share.is_some(), "{s:?}");
    // Without retries every request is one attempt; 150 % of capacity against a 90/s limiter
    // sheds some.
    assert_eq!(s.attempts_per_request, Some(1.0));
    assert!(s.errors["overload"] > 0, "{s:?}");
    let queue = s.server_queue.expect("the model publishes queue waits");
    let max = server.get("queueWaitMs.max").copied();
    match (queue.p50, queue.p95, queue.p99, max) {
        (Some(p50), Some(p95), Some(p99), Some(max)) => {
            assert!(
                p50 <= p95 && p95 <= p99 && p99 <= max,
                "{queue:?}, max {max}"
            );
            // Well over 1 % of the requests found the one ticket taken.
            assert!(p99 > 0.0, "{queue:?}");
        }
        other => panic!("queue-wait figures missing: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_finished_after_the_application_gave_up_is_wasted() {
    // A deadline far shorter than any request's service time: the application gives up on
    // every request, the server still does the work, and the model must count it as wasted.
    let cfg = LabConfig {
        scenario: one_phase(0.5, 2.0),
        variants: vec![Variant::parse("fork-default").unwrap()],
        capacity: 100.0,
        instances: 1,
        server_mode: ServerMode::Model,
        docs: 50,
        deadline: Duration::from_millis(1),
        // Every request costs far more than the deadline plus the timer's slack.
        model_overrides: Some(serde_json::json!({
            "costs": { "pointReadMs": 20, "rangeReadMs": 20, "writeMs": 20 }
        })),
        drain: Duration::from_millis(500),
        ..LabConfig::default()
    };
    let bar = indicatif::ProgressBar::hidden();
    let run = runner::run(&cfg, &bar).await.expect("lab run");
    let s = &run.runs[0].summary;
    let server = s.server.as_ref().expect("labOverload counters");
    let abandoned = server.get("abandoned").copied().unwrap_or(0.0);
    assert!(
        abandoned >= 0.9 * s.offered as f64,
        "{abandoned} of {}: {server:?}",
        s.offered
    );
    // Wasted work is a share of all core time: never above 1 (the counters sum the same
    // nanoseconds of work, per quantum and per request).
    assert!(s.wasted_share.is_some_and(|w| w > 0.8 && w <= 1.0), "{s:?}");
    assert_eq!(s.good, 0, "{s:?}");
}

/// A client whose calls take `delay`, counting calls that ran to the end and calls dropped
/// before it.
struct CountingClient {
    delay: Duration,
    finished: Arc<std::sync::atomic::AtomicU64>,
    dropped: Arc<std::sync::atomic::AtomicU64>,
}

struct DropCounter(Arc<std::sync::atomic::AtomicU64>, bool);

impl Drop for DropCounter {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl LabClient for CountingClient {
    fn run(&self, _op: OpSpec) -> BoxFut<AttemptReport> {
        let (delay, finished) = (self.delay, self.finished.clone());
        let guard = DropCounter(self.dropped.clone(), false);
        Box::pin(async move {
            // Moves the whole guard into the future (a field assignment alone would capture
            // only the field).
            let mut guard = guard;
            tokio::time::sleep(delay).await;
            guard.1 = true;
            finished.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            succeeded_after(delay)
        })
    }

    fn warm_up(&self) -> BoxFut<Result<(), String>> {
        Box::pin(async { Ok(()) })
    }

    fn shutdown(&self) -> BoxFut<()> {
        Box::pin(async {})
    }

    fn forget(&self, _req: u64) -> u32 {
        // The call had sent its one command when it was dropped.
        1
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_deadline_drop_cancels_the_driver_call_and_continue_lets_it_finish() {
    use lab::loadgen::config::OnDeadline;
    use std::sync::atomic::{AtomicU64, Ordering};
    let scenario = one_phase(1.0, 0.5);
    let mix = OpMix::default();
    let schedules = schedule::build(&ScheduleSpec {
        phases: &scenario.phases,
        capacity: 100.0,
        instances: 1,
        arrivals: Arrivals::Fixed,
        mix: &mix,
        docs: 10,
        seed: 1,
    });
    let n = schedules[0].len() as u64;
    assert_eq!(n, 50);
    for mode in [OnDeadline::Continue, OnDeadline::Drop] {
        let (finished, dropped) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        // Every call takes 200 ms against a 50 ms deadline.
        let client: Arc<dyn LabClient> = Arc::new(CountingClient {
            delay: Duration::from_millis(200),
            finished: finished.clone(),
            dropped: dropped.clone(),
        });
        let recorder = Arc::new(Recorder::new(Instant::now() + Duration::from_millis(20)));
        let opts = RequestOpts {
            on_deadline: mode,
            ..RequestOpts::new(Duration::from_millis(50), Duration::from_secs(1), 5)
        };
        let stats = drive_all(&[client], &schedules, recorder.clone(), opts).await;
        assert_eq!(stats.unfinished, 0, "{mode:?}");
        let secs = recorder.take(1);
        let sum = |f: fn(&Second) -> u64| secs.iter().map(f).sum::<u64>();
        let timed_out = sum(|s| s.error(lab::loadgen::ErrorClass::ClientDeadline));
        assert_eq!(timed_out, n, "{mode:?}");
        // Every request reports its one attempt either way.
        assert_eq!((sum(|s| s.reported), sum(|s| s.reported_attempts)), (n, n));
        match mode {
            OnDeadline::Continue => {
                assert_eq!(finished.load(Ordering::Relaxed), n);
                assert_eq!(dropped.load(Ordering::Relaxed), 0);
                assert_eq!(sum(|s| s.late_ok), n);
            }
            OnDeadline::Drop => {
                assert_eq!(finished.load(Ordering::Relaxed), 0);
                assert_eq!(dropped.load(Ordering::Relaxed), n);
                assert_eq!(sum(|s| s.late_ok), 0);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_sends_the_next_request_when_the_previous_returned() {
    use lab::loadgen::drive::{drive_closed, ClosedLoop};
    let calls = Arc::new(Mutex::new(Vec::new()));
    let client: Arc<dyn LabClient> = Arc::new(SlowClient {
        delay: Duration::from_millis(50),
        calls: calls.clone(),
    });
    let recorder = Arc::new(Recorder::new(Instant::now() + Duration::from_millis(20)));
    let spec = ClosedLoop {
        workers: 4,
        length: Duration::from_secs(1),
        mix: OpMix::default(),
        docs: 10,
        seed: 3,
    };
    let opts = RequestOpts::new(Duration::from_millis(500), Duration::from_secs(1), 5);
    let stats = drive_closed(&[client], &spec, recorder.clone(), opts).await;
    // Four workers, 50 ms per request, one second: at most 4 × 20 requests, and a loaded
    // machine's timer slack only makes fewer.
    assert!(stats.sent <= 84 && stats.sent >= 40, "{stats:?}");
    assert_eq!(stats.unfinished, 0);
    assert_eq!(calls.lock().unwrap().len() as u64, stats.sent);
    let secs = recorder.take(1);
    let good: u64 = goodput(&secs).iter().sum();
    assert_eq!(good, stats.sent);
    assert_eq!(secs.iter().map(|s| s.offered).sum::<u64>(), stats.sent);
}
