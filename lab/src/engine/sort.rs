//! Sorting by sort specifications.
