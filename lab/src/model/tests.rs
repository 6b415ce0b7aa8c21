//! Model-level tests that need the crate's internals.

use super::*;

#[tokio::test(start_paused = true)]
async fn dropped_execution_releases_everything_and_counts_waste() {
    let m = Model::new(ModelConfig {
        enabled: true,
        tickets: TicketConfig {
            read: 1,
            write: 1,
            ..TicketConfig::default()
        },
        ..ModelConfig::default()
    })
    .unwrap();
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
    let m = Model::new(ModelConfig {
        enabled: true,
        tickets: TicketConfig {
            read: 1,
            write: 1,
            ..TicketConfig::default()
        },
        ..ModelConfig::default()
    })
    .unwrap();
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
    assert!(s.is_err() || s.is_ok());
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
