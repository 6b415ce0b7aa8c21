//! Aggregation pipelines: `$match $project $addFields $set $unset $group $sort $skip $limit
//! $count $unwind $replaceRoot $replaceWith $sortByCount $bucket $lookup $facet $sample
//! $documents $out $merge`.

use std::collections::BTreeMap;

use bson::{Bson, Document};
use rand::seq::SliceRandom;

use super::catalog::{duplicate_key_error, Collection};
use super::compare::{bson_eq, compare_bson, type_rank, OrdBson};
use super::expression::{bind_variables, eval_opt, evaluate_variables, fold_values};
use super::limits::{bson_size, check_depth, check_value_depth, MAX_BSON_SIZE, MAX_DEPTH};
use super::path::{get_exact, remove_dotted, set_dotted};
use super::projection::{add_fields, replace_root, Projection};
use super::query::match_document;
use super::sort::SortSpec;
use super::update::unset_fields;
use super::{EngineError, EngineResult, Store};

impl Store {
    /// `aggregate` on `db.coll`: runs `pipeline` over the collection's documents (none when the
    /// collection is missing). `$out` and `$merge` write into the store and yield no documents.
    /// Unknown stages fail with 40324.
    pub fn aggregate(
        &mut self,
        db: &str,
        coll: &str,
        pipeline: &[Document],
    ) -> EngineResult<Vec<Document>> {
        // A leading `$match` filters while copying, so large collections are not cloned whole.
        let leading_match = pipeline
            .first()
            .filter(|s| s.len() == 1)
            .and_then(|s| s.get("$match"));
        if let Some(Bson::Document(filter)) = leading_match {
            check_depth(filter)?;
            let mut input = Vec::new();
            for d in self.documents(db, coll) {
                if match_document(filter, d)? {
                    input.push(d.clone());
                }
            }
            if input.is_empty() {
                match_document(filter, &Document::new())?;
            }
            return self.run_pipeline(db, input, pipeline.get(1..).unwrap_or(&[]));
        }
        let input = self.documents(db, coll).to_vec();
        self.run_pipeline(db, input, pipeline)
    }

    /// Runs `stages` over `input`: documents the server produced (e.g. for `$changeStream` or
    /// `$listLocalSessions`, whose stage it strips before calling), or nothing when the pipeline
    /// starts with `$documents`. `db` is the database for `$lookup`, `$out` and `$merge`.
    pub fn run_pipeline(
        &mut self,
        db: &str,
        input: Vec<Document>,
        stages: &[Document],
    ) -> EngineResult<Vec<Document>> {
        for stage in stages {
            check_depth(stage)?;
        }
        let mut docs = input;
        for (i, stage) in stages.iter().enumerate() {
            let (name, arg) = stage_parts(stage)?;
            let last = i + 1 == stages.len();
            docs = match name {
                "$out" | "$merge" if !last => {
                    return Err(EngineError::location(
                        40601,
                        format!("{name} can only be the final stage in the pipeline"),
                    ));
                }
                "$out" => {
                    self.out(db, arg, docs)?;
                    Vec::new()
                }
                "$merge" => {
                    self.merge(db, arg, docs)?;
                    Vec::new()
                }
                "$documents" if i != 0 => {
                    return Err(EngineError::location(
                        40602,
                        "$documents is only valid as the first stage in a pipeline",
                    ));
                }
                "$documents" => documents_stage(arg)?,
                "$lookup" => self.lookup(db, arg, docs)?,
                "$facet" => {
                    let Bson::Document(facets) = arg else {
                        return Err(EngineError::location(
                            15947,
                            "a facet's fields must be specified in an object",
                        ));
                    };
                    let mut out = Document::new();
                    for (field, pipeline) in facets {
                        let sub = pipeline_of(pipeline)?;
                        if sub.iter().any(|s| {
                            s.keys()
                                .any(|k| matches!(k.as_str(), "$out" | "$merge" | "$facet"))
                        }) {
                            return Err(EngineError::location(
                                40600,
                                "$out, $merge and $facet are not allowed inside a $facet stage",
                            ));
                        }
                        let result = self.run_pipeline(db, docs.clone(), &sub)?;
                        out.insert(
                            field.clone(),
                            result.into_iter().map(Bson::Document).collect::<Vec<_>>(),
                        );
                    }
                    vec![out]
                }
                _ => apply_stage(name, arg, docs)?,
            };
        }
        // mongod never returns a pipeline result larger than a BSON document may be.
        for d in &docs {
            let size = bson_size(d);
            if size > MAX_BSON_SIZE {
                return Err(EngineError::bson_object_too_large(format!(
                    "BSONObj size: {size} is invalid. Size must be between 0 and {MAX_BSON_SIZE}(16MB)"
                )));
            }
        }
        Ok(docs)
    }

