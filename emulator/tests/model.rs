//! The load-shedding model through its public API, with a paused clock.

use std::sync::{Arc, Mutex};

use bson::{doc, Bson};
use emulator::model::{
    CommandInfo, CommandKind, LimiterConfig, Model, ModelConfig, RejectionKind, TicketConfig,
    TicketMode, Wakeup,
};
use tokio::time::{sleep, Duration, Instant};

/// Model on, limiter off, fixed tickets.
fn base() -> ModelConfig {
    ModelConfig {
        enabled: true,
        cores: 4,
        tickets: TicketConfig {
            read: 8,
            write: 8,
            ..TicketConfig::default()
        },
        ..ModelConfig::default()
    }
}

/// A limiter whose rejections are free, so that these tests see the limiter's decisions alone
/// (what a rejection costs is tested in scenario_models.rs).
fn limited(rate: f64, burst_secs: f64, queue: u64) -> ModelConfig {
    let mut base = base();
    base.costs.rejection_ms = 0.0;
    ModelConfig {
        limiter: LimiterConfig {
            enabled: true,
            rate_per_sec: rate,
            burst_capacity_secs: burst_secs,
            max_queue_depth: queue,
            ..LimiterConfig::default()
        },
        ..base
    }
}

fn read(cost_ms: f64) -> CommandInfo {
    CommandInfo::new("find", CommandKind::Scan, Instant::now()).with_cost_ms(cost_ms)
}

/// The paused clock advances in whole milliseconds: a sub-millisecond charge ends at the next
/// one (the work charged is exact).
fn assert_elapsed(t0: Instant, want: Duration) {
    let got = t0.elapsed();
    assert!(
        got >= want && got < want + Duration::from_millis(1),
        "{got:?}, want {want:?}"
    );
}

async fn run(m: &Arc<Model>, info: CommandInfo) -> Result<emulator::model::ExecOutcome, i32> {
    let a = m.admit(&info).await.map_err(|r| r.code)?;
    a.execute(std::future::pending()).await.map_err(|r| r.code)
}

#[tokio::test(start_paused = true)]
async fn limiter_admits_its_burst_then_its_rate() {
    let m = Model::new(limited(100.0, 0.2, 0)).unwrap();
    let mut burst = 0;
    for _ in 0..50 {
        if m.admit(&read(1.0)).await.is_ok() {
            burst += 1;
        }
    }
    assert_eq!(burst, 20, "bucket of 100/s × 0.2 s starts full");
    // Offer 1,000 requests a second for 10 s: 100/s get through.
    let t0 = Instant::now();
    let mut admitted = 0u32;
    let mut rejected = 0u32;
    while t0.elapsed() < Duration::from_secs(10) {
        sleep(Duration::from_millis(1)).await;
        match m.admit(&read(1.0)).await {
            Ok(_) => admitted += 1,
            Err(r) => {
                assert_eq!(r.code, 462);
                rejected += 1;
            }
        }
    }
    let expected = 100.0 * t0.elapsed().as_secs_f64();
    assert!(
        (f64::from(admitted) - expected).abs() <= expected * 0.02,
        "admitted {admitted}, expected {expected}"
    );
    assert!(rejected > 8000);
    // Exempt commands pass an empty bucket.
    for name in ["hello", "isMaster", "ping", "serverStatus"] {
        let info = CommandInfo::new(name, CommandKind::Command, Instant::now());
        assert!(m.admit(&info).await.is_ok(), "{name}");
    }
    let s = m.snapshot();
    assert_eq!(s.counters.rejected, u64::from(rejected) + 30);
    assert_eq!(s.counters.admitted, u64::from(admitted) + 20 + 4);
}

