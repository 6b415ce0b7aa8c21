//! The emulator's in-memory document engine: catalog, query matching, updates and aggregation.
//!
//! Pure Rust over `bson` 2.x [`Document`]/[`Bson`] values, with no networking and no locking:
//! the server owns one [`Store`] (it is plain owned data, `Clone + Send + Sync`) behind its own
//! mutex, turns command documents into the typed requests below, and renders the outcomes.
//!
//! # API overview
//!
//! Catalog ([`Store`], `catalog.rs`):
//! * [`Store::create_collection`] (`create`, error 48 NamespaceExists),
//!   [`Store::drop_collection`], [`Store::drop_database`], [`Store::rename_collection`],
//!   [`Store::list_databases`], [`Store::list_collections`];
//! * [`Store::create_indexes`], [`Store::drop_indexes`], [`Store::list_indexes`] (indexes are
//!   metadata; only the `_id` index and `unique: true` indexes are enforced).
//!
//! CRUD (`crud.rs`): [`Store::insert`], [`Store::update`], [`Store::delete`], [`Store::find`],
//! [`Store::find_and_modify`], [`Store::count`], [`Store::distinct`]. Writes create the
//! database and collection implicitly, like mongod. Per-statement errors are reported as
//! [`WriteError`]s carrying the statement index; ordered writes stop at the first one.
//!
//! Aggregation (`aggregate.rs`): [`Store::aggregate`] runs a pipeline over a collection;
//! [`Store::run_pipeline`] runs the remaining stages over documents the server produced itself
//! (e.g. for `$changeStream` or `$listLocalSessions`, which the engine does not implement).
//!
//! Free functions: [`matches()`] (query filter), [`compare_bson`] (BSON type order with numeric
//! cross-type comparison), [`strict_equal`] (byte-level equality), [`apply_update`] (update one
//! document in place), [`evaluate`] (aggregation expressions) and [`with_variables`] (binds a
//! command's `let` variables around any engine call).
//!
//! The `parse` helpers ([`FindSpec::from_command`], [`UpdateStatement::from_command`],
//! [`DeleteStatement::from_command`], [`FindAndModifySpec::from_command`]) read the fields of
//! the corresponding mongod command documents, so the server only has to route.
//!
//! Errors are [`EngineError`]s carrying mongod's `code` and `codeName` (plus, for DuplicateKey,
//! `keyPattern`/`keyValue` in [`EngineError::details`]), ready to render as
//! `{ok: 0, errmsg, code, codeName}` or as a write error.
//!
//! # Files
//!
//! `error.rs` (the error type and mongod's codes), `value.rs` (mongod's type names and the
//! numeric reading of a value), `limits.rs` (16 MiB and nesting limits), `compare.rs`
//! (ordering and equality), `path.rs` (dotted paths), `query.rs` (filters), `sort.rs`,
//! `projection.rs` (find projections, `$project`, `$addFields`, `$unset`), `update.rs`
//! (operators, replacement, pipeline updates, upsert seeds), `expression/` (aggregation
//! expressions: the language in `mod.rs`, one module per operator family), `aggregate.rs`
//! (stages, `$out`, `$merge`), `catalog.rs` (the [`Store`], collections and indexes, `create`'s
//! options), `crud.rs` (the write and read commands and their parsers), `collation.rs`
//! (locale-aware string order), `view.rs` (view resolution), `collmod.rs` (`collMod`),
//! `validation.rs` (document validation) and `fuzz_tests.rs`.
//!
//! Imports point one way, with no circle: `value` and `error` at the bottom, then `collation`,
//! `compare`, `expression`, the matcher and updates, and `catalog` below `view`, `crud` and
//! `aggregate`.
//!
//! # Not implemented
//!
//! Text/geo queries and indexes, `$where`, capped-collection semantics, window functions,
//! `$bucketAuto`, `$jsonSchema` validators and ICU's locale tailorings (`collation.rs` says
//! which collation rules exist).
//! Indexes other than unique ones are metadata only (every query is a collection scan).
//!
//! # Limits
//!
//! Documents larger than 16 MiB are rejected (10334 BSONObjectTooLarge), user-supplied
//! documents, filters, updates and pipelines nested deeper than [`MAX_DEPTH`] are rejected (15
//! Overflow), dotted paths are capped so recursion stays bounded, every loop is bounded by its
//! input, and user data is never unwrapped or indexed unchecked (`fuzz_tests.rs` throws random
//! BSON at every entry point to keep it that way).

