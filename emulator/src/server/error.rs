//! Command errors as mongod shapes them on the wire, and the error-label rules.

use std::borrow::Cow;

use bson::{doc, Bson, Document};

use crate::engine::EngineError;

/// A command-level failure (`ok: 0`).
#[derive(Debug, Clone, PartialEq)]
pub struct CommandError {
    /// mongod's error code.
    pub code: i32,
    /// mongod's code name.
    pub code_name: Cow<'static, str>,
    /// Human-readable message.
    pub errmsg: String,
    /// Labels fixed by whoever raised the error (`None`: computed by the label rules).
    pub labels: Option<Vec<String>>,
    /// Extra top-level fields of the error reply (e.g. `topologyVersion`).
    pub extra: Option<Box<Document>>,
}

impl CommandError {
    /// The reply of a mongod 8.0 without a search deployment (mongot) to the search-index
    /// commands and `$listSearchIndexes`: its text names Atlas, which the index-management
    /// suite checks.
    pub fn search_not_enabled() -> Self {
        CommandError::new(
            codes::SEARCH_NOT_ENABLED,
            "Using Atlas Search Database Commands and the $listSearchIndexes aggregation stage \
             requires additional configuration. Please connect to Atlas or an AtlasCLI local \
             deployment to enable.",
        )
    }

    /// An error with the code name looked up in [`code_name`].
    pub fn new(code: i32, errmsg: impl Into<String>) -> Self {
        CommandError {
            code,
            code_name: code_name(code),
            errmsg: errmsg.into(),
            labels: None,
            extra: None,
        }
    }

    /// 2 BadValue.
    pub fn bad_value(msg: impl Into<String>) -> Self {
        Self::new(codes::BAD_VALUE, msg)
    }

    /// 14 TypeMismatch.
    pub fn type_mismatch(msg: impl Into<String>) -> Self {
        Self::new(codes::TYPE_MISMATCH, msg)
    }

    /// 9 FailedToParse.
    pub fn failed_to_parse(msg: impl Into<String>) -> Self {
        Self::new(codes::FAILED_TO_PARSE, msg)
    }

    /// Renders the error body (`ok: 0.0, errmsg, code, codeName`, extra fields). Labels are added
    /// by the reply builder.
    pub fn to_document(&self) -> Document {
        let mut d = doc! {
            "ok": 0.0,
            "errmsg": self.errmsg.clone(),
            "code": self.code,
            "codeName": self.code_name.as_ref(),
        };
        for (k, v) in self.extra.iter().flat_map(|e| e.iter()) {
            d.insert(k.clone(), v.clone());
        }
        d
    }
}

impl From<EngineError> for CommandError {
    fn from(e: EngineError) -> Self {
        CommandError {
            code: e.code,
            code_name: Cow::Borrowed(e.code_name),
            errmsg: e.message,
            labels: None,
            // DuplicateKey's keyPattern and keyValue, beside errmsg as mongod puts them.
            extra: e.details,
        }
    }
}

/// Error codes the server raises itself.
pub mod codes {
    #![allow(missing_docs)]
    pub const BAD_VALUE: i32 = 2;
    pub const FAILED_TO_PARSE: i32 = 9;
    pub const USER_NOT_FOUND: i32 = 11;
    pub const UNAUTHORIZED: i32 = 13;
    pub const PROTOCOL_ERROR: i32 = 17;
    pub const AUTHENTICATION_FAILED: i32 = 18;
    pub const ROLE_NOT_FOUND: i32 = 31;
    pub const MECHANISM_UNAVAILABLE: i32 = 334;
    pub const IDL_MISSING_FIELD: i32 = 40414;
    pub const LOCATION_USER_EXISTS: i32 = 51003;
    pub const TYPE_MISMATCH: i32 = 14;
    pub const ILLEGAL_OPERATION: i32 = 20;
    pub const NAMESPACE_NOT_FOUND: i32 = 26;
    pub const CURSOR_NOT_FOUND: i32 = 43;
    pub const COMMAND_NOT_FOUND: i32 = 59;
    pub const INVALID_OPTIONS: i32 = 72;
    pub const INVALID_NAMESPACE: i32 = 73;
    pub const OPERATION_FAILED: i32 = 96;
    pub const NO_SUCH_TRANSACTION: i32 = 251;
    pub const TRANSACTION_TOO_OLD: i32 = 225;
    pub const TRANSACTION_COMMITTED: i32 = 256;
    pub const TOO_MANY_CURSORS: i32 = 10_001;
    pub const NOT_WRITABLE_PRIMARY: i32 = 10107;
    pub const NOT_PRIMARY_NO_SECONDARY_OK: i32 = 13435;
    pub const CHANGE_STREAM_NOT_SUPPORTED: i32 = 40573;
    pub const SEARCH_NOT_ENABLED: i32 = 31082;
}

