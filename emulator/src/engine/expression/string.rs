//! Strings: `$concat $toUpper $toLower $strLenCP $toString $split $substrCP $substr
//! $substrBytes $strcasecmp $regexMatch $trim $ltrim $rtrim`. (`$toString` shares its
//! conversion to text with `$toUpper`, `$toLower` and `$strLenCP`, so it lives here rather than
//! with the other conversions.)

use std::cmp::Ordering;

use bson::Bson;

use super::{unrecognized, Ctx};
use crate::engine::pattern::compile_regex;
use crate::engine::value::{bson_type_name, Num};
use crate::engine::{EngineError, EngineResult};

impl Ctx<'_> {
    /// Evaluates one of this family's operators; any other name is 168 InvalidPipelineOperator.
    pub(super) fn string_operator(&mut self, op: &str, arg: &Bson) -> EngineResult<Option<Bson>> {
        let value = match op {
            "$concat" => {
                let mut out = String::new();
                for a in self.args(arg)? {
                    match a {
                        None | Some(Bson::Null) | Some(Bson::Undefined) => {
                            return Ok(Some(Bson::Null))
                        }
                        Some(Bson::String(s)) => out.push_str(&s),
                        Some(other) => {
                            return Err(EngineError::location(
                                16702,
                                format!(
                                    "$concat only supports strings, not {}",
                                    bson_type_name(&other)
                                ),
                            ));
                        }
                    }
                }
                Bson::String(out)
            }
            "$toUpper" | "$toLower" | "$strLenCP" | "$toString" => {
                let args = self.exact_args(op, arg, 1)?;
                let v = args.into_iter().next().flatten().unwrap_or(Bson::Null);
                let text = match &v {
                    Bson::Null | Bson::Undefined if op == "$toString" => {
                        return Ok(Some(Bson::Null))
                    }
                    Bson::Null | Bson::Undefined => String::new(),
                    Bson::String(s) | Bson::Symbol(s) => s.clone(),
                    Bson::Int32(i) => i.to_string(),
                    Bson::Int64(i) => i.to_string(),
                    Bson::Double(f) => f.to_string(),
                    Bson::Boolean(b) => b.to_string(),
                    Bson::ObjectId(o) => o.to_hex(),
                    Bson::DateTime(d) => d.try_to_rfc3339_string().unwrap_or_default(),
                    Bson::Decimal128(d) => d.to_string(),
                    other => {
                        return Err(EngineError::location(
                            16007,
                            format!(
                                "can't convert from BSON type {} to String",
                                bson_type_name(other)
                            ),
                        ))
                    }
                };
                match op {
                    "$toUpper" => Bson::String(text.to_uppercase()),
                    "$toLower" => Bson::String(text.to_lowercase()),
                    "$strLenCP" => {
                        Bson::Int32(i32::try_from(text.chars().count()).unwrap_or(i32::MAX))
                    }
                    _ => Bson::String(text),
                }
            }
            // UTF-8 bytes of a string; anything else is mongod's 34473 (expression_string.cpp,
            // ExpressionStrLenBytes::evaluate: "$strLenBytes requires a string argument").
            "$strLenBytes" => {
                let args = self.exact_args(op, arg, 1)?;
                match args.into_iter().next().flatten() {
                    Some(Bson::String(s)) => {
                        Bson::Int32(i32::try_from(s.len()).unwrap_or(i32::MAX))
                    }
                    other => {
                        return Err(EngineError::location(
                            34473,
                            format!(
                                "$strLenBytes requires a string argument, found: {}",
                                other.as_ref().map_or("missing", bson_type_name)
                            ),
                        ))
                    }
                }
            }
            "$split" => {
                let args = self.exact_args(op, arg, 2)?;
                match (&args[0], &args[1]) {
                    (None | Some(Bson::Null) | Some(Bson::Undefined), _) => Bson::Null,
                    (Some(Bson::String(s)), Some(Bson::String(sep))) if !sep.is_empty() => {
                        Bson::Array(
                            s.split(sep.as_str())
                                .map(|p| Bson::String(p.to_owned()))
                                .collect(),
                        )
                    }
                    _ => {
                        return Err(EngineError::location(
                            40085,
                            "$split requires a string and a non-empty string delimiter",
                        ))
                    }
                }
            }
            "$substrCP" | "$substr" | "$substrBytes" => {
                let args = self.exact_args(op, arg, 3)?;
                let text = match &args[0] {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => String::new(),
                    Some(Bson::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                };
                let int_arg = |v: &Option<Bson>| match v.as_ref().and_then(Num::of) {
                    Some(n) if n.as_f64() >= 0.0 => Ok(n.as_f64() as usize),
                    _ => Err(EngineError::location(
                        34452,
                        format!("{op} requires non-negative numeric start and length"),
                    )),
                };
                let (start, len) = (int_arg(&args[1])?, int_arg(&args[2])?);
                // Characters (not bytes) for every variant, which never splits a UTF-8 sequence.
                Bson::String(text.chars().skip(start).take(len).collect())
            }
            "$strcasecmp" => {
                let args = self.exact_args(op, arg, 2)?;
                let text = |v: &Option<Bson>| match v {
                    Some(Bson::String(s)) => s.to_lowercase(),
                    _ => String::new(),
                };
                Bson::Int32(match text(&args[0]).cmp(&text(&args[1])) {
                    Ordering::Less => -1,
                    Ordering::Equal => 0,
                    Ordering::Greater => 1,
                })
            }
            "$regexMatch" => {
                let Bson::Document(spec) = arg else {
                    return Err(EngineError::location(
                        51103,
                        "$regexMatch expects an object of named arguments",
                    ));
                };
                let input = match spec.get("input") {
                    Some(e) => self.eval(e)?,
                    None => {
                        return Err(EngineError::location(
                            31022,
                            "$regexMatch requires 'input' parameter",
                        ))
                    }
                };
                let (pattern, mut options) = match spec
                    .get("regex")
                    .map(|e| self.eval(e))
                    .transpose()?
                    .flatten()
                {
                    Some(Bson::String(p)) => (p, String::new()),
                    Some(Bson::RegularExpression(r)) => (r.pattern, r.options),
                    None | Some(Bson::Null) => return Ok(Some(Bson::Boolean(false))),
                    Some(_) => {
                        return Err(EngineError::location(
                            51105,
                            "$regexMatch needs 'regex' to be of type string or regex",
                        ))
                    }
                };
                if let Some(o) = spec.get("options") {
                    match self.eval(o)? {
                        Some(Bson::String(extra)) => options.push_str(&extra),
                        None | Some(Bson::Null) => {}
                        Some(_) => {
                            return Err(EngineError::location(
                                51106,
                                "$regexMatch needs 'options' to be of type string",
                            ))
                        }
                    }
                }
                match input {
                    Some(Bson::String(text)) => {
                        Bson::Boolean(compile_regex(&pattern, &options)?.is_match(&text))
                    }
                    None | Some(Bson::Null) | Some(Bson::Undefined) => Bson::Boolean(false),
                    Some(_) => {
                        return Err(EngineError::location(
                            51104,
                            "$regexMatch needs 'input' to be of type string",
                        ))
                    }
                }
            }
            "$trim" | "$ltrim" | "$rtrim" => {
                let Bson::Document(spec) = arg else {
                    return Err(EngineError::location(
                        50696,
                        format!("{op} only supports an object as an argument"),
                    ));
                };
                let input = match spec.get("input") {
                    Some(e) => self.eval(e)?,
                    None => {
                        return Err(EngineError::location(
                            50695,
                            format!("{op} requires an 'input' field"),
                        ))
                    }
                };
                let chars: Option<Vec<char>> = match spec
                    .get("chars")
                    .map(|e| self.eval(e))
                    .transpose()?
                    .flatten()
                {
                    None | Some(Bson::Null) => None,
                    Some(Bson::String(c)) => Some(c.chars().collect()),
                    Some(_) => {
                        return Err(EngineError::location(
                            50700,
                            format!("{op} requires 'chars' to be a string"),
                        ))
                    }
                };
                let text = match input {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                    Some(Bson::String(t)) => t,
                    Some(other) => {
                        return Err(EngineError::location(
                            50699,
                            format!(
                                "{op} requires its input to be a string, got {}",
                                bson_type_name(&other)
                            ),
                        ));
                    }
                };
                let strip = |c: char| match &chars {
                    Some(set) => set.contains(&c),
                    None => c.is_whitespace() || c == '\0',
                };
                Bson::String(match op {
                    "$ltrim" => text.trim_start_matches(strip).to_owned(),
                    "$rtrim" => text.trim_end_matches(strip).to_owned(),
                    _ => text.trim_matches(strip).to_owned(),
                })
            }
            _ => return Err(unrecognized(op)),
        };
        Ok(Some(value))
    }
}
