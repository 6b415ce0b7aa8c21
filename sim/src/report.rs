//! What one run measured, and the markdown table of a grid.

use std::fmt::Write;

use crate::scenario::Scenario;
use crate::server::ServerStats;
use crate::variant::Variant;

/// How a request ended, as its application saw it: exactly one per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The driver returned a result before the deadline.
    Success,
    /// The driver returned the server's overload error (retries exhausted or refused).
    Rejected,
    /// The client's throttle (or its slot wait) rejected it without sending.
    LocalRejection,
    /// The deadline passed first: the application's, the driver's `timeoutMS`, or the server's
    /// `maxTimeMS`.
    Deadline,
}

/// The figures of one run.
#[derive(Clone, Debug)]
pub struct Report {
    pub scenario: String,
    pub variant: Variant,
    pub clients: u32,
    pub seed: u64,
    /// 100 % load (ops/s).
    pub capacity: f64,
    /// Cores of every server together (a cluster's shards' summed).
    pub cores: u32,
    pub phase_secs: Vec<f64>,
    pub burst: Option<usize>,
    /// Requests that arrived, and how they ended.
    pub requests: u64,
    pub success: u64,
    pub rejected: u64,
    pub local: u64,
    pub deadline: u64,
    pub phase_requests: Vec<u64>,
    pub phase_success: Vec<u64>,
    /// On a sharded cluster: the requests that do not touch the hot shard (the lab's
    /// cold-shard requests), and those of them that succeeded in time.
    pub cold_requests: u64,
    pub cold_success: u64,
    /// On a sharded cluster: the shards' overload errors the routers retried themselves.
    pub router_retries: u64,
    /// Attempts sent to the server: first attempts and retries.
    pub first_attempts: u64,
    pub retries: u64,
    /// Requests that sent at least one retry (the lab's `retried`).
    pub retried_requests: u64,
    /// First attempts rejected locally (the throttle or a slot wait).
    pub local_rejections: u64,
    /// Retries the budget refused (when asked, or when they were due after their backoff).
    pub budget_refusals: u64,
    pub slot_waits: u64,
    /// Attempts that waited for a connection of their client's pool, and the most connections
    /// one client had checked out at once.
    pub checkout_waits: u64,
    pub peak_connections: u32,
    /// Retries the deadline gate declined: the backoff plus the typical service time would
    /// pass the deadline, or the backoff alone would.
    pub cannot_finish: u64,
    pub backoff_past_deadline: u64,
    /// Requests that ended without an attempt sent: rejected locally, or out of time while
    /// waiting for a concurrency slot.
    pub unsent: u64,
    /// Driver operations that ended after their application stopped waiting.
    pub late_driver_ends: u64,
    /// Operations still alive when the loop stopped (0 in a complete run).
    pub unfinished: u64,
    pub server: ServerStats,
    pub busy_in_schedule_ns: u64,
    /// Latency of every request as its application saw it (until its outcome).
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub events: u64,
    pub peak_events: u64,
    pub peak_ops: u64,
    /// Real time of the run (s), and of building its controllers.
    pub real_secs: f64,
    pub setup_secs: f64,
    /// With [`crate::engine::RunConfig::series`]: the counters at the start of every second of
    /// virtual time after the first, and at the end of the run (cumulative; [`series_csv`]
    /// prints each second's differences, the last second's up to the end).
    pub seconds: Vec<SecondCounters>,
}

/// A run's counters at one instant, for its per-second series.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SecondCounters {
    /// Requests that arrived, succeeded, and ran out of time.
    pub requests: u64,
    pub success: u64,
    pub deadline: u64,
    pub first_attempts: u64,
    pub retries: u64,
    /// Attempts the server's ingress limiter rejected, admitted, completed, and stopped at
    /// their `maxTimeMS`, and its cores' busy time (the lab's `server_rejected`,
    /// `server_admitted`, `server_completed`, `server_expired` and `server_busyCoreMs`).
    pub server_rejected: u64,
    pub server_admitted: u64,
    pub server_completed: u64,
    pub server_expired: u64,
    pub server_busy_ns: u64,
    /// Slices that waited for a core (the lab's `server_requestHandoffs` +
    /// `server_otherHandoffs`).
    pub server_handoffs: u64,
    /// The completed requests' time to a ticket and from it to completing (the lab's
    /// `server_completedWaitMs` and `server_completedRunMs`).
    pub server_completed_wait_ns: u64,
    pub server_completed_run_ns: u64,
    pub slot_waits: u64,
    /// Requests that ended without an attempt sent.
    pub unsent: u64,
    /// Ticket waiters woken, and those that lost their ticket to an arrival (the lab's
    /// `server_ticketWakeups` and `server_ticketRacesLost`).
    pub ticket_wakeups: u64,
    pub ticket_races_lost: u64,
    /// The clients' concurrency limits summed, when the variant has one.
    pub concurrency_limit: Option<u64>,
}

