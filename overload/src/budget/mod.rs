//! A retry budget per client: how many retries all of a client's operations, and the
//! application's own retry loops, may make together.
//!
//! # Why a budget and not only a cap per operation?
//!
//! `maxAdaptiveRetries` caps the retries of one operation (two by default). It says nothing about
//! how many operations are retrying at once. When a server sheds load, every operation sent to it
//! fails, every one of them retries, and a client at 200 % of the server's capacity sends up to
//! three attempts per request: the lab measured 2.45 attempts per request for upstream's defaults,
//! with less goodput than with retries turned off. An application that retries failed operations
//! itself multiplies that again (two application retries around two driver retries: nine
//! attempts).
//!
//! A budget bounds the *sum* instead: retries may add at most a fixed share to the traffic the
//! client sends anyway. When errors are rare (a failover, a transient rejection) that share is
//! never reached and every retry the specification calls for is made; under sustained overload
//! the budget runs dry and the client sends about `1 + share` attempts per request, which is what
//! an overloaded server can absorb. The retries it refuses return their operation's last error
//! to the application, labels intact, at once, with no backoff.
//!
//! # The mechanism: a share of recent first attempts, plus a floor
//!
//! [`RetryBudget`] follows the design of Finagle's `RetryBudget` (also tower's `TpsBudget` and
//! Linkerd's `retryBudget`), with its own bookkeeping:
//!
//! - every operation's first attempt **deposits** `retryBudgetPercent` % of one retry; deposits
//!   expire after `retryBudgetWindowMS`;
//! - a **floor** of `retryBudgetMinPerSec` retries per second is always available, whatever the
//!   traffic, held in a reserve of `retryBudgetMinPerSec × window` retries that refills
//!   continuously;
//! - every retry **withdraws** one retry's worth, from unexpired deposits first (oldest first,
//!   since they expire soonest) and from the reserve only when those are spent; a retry is
//!   refused when less than one retry's worth is left;
//! - an operation that succeeds after retries **is refunded** what they cost (into the newest
//!   slot, expiring a window later), so in the end the budget pays only for the retries of
//!   operations that failed anyway.
//!
//! The floor is what keeps the budget from starving retries at low request rates: a client
//! sending one request per second earns under a tenth of a retry per second from deposits, far too
//! little for an operation that fails twice, but the reserve (10 retries by default) covers it.
//! Under overload the floor is a constant, so its share of the traffic shrinks as the load grows.
//!
//! Over any interval of length `L`, the retries admitted are therefore at most
//! `percent/100 × (first attempts in the interval and the window before it) + retries refunded
//! in the same span + minPerSec × (L + window)`: the deposits and refunds a retry can draw on
//! were made at most one window earlier, and the reserve starts full and refills at the floor
//! rate. The tests in `ratio.rs` check this bound on arbitrary event sequences, and simulate the
//! regimes.
//!
//! # Why refunds
//!
//! Error labels cannot tell a server that sheds load from one that rejects a random share of
//! requests with capacity to spare. Charged for every retry, the budget starved retries as soon
//! as transient errors passed its share: at 30 % of attempts rejected at random, retries want
//! 0.39 per first attempt against the 0.09 it earns. A retry whose operation then succeeds cost
//! the server nothing it could not give, so it is given back; the budget is left paying for
//! retries of operations that fail anyway, `2p³` per first attempt at an error share `p` with
//! two retries (5.4 % at 30 %). Under overload most retries fail, so it still binds; the ones
//! that succeed there are free too, which is the price (attempts per request above `1 + share`
//! by about the share of retries that succeed). The AWS SDKs' retry quota likewise returns a
//! retry's cost when the retried request succeeds.
//!
//! Refunds are given only while the client's servers accepted at least half of its recent
//! attempts ([`Acceptance`]): above that line a rejecting server has capacity to spare for the
//! retries that succeed; below it, it is shedding overload, every retry that succeeds displaces
//! another request, and the budget charges every retry as before.
//!
//! The driver asks the budget ([`Budget::level`] at least one) when it decides a retry, and
//! withdraws when it sends it, after the backoff: withdrawing at the decision would hold credit
//! for every retry asleep in its backoff, more than a new client's reserve at 30 % errors.
//!
//! The token bucket of gRPC's retry throttling and of the withdrawn specification was considered
//! and not chosen; `docs/retry-budget.md` says why, with the anchors' parameters.
//!
//! # Sharing the budget with the application
//!
//! [`RetryBudgetHandle`] is a cloneable handle on one client's budget. The driver's retry loop
//! and the application's retry loops withdraw through it, so they draw from one budget, and
//! every decision is counted in the client's [`OverloadStatsRecorder`](crate::stats) and logged on
//! the `mongodb::overload` tracing target.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::{Duration, Instant};
//! use overload::budget::{RetryBudget, RetryBudgetConfig, RetryBudgetHandle, RetryOrigin};
//! use overload::stats::OverloadStatsRecorder;
//!
//! let budget = RetryBudget::new(RetryBudgetConfig::default()).unwrap();
//! let stats = Arc::new(OverloadStatsRecorder::new());
//! let handle = RetryBudgetHandle::new(budget, Arc::clone(&stats), Instant::now);
//!
//! // The driver deposits at each operation's first attempt, withdraws before each retry, and
//! // counts the retry as made when it sends it.
//! let now = Instant::now();
//! handle.deposit_at(now);
//! if handle.withdraw_at(RetryOrigin::Driver, Some("find"), now) {
//!     stats.record_retry_made();
//! }
//!
//! // An application retry loop draws on the same budget.
//! let app = handle.clone();
//! assert!(app.try_withdraw());
//! let snapshot = stats.snapshot(Some(handle.level_at(now + Duration::from_secs(1))));
//! assert_eq!(snapshot.retries_made, 1);
//! assert_eq!(snapshot.application_retries_made, 1);
//! ```
//!
//! # Time
//!
//! Every method takes the current time as a [`std::time::Instant`] so tests control it; the
//! driver passes tokio's clock (`tokio::time::Instant::now().into_std()`), which tests can pause.
//! A time earlier than one already seen is treated as that time: the budget never panics and
//! never refunds anything because a clock went backwards.

