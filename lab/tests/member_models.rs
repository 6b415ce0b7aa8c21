//! Per-member overload models as a driver reaches them: a read with a secondary read
//! preference is served, and charged, by a secondary's model; reads through a sharded cluster's
//! routers are charged to the router that served each. (Driver-free wiring tests are in
//! `emulator/tests/member_models.rs`.)

mod common;

use std::collections::BTreeMap;

use emulator::model::ModelConfig;
use emulator::{Emulator, EmulatorConfig, Topology};
use mongodb::bson::{doc, Document};
use mongodb::options::{ReadPreference, ReadPreferenceOptions, SelectionCriteria};

/// Data requests a member's model ran: every read that took a ticket records its queue wait.
fn reads_served(emu: &Emulator, member: usize) -> u64 {
    emu.member_overload(member)
        .expect("member exists")
        .snapshot()
        .queue_wait_ms
        .count
}

fn on() -> ModelConfig {
    ModelConfig {
        enabled: true,
        ..ModelConfig::default()
    }
}

#[tokio::test]
async fn secondary_reads_are_charged_to_the_secondarys_model() {
    // The primary rejects every data request at random; the secondaries run a plain model.
    let primary = ModelConfig {
        random_reject_share: 1.0,
        ..on()
    };
    let emu = Emulator::start(EmulatorConfig {
        topology: common::rs(3),
        overload: on(),
        member_overload: BTreeMap::from([(0, primary)]),
        ..EmulatorConfig::default()
    })
    .await
    .unwrap();
    let (client, events) = common::client(&emu.uri()).await;
    let coll = client.database("db").collection::<Document>("c");
    let secondary = SelectionCriteria::ReadPreference(ReadPreference::Secondary {
        options: Some(ReadPreferenceOptions::default()),
    });
    const READS: u64 = 12;
    for id in 0..READS {
        coll.find_one(doc! { "_id": id as i64 })
            .selection_criteria(secondary.clone())
            .await
            .expect("a secondary read is not rejected by the primary's model");
    }
    assert_eq!(reads_served(&emu, 0), 0);
    assert_eq!(reads_served(&emu, 1) + reads_served(&emu, 2), READS);
    assert_eq!(emu.overload().snapshot().counters.random_rejections, 0);
    assert_eq!(events.started("find"), READS as usize);

    // A primary read goes through the primary's model, which rejects it with both labels.
    let err = coll
        .find_one(doc! { "_id": 0_i64 })
        .await
        .expect_err("the primary's model rejects every read");
    assert!(err.contains_label("SystemOverloadedError"), "{err}");
    assert!(err.contains_label("RetryableError"), "{err}");
    assert!(emu.overload().snapshot().counters.random_rejections >= 1);
    assert_eq!(reads_served(&emu, 1) + reads_served(&emu, 2), READS);
    emu.shutdown().await;
}

#[tokio::test]
async fn each_router_charges_the_reads_it_served() {
    let emu = Emulator::start(EmulatorConfig {
        topology: Topology::Sharded { routers: 3 },
        overload: on(),
        ..EmulatorConfig::default()
    })
    .await
    .unwrap();
    let (client, events) = common::client(&emu.uri()).await;
    let coll = client.database("db").collection::<Document>("c");
    const READS: usize = 30;
    for id in 0..READS {
        coll.find_one(doc! { "_id": id as i64 }).await.unwrap();
    }
    // Which router the driver sent each find to, from its own command events.
    let mut by_port: BTreeMap<u16, u64> = BTreeMap::new();
    for e in events.0.lock().unwrap().iter() {
        if let mongodb::event::command::CommandEvent::Started(s) = e {
            if s.command_name == "find" {
                if let mongodb::options::ServerAddress::Tcp { port, .. } = &s.connection.address {
                    *by_port.entry(port.unwrap_or(0)).or_default() += 1;
                }
            }
        }
    }
    for (i, addr) in emu.addresses().iter().enumerate() {
        let sent = by_port.get(&addr.port()).copied().unwrap_or(0);
        assert_eq!(reads_served(&emu, i), sent, "router {i}: {by_port:?}");
    }
    assert_eq!(by_port.values().sum::<u64>(), READS as u64);
    emu.shutdown().await;
}
