//! Update operators, replacement documents and pipeline updates applied to one document.

use std::cmp::Ordering;

use bson::{Bson, Document};

use super::compare::{bson_eq, compare_bson, strict_equal_docs};
use super::expression::{arith, Arith};
use super::limits::{check_depth, MAX_DEPTH};
use super::path::{array_index, get_exact};
use super::projection::{add_fields, replace_root, Projection};
use super::query::{is_operator_doc, match_document, match_value};
use super::value::{bson_type_name, Num};
use super::{EngineError, EngineResult, UpdateModification};

/// Per-call settings of [`apply_update`].
#[derive(Debug, Clone, Copy, Default)]
pub struct UpdateContext<'a> {
    /// The document is being inserted by an upsert: `$setOnInsert` applies and `_id` may be set.
    pub is_insert: bool,
    /// `arrayFilters` for `$[<identifier>]` path components.
    pub array_filters: &'a [Document],
    /// The statement's query, which resolves the positional `$` path component.
    pub query: Option<&'a Document>,
}

/// Arrays are never padded beyond this index by `$set: {"a.<n>": ...}` (mongod's limit).
const MAX_ARRAY_PAD: usize = 1_500_000;

/// Applies `update` to `doc` in place and returns whether the document changed (byte-wise, so
/// `$set: {a: 1}` over `a: 1` is not a modification but over `a: 1.0` is).
///
/// Operator updates support `$set $unset $inc $mul $min $max $rename $setOnInsert $push`
/// (`$each $slice $sort $position`) `$addToSet` (`$each`) `$pop $pull $pullAll $currentDate
/// $bit`, dotted paths (creating intermediate documents, numeric components index arrays) and
/// the positional `$`, `$[]` and `$[<id>]` components. Replacement documents keep `_id`.
/// Pipeline updates support `$set $addFields $unset $project $replaceRoot $replaceWith`.
///
/// Errors: 9 FailedToParse (unknown or empty modifier), 14 TypeMismatch, 28 PathNotViable,
/// 40 ConflictingUpdateOperators, 66 ImmutableField (`_id` changed), 2 BadValue. On error
/// `doc` is left unchanged.
pub fn apply_update(
    doc: &mut Document,
    update: &UpdateModification,
    ctx: &UpdateContext<'_>,
) -> EngineResult<bool> {
    for filter in ctx.array_filters.iter().chain(ctx.query) {
        check_depth(filter)?;
    }
    let mut work = doc.clone();
    match update {
        UpdateModification::Pipeline(stages) => apply_pipeline(&mut work, stages)?,
        UpdateModification::Document(u) if u.keys().next().is_some_and(|k| k.starts_with('$')) => {
            check_depth(u)?;
            apply_operators(&mut work, u, ctx)?;
        }
        UpdateModification::Document(replacement) => {
            check_depth(replacement)?;
            work = replace(doc, replacement, ctx)?;
        }
    }
    check_id_unchanged(doc, &work, ctx)?;
    check_depth(&work)?;
    let changed = !strict_equal_docs(doc, &work);
    *doc = work;
    Ok(changed)
}

fn check_id_unchanged(
    before: &Document,
    after: &Document,
    ctx: &UpdateContext<'_>,
) -> EngineResult<()> {
    match (before.get("_id"), after.get("_id")) {
        (Some(old), Some(new)) if !same_id(old, new) => Err(EngineError::immutable_field(
            "Performing an update on the path '_id' would modify the immutable field '_id'",
        )),
        (Some(_), None) if !ctx.is_insert => Err(EngineError::immutable_field(
            "Performing an update on the path '_id' would modify the immutable field '_id'",
        )),
        _ => match after.get("_id") {
            Some(Bson::Array(_)) => Err(EngineError::invalid_id_field(
                "The '_id' value cannot be of type array",
            )),
            _ => Ok(()),
        },
    }
}

/// `_id` values are the same when equal and of the same BSON type (`1` → `1.0` alters it).
fn same_id(a: &Bson, b: &Bson) -> bool {
    bson_eq(a, b) && a.element_type() == b.element_type()
}

fn replace(
    old: &Document,
    replacement: &Document,
    ctx: &UpdateContext<'_>,
) -> EngineResult<Document> {
    let mut out = Document::new();
    match (old.get("_id"), replacement.get("_id")) {
        (Some(old_id), Some(new_id)) if !ctx.is_insert && !same_id(old_id, new_id) => {
            return Err(EngineError::immutable_field(format!(
                "After applying the update, the (immutable) field '_id' was found to have been altered to _id: {new_id}"
            )));
        }
        (_, Some(id)) | (Some(id), None) => {
            out.insert("_id", id.clone());
        }
        (None, None) => {}
    }
    for (k, v) in replacement {
        if k != "_id" {
            out.insert(k.clone(), v.clone());
        }
    }
    Ok(out)
}

fn apply_pipeline(doc: &mut Document, stages: &[Document]) -> EngineResult<()> {
    let id = doc.get("_id").cloned();
    for stage in stages {
        check_depth(stage)?;
        let (Some((name, arg)), 1) = (stage.iter().next(), stage.len()) else {
            return Err(EngineError::location(
                40323,
                "A pipeline stage specification object must contain exactly one field.",
            ));
        };
        *doc = match (name.as_str(), arg) {
            ("$set" | "$addFields", Bson::Document(spec)) => add_fields(doc, spec)?,
            ("$project", Bson::Document(spec)) => Projection::parse(spec, false)?.apply(doc)?,
            ("$unset", arg) => Projection::unset(&unset_fields(arg)?)?.apply(doc)?,
            ("$replaceRoot", Bson::Document(spec)) => replace_root(
                doc,
                spec.get("newRoot").ok_or_else(|| {
                    EngineError::location(40231, "no newRoot specified for the $replaceRoot stage")
                })?,
            )?,
            ("$replaceWith", expr) => replace_root(doc, expr)?,
            (other, _) => {
                return Err(EngineError::invalid_options(format!(
                    "{other} is not allowed to be used within an update"
                )));
            }
        };
    }
    // Stages that drop `_id` (e.g. `$replaceWith`) keep the original one, as mongod does.
    if let (Some(id), false) = (id, doc.contains_key("_id")) {
        let mut with_id = Document::new();
        with_id.insert("_id", id);
        with_id.extend(std::mem::take(doc));
        *doc = with_id;
    }
    Ok(())
}

