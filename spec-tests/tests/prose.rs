//! Prose tests of the Client Backpressure specification and the overload cases of the Retryable
//! Reads (3.1-3.3) and Retryable Writes (6) prose tests, run against the emulator with the fork.
//!
//! Jitter is pinned with the fork's hidden `overload-test-hooks` feature
//! (`mongodb::fork::test_hooks::with_pinned_jitter`), the injectable jitter source of the
//! `overload` crate's backoff.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{fail_point_blocking, Server};
use mongodb::{
    bson::{doc, Document},
    error::{Error, ErrorKind},
    event::{command::CommandEvent, EventHandler},
    fork::test_hooks::with_pinned_jitter,
    options::ClientOptions,
    Client,
};

/// Started commands (name and the address they went to) and failed-command codes, in order.
#[derive(Clone, Default)]
struct Events {
    started: Arc<Mutex<Vec<(String, String)>>>,
}

impl Events {
    fn started(&self, name: &str) -> Vec<String> {
        self.started
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, address)| address.clone())
            .collect()
    }
}

async fn client_with(
    uri: &str,
    on_failed: Option<Arc<dyn Fn(i32) + Send + Sync>>,
) -> (Client, Events) {
    let mut options = ClientOptions::parse(uri).await.expect("valid uri");
    let events = Events::default();
    let sink = events.clone();
    options.command_event_handler =
        Some(EventHandler::callback(
            move |event: CommandEvent| match event {
                CommandEvent::Started(e) => sink
                    .started
                    .lock()
                    .unwrap()
                    .push((e.command_name, e.connection.address.to_string())),
                CommandEvent::Failed(e) => {
                    if let (Some(hook), ErrorKind::Command(c)) =
                        (&on_failed, e.failure.kind.as_ref())
                    {
                        hook(c.code);
                    }
                }
                _ => {}
            },
        ));
    (Client::with_options(options).expect("client"), events)
}

async fn client(uri: &str) -> (Client, Events) {
    client_with(uri, None).await
}

async fn fail_point(client: &Client, spec: Document) {
    client
        .database("admin")
        .run_command(spec)
        .await
        .expect("configureFailPoint");
}

fn code(error: &Error) -> Option<i32> {
    match error.kind.as_ref() {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) => Some(w.code),
        _ => None,
    }
}

fn overload_fail_point(command: &str, mode: mongodb::bson::Bson, code: i32) -> Document {
    doc! {
        "configureFailPoint": "failCommand",
        "mode": mode,
        "data": {
            "failCommands": [command],
            "errorCode": code,
            "errorLabels": ["SystemOverloadedError", "RetryableError"],
        },
    }
}

/// Backpressure prose test 1: retries after overload errors back off exponentially.
#[tokio::test]
async fn backpressure_1_retries_use_exponential_backoff() {
    let server = Server::standalone();
    let (client, events) = client(&server.uri).await;
    let coll = client.database("prose").collection::<Document>("backoff");
    fail_point(&client, overload_fail_point("insert", "alwaysOn".into(), 2)).await;

    let timed = |jitter: f64| {
        let coll = coll.clone();
        async move {
            let start = Instant::now();
            let result = with_pinned_jitter(jitter, coll.insert_one(doc! { "a": 1 })).await;
            assert!(result.is_err(), "the insert must fail");
            start.elapsed()
        }
    };
    let without_backoff = timed(0.0).await;
    let with_backoff = timed(1.0).await;
    assert_eq!(events.started("insert").len(), 6, "3 attempts per insert");
    // Jitter 1 sleeps the full 200 ms + 400 ms ceilings of retries 1 and 2.
    let difference = with_backoff.saturating_sub(without_backoff);
    assert!(
        difference >= Duration::from_millis(500),
        "with backoff {with_backoff:?}, without {without_backoff:?}"
    );
}

/// Backpressure prose test 3: overload errors are retried at most maxAdaptiveRetries times.
#[tokio::test]
async fn backpressure_3_overload_errors_retried_at_most_max_retries() {
    let server = Server::standalone();
    let (client, events) = client(&server.uri).await;
    let coll = client.database("prose").collection::<Document>("max");
    fail_point(&client, overload_fail_point("find", "alwaysOn".into(), 462)).await;
    let error = with_pinned_jitter(0.0, coll.find_one(doc! {}))
        .await
        .expect_err("find fails");
    assert!(
        error.contains_label("RetryableError") && error.contains_label("SystemOverloadedError")
    );
    assert_eq!(events.started("find").len(), 3, "MAX_RETRIES (2) + 1");
}

