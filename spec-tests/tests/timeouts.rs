//! `timeoutMS` (client-side operation timeouts, stage 1), against the emulator.
//!
//! Upstream 3.9.1 rejects `timeoutMS` in the connection string; the fork honours it at every
//! level (client, database, collection, operation). These tests show the difference, then check
//! what the fork sends (`maxTimeMS` from the time remaining, no deprecated `maxTimeMS`/`wtimeout`),
//! how its deadline ends an operation (a timeout error carrying its cause), and how retries behave
//! under the deadline.

mod common;

use std::time::{Duration, Instant};

use common::{
    block_commands, client_with, fail_command_off, fail_point, is_timeout, max_time_of, ms, Server,
    Started,
};
use mongodb::{
    bson::{doc, Bson, Document},
    error::{BulkWriteError, Error, ErrorKind, PartialBulkWriteResult, WriteFailure},
    options::{ClientOptions, CollectionOptions, DatabaseOptions, InsertOneModel, WriteConcern},
    Client, Collection, Database, IndexModel, SearchIndexModel,
};

/// The error's cause, as applications read it: through `std::error::Error::source`.
fn cause(error: &Error) -> Option<&Error> {
    let source = std::error::Error::source(error)?;
    // The driver keeps the cause boxed; `source()` may hand out the box or the error itself.
    source
        .downcast_ref::<Error>()
        .or_else(|| source.downcast_ref::<Box<Error>>().map(|boxed| &**boxed))
}

fn server_code(error: &Error) -> Option<i32> {
    match error.kind.as_ref() {
        ErrorKind::Command(e) => Some(e.code),
        _ => None,
    }
}

/// Every started command, in order.
impl Started {
    /// The `maxTimeMS` of the last started command called `name` (`None` when it had none).
    fn last_max_time(&self, name: &str) -> Option<i64> {
        max_time_of(&self.named(name).pop().expect("command was sent"))
    }

    fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}

/// `maxTimeMS` under a budget of `budget_ms` sent right away: at most the budget, and not much
/// less (the emulator's round trip is well under 100 ms).
fn assert_max_time_from(max_time: Option<i64>, budget_ms: i64, what: &str) {
    let max_time = max_time.unwrap_or_else(|| panic!("{what}: no maxTimeMS sent"));
    assert!(
        max_time <= budget_ms && max_time > budget_ms - 500,
        "{what}: maxTimeMS {max_time} for a budget of {budget_ms} ms"
    );
}

#[tokio::test]
async fn upstream_rejects_timeout_ms_in_the_connection_string_and_the_fork_honours_it() {
    let uri = "mongodb://localhost:27017/?timeoutMS=1500";
    let upstream = mongodb_upstream::options::ClientOptions::parse(uri).await;
    let error = upstream.expect_err("upstream 3.9.1 has no timeoutMS");
    assert!(
        error.to_string().to_lowercase().contains("timeoutms"),
        "upstream's error names the option: {error}"
    );

    let fork = ClientOptions::parse(uri)
        .await
        .expect("the fork parses timeoutMS");
    assert_eq!(fork.timeout, Some(ms(1500)));
    let unlimited = ClientOptions::parse("mongodb://localhost:27017/?timeoutMS=0")
        .await
        .expect("timeoutMS=0");
    assert_eq!(unlimited.timeout, Some(Duration::ZERO));
    let unset = ClientOptions::parse("mongodb://localhost:27017/")
        .await
        .unwrap();
    assert_eq!(unset.timeout, None);
}

#[tokio::test]
async fn a_negative_timeout_ms_is_an_error_naming_the_option() {
    let error = ClientOptions::parse("mongodb://localhost:27017/?timeoutMS=-1")
        .await
        .expect_err("negative timeoutMS");
    assert!(
        error.to_string().to_lowercase().contains("timeoutms"),
        "{error}"
    );
}

#[tokio::test]
async fn socket_timeout_ms_stays_rejected_and_points_to_timeout_ms() {
    let error = ClientOptions::parse("mongodb://localhost:27017/?socketTimeoutMS=100")
        .await
        .expect_err("socketTimeoutMS is rejected");
    let message = error.to_string();
    assert!(message.contains("socketTimeoutMS"), "{message}");
    assert!(message.contains("use timeoutMS"), "{message}");
}

#[tokio::test]
async fn upstream_never_bounds_a_blocked_operation_and_the_fork_ends_it_at_the_deadline() {
    let server = Server::standalone();
    let block = doc! {
        "configureFailPoint": "failCommand",
        "mode": { "times": 1 },
        "data": { "failCommands": ["find"], "blockConnection": true, "blockTimeMS": 1500 },
    };

    // Upstream has no deadline to give: the find waits out the whole block.
    fail_point(&server.uri, block.clone()).await;
    let upstream = mongodb_upstream::Client::with_uri_str(&server.uri)
        .await
        .unwrap();
    let coll = upstream
        .database("t")
        .collection::<mongodb_upstream::bson::Document>("c");
    let started = Instant::now();
    coll.find_one(mongodb_upstream::bson::doc! {})
        .await
        .expect("upstream waits for the reply");
    assert!(started.elapsed() >= ms(1400), "{:?}", started.elapsed());

    // The fork with timeoutMS=200: a timeout error at about 200 ms.
    fail_point(&server.uri, block).await;
    let (client, sent) = client_with(&server.uri, Some(ms(200))).await;
    let coll = client.database("t").collection::<Document>("c");
    let started = Instant::now();
    let error = coll.find_one(doc! {}).await.expect_err("times out");
    let elapsed = started.elapsed();
    assert!(is_timeout(&error), "{error:?}");
    assert!(elapsed < ms(1000), "ended after {elapsed:?}");
    assert!(
        error.to_string().contains("timeoutMS expired"),
        "the message says what happened: {error}"
    );
    assert_max_time_from(sent.last_max_time("find"), 200, "blocked find");
    // The server's MaxTimeMSExpired, when it answered first, is the error's cause.
    if let Some(source) = cause(&error) {
        assert_eq!(server_code(source), Some(50), "{source:?}");
    }

    // The pool stays usable after the timed-out command.
    coll.find_one(doc! {})
        .await
        .expect("the next find succeeds");
    fail_command_off(&server.uri).await;
}

#[tokio::test]
async fn max_time_ms_comes_from_the_deadline_and_deprecated_limits_are_dropped() {
    let server = Server::standalone();
    let (client, sent) = client_with(&server.uri, Some(ms(10_000))).await;
    let coll = client.database("t").collection::<Document>("c");

    coll.find_one(doc! {}).await.unwrap();
    assert_max_time_from(sent.last_max_time("find"), 10_000, "find");

    // The operation's own max_time is ignored while timeoutMS applies.
    coll.find_one(doc! {})
        .max_time(ms(3_600_000))
        .await
        .unwrap();
    assert_max_time_from(sent.last_max_time("find"), 10_000, "find with max_time");

    // So is the write concern's wtimeout; the rest of the write concern stays.
    let wc = WriteConcern::builder()
        .w(mongodb::options::Acknowledgment::Majority)
        .w_timeout(ms(60_000))
        .build();
    let with_wc = client.database("t").collection_with_options::<Document>(
        "c",
        CollectionOptions::builder().write_concern(wc).build(),
    );
    with_wc.insert_one(doc! {}).await.unwrap();
    let insert = sent.named("insert").pop().unwrap();
    let write_concern = insert.get_document("writeConcern").expect("w is kept");
    assert_eq!(
        write_concern.get("w"),
        Some(&Bson::String("majority".into()))
    );
    assert!(!write_concern.contains_key("wtimeout"), "{write_concern:?}");
    assert_max_time_from(sent.last_max_time("insert"), 10_000, "insert");

    // Without timeoutMS, nothing changes: no maxTimeMS, the user's maxTime is sent.
    let (plain, plain_sent) = client_with(&server.uri, None).await;
    let coll = plain.database("t").collection::<Document>("c");
    coll.find_one(doc! {}).await.unwrap();
    assert_eq!(plain_sent.last_max_time("find"), None);
    coll.find_one(doc! {}).max_time(ms(1234)).await.unwrap();
    assert_eq!(plain_sent.last_max_time("find"), Some(1234));
}