    fn lookup(&mut self, db: &str, arg: &Bson, docs: Vec<Document>) -> EngineResult<Vec<Document>> {
        let Bson::Document(spec) = arg else {
            return Err(EngineError::location(
                40319,
                "the $lookup stage specification must be an object",
            ));
        };
        let field = |k: &str| -> EngineResult<Option<String>> {
            match spec.get(k) {
                None => Ok(None),
                Some(Bson::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(EngineError::location(
                    4570,
                    format!("$lookup argument '{k}' must be a string"),
                )),
            }
        };
        let from = field("from")?
            .ok_or_else(|| EngineError::location(40320, "$lookup requires a 'from' field"))?;
        let as_field = field("as")?
            .ok_or_else(|| EngineError::location(40321, "must specify 'as' field for a $lookup"))?;
        check_field_path(&as_field)?;
        let local = field("localField")?;
        let foreign = field("foreignField")?;
        let let_vars = match spec.get("let") {
            None => None,
            Some(Bson::Document(v)) => Some(v.clone()),
            Some(_) => {
                return Err(EngineError::failed_to_parse(
                    "$lookup argument 'let' must be an object",
                ))
            }
        };
        let sub = spec.get("pipeline").map(pipeline_of).transpose()?;
        if let_vars.is_some() && sub.is_none() {
            return Err(EngineError::failed_to_parse(
                "$lookup with 'let' requires a 'pipeline'",
            ));
        }
        let collection_docs = self.documents(db, &from).to_vec();
        // Without `let` the sub-pipeline does not depend on the local document: run it once.
        let shared = match (&sub, &let_vars) {
            (Some(p), None) => self.run_pipeline(db, collection_docs.clone(), p)?,
            _ => collection_docs.clone(),
        };
        let mut out = Vec::with_capacity(docs.len());
        for mut d in docs {
            let per_doc;
            let foreign_docs = match (&sub, &let_vars) {
                (Some(p), Some(vars)) => {
                    let bound = evaluate_variables(vars, &d)?;
                    per_doc = bind_variables(bound, || {
                        self.run_pipeline(db, collection_docs.clone(), p)
                    })?;
                    &per_doc
                }
                _ => &shared,
            };
            let joined: Vec<Bson> = match (&local, &foreign) {
                (Some(l), Some(f)) => {
                    let values = match get_exact(&d, l) {
                        Some(Bson::Array(items)) if !items.is_empty() => items.clone(),
                        Some(v) => vec![v.clone()],
                        None => vec![Bson::Null],
                    };
                    let mut cond = Document::new();
                    cond.insert("$in", values);
                    let mut filter = Document::new();
                    filter.insert(f.clone(), cond);
                    let mut hits = Vec::new();
                    for fd in foreign_docs {
                        if match_document(&filter, fd)? {
                            hits.push(Bson::Document(fd.clone()));
                        }
                    }
                    hits
                }
                (None, None) => foreign_docs.iter().cloned().map(Bson::Document).collect(),
                _ => {
                    return Err(EngineError::location(
                        40322,
                        "$lookup requires both or neither of 'localField' and 'foreignField'",
                    ))
                }
            };
            set_dotted(&mut d, &as_field, Bson::Array(joined));
            out.push(d);
        }
        Ok(out)
    }

    fn out(&mut self, db: &str, arg: &Bson, docs: Vec<Document>) -> EngineResult<()> {
        let (target_db, coll) = match arg {
            Bson::String(c) => (db.to_owned(), c.clone()),
            Bson::Document(d) => match (d.get("db"), d.get("coll")) {
                (Some(Bson::String(tdb)), Some(Bson::String(c))) => (tdb.clone(), c.clone()),
                (None, Some(Bson::String(c))) => (db.to_owned(), c.clone()),
                _ => return Err(EngineError::location(
                    16994,
                    "If an object is passed to $out it must have exactly 2 fields: 'db' and 'coll'",
                )),
            },
            _ => {
                return Err(EngineError::location(
                    16990,
                    "$out only supports a string or object argument",
                ))
            }
        };
        let ns = format!("{target_db}.{coll}");
        let mut replacement = match self.collection(&target_db, &coll) {
            Some(existing) => {
                let mut c = existing.clone();
                c.clear();
                c
            }
            None => Collection::new(Document::new()),
        };
        for d in docs {
            replacement.insert_prepared(&ns, Collection::prepare_for_insert(d)?)?;
        }
        // Replace atomically: the target only changes once every document was accepted.
        let (slot, _) = self.collection_or_create(&target_db, &coll)?;
        *slot = replacement;
        Ok(())
    }

    fn merge(&mut self, db: &str, arg: &Bson, docs: Vec<Document>) -> EngineResult<()> {
        let spec = match arg {
            Bson::String(c) => {
                let mut d = Document::new();
                d.insert("into", c.clone());
                d
            }
            Bson::Document(d) => d.clone(),
            _ => {
                return Err(EngineError::location(
                    51182,
                    "$merge only supports a string or object argument",
                ))
            }
        };
        let (target_db, coll) = match spec.get("into") {
            Some(Bson::String(c)) => (db.to_owned(), c.clone()),
            Some(Bson::Document(d)) => match (d.get("db"), d.get("coll")) {
                (Some(Bson::String(tdb)), Some(Bson::String(c))) => (tdb.clone(), c.clone()),
                (None, Some(Bson::String(c))) => (db.to_owned(), c.clone()),
                _ => {
                    return Err(EngineError::location(
                        51178,
                        "$merge 'into' must name a collection",
                    ))
                }
            },
            _ => {
                return Err(EngineError::location(
                    40414,
                    "BSON field '$merge.into' is missing but a required field",
                ))
            }
        };
        let on: Vec<String> = match spec.get("on") {
            None => vec!["_id".to_owned()],
            Some(Bson::String(s)) => vec![s.clone()],
            Some(Bson::Array(items)) if !items.is_empty() => items
                .iter()
                .map(|i| match i {
                    Bson::String(s) => Ok(s.clone()),
                    _ => Err(EngineError::location(
                        51134,
                        "$merge 'on' array elements must be strings",
                    )),
                })
                .collect::<EngineResult<_>>()?,
            Some(_) => {
                return Err(EngineError::location(
                    51186,
                    "$merge 'on' field must be a string or an array of strings",
                ))
            }
        };
        let when_matched = match spec.get("whenMatched") {
            None => "merge".to_owned(),
            Some(Bson::String(s))
                if matches!(s.as_str(), "merge" | "replace" | "keepExisting" | "fail") =>
            {
                s.clone()
            }
            Some(other) => {
                return Err(EngineError::bad_value(format!(
                "Enumeration value '{other}' for field '$merge.whenMatched' is not a valid value."
            )))
            }
        };
        let when_not_matched = match spec.get("whenNotMatched") {
            None => "insert".to_owned(),
            Some(Bson::String(s)) if matches!(s.as_str(), "insert" | "discard" | "fail") => s.clone(),
            Some(other) => return Err(EngineError::bad_value(format!("Enumeration value '{other}' for field '$merge.whenNotMatched' is not a valid value."))),
        };
        let ns = format!("{target_db}.{coll}");
        let mut target = match self.collection(&target_db, &coll) {
            Some(c) => c.clone(),
            None => Collection::new(Document::new()),
        };
        for d in docs {
            let d = if on.len() == 1 && on[0] == "_id" {
                Collection::prepare_for_insert(d)?
            } else {
                d
            };
            let mut key = Vec::with_capacity(on.len());
            for field in &on {
                match get_exact(&d, field) {
                    Some(v) => key.push(v.clone()),
                    None => {
                        return Err(EngineError::location(51132, format!("$merge write error: 'on' field '{field}' cannot be missing, null, undefined or an array")));
                    }
                }
            }
            let hit = target.docs.iter().position(|t| {
                on.iter()
                    .zip(key.iter())
                    .all(|(field, v)| get_exact(t, field).is_some_and(|tv| bson_eq(tv, v)))
            });
            match hit {
                Some(idx) => match when_matched.as_str() {
                    "keepExisting" => {}
                    "fail" => {
                        let mut pattern = Document::new();
                        pattern.insert("_id", 1);
                        let id = d.get("_id").cloned().unwrap_or(Bson::Null);
                        return Err(duplicate_key_error(
                            &ns,
                            "_id_",
                            pattern,
                            &[("_id".to_owned(), id)],
                        ));
                    }
                    mode => {
                        let Some(existing) = target.docs.get(idx).cloned() else {
                            continue;
                        };
                        let mut merged = if mode == "merge" {
                            existing.clone()
                        } else {
                            Document::new()
                        };
                        if mode != "merge" {
                            if let Some(id) = existing.get("_id") {
                                merged.insert("_id", id.clone());
                            }
                        }
                        for (k, v) in d {
                            if k == "_id" && existing.contains_key("_id") {
                                continue;
                            }
                            merged.insert(k, v);
                        }
                        target.replace_at(&ns, idx, merged)?;
                    }
                },
                None => match when_not_matched.as_str() {
                    "discard" => {}
                    "fail" => {
                        return Err(EngineError::merge_stage_no_matching_document(
                            "$merge could not find a matching document in the target collection for at least one document in the source collection",
                        ));
                    }
                    _ => {
                        target.insert_prepared(&ns, Collection::prepare_for_insert(d)?)?;
                    }
                },
            }
        }
        let (slot, _) = self.collection_or_create(&target_db, &coll)?;
        *slot = target;
        Ok(())
    }
}

fn stage_parts(stage: &Document) -> EngineResult<(&str, &Bson)> {
    let mut it = stage.iter();
    match (it.next(), stage.len()) {
        (Some((name, arg)), 1) => Ok((name.as_str(), arg)),
        _ => Err(EngineError::location(
            40323,
            "A pipeline stage specification object must contain exactly one field.",
        )),
    }
}

fn pipeline_of(value: &Bson) -> EngineResult<Vec<Document>> {
    let Bson::Array(items) = value else {
        return Err(EngineError::type_mismatch(
            "a pipeline must be an array of stage objects",
        ));
    };
    items
        .iter()
        .map(|i| match i {
            Bson::Document(d) => Ok(d.clone()),
            _ => Err(EngineError::type_mismatch(
                "Each element of the 'pipeline' array must be an object",
            )),
        })
        .collect()
}

fn documents_stage(arg: &Bson) -> EngineResult<Vec<Document>> {
    check_value_depth(arg)?;
    match eval_opt(arg, &Document::new())? {
        Some(Bson::Array(items)) => items
            .into_iter()
            .map(|i| match i {
                Bson::Document(d) => Ok(d),
                _ => Err(EngineError::location(
                    40228,
                    "$documents elements must be objects",
                )),
            })
            .collect(),
        _ => Err(EngineError::location(
            5858203,
            "error during $documents stage: an array is expected",
        )),
    }
}

fn non_negative_int(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(f) if f.fract() == 0.0 && f.is_finite() => Some(*f as i64),
        _ => None,
    }
}

