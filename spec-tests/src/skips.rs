//! Every reason a case is skipped, in one place. `docs/spec-tests.md` lists the same table; keep
//! the two in step.

/// Whole specs (by directory name) whose cases are all skipped. None today; the table stays so a
/// newly added suite the runner cannot run has one place to go.
pub const SKIPPED_SPECS: &[(&str, &str)] = &[];

/// `timeoutMS` is implemented in stages (`docs/timeouts.md`); these say which stage a skipped
/// CSOT case waits for.
/// `timeoutMS` on an operation the specification gives none (startTransaction, endSession).
pub const NO_TIMEOUT_OF_ITS_OWN: &str =
    "the specification gives this operation no timeoutMS of its own (it runs no command, or \
     only the session's)";
/// Operations whose own `timeoutMS` belongs to a later stage, by stage.
const TIMEOUT_LATER_STAGE_OPERATIONS: &[(&str, &str)] = &[
    // The specification gives startTransaction and endSession no timeoutMS of their own.
    ("startTransaction", NO_TIMEOUT_OF_ITS_OWN),
    ("endSession", NO_TIMEOUT_OF_ITS_OWN),
];

/// Why an operation's `timeoutMS` argument cannot be honoured (the caller has checked that the
/// operation has no per-call timeout): a later stage, or no per-call override in stage 1.
pub fn timeout_argument(operation: &str) -> &'static str {
    lookup(TIMEOUT_LATER_STAGE_OPERATIONS, operation).unwrap_or(NO_PER_CALL_TIMEOUT)
}

/// A per-operation `timeoutMS` on an action that only inherits its timeout in stage 1.
pub const NO_PER_CALL_TIMEOUT: &str =
    "the driver has no per-call timeoutMS for this operation in stage 1 (it only inherits the \
     client's, database's or collection's)";

/// The `rawData` argument (timeseries buckets, server 8.2) on any operation.
pub const NO_RAW_DATA: &str = "the Rust driver has no rawData option";

/// Operations (by `name`, any object) the runner cannot execute, and why.
pub const UNSUPPORTED_OPERATIONS: &[(&str, &str)] = &[
    ("bulkWrite", "collection-level bulkWrite has no Rust API"),
    ("count", "the Rust driver has no deprecated count helper"),
    ("mapReduce", "the Rust driver has no mapReduce helper"),
    ("rename", "runner does not implement rename"),
    (
        "assertSessionTransactionState",
        "the Rust driver does not expose a session's transaction state",
    ),
    (
        "assertSessionPinned",
        "the Rust driver does not expose session pinning",
    ),
    (
        "assertSessionUnpinned",
        "the Rust driver does not expose session pinning",
    ),
    (
        "assertSessionDirty",
        "the Rust driver does not expose a session's dirty flag",
    ),
    (
        "assertSessionNotDirty",
        "the Rust driver does not expose a session's dirty flag",
    ),
];

/// Entity types the runner does not create.
pub const UNSUPPORTED_ENTITIES: &[(&str, &str)] = &[(
    "clientEncryption",
    "client-side encryption is not enabled in this build",
)];

/// Client `uriOptions` the Rust driver has no setting for.
pub const UNSUPPORTED_CLIENT_URI_OPTIONS: &[(&str, &str)] =
    &[("socketTimeoutMS", "the Rust driver has no socketTimeoutMS")];

/// Client entity fields the runner does not implement.
pub const UNSUPPORTED_CLIENT_FIELDS: &[(&str, &str)] = &[
    (
        "autoEncryptOpts",
        "client-side encryption is not enabled in this build",
    ),
    (
        "storeEventsAsEntities",
        "runner does not implement storeEventsAsEntities",
    ),
];

/// URI options (uri-options suite) with no field in the Rust `ClientOptions`, or a build feature
/// this crate does not enable.
pub const URI_OPTIONS_WITHOUT_FIELD: &[(&str, &str)] = &[
    ("socketTimeoutMS", "the Rust driver has no socketTimeoutMS"),
    (
        "serverSelectionTryOnce",
        "the Rust driver has no serverSelectionTryOnce",
    ),
    (
        "tlsInsecure",
        "the Rust driver exposes no tlsInsecure field",
    ),
    (
        "tlsAllowInvalidHostnames",
        "the Rust driver has this field only with the openssl-tls feature",
    ),
    (
        "tlsCertificateKeyFilePassword",
        "the Rust driver exposes no tlsCertificateKeyFilePassword field",
    ),
    (
        "tlsDisableCertificateRevocationCheck",
        "the Rust driver has no certificate revocation settings",
    ),
    (
        "tlsDisableOCSPEndpointCheck",
        "the Rust driver has no OCSP settings",
    ),
    (
        "compressors",
        "compression features are not enabled in this build",
    ),
    (
        "zlibCompressionLevel",
        "compression features are not enabled in this build",
    ),
];

