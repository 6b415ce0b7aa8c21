//! Spec tests for the mongodb-overload fork: the unified test format runner, prose tests and URI
//! option tests, run against the emulator or against `MONGODB_URI`.
