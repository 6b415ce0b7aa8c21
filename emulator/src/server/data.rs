//! Data commands (CRUD, catalog, cursors, client bulkWrite) on one [`Store`]: either the shared
//! store or a transaction's private copy.

use std::collections::BTreeMap;

use bson::{doc, Bson, Document};

use super::changes::{self, ChangeLog, Scope};
use super::cursor::{self, BatchLimit, CursorEnd, CursorKind, Cursors, StreamState, TailState};
use super::error::{codes, CommandError};
use super::session::SessionKey;
use crate::engine::{
    id_key, not_supported_on_view, with_bypass, with_collation, Collation, DeleteOutcome,
    DeleteStatement, FindAndModifySpec, FindSpec, IdKey, ResolvedView, Store, UpdateOutcome,
    UpdateStatement, WriteError,
};

/// Fields the driver adds to every command; never passed on as command options.
pub(crate) const GENERIC_FIELDS: &[&str] = &[
    "$db",
    "lsid",
    "txnNumber",
    "startTransaction",
    "autocommit",
    "$clusterTime",
    "readConcern",
    "writeConcern",
    "$readPreference",
    "apiVersion",
    "apiStrict",
    "apiDeprecationErrors",
    "comment",
    "maxTimeMS",
    "recoveryToken",
    "$audit",
    "$client",
    "mayBypassWriteBlocking",
    "$queryOptions",
];

/// Commands that modify data (rejected on secondaries, recorded in transactions).
pub(crate) fn is_write(name: &str) -> bool {
    matches!(
        name,
        "insert"
            | "update"
            | "delete"
            | "findAndModify"
            | "findandmodify"
            | "bulkWrite"
            | "create"
            | "drop"
            | "dropDatabase"
            | "createIndexes"
            | "dropIndexes"
            | "collMod"
    )
}

/// Commands that may run as retryable writes.
pub(crate) fn is_retryable_write(name: &str) -> bool {
    matches!(
        name,
        "insert" | "update" | "delete" | "findAndModify" | "findandmodify" | "bulkWrite"
    )
}

/// Commands that read data (need secondaryOk on a secondary).
pub(crate) fn is_read(name: &str) -> bool {
    matches!(
        name,
        "find"
            | "count"
            | "distinct"
            | "aggregate"
            | "listCollections"
            | "listIndexes"
            | "listDatabases"
            | "collStats"
    )
}

/// Every data command this module serves.
pub(crate) fn is_data_command(name: &str) -> bool {
    is_write(name) || is_read(name) || matches!(name, "getMore" | "killCursors")
}

/// Whether an aggregate pipeline writes (`$out` / `$merge` as last stage).
pub(crate) fn pipeline_writes(body: &Document) -> bool {
    match body.get_array("pipeline").ok().and_then(|p| p.last()) {
        Some(Bson::Document(d)) => d.contains_key("$out") || d.contains_key("$merge"),
        _ => false,
    }
}

/// The collections a write command changes (`(db, coll)`), for write-conflict detection.
pub(crate) fn write_targets(name: &str, db: &str, body: &Document) -> Vec<(String, String)> {
    match name {
        "insert" | "update" | "delete" | "findAndModify" | "findandmodify" => {
            match body.get(name) {
                Some(Bson::String(c)) => vec![(db.to_string(), c.clone())],
                _ => Vec::new(),
            }
        }
        "bulkWrite" => match body.get("nsInfo") {
            Some(Bson::Array(infos)) => infos
                .iter()
                .filter_map(|i| i.as_document()?.get_str("ns").ok())
                .filter_map(split_ns)
                .map(|(d, c)| (d.to_string(), c.to_string()))
                .collect(),
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// `_id`s of documents that differ between `before` and `after` (inserted, deleted or changed).
pub(crate) fn changed_ids(before: &[Document], after: &[Document]) -> Vec<IdKey> {
    let index = |docs: &[Document]| -> BTreeMap<IdKey, Document> {
        docs.iter()
            .filter_map(|d| Some((id_key(d.get("_id")?), d.clone())))
            .collect()
    };
    let old = index(before);
    let new = index(after);
    let mut out: Vec<IdKey> = old
        .iter()
        .filter(|(k, d)| new.get(*k) != Some(*d))
        .map(|(k, _)| k.clone())
        .collect();
    out.extend(new.keys().filter(|k| !old.contains_key(*k)).cloned());
    out
}

/// Context a data command needs besides the store.
pub(crate) struct DataCtx<'a> {
    pub(crate) conn_serial: u64,
    pub(crate) lsid: Option<SessionKey>,
    pub(crate) max_cursors_per_connection: usize,
    pub(crate) max_cursors: usize,
    pub(crate) replicated: bool,
    /// `$listLocalSessions` input, prepared by the caller when the pipeline asks for it.
    pub(crate) local_sessions: Option<Vec<Document>>,
    /// `$currentOp` input (`current_op.rs`), prepared by the caller when the pipeline starts
    /// with it.
    pub(crate) current_ops: Option<Vec<Document>>,
    pub(crate) cursors: &'a mut Cursors,
    pub(crate) changes: &'a mut ChangeLog,
    /// Lab-only `labBulkWriteBatchSize`: the most results in a client bulkWrite's first batch
    /// when the command names no `cursor.batchSize` (the driver never does), so tests can make
    /// the driver read results with getMore.
    pub(crate) bulk_write_batch_size: Option<usize>,
}

impl DataCtx<'_> {
    fn open_cursor(
        &mut self,
        ns: String,
        docs: Vec<Document>,
        kind: CursorKind,
        end: CursorEnd,
        limit: BatchLimit,
        single: bool,
    ) -> Result<Document, CommandError> {
        self.cursors.open(
            ns,
            docs,
            kind,
            end,
            limit,
            single,
            None,
            self.conn_serial,
            self.lsid.clone(),
            self.max_cursors_per_connection,
            self.max_cursors,
        )
    }
}

/// How mongod's find plan for `spec` learns its end (`PlanExecutor::isEOF()`), given that
/// `found` documents matched. Known at once: a collection that does not exist (an EOF plan),
/// an `_id` point lookup (IDHACK), or a `limit` that is reached by a limit stage, which mongod
/// adds when no blocking sort enforces the limit: no sort, or a sort on `_id` alone (the `_id`
/// index gives the order). Otherwise (scans, blocking sorts, a limit not reached) the end is
/// found only by reading past the last document.
fn find_cursor_end(
    store: &Store,
    db: &str,
    coll: &str,
    spec: &FindSpec,
    found: usize,
) -> CursorEnd {
    if !store.has_collection(db, coll) {
        return CursorEnd::Known;
    }
    let id_lookup = spec.filter.len() == 1
        && spec.sort.as_ref().is_none_or(|s| s.is_empty())
        && spec.skip == 0
        && match spec.filter.get("_id") {
            Some(Bson::Document(d)) => d.keys().next().is_some_and(|k| !k.starts_with('$')),
            Some(Bson::RegularExpression(_)) | Some(Bson::Array(_)) | None => false,
            Some(_) => true,
        };
    if id_lookup {
        return CursorEnd::Known;
    }
    let limit = spec.limit.map(i64::unsigned_abs).filter(|&l| l > 0);
    let sort_by_index_order = match &spec.sort {
        None => true,
        Some(s) => s.is_empty() || (s.len() == 1 && s.contains_key("_id")),
    };
    match limit {
        Some(l) if sort_by_index_order && found as u64 >= l => CursorEnd::Known,
        _ => CursorEnd::Lazy,
    }
}

/// The collection named by the command's first field.
pub(crate) fn coll_arg<'a>(body: &'a Document, name: &str) -> Result<&'a str, CommandError> {
    match body.get(name) {
        Some(Bson::String(s)) if !s.is_empty() && !s.contains('\0') => Ok(s),
        Some(Bson::String(_)) => Err(CommandError::new(
            codes::INVALID_NAMESPACE,
            "Invalid namespace specified",
        )),
        _ => Err(CommandError::new(
            codes::INVALID_NAMESPACE,
            format!(
                "collection name has invalid type {}",
                type_name(body.get(name))
            ),
        )),
    }
}

