//! The project's MongoDB wire-protocol emulator (`labd`).
//!
//! No mongod can run on the project's machines, so every test talks to this emulator instead.
//! [`Emulator::start`] serves a standalone, replica-set or sharded persona on loopback ports;
//! the official driver talks to it exactly as to mongod. The crate depends on no driver (a test
//! in `tests/no_driver.rs` keeps it so): the spec runner links it next to whichever driver it
//! tests, and the overload lab (`lab/`) drives it with both.

pub mod engine;
pub mod model;
pub mod server;
pub mod tls;
pub mod wire;

pub use server::{Emulator, EmulatorConfig, StepDown, StepDownSchedule, Topology, UserConfig};
