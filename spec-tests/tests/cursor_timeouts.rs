//! `timeoutMS` on cursors (stage 2), against the emulator: what bounds a cursor's `getMore`s in
//! each `timeoutMode`, what `maxTimeMS` they carry, and how a cursor is closed under its
//! timeout. Upstream bounds no `getMore` at all, which the first test shows.

mod common;

use std::time::Instant;

use common::{block_commands, client_with, is_timeout, max_time_of, ms, Server};
use futures::TryStreamExt;
use mongodb::{
    bson::{doc, Bson, Document},
    error::ErrorKind,
    options::{CursorType, TimeoutMode},
    Client, Collection, Database,
};

/// The id of a cursor over collection `c`, opened by a `find` of one document a batch.
async fn open_cursor(db: &Database) -> i64 {
    let reply = db
        .run_command(doc! { "find": "c", "batchSize": 1 })
        .await
        .expect("find");
    reply
        .get_document("cursor")
        .and_then(|c| c.get_i64("id"))
        .expect("cursor id")
}

/// A collection of `n` documents, written through a client without `timeoutMS`.
async fn collection_of(uri: &str, name: &str, n: i32) {
    let client = Client::with_uri_str(uri).await.expect("client");
    let coll = client.database("t").collection::<Document>(name);
    coll.drop().await.expect("drop");
    let docs: Vec<Document> = (0..n).map(|i| doc! { "_id": i }).collect();
    if docs.is_empty() {
        client
            .database("t")
            .create_collection(name)
            .await
            .expect("create");
    } else {
        coll.insert_many(docs).await.expect("insert");
    }
}

#[tokio::test]
async fn upstream_waits_out_a_blocked_get_more_and_the_fork_ends_it_at_the_cursor_deadline() {
    let server = Server::standalone();
    collection_of(&server.uri, "c", 5).await;

    // Upstream: the cursor's getMore has no bound, whatever the application wanted.
    let upstream = mongodb_upstream::Client::with_uri_str(&server.uri)
        .await
        .unwrap();
    let coll = upstream
        .database("t")
        .collection::<mongodb_upstream::bson::Document>("c");
    let mut cursor = coll
        .find(mongodb_upstream::bson::doc! {})
        .batch_size(2)
        .await
        .unwrap();
    block_commands(&server.uri, "getMore", 1, 1500).await;
    let started = Instant::now();
    let mut read = 0;
    while cursor.try_next().await.expect("upstream waits").is_some() {
        read += 1;
    }
    assert_eq!(read, 5);
    assert!(started.elapsed() >= ms(1400), "{:?}", started.elapsed());

    // The fork with timeoutMS=300: the cursor's life is bounded (the default mode), so the
    // blocked getMore ends at the deadline with the timeout error, and carries no maxTimeMS.
    let (client, sent) = client_with(&server.uri, Some(ms(300))).await;
    let coll = client.database("t").collection::<Document>("c");
    let mut cursor = coll.find(doc! {}).batch_size(2).await.expect("find");
    block_commands(&server.uri, "getMore", 1, 1500).await;
    let started = Instant::now();
    assert!(cursor.try_next().await.expect("buffered").is_some());
    assert!(cursor.try_next().await.expect("buffered").is_some());
    let error = cursor.try_next().await.expect_err("the getMore times out");
    assert!(is_timeout(&error), "{error:?}");
    assert!(started.elapsed() < ms(1000), "{:?}", started.elapsed());
    let find = sent.named("find").pop().expect("find sent");
    assert!(max_time_of(&find).is_some_and(|m| m <= 300), "{find:?}");
    let get_more = sent.named("getMore").pop().expect("getMore sent");
    assert_eq!(max_time_of(&get_more), None, "{get_more:?}");
}

#[tokio::test]
async fn buffered_documents_outlive_a_lifetime_deadline_and_the_next_get_more_does_not() {
    let server = Server::standalone();
    collection_of(&server.uri, "c", 5).await;
    let (client, sent) = client_with(&server.uri, None).await;
    let coll: Collection<Document> = client.database("t").collection("c");
    let mut cursor = coll
        .find(doc! {})
        .batch_size(3)
        .timeout(ms(200))
        .await
        .expect("find");
    tokio::time::sleep(ms(300)).await;
    for _ in 0..3 {
        assert!(cursor.try_next().await.expect("buffered").is_some());
    }
    let error = cursor
        .try_next()
        .await
        .expect_err("nothing left of the deadline");
    assert!(is_timeout(&error), "{error:?}");
    assert!(
        error.to_string().contains("before the getMore was sent"),
        "{error}"
    );
    assert!(sent.named("getMore").is_empty(), "no getMore was sent");
}

