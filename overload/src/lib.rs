//! Overload-control policies for the `mongodb-overload` fork of the MongoDB Rust driver.
//!
//! The fork's driver (`driver/`, upstream `mongodb` plus the patch series) depends on this crate
//! and only wires its types into the retry loop. Everything here is plain Rust with explicit
//! inputs (time is passed in, randomness is injectable), so each policy is tested without a
//! server. Keeping the logic out of upstream's files keeps the patch series small enough to
//! rebase onto new upstream releases.

pub mod admission;
pub mod backoff;
pub mod budget;
pub mod control;
pub mod cursor;
pub mod deadline;
pub mod identity;
pub mod labels;
pub mod retry;
pub mod stats;
mod tally;
pub mod trace;
pub mod transaction;

pub use identity::ForkIdentity;