/// mongod's name for `code`; `Location<code>` for codes without a symbolic name here.
pub fn code_name(code: i32) -> Cow<'static, str> {
    let name = match code {
        280 => "ChangeStreamFatalError",
        239 => "SnapshotTooOld",
        123 => "NotAReplicaSet",
        47 => "NoMatchingDocument",
        1 => "InternalError",
        2 => "BadValue",
        4 => "NoSuchKey",
        6 => "HostUnreachable",
        7 => "HostNotFound",
        8 => "UnknownError",
        9 => "FailedToParse",
        11 => "UserNotFound",
        13 => "Unauthorized",
        14 => "TypeMismatch",
        15 => "Overflow",
        17 => "ProtocolError",
        18 => "AuthenticationFailed",
        20 => "IllegalOperation",
        24 => "LockTimeout",
        26 => "NamespaceNotFound",
        31 => "RoleNotFound",
        27 => "IndexNotFound",
        43 => "CursorNotFound",
        48 => "NamespaceExists",
        50 => "MaxTimeMSExpired",
        59 => "CommandNotFound",
        63 => "StaleShardVersion",
        64 => "WriteConcernFailed",
        72 => "InvalidOptions",
        73 => "InvalidNamespace",
        76 => "NoReplicationEnabled",
        79 => "UnknownReplWriteConcern",
        85 => "IndexOptionsConflict",
        86 => "IndexKeySpecsConflict",
        89 => "NetworkTimeout",
        91 => "ShutdownInProgress",
        95 => "NotSecondary",
        96 => "OperationFailed",
        100 => "UnsatisfiableWriteConcern",
        112 => "WriteConflict",
        115 => "CommandNotSupported",
        133 => "FailedToSatisfyReadPreference",
        134 => "ReadConcernMajorityNotAvailableYet",
        150 => "StaleEpoch",
        175 => "QueryPlanKilled",
        189 => "PrimarySteppedDown",
        211 => "KeyNotFound",
        225 => "TransactionTooOld",
        237 => "CursorKilled",
        244 => "TransactionAborted",
        251 => "NoSuchTransaction",
        256 => "TransactionCommitted",
        262 => "ExceededTimeLimit",
        263 => "OperationNotSupportedInTransaction",
        279 => "ClientDisconnect",
        290 => "TransactionExceededLifetimeLimitSeconds",
        334 => "MechanismUnavailable",
        358 => "InternalTransactionNotSupported",
        402 => "ResumableChangeStreamError",
        407 => "ReadThroughCacheLookupCanceled",
        412 => "UpdatedDocumentCollectionUUIDMismatch",
        433 => "AdmissionQueueOverflow",
        449 => "RateLimitExceeded",
        450 => "PooledConnectionAcquisitionRejected",
        453 => "RetryableTransactionInProgress",
        462 => "IngressRequestRateLimitExceeded",
        9001 => "SocketException",
        10107 => "NotWritablePrimary",
        10334 => "BSONObjectTooLarge",
        11000 => "DuplicateKey",
        11600 => "InterruptedAtShutdown",
        11601 => "Interrupted",
        11602 => "InterruptedDueToReplStateChange",
        13388 => "StaleConfig",
        13435 => "NotPrimaryNoSecondaryOk",
        13436 => "NotPrimaryOrSecondary",
        31082 => "SearchNotEnabled",
        40573 => "Location40573",
        _ => return Cow::Owned(format!("Location{code}")),
    };
    Cow::Borrowed(name)
}

/// Codes in mongod's `RetriableError` category (`error_codes.yml`).
pub fn is_retriable_code(code: i32) -> bool {
    matches!(
        code,
        6 | 7
            | 89
            | 91
            | 134
            | 189
            | 262
            | 402
            | 407
            | 412
            | 453
            | 462
            | 9001
            | 10107
            | 11600
            | 11602
            | 13435
            | 13436
            | 63
            | 150
            | 13388
    )
}

