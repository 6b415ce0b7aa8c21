//! A short soak (`lab run --soak`, `lab::loadgen::soak`) at small scale: 12 s of the fork's
//! recommended settings at 150 % of the calibrated capacity with overload, connection drops and
//! step-downs, sampled every second, then the drain check. Resident memory is sampled but its
//! growth is not judged here: in 12 s the pools and the server's session table are still
//! filling (the 10-minute reference run in docs/lab.md judges it after its first minute).

use std::time::Duration;

use indicatif::ProgressBar;
use lab::loadgen::config::LabConfig;
use lab::loadgen::soak::{self, SoakConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_soak_drains_with_nothing_left_behind() {
    let lab = LabConfig {
        instances: 2,
        max_pool_size: 50,
        docs: 500,
        // The model's limiter alone sheds only when the pools let more than its rate through,
        // which 150 % of capacity under a 100 ms deadline does on some runs and not on others
        // (0 overload errors in about one run in four here): the pools' queues expire most of
        // the excess first. Random rejections make the overload fault happen on every run.
        random_reject_share: 0.02,
        ..LabConfig::default()
    };
    let mut cfg = SoakConfig::new(Duration::from_secs(12), lab);
    cfg.step_down_every = Some(Duration::from_secs(3));
    cfg.grace = Duration::from_secs(2);
    let report = tokio::time::timeout(
        Duration::from_secs(90),
        soak::run(&cfg, &ProgressBar::hidden()),
    )
    .await
    .expect("the soak finishes within 90 s")
    .expect("the soak runs");
    let summary = soak::markdown(&report);
    eprintln!("{summary}");
    assert!(
        report.drain.failures.is_empty(),
        "drain check: {:?}",
        report.drain.failures
    );
    // One sample a second of load (the sampler may miss a tick on a busy machine).
    assert!(
        report.samples.len() >= 9,
        "{} samples",
        report.samples.len()
    );
    assert!(report.samples.iter().all(|s| s.rss_kib > 0));
    assert!(report.samples.iter().any(|s| s.in_flight > 0));
    assert!(report.samples.iter().any(|s| s.sessions > 0));
    // The faults happened: step-downs, overload errors, dropped connections.
    assert!(report.step_downs >= 2, "{} step-downs", report.step_downs);
    let overload: u64 = report.samples.iter().map(|s| s.overload_errors).sum();
    assert!(overload > 0, "no overload errors");
    assert!(report.drain.network_errors > 0, "no connection was dropped");
    assert!(report.totals.good > 0 && report.totals.sent > report.totals.good);
    assert_eq!(report.totals.unfinished, 0);
    // The written report holds the samples.
    let out = std::env::temp_dir().join(format!("lab-soak-test-{}", std::process::id()));
    soak::write(&report, &out).expect("the report is written");
    let csv = std::fs::read_to_string(out.join("soak.csv")).expect("soak.csv");
    assert_eq!(csv.lines().count(), report.samples.len() + 1);
    let _ = std::fs::remove_dir_all(&out);
}