mod aggregate;
mod catalog;
mod collation;
mod collmod;
mod compare;
mod crud;
mod error;
mod expression;
mod limits;
mod path;
mod pattern;
mod projection;
mod query;
mod sort;
mod update;
mod validation;
mod value;
mod view;

#[cfg(test)]
mod fuzz_tests;

use bson::{Bson, Document};

pub use catalog::Store;
pub use collation::{with_collation, Collation};
pub use compare::{compare_bson, id_key, strict_equal, IdKey};
pub use error::{EngineError, EngineResult};
pub use expression::{evaluate, with_variables};
pub use limits::{MAX_BSON_SIZE, MAX_DEPTH};
/// The value at a dotted path (no array traversal but numeric indexes): the server's shard
/// key lookups use it.
pub(crate) use path::get_exact as path_value;
pub use query::matches;
pub use update::{apply_update, UpdateContext};
pub use validation::with_bypass;
pub use view::{not_supported_on_view, ResolvedView};

/// Which documents a `find` returns and how they are shaped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FindSpec {
    /// Query filter; empty matches everything.
    pub filter: Document,
    /// Sort specification (`{field: 1 | -1}`), applied before skip and limit.
    pub sort: Option<Document>,
    /// Projection (inclusion or exclusion, `_id` rules, `$slice`, `$elemMatch`).
    pub projection: Option<Document>,
    /// Number of matching documents to skip.
    pub skip: u64,
    /// Maximum number of documents; `None` or 0 means no limit. Negative values are taken as
    /// their absolute value (mongod's single-batch convention is the server's business).
    pub limit: Option<i64>,
}

impl FindSpec {
    /// Reads `filter`, `sort`, `projection`, `skip` and `limit` from a `find` command document.
    /// Other fields (batchSize, singleBatch, hint, ...) are left to the server.
    pub fn from_command(cmd: &Document) -> EngineResult<Self> {
        crud::parse_find(cmd)
    }
}

/// The update part of an update statement.
#[derive(Debug, Clone, PartialEq)]
pub enum UpdateModification {
    /// Either an operator document (`{$set: ...}`) or a replacement document; the engine tells
    /// them apart by the first field name, as mongod does.
    Document(Document),
    /// An aggregation-pipeline update (`[{$set: ...}, ...]`).
    Pipeline(Vec<Document>),
}

impl UpdateModification {
    /// Interprets the `u` / `update` field of a command.
    pub fn from_bson(value: &Bson) -> EngineResult<Self> {
        crud::parse_modification(value)
    }
}

/// One statement of an `update` command.
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateStatement {
    /// `q`: which documents to update.
    pub filter: Document,
    /// `u`: the update.
    pub update: UpdateModification,
    /// `upsert`: insert a document built from the filter when nothing matches.
    pub upsert: bool,
    /// `multi`: update every match (otherwise the first in natural order, or by `sort`).
    pub multi: bool,
    /// `arrayFilters` for `$[<identifier>]` paths.
    pub array_filters: Vec<Document>,
    /// `sort` (updateOne with sort, 8.0): which match to update when `multi` is false.
    pub sort: Option<Document>,
}

impl UpdateStatement {
    /// Reads one element of an `update` command's `updates` array (`{q, u, upsert, multi,
    /// arrayFilters, sort}`).
    pub fn from_command(stmt: &Document) -> EngineResult<Self> {
        crud::parse_update_statement(stmt)
    }
}

