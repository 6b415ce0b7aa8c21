//! `timeoutMS` on sessions and transactions (stage 3), against the emulator: a session's own
//! commands under its `defaultTimeoutMS`, and the convenient transaction API bounded by one
//! deadline instead of its fixed 120 seconds. Upstream bounds neither, which the first test
//! shows.

mod common;

use std::time::Instant;

use common::{client_with, is_timeout, max_time_of, ms, Server};
use futures::FutureExt;
use mongodb::{
    bson::{doc, Bson, Document},
    error::{Error, ErrorKind, TRANSIENT_TRANSACTION_ERROR},
    options::SessionOptions,
    Client, Collection,
};

/// Sets `failCommand` with `mode` and `data`.
async fn fail_command(uri: &str, mode: Bson, data: Document) {
    let client = Client::with_uri_str(uri).await.expect("client");
    client
        .database("admin")
        .run_command(doc! { "configureFailPoint": "failCommand", "mode": mode, "data": data })
        .await
        .expect("configureFailPoint");
}

async fn empty_collection(uri: &str) {
    let client = Client::with_uri_str(uri).await.expect("client");
    let db = client.database("t");
    db.collection::<Document>("c").drop().await.expect("drop");
    db.create_collection("c").await.expect("create");
}

#[tokio::test]
async fn upstream_waits_out_a_blocked_commit_and_the_fork_ends_it_at_the_sessions_timeout() {
    let server = Server::replica_set();
    empty_collection(&server.uri).await;
    let block = doc! {
        "failCommands": ["commitTransaction"], "blockConnection": true, "blockTimeMS": 1_500,
    };

    let upstream = mongodb_upstream::Client::with_uri_str(&server.uri)
        .await
        .unwrap();
    let coll = upstream
        .database("t")
        .collection::<mongodb_upstream::bson::Document>("c");
    let mut session = upstream.start_session().await.unwrap();
    session.start_transaction().await.unwrap();
    coll.insert_one(mongodb_upstream::bson::doc! { "_id": 1 })
        .session(&mut session)
        .await
        .unwrap();
    fail_command(&server.uri, doc! { "times": 1 }.into(), block.clone()).await;
    let started = Instant::now();
    session.commit_transaction().await.expect("upstream waits");
    assert!(started.elapsed() >= ms(1_400), "{:?}", started.elapsed());

    // The fork: the session's defaultTimeoutMS bounds the commit, sent with maxTimeMS.
    let (client, sent) = client_with(&server.uri, None).await;
    let coll: Collection<Document> = client.database("t").collection("c");
    let mut session = client
        .start_session()
        .with_options(SessionOptions::builder().default_timeout(ms(300)).build())
        .await
        .expect("session");
    session.start_transaction().await.expect("start");
    coll.insert_one(doc! { "_id": 2 })
        .session(&mut session)
        .await
        .expect("insert");
    fail_command(&server.uri, doc! { "times": 1 }.into(), block).await;
    let started = Instant::now();
    let error = session
        .commit_transaction()
        .await
        .expect_err("the commit times out");
    assert!(is_timeout(&error), "{error:?}");
    assert!(started.elapsed() < ms(1_000), "{:?}", started.elapsed());
    let commit = sent.named("commitTransaction").pop().expect("commit sent");
    assert!(max_time_of(&commit).is_some_and(|m| m <= 300), "{commit:?}");
}

