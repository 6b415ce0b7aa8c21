//! Fork tooling for mongodb-overload. The binary (`cargo xtask ...`) is a thin CLI over this
//! library so the workflow can be tested against temporary projects.

pub mod dist;
pub mod fork;
pub mod git;
pub mod lab;
pub mod mutants;
pub mod pristine;
pub mod project;
pub mod rebase;
pub mod series;
pub mod spec_fetch;
pub mod sync_spec;
pub mod testrun;
pub mod upstream_tests;
