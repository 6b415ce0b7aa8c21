//! The bounds a run's inputs are checked against. The run's configuration
//! ([`crate::engine::RunConfig::validate`]), the lab schedules it replays
//! ([`crate::replay::LabSchedule`]) and the command line all check the same bound, so it sits
//! below all of them.

/// The most clients a run may have (each client is a controller of its own: the bound keeps a
/// run's memory bounded).
pub const MAX_CLIENTS: u32 = 100_000;