fn type_name(v: Option<&Bson>) -> &'static str {
    match v {
        None => "missing",
        Some(Bson::Double(_)) => "double",
        Some(Bson::Int32(_)) => "int",
        Some(Bson::Int64(_)) => "long",
        Some(Bson::Document(_)) => "object",
        Some(Bson::Array(_)) => "array",
        Some(Bson::Boolean(_)) => "bool",
        Some(Bson::Null) => "null",
        Some(_) => "other",
    }
}

fn docs_arg(body: &Document, field: &str, required: bool) -> Result<Vec<Document>, CommandError> {
    match body.get(field) {
        Some(Bson::Array(a)) => a
            .iter()
            .map(|x| match x {
                Bson::Document(d) => Ok(d.clone()),
                _ => Err(CommandError::type_mismatch(format!(
                    "'{field}' must be an array of documents"
                ))),
            })
            .collect(),
        None if !required => Ok(Vec::new()),
        None => Err(CommandError::failed_to_parse(format!(
            "BSON field '{field}' is missing but a required field"
        ))),
        Some(_) => Err(CommandError::type_mismatch(format!(
            "'{field}' must be an array"
        ))),
    }
}

fn opt_doc<'a>(body: &'a Document, field: &str) -> Result<Option<&'a Document>, CommandError> {
    match body.get(field) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Document(d)) => Ok(Some(d)),
        Some(_) => Err(CommandError::type_mismatch(format!(
            "'{field}' must be a document"
        ))),
    }
}

fn bool_arg(body: &Document, field: &str, default: bool) -> bool {
    match body.get(field) {
        Some(Bson::Boolean(b)) => *b,
        Some(Bson::Int32(i)) => *i != 0,
        Some(Bson::Int64(i)) => *i != 0,
        Some(Bson::Double(d)) => *d != 0.0,
        _ => default,
    }
}

fn int_arg(body: &Document, field: &str) -> Result<Option<i64>, CommandError> {
    match body.get(field) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Int32(i)) => Ok(Some(i64::from(*i))),
        Some(Bson::Int64(i)) => Ok(Some(*i)),
        Some(Bson::Double(d)) if d.is_finite() => Ok(Some(*d as i64)),
        Some(_) => Err(CommandError::type_mismatch(format!(
            "'{field}' must be a number"
        ))),
    }
}

fn count_bson(n: u64) -> Bson {
    match i32::try_from(n) {
        Ok(i) => Bson::Int32(i),
        Err(_) => Bson::Int64(n as i64),
    }
}

fn write_error_doc(w: &WriteError) -> Document {
    let mut d =
        doc! { "index": w.index as i32, "code": w.error.code, "errmsg": w.error.message.clone() };
    // DuplicateKey's keyPattern and keyValue, as mongod reports them in each write error.
    for (k, v) in w.error.details.iter().flat_map(|e| e.iter()) {
        d.insert(k.clone(), v.clone());
    }
    d
}

fn add_write_errors(reply: &mut Document, errors: &[WriteError]) {
    if !errors.is_empty() {
        reply.insert(
            "writeErrors",
            errors
                .iter()
                .map(|w| Bson::Document(write_error_doc(w)))
                .collect::<Vec<_>>(),
        );
    }
}

fn cursor_batch(body: &Document) -> Result<BatchLimit, CommandError> {
    let size = match body.get("cursor") {
        Some(Bson::Document(c)) => cursor::batch_size(c.get("batchSize"))?,
        None => None,
        Some(_) => return Err(CommandError::type_mismatch("'cursor' must be a document")),
    };
    Ok(BatchLimit { size })
}

/// Runs one data command, with the variables of its `let` option bound (find, aggregate,
/// update, delete, findAndModify and client bulkWrite take one; `$$name` then resolves in
/// `$expr`, pipelines and pipeline updates).
pub(crate) fn run(
    name: &str,
    db: &str,
    body: &Document,
    store: &mut Store,
    ctx: &mut DataCtx<'_>,
) -> Result<Document, CommandError> {
    // A command-level collation covers the whole command; update and delete statements and
    // client bulkWrite operations carry their own (see `update_each`). Without one, the
    // collection's or view's default collation applies.
    let collation = match name {
        "find" | "count" | "distinct" | "aggregate" | "findAndModify" | "findandmodify" => {
            let default = default_collation(store, db, body.get(name).and_then(Bson::as_str))?;
            collation_or(body, &default)?
        }
        _ => None,
    };
    let bypass = bool_arg(body, "bypassDocumentValidation", false);
    let run_collated = |store: &mut Store, ctx: &mut DataCtx<'_>| {
        with_bypass(bypass, || {
            with_collation(collation.as_ref(), || {
                run_command(name, db, body, store, ctx)
            })
        })
    };
    match body.get("let") {
        None => run_collated(store, ctx),
        Some(Bson::Document(vars)) => {
            crate::engine::with_variables(vars, || run_collated(store, ctx))?
        }
        Some(other) => Err(CommandError::type_mismatch(format!(
            "BSON field '{name}.let' is the wrong type '{}', expected type 'object'",
            type_name(Some(other))
        ))),
    }
}

/// The `collation` of a command, statement or bulkWrite operation (`None`: simple), or
/// `default` (the collection's) when it names none; an explicit `locale: "simple"` overrides
/// the default.
fn collation_or(
    spec: &Document,
    default: &Option<Collation>,
) -> Result<Option<Collation>, CommandError> {
    match spec.get("collation") {
        None | Some(Bson::Null) => Ok(default.clone()),
        Some(value) => Ok(Collation::from_bson(value)?),
    }
}

