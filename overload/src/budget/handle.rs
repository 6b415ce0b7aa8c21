//! [`RetryBudgetHandle`]: one client's budget, shared by the driver and the application.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use super::{Acceptance, Budget};
use crate::stats::{OverloadStats, OverloadStatsRecorder};
use crate::trace::TARGET;

/// Who asks the budget for a retry: counted and logged separately, drawn from one budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RetryOrigin {
    /// The driver's retry loop, retrying one attempt of an operation.
    Driver,
    /// An application retry loop, running a failed operation again.
    Application,
}

impl RetryOrigin {
    /// The name in logs and metric labels: `driver` or `application`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Driver => "driver",
            Self::Application => "application",
        }
    }
}

/// A cloneable handle on one client's retry budget. Clones share the budget and the client's
/// statistics; they are cheap (one reference count) and can be moved into any task.
///
/// The driver deposits at every operation's first attempt and withdraws before every retry;
/// an application retry loop calls [`Self::try_withdraw`] before it runs a failed operation
/// again and gives up (returning the error it has) when that says no. The re-run operation is
/// an ordinary first attempt for the driver and deposits like one, so application retries earn
/// a share of credit too: with share `r`, application and driver retries together stay below
/// `r / (1 − r)` of the application's requests (9.9 % at the default 9 %), plus the floor.
///
/// Every decision is counted in the client's overload statistics (`OverloadStatsRecorder`) and
/// logged at DEBUG on the `mongodb::overload` target (see `budget_decisions_enabled`).
#[derive(Clone)]
pub struct RetryBudgetHandle {
    inner: Arc<Shared>,
}

struct Shared {
    budget: Box<dyn Budget + Send + Sync>,
    stats: Arc<OverloadStatsRecorder>,
    clock: fn() -> Instant,
    /// What the client's servers accepted recently: while they reject most of its attempts
    /// for overload, the budget admits no retry ([`Self::shedding`]).
    acceptance: Option<Arc<Acceptance>>,
}

impl Shared {
    /// Whether the servers rejected most of the client's recent attempts for overload
    /// ([`Acceptance::mostly_accepted`] says no). A server that sheds that much is past its
    /// capacity, not failing by chance: a retry that gets in takes the place of another
    /// request, and one that does not costs the server a rejection, so neither the share nor
    /// the floor admits one. Random and transient rejections, which leave most attempts
    /// accepted, keep the budget's usual rule.
    fn shedding(&self, now: Instant) -> bool {
        self.acceptance
            .as_ref()
            .is_some_and(|acceptance| !acceptance.mostly_accepted(now))
    }
}

impl fmt::Debug for RetryBudgetHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudgetHandle")
            .field("level", &self.level())
            .finish_non_exhaustive()
    }
}

impl RetryBudgetHandle {
    /// A handle on `budget` that records decisions in `stats` and reads the time from `clock`
    /// for the methods that take none (the driver passes tokio's clock, so a paused test clock
    /// governs application retries too).
    pub fn new(
        budget: impl Budget + Send + Sync + 'static,
        stats: Arc<OverloadStatsRecorder>,
        clock: fn() -> Instant,
    ) -> Self {
        Self::build(Box::new(budget), stats, clock, None)
    }

    /// The same handle, refusing every retry while `acceptance` shows the client's servers
    /// rejecting most of its attempts for overload (see `Shared::shedding`). The controller
    /// builds its budget so; a handle without it follows the share and the floor alone.
    pub fn refusing_while_shed(
        budget: impl Budget + Send + Sync + 'static,
        stats: Arc<OverloadStatsRecorder>,
        clock: fn() -> Instant,
        acceptance: Arc<Acceptance>,
    ) -> Self {
        Self::build(Box::new(budget), stats, clock, Some(acceptance))
    }

