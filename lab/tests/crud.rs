//! CRUD round trips and cursors through the real driver.

mod common;

use emulator::Topology;
use mongodb::bson::{doc, Document};
use mongodb::options::FindOptions;

async fn collect(mut cursor: mongodb::Cursor<Document>) -> Vec<Document> {
    let mut out = Vec::new();
    while cursor.advance().await.unwrap() {
        out.push(cursor.deserialize_current().unwrap());
    }
    out
}

#[tokio::test]
async fn crud_round_trip() {
    let emu = common::start(Topology::Standalone).await;
    let (client, _) = common::client(&emu.uri()).await;
    let coll = client.database("db").collection::<Document>("c");
    coll.insert_one(doc! { "_id": 1, "x": 11 }).await.unwrap();
    coll.insert_many(vec![doc! { "_id": 2, "x": 22 }, doc! { "_id": 3, "x": 33 }])
        .await
        .unwrap();
    let dup = coll.insert_one(doc! { "_id": 1 }).await.unwrap_err();
    assert!(format!("{dup:?}").contains("11000"), "{dup:?}");

    let found = collect(
        coll.find(doc! { "x": { "$gt": 15 } })
            .sort(doc! { "_id": -1 })
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        found,
        vec![doc! { "_id": 3, "x": 33 }, doc! { "_id": 2, "x": 22 }]
    );
    assert_eq!(
        coll.find_one(doc! { "_id": 2 }).await.unwrap(),
        Some(doc! { "_id": 2, "x": 22 })
    );

    let r = coll
        .update_one(doc! { "_id": 1 }, doc! { "$inc": { "x": 1 } })
        .await
        .unwrap();
    assert_eq!((r.matched_count, r.modified_count), (1, 1));
    let r = coll
        .update_many(doc! {}, doc! { "$set": { "y": true } })
        .await
        .unwrap();
    assert_eq!(r.modified_count, 3);
    let r = coll
        .update_one(doc! { "_id": 9 }, doc! { "$set": { "x": 99 } })
        .upsert(true)
        .await
        .unwrap();
    assert_eq!(r.upserted_id, Some(mongodb::bson::Bson::Int32(9)));
    let r = coll
        .replace_one(doc! { "_id": 9 }, doc! { "z": 1 })
        .await
        .unwrap();
    assert_eq!(r.modified_count, 1);

    let before = coll
        .find_one_and_update(doc! { "_id": 2 }, doc! { "$set": { "x": 0 } })
        .await
        .unwrap();
    assert_eq!(before, Some(doc! { "_id": 2, "x": 22, "y": true }));
    let deleted = coll.find_one_and_delete(doc! { "_id": 9 }).await.unwrap();
    assert_eq!(deleted, Some(doc! { "_id": 9, "z": 1 }));

    assert_eq!(coll.count_documents(doc! { "y": true }).await.unwrap(), 3);
    assert_eq!(coll.estimated_document_count().await.unwrap(), 3);
    let mut xs = coll.distinct("x", doc! {}).await.unwrap();
    xs.sort_by_key(|b| b.as_i32());
    assert_eq!(xs, vec![0.into(), 12.into(), 33.into()]);

    let agg = collect(
        coll.aggregate(vec![
            doc! { "$match": { "y": true } },
            doc! { "$group": { "_id": null, "n": { "$sum": 1 } } },
        ])
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(agg, vec![doc! { "_id": null, "n": 3 }]);

    let r = coll.delete_one(doc! { "_id": 1 }).await.unwrap();
    assert_eq!(r.deleted_count, 1);
    let r = coll.delete_many(doc! {}).await.unwrap();
    assert_eq!(r.deleted_count, 2);

    // Catalog.
    let db = client.database("db");
    db.create_collection("made").await.unwrap();
    assert!(db.create_collection("made").await.is_err());
    let mut names = db.list_collection_names().await.unwrap();
    names.sort();
    assert_eq!(names, vec!["c".to_string(), "made".to_string()]);
    let made = db.collection::<Document>("made");
    made.create_index(mongodb::IndexModel::builder().keys(doc! { "a": 1 }).build())
        .await
        .unwrap();
    let idx = made.list_index_names().await.unwrap();
    assert!(idx.contains(&"a_1".to_string()), "{idx:?}");
    made.drop_index("a_1").await.unwrap();
    made.drop().await.unwrap();
    assert!(client
        .list_database_names()
        .await
        .unwrap()
        .contains(&"db".to_string()));
    db.drop().await.unwrap();
    emu.shutdown().await;
}

#[tokio::test]
async fn cursor_batches_and_kill_cursors() {
    let emu = common::start(Topology::Standalone).await;
    let (client, events) = common::client(&emu.uri()).await;
    let coll = client.database("db").collection::<Document>("c");
    coll.insert_many((0..10).map(|i| doc! { "_id": i }))
        .await
        .unwrap();
    let all = collect(
        coll.find(doc! {})
            .with_options(FindOptions::builder().batch_size(3).build())
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(all.len(), 10);
    assert_eq!(events.started("getMore"), 3, "batches of 3: 3 + 3 + 3 + 1");

    // Dropping a live cursor kills it on the server.
    let mut cursor = coll.find(doc! {}).batch_size(2).await.unwrap();
    assert!(cursor.advance().await.unwrap());
    drop(cursor);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while events.started("killCursors") == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "killCursors not sent"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }

    // Raw protocol: cursor ids, getMore, killCursors, CursorNotFound.
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let r = raw
        .command(&doc! { "find": "c", "batchSize": 4, "$db": "db" })
        .await
        .unwrap();
    let cur = r.get_document("cursor").unwrap();
    let id = cur.get_i64("id").unwrap();
    assert_ne!(id, 0);
    assert_eq!(cur.get_str("ns"), Ok("db.c"));
    assert_eq!(cur.get_array("firstBatch").unwrap().len(), 4);
    let r = raw
        .command(&doc! { "getMore": id, "collection": "c", "batchSize": 4, "$db": "db" })
        .await
        .unwrap();
    assert_eq!(
        r.get_document("cursor")
            .unwrap()
            .get_array("nextBatch")
            .unwrap()
            .len(),
        4
    );
    let r = raw
        .command(&doc! { "killCursors": "c", "cursors": [id, 12345i64], "$db": "db" })
        .await
        .unwrap();
    assert_eq!(
        r.get_array("cursorsKilled").unwrap(),
        &vec![mongodb::bson::Bson::Int64(id)]
    );
    assert_eq!(
        r.get_array("cursorsNotFound").unwrap(),
        &vec![mongodb::bson::Bson::Int64(12345)]
    );
    let r = raw
        .command(&doc! { "getMore": id, "collection": "c", "$db": "db" })
        .await
        .unwrap();
    assert_eq!(r.get_i32("code"), Ok(43));
    assert_eq!(r.get_str("codeName"), Ok("CursorNotFound"));

    // A session-less cursor dies with its connection.
    let r = raw
        .command(&doc! { "find": "c", "batchSize": 1, "$db": "db" })
        .await
        .unwrap();
    let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    drop(raw);
    let mut raw2 = common::RawClient::connect(emu.addresses()[0]).await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let r = raw2
            .command(&doc! { "getMore": id, "collection": "c", "$db": "db" })
            .await
            .unwrap();
        if r.get_i32("code") == Ok(43) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    emu.shutdown().await;
}

#[tokio::test]
async fn get_more_failures_keep_the_cursor() {
    let emu = common::start(common::rs(1)).await;
    let (client, events) = common::client(&emu.uri()).await;
    let coll = client.database("db").collection::<Document>("c");
    coll.insert_many(vec![
        doc! { "_id": 1, "a": 1 },
        doc! { "_id": 2, "a": 2 },
        doc! { "_id": 3, "a": 3 },
    ])
    .await
    .unwrap();
    client
        .database("admin")
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 2 },
            "data": {
                "failCommands": ["getMore"],
                "errorCode": 2,
                "errorLabels": ["RetryableError", "SystemOverloadedError"],
            },
        })
        .await
        .unwrap();
    let docs = collect(
        coll.find(doc! {})
            .sort(doc! { "a": 1 })
            .batch_size(2)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(docs.len(), 3);
    assert_eq!(docs[2], doc! { "_id": 3, "a": 3 });
    assert_eq!(events.started("getMore"), 3);
    emu.shutdown().await;
}

