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

/// Commands a sharded cluster's routers answer or route specially.
const SHARDING_NAMES: &[&str] = &[
    "enableSharding",
    "shardCollection",
    "split",
    "moveChunk",
    "listShards",
    "labShardingState",
    "dbStats",
    "insert",
    "update",
    "delete",
    "find",
    "getMore",
    "count",
    "aggregate",
    "findAndModify",
    "drop",
    "setParameter",
];

/// Values that name sharding things often enough to get past the first checks.
fn sharding_value(rng: &mut StdRng, depth: u32) -> Bson {
    match rng.random_range(0..8) {
        0 => Bson::String(["db.c", "db.r", "db.", "db", "x.c"][rng.random_range(0..5)].into()),
        1 => Bson::String(["shard0", "shard2", "shard7"][rng.random_range(0..3)].into()),
        2 => Bson::Document(doc! { "x": value(rng, depth + 1) }),
        3 => {
            let kind = if rng.random_bool(0.5) {
                Bson::String("hashed".into())
            } else {
                Bson::Int32(1)
            };
            Bson::Document(doc! { "x": kind })
        }
        4 => Bson::Document(doc! { "x": { "$in": [value(rng, depth + 1), 2] } }),
        5 => {
            let target = ["0", "all", "9"][rng.random_range(0..3)];
            let mut d = Document::new();
            d.insert(target, doc! { "cores": rng.random_range(0..3) });
            Bson::Document(d)
        }
        _ => value(rng, depth),
    }
}

#[tokio::test]
async fn random_sharding_commands_get_replies() {
    let emu = emulator::Emulator::start(emulator::EmulatorConfig {
        topology: emulator::Topology::Sharded { routers: 1 },
        shards: 3,
        ..Default::default()
    })
    .await
    .unwrap();
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    for setup in [
        doc! { "shardCollection": "db.c", "key": { "x": "hashed" }, "$db": "admin" },
        doc! { "shardCollection": "db.r", "key": { "x": 1 }, "$db": "admin" },
        doc! { "setParameter": 1, "defaultClientMaxRetryAttempts": 0, "$db": "admin" },
    ] {
        let r = raw.command(&setup).await.unwrap();
        assert_eq!(r.get_f64("ok"), Ok(1.0), "{setup}: {r}");
    }
    let fields = [
        "key",
        "middle",
        "find",
        "to",
        "primaryShard",
        "scale",
        "labOverloadShards",
        "documents",
        "updates",
        "deletes",
        "filter",
        "query",
        "ordered",
        "bounds",
    ];
    let mut rng = StdRng::seed_from_u64(11);
    for _ in 0..1500 {
        let name = SHARDING_NAMES[rng.random_range(0..SHARDING_NAMES.len())];
        let mut cmd = doc! { name: sharding_value(&mut rng, 1) };
        for _ in 0..rng.random_range(0..4) {
            let field = fields[rng.random_range(0..fields.len())];
            let v = if rng.random_bool(0.5) {
                sharding_value(&mut rng, 1)
            } else {
                Bson::Array(vec![Bson::Document(
                    doc! { "x": sharding_value(&mut rng, 2) },
                )])
            };
            cmd.insert(field, v);
        }
        cmd.insert("$db", ["db", "admin"][rng.random_range(0..2)]);
        let reply = raw.command(&cmd).await;
        let reply = reply.unwrap_or_else(|| panic!("no reply to {cmd}"));
        assert!(reply.contains_key("ok"), "{cmd} -> {reply}");
    }
    let r = raw
        .command(&doc! { "labShardingState": 1, "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    emu.shutdown().await;
}
