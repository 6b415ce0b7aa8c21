//! Counters of a client's overload handling, behind `Client::overload_stats()`.
//!
//! The driver keeps one [`OverloadStatsRecorder`] per client and updates it on its hot paths:
//! every update is one relaxed atomic add (lock-free, no allocation), so counting costs nothing
//! an operation would notice. (The `metrics` feature adds the facade's cost to each update.) [`OverloadStatsRecorder::snapshot`] reads the counters into an
//! [`OverloadStats`] value; the counters are read one by one, so a snapshot taken while
//! operations run can be off by the few events that raced it, never by more.
//!
//! The snapshot holds overload errors by server code, retries made and refused, time slept in
//! backoff, the retry budget's level, and admission control's local rejections, waits for a
//! concurrency slot and limits per server ([`crate::admission`]; the driver does not feed these
//! yet, so they stay at zero and empty until it does).
//!
//! # The `metrics` feature
//!
//! With the crate's `metrics` feature, every update is also published through the [`metrics`]
//! facade, to whatever recorder the application installed (Prometheus, StatsD, ...); without an
//! installed recorder the facade drops them. The names are the `METRIC_*` constants:
//!
//! | metric | kind | labels | unit |
//! |---|---|---|---|
//! | `mongodb_overload_errors_total` | counter | `code` (server code, or `none`) | errors |
//! | `mongodb_overload_retries_total` | counter | `origin` (`driver`, `application`) | retries |
//! | `mongodb_overload_retries_refused_total` | counter | `origin` | retries |
//! | `mongodb_overload_retries_refunded_total` | counter | | retries given back to the budget |
//! | `mongodb_overload_backoff_microseconds_total` | counter | | microseconds slept |
//! | `mongodb_overload_retry_budget_level` | gauge | | retries available |
//! | `mongodb_overload_local_rejections_total` | counter | | first attempts rejected locally |
//! | `mongodb_overload_concurrency_waits_total` | counter | `result` (`acquired`, `timed_out`) | waits for a slot |
//! | `mongodb_overload_concurrency_limit` | gauge | `server` (`host:port`) | operations |
//! | `mongodb_overload_concurrency_in_flight` | gauge | `server` | operations |
//!
//! The facade aggregates by name and labels: several clients in one process add up into the
//! counters, and a gauge shows the value of whichever client set it last.
//!
//! [`metrics`]: https://docs.rs/metrics/0.24

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::admission::ConcurrencySnapshot;
use crate::budget::RetryOrigin;

/// Counter: overload errors received, labelled by server `code` (`none` for errors without one,
/// such as connection-establishment failures the driver labels itself).
pub const METRIC_OVERLOAD_ERRORS: &str = "mongodb_overload_errors_total";
/// Counter: retries made, labelled by `origin`.
pub const METRIC_RETRIES: &str = "mongodb_overload_retries_total";
/// Counter: retries the budget refused, labelled by `origin`.
pub const METRIC_RETRIES_REFUSED: &str = "mongodb_overload_retries_refused_total";
/// Counter: retries given back to the budget by operations that succeeded after them.
pub const METRIC_RETRIES_REFUNDED: &str = "mongodb_overload_retries_refunded_total";
/// Counter: microseconds slept in backoff before retries.
pub const METRIC_BACKOFF_MICROS: &str = "mongodb_overload_backoff_microseconds_total";
/// Gauge: retries the budget would admit now.
pub const METRIC_BUDGET_LEVEL: &str = "mongodb_overload_retry_budget_level";
/// Counter: first attempts the adaptive throttle rejected locally, never sent.
pub const METRIC_LOCAL_REJECTIONS: &str = "mongodb_overload_local_rejections_total";
/// Counter: operations that found no free concurrency slot and waited, labelled by `result`.
pub const METRIC_CONCURRENCY_WAITS: &str = "mongodb_overload_concurrency_waits_total";
/// Gauge: a server's concurrency limit in force, labelled by `server`.
pub const METRIC_CONCURRENCY_LIMIT: &str = "mongodb_overload_concurrency_limit";
/// Gauge: a server's concurrency slots in use, labelled by `server`.
pub const METRIC_CONCURRENCY_IN_FLIGHT: &str = "mongodb_overload_concurrency_in_flight";
/// Counter of the overload controller's decisions, by `decision` (and `reason` for refused
/// retries): every [`crate::control::Decision`] once.
pub const METRIC_DECISIONS: &str = "mongodb_overload_decisions_total";

