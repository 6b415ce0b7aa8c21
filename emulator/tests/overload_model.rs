//! The overload model wired into the server: configured with setParameter, rejects with 462,
//! reported in serverStatus.

mod common;

use bson::doc;
use emulator::{Emulator, EmulatorConfig};

#[tokio::test]
async fn ingress_limiter_rejects_with_overload_labels() {
    let emu = common::start(common::rs(1)).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let r = raw
        .command(&doc! {
            "setParameter": 1,
            "labOverload": { "enabled": true, "limiter": { "enabled": true, "ratePerSec": 0.5, "burstCapacitySecs": 1.0 } },
            "$db": "admin",
        })
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    let first = raw
        .command(&doc! { "find": "c", "$db": "db" })
        .await
        .unwrap();
    assert_eq!(first.get_f64("ok"), Ok(1.0), "{first}");
    let second = raw
        .command(&doc! { "find": "c", "$db": "db" })
        .await
        .unwrap();
    assert_eq!(second.get_i32("code"), Ok(462), "{second}");
    let labels: Vec<&str> = second
        .get_array("errorLabels")
        .unwrap()
        .iter()
        .filter_map(|l| l.as_str())
        .collect();
    assert!(
        labels.contains(&"SystemOverloadedError") && labels.contains(&"RetryableError"),
        "{labels:?}"
    );
    // hello is exempt.
    let hello = raw
        .command(&doc! { "hello": 1, "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(hello.get_f64("ok"), Ok(1.0));
    let status = raw
        .command(&doc! { "serverStatus": 1, "$db": "admin" })
        .await
        .unwrap();
    assert!(status.get_document("labOverload").is_ok(), "{status}");
    let p = raw
        .command(&doc! { "getParameter": 1, "labOverload": 1, "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(
        p.get_document("labOverload").unwrap().get_bool("enabled"),
        Ok(true)
    );
    let bad = raw
        .command(&doc! { "setParameter": 1, "labOverload": { "noSuchKnob": 1 }, "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(bad.get_f64("ok"), Ok(0.0));
    raw.command(&doc! { "setParameter": 1, "labOverload": { "enabled": false }, "$db": "admin" })
        .await
        .unwrap();
    let again = raw
        .command(&doc! { "find": "c", "$db": "db" })
        .await
        .unwrap();
    assert_eq!(again.get_f64("ok"), Ok(1.0));
    emu.shutdown().await;
}

#[tokio::test]
async fn invalid_overload_config_fails_start() {
    let overload = emulator::model::ModelConfig {
        cores: 0,
        enabled: true,
        ..Default::default()
    };
    let res = Emulator::start(EmulatorConfig {
        overload,
        ..Default::default()
    })
    .await;
    assert!(res.is_err());
}

#[tokio::test]
async fn counters_and_series_reach_server_status_and_the_handle() {
    let emu = common::start(common::rs(1)).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let on = raw
        .command(&doc! {
            "setParameter": 1,
            "labOverload": { "enabled": true, "tickets": { "read": 2, "write": 2 } },
            "$db": "admin",
        })
        .await
        .unwrap();
    assert_eq!(on.get_f64("ok"), Ok(1.0), "{on}");
    for _ in 0..5 {
        let r = raw
            .command(&doc! { "find": "c", "filter": { "_id": 1 }, "$db": "db" })
            .await
            .unwrap();
        assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    }
    // Let a second boundary pass so that the series has a sample with these requests.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let status = raw
        .command(&doc! { "serverStatus": 1, "$db": "admin" })
        .await
        .unwrap();
    let overload = status.get_document("labOverload").unwrap();
    let admitted = overload
        .get_document("counters")
        .unwrap()
        .get_i64("admitted")
        .unwrap();
    assert!(admitted >= 5, "{overload}");
    let series = overload.get_array("series").unwrap();
    let in_series: i64 = series
        .iter()
        .filter_map(|s| s.as_document())
        .filter_map(|s| s.get_document("counters").ok())
        .filter_map(|c| c.get_i64("admitted").ok())
        .sum();
    assert!(in_series >= 5, "{overload}");
    let waits = overload.get_document("queueWaitMs").unwrap();
    assert!(waits.get_i64("count").unwrap() >= 5, "{waits}");
    // The library handle sees the same model.
    let model = emu.overload();
    assert!(model.snapshot().counters.admitted >= admitted as u64);
    assert!(!model.series(60).is_empty());
    emu.shutdown().await;
}
