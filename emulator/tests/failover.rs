//! Step-down and failover on the emulated replica set, over raw wire-protocol connections:
//! roles, terms and topology versions in hello, the old primary's errors, transactions aborted
//! by a step-down and retryable-write records that outlive it.

mod common;

use std::time::{Duration, Instant};

use bson::{doc, oid::ObjectId, Bson, Document};
use common::RawClient;
use emulator::StepDown;

fn with_db(mut body: Document, db: &str) -> Document {
    body.insert("$db", db);
    body
}

async fn hello(addr: std::net::SocketAddr) -> Document {
    let mut c = RawClient::connect(addr).await;
    c.command(&with_db(doc! { "hello": 1 }, "admin"))
        .await
        .expect("hello reply")
}

fn labels(reply: &Document) -> Vec<String> {
    match reply.get("errorLabels") {
        Some(Bson::Array(a)) => a
            .iter()
            .filter_map(|l| l.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

/// Waits (at most 5 s) until the set has a primary other than `old`; returns its index.
async fn new_primary(emu: &emulator::Emulator, old: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(p) = emu.primary().filter(|p| *p != old) {
            return p;
        }
        assert!(Instant::now() < deadline, "no new primary within 5 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn counter(hello: &Document) -> i64 {
    hello
        .get_document("topologyVersion")
        .and_then(|tv| tv.get_i64("counter"))
        .expect("topologyVersion.counter")
}

#[tokio::test]
async fn step_down_elects_another_member_and_changes_the_topology() {
    let emu = common::start(common::rs(3)).await;
    let addrs = emu.addresses();
    let before = hello(addrs[0]).await;
    assert_eq!(before.get_bool("isWritablePrimary"), Ok(true));
    assert_eq!(
        before.get_object_id("electionId"),
        Ok(ObjectId::parse_str("7fffffff0000000000000001").unwrap())
    );

    // A secondary refuses, as mongod does.
    let mut secondary = RawClient::connect(addrs[1]).await;
    let refused = secondary
        .command(&with_db(doc! { "replSetStepDown": 10 }, "admin"))
        .await
        .unwrap();
    assert_eq!(refused.get_i32("code"), Ok(10107), "{refused}");
    // stepDownSecs below secondaryCatchUpPeriodSecs is a bad value.
    let mut primary = RawClient::connect(addrs[0]).await;
    let bad = primary
        .command(&with_db(
            doc! { "replSetStepDown": 5, "secondaryCatchUpPeriodSecs": 10 },
            "admin",
        ))
        .await
        .unwrap();
    assert_eq!(bad.get_i32("code"), Ok(2), "{bad}");
    // replSetFreeze on the primary: NotSecondary.
    let frozen = primary
        .command(&with_db(doc! { "replSetFreeze": 10 }, "admin"))
        .await
        .unwrap();
    assert_eq!(frozen.get_i32("code"), Ok(95), "{frozen}");
    // Member 1 frozen: the election skips it.
    let ok = secondary
        .command(&with_db(doc! { "replSetFreeze": 30 }, "admin"))
        .await
        .unwrap();
    assert_eq!(ok.get_f64("ok"), Ok(1.0), "{ok}");

    // An awaitable hello on the old primary, up to date, returns at once on the change.
    let mut waiter = RawClient::connect(addrs[0]).await;
    let awaitable = with_db(
        doc! { "hello": 1, "topologyVersion": before.get_document("topologyVersion").unwrap().clone(), "maxAwaitTimeMS": 10_000 },
        "admin",
    );
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let reply = waiter
            .command(&awaitable)
            .await
            .expect("awaitable hello reply");
        (reply, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(100)).await;

    let stepped = primary
        .command(&with_db(doc! { "replSetStepDown": 60 }, "admin"))
        .await
        .unwrap();
    assert_eq!(stepped.get_f64("ok"), Ok(1.0), "{stepped}");
    let (woken, waited) = waiting.await.unwrap();
    assert!(waited < Duration::from_secs(2), "hello waited {waited:?}");
    assert_eq!(woken.get_bool("isWritablePrimary"), Ok(false), "{woken}");
    assert_eq!(woken.get_bool("secondary"), Ok(true), "{woken}");
    assert!(counter(&woken) > counter(&before), "{woken}");

    let elected = new_primary(&emu, 0).await;
    assert_eq!(elected, 2, "member 1 is frozen, so member 2 wins");
    assert_eq!(emu.elections(), 1);
    let after = hello(addrs[2]).await;
    assert_eq!(after.get_bool("isWritablePrimary"), Ok(true), "{after}");
    assert_eq!(
        after.get_object_id("electionId"),
        Ok(ObjectId::parse_str("7fffffff0000000000000002").unwrap())
    );
    assert_eq!(
        after.get_i32("setVersion"),
        Ok(1),
        "mongod keeps setVersion on elections"
    );
    for addr in &addrs {
        let h = hello(*addr).await;
        assert_eq!(
            h.get_str("primary"),
            Ok(addrs[2].to_string().as_str()),
            "{h}"
        );
        assert_eq!(h.get_array("hosts").map(Vec::len), Ok(3), "{h}");
    }

    // The old primary answers writes and primary reads like a secondary.
    let write = primary
        .command(&with_db(
            doc! { "insert": "c", "documents": [{ "_id": 1 }], "lsid": { "id": bson::Uuid::new() }, "txnNumber": 1i64 },
            "db",
        ))
        .await
        .unwrap();
    assert_eq!(write.get_i32("code"), Ok(10107), "{write}");
    assert_eq!(labels(&write), ["RetryableWriteError"], "{write}");
    let read = primary
        .command(&with_db(doc! { "find": "c" }, "db"))
        .await
        .unwrap();
    assert_eq!(read.get_i32("code"), Ok(13435), "{read}");
    // It cannot be re-elected at once: stepping the new primary down with the old one embargoed
    // and member 1 frozen leaves no electable member (262 without force).
    let mut new = RawClient::connect(addrs[2]).await;
    let none = new
        .command(&with_db(doc! { "replSetStepDown": 60 }, "admin"))
        .await
        .unwrap();
    assert_eq!(none.get_i32("code"), Ok(262), "{none}");
    // Unfreezing member 1 lets it win the next hand-off.
    let ok = secondary
        .command(&with_db(doc! { "replSetFreeze": 0 }, "admin"))
        .await
        .unwrap();
    assert_eq!(ok.get_f64("ok"), Ok(1.0), "{ok}");
    emu.step_down(&StepDown {
        election_delay: Duration::ZERO,
        ..Default::default()
    })
    .expect("steps down");
    assert_eq!(new_primary(&emu, 2).await, 1);
    emu.shutdown().await;
}

#[tokio::test]
async fn retryable_write_records_and_transactions_across_a_step_down() {
    let emu = common::start(common::rs(3)).await;
    let addrs = emu.addresses();
    let mut old = RawClient::connect(addrs[0]).await;
    let lsid = doc! { "id": bson::Uuid::new() };
    let inc = with_db(
        doc! { "update": "c", "updates": [{ "q": { "_id": 1 }, "u": { "$inc": { "n": 1 } }, "upsert": true }],
        "lsid": lsid.clone(), "txnNumber": 7i64 },
        "db",
    );
    let first = old.command(&inc).await.unwrap();
    assert_eq!(first.get_f64("ok"), Ok(1.0), "{first}");

    // A transaction in progress on the old primary.
    let txn_lsid = doc! { "id": bson::Uuid::new() };
    let started = old
        .command(&with_db(
            doc! { "insert": "c", "documents": [{ "_id": 100 }], "lsid": txn_lsid.clone(),
            "txnNumber": 1i64, "startTransaction": true, "autocommit": false },
            "db",
        ))
        .await
        .unwrap();
    assert_eq!(started.get_f64("ok"), Ok(1.0), "{started}");

    emu.step_down(&StepDown::default()).expect("steps down");
    let p = new_primary(&emu, 0).await;
    let mut new = RawClient::connect(addrs[p]).await;

    // The retry on the new primary returns the first reply; the increment is not applied again.
    let retried = new.command(&inc).await.unwrap();
    assert_eq!(retried.get_f64("ok"), Ok(1.0), "{retried}");
    assert_eq!(retried.get("upserted"), first.get("upserted"), "{retried}");
    let found = new
        .command(&with_db(doc! { "find": "c", "filter": { "_id": 1 } }, "db"))
        .await
        .unwrap();
    let batch = found
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .unwrap()
        .clone();
    assert_eq!(batch, vec![Bson::Document(doc! { "_id": 1, "n": 1 })]);

    // A statement of the aborted transaction on the old primary: NotWritablePrimary, transient.
    let statement = old
        .command(&with_db(
            doc! { "insert": "c", "documents": [{ "_id": 101 }], "lsid": txn_lsid.clone(),
            "txnNumber": 1i64, "autocommit": false },
            "db",
        ))
        .await
        .unwrap();
    assert_eq!(statement.get_i32("code"), Ok(10107), "{statement}");
    assert_eq!(labels(&statement), ["TransientTransactionError"]);
    // Commit on the old primary: NotWritablePrimary with RetryableWriteError (the driver adds
    // UnknownTransactionCommitResult and retries it on the new primary).
    let commit = with_db(
        doc! { "commitTransaction": 1, "lsid": txn_lsid.clone(), "txnNumber": 1i64, "autocommit": false },
        "admin",
    );
    let on_old = old.command(&commit).await.unwrap();
    assert_eq!(on_old.get_i32("code"), Ok(10107), "{on_old}");
    assert_eq!(labels(&on_old), ["RetryableWriteError"]);
    // On the new primary the transaction is gone: NoSuchTransaction, transient.
    let on_new = new.command(&commit).await.unwrap();
    assert_eq!(on_new.get_i32("code"), Ok(251), "{on_new}");
    assert_eq!(labels(&on_new), ["TransientTransactionError"]);
    let gone = new
        .command(&with_db(
            doc! { "find": "c", "filter": { "_id": 100 } },
            "db",
        ))
        .await
        .unwrap();
    assert_eq!(
        gone.get_document("cursor")
            .and_then(|c| c.get_array("firstBatch"))
            .map(Vec::len),
        Ok(0),
        "{gone}"
    );
    emu.shutdown().await;
}

#[tokio::test]
async fn scheduled_step_downs_keep_electing_new_primaries() {
    let emu = common::start(common::rs(3)).await;
    // The old primary may stand again after 100 ms, so the schedule never runs out of members.
    let schedule = emu.schedule_step_downs(
        Duration::from_millis(150),
        StepDown {
            step_down_for: Duration::from_millis(100),
            force: false,
            election_delay: Duration::from_millis(10),
        },
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while schedule.step_downs() < 3 {
        assert!(Instant::now() < deadline, "3 step-downs within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let done = schedule.stop();
    assert!(done >= 3);
    // Each step-down is followed by an election; the last one may still be pending.
    let deadline = Instant::now() + Duration::from_secs(5);
    while emu.elections() < done as u64 {
        assert!(
            Instant::now() < deadline,
            "an election after every step-down"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Stopped: no further step-downs.
    let elections = emu.elections();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(emu.elections(), elections);
    assert!(emu.primary().is_some());
    emu.shutdown().await;
}

#[tokio::test]
async fn step_down_needs_a_replica_set() {
    for topology in [
        emulator::Topology::Standalone,
        emulator::Topology::Sharded { routers: 2 },
    ] {
        let emu = common::start(topology).await;
        let mut raw = RawClient::connect(emu.addresses()[0]).await;
        for cmd in ["replSetStepDown", "replSetFreeze"] {
            let reply = raw
                .command(&with_db(doc! { cmd: 10 }, "admin"))
                .await
                .unwrap();
            assert_eq!(reply.get_i32("code"), Ok(76), "{reply}");
            assert_eq!(
                reply.get_str("codeName"),
                Ok("NoReplicationEnabled"),
                "{reply}"
            );
        }
        assert!(emu.step_down(&StepDown::default()).is_err());
        assert_eq!(emu.primary(), None);
        emu.shutdown().await;
    }
}