/// Runs one `find` on a two-member replica set (primaryPreferred) whose primary fails it once
/// with `code` and `labels`, and returns the addresses of the two attempts.
async fn retry_addresses(options: &str, code: i32, labels: &[&str]) -> Vec<String> {
    let server = Server::replica_set_of(2);
    let mut extra = String::from("readPreference=primaryPreferred&retryReads=true");
    if !options.is_empty() {
        extra.push('&');
        extra.push_str(options);
    }
    let uri = server.uri_with(&extra);
    let (client, events) = client(&uri).await;
    // configureFailPoint is sent to the primary, so only the primary fails.
    fail_point(
        &client,
        doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": { "failCommands": ["find"], "errorCode": code, "errorLabels": labels },
        },
    )
    .await;
    let coll = client.database("prose").collection::<Document>("retarget");
    with_pinned_jitter(0.0, coll.find_one(doc! {}))
        .await
        .expect("the retry succeeds");
    let addresses = events.started("find");
    assert_eq!(addresses.len(), 2, "one failure, one retry: {addresses:?}");
    addresses
}

/// Backpressure prose test 4 and retryable-reads prose test 3.1: with
/// enableOverloadRetargeting, a read failing with a retryable overload error is retried on
/// another server.
#[tokio::test]
async fn retargeting_on_moves_overload_retries_to_another_server() {
    for code in [462, 6] {
        let addresses = retry_addresses(
            "enableOverloadRetargeting=true",
            code,
            &["RetryableError", "SystemOverloadedError"],
        )
        .await;
        assert_ne!(addresses[0], addresses[1], "code {code}: {addresses:?}");
    }
}

/// Retryable-reads prose test 3.2: a non-overload retryable error is retried on the same
/// server, retargeting or not.
#[tokio::test]
async fn non_overload_retries_stay_on_the_same_server() {
    for options in [
        "enableOverloadRetargeting=false",
        "enableOverloadRetargeting=true",
    ] {
        let addresses = retry_addresses(options, 6, &["RetryableError"]).await;
        assert_eq!(addresses[0], addresses[1], "{options}: {addresses:?}");
    }
}

/// Retryable-reads prose test 3.3: without enableOverloadRetargeting (the default), an overload
/// retry goes back to the same server.
#[tokio::test]
async fn retargeting_off_keeps_overload_retries_on_the_same_server() {
    let addresses = retry_addresses("", 6, &["RetryableError", "SystemOverloadedError"]).await;
    assert_eq!(addresses[0], addresses[1], "{addresses:?}");
}

/// Backpressure prose test 5: a positive server `baseBackoffMS` replaces the 100 ms base.
#[tokio::test]
async fn backpressure_5_server_base_backoff_replaces_the_default() {
    let server = Server::standalone();
    let (client, _) = client(&server.uri).await;
    let coll = client.database("prose").collection::<Document>("base");
    fail_point(&client, overload_fail_point("find", "alwaysOn".into(), 462)).await;

    let timed = || {
        let coll = coll.clone();
        async move {
            let start = Instant::now();
            let _ = with_pinned_jitter(1.0, coll.find_one(doc! {})).await;
            start.elapsed()
        }
    };
    let default_base = timed().await; // 200 + 400 ms
    fail_point(
        &client,
        doc! { "setParameter": 1, "externalClientBaseBackoffMS": 300 },
    )
    .await;
    let server_base = timed().await; // 600 + 1200 ms
    assert!(
        server_base >= Duration::from_millis(1_700),
        "the server's 300 ms base gives 1.8 s of backoff, took {server_base:?}"
    );
    assert!(
        server_base.saturating_sub(default_base) >= Duration::from_millis(1_000),
        "default base {default_base:?}, server base {server_base:?}"
    );
}

