//! `timeoutMS` for cursors (the CSOT specification's stage 2): which deadline a cursor's
//! commands run under, and what `maxTimeMS` each carries.
//!
//! An operation that opens a cursor (`find`, `aggregate`, the `list*` commands, a cursor
//! command) runs under its own deadline like any other. What follows depends on the cursor's
//! **timeout mode** ([`TimeoutMode`]):
//!
//! - **cursor lifetime** (the default for ordinary cursors): the opening command and every
//!   `getMore` share the opening operation's one deadline. Documents already buffered are
//!   still returned after it passes; only a call that needs a `getMore` fails.
//! - **iteration** (the only mode of tailable cursors and change streams): the opening command
//!   and each later `next` call get the whole `timeoutMS` afresh. A `next` call may send
//!   several `getMore`s (a tailable cursor's empty batches, a change stream's resume): they
//!   share the call's deadline ([`CursorTimeout::next_get_more`]) until the call ends
//!   ([`CursorTimeout::end_call`]).
//!
//! `maxTimeMS` ([`ServerTimeLimit`]) is derived from the deadline only where the server's
//! limit and the client's mean the same thing: on the opening command of a cursor-lifetime
//! cursor or an awaitData cursor, and on `killCursors`. A `getMore` never carries the
//! deadline's remainder: mongod refuses `maxTimeMS` on the `getMore` of a cursor that does not
//! await data (BadValue, `getmore_cmd.cpp`), and on one that does it is the wait for new data,
//! not a deadline. An awaitData cursor's `getMore` carries `maxAwaitTimeMS`, cut to what
//! remains of the call ([`get_more_limit`]). The opening command of an iteration-mode
//! non-tailable cursor and of a tailable non-awaitData cursor carries none either: the server
//! would apply one call's budget to the cursor's whole life.
//!
//! Closing a cursor (`killCursors`, explicit or on drop) gets `timeoutMS` afresh, even after a
//! cursor-lifetime deadline passed: the point of closing is to free the server's cursor, and a
//! close that could not be sent would leave it open until the server's idle timeout.
//!
//! The option checks ([`CursorRequest::mode`]) are the specification's, made before anything is
//! sent.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use overload::cursor::{CursorRequest, CursorTimeout, CursorType, TimeoutMode};
//! use overload::deadline::Deadline;
//!
//! let request = CursorRequest {
//!     timeout: Some(Duration::from_millis(200)),
//!     mode: Some(TimeoutMode::Iteration),
//!     ..CursorRequest::default()
//! };
//! let t0 = Instant::now();
//! let opened = Deadline::start(t0, Duration::from_millis(200));
//! let mut cursor = CursorTimeout::open(&request, opened).unwrap().expect("timeoutMS is set");
//! // A `next` call at 500 ms gets the whole 200 ms again.
//! let get_more_timeout = cursor.next_get_more(t0 + Duration::from_millis(500)).unwrap();
//! assert_eq!(get_more_timeout, Duration::from_millis(200));
//! ```

use std::fmt;
use std::time::{Duration, Instant};

use crate::deadline::{Deadline, Expired};

/// How `timeoutMS` applies to a cursor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimeoutMode {
    /// One deadline for the opening command and the cursor's whole life.
    CursorLifetime,
    /// `timeoutMS` afresh for the opening command and for each later `next` call.
    Iteration,
}

/// The kind of cursor an operation opens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CursorType {
    /// An ordinary cursor, exhausted once its results are read.
    #[default]
    NonTailable,
    /// A tailable cursor on a capped collection, without `awaitData`.
    Tailable,
    /// A tailable cursor whose `getMore`s wait on the server for new data (`maxAwaitTimeMS`);
    /// change streams are of this kind.
    TailableAwait,
}

