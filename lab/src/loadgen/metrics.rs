//! Per-second figures of one variant run, and the computations on them (goodput, recovery
//! time, percentiles).
//!
//! Request outcomes are booked in the second the request was *scheduled*, so goodput and
//! offered load of a second compare the same requests. Attempts, connection events and CPU
//! are booked in the second they happened.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::time::Instant;

/// Why a request or an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ErrorClass {
    /// 462, 433 (or any error labelled `SystemOverloadedError`).
    Overload,
    /// 50 MaxTimeMSExpired, or the fork's `timeoutMS` expiring in the driver.
    Expired,
    /// The application's deadline passed first.
    ClientDeadline,
    /// Server selection or connection checkout timed out.
    PoolTimeout,
    /// I/O errors, closed connections, pool cleared.
    Network,
    /// Anything else.
    Other,
}

impl ErrorClass {
    /// All classes, in report order.
    pub const ALL: [ErrorClass; 6] = [
        ErrorClass::Overload,
        ErrorClass::Expired,
        ErrorClass::ClientDeadline,
        ErrorClass::PoolTimeout,
        ErrorClass::Network,
        ErrorClass::Other,
    ];

    /// Short column name.
    pub fn name(self) -> &'static str {
        match self {
            ErrorClass::Overload => "overload",
            ErrorClass::Expired => "expired",
            ErrorClass::ClientDeadline => "deadline",
            ErrorClass::PoolTimeout => "pool",
            ErrorClass::Network => "network",
            ErrorClass::Other => "other",
        }
    }

    fn idx(self) -> usize {
        self as usize
    }

    /// Classifies a server error code / labels / driver error kind.
    pub fn from_parts(code: Option<i32>, overload_label: bool, kind: DriverErrorKind) -> Self {
        match code {
            Some(462 | 433 | 449 | 450) => return ErrorClass::Overload,
            Some(50) => return ErrorClass::Expired,
            _ => {}
        }
        if overload_label {
            return ErrorClass::Overload;
        }
        match kind {
            DriverErrorKind::Selection => ErrorClass::PoolTimeout,
            DriverErrorKind::Network => ErrorClass::Network,
            DriverErrorKind::Other => ErrorClass::Other,
        }
    }
}

/// The driver error kinds the classification needs (both drivers map onto it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverErrorKind {
    /// Server selection / checkout timeout.
    Selection,
    /// I/O, connection closed, pool cleared.
    Network,
    /// Anything else.
    Other,
}

/// What a client reports about one finished request.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptReport {
    /// Success, or the class of the final error.
    pub outcome: Result<(), ErrorClass>,
    /// Commands sent for this request (from command monitoring).
    pub attempts: u32,
    /// Time spent waiting for connections, summed over attempts.
    pub conn_wait: Duration,
    /// Time from command start to reply, summed over attempts.
    pub service: Duration,
    /// Times the application called the driver for this request (1 unless it retried).
    pub tries: u32,
}

const HIST_MAX_US: u64 = 600_000_000;

/// A latency histogram in microseconds.
pub fn new_hist() -> Histogram<u64> {
    // Bounds are constants that hdrhistogram accepts, so this cannot fail.
    Histogram::new_with_bounds(1, HIST_MAX_US, 2).expect("valid histogram bounds")
}

/// Records a duration (µs) into a histogram made by [`new_hist`].
pub fn rec(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record((d.as_micros() as u64).clamp(1, HIST_MAX_US));
}

/// Percentile (0–100) of a histogram in ms; `None` when empty.
pub fn pct_ms(h: &Histogram<u64>, p: f64) -> Option<f64> {
    if h.is_empty() {
        None
    } else {
        Some(h.value_at_quantile(p / 100.0) as f64 / 1000.0)
    }
}