#[tokio::test]
async fn timeout_ms_is_inherited_from_client_database_and_collection_and_overridden_below() {
    let server = Server::standalone();
    let (client, sent) = client_with(&server.uri, Some(ms(5_000))).await;
    let db_options = |t: u64| DatabaseOptions::builder().timeout(ms(t)).build();
    let coll_options = |t: u64| CollectionOptions::builder().timeout(ms(t)).build();

    // (what, the collection, the maxTimeMS budget expected; None: no maxTimeMS at all)
    let client_db = client.database("t");
    let db_3000 = client.database_with_options("t", db_options(3_000));
    let db_0 = client.database_with_options("t", db_options(0));
    let cases: Vec<(&str, mongodb::Collection<Document>, Option<i64>)> = vec![
        ("client", client_db.collection("c"), Some(5_000)),
        ("database", db_3000.collection("c"), Some(3_000)),
        (
            "collection over database",
            db_3000.collection_with_options("c", coll_options(2_000)),
            Some(2_000),
        ),
        (
            "collection over client",
            client_db.collection_with_options("c", coll_options(1_500)),
            Some(1_500),
        ),
        ("database 0", db_0.collection("c"), None),
        (
            "collection under database 0",
            db_0.collection_with_options("c", coll_options(2_500)),
            Some(2_500),
        ),
        (
            "collection 0",
            db_3000.collection_with_options("c", coll_options(0)),
            None,
        ),
    ];
    for (what, coll, expected) in &cases {
        // Every collection here has a timeout: the client set one. Zero means no limit.
        let expected_timeout = ms(expected.unwrap_or(0) as u64);
        assert_eq!(
            coll.timeout(),
            Some(expected_timeout),
            "{what}: Collection::timeout"
        );
        sent.clear();
        coll.find_one(doc! {}).await.unwrap();
        coll.insert_one(doc! {}).await.unwrap();
        for command in ["find", "insert"] {
            match expected {
                Some(budget) => assert_max_time_from(
                    sent.last_max_time(command),
                    *budget,
                    &format!("{what} {command}"),
                ),
                None => assert_eq!(sent.last_max_time(command), None, "{what} {command}"),
            }
        }
    }
    assert_eq!(db_3000.timeout(), Some(ms(3_000)));
    assert_eq!(client_db.timeout(), Some(ms(5_000)));

    // Database-level commands inherit from the database.
    sent.clear();
    db_3000.run_command(doc! { "ping": 1 }).await.unwrap();
    assert_max_time_from(
        sent.last_max_time("ping"),
        3_000,
        "run_command on the database",
    );
}

#[tokio::test]
async fn every_operation_builder_takes_its_own_timeout() {
    let server = Server::standalone();
    let (client, sent) = client_with(&server.uri, Some(ms(8_000))).await;
    let db =
        client.database_with_options("t", DatabaseOptions::builder().timeout(ms(6_000)).build());
    let coll = db.collection_with_options::<Document>(
        "ops",
        CollectionOptions::builder().timeout(ms(4_000)).build(),
    );
    coll.insert_one(doc! { "x": 1 }).await.unwrap();
    let t = ms(1_000);

    // Each action with `.timeout(1 s)`, and the command it sends.
    sent.clear();
    coll.insert_one(doc! { "x": 2 }).timeout(t).await.unwrap();
    coll.insert_many(vec![doc! { "x": 3 }])
        .timeout(t)
        .await
        .unwrap();
    coll.find_one(doc! {}).timeout(t).await.unwrap();
    coll.find(doc! {}).timeout(t).await.unwrap();
    coll.update_one(doc! {}, doc! { "$set": { "y": 1 } })
        .timeout(t)
        .await
        .unwrap();
    coll.update_many(doc! {}, doc! { "$set": { "y": 2 } })
        .timeout(t)
        .await
        .unwrap();
    coll.replace_one(doc! { "x": 3 }, doc! { "x": 4 })
        .timeout(t)
        .await
        .unwrap();
    coll.delete_one(doc! { "x": 4 }).timeout(t).await.unwrap();
    coll.delete_many(doc! { "x": 5 }).timeout(t).await.unwrap();
    coll.find_one_and_update(doc! {}, doc! { "$set": { "z": 1 } })
        .timeout(t)
        .await
        .unwrap();
    coll.find_one_and_replace(doc! { "x": 2 }, doc! { "x": 2 })
        .timeout(t)
        .await
        .unwrap();
    coll.find_one_and_delete(doc! { "x": 99 })
        .timeout(t)
        .await
        .unwrap();
    coll.aggregate(vec![doc! { "$match": {} }])
        .timeout(t)
        .await
        .unwrap();
    coll.count_documents(doc! {}).timeout(t).await.unwrap();
    coll.estimated_document_count().timeout(t).await.unwrap();
    coll.distinct("x", doc! {}).timeout(t).await.unwrap();
    db.run_command(doc! { "ping": 1 }).timeout(t).await.unwrap();
    for command in [
        "insert",
        "find",
        "update",
        "delete",
        "findAndModify",
        "aggregate",
        "count",
        "distinct",
        "ping",
    ] {
        let commands = sent.named(command);
        assert!(!commands.is_empty(), "{command} was sent");
        for sent_command in commands {
            assert_max_time_from(sent_command.get_i64("maxTimeMS").ok(), 1_000, command);
        }
    }

    // timeout(0) on the operation: no limit, so no maxTimeMS, whatever the levels above say.
    sent.clear();
    coll.find_one(doc! {})
        .timeout(Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(sent.last_max_time("find"), None);
}

#[tokio::test]
async fn max_time_ms_expired_anywhere_in_the_reply_becomes_the_timeout_error() {
    let server = Server::standalone();
    let wce = doc! {
        "configureFailPoint": "failCommand",
        "mode": { "times": 1 },
        "data": {
            "failCommands": ["insert"],
            "writeConcernError": { "code": 50, "codeName": "MaxTimeMSExpired", "errmsg": "expired" },
        },
    };
    fail_point(&server.uri, wce.clone()).await;
    let (client, _) = client_with(&server.uri, Some(ms(5_000))).await;
    let error = client
        .database("t")
        .collection::<Document>("c")
        .insert_one(doc! {})
        .await
        .expect_err("write concern error");
    assert!(is_timeout(&error), "{error:?}");
    let source = cause(&error).expect("the server's error is the cause");
    // The executor sees insert_one as a one-document insert; the cause keeps that shape.
    let wce_code = match source.kind.as_ref() {
        ErrorKind::Write(WriteFailure::WriteConcernError(e)) => Some(e.code),
        ErrorKind::InsertMany(e) => e.write_concern_error.as_ref().map(|e| e.code),
        _ => None,
    };
    assert_eq!(wce_code, Some(50), "{source:?}");

    // Without timeoutMS the error stays what the server said.
    fail_point(&server.uri, wce).await;
    let (plain, _) = client_with(&server.uri, None).await;
    let error = plain
        .database("t")
        .collection::<Document>("c")
        .insert_one(doc! {})
        .await
        .expect_err("write concern error");
    assert!(
        matches!(error.kind.as_ref(), ErrorKind::Write(WriteFailure::WriteConcernError(e)) if e.code == 50),
        "{error:?}"
    );

    // A top-level code 50.
    fail_point(
        &server.uri,
        doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": { "failCommands": ["find"], "errorCode": 50 },
        },
    )
    .await;
    let error = client
        .database("t")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .expect_err("code 50");
    assert!(is_timeout(&error), "{error:?}");
    assert_eq!(cause(&error).and_then(server_code), Some(50));
}