#[tokio::test(start_paused = true)]
async fn ingress_queue_is_bounded_and_waits_for_tokens() {
    let m = Model::new(limited(10.0, 0.1, 3)).unwrap();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let m = m.clone();
        tasks.push(tokio::spawn(async move {
            let r = m.admit(&read(1.0)).await;
            (
                r.map(|a| a.ingress_wait()).map_err(|r| r.code),
                t0.elapsed(),
            )
        }));
    }
    sleep(Duration::from_millis(50)).await;
    assert_eq!(m.snapshot().gauges.ingress_queue_depth, 3);
    let mut waits = Vec::new();
    let mut rejected = 0;
    for t in tasks {
        match t.await.unwrap() {
            (Ok(w), _) => waits.push(w.as_millis()),
            (Err(code), at) => {
                assert_eq!(code, 462);
                assert_eq!(at, Duration::ZERO, "rejections are immediate");
                rejected += 1;
            }
        }
    }
    waits.sort();
    assert_eq!(waits, [0, 100, 200, 300]);
    assert_eq!(rejected, 6);
    assert_eq!(m.snapshot().gauges.ingress_queue_depth, 0);

    // A queued request whose maxTimeMS ends before its token is valid expires in the queue
    // (the wait wakes at its deadline), gives the token back, and costs `costs.expiryMs`
    // (0.5 ms by default) to answer.
    sleep(Duration::from_secs(1)).await;
    let _ = m.admit(&read(1.0)).await.unwrap();
    let info = read(1.0).with_max_time_ms(50);
    let t1 = Instant::now();
    let r = m.admit(&info).await.unwrap_err();
    assert_eq!((r.code, r.work), (50, Duration::from_micros(500)));
    assert_elapsed(t1, Duration::from_micros(50_500));
    sleep(Duration::from_millis(50)).await;
    assert!(m.admit(&read(1.0)).await.is_ok(), "refunded token is valid");
}

#[tokio::test(start_paused = true)]
async fn tickets_bound_concurrency_and_cores_bound_throughput() {
    let m = Model::new(ModelConfig {
        cores: 2,
        tickets: TicketConfig {
            read: 3,
            write: 3,
            ..TicketConfig::default()
        },
        ..base()
    })
    .unwrap();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let m = m.clone();
        tasks.push(tokio::spawn(async move { run(&m, read(30.0)).await }));
    }
    let mut max_tickets = 0;
    let mut max_cores = 0;
    loop {
        let g = m.snapshot().gauges;
        assert!(g.read_tickets_in_use <= 3, "{g:?}");
        assert!(g.cores_busy <= 2, "{g:?}");
        max_tickets = max_tickets.max(g.read_tickets_in_use);
        max_cores = max_cores.max(g.cores_busy);
        if tasks.iter().all(|t| t.is_finished()) {
            break;
        }
        sleep(Duration::from_micros(500)).await;
    }
    for t in tasks {
        let o = t.await.unwrap().unwrap();
        assert!(o.work >= Duration::from_millis(30));
        assert_eq!(o.yields, 2, "30 ms of work yields every 10 ms");
    }
    assert_eq!((max_tickets, max_cores), (3, 2));
    // 20 × 30 ms on 2 cores: 300 ms.
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(330),
        "{took:?}"
    );
    let s = m.snapshot();
    assert_eq!(s.counters.completed, 20);
    assert!((s.counters.useful_work_ms - 600.0).abs() < 1.0, "{s:?}");
    assert_eq!(s.counters.wasted_work_ms, 0.0);
}

/// Completion order of waiters that queued for one ticket in arrival order 0, 1, 2, ...
async fn completion_order(seed: u64, wakeup: Wakeup) -> Vec<usize> {
    let m = Model::new(ModelConfig {
        seed,
        yield_period_ms: 1000.0,
        quantum_ms: 50.0,
        tickets: TicketConfig {
            read: 1,
            write: 1,
            wakeup,
            ..TicketConfig::default()
        },
        ..base()
    })
    .unwrap();
    let holder = {
        let m = m.clone();
        tokio::spawn(async move { run(&m, read(20.0)).await })
    };
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6 {
        sleep(Duration::from_millis(1)).await;
        let (m, order) = (m.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            run(&m, read(5.0)).await.unwrap();
            order.lock().unwrap().push(i);
        }));
    }
    holder.await.unwrap().unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let v = order.lock().unwrap().clone();
    v
}

