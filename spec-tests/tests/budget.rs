//! The client-wide retry budget and overload statistics (issue 14), against the emulator.
//!
//! The budget's arithmetic is tested in `overload::budget`; these tests check the driver's
//! wiring: the options, where the executor deposits and withdraws, what a refused retry
//! returns, what the statistics count, and that application retries draw from the same budget.
//! Backoff jitter is pinned (the fork's hidden test hook) so that runs of hundreds of failing
//! operations do not sleep.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{client_counting_finds, fail_command_off, Server};
use mongodb::{
    bson::{doc, Bson, Document},
    error::{Error, ErrorKind},
    event::{command::CommandEvent, EventHandler},
    fork::test_hooks::with_pinned_jitter,
    options::ClientOptions,
    Client, Collection,
};

/// The server code of the overload errors the fail points return; any code would do, the
/// labels make the error an overload error.
const OVERLOAD_CODE: i32 = 462;

/// Sets `failCommand` on `find` through a separate client, so that fail-point commands do not
/// count as operations of the client under test (they would deposit into its budget).
async fn fail_find(uri: &str, mode: Bson, code: i32, labels: &[&str]) {
    let client = Client::with_uri_str(uri).await.expect("client");
    client
        .database("admin")
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": mode,
            "data": { "failCommands": ["find"], "errorCode": code, "errorLabels": labels },
        })
        .await
        .expect("configureFailPoint");
}

async fn fail_find_with_overload(uri: &str, mode: Bson) {
    let labels = ["SystemOverloadedError", "RetryableError"];
    fail_find(uri, mode, OVERLOAD_CODE, &labels).await;
}

/// One `find_one` with backoff jitter pinned to `jitter` (0: no sleep).
async fn find_one(coll: &Collection<Document>, jitter: f64) -> Result<(), Error> {
    with_pinned_jitter(jitter, coll.find_one(doc! {}))
        .await
        .map(|_| ())
}

fn server_code(error: &Error) -> Option<i32> {
    match error.kind.as_ref() {
        ErrorKind::Command(e) => Some(e.code),
        _ => None,
    }
}

/// The overload error the fail point returns, labels intact and nothing added.
fn assert_is_the_overload_error(error: &Error) {
    assert_eq!(server_code(error), Some(OVERLOAD_CODE), "{error:?}");
    assert!(error.contains_label("SystemOverloadedError"), "{error:?}");
    assert!(error.contains_label("RetryableError"), "{error:?}");
}

async fn parse_error(options: &str) -> String {
    ClientOptions::parse(format!("mongodb://localhost:27017/?{options}"))
        .await
        .map(|_| ())
        .expect_err(options)
        .to_string()
}

#[tokio::test]
async fn budget_options_parse_from_the_connection_string() {
    let options = ClientOptions::parse(
        "mongodb://localhost:27017/?retryBudget=true&retryBudgetPercent=12.5\
         &retryBudgetMinPerSec=3&retryBudgetWindowMS=2000",
    )
    .await
    .expect("valid budget options");
    assert_eq!(options.overload.retry_budget, Some(true));
    assert_eq!(options.overload.retry_budget_percent, Some(12.5));
    assert_eq!(options.overload.retry_budget_min_per_sec, Some(3));
    assert_eq!(
        options.overload.retry_budget_window,
        Some(Duration::from_millis(2000))
    );

    // Unset by default; the budget is off.
    let unset = ClientOptions::parse("mongodb://localhost:27017/")
        .await
        .unwrap();
    assert_eq!(unset.overload.retry_budget, None);
    assert_eq!(unset.overload.retry_budget_percent, None);
    assert_eq!(unset.overload.retry_budget_min_per_sec, None);
    assert_eq!(unset.overload.retry_budget_window, None);

    // The range ends are accepted.
    ClientOptions::parse(
        "mongodb://localhost:27017/?retryBudgetPercent=1000&retryBudgetMinPerSec=100000\
         &retryBudgetWindowMS=60000",
    )
    .await
    .expect("upper ends");
    ClientOptions::parse(
        "mongodb://localhost:27017/?retryBudgetPercent=0&retryBudgetMinPerSec=0\
         &retryBudgetWindowMS=1000",
    )
    .await
    .expect("lower ends");
}

