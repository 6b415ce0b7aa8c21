//! Open-loop arrival schedules from seeds: when each request of a load leaves, from which
//! instance, and what it asks for.
//!
//! The lab's load generator (`lab`) builds every run's schedule here before the run, and the
//! simulator (`sim`) builds the same schedules to replay a lab run's arrivals exactly: the same
//! seeds give the same requests on both sides. The crate draws and nothing else; walking a
//! schedule in real time is the lab's (`lab::loadgen::schedule::drive`). On a sharded cluster
//! [`ShardKeys`] says which shards a request's key touches, for both.

mod mix;
mod schedule;
mod shards;

pub use mix::{OpKind, OpMix};
pub use schedule::{build, repetition_seed, Arrival, Arrivals, Phase, ScheduleSpec};
pub use shards::ShardKeys;
