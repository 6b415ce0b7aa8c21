//! How often one operation may be retried, and how long it waits before each retry.
//!
//! The driver has two retry paths: the executor's loop, which selects a server for every
//! attempt, and the in-place retry of a command that must stay on one pinned connection (the
//! getMore on a client bulkWrite's results in load-balanced mode). Both keep a [`RetryState`]
//! per operation and ask it the same questions, so the cap and the backoff cannot drift apart
//! between them.
//!
//! The rules, from the Retryable Reads, Retryable Writes and Client Backpressure
//! specifications:
//!
//! - an operation that failed with an ordinary retryable error is retried once;
//! - once any failure of the operation carried `SystemOverloadedError`, it may be retried up to
//!   `maxAdaptiveRetries` times in all (default 2), and that cap stays for the rest of the
//!   operation even if later failures are not overload errors;
//! - a retry after an overload error first waits [`Backoff::delay`] for its retry number, with
//!   the `baseBackoffMS` of that failure, if valid, as the base.
//!
//! - with `timeoutMS` ([`RetryState::with_deadline`]), ordinary retryable errors are retried
//!   without a count limit while time remains (the CSOT specification), the overload cap still
//!   applies once an overload error is seen, and [`RetryState::admit`] declines a retry whose
//!   backoff, or backoff plus the server's typical service time, does not fit in the time left.
//!
//! Whether a given failure may be retried at all (the command's retryability, the labels, the
//! `retryReads`/`retryWrites` options) is the caller's decision; the state counts the failures
//! the caller chose to retry. It reads no clock and draws no randomness: the caller sleeps the
//! returned delay and passes in the jitter source.
//!
//! ```
//! use overload::labels::Overload;
//! use overload::retry::{Failure, RetryState};
//!
//! let mut state = RetryState::new(None);
//! state.record_failure(Failure::new(Overload::Retryable, None));
//! assert_eq!((state.retry_number(), state.max_retries()), (1, 2));
//! assert!(!state.exhausted());
//! state.record_failure(Failure::new(Overload::None, None));
//! state.record_failure(Failure::new(Overload::None, None));
//! assert!(state.exhausted(), "three failures: the first attempt and both retries");
//! ```

use std::time::Duration;

use std::time::Instant;

use crate::backoff::{Backoff, Jitter, ServerBaseBackoff};
use crate::deadline::{Admission, Deadline, Declined};
use crate::labels::Overload;

/// The specification's default for `maxAdaptiveRetries`: retries after overload errors, not
/// counting the first attempt.
pub const DEFAULT_MAX_ADAPTIVE_RETRIES: u32 = 2;

/// Retries allowed after ordinary retryable errors (Retryable Reads and Writes: one).
pub const MAX_ORDINARY_RETRIES: u32 = 1;

/// Ordinary retries allowed under `timeoutMS=0`. The CSOT specification retries as long as time
/// remains, which with no limit would never end against a server that keeps answering with a
/// retryable error; the fork bounds that loop. A limited deadline bounds it by time instead.
pub const MAX_ORDINARY_RETRIES_WITHOUT_A_LIMIT: u32 = 100;

/// One failed attempt, as far as the retry count and backoff care.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Failure {
    /// What the failure's labels say about overload.
    pub overload: Overload,
    /// The server's `baseBackoffMS`, when it sent a valid one.
    pub server_base: Option<ServerBaseBackoff>,
}

impl Failure {
    /// A failure with these labels and server base.
    pub fn new(overload: Overload, server_base: Option<ServerBaseBackoff>) -> Self {
        Self {
            overload,
            server_base,
        }
    }
}

