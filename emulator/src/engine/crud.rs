//! Insert, update, delete, find, findAndModify, count and distinct on a [`Store`], and the
//! parsers for the corresponding command documents.

use std::collections::BTreeSet;
use std::ops::Bound;

use bson::{Bson, Document};

use super::catalog::Collection;
use super::compare::OrdBson;
use super::expression::is_truthy;
use super::limits::check_depth;
use super::path::lookup_unwound;
use super::projection::Projection;
use super::query::match_document;
use super::sort::SortSpec;
use super::update::{apply_update, upsert_seed};
use super::value::bson_type_name;
use super::{
    DeleteOutcome, DeleteStatement, EngineError, EngineResult, FindAndModifyOutcome,
    FindAndModifySpec, FindSpec, InsertOutcome, Store, UpdateContext, UpdateModification,
    UpdateOutcome, UpdateStatement, WriteError,
};

fn wrong_type(field: &str, value: &Bson, expected: &str) -> EngineError {
    EngineError::type_mismatch(format!(
        "BSON field '{field}' is the wrong type '{}', expected type '{expected}'",
        bson_type_name(value)
    ))
}

fn opt_doc(cmd: &Document, key: &str, context: &str) -> EngineResult<Option<Document>> {
    match cmd.get(key) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Document(d)) => Ok(Some(d.clone())),
        Some(other) => Err(wrong_type(&format!("{context}.{key}"), other, "object")),
    }
}

fn opt_int(cmd: &Document, key: &str, context: &str) -> EngineResult<Option<i64>> {
    match cmd.get(key) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Int32(i)) => Ok(Some(i64::from(*i))),
        Some(Bson::Int64(i)) => Ok(Some(*i)),
        Some(Bson::Double(f)) if f.fract() == 0.0 && f.is_finite() => Ok(Some(*f as i64)),
        Some(other) => Err(wrong_type(&format!("{context}.{key}"), other, "long")),
    }
}

fn opt_bool(cmd: &Document, key: &str) -> bool {
    cmd.get(key).is_some_and(is_truthy)
}

fn array_filters(cmd: &Document, context: &str) -> EngineResult<Vec<Document>> {
    match cmd.get("arrayFilters") {
        None | Some(Bson::Null) => Ok(Vec::new()),
        Some(Bson::Array(items)) => items
            .iter()
            .map(|i| match i {
                Bson::Document(d) => Ok(d.clone()),
                other => Err(wrong_type(
                    &format!("{context}.arrayFilters"),
                    other,
                    "object",
                )),
            })
            .collect(),
        Some(other) => Err(wrong_type(
            &format!("{context}.arrayFilters"),
            other,
            "array",
        )),
    }
}

pub(crate) fn parse_find(cmd: &Document) -> EngineResult<FindSpec> {
    let skip = match opt_int(cmd, "skip", "find")? {
        Some(n) if n < 0 => {
            return Err(EngineError::location(
                51024,
                format!("BSON field 'skip' value must be >= 0, actual value '{n}'"),
            ));
        }
        Some(n) => n as u64,
        None => 0,
    };
    Ok(FindSpec {
        filter: opt_doc(cmd, "filter", "find")?.unwrap_or_default(),
        sort: opt_doc(cmd, "sort", "find")?,
        projection: opt_doc(cmd, "projection", "find")?,
        skip,
        limit: opt_int(cmd, "limit", "find")?,
    })
}

pub(crate) fn parse_modification(value: &Bson) -> EngineResult<UpdateModification> {
    match value {
        Bson::Document(d) => Ok(UpdateModification::Document(d.clone())),
        Bson::Array(stages) => stages
            .iter()
            .map(|s| match s {
                Bson::Document(d) => Ok(d.clone()),
                other => Err(EngineError::failed_to_parse(format!(
                    "Each element of the 'pipeline' array must be an object, found {}",
                    bson_type_name(other)
                ))),
            })
            .collect::<EngineResult<Vec<_>>>()
            .map(UpdateModification::Pipeline),
        other => Err(wrong_type("update.updates.u", other, "object")),
    }
}

fn required<'a>(stmt: &'a Document, key: &str, context: &str) -> EngineResult<&'a Bson> {
    stmt.get(key).ok_or_else(|| {
        EngineError::location(
            40414,
            format!("BSON field '{context}.{key}' is missing but a required field"),
        )
    })
}

pub(crate) fn parse_update_statement(stmt: &Document) -> EngineResult<UpdateStatement> {
    let filter = match required(stmt, "q", "update.updates")? {
        Bson::Document(d) => d.clone(),
        other => return Err(wrong_type("update.updates.q", other, "object")),
    };
    Ok(UpdateStatement {
        filter,
        update: parse_modification(required(stmt, "u", "update.updates")?)?,
        upsert: opt_bool(stmt, "upsert"),
        multi: opt_bool(stmt, "multi"),
        array_filters: array_filters(stmt, "update.updates")?,
        sort: opt_doc(stmt, "sort", "update.updates")?,
    })
}

