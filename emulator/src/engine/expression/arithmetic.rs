//! Arithmetic: `$add $subtract $multiply $divide $mod $abs $floor $ceil $trunc $round $sqrt
//! $exp $ln $log10 $pow`, and [`arith`], the type-promoting `+ - *` that `$sum`, `$inc` and
//! `$mul` share.

use bson::Bson;

use super::{is_nullish, unrecognized, Ctx};
use crate::engine::value::{bson_type_name, Num};
use crate::engine::{EngineError, EngineResult};

/// Numeric binary operations shared by expressions, `$inc`/`$mul` and `$sum`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arith {
    Add,
    Sub,
    Mul,
}

/// `a op b` with mongod's type promotion: int32 stays int32 unless it overflows (then int64),
/// int64 overflows to double, and any double makes a double. `None` if either is not a number.
pub(crate) fn arith(op: Arith, a: &Bson, b: &Bson) -> Option<Bson> {
    let (x, y) = (Num::of(a)?, Num::of(b)?);
    let both_i32 = matches!((a, b), (Bson::Int32(_), Bson::Int32(_)));
    let as_double = |p: f64, q: f64| match op {
        Arith::Add => p + q,
        Arith::Sub => p - q,
        Arith::Mul => p * q,
    };
    match (x, y) {
        (Num::Int(p), Num::Int(q))
            if !matches!(a, Bson::Decimal128(_)) && !matches!(b, Bson::Decimal128(_)) =>
        {
            let exact = match op {
                Arith::Add => p.checked_add(q),
                Arith::Sub => p.checked_sub(q),
                Arith::Mul => p.checked_mul(q),
            };
            match exact {
                Some(r) if both_i32 => {
                    Some(i32::try_from(r).map(Bson::Int32).unwrap_or(Bson::Int64(r)))
                }
                Some(r) => Some(Bson::Int64(r)),
                None => Some(Bson::Double(as_double(p as f64, q as f64))),
            }
        }
        _ => Some(Bson::Double(as_double(x.as_f64(), y.as_f64()))),
    }
}

