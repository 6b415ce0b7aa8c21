//! The unified format's matching rules: how an expected value (from a test file) is compared with
//! an actual value (a result, an event, a document in a collection).
//!
//! * A root-level document may hold fields the expectation does not mention; a nested one may
//!   not. An array's elements are nested values ([`match_root`]), except in the one place the
//!   format says otherwise: the documents an iterable result yields (`find`, `aggregate`, the
//!   `list*` operations, `runCursorCommand`) are each root-level ([`match_root_documents`]). So
//!   `[{x: 1}]` matches a `find` that returned `[{x: 1, y: 1}]`, but not a `distinct` that did.
//! * Numbers compare by value across int32, int64 and double.
//! * Special operators: `$$exists`, `$$type`, `$$unsetOrMatches`, `$$matchesEntity`,
//!   `$$matchesHexBytes`, `$$sessionLsid`, `$$lte`, `$$matchAsDocument`, `$$matchAsRoot`.
//!
//! A mismatch reports the path where it was found (`$.cursor.firstBatch[0]._id`).
//!
//! The final contents of collections (`outcome`) are not matched by these rules: the format
//! says they "MUST match exactly", so [`match_exact`] compares types exactly, allows no extra
//! fields anywhere and knows no operators; only the order of a document's keys may differ.

use std::fmt;

use bson::{Bson, Document};

/// The entities the operators `$$matchesEntity` and `$$sessionLsid` look up.
pub trait EntityLookup {
    /// A BSON value stored as an entity (a saved result).
    fn bson_entity(&self, id: &str) -> Option<Bson>;
    /// The logical session id of a session entity.
    fn session_lsid(&self, id: &str) -> Option<Document>;
}

/// No entities at all: for matching outside a test (e.g. unit tests, outcome checks).
pub struct NoEntities;

impl EntityLookup for NoEntities {
    fn bson_entity(&self, _: &str) -> Option<Bson> {
        None
    }
    fn session_lsid(&self, _: &str) -> Option<Document> {
        None
    }
}

/// Where and why an actual value did not match.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    pub path: String,
    pub message: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at {}: {}", self.path, self.message)
    }
}

impl std::error::Error for Mismatch {}

type MatchResult = Result<(), Mismatch>;

/// Matches `actual` against `expected` as a root-level value.
pub fn match_root(expected: &Bson, actual: &Bson, entities: &dyn EntityLookup) -> MatchResult {
    Matcher { entities }.value(expected, Some(actual), true, "$")
}

/// Matches the documents an iterable result yielded: `expected` is an array whose document
/// elements are each matched as a root-level document. Anything else in `expected` (an operator
/// such as `$$unsetOrMatches`, a scalar) is matched as by [`match_root`].
pub fn match_root_documents(
    expected: &Bson,
    actual: &Bson,
    entities: &dyn EntityLookup,
) -> MatchResult {
    let matcher = Matcher { entities };
    match (expected, actual) {
        (Bson::Array(exp), Bson::Array(act)) => {
            matcher.same_length(exp, act, actual, "$")?;
            for (i, (e, a)) in exp.iter().zip(act).enumerate() {
                matcher.value(e, Some(a), true, &format!("$[{i}]"))?;
            }
            Ok(())
        }
        _ => matcher.value(expected, Some(actual), true, "$"),
    }
}

/// Matches a value that may be absent (`None`) as a root-level value: only `$$exists: false` and
/// `$$unsetOrMatches` accept an absent value.
pub fn match_root_optional(
    expected: &Bson,
    actual: Option<&Bson>,
    entities: &dyn EntityLookup,
) -> MatchResult {
    Matcher { entities }.value(expected, actual, true, "$")
}

/// Matches `actual` against `expected` as a nested (non-root) value.
pub fn match_nested(expected: &Bson, actual: &Bson, entities: &dyn EntityLookup) -> MatchResult {
    Matcher { entities }.value(expected, Some(actual), false, "$")
}

/// Matches a document as a root-level document (extra fields allowed).
pub fn match_root_document(
    expected: &Document,
    actual: &Document,
    entities: &dyn EntityLookup,
) -> MatchResult {
    Matcher { entities }.document(expected, actual, true, "$")
}

/// Compares a collection's final contents with `outcome` exactly: the same BSON type at every
/// place (int32 is not int64 is not double), the same fields in every document, at any depth,
/// and arrays element by element. A `$$` key is an ordinary key here. Only document key order
/// may differ, as the format allows.
pub fn match_exact(expected: &Bson, actual: &Bson) -> MatchResult {
    exact(expected, actual, "$")
}

