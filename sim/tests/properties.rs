//! Properties of the simulator that could fail: determinism, conservation, the low-load and
//! overload regimes, and what happens to the controls as the number of clients grows.

use std::time::Duration;

use sim::report::Report;
use sim::{Length, RunConfig, Scenario, ScenarioName, Variant};

fn run(scenario: Scenario, variant: Variant, clients: u32, seed: u64) -> Report {
    sim::run(&RunConfig::new(scenario, variant, clients, seed)).expect("valid configuration")
}

/// 200 % of capacity for `secs`.
fn sustained(secs: f64) -> Scenario {
    ScenarioName::Sustained.build(Length::Suite, Some(secs))
}

/// The figures two runs must share to be the same run.
fn fingerprint(r: &Report) -> Vec<u64> {
    vec![
        r.requests,
        r.success,
        r.rejected,
        r.local,
        r.deadline,
        r.first_attempts,
        r.retries,
        r.local_rejections,
        r.budget_refusals,
        r.server.attempts,
        r.server.rejected,
        r.server.expired,
        r.server.busy_ns,
        r.server.wasted_ns,
        r.events,
        (r.p99_ms * 1000.0) as u64,
    ]
}

#[test]
fn a_seed_fixes_the_run_and_every_variant_meets_the_same_arrivals() {
    let a = run(sustained(3.0), Variant::ForkControls, 16, 7);
    let b = run(sustained(3.0), Variant::ForkControls, 16, 7);
    assert_eq!(fingerprint(&a), fingerprint(&b));
    let c = run(sustained(3.0), Variant::ForkControls, 16, 8);
    assert_ne!(
        fingerprint(&a),
        fingerprint(&c),
        "another seed, another run"
    );
    // The arrival stream is independent of what the policies draw.
    for v in Variant::ALL {
        let r = run(sustained(3.0), v, 16, 7);
        assert_eq!(r.requests, a.requests, "{}", v.name());
        assert_eq!(r.phase_requests, a.phase_requests, "{}", v.name());
    }
}

#[test]
fn every_request_ends_exactly_once() {
    for scenario in ScenarioName::ALL.into_iter().chain(ScenarioName::SHARDED) {
        for v in Variant::ALL {
            let built = scenario.build(Length::Suite, Some(3.0));
            let deadline = built.deadline.unwrap_or(Duration::from_millis(100));
            let r = run(built, v, 8, 1);
            let name = format!("{} {}", scenario.name(), v.name());
            assert!(r.requests > 0, "{name}");
            assert_eq!(
                r.unfinished, 0,
                "{name}: operations left when the loop stopped"
            );
            assert_eq!(r.ended(), r.requests, "{name}: {r:?}");
            // Every attempt sent reached the server, which answered it. On a cluster each
            // reached a router, which sent it to one shard or two (a range read across a split
            // point) and retried the shards' overload errors.
            let sent = r.first_attempts + r.retries;
            if ScenarioName::SHARDED.contains(&scenario) {
                assert!(r.server.attempts >= sent + r.router_retries, "{name}");
                assert!(r.server.attempts <= 2 * sent + r.router_retries, "{name}");
            } else {
                assert_eq!(r.server.attempts, sent, "{name}");
            }
            assert_eq!(
                r.server.attempts,
                r.server.rejected + r.server.completed + r.server.expired,
                "{name}"
            );
            // A request sent its first attempt, or nothing at all (rejected locally, or out of
            // time waiting for a concurrency slot).
            assert_eq!(r.first_attempts + r.unsent, r.requests, "{name}");
            assert!(r.unsent >= r.local_rejections, "{name}");
            assert!(r.server.busy_ns >= r.server.wasted_ns, "{name}");
            // The event heap is bounded by what is in flight and the deadline timers of the
            // requests that arrived within one deadline (a timer stays queued after its request
            // ends), not by the schedule's length.
            let in_flight = r.peak_ops + r.server.peak_jobs;
            let timers = (r.requests as f64 / 3.0 * deadline.as_secs_f64() * 2.0).ceil() as u64;
            assert!(
                r.peak_events <= 8 * in_flight + 8 + timers,
                "{name}: {} events pending at most, {in_flight} in flight at most",
                r.peak_events
            );
        }
    }
}