/// `$unset`'s argument: a field name or an array of them.
pub(crate) fn unset_fields(arg: &Bson) -> EngineResult<Vec<String>> {
    match arg {
        Bson::String(s) => Ok(vec![s.clone()]),
        Bson::Array(items) if !items.is_empty() => items
            .iter()
            .map(|i| match i {
                Bson::String(s) => Ok(s.clone()),
                _ => Err(EngineError::location(31120, "$unset specification must be a string or an array containing only string values")),
            })
            .collect(),
        _ => Err(EngineError::location(31002, "$unset specification must be a string or an array with at least one field")),
    }
}

pub(crate) const OPERATORS: &[&str] = &[
    "$set",
    "$unset",
    "$inc",
    "$mul",
    "$min",
    "$max",
    "$rename",
    "$setOnInsert",
    "$push",
    "$addToSet",
    "$pop",
    "$pull",
    "$pullAll",
    "$currentDate",
    "$bit",
];

struct Action<'u> {
    op: &'u str,
    path: &'u str,
    arg: &'u Bson,
}

fn apply_operators(
    doc: &mut Document,
    update: &Document,
    ctx: &UpdateContext<'_>,
) -> EngineResult<()> {
    let mut actions = Vec::new();
    for (op, spec) in update {
        if !OPERATORS.contains(&op.as_str()) {
            return Err(EngineError::failed_to_parse(format!(
                "Unknown modifier: {op}. Expected a valid update modifier or pipeline-style update specified as an array"
            )));
        }
        let Bson::Document(fields) = spec else {
            return Err(EngineError::failed_to_parse(format!(
                "Modifiers operate on fields but we found type {} instead. For example: {{$mod: {{<field>: ...}}}} not {{{op}: {spec}}}",
                bson_type_name(spec)
            )));
        };
        if fields.is_empty() {
            return Err(EngineError::failed_to_parse(format!(
                "'{op}' is empty. You must specify a field like so: {{{op}: {{<field_name>: ...}}}}"
            )));
        }
        for (path, arg) in fields {
            validate_path(path)?;
            actions.push(Action { op, path, arg });
        }
    }
    check_conflicts(&actions)?;
    // mongod (5.0+) applies updates in field-name order, which decides where new fields land.
    actions.sort_by(|a, b| compare_paths(a.path, b.path));
    for action in &actions {
        if action.op == "$setOnInsert" && !ctx.is_insert {
            continue;
        }
        if action.op == "$rename" {
            rename(doc, action.path, action.arg)?;
            continue;
        }
        for concrete in expand_path(doc, action.path, ctx)? {
            apply_one(doc, action, &concrete)?;
        }
    }
    Ok(())
}

fn validate_path(path: &str) -> EngineResult<()> {
    if path.is_empty() {
        return Err(EngineError::location(
            56,
            "An empty update path is not valid.",
        ));
    }
    let parts = path.split('.').count();
    if parts > MAX_DEPTH {
        return Err(EngineError::overflow(format!(
            "update path '{path}' has more than {MAX_DEPTH} components"
        )));
    }
    if path.split('.').any(str::is_empty) {
        return Err(EngineError::location(
            56,
            format!("The update path '{path}' contains an empty field name, which is not allowed."),
        ));
    }
    Ok(())
}

fn compare_paths(a: &str, b: &str) -> Ordering {
    let mut pa = a.split('.');
    let mut pb = b.split('.');
    loop {
        match (pa.next(), pb.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) => {
                let ord = match (array_index(x), array_index(y)) {
                    (Some(i), Some(j)) => i.cmp(&j),
                    _ => x.cmp(y),
                };
                if ord != Ordering::Equal {
                    return ord;
                }
            }
        }
    }
}

