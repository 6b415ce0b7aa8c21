//! Update operators, replacement and pipeline updates applied to one document.

use bson::Document;

use super::{EngineError, EngineResult, UpdateModification};

/// Per-call settings of [`apply_update`].
#[derive(Debug, Clone, Default)]
pub struct UpdateContext<'a> {
    /// The document is being inserted by an upsert (`$setOnInsert` applies).
    pub is_insert: bool,
    /// `arrayFilters` for `$[<identifier>]`.
    pub array_filters: &'a [Document],
    /// The statement's query, for the positional `$` operator.
    pub query: Option<&'a Document>,
}

/// Applies `update` to `doc` in place and returns whether the document changed.
pub fn apply_update(
    doc: &mut Document,
    update: &UpdateModification,
    ctx: &UpdateContext<'_>,
) -> EngineResult<bool> {
    let _ = (doc, update, ctx);
    Err(EngineError::illegal_operation("not implemented yet"))
}
