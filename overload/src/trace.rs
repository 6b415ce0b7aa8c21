//! Tracing events of the fork's overload handling, all under one target so they can be enabled
//! alone: `RUST_LOG=mongodb::overload=debug`.
//!
//! The driver's own tracing sits behind its `tracing-unstable` feature; these events do not, so
//! an operator can see retries and ignored server hints in any build.

use crate::backoff::InvalidServerBase;

/// The tracing target of every event in this module.
pub const TARGET: &str = "mongodb::overload";

/// A server sent a `baseBackoffMS` the driver will not use; the default base applies instead.
/// Logged at WARN: it means a server (or something in between) is sending malformed errors.
pub fn ignored_base_backoff(why: &InvalidServerBase) {
    tracing::warn!(target: TARGET, reason = %why, "ignoring the server's baseBackoffMS");
}
