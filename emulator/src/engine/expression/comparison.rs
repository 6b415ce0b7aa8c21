//! Comparison and boolean logic: `$eq $ne $gt $gte $lt $lte $cmp $and $or $not`, and
//! [`is_truthy`], the truthiness every boolean context (`$cond`, `$filter`, `$expr`) reads.

use std::cmp::Ordering;

use bson::Bson;

use super::{unrecognized, Ctx};
use crate::engine::compare::compare_bson;
use crate::engine::value::Num;
use crate::engine::EngineResult;

/// Truthiness as `$cond`, `$and`, `$expr` use it: false, null, undefined, missing and numeric
/// zero are false.
pub(crate) fn is_truthy(v: &Bson) -> bool {
    match v {
        Bson::Boolean(b) => *b,
        Bson::Null | Bson::Undefined => false,
        other => match Num::of(other) {
            Some(Num::Int(i)) => i != 0,
            Some(Num::Float(f)) => f != 0.0,
            None => true,
        },
    }
}

impl Ctx<'_> {
    /// Evaluates one of this family's operators; any other name is 168 InvalidPipelineOperator.
    pub(super) fn comparison_operator(
        &mut self,
        op: &str,
        arg: &Bson,
    ) -> EngineResult<Option<Bson>> {
        let value = match op {
            "$eq" | "$ne" | "$gt" | "$gte" | "$lt" | "$lte" | "$cmp" => {
                let args = self.exact_args(op, arg, 2)?;
                // Missing compares as lower than null, as in mongod's expression comparison.
                let ord = match (&args[0], &args[1]) {
                    (None, None) => Ordering::Equal,
                    (None, Some(_)) => Ordering::Less,
                    (Some(_), None) => Ordering::Greater,
                    (Some(a), Some(b)) => compare_bson(a, b),
                };
                match op {
                    "$eq" => Bson::Boolean(ord == Ordering::Equal),
                    "$ne" => Bson::Boolean(ord != Ordering::Equal),
                    "$gt" => Bson::Boolean(ord == Ordering::Greater),
                    "$gte" => Bson::Boolean(ord != Ordering::Less),
                    "$lt" => Bson::Boolean(ord == Ordering::Less),
                    "$lte" => Bson::Boolean(ord != Ordering::Greater),
                    _ => Bson::Int32(match ord {
                        Ordering::Less => -1,
                        Ordering::Equal => 0,
                        Ordering::Greater => 1,
                    }),
                }
            }
            "$and" | "$or" => {
                let items: Vec<Bson> = match arg {
                    Bson::Array(items) => items.clone(),
                    other => vec![other.clone()],
                };
                let want = op == "$or";
                for item in &items {
                    let v = self.eval(item)?;
                    if v.as_ref().is_some_and(is_truthy) == want {
                        return Ok(Some(Bson::Boolean(want)));
                    }
                }
                Bson::Boolean(!want)
            }
            "$not" => {
                let args = self.exact_args(op, arg, 1)?;
                Bson::Boolean(!args[0].as_ref().is_some_and(is_truthy))
            }
            _ => return Err(unrecognized(op)),
        };
        Ok(Some(value))
    }
}
