//! [`RetryBudget`]: a share of recent first attempts plus a floor (see the module essay).

use std::fmt;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Budget;

/// Connection-string name of [`RetryBudgetConfig::retry_percent`].
pub const OPTION_PERCENT: &str = "retryBudgetPercent";
/// Connection-string name of [`RetryBudgetConfig::min_retries_per_sec`].
pub const OPTION_MIN_PER_SEC: &str = "retryBudgetMinPerSec";
/// Connection-string name of [`RetryBudgetConfig::window`] (in milliseconds).
pub const OPTION_WINDOW_MS: &str = "retryBudgetWindowMS";

/// Default share: retries may add 9 % to the first attempts. The target is at most 1.10
/// attempts per request under sustained overload, which has to hold the share and the floor
/// together: at the lab's 375 requests per second per client, 9 % plus the default floor is
/// 1.093. (gRPC's example throttling, `tokenRatio: 0.1`, and the withdrawn specification bucket,
/// 0.1 per success, aim for 10 % without a floor.)
pub const DEFAULT_RETRY_PERCENT: f64 = 9.0;
/// Default floor: one retry per second, a reserve of 10 retries with the default window. Enough
/// for several operations that each fail twice in a row on an idle client; small enough that it
/// adds under 0.3 % to a client sending a few hundred requests per second.
pub const DEFAULT_MIN_RETRIES_PER_SEC: u32 = 1;
/// Default window: deposits expire after 10 seconds (Finagle's, tower's and Linkerd's value).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);

/// The largest share: ten retries per first attempt (Finagle's bound). Past that a budget bounds
/// nothing that `maxAdaptiveRetries` does not.
pub const MAX_RETRY_PERCENT: f64 = 1000.0;
/// The largest floor. A floor this high is no budget at all, but it keeps the reserve's
/// arithmetic far from overflow.
pub const MAX_MIN_RETRIES_PER_SEC: u32 = 100_000;
/// The shortest window (Finagle's bound). Shorter windows forget the traffic that paid for a
/// retry before the retry's backoff is over.
pub const MIN_WINDOW: Duration = Duration::from_secs(1);
/// The longest window (Finagle's bound). Longer windows let a quiet minute bank credit for a
/// storm.
pub const MAX_WINDOW: Duration = Duration::from_secs(60);

/// One retry, in the budget's fixed-point units. A deposit is `percent × 1000` units, so the
/// share has a resolution of 0.001 %, and every amount is an integer: no rounding drift over
/// millions of deposits.
const RETRY_COST: u64 = 100_000;
/// Units per percent of a retry.
const UNITS_PER_PERCENT: f64 = (RETRY_COST / 100) as f64;
/// Deposits are kept in this many slots of `window / SLOTS` each; a slot's deposits expire
/// together, between `window × (SLOTS − 1) / SLOTS` and `window` after they were made.
const SLOTS: usize = 10;
const NANOS_PER_SEC: u128 = 1_000_000_000;

/// The options of a [`RetryBudget`], as the connection string and `ClientOptions` give them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryBudgetConfig {
    /// `retryBudgetWindowMS`: how long a deposit stays available, and the period over which
    /// the reserve refills. From [`MIN_WINDOW`] to [`MAX_WINDOW`]; default [`DEFAULT_WINDOW`].
    pub window: Duration,
    /// `retryBudgetMinPerSec`: retries per second admitted whatever the traffic (the floor).
    /// From 0 (no floor) to [`MAX_MIN_RETRIES_PER_SEC`]; default
    /// [`DEFAULT_MIN_RETRIES_PER_SEC`].
    pub min_retries_per_sec: u32,
    /// `retryBudgetPercent`: retries allowed per 100 first attempts, on top of the floor. From
    /// 0 to [`MAX_RETRY_PERCENT`], fractions allowed (resolution 0.001); default
    /// [`DEFAULT_RETRY_PERCENT`]. With 10, a client sending 1000 requests per second may make
    /// 100 retries per second plus the floor.
    pub retry_percent: f64,
}

impl Default for RetryBudgetConfig {
    /// 10 s window, floor of 1 retry per second, 9 %.
    fn default() -> Self {
        Self {
            window: DEFAULT_WINDOW,
            min_retries_per_sec: DEFAULT_MIN_RETRIES_PER_SEC,
            retry_percent: DEFAULT_RETRY_PERCENT,
        }
    }
}

