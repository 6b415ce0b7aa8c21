//! Change events for change streams: a bounded log of the writes made after the first change
//! stream was opened, read by change-stream cursors from their own position.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bson::{doc, Bson, DateTime, Document, Timestamp};

use super::error::CommandError;
use crate::engine::{id_key, IdKey, Store};

/// Most events kept; older resume tokens fail with 286 ChangeStreamHistoryLost.
const MAX_EVENTS: usize = 10_000;

/// Which changes a stream sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Every database except admin, config and local (`allChangesForCluster`).
    Cluster,
    /// One database.
    Database(String),
    /// One collection.
    Collection(String, String),
}

impl Scope {
    fn matches(&self, db: &str, coll: &str) -> bool {
        match self {
            Scope::Cluster => !matches!(db, "admin" | "config" | "local"),
            Scope::Database(d) => d == db,
            Scope::Collection(d, c) => d == db && c == coll,
        }
    }
}

struct Event {
    seq: u64,
    db: String,
    coll: String,
    cluster_time: Timestamp,
    doc: Document,
    /// The document before and after the change, kept when the collection had
    /// `changeStreamPreAndPostImages` enabled at the time of the write.
    images: Images,
    /// An expanded event (create, createIndexes, dropIndexes, modify): only streams opened with
    /// `showExpandedEvents` see it.
    expanded: bool,
    /// An invalidate event: only collection streams see it.
    invalidate: bool,
}

/// The pre- and post-image of a change, when recorded.
#[derive(Debug, Clone, Default)]
pub(crate) struct Images {
    pub(crate) pre: Option<Document>,
    pub(crate) post: Option<Document>,
}

/// What a stream asked to see, beyond its scope.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Visibility {
    pub(crate) show_expanded: bool,
}

/// The change log.
pub(crate) struct ChangeLog {
    /// Set when the first change stream opens; until then writes record nothing.
    pub(crate) enabled: bool,
    events: VecDeque<Event>,
    next_seq: u64,
}

impl Default for ChangeLog {
    fn default() -> Self {
        ChangeLog {
            enabled: false,
            events: VecDeque::new(),
            next_seq: 1,
        }
    }
}

/// A resume token for the position after event `seq`.
pub(crate) fn token(seq: u64) -> Document {
    doc! { "_data": format!("82{seq:016X}") }
}

pub(crate) fn parse_token(v: &Bson) -> Option<u64> {
    let data = v.as_document()?.get_str("_data").ok()?;
    u64::from_str_radix(data.strip_prefix("82")?, 16).ok()
}

impl ChangeLog {
    /// The sequence number the next event gets.
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Where a new stream starts: after `resumeAfter`/`startAfter`, at `startAtOperationTime`, or
    /// at the end of the log.
    pub(crate) fn start_position(&self, spec: &Document) -> Result<u64, CommandError> {
        let token = spec.get("resumeAfter").or_else(|| spec.get("startAfter"));
        if let Some(t) = token {
            let seq =
                parse_token(t).ok_or_else(|| CommandError::bad_value("invalid resume token"))?;
            let oldest = self.events.front().map(|e| e.seq).unwrap_or(self.next_seq);
            if seq.saturating_add(1) < oldest {
                return Err(CommandError::new(
                    286,
                    "Resume of change stream was not possible, as the resume point may no longer be in the oplog.",
                ));
            }
            return Ok(seq.saturating_add(1));
        }
        if let Ok(ts) = spec.get_timestamp("startAtOperationTime") {
            let at = self
                .events
                .iter()
                .find(|e| {
                    (e.cluster_time.time, e.cluster_time.increment) >= (ts.time, ts.increment)
                })
                .map(|e| e.seq)
                .unwrap_or(self.next_seq);
            return Ok(at);
        }
        Ok(self.next_seq)
    }

