//! Per-member overload models through the wire: each member runs its own model, configured at
//! start (`EmulatorConfig::member_overload`) or with `setParameter` (`labOverload` on the
//! member, `labOverloadMembers` on any), and reported per member in `serverStatus`.

mod common;

use std::collections::BTreeMap;

use bson::{doc, Bson, Document};
use emulator::model::{LimiterConfig, ModelConfig};
use emulator::{Emulator, EmulatorConfig, Topology};

async fn admin(raw: &mut common::RawClient, mut cmd: Document) -> Document {
    cmd.insert("$db", "admin");
    raw.command(&cmd).await.expect("a reply")
}

fn member_counter(status: &Document, member: usize, name: &str) -> i64 {
    let members = status.get_array("labOverloadMembers").unwrap();
    let m = members[member].as_document().unwrap();
    assert_eq!(m.get_i64("member"), Ok(member as i64), "{m}");
    m.get_document("counters").unwrap().get_i64(name).unwrap()
}

/// A model that admits one request and then rejects everything (a bucket of one token that
/// refills every 1,000 s).
fn one_token() -> ModelConfig {
    ModelConfig {
        enabled: true,
        limiter: LimiterConfig {
            enabled: true,
            rate_per_sec: 0.001,
            burst_capacity_secs: 1.0,
            ..LimiterConfig::default()
        },
        ..ModelConfig::default()
    }
}

#[tokio::test]
async fn secondary_reads_go_through_the_secondarys_own_model() {
    // Member 1 (a secondary) has a one-token limiter; the primary's model is off.
    let emu = Emulator::start(EmulatorConfig {
        topology: common::rs(3),
        member_overload: BTreeMap::from([(1, one_token())]),
        ..EmulatorConfig::default()
    })
    .await
    .unwrap();
    assert!(!emu.overload().config().enabled);
    assert!(emu.member_overload(1).unwrap().config().enabled);
    assert!(emu.member_overload(3).is_none());
    assert_eq!(emu.overload_models().len(), 3);
    let addrs = emu.addresses();
    let mut secondary = common::RawClient::connect(addrs[1]).await;
    let read = doc! {
        "find": "c", "filter": { "_id": 1 }, "$db": "db",
        "$readPreference": { "mode": "secondaryPreferred" },
    };
    let first = secondary.command(&read).await.unwrap();
    assert_eq!(first.get_f64("ok"), Ok(1.0), "{first}");
    let second = secondary.command(&read).await.unwrap();
    assert_eq!(second.get_i32("code"), Ok(462), "{second}");
    // The primary's model is off: its reads pass however many.
    let mut primary = common::RawClient::connect(addrs[0]).await;
    for _ in 0..3 {
        let r = primary
            .command(&doc! { "find": "c", "$db": "db" })
            .await
            .unwrap();
        assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    }
    // serverStatus on a member reports its own model, and every member's in
    // labOverloadMembers.
    let status = admin(&mut secondary, doc! { "serverStatus": 1 }).await;
    let own = status.get_document("labOverload").unwrap();
    assert_eq!(own.get_bool("enabled"), Ok(true));
    assert_eq!(
        own.get_document("counters").unwrap().get_i64("rejected"),
        Ok(1)
    );
    let status = admin(&mut primary, doc! { "serverStatus": 1 }).await;
    assert_eq!(
        status
            .get_document("labOverload")
            .unwrap()
            .get_bool("enabled"),
        Ok(false)
    );
    assert_eq!(member_counter(&status, 1, "rejected"), 1);
    // The first read and the (exempt) serverStatus sent to member 1.
    assert_eq!(member_counter(&status, 1, "admitted"), 2);
    assert_eq!(member_counter(&status, 0, "rejected"), 0);
    assert_eq!(member_counter(&status, 2, "admitted"), 0);
    assert_eq!(
        emu.member_overload(1).unwrap().snapshot().counters.rejected,
        1
    );
    emu.shutdown().await;
}