/// Runs write statements one at a time, each under its own collation, and merges the outcomes
/// as one command's: `n`s add up, per-statement results keep their index in the command, and
/// an ordered command stops at the first failed statement.
fn update_each(
    store: &mut Store,
    db: &str,
    coll: &str,
    stmts: &[UpdateStatement],
    collations: &[Option<Collation>],
    ordered: bool,
) -> UpdateOutcome {
    let mut merged = UpdateOutcome::default();
    for (index, (stmt, collation)) in stmts.iter().zip(collations).enumerate() {
        let out = with_collation(collation.as_ref(), || {
            store.update(db, coll, std::slice::from_ref(stmt), true)
        });
        merged.n += out.n;
        merged.n_modified += out.n_modified;
        merged
            .upserted
            .extend(out.upserted.into_iter().map(|(_, id)| (index, id)));
        let failed = !out.write_errors.is_empty();
        merged.write_errors.extend(
            out.write_errors
                .into_iter()
                .map(|w| WriteError { index, ..w }),
        );
        if failed && ordered {
            break;
        }
    }
    merged
}

/// [`update_each`] for delete statements.
fn delete_each(
    store: &mut Store,
    db: &str,
    coll: &str,
    stmts: &[DeleteStatement],
    collations: &[Option<Collation>],
    ordered: bool,
) -> DeleteOutcome {
    let mut merged = DeleteOutcome::default();
    for (index, (stmt, collation)) in stmts.iter().zip(collations).enumerate() {
        let out = with_collation(collation.as_ref(), || {
            store.delete(db, coll, std::slice::from_ref(stmt), true)
        });
        merged.n += out.n;
        let failed = !out.write_errors.is_empty();
        merged.write_errors.extend(
            out.write_errors
                .into_iter()
                .map(|w| WriteError { index, ..w }),
        );
        if failed && ordered {
            break;
        }
    }
    merged
}

/// The default collation of the collection or view a command names (its `collation` option).
fn default_collation(
    store: &Store,
    db: &str,
    target: Option<&str>,
) -> Result<Option<Collation>, CommandError> {
    match target {
        Some(coll) => match store.default_collation(db, coll) {
            Some(spec) => Ok(Collation::parse(&spec)?),
            None => Ok(None),
        },
        None => Ok(None),
    }
}

/// A view's pipeline followed by `stages`.
fn through_view(view: &ResolvedView, stages: impl IntoIterator<Item = Document>) -> Vec<Document> {
    view.pipeline.iter().cloned().chain(stages).collect()
}

/// `find` on a view: the view's pipeline, then the find's filter, sort, skip, limit and
/// projection as stages, as mongod rewrites it.
fn find_on_view(
    store: &mut Store,
    db: &str,
    view: &ResolvedView,
    spec: &FindSpec,
) -> Result<Vec<Document>, CommandError> {
    let mut stages = vec![doc! { "$match": spec.filter.clone() }];
    if let Some(sort) = spec.sort.as_ref().filter(|s| !s.is_empty()) {
        stages.push(doc! { "$sort": sort.clone() });
    }
    if spec.skip > 0 {
        stages.push(doc! { "$skip": i64::try_from(spec.skip).unwrap_or(i64::MAX) });
    }
    if let Some(limit) = spec.limit.filter(|l| *l != 0) {
        stages.push(doc! { "$limit": limit.saturating_abs() });
    }
    if let Some(projection) = spec.projection.as_ref().filter(|p| !p.is_empty()) {
        stages.push(doc! { "$project": projection.clone() });
    }
    Ok(store.aggregate(db, &view.source, &through_view(view, stages))?)
}

/// Commands that write to (or manage the indexes of) the collection they name: on a view they
/// fail with 166 CommandNotSupportedOnView.
fn needs_collection(name: &str) -> bool {
    matches!(
        name,
        "insert"
            | "update"
            | "delete"
            | "findAndModify"
            | "findandmodify"
            | "createIndexes"
            | "dropIndexes"
            | "listIndexes"
    )
}

