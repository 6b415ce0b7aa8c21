//! Projections for find and $project.
