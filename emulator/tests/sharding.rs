//! The sharded persona with shards: shard keys and chunk placement, routing (targeted and
//! scatter-gather) charged to each shard's own overload model, mongos's handling of a shard's
//! overload error, batch writes split over shards, `dbStats`, and bad input.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use emulator::model::{CostConfig, LimiterConfig, ModelConfig};
use emulator::{Emulator, EmulatorConfig, Topology};

/// A sharded deployment of `routers` routers and `shards` shards, with per-shard models.
async fn cluster(
    routers: usize,
    shards: usize,
    shard_overload: BTreeMap<usize, ModelConfig>,
) -> Emulator {
    Emulator::start(EmulatorConfig {
        topology: Topology::Sharded { routers },
        shards,
        shard_overload,
        ..EmulatorConfig::default()
    })
    .await
    .expect("emulator starts")
}

async fn run(raw: &mut common::RawClient, db: &str, mut cmd: Document) -> Document {
    cmd.insert("$db", db);
    raw.command(&cmd).await.expect("a reply")
}

async fn ok(raw: &mut common::RawClient, db: &str, cmd: Document) -> Document {
    let r = run(raw, db, cmd.clone()).await;
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{cmd} → {r}");
    r
}

/// Requests each shard's model completed so far.
fn completed(emu: &Emulator) -> Vec<u64> {
    emu.shard_overload_models()
        .iter()
        .map(|m| m.snapshot().counters.completed)
        .collect()
}

fn delta(after: &[u64], before: &[u64]) -> Vec<u64> {
    after.iter().zip(before).map(|(a, b)| a - b).collect()
}

/// A model that rejects every data request at random with a retryable 462.
fn always_rejects() -> ModelConfig {
    ModelConfig {
        enabled: true,
        random_reject_share: 1.0,
        ..ModelConfig::default()
    }
}

/// `test.c` sharded on `{x: 1}`, split at 0, the chunk from 0 up on shard1: negative `x` on
/// shard0, the rest on shard1.
async fn two_ranged_chunks(raw: &mut common::RawClient) {
    ok(
        raw,
        "admin",
        doc! { "shardCollection": "test.c", "key": { "x": 1 } },
    )
    .await;
    ok(
        raw,
        "admin",
        doc! { "split": "test.c", "middle": { "x": 0 } },
    )
    .await;
    ok(
        raw,
        "admin",
        doc! { "moveChunk": "test.c", "find": { "x": 1 }, "to": "shard1" },
    )
    .await;
}

/// Makes the routers' retries of a shard's overload errors quick (mongos's default base is
/// 100 ms).
async fn quick_retries(raw: &mut common::RawClient, attempts: i32) {
    router_retries(raw, attempts, 1, 2).await;
}

/// Sets how the routers retry a shard's overload error: up to `attempts` retries, backing off
/// from `base_ms` to at most `max_ms`.
async fn router_retries(raw: &mut common::RawClient, attempts: i32, base_ms: i32, max_ms: i32) {
    ok(
        raw,
        "admin",
        doc! {
            "setParameter": 1,
            "defaultClientMaxRetryAttempts": attempts,
            "defaultClientBaseBackoffMillis": base_ms,
            "defaultClientMaxBackoffMillis": max_ms,
        },
    )
    .await;
}

/// Stops shard 1's random rejections; the reply says what the share was.
async fn shard1_stops_rejecting(raw: &mut common::RawClient) -> Document {
    ok(
        raw,
        "admin",
        doc! { "setParameter": 1, "labOverloadShards": { "1": { "randomRejectShare": 0.0 } } },
    )
    .await
}

fn count_of(reply: &Document) -> i64 {
    match reply.get("n") {
        Some(Bson::Int32(n)) => i64::from(*n),
        Some(Bson::Int64(n)) => *n,
        other => panic!("no count in {reply} ({other:?})"),
    }
}

fn first_batch_len(reply: &Document) -> usize {
    reply
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .map(Vec::len)
        .unwrap_or_else(|_| panic!("no first batch in {reply}"))
}