/// Connection-string fragments (matched case-insensitively) that need a driver feature this
/// crate does not enable.
pub const URI_FEATURES: &[(&str, &str)] = &[
    (
        "proxyhost=",
        "SOCKS5 proxy options need the driver's socks5-proxy feature (not enabled)",
    ),
    (
        "authmechanism=gssapi",
        "GSSAPI needs the driver's gssapi-auth feature (not enabled)",
    ),
];

/// SRV URIs need a DNS lookup, which the test machines cannot do.
pub const URI_SRV_NEEDS_DNS: &str = "mongodb+srv URIs need DNS SRV lookups (no network in tests)";

/// Used while no emulator is available and `MONGODB_URI` is unset.
pub const NO_TARGET: &str =
    "no server: built without the emulator feature and MONGODB_URI is unset";

/// The Rust driver refuses unacknowledged writes outright.
pub const UNACKNOWLEDGED: &str = "the Rust driver rejects unacknowledged (w: 0) writes";

/// insertMany's error (`InsertManyError`) exposes no partial result (its inserted ids are
/// crate-private), so a partial-result assertion has nothing to read.
pub const INSERT_MANY_NO_PARTIAL_RESULT: &str =
    "the Rust driver's insertMany error exposes no partial result";

/// Cases (`<spec>/<file-stem>/<description>`, or a `<spec>/<file-stem>` prefix) that test
/// something the Rust driver has no API for, found only by running them.
pub const SKIPPED_CASES: &[(&str, &str)] = &[
    (
        "retryable-writes/unacknowledged-write-concern",
        UNACKNOWLEDGED,
    ),
    // CRUD files whose collection entity has `w: 0`; the pre-4.4 cases skip on the version.
    ("crud/deleteMany-hint-unacknowledged", UNACKNOWLEDGED),
    ("crud/deleteOne-hint-unacknowledged", UNACKNOWLEDGED),
    ("crud/findOneAndDelete-hint-unacknowledged", UNACKNOWLEDGED),
    ("crud/findOneAndReplace-hint-unacknowledged", UNACKNOWLEDGED),
    ("crud/findOneAndUpdate-hint-unacknowledged", UNACKNOWLEDGED),
    ("crud/replaceOne-hint-unacknowledged", UNACKNOWLEDGED),
    ("crud/updateMany-hint-unacknowledged", UNACKNOWLEDGED),
    ("crud/updateOne-hint-unacknowledged", UNACKNOWLEDGED),
    // The driver refuses every w: 0 write with its own message before it could check the
    // combination these cases are about.
    (
        "crud/client-bulkWrite-errors/Requesting unacknowledged write with verboseResults is a client-side error",
        UNACKNOWLEDGED,
    ),
    (
        "crud/client-bulkWrite-errors/Requesting unacknowledged write with ordered is a client-side error",
        UNACKNOWLEDGED,
    ),
    (
        "crud/insertMany/InsertMany continue-on-error behavior with unordered (preexisting duplicate key)",
        INSERT_MANY_NO_PARTIAL_RESULT,
    ),
    (
        "crud/insertMany/InsertMany continue-on-error behavior with unordered (duplicate key in requests)",
        INSERT_MANY_NO_PARTIAL_RESULT,
    ),
    (
        "command-logging-and-monitoring/logging/unacknowledged-write",
        "the Rust driver rejects unacknowledged (w: 0) writes",
    ),
    (
        "command-logging-and-monitoring/monitoring/unacknowledged-client-bulkWrite",
        "the Rust driver rejects unacknowledged (w: 0) writes",
    ),
    (
        "run-command/runCursorCommand/does not close the cursor when receiving an empty batch",
        "the Rust driver's cursor has no single-step iteration: advance() on a tailable cursor \
         sends getMores until a document arrives, so iterateOnce cannot stop after one",
    ),
    (
        "change-streams/change-streams-showExpandedEvents/when showExpandedEvents is true, \
         shardCollection events are reported",
        "the emulator has no sharding catalog (shardCollection)",
    ),
    (
        "client-side-operations-timeout/runCursorCommand/Non-tailable cursor iteration timeoutMS \
         is refreshed for getMore if timeoutMode is iteration - failure",
        RUN_CURSOR_COMMAND_CANNOT_TIME_OUT,
    ),
    (
        "client-side-operations-timeout/runCursorCommand/Tailable cursor iteration timeoutMS is \
         refreshed for getMore - failure",
        RUN_CURSOR_COMMAND_CANNOT_TIME_OUT,
    ),
    (
        "client-side-operations-timeout/runCursorCommand/Tailable cursor awaitData iteration \
         timeoutMS is refreshed for getMore - failure",
        RUN_CURSOR_COMMAND_CANNOT_TIME_OUT,
    ),
    ("retryable-reads/gridfs-download", GRIDFS_ID_LOOKUP_WITH_EQ),
    (
        "retryable-reads/gridfs-download-serverErrors",
        GRIDFS_ID_LOOKUP_WITH_EQ,
    ),
];