#[tokio::test]
async fn a_convenient_transaction_ends_at_its_timeout_with_the_last_transient_error_as_cause() {
    let server = Server::replica_set();
    empty_collection(&server.uri).await;
    // Every insert fails with a transient transaction error: without timeoutMS the loop would
    // retry for its fixed 120 seconds.
    fail_command(
        &server.uri,
        "alwaysOn".into(),
        doc! {
            "failCommands": ["insert"], "errorCode": 24,
            "errorLabels": [TRANSIENT_TRANSACTION_ERROR],
        },
    )
    .await;
    let (client, sent) = client_with(&server.uri, None).await;
    let coll: Collection<Document> = client.database("t").collection("c");
    let mut session = client.start_session().await.expect("session");
    let started = Instant::now();
    let error = session
        .start_transaction()
        .timeout(ms(400))
        .and_run(coll, |session, coll| {
            async move {
                coll.insert_one(doc! { "_id": 1 })
                    .session(&mut *session)
                    .await?;
                Ok(())
            }
            .boxed()
        })
        .await
        .expect_err("the deadline ends the retries");
    let elapsed = started.elapsed();
    fail_command(&server.uri, "off".into(), doc! {}).await;
    assert!(is_timeout(&error), "{error:?}");
    assert!(elapsed < ms(2_000), "{elapsed:?}");
    // The driver keeps the cause boxed; `source()` may hand out the box or the error itself.
    let source = std::error::Error::source(&error).expect("a cause");
    let cause = source
        .downcast_ref::<Error>()
        .or_else(|| source.downcast_ref::<Box<Error>>().map(|boxed| &**boxed))
        .expect("the driver's error");
    assert!(
        cause.contains_label(TRANSIENT_TRANSACTION_ERROR),
        "{cause:?}"
    );
    let inserts = sent.named("insert");
    assert!(inserts.len() >= 2, "retried: {}", inserts.len());
    assert!(
        inserts
            .iter()
            .all(|i| max_time_of(i).is_some_and(|m| m <= 400)),
        "each statement runs under what remains: {inserts:?}"
    );

    // After the call the session's statements are free of its deadline again.
    session.start_transaction().await.expect("start");
    let coll: Collection<Document> = client.database("t").collection("c");
    coll.insert_one(doc! { "_id": 3 })
        .session(&mut session)
        .timeout(ms(5_000))
        .await
        .expect("a statement may set its own timeout outside and_run");
    session.abort_transaction().await.expect("abort");
}

#[tokio::test]
async fn a_statement_may_not_set_its_own_timeout_inside_a_convenient_transaction() {
    let server = Server::replica_set();
    empty_collection(&server.uri).await;
    let (client, sent) = client_with(&server.uri, Some(ms(2_000))).await;
    let coll: Collection<Document> = client.database("t").collection("c");
    let mut session = client.start_session().await.expect("session");
    let error = session
        .start_transaction()
        .and_run(coll, |session, coll| {
            async move {
                coll.insert_one(doc! { "_id": 1 })
                    .session(&mut *session)
                    .timeout(ms(100))
                    .await?;
                Ok(())
            }
            .boxed()
        })
        .await
        .expect_err("refused");
    assert!(
        matches!(*error.kind, ErrorKind::InvalidArgument { .. }),
        "{error:?}"
    );
    assert!(
        sent.0.lock().unwrap().is_empty(),
        "nothing was sent, not even an abort"
    );
}

#[tokio::test]
async fn a_dropped_convenient_transaction_leaves_no_deadline_on_its_session() {
    let server = Server::replica_set();
    empty_collection(&server.uri).await;
    let (client, _sent) = client_with(&server.uri, None).await;
    let coll: Collection<Document> = client.database("t").collection("c");
    let mut session = client.start_session().await.expect("session");
    // The application gives up on the call (its own deadline) while the callback still runs.
    let run =
        session
            .start_transaction()
            .timeout(ms(300))
            .and_run(coll.clone(), |session, coll| {
                async move {
                    coll.insert_one(doc! { "_id": 1 })
                        .session(&mut *session)
                        .await?;
                    tokio::time::sleep(ms(10_000)).await;
                    Ok(())
                }
                .boxed()
            });
    tokio::time::timeout(ms(100), run)
        .await
        .expect_err("dropped by the application");
    session.abort_transaction().await.expect("abort");

    // Well past the dropped run's deadline, a manual transaction's statements are not bound by
    // it, and may set their own timeout (inside a running convenient transaction they may not).
    tokio::time::sleep(ms(400)).await;
    session.start_transaction().await.expect("start");
    coll.insert_one(doc! { "_id": 2 })
        .session(&mut session)
        .timeout(ms(5_000))
        .await
        .expect("no limit left from the dropped run");
    session.commit_transaction().await.expect("commit");
}
