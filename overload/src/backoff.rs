//! Full-jitter exponential backoff for retries after overload errors.
//!
//! The Client Backpressure specification fixes the formula:
//!
//! ```text
//! backoff = jitter * min(MAX_BACKOFF, base * 2^attempt)
//! ```
//!
//! with `jitter` uniform in `[0, 1)`, `MAX_BACKOFF` 10 s, and `base` 100 ms unless the server's
//! error carries a positive `baseBackoffMS`. The first retry is attempt 1, so the mean waits are
//! 100 ms and 200 ms for the default two retries.
//!
//! [`Backoff`] computes it with saturating arithmetic: any attempt number (up to `u32::MAX`) and
//! any server base give a delay within `[0, max]`, in debug and release builds alike. Randomness
//! comes from a [`Jitter`] source so tests can pin it.
//!
//! ```
//! use std::time::Duration;
//! use overload::backoff::{Backoff, ServerBaseBackoff};
//!
//! let backoff = Backoff::default();
//! assert_eq!(backoff.ceiling(1, None), Duration::from_millis(200));
//! assert_eq!(backoff.ceiling(40, None), Duration::from_secs(10));
//! let server = ServerBaseBackoff::from_millis_f64(250.0).unwrap();
//! assert_eq!(backoff.ceiling(1, Some(server)), Duration::from_millis(500));
//! ```

use std::fmt;
use std::time::Duration;

/// The specification's default base backoff.
pub const DEFAULT_BASE: Duration = Duration::from_millis(100);

/// The specification's cap on any single backoff.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// The largest `baseBackoffMS` taken seriously: one day. A server that asks for more is sending
/// garbage, and honouring it would only hit the cap anyway.
pub const MAX_SERVER_BASE: Duration = Duration::from_secs(24 * 60 * 60);

/// A source of jitter: values uniform in `[0, 1)`.
pub trait Jitter {
    /// The next jitter value. Values outside `[0, 1)` (and NaN) are clamped by [`Backoff`].
    fn sample(&mut self) -> f64;
}

/// Jitter from the thread-local random number generator.
#[derive(Clone, Copy, Debug, Default)]
pub struct RandomJitter;

impl Jitter for RandomJitter {
    fn sample(&mut self) -> f64 {
        rand::random::<f64>()
    }
}

impl<F: FnMut() -> f64> Jitter for F {
    fn sample(&mut self) -> f64 {
        self()
    }
}

/// The backoff policy: a default base and a cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    max: Duration,
}

impl Default for Backoff {
    /// The specification's values: base 100 ms, cap 10 s.
    fn default() -> Self {
        Self {
            base: DEFAULT_BASE,
            max: MAX_BACKOFF,
        }
    }
}

impl Backoff {
    /// A policy with another default base and cap.
    ///
    /// # Panics
    ///
    /// When `base` is zero (every backoff would be zero: a retry storm) or `max < base`.
    pub fn new(base: Duration, max: Duration) -> Self {
        assert!(
            !base.is_zero(),
            "a zero base backoff turns retries into a storm"
        );
        assert!(max >= base, "the backoff cap must be at least the base");
        Self { base, max }
    }

    /// The upper bound of the delay before retry `attempt` (1 for the first retry):
    /// `min(max, base * 2^attempt)`, where `base` is the server's when it sent one.
    pub fn ceiling(&self, attempt: u32, server_base: Option<ServerBaseBackoff>) -> Duration {
        let base = server_base.map_or(self.base, |b| b.0);
        // 2^attempt overflows u32 from attempt 32 on; past that (and on any overflow of the
        // product) the cap applies, which is what the formula means there.
        2u32.checked_pow(attempt)
            .and_then(|factor| base.checked_mul(factor))
            .map_or(self.max, |delay| delay.min(self.max))
    }

    /// The delay before retry `attempt`: `jitter * ceiling`, never more than the cap.
    pub fn delay(
        &self,
        attempt: u32,
        server_base: Option<ServerBaseBackoff>,
        jitter: &mut impl Jitter,
    ) -> Duration {
        let j = jitter.sample();
        let j = if j.is_nan() { 0.0 } else { j.clamp(0.0, 1.0) };
        self.ceiling(attempt, server_base).mul_f64(j).min(self.max)
    }
}

/// The `baseBackoffMS` field of a server's error document, reduced to what validation needs, so
/// this crate does not depend on a BSON library.
#[derive(Clone, Debug, PartialEq)]
pub enum BaseBackoffField {
    /// The field is missing or null.
    Absent,
    /// A BSON int32.
    Int32(i32),
    /// A BSON int64.
    Int64(i64),
    /// A BSON double.
    Double(f64),
    /// Any other BSON type, by name (for the warning that the value is ignored).
    NotNumeric(String),
}

