//! Randomized no-panic tests over matching, updates and pipelines.