#[tokio::test]
async fn iteration_mode_gives_each_next_its_own_timeout_and_sends_no_max_time_ms() {
    let server = Server::standalone();
    collection_of(&server.uri, "c", 3).await;
    let (client, sent) = client_with(&server.uri, Some(ms(300))).await;
    let coll: Collection<Document> = client.database("t").collection("c");
    let mut cursor = coll
        .find(doc! {})
        .batch_size(1)
        .timeout_mode(TimeoutMode::Iteration)
        .await
        .expect("find");
    assert!(cursor.try_next().await.expect("first batch").is_some());
    // Two getMores of 200 ms each, 400 ms apart: 600 ms in all, twice the cursor's timeoutMS,
    // but each within the 300 ms its own call gets.
    block_commands(&server.uri, "getMore", 2, 200).await;
    for _ in 0..2 {
        tokio::time::sleep(ms(200)).await;
        assert!(cursor.try_next().await.expect("within its call").is_some());
    }
    let find = sent.named("find").pop().expect("find sent");
    assert_eq!(max_time_of(&find), None, "{find:?}");
    for get_more in sent.named("getMore") {
        assert_eq!(max_time_of(&get_more), None, "{get_more:?}");
    }

    // The same under the default mode times out on the second getMore.
    let mut cursor = coll.find(doc! {}).batch_size(1).await.expect("find");
    assert!(cursor.try_next().await.expect("first batch").is_some());
    block_commands(&server.uri, "getMore", 2, 200).await;
    assert!(cursor.try_next().await.expect("first getMore").is_some());
    let error = cursor
        .try_next()
        .await
        .expect_err("the cursor's life is over");
    assert!(is_timeout(&error), "{error:?}");
}

/// The cursor id of `kill`, a `killCursors` sent after a 200 ms `timeoutMS` cursor's deadline
/// passed, once it is checked to carry that timeout afresh (less the round trip).
fn refreshed_kill_of(kill: &Document) -> i64 {
    assert!(
        max_time_of(kill).is_some_and(|m| m > 100 && m <= 200),
        "{kill:?}"
    );
    match kill.get_array("cursors").expect("cursors")[0] {
        Bson::Int64(id) => id,
        ref other => panic!("cursor id {other:?}"),
    }
}

#[tokio::test]
async fn a_closed_cursor_is_killed_on_the_server_with_its_timeout_refreshed() {
    let server = Server::standalone();
    collection_of(&server.uri, "c", 5).await;
    let (client, sent) = client_with(&server.uri, Some(ms(200))).await;
    let coll: Collection<Document> = client.database("t").collection("c");
    let cursor = coll.find(doc! {}).batch_size(2).await.expect("find");
    // The cursor's own deadline passes; closing it still gets the whole timeoutMS.
    tokio::time::sleep(ms(300)).await;
    cursor.close().await.expect("killCursors");
    let kill = sent.named("killCursors").pop().expect("killCursors sent");
    let id = refreshed_kill_of(&kill);
    let error = client
        .database("t")
        .run_command(doc! { "getMore": id, "collection": "c" })
        .await
        .expect_err("the server's cursor is gone");
    assert!(
        matches!(*error.kind, ErrorKind::Command(ref e) if e.code == 43),
        "{error:?}"
    );

    // A close with its own timeout outlasts a killCursors slower than the cursor's.
    let cursor = coll.find(doc! {}).batch_size(2).await.expect("find");
    block_commands(&server.uri, "killCursors", 1, 300).await;
    cursor
        .close()
        .timeout(ms(1_000))
        .await
        .expect("the close's own timeout");
    let kill = sent.named("killCursors").pop().expect("killCursors sent");
    assert!(max_time_of(&kill).is_some_and(|m| m > 200), "{kill:?}");
}

#[tokio::test]
async fn forbidden_timeout_options_are_refused_before_anything_is_sent() {
    let server = Server::standalone();
    collection_of(&server.uri, "c", 1).await;
    let (client, sent) = client_with(&server.uri, None).await;
    let coll: Collection<Document> = client.database("t").collection("c");
    let invalid = |result: mongodb::error::Result<mongodb::Cursor<Document>>| match result {
        Err(e) => assert!(
            matches!(*e.kind, ErrorKind::InvalidArgument { .. }),
            "{e:?}"
        ),
        Ok(_) => panic!("accepted"),
    };
    invalid(
        coll.find(doc! {})
            .timeout_mode(TimeoutMode::CursorLifetime)
            .await,
    );
    invalid(
        coll.find(doc! {})
            .cursor_type(CursorType::Tailable)
            .timeout_mode(TimeoutMode::CursorLifetime)
            .timeout(ms(500))
            .await,
    );
    invalid(
        coll.aggregate([doc! { "$out": "other" }])
            .timeout_mode(TimeoutMode::Iteration)
            .timeout(ms(500))
            .await,
    );
    invalid(
        coll.find(doc! {})
            .cursor_type(CursorType::TailableAwait)
            .max_await_time(ms(500))
            .timeout(ms(500))
            .await,
    );
    assert!(sent.0.lock().unwrap().is_empty(), "nothing was sent");
}

