//! Bad frames close only the connection that sent them.

mod common;

use bson::doc;
use emulator::wire::{Header, OP_COMPRESSED, OP_MSG, OP_QUERY};
use emulator::Topology;

fn frame(op_code: i32, payload: &[u8], declared: Option<i32>) -> Vec<u8> {
    let mut out = Vec::new();
    let len = declared.unwrap_or(16 + payload.len() as i32);
    Header {
        message_length: len,
        request_id: 1,
        response_to: 0,
        op_code,
    }
    .write_to(&mut out);
    out.extend_from_slice(payload);
    out
}

#[tokio::test]
async fn malformed_frames_close_only_that_connection() {
    let emu = common::start(Topology::Standalone).await;
    let addr = emu.addresses()[0];
    let mut healthy = common::RawClient::connect(addr).await;
    assert!(healthy
        .command(&doc! { "ping": 1, "$db": "admin" })
        .await
        .is_some());

    let mut bson_bytes = Vec::new();
    doc! { "ping": "x" }.to_writer(&mut bson_bytes).unwrap();
    bson_bytes[10] = 0x7f; // string length runs past the document
    let mut bad_bson = vec![0, 0, 0, 0, 0];
    bad_bson.extend_from_slice(&bson_bytes);

    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("length below header", frame(OP_MSG, &[], Some(5))),
        ("negative length", frame(OP_MSG, &[], Some(-1))),
        ("oversized", frame(OP_MSG, &[], Some(48_000_001))),
        // An OP_QUERY is decoded (the legacy handshake), but this one's query document
        // declares a length of 0.
        (
            "OP_QUERY with an invalid query",
            frame(OP_QUERY, &[0; 20], None),
        ),
        (
            "OP_QUERY with an unterminated namespace",
            frame(OP_QUERY, &[0, 0, 0, 0, b'a', b'b'], None),
        ),
        ("OP_COMPRESSED", frame(OP_COMPRESSED, &[0; 20], None)),
        ("unknown opcode", frame(1234, &[0; 20], None)),
        ("invalid BSON", frame(OP_MSG, &bad_bson, None)),
        ("no sections", frame(OP_MSG, &[0, 0, 0, 0], None)),
        (
            "unknown section kind",
            frame(OP_MSG, &[0, 0, 0, 0, 7, 5, 0, 0, 0, 0], None),
        ),
    ];
    for (what, bytes) in cases {
        let mut c = common::RawClient::connect(addr).await;
        c.send_raw(&bytes).await;
        assert!(
            c.closed_by_server().await,
            "{what}: connection should be closed"
        );
    }
    // A frame cut short: the client sends half a message and closes its side.
    let mut c = common::RawClient::connect(addr).await;
    let full = emulator::wire::encode_op_msg(1, 0, 0, &doc! { "ping": 1, "$db": "admin" }).unwrap();
    c.send_raw(&full[..full.len() / 2]).await;
    c.stream.shutdown_for_test().await;
    assert!(c.closed_by_server().await);

    // Missing $db is a command error, not a protocol error.
    let r = healthy.command(&doc! { "ping": 1 }).await.unwrap();
    assert_eq!(r.get_i32("code"), Ok(40414));
    let r = healthy
        .command(&doc! { "ping": 1, "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok"), Ok(1.0));
    emu.shutdown().await;
}

trait ShutdownWrite {
    async fn shutdown_for_test(&mut self);
}

impl ShutdownWrite for tokio::net::TcpStream {
    async fn shutdown_for_test(&mut self) {
        use tokio::io::AsyncWriteExt;
        let _ = self.shutdown().await;
    }
}