/// Stages that only transform the document stream (no store access).
fn apply_stage(name: &str, arg: &Bson, docs: Vec<Document>) -> EngineResult<Vec<Document>> {
    let as_doc = |what: i32| -> EngineResult<&Document> {
        match arg {
            Bson::Document(d) => Ok(d),
            _ => Err(EngineError::location(
                what,
                format!("{name} specification must be an object"),
            )),
        }
    };
    Ok(match name {
        "$match" => {
            let filter = as_doc(15959)?;
            let mut out = Vec::new();
            for d in docs {
                if match_document(filter, &d)? {
                    out.push(d);
                }
            }
            if out.is_empty() {
                // Report malformed filters even when no document reached them.
                match_document(filter, &Document::new())?;
            }
            out
        }
        "$project" => {
            let spec = as_doc(15969)?;
            if spec.is_empty() {
                return Err(EngineError::location(
                    51272,
                    "projection specification must have at least one field",
                ));
            }
            let p = Projection::parse(spec, false)?;
            docs.iter()
                .map(|d| p.apply(d))
                .collect::<EngineResult<_>>()?
        }
        "$addFields" | "$set" => {
            let spec = as_doc(40272)?;
            docs.iter()
                .map(|d| add_fields(d, spec))
                .collect::<EngineResult<_>>()?
        }
        "$unset" => {
            let p = Projection::unset(&unset_fields(arg)?)?;
            docs.iter()
                .map(|d| p.apply(d))
                .collect::<EngineResult<_>>()?
        }
        "$replaceRoot" => {
            let spec = as_doc(40229)?;
            let new_root = spec.get("newRoot").ok_or_else(|| {
                EngineError::location(40231, "no newRoot specified for the $replaceRoot stage")
            })?;
            docs.iter()
                .map(|d| replace_root(d, new_root))
                .collect::<EngineResult<_>>()?
        }
        "$replaceWith" => docs
            .iter()
            .map(|d| replace_root(d, arg))
            .collect::<EngineResult<_>>()?,
        "$sort" => {
            let spec = SortSpec::parse(as_doc(15973)?)?;
            if spec.is_empty() {
                return Err(EngineError::location(
                    15976,
                    "$sort stage must have at least one sort key",
                ));
            }
            let mut docs = docs;
            spec.sort(&mut docs);
            docs
        }
        "$skip" => match non_negative_int(arg) {
            Some(n) if n >= 0 => docs
                .into_iter()
                .skip(usize::try_from(n).unwrap_or(usize::MAX))
                .collect(),
            Some(_) => {
                return Err(EngineError::location(
                    15956,
                    "Argument to $skip cannot be negative",
                ))
            }
            None => {
                return Err(EngineError::location(
                    15972,
                    "Argument to $skip must be a number",
                ))
            }
        },
        "$limit" => match non_negative_int(arg) {
            Some(n) if n > 0 => docs
                .into_iter()
                .take(usize::try_from(n).unwrap_or(usize::MAX))
                .collect(),
            Some(_) => return Err(EngineError::location(15958, "the limit must be positive")),
            None => {
                return Err(EngineError::location(
                    15957,
                    "the limit must be specified as a number",
                ))
            }
        },
        "$count" => {
            let Bson::String(field) = arg else {
                return Err(EngineError::location(
                    40156,
                    "the count field must be a non-empty string",
                ));
            };
            if field.is_empty()
                || field.starts_with('$')
                || field.contains('.')
                || field.contains('\0')
            {
                return Err(EngineError::location(40158, "the count field must be a non-empty string, must not start with '$' and must not contain '.'"));
            }
            if docs.is_empty() {
                Vec::new()
            } else {
                let mut d = Document::new();
                let n = docs.len();
                d.insert(
                    field.clone(),
                    i32::try_from(n)
                        .map(Bson::Int32)
                        .unwrap_or(Bson::Int64(n as i64)),
                );
                vec![d]
            }
        }
        "$group" => group(as_doc(15947)?, docs)?,
        "$sortByCount" => {
            let mut spec = Document::new();
            spec.insert("_id", arg.clone());
            let mut count = Document::new();
            count.insert("$sum", 1);
            spec.insert("count", count);
            let mut out = group(&spec, docs)?;
            let mut sort = Document::new();
            sort.insert("count", -1);
            SortSpec::parse(&sort)?.sort(&mut out);
            out
        }
        "$unwind" => unwind(arg, docs)?,
        "$bucket" => bucket(as_doc(40201)?, docs)?,
        "$sample" => {
            let size = match arg {
                Bson::Document(d) => d.get("size").and_then(non_negative_int),
                _ => None,
            };
            let Some(size) = size.filter(|n| *n >= 0) else {
                return Err(EngineError::location(
                    28749,
                    "$sample stage must specify a size",
                ));
            };
            let mut docs = docs;
            docs.shuffle(&mut rand::rng());
            docs.truncate(usize::try_from(size).unwrap_or(usize::MAX));
            docs
        }
        other => {
            return Err(EngineError::location(
                40324,
                format!("Unrecognized pipeline stage name: '{other}'"),
            ));
        }
    })
}

