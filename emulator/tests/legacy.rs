//! The legacy opening handshake (OP_QUERY `hello`/`isMaster` answered with OP_REPLY) and the
//! refusal of every other legacy request, as mongod does at every version.

mod common;

use bson::doc;
use emulator::wire::{self, Header, REPLY_QUERY_FAILURE};
use emulator::Topology;

#[tokio::test]
async fn op_query_handshake_is_answered_with_op_reply_then_op_msg_works() {
    let emu = common::start(common::rs(3)).await;
    let mut c = common::RawClient::connect(emu.addresses()[0]).await;
    let reply = c
        .legacy_query(
            "admin.$cmd",
            &doc! {
                "ismaster": 1,
                "helloOk": true,
                "client": { "driver": { "name": "nodejs", "version": "7" }, "application": { "name": "legacyApp" } },
            },
        )
        .await
        .expect("the server answers a legacy handshake");
    assert_eq!(reply.header.op_code, wire::OP_REPLY);
    assert_eq!(reply.cursor_id, 0);
    assert_eq!(reply.flags & REPLY_QUERY_FAILURE, 0);
    assert_eq!(reply.documents.len(), 1);
    let hello = &reply.documents[0];
    assert_eq!(hello.get_f64("ok"), Ok(1.0));
    assert_eq!(hello.get_bool("ismaster"), Ok(true));
    assert_eq!(hello.get_bool("helloOk"), Ok(true));
    assert_eq!(hello.get_str("setName"), Ok("rs0"));
    assert_eq!(hello.get_i32("maxWireVersion"), Ok(25));
    // The handshake was recorded like an OP_MSG one.
    assert!(emu.client_metadata().iter().any(|m| m
        .get_document("application")
        .and_then(|a| a.get_str("name"))
        == Ok("legacyApp")));
    // The driver then switches to OP_MSG on the same connection.
    let r = c
        .command(&doc! { "insert": "c", "documents": [{ "_id": 1 }], "$db": "db" })
        .await
        .unwrap();
    assert_eq!(r.get_i32("n"), Ok(1));
    // OP_QUERY flag bits (here bit 1, `TailableCursor`, which is OP_MSG's `moreToCome`) do not
    // turn into OP_MSG flags: the hello is still answered.
    let mut flagged = wire::encode_op_query(77, "admin.$cmd", -1, &doc! { "hello": 1 }).unwrap();
    flagged[16..20].copy_from_slice(&2u32.to_le_bytes());
    c.send_raw(&flagged).await;
    let reply = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        wire::read_reply(&mut c.stream),
    )
    .await
    .unwrap()
    .unwrap()
    .unwrap();
    assert_eq!(reply.header.response_to, 77);
    assert_eq!(reply.documents[0].get_f64("ok"), Ok(1.0));
    // The `$query` wrapper and a non-admin database work too, with either spelling.
    for name in ["hello", "isMaster"] {
        let reply = c
            .legacy_query(
                "db.$cmd",
                &doc! { "$query": { name: 1 }, "$readPreference": { "mode": "primaryPreferred" } },
            )
            .await
            .unwrap();
        assert_eq!(reply.documents[0].get_f64("ok"), Ok(1.0), "{name}");
    }
    emu.shutdown().await;
}

#[tokio::test]
async fn other_op_query_commands_get_mongods_error_and_the_connection_stays() {
    let emu = common::start(Topology::Standalone).await;
    let mut c = common::RawClient::connect(emu.addresses()[0]).await;
    for (ns, cmd, name) in [
        ("db.$cmd", doc! { "find": "c" }, "find"),
        ("admin.$cmd", doc! { "ping": 1 }, "ping"),
        ("db.$cmd", doc! { "$query": { "insert": "c" } }, "insert"),
    ] {
        let reply = c.legacy_query(ns, &cmd).await.expect("an OP_REPLY");
        assert_eq!(reply.flags & REPLY_QUERY_FAILURE, 0, "a command error");
        let err = &reply.documents[0];
        assert_eq!(err.get_f64("ok"), Ok(0.0));
        assert_eq!(err.get_i32("code"), Ok(352));
        assert_eq!(err.get_str("codeName"), Ok("UnsupportedOpQueryCommand"));
        let msg = err.get_str("errmsg").unwrap();
        assert!(
            msg.starts_with(&format!("Unsupported OP_QUERY command: {name}.")),
            "{msg}"
        );
    }
    // A legacy find on a collection namespace: QueryFailure with a `$err` document.
    let reply = c.legacy_query("db.c", &doc! { "x": 1 }).await.unwrap();
    assert_ne!(reply.flags & REPLY_QUERY_FAILURE, 0);
    assert_eq!(reply.documents[0].get_i32("code"), Ok(5739101));
    assert!(reply.documents[0]
        .get_str("$err")
        .unwrap()
        .starts_with("OP_QUERY is no longer supported."));
    // Nothing was executed: the collection is still empty.
    let r = c
        .command(&doc! { "count": "c", "$db": "db" })
        .await
        .unwrap();
    assert_eq!(r.get_i32("n"), Ok(0));
    emu.shutdown().await;
}

fn legacy_frame(op_code: i32, request_id: i32) -> Vec<u8> {
    let mut out = Vec::new();
    Header {
        message_length: 16 + 12,
        request_id,
        response_to: 0,
        op_code,
    }
    .write_to(&mut out);
    out.extend_from_slice(&[0; 12]);
    out
}

#[tokio::test]
async fn removed_opcodes_are_refused_as_mongod_does() {
    let emu = common::start(Topology::Standalone).await;
    let mut c = common::RawClient::connect(emu.addresses()[0]).await;
    // OP_GET_MORE expects a reply: a QueryFailure `$err`.
    c.send_raw(&legacy_frame(wire::OP_GET_MORE, 41)).await;
    let reply = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        wire::read_reply(&mut c.stream),
    )
    .await
    .unwrap()
    .unwrap()
    .unwrap();
    assert_eq!(reply.header.response_to, 41);
    assert_ne!(reply.flags & REPLY_QUERY_FAILURE, 0);
    assert_eq!(reply.documents[0].get_i32("code"), Ok(5739101));
    assert!(reply.documents[0]
        .get_str("$err")
        .unwrap()
        .starts_with("OP_GET_MORE is no longer supported."));
    // The fire-and-forget opcodes get no reply; the next OP_MSG's reply is the next thing read.
    for op in [
        wire::OP_INSERT,
        wire::OP_UPDATE,
        wire::OP_DELETE,
        wire::OP_KILL_CURSORS,
    ] {
        c.send_raw(&legacy_frame(op, 50)).await;
    }
    let r = c
        .command(&doc! { "ping": 1, "$db": "admin" })
        .await
        .expect("the connection stays open");
    assert_eq!(r.get_f64("ok"), Ok(1.0));
    emu.shutdown().await;
}
