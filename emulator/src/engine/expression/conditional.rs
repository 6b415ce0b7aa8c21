//! Conditionals: `$cond $ifNull $switch`. Each evaluates only the branch it returns.

use bson::Bson;

use super::comparison::is_truthy;
use super::{is_nullish, unrecognized, Ctx};
use crate::engine::{EngineError, EngineResult};

impl Ctx<'_> {
    /// Evaluates one of this family's operators; any other name is 168 InvalidPipelineOperator.
    pub(super) fn conditional_operator(
        &mut self,
        op: &str,
        arg: &Bson,
    ) -> EngineResult<Option<Bson>> {
        match op {
            "$cond" => {
                let (cond, then, otherwise) = match arg {
                    Bson::Array(items) if items.len() == 3 => (&items[0], &items[1], &items[2]),
                    Bson::Document(d) => match (d.get("if"), d.get("then"), d.get("else")) {
                        (Some(i), Some(t), Some(e)) if d.len() == 3 => (i, t, e),
                        _ => {
                            return Err(EngineError::location(
                                17080,
                                "Missing 'if', 'then' or 'else' parameter to $cond",
                            ))
                        }
                    },
                    _ => {
                        return Err(EngineError::location(
                            16020,
                            "Expression $cond takes exactly 3 arguments.",
                        ))
                    }
                };
                let c = self.eval(cond)?;
                if c.as_ref().is_some_and(is_truthy) {
                    self.eval(then)
                } else {
                    self.eval(otherwise)
                }
            }
            "$ifNull" => {
                let Bson::Array(items) = arg else {
                    return Err(EngineError::location(
                        1257300,
                        "$ifNull needs at least two arguments",
                    ));
                };
                if items.len() < 2 {
                    return Err(EngineError::location(
                        1257300,
                        "$ifNull needs at least two arguments",
                    ));
                }
                let last = items.len() - 1;
                for item in &items[..last] {
                    let v = self.eval(item)?;
                    if !is_nullish(&v) {
                        return Ok(v);
                    }
                }
                self.eval(&items[last])
            }
            "$switch" => {
                let Bson::Document(spec) = arg else {
                    return Err(EngineError::location(
                        40060,
                        "$switch requires an object as an argument",
                    ));
                };
                let Some(Bson::Array(branches)) = spec.get("branches") else {
                    return Err(EngineError::location(
                        40061,
                        "$switch expected an array for 'branches'",
                    ));
                };
                for branch in branches {
                    let Bson::Document(b) = branch else {
                        return Err(EngineError::location(
                            40062,
                            "$switch expected each branch to be an object",
                        ));
                    };
                    let (Some(case), Some(then)) = (b.get("case"), b.get("then")) else {
                        return Err(EngineError::location(
                            40064,
                            "$switch requires each branch have a 'case' and 'then'",
                        ));
                    };
                    if self.eval(case)?.as_ref().is_some_and(is_truthy) {
                        return self.eval(then);
                    }
                }
                match spec.get("default") {
                    Some(d) => self.eval(d),
                    None => Err(EngineError::location(40066, "$switch could not find a matching branch for an input, and no default was specified.")),
                }
            }
            _ => Err(unrecognized(op)),
        }
    }
}
