//! Int64 `_id`s above 2^53, where a double can no longer tell neighbouring integers apart, are
//! distinct documents to the `_id_` index, to queries and to transaction write conflicts.

mod common;

use bson::{doc, spec::BinarySubtype, Binary, Bson, Document};

const TWO_53: i64 = 9_007_199_254_740_992;

fn lsid(byte: u8) -> Document {
    doc! { "id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![byte; 16] } }
}

/// The documents `find` returns for `filter` in db.c.
async fn find(raw: &mut common::RawClient, filter: Document) -> Vec<Document> {
    let reply = raw
        .command(&doc! { "find": "c", "filter": filter, "$db": "db" })
        .await
        .expect("find replies");
    reply
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .unwrap_or_else(|e| panic!("{e}: {reply}"))
        .iter()
        .filter_map(|d| d.as_document().cloned())
        .collect()
}

#[tokio::test]
async fn neighbouring_int64_ids_above_2_pow_53_are_separate_documents() {
    let emu = common::start(common::rs(1)).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    for (id, name) in [(TWO_53 + 1, "odd"), (TWO_53, "even")] {
        let r = raw
            .command(
                &doc! { "insert": "c", "documents": [{ "_id": id, "name": name }], "$db": "db" },
            )
            .await
            .expect("insert replies");
        assert_eq!(r.get_i32("n"), Ok(1), "insert {id}: {r}");
        assert!(r.get_array("writeErrors").is_err(), "insert {id}: {r}");
    }
    for (id, name) in [(TWO_53 + 1, "odd"), (TWO_53, "even")] {
        let found = find(&mut raw, doc! { "_id": id }).await;
        assert_eq!(found.len(), 1, "{id}: {found:?}");
        assert_eq!(found[0].get_str("name"), Ok(name), "{id}: {found:?}");
    }
    // A double equal to 2^53 is the same _id as the int64 2^53, as in mongod.
    let found = find(&mut raw, doc! { "_id": TWO_53 as f64 }).await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].get_str("name"), Ok("even"));
    emu.shutdown().await;
}

#[tokio::test]
async fn transactions_changing_neighbouring_large_ids_do_not_conflict() {
    let emu = common::start(common::rs(1)).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let r = raw
        .command(&doc! {
            "insert": "c", "documents": [{ "_id": TWO_53 + 1 }, { "_id": TWO_53 }], "$db": "db",
        })
        .await
        .expect("insert replies");
    assert_eq!(r.get_i32("n"), Ok(2), "{r}");
    // Two open transactions, each updating a different one of the two documents.
    for (session, id) in [(1u8, TWO_53 + 1), (2, TWO_53)] {
        let r = raw
            .command(&doc! {
                "update": "c", "updates": [{ "q": { "_id": id }, "u": { "$set": { "by": i32::from(session) } } }],
                "$db": "db", "lsid": lsid(session), "txnNumber": 1i64, "startTransaction": true,
                "autocommit": false,
            })
            .await
            .expect("update replies");
        assert_eq!(r.get_f64("ok"), Ok(1.0), "session {session}: {r}");
        assert_eq!(r.get_i32("nModified"), Ok(1), "session {session}: {r}");
    }
    for session in [1u8, 2] {
        let r = raw
            .command(&doc! {
                "commitTransaction": 1, "$db": "admin", "lsid": lsid(session), "txnNumber": 1i64,
                "autocommit": false,
            })
            .await
            .expect("commit replies");
        assert_eq!(r.get_f64("ok"), Ok(1.0), "session {session}: {r}");
    }
    for (id, by) in [(TWO_53 + 1, 1), (TWO_53, 2)] {
        let found = find(&mut raw, doc! { "_id": id }).await;
        assert_eq!(found.len(), 1, "{id}: {found:?}");
        assert_eq!(
            found[0].get("by"),
            Some(&Bson::Int32(by)),
            "{id}: {found:?}"
        );
    }
    emu.shutdown().await;
}