fn write_error_indexes(reply: &Document) -> Vec<(i32, i32)> {
    reply
        .get_array("writeErrors")
        .map(|errors| {
            errors
                .iter()
                .filter_map(Bson::as_document)
                .map(|e| (e.get_i32("index").unwrap(), e.get_i32("code").unwrap()))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn an_equality_query_on_a_hashed_key_charges_one_shard_and_no_key_charges_all() {
    let emu = cluster(1, 3, BTreeMap::new()).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    ok(&mut raw, "admin", doc! { "enableSharding": "test" }).await;
    ok(
        &mut raw,
        "admin",
        doc! { "shardCollection": "test.h", "key": { "k": "hashed" } },
    )
    .await;
    let docs: Vec<Document> = (0..30).map(|k| doc! { "_id": k, "k": k }).collect();
    ok(
        &mut raw,
        "test",
        doc! { "insert": "h", "documents": docs, "ordered": false },
    )
    .await;
    // An unordered insert is one child batch per shard: 30 values over three shards reach all.
    let mut owners = Vec::new();
    for k in 0..30 {
        let before = completed(&emu);
        let r = ok(&mut raw, "test", doc! { "find": "h", "filter": { "k": k } }).await;
        assert_eq!(first_batch_len(&r), 1, "{r}");
        let d = delta(&completed(&emu), &before);
        assert_eq!(d.iter().sum::<u64>(), 1, "k = {k}: {d:?}");
        owners.push(d.iter().position(|c| *c == 1).unwrap());
        // The same value lands on the same shard every time (and as 1.0 or 1i64 too).
        let before = completed(&emu);
        let same = Bson::Double(f64::from(k));
        ok(
            &mut raw,
            "test",
            doc! { "count": "h", "query": { "k": same } },
        )
        .await;
        let again = delta(&completed(&emu), &before);
        assert_eq!(again, d, "k = {k} as a double");
    }
    for shard in 0..3 {
        assert!(
            owners.contains(&shard),
            "no value on shard {shard}: {owners:?}"
        );
    }
    // No shard key in the filter: every shard.
    let before = completed(&emu);
    let r = ok(
        &mut raw,
        "test",
        doc! { "find": "h", "filter": { "_id": 3 } },
    )
    .await;
    assert_eq!(first_batch_len(&r), 1);
    assert_eq!(delta(&completed(&emu), &before), vec![1, 1, 1]);
    // $in over two values: their shards only.
    let (a, b) = (0, (1..30).find(|k| owners[*k] != owners[0]).unwrap());
    let before = completed(&emu);
    let r = ok(
        &mut raw,
        "test",
        doc! { "find": "h", "filter": { "k": { "$in": [a as i32, b as i32] } } },
    )
    .await;
    assert_eq!(first_batch_len(&r), 2);
    let d = delta(&completed(&emu), &before);
    assert_eq!(d.iter().sum::<u64>(), 2, "{d:?}");
    assert_eq!((d[owners[a]], d[owners[b]]), (1, 1), "{d:?}");
    emu.shutdown().await;
}

#[tokio::test]
async fn ranged_chunks_follow_split_and_move_chunk() {
    let emu = cluster(1, 2, BTreeMap::new()).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    ok(
        &mut raw,
        "admin",
        doc! { "shardCollection": "test.c", "key": { "x": 1 } },
    )
    .await;
    // One chunk on the primary shard until split.
    let before = completed(&emu);
    ok(&mut raw, "test", doc! { "find": "c", "filter": { "x": 5 } }).await;
    assert_eq!(delta(&completed(&emu), &before), vec![1, 0]);
    ok(
        &mut raw,
        "admin",
        doc! { "split": "test.c", "middle": { "x": 0 } },
    )
    .await;
    ok(
        &mut raw,
        "admin",
        doc! { "moveChunk": "test.c", "find": { "x": 7 }, "to": "shard1" },
    )
    .await;
    let state = ok(&mut raw, "admin", doc! { "labShardingState": 1 }).await;
    let chunks = state.get_array("collections").unwrap()[0]
        .as_document()
        .unwrap()
        .get_array("chunks")
        .unwrap()
        .clone();
    let owners: Vec<&str> = chunks
        .iter()
        .map(|c| c.as_document().unwrap().get_str("shard").unwrap())
        .collect();
    assert_eq!(owners, ["shard0", "shard1"]);
    for (filter, want) in [
        (doc! { "x": -3 }, vec![1, 0]),
        (doc! { "x": 0 }, vec![0, 1]),
        (doc! { "x": { "$gte": 2, "$lt": 9 } }, vec![0, 1]),
        (doc! { "x": { "$lt": -1 } }, vec![1, 0]),
        (doc! { "x": { "$gt": -10 } }, vec![1, 1]),
    ] {
        let before = completed(&emu);
        ok(
            &mut raw,
            "test",
            doc! { "find": "c", "filter": filter.clone() },
        )
        .await;
        assert_eq!(delta(&completed(&emu), &before), want, "{filter}");
    }
    // An ordered insert sends consecutive statements for one shard together: -5 | 5 | -1, -2.
    let before = completed(&emu);
    let docs = vec![
        doc! { "x": -5 },
        doc! { "x": 5 },
        doc! { "x": -1 },
        doc! { "x": -2 },
    ];
    let r = ok(
        &mut raw,
        "test",
        doc! { "insert": "c", "documents": docs.clone() },
    )
    .await;
    assert_eq!(count_of(&r), 4);
    assert_eq!(delta(&completed(&emu), &before), vec![2, 1]);
    // Unordered: one child batch per shard.
    let before = completed(&emu);
    let r = ok(
        &mut raw,
        "test",
        doc! { "insert": "c", "documents": docs, "ordered": false },
    )
    .await;
    assert_eq!(count_of(&r), 4);
    assert_eq!(delta(&completed(&emu), &before), vec![1, 1]);
    // Unsharded collections live on the primary shard, which enableSharding may name.
    ok(
        &mut raw,
        "admin",
        doc! { "enableSharding": "other", "primaryShard": "shard1" },
    )
    .await;
    let before = completed(&emu);
    ok(
        &mut raw,
        "other",
        doc! { "insert": "u", "documents": [{ "a": 1 }] },
    )
    .await;
    ok(&mut raw, "other", doc! { "find": "u" }).await;
    assert_eq!(delta(&completed(&emu), &before), vec![0, 2]);
    let shards = ok(&mut raw, "admin", doc! { "listShards": 1 }).await;
    let names: Vec<&str> = shards
        .get_array("shards")
        .unwrap()
        .iter()
        .map(|s| s.as_document().unwrap().get_str("_id").unwrap())
        .collect();
    assert_eq!(names, ["shard0", "shard1"]);
    emu.shutdown().await;
}

#[tokio::test]
async fn get_more_goes_to_the_shards_of_its_cursor() {
    let emu = cluster(1, 2, BTreeMap::new()).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    two_ranged_chunks(&mut raw).await;
    let docs: Vec<Document> = (1..=5).map(|x| doc! { "x": x }).collect();
    ok(&mut raw, "test", doc! { "insert": "c", "documents": docs }).await;
    let r = ok(
        &mut raw,
        "test",
        doc! { "find": "c", "filter": { "x": { "$gt": 0 } }, "batchSize": 1 },
    )
    .await;
    let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    assert_ne!(id, 0);
    let before = completed(&emu);
    let more = ok(
        &mut raw,
        "test",
        doc! { "getMore": id, "collection": "c", "batchSize": 1 },
    )
    .await;
    assert_eq!(
        more.get_document("cursor")
            .unwrap()
            .get_array("nextBatch")
            .unwrap()
            .len(),
        1
    );
    assert_eq!(delta(&completed(&emu), &before), vec![0, 1]);
    emu.shutdown().await;
}

#[tokio::test]
async fn a_hot_shard_rejects_while_the_cold_shard_serves_through_the_same_router() {
    let emu = cluster(2, 2, BTreeMap::from([(1, always_rejects())])).await;
    let mut raw = common::RawClient::connect(emu.addresses()[1]).await;
    two_ranged_chunks(&mut raw).await;
    quick_retries(&mut raw, 2).await;
    ok(
        &mut raw,
        "admin",
        doc! { "setParameter": 1, "externalClientBaseBackoffMS": 40 },
    )
    .await;
    ok(
        &mut raw,
        "test",
        doc! { "insert": "c", "documents": [{ "x": -1 }] },
    )
    .await;
    for _ in 0..5 {
        let cold = ok(
            &mut raw,
            "test",
            doc! { "find": "c", "filter": { "x": -1 } },
        )
        .await;
        assert_eq!(first_batch_len(&cold), 1);
    }
    // The hot shard's retryable 462: the router retries it twice, then fails the command with
    // the code and only the label mongos derives, plus its own baseBackoffMS.
    let hot = run(&mut raw, "test", doc! { "find": "c", "filter": { "x": 1 } }).await;
    assert_eq!(hot.get_f64("ok"), Ok(0.0), "{hot}");
    assert_eq!(hot.get_i32("code"), Ok(462), "{hot}");
    assert_eq!(
        hot.get_str("codeName"),
        Ok("IngressRequestRateLimitExceeded")
    );
    let labels: Vec<&str> = hot
        .get_array("errorLabels")
        .unwrap()
        .iter()
        .filter_map(Bson::as_str)
        .collect();
    assert_eq!(labels, ["SystemOverloadedError"], "{hot}");
    assert_eq!(hot.get("baseBackoffMS"), Some(&Bson::Int64(40)), "{hot}");
    // Lab-only: the shard's own labels instead of mongos's.
    ok(
        &mut raw,
        "admin",
        doc! { "setParameter": 1, "labRouterShardErrorLabels": "shard" },
    )
    .await;
    let passed_on = run(&mut raw, "test", doc! { "find": "c", "filter": { "x": 1 } }).await;
    let labels: Vec<&str> = passed_on
        .get_array("errorLabels")
        .unwrap()
        .iter()
        .filter_map(Bson::as_str)
        .collect();
    assert_eq!(
        labels,
        ["SystemOverloadedError", "RetryableError"],
        "{passed_on}"
    );
    let bad = run(
        &mut raw,
        "admin",
        doc! { "setParameter": 1, "labRouterShardErrorLabels": "both" },
    )
    .await;
    assert_eq!(bad.get_i32("code"), Ok(2), "{bad}");
    ok(
        &mut raw,
        "admin",
        doc! { "setParameter": 1, "labRouterShardErrorLabels": "mongos" },
    )
    .await;
    // A scatter-gather fails as a whole when one shard gives up.
    let scatter = run(&mut raw, "test", doc! { "find": "c" }).await;
    assert_eq!(scatter.get_i32("code"), Ok(462), "{scatter}");
    // The hot shard saw every attempt; the cold shard served all its reads; the routers'
    // models (off with two shards) shed nothing.
    let status = ok(&mut raw, "admin", doc! { "serverStatus": 1 }).await;
    let shards = status.get_array("labOverloadShards").unwrap();
    let shard = |i: usize| shards[i].as_document().unwrap();
    assert_eq!(shard(1).get_str("name"), Ok("shard1"));
    let routing = shard(1).get_document("routing").unwrap();
    // Three commands on the hot shard, three attempts each.
    assert_eq!(routing.get_i64("requests"), Ok(9), "{routing}");
    assert_eq!(routing.get_i64("overloadErrors"), Ok(9), "{routing}");
    assert_eq!(routing.get_i64("overloadRetries"), Ok(6), "{routing}");
    assert_eq!(routing.get_i64("failed"), Ok(3), "{routing}");
    let hot_counters = emu.shard_overload(1).unwrap().snapshot().counters;
    assert_eq!(hot_counters.random_rejections, 9);
    assert_eq!(
        shard(0).get_document("routing").unwrap().get_i64("failed"),
        Ok(0)
    );
    assert!(emu.shard_overload(0).unwrap().snapshot().counters.completed >= 6);
    for router in emu.overload_models() {
        assert!(!router.config().enabled);
        assert_eq!(router.snapshot().counters.random_rejections, 0);
    }
    emu.shutdown().await;
}

#[tokio::test]
async fn targeted_commands_fail_at_top_level_when_their_shard_gives_up() {
    let emu = cluster(1, 2, BTreeMap::from([(1, always_rejects())])).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    two_ranged_chunks(&mut raw).await;
    quick_retries(&mut raw, 0).await;
    ok(
        &mut raw,
        "test",
        doc! { "insert": "c", "documents": [{ "_id": 1, "x": -1 }] },
    )
    .await;
    let cold = ok(
        &mut raw,
        "test",
        doc! { "findAndModify": "c", "query": { "x": -1 }, "update": { "$set": { "y": 1 } }, "new": true },
    )
    .await;
    assert_eq!(
        cold.get_document("value").unwrap().get_i32("y"),
        Ok(1),
        "{cold}"
    );
    for cmd in [
        doc! { "findAndModify": "c", "query": { "x": 1 }, "update": { "$set": { "y": 1 } }, "upsert": true },
        doc! { "count": "c", "query": { "x": 5 } },
        doc! { "distinct": "c", "key": "y" },
        doc! { "aggregate": "c", "pipeline": [{ "$match": { "x": { "$gt": 3 } } }], "cursor": {} },
    ] {
        let r = run(&mut raw, "test", cmd.clone()).await;
        assert_eq!(r.get_i32("code"), Ok(462), "{cmd}: {r}");
        assert!(!r.contains_key("writeErrors"), "{cmd}: {r}");
    }
    // The upsert never ran.
    ok(
        &mut raw,
        "admin",
        doc! { "setParameter": 1, "labOverloadShards": { "1": { "enabled": false } } },
    )
    .await;
    let r = ok(&mut raw, "test", doc! { "count": "c" }).await;
    assert_eq!(count_of(&r), 1, "{r}");
    emu.shutdown().await;
}

#[tokio::test]
async fn a_shard_error_without_retryable_error_is_not_retried() {
    // shard1 admits one request, then rejects with a 462 that forbids retries.
    let one_token = ModelConfig {
        enabled: true,
        limiter: LimiterConfig {
            enabled: true,
            rate_per_sec: 0.001,
            burst_capacity_secs: 1.0,
            allow_retries: false,
            ..LimiterConfig::default()
        },
        ..ModelConfig::default()
    };
    let emu = cluster(1, 2, BTreeMap::from([(1, one_token)])).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    two_ranged_chunks(&mut raw).await;
    quick_retries(&mut raw, 3).await;
    ok(&mut raw, "test", doc! { "find": "c", "filter": { "x": 1 } }).await;
    let r = run(&mut raw, "test", doc! { "find": "c", "filter": { "x": 1 } }).await;
    assert_eq!(r.get_i32("code"), Ok(462), "{r}");
    assert_eq!(r.get_array("errorLabels").unwrap().len(), 1, "{r}");
    let status = ok(&mut raw, "admin", doc! { "serverStatus": 1 }).await;
    let routing = status.get_array("labOverloadShards").unwrap()[1]
        .as_document()
        .unwrap()
        .get_document("routing")
        .unwrap()
        .clone();
    assert_eq!(routing.get_i64("requests"), Ok(2), "{routing}");
    assert_eq!(routing.get_i64("overloadRetries"), Ok(0), "{routing}");
    emu.shutdown().await;
}

#[tokio::test]
async fn a_retried_shard_request_succeeds_once_the_shard_recovers() {
    let emu = cluster(1, 2, BTreeMap::from([(1, always_rejects())])).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    two_ranged_chunks(&mut raw).await;
    // Long enough backoffs that the shard can be switched off meanwhile.
    router_retries(&mut raw, 50, 20, 20).await;
    let addr = emu.addresses()[0];
    let read = tokio::spawn(async move {
        let mut other = common::RawClient::connect(addr).await;
        run(
            &mut other,
            "test",
            doc! { "find": "c", "filter": { "x": 1 } },
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let r = shard1_stops_rejecting(&mut raw).await;
    let was = r.get_document("was").unwrap().get_document("1").unwrap();
    assert_eq!(was.get_f64("randomRejectShare"), Ok(1.0), "{was}");
    let reply = read.await.unwrap();
    assert_eq!(reply.get_f64("ok"), Ok(1.0), "{reply}");
    assert!(
        emu.shard_overload(1)
            .unwrap()
            .snapshot()
            .counters
            .random_rejections
            >= 2
    );
    emu.shutdown().await;
}

#[tokio::test]
async fn a_shard_times_a_retried_request_from_the_retry_not_from_the_client() {
    // The hot shard rejects for 100 ms while the router retries; the attempt it then serves
    // waited and ran on it for a few milliseconds at most. Its completed run counts from that
    // attempt reaching the shard: the earlier rejections and the router's backoffs were spent
    // before it got there (the client's round trip shows them, not the shard's run).
    let emu = cluster(1, 2, BTreeMap::from([(1, always_rejects())])).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    two_ranged_chunks(&mut raw).await;
    router_retries(&mut raw, 50, 10, 10).await;
    let addr = emu.addresses()[0];
    let started = Instant::now();
    let read = tokio::spawn(async move {
        let mut other = common::RawClient::connect(addr).await;
        run(
            &mut other,
            "test",
            doc! {
                "find": "c",
                "filter": { "x": 1 },
                "maxTimeMS": 10_000,
                "comment": { "labCostMs": 2 },
            },
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    shard1_stops_rejecting(&mut raw).await;
    let reply = read.await.unwrap();
    assert_eq!(reply.get_f64("ok"), Ok(1.0), "{reply}");
    assert!(started.elapsed() >= Duration::from_millis(100));
    let c = emu.shard_overload(1).unwrap().snapshot().counters;
    assert!(c.random_rejections >= 2, "{c:?}");
    assert_eq!(c.completed_runs.total(), 1, "{c:?}");
    assert!(c.completed_wait_ms < 20.0, "{c:?}");
    assert!(
        c.completed_run_ms < 20.0,
        "ran {} ms on the shard",
        c.completed_run_ms
    );
    emu.shutdown().await;
}

#[tokio::test]
async fn a_batch_split_over_shards_reports_exactly_what_was_applied() {
    let emu = cluster(1, 2, BTreeMap::from([(1, always_rejects())])).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    two_ranged_chunks(&mut raw).await;
    quick_retries(&mut raw, 0).await;
    // One document on shard1 while it is healthy.
    let shard1 = |enabled: bool| doc! { "setParameter": 1, "labOverloadShards": { "1": { "enabled": enabled } } };
    ok(&mut raw, "admin", shard1(false)).await;
    ok(
        &mut raw,
        "test",
        doc! { "insert": "c", "documents": [{ "_id": 100, "x": 100 }] },
    )
    .await;
    ok(&mut raw, "admin", shard1(true)).await;
    // Unordered: shard1's child batch fails as one write error per statement; shard0's runs.
    let docs = vec![
        doc! { "_id": 1, "x": -1 },
        doc! { "_id": 2, "x": 1 },
        doc! { "_id": 3, "x": -2 },
        doc! { "_id": 4, "x": 2 },
    ];
    let r = ok(
        &mut raw,
        "test",
        doc! { "insert": "c", "documents": docs.clone(), "ordered": false },
    )
    .await;
    assert_eq!(count_of(&r), 2, "{r}");
    assert_eq!(write_error_indexes(&r), [(1, 462), (3, 462)], "{r}");
    assert!(!r.contains_key("errorLabels"), "{r}");
    // Ordered: the batch stops at the first rejected statement, one write error.
    let docs = vec![
        doc! { "_id": 10, "x": -10 },
        doc! { "_id": 11, "x": 11 },
        doc! { "_id": 12, "x": -12 },
    ];
    let r = ok(&mut raw, "test", doc! { "insert": "c", "documents": docs }).await;
    assert_eq!(count_of(&r), 1, "{r}");
    assert_eq!(write_error_indexes(&r), [(1, 462)], "{r}");
    // A multi-update over both shards fails as one statement, and shard0 applies its part
    // (mongos's shards apply theirs independently): n counts shard0's three documents.
    let r = ok(
        &mut raw,
        "test",
        doc! { "update": "c", "updates": [{ "q": {}, "u": { "$set": { "seen": true } }, "multi": true }] },
    )
    .await;
    assert_eq!(write_error_indexes(&r), [(0, 462)], "{r}");
    assert_eq!((count_of(&r), r.get_i32("nModified")), (3, Ok(3)), "{r}");
    // A single-document statement over both shards applies nowhere.
    let r = ok(
        &mut raw,
        "test",
        doc! { "update": "c", "updates": [{ "q": {}, "u": { "$set": { "one": true } } }] },
    )
    .await;
    assert_eq!(write_error_indexes(&r), [(0, 462)], "{r}");
    assert_eq!(count_of(&r), 0, "{r}");
    // A targeted update on the cold shard goes through.
    let r = ok(
        &mut raw,
        "test",
        doc! { "update": "c", "updates": [{ "q": { "x": -1 }, "u": { "$set": { "cold": true } } }] },
    )
    .await;
    assert_eq!((count_of(&r), r.get_i32("nModified")), (1, Ok(1)), "{r}");
    // Ordered: the partly accepted multi-update ends the batch; the statement after it never runs.
    let r = ok(
        &mut raw,
        "test",
        doc! { "update": "c", "updates": [
            { "q": {}, "u": { "$set": { "m": 1 } }, "multi": true },
            { "q": { "x": -1 }, "u": { "$set": { "z": 1 } } },
        ] },
    )
    .await;
    assert_eq!(write_error_indexes(&r), [(0, 462)], "{r}");
    assert_eq!(count_of(&r), 3, "{r}");
    // What is in the store: exactly the statements reported applied.
    ok(
        &mut raw,
        "admin",
        doc! { "setParameter": 1, "labOverloadShards": { "all": { "enabled": false } } },
    )
    .await;
    let all = ok(&mut raw, "test", doc! { "find": "c", "sort": { "_id": 1 } }).await;
    let docs: Vec<(i32, bool, bool)> = all
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap()
        .iter()
        .map(|d| {
            let d = d.as_document().unwrap();
            (
                d.get_i32("_id").unwrap(),
                d.get_bool("seen").unwrap_or(false),
                d.contains_key("one"),
            )
        })
        .collect();
    assert_eq!(
        docs,
        [
            (1, true, false),
            (3, true, false),
            (10, true, false),
            (100, false, false)
        ]
    );
    for (filter, n) in [(doc! { "m": 1 }, 3), (doc! { "z": { "$exists": true } }, 0)] {
        let r = ok(
            &mut raw,
            "test",
            doc! { "count": "c", "query": filter.clone() },
        )
        .await;
        assert_eq!(count_of(&r), n, "{filter}: {r}");
    }
    emu.shutdown().await;
}

#[tokio::test]
async fn a_retryable_write_retried_after_a_shard_rejection_applies_nothing_twice() {
    let emu = cluster(1, 2, BTreeMap::from([(1, always_rejects())])).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    two_ranged_chunks(&mut raw).await;
    quick_retries(&mut raw, 0).await;
    let lsid = doc! { "id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7u8; 16] } };
    let write = doc! {
        "update": "c",
        "updates": [
            { "q": { "x": -1 }, "u": { "$inc": { "n": 1 } }, "upsert": true },
            { "q": { "x": 1 }, "u": { "$inc": { "n": 1 } }, "upsert": true },
        ],
        "ordered": false,
        "lsid": lsid.clone(),
        "txnNumber": 1i64,
    };
    let first = ok(&mut raw, "test", write.clone()).await;
    assert_eq!(write_error_indexes(&first), [(1, 462)], "{first}");
    assert_eq!(count_of(&first), 1, "{first}");
    ok(
        &mut raw,
        "admin",
        doc! { "setParameter": 1, "labOverloadShards": { "1": { "enabled": false } } },
    )
    .await;
    // The retry (same txnNumber) runs only the statement the shard rejected.
    let retry = ok(&mut raw, "test", write).await;
    assert!(!retry.contains_key("writeErrors"), "{retry}");
    assert_eq!(count_of(&retry), 2, "{retry}");
    let all = ok(&mut raw, "test", doc! { "find": "c", "sort": { "x": 1 } }).await;
    let counters: Vec<(i32, i32)> = all
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap()
        .iter()
        .map(|d| {
            let d = d.as_document().unwrap();
            (d.get_i32("x").unwrap(), d.get_i32("n").unwrap())
        })
        .collect();
    assert_eq!(counters, [(-1, 1), (1, 1)]);
    emu.shutdown().await;
}

#[tokio::test]
async fn a_scatter_gather_waits_for_its_shards_concurrently() {
    // Every shard spends 300 ms of core time on a scan.
    let slow = ModelConfig {
        enabled: true,
        costs: CostConfig {
            scan_ms: 300.0,
            ..CostConfig::default()
        },
        ..ModelConfig::default()
    };
    let emu = cluster(
        1,
        3,
        BTreeMap::from([(0, slow.clone()), (1, slow.clone()), (2, slow)]),
    )
    .await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    ok(
        &mut raw,
        "admin",
        doc! { "shardCollection": "test.s", "key": { "k": "hashed" } },
    )
    .await;
    let started = Instant::now();
    ok(&mut raw, "test", doc! { "find": "s" }).await;
    let took = started.elapsed();
    // One after another would take 900 ms.
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_millis(800),
        "{took:?}"
    );
    for m in emu.shard_overload_models() {
        assert_eq!(m.snapshot().counters.completed, 1);
    }
    emu.shutdown().await;
}

#[tokio::test]
async fn a_scatter_gather_fails_at_the_first_shard_error_without_waiting_for_the_rest() {
    // shard0 spends 400 ms on a scan; shard1 rejects at once.
    let slow = ModelConfig {
        enabled: true,
        costs: CostConfig {
            scan_ms: 400.0,
            ..CostConfig::default()
        },
        ..ModelConfig::default()
    };
    let emu = cluster(1, 2, BTreeMap::from([(0, slow), (1, always_rejects())])).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    ok(
        &mut raw,
        "admin",
        doc! { "shardCollection": "test.s", "key": { "k": "hashed" } },
    )
    .await;
    quick_retries(&mut raw, 0).await;
    let started = Instant::now();
    let r = run(&mut raw, "test", doc! { "find": "s" }).await;
    let took = started.elapsed();
    assert_eq!(r.get_i32("code"), Ok(462), "{r}");
    assert!(took < Duration::from_millis(300), "{took:?}");
    // shard0's cancelled scan did not complete.
    assert_eq!(
        emu.shard_overload(0).unwrap().snapshot().counters.completed,
        0
    );
    emu.shutdown().await;
}

#[tokio::test]
async fn one_shard_keeps_todays_models_and_two_move_them_to_the_shards() {
    let on = ModelConfig {
        enabled: true,
        ..ModelConfig::default()
    };
    let one = Emulator::start(EmulatorConfig {
        topology: Topology::Sharded { routers: 2 },
        overload: on.clone(),
        ..EmulatorConfig::default()
    })
    .await
    .unwrap();
    assert!(one.overload_models().iter().all(|m| m.config().enabled));
    assert_eq!(one.shard_overload_models().len(), 1);
    assert!(!one.shard_overload(0).unwrap().config().enabled);
    assert!(one.shard_overload(1).is_none());
    one.shutdown().await;
    let two = Emulator::start(EmulatorConfig {
        topology: Topology::Sharded { routers: 2 },
        shards: 2,
        overload: on.clone(),
        member_overload: BTreeMap::from([(1, on)]),
        ..EmulatorConfig::default()
    })
    .await
    .unwrap();
    let routers: Vec<bool> = two
        .overload_models()
        .iter()
        .map(|m| m.config().enabled)
        .collect();
    assert_eq!(routers, [false, true]);
    assert!(two
        .shard_overload_models()
        .iter()
        .all(|m| m.config().enabled));
    // getParameter shows the shards' models; a replica set has none.
    let mut raw = common::RawClient::connect(two.addresses()[0]).await;
    let got = ok(
        &mut raw,
        "admin",
        doc! { "getParameter": 1, "labOverloadShards": 1 },
    )
    .await;
    let keys: Vec<&str> = got
        .get_document("labOverloadShards")
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["0", "1"]);
    two.shutdown().await;
    let bad = Emulator::start(EmulatorConfig {
        topology: Topology::Sharded { routers: 1 },
        shards: 2,
        shard_overload: BTreeMap::from([(2, ModelConfig::default())]),
        ..EmulatorConfig::default()
    })
    .await;
    let err = bad.err().expect("shard 2 of 2 is refused").to_string();
    assert!(err.contains("shard 2"), "{err}");
}

#[tokio::test]
async fn bad_sharding_input_gets_clear_errors() {
    let emu = cluster(1, 2, BTreeMap::new()).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    ok(
        &mut raw,
        "admin",
        doc! { "shardCollection": "test.h", "key": { "k": "hashed" } },
    )
    .await;
    let cases: Vec<(Document, i32, &str)> = vec![
        (
            doc! { "shardCollection": "nodot", "key": { "x": 1 } },
            73,
            "invalid namespace",
        ),
        (
            doc! { "shardCollection": "test.", "key": { "x": 1 } },
            73,
            "invalid namespace",
        ),
        (
            doc! { "shardCollection": 5, "key": { "x": 1 } },
            14,
            "namespace string",
        ),
        (doc! { "shardCollection": "test.c" }, 14, "'key'"),
        (
            doc! { "shardCollection": "test.c", "key": { "a": 1, "b": 1 } },
            2,
            "compound",
        ),
        (
            doc! { "shardCollection": "test.c", "key": { "x": -1 } },
            2,
            "unsupported shard key",
        ),
        (
            doc! { "shardCollection": "test.c", "key": { "$x": 1 } },
            2,
            "not a valid shard key",
        ),
        (
            doc! { "shardCollection": "test.h", "key": { "k": 1 } },
            23,
            "already",
        ),
        (
            doc! { "shardCollection": "admin.c", "key": { "x": 1 } },
            20,
            "cannot be sharded",
        ),
        (
            doc! { "split": "test.none", "middle": { "x": 1 } },
            118,
            "not sharded",
        ),
        (
            doc! { "split": "test.h", "middle": { "k": 1 } },
            2,
            "hashed",
        ),
        (
            doc! { "moveChunk": "test.h", "find": { "k": 1 }, "to": "shard9" },
            70,
            "no shard named",
        ),
        (
            doc! { "moveChunk": "test.h", "find": { "other": 1 }, "to": "shard1" },
            2,
            "shard key field",
        ),
        (
            doc! { "moveChunk": "test.h", "find": 3, "to": "shard1" },
            14,
            "must be a document",
        ),
        (
            doc! { "enableSharding": "test", "primaryShard": "nope" },
            70,
            "no shard named",
        ),
        (
            doc! { "setParameter": 1, "labOverloadShards": { "4": { "cores": 1 } } },
            2,
            "no shard \"4\"",
        ),
        (
            doc! { "setParameter": 1, "labOverloadShards": { "all": { "cores": 0 } } },
            2,
            "labOverloadShards.0",
        ),
    ];
    for (cmd, code, needle) in cases {
        let r = run(&mut raw, "admin", cmd.clone()).await;
        assert_eq!(r.get_f64("ok"), Ok(0.0), "{cmd}: {r}");
        assert_eq!(r.get_i32("code"), Ok(code), "{cmd}: {r}");
        let msg = r.get_str("errmsg").unwrap();
        assert!(msg.contains(needle), "{cmd}: {msg}");
    }
    ok(
        &mut raw,
        "admin",
        doc! { "shardCollection": "test.r", "key": { "x": 1 } },
    )
    .await;
    let split_errors: Vec<(Document, &str)> = vec![
        (
            doc! { "split": "test.r", "middle": { "y": 1 } },
            "shard key field",
        ),
        (
            doc! { "split": "test.r", "middle": { "x": 1, "y": 1 } },
            "exactly",
        ),
        (
            doc! { "split": "test.r", "middle": { "x": Bson::MaxKey } },
            "MaxKey",
        ),
        (
            doc! { "split": "test.r", "find": { "x": 1 } },
            "only 'middle'",
        ),
    ];
    for (cmd, needle) in split_errors {
        let r = run(&mut raw, "admin", cmd.clone()).await;
        assert_eq!(r.get_f64("ok"), Ok(0.0), "{cmd}: {r}");
        assert!(r.get_str("errmsg").unwrap().contains(needle), "{cmd}: {r}");
    }
    ok(
        &mut raw,
        "admin",
        doc! { "split": "test.r", "middle": { "x": 1 } },
    )
    .await;
    let again = run(
        &mut raw,
        "admin",
        doc! { "split": "test.r", "middle": { "x": 1.0 } },
    )
    .await;
    assert!(
        again
            .get_str("errmsg")
            .unwrap()
            .contains("already a chunk boundary"),
        "{again}"
    );
    // Sharding commands belong on the admin database, and on routers.
    let r = run(&mut raw, "test", doc! { "listShards": 1 }).await;
    assert_eq!(r.get_i32("code"), Ok(13), "{r}");
    // Nothing bad changed the models.
    assert!(emu
        .shard_overload_models()
        .iter()
        .all(|m| m.config().cores == 2));
    emu.shutdown().await;
    let rs = common::start(common::rs(1)).await;
    let mut raw = common::RawClient::connect(rs.addresses()[0]).await;
    let r = run(
        &mut raw,
        "admin",
        doc! { "shardCollection": "test.c", "key": { "x": 1 } },
    )
    .await;
    assert_eq!(r.get_i32("code"), Ok(59), "{r}");
    let r = run(
        &mut raw,
        "admin",
        doc! { "setParameter": 1, "labOverloadShards": { "all": {} } },
    )
    .await;
    assert_eq!(r.get_f64("ok"), Ok(0.0), "{r}");
    assert!(r.get_str("errmsg").unwrap().contains("not sharded"), "{r}");
    rs.shutdown().await;
}

#[tokio::test]
async fn a_dropped_collection_forgets_its_shard_key() {
    let emu = cluster(1, 2, BTreeMap::new()).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    two_ranged_chunks(&mut raw).await;
    ok(&mut raw, "test", doc! { "drop": "c" }).await;
    let state = ok(&mut raw, "admin", doc! { "labShardingState": 1 }).await;
    assert!(
        state.get_array("collections").unwrap().is_empty(),
        "{state}"
    );
    // Now unsharded: everything on the primary shard.
    let before = completed(&emu);
    ok(&mut raw, "test", doc! { "find": "c", "filter": { "x": 1 } }).await;
    assert_eq!(delta(&completed(&emu), &before), vec![1, 0]);
    emu.shutdown().await;
}

/// The BSON size of a document.
fn size(d: &Document) -> i64 {
    bson::to_vec(d).unwrap().len() as i64
}

#[tokio::test]
async fn db_stats_counts_collections_views_documents_and_sizes() {
    let emu = common::start(Topology::Standalone).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let docs: Vec<Document> = (0..10)
        .map(|i| doc! { "_id": i, "name": format!("n{i}"), "pad": "x".repeat(i as usize * 10) })
        .collect();
    ok(
        &mut raw,
        "s",
        doc! { "insert": "a", "documents": docs.clone() },
    )
    .await;
    ok(
        &mut raw,
        "s",
        doc! { "insert": "b", "documents": [{ "_id": 1 }] },
    )
    .await;
    ok(
        &mut raw,
        "s",
        doc! { "createIndexes": "a", "indexes": [{ "key": { "name": 1 }, "name": "name_1" }] },
    )
    .await;
    ok(
        &mut raw,
        "s",
        doc! { "create": "v", "viewOn": "a", "pipeline": [] },
    )
    .await;
    let data: i64 = docs.iter().map(size).sum::<i64>() + size(&doc! { "_id": 1 });
    let r = ok(&mut raw, "s", doc! { "dbStats": 1 }).await;
    assert_eq!(r.get_str("db"), Ok("s"));
    assert_eq!(r.get_i64("collections"), Ok(2), "{r}");
    assert_eq!(r.get_i64("views"), Ok(1), "{r}");
    assert_eq!(r.get_i64("objects"), Ok(11), "{r}");
    assert_eq!(r.get_i64("dataSize"), Ok(data), "{r}");
    assert_eq!(r.get_i64("storageSize"), Ok(data), "{r}");
    assert_eq!(r.get_f64("avgObjSize"), Ok(data as f64 / 11.0), "{r}");
    assert_eq!(r.get_i64("indexes"), Ok(3), "{r}");
    let index_size = r.get_i64("indexSize").unwrap();
    assert!(index_size > 11 * 8, "{r}");
    assert_eq!(r.get_i64("totalSize"), Ok(data + index_size), "{r}");
    assert_eq!(r.get_i64("scaleFactor"), Ok(1), "{r}");
    let scaled = ok(&mut raw, "s", doc! { "dbStats": 1, "scale": 1024.7 }).await;
    assert_eq!(scaled.get_i64("scaleFactor"), Ok(1024));
    assert_eq!(scaled.get_i64("dataSize"), Ok(data / 1024));
    assert_eq!(scaled.get_f64("avgObjSize"), Ok(data as f64 / 11.0));
    let empty = ok(&mut raw, "nothing", doc! { "dbStats": 1 }).await;
    assert_eq!(
        (empty.get_i64("collections"), empty.get_i64("objects")),
        (Ok(0), Ok(0))
    );
    for (scale, code) in [(Bson::Int32(0), 2), (Bson::String("big".into()), 14)] {
        let r = run(&mut raw, "s", doc! { "dbStats": 1, "scale": scale.clone() }).await;
        assert_eq!(r.get_i32("code"), Ok(code), "{scale}: {r}");
    }
    emu.shutdown().await;
}

#[tokio::test]
async fn db_stats_on_a_router_splits_its_figures_per_shard() {
    let emu = cluster(1, 2, BTreeMap::new()).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    two_ranged_chunks(&mut raw).await;
    let docs = vec![
        doc! { "_id": 1, "x": -1 },
        doc! { "_id": 2, "x": 1 },
        doc! { "_id": 3, "x": 2 },
    ];
    ok(
        &mut raw,
        "test",
        doc! { "insert": "c", "documents": docs.clone() },
    )
    .await;
    ok(
        &mut raw,
        "test",
        doc! { "insert": "u", "documents": [{ "_id": 9 }] },
    )
    .await;
    let before = completed(&emu);
    let r = ok(&mut raw, "test", doc! { "dbStats": 1 }).await;
    // dbStats asks every shard.
    assert_eq!(delta(&completed(&emu), &before), vec![1, 1]);
    let raw_stats = r.get_document("raw").unwrap();
    let shard = |name: &str| {
        raw_stats
            .iter()
            .find(|(k, _)| k.starts_with(&format!("{name}/")))
            .and_then(|(_, v)| v.as_document())
            .unwrap_or_else(|| panic!("no {name} in {raw_stats}"))
    };
    assert_eq!(shard("shard0").get_i64("objects"), Ok(2), "{r}");
    assert_eq!(shard("shard1").get_i64("objects"), Ok(2), "{r}");
    // shard0 holds the unsharded collection and a chunk of c; shard1 a chunk of c.
    assert_eq!(shard("shard0").get_i64("collections"), Ok(2), "{r}");
    assert_eq!(shard("shard1").get_i64("collections"), Ok(1), "{r}");
    assert_eq!(
        shard("shard1").get_i64("dataSize"),
        Ok(size(&docs[1]) + size(&docs[2]))
    );
    assert_eq!(r.get_i64("objects"), Ok(4), "{r}");
    assert_eq!(r.get_i64("collections"), Ok(2), "{r}");
    let data: i64 = docs.iter().map(size).sum::<i64>() + size(&doc! { "_id": 9 });
    assert_eq!(r.get_i64("dataSize"), Ok(data), "{r}");
    emu.shutdown().await;
}