/// One second of one variant run.
#[derive(Debug, Clone)]
pub struct Second {
    /// Requests scheduled in this second.
    pub offered: u64,
    /// Commands started in this second (every attempt, server-received or not).
    pub attempts: u64,
    /// Requests (scheduled in this second) that succeeded within their deadline.
    pub good: u64,
    /// Requests (scheduled in this second) that failed, by class (`ClientDeadline` = the
    /// application stopped waiting).
    pub errors: [u64; 6],
    /// Attempts that failed in this second, by class.
    pub attempt_errors: [u64; 6],
    /// Requests (scheduled in this second) that touch only cold shards (persona `sharded`:
    /// not the layout's hot shard), booked when the application's wait for them ended.
    pub cold_offered: u64,
    /// Those of them that succeeded within their deadline (part of `good`).
    pub cold_good: u64,
    /// Requests past their deadline that later succeeded.
    pub late_ok: u64,
    /// Requests past their deadline that later failed.
    pub late_err: u64,
    /// Requests with a report (in time or late), and their attempts.
    pub reported: u64,
    /// Attempts of those requests.
    pub reported_attempts: u64,
    /// Application tries (driver calls) of those requests.
    pub reported_tries: u64,
    /// Those of them that sent more than one command (retried, by the driver or the
    /// application).
    pub reported_retried: u64,
    /// Connections created / closed in this second.
    pub conns_opened: u64,
    /// Connections closed in this second.
    pub conns_closed: u64,
    /// Latency as the application saw it (deadline for timed-out requests).
    pub latency: Histogram<u64>,
    /// Connection wait per request (summed over attempts).
    pub conn_wait: Histogram<u64>,
    /// Command time per request (summed over attempts).
    pub service: Histogram<u64>,
    /// Schedule lag of the requests scheduled in this second.
    pub lag: Histogram<u64>,
    /// Process CPU in this second, percent of all cores.
    pub cpu_pct: Option<f64>,
    /// The fork's adaptive concurrency limits of every instance and server, summed, at the
    /// end of this second (`None`: upstream, or no sample).
    pub concurrency_limit: Option<u64>,
    /// The fork's slot waits that began in this second, over every instance.
    pub concurrency_waits: Option<u64>,
    /// Server model figures of this second (deltas of `serverStatus.labOverload` numbers).
    pub server: BTreeMap<String, f64>,
}

impl Default for Second {
    fn default() -> Self {
        Second {
            offered: 0,
            attempts: 0,
            good: 0,
            errors: [0; 6],
            attempt_errors: [0; 6],
            cold_offered: 0,
            cold_good: 0,
            late_ok: 0,
            late_err: 0,
            reported: 0,
            reported_attempts: 0,
            reported_tries: 0,
            reported_retried: 0,
            conns_opened: 0,
            conns_closed: 0,
            latency: new_hist(),
            conn_wait: new_hist(),
            service: new_hist(),
            lag: new_hist(),
            cpu_pct: None,
            concurrency_limit: None,
            concurrency_waits: None,
            server: BTreeMap::new(),
        }
    }
}

impl Second {
    /// Errors of `class`.
    pub fn error(&self, class: ErrorClass) -> u64 {
        self.errors[class.idx()]
    }

    /// Attempts per reported request, if any.
    pub fn attempts_per_request(&self) -> Option<f64> {
        (self.reported > 0).then(|| self.reported_attempts as f64 / self.reported as f64)
    }
}

