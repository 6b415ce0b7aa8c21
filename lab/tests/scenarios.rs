//! The named scenarios on small settings: each shows the effect it exists for, against the
//! in-process emulator, in a few seconds. Rates are low (a debug build of two drivers and the
//! emulator shares a busy 2-core machine), and each assertion leaves a wide margin.

use std::time::Duration;

use lab::loadgen::config::{LabConfig, Length, Phase, Scenario, Variant};
use lab::loadgen::runner::{self, LabRun};
use lab::loadgen::scenarios::{ScenarioName, ScenarioParams};
use lab::loadgen::summary::RunSummary;
use lab::loadgen::verdict;

/// A configuration of `name` at `capacity` ops/s for `variants`, with the scenario's own
/// settings applied over `base` and its schedule replaced by `phases`.
fn scenario(
    name: ScenarioName,
    base: LabConfig,
    params: &ScenarioParams,
    phases: Vec<Phase>,
) -> LabConfig {
    let mut cfg = base;
    name.apply(&mut cfg, Length::Suite, params);
    let burst = (phases.len() == 3).then_some(1);
    cfg.scenario = Scenario {
        name: name.name().into(),
        phases,
        burst,
    };
    cfg
}

fn small(capacity: f64, variants: &[&str]) -> LabConfig {
    LabConfig {
        variants: variants
            .iter()
            .map(|v| Variant::parse(v).expect("built-in variant"))
            .collect(),
        capacity,
        instances: 2,
        docs: 50,
        drain: Duration::from_millis(500),
        ..LabConfig::default()
    }
}

/// Held for each run: the tests of this file take turns, so that none of them shares the two
/// cores with another's drivers and emulator (run side by side, a step-down's retries and the
/// overload they meet depended on which other scenarios ran at the same moment).
static ONE_SCENARIO_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn run(cfg: &LabConfig) -> LabRun {
    let _turn = ONE_SCENARIO_AT_A_TIME.lock().await;
    let bar = indicatif::ProgressBar::hidden();
    runner::run(cfg, &bar).await.expect("lab run")
}