fn run_command(
    name: &str,
    db: &str,
    body: &Document,
    store: &mut Store,
    ctx: &mut DataCtx<'_>,
) -> Result<Document, CommandError> {
    if needs_collection(name) {
        if let Some(coll) = body.get(name).and_then(Bson::as_str) {
            if store.is_view(db, coll) {
                return Err(not_supported_on_view(db, coll).into());
            }
        }
    }
    match name {
        "insert" => {
            let coll = coll_arg(body, name)?;
            let docs = docs_arg(body, "documents", true)?;
            let out = store.insert(db, coll, docs, bool_arg(body, "ordered", true));
            let mut r = doc! { "n": count_bson(out.n) };
            add_write_errors(&mut r, &out.write_errors);
            r.insert("ok", 1.0);
            Ok(r)
        }
        "update" => {
            let coll = coll_arg(body, name)?;
            let docs = docs_arg(body, "updates", true)?;
            let stmts = docs
                .iter()
                .map(UpdateStatement::from_command)
                .collect::<Result<Vec<_>, _>>()?;
            let default = default_collation(store, db, Some(coll))?;
            let collations = docs
                .iter()
                .map(|d| collation_or(d, &default))
                .collect::<Result<Vec<_>, _>>()?;
            let ordered = bool_arg(body, "ordered", true);
            let out = if collations.iter().all(Option::is_none) {
                store.update(db, coll, &stmts, ordered)
            } else {
                update_each(store, db, coll, &stmts, &collations, ordered)
            };
            let mut r = doc! { "n": count_bson(out.n), "nModified": count_bson(out.n_modified) };
            if !out.upserted.is_empty() {
                let ups: Vec<Bson> = out
                    .upserted
                    .iter()
                    .map(|(i, id)| Bson::Document(doc! { "index": *i as i32, "_id": id.clone() }))
                    .collect();
                r.insert("upserted", ups);
            }
            add_write_errors(&mut r, &out.write_errors);
            r.insert("ok", 1.0);
            Ok(r)
        }
        "delete" => {
            let coll = coll_arg(body, name)?;
            let docs = docs_arg(body, "deletes", true)?;
            let stmts = docs
                .iter()
                .map(DeleteStatement::from_command)
                .collect::<Result<Vec<_>, _>>()?;
            let default = default_collation(store, db, Some(coll))?;
            let collations = docs
                .iter()
                .map(|d| collation_or(d, &default))
                .collect::<Result<Vec<_>, _>>()?;
            let ordered = bool_arg(body, "ordered", true);
            let out = if collations.iter().all(Option::is_none) {
                store.delete(db, coll, &stmts, ordered)
            } else {
                delete_each(store, db, coll, &stmts, &collations, ordered)
            };
            let mut r = doc! { "n": count_bson(out.n) };
            add_write_errors(&mut r, &out.write_errors);
            r.insert("ok", 1.0);
            Ok(r)
        }
        "findAndModify" | "findandmodify" => {
            let coll = coll_arg(body, name)?;
            let spec = FindAndModifySpec::from_command(body)?;
            let out = store.find_and_modify(db, coll, &spec)?;
            Ok(doc! {
                "lastErrorObject": out.last_error_object(!spec.remove),
                "value": out.value.clone().map(Bson::Document).unwrap_or(Bson::Null),
                "ok": 1.0,
            })
        }
        "find" if bool_arg(body, "tailable", false) => {
            let coll = coll_arg(body, name)?;
            let capped = store
                .list_collections(db, Some(&doc! { "name": coll }), false)?
                .first()
                .and_then(|c| c.get_document("options").ok())
                .is_some_and(|o| o.get_bool("capped") == Ok(true));
            if !capped {
                return Err(CommandError::bad_value(format!(
                    "error processing query: ns={db}.{coll}: tailable cursor requested on non \
                     capped collection"
                )));
            }
            let spec = FindSpec::from_command(body)?;
            let docs = store.find(db, coll, &spec)?;
            let tail = TailState {
                db: db.to_string(),
                coll: coll.to_string(),
                filter: opt_doc(body, "filter")?.cloned().unwrap_or_default(),
                last_id: docs.last().and_then(|d| d.get("_id")).cloned(),
                await_data: bool_arg(body, "awaitData", false),
            };
            let limit = BatchLimit {
                size: cursor::batch_size(body.get("batchSize"))?,
            };
            // mongod's tailable cursor on an empty collection is dead at once.
            let tail = tail.last_id.is_some().then_some(tail);
            ctx.cursors.open(
                format!("{db}.{coll}"),
                docs,
                CursorKind::Tailable,
                CursorEnd::Known,
                limit,
                bool_arg(body, "singleBatch", false),
                tail,
                ctx.conn_serial,
                ctx.lsid.clone(),
                ctx.max_cursors_per_connection,
                ctx.max_cursors,
            )
        }
        "find" => {
            let coll = coll_arg(body, name)?;
            let spec = FindSpec::from_command(body)?;
            let mut docs = match store.resolve_view(db, coll)? {
                Some(view) => find_on_view(store, db, &view, &spec)?,
                None => store.find(db, coll, &spec)?,
            };
            let end = find_cursor_end(store, db, coll, &spec, docs.len());
            if bool_arg(body, "returnKey", false) {
                docs = index_keys(store, db, coll, body, docs)?;
            } else if bool_arg(body, "showRecordId", false) {
                for (n, d) in docs.iter_mut().enumerate() {
                    d.insert("$recordId", i64::try_from(n).unwrap_or(i64::MAX) + 1);
                }
            }
            let mut limit = BatchLimit {
                size: cursor::batch_size(body.get("batchSize"))?,
            };
            let mut single = bool_arg(body, "singleBatch", false);
            if let Some(l) = int_arg(body, "limit")? {
                if l < 0 {
                    single = true;
                    limit.size = Some(l.unsigned_abs() as usize);
                }
            }
            ctx.open_cursor(
                format!("{db}.{coll}"),
                docs,
                CursorKind::Normal,
                end,
                limit,
                single,
            )
        }
        "getMore" => {
            let id = match body.get("getMore") {
                Some(Bson::Int64(i)) => *i,
                Some(Bson::Int32(i)) => i64::from(*i),
                _ => {
                    return Err(CommandError::type_mismatch(
                        "'getMore' must be a 64-bit integer cursor id",
                    ))
                }
            };
            let coll = match body.get("collection") {
                Some(Bson::String(s)) => s.as_str(),
                _ => {
                    return Err(CommandError::failed_to_parse(
                        "getMore requires a 'collection' string",
                    ))
                }
            };
            let limit = BatchLimit {
                size: cursor::batch_size(body.get("batchSize"))?,
            };
            let ns = format!("{db}.{coll}");
            // mongod (getmore_cmd.cpp, validateMaxTimeMS): maxTimeMS on a getMore is the wait of
            // an awaitData cursor, and an error on any other.
            if body.contains_key("maxTimeMS")
                && ctx.cursors.peek(id).is_some()
                && !ctx.cursors.awaits_data(id)
            {
                return Err(CommandError::bad_value(
                    "cannot set maxTimeMS on getMore command for a non-awaitData cursor",
                ));
            }
            if matches!(ctx.cursors.peek(id), Some((CursorKind::ChangeStream, _))) {
                let log = &*ctx.changes;
                return ctx
                    .cursors
                    .stream_get_more(id, &ns, |s| stream_batch(log, store, s, limit.size));
            }
            let store = &*store;
            ctx.cursors
                .get_more(id, &ns, limit, |tail| tail_documents(store, tail))
        }
        "killCursors" => {
            let coll = coll_arg(body, name)?;
            let ids = cursor::ids_of(body.get("cursors"))?;
            let (killed, not_found) = ctx.cursors.kill(&format!("{db}.{coll}"), &ids);
            Ok(doc! {
                "cursorsKilled": killed,
                "cursorsNotFound": not_found,
                "cursorsAlive": [],
                "cursorsUnknown": [],
                "ok": 1.0,
            })
        }
        "count" => {
            let coll = coll_arg(body, name)?;
            let filter = opt_doc(body, "query")?.cloned().unwrap_or_default();
            let skip = int_arg(body, "skip")?.unwrap_or(0);
            if skip < 0 {
                return Err(CommandError::bad_value(
                    "skip value is negative in count query",
                ));
            }
            let limit = int_arg(body, "limit")?.unwrap_or(0);
            let n = match store.resolve_view(db, coll)? {
                Some(view) => {
                    let mut stages = vec![doc! { "$match": filter }];
                    if skip > 0 {
                        stages.push(doc! { "$skip": skip });
                    }
                    if limit != 0 {
                        stages.push(doc! { "$limit": limit.saturating_abs() });
                    }
                    store
                        .aggregate(db, &view.source, &through_view(&view, stages))?
                        .len() as u64
                }
                None => store.count(db, coll, &filter, skip as u64, limit)?,
            };
            Ok(doc! { "n": count_bson(n), "ok": 1.0 })
        }
        "distinct" => {
            let coll = coll_arg(body, name)?;
            let key = match body.get("key") {
                Some(Bson::String(k)) => k.as_str(),
                _ => {
                    return Err(CommandError::failed_to_parse(
                        "distinct requires a 'key' string",
                    ))
                }
            };
            let filter = opt_doc(body, "query")?.cloned().unwrap_or_default();
            let values = match store.resolve_view(db, coll)? {
                Some(view) => {
                    let stages = [doc! { "$match": filter }];
                    let docs = store.aggregate(db, &view.source, &through_view(&view, stages))?;
                    Store::distinct_in(&docs, key)?
                }
                None => store.distinct(db, coll, key, &filter)?,
            };
            Ok(doc! { "values": values, "ok": 1.0 })
        }
        "aggregate" => aggregate(db, body, store, ctx),
        "create" => {
            let coll = coll_arg(body, name)?;
            let mut options = Document::new();
            for (k, v) in body.iter().skip(1) {
                if !GENERIC_FIELDS.contains(&k.as_str()) {
                    options.insert(k.clone(), v.clone());
                }
            }
            store.create_collection(db, coll, &options)?;
            Ok(doc! { "ok": 1.0 })
        }
        "drop" => {
            let coll = coll_arg(body, name)?;
            let before = store.list_indexes(db, coll).map(|v| v.len()).unwrap_or(0);
            let existed = store.drop_collection(db, coll);
            let mut r = Document::new();
            if existed {
                r.insert("nIndexesWas", before as i32);
            }
            r.insert("ns", format!("{db}.{coll}"));
            r.insert("ok", 1.0);
            Ok(r)
        }
        "collMod" => {
            let coll = coll_arg(body, name)?;
            let mut spec = Document::new();
            for (k, v) in body.iter().skip(1) {
                if !GENERIC_FIELDS.contains(&k.as_str()) {
                    spec.insert(k.clone(), v.clone());
                }
            }
            let mut reply = store.modify_collection(db, coll, &spec)?;
            reply.insert("ok", 1.0);
            Ok(reply)
        }
        "dropDatabase" => {
            store.drop_database(db);
            Ok(doc! { "dropped": db, "ok": 1.0 })
        }
        // The command form of `$collStats: {storageStats: {}}`: the storage statistics at the
        // top level with `ns` (https://www.mongodb.com/docs/manual/reference/command/collStats/).
        "collStats" => {
            let coll = coll_arg(body, name)?;
            let stage = doc! { "$collStats": { "storageStats": {} } };
            let stats = coll_stats(store, db, coll, &stage)?;
            let mut r = doc! { "ns": format!("{db}.{coll}") };
            if let Ok(storage) = stats.get_document("storageStats") {
                r.extend(storage.clone());
            }
            r.insert("indexSizes", Document::new());
            r.insert("ok", 1.0);
            Ok(r)
        }
        "listDatabases" => {
            let name_only = bool_arg(body, "nameOnly", false);
            let dbs = store.list_databases(opt_doc(body, "filter")?, name_only)?;
            let mut r =
                doc! { "databases": dbs.into_iter().map(Bson::Document).collect::<Vec<_>>() };
            if !name_only {
                r.insert("totalSize", 0i64);
                r.insert("totalSizeMb", 0i64);
            }
            r.insert("ok", 1.0);
            Ok(r)
        }
        "listCollections" => {
            let name_only = bool_arg(body, "nameOnly", false);
            let colls = store.list_collections(db, opt_doc(body, "filter")?, name_only)?;
            let limit = cursor_batch(body)?;
            // mongod queues listCollections results, so it knows the end at the last one.
            ctx.open_cursor(
                format!("{db}.$cmd.listCollections"),
                colls,
                CursorKind::Normal,
                CursorEnd::Known,
                limit,
                false,
            )
        }
        "createIndexes" => {
            let coll = coll_arg(body, name)?;
            let specs = docs_arg(body, "indexes", true)?;
            if specs.is_empty() {
                return Err(CommandError::bad_value(
                    "Must specify at least one index to create",
                ));
            }
            let out = store.create_indexes(db, coll, &specs)?;
            let mut r = doc! {
                "numIndexesBefore": out.num_indexes_before,
                "numIndexesAfter": out.num_indexes_after,
                "createdCollectionAutomatically": out.created_collection_automatically,
            };
            if let Some(note) = out.note {
                r.insert("note", note);
            }
            r.insert("ok", 1.0);
            Ok(r)
        }
        "dropIndexes" => {
            let coll = coll_arg(body, name)?;
            let index = body
                .get("index")
                .ok_or_else(|| CommandError::failed_to_parse("dropIndexes requires 'index'"))?;
            let out = store.drop_indexes(db, coll, index)?;
            Ok(doc! { "nIndexesWas": out.n_indexes_was, "ok": 1.0 })
        }
        "listIndexes" => {
            let coll = coll_arg(body, name)?;
            let indexes = store.list_indexes(db, coll)?;
            let limit = cursor_batch(body)?;
            // Queued like listCollections' results.
            ctx.open_cursor(
                format!("{db}.{coll}"),
                indexes,
                CursorKind::Normal,
                CursorEnd::Known,
                limit,
                false,
            )
        }
        "bulkWrite" => {
            let mut reply = bulk_write(body, store)?;
            let limit = match cursor_batch(body)? {
                BatchLimit { size: None } => BatchLimit {
                    size: ctx.bulk_write_batch_size,
                },
                given => given,
            };
            // mongod answers with one cursor whose first batch holds the results that fit in a
            // reply (16 MiB); the rest wait for getMore (bulk_write_exec.cpp). Small replies
            // stay inline, as before.
            let limit = match limit.size {
                Some(_) => limit,
                None if cursor::fits_in_one_batch(first_batch(&reply)) => return Ok(reply),
                None => BatchLimit {
                    size: Some(usize::MAX),
                },
            };
            // Serve the results through a real cursor so the rest needs getMore.
            let results = match reply.remove("cursor") {
                Some(Bson::Document(mut c)) => match c.remove("firstBatch") {
                    Some(Bson::Array(a)) => a
                        .into_iter()
                        .filter_map(|r| match r {
                            Bson::Document(d) => Some(d),
                            _ => None,
                        })
                        .collect(),
                    _ => Vec::new(),
                },
                _ => Vec::new(),
            };
            let mut cursor = ctx.open_cursor(
                "admin.$cmd.bulkWrite".to_owned(),
                results,
                CursorKind::Normal,
                CursorEnd::Known,
                limit,
                false,
            )?;
            for (k, v) in reply {
                if k != "ok" {
                    cursor.insert(k, v);
                }
            }
            Ok(cursor)
        }
        other => Err(CommandError::new(
            codes::COMMAND_NOT_FOUND,
            format!("no such command: '{other}'"),
        )),
    }
}

