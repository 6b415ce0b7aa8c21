//! Counters, gauges, the per-second time series, and the snapshot types.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use bson::Document;
use serde::Serialize;

use super::delays::DelayCounts;
use super::histogram::LogHistogram;

/// Monotonic counters (core time in nanoseconds internally, so that per-quantum sums and
/// per-request sums of the same work agree exactly).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) admitted: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) shed: AtomicU64,
    pub(crate) random_rejections: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) expired: AtomicU64,
    pub(crate) killed: AtomicU64,
    pub(crate) orphaned: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) abandoned: AtomicU64,
    pub(crate) wasted_ns: AtomicU64,
    pub(crate) useful_ns: AtomicU64,
    pub(crate) busy_ns: AtomicU64,
    pub(crate) overhead_ns: AtomicU64,
    pub(crate) rejection_ns: AtomicU64,
    pub(crate) expiry_ns: AtomicU64,
}

pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn add_ns(c: &AtomicU64, d: std::time::Duration) {
    c.fetch_add(
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

/// Counter values (totals in a snapshot, per-second deltas in a sample).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CounterSnapshot {
    /// Requests that passed the ingress limiter (or were exempt from it).
    pub admitted: u64,
    /// 462 rejections by the ingress limiter.
    pub rejected: u64,
    /// 433 rejections by a full ticket waiter queue.
    pub shed: u64,
    /// Data requests rejected at random (`randomRejectShare`; 462 with both overload labels).
    /// Not included in `rejected`.
    pub random_rejections: u64,
    /// Requests that did all their work (including orphaned ones).
    pub completed: u64,
    /// 50 MaxTimeMSExpired, noticed at an interrupt point (the ingress queue, a ticket wait, a
    /// yield point).
    pub expired: u64,
    /// Requests stopped because their client disconnected.
    pub killed: u64,
    /// Requests that completed after their client had disconnected.
    pub orphaned: u64,
    /// Completed requests whose command then failed (reported by the server).
    pub failed: u64,
    /// Requests that completed after the deadline their application announced in
    /// `comment.labDeadlineMs` (the application had stopped waiting; the lab's oracle).
    pub abandoned: u64,
    /// Core time spent on requests that expired, were killed, were orphaned, were abandoned or
    /// failed, on stopping expired and killed requests, and on rejecting requests (ms).
    pub wasted_work_ms: f64,
    /// Core time spent on requests that completed for a client still waiting (ms).
    pub useful_work_ms: f64,
    /// Core time spent accepting connections (ms).
    pub overhead_work_ms: f64,
    /// All core time used (ms).
    pub busy_core_ms: f64,
    /// Core time spent rejecting requests (`costs.rejectionMs` for every 462, 433 and random
    /// rejection), ms; part of both `wastedWorkMs` and `busyCoreMs`.
    pub rejection_work_ms: f64,
    /// Core time spent stopping requests at interrupt points (`costs.expiryMs` for every
    /// request that expired or was killed), ms; part of both `wastedWorkMs` and `busyCoreMs`.
    pub expiry_work_ms: f64,
    /// Ticket waiters woken by a ticket coming free (random wake-ups; both pools).
    pub ticket_wakeups: u64,
    /// Woken waiters that found the ticket taken by a request that arrived before they came
    /// for it, and waited again: how often an arrival overtakes the waiters.
    pub ticket_races_lost: u64,
    /// Time from waking each waiter to its coming for the ticket, summed (ms): the host's
    /// scheduling delay, the window in which arrivals overtake (÷ `ticketWakeups`: the mean).
    pub ticket_wake_ms: f64,
    /// Cores handed to a request's slice that waited for one, and the time from the release to
    /// the slice starting, summed (ms): core time the host's scheduling loses.
    pub request_handoffs: u64,
    pub request_handoff_ms: f64,
    /// The same for work outside requests: rejections, expired requests' stops, connections'
    /// set-up.
    pub other_handoffs: u64,
    pub other_handoff_ms: f64,
    /// The times of `ticketWakeMs`, `requestHandoffMs` and `otherHandoffMs`, each counted by
    /// size (`le100us` … `le100ms`, `over100ms`): whether the host is slow on every one or
    /// stalls now and then.
    pub ticket_wake_delays: DelayCounts,
    pub request_handoff_delays: DelayCounts,
    pub other_handoff_delays: DelayCounts,
    /// How long slices that slept slept beyond what they asked, summed (ms) and by size: the
    /// timer fires on a millisecond tick at or after the deadline, and the host runs the
    /// core's task some time after that (the bank pays it back; see `cores`).
    pub slice_oversleep_ms: f64,
    pub slice_oversleep: DelayCounts,
    /// Tickets taken while a woken waiter was coming for them (each is a race that waiter
    /// loses unless another ticket comes free first), by the time from the release that woke
    /// it; and who took them: requests that reached the server before that release or after
    /// it, by how long (the same buckets), or requests coming back from a yield.
    pub ticket_steals: DelayCounts,
    pub ticket_stealers_arrived_before: DelayCounts,
    pub ticket_stealers_arrived_after: DelayCounts,
    pub ticket_steals_by_yields: u64,
    /// Requests that did all their work with a ticket: how long they waited from reaching the
    /// server to holding it (the ingress queue and the ticket wait), and how long from then to
    /// completing (the cores' run queue and the work), summed (ms) and by size.
    pub completed_wait_ms: f64,
    pub completed_waits: DelayCounts,
    pub completed_run_ms: f64,
    pub completed_runs: DelayCounts,
    /// Requests the lab names (`comment.labReq`): the gap from each first attempt's arrival to
    /// the previous first attempt's, and from each retry's to the previous retry's, summed
    /// (ms) and by size. Retries sent on a client's timer ticks arrive bunched.
    pub first_attempt_gap_ms: f64,
    pub first_attempt_gaps: DelayCounts,
    pub retry_gap_ms: f64,
    pub retry_gaps: DelayCounts,
    /// The same from each first attempt to the previous retry, and from each retry to the
    /// previous first attempt: how the two kinds' bunches interleave.
    pub first_attempt_after_retry_gap_ms: f64,
    pub first_attempt_after_retry_gaps: DelayCounts,
    pub retry_after_first_attempt_gap_ms: f64,
    pub retry_after_first_attempt_gaps: DelayCounts,
}

impl Counters {
    pub(crate) fn read(&self) -> CounterSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let ms = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64 / 1e6;
        CounterSnapshot {
            admitted: g(&self.admitted),
            rejected: g(&self.rejected),
            shed: g(&self.shed),
            random_rejections: g(&self.random_rejections),
            completed: g(&self.completed),
            expired: g(&self.expired),
            killed: g(&self.killed),
            orphaned: g(&self.orphaned),
            failed: g(&self.failed),
            abandoned: g(&self.abandoned),
            wasted_work_ms: ms(&self.wasted_ns),
            useful_work_ms: ms(&self.useful_ns),
            overhead_work_ms: ms(&self.overhead_ns),
            busy_core_ms: ms(&self.busy_ns),
            rejection_work_ms: ms(&self.rejection_ns),
            expiry_work_ms: ms(&self.expiry_ns),
            // Kept by the ticket pools and the cores; the model fills them in.
            ticket_wakeups: 0,
            ticket_races_lost: 0,
            ticket_wake_ms: 0.0,
            request_handoffs: 0,
            request_handoff_ms: 0.0,
            other_handoffs: 0,
            other_handoff_ms: 0.0,
            ticket_wake_delays: DelayCounts::default(),
            request_handoff_delays: DelayCounts::default(),
            other_handoff_delays: DelayCounts::default(),
            slice_oversleep_ms: 0.0,
            slice_oversleep: DelayCounts::default(),
            ticket_steals: DelayCounts::default(),
            ticket_stealers_arrived_before: DelayCounts::default(),
            ticket_stealers_arrived_after: DelayCounts::default(),
            ticket_steals_by_yields: 0,
            completed_wait_ms: 0.0,
            completed_waits: DelayCounts::default(),
            completed_run_ms: 0.0,
            completed_runs: DelayCounts::default(),
            first_attempt_gap_ms: 0.0,
            first_attempt_gaps: DelayCounts::default(),
            retry_gap_ms: 0.0,
            retry_gaps: DelayCounts::default(),
            first_attempt_after_retry_gap_ms: 0.0,
            first_attempt_after_retry_gaps: DelayCounts::default(),
            retry_after_first_attempt_gap_ms: 0.0,
            retry_after_first_attempt_gaps: DelayCounts::default(),
        }
    }
}

