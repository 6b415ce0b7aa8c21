//! Server-side cursors: ids, batches, getMore, killCursors, idle timeout and ownership cleanup.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use rand::Rng;

use super::changes::{self, Scope};
use super::error::{codes, CommandError};
use super::session::SessionKey;

/// Default number of documents in a first batch (mongod's 101).
pub(crate) const DEFAULT_FIRST_BATCH: usize = 101;
/// Byte budget of one batch (a little under 16 MiB, leaving room for the reply envelope).
const BATCH_BYTES: usize = 16 * 1024 * 1024 - 64 * 1024;

/// What kind of cursor this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CursorKind {
    /// A plain result set.
    Normal,
    /// A change stream: never exhausted, always empty, reports a resume token.
    ChangeStream,
    /// A tailable find on a capped collection: stays open when its documents run out, and a
    /// getMore then returns the documents inserted after the last one it queued.
    Tailable,
}

/// Where a tailable cursor is: the collection and filter it reads, and the `_id` of the last
/// document it queued (the next getMore reads what follows it in natural order).
#[derive(Debug, Clone)]
pub(crate) struct TailState {
    pub(crate) db: String,
    pub(crate) coll: String,
    pub(crate) filter: Document,
    pub(crate) last_id: Option<Bson>,
    /// `awaitData`: a getMore with nothing to return waits for new documents, up to its
    /// `maxTimeMS` (which is then the wait, not a deadline).
    pub(crate) await_data: bool,
}

/// How a cursor learns that its results are exhausted, which decides whether the batch that
/// takes the last document also closes the cursor (mongod's `PlanExecutor::isEOF()` after a
/// batch; see docs/emulator.md, "Cursors").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CursorEnd {
    /// The end is known as soon as the last document is taken: mongod's queued results
    /// (listCollections, listIndexes, bulkWrite results), a find whose `limit` is reached by a
    /// limit stage, an `_id` point lookup, a collection that does not exist. The batch that
    /// empties the cursor returns id 0.
    Known,
    /// The end is found only by reading past the last document (collection scans, blocking
    /// sorts, aggregation pipelines). A batch that fills up exactly keeps the cursor open; the
    /// next getMore returns an empty batch and id 0. A batch that had room and ran out closes.
    Lazy,
}

/// Where a change-stream cursor is and what it reads.
#[derive(Debug, Clone)]
pub(crate) struct StreamState {
    pub(crate) scope: Scope,
    pub(crate) next_seq: u64,
    /// Pipeline stages after `$changeStream`.
    pub(crate) stages: Vec<Document>,
    pub(crate) db: String,
    /// Which events beyond the scope the stream sees (`showExpandedEvents`).
    pub(crate) visibility: changes::Visibility,
    /// `fullDocument` (`default`, `updateLookup`, `whenAvailable`, `required`).
    pub(crate) full_document: String,
    /// `fullDocumentBeforeChange` (`off`, `whenAvailable`, `required`).
    pub(crate) full_document_before_change: String,
}

pub(crate) struct Cursor {
    pub(crate) ns: String,
    docs: VecDeque<Document>,
    stream: Option<StreamState>,
    tail: Option<TailState>,
    pub(crate) kind: CursorKind,
    end: CursorEnd,
    pub(crate) owner_conn: u64,
    pub(crate) lsid: Option<SessionKey>,
    last_used: Instant,
}

/// All open cursors.
#[derive(Default)]
pub(crate) struct Cursors {
    map: HashMap<i64, Cursor>,
}

/// How a batch is requested.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchLimit {
    /// `batchSize` (None: default for first batch, everything for getMore).
    pub(crate) size: Option<usize>,
}

/// Whether these documents fit in one batch's byte budget, as [`take_batch`] counts it.
pub(crate) fn fits_in_one_batch(docs: &[Bson]) -> bool {
    let mut bytes = 0usize;
    for d in docs {
        let size = match d {
            Bson::Document(d) => bson::to_vec(d).map(|v| v.len()).unwrap_or(0),
            _ => 0,
        };
        bytes += size;
        if bytes > BATCH_BYTES {
            return false;
        }
    }
    true
}