impl RetryBudgetConfig {
    /// Checks every option against its range.
    ///
    /// # Errors
    ///
    /// [`InvalidBudgetConfig`] naming the first option out of range:
    /// - `retryBudgetWindowMS` below 1000 or above 60000;
    /// - `retryBudgetMinPerSec` above 100000;
    /// - `retryBudgetPercent` negative, above 1000, or not a number.
    pub fn validate(&self) -> Result<(), InvalidBudgetConfig> {
        if !(MIN_WINDOW..=MAX_WINDOW).contains(&self.window) {
            return Err(InvalidBudgetConfig {
                option: OPTION_WINDOW_MS,
                value: format!("{}", self.window.as_secs_f64() * 1000.0),
                range: "from 1000 to 60000 milliseconds",
            });
        }
        if self.min_retries_per_sec > MAX_MIN_RETRIES_PER_SEC {
            return Err(InvalidBudgetConfig {
                option: OPTION_MIN_PER_SEC,
                value: self.min_retries_per_sec.to_string(),
                range: "from 0 to 100000 retries per second",
            });
        }
        // `contains` is false for NaN, so NaN is refused here too.
        if !(0.0..=MAX_RETRY_PERCENT).contains(&self.retry_percent) {
            return Err(InvalidBudgetConfig {
                option: OPTION_PERCENT,
                value: self.retry_percent.to_string(),
                range: "a number from 0 to 1000 (percent of first attempts)",
            });
        }
        Ok(())
    }
}

/// A retry-budget option out of its range. Its message names the connection-string option, the
/// value given and the valid range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidBudgetConfig {
    option: &'static str,
    value: String,
    range: &'static str,
}

impl InvalidBudgetConfig {
    /// The connection-string name of the option, e.g. `retryBudgetPercent`.
    pub fn option(&self) -> &'static str {
        self.option
    }
}

impl fmt::Display for InvalidBudgetConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid {}: {} is not {}",
            self.option, self.value, self.range
        )
    }
}

impl std::error::Error for InvalidBudgetConfig {}

/// A retry budget of a share of recent first attempts plus a floor; see the
/// [module documentation](super) for the mechanism and its bound.
///
/// Thread safety: the state sits behind one [`Mutex`], taken once per deposit and once per
/// withdrawal for a few dozen instructions (at most ten slots are cleared or visited). An
/// atomic design would avoid the lock, but a withdrawal must check the total and take from
/// several slots and the reserve as one step, or two racing withdrawals could both pass the
/// check and overdraw; with atomics that needs a compare-and-swap loop over a packed state
/// that cannot hold ten slots. At the rates one client reaches (tens of thousands of
/// operations per second, each taking the lock once or twice) the lock is rarely contended,
/// and each operation also takes several locks inside the driver's connection pool.
#[derive(Debug)]
pub struct RetryBudget {
    config: RetryBudgetConfig,
    /// Units one deposit adds.
    deposit_units: u64,
    /// The reserve's size in units: `min_retries_per_sec × window` retries.
    reserve_capacity: u64,
    /// Units the reserve refills per second: `min_retries_per_sec` retries.
    reserve_per_sec: u64,
    slot_nanos: u64,
    ledger: Mutex<Ledger>,
}

/// The budget's mutable state. Times are nanoseconds since `origin`.
#[derive(Debug)]
struct Ledger {
    origin: Instant,
    /// The latest time seen: later calls with earlier times are treated as this time.
    latest: u64,
    /// The number (time / slot length) of the newest slot, kept in `credits[newest % SLOTS]`.
    newest: u64,
    /// Unspent deposits per slot, in units.
    credits: [u64; SLOTS],
    /// Unspent reserve, in units, at most `reserve_capacity`.
    reserve: u64,
    /// The time up to which the reserve's refill has been counted.
    refilled_to: u64,
}

impl RetryBudget {
    /// A budget with these options; it starts with a full reserve and no deposits.
    ///
    /// # Errors
    ///
    /// [`InvalidBudgetConfig`] as [`RetryBudgetConfig::validate`] gives it.
    pub fn new(config: RetryBudgetConfig) -> Result<Self, InvalidBudgetConfig> {
        Self::starting_at(config, Instant::now())
    }