/// The `cursor.firstBatch` of a reply (empty when it has none).
fn first_batch(reply: &Document) -> &[Bson] {
    reply
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get_array("firstBatch").ok())
        .map_or(&[], Vec::as_slice)
}

fn aggregate(
    db: &str,
    body: &Document,
    store: &mut Store,
    ctx: &mut DataCtx<'_>,
) -> Result<Document, CommandError> {
    let pipeline = docs_arg(body, "pipeline", true)?;
    if body.contains_key("explain") {
        return Err(CommandError::new(
            codes::ILLEGAL_OPERATION,
            "explain is not supported by the emulator",
        ));
    }
    if !body.contains_key("cursor") {
        return Err(CommandError::failed_to_parse(
            "The 'cursor' option is required, except for aggregate with the explain argument",
        ));
    }
    let limit = cursor_batch(body)?;
    let coll =
        match body.get("aggregate") {
            Some(Bson::String(s)) if !s.is_empty() => Some(s.as_str()),
            Some(Bson::Int32(1)) | Some(Bson::Int64(1)) => None,
            Some(Bson::Double(d)) if *d == 1.0 => None,
            _ => return Err(CommandError::failed_to_parse(
                "Invalid {aggregate: ...} value: must be a collection name string or the number 1",
            )),
        };
    let first_stage = pipeline
        .first()
        .and_then(|s| s.keys().next().cloned())
        .unwrap_or_default();
    let ns = match coll {
        Some(c) => format!("{db}.{c}"),
        None => format!("{db}.$cmd.aggregate"),
    };
    if first_stage == "$listSearchIndexes" {
        return Err(CommandError::search_not_enabled());
    }
    if first_stage == "$changeStream" {
        if !ctx.replicated {
            return Err(CommandError::new(
                codes::CHANGE_STREAM_NOT_SUPPORTED,
                "The $changeStream stage is only supported on replica sets",
            ));
        }
        let spec = match pipeline[0].get("$changeStream") {
            Some(Bson::Document(d)) => d.clone(),
            _ => {
                return Err(CommandError::failed_to_parse(
                    "$changeStream takes a document",
                ))
            }
        };
        let scope = match coll {
            Some(c) => Scope::Collection(db.to_string(), c.to_string()),
            None if db == "admin" && bool_arg(&spec, "allChangesForCluster", false) => {
                Scope::Cluster
            }
            None => Scope::Database(db.to_string()),
        };
        let option = |key: &str, default: &str, allowed: &[&str]| -> Result<String, CommandError> {
            match spec.get(key) {
                None => Ok(default.to_string()),
                Some(Bson::String(s)) if allowed.contains(&s.as_str()) => Ok(s.clone()),
                Some(other) => Err(CommandError::bad_value(format!(
                    "unknown {key} value: {other}"
                ))),
            }
        };
        let full_document = option(
            "fullDocument",
            "default",
            &["default", "updateLookup", "whenAvailable", "required"],
        )?;
        let full_document_before_change = option(
            "fullDocumentBeforeChange",
            "off",
            &["off", "whenAvailable", "required"],
        )?;
        let stages = pipeline[1..].to_vec();
        if !stages.is_empty() {
            // mongod parses the whole pipeline when the stream opens: an unknown stage fails the
            // aggregate, not the first getMore.
            store.run_pipeline(db, Vec::new(), &stages)?;
        }
        ctx.changes.enabled = true;
        let mut state = StreamState {
            scope,
            next_seq: ctx.changes.start_position(&spec)?,
            stages,
            db: db.to_string(),
            visibility: changes::Visibility {
                show_expanded: bool_arg(&spec, "showExpandedEvents", false),
            },
            full_document,
            full_document_before_change,
        };
        let (first, pos) = stream_batch(
            ctx.changes,
            store,
            &state,
            Some(limit.size.unwrap_or(cursor::DEFAULT_FIRST_BATCH)),
        )?;
        state.next_seq = pos;
        return ctx.cursors.open_stream(
            ns,
            state,
            first,
            ctx.conn_serial,
            ctx.lsid.clone(),
            ctx.max_cursors_per_connection,
            ctx.max_cursors,
        );
    }
    let writes = pipeline_writes(body);
    let linearizable = body
        .get_document("readConcern")
        .ok()
        .and_then(|rc| rc.get_str("level").ok())
        == Some("linearizable");
    if writes && linearizable {
        let stage = pipeline
            .last()
            .and_then(|s| s.keys().next().cloned())
            .unwrap_or_default();
        return Err(CommandError::new(
            codes::INVALID_OPTIONS,
            format!("{stage} cannot be used with a 'linearizable' read concern level"),
        ));
    }
    let docs = if first_stage == "$currentOp" {
        let input = ctx.current_ops.take().unwrap_or_default();
        store.run_pipeline(db, input, &pipeline[1..])?
    } else if first_stage == "$listLocalSessions" {
        let input = ctx.local_sessions.take().unwrap_or_default();
        store.run_pipeline(db, input, &pipeline[1..])?
    } else if first_stage == "$collStats" {
        let Some(c) = coll else {
            return Err(CommandError::failed_to_parse(
                "$collStats must be run against a collection",
            ));
        };
        let input = vec![coll_stats(store, db, c, &pipeline[0])?];
        store.run_pipeline(db, input, &pipeline[1..])?
    } else if let Some(c) = coll {
        match store.resolve_view(db, c)? {
            Some(view) => store.aggregate(db, &view.source, &through_view(&view, pipeline))?,
            None => store.aggregate(db, c, &pipeline)?,
        }
    } else {
        store.run_pipeline(db, Vec::new(), &pipeline)?
    };
    let docs = if writes { Vec::new() } else { docs };
    // mongod's aggregate closes its cursor only when reading the pipeline hits its end (a
    // `$limit` included); a pipeline that writes ($out, $merge) has run to its end already.
    let end = if writes {
        CursorEnd::Known
    } else {
        CursorEnd::Lazy
    };
    ctx.open_cursor(ns, docs, CursorKind::Normal, end, limit, false)
}

