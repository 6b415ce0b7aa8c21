//! Sets: `$setUnion` (the only set operator the emulator implements).

use std::collections::BTreeSet;

use bson::Bson;

use super::{unrecognized, Ctx};
use crate::engine::compare::OrdBson;
use crate::engine::value::bson_type_name;
use crate::engine::{EngineError, EngineResult};

impl Ctx<'_> {
    /// Evaluates one of this family's operators; any other name is 168 InvalidPipelineOperator.
    pub(super) fn set_operator(&mut self, op: &str, arg: &Bson) -> EngineResult<Option<Bson>> {
        let value = match op {
            "$setUnion" => {
                let mut seen = BTreeSet::new();
                let mut out = Vec::new();
                for a in self.args(arg)? {
                    match a {
                        None | Some(Bson::Null) | Some(Bson::Undefined) => {
                            return Ok(Some(Bson::Null))
                        }
                        Some(Bson::Array(items)) => {
                            for i in items {
                                if seen.insert(OrdBson(i.clone())) {
                                    out.push(i);
                                }
                            }
                        }
                        Some(other) => {
                            return Err(EngineError::location(17043, format!("All operands of $setUnion must be arrays. One argument is of type: {}", bson_type_name(&other))));
                        }
                    }
                }
                Bson::Array(out)
            }
            _ => return Err(unrecognized(op)),
        };
        Ok(Some(value))
    }
}