fn check_conflicts(actions: &[Action<'_>]) -> EngineResult<()> {
    let mut paths: Vec<&str> = Vec::with_capacity(actions.len() * 2);
    for a in actions {
        paths.push(a.path);
        if a.op == "$rename" {
            if let Bson::String(to) = a.arg {
                paths.push(to);
            }
        }
    }
    paths.sort_unstable();
    for w in paths.windows(2) {
        let (a, b) = (w[0], w[1]);
        let conflict = a == b || (b.starts_with(a) && b.as_bytes().get(a.len()) == Some(&b'.'));
        if conflict {
            return Err(EngineError::conflicting_update_operators(format!(
                "Updating the path '{b}' would create a conflict at '{a}'"
            )));
        }
    }
    Ok(())
}

/// Resolves positional components (`$`, `$[]`, `$[id]`) into concrete paths.
fn expand_path(
    doc: &Document,
    path: &str,
    ctx: &UpdateContext<'_>,
) -> EngineResult<Vec<Vec<String>>> {
    let parts: Vec<&str> = path.split('.').collect();
    if !parts.iter().any(|p| p.starts_with('$')) {
        return Ok(vec![parts.iter().map(|p| (*p).to_owned()).collect()]);
    }
    let mut results = vec![Vec::new()];
    for (i, part) in parts.iter().enumerate() {
        if !part.starts_with('$') {
            for r in &mut results {
                r.push((*part).to_owned());
            }
            continue;
        }
        let mut next = Vec::new();
        for prefix in results {
            let prefix_path = prefix.join(".");
            let items = match get_exact(doc, &prefix_path) {
                Some(Bson::Array(items)) => items.clone(),
                _ if *part == "$" => {
                    return Err(EngineError::bad_value(
                        "The positional operator did not find the match needed from the query.",
                    ));
                }
                _ => {
                    return Err(EngineError::bad_value(format!(
                        "The path '{prefix_path}' must exist in the document in order to apply array updates."
                    )));
                }
            };
            let indexes: Vec<usize> = match *part {
                "$" => vec![positional_index(doc, &prefix_path, &items, ctx)?],
                "$[]" => (0..items.len()).collect(),
                p if p.starts_with("$[") && p.ends_with(']') => {
                    let id = &p[2..p.len() - 1];
                    let filter = ctx
                        .array_filters
                        .iter()
                        .find(|f| {
                            f.keys()
                                .next()
                                .is_some_and(|k| k.split('.').next() == Some(id))
                        })
                        .ok_or_else(|| {
                            EngineError::bad_value(format!(
                                "No array filter found for identifier '{id}' in path '{path}'"
                            ))
                        })?;
                    let mut hits = Vec::new();
                    for (idx, item) in items.iter().enumerate() {
                        let mut probe = Document::new();
                        probe.insert(id, item.clone());
                        if match_document(filter, &probe)? {
                            hits.push(idx);
                        }
                    }
                    hits
                }
                other => {
                    return Err(EngineError::bad_value(format!(
                        "The dollar ($) prefixed field '{other}' in '{path}' is not valid for storage."
                    )));
                }
            };
            let _ = i;
            for idx in indexes {
                let mut p = prefix.clone();
                p.push(idx.to_string());
                next.push(p);
            }
        }
        results = next;
    }
    Ok(results)
}

/// The index the positional `$` stands for: the first element that makes the query match
/// when it is the array's only element.
fn positional_index(
    doc: &Document,
    prefix: &str,
    items: &[Bson],
    ctx: &UpdateContext<'_>,
) -> EngineResult<usize> {
    let not_found = || {
        EngineError::bad_value(
            "The positional operator did not find the match needed from the query.",
        )
    };
    let query = ctx.query.ok_or_else(not_found)?;
    for (idx, item) in items.iter().enumerate() {
        let mut probe = doc.clone();
        let parts: Vec<String> = prefix.split('.').map(str::to_owned).collect();
        set_value(&mut probe, &parts, Bson::Array(vec![item.clone()]))?;
        if match_document(query, &probe)? {
            return Ok(idx);
        }
    }
    Err(not_found())
}

enum Parent<'a> {
    Doc(&'a mut Document),
    Arr(&'a mut Vec<Bson>),
}

fn path_not_viable(field: &str, elem_name: &str, elem: &Bson) -> EngineError {
    EngineError::path_not_viable(format!(
        "Cannot create field '{field}' in element {{{elem_name}: {elem}}}"
    ))
}

/// Walks `parts` from `cur`; with `create`, missing documents are created and arrays padded.
/// `leaf` is the field that will be accessed in the result (for error messages).
fn navigate<'a>(
    cur: Parent<'a>,
    parts: &[String],
    leaf: &str,
    create: bool,
) -> EngineResult<Option<Parent<'a>>> {
    let Some((first, rest)) = parts.split_first() else {
        return Ok(Some(cur));
    };
    let child: &'a mut Bson = match cur {
        Parent::Doc(d) => {
            if !d.contains_key(first) {
                if !create {
                    return Ok(None);
                }
                d.insert(first.clone(), Document::new());
            }
            match d.get_mut(first) {
                Some(c) => c,
                None => return Ok(None),
            }
        }
        Parent::Arr(a) => {
            let Some(i) = array_index(first) else {
                if !create {
                    return Ok(None);
                }
                return Err(path_not_viable(first, "array", &Bson::Array(a.clone())));
            };
            if i >= a.len() {
                if !create {
                    return Ok(None);
                }
                pad(a, i)?;
                a.push(Bson::Document(Document::new()));
            }
            match a.get_mut(i) {
                Some(c) => c,
                None => return Ok(None),
            }
        }
    };
    match child {
        Bson::Document(d) => navigate(Parent::Doc(d), rest, leaf, create),
        Bson::Array(a) => navigate(Parent::Arr(a), rest, leaf, create),
        other if create => Err(path_not_viable(
            rest.first().map(String::as_str).unwrap_or(leaf),
            first,
            other,
        )),
        _ => Ok(None),
    }
}

fn pad(a: &mut Vec<Bson>, index: usize) -> EngineResult<()> {
    if index > MAX_ARRAY_PAD {
        return Err(EngineError::bad_value(format!(
            "can't backfill array to larger than {MAX_ARRAY_PAD} elements"
        )));
    }
    while a.len() < index {
        a.push(Bson::Null);
    }
    Ok(())
}

fn get_in<'b>(parent: &'b Parent<'_>, key: &str) -> Option<&'b Bson> {
    match parent {
        Parent::Doc(d) => d.get(key),
        Parent::Arr(a) => array_index(key).and_then(|i| a.get(i)),
    }
}

fn set_in(parent: &mut Parent<'_>, key: &str, value: Bson) -> EngineResult<()> {
    match parent {
        Parent::Doc(d) => {
            d.insert(key.to_owned(), value);
        }
        Parent::Arr(a) => {
            let Some(i) = array_index(key) else {
                return Err(path_not_viable(key, "array", &Bson::Array(a.to_vec())));
            };
            if i < a.len() {
                a[i] = value;
            } else {
                pad(a, i)?;
                a.push(value);
            }
        }
    }
    Ok(())
}

fn set_value(doc: &mut Document, parts: &[String], value: Bson) -> EngineResult<()> {
    let Some((last, init)) = parts.split_last() else {
        return Ok(());
    };
    if let Some(mut parent) = navigate(Parent::Doc(doc), init, last, true)? {
        set_in(&mut parent, last, value)?;
    }
    Ok(())
}

