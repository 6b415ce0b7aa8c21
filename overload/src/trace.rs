//! Tracing events of the fork's overload handling, all under one target so they can be enabled
//! alone: `RUST_LOG=mongodb::overload=debug`.
//!
//! The driver's own tracing sits behind its `tracing-unstable` feature; these events do not, so
//! an operator can see retries and ignored server hints in any build.

use crate::backoff::InvalidServerBase;
use crate::deadline::Admission;

/// The tracing target of every event in this module.
pub const TARGET: &str = "mongodb::overload";

/// A server sent a `baseBackoffMS` the driver will not use; the default base applies instead.
/// Logged at WARN: it means a server (or something in between) is sending malformed errors.
pub fn ignored_base_backoff(why: &InvalidServerBase) {
    tracing::warn!(target: TARGET, reason = %why, "ignoring the server's baseBackoffMS");
}

/// One retry the driver is about to make.
#[derive(Clone, Copy, Debug)]
pub struct RetryAttempt<'a> {
    /// The command name, e.g. `find`.
    pub operation: &'a str,
    /// The retry's number: 1 for the first retry.
    pub attempt: u32,
    /// The most retries this operation may make (it can rise to `maxAdaptiveRetries` once an
    /// overload error is seen).
    pub max_retries: u32,
    /// The server whose failure caused the retry, as `host:port`.
    pub server: &'a str,
    /// The failure's server error code, when it was a server error.
    pub error_code: Option<i32>,
    /// The failure's error labels, in any order: the event lists them sorted, so log lines of
    /// the same failure compare equal although label sets have no order.
    pub error_labels: &'a [&'a str],
    /// The backoff before the retry; `None` when the failure was not an overload error, which
    /// the specification retries without backoff.
    pub backoff: Option<std::time::Duration>,
}

/// Logs a retry at DEBUG: under overload there is one per retried request, too many for INFO.
pub fn retry_attempt(event: &RetryAttempt<'_>) {
    let mut labels = event.error_labels.to_vec();
    labels.sort_unstable();
    tracing::debug!(
        target: TARGET,
        operation = event.operation,
        attempt = event.attempt,
        maxRetries = event.max_retries,
        server = event.server,
        errorCode = event.error_code,
        errorLabels = ?labels,
        backoffMS = event.backoff.map(|b| b.as_secs_f64() * 1000.0),
        "retrying operation"
    );
}

/// Logs, at DEBUG, a retry the operation's `timeoutMS` deadline stopped: `admission` is what
/// [`crate::retry::RetryState::admit`] decided (anything but a retry, or a decline for the retry
/// cap, which upstream's loop reports by returning the error), `remaining` the time left.
pub fn retry_stopped_by_deadline(
    operation: &str,
    admission: Admission,
    remaining: Option<std::time::Duration>,
) {
    let reason = match admission {
        Admission::Expired => "deadline passed",
        Admission::Decline(crate::deadline::Declined::BackoffPastDeadline) => {
            "backoff would pass the deadline"
        }
        Admission::Decline(crate::deadline::Declined::CannotFinish) => {
            "backoff plus typical service time would pass the deadline"
        }
        Admission::Decline(crate::deadline::Declined::Exhausted) | Admission::Retry(_) => return,
    };
    retry_refused(operation, reason, remaining);
}

/// Logs, at DEBUG, a retry that was not made, with the `reason` and the time left of the
/// operation's deadline (`remaining`, when it has one).
pub fn retry_refused(operation: &str, reason: &str, remaining: Option<std::time::Duration>) {
    tracing::debug!(
        target: TARGET,
        operation,
        reason,
        remainingMS = remaining.map(|r| r.as_secs_f64() * 1000.0),
        "not retrying operation"
    );
}

/// Logs, at DEBUG, a first attempt the adaptive throttle rejected without sending it:
/// `probability` is the rejection probability it drew against, `server` the server as
/// `host:port`.
pub fn local_rejection(operation: &str, server: &str, probability: f64) {
    tracing::debug!(
        target: TARGET,
        operation,
        server,
        probability,
        "rejecting operation locally: the server is rejecting most requests for overload"
    );
}

/// Logs, at DEBUG, the end of an operation's wait for a concurrency slot on `server`: after
/// `waited`, with a slot (`acquired`) or at its deadline; `limit` is the server's limit then.
pub fn concurrency_wait(
    operation: &str,
    server: &str,
    waited: std::time::Duration,
    acquired: bool,
    limit: u32,
) {
    tracing::debug!(
        target: TARGET,
        operation,
        server,
        waitedMS = waited.as_secs_f64() * 1000.0,
        acquired,
        limit,
        "concurrency slot wait ended"
    );
}

/// Logs, at DEBUG, the end of an operation's wait for a concurrency slot on `server` after
/// `waited` because the server changed (pool cleared, or a new role): it selects again.
pub fn concurrency_wait_abandoned(operation: &str, server: &str, waited: std::time::Duration) {
    tracing::debug!(
        target: TARGET,
        operation,
        server,
        waitedMS = waited.as_secs_f64() * 1000.0,
        "concurrency slot wait abandoned: the server changed, selecting again"
    );
}

