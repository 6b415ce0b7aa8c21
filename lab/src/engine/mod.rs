//! The emulator's in-memory document store: catalog, query matching, updates and aggregation.
