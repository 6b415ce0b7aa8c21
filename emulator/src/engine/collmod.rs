//! `collMod`: changes a collection's (or a view's) options and one index's options.
//!
//! Collection options: `validator`, `validationLevel`, `validationAction` (enforced, see
//! `validation.rs`), `changeStreamPreAndPostImages`, `expireAfterSeconds` and, for a view,
//! `viewOn` with `pipeline`. Index options, with the index named by `index.name` or
//! `index.keyPattern`: `hidden`, `expireAfterSeconds`, `prepareUnique` (new duplicates are
//! refused from then on) and `unique: true` (converts the index when no two documents share a
//! key; otherwise 359 CannotConvertIndexToUnique listing the conflicting `_id`s), replying with
//! mongod's `<option>_old` / `<option>_new` fields.

use std::collections::BTreeMap;

use bson::{doc, Bson, Document};

use super::compare::OrdBson;
use super::error::{EngineError, EngineResult};
use super::path::get_exact;
use super::Store;

/// The fields `collMod` takes besides its own name (generic command fields are removed by the
/// server before the call).
const FIELDS: &[&str] = &[
    "validator",
    "validationLevel",
    "validationAction",
    "changeStreamPreAndPostImages",
    "expireAfterSeconds",
    "viewOn",
    "pipeline",
    "index",
    "dryRun",
];

fn unknown_field(key: &str) -> EngineError {
    EngineError::location(
        40415,
        format!("BSON field 'collMod.{key}' is an unknown field."),
    )
}

impl Store {
    /// `collMod` on `db.coll` with `spec` (the command without `collMod` and generic fields).
    /// Returns the reply's fields besides `ok`.
    pub fn modify_collection(
        &mut self,
        db: &str,
        coll: &str,
        spec: &Document,
    ) -> EngineResult<Document> {
        if let Some(key) = spec.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(unknown_field(key));
        }
        let ns = format!("{db}.{coll}");
        let Some(collection) = self.collection_mut(db, coll) else {
            return Err(EngineError::namespace_not_found(format!(
                "ns does not exist: {ns}"
            )));
        };
        for key in ["validationLevel", "validationAction"] {
            let allowed: &[&str] = if key == "validationLevel" {
                &["off", "strict", "moderate"]
            } else {
                &["error", "warn", "errorAndLog"]
            };
            match spec.get(key) {
                None => {}
                Some(Bson::String(v)) if allowed.contains(&v.as_str()) => {}
                Some(other) => {
                    return Err(EngineError::bad_value(format!(
                    "Enumeration value '{other}' for field 'collMod.{key}' is not a valid value."
                )))
                }
            }
        }
        let is_view = collection.is_view();
        if (spec.contains_key("viewOn") || spec.contains_key("pipeline")) && !is_view {
            return Err(EngineError::invalid_options(
                "option 'viewOn' and 'pipeline' are only valid for views",
            ));
        }
        let mut reply = Document::new();
        if let Some(index) = spec.get("index") {
            let Bson::Document(index) = index else {
                return Err(EngineError::type_mismatch(
                    "BSON field 'collMod.index' is the wrong type, expected type 'object'",
                ));
            };
            reply = modify_index(collection, &ns, index)?;
        }
        for key in [
            "validator",
            "validationLevel",
            "validationAction",
            "changeStreamPreAndPostImages",
            "expireAfterSeconds",
            "viewOn",
            "pipeline",
        ] {
            if let Some(v) = spec.get(key) {
                collection.options.insert(key, v.clone());
            }
        }
        Ok(reply)
    }
}

/// Applies `collMod.index` to the collection's index it names.
fn modify_index(
    collection: &mut super::catalog::Collection,
    ns: &str,
    spec: &Document,
) -> EngineResult<Document> {
    for key in spec.keys() {
        if !matches!(
            key.as_str(),
            "keyPattern" | "name" | "hidden" | "expireAfterSeconds" | "prepareUnique" | "unique"
        ) {
            return Err(EngineError::location(
                40415,
                format!("BSON field 'collMod.index.{key}' is an unknown field."),
            ));
        }
    }
    let position = match (spec.get("name"), spec.get("keyPattern")) {
        (Some(Bson::String(name)), None) => collection
            .indexes
            .iter()
            .position(|i| i.get_str("name").is_ok_and(|n| n == name))
            .ok_or_else(|| {
                EngineError::index_not_found(format!("cannot find index {name} for ns {ns}"))
            })?,
        (None, Some(Bson::Document(pattern))) => collection
            .indexes
            .iter()
            .position(|i| i.get_document("key").is_ok_and(|k| k == pattern))
            .ok_or_else(|| {
                EngineError::index_not_found(format!("cannot find index {pattern} for ns {ns}"))
            })?,
        _ => {
            return Err(EngineError::invalid_options(
                "must specify exactly one of 'name' or 'keyPattern' in 'index'",
            ))
        }
    };
    let index = collection
        .indexes
        .get(position)
        .cloned()
        .unwrap_or_default();
    let flag = |d: &Document, k: &str| matches!(d.get(k), Some(Bson::Boolean(true)));
    let mut reply = Document::new();
    if let Some(unique) = spec.get("unique") {
        if !matches!(unique, Bson::Boolean(true)) {
            return Err(EngineError::bad_value(
                "The field 'unique' can only be set to true",
            ));
        }
        if !flag(&index, "unique") {
            if !flag(&index, "prepareUnique") && !flag(spec, "prepareUnique") {
                return Err(EngineError::invalid_options(
                    "Cannot make index unique with 'prepareUnique=false'. Run collMod to set it first.",
                ));
            }
            let key = index.get_document("key").cloned().unwrap_or_default();
            let violations = duplicate_groups(&collection.docs, &key);
            if !violations.is_empty() {
                let violations: Vec<Bson> = violations
                    .into_iter()
                    .map(|ids| Bson::Document(doc! { "ids": ids }))
                    .collect();
                return Err(EngineError::cannot_convert_index_to_unique(
                    "Cannot convert the index to unique. Please resolve conflicting documents before running collMod again.",
                )
                .with_details(doc! { "violations": violations }));
            }
            reply.insert("unique_new", true);
        }
    }
    for key in ["hidden", "prepareUnique", "expireAfterSeconds"] {
        let Some(new) = spec.get(key) else { continue };
        let old = index.get(key).cloned();
        if key != "expireAfterSeconds" && !matches!(new, Bson::Boolean(_)) {
            return Err(EngineError::type_mismatch(format!(
                "BSON field 'collMod.index.{key}' is the wrong type, expected type 'bool'"
            )));
        }
        let old_value = old.unwrap_or(if key == "expireAfterSeconds" {
            Bson::Null
        } else {
            Bson::Boolean(false)
        });
        if old_value != *new {
            reply.insert(format!("{key}_old"), old_value);
            reply.insert(format!("{key}_new"), new.clone());
        }
    }
    if let Some(slot) = collection.indexes.get_mut(position) {
        for key in ["hidden", "prepareUnique", "expireAfterSeconds", "unique"] {
            if let Some(v) = spec.get(key) {
                slot.insert(key, v.clone());
            }
        }
        if flag(slot, "unique") {
            // A unique index no longer carries the preparation flag.
            slot.remove("prepareUnique");
        }
    }
    Ok(reply)
}

