//! Admission control (issue 15), against the emulator: the adaptive throttle of first attempts
//! and the adaptive concurrency limit per server.
//!
//! The policies' arithmetic is tested in `overload::admission`; these tests check the driver's
//! wiring: what a local rejection is (its kind and labels), that it is never sent or retried,
//! that a slot wait ends at the operation's deadline with the right error, that a waiting
//! operation gets a released slot, and what the statistics count. Backoff jitter is pinned to
//! 0 (the fork's hidden test hook), which also pins the throttle's draw: once its rejection
//! probability is above zero, every first attempt is rejected.

mod common;

use std::time::{Duration, Instant};

use common::{
    client_counting_finds, fail_command_off, fail_find, is_local_rejection, slow_find, slow_finds,
    Server,
};
use mongodb::{
    bson::{doc, Document},
    error::{Error, ErrorKind},
    fork::test_hooks::with_pinned_jitter,
    options::ClientOptions,
    Collection,
};

async fn find_one(coll: &Collection<Document>) -> Result<(), Error> {
    with_pinned_jitter(0.0, coll.find_one(doc! {}))
        .await
        .map(|_| ())
}

#[tokio::test]
async fn admission_options_parse_and_default_to_off() {
    let options = ClientOptions::parse(
        "mongodb://localhost:27017/?adaptiveThrottle=true&adaptiveThrottleK=1.5\
         &adaptiveThrottleWindowMS=2000&adaptiveThrottleMinRequests=5\
         &adaptiveConcurrency=true&adaptiveConcurrencyMinLimit=3\
         &adaptiveConcurrencyTolerance=1.25&adaptiveConcurrencyProbeIntervalMS=5000",
    )
    .await
    .expect("valid admission options");
    assert_eq!(options.overload.adaptive_throttle, Some(true));
    assert_eq!(options.overload.adaptive_throttle_k, Some(1.5));
    assert_eq!(
        options.overload.adaptive_throttle_window,
        Some(Duration::from_secs(2))
    );
    assert_eq!(options.overload.adaptive_throttle_min_requests, Some(5));
    assert_eq!(options.overload.adaptive_concurrency, Some(true));
    assert_eq!(options.overload.adaptive_concurrency_min_limit, Some(3));
    assert_eq!(options.overload.adaptive_concurrency_tolerance, Some(1.25));
    assert_eq!(
        options.overload.adaptive_concurrency_probe_interval,
        Some(Duration::from_secs(5))
    );

    let server = Server::standalone();
    let (client, _) = client_counting_finds(&server.uri).await;
    client
        .database("t")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .expect("find");
    let stats = client.overload_stats();
    assert!(
        stats.concurrency_limits.is_empty(),
        "no limits without adaptiveConcurrency: {stats:?}"
    );
    assert_eq!(stats.local_rejections, 0);
}

#[tokio::test]
async fn the_throttle_rejects_first_attempts_locally_and_never_sends_or_retries_them() {
    let server = Server::standalone();
    let uri = server.uri_with("adaptiveThrottle=true&adaptiveThrottleWindowMS=1000");
    let (client, attempts) = client_counting_finds(&uri).await;
    let coll = client.database("t").collection::<Document>("c");
    let labels = ["SystemOverloadedError", "RetryableError"];
    fail_find(
        &server.uri,
        "alwaysOn".into(),
        doc! { "errorCode": 462, "errorLabels": labels.to_vec() },
    )
    .await;

    let ops = 60;
    let mut rejected = 0;
    for _ in 0..ops {
        let error = find_one(&coll).await.expect_err("always overloaded");
        if is_local_rejection(&error) {
            rejected += 1;
            assert!(error.contains_label("SystemOverloadedError"), "{error:?}");
            assert!(!error.contains_label("RetryableError"), "{error:?}");
            assert!(error.to_string().contains("adaptiveThrottle"), "{error}");
        } else {
            assert!(error.contains_label("RetryableError"), "{error:?}");
        }
    }
    // The first 20 first attempts (adaptiveThrottleMinRequests) are sent and rejected by the
    // server; from then on the probability is above zero and the pinned draw of 0 rejects.
    assert_eq!(rejected, ops - 20);
    // Each sent operation makes 1 + maxAdaptiveRetries (2) attempts; rejections make none.
    assert_eq!(attempts.count(), 3 * 20);
    let stats = client.overload_stats();
    assert_eq!(stats.local_rejections, (ops - 20) as u64);
    assert_eq!(
        stats.overload_errors(),
        60,
        "local rejections are not server errors"
    );

    // Once the overload ends, the window (1 s here) empties; the client's last answer was a
    // rejection, so its history (twelve windows) still decides, and the pinned draw of 0
    // rejects. A draw above the cap of 0.9 sends one; the server accepts it, and from then on
    // first attempts flow again.
    fail_command_off(&server.uri).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let error = find_one(&coll)
        .await
        .expect_err("the history still says overloaded");
    assert!(is_local_rejection(&error), "{error:?}");
    with_pinned_jitter(0.95, coll.find_one(doc! {}))
        .await
        .expect("a draw above the cap is sent");
    find_one(&coll).await.expect("the throttle released");
    assert_eq!(attempts.count(), 3 * 20 + 2);
}