#[tokio::test(start_paused = true)]
async fn ticket_wakeups_are_not_fifo_but_are_seeded() {
    let mut overtaken = 0;
    for seed in 0..10 {
        let order = completion_order(seed, Wakeup::Random).await;
        assert_eq!(order.len(), 6);
        if order.windows(2).any(|w| w[0] > w[1]) {
            overtaken += 1;
        }
        assert_eq!(
            order,
            completion_order(seed, Wakeup::Random).await,
            "seed {seed} replays"
        );
        // The fair queue, for comparison.
        assert_eq!(
            completion_order(seed, Wakeup::Fifo).await,
            [0, 1, 2, 3, 4, 5]
        );
    }
    assert!(overtaken >= 5, "later waiters overtake earlier ones");
}

#[tokio::test(start_paused = true)]
async fn max_time_ms_expires_at_a_ticket_wait() {
    let m = Model::new(ModelConfig {
        tickets: TicketConfig {
            read: 1,
            write: 1,
            ..TicketConfig::default()
        },
        ..base()
    })
    .unwrap();
    let holder = {
        let m = m.clone();
        tokio::spawn(async move { run(&m, read(100.0)).await })
    };
    tokio::task::yield_now().await;
    // Arrived 10 ms ago: maxTimeMS counts from arrival.
    let mut info = read(5.0).with_max_time_ms(30);
    info.arrival = Instant::now() - Duration::from_millis(10);
    let t0 = Instant::now();
    let a = m.admit(&info).await.unwrap();
    let r = a.execute(std::future::pending()).await.unwrap_err();
    assert_eq!(r.code, 50);
    assert_eq!(r.kind, RejectionKind::MaxTimeExpired);
    // The ticket wait wakes at the deadline; no work was done, stopping costs expiryMs.
    assert_eq!(r.work, Duration::from_micros(500));
    assert_elapsed(t0, Duration::from_micros(20_500));
    assert_eq!(
        r.to_document(),
        doc! { "ok": 0.0, "errmsg": "operation exceeded time limit", "code": 50, "codeName": "MaxTimeMSExpired" }
    );
    holder.await.unwrap().unwrap();
    let c = m.snapshot().counters;
    assert_eq!((c.expired, c.completed), (1, 1));
    assert!((c.wasted_work_ms - 0.5).abs() < 1e-9, "{c:?}");
    assert!((c.expiry_work_ms - 0.5).abs() < 1e-9, "{c:?}");
}

#[tokio::test(start_paused = true)]
async fn max_time_ms_expires_at_a_yield_and_the_work_is_wasted() {
    let m = Model::new(ModelConfig {
        quantum_ms: 10.0,
        ..base()
    })
    .unwrap();
    let r = run(&m, read(100.0).with_max_time_ms(25)).await.unwrap_err();
    assert_eq!(r, 50);
    let c = m.snapshot().counters;
    assert_eq!(c.expired, 1);
    // Checked at each 10 ms yield: the third check (30 ms) is past the deadline. The 30 ms
    // done are wasted, and so is the 0.5 ms it takes to stop.
    assert!((c.wasted_work_ms - 30.5).abs() < 0.5, "{c:?}");
    assert!((c.expiry_work_ms - 0.5).abs() < 1e-9, "{c:?}");
    assert_eq!(c.useful_work_ms, 0.0);

    // Without expiry cost the same request wastes only its work.
    let m = Model::new(ModelConfig {
        quantum_ms: 10.0,
        costs: emulator::model::CostConfig {
            expiry_ms: 0.0,
            ..emulator::model::CostConfig::default()
        },
        ..base()
    })
    .unwrap();
    assert_eq!(
        run(&m, read(100.0).with_max_time_ms(25)).await.unwrap_err(),
        50
    );
    let c = m.snapshot().counters;
    assert!((c.wasted_work_ms - 30.0).abs() < 0.5, "{c:?}");
    assert_eq!(c.expiry_work_ms, 0.0);
}