impl CounterSnapshot {
    fn minus(&self, o: &CounterSnapshot) -> CounterSnapshot {
        CounterSnapshot {
            admitted: self.admitted.saturating_sub(o.admitted),
            rejected: self.rejected.saturating_sub(o.rejected),
            shed: self.shed.saturating_sub(o.shed),
            random_rejections: self.random_rejections.saturating_sub(o.random_rejections),
            completed: self.completed.saturating_sub(o.completed),
            expired: self.expired.saturating_sub(o.expired),
            killed: self.killed.saturating_sub(o.killed),
            orphaned: self.orphaned.saturating_sub(o.orphaned),
            failed: self.failed.saturating_sub(o.failed),
            abandoned: self.abandoned.saturating_sub(o.abandoned),
            wasted_work_ms: (self.wasted_work_ms - o.wasted_work_ms).max(0.0),
            useful_work_ms: (self.useful_work_ms - o.useful_work_ms).max(0.0),
            overhead_work_ms: (self.overhead_work_ms - o.overhead_work_ms).max(0.0),
            busy_core_ms: (self.busy_core_ms - o.busy_core_ms).max(0.0),
            rejection_work_ms: (self.rejection_work_ms - o.rejection_work_ms).max(0.0),
            expiry_work_ms: (self.expiry_work_ms - o.expiry_work_ms).max(0.0),
            ticket_wakeups: self.ticket_wakeups.saturating_sub(o.ticket_wakeups),
            ticket_races_lost: self.ticket_races_lost.saturating_sub(o.ticket_races_lost),
            ticket_wake_ms: (self.ticket_wake_ms - o.ticket_wake_ms).max(0.0),
            request_handoffs: self.request_handoffs.saturating_sub(o.request_handoffs),
            request_handoff_ms: (self.request_handoff_ms - o.request_handoff_ms).max(0.0),
            other_handoffs: self.other_handoffs.saturating_sub(o.other_handoffs),
            other_handoff_ms: (self.other_handoff_ms - o.other_handoff_ms).max(0.0),
            ticket_wake_delays: self.ticket_wake_delays.minus(&o.ticket_wake_delays),
            request_handoff_delays: self.request_handoff_delays.minus(&o.request_handoff_delays),
            other_handoff_delays: self.other_handoff_delays.minus(&o.other_handoff_delays),
            slice_oversleep_ms: (self.slice_oversleep_ms - o.slice_oversleep_ms).max(0.0),
            slice_oversleep: self.slice_oversleep.minus(&o.slice_oversleep),
            ticket_steals: self.ticket_steals.minus(&o.ticket_steals),
            ticket_stealers_arrived_before: self
                .ticket_stealers_arrived_before
                .minus(&o.ticket_stealers_arrived_before),
            ticket_stealers_arrived_after: self
                .ticket_stealers_arrived_after
                .minus(&o.ticket_stealers_arrived_after),
            ticket_steals_by_yields: self
                .ticket_steals_by_yields
                .saturating_sub(o.ticket_steals_by_yields),
            completed_wait_ms: (self.completed_wait_ms - o.completed_wait_ms).max(0.0),
            completed_waits: self.completed_waits.minus(&o.completed_waits),
            completed_run_ms: (self.completed_run_ms - o.completed_run_ms).max(0.0),
            completed_runs: self.completed_runs.minus(&o.completed_runs),
            first_attempt_gap_ms: (self.first_attempt_gap_ms - o.first_attempt_gap_ms).max(0.0),
            first_attempt_gaps: self.first_attempt_gaps.minus(&o.first_attempt_gaps),
            retry_gap_ms: (self.retry_gap_ms - o.retry_gap_ms).max(0.0),
            retry_gaps: self.retry_gaps.minus(&o.retry_gaps),
            first_attempt_after_retry_gap_ms: (self.first_attempt_after_retry_gap_ms
                - o.first_attempt_after_retry_gap_ms)
                .max(0.0),
            first_attempt_after_retry_gaps: self
                .first_attempt_after_retry_gaps
                .minus(&o.first_attempt_after_retry_gaps),
            retry_after_first_attempt_gap_ms: (self.retry_after_first_attempt_gap_ms
                - o.retry_after_first_attempt_gap_ms)
                .max(0.0),
            retry_after_first_attempt_gaps: self
                .retry_after_first_attempt_gaps
                .minus(&o.retry_after_first_attempt_gaps),
        }
    }
}