/// The three cases of retryable-writes prose test 6 share this shape: the first insert attempt
/// fails with `first`; when its failure event arrives, the fail point is switched to `then`
/// (set before the driver retries).
async fn retryable_writes_6(first: Document, then: Document) -> Error {
    let server = Server::replica_set();
    let uri = server.uri_with("retryWrites=true");
    let switched = Arc::new(Mutex::new(false));
    let hook_uri = uri.clone();
    let hook_switched = switched.clone();
    let hook: Arc<dyn Fn(i32) + Send + Sync> = Arc::new(move |code| {
        let mut done = hook_switched.lock().unwrap();
        if code == 91 && !*done {
            *done = true;
            fail_point_blocking(&hook_uri, then.clone());
        }
    });
    let (client, _) = client_with(&uri, Some(hook)).await;
    fail_point(&client, first).await;
    let coll = client.database("prose").collection::<Document>("rw6");
    let error = with_pinned_jitter(0.0, coll.insert_one(doc! { "x": 1 }))
        .await
        .expect_err("the insert fails");
    fail_point(
        &client,
        doc! { "configureFailPoint": "failCommand", "mode": "off" },
    )
    .await;
    assert!(
        *switched.lock().unwrap(),
        "the first failure switched the fail point"
    );
    error
}

fn insert_fail_point(mode: mongodb::bson::Bson, code: i32, labels: &[&str]) -> Document {
    doc! {
        "configureFailPoint": "failCommand",
        "mode": mode,
        "data": { "failCommands": ["insert"], "errorCode": code, "errorLabels": labels },
    }
}

/// Retryable writes prose test 6, case 1: only errors without NoWritesPerformed: the last error
/// is returned.
#[tokio::test]
async fn retryable_writes_6_case_1_last_error_without_no_writes_performed() {
    let overload = ["RetryableError", "SystemOverloadedError"];
    let error = retryable_writes_6(
        insert_fail_point(doc! { "times": 1 }.into(), 91, &overload),
        insert_fail_point("alwaysOn".into(), 10107, &overload),
    )
    .await;
    assert_eq!(code(&error), Some(10107), "{error:?}");
}

/// Case 2: only errors with NoWritesPerformed: the first error is returned.
#[tokio::test]
async fn retryable_writes_6_case_2_first_error_when_all_have_no_writes_performed() {
    let labels = [
        "RetryableError",
        "SystemOverloadedError",
        "NoWritesPerformed",
    ];
    let error = retryable_writes_6(
        insert_fail_point(doc! { "times": 1 }.into(), 91, &labels),
        insert_fail_point("alwaysOn".into(), 10107, &labels),
    )
    .await;
    assert_eq!(code(&error), Some(91), "{error:?}");
}

/// Case 3: an error without NoWritesPerformed followed by errors with it: the error that may
/// have written is returned.
#[tokio::test]
async fn retryable_writes_6_case_3_error_that_may_have_written_wins() {
    let error = retryable_writes_6(
        insert_fail_point(
            doc! { "times": 1 }.into(),
            91,
            &["RetryableError", "SystemOverloadedError"],
        ),
        insert_fail_point(
            "alwaysOn".into(),
            91,
            &[
                "RetryableError",
                "SystemOverloadedError",
                "NoWritesPerformed",
            ],
        ),
    )
    .await;
    assert_eq!(code(&error), Some(91), "{error:?}");
    assert!(!error.contains_label("NoWritesPerformed"), "{error:?}");
}

/// The handshake requirement of the Client Backpressure specification: every connection's
/// handshake tells the server that the driver takes part in backpressure (`backpressure: "2"`,
/// a string, as the handshake specification writes it).
#[tokio::test]
async fn handshake_advertises_backpressure() {
    let server = Server::standalone();
    let (client, _) = client(&server.uri).await;
    let reply = client
        .database("admin")
        .run_command(doc! { "labClientMetadata": 1 })
        .await
        .expect("labClientMetadata");
    let records = reply.get_array("metadata").expect("metadata records");
    assert!(!records.is_empty(), "the emulator recorded no handshake");
    for record in records {
        let record = record.as_document().expect("a metadata document");
        assert_eq!(
            record.get("backpressure"),
            Some(&mongodb::bson::Bson::String("2".to_owned())),
            "{record}"
        );
    }
}

