//! Exhaust getMore: a getMore sent with `exhaustAllowed` is answered with one `moreToCome`
//! reply per batch until the cursor is exhausted, a reply is an error (an overload error
//! included), or the client stops reading; each reply answers the previous one.

mod common;

use std::time::Duration;

use bson::{doc, Bson, Document};
use common::RawClient;
use emulator::wire::{self, OpMsg, FLAG_EXHAUST_ALLOWED, FLAG_MORE_TO_COME};
use emulator::Topology;
use tokio::io::AsyncWriteExt;

async fn seeded(c: &mut RawClient, n: i32) {
    let docs: Vec<Bson> = (0..n).map(|i| Bson::Document(doc! { "_id": i })).collect();
    let r = c
        .command(&doc! { "insert": "c", "documents": docs, "$db": "db" })
        .await
        .unwrap();
    assert_eq!(r.get_i32("n"), Ok(n));
}

async fn open_cursor(c: &mut RawClient, batch_size: i32) -> i64 {
    let r = c
        .command(&doc! { "find": "c", "batchSize": batch_size, "$db": "db" })
        .await
        .unwrap();
    let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    assert_ne!(id, 0);
    id
}

async fn send_exhaust_get_more(c: &mut RawClient, request_id: i32, id: i64, batch_size: i32) {
    let body = doc! { "getMore": id, "collection": "c", "batchSize": batch_size, "$db": "db" };
    let bytes = wire::encode_op_msg(request_id, 0, FLAG_EXHAUST_ALLOWED, &body).unwrap();
    c.stream.write_all(&bytes).await.unwrap();
}

async fn next_reply(c: &mut RawClient) -> OpMsg {
    tokio::time::timeout(Duration::from_secs(5), wire::read_message(&mut c.stream))
        .await
        .expect("a reply within 5 s")
        .expect("a well-formed reply")
        .expect("a reply, not EOF")
}

/// Reads streamed replies until one without `moreToCome` (bounded): (batch lengths, last body).
async fn read_stream(c: &mut RawClient, request_id: i32) -> (Vec<usize>, Document, Vec<bool>) {
    let mut lengths = Vec::new();
    let mut flags = Vec::new();
    let mut answering = request_id;
    for _ in 0..50 {
        let reply = next_reply(c).await;
        assert_eq!(
            reply.header.response_to, answering,
            "each reply answers the previous one"
        );
        answering = reply.header.request_id;
        let more = reply.flags & FLAG_MORE_TO_COME != 0;
        flags.push(more);
        if let Ok(cursor) = reply.body.get_document("cursor") {
            lengths.push(cursor.get_array("nextBatch").unwrap().len());
        }
        if !more {
            return (lengths, reply.body, flags);
        }
    }
    panic!("more than 50 streamed replies");
}

#[tokio::test]
async fn streams_every_batch_until_the_cursor_is_exhausted() {
    let emu = common::start(Topology::Standalone).await;
    let mut c = RawClient::connect(emu.addresses()[0]).await;
    seeded(&mut c, 7).await;
    let id = open_cursor(&mut c, 2).await;
    send_exhaust_get_more(&mut c, 100, id, 2).await;
    let (lengths, last, flags) = read_stream(&mut c, 100).await;
    assert_eq!(lengths, [2, 2, 1], "5 documents after the first batch");
    assert_eq!(flags, [true, true, false]);
    assert_eq!(last.get_document("cursor").unwrap().get_i64("id"), Ok(0));
    // The connection is back to request/response.
    let r = c
        .command(&doc! { "ping": 1, "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok"), Ok(1.0));

    // At an exact boundary the stream ends with the empty batch that closes the cursor.
    let id = open_cursor(&mut c, 3).await;
    send_exhaust_get_more(&mut c, 200, id, 2).await;
    let (lengths, last, _) = read_stream(&mut c, 200).await;
    assert_eq!(lengths, [2, 2, 0]);
    assert_eq!(last.get_document("cursor").unwrap().get_i64("id"), Ok(0));
    emu.shutdown().await;
}

