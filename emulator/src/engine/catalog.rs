//! Databases, collections, index metadata and the per-collection write primitives.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use bson::{doc, oid::ObjectId, Bson, Document};

use super::compare::{bson_eq, id_key, IdKey};
use super::limits::{bson_size, check_depth, check_size};
use super::path::get_exact;
use super::query::matches;
use super::value::bson_type_name;
use super::{CreateIndexesOutcome, DropIndexesOutcome, EngineError, EngineResult};

/// Databases every mongod has from its start (see `Store::list_databases`).
const SYSTEM_DATABASES: [&str; 2] = ["admin", "config"];

/// The whole in-memory deployment: databases → collections → documents in insertion order.
///
/// Plain owned data (`Clone + Send + Sync`); the server serializes access with its own lock
/// and can snapshot it with `clone()` (e.g. for transactions).
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
    /// The `_id_` index: each `_id` of `docs` → its position in `docs`. It enforces `_id`
    /// uniqueness and answers `{_id: v}` lookups without a scan.
    ids: BTreeMap<IdKey, usize>,
    pub(crate) options: Document,
    pub(crate) uuid: bson::Uuid,
    pub(crate) indexes: Vec<Document>,
}

fn id_index() -> Document {
    let mut key = Document::new();
    key.insert("_id", 1);
    let mut d = Document::new();
    d.insert("v", 2);
    d.insert("key", key);
    d.insert("name", "_id_");
    d
}

/// The first `$`-prefixed field name inside an `_id` value, at any depth (5.0+ stores such
/// names elsewhere in a document, never inside `_id`). The depth is bounded by the document
/// depth check that runs first; the cap keeps the recursion finite regardless.
fn dollar_prefixed_in(value: &Bson, depth: usize) -> Option<String> {
    if depth > crate::engine::MAX_DEPTH {
        return None;
    }
    match value {
        Bson::Document(d) => d.iter().find_map(|(k, v)| {
            if k.starts_with('$') {
                Some(k.clone())
            } else {
                dollar_prefixed_in(v, depth + 1)
            }
        }),
        Bson::Array(items) => items.iter().find_map(|v| dollar_prefixed_in(v, depth + 1)),
        _ => None,
    }
}

/// `create`'s options with a `clusteredIndex` checked (`key: {_id: 1}`, `unique: true`) and
/// completed with `v: 2`, as mongod stores and lists it.
fn clustered_options(mut options: Document) -> EngineResult<Document> {
    let Some(spec) = options.get("clusteredIndex") else {
        return Ok(options);
    };
    let Bson::Document(spec) = spec else {
        return Err(EngineError::type_mismatch(
            "BSON field 'create.clusteredIndex' is the wrong type, expected type 'object'",
        ));
    };
    let key_is_id = spec
        .get_document("key")
        .is_ok_and(|k| k.len() == 1 && k.get("_id").is_some_and(|v| bson_eq(v, &Bson::Int32(1))));
    if !key_is_id {
        return Err(EngineError::invalid_options(
            "The clustered index specification must have key {_id: 1}",
        ));
    }
    if !matches!(spec.get("unique"), Some(Bson::Boolean(true))) {
        return Err(EngineError::invalid_options(
            "The clustered index specification must have 'unique: true'",
        ));
    }
    let mut spec = spec.clone();
    if !spec.contains_key("v") {
        spec.insert("v", 2);
    }
    options.insert("clusteredIndex", spec);
    Ok(options)
}

/// `create`'s options for a view checked and normalized: `viewOn` a non-empty string,
/// `pipeline` an array of documents (empty when absent). Options a view cannot have are
/// rejected like mongod does. (`view.rs` resolves views; this only reads `create`.)
fn view_options(options: &Document) -> EngineResult<Document> {
    let view_on = match options.get("viewOn") {
        Some(Bson::String(s)) if !s.is_empty() => s.clone(),
        Some(Bson::String(_)) => {
            return Err(EngineError::bad_value("'viewOn' cannot be empty"));
        }
        Some(other) => {
            return Err(EngineError::type_mismatch(format!(
                "BSON field 'create.viewOn' is the wrong type '{}', expected type 'string'",
                bson_type_name(other)
            )))
        }
        None => return Err(EngineError::bad_value("a view needs 'viewOn'")),
    };
    let pipeline = match options.get("pipeline") {
        None => Vec::new(),
        Some(Bson::Array(stages)) => {
            for stage in stages {
                if !matches!(stage, Bson::Document(_)) {
                    return Err(EngineError::type_mismatch(
                        "'pipeline' must be an array of objects",
                    ));
                }
            }
            stages.clone()
        }
        Some(_) => {
            return Err(EngineError::type_mismatch(
                "'pipeline' must be an array of objects",
            ))
        }
    };
    for key in options.keys() {
        if !matches!(key.as_str(), "viewOn" | "pipeline" | "collation") {
            return Err(EngineError::invalid_options(format!(
                "option '{key}' is not supported for a view"
            )));
        }
    }
    let mut out = Document::new();
    out.insert("viewOn", view_on);
    out.insert("pipeline", pipeline);
    if let Some(c) = options.get("collation") {
        out.insert("collation", c.clone());
    }
    Ok(out)
}

/// Validates a database name the way mongod does (no empty names, no `/\. "$` or NUL).
fn validate_db_name(db: &str) -> EngineResult<()> {
    if db.is_empty()
        || db.len() > 63
        || db
            .chars()
            .any(|c| matches!(c, '/' | '\\' | '.' | ' ' | '"' | '$' | '\0'))
    {
        return Err(EngineError::invalid_namespace(format!(
            "Invalid database name: '{db}'"
        )));
    }
    Ok(())
}