    fn build(
        budget: Box<dyn Budget + Send + Sync>,
        stats: Arc<OverloadStatsRecorder>,
        clock: fn() -> Instant,
        acceptance: Option<Arc<Acceptance>>,
    ) -> Self {
        let inner = Shared {
            budget,
            stats,
            clock,
            acceptance,
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// For application retry loops: whether the application may run a failed operation again
    /// now. `true` charges the budget one retry, so call it only right before retrying; `false`
    /// means give up and return the error in hand.
    pub fn try_withdraw(&self) -> bool {
        self.withdraw_at(RetryOrigin::Application, None, (self.inner.clock)())
    }

    /// For the driver: asks for one retry of `operation` (a command name, for the log) at
    /// `now`, counts the decision, and logs it.
    pub fn withdraw_at(&self, origin: RetryOrigin, operation: Option<&str>, now: Instant) -> bool {
        let admitted = !self.inner.shedding(now) && self.inner.budget.withdraw(now);
        self.inner.stats.record_budget_decision(origin, admitted);
        let logging = budget_decisions_enabled();
        if logging || cfg!(feature = "metrics") {
            // Reading the level takes the budget's lock again: only when someone listens.
            let level = self.inner.budget.level(now);
            self.inner.stats.record_budget_level(level);
            if logging {
                log_decision(origin, operation, admitted, level);
            }
        }
        admitted
    }

    /// For the driver: whether a retry of `operation` may be made at `now`, asked when it is
    /// decided, before its backoff; it is paid for with [`Self::withdraw_at`] when it is sent.
    /// Counts and logs a refusal, not an admission (the withdrawal does that).
    pub fn has_credit_at(
        &self,
        origin: RetryOrigin,
        operation: Option<&str>,
        now: Instant,
    ) -> bool {
        let level = self.inner.budget.level(now);
        let admitted = level >= 1.0 && !self.inner.shedding(now);
        if !admitted {
            self.inner.stats.record_budget_decision(origin, false);
            self.inner.stats.record_budget_level(level);
            if budget_decisions_enabled() {
                log_decision(origin, operation, false, level);
            }
        }
        admitted
    }

    /// For the driver: one operation's first attempt at `now`.
    pub fn deposit_at(&self, now: Instant) {
        self.inner.budget.deposit(now);
    }

    /// For the driver's controller: an operation whose `retries` budgeted retries ended in a
    /// success at `now`, while the servers accepted most attempts (the module documentation,
    /// "Why refunds").
    pub fn refund_at(&self, retries: u32, now: Instant) {
        if retries == 0 {
            return;
        }
        self.inner.budget.refund(retries, now);
        self.inner.stats.record_budget_refund(retries);
    }

    /// Retries the budget would admit now (the budget's `level`).
    pub fn level(&self) -> f64 {
        self.level_at((self.inner.clock)())
    }

    /// Retries the budget would admit at `now`.
    pub fn level_at(&self, now: Instant) -> f64 {
        self.inner.budget.level(now)
    }

    /// The client's statistics, with the budget's level now.
    pub fn snapshot(&self) -> OverloadStats {
        self.inner.stats.snapshot(Some(self.level()))
    }
}

/// Whether budget decisions would be logged, so callers can skip assembling them.
pub fn budget_decisions_enabled() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
}

/// Logs one budget decision at DEBUG: under overload there is one per failed attempt, too many
/// for INFO. A refusal is the line an operator looks for when an operation failed with an
/// overload error after fewer than `maxAdaptiveRetries` retries.
fn log_decision(origin: RetryOrigin, operation: Option<&str>, admitted: bool, level: f64) {
    if admitted {
        tracing::debug!(
            target: TARGET,
            origin = origin.as_str(),
            operation,
            budgetLevel = level,
            "retry budget admitted a retry"
        );
    } else {
        tracing::debug!(
            target: TARGET,
            origin = origin.as_str(),
            operation,
            budgetLevel = level,
            "retry budget refused a retry"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::budget::{RetryBudget, RetryBudgetConfig};

    /// Runs `f` with a subscriber that keeps what it formats at DEBUG, and returns the text.
    fn captured(f: impl FnOnce()) -> String {
        crate::trace::capture::captured(tracing::Level::DEBUG, f)
    }

    /// A handle with a floor of `reserve` retries in total (no share, no refill within the test).
    fn handle_with_reserve(reserve: u32) -> (RetryBudgetHandle, Arc<OverloadStatsRecorder>) {
        let config = RetryBudgetConfig {
            window: Duration::from_secs(60),
            min_retries_per_sec: 0,
            retry_percent: 100.0,
        };
        let start = Instant::now();
        let budget = RetryBudget::starting_at(config, start).unwrap();
        let stats = Arc::new(OverloadStatsRecorder::new());
        let handle = RetryBudgetHandle::new(budget, Arc::clone(&stats), Instant::now);
        for _ in 0..reserve {
            handle.deposit_at(start);
        }
        (handle, stats)
    }

    #[test]
    fn driver_and_application_draw_from_one_budget() {
        let (handle, stats) = handle_with_reserve(3);
        let app = handle.clone();
        let now = Instant::now();
        assert!(handle.withdraw_at(RetryOrigin::Driver, Some("find"), now));
        assert!(app.try_withdraw());
        assert!(handle.withdraw_at(RetryOrigin::Driver, Some("insert"), now));
        assert!(
            !app.try_withdraw(),
            "three deposits bought three retries, whoever asked"
        );
        assert!(!handle.withdraw_at(RetryOrigin::Driver, None, now));
        let snapshot = stats.snapshot(None);
        assert_eq!(snapshot.application_retries_made, 1);
        assert_eq!(snapshot.application_retries_refused, 1);
        assert_eq!(snapshot.retries_refused, 1);
        assert_eq!(
            snapshot.retries_made, 0,
            "the driver counts a retry as made when it sends it, not when the budget admits it"
        );
    }

    #[test]
    fn clones_move_into_other_threads() {
        let (handle, _) = handle_with_reserve(50);
        let admitted: usize = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..2)
                .map(|_| {
                    let app = handle.clone();
                    scope.spawn(move || (0..40).filter(|_| app.try_withdraw()).count())
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert_eq!(admitted, 50);
    }

    #[test]
    fn every_decision_is_logged_with_origin_operation_and_level() {
        let (handle, _) = handle_with_reserve(1);
        let now = Instant::now();
        let text = captured(|| {
            assert!(budget_decisions_enabled());
            assert!(handle.withdraw_at(RetryOrigin::Driver, Some("find"), now));
            assert!(!handle.try_withdraw());
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        for needle in [
            "DEBUG",
            "mongodb::overload",
            "retry budget admitted a retry",
            "origin=\"driver\"",
            "operation=\"find\"",
            "budgetLevel=0",
        ] {
            assert!(
                lines[0].contains(needle),
                "missing {needle} in {}",
                lines[0]
            );
        }
        for needle in ["retry budget refused a retry", "origin=\"application\""] {
            assert!(
                lines[1].contains(needle),
                "missing {needle} in {}",
                lines[1]
            );
        }
    }

    #[test]
    fn a_handle_on_an_arc_shares_the_budget_with_its_owner() {
        let start = Instant::now();
        let config = RetryBudgetConfig {
            min_retries_per_sec: 0,
            ..RetryBudgetConfig::default()
        };
        let budget = Arc::new(RetryBudget::starting_at(config, start).unwrap());
        let stats = Arc::new(OverloadStatsRecorder::new());
        let handle = RetryBudgetHandle::new(Arc::clone(&budget), stats, Instant::now);
        for _ in 0..100 {
            budget.deposit(start);
        }
        assert_eq!(handle.level_at(start), 9.0, "100 first attempts at 9 %");
        assert!(handle.withdraw_at(RetryOrigin::Driver, None, start));
        assert_eq!(budget.level(start), 8.0);
    }

    #[test]
    fn the_snapshot_carries_the_level_now() {
        let (handle, _) = handle_with_reserve(2);
        assert_eq!(handle.snapshot().budget_level, Some(2.0));
        assert!(format!("{handle:?}").contains("level: 2.0"));
    }
}
