//! Random command documents never break the server: every request gets a reply (or a close
//! for a fired fail point), and the server keeps serving.

mod common;

use bson::{doc, Bson, Document};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const NAMES: &[&str] = &[
    "insert",
    "update",
    "delete",
    "find",
    "getMore",
    "killCursors",
    "count",
    "distinct",
    "aggregate",
    "findAndModify",
    "create",
    "collMod",
    "drop",
    "dropDatabase",
    "listDatabases",
    "listCollections",
    "createIndexes",
    "dropIndexes",
    "listIndexes",
    "bulkWrite",
    "commitTransaction",
    "abortTransaction",
    "endSessions",
    "killAllSessions",
    "getParameter",
    "setParameter",
    "serverStatus",
    "hello",
    "isMaster",
    "buildInfo",
    "ping",
    "nope",
];
const FIELDS: &[&str] = &[
    "documents",
    "updates",
    "deletes",
    "filter",
    "query",
    "pipeline",
    "cursor",
    "batchSize",
    "limit",
    "skip",
    "sort",
    "key",
    "collection",
    "cursors",
    "ops",
    "nsInfo",
    "ordered",
    "indexes",
    "index",
    "lsid",
    "txnNumber",
    "autocommit",
    "startTransaction",
    "writeConcern",
    "maxTimeMS",
    "update",
    "remove",
    "new",
    "upsert",
    "singleBatch",
    "topologyVersion",
    "maxAwaitTimeMS",
    "$readPreference",
    "comment",
    "let",
    "collation",
    "viewOn",
    "validator",
    "bypassDocumentValidation",
];

fn value(rng: &mut StdRng, depth: u32) -> Bson {
    match rng.random_range(0..12) {
        0 => Bson::Int32(rng.random_range(-3..5)),
        1 => Bson::Int64(rng.random_range(-3..5)),
        2 => Bson::Double(rng.random_range(-2.0..3.0)),
        3 => Bson::String(["c", "", "$x", "a.b", "*", "majority"][rng.random_range(0..6)].into()),
        4 => Bson::Boolean(rng.random()),
        5 => Bson::Null,
        6 | 7 if depth < 4 => Bson::Document(document(rng, depth + 1)),
        8 | 9 if depth < 4 => Bson::Array(
            (0..rng.random_range(0..4))
                .map(|_| value(rng, depth + 1))
                .collect(),
        ),
        10 => Bson::Document(doc! { "$set": { "a": 1 } }),
        _ => Bson::Document(
            doc! { "id": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![rng.random_range(0..3); 16] }) },
        ),
    }
}

fn document(rng: &mut StdRng, depth: u32) -> Document {
    let mut d = Document::new();
    for _ in 0..rng.random_range(0..4) {
        let key = if rng.random_bool(0.7) {
            FIELDS[rng.random_range(0..FIELDS.len())].to_string()
        } else {
            ["a", "_id", "$inc", "$match", "x.y"][rng.random_range(0..5)].to_string()
        };
        d.insert(key, value(rng, depth));
    }
    d
}

#[tokio::test]
async fn random_commands_get_replies() {
    let emu = common::start(common::rs(2)).await;
    let mut rng = StdRng::seed_from_u64(7);
    for member in 0..2 {
        let addr = emu.addresses()[member];
        let mut raw = common::RawClient::connect(addr).await;
        for _ in 0..600 {
            let name = NAMES[rng.random_range(0..NAMES.len())];
            let mut cmd = doc! { name: value(&mut rng, 1) };
            cmd.extend(document(&mut rng, 1));
            cmd.insert("$db", ["db", "admin"][rng.random_range(0..2)]);
            if name == "hello" || name == "isMaster" {
                cmd.remove("maxAwaitTimeMS");
            }
            let reply = raw.command(&cmd).await;
            let reply = reply.unwrap_or_else(|| panic!("no reply to {cmd}"));
            assert!(reply.contains_key("ok"), "{cmd} -> {reply}");
        }
        let r = raw
            .command(&doc! { "ping": 1, "$db": "admin" })
            .await
            .unwrap();
        assert_eq!(r.get_f64("ok"), Ok(1.0));
    }
    emu.shutdown().await;
}