#[tokio::test(start_paused = true)]
async fn disconnected_clients_waste_work_killed_or_not() {
    // Kill on disconnect: a read stops at the first yield point (every 10 ms of work) more
    // than `interruptCheckMs` (10 here) after it started: the client left at 15 ms, the check
    // at 10 ms is too early, the one at 20 ms sees it.
    let m = Model::new(ModelConfig {
        kill_on_client_disconnect: true,
        interrupt_check_ms: 10,
        ..base()
    })
    .unwrap();
    let a = m.admit(&read(100.0)).await.unwrap();
    let r = a
        .execute(sleep(Duration::from_millis(15)))
        .await
        .unwrap_err();
    assert_eq!((r.code, r.code_name), (279, "ClientDisconnect"));
    assert_eq!(r.work, Duration::from_micros(20_500));
    let c = m.snapshot().counters;
    assert_eq!(c.killed, 1);
    assert!((c.wasted_work_ms - r.work.as_secs_f64() * 1000.0).abs() < 0.01);

    // With mongod's 500 ms between client checks, a 100 ms read is never checked: it
    // completes for nobody.
    let m = Model::new(ModelConfig {
        kill_on_client_disconnect: true,
        ..base()
    })
    .unwrap();
    let a = m.admit(&read(100.0)).await.unwrap();
    let o = a.execute(sleep(Duration::from_millis(15))).await.unwrap();
    assert!(o.client_disconnected);
    assert_eq!(m.snapshot().counters.killed, 0);

    // Keep burning (mongod without the check): completes, but nobody gets the answer.
    let m = Model::new(base()).unwrap();
    let a = m.admit(&read(100.0)).await.unwrap();
    let o = a.execute(sleep(Duration::from_millis(15))).await.unwrap();
    assert!(o.client_disconnected);
    let c = m.snapshot().counters;
    assert_eq!((c.completed, c.orphaned, c.killed), (1, 1, 0));
    assert!((c.wasted_work_ms - 100.0).abs() < 0.5, "{c:?}");
    assert_eq!(c.useful_work_ms, 0.0);

    // A failure reported by the server moves useful work to wasted.
    let o = run(&m, read(10.0)).await.unwrap();
    m.record_failed(&o);
    let c = m.snapshot().counters;
    assert_eq!(c.failed, 1);
    assert!((c.wasted_work_ms - 110.0).abs() < 0.5, "{c:?}");
}

#[tokio::test(start_paused = true)]
async fn full_waiter_queue_sheds_with_433() {
    let m = Model::new(ModelConfig {
        base_backoff_ms: 100,
        tickets: TicketConfig {
            read: 1,
            write: 1,
            max_waiters: 2,
            ..TicketConfig::default()
        },
        ..base()
    })
    .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let m = m.clone();
        tasks.push(tokio::spawn(async move { run(&m, read(10.0)).await }));
        tokio::task::yield_now().await;
    }
    sleep(Duration::from_millis(1)).await;
    assert_eq!(m.snapshot().gauges.read_waiters, 2);
    let a = m.admit(&read(10.0)).await.unwrap();
    let r = a.execute(std::future::pending()).await.unwrap_err();
    assert_eq!(r.kind, RejectionKind::QueueOverflow);
    assert_eq!(
        r.to_document(),
        doc! {
            "ok": 0.0,
            "errmsg": "MongoDB is overloaded and cannot accept new operations. Try again later.",
            "code": 433,
            "codeName": "AdmissionQueueOverflow",
            "errorLabels": ["SystemOverloadedError", "RetryableError"],
            "baseBackoffMS": 100i64,
        }
    );
    // Writes have their own pool.
    let w = CommandInfo::new("insert", CommandKind::Write, Instant::now()).with_cost_ms(1.0);
    assert!(run(&m, w).await.is_ok());
    for t in tasks {
        assert!(t.await.unwrap().is_ok());
    }
    let c = m.snapshot().counters;
    assert_eq!((c.shed, c.completed), (1, 4));
}