fn id_display(doc_id: &Option<Bson>) -> String {
    match doc_id {
        Some(id) => format!("{{_id: {id}}}"),
        None => "{}".to_owned(),
    }
}

fn apply_one(doc: &mut Document, action: &Action<'_>, parts: &[String]) -> EngineResult<()> {
    let Some((last, init)) = parts.split_last() else {
        return Ok(());
    };
    let doc_id = doc.get("_id").cloned();
    let path = parts.join(".");
    let arg = action.arg;
    // Operators that never create the path when it is missing.
    let creates = !matches!(action.op, "$unset" | "$pop" | "$pull" | "$pullAll");
    // Arguments are validated even when the target field is missing, as mongod parses them
    // before looking at the document.
    match action.op {
        "$pop" if Num::of(arg).is_none() => {
            return Err(EngineError::failed_to_parse(format!(
                "Expected a number in: {last}: {arg}"
            )));
        }
        "$pullAll" if !matches!(arg, Bson::Array(_)) => {
            return Err(EngineError::bad_value(format!(
                "$pullAll requires an array argument but was given a {}",
                bson_type_name(arg)
            )));
        }
        "$pull" => {
            pull_matches(&Bson::Null, arg)?;
        }
        _ => {}
    }
    let Some(mut parent) = navigate(Parent::Doc(doc), init, last, creates)? else {
        return Ok(());
    };
    let current = get_in(&parent, last).cloned();
    let new_value = match action.op {
        "$set" | "$setOnInsert" => Some(arg.clone()),
        "$unset" => {
            match &mut parent {
                Parent::Doc(d) => {
                    d.remove(last.as_str());
                }
                Parent::Arr(a) => {
                    if let Some(slot) = array_index(last).and_then(|i| a.get_mut(i)) {
                        *slot = Bson::Null;
                    }
                }
            }
            None
        }
        "$inc" | "$mul" => {
            let op = if action.op == "$inc" {
                Arith::Add
            } else {
                Arith::Mul
            };
            if Num::of(arg).is_none() {
                return Err(EngineError::type_mismatch(format!(
                    "Cannot {} with non-numeric argument: {{{last}: {arg}}}",
                    if op == Arith::Add {
                        "increment"
                    } else {
                        "multiply"
                    }
                )));
            }
            match &current {
                None => Some(if op == Arith::Add {
                    arg.clone()
                } else {
                    match arg {
                        Bson::Int32(_) => Bson::Int32(0),
                        Bson::Int64(_) => Bson::Int64(0),
                        _ => Bson::Double(0.0),
                    }
                }),
                Some(cur) => Some(arith(op, cur, arg).ok_or_else(|| {
                    EngineError::type_mismatch(format!(
                        "Cannot apply {} to a value of non-numeric type. {} has the field '{last}' of non-numeric type {}",
                        action.op,
                        id_display(&doc_id),
                        bson_type_name(cur)
                    ))
                })?),
            }
        }
        "$min" | "$max" => {
            let want = if action.op == "$min" {
                Ordering::Less
            } else {
                Ordering::Greater
            };
            match &current {
                Some(cur) if compare_bson(arg, cur) != want => None,
                _ => Some(arg.clone()),
            }
        }
        "$currentDate" => {
            let as_timestamp = match arg {
                Bson::Boolean(_) => false,
                Bson::Document(d) => match d.get("$type") {
                    Some(Bson::String(t)) if t == "date" => false,
                    Some(Bson::String(t)) if t == "timestamp" => true,
                    _ => return Err(EngineError::bad_value("The '$type' string field is required to be 'date' or 'timestamp': {$currentDate: {field : {$type: 'date'}}}")),
                },
                _ => return Err(EngineError::bad_value(format!("{arg} is not valid type for $currentDate. Please use a boolean ('true') or a $type expression ({{$type: 'timestamp/date'}})."))),
            };
            let now = bson::DateTime::now();
            Some(if as_timestamp {
                let secs = u32::try_from(now.timestamp_millis() / 1000).unwrap_or(u32::MAX);
                Bson::Timestamp(bson::Timestamp {
                    time: secs,
                    increment: 1,
                })
            } else {
                Bson::DateTime(now)
            })
        }
        "$bit" => Some(bit(current.as_ref(), arg, last)?),
        "$push" => Some(push(current, arg, last, &doc_id)?),
        "$addToSet" => Some(add_to_set(current, arg, last, &doc_id)?),
        "$pop" => match current {
            None => None,
            Some(Bson::Array(mut items)) => {
                let from_front = match Num::of(arg) {
                    Some(n) => n.as_f64() < 0.0,
                    None => {
                        return Err(EngineError::failed_to_parse(format!(
                            "Expected a number in: {last}: {arg}"
                        )))
                    }
                };
                if !items.is_empty() {
                    if from_front {
                        items.remove(0);
                    } else {
                        items.pop();
                    }
                }
                Some(Bson::Array(items))
            }
            Some(other) => {
                return Err(EngineError::type_mismatch(format!(
                    "Path '{path}' contains an element of non-array type '{}'",
                    bson_type_name(&other)
                )))
            }
        },
        "$pull" | "$pullAll" => match current {
            None => None,
            Some(Bson::Array(items)) => {
                let mut kept = Vec::with_capacity(items.len());
                for item in items {
                    let remove = if action.op == "$pull" {
                        pull_matches(&item, arg)?
                    } else {
                        let Bson::Array(values) = arg else {
                            return Err(EngineError::bad_value(format!(
                                "$pullAll requires an array argument but was given a {}",
                                bson_type_name(arg)
                            )));
                        };
                        values.iter().any(|v| bson_eq(v, &item))
                    };
                    if !remove {
                        kept.push(item);
                    }
                }
                Some(Bson::Array(kept))
            }
            Some(_) => {
                return Err(EngineError::bad_value(
                    "Cannot apply $pull to a non-array value",
                ))
            }
        },
        other => {
            return Err(EngineError::failed_to_parse(format!(
                "Unknown modifier: {other}"
            )))
        }
    };
    if let Some(v) = new_value {
        set_in(&mut parent, last, v)?;
    }
    Ok(())
}