fn exact(expected: &Bson, actual: &Bson, path: &str) -> MatchResult {
    let fail = |message: String| {
        Err(Mismatch {
            path: path.to_string(),
            message,
        })
    };
    match (expected, actual) {
        (Bson::Document(exp), Bson::Document(act)) => {
            for (key, e) in exp {
                let child = format!("{path}.{key}");
                match act.get(key) {
                    Some(a) => exact(e, a, &child)?,
                    None => {
                        return Err(Mismatch {
                            path: child,
                            message: format!("expected {e}, found no value"),
                        })
                    }
                }
            }
            match act.keys().find(|k| !exp.contains_key(k.as_str())) {
                Some(extra) => Err(Mismatch {
                    path: format!("{path}.{extra}"),
                    message: format!(
                        "unexpected field (outcome documents must match exactly): {}",
                        describe(act.get(extra))
                    ),
                }),
                None => Ok(()),
            }
        }
        (Bson::Array(exp), Bson::Array(act)) => {
            if exp.len() != act.len() {
                return fail(format!(
                    "expected an array of {} elements, found {}: {}",
                    exp.len(),
                    act.len(),
                    describe(Some(actual))
                ));
            }
            for (i, (e, a)) in exp.iter().zip(act).enumerate() {
                exact(e, a, &format!("{path}[{i}]"))?;
            }
            Ok(())
        }
        _ if expected.element_type() != actual.element_type() => fail(format!(
            "expected {expected} ({}), found {} ({}): outcome types must match exactly",
            type_names(expected)[0],
            describe(Some(actual)),
            type_names(actual)[0]
        )),
        _ if expected == actual => Ok(()),
        _ => fail(format!(
            "expected {expected}, found {}",
            describe(Some(actual))
        )),
    }
}

/// A number's value, for the cross-type numeric comparison.
pub fn as_f64(value: &Bson) -> Option<f64> {
    match value {
        Bson::Int32(i) => Some(f64::from(*i)),
        Bson::Int64(i) => Some(*i as f64),
        Bson::Double(d) => Some(*d),
        _ => None,
    }
}

fn as_i64(value: &Bson) -> Option<i64> {
    match value {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        _ => None,
    }
}

/// Numeric equality: exact for integers, by value for doubles.
pub fn numbers_equal(a: &Bson, b: &Bson) -> Option<bool> {
    if let (Some(x), Some(y)) = (as_i64(a), as_i64(b)) {
        return Some(x == y);
    }
    Some(as_f64(a)? == as_f64(b)?)
}

/// The type names `$$type` accepts for a value (a value can have two: `int` and `number`).
pub fn type_names(value: &Bson) -> &'static [&'static str] {
    match value {
        Bson::Double(_) => &["double", "number"],
        Bson::String(_) => &["string"],
        Bson::Document(_) => &["object"],
        Bson::Array(_) => &["array"],
        Bson::Binary(_) => &["binData"],
        Bson::Undefined => &["undefined"],
        Bson::ObjectId(_) => &["objectId"],
        Bson::Boolean(_) => &["bool"],
        Bson::DateTime(_) => &["date"],
        Bson::Null => &["null"],
        Bson::RegularExpression(_) => &["regex"],
        Bson::DbPointer(_) => &["dbPointer"],
        Bson::JavaScriptCode(_) => &["javascript"],
        Bson::Symbol(_) => &["symbol"],
        Bson::JavaScriptCodeWithScope(_) => &["javascriptWithScope"],
        Bson::Int32(_) => &["int", "number"],
        Bson::Timestamp(_) => &["timestamp"],
        Bson::Int64(_) => &["long", "number"],
        Bson::Decimal128(_) => &["decimal", "number"],
        Bson::MinKey => &["minKey"],
        Bson::MaxKey => &["maxKey"],
    }
}

const KNOWN_TYPE_NAMES: &[&str] = &[
    "double",
    "string",
    "object",
    "array",
    "binData",
    "undefined",
    "objectId",
    "bool",
    "date",
    "null",
    "regex",
    "dbPointer",
    "javascript",
    "symbol",
    "javascriptWithScope",
    "int",
    "timestamp",
    "long",
    "decimal",
    "minKey",
    "maxKey",
    "number",
];