#[tokio::test]
async fn invalid_budget_options_are_errors_naming_the_option() {
    let cases = [
        ("retryBudget=maybe", "retryBudget"),
        ("retryBudgetPercent=1500", "retryBudgetPercent"),
        ("retryBudgetPercent=-1", "retryBudgetPercent"),
        ("retryBudgetPercent=NaN", "retryBudgetPercent"),
        ("retryBudgetPercent=lots", "retryBudgetPercent"),
        ("retryBudgetMinPerSec=100001", "retryBudgetMinPerSec"),
        ("retryBudgetMinPerSec=-1", "retryBudgetMinPerSec"),
        ("retryBudgetWindowMS=999", "retryBudgetWindowMS"),
        ("retryBudgetWindowMS=60001", "retryBudgetWindowMS"),
        ("retryBudgetWindowMS=-5", "retryBudgetWindowMS"),
    ];
    for (options, option) in cases {
        let message = parse_error(options).await;
        assert!(message.contains(option), "{options}: {message}");
    }
    // Out-of-range options are refused even with the budget off (the default), so that a typo
    // does not wait for the day the budget is switched on.
    let message = parse_error("retryBudget=false&retryBudgetPercent=2000").await;
    assert!(message.contains("retryBudgetPercent"), "{message}");

    // Options set in code are validated when the client is created.
    let mut options = ClientOptions::parse("mongodb://localhost:27017/")
        .await
        .unwrap();
    options.overload.retry_budget = Some(true);
    options.overload.retry_budget_window = Some(Duration::from_millis(10));
    let error = Client::with_options(options).expect_err("window below range");
    assert!(error.to_string().contains("retryBudgetWindowMS"), "{error}");
}

#[tokio::test]
async fn without_a_budget_every_operation_makes_the_specifications_three_attempts() {
    let server = Server::standalone();
    let (client, attempts) = client_counting_finds(&server.uri).await;
    assert!(
        client.retry_budget().is_none(),
        "the budget is off by default"
    );
    let coll = client.database("t").collection::<Document>("c");
    fail_find_with_overload(&server.uri, "alwaysOn".into()).await;

    let ops = 20;
    for _ in 0..ops {
        let error = find_one(&coll, 0.0).await.expect_err("always overloaded");
        assert_is_the_overload_error(&error);
    }
    fail_command_off(&server.uri).await;

    assert_eq!(attempts.count(), 3 * ops);
    let stats = client.overload_stats();
    assert_eq!(stats.overload_errors_by_code.get(&OVERLOAD_CODE), Some(&60));
    assert_eq!(stats.overload_errors(), 60);
    assert_eq!(stats.retries_made, 40);
    assert_eq!(stats.retries_refused, 0);
    assert_eq!(stats.budget_level, None);
}

#[tokio::test]
async fn under_sustained_overload_the_budget_admits_no_retry_and_keeps_its_credit() {
    let server = Server::standalone();
    // The defaults: 9 % of first attempts, a floor of 1 retry per second over a 10 s window
    // (a reserve of 10 retries that starts full).
    let (client, attempts) = client_counting_finds(&server.uri_with("retryBudget=true")).await;
    let coll = client.database("t").collection::<Document>("c");
    fail_find_with_overload(&server.uri, "alwaysOn".into()).await;

    // Every attempt is rejected for overload: the server is shedding, and a retry would only
    // cost it another rejection. Without the budget each operation would make three attempts.
    let ops = 200;
    for _ in 0..ops {
        let error = find_one(&coll, 0.0).await.expect_err("always overloaded");
        assert_is_the_overload_error(&error);
    }
    fail_command_off(&server.uri).await;
    assert_eq!(attempts.count(), ops, "one attempt per operation");

    let stats = client.overload_stats();
    assert_eq!(stats.retries_made, 0);
    assert_eq!(stats.retries_refused, ops as u64, "{stats:?}");
    let overload_errors = stats.overload_errors_by_code.get(&OVERLOAD_CODE).copied();
    assert_eq!(overload_errors, Some(ops as u64));
    // The credit is kept for when the server accepts again: the reserve is untouched.
    let level = stats.budget_level.expect("the budget is on");
    assert!(level >= 10.0, "{level}");
    // An application retry loop sharing the budget is refused as well.
    let budget = client.retry_budget().expect("the budget is on");
    assert!(!budget.try_withdraw());

    // Once the server has accepted most of the client's recent attempts (over the budget's
    // 10 s window), an overload error is retried again.
    for _ in 0..250 {
        find_one(&coll, 0.0).await.expect("accepted");
    }
    fail_find_with_overload(&server.uri, doc! { "times": 1 }.into()).await;
    find_one(&coll, 0.0)
        .await
        .expect("retried after one overload error");
    assert_eq!(client.overload_stats().retries_made, 1);
}