#[tokio::test(start_paused = true)]
async fn ingress_rejection_document() {
    let mut cfg = limited(1.0, 1.0, 0);
    cfg.base_backoff_ms = 50;
    let m = Model::new(cfg).unwrap();
    m.admit(&read(1.0)).await.unwrap();
    let r = m.admit(&read(1.0)).await.unwrap_err();
    assert_eq!(
        r.to_document(),
        doc! {
            "ok": 0.0,
            "errmsg": "Rate limiter 'ingressRequestRateLimiter' rate exceeded",
            "code": 462,
            "codeName": "IngressRequestRateLimitExceeded",
            "errorLabels": ["SystemOverloadedError", "RetryableError"],
            "baseBackoffMS": 50i64,
        }
    );
    m.set_parameters(&doc! { "limiter": { "allowRetries": false }, "baseBackoffMs": 0 })
        .unwrap();
    let d = m.admit(&read(1.0)).await.unwrap_err().to_document();
    assert_eq!(
        d.get_array("errorLabels").unwrap(),
        &vec![Bson::from("SystemOverloadedError")]
    );
    assert!(!d.contains_key("baseBackoffMS"));
}

async fn probe(workers: usize, cost_ms: f64, secs: u64) -> Vec<u32> {
    let m = Model::new(ModelConfig {
        cores: 8,
        quantum_ms: 5.0,
        tickets: TicketConfig {
            mode: TicketMode::Probing,
            ..TicketConfig::default()
        },
        ..base()
    })
    .unwrap();
    assert_eq!(m.snapshot().gauges.read_tickets_total, 8, "starts at cores");
    let stop = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let m = m.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop {
                run(&m, read(cost_ms)).await.unwrap();
                if workers < 4 {
                    sleep(Duration::from_millis(20)).await;
                }
            }
        }));
    }
    let mut seen = Vec::new();
    while Instant::now() < stop {
        sleep(Duration::from_millis(50)).await;
        let g = m.snapshot().gauges;
        assert_eq!(g.read_tickets_total, g.write_tickets_total);
        seen.push(g.read_tickets_total);
    }
    for t in tasks {
        t.await.unwrap();
    }
    seen
}

#[tokio::test(start_paused = true)]
async fn throughput_probing_moves_tickets_within_bounds() {
    // Saturated: probes up from 8.
    let seen = probe(40, 20.0, 5).await;
    assert!(seen.iter().all(|n| (4..=128).contains(n)), "{seen:?}");
    assert!(seen.iter().any(|n| *n > 8), "{seen:?}");
    // Nearly idle: shrinks to the minimum and stays there.
    let seen = probe(2, 2.0, 5).await;
    assert!(seen.iter().all(|n| (4..=128).contains(n)), "{seen:?}");
    assert_eq!(seen.last(), Some(&4), "{seen:?}");
}

#[tokio::test(start_paused = true)]
async fn snapshot_document_and_time_series() {
    let m = Model::new(base()).unwrap();
    for _ in 0..30 {
        run(&m, read(10.0)).await.unwrap();
        sleep(Duration::from_millis(90)).await;
    }
    let d = m.snapshot().to_document();
    let c = d.get_document("counters").unwrap();
    assert_eq!(c.get_i64("completed").unwrap(), 30);
    assert!(c.get_f64("usefulWorkMs").unwrap() >= 300.0);
    let g = d.get_document("gauges").unwrap();
    assert_eq!(g.get_i64("coresTotal").unwrap(), 4);
    let series = m.series(100);
    assert_eq!(
        series.iter().map(|s| s.t).collect::<Vec<_>>(),
        [1, 2, 3],
        "{series:?}"
    );
    assert!(
        series.iter().all(|s| s.counters.completed == 10),
        "{series:?}"
    );
    assert!(series[0].to_document().contains_key("gauges"));
}

