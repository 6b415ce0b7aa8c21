//! Retryable-write deduplication and transactions.

mod common;

use mongodb::bson::{doc, spec::BinarySubtype, Binary, Document};

fn lsid(byte: u8) -> Document {
    doc! { "id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![byte; 16] } }
}

#[tokio::test]
async fn retryable_writes_are_deduplicated() {
    let emu = common::start(common::rs(1)).await;
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let insert = doc! {
        "insert": "c", "documents": [{ "_id": 1, "n": 1 }], "$db": "db", "lsid": lsid(1), "txnNumber": 5i64,
    };
    let first = raw.command(&insert).await.unwrap();
    assert_eq!(first.get_i32("n"), Ok(1), "{first}");
    let again = raw.command(&insert).await.unwrap();
    assert_eq!(again.get_i32("n"), Ok(1), "stored reply: {again}");
    assert!(
        again.get("writeErrors").is_none(),
        "not re-executed: {again}"
    );
    let count = raw
        .command(&doc! { "count": "c", "$db": "db" })
        .await
        .unwrap();
    assert_eq!(count.get_i32("n"), Ok(1));
    let mut older = insert.clone();
    older.insert("txnNumber", 4i64);
    let r = raw.command(&older).await.unwrap();
    assert_eq!(r.get_i32("code"), Ok(225));

    // The driver's own retry after a closed connection does not double-apply.
    let (client, events) = common::client(&emu.uri()).await;
    client
        .database("admin")
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": { "failCommands": ["insert"], "writeConcernError": { "code": 91, "errmsg": "Replication is being shut down" } },
        })
        .await
        .unwrap();
    let coll = client.database("db").collection::<Document>("d");
    coll.insert_one(doc! { "_id": 1 }).await.unwrap();
    assert_eq!(
        events.started("insert"),
        2,
        "retried after the write concern error"
    );
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1);

    // Standalone servers reject transaction numbers.
    let standalone = common::start(emulator::Topology::Standalone).await;
    let mut raw = common::RawClient::connect(standalone.addresses()[0]).await;
    let r = raw.command(&insert).await.unwrap();
    assert_eq!(r.get_i32("code"), Ok(20));
    standalone.shutdown().await;
    emu.shutdown().await;
}

#[tokio::test]
async fn transactions_commit_and_abort_in_isolation() {
    let emu = common::start(common::rs(1)).await;
    let (client, _) = common::client(&emu.uri()).await;
    let coll = client.database("db").collection::<Document>("c");
    coll.insert_one(doc! { "_id": 0 }).await.unwrap();

    let mut session = client.start_session().await.unwrap();
    session.start_transaction().await.unwrap();
    coll.insert_one(doc! { "_id": 1 })
        .session(&mut session)
        .await
        .unwrap();
    assert_eq!(
        coll.count_documents(doc! {}).await.unwrap(),
        1,
        "invisible outside"
    );
    assert_eq!(
        coll.count_documents(doc! {})
            .session(&mut session)
            .await
            .unwrap(),
        2,
        "visible inside"
    );
    session.commit_transaction().await.unwrap();
    assert_eq!(
        coll.count_documents(doc! {}).await.unwrap(),
        2,
        "visible after commit"
    );
    // A second commit succeeds.
    session.commit_transaction().await.unwrap();

    session.start_transaction().await.unwrap();
    coll.insert_one(doc! { "_id": 2 })
        .session(&mut session)
        .await
        .unwrap();
    session.abort_transaction().await.unwrap();
    assert_eq!(
        coll.count_documents(doc! {}).await.unwrap(),
        2,
        "aborted writes vanish"
    );

    // Failpoint errors inside a transaction do not abort it.
    session.start_transaction().await.unwrap();
    coll.insert_one(doc! { "_id": 5 })
        .session(&mut session)
        .await
        .unwrap();
    client
        .database("admin")
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": { "failCommands": ["insert"], "errorCode": 112, "errorLabels": ["TransientTransactionError"] },
        })
        .await
        .unwrap();
    let err = coll
        .insert_one(doc! { "_id": 3 })
        .session(&mut session)
        .await
        .unwrap_err();
    assert!(err.contains_label("TransientTransactionError"));
    coll.insert_one(doc! { "_id": 4 })
        .session(&mut session)
        .await
        .unwrap();
    session.commit_transaction().await.unwrap();
    let ids: Vec<i32> = {
        let mut c = coll.find(doc! {}).sort(doc! { "_id": 1 }).await.unwrap();
        let mut v = Vec::new();
        while c.advance().await.unwrap() {
            v.push(c.deserialize_current().unwrap().get_i32("_id").unwrap());
        }
        v
    };
    assert_eq!(ids, vec![0, 1, 4, 5]);

    // Raw protocol: unknown transaction numbers.
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let r = raw
        .command(&doc! {
            "find": "c", "$db": "db", "lsid": lsid(9), "txnNumber": 1i64, "autocommit": false,
        })
        .await
        .unwrap();
    assert_eq!(r.get_i32("code"), Ok(251));
    let labels: Vec<&str> = r
        .get_array("errorLabels")
        .unwrap()
        .iter()
        .filter_map(|l| l.as_str())
        .collect();
    assert_eq!(labels, ["TransientTransactionError"]);
    let r = raw
        .command(&doc! {
            "abortTransaction": 1, "$db": "admin", "lsid": lsid(9), "txnNumber": 1i64, "autocommit": false,
        })
        .await
        .unwrap();
    assert_eq!(r.get_i32("code"), Ok(251));
    emu.shutdown().await;
}