pub(crate) fn parse_delete_statement(stmt: &Document) -> EngineResult<DeleteStatement> {
    let filter = match required(stmt, "q", "delete.deletes")? {
        Bson::Document(d) => d.clone(),
        other => return Err(wrong_type("delete.deletes.q", other, "object")),
    };
    let limit = required(stmt, "limit", "delete.deletes")?;
    let just_one = match limit {
        Bson::Int32(0) | Bson::Int64(0) => false,
        Bson::Int32(1) | Bson::Int64(1) => true,
        Bson::Double(f) if *f == 0.0 => false,
        Bson::Double(f) if *f == 1.0 => true,
        other => {
            return Err(EngineError::failed_to_parse(format!(
                "The limit field in delete objects must be 0 or 1. Got {other}"
            )))
        }
    };
    Ok(DeleteStatement { filter, just_one })
}

pub(crate) fn parse_find_and_modify(cmd: &Document) -> EngineResult<FindAndModifySpec> {
    let update = match cmd.get("update") {
        None | Some(Bson::Null) => None,
        Some(u) => Some(parse_modification(u)?),
    };
    Ok(FindAndModifySpec {
        query: opt_doc(cmd, "query", "findAndModify")?.unwrap_or_default(),
        sort: opt_doc(cmd, "sort", "findAndModify")?,
        remove: opt_bool(cmd, "remove"),
        update,
        return_new: opt_bool(cmd, "new"),
        upsert: opt_bool(cmd, "upsert"),
        fields: opt_doc(cmd, "fields", "findAndModify")?,
        array_filters: array_filters(cmd, "findAndModify")?,
    })
}

/// The filter's `_id` value when the `_id_` index can look it up or bound a range with it: the
/// values whose matching rule is plain comparison. `None` for the others (a document holds
/// operators, an array also matches elements, a regex matches strings, null matches a missing
/// `_id`). The index keys what this returns by [`super::id_key`], like every other `_id`.
fn indexable_id_value(v: &Bson) -> Option<&Bson> {
    match v {
        Bson::Document(_)
        | Bson::Array(_)
        | Bson::RegularExpression(_)
        | Bson::Null
        | Bson::Undefined
        | Bson::MinKey
        | Bson::MaxKey => None,
        v => Some(v),
    }
}

/// The positions, ascending, that the `_id_` index gives for a filter whose `_id` condition
/// is a plain value, a range (`$gt`, `$gte`, `$lt`, `$lte`, `$eq`) or an `$in` list of plain
/// values; `None` when the index cannot narrow the filter. A superset of the matches: the
/// caller still matches every candidate against the whole filter, whose other conditions are
/// ANDed.
fn id_index_candidates(collection: &Collection, filter: &Document) -> Option<Vec<usize>> {
    let cond = match filter.get("_id")? {
        Bson::Document(cond) => cond,
        // `{_id: v}`, the common point lookup.
        v => {
            return Some(
                collection
                    .position_of_id(indexable_id_value(v)?)
                    .into_iter()
                    .collect(),
            )
        }
    };
    let mut lower = Bound::Unbounded;
    let mut upper = Bound::Unbounded;
    let mut listed: Option<Vec<usize>> = None;
    for (op, v) in cond {
        match op.as_str() {
            "$in" => {
                let Bson::Array(values) = v else { return None };
                let mut positions = Vec::with_capacity(values.len());
                for value in values {
                    positions.extend(collection.position_of_id(indexable_id_value(value)?));
                }
                positions.sort_unstable();
                positions.dedup();
                listed = Some(positions);
            }
            "$eq" => {
                let key = indexable_id_value(v)?;
                (lower, upper) = (Bound::Included(key), Bound::Included(key));
            }
            "$gt" => lower = Bound::Excluded(indexable_id_value(v)?),
            "$gte" => lower = Bound::Included(indexable_id_value(v)?),
            "$lt" => upper = Bound::Excluded(indexable_id_value(v)?),
            "$lte" => upper = Bound::Included(indexable_id_value(v)?),
            _ => return None,
        }
    }
    if let Some(positions) = listed {
        return Some(positions);
    }
    if matches!((lower, upper), (Bound::Unbounded, Bound::Unbounded)) {
        return None;
    }
    Some(collection.positions_in_id_range(lower, upper))
}

/// Indexes of the documents matching `filter`, in natural order, or ordered by `sort`.
fn matching_indexes(
    collection: Option<&Collection>,
    filter: &Document,
    sort: Option<&Document>,
) -> EngineResult<Vec<usize>> {
    check_depth(filter)?;
    let docs = collection.map_or(&[][..], |c| c.docs.as_slice());
    // The `_id_` index has the simple collation: a query under another one scans.
    let candidates = collection
        .filter(|c| !super::collation::is_active() && !c.options.contains_key("timeseries"))
        .and_then(|c| id_index_candidates(c, filter));
    let mut hits = Vec::new();
    match &candidates {
        Some(positions) => {
            for &i in positions {
                if let Some(d) = docs.get(i) {
                    if match_document(filter, d)? {
                        hits.push(i);
                    }
                }
            }
        }
        None => {
            for (i, d) in docs.iter().enumerate() {
                if match_document(filter, d)? {
                    hits.push(i);
                }
            }
        }
    }
    // Validate the filter even when nothing was there to evaluate it against.
    if docs.is_empty() || candidates.is_some_and(|c| c.is_empty()) {
        match_document(filter, &Document::new())?;
    }
    if let Some(spec) = sort {
        let spec = SortSpec::parse(spec)?;
        if !spec.is_empty() {
            let mut pairs: Vec<(usize, &Document)> = hits
                .iter()
                .filter_map(|&i| docs.get(i).map(|d| (i, d)))
                .collect();
            spec.sort_by_doc(&mut pairs, |p| p.1);
            hits = pairs.into_iter().map(|p| p.0).collect();
        }
    }
    Ok(hits)
}