#[test]
fn at_low_load_every_request_succeeds_at_once() {
    for v in Variant::ALL {
        let r = run(Scenario::steady(0.3, 10.0), v, 16, 3);
        let name = v.name();
        assert_eq!(r.success, r.requests, "{name}: {r:?}");
        assert_eq!(r.retries, 0, "{name}");
        assert_eq!(r.server.rejected, 0, "{name}");
        assert_eq!(r.local_rejections, 0, "{name}");
        // Goodput is the offered load: 0.3 × capacity, within Poisson noise (about 1.2 % at
        // 2,500 requests; 5 % is four standard deviations).
        let offered = 0.3 * r.capacity;
        assert!((r.goodput() - offered).abs() < 0.05 * offered, "{name}");
        assert!(r.p99_ms < 20.0, "{name}: p99 {} ms", r.p99_ms);
        assert!((r.utilization() - 0.3).abs() < 0.03, "{name}");
    }
}

#[test]
fn under_sustained_overload_upstream_sends_more_attempts_than_the_budget() {
    let upstream = run(sustained(10.0), Variant::UpstreamBest, 4, 2);
    let budget = run(sustained(10.0), Variant::ForkBudgetTimeout, 4, 2);
    let defaults = run(sustained(10.0), Variant::UpstreamDefault, 4, 2);
    assert!(
        upstream.attempts_per_request() > budget.attempts_per_request() + 0.1,
        "upstream-best {} vs fork-budget-timeout {}",
        upstream.attempts_per_request(),
        budget.attempts_per_request()
    );
    // The call that goes on after the deadline makes both retries (about 2.4 attempts) when
    // nothing holds it back; the pool of 100 connections per client does, as the lab's
    // does: calls wait for a connection while earlier ones queue at the server.
    let mut unbounded = RunConfig::new(sustained(10.0), Variant::UpstreamDefault, 4, 2);
    unbounded.pool_size = 100_000;
    let unbounded = sim::run(&unbounded).expect("valid");
    assert!(unbounded.attempts_per_request() > 2.0);
    assert!(defaults.checkout_waits > 0);
    assert!(defaults.attempts_per_request() < unbounded.attempts_per_request());
    // The budget holds retries near its 9 % share (plus its floor of 4 clients × 1 a second).
    assert!(
        budget.retries_per_first() < 0.13,
        "{}",
        budget.retries_per_first()
    );
    assert!(budget.budget_refusals > 0);
    assert!(budget.goodput() > upstream.goodput());
}

#[test]
fn the_budget_holds_under_sustained_overload_whatever_the_number_of_clients() {
    // Same total load, split over more clients. Each client's budget has its own floor (1
    // retry a second), which alone would grow with the fleet: 4,000 clients would have 4,000
    // retries a second to spend, as many as `timeoutMS` alone makes. The budget admits no
    // retry while the client's servers reject most of its attempts, so at a saturated server
    // the fleet's retries stay as low as four clients' and far below the unbudgeted ones.
    let scenario = || sustained(10.0);
    let few = run(scenario(), Variant::ForkBudgetTimeout, 4, 5);
    let many = run(scenario(), Variant::ForkBudgetTimeout, 1_000, 5);
    let fleet = run(scenario(), Variant::ForkBudgetTimeout, 4_000, 5);
    let unbudgeted = run(scenario(), Variant::ForkTimeout, 4_000, 5);
    for (clients, report) in [(4, &few), (1_000, &many), (4_000, &fleet)] {
        let retries = report.retries_per_first();
        assert!(retries <= 0.10, "{clients} clients: {retries}");
        assert!(report.budget_refusals > 0, "{clients} clients");
    }
    assert!(
        fleet.retries_per_first() < unbudgeted.retries_per_first() / 3.0,
        "{} against {} without a budget",
        fleet.retries_per_first(),
        unbudgeted.retries_per_first()
    );
    assert!(fleet.goodput() > unbudgeted.goodput());
}