#[tokio::test]
async fn a_change_stream_next_that_times_out_leaves_the_stream_to_resume() {
    let server = Server::replica_set();
    collection_of(&server.uri, "c", 0).await;
    let (client, sent) = client_with(&server.uri, Some(ms(300))).await;
    let coll: Collection<Document> = client.database("t").collection("c");
    let mut stream = coll.watch().await.expect("watch");
    block_commands(&server.uri, "getMore", 1, 1_000).await;
    let started = Instant::now();
    let error = stream
        .try_next()
        .await
        .expect_err("the call's getMore times out");
    assert!(is_timeout(&error), "{error:?}");
    assert!(started.elapsed() < ms(800), "{:?}", started.elapsed());
    assert_eq!(
        sent.named("aggregate").len(),
        1,
        "no resume within the timed-out call"
    );

    // The stream is still valid: the next call resumes it with a new aggregate and reads on.
    coll.insert_one(doc! { "_id": 1 }).await.expect("insert");
    let event = stream
        .try_next()
        .await
        .expect("the next call resumes")
        .expect("an event");
    assert_eq!(event.document_key, Some(doc! { "_id": 1 }), "{event:?}");
    assert_eq!(sent.named("aggregate").len(), 2, "one resume");
    for get_more in sent.named("getMore") {
        assert_eq!(max_time_of(&get_more), None, "{get_more:?}");
    }
}

#[tokio::test]
async fn a_run_command_get_more_honours_its_own_timeout() {
    let server = Server::standalone();
    collection_of(&server.uri, "c", 5).await;
    let (client, _) = client_with(&server.uri, None).await;
    let db = client.database("t");
    let id = open_cursor(&db).await;
    block_commands(&server.uri, "getMore", 1, 1_500).await;
    let started = Instant::now();
    let error = db
        .run_command(doc! { "getMore": id, "collection": "c" })
        .timeout(ms(200))
        .await
        .expect_err("its own timeout ends it");
    assert!(is_timeout(&error), "{error:?}");
    assert!(started.elapsed() < ms(1_000), "{:?}", started.elapsed());
}

#[tokio::test]
async fn the_emulator_refuses_max_time_ms_on_a_get_more_that_awaits_no_data_as_mongod_does() {
    // Why the fork never sends the deadline as a getMore's maxTimeMS: mongod refuses it on a
    // cursor that does not await data (BadValue, getmore_cmd.cpp's validateMaxTimeMS).
    let server = Server::standalone();
    collection_of(&server.uri, "c", 5).await;
    let (client, _) = client_with(&server.uri, None).await;
    let db = client.database("t");
    let id = open_cursor(&db).await;
    let error = db
        .run_command(doc! { "getMore": id, "collection": "c", "maxTimeMS": 100 })
        .await
        .expect_err("refused");
    assert!(
        matches!(*error.kind, ErrorKind::Command(ref e) if e.code == 2),
        "{error:?}"
    );
    // Without it the cursor goes on.
    db.run_command(doc! { "getMore": id, "collection": "c" })
        .await
        .expect("the cursor is still open");
}

/// The synchronous API closes a cursor the same way, blocking until the `killCursors` returns.
#[test]
fn the_sync_api_closes_a_cursor_with_its_timeout_refreshed() {
    use mongodb::event::{command::CommandEvent, EventHandler};
    let server = Server::standalone();
    let setup = mongodb::sync::Client::with_uri_str(&server.uri).expect("client");
    let coll = setup.database("t").collection::<Document>("sync");
    coll.drop().run().expect("drop");
    coll.insert_many((0..5).map(|i| doc! { "_id": i }))
        .run()
        .expect("insert");

    let mut options = mongodb::options::ClientOptions::parse(server.uri_with("timeoutMS=200"))
        .run()
        .expect("valid uri");
    let kills = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = kills.clone();
    options.command_event_handler = Some(EventHandler::callback(move |event: CommandEvent| {
        if let CommandEvent::Started(e) = event {
            if e.command_name == "killCursors" {
                sink.lock().unwrap().push(e.command);
            }
        }
    }));
    let client = mongodb::sync::Client::with_options(options).expect("client");
    let cursor = client
        .database("t")
        .collection::<Document>("sync")
        .find(doc! {})
        .batch_size(2)
        .run()
        .expect("find");
    // The cursor's own deadline passes; closing it still gets the whole timeoutMS.
    std::thread::sleep(ms(300));
    cursor.close().run().expect("killCursors");
    let kill = kills.lock().unwrap().pop().expect("killCursors sent");
    let id = refreshed_kill_of(&kill);
    let error = setup
        .database("t")
        .run_command(doc! { "getMore": id, "collection": "sync" })
        .run()
        .expect_err("the server's cursor is gone");
    assert!(
        matches!(*error.kind, ErrorKind::Command(ref e) if e.code == 43),
        "{error:?}"
    );
}