#[tokio::test]
async fn a_refused_retry_returns_the_overload_error_with_its_labels() {
    let server = Server::standalone();
    // No share and no floor: the budget admits no retry at all.
    let uri = server.uri_with("retryBudget=true&retryBudgetPercent=0&retryBudgetMinPerSec=0");
    let (client, attempts) = client_counting_finds(&uri).await;
    let coll = client.database("t").collection::<Document>("c");
    fail_find_with_overload(&server.uri, doc! { "times": 1 }.into()).await;

    let error = find_one(&coll, 0.0)
        .await
        .expect_err("the retry is refused");
    fail_command_off(&server.uri).await;
    assert_is_the_overload_error(&error);
    let labels: Vec<&str> = error.labels().iter().map(String::as_str).collect();
    assert_eq!(labels.len(), 2, "no label added: {labels:?}");
    assert_eq!(attempts.count(), 1, "one attempt, no retry");

    let stats = client.overload_stats();
    assert_eq!(stats.retries_refused, 1);
    assert_eq!(stats.retries_made, 0);
    assert_eq!(stats.overload_errors_by_code.get(&OVERLOAD_CODE), Some(&1));
    assert_eq!(stats.budget_level, Some(0.0));
}

#[tokio::test]
async fn ordinary_retries_are_not_charged_to_the_budget() {
    let server = Server::standalone();
    let uri = server.uri_with("retryBudget=true&retryBudgetPercent=0&retryBudgetMinPerSec=0");
    let (client, attempts) = client_counting_finds(&uri).await;
    let coll = client.database("t").collection::<Document>("c");
    // 91 ShutdownInProgress: retryable for reads, and not an overload error.
    fail_find(&server.uri, doc! { "times": 1 }.into(), 91, &[]).await;

    find_one(&coll, 0.0)
        .await
        .expect("the retryable read retry is made even with an empty budget");
    fail_command_off(&server.uri).await;
    assert_eq!(attempts.count(), 2);
    let stats = client.overload_stats();
    assert_eq!(stats.retries_made, 1);
    assert_eq!(stats.retries_refused, 0);
    assert_eq!(stats.overload_errors(), 0);
}

#[tokio::test]
async fn statistics_count_backoff_and_errors_without_a_budget() {
    let server = Server::standalone();
    let (client, attempts) = client_counting_finds(&server.uri).await;
    let coll = client.database("t").collection::<Document>("c");
    fail_find_with_overload(&server.uri, doc! { "times": 2 }.into()).await;

    // Jitter 1: the full backoff ceilings, at least the 100 ms base and then twice that.
    let started = std::time::Instant::now();
    find_one(&coll, 1.0)
        .await
        .expect("succeeds at the third attempt");
    let elapsed = started.elapsed();
    fail_command_off(&server.uri).await;
    assert_eq!(attempts.count(), 3);
    let stats = client.overload_stats();
    // The time counted is the time slept: no less than the two ceilings, no more than the
    // operation took.
    assert!(
        stats.backoff_slept >= Duration::from_millis(300) && stats.backoff_slept <= elapsed,
        "{:?} slept in an operation of {elapsed:?}",
        stats.backoff_slept
    );
    assert_eq!(stats.retries_made, 2);
    assert_eq!(stats.overload_errors_by_code.get(&OVERLOAD_CODE), Some(&2));
    assert_eq!(stats.overload_errors_without_code, 0);
    assert_eq!(stats.application_retries_made, 0);
}