fn of<'a>(run: &'a LabRun, variant: &str) -> &'a RunSummary {
    &run.runs
        .iter()
        .find(|r| r.variant.name == variant)
        .expect("variant ran")
        .summary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_rejections_are_what_default_retries_recover() {
    // One in five admitted requests is rejected at random (the default is one in twenty; a
    // larger share keeps the difference far above the noise of 200 requests). The scenario's
    // deadline is long enough for a retry's backoff, so a retried request can still succeed in
    // time.
    let params = ScenarioParams {
        reject_share: 0.2,
        ..ScenarioParams::default()
    };
    let cfg = scenario(
        ScenarioName::Transient,
        small(100.0, &["upstream-default", "upstream-no-retries"]),
        &params,
        vec![Phase::new("base", 0.5, 4.0)],
    );
    assert_eq!(cfg.random_reject_share, 0.2);
    assert_eq!(cfg.deadline, Duration::from_secs(1));
    let run = run(&cfg).await;
    let retried = of(&run, "upstream-default");
    let single = of(&run, "upstream-no-retries");
    // Both variants got the same schedule.
    assert_eq!(retried.offered, single.offered);
    let offered = single.offered as f64;
    assert!(offered > 150.0, "{single:?}");
    // Without retries about a fifth fail with an overload error; with them almost none.
    assert!(
        single.errors["overload"] as f64 > 0.1 * offered,
        "{single:?}"
    );
    assert!(
        retried.good as f64 >= single.good as f64 + 0.1 * offered,
        "default {} vs no retries {} of {offered}",
        retried.good,
        single.good
    );
    assert!(
        retried.attempts_per_request.is_some_and(|a| a > 1.1),
        "{retried:?}"
    );
    // The verdict ranks transient by success share, and judges no variant from one run.
    let v = verdict::scenario_verdict(&run);
    assert_eq!(v.primary, verdict::Primary::SuccessShare);
    assert!(v.variants.iter().all(|x| !x.judged && x.runs == 1), "{v:?}");
    assert_eq!(v.best_upstream, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_limiter_overload_is_queueing_not_errors() {
    // Ten times the lab's costs: about 83 ops/s on the model's 2 cores, so 200 % of 80 ops/s
    // builds a queue of seconds within the burst while the generator stays slow.
    let base = LabConfig {
        model_overrides: Some(serde_json::json!({
            "costs": { "pointReadMs": 20, "rangeReadMs": 50, "writeMs": 30 }
        })),
        ..small(80.0, &["upstream-default"])
    };
    let cfg = scenario(
        ScenarioName::NoLimiter,
        base,
        &ScenarioParams::default(),
        vec![
            Phase::new("base", 0.5, 1.0),
            Phase::new("burst", 2.0, 3.0),
            Phase::new("after", 0.5, 1.0),
        ],
    );
    assert_eq!(cfg.limiter_share, 0.0);
    let run = run(&cfg).await;
    let s = of(&run, "upstream-default");
    assert_eq!(s.errors["overload"], 0, "{s:?}");
    assert_eq!(s.attempt_errors["overload"], 0, "{s:?}");
    assert!(s.errors["deadline"] > 20, "{s:?}");
    let queue = s.server_queue.expect("the model publishes queue waits");
    // Requests waited in the server's ticket queue longer than the application's deadline.
    assert!(
        queue
            .p99
            .is_some_and(|p| p > cfg.deadline.as_millis() as f64),
        "{queue:?}"
    );
    let server = s.server.as_ref().expect("server counters");
    assert_eq!(server.get("rejected").copied(), Some(0.0), "{server:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_rejections_costs_server_core_time() {
    // 500 % of 60 ops/s against a limiter at 54/s: most requests are rejected, each costing
    // the default 0.3 ms of the one core.
    let cfg = scenario(
        ScenarioName::Flood,
        small(60.0, &["upstream-no-retries"]),
        &ScenarioParams::default(),
        vec![Phase::new("flood", 5.0, 2.0)],
    );
    let run = run(&cfg).await;
    let s = of(&run, "upstream-no-retries");
    let server = s.server.as_ref().expect("server counters");
    let rejected = server.get("rejected").copied().unwrap_or(0.0);
    assert!(rejected > 0.5 * s.offered as f64, "{server:?}");
    // About 250 rejections/s × 0.3 ms against about 130 ms/s of admitted work: over a third.
    let share = s.rejection_share.expect("rejection work share");
    assert!(share > 0.1, "{share}: {server:?}");
    // One run is not judged: the verdict shows no figure for it.
    let v = verdict::scenario_verdict(&run);
    assert!(!v.variants[0].judged && v.variants[0].rejection_share.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_retries_multiply_attempts() {
    // The driver does not retry; the application retries each overload error twice while its
    // deadline allows, at 200 % of a 60 ops/s limiter.
    let cfg = scenario(
        ScenarioName::AppRetries,
        small(60.0, &["upstream-no-retries"]),
        &ScenarioParams::default(),
        vec![Phase::new("overload", 2.0, 2.0)],
    );
    assert_eq!(cfg.app_retries, 2);
    let run = run(&cfg).await;
    let s = of(&run, "upstream-no-retries");
    let tries = s.tries_per_request.expect("tries");
    let attempts = s.attempts_per_request.expect("attempts");
    assert!(tries > 1.2 && tries <= 3.0, "{s:?}");
    // Without driver retries every driver call is one command.
    assert!((attempts - tries).abs() < 1e-9, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_retry_budget_bounds_application_and_driver_retries() {
    // The same 200 % as above, with the fork's budget and timeoutMS: the application asks the
    // client's budget before each of its retries, so its retries and the driver's draw from
    // one budget per client (9 % of its requests, plus a reserve of 10 and one a second),
    // while upstream's application and driver retries multiply.
    let cfg = scenario(
        ScenarioName::AppRetries,
        small(60.0, &["upstream-default", "fork-budget-timeout"]),
        &ScenarioParams::default(),
        vec![Phase::new("overload", 2.0, 2.0)],
    );
    let run = run(&cfg).await;
    let upstream = of(&run, "upstream-default");
    let fork = of(&run, "fork-budget-timeout");
    assert!(
        upstream.fork_stats.is_none(),
        "upstream keeps no statistics"
    );
    let stats = fork.fork_stats.expect("the fork's statistics");
    assert!(stats.app_retries_refused > 0, "{stats:?}");
    assert!(stats.retries_refused > 0, "{stats:?}");
    // The budget pays for the retries of operations that did not succeed: those it admitted,
    // less those refunded when their operation then succeeded.
    let paid_for = stats.retries_made + stats.app_retries_made - stats.retries_refunded;
    // Two seconds of schedule, at most one of drain.
    let floor = cfg.instances as f64 * (10.0 + 3.0);
    assert!(
        paid_for as f64 <= floor + 0.09 * fork.offered as f64,
        "{stats:?}"
    );
    let attempts = fork.attempts_per_request.expect("attempts");
    assert!(attempts <= 1.3, "{fork:?}");
    let upstream_attempts = upstream.attempts_per_request.expect("attempts");
    assert!(upstream_attempts > attempts + 0.5, "{upstream:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_close_connections_and_step_the_primary_down() {
    // The audit's faults at ten times their shares, so that 4 s at 40 ops/s meet some: a
    // fifth of the writes lose their connection before or after running, and the primary
    // steps down every second. The driver's retries recover most of it within the scenario's
    // 1 s deadline.
    let base = small(80.0, &["upstream-default"]);
    let mut cfg = scenario(
        ScenarioName::Faults,
        base,
        &ScenarioParams::default(),
        vec![Phase::new("faults", 0.5, 4.0)],
    );
    assert_eq!(cfg.members, 3);
    cfg.faults = Some(lab::loadgen::config::Faults {
        drop_before: 0.2,
        drop_after: 0.2,
        step_down_every: Duration::from_secs(1),
    });
    let run = run(&cfg).await;
    let s = of(&run, "upstream-default");
    assert!(s.offered > 100, "{s:?}");
    assert!(
        s.attempt_errors["network"] > 0,
        "connections closed: {:?}",
        s.attempt_errors
    );
    // Attempts per request can stay below one here (a request whose connection is dropped
    // while it is established, or whose selection outlasts a step-down, sends no command), so
    // the retries are counted per request.
    assert!(s.retried > 0, "{s:?}");
    assert!(s.success_share.is_some_and(|x| x > 0.5), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_hot_member_sheds() {
    // Capacity 45 ops/s (each member's three cores at a mean of about 67 ms per read), and the
    // hot member admits a third of it. 150 % of 15 ops/s is about 22 ops/s per member: the hot
    // member's limiter (13.5/s) rejects a third of what reaches it, the others' (40.5/s) see
    // about half their rate.
    let base = LabConfig {
        model_overrides: Some(serde_json::json!({
            "costs": { "pointReadMs": 60, "rangeReadMs": 130 }
        })),
        ..small(45.0, &["upstream-no-retries"])
    };
    let cfg = scenario(
        ScenarioName::HotMember,
        base,
        &ScenarioParams::default(),
        vec![Phase::new("hot", 1.5, 4.0)],
    );
    assert_eq!(cfg.members, 3);
    assert!(cfg.client_options.contains("readPreference=nearest"));
    let run = run(&cfg).await;
    let s = of(&run, "upstream-no-retries");
    let server = s.server.as_ref().expect("server counters");
    let member = |i: usize, k: &str| {
        server
            .get(&format!("member{i}.{k}"))
            .copied()
            .unwrap_or_else(|| panic!("member{i}.{k} missing: {server:?}"))
    };
    // Every member served reads.
    for i in 0..3 {
        assert!(member(i, "admitted") > 10.0, "member {i}: {server:?}");
    }
    assert!(member(1, "rejected") > 10.0, "{server:?}");
    assert_eq!(member(0, "rejected"), 0.0, "{server:?}");
    assert_eq!(member(2, "rejected"), 0.0, "{server:?}");
    // The deployment's totals add the members up.
    let total: f64 = (0..3).map(|i| member(i, "rejected")).sum();
    assert_eq!(server.get("rejected").copied(), Some(total));
    assert!(s.errors["overload"] > 0, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_hot_shard_sheds_and_cold_shard_requests_are_counted_apart() {
    // `only_the_hot_member_sheds`'s rates, through three routers to three shards: each shard
    // gets about 22 ops/s, the hot shard's limiter admits 13.5/s, the others' 40.5/s.
    let base = LabConfig {
        model_overrides: Some(serde_json::json!({
            "costs": { "pointReadMs": 60, "rangeReadMs": 130 }
        })),
        ..small(45.0, &["upstream-no-retries"])
    };
    let cfg = scenario(
        ScenarioName::HotShard,
        base,
        &ScenarioParams::default(),
        vec![Phase::new("hot", 1.5, 4.0)],
    );
    assert_eq!((cfg.sharding.routers, cfg.sharding.shards), (3, 3));
    let run = run(&cfg).await;
    let s = of(&run, "upstream-no-retries");
    let server = s.server.as_ref().expect("server counters");
    let shard = |i: usize, k: &str| {
        server
            .get(&format!("shard{i}.{k}"))
            .copied()
            .unwrap_or_else(|| panic!("shard{i}.{k} missing: {server:?}"))
    };
    // Every shard served reads: the collection is split in thirds over them.
    for i in 0..3 {
        assert!(shard(i, "admitted") > 10.0, "shard {i}: {server:?}");
    }
    assert!(shard(1, "rejected") > 10.0, "{server:?}");
    assert_eq!(shard(0, "rejected"), 0.0, "{server:?}");
    assert_eq!(shard(2, "rejected"), 0.0, "{server:?}");
    // About two thirds of the requests touch only the cold shards, and they succeed.
    let cold = s
        .cold_shards
        .expect("a sharded run counts its cold-shard requests");
    let share = cold.offered as f64 / s.offered as f64;
    assert!((0.5..0.8).contains(&share), "{cold:?} of {}", s.offered);
    assert!(
        cold.good <= cold.offered && cold.good <= s.good,
        "{cold:?} {s:?}"
    );
    assert!(
        cold.good as f64 >= 0.9 * cold.offered as f64,
        "{cold:?} {s:?}"
    );
    assert!(s.good < s.offered, "the hot shard's requests fail: {s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_or_four_shards_each_get_their_range_and_routers_told_not_to_retry_do_not() {
    use lab::loadgen::config::ShardOptions;
    // `lab run --shards 2 --hot-share 0.05 --router-retries 0 --router-shard-labels`: half the
    // keys on a hot shard that admits a twentieth of the other's rate, behind routers that pass
    // every overload error on at once (the shard's labels with it).
    let base = LabConfig {
        model_overrides: Some(serde_json::json!({
            "costs": { "pointReadMs": 60, "rangeReadMs": 130 }
        })),
        ..small(45.0, &["upstream-no-retries"])
    };
    let two = ShardOptions {
        shards: Some(2),
        hot_share: Some(0.05),
        router_retries: Some(0),
        router_shard_labels: true,
    };
    let mut cfg = scenario(
        ScenarioName::HotShard,
        base.clone(),
        &ScenarioParams::default(),
        // 100 % of one shard's capacity over two: each at half its own, as in `hot-shard`.
        vec![Phase::new("hot", 1.0, 3.0)],
    );
    ScenarioName::HotShard
        .apply_shard_options(&mut cfg, &two)
        .expect("hot-shard takes them");
    let hot = run(&cfg).await;
    let s = of(&hot, "upstream-no-retries");
    let server = s.server.as_ref().expect("server counters");
    let get = |k: &str| {
        server
            .get(k)
            .copied()
            .unwrap_or_else(|| panic!("{k} missing: {server:?}"))
    };
    // Split at the middle, the upper half moved to shard 1: both serve reads.
    assert!(get("shard0.admitted") > 10.0, "{server:?}");
    assert!(get("shard1.admitted") > 0.0, "{server:?}");
    assert!(get("shard1.rejected") > 10.0, "{server:?}");
    assert_eq!(get("shard0.rejected"), 0.0, "{server:?}");
    assert!(!server.contains_key("shard2.admitted"), "{server:?}");
    // The shard's overload errors reached the driver without one retry by a router.
    assert!(get("shard1.routing.overloadErrors") > 10.0, "{server:?}");
    assert_eq!(get("routing.overloadRetries"), 0.0, "{server:?}");
    assert!(s.errors["overload"] > 0, "{s:?}");
    // About half the requests are cold (shard 0's) and they succeed.
    let cold = s.cold_shards.expect("cold-shard requests");
    let share = cold.offered as f64 / s.offered as f64;
    assert!((0.3..0.7).contains(&share), "{cold:?} of {}", s.offered);
    assert!(cold.good as f64 >= 0.9 * cold.offered as f64, "{cold:?}");

    // Four shards, no hot one: range `i` on shard `i`, each serving its quarter.
    let mut cfg = scenario(
        ScenarioName::EvenShards,
        base,
        &ScenarioParams::default(),
        vec![Phase::new("even", 1.5, 3.0)],
    );
    let four = ShardOptions {
        shards: Some(4),
        ..ShardOptions::default()
    };
    ScenarioName::EvenShards
        .apply_shard_options(&mut cfg, &four)
        .expect("even-shards takes them");
    let even = run(&cfg).await;
    let s = of(&even, "upstream-no-retries");
    let server = s.server.as_ref().expect("server counters");
    for i in 0..4 {
        let admitted = server.get(&format!("shard{i}.admitted")).copied();
        assert!(admitted.is_some_and(|a| a > 3.0), "shard {i}: {server:?}");
    }
    assert!(!server.contains_key("shard4.admitted"), "{server:?}");
}
