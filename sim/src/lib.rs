//! A discrete-event simulator of many clients' overload controls against a queueing model of
//! mongod, in virtual time (issue 30, deliverable 3). No driver is in it: every client is one
//! [`overload::control::Controller`], the type the fork's driver asks before each attempt and
//! tells of each outcome, configured as the lab's variants configure the driver; the server is
//! [`server::Server`], the lab emulator's overload model reduced to its queues and costs.
//!
//! Time is virtual: [`clock`] hands the controllers instants of a clock that the event loop
//! ([`engine`]) moves from event to event, so a minute of load on ten thousand clients takes a
//! few seconds. Randomness comes from one seed, split into three independent streams (arrivals,
//! policies, server), so a run is a function of its configuration and every variant meets the
//! same arrivals; compared with a lab run, the arrivals are that run's own ([`replay`]).
//! `docs/simulator.md` describes the model, its parameters and its results.

pub mod clock;
pub mod engine;
pub mod event;
pub mod lab;
pub mod limits;
pub mod plot;
pub mod queue;
pub mod replay;
pub mod report;
pub mod scenario;
pub mod server;
pub mod variant;

pub use engine::{run, RunConfig};
pub use report::{Outcome, Report};
pub use scenario::{Length, Scenario, ScenarioName};
pub use variant::Variant;
