//! The engine's single error type, shaped so the server can render `{ok: 0, errmsg, code, codeName}`.

use std::fmt;

/// An error with mongod's numeric code and code name.
///
/// `code_name` is spelled exactly as mongod spells it (for "location" codes that have no
/// symbolic name mongod reports `Location<code>`, and so does the engine).
#[derive(Debug, Clone, PartialEq)]
pub struct EngineError {
    /// mongod's error code, e.g. 11000.
    pub code: i32,
    /// mongod's code name, e.g. `"DuplicateKey"`.
    pub code_name: &'static str,
    /// The human-readable message (mongod's `errmsg`).
    pub message: String,
    /// Extra fields mongod puts beside `errmsg` (e.g. `keyPattern` and `keyValue` for
    /// DuplicateKey), for the server to copy into the error or write-error document.
    pub details: Option<Box<bson::Document>>,
}

/// Result alias used throughout the engine.
pub type EngineResult<T> = Result<T, EngineError>;

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code_name, self.code, self.message)
    }
}

impl std::error::Error for EngineError {}

macro_rules! codes {
    ($($fn_name:ident => $code:expr, $name:expr;)*) => {
        impl EngineError {
            $(
                #[doc = concat!("`", $name, "` (", stringify!($code), ").")]
                pub fn $fn_name(message: impl Into<String>) -> Self {
                    EngineError { code: $code, code_name: $name, message: message.into(), details: None }
                }
            )*
        }
    };
}

codes! {
    bad_value => 2, "BadValue";
    dollar_prefixed_field_name => 52, "DollarPrefixedFieldName";
    no_such_key => 4, "NoSuchKey";
    failed_to_parse => 9, "FailedToParse";
    type_mismatch => 14, "TypeMismatch";
    overflow => 15, "Overflow";
    illegal_operation => 20, "IllegalOperation";
    namespace_not_found => 26, "NamespaceNotFound";
    index_not_found => 27, "IndexNotFound";
    path_not_viable => 28, "PathNotViable";
    conflicting_update_operators => 40, "ConflictingUpdateOperators";
    namespace_exists => 48, "NamespaceExists";
    invalid_id_field => 53, "InvalidIdField";
    immutable_field => 66, "ImmutableField";
    cannot_create_index => 67, "CannotCreateIndex";
    invalid_options => 72, "InvalidOptions";
    invalid_namespace => 73, "InvalidNamespace";
    index_options_conflict => 85, "IndexOptionsConflict";
    index_key_specs_conflict => 86, "IndexKeySpecsConflict";
    view_depth_limit_exceeded => 165, "ViewDepthLimitExceeded";
    command_not_supported_on_view => 166, "CommandNotSupportedOnView";
    invalid_pipeline_operator => 168, "InvalidPipelineOperator";
    cannot_convert_index_to_unique => 359, "CannotConvertIndexToUnique";
    document_validation_failure => 121, "DocumentValidationFailure";
    bson_object_too_large => 10334, "BSONObjectTooLarge";
    duplicate_key => 11000, "DuplicateKey";
    merge_stage_no_matching_document => 13113, "MergeStageNoMatchingDocument";
}

impl EngineError {
    /// An error identified only by a numeric "location" code, named `Location<code>` as mongod
    /// does for assertion sites without a symbolic code.
    pub fn location(code: i32, message: impl Into<String>) -> Self {
        // Leaking is bounded: only a handful of distinct location codes exist in the engine, and
        // each name is interned once.
        EngineError {
            code,
            code_name: location_name(code),
            message: message.into(),
            details: None,
        }
    }
}

impl EngineError {
    /// Attaches extra reply fields (see [`EngineError::details`]).
    pub fn with_details(mut self, details: bson::Document) -> Self {
        self.details = Some(Box::new(details));
        self
    }
}

fn location_name(code: i32) -> &'static str {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static NAMES: OnceLock<Mutex<HashMap<i32, &'static str>>> = OnceLock::new();
    let names = NAMES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut guard = match names.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    };
    guard
        .entry(code)
        .or_insert_with(|| Box::leak(format!("Location{code}").into_boxed_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_codes_are_named_like_mongod() {
        let e = EngineError::location(40324, "x");
        assert_eq!(e.code_name, "Location40324");
        assert_eq!(
            EngineError::location(40324, "y").code_name.as_ptr(),
            e.code_name.as_ptr()
        );
    }

    #[test]
    fn display_includes_code_and_name() {
        let e = EngineError::duplicate_key("E11000");
        assert_eq!(e.to_string(), "DuplicateKey (11000): E11000");
    }
}