fn validate_coll_name(db: &str, coll: &str) -> EngineResult<()> {
    if coll.is_empty() || coll.contains('$') || coll.contains('\0') || coll.starts_with('.') {
        return Err(EngineError::invalid_namespace(format!(
            "Invalid namespace specified '{db}.{coll}'"
        )));
    }
    Ok(())
}

/// Renders a key for duplicate-key messages: `{ _id: 1 }`.
fn dup_key_text(fields: &[(String, Bson)]) -> String {
    let inner: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{k}: {}", shell_text(v)))
        .collect();
    format!("{{ {} }}", inner.join(", "))
}

/// mongod's DuplicateKey error: the E11000 message plus `keyPattern` and `keyValue`.
pub(crate) fn duplicate_key_error(
    ns: &str,
    index: &str,
    key_pattern: Document,
    values: &[(String, Bson)],
) -> EngineError {
    let mut key_value = Document::new();
    for (k, v) in values {
        key_value.insert(k.clone(), v.clone());
    }
    let mut details = Document::new();
    details.insert("keyPattern", key_pattern);
    details.insert("keyValue", key_value);
    EngineError::duplicate_key(format!(
        "E11000 duplicate key error collection: {ns} index: {index} dup key: {}",
        dup_key_text(values)
    ))
    .with_details(details)
}