#[tokio::test]
async fn ordinary_retries_go_on_while_time_remains() {
    let server = Server::standalone();
    let fail_three = doc! {
        "configureFailPoint": "failCommand",
        "mode": { "times": 3 },
        "data": { "failCommands": ["find"], "errorCode": 7 },
    };

    // Without timeoutMS: one retry, then the error.
    fail_point(&server.uri, fail_three.clone()).await;
    let (plain, plain_sent) = client_with(&server.uri, None).await;
    let error = plain
        .database("t")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .expect_err("two attempts fail");
    assert_eq!(server_code(&error), Some(7));
    assert_eq!(plain_sent.named("find").len(), 2);
    fail_command_off(&server.uri).await;

    // With timeoutMS: retried until it succeeds.
    fail_point(&server.uri, fail_three).await;
    let (client, sent) = client_with(&server.uri, Some(ms(5_000))).await;
    client
        .database("t")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .expect("fourth attempt succeeds");
    assert_eq!(sent.named("find").len(), 4);

    // Until the deadline: then the timeout error, caused by the last failure.
    fail_point(
        &server.uri,
        doc! {
            "configureFailPoint": "failCommand",
            "mode": "alwaysOn",
            "data": { "failCommands": ["find"], "errorCode": 7, "blockConnection": true, "blockTimeMS": 20 },
        },
    )
    .await;
    let (client, sent) = client_with(&server.uri, Some(ms(300))).await;
    let started = Instant::now();
    let error = client
        .database("t")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .expect_err("never succeeds");
    let elapsed = started.elapsed();
    fail_command_off(&server.uri).await;
    assert!(is_timeout(&error), "{error:?}");
    assert!(
        sent.named("find").len() >= 3,
        "retried more than once: {}",
        sent.named("find").len()
    );
    assert!(elapsed < ms(1_000), "{elapsed:?}");
    // Its cause is a failed attempt's error: the last retryable one (7), or the server's
    // MaxTimeMSExpired when the emulator's maxTimeMS cut the last attempt's block first.
    let code = cause(&error).and_then(server_code);
    assert!(matches!(code, Some(7 | 50)), "{error:?}");

    // A deadline that ends the wait for a retry's reply keeps the error of the attempt before
    // as its cause: a server that fails the first find with a retryable code (7) and never
    // answers the second, whatever its maxTimeMS, so only the client's deadline ends it.
    let fake = fake_server::FakeServer::start().await;
    let (client, sent) = client_with(&fake.uri, Some(ms(300))).await;
    let error = client
        .database("t")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .expect_err("the retry is never answered");
    assert!(is_timeout(&error), "{error:?}");
    assert!(
        error.to_string().contains("while waiting for the reply"),
        "{error}"
    );
    assert_eq!(sent.named("find").len(), 2, "one retry");
    assert_eq!(cause(&error).and_then(server_code), Some(7), "{error:?}");
}

#[tokio::test]
async fn without_a_limit_ordinary_retries_stop_at_the_forks_cap() {
    // timeoutMS=0 retries an ordinary error as long as time remains, which is forever: the
    // fork stops after 100 retries (overload::retry::MAX_ORDINARY_RETRIES_WITHOUT_A_LIMIT) and
    // returns the last error. Retries without a backoff take well under a second here.
    let server = Server::standalone();
    fail_point(
        &server.uri,
        doc! {
            "configureFailPoint": "failCommand",
            "mode": "alwaysOn",
            "data": { "failCommands": ["find"], "errorCode": 7 },
        },
    )
    .await;
    let (client, sent) = client_with(&server.uri, Some(Duration::ZERO)).await;
    let error = client
        .database("t")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .expect_err("never succeeds");
    fail_command_off(&server.uri).await;
    assert_eq!(server_code(&error), Some(7), "the last error: {error:?}");
    assert_eq!(
        sent.named("find").len(),
        101,
        "the first attempt and 100 retries"
    );
    assert!(
        sent.named("find")
            .iter()
            .all(|find| max_time_of(find).is_none()),
        "no limit, no maxTimeMS"
    );
}

#[tokio::test]
async fn an_ordinary_retry_is_sent_even_when_the_servers_typical_service_time_exceeds_what_remains()
{
    let server = Server::standalone();
    let (client, sent) = client_with(&server.uri, Some(ms(1_000))).await;
    let coll = client.database("t").collection::<Document>("c");
    // Three successes of 400 ms each under the deadline: the server's typical service time.
    fail_point(
        &server.uri,
        doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 3 },
            "data": { "failCommands": ["find"], "blockConnection": true, "blockTimeMS": 400 },
        },
    )
    .await;
    for _ in 0..3 {
        coll.find_one(doc! {}).await.expect("slow success");
    }
    // Then an attempt that fails with a retryable code after 700 ms: 300 ms remain, less than
    // the typical 400. An ordinary failure says nothing about load, and the CSOT specification
    // asks for the retry while time remains (before, the fork declined it: CannotFinish).
    fail_point(
        &server.uri,
        doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": { "failCommands": ["find"], "errorCode": 7, "blockConnection": true, "blockTimeMS": 700 },
        },
    )
    .await;
    sent.clear();
    coll.find_one(doc! {})
        .await
        .expect("the retry is sent and succeeds");
    assert_eq!(sent.named("find").len(), 2, "one retry");
}

