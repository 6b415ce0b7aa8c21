//! The virtual clock.
//!
//! The `overload` policies take every reading of the time as a [`std::time::Instant`] argument,
//! and the controller reads a `fn() -> Instant` only where the driver gives none (a slot dropped
//! without a report, the acceptance record of a failure). The simulator keeps its own time as
//! nanoseconds since a fixed origin and hands the policies `origin + nanos`; [`now`] is the
//! `fn() -> Instant` the controllers are built with, and reads the time the event loop of the
//! current thread last set ([`set`]). Each simulation runs on one thread, so runs on different
//! threads (the tests) keep separate clocks.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Virtual time: nanoseconds since the simulation started.
pub type Nanos = u64;

thread_local! {
    static NOW: Cell<Nanos> = const { Cell::new(0) };
}

/// The instant that stands for virtual time zero (the same for every run of the process).
pub fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// The instant of virtual time `t`.
pub fn instant(t: Nanos) -> Instant {
    origin() + Duration::from_nanos(t)
}

/// Sets this thread's virtual time (the event loop does, before handling each event).
pub fn set(t: Nanos) {
    NOW.with(|now| now.set(t));
}

/// This thread's virtual time as an instant: the clock the controllers read.
pub fn now() -> Instant {
    instant(NOW.with(Cell::get))
}

/// Nanoseconds in `d`, saturating.
pub fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Nanoseconds in `ms` milliseconds (negative and non-finite values give zero).
pub fn ms(ms: f64) -> Nanos {
    if ms.is_finite() && ms > 0.0 {
        (ms * 1e6).min(u64::MAX as f64 / 2.0) as Nanos
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_reads_what_the_loop_set() {
        set(1_500_000);
        assert_eq!(now(), origin() + Duration::from_micros(1_500));
        set(0);
        assert_eq!(now(), origin());
        assert_eq!(ms(-1.0), 0);
        assert_eq!(ms(f64::NAN), 0);
        assert_eq!(ms(0.3), 300_000);
    }
}