#[tokio::test]
async fn each_router_is_configured_and_counted_on_its_own() {
    let emu = common::start(Topology::Sharded { routers: 3 }).await;
    let addrs = emu.addresses();
    let mut routers = Vec::new();
    for a in &addrs {
        routers.push(common::RawClient::connect(*a).await);
    }
    // labOverload sent to router 2 configures router 2 only.
    let limiter = doc! {
        "enabled": true,
        "limiter": { "enabled": true, "ratePerSec": 0.001, "burstCapacitySecs": 1.0 },
    };
    let r = admin(
        &mut routers[2],
        doc! { "setParameter": 1, "labOverload": limiter.clone() },
    )
    .await;
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    assert!(emu.member_overload(2).unwrap().config().enabled);
    assert!(!emu.overload().config().enabled);
    assert!(!emu.member_overload(1).unwrap().config().enabled);
    for (i, router) in routers.iter_mut().enumerate() {
        // Two reads each: router 2 rejects its second.
        let codes: Vec<Option<i32>> = {
            let mut v = Vec::new();
            for _ in 0..2 {
                let r = router
                    .command(&doc! { "find": "c", "$db": "db" })
                    .await
                    .unwrap();
                v.push(r.get_i32("code").ok());
            }
            v
        };
        let want = if i == 2 {
            vec![None, Some(462)]
        } else {
            vec![None, None]
        };
        assert_eq!(codes, want, "router {i}");
    }
    // labOverloadMembers from router 0 sets every router, then overrides router 1.
    let r = admin(
        &mut routers[0],
        doc! { "setParameter": 1, "labOverloadMembers": {
            "all": { "enabled": true, "cores": 3 },
            "1": { "cores": 5 },
        } },
    )
    .await;
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    // `was` holds every member's configuration before the change.
    let was = r.get_document("was").unwrap();
    assert_eq!(
        was.get_document("2")
            .unwrap()
            .get_document("limiter")
            .unwrap()
            .get_bool("enabled"),
        Ok(true)
    );
    let cores: Vec<u32> = emu
        .overload_models()
        .iter()
        .map(|m| m.config().cores)
        .collect();
    assert_eq!(cores, [3, 5, 3]);
    // Router 2 kept its limiter (partial documents merge).
    assert!(emu.member_overload(2).unwrap().config().limiter.enabled);
    let got = admin(
        &mut routers[1],
        doc! { "getParameter": 1, "labOverloadMembers": 1 },
    )
    .await;
    let configs = got.get_document("labOverloadMembers").unwrap();
    let keys: Vec<&str> = configs.keys().map(String::as_str).collect();
    assert_eq!(keys, ["0", "1", "2"]);
    assert_eq!(
        configs.get_document("1").unwrap().get("cores"),
        Some(&Bson::Int64(5))
    );
    let own = admin(
        &mut routers[1],
        doc! { "getParameter": 1, "labOverload": 1 },
    )
    .await;
    assert_eq!(
        own.get_document("labOverload").unwrap().get("cores"),
        Some(&Bson::Int64(5))
    );
    emu.shutdown().await;
}

#[tokio::test]
async fn bad_member_settings_change_nothing() {
    let emu = common::start(Topology::Sharded { routers: 2 }).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let cases = [
        (
            doc! { "0": { "cores": 4 }, "7": { "cores": 2 } },
            "no member \"7\"",
        ),
        (doc! { "x": { "cores": 4 } }, "no member \"x\""),
        (
            doc! { "all": { "cores": 4 }, "1": { "cores": 0 } },
            "labOverloadMembers.1",
        ),
        (doc! { "0": 5 }, "must be a document"),
    ];
    for (members, needle) in cases {
        let r = admin(
            &mut raw,
            doc! { "setParameter": 1, "labOverloadMembers": members.clone() },
        )
        .await;
        assert_eq!(r.get_f64("ok"), Ok(0.0), "{members}: {r}");
        let msg = r.get_str("errmsg").unwrap();
        assert!(msg.contains(needle), "{members}: {msg}");
        let cores: Vec<u32> = emu
            .overload_models()
            .iter()
            .map(|m| m.config().cores)
            .collect();
        assert_eq!(cores, [2, 2], "{members} changed a model");
    }
    let r = admin(
        &mut raw,
        doc! { "setParameter": 1, "labOverloadMembers": 1 },
    )
    .await;
    assert_eq!(r.get_f64("ok"), Ok(0.0), "{r}");
    emu.shutdown().await;
}

#[tokio::test]
async fn member_overrides_are_checked_at_start() {
    let bad_index = Emulator::start(EmulatorConfig {
        topology: common::rs(2),
        member_overload: BTreeMap::from([(2, ModelConfig::default())]),
        ..EmulatorConfig::default()
    })
    .await;
    let err = bad_index
        .err()
        .expect("member 2 of 2 is refused")
        .to_string();
    assert!(err.contains("member 2"), "{err}");
    let invalid = Emulator::start(EmulatorConfig {
        topology: common::rs(2),
        member_overload: BTreeMap::from([(
            1,
            ModelConfig {
                cores: 0,
                ..ModelConfig::default()
            },
        )]),
        ..EmulatorConfig::default()
    })
    .await;
    let err = invalid
        .err()
        .expect("an invalid model is refused")
        .to_string();
    assert!(err.contains("member 1") && err.contains("cores"), "{err}");
}

#[tokio::test]
async fn new_connections_are_charged_to_their_members_model() {
    // Member 1 charges 2 ms of core time per accepted connection; member 0 charges nothing.
    let emu = Emulator::start(EmulatorConfig {
        topology: Topology::Sharded { routers: 2 },
        member_overload: BTreeMap::from([(
            1,
            ModelConfig {
                enabled: true,
                costs: emulator::model::CostConfig {
                    connection_ms: 2.0,
                    ..emulator::model::CostConfig::default()
                },
                ..ModelConfig::default()
            },
        )]),
        ..EmulatorConfig::default()
    })
    .await
    .unwrap();
    let addrs = emu.addresses();
    for _ in 0..3 {
        let mut raw = common::RawClient::connect(addrs[1]).await;
        // The first reply comes after the connection's cost was charged.
        let r = admin(&mut raw, doc! { "ping": 1 }).await;
        assert_eq!(r.get_f64("ok"), Ok(1.0));
        let mut other = common::RawClient::connect(addrs[0]).await;
        let r = admin(&mut other, doc! { "ping": 1 }).await;
        assert_eq!(r.get_f64("ok"), Ok(1.0));
    }
    let charged = emu.member_overload(1).unwrap().snapshot().counters;
    // Three connections at 2 ms each (real timers may charge a little more, never less).
    assert!(
        charged.overhead_work_ms >= 6.0 - 0.01 && charged.overhead_work_ms < 12.0,
        "{charged:?}"
    );
    assert_eq!(emu.overload().snapshot().counters.overhead_work_ms, 0.0);
    emu.shutdown().await;
}
