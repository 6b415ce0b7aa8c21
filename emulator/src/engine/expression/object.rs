//! Objects: `$mergeObjects $objectToArray $arrayToObject`, and `$getField $setField
//! $unsetField`, which read, set or remove one field named literally.

use bson::{Bson, Document};

use super::{unrecognized, Ctx};
use crate::engine::value::bson_type_name;
use crate::engine::{EngineError, EngineResult};

impl Ctx<'_> {
    /// Evaluates one of this family's operators; any other name is 168 InvalidPipelineOperator.
    pub(super) fn object_operator(&mut self, op: &str, arg: &Bson) -> EngineResult<Option<Bson>> {
        let value = match op {
            "$getField" | "$setField" | "$unsetField" => return self.field_operator(op, arg),
            "$mergeObjects" => {
                let mut out = Document::new();
                for a in self.args(arg)? {
                    match a {
                        None | Some(Bson::Null) | Some(Bson::Undefined) => {}
                        Some(Bson::Document(d)) => out.extend(d),
                        Some(other) => {
                            return Err(EngineError::location(
                                40400,
                                format!(
                                    "$mergeObjects requires object inputs, but input is of type {}",
                                    bson_type_name(&other)
                                ),
                            ));
                        }
                    }
                }
                Bson::Document(out)
            }
            "$objectToArray" => {
                let args = self.exact_args(op, arg, 1)?;
                match args.into_iter().next().flatten() {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => Bson::Null,
                    Some(Bson::Document(d)) => Bson::Array(
                        d.into_iter()
                            .map(|(k, v)| {
                                let mut kv = Document::new();
                                kv.insert("k", k);
                                kv.insert("v", v);
                                Bson::Document(kv)
                            })
                            .collect(),
                    ),
                    Some(other) => {
                        return Err(EngineError::location(
                            40390,
                            format!(
                                "$objectToArray requires a document input, found: {}",
                                bson_type_name(&other)
                            ),
                        ));
                    }
                }
            }
            "$arrayToObject" => {
                let args = self.exact_args(op, arg, 1)?;
                match args.into_iter().next().flatten() {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => Bson::Null,
                    Some(Bson::Array(items)) => {
                        let mut out = Document::new();
                        for item in items {
                            match item {
                                Bson::Document(d) => match (d.get("k"), d.get("v")) {
                                    (Some(Bson::String(k)), Some(v)) if d.len() == 2 => {
                                        out.insert(k.clone(), v.clone());
                                    }
                                    _ => return Err(EngineError::location(40392, "$arrayToObject requires an object keys of 'k' and 'v'")),
                                },
                                Bson::Array(pair) if pair.len() == 2 => match (&pair[0], &pair[1]) {
                                    (Bson::String(k), v) => {
                                        out.insert(k.clone(), v.clone());
                                    }
                                    _ => return Err(EngineError::location(40395, "$arrayToObject requires an array of key-value pairs with string keys")),
                                },
                                _ => return Err(EngineError::location(40398, "Unrecognised input type format for $arrayToObject")),
                            }
                        }
                        Bson::Document(out)
                    }
                    Some(other) => {
                        return Err(EngineError::location(
                            40386,
                            format!(
                                "$arrayToObject requires an array input, found: {}",
                                bson_type_name(&other)
                            ),
                        ));
                    }
                }
            }
            _ => return Err(unrecognized(op)),
        };
        Ok(Some(value))
    }

    /// `$getField`, `$setField` and `$unsetField` (5.0): read, set or remove one field named
    /// literally, so names with dots or a leading `$` work. `field` must be a constant string
    /// (a `$literal` one included); `input` defaults to `$$CURRENT` for `$getField` and must be
    /// a document, null or missing for the others. `$setField` with `value: "$$REMOVE"` removes.
    fn field_operator(&mut self, op: &str, arg: &Bson) -> EngineResult<Option<Bson>> {
        let spec = match (op, arg) {
            ("$getField", Bson::String(_)) => {
                let mut d = Document::new();
                d.insert("field", arg.clone());
                d
            }
            (_, Bson::Document(d)) => d.clone(),
            _ => {
                return Err(EngineError::failed_to_parse(format!(
                    "{op} only supports an object as its argument"
                )))
            }
        };
        let allowed: &[&str] = match op {
            "$setField" => &["field", "input", "value"],
            _ => &["field", "input"],
        };
        if let Some(extra) = spec.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(EngineError::failed_to_parse(format!(
                "{op} found an unknown argument: {extra}"
            )));
        }
        let field = match spec.get("field") {
            Some(Bson::String(s)) if !s.starts_with('$') => s.clone(),
            Some(Bson::Document(d)) if d.len() == 1 => match d.get("$literal") {
                Some(Bson::String(s)) => s.clone(),
                _ => {
                    return Err(EngineError::location(
                        4161106,
                        format!("{op} requires 'field' to evaluate to a constant string"),
                    ))
                }
            },
            Some(_) => {
                return Err(EngineError::location(
                    4161106,
                    format!("{op} requires 'field' to evaluate to a constant string"),
                ))
            }
            None => {
                return Err(EngineError::location(
                    4161102,
                    format!("{op} requires 'field' to be specified"),
                ))
            }
        };
        let input = match spec.get("input") {
            Some(expr) => self.eval(expr)?,
            None if op == "$getField" => Some(Bson::Document(self.root.clone())),
            None => {
                return Err(EngineError::location(
                    4161109,
                    format!("{op} requires 'input' to be specified"),
                ))
            }
        };
        let input = match input {
            None => {
                return Ok(if op == "$getField" {
                    None
                } else {
                    Some(Bson::Null)
                })
            }
            Some(Bson::Null) | Some(Bson::Undefined) => {
                return Ok(if op == "$getField" {
                    None
                } else {
                    Some(Bson::Null)
                })
            }
            Some(Bson::Document(d)) => d,
            Some(other) if op == "$getField" => {
                return Err(EngineError::location(
                    3041705,
                    format!(
                        "$getField requires 'input' to evaluate to type Object, but got {}",
                        bson_type_name(&other)
                    ),
                ))
            }
            Some(other) => {
                return Err(EngineError::location(
                    4161105,
                    format!(
                        "{op} requires 'input' to evaluate to type Object, but got {}",
                        bson_type_name(&other)
                    ),
                ))
            }
        };
        match op {
            "$getField" => Ok(input.get(&field).cloned()),
            _ => {
                let value = match (op, spec.get("value")) {
                    ("$unsetField", _) => None,
                    (_, Some(expr)) => self.eval(expr)?,
                    (_, None) => {
                        return Err(EngineError::location(
                            4161103,
                            "$setField requires 'value' to be specified",
                        ))
                    }
                };
                let mut out = input;
                match value {
                    // Replacing keeps the field's position, as mongod does.
                    Some(v) => {
                        out.insert(field, v);
                    }
                    None => {
                        out.remove(&field);
                    }
                }
                Ok(Some(Bson::Document(out)))
            }
        }
    }
}
