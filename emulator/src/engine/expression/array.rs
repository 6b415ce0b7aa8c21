//! Arrays: `$size $arrayElemAt $first $last $in $concatArrays $isArray $reverseArray $slice
//! $range $indexOfArray`, and the ones that bind a variable per element: `$map $filter
//! $reduce`.

use std::cmp::Ordering;

use bson::Bson;

use super::comparison::is_truthy;
use super::{is_nullish, unrecognized, Ctx};
use crate::engine::compare::compare_bson;
use crate::engine::value::{bson_type_name, Num};
use crate::engine::{EngineError, EngineResult};

impl Ctx<'_> {
    /// Evaluates one of this family's operators; any other name is 168 InvalidPipelineOperator.
    pub(super) fn array_operator(&mut self, op: &str, arg: &Bson) -> EngineResult<Option<Bson>> {
        let value = match op {
            "$size" => {
                let args = self.exact_args(op, arg, 1)?;
                match &args[0] {
                    Some(Bson::Array(a)) => Bson::Int32(i32::try_from(a.len()).unwrap_or(i32::MAX)),
                    other => {
                        let name = other.as_ref().map(bson_type_name).unwrap_or("missing");
                        return Err(EngineError::location(
                            17124,
                            format!(
                                "The argument to $size must be an array. Type of argument: {name}"
                            ),
                        ));
                    }
                }
            }
            "$arrayElemAt" => {
                let args = self.exact_args(op, arg, 2)?;
                if is_nullish(&args[0]) || is_nullish(&args[1]) {
                    return Ok(Some(Bson::Null));
                }
                let Some(Bson::Array(items)) = &args[0] else {
                    return Err(EngineError::location(
                        28689,
                        "$arrayElemAt's first argument must be an array",
                    ));
                };
                let idx = match args[1].as_ref().and_then(Num::of) {
                    Some(Num::Int(i)) => i,
                    Some(Num::Float(f)) if f.fract() == 0.0 => f as i64,
                    _ => {
                        return Err(EngineError::location(
                            28690,
                            "$arrayElemAt's second argument must be a numeric value",
                        ))
                    }
                };
                let len = items.len() as i64;
                let pos = if idx < 0 { len + idx } else { idx };
                return Ok(usize::try_from(pos)
                    .ok()
                    .and_then(|p| items.get(p))
                    .cloned());
            }
            "$first" | "$last" => {
                let args = self.exact_args(op, arg, 1)?;
                match &args[0] {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => Bson::Null,
                    Some(Bson::Array(items)) => {
                        let item = if op == "$first" {
                            items.first()
                        } else {
                            items.last()
                        };
                        return Ok(item.cloned());
                    }
                    Some(other) => {
                        return Err(EngineError::location(
                            28689,
                            format!(
                                "{op}'s argument must be an array, but is {}",
                                bson_type_name(other)
                            ),
                        ));
                    }
                }
            }
            "$in" => {
                let args = self.exact_args(op, arg, 2)?;
                let Some(Bson::Array(items)) = &args[1] else {
                    return Err(EngineError::location(
                        40081,
                        "$in requires an array as a second argument",
                    ));
                };
                let needle = args[0].clone().unwrap_or(Bson::Null);
                Bson::Boolean(
                    items
                        .iter()
                        .any(|i| compare_bson(i, &needle) == Ordering::Equal),
                )
            }
            "$concatArrays" => {
                let mut out = Vec::new();
                for a in self.args(arg)? {
                    match a {
                        None | Some(Bson::Null) | Some(Bson::Undefined) => {
                            return Ok(Some(Bson::Null))
                        }
                        Some(Bson::Array(items)) => out.extend(items),
                        Some(other) => {
                            return Err(EngineError::location(
                                28664,
                                format!(
                                    "$concatArrays only supports arrays, not {}",
                                    bson_type_name(&other)
                                ),
                            ));
                        }
                    }
                }
                Bson::Array(out)
            }
            "$isArray" => {
                let args = self.exact_args(op, arg, 1)?;
                Bson::Boolean(matches!(args[0], Some(Bson::Array(_))))
            }
            "$reverseArray" => {
                let args = self.exact_args(op, arg, 1)?;
                match args.into_iter().next().flatten() {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => Bson::Null,
                    Some(Bson::Array(mut items)) => {
                        items.reverse();
                        Bson::Array(items)
                    }
                    Some(other) => {
                        return Err(EngineError::location(34435, format!("The argument to $reverseArray must be an array, but was of type: {}", bson_type_name(&other))));
                    }
                }
            }
            "$slice" => {
                let args = self.args(arg)?;
                if !(2..=3).contains(&args.len()) {
                    return Err(EngineError::location(
                        28667,
                        "Expression $slice takes at least 2 arguments, and at most 3",
                    ));
                }
                let items = match &args[0] {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                    Some(Bson::Array(items)) => items.clone(),
                    Some(other) => {
                        return Err(EngineError::location(
                            28724,
                            format!(
                                "First argument to $slice must be an array, but is of type: {}",
                                bson_type_name(other)
                            ),
                        ));
                    }
                };
                let int_arg = |v: &Option<Bson>| match v.as_ref().and_then(Num::of) {
                    Some(Num::Int(i)) => Ok(i),
                    Some(Num::Float(f)) if f.fract() == 0.0 && f.is_finite() => Ok(f as i64),
                    _ => Err(EngineError::location(
                        28725,
                        "$slice arguments must be integral numbers",
                    )),
                };
                let len = items.len() as i64;
                let (start, count) = if args.len() == 2 {
                    let n = int_arg(&args[1])?;
                    if n >= 0 {
                        (0, n)
                    } else {
                        ((len + n).max(0), len)
                    }
                } else {
                    let pos = int_arg(&args[1])?;
                    let n = int_arg(&args[2])?;
                    if n <= 0 {
                        return Err(EngineError::location(
                            28729,
                            "Third argument to $slice must be positive",
                        ));
                    }
                    (
                        if pos >= 0 {
                            pos.min(len)
                        } else {
                            (len + pos).max(0)
                        },
                        n,
                    )
                };
                let start = usize::try_from(start).unwrap_or(0);
                let count = usize::try_from(count).unwrap_or(0);
                Bson::Array(items.into_iter().skip(start).take(count).collect())
            }
            "$range" => {
                let args = self.args(arg)?;
                if !(2..=3).contains(&args.len()) {
                    return Err(EngineError::location(
                        28667,
                        "Expression $range takes at least 2 arguments, and at most 3",
                    ));
                }
                let int_arg = |v: &Option<Bson>| {
                    match v.as_ref().and_then(Num::of) {
                    Some(Num::Int(i)) if i32::try_from(i).is_ok() => Ok(i),
                    Some(Num::Float(f)) if f.fract() == 0.0 && f.abs() < 2_147_483_648.0 => Ok(f as i64),
                    _ => Err(EngineError::location(34443, "$range requires a numeric starting value and ending value that can be represented as 32-bit integers")),
                }
                };
                let (start, end) = (int_arg(&args[0])?, int_arg(&args[1])?);
                let step = match args.get(2) {
                    Some(s) => int_arg(s)?,
                    None => 1,
                };
                if step == 0 {
                    return Err(EngineError::location(
                        34449,
                        "$range requires a non-zero step value",
                    ));
                }
                let count = if (step > 0 && end > start) || (step < 0 && end < start) {
                    ((end - start).abs() + step.abs() - 1) / step.abs()
                } else {
                    0
                };
                if count > 1_000_000 {
                    return Err(EngineError::location(
                        34434,
                        "$range would produce more than 1,000,000 values",
                    ));
                }
                Bson::Array(
                    (0..count)
                        .map(|i| Bson::Int32((start + i * step) as i32))
                        .collect(),
                )
            }
            "$indexOfArray" => {
                let args = self.args(arg)?;
                if args.len() < 2 {
                    return Err(EngineError::location(
                        28667,
                        "Expression $indexOfArray takes at least 2 arguments",
                    ));
                }
                match &args[0] {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => Bson::Null,
                    Some(Bson::Array(items)) => {
                        let needle = args[1].clone().unwrap_or(Bson::Null);
                        let pos = items
                            .iter()
                            .position(|i| compare_bson(i, &needle) == Ordering::Equal);
                        Bson::Int32(pos.and_then(|p| i32::try_from(p).ok()).unwrap_or(-1))
                    }
                    Some(other) => {
                        return Err(EngineError::location(
                            40090,
                            format!(
                                "$indexOfArray requires an array as a first argument, found: {}",
                                bson_type_name(other)
                            ),
                        ));
                    }
                }
            }
            "$map" | "$filter" => {
                let Bson::Document(spec) = arg else {
                    return Err(EngineError::location(
                        16878,
                        format!("{op} only supports an object as its argument"),
                    ));
                };
                let body_key = if op == "$map" { "in" } else { "cond" };
                let (Some(input), Some(body)) = (spec.get("input"), spec.get(body_key)) else {
                    return Err(EngineError::location(
                        16880,
                        format!("Missing 'input' or '{body_key}' parameter to {op}"),
                    ));
                };
                let name = match spec.get("as") {
                    Some(Bson::String(s)) => s.clone(),
                    None => "this".to_owned(),
                    Some(_) => {
                        return Err(EngineError::bad_value(format!(
                            "{op}: 'as' must be a string"
                        )))
                    }
                };
                let items = match self.eval(input)? {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                    Some(Bson::Array(items)) => items,
                    Some(other) => {
                        return Err(EngineError::location(
                            16883,
                            format!(
                                "input to {op} must be an array not {}",
                                bson_type_name(&other)
                            ),
                        ));
                    }
                };
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    self.vars.push((name.clone(), item.clone()));
                    let r = self.eval(body);
                    self.vars.pop();
                    let r = r?;
                    if op == "$map" {
                        out.push(r.unwrap_or(Bson::Null));
                    } else if r.as_ref().is_some_and(is_truthy) {
                        out.push(item);
                    }
                }
                Bson::Array(out)
            }
            "$reduce" => {
                let Bson::Document(spec) = arg else {
                    return Err(EngineError::location(
                        40075,
                        "$reduce requires an object as an argument",
                    ));
                };
                let (Some(input), Some(initial), Some(body)) =
                    (spec.get("input"), spec.get("initialValue"), spec.get("in"))
                else {
                    return Err(EngineError::location(
                        40079,
                        "$reduce requires 'input', 'initialValue' and 'in'",
                    ));
                };
                let items = match self.eval(input)? {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                    Some(Bson::Array(items)) => items,
                    Some(other) => {
                        return Err(EngineError::location(
                            40080,
                            format!(
                                "$reduce requires that 'input' be an array, found: {}",
                                bson_type_name(&other)
                            ),
                        ));
                    }
                };
                let mut acc = self.eval(initial)?.unwrap_or(Bson::Null);
                for item in items {
                    self.vars.push(("value".to_owned(), acc));
                    self.vars.push(("this".to_owned(), item));
                    let r = self.eval(body);
                    self.vars.truncate(self.vars.len().saturating_sub(2));
                    acc = r?.unwrap_or(Bson::Null);
                }
                acc
            }
            _ => return Err(unrecognized(op)),
        };
        Ok(Some(value))
    }
}