fn pull_matches(item: &Bson, cond: &Bson) -> EngineResult<bool> {
    match cond {
        Bson::Document(d) if is_operator_doc(d) => match_value(item, cond),
        Bson::Document(d) => match item {
            Bson::Document(elem) => match_document(d, elem),
            _ => Ok(false),
        },
        Bson::RegularExpression(_) => match_value(item, cond),
        other => Ok(bson_eq(item, other)),
    }
}

fn bit(current: Option<&Bson>, arg: &Bson, field: &str) -> EngineResult<Bson> {
    let Bson::Document(ops) = arg else {
        return Err(EngineError::bad_value(format!("The $bit modifier is not compatible with a {}. You must pass in an embedded document: {{$bit: {{field: {{and/or/xor: #}}}}", bson_type_name(arg))));
    };
    let mut value = current.cloned().unwrap_or(Bson::Int32(0));
    for (op, operand) in ops {
        let (a, b) = match (&value, operand) {
            (Bson::Int32(x), Bson::Int32(y)) => (i64::from(*x), i64::from(*y)),
            (Bson::Int32(x), Bson::Int64(y)) => (i64::from(*x), *y),
            (Bson::Int64(x), Bson::Int32(y)) => (*x, i64::from(*y)),
            (Bson::Int64(x), Bson::Int64(y)) => (*x, *y),
            _ => {
                return Err(EngineError::bad_value(format!(
                    "Cannot apply $bit to a value of non-integral type. Field '{field}'"
                )));
            }
        };
        let r = match op.as_str() {
            "and" => a & b,
            "or" => a | b,
            "xor" => a ^ b,
            other => {
                return Err(EngineError::bad_value(format!(
                    "The $bit modifier only supports 'and', 'or', and 'xor', not '{other}'"
                )));
            }
        };
        value = if matches!((&value, operand), (Bson::Int32(_), Bson::Int32(_))) {
            Bson::Int32(r as i32)
        } else {
            Bson::Int64(r)
        };
    }
    Ok(value)
}

fn existing_array(
    current: Option<Bson>,
    op: &str,
    field: &str,
    doc_id: &Option<Bson>,
) -> EngineResult<Vec<Bson>> {
    match current {
        None => Ok(Vec::new()),
        Some(Bson::Array(items)) => Ok(items),
        Some(other) => Err(EngineError::bad_value(if op == "$push" {
            format!(
                "The field '{field}' must be an array but is of type {} in document {}",
                bson_type_name(&other),
                id_display(doc_id)
            )
        } else {
            format!("Cannot apply $addToSet to non-array field. Field named '{field}' has non-array type {}", bson_type_name(&other))
        })),
    }
}

fn push(
    current: Option<Bson>,
    arg: &Bson,
    field: &str,
    doc_id: &Option<Bson>,
) -> EngineResult<Bson> {
    let mut items = existing_array(current, "$push", field, doc_id)?;
    let modifiers = match arg {
        Bson::Document(d) if d.contains_key("$each") => Some(d),
        _ => None,
    };
    let Some(m) = modifiers else {
        items.push(arg.clone());
        return Ok(Bson::Array(items));
    };
    for key in m.keys() {
        if !matches!(key.as_str(), "$each" | "$slice" | "$sort" | "$position") {
            return Err(EngineError::bad_value(format!(
                "Unrecognized clause in $push: {key}"
            )));
        }
    }
    let Some(Bson::Array(each)) = m.get("$each") else {
        return Err(EngineError::bad_value(
            "The argument to $each in $push must be an array",
        ));
    };
    let as_int = |v: &Bson, what: &str| -> EngineResult<i64> {
        match Num::of(v) {
            Some(Num::Int(i)) => Ok(i),
            Some(Num::Float(f)) if f.fract() == 0.0 && f.is_finite() => Ok(f as i64),
            _ => Err(EngineError::bad_value(format!(
                "The value for {what} must be an integer value but was given type: {}",
                bson_type_name(v)
            ))),
        }
    };
    let len = items.len() as i64;
    let position = match m.get("$position") {
        None => len,
        Some(p) => {
            let p = as_int(p, "$position")?;
            if p < 0 {
                (len + p).max(0)
            } else {
                p.min(len)
            }
        }
    };
    let at = usize::try_from(position)
        .unwrap_or(items.len())
        .min(items.len());
    let tail = items.split_off(at);
    items.extend(each.iter().cloned());
    items.extend(tail);
    if let Some(spec) = m.get("$sort") {
        sort_array(&mut items, spec)?;
    }
    if let Some(s) = m.get("$slice") {
        let n = as_int(s, "$slice")?;
        if n >= 0 {
            items.truncate(usize::try_from(n).unwrap_or(usize::MAX));
        } else {
            let keep = usize::try_from(n.unsigned_abs()).unwrap_or(usize::MAX);
            if items.len() > keep {
                items.drain(..items.len() - keep);
            }
        }
    }
    Ok(Bson::Array(items))
}