fn limit_of(limit: Option<i64>) -> Option<usize> {
    match limit {
        None | Some(0) => None,
        Some(n) => Some(usize::try_from(n.unsigned_abs()).unwrap_or(usize::MAX)),
    }
}

/// Builds and inserts the document of an upsert; returns it.
fn upsert_document(
    filter: &Document,
    update: &UpdateModification,
    array_filters: &[Document],
) -> EngineResult<Document> {
    let mut doc = upsert_seed(filter)?;
    let ctx = UpdateContext {
        is_insert: true,
        array_filters,
        query: Some(filter),
    };
    apply_update(&mut doc, update, &ctx)?;
    Collection::prepare_for_insert(doc)
}

/// The distinct values of `key` (dotted, arrays unwound one level) in first-seen order;
/// values equal under the active collation (and numbers of equal value) count once.
fn distinct_values<'a>(docs: impl Iterator<Item = &'a Document>, key: &str) -> Vec<Bson> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for d in docs {
        for v in lookup_unwound(d, key) {
            if seen.insert(OrdBson(v.clone())) {
                out.push(v.clone());
            }
        }
    }
    out
}

impl Store {
    /// `insert`: adds `docs` to `db.coll` (created implicitly), generating an ObjectId `_id`
    /// (placed first) when missing. Duplicate `_id`s (and unique-index violations) are 11000
    /// DuplicateKey write errors; ordered inserts stop at the first failure.
    pub fn insert(
        &mut self,
        db: &str,
        coll: &str,
        docs: Vec<Document>,
        ordered: bool,
    ) -> InsertOutcome {
        let mut outcome = InsertOutcome::default();
        let ns = format!("{db}.{coll}");
        let collection = match self.collection_or_create(db, coll) {
            Ok((c, _)) => c,
            Err(error) => {
                outcome.write_errors.push(WriteError { index: 0, error });
                return outcome;
            }
        };
        for (index, doc) in docs.into_iter().enumerate() {
            let result = Collection::prepare_for_insert(doc)
                .and_then(|d| collection.insert_prepared(&ns, d));
            match result {
                Ok(id) => {
                    outcome.n += 1;
                    outcome.inserted_ids.push((index, id));
                }
                Err(error) => {
                    outcome.write_errors.push(WriteError { index, error });
                    if ordered {
                        break;
                    }
                }
            }
        }
        outcome
    }

    /// `update`: runs the statements in order; ordered updates stop at the first failure.
    /// Without `multi`, the first match in natural order (or by `sort`) is updated. Upserts
    /// insert a document built from the filter's equality conditions plus the update.
    pub fn update(
        &mut self,
        db: &str,
        coll: &str,
        statements: &[UpdateStatement],
        ordered: bool,
    ) -> UpdateOutcome {
        let mut outcome = UpdateOutcome::default();
        for (index, stmt) in statements.iter().enumerate() {
            match self.update_one_statement(db, coll, stmt) {
                Ok((n, modified, upserted)) => {
                    outcome.n += n;
                    outcome.n_modified += modified;
                    if let Some(id) = upserted {
                        outcome.upserted.push((index, id));
                    }
                }
                Err(error) => {
                    outcome.write_errors.push(WriteError { index, error });
                    if ordered {
                        break;
                    }
                }
            }
        }
        outcome
    }

    fn update_one_statement(
        &mut self,
        db: &str,
        coll: &str,
        stmt: &UpdateStatement,
    ) -> EngineResult<(u64, u64, Option<Bson>)> {
        if stmt.multi {
            if let UpdateModification::Document(d) = &stmt.update {
                if !d.keys().next().is_some_and(|k| k.starts_with('$')) {
                    return Err(EngineError::failed_to_parse(
                        "multi update is not supported for replacement-style update",
                    ));
                }
            }
        }
        let ns = format!("{db}.{coll}");
        let mut hits = matching_indexes(
            self.collection(db, coll),
            &stmt.filter,
            if stmt.multi { None } else { stmt.sort.as_ref() },
        )?;
        if !stmt.multi {
            hits.truncate(1);
        }
        if hits.is_empty() {
            if !stmt.upsert {
                return Ok((0, 0, None));
            }
            let doc = upsert_document(&stmt.filter, &stmt.update, &stmt.array_filters)?;
            let (collection, _) = self.collection_or_create(db, coll)?;
            let id = collection.insert_prepared(&ns, doc)?;
            return Ok((1, 0, Some(id)));
        }
        let Some(collection) = self.collection_mut(db, coll) else {
            return Ok((0, 0, None));
        };
        let ctx = UpdateContext {
            is_insert: false,
            array_filters: &stmt.array_filters,
            query: Some(&stmt.filter),
        };
        let mut modified = 0;
        for &idx in &hits {
            let Some(mut doc) = collection.docs.get(idx).cloned() else {
                continue;
            };
            if apply_update(&mut doc, &stmt.update, &ctx)? {
                collection.replace_at(&ns, idx, doc)?;
                modified += 1;
            }
        }
        Ok((hits.len() as u64, modified, None))
    }