/// Of the error an operation keeps so far (`earlier`) and the one its latest attempt met
/// (`later`), whether it keeps the earlier one as the error it would return if it stopped
/// retrying now. Each says whether a write may have happened before it (`*_may_have_written`);
/// `later_says_no_writes` is whether the later one carries the `NoWritesPerformed` label.
///
/// - An error after which no write can have happened never replaces one after which a write
///   may have (Retryable Writes: the application must learn that its write may have been
///   applied).
/// - When neither may have written and the later one says so with `NoWritesPerformed`, the
///   earlier is kept: every error so far says no write happened, and the specification returns
///   the first (defect B8; upstream returned the last).
/// - Otherwise the later error replaces the earlier.
pub fn keeps_earlier_error(
    earlier_may_have_written: bool,
    later_may_have_written: bool,
    later_says_no_writes: bool,
) -> bool {
    match (earlier_may_have_written, later_may_have_written) {
        (true, false) => true,
        (false, false) => later_says_no_writes,
        (_, true) => false,
    }
}

/// The retry accounting of one operation: how many failures it has had, how many retries it
/// may make, and the backoff before the next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryState {
    /// Failures recorded so far, which is also the number of the retry the last one calls for.
    /// Wider than the cap so that "more failures than the cap" stays representable at any cap.
    failures: u64,
    /// Retries allowed now: [`MAX_ORDINARY_RETRIES`] until an overload error is seen.
    max_retries: u32,
    /// `maxAdaptiveRetries`, which becomes the cap at the first overload error.
    max_adaptive_retries: u32,
    /// Whether any failure so far was an overload error.
    overload_seen: bool,
    /// The most recent failure.
    last: Failure,
    backoff: Backoff,
    /// The operation's `timeoutMS` deadline; `None` when `timeoutMS` does not apply.
    deadline: Option<Deadline>,
    /// The delay [`Self::admit`] checked against the deadline, with the failure count it was
    /// drawn for, so that [`Self::backoff`] returns the very delay that was found to fit
    /// rather than a fresh draw of the jitter.
    admitted_delay: Option<(u64, Duration)>,
    /// Retries of this operation the client's retry budget paid for, given back if it succeeds
    /// ([`crate::control::Controller::succeeded`]).
    budget_paid: u32,
}

impl RetryState {
    /// The state of an operation that has not failed yet; `max_adaptive_retries` is the
    /// client's `maxAdaptiveRetries` option (unset means the default 2).
    pub fn new(max_adaptive_retries: Option<u32>) -> Self {
        Self {
            failures: 0,
            max_retries: MAX_ORDINARY_RETRIES,
            max_adaptive_retries: max_adaptive_retries.unwrap_or(DEFAULT_MAX_ADAPTIVE_RETRIES),
            overload_seen: false,
            last: Failure::default(),
            backoff: Backoff::default(),
            deadline: None,
            admitted_delay: None,
            budget_paid: 0,
        }
    }

    /// The same state for an operation under `timeoutMS` (including `timeoutMS=0`, whose
    /// deadline is unlimited): ordinary retryable errors are then retried as long as time
    /// remains rather than once, as the CSOT specification asks (at most
    /// [`MAX_ORDINARY_RETRIES_WITHOUT_A_LIMIT`] times without a limit); the overload cap is
    /// unchanged.
    pub fn with_deadline(mut self, deadline: Deadline) -> Self {
        self.set_deadline(deadline);
        self
    }

    /// [`Self::with_deadline`] in place.
    pub fn set_deadline(&mut self, deadline: Deadline) {
        self.deadline = Some(deadline);
        if !self.overload_seen {
            self.max_retries = if deadline.is_unlimited() {
                MAX_ORDINARY_RETRIES_WITHOUT_A_LIMIT
            } else {
                u32::MAX
            };
        }
    }

    /// The operation's `timeoutMS` deadline, if `timeoutMS` applies.
    pub fn deadline(&self) -> Option<Deadline> {
        self.deadline
    }

