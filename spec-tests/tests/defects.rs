//! Upstream 3.9.1's Client Backpressure defects, each reproduced on upstream and shown fixed on
//! the fork, in the same scenario against the emulator.
//!
//! Every scenario is written once, in the `scenarios!` macro, and instantiated for both driver
//! crates linked into this test binary: `mongodb` (the fork, `driver/`) and `mongodb_upstream`
//! (unmodified 3.9.1 from crates.io). A test passes only when upstream shows the defect *and* the
//! fork does not, so a fix that stops working, or a scenario that stops reproducing the defect,
//! fails either way.

mod common;

use common::Server;

/// Pauses the test runtime's clock (sleeps then complete at once) until dropped, also when the
/// operation panics, so a panicking upstream scenario cannot leave the clock frozen.
struct PausedClock;

impl PausedClock {
    fn new() -> Self {
        tokio::time::pause();
        Self
    }
}

impl Drop for PausedClock {
    fn drop(&mut self) {
        tokio::time::resume();
    }
}

/// What a scenario saw, in plain data both drivers can report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Outcome {
    /// Commands started with this name (the attempts).
    attempts: usize,
    /// The operation succeeded.
    ok: bool,
    /// The final error's server code, when it was a server error.
    code: Option<i32>,
    /// The final error carried the overload labels.
    overload_labels: bool,
}

/// When each `find` of an operation started and failed, on the test runtime's clock (virtual
/// while paused). Between a failure and the next start the retry loop only backs off, selects an
/// already known server and checks out the connection it just returned, with no network wait, so
/// each such gap is the backoff the driver chose for that retry.
#[derive(Clone, Default)]
struct FindTimeline(std::sync::Arc<std::sync::Mutex<FindTimes>>);

#[derive(Default)]
struct FindTimes {
    started: Vec<tokio::time::Instant>,
    failed: Vec<tokio::time::Instant>,
}

impl FindTimeline {
    /// (attempts started, attempts failed)
    fn counts(&self) -> (usize, usize) {
        let times = self.0.lock().unwrap();
        (times.started.len(), times.failed.len())
    }

    /// The backoff before each retry: element `k - 1` is the wait between attempt `k`'s failure
    /// and attempt `k + 1`'s start, so element `k - 1` belongs to retry `k`.
    fn backoffs(&self) -> Vec<std::time::Duration> {
        let times = self.0.lock().unwrap();
        times
            .failed
            .iter()
            .zip(times.started.iter().skip(1))
            .map(|(failed, next)| next.saturating_duration_since(*failed))
            .collect()
    }
}

