//! Model-level tests that need the crate's internals.

use super::*;

/// An enabled model with one read and one write ticket.
fn one_ticket_model() -> Arc<Model> {
    Model::new(ModelConfig {
        enabled: true,
        tickets: TicketConfig {
            read: 1,
            write: 1,
            ..TicketConfig::default()
        },
        ..ModelConfig::default()
    })
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn dropped_execution_releases_everything_and_counts_waste() {
    let m = one_ticket_model();
    let info = CommandInfo::new("find", CommandKind::Scan, Instant::now()).with_cost_ms(100.0);
    let a = m.admit(&info).await.unwrap();
    // Cancel the execution half-way (e.g. the server shuts down).
    let r =
        tokio::time::timeout(Duration::from_millis(40), a.execute(std::future::pending())).await;
    assert!(r.is_err());
    let s = m.snapshot();
    assert_eq!(s.gauges.read_tickets_in_use, 0);
    assert_eq!(s.gauges.cores_busy, 0);
    assert_eq!(s.gauges.in_flight, 0);
    assert!((s.counters.wasted_work_ms - 40.0).abs() < 1.0, "{s:?}");
    // The pool still works.
    let a = m.admit(&info).await.unwrap();
    assert!(a.execute(std::future::pending()).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn woken_waiter_that_expires_passes_its_wake_up_on() {
    let m = one_ticket_model();
    let mk = |cost: f64, max: u64| {
        CommandInfo::new("find", CommandKind::Scan, Instant::now())
            .with_cost_ms(cost)
            .with_max_time_ms(max)
    };
    let go = |info: CommandInfo| {
        let m = m.clone();
        tokio::spawn(async move {
            let a = m.admit(&info).await.map_err(|r| r.code)?;
            a.execute(std::future::pending()).await.map_err(|r| r.code)
        })
    };
    let holder = go(mk(20.0, 0));
    tokio::task::yield_now().await;
    // Both wait; whichever is woken first, the other must still get the ticket in time.
    let short = go(mk(5.0, 20));
    let long = go(mk(5.0, 1000));
    assert!(holder.await.unwrap().is_ok());
    let s = short.await.unwrap();
    let l = long.await.unwrap();
    assert!(l.is_ok());
    // The short request may run or expire, depending on the wake-up order; if it fails, it
    // is only by running out of time.
    if let Err(code) = s {
        assert_eq!(code, 50, "the short request can only expire");
    }
    assert_eq!(m.snapshot().gauges.read_waiters, 0);
}

fn assert_send<T: Send>(_: &T) {}

#[test]
fn futures_are_send_for_spawned_connection_tasks() {
    let m = Model::disabled();
    let info = CommandInfo::new("find", CommandKind::Scan, Instant::now());
    let fut = async move {
        let a = m.admit(&info).await?;
        a.execute(tokio::time::sleep(Duration::from_secs(1))).await
    };
    assert_send(&fut);
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

#[tokio::test(start_paused = true)]
async fn kill_on_disconnect_ends_a_ticket_wait_at_its_next_client_check() {
    let m = Model::new(ModelConfig {
        enabled: true,
        kill_on_client_disconnect: true,
        interrupt_check_ms: 20,
        // The holder keeps its ticket throughout.
        yield_period_ms: 1000.0,
        tickets: TicketConfig {
            read: 1,
            write: 1,
            ..TicketConfig::default()
        },
        ..ModelConfig::default()
    })
    .unwrap();
    let info = CommandInfo::new("find", CommandKind::Scan, Instant::now()).with_cost_ms(200.0);
    let holder = {
        let (m, info) = (m.clone(), info.clone());
        tokio::spawn(async move {
            let a = m.admit(&info).await.unwrap();
            a.execute(std::future::pending()).await.is_ok()
        })
    };
    tokio::task::yield_now().await;
    let t0 = Instant::now();
    let a = m.admit(&info).await.unwrap();
    let r = a
        .execute(tokio::time::sleep(Duration::from_millis(5)))
        .await
        .unwrap_err();
    // The client went at 5 ms. The wait wakes every 20 ms, and the client may be checked only
    // more than 20 ms after the last check (the start): the wake-up at 40 ms notices it. Then
    // stopping costs expiryMs (0.5 ms by default) on a free core.
    assert_eq!(r.code, 279);
    assert_eq!(r.fixed_labels(), None);
    let expiry = Duration::from_micros(500);
    assert_eq!(r.work, expiry);
    assert_elapsed(t0, Duration::from_millis(40) + expiry);
    assert!(holder.await.unwrap());
    let c = m.snapshot().counters;
    assert_eq!((c.killed, c.completed), (1, 1));
    assert!((c.expiry_work_ms - 0.5).abs() < 1e-9, "{c:?}");
}

#[tokio::test(start_paused = true)]
async fn writes_are_not_killed_when_their_client_goes() {
    let m = Model::new(ModelConfig {
        enabled: true,
        kill_on_client_disconnect: true,
        interrupt_check_ms: 5,
        ..ModelConfig::default()
    })
    .unwrap();
    let write = CommandInfo::new("insert", CommandKind::Write, Instant::now()).with_cost_ms(60.0);
    let out = m
        .admit(&write)
        .await
        .unwrap()
        .execute(tokio::time::sleep(Duration::from_millis(1)))
        .await
        .unwrap();
    assert!(out.client_disconnected);
    // The same read is killed at its first yield point after the client check interval.
    let read = CommandInfo::new("find", CommandKind::Scan, Instant::now()).with_cost_ms(60.0);
    let r = m
        .admit(&read)
        .await
        .unwrap()
        .execute(tokio::time::sleep(Duration::from_millis(1)))
        .await
        .unwrap_err();
    assert_eq!(r.code, 279);
    assert_eq!(
        r.work,
        Duration::from_millis(10) + Duration::from_micros(500)
    );
    let c = m.snapshot().counters;
    assert_eq!((c.orphaned, c.killed), (1, 1), "{c:?}");
}

#[tokio::test(start_paused = true)]
async fn an_expired_ticket_waiter_is_noticed_at_its_deadline_and_costs_expiry_ms() {
    let m = Model::new(ModelConfig {
        enabled: true,
        tickets: TicketConfig {
            read: 1,
            write: 1,
            ..TicketConfig::default()
        },
        costs: CostConfig {
            expiry_ms: 0.7,
            ..CostConfig::default()
        },
        ..ModelConfig::default()
    })
    .unwrap();
    let holder_info =
        CommandInfo::new("find", CommandKind::Scan, Instant::now()).with_cost_ms(100.0);
    let holder = {
        let m = m.clone();
        tokio::spawn(async move {
            let a = m.admit(&holder_info).await.unwrap();
            a.execute(std::future::pending()).await.is_ok()
        })
    };
    tokio::task::yield_now().await;
    let t0 = Instant::now();
    let waiter = CommandInfo::new("find", CommandKind::Scan, t0)
        .with_cost_ms(5.0)
        .with_max_time_ms(30);
    let r = m
        .admit(&waiter)
        .await
        .unwrap()
        .execute(std::future::pending())
        .await
        .unwrap_err();
    // The ticket wait wakes at the deadline (30 ms); unwinding costs 0.7 ms on a free core.
    let expiry = Duration::from_micros(700);
    assert_eq!((r.code, r.work), (50, expiry));
    assert_elapsed(t0, Duration::from_millis(30) + expiry);
    assert!(holder.await.unwrap());
    let c = m.snapshot().counters;
    assert_eq!((c.expired, c.completed), (1, 1));
    assert!((c.expiry_work_ms - 0.7).abs() < 1e-9, "{c:?}");
    assert!((c.wasted_work_ms - 0.7).abs() < 1e-9, "{c:?}");
    assert!((c.busy_core_ms - 100.7).abs() < 1e-9, "{c:?}");
}

#[tokio::test(start_paused = true)]
async fn an_expired_ingress_waiter_costs_expiry_ms() {
    let m = Model::new(ModelConfig {
        enabled: true,
        limiter: LimiterConfig {
            enabled: true,
            rate_per_sec: 1.0,
            burst_capacity_secs: 1.0,
            max_queue_depth: 1,
            ..LimiterConfig::default()
        },
        ..ModelConfig::default()
    })
    .unwrap();
    let first = CommandInfo::new("find", CommandKind::PointRead, Instant::now());
    assert!(m.admit(&first).await.is_ok());
    let t0 = Instant::now();
    let queued = CommandInfo::new("find", CommandKind::PointRead, t0).with_max_time_ms(50);
    let r = m.admit(&queued).await.unwrap_err();
    // The token would come at 1 s; the interruptible wait ends at the deadline.
    let expiry = Duration::from_micros(500);
    assert_eq!((r.code, r.work), (50, expiry));
    assert_elapsed(t0, Duration::from_millis(50) + expiry);
    let c = m.snapshot().counters;
    assert_eq!(c.expired, 1);
    assert!((c.expiry_work_ms - 0.5).abs() < 1e-9, "{c:?}");
}

#[tokio::test(start_paused = true)]
async fn a_running_request_notices_expiry_at_its_next_yield_point_and_is_charged_its_work() {
    let m = Model::new(ModelConfig {
        enabled: true,
        ..ModelConfig::default()
    })
    .unwrap();
    // 100 ms of work, yield points every 10 ms, maxTimeMS 25: the check at 30 ms of work
    // notices it; the 30 ms done stay charged, plus 0.5 ms to stop.
    let t0 = Instant::now();
    let scan = CommandInfo::new("find", CommandKind::Scan, t0)
        .with_cost_ms(100.0)
        .with_max_time_ms(25);
    let r = m
        .admit(&scan)
        .await
        .unwrap()
        .execute(std::future::pending())
        .await
        .unwrap_err();
    let expiry = Duration::from_micros(500);
    assert_eq!(r.code, 50);
    assert_eq!(r.work, Duration::from_millis(30) + expiry);
    assert_elapsed(t0, Duration::from_millis(30) + expiry);
    let c = m.snapshot().counters;
    assert!((c.wasted_work_ms - 30.5).abs() < 1e-9, "{c:?}");
    assert!((c.expiry_work_ms - 0.5).abs() < 1e-9, "{c:?}");
    assert_eq!(c.useful_work_ms, 0.0);

    // A transaction statement checks at the same points (without yielding its ticket). A new
    // model: the first one's cores banked the paused clock's rounding of the 0.5 ms charge.
    let m = Model::new(ModelConfig {
        enabled: true,
        ..ModelConfig::default()
    })
    .unwrap();
    let t0 = Instant::now();
    let mut stmt = CommandInfo::new("update", CommandKind::Write, t0)
        .with_cost_ms(100.0)
        .with_max_time_ms(15);
    stmt.in_transaction = true;
    let r = m
        .admit(&stmt)
        .await
        .unwrap()
        .execute(std::future::pending())
        .await
        .unwrap_err();
    assert_eq!(r.work, Duration::from_millis(20) + expiry);

    // A point read meets no interrupt point once it has its ticket: past its deadline (it
    // waited for a core), it completes, as mongod's short reads do.
    let busy = CommandInfo::new("find", CommandKind::Scan, Instant::now()).with_cost_ms(8.0);
    let (m1, m2) = (m.clone(), m.clone());
    let hogs: Vec<_> = (0..2)
        .map(|_| {
            let (m, busy) = (m1.clone(), busy.clone());
            tokio::spawn(async move {
                m.admit(&busy)
                    .await
                    .unwrap()
                    .execute(std::future::pending())
                    .await
                    .is_ok()
            })
        })
        .collect();
    tokio::task::yield_now().await;
    let read = CommandInfo::new("find", CommandKind::PointRead, Instant::now())
        .with_cost_ms(2.0)
        .with_max_time_ms(1);
    let out = m2
        .admit(&read)
        .await
        .unwrap()
        .execute(std::future::pending())
        .await
        .unwrap();
    assert!(out.total > Duration::from_millis(1), "{out:?}");
    assert_eq!(out.work, Duration::from_millis(2));
    for h in hogs {
        assert!(h.await.unwrap());
    }
}

/// Admits each `(labReq, other traffic before it)` in order and returns the (id, attempt) of
/// the requests rejected at random.
async fn rejected_ids(m: &Arc<Model>, arrivals: &[(u64, u32)]) -> Vec<(u64, u32)> {
    let mut attempts = std::collections::HashMap::new();
    let mut rejected = Vec::new();
    for &(id, noise) in arrivals {
        // Requests without an id and requests of other ids, between this one's arrivals.
        for k in 0..noise {
            let other = CommandInfo::new("find", CommandKind::PointRead, Instant::now());
            let other = if k % 2 == 0 {
                other
            } else {
                other.with_lab_req(1_000_000 + u64::from(k) + id * 10)
            };
            let _ = m.admit(&other).await;
        }
        let attempt = attempts.entry(id).or_insert(0u32);
        let info =
            CommandInfo::new("find", CommandKind::PointRead, Instant::now()).with_lab_req(id);
        if m.admit(&info).await.is_err() {
            rejected.push((id, *attempt));
        }
        *attempt += 1;
    }
    rejected.sort_unstable();
    rejected
}

fn random_rejecting(seed: u64) -> Arc<Model> {
    Model::new(ModelConfig {
        enabled: true,
        seed,
        random_reject_share: 0.2,
        ..ModelConfig::default()
    })
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn variants_meet_the_same_random_rejections_for_the_same_requests() {
    // Variant A: ids 0..500 in order, each once, ids below 100 retried once at the end.
    let mut a: Vec<(u64, u32)> = (0..500).map(|id| (id, 0)).collect();
    a.extend((0..100).map(|id| (id, 0)));
    // Variant B: the same requests and attempts, another order, other traffic between them.
    let mut b: Vec<(u64, u32)> = (0..500).rev().map(|id| (id, (id % 3) as u32)).collect();
    b.extend((0..100).rev().map(|id| (id, 1)));
    let first = rejected_ids(&random_rejecting(7), &a).await;
    let second = rejected_ids(&random_rejecting(7), &b).await;
    assert_eq!(first, second);
    // Share 0.2 of 600 attempts: 120 expected (sd 9.8).
    assert!((70..=170).contains(&first.len()), "{}", first.len());
    // Retries draw afresh: some first attempts rejected, their retries not, and vice versa.
    let retried_ok = first
        .iter()
        .filter(|(id, at)| *at == 0 && *id < 100 && !first.contains(&(*id, 1)))
        .count();
    assert!(retried_ok > 0, "{first:?}");
    // Another seed rejects other requests.
    assert_ne!(rejected_ids(&random_rejecting(8), &a).await, first);

    // Switching the model off and on (the lab's reset between variants) starts the attempt
    // counts and the fallback stream afresh: the same requests are rejected again.
    let m = random_rejecting(7);
    assert_eq!(rejected_ids(&m, &a).await, first);
    m.set_parameters(&bson::doc! {"enabled": false}).unwrap();
    m.set_parameters(&bson::doc! {"enabled": true}).unwrap();
    assert_eq!(rejected_ids(&m, &b).await, first);
}

#[tokio::test(start_paused = true)]
async fn fail_point_draws_are_keyed_by_seed_request_and_attempt() {
    let model = |seed| {
        Model::new(ModelConfig {
            enabled: true,
            seed,
            ..ModelConfig::default()
        })
        .unwrap()
    };
    let draws = |m: Arc<Model>, ids: Vec<u64>| async move {
        let mut out = Vec::new();
        for id in ids {
            let info =
                CommandInfo::new("insert", CommandKind::Write, Instant::now()).with_lab_req(id);
            out.push(m.admit(&info).await.expect("admitted").draws());
        }
        out
    };
    // Variant A sends 1, 2, 1; variant B sends 2, 1, 1: the same (id, attempt) draws alike.
    let a = draws(model(7), vec![1, 2, 1]).await;
    let b = draws(model(7), vec![2, 1, 1]).await;
    assert!(a.iter().all(Option::is_some));
    assert_eq!((a[0], a[1], a[2]), (b[1], b[0], b[2]));
    assert_ne!(a[0], a[2], "a retry draws afresh");
    assert_ne!(
        draws(model(8), vec![1]).await[0],
        a[0],
        "another seed, other draws"
    );
    let anonymous = CommandInfo::new("insert", CommandKind::Write, Instant::now());
    assert_eq!(
        model(7).admit(&anonymous).await.expect("admitted").draws(),
        None
    );
}

#[test]
fn the_lab_request_id_is_read_from_the_comment() {
    let now = Instant::now();
    let id = |comment: bson::Bson| {
        CommandInfo::from_command(&bson::doc! {"find": "c", "comment": comment}, now).lab_req
    };
    assert_eq!(
        id(bson::Bson::Document(bson::doc! {"labReq": 7_i64})),
        Some(7)
    );
    assert_eq!(
        id(bson::Bson::Document(bson::doc! {"labReq": 9_i32})),
        Some(9)
    );
    assert_eq!(
        id(bson::Bson::Document(bson::doc! {"labReq": -1_i64})),
        None
    );
    assert_eq!(id(bson::Bson::Document(bson::doc! {"labReq": "x"})), None);
    assert_eq!(id(bson::Bson::String("plain".into())), None);
}

#[tokio::test(start_paused = true)]
async fn huge_max_time_ms_does_not_overflow() {
    let m = Model::new(ModelConfig {
        enabled: true,
        ..ModelConfig::default()
    })
    .unwrap();
    let info = CommandInfo::from_command(
        &bson::doc! { "find": "c", "maxTimeMS": i64::MAX, "comment": { "labCostMs": 1e300 } },
        Instant::now(),
    );
    let a = m.admit(&info).await.unwrap();
    assert!(a.deadline() > Instant::now() + Duration::from_secs(86_400));
    // The cost is clamped to an hour; give up after a second.
    let r = tokio::time::timeout(Duration::from_secs(1), a.execute(std::future::pending())).await;
    assert!(r.is_err());
}

#[tokio::test(start_paused = true)]
async fn queue_waits_are_published_and_start_afresh_when_switched_on() {
    let m = one_ticket_model();
    let run = |m: Arc<Model>| async move {
        let info = CommandInfo::new("find", CommandKind::Scan, Instant::now()).with_cost_ms(10.0);
        let a = m.admit(&info).await.unwrap();
        a.execute(std::future::pending()).await.unwrap()
    };
    let (first, second) = tokio::join!(run(m.clone()), run(m.clone()));
    // One of the two waited for the other's ticket.
    let waited = first.ticket_wait.max(second.ticket_wait);
    assert!(waited >= Duration::from_millis(9), "{first:?} {second:?}");
    let q = m.snapshot().queue_wait_ms;
    assert_eq!(q.count, 2, "{q:?}");
    assert!((q.max - waited.as_secs_f64() * 1000.0).abs() < 0.5, "{q:?}");
    assert!(q.p50 < 0.5, "{q:?}");
    // Commands that take no ticket are not recorded.
    let ping = CommandInfo::new("ping", CommandKind::Command, Instant::now());
    let a = m.admit(&ping).await.unwrap();
    a.execute(std::future::pending()).await.unwrap();
    assert_eq!(m.snapshot().queue_wait_ms.count, 2);
    m.set_parameters(&bson::doc! {"enabled": false}).unwrap();
    m.set_parameters(&bson::doc! {"enabled": true}).unwrap();
    assert_eq!(m.snapshot().queue_wait_ms, WaitPercentiles::default());
}

#[tokio::test(start_paused = true)]
async fn work_finished_after_the_applications_deadline_is_wasted() {
    // The clock is paused: only the model's own sleeps move it, so the outcome depends on the
    // model reading the same (tokio) clock for the deadline as for the work.
    let m = one_ticket_model();
    let find = |deadline_in: Duration| {
        let now = Instant::now();
        CommandInfo::new("find", CommandKind::Scan, now)
            .with_cost_ms(10.0)
            .with_client_deadline(now + deadline_in)
    };
    // 10 ms of work against a 5 ms deadline.
    let out = m
        .admit(&find(Duration::from_millis(5)))
        .await
        .unwrap()
        .execute(std::future::pending())
        .await
        .unwrap();
    assert!(out.abandoned);
    // A failure reported afterwards must not count the same work twice.
    m.record_failed(&out);
    let c = m.snapshot().counters;
    assert_eq!((c.abandoned, c.completed), (1, 1));
    assert!((c.wasted_work_ms - 10.0).abs() < 1.0, "{c:?}");
    assert!(c.useful_work_ms < 0.001, "{c:?}");
    // 10 ms of work against a 15 ms deadline.
    let out = m
        .admit(&find(Duration::from_millis(15)))
        .await
        .unwrap()
        .execute(std::future::pending())
        .await
        .unwrap();
    assert!(!out.abandoned);
    let c = m.snapshot().counters;
    assert_eq!(c.abandoned, 1);
    assert!((c.useful_work_ms - 10.0).abs() < 1.0, "{c:?}");
}

#[tokio::test(start_paused = true)]
async fn waiting_for_the_ticket_can_push_a_request_past_its_deadline() {
    // Two 10 ms reads arrive together with a 15 ms deadline and one read ticket: the first
    // finishes at 10 ms, in time; the second waits for the ticket and finishes at 20 ms, after
    // its application gave up.
    let m = one_ticket_model();
    let arrival = Instant::now();
    let info = CommandInfo::new("find", CommandKind::Scan, arrival)
        .with_cost_ms(10.0)
        .with_client_deadline(arrival + Duration::from_millis(15));
    let run = |info: CommandInfo| {
        let m = m.clone();
        tokio::spawn(async move {
            let out = m
                .admit(&info)
                .await
                .map_err(|r| r.code)?
                .execute(std::future::pending())
                .await
                .map_err(|r| r.code)?;
            Ok::<_, i32>((out.abandoned, Instant::now() - arrival))
        })
    };
    let first = run(info.clone());
    tokio::task::yield_now().await;
    let second = run(info);
    let first = first.await.unwrap().unwrap();
    let second = second.await.unwrap().unwrap();
    assert_eq!(first, (false, Duration::from_millis(10)));
    assert!(second.0, "{second:?}");
    assert!(second.1 >= Duration::from_millis(20), "{second:?}");
    let c = m.snapshot().counters;
    assert_eq!((c.completed, c.abandoned), (2, 1), "{c:?}");
    // Where their time went: the first waited for nothing and ran 10 ms; the second waited
    // the first's 10 ms for the ticket, then ran 10 ms.
    assert_eq!(
        (c.completed_waits.total(), c.completed_runs.total()),
        (2, 2)
    );
    assert!((c.completed_wait_ms - 10.0).abs() < 0.01, "{c:?}");
    assert!((c.completed_run_ms - 20.0).abs() < 0.01, "{c:?}");
    // 0 and 10 ms waits: the first and the 10 ms bucket; both runs in the 10 ms bucket.
    assert_eq!(c.completed_waits.counts()[0], 1, "{c:?}");
    assert_eq!(c.completed_waits.counts()[6], 1, "{c:?}");
    assert_eq!(c.completed_runs.counts()[6], 2, "{c:?}");
}

#[tokio::test(start_paused = true)]
async fn a_forwarded_request_is_timed_from_reaching_the_shard_and_expires_from_the_client() {
    // A router's retry reaches the shard 60 ms after the client reached the router (the
    // shard's earlier rejection and the router's backoff): the shard's wait and run count from
    // its receipt, the request's maxTimeMS from the client's arrival.
    let m = one_ticket_model();
    let arrival = Instant::now();
    let info = CommandInfo::new("find", CommandKind::Scan, arrival)
        .with_cost_ms(10.0)
        .with_max_time_ms(100);
    tokio::time::sleep(Duration::from_millis(60)).await;
    let out = m
        .admit_forwarded(&info)
        .await
        .unwrap()
        .execute(std::future::pending())
        .await
        .unwrap();
    assert_eq!(out.total, Duration::from_millis(10), "{out:?}");
    let c = m.snapshot().counters;
    assert_eq!(c.completed_runs.total(), 1, "{c:?}");
    assert!(c.completed_wait_ms.abs() < 0.01, "{c:?}");
    assert!((c.completed_run_ms - 10.0).abs() < 0.01, "{c:?}");
    // The deadline is still the client's: 40 ms left of its 100, so a 50 ms read that starts
    // now meets it at its first interrupt point.
    let slow = CommandInfo::new("find", CommandKind::Scan, arrival)
        .with_cost_ms(50.0)
        .with_max_time_ms(100);
    let r = m
        .admit_forwarded(&slow)
        .await
        .unwrap()
        .execute(std::future::pending())
        .await
        .unwrap_err();
    assert_eq!(r.code, 50, "{r:?}");
}

#[test]
fn the_applications_deadline_is_read_from_the_comment() {
    // The comment carries Unix epoch milliseconds; the model keeps the matching instant of its
    // own clock. Both clocks are read a few microseconds apart, well inside the tolerance.
    let epoch_ms = |t: std::time::SystemTime| {
        t.duration_since(std::time::SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    let wall = std::time::SystemTime::now();
    let now = Instant::now();
    for offset_ms in [5_000i64, -1_000] {
        let at = epoch_ms(wall) + offset_ms;
        let body = bson::doc! {"find": "c", "comment": {"labReq": 7_i64, "labDeadlineMs": at}};
        let info = CommandInfo::from_command(&body, now);
        let expected = if offset_ms >= 0 {
            now + Duration::from_millis(offset_ms as u64)
        } else {
            now - Duration::from_millis(offset_ms.unsigned_abs())
        };
        let got = info.client_deadline.expect("a deadline");
        let error = if got > expected {
            got - expected
        } else {
            expected - got
        };
        assert!(
            error < Duration::from_millis(50),
            "{offset_ms}: off by {error:?}"
        );
    }
    for bad in [
        bson::Bson::String("soon".into()),
        bson::Bson::Int64(-5),
        bson::Bson::Double(f64::NAN),
    ] {
        let body = bson::doc! {"find": "c", "comment": {"labDeadlineMs": bad}};
        assert_eq!(
            CommandInfo::from_command(&body, Instant::now()).client_deadline,
            None
        );
    }
}

#[tokio::test(start_paused = true)]
async fn first_attempts_and_retries_are_timed_apart_by_their_own_kind_and_the_other() {
    // First attempts of requests 1 and 2, 3 ms apart; 1 ms later both retry at once, as a
    // client's timer tick sends them; a request without a lab id is not counted.
    let m = one_ticket_model();
    let arrive = |id: Option<u64>| {
        let info = CommandInfo::new("find", CommandKind::PointRead, Instant::now());
        let info = match id {
            Some(id) => info.with_lab_req(id),
            None => info,
        };
        let m = m.clone();
        async move { drop(m.admit(&info).await) }
    };
    arrive(Some(1)).await;
    tokio::time::advance(Duration::from_millis(3)).await;
    arrive(Some(2)).await;
    arrive(None).await;
    tokio::time::advance(Duration::from_millis(1)).await;
    arrive(Some(1)).await;
    arrive(Some(2)).await;
    let c = m.snapshot().counters;
    // One gap of 3 ms between first attempts (the 5 ms bucket), one of nothing between
    // retries (the 100 µs bucket).
    assert_eq!(c.first_attempt_gaps.total(), 1, "{c:?}");
    assert_eq!(c.first_attempt_gaps.counts()[5], 1, "{c:?}");
    assert!((c.first_attempt_gap_ms - 3.0).abs() < 1e-6, "{c:?}");
    assert_eq!(c.retry_gaps.total(), 1, "{c:?}");
    assert_eq!(c.retry_gaps.counts()[0], 1, "{c:?}");
    assert_eq!(c.retry_gap_ms, 0.0, "{c:?}");
    // Across kinds: both retries came 1 ms after the last first attempt (the 1 ms bucket);
    // no first attempt came after a retry.
    assert_eq!(c.first_attempt_after_retry_gaps.total(), 0, "{c:?}");
    assert_eq!(c.retry_after_first_attempt_gaps.total(), 2, "{c:?}");
    assert_eq!(c.retry_after_first_attempt_gaps.counts()[3], 2, "{c:?}");
    assert!(
        (c.retry_after_first_attempt_gap_ms - 2.0).abs() < 1e-6,
        "{c:?}"
    );
}
