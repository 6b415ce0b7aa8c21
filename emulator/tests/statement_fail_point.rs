//! `onPrimaryTransactionalWrite` counts statements (documents, updates, deletes), not commands,
//! as mongod does; `failBeforeCommitExceptionCode` fails the statement it fires on with a write
//! error at that statement's index, and a retry applies only the statements not yet applied.

mod common;

use bson::{doc, Bson, Document};
use common::RawClient;

async fn fail_point(c: &mut RawClient, mode: Bson, data: Document) -> Document {
    let r = c
        .command(&doc! {
            "configureFailPoint": "onPrimaryTransactionalWrite",
            "mode": mode,
            "data": data,
            "$db": "admin",
        })
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    r
}

fn error_indexes(reply: &Document) -> Vec<(i32, i32)> {
    reply
        .get_array("writeErrors")
        .map(|a| {
            a.iter()
                .filter_map(Bson::as_document)
                .map(|e| (e.get_i32("index").unwrap(), e.get_i32("code").unwrap()))
                .collect()
        })
        .unwrap_or_default()
}

async fn count(c: &mut RawClient, filter: Document) -> i32 {
    let r = c
        .command(&doc! { "count": "c", "query": filter, "$db": "db" })
        .await
        .unwrap();
    r.get_i32("n").unwrap()
}

#[tokio::test]
async fn skip_counts_documents_and_a_retry_applies_the_rest_once() {
    let emu = common::start(common::rs(1)).await;
    let mut c = RawClient::connect(emu.addresses()[0]).await;
    let lsid = doc! { "id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] } };
    fail_point(
        &mut c,
        doc! { "skip": 3 }.into(),
        doc! { "closeConnection": false, "failBeforeCommitExceptionCode": 1 },
    )
    .await;
    let insert = doc! {
        "insert": "c",
        "documents": (0..5).map(|i| Bson::Document(doc! { "_id": i })).collect::<Vec<_>>(),
        "ordered": true,
        "lsid": lsid.clone(),
        "txnNumber": 1i64,
        "$db": "db",
    };
    let r = c.command(&insert).await.unwrap();
    assert_eq!(r.get_i32("n"), Ok(3), "{r}");
    assert_eq!(error_indexes(&r), [(3, 1)], "the 4th document fails: {r}");
    assert_eq!(count(&mut c, doc! {}).await, 3);
    // The fail point fired once: an ordered insert stops at the failed document.
    let off = fail_point(&mut c, "off".into(), doc! {}).await;
    assert_eq!(off.get_i64("count"), Ok(1), "{off}");
    // The retry (same txnNumber) applies documents 3 and 4 only: no duplicate key errors.
    let r = c.command(&insert).await.unwrap();
    assert_eq!(r.get_i32("n"), Ok(5), "{r}");
    assert!(!r.contains_key("writeErrors"), "{r}");
    assert_eq!(count(&mut c, doc! {}).await, 5);
    // Once complete, a further retry is answered from the record.
    let r = c.command(&insert).await.unwrap();
    assert_eq!(r.get_i32("n"), Ok(5), "{r}");
    emu.shutdown().await;
}

#[tokio::test]
async fn updates_fail_at_their_statement_and_are_not_applied_twice() {
    // mongod's own test of this fail point: two updates, skip 1, InternalError.
    let emu = common::start(common::rs(1)).await;
    let mut c = RawClient::connect(emu.addresses()[0]).await;
    let r = c
        .command(&doc! { "insert": "c", "documents": [{ "_id": 0, "x": 0 }, { "_id": 1, "x": 1 }], "$db": "db" })
        .await
        .unwrap();
    assert_eq!(r.get_i32("n"), Ok(2));
    let lsid = doc! { "id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![8; 16] } };
    fail_point(
        &mut c,
        doc! { "skip": 1 }.into(),
        doc! { "closeConnection": false, "failBeforeCommitExceptionCode": 1 },
    )
    .await;
    let update = doc! {
        "update": "c",
        "updates": [
            { "q": { "x": 0 }, "u": { "$inc": { "y": 1 } } },
            { "q": { "x": 1 }, "u": { "$inc": { "y": 1 } } },
        ],
        "ordered": true,
        "lsid": lsid,
        "txnNumber": 2i64,
        "$db": "db",
    };
    let r = c.command(&update).await.unwrap();
    assert_eq!(r.get_i32("nModified"), Ok(1), "{r}");
    assert_eq!(error_indexes(&r), [(1, 1)], "{r}");
    fail_point(&mut c, "off".into(), doc! {}).await;
    let r = c.command(&update).await.unwrap();
    assert_eq!(r.get_i32("nModified"), Ok(2), "{r}");
    assert_eq!(
        count(&mut c, doc! { "y": 1 }).await,
        2,
        "each update applied once"
    );
    emu.shutdown().await;
}

#[tokio::test]
async fn unordered_statements_after_the_skip_all_fail() {
    let emu = common::start(common::rs(1)).await;
    let mut c = RawClient::connect(emu.addresses()[0]).await;
    let lsid = doc! { "id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![9; 16] } };
    fail_point(
        &mut c,
        doc! { "skip": 1 }.into(),
        doc! { "closeConnection": false, "failBeforeCommitExceptionCode": 11600 },
    )
    .await;
    let r = c
        .command(&doc! {
            "insert": "c",
            "documents": [{ "_id": "a" }, { "_id": "b" }, { "_id": "c" }],
            "ordered": false,
            "lsid": lsid,
            "txnNumber": 1i64,
            "$db": "db",
        })
        .await
        .unwrap();
    assert_eq!(r.get_i32("n"), Ok(1), "{r}");
    assert_eq!(error_indexes(&r), [(1, 11600), (2, 11600)], "{r}");
    let off = fail_point(&mut c, "off".into(), doc! {}).await;
    assert_eq!(off.get_i64("count"), Ok(2), "{off}");
    emu.shutdown().await;
}
