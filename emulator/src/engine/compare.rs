//! BSON comparison in mongod's type order, with numbers compared by value across types.

use std::cmp::Ordering;

use bson::{Bson, Document};

use super::value::Num;

/// mongod's canonical type rank: values of different ranks compare by rank alone.
pub(crate) fn type_rank(v: &Bson) -> u8 {
    match v {
        Bson::MinKey => 0,
        Bson::Undefined => 1,
        Bson::Null => 2,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => 3,
        Bson::String(_) | Bson::Symbol(_) => 4,
        Bson::Document(_) => 5,
        Bson::Array(_) => 6,
        Bson::Binary(_) => 7,
        Bson::ObjectId(_) => 8,
        Bson::Boolean(_) => 9,
        Bson::DateTime(_) => 10,
        Bson::Timestamp(_) => 11,
        Bson::RegularExpression(_) => 12,
        Bson::DbPointer(_) => 13,
        Bson::JavaScriptCode(_) => 14,
        Bson::JavaScriptCodeWithScope(_) => 15,
        Bson::MaxKey => 16,
    }
}

/// Compares an integer with a double exactly (no precision loss for large int64 values).
/// NaN sorts below every other number, as in mongod.
fn cmp_int_float(i: i64, f: f64) -> Ordering {
    if f.is_nan() {
        return Ordering::Greater;
    }
    // 2^63 as f64; i64 values all lie in [-2^63, 2^63).
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if f >= LIMIT {
        return Ordering::Less;
    }
    if f < -LIMIT {
        return Ordering::Greater;
    }
    let truncated = f.trunc();
    // In range, so the cast is exact.
    let whole = truncated as i64;
    match i.cmp(&whole) {
        Ordering::Equal => {
            let frac = f - truncated;
            if frac > 0.0 {
                Ordering::Less
            } else if frac < 0.0 {
                Ordering::Greater
            } else {
                Ordering::Equal
            }
        }
        other => other,
    }
}

fn cmp_float(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

pub(crate) fn cmp_num(a: Num, b: Num) -> Ordering {
    match (a, b) {
        (Num::Int(x), Num::Int(y)) => x.cmp(&y),
        (Num::Int(x), Num::Float(y)) => cmp_int_float(x, y),
        (Num::Float(x), Num::Int(y)) => cmp_int_float(y, x).reverse(),
        (Num::Float(x), Num::Float(y)) => cmp_float(x, y),
    }
}

/// Total order over BSON values as mongod sorts and compares them: first by canonical type
/// (MinKey < null < numbers < strings < objects < arrays < binData < ObjectId < bool < date <
/// timestamp < regex < ... < MaxKey), then by value. int32, int64 and double compare by
/// numeric value, so `1 == 1i64 == 1.0`. Strings compare bytewise, or under the collation
/// active on this thread (`collation::with_collation`).
pub fn compare_bson(a: &Bson, b: &Bson) -> Ordering {
    let (ra, rb) = (type_rank(a), type_rank(b));
    if ra != rb {
        return ra.cmp(&rb);
    }
    match (a, b) {
        _ if ra == 3 => match (Num::of(a), Num::of(b)) {
            (Some(x), Some(y)) => cmp_num(x, y),
            _ => Ordering::Equal,
        },
        _ if ra == 4 => super::collation::compare_strings(str_of(a), str_of(b)),
        (Bson::Document(x), Bson::Document(y)) => compare_documents(x, y),
        (Bson::Array(x), Bson::Array(y)) => compare_arrays(x, y),
        (Bson::Binary(x), Bson::Binary(y)) => x
            .bytes
            .len()
            .cmp(&y.bytes.len())
            .then_with(|| u8::from(x.subtype).cmp(&u8::from(y.subtype)))
            .then_with(|| x.bytes.cmp(&y.bytes)),
        (Bson::ObjectId(x), Bson::ObjectId(y)) => x.bytes().cmp(&y.bytes()),
        (Bson::Boolean(x), Bson::Boolean(y)) => x.cmp(y),
        (Bson::DateTime(x), Bson::DateTime(y)) => x.timestamp_millis().cmp(&y.timestamp_millis()),
        (Bson::Timestamp(x), Bson::Timestamp(y)) => {
            (x.time, x.increment).cmp(&(y.time, y.increment))
        }
        (Bson::RegularExpression(x), Bson::RegularExpression(y)) => x
            .pattern
            .cmp(&y.pattern)
            .then_with(|| x.options.cmp(&y.options)),
        (Bson::JavaScriptCode(x), Bson::JavaScriptCode(y)) => x.cmp(y),
        (Bson::JavaScriptCodeWithScope(x), Bson::JavaScriptCodeWithScope(y)) => x
            .code
            .cmp(&y.code)
            .then_with(|| compare_documents(&x.scope, &y.scope)),
        (Bson::DbPointer(x), Bson::DbPointer(y)) => format!("{x:?}").cmp(&format!("{y:?}")),
        _ => Ordering::Equal,
    }
}

fn str_of(v: &Bson) -> &str {
    match v {
        Bson::String(s) | Bson::Symbol(s) => s,
        _ => "",
    }
}

/// Documents compare element by element: type rank, then field name, then value; a prefix
/// sorts first.
pub(crate) fn compare_documents(a: &Document, b: &Document) -> Ordering {
    let mut ia = a.iter();
    let mut ib = b.iter();
    loop {
        match (ia.next(), ib.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some((ka, va)), Some((kb, vb))) => {
                let ord = type_rank(va)
                    .cmp(&type_rank(vb))
                    .then_with(|| ka.cmp(kb))
                    .then_with(|| compare_bson(va, vb));
                if ord != Ordering::Equal {
                    return ord;
                }
            }
        }
    }
}