#[tokio::test(start_paused = true)]
async fn reconfigure_at_run_time_and_bad_values() {
    let m = Model::new(ModelConfig::default()).unwrap();
    // Off: everything passes, no cost.
    let t0 = Instant::now();
    let o = run(&m, read(1000.0)).await.unwrap();
    assert_eq!((o.work, t0.elapsed()), (Duration::ZERO, Duration::ZERO));
    let cfg = m
        .set_parameters(&doc! { "enabled": true, "cores": 1.0, "limiter": { "enabled": true, "ratePerSec": 1, "burstCapacitySecs": 1 } })
        .unwrap();
    assert_eq!(cfg.cores, 1);
    assert!(run(&m, read(5.0)).await.is_ok());
    assert_eq!(run(&m, read(5.0)).await.unwrap_err(), 462);
    for bad in [
        doc! { "limiter": { "ratePerSec": -5 } },
        doc! { "cores": 0 },
        doc! { "costs": { "pointReadMs": f64::NAN } },
        doc! { "costs": { "authMs": -1.0 } },
        doc! { "tickets": { "mode": "probing", "probing": { "min": 0 } } },
    ] {
        let e = m.set_parameters(&bad).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("invalid labOverload configuration"),
            "{e}"
        );
    }
    assert_eq!(
        m.config().cores,
        1,
        "a rejected change leaves the model as it was"
    );
    let e = Model::new(ModelConfig {
        cores: 0,
        ..ModelConfig::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("cores"), "{e}");
}

#[test]
fn command_info_from_a_command_body() {
    let now = Instant::now();
    let i = CommandInfo::from_command(
        &doc! { "find": "c", "filter": { "_id": 5 }, "maxTimeMS": 100, "comment": { "labCostMs": 7 }, "$db": "d" },
        now,
    );
    assert_eq!(i.name, "find");
    assert_eq!(i.kind, CommandKind::PointRead);
    assert_eq!(i.max_time_ms, Some(100));
    assert_eq!(i.cost_override_ms, Some(7.0));
    let kind = |d: bson::Document| CommandInfo::from_command(&d, now).kind;
    assert_eq!(
        kind(doc! { "find": "c", "filter": { "_id": { "$gte": 1 } } }),
        CommandKind::RangeRead
    );
    assert_eq!(kind(doc! { "find": "c", "filter": {} }), CommandKind::Scan);
    assert_eq!(kind(doc! { "insert": "c" }), CommandKind::Write);
    assert_eq!(
        kind(doc! { "aggregate": "c", "pipeline": [ { "$match": { "_id": 1 } } ] }),
        CommandKind::PointRead
    );
    assert_eq!(
        kind(doc! { "aggregate": "c", "pipeline": [ { "$out": "x" } ] }),
        CommandKind::Write
    );
    assert_eq!(kind(doc! { "hello": 1 }), CommandKind::Command);
    // One authentication conversation each: its start, plain or speculative.
    assert_eq!(
        kind(doc! { "saslStart": 1, "mechanism": "SCRAM-SHA-256" }),
        CommandKind::Authentication
    );
    assert_eq!(
        kind(doc! { "hello": 1, "speculativeAuthenticate": { "saslStart": 1 } }),
        CommandKind::Authentication
    );
    assert_eq!(
        kind(doc! { "saslContinue": 1, "conversationId": 1 }),
        CommandKind::Command
    );
    let t = CommandInfo::from_command(
        &doc! { "update": "c", "autocommit": false, "maxTimeMS": -1 },
        now,
    );
    assert!(t.in_transaction);
    assert_eq!(t.max_time_ms, None);
}