/// The document of a `$collStats` stage (storage figures are estimates from BSON sizes).
fn coll_stats(
    store: &Store,
    db: &str,
    coll: &str,
    stage: &Document,
) -> Result<Document, CommandError> {
    let spec = match stage.get("$collStats") {
        Some(Bson::Document(d)) => d.clone(),
        _ => return Err(CommandError::failed_to_parse("$collStats takes a document")),
    };
    let mut out = doc! {
        "ns": format!("{db}.{coll}"),
        "host": "emulator",
        "localTime": bson::DateTime::now(),
    };
    let docs = store.documents(db, coll);
    let count = docs.len() as i64;
    if spec.contains_key("storageStats") {
        if !store.has_collection(db, coll) {
            return Err(CommandError::new(
                codes::NAMESPACE_NOT_FOUND,
                format!("Unable to retrieve storageStats in $collStats stage :: caused by :: Collection [{db}.{coll}] not found."),
            ));
        }
        let filter = doc! { "name": coll };
        let options = store
            .list_collections(db, Some(&filter), false)?
            .into_iter()
            .next()
            .and_then(|c| c.get_document("options").ok().cloned())
            .unwrap_or_default();
        let size: i64 = docs
            .iter()
            .map(|d| bson::to_vec(d).map(|v| v.len() as i64).unwrap_or(0))
            .sum();
        let nindexes = store
            .list_indexes(db, coll)
            .map(|v| v.len() as i32)
            .unwrap_or(1);
        let capped = bool_arg(&options, "capped", false);
        let mut stats = doc! {
            "size": size,
            "count": count,
            "avgObjSize": if count > 0 { size / count } else { 0 },
            "storageSize": size,
            "capped": capped,
            "nindexes": nindexes,
            "totalIndexSize": 0i64,
            "totalSize": size,
        };
        if capped {
            if let Some(max_size) = options.get("size") {
                stats.insert("maxSize", max_size.clone());
            }
            if let Some(max) = options.get("max") {
                stats.insert("max", max.clone());
            }
        }
        out.insert("storageStats", stats);
    }
    if spec.contains_key("count") {
        out.insert("count", count);
    }
    Ok(out)
}