/// Instantaneous values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GaugeSnapshot {
    /// Requests waiting in the ingress queue for a token.
    pub ingress_queue_depth: u64,
    /// Tokens in the ingress bucket (negative while requests wait).
    pub ingress_tokens: f64,
    /// Requests waiting for a read ticket.
    pub read_waiters: u32,
    /// Requests waiting for a write ticket.
    pub write_waiters: u32,
    /// Read tickets held.
    pub read_tickets_in_use: u32,
    /// Read tickets in the pool.
    pub read_tickets_total: u32,
    /// Write tickets held.
    pub write_tickets_in_use: u32,
    /// Write tickets in the pool.
    pub write_tickets_total: u32,
    /// Cores running a quantum.
    pub cores_busy: u32,
    /// Virtual cores.
    pub cores_total: u32,
    /// Requests between admission and the end of execution.
    pub in_flight: u64,
}

/// Everything the model knows at one moment.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelSnapshot {
    /// Whether the model is on.
    pub enabled: bool,
    /// Seconds since the model was created.
    pub uptime_secs: f64,
    /// Totals since the model was created.
    pub counters: CounterSnapshot,
    /// Current values.
    pub gauges: GaugeSnapshot,
    /// How long admitted requests waited in the server's queues, since the model was last
    /// switched on.
    pub queue_wait_ms: WaitPercentiles,
}