/// Client Backpressure: only an error labelled both `SystemOverloadedError` and `RetryableError`
/// is an overload retry. A find failing with either label alone and a code that no ordinary
/// retry rule covers (2, BadValue) is sent once.
#[tokio::test]
async fn overload_retries_need_both_labels() {
    let server = Server::standalone();
    let (client, events) = client(&server.uri).await;
    let coll = client.database("prose").collection::<Document>("labels");
    for label in ["RetryableError", "SystemOverloadedError"] {
        fail_point(
            &client,
            doc! {
                "configureFailPoint": "failCommand",
                "mode": { "times": 3 },
                "data": { "failCommands": ["find"], "errorCode": 2, "errorLabels": [label] },
            },
        )
        .await;
        let before = events.started("find").len();
        let error = with_pinned_jitter(0.0, coll.find_one(doc! {}))
            .await
            .expect_err("find fails");
        let attempts = events.started("find").len() - before;
        fail_point(
            &client,
            doc! { "configureFailPoint": "failCommand", "mode": "off" },
        )
        .await;
        assert_eq!(code(&error), Some(2), "{label}: {error:?}");
        assert_eq!(
            attempts, 1,
            "{label} alone must not make the find retryable"
        );
    }
}

/// Client Backpressure: once an operation has failed with an overload error, its retries stay
/// capped by `maxAdaptiveRetries` (2) even when later failures are ordinary retryable errors. The
/// first find fails for overload, every later one with 91 (ShutdownInProgress, a retryable read
/// error): three attempts, where the ordinary rule alone would allow two.
#[tokio::test]
async fn adaptive_cap_covers_ordinary_retries_after_an_overload_error() {
    let server = Server::standalone();
    let switched = Arc::new(Mutex::new(false));
    let (hook_uri, hook_switched) = (server.uri.clone(), switched.clone());
    let hook: Arc<dyn Fn(i32) + Send + Sync> = Arc::new(move |code| {
        let mut done = hook_switched.lock().unwrap();
        if code == 462 && !*done {
            *done = true;
            fail_point_blocking(
                &hook_uri,
                doc! {
                    "configureFailPoint": "failCommand",
                    "mode": "alwaysOn",
                    "data": { "failCommands": ["find"], "errorCode": 91 },
                },
            );
        }
    });
    let (client, events) = client_with(&server.uri, Some(hook)).await;
    fail_point(
        &client,
        overload_fail_point("find", doc! { "times": 1 }.into(), 462),
    )
    .await;
    let coll = client.database("prose").collection::<Document>("sticky");
    let error = with_pinned_jitter(0.0, coll.find_one(doc! {}))
        .await
        .expect_err("find fails");
    fail_point(
        &client,
        doc! { "configureFailPoint": "failCommand", "mode": "off" },
    )
    .await;
    assert!(
        *switched.lock().unwrap(),
        "the overload failure switched the fail point"
    );
    assert_eq!(code(&error), Some(91), "{error:?}");
    assert_eq!(
        events.started("find").len(),
        3,
        "one attempt and two retries"
    );
}

/// Client Backpressure, "all commands support retries on server overload": the specification
/// names create collection explicitly, and the rule covers the other catalog commands too.
/// Each command below is rejected twice for overload and must succeed on its third attempt.
/// (Upstream 3.9.1 sends each once, defect B1; `defects.rs` shows both drivers side by side.)
#[tokio::test]
async fn catalog_commands_are_retried_on_overload() {
    let server = Server::standalone();
    let (client, events) = client(&server.uri).await;
    let db = client.database("prose_catalog");
    for command in ["create", "drop", "dropDatabase"] {
        fail_point(
            &client,
            overload_fail_point(command, doc! { "times": 2 }.into(), 462),
        )
        .await;
        let before = events.started(command).len();
        let result = match command {
            "create" => with_pinned_jitter(0.0, db.create_collection("made")).await,
            "drop" => with_pinned_jitter(0.0, db.collection::<Document>("made").drop()).await,
            _ => with_pinned_jitter(0.0, db.drop()).await,
        };
        let attempts = events.started(command).len() - before;
        result.unwrap_or_else(|error| panic!("{command} after two overload errors: {error:?}"));
        assert_eq!(
            attempts, 3,
            "{command}: one attempt and two overload retries"
        );
    }
}