/// What an operation that opens a cursor asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CursorRequest {
    /// The `timeoutMS` in force for the operation (its own, or inherited from its collection,
    /// database or client); `None` when none is set anywhere, zero for no limit.
    pub timeout: Option<Duration>,
    /// The `timeoutMode` option, if given.
    pub mode: Option<TimeoutMode>,
    pub cursor_type: CursorType,
    /// The `maxAwaitTimeMS` option, if given.
    pub max_await: Option<Duration>,
    /// Whether the operation writes its results (an aggregate with `$out` or `$merge`).
    pub writes_output: bool,
}

/// A cursor's timeout options that the specification forbids together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidCursorTimeout {
    /// `timeoutMode` without `timeoutMS` at any level.
    ModeWithoutTimeout,
    /// `cursorLifetime` on a tailable cursor, which has no lifetime to bound.
    LifetimeOnTailable,
    /// `iteration` on an aggregate with `$out` or `$merge`, whose one command is all its work.
    IterationWithOutput,
    /// `maxAwaitTimeMS` not below a non-zero `timeoutMS`: every wait for new data would time
    /// the call out.
    AwaitNotBelowTimeout {
        max_await: Duration,
        timeout: Duration,
    },
}

impl fmt::Display for InvalidCursorTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ModeWithoutTimeout => {
                f.write_str("timeoutMode requires timeoutMS to be set on the operation or above it")
            }
            Self::LifetimeOnTailable => f.write_str(
                "timeoutMode cursorLifetime is not allowed on a tailable cursor; use iteration",
            ),
            Self::IterationWithOutput => f.write_str(
                "timeoutMode iteration is not allowed on an aggregate with $out or $merge",
            ),
            Self::AwaitNotBelowTimeout { max_await, timeout } => write!(
                f,
                "maxAwaitTimeMS ({} ms) must be less than timeoutMS ({} ms)",
                max_await.as_millis(),
                timeout.as_millis()
            ),
        }
    }
}

impl std::error::Error for InvalidCursorTimeout {}

impl CursorRequest {
    /// The timeout mode the cursor gets: `None` when `timeoutMS` is not set (the cursor keeps
    /// the driver's behaviour without it), else the option or the default for the cursor type.
    /// The specification's checks come first, so an invalid combination is refused before
    /// anything is sent.
    pub fn mode(&self) -> Result<Option<TimeoutMode>, InvalidCursorTimeout> {
        let Some(timeout) = self.timeout else {
            return match self.mode {
                Some(_) => Err(InvalidCursorTimeout::ModeWithoutTimeout),
                None => Ok(None),
            };
        };
        if let Some(max_await) = self.max_await {
            if !timeout.is_zero() && max_await >= timeout {
                return Err(InvalidCursorTimeout::AwaitNotBelowTimeout { max_await, timeout });
            }
        }
        let tailable = self.cursor_type != CursorType::NonTailable;
        match self.mode {
            Some(TimeoutMode::CursorLifetime) if tailable => {
                Err(InvalidCursorTimeout::LifetimeOnTailable)
            }
            Some(TimeoutMode::Iteration) if self.writes_output => {
                Err(InvalidCursorTimeout::IterationWithOutput)
            }
            Some(mode) => Ok(Some(mode)),
            None if tailable => Ok(Some(TimeoutMode::Iteration)),
            None => Ok(Some(TimeoutMode::CursorLifetime)),
        }
    }

    /// The `maxTimeMS` of the command that opens the cursor, under a deadline. Only a
    /// cursor-lifetime cursor and an awaitData one derive it from the deadline.
    pub fn opening_limit(&self) -> ServerTimeLimit {
        match (self.cursor_type, self.mode) {
            (CursorType::TailableAwait, _) => ServerTimeLimit::Remaining,
            (CursorType::Tailable, _) => ServerTimeLimit::Omit,
            (CursorType::NonTailable, Some(TimeoutMode::Iteration)) => ServerTimeLimit::Omit,
            (CursorType::NonTailable, _) => ServerTimeLimit::Remaining,
        }
    }
}

/// The `maxTimeMS` of a `getMore` under a deadline, whose command asked for `own` (an awaitData
/// cursor's `maxAwaitTimeMS`): that, cut to the deadline, or none at all.
pub fn get_more_limit(own: Option<Duration>) -> ServerTimeLimit {
    own.map_or(ServerTimeLimit::Omit, ServerTimeLimit::AtMost)
}