    /// Up to `max` events at or after `from` within `scope` that `visibility` admits, in order,
    /// with their images, and the position after the last event examined.
    pub(crate) fn read(
        &self,
        from: u64,
        scope: &Scope,
        visibility: Visibility,
        max: usize,
    ) -> (Vec<(u64, Document, Images)>, u64) {
        let mut out = Vec::new();
        let mut next = from;
        for e in self.events.iter().filter(|e| e.seq >= from) {
            if out.len() >= max {
                return (out, next);
            }
            next = e.seq + 1;
            let visible = (!e.expanded || visibility.show_expanded)
                && (!e.invalidate || matches!(scope, Scope::Collection(..)));
            if visible && scope.matches(&e.db, &e.coll) {
                let mut doc = e.doc.clone();
                if !visibility.show_expanded {
                    if let Ok(description) = doc.get_document_mut("updateDescription") {
                        description.remove("disambiguatedPaths");
                    }
                }
                out.push((e.seq, doc, e.images.clone()));
            }
        }
        (out, self.next_seq.max(from))
    }

    /// Records a catalog event (`drop`, `create`, …) on `db.coll`; `expanded` ones are shown
    /// only to streams with `showExpandedEvents`. A dropped collection also invalidates the
    /// streams on it, as mongod's do.
    pub(crate) fn record_catalog(
        &mut self,
        db: &str,
        coll: &str,
        cluster_time: Timestamp,
        body: Document,
        expanded: bool,
    ) {
        let drop = body.get_str("operationType") == Ok("drop");
        self.push_event(
            db,
            coll,
            cluster_time,
            body,
            Images::default(),
            expanded,
            false,
        );
        if drop {
            self.push_event(
                db,
                coll,
                cluster_time,
                doc! { "operationType": "invalidate" },
                Images::default(),
                false,
                true,
            );
        }
    }

    fn push(&mut self, db: &str, coll: &str, cluster_time: Timestamp, body: Document) {
        self.push_event(
            db,
            coll,
            cluster_time,
            body,
            Images::default(),
            false,
            false,
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn push_event(
        &mut self,
        db: &str,
        coll: &str,
        cluster_time: Timestamp,
        mut body: Document,
        images: Images,
        expanded: bool,
        invalidate: bool,
    ) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut doc = doc! {
            "_id": token(seq),
        };
        let op = body.remove("operationType").unwrap_or(Bson::Null);
        doc.insert("operationType", op);
        doc.insert("clusterTime", cluster_time);
        doc.insert("wallTime", DateTime::now());
        for (k, v) in body {
            doc.insert(k, v);
        }
        self.events.push_back(Event {
            seq,
            db: db.to_string(),
            coll: coll.to_string(),
            cluster_time,
            doc,
            images,
            expanded,
            invalidate,
        });
        while self.events.len() > MAX_EVENTS {
            self.events.pop_front();
        }
    }

    /// Records the differences of `db.coll` between `before` and `after` as insert, update,
    /// replace and delete events.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record_diff(
        &mut self,
        db: &str,
        coll: &str,
        before: &[Document],
        after: &[Document],
        replacement: bool,
        cluster_time: Timestamp,
        keep_images: bool,
    ) {
        let images = |pre: Option<&Document>, post: Option<&Document>| match keep_images {
            true => Images {
                pre: pre.cloned(),
                post: post.cloned(),
            },
            false => Images::default(),
        };
        let old: BTreeMap<IdKey, &Document> = before
            .iter()
            .filter_map(|d| Some((id_key(d.get("_id")?), d)))
            .collect();
        let mut seen = BTreeSet::new();
        let ns = doc! { "db": db, "coll": coll };
        for d in after {
            let Some(id) = d.get("_id") else { continue };
            let key = id_key(id);
            seen.insert(key.clone());
            match old.get(&key) {
                None => self.push(
                    db,
                    coll,
                    cluster_time,
                    doc! { "operationType": "insert", "fullDocument": d.clone(), "ns": ns.clone(), "documentKey": { "_id": id.clone() } },
                ),
                Some(prev) if *prev != d => {
                    if replacement {
                        self.push_event(
                            db,
                            coll,
                            cluster_time,
                            doc! { "operationType": "replace", "fullDocument": d.clone(), "ns": ns.clone(), "documentKey": { "_id": id.clone() } },
                            images(Some(prev), Some(d)),
                            false,
                            false,
                        );
                    } else {
                        let mut delta = Delta::default();
                        delta.documents(&mut Vec::new(), prev, d);
                        let Delta {
                            updated,
                            removed,
                            truncated,
                            disambiguated,
                        } = delta;
                        let mut description = doc! {
                            "updatedFields": updated,
                            "removedFields": removed,
                            "truncatedArrays": truncated,
                        };
                        if !disambiguated.is_empty() {
                            // Shown only to streams with showExpandedEvents (see `read`).
                            description.insert("disambiguatedPaths", disambiguated);
                        }
                        self.push_event(
                            db,
                            coll,
                            cluster_time,
                            doc! {
                                "operationType": "update",
                                "ns": ns.clone(),
                                "documentKey": { "_id": id.clone() },
                                "updateDescription": description,
                            },
                            images(Some(prev), Some(d)),
                            false,
                            false,
                        );
                    }
                }
                Some(_) => {}
            }
        }
        for d in before {
            let Some(id) = d.get("_id") else { continue };
            if !seen.contains(&id_key(id)) {
                self.push_event(
                    db,
                    coll,
                    cluster_time,
                    doc! { "operationType": "delete", "ns": ns.clone(), "documentKey": { "_id": id.clone() } },
                    images(Some(d), None),
                    false,
                    false,
                );
            }
        }
    }
}