#[tokio::test]
async fn a_slot_wait_ends_at_the_deadline_and_a_released_slot_goes_to_a_waiter() {
    let server = Server::standalone();
    // maxPoolSize 2 caps the limit at 2 slots.
    let uri = server.uri_with("adaptiveConcurrency=true&maxPoolSize=2");
    let (client, attempts) = client_counting_finds(&uri).await;
    let coll = client.database("t").collection::<Document>("c");
    coll.find_one(doc! {}).await.expect("warm up");
    // Two slow finds take both slots.
    let slow = slow_finds(&server.uri, &coll, 2, 700).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        attempts.count(),
        3,
        "the warm-up and both slow finds were sent"
    );

    // A third, under timeoutMS 100, waits for a slot and times out without being sent.
    let start = Instant::now();
    let error = coll
        .find_one(doc! {})
        .timeout(Duration::from_millis(100))
        .await
        .expect_err("no slot within 100 ms");
    assert!(
        matches!(*error.kind, ErrorKind::Timeout { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("concurrency slot"), "{error}");
    assert!(start.elapsed() < Duration::from_millis(400));
    assert_eq!(attempts.count(), 3, "the timed-out find was never sent");

    // A fourth, with time to spare, gets the first slot released.
    coll.find_one(doc! {})
        .timeout(Duration::from_secs(5))
        .await
        .expect("a slot came free");
    for task in slow {
        task.await.expect("task").expect("slow find");
    }
    assert_eq!(attempts.count(), 4);

    let stats = client.overload_stats();
    assert_eq!(stats.concurrency_waits, 2, "{stats:?}");
    assert_eq!(stats.concurrency_wait_timeouts, 1, "{stats:?}");
    let limits: Vec<_> = stats.concurrency_limits.values().collect();
    assert_eq!(limits.len(), 1, "one server: {stats:?}");
    assert_eq!(limits[0].limit, 2);
    assert_eq!(limits[0].in_flight, 0, "every slot was released");
}

#[tokio::test]
async fn without_timeout_ms_a_slot_wait_ends_at_the_server_selection_timeout() {
    let server = Server::standalone();
    let uri = server.uri_with(
        "adaptiveConcurrency=true&maxPoolSize=1&adaptiveConcurrencyMinLimit=1\
         &serverSelectionTimeoutMS=200",
    );
    let (client, attempts) = client_counting_finds(&uri).await;
    let coll = client.database("t").collection::<Document>("c");
    coll.find_one(doc! {}).await.expect("warm up");
    let slow = slow_find(&server.uri, &coll, 800).await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    let start = Instant::now();
    let error = coll
        .find_one(doc! {})
        .await
        .expect_err("no slot within 200 ms");
    let waited = start.elapsed();
    assert!(is_local_rejection(&error), "{error:?}");
    assert!(error.contains_label("SystemOverloadedError"), "{error:?}");
    assert!(!error.contains_label("RetryableError"), "{error:?}");
    assert!(
        error.to_string().contains("serverSelectionTimeoutMS"),
        "{error}"
    );
    assert!(
        waited >= Duration::from_millis(190) && waited < Duration::from_millis(600),
        "waited {waited:?}"
    );
    slow.await.expect("task").expect("slow find");
    assert_eq!(attempts.count(), 2, "the rejected find was never sent");
    assert_eq!(client.overload_stats().concurrency_wait_timeouts, 1);
}

#[tokio::test]
async fn a_cancelled_operation_gives_its_slot_back() {
    let server = Server::standalone();
    let uri =
        server.uri_with("adaptiveConcurrency=true&maxPoolSize=1&adaptiveConcurrencyMinLimit=1");
    let (client, _) = client_counting_finds(&uri).await;
    let coll = client.database("t").collection::<Document>("c");
    coll.find_one(doc! {}).await.expect("warm up");
    fail_find(
        &server.uri,
        doc! { "times": 1 }.into(),
        doc! { "blockConnection": true, "blockTimeMS": 500 },
    )
    .await;
    // Dropped while the server holds it: the slot must come back, or the next find waits for
    // ever (here: until its timeout).
    let cancelled = tokio::time::timeout(Duration::from_millis(100), coll.find_one(doc! {})).await;
    assert!(cancelled.is_err(), "the find was cancelled");
    coll.find_one(doc! {})
        .timeout(Duration::from_secs(3))
        .await
        .expect("the cancelled find's slot was released");
    let limits = client.overload_stats().concurrency_limits;
    assert_eq!(limits.values().map(|l| l.in_flight).sum::<u32>(), 0);
}

#[tokio::test]
async fn a_slot_waiter_whose_primary_steps_down_goes_to_the_new_primary() {
    use mongodb::event::{command::CommandEvent, EventHandler};
    use std::sync::{Arc, Mutex};

    let server = Server::replica_set_of(2);
    // One slot per server: maxPoolSize 1 caps the limit at 1.
    let uri =
        server.uri_with("adaptiveConcurrency=true&maxPoolSize=1&adaptiveConcurrencyMinLimit=1");
    let mut options = ClientOptions::parse(&uri).await.expect("valid uri");
    let finds: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = Arc::clone(&finds);
    options.command_event_handler = Some(EventHandler::callback(move |event: CommandEvent| {
        if let CommandEvent::Started(e) = event {
            if e.command_name == "find" {
                sink.lock().unwrap().push(e.connection.address.to_string());
            }
        }
    }));
    let client = mongodb::Client::with_options(options).expect("client");
    let coll = client.database("t").collection::<Document>("c");
    coll.find_one(doc! {}).await.expect("warm up");
    let old_primary = finds.lock().unwrap()[0].clone();

    // A find held 1 s on the primary takes its only slot; a second find waits for it.
    let slow = slow_find(&server.uri, &coll, 1000).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waiter = {
        let coll = coll.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let found = coll.find_one(doc! {}).timeout(Duration::from_secs(5)).await;
            found.map(|_| start.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;

    // The primary steps down while the second find waits for its slot there.
    let admin = mongodb::Client::with_uri_str(&server.uri)
        .await
        .expect("admin client");
    admin
        .database("admin")
        .run_command(doc! { "replSetStepDown": 60, "secondaryCatchUpPeriodSecs": 0, "force": true })
        .await
        .expect("the primary steps down");

    let waited = waiter.await.expect("task").expect("the second find");
    let _ = slow.await.expect("task");
    let finds = finds.lock().unwrap().clone();
    // The slow find, answered after the step-down, fails as not primary and is retried on the
    // new primary; the second find goes there directly.
    assert_eq!(
        finds.len(),
        4,
        "warm-up, slow find, its retry, second find: {finds:?}"
    );
    assert_eq!(finds[1], old_primary, "{finds:?}");
    assert!(
        finds[2..].iter().all(|address| *address != old_primary),
        "the second find went to the new primary, not to the member it waited on: {finds:?}"
    );
    assert!(
        waited < Duration::from_millis(800),
        "it did not wait out the slow find's slot: {waited:?}"
    );
    let stats = client.overload_stats();
    assert_eq!(stats.concurrency_wait_reselections, 1, "{stats:?}");
    assert_eq!(
        stats.retries_made, 1,
        "the slow find's retry only: a reselection is not a retry: {stats:?}"
    );
}