/// A document that is a single `$$operator` key.
fn special_operator(doc: &Document) -> Option<(&str, &Bson)> {
    if doc.len() != 1 {
        return None;
    }
    let (key, value) = doc.iter().next()?;
    key.starts_with("$$").then_some((key.as_str(), value))
}

fn describe(value: Option<&Bson>) -> String {
    match value {
        None => "no value".to_string(),
        Some(v) => {
            let mut text = v.to_string();
            if text.len() > 300 {
                let mut cut = 300;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                text.truncate(cut);
                text.push('…');
            }
            text
        }
    }
}

struct Matcher<'a> {
    entities: &'a dyn EntityLookup,
}

impl Matcher<'_> {
    fn fail(&self, path: &str, message: String) -> MatchResult {
        Err(Mismatch {
            path: path.to_string(),
            message,
        })
    }

    fn same_length(&self, exp: &[Bson], act: &[Bson], actual: &Bson, path: &str) -> MatchResult {
        if exp.len() == act.len() {
            return Ok(());
        }
        self.fail(
            path,
            format!(
                "expected an array of {} elements, found {}: {}",
                exp.len(),
                act.len(),
                describe(Some(actual))
            ),
        )
    }

    /// `actual` is `None` when the field is absent.
    fn value(&self, expected: &Bson, actual: Option<&Bson>, root: bool, path: &str) -> MatchResult {
        if let Bson::Document(doc) = expected {
            if let Some((op, arg)) = special_operator(doc) {
                return self.operator(op, arg, actual, root, path);
            }
        }
        let Some(actual) = actual else {
            return self.fail(path, format!("expected {expected}, found no value"));
        };
        match expected {
            Bson::Document(exp) => match actual {
                Bson::Document(act) => self.document(exp, act, root, path),
                other => self.fail(path, format!("expected a document, found {other}")),
            },
            Bson::Array(exp) => match actual {
                Bson::Array(act) => {
                    self.same_length(exp, act, actual, path)?;
                    // An array's elements are values, never root-level documents, even in a
                    // root-level array (a `distinct` result); `match_root_documents` is the
                    // exception for iterable results.
                    for (i, (e, a)) in exp.iter().zip(act).enumerate() {
                        self.value(e, Some(a), false, &format!("{path}[{i}]"))?;
                    }
                    Ok(())
                }
                other => self.fail(path, format!("expected an array, found {other}")),
            },
            _ => {
                let equal = numbers_equal(expected, actual).unwrap_or_else(|| expected == actual);
                if equal {
                    Ok(())
                } else {
                    self.fail(
                        path,
                        format!("expected {expected}, found {}", describe(Some(actual))),
                    )
                }
            }
        }
    }

    fn document(
        &self,
        expected: &Document,
        actual: &Document,
        root: bool,
        path: &str,
    ) -> MatchResult {
        for (key, exp) in expected {
            let child = format!("{path}.{key}");
            self.value(exp, actual.get(key), false, &child)?;
        }
        if !root {
            if let Some(extra) = actual.keys().find(|k| !expected.contains_key(k.as_str())) {
                return self.fail(
                    &format!("{path}.{extra}"),
                    format!(
                        "unexpected field in a nested document (only root-level documents may \
                         have extra fields): {}",
                        describe(actual.get(extra))
                    ),
                );
            }
        }
        Ok(())
    }

    fn operator(
        &self,
        op: &str,
        arg: &Bson,
        actual: Option<&Bson>,
        root: bool,
        path: &str,
    ) -> MatchResult {
        match op {
            "$$exists" => {
                let Bson::Boolean(want) = arg else {
                    return self.fail(path, format!("$$exists takes a boolean, got {arg}"));
                };
                match (want, actual) {
                    (true, None) => self.fail(path, "expected the field to exist".into()),
                    (false, Some(v)) => self.fail(
                        path,
                        format!(
                            "expected the field to be absent, found {}",
                            describe(Some(v))
                        ),
                    ),
                    _ => Ok(()),
                }
            }
            "$$unsetOrMatches" => match actual {
                None => Ok(()),
                Some(_) => self.value(arg, actual, root, path),
            },
            "$$type" => {
                let wanted: Vec<&str> = match arg {
                    Bson::String(s) => vec![s.as_str()],
                    Bson::Array(items) => items.iter().filter_map(Bson::as_str).collect(),
                    _ => {
                        return self
                            .fail(path, format!("$$type takes a string or array, got {arg}"))
                    }
                };
                if let Some(bad) = wanted.iter().find(|t| !KNOWN_TYPE_NAMES.contains(t)) {
                    return self.fail(path, format!("$$type: unknown type name {bad:?}"));
                }
                let Some(actual) = actual else {
                    return self.fail(
                        path,
                        format!("expected a value of type {wanted:?}, found none"),
                    );
                };
                if type_names(actual).iter().any(|t| wanted.contains(t)) {
                    Ok(())
                } else {
                    self.fail(
                        path,
                        format!(
                            "expected type {wanted:?}, found {} ({})",
                            type_names(actual)[0],
                            describe(Some(actual))
                        ),
                    )
                }
            }
            "$$matchesEntity" => {
                let Some(id) = arg.as_str() else {
                    return self.fail(
                        path,
                        format!("$$matchesEntity takes an entity name, got {arg}"),
                    );
                };
                let Some(entity) = self.entities.bson_entity(id) else {
                    return self.fail(
                        path,
                        format!("$$matchesEntity: no BSON entity named {id:?}"),
                    );
                };
                self.value(&entity, actual, root, path)
            }
            "$$matchesHexBytes" => {
                let Some(hex) = arg.as_str() else {
                    return self.fail(path, format!("$$matchesHexBytes takes a string, got {arg}"));
                };
                let Some(want) = decode_hex(hex) else {
                    return self.fail(path, format!("$$matchesHexBytes: {hex:?} is not hex"));
                };
                match actual {
                    Some(Bson::Binary(bin)) if bin.bytes == want => Ok(()),
                    other => self.fail(
                        path,
                        format!("expected binary data {hex}, found {}", describe(other)),
                    ),
                }
            }
            "$$sessionLsid" => {
                let Some(id) = arg.as_str() else {
                    return self.fail(
                        path,
                        format!("$$sessionLsid takes a session name, got {arg}"),
                    );
                };
                let Some(lsid) = self.entities.session_lsid(id) else {
                    return self.fail(
                        path,
                        format!("$$sessionLsid: no session entity named {id:?}"),
                    );
                };
                self.value(&Bson::Document(lsid), actual, false, path)
            }
            "$$lte" => {
                let Some(limit) = as_f64(arg) else {
                    return self.fail(path, format!("$$lte takes a number, got {arg}"));
                };
                match actual.and_then(as_f64) {
                    Some(v) if v <= limit => Ok(()),
                    _ => self.fail(
                        path,
                        format!("expected a number <= {arg}, found {}", describe(actual)),
                    ),
                }
            }
            "$$matchAsDocument" => {
                let Some(Bson::String(json)) = actual else {
                    return self.fail(
                        path,
                        format!(
                            "$$matchAsDocument needs a JSON string, found {}",
                            describe(actual)
                        ),
                    );
                };
                let parsed: Document = match serde_json::from_str(json) {
                    Ok(doc) => doc,
                    Err(e) => {
                        return self
                            .fail(path, format!("$$matchAsDocument: not a JSON document: {e}"))
                    }
                };
                self.value(arg, Some(&Bson::Document(parsed)), false, path)
            }
            "$$matchAsRoot" => {
                let Bson::Document(expected) = arg else {
                    return self.fail(path, format!("$$matchAsRoot takes a document, got {arg}"));
                };
                match actual {
                    Some(Bson::Document(act)) => self.document(expected, act, true, path),
                    other => self.fail(
                        path,
                        format!("expected a document, found {}", describe(other)),
                    ),
                }
            }
            other => self.fail(path, format!("unknown special operator {other}")),
        }
    }
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use bson::{doc, Binary};

    use super::*;

    #[derive(Default)]
    struct Entities {
        values: HashMap<String, Bson>,
        lsids: HashMap<String, Document>,
    }

    impl EntityLookup for Entities {
        fn bson_entity(&self, id: &str) -> Option<Bson> {
            self.values.get(id).cloned()
        }
        fn session_lsid(&self, id: &str) -> Option<Document> {
            self.lsids.get(id).cloned()
        }
    }

    fn root(expected: Document, actual: Document) -> MatchResult {
        match_root(
            &Bson::Document(expected),
            &Bson::Document(actual),
            &NoEntities,
        )
    }

    #[test]
    fn extra_fields_only_at_the_root() {
        assert!(root(doc! {"a": 1}, doc! {"a": 1, "b": 2}).is_ok());
        let err = root(doc! {"a": {"x": 1}}, doc! {"a": {"x": 1, "y": 2}}).unwrap_err();
        assert_eq!(err.path, "$.a.y");
    }

    #[test]
    fn only_iterable_results_hold_root_documents() {
        let exp = Bson::Array(vec![Bson::Document(doc! {"_id": 1})]);
        let act = Bson::Array(vec![Bson::Document(doc! {"_id": 1, "x": 2})]);
        // What `find` yields: each document is root-level, extra fields allowed.
        assert!(match_root_documents(&exp, &act, &NoEntities).is_ok());
        // A root-level array of values (`distinct`): its documents are nested values.
        let err = match_root(&exp, &act, &NoEntities).unwrap_err();
        assert_eq!(err.path, "$[0].x");
        assert!(match_nested(&exp, &act, &NoEntities).is_err());
        // Documents nested inside a yielded document stay nested.
        let exp = Bson::Array(vec![Bson::Document(doc! {"a": {"b": 1}})]);
        let act = Bson::Array(vec![Bson::Document(doc! {"a": {"b": 1, "c": 2}})]);
        assert_eq!(
            match_root_documents(&exp, &act, &NoEntities)
                .unwrap_err()
                .path,
            "$[0].a.c"
        );
        // The element count is still exact.
        let two = Bson::Array(vec![Bson::Document(doc! {}), Bson::Document(doc! {})]);
        assert!(match_root_documents(&Bson::Array(vec![]), &two, &NoEntities).is_err());
    }

    #[test]
    fn outcome_matching_is_exact() {
        let exact = |e: Document, a: Document| match_exact(&Bson::Document(e), &Bson::Document(a));
        assert!(exact(
            doc! {"_id": 1, "x": {"y": [1, "a"]}},
            doc! {"x": {"y": [1, "a"]}, "_id": 1}
        )
        .is_ok());
        // Numeric types must agree: the evaluating matcher would accept each of these.
        let err = exact(doc! {"_id": 1, "n": 1}, doc! {"_id": 1, "n": 1_i64}).unwrap_err();
        assert_eq!(err.path, "$.n");
        assert!(exact(doc! {"n": 1_i64}, doc! {"n": 1.0}).is_err());
        assert!(exact(doc! {"n": [1]}, doc! {"n": [1.0]}).is_err());
        // No extra fields, not even at the top of a document.
        let err = exact(doc! {"_id": 1}, doc! {"_id": 1, "x": 2}).unwrap_err();
        assert_eq!(err.path, "$.x");
        // Operators are not evaluated: `$$exists` is an ordinary key.
        assert!(exact(doc! {"x": {"$$exists": true}}, doc! {"x": 5}).is_err());
        assert!(exact(doc! {"x": {"$$type": "int"}}, doc! {"x": 5}).is_err());
        assert!(exact(doc! {"x": 1}, doc! {}).is_err());
    }

    #[test]
    fn numbers_compare_across_types() {
        assert!(root(doc! {"n": 1}, doc! {"n": 1_i64}).is_ok());
        assert!(root(doc! {"n": 1_i64}, doc! {"n": 1.0}).is_ok());
        assert!(root(doc! {"n": 1}, doc! {"n": 1.5}).is_err());
        assert!(root(doc! {"n": 1}, doc! {"n": "1"}).is_err());
    }

    #[test]
    fn missing_field_and_wrong_value_report_the_path() {
        let err = root(doc! {"a": {"b": [1, 2]}}, doc! {"a": {"b": [1, 3]}}).unwrap_err();
        assert_eq!(err.path, "$.a.b[1]");
        let err = root(doc! {"a": 1}, doc! {}).unwrap_err();
        assert_eq!(err.path, "$.a");
        let err = root(doc! {"a": [1]}, doc! {"a": [1, 2]}).unwrap_err();
        assert!(err.message.contains("1 elements, found 2"));
    }

    #[test]
    fn exists_operator() {
        assert!(root(doc! {"a": {"$$exists": true}}, doc! {"a": null}).is_ok());
        assert!(root(doc! {"a": {"$$exists": true}}, doc! {}).is_err());
        assert!(root(doc! {"a": {"$$exists": false}}, doc! {}).is_ok());
        assert!(root(doc! {"a": {"$$exists": false}}, doc! {"a": 1}).is_err());
    }

    #[test]
    fn type_operator_and_number_alias() {
        assert!(root(doc! {"a": {"$$type": "int"}}, doc! {"a": 1}).is_ok());
        assert!(root(doc! {"a": {"$$type": "long"}}, doc! {"a": 1}).is_err());
        assert!(root(doc! {"a": {"$$type": ["int", "long"]}}, doc! {"a": 1_i64}).is_ok());
        assert!(root(doc! {"a": {"$$type": "number"}}, doc! {"a": 2.5}).is_ok());
        assert!(root(doc! {"a": {"$$type": "number"}}, doc! {"a": "x"}).is_err());
        assert!(root(doc! {"a": {"$$type": "objectId"}}, doc! {}).is_err());
        let err = root(doc! {"a": {"$$type": "integer"}}, doc! {"a": 1}).unwrap_err();
        assert!(err.message.contains("unknown type name"));
    }

    #[test]
    fn unset_or_matches() {
        let exp = doc! {"a": {"$$unsetOrMatches": {"x": 1}}};
        assert!(root(exp.clone(), doc! {}).is_ok());
        assert!(root(exp.clone(), doc! {"a": {"x": 1}}).is_ok());
        assert!(root(exp, doc! {"a": {"x": 2}}).is_err());
    }

    #[test]
    fn lte_operator() {
        assert!(root(doc! {"a": {"$$lte": 5}}, doc! {"a": 5_i64}).is_ok());
        assert!(root(doc! {"a": {"$$lte": 5}}, doc! {"a": 6}).is_err());
        assert!(root(doc! {"a": {"$$lte": 5}}, doc! {}).is_err());
    }

    #[test]
    fn entity_operators() {
        let mut entities = Entities::default();
        entities.values.insert("saved".into(), Bson::Int32(7));
        entities.lsids.insert("session0".into(), doc! {"id": "abc"});
        let exp = Bson::Document(
            doc! {"v": {"$$matchesEntity": "saved"}, "lsid": {"$$sessionLsid": "session0"}},
        );
        let ok = Bson::Document(doc! {"v": 7_i64, "lsid": {"id": "abc"}});
        assert!(match_root(&exp, &ok, &entities).is_ok());
        let bad = Bson::Document(doc! {"v": 7, "lsid": {"id": "other"}});
        assert_eq!(
            match_root(&exp, &bad, &entities).unwrap_err().path,
            "$.lsid.id"
        );
        let missing = Bson::Document(doc! {"v": {"$$matchesEntity": "nope"}});
        assert!(match_root(&missing, &ok, &entities).is_err());
    }

    #[test]
    fn hex_bytes_operator() {
        let bin = Bson::Binary(Binary {
            subtype: bson::spec::BinarySubtype::Generic,
            bytes: vec![0x12, 0xab],
        });
        let exp = doc! {"b": {"$$matchesHexBytes": "12AB"}};
        assert!(match_root(
            &Bson::Document(exp),
            &Bson::Document(doc! {"b": bin}),
            &NoEntities
        )
        .is_ok());
    }

    #[test]
    fn match_as_document_and_root() {
        let actual = doc! {"json": "{\"x\": 1, \"y\": {\"$oid\": \"57e193d7a9cc81b4027498b5\"}}"};
        assert!(root(
            doc! {"json": {"$$matchAsDocument": {"x": 1_i64, "y": {"$$type": "objectId"}}}},
            actual.clone()
        )
        .is_ok());
        // The parsed document is nested: extra fields are not allowed unless $$matchAsRoot says so.
        assert!(root(
            doc! {"json": {"$$matchAsDocument": {"x": 1}}},
            actual.clone()
        )
        .is_err());
        assert!(root(
            doc! {"json": {"$$matchAsDocument": {"$$matchAsRoot": {"x": 1}}}},
            actual
        )
        .is_ok());
        assert!(root(
            doc! {"x": {"$$matchAsRoot": {"y": 2}}},
            doc! {"x": {"y": 2, "z": 3}}
        )
        .is_ok());
        assert!(root(
            doc! {"json": {"$$matchAsDocument": {}}},
            doc! {"json": "not json"}
        )
        .is_err());
    }

    #[test]
    fn absent_values() {
        let unset = Bson::Document(doc! {"$$unsetOrMatches": {"n": 1}});
        assert!(match_root_optional(&unset, None, &NoEntities).is_ok());
        let plain = Bson::Document(doc! {"n": 1});
        assert!(match_root_optional(&plain, None, &NoEntities).is_err());
    }

    #[test]
    fn unknown_operator_is_a_mismatch() {
        assert!(root(doc! {"a": {"$$bogus": 1}}, doc! {"a": 1}).is_err());
    }
}