#[tokio::test]
async fn write_conflicts_between_transactions() {
    let emu = common::start(common::rs(1)).await;
    let (client, _) = common::client(&emu.uri()).await;
    let coll = client.database("db").collection::<Document>("c");
    coll.insert_one(doc! { "_id": 0 }).await.unwrap();
    let mut s0 = client.start_session().await.unwrap();
    let mut s1 = client.start_session().await.unwrap();
    s0.start_transaction().await.unwrap();
    coll.insert_one(doc! { "_id": 1 })
        .session(&mut s0)
        .await
        .unwrap();
    s1.start_transaction().await.unwrap();
    let err = coll
        .insert_one(doc! { "_id": 1 })
        .session(&mut s1)
        .await
        .unwrap_err();
    assert!(err.contains_label("TransientTransactionError"), "{err:?}");
    assert!(format!("{err:?}").contains("WriteConflict"), "{err:?}");
    s0.commit_transaction().await.unwrap();
    let err = s1.commit_transaction().await.unwrap_err();
    assert!(format!("{err:?}").contains("NoSuchTransaction"), "{err:?}");
    assert!(err.contains_label("TransientTransactionError"));

    // Different documents do not conflict.
    s0.start_transaction().await.unwrap();
    s1.start_transaction().await.unwrap();
    coll.update_one(doc! { "_id": 0 }, doc! { "$set": { "a": 1 } })
        .session(&mut s0)
        .await
        .unwrap();
    coll.update_one(doc! { "_id": 1 }, doc! { "$set": { "b": 1 } })
        .session(&mut s1)
        .await
        .unwrap();
    s0.commit_transaction().await.unwrap();
    s1.commit_transaction().await.unwrap();
    let mut c = coll.find(doc! {}).sort(doc! { "_id": 1 }).await.unwrap();
    let mut docs = Vec::new();
    while c.advance().await.unwrap() {
        docs.push(c.deserialize_current().unwrap());
    }
    assert_eq!(
        docs,
        vec![doc! { "_id": 0, "a": 1 }, doc! { "_id": 1, "b": 1 }]
    );

    // An unsatisfiable write concern: the write applies, the reply carries a write concern error.
    let mut raw = common::RawClient::connect(emu.addresses()[0]).await;
    let r = raw
        .command(&doc! { "insert": "c", "documents": [{ "_id": 7 }], "writeConcern": { "w": 10 }, "$db": "db" })
        .await
        .unwrap();
    assert_eq!(r.get_i32("n"), Ok(1));
    assert_eq!(
        r.get_document("writeConcernError").unwrap().get_i32("code"),
        Ok(100)
    );
    emu.shutdown().await;
}