/// The header of [`series_csv`]'s rows.
pub const SERIES_HEADER: &str = "scenario,variant,clients,seed,second,requests,success,\
deadline,first_attempts,retries,server_rejected,server_admitted,server_completed,\
server_expired,server_busy_ms,server_handoffs,server_completed_wait_ms,\
server_completed_run_ms,slot_waits,unsent,ticket_wakeups,ticket_races_lost,concurrency_limit\n";

/// One CSV row per second of `report`'s run (from [`Report::seconds`]): what happened during
/// the second (by when it happened, not by when its request arrived, unlike the lab's
/// series), and the concurrency limit at its end; the columns of [`SERIES_HEADER`].
pub fn series_csv(report: &Report) -> String {
    let mut out = String::new();
    let mut before = SecondCounters::default();
    for (second, now) in report.seconds.iter().enumerate() {
        let d = |f: fn(&SecondCounters) -> u64| f(now).saturating_sub(f(&before));
        out.push_str(&format!(
            "{},{},{},{},{second},{},{},{},{},{},{},{},{},{},{:.3},{},{:.3},{:.3},{},{},{},{},{}\n",
            report.scenario,
            report.variant.name(),
            report.clients,
            report.seed,
            d(|c| c.requests),
            d(|c| c.success),
            d(|c| c.deadline),
            d(|c| c.first_attempts),
            d(|c| c.retries),
            d(|c| c.server_rejected),
            d(|c| c.server_admitted),
            d(|c| c.server_completed),
            d(|c| c.server_expired),
            d(|c| c.server_busy_ns) as f64 / 1e6,
            d(|c| c.server_handoffs),
            d(|c| c.server_completed_wait_ns) as f64 / 1e6,
            d(|c| c.server_completed_run_ns) as f64 / 1e6,
            d(|c| c.slot_waits),
            d(|c| c.unsent),
            d(|c| c.ticket_wakeups),
            d(|c| c.ticket_races_lost),
            now.concurrency_limit
                .map_or(String::new(), |l| l.to_string()),
        ));
        before = *now;
    }
    out
}

impl Report {
    /// The empty report of a run of `scenario` and `variant` with `clients` clients from
    /// `seed`, at `capacity` ops/s.
    pub(crate) fn new(
        scenario: &Scenario,
        variant: Variant,
        clients: u32,
        seed: u64,
        capacity: f64,
    ) -> Self {
        let phases = scenario.phases.len();
        Self {
            scenario: scenario.name.name().to_owned(),
            variant,
            clients,
            seed,
            capacity,
            cores: scenario.cores * scenario.cluster.as_ref().map_or(1, |c| c.shards),
            phase_secs: scenario.phases.iter().map(|p| p.secs).collect(),
            burst: scenario.burst,
            requests: 0,
            success: 0,
            rejected: 0,
            local: 0,
            deadline: 0,
            phase_requests: vec![0; phases],
            phase_success: vec![0; phases],
            cold_requests: 0,
            cold_success: 0,
            router_retries: 0,
            first_attempts: 0,
            retries: 0,
            retried_requests: 0,
            local_rejections: 0,
            budget_refusals: 0,
            slot_waits: 0,
            checkout_waits: 0,
            peak_connections: 0,
            cannot_finish: 0,
            backoff_past_deadline: 0,
            unsent: 0,
            late_driver_ends: 0,
            unfinished: 0,
            server: ServerStats::default(),
            busy_in_schedule_ns: 0,
            p50_ms: 0.0,
            p99_ms: 0.0,
            events: 0,
            peak_events: 0,
            peak_ops: 0,
            real_secs: 0.0,
            setup_secs: 0.0,
            seconds: Vec::new(),
        }
    }

    /// The counters now, with the server's as `server` has them (the report's own copy is
    /// taken at the end of the run) and `concurrency_limit` as given.
    pub(crate) fn counters(
        &self,
        server: &ServerStats,
        concurrency_limit: Option<u64>,
    ) -> SecondCounters {
        SecondCounters {
            requests: self.requests,
            success: self.success,
            deadline: self.deadline,
            first_attempts: self.first_attempts,
            retries: self.retries,
            server_rejected: server.rejected,
            server_admitted: server.admitted,
            server_completed: server.completed,
            server_expired: server.expired,
            server_busy_ns: server.busy_ns,
            server_handoffs: server.handoffs,
            server_completed_wait_ns: server.completed_waits.ns,
            server_completed_run_ns: server.completed_runs.ns,
            slot_waits: self.slot_waits,
            unsent: self.unsent,
            ticket_wakeups: server.ticket_wakeups,
            ticket_races_lost: server.ticket_races_lost,
            concurrency_limit,
        }
    }