#[tokio::test]
async fn client_bulk_write() {
    let emu = common::start(common::rs(1)).await;
    let (client, events) = common::client(&emu.uri()).await;
    let ns = client
        .database("db")
        .collection::<Document>("c")
        .namespace();
    let models = vec![
        mongodb::options::WriteModel::InsertOne(
            mongodb::options::InsertOneModel::builder()
                .namespace(ns.clone())
                .document(doc! { "_id": 1 })
                .build(),
        ),
        mongodb::options::WriteModel::UpdateOne(
            mongodb::options::UpdateOneModel::builder()
                .namespace(ns.clone())
                .filter(doc! { "_id": 1 })
                .update(doc! { "$set": { "x": 1 } })
                .build(),
        ),
        mongodb::options::WriteModel::DeleteMany(
            mongodb::options::DeleteManyModel::builder()
                .namespace(ns.clone())
                .filter(doc! { "_id": 5 })
                .build(),
        ),
    ];
    let r = client.bulk_write(models).await.unwrap();
    assert_eq!(
        (
            r.inserted_count,
            r.matched_count,
            r.modified_count,
            r.deleted_count
        ),
        (1, 1, 1, 0)
    );
    assert_eq!(events.started("bulkWrite"), 1);
    let dup = vec![mongodb::options::WriteModel::InsertOne(
        mongodb::options::InsertOneModel::builder()
            .namespace(ns)
            .document(doc! { "_id": 1 })
            .build(),
    )];
    assert!(client.bulk_write(dup).await.is_err());
    emu.shutdown().await;
}

