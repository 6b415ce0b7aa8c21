//! The project's MongoDB wire-protocol emulator (`labd`) and overload lab.
//!
//! No mongod can run on the project's machines, so every test talks to this emulator instead.

pub mod engine;