    pub(crate) fn count(&mut self, outcome: Outcome, phase: usize) {
        match outcome {
            Outcome::Success => {
                self.success += 1;
                if let Some(p) = self.phase_success.get_mut(phase) {
                    *p += 1;
                }
            }
            Outcome::Rejected => self.rejected += 1,
            Outcome::LocalRejection => self.local += 1,
            Outcome::Deadline => self.deadline += 1,
        }
    }

    /// The schedule's length (s).
    pub fn secs(&self) -> f64 {
        self.phase_secs.iter().sum()
    }

    /// Requests that ended, by any outcome.
    pub fn ended(&self) -> u64 {
        self.success + self.rejected + self.local + self.deadline
    }

    /// Successes within the deadline per second of the schedule.
    pub fn goodput(&self) -> f64 {
        ratio(self.success as f64, self.secs())
    }

    /// Successes within the deadline of the cold-shard requests per second of the schedule
    /// (the lab's cold-shard goodput; 0 on one server).
    pub fn cold_goodput(&self) -> f64 {
        ratio(self.cold_success as f64, self.secs())
    }

    /// Goodput ÷ capacity.
    pub fn goodput_share(&self) -> f64 {
        ratio(self.goodput(), self.capacity)
    }

    /// Goodput of the requests that arrived in the burst phase ÷ capacity.
    pub fn burst_share(&self) -> Option<f64> {
        let b = self.burst?;
        let secs = *self.phase_secs.get(b)?;
        Some(ratio(
            ratio(*self.phase_success.get(b)? as f64, secs),
            self.capacity,
        ))
    }

    /// Successes ÷ requests.
    pub fn success_share(&self) -> f64 {
        ratio(self.success as f64, self.requests as f64)
    }

    /// Attempts sent ÷ requests (locally rejected requests sent none, as in the lab).
    pub fn attempts_per_request(&self) -> f64 {
        ratio(
            (self.first_attempts + self.retries) as f64,
            self.requests as f64,
        )
    }

    /// Retries ÷ first attempts sent.
    pub fn retries_per_first(&self) -> f64 {
        ratio(self.retries as f64, self.first_attempts as f64)
    }

    /// Attempts the server rejected (462) ÷ attempts it received.
    pub fn rejected_share(&self) -> f64 {
        ratio(self.server.rejected as f64, self.server.attempts as f64)
    }

    /// Local rejections ÷ requests.
    pub fn local_share(&self) -> f64 {
        ratio(self.local_rejections as f64, self.requests as f64)
    }

    /// Requests that ended without an attempt sent ÷ requests.
    pub fn unsent_share(&self) -> f64 {
        ratio(self.unsent as f64, self.requests as f64)
    }

    /// Core time used during the schedule ÷ the cores' time.
    pub fn utilization(&self) -> f64 {
        ratio(
            self.busy_in_schedule_ns as f64,
            f64::from(self.cores) * self.secs() * 1e9,
        )
    }

    /// Core time spent rejecting ÷ all core time (the lab's `rejecting %`).
    pub fn rejecting_share(&self) -> f64 {
        ratio(self.server.rejection_ns as f64, self.server.busy_ns as f64)
    }

    /// Wasted core time ÷ all core time (the lab's `wasted %`).
    pub fn wasted_share(&self) -> f64 {
        ratio(self.server.wasted_ns as f64, self.server.busy_ns as f64)
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// The header of [`table`].
pub const HEADER: &str = "| scenario | variant | clients | goodput ops/s | goodput ÷ cap | burst ÷ cap | success % | attempts/req | retries/first | budget-refused/req | gate-declined/req | server-rejected % of attempts | local rej./req | unsent/req | p50 ms | p99 ms | utilization % | rejecting % (core) | wasted % (core) | real s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";

/// One row of [`table`].
pub fn row(r: &Report) -> String {
    format!(
        "| {} | {} | {} | {:.0} | {:.3} | {} | {:.2} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1} | {:.3} | {:.3} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} |\n",
        r.scenario,
        r.variant.name(),
        r.clients,
        r.goodput(),
        r.goodput_share(),
        r.burst_share().map_or("–".to_owned(), |b| format!("{b:.3}")),
        100.0 * r.success_share(),
        r.attempts_per_request(),
        r.retries_per_first(),
        ratio(r.budget_refusals as f64, r.requests as f64),
        ratio(
            (r.cannot_finish + r.backoff_past_deadline) as f64,
            r.requests as f64,
        ),
        100.0 * r.rejected_share(),
        r.local_share(),
        r.unsent_share(),
        r.p50_ms,
        r.p99_ms,
        100.0 * r.utilization(),
        100.0 * r.rejecting_share(),
        100.0 * r.wasted_share(),
        r.real_secs,
    )
}

/// The markdown table of `reports`, one row each.
pub fn table(reports: &[Report]) -> String {
    let mut out = String::from(HEADER);
    for r in reports {
        let _ = write!(out, "{}", row(r));
    }
    out
}