#[tokio::test]
async fn coll_stats_reports_capped_options() {
    let emu = common::start(Topology::Standalone).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let r = raw
        .command(&doc! { "create": "capped", "capped": true, "size": 4096, "$db": "db" })
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    let r = raw
        .command(&doc! {
            "aggregate": "capped",
            "pipeline": [
                { "$collStats": { "storageStats": {} } },
                { "$project": { "capped": "$storageStats.capped", "maxSize": "$storageStats.maxSize" } },
            ],
            "cursor": {},
            "$db": "db",
        })
        .await
        .unwrap();
    let batch = r
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap();
    let stats = batch[0].as_document().unwrap();
    assert_eq!(stats.get_bool("capped"), Ok(true), "{stats}");
    assert_eq!(stats.get_i32("maxSize"), Ok(4096), "{stats}");
    emu.shutdown().await;
}

#[tokio::test]
async fn search_index_commands_answer_like_a_mongod_without_search() {
    let emu = common::start(common::rs(1)).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    for command in [
        doc! { "createSearchIndexes": "c", "indexes": [{ "definition": {} }], "$db": "db" },
        doc! { "updateSearchIndex": "c", "name": "default", "definition": {}, "$db": "db" },
        doc! { "dropSearchIndex": "c", "name": "default", "$db": "db" },
        doc! { "aggregate": "c", "pipeline": [{ "$listSearchIndexes": {} }], "cursor": {}, "$db": "db" },
    ] {
        let reply = raw.command(&command).await.unwrap();
        assert_eq!(reply.get_f64("ok"), Ok(0.0), "{reply}");
        assert_eq!(reply.get_i32("code"), Ok(31082), "{reply}");
        assert_eq!(reply.get_str("codeName"), Ok("SearchNotEnabled"), "{reply}");
    }
    emu.shutdown().await;
}