/// Collects the figures of one variant run. Cheap to call from many tasks.
#[derive(Debug)]
pub struct Recorder {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    start: Instant,
    seconds: Vec<Second>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Recorder {
    /// A recorder whose second 0 starts at `start`.
    pub fn new(start: Instant) -> Recorder {
        Recorder {
            inner: Mutex::new(Inner {
                start,
                seconds: Vec::new(),
            }),
        }
    }

    /// Start of second 0.
    pub fn start(&self) -> Instant {
        lock(&self.inner).start
    }

    /// Moves the start (before anything was booked, e.g. once the clients are connected).
    pub fn set_start(&self, start: Instant) {
        lock(&self.inner).start = start;
    }

    /// The second `t` falls in (0 before the start).
    pub fn second_of(&self, t: Instant) -> usize {
        t.saturating_duration_since(self.start()).as_secs() as usize
    }

    fn with<R>(&self, sec: usize, f: impl FnOnce(&mut Second) -> R) -> R {
        let mut inner = lock(&self.inner);
        Self::book(&mut inner.seconds, sec, f)
    }

    fn with_at<R>(&self, t: Instant, f: impl FnOnce(&mut Second) -> R) -> R {
        let mut inner = lock(&self.inner);
        let sec = t.saturating_duration_since(inner.start).as_secs() as usize;
        Self::book(&mut inner.seconds, sec, f)
    }

    fn book<R>(s: &mut Vec<Second>, sec: usize, f: impl FnOnce(&mut Second) -> R) -> R {
        // Bounded: nothing is booked more than a day past the start.
        let sec = sec.min(24 * 3600);
        if s.len() <= sec {
            s.resize_with(sec + 1, Second::default);
        }
        f(&mut s[sec])
    }

    /// A request was sent `lag` after its scheduled instant `scheduled`.
    pub fn offered(&self, scheduled: Instant, lag: Duration) {
        self.with_at(scheduled, |s| {
            s.offered += 1;
            rec(&mut s.lag, lag);
        });
    }

    /// Books what a scheduler counted on its own: `offered[sec]` = (requests, lag histogram).
    pub fn merge_offered(&self, offered: Vec<(u64, Histogram<u64>)>) {
        let mut inner = lock(&self.inner);
        for (sec, (n, lag)) in offered.into_iter().enumerate() {
            if n == 0 {
                continue;
            }
            Self::book(&mut inner.seconds, sec, |s| {
                s.offered += n;
                // Same bounds everywhere, so adding cannot fail.
                let _ = s.lag.add(&lag);
            });
        }
    }

    /// A command (attempt) started now.
    pub fn attempt_started(&self) {
        self.with_at(Instant::now(), |s| s.attempts += 1);
    }

    /// A command (attempt) failed now.
    pub fn attempt_failed(&self, class: ErrorClass) {
        self.with_at(Instant::now(), |s| s.attempt_errors[class.idx()] += 1);
    }

    /// A connection was created now.
    pub fn conn_opened(&self) {
        self.with_at(Instant::now(), |s| s.conns_opened += 1);
    }

    /// A connection was closed now.
    pub fn conn_closed(&self) {
        self.with_at(Instant::now(), |s| s.conns_closed += 1);
    }

    /// A request scheduled at `scheduled` finished within its deadline after `latency`.
    pub fn in_time(&self, scheduled: Instant, latency: Duration, report: &AttemptReport) {
        self.with_at(scheduled, |s| {
            match report.outcome {
                Ok(()) => s.good += 1,
                Err(c) => s.errors[c.idx()] += 1,
            }
            rec(&mut s.latency, latency);
            Self::book_report(s, report);
        });
    }

    /// The application stopped waiting for a request scheduled at `scheduled` after
    /// `deadline`.
    pub fn timed_out(&self, scheduled: Instant, deadline: Duration) {
        self.with_at(scheduled, |s| {
            s.errors[ErrorClass::ClientDeadline.idx()] += 1;
            rec(&mut s.latency, deadline);
        });
    }

    /// A request scheduled at `scheduled` that touches only cold shards ended, within its
    /// deadline and `good` or not (called beside [`Recorder::in_time`] or
    /// [`Recorder::timed_out`], for those requests only).
    pub fn cold_request(&self, scheduled: Instant, good: bool) {
        self.with_at(scheduled, |s| {
            s.cold_offered += 1;
            s.cold_good += u64::from(good);
        });
    }

    /// A request that had timed out finished after all.
    pub fn late(&self, scheduled: Instant, report: &AttemptReport) {
        self.with_at(scheduled, |s| {
            match report.outcome {
                Ok(()) => s.late_ok += 1,
                Err(_) => s.late_err += 1,
            }
            Self::book_report(s, report);
        });
    }

    /// The application dropped the driver call of a request scheduled at `scheduled` at its
    /// deadline (`--on-deadline drop`), after `attempts` commands over `tries` driver calls;
    /// the request has no late outcome.
    pub fn dropped(&self, scheduled: Instant, attempts: u32, tries: u32) {
        self.with_at(scheduled, |s| {
            s.reported += 1;
            s.reported_attempts += u64::from(attempts);
            s.reported_tries += u64::from(tries);
            s.reported_retried += u64::from(attempts > 1);
        });
    }

    fn book_report(s: &mut Second, r: &AttemptReport) {
        s.reported += 1;
        s.reported_attempts += u64::from(r.attempts);
        s.reported_tries += u64::from(r.tries);
        s.reported_retried += u64::from(r.attempts > 1);
        if r.attempts > 0 {
            rec(&mut s.conn_wait, r.conn_wait);
            rec(&mut s.service, r.service);
        }
    }

    /// Sets the CPU share of second `sec`.
    pub fn set_cpu(&self, sec: usize, pct: f64) {
        self.with(sec, |s| s.cpu_pct = Some(pct));
    }

    /// Sets the fork's concurrency limit at the end of second `sec` and the slot waits that
    /// began in it.
    pub fn set_concurrency(&self, sec: usize, limit: u64, waits: u64) {
        self.with(sec, |s| {
            s.concurrency_limit = Some(limit);
            s.concurrency_waits = Some(waits);
        });
    }

    /// Adds server figures to second `sec`.
    pub fn add_server(&self, sec: usize, figures: &BTreeMap<String, f64>) {
        self.with(sec, |s| {
            for (k, v) in figures {
                *s.server.entry(k.clone()).or_insert(0.0) += v;
            }
        });
    }

    /// Current figures of second `sec` (offered, good), for the progress display.
    pub fn peek(&self, sec: usize) -> (u64, u64) {
        let inner = lock(&self.inner);
        inner
            .seconds
            .get(sec)
            .map(|x| (x.offered, x.good))
            .unwrap_or((0, 0))
    }

    /// The seconds recorded so far, padded to at least `len`.
    pub fn take(&self, len: usize) -> Vec<Second> {
        let mut s = std::mem::take(&mut lock(&self.inner).seconds);
        if s.len() < len {
            s.resize_with(len, Second::default);
        }
        s
    }
}

/// Goodput per second (successes within the deadline, by scheduled second).
pub fn goodput(seconds: &[Second]) -> Vec<u64> {
    seconds.iter().map(|s| s.good).collect()
}

/// Recovery time after the burst, in seconds: the smallest `k` such that from second
/// `burst_end + k` to the end of the schedule (`offered.len()`), every second's goodput is at
/// least `threshold` × its offered load. `None` when goodput never stays there.
pub fn recovery_time(
    offered: &[u64],
    good: &[u64],
    burst_end: usize,
    threshold: f64,
) -> Option<usize> {
    let end = offered.len().min(good.len());
    if burst_end >= end {
        return None;
    }
    let ok = |t: usize| good[t] as f64 >= threshold * offered[t] as f64;
    let mut first_ok = None;
    for t in (burst_end..end).rev() {
        if ok(t) {
            first_ok = Some(t);
        } else {
            break;
        }
    }
    first_ok.map(|t| t - burst_end)
}

/// Merges the histograms selected by `f` over `seconds`.
pub fn merged(seconds: &[Second], f: impl Fn(&Second) -> &Histogram<u64>) -> Histogram<u64> {
    let mut h = new_hist();
    for s in seconds {
        // Same bounds everywhere, so adding cannot fail.
        let _ = h.add(f(s));
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery() {
        let offered = [10, 10, 10, 10, 10, 10];
        assert_eq!(
            recovery_time(&offered, &[10, 2, 3, 10, 10, 10], 1, 0.95),
            Some(2)
        );
        assert_eq!(
            recovery_time(&offered, &[10, 2, 10, 9, 10, 10], 1, 0.95),
            Some(3)
        );
        assert_eq!(
            recovery_time(&offered, &[10, 10, 10, 10, 10, 2], 1, 0.95),
            None
        );
        assert_eq!(recovery_time(&offered, &[10; 6], 2, 0.95), Some(0));
        assert_eq!(recovery_time(&offered, &[10; 6], 6, 0.95), None);
        // Seconds without load count as recovered.
        assert_eq!(recovery_time(&[10, 0, 0], &[0, 0, 0], 1, 0.95), Some(0));
    }

    #[test]
    fn recorder_books_by_scheduled_second() {
        let start = Instant::now();
        let r = Recorder::new(start);
        let t1 = start + Duration::from_millis(1500);
        r.offered(t1, Duration::from_micros(300));
        r.offered(t1, Duration::from_micros(300));
        let ok = AttemptReport {
            outcome: Ok(()),
            attempts: 1,
            conn_wait: Duration::from_millis(1),
            service: Duration::from_millis(2),
            tries: 1,
        };
        r.in_time(t1, Duration::from_millis(3), &ok);
        r.timed_out(t1, Duration::from_millis(100));
        let late = AttemptReport {
            outcome: Err(ErrorClass::Overload),
            attempts: 3,
            ..ok.clone()
        };
        r.late(t1, &late);
        r.cold_request(t1, true);
        r.cold_request(t1, false);
        let s = r.take(3);
        assert_eq!(s.len(), 3);
        assert_eq!(s[1].offered, 2);
        assert_eq!((s[1].cold_offered, s[1].cold_good), (2, 1));
        assert_eq!(goodput(&s), vec![0, 1, 0]);
        assert_eq!(s[1].error(ErrorClass::ClientDeadline), 1);
        assert_eq!(s[1].late_err, 1);
        assert_eq!(s[1].attempts_per_request(), Some(2.0));
        let p99 = pct_ms(&s[1].latency, 99.0).unwrap();
        assert!((99.0..=101.0).contains(&p99), "{p99}");
        assert!(pct_ms(&s[0].latency, 50.0).is_none());
    }

    #[test]
    fn percentiles_on_synthetic_data() {
        let mut h = new_hist();
        for ms in 1..=100u64 {
            rec(&mut h, Duration::from_millis(ms));
        }
        let close = |a: f64, b: f64| (a - b).abs() <= b * 0.01 + 0.01;
        assert!(close(pct_ms(&h, 50.0).unwrap(), 50.0));
        assert!(close(pct_ms(&h, 95.0).unwrap(), 95.0));
        assert!(close(pct_ms(&h, 99.0).unwrap(), 99.0));
    }

    #[test]
    fn classification() {
        use DriverErrorKind as K;
        assert_eq!(
            ErrorClass::from_parts(Some(462), true, K::Other),
            ErrorClass::Overload
        );
        assert_eq!(
            ErrorClass::from_parts(Some(2), true, K::Other),
            ErrorClass::Overload
        );
        assert_eq!(
            ErrorClass::from_parts(Some(50), false, K::Other),
            ErrorClass::Expired
        );
        assert_eq!(
            ErrorClass::from_parts(None, false, K::Selection),
            ErrorClass::PoolTimeout
        );
        assert_eq!(
            ErrorClass::from_parts(None, false, K::Network),
            ErrorClass::Network
        );
        assert_eq!(
            ErrorClass::from_parts(Some(11000), false, K::Other),
            ErrorClass::Other
        );
    }
}