    /// As [`Self::new`], with the budget's clock starting at `origin`: times before it count as
    /// `origin`. Tests pass the same instant they then advance from.
    ///
    /// # Errors
    ///
    /// [`InvalidBudgetConfig`] as [`RetryBudgetConfig::validate`] gives it.
    pub fn starting_at(
        config: RetryBudgetConfig,
        origin: Instant,
    ) -> Result<Self, InvalidBudgetConfig> {
        config.validate()?;
        // Validation bounds every product below: percent ≤ 1000 gives ≤ 1e6 units per deposit;
        // the reserve is ≤ 1e5 retries/s × 60 s × 1e5 units = 6e11 units.
        let deposit_units = (config.retry_percent * UNITS_PER_PERCENT).round() as u64;
        let window_nanos = config.window.as_nanos() as u64;
        let reserve_per_sec = u64::from(config.min_retries_per_sec) * RETRY_COST;
        let reserve_capacity =
            (u128::from(reserve_per_sec) * u128::from(window_nanos) / NANOS_PER_SEC) as u64;
        Ok(Self {
            config,
            deposit_units,
            reserve_capacity,
            reserve_per_sec,
            slot_nanos: window_nanos / SLOTS as u64,
            ledger: Mutex::new(Ledger {
                origin,
                latest: 0,
                newest: 0,
                credits: [0; SLOTS],
                reserve: reserve_capacity,
                refilled_to: 0,
            }),
        })
    }

    /// The options the budget was built with.
    pub fn config(&self) -> RetryBudgetConfig {
        self.config
    }

    /// The ledger brought up to `now`: expired slots cleared, the reserve refilled.
    fn ledger_at(&self, now: Instant) -> MutexGuard<'_, Ledger> {
        // No code panics while holding the lock, so a poisoned lock still guards a consistent
        // ledger; recovering it keeps one panicking caller elsewhere from disabling retries.
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        let since_origin = now.saturating_duration_since(ledger.origin).as_nanos();
        let t = u64::try_from(since_origin)
            .unwrap_or(u64::MAX)
            .max(ledger.latest);
        ledger.latest = t;

        let slot = t / self.slot_nanos;
        if slot > ledger.newest {
            // Clear the slots that time has moved past; after SLOTS of them every slot is clear,
            // so the loop is bounded however long the client was idle.
            let to_clear = (slot - ledger.newest).min(SLOTS as u64);
            for step in 1..=to_clear {
                let index = ((ledger.newest + step) % SLOTS as u64) as usize;
                ledger.credits[index] = 0;
            }
            ledger.newest = slot;
        }

        if ledger.reserve >= self.reserve_capacity || self.reserve_per_sec == 0 {
            // Full (or no floor): nothing to refill, and time while full earns nothing.
            ledger.refilled_to = t;
        } else {
            let elapsed = u128::from(t - ledger.refilled_to);
            let earned = elapsed * u128::from(self.reserve_per_sec) / NANOS_PER_SEC;
            let room = self.reserve_capacity - ledger.reserve;
            if earned >= u128::from(room) {
                ledger.reserve = self.reserve_capacity;
                ledger.refilled_to = t;
            } else {
                // Count only the time the earned units stand for (rounded up, so never more
                // than `elapsed`); the remainder earns its unit on a later call. Without the
                // carry, calls closer together than one unit's time would never refill.
                let earned_nanos =
                    (earned * NANOS_PER_SEC).div_ceil(u128::from(self.reserve_per_sec));
                ledger.reserve += earned as u64;
                ledger.refilled_to += earned_nanos as u64;
            }
        }
        ledger
    }
}

impl Ledger {
    fn available(&self) -> u64 {
        self.credits
            .iter()
            .fold(self.reserve, |sum, credit| sum.saturating_add(*credit))
    }
}

impl Budget for RetryBudget {
    fn deposit(&self, now: Instant) {
        let mut ledger = self.ledger_at(now);
        let index = (ledger.newest % SLOTS as u64) as usize;
        ledger.credits[index] = ledger.credits[index].saturating_add(self.deposit_units);
    }

    fn withdraw(&self, now: Instant) -> bool {
        let mut ledger = self.ledger_at(now);
        if ledger.available() < RETRY_COST {
            return false;
        }
        let mut owed = RETRY_COST;
        // Oldest slot first: it expires soonest, so spending it first wastes the least. The
        // slot `age` slots before the newest sits `age` places back in the ring, wrapping.
        let newest_index = (ledger.newest % SLOTS as u64) as usize;
        for age in (0..SLOTS).rev() {
            let index = (newest_index + SLOTS - age) % SLOTS;
            let taken = ledger.credits[index].min(owed);
            ledger.credits[index] -= taken;
            owed -= taken;
        }
        // `available() >= RETRY_COST` guarantees the reserve covers what the slots did not.
        ledger.reserve -= owed;
        true
    }