/// The `_id`s of documents sharing a key of `key_pattern`, one group per duplicated key (in
/// key order), for 359's `violations`.
fn duplicate_groups(docs: &[bson::Document], key_pattern: &Document) -> Vec<Vec<Bson>> {
    let mut groups: BTreeMap<Vec<OrdBson>, Vec<Bson>> = BTreeMap::new();
    for d in docs {
        let key: Vec<OrdBson> = key_pattern
            .keys()
            .map(|k| OrdBson(get_exact(d, k).cloned().unwrap_or(Bson::Null)))
            .collect();
        groups
            .entry(key)
            .or_default()
            .push(d.get("_id").cloned().unwrap_or(Bson::Null));
    }
    groups.into_values().filter(|ids| ids.len() > 1).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> Store {
        let mut s = Store::new();
        s.insert(
            "db",
            "c",
            vec![doc! {"_id": 1, "x": 1}, doc! {"_id": 2, "x": 1}],
            true,
        );
        s.create_indexes("db", "c", &[doc! {"key": {"x": 1}, "name": "x_1"}])
            .unwrap();
        s
    }

    #[test]
    fn prepare_unique_refuses_new_duplicates_and_unique_lists_violations() {
        let mut s = store();
        let reply = s
            .modify_collection(
                "db",
                "c",
                &doc! {"index": {"keyPattern": {"x": 1}, "prepareUnique": true}},
            )
            .unwrap();
        assert_eq!(
            reply,
            doc! {"prepareUnique_old": false, "prepareUnique_new": true}
        );
        let out = s.insert("db", "c", vec![doc! {"_id": 3, "x": 1}], true);
        assert_eq!(out.write_errors[0].error.code, 11000);
        let err = s
            .modify_collection(
                "db",
                "c",
                &doc! {"index": {"keyPattern": {"x": 1}, "unique": true}},
            )
            .unwrap_err();
        assert_eq!(
            (err.code, err.code_name),
            (359, "CannotConvertIndexToUnique")
        );
        assert_eq!(
            err.details.as_deref(),
            Some(&doc! {"violations": [{"ids": [1, 2]}]})
        );
        // Once the conflict is gone the index converts.
        s.delete(
            "db",
            "c",
            &[crate::engine::DeleteStatement {
                filter: doc! {"_id": 2},
                just_one: true,
            }],
            true,
        );
        let reply = s
            .modify_collection("db", "c", &doc! {"index": {"name": "x_1", "unique": true}})
            .unwrap();
        assert_eq!(reply, doc! {"unique_new": true});
    }

    #[test]
    fn unique_needs_prepare_and_the_namespace_and_index_must_exist() {
        let mut s = store();
        let unique = doc! {"index": {"name": "x_1", "unique": true}};
        assert_eq!(
            s.modify_collection("db", "c", &unique).unwrap_err().code,
            72
        );
        assert_eq!(
            s.modify_collection("db", "none", &doc! {})
                .unwrap_err()
                .code,
            26
        );
        let missing = doc! {"index": {"name": "y_1", "hidden": true}};
        assert_eq!(
            s.modify_collection("db", "c", &missing).unwrap_err().code,
            27
        );
        assert_eq!(
            s.modify_collection("db", "c", &doc! {"bogus": 1})
                .unwrap_err()
                .code,
            40415
        );
    }

    #[test]
    fn a_validator_set_by_coll_mod_is_enforced() {
        let mut s = store();
        s.modify_collection("db", "c", &doc! {"validator": {"x": {"$type": "string"}}})
            .unwrap();
        let out = s.insert("db", "c", vec![doc! {"_id": 5, "x": 1}], true);
        let e = &out.write_errors[0].error;
        assert_eq!(e.code, 121);
        let info = e
            .details
            .as_deref()
            .and_then(|d| d.get_document("errInfo").ok());
        assert_eq!(
            info.and_then(|i| i.get("failingDocumentId")),
            Some(&Bson::Int32(5))
        );
        let bypassed = crate::engine::with_bypass(true, || {
            s.insert("db", "c", vec![doc! {"_id": 6, "x": 1}], true)
        });
        assert!(bypassed.write_errors.is_empty());
    }
}
