//! Types and conversions: `$type $toInt $toLong $toDouble $toBool` (`$toString` is with the
//! strings).

use bson::Bson;

use super::comparison::is_truthy;
use super::{unrecognized, Ctx};
use crate::engine::value::{bson_type_name, Num};
use crate::engine::{EngineError, EngineResult};

impl Ctx<'_> {
    /// Evaluates one of this family's operators; any other name is 168 InvalidPipelineOperator.
    pub(super) fn conversion_operator(
        &mut self,
        op: &str,
        arg: &Bson,
    ) -> EngineResult<Option<Bson>> {
        let value = match op {
            "$type" => {
                let args = self.exact_args(op, arg, 1)?;
                Bson::String(
                    args[0]
                        .as_ref()
                        .map(bson_type_name)
                        .unwrap_or("missing")
                        .to_owned(),
                )
            }
            "$toInt" | "$toLong" | "$toDouble" | "$toBool" => {
                let args = self.exact_args(op, arg, 1)?;
                let v = args.into_iter().next().flatten();
                let Some(v) = v.filter(|v| !matches!(v, Bson::Null | Bson::Undefined)) else {
                    return Ok(Some(Bson::Null));
                };
                let fail = |v: &Bson| {
                    EngineError::location(241, format!("Unsupported conversion from {} to {} in $convert with no onError value", bson_type_name(v), &op[3..].to_lowercase()))
                };
                if op == "$toBool" {
                    Bson::Boolean(is_truthy(&v))
                } else {
                    let n = match &v {
                        Bson::Boolean(b) => Num::Int(i64::from(*b)),
                        Bson::String(s) => match s.trim().parse::<i64>() {
                            Ok(i) => Num::Int(i),
                            Err(_) => Num::Float(s.trim().parse::<f64>().map_err(|_| fail(&v))?),
                        },
                        Bson::DateTime(d) => Num::Int(d.timestamp_millis()),
                        other => Num::of(other).ok_or_else(|| fail(other))?,
                    };
                    match (op, n) {
                        ("$toDouble", n) => Bson::Double(n.as_f64()),
                        ("$toInt", Num::Int(i)) => {
                            Bson::Int32(i32::try_from(i).map_err(|_| fail(&v))?)
                        }
                        ("$toInt", Num::Float(f)) if f.is_finite() && f.abs() < 2_147_483_648.0 => {
                            Bson::Int32(f.trunc() as i32)
                        }
                        ("$toLong", Num::Int(i)) => Bson::Int64(i),
                        ("$toLong", Num::Float(f)) if f.is_finite() && f.abs() < 9.2e18 => {
                            Bson::Int64(f.trunc() as i64)
                        }
                        _ => return Err(fail(&v)),
                    }
                }
            }
            _ => return Err(unrecognized(op)),
        };
        Ok(Some(value))
    }
}