#[tokio::test]
async fn application_retries_draw_from_the_drivers_budget() {
    let server = Server::standalone();
    // No floor, half a retry per operation; the window (10 s) outlasts the test.
    let uri = server.uri_with("retryBudget=true&retryBudgetPercent=50&retryBudgetMinPerSec=0");
    let (client, attempts) = client_counting_finds(&uri).await;
    let budget: mongodb::fork::RetryBudgetHandle = client.retry_budget().expect("budget on");
    let coll = client.database("t").collection::<Document>("c");

    // Two successful operations deposit one whole retry, which the application takes.
    find_one(&coll, 0.0).await.unwrap();
    find_one(&coll, 0.0).await.unwrap();
    assert!(budget.try_withdraw(), "one retry's worth deposited");
    assert!(!budget.try_withdraw(), "and only one");

    // The driver's retry finds only the half this operation deposits: refused.
    fail_find_with_overload(&server.uri, doc! { "times": 1 }.into()).await;
    let error = find_one(&coll, 0.0).await.expect_err("retry refused");
    fail_command_off(&server.uri).await;
    assert_is_the_overload_error(&error);
    assert_eq!(attempts.count(), 3);

    // A clone of the handle is the same budget.
    let level = budget.level();
    assert!((0.49..0.51).contains(&level), "{level}");
    assert!(!client.retry_budget().unwrap().try_withdraw());

    let stats = client.overload_stats();
    assert_eq!(stats.application_retries_made, 1);
    assert_eq!(stats.application_retries_refused, 2);
    assert_eq!(stats.retries_made, 0);
    assert_eq!(stats.retries_refused, 1);
}

/// The application retry loop of `docs/options.md`: inserts `document`, running the insert again
/// (at most twice) while it fails with an overload error and the client's retry budget admits
/// another try.
async fn insert_with_app_retries(
    coll: &Collection<Document>,
    document: Document,
) -> Result<(), Error> {
    let budget = coll.client().retry_budget();
    let mut result = coll.insert_one(document.clone()).await.map(drop);
    for _ in 0..2 {
        let overloaded = matches!(&result, Err(e) if e.contains_label("SystemOverloadedError"));
        // No budget (retryBudget=false): keep the loop's own cap only.
        let admitted = budget.as_ref().is_none_or(|budget| budget.try_withdraw());
        if !overloaded || !admitted {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        result = coll.insert_one(document.clone()).await.map(drop);
    }
    result
}

/// Counts the `insert` commands a client starts.
async fn insert_counting_client(uri: &str) -> (Client, Arc<AtomicUsize>) {
    let mut options = ClientOptions::parse(uri).await.expect("valid uri");
    let inserts = Arc::new(AtomicUsize::new(0));
    let sink = Arc::clone(&inserts);
    options.command_event_handler = Some(EventHandler::callback(move |event: CommandEvent| {
        if let CommandEvent::Started(e) = event {
            if e.command_name == "insert" {
                sink.fetch_add(1, Ordering::SeqCst);
            }
        }
    }));
    (Client::with_options(options).expect("client"), inserts)
}

#[tokio::test]
async fn the_documented_application_loop_stops_multiplying_retries_with_a_budget() {
    let server = Server::standalone();
    let fail_inserts = || async {
        let client = Client::with_uri_str(&server.uri).await.expect("client");
        client
            .database("admin")
            .run_command(doc! {
                "configureFailPoint": "failCommand",
                "mode": "alwaysOn",
                "data": {
                    "failCommands": ["insert"],
                    "errorCode": OVERLOAD_CODE,
                    "errorLabels": ["SystemOverloadedError", "RetryableError"],
                },
            })
            .await
            .expect("configureFailPoint");
    };
    fail_inserts().await;

    // Without a budget, nested retries multiply: 3 application tries × 3 driver attempts.
    let (client, inserts) = insert_counting_client(&server.uri).await;
    let coll = client.database("t").collection::<Document>("c");
    let error = with_pinned_jitter(0.0, insert_with_app_retries(&coll, doc! { "x": 1 }))
        .await
        .expect_err("always overloaded");
    assert_is_the_overload_error(&error);
    assert_eq!(inserts.load(Ordering::SeqCst), 9);

    // With an empty budget (no share, no floor), neither layer retries: one attempt.
    let uri = server.uri_with("retryBudget=true&retryBudgetPercent=0&retryBudgetMinPerSec=0");
    let (client, inserts) = insert_counting_client(&uri).await;
    let coll = client.database("t").collection::<Document>("c");
    let error = with_pinned_jitter(0.0, insert_with_app_retries(&coll, doc! { "x": 1 }))
        .await
        .expect_err("always overloaded");
    assert_is_the_overload_error(&error);
    assert_eq!(inserts.load(Ordering::SeqCst), 1);
    let stats = client.overload_stats();
    assert_eq!(stats.retries_refused, 1);
    assert_eq!(stats.application_retries_refused, 1);
    fail_command_off(&server.uri).await;
}

/// A client bulkWrite whose results need getMores, on a load-balanced connection (the cursor is
/// pinned to it, so the getMore is retried in place, not by the executor's loop), where the first
/// getMore fails with a retryable overload error. Returns the client, the getMores sent and the
/// bulkWrite's result.
async fn pinned_get_more_overloaded_once(
    router_uri: &str,
    budget_options: &str,
) -> (Client, usize, Result<(), Error>) {
    use mongodb::options::{InsertOneModel, WriteModel};
    let uri = format!("{router_uri}&{budget_options}");
    let mut options = ClientOptions::parse(&uri).await.expect("valid uri");
    let get_mores = Arc::new(AtomicUsize::new(0));
    let sink = Arc::clone(&get_mores);
    options.command_event_handler = Some(EventHandler::callback(move |event: CommandEvent| {
        if let CommandEvent::Started(e) = event {
            if e.command_name == "getMore" {
                sink.fetch_add(1, Ordering::SeqCst);
            }
        }
    }));
    let client = Client::with_options(options).expect("client");
    let admin = client.database("admin");
    let coll = client.database("pinned").collection::<Document>("c");
    coll.delete_many(doc! {}).await.expect("clean");
    // One result per batch, so that the results cursor needs getMores.
    admin
        .run_command(doc! { "setParameter": 1, "labBulkWriteBatchSize": 1 })
        .await
        .expect("setParameter");
    admin
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": {
                "failCommands": ["getMore"],
                "errorCode": OVERLOAD_CODE,
                "errorLabels": ["SystemOverloadedError", "RetryableError"],
            },
        })
        .await
        .expect("configureFailPoint");
    let insert = |id: i32| {
        WriteModel::from(
            InsertOneModel::builder()
                .namespace(coll.namespace())
                .document(doc! { "_id": id })
                .build(),
        )
    };
    let result = with_pinned_jitter(
        0.0,
        client
            .bulk_write([insert(1), insert(2), insert(3)])
            .verbose_results(),
    )
    .await
    .map(drop);
    admin
        .run_command(doc! { "configureFailPoint": "failCommand", "mode": "off" })
        .await
        .expect("configureFailPoint off");
    admin
        .run_command(doc! { "setParameter": 1, "labBulkWriteBatchSize": 0 })
        .await
        .expect("setParameter");
    (client, get_mores.load(Ordering::SeqCst), result)
}

