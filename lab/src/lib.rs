//! The overload lab: an open-loop load generator that runs the fork and unmodified upstream
//! side by side against the wire-protocol emulator (the `emulator` crate), and its report.
//!
//! The emulator itself needs no driver and lives in its own crate; this crate adds what needs
//! both drivers and the plotting and histogram stack (`lab`, `emubench`).

pub mod loadgen;
