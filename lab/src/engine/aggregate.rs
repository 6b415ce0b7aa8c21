//! Aggregation pipeline stages.

use bson::Document;

use super::{EngineError, EngineResult, Store};

impl Store {
    /// `aggregate` on `db.coll`: runs `pipeline` over the collection's documents (none when the
    /// collection is missing). `$out` and `$merge` write into the store and yield no documents.
    /// Unknown stages fail with 40324.
    pub fn aggregate(
        &mut self,
        db: &str,
        coll: &str,
        pipeline: &[Document],
    ) -> EngineResult<Vec<Document>> {
        let _ = (db, coll, pipeline);
        Err(EngineError::illegal_operation("not implemented yet"))
    }

    /// Runs `stages` over `input` (documents the server produced, e.g. from `$listLocalSessions`
    /// or `$changeStream`, or nothing for `$documents`). `db` is the namespace for `$out`/`$merge`.
    pub fn run_pipeline(
        &mut self,
        db: &str,
        input: Vec<Document>,
        stages: &[Document],
    ) -> EngineResult<Vec<Document>> {
        let _ = (db, input, stages);
        Err(EngineError::illegal_operation("not implemented yet"))
    }
}