/// One step of a path inside a document: a field name or an array index.
#[derive(Debug, Clone)]
enum Step {
    Field(String),
    Index(usize),
}

/// An update event's description of how a document changed, as mongod's delta reports it:
/// changed fields by dotted path, removed fields, shortened arrays, and for paths a dotted
/// string cannot say unambiguously (array indexes, field names that are numbers or hold dots)
/// their steps (`disambiguatedPaths`).
#[derive(Default)]
struct Delta {
    updated: Document,
    removed: Vec<Bson>,
    truncated: Vec<Bson>,
    disambiguated: Document,
}

impl Delta {
    fn dotted(path: &[Step]) -> String {
        path.iter()
            .map(|s| match s {
                Step::Field(f) => f.clone(),
                Step::Index(i) => i.to_string(),
            })
            .collect::<Vec<_>>()
            .join(".")
    }

    fn note_ambiguity(&mut self, path: &[Step]) {
        let ambiguous = path.iter().any(|s| match s {
            Step::Index(_) => true,
            Step::Field(f) => {
                f.contains('.') || (!f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()))
            }
        });
        if ambiguous {
            let steps: Vec<Bson> = path
                .iter()
                .map(|s| match s {
                    Step::Field(f) => Bson::String(f.clone()),
                    Step::Index(i) => Bson::Int32(i32::try_from(*i).unwrap_or(i32::MAX)),
                })
                .collect();
            self.disambiguated.insert(Self::dotted(path), steps);
        }
    }

    fn update(&mut self, path: &[Step], value: &Bson) {
        self.note_ambiguity(path);
        self.updated.insert(Self::dotted(path), value.clone());
    }

    /// Differences between two versions of a (sub)document at `path`. A sub-document that
    /// kept all its fields is described field by field; one that lost fields is replaced
    /// whole (as a `$set` of the whole value reports it).
    fn documents(&mut self, path: &mut Vec<Step>, old: &Document, new: &Document) {
        for (k, v) in new {
            path.push(Step::Field(k.clone()));
            match old.get(k) {
                Some(o) if o == v => {}
                Some(o) => self.value(path, o, v),
                None => self.update(path, v),
            }
            path.pop();
        }
        for k in old.keys().filter(|k| !new.contains_key(k.as_str())) {
            path.push(Step::Field(k.clone()));
            self.note_ambiguity(path);
            self.removed.push(Bson::String(Self::dotted(path)));
            path.pop();
        }
    }

    fn value(&mut self, path: &mut Vec<Step>, old: &Bson, new: &Bson) {
        match (old, new) {
            (Bson::Document(o), Bson::Document(n)) if o.keys().all(|k| n.contains_key(k)) => {
                self.documents(path, o, n)
            }
            (Bson::Array(o), Bson::Array(n)) if n.len() < o.len() && o[..n.len()] == n[..] => {
                // Shortened, the rest unchanged: mongod reports the truncation alone.
                self.truncated.push(Bson::Document(
                    doc! { "field": Self::dotted(path), "newSize": i32::try_from(n.len()).unwrap_or(i32::MAX) },
                ));
            }
            (Bson::Array(o), Bson::Array(n))
                if n.len() == o.len()
                    && o.iter().zip(n).all(|(a, b)| {
                        a == b || matches!((a, b), (Bson::Document(_), Bson::Document(_)))
                    }) =>
            {
                // Same length, only sub-documents changed: described inside them.
                for (i, (a, b)) in o.iter().zip(n).enumerate() {
                    if a != b {
                        path.push(Step::Index(i));
                        self.value(path, a, b);
                        path.pop();
                    }
                }
            }
            _ => self.update(path, new),
        }
    }
}

