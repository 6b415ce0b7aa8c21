//! Admission control: whether an operation's first attempt may be sent to a server at all, and
//! how many of a client's operations may be in flight on one server at once.
//!
//! # Why admission control, when there are retry budgets and deadlines?
//!
//! The retry budget ([`crate::budget`]) bounds what the driver *adds* to an overloaded server,
//! and `timeoutMS` ([`crate::deadline`]) stops an operation that can no longer finish in time.
//! Neither touches the first attempts, and two kinds of overload are made of first attempts:
//!
//! - **A flood** of more requests than the server can take, with its ingress rate limiter on:
//!   the server answers most of them with a rejection (code 462), and rejecting costs it core
//!   time too. Without retries, a client at four times the server's capacity still makes the
//!   server reject three requests for each one it serves.
//! - **Overload without errors.** mongod's ingress rate limiter is off by default; a server
//!   without it shows overload only as queueing (tickets, then the connection backlog). No
//!   error arrives, so the backpressure specification's retries never trigger, while requests
//!   wait past their deadlines and the server works on requests nobody waits for any more.
//!
//! Two policies answer them, one per signal:
//!
//! - [`AdaptiveThrottle`] (the Google SRE book's client-side adaptive throttling) reads the
//!   server's explicit rejections. When fewer than `1/K` of recent requests were accepted, it
//!   rejects new first attempts locally, without sending them, so the server receives about
//!   `K` requests per request it serves instead of all of them.
//! - [`ConcurrencyLimit`] (a gradient limit after Netflix's concurrency-limits and Envoy's
//!   adaptive concurrency filter) reads latency. It caps the operations in flight on a server
//!   below `maxPoolSize`, lowering the cap when latency climbs above the server's measured
//!   no-load latency (queueing) and on overload errors, and raising it while latency stays low.
//!
//! # Per server, not per client
//!
//! Both policies keep their state **per server**: the driver holds one [`AdaptiveThrottle`] and
//! one [`ConcurrencyLimit`] for each server it talks to. An overloaded replica-set member (a hot
//! shard, a secondary serving a heavy read) must not make the client refuse or queue operations
//! bound for members that are healthy, and a member's latency says nothing about another's. The
//! types themselves know nothing of servers: one instance is one key's state, and the caller
//! chooses the key. (The open specification tickets DRIVERS-3462 and DRIVERS-3465 propose per
//! server token buckets for the same reason: "overload on a single node drains a global
//! per-client token bucket".)
//!
//! # What the driver does with them
//!
//! This module holds the decisions only. The driver (`src/fork/admission.rs` in the admission
//! control patch):
//!
//! 1. before an operation's first attempt, once a server is selected, asks that server's
//!    throttle; a local rejection fails the operation with its own error kind, which still
//!    carries the `SystemOverloadedError` label (so code that checks for overload recognises
//!    it) but not `RetryableError` (so the driver's own loop never retries it);
//! 2. takes a slot from that server's concurrency limit; when none is free it waits (for a slot
//!    to be released, or the deadline: `timeoutMS` when set, else `serverSelectionTimeoutMS`), and
//!    server selection prefers, among suitable servers, those with a free slot;
//! 3. after the attempt, tells the throttle whether the server rejected it for overload, and
//!    releases the slot with the attempt's outcome and latency. A slot is a guard: an operation
//!    whose future is dropped releases it too.
//!
//! `docs/admission.md` has the parameters, the defaults with their reasons, and what is left.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use overload::admission::{
//!     AdaptiveThrottle, ConcurrencyConfig, ConcurrencyLimit, Outcome, ThrottleConfig,
//!     ThrottleDecision,
//! };
//!
//! let start = Instant::now();
//! let throttle = AdaptiveThrottle::starting_at(ThrottleConfig::default(), start).unwrap();
//! let limit = ConcurrencyLimit::starting_at(ConcurrencyConfig::default(), start, Instant::now)
//!     .unwrap();
//!
//! // One first attempt: admitted by the throttle (nothing was rejected recently), given a slot.
//! let mut draw = || 0.5; // the driver passes `overload::backoff::RandomJitter`
//! assert_eq!(throttle.admit(start, &mut draw), ThrottleDecision::Send);
//! let permit = limit.try_acquire(start).expect("a fresh limit has free slots");
//! assert_eq!(limit.in_flight(), 1);
//! // The server answered in 3 ms.
//! permit.release(start + Duration::from_millis(3), Outcome::Answered(Duration::from_millis(3)));
//! assert_eq!(limit.in_flight(), 0);
//! ```

pub mod client_lag;
pub mod concurrency;
pub mod throttle;

use std::fmt;

pub use client_lag::{ClientLag, CLIENT_LAG_PERIOD};
pub use concurrency::{
    ConcurrencyConfig, ConcurrencyLimit, ConcurrencyPermit, ConcurrencySnapshot, Outcome,
};
pub use throttle::{AdaptiveThrottle, ThrottleConfig, ThrottleCounts, ThrottleDecision};

/// Whether the adaptive throttle decides first attempts of the command `name`: every command
/// that starts new work; not the continuations of admitted work
/// ([`crate::control::EXEMPT_COMMANDS`], the same list `timeoutMS` leaves out). (The driver also
/// exempts operations inside a transaction, for the same reason.)
pub fn throttles_command(name: &str) -> bool {
    !crate::control::is_exempt(name)
}

/// An admission-control option out of its range. Its message names the connection-string
/// option, the value given and the valid range. The option names are provisional until the
/// driver wiring adds them to the connection string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidAdmissionConfig {
    option: &'static str,
    value: String,
    range: &'static str,
}

impl InvalidAdmissionConfig {
    fn new(option: &'static str, value: impl fmt::Display, range: &'static str) -> Self {
        Self {
            option,
            value: value.to_string(),
            range,
        }
    }

    /// The connection-string name of the option, e.g. `adaptiveThrottleK`.
    pub fn option(&self) -> &'static str {
        self.option
    }
}

impl fmt::Display for InvalidAdmissionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid {}: {} is not {}",
            self.option, self.value, self.range
        )
    }
}

impl std::error::Error for InvalidAdmissionConfig {}

#[cfg(test)]
mod tests {
    use super::throttles_command;

    #[test]
    fn continuations_of_admitted_work_are_never_throttled() {
        for name in [
            "getMore",
            "killCursors",
            "commitTransaction",
            "abortTransaction",
        ] {
            assert!(!throttles_command(name), "{name}");
        }
        for name in [
            "find",
            "insert",
            "aggregate",
            "bulkWrite",
            "ping",
            "GETMORE",
        ] {
            assert!(throttles_command(name), "{name}");
        }
    }
}

/// Compiles and runs the examples in `docs/admission.md` as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/admission.md")]
pub struct AdmissionGuide;