fn compare_arrays(a: &[Bson], b: &[Bson]) -> Ordering {
    for (x, y) in a.iter().zip(b.iter()) {
        let ord = type_rank(x)
            .cmp(&type_rank(y))
            .then_with(|| compare_bson(x, y));
        if ord != Ordering::Equal {
            return ord;
        }
    }
    a.len().cmp(&b.len())
}

/// Equality as mongod's query and index layer sees it (`1 == 1.0`, field order matters).
pub(crate) fn bson_eq(a: &Bson, b: &Bson) -> bool {
    compare_bson(a, b) == Ordering::Equal
}

/// Byte-level equality: same types, same field order, same values (NaN equals NaN). This is
/// what decides whether an update modified a document.
pub fn strict_equal(a: &Bson, b: &Bson) -> bool {
    match (a, b) {
        (Bson::Double(x), Bson::Double(y)) => x.to_bits() == y.to_bits(),
        (Bson::Document(x), Bson::Document(y)) => strict_equal_docs(x, y),
        (Bson::Array(x), Bson::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y.iter()).all(|(p, q)| strict_equal(p, q))
        }
        (Bson::JavaScriptCodeWithScope(x), Bson::JavaScriptCodeWithScope(y)) => {
            x.code == y.code && strict_equal_docs(&x.scope, &y.scope)
        }
        _ => a == b,
    }
}

/// [`strict_equal`] for documents.
pub(crate) fn strict_equal_docs(a: &Document, b: &Document) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b.iter())
            .all(|((ka, va), (kb, vb))| ka == kb && strict_equal(va, vb))
}

/// Wrapper ordering BSON values by [`compare_bson`], for use as a map key.
#[derive(Debug, Clone)]
pub(crate) struct OrdBson(pub Bson);