#[test]
fn the_throttle_reads_its_history_when_each_client_sees_few_requests() {
    // `adaptiveThrottleMinRequests` (20 per 10 s window): at 4 clients each sees about 500
    // requests a second and throttles the flood from its window; at 2,000 clients each sees
    // one a second, never fills a window, and throttles from up to two minutes of history once
    // that holds 20 requests and the server's latest answer was a rejection. Before the
    // history, the fleet flooded the server unthrottled (0.16 of capacity, as without retries).
    let flood = || ScenarioName::Flood.build(Length::Suite, Some(60.0));
    let few = run(flood(), Variant::ForkRecommended, 4, 6);
    let fleet = run(flood(), Variant::ForkRecommended, 2_000, 6);
    let unthrottled = run(flood(), Variant::UpstreamBestNoRetries, 2_000, 6);
    assert!(few.local_share() > 0.5, "{}", few.local_share());
    assert!(fleet.local_share() > 0.2, "{}", fleet.local_share());
    assert!(
        fleet.goodput() > 2.5 * unthrottled.goodput(),
        "{} against {}",
        fleet.goodput(),
        unthrottled.goodput()
    );
}

#[test]
fn a_fleet_retries_scattered_rejections() {
    // 30 % of attempts rejected at random, at half of capacity: the budget admits no retry
    // while most of a client's recent attempts were rejected, and a client that sent one
    // attempt in its window, rejected, looked like a shedding server; it now reads two
    // minutes of history below 20 attempts. 1,000 clients make 89.0 % succeed with one
    // window, 93 % with the history, upstream's retries 97.3 %.
    let transient = || ScenarioName::Transient.build(Length::Suite, Some(60.0));
    let fleet = run(transient(), Variant::ForkRecommended, 1_000, 6);
    let upstream = run(transient(), Variant::UpstreamBest, 1_000, 6);
    let share = |r: &Report| r.success as f64 / r.requests as f64;
    assert!(share(&fleet) > 0.91, "{}", share(&fleet));
    assert!(share(&upstream) > share(&fleet), "{}", share(&upstream));
}

#[test]
fn invalid_configurations_are_refused_with_a_message() {
    let mut cfg = RunConfig::new(sustained(1.0), Variant::UpstreamBest, 0, 1);
    assert!(sim::run(&cfg).unwrap_err().contains("clients"));
    cfg.clients = 4;
    cfg.capacity = Some(f64::NAN);
    assert!(sim::run(&cfg).unwrap_err().contains("capacity"));
    cfg.capacity = None;
    cfg.scenario.phases[0].load = -1.0;
    assert!(sim::run(&cfg).unwrap_err().contains("load"));
    cfg.scenario.phases[0].load = 1.0;
    cfg.scenario.phases[0].secs = f64::INFINITY;
    assert!(sim::run(&cfg).is_err());
}

#[test]
fn the_deadline_gate_holds_for_clients_that_see_no_success() {
    // `timeoutMS` declines a retry whose backoff plus the server's typical service time would
    // pass the deadline. Four clients in a flood each see hundreds of successes and decline
    // almost every retry. A thousand clients each see a handful at most; until 2026-12-06 their
    // estimate stayed unknown (zero), the retries went out (0.08 per first attempt over 60 s)
    // and their rejections took the one-core server from 0.066 of capacity to 0.012. The
    // rejections' own round trips now stand in for the missing successes, and the gate holds
    // at both counts.
    let flood = || ScenarioName::Flood.build(Length::Suite, Some(10.0));
    let few = run(flood(), Variant::ForkTimeout, 4, 9);
    let fleet = run(flood(), Variant::ForkTimeout, 1_000, 9);
    for (clients, report) in [(4, &few), (1_000, &fleet)] {
        assert!(
            report.retries_per_first() < 0.02,
            "{clients} clients: {} retries per first attempt",
            report.retries_per_first()
        );
    }
    assert!(
        fleet.cannot_finish * 10 > few.cannot_finish * 8,
        "the fleet's gate declines about as often: {} against {}",
        fleet.cannot_finish,
        few.cannot_finish
    );
    assert!(
        fleet.goodput_share() > 0.7 * few.goodput_share(),
        "no collapse: {} against {}",
        fleet.goodput_share(),
        few.goodput_share()
    );
}