    /// Whether the retry the last failure calls for may be made at `now`, and after what delay.
    /// `typical_service` is the recent typical service time of the server
    /// ([`crate::deadline::ServiceTime::typical`]; zero when unknown).
    ///
    /// In order:
    /// 1. under a deadline that has passed: [`Admission::Expired`] (the caller returns a
    ///    timeout error caused by the last error);
    /// 2. beyond the retry cap: [`Declined::Exhausted`];
    /// 3. the delay is the backoff after an overload error and zero after an ordinary one;
    /// 4. under a deadline, if waiting the delay reaches the deadline:
    ///    [`Declined::BackoffPastDeadline`], so the caller returns the last error at once
    ///    without sleeping (Client Backpressure specification);
    /// 5. under a deadline, after an overload error, if the time left is less than the delay
    ///    plus `typical_service`: [`Declined::CannotFinish`], since the retry would most likely
    ///    expire after the overloaded server had done the work. An ordinary retry (a network
    ///    error, a retryable code) is never declined this way: the CSOT specification asks for
    ///    retries while time remains, and such a failure says nothing about the server's load;
    /// 6. otherwise [`Admission::Retry`] with the delay.
    ///
    /// The delay of an admitted retry is kept: [`Self::backoff`] returns it until the next
    /// failure, so the caller sleeps exactly what was checked.
    pub fn admit(
        &mut self,
        now: Instant,
        jitter: &mut impl Jitter,
        typical_service: Duration,
    ) -> Admission {
        if self.deadline.is_some_and(|deadline| deadline.expired(now)) {
            return Admission::Expired;
        }
        if self.exhausted() {
            return Admission::Decline(Declined::Exhausted);
        }
        let delay = if self.last.overload.is_overload() {
            self.backoff(jitter)
        } else {
            Duration::ZERO
        };
        let remaining = self.deadline.and_then(|deadline| deadline.remaining(now));
        if let Some(remaining) = remaining {
            if delay >= remaining {
                return Admission::Decline(Declined::BackoffPastDeadline);
            }
            if self.last.overload.is_overload() && remaining < delay.saturating_add(typical_service)
            {
                return Admission::Decline(Declined::CannotFinish);
            }
        }
        self.admitted_delay = Some((self.failures, delay));
        Admission::Retry(delay)
    }

    /// The same state with another backoff policy.
    pub fn with_backoff(self, backoff: Backoff) -> Self {
        Self { backoff, ..self }
    }

    /// Counts a failure the caller has decided is retryable. After it, [`Self::exhausted`]
    /// says whether the retry it calls for is still within the cap.
    pub fn record_failure(&mut self, failure: Failure) {
        self.failures = self.failures.saturating_add(1);
        if failure.overload.is_overload() {
            // From the first overload error on, the adaptive cap governs every retry of the
            // operation, including retries after later ordinary errors.
            self.overload_seen = true;
            self.max_retries = self.max_adaptive_retries;
        }
        self.last = failure;
    }

    /// The number of the retry the last failure calls for: 1 after the first failure, 0
    /// before any. Saturates at `u32::MAX`.
    pub fn retry_number(&self) -> u32 {
        u32::try_from(self.failures).unwrap_or(u32::MAX)
    }

    /// The most retries the operation may make, as things stand: [`MAX_ORDINARY_RETRIES`],
    /// or `maxAdaptiveRetries` once an overload error has been seen.
    pub fn max_retries(&self) -> u32 {
        self.max_retries
    }

    /// Whether the retry the last failure calls for would exceed the cap, so the operation
    /// must return its error instead.
    pub fn exhausted(&self) -> bool {
        self.failures > u64::from(self.max_retries)
    }

    /// For a command that must stay on one pinned connection, so that only the overload rules
    /// can retry it (an ordinary retryable error there means the connection is gone): counts
    /// `failure` and says whether to send the command again. Only a retryable overload error
    /// that the command allows (`command_allows`, e.g. `retryReads` not false for a getMore)
    /// is retried, and only within the cap; anything else is returned to the caller uncounted.
    pub fn retry_on_pinned_connection(&mut self, failure: Failure, command_allows: bool) -> bool {
        if !failure.overload.is_retryable() || !command_allows {
            return false;
        }
        self.record_failure(failure);
        !self.exhausted()
    }

    /// Retries of this operation the retry budget paid for so far.
    pub fn budget_paid(&self) -> u32 {
        self.budget_paid
    }

    /// Counts one retry the retry budget admitted for this operation.
    pub(crate) fn record_budget_paid(&mut self) {
        self.budget_paid = self.budget_paid.saturating_add(1);
    }