/// One statement of a `delete` command.
#[derive(Debug, Clone, PartialEq)]
pub struct DeleteStatement {
    /// `q`: which documents to delete.
    pub filter: Document,
    /// `limit: 0` → false (all matches), `limit: 1` → true (first match).
    pub just_one: bool,
}

impl DeleteStatement {
    /// Reads one element of a `delete` command's `deletes` array (`{q, limit}`).
    pub fn from_command(stmt: &Document) -> EngineResult<Self> {
        crud::parse_delete_statement(stmt)
    }
}

/// A failed statement of a write command.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteError {
    /// Index of the statement in the command (or of the document in `insert`).
    pub index: usize,
    /// What went wrong.
    pub error: EngineError,
}

/// Result of [`Store::insert`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InsertOutcome {
    /// Number of documents inserted.
    pub n: u64,
    /// `_id` of each inserted document with its index in the request.
    pub inserted_ids: Vec<(usize, Bson)>,
    /// Failed documents.
    pub write_errors: Vec<WriteError>,
}

/// Result of [`Store::update`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpdateOutcome {
    /// Documents matched (plus upserted ones, as mongod counts them in `n`).
    pub n: u64,
    /// Documents whose content actually changed.
    pub n_modified: u64,
    /// `(statement index, _id)` for each upsert.
    pub upserted: Vec<(usize, Bson)>,
    /// Failed statements.
    pub write_errors: Vec<WriteError>,
}

/// Result of [`Store::delete`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeleteOutcome {
    /// Documents deleted.
    pub n: u64,
    /// Failed statements.
    pub write_errors: Vec<WriteError>,
}

/// A `findAndModify` request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FindAndModifySpec {
    /// `query`.
    pub query: Document,
    /// `sort`: which match is modified.
    pub sort: Option<Document>,
    /// `remove: true` deletes the match (mutually exclusive with `update`).
    pub remove: bool,
    /// `update`: operator, replacement or pipeline update.
    pub update: Option<UpdateModification>,
    /// `new`: return the document after the update instead of before.
    pub return_new: bool,
    /// `upsert`.
    pub upsert: bool,
    /// `fields`: projection of the returned document.
    pub fields: Option<Document>,
    /// `arrayFilters`.
    pub array_filters: Vec<Document>,
}

impl FindAndModifySpec {
    /// Reads a `findAndModify` command document.
    pub fn from_command(cmd: &Document) -> EngineResult<Self> {
        crud::parse_find_and_modify(cmd)
    }
}

/// Result of [`Store::find_and_modify`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FindAndModifyOutcome {
    /// The returned document (`null` on the wire when `None`).
    pub value: Option<Document>,
    /// `lastErrorObject.n`.
    pub n: u64,
    /// `lastErrorObject.updatedExisting`.
    pub updated_existing: bool,
    /// `lastErrorObject.upserted`.
    pub upserted: Option<Bson>,
}

impl FindAndModifyOutcome {
    /// The `lastErrorObject` sub-document as mongod shapes it (`updatedExisting` only for
    /// updates, `upserted` only when an upsert happened).
    pub fn last_error_object(&self, was_update: bool) -> Document {
        let mut d = Document::new();
        d.insert("n", self.n as i32);
        if was_update {
            d.insert("updatedExisting", self.updated_existing);
        }
        if let Some(id) = &self.upserted {
            d.insert("upserted", id.clone());
        }
        d
    }
}

/// Result of [`Store::create_indexes`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CreateIndexesOutcome {
    /// Number of indexes before the command (1 for a new collection: `_id_`).
    pub num_indexes_before: i32,
    /// Number of indexes after the command.
    pub num_indexes_after: i32,
    /// Whether the collection was created by this command.
    pub created_collection_automatically: bool,
    /// mongod adds `note: "all indexes already exist"` when nothing was created.
    pub note: Option<String>,
}

/// Result of [`Store::drop_indexes`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DropIndexesOutcome {
    /// `nIndexesWas`: index count before the drop.
    pub n_indexes_was: i32,
}