/// The next batch of a change stream at `state`: events in scope, through the stream's other
/// stages, at most `batch` of them; returns the new position.
fn stream_batch(
    log: &ChangeLog,
    store: &mut Store,
    state: &StreamState,
    batch: Option<usize>,
) -> Result<(Vec<Bson>, u64), CommandError> {
    if batch == Some(0) {
        return Ok((Vec::new(), state.next_seq));
    }
    let (events, mut next) = log.read(state.next_seq, &state.scope, state.visibility, 1000);
    let docs: Vec<Document> = events
        .into_iter()
        .map(|(_, d, images)| with_images(d, images, state, store))
        .collect::<Result<_, _>>()?;
    let mut out = if state.stages.is_empty() || docs.is_empty() {
        docs
    } else {
        store.run_pipeline(&state.db, docs, &state.stages)?
    };
    if out
        .iter()
        .any(|d| d.get("_id").and_then(changes::parse_token).is_none())
    {
        // The resume token is the event's `_id`: mongod refuses a pipeline that changed it.
        return Err(CommandError {
            labels: Some(vec!["NonResumableChangeStreamError".to_string()]),
            ..CommandError::new(
                280,
                "Encountered an event whose _id field, which contains the resume token, was \
                 modified by the pipeline. Modifying the _id field of an event makes it \
                 impossible to resume the stream from that point. Only transformations that \
                 retain the unmodified _id field are allowed.",
            )
        });
    }
    if let Some(n) = batch {
        if out.len() > n {
            out.truncate(n);
            if let Some(seq) = out
                .last()
                .and_then(|d| d.get("_id"))
                .and_then(changes::parse_token)
            {
                next = seq.saturating_add(1);
            }
        }
    }
    Ok((out.into_iter().map(Bson::Document).collect(), next))
}

/// `returnKey`: each document reduced to the key of the index mongod's plan would scan. The
/// emulator has no planner: the index is the one whose first key is the sort's first field, else
/// a field of the filter; without one the plan is a collection scan, whose keys are empty
/// documents. (`showRecordId` adds nothing then, as in mongod.)
fn index_keys(
    store: &Store,
    db: &str,
    coll: &str,
    body: &Document,
    docs: Vec<Document>,
) -> Result<Vec<Document>, CommandError> {
    let indexes = store.list_indexes(db, coll).unwrap_or_default();
    let first_key = |field: &str| {
        indexes.iter().find_map(|ix| {
            let key = ix.get_document("key").ok()?;
            (key.keys().next().map(String::as_str) == Some(field)).then(|| key.clone())
        })
    };
    let sort_field = opt_doc(body, "sort")?.and_then(|s| s.keys().next().cloned());
    let filter = opt_doc(body, "filter")?.cloned().unwrap_or_default();
    let key = sort_field
        .as_deref()
        .and_then(first_key)
        .or_else(|| filter.keys().find_map(|f| first_key(f)));
    let Some(key) = key else {
        return Ok(docs.iter().map(|_| Document::new()).collect());
    };
    Ok(docs
        .iter()
        .map(|d| {
            let mut out = Document::new();
            for field in key.keys() {
                // Index keys over arrays are per element in mongod; keys of documents are
                // followed here, anything else is null (a missing field's key).
                let mut value = Some(Bson::Document(d.clone()));
                for part in field.split('.') {
                    value = match value {
                        Some(Bson::Document(inner)) => inner.get(part).cloned(),
                        _ => None,
                    };
                }
                let value = value.unwrap_or(Bson::Null);
                out.insert(field.clone(), value);
            }
            out
        })
        .collect())
}

/// The documents of a tailable cursor's collection after its last one, in natural order,
/// that match its filter (none when the last one is gone).
pub(crate) fn tail_documents(store: &Store, tail: &TailState) -> Vec<Document> {
    let all = store.documents(&tail.db, &tail.coll);
    let Some(pos) = all
        .iter()
        .position(|d| d.get("_id") == tail.last_id.as_ref())
    else {
        return Vec::new();
    };
    all[pos + 1..]
        .iter()
        .filter(|d| crate::engine::matches(&tail.filter, d).unwrap_or(false))
        .cloned()
        .collect()
}

/// An event as a stream with `state`'s `fullDocument` and `fullDocumentBeforeChange` sees it:
/// post-images of updates (`whenAvailable`, `required`: the recorded image; `updateLookup`: the
/// document as it is now) and pre-images of updates, replacements and deletes. `required`
/// without a recorded image is mongod's 280 ChangeStreamFatalError.
fn with_images(
    mut event: Document,
    images: changes::Images,
    state: &StreamState,
    store: &Store,
) -> Result<Document, CommandError> {
    let op = event
        .get_str("operationType")
        .unwrap_or_default()
        .to_string();
    let token = event.get("_id").cloned().unwrap_or(Bson::Null);
    let missing = |what: &str| {
        CommandError::new(
            280,
            format!(
                "Change stream was configured to require a {what} for all update, delete and \
                 replace events, but the {what} was not found for event: {token}"
            ),
        )
    };
    if op == "update" {
        let post = match state.full_document.as_str() {
            "whenAvailable" => Some(images.post.clone().map_or(Bson::Null, Bson::Document)),
            "required" => match images.post.clone() {
                Some(d) => Some(Bson::Document(d)),
                None => return Err(missing("post-image")),
            },
            "updateLookup" => {
                let (db, coll) = match event.get_document("ns") {
                    Ok(ns) => (
                        ns.get_str("db").unwrap_or_default().to_string(),
                        ns.get_str("coll").unwrap_or_default().to_string(),
                    ),
                    Err(_) => Default::default(),
                };
                let key = event
                    .get_document("documentKey")
                    .ok()
                    .and_then(|k| k.get("_id"));
                let current = store
                    .documents(&db, &coll)
                    .iter()
                    .find(|d| d.get("_id") == key)
                    .cloned();
                Some(current.map_or(Bson::Null, Bson::Document))
            }
            _ => None,
        };
        if let Some(post) = post {
            event.insert("fullDocument", post);
        }
    }
    if matches!(op.as_str(), "update" | "replace" | "delete") {
        let pre = match state.full_document_before_change.as_str() {
            "whenAvailable" => Some(images.pre.map_or(Bson::Null, Bson::Document)),
            "required" => match images.pre {
                Some(d) => Some(Bson::Document(d)),
                None => return Err(missing("pre-image")),
            },
            _ => None,
        };
        if let Some(pre) = pre {
            event.insert("fullDocumentBeforeChange", pre);
        }
    }
    Ok(event)
}

fn split_ns(ns: &str) -> Option<(&str, &str)> {
    let (db, coll) = ns.split_once('.')?;
    if db.is_empty() || coll.is_empty() {
        return None;
    }
    Some((db, coll))
}

