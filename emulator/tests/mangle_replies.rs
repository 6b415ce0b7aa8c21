//! `labMangleReplies` over the wire, without a driver: configuration through setParameter (and
//! its refusals), getParameter's counters, document and frame damage as a raw client sees them,
//! the command and application filters, and the comment log.

mod common;

use std::time::Duration;

use bson::{doc, Bson, Document};
use common::{start, RawClient};
use emulator::server::mangle::{MangleKind, Verdict};
use emulator::Topology;

fn set(config: Document) -> Document {
    doc! { "setParameter": 1, "labMangleReplies": config, "$db": "admin" }
}

fn ok(reply: &Document) -> bool {
    matches!(reply.get("ok"), Some(Bson::Double(x)) if *x == 1.0)
}

#[tokio::test]
async fn bad_configurations_are_refused_naming_the_parameter() {
    let emu = start(Topology::Standalone).await;
    let mut c = RawClient::connect(emu.addresses()[0]).await;
    for bad in [
        doc! { "share": 2.0 },
        doc! { "kinds": ["noSuchKind"] },
        doc! { "seeed": 1 },
        doc! { "appName": 5 },
    ] {
        let reply = c.command(&set(bad.clone())).await.expect("reply");
        assert!(!ok(&reply), "{bad} accepted: {reply}");
        let message = reply.get_str("errmsg").unwrap_or_default();
        assert!(message.contains("invalid labMangleReplies"), "{message}");
    }
    let reply = c
        .command(&doc! { "setParameter": 1, "labMangleReplies": 1, "$db": "admin" })
        .await
        .expect("reply");
    assert!(!ok(&reply), "a non-document is refused: {reply}");
    emu.shutdown().await;
}

#[tokio::test]
async fn document_damage_counters_filters_and_log() {
    let emu = start(Topology::Standalone).await;
    let mut c = RawClient::connect(emu.addresses()[0]).await;
    let reply = c
        .command(&set(doc! {
            "seed": 4, "share": 1.0, "kinds": ["okOddType"], "commands": ["ping"], "log": true,
        }))
        .await
        .expect("reply");
    assert!(ok(&reply), "{reply}");
    assert_eq!(reply.get_document("was").map(Document::is_empty), Ok(true));

    // ping qualifies and is damaged; buildInfo is not in `commands`.
    let ping = c
        .command(&doc! { "ping": 1, "comment": "op-1", "$db": "admin" })
        .await
        .expect("a document-damaged reply still arrives");
    assert!(!ok(&ping), "ok was damaged: {ping}");
    let build_info = c
        .command(&doc! { "buildInfo": 1, "$db": "admin" })
        .await
        .expect("reply");
    assert!(ok(&build_info), "{build_info}");

    let param = c
        .command(&doc! { "getParameter": 1, "labMangleReplies": 1, "$db": "admin" })
        .await
        .expect("reply");
    let shown = param.get_document("labMangleReplies").expect("shown");
    assert_eq!(shown.get_array("kinds").map(Vec::len), Ok(1));
    let counters = shown.get_document("counters").expect("counters");
    assert_eq!(counters.get_i64("qualifying"), Ok(1));
    assert_eq!(counters.get_i64("mangled"), Ok(1));

    let log = emu.take_reply_mangling_log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].comment, "op-1");
    assert_eq!(log[0].kind, Some(MangleKind::OkOddType));
    assert_eq!(log[0].verdict, Verdict::MustFail);

    // An application-name filter leaves this connection (no handshake) alone.
    c.command(&set(
        doc! { "share": 1.0, "kinds": ["okOddType"], "appName": "someone-else" },
    ))
    .await
    .expect("reply");
    let ping = c
        .command(&doc! { "ping": 1, "$db": "admin" })
        .await
        .expect("reply");
    assert!(ok(&ping), "{ping}");

    // `{}` turns it off and reports the previous configuration.
    let off = c.command(&set(doc! {})).await.expect("reply");
    assert_eq!(
        off.get_document("was").and_then(|w| w.get_str("appName")),
        Ok("someone-else")
    );
    emu.shutdown().await;
}

#[tokio::test]
async fn frame_damage_closes_the_connection_and_a_stall_sends_nothing_more() {
    let emu = start(Topology::Standalone).await;
    let mut control = RawClient::connect(emu.addresses()[0]).await;
    control
        .command(&set(
            doc! { "share": 1.0, "kinds": ["truncated"], "commands": ["ping"] },
        ))
        .await
        .expect("reply");
    let mut c = RawClient::connect(emu.addresses()[0]).await;
    assert_eq!(
        c.command(&doc! { "ping": 1, "$db": "admin" }).await,
        None,
        "a truncated frame cannot be read"
    );
    assert!(c.closed_by_server().await);

    control
        .command(&set(
            doc! { "share": 1.0, "kinds": ["stall"], "commands": ["ping"] },
        ))
        .await
        .expect("reply");
    let mut c = RawClient::connect(emu.addresses()[0]).await;
    let bytes = emulator::wire::encode_op_msg(1, 0, 0, &doc! { "ping": 1, "$db": "admin" })
        .expect("encodes");
    c.send_raw(&bytes).await;
    let read = tokio::time::timeout(
        Duration::from_millis(500),
        emulator::wire::read_message(&mut c.stream),
    )
    .await;
    assert!(read.is_err(), "a stalled reply never completes: {read:?}");
    // The stalled connection serves nothing more, but the server does.
    control.command(&set(doc! {})).await.expect("reply");
    let ping = control
        .command(&doc! { "ping": 1, "$db": "admin" })
        .await
        .expect("reply");
    assert!(ok(&ping));
    assert_eq!(emu.reply_mangling_report().mangled(), 2);
    emu.shutdown().await;
}