/// The `maxTimeMS` rule of command `command` under a deadline: a `getMore` keeps its own
/// (`own`, read only for a `getMore`) cut to the deadline ([`get_more_limit`]), a command that
/// opens a cursor follows `opening` ([`CursorRequest::opening_limit`]), and every other command
/// gets the remaining time.
pub fn command_limit(
    command: &str,
    opening: Option<CursorRequest>,
    own: impl FnOnce() -> Option<Duration>,
) -> ServerTimeLimit {
    if command == "getMore" {
        return get_more_limit(own());
    }
    opening.map_or(ServerTimeLimit::Remaining, |request| {
        request.opening_limit()
    })
}

/// What `maxTimeMS` a command carries under a deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerTimeLimit {
    /// The remaining time less the minimum round trip (every operation that is not a cursor's).
    Remaining,
    /// None at all.
    Omit,
    /// At most this (an awaitData `getMore`'s `maxAwaitTimeMS`), cut to the remaining time less
    /// the minimum round trip.
    AtMost(Duration),
}

impl ServerTimeLimit {
    /// The `maxTimeMS` to send at `now` under `deadline` to a server whose minimum round-trip
    /// time is `min_rtt` (`None`: send none). [`Expired`] means time out without sending: the
    /// deadline has passed, or what remains cannot cover the round trip where a limit is sent.
    pub fn max_time(
        self,
        deadline: Deadline,
        now: Instant,
        min_rtt: Duration,
    ) -> Result<Option<Duration>, Expired> {
        match self {
            Self::Remaining => deadline.max_time(now, min_rtt),
            Self::Omit if deadline.expired(now) => Err(Expired),
            Self::Omit => Ok(None),
            Self::AtMost(limit) => {
                let remaining = deadline.max_time(now, min_rtt)?;
                Ok(Some(
                    remaining.map_or(limit, |remaining| remaining.min(limit)),
                ))
            }
        }
    }
}

/// What remains of `deadline` at `now` as a `timeoutMS` for a command that continues a call
/// (zero: no limit); [`Expired`] when nothing remains, since a zero `timeoutMS` would mean no
/// limit at all.
pub fn remaining_timeout(deadline: Deadline, now: Instant) -> Result<Duration, Expired> {
    match deadline.remaining(now) {
        None => Ok(Duration::ZERO),
        Some(remaining) if remaining.is_zero() => Err(Expired),
        Some(remaining) => Ok(remaining),
    }
}

/// The timeout of an open cursor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CursorTimeout {
    timeout: Duration,
    mode: TimeoutMode,
    /// The opening operation's deadline, which a cursor-lifetime cursor keeps.
    lifetime: Deadline,
    /// The deadline of the `next` call in progress, once it sent a `getMore`.
    call: Option<Deadline>,
}

impl CursorTimeout {
    /// The timeout of a cursor opened by `request` under the deadline `opened` (the one its
    /// opening command ran under); `None` when `timeoutMS` does not apply.
    pub fn open(
        request: &CursorRequest,
        opened: Deadline,
    ) -> Result<Option<Self>, InvalidCursorTimeout> {
        let (Some(mode), Some(timeout)) = (request.mode()?, request.timeout) else {
            return Ok(None);
        };
        Ok(Some(Self {
            timeout,
            mode,
            lifetime: opened,
            call: None,
        }))
    }

    pub fn mode(&self) -> TimeoutMode {
        self.mode
    }

    /// The `timeoutMS` the cursor was opened with.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A `next` call needs a `getMore` at `now`: its `timeoutMS` (zero: no limit). The first
    /// `getMore` of a call fixes the call's deadline ([`Self::call_deadline`]); later ones in
    /// the same call share it. [`Expired`] means the call times out without sending.
    pub fn next_get_more(&mut self, now: Instant) -> Result<Duration, Expired> {
        remaining_timeout(self.call_deadline(now), now)
    }