/// A server-supplied base backoff (`baseBackoffMS` on an overload error) that is safe to use:
/// finite, positive, and at most [`MAX_SERVER_BASE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServerBaseBackoff(Duration);

/// Why a `baseBackoffMS` value is ignored.
#[derive(Clone, Debug, PartialEq)]
pub enum InvalidServerBase {
    /// Zero or negative: the specification says to use only positive values.
    NotPositive(f64),
    /// Positive but below one nanosecond, so it would be a zero [`Duration`]: as useless as
    /// zero, and a zero base would turn every backoff into an immediate retry.
    BelowResolution(f64),
    /// NaN or infinite.
    NotFinite,
    /// Above [`MAX_SERVER_BASE`].
    Absurd(f64),
    /// Not a number at all (the BSON type is named).
    NotNumeric(String),
}

impl fmt::Display for InvalidServerBase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotPositive(v) => write!(f, "baseBackoffMS {v} is not positive"),
            Self::BelowResolution(v) => {
                write!(f, "baseBackoffMS {v} is below the nanosecond resolution")
            }
            Self::NotFinite => write!(f, "baseBackoffMS is not a finite number"),
            Self::Absurd(v) => write!(
                f,
                "baseBackoffMS {v} exceeds {} ms",
                MAX_SERVER_BASE.as_millis()
            ),
            Self::NotNumeric(kind) => write!(f, "baseBackoffMS is a {kind}, not a number"),
        }
    }
}

impl std::error::Error for InvalidServerBase {}

impl ServerBaseBackoff {
    /// Validates a `baseBackoffMS` value given in milliseconds (servers send int32, int64 or
    /// double; the driver converts any of them to `f64` losslessly enough for milliseconds).
    ///
    /// # Errors
    ///
    /// [`InvalidServerBase`] says why the value must be ignored.
    pub fn from_millis_f64(ms: f64) -> Result<Self, InvalidServerBase> {
        if !ms.is_finite() {
            return Err(InvalidServerBase::NotFinite);
        }
        if ms <= 0.0 {
            return Err(InvalidServerBase::NotPositive(ms));
        }
        if ms > MAX_SERVER_BASE.as_millis() as f64 {
            return Err(InvalidServerBase::Absurd(ms));
        }
        // `ms` is finite and within a day, so the conversion cannot panic; it can still round
        // a tiny positive value down to zero.
        let base = Duration::from_secs_f64(ms / 1000.0);
        if base.is_zero() {
            return Err(InvalidServerBase::BelowResolution(ms));
        }
        Ok(Self(base))
    }

    /// Validates `baseBackoffMS` as it appeared in a server's error document: absent (or
    /// null) means the server gave no hint, which is not an error.
    ///
    /// # Errors
    ///
    /// [`InvalidServerBase`] says why a present value must be ignored.
    pub fn from_field(field: BaseBackoffField) -> Result<Option<Self>, InvalidServerBase> {
        match field {
            BaseBackoffField::Absent => Ok(None),
            BaseBackoffField::Int32(ms) => Self::from_millis_i64(ms.into()).map(Some),
            BaseBackoffField::Int64(ms) => Self::from_millis_i64(ms).map(Some),
            BaseBackoffField::Double(ms) => Self::from_millis_f64(ms).map(Some),
            BaseBackoffField::NotNumeric(kind) => Err(InvalidServerBase::NotNumeric(kind)),
        }
    }

    /// Validates an integer `baseBackoffMS`.
    ///
    /// # Errors
    ///
    /// As [`ServerBaseBackoff::from_millis_f64`].
    pub fn from_millis_i64(ms: i64) -> Result<Self, InvalidServerBase> {
        if ms <= 0 {
            return Err(InvalidServerBase::NotPositive(ms as f64));
        }
        let ms = u64::try_from(ms).map_err(|_| InvalidServerBase::NotPositive(ms as f64))?;
        if ms > MAX_SERVER_BASE.as_millis() as u64 {
            return Err(InvalidServerBase::Absurd(ms as f64));
        }
        Ok(Self(Duration::from_millis(ms)))
    }

    /// Validates a base already converted to a [`Duration`].
    ///
    /// # Errors
    ///
    /// [`InvalidServerBase::NotPositive`] for zero, [`InvalidServerBase::Absurd`] above
    /// [`MAX_SERVER_BASE`].
    pub fn from_duration(base: Duration) -> Result<Self, InvalidServerBase> {
        if base.is_zero() {
            return Err(InvalidServerBase::NotPositive(0.0));
        }
        if base > MAX_SERVER_BASE {
            return Err(InvalidServerBase::Absurd(base.as_secs_f64() * 1000.0));
        }
        Ok(Self(base))
    }