mod acceptance;
mod handle;
mod ratio;

use std::time::Instant;

pub use acceptance::{Acceptance, REFUND_MIN_ACCEPTED_SHARE};
pub use handle::{budget_decisions_enabled, RetryBudgetHandle, RetryOrigin};
pub use ratio::{
    InvalidBudgetConfig, RetryBudget, RetryBudgetConfig, DEFAULT_MIN_RETRIES_PER_SEC,
    DEFAULT_RETRY_PERCENT, DEFAULT_WINDOW, MAX_MIN_RETRIES_PER_SEC, MAX_RETRY_PERCENT, MAX_WINDOW,
    MIN_WINDOW, OPTION_MIN_PER_SEC, OPTION_PERCENT, OPTION_WINDOW_MS,
};

/// A retry budget: something a retry loop deposits into as it does ordinary work and withdraws
/// from before each retry. See the [module documentation](self) for why.
///
/// Implementations are shared by all of a client's operations, so they take `&self` and must
/// be safe to call from many tasks at once when they are `Sync`.
pub trait Budget {
    /// Records one unit of ordinary work at `now`: one operation's first attempt.
    fn deposit(&self, now: Instant);

    /// Asks for one retry at `now`. `true` admits it and charges the budget; `false` refuses
    /// it and charges nothing.
    fn withdraw(&self, now: Instant) -> bool;

    /// Gives back `retries` withdrawals at `now`: the retries of an operation that then
    /// succeeded (see "Retries that succeed are refunded" in the module documentation). The
    /// caller passes at most what it withdrew for that operation.
    fn refund(&self, retries: u32, now: Instant);

    /// How many retries the budget would admit at `now` if asked in a row, with no deposits in
    /// between (fractional: `0.4` means the next withdrawal is refused). For gauges and logs.
    fn level(&self, now: Instant) -> f64;
}

impl<B: Budget + ?Sized> Budget for std::sync::Arc<B> {
    fn deposit(&self, now: Instant) {
        (**self).deposit(now)
    }

    fn withdraw(&self, now: Instant) -> bool {
        (**self).withdraw(now)
    }

    fn refund(&self, retries: u32, now: Instant) {
        (**self).refund(retries, now)
    }

    fn level(&self, now: Instant) -> f64 {
        (**self).level(now)
    }
}

/// Compiles and runs the examples in `docs/retry-budget.md` as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/retry-budget.md")]
pub struct RetryBudgetGuide;