#[test]
fn pending_events_follow_what_is_in_flight_not_the_schedule() {
    // With deadlines everywhere (`maxTimeMS` on reads, dropped calls, `timeoutMS`), what is in
    // flight is bounded, and so is the heap: a run four times as long holds about as many
    // events at its peak.
    for v in [Variant::UpstreamBest, Variant::ForkControls] {
        let short = run(sustained(5.0), v, 64, 11);
        let long = run(sustained(20.0), v, 64, 11);
        assert!(
            long.peak_events < 2 * short.peak_events,
            "{}: {} events at 20 s against {} at 5 s",
            v.name(),
            long.peak_events,
            short.peak_events
        );
    }
    // Without any deadline (`upstream-default`: no `maxTimeMS`, calls that go on) the server's
    // ticket queue grows through 200 % overload, as the emulator's does (the lab's runs of it
    // end with unfinished requests); the heap grows with it, and only with it.
    let r = run(sustained(20.0), Variant::UpstreamDefault, 64, 11);
    let in_flight = r.peak_ops + r.server.peak_jobs;
    assert!(r.peak_events <= 8 * in_flight + 8);
}

#[test]
fn nominal_capacity_is_what_the_cores_complete_with_the_hand_off() {
    let mut cfg = RunConfig::new(sustained(1.0), Variant::UpstreamBest, 4, 1);
    let server = cfg.server_config();
    // 0.8 × 2 + 0.1 × 5 + 0.1 × 3 = 2.4 ms and 2.4 slices per request of the mix.
    let with = cfg.effective_capacity(&server);
    let expected = 2000.0 / (2.4 + 2.4 * sim::server::HANDOFF_MS);
    assert!((with - expected).abs() < 1e-6, "{with} vs {expected}");
    cfg.server.handoff_ms = 0.0;
    let ideal = cfg.effective_capacity(&cfg.server_config());
    assert!((ideal - 2000.0 / 2.4).abs() < 1e-6, "{ideal}");
    // At the lab's load of 200 %, the hand-off's lost core time lowers goodput: the server's
    // queues stay longer.
    let lab_cap = Some(750.0);
    let mut a = RunConfig::new(sustained(5.0), Variant::UpstreamNoRetries, 4, 4);
    a.capacity = lab_cap;
    let slow = sim::run(&a).expect("valid");
    a.server.handoff_ms = 0.0;
    let fast = sim::run(&a).expect("valid");
    assert!(
        slow.goodput() < fast.goodput(),
        "{} vs {}",
        slow.goodput(),
        fast.goodput()
    );
}