/// Takes up to `limit` documents (and the byte budget) off the front of `docs`.
fn take_batch(docs: &mut VecDeque<Document>, limit: usize) -> Vec<Bson> {
    let mut out = Vec::new();
    let mut bytes = 0usize;
    while out.len() < limit {
        let Some(d) = docs.front() else { break };
        let size = bson::to_vec(d).map(|v| v.len()).unwrap_or(0);
        if !out.is_empty() && bytes + size > BATCH_BYTES {
            break;
        }
        bytes += size;
        if let Some(d) = docs.pop_front() {
            out.push(Bson::Document(d));
        }
    }
    out
}

/// Whether a cursor is done after a batch of `taken` documents out of `room`: nothing is left
/// and either the end was known, or the batch had room and so read past the last document.
fn exhausted_after(end: CursorEnd, left: &VecDeque<Document>, taken: usize, room: usize) -> bool {
    left.is_empty() && (end == CursorEnd::Known || taken < room)
}

/// Reads `batchSize` from a number.
pub(crate) fn batch_size(v: Option<&Bson>) -> Result<Option<usize>, CommandError> {
    let n = match v {
        None | Some(Bson::Null) => return Ok(None),
        Some(Bson::Int32(i)) => i64::from(*i),
        Some(Bson::Int64(i)) => *i,
        Some(Bson::Double(d)) if d.is_finite() => *d as i64,
        Some(_) => return Err(CommandError::type_mismatch("batchSize must be a number")),
    };
    if n < 0 {
        return Err(CommandError::bad_value("batchSize must be non-negative"));
    }
    Ok(Some(n as usize))
}

