//! The driver's wiring of the overload controller, against the emulator: the defects found by
//! reading the wiring (each test failed before its fix), and the controller's answers as the
//! driver turns them into upstream's errors, on tokio's paused clock.
//!
//! # Paused time against a real server
//!
//! The emulator runs on its own runtime thread (`common::Server`), so pausing the test's clock
//! leaves the server's alone. A paused runtime jumps to its next timer whenever it would
//! otherwise wait, also while a reply is on its way over loopback; with an operation deadline
//! pending, the first reply wait would jump straight to the deadline. [`Metronome`] keeps a
//! timer 1 ms ahead and takes at least [`METRONOME_REAL_STEP`] of real time per virtual
//! millisecond, so a network wait advances the virtual clock by at most about 20 times its real
//! length, while sleeps (backoff, slot rechecks) still pass at once. Every assertion on virtual
//! time below leaves a margin of hundreds of virtual milliseconds for that drift.

mod common;

use std::time::Duration;

use common::{
    client_counting_finds, fail_command_off, fail_find, is_local_rejection, slow_find, Server,
};
use mongodb::{
    bson::{doc, Document},
    error::{Error, ErrorKind},
    fork::test_hooks::with_pinned_jitter,
    options::ClientOptions,
    Client, Collection,
};

/// Real time a [`Metronome`] spends per virtual millisecond.
const METRONOME_REAL_STEP: Duration = Duration::from_micros(50);

/// Pauses the test runtime's clock and keeps a timer 1 ms ahead of it until dropped (see the
/// module documentation). Needs a current-thread runtime.
struct Metronome {
    ticker: tokio::task::JoinHandle<()>,
}

impl Metronome {
    fn start() -> Self {
        tokio::time::pause();
        let ticker = tokio::spawn(async {
            // Bounded by the test: the task is aborted when the metronome is dropped, and a
            // test's operations end within their own deadlines.
            loop {
                tokio::time::sleep(Duration::from_millis(1)).await;
                std::thread::sleep(METRONOME_REAL_STEP);
            }
        });
        Self { ticker }
    }
}

impl Drop for Metronome {
    fn drop(&mut self) {
        self.ticker.abort();
        tokio::time::resume();
    }
}

/// `find` always fails with a retryable overload error (code 462).
async fn overload_finds(uri: &str) {
    let labels = vec!["SystemOverloadedError", "RetryableError"];
    fail_find(
        uri,
        "alwaysOn".into(),
        doc! { "errorCode": 462, "errorLabels": labels },
    )
    .await;
}

fn is_timeout(error: &Error) -> bool {
    matches!(*error.kind, ErrorKind::Timeout { .. })
}

fn server_code(error: &Error) -> Option<i32> {
    match *error.kind {
        ErrorKind::Command(ref command) => Some(command.code),
        _ => None,
    }
}

