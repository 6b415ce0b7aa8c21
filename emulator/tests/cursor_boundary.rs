//! Cursor exhaustion at an exact batch boundary, as mongod decides it (`PlanExecutor::isEOF()`
//! after a batch): a batch that fills up exactly while the end is not yet known keeps the cursor
//! open, and the next getMore returns an empty batch with id 0; a reached `limit`, an `_id`
//! lookup, a missing collection and queued results (listCollections, listIndexes) close at once.

mod common;

use bson::{doc, Bson, Document};
use common::RawClient;
use emulator::Topology;

async fn seeded(n: i32) -> (emulator::Emulator, RawClient) {
    let emu = common::start(Topology::Standalone).await;
    let mut c = RawClient::connect(emu.addresses()[0]).await;
    if n > 0 {
        let docs: Vec<Bson> = (0..n)
            .map(|i| Bson::Document(doc! { "_id": i, "x": i % 3 }))
            .collect();
        let r = c
            .command(&doc! { "insert": "c", "documents": docs, "$db": "db" })
            .await
            .unwrap();
        assert_eq!(r.get_i32("n"), Ok(n));
    }
    (emu, c)
}

/// The cursor document of a reply: (batch length, cursor id).
fn batch(reply: &Document, key: &str) -> (usize, i64) {
    let cursor = reply
        .get_document("cursor")
        .unwrap_or_else(|_| panic!("{reply}"));
    (
        cursor.get_array(key).unwrap().len(),
        cursor.get_i64("id").unwrap(),
    )
}

/// Runs `cmd`, then getMores with `batch_size` until id 0: the batch lengths, first included.
async fn drain(
    c: &mut RawClient,
    cmd: Document,
    coll: &str,
    batch_size: Option<i32>,
) -> Vec<usize> {
    let reply = c.command(&cmd).await.unwrap();
    let (n, mut id) = batch(&reply, "firstBatch");
    let mut lengths = vec![n];
    // Bounded: no test here needs more than 20 getMores.
    for _ in 0..20 {
        if id == 0 {
            return lengths;
        }
        let mut get_more = doc! { "getMore": id, "collection": coll, "$db": "db" };
        if let Some(b) = batch_size {
            get_more.insert("batchSize", b);
        }
        let reply = c.command(&get_more).await.unwrap();
        let (n, next) = batch(&reply, "nextBatch");
        lengths.push(n);
        id = next;
    }
    panic!("cursor not exhausted after 20 getMores: {lengths:?}");
}

#[tokio::test]
async fn find_keeps_the_cursor_open_when_a_batch_fills_exactly() {
    let (emu, mut c) = seeded(6).await;
    // batchSize equal to the result count: open, then an empty batch closes it.
    let find = doc! { "find": "c", "batchSize": 6, "$db": "db" };
    assert_eq!(drain(&mut c, find, "c", Some(6)).await, [6, 0]);
    // batchSize 3 over 6: 3, 3 (full: still open), then empty.
    let find = doc! { "find": "c", "batchSize": 3, "$db": "db" };
    assert_eq!(drain(&mut c, find, "c", Some(3)).await, [3, 3, 0]);
    // A batch with room closes at once: 4 then 2 of a getMore of 4.
    let find = doc! { "find": "c", "batchSize": 4, "$db": "db" };
    assert_eq!(drain(&mut c, find, "c", Some(4)).await, [4, 2]);
    // A getMore without batchSize takes everything and reads past the end.
    let find = doc! { "find": "c", "batchSize": 2, "$db": "db" };
    assert_eq!(drain(&mut c, find, "c", None).await, [2, 4]);
    // A blocking sort finds its end only by reading past it too.
    let find = doc! { "find": "c", "sort": { "x": 1 }, "batchSize": 6, "$db": "db" };
    assert_eq!(drain(&mut c, find, "c", Some(6)).await, [6, 0]);
    // A filter: the scan has not seen the end of the collection.
    let find = doc! { "find": "c", "filter": { "x": 0 }, "batchSize": 2, "$db": "db" };
    assert_eq!(drain(&mut c, find, "c", Some(2)).await, [2, 0]);
    // batchSize 0 on an existing collection opens a cursor without reading anything.
    let find = doc! { "find": "c", "batchSize": 0, "$db": "db" };
    assert_eq!(drain(&mut c, find, "c", None).await, [0, 6]);
    emu.shutdown().await;
}

