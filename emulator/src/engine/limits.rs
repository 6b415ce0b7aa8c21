//! Size and nesting limits applied to user input.

use bson::{Bson, Document};

use super::{EngineError, EngineResult};

/// mongod's maximum document size (16 MiB).
pub const MAX_BSON_SIZE: usize = 16 * 1024 * 1024;

/// Maximum nesting depth of user-supplied documents and expressions; the engine recurses over
/// user input, so this bounds its stack use.
pub const MAX_DEPTH: usize = 100;

/// Fails with 15 Overflow when `doc` nests deeper than [`MAX_DEPTH`]. The check itself stops
/// descending at the limit, so it is safe on arbitrarily deep input.
pub fn check_depth(doc: &Document) -> EngineResult<()> {
    if doc_depth_exceeds(doc, 1) {
        Err(EngineError::overflow(format!(
            "document nesting exceeds the maximum depth of {MAX_DEPTH}"
        )))
    } else {
        Ok(())
    }
}

/// [`check_depth`] for any value.
pub fn check_value_depth(v: &Bson) -> EngineResult<()> {
    if value_depth_exceeds(v, 0) {
        Err(EngineError::overflow(format!(
            "document nesting exceeds the maximum depth of {MAX_DEPTH}"
        )))
    } else {
        Ok(())
    }
}

fn doc_depth_exceeds(doc: &Document, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return true;
    }
    doc.values().any(|v| value_depth_exceeds(v, depth))
}

fn value_depth_exceeds(v: &Bson, depth: usize) -> bool {
    match v {
        Bson::Document(d) => doc_depth_exceeds(d, depth + 1),
        Bson::Array(a) => {
            if depth + 1 > MAX_DEPTH {
                return true;
            }
            a.iter().any(|x| value_depth_exceeds(x, depth + 1))
        }
        Bson::JavaScriptCodeWithScope(c) => doc_depth_exceeds(&c.scope, depth + 1),
        _ => false,
    }
}

/// Exact encoded size of `doc` in bytes, computed without serializing.
pub fn bson_size(doc: &Document) -> usize {
    // int32 length + elements + trailing NUL
    4 + doc
        .iter()
        .map(|(k, v)| 1 + k.len() + 1 + value_size(v))
        .sum::<usize>()
        + 1
}

fn array_size(a: &[Bson]) -> usize {
    let mut total = 5;
    for (i, v) in a.iter().enumerate() {
        total += 1 + decimal_len(i) + 1 + value_size(v);
    }
    total
}

fn decimal_len(mut i: usize) -> usize {
    let mut n = 1;
    while i >= 10 {
        i /= 10;
        n += 1;
    }
    n
}

fn value_size(v: &Bson) -> usize {
    match v {
        Bson::Double(_) | Bson::Int64(_) | Bson::DateTime(_) | Bson::Timestamp(_) => 8,
        Bson::Int32(_) => 4,
        Bson::Decimal128(_) => 16,
        Bson::String(s) | Bson::Symbol(s) | Bson::JavaScriptCode(s) => 4 + s.len() + 1,
        Bson::Document(d) => bson_size(d),
        Bson::Array(a) => array_size(a),
        Bson::Binary(b) => 4 + 1 + b.bytes.len() + if u8::from(b.subtype) == 2 { 4 } else { 0 },
        Bson::ObjectId(_) => 12,
        Bson::Boolean(_) => 1,
        Bson::Null | Bson::Undefined | Bson::MinKey | Bson::MaxKey => 0,
        Bson::RegularExpression(r) => r.pattern.len() + 1 + r.options.len() + 1,
        Bson::JavaScriptCodeWithScope(c) => 4 + 4 + c.code.len() + 1 + bson_size(&c.scope),
        // namespace string + ObjectId; the namespace is private in bson 2.x, so estimate.
        Bson::DbPointer(_) => 4 + 64 + 12,
    }
}

/// Fails with 10334 BSONObjectTooLarge when `doc` exceeds [`MAX_BSON_SIZE`].
pub fn check_size(doc: &Document) -> EngineResult<()> {
    let size = bson_size(doc);
    if size > MAX_BSON_SIZE {
        Err(EngineError::bson_object_too_large(format!(
            "object to insert too large. size in bytes: {size}, max size: {MAX_BSON_SIZE}"
        )))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn computed_size_matches_serialized_size() {
        let d = doc! {"a": 1, "b": "xyz", "c": [1, 2.5, {"d": null}], "e": bson::oid::ObjectId::new(),
        "f": bson::Regex { pattern: "a.*".into(), options: "i".into() }, "g": true, "h": 5i64};
        let bytes = bson::to_vec(&d).expect("serializable");
        assert_eq!(bson_size(&d), bytes.len());
    }

    #[test]
    fn deep_nesting_is_rejected_shallow_accepted() {
        let mut d = doc! {"x": 1};
        for _ in 0..MAX_DEPTH - 1 {
            d = doc! {"x": d};
        }
        assert!(check_depth(&d).is_ok());
        let deeper = doc! {"x": d};
        assert_eq!(check_depth(&deeper).map_err(|e| e.code), Err(15));
    }

    #[test]
    fn oversized_documents_are_rejected_with_10334() {
        let big = "x".repeat(MAX_BSON_SIZE);
        let err = check_size(&doc! {"s": big}).expect_err("too large");
        assert_eq!(err.code, 10334);
        assert_eq!(err.code_name, "BSONObjectTooLarge");
    }
}
