//! The open-loop schedule: when each request leaves, whatever came back before.
//!
//! The whole schedule is computed before the run (per instance: offset, phase, operation and
//! key) by the `arrivals` crate, which the simulator shares to replay a lab run's requests, so
//! the arrival process cannot be slowed by the system under test. [`drive`] walks one
//! instance's schedule: it sleeps until the next scheduled instant, hands the request to a
//! callback that must not wait for the reply (it spawns), and records how late it was.

use std::time::Duration;

use tokio::time::Instant;

pub use arrivals::{build, repetition_seed, Arrival, ScheduleSpec};

/// Walks `arrivals` from `start`: at each scheduled instant calls `fire(arrival, scheduled,
/// lag)`, where `lag` is how late the call is. Requests that are already due are fired
/// without sleeping. `fire` must not wait for the request; the pace never depends on replies.
pub async fn drive<F>(start: Instant, arrivals: &[Arrival], mut fire: F)
where
    F: FnMut(&Arrival, Instant, Duration),
{
    for a in arrivals {
        let when = start + a.at;
        if Instant::now() < when {
            tokio::time::sleep_until(when).await;
        }
        let now = Instant::now();
        fire(a, when, now.saturating_duration_since(when));
    }
}