#[tokio::test]
async fn default_first_batch_of_101_fills_exactly() {
    let (emu, mut c) = seeded(101).await;
    let find = doc! { "find": "c", "$db": "db" };
    assert_eq!(drain(&mut c, find, "c", None).await, [101, 0]);
    let find = doc! { "find": "c", "filter": { "_id": { "$lt": 100 } }, "$db": "db" };
    assert_eq!(drain(&mut c, find, "c", None).await, [100]);
    emu.shutdown().await;
}

#[tokio::test]
async fn find_closes_at_once_when_the_end_is_known() {
    let (emu, mut c) = seeded(6).await;
    // A limit that is reached: the limit stage is at its end.
    let find = doc! { "find": "c", "limit": 4, "batchSize": 4, "$db": "db" };
    assert_eq!(drain(&mut c, find, "c", Some(4)).await, [4]);
    let find = doc! { "find": "c", "limit": 4, "batchSize": 2, "$db": "db" };
    assert_eq!(drain(&mut c, find, "c", Some(2)).await, [2, 2]);
    let find = doc! { "find": "c", "limit": 3, "sort": { "_id": -1 }, "batchSize": 3, "$db": "db" };
    assert_eq!(drain(&mut c, find, "c", Some(3)).await, [3]);
    // A limit not reached leaves the end to the scan.
    let find = doc! { "find": "c", "limit": 10, "batchSize": 6, "$db": "db" };
    assert_eq!(drain(&mut c, find, "c", Some(6)).await, [6, 0]);
    // A limit enforced by a blocking sort: the sort finds its end only by reading past it.
    let find = doc! { "find": "c", "limit": 3, "sort": { "x": 1 }, "batchSize": 3, "$db": "db" };
    assert_eq!(drain(&mut c, find, "c", Some(3)).await, [3, 0]);
    // An `_id` point lookup.
    let find = doc! { "find": "c", "filter": { "_id": 2 }, "batchSize": 1, "$db": "db" };
    assert_eq!(drain(&mut c, find, "c", Some(1)).await, [1]);
    // A collection that does not exist, even with batchSize 0.
    let find = doc! { "find": "nothing", "batchSize": 0, "$db": "db" };
    assert_eq!(drain(&mut c, find, "nothing", None).await, [0]);
    emu.shutdown().await;
}

#[tokio::test]
async fn aggregate_closes_only_after_reading_past_the_end() {
    let (emu, mut c) = seeded(5).await;
    // The example: 5 documents, batchSize 1: five batches of one, then an empty one.
    let agg = doc! { "aggregate": "c", "pipeline": [], "cursor": { "batchSize": 1 }, "$db": "db" };
    assert_eq!(drain(&mut c, agg, "c", Some(1)).await, [1, 1, 1, 1, 1, 0]);
    // `$limit` does not make the end known to an aggregation cursor.
    let agg = doc! {
        "aggregate": "c",
        "pipeline": [{ "$sort": { "_id": 1 } }, { "$limit": 2 }],
        "cursor": { "batchSize": 2 },
        "$db": "db",
    };
    assert_eq!(drain(&mut c, agg, "c", Some(2)).await, [2, 0]);
    // Room left in the batch: closed at once.
    let agg = doc! { "aggregate": "c", "pipeline": [], "cursor": {}, "$db": "db" };
    assert_eq!(drain(&mut c, agg, "c", None).await, [5]);
    emu.shutdown().await;
}

#[tokio::test]
async fn queued_catalog_results_close_with_their_last_document() {
    let (emu, mut c) = seeded(1).await;
    for name in ["d", "e"] {
        let r = c
            .command(&doc! { "create": name, "$db": "db" })
            .await
            .unwrap();
        assert_eq!(r.get_f64("ok"), Ok(1.0));
    }
    // Three collections, batchSize 3: mongod's queued results know their end.
    let list = doc! { "listCollections": 1, "cursor": { "batchSize": 3 }, "$db": "db" };
    assert_eq!(
        drain(&mut c, list, "$cmd.listCollections", Some(3)).await,
        [3]
    );
    let list = doc! { "listCollections": 1, "cursor": { "batchSize": 1 }, "$db": "db" };
    assert_eq!(
        drain(&mut c, list, "$cmd.listCollections", Some(1)).await,
        [1, 1, 1]
    );
    let r = c
        .command(&doc! { "createIndexes": "c", "indexes": [{ "key": { "x": 1 }, "name": "x_1" }], "$db": "db" })
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    let list = doc! { "listIndexes": "c", "cursor": { "batchSize": 2 }, "$db": "db" };
    assert_eq!(drain(&mut c, list, "c", Some(2)).await, [2]);
    emu.shutdown().await;
}
