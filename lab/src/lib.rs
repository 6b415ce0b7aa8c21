//! The project's MongoDB wire-protocol emulator (`labd`) and overload lab.
//!
//! No mongod can run on the project's machines, so every test talks to this emulator instead.
//! [`Emulator::start`] serves a standalone, replica-set or sharded persona on loopback ports;
//! the official driver talks to it exactly as to mongod.

pub mod engine;
pub mod loadgen;
pub mod model;
pub mod server;
pub mod tls;
pub mod wire;

pub use server::{Emulator, EmulatorConfig, Topology};
