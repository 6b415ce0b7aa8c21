//! Handshake, ping, hello replies and client metadata recording.

mod common;

use emulator::Topology;
use mongodb::bson::{doc, Bson};

#[tokio::test]
async fn handshake_and_ping() {
    let emu = common::start(Topology::Standalone).await;
    let (client, _) =
        common::client_with(&emu.uri(), |o| o.app_name = Some("handshakeTest".into())).await;
    let r = client
        .database("admin")
        .run_command(doc! { "ping": 1 })
        .await
        .unwrap();
    assert_eq!(r.get("ok"), Some(&Bson::Double(1.0)));

    let hello = client
        .database("admin")
        .run_command(doc! { "hello": 1 })
        .await
        .unwrap();
    assert_eq!(hello.get_bool("isWritablePrimary"), Ok(true));
    assert_eq!(hello.get_i32("maxBsonObjectSize"), Ok(16 * 1024 * 1024));
    assert_eq!(hello.get_i32("maxMessageSizeBytes"), Ok(48_000_000));
    assert_eq!(hello.get_i32("maxWireVersion"), Ok(25));
    assert_eq!(hello.get_i32("logicalSessionTimeoutMinutes"), Ok(30));
    assert!(hello.get_document("topologyVersion").is_ok());

    let legacy = client
        .database("admin")
        .run_command(doc! { "isMaster": 1 })
        .await
        .unwrap();
    assert_eq!(legacy.get_bool("ismaster"), Ok(true));

    let bi = client
        .database("admin")
        .run_command(doc! { "buildInfo": 1 })
        .await
        .unwrap();
    assert_eq!(bi.get_str("version"), Ok("8.2.0"));
    assert_eq!(bi.get_array("versionArray").unwrap().len(), 4);

    let md = emu.client_metadata();
    assert!(!md.is_empty());
    for m in &md {
        assert_eq!(m.get_str("backpressure"), Ok("2"), "{m}");
        let driver = m.get_document("driver").unwrap();
        assert!(
            driver
                .get_str("name")
                .unwrap()
                .starts_with("mongo-rust-driver"),
            "{m}"
        );
        assert_eq!(
            m.get_document("application").unwrap().get_str("name"),
            Ok("handshakeTest")
        );
    }
    let diag = client
        .database("admin")
        .run_command(doc! { "labClientMetadata": 1 })
        .await
        .unwrap();
    assert_eq!(
        diag.get_array("metadata").unwrap().len(),
        emu.client_metadata().len()
    );

    let err = client
        .database("admin")
        .run_command(doc! { "frobnicate": 1 })
        .await
        .unwrap_err();
    match *err.kind {
        mongodb::error::ErrorKind::Command(ref c) => {
            assert_eq!(c.code, 59);
            assert_eq!(c.code_name, "CommandNotFound");
            assert_eq!(c.message, "no such command: 'frobnicate'");
        }
        ref other => panic!("unexpected error {other:?}"),
    }
    drop(client);
    emu.shutdown().await;
}

#[tokio::test]
async fn parameters_round_trip() {
    let emu = common::start(common::rs(1)).await;
    let (client, _) = common::client(&emu.uri()).await;
    let admin = client.database("admin");
    let all = admin
        .run_command(doc! { "getParameter": "*" })
        .await
        .unwrap();
    assert_eq!(all.get_i32("externalClientBaseBackoffMS"), Ok(0));
    let r = admin
        .run_command(doc! { "setParameter": 1, "externalClientBaseBackoffMS": 50 })
        .await
        .unwrap();
    assert_eq!(r.get_i32("was"), Ok(0));
    let one = admin
        .run_command(doc! { "getParameter": 1, "externalClientBaseBackoffMS": 1 })
        .await
        .unwrap();
    assert_eq!(one.get_i32("externalClientBaseBackoffMS"), Ok(50));
    assert!(admin
        .run_command(doc! { "setParameter": 1, "externalClientBaseBackoffMS": "x" })
        .await
        .is_err());
    assert!(admin
        .run_command(doc! { "setParameter": 1, "noSuchParameter": 1 })
        .await
        .is_err());
    let status = admin.run_command(doc! { "serverStatus": 1 }).await.unwrap();
    assert!(status.get_document("connections").is_ok());
    emu.shutdown().await;
}

#[tokio::test]
async fn awaitable_hello_waits_and_streams_in_exhaust_mode() {
    use tokio::io::AsyncWriteExt;
    let emu = common::start(common::rs(1)).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let first = raw
        .command(&doc! { "hello": 1, "$db": "admin" })
        .await
        .unwrap();
    let tv = first.get_document("topologyVersion").unwrap().clone();

    // Without exhaustAllowed: one reply after maxAwaitTimeMS.
    let t = std::time::Instant::now();
    let r = raw
        .command(&doc! { "hello": 1, "topologyVersion": tv.clone(), "maxAwaitTimeMS": 100i64, "$db": "admin" })
        .await
        .unwrap();
    assert!(t.elapsed() >= std::time::Duration::from_millis(100));
    assert_eq!(r.get_document("topologyVersion").unwrap(), &tv);

    // With exhaustAllowed: replies keep coming with moreToCome, each answering the previous one.
    let body = doc! { "hello": 1, "topologyVersion": tv, "maxAwaitTimeMS": 50i64, "$db": "admin" };
    let bytes =
        emulator::wire::encode_op_msg(77, 0, emulator::wire::FLAG_EXHAUST_ALLOWED, &body).unwrap();
    raw.stream.write_all(&bytes).await.unwrap();
    let mut expected_response_to = 77;
    for _ in 0..3 {
        let msg = emulator::wire::read_message(&mut raw.stream)
            .await
            .unwrap()
            .unwrap();
        assert!(msg.more_to_come());
        assert_eq!(msg.header.response_to, expected_response_to);
        assert_eq!(msg.body.get_f64("ok"), Ok(1.0));
        expected_response_to = msg.header.request_id;
    }
    drop(raw);
    emu.shutdown().await;
}
