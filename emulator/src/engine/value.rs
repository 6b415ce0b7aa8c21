//! What mongod calls a BSON value's type ([`bson_type_name`]), and how the engine reads a
//! value as a number ([`Num`]).
//!
//! Most of the engine names types in its error messages (collation and view options, update
//! operators, expressions; `$type` reports them too) and reads numbers (comparison, arithmetic,
//! update operators, a collation's `strength`), so both live in a module of their own that
//! depends on nothing else in the engine: no module reaches into the expression evaluator or
//! the comparator for them, which is what made collation, compare and expression a circle.

use bson::Bson;

/// mongod's type alias for `v` (as `$type` reports it), also used in error messages.
pub(crate) fn bson_type_name(v: &Bson) -> &'static str {
    match v {
        Bson::Double(_) => "double",
        Bson::String(_) => "string",
        Bson::Document(_) => "object",
        Bson::Array(_) => "array",
        Bson::Binary(_) => "binData",
        Bson::Undefined => "undefined",
        Bson::ObjectId(_) => "objectId",
        Bson::Boolean(_) => "bool",
        Bson::DateTime(_) => "date",
        Bson::Null => "null",
        Bson::RegularExpression(_) => "regex",
        Bson::DbPointer(_) => "dbPointer",
        Bson::JavaScriptCode(_) => "javascript",
        Bson::Symbol(_) => "symbol",
        Bson::JavaScriptCodeWithScope(_) => "javascriptWithScope",
        Bson::Int32(_) => "int",
        Bson::Timestamp(_) => "timestamp",
        Bson::Int64(_) => "long",
        Bson::Decimal128(_) => "decimal",
        Bson::MinKey => "minKey",
        Bson::MaxKey => "maxKey",
    }
}

/// A numeric value in a form that compares exactly across int32, int64 and double.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    pub(crate) fn of(v: &Bson) -> Option<Num> {
        match v {
            Bson::Int32(i) => Some(Num::Int(i64::from(*i))),
            Bson::Int64(i) => Some(Num::Int(*i)),
            Bson::Double(f) => Some(Num::Float(*f)),
            // Decimal128 has no arithmetic in bson 2.x; its decimal string is close enough for an
            // emulator's ordering.
            Bson::Decimal128(d) => {
                Some(Num::Float(d.to_string().parse::<f64>().unwrap_or(f64::NAN)))
            }
            _ => None,
        }
    }

    pub(crate) fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }
}
