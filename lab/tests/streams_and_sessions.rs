//! Change streams, $listLocalSessions, idle cursor timeout, endSessions cleanup, maxTimeMS.

mod common;

use std::time::Duration;

use emulator::{Emulator, EmulatorConfig, Topology};
use mongodb::bson::{doc, spec::BinarySubtype, Binary, Document};
use mongodb::change_stream::{event::ChangeStreamEvent, ChangeStream};

#[tokio::test]
async fn change_streams_and_local_sessions() {
    let emu = common::start(common::rs(1)).await;
    let (client, events) = common::client(&emu.uri()).await;
    let coll = client.database("db").collection::<Document>("c");
    let mut stream = coll.watch().await.unwrap();
    assert!(stream.resume_token().is_some());
    let next = tokio::time::timeout(Duration::from_millis(300), stream.next_if_any()).await;
    if let Ok(r) = next {
        assert!(
            r.unwrap().is_none(),
            "the emulator's change streams are always empty"
        );
    }
    drop(stream);
    client.database("db").watch().await.unwrap();
    client.watch().await.unwrap();
    let aggs = events.started_commands("aggregate");
    assert_eq!(aggs.len(), 3);

    let mut cursor = client
        .database("admin")
        .aggregate(vec![
            doc! { "$listLocalSessions": {} },
            doc! { "$limit": 1 },
        ])
        .await
        .unwrap();
    assert!(cursor.advance().await.unwrap());
    let session = cursor.deserialize_current().unwrap();
    assert!(
        session
            .get_document("_id")
            .unwrap()
            .get_binary_generic("id")
            .is_ok()
            || session.get_document("_id").is_ok()
    );

    // Standalone servers have no change streams.
    let standalone = common::start(Topology::Standalone).await;
    let (client, _) = common::client(&standalone.uri()).await;
    let err = client
        .database("db")
        .collection::<Document>("c")
        .watch()
        .await
        .unwrap_err();
    assert!(format!("{err:?}").contains("40573"), "{err:?}");
    standalone.shutdown().await;
    emu.shutdown().await;
}

#[tokio::test]
async fn idle_cursors_time_out_and_end_sessions_kills_cursors() {
    let emu = Emulator::start(EmulatorConfig {
        topology: common::rs(1),
        cursor_timeout: Duration::from_millis(150),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let docs: Vec<Document> = (0..5).map(|i| doc! { "_id": i }).collect();
    raw.command(&doc! { "insert": "c", "documents": docs, "$db": "db" })
        .await
        .unwrap();
    let r = raw
        .command(&doc! { "find": "c", "batchSize": 1, "$db": "db" })
        .await
        .unwrap();
    let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let r = raw
        .command(&doc! { "getMore": id, "collection": "c", "$db": "db" })
        .await
        .unwrap();
    assert_eq!(r.get_i32("code"), Ok(43), "{r}");

    let lsid = doc! { "id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![3; 16] } };
    let r = raw
        .command(&doc! { "find": "c", "batchSize": 1, "$db": "db", "lsid": lsid.clone() })
        .await
        .unwrap();
    let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    let r = raw
        .command(&doc! { "endSessions": [lsid], "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok"), Ok(1.0));
    let r = raw
        .command(&doc! { "getMore": id, "collection": "c", "$db": "db" })
        .await
        .unwrap();
    assert_eq!(r.get_i32("code"), Ok(43), "{r}");
    emu.shutdown().await;
}

#[tokio::test]
async fn block_connection_respects_max_time_ms() {
    let emu = common::start(Topology::Standalone).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    raw.command(&doc! {
        "configureFailPoint": "failCommand",
        "mode": "alwaysOn",
        "data": { "failCommands": ["find"], "blockConnection": true, "blockTimeMS": 200 },
        "$db": "admin",
    })
    .await
    .unwrap();
    let t = std::time::Instant::now();
    let r = raw
        .command(&doc! { "find": "c", "maxTimeMS": 30, "$db": "db" })
        .await
        .unwrap();
    assert_eq!(r.get_i32("code"), Ok(50));
    assert_eq!(r.get_str("codeName"), Ok("MaxTimeMSExpired"));
    assert!(t.elapsed() < Duration::from_millis(190));
    let r = raw
        .command(&doc! { "find": "c", "$db": "db" })
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok"), Ok(1.0));
    emu.shutdown().await;
}

/// The next change event, polling with `next_if_any` for at most 5 s.
async fn next_event(
    stream: &mut ChangeStream<ChangeStreamEvent<Document>>,
) -> ChangeStreamEvent<Document> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(ev) = stream.next_if_any().await.unwrap() {
            return ev;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no change event within 5 s"
        );
    }
}

#[tokio::test]
async fn change_streams_deliver_events_and_resume() {
    let emu = common::start(common::rs(1)).await;
    let (client, _) = common::client(&emu.uri()).await;
    let coll = client.database("db").collection::<Document>("c");
    let other = client.database("db").collection::<Document>("other");
    let mut stream = coll.watch().await.unwrap();
    let mut db_stream = client.database("db").watch().await.unwrap();
    coll.insert_one(doc! { "_id": 1, "a": 1 }).await.unwrap();
    other.insert_one(doc! { "_id": 9 }).await.unwrap();
    coll.update_one(
        doc! { "_id": 1 },
        doc! { "$set": { "a": 2 }, "$unset": { "x": 1 } },
    )
    .await
    .unwrap();
    coll.replace_one(doc! { "_id": 1 }, doc! { "b": 1 })
        .await
        .unwrap();
    coll.delete_one(doc! { "_id": 1 }).await.unwrap();

    let mut ops = Vec::new();
    let mut token = None;
    for _ in 0..4 {
        let ev = next_event(&mut stream).await;
        if ops.is_empty() {
            assert_eq!(ev.full_document, Some(doc! { "_id": 1, "a": 1 }));
            token = stream.resume_token();
        }
        ops.push(format!("{:?}", ev.operation_type));
    }
    assert_eq!(ops, ["Insert", "Update", "Replace", "Delete"]);

    // The database-level stream also sees the other collection.
    let mut seen = 0;
    while seen < 5 {
        next_event(&mut db_stream).await;
        seen += 1;
    }

    // Resuming after the first event replays the rest.
    let mut resumed = coll.watch().resume_after(token.unwrap()).await.unwrap();
    let ev = next_event(&mut resumed).await;
    assert_eq!(format!("{:?}", ev.operation_type), "Update");
    let desc = ev.update_description.unwrap();
    assert_eq!(desc.updated_fields, doc! { "a": 2 });
    emu.shutdown().await;
}
