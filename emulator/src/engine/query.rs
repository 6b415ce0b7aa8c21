//! Query filter matching (`find`, `update`, `delete`, `$match`, ...).

use std::cmp::Ordering;

use bson::{Bson, Document};
use regex::Regex;

use super::compare::{compare_bson, type_rank};
use super::expression::{evaluate, is_truthy};
use super::limits::check_depth;
use super::path::{lookup, Found};
use super::pattern::compile_regex;
use super::value::Num;
use super::{EngineError, EngineResult};

/// Whether `doc` matches the query `filter`.
///
/// Supports implicit equality (with array element matching and whole-array equality), dotted
/// paths through documents and arrays (numeric components index arrays), `$eq $ne $gt $gte $lt
/// $lte $in $nin $exists $type $and $or $nor $not $regex $options $elemMatch $size $all $mod
/// $expr $comment`. `null` matches missing fields. Malformed filters fail with 2 BadValue (e.g.
/// `unknown operator: $foo`); filters nested deeper than [`super::MAX_DEPTH`] fail with 15.
pub fn matches(filter: &Document, doc: &Document) -> EngineResult<bool> {
    check_depth(filter)?;
    match_document(filter, doc)
}

/// [`matches()`] without the depth check, for callers that validated the filter already.
pub(crate) fn match_document(filter: &Document, doc: &Document) -> EngineResult<bool> {
    for (key, cond) in filter {
        if !match_top_level(key, cond, doc)? {
            return Ok(false);
        }
    }
    Ok(true)
}

fn match_top_level(key: &str, cond: &Bson, doc: &Document) -> EngineResult<bool> {
    match key {
        "$and" | "$or" | "$nor" => {
            let clauses = logical_clauses(key, cond)?;
            let mut results = clauses.iter().map(|c| match_document(c, doc));
            match key {
                "$and" => all_ok(&mut results),
                "$or" => any_ok(&mut results),
                _ => any_ok(&mut results).map(|b| !b),
            }
        }
        "$expr" => Ok(is_truthy(&evaluate(cond, doc)?)),
        "$comment" => Ok(true),
        "$alwaysTrue" => Ok(true),
        "$alwaysFalse" => Ok(false),
        _ if key.starts_with('$') => Err(EngineError::bad_value(format!(
            "unknown top level operator: {key}"
        ))),
        _ => match_field(&lookup(doc, key), cond),
    }
}

fn all_ok(it: &mut dyn Iterator<Item = EngineResult<bool>>) -> EngineResult<bool> {
    for r in it {
        if !r? {
            return Ok(false);
        }
    }
    Ok(true)
}

fn any_ok(it: &mut dyn Iterator<Item = EngineResult<bool>>) -> EngineResult<bool> {
    for r in it {
        if r? {
            return Ok(true);
        }
    }
    Ok(false)
}

fn logical_clauses<'a>(op: &str, cond: &'a Bson) -> EngineResult<Vec<&'a Document>> {
    let Bson::Array(items) = cond else {
        return Err(EngineError::bad_value(format!("{op} must be an array")));
    };
    if items.is_empty() {
        return Err(EngineError::bad_value(
            "$and/$or/$nor must be a nonempty array",
        ));
    }
    items
        .iter()
        .map(|i| match i {
            Bson::Document(d) => Ok(d),
            _ => Err(EngineError::bad_value(
                "$or/$and/$nor entries need to be full objects",
            )),
        })
        .collect()
}

/// Whether a document value is an operator document (`{$gt: 1}`) rather than a literal; DBRef
/// fields are literals.
pub(crate) fn is_operator_doc(d: &Document) -> bool {
    d.keys()
        .next()
        .is_some_and(|k| k.starts_with('$') && !matches!(k.as_str(), "$ref" | "$id" | "$db"))
}