macro_rules! scenarios {
    ($module:ident, $driver:ident) => {
        mod $module {
            #![allow(dead_code)]

            use std::sync::{Arc, Mutex};

            use ::$driver::{
                bson::{doc, Document},
                error::{Error, ErrorKind},
                event::{command::CommandEvent, EventHandler},
                options::ClientOptions,
                Client,
            };

            use super::Outcome;

            pub use crate::common::Started;

            /// Makes `options` record every started command.
            pub fn record_started(options: &mut ClientOptions) -> Started {
                let started = Started::default();
                let sink = started.clone();
                options.command_event_handler =
                    Some(EventHandler::callback(move |event: CommandEvent| {
                        if let CommandEvent::Started(e) = event {
                            sink.0.lock().unwrap().push(e.command);
                        }
                    }));
                started
            }

            pub async fn client(uri: &str) -> (Client, Started) {
                let mut options = ClientOptions::parse(uri).await.expect("valid uri");
                let started = record_started(&mut options);
                (Client::with_options(options).expect("client"), started)
            }

            /// The `$changeStream` stage of the aggregate that opens a change stream with a
            /// comment (B13).
            pub async fn change_stream_stage_with_comment(uri: &str) -> Document {
                let (client, started) = client(uri).await;
                let coll = client.database("b13").collection::<Document>("c");
                let _stream = coll.watch().comment("b13").await.expect("watch");
                let commands = started.0.lock().unwrap().clone();
                let aggregate = commands
                    .iter()
                    .find(|c| c.contains_key("aggregate"))
                    .expect("an aggregate was sent")
                    .clone();
                assert_eq!(aggregate.get_str("comment"), Ok("b13"), "{aggregate}");
                aggregate
                    .get_array("pipeline")
                    .ok()
                    .and_then(|p| p.first())
                    .and_then(|s| s.as_document())
                    .and_then(|s| s.get_document("$changeStream").ok())
                    .cloned()
                    .expect("the pipeline starts with $changeStream")
            }

            /// The index commands (`listIndexes`, `createIndexes`) of uploading a file smaller
            /// than one chunk to a fresh bucket (B14).
            pub async fn small_upload_index_commands(uri: &str) -> usize {
                use futures::io::AsyncWriteExt;
                let (client, started) = client(uri).await;
                let db = client.database("b14");
                db.drop().await.expect("drop");
                let bucket = db.gridfs_bucket(None);
                let mut stream = bucket.open_upload_stream("small").await.expect("open");
                stream.write_all(b"tiny").await.expect("write");
                stream.close().await.expect("close");
                let commands = started.0.lock().unwrap().clone();
                commands
                    .iter()
                    .filter(|c| c.contains_key("listIndexes") || c.contains_key("createIndexes"))
                    .count()
            }

            /// A `ping` that succeeds and a command that fails, on database `b12`, for the
            /// command log (B12).
            pub async fn ping_and_unknown_command(uri: &str) {
                let (client, _) = client(uri).await;
                let db = client.database("b12");
                db.run_command(doc! { "ping": 1 }).await.expect("ping");
                let unknown = db.run_command(doc! { "b12NoSuchCommand": 1 }).await;
                assert!(unknown.is_err(), "an unknown command fails");
            }

            pub fn server_code(error: &Error) -> Option<i32> {
                match error.kind.as_ref() {
                    ErrorKind::Command(e) => Some(e.code),
                    _ => None,
                }
            }

            pub fn outcome<T>(result: &Result<T, Error>, attempts: usize) -> Outcome {
                match result {
                    Ok(_) => Outcome {
                        attempts,
                        ok: true,
                        ..Outcome::default()
                    },
                    Err(e) => Outcome {
                        attempts,
                        ok: false,
                        code: server_code(e),
                        overload_labels: e.contains_label("SystemOverloadedError")
                            && e.contains_label("RetryableError"),
                    },
                }
            }

            /// Sets `failCommand` to reject `command` `times` times with code 462 and the
            /// retryable-overload labels.
            pub async fn fail_with_overload(
                client: &Client,
                command: &str,
                mode: ::$driver::bson::Bson,
            ) {
                client
                    .database("admin")
                    .run_command(doc! {
                        "configureFailPoint": "failCommand",
                        "mode": mode,
                        "data": {
                            "failCommands": [command],
                            "errorCode": 462,
                            "errorLabels": ["SystemOverloadedError", "RetryableError"],
                        },
                    })
                    .await
                    .expect("configureFailPoint");
            }

            pub async fn fail_point_off(client: &Client) {
                client
                    .database("admin")
                    .run_command(doc! { "configureFailPoint": "failCommand", "mode": "off" })
                    .await
                    .expect("configureFailPoint off");
            }

            /// B1: a collection, database or search-index command rejected twice with a
            /// retryable overload error. The emulator, like a mongod without a search
            /// deployment, answers the search-index commands with 31082 SearchNotEnabled, so
            /// their third attempt shows as that code.
            pub async fn catalog_command_under_overload(uri: &str, command: &str) -> Outcome {
                use ::$driver::SearchIndexModel;
                let (client, started) = client(uri).await;
                let db = client.database("b1");
                // Make sure the namespace exists for drop, and not for create.
                db.collection::<Document>("existing")
                    .insert_one(doc! {})
                    .await
                    .expect("seed");
                fail_with_overload(&client, command, doc! { "times": 2 }.into()).await;
                let existing = db.collection::<Document>("existing");
                let definition = doc! { "mappings": { "dynamic": true } };
                let result = match command {
                    "create" => db.create_collection("fresh").await,
                    "drop" => existing.drop().await,
                    "dropDatabase" => db.drop().await,
                    "createSearchIndexes" => existing
                        .create_search_index(
                            SearchIndexModel::builder()
                                .name("default".to_string())
                                .definition(definition)
                                .build(),
                        )
                        .await
                        .map(|_| ()),
                    "updateSearchIndex" => existing.update_search_index("default", definition).await,
                    "dropSearchIndex" => existing.drop_search_index("default").await,
                    other => panic!("no scenario for {other}"),
                };
                fail_point_off(&client).await;
                outcome(&result, started.named(command).len())
            }

            /// B3, fork half: many overload retries against a server that always rejects.
            pub async fn many_overload_retries(uri: &str, max_retries: u32) -> Outcome {
                let (client, started) =
                    client(&format!("{uri}&maxAdaptiveRetries={max_retries}")).await;
                let coll = client.database("b3").collection::<Document>("c");
                coll.find_one(doc! {}).await.expect("warm up");
                fail_with_overload(&client, "find", "alwaysOn".into()).await;
                let result = coll.find_one(doc! {}).await;
                fail_point_off(&client).await;
                outcome(&result, started.named("find").len() - 1)
            }

            /// B3, upstream half: like `many_overload_retries` on a paused clock, recording into
            /// `timeline` when each attempt started and failed. The caller keeps its own handle
            /// on `timeline`, so the record survives a panic inside the operation.
            pub async fn overload_retry_timeline(
                uri: &str,
                max_retries: u32,
                timeline: super::FindTimeline,
            ) -> Outcome {
                let mut options =
                    ClientOptions::parse(format!("{uri}&maxAdaptiveRetries={max_retries}"))
                        .await
                        .expect("valid uri");
                let recording = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let sink = (timeline.clone(), recording.clone());
                options.command_event_handler =
                    Some(EventHandler::callback(move |event: CommandEvent| {
                        let (timeline, recording) = &sink;
                        if !recording.load(std::sync::atomic::Ordering::SeqCst) {
                            return;
                        }
                        // The callback runs inside the operation's task, so this reads the test
                        // runtime's (paused) clock.
                        let now = tokio::time::Instant::now();
                        let mut times = timeline.0.lock().unwrap();
                        match event {
                            CommandEvent::Started(e) if e.command_name == "find" => {
                                times.started.push(now)
                            }
                            CommandEvent::Failed(e) if e.command_name == "find" => {
                                times.failed.push(now)
                            }
                            _ => {}
                        }
                    }));
                let client = Client::with_options(options).expect("client");
                let coll = client.database("b3").collection::<Document>("c");
                coll.find_one(doc! {}).await.expect("warm up");
                fail_with_overload(&client, "find", "alwaysOn".into()).await;
                recording.store(true, std::sync::atomic::Ordering::SeqCst);
                let clock = super::PausedClock::new();
                let result = coll.find_one(doc! {}).await;
                drop(clock);
                recording.store(false, std::sync::atomic::Ordering::SeqCst);
                fail_point_off(&client).await;
                outcome(&result, timeline.counts().0)
            }

            /// B4: overload errors (two, then success) whose `baseBackoffMS` is `value`.
            pub async fn overload_with_base_backoff(uri: &str, value: ::$driver::bson::Bson) -> Outcome {
                let (client, started) = client(uri).await;
                let admin = client.database("admin");
                let coll = client.database("b4").collection::<Document>("c");
                coll.find_one(doc! {}).await.expect("warm up");
                admin
                    .run_command(doc! { "setParameter": 1, "labRawBaseBackoffMS": { "value": value } })
                    .await
                    .expect("setParameter");
                fail_with_overload(&client, "find", doc! { "times": 2 }.into()).await;
                let result = coll.find_one(doc! {}).await;
                admin
                    .run_command(doc! { "setParameter": 1, "labRawBaseBackoffMS": {} })
                    .await
                    .expect("setParameter");
                fail_point_off(&client).await;
                outcome(&result, started.named("find").len() - 1)
            }

            /// B2: a client bulkWrite of two `updateMany {$inc}` whose results need a getMore
            /// that always fails with a retryable overload error. Returns the bulkWrite
            /// commands sent and the counter's final value.
            pub async fn bulk_write_with_failing_get_more(uri: &str) -> (usize, i32) {
                use ::$driver::options::{UpdateManyModel, WriteModel};
                let (client, started) = client(uri).await;
                let admin = client.database("admin");
                let coll = client.database("b2").collection::<Document>("c");
                coll.delete_many(doc! {}).await.expect("clean");
                coll.insert_one(doc! { "_id": 1, "n": 0 }).await.expect("seed");
                admin
                    .run_command(doc! { "setParameter": 1, "labBulkWriteBatchSize": 1 })
                    .await
                    .expect("setParameter");
                fail_with_overload(&client, "getMore", "alwaysOn".into()).await;
                let increment = || {
                    WriteModel::from(
                        UpdateManyModel::builder()
                            .namespace(coll.namespace())
                            .filter(doc! { "_id": 1 })
                            .update(doc! { "$inc": { "n": 1 } })
                            .build(),
                    )
                };
                let result = client
                    .bulk_write([increment(), increment()])
                    .verbose_results()
                    .await;
                fail_point_off(&client).await;
                admin
                    .run_command(doc! { "setParameter": 1, "labBulkWriteBatchSize": 0 })
                    .await
                    .expect("setParameter");
                assert!(result.is_err(), "the results getMore fails");
                let n = coll
                    .find_one(doc! { "_id": 1 })
                    .await
                    .expect("find")
                    .and_then(|d| d.get_i32("n").ok())
                    .unwrap_or(-1);
                (started.named("bulkWrite").len(), n)
            }

            /// B1, load-balanced half: a client bulkWrite whose results need getMores, on a
            /// load-balanced connection (the cursor is pinned to it), where the first getMore
            /// fails with a retryable overload error. Returns the bulkWrites and getMores sent
            /// and whether the bulkWrite succeeded.
            pub async fn load_balanced_bulk_write_get_more_overloaded_once(
                uri: &str,
            ) -> (usize, usize, bool) {
                use ::$driver::options::{InsertOneModel, WriteModel};
                let (client, started) = client(uri).await;
                let admin = client.database("admin");
                let coll = client.database("b1lb").collection::<Document>("c");
                coll.delete_many(doc! {}).await.expect("clean");
                admin
                    .run_command(doc! { "setParameter": 1, "labBulkWriteBatchSize": 1 })
                    .await
                    .expect("setParameter");
                fail_with_overload(&client, "getMore", doc! { "times": 1 }.into()).await;
                let insert = |id: i32| {
                    WriteModel::from(
                        InsertOneModel::builder()
                            .namespace(coll.namespace())
                            .document(doc! { "_id": id })
                            .build(),
                    )
                };
                let result = client
                    .bulk_write([insert(1), insert(2), insert(3)])
                    .verbose_results()
                    .await;
                fail_point_off(&client).await;
                admin
                    .run_command(doc! { "setParameter": 1, "labBulkWriteBatchSize": 0 })
                    .await
                    .expect("setParameter");
                (
                    started.named("bulkWrite").len(),
                    started.named("getMore").len(),
                    result.is_ok(),
                )
            }

            /// B6: the monitor connects while the TLS front serves a trusted certificate, then
            /// the first pool connection gets one that does not validate. Returns whether the
            /// operation's error carried the overload labels and how many times the pool was
            /// cleared.
            pub async fn untrusted_certificate_on_pool_connection(
                front: &emulator::tls::TlsFront,
                ca_file: &str,
            ) -> (bool, usize) {
                use std::sync::atomic::{AtomicUsize, Ordering};
                use ::$driver::event::{cmap::CmapEvent, sdam::SdamEvent};
                use ::$driver::ServerType;

                let uri = format!(
                    "mongodb://{}/?tls=true&tlsCAFile={ca_file}&serverMonitoringMode=poll\
                     &heartbeatFrequencyMS=60000&retryReads=true&serverSelectionTimeoutMS=3000",
                    front.address()
                );
                let mut options = ClientOptions::parse(uri).await.expect("valid uri");
                let monitored = Arc::new(tokio::sync::Notify::new());
                let monitor_seen = monitored.clone();
                options.sdam_event_handler =
                    Some(EventHandler::callback(move |event: SdamEvent| {
                        if let SdamEvent::ServerDescriptionChanged(e) = event {
                            if e.new_description.server_type() != ServerType::Unknown {
                                monitor_seen.notify_one();
                            }
                        }
                    }));
                let cleared = Arc::new(AtomicUsize::new(0));
                let cleared_count = cleared.clone();
                options.cmap_event_handler =
                    Some(EventHandler::callback(move |event: CmapEvent| {
                        if let CmapEvent::PoolCleared(_) = event {
                            cleared_count.fetch_add(1, Ordering::SeqCst);
                        }
                    }));
                let client = Client::with_options(options).expect("client");
                tokio::time::timeout(std::time::Duration::from_secs(10), monitored.notified())
                    .await
                    .expect("the monitor connects over TLS");
                front.serve_untrusted(true);
                let result = client
                    .database("b6")
                    .collection::<Document>("c")
                    .find_one(doc! {})
                    .await;
                front.serve_untrusted(false);
                let error = result.expect_err("the pool connection's certificate does not validate");
                (
                    error.contains_label("SystemOverloadedError"),
                    cleared.load(Ordering::SeqCst),
                )
            }

            /// B5: a client whose options came from serde with `adaptiveRetries: true`, after
            /// enough overload retries to spend a 1000-token bucket.
            pub async fn serde_enabled_token_bucket(uri: &str) -> Outcome {
                let parsed = ClientOptions::parse(uri).await.expect("valid uri");
                let hosts: Vec<String> = parsed.hosts.iter().map(|h| h.to_string()).collect();
                let mut options: ClientOptions = ::$driver::bson::from_document(doc! {
                    "hosts": hosts,
                    "adaptiveRetries": true,
                    "maxAdaptiveRetries": 2,
                })
                .expect("options deserialize");
                options.repl_set_name = parsed.repl_set_name.clone();
                let started = record_started(&mut options);
                let client = Client::with_options(options).expect("client");
                let coll = client.database("b5").collection::<Document>("c");
                coll.find_one(doc! {}).await.expect("warm up");
                // A 1 ms server base keeps 1000 backoffs short.
                client
                    .database("admin")
                    .run_command(doc! { "setParameter": 1, "externalClientBaseBackoffMS": 1 })
                    .await
                    .expect("setParameter");
                fail_with_overload(&client, "find", "alwaysOn".into()).await;
                // 1000 tokens, one per overload retry, two retries per operation.
                for _ in 0..500 {
                    let _ = coll.find_one(doc! {}).await;
                }
                let before = started.named("find").len();
                let result = coll.find_one(doc! {}).await;
                let attempts = started.named("find").len() - before;
                fail_point_off(&client).await;
                outcome(&result, attempts)
            }

            /// B7: the "did you mean" suggestion for a misspelt overload option.
            pub async fn suggestion_for(option: &str) -> String {
                let uri = format!("mongodb://localhost:27017/?{option}=true");
                match ClientOptions::parse(uri).await {
                    Ok(_) => "accepted".to_owned(),
                    Err(e) => e.to_string(),
                }
            }

            /// B10: an insert whose reply sets an unknown required OP_MSG flag bit (the
            /// emulator's `labMangleReplies`, for this client's application name only). Returns
            /// the insert's result: `Ok` means the driver read the reply as a success.
            pub async fn insert_with_unknown_required_flag(uri: &str, app: &str) -> Result<(), String> {
                let mut options = ClientOptions::parse(uri).await.expect("valid uri");
                options.app_name = Some(app.to_owned());
                options.retry_writes = Some(false);
                let client = Client::with_options(options).expect("client");
                let admin = client.database("admin");
                admin
                    .run_command(doc! {
                        "setParameter": 1,
                        "labMangleReplies": {
                            "seed": 10, "share": 1.0, "kinds": ["unknownRequiredFlags"],
                            "appName": app, "commands": ["insert"],
                        },
                    })
                    .await
                    .expect("setParameter labMangleReplies");
                let result = client
                    .database("b10")
                    .collection::<Document>(app)
                    .insert_one(doc! { "x": 1 })
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string());
                // The emulator closes the connection after a damaged frame; a driver that read
                // the reply keeps that connection pooled, so the first command on it may fail
                // with end of stream. A few attempts (bounded) get a fresh connection.
                let mut off = Err(String::new());
                for _ in 0..3 {
                    off = admin
                        .run_command(doc! { "setParameter": 1, "labMangleReplies": {} })
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string());
                    if off.is_ok() {
                        break;
                    }
                }
                off.expect("mangling off");
                result
            }

            /// B11: a client with `maxPoolSize=0` (no limit, says the URI options spec) runs 15
            /// finds at once, each held 300 ms by the server. Returns the connections its pool
            /// created, or the error that refused the option.
            pub async fn concurrent_finds_without_pool_limit(uri: &str) -> Result<usize, String> {
                use ::$driver::event::cmap::CmapEvent;
                let uri = format!("{uri}?maxPoolSize=0");
                let mut options = ClientOptions::parse(&uri).await.map_err(|e| e.to_string())?;
                let created = Arc::new(Mutex::new(0usize));
                let sink = Arc::clone(&created);
                options.cmap_event_handler = Some(EventHandler::callback(move |event: CmapEvent| {
                    if let CmapEvent::ConnectionCreated(_) = event {
                        *sink.lock().unwrap() += 1;
                    }
                }));
                let client = Client::with_options(options).map_err(|e| e.to_string())?;
                client
                    .database("admin")
                    .run_command(doc! {
                        "configureFailPoint": "failCommand",
                        "mode": { "times": 15 },
                        "data": {
                            "failCommands": ["find"],
                            "blockConnection": true,
                            "blockTimeMS": 300,
                        },
                    })
                    .await
                    .expect("configureFailPoint");
                let coll = client.database("b11").collection::<Document>("c");
                let finds: Vec<_> = (0..15)
                    .map(|_| {
                        let coll = coll.clone();
                        tokio::spawn(async move { coll.find_one(doc! {}).await.map(drop) })
                    })
                    .collect();
                for find in finds {
                    find.await.expect("find task").map_err(|e| e.to_string())?;
                }
                let n = *created.lock().unwrap();
                Ok(n)
            }

            /// B9: the writeConcern of the retried commitTransaction after a retryable write
            /// error that carries `SystemOverloadedError` but not `RetryableError`.
            pub async fn commit_retry_write_concern(uri: &str) -> Option<Document> {
                let (client, started) = client(uri).await;
                let coll = client.database("b9").collection::<Document>("c");
                coll.insert_one(doc! { "seed": 1 }).await.expect("seed");
                client
                    .database("admin")
                    .run_command(doc! {
                        "configureFailPoint": "failCommand",
                        "mode": { "times": 1 },
                        "data": {
                            "failCommands": ["commitTransaction"],
                            "errorCode": 91,
                            "errorLabels": ["RetryableWriteError", "SystemOverloadedError"],
                        },
                    })
                    .await
                    .expect("configureFailPoint");
                let mut session = client.start_session().await.expect("session");
                session.start_transaction().await.expect("start");
                coll.insert_one(doc! { "in": "txn" })
                    .session(&mut session)
                    .await
                    .expect("insert in txn");
                session
                    .commit_transaction()
                    .await
                    .expect("commit after one retry");
                let commits = started.named("commitTransaction");
                assert_eq!(commits.len(), 2, "one failure, one retry");
                commits[1].get_document("writeConcern").ok().cloned()
            }

            /// B8: the error returned after `91` then `10107`, both labelled
            /// NoWritesPerformed (retryable-writes prose test 6, case 2, expects 91).
            pub async fn error_after_no_writes_performed_errors(uri: &str) -> Option<i32> {
                let labels = vec!["RetryableError", "SystemOverloadedError", "NoWritesPerformed"];
                let fail = |mode: ::$driver::bson::Bson, code: i32| {
                    doc! {
                        "configureFailPoint": "failCommand",
                        "mode": mode,
                        "data": { "failCommands": ["insert"], "errorCode": code, "errorLabels": labels.clone() },
                    }
                };
                let then = fail("alwaysOn".into(), 10107);
                let mut options = ClientOptions::parse(uri).await.expect("valid uri");
                let switched = Arc::new(Mutex::new(false));
                let hook_uri = uri.to_owned();
                options.command_event_handler =
                    Some(EventHandler::callback(move |event: CommandEvent| {
                        if let CommandEvent::Failed(_) = event {
                            let mut done = switched.lock().unwrap();
                            if !*done {
                                *done = true;
                                super::common::fail_point_blocking(&hook_uri, then.clone());
                            }
                        }
                    }));
                let client = Client::with_options(options).expect("client");
                fail_point_off(&client).await;
                client
                    .database("admin")
                    .run_command(fail(doc! { "times": 1 }.into(), 91))
                    .await
                    .expect("configureFailPoint");
                let result = client
                    .database("b8")
                    .collection::<Document>("c")
                    .insert_one(doc! { "x": 1 })
                    .await;
                fail_point_off(&client).await;
                result.err().and_then(|e| server_code(&e))
            }

            /// The handshake's `client.driver` as the server recorded it.
            pub async fn recorded_driver(uri: &str) -> Document {
                let (client, _) = client(uri).await;
                let reply = client
                    .database("admin")
                    .run_command(doc! { "labClientMetadata": 1 })
                    .await
                    .expect("labClientMetadata");
                let records = reply.get_array("metadata").expect("metadata records");
                records
                    .iter()
                    .rev()
                    .find_map(|r| r.as_document()?.get_document("driver").ok())
                    .expect("a handshake with client.driver")
                    .clone()
            }
        }
    };
}