    /// Whether any failure so far was an overload error.
    pub fn overload_seen(&self) -> bool {
        self.overload_seen
    }

    /// The most recent failure ([`Failure::default`] before any).
    pub fn last_failure(&self) -> Failure {
        self.last
    }

    /// The delay before the pending retry: the specification's backoff for its retry number,
    /// with the last failure's server base when it sent one. Callers wait it only after
    /// overload errors (`last_failure().overload.is_overload()`); ordinary retries go at once.
    pub fn backoff(&self, jitter: &mut impl Jitter) -> Duration {
        if let Some((failures, delay)) = self.admitted_delay {
            if failures == self.failures && self.last.overload.is_overload() {
                return delay;
            }
        }
        self.backoff
            .delay(self.retry_number(), self.last.server_base, jitter)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::backoff::MAX_BACKOFF;

    fn overloaded() -> Failure {
        Failure::new(Overload::Retryable, None)
    }

    fn ordinary() -> Failure {
        Failure::new(Overload::None, None)
    }

    #[test]
    fn the_error_returned_is_the_one_that_says_most_about_writes() {
        // (earlier may have written, later may have written, later says NoWritesPerformed)
        let cases = [
            (
                (true, false, false),
                true,
                "a possible write is never hidden",
            ),
            (
                (true, false, true),
                true,
                "a possible write is never hidden",
            ),
            (
                (false, false, true),
                true,
                "B8: every error says no write; the first is returned",
            ),
            ((false, false, false), false, "the latest error otherwise"),
            (
                (false, true, false),
                false,
                "a later possible write replaces the earlier error",
            ),
            (
                (true, true, false),
                false,
                "both may have written: the latest",
            ),
        ];
        for ((earlier, later, no_writes), keeps, why) in cases {
            assert_eq!(
                keeps_earlier_error(earlier, later, no_writes),
                keeps,
                "{why}"
            );
        }
    }

    /// Records failures until the state is exhausted or the failures run out, and returns how
    /// many retries were allowed.
    fn retries_allowed(state: &mut RetryState, failures: impl Iterator<Item = Failure>) -> u32 {
        let mut retries = 0;
        for failure in failures {
            state.record_failure(failure);
            if state.exhausted() {
                break;
            }
            retries += 1;
        }
        retries
    }

    #[test]
    fn ordinary_errors_are_retried_once() {
        let mut state = RetryState::new(None);
        assert_eq!(
            retries_allowed(&mut state, std::iter::repeat_n(ordinary(), 10)),
            1
        );
        assert!(!state.overload_seen());
    }

    #[test]
    fn overload_errors_are_retried_up_to_the_adaptive_cap() {
        for cap in [0, 1, 2, 5] {
            let mut state = RetryState::new(Some(cap));
            let allowed = retries_allowed(&mut state, std::iter::repeat_n(overloaded(), 10));
            assert_eq!(allowed, cap, "maxAdaptiveRetries {cap}");
        }
        assert_eq!(
            RetryState::new(None).max_adaptive_retries,
            DEFAULT_MAX_ADAPTIVE_RETRIES
        );
    }

    #[test]
    fn the_cap_sticks_after_an_overload_error() {
        // First retry after an overload error, later errors ordinary: still the adaptive cap.
        let mut state = RetryState::new(Some(3));
        let failures = [overloaded()]
            .into_iter()
            .chain(std::iter::repeat(ordinary()));
        assert_eq!(retries_allowed(&mut state, failures.take(10)), 3);
        assert!(state.overload_seen());
        assert_eq!(state.last_failure(), ordinary());
    }

    #[test]
    fn an_overload_error_after_an_ordinary_one_raises_the_cap() {
        let mut state = RetryState::new(Some(4));
        state.record_failure(ordinary());
        assert_eq!(state.max_retries(), MAX_ORDINARY_RETRIES);
        state.record_failure(Failure::new(Overload::NotRetryable, None));
        assert_eq!(state.max_retries(), 4);
        assert!(!state.exhausted());
    }

    #[test]
    fn a_zero_cap_after_an_ordinary_error_ends_the_operation() {
        let mut state = RetryState::new(Some(0));
        state.record_failure(ordinary());
        assert!(!state.exhausted());
        state.record_failure(overloaded());
        assert!(state.exhausted());
    }

    #[test]
    fn backoff_uses_the_retry_number_and_the_last_server_base() {
        let mut state = RetryState::new(Some(5));
        let base = ServerBaseBackoff::from_millis_i64(30).unwrap();
        state.record_failure(Failure::new(Overload::Retryable, Some(base)));
        assert_eq!(state.backoff(&mut || 1.0), Duration::from_millis(60));
        state.record_failure(overloaded());
        // Second retry, default base again: 100 ms * 2^2.
        assert_eq!(state.backoff(&mut || 0.5), Duration::from_millis(200));
        let custom = state.with_backoff(Backoff::new(
            Duration::from_millis(1),
            Duration::from_millis(3),
        ));
        assert_eq!(custom.backoff(&mut || 1.0), Duration::from_millis(3));
    }

    #[test]
    fn pinned_connections_retry_only_allowed_retryable_overload_errors() {
        let mut state = RetryState::new(Some(2));
        assert!(!state.retry_on_pinned_connection(ordinary(), true));
        assert!(!state.retry_on_pinned_connection(Failure::new(Overload::NotRetryable, None), true));
        assert!(!state.retry_on_pinned_connection(overloaded(), false));
        assert_eq!(state.retry_number(), 0, "refused failures are not counted");
        assert!(state.retry_on_pinned_connection(overloaded(), true));
        assert!(state.retry_on_pinned_connection(overloaded(), true));
        assert_eq!(state.retry_number(), 2);
        assert!(
            !state.retry_on_pinned_connection(overloaded(), true),
            "cap of 2 reached"
        );
    }

    #[test]
    fn retry_numbers_saturate_instead_of_wrapping() {
        let mut state = RetryState::new(Some(u32::MAX));
        state.failures = u64::from(u32::MAX) + 7;
        assert_eq!(state.retry_number(), u32::MAX);
        assert!(state.exhausted());
        assert_eq!(state.backoff(&mut || 1.0), MAX_BACKOFF);
    }

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn without_a_deadline_admission_is_the_cap_and_the_backoff() {
        let now = Instant::now();
        let mut state = RetryState::new(Some(2));
        state.record_failure(overloaded());
        // First retry: 100 ms * 2^1 at full jitter, however slow the server is.
        assert_eq!(
            state.admit(now, &mut || 1.0, ms(60_000)),
            Admission::Retry(ms(200))
        );
        let mut ordinary_state = RetryState::new(None);
        ordinary_state.record_failure(ordinary());
        assert_eq!(
            ordinary_state.admit(now, &mut || 1.0, ms(0)),
            Admission::Retry(ms(0))
        );
        ordinary_state.record_failure(ordinary());
        assert_eq!(
            ordinary_state.admit(now, &mut || 1.0, ms(0)),
            Admission::Decline(Declined::Exhausted)
        );
    }

    #[test]
    fn a_deadline_lifts_the_ordinary_cap_but_not_the_overload_cap() {
        let now = Instant::now();
        let mut limited = RetryState::new(Some(2)).with_deadline(Deadline::start(now, ms(1)));
        for _ in 0..1_000 {
            limited.record_failure(ordinary());
            assert_eq!(
                limited.admit(now, &mut || 1.0, ms(0)),
                Admission::Retry(ms(0))
            );
        }
        // Without a limit, the ordinary retries stop at the fork's bound.
        let mut unbounded = RetryState::new(Some(2)).with_deadline(Deadline::unlimited());
        for _ in 0..MAX_ORDINARY_RETRIES_WITHOUT_A_LIMIT {
            unbounded.record_failure(ordinary());
            assert_eq!(
                unbounded.admit(now, &mut || 1.0, ms(5)),
                Admission::Retry(ms(0))
            );
        }
        unbounded.record_failure(ordinary());
        assert_eq!(
            unbounded.admit(now, &mut || 1.0, ms(5)),
            Admission::Decline(Declined::Exhausted)
        );
        let mut state = RetryState::new(Some(2)).with_deadline(Deadline::unlimited());
        for _ in 0..50 {
            state.record_failure(ordinary());
        }
        // The first overload error brings the cap of 2 in, counting the retries so far.
        state.record_failure(overloaded());
        assert_eq!(
            state.admit(now, &mut || 1.0, ms(0)),
            Admission::Decline(Declined::Exhausted)
        );
        // A state made after an overload error keeps the adaptive cap under a deadline.
        let mut overloaded_first = RetryState::new(Some(2));
        overloaded_first.record_failure(overloaded());
        let overloaded_first = overloaded_first.with_deadline(Deadline::unlimited());
        assert_eq!(overloaded_first.max_retries(), 2);
    }

    #[test]
    fn a_backoff_past_the_deadline_is_declined_without_sleeping() {
        let start = Instant::now();
        let mut state = RetryState::new(Some(5)).with_deadline(Deadline::start(start, ms(500)));
        state.record_failure(overloaded());
        // 200 ms of backoff, 500 ms left, 100 ms typical service: fits.
        assert_eq!(
            state.admit(start, &mut || 1.0, ms(100)),
            Admission::Retry(ms(200))
        );
        // 250 ms left: the backoff fits, the backoff plus the service time does not.
        let later = start + ms(250);
        assert_eq!(
            state.admit(later, &mut || 1.0, ms(100)),
            Admission::Decline(Declined::CannotFinish)
        );
        // 150 ms left: the backoff alone passes the deadline.
        let later = start + ms(350);
        assert_eq!(
            state.admit(later, &mut || 1.0, ms(0)),
            Admission::Decline(Declined::BackoffPastDeadline)
        );
        assert_eq!(
            state.admit(start + ms(500), &mut || 1.0, ms(0)),
            Admission::Expired
        );
    }

    #[test]
    fn the_backoff_slept_is_the_backoff_admitted() {
        let start = Instant::now();
        let mut state = RetryState::new(Some(5)).with_deadline(Deadline::start(start, ms(10_000)));
        state.record_failure(overloaded());
        assert_eq!(
            state.admit(start, &mut || 0.25, ms(0)),
            Admission::Retry(ms(50))
        );
        // A later draw of the jitter does not change the delay already checked.
        assert_eq!(state.backoff(&mut || 1.0), ms(50));
        // The next failure calls for a new delay.
        state.record_failure(overloaded());
        assert_eq!(state.backoff(&mut || 1.0), ms(400));
    }

    #[test]
    fn an_ordinary_retry_goes_on_while_any_time_remains() {
        let start = Instant::now();
        let mut state = RetryState::new(None).with_deadline(Deadline::start(start, ms(100)));
        state.record_failure(ordinary());
        assert_eq!(
            state.admit(start + ms(50), &mut || 1.0, ms(40)),
            Admission::Retry(ms(0))
        );
        // 30 ms left against a typical 40: an overload retry would be declined, an ordinary one
        // is what the CSOT specification requires while time remains.
        assert_eq!(
            state.admit(start + ms(70), &mut || 1.0, ms(40)),
            Admission::Retry(ms(0))
        );
        assert_eq!(
            state.admit(start + ms(100), &mut || 1.0, ms(40)),
            Admission::Expired
        );
        assert_eq!(state.deadline(), Some(Deadline::start(start, ms(100))));
    }

    fn failure() -> impl Strategy<Value = Failure> {
        let overload = prop_oneof![
            Just(Overload::None),
            Just(Overload::NotRetryable),
            Just(Overload::Retryable),
        ];
        let base = proptest::option::of(
            (1..=86_400_000i64).prop_map(|ms| ServerBaseBackoff::from_millis_i64(ms).unwrap()),
        );
        (overload, base).prop_map(|(overload, base)| Failure::new(overload, base))
    }

    proptest! {
        #[test]
        fn retries_never_exceed_the_cap(
            cap in proptest::option::of(0u32..20),
            failures in proptest::collection::vec(failure(), 0..40),
        ) {
            let mut state = RetryState::new(cap);
            let allowed = retries_allowed(&mut state, failures.iter().copied());
            let overload_cap = cap.unwrap_or(DEFAULT_MAX_ADAPTIVE_RETRIES);
            prop_assert!(allowed <= overload_cap.max(MAX_ORDINARY_RETRIES));
            // Without any overload error, the ordinary cap is all there is.
            if !failures.iter().any(|f| f.overload.is_overload()) {
                prop_assert!(allowed <= MAX_ORDINARY_RETRIES);
            }
        }

        #[test]
        fn pinned_retries_never_exceed_max_adaptive_retries(
            cap in 0u32..10,
            failures in proptest::collection::vec((failure(), any::<bool>()), 0..40),
        ) {
            let mut state = RetryState::new(Some(cap));
            let mut retried = 0u32;
            for (failure, allowed) in failures {
                if state.retry_on_pinned_connection(failure, allowed) {
                    prop_assert!(failure.overload.is_retryable() && allowed);
                    retried += 1;
                } else if failure.overload.is_retryable() && allowed {
                    // The cap was hit: the operation ends here.
                    break;
                }
            }
            prop_assert!(retried <= cap);
        }

        #[test]
        fn the_cap_is_sticky(
            cap in 0u32..20,
            failures in proptest::collection::vec(failure(), 1..40),
        ) {
            let mut state = RetryState::new(Some(cap));
            let mut seen = false;
            for failure in failures {
                state.record_failure(failure);
                seen |= failure.overload.is_overload();
                prop_assert_eq!(state.overload_seen(), seen);
                let expected = if seen { cap } else { MAX_ORDINARY_RETRIES };
                prop_assert_eq!(state.max_retries(), expected);
                prop_assert_eq!(
                    state.exhausted(),
                    u64::from(state.retry_number()) > u64::from(expected)
                );
            }
        }

        #[test]
        fn admitted_retries_fit_before_the_deadline(
            budget in 1u64..5_000,
            elapsed in 0u64..6_000,
            service in 0u64..2_000,
            failures in proptest::collection::vec(failure(), 1..20),
            jitter in 0.0f64..1.0,
        ) {
            let start = Instant::now();
            let deadline = Deadline::start(start, ms(budget));
            let mut state = RetryState::new(Some(3)).with_deadline(deadline);
            let now = start + ms(elapsed);
            for failure in failures {
                state.record_failure(failure);
                match state.admit(now, &mut || jitter, ms(service)) {
                    Admission::Retry(delay) => {
                        prop_assert!(!state.exhausted());
                        // Only a retry after an overload error must leave room for the
                        // server's typical service time; an ordinary one needs time left.
                        if failure.overload.is_overload() {
                            prop_assert!(now + delay + ms(service) <= deadline.instant().unwrap());
                        }
                        prop_assert!(now + delay < deadline.instant().unwrap());
                        if !failure.overload.is_overload() {
                            prop_assert_eq!(delay, Duration::ZERO);
                        }
                    }
                    Admission::Expired => prop_assert!(deadline.expired(now)),
                    Admission::Decline(Declined::Exhausted) => {
                        prop_assert!(state.overload_seen() && state.exhausted());
                    }
                    Admission::Decline(_) => prop_assert!(!deadline.expired(now)),
                }
            }
        }

        #[test]
        fn backoff_stays_within_the_ceiling(
            failures in proptest::collection::vec(failure(), 1..40),
            jitter in any::<f64>(),
        ) {
            let mut state = RetryState::new(Some(u32::MAX));
            for failure in failures {
                state.record_failure(failure);
                let ceiling = Backoff::default().ceiling(state.retry_number(), failure.server_base);
                let delay = state.backoff(&mut || jitter);
                prop_assert!(delay <= ceiling && ceiling <= MAX_BACKOFF);
            }
        }
    }
}