/// Matches the values found at one path against a condition (literal, regex or operators).
fn match_field(found: &[Found<'_>], cond: &Bson) -> EngineResult<bool> {
    match cond {
        Bson::Document(ops) if is_operator_doc(ops) => match_operators(found, ops),
        Bson::RegularExpression(re) => {
            let compiled = compile_regex(&re.pattern, &re.options)?;
            Ok(regex_any(found, &compiled, cond))
        }
        _ => Ok(eq_any(found, cond)),
    }
}

/// Matches a single value against a condition, as `$elemMatch` (value form) and `$pull` do.
pub(crate) fn match_value(value: &Bson, cond: &Bson) -> EngineResult<bool> {
    let mut found = vec![Found::Present {
        value,
        from_array: false,
    }];
    if let Bson::Array(items) = value {
        found.extend(items.iter().map(|value| Found::Present {
            value,
            from_array: true,
        }));
    }
    match_field(&found, cond)
}

fn match_operators(found: &[Found<'_>], ops: &Document) -> EngineResult<bool> {
    for (op, arg) in ops {
        let ok = match op.as_str() {
            "$eq" => eq_any(found, arg),
            "$ne" => !eq_any(found, arg),
            "$gt" => cmp_any(found, arg, |o| o == Ordering::Greater),
            "$gte" => cmp_any(found, arg, |o| o != Ordering::Less),
            "$lt" => cmp_any(found, arg, |o| o == Ordering::Less),
            "$lte" => cmp_any(found, arg, |o| o != Ordering::Greater),
            "$in" => in_any(found, arg)?,
            "$nin" => !in_any(found, arg)?,
            "$exists" => {
                let exists = found.iter().any(|f| matches!(f, Found::Present { .. }));
                exists == is_truthy(arg)
            }
            "$type" => type_any(found, arg)?,
            "$size" => size_any(found, arg)?,
            "$all" => all_match(found, arg)?,
            "$elemMatch" => elem_match_any(found, arg)?,
            "$mod" => mod_any(found, arg)?,
            "$regex" => {
                let options = match ops.get("$options") {
                    Some(Bson::String(s)) => s.as_str(),
                    Some(_) => return Err(EngineError::bad_value("$options has to be a string")),
                    None => "",
                };
                let (pattern, inline_opts) = match arg {
                    Bson::String(s) => (s.as_str(), ""),
                    Bson::RegularExpression(r) => (r.pattern.as_str(), r.options.as_str()),
                    _ => return Err(EngineError::bad_value("$regex has to be a string")),
                };
                let all_opts = format!("{inline_opts}{options}");
                let compiled = compile_regex(pattern, &all_opts)?;
                regex_any(found, &compiled, &Bson::Null)
            }
            "$options" => {
                if !ops.contains_key("$regex") {
                    return Err(EngineError::bad_value("$options needs a $regex"));
                }
                true
            }
            "$not" => match arg {
                Bson::Document(inner) if !inner.is_empty() && is_operator_doc(inner) => {
                    !match_operators(found, inner)?
                }
                Bson::Document(inner) if inner.is_empty() => {
                    return Err(EngineError::bad_value("$not cannot be empty"));
                }
                Bson::RegularExpression(_) => !match_field(found, arg)?,
                _ => return Err(EngineError::bad_value("$not needs a regex or a document")),
            },
            "$comment" => true,
            _ => return Err(EngineError::bad_value(format!("unknown operator: {op}"))),
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

fn is_nullish(v: &Bson) -> bool {
    matches!(v, Bson::Null | Bson::Undefined)
}

/// Equality with `target`: `null` also matches missing fields; arrays match element-wise and
/// as a whole.
fn eq_any(found: &[Found<'_>], target: &Bson) -> bool {
    if is_nullish(target) {
        return found.iter().any(|f| match f {
            Found::Missing => true,
            Found::Present { value, .. } => is_nullish(value),
        });
    }
    found.iter().any(|f| match f {
        Found::Present { value, .. } => {
            type_rank(value) == type_rank(target) && compare_bson(value, target) == Ordering::Equal
        }
        Found::Missing => false,
    })
}

/// Range comparison with type bracketing: only values of the target's canonical type compare,
/// except that MinKey/MaxKey targets compare with everything.
fn cmp_any(found: &[Found<'_>], target: &Bson, accept: impl Fn(Ordering) -> bool) -> bool {
    let unbracketed = matches!(target, Bson::MinKey | Bson::MaxKey);
    found.iter().any(|f| {
        let value = match f {
            Found::Present { value, .. } => *value,
            Found::Missing => &Bson::Null,
        };
        if !unbracketed && type_rank(value) != type_rank(target) {
            return false;
        }
        accept(compare_bson(value, target))
    })
}

fn in_any(found: &[Found<'_>], arg: &Bson) -> EngineResult<bool> {
    let Bson::Array(items) = arg else {
        return Err(EngineError::bad_value("$in needs an array"));
    };
    for item in items {
        let hit = match item {
            Bson::RegularExpression(re) => {
                regex_any(found, &compile_regex(&re.pattern, &re.options)?, item)
            }
            Bson::Document(d) if is_operator_doc(d) => {
                return Err(EngineError::bad_value("cannot nest $ under $in"));
            }
            _ => eq_any(found, item),
        };
        if hit {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Regex matching over strings and symbols; a stored regex equal to `literal` also matches.
fn regex_any(found: &[Found<'_>], re: &Regex, literal: &Bson) -> bool {
    found.iter().any(|f| match f {
        Found::Present {
            value: Bson::String(s) | Bson::Symbol(s),
            ..
        } => re.is_match(s),
        Found::Present {
            value: v @ Bson::RegularExpression(_),
            ..
        } => compare_bson(v, literal) == Ordering::Equal,
        _ => false,
    })
}

/// A type code or alias accepted by `$type`, resolved to a predicate.
fn type_matches(value: &Bson, spec: &Bson) -> EngineResult<bool> {
    let code: i64 = match spec {
        Bson::String(alias) => match alias.as_str() {
            "double" => 1,
            "string" => 2,
            "object" => 3,
            "array" => 4,
            "binData" => 5,
            "undefined" => 6,
            "objectId" => 7,
            "bool" => 8,
            "date" => 9,
            "null" => 10,
            "regex" => 11,
            "dbPointer" => 12,
            "javascript" => 13,
            "symbol" => 14,
            "javascriptWithScope" => 15,
            "int" => 16,
            "timestamp" => 17,
            "long" => 18,
            "decimal" => 19,
            "minKey" => -1,
            "maxKey" => 127,
            "number" => return Ok(Num::of(value).is_some()),
            other => {
                return Err(EngineError::bad_value(format!(
                    "Unknown type name alias: {other}"
                )))
            }
        },
        other => match Num::of(other) {
            Some(n) => {
                let f = n.as_f64();
                if f.fract() != 0.0 {
                    return Err(EngineError::bad_value(format!(
                        "Invalid numerical type code: {f}"
                    )));
                }
                f as i64
            }
            None => {
                return Err(EngineError::type_mismatch(
                    "type must be represented as a number or a string",
                ))
            }
        },
    };
    let actual = match value {
        Bson::Double(_) => 1,
        Bson::String(_) => 2,
        Bson::Document(_) => 3,
        Bson::Array(_) => 4,
        Bson::Binary(_) => 5,
        Bson::Undefined => 6,
        Bson::ObjectId(_) => 7,
        Bson::Boolean(_) => 8,
        Bson::DateTime(_) => 9,
        Bson::Null => 10,
        Bson::RegularExpression(_) => 11,
        Bson::DbPointer(_) => 12,
        Bson::JavaScriptCode(_) => 13,
        Bson::Symbol(_) => 14,
        Bson::JavaScriptCodeWithScope(_) => 15,
        Bson::Int32(_) => 16,
        Bson::Timestamp(_) => 17,
        Bson::Int64(_) => 18,
        Bson::Decimal128(_) => 19,
        Bson::MinKey => -1,
        Bson::MaxKey => 127,
    };
    if !matches!(code, -1 | 1..=19 | 127) {
        return Err(EngineError::bad_value(format!(
            "Invalid numerical type code: {code}"
        )));
    }
    Ok(actual == code)
}

fn type_any(found: &[Found<'_>], arg: &Bson) -> EngineResult<bool> {
    let specs: Vec<&Bson> = match arg {
        Bson::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    // Validate every spec even when there is nothing to test it against.
    for spec in &specs {
        type_matches(&Bson::Null, spec)?;
    }
    for f in found {
        let Found::Present { value, from_array } = f else {
            continue;
        };
        for spec in &specs {
            // Elements of an unwound array are not arrays "at the path"; mongod only reports
            // `$type: "array"` for the field itself (or nested arrays inside it).
            let is_array_spec = matches!(spec, Bson::String(s) if s == "array")
                || Num::of(spec).is_some_and(|n| n.as_f64() == 4.0);
            if is_array_spec && *from_array && !matches!(value, Bson::Array(_)) {
                continue;
            }
            if type_matches(value, spec)? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

fn size_any(found: &[Found<'_>], arg: &Bson) -> EngineResult<bool> {
    let n = match Num::of(arg) {
        Some(Num::Int(i)) => i,
        Some(Num::Float(f)) if f.fract() == 0.0 && f.is_finite() => f as i64,
        Some(_) => return Err(EngineError::bad_value("$size must be a whole number")),
        None => return Err(EngineError::bad_value("$size needs a number")),
    };
    if n < 0 {
        return Err(EngineError::bad_value("$size may not be negative"));
    }
    Ok(found.iter().any(|f| {
        matches!(f, Found::Present { value: Bson::Array(items), from_array: false } if items.len() as i64 == n)
    }))
}

fn all_match(found: &[Found<'_>], arg: &Bson) -> EngineResult<bool> {
    let Bson::Array(items) = arg else {
        return Err(EngineError::bad_value("$all needs an array"));
    };
    if items.is_empty() {
        return Ok(false);
    }
    for item in items {
        let ok = match item {
            Bson::Document(d) if d.keys().next().is_some_and(|k| k == "$elemMatch") => {
                match_operators(found, d)?
            }
            Bson::Document(d) if is_operator_doc(d) => {
                return Err(EngineError::bad_value("no $ expressions in $all"));
            }
            _ => match_field(found, item)?,
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

fn elem_match_any(found: &[Found<'_>], arg: &Bson) -> EngineResult<bool> {
    let Bson::Document(spec) = arg else {
        return Err(EngineError::bad_value("$elemMatch needs an Object"));
    };
    // Document form unless the first key is a value operator: `{$elemMatch: {a: 1}}` and
    // `{$elemMatch: {$or: [...]}}` query the elements as documents.
    let value_form = spec.keys().next().is_some_and(|k| {
        k.starts_with('$') && !matches!(k.as_str(), "$and" | "$or" | "$nor" | "$expr" | "$where")
    });
    for f in found {
        let Found::Present {
            value: Bson::Array(items),
            from_array: false,
        } = f
        else {
            continue;
        };
        for item in items {
            let ok = if value_form {
                match_value(item, arg)?
            } else {
                match item {
                    Bson::Document(d) => match_document(spec, d)?,
                    _ => false,
                }
            };
            if ok {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

fn mod_any(found: &[Found<'_>], arg: &Bson) -> EngineResult<bool> {
    let Bson::Array(items) = arg else {
        return Err(EngineError::bad_value(
            "malformed mod, needs to be an array",
        ));
    };
    if items.len() < 2 {
        return Err(EngineError::bad_value("malformed mod, not enough elements"));
    }
    if items.len() > 2 {
        return Err(EngineError::bad_value("malformed mod, too many elements"));
    }
    let as_int = |v: &Bson| -> EngineResult<i64> {
        match Num::of(v) {
            Some(Num::Int(i)) => Ok(i),
            Some(Num::Float(f)) if f.is_finite() => Ok(f.trunc() as i64),
            Some(_) => Err(EngineError::bad_value(
                "malformed mod, divisor value is invalid",
            )),
            None => Err(EngineError::bad_value(
                "malformed mod, divisor not a number",
            )),
        }
    };
    let divisor = as_int(&items[0])?;
    let remainder = as_int(&items[1])?;
    if divisor == 0 {
        return Err(EngineError::bad_value("divisor cannot be 0"));
    }
    Ok(found.iter().any(|f| match f {
        Found::Present { value, .. } => match Num::of(value) {
            Some(Num::Int(i)) => i.wrapping_rem(divisor) == remainder,
            Some(Num::Float(x)) if x.is_finite() => {
                (x.trunc() as i64).wrapping_rem(divisor) == remainder
            }
            _ => false,
        },
        Found::Missing => false,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, Regex as BsonRegex};

    fn m(filter: Document, d: Document) -> bool {
        matches(&filter, &d).expect("valid filter")
    }

    #[test]
    fn implicit_equality_matches_elements_and_whole_arrays() {
        assert!(m(doc! {"a": 2}, doc! {"a": [1, 2]}));
        assert!(m(doc! {"a": [1, 2]}, doc! {"a": [1, 2]}));
        assert!(!m(doc! {"a": [2, 1]}, doc! {"a": [1, 2]}));
        assert!(m(doc! {"a": [1]}, doc! {"a": [[1], 2]}));
        assert!(!m(doc! {"a": 1}, doc! {"a": [[1]]}));
    }

    #[test]
    fn numbers_are_equal_across_types() {
        assert!(m(doc! {"a": 1.0}, doc! {"a": 1i64}));
        assert!(m(doc! {"a": {"$in": [5, 1i64]}}, doc! {"a": 1}));
        assert!(!m(doc! {"a": "1"}, doc! {"a": 1}));
    }

    #[test]
    fn null_matches_missing_and_null_but_exists_distinguishes() {
        assert!(m(doc! {"a": null}, doc! {"b": 1}));
        assert!(m(doc! {"a": null}, doc! {"a": null}));
        assert!(!m(doc! {"a": null}, doc! {"a": 0}));
        assert!(m(doc! {"a": {"$exists": false}}, doc! {"b": 1}));
        assert!(!m(doc! {"a": {"$exists": false}}, doc! {"a": null}));
        assert!(m(doc! {"a": {"$ne": null}}, doc! {"a": 1}));
        assert!(!m(doc! {"a": {"$ne": null}}, doc! {"b": 1}));
    }

    #[test]
    fn dotted_paths_reach_into_documents_and_arrays() {
        let d = doc! {"a": {"b": [{"c": 1}, {"c": 5}]}, "x": [10, 20]};
        assert!(m(doc! {"a.b.c": 5}, d.clone()));
        assert!(m(doc! {"a.b.1.c": 5}, d.clone()));
        assert!(!m(doc! {"a.b.0.c": 5}, d.clone()));
        assert!(m(doc! {"x.1": 20}, d.clone()));
        assert!(m(doc! {"a.b.c": {"$gt": 4}}, d));
    }

    #[test]
    fn comparisons_respect_type_brackets() {
        assert!(m(doc! {"a": {"$gt": 1}}, doc! {"a": 2.5}));
        assert!(!m(doc! {"a": {"$gt": 1}}, doc! {"a": "zzz"}));
        assert!(m(doc! {"a": {"$lt": "b"}}, doc! {"a": "a"}));
        assert!(m(doc! {"a": {"$gte": 2, "$lte": 2}}, doc! {"a": [1, 2, 3]}));
        assert!(m(doc! {"a": {"$gte": null}}, doc! {}));
        assert!(m(doc! {"a": {"$gt": Bson::MinKey}}, doc! {"a": "s"}));
    }

    #[test]
    fn logical_operators_combine() {
        let d = doc! {"a": 1, "b": 2};
        assert!(m(doc! {"$or": [{"a": 5}, {"b": 2}]}, d.clone()));
        assert!(!m(doc! {"$and": [{"a": 1}, {"b": 3}]}, d.clone()));
        assert!(m(doc! {"$nor": [{"a": 5}, {"b": 3}]}, d.clone()));
        assert!(m(doc! {"a": {"$not": {"$gt": 3}}}, d.clone()));
        assert!(m(doc! {"c": {"$not": {"$gt": 3}}}, d.clone()));
        assert!(!m(doc! {"a": {"$nin": [1, 2]}}, d));
    }

    #[test]
    fn type_accepts_codes_and_aliases() {
        assert!(m(doc! {"a": {"$type": "string"}}, doc! {"a": "x"}));
        assert!(m(doc! {"a": {"$type": 2}}, doc! {"a": "x"}));
        assert!(m(doc! {"a": {"$type": "number"}}, doc! {"a": 5i64}));
        assert!(m(doc! {"a": {"$type": ["int", "long"]}}, doc! {"a": 5i64}));
        assert!(!m(doc! {"a": {"$type": "double"}}, doc! {"a": 5}));
        assert!(m(doc! {"a": {"$type": "array"}}, doc! {"a": [1]}));
        assert!(!m(doc! {"a": {"$type": "array"}}, doc! {"a": 1}));
        assert!(m(doc! {"a": {"$type": "int"}}, doc! {"a": [1]}));
        assert!(!m(doc! {"a": {"$type": "null"}}, doc! {}));
        assert_eq!(
            matches(&doc! {"a": {"$type": "nope"}}, &doc! {}).map_err(|e| e.code),
            Err(2)
        );
    }

    #[test]
    fn regex_supports_options_and_bson_regex() {
        assert!(m(
            doc! {"a": {"$regex": "^ab", "$options": "i"}},
            doc! {"a": "ABC"}
        ));
        assert!(m(
            doc! {"a": BsonRegex { pattern: "b".into(), options: String::new() }},
            doc! {"a": ["x", "abc"]}
        ));
        assert!(!m(doc! {"a": {"$regex": "^b"}}, doc! {"a": "abc"}));
        assert!(m(
            doc! {"a": {"$in": [BsonRegex { pattern: "^z".into(), options: String::new() }, 5]}},
            doc! {"a": "zed"}
        ));
        assert!(m(
            doc! {"a": {"$not": BsonRegex { pattern: "^z".into(), options: String::new() }}},
            doc! {"a": "a"}
        ));
    }

    #[test]
    fn array_operators() {
        let d = doc! {"a": [1, 2, 3], "r": [{"k": 1, "v": 5}, {"k": 2, "v": 9}]};
        assert!(m(doc! {"a": {"$size": 3}}, d.clone()));
        assert!(!m(doc! {"a": {"$size": 2}}, d.clone()));
        assert!(m(doc! {"a": {"$all": [3, 1]}}, d.clone()));
        assert!(!m(doc! {"a": {"$all": [3, 4]}}, d.clone()));
        assert!(m(
            doc! {"a": {"$elemMatch": {"$gt": 2, "$lt": 4}}},
            d.clone()
        ));
        assert!(!m(doc! {"a": {"$elemMatch": {"$gt": 3}}}, d.clone()));
        assert!(m(
            doc! {"r": {"$elemMatch": {"k": 2, "v": {"$gt": 8}}}},
            d.clone()
        ));
        assert!(!m(doc! {"r": {"$elemMatch": {"k": 1, "v": 9}}}, d.clone()));
        assert!(m(
            doc! {"r": {"$all": [{"$elemMatch": {"k": 1}}]}},
            d.clone()
        ));
        assert!(m(doc! {"a": {"$mod": [2, 1]}}, d));
    }

    #[test]
    fn malformed_filters_fail_with_bad_value() {
        for filter in [
            doc! {"a": {"$foo": 1}},
            doc! {"$foo": 1},
            doc! {"$or": []},
            doc! {"$and": [1]},
            doc! {"a": {"$in": 1}},
            doc! {"a": {"$mod": [0, 1]}},
            doc! {"a": {"$not": 1}},
            doc! {"a": {"$options": "i"}},
            doc! {"a": {"$regex": "("}},
        ] {
            let err = matches(&filter, &doc! {"a": 1}).expect_err("malformed");
            assert_eq!(err.code, 2, "{filter:?}: {err}");
        }
        let err = matches(&doc! {"a": {"$foo": 1}}, &doc! {}).expect_err("unknown");
        assert_eq!(err.message, "unknown operator: $foo");
    }

    #[test]
    fn literal_documents_compare_exactly() {
        assert!(m(
            doc! {"a": {"b": 1, "c": 2}},
            doc! {"a": {"b": 1, "c": 2}}
        ));
        assert!(!m(doc! {"a": {"b": 1}}, doc! {"a": {"b": 1, "c": 2}}));
        assert!(!m(
            doc! {"a": {"c": 2, "b": 1}},
            doc! {"a": {"b": 1, "c": 2}}
        ));
    }

    #[test]
    fn expr_compares_fields() {
        assert!(m(
            doc! {"$expr": {"$gt": ["$a", "$b"]}},
            doc! {"a": 5, "b": 2}
        ));
        assert!(!m(
            doc! {"$expr": {"$gt": ["$a", "$b"]}},
            doc! {"a": 1, "b": 2}
        ));
    }
}