scenarios!(fork, mongodb);
scenarios!(upstream, mongodb_upstream);

#[tokio::test]
async fn b1_catalog_and_search_index_commands_retry_on_overload() {
    let server = Server::standalone();
    let uri = server.uri_with("retryWrites=true");
    // The fork's third attempt reaches the server's own answer: success for the catalog
    // commands, 31082 SearchNotEnabled for the search-index ones.
    let search_not_enabled = (false, Some(31082));
    for (command, third_attempt) in [
        ("create", (true, None)),
        ("drop", (true, None)),
        ("dropDatabase", (true, None)),
        ("createSearchIndexes", search_not_enabled),
        ("updateSearchIndex", search_not_enabled),
        ("dropSearchIndex", search_not_enabled),
    ] {
        let up = upstream::catalog_command_under_overload(&uri, command).await;
        assert_eq!(
            (up.attempts, up.ok, up.code),
            (1, false, Some(462)),
            "upstream 3.9.1 should give {command} a single attempt (defect B1): {up:?}"
        );
        let fork = fork::catalog_command_under_overload(&uri, command).await;
        assert_eq!(
            (fork.attempts, (fork.ok, fork.code)),
            (3, third_attempt),
            "the fork retries {command} twice: {fork:?}"
        );
    }
}

/// Whether `2u32.pow(32)`, the expression upstream's backoff evaluates at retry 32, panics in
/// this build. The default profiles build the driver crates with the same overflow checks as this
/// test (on in `dev`/`test`, off in `release`/`bench`), so this tells which of upstream's two
/// failure modes the test must see.
fn overflow_checks_on() -> bool {
    std::panic::catch_unwind(|| std::hint::black_box(2u32).pow(std::hint::black_box(32))).is_err()
}