impl Ctx<'_> {
    /// Evaluates one of this family's operators; any other name is 168 InvalidPipelineOperator.
    pub(super) fn arithmetic_operator(
        &mut self,
        op: &str,
        arg: &Bson,
    ) -> EngineResult<Option<Bson>> {
        let value = match op {
            "$add" | "$multiply" => {
                let args = self.args(arg)?;
                let is_add = op == "$add";
                let mut acc = if is_add {
                    Bson::Int32(0)
                } else {
                    Bson::Int32(1)
                };
                let mut date: Option<i64> = None;
                for a in args {
                    let Some(a) = a.filter(|v| !matches!(v, Bson::Null | Bson::Undefined)) else {
                        return Ok(Some(Bson::Null));
                    };
                    if let (true, Bson::DateTime(dt)) = (is_add, &a) {
                        if date.is_some() {
                            return Err(EngineError::location(
                                16612,
                                "only one date allowed in an $add expression",
                            ));
                        }
                        date = Some(dt.timestamp_millis());
                        continue;
                    }
                    acc = arith(if is_add { Arith::Add } else { Arith::Mul }, &acc, &a)
                        .ok_or_else(|| {
                            EngineError::type_mismatch(format!(
                                "{op} only supports numeric{} types, not {}",
                                if is_add { " or date" } else { "" },
                                bson_type_name(&a)
                            ))
                        })?;
                }
                match date {
                    Some(ms) => {
                        let delta = Num::of(&acc).map(|n| n.as_f64()).unwrap_or(0.0);
                        Bson::DateTime(bson::DateTime::from_millis(
                            ms.saturating_add(delta.round() as i64),
                        ))
                    }
                    None => acc,
                }
            }
            "$subtract" => {
                let args = self.exact_args(op, arg, 2)?;
                let (Some(a), Some(b)) = (&args[0], &args[1]) else {
                    return Ok(Some(Bson::Null));
                };
                if is_nullish(&args[0]) || is_nullish(&args[1]) {
                    return Ok(Some(Bson::Null));
                }
                match (a, b) {
                    (Bson::DateTime(x), Bson::DateTime(y)) => {
                        Bson::Int64(x.timestamp_millis().saturating_sub(y.timestamp_millis()))
                    }
                    (Bson::DateTime(x), n) if Num::of(n).is_some() => {
                        let delta = Num::of(n).map(|n| n.as_f64()).unwrap_or(0.0);
                        Bson::DateTime(bson::DateTime::from_millis(
                            x.timestamp_millis().saturating_sub(delta.round() as i64),
                        ))
                    }
                    _ => arith(Arith::Sub, a, b).ok_or_else(|| {
                        EngineError::type_mismatch(format!(
                            "can't $subtract {} from {}",
                            bson_type_name(b),
                            bson_type_name(a)
                        ))
                    })?,
                }
            }
            "$divide" | "$mod" => {
                let args = self.exact_args(op, arg, 2)?;
                if is_nullish(&args[0]) || is_nullish(&args[1]) {
                    return Ok(Some(Bson::Null));
                }
                let (a, b) = (
                    args[0].clone().unwrap_or(Bson::Null),
                    args[1].clone().unwrap_or(Bson::Null),
                );
                let (Some(x), Some(y)) = (Num::of(&a), Num::of(&b)) else {
                    return Err(EngineError::type_mismatch(format!(
                        "{op} only supports numeric types, not {} and {}",
                        bson_type_name(&a),
                        bson_type_name(&b)
                    )));
                };
                if y.as_f64() == 0.0 {
                    return Err(EngineError::bad_value(if op == "$divide" {
                        "can't $divide by zero"
                    } else {
                        "can't $mod by zero"
                    }));
                }
                if op == "$divide" {
                    Bson::Double(x.as_f64() / y.as_f64())
                } else {
                    match (x, y, &a, &b) {
                        (Num::Int(p), Num::Int(q), Bson::Int32(_), Bson::Int32(_)) => {
                            Bson::Int32(p.wrapping_rem(q) as i32)
                        }
                        (Num::Int(p), Num::Int(q), _, _) => Bson::Int64(p.wrapping_rem(q)),
                        _ => Bson::Double(x.as_f64() % y.as_f64()),
                    }
                }
            }
            "$abs" => {
                let args = self.exact_args(op, arg, 1)?;
                match &args[0] {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => Bson::Null,
                    Some(Bson::Int32(i)) => i
                        .checked_abs()
                        .map(Bson::Int32)
                        .unwrap_or(Bson::Int64(i64::from(*i).abs())),
                    Some(Bson::Int64(i)) => i
                        .checked_abs()
                        .map(Bson::Int64)
                        .unwrap_or(Bson::Double((*i as f64).abs())),
                    Some(v) => match Num::of(v) {
                        Some(n) => Bson::Double(n.as_f64().abs()),
                        None => {
                            return Err(EngineError::location(
                                28765,
                                format!(
                                    "$abs only supports numeric types, not {}",
                                    bson_type_name(v)
                                ),
                            ))
                        }
                    },
                }
            }
            "$floor" | "$ceil" | "$trunc" | "$round" => {
                let args = self.args(arg)?;
                let Some(first) = args.first() else {
                    return Err(EngineError::location(
                        16020,
                        format!("Expression {op} takes at least 1 argument"),
                    ));
                };
                match first {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => Bson::Null,
                    Some(v @ (Bson::Int32(_) | Bson::Int64(_))) => v.clone(),
                    Some(v) => match Num::of(v) {
                        Some(n) => {
                            let f = n.as_f64();
                            Bson::Double(match op {
                                "$floor" => f.floor(),
                                "$ceil" => f.ceil(),
                                "$trunc" => f.trunc(),
                                // mongod rounds half to even.
                                _ => {
                                    let r = f.round();
                                    if (f - f.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
                                        r - f.signum()
                                    } else {
                                        r
                                    }
                                }
                            })
                        }
                        None => {
                            return Err(EngineError::location(
                                28765,
                                format!(
                                    "{op} only supports numeric types, not {}",
                                    bson_type_name(v)
                                ),
                            ));
                        }
                    },
                }
            }
            "$sqrt" | "$exp" | "$ln" | "$log10" | "$pow" => {
                let args = if op == "$pow" {
                    self.exact_args(op, arg, 2)?
                } else {
                    self.exact_args(op, arg, 1)?
                };
                if args.iter().any(is_nullish) {
                    return Ok(Some(Bson::Null));
                }
                let mut nums = Vec::with_capacity(args.len());
                for a in args.iter().flatten() {
                    nums.push(
                        Num::of(a)
                            .ok_or_else(|| {
                                EngineError::location(
                                    28765,
                                    format!(
                                        "{op} only supports numeric types, not {}",
                                        bson_type_name(a)
                                    ),
                                )
                            })?
                            .as_f64(),
                    );
                }
                let x = nums.first().copied().unwrap_or(0.0);
                let value = match op {
                    "$sqrt" if x < 0.0 => {
                        return Err(EngineError::location(
                            28714,
                            "$sqrt's argument must be greater than or equal to 0",
                        ))
                    }
                    "$sqrt" => x.sqrt(),
                    "$exp" => x.exp(),
                    "$ln" | "$log10" if x <= 0.0 => {
                        return Err(EngineError::location(
                            28766,
                            format!("{op}'s argument must be a positive number, but is {x}"),
                        ))
                    }
                    "$ln" => x.ln(),
                    "$log10" => x.log10(),
                    _ => {
                        let y = nums.get(1).copied().unwrap_or(1.0);
                        if x == 0.0 && y < 0.0 {
                            return Err(EngineError::location(
                                28764,
                                "$pow cannot take a base of 0 and a negative exponent",
                            ));
                        }
                        // Integer bases with non-negative integer exponents stay integral, as in mongod.
                        if let (Some(Num::Int(b)), Some(Num::Int(e))) = (
                            args[0].as_ref().and_then(Num::of),
                            args[1].as_ref().and_then(Num::of),
                        ) {
                            if let Some(r) = u32::try_from(e).ok().and_then(|e| b.checked_pow(e)) {
                                let both_i32 = matches!(
                                    (&args[0], &args[1]),
                                    (Some(Bson::Int32(_)), Some(Bson::Int32(_)))
                                );
                                return Ok(Some(match (both_i32, i32::try_from(r)) {
                                    (true, Ok(small)) => Bson::Int32(small),
                                    _ => Bson::Int64(r),
                                }));
                            }
                        }
                        x.powf(y)
                    }
                };
                Bson::Double(value)
            }
            _ => return Err(unrecognized(op)),
        };
        Ok(Some(value))
    }
}
