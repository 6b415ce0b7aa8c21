//! What an operation came to: the driver's verdict, and client bulk write results rendered the
//! way the unified format writes them (a successful `clientBulkWrite` returns one, a failed one
//! may carry a partial one in its error). Both the module that runs operations and the one that
//! checks them against expectations use these, so they live below both.

use std::collections::HashMap;

use bson::{doc, Bson, Document};

use crate::entities::Entity;
use crate::mongodb::error::Error as DriverError;
use crate::mongodb::results::{
    DeleteResult, InsertOneResult, SummaryBulkWriteResult, UpdateResult, VerboseBulkWriteResult,
};

/// What an operation produced when it did not fail.
pub enum Produced {
    /// A value, or none (`None`: the operation returns nothing, e.g. `commitTransaction`).
    Value(Option<Bson>),
    /// The documents an iterable result yielded (`find`, `aggregate`, `listIndexes`, ...). The
    /// format matches each as a root-level document, unlike the documents in a plain array
    /// value such as a `distinct` result.
    Documents(Vec<Document>),
    /// A driver object the format stores as an entity (a cursor, a change stream).
    Entity(Entity),
}

impl Produced {
    /// The produced value as BSON (an iterable's documents as an array); `None` for no value
    /// and for an entity.
    pub fn to_bson(&self) -> Option<Bson> {
        match self {
            Produced::Value(v) => v.clone(),
            Produced::Documents(docs) => Some(Bson::Array(
                docs.iter().cloned().map(Bson::Document).collect(),
            )),
            Produced::Entity(_) => None,
        }
    }
}

/// The driver's verdict on an operation.
pub type DriverResult = Result<Produced, DriverError>;

fn summary_doc(s: &SummaryBulkWriteResult) -> Document {
    doc! {
        "insertedCount": s.inserted_count,
        "upsertedCount": s.upserted_count,
        "matchedCount": s.matched_count,
        "modifiedCount": s.modified_count,
        "deletedCount": s.deleted_count,
    }
}

/// A summary client bulk write result as the unified format writes it: empty per-model maps.
pub fn summary_bulk_result(s: &SummaryBulkWriteResult) -> Bson {
    let mut d = summary_doc(s);
    d.insert("insertResults", Document::new());
    d.insert("updateResults", Document::new());
    d.insert("deleteResults", Document::new());
    Bson::Document(d)
}

fn indexed<T>(map: &HashMap<usize, T>, f: impl Fn(&T) -> Document) -> Document {
    let mut keys: Vec<_> = map.keys().copied().collect();
    keys.sort_unstable();
    keys.into_iter()
        .map(|k| (k.to_string(), Bson::Document(f(&map[&k]))))
        .collect()
}

/// A verbose client bulk write result as the unified format writes it.
pub fn verbose_bulk_result(v: &VerboseBulkWriteResult) -> Bson {
    let mut d = summary_doc(&v.summary);
    d.insert(
        "insertResults",
        indexed(
            &v.insert_results,
            |r: &InsertOneResult| doc! {"insertedId": r.inserted_id.clone()},
        ),
    );
    d.insert(
        "updateResults",
        indexed(&v.update_results, |r: &UpdateResult| {
            let mut u = doc! {
                "matchedCount": r.matched_count as i64,
                "modifiedCount": r.modified_count as i64,
            };
            if let Some(id) = &r.upserted_id {
                u.insert("upsertedId", id.clone());
            }
            u
        }),
    );
    d.insert(
        "deleteResults",
        indexed(
            &v.delete_results,
            |r: &DeleteResult| doc! {"deletedCount": r.deleted_count as i64},
        ),
    );
    Bson::Document(d)
}