fn sort_array(items: &mut [Bson], spec: &Bson) -> EngineResult<()> {
    let dir_of = |v: &Bson| -> EngineResult<bool> {
        match Num::of(v).map(|n| n.as_f64()) {
            Some(1.0) => Ok(false),
            Some(-1.0) => Ok(true),
            _ => Err(EngineError::bad_value(
                "The $sort element value must be either 1 or -1",
            )),
        }
    };
    match spec {
        Bson::Document(fields) => {
            if fields.is_empty() {
                return Err(EngineError::bad_value(
                    "The $sort pattern is empty when it should be a set of fields.",
                ));
            }
            let mut keys = Vec::with_capacity(fields.len());
            for (path, dir) in fields {
                keys.push((path.as_str(), dir_of(dir)?));
            }
            items.sort_by(|a, b| {
                for (path, desc) in &keys {
                    let va = match a {
                        Bson::Document(d) => get_exact(d, path).unwrap_or(&Bson::Null),
                        _ => &Bson::Null,
                    };
                    let vb = match b {
                        Bson::Document(d) => get_exact(d, path).unwrap_or(&Bson::Null),
                        _ => &Bson::Null,
                    };
                    let ord = compare_bson(va, vb);
                    let ord = if *desc { ord.reverse() } else { ord };
                    if ord != Ordering::Equal {
                        return ord;
                    }
                }
                Ordering::Equal
            });
        }
        other => {
            let desc = dir_of(other)?;
            items.sort_by(|a, b| {
                let ord = compare_bson(a, b);
                if desc {
                    ord.reverse()
                } else {
                    ord
                }
            });
        }
    }
    Ok(())
}

fn add_to_set(
    current: Option<Bson>,
    arg: &Bson,
    field: &str,
    doc_id: &Option<Bson>,
) -> EngineResult<Bson> {
    let mut items = existing_array(current, "$addToSet", field, doc_id)?;
    let candidates: Vec<Bson> = match arg {
        Bson::Document(d) if d.contains_key("$each") => match d.get("$each") {
            Some(Bson::Array(each)) if d.len() == 1 => each.clone(),
            Some(Bson::Array(_)) => {
                return Err(EngineError::bad_value(
                    "Found unexpected fields after $each in $addToSet",
                ))
            }
            _ => {
                return Err(EngineError::type_mismatch(
                    "The argument to $each in $addToSet must be an array",
                ))
            }
        },
        other => vec![other.clone()],
    };
    for c in candidates {
        if !items.iter().any(|i| bson_eq(i, &c)) {
            items.push(c);
        }
    }
    Ok(Bson::Array(items))
}

fn rename(doc: &mut Document, from: &str, to: &Bson) -> EngineResult<()> {
    let Bson::String(to) = to else {
        return Err(EngineError::bad_value(format!(
            "The 'to' field for $rename must be a string: {from}: {to}"
        )));
    };
    validate_path(to)?;
    if from == to {
        return Err(EngineError::bad_value(format!(
            "The source and target field for $rename must differ: {from}: \"{to}\""
        )));
    }
    if to.starts_with(&format!("{from}.")) || from.starts_with(&format!("{to}.")) {
        return Err(EngineError::bad_value(format!("The source and target field for $rename must not be on the same path: {from}: \"{to}\"")));
    }
    if from.contains('$') || to.contains('$') {
        return Err(EngineError::bad_value(
            "The source and target field for $rename may not be dynamic",
        ));
    }
    let from_parts: Vec<String> = from.split('.').map(str::to_owned).collect();
    let Some((last, init)) = from_parts.split_last() else {
        return Ok(());
    };
    let value = match navigate(Parent::Doc(doc), init, last, false)? {
        Some(Parent::Doc(d)) => d.remove(last.as_str()),
        Some(Parent::Arr(_)) => {
            return Err(EngineError::bad_value(format!(
                "The source field cannot be an array element, '{from}' in doc has an array field"
            )));
        }
        None => None,
    };
    let Some(value) = value else { return Ok(()) };
    let to_parts: Vec<String> = to.split('.').map(str::to_owned).collect();
    set_value(doc, &to_parts, value)
}

/// Builds the document an upsert inserts: the equality conditions of `filter` (top level,
/// `$eq`, dotted paths and `$and` clauses), `_id` first.
pub(crate) fn upsert_seed(filter: &Document) -> EngineResult<Document> {
    let mut seed = Document::new();
    collect_equalities(filter, &mut seed)?;
    if let Some(id) = seed.remove("_id") {
        let mut with_id = Document::new();
        with_id.insert("_id", id);
        with_id.extend(seed);
        seed = with_id;
    }
    Ok(seed)
}

