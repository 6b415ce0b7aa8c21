//! The overload lab's open-loop load generator and report (`docs/lab.md`).
//!
//! A run starts an emulator in-process, seeds a collection, and runs each *variant* (a driver
//! — the fork or unmodified upstream 3.9.1, linked side by side — plus connection-string
//! options) one after another against the same server settings. Requests leave on a schedule
//! computed up front ([`schedule`]), whatever came back; several simulated service instances
//! each have their own client; each request has an application deadline enforced around a
//! spawned task. [`metrics`] books per-second figures, [`summary`] reduces them, and
//! [`report`] writes `report.md`, `series.csv`, `summary.json` and SVG charts.

pub mod audit;
mod calibrate;
pub mod client;
pub mod config;
pub mod control;
pub mod drive;
mod emulator_thread;
mod failpoint_limiter;
pub mod instructions;
pub mod judge;
mod members;
pub mod metrics;
pub mod publish;
pub mod report;
pub mod runner;
mod sampler;
pub mod scenarios;
pub mod schedule;
pub mod sensitivity;
pub mod soak;
pub mod summary;
pub mod sys;
pub mod verdict;

pub use client::{LabClient, OpSpec};
pub use config::{LabConfig, Scenario, Variant};
pub use drive::{drive_all, DriveStats, RequestOpts};
pub use metrics::{AttemptReport, ErrorClass, Recorder};
pub use runner::{run, LabRun};