    /// The deadline of the `next` call in progress, fixed now if the call has not asked
    /// before: the cursor's own in cursor-lifetime mode, `timeoutMS` from `now` in iteration
    /// mode.
    pub fn call_deadline(&mut self, now: Instant) -> Deadline {
        *self.call.get_or_insert(match self.mode {
            TimeoutMode::CursorLifetime => self.lifetime,
            TimeoutMode::Iteration => Deadline::start(now, self.timeout),
        })
    }

    /// This cursor replaced another in the middle of a `next` call (a change stream resumed
    /// it), which goes on under `deadline`.
    pub fn continue_call(&mut self, deadline: Deadline) {
        self.call = Some(deadline);
    }

    /// The `next` call in progress ended (it returned documents or an error, or the cursor is
    /// exhausted): the next one starts with a deadline of its own.
    pub fn end_call(&mut self) {
        self.call = None;
    }

    /// A `getMore` of the call in progress returned a batch: with documents (`has_docs`) or at
    /// the cursor's end (`exhausted`) the call ends; an empty batch of a live cursor (a
    /// tailable cursor waiting for data) leaves the call, and its deadline, going.
    pub fn batch_received(&mut self, has_docs: bool, exhausted: bool) {
        if has_docs || exhausted {
            self.end_call();
        }
    }