fn collect_equalities(filter: &Document, seed: &mut Document) -> EngineResult<()> {
    for (key, cond) in filter {
        // mongod simplifies a one-clause `$or` to its clause before seeding.
        let single_or = matches!(cond, Bson::Array(c) if c.len() == 1);
        if key == "$and" || (key == "$or" && single_or) {
            if let Bson::Array(clauses) = cond {
                for c in clauses {
                    if let Bson::Document(d) = c {
                        collect_equalities(d, seed)?;
                    }
                }
            }
            continue;
        }
        if key.starts_with('$') {
            continue;
        }
        let value = match cond {
            Bson::Document(d) if is_operator_doc(d) => match (d.get("$eq"), d.get("$in")) {
                (Some(v), _) => v.clone(),
                // A one-element `$in` is an equality to mongod's planner, and seeds like one.
                (None, Some(Bson::Array(items)))
                    if items.len() == 1 && !matches!(items[0], Bson::RegularExpression(_)) =>
                {
                    items[0].clone()
                }
                _ => continue,
            },
            Bson::RegularExpression(_) => continue,
            other => other.clone(),
        };
        validate_path(key)?;
        let parts: Vec<String> = key.split('.').map(str::to_owned).collect();
        // A path that cannot be built (e.g. through a scalar set by another condition) is
        // simply not seeded; the update itself still runs.
        let _ = set_value(seed, &parts, value);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn upd(d: Document, u: Document) -> EngineResult<(Document, bool)> {
        let mut d = d;
        let changed = apply_update(
            &mut d,
            &UpdateModification::Document(u),
            &UpdateContext::default(),
        )?;
        Ok((d, changed))
    }

    fn code(r: EngineResult<(Document, bool)>) -> i32 {
        r.map(|_| 0).unwrap_or_else(|e| e.code)
    }

    #[test]
    fn set_creates_intermediate_documents_in_field_order() {
        let (d, changed) = upd(doc! {"_id": 1}, doc! {"$set": {"z": 1, "a.b.c": 2}}).expect("ok");
        assert!(changed);
        assert_eq!(d, doc! {"_id": 1, "a": {"b": {"c": 2}}, "z": 1});
    }

    #[test]
    fn set_same_value_is_not_a_modification_but_type_change_is() {
        assert_eq!(
            upd(doc! {"_id": 1, "a": 1}, doc! {"$set": {"a": 1}}).map(|r| r.1),
            Ok(false)
        );
        assert_eq!(
            upd(doc! {"_id": 1, "a": 1}, doc! {"$set": {"a": 1.0}}).map(|r| r.1),
            Ok(true)
        );
    }

    #[test]
    fn set_through_array_indexes_and_pads() {
        let (d, _) = upd(
            doc! {"_id": 1, "a": [1, 2]},
            doc! {"$set": {"a.1": 5, "a.3": 7}},
        )
        .expect("ok");
        assert_eq!(d, doc! {"_id": 1, "a": [1, 5, null, 7]});
        assert_eq!(
            code(upd(doc! {"_id": 1, "a": 5}, doc! {"$set": {"a.b": 1}})),
            28
        );
        assert_eq!(
            code(upd(doc! {"_id": 1, "a": [1]}, doc! {"$set": {"a.b": 1}})),
            28
        );
    }

    #[test]
    fn inc_and_mul_follow_numeric_promotion() {
        let (d, _) = upd(
            doc! {"_id": 1, "a": 1, "b": i32::MAX, "c": 2.5},
            doc! {"$inc": {"a": 2, "b": 1, "n": 5}, "$mul": {"c": 2, "m": 3i64}},
        )
        .expect("ok");
        assert_eq!(
            d,
            doc! {"_id": 1, "a": 3, "b": i64::from(i32::MAX) + 1, "c": 5.0, "m": 0i64, "n": 5}
        );
        assert_eq!(
            code(upd(doc! {"_id": 1, "a": "x"}, doc! {"$inc": {"a": 1}})),
            14
        );
        assert_eq!(code(upd(doc! {"_id": 1}, doc! {"$inc": {"a": "1"}})), 14);
    }

    #[test]
    fn unset_min_max_rename_current_date() {
        let (d, _) = upd(
            doc! {"_id": 1, "a": 5, "b": 5, "c": 1, "old": {"x": 1}},
            doc! {"$unset": {"c": "", "nope": 1}, "$min": {"a": 3}, "$max": {"b": 3}, "$rename": {"old.x": "new"}},
        )
        .expect("ok");
        assert_eq!(d, doc! {"_id": 1, "a": 3, "b": 5, "old": {}, "new": 1});
        let (d, _) = upd(
            doc! {"_id": 1},
            doc! {"$currentDate": {"t": true, "ts": {"$type": "timestamp"}}},
        )
        .expect("ok");
        assert!(matches!(d.get("t"), Some(Bson::DateTime(_))));
        assert!(matches!(d.get("ts"), Some(Bson::Timestamp(_))));
    }

    #[test]
    fn push_with_modifiers() {
        let (d, _) = upd(
            doc! {"_id": 1, "a": [5, 1]},
            doc! {"$push": {"a": {"$each": [3, 4], "$sort": 1, "$slice": 3}, "b": 1}},
        )
        .expect("ok");
        assert_eq!(d, doc! {"_id": 1, "a": [1, 3, 4], "b": [1]});
        let (d, _) = upd(
            doc! {"_id": 1, "a": [1, 2]},
            doc! {"$push": {"a": {"$each": [9], "$position": 0}}},
        )
        .expect("ok");
        assert_eq!(d, doc! {"_id": 1, "a": [9, 1, 2]});
        let (d, _) = upd(
            doc! {"_id": 1, "a": [{"s": 2}, {"s": 1}]},
            doc! {"$push": {"a": {"$each": [], "$sort": {"s": -1}}}},
        )
        .expect("ok");
        assert_eq!(d, doc! {"_id": 1, "a": [{"s": 2}, {"s": 1}]});
        assert_eq!(
            code(upd(doc! {"_id": 1, "a": 1}, doc! {"$push": {"a": 2}})),
            2
        );
    }

    #[test]
    fn add_to_set_pop_pull() {
        let (d, _) = upd(
            doc! {"_id": 1, "a": [1, 2]},
            doc! {"$addToSet": {"a": {"$each": [2, 3, 3.0]}}},
        )
        .expect("ok");
        assert_eq!(d, doc! {"_id": 1, "a": [1, 2, 3]});
        let (d, _) = upd(
            doc! {"_id": 1, "a": [1, 2, 3], "b": [1, 2]},
            doc! {"$pop": {"a": -1, "b": 1}},
        )
        .expect("ok");
        assert_eq!(d, doc! {"_id": 1, "a": [2, 3], "b": [1]});
        let (d, _) = upd(
            doc! {"_id": 1, "a": [1, 5, 7], "r": [{"k": 1, "v": 2}, {"k": 2}]},
            doc! {"$pull": {"a": {"$gte": 5}, "r": {"k": 1}}},
        )
        .expect("ok");
        assert_eq!(d, doc! {"_id": 1, "a": [1], "r": [{"k": 2}]});
        assert_eq!(
            code(upd(doc! {"_id": 1, "a": 1}, doc! {"$pop": {"a": 1}})),
            14
        );
        assert_eq!(
            code(upd(doc! {"_id": 1}, doc! {"$pop": {"missing": "x"}})),
            9
        );
        assert_eq!(
            code(upd(doc! {"_id": 1}, doc! {"$pop": {"no.parent": "x"}})),
            9
        );
        assert_eq!(
            code(upd(doc! {"_id": 1}, doc! {"$pullAll": {"missing": 1}})),
            2
        );
        assert_eq!(
            code(upd(
                doc! {"_id": 1},
                doc! {"$pull": {"missing": {"$bogus": 1}}}
            )),
            2
        );
    }

    #[test]
    fn positional_operators() {
        let q = doc! {"a.k": 2};
        let mut d = doc! {"_id": 1, "a": [{"k": 1, "v": 0}, {"k": 2, "v": 0}]};
        let ctx = UpdateContext {
            query: Some(&q),
            ..Default::default()
        };
        apply_update(
            &mut d,
            &UpdateModification::Document(doc! {"$set": {"a.$.v": 9}}),
            &ctx,
        )
        .expect("ok");
        assert_eq!(
            d,
            doc! {"_id": 1, "a": [{"k": 1, "v": 0}, {"k": 2, "v": 9}]}
        );
        let (d, _) = upd(doc! {"_id": 1, "a": [1, 2]}, doc! {"$inc": {"a.$[]": 10}}).expect("ok");
        assert_eq!(d, doc! {"_id": 1, "a": [11, 12]});
        let filters = [doc! {"x": {"$gt": 1}}];
        let ctx = UpdateContext {
            array_filters: &filters,
            ..Default::default()
        };
        let mut d = doc! {"_id": 1, "a": [1, 2, 3]};
        apply_update(
            &mut d,
            &UpdateModification::Document(doc! {"$set": {"a.$[x]": 0}}),
            &ctx,
        )
        .expect("ok");
        assert_eq!(d, doc! {"_id": 1, "a": [1, 0, 0]});
    }

    #[test]
    fn malformed_updates_fail_with_mongod_codes() {
        assert_eq!(code(upd(doc! {"_id": 1}, doc! {"$set": {}})), 9);
        assert_eq!(code(upd(doc! {"_id": 1}, doc! {"$foo": {"a": 1}})), 9);
        assert_eq!(code(upd(doc! {"_id": 1}, doc! {"$set": 1})), 9);
        assert_eq!(
            code(upd(
                doc! {"_id": 1},
                doc! {"$set": {"a": 1}, "$inc": {"a": 1}}
            )),
            40
        );
        assert_eq!(
            code(upd(doc! {"_id": 1}, doc! {"$set": {"a": 1, "a.b": 1}})),
            40
        );
        assert_eq!(code(upd(doc! {"_id": 1}, doc! {"$set": {"_id": 2}})), 66);
        assert_eq!(code(upd(doc! {"_id": 1}, doc! {"$set": {"_id": 1}})), 0);
    }

    #[test]
    fn replacement_keeps_id_first_and_rejects_id_change() {
        let (d, _) = upd(doc! {"_id": 1, "a": 1}, doc! {"b": 2}).expect("ok");
        assert_eq!(d, doc! {"_id": 1, "b": 2});
        let (d, _) = upd(doc! {"_id": 1, "a": 1}, doc! {"b": 2, "_id": 1}).expect("ok");
        assert_eq!(d, doc! {"_id": 1, "b": 2});
        assert_eq!(code(upd(doc! {"_id": 1}, doc! {"_id": 2})), 66);
    }

    #[test]
    fn pipeline_updates() {
        let mut d = doc! {"_id": 1, "a": 2, "b": 3};
        let stages = vec![
            doc! {"$set": {"c": {"$add": ["$a", "$b"]}}},
            doc! {"$unset": "a"},
        ];
        let changed = apply_update(
            &mut d,
            &UpdateModification::Pipeline(stages),
            &UpdateContext::default(),
        )
        .expect("ok");
        assert!(changed);
        assert_eq!(d, doc! {"_id": 1, "b": 3, "c": 5});
        let mut d = doc! {"_id": 1, "x": {"y": 1}};
        apply_update(
            &mut d,
            &UpdateModification::Pipeline(vec![doc! {"$replaceWith": "$x"}]),
            &UpdateContext::default(),
        )
        .expect("ok");
        assert_eq!(d, doc! {"_id": 1, "y": 1});
    }

    #[test]
    fn upsert_seed_uses_equality_conditions() {
        let seed = upsert_seed(
            &doc! {"a": 1, "b.c": {"$eq": 2}, "d": {"$gt": 1}, "$and": [{"e": 3}], "_id": 7},
        )
        .expect("ok");
        assert_eq!(seed, doc! {"_id": 7, "a": 1, "b": {"c": 2}, "e": 3});
        let seed = upsert_seed(&doc! {"x": {"$in": [5]}, "y": {"$in": [1, 2]}, "$or": [{"z": 1}]})
            .expect("ok");
        assert_eq!(seed, doc! {"x": 5, "z": 1});
        let seed = upsert_seed(&doc! {"$or": [{"z": 1}, {"w": 2}]}).expect("ok");
        assert_eq!(seed, doc! {});
    }

    #[test]
    fn set_on_insert_applies_only_on_insert() {
        let u = UpdateModification::Document(doc! {"$setOnInsert": {"x": 1}, "$set": {"y": 1}});
        let mut d = doc! {"_id": 1};
        apply_update(&mut d, &u, &UpdateContext::default()).expect("ok");
        assert_eq!(d, doc! {"_id": 1, "y": 1});
        let mut d = doc! {"_id": 1};
        apply_update(
            &mut d,
            &u,
            &UpdateContext {
                is_insert: true,
                ..Default::default()
            },
        )
        .expect("ok");
        assert_eq!(d, doc! {"_id": 1, "x": 1, "y": 1});
    }
}