    /// `delete`: runs the statements in order; ordered deletes stop at the first failure.
    pub fn delete(
        &mut self,
        db: &str,
        coll: &str,
        statements: &[DeleteStatement],
        ordered: bool,
    ) -> DeleteOutcome {
        let mut outcome = DeleteOutcome::default();
        for (index, stmt) in statements.iter().enumerate() {
            match matching_indexes(self.collection(db, coll), &stmt.filter, None) {
                Ok(mut hits) => {
                    if stmt.just_one {
                        hits.truncate(1);
                    }
                    if let Some(c) = self.collection_mut(db, coll) {
                        c.remove_indexes(&hits);
                    }
                    outcome.n += hits.len() as u64;
                }
                Err(error) => {
                    outcome.write_errors.push(WriteError { index, error });
                    if ordered {
                        break;
                    }
                }
            }
        }
        outcome
    }

    /// `find`: matching documents, sorted, skipped, limited and projected. A missing collection
    /// yields no documents.
    pub fn find(&self, db: &str, coll: &str, spec: &FindSpec) -> EngineResult<Vec<Document>> {
        let projection = match &spec.projection {
            Some(p) if !p.is_empty() => {
                check_depth(p)?;
                Some(Projection::parse(p, true)?)
            }
            _ => None,
        };
        let docs = self.documents(db, coll);
        let hits = matching_indexes(self.collection(db, coll), &spec.filter, spec.sort.as_ref())?;
        let skip = usize::try_from(spec.skip).unwrap_or(usize::MAX);
        let limit = limit_of(spec.limit).unwrap_or(usize::MAX);
        let mut out = Vec::new();
        for idx in hits.into_iter().skip(skip).take(limit) {
            let Some(d) = docs.get(idx) else { continue };
            out.push(match &projection {
                Some(p) => p.apply_with_query(d, Some(&spec.filter))?,
                None => d.clone(),
            });
        }
        Ok(out)
    }

    /// `findAndModify`: picks the first match (by `sort`), removes or updates it (or upserts),
    /// and returns the document before or after (`return_new`), projected by `fields`.
    pub fn find_and_modify(
        &mut self,
        db: &str,
        coll: &str,
        spec: &FindAndModifySpec,
    ) -> EngineResult<FindAndModifyOutcome> {
        match (&spec.update, spec.remove) {
            (Some(_), true) => return Err(EngineError::failed_to_parse("Cannot specify both an update and remove=true")),
            (None, false) => return Err(EngineError::failed_to_parse("Either an update or remove=true must be specified")),
            (None, true) if spec.return_new => {
                return Err(EngineError::failed_to_parse(
                    "Cannot specify both new=true and remove=true; 'remove' always returns the deleted document",
                ))
            }
            (None, true) if spec.upsert => {
                return Err(EngineError::failed_to_parse("Cannot specify both upsert=true and remove=true"))
            }
            _ => {}
        }
        let projection = match &spec.fields {
            Some(p) if !p.is_empty() => {
                check_depth(p)?;
                Some(Projection::parse(p, true)?)
            }
            _ => None,
        };
        let project = |d: Document| -> EngineResult<Document> {
            match &projection {
                Some(p) => p.apply_with_query(&d, Some(&spec.query)),
                None => Ok(d),
            }
        };
        let ns = format!("{db}.{coll}");
        let hit = matching_indexes(self.collection(db, coll), &spec.query, spec.sort.as_ref())?
            .into_iter()
            .next();
        let Some(update) = &spec.update else {
            // remove
            let Some(idx) = hit else {
                return Ok(FindAndModifyOutcome::default());
            };
            let Some(c) = self.collection_mut(db, coll) else {
                return Ok(FindAndModifyOutcome::default());
            };
            let old = c.docs.get(idx).cloned();
            c.remove_indexes(&[idx]);
            return Ok(FindAndModifyOutcome {
                value: old.map(project).transpose()?,
                n: 1,
                ..Default::default()
            });
        };
        match hit {
            Some(idx) => {
                let Some(c) = self.collection_mut(db, coll) else {
                    return Ok(FindAndModifyOutcome::default());
                };
                let Some(before) = c.docs.get(idx).cloned() else {
                    return Ok(FindAndModifyOutcome::default());
                };
                let mut after = before.clone();
                let ctx = UpdateContext {
                    is_insert: false,
                    array_filters: &spec.array_filters,
                    query: Some(&spec.query),
                };
                if apply_update(&mut after, update, &ctx)? {
                    c.replace_at(&ns, idx, after.clone())?;
                }
                let value = if spec.return_new { after } else { before };
                Ok(FindAndModifyOutcome {
                    value: Some(project(value)?),
                    n: 1,
                    updated_existing: true,
                    upserted: None,
                })
            }
            None if spec.upsert => {
                let doc = upsert_document(&spec.query, update, &spec.array_filters)?;
                let (c, _) = self.collection_or_create(db, coll)?;
                let id = c.insert_prepared(&ns, doc.clone())?;
                let value = if spec.return_new {
                    Some(project(doc)?)
                } else {
                    None
                };
                Ok(FindAndModifyOutcome {
                    value,
                    n: 1,
                    updated_existing: false,
                    upserted: Some(id),
                })
            }
            None => Ok(FindAndModifyOutcome::default()),
        }
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
        let hits = matching_indexes(self.collection(db, coll), filter, None)?.len() as u64;
        let after_skip = hits.saturating_sub(skip);
        Ok(match limit_of(Some(limit)) {
            Some(l) => after_skip.min(l as u64),
            None => after_skip,
        })
    }

