//! Behaviour of mongod that upstream's own driver test suite relies on and that the emulator
//! lacked (found by `cargo xtask upstream-tests`, docs/upstream-tests.md): the system databases
//! in listDatabases, `$strLenBytes`, and a client bulkWrite's first batch bounded by the reply
//! size.

mod common;

use bson::{doc, Bson, Document};

async fn run(raw: &mut common::RawClient, db: &str, body: Document) -> Document {
    let mut body = body;
    body.insert("$db", db);
    raw.command(&body).await.expect("the server replies")
}

#[tokio::test]
async fn list_databases_names_admin_and_config_from_the_start() {
    let emu = common::start(common::rs(1)).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let r = run(
        &mut raw,
        "admin",
        doc! { "listDatabases": 1, "nameOnly": true },
    )
    .await;
    let names: Vec<&str> = r
        .get_array("databases")
        .unwrap()
        .iter()
        .filter_map(|d| d.as_document()?.get_str("name").ok())
        .collect();
    assert_eq!(names, vec!["admin", "config"], "{r}");

    let w = run(
        &mut raw,
        "db",
        doc! { "insert": "c", "documents": [{ "_id": 1 }] },
    )
    .await;
    assert_eq!(w.get_i32("n"), Ok(1), "{w}");
    let r = run(&mut raw, "admin", doc! { "listDatabases": 1 }).await;
    let names: Vec<&str> = r
        .get_array("databases")
        .unwrap()
        .iter()
        .filter_map(|d| d.as_document()?.get_str("name").ok())
        .collect();
    assert_eq!(names, vec!["admin", "config", "db"], "{r}");
    let filtered = run(
        &mut raw,
        "admin",
        doc! { "listDatabases": 1, "filter": { "name": { "$ne": "config" } } },
    )
    .await;
    assert_eq!(
        filtered.get_array("databases").unwrap().len(),
        2,
        "{filtered}"
    );
}

#[tokio::test]
async fn str_len_bytes_counts_utf8_bytes_and_refuses_non_strings() {
    let emu = common::start(common::rs(1)).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let w = run(
        &mut raw,
        "db",
        doc! { "insert": "c", "documents": [{ "_id": 1, "s": "héllo", "n": 5 }] },
    )
    .await;
    assert_eq!(w.get_i32("n"), Ok(1), "{w}");
    let r = run(
        &mut raw,
        "db",
        doc! {
            "aggregate": "c",
            "pipeline": [{ "$project": { "b": { "$strLenBytes": "$s" }, "cp": { "$strLenCP": "$s" } } }],
            "cursor": {},
        },
    )
    .await;
    let first = r
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .unwrap_or_else(|e| panic!("{e}: {r}"));
    let d = first[0].as_document().unwrap();
    assert_eq!(d.get_i32("b"), Ok(6), "é is two bytes: {d}");
    assert_eq!(d.get_i32("cp"), Ok(5), "{d}");

    let err = run(
        &mut raw,
        "db",
        doc! {
            "aggregate": "c",
            "pipeline": [{ "$project": { "b": { "$strLenBytes": "$n" } } }],
            "cursor": {},
        },
    )
    .await;
    assert_eq!(err.get_i32("code"), Ok(34473), "{err}");
    assert!(
        err.get_str("errmsg")
            .unwrap()
            .starts_with("$strLenBytes requires a string argument, found: "),
        "{err}"
    );
}

#[tokio::test]
async fn bulk_write_results_beyond_one_reply_wait_for_get_more() {
    let emu = common::start(common::rs(1)).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    // Two upserts whose _id is each half the largest document: their results (which carry the
    // upserted _id) do not fit in one 16 MiB reply together.
    let half = 16 * 1024 * 1024 / 2;
    let ops: Vec<Bson> = ["a", "b"]
        .iter()
        .map(|c| {
            Bson::Document(doc! {
                "update": 0,
                "filter": { "_id": c.repeat(half) },
                "updateMods": { "$set": { "x": 1 } },
                "upsert": true,
                "multi": false,
            })
        })
        .collect();
    let r = run(
        &mut raw,
        "admin",
        doc! {
            "bulkWrite": 1,
            "ops": ops,
            "nsInfo": [{ "ns": "db.c" }],
            "errorsOnly": false,
        },
    )
    .await;
    assert_eq!(
        r.get_f64("ok"),
        Ok(1.0),
        "{}",
        r.get_str("errmsg").unwrap_or("")
    );
    assert_eq!(r.get_i32("nUpserted"), Ok(2));
    let cursor = r.get_document("cursor").unwrap();
    assert_eq!(cursor.get_array("firstBatch").unwrap().len(), 1);
    let id = cursor.get_i64("id").unwrap();
    assert_ne!(id, 0, "the second result waits for getMore");
    let more = run(
        &mut raw,
        "admin",
        doc! { "getMore": id, "collection": "$cmd.bulkWrite" },
    )
    .await;
    let cursor = more.get_document("cursor").unwrap();
    assert_eq!(cursor.get_array("nextBatch").unwrap().len(), 1);
    assert_eq!(cursor.get_i64("id"), Ok(0));

    // Small results stay in the first reply, with no cursor to continue.
    let r = run(
        &mut raw,
        "admin",
        doc! {
            "bulkWrite": 1,
            "ops": [{ "insert": 0, "document": { "_id": 7 } }],
            "nsInfo": [{ "ns": "db.c" }],
        },
    )
    .await;
    let cursor = r.get_document("cursor").unwrap();
    assert_eq!(cursor.get_i64("id"), Ok(0), "{r}");
}