/// Logs, at DEBUG, a change of `server`'s concurrency limit (the limit in force, a whole number
/// of operations) from `from` to `to`.
pub fn concurrency_limit_changed(server: &str, from: u32, to: u32) {
    tracing::debug!(
        target: TARGET,
        server,
        from,
        to,
        "concurrency limit changed"
    );
}

/// Whether [`retry_attempt`] events would be recorded, so callers can skip assembling them.
pub fn retry_attempts_enabled() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
}

/// Captures what tracing events format, for the crate's tests of its log events.
#[cfg(test)]
pub(crate) mod capture {
    use std::io;
    use std::sync::{Arc, Mutex};

    /// Runs `f` with a subscriber that keeps what it formats, at `level`, and returns the text.
    pub(crate) fn captured(level: tracing::Level, f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = buffer.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::capture::captured;
    use super::*;

    fn sample_attempt<'a>(labels: &'a [&'a str]) -> RetryAttempt<'a> {
        RetryAttempt {
            operation: "find",
            attempt: 2,
            max_retries: 2,
            server: "db1.example:27017",
            error_code: Some(462),
            error_labels: labels,
            backoff: Some(Duration::from_millis(150)),
        }
    }

    #[test]
    fn retry_attempt_names_everything_an_operator_needs() {
        let labels = ["RetryableError", "SystemOverloadedError"];
        let text = captured(tracing::Level::DEBUG, || {
            assert!(retry_attempts_enabled());
            retry_attempt(&sample_attempt(&labels));
        });
        for needle in [
            "mongodb::overload",
            "retrying operation",
            "operation=\"find\"",
            "attempt=2",
            "maxRetries=2",
            "server=\"db1.example:27017\"",
            "errorCode=462",
            "SystemOverloadedError",
            "backoffMS=150",
        ] {
            assert!(text.contains(needle), "missing {needle} in {text}");
        }
    }

    #[test]
    fn labels_are_listed_sorted_whatever_their_order() {
        let unsorted = [
            "SystemOverloadedError",
            "NoWritesPerformed",
            "RetryableError",
        ];
        let text = captured(tracing::Level::DEBUG, || {
            retry_attempt(&sample_attempt(&unsorted))
        });
        assert!(
            text.contains(
                r#"errorLabels=["NoWritesPerformed", "RetryableError", "SystemOverloadedError"]"#
            ),
            "{text}"
        );
    }

    #[test]
    fn admission_events_name_the_server_and_what_was_decided() {
        let text = captured(tracing::Level::DEBUG, || {
            local_rejection("find", "db1.example:27017", 0.6);
            concurrency_wait(
                "insert",
                "db2.example:27017",
                Duration::from_millis(40),
                false,
                7,
            );
            concurrency_limit_changed("db2.example:27017", 8, 7);
        });
        for needle in [
            "rejecting operation locally",
            "operation=\"find\"",
            "server=\"db1.example:27017\"",
            "probability=0.6",
            "concurrency slot wait ended",
            "waitedMS=40",
            "acquired=false",
            "limit=7",
            "concurrency limit changed",
            "from=8",
            "to=7",
        ] {
            assert!(text.contains(needle), "missing {needle} in {text}");
        }
        let at_info = captured(tracing::Level::INFO, || {
            local_rejection("find", "db1.example:27017", 0.6);
        });
        assert!(at_info.is_empty(), "{at_info}");
    }

    #[test]
    fn retry_attempts_are_debug_level() {
        // The same event, emitted for real: one line at DEBUG, nothing when only INFO is on.
        let labels = ["SystemOverloadedError"];
        let at_debug = captured(tracing::Level::DEBUG, || {
            retry_attempt(&sample_attempt(&labels))
        });
        assert_eq!(
            at_debug.matches("retrying operation").count(),
            1,
            "{at_debug}"
        );
        assert!(at_debug.contains("DEBUG"), "{at_debug}");
        let at_info = captured(tracing::Level::INFO, || {
            assert!(!retry_attempts_enabled());
            retry_attempt(&sample_attempt(&labels));
        });
        assert_eq!(at_info, "", "a DEBUG event leaked at INFO");
    }

    #[test]
    fn stopped_retries_name_the_reason_and_admitted_ones_log_nothing() {
        use crate::deadline::Declined;
        let text = captured(tracing::Level::DEBUG, || {
            let remaining = Some(Duration::from_millis(40));
            retry_stopped_by_deadline(
                "find",
                Admission::Decline(Declined::CannotFinish),
                remaining,
            );
            retry_stopped_by_deadline("find", Admission::Retry(Duration::ZERO), remaining);
            retry_stopped_by_deadline("find", Admission::Decline(Declined::Exhausted), remaining);
        });
        assert_eq!(text.matches("not retrying operation").count(), 1, "{text}");
        assert!(
            text.contains("typical service time") && text.contains("remainingMS=40"),
            "{text}"
        );
    }

    #[test]
    fn ignored_base_backoff_warns_with_the_reason() {
        let text = captured(tracing::Level::WARN, || {
            ignored_base_backoff(&InvalidServerBase::NotPositive(-1.0))
        });
        assert!(
            text.contains("WARN") && text.contains("baseBackoffMS -1 is not positive"),
            "{text}"
        );
    }
}