#[tokio::test]
async fn the_in_place_retry_on_a_pinned_connection_asks_the_budget() {
    let server = Server::start(emulator::Topology::Sharded { routers: 1 });
    let uri = server.load_balanced_uri();

    // The default budget admits the retry: the getMore is sent again and the bulkWrite succeeds.
    let (client, get_mores, result) =
        pinned_get_more_overloaded_once(&uri, "retryBudget=true").await;
    result.expect("the getMore retry is admitted");
    assert_eq!(get_mores, 2, "the failed getMore and its retry");
    let stats = client.overload_stats();
    assert_eq!(stats.retries_made, 1);
    assert_eq!(stats.retries_refused, 0);
    assert_eq!(stats.overload_errors_by_code.get(&OVERLOAD_CODE), Some(&1));

    // An empty budget refuses it: the overload error comes back, labels intact.
    let empty = "retryBudget=true&retryBudgetPercent=0&retryBudgetMinPerSec=0";
    let (client, get_mores, result) = pinned_get_more_overloaded_once(&uri, empty).await;
    let error = result.expect_err("the getMore retry is refused");
    // The bulkWrite reports the getMore's overload error as its cause. (The fork's B2 fix takes
    // the retry labels off a results getMore's error, so that the acknowledged bulkWrite is not
    // sent again; that is the bulkWrite's doing, not the budget's.)
    let cause = std::error::Error::source(&error)
        // The driver keeps the cause boxed; `source()` may hand out the box or the error.
        .and_then(|source| {
            source
                .downcast_ref::<Error>()
                .or_else(|| source.downcast_ref::<Box<Error>>().map(|boxed| &**boxed))
        })
        .expect("the getMore's error as the cause");
    assert_eq!(server_code(cause), Some(OVERLOAD_CODE), "{error:?}");
    assert_eq!(get_mores, 1, "no retry of the getMore");
    let stats = client.overload_stats();
    assert_eq!(stats.retries_made, 0);
    assert_eq!(stats.retries_refused, 1);
    assert_eq!(stats.overload_errors_by_code.get(&OVERLOAD_CODE), Some(&1));
}