    fn refund(&self, retries: u32, now: Instant) {
        // Into the newest slot, like a deposit: a refund made now expires a window from now,
        // so it pays for retries in the same period a deposit would.
        let mut ledger = self.ledger_at(now);
        let index = (ledger.newest % SLOTS as u64) as usize;
        let units = u64::from(retries).saturating_mul(RETRY_COST);
        ledger.credits[index] = ledger.credits[index].saturating_add(units);
    }

    fn level(&self, now: Instant) -> f64 {
        self.ledger_at(now).available() as f64 / RETRY_COST as f64
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn budget(percent: f64, min_per_sec: u32, window_secs: u64) -> (RetryBudget, Instant) {
        let start = Instant::now();
        let config = RetryBudgetConfig {
            window: Duration::from_secs(window_secs),
            min_retries_per_sec: min_per_sec,
            retry_percent: percent,
        };
        (RetryBudget::starting_at(config, start).unwrap(), start)
    }

    fn at(start: Instant, millis: u64) -> Instant {
        start + Duration::from_millis(millis)
    }

    #[test]
    fn defaults_are_the_documented_values() {
        let config = RetryBudgetConfig::default();
        assert_eq!(config.window, Duration::from_secs(10));
        assert_eq!(config.min_retries_per_sec, 1);
        assert_eq!(config.retry_percent, 9.0);
        let (b, start) = (RetryBudget::new(config).unwrap(), Instant::now());
        assert_eq!(
            b.level(start),
            10.0,
            "a fresh budget holds the full reserve"
        );
    }

    #[test]
    fn invalid_options_are_named_in_the_error() {
        let cases = [
            (
                RetryBudgetConfig {
                    window: Duration::from_millis(999),
                    ..Default::default()
                },
                OPTION_WINDOW_MS,
                "invalid retryBudgetWindowMS: 999 is not from 1000 to 60000 milliseconds",
            ),
            (
                RetryBudgetConfig {
                    window: Duration::from_millis(60_001),
                    ..Default::default()
                },
                OPTION_WINDOW_MS,
                "invalid retryBudgetWindowMS: 60001 is not from 1000 to 60000 milliseconds",
            ),
            (
                RetryBudgetConfig {
                    min_retries_per_sec: 100_001,
                    ..Default::default()
                },
                OPTION_MIN_PER_SEC,
                "invalid retryBudgetMinPerSec: 100001 is not from 0 to 100000 retries per second",
            ),
            (
                RetryBudgetConfig {
                    retry_percent: -0.5,
                    ..Default::default()
                },
                OPTION_PERCENT,
                "invalid retryBudgetPercent: -0.5 is not a number from 0 to 1000 (percent of \
                 first attempts)",
            ),
            (
                RetryBudgetConfig {
                    retry_percent: 1000.5,
                    ..Default::default()
                },
                OPTION_PERCENT,
                "invalid retryBudgetPercent: 1000.5 is not a number from 0 to 1000 (percent of \
                 first attempts)",
            ),
        ];
        for (config, option, message) in cases {
            let err = RetryBudget::new(config).unwrap_err();
            assert_eq!(err.option(), option);
            assert_eq!(err.to_string(), message);
        }
        let nan = RetryBudgetConfig {
            retry_percent: f64::NAN,
            ..Default::default()
        };
        assert_eq!(nan.validate().unwrap_err().option(), OPTION_PERCENT);
    }

    #[test]
    fn range_bounds_are_accepted() {
        for (window, min, percent) in [(1_000, 0, 0.0), (60_000, 100_000, 1000.0)] {
            let config = RetryBudgetConfig {
                window: Duration::from_millis(window),
                min_retries_per_sec: min,
                retry_percent: percent,
            };
            assert!(RetryBudget::new(config).is_ok(), "{config:?}");
        }
    }

    #[test]
    fn zero_share_and_zero_floor_admit_no_retry() {
        let (b, start) = budget(0.0, 0, 10);
        for i in 0..1000 {
            b.deposit(at(start, i));
        }
        assert!(!b.withdraw(at(start, 1000)));
        assert_eq!(b.level(at(start, 1000)), 0.0);
    }

    #[test]
    fn ten_percent_of_first_attempts_buys_one_retry_per_ten() {
        let (b, start) = budget(10.0, 0, 10);
        for _ in 0..9 {
            b.deposit(start);
        }
        assert!(!b.withdraw(start), "nine deposits are 0.9 of a retry");
        b.deposit(start);
        assert!(b.withdraw(start));
        assert!(!b.withdraw(start), "the one retry is spent");
    }

    #[test]
    fn deposits_expire_after_the_window() {
        let (b, start) = budget(100.0, 0, 10);
        b.deposit(start);
        assert_eq!(b.level(at(start, 9_999)), 1.0);
        assert!(!b.withdraw(at(start, 10_000)), "expired at 10 s");
    }

    #[test]
    fn the_reserve_refills_at_the_floor_rate() {
        let (b, start) = budget(0.0, 2, 10);
        for _ in 0..20 {
            assert!(b.withdraw(start), "the reserve holds 2/s × 10 s");
        }
        assert!(!b.withdraw(start));
        assert!(
            !b.withdraw(at(start, 499)),
            "one retry takes 500 ms to earn"
        );
        assert!(b.withdraw(at(start, 500)));
        // Many calls closer together than one unit's time still add up: the carry.
        let mut admitted = 0;
        for micros in 1..=1_000_000u64 {
            // One call every microsecond for a second (500 ms to 1.5 s).
            if b.withdraw(at(start, 500) + Duration::from_micros(micros)) {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 2, "2 retries per second, however often one asks");
    }

    #[test]
    fn the_reserve_does_not_grow_past_its_capacity() {
        let (b, start) = budget(0.0, 1, 10);
        assert_eq!(b.level(at(start, 3_600_000)), 10.0);
    }

    #[test]
    fn deposits_are_spent_before_the_reserve() {
        let (b, start) = budget(100.0, 1, 10);
        b.deposit(start);
        assert!(b.withdraw(start));
        assert_eq!(b.level(start), 10.0, "the reserve is untouched");
    }

    #[test]
    fn the_oldest_deposits_are_spent_first() {
        let (b, start) = budget(100.0, 0, 10);
        b.deposit(start); // slot 0, expires at 10 s
        b.deposit(at(start, 5_000)); // slot 5, expires at 15 s
        assert!(b.withdraw(at(start, 8_000)));
        // Had the withdrawal taken the slot-5 deposit, nothing would be left at 10 s.
        assert_eq!(b.level(at(start, 10_000)), 1.0);
        assert_eq!(b.level(at(start, 15_000)), 0.0);
    }

    #[test]
    fn time_going_backwards_counts_as_the_latest_time() {
        let (b, start) = budget(100.0, 0, 10);
        b.deposit(at(start, 20_000));
        // Earlier times must neither resurrect expired deposits nor expire the new one.
        assert_eq!(b.level(at(start, 5_000)), 1.0);
        assert_eq!(b.level(start - Duration::from_secs(60)), 1.0);
        assert!(b.withdraw(at(start, 1)));
    }

    #[test]
    fn shared_across_threads_it_never_overdraws() {
        let (b, start) = budget(10.0, 0, 10);
        for _ in 0..1000 {
            b.deposit(start);
        }
        let admitted: usize = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    let b = &b;
                    scope.spawn(move || (0..100).filter(|_| b.withdraw(start)).count())
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert_eq!(
            admitted, 100,
            "1000 first attempts at 10 % buy exactly 100 retries"
        );
    }

    /// One client at 200 % of capacity for a minute: 375 requests per second (the lab's
    /// per-instance rate), every attempt fails, and every failure asks for a retry up to the
    /// specification's two per operation. The budget must hold attempts per request to the
    /// issue's target, 1.10, and must actually engage (retries do not stop at the cap).
    #[test]
    fn sustained_overload_bounds_attempts_per_request() {
        let (b, start) = budget(DEFAULT_RETRY_PERCENT, DEFAULT_MIN_RETRIES_PER_SEC, 10);
        let (rate, secs) = (375u64, 60u64);
        let (mut first_attempts, mut retries) = (0u64, 0u64);
        for i in 0..rate * secs {
            let now = start + Duration::from_nanos(i * 1_000_000_000 / rate);
            b.deposit(now);
            first_attempts += 1;
            for _ in 0..2 {
                if !b.withdraw(now) {
                    break; // refused: the operation returns its last error
                }
                retries += 1;
            }
        }
        let per_request = 1.0 + retries as f64 / first_attempts as f64;
        // 9 % plus the floor: 1/s over the run plus the initial 10-retry reserve.
        let bound = 1.0 + 0.09 + (secs + 10) as f64 / first_attempts as f64;
        assert!(per_request <= bound, "{per_request} > {bound}");
        assert!(per_request <= 1.10, "the issue's target: {per_request}");
        assert!(
            per_request >= 1.08,
            "the budget starved retries: {per_request}"
        );
    }

    /// One request per second for an hour, 5 % transient failures (every 20th operation fails
    /// twice before it succeeds): every retry the specification calls for is admitted.
    #[test]
    fn low_rate_transient_errors_are_all_retried() {
        let (b, start) = budget(DEFAULT_RETRY_PERCENT, DEFAULT_MIN_RETRIES_PER_SEC, 10);
        let mut refused = 0;
        for second in 0..3600u64 {
            let now = at(start, second * 1000);
            b.deposit(now);
            if second % 20 == 0 {
                for retry in 0..2u64 {
                    // Each retry follows its backoff (at most 200 ms, then 400 ms).
                    if !b.withdraw(now + Duration::from_millis(200 * (retry + 1))) {
                        refused += 1;
                    }
                }
            }
        }
        assert_eq!(refused, 0);
    }

    /// A cold client whose first operations all fail twice (a failover right after start-up):
    /// the reserve covers five such operations at once.
    #[test]
    fn a_cold_client_can_retry_at_once() {
        let (b, start) = budget(DEFAULT_RETRY_PERCENT, DEFAULT_MIN_RETRIES_PER_SEC, 10);
        for _ in 0..5 {
            b.deposit(start);
            assert!(b.withdraw(start) && b.withdraw(start));
        }
    }

    #[test]
    fn a_refund_buys_retries_until_its_window_ends() {
        let (b, start) = budget(0.0, 0, 10);
        assert!(!b.withdraw(start), "no share, no floor");
        b.refund(2, start);
        assert_eq!(b.level(start), 2.0);
        assert!(b.withdraw(at(start, 9_999)));
        assert_eq!(b.level(at(start, 9_999)), 1.0);
        assert_eq!(
            b.level(at(start, 10_000)),
            0.0,
            "refunds expire like deposits"
        );
    }

    /// A deterministic coin for the simulations: `true` with probability `share`, from a hash
    /// of `n`, so the tests need no random-number generator and never flake.
    fn coin(n: u64, share: f64) -> bool {
        let mut x = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        ((x >> 11) as f64 / (1u64 << 53) as f64) < share
    }

    /// One client at the lab's 375 requests per second for a minute meets random transient
    /// errors: every attempt, retries included, fails with probability `share` whatever the
    /// load, and each operation makes up to two retries, giving back what it paid if it then
    /// succeeds. Returns (retries refused, operations that failed).
    fn transient_errors(share: f64) -> (u64, u64) {
        let (b, start) = budget(DEFAULT_RETRY_PERCENT, DEFAULT_MIN_RETRIES_PER_SEC, 10);
        let (rate, secs) = (375u64, 60u64);
        let (mut refused, mut failed, mut draw) = (0u64, 0u64, 0u64);
        for i in 0..rate * secs {
            let now = start + Duration::from_nanos(i * 1_000_000_000 / rate);
            b.deposit(now);
            let mut paid = 0;
            let mut succeeded = false;
            for attempt in 0..3 {
                draw += 1;
                if !coin(draw, share) {
                    succeeded = true;
                    break;
                }
                if attempt == 2 {
                    break;
                }
                if !b.withdraw(now) {
                    refused += 1;
                    break;
                }
                paid += 1;
            }
            if succeeded {
                b.refund(paid, now);
            } else {
                failed += 1;
            }
        }
        (refused, failed)
    }

    /// Transient errors above the share (30 % of attempts, against 9 %) no longer starve
    /// retries: only operations that fail three times in a row are charged (0.3³ × 2 retries
    /// = 5.4 % of first attempts), so every retry is admitted and the operations that fail are
    /// the 2.7 % that no retry policy of two retries can save. Without refunds this run
    /// refuses thousands of retries (checked below with a budget that is never refunded).
    #[test]
    fn transient_errors_above_the_share_are_all_retried() {
        for share in [0.01, 0.05, 0.15, 0.30] {
            let (refused, failed) = transient_errors(share);
            assert_eq!(refused, 0, "at {share}");
            let expected = share.powi(3) * 22_500.0;
            assert!(
                (failed as f64) < expected * 1.3 + 5.0,
                "{failed} operations failed at {share}, about {expected} expected"
            );
        }
        // The same errors against the budget as it was before refunds: 30 % starves.
        let (b, start) = budget(DEFAULT_RETRY_PERCENT, DEFAULT_MIN_RETRIES_PER_SEC, 10);
        let mut refused = 0;
        for i in 0..22_500u64 {
            let now = start + Duration::from_nanos(i * 1_000_000_000 / 375);
            b.deposit(now);
            for retry in 0..2 {
                if !coin(i * 3 + retry, 0.30) {
                    break;
                }
                if !b.withdraw(now) {
                    refused += 1;
                    break;
                }
            }
        }
        assert!(refused > 3_000, "{refused}");
    }

    /// Under overload the retries that fail are still charged. A client at 375 requests per
    /// second whose attempts succeed 40 % of the time (a server admitting 40 % of what it is
    /// sent) retries more than when nothing succeeds, since successful retries are given back,
    /// but the retries it pays for stay within the share: retries made minus retries refunded
    /// is at most 9 % of first attempts plus the floor. (This is the budget alone: in this
    /// regime the controller withholds refunds, since the servers reject most attempts;
    /// `Acceptance`.)
    #[test]
    fn under_overload_the_retries_paid_for_stay_within_the_share() {
        let (b, start) = budget(DEFAULT_RETRY_PERCENT, DEFAULT_MIN_RETRIES_PER_SEC, 10);
        let (rate, secs) = (375u64, 60u64);
        let (mut made, mut refunded, mut draw) = (0u64, 0u64, 0u64);
        for i in 0..rate * secs {
            let now = start + Duration::from_nanos(i * 1_000_000_000 / rate);
            b.deposit(now);
            // Each retry withdrawn is paid for, so the retries paid so far are `attempt`.
            for attempt in 0..3u32 {
                draw += 1;
                if !coin(draw, 0.6) {
                    b.refund(attempt, now);
                    refunded += u64::from(attempt);
                    break;
                }
                if attempt == 2 || !b.withdraw(now) {
                    break;
                }
                made += 1;
            }
        }
        let first = (rate * secs) as f64;
        let paid_for = (made - refunded) as f64;
        assert!(
            paid_for <= 0.09 * first + (secs + 10) as f64,
            "{paid_for} retries paid for"
        );
        let per_request = 1.0 + made as f64 / first;
        assert!(per_request > 1.10, "refunds added retries: {per_request}");
        assert!(per_request < 1.30, "{per_request}");
    }

    #[derive(Clone, Debug)]
    enum Event {
        Deposit,
        Withdraw,
        Refund,
        Level,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            3 => Just(Event::Deposit),
            3 => Just(Event::Withdraw),
            1 => Just(Event::Refund),
            1 => Just(Event::Level),
        ]
    }

    /// Steps of time in milliseconds, backwards steps included.
    fn step() -> impl Strategy<Value = i64> {
        prop_oneof![
            6 => 0i64..50,
            2 => 0i64..5_000,
            1 => 0i64..200_000,
            1 => -5_000i64..0,
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Over every interval [a, b] between two admitted withdrawals, the retries admitted
        /// are at most `percent × first attempts in [a − window, b] + retries refunded in
        /// [a − window, b] + floor × (b − a + window)` (plus one unit of rounding), the bound
        /// the module documentation states. A refund gives back one retry that was admitted
        /// earlier and not refunded yet, as the driver's refunds do.
        #[test]
        fn withdrawals_never_exceed_deposits_times_share_plus_floor(
            percent in 0.0f64..200.0,
            min_per_sec in 0u32..20,
            window_secs in 1u64..=60,
            events in proptest::collection::vec((step(), event()), 1..400),
        ) {
            let (b, start) = budget(percent, min_per_sec, window_secs);
            let window = window_secs * 1000;
            // The effective (clamped) time of each event, as the budget sees it.
            let (mut clock, mut latest) = (0i64, 0u64);
            let (mut deposits, mut withdrawals, mut refunds) = (Vec::new(), Vec::new(), Vec::new());
            for (step, event) in events {
                clock += step;
                let now = if clock >= 0 {
                    at(start, clock as u64)
                } else {
                    start - Duration::from_millis(clock.unsigned_abs())
                };
                latest = latest.max(clock.max(0) as u64);
                match event {
                    Event::Deposit => {
                        b.deposit(now);
                        deposits.push(latest);
                    }
                    Event::Withdraw => {
                        if b.withdraw(now) {
                            withdrawals.push(latest);
                        }
                    }
                    Event::Refund => {
                        if refunds.len() < withdrawals.len() {
                            b.refund(1, now);
                            refunds.push(latest);
                        }
                    }
                    Event::Level => {
                        let level = b.level(now);
                        prop_assert!(level >= 0.0 && level.is_finite(), "{level}");
                    }
                }
            }
            let share = (percent * UNITS_PER_PERCENT).round() / RETRY_COST as f64;
            for (i, &a) in withdrawals.iter().enumerate() {
                for (count, &end) in withdrawals[i..].iter().enumerate() {
                    let admitted = (count + 1) as f64;
                    let paid = deposits
                        .iter()
                        .filter(|&&d| d + window >= a && d <= end)
                        .count() as f64;
                    let given_back = refunds
                        .iter()
                        .filter(|&&r| r + window >= a && r <= end)
                        .count() as f64;
                    let floor_secs = (end - a + window) as f64 / 1000.0;
                    let bound =
                        share * paid + given_back + f64::from(min_per_sec) * floor_secs + 1e-5;
                    prop_assert!(
                        admitted <= bound,
                        "{admitted} retries in [{a}, {end}] ms, bound {bound}"
                    );
                }
            }
        }

        /// The level never goes negative or above deposits × share + reserve, and a withdrawal
        /// is admitted exactly when at least one retry's worth is available.
        #[test]
        fn balance_is_never_negative_and_withdrawals_match_the_level(
            percent in 0.0f64..=1000.0,
            min_per_sec in 0u32..=100_000,
            window_ms in 1_000u64..=60_000,
            events in proptest::collection::vec((step(), event()), 1..300),
        ) {
            let start = Instant::now();
            let config = RetryBudgetConfig {
                window: Duration::from_millis(window_ms),
                min_retries_per_sec: min_per_sec,
                retry_percent: percent,
            };
            let b = RetryBudget::starting_at(config, start).unwrap();
            let mut clock = 0i64;
            for (step, event) in events {
                clock += step;
                let now = if clock >= 0 {
                    at(start, clock as u64)
                } else {
                    start - Duration::from_millis(clock.unsigned_abs())
                };
                let before = b.level(now);
                prop_assert!(before >= 0.0 && before.is_finite());
                match event {
                    Event::Deposit => b.deposit(now),
                    Event::Withdraw => {
                        let admitted = b.withdraw(now);
                        prop_assert_eq!(admitted, before >= 1.0, "level {}", before);
                        let after = b.level(now);
                        let expected = if admitted { before - 1.0 } else { before };
                        prop_assert!((after - expected).abs() < 1e-6, "{before} -> {after}");
                    }
                    Event::Refund => {
                        b.refund(1, now);
                        let after = b.level(now);
                        prop_assert!((after - before - 1.0).abs() < 1e-6, "{before} -> {after}");
                    }
                    Event::Level => {}
                }
            }
        }

        /// Any time sequence, including instants far before the origin and far in the future.
        #[test]
        fn never_panics_on_any_time_sequence(
            offsets in proptest::collection::vec((any::<bool>(), any::<u32>(), 0u8..3), 1..200),
        ) {
            let (b, start) = budget(DEFAULT_RETRY_PERCENT, DEFAULT_MIN_RETRIES_PER_SEC, 10);
            for (before, secs, op) in offsets {
                let offset = Duration::from_secs(u64::from(secs));
                let now = if before {
                    start.checked_sub(offset).unwrap_or(start)
                } else {
                    start.checked_add(offset).unwrap_or(start)
                };
                match op {
                    0 => {
                        b.deposit(now);
                        b.refund(u32::MAX, now);
                    }
                    1 => {
                        b.withdraw(now);
                    }
                    _ => {
                        prop_assert!(b.level(now) >= 0.0);
                    }
                }
            }
        }
    }
}
