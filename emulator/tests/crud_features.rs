//! The CRUD features the official crud suite relies on, at the command level: views read
//! through their pipeline and refuse writes, collations per command and per statement, `let`
//! variables, document validation and its bypass.

mod common;

use bson::{doc, Bson, Document};

async fn run(raw: &mut common::RawClient, body: Document) -> Document {
    let mut body = body;
    body.insert("$db", "db");
    raw.command(&body).await.expect("the server replies")
}

/// The documents of a reply's first batch.
fn batch(reply: &Document) -> Vec<Document> {
    reply
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .unwrap_or_else(|e| panic!("{e}: {reply}"))
        .iter()
        .filter_map(|d| d.as_document().cloned())
        .collect()
}

async fn seeded() -> (emulator::Emulator, common::RawClient) {
    let emu = common::start(common::rs(1)).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let docs = vec![
        doc! { "_id": 1, "x": "ping", "n": 1 },
        doc! { "_id": 2, "x": "PING", "n": 2 },
        doc! { "_id": 3, "x": "pong", "n": 3 },
    ];
    let r = run(&mut raw, doc! { "insert": "c", "documents": docs }).await;
    assert_eq!(r.get_i32("n"), Ok(3), "{r}");
    (emu, raw)
}

#[tokio::test]
async fn views_read_through_their_pipeline_and_refuse_writes() {
    let (_emu, mut raw) = seeded().await;
    let r = run(
        &mut raw,
        doc! { "create": "v", "viewOn": "c", "pipeline": [{ "$match": { "n": { "$gte": 2 } } }] },
    )
    .await;
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    let r = run(&mut raw, doc! { "count": "v" }).await;
    assert_eq!(r.get_i32("n"), Ok(2), "{r}");
    let r = run(
        &mut raw,
        doc! { "find": "v", "filter": { "x": "pong" }, "projection": { "_id": 1 } },
    )
    .await;
    assert_eq!(batch(&r), vec![doc! { "_id": 3 }], "{r}");
    let r = run(&mut raw, doc! { "distinct": "v", "key": "x" }).await;
    assert_eq!(
        r.get_array("values").cloned(),
        Ok(vec![Bson::from("PING"), Bson::from("pong")]),
        "{r}"
    );
    let r = run(
        &mut raw,
        doc! { "aggregate": "v", "pipeline": [{ "$count": "k" }], "cursor": {} },
    )
    .await;
    assert_eq!(batch(&r), vec![doc! { "k": 2 }], "{r}");
    for write in [
        doc! { "insert": "v", "documents": [{ "_id": 9 }] },
        doc! { "update": "v", "updates": [{ "q": {}, "u": { "$set": { "y": 1 } } }] },
        doc! { "delete": "v", "deletes": [{ "q": {}, "limit": 0 }] },
        doc! { "createIndexes": "v", "indexes": [{ "key": { "y": 1 }, "name": "y_1" }] },
    ] {
        let r = run(&mut raw, write.clone()).await;
        assert_eq!(r.get_i32("code"), Ok(166), "{write}: {r}");
        assert_eq!(
            r.get_str("errmsg"),
            Ok("Namespace db.v is a view, not a collection"),
            "{r}"
        );
    }
    let r = run(
        &mut raw,
        doc! { "listCollections": 1, "filter": { "name": "v" } },
    )
    .await;
    assert_eq!(batch(&r)[0].get_str("type"), Ok("view"), "{r}");
}

#[tokio::test]
async fn collations_apply_per_command_and_per_statement() {
    let (_emu, mut raw) = seeded().await;
    let ci = doc! { "locale": "en_US", "strength": 2 };
    let r = run(&mut raw, doc! { "find": "c", "filter": { "x": "Ping" } }).await;
    assert!(batch(&r).is_empty(), "{r}");
    let r = run(
        &mut raw,
        doc! { "find": "c", "filter": { "x": "Ping" }, "collation": ci.clone() },
    )
    .await;
    assert_eq!(batch(&r).len(), 2, "{r}");
    // Two statements: only the second is case-insensitive.
    let r = run(
        &mut raw,
        doc! { "update": "c", "updates": [
            { "q": { "x": "PONG" }, "u": { "$set": { "a": 1 } }, "multi": true },
            { "q": { "x": "PING" }, "u": { "$set": { "b": 1 } }, "multi": true, "collation": ci.clone() },
        ] },
    )
    .await;
    assert_eq!(
        (r.get_i32("n"), r.get_i32("nModified")),
        (Ok(2), Ok(2)),
        "{r}"
    );
    let r = run(
        &mut raw,
        doc! { "delete": "c", "deletes": [{ "q": { "x": "PONG" }, "limit": 1, "collation": ci.clone() }] },
    )
    .await;
    assert_eq!(r.get_i32("n"), Ok(1), "{r}");
    let r = run(
        &mut raw,
        doc! { "create": "v", "viewOn": "c", "collation": ci },
    )
    .await;
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    // The view's collation is its reads' default.
    let r = run(&mut raw, doc! { "count": "v", "query": { "x": "ping" } }).await;
    assert_eq!(r.get_i32("n"), Ok(2), "{r}");
    let r = run(
        &mut raw,
        doc! { "find": "c", "filter": {}, "collation": { "locale": "en", "strength": 0 } },
    )
    .await;
    assert_eq!(r.get_i32("code"), Ok(2), "{r}");
}

