//! failCommand: overload retries, closeConnection, blockConnection, baseBackoffMS.

mod common;

use std::time::{Duration, Instant};

use emulator::Topology;
use mongodb::bson::{doc, Document};

fn overload_fp(mode: mongodb::bson::Bson, command: &str) -> Document {
    doc! {
        "configureFailPoint": "failCommand",
        "mode": mode,
        "data": {
            "failCommands": [command],
            "errorCode": 462,
            "errorLabels": ["SystemOverloadedError", "RetryableError"],
        },
    }
}

#[tokio::test]
async fn overload_errors_are_retried_by_the_driver() {
    let emu = common::start(common::rs(1)).await;
    let (client, events) = common::client(&emu.uri()).await;
    let admin = client.database("admin");
    admin
        .run_command(overload_fp(doc! { "times": 2 }.into(), "ping"))
        .await
        .unwrap();
    admin.run_command(doc! { "ping": 1 }).await.unwrap();
    assert_eq!(events.started("ping"), 3, "two failures then success");

    admin
        .run_command(overload_fp("alwaysOn".into(), "ping"))
        .await
        .unwrap();
    let err = admin.run_command(doc! { "ping": 1 }).await.unwrap_err();
    assert!(err.contains_label("SystemOverloadedError"), "{err:?}");
    assert!(err.contains_label("RetryableError"));
    assert_eq!(
        events.started("ping"),
        6,
        "1 + maxAdaptiveRetries(2) more attempts"
    );
    admin
        .run_command(doc! { "configureFailPoint": "failCommand", "mode": "off" })
        .await
        .unwrap();
    admin.run_command(doc! { "ping": 1 }).await.unwrap();
    emu.shutdown().await;
}

#[tokio::test]
async fn close_connection_and_block_connection() {
    let emu = common::start(Topology::Standalone).await;
    let (client, _) = common::client(&emu.uri()).await;
    let admin = client.database("admin");
    admin.run_command(doc! { "ping": 1 }).await.unwrap();
    admin
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": { "failCommands": ["ping"], "closeConnection": true },
        })
        .await
        .unwrap();
    let err = admin.run_command(doc! { "ping": 1 }).await.unwrap_err();
    assert!(
        matches!(*err.kind, mongodb::error::ErrorKind::Io(_)),
        "{err:?}"
    );
    admin.run_command(doc! { "ping": 1 }).await.unwrap();

    admin
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": { "failCommands": ["ping"], "blockConnection": true, "blockTimeMS": 150 },
        })
        .await
        .unwrap();
    let t = Instant::now();
    admin.run_command(doc! { "ping": 1 }).await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(150));
    emu.shutdown().await;
}

#[tokio::test]
async fn error_shape_and_base_backoff() {
    let emu = common::start(common::rs(1)).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let r = raw
        .command(&doc! { "setParameter": 1, "externalClientBaseBackoffMS": 50, "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok"), Ok(1.0));
    let mut fp = overload_fp("alwaysOn".into(), "find");
    fp.get_document_mut("data").unwrap().remove("errorLabels");
    fp.insert("$db", "admin");
    raw.command(&fp).await.unwrap();
    let r = raw
        .command(&doc! { "find": "c", "$db": "db" })
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok"), Ok(0.0));
    assert_eq!(r.get_i32("code"), Ok(462));
    assert_eq!(r.get_str("codeName"), Ok("IngressRequestRateLimitExceeded"));
    assert_eq!(
        r.get_str("errmsg"),
        Ok("Failing command via 'failCommand' failpoint")
    );
    let labels: Vec<&str> = r
        .get_array("errorLabels")
        .unwrap()
        .iter()
        .filter_map(|l| l.as_str())
        .collect();
    assert_eq!(labels, ["SystemOverloadedError", "RetryableError"]);
    assert_eq!(r.get_i64("baseBackoffMS"), Ok(50));
    assert!(r.get_document("$clusterTime").is_ok());
    // Not for other commands, and never for configureFailPoint.
    let ok = raw
        .command(&doc! { "ping": 1, "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(ok.get_f64("ok"), Ok(1.0));
    let off = raw
        .command(&doc! { "configureFailPoint": "failCommand", "mode": "off", "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(off.get_i64("count"), Ok(1));
    emu.shutdown().await;
}

#[tokio::test]
async fn app_name_filter_and_hello_failures() {
    let emu = common::start(Topology::Standalone).await;
    let (control, _) = common::client(&emu.uri()).await;
    control
        .database("admin")
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": "alwaysOn",
            "data": { "failCommands": ["isMaster", "hello"], "appName": "victim", "closeConnection": true },
        })
        .await
        .unwrap();
    // The control client is unaffected.
    control
        .database("admin")
        .run_command(doc! { "ping": 1 })
        .await
        .unwrap();
    let (victim, _) = common::client_with(&emu.uri(), |o| {
        o.app_name = Some("victim".into());
        o.server_selection_timeout = Some(Duration::from_millis(300));
    })
    .await;
    assert!(victim
        .database("admin")
        .run_command(doc! { "ping": 1 })
        .await
        .is_err());
    control
        .database("admin")
        .run_command(doc! { "configureFailPoint": "failCommand", "mode": "off" })
        .await
        .unwrap();
    emu.shutdown().await;
}