#[tokio::test]
async fn an_overload_error_ends_the_stream_and_the_connection_stays_usable() {
    let emu = common::start(Topology::Standalone).await;
    let mut c = RawClient::connect(emu.addresses()[0]).await;
    seeded(&mut c, 10).await;
    let id = open_cursor(&mut c, 1).await;
    // The first streamed getMore succeeds, the second is rejected as overloaded.
    let r = c
        .command(&doc! {
            "configureFailPoint": "failCommand",
            "mode": { "skip": 1 },
            "data": {
                "failCommands": ["getMore"],
                "errorCode": 462,
                "errorLabels": ["SystemOverloadedError", "RetryableError"],
            },
            "$db": "admin",
        })
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok"), Ok(1.0));
    send_exhaust_get_more(&mut c, 300, id, 1).await;
    let (lengths, last, flags) = read_stream(&mut c, 300).await;
    assert_eq!(lengths, [1], "one batch before the error");
    assert_eq!(flags, [true, false]);
    assert_eq!(last.get_f64("ok"), Ok(0.0), "{last}");
    assert_eq!(last.get_i32("code"), Ok(462));
    let labels = last.get_array("errorLabels").unwrap();
    assert!(
        labels.contains(&Bson::from("SystemOverloadedError")),
        "{last}"
    );
    let r = c
        .command(&doc! { "configureFailPoint": "failCommand", "mode": "off", "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok"), Ok(1.0));
    // The cursor survived the rejected getMore: a plain getMore retry continues it.
    let r = c
        .command(&doc! { "getMore": id, "collection": "c", "$db": "db" })
        .await
        .unwrap();
    let cursor = r.get_document("cursor").unwrap();
    assert_eq!(cursor.get_array("nextBatch").unwrap().len(), 8, "{r}");
    assert_eq!(cursor.get_i64("id"), Ok(0));
    emu.shutdown().await;
}

#[tokio::test]
async fn the_stream_stops_when_the_client_goes_away() {
    let emu = common::start(Topology::Standalone).await;
    let mut admin = RawClient::connect(emu.addresses()[0]).await;
    // 20 MB of results: more than loopback socket buffers hold, so a server that kept
    // streaming would block on a client that neither reads nor closes; this one stops when the
    // client closes.
    let pad = "p".repeat(10_000);
    for chunk in 0..2 {
        let docs: Vec<Bson> = (0..1000)
            .map(|i| Bson::Document(doc! { "_id": chunk * 1000 + i, "pad": pad.clone() }))
            .collect();
        let r = admin
            .command(&doc! { "insert": "c", "documents": docs, "$db": "db" })
            .await
            .unwrap();
        assert_eq!(r.get_i32("n"), Ok(1000));
    }
    let getmores = |status: &Document| {
        status
            .get_document("opcounters")
            .ok()
            .and_then(|o| o.get("getmore").cloned())
            .map(|v| match v {
                Bson::Int32(n) => i64::from(n),
                Bson::Int64(n) => n,
                other => panic!("getmore counter {other:?}"),
            })
            .unwrap()
    };
    let mut c = RawClient::connect(emu.addresses()[0]).await;
    let id = open_cursor(&mut c, 1).await;
    send_exhaust_get_more(&mut c, 400, id, 1).await;
    let first = next_reply(&mut c).await;
    assert_ne!(first.flags & FLAG_MORE_TO_COME, 0);
    drop(c);
    // The server notices, stops streaming and closes the connection with its cursor.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let status = admin
            .command(&doc! { "serverStatus": 1, "$db": "admin" })
            .await
            .unwrap();
        let current = status
            .get_document("connections")
            .unwrap()
            .get("current")
            .cloned();
        if current == Some(Bson::Int32(1)) || current == Some(Bson::Int64(1)) {
            assert!(
                getmores(&status) < 1999,
                "stopped before the end: {} getMores",
                getmores(&status)
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still streaming: {status}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gone = admin
        .command(&doc! { "getMore": id, "collection": "c", "$db": "db" })
        .await
        .unwrap();
    assert_eq!(
        gone.get_i32("code"),
        Ok(43),
        "the cursor went with its connection"
    );
    emu.shutdown().await;
}