/// Copies of the collections a write may change, taken before it runs (only while change
/// streams are in use).
pub(crate) struct Capture {
    colls: Vec<(String, String, Vec<Document>)>,
    replacement: bool,
}

impl Capture {
    /// Captures `targets` of `store` if the log is enabled.
    pub(crate) fn take(
        log: &ChangeLog,
        store: &Store,
        targets: Vec<(String, String)>,
        replacement: bool,
    ) -> Option<Capture> {
        if !log.enabled || targets.is_empty() {
            return None;
        }
        let colls = targets
            .into_iter()
            .map(|(d, c)| {
                let docs = store.documents(&d, &c).to_vec();
                (d, c, docs)
            })
            .collect();
        Some(Capture { colls, replacement })
    }

    /// Records what changed since the capture; `keeps_images` says which collections have
    /// `changeStreamPreAndPostImages` enabled.
    pub(crate) fn finish(
        self,
        log: &mut ChangeLog,
        store: &Store,
        cluster_time: Timestamp,
        keeps_images: impl Fn(&str, &str) -> bool,
    ) {
        for (d, c, before) in &self.colls {
            log.record_diff(
                d,
                c,
                before,
                store.documents(d, c),
                self.replacement,
                cluster_time,
                keeps_images(d, c),
            );
        }
    }
}