#[tokio::test]
async fn current_op_lists_the_running_command_with_its_client_metadata() {
    let emu = common::start(common::rs(1)).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let hello = run(
        &mut raw,
        "admin",
        doc! {
            "hello": 1,
            "client": {
                "driver": { "name": "labtest", "version": "1.0" },
                "application": { "name": "currentOpApp" },
                "os": { "type": "linux" },
            },
        },
    )
    .await;
    assert_eq!(hello.get_f64("ok"), Ok(1.0), "{hello}");

    // What upstream's metadata test sends: the filter selects the currentOp command itself.
    let r = run(
        &mut raw,
        "admin",
        doc! { "currentOp": 1, "command.currentOp": { "$exists": true } },
    )
    .await;
    let inprog = r.get_array("inprog").unwrap_or_else(|e| panic!("{e}: {r}"));
    assert_eq!(inprog.len(), 1, "{r}");
    let op = inprog[0].as_document().unwrap();
    assert_eq!(
        op.get_document("clientMetadata")
            .unwrap()
            .get_document("driver")
            .unwrap()
            .get_str("name"),
        Ok("labtest")
    );
    assert_eq!(op.get_str("appName"), Ok("currentOpApp"));
    assert_eq!(op.get_bool("active"), Ok(true));

    let none = run(
        &mut raw,
        "admin",
        doc! { "currentOp": 1, "command.find": { "$exists": true } },
    )
    .await;
    assert!(none.get_array("inprog").unwrap().is_empty(), "{none}");
    let elsewhere = run(&mut raw, "db", doc! { "currentOp": 1 }).await;
    assert_eq!(elsewhere.get_i32("code"), Ok(13), "{elsewhere}");

    // The aggregation stage, as upstream's db_aggregate test uses it.
    let r = run(
        &mut raw,
        "admin",
        doc! {
            "aggregate": 1,
            "pipeline": [
                { "$currentOp": { "allUsers": false, "idleConnections": false } },
                { "$match": { "active": true } },
                { "$project": { "command": 1 } },
            ],
            "cursor": {},
        },
    )
    .await;
    let first = r
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .unwrap_or_else(|e| panic!("{e}: {r}"));
    assert_eq!(first.len(), 1, "{r}");
    assert!(first[0]
        .as_document()
        .unwrap()
        .get_document("command")
        .unwrap()
        .contains_key("aggregate"));
    let misplaced = run(
        &mut raw,
        "db",
        doc! { "aggregate": "c", "pipeline": [{ "$currentOp": {} }], "cursor": {} },
    )
    .await;
    assert_eq!(misplaced.get_i32("code"), Ok(73), "{misplaced}");
}

#[tokio::test]
async fn coll_stats_the_command_reports_the_storage_statistics() {
    let emu = common::start(common::rs(1)).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let w = run(
        &mut raw,
        "db",
        doc! { "insert": "c", "documents": [{ "_id": 1 }, { "_id": 2 }] },
    )
    .await;
    assert_eq!(w.get_i32("n"), Ok(2), "{w}");
    let r = run(&mut raw, "db", doc! { "collStats": "c" }).await;
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    assert_eq!(r.get_str("ns"), Ok("db.c"));
    assert_eq!(r.get_i64("count"), Ok(2), "{r}");
    assert!(r.get_i64("size").unwrap() > 0, "{r}");
    assert_eq!(r.get_i32("nindexes"), Ok(1), "{r}");
    let missing = run(&mut raw, "db", doc! { "collStats": "nope" }).await;
    assert_eq!(missing.get_i32("code"), Ok(26), "{missing}");
}