/// Three `runCursorCommand` cases expect a timeout error where none can occur: a getMore
/// blocked 60 ms under a `timeoutMS` of 100 ms refreshed for it (two cases), and an awaitData
/// cursor with no `timeoutMS` at any level. No driver behaviour meets them as written; the
/// Node driver skips them too (DRIVERS-2965).
const RUN_CURSOR_COMMAND_CANNOT_TIME_OUT: &str =
    "the case expects a timeout error that its own timings rule out (a 60 ms block under a \
     100 ms timeoutMS refreshed for the getMore, or no timeoutMS at all; DRIVERS-2965)";

/// The Rust driver looks a GridFS file up by id with `{_id: {$eq: id}}`, so that an id that is
/// itself a document is never read as a query operator; the retryable-reads download files
/// expect the bare `{_id: id}` in the command.
const GRIDFS_ID_LOOKUP_WITH_EQ: &str =
    "the Rust driver looks a GridFS file up with {_id: {$eq: id}} (an id that is a document is \
     never read as a query operator); the file expects the bare {_id: id}";

/// Upstream's command log names no database in its succeeded and failed messages (B12).
#[cfg(feature = "upstream")]
const DATABASE_NAME_NOT_LOGGED: &str =
    "upstream 3.9.1's \"Command succeeded\" and \"Command failed\" log messages have no \
     databaseName (defect B12, fixed in the fork)";

/// Upstream serializes a change stream's `comment` into the `$changeStream` stage too (B13).
#[cfg(feature = "upstream")]
const CHANGE_STREAM_COMMENT_IN_STAGE: &str =
    "upstream 3.9.1 sends a change stream's comment inside the $changeStream stage as well as \
     on the aggregate (defect B13, fixed in the fork)";

/// Upstream checks implicit sessions back into the pool from a spawned task (`lsid` reuse tests
/// are flaky there).
#[cfg(feature = "upstream")]
const IMPLICIT_SESSION_CHECKIN_RACE: &str =
    "flaky (about 1 run in 6): the driver checks an implicit session back into its pool from a \
     spawned task, so the next operation can start before it is reusable and gets a new lsid";

/// Cases (`<spec>/<file-stem>/<description>`, or a `<spec>/<file-stem>` prefix) that are known to
/// fail, with the reason. They are reported as ignored, never as passed.
pub const KNOWN_FAILURES: &[(&str, &str)] = &[
    // Defect B11, fixed in the fork: only upstream 3.9.1 still fails it.
    #[cfg(feature = "upstream")]
    (
        "uri-options/connection-pool-options/maxPoolSize=0 does not error",
        "upstream 3.9.1 rejects maxPoolSize=0, which the spec reads as no limit (defect B11, \
         fixed in the fork)",
    ),
    // Defect B12, fixed in the fork: only upstream 3.9.1 still fails these.
    #[cfg(feature = "upstream")]
    (
        "command-logging-and-monitoring/logging/command/A successful command",
        DATABASE_NAME_NOT_LOGGED,
    ),
    // Defect B12, fixed in the fork: only upstream 3.9.1 still fails these.
    #[cfg(feature = "upstream")]
    (
        "command-logging-and-monitoring/logging/command/A failed command",
        DATABASE_NAME_NOT_LOGGED,
    ),
    // Defect B12, fixed in the fork: only upstream 3.9.1 still fails these.
    #[cfg(feature = "upstream")]
    (
        "command-logging-and-monitoring/logging/command/A successful commitTransaction command",
        DATABASE_NAME_NOT_LOGGED,
    ),
    // Defect B12, fixed in the fork: only upstream 3.9.1 still fails these.
    #[cfg(feature = "upstream")]
    (
        "command-logging-and-monitoring/logging/command/A successful abortTransaction command",
        DATABASE_NAME_NOT_LOGGED,
    ),
    // Defect B13, fixed in the fork: only upstream 3.9.1 still fails these.
    #[cfg(feature = "upstream")]
    (
        "change-streams/change-streams/Test with document comment",
        CHANGE_STREAM_COMMENT_IN_STAGE,
    ),
    // Defect B13, fixed in the fork: only upstream 3.9.1 still fails these.
    #[cfg(feature = "upstream")]
    (
        "change-streams/change-streams/Test with string comment",
        CHANGE_STREAM_COMMENT_IN_STAGE,
    ),
    // Defect B13, fixed in the fork: only upstream 3.9.1 still fails these.
    #[cfg(feature = "upstream")]
    (
        "change-streams/change-streams/Test that comment is set on getMore",
        CHANGE_STREAM_COMMENT_IN_STAGE,
    ),
    // Only upstream 3.9.1: the fork checks an implicit session in during its drop
    // (`run-a-sessions-and-a-cursors-drop-cleanup-without-a-task-per.patch`).
    #[cfg(feature = "upstream")]
    (
        "unified-test-format/poc-sessions/Server supports implicit sessions",
        IMPLICIT_SESSION_CHECKIN_RACE,
    ),
    // The same test as poc-sessions' in the sessions suite, with the same race.
    #[cfg(feature = "upstream")]
    (
        "sessions/driver-sessions-server-support/Server supports implicit sessions",
        IMPLICIT_SESSION_CHECKIN_RACE,
    ),
];

