//! Replica-set and sharded personas as the driver sees them.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use emulator::Topology;
use mongodb::bson::doc;
use mongodb::event::command::CommandEvent;
use mongodb::event::sdam::SdamEvent;
use mongodb::event::EventHandler;
use mongodb::options::{ReadPreference, ReadPreferenceOptions, SelectionCriteria};
use mongodb::ServerType;

#[tokio::test]
async fn discovery_sees_primary_and_secondaries() {
    let emu = common::start(common::rs(3)).await;
    let uri = emu.uri();
    assert!(uri.ends_with("/?replicaSet=rs0"), "{uri}");
    assert_eq!(emu.addresses().len(), 3);
    let types: Arc<Mutex<Vec<(String, ServerType)>>> = Arc::default();
    let sink = types.clone();
    let (client, events) = common::client_with(&uri, move |o| {
        o.sdam_event_handler = Some(EventHandler::callback(move |ev: SdamEvent| {
            if let SdamEvent::ServerDescriptionChanged(c) = ev {
                sink.lock()
                    .unwrap()
                    .push((c.address.to_string(), c.new_description.server_type()));
            }
        }));
    })
    .await;
    client
        .database("admin")
        .run_command(doc! { "ping": 1 })
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let seen = types.lock().unwrap().clone();
        let primaries = seen
            .iter()
            .filter(|(_, t)| *t == ServerType::RsPrimary)
            .count();
        let secondaries = seen
            .iter()
            .filter(|(_, t)| *t == ServerType::RsSecondary)
            .count();
        if primaries == 1 && secondaries == 2 {
            let primary = &seen
                .iter()
                .find(|(_, t)| *t == ServerType::RsPrimary)
                .unwrap()
                .0;
            assert_eq!(primary, &emu.addresses()[0].to_string());
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "topology not discovered: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // No member flaps: every description change is a first discovery.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        types.lock().unwrap().len(),
        3,
        "{:?}",
        types.lock().unwrap()
    );

    // A secondary read goes to a secondary and succeeds there.
    let secondary = SelectionCriteria::ReadPreference(ReadPreference::Secondary {
        options: Some(ReadPreferenceOptions::default()),
    });
    client
        .database("admin")
        .run_command(doc! { "listDatabases": 1, "nameOnly": true })
        .selection_criteria(secondary)
        .await
        .unwrap();
    let last = events
        .0
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find_map(|e| match e {
            CommandEvent::Started(s) if s.command_name == "listDatabases" => Some(s.clone()),
            _ => None,
        })
        .unwrap();
    let port = match &last.connection.address {
        mongodb::options::ServerAddress::Tcp { port, .. } => port.unwrap_or(0),
        other => panic!("{other:?}"),
    };
    assert_ne!(port, emu.addresses()[0].port(), "read went to the primary");
    assert_eq!(
        last.command
            .get_document("$readPreference")
            .unwrap()
            .get_str("mode"),
        Ok("secondary")
    );
    emu.shutdown().await;
}

#[tokio::test]
async fn secondaries_refuse_writes_and_primary_only_reads() {
    let emu = common::start(common::rs(2)).await;
    let mut raw = common::RawClient::connect(emu.addresses()[1]).await;
    let hello = raw
        .command(&doc! { "hello": 1, "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(hello.get_bool("secondary"), Ok(true));
    assert_eq!(hello.get_bool("isWritablePrimary"), Ok(false));
    assert_eq!(hello.get_str("setName"), Ok("rs0"));
    assert_eq!(
        hello.get_str("primary"),
        Ok(emu.addresses()[0].to_string().as_str())
    );
    assert_eq!(
        hello.get_str("me"),
        Ok(emu.addresses()[1].to_string().as_str())
    );
    assert_eq!(hello.get_array("hosts").unwrap().len(), 2);

    let r = raw
        .command(&doc! { "insert": "c", "documents": [{"_id": 1}], "$db": "db" })
        .await
        .unwrap();
    assert_eq!(r.get_i32("code"), Ok(10107));
    assert_eq!(r.get_str("codeName"), Ok("NotWritablePrimary"));
    assert!(r.get_document("topologyVersion").is_ok());
    let r = raw
        .command(&doc! { "listDatabases": 1, "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(r.get_i32("code"), Ok(13435));
    let r = raw
        .command(&doc! { "listDatabases": 1, "$db": "admin", "$readPreference": { "mode": "secondaryPreferred" } })
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");

    // Retryable writes on a secondary carry RetryableWriteError.
    let lsid = doc! { "id": mongodb::bson::Binary { subtype: mongodb::bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] } };
    let r = raw
        .command(&doc! { "insert": "c", "documents": [{"_id": 1}], "$db": "db", "lsid": lsid, "txnNumber": 1i64 })
        .await
        .unwrap();
    let labels: Vec<&str> = r
        .get_array("errorLabels")
        .unwrap()
        .iter()
        .filter_map(|l| l.as_str())
        .collect();
    assert_eq!(labels, ["RetryableWriteError"]);
    emu.shutdown().await;
}

#[tokio::test]
async fn sharded_persona_lists_every_router() {
    let emu = common::start(Topology::Sharded { routers: 2 }).await;
    let uri = emu.uri();
    assert_eq!(uri.matches("127.0.0.1:").count(), 2, "{uri}");
    let (client, _) = common::client(&uri).await;
    let hello = client
        .database("admin")
        .run_command(doc! { "hello": 1 })
        .await
        .unwrap();
    assert_eq!(hello.get_str("msg"), Ok("isdbgrid"));
    assert!(hello.get("setName").is_none());
    emu.shutdown().await;
}
