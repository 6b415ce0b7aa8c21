//! `timeoutMS` for sessions and transactions (the CSOT specification's stage 3): which timeout
//! a session's own commands get, and what bounds the convenient transaction API.
//!
//! - **A session's commands** (`commitTransaction`, `abortTransaction`, the abort a dropped
//!   session sends, `withTransaction` as a whole) take the call's own `timeoutMS`, else the
//!   session's `defaultTimeoutMS`, else the client's ([`session_timeout`]). They never take a
//!   database's or collection's: they belong to no collection.
//! - **`withTransaction`** ([`ConvenientLimit`]): without `timeoutMS` the driver keeps the
//!   specification's fixed 120 seconds, measured from the start and never sent to the server.
//!   With it, one deadline bounds the whole call: each statement of the callback that runs on
//!   the session gets what remains (and may not set its own timeout, [`ConvenientLimit::statement`]),
//!   the commit gets what remains, a retry is started only if its backoff ends before the
//!   deadline, and the abort after a failed callback gets `timeoutMS` afresh, since its point is
//!   to release the transaction's locks on the server.

use std::fmt;
use std::time::{Duration, Instant};

use crate::deadline::{Deadline, Expired};

/// The fixed limit of `withTransaction` without `timeoutMS` (the convenient transaction API
/// specification's 120 seconds).
pub const CONVENIENT_TRANSACTION_TIME: Duration = Duration::from_secs(120);

/// The `timeoutMS` of a session's own command: the call's own (`own`), else the session's
/// default (`session`), else the client's (`client`); `None` when none is set.
pub fn session_timeout(
    own: Option<Duration>,
    session: Option<Duration>,
    client: Option<Duration>,
) -> Option<Duration> {
    own.or(session).or(client)
}

/// A statement of a `withTransaction` callback set its own `timeoutMS`: the specification makes
/// that a client error, since the callback's statements share the call's one deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeoutOverriddenInTransaction;

impl fmt::Display for TimeoutOverriddenInTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "timeoutMS cannot be set on an operation inside withTransaction: the callback's \
             operations share the withTransaction call's deadline",
        )
    }
}

impl std::error::Error for TimeoutOverriddenInTransaction {}

/// What bounds one `withTransaction` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvenientLimit {
    /// No `timeoutMS`: the fixed [`CONVENIENT_TRANSACTION_TIME`] from `started`.
    Fixed { started: Instant },
    /// `timeoutMS` (the call's `timeout`): one deadline for the whole call.
    Deadline {
        deadline: Deadline,
        timeout: Duration,
    },
}

impl ConvenientLimit {
    /// The limit of a call starting at `now` with `timeout`, the [`session_timeout`] in force.
    pub fn start(timeout: Option<Duration>, now: Instant) -> Self {
        match timeout {
            None => Self::Fixed { started: now },
            Some(timeout) => Self::Deadline {
                deadline: Deadline::start(now, timeout),
                timeout,
            },
        }
    }

    /// Whether a new attempt whose backoff starts at `now` still fits: its backoff must end
    /// before the limit.
    pub fn fits_retry(&self, backoff: Duration, now: Instant) -> bool {
        match *self {
            Self::Fixed { started } => {
                now.saturating_duration_since(started)
                    .saturating_add(backoff)
                    < CONVENIENT_TRANSACTION_TIME
            }
            Self::Deadline { deadline, .. } => match now.checked_add(backoff) {
                Some(end) => !deadline.expired(end),
                None => deadline.is_unlimited(),
            },
        }
    }

    /// Whether the limit has passed at `now` (a commit whose result is unknown is retried
    /// until then).
    pub fn expired(&self, now: Instant) -> bool {
        match *self {
            Self::Fixed { started } => {
                now.saturating_duration_since(started) >= CONVENIENT_TRANSACTION_TIME
            }
            Self::Deadline { deadline, .. } => deadline.expired(now),
        }
    }

