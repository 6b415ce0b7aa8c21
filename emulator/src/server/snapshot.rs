//! Snapshot reads outside transactions (`readConcern: {level: "snapshot"}`, MongoDB 5.0+).
//!
//! mongod serves them from its storage engine's history: the first read picks a cluster time
//! and returns it as `atClusterTime`; later reads of the same snapshot session send it back and
//! see the data as of that time, whatever was written since. The emulator has no history, so it
//! keeps copies of the store: each read without `atClusterTime` records the store under the
//! cluster time it answers with, and a read with `atClusterTime` reads the newest recorded copy
//! not after that time. A time older than every kept copy is 239 SnapshotTooOld, as on a mongod
//! whose history window has passed it. Nothing is copied until a snapshot read arrives.

use std::collections::VecDeque;

use bson::{Bson, Document, Timestamp};

use super::error::CommandError;
use crate::engine::Store;

/// How many store copies are kept; the oldest goes first.
const MAX_SNAPSHOTS: usize = 64;

/// mongod's codes for the snapshot errors.
const NOT_A_REPLICA_SET: i32 = 123;
const SNAPSHOT_TOO_OLD: i32 = 239;
const INVALID_OPTIONS: i32 = 72;

/// Recorded store copies, oldest first, by the cluster time they were taken at.
#[derive(Default)]
pub(crate) struct SnapshotHistory {
    copies: VecDeque<(Timestamp, Store)>,
}

fn order(ts: Timestamp) -> (u32, u32) {
    (ts.time, ts.increment)
}

impl SnapshotHistory {
    /// Records `store` as the data at `at`.
    pub(crate) fn record(&mut self, at: Timestamp, store: &Store) {
        while self.copies.len() >= MAX_SNAPSHOTS {
            self.copies.pop_front();
        }
        self.copies.push_back((at, store.clone()));
    }

    /// A copy of the data as of `at`: the newest copy taken at or before it.
    pub(crate) fn at(&self, at: Timestamp) -> Result<Store, CommandError> {
        self.copies
            .iter()
            .rev()
            .find(|(taken, _)| order(*taken) <= order(at))
            .map(|(_, store)| store.clone())
            .ok_or_else(|| {
                CommandError::new(
                    SNAPSHOT_TOO_OLD,
                    format!(
                        "Read timestamp Timestamp({}, {}) is older than the oldest available \
                         timestamp.",
                        at.time, at.increment
                    ),
                )
            })
    }
}

/// The read concern of a command that asks for a snapshot read outside a transaction:
/// `Some(atClusterTime)` (itself optional), or `None` for any other read concern.
pub(crate) fn requested(body: &Document) -> Option<Option<Timestamp>> {
    let rc = body.get_document("readConcern").ok()?;
    if rc.get_str("level").ok()? != "snapshot" {
        return None;
    }
    Some(match rc.get("atClusterTime") {
        Some(Bson::Timestamp(ts)) => Some(*ts),
        _ => None,
    })
}

/// Commands that accept a snapshot read concern outside a transaction (mongod 5.0+).
fn supports_snapshot(name: &str) -> bool {
    matches!(
        name,
        "find" | "aggregate" | "distinct" | "getMore" | "explain"
    )
}

/// mongod's refusal of a snapshot read, if it refuses: on a standalone (123 NotAReplicaSet),
/// and for commands without snapshot support, writes included (72 InvalidOptions).
pub(crate) fn refusal(name: &str, body: &Document, replicated: bool) -> Option<CommandError> {
    if !replicated {
        return Some(CommandError::new(
            NOT_A_REPLICA_SET,
            "node needs to be a replica set member to use readConcern: snapshot",
        ));
    }
    let writes = name == "aggregate" && super::data::pipeline_writes(body);
    if !supports_snapshot(name) || writes {
        return Some(CommandError::new(
            INVALID_OPTIONS,
            format!(
                "Command {name} does not support {{ readConcern: {{ level: \"snapshot\", \
                 provenance: \"clientSupplied\" }} }} :: caused by :: read concern not supported"
            ),
        ));
    }
    None
}

/// Adds `atClusterTime` where mongod reports it: in the cursor of find and aggregate replies,
/// at the top level of distinct's.
pub(crate) fn stamp(reply: &mut Document, at: Timestamp) {
    if let Ok(cursor) = reply.get_document_mut("cursor") {
        cursor.insert("atClusterTime", at);
    } else {
        reply.insert("atClusterTime", at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn ts(time: u32, increment: u32) -> Timestamp {
        Timestamp { time, increment }
    }

    #[test]
    fn reads_the_newest_copy_not_after_the_time_and_refuses_older_times() {
        let mut history = SnapshotHistory::default();
        let mut store = Store::new();
        history.record(ts(10, 1), &store);
        store.insert("db", "c", vec![doc! {"_id": 1}], true);
        history.record(ts(10, 5), &store);
        assert_eq!(history.at(ts(10, 3)).unwrap().documents("db", "c").len(), 0);
        assert_eq!(history.at(ts(11, 0)).unwrap().documents("db", "c").len(), 1);
        assert_eq!(history.at(ts(9, 0)).unwrap_err().code, SNAPSHOT_TOO_OLD);
    }

    #[test]
    fn history_is_bounded() {
        let mut history = SnapshotHistory::default();
        let store = Store::new();
        for i in 0..(MAX_SNAPSHOTS as u32 + 10) {
            history.record(ts(1, i + 1), &store);
        }
        assert_eq!(history.copies.len(), MAX_SNAPSHOTS);
        assert!(history.at(ts(1, 1)).is_err());
    }

    #[test]
    fn refusals_follow_mongod() {
        let body = doc! {"readConcern": {"level": "snapshot"}};
        assert_eq!(requested(&body), Some(None));
        assert_eq!(requested(&doc! {"readConcern": {"level": "local"}}), None);
        assert_eq!(
            refusal("find", &body, false).unwrap().code,
            NOT_A_REPLICA_SET
        );
        assert_eq!(
            refusal("insert", &body, true).unwrap().code,
            INVALID_OPTIONS
        );
        assert_eq!(
            refusal("listCollections", &body, true).unwrap().code,
            INVALID_OPTIONS
        );
        assert!(refusal("find", &body, true).is_none());
        let mut reply = doc! {"cursor": {"id": 0i64}};
        stamp(&mut reply, ts(3, 4));
        assert!(reply
            .get_document("cursor")
            .unwrap()
            .contains_key("atClusterTime"));
        let mut reply = doc! {"values": []};
        stamp(&mut reply, ts(3, 4));
        assert!(reply.contains_key("atClusterTime"));
    }
}
