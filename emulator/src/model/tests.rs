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

#[tokio::test(start_paused = true)]
async fn kill_on_disconnect_also_ends_a_ticket_wait() {
    let m = Model::new(ModelConfig {
        enabled: true,
        kill_on_client_disconnect: true,
        tickets: TicketConfig {
            read: 1,
            write: 1,
            ..TicketConfig::default()
        },
        ..ModelConfig::default()
    })
    .unwrap();
    let info = CommandInfo::new("find", CommandKind::Scan, Instant::now()).with_cost_ms(50.0);
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
    assert_eq!((r.code, r.work), (279, Duration::ZERO));
    assert_eq!(t0.elapsed(), Duration::from_millis(5));
    assert_eq!(r.fixed_labels(), None);
    assert!(holder.await.unwrap());
    let c = m.snapshot().counters;
    assert_eq!((c.killed, c.completed), (1, 1));
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