/// Distinct server codes counted separately. Servers send a handful of overload codes (462 for
/// ingress rate limiting, a few for ticket exhaustion); later codes go to
/// [`OverloadStats::overload_errors_other_codes`], so the table never grows or locks.
const CODE_SLOTS: usize = 16;
/// Marks a free slot in the code table: no server code (an `i32`) can equal it.
const FREE: i64 = i64::MIN;

/// One client's overload counters at one moment. Take one with `Client::overload_stats()` (or
/// `OverloadStatsRecorder::snapshot` in this crate).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct OverloadStats {
    /// Overload errors (labelled `SystemOverloadedError`) by server error code.
    pub overload_errors_by_code: BTreeMap<i32, u64>,
    /// Overload errors without a server code: connection-establishment failures, which the
    /// driver labels as overload errors itself.
    pub overload_errors_without_code: u64,
    /// Overload errors whose code came after the recorder's table of 16 distinct codes filled.
    pub overload_errors_other_codes: u64,
    /// Retries the driver sent.
    pub retries_made: u64,
    /// Retries the driver wanted to make and the retry budget refused; each returned its
    /// operation's last error to the application.
    pub retries_refused: u64,
    /// Application retries the budget admitted ([`RetryBudgetHandle::try_withdraw`] said yes).
    ///
    /// [`RetryBudgetHandle::try_withdraw`]: crate::budget::RetryBudgetHandle::try_withdraw
    pub application_retries_made: u64,
    /// Application retries the budget refused.
    pub application_retries_refused: u64,
    /// Retries given back to the budget because the operation that made them then succeeded
    /// (driver and application retries together).
    pub retries_refunded: u64,
    /// Time the driver slept in backoff before retries, summed over all operations.
    pub backoff_slept: Duration,
    /// Retries the budget would admit at the snapshot; `None` when the client has no budget.
    pub budget_level: Option<f64>,
    /// First attempts the adaptive throttle rejected locally; each failed its operation without
    /// reaching the server.
    pub local_rejections: u64,
    /// Operations that found no free concurrency slot on their server and waited for one.
    pub concurrency_waits: u64,
    /// Of those, the ones whose deadline passed before a slot came free.
    pub concurrency_wait_timeouts: u64,
    /// Of those, the ones that went back to server selection because their server changed
    /// while they waited (its pool was cleared, or it stepped down). Not retries: nothing was
    /// sent.
    pub concurrency_wait_reselections: u64,
    /// Each server's concurrency limit, slots in use and latency estimates, by `host:port`; the
    /// driver fills it from the limits it holds (empty while the limit is off).
    pub concurrency_limits: BTreeMap<String, ConcurrencySnapshot>,
}

impl OverloadStats {
    /// All overload errors, whatever their code.
    pub fn overload_errors(&self) -> u64 {
        self.overload_errors_by_code
            .values()
            .fold(0u64, |sum, n| sum.saturating_add(*n))
            .saturating_add(self.overload_errors_without_code)
            .saturating_add(self.overload_errors_other_codes)
    }
}

/// The live counters behind [`OverloadStats`]; one per client, shared by reference count.
#[derive(Debug)]
pub struct OverloadStatsRecorder {
    codes: [CodeSlot; CODE_SLOTS],
    without_code: AtomicU64,
    other_codes: AtomicU64,
    retries_made: AtomicU64,
    retries_refused: AtomicU64,
    application_retries_made: AtomicU64,
    application_retries_refused: AtomicU64,
    retries_refunded: AtomicU64,
    backoff_nanos: AtomicU64,
    local_rejections: AtomicU64,
    concurrency_waits: AtomicU64,
    concurrency_wait_timeouts: AtomicU64,
    concurrency_wait_reselections: AtomicU64,
}