/// Percentiles of a wait, in milliseconds (0 when nothing was recorded).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct WaitPercentiles {
    /// Requests recorded.
    pub count: u64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Longest.
    pub max: f64,
}

/// The distribution of one kind of wait (microsecond resolution, 3 significant digits, up to
/// about 71 minutes; longer waits are recorded as that, so memory stays fixed).
#[derive(Debug, Default)]
pub(crate) struct WaitHistogram(Mutex<LogHistogram>);

impl WaitHistogram {
    fn hist(&self) -> std::sync::MutexGuard<'_, LogHistogram> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn record(&self, wait: Duration) {
        self.hist()
            .record(u64::try_from(wait.as_micros()).unwrap_or(u64::MAX));
    }

    pub(crate) fn reset(&self) {
        self.hist().reset();
    }

    pub(crate) fn percentiles(&self) -> WaitPercentiles {
        let h = self.hist();
        let ms = |us: u64| us as f64 / 1000.0;
        if h.len() == 0 {
            return WaitPercentiles::default();
        }
        WaitPercentiles {
            count: h.len(),
            p50: ms(h.value_at_quantile(0.50)),
            p95: ms(h.value_at_quantile(0.95)),
            p99: ms(h.value_at_quantile(0.99)),
            max: ms(h.max()),
        }
    }
}

impl ModelSnapshot {
    /// The snapshot as a document, e.g. for `serverStatus.labOverload`.
    pub fn to_document(&self) -> Document {
        bson::to_document(self).unwrap_or_default()
    }
}