#[tokio::test]
async fn a_collection_default_collation_applies_unless_a_command_names_one() {
    let emu = common::start(common::rs(1)).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let r = run(
        &mut raw,
        doc! { "create": "ci", "collation": { "locale": "en", "strength": 2 } },
    )
    .await;
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    let docs = vec![doc! { "_id": 1, "x": "a" }, doc! { "_id": 2, "x": "A" }];
    run(&mut raw, doc! { "insert": "ci", "documents": docs }).await;
    let r = run(&mut raw, doc! { "find": "ci", "filter": { "x": "a" } }).await;
    assert_eq!(batch(&r).len(), 2, "{r}");
    let simple = doc! { "locale": "simple" };
    let r = run(
        &mut raw,
        doc! { "find": "ci", "filter": { "x": "a" }, "collation": simple.clone() },
    )
    .await;
    assert_eq!(batch(&r).len(), 1, "{r}");
    let r = run(
        &mut raw,
        doc! { "update": "ci", "updates": [
            { "q": { "x": "a" }, "u": { "$set": { "y": 1 } }, "multi": true },
            { "q": { "x": "a" }, "u": { "$set": { "z": 1 } }, "multi": true, "collation": simple },
        ] },
    )
    .await;
    assert_eq!(r.get_i32("n"), Ok(3), "{r}");
}

#[tokio::test]
async fn let_variables_resolve_in_queries_and_updates() {
    let (_emu, mut raw) = seeded().await;
    let r = run(
        &mut raw,
        doc! { "find": "c", "filter": { "$expr": { "$eq": ["$n", "$$wanted"] } }, "let": { "wanted": 2 } },
    )
    .await;
    assert_eq!(batch(&r).len(), 1, "{r}");
    let r = run(
        &mut raw,
        doc! { "update": "c", "updates": [{ "q": { "$expr": { "$eq": ["$_id", "$$id"] } }, "u": [{ "$set": { "y": "$$v" } }] }], "let": { "id": 1, "v": "set" } },
    )
    .await;
    assert_eq!(r.get_i32("nModified"), Ok(1), "{r}");
    let r = run(&mut raw, doc! { "find": "c", "filter": { "y": "set" } }).await;
    assert_eq!(batch(&r).len(), 1, "{r}");
    let r = run(
        &mut raw,
        doc! { "find": "c", "filter": { "$expr": "$$missing" } },
    )
    .await;
    assert_eq!(r.get_i32("code"), Ok(17276), "{r}");
}

#[tokio::test]
async fn validation_failures_carry_err_info_and_bypass_skips_them() {
    let (_emu, mut raw) = seeded().await;
    let r = run(
        &mut raw,
        doc! { "collMod": "c", "validator": { "n": { "$type": "int" } } },
    )
    .await;
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    let r = run(
        &mut raw,
        doc! { "insert": "c", "documents": [{ "_id": 7, "n": "seven" }] },
    )
    .await;
    let errors = r
        .get_array("writeErrors")
        .unwrap_or_else(|e| panic!("{e}: {r}"));
    let first = errors[0].as_document().expect("a write error document");
    assert_eq!(first.get_i32("code"), Ok(121), "{r}");
    let info = first.get_document("errInfo").expect("errInfo");
    assert_eq!(info.get_i32("failingDocumentId"), Ok(7), "{r}");
    let r = run(
        &mut raw,
        doc! { "findAndModify": "c", "query": { "_id": 1 }, "update": { "$set": { "n": "one" } } },
    )
    .await;
    assert_eq!(r.get_i32("code"), Ok(121), "{r}");
    assert!(r.get_document("errInfo").is_ok(), "{r}");
    let r = run(
        &mut raw,
        doc! { "insert": "c", "documents": [{ "_id": 7, "n": "seven" }], "bypassDocumentValidation": true },
    )
    .await;
    assert_eq!(r.get_i32("n"), Ok(1), "{r}");
}
