//! Views: read-only namespaces defined by `create` with `viewOn` and `pipeline`.
//!
//! A view is stored in the catalog as a [`Collection`] with no documents whose options hold
//! `viewOn`, `pipeline` and, optionally, `collation`. Reads resolve it to the collection it is
//! ultimately defined on and the concatenated pipelines (a view on a view runs the inner view's
//! pipeline first), as mongod does; writes to it fail with 166 CommandNotSupportedOnView.
//! mongod limits view chains to 20; so does the emulator (and the bound keeps resolution
//! finite).
//!
//! The catalog checks a view's `create` options and tells a view from a collection
//! (`Collection::is_view`); this module only reads what the catalog stored, so it depends on
//! the catalog and the catalog does not depend on it.

use bson::Document;

use super::catalog::Collection;
use super::error::{EngineError, EngineResult};
use super::Store;

/// mongod's limit on the length of a chain of views.
pub(crate) const MAX_VIEW_DEPTH: usize = 20;

/// A view resolved to the collection it reads.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedView {
    /// The backing collection (in the same database).
    pub source: String,
    /// The pipelines of every view in the chain, innermost first.
    pub pipeline: Vec<Document>,
    /// The outermost view's collation, if it has one (a view's default collation).
    pub collation: Option<Document>,
}

/// 166 CommandNotSupportedOnView, as mongod reports a write to a view.
pub fn not_supported_on_view(db: &str, view: &str) -> EngineError {
    EngineError::command_not_supported_on_view(format!(
        "Namespace {db}.{view} is a view, not a collection"
    ))
}

impl Store {
    /// Whether `db.name` is a view.
    pub fn is_view(&self, db: &str, name: &str) -> bool {
        self.collection(db, name).is_some_and(Collection::is_view)
    }

    /// Resolves `db.name` when it is a view: the collection it reads and the pipeline to run
    /// over it. `None` for a collection or a missing namespace.
    pub fn resolve_view(&self, db: &str, name: &str) -> EngineResult<Option<ResolvedView>> {
        let mut current = name.to_owned();
        let mut chain: Vec<Vec<Document>> = Vec::new();
        let mut collation = None;
        for _ in 0..=MAX_VIEW_DEPTH {
            let Some(c) = self.collection(db, &current).filter(|c| c.is_view()) else {
                if chain.is_empty() {
                    return Ok(None);
                }
                let pipeline = chain.into_iter().rev().flatten().collect();
                return Ok(Some(ResolvedView {
                    source: current,
                    pipeline,
                    collation,
                }));
            };
            if chain.is_empty() {
                collation = c.options.get_document("collation").ok().cloned();
            }
            let stages = c
                .options
                .get_array("pipeline")
                .map(|a| a.iter().filter_map(|s| s.as_document().cloned()).collect())
                .unwrap_or_default();
            chain.push(stages);
            current = c.options.get_str("viewOn").unwrap_or_default().to_owned();
        }
        Err(EngineError::view_depth_limit_exceeded(format!(
            "View depth too deep or view cycle detected; maximum depth is {MAX_VIEW_DEPTH}"
        )))
    }

    /// The default collation of `db.name`: a view's or a collection's `collation` option.
    pub fn default_collation(&self, db: &str, name: &str) -> Option<Document> {
        self.collection(db, name)?
            .options
            .get_document("collation")
            .ok()
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn views_resolve_through_chains_and_list_as_views() {
        let mut s = Store::new();
        s.insert("db", "c", vec![doc! {"_id": 1}, doc! {"_id": 2}], true);
        s.create_collection(
            "db",
            "v1",
            &doc! {"viewOn": "c", "pipeline": [{"$match": {"_id": {"$gt": 1}}}]},
        )
        .unwrap();
        s.create_collection("db", "v2", &doc! {"viewOn": "v1", "pipeline": [{"$project": {"_id": 1}}], "collation": {"locale": "fr"}})
            .unwrap();
        assert!(s.is_view("db", "v2") && !s.is_view("db", "c"));
        let view = s.resolve_view("db", "v2").unwrap().unwrap();
        assert_eq!(view.source, "c");
        assert_eq!(
            view.pipeline,
            vec![
                doc! {"$match": {"_id": {"$gt": 1}}},
                doc! {"$project": {"_id": 1}}
            ]
        );
        assert_eq!(view.collation, Some(doc! {"locale": "fr"}));
        assert_eq!(s.resolve_view("db", "c").unwrap(), None);
        let listed = s
            .list_collections("db", Some(&doc! {"name": "v1"}), false)
            .unwrap();
        assert_eq!(listed[0].get_str("type"), Ok("view"));
        assert_eq!(
            listed[0].get_document("info").unwrap().get_bool("readOnly"),
            Ok(true)
        );
        assert!(!listed[0].contains_key("idIndex"));
        // A view cannot have collection options, and needs a string viewOn.
        assert!(s
            .create_collection("db", "v3", &doc! {"viewOn": "c", "capped": true})
            .is_err());
        assert!(s
            .create_collection("db", "v4", &doc! {"viewOn": 1})
            .is_err());
    }

    #[test]
    fn a_view_cycle_stops_at_the_depth_limit() {
        let mut s = Store::new();
        s.create_collection("db", "a", &doc! {"viewOn": "b"})
            .unwrap();
        s.create_collection("db", "b", &doc! {"viewOn": "a"})
            .unwrap();
        let err = s.resolve_view("db", "a").unwrap_err();
        assert_eq!((err.code, err.code_name), (165, "ViewDepthLimitExceeded"));
        let write = not_supported_on_view("db", "a");
        assert_eq!(
            (write.code, write.message.as_str()),
            (166, "Namespace db.a is a view, not a collection")
        );
    }
}