impl Cursors {
    /// Builds a cursor reply for `docs`: the first batch goes out at once; when documents remain
    /// (or the cursor is a change stream) a cursor is registered and its id returned.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open(
        &mut self,
        ns: String,
        docs: Vec<Document>,
        kind: CursorKind,
        end: CursorEnd,
        limit: BatchLimit,
        single_batch: bool,
        tail: Option<TailState>,
        owner_conn: u64,
        lsid: Option<SessionKey>,
        max_per_conn: usize,
        max_total: usize,
    ) -> Result<Document, CommandError> {
        let mut docs: VecDeque<Document> = docs.into();
        let room = limit.size.unwrap_or(DEFAULT_FIRST_BATCH);
        let batch = take_batch(&mut docs, room);
        let keep = kind == CursorKind::ChangeStream
            || (!single_batch && tail.is_some())
            || (!single_batch && !exhausted_after(end, &docs, batch.len(), room));
        let mut id = 0i64;
        if keep {
            id = self.new_id(owner_conn, max_per_conn, max_total)?;
            self.map.insert(
                id,
                Cursor {
                    ns: ns.clone(),
                    docs,
                    stream: None,
                    tail,
                    kind,
                    end,
                    owner_conn,
                    lsid,
                    last_used: Instant::now(),
                },
            );
        }
        let mut cursor = doc! { "firstBatch": batch, "id": id, "ns": ns };
        if kind == CursorKind::ChangeStream {
            cursor.insert("postBatchResumeToken", resume_token());
        }
        Ok(doc! { "cursor": cursor, "ok": 1.0 })
    }

    fn new_id(
        &self,
        owner_conn: u64,
        max_per_conn: usize,
        max_total: usize,
    ) -> Result<i64, CommandError> {
        let owned = self
            .map
            .values()
            .filter(|c| c.owner_conn == owner_conn)
            .count();
        if owned >= max_per_conn || self.map.len() >= max_total {
            return Err(CommandError::new(
                codes::TOO_MANY_CURSORS,
                format!("too many open cursors (limit {max_per_conn} per connection, {max_total} in total)"),
            ));
        }
        let mut rng = rand::rng();
        loop {
            let id = rng.random_range(1..i64::MAX);
            if !self.map.contains_key(&id) {
                return Ok(id);
            }
        }
    }

    /// Registers a change-stream cursor that already produced `first` and is at `state`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open_stream(
        &mut self,
        ns: String,
        state: StreamState,
        first: Vec<Bson>,
        owner_conn: u64,
        lsid: Option<SessionKey>,
        max_per_conn: usize,
        max_total: usize,
    ) -> Result<Document, CommandError> {
        let id = self.new_id(owner_conn, max_per_conn, max_total)?;
        let resume = changes::token(state.next_seq.saturating_sub(1));
        self.map.insert(
            id,
            Cursor {
                ns: ns.clone(),
                docs: VecDeque::new(),
                stream: Some(state),
                tail: None,
                kind: CursorKind::ChangeStream,
                end: CursorEnd::Lazy,
                owner_conn,
                lsid,
                last_used: Instant::now(),
            },
        );
        Ok(doc! {
            "cursor": { "firstBatch": first, "postBatchResumeToken": resume, "id": id, "ns": ns },
            "ok": 1.0,
        })
    }

    /// `getMore` on a change stream: `next` produces the batch and the new position from the
    /// cursor's state.
    /// The cursor a getMore names, if it exists and belongs to the namespace the getMore gives.
    fn owned(&mut self, id: i64, ns: &str) -> Result<&mut Cursor, CommandError> {
        let Some(cursor) = self.map.get_mut(&id) else {
            return Err(CommandError::new(
                codes::CURSOR_NOT_FOUND,
                format!("cursor id {id} not found"),
            ));
        };
        if cursor.ns != ns {
            return Err(CommandError::new(
                codes::UNAUTHORIZED,
                format!("Requested getMore on namespace '{ns}', but cursor belongs to a different namespace {}", cursor.ns),
            ));
        }
        Ok(cursor)
    }

    pub(crate) fn stream_get_more(
        &mut self,
        id: i64,
        ns: &str,
        next: impl FnOnce(&StreamState) -> Result<(Vec<Bson>, u64), CommandError>,
    ) -> Result<Document, CommandError> {
        let cursor = self.owned(id, ns)?;
        let Some(state) = cursor.stream.as_mut() else {
            return Err(CommandError::new(
                codes::CURSOR_NOT_FOUND,
                format!("cursor id {id} is not a change stream"),
            ));
        };
        cursor.last_used = Instant::now();
        let (batch, pos) = next(state)?;
        state.next_seq = pos;
        Ok(doc! {
            "cursor": {
                "nextBatch": batch,
                "postBatchResumeToken": changes::token(pos.saturating_sub(1)),
                "id": id,
                "ns": cursor.ns.clone(),
            },
            "ok": 1.0,
        })
    }

    /// The stream position of a change-stream cursor.
    pub(crate) fn stream_position(&self, id: i64) -> Option<u64> {
        self.map.get(&id)?.stream.as_ref().map(|s| s.next_seq)
    }

    /// Whether cursor `id` is an awaitData tailable cursor with nothing queued: where a getMore
    /// may have to wait, and `tail` then says what it would read.
    pub(crate) fn awaiting_tail(&self, id: i64) -> Option<&TailState> {
        let cursor = self.map.get(&id)?;
        let tail = cursor.tail.as_ref().filter(|t| t.await_data)?;
        cursor.docs.is_empty().then_some(tail)
    }

    /// Whether cursor `id` awaits data: a change stream's, or an awaitData tailable cursor.
    pub(crate) fn awaits_data(&self, id: i64) -> bool {
        self.map
            .get(&id)
            .is_some_and(|c| c.stream.is_some() || c.tail.as_ref().is_some_and(|t| t.await_data))
    }

    /// The cursor's kind and namespace, if it exists.
    pub(crate) fn peek(&self, id: i64) -> Option<(CursorKind, &str)> {
        self.map.get(&id).map(|c| (c.kind, c.ns.as_str()))
    }

    /// `getMore`: the next batch. `collection` must match the cursor's namespace. A tailable
    /// cursor with nothing queued first asks `more` for the documents after its last one.
    pub(crate) fn get_more(
        &mut self,
        id: i64,
        ns: &str,
        limit: BatchLimit,
        more: impl FnOnce(&TailState) -> Vec<Document>,
    ) -> Result<Document, CommandError> {
        let cursor = self.owned(id, ns)?;
        cursor.last_used = Instant::now();
        if let (true, Some(tail)) = (cursor.docs.is_empty(), cursor.tail.as_mut()) {
            let new = more(tail);
            if let Some(last) = new.last().and_then(|d| d.get("_id")) {
                tail.last_id = Some(last.clone());
            }
            cursor.docs.extend(new);
        }
        let room = limit.size.filter(|&n| n > 0).unwrap_or(usize::MAX);
        let batch = take_batch(&mut cursor.docs, room);
        let kind = cursor.kind;
        // A tailable cursor stays open until killed, as mongod's does.
        let exhausted = kind == CursorKind::Normal
            && exhausted_after(cursor.end, &cursor.docs, batch.len(), room);
        let ns = cursor.ns.clone();
        if exhausted {
            self.map.remove(&id);
        }
        let mut c = doc! { "nextBatch": batch, "id": if exhausted { 0i64 } else { id }, "ns": ns };
        if kind == CursorKind::ChangeStream {
            c.insert("postBatchResumeToken", resume_token());
        }
        Ok(doc! { "cursor": c, "ok": 1.0 })
    }

    /// `killCursors` on `ns`: `(killed, not_found)`.
    pub(crate) fn kill(&mut self, ns: &str, ids: &[i64]) -> (Vec<i64>, Vec<i64>) {
        let mut killed = Vec::new();
        let mut not_found = Vec::new();
        for &id in ids {
            if self.map.get(&id).is_some_and(|c| c.ns == ns) {
                self.map.remove(&id);
                killed.push(id);
            } else {
                not_found.push(id);
            }
        }
        (killed, not_found)
    }

    /// Closes cursors idle for longer than `timeout`.
    pub(crate) fn reap(&mut self, timeout: Duration) {
        let now = Instant::now();
        self.map.retain(|id, c| {
            let keep = now.duration_since(c.last_used) < timeout;
            if !keep {
                tracing::debug!(cursor = id, ns = %c.ns, "idle cursor timed out");
            }
            keep
        });
    }

    /// Closes the session-less cursors opened on connection `conn`.
    pub(crate) fn close_connection(&mut self, conn: u64) {
        self.map
            .retain(|_, c| !(c.lsid.is_none() && c.owner_conn == conn));
    }

    /// Closes the cursors of a session.
    pub(crate) fn close_session(&mut self, key: &SessionKey) {
        self.map.retain(|_, c| c.lsid.as_ref() != Some(key));
    }

    /// Closes every cursor that belongs to some session.
    pub(crate) fn close_all_sessions(&mut self) {
        self.map.retain(|_, c| c.lsid.is_none());
    }

    /// Number of open cursors.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