/// The per-second series adds up to the run's totals, changes nothing in the run, and carries
/// the concurrency limit only for a variant that has one.
#[test]
fn the_per_second_series_adds_up_to_the_run() {
    let scenario = sustained(3.0);
    let plain = run(scenario.clone(), Variant::ForkControls, 4, 7);
    assert!(plain.seconds.is_empty(), "off unless asked for");
    let mut cfg = RunConfig::new(scenario.clone(), Variant::ForkControls, 4, 7);
    cfg.series = true;
    let traced = sim::run(&cfg).expect("valid configuration");
    assert_eq!(fingerprint(&traced), fingerprint(&plain));
    // Three seconds of schedule and the drain after it, one record per second passed.
    assert!(traced.seconds.len() >= 3, "{}", traced.seconds.len());
    // The records are cumulative and the last one is the run's end: it holds the run's totals.
    let last = traced.seconds.last().copied().unwrap_or_default();
    assert_eq!(last.requests, traced.requests);
    assert_eq!(last.success, traced.success);
    assert_eq!(last.first_attempts, traced.first_attempts);
    assert_eq!(last.retries, traced.retries);
    assert!(traced
        .seconds
        .windows(2)
        .all(|w| w[0].requests <= w[1].requests));
    assert!(traced.seconds.iter().all(|s| s.concurrency_limit.is_some()));
    let csv = sim::report::series_csv(&traced);
    assert_eq!(csv.lines().count(), traced.seconds.len());
    let arrived: u64 = csv
        .lines()
        .map(|l| {
            l.split(',')
                .nth(5)
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum();
    assert_eq!(arrived, traced.requests);
    // The ticket races: at most the run's, and some under 200 % load.
    assert!(last.ticket_races_lost > 0);
    assert!(last.ticket_races_lost <= last.ticket_wakeups);
    assert_eq!(last.ticket_wakeups, traced.server.ticket_wakeups);
    // The server's columns, by name: the run's totals, the busy time in ms.
    let header: Vec<&str> = sim::report::SERIES_HEADER.trim_end().split(',').collect();
    let column = |name: &str| -> f64 {
        let i = header.iter().position(|h| *h == name).expect(name);
        csv.lines()
            .map(|l| {
                l.split(',')
                    .nth(i)
                    .and_then(|n| n.parse::<f64>().ok())
                    .expect(name)
            })
            .sum()
    };
    assert!(column("server_admitted") > 0.0);
    assert_eq!(column("server_admitted"), traced.server.admitted as f64);
    assert_eq!(column("server_completed"), traced.server.completed as f64);
    assert_eq!(column("server_expired"), traced.server.expired as f64);
    assert_eq!(column("server_handoffs"), traced.server.handoffs as f64);
    // Rounded to the µs in every row.
    let busy_ms = column("server_busy_ms");
    let rows = traced.seconds.len() as f64;
    assert!((busy_ms - traced.server.busy_ns as f64 / 1e6).abs() <= rows * 1e-3);
    let run_ms = column("server_completed_run_ms");
    assert!((run_ms - traced.server.completed_runs.ns as f64 / 1e6).abs() <= rows * 1e-3);
    assert!(run_ms > 0.0);
    assert_eq!(
        header.len(),
        csv.lines().next().map_or(0, |l| l.split(',').count())
    );
    let mut cfg = RunConfig::new(scenario, Variant::UpstreamBest, 4, 7);
    cfg.series = true;
    let upstream = sim::run(&cfg).expect("valid configuration");
    // Requests that retried at all: some under 200 % load, each with one retry or two.
    assert!(upstream.retried_requests > 0);
    assert!(upstream.retried_requests <= upstream.retries);
    assert!(upstream.retries <= 2 * upstream.retried_requests);
    assert!(upstream
        .seconds
        .iter()
        .all(|s| s.concurrency_limit.is_none()));
}

/// A client sends at most its pool's connections at once; the rest wait for one, and every
/// request still ends exactly once.
#[test]
fn a_client_never_has_more_attempts_in_flight_than_its_pool() {
    // Calls that go on after the deadline without `maxTimeMS` pile up at the server under
    // 200 % load, as many as the pool lets through.
    let mut cfg = RunConfig::new(sustained(3.0), Variant::UpstreamNoRetries, 2, 5);
    cfg.pool_size = 20;
    let small = sim::run(&cfg).expect("valid");
    assert_eq!(small.peak_connections, 20);
    assert!(small.checkout_waits > 0);
    assert_eq!(small.unfinished, 0);
    assert_eq!(small.ended(), small.requests);
    assert_eq!(
        small.server.peak_jobs, 40,
        "two clients' connections at most"
    );
    cfg.pool_size = 100_000;
    let unbounded = sim::run(&cfg).expect("valid");
    assert!(
        unbounded.peak_connections > 20,
        "the pool is what bounded it"
    );
    assert_eq!(unbounded.checkout_waits, 0);
    // A dropped call closes its connection at the deadline while its attempt still runs at
    // the server (which does not kill on disconnect), so the server may hold more.
    let mut best = RunConfig::new(sustained(3.0), Variant::UpstreamBest, 2, 5);
    best.pool_size = 20;
    let dropped = sim::run(&best).expect("valid");
    assert_eq!(dropped.ended(), dropped.requests);
    assert_eq!(dropped.peak_connections, 20);
    assert!(
        dropped.server.peak_jobs > 40,
        "{}",
        dropped.server.peak_jobs
    );
    // With `timeoutMS` the driver computes `maxTimeMS` when it has a connection, and an
    // operation whose time ran out while it waited ends without sending, handing the
    // connection on.
    let mut timeout = RunConfig::new(sustained(3.0), Variant::ForkTimeout, 2, 5);
    timeout.pool_size = 2;
    let waited = sim::run(&timeout).expect("valid");
    assert_eq!(waited.peak_connections, 2);
    assert!(waited.checkout_waits > 0);
    assert_eq!(waited.unfinished, 0);
    assert_eq!(waited.ended(), waited.requests);
    assert_eq!(
        waited.server.attempts,
        waited.first_attempts + waited.retries
    );
    assert!(waited.unsent > 0);
    cfg.pool_size = 0;
    assert!(sim::run(&cfg).unwrap_err().contains("pool size"));
}

/// `hot-shard` with the hot shard's limiter at `share` of the others' (a tiny share: it admits
/// its one token and then nothing).
fn hot_shard(share: f64, shard_labels: bool) -> Scenario {
    let mut s = ScenarioName::HotShard.build(Length::Suite, Some(3.0));
    let cluster = s.cluster.as_mut().expect("hot-shard runs on a cluster");
    cluster.hot_share = Some(share);
    cluster.shard_labels = shard_labels;
    s
}

#[test]
fn a_request_touches_the_shards_that_own_its_keys() {
    let s = ScenarioName::HotShard.build(Length::Suite, None);
    let c = s.cluster.clone().expect("a cluster");
    // 1,000 keys in three ranges split at 333 and 666.
    assert_eq!((c.shard_of(0), c.shard_of(332), c.shard_of(333)), (0, 0, 1));
    assert_eq!(
        (c.shard_of(665), c.shard_of(666), c.shard_of(999)),
        (1, 2, 2)
    );
    use sim::server::OpKind::{Insert, PointRead, RangeRead};
    assert_eq!(c.touched(PointRead, 500), (1, 1));
    assert!(c.is_cold(PointRead, 100) && !c.is_cold(PointRead, 400));
    // A range read of 20 keys ending exactly at a split point touches the next shard too
    // (the routers treat the exclusive bound as inclusive).
    assert_eq!(c.touched(RangeRead, 312), (0, 0));
    assert_eq!(c.touched(RangeRead, 313), (0, 1));
    assert!(c.is_cold(RangeRead, 312) && !c.is_cold(RangeRead, 313));
    assert!(c.is_cold(RangeRead, 666) && !c.is_cold(RangeRead, 665));
    assert_eq!(c.touched(Insert, 0), (2, 2));
    // About a third of the requests are hot: a third of the keys, and the range reads that
    // start in the 20 keys below shard 1.
    let r = run(s.clone(), Variant::UpstreamBest, 4, 2);
    let hot = 1.0 - r.cold_requests as f64 / r.requests as f64;
    assert!((0.33..0.36).contains(&hot), "{hot}");
}

#[test]
fn a_router_retries_a_shards_overload_error_and_answers_mongos_label_alone() {
    // No maxTimeMS: the router makes all three retries of every rejection, then gives up, and
    // the driver does not retry an error without `RetryableError`.
    let r = run(hot_shard(1e-4, false), Variant::UpstreamDefault, 4, 5);
    let hot = r.requests - r.cold_requests;
    assert!(hot > 500, "{hot}");
    assert_eq!(r.retries, 0, "no driver retries");
    // One token in the hot shard's bucket: at most one hot request admitted, the others
    // retried three times each by their router.
    assert!(
        r.router_retries >= 3 * (hot - 1),
        "{} for {hot}",
        r.router_retries
    );
    assert!(r.router_retries <= 3 * hot);
    // The router's three backoffs (up to 100, 200 and 400 ms) mostly outlast the 100 ms
    // deadline; those that do not reach the client as the router's overload error.
    assert!(r.success <= r.cold_requests + 1);
    // With the shard's labels passed on, the drivers retry what the routers gave up on.
    let r = run(hot_shard(1e-4, true), Variant::UpstreamDefault, 4, 5);
    assert!(r.retries > 0);
}

#[test]
fn max_time_ms_ends_a_routers_backoff() {
    // `maxTimeMS` = 100 ms on reads: a backoff that would pass it ends there with 50, so the
    // routers give up before their three retries in almost every case (their backoffs add up
    // to less than 100 ms in about 2 % of the cases) and nothing reaches the client as an
    // overload error but those.
    let r = run(hot_shard(1e-4, false), Variant::UpstreamMaxtime, 4, 5);
    let hot = r.requests - r.cold_requests;
    assert!(r.router_retries < 2 * hot, "{} for {hot}", r.router_retries);
    assert!(r.rejected < hot / 20, "{} of {hot}", r.rejected);
    let without = run(hot_shard(1e-4, false), Variant::UpstreamDefault, 4, 5);
    assert!(r.router_retries < without.router_retries);
}

#[test]
fn a_hot_shard_leaves_the_cold_shards_goodput_alone() {
    // The lab's `hot-shard` check, on the model: every cold-shard request succeeds as it does
    // with no hot shard, for the recommended settings and every control.
    for v in [
        Variant::ForkRecommended,
        Variant::ForkControls,
        Variant::UpstreamBest,
    ] {
        let even = run(ScenarioName::EvenShards.build(Length::Suite, None), v, 4, 3);
        let hot = run(ScenarioName::HotShard.build(Length::Suite, None), v, 4, 3);
        assert_eq!(even.cold_requests, hot.cold_requests, "the same requests");
        assert_eq!(even.cold_success, even.cold_requests, "{}", v.name());
        assert!(
            hot.cold_goodput() >= 0.98 * even.cold_goodput(),
            "{}: {} against {}",
            v.name(),
            hot.cold_goodput(),
            even.cold_goodput()
        );
        // The hot shard sheds: the total is below the reference's.
        assert!(hot.goodput() < 0.95 * even.goodput(), "{}", v.name());
    }
}

#[test]
fn a_first_attempt_avoids_a_router_whose_throttle_would_reject_it() {
    // Two shards, the hot one refusing 95 % of its half of the keys, behind routers that pass
    // its errors on at once: every router's throttle sits just under its threshold and
    // engages now and then. As the driver's server selection does, a first attempt goes to a
    // router whose throttle would not reject it while there is one, so three routers reject
    // fewer requests locally than one, though each sees a third of the counts and so more
    // noise (without the avoidance three routers rejected three times as many as one here:
    // 1,008 against 328).
    let through = |routers: u32| {
        let mut s = ScenarioName::HotShard.build(Length::Suite, Some(30.0));
        let cluster = s.cluster.as_mut().expect("a cluster");
        (cluster.shards, cluster.hot_share, cluster.router_retries) = (2, Some(0.05), 0);
        cluster.routers = routers;
        run(s, Variant::ForkRecommended, 16, 3)
    };
    let (one, three) = (through(1), through(3));
    assert!(one.local_rejections > 0, "{one:?}");
    assert!(
        three.local_rejections * 10 < one.local_rejections * 9,
        "{} through three routers, {} through one",
        three.local_rejections,
        one.local_rejections
    );
}