fn lookup(table: &'static [(&'static str, &'static str)], key: &str) -> Option<&'static str> {
    table.iter().find(|(k, _)| *k == key).map(|(_, r)| *r)
}

pub fn spec(spec: &str) -> Option<&'static str> {
    lookup(SKIPPED_SPECS, spec)
}

pub fn operation(name: &str) -> Option<&'static str> {
    lookup(UNSUPPORTED_OPERATIONS, name)
}

pub fn entity(kind: &str) -> Option<&'static str> {
    lookup(UNSUPPORTED_ENTITIES, kind)
}

pub fn client_uri_option(key: &str) -> Option<&'static str> {
    UNSUPPORTED_CLIENT_URI_OPTIONS
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, r)| *r)
}

pub fn client_field(field: &str) -> Option<&'static str> {
    lookup(UNSUPPORTED_CLIENT_FIELDS, field)
}

pub fn uri_option_without_field(key: &str) -> Option<&'static str> {
    URI_OPTIONS_WITHOUT_FIELD
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, r)| *r)
}

/// The feature a connection string needs and this build lacks, if any.
pub fn uri_feature(uri: &str) -> Option<&'static str> {
    let lower = uri.to_ascii_lowercase();
    URI_FEATURES
        .iter()
        .find(|(needle, _)| lower.contains(needle))
        .map(|(_, r)| *r)
}

fn by_case(
    table: &'static [(&'static str, &'static str)],
    case_name: &str,
) -> Option<&'static str> {
    table
        .iter()
        .find(|(k, _)| {
            case_name == *k
                || case_name
                    .strip_prefix(k)
                    .is_some_and(|rest| rest.starts_with('/'))
        })
        .map(|(_, r)| *r)
}

/// The known-failure reason for a case name, matching whole names or `<spec>/<stem>` prefixes.
pub fn known_failure(case_name: &str) -> Option<&'static str> {
    by_case(KNOWN_FAILURES, case_name)
}

/// The reason a case is skipped by name, matching whole names or `<spec>/<stem>` prefixes.
pub fn skipped_case(case_name: &str) -> Option<&'static str> {
    by_case(SKIPPED_CASES, case_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_tables_match_whole_names_and_file_prefixes() {
        const TABLE: &[(&str, &str)] = &[("spec/file/a case", "reason")];
        assert_eq!(by_case(TABLE, "spec/file/a case"), Some("reason"));
        // An entry covers the names under it after a `/`, not longer names or its own prefixes.
        assert_eq!(by_case(TABLE, "spec/file/a case/more"), Some("reason"));
        assert_eq!(by_case(TABLE, "spec/file/a case two"), None);
        assert_eq!(by_case(TABLE, "spec/file/a"), None);
        let file = "retryable-writes/unacknowledged-write-concern";
        assert!(skipped_case(&format!("{file}/any case")).is_some());
        assert!(skipped_case(&format!("{file}-other/any case")).is_none());
    }

    #[test]
    fn csot_files_of_later_stages_skip_with_their_stage() {
        let case = |file: &str| skipped_case(&format!("client-side-operations-timeout/{file}/x"));
        // Stage-1 and stage-2 files run.
        for file in [
            "cursors",
            "non-tailable-cursors",
            "tailable-awaitData",
            "tailable-non-awaitData",
            "close-cursors",
            "change-streams",
            "convenient-transactions",
            "sessions-inherit-timeoutMS",
            "sessions-override-operation-timeoutMS",
            "sessions-override-timeoutMS",
            "gridfs-advanced",
            "gridfs-delete",
            "gridfs-download",
            "gridfs-find",
            "gridfs-upload",
            "global-timeoutMS",
            "override-operation-timeoutMS",
            "retryability-timeoutMS",
            "deprecated-options",
            "legacy-timeouts",
            "command-execution",
            "error-transformations",
            "waitQueueTimeout",
        ] {
            assert_eq!(case(file), None, "{file}");
        }
        assert_eq!(timeout_argument("anyOtherOperation"), NO_PER_CALL_TIMEOUT);
        assert_eq!(timeout_argument("startTransaction"), NO_TIMEOUT_OF_ITS_OWN);
    }
}
