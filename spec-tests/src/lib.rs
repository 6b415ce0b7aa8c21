//! Spec tests for the mongodb-overload fork: the unified test format runner, prose tests and URI
//! option tests, run against the emulator or against `MONGODB_URI`.
//!
//! Modules, one concern each: [`discovery`] finds the JSON suites, [`schema`] parses them strictly,
//! [`requirements`] decides whether a file or test can run on a target, [`matching`] holds the
//! matching rules, [`entities`] builds the entity map, [`operations`] runs operations, [`outcome`]
//! is what an operation came to, [`expect`] checks results, errors, events and outcomes, [`logs`] captures and checks log messages,
//! [`runner`] runs one test, [`skips`] is the table of every reason a case is skipped,
//! [`timeouts`] is the driver's `timeoutMS` API (which upstream lacks),
//! [`uri_options`] runs the URI options tests, and [`valid_fail`] judges the format's own
//! self-test (cases a conforming runner must fail).

// The driver under test. The fork by default; with the `upstream` feature, the unmodified
// crates.io release. This is the only place that knows there are two.
#[cfg(all(feature = "fork", not(feature = "upstream")))]
pub extern crate mongodb;
#[cfg(feature = "upstream")]
pub extern crate mongodb_upstream as mongodb;
#[cfg(not(any(feature = "fork", feature = "upstream")))]
compile_error!("enable feature `fork` (the default) or `upstream` to choose the driver under test");

pub mod discovery;
pub mod entities;
pub mod expect;
pub mod gridfs;
pub mod logs;
pub mod matching;
pub mod operations;
pub mod outcome;
pub mod requirements;
pub mod runner;
pub mod schema;
pub mod skips;
pub mod target;
pub mod timeouts;
pub mod uri_options;
pub mod valid_fail;