/// `$bucket`: groups by which `[boundaries[i], boundaries[i+1])` range `groupBy` falls in
/// (`_id` is the lower bound), the rest into `default`; output in boundary order, default last.
fn bucket(spec: &Document, docs: Vec<Document>) -> EngineResult<Vec<Document>> {
    let group_by = spec.get("groupBy").ok_or_else(|| {
        EngineError::location(
            40198,
            "$bucket requires 'groupBy' and 'boundaries' to be specified.",
        )
    })?;
    let Some(Bson::Array(boundaries)) = spec.get("boundaries") else {
        return Err(EngineError::location(
            40198,
            "$bucket requires 'groupBy' and 'boundaries' to be specified.",
        ));
    };
    if boundaries.len() < 2 {
        return Err(EngineError::location(
            40192,
            "The $bucket 'boundaries' field must have at least 2 values",
        ));
    }
    for w in boundaries.windows(2) {
        if compare_bson(&w[0], &w[1]) != std::cmp::Ordering::Less
            || type_rank(&w[0]) != type_rank(&w[1])
        {
            return Err(EngineError::location(40194, "The 'boundaries' option to $bucket must be sorted in ascending order and of the same type"));
        }
    }
    let default = spec.get("default").cloned();
    if let (Some(d), Some(first), Some(last)) = (&default, boundaries.first(), boundaries.last()) {
        if type_rank(d) == type_rank(first)
            && compare_bson(d, first) != std::cmp::Ordering::Less
            && compare_bson(d, last) == std::cmp::Ordering::Less
        {
            return Err(EngineError::location(40199, "The $bucket 'default' field must be less than the lowest boundary or greater than or equal to the highest boundary."));
        }
    }
    let output = match spec.get("output") {
        None => {
            let mut count = Document::new();
            count.insert("$sum", 1);
            let mut out = Document::new();
            out.insert("count", count);
            out
        }
        Some(Bson::Document(o)) => o.clone(),
        Some(_) => {
            return Err(EngineError::location(
                40196,
                "The $bucket 'output' field must be an object",
            ))
        }
    };
    let mut groups = group_with(&output, docs, |d| {
        let value = eval_opt(group_by, d)?.unwrap_or(Bson::Null);
        let bucket = boundaries.windows(2).find(|w| {
            type_rank(&value) == type_rank(&w[0])
                && compare_bson(&value, &w[0]) != std::cmp::Ordering::Less
                && compare_bson(&value, &w[1]) == std::cmp::Ordering::Less
        });
        match (bucket, &default) {
            (Some(w), _) => Ok(w[0].clone()),
            (None, Some(d)) => Ok(d.clone()),
            (None, None) => Err(EngineError::location(
                40066,
                format!("$switch could not find a matching branch for an input, and no default was specified. (value {value} does not fall into any $bucket boundary)"),
            )),
        }
    })?;
    let is_default = |g: &Document| match (&default, g.get("_id")) {
        (Some(d), Some(id)) => boundaries.iter().all(|b| !bson_eq(b, id)) && bson_eq(d, id),
        _ => false,
    };
    let (mut buckets, defaults): (Vec<Document>, Vec<Document>) =
        groups.drain(..).partition(|g| !is_default(g));
    buckets.sort_by(|a, b| {
        compare_bson(
            a.get("_id").unwrap_or(&Bson::Null),
            b.get("_id").unwrap_or(&Bson::Null),
        )
    });
    buckets.extend(defaults);
    Ok(buckets)
}

