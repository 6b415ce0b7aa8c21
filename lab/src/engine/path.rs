//! Dotted field paths.
