//! Insert, update, delete, find, findAndModify, count and distinct on a [`Store`].

use bson::{Bson, Document};

use super::{
    DeleteOutcome, DeleteStatement, EngineError, EngineResult, FindAndModifyOutcome,
    FindAndModifySpec, FindSpec, InsertOutcome, Store, UpdateModification, UpdateOutcome,
    UpdateStatement,
};

fn todo_err() -> EngineError {
    EngineError::illegal_operation("not implemented yet")
}

pub(crate) fn parse_find(cmd: &Document) -> EngineResult<FindSpec> {
    let _ = cmd;
    Err(todo_err())
}

pub(crate) fn parse_modification(value: &Bson) -> EngineResult<UpdateModification> {
    let _ = value;
    Err(todo_err())
}

pub(crate) fn parse_update_statement(stmt: &Document) -> EngineResult<UpdateStatement> {
    let _ = stmt;
    Err(todo_err())
}

pub(crate) fn parse_delete_statement(stmt: &Document) -> EngineResult<DeleteStatement> {
    let _ = stmt;
    Err(todo_err())
}

pub(crate) fn parse_find_and_modify(cmd: &Document) -> EngineResult<FindAndModifySpec> {
    let _ = cmd;
    Err(todo_err())
}

impl Store {
    /// `insert`: adds `docs` to `db.coll` (created implicitly), generating an ObjectId `_id`
    /// (placed first) when missing. Ordered inserts stop at the first failure.
    pub fn insert(
        &mut self,
        db: &str,
        coll: &str,
        docs: Vec<Document>,
        ordered: bool,
    ) -> InsertOutcome {
        let _ = (db, coll, docs, ordered);
        InsertOutcome::default()
    }

    /// `update`: runs the statements in order; ordered updates stop at the first failure.
    pub fn update(
        &mut self,
        db: &str,
        coll: &str,
        statements: &[UpdateStatement],
        ordered: bool,
    ) -> UpdateOutcome {
        let _ = (db, coll, statements, ordered);
        UpdateOutcome::default()
    }

    /// `delete`: runs the statements in order; ordered deletes stop at the first failure.
    pub fn delete(
        &mut self,
        db: &str,
        coll: &str,
        statements: &[DeleteStatement],
        ordered: bool,
    ) -> DeleteOutcome {
        let _ = (db, coll, statements, ordered);
        DeleteOutcome::default()
    }

    /// `find`: matching documents, sorted, skipped, limited and projected. A missing collection
    /// yields no documents.
    pub fn find(&self, db: &str, coll: &str, spec: &FindSpec) -> EngineResult<Vec<Document>> {
        let _ = (db, coll, spec);
        Err(todo_err())
    }

    /// `findAndModify`.
    pub fn find_and_modify(
        &mut self,
        db: &str,
        coll: &str,
        spec: &FindAndModifySpec,
    ) -> EngineResult<FindAndModifyOutcome> {
        let _ = (db, coll, spec);
        Err(todo_err())
    }

    /// `count`: number of matching documents after `skip`, capped by `limit` (0 = none,
    /// negative = absolute value).
    pub fn count(
        &self,
        db: &str,
        coll: &str,
        filter: &Document,
        skip: u64,
        limit: i64,
    ) -> EngineResult<u64> {
        let _ = (db, coll, filter, skip, limit);
        Err(todo_err())
    }

    /// `distinct`: distinct values of `key` (dotted, arrays unwound one level) among matching
    /// documents, in first-seen order.
    pub fn distinct(
        &self,
        db: &str,
        coll: &str,
        key: &str,
        filter: &Document,
    ) -> EngineResult<Vec<Bson>> {
        let _ = (db, coll, key, filter);
        Err(todo_err())
    }
}
