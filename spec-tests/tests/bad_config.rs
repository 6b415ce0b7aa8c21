//! Bad configuration (issue 16, item 5): every option the fork adds and every Client
//! Backpressure option, given invalid values (negative, huge or overflowing, wrong type, empty)
//! and misspelt keys, in the connection string and on `ClientOptions`. Each must be refused when
//! the options are parsed (`ClientOptions::parse`) or the client is built
//! (`Client::with_options`), never later, with an error that names the option.
//!
//! `maxPoolSize` is in the table as well: its invalid values must be refused, and `0`, which the
//! URI options specification defines as "no limit", must be accepted (defect B11).

use std::time::Duration;

use mongodb::options::ClientOptions;
use mongodb::Client;

/// A connection string with one option.
fn uri(option: &str, value: &str) -> String {
    format!("mongodb://localhost:27017/?{option}={value}")
}

/// Parses `uri` (with a client built from it, as an application would) and returns the error
/// message, or `None` when it was accepted.
async fn refusal(uri: &str) -> Option<String> {
    let options = match ClientOptions::parse(uri).await {
        Ok(options) => options,
        Err(e) => return Some(e.to_string()),
    };
    // Building a client does not connect; it runs the same validation a parse does.
    match Client::with_options(options) {
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

/// The invalid values for each option, by the option's connection-string name.
fn table() -> Vec<(&'static str, Vec<&'static str>)> {
    let not_integers = ["abc", "1.5", "", "1e3", "0x10", "true"];
    let mut t: Vec<(&'static str, Vec<&'static str>)> = vec![
        (
            "maxAdaptiveRetries",
            vec!["-1", "4294967296", "99999999999999999999"],
        ),
        (
            "enableOverloadRetargeting",
            vec!["yes", "1", "", "TRUE", "on"],
        ),
        (
            "timeoutMS",
            vec!["-1", "18446744073709551616", "99999999999999999999999"],
        ),
        ("retryBudget", vec!["yes", "1", "", "TRUE", "on"]),
        (
            "retryBudgetPercent",
            vec![
                "-1", "-0.5", "1000.5", "1e400", "NaN", "inf", "-inf", "abc", "", "true",
            ],
        ),
        (
            "retryBudgetMinPerSec",
            vec!["-1", "100001", "4294967296", "99999999999999999999"],
        ),
        (
            "retryBudgetWindowMS",
            vec![
                "-1",
                "0",
                "999",
                "60001",
                "18446744073709551616",
                "99999999999999999999",
            ],
        ),
        (
            "maxPoolSize",
            vec!["-1", "4294967296", "99999999999999999999"],
        ),
        ("adaptiveThrottle", vec!["yes", "1", "", "TRUE", "on"]),
        (
            "adaptiveThrottleK",
            vec![
                "0", "0.999", "10.5", "-2", "1e400", "NaN", "inf", "abc", "", "true",
            ],
        ),
        (
            "adaptiveThrottleWindowMS",
            vec!["-1", "0", "999", "60001", "18446744073709551616"],
        ),
        (
            "adaptiveThrottleMinRequests",
            vec!["-1", "1000001", "4294967296"],
        ),
        ("adaptiveConcurrency", vec!["yes", "1", "", "TRUE", "on"]),
        (
            "adaptiveConcurrencyMinLimit",
            // Above the default maxPoolSize (10), and 0.
            vec!["0", "11", "-1", "4294967296"],
        ),
        (
            "adaptiveConcurrencyTolerance",
            vec![
                "0.5", "0.999", "10.5", "-1", "NaN", "inf", "abc", "", "false",
            ],
        ),
        (
            "adaptiveConcurrencyProbeIntervalMS",
            vec!["-1", "0", "999", "600001", "18446744073709551616"],
        ),
    ];
    // Every integer option also refuses what is not an integer at all.
    for (option, values) in t.iter_mut() {
        if matches!(
            *option,
            "maxAdaptiveRetries"
                | "timeoutMS"
                | "retryBudgetMinPerSec"
                | "retryBudgetWindowMS"
                | "maxPoolSize"
                | "adaptiveThrottleWindowMS"
                | "adaptiveThrottleMinRequests"
                | "adaptiveConcurrencyMinLimit"
                | "adaptiveConcurrencyProbeIntervalMS"
        ) {
            values.extend(not_integers);
        }
    }
    t
}

#[tokio::test]
async fn invalid_values_are_refused_at_parse_time_naming_the_option() {
    let mut accepted = Vec::new();
    let mut unnamed = Vec::new();
    let mut cases = 0;
    for (option, values) in table() {
        for value in values {
            cases += 1;
            let uri = uri(option, value);
            match refusal(&uri).await {
                None => accepted.push(uri),
                Some(message) => {
                    // Printed so `--nocapture` shows every message the table produces.
                    eprintln!("{uri}\n    {message}");
                    if !message.to_lowercase().contains(&option.to_lowercase()) {
                        unnamed.push(format!("{uri}: {message}"));
                    }
                }
            }
        }
    }
    assert!(cases > 60, "the table has {cases} cases");
    assert!(
        accepted.is_empty(),
        "accepted invalid values: {accepted:#?}"
    );
    assert!(
        unnamed.is_empty(),
        "errors that do not name the option: {unnamed:#?}"
    );
}

#[tokio::test]
async fn misspelt_options_are_refused_and_the_real_one_suggested() {
    for (misspelt, real) in [
        ("maxAdaptiveRetry", "maxadaptiveretries"),
        ("maxAdaptiveRetires", "maxadaptiveretries"),
        ("enableOverloadRetargetting", "enableoverloadretargeting"),
        ("enableOverloadRetarget", "enableoverloadretargeting"),
        ("timeoutMSS", "timeoutms"),
        ("timoutMS", "timeoutms"),
        ("retryBudjet", "retrybudget"),
        ("retryBudgetPercentage", "retrybudgetpercent"),
        ("retryBudgetPrecent", "retrybudgetpercent"),
        ("retryBudgetMinPerSecond", "retrybudgetminpersec"),
        ("retryBudgetWindowMillis", "retrybudgetwindowms"),
        ("retryBudgetWindow", "retrybudgetwindowms"),
        ("maxPoolSise", "maxpoolsize"),
        ("adaptiveThrotle", "adaptivethrottle"),
        ("adaptiveThrottleKK", "adaptivethrottlek"),
        ("adaptiveThrottleWindow", "adaptivethrottlewindowms"),
        ("adaptiveConcurency", "adaptiveconcurrency"),
        ("adaptiveConcurrencyMinLimt", "adaptiveconcurrencyminlimit"),
        (
            "adaptiveConcurrencyTolerence",
            "adaptiveconcurrencytolerance",
        ),
    ] {
        let message = refusal(&uri(misspelt, "1"))
            .await
            .unwrap_or_else(|| panic!("{misspelt} was accepted"));
        assert!(
            message.contains(&misspelt.to_lowercase()) || message.contains(misspelt),
            "the error names the misspelt key {misspelt}: {message}"
        );
        assert!(
            message.contains(&format!("similar name exists: {real}")),
            "the error for {misspelt} suggests {real}: {message}"
        );
    }
}

#[tokio::test]
async fn invalid_values_set_on_client_options_are_refused_naming_the_option() {
    let base = || ClientOptions::parse("mongodb://localhost:27017/");
    let mut cases: Vec<(&str, ClientOptions)> = Vec::new();
    for percent in [-1.0, 1000.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut o = base().await.expect("parses");
        o.overload.retry_budget_percent = Some(percent);
        cases.push(("retryBudgetPercent", o));
    }
    for per_sec in [100_001, u32::MAX] {
        let mut o = base().await.expect("parses");
        o.overload.retry_budget_min_per_sec = Some(per_sec);
        cases.push(("retryBudgetMinPerSec", o));
    }
    for window in [
        Duration::ZERO,
        Duration::from_millis(999),
        Duration::from_millis(60_001),
        Duration::MAX,
    ] {
        let mut o = base().await.expect("parses");
        o.overload.retry_budget_window = Some(window);
        cases.push(("retryBudgetWindowMS", o));
    }
    for k in [0.5, 11.0, f64::NAN] {
        let mut o = base().await.expect("parses");
        o.overload.adaptive_throttle_k = Some(k);
        cases.push(("adaptiveThrottleK", o));
    }
    for window in [Duration::ZERO, Duration::from_secs(61)] {
        let mut o = base().await.expect("parses");
        o.overload.adaptive_throttle_window = Some(window);
        cases.push(("adaptiveThrottleWindowMS", o));
    }
    for (min_limit, pool) in [(0, None), (11, None), (6, Some(5))] {
        let mut o = base().await.expect("parses");
        o.overload.adaptive_concurrency_min_limit = Some(min_limit);
        o.max_pool_size = pool;
        cases.push(("adaptiveConcurrencyMinLimit", o));
    }
    for tolerance in [0.9, f64::INFINITY] {
        let mut o = base().await.expect("parses");
        o.overload.adaptive_concurrency_tolerance = Some(tolerance);
        cases.push(("adaptiveConcurrencyTolerance", o));
    }
    for (option, options) in cases {
        let message = match Client::with_options(options) {
            Ok(_) => panic!("{option}: an invalid value was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            message.to_lowercase().contains(&option.to_lowercase()),
            "the error names {option}: {message}"
        );
    }
}

#[tokio::test]
async fn valid_edge_values_are_accepted() {
    // The bounds of each range, so the refusals above are not a parser refusing everything.
    for (option, value) in [
        ("maxAdaptiveRetries", "0"),
        ("maxAdaptiveRetries", "4294967295"),
        ("enableOverloadRetargeting", "true"),
        ("timeoutMS", "0"),
        ("timeoutMS", "1"),
        ("retryBudget", "false"),
        ("retryBudgetPercent", "0"),
        ("retryBudgetPercent", "1000"),
        ("retryBudgetPercent", "12.5"),
        ("retryBudgetMinPerSec", "0"),
        ("retryBudgetMinPerSec", "100000"),
        ("retryBudgetWindowMS", "1000"),
        ("retryBudgetWindowMS", "60000"),
        ("maxPoolSize", "1"),
        // The URI options specification: 0 means no limit (defect B11).
        ("maxPoolSize", "0"),
        ("adaptiveThrottle", "true"),
        ("adaptiveThrottleK", "1"),
        ("adaptiveThrottleK", "10"),
        ("adaptiveThrottleK", "1.5"),
        ("adaptiveThrottleWindowMS", "1000"),
        ("adaptiveThrottleWindowMS", "60000"),
        ("adaptiveThrottleMinRequests", "0"),
        ("adaptiveThrottleMinRequests", "1000000"),
        ("adaptiveConcurrency", "true"),
        ("adaptiveConcurrencyMinLimit", "1"),
        ("adaptiveConcurrencyMinLimit", "10"),
        ("adaptiveConcurrencyTolerance", "1"),
        ("adaptiveConcurrencyTolerance", "10"),
        ("adaptiveConcurrencyProbeIntervalMS", "1000"),
        ("adaptiveConcurrencyProbeIntervalMS", "600000"),
    ] {
        let uri = uri(option, value);
        assert_eq!(refusal(&uri).await, None, "{uri} is valid");
    }
}

/// Every overload option survives a round trip through the connection string: parsed, written
/// back by `ConnectionString`'s `Display`, and parsed again, with durations in milliseconds.
#[tokio::test]
async fn overload_options_round_trip_through_the_connection_string() {
    use mongodb::options::{ConnectionString, OverloadOptions};

    let original = "mongodb://localhost:27017/?retryBudget=true&retryBudgetPercent=12.5\
                    &retryBudgetMinPerSec=3&retryBudgetWindowMS=2500&adaptiveThrottle=false\
                    &adaptiveThrottleK=2&adaptiveThrottleWindowMS=4000\
                    &adaptiveThrottleMinRequests=7&adaptiveConcurrency=true\
                    &adaptiveConcurrencyMinLimit=3&adaptiveConcurrencyTolerance=1.25\
                    &adaptiveConcurrencyProbeIntervalMS=9000";
    let parsed = ConnectionString::parse(original).expect("valid options");
    let expected = OverloadOptions::builder()
        .retry_budget(true)
        .retry_budget_percent(12.5)
        .retry_budget_min_per_sec(3)
        .retry_budget_window(Duration::from_millis(2500))
        .adaptive_throttle(false)
        .adaptive_throttle_k(2.0)
        .adaptive_throttle_window(Duration::from_millis(4000))
        .adaptive_throttle_min_requests(7)
        .adaptive_concurrency(true)
        .adaptive_concurrency_min_limit(3)
        .adaptive_concurrency_tolerance(1.25)
        .adaptive_concurrency_probe_interval(Duration::from_millis(9000))
        .build();
    assert_eq!(parsed.overload, expected);

    let written = parsed.to_string();
    for option in [
        "retryBudgetWindowMS=2500",
        "adaptiveThrottleK=2",
        "adaptiveConcurrency=true",
    ] {
        assert!(written.contains(option), "{option} missing from {written}");
    }
    let again = ConnectionString::parse(&written).expect("the written string parses");
    assert_eq!(again.overload, expected);
    assert_eq!(
        ClientOptions::parse(&written).await.unwrap().overload,
        expected
    );
}