/// One second of the time series: counter deltas over the second that ended at `t`, gauges at
/// the first model event after that second ended.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    /// End of the second, in whole seconds since the model was created.
    pub t: u64,
    /// What happened during the second.
    pub counters: CounterSnapshot,
    /// Gauges at the end of the second.
    pub gauges: GaugeSnapshot,
}

impl Sample {
    /// The sample as a document.
    pub fn to_document(&self) -> Document {
        bson::to_document(self).unwrap_or_default()
    }
}

/// Bounded ring of samples.
#[derive(Debug)]
pub(crate) struct Series {
    cap: usize,
    samples: VecDeque<Sample>,
    /// The next second to record.
    next: u64,
    last: CounterSnapshot,
}

impl Series {
    pub(crate) fn new(cap: usize) -> Series {
        Series {
            cap: cap.max(1),
            samples: VecDeque::new(),
            next: 1,
            last: CounterSnapshot::default(),
        }
    }

    pub(crate) fn set_capacity(&mut self, cap: usize) {
        self.cap = cap.max(1);
        while self.samples.len() > self.cap {
            self.samples.pop_front();
        }
    }

    /// Whether second boundaries passed since the last record.
    pub(crate) fn due(&self, elapsed_secs: u64) -> bool {
        elapsed_secs >= self.next
    }

    /// Records every whole second up to `elapsed_secs`; the first gets the deltas, the rest
    /// (seconds without any event) zero. At most `cap` samples are written.
    pub(crate) fn record(
        &mut self,
        elapsed_secs: u64,
        now: CounterSnapshot,
        gauges: GaugeSnapshot,
    ) {
        if elapsed_secs < self.next {
            return;
        }
        let missed = elapsed_secs - self.next + 1;
        if missed > self.cap as u64 {
            self.next = elapsed_secs + 1 - self.cap as u64;
        }
        let mut delta = now.minus(&self.last);
        while self.next <= elapsed_secs {
            if self.samples.len() == self.cap {
                self.samples.pop_front();
            }
            self.samples.push_back(Sample {
                t: self.next,
                counters: delta,
                gauges,
            });
            delta = CounterSnapshot::default();
            self.next += 1;
        }
        self.last = now;
    }

    /// The last `n` samples, oldest first.
    pub(crate) fn last(&self, n: usize) -> Vec<Sample> {
        let skip = self.samples.len().saturating_sub(n);
        self.samples.iter().skip(skip).copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::histogram::MAX_US;

    #[test]
    fn wait_histogram_reports_milliseconds_and_resets() {
        let w = WaitHistogram::default();
        assert_eq!(w.percentiles(), WaitPercentiles::default());
        for ms in 1..=100 {
            w.record(Duration::from_millis(ms));
        }
        w.record(Duration::from_secs(10 * 3600));
        let p = w.percentiles();
        assert_eq!(p.count, 101);
        assert!((p.p50 - 51.0).abs() < 0.1, "{p:?}");
        assert!((p.p99 - 100.0).abs() < 0.1, "{p:?}");
        // Ten hours is beyond the histogram's range: recorded as its largest value.
        assert_eq!(p.max, MAX_US as f64 / 1000.0, "{p:?}");
        w.reset();
        assert_eq!(w.percentiles().count, 0);
    }

    #[test]
    fn ring_is_bounded_and_fills_gaps() {
        let mut s = Series::new(3);
        let mut c = CounterSnapshot {
            admitted: 5,
            ..CounterSnapshot::default()
        };
        s.record(1, c, GaugeSnapshot::default());
        c.admitted = 7;
        s.record(4, c, GaugeSnapshot::default());
        let v = s.last(10);
        assert_eq!(v.iter().map(|x| x.t).collect::<Vec<_>>(), [2, 3, 4]);
        assert_eq!(v[0].counters.admitted, 2);
        assert_eq!(v[1].counters.admitted, 0);
        c.admitted = 8;
        s.record(1000, c, GaugeSnapshot::default());
        let v = s.last(10);
        assert_eq!(v.iter().map(|x| x.t).collect::<Vec<_>>(), [998, 999, 1000]);
        assert_eq!(v[0].counters.admitted, 1);
    }
}