const ACCUMULATORS: &[&str] = &[
    "$sum",
    "$avg",
    "$min",
    "$max",
    "$first",
    "$last",
    "$push",
    "$addToSet",
    "$count",
    "$mergeObjects",
    "$stdDevPop",
    "$stdDevSamp",
];

fn group(spec: &Document, docs: Vec<Document>) -> EngineResult<Vec<Document>> {
    let id_expr = spec
        .get("_id")
        .ok_or_else(|| EngineError::location(15955, "a group specification must include an _id"))?;
    group_with(spec, docs, |d| {
        Ok(eval_opt(id_expr, d)?.unwrap_or(Bson::Null))
    })
}

/// `$group` with the key computed by `key_of`; `spec`'s fields other than `_id` are the
/// accumulators.
fn group_with(
    spec: &Document,
    docs: Vec<Document>,
    key_of: impl Fn(&Document) -> EngineResult<Bson>,
) -> EngineResult<Vec<Document>> {
    let mut accs: Vec<(&str, &str, &Bson)> = Vec::new();
    for (field, acc) in spec {
        if field == "_id" {
            continue;
        }
        if field.contains('.') {
            return Err(EngineError::location(
                40235,
                format!("The field name '{field}' cannot contain '.'"),
            ));
        }
        let Bson::Document(a) = acc else {
            return Err(EngineError::location(
                40234,
                format!("The field '{field}' must be an accumulator object"),
            ));
        };
        let (Some((op, expr)), 1) = (a.iter().next(), a.len()) else {
            return Err(EngineError::location(
                40238,
                format!("The field '{field}' must specify one accumulator"),
            ));
        };
        if !ACCUMULATORS.contains(&op.as_str()) {
            return Err(EngineError::location(
                15952,
                format!("unknown group operator '{op}'"),
            ));
        }
        accs.push((field.as_str(), op.as_str(), expr));
    }
    // Per group: key and, per accumulator, the evaluated inputs (None = missing).
    let mut index: BTreeMap<OrdBson, usize> = BTreeMap::new();
    let mut groups: Vec<(Bson, Vec<Vec<Option<Bson>>>)> = Vec::new();
    for d in &docs {
        let key = key_of(d)?;
        let slot = match index.get(&OrdBson(key.clone())) {
            Some(&i) => i,
            None => {
                index.insert(OrdBson(key.clone()), groups.len());
                groups.push((key, vec![Vec::new(); accs.len()]));
                groups.len() - 1
            }
        };
        let Some((_, inputs)) = groups.get_mut(slot) else {
            continue;
        };
        for ((_, op, expr), values) in accs.iter().zip(inputs.iter_mut()) {
            let v = if *op == "$count" {
                Some(Bson::Int32(1))
            } else {
                eval_opt(expr, d)?
            };
            values.push(v);
        }
    }
    // mongod's `$group` with a constant `_id` over no input produces no group.
    let mut out = Vec::with_capacity(groups.len());
    for (key, inputs) in groups {
        let mut doc = Document::new();
        doc.insert("_id", key);
        for ((field, op, _), values) in accs.iter().zip(inputs) {
            doc.insert(*field, finish_accumulator(op, values)?);
        }
        out.push(doc);
    }
    Ok(out)
}

fn finish_accumulator(op: &str, values: Vec<Option<Bson>>) -> EngineResult<Bson> {
    Ok(match op {
        "$sum" | "$avg" | "$min" | "$max" | "$stdDevPop" | "$stdDevSamp" => {
            let present: Vec<Bson> = values.into_iter().flatten().collect();
            fold_values(op, &present)
        }
        "$count" => {
            let n = values.len();
            i32::try_from(n)
                .map(Bson::Int32)
                .unwrap_or(Bson::Int64(n as i64))
        }
        "$first" => values.into_iter().next().flatten().unwrap_or(Bson::Null),
        "$last" => values.into_iter().last().flatten().unwrap_or(Bson::Null),
        "$push" => Bson::Array(values.into_iter().flatten().collect()),
        "$addToSet" => {
            let mut seen = std::collections::BTreeSet::new();
            let mut out = Vec::new();
            for v in values.into_iter().flatten() {
                if seen.insert(OrdBson(v.clone())) {
                    out.push(v);
                }
            }
            Bson::Array(out)
        }
        "$mergeObjects" => {
            let mut out = Document::new();
            for v in values.into_iter().flatten() {
                match v {
                    Bson::Document(d) => out.extend(d),
                    Bson::Null | Bson::Undefined => {}
                    other => {
                        return Err(EngineError::location(40400, format!("$mergeObjects requires object inputs, but input {other} is of type {}", super::value::bson_type_name(&other))));
                    }
                }
            }
            Bson::Document(out)
        }
        other => {
            return Err(EngineError::location(
                15952,
                format!("unknown group operator '{other}'"),
            ))
        }
    })
}