/// Whether a write command replaces whole documents (for `replace` events).
pub(crate) fn is_replacement(name: &str, body: &Document) -> bool {
    let replaces = |u: Option<&Bson>| matches!(u, Some(Bson::Document(d)) if d.keys().next().is_some_and(|k| !k.starts_with('$')));
    match name {
        "update" => body
            .get_array("updates")
            .map(|us| {
                us.iter()
                    .any(|u| replaces(u.as_document().and_then(|d| d.get("u"))))
            })
            .unwrap_or(false),
        "findAndModify" | "findandmodify" => replaces(body.get("update")),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_events_and_positions() {
        let mut log = ChangeLog {
            enabled: true,
            ..Default::default()
        };
        let ts = Timestamp {
            time: 1,
            increment: 1,
        };
        let before = vec![doc! { "_id": 1, "a": 1 }, doc! { "_id": 2 }];
        let after = vec![doc! { "_id": 1, "a": 2 }, doc! { "_id": 3 }];
        let start = log.start_position(&doc! {}).unwrap();
        log.record_diff("d", "c", &before, &after, false, ts, true);
        let seen = Visibility::default();
        let (events, next) = log.read(start, &Scope::Collection("d".into(), "c".into()), seen, 10);
        let ops: Vec<&str> = events
            .iter()
            .map(|(_, e, _)| e.get_str("operationType").unwrap())
            .collect();
        assert_eq!(events[0].2.pre, Some(doc! { "_id": 1, "a": 1 }));
        assert_eq!(events[0].2.post, Some(doc! { "_id": 1, "a": 2 }));
        assert_eq!(ops, ["update", "insert", "delete"]);
        assert_eq!(next, log.next_seq());
        let (none, _) = log.read(start, &Scope::Database("other".into()), seen, 10);
        assert!(none.is_empty());
        // Resume after the first event.
        let tok = Bson::Document(token(events[0].0));
        let from = log.start_position(&doc! { "resumeAfter": tok }).unwrap();
        let (rest, _) = log.read(from, &Scope::Cluster, seen, 10);
        assert_eq!(rest.len(), 2);
        // Batches stop at max.
        let (one, next) = log.read(start, &Scope::Cluster, seen, 1);
        assert_eq!(one.len(), 1);
        assert_eq!(next, one[0].0 + 1);
    }

    #[test]
    fn update_descriptions_follow_mongods_delta() {
        let delta = |old: Document, new: Document| {
            let mut d = Delta::default();
            d.documents(&mut Vec::new(), &old, &new);
            d
        };
        let d = delta(doc! { "a": { "1": 1 }, "b": 1 }, doc! { "a": { "1": 2 } });
        assert_eq!(d.updated, doc! { "a.1": 2 });
        assert_eq!(d.removed, vec![Bson::String("b".into())]);
        assert_eq!(d.disambiguated, doc! { "a.1": ["a", "1"] });
        let d = delta(doc! { "a": [{ "1": 1 }] }, doc! { "a": [{ "1": 2 }] });
        assert_eq!(d.disambiguated, doc! { "a.0.1": ["a", 0, "1"] });
        let d = delta(doc! { "a": [1, 2, 3] }, doc! { "a": [1] });
        assert!(d.updated.is_empty());
        assert_eq!(
            d.truncated,
            vec![Bson::Document(doc! { "field": "a", "newSize": 1 })]
        );
        // A sub-document that lost fields, or an array changed otherwise, is set whole.
        let d = delta(
            doc! { "a": { "x": 1, "y": 1 }, "b": [1] },
            doc! { "a": { "x": 2 }, "b": [2] },
        );
        assert_eq!(d.updated, doc! { "a": { "x": 2 }, "b": [2] });
        assert!(d.disambiguated.is_empty());
    }

    #[test]
    fn expanded_and_invalidate_events_reach_only_the_streams_that_see_them() {
        let mut log = ChangeLog {
            enabled: true,
            ..Default::default()
        };
        let ts = Timestamp {
            time: 1,
            increment: 1,
        };
        let start = log.start_position(&doc! {}).unwrap();
        log.record_catalog("d", "c", ts, doc! { "operationType": "create" }, true);
        log.record_catalog("d", "c", ts, doc! { "operationType": "drop" }, false);
        let ops = |scope: Scope, show_expanded: bool| -> Vec<String> {
            let (events, _) = log.read(start, &scope, Visibility { show_expanded }, 10);
            events
                .iter()
                .map(|(_, e, _)| e.get_str("operationType").unwrap().to_string())
                .collect()
        };
        let coll = || Scope::Collection("d".into(), "c".into());
        assert_eq!(ops(coll(), false), ["drop", "invalidate"]);
        assert_eq!(ops(coll(), true), ["create", "drop", "invalidate"]);
        assert_eq!(ops(Scope::Database("d".into()), false), ["drop"]);
    }
}
