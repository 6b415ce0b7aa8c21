//! Databases, collections and index metadata.

use std::collections::BTreeMap;

use bson::{Bson, Document};

use super::{CreateIndexesOutcome, DropIndexesOutcome, EngineError, EngineResult};

/// The whole in-memory deployment: databases → collections → documents in insertion order.
#[derive(Debug, Clone, Default)]
pub struct Store {
    pub(crate) databases: BTreeMap<String, Database>,
}

/// One database's collections.
#[derive(Debug, Clone, Default)]
pub(crate) struct Database {
    pub(crate) collections: BTreeMap<String, Collection>,
}

/// One collection: documents in natural (insertion) order plus catalog metadata.
#[derive(Debug, Clone)]
pub(crate) struct Collection {
    pub(crate) docs: Vec<Document>,
    pub(crate) options: Document,
    pub(crate) uuid: bson::Uuid,
    pub(crate) indexes: Vec<Document>,
}

impl Store {
    /// An empty deployment.
    pub fn new() -> Self {
        Store::default()
    }

    /// `create`: creates `db.name` with `options` (stored and echoed by listCollections).
    /// Fails with 48 NamespaceExists when the collection exists.
    pub fn create_collection(
        &mut self,
        db: &str,
        name: &str,
        options: &Document,
    ) -> EngineResult<()> {
        let _ = (db, name, options);
        Err(EngineError::illegal_operation("not implemented yet"))
    }

    /// `drop`: removes the collection; returns whether it existed (dropping a missing collection
    /// is not an error, as in mongod 7.0+).
    pub fn drop_collection(&mut self, db: &str, name: &str) -> bool {
        let _ = (db, name);
        false
    }

    /// `dropDatabase`: returns whether the database existed.
    pub fn drop_database(&mut self, db: &str) -> bool {
        let _ = db;
        false
    }

    /// `listDatabases`: `{name, sizeOnDisk, empty}` documents (only `{name}` when `name_only`),
    /// filtered by `filter` (a query over those documents).
    pub fn list_databases(
        &self,
        filter: Option<&Document>,
        name_only: bool,
    ) -> EngineResult<Vec<Document>> {
        let _ = (filter, name_only);
        Ok(Vec::new())
    }

    /// `listCollections`: mongod-shaped collection documents (`name`, `type`, `options`,
    /// `info: {readOnly, uuid}`, `idIndex`), or `{name, type}` when `name_only`, filtered by
    /// `filter`. A missing database yields an empty list.
    pub fn list_collections(
        &self,
        db: &str,
        filter: Option<&Document>,
        name_only: bool,
    ) -> EngineResult<Vec<Document>> {
        let _ = (db, filter, name_only);
        Ok(Vec::new())
    }

    /// Whether `db.coll` exists.
    pub fn has_collection(&self, db: &str, coll: &str) -> bool {
        self.databases
            .get(db)
            .is_some_and(|d| d.collections.contains_key(coll))
    }

    /// The documents of `db.coll` in natural order (empty when it does not exist).
    pub fn documents(&self, db: &str, coll: &str) -> &[Document] {
        self.databases
            .get(db)
            .and_then(|d| d.collections.get(coll))
            .map(|c| c.docs.as_slice())
            .unwrap_or(&[])
    }

    /// `createIndexes`: `specs` are the command's `indexes` elements (`{key, name?, unique?,
    /// ...}`). Identical existing specs are accepted silently; same name with another spec is 85
    /// IndexOptionsConflict or 86 IndexKeySpecsConflict.
    pub fn create_indexes(
        &mut self,
        db: &str,
        coll: &str,
        specs: &[Document],
    ) -> EngineResult<CreateIndexesOutcome> {
        let _ = (db, coll, specs);
        Err(EngineError::illegal_operation("not implemented yet"))
    }

    /// `dropIndexes`: `index` is a name, a key pattern document, `"*"` (all but `_id_`) or an
    /// array of names. 27 IndexNotFound for unknown indexes, 72 InvalidOptions for `_id_`,
    /// 26 NamespaceNotFound for a missing collection.
    pub fn drop_indexes(
        &mut self,
        db: &str,
        coll: &str,
        index: &Bson,
    ) -> EngineResult<DropIndexesOutcome> {
        let _ = (db, coll, index);
        Err(EngineError::illegal_operation("not implemented yet"))
    }

    /// `listIndexes`: the index documents (`{v: 2, key, name, ...}`); 26 NamespaceNotFound for a
    /// missing collection.
    pub fn list_indexes(&self, db: &str, coll: &str) -> EngineResult<Vec<Document>> {
        let _ = (db, coll);
        Err(EngineError::illegal_operation("not implemented yet"))
    }
}