    /// Whether the limit is `timeoutMS` (its expiry is then the timeout error, not the fixed
    /// limit's transaction error).
    pub fn is_timeout_ms(&self) -> bool {
        matches!(self, Self::Deadline { .. })
    }

    /// The deadline a statement of the callback runs under, if `timeoutMS` applies: the call's,
    /// shared by every statement. A statement that sets its own timeout (`own`) is refused.
    pub fn statement(
        &self,
        own: Option<Duration>,
    ) -> Result<Option<Deadline>, TimeoutOverriddenInTransaction> {
        match *self {
            Self::Fixed { .. } => Ok(None),
            Self::Deadline { .. } if own.is_some() => Err(TimeoutOverriddenInTransaction),
            Self::Deadline { deadline, .. } => Ok(Some(deadline)),
        }
    }

    /// The deadline of the commit at the end of the call: the call's.
    pub fn commit(&self) -> Option<Deadline> {
        match *self {
            Self::Fixed { .. } => None,
            Self::Deadline { deadline, .. } => Some(deadline),
        }
    }

    /// The `timeoutMS` of the abort after a failed callback: the call's `timeoutMS` afresh.
    pub fn abort_timeout(&self) -> Option<Duration> {
        match *self {
            Self::Fixed { .. } => None,
            Self::Deadline { timeout, .. } => Some(timeout),
        }
    }
}

/// The `timeoutMS` of a commit that set `own`, on a session whose own commands otherwise take
/// `session` ([`session_timeout`] without a call's own): inside a convenient transaction
/// (`convenient`), what remains of its deadline ([`Expired`] when nothing does), since the
/// commit is part of the call.
pub fn commit_timeout(
    own: Option<Duration>,
    convenient: Option<&ConvenientLimit>,
    session: Option<Duration>,
    now: Instant,
) -> Result<Option<Duration>, Expired> {
    if own.is_none() {
        if let Some(deadline) = convenient.and_then(ConvenientLimit::commit) {
            return crate::cursor::remaining_timeout(deadline, now).map(Some);
        }
    }
    Ok(own.or(session))
}

/// The `timeoutMS` of an abort that set `own`: inside a convenient transaction its
/// `timeoutMS` afresh (the abort releases the transaction's locks), else the session's.
pub fn abort_timeout(
    own: Option<Duration>,
    convenient: Option<&ConvenientLimit>,
    session: Option<Duration>,
) -> Option<Duration> {
    own.or_else(|| convenient.and_then(ConvenientLimit::abort_timeout))
        .or(session)
}

