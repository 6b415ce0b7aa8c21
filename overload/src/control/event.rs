//! The controller's decisions as one event type, and where each is published: the
//! `mongodb::overload` tracing target ([`crate::trace`]), the client's statistics (and through
//! them the `metrics` feature's counters), and an optional observer the driver installs (for
//! its OpenTelemetry spans, say).

use std::time::Duration;

use crate::stats::OverloadStatsRecorder;
use crate::trace::RetryAttempt;

/// Hears every decision of a controller, after the log and the statistics.
pub type Observer = Box<dyn Fn(&Decision<'_>) + Send + Sync>;

/// Why a retry was not sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The retry cap is used up.
    Exhausted,
    /// The backoff would end at or past the deadline.
    BackoffPastDeadline,
    /// The backoff plus the server's typical service time would pass the deadline.
    CannotFinish,
    /// The retry budget refused it.
    Budget,
    /// The deadline has passed (the operation ends with a timeout error).
    DeadlinePassed,
    /// The failure is not one this retry path may retry.
    NotRetryable,
}

impl Refusal {
    /// The reason as the log states it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exhausted => "retry cap reached",
            Self::BackoffPastDeadline => "backoff would pass the deadline",
            Self::CannotFinish => "backoff plus typical service time would pass the deadline",
            Self::Budget => "retry budget exhausted",
            Self::DeadlinePassed => "deadline passed",
            Self::NotRetryable => "not retryable here",
        }
    }

    /// Whether the operation's deadline made the refusal.
    pub fn is_deadline(self) -> bool {
        matches!(
            self,
            Self::BackoffPastDeadline | Self::CannotFinish | Self::DeadlinePassed
        )
    }
}

/// One decision of the controller.
#[derive(Clone, Copy, Debug)]
pub enum Decision<'a> {
    /// A retry is about to be made.
    Retry(RetryAttempt<'a>),
    /// A retry was not made.
    RetryRefused {
        operation: &'a str,
        reason: Refusal,
        /// The time left of the deadline, when there is one.
        remaining: Option<Duration>,
    },
    /// The throttle rejected a first attempt without sending it.
    LocalRejection {
        operation: &'a str,
        server: &'a str,
        probability: f64,
    },
    /// A wait for a concurrency slot ended, with a slot (`acquired`) or without.
    SlotWaitEnded {
        operation: &'a str,
        server: &'a str,
        waited: Duration,
        acquired: bool,
        limit: u32,
    },
    /// A wait for a concurrency slot ended because the server changed (its pool was cleared,
    /// or its role changed): the attempt goes back to server selection.
    SlotWaitAbandoned {
        operation: &'a str,
        server: &'a str,
        waited: Duration,
    },
    /// A server's concurrency limit changed.
    LimitChanged { server: &'a str, from: u32, to: u32 },
}

impl Decision<'_> {
    /// The decision's kind, as the `metrics` feature labels it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Retry(_) => "retry",
            Self::RetryRefused { .. } => "retry_refused",
            Self::LocalRejection { .. } => "local_rejection",
            Self::SlotWaitEnded { .. } => "slot_wait_ended",
            Self::SlotWaitAbandoned { .. } => "slot_wait_abandoned",
            Self::LimitChanged { .. } => "limit_changed",
        }
    }
}

/// Publishes `decision` to the log, to `stats`, and (with the `metrics` feature) to the
/// decision counter.
pub(crate) fn publish(decision: &Decision<'_>, stats: &OverloadStatsRecorder) {
    #[cfg(feature = "metrics")]
    {
        let reason = match *decision {
            Decision::RetryRefused { reason, .. } => reason.as_str(),
            _ => "",
        };
        metrics::counter!(
            crate::stats::METRIC_DECISIONS,
            "decision" => decision.kind(),
            "reason" => reason
        )
        .increment(1);
    }
    match *decision {
        Decision::Retry(ref attempt) => crate::trace::retry_attempt(attempt),
        Decision::RetryRefused {
            operation,
            reason,
            remaining,
        } => {
            // The budget logs its own refusals, and a retry cap ends the loop as upstream's
            // does: only the deadline's refusals are this event's to log.
            if reason.is_deadline() {
                crate::trace::retry_refused(operation, reason.as_str(), remaining);
            }
        }
        Decision::LocalRejection {
            operation,
            server,
            probability,
        } => {
            stats.record_local_rejection();
            crate::trace::local_rejection(operation, server, probability);
        }
        Decision::SlotWaitEnded {
            operation,
            server,
            waited,
            acquired,
            limit,
        } => {
            stats.record_concurrency_wait(!acquired);
            crate::trace::concurrency_wait(operation, server, waited, acquired, limit);
        }
        Decision::SlotWaitAbandoned {
            operation,
            server,
            waited,
        } => {
            stats.record_concurrency_reselection();
            crate::trace::concurrency_wait_abandoned(operation, server, waited);
        }
        Decision::LimitChanged { server, from, to } => {
            crate::trace::concurrency_limit_changed(server, from, to);
        }
    }
}
