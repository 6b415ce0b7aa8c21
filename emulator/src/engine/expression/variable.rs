//! Variables and constants: `$let` binds names for its `in`, `$literal` returns its argument
//! unevaluated, `$rand` draws a double in [0, 1) at each evaluation.

use bson::Bson;

use super::{unrecognized, Ctx};
use crate::engine::{EngineError, EngineResult};

impl Ctx<'_> {
    /// Evaluates one of this family's operators; any other name is 168 InvalidPipelineOperator.
    pub(super) fn variable_operator(&mut self, op: &str, arg: &Bson) -> EngineResult<Option<Bson>> {
        let value = match op {
            "$let" => {
                let Bson::Document(spec) = arg else {
                    return Err(EngineError::location(
                        16874,
                        "$let only supports an object as its argument",
                    ));
                };
                let (Some(Bson::Document(vars)), Some(body)) = (spec.get("vars"), spec.get("in"))
                else {
                    return Err(EngineError::location(
                        16876,
                        "Missing 'vars' or 'in' parameter to $let",
                    ));
                };
                let mut bound = Vec::with_capacity(vars.len());
                for (name, e) in vars {
                    bound.push((name.clone(), self.eval(e)?.unwrap_or(Bson::Null)));
                }
                let depth = self.vars.len();
                self.vars.extend(bound);
                let result = self.eval(body);
                self.vars.truncate(depth);
                return result;
            }
            "$literal" => arg.clone(),
            // A double in [0, 1), drawn anew at each evaluation.
            "$rand" => match arg {
                Bson::Document(d) if d.is_empty() => Bson::Double(rand::random::<f64>()),
                _ => {
                    return Err(EngineError::location(
                        10065,
                        "invalid parameter: expected an object ($rand)",
                    ))
                }
            },
            _ => return Err(unrecognized(op)),
        };
        Ok(Some(value))
    }
}