    /// `distinct`: distinct values of `key` (dotted, arrays unwound one level) among matching
    /// documents, in first-seen order; numbers of equal value count once.
    pub fn distinct(
        &self,
        db: &str,
        coll: &str,
        key: &str,
        filter: &Document,
    ) -> EngineResult<Vec<Bson>> {
        if key.is_empty() || key.split('.').any(str::is_empty) {
            return Err(EngineError::bad_value(format!(
                "Invalid distinct key: '{key}'"
            )));
        }
        let docs = self.documents(db, coll);
        let hits = matching_indexes(self.collection(db, coll), filter, None)?;
        Ok(distinct_values(
            hits.into_iter().filter_map(|idx| docs.get(idx)),
            key,
        ))
    }

    /// `distinct` over documents a view produced (already filtered): the values of `key`.
    pub fn distinct_in(docs: &[Document], key: &str) -> EngineResult<Vec<Bson>> {
        if key.is_empty() || key.split('.').any(str::is_empty) {
            return Err(EngineError::bad_value(format!(
                "Invalid distinct key: '{key}'"
            )));
        }
        Ok(distinct_values(docs.iter(), key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn store_with(docs: Vec<Document>) -> Store {
        let mut s = Store::new();
        let out = s.insert("db", "c", docs, true);
        assert!(out.write_errors.is_empty());
        s
    }

    fn upd(filter: Document, u: Document, upsert: bool, multi: bool) -> UpdateStatement {
        UpdateStatement {
            filter,
            update: UpdateModification::Document(u),
            upsert,
            multi,
            array_filters: vec![],
            sort: None,
        }
    }

    #[test]
    fn a_collation_applies_to_matching_sorting_and_distinct_but_not_to_the_id_index() {
        let mut s = store_with(vec![
            doc! {"_id": "a", "x": "ping"},
            doc! {"_id": "B", "x": "PING"},
            doc! {"_id": "c", "x": "pong"},
        ]);
        let c = super::super::Collation::parse(&doc! {"locale": "en_US", "strength": 2})
            .unwrap()
            .unwrap();
        let spec = FindSpec {
            filter: doc! {"x": "Ping"},
            ..Default::default()
        };
        assert!(s.find("db", "c", &spec).unwrap().is_empty());
        let found = super::super::with_collation(Some(&c), || s.find("db", "c", &spec)).unwrap();
        assert_eq!(found.len(), 2);
        // Case-insensitive `_id` equality scans instead of using the binary `_id_` index.
        let by_id = FindSpec {
            filter: doc! {"_id": "A"},
            ..Default::default()
        };
        let found = super::super::with_collation(Some(&c), || s.find("db", "c", &by_id)).unwrap();
        assert_eq!(found.len(), 1);
        let sorted = FindSpec {
            sort: Some(doc! {"_id": 1}),
            ..Default::default()
        };
        let ids = |docs: Vec<Document>| -> Vec<String> {
            docs.iter()
                .map(|d| d.get_str("_id").unwrap_or("").to_owned())
                .collect()
        };
        assert_eq!(ids(s.find("db", "c", &sorted).unwrap()), ["B", "a", "c"]);
        let collated = super::super::with_collation(Some(&c), || s.find("db", "c", &sorted));
        assert_eq!(ids(collated.unwrap()), ["a", "B", "c"]);
        let values =
            super::super::with_collation(Some(&c), || s.distinct("db", "c", "x", &doc! {}));
        assert_eq!(
            values.unwrap(),
            vec![Bson::from("ping"), Bson::from("pong")]
        );
        // The `_id_` index keeps the simple collation: "A" is a new `_id` beside "a".
        let out = super::super::with_collation(Some(&c), || {
            s.insert("db", "c", vec![doc! {"_id": "A"}], true)
        });
        assert!(out.write_errors.is_empty());
        assert_eq!(s.documents("db", "c").len(), 4);
    }

    #[test]
    fn insert_generates_id_first_and_reports_duplicates() {
        let mut s = Store::new();
        let out = s.insert(
            "db",
            "c",
            vec![doc! {"a": 1, "_id": 5}, doc! {"b": 2}],
            true,
        );
        assert_eq!(out.n, 2);
        let docs = s.documents("db", "c");
        assert_eq!(docs[0], doc! {"_id": 5, "a": 1});
        assert_eq!(docs[0].keys().next().map(String::as_str), Some("_id"));
        assert!(matches!(docs[1].get("_id"), Some(Bson::ObjectId(_))));
        let out = s.insert("db", "c", vec![doc! {"_id": 5.0}], true);
        assert_eq!(out.n, 0);
        let e = &out.write_errors[0];
        assert_eq!(
            (e.index, e.error.code, e.error.code_name),
            (0, 11000, "DuplicateKey")
        );
        assert_eq!(
            e.error.message,
            "E11000 duplicate key error collection: db.c index: _id_ dup key: { _id: 5.0 }"
        );
        assert_eq!(
            e.error.details.as_deref(),
            Some(&doc! {"keyPattern": {"_id": 1}, "keyValue": {"_id": 5.0}})
        );
    }

    #[test]
    fn ordered_insert_stops_unordered_continues() {
        let mut s = store_with(vec![doc! {"_id": 1}]);
        let out = s.insert(
            "db",
            "c",
            vec![doc! {"_id": 2}, doc! {"_id": 1}, doc! {"_id": 3}],
            true,
        );
        assert_eq!(
            (out.n, out.write_errors.len(), out.write_errors[0].index),
            (1, 1, 1)
        );
        let out = s.insert(
            "db",
            "c",
            vec![doc! {"_id": 1}, doc! {"_id": 4}, doc! {"_id": 2}],
            false,
        );
        assert_eq!(out.n, 1);
        assert_eq!(
            out.write_errors.iter().map(|e| e.index).collect::<Vec<_>>(),
            vec![0, 2]
        );
        assert_eq!(s.documents("db", "c").len(), 3);
    }

    #[test]
    fn insert_rejects_array_id() {
        let mut s = Store::new();
        let out = s.insert("db", "c", vec![doc! {"_id": [1]}], true);
        assert_eq!(out.write_errors[0].error.code, 53);
    }

    #[test]
    fn find_sorts_skips_limits_and_projects() {
        let s = store_with(
            (1..=5)
                .map(|i| doc! {"_id": i, "v": 10 - i, "x": "y"})
                .collect(),
        );
        let spec = FindSpec {
            filter: doc! {"v": {"$gte": 6}},
            sort: Some(doc! {"v": 1}),
            projection: Some(doc! {"x": 0}),
            skip: 1,
            limit: Some(-2),
        };
        assert_eq!(
            s.find("db", "c", &spec).expect("ok"),
            vec![doc! {"_id": 3, "v": 7}, doc! {"_id": 2, "v": 8}]
        );
        assert!(s
            .find("db", "missing", &FindSpec::default())
            .expect("ok")
            .is_empty());
        let bad = FindSpec {
            filter: doc! {"a": {"$bogus": 1}},
            ..Default::default()
        };
        assert_eq!(s.find("db", "missing", &bad).map_err(|e| e.code), Err(2));
    }

    #[test]
    fn update_counts_matched_and_modified() {
        let mut s = store_with(vec![
            doc! {"_id": 1, "a": 1},
            doc! {"_id": 2, "a": 2},
            doc! {"_id": 3, "a": 1},
        ]);
        let out = s.update(
            "db",
            "c",
            &[upd(doc! {}, doc! {"$set": {"a": 1}}, false, true)],
            true,
        );
        assert_eq!((out.n, out.n_modified), (3, 1));
        let out = s.update(
            "db",
            "c",
            &[upd(doc! {"a": 1}, doc! {"$inc": {"a": 1}}, false, false)],
            true,
        );
        assert_eq!((out.n, out.n_modified), (1, 1));
        assert_eq!(s.documents("db", "c")[0], doc! {"_id": 1, "a": 2});
    }

    #[test]
    fn upsert_builds_document_from_filter_and_set_on_insert() {
        let mut s = Store::new();
        let u = upd(
            doc! {"_id": 7, "k": "x"},
            doc! {"$set": {"v": 1}, "$setOnInsert": {"created": true}},
            true,
            false,
        );
        let out = s.update("db", "c", std::slice::from_ref(&u), true);
        assert_eq!(
            (out.n, out.n_modified, out.upserted.clone()),
            (1, 0, vec![(0, Bson::Int32(7))])
        );
        assert_eq!(
            s.documents("db", "c"),
            &[doc! {"_id": 7, "k": "x", "created": true, "v": 1}]
        );
        let out = s.update("db", "c", &[u], true);
        assert_eq!((out.n, out.n_modified, out.upserted.len()), (1, 0, 0));
        let out = s.update(
            "db",
            "c",
            &[upd(doc! {"q": 1}, doc! {"r": 2}, true, false)],
            true,
        );
        let doc = &s.documents("db", "c")[1];
        assert_eq!(doc.get("_id"), out.upserted.first().map(|(_, id)| id));
        assert_eq!(doc.get("r"), Some(&Bson::Int32(2)));
        assert_eq!(doc.get("q"), None);
    }

    #[test]
    fn update_errors_keep_statement_index() {
        let mut s = store_with(vec![doc! {"_id": 1, "a": "s"}]);
        let stmts = [
            upd(doc! {}, doc! {"$set": {"b": 1}}, false, false),
            upd(doc! {}, doc! {"$inc": {"a": 1}}, false, false),
            upd(doc! {}, doc! {"$set": {"c": 1}}, false, false),
        ];
        let out = s.update("db", "c", &stmts, true);
        assert_eq!(out.write_errors.len(), 1);
        assert_eq!(
            (out.write_errors[0].index, out.write_errors[0].error.code),
            (1, 14)
        );
        assert_eq!(out.n, 1);
        let out = s.update("db", "c", &stmts, false);
        assert_eq!(out.n, 2);
        assert_eq!(
            s.documents("db", "c")[0],
            doc! {"_id": 1, "a": "s", "b": 1, "c": 1}
        );
        let out = s.update("db", "c", &[upd(doc! {}, doc! {"x": 1}, false, true)], true);
        assert_eq!(out.write_errors[0].error.code, 9);
    }

    #[test]
    fn delete_one_and_many() {
        let mut s = store_with(
            (1..=4)
                .map(|i| doc! {"_id": i, "even": i % 2 == 0})
                .collect(),
        );
        let out = s.delete(
            "db",
            "c",
            &[DeleteStatement {
                filter: doc! {"even": true},
                just_one: true,
            }],
            true,
        );
        assert_eq!(out.n, 1);
        let out = s.delete(
            "db",
            "c",
            &[DeleteStatement {
                filter: doc! {"even": false},
                just_one: false,
            }],
            true,
        );
        assert_eq!(out.n, 2);
        assert_eq!(s.documents("db", "c"), &[doc! {"_id": 4, "even": true}]);
        // The _id of a deleted document can be reused.
        assert_eq!(s.insert("db", "c", vec![doc! {"_id": 1}], true).n, 1);
    }

    #[test]
    fn id_lookups_follow_deletes_and_compare_numbers_by_value() {
        let mut s = store_with((1..=6).map(|i| doc! {"_id": i, "v": i * 10}).collect());
        let by_id = |s: &Store, id: Bson| {
            let spec = FindSpec {
                filter: doc! {"_id": id},
                ..Default::default()
            };
            s.find("db", "c", &spec).expect("ok")
        };
        // Deleting from the middle shifts the later documents; the index must follow.
        let out = s.delete(
            "db",
            "c",
            &[DeleteStatement {
                filter: doc! {"_id": {"$in": [2, 4]}},
                just_one: false,
            }],
            true,
        );
        assert_eq!(out.n, 2);
        assert_eq!(by_id(&s, Bson::Int32(5)), vec![doc! {"_id": 5, "v": 50}]);
        assert_eq!(by_id(&s, Bson::Double(6.0)), vec![doc! {"_id": 6, "v": 60}]);
        assert_eq!(by_id(&s, Bson::Int64(1)), vec![doc! {"_id": 1, "v": 10}]);
        assert!(by_id(&s, Bson::Int32(4)).is_empty());
        assert!(by_id(&s, Bson::String("5".into())).is_empty());
        assert_eq!(s.insert("db", "c", vec![doc! {"_id": 4}], true).n, 1);
        assert_eq!(by_id(&s, Bson::Int32(4)), vec![doc! {"_id": 4}]);
    }

    #[test]
    fn id_index_narrowed_filters_match_what_a_scan_matches() {
        let mut docs: Vec<Document> = (0..40)
            .map(|i| match i % 4 {
                0 => doc! {"_id": i, "v": i},
                1 => doc! {"_id": f64::from(i) + 0.5, "v": i},
                2 => doc! {"_id": format!("s{i:02}"), "v": i},
                _ => doc! {"_id": {"k": i}, "v": i},
            })
            .collect();
        // Natural order differs from `_id` order.
        docs.reverse();
        let mut s = store_with(docs);
        s.delete(
            "db",
            "c",
            &[DeleteStatement {
                filter: doc! {"v": {"$in": [4, 5, 6, 7]}},
                just_one: false,
            }],
            true,
        );
        let filters = vec![
            doc! {"_id": {"$gte": 8, "$lt": 20}},
            doc! {"_id": {"$gt": 8.5}},
            doc! {"_id": {"$lte": 12}},
            doc! {"_id": {"$gte": "s10", "$lte": "s30"}},
            doc! {"_id": {"$gt": 30, "$lt": 10}},
            doc! {"_id": {"$gt": 8, "$lt": 8}},
            doc! {"_id": {"$gte": 8, "$lte": 8}},
            doc! {"_id": {"$eq": 16.0}},
            doc! {"_id": {"$in": [16, "s18", 9.5, 4, {"k": 3}]}},
            doc! {"_id": {"$in": []}},
            doc! {"_id": {"$gte": 0}, "v": {"$gt": 20}},
            doc! {"_id": {"$gte": 0, "$ne": 12}},
            doc! {"_id": {"$lt": {"k": 20}}},
        ];
        let all = s.documents("db", "c").to_vec();
        for filter in filters {
            let expected: Vec<Document> = all
                .iter()
                .filter(|d| match_document(&filter, d).expect("valid filter"))
                .cloned()
                .collect();
            let spec = FindSpec {
                filter: filter.clone(),
                ..Default::default()
            };
            assert_eq!(s.find("db", "c", &spec).expect("ok"), expected, "{filter}");
        }
        // A malformed filter is still an error when the index finds no candidate.
        let bad = FindSpec {
            filter: doc! {"x": {"$bogus": 1}, "_id": {"$gt": 30, "$lt": 10}},
            ..Default::default()
        };
        assert_eq!(s.find("db", "c", &bad).map_err(|e| e.code), Err(2));
    }

    #[test]
    fn find_and_modify_update_remove_upsert() {
        let mut s = store_with(vec![doc! {"_id": 1, "a": 5}, doc! {"_id": 2, "a": 3}]);
        let spec = FindAndModifySpec {
            sort: Some(doc! {"a": 1}),
            update: Some(UpdateModification::Document(doc! {"$inc": {"a": 1}})),
            return_new: true,
            fields: Some(doc! {"_id": 0}),
            ..Default::default()
        };
        let out = s.find_and_modify("db", "c", &spec).expect("ok");
        assert_eq!(out.value, Some(doc! {"a": 4}));
        assert!(out.updated_existing);
        assert_eq!(
            out.last_error_object(true),
            doc! {"n": 1, "updatedExisting": true}
        );
        let remove = FindAndModifySpec {
            query: doc! {"_id": 1},
            remove: true,
            ..Default::default()
        };
        let out = s.find_and_modify("db", "c", &remove).expect("ok");
        assert_eq!(out.value, Some(doc! {"_id": 1, "a": 5}));
        let upsert = FindAndModifySpec {
            query: doc! {"_id": 9},
            update: Some(UpdateModification::Document(doc! {"$set": {"z": 1}})),
            upsert: true,
            ..Default::default()
        };
        let out = s.find_and_modify("db", "c", &upsert).expect("ok");
        assert_eq!(
            (
                out.value.clone(),
                out.n,
                out.updated_existing,
                out.upserted.clone()
            ),
            (None, 1, false, Some(Bson::Int32(9)))
        );
        assert_eq!(
            out.last_error_object(true),
            doc! {"n": 1, "updatedExisting": false, "upserted": 9}
        );
        let none = FindAndModifySpec {
            query: doc! {"_id": 100},
            remove: true,
            ..Default::default()
        };
        assert_eq!(
            s.find_and_modify("db", "c", &none).expect("ok"),
            FindAndModifyOutcome::default()
        );
        let both = FindAndModifySpec {
            remove: true,
            update: spec.update.clone(),
            ..Default::default()
        };
        assert_eq!(
            s.find_and_modify("db", "c", &both).map_err(|e| e.code),
            Err(9)
        );
    }

    #[test]
    fn count_and_distinct() {
        let s = store_with(vec![
            doc! {"_id": 1, "a": [1, 2], "b": {"c": "x"}},
            doc! {"_id": 2, "a": 2.0, "b": {"c": "y"}},
            doc! {"_id": 3, "a": [3, [4]], "b": [{"c": "x"}, {"c": "z"}]},
        ]);
        assert_eq!(s.count("db", "c", &doc! {}, 1, 0), Ok(2));
        assert_eq!(s.count("db", "c", &doc! {}, 0, -1), Ok(1));
        assert_eq!(s.count("db", "c", &doc! {"a": 2}, 0, 0), Ok(2));
        assert_eq!(s.count("db", "nope", &doc! {}, 0, 0), Ok(0));
        assert_eq!(
            s.distinct("db", "c", "a", &doc! {}).expect("ok"),
            vec![
                Bson::Int32(1),
                Bson::Int32(2),
                Bson::Int32(3),
                Bson::Array(vec![4.into()])
            ]
        );
        assert_eq!(
            s.distinct("db", "c", "b.c", &doc! {"_id": {"$ne": 2}})
                .expect("ok"),
            vec![Bson::String("x".into()), Bson::String("z".into())]
        );
    }

    #[test]
    fn command_parsers_read_mongod_fields() {
        let f = FindSpec::from_command(
            &doc! {"find": "c", "filter": {"a": 1}, "sort": {"a": -1}, "skip": 2, "limit": 3i64},
        )
        .expect("ok");
        assert_eq!(
            (f.skip, f.limit, f.sort),
            (2, Some(3), Some(doc! {"a": -1}))
        );
        assert_eq!(
            FindSpec::from_command(&doc! {"filter": 1}).map_err(|e| e.code),
            Err(14)
        );
        let u = UpdateStatement::from_command(
            &doc! {"q": {}, "u": [{"$set": {"a": 1}}], "multi": true},
        )
        .expect("ok");
        assert!(u.multi && !u.upsert && matches!(u.update, UpdateModification::Pipeline(_)));
        assert_eq!(
            UpdateStatement::from_command(&doc! {"u": {}}).map_err(|e| e.code),
            Err(40414)
        );
        let d = DeleteStatement::from_command(&doc! {"q": {"a": 1}, "limit": 1}).expect("ok");
        assert!(d.just_one);
        assert_eq!(
            DeleteStatement::from_command(&doc! {"q": {}, "limit": 2}).map_err(|e| e.code),
            Err(9)
        );
        let fam = FindAndModifySpec::from_command(
            &doc! {"findAndModify": "c", "query": {"a": 1}, "remove": true},
        )
        .expect("ok");
        assert!(fam.remove && fam.update.is_none());
    }
}