#[tokio::test]
async fn selection_that_gives_up_before_the_deadline_is_the_timeout_error_caused_by_it() {
    // Nothing listens on port 1: selection ends on serverSelectionTimeoutMS (150 ms), well
    // before the 2 s deadline. Under timeoutMS that is the timeout error, the selection error
    // its cause (before, the selection error itself).
    let uri = "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=150&connectTimeoutMS=100";
    let (client, _) = client_with(uri, Some(ms(2_000))).await;
    let started = Instant::now();
    let error = client
        .database("t")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .expect_err("no server");
    assert!(started.elapsed() < ms(1_500), "{:?}", started.elapsed());
    assert!(is_timeout(&error), "{error:?}");
    let cause = cause(&error).expect("the selection error");
    assert!(
        matches!(*cause.kind, ErrorKind::ServerSelection { .. }),
        "{cause:?}"
    );
    // Without timeoutMS the selection error stays what it was.
    let (client, _) = client_with(uri, None).await;
    let error = client
        .database("t")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .expect_err("no server");
    assert!(
        matches!(*error.kind, ErrorKind::ServerSelection { .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_deadline_that_ends_a_first_selection_keeps_what_selection_found_as_cause() {
    // The deadline (200 ms) ends selection long before serverSelectionTimeoutMS (5 s) would:
    // the timeout error's cause is the selection error serverSelectionTimeoutMS would have
    // given then, describing the topology (before, the timeout error had no cause).
    let server = Server::replica_set();
    let unselectable = server.uri_with("readPreference=secondary&serverSelectionTimeoutMS=5000");
    let unreachable = "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=5000&connectTimeoutMS=100";
    // A one-member set has no secondary: a known server that does not suit the criteria; what
    // the topology says of it names the set. Nothing listens on port 1: no server is available.
    for (uri, described) in [(unselectable.as_str(), "rs0"), (unreachable, "127.0.0.1:1")] {
        let (client, _) = client_with(uri, Some(ms(200))).await;
        let started = Instant::now();
        let error = client
            .database("t")
            .collection::<Document>("c")
            .find_one(doc! {})
            .await
            .expect_err("no suitable server");
        let elapsed = started.elapsed();
        assert!(is_timeout(&error), "{uri}: {error:?}");
        assert!(
            elapsed < ms(2_000),
            "{uri}: ended by the deadline: {elapsed:?}"
        );
        assert!(
            error.to_string().contains("during server selection"),
            "{uri}: {error}"
        );
        let cause = cause(&error).unwrap_or_else(|| panic!("{uri}: no cause: {error:?}"));
        match cause.kind.as_ref() {
            ErrorKind::ServerSelection { message, .. } => {
                assert!(message.contains(described), "{uri}: {message}");
            }
            other => panic!("{uri}: the cause is not a selection error: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_deadline_that_ends_a_retry_keeps_the_last_attempts_error_as_cause() {
    let server = Server::standalone();
    // The first attempt loses its connection after 100 ms; the retry needs a new connection,
    // whose handshake is held for 1 s, and the 400 ms deadline ends the checkout. The timeout
    // error says why the operation was retrying: the network error.
    fail_point(
        &server.uri,
        doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": { "failCommands": ["find"], "closeConnection": true, "blockConnection": true, "blockTimeMS": 100 },
        },
    )
    .await;
    let (client, sent) = client_with(&server.uri, Some(ms(400))).await;
    let coll = client.database("t").collection::<Document>("c");
    let find = tokio::spawn(async move { coll.find_one(doc! {}).await });
    sent.wait_for("find").await;
    tokio::time::sleep(ms(30)).await;
    fail_point(
        &server.uri,
        doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 4 },
            "data": { "failCommands": ["hello", "isMaster"], "blockConnection": true, "blockTimeMS": 1_000 },
        },
    )
    .await;
    let error = find.await.expect("task").expect_err("the retry times out");
    fail_command_off(&server.uri).await;
    assert!(is_timeout(&error), "{error:?}");
    let cause = cause(&error).expect("the first attempt's error");
    assert!(matches!(*cause.kind, ErrorKind::Io(_)), "{cause:?}");
}

#[tokio::test]
async fn a_deadline_that_ends_a_retrys_selection_keeps_the_last_attempts_error_as_cause() {
    let server = Server::replica_set();
    // The first attempt is held 400 ms and then fails with NotWritablePrimary (retryable);
    // meanwhile the set's only member steps down for a minute, so the retry's selection finds
    // no primary and the 1.2 s deadline ends it there. The timeout error says why the operation
    // was retrying: the first attempt's error, not what selection found.
    fail_point(
        &server.uri,
        doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": { "failCommands": ["find"], "errorCode": 10107, "blockConnection": true, "blockTimeMS": 400 },
        },
    )
    .await;
    let (client, sent) = client_with(&server.uri, Some(ms(1_200))).await;
    let coll = client.database("t").collection::<Document>("c");
    let find = tokio::spawn(async move { coll.find_one(doc! {}).await });
    sent.wait_for("find").await;
    let admin = Client::with_uri_str(&server.uri).await.expect("client");
    admin
        .database("admin")
        .run_command(doc! { "replSetStepDown": 60, "secondaryCatchUpPeriodSecs": 0, "force": true })
        .await
        .expect("the only member steps down");
    let error = find
        .await
        .expect("task")
        .expect_err("no primary for the retry");
    assert!(is_timeout(&error), "{error:?}");
    assert!(
        error.to_string().contains("during server selection"),
        "the retry's selection was cut: {error}"
    );
    assert_eq!(sent.named("find").len(), 1, "the retry was never sent");
    assert_eq!(
        cause(&error).and_then(server_code),
        Some(10107),
        "the first attempt's error: {error:?}"
    );
}

/// A fail point that rejects every find for overload (462, retryable), each after
/// `block_ms` when given.
fn every_find_overloaded(block_ms: Option<i64>) -> Document {
    let mut data = doc! {
        "failCommands": ["find"],
        "errorCode": 462,
        "errorLabels": ["SystemOverloadedError", "RetryableError"],
    };
    if let Some(block_ms) = block_ms {
        data.insert("blockConnection", true);
        data.insert("blockTimeMS", block_ms);
    }
    doc! { "configureFailPoint": "failCommand", "mode": "alwaysOn", "data": data }
}

/// One `find_one` from a new client with `timeoutMS`, the backoff's jitter pinned to `jitter`:
/// its result, the commands it sent and how long the call took.
async fn find_one_with_jitter(
    uri: &str,
    timeout: Duration,
    jitter: f64,
) -> (mongodb::error::Result<Option<Document>>, Started, Duration) {
    let (client, sent) = client_with(uri, Some(timeout)).await;
    let coll = client.database("t").collection::<Document>("c");
    let started = Instant::now();
    let result =
        mongodb::fork::test_hooks::with_pinned_jitter(jitter, coll.find_one(doc! {})).await;
    (result, sent, started.elapsed())
}

#[tokio::test]
async fn an_overload_retry_whose_backoff_passes_the_deadline_is_not_attempted() {
    let server = Server::standalone();
    fail_point(&server.uri, every_find_overloaded(None)).await;

    // Full jitter: the first retry waits 100 ms * 2 = 200 ms, more than the 150 ms budget. The
    // overload error comes back at once, without sleeping, and without a second attempt.
    let (result, sent, elapsed) = find_one_with_jitter(&server.uri, ms(150), 1.0).await;
    let error = result.expect_err("overloaded");
    assert_eq!(
        server_code(&error),
        Some(462),
        "the last error, not a timeout: {error:?}"
    );
    assert_eq!(sent.named("find").len(), 1, "no retry was attempted");
    assert!(elapsed < ms(150), "returned without sleeping: {elapsed:?}");

    // With time for both retries (200 ms + 400 ms of backoff), the cap of 2 applies as before.
    let (result, sent, _) = find_one_with_jitter(&server.uri, ms(5_000), 1.0).await;
    assert_eq!(result.as_ref().err().and_then(server_code), Some(462));
    assert_eq!(
        sent.named("find").len(),
        3,
        "first attempt and maxAdaptiveRetries=2 retries"
    );

    // Room for the first retry's 200 ms but not the second's 400 ms: two attempts.
    let (result, sent, _) = find_one_with_jitter(&server.uri, ms(450), 1.0).await;
    assert_eq!(result.as_ref().err().and_then(server_code), Some(462));
    assert_eq!(sent.named("find").len(), 2);
    fail_command_off(&server.uri).await;
}

#[tokio::test]
async fn an_overload_retry_that_the_rejections_own_time_shows_cannot_finish_is_not_attempted() {
    let server = Server::standalone();
    // Every find is rejected for overload after 600 ms: the client never sees a success.
    fail_point(&server.uri, every_find_overloaded(Some(600))).await;
    // No backoff at all: only the estimate can decline the retry. With no success to learn
    // from, the estimate is the rejection's own 600 ms, more than the 400 ms left, so the
    // overload error comes back at once. Before, the estimate was zero: the retry was sent,
    // blocked past the deadline, and the call ended 400 ms later with a timeout error.
    let (result, sent, elapsed) = find_one_with_jitter(&server.uri, ms(1_000), 0.0).await;
    let error = result.expect_err("overloaded");
    assert_eq!(
        server_code(&error),
        Some(462),
        "the overload error, not a timeout: {error:?}"
    );
    assert_eq!(sent.named("find").len(), 1, "no retry was attempted");
    assert!(
        elapsed < ms(900),
        "returned when the rejection came: {elapsed:?}"
    );
    fail_command_off(&server.uri).await;
}

/// CSOT prose test 1: the batches of one `insert_many` share one deadline.
#[tokio::test]
async fn insert_many_batches_share_one_deadline() {
    let server = Server::standalone();
    block_commands(&server.uri, "insert", 2, 3010).await;
    let (client, sent) = client_with(&server.uri, Some(ms(6_000))).await;
    // Each batch is blocked for 3 s, so the first leaves less than 3 s of the 6 s budget (the
    // margin is wide because sending 48 MB takes a while in a debug build on a busy machine).
    // 50 documents of 1 MB do not fit in one 48 MB message: two batches.
    let big = "a".repeat(1_000_000);
    let docs: Vec<Document> = (0..50).map(|_| doc! { "a": big.clone() }).collect();
    let error = client
        .database("t")
        .collection::<Document>("batches")
        .insert_many(docs)
        .await
        .expect_err("the second batch runs out of time");
    fail_command_off(&server.uri).await;
    assert!(is_timeout(&error), "{error:?}");
    let inserts = sent.named("insert");
    assert_eq!(inserts.len(), 2, "two batches were sent");
    let second = inserts[1].get_i64("maxTimeMS").expect("maxTimeMS");
    assert!(
        second < 3_000,
        "the second batch got what remained, not a fresh budget: {second}"
    );
    // The documents of the first batch are in the collection: the timeout error's cause says
    // which, by their index in the call.
    let first_batch = inserts[0]
        .get_array("documents")
        .map(Vec::len)
        .unwrap_or_default();
    assert!(first_batch > 0 && first_batch < 50, "{first_batch}");
    let partial = match cause(&error).map(|e| e.kind.as_ref()) {
        Some(ErrorKind::InsertMany(partial)) => partial,
        other => panic!("no InsertManyError under the timeout: {other:?}"),
    };
    let mut indexes: Vec<usize> = partial.inserted_ids().keys().copied().collect();
    indexes.sort_unstable();
    assert_eq!(indexes, (0..first_batch).collect::<Vec<_>>());
    let stored = client
        .database("t")
        .collection::<Document>("batches")
        .count_documents(doc! {})
        .await
        .expect("count");
    assert_eq!(stored, first_batch as u64);
}

/// One insert of an empty document into `coll`, as a client `bulk_write` model.
fn insert_model(coll: &Collection<Document>) -> InsertOneModel {
    InsertOneModel::builder()
        .namespace(coll.namespace())
        .document(doc! {})
        .build()
}

/// The client `bulk_write` error inside a timeout error (its cause), or the error itself.
fn bulk_write_error(error: &Error) -> Option<&BulkWriteError> {
    let inner = if is_timeout(error) {
        cause(error)?
    } else {
        error
    };
    match inner.kind.as_ref() {
        ErrorKind::BulkWrite(e) => Some(e),
        _ => None,
    }
}

#[tokio::test]
async fn every_other_action_that_runs_a_command_takes_its_own_timeout() {
    // A replica set, so that `watch` can open a change stream.
    let server = Server::replica_set();
    let (client, sent) = client_with(&server.uri, Some(ms(8_000))).await;
    let db =
        client.database_with_options("t", DatabaseOptions::builder().timeout(ms(6_000)).build());
    let coll = db.collection_with_options::<Document>(
        "ops",
        CollectionOptions::builder().timeout(ms(4_000)).build(),
    );
    coll.insert_one(doc! { "x": 1 }).await.unwrap();
    let scratch = client.database("scratch");
    scratch.create_collection("c").await.unwrap();
    let t = ms(1_000);

    // Each action with `.timeout(1 s)`, under levels that all say more.
    sent.clear();
    db.list_collections().timeout(t).await.unwrap();
    db.list_collection_names().timeout(t).await.unwrap();
    client.list_databases().timeout(t).await.unwrap();
    client.list_database_names().timeout(t).await.unwrap();
    coll.create_index(IndexModel::builder().keys(doc! { "x": 1 }).build())
        .timeout(t)
        .await
        .unwrap();
    coll.create_indexes(vec![IndexModel::builder().keys(doc! { "y": 1 }).build()])
        .timeout(t)
        .await
        .unwrap();
    coll.list_indexes().timeout(t).await.unwrap();
    coll.list_index_names().timeout(t).await.unwrap();
    coll.drop_index("x_1").timeout(t).await.unwrap();
    coll.drop_indexes().timeout(t).await.unwrap();
    db.create_collection("made").timeout(t).await.unwrap();
    db.collection::<Document>("made")
        .drop()
        .timeout(t)
        .await
        .unwrap();
    scratch.drop().timeout(t).await.unwrap();
    db.run_cursor_command(doc! { "find": "ops" })
        .timeout(t)
        .await
        .unwrap();
    client
        .bulk_write(vec![insert_model(&coll)])
        .timeout(t)
        .await
        .unwrap();
    coll.watch().timeout(t).await.unwrap();
    // The emulator, like a server without mongot, refuses the search-index commands; what
    // matters here is what the driver sends.
    let model = SearchIndexModel::builder()
        .definition(doc! { "mappings": { "dynamic": true } })
        .name("s".to_string())
        .build();
    let _ = coll.create_search_index(model).timeout(t).await;
    let _ = coll
        .update_search_index("s", doc! { "mappings": { "dynamic": false } })
        .timeout(t)
        .await;
    let _ = coll.drop_search_index("s").timeout(t).await;
    for (command, count) in [
        ("listCollections", 2),
        ("listDatabases", 2),
        ("createIndexes", 2),
        ("listIndexes", 2),
        ("dropIndexes", 2),
        ("create", 1),
        ("drop", 1),
        ("dropDatabase", 1),
        ("find", 1),
        ("bulkWrite", 1),
        ("aggregate", 1),
        ("createSearchIndexes", 1),
        ("updateSearchIndex", 1),
        ("dropSearchIndex", 1),
    ] {
        let commands = sent.named(command);
        // At least: a refused command that is retryable may be sent again within the 1 s.
        assert!(
            commands.len() >= count,
            "{command} sent {} times",
            commands.len()
        );
        for sent_command in commands {
            assert_max_time_from(sent_command.get_i64("maxTimeMS").ok(), 1_000, command);
        }
    }

    // list_search_indexes runs an aggregate with the same budget.
    sent.clear();
    let _ = coll.list_search_indexes().timeout(t).await;
    assert_max_time_from(
        sent.last_max_time("aggregate"),
        1_000,
        "list_search_indexes",
    );
}

/// One call of an action that runs `command`, with its own `timeout`: a representative of each
/// kind (list helpers, index and collection management, dropping a database, a cursor command
/// and client `bulk_write`).
async fn call_with_timeout(
    command: &str,
    client: &Client,
    db: &Database,
    coll: &Collection<Document>,
    timeout: Duration,
) -> mongodb::error::Result<()> {
    match command {
        "listCollections" => db.list_collection_names().timeout(timeout).await.map(drop),
        "listDatabases" => client
            .list_database_names()
            .timeout(timeout)
            .await
            .map(drop),
        "listIndexes" => coll.list_index_names().timeout(timeout).await.map(drop),
        "createIndexes" => coll
            .create_index(IndexModel::builder().keys(doc! { "x": 1 }).build())
            .timeout(timeout)
            .await
            .map(drop),
        "dropIndexes" => coll.drop_indexes().timeout(timeout).await,
        "create" => db.create_collection("made").timeout(timeout).await,
        "drop" => {
            db.collection::<Document>("made")
                .drop()
                .timeout(timeout)
                .await
        }
        "dropDatabase" => db.drop().timeout(timeout).await,
        "find" => db
            .run_cursor_command(doc! { "find": coll.name() })
            .timeout(timeout)
            .await
            .map(drop),
        "bulkWrite" => client
            .bulk_write(vec![insert_model(coll)])
            .timeout(timeout)
            .await
            .map(drop),
        other => panic!("no call for {other}"),
    }
}

/// The commands of [`call_with_timeout`], in an order that keeps each call valid (`create`
/// before `drop`, `dropDatabase` last).
const OVERRIDDEN_COMMANDS: [&str; 10] = [
    "listCollections",
    "listDatabases",
    "listIndexes",
    "createIndexes",
    "dropIndexes",
    "find",
    "bulkWrite",
    "create",
    "drop",
    "dropDatabase",
];

#[tokio::test]
async fn a_shorter_per_call_timeout_ends_a_blocked_command_whatever_the_levels_above_say() {
    let server = Server::standalone();
    let (client, sent) = client_with(&server.uri, Some(ms(10_000))).await;
    let db = client.database("t");
    let coll = db.collection::<Document>("c");
    coll.insert_one(doc! {}).await.unwrap();
    for command in OVERRIDDEN_COMMANDS {
        // Blocked far longer than the call's 200 ms, far shorter than the inherited 10 s.
        block_commands(&server.uri, command, 1, 1500).await;
        sent.clear();
        let started = Instant::now();
        let result = call_with_timeout(command, &client, &db, &coll, ms(200)).await;
        let elapsed = started.elapsed();
        let error = result.expect_err(command);
        assert!(is_timeout(&error), "{command}: {error:?}");
        assert!(elapsed < ms(1_000), "{command}: ended after {elapsed:?}");
        assert_max_time_from(sent.last_max_time(command), 200, command);
    }
    fail_command_off(&server.uri).await;
}

#[tokio::test]
async fn a_longer_per_call_timeout_lets_a_slow_command_finish_under_a_short_inherited_one() {
    let server = Server::standalone();
    // Every level inherits the client's 100 ms; each call asks for 5 s instead.
    let (client, sent) = client_with(&server.uri, Some(ms(100))).await;
    let db = client.database("t");
    let coll = db.collection::<Document>("c");
    coll.insert_one(doc! {}).timeout(ms(5_000)).await.unwrap();
    for command in OVERRIDDEN_COMMANDS {
        // Blocked for 300 ms: longer than the inherited 100 ms, well within the call's 5 s.
        block_commands(&server.uri, command, 1, 300).await;
        sent.clear();
        call_with_timeout(command, &client, &db, &coll, ms(5_000))
            .await
            .unwrap_or_else(|e| panic!("{command}: {e:?}"));
        assert_max_time_from(sent.last_max_time(command), 5_000, command);
    }
}

/// CSOT prose test 11, on the emulator: the batches of one client `bulk_write` share one
/// deadline, and the error keeps the first batch's results.
#[tokio::test]
async fn client_bulk_write_batches_share_one_deadline() {
    let server = Server::standalone();
    block_commands(&server.uri, "bulkWrite", 2, 3010).await;
    // The client's 6 s: each batch blocked for 3 s leaves the second less than 3 s, which the
    // emulator's maxTimeMS then cuts short (code 50). A fresh 6 s for the second batch would
    // outlast the block and succeed.
    let (client, sent) = client_with(&server.uri, Some(ms(6_000))).await;
    let coll = client.database("t").collection::<Document>("bulk");
    // 50 documents of 1 MB do not fit in one 48 MB message: two batches.
    let big = "a".repeat(1_000_000);
    let models: Vec<InsertOneModel> = (0..50)
        .map(|_| {
            InsertOneModel::builder()
                .namespace(coll.namespace())
                .document(doc! { "a": big.clone() })
                .build()
        })
        .collect();
    let error = client
        .bulk_write(models)
        .await
        .expect_err("the second batch runs out of time");
    fail_command_off(&server.uri).await;
    assert!(is_timeout(&error), "{error:?}");
    let batches = sent.named("bulkWrite");
    assert_eq!(batches.len(), 2, "two batches were sent");
    let second = batches[1].get_i64("maxTimeMS").expect("maxTimeMS");
    assert!(
        second < 3_000,
        "the second batch got what remained, not a fresh budget: {second}"
    );
    // The cause is the bulk write error, with the first batch's inserts as its partial result.
    let bulk = bulk_write_error(&error).expect("a bulk write error as the cause");
    let inserted = match &bulk.partial_result {
        Some(PartialBulkWriteResult::Summary(result)) => result.inserted_count,
        other => panic!("no summary partial result: {other:?}"),
    };
    let first_batch = batches[0]
        .get_array("ops")
        .map(Vec::len)
        .unwrap_or_default();
    assert!(first_batch > 0 && first_batch < 50, "{first_batch}");
    assert_eq!(inserted, first_batch as i64);
}

#[tokio::test]
async fn max_time_ms_expired_in_a_client_bulk_write_becomes_the_timeout_error() {
    // A write concern error with code 50 (the emulator's fail point).
    let server = Server::standalone();
    let wce = doc! {
        "configureFailPoint": "failCommand",
        "mode": { "times": 1 },
        "data": {
            "failCommands": ["bulkWrite"],
            "writeConcernError": { "code": 50, "codeName": "MaxTimeMSExpired", "errmsg": "expired" },
        },
    };
    for timeout in [Some(ms(5_000)), None] {
        fail_point(&server.uri, wce.clone()).await;
        let (client, _) = client_with(&server.uri, timeout).await;
        let coll = client.database("t").collection::<Document>("c");
        let error = client
            .bulk_write(vec![insert_model(&coll)])
            .await
            .expect_err("write concern error");
        // With timeoutMS the timeout error; without, the bulk write error it was.
        assert_eq!(is_timeout(&error), timeout.is_some(), "{error:?}");
        let bulk = bulk_write_error(&error).expect("the bulk write error");
        let codes: Vec<i32> = bulk.write_concern_errors.iter().map(|e| e.code).collect();
        assert_eq!(codes, vec![50], "{error:?}");
    }

    // A top-level code 50 on the only batch.
    fail_point(
        &server.uri,
        doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": { "failCommands": ["bulkWrite"], "errorCode": 50 },
        },
    )
    .await;
    let (client, _) = client_with(&server.uri, Some(ms(5_000))).await;
    let coll = client.database("t").collection::<Document>("c");
    let error = client
        .bulk_write(vec![insert_model(&coll)])
        .await
        .expect_err("code 50");
    assert!(is_timeout(&error), "{error:?}");
    assert_eq!(cause(&error).and_then(server_code), Some(50));

    // A write error with code 50, which the emulator cannot produce: a fake server reports it
    // for the first model of each batch. The fake advertises one write per batch, so an
    // unordered call of two models makes two batches unless the first one ends the call.
    let fake = fake_server::FakeServer::start().await;
    for timeout in [Some(ms(5_000)), None] {
        fake.reset();
        let (client, _) = client_with(&fake.uri, timeout).await;
        let coll = client.database("t").collection::<Document>("c");
        let error = client
            .bulk_write(vec![insert_model(&coll), insert_model(&coll)])
            .ordered(false)
            .await
            .expect_err("write error");
        assert_eq!(is_timeout(&error), timeout.is_some(), "{error:?}");
        let bulk = bulk_write_error(&error).expect("the bulk write error");
        assert_eq!(
            bulk.write_errors.get(&0).map(|e| e.code),
            Some(50),
            "{error:?}"
        );
        // Under timeoutMS the expired batch ends the call; without it, the unordered call goes
        // on with its second batch as upstream does.
        let expected_batches = if timeout.is_some() { 1 } else { 2 };
        assert_eq!(fake.bulk_writes(), expected_batches, "{error:?}");
    }
}

/// A server that speaks just enough of the wire protocol (OP_MSG) for replies and stalls the
/// emulator cannot give: it answers the handshake as a MongoDB 8.0 standalone that takes one
/// write per batch (with no `topologyVersion`, so clients poll it), fails the first write of
/// every `bulkWrite` with code 50 (MaxTimeMSExpired), fails its first `find` with code 7
/// (HostNotFound, a retryable read error) and never answers a later one, and answers anything
/// else with `ok: 1`. [`FakeServer::accepting_one`] accepts a single connection.
mod fake_server {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use mongodb::bson::{doc, Document};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpSocket, TcpStream};

    const OP_MSG: i32 = 2013;
    /// Larger requests are refused (the fake only ever sees small commands).
    const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

    pub struct FakeServer {
        pub uri: String,
        address: std::net::SocketAddr,
        bulk_writes: Arc<AtomicUsize>,
        accepted: Arc<AtomicUsize>,
        accept: tokio::task::JoinHandle<()>,
    }

    /// What every connection of one fake shares.
    #[derive(Clone, Default)]
    struct Counters {
        bulk_writes: Arc<AtomicUsize>,
        finds: Arc<AtomicUsize>,
    }

    impl FakeServer {
        pub async fn start() -> Self {
            Self::listen(1024, None)
        }

        /// A fake that accepts its first connection (a client's monitor) and no other. Its
        /// listen backlog is zero, which on Linux queues one connection that nobody accepts:
        /// once [`Self::fill_accept_queue`] has taken that place, the kernel drops every later
        /// SYN, so a client's TCP connect can only time out.
        pub async fn accepting_one() -> Self {
            Self::listen(0, Some(1))
        }

        fn listen(backlog: u32, limit: Option<usize>) -> Self {
            let socket = TcpSocket::new_v4().expect("socket");
            socket
                .bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
                .expect("bind");
            let listener: TcpListener = socket.listen(backlog).expect("listen");
            let address = listener.local_addr().expect("address");
            let counters = Counters::default();
            let bulk_writes = counters.bulk_writes.clone();
            let accepted = Arc::new(AtomicUsize::new(0));
            let accepted_count = accepted.clone();
            // Runs until the server is dropped, which aborts it and closes the listener.
            let accept = tokio::spawn(async move {
                while limit.is_none_or(|limit| accepted_count.load(Ordering::SeqCst) < limit) {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    tokio::spawn(serve(stream, counters.clone()));
                    accepted_count.fetch_add(1, Ordering::SeqCst);
                }
                // Past its limit the listener stays open, so connections queue rather than
                // being refused.
                std::future::pending::<()>().await;
            });
            Self {
                uri: format!("mongodb://{address}/?directConnection=true"),
                address,
                bulk_writes,
                accepted,
                accept,
            }
        }

        /// Once the fake has accepted every connection it will, connects once more, taking the
        /// accept queue's one place; the connection is never accepted and stays queued while
        /// the returned stream lives.
        pub async fn fill_accept_queue(&self) -> TcpStream {
            while self.accepted.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            TcpStream::connect(self.address).await.expect("queued")
        }

        /// How many `bulkWrite` commands arrived since the last reset.
        pub fn bulk_writes(&self) -> usize {
            self.bulk_writes.load(Ordering::SeqCst)
        }

        pub fn reset(&self) {
            self.bulk_writes.store(0, Ordering::SeqCst);
        }
    }

    impl Drop for FakeServer {
        fn drop(&mut self) {
            self.accept.abort();
        }
    }

    /// Answers one connection's requests until the client closes it (or sends something this
    /// fake does not read).
    async fn serve(mut stream: TcpStream, counters: Counters) {
        while let Some((request_id, command)) = read_command(&mut stream).await {
            let name = command.keys().next().cloned().unwrap_or_default();
            let reply = match name.as_str() {
                "hello" | "isMaster" | "ismaster" => hello(),
                "bulkWrite" => {
                    counters.bulk_writes.fetch_add(1, Ordering::SeqCst);
                    expired_first_write()
                }
                "find" => {
                    if counters.finds.fetch_add(1, Ordering::SeqCst) > 0 {
                        // Never answered, whatever its maxTimeMS: only the client's deadline
                        // can end the wait.
                        std::future::pending::<()>().await;
                    }
                    doc! {
                        "ok": 0,
                        "code": 7,
                        "codeName": "HostNotFound",
                        "errmsg": "the fake's first find fails",
                    }
                }
                _ => doc! { "ok": 1 },
            };
            if write_reply(&mut stream, request_id, &reply).await.is_err() {
                return;
            }
        }
    }

    fn hello() -> Document {
        doc! {
            "ok": 1,
            "helloOk": true,
            "isWritablePrimary": true,
            "ismaster": true,
            "maxBsonObjectSize": 16_777_216,
            "maxMessageSizeBytes": 48_000_000,
            "maxWriteBatchSize": 1,
            "logicalSessionTimeoutMinutes": 30,
            "connectionId": 1,
            "minWireVersion": 0,
            "maxWireVersion": 25,
        }
    }

    /// A `bulkWrite` reply whose first (only) write failed with MaxTimeMSExpired.
    fn expired_first_write() -> Document {
        doc! {
            "ok": 1,
            "cursor": {
                "id": 0_i64,
                "ns": "admin.$cmd.bulkWrite",
                "firstBatch": [{
                    "ok": 0,
                    "idx": 0,
                    "code": 50,
                    "codeName": "MaxTimeMSExpired",
                    "errmsg": "operation exceeded time limit",
                }],
            },
            "nErrors": 1,
            "nInserted": 0,
            "nMatched": 0,
            "nModified": 0,
            "nUpserted": 0,
            "nDeleted": 0,
        }
    }

    /// Reads one OP_MSG request: its id and its body (section kind 0). Document sequences
    /// (kind 1) are skipped. `None` when the connection ends or the message is not one.
    async fn read_command(stream: &mut TcpStream) -> Option<(i32, Document)> {
        let mut header = [0_u8; 16];
        stream.read_exact(&mut header).await.ok()?;
        let field = |i: usize| i32::from_le_bytes(header[i..i + 4].try_into().unwrap_or_default());
        let length = usize::try_from(field(0)).ok()?;
        if field(12) != OP_MSG || !(21..=MAX_REQUEST_BYTES).contains(&length) {
            return None;
        }
        let mut message = vec![0_u8; length - 16];
        stream.read_exact(&mut message).await.ok()?;
        // Flag bits first, then sections: a kind byte and its payload.
        let mut rest = message.get(4..)?;
        let mut body = None;
        while let Some((&kind, payload)) = rest.split_first() {
            let size =
                usize::try_from(i32::from_le_bytes(payload.get(..4)?.try_into().ok()?)).ok()?;
            let (section, after) = (payload.get(..size)?, payload.get(size..)?);
            if kind == 0 {
                body = Document::from_reader(section).ok();
            }
            rest = after;
        }
        Some((field(4), body?))
    }

    async fn write_reply(
        stream: &mut TcpStream,
        response_to: i32,
        reply: &Document,
    ) -> std::io::Result<()> {
        let mut body = Vec::new();
        reply
            .to_writer(&mut body)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let length = i32::try_from(16 + 4 + 1 + body.len()).unwrap_or(i32::MAX);
        let mut message = Vec::with_capacity(21 + body.len());
        for field in [length, 0, response_to, OP_MSG] {
            message.extend_from_slice(&field.to_le_bytes());
        }
        message.extend_from_slice(&0_u32.to_le_bytes());
        message.push(0);
        message.extend_from_slice(&body);
        stream.write_all(&message).await
    }
}

/// A fork client for `uri` (with its options) that records the reasons of its failed checkouts.
async fn client_recording_checkout_failures(
    uri: &str,
) -> (Client, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use mongodb::event::{cmap::CmapEvent, EventHandler};
    let mut options = ClientOptions::parse(uri).await.expect("valid uri");
    let failures = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = failures.clone();
    options.cmap_event_handler = Some(EventHandler::callback(move |event: CmapEvent| {
        if let CmapEvent::ConnectionCheckoutFailed(failed) = event {
            sink.lock().unwrap().push(format!("{:?}", failed.reason));
        }
    }));
    (Client::with_options(options).expect("client"), failures)
}

#[tokio::test]
async fn a_checkout_ends_at_server_selection_timeout_or_the_deadline_and_reports_a_timeout() {
    let server = Server::standalone();
    // One connection, held by a ping blocked for 1.5 s.
    let uri = server.uri_with("maxPoolSize=1&serverSelectionTimeoutMS=300&appName=checkout");
    let (client, failures) = client_recording_checkout_failures(&uri).await;
    let db = client.database("t");
    db.run_command(doc! { "ping": 1 }).await.expect("warm");
    fail_point(
        &server.uri,
        doc! {
            "configureFailPoint": "failCommand", "mode": { "times": 1 },
            "data": { "failCommands": ["ping"], "blockConnection": true, "blockTimeMS": 1_500,
                      "appName": "checkout" },
        },
    )
    .await;
    let holder = tokio::spawn({
        let db = db.clone();
        async move { db.run_command(doc! { "ping": 1 }).await }
    });
    tokio::time::sleep(ms(100)).await;

    // timeoutMS (2 s) leaves more than serverSelectionTimeoutMS (300 ms): the checkout ends at
    // the latter, counted from the start of selection, long before the holder lets go.
    let started = Instant::now();
    let error = db
        .run_command(doc! { "hello": 1 })
        .timeout(ms(2_000))
        .await
        .expect_err("no connection within serverSelectionTimeoutMS");
    let elapsed = started.elapsed();
    assert!(is_timeout(&error), "{error:?}");
    assert!(elapsed < ms(1_000), "{elapsed:?}");

    // A deadline shorter than serverSelectionTimeoutMS ends the checkout at the deadline.
    let started = Instant::now();
    let error = db
        .run_command(doc! { "hello": 1 })
        .timeout(ms(150))
        .await
        .expect_err("no connection within the deadline");
    let elapsed = started.elapsed();
    assert!(is_timeout(&error), "{error:?}");
    assert!(elapsed < ms(280), "{elapsed:?}");

    holder.await.unwrap().expect("the holder's ping");
    // Each cut checkout was reported to the pool's listeners, as timed out.
    assert_eq!(*failures.lock().unwrap(), ["Timeout", "Timeout"]);
    // Without timeoutMS the checkout waits as upstream's does.
    db.run_command(doc! { "ping": 1 })
        .await
        .expect("a free connection");
}

#[tokio::test]
async fn a_connection_establishment_that_outlasts_the_deadline_is_the_timeout_error() {
    let server = Server::standalone();
    let uri = server.uri_with("maxPoolSize=2&appName=establish");
    let (client, _started) = client_with(&uri, None).await;
    let db = client.database("t");
    db.run_command(doc! { "ping": 1 }).await.expect("warm");
    // The pool's one connection is busy with a blocked find, so the next operation needs a new
    // connection, whose handshake is blocked for longer than the operation's deadline.
    block_commands(&server.uri, "find", 1, 1_500).await;
    let busy = tokio::spawn({
        let coll = db.collection::<Document>("c");
        async move { coll.find_one(doc! {}).await }
    });
    tokio::time::sleep(ms(100)).await;
    block_commands(&server.uri, "hello", 1, 1_500).await;
    let started = Instant::now();
    let error = db
        .run_command(doc! { "ping": 1 })
        .timeout(ms(300))
        .await
        .expect_err("the handshake outlasts the deadline");
    let elapsed = started.elapsed();
    assert!(
        is_timeout(&error),
        "a timeout error, not a network error: {error:?}"
    );
    assert!(elapsed < ms(1_000), "{elapsed:?}");
    busy.await.unwrap().expect("the blocked find");
    fail_command_off(&server.uri).await;
}

#[tokio::test]
async fn a_connect_timeout_under_timeout_ms_stays_a_network_error_that_is_retried() {
    // A server whose monitor connection is up but which accepts no other: a new connection's
    // TCP connect can only time out (connectTimeoutMS, 100 ms), well before the 1.5 s deadline.
    let fake = fake_server::FakeServer::accepting_one().await;
    let uri = format!("{}&connectTimeoutMS=100", fake.uri);
    let (client, failures) = client_recording_checkout_failures(&uri).await;
    let _queued = fake.fill_accept_queue().await;
    let started = Instant::now();
    let error = client
        .database("t")
        .collection::<Document>("c")
        .find_one(doc! {})
        .timeout(ms(1_500))
        .await
        .expect_err("no connection can be made");
    let elapsed = started.elapsed();
    // Each connect timeout is a network error that the retryable read retries (while time
    // remains, under timeoutMS) rather than a timeout error that would end it at once.
    let connect_failures = failures
        .lock()
        .unwrap()
        .iter()
        .filter(|reason| reason.as_str() == "ConnectionError")
        .count();
    assert!(
        connect_failures >= 2,
        "retried: {:?}",
        failures.lock().unwrap()
    );
    // The deadline ends it, caused by the last connect timeout, a network error.
    assert!(is_timeout(&error), "{error:?}");
    assert!(elapsed < ms(2_500), "{elapsed:?}");
    let cause = cause(&error).expect("the last attempt's error");
    assert!(matches!(*cause.kind, ErrorKind::Io(_)), "{cause:?}");
}

#[tokio::test]
async fn a_client_bulk_write_results_get_more_runs_under_the_calls_deadline() {
    let server = Server::standalone();
    let setup = Client::with_uri_str(&server.uri).await.expect("client");
    setup
        .database("admin")
        .run_command(doc! { "setParameter": 1, "labBulkWriteBatchSize": 1 })
        .await
        .expect("setParameter");
    // The cursor's path differs in load-balanced mode (the getMores run on the batch's
    // connection); both must stop at the call's deadline.
    for uri in [server.uri.clone(), server.load_balanced_uri()] {
        let (client, sent) = client_with(&uri, Some(ms(600))).await;
        let coll = client.database("t").collection::<Document>("results");
        let models: Vec<InsertOneModel> = (0..3)
            .map(|_| {
                InsertOneModel::builder()
                    .namespace(coll.namespace())
                    .document(doc! {})
                    .build()
            })
            .collect();
        block_commands(&server.uri, "getMore", 1, 1_500).await;
        let started = Instant::now();
        let error = client
            .bulk_write(models)
            .verbose_results()
            .await
            .expect_err("the blocked getMore outlasts the call's deadline");
        let elapsed = started.elapsed();
        fail_command_off(&server.uri).await;
        assert!(is_timeout(&error), "{uri}: {error:?}");
        assert!(elapsed < ms(1_200), "{uri}: {elapsed:?}");
        assert!(
            !sent.named("getMore").is_empty(),
            "{uri}: a getMore was sent"
        );
    }
    setup
        .database("admin")
        .run_command(doc! { "setParameter": 1, "labBulkWriteBatchSize": 0 })
        .await
        .expect("setParameter");
}

#[tokio::test]
async fn a_client_bulk_write_results_kill_cursors_gets_the_calls_timeout_afresh() {
    let server = Server::standalone();
    let setup = Client::with_uri_str(&server.uri).await.expect("client");
    let admin = setup.database("admin");
    admin
        .run_command(doc! { "setParameter": 1, "labBulkWriteBatchSize": 1 })
        .await
        .expect("setParameter");
    // A results getMore that fails (not by the deadline) leaves the cursor open on the server,
    // so the driver kills it: on the batch's connection in load-balanced mode, where the call
    // waits for it, else from the cursor's drop. Either way the killCursors gets the call's
    // timeoutMS (600 ms) afresh, not what the getMore left of it.
    for uri in [server.uri.clone(), server.load_balanced_uri()] {
        let load_balanced = uri.contains("loadBalanced=true");
        // The getMore is held 400 ms, then fails (2, BadValue); the killCursors is held 400 ms.
        fail_point(
            &server.uri,
            doc! {
                "configureFailPoint": "failCommand",
                "mode": { "times": 2 },
                "data": { "failCommands": ["getMore", "killCursors"], "blockConnection": true, "blockTimeMS": 400 },
            },
        )
        .await;
        admin
            .run_command(doc! {
                "configureFailPoint": "failGetMoreAfterCursorCheckout",
                "mode": { "times": 1 },
                "data": { "errorCode": 2 },
            })
            .await
            .expect("configureFailPoint");
        let (client, sent) = client_with(&uri, Some(ms(600))).await;
        let coll = client.database("t").collection::<Document>("kill");
        let models: Vec<InsertOneModel> = (0..3).map(|_| insert_model(&coll)).collect();
        let started = Instant::now();
        let error = client
            .bulk_write(models)
            .verbose_results()
            .await
            .expect_err("the getMore fails");
        let elapsed = started.elapsed();
        assert!(
            !is_timeout(&error),
            "{uri}: the getMore's own error: {error:?}"
        );
        let waited = Instant::now();
        while sent.named("killCursors").is_empty() && waited.elapsed() < ms(2_000) {
            tokio::time::sleep(ms(10)).await;
        }
        let max_time = sent.last_max_time("killCursors");
        assert!(
            max_time.is_some_and(|max_time| max_time > 400 && max_time <= 600),
            "{uri}: killCursors with maxTimeMS {max_time:?}, not the ~200 ms the getMore left"
        );
        if load_balanced {
            // The held killCursors took the call past its first deadline: it had its own.
            assert!(
                elapsed >= ms(750) && elapsed < ms(1_500),
                "{uri}: {elapsed:?}"
            );
        }
        fail_command_off(&server.uri).await;
    }

    // A killCursors held longer than the call's timeoutMS ends within it (load-balanced mode,
    // where the call waits for it): the getMore fails at once, the killCursors is held 1.5 s
    // and ends at about 600 ms, on its maxTimeMS or its deadline, whichever fires first.
    // Without a bound it would be sent without maxTimeMS and waited for the whole 1.5 s.
    block_commands(&server.uri, "killCursors", 1, 1_500).await;
    admin
        .run_command(doc! {
            "configureFailPoint": "failGetMoreAfterCursorCheckout",
            "mode": { "times": 1 },
            "data": { "errorCode": 2 },
        })
        .await
        .expect("configureFailPoint");
    let (client, sent) = client_with(&server.load_balanced_uri(), Some(ms(600))).await;
    let coll = client.database("t").collection::<Document>("kill");
    let models: Vec<InsertOneModel> = (0..3).map(|_| insert_model(&coll)).collect();
    let started = Instant::now();
    let error = client
        .bulk_write(models)
        .verbose_results()
        .await
        .expect_err("the getMore fails");
    let elapsed = started.elapsed();
    fail_command_off(&server.uri).await;
    assert!(!is_timeout(&error), "the getMore's own error: {error:?}");
    assert!(
        !sent.named("killCursors").is_empty(),
        "a killCursors was sent"
    );
    assert!(
        elapsed >= ms(500) && elapsed < ms(1_200),
        "the held killCursors was cut at its 600 ms: {elapsed:?}"
    );
    admin
        .run_command(doc! { "setParameter": 1, "labBulkWriteBatchSize": 0 })
        .await
        .expect("setParameter");
}

#[tokio::test]
async fn a_write_held_up_past_its_deadline_before_it_is_sent_is_not_sent() {
    use mongodb::event::{command::CommandEvent, EventHandler};
    let server = Server::standalone();
    let mut options = ClientOptions::parse(&server.uri).await.expect("valid uri");
    // An application's started-event handler that blocks for 300 ms on every insert: the
    // insert is built within its 100 ms deadline and held up past it before its write.
    options.command_event_handler = Some(EventHandler::callback(|event: CommandEvent| {
        if let CommandEvent::Started(started) = event {
            if started.command_name == "insert" {
                std::thread::sleep(ms(300));
            }
        }
    }));
    let client = Client::with_options(options).expect("client");
    let coll = client.database("t").collection::<Document>("held");
    coll.drop().await.expect("drop");
    let error = coll
        .insert_one(doc! { "_id": 1 })
        .timeout(ms(100))
        .await
        .expect_err("the deadline passed before the write");
    assert!(is_timeout(&error), "{error:?}");
    let stored = coll.count_documents(doc! {}).await.expect("count");
    assert_eq!(stored, 0, "nothing was sent after the deadline");
}