#[tokio::test(start_paused = true)]
async fn rejections_and_connections_cost_core_time() {
    let mut cfg = limited(1.0, 1.0, 0);
    cfg.cores = 1;
    cfg.costs.rejection_ms = 2.0;
    cfg.costs.connection_ms = 3.0;
    let m = Model::new(cfg).unwrap();
    assert_eq!(m.connection_opened().await, Duration::from_millis(3));
    m.admit(&read(1.0)).await.unwrap();
    let t0 = Instant::now();
    let r = m.admit(&read(1.0)).await.unwrap_err();
    assert_eq!((r.code, r.work), (462, Duration::from_millis(2)));
    assert_eq!(
        t0.elapsed(),
        Duration::from_millis(2),
        "the reply waits for the work"
    );
    let c = m.snapshot().counters;
    assert!((c.overhead_work_ms - 3.0).abs() < 0.01, "{c:?}");
    assert!((c.wasted_work_ms - 2.0).abs() < 0.01, "{c:?}");
    assert!((c.busy_core_ms - 5.0).abs() < 0.01, "{c:?}");
}

/// Offers 130 % of a one-core server's capacity (2 ms point reads, 8 tickets, no limiter) for
/// `secs` seconds, evenly spaced, each read with `maxTimeMS` 100 and its application giving up
/// at 100 ms; returns the reads answered in time and the model's counters.
async fn burst_without_limiter(
    expiry_ms: f64,
    secs: f64,
) -> (u64, emulator::model::CounterSnapshot) {
    let m = Model::new(ModelConfig {
        cores: 1,
        costs: emulator::model::CostConfig {
            point_read_ms: 2.0,
            expiry_ms,
            ..emulator::model::CostConfig::default()
        },
        ..base()
    })
    .unwrap();
    let rate = 1.3 * 500.0;
    let n = (rate * secs) as u64;
    let gap = Duration::from_secs_f64(1.0 / rate);
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        tokio::time::sleep_until(t0 + gap * i as u32).await;
        let m = m.clone();
        tasks.spawn(async move {
            let now = Instant::now();
            let info = CommandInfo::new("find", CommandKind::PointRead, now)
                .with_max_time_ms(100)
                .with_client_deadline(now + Duration::from_millis(100));
            match m.admit(&info).await {
                Ok(a) => matches!(a.execute(std::future::pending()).await, Ok(o) if !o.abandoned),
                Err(_) => false,
            }
        });
    }
    let mut ok = 0;
    while let Some(r) = tasks.join_next().await {
        if r.unwrap() {
            ok += 1;
        }
    }
    (ok, m.snapshot().counters)
}

#[tokio::test(start_paused = true)]
async fn the_cost_of_expiry_feeds_back_into_an_overload_without_a_limiter() {
    // At 130 % a fifth of the reads must expire; each expiry's cost takes core time from the
    // reads that could still make it, which makes more of them expire.
    let mut goodput = Vec::new();
    for expiry_ms in [0.0, 0.5, 1.5] {
        let (ok, c) = burst_without_limiter(expiry_ms, 4.0).await;
        eprintln!(
            "expiryMs {expiry_ms}: {ok} of 2600 in time, {} expired, expiryWorkMs {:.0}, wasted {:.0} of {:.0} ms",
            c.expired, c.expiry_work_ms, c.wasted_work_ms, c.busy_core_ms
        );
        assert!(
            (c.expiry_work_ms - expiry_ms * c.expired as f64).abs() < 1.0,
            "{c:?}"
        );
        goodput.push(ok);
    }
    // Free expiry: about the server's capacity (500/s for 4 s) gets through.
    assert!(goodput[0] >= 1800, "{goodput:?}");
    assert!(
        goodput[0] > goodput[1] && goodput[1] > goodput[2],
        "{goodput:?}"
    );
    assert!((goodput[2] as f64) < 0.9 * goodput[0] as f64, "{goodput:?}");
}