/// Client-level `bulkWrite` (admin): results come back in a single-batch cursor.
fn bulk_write(body: &Document, store: &mut Store) -> Result<Document, CommandError> {
    let ops = docs_arg(body, "ops", true)?;
    let ns_info = docs_arg(body, "nsInfo", true)?;
    let namespaces: Vec<String> = ns_info
        .iter()
        .map(|d| match d.get("ns") {
            Some(Bson::String(s)) if split_ns(s).is_some() => Ok(s.clone()),
            _ => Err(CommandError::new(
                codes::INVALID_NAMESPACE,
                "nsInfo entries need a valid 'ns'",
            )),
        })
        .collect::<Result<_, _>>()?;
    let ordered = bool_arg(body, "ordered", true);
    let errors_only = bool_arg(body, "errorsOnly", false);
    let (
        mut n_errors,
        mut n_inserted,
        mut n_matched,
        mut n_modified,
        mut n_upserted,
        mut n_deleted,
    ) = (0i64, 0i64, 0i64, 0i64, 0i64, 0i64);
    let mut results = Vec::new();
    for (idx, op) in ops.iter().enumerate() {
        let outcome = bulk_op(op, &namespaces, store);
        match outcome {
            Ok(BulkOk {
                inserted,
                matched,
                modified,
                upserted,
                deleted,
                n,
                upserted_id,
                is_update,
            }) => {
                n_inserted += inserted;
                n_matched += matched;
                n_modified += modified;
                n_upserted += upserted;
                n_deleted += deleted;
                if !errors_only {
                    let mut r = doc! { "ok": 1.0, "idx": idx as i32, "n": n as i32 };
                    if is_update {
                        r.insert("nModified", modified as i32);
                    }
                    if let Some(id) = upserted_id {
                        r.insert("upserted", doc! { "_id": id });
                    }
                    results.push(Bson::Document(r));
                }
            }
            Err(e) => {
                n_errors += 1;
                results.push(Bson::Document(doc! {
                    "ok": 0.0,
                    "idx": idx as i32,
                    "code": e.code,
                    "codeName": e.code_name.as_ref(),
                    "errmsg": e.errmsg.clone(),
                }));
                if ordered {
                    break;
                }
            }
        }
    }
    Ok(doc! {
        "cursor": { "id": 0i64, "firstBatch": results, "ns": "admin.$cmd.bulkWrite" },
        "nErrors": n_errors as i32,
        "nInserted": n_inserted as i32,
        "nMatched": n_matched as i32,
        "nModified": n_modified as i32,
        "nUpserted": n_upserted as i32,
        "nDeleted": n_deleted as i32,
        "ok": 1.0,
    })
}

#[derive(Default)]
struct BulkOk {
    inserted: i64,
    matched: i64,
    modified: i64,
    upserted: i64,
    deleted: i64,
    n: i64,
    upserted_id: Option<Bson>,
    is_update: bool,
}

fn bulk_op(
    op: &Document,
    namespaces: &[String],
    store: &mut Store,
) -> Result<BulkOk, CommandError> {
    let Some((kind, target)) = op.iter().next() else {
        return Err(CommandError::failed_to_parse("empty bulkWrite operation"));
    };
    let index = match target {
        Bson::Int32(i) => i64::from(*i),
        Bson::Int64(i) => *i,
        _ => {
            return Err(CommandError::type_mismatch(
                "bulkWrite namespace index must be an integer",
            ))
        }
    };
    let ns = usize::try_from(index)
        .ok()
        .and_then(|i| namespaces.get(i))
        .ok_or_else(|| {
            CommandError::bad_value(format!("namespace index {index} is out of range"))
        })?;
    let (db, coll) = split_ns(ns)
        .ok_or_else(|| CommandError::new(codes::INVALID_NAMESPACE, "invalid namespace"))?;
    if store.is_view(db, coll) {
        return Err(not_supported_on_view(db, coll).into());
    }
    let first_error =
        |errs: &[WriteError]| errs.first().map(|w| CommandError::from(w.error.clone()));
    match kind.as_str() {
        "insert" => {
            let document = opt_doc(op, "document")?.cloned().ok_or_else(|| {
                CommandError::failed_to_parse("bulkWrite insert requires 'document'")
            })?;
            let out = store.insert(db, coll, vec![document], true);
            if let Some(e) = first_error(&out.write_errors) {
                return Err(e);
            }
            Ok(BulkOk {
                inserted: out.n as i64,
                n: out.n as i64,
                ..Default::default()
            })
        }
        "update" => {
            let mut stmt = doc! {
                "q": opt_doc(op, "filter")?.cloned().unwrap_or_default(),
                "u": op.get("updateMods").cloned().ok_or_else(|| CommandError::failed_to_parse("bulkWrite update requires 'updateMods'"))?,
                "multi": bool_arg(op, "multi", false),
                "upsert": bool_arg(op, "upsert", false),
            };
            for key in ["arrayFilters", "sort", "collation", "hint"] {
                if let Some(v) = op.get(key) {
                    stmt.insert(key, v.clone());
                }
            }
            let collation = collation_or(op, &default_collation(store, db, Some(coll))?)?;
            let stmt = UpdateStatement::from_command(&stmt)?;
            let out = with_collation(collation.as_ref(), || store.update(db, coll, &[stmt], true));
            if let Some(e) = first_error(&out.write_errors) {
                return Err(e);
            }
            let upserted = out.upserted.len() as i64;
            Ok(BulkOk {
                matched: out.n as i64 - upserted,
                modified: out.n_modified as i64,
                upserted,
                n: out.n as i64,
                upserted_id: out.upserted.first().map(|(_, id)| id.clone()),
                is_update: true,
                ..Default::default()
            })
        }
        "delete" => {
            let stmt = DeleteStatement {
                filter: opt_doc(op, "filter")?.cloned().unwrap_or_default(),
                just_one: !bool_arg(op, "multi", false),
            };
            let collation = collation_or(op, &default_collation(store, db, Some(coll))?)?;
            let out = with_collation(collation.as_ref(), || store.delete(db, coll, &[stmt], true));
            if let Some(e) = first_error(&out.write_errors) {
                return Err(e);
            }
            Ok(BulkOk {
                deleted: out.n as i64,
                n: out.n as i64,
                ..Default::default()
            })
        }
        other => Err(CommandError::failed_to_parse(format!(
            "unknown bulkWrite operation '{other}'"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_key_gives_the_scanned_index_key_or_empty_documents() {
        let mut store = Store::new();
        store.insert(
            "db",
            "c",
            vec![doc! { "_id": 1, "a": { "b": 5 }, "x": 1 }],
            true,
        );
        store
            .create_indexes("db", "c", &[doc! { "key": { "a.b": 1 }, "name": "ab" }])
            .unwrap();
        let docs = || store.documents("db", "c").to_vec();
        let by_id = index_keys(&store, "db", "c", &doc! { "sort": { "_id": 1 } }, docs()).unwrap();
        assert_eq!(by_id, vec![doc! { "_id": 1 }]);
        let by_filter =
            index_keys(&store, "db", "c", &doc! { "filter": { "a.b": 5 } }, docs()).unwrap();
        assert_eq!(by_filter, vec![doc! { "a.b": 5 }]);
        let scan = index_keys(&store, "db", "c", &doc! { "filter": { "x": 1 } }, docs()).unwrap();
        assert_eq!(scan, vec![Document::new()]);
    }
}
