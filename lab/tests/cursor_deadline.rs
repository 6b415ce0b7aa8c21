//! A cursor iterated under `timeoutMode=iteration` against an overloaded server (the emulator's
//! model with one read ticket, held by a flood of reads from another client) stops at its
//! deadline, and leaves no cursor open on the server once it is closed. (issue 29's lab check;
//! the spec-level cases are in `spec-tests/tests/cursor_timeouts.rs`.)

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use emulator::model::{CostConfig, ModelConfig, TicketConfig, Wakeup};
use emulator::{Emulator, EmulatorConfig, Topology};
use mongodb::bson::{doc, Bson, Document};
use mongodb::error::ErrorKind;
use mongodb::options::TimeoutMode;

/// The server's open cursors (`serverStatus.metrics.cursor.open.total`).
async fn open_cursors(client: &mongodb::Client) -> i64 {
    let status = client
        .database("admin")
        .run_command(doc! { "serverStatus": 1 })
        .await
        .expect("serverStatus");
    match status
        .get_document("metrics")
        .and_then(|m| m.get_document("cursor"))
        .and_then(|c| c.get_document("open"))
        .map(|o| o.get("total").cloned())
    {
        Ok(Some(Bson::Int64(n))) => n,
        Ok(Some(Bson::Int32(n))) => i64::from(n),
        other => panic!("serverStatus without metrics.cursor.open.total: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_iteration_cursor_stops_at_its_deadline_under_overload_and_frees_its_server_cursor() {
    // One read ticket, handed to waiters in arrival order, and 40 ms of core time per range
    // read without yielding: eight readers looping keep about 300 ms of work queued ahead of
    // any new read, so a getMore waits behind them.
    let model = ModelConfig {
        enabled: true,
        tickets: TicketConfig {
            read: 1,
            wakeup: Wakeup::Fifo,
            ..TicketConfig::default()
        },
        yield_period_ms: 1_000.0,
        costs: CostConfig {
            range_read_ms: 40.0,
            scan_ms: 40.0,
            ..CostConfig::default()
        },
        ..ModelConfig::default()
    };
    let emu = Emulator::start(EmulatorConfig {
        topology: Topology::Standalone,
        overload: model,
        ..EmulatorConfig::default()
    })
    .await
    .expect("emulator");
    let uri = emu.uri();
    let (setup, _) = common::client(&uri).await;
    let coll = setup.database("t").collection::<Document>("c");
    let docs: Vec<Document> = (0..20).map(|i| doc! { "_id": i }).collect();
    coll.insert_many(docs).await.expect("insert");

    let timeout = Duration::from_millis(150);
    let (client, events) = common::client_with(&uri, |o| o.timeout = Some(timeout)).await;
    let coll = client.database("t").collection::<Document>("c");
    let mut cursor = coll
        .find(doc! { "_id": { "$gte": 0 } })
        .batch_size(2)
        .timeout_mode(TimeoutMode::Iteration)
        .await
        .expect("find before the flood");
    assert!(cursor.advance().await.expect("first batch"));
    assert!(cursor.advance().await.expect("first batch"));

    // The flood: eight readers of another client, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let (flood_client, _) = common::client(&uri).await;
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let coll = flood_client.database("t").collection::<Document>("c");
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let _ = coll.find_one(doc! { "_id": { "$gte": 0 } }).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let started = Instant::now();
    let error = cursor
        .advance()
        .await
        .expect_err("the getMore waits behind the flood past the call's timeoutMS");
    let elapsed = started.elapsed();
    assert!(
        matches!(*error.kind, ErrorKind::Timeout { .. }),
        "{error:?}"
    );
    assert!(
        elapsed < timeout + Duration::from_millis(400),
        "the call ended at its deadline: {elapsed:?}"
    );
    let get_more = events.started_commands("getMore");
    assert!(!get_more.is_empty(), "a getMore was sent");
    assert!(
        get_more.iter().all(|g| !g.contains_key("maxTimeMS")),
        "iteration mode sends no maxTimeMS on getMore: {get_more:?}"
    );

    // Closing sends killCursors with timeoutMS afresh; a command takes no ticket, so it is not
    // queued behind the flood.
    cursor.close().await.expect("killCursors");
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.await.expect("reader");
    }
    let mut open = open_cursors(&setup).await;
    for _ in 0..20 {
        if open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        open = open_cursors(&setup).await;
    }
    assert_eq!(open, 0, "no cursor left open on the server");
}
