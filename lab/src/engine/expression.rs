//! Aggregation expression evaluation.

use bson::{Bson, Document};

use super::{EngineError, EngineResult};

/// Evaluates the aggregation expression `expr` against `root` (`$$ROOT`/`$$CURRENT`).
pub fn evaluate(expr: &Bson, root: &Document) -> EngineResult<Bson> {
    let _ = (expr, root);
    Err(EngineError::illegal_operation("not implemented yet"))
}