/// Codes in mongod's `SystemOverloadedError` category.
pub fn is_overload_code(code: i32) -> bool {
    matches!(code, 433 | 449 | 450 | 462)
}

/// What the label rules need to know about the request.
#[derive(Debug, Clone, Copy, Default)]
pub struct LabelContext {
    /// The request carried `txnNumber` without `autocommit` (a retryable write).
    pub retryable_write: bool,
    /// The request carried `autocommit: false` (a transaction statement).
    pub in_transaction: bool,
    /// The command is `commitTransaction` or `abortTransaction`.
    pub commit_or_abort: bool,
    /// The command is a `getMore` on a change stream cursor.
    pub change_stream_get_more: bool,
}

/// Codes mongod (4.4+) labels `ResumableChangeStreamError` on a change stream's getMore: network
/// errors, not-primary and shutdown errors, stale routing, and the explicit retry codes.
pub fn is_resumable_change_stream_code(code: i32) -> bool {
    matches!(
        code,
        6 | 7
            | 63
            | 89
            | 91
            | 133
            | 150
            | 189
            | 234
            | 262
            | 9001
            | 10107
            | 11600
            | 11602
            | 13388
            | 13435
            | 13436
    )
}

/// Codes after which mongod says the whole transaction may be retried, on any command of the
/// transaction, commit and abort included (its `isTransientTransactionError`): WriteConflict
/// (112), LockTimeout (24), PreparedTransactionInProgress (267), and the snapshot errors
/// SnapshotUnavailable (246) and SnapshotTooOld (239). NoSuchTransaction (251) is handled by the
/// caller, since on commit or abort it depends on the write concern error.
fn is_transient_transaction_code(code: i32) -> bool {
    matches!(code, 112 | 24 | 267 | 246 | 239)
}

/// The labels mongod computes for an error with `code` (used when no fail point overrides them).
pub fn computed_labels(code: i32, ctx: LabelContext) -> Vec<String> {
    let mut labels = Vec::new();
    if ctx.commit_or_abort {
        // NoSuchTransaction on commit/abort is transient only without a write concern error;
        // write concern errors are labelled separately by the reply builder.
        if is_transient_transaction_code(code) || code == 251 {
            labels.push("TransientTransactionError".to_string());
        }
        if is_retriable_code(code) {
            labels.push("RetryableWriteError".to_string());
        }
    } else if ctx.in_transaction {
        if is_transient_transaction_code(code) || code == 251 || is_retriable_code(code) {
            labels.push("TransientTransactionError".to_string());
        }
    } else if ctx.retryable_write && is_retriable_code(code) {
        labels.push("RetryableWriteError".to_string());
    }
    if ctx.change_stream_get_more && is_resumable_change_stream_code(code) {
        labels.push("ResumableChangeStreamError".to_string());
    }
    if is_overload_code(code) {
        labels.push("SystemOverloadedError".to_string());
        if is_retriable_code(code) {
            labels.push("RetryableError".to_string());
        }
    }
    labels
}

/// Writes `labels` into `reply` as `errorLabels` (omitted when empty).
pub fn set_labels(reply: &mut Document, labels: &[String]) {
    if labels.is_empty() {
        reply.remove("errorLabels");
    } else {
        reply.insert(
            "errorLabels",
            Bson::Array(labels.iter().map(|l| Bson::String(l.clone())).collect()),
        );
    }
}

#[cfg(test)]
mod transaction_label_tests {
    use super::{computed_labels, LabelContext};

    fn labels(code: i32, in_transaction: bool, commit_or_abort: bool) -> Vec<String> {
        let ctx = LabelContext {
            retryable_write: false,
            in_transaction,
            commit_or_abort,
            change_stream_get_more: false,
        };
        computed_labels(code, ctx)
    }

    #[test]
    fn commit_errors_mongod_calls_transient_are_labelled_so() {
        // PreparedTransactionInProgress, SnapshotUnavailable, SnapshotTooOld, WriteConflict,
        // LockTimeout, NoSuchTransaction: transient on commit and on a statement.
        for code in [267, 246, 239, 112, 24, 251] {
            for (in_txn, commit) in [(false, true), (true, false)] {
                assert!(
                    labels(code, in_txn, commit).contains(&"TransientTransactionError".into()),
                    "code {code}, commit {commit}"
                );
            }
        }
        // An ordinary error is not, and outside a transaction nothing is.
        assert!(labels(11000, false, true).is_empty());
        assert!(labels(267, false, false).is_empty());
    }
}
