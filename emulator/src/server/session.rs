//! Logical sessions: retryable-write results and multi-statement transactions.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use bson::{Bson, Document};

use crate::engine::{IdKey, Store};

/// A session's identity: the bytes of `lsid.id` (or the whole lsid rendered, if unusual).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct SessionKey(Vec<u8>);

impl SessionKey {
    /// Derives the key from an `lsid` document.
    pub(crate) fn from_lsid(lsid: &Document) -> SessionKey {
        match lsid.get("id") {
            Some(Bson::Binary(b)) => SessionKey(b.bytes.clone()),
            _ => SessionKey(format!("{lsid}").into_bytes()),
        }
    }
}

/// Where a transaction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxnState {
    InProgress,
    Committed,
    Aborted,
}

/// A document a transaction changed: its namespace (`db.coll`) and its `_id`.
pub(crate) type WrittenDoc = (String, IdKey);

/// One multi-statement transaction: it runs on a private copy of the store taken at its start
/// and keeps the write commands it ran, which commit replays on the shared store.
pub(crate) struct Transaction {
    pub(crate) number: i64,
    pub(crate) state: TxnState,
    pub(crate) snapshot: Option<Store>,
    /// `State::write_version` when the transaction started.
    pub(crate) base_version: u64,
    pub(crate) writes: Vec<(String, Document)>,
    /// When the transaction started (transactions are aborted after
    /// `transactionLifetimeLimitSeconds`).
    pub(crate) started: Instant,
    /// Every document the transaction changed.
    pub(crate) written: BTreeSet<WrittenDoc>,
}

/// Per-session server state.
pub(crate) struct Session {
    pub(crate) lsid: Document,
    pub(crate) last_use: Instant,
    /// Highest txnNumber seen.
    pub(crate) txn_number: Option<i64>,
    /// The stored reply of the retryable write with `txn_number`.
    pub(crate) retry_reply: Option<Document>,
    /// A retryable write with `txn_number` that ran only in part (an
    /// `onPrimaryTransactionalWrite` fail point failed some statements): the statements applied
    /// and their counts, so a retry runs only the others, as mongod's per-statement records do.
    pub(crate) partial_write: Option<super::failpoint::PartialWrite>,
    pub(crate) txn: Option<Transaction>,
}

/// The session table.
#[derive(Default)]
pub(crate) struct Sessions {
    map: HashMap<SessionKey, Session>,
}

impl Sessions {
    /// The session for `lsid`, created on first use. When the table is full the least recently
    /// used session without an open transaction is forgotten.
    pub(crate) fn touch(&mut self, key: &SessionKey, lsid: &Document, max: usize) -> &mut Session {
        if !self.map.contains_key(key) && self.map.len() >= max.max(1) {
            let victim = self
                .map
                .iter()
                .filter(|(_, s)| {
                    !s.txn
                        .as_ref()
                        .is_some_and(|t| t.state == TxnState::InProgress)
                })
                .min_by_key(|(_, s)| s.last_use)
                .or_else(|| self.map.iter().min_by_key(|(_, s)| s.last_use))
                .map(|(k, _)| k.clone());
            if let Some(v) = victim {
                self.map.remove(&v);
            }
        }
        let s = self.map.entry(key.clone()).or_insert_with(|| Session {
            lsid: lsid.clone(),
            last_use: Instant::now(),
            txn_number: None,
            retry_reply: None,
            partial_write: None,
            txn: None,
        });
        s.last_use = Instant::now();
        s
    }

    /// The session for `key`, if tracked.
    pub(crate) fn get_mut(&mut self, key: &SessionKey) -> Option<&mut Session> {
        self.map.get_mut(key)
    }

    /// Number of transactions in progress.
    pub(crate) fn open_transactions(&self) -> usize {
        self.map
            .values()
            .filter(|s| {
                s.txn
                    .as_ref()
                    .is_some_and(|t| t.state == TxnState::InProgress)
            })
            .count()
    }

    /// Aborts transactions older than `txn_lifetime` and forgets sessions idle for longer than
    /// `idle` (mongod's transaction lifetime limit and logical session timeout).
    pub(crate) fn reap(&mut self, idle: std::time::Duration, txn_lifetime: std::time::Duration) {
        let now = Instant::now();
        self.map
            .retain(|_, s| now.duration_since(s.last_use) < idle);
        for s in self.map.values_mut() {
            if let Some(t) = s.txn.as_mut() {
                if t.state == TxnState::InProgress && now.duration_since(t.started) >= txn_lifetime
                {
                    tracing::debug!(txn = t.number, "transaction exceeded its lifetime; aborted");
                    t.state = TxnState::Aborted;
                    t.snapshot = None;
                    t.writes.clear();
                    t.written.clear();
                }
            }
        }
    }

    /// Whether another session's open transaction already changed one of `keys`.
    pub(crate) fn conflicts(&self, me: &SessionKey, keys: &BTreeSet<WrittenDoc>) -> bool {
        !keys.is_empty()
            && self.map.iter().any(|(k, s)| {
                k != me
                    && s.txn.as_ref().is_some_and(|t| {
                        t.state == TxnState::InProgress && !t.written.is_disjoint(keys)
                    })
            })
    }

    /// Aborts every transaction in progress (a step-down does, as mongod's does for unprepared
    /// transactions); returns how many. Retryable-write records stay: they are replicated.
    pub(crate) fn abort_in_progress(&mut self) -> usize {
        let mut aborted = 0;
        for t in self.map.values_mut().filter_map(|s| s.txn.as_mut()) {
            if t.state == TxnState::InProgress {
                t.state = TxnState::Aborted;
                t.snapshot = None;
                t.writes.clear();
                t.written.clear();
                aborted += 1;
            }
        }
        aborted
    }

    /// Forgets a session (endSessions); returns whether it existed.
    pub(crate) fn end(&mut self, key: &SessionKey) -> bool {
        self.map.remove(key).is_some()
    }

    /// Aborts every open transaction (killAllSessions) and forgets all sessions.
    pub(crate) fn kill_all(&mut self) {
        self.map.clear();
    }

    /// The lsids of all sessions with their last use, for `$listLocalSessions`.
    pub(crate) fn list(&self) -> Vec<(Document, Instant)> {
        self.map
            .values()
            .map(|s| (s.lsid.clone(), s.last_use))
            .collect()
    }

    /// Number of sessions tracked.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}