/// Waits (bounded) until `client` has `in_flight` operations holding slots on its one server.
async fn until_in_flight(client: &Client, in_flight: u32) {
    for _ in 0..200 {
        let limits = client.overload_stats().concurrency_limits;
        if limits.values().map(|l| l.in_flight).sum::<u32>() == in_flight {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never {in_flight} operations in flight");
}

/// Defect: the slot wait added `serverSelectionTimeoutMS` to the clock unchecked, so a huge
/// value (an application meaning "wait as long as it takes") panicked with "overflow when
/// adding duration to instant" in the waiting operation.
#[tokio::test(flavor = "current_thread")]
async fn a_huge_server_selection_timeout_waits_for_a_slot_without_panicking() {
    let server = Server::standalone();
    let uri = server.uri_with("adaptiveConcurrency=true&maxPoolSize=1");
    let mut options = ClientOptions::parse(&uri).await.expect("valid uri");
    options.server_selection_timeout = Some(Duration::MAX);
    let client = Client::with_options(options).expect("client");
    let coll: Collection<Document> = client.database("t").collection("c");
    coll.find_one(doc! {}).await.expect("warm up");
    let holder = slow_find(&server.uri, &coll, 300).await;
    until_in_flight(&client, 1).await;
    // The waiter runs as a task so that a panic is seen as one rather than failing the test
    // with the panic's own message.
    let waiter = {
        let coll = coll.clone();
        tokio::spawn(async move { coll.find_one(doc! {}).await.map(|_| ()) })
    };
    let waited = waiter.await;
    assert!(
        !waited.as_ref().is_err_and(|join| join.is_panic()),
        "the slot wait panicked: {waited:?}"
    );
    waited
        .expect("task")
        .expect("the waiter gets the holder's slot");
    holder.await.expect("task").expect("slow find");
}

/// Defect: a checkout that failed without a network error or an overload error (here an
/// authentication failure) released its slot as an answer after 0 ms, a sample of a server
/// infinitely fast: sixteen of them made the limit's no-load baseline zero.
#[tokio::test]
async fn a_failed_checkout_is_not_a_latency_sample() {
    let server = Server::standalone();
    // An authentication failure marks the server unknown until its monitor's next check.
    let uri = server.uri_with("adaptiveConcurrency=true&heartbeatFrequencyMS=500");
    let authenticated = uri.replacen("mongodb://", "mongodb://nobody:wrong@", 1);
    let client = Client::with_uri_str(&authenticated).await.expect("client");
    let coll: Collection<Document> = client.database("t").collection("c");
    // The baseline is the median of the first 16 samples.
    for _ in 0..16 {
        let error = coll.find_one(doc! {}).await.expect_err("wrong credentials");
        assert!(
            matches!(*error.kind, ErrorKind::Authentication { .. }),
            "{error:?}"
        );
    }
    let limits = client.overload_stats().concurrency_limits;
    assert_eq!(limits.len(), 1, "{limits:?}");
    for limit in limits.values() {
        assert_eq!(
            limit.baseline, None,
            "no reply was ever received, so nothing was measured: {limit:?}"
        );
        assert_eq!(limit.in_flight, 0, "every slot was released: {limit:?}");
    }
}

/// Defect: the retry loop read the deadline on std's clock while it slept its backoff on
/// tokio's, so under a paused clock (and in any test that drives time) the deadline never came
/// nearer between retries: a backoff that no longer fitted was slept anyway and the operation
/// ended in a timeout error instead of its last error. With jitter pinned to 1 the backoffs are
/// 200, 400, 800, 1600 and 3200 ms: under timeoutMS=4000 the fifth failure, at about 3000 ms,
/// leaves about 1000 ms, less than the 3200 ms backoff, so the operation returns the overload
/// error after five attempts without sleeping.
#[tokio::test(flavor = "current_thread")]
async fn retries_read_the_deadline_on_the_clock_they_sleep_on() {
    let server = Server::standalone();
    let uri = server.uri_with("retryReads=true&maxAdaptiveRetries=10&connectTimeoutMS=0");
    let (client, attempts) = client_counting_finds(&uri).await;
    let coll: Collection<Document> = client.database("t").collection("c");
    coll.find_one(doc! {}).await.expect("warm up");
    overload_finds(&server.uri).await;
    let before = attempts.count();

    let metronome = Metronome::start();
    let start = tokio::time::Instant::now();
    let result = with_pinned_jitter(
        1.0,
        coll.find_one(doc! {}).timeout(Duration::from_millis(4_000)),
    )
    .await;
    let elapsed = start.elapsed();
    drop(metronome);
    fail_command_off(&server.uri).await;

    let error = result.expect_err("always overloaded");
    assert_eq!(
        server_code(&error),
        Some(462),
        "the last error, not a timeout: {error:?}"
    );
    assert_eq!(attempts.count() - before, 5, "five attempts: {error:?}");
    assert!(
        elapsed >= Duration::from_millis(3_000) && elapsed < Duration::from_millis(4_000),
        "four backoffs were slept, the fifth declined: {elapsed:?}"
    );
    assert!(!is_timeout(&error) && !is_local_rejection(&error));
}

/// The retry budget refuses a retry on the paused clock: once the warm-up's deposit has left the
/// budget's 10 s window (advanced past in virtual time), two accepted finds and the failing
/// find's own first attempt fund one and a half retries at `retryBudgetPercent=50` with no
/// reserve, so an always-overloaded find makes two attempts and the budget refuses the second
/// retry for want of credit (the servers still accept half the client's attempts, so it is not
/// the shedding rule that refuses it).
#[tokio::test(flavor = "current_thread")]
async fn the_budget_refuses_a_retry_on_the_paused_clock() {
    let server = Server::standalone();
    let uri = server.uri_with(
        "retryReads=true&connectTimeoutMS=0&retryBudget=true&retryBudgetPercent=50\
         &retryBudgetMinPerSec=0&retryBudgetWindowMS=10000",
    );
    let (client, attempts) = client_counting_finds(&uri).await;
    let coll: Collection<Document> = client.database("t").collection("c");
    coll.find_one(doc! {}).await.expect("warm up");

    let clock = Metronome::start();
    tokio::time::advance(Duration::from_secs(11)).await;
    for _ in 0..2 {
        coll.find_one(doc! {}).await.expect("accepted");
    }
    overload_finds(&server.uri).await;
    let before = attempts.count();
    let start = tokio::time::Instant::now();
    let result = with_pinned_jitter(1.0, coll.find_one(doc! {})).await;
    let elapsed = start.elapsed();
    drop(clock);
    fail_command_off(&server.uri).await;

    let error = result.expect_err("always overloaded");
    assert_eq!(server_code(&error), Some(462), "{error:?}");
    assert_eq!(attempts.count() - before, 2, "one funded retry: {error:?}");
    let stats = client.overload_stats();
    assert_eq!(
        (stats.retries_made, stats.retries_refused),
        (1, 1),
        "{stats:?}"
    );
    assert!(
        elapsed >= Duration::from_millis(200),
        "the funded retry slept its 200 ms backoff in virtual time: {elapsed:?}"
    );
}

/// A retry is paid for when it is sent and given back when its operation succeeds: at
/// `retryBudgetPercent=100` with no reserve, a find that meets one overload error and then
/// succeeds leaves the budget where its two first attempts (the warm-up's and its own) put it.
#[tokio::test(flavor = "current_thread")]
async fn an_operation_that_succeeds_after_a_retry_gives_the_budget_back_its_cost() {
    let server = Server::standalone();
    let uri = server.uri_with(
        "retryReads=true&retryBudget=true&retryBudgetPercent=100&retryBudgetMinPerSec=0\
         &retryBudgetWindowMS=60000",
    );
    let (client, attempts) = client_counting_finds(&uri).await;
    let coll: Collection<Document> = client.database("t").collection("c");
    coll.find_one(doc! {}).await.expect("warm up");
    let labels = vec!["SystemOverloadedError", "RetryableError"];
    fail_find(
        &server.uri,
        doc! { "times": 1 }.into(),
        doc! { "errorCode": 462, "errorLabels": labels },
    )
    .await;
    let before = attempts.count();
    let result = with_pinned_jitter(0.0, coll.find_one(doc! {})).await;
    fail_command_off(&server.uri).await;

    result.expect("the retry succeeds");
    assert_eq!(attempts.count() - before, 2);
    let stats = client.overload_stats();
    assert_eq!(
        (stats.retries_made, stats.retries_refunded),
        (1, 1),
        "{stats:?}"
    );
    assert_eq!(stats.budget_level, Some(2.0), "{stats:?}");
}

/// Every decision of the controller is also an event on the operation's OpenTelemetry span
/// (upstream's `opentelemetry` feature). With a budget of one retry: the first find meets one
/// overload error and its retry succeeds (and is refunded), so its span carries one
/// `mongodb.overload.retry` event with the retry's number and server; the second find meets
/// two, so its retry fails too and its second retry is refused, so its span carries a retry event and a
/// `mongodb.overload.retry_refused` event naming the budget.
#[tokio::test]
async fn decisions_are_events_on_the_operations_span() {
    use opentelemetry::{Key, Value};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};

    let server = Server::standalone();
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let uri = server.uri_with(
        "retryReads=true&retryBudget=true&retryBudgetPercent=0&retryBudgetMinPerSec=1\
         &retryBudgetWindowMS=1000",
    );
    let mut options = ClientOptions::parse(&uri).await.expect("valid uri");
    options.tracing = Some(
        mongodb::otel::OpentelemetryOptions::builder()
            .enabled(true)
            .tracer_provider(provider.clone())
            .build(),
    );
    let client = Client::with_options(options).expect("client");
    let coll: Collection<Document> = client.database("t").collection("c");
    coll.find_one(doc! {}).await.expect("warm up");
    let labels = vec!["SystemOverloadedError", "RetryableError"];
    // The reserve holds one retry (1 a second over a 1 s window).
    let error = doc! { "errorCode": 462, "errorLabels": labels };
    fail_find(&server.uri, doc! { "times": 1 }.into(), error.clone()).await;
    with_pinned_jitter(0.0, coll.find_one(doc! {}))
        .await
        .expect("retried once, then answered");
    fail_find(&server.uri, doc! { "times": 2 }.into(), error).await;
    let refused = with_pinned_jitter(0.0, coll.find_one(doc! {})).await;
    fail_command_off(&server.uri).await;
    assert_eq!(server_code(&refused.expect_err("refused")), Some(462));

    provider.force_flush().expect("flush");
    let spans = exporter.get_finished_spans().expect("spans");
    let events_named = |name: &str| -> Vec<(&SpanData, &opentelemetry::trace::Event)> {
        spans
            .iter()
            .flat_map(|span| span.events.iter().map(move |event| (span, event)))
            .filter(|(_, event)| event.name == name)
            .collect()
    };
    let attribute = |event: &opentelemetry::trace::Event, key: &str| -> Option<Value> {
        event
            .attributes
            .iter()
            .find(|kv| kv.key == Key::from(key.to_owned()))
            .map(|kv| kv.value.clone())
    };
    let retries = events_named("mongodb.overload.retry");
    assert_eq!(retries.len(), 2, "{spans:#?}");
    let (span, retry) = retries[0];
    assert!(
        span.name.starts_with("find "),
        "the operation's span: {}",
        span.name
    );
    assert_eq!(attribute(retry, "attempt"), Some(Value::I64(1)));
    let (second_span, _) = retries[1];
    assert_ne!(
        second_span.span_context.span_id(),
        span.span_context.span_id()
    );
    let server_attr = attribute(retry, "server").map(|v| v.to_string());
    assert!(
        server_attr
            .as_deref()
            .is_some_and(|s| s.contains("127.0.0.1") || s.contains("localhost")),
        "{server_attr:?}"
    );
    let refusals = events_named("mongodb.overload.retry_refused");
    assert_eq!(refusals.len(), 1, "{spans:#?}");
    let (refused_span, refusal) = refusals[0];
    assert_eq!(
        refused_span.span_context.span_id(),
        second_span.span_context.span_id(),
        "the refusal is on the second find's span"
    );
    assert_eq!(
        attribute(refusal, "reason").map(|v| v.to_string()),
        Some("retry budget exhausted".to_owned())
    );
}

/// The throttle rejects a first attempt locally on the paused clock; past its 10 s window its
/// history still rejects until the server accepts a request, and past the history's two
/// minutes nothing is left.
#[tokio::test(flavor = "current_thread")]
async fn the_throttle_rejects_and_forgets_on_the_paused_clock() {
    let server = Server::standalone();
    let uri = server.uri_with(
        "retryReads=true&connectTimeoutMS=0&maxAdaptiveRetries=0&adaptiveThrottle=true\
         &adaptiveThrottleMinRequests=5&adaptiveThrottleWindowMS=10000",
    );
    let (client, attempts) = client_counting_finds(&uri).await;
    let coll: Collection<Document> = client.database("t").collection("c");
    coll.find_one(doc! {}).await.expect("warm up");
    overload_finds(&server.uri).await;
    let before = attempts.count();
    let clock = Metronome::start();
    // The warm-up leaves the window and the history (twelve windows) before the overloaded
    // finds.
    tokio::time::advance(Duration::from_secs(131)).await;
    for _ in 0..5 {
        let error = with_pinned_jitter(0.0, coll.find_one(doc! {}))
            .await
            .expect_err("overloaded");
        assert_eq!(server_code(&error), Some(462), "{error:?}");
    }
    assert_eq!(attempts.count() - before, 5);
    // Every request in the window was rejected: the pinned draw of 0 rejects locally.
    let error = with_pinned_jitter(0.0, coll.find_one(doc! {}))
        .await
        .expect_err("rejected locally");
    assert!(is_local_rejection(&error), "{error:?}");
    assert_eq!(attempts.count() - before, 5, "never sent");
    assert_eq!(client.overload_stats().local_rejections, 1);
    drop(clock);
    fail_command_off(&server.uri).await;
    let clock = Metronome::start();
    tokio::time::advance(Duration::from_secs(11)).await;
    let error = with_pinned_jitter(0.0, coll.find_one(doc! {}))
        .await
        .expect_err("the history, not the window, decides a sparse client");
    assert!(is_local_rejection(&error), "{error:?}");
    // Twelve windows later (and part of a thirteenth) the history is empty too.
    tokio::time::advance(Duration::from_secs(130)).await;
    let result = with_pinned_jitter(0.0, coll.find_one(doc! {})).await;
    drop(clock);
    result.expect("the history forgot the rejections");
    assert_eq!(attempts.count() - before, 6);
}

/// Starts a find that holds the only slot of a client with one (`maxPoolSize=1`) for
/// `block_ms` of real time, and waits until it does.
async fn hold_the_only_slot(
    server: &Server,
    client: &Client,
    block_ms: i32,
) -> tokio::task::JoinHandle<Result<(), Error>> {
    let coll: Collection<Document> = client.database("t").collection("c");
    coll.find_one(doc! {}).await.expect("warm up");
    let holder = slow_find(&server.uri, &coll, block_ms).await;
    until_in_flight(client, 1).await;
    holder
}

/// A slot wait under `timeoutMS` ends in a timeout at the deadline, in virtual time: the holder
/// keeps its slot for two real seconds while the waiter's 500 ms pass at once.
#[tokio::test(flavor = "current_thread")]
async fn a_slot_wait_times_out_at_the_deadline_on_the_paused_clock() {
    let server = Server::standalone();
    let uri = server.uri_with("adaptiveConcurrency=true&maxPoolSize=1&connectTimeoutMS=0");
    let (client, attempts) = client_counting_finds(&uri).await;
    let holder = hold_the_only_slot(&server, &client, 2_000).await;
    let sent = attempts.count();
    let coll: Collection<Document> = client.database("t").collection("c");

    let clock = Metronome::start();
    let (start, real) = (tokio::time::Instant::now(), std::time::Instant::now());
    let result = coll
        .find_one(doc! {})
        .timeout(Duration::from_millis(500))
        .await;
    let (elapsed, real) = (start.elapsed(), real.elapsed());
    drop(clock);

    let error = result.expect_err("no slot within 500 ms");
    assert!(is_timeout(&error), "{error:?}");
    assert!(error.to_string().contains("concurrency slot"), "{error}");
    assert!(
        elapsed >= Duration::from_millis(500) && elapsed < Duration::from_millis(600),
        "the wait ended at the deadline: {elapsed:?}"
    );
    assert!(
        real < Duration::from_millis(1_500),
        "virtual, not real: {real:?}"
    );
    assert_eq!(attempts.count(), sent, "the waiter was never sent");
    holder.await.expect("task").expect("slow find");
    let stats = client.overload_stats();
    assert_eq!(stats.concurrency_wait_timeouts, 1, "{stats:?}");
}

/// Without `timeoutMS`, a slot wait ends in a local rejection at `serverSelectionTimeoutMS`, in
/// virtual time.
#[tokio::test(flavor = "current_thread")]
async fn a_slot_wait_is_rejected_locally_at_the_selection_timeout_on_the_paused_clock() {
    let server = Server::standalone();
    let uri = server.uri_with(
        "adaptiveConcurrency=true&maxPoolSize=1&connectTimeoutMS=0&serverSelectionTimeoutMS=300",
    );
    let (client, attempts) = client_counting_finds(&uri).await;
    let holder = hold_the_only_slot(&server, &client, 2_000).await;
    let sent = attempts.count();
    let coll: Collection<Document> = client.database("t").collection("c");

    let clock = Metronome::start();
    let (start, real) = (tokio::time::Instant::now(), std::time::Instant::now());
    let result = coll.find_one(doc! {}).await;
    let (elapsed, real) = (start.elapsed(), real.elapsed());
    drop(clock);

    let error = result.expect_err("no slot within 300 ms");
    assert!(is_local_rejection(&error), "{error:?}");
    assert!(error.contains_label("SystemOverloadedError"), "{error:?}");
    assert!(!error.contains_label("RetryableError"), "{error:?}");
    assert!(
        error.to_string().contains("serverSelectionTimeoutMS"),
        "{error}"
    );
    assert!(
        elapsed >= Duration::from_millis(300) && elapsed < Duration::from_millis(400),
        "the wait ended at the slot wait: {elapsed:?}"
    );
    assert!(
        real < Duration::from_millis(1_500),
        "virtual, not real: {real:?}"
    );
    assert_eq!(attempts.count(), sent, "the rejected find was never sent");
    holder.await.expect("task").expect("slow find");
}