    pub fn as_duration(self) -> Duration {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn follows_the_spec_formula_from_attempt_one() {
        let b = Backoff::default();
        assert_eq!(b.ceiling(1, None), ms(200));
        assert_eq!(b.ceiling(2, None), ms(400));
        assert_eq!(b.ceiling(6, None), ms(6400));
        assert_eq!(b.ceiling(7, None), ms(10_000));
        assert_eq!(b.delay(1, None, &mut || 0.5), ms(100));
        assert_eq!(b.delay(2, None, &mut || 0.5), ms(200));
    }

    #[test]
    fn attempt_zero_is_the_base() {
        assert_eq!(Backoff::default().ceiling(0, None), DEFAULT_BASE);
    }

    #[test]
    fn large_attempts_saturate_at_the_cap() {
        let b = Backoff::default();
        for attempt in [31, 32, 33, 64, 1000, u32::MAX - 1, u32::MAX] {
            assert_eq!(b.ceiling(attempt, None), MAX_BACKOFF, "attempt {attempt}");
            let d = b.delay(attempt, None, &mut || 0.999_999);
            assert!(
                d <= MAX_BACKOFF && d > ms(9_999),
                "attempt {attempt}: {d:?}"
            );
        }
    }

    #[test]
    fn large_server_base_cannot_overflow() {
        let b = Backoff::default();
        let huge = ServerBaseBackoff::from_millis_i64(MAX_SERVER_BASE.as_millis() as i64).unwrap();
        for attempt in [0, 1, 31, 32, u32::MAX] {
            assert_eq!(b.ceiling(attempt, Some(huge)), MAX_BACKOFF);
        }
    }

    #[test]
    fn server_base_replaces_the_default() {
        let b = Backoff::default();
        let base = ServerBaseBackoff::from_millis_f64(12.5).unwrap();
        assert_eq!(b.ceiling(1, Some(base)), Duration::from_micros(25_000));
        assert_eq!(b.ceiling(2, Some(base)), ms(50));
    }

    #[test]
    fn jitter_out_of_range_is_clamped() {
        let b = Backoff::default();
        assert_eq!(b.delay(1, None, &mut || f64::NAN), Duration::ZERO);
        assert_eq!(b.delay(1, None, &mut || -3.0), Duration::ZERO);
        assert_eq!(b.delay(1, None, &mut || 7.0), ms(200));
    }

    #[test]
    fn random_jitter_stays_in_range() {
        let b = Backoff::default();
        let mut jitter = RandomJitter;
        for attempt in 0..64 {
            let d = b.delay(attempt, None, &mut jitter);
            assert!(d <= b.ceiling(attempt, None), "attempt {attempt}: {d:?}");
        }
    }

    #[test]
    fn durations_are_validated_like_millis() {
        assert_eq!(
            ServerBaseBackoff::from_duration(ms(250))
                .unwrap()
                .as_duration(),
            ms(250)
        );
        assert!(ServerBaseBackoff::from_duration(Duration::ZERO).is_err());
        assert!(ServerBaseBackoff::from_duration(Duration::MAX).is_err());
    }

    #[test]
    fn invalid_server_bases_say_why() {
        assert_eq!(
            ServerBaseBackoff::from_millis_f64(0.0),
            Err(InvalidServerBase::NotPositive(0.0))
        );
        assert_eq!(
            ServerBaseBackoff::from_millis_f64(-5.0),
            Err(InvalidServerBase::NotPositive(-5.0))
        );
        assert_eq!(
            ServerBaseBackoff::from_millis_f64(f64::NAN),
            Err(InvalidServerBase::NotFinite)
        );
        assert_eq!(
            ServerBaseBackoff::from_millis_f64(f64::INFINITY),
            Err(InvalidServerBase::NotFinite)
        );
        assert!(matches!(
            ServerBaseBackoff::from_millis_f64(1e300),
            Err(InvalidServerBase::Absurd(_))
        ));
        assert!(matches!(
            ServerBaseBackoff::from_millis_i64(i64::MAX),
            Err(InvalidServerBase::Absurd(_))
        ));
        assert!(matches!(
            ServerBaseBackoff::from_millis_i64(i64::MIN),
            Err(InvalidServerBase::NotPositive(_))
        ));
        assert_eq!(
            InvalidServerBase::NotNumeric("string".into()).to_string(),
            "baseBackoffMS is a string, not a number"
        );
    }

    #[test]
    fn bases_that_round_to_zero_are_rejected() {
        // 1e-12 ms is a picosecond: positive, but a zero Duration.
        assert_eq!(
            ServerBaseBackoff::from_millis_f64(1e-12),
            Err(InvalidServerBase::BelowResolution(1e-12))
        );
        assert_eq!(
            ServerBaseBackoff::from_millis_f64(f64::MIN_POSITIVE),
            Err(InvalidServerBase::BelowResolution(f64::MIN_POSITIVE))
        );
        // One nanosecond is the smallest base a Duration can hold.
        assert_eq!(
            ServerBaseBackoff::from_millis_f64(1e-6).map(ServerBaseBackoff::as_duration),
            Ok(Duration::from_nanos(1))
        );
        assert!(InvalidServerBase::BelowResolution(1e-12)
            .to_string()
            .contains("below the nanosecond resolution"));
    }

    #[test]
    fn fields_of_every_bson_shape() {
        assert_eq!(
            ServerBaseBackoff::from_field(BaseBackoffField::Absent),
            Ok(None)
        );
        assert_eq!(
            ServerBaseBackoff::from_field(BaseBackoffField::Int32(250)),
            Ok(Some(ServerBaseBackoff(ms(250))))
        );
        assert_eq!(
            ServerBaseBackoff::from_field(BaseBackoffField::Int64(250)),
            Ok(Some(ServerBaseBackoff(ms(250))))
        );
        assert_eq!(
            ServerBaseBackoff::from_field(BaseBackoffField::Double(0.5)),
            Ok(Some(ServerBaseBackoff(Duration::from_micros(500))))
        );
        assert_eq!(
            ServerBaseBackoff::from_field(BaseBackoffField::Int32(-1)),
            Err(InvalidServerBase::NotPositive(-1.0))
        );
        assert_eq!(
            ServerBaseBackoff::from_field(BaseBackoffField::Double(f64::NAN)),
            Err(InvalidServerBase::NotFinite)
        );
        assert_eq!(
            ServerBaseBackoff::from_field(BaseBackoffField::NotNumeric("String".into())),
            Err(InvalidServerBase::NotNumeric("String".into()))
        );
    }

    #[test]
    #[should_panic(expected = "retries into a storm")]
    fn zero_base_is_a_programmer_error() {
        Backoff::new(Duration::ZERO, MAX_BACKOFF);
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::*;

        fn server_base() -> impl Strategy<Value = Option<ServerBaseBackoff>> {
            proptest::option::of(
                (1..=MAX_SERVER_BASE.as_nanos() as u64)
                    .prop_map(|n| ServerBaseBackoff(Duration::from_nanos(n))),
            )
        }

        proptest! {
            #[test]
            fn delay_is_within_zero_and_the_ceiling(
                attempt in any::<u32>(),
                base in server_base(),
                jitter in any::<f64>(),
            ) {
                let b = Backoff::default();
                let ceiling = b.ceiling(attempt, base);
                prop_assert!(ceiling <= MAX_BACKOFF);
                let delay = b.delay(attempt, base, &mut || jitter);
                prop_assert!(delay <= ceiling, "{delay:?} > {ceiling:?}");
            }

            #[test]
            fn ceiling_never_shrinks_as_attempts_grow(
                attempt in 0..u32::MAX,
                base in server_base(),
            ) {
                let b = Backoff::default();
                prop_assert!(b.ceiling(attempt, base) <= b.ceiling(attempt + 1, base));
            }

            #[test]
            fn accepted_millis_are_positive_and_bounded(ms in any::<f64>()) {
                // Any f64 at all: the validation must never panic, and what it accepts keeps
                // the type's promise.
                if let Ok(base) = ServerBaseBackoff::from_millis_f64(ms) {
                    prop_assert!(!base.as_duration().is_zero());
                    prop_assert!(base.as_duration() <= MAX_SERVER_BASE);
                    prop_assert!(ms > 0.0);
                }
            }

            #[test]
            fn accepted_integers_are_exact(ms in any::<i64>()) {
                match ServerBaseBackoff::from_millis_i64(ms) {
                    Ok(base) => prop_assert_eq!(base.as_duration().as_millis(), ms as u128),
                    Err(InvalidServerBase::NotPositive(_)) => prop_assert!(ms <= 0),
                    Err(InvalidServerBase::Absurd(_)) => {
                        prop_assert!(ms as u128 > MAX_SERVER_BASE.as_millis())
                    }
                    Err(other) => prop_assert!(false, "unexpected {other:?}"),
                }
            }
        }
    }
}