fn unwind(arg: &Bson, docs: Vec<Document>) -> EngineResult<Vec<Document>> {
    let (path, index_field, preserve) = match arg {
        Bson::String(p) => (p.clone(), None, false),
        Bson::Document(d) => {
            let path = match d.get("path") {
                Some(Bson::String(p)) => p.clone(),
                Some(_) => {
                    return Err(EngineError::location(
                        28808,
                        "expected a string as the path for $unwind stage",
                    ))
                }
                None => {
                    return Err(EngineError::location(
                        28812,
                        "no path specified to $unwind stage",
                    ))
                }
            };
            let index_field = match d.get("includeArrayIndex") {
                None => None,
                Some(Bson::String(s)) if !s.is_empty() && !s.starts_with('$') => Some(s.clone()),
                Some(_) => return Err(EngineError::location(28810, "includeArrayIndex option to $unwind stage should be a non-empty string not starting with '$'")),
            };
            let preserve = match d.get("preserveNullAndEmptyArrays") {
                None => false,
                Some(Bson::Boolean(b)) => *b,
                Some(_) => return Err(EngineError::location(
                    28809,
                    "expected a boolean for the preserveNullAndEmptyArrays option to $unwind stage",
                )),
            };
            for k in d.keys() {
                if !matches!(
                    k.as_str(),
                    "path" | "includeArrayIndex" | "preserveNullAndEmptyArrays"
                ) {
                    return Err(EngineError::location(
                        28811,
                        format!("unrecognized option to $unwind stage: {k}"),
                    ));
                }
            }
            (path, index_field, preserve)
        }
        _ => {
            return Err(EngineError::location(
                15981,
                "expected either a string or an object as specification for $unwind stage",
            ))
        }
    };
    let Some(field) = path.strip_prefix('$').filter(|f| !f.is_empty()) else {
        return Err(EngineError::location(
            28818,
            "path option to $unwind stage should be prefixed with a '$'",
        ));
    };
    let mut out = Vec::new();
    for d in docs {
        match get_exact(&d, field).cloned() {
            Some(Bson::Array(items)) if !items.is_empty() => {
                for (i, item) in items.into_iter().enumerate() {
                    let mut copy = d.clone();
                    set_dotted(&mut copy, field, item);
                    if let Some(idx) = &index_field {
                        set_dotted(&mut copy, idx, Bson::Int64(i as i64));
                    }
                    out.push(copy);
                }
            }
            Some(Bson::Array(_)) | None | Some(Bson::Null) | Some(Bson::Undefined) => {
                if preserve {
                    let mut copy = d;
                    if matches!(get_exact(&copy, field), Some(Bson::Array(_))) {
                        remove_dotted(&mut copy, field);
                    }
                    if let Some(idx) = &index_field {
                        set_dotted(&mut copy, idx, Bson::Null);
                    }
                    out.push(copy);
                }
            }
            Some(_) => {
                let mut copy = d;
                if let Some(idx) = &index_field {
                    set_dotted(&mut copy, idx, Bson::Null);
                }
                out.push(copy);
            }
        }
    }
    Ok(out)
}