/// The deadline of command `command`, which set `own`, run on a session with a convenient
/// transaction in progress (`convenient`): the transaction's, shared by its statements; none
/// from it for the commands that continue or end work ([`crate::control::is_exempt`]: the
/// commit and abort get theirs above).
pub fn statement_deadline(
    convenient: Option<&ConvenientLimit>,
    command: &str,
    own: Option<Duration>,
) -> Result<Option<Deadline>, TimeoutOverriddenInTransaction> {
    match convenient {
        Some(limit) if !crate::control::is_exempt(command) => limit.statement(own),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn a_session_command_takes_its_own_then_the_session_then_the_client_timeout() {
        assert_eq!(
            session_timeout(Some(ms(1)), Some(ms(2)), Some(ms(3))),
            Some(ms(1))
        );
        assert_eq!(session_timeout(None, Some(ms(2)), Some(ms(3))), Some(ms(2)));
        assert_eq!(session_timeout(None, None, Some(ms(3))), Some(ms(3)));
        assert_eq!(session_timeout(None, None, None), None);
        assert_eq!(session_timeout(Some(ms(0)), None, Some(ms(3))), Some(ms(0)));
    }

    #[test]
    fn without_timeout_ms_the_fixed_120_seconds_apply() {
        let t0 = Instant::now();
        let limit = ConvenientLimit::start(None, t0);
        assert!(!limit.is_timeout_ms());
        assert!(limit.fits_retry(ms(500), t0 + Duration::from_secs(119)));
        assert!(!limit.fits_retry(ms(1_000), t0 + Duration::from_secs(119)));
        assert!(!limit.expired(t0 + Duration::from_secs(119)));
        assert!(limit.expired(t0 + CONVENIENT_TRANSACTION_TIME));
        assert_eq!(
            limit.statement(Some(ms(5))),
            Ok(None),
            "no deadline to share"
        );
        assert_eq!(limit.commit(), None);
        assert_eq!(limit.abort_timeout(), None);
    }

    #[test]
    fn with_timeout_ms_one_deadline_bounds_the_call_and_the_abort_gets_it_afresh() {
        let t0 = Instant::now();
        let limit = ConvenientLimit::start(Some(ms(500)), t0);
        let deadline = Deadline::at(t0 + ms(500));
        assert!(limit.is_timeout_ms());
        assert!(limit.fits_retry(ms(100), t0 + ms(399)));
        assert!(!limit.fits_retry(ms(100), t0 + ms(400)));
        assert!(limit.expired(t0 + ms(500)));
        // Far beyond the fixed limit's reach: timeoutMS replaces it, it does not add to it.
        assert!(!ConvenientLimit::start(Some(Duration::from_secs(600)), t0)
            .expired(t0 + Duration::from_secs(300)));
        assert_eq!(limit.statement(None), Ok(Some(deadline)));
        assert_eq!(
            limit.statement(Some(ms(100))),
            Err(TimeoutOverriddenInTransaction)
        );
        assert_eq!(limit.commit(), Some(deadline));
        assert_eq!(limit.abort_timeout(), Some(ms(500)));
    }

    #[test]
    fn commit_abort_and_statements_inside_and_outside_a_convenient_transaction() {
        let t0 = Instant::now();
        let limit = ConvenientLimit::start(Some(ms(500)), t0);
        let session = Some(ms(900));
        // Outside: their own, else the session's.
        assert_eq!(commit_timeout(None, None, session, t0), Ok(session));
        assert_eq!(
            commit_timeout(Some(ms(7)), None, session, t0),
            Ok(Some(ms(7)))
        );
        assert_eq!(abort_timeout(None, None, session), session);
        assert_eq!(statement_deadline(None, "insert", Some(ms(5))), Ok(None));
        // Inside: the commit gets what remains, the abort timeoutMS afresh.
        assert_eq!(
            commit_timeout(None, Some(&limit), session, t0 + ms(200)),
            Ok(Some(ms(300)))
        );
        assert_eq!(
            commit_timeout(None, Some(&limit), session, t0 + ms(500)),
            Err(Expired)
        );
        assert_eq!(abort_timeout(None, Some(&limit), session), Some(ms(500)));
        assert_eq!(
            abort_timeout(Some(ms(3)), Some(&limit), session),
            Some(ms(3))
        );
        assert_eq!(
            statement_deadline(Some(&limit), "insert", None),
            Ok(Some(Deadline::at(t0 + ms(500))))
        );
        assert_eq!(
            statement_deadline(Some(&limit), "insert", Some(ms(5))),
            Err(TimeoutOverriddenInTransaction)
        );
        assert_eq!(
            statement_deadline(Some(&limit), "commitTransaction", Some(ms(5))),
            Ok(None)
        );
        // The fixed limit shares nothing.
        let fixed = ConvenientLimit::start(None, t0);
        assert_eq!(commit_timeout(None, Some(&fixed), session, t0), Ok(session));
        assert_eq!(abort_timeout(None, Some(&fixed), session), session);
    }

    #[test]
    fn an_unlimited_timeout_never_ends_the_call() {
        let t0 = Instant::now();
        let limit = ConvenientLimit::start(Some(Duration::ZERO), t0);
        let late = t0 + Duration::from_secs(3_600);
        assert!(limit.fits_retry(ms(500), late));
        assert!(!limit.expired(late));
        assert_eq!(limit.abort_timeout(), Some(Duration::ZERO));
    }
}