/// A value as mongod prints it in messages (`5.0`, `"x"`, `ObjectId('…')`).
fn shell_text(v: &Bson) -> String {
    match v {
        Bson::Double(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e15 => format!("{f:.1}"),
        Bson::ObjectId(o) => format!("ObjectId('{}')", o.to_hex()),
        Bson::Document(d) => {
            let inner: Vec<String> = d
                .iter()
                .map(|(k, v)| format!("{k}: {}", shell_text(v)))
                .collect();
            if inner.is_empty() {
                "{}".to_owned()
            } else {
                format!("{{ {} }}", inner.join(", "))
            }
        }
        other => other.to_string(),
    }
}

impl Collection {
    pub(crate) fn new(options: Document) -> Self {
        Collection {
            docs: Vec::new(),
            ids: BTreeMap::new(),
            options,
            uuid: bson::Uuid::new(),
            indexes: vec![id_index()],
        }
    }

    /// Whether this catalog entry is a view.
    pub(crate) fn is_view(&self) -> bool {
        self.options.contains_key("viewOn")
    }

    /// Gives `doc` an ObjectId `_id` when it has none and moves `_id` to the front, as mongod
    /// stores it; validates `_id`, depth and size.
    pub(crate) fn prepare_for_insert(doc: Document) -> EngineResult<Document> {
        check_depth(&doc)?;
        let mut out = Document::new();
        match doc.get("_id") {
            Some(Bson::Array(_)) => {
                return Err(EngineError::invalid_id_field(
                    "The '_id' value cannot be of type array",
                ));
            }
            Some(Bson::RegularExpression(_)) => {
                return Err(EngineError::invalid_id_field("can't use a regex for _id"));
            }
            Some(id) => {
                if let Some(name) = dollar_prefixed_in(id, 0) {
                    return Err(EngineError::dollar_prefixed_field_name(format!(
                            "_id fields may not contain '$'-prefixed fields: {name} is not valid for storage."
                    )));
                }
                out.insert("_id", id.clone());
            }
            None => {
                out.insert("_id", ObjectId::new());
            }
        }
        for (k, v) in doc {
            if k != "_id" {
                out.insert(k, v);
            }
        }
        check_size(&out)?;
        Ok(out)
    }

    /// Inserts a prepared document after the `_id` and unique-index checks; returns its `_id`.
    pub(crate) fn insert_prepared(&mut self, ns: &str, doc: Document) -> EngineResult<Bson> {
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        if let Ok(timeseries) = self.options.get_document("timeseries") {
            // A time-series collection has no `_id` index: `_id`s may repeat, and every
            // measurement needs its time field as a date.
            let time_field = timeseries.get_str("timeField").unwrap_or("time");
            if !matches!(doc.get(time_field), Some(Bson::DateTime(_))) {
                return Err(EngineError::bad_value(format!(
                    "'{time_field}' must be present and contain a valid BSON UTC datetime value"
                )));
            }
            super::validation::validate(&self.options, None, &doc)?;
            self.docs.push(doc);
            return Ok(id);
        }
        if self.ids.contains_key(&id_key(&id)) {
            let mut pattern = Document::new();
            pattern.insert("_id", 1);
            return Err(duplicate_key_error(
                ns,
                "_id_",
                pattern,
                &[("_id".to_owned(), id)],
            ));
        }
        super::validation::validate(&self.options, None, &doc)?;
        self.check_unique(ns, &doc, None)?;
        self.ids.insert(id_key(&id), self.docs.len());
        self.docs.push(doc);
        Ok(id)
    }

    /// Replaces the document at `idx` (its `_id` is unchanged by construction).
    pub(crate) fn replace_at(&mut self, ns: &str, idx: usize, doc: Document) -> EngineResult<()> {
        check_size(&doc).map_err(|_| {
            EngineError::bson_object_too_large(format!(
                "Resulting document after update is larger than {}",
                super::limits::MAX_BSON_SIZE
            ))
        })?;
        super::validation::validate(&self.options, self.docs.get(idx), &doc)?;
        self.check_unique(ns, &doc, Some(idx))?;
        if let Some(slot) = self.docs.get_mut(idx) {
            *slot = doc;
        }
        Ok(())
    }

    /// The position in `docs` of the document whose `_id` equals `id` (numbers compare by
    /// value across types, as in mongod's index).
    pub(crate) fn position_of_id(&self, id: &Bson) -> Option<usize> {
        self.ids.get(&id_key(id)).copied()
    }

    /// Positions, ascending, of the documents whose `_id` lies between `lower` and `upper` in
    /// the index's order (which orders values of different types by type, like mongod).
    pub(crate) fn positions_in_id_range(
        &self,
        lower: Bound<&Bson>,
        upper: Bound<&Bson>,
    ) -> Vec<usize> {
        let key = |b: Bound<&Bson>| match b {
            Bound::Included(v) => Bound::Included(id_key(v)),
            Bound::Excluded(v) => Bound::Excluded(id_key(v)),
            Bound::Unbounded => Bound::Unbounded,
        };
        let (lower, upper) = (key(lower), key(upper));
        // BTreeMap::range panics on inverted or equal-excluded bounds; such a range is empty.
        let empty = match (&lower, &upper) {
            (Bound::Included(l), Bound::Included(u)) => l > u,
            (Bound::Included(l) | Bound::Excluded(l), Bound::Excluded(u))
            | (Bound::Excluded(l), Bound::Included(u)) => l >= u,
            _ => false,
        };
        if empty {
            return Vec::new();
        }
        let mut positions: Vec<usize> = self.ids.range((lower, upper)).map(|(_, &i)| i).collect();
        positions.sort_unstable();
        positions
    }

    /// Removes the documents at the given indexes.
    pub(crate) fn remove_indexes(&mut self, indexes: &[usize]) {
        let key = |d: &Document| id_key(d.get("_id").unwrap_or(&Bson::Null));
        let doomed: BTreeSet<usize> = indexes.iter().copied().collect();
        let Some(&first) = doomed.first() else {
            return;
        };
        for d in doomed.iter().filter_map(|&i| self.docs.get(i)) {
            self.ids.remove(&key(d));
        }
        let mut i = 0;
        self.docs.retain(|_| {
            let keep = !doomed.contains(&i);
            i += 1;
            keep
        });
        // Only the documents after the first removed one moved.
        for (position, d) in self.docs.iter().enumerate().skip(first) {
            if let Some(slot) = self.ids.get_mut(&key(d)) {
                *slot = position;
            }
        }
    }

    /// Removes every document (keeps indexes and options).
    pub(crate) fn clear(&mut self) {
        self.docs.clear();
        self.ids.clear();
    }

    /// Enforces `unique: true` indexes other than `_id_` by scanning (cheap at emulator sizes).
    fn check_unique(&self, ns: &str, doc: &Document, exclude: Option<usize>) -> EngineResult<()> {
        // Unique indexes have the simple collation, whatever the command's is.
        super::collation::with_simple(|| self.check_unique_keys(ns, doc, exclude))
    }

    fn check_unique_keys(
        &self,
        ns: &str,
        doc: &Document,
        exclude: Option<usize>,
    ) -> EngineResult<()> {
        for index in &self.indexes {
            // `prepareUnique` (collMod) refuses new duplicates before the index turns unique.
            let enforced = ["unique", "prepareUnique"]
                .iter()
                .any(|k| matches!(index.get(*k), Some(Bson::Boolean(true))));
            if !enforced {
                continue;
            }
            let Ok(key) = index.get_document("key") else {
                continue;
            };
            let name = index.get_str("name").unwrap_or("");
            if name == "_id_" {
                continue;
            }
            let sparse = matches!(index.get("sparse"), Some(Bson::Boolean(true)));
            let values = |d: &Document| -> Vec<(String, Bson)> {
                key.keys()
                    .map(|k| (k.clone(), get_exact(d, k).cloned().unwrap_or(Bson::Null)))
                    .collect()
            };
            let candidate = values(doc);
            if sparse && key.keys().all(|k| get_exact(doc, k).is_none()) {
                continue;
            }
            for (i, other) in self.docs.iter().enumerate() {
                if Some(i) == exclude {
                    continue;
                }
                if sparse && key.keys().all(|k| get_exact(other, k).is_none()) {
                    continue;
                }
                let existing = values(other);
                if candidate
                    .iter()
                    .zip(existing.iter())
                    .all(|((_, a), (_, b))| bson_eq(a, b))
                {
                    return Err(duplicate_key_error(ns, name, key.clone(), &candidate));
                }
            }
        }
        Ok(())
    }

    fn data_size(&self) -> i64 {
        self.docs.iter().map(|d| bson_size(d) as i64).sum()
    }
}

/// mongod's default index name: `a_1_b_-1`.
fn default_index_name(key: &Document) -> String {
    let parts: Vec<String> = key
        .iter()
        .map(|(k, v)| {
            let value = match v {
                Bson::Int32(i) => i.to_string(),
                Bson::Int64(i) => i.to_string(),
                Bson::Double(f) if f.fract() == 0.0 && f.is_finite() => format!("{}", *f as i64),
                Bson::String(s) => s.clone(),
                other => other.to_string(),
            };
            format!("{k}_{value}")
        })
        .collect();
    parts.join("_")
}

/// Index options compared when deciding whether an existing index is "the same".
fn index_options(spec: &Document) -> Vec<(String, Bson)> {
    spec.iter()
        .filter(|(k, _)| !matches!(k.as_str(), "v" | "key" | "name" | "ns" | "background"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

impl Store {
    /// An empty deployment.
    pub fn new() -> Self {
        Store::default()
    }

    pub(crate) fn collection(&self, db: &str, coll: &str) -> Option<&Collection> {
        self.databases.get(db).and_then(|d| d.collections.get(coll))
    }

    pub(crate) fn collection_mut(&mut self, db: &str, coll: &str) -> Option<&mut Collection> {
        self.databases
            .get_mut(db)
            .and_then(|d| d.collections.get_mut(coll))
    }

    /// The collection, created implicitly (with a validated namespace) when missing; the flag
    /// tells whether it was created.
    pub(crate) fn collection_or_create(
        &mut self,
        db: &str,
        coll: &str,
    ) -> EngineResult<(&mut Collection, bool)> {
        validate_db_name(db)?;
        validate_coll_name(db, coll)?;
        let database = self.databases.entry(db.to_owned()).or_default();
        let created = !database.collections.contains_key(coll);
        let c = database
            .collections
            .entry(coll.to_owned())
            .or_insert_with(|| Collection::new(Document::new()));
        Ok((c, created))
    }

    /// `create`: creates `db.name` with `options` (stored and echoed by `listCollections`).
    /// Fails with 48 NamespaceExists when the collection exists, 73 InvalidNamespace for bad
    /// names.
    pub fn create_collection(
        &mut self,
        db: &str,
        name: &str,
        options: &Document,
    ) -> EngineResult<()> {
        validate_db_name(db)?;
        validate_coll_name(db, name)?;
        check_depth(options)?;
        let options = if options.contains_key("viewOn") {
            view_options(options)?
        } else {
            options.clone()
        };
        let database = self.databases.entry(db.to_owned()).or_default();
        if database.collections.contains_key(name) {
            return Err(EngineError::namespace_exists(format!(
                "Collection {db}.{name} already exists."
            )));
        }
        let options = clustered_options(options)?;
        let mut collection = Collection::new(options);
        if collection.is_view() {
            // A view has no documents and no indexes.
            collection.indexes.clear();
        }
        if let Ok(clustered) = collection.options.get_document("clusteredIndex") {
            // The clustered index takes the `_id_` index's place in listIndexes.
            let mut index = Document::new();
            index.insert("v", clustered.get("v").cloned().unwrap_or(Bson::Int32(2)));
            index.insert("key", clustered.get("key").cloned().unwrap_or_default());
            index.insert(
                "name",
                clustered.get_str("name").unwrap_or("_id_").to_owned(),
            );
            index.insert("unique", true);
            index.insert("clustered", true);
            collection.indexes = vec![index];
        }
        database.collections.insert(name.to_owned(), collection);
        Ok(())
    }

    /// `drop`: removes the collection and returns whether it existed (dropping a missing
    /// collection is not an error, as in mongod 7.0+). A database left empty disappears.
    pub fn drop_collection(&mut self, db: &str, name: &str) -> bool {
        let Some(database) = self.databases.get_mut(db) else {
            return false;
        };
        let existed = database.collections.remove(name).is_some();
        if database.collections.is_empty() {
            self.databases.remove(db);
        }
        existed
    }

    /// `renameCollection`: moves `from_db.from` to `to_db.to` with its documents, options and
    /// indexes. 26 NamespaceNotFound when the source is missing, 48 NamespaceExists when the
    /// target exists and `drop_target` is false, 20 IllegalOperation when source and target
    /// are the same, 73 InvalidNamespace for a bad target name.
    pub fn rename_collection(
        &mut self,
        from_db: &str,
        from: &str,
        to_db: &str,
        to: &str,
        drop_target: bool,
    ) -> EngineResult<()> {
        validate_db_name(to_db)?;
        validate_coll_name(to_db, to)?;
        if from_db == to_db && from == to {
            return Err(EngineError::illegal_operation(
                "Can't rename a collection to itself",
            ));
        }
        if !self.has_collection(from_db, from) {
            return Err(EngineError::namespace_not_found(format!(
                "Source collection {from_db}.{from} does not exist"
            )));
        }
        if self.has_collection(to_db, to) {
            if !drop_target {
                return Err(EngineError::namespace_exists(format!(
                    "Target namespace {to_db}.{to} already exists"
                )));
            }
            self.drop_collection(to_db, to);
        }
        let Some(database) = self.databases.get_mut(from_db) else {
            return Err(EngineError::namespace_not_found(format!(
                "Source collection {from_db}.{from} does not exist"
            )));
        };
        let Some(collection) = database.collections.remove(from) else {
            return Err(EngineError::namespace_not_found(format!(
                "Source collection {from_db}.{from} does not exist"
            )));
        };
        if database.collections.is_empty() {
            self.databases.remove(from_db);
        }
        self.databases
            .entry(to_db.to_owned())
            .or_default()
            .collections
            .insert(to.to_owned(), collection);
        Ok(())
    }

    /// `dropDatabase`: returns whether the database existed.
    pub fn drop_database(&mut self, db: &str) -> bool {
        self.databases.remove(db).is_some()
    }

    /// Names of the existing databases, sorted.
    pub fn database_names(&self) -> Vec<String> {
        self.databases.keys().cloned().collect()
    }

    /// Names of the collections of `db`, sorted (empty for a missing database).
    pub fn collection_names(&self, db: &str) -> Vec<String> {
        self.databases
            .get(db)
            .map(|d| d.collections.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// `listDatabases`: `{name, sizeOnDisk, empty}` documents (`{name}` when `name_only`)
    /// filtered by `filter`, a query over those documents.
    pub fn list_databases(
        &self,
        filter: Option<&Document>,
        name_only: bool,
    ) -> EngineResult<Vec<Document>> {
        let mut out = Vec::new();
        // mongod always has `admin` (system.version) and `config` (system.sessions, created at
        // start), so listDatabases names them even before anything is written there
        // (https://www.mongodb.com/docs/manual/reference/command/listDatabases/). The store
        // holds neither until a command writes to it; list them as mongod does.
        for system in SYSTEM_DATABASES {
            if self.databases.contains_key(system) {
                continue;
            }
            let mut d = doc! { "name": system };
            if !name_only {
                d.insert("sizeOnDisk", 0i64);
                d.insert("empty", false);
            }
            if filter.map_or(Ok(true), |f| matches(f, &d))? {
                out.push(d);
            }
        }
        for (name, database) in &self.databases {
            let mut d = Document::new();
            d.insert("name", name.clone());
            if !name_only {
                let size: i64 = database
                    .collections
                    .values()
                    .map(Collection::data_size)
                    .sum();
                let empty = database.collections.values().all(|c| c.docs.is_empty());
                d.insert("sizeOnDisk", size);
                d.insert("empty", empty);
            }
            if let Some(f) = filter {
                if !matches(f, &d)? {
                    continue;
                }
            }
            out.push(d);
        }
        out.sort_by(|a, b| a.get_str("name").ok().cmp(&b.get_str("name").ok()));
        Ok(out)
    }

    /// `listCollections`: mongod-shaped documents (`name`, `type: "collection"`, `options`,
    /// `info: {readOnly: false, uuid}`, `idIndex`), or `{name, type}` when `name_only`,
    /// filtered by `filter`. A missing database yields an empty list.
    pub fn list_collections(
        &self,
        db: &str,
        filter: Option<&Document>,
        name_only: bool,
    ) -> EngineResult<Vec<Document>> {
        let Some(database) = self.databases.get(db) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (name, c) in &database.collections {
            let mut d = Document::new();
            d.insert("name", name.clone());
            let kind = if c.is_view() {
                "view"
            } else if c.options.contains_key("timeseries") {
                "timeseries"
            } else {
                "collection"
            };
            d.insert("type", kind);
            if !name_only {
                d.insert("options", c.options.clone());
                let mut info = Document::new();
                // mongod lists a view as read-only, without a uuid or an `_id` index.
                info.insert("readOnly", c.is_view());
                if !c.is_view() {
                    info.insert("uuid", c.uuid);
                }
                d.insert("info", info);
                if !c.is_view() {
                    d.insert("idIndex", id_index());
                }
            }
            if let Some(f) = filter {
                if !matches(f, &d)? {
                    continue;
                }
            }
            out.push(d);
        }
        Ok(out)
    }

    /// Whether `db.coll` exists.
    pub fn has_collection(&self, db: &str, coll: &str) -> bool {
        self.collection(db, coll).is_some()
    }

    /// The documents of `db.coll` in natural order (empty when it does not exist).
    pub fn documents(&self, db: &str, coll: &str) -> &[Document] {
        self.collection(db, coll)
            .map(|c| c.docs.as_slice())
            .unwrap_or(&[])
    }

    /// `createIndexes`: `specs` are the command's `indexes` elements (`{key, name?, unique?,
    /// ...}`); names default to mongod's `a_1_b_-1` form. An identical existing index is
    /// accepted silently; the same name with another key is 86 IndexKeySpecsConflict, with
    /// other options (or the same key under another name) 85 IndexOptionsConflict. Creating a
    /// unique index over duplicate values fails with 11000.
    pub fn create_indexes(
        &mut self,
        db: &str,
        coll: &str,
        specs: &[Document],
    ) -> EngineResult<CreateIndexesOutcome> {
        if specs.is_empty() {
            return Err(EngineError::bad_value(
                "Must specify at least one index to create",
            ));
        }
        let mut prepared = Vec::with_capacity(specs.len());
        for spec in specs {
            check_depth(spec)?;
            let key = match spec.get("key") {
                Some(Bson::Document(k)) if !k.is_empty() => k.clone(),
                Some(Bson::Document(_)) => {
                    return Err(EngineError::cannot_create_index(
                        "Index keys cannot be an empty field.",
                    ))
                }
                _ => {
                    return Err(EngineError::failed_to_parse(
                        "The 'key' field is a required property of an index specification",
                    ))
                }
            };
            for (field, dir) in &key {
                let valid = match dir {
                    Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
                        super::expression::is_truthy(dir)
                    }
                    Bson::String(s) => matches!(
                        s.as_str(),
                        "text" | "2d" | "2dsphere" | "hashed" | "geoHaystack"
                    ),
                    _ => false,
                };
                if !valid || field.is_empty() {
                    return Err(EngineError::cannot_create_index(format!("Error in specification {spec} :: caused by :: Values in the index key pattern can't be 0 or an unknown type: {field}: {dir}")));
                }
            }
            let name = match spec.get("name") {
                Some(Bson::String(n)) if !n.is_empty() => n.clone(),
                Some(Bson::String(_)) => {
                    return Err(EngineError::cannot_create_index(
                        "The index name cannot be empty",
                    ))
                }
                Some(_) => {
                    return Err(EngineError::type_mismatch(
                        "The field 'name' must be a string",
                    ))
                }
                None => default_index_name(&key),
            };
            let mut normalized = Document::new();
            normalized.insert("v", 2);
            normalized.insert("key", key);
            normalized.insert("name", name);
            for (k, v) in spec {
                if !matches!(k.as_str(), "v" | "key" | "name" | "ns") {
                    normalized.insert(k.clone(), v.clone());
                }
            }
            prepared.push(normalized);
        }
        let ns = format!("{db}.{coll}");
        let (collection, created) = self.collection_or_create(db, coll)?;
        let before = collection.indexes.len();
        let mut candidate = collection.clone();
        for spec in prepared {
            let name = spec.get_str("name").unwrap_or_default().to_owned();
            let key = spec.get_document("key").cloned().unwrap_or_default();
            if let Some(existing) = candidate
                .indexes
                .iter()
                .find(|i| i.get_str("name").ok() == Some(name.as_str()))
            {
                let same_key = existing
                    .get_document("key")
                    .is_ok_and(|k| super::compare::strict_equal_docs(k, &key));
                if !same_key {
                    return Err(EngineError::index_key_specs_conflict(format!(
                        "An existing index has the same name as the requested index. When index names are not specified, they are auto generated and can cause conflicts. Please refer to our documentation. Requested index: {spec}, existing index: {existing}"
                    )));
                }
                if index_options(existing) != index_options(&spec) && name != "_id_" {
                    return Err(EngineError::index_options_conflict(format!(
                        "An equivalent index already exists with the same name but different options. Requested index: {spec}, existing index: {existing}"
                    )));
                }
                continue;
            }
            if let Some(existing) = candidate.indexes.iter().find(|i| {
                i.get_document("key")
                    .is_ok_and(|k| super::compare::strict_equal_docs(k, &key))
            }) {
                if index_options(existing) == index_options(&spec) {
                    return Err(EngineError::index_options_conflict(format!(
                        "Index already exists with a different name: {}",
                        existing.get_str("name").unwrap_or_default()
                    )));
                }
            }
            candidate.indexes.push(spec);
            // A new unique index must hold for the documents already stored.
            let mut probe = candidate.clone();
            probe.docs.clear();
            for d in &candidate.docs {
                probe.check_unique(&ns, d, None)?;
                probe.docs.push(d.clone());
            }
        }
        let after = candidate.indexes.len();
        collection.indexes = candidate.indexes;
        Ok(CreateIndexesOutcome {
            num_indexes_before: i32::try_from(before).unwrap_or(i32::MAX),
            num_indexes_after: i32::try_from(after).unwrap_or(i32::MAX),
            created_collection_automatically: created,
            note: (before == after).then(|| "all indexes already exist".to_owned()),
        })
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
        let Some(collection) = self.collection_mut(db, coll) else {
            return Err(EngineError::namespace_not_found(format!(
                "ns not found {db}.{coll}"
            )));
        };
        let was = i32::try_from(collection.indexes.len()).unwrap_or(i32::MAX);
        let name_of = |i: &Document| i.get_str("name").unwrap_or_default().to_owned();
        let doomed: Vec<String> = match index {
            Bson::String(s) if s == "*" => collection
                .indexes
                .iter()
                .map(name_of)
                .filter(|n| n != "_id_")
                .collect(),
            Bson::String(s) => vec![s.clone()],
            Bson::Array(items) => {
                let mut names = Vec::with_capacity(items.len());
                for item in items {
                    match item {
                        Bson::String(s) if s != "*" => names.push(s.clone()),
                        _ => {
                            return Err(EngineError::type_mismatch(
                                "dropIndexes index names must be strings",
                            ))
                        }
                    }
                }
                names
            }
            Bson::Document(key) => {
                match collection.indexes.iter().find(|i| {
                    i.get_document("key").is_ok_and(|k| {
                        bson_eq(&Bson::Document(k.clone()), &Bson::Document(key.clone()))
                    })
                }) {
                    Some(i) => vec![name_of(i)],
                    None => {
                        return Err(EngineError::index_not_found(format!(
                            "can't find index with key: {key}"
                        )))
                    }
                }
            }
            _ => {
                return Err(EngineError::type_mismatch(
                    "dropIndexes 'index' must be a string, an array of strings or a document",
                ))
            }
        };
        for name in &doomed {
            if name == "_id_" {
                return Err(EngineError::invalid_options("cannot drop _id index"));
            }
            if !collection.indexes.iter().any(|i| &name_of(i) == name) {
                return Err(EngineError::index_not_found(format!(
                    "index not found with name [{name}]"
                )));
            }
        }
        collection.indexes.retain(|i| !doomed.contains(&name_of(i)));
        Ok(DropIndexesOutcome { n_indexes_was: was })
    }

    /// `listIndexes`: the index documents (`{v: 2, key, name, ...}`); 26 NamespaceNotFound for
    /// a missing collection.
    pub fn list_indexes(&self, db: &str, coll: &str) -> EngineResult<Vec<Document>> {
        match self.collection(db, coll) {
            Some(c) => Ok(c.indexes.clone()),
            None => Err(EngineError::namespace_not_found(format!(
                "ns does not exist: {db}.{coll}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollar_prefixed_names_inside_id_are_refused() {
        let mut s = Store::new();
        let out = s.insert("db", "c", vec![bson::doc! {"_id": {"a": {"$b": 1}}}], true);
        let e = &out.write_errors[0].error;
        assert_eq!((e.code, e.code_name), (52, "DollarPrefixedFieldName"));
        assert!(
            e.message.contains("$b is not valid for storage"),
            "{}",
            e.message
        );
        // Elsewhere in the document they are stored (5.0+).
        let out = s.insert(
            "db",
            "c",
            vec![bson::doc! {"_id": 1, "$a": {"b.c": 1}}],
            true,
        );
        assert!(out.write_errors.is_empty());
    }

    #[test]
    fn clustered_and_time_series_collections() {
        let mut s = Store::new();
        s.create_collection(
            "db",
            "cl",
            &bson::doc! {"clusteredIndex": {"key": {"_id": 1}, "unique": true, "name": "by id"}},
        )
        .unwrap();
        let indexes = s.list_indexes("db", "cl").unwrap();
        assert_eq!(
            indexes,
            vec![
                bson::doc! {"v": 2, "key": {"_id": 1}, "name": "by id", "unique": true, "clustered": true}
            ]
        );
        let bad = bson::doc! {"clusteredIndex": {"key": {"x": 1}, "unique": true}};
        assert!(s.create_collection("db", "cl2", &bad).is_err());
        s.create_collection("db", "ts", &bson::doc! {"timeseries": {"timeField": "t"}})
            .unwrap();
        let t = bson::DateTime::from_millis(1);
        let out = s.insert(
            "db",
            "ts",
            vec![bson::doc! {"_id": 1, "t": t}, bson::doc! {"_id": 1, "t": t}],
            true,
        );
        assert_eq!((out.n, out.write_errors.len()), (2, 0));
        let out = s.insert("db", "ts", vec![bson::doc! {"_id": 2}], true);
        assert_eq!(out.write_errors[0].error.code, 2);
        let listed = s
            .list_collections("db", Some(&bson::doc! {"name": "ts"}), true)
            .unwrap();
        assert_eq!(listed[0].get_str("type"), Ok("timeseries"));
    }
    use bson::doc;

    #[test]
    fn store_can_be_shared_across_threads() {
        fn assert_shareable<T: Clone + Send + Sync + 'static>() {}
        assert_shareable::<Store>();
    }

    #[test]
    fn create_twice_is_namespace_exists() {
        let mut s = Store::new();
        s.create_collection("db", "c", &doc! {"capped": false})
            .expect("created");
        let err = s
            .create_collection("db", "c", &doc! {})
            .expect_err("exists");
        assert_eq!((err.code, err.code_name), (48, "NamespaceExists"));
        assert_eq!(
            s.create_collection("db", "a$b", &doc! {})
                .map_err(|e| e.code),
            Err(73)
        );
        assert_eq!(
            s.create_collection("d.b", "c", &doc! {})
                .map_err(|e| e.code),
            Err(73)
        );
    }

    #[test]
    fn drop_reports_existence_and_removes_empty_databases() {
        let mut s = Store::new();
        s.create_collection("db", "c", &doc! {}).expect("created");
        assert!(s.drop_collection("db", "c"));
        assert!(!s.drop_collection("db", "c"));
        assert!(s.database_names().is_empty());
        s.create_collection("db", "c", &doc! {}).expect("created");
        assert!(s.drop_database("db"));
        assert!(!s.drop_database("db"));
    }

    #[test]
    fn rename_moves_documents_and_checks_targets() {
        let mut s = Store::new();
        s.insert("db", "a", vec![doc! {"_id": 1}], true);
        s.create_indexes("db", "a", &[doc! {"key": {"x": 1}}])
            .expect("ok");
        s.create_collection("db", "b", &doc! {}).expect("created");
        assert_eq!(
            s.rename_collection("db", "a", "db", "b", false)
                .map_err(|e| e.code),
            Err(48)
        );
        assert_eq!(
            s.rename_collection("db", "nope", "db", "c", false)
                .map_err(|e| e.code),
            Err(26)
        );
        assert_eq!(
            s.rename_collection("db", "a", "db", "a", false)
                .map_err(|e| e.code),
            Err(20)
        );
        s.rename_collection("db", "a", "other", "b", false)
            .expect("renamed");
        assert!(!s.has_collection("db", "a"));
        assert_eq!(s.documents("other", "b"), &[doc! {"_id": 1}]);
        assert_eq!(s.list_indexes("other", "b").map(|l| l.len()), Ok(2));
        s.rename_collection("other", "b", "db", "b", true)
            .expect("renamed over target");
        assert_eq!(s.documents("db", "b").len(), 1);
        assert!(!s.database_names().contains(&"other".to_owned()));
    }

    #[test]
    fn list_collections_is_shaped_like_mongod_and_filtered() {
        let mut s = Store::new();
        s.create_collection("db", "x", &doc! {}).expect("created");
        s.create_collection("db", "y", &doc! {}).expect("created");
        let all = s.list_collections("db", None, false).expect("ok");
        assert_eq!(all.len(), 2);
        let x = &all[0];
        assert_eq!(x.get_str("name"), Ok("x"));
        assert_eq!(x.get_str("type"), Ok("collection"));
        assert_eq!(x.get_document("options"), Ok(&doc! {}));
        assert_eq!(
            x.get_document("info").and_then(|i| i.get_bool("readOnly")),
            Ok(false)
        );
        assert!(matches!(
            x.get_document("info").map(|i| i.get("uuid")),
            Ok(Some(Bson::Binary(_)))
        ));
        assert_eq!(
            x.get_document("idIndex"),
            Ok(&doc! {"v": 2, "key": {"_id": 1}, "name": "_id_"})
        );
        let filtered = s
            .list_collections("db", Some(&doc! {"name": "y"}), true)
            .expect("ok");
        assert_eq!(filtered, vec![doc! {"name": "y", "type": "collection"}]);
    }

    #[test]
    fn list_databases_reports_sizes_and_filters() {
        let mut s = Store::new();
        s.insert("a", "c", vec![doc! {"_id": 1}], true);
        s.create_collection("b", "c", &doc! {}).expect("created");
        let dbs = s.list_databases(None, false).expect("ok");
        let names: Vec<&str> = dbs.iter().filter_map(|d| d.get_str("name").ok()).collect();
        // admin and config, as on every mongod, in name order with the rest.
        assert_eq!(names, vec!["a", "admin", "b", "config"]);
        assert_eq!(dbs[0].get_bool("empty"), Ok(false));
        assert!(dbs[0].get_i64("sizeOnDisk").is_ok_and(|n| n > 0));
        assert_eq!(dbs[2].get_bool("empty"), Ok(true));
        assert_eq!(dbs[1].get_bool("empty"), Ok(false));
        assert_eq!(
            s.list_databases(Some(&doc! {"name": "b"}), true)
                .expect("ok"),
            vec![doc! {"name": "b"}]
        );
    }

    #[test]
    fn create_indexes_names_counts_and_conflicts() {
        let mut s = Store::new();
        let out = s
            .create_indexes("db", "c", &[doc! {"key": {"a": 1, "b": -1}}])
            .expect("ok");
        assert_eq!(
            (
                out.num_indexes_before,
                out.num_indexes_after,
                out.created_collection_automatically
            ),
            (1, 2, true)
        );
        let names: Vec<String> = s
            .list_indexes("db", "c")
            .expect("ok")
            .iter()
            .map(|i| i.get_str("name").unwrap_or("").to_owned())
            .collect();
        assert_eq!(names, vec!["_id_", "a_1_b_-1"]);
        let again = s
            .create_indexes("db", "c", &[doc! {"key": {"a": 1, "b": -1}}])
            .expect("idempotent");
        assert_eq!((again.num_indexes_before, again.num_indexes_after), (2, 2));
        assert_eq!(again.note.as_deref(), Some("all indexes already exist"));
        let err = s
            .create_indexes("db", "c", &[doc! {"key": {"z": 1}, "name": "a_1_b_-1"}])
            .expect_err("conflict");
        assert_eq!((err.code, err.code_name), (86, "IndexKeySpecsConflict"));
        let err = s
            .create_indexes(
                "db",
                "c",
                &[doc! {"key": {"a": 1, "b": -1}, "unique": true}],
            )
            .expect_err("conflict");
        assert_eq!(err.code, 85);
        let err = s
            .create_indexes(
                "db",
                "c",
                &[doc! {"key": {"a": 1, "b": -1}, "name": "other"}],
            )
            .expect_err("conflict");
        assert_eq!(err.code, 85);
        assert_eq!(
            s.create_indexes("db", "c", &[doc! {"key": {"a": 0}}])
                .map_err(|e| e.code),
            Err(67)
        );
    }

    #[test]
    fn drop_indexes_by_name_key_star_and_errors() {
        let mut s = Store::new();
        s.create_indexes(
            "db",
            "c",
            &[
                doc! {"key": {"a": 1}},
                doc! {"key": {"b": 1}},
                doc! {"key": {"c": 1}},
            ],
        )
        .expect("ok");
        assert_eq!(
            s.drop_indexes("db", "c", &Bson::String("a_1".into()))
                .map(|o| o.n_indexes_was),
            Ok(4)
        );
        assert_eq!(
            s.drop_indexes("db", "c", &Bson::Document(doc! {"b": 1}))
                .map(|o| o.n_indexes_was),
            Ok(3)
        );
        assert_eq!(
            s.drop_indexes("db", "c", &Bson::String("a_1".into()))
                .map_err(|e| e.code),
            Err(27)
        );
        assert_eq!(
            s.drop_indexes("db", "c", &Bson::String("_id_".into()))
                .map_err(|e| e.code),
            Err(72)
        );
        assert_eq!(
            s.drop_indexes("db", "c", &Bson::String("*".into()))
                .map(|o| o.n_indexes_was),
            Ok(2)
        );
        assert_eq!(s.list_indexes("db", "c").map(|l| l.len()), Ok(1));
        assert_eq!(
            s.drop_indexes("db", "nope", &Bson::String("*".into()))
                .map_err(|e| e.code),
            Err(26)
        );
        assert_eq!(s.list_indexes("db", "nope").map_err(|e| e.code), Err(26));
    }

    #[test]
    fn unique_indexes_are_enforced() {
        let mut s = Store::new();
        s.insert(
            "db",
            "c",
            vec![doc! {"_id": 1, "a": 1}, doc! {"_id": 2, "a": 1}],
            true,
        );
        assert_eq!(
            s.create_indexes("db", "c", &[doc! {"key": {"a": 1}, "unique": true}])
                .map_err(|e| e.code),
            Err(11000)
        );
        s.delete(
            "db",
            "c",
            &[crate::engine::DeleteStatement {
                filter: doc! {"_id": 2},
                just_one: true,
            }],
            true,
        );
        s.create_indexes("db", "c", &[doc! {"key": {"a": 1}, "unique": true}])
            .expect("ok");
        let out = s.insert("db", "c", vec![doc! {"_id": 3, "a": 1}], true);
        assert_eq!(out.write_errors.len(), 1);
        assert_eq!(
            out.write_errors[0].error.message,
            "E11000 duplicate key error collection: db.c index: a_1 dup key: { a: 1 }"
        );
        assert_eq!(
            out.write_errors[0].error.details.as_deref(),
            Some(&doc! {"keyPattern": {"a": 1}, "keyValue": {"a": 1}})
        );
    }
}