#[derive(Debug)]
struct CodeSlot {
    /// The server code counted here, or [`FREE`]. Set once, never changed after.
    code: AtomicI64,
    count: AtomicU64,
}

impl Default for OverloadStatsRecorder {
    fn default() -> Self {
        Self::new()
    }
}

impl OverloadStatsRecorder {
    /// A recorder with every counter at zero.
    pub fn new() -> Self {
        Self {
            codes: std::array::from_fn(|_| CodeSlot {
                code: AtomicI64::new(FREE),
                count: AtomicU64::new(0),
            }),
            without_code: AtomicU64::new(0),
            other_codes: AtomicU64::new(0),
            retries_made: AtomicU64::new(0),
            retries_refused: AtomicU64::new(0),
            application_retries_made: AtomicU64::new(0),
            application_retries_refused: AtomicU64::new(0),
            retries_refunded: AtomicU64::new(0),
            backoff_nanos: AtomicU64::new(0),
            local_rejections: AtomicU64::new(0),
            concurrency_waits: AtomicU64::new(0),
            concurrency_wait_timeouts: AtomicU64::new(0),
            concurrency_wait_reselections: AtomicU64::new(0),
        }
    }

    /// Counts one overload error with its server code (`None` when it had none).
    pub fn record_overload_error(&self, code: Option<i32>) {
        #[cfg(feature = "metrics")]
        {
            let label = code.map_or_else(|| "none".to_owned(), |c| c.to_string());
            metrics::counter!(METRIC_OVERLOAD_ERRORS, "code" => label).increment(1);
        }
        let Some(code) = code else {
            self.without_code.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let wanted = i64::from(code);
        // Find the code's slot or claim a free one; bounded by the table's size.
        for slot in &self.codes {
            let claimed = match slot.code.load(Ordering::Acquire) {
                c if c == wanted => true,
                FREE => match slot.code.compare_exchange(
                    FREE,
                    wanted,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => true,
                    // Another thread claimed this slot first, maybe for the same code.
                    Err(current) => current == wanted,
                },
                _ => false,
            };
            if claimed {
                slot.count.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        self.other_codes.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one retry the driver sent.
    pub fn record_retry_made(&self) {
        self.retries_made.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!(METRIC_RETRIES, "origin" => RetryOrigin::Driver.as_str()).increment(1);
    }

    /// Counts a retry budget's decision. An admitted application retry counts as made (the
    /// application retries right after asking); an admitted driver retry is counted by
    /// [`Self::record_retry_made`] when the driver sends it.
    pub fn record_budget_decision(&self, origin: RetryOrigin, admitted: bool) {
        let counter = match (origin, admitted) {
            (RetryOrigin::Driver, true) => return,
            (RetryOrigin::Driver, false) => &self.retries_refused,
            (RetryOrigin::Application, true) => &self.application_retries_made,
            (RetryOrigin::Application, false) => &self.application_retries_refused,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        {
            let name = if admitted {
                METRIC_RETRIES
            } else {
                METRIC_RETRIES_REFUSED
            };
            metrics::counter!(name, "origin" => origin.as_str()).increment(1);
        }
    }

    /// Counts `retries` given back to the budget by an operation that succeeded after them.
    pub fn record_budget_refund(&self, retries: u32) {
        self.retries_refunded
            .fetch_add(u64::from(retries), Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!(METRIC_RETRIES_REFUNDED).increment(u64::from(retries));
    }

    /// Adds one backoff sleep (the time asked for; the driver sleeps it in full or the operation
    /// is abandoned, and either way the time was spent not retrying).
    pub fn record_backoff(&self, slept: Duration) {
        let nanos = u64::try_from(slept.as_nanos()).unwrap_or(u64::MAX);
        // One absurd duration saturates to u64::MAX nanoseconds (584 years); the sum itself
        // wraps only after that much backoff has been slept, which no process lives to see.
        self.backoff_nanos.fetch_add(nanos, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!(METRIC_BACKOFF_MICROS)
            .increment(u64::try_from(slept.as_micros()).unwrap_or(u64::MAX));
    }

    /// Publishes the budget's level as a gauge (`metrics` feature); without the feature it does
    /// nothing, since snapshots read the level from the budget itself.
    pub fn record_budget_level(&self, level: f64) {
        #[cfg(feature = "metrics")]
        metrics::gauge!(METRIC_BUDGET_LEVEL).set(level);
        #[cfg(not(feature = "metrics"))]
        let _ = level;
    }

    /// Counts one first attempt the adaptive throttle rejected locally.
    pub fn record_local_rejection(&self) {
        self.local_rejections.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!(METRIC_LOCAL_REJECTIONS).increment(1);
    }

    /// Counts one wait for a concurrency slot, when it ends: with a slot, or with the
    /// operation's deadline (`timed_out`).
    pub fn record_concurrency_wait(&self, timed_out: bool) {
        self.concurrency_waits.fetch_add(1, Ordering::Relaxed);
        if timed_out {
            self.concurrency_wait_timeouts
                .fetch_add(1, Ordering::Relaxed);
        }
        #[cfg(feature = "metrics")]
        {
            let result = if timed_out { "timed_out" } else { "acquired" };
            metrics::counter!(METRIC_CONCURRENCY_WAITS, "result" => result).increment(1);
        }
    }

    /// Counts one wait for a concurrency slot that ended because its server changed: the
    /// operation selects a server again.
    pub fn record_concurrency_reselection(&self) {
        self.concurrency_waits.fetch_add(1, Ordering::Relaxed);
        self.concurrency_wait_reselections
            .fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!(METRIC_CONCURRENCY_WAITS, "result" => "server_changed").increment(1);
    }

    /// Publishes a server's concurrency limit and slots in use as gauges (`metrics` feature);
    /// without the feature it does nothing, since snapshots read the limits themselves.
    pub fn record_concurrency_limit(&self, server: &str, limit: &ConcurrencySnapshot) {
        #[cfg(feature = "metrics")]
        {
            metrics::gauge!(METRIC_CONCURRENCY_LIMIT, "server" => server.to_owned())
                .set(f64::from(limit.limit));
            metrics::gauge!(METRIC_CONCURRENCY_IN_FLIGHT, "server" => server.to_owned())
                .set(f64::from(limit.in_flight));
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (server, limit);
    }

    /// The counters now, with the budget's level as the caller read it (`None`: no budget).
    /// [`OverloadStats::concurrency_limits`] is left empty for the caller to fill.
    pub fn snapshot(&self, budget_level: Option<f64>) -> OverloadStats {
        let mut by_code = BTreeMap::new();
        for slot in &self.codes {
            let code = slot.code.load(Ordering::Acquire);
            if let Ok(code) = i32::try_from(code) {
                by_code.insert(code, slot.count.load(Ordering::Relaxed));
            }
        }
        OverloadStats {
            overload_errors_by_code: by_code,
            overload_errors_without_code: self.without_code.load(Ordering::Relaxed),
            overload_errors_other_codes: self.other_codes.load(Ordering::Relaxed),
            retries_made: self.retries_made.load(Ordering::Relaxed),
            retries_refused: self.retries_refused.load(Ordering::Relaxed),
            application_retries_made: self.application_retries_made.load(Ordering::Relaxed),
            application_retries_refused: self.application_retries_refused.load(Ordering::Relaxed),
            retries_refunded: self.retries_refunded.load(Ordering::Relaxed),
            backoff_slept: Duration::from_nanos(self.backoff_nanos.load(Ordering::Relaxed)),
            budget_level,
            local_rejections: self.local_rejections.load(Ordering::Relaxed),
            concurrency_waits: self.concurrency_waits.load(Ordering::Relaxed),
            concurrency_wait_timeouts: self.concurrency_wait_timeouts.load(Ordering::Relaxed),
            concurrency_wait_reselections: self
                .concurrency_wait_reselections
                .load(Ordering::Relaxed),
            concurrency_limits: BTreeMap::new(),
        }
    }
}

/// Registers the descriptions and units of the `METRIC_*` metrics with the installed recorder
/// (`metrics` feature). Call it once after installing the recorder.
#[cfg(feature = "metrics")]
pub fn describe_metrics() {
    use metrics::Unit;
    metrics::describe_counter!(
        METRIC_OVERLOAD_ERRORS,
        Unit::Count,
        "overload errors received, by server code"
    );
    metrics::describe_counter!(METRIC_RETRIES, Unit::Count, "retries made, by origin");
    metrics::describe_counter!(
        METRIC_DECISIONS,
        Unit::Count,
        "decisions of the overload controller, by decision and reason"
    );
    metrics::describe_counter!(
        METRIC_RETRIES_REFUSED,
        Unit::Count,
        "retries the retry budget refused, by origin"
    );
    metrics::describe_counter!(
        METRIC_RETRIES_REFUNDED,
        Unit::Count,
        "retries given back to the retry budget by operations that then succeeded"
    );
    metrics::describe_counter!(
        METRIC_BACKOFF_MICROS,
        Unit::Microseconds,
        "time slept in backoff before retries"
    );
    metrics::describe_gauge!(
        METRIC_BUDGET_LEVEL,
        Unit::Count,
        "retries the retry budget would admit now"
    );
    metrics::describe_counter!(
        METRIC_LOCAL_REJECTIONS,
        Unit::Count,
        "first attempts the adaptive throttle rejected locally"
    );
    metrics::describe_counter!(
        METRIC_CONCURRENCY_WAITS,
        Unit::Count,
        "waits for a concurrency slot, by result"
    );
    metrics::describe_gauge!(
        METRIC_CONCURRENCY_LIMIT,
        Unit::Count,
        "a server's adaptive concurrency limit"
    );
    metrics::describe_gauge!(
        METRIC_CONCURRENCY_IN_FLIGHT,
        Unit::Count,
        "a server's concurrency slots in use"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overload_errors_are_counted_by_code() {
        let stats = OverloadStatsRecorder::new();
        for code in [462, 462, 6, 462] {
            stats.record_overload_error(Some(code));
        }
        stats.record_overload_error(None);
        let snapshot = stats.snapshot(None);
        assert_eq!(
            snapshot.overload_errors_by_code,
            BTreeMap::from([(6, 1), (462, 3)])
        );
        assert_eq!(snapshot.overload_errors_without_code, 1);
        assert_eq!(snapshot.overload_errors(), 5);
    }

    #[test]
    fn codes_past_the_table_are_counted_as_others() {
        let stats = OverloadStatsRecorder::new();
        // Extreme codes included: i32::MIN must not be mistaken for a free slot.
        let codes: Vec<i32> = [i32::MIN, i32::MAX]
            .into_iter()
            .chain(0..(CODE_SLOTS as i32))
            .collect();
        for code in &codes {
            stats.record_overload_error(Some(*code));
        }
        stats.record_overload_error(Some(i32::MIN));
        let snapshot = stats.snapshot(None);
        assert_eq!(snapshot.overload_errors_by_code.len(), CODE_SLOTS);
        assert_eq!(snapshot.overload_errors_by_code[&i32::MIN], 2);
        assert_eq!(snapshot.overload_errors_other_codes, 2);
        assert_eq!(snapshot.overload_errors(), codes.len() as u64 + 1);
    }

    #[test]
    fn concurrent_recording_loses_nothing() {
        let stats = OverloadStatsRecorder::new();
        std::thread::scope(|scope| {
            for thread in 0..4 {
                let stats = &stats;
                scope.spawn(move || {
                    for i in 0..1000 {
                        // Every thread races to claim the same few codes.
                        stats.record_overload_error(Some(i % 3 + thread % 2));
                        stats.record_retry_made();
                        stats.record_backoff(Duration::from_micros(1));
                    }
                });
            }
        });
        let snapshot = stats.snapshot(None);
        assert_eq!(snapshot.overload_errors(), 4000);
        assert_eq!(snapshot.overload_errors_by_code.len(), 4, "codes 0 to 3");
        assert_eq!(snapshot.retries_made, 4000);
        assert_eq!(snapshot.backoff_slept, Duration::from_millis(4));
    }

    #[test]
    fn decisions_land_in_their_counters() {
        let stats = OverloadStatsRecorder::new();
        stats.record_budget_decision(RetryOrigin::Driver, true);
        stats.record_budget_decision(RetryOrigin::Driver, false);
        stats.record_budget_decision(RetryOrigin::Application, true);
        stats.record_budget_decision(RetryOrigin::Application, true);
        stats.record_budget_decision(RetryOrigin::Application, false);
        stats.record_backoff(Duration::MAX);
        let snapshot = stats.snapshot(Some(3.5));
        assert_eq!(
            (
                snapshot.retries_made,
                snapshot.retries_refused,
                snapshot.application_retries_made,
                snapshot.application_retries_refused,
            ),
            (0, 1, 2, 1)
        );
        assert_eq!(snapshot.budget_level, Some(3.5));
        assert_eq!(snapshot.backoff_slept, Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn admission_events_land_in_their_counters() {
        let stats = OverloadStatsRecorder::new();
        stats.record_local_rejection();
        stats.record_local_rejection();
        stats.record_concurrency_wait(false);
        stats.record_concurrency_wait(true);
        stats.record_concurrency_wait(false);
        let snapshot = stats.snapshot(None);
        assert_eq!(snapshot.local_rejections, 2);
        assert_eq!(snapshot.concurrency_waits, 3);
        assert_eq!(snapshot.concurrency_wait_timeouts, 1);
        assert!(snapshot.concurrency_limits.is_empty());
        assert_eq!(
            snapshot.overload_errors(),
            0,
            "local rejections are not server errors"
        );
    }

    /// The `metrics` feature publishes the same events: checked with a recorder that keeps
    /// every value under its name and labels.
    #[cfg(feature = "metrics")]
    mod metrics_feature {
        use std::sync::{Arc, Mutex};

        use metrics::{
            Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder,
            SharedString, Unit,
        };

        use super::*;

        type Values = Arc<Mutex<BTreeMap<String, f64>>>;

        /// One metric's handle: applies updates to its entry in the shared map.
        struct Entry {
            values: Values,
            key: String,
        }

        impl Entry {
            fn update(&self, f: impl FnOnce(f64) -> f64) {
                let mut values = self.values.lock().unwrap();
                let value = values.entry(self.key.clone()).or_insert(0.0);
                *value = f(*value);
            }
        }

        impl CounterFn for Entry {
            fn increment(&self, value: u64) {
                self.update(|v| v + value as f64);
            }
            fn absolute(&self, value: u64) {
                self.update(|_| value as f64);
            }
        }

        impl GaugeFn for Entry {
            fn increment(&self, value: f64) {
                self.update(|v| v + value);
            }
            fn decrement(&self, value: f64) {
                self.update(|v| v - value);
            }
            fn set(&self, value: f64) {
                self.update(|_| value);
            }
        }

        #[derive(Default)]
        struct KeepingRecorder {
            values: Values,
            described: Mutex<Vec<String>>,
        }

        impl KeepingRecorder {
            fn entry(&self, key: &Key) -> Arc<Entry> {
                let mut name = key.name().to_owned();
                for label in key.labels() {
                    name.push_str(&format!(" {}={}", label.key(), label.value()));
                }
                Arc::new(Entry {
                    values: Arc::clone(&self.values),
                    key: name,
                })
            }
            fn value(&self, key: &str) -> Option<f64> {
                self.values.lock().unwrap().get(key).copied()
            }
        }

        impl Recorder for KeepingRecorder {
            fn describe_counter(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
                self.described.lock().unwrap().push(key.as_str().to_owned());
            }
            fn describe_gauge(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
                self.described.lock().unwrap().push(key.as_str().to_owned());
            }
            fn describe_histogram(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
                self.described.lock().unwrap().push(key.as_str().to_owned());
            }
            fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
                Counter::from_arc(self.entry(key))
            }
            fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
                Gauge::from_arc(self.entry(key))
            }
            fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
                Histogram::noop()
            }
        }

        #[test]
        fn every_counter_and_the_gauge_are_published() {
            let recorder = KeepingRecorder::default();
            metrics::with_local_recorder(&recorder, || {
                describe_metrics();
                let stats = OverloadStatsRecorder::new();
                stats.record_overload_error(Some(462));
                stats.record_overload_error(Some(462));
                stats.record_overload_error(None);
                stats.record_retry_made();
                stats.record_budget_decision(RetryOrigin::Driver, true);
                stats.record_budget_decision(RetryOrigin::Driver, false);
                stats.record_budget_decision(RetryOrigin::Application, true);
                stats.record_budget_decision(RetryOrigin::Application, false);
                stats.record_backoff(Duration::from_millis(150));
                stats.record_budget_level(7.25);
                stats.record_local_rejection();
                stats.record_concurrency_wait(false);
                stats.record_concurrency_wait(true);
                stats.record_concurrency_wait(true);
                let refused = crate::control::Decision::RetryRefused {
                    operation: "find",
                    reason: crate::control::Refusal::Budget,
                    remaining: None,
                };
                crate::control::event::publish(&refused, &stats);
                stats.record_concurrency_limit(
                    "db1:27017",
                    &ConcurrencySnapshot {
                        limit: 15,
                        in_flight: 12,
                        baseline: Some(Duration::from_millis(20)),
                        latency: Some(Duration::from_millis(30)),
                        probing: false,
                        client_bound: false,
                    },
                );
            });
            let expected = [
                ("mongodb_overload_errors_total code=462", 2.0),
                ("mongodb_overload_errors_total code=none", 1.0),
                // One made by the driver, one admitted application retry; the admitted driver
                // decision is not a retry until the driver sends it.
                ("mongodb_overload_retries_total origin=driver", 1.0),
                ("mongodb_overload_retries_total origin=application", 1.0),
                ("mongodb_overload_retries_refused_total origin=driver", 1.0),
                (
                    "mongodb_overload_retries_refused_total origin=application",
                    1.0,
                ),
                ("mongodb_overload_backoff_microseconds_total", 150_000.0),
                ("mongodb_overload_retry_budget_level", 7.25),
                ("mongodb_overload_local_rejections_total", 1.0),
                (
                    "mongodb_overload_concurrency_waits_total result=acquired",
                    1.0,
                ),
                (
                    "mongodb_overload_concurrency_waits_total result=timed_out",
                    2.0,
                ),
                (
                    "mongodb_overload_decisions_total decision=retry_refused \
                     reason=retry budget exhausted",
                    1.0,
                ),
                ("mongodb_overload_concurrency_limit server=db1:27017", 15.0),
                (
                    "mongodb_overload_concurrency_in_flight server=db1:27017",
                    12.0,
                ),
            ];
            for (key, value) in expected {
                assert_eq!(recorder.value(key), Some(value), "{key}");
            }
            let mut described = recorder.described.lock().unwrap().clone();
            described.sort();
            let mut every_metric = vec![
                METRIC_OVERLOAD_ERRORS,
                METRIC_RETRIES,
                METRIC_RETRIES_REFUSED,
                METRIC_RETRIES_REFUNDED,
                METRIC_BACKOFF_MICROS,
                METRIC_BUDGET_LEVEL,
                METRIC_LOCAL_REJECTIONS,
                METRIC_CONCURRENCY_WAITS,
                METRIC_CONCURRENCY_LIMIT,
                METRIC_CONCURRENCY_IN_FLIGHT,
                METRIC_DECISIONS,
            ];
            every_metric.sort_unstable();
            assert_eq!(described, every_metric, "every metric is described once");
        }

        #[test]
        fn budget_decisions_through_a_handle_publish_the_level() {
            use crate::budget::{RetryBudget, RetryBudgetConfig, RetryBudgetHandle};
            use std::time::Instant;

            let recorder = KeepingRecorder::default();
            let budget = RetryBudget::new(RetryBudgetConfig::default()).unwrap();
            let handle = RetryBudgetHandle::new(
                budget,
                Arc::new(OverloadStatsRecorder::new()),
                Instant::now,
            );
            metrics::with_local_recorder(&recorder, || {
                assert!(handle.try_withdraw());
            });
            let level = recorder.value(METRIC_BUDGET_LEVEL).unwrap();
            assert!(
                (9.0..9.1).contains(&level),
                "one of the 10 reserve retries spent: {level}"
            );
        }
    }
}