/// The message of a caught panic, whichever of the two payload types `panic!` produced.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "current_thread")]
async fn b3_backoff_survives_more_than_31_retries() {
    use std::time::Duration;
    // Each driver gets its own server: upstream may panic with the fail point still on.
    let upstream_server = Server::standalone();
    // While the operation waits on the network, a paused clock jumps to the next timer; with a
    // connect timeout, a monitor check then times out in virtual time, the pool is cleared and
    // some retries fail to connect instead of sending a `find`. Without one, every retry is a
    // `find`, so the timeline shows each retry.
    let up_uri = upstream_server.uri_with("retryReads=true&connectTimeoutMS=0");
    let timeline = FindTimeline::default();
    // Forty backoffs of up to 10 s pass in virtual time. The panic (with overflow checks)
    // happens inside the operation's future, so the scenario runs as a task.
    let recorded = timeline.clone();
    let up =
        tokio::spawn(async move { upstream::overload_retry_timeline(&up_uri, 40, recorded).await })
            .await;
    let backoffs = timeline.backoffs();
    // Upstream's backoff is jitter * min(10 s, 100 ms * 2^retry): from retry 7 on the cap
    // applies, so retries 1 to 31 wait about 5 s each on average. Seeing more than 10 s in all
    // shows the timeline does measure backoffs (and is not, say, reading a real clock that a
    // paused runtime never moves), so the zero waits asserted below mean something.
    let before_overflow: Duration = backoffs.iter().take(31).sum();
    assert!(
        before_overflow > Duration::from_secs(10),
        "upstream backs off before retry 32: {backoffs:?}"
    );
    // Nor does anything else move the clock between a failure and the next attempt: no wait
    // exceeds its retry's ceiling (plus the 1 ms tick tokio's timer rounds a deadline up to).
    for (retry, backoff) in (1u32..).zip(&backoffs).take(31) {
        let ceiling = Duration::from_millis(100 << retry.min(7)).min(Duration::from_secs(10));
        assert!(
            *backoff <= ceiling + Duration::from_millis(1),
            "retry {retry} waited {backoff:?}, more than upstream's {ceiling:?}: {backoffs:?}"
        );
    }
    if overflow_checks_on() {
        // With overflow checks (`dev`, `test`): `2u32.pow(32)` panics when the 32nd attempt's
        // failure is turned into retry 32's backoff, so exactly 32 attempts were sent.
        let panic = match up {
            Err(join) if join.is_panic() => join.into_panic(),
            other => panic!(
                "upstream 3.9.1 should panic computing retry 32's backoff (defect B3), got {other:?}"
            ),
        };
        let message = panic_message(panic.as_ref());
        assert!(
            message.contains("overflow"),
            "upstream's panic is the backoff overflow (defect B3): {message}"
        );
        assert_eq!(
            timeline.counts(),
            (32, 32),
            "upstream panics right after the 32nd attempt fails (defect B3)"
        );
    } else {
        // Without them (`release`): `2u32.pow(n)` wraps to 0 for every n >= 32, so retries 32
        // to 40 are sent back to back, a retry storm against a server that is shedding load. A
        // zero sleep still waits for tokio's next 1 ms timer tick, hence the bound. Without the
        // defect each of these nine waits would be jitter * 10 s.
        let up = up.expect("upstream does not panic without overflow checks");
        assert_eq!(
            (up.attempts, up.ok, up.code, up.overload_labels),
            (41, false, Some(462), true),
            "upstream makes all 40 retries: {up:?}"
        );
        assert_eq!(backoffs.len(), 40, "{backoffs:?}");
        let storm = &backoffs[31..];
        assert!(
            storm.iter().all(|b| *b < Duration::from_millis(2)),
            "upstream 3.9.1 sends retries 32 to 40 without backoff (defect B3): {storm:?}"
        );
    }
    let fork_server = Server::standalone();
    // Jitter pinned to 0 makes every backoff zero without skipping its arithmetic, which is
    // where upstream overflows; the run is then deterministic and needs no virtual time.
    let fork_uri = fork_server.uri_with("retryReads=true");
    let fork = mongodb::fork::test_hooks::with_pinned_jitter(
        0.0,
        fork::many_overload_retries(&fork_uri, 40),
    )
    .await;
    assert_eq!(
        (fork.attempts, fork.ok, fork.code, fork.overload_labels),
        (41, false, Some(462), true),
        "the fork makes all 40 retries and returns the overload error: {fork:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn b5_token_bucket_cannot_be_enabled_through_serde() {
    let server = Server::standalone();
    let up = upstream::serde_enabled_token_bucket(&server.uri).await;
    assert_eq!(
        up.attempts, 1,
        "upstream 3.9.1 lets serde enable the withdrawn bucket, which then refuses retries (defect B5): {up:?}"
    );
    let fork = fork::serde_enabled_token_bucket(&server.uri).await;
    assert_eq!(
        fork.attempts, 3,
        "the fork keeps retrying as the spec requires: {fork:?}"
    );
}

#[tokio::test]
async fn b7_uri_suggestions_name_real_overload_options() {
    let up = upstream::suggestion_for("enableOverloadRetargetting").await;
    let fork = fork::suggestion_for("enableOverloadRetargetting").await;
    assert!(
        !up.contains("enableoverloadretargeting"),
        "upstream 3.9.1 cannot suggest enableOverloadRetargeting (defect B7): {up}"
    );
    assert!(fork.contains("enableoverloadretargeting"), "{fork}");

    // Upstream rejects `adaptiveRetries` and then suggests that very option.
    let up = upstream::suggestion_for("adaptiveRetries").await;
    let fork = fork::suggestion_for("adaptiveRetries").await;
    assert!(
        up.contains("similar name exists: adaptiveretries"),
        "upstream suggests the option it just rejected (defect B7): {up}"
    );
    assert!(!fork.contains("exists: adaptiveretries"), "{fork}");
}

#[tokio::test]
async fn b9_commit_retry_after_non_retryable_overload_upgrades_write_concern() {
    let server = Server::replica_set();
    let up = upstream::commit_retry_write_concern(&server.uri).await;
    assert!(
        up.as_ref().and_then(|wc| wc.get_str("w").ok()) != Some("majority"),
        "upstream 3.9.1 skips the majority upgrade on SystemOverloadedError alone (defect B9): {up:?}"
    );
    let fork = fork::commit_retry_write_concern(&server.uri).await;
    assert_eq!(
        fork.as_ref().and_then(|wc| wc.get_str("w").ok()),
        Some("majority"),
        "the fork applies the retryable-writes rule: {fork:?}"
    );
}

#[tokio::test]
async fn b10_unknown_required_op_msg_flag_is_an_error() {
    let server = Server::standalone();
    let up = upstream::insert_with_unknown_required_flag(&server.uri, "b10-upstream").await;
    assert_eq!(
        up,
        Ok(()),
        "upstream 3.9.1 reads a reply with an unknown required flag bit as a success (defect B10)"
    );
    let fork = fork::insert_with_unknown_required_flag(&server.uri, "b10-fork").await;
    let message = fork.expect_err("the fork refuses the reply");
    assert!(message.contains("unknown required flag bits"), "{message}");
}

#[tokio::test]
async fn b11_max_pool_size_zero_means_no_limit() {
    let server = Server::standalone();
    let up = upstream::concurrent_finds_without_pool_limit(&server.uri).await;
    let message = up.expect_err("upstream 3.9.1 refuses maxPoolSize=0 (defect B11)");
    assert!(message.contains("maxPoolSize=0"), "{message}");
    let fork = fork::concurrent_finds_without_pool_limit(&server.uri)
        .await
        .expect("the fork accepts maxPoolSize=0");
    // The default limit would stop at 10; no limit lets every held find have a connection.
    assert!(
        fork >= 15,
        "the pool created {fork} connections for 15 concurrent finds"
    );
}

#[tokio::test]
async fn handshake_names_the_fork() {
    let server = Server::standalone();
    let up = upstream::recorded_driver(&server.uri).await;
    assert_eq!(up.get_str("name"), Ok("mongo-rust-driver"), "{up}");
    let fork = fork::recorded_driver(&server.uri).await;
    assert_eq!(
        fork.get_str("name"),
        Ok("mongo-rust-driver|mongodb-overload"),
        "{fork}"
    );
    assert_eq!(
        fork.get_str("version"),
        Ok(format!("3.9.1|{}", mongodb::fork::FORK_VERSION).as_str()),
        "{fork}"
    );
}

/// A minimal tracing subscriber that counts events on the fork's overload target.
mod overload_events {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use tracing::{span, Event, Metadata, Subscriber};

    #[derive(Clone, Default)]
    pub struct Counter(pub Arc<AtomicUsize>);

    impl Subscriber for Counter {
        fn enabled(&self, metadata: &Metadata<'_>) -> bool {
            metadata.target() == "mongodb::overload"
        }
        fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
            span::Id::from_u64(1)
        }
        fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
        fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
        fn event(&self, event: &Event<'_>) {
            if event.metadata().target() == "mongodb::overload" {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        fn enter(&self, _: &span::Id) {}
        fn exit(&self, _: &span::Id) {}
    }

    impl Counter {
        pub fn count(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }
}

/// A tracing subscriber that keeps, for each command log message, its text and `databaseName`,
/// for the commands named `ping` or `b12NoSuchCommand` (others, such as the `endSessions` of a
/// client being dropped, are not the scenario's).
mod command_log {
    use std::fmt;
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::{span, Event, Metadata, Subscriber};

    /// A message's text and its `databaseName`, if it has one.
    pub type Message = (String, Option<String>);

    #[derive(Clone, Default)]
    pub struct Messages(pub Arc<Mutex<Vec<Message>>>);

    #[derive(Default)]
    struct Fields {
        message: String,
        command: String,
        database: Option<String>,
    }

    impl Visit for Fields {
        fn record_str(&mut self, field: &Field, value: &str) {
            match field.name() {
                "databaseName" => self.database = Some(value.to_string()),
                "commandName" => self.command = value.to_string(),
                _ => {}
            }
        }
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            match field.name() {
                "message" => self.message = format!("{value:?}"),
                "databaseName" => self.database = Some(format!("{value:?}")),
                "commandName" => self.command = format!("{value:?}"),
                _ => {}
            }
        }
    }

    impl Subscriber for Messages {
        fn enabled(&self, metadata: &Metadata<'_>) -> bool {
            metadata.target() == "mongodb::command"
        }
        fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
            span::Id::from_u64(1)
        }
        fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
        fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
        fn event(&self, event: &Event<'_>) {
            if event.metadata().target() == "mongodb::command" {
                let mut fields = Fields::default();
                event.record(&mut fields);
                if matches!(fields.command.as_str(), "ping" | "b12NoSuchCommand") {
                    self.0
                        .lock()
                        .unwrap()
                        .push((fields.message, fields.database));
                }
            }
        }
        fn enter(&self, _: &span::Id) {}
        fn exit(&self, _: &span::Id) {}
    }

    impl Messages {
        /// Takes the messages recorded so far.
        pub fn take(&self) -> Vec<Message> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }
}

#[tokio::test]
async fn b14_a_small_upload_ensures_the_bucket_indexes() {
    let server = Server::standalone();
    let up = upstream::small_upload_index_commands(&server.uri).await;
    assert_eq!(
        up, 0,
        "upstream 3.9.1 checks no index for a file smaller than a chunk (defect B14)"
    );
    let fork = fork::small_upload_index_commands(&server.uri).await;
    assert_eq!(
        fork, 4,
        "the fork lists and creates the files' and the chunks' index"
    );
}

#[tokio::test]
async fn b13_change_stream_comment_stays_out_of_the_stage() {
    let server = Server::replica_set();
    let up = upstream::change_stream_stage_with_comment(&server.uri).await;
    assert_eq!(
        up.get_str("comment"),
        Ok("b13"),
        "upstream 3.9.1 puts the comment in the $changeStream stage too (defect B13): {up}"
    );
    let fork = fork::change_stream_stage_with_comment(&server.uri).await;
    assert!(
        !fork.contains_key("comment"),
        "the fork sends the comment on the aggregate only: {fork}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn b12_command_log_names_the_database_of_every_message() {
    let server = Server::standalone();
    let log = command_log::Messages::default();
    let _guard = tracing::subscriber::set_default(log.clone());
    let b12 = Some("b12".to_string());
    let message = |text: &str| (text.to_string(), b12.clone());

    upstream::ping_and_unknown_command(&server.uri).await;
    let up = log.take();
    let started: Vec<_> = up.iter().filter(|m| m.0 == "Command started").collect();
    assert_eq!(
        started,
        [&message("Command started"), &message("Command started")],
        "{up:?}"
    );
    let finished: Vec<_> = up.iter().filter(|m| m.0 != "Command started").collect();
    assert_eq!(finished.len(), 2, "{up:?}");
    assert!(
        finished.iter().all(|m| m.1.is_none()),
        "upstream 3.9.1 logs no databaseName when a command succeeds or fails (defect B12): {up:?}"
    );

    fork::ping_and_unknown_command(&server.uri).await;
    let fork = log.take();
    assert_eq!(
        fork,
        [
            message("Command started"),
            message("Command succeeded"),
            message("Command started"),
            message("Command failed"),
        ],
        "the fork names the database in every command message"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn f1_every_retry_is_logged_on_the_overload_target() {
    let server = Server::standalone();
    let uri = server.uri_with("retryReads=true");
    let events = overload_events::Counter::default();
    let _guard = tracing::subscriber::set_default(events.clone());

    let (client, _) = upstream::client(&uri).await;
    let coll = client
        .database("f1")
        .collection::<mongodb_upstream::bson::Document>("c");
    upstream::fail_with_overload(
        &client,
        "find",
        mongodb_upstream::bson::doc! { "times": 2 }.into(),
    )
    .await;
    coll.find_one(mongodb_upstream::bson::doc! {})
        .await
        .expect("find after two retries");
    assert_eq!(
        events.count(),
        0,
        "upstream 3.9.1 logs no retry (the fork adds this, feature F1)"
    );

    let (client, _) = fork::client(&uri).await;
    let coll = client
        .database("f1")
        .collection::<mongodb::bson::Document>("c");
    fork::fail_with_overload(&client, "find", mongodb::bson::doc! { "times": 2 }.into()).await;
    coll.find_one(mongodb::bson::doc! {})
        .await
        .expect("find after two retries");
    assert_eq!(events.count(), 2, "the fork logs each of the two retries");
}

#[tokio::test]
async fn b8_first_error_returned_when_all_errors_say_no_writes_performed() {
    let server = Server::replica_set();
    let uri = server.uri_with("retryWrites=true&maxAdaptiveRetries=2");
    let up = upstream::error_after_no_writes_performed_errors(&uri).await;
    assert_eq!(
        up,
        Some(10107),
        "upstream 3.9.1 returns the last error (defect B8)"
    );
    let fork = fork::error_after_no_writes_performed_errors(&uri).await;
    assert_eq!(
        fork,
        Some(91),
        "the fork returns the first error, as the spec requires"
    );
}

#[tokio::test]
async fn b4_any_base_backoff_keeps_the_overload_error() {
    use mongodb::bson::Bson;
    let server = Server::standalone();
    let uri = server.uri_with("retryReads=true");
    for value in [
        Bson::Double(2.5),
        Bson::Int32(-5),
        Bson::Double(f64::NAN),
        Bson::String("soon".into()),
    ] {
        let up = upstream::overload_with_base_backoff(&uri, value.clone()).await;
        assert_eq!(
            (up.attempts, up.ok, up.code, up.overload_labels),
            (1, false, None, false),
            "upstream 3.9.1 turns the overload error into InvalidResponse for baseBackoffMS {value} (defect B4): {up:?}"
        );
        let fork = fork::overload_with_base_backoff(&uri, value.clone()).await;
        assert_eq!(
            (fork.attempts, fork.ok),
            (3, true),
            "the fork ignores baseBackoffMS {value} and retries: {fork:?}"
        );
    }
}

#[tokio::test]
async fn b2_acknowledged_bulk_write_is_never_sent_again() {
    let server = Server::replica_set();
    let uri = server.uri_with("retryWrites=true&retryReads=true");
    let (sent, n) = upstream::bulk_write_with_failing_get_more(&uri).await;
    assert_eq!(
        (sent, n),
        (3, 6),
        "upstream 3.9.1 resends the acknowledged bulkWrite: every attempt increments twice (defect B2)"
    );
    let (sent, n) = fork::bulk_write_with_failing_get_more(&uri).await;
    assert_eq!((sent, n), (1, 2), "the fork sends the bulkWrite once");
}

#[tokio::test]
async fn b1_load_balanced_bulk_write_results_get_more_is_retried() {
    let server = Server::start(emulator::Topology::Sharded { routers: 1 });
    let uri = server.load_balanced_uri();
    let (bulk_writes, get_mores, ok) =
        upstream::load_balanced_bulk_write_get_more_overloaded_once(&uri).await;
    // Upstream does not retry the pinned getMore; the overload labels on its error make the
    // whole acknowledged bulkWrite look retryable, so it is sent again (only the retryable-write
    // deduplication of these inserts keeps the data right).
    assert_eq!(
        (bulk_writes, get_mores, ok),
        (2, 2, true),
        "upstream 3.9.1 resends the bulkWrite instead of retrying its results getMore in \
         load-balanced mode (defects B1 and B2)"
    );
    let (bulk_writes, get_mores, ok) =
        fork::load_balanced_bulk_write_get_more_overloaded_once(&uri).await;
    assert_eq!(
        (bulk_writes, get_mores, ok),
        (1, 2, true),
        "the fork sends the bulkWrite once and retries the pinned getMore on its connection"
    );
}

#[tokio::test]
async fn b6_tls_validation_failures_are_not_overload_errors() {
    let server = Server::standalone();
    let backend: std::net::SocketAddr = server
        .uri
        .trim_start_matches("mongodb://")
        .split('/')
        .next()
        .and_then(|host| host.parse().ok())
        .expect("a standalone uri names one address");
    let front = emulator::tls::TlsFront::start(backend)
        .await
        .expect("TLS front");
    let ca_file = std::env::temp_dir().join(format!(
        "mongodb-overload-b6-{}-{}.pem",
        std::process::id(),
        front.address().port()
    ));
    std::fs::write(&ca_file, front.ca_pem()).expect("CA file");
    let ca_file = ca_file.to_string_lossy().into_owned();

    let (labelled, cleared) =
        upstream::untrusted_certificate_on_pool_connection(&front, &ca_file).await;
    assert!(
        labelled && cleared == 0,
        "upstream 3.9.1 labels a certificate failure as overload and keeps the pool (defect B6): labels {labelled}, pool cleared {cleared} times"
    );
    let (labelled, cleared) =
        fork::untrusted_certificate_on_pool_connection(&front, &ca_file).await;
    assert!(
        !labelled && cleared >= 1,
        "the fork treats it as a network error: labels {labelled}, pool cleared {cleared} times"
    );
    let _ = std::fs::remove_file(&ca_file);
}
