//! Document validation: a collection's `validator` (a query filter), `validationLevel` and
//! `validationAction`, set by `create` or `collMod`, checked on every insert and update.
//!
//! As in mongod: level `strict` (the default) checks every write, `moderate` skips updates of
//! documents that did not satisfy the validator before, `off` checks nothing; action `error`
//! (the default) fails the write with 121 DocumentValidationFailure, `warn` lets it through.
//! A command's `bypassDocumentValidation: true` skips the check (the server binds it with
//! [`with_bypass`] around the command).
//!
//! Left out: `$jsonSchema` validators are accepted and stored but not enforced (the matcher
//! has no `$jsonSchema`), and the error's `errInfo.details` names the failing operator and the
//! validator as given rather than mongod's full explanation tree.

use std::cell::Cell;

use bson::{doc, Bson, Document};

use super::error::{EngineError, EngineResult};
use super::query::matches;

thread_local! {
    static BYPASS: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with document validation bypassed when `bypass` is true (restored afterwards,
/// even if `f` unwinds).
pub fn with_bypass<R>(bypass: bool, f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            BYPASS.with(|b| b.set(self.0));
        }
    }
    let outer = BYPASS.with(|b| b.replace(bypass));
    let _restore = Restore(outer);
    f()
}

/// Whether a validator uses `$jsonSchema` at its top level, which the emulator does not
/// enforce.
fn uses_json_schema(validator: &Document) -> bool {
    validator.keys().any(|k| k == "$jsonSchema")
}

/// Checks `new` (the document to store; `old` is the one it replaces) against the collection's
/// validator.
pub(crate) fn validate(
    options: &Document,
    old: Option<&Document>,
    new: &Document,
) -> EngineResult<()> {
    let Ok(validator) = options.get_document("validator") else {
        return Ok(());
    };
    if validator.is_empty() || uses_json_schema(validator) || BYPASS.with(Cell::get) {
        return Ok(());
    }
    let level = options.get_str("validationLevel").unwrap_or("strict");
    let action = options.get_str("validationAction").unwrap_or("error");
    if level == "off" || action == "warn" {
        return Ok(());
    }
    if level == "moderate" {
        if let Some(old) = old {
            if !matches(validator, old)? {
                return Ok(());
            }
        }
    }
    if matches(validator, new)? {
        return Ok(());
    }
    let operator = validator
        .keys()
        .find(|k| k.starts_with('$'))
        .cloned()
        .unwrap_or_else(|| "$and".to_owned());
    let info = doc! {
        "failingDocumentId": new.get("_id").cloned().unwrap_or(Bson::Null),
        "details": {
            "operatorName": operator,
            "specifiedAs": validator.clone(),
        },
    };
    Err(
        EngineError::document_validation_failure("Document failed validation")
            .with_details(doc! { "errInfo": info }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_error_rejects_and_bypass_or_warn_let_through() {
        let options = doc! { "validator": { "x": { "$type": "string" } } };
        let bad = doc! { "_id": 1, "x": 1 };
        let err = validate(&options, None, &bad).unwrap_err();
        assert_eq!(
            (err.code, err.code_name),
            (121, "DocumentValidationFailure")
        );
        let info = err.details.unwrap();
        assert_eq!(
            info.get_document("errInfo")
                .unwrap()
                .get("failingDocumentId"),
            Some(&Bson::Int32(1))
        );
        assert!(validate(&options, None, &doc! { "_id": 2, "x": "s" }).is_ok());
        assert!(with_bypass(true, || validate(&options, None, &bad)).is_ok());
        assert!(validate(&options, None, &bad).is_err());
        let warn = doc! { "validator": { "x": 1 }, "validationAction": "warn" };
        assert!(validate(&warn, None, &bad).is_ok());
    }

    #[test]
    fn moderate_skips_documents_that_were_already_invalid() {
        let options = doc! { "validator": { "x": 1 }, "validationLevel": "moderate" };
        let old_invalid = doc! { "_id": 1, "x": 2 };
        assert!(validate(&options, Some(&old_invalid), &doc! { "_id": 1, "x": 3 }).is_ok());
        let old_valid = doc! { "_id": 1, "x": 1 };
        assert!(validate(&options, Some(&old_valid), &doc! { "_id": 1, "x": 3 }).is_err());
        // Inserts are always checked.
        assert!(validate(&options, None, &doc! { "_id": 1, "x": 3 }).is_err());
    }
}