/// A resume token for the (always empty) change streams.
pub(crate) fn resume_token() -> Document {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    doc! { "_data": format!("82{now:08X}000000012B0429296E1404") }
}

/// The `ids` of a killCursors command.
pub(crate) fn ids_of(v: Option<&Bson>) -> Result<Vec<i64>, CommandError> {
    match v {
        Some(Bson::Array(a)) => a
            .iter()
            .map(|x| match x {
                Bson::Int64(i) => Ok(*i),
                Bson::Int32(i) => Ok(i64::from(*i)),
                _ => Err(CommandError::type_mismatch(
                    "cursor ids must be 64-bit integers",
                )),
            })
            .collect(),
        _ => Err(CommandError::failed_to_parse(
            "killCursors requires a 'cursors' array",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docs(n: i32) -> Vec<Document> {
        (0..n).map(|i| doc! {"_id": i}).collect()
    }

    #[test]
    fn batches_and_exhaustion() {
        let mut c = Cursors::default();
        let r = c
            .open(
                "d.c".into(),
                docs(5),
                CursorKind::Normal,
                CursorEnd::Lazy,
                BatchLimit { size: Some(2) },
                false,
                None,
                1,
                None,
                10,
                10,
            )
            .unwrap();
        let cur = r.get_document("cursor").unwrap();
        assert_eq!(cur.get_array("firstBatch").unwrap().len(), 2);
        let id = cur.get_i64("id").unwrap();
        assert_ne!(id, 0);
        let r = c
            .get_more(id, "d.c", BatchLimit { size: Some(2) }, |_| Vec::new())
            .unwrap();
        assert_eq!(r.get_document("cursor").unwrap().get_i64("id").unwrap(), id);
        let r = c
            .get_more(id, "d.c", BatchLimit { size: None }, |_| Vec::new())
            .unwrap();
        let cur = r.get_document("cursor").unwrap();
        assert_eq!(cur.get_array("nextBatch").unwrap().len(), 1);
        assert_eq!(cur.get_i64("id").unwrap(), 0);
        assert_eq!(
            c.get_more(id, "d.c", BatchLimit { size: None }, |_| Vec::new())
                .unwrap_err()
                .code,
            43
        );
    }

    #[test]
    fn exact_boundary_closes_on_the_next_get_more_unless_the_end_is_known() {
        let mut c = Cursors::default();
        let first = |c: &mut Cursors, end| {
            let r = c
                .open(
                    "d.c".into(),
                    docs(4),
                    CursorKind::Normal,
                    end,
                    BatchLimit { size: Some(2) },
                    false,
                    None,
                    1,
                    None,
                    10,
                    10,
                )
                .unwrap();
            r.get_document("cursor").unwrap().get_i64("id").unwrap()
        };
        let batch_of = |r: Document| {
            let cur = r.get_document("cursor").unwrap().clone();
            (
                cur.get_array("nextBatch").unwrap().len(),
                cur.get_i64("id").unwrap(),
            )
        };
        let id = first(&mut c, CursorEnd::Lazy);
        assert_ne!(id, 0);
        let two = BatchLimit { size: Some(2) };
        assert_eq!(
            batch_of(c.get_more(id, "d.c", two, |_| Vec::new()).unwrap()),
            (2, id)
        );
        assert_eq!(
            batch_of(c.get_more(id, "d.c", two, |_| Vec::new()).unwrap()),
            (0, 0)
        );
        let id = first(&mut c, CursorEnd::Known);
        assert_eq!(
            batch_of(c.get_more(id, "d.c", two, |_| Vec::new()).unwrap()),
            (2, 0)
        );
        // A batch with room closes a lazy cursor at once.
        let id = first(&mut c, CursorEnd::Lazy);
        let three = BatchLimit { size: Some(3) };
        assert_eq!(
            batch_of(c.get_more(id, "d.c", three, |_| Vec::new()).unwrap()),
            (2, 0)
        );
    }

    #[test]
    fn tailable_cursors_stay_open_and_read_what_follows() {
        let mut c = Cursors::default();
        let tail = TailState {
            db: "d".into(),
            coll: "c".into(),
            filter: Document::new(),
            last_id: Some(Bson::Int32(1)),
            await_data: false,
        };
        let r = c
            .open(
                "d.c".into(),
                docs(2),
                CursorKind::Tailable,
                CursorEnd::Known,
                BatchLimit { size: Some(2) },
                false,
                Some(tail),
                1,
                None,
                10,
                10,
            )
            .unwrap();
        let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
        assert_ne!(
            id, 0,
            "a tailable cursor stays open when its documents run out"
        );
        let none = c.get_more(id, "d.c", BatchLimit { size: None }, |_| Vec::new());
        let cur = none.unwrap().get_document("cursor").unwrap().clone();
        assert_eq!(
            (
                cur.get_array("nextBatch").unwrap().len(),
                cur.get_i64("id").unwrap()
            ),
            (0, id)
        );
        let mut asked_after = None;
        let r = c
            .get_more(id, "d.c", BatchLimit { size: None }, |t| {
                asked_after = t.last_id.clone();
                vec![doc! { "_id": 7 }]
            })
            .unwrap();
        assert_eq!(asked_after, Some(Bson::Int32(1)));
        let cur = r.get_document("cursor").unwrap();
        assert_eq!(cur.get_array("nextBatch").unwrap().len(), 1);
        let mut asked_after = None;
        c.get_more(id, "d.c", BatchLimit { size: None }, |t| {
            asked_after = t.last_id.clone();
            Vec::new()
        })
        .unwrap();
        assert_eq!(
            asked_after,
            Some(Bson::Int32(7)),
            "the next read starts after the new one"
        );
    }

    #[test]
    fn ownership_cleanup_and_limits() {
        let mut c = Cursors::default();
        let open = |c: &mut Cursors, conn| {
            c.open(
                "d.c".into(),
                docs(3),
                CursorKind::Normal,
                CursorEnd::Lazy,
                BatchLimit { size: Some(1) },
                false,
                None,
                conn,
                None,
                2,
                10,
            )
        };
        open(&mut c, 1).unwrap();
        open(&mut c, 1).unwrap();
        assert_eq!(open(&mut c, 1).unwrap_err().code, codes::TOO_MANY_CURSORS);
        open(&mut c, 2).unwrap();
        c.close_connection(1);
        assert_eq!(c.len(), 1);
        c.reap(Duration::ZERO);
        assert_eq!(c.len(), 0);
    }
}