    /// The `timeoutMS` of closing the cursor: `own` if the close was given one, else the
    /// cursor's `timeoutMS` afresh (zero: no limit).
    pub fn close_timeout(&self, own: Option<Duration>) -> Duration {
        own.unwrap_or(self.timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    fn request(timeout: Option<u64>, mode: Option<TimeoutMode>, kind: CursorType) -> CursorRequest {
        CursorRequest {
            timeout: timeout.map(ms),
            mode,
            cursor_type: kind,
            ..CursorRequest::default()
        }
    }

    #[test]
    fn the_mode_defaults_by_cursor_type_and_needs_timeout_ms() {
        use CursorType::*;
        use TimeoutMode::*;
        assert_eq!(request(None, None, NonTailable).mode(), Ok(None));
        assert_eq!(
            request(Some(100), None, NonTailable).mode(),
            Ok(Some(CursorLifetime))
        );
        assert_eq!(
            request(Some(100), None, Tailable).mode(),
            Ok(Some(Iteration))
        );
        assert_eq!(
            request(Some(0), None, TailableAwait).mode(),
            Ok(Some(Iteration))
        );
        for mode in [CursorLifetime, Iteration] {
            assert_eq!(
                request(None, Some(mode), NonTailable).mode(),
                Err(InvalidCursorTimeout::ModeWithoutTimeout)
            );
        }
        for kind in [Tailable, TailableAwait] {
            assert_eq!(
                request(Some(100), Some(CursorLifetime), kind).mode(),
                Err(InvalidCursorTimeout::LifetimeOnTailable)
            );
        }
    }

    #[test]
    fn iteration_is_refused_for_an_aggregate_that_writes() {
        let writes = CursorRequest {
            writes_output: true,
            ..request(
                Some(100),
                Some(TimeoutMode::Iteration),
                CursorType::NonTailable,
            )
        };
        assert_eq!(
            writes.mode(),
            Err(InvalidCursorTimeout::IterationWithOutput)
        );
        let lifetime = CursorRequest {
            mode: None,
            ..writes
        };
        assert_eq!(lifetime.mode(), Ok(Some(TimeoutMode::CursorLifetime)));
    }

    #[test]
    fn max_await_must_stay_below_a_non_zero_timeout() {
        let with_await = |timeout, max_await| CursorRequest {
            max_await: Some(ms(max_await)),
            ..request(Some(timeout), None, CursorType::TailableAwait)
        };
        for (timeout, max_await) in [(5, 10), (5, 5)] {
            assert_eq!(
                with_await(timeout, max_await).mode(),
                Err(InvalidCursorTimeout::AwaitNotBelowTimeout {
                    max_await: ms(max_await),
                    timeout: ms(timeout)
                })
            );
        }
        assert!(with_await(5, 4).mode().is_ok());
        assert!(
            with_await(0, 1_000).mode().is_ok(),
            "timeoutMS=0 has no limit"
        );
        let unset = CursorRequest {
            timeout: None,
            ..with_await(5, 10)
        };
        assert_eq!(unset.mode(), Ok(None));
    }

    #[test]
    fn only_lifetime_and_await_data_cursors_open_with_max_time_ms() {
        use CursorType::*;
        use ServerTimeLimit::*;
        use TimeoutMode::*;
        let cases = [
            (None, NonTailable, Remaining),
            (Some(CursorLifetime), NonTailable, Remaining),
            (Some(Iteration), NonTailable, Omit),
            (None, Tailable, Omit),
            (Some(Iteration), Tailable, Omit),
            (None, TailableAwait, Remaining),
            (Some(Iteration), TailableAwait, Remaining),
        ];
        for (mode, kind, limit) in cases {
            assert_eq!(
                request(Some(100), mode, kind).opening_limit(),
                limit,
                "{mode:?} {kind:?}"
            );
        }
        assert_eq!(get_more_limit(None), Omit);
        assert_eq!(get_more_limit(Some(ms(100))), AtMost(ms(100)));
    }

    #[test]
    fn a_limit_is_cut_to_what_remains_and_omitted_limits_still_see_expiry() {
        let t0 = Instant::now();
        let deadline = Deadline::start(t0, ms(200));
        let at = |millis| t0 + ms(millis);
        let rtt = ms(10);
        assert_eq!(
            ServerTimeLimit::Remaining.max_time(deadline, at(50), rtt),
            Ok(Some(ms(140)))
        );
        assert_eq!(
            ServerTimeLimit::Omit.max_time(deadline, at(50), rtt),
            Ok(None)
        );
        assert_eq!(
            ServerTimeLimit::Omit.max_time(deadline, at(200), rtt),
            Err(Expired)
        );
        assert_eq!(
            ServerTimeLimit::AtMost(ms(100)).max_time(deadline, at(50), rtt),
            Ok(Some(ms(100)))
        );
        assert_eq!(
            ServerTimeLimit::AtMost(ms(100)).max_time(deadline, at(130), rtt),
            Ok(Some(ms(60)))
        );
        assert_eq!(
            ServerTimeLimit::AtMost(ms(100)).max_time(deadline, at(195), rtt),
            Err(Expired)
        );
        let unlimited = Deadline::unlimited();
        assert_eq!(
            ServerTimeLimit::AtMost(ms(100)).max_time(unlimited, at(10_000), rtt),
            Ok(Some(ms(100)))
        );
        assert_eq!(
            ServerTimeLimit::Remaining.max_time(unlimited, at(10), rtt),
            Ok(None)
        );
    }

    fn open(request: CursorRequest, t0: Instant) -> CursorTimeout {
        let opened = Deadline::start(t0, request.timeout.unwrap_or_default());
        CursorTimeout::open(&request, opened)
            .expect("valid")
            .expect("timeoutMS applies")
    }

    #[test]
    fn a_lifetime_cursor_spends_the_opening_deadline_and_iteration_renews_it_per_call() {
        let t0 = Instant::now();
        let at = |millis| t0 + ms(millis);
        let mut lifetime = open(request(Some(200), None, CursorType::NonTailable), t0);
        assert_eq!(lifetime.next_get_more(at(120)), Ok(ms(80)));
        lifetime.end_call();
        assert_eq!(lifetime.next_get_more(at(200)), Err(Expired));

        let mut iteration = open(
            request(
                Some(200),
                Some(TimeoutMode::Iteration),
                CursorType::NonTailable,
            ),
            t0,
        );
        assert_eq!(iteration.next_get_more(at(500)), Ok(ms(200)));
        // A second getMore of the same call (an empty tailable batch) shares its deadline.
        assert_eq!(iteration.next_get_more(at(650)), Ok(ms(50)));
        assert_eq!(iteration.next_get_more(at(700)), Err(Expired));
        iteration.end_call();
        assert_eq!(iteration.next_get_more(at(710)), Ok(ms(200)));
    }

    #[test]
    fn a_call_ends_with_documents_or_the_cursors_end_and_goes_on_over_empty_batches() {
        let t0 = Instant::now();
        let mut tailing = open(request(Some(200), None, CursorType::Tailable), t0);
        assert_eq!(tailing.next_get_more(t0), Ok(ms(200)));
        tailing.batch_received(false, false);
        assert_eq!(tailing.next_get_more(t0 + ms(150)), Ok(ms(50)), "same call");
        tailing.batch_received(true, false);
        assert_eq!(
            tailing.next_get_more(t0 + ms(160)),
            Ok(ms(200)),
            "a new call"
        );
        tailing.batch_received(false, true);
        assert_eq!(
            tailing.next_get_more(t0 + ms(300)),
            Ok(ms(200)),
            "a new call"
        );
    }

    #[test]
    fn commands_get_their_limit_by_name_and_cursor() {
        let iteration = request(
            Some(100),
            Some(TimeoutMode::Iteration),
            CursorType::NonTailable,
        );
        assert_eq!(
            command_limit("getMore", None, || Some(ms(5))),
            ServerTimeLimit::AtMost(ms(5))
        );
        assert_eq!(
            command_limit("getMore", None, || None),
            ServerTimeLimit::Omit
        );
        assert_eq!(
            command_limit("find", Some(iteration), || panic!("read only for getMore")),
            ServerTimeLimit::Omit
        );
        assert_eq!(
            command_limit("insert", None, || panic!("read only for getMore")),
            ServerTimeLimit::Remaining
        );
    }

    #[test]
    fn an_unlimited_cursor_sends_its_get_mores_without_a_timeout() {
        let t0 = Instant::now();
        let mut tailing = open(request(Some(0), None, CursorType::TailableAwait), t0);
        assert_eq!(tailing.next_get_more(t0 + ms(1_000)), Ok(Duration::ZERO));
    }

    #[test]
    fn a_resumed_cursor_goes_on_with_the_call_it_replaced() {
        let t0 = Instant::now();
        let mut old = open(request(Some(200), None, CursorType::TailableAwait), t0);
        let call = old.call_deadline(t0 + ms(1_000));
        assert_eq!(call, Deadline::at(t0 + ms(1_200)));
        assert_eq!(remaining_timeout(call, t0 + ms(1_150)), Ok(ms(50)));
        assert_eq!(remaining_timeout(call, t0 + ms(1_200)), Err(Expired));
        let mut new = open(
            request(Some(200), None, CursorType::TailableAwait),
            t0 + ms(1_100),
        );
        new.continue_call(call);
        assert_eq!(new.next_get_more(t0 + ms(1_150)), Ok(ms(50)));
        new.end_call();
        assert_eq!(new.next_get_more(t0 + ms(1_300)), Ok(ms(200)));
        assert_eq!(
            remaining_timeout(Deadline::unlimited(), t0),
            Ok(Duration::ZERO)
        );
    }

    #[test]
    fn closing_gets_timeout_ms_afresh_unless_given_its_own() {
        let t0 = Instant::now();
        let mut cursor = open(request(Some(200), None, CursorType::NonTailable), t0);
        assert_eq!(cursor.next_get_more(t0 + ms(300)), Err(Expired));
        assert_eq!(cursor.close_timeout(None), ms(200));
        assert_eq!(cursor.close_timeout(Some(ms(400))), ms(400));
    }

    #[test]
    fn no_timeout_ms_no_cursor_timeout() {
        let opened = Deadline::unlimited();
        let plain = request(None, None, CursorType::NonTailable);
        assert_eq!(CursorTimeout::open(&plain, opened), Ok(None));
        let invalid = request(None, Some(TimeoutMode::Iteration), CursorType::NonTailable);
        assert_eq!(
            CursorTimeout::open(&invalid, opened),
            Err(InvalidCursorTimeout::ModeWithoutTimeout)
        );
    }
}