impl PartialEq for OrdBson {
    fn eq(&self, other: &Self) -> bool {
        bson_eq(&self.0, &other.0)
    }
}
impl Eq for OrdBson {}
impl PartialOrd for OrdBson {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrdBson {
    fn cmp(&self, other: &Self) -> Ordering {
        compare_bson(&self.0, &other.0)
    }
}

/// An `_id` as the `_id_` index tells documents apart: ordered by [`compare_bson`], so numbers
/// compare by exact value across int32, int64 and double (`1 == 1i64 == 1.0`) while distinct
/// int64s stay distinct above 2^53, as in mongod. The catalog's index, change events and
/// transaction write conflicts all key documents by it.
///
/// Index keys ignore any active collation (the `_id_` index has the simple collation), so the
/// order of the catalog's map never depends on the command that happens to look into it.
#[derive(Debug, Clone)]
pub struct IdKey(OrdBson);

impl PartialEq for IdKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for IdKey {}
impl PartialOrd for IdKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for IdKey {
    fn cmp(&self, other: &Self) -> Ordering {
        super::collation::with_simple(|| compare_bson(&self.0 .0, &other.0 .0))
    }
}

/// The [`IdKey`] of an `_id` value.
pub fn id_key(id: &Bson) -> IdKey {
    IdKey(OrdBson(id.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, oid::ObjectId};

    #[test]
    fn id_keys_compare_numbers_by_exact_value() {
        // One value in three types is one _id.
        assert_eq!(id_key(&Bson::Int32(1)), id_key(&Bson::Int64(1)));
        assert_eq!(id_key(&Bson::Int64(1)), id_key(&Bson::Double(1.0)));
        assert_eq!(id_key(&Bson::Double(-0.0)), id_key(&Bson::Int32(0)));
        // Above 2^53 a double cannot tell neighbouring integers apart; the key must.
        let two_53 = 9_007_199_254_740_992i64;
        assert_ne!(
            id_key(&Bson::Int64(two_53 + 1)),
            id_key(&Bson::Int64(two_53))
        );
        assert!(id_key(&Bson::Int64(two_53 + 1)) > id_key(&Bson::Int64(two_53)));
        assert_ne!(
            id_key(&Bson::Int64(i64::MAX)),
            id_key(&Bson::Int64(i64::MAX - 1))
        );
        // 2^53 is exactly representable, so the double and the int64 are the same _id...
        assert_eq!(
            id_key(&Bson::Int64(two_53)),
            id_key(&Bson::Double(two_53 as f64))
        );
        // ...but 2^53 + 1 as int64 is not the double nearest to it.
        assert_ne!(
            id_key(&Bson::Int64(two_53 + 1)),
            id_key(&Bson::Double((two_53 + 1) as f64))
        );
        // Different types of equal rendering stay apart.
        assert_ne!(id_key(&Bson::String("1".into())), id_key(&Bson::Int32(1)));
    }

    #[test]
    fn numbers_compare_by_value_across_types() {
        assert_eq!(
            compare_bson(&Bson::Int32(1), &Bson::Double(1.0)),
            Ordering::Equal
        );
        assert_eq!(
            compare_bson(&Bson::Int64(1), &Bson::Int32(1)),
            Ordering::Equal
        );
        assert_eq!(
            compare_bson(&Bson::Int32(1), &Bson::Double(1.5)),
            Ordering::Less
        );
        assert_eq!(
            compare_bson(&Bson::Double(-0.5), &Bson::Int64(0)),
            Ordering::Less
        );
        assert_eq!(
            compare_bson(&Bson::Int64(i64::MAX), &Bson::Double(9.3e18)),
            Ordering::Less
        );
        // 2^53 + 1 is not representable as f64; an f64 conversion would call these equal.
        assert_eq!(
            compare_bson(
                &Bson::Int64((1 << 53) + 1),
                &Bson::Double((1u64 << 53) as f64)
            ),
            Ordering::Greater
        );
    }

    #[test]
    fn decimal128_compares_with_other_numbers() {
        let dec = |s: &str| Bson::Decimal128(s.parse().expect("valid decimal"));
        assert_eq!(
            compare_bson(&dec("1.5"), &Bson::Double(1.5)),
            Ordering::Equal
        );
        assert_eq!(compare_bson(&dec("2"), &Bson::Int32(3)), Ordering::Less);
        assert_eq!(
            compare_bson(&dec("-10.25"), &Bson::Int64(-11)),
            Ordering::Greater
        );
    }

    #[test]
    fn nan_sorts_below_numbers_and_equals_itself() {
        assert_eq!(
            compare_bson(&Bson::Double(f64::NAN), &Bson::Int32(i32::MIN)),
            Ordering::Less
        );
        assert_eq!(
            compare_bson(&Bson::Double(f64::NAN), &Bson::Double(f64::NAN)),
            Ordering::Equal
        );
    }

    #[test]
    fn types_follow_mongod_order() {
        let ordered = [
            Bson::MinKey,
            Bson::Null,
            Bson::Int32(5),
            Bson::String("a".into()),
            Bson::Document(doc! {}),
            Bson::Array(vec![]),
            Bson::ObjectId(ObjectId::new()),
            Bson::Boolean(false),
            Bson::DateTime(bson::DateTime::from_millis(0)),
            Bson::MaxKey,
        ];
        for w in ordered.windows(2) {
            assert_eq!(
                compare_bson(&w[0], &w[1]),
                Ordering::Less,
                "{:?} < {:?}",
                w[0],
                w[1]
            );
        }
    }

    #[test]
    fn documents_compare_field_names_and_prefixes() {
        let a = Bson::Document(doc! {"a": 1});
        let b = Bson::Document(doc! {"b": 1});
        let ab = Bson::Document(doc! {"a": 1, "b": 1});
        assert_eq!(compare_bson(&a, &b), Ordering::Less);
        assert_eq!(compare_bson(&a, &ab), Ordering::Less);
        assert_eq!(
            compare_bson(&Bson::Document(doc! {"a": 1.0}), &a),
            Ordering::Equal
        );
    }

    #[test]
    fn strict_equality_distinguishes_types_and_field_order() {
        assert!(!strict_equal(&Bson::Int32(1), &Bson::Double(1.0)));
        assert!(!strict_equal(
            &Bson::Document(doc! {"a": 1, "b": 2}),
            &Bson::Document(doc! {"b": 2, "a": 1})
        ));
        assert!(strict_equal(
            &Bson::Double(f64::NAN),
            &Bson::Double(f64::NAN)
        ));
    }
}