fn check_field_path(path: &str) -> EngineResult<()> {
    if path.split('.').count() > MAX_DEPTH || path.split('.').any(str::is_empty) {
        return Err(EngineError::bad_value(format!(
            "invalid field path '{path}'"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn store() -> Store {
        let mut s = Store::new();
        s.insert(
            "db",
            "c",
            vec![
                doc! {"_id": 1, "k": "a", "v": 1, "tags": ["x", "y"]},
                doc! {"_id": 2, "k": "b", "v": 2, "tags": []},
                doc! {"_id": 3, "k": "a", "v": 3.5},
            ],
            true,
        );
        s
    }

    fn agg(s: &mut Store, pipeline: Vec<Document>) -> EngineResult<Vec<Document>> {
        s.aggregate("db", "c", &pipeline)
    }

    #[test]
    fn count_documents_pipeline_shape() {
        let mut s = store();
        let out = agg(
            &mut s,
            vec![
                doc! {"$match": {"v": {"$gte": 2}}},
                doc! {"$skip": 0},
                doc! {"$limit": 10},
                doc! {"$group": {"_id": 1, "n": {"$sum": 1}}},
            ],
        );
        assert_eq!(out, Ok(vec![doc! {"_id": 1, "n": 2}]));
        let empty = agg(
            &mut s,
            vec![
                doc! {"$match": {"v": 100}},
                doc! {"$group": {"_id": 1, "n": {"$sum": 1}}},
            ],
        );
        assert_eq!(empty, Ok(vec![]));
    }

    #[test]
    fn group_accumulators() {
        let mut s = store();
        let out = agg(
            &mut s,
            vec![
                doc! {"$group": {"_id": "$k", "sum": {"$sum": "$v"}, "avg": {"$avg": "$v"}, "min": {"$min": "$v"}, "max": {"$max": "$v"},
                "first": {"$first": "$_id"}, "last": {"$last": "$_id"}, "all": {"$push": "$v"}, "set": {"$addToSet": "$k"}, "n": {"$count": {}}}},
                doc! {"$sort": {"_id": 1}},
            ],
        )
        .expect("ok");
        assert_eq!(
            out[0],
            doc! {"_id": "a", "sum": 4.5, "avg": 2.25, "min": 1, "max": 3.5, "first": 1, "last": 3, "all": [1, 3.5], "set": ["a"], "n": 2}
        );
        assert_eq!(out[1].get("sum"), Some(&Bson::Int32(2)));
        let nulls = agg(
            &mut s,
            vec![doc! {"$group": {"_id": null, "total": {"$sum": "$v"}}}],
        )
        .expect("ok");
        assert_eq!(nulls, vec![doc! {"_id": null, "total": 6.5}]);
        let by_doc = agg(
            &mut s,
            vec![
                doc! {"$group": {"_id": {"key": "$k"}}},
                doc! {"$sort": {"_id.key": -1}},
            ],
        )
        .expect("ok");
        assert_eq!(
            by_doc,
            vec![doc! {"_id": {"key": "b"}}, doc! {"_id": {"key": "a"}}]
        );
        assert_eq!(
            agg(&mut s, vec![doc! {"$group": {"n": {"$sum": 1}}}]).map_err(|e| e.code),
            Err(15955)
        );
        assert_eq!(
            agg(
                &mut s,
                vec![doc! {"$group": {"_id": 1, "n": {"$bogus": 1}}}]
            )
            .map_err(|e| e.code),
            Err(15952)
        );
    }

    #[test]
    fn bucket_groups_by_boundaries_with_default_last() {
        let mut s = store();
        s.insert("db", "c", vec![doc! {"_id": 4, "v": "text"}], true);
        let out = agg(
            &mut s,
            vec![doc! {"$bucket": {"groupBy": "$v", "boundaries": [0, 2, 10], "default": "other"}}],
        )
        .expect("ok");
        assert_eq!(
            out,
            vec![
                doc! {"_id": 0, "count": 1},
                doc! {"_id": 2, "count": 2},
                doc! {"_id": "other", "count": 1}
            ]
        );
        let out = agg(&mut s, vec![doc! {"$match": {"v": {"$type": "number"}}}, doc! {"$bucket": {"groupBy": "$v", "boundaries": [0, 10], "output": {"ids": {"$push": "$_id"}}}}]).expect("ok");
        assert_eq!(out, vec![doc! {"_id": 0, "ids": [1, 2, 3]}]);
        let err = agg(
            &mut s,
            vec![doc! {"$bucket": {"groupBy": "$v", "boundaries": [0, 2]}}],
        )
        .expect_err("no bucket");
        assert_eq!(err.code, 40066);
        assert_eq!(
            agg(
                &mut s,
                vec![doc! {"$bucket": {"groupBy": "$v", "boundaries": [5, 1]}}]
            )
            .map_err(|e| e.code),
            Err(40194)
        );
    }

    #[test]
    fn unwind_forms() {
        let mut s = store();
        let out = agg(&mut s, vec![doc! {"$unwind": "$tags"}]).expect("ok");
        assert_eq!(out.len(), 2);
        assert_eq!(out[1], doc! {"_id": 1, "k": "a", "v": 1, "tags": "y"});
        let out = agg(&mut s, vec![doc! {"$unwind": {"path": "$tags", "preserveNullAndEmptyArrays": true, "includeArrayIndex": "i"}}]).expect("ok");
        assert_eq!(out.len(), 4);
        assert_eq!(out[0].get("i"), Some(&Bson::Int64(0)));
        assert_eq!(out[2], doc! {"_id": 2, "k": "b", "v": 2, "i": null});
        assert_eq!(
            agg(&mut s, vec![doc! {"$unwind": "tags"}]).map_err(|e| e.code),
            Err(28818)
        );
    }

    #[test]
    fn projection_stages_count_and_sort_by_count() {
        let mut s = store();
        let out = agg(
            &mut s,
            vec![
                doc! {"$project": {"k": 1, "double": {"$multiply": ["$v", 2]}}},
                doc! {"$limit": 1},
            ],
        )
        .expect("ok");
        assert_eq!(out, vec![doc! {"_id": 1, "k": "a", "double": 2}]);
        let out = agg(
            &mut s,
            vec![
                doc! {"$set": {"w": "$v"}},
                doc! {"$unset": ["tags", "k", "v"]},
                doc! {"$skip": 2},
            ],
        )
        .expect("ok");
        assert_eq!(out, vec![doc! {"_id": 3, "w": 3.5}]);
        assert_eq!(
            agg(&mut s, vec![doc! {"$count": "total"}]),
            Ok(vec![doc! {"total": 3}])
        );
        let out = agg(&mut s, vec![doc! {"$sortByCount": "$k"}]).expect("ok");
        assert_eq!(out[0], doc! {"_id": "a", "count": 2});
        let out = agg(
            &mut s,
            vec![doc! {"$replaceWith": {"key": "$k"}}, doc! {"$limit": 1}],
        )
        .expect("ok");
        assert_eq!(out, vec![doc! {"key": "a"}]);
    }

    #[test]
    fn unknown_stage_and_bad_arguments() {
        let mut s = store();
        let err = agg(&mut s, vec![doc! {"$foo": 1}]).expect_err("unknown");
        assert_eq!(
            (err.code, err.code_name, err.message.as_str()),
            (
                40324,
                "Location40324",
                "Unrecognized pipeline stage name: '$foo'"
            )
        );
        assert_eq!(
            agg(&mut s, vec![doc! {"$limit": 0}]).map_err(|e| e.code),
            Err(15958)
        );
        assert_eq!(
            agg(&mut s, vec![doc! {"$skip": -1}]).map_err(|e| e.code),
            Err(15956)
        );
        assert_eq!(
            agg(&mut s, vec![doc! {"$match": 1, "$limit": 1}]).map_err(|e| e.code),
            Err(40323)
        );
        assert_eq!(
            agg(&mut s, vec![doc! {"$out": "x"}, doc! {"$limit": 1}]).map_err(|e| e.code),
            Err(40601)
        );
    }

    #[test]
    fn out_replaces_target_collection() {
        let mut s = store();
        s.insert("db", "out", vec![doc! {"_id": 99}], true);
        let out = agg(
            &mut s,
            vec![doc! {"$match": {"k": "a"}}, doc! {"$out": "out"}],
        )
        .expect("ok");
        assert!(out.is_empty());
        let ids: Vec<&Bson> = s
            .documents("db", "out")
            .iter()
            .filter_map(|d| d.get("_id"))
            .collect();
        assert_eq!(ids, vec![&Bson::Int32(1), &Bson::Int32(3)]);
        // A failing $out leaves the target untouched.
        let err = agg(
            &mut s,
            vec![
                doc! {"$project": {"_id": 0, "k": 1}},
                doc! {"$set": {"_id": 1}},
                doc! {"$out": "out"},
            ],
        )
        .expect_err("dup");
        assert_eq!(err.code, 11000);
        assert_eq!(s.documents("db", "out").len(), 2);
    }

    #[test]
    fn merge_modes() {
        let mut s = store();
        s.insert("db", "t", vec![doc! {"_id": 1, "old": true, "v": 0}], true);
        agg(
            &mut s,
            vec![doc! {"$project": {"v": 1}}, doc! {"$merge": {"into": "t"}}],
        )
        .expect("ok");
        assert_eq!(
            s.documents("db", "t")[0],
            doc! {"_id": 1, "old": true, "v": 1}
        );
        assert_eq!(s.documents("db", "t").len(), 3);
        agg(&mut s, vec![doc! {"$project": {"v": 1}}, doc! {"$merge": {"into": "t", "whenMatched": "replace", "whenNotMatched": "discard"}}]).expect("ok");
        assert_eq!(s.documents("db", "t")[0], doc! {"_id": 1, "v": 1});
        let err = agg(
            &mut s,
            vec![doc! {"$merge": {"into": "t", "whenMatched": "fail"}}],
        )
        .expect_err("fail");
        assert_eq!(err.code, 11000);
        let err = agg(
            &mut s,
            vec![
                doc! {"$set": {"_id": 50}},
                doc! {"$merge": {"into": "t", "whenNotMatched": "fail"}},
            ],
        )
        .expect_err("fail");
        assert_eq!(
            (err.code, err.code_name),
            (13113, "MergeStageNoMatchingDocument")
        );
        agg(
            &mut s,
            vec![doc! {"$merge": {"into": "t", "whenMatched": "keepExisting"}}],
        )
        .expect("ok");
        assert_eq!(s.documents("db", "t")[0], doc! {"_id": 1, "v": 1});
    }

    #[test]
    fn run_pipeline_accepts_server_documents_and_documents_stage() {
        let mut s = Store::new();
        let out = s
            .run_pipeline(
                "admin",
                vec![doc! {"a": 1}, doc! {"a": 2}],
                &[doc! {"$limit": 1}],
            )
            .expect("ok");
        assert_eq!(out, vec![doc! {"a": 1}]);
        let out = s
            .run_pipeline(
                "db",
                vec![],
                &[
                    doc! {"$documents": [{"x": 1}, {"x": 2}]},
                    doc! {"$match": {"x": 2}},
                ],
            )
            .expect("ok");
        assert_eq!(out, vec![doc! {"x": 2}]);
    }

    #[test]
    fn oversized_results_are_rejected() {
        let mut s = Store::new();
        let big = "x".repeat(5 * 1024 * 1024);
        let docs: Vec<Document> = (0..4).map(|i| doc! {"_id": i, "s": big.clone()}).collect();
        assert_eq!(s.insert("db", "c", docs, true).n, 4);
        let err = s
            .aggregate(
                "db",
                "c",
                &[doc! {"$group": {"_id": null, "all": {"$push": "$s"}}}],
            )
            .expect_err("too large");
        assert_eq!(err.code, 10334);
    }

    #[test]
    fn lookup_and_facet() {
        let mut s = store();
        s.insert(
            "db",
            "names",
            vec![
                doc! {"_id": "a", "name": "Alpha"},
                doc! {"_id": "b", "name": "Beta"},
            ],
            true,
        );
        let out = agg(&mut s, vec![doc! {"$lookup": {"from": "names", "localField": "k", "foreignField": "_id", "as": "n"}}, doc! {"$limit": 1}]).expect("ok");
        assert_eq!(out[0].get_array("n").map(|a| a.len()), Ok(1));
        let correlated = doc! {"$lookup": {"from": "names", "let": {"key": "$k"}, "pipeline": [{"$match": {"$expr": {"$eq": ["$_id", "$$key"]}}}, {"$project": {"_id": 0, "name": 1}}], "as": "n"}};
        let out = agg(&mut s, vec![correlated, doc! {"$limit": 2}]).expect("ok");
        assert_eq!(
            out[0].get_array("n"),
            Ok(&vec![Bson::Document(doc! {"name": "Alpha"})])
        );
        assert_eq!(
            out[1].get_array("n"),
            Ok(&vec![Bson::Document(doc! {"name": "Beta"})])
        );
        let out = agg(&mut s, vec![doc! {"$facet": {"count": [{"$count": "n"}], "first": [{"$limit": 1}, {"$project": {"_id": 1}}]}}]).expect("ok");
        assert_eq!(out, vec![doc! {"count": [{"n": 3}], "first": [{"_id": 1}]}]);
    }
}
