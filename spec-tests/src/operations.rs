//! Operations: the strict check of each operation's arguments (done when a file is loaded), and
//! their execution against the entity map.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use futures::future::BoxFuture;
use futures::{FutureExt, TryStreamExt};
use serde::de::DeserializeOwned;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::entities::{self, ClientEntity, Entity, EntityMap, SessionEntity};
use crate::expect;
use crate::mongodb::error::Error as DriverError;
use crate::mongodb::options::{
    CountOptions, DeleteManyModel, DeleteOneModel, FindOneAndDeleteOptions,
    FindOneAndReplaceOptions, FindOneAndUpdateOptions, FindOneOptions, IndexOptions,
    InsertOneModel, ReadPreference, ReplaceOneModel, SelectionCriteria, TransactionOptions,
    UpdateManyModel, UpdateModifications, UpdateOneModel, WriteModel,
};
use crate::mongodb::results::{DeleteResult, UpdateResult};
use crate::mongodb::{Client, ClientSession, Collection, Database, IndexModel, Namespace};
use crate::outcome::{self, DriverResult, Produced};
use crate::schema::{self, EntityDef, ExpectedEvent};
use crate::skips;

/// Arguments no operation may carry here, and why (checked before anything else).
const SKIPPED_ARGUMENTS: &[(&str, &str)] = &[
    #[cfg(feature = "upstream")]
    ("timeoutMode", "upstream 3.9.1 has no timeoutMS"),
    ("rawData", skips::NO_RAW_DATA),
];

/// Operations whose driver action takes a per-call `timeoutMS` (`.timeout()`). Their options
/// structs read `timeoutMS` themselves; for `runCommand`, `createIndex`, a cursor's `close` and
/// the session's commands the runner sets it. Any other operation gets no per-call value, so a
/// case passing `timeoutMS` to it is skipped (the value would otherwise be dropped).
const TIMEOUT_OPERATIONS: &[&str] = &[
    "insertOne",
    "insertMany",
    "updateOne",
    "updateMany",
    "replaceOne",
    "deleteOne",
    "deleteMany",
    "findOneAndDelete",
    "findOneAndReplace",
    "findOneAndUpdate",
    "find",
    "findOne",
    "aggregate",
    "countDocuments",
    "estimatedDocumentCount",
    "distinct",
    "runCommand",
    "createIndex",
    "dropIndex",
    "dropIndexes",
    "listIndexes",
    "listIndexNames",
    "createCollection",
    "dropCollection",
    "listCollections",
    "listCollectionNames",
    "listCollectionObjects",
    "listDatabases",
    "listDatabaseNames",
    "listDatabaseObjects",
    "clientBulkWrite",
    "createChangeStream",
    "createFindCursor",
    "createCommandCursor",
    "runCursorCommand",
    // A cursor's close, whose killCursors gets this instead of the cursor's own.
    "close",
    // A session's own commands, and the convenient transaction as a whole.
    "commitTransaction",
    "abortTransaction",
    "withTransaction",
];

/// Arguments the format allows (so they are in [`ARGUMENTS`]) that no driver options struct
/// reads and the runner does not set itself: an operation using one is skipped with that reason.
#[cfg(test)]
const UNHONOURED: &[&str] = &[
    // Queryable encryption: `CreateCollectionOptions` has the field only with the
    // in-use-encryption feature, which this build does not enable.
    "createCollection.encryptedFields",
];

/// The arguments each supported operation accepts. Anything else is a load error.
const ARGUMENTS: &[(&str, &[&str])] = &[
    // Collection and database operations.
    (
        "aggregate",
        &[
            "pipeline",
            "session",
            "batchSize",
            "maxTimeMS",
            "maxAwaitTimeMS",
            "allowDiskUse",
            "comment",
            "let",
            "collation",
            "hint",
            "bypassDocumentValidation",
            "timeoutMode",
        ],
    ),
    (
        "countDocuments",
        &[
            "filter",
            "session",
            "limit",
            "skip",
            "maxTimeMS",
            "comment",
            "collation",
            "hint",
        ],
    ),
    ("estimatedDocumentCount", &["maxTimeMS", "comment"]),
    (
        "distinct",
        &[
            "fieldName",
            "filter",
            "session",
            "maxTimeMS",
            "comment",
            "collation",
            "hint",
        ],
    ),
    (
        "find",
        &[
            "filter",
            "session",
            "sort",
            "limit",
            "skip",
            "batchSize",
            "projection",
            "maxTimeMS",
            "comment",
            "hint",
            "allowDiskUse",
            "let",
            "collation",
            "min",
            "max",
            "returnKey",
            "showRecordId",
            "noCursorTimeout",
            "maxAwaitTimeMS",
            "cursorType",
            "timeoutMode",
        ],
    ),
    (
        "createFindCursor",
        &[
            "filter",
            "session",
            "sort",
            "limit",
            "skip",
            "batchSize",
            "projection",
            "maxTimeMS",
            "comment",
            "maxAwaitTimeMS",
            "cursorType",
            "timeoutMode",
        ],
    ),
    (
        "findOne",
        &[
            "filter",
            "session",
            "sort",
            "skip",
            "projection",
            "maxTimeMS",
            "comment",
            "hint",
            "collation",
        ],
    ),
    (
        "findOneAndDelete",
        &[
            "filter",
            "session",
            "sort",
            "projection",
            "maxTimeMS",
            "comment",
            "hint",
            "let",
            "collation",
        ],
    ),
    (
        "findOneAndReplace",
        &[
            "filter",
            "replacement",
            "session",
            "sort",
            "projection",
            "upsert",
            "returnDocument",
            "maxTimeMS",
            "comment",
            "hint",
            "let",
            "collation",
            "bypassDocumentValidation",
        ],
    ),
    (
        "findOneAndUpdate",
        &[
            "filter",
            "update",
            "session",
            "sort",
            "projection",
            "upsert",
            "returnDocument",
            "maxTimeMS",
            "comment",
            "hint",
            "let",
            "collation",
            "arrayFilters",
            "bypassDocumentValidation",
        ],
    ),
    (
        "insertOne",
        &["document", "session", "comment", "bypassDocumentValidation"],
    ),
    (
        "insertMany",
        &[
            "documents",
            "session",
            "ordered",
            "comment",
            "bypassDocumentValidation",
        ],
    ),
    (
        "updateOne",
        &[
            "filter",
            "update",
            "session",
            "upsert",
            "arrayFilters",
            "hint",
            "let",
            "comment",
            "collation",
            "sort",
            "bypassDocumentValidation",
        ],
    ),
    (
        "updateMany",
        &[
            "filter",
            "update",
            "session",
            "upsert",
            "arrayFilters",
            "hint",
            "let",
            "comment",
            "collation",
            "bypassDocumentValidation",
        ],
    ),
    (
        "replaceOne",
        &[
            "filter",
            "replacement",
            "session",
            "upsert",
            "hint",
            "let",
            "comment",
            "collation",
            "sort",
            "bypassDocumentValidation",
        ],
    ),
    (
        "deleteOne",
        &["filter", "session", "hint", "let", "comment", "collation"],
    ),
    (
        "deleteMany",
        &["filter", "session", "hint", "let", "comment", "collation"],
    ),
    (
        "createIndex",
        &["keys", "name", "unique", "session", "maxTimeMS"],
    ),
    ("dropIndex", &["name", "session", "maxTimeMS"]),
    ("dropIndexes", &["session", "maxTimeMS"]),
    ("listIndexes", &["session", "batchSize", "timeoutMode"]),
    ("listIndexNames", &["session", "batchSize"]),
    (
        "createChangeStream",
        &[
            "pipeline",
            "batchSize",
            "fullDocument",
            "fullDocumentBeforeChange",
            "resumeAfter",
            "startAfter",
            "startAtOperationTime",
            "maxAwaitTimeMS",
            "comment",
            "showExpandedEvents",
        ],
    ),
    (
        "runCommand",
        &["command", "commandName", "session", "readPreference"],
    ),
    (
        "runCursorCommand",
        &[
            "command",
            "commandName",
            "session",
            "batchSize",
            "cursorType",
            "comment",
            "maxTimeMS",
            "timeoutMode",
        ],
    ),
    (
        "createCommandCursor",
        &[
            "command",
            "commandName",
            "session",
            "batchSize",
            "cursorType",
            "comment",
            "maxTimeMS",
            "timeoutMode",
        ],
    ),
    (
        "createCollection",
        &[
            "collection",
            "session",
            "capped",
            "size",
            "max",
            "validator",
            "expireAfterSeconds",
            "timeseries",
            "clusteredIndex",
            "changeStreamPreAndPostImages",
            "encryptedFields",
            "viewOn",
            "pipeline",
        ],
    ),
    ("dropCollection", &["collection", "session"]),
    // No Rust API: the runner sends `collMod` with the remaining arguments.
    (
        "modifyCollection",
        &[
            "collection",
            "session",
            "index",
            "validator",
            "validationLevel",
            "validationAction",
            "expireAfterSeconds",
            "changeStreamPreAndPostImages",
            "viewOn",
            "pipeline",
        ],
    ),
    // Atlas Search index management.
    ("createSearchIndex", &["model"]),
    ("createSearchIndexes", &["models"]),
    ("dropSearchIndex", &["name"]),
    ("listSearchIndexes", &["name", "aggregationOptions"]),
    ("updateSearchIndex", &["name", "definition"]),
    (
        "listCollections",
        &[
            "filter",
            "session",
            "batchSize",
            "authorizedCollections",
            "timeoutMode",
        ],
    ),
    (
        "listCollectionNames",
        &["filter", "session", "batchSize", "authorizedCollections"],
    ),
    (
        "listCollectionObjects",
        &["filter", "session", "batchSize", "authorizedCollections"],
    ),
    // Client operations.
    (
        "listDatabases",
        &["filter", "session", "authorizedDatabases", "nameOnly"],
    ),
    (
        "listDatabaseNames",
        &["filter", "session", "authorizedDatabases"],
    ),
    (
        "listDatabaseObjects",
        &["filter", "session", "authorizedDatabases"],
    ),
    (
        "clientBulkWrite",
        &[
            "models",
            "session",
            "ordered",
            "verboseResults",
            "bypassDocumentValidation",
            "comment",
            "let",
            "writeConcern",
        ],
    ),
    // Session operations.
    (
        "startTransaction",
        &[
            "readConcern",
            "writeConcern",
            "readPreference",
            "maxCommitTimeMS",
        ],
    ),
    ("commitTransaction", &[]),
    ("abortTransaction", &[]),
    (
        "withTransaction",
        &[
            "callback",
            "readConcern",
            "writeConcern",
            "readPreference",
            "maxCommitTimeMS",
        ],
    ),
    ("endSession", &[]),
    ("getSnapshotTime", &[]),
    // Cursor operations.
    ("iterateUntilDocumentOrError", &[]),
    ("iterateOnce", &[]),
    ("close", &[]),
    // Test runner operations.
    ("failPoint", &["client", "failPoint"]),
    ("targetedFailPoint", &["session", "failPoint"]),
    ("createEntities", &["entities"]),
    ("waitForEvent", &["client", "event", "count"]),
    ("assertEventCount", &["client", "event", "count"]),
    ("assertSameLsidOnLastTwoCommands", &["client"]),
    ("assertDifferentLsidOnLastTwoCommands", &["client"]),
    (
        "assertCollectionExists",
        &["databaseName", "collectionName", "session"],
    ),
    (
        "assertCollectionNotExists",
        &["databaseName", "collectionName", "session"],
    ),
    (
        "assertIndexExists",
        &["databaseName", "collectionName", "indexName", "session"],
    ),
    (
        "assertIndexNotExists",
        &["databaseName", "collectionName", "indexName", "session"],
    ),
    (
        "assertNumberConnectionsCheckedOut",
        &["client", "connections"],
    ),
    ("wait", &["ms"]),
    ("runOnThread", &["thread", "operation"]),
    ("waitForThread", &["thread"]),
];

/// Checks an operation strictly. `Ok(Some(reason))` means it is valid but cannot run here;
/// `Err` means the file is wrong (or this runner does not know the operation at all). `buckets`
/// are the ids of the GridFS bucket entities the file defines, whose operations have a table of
/// their own ([`crate::gridfs::ARGUMENTS`]).
pub fn validate(
    op: &schema::Operation,
    path: &str,
    buckets: &[String],
) -> Result<Option<String>, String> {
    let args = op.arguments.clone().unwrap_or_default();
    let on_bucket = buckets.contains(&op.object);
    if let Some(reason) = skips::operation(&op.name).filter(|_| !on_bucket) {
        return Ok(Some(format!("{}: {reason}", op.name)));
    }
    let table = if on_bucket {
        crate::gridfs::ARGUMENTS
    } else {
        ARGUMENTS
    };
    let Some((_, allowed)) = table.iter().find(|(n, _)| *n == op.name) else {
        return Err(format!("{path}.name: unknown operation {:?}", op.name));
    };
    for key in args.keys() {
        if let Some((_, reason)) = SKIPPED_ARGUMENTS.iter().find(|(k, _)| k == key) {
            return Ok(Some(format!("{}.{key}: {reason}", op.name)));
        }
        if let Some((_, reason)) = crate::gridfs::UNHONOURED_ARGUMENTS
            .iter()
            .find(|(k, _)| on_bucket && k == key)
        {
            return Ok(Some(format!("{}.{key}: {reason}", op.name)));
        }
        if key == "timeoutMS" {
            if let Some(reason) = crate::timeouts::UNSUPPORTED {
                return Ok(Some(format!("{}.timeoutMS: {reason}", op.name)));
            }
            if on_bucket || TIMEOUT_OPERATIONS.contains(&op.name.as_str()) {
                continue;
            }
            return Ok(Some(format!(
                "{}.timeoutMS: {}",
                op.name,
                skips::timeout_argument(&op.name)
            )));
        }
        if !allowed.contains(&key.as_str()) {
            return Err(format!(
                "{path}.arguments.{key}: unknown argument for operation {:?}",
                op.name
            ));
        }
    }
    if let Some(honoured) = honoured_arguments(&op.name).filter(|_| !on_bucket) {
        if let Some(key) = args.keys().find(|k| !honoured.contains(&k.as_str())) {
            return Ok(Some(format!(
                "{}.{key}: the format allows it, but the driver's options for {} have no such \
                 field, so the runner cannot honour it",
                op.name, op.name
            )));
        }
    }
    if let Err(reason) = check_argument_values(&op.name, &args, path) {
        return Ok(Some(format!("the runner cannot honour {reason}")));
    }
    match op.name.as_str() {
        "withTransaction" => {
            let callback = args
                .get_array("callback")
                .map_err(|_| format!("{path}.arguments.callback: must be an array"))?;
            for (i, item) in callback.iter().enumerate() {
                let inner_path = format!("{path}.arguments.callback[{i}]");
                let inner: schema::Operation = from_bson(item.clone(), &inner_path)?;
                if let Some(reason) = validate(&inner, &inner_path, buckets)? {
                    return Ok(Some(reason));
                }
            }
        }
        "createEntities" => {
            let list = args.get("entities").cloned().unwrap_or(Bson::Null);
            let defs: Vec<EntityDef> = from_bson(list, &format!("{path}.arguments.entities"))?;
            if let Some(reason) = entities_skip_reason(&defs) {
                return Ok(Some(reason));
            }
        }
        "runOnThread" => {
            let inner_path = format!("{path}.arguments.operation");
            let item = args.get("operation").cloned().unwrap_or(Bson::Null);
            let inner: schema::Operation = from_bson(item, &inner_path)?;
            if let Some(reason) = validate(&inner, &inner_path, buckets)? {
                return Ok(Some(reason));
            }
        }
        "waitForEvent" | "assertEventCount" => {
            let event = args.get("event").cloned().unwrap_or(Bson::Null);
            let _: ExpectedEvent = from_bson(event, &format!("{path}.arguments.event"))?;
        }
        _ => {}
    }
    if op.expect_error.is_some() && op.expect_result.is_some() {
        return Err(format!(
            "{path}: expectError and expectResult are exclusive"
        ));
    }
    if op.expect_error.is_some() && op.save_result_as_entity.is_some() {
        return Err(format!(
            "{path}: expectError and saveResultAsEntity are exclusive"
        ));
    }
    if op.ignore_result_and_error == Some(true)
        && (op.expect_error.is_some()
            || op.expect_result.is_some()
            || op.save_result_as_entity.is_some())
    {
        return Err(format!(
            "{path}: ignoreResultAndError excludes expectError, expectResult and \
             saveResultAsEntity"
        ));
    }
    Ok(None)
}

/// Why entity definitions cannot be created here, if they cannot.
pub fn entities_skip_reason(defs: &[EntityDef]) -> Option<String> {
    for def in defs {
        let kind = match def {
            EntityDef::Bucket(_) => continue,
            EntityDef::ClientEncryption(_) => "clientEncryption",
            EntityDef::Client(c) => {
                let fields = [
                    ("autoEncryptOpts", c.auto_encrypt_opts.is_some()),
                    (
                        "storeEventsAsEntities",
                        c.store_events_as_entities.is_some(),
                    ),
                ];
                for (field, present) in fields {
                    if let Some(reason) = skips::client_field(field).filter(|_| present) {
                        return Some(format!("client.{field}: {reason}"));
                    }
                }
                for key in c.uri_options.iter().flat_map(|o| o.keys()) {
                    if let Some(reason) = skips::client_uri_option(key) {
                        return Some(format!("uriOptions.{key}: {reason}"));
                    }
                    if let Some(reason) =
                        crate::timeouts::UNSUPPORTED.filter(|_| key == "timeoutMS")
                    {
                        return Some(format!("uriOptions.{key}: {reason}"));
                    }
                }
                continue;
            }
            EntityDef::Thread(_) => continue,
            EntityDef::Session(s) => match crate::timeouts::UNSUPPORTED {
                Some(reason)
                    if s.session_options
                        .as_ref()
                        .is_some_and(|o| o.default_timeout_ms.is_some()) =>
                {
                    return Some(format!("session.defaultTimeoutMS: {reason}"));
                }
                _ => continue,
            },
            // `timeoutMS` in database and collection options goes to the driver's options.
            EntityDef::Database(d) => {
                let options = d.database_options.as_ref();
                match crate::timeouts::UNSUPPORTED {
                    Some(reason) if options.is_some_and(|o| o.timeout_ms.is_some()) => {
                        return Some(format!("databaseOptions.timeoutMS: {reason}"));
                    }
                    _ => continue,
                }
            }
            EntityDef::Collection(c) => {
                let options = c.collection_options.as_ref();
                match crate::timeouts::UNSUPPORTED {
                    Some(reason) if options.is_some_and(|o| o.timeout_ms.is_some()) => {
                        return Some(format!("collectionOptions.timeoutMS: {reason}"));
                    }
                    _ => continue,
                }
            }
        };
        if let Some(reason) = skips::entity(kind) {
            return Some(format!("{kind} entity: {reason}"));
        }
    }
    None
}

/// The ids of the GridFS bucket entities a file defines, in `createEntities` or in a test's
/// `createEntities` operation.
pub fn bucket_ids(file: &schema::TestFile) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    let mut collect = |defs: &[EntityDef]| {
        for def in defs {
            if let EntityDef::Bucket(b) = def {
                ids.push(b.id.clone());
            }
        }
    };
    collect(file.create_entities.as_deref().unwrap_or_default());
    for op in file.tests.iter().flat_map(|t| &t.operations) {
        if op.name == "createEntities" {
            let list = op
                .arguments
                .as_ref()
                .and_then(|a| a.get("entities"))
                .cloned()
                .unwrap_or(Bson::Null);
            if let Ok(defs) = bson::from_bson::<Vec<EntityDef>>(list) {
                collect(&defs);
            }
        }
    }
    ids
}

/// The argument names a driver options struct reads, found by asking its `Deserialize` impl:
/// a derived impl hands its field list (after renames) to `deserialize_struct`, and this
/// deserializer records it there and stops. Fields marked `#[serde(skip)]` (e.g. `FindOptions`'
/// `cursor_type`) are not in the list, which is the point: a struct silently drops any key it
/// does not list. `None` when `T` is not a derived struct (nothing can be said about it).
pub fn struct_fields<T: DeserializeOwned>() -> Option<&'static [&'static str]> {
    let mut found = None;
    let _ = T::deserialize(FieldsProbe(&mut found));
    found
}

struct FieldsProbe<'a>(&'a mut Option<&'static [&'static str]>);

/// The probe's only error: it never deserializes anything.
#[derive(Debug)]
struct ProbeStopped;

impl std::fmt::Display for ProbeStopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("field probe stopped")
    }
}

impl std::error::Error for ProbeStopped {}

impl serde::de::Error for ProbeStopped {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        ProbeStopped
    }
}

impl<'de> serde::Deserializer<'de> for FieldsProbe<'_> {
    type Error = ProbeStopped;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, ProbeStopped> {
        Err(ProbeStopped)
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, ProbeStopped> {
        *self.0 = Some(fields);
        Err(ProbeStopped)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// The arguments the runner can honour for an operation whose remaining arguments go to a
/// driver options struct: those it takes itself, plus the struct's fields. `None` for
/// operations that pass nothing through an options struct (their arguments are all taken by
/// name). The format requires an error for an argument the runner cannot honour; `validate`
/// turns every allowed argument missing from this list into a skip with that reason.
fn honoured_arguments(op: &str) -> Option<Vec<&'static str>> {
    use crate::mongodb::options::{
        AggregateOptions, ChangeStreamOptions, CountOptions, CreateCollectionOptions,
        DeleteOptions, DistinctOptions, DropIndexOptions, EstimatedDocumentCountOptions,
        FindOneAndDeleteOptions, FindOneAndReplaceOptions, FindOneAndUpdateOptions, FindOneOptions,
        FindOptions, InsertManyOptions, InsertOneOptions, ListCollectionsOptions,
        ListDatabasesOptions, ListIndexesOptions, ReplaceOptions, RunCursorCommandOptions,
        UpdateOptions,
    };
    fn with<T: DeserializeOwned>(taken: &[&'static str]) -> Vec<&'static str> {
        let mut all = taken.to_vec();
        all.extend(struct_fields::<T>().unwrap_or_default());
        all
    }
    Some(match op {
        "insertOne" => with::<InsertOneOptions>(&["document", "session"]),
        "insertMany" => with::<InsertManyOptions>(&["documents", "session"]),
        "updateOne" | "updateMany" => with::<UpdateOptions>(&["filter", "update", "session"]),
        "replaceOne" => with::<ReplaceOptions>(&["filter", "replacement", "session"]),
        "deleteOne" | "deleteMany" => with::<DeleteOptions>(&["filter", "session"]),
        // `FindOptions` skips `cursorType` and `maxAwaitTime` in serde and cannot read
        // `maxTimeMS` as milliseconds: the runner sets those three fields itself.
        "find" | "createFindCursor" => with::<FindOptions>(&[
            "filter",
            "session",
            "cursorType",
            "maxAwaitTimeMS",
            "maxTimeMS",
        ]),
        // These structs read `maxTime`, not the format's `maxTimeMS`: the runner sets it.
        "findOne" => with::<FindOneOptions>(&["filter", "session", "maxTimeMS"]),
        "findOneAndDelete" => with::<FindOneAndDeleteOptions>(&["filter", "session", "maxTimeMS"]),
        "findOneAndReplace" => {
            with::<FindOneAndReplaceOptions>(&["filter", "replacement", "session", "maxTimeMS"])
        }
        "findOneAndUpdate" => {
            with::<FindOneAndUpdateOptions>(&["filter", "update", "session", "maxTimeMS"])
        }
        // `AggregateOptions` reads `maxAwaitTime`, not the format's `maxAwaitTimeMS`.
        "aggregate" => with::<AggregateOptions>(&["pipeline", "session", "maxAwaitTimeMS"]),
        "countDocuments" => with::<CountOptions>(&["filter", "session", "maxTimeMS"]),
        "estimatedDocumentCount" => with::<EstimatedDocumentCountOptions>(&[]),
        "distinct" => with::<DistinctOptions>(&["fieldName", "filter", "session"]),
        // Index options go to `IndexOptions`; `maxTimeMS` and `timeoutMS` belong to the
        // command, which the runner passes as `CreateIndexOptions`.
        "createIndex" => with::<crate::mongodb::options::IndexOptions>(&[
            "keys",
            "session",
            "maxTimeMS",
            "timeoutMS",
        ]),
        "dropIndex" => with::<DropIndexOptions>(&["name", "session"]),
        "dropIndexes" => with::<DropIndexOptions>(&["session"]),
        "listIndexes" | "listIndexNames" => with::<ListIndexesOptions>(&["session"]),
        "createChangeStream" => with::<ChangeStreamOptions>(&["pipeline", "maxAwaitTimeMS"]),
        "runCursorCommand" | "createCommandCursor" => {
            with::<RunCursorCommandOptions>(&["command", "commandName", "session"])
        }
        "createCollection" => with::<CreateCollectionOptions>(&["collection", "session"]),
        "listCollections" | "listCollectionNames" | "listCollectionObjects" => {
            with::<ListCollectionsOptions>(&["filter", "session"])
        }
        // `nameOnly: true` runs the driver's names-only form (see `client_op`).
        "listDatabases" | "listDatabaseObjects" => {
            with::<ListDatabasesOptions>(&["filter", "session", "nameOnly"])
        }
        "listDatabaseNames" => with::<ListDatabasesOptions>(&["filter", "session"]),
        "startTransaction" => with::<TransactionOptions>(&[]),
        "withTransaction" => with::<TransactionOptions>(&["callback", "timeoutMS"]),
        "clientBulkWrite" => with::<crate::mongodb::options::BulkWriteOptions>(&[
            "models",
            "session",
            "verboseResults",
        ]),
        _ => return None,
    })
}

/// Checks argument values the runner must read itself, where a wrong type would otherwise be
/// dropped or misread (a `"true"` string as `upsert`), or that it must convert (a read
/// preference, a cursor type). `Err` says which value cannot be honoured and why.
fn check_argument_values(op: &str, args: &Document, path: &str) -> Result<(), String> {
    if op == "clientBulkWrite" {
        for key in ["ordered", "verboseResults"] {
            if let Some(v) = args.get(key).filter(|v| !matches!(v, Bson::Boolean(_))) {
                return Err(format!(
                    "{path}.arguments.{key}: must be a boolean, got {v}"
                ));
            }
        }
        for (i, model) in args.get_array("models").into_iter().flatten().enumerate() {
            let body = model.as_document().and_then(|m| m.values().next());
            if let Some(v) = body
                .and_then(Bson::as_document)
                .and_then(|b| b.get("upsert"))
                .filter(|v| !matches!(v, Bson::Boolean(_)))
            {
                return Err(format!(
                    "{path}.arguments.models[{i}].upsert: must be a boolean, got {v}"
                ));
            }
        }
    }
    if let Some(v) = args
        .get("nameOnly")
        .filter(|v| !matches!(v, Bson::Boolean(_)))
    {
        return Err(format!(
            "{path}.arguments.nameOnly: must be a boolean, got {v}"
        ));
    }
    if let Some(rp) = args.get("readPreference") {
        read_preference_from(rp.clone())
            .map_err(|e| format!("{path}.arguments.readPreference: {e}"))?;
    }
    if op == "find" || op == "createFindCursor" {
        if let Some(t) = args.get("cursorType") {
            cursor_type(t).map_err(|e| format!("{path}.arguments.cursorType: {e}"))?;
        }
    }
    Ok(())
}

/// The format's `cursorType` as the driver's.
fn cursor_type(value: &Bson) -> Result<crate::mongodb::options::CursorType, String> {
    use crate::mongodb::options::CursorType;
    match value.as_str() {
        Some("nonTailable") => Ok(CursorType::NonTailable),
        Some("tailable") => Ok(CursorType::Tailable),
        Some("tailableAwait") => Ok(CursorType::TailableAwait),
        _ => Err(format!(
            "expected nonTailable, tailable or tailableAwait, got {value}"
        )),
    }
}

/// A non-negative millisecond count as a duration.
/// The operation's own `timeoutMS` argument, taken out of `args`.
fn taken_timeout(args: &mut Args) -> Result<Option<Duration>, String> {
    args.take("timeoutMS")
        .map(|v| millis(v, "timeoutMS"))
        .transpose()
}

fn millis(value: Bson, what: &str) -> Result<Duration, String> {
    let ms = match value {
        Bson::Int32(i) => i64::from(i),
        Bson::Int64(i) => i,
        Bson::Double(d) if d.fract() == 0.0 => d as i64,
        other => return Err(format!("{what} must be an integer, got {other}")),
    };
    u64::try_from(ms)
        .map(Duration::from_millis)
        .map_err(|_| format!("{what} must not be negative, got {ms}"))
}

fn from_bson<T: DeserializeOwned>(value: Bson, path: &str) -> Result<T, String> {
    serde_path_to_error::deserialize(bson::Deserializer::new(value))
        .map_err(|e| format!("{path}.{}: {}", e.path(), e.inner()))
}

/// State shared by the operations of one test.
pub struct Ctx {
    pub entities: EntityMap,
    /// The target's connection string, for new clients.
    pub uri: String,
    /// The target is sharded with several routers: clients without `useMultipleMongoses` get one.
    pub single_host: bool,
    /// The runner's own client, for assertions and fail points.
    pub internal: Client,
    /// Fail points to turn off after the test: the client that set them and their names.
    pub failpoints: Vec<(Client, String)>,
    /// Expectation failures found inside a `withTransaction` callback.
    pub callback_failures: Vec<String>,
}

/// A session borrowed for one operation.
enum Sess<'a> {
    None,
    Active(&'a mut ClientSession),
    Owned(OwnedMutexGuard<Option<ClientSession>>),
}

impl Sess<'_> {
    fn get(&mut self) -> Result<Option<&mut ClientSession>, String> {
        match self {
            Sess::None => Ok(None),
            Sess::Active(s) => Ok(Some(&mut **s)),
            Sess::Owned(g) => match g.as_mut() {
                Some(s) => Ok(Some(s)),
                None => Err("the session was already ended".into()),
            },
        }
    }
}

/// Runs an action with the session when there is one.
macro_rules! run {
    ($sess:expr, $action:expr) => {
        match $sess.get()? {
            Some(s) => $action.session(s).await,
            None => $action.await,
        }
    };
}

/// Runs an action that opens a cursor (with the session when there is one) and reads every
/// document of it.
macro_rules! drain {
    ($sess:expr, $action:expr) => {
        match $sess.get()? {
            Some(s) => drain_session_cursor($action.session(&mut *s).await, s).await,
            None => drain_cursor($action.await).await,
        }
    };
}

/// Like [`drain!`], but with `$keep_open` (createFindCursor, createCommandCursor) the cursor
/// becomes an entity instead of being read.
macro_rules! drain_or_keep {
    ($sess:expr, $action:expr, $keep_open:expr, $op:expr) => {
        match ($sess.get()?, $keep_open) {
            (Some(_), true) => return Err(format!("{} with a session is not implemented", $op)),
            (Some(s), false) => drain_session_cursor($action.session(&mut *s).await, s)
                .await
                .map(Produced::Documents),
            (None, true) => $action
                .await
                .map(|cursor| Produced::Entity(Entity::Cursor(Arc::new(AsyncMutex::new(cursor))))),
            (None, false) => drain_cursor($action.await).await.map(Produced::Documents),
        }
    };
}

struct Args {
    doc: Document,
    op: String,
}

impl Args {
    fn take(&mut self, key: &str) -> Option<Bson> {
        self.doc.remove(key)
    }
    fn doc(&mut self, key: &str) -> Result<Document, String> {
        match self.take(key) {
            Some(Bson::Document(d)) => Ok(d),
            Some(other) => Err(format!(
                "{}: `{key}` must be a document, got {other}",
                self.op
            )),
            None => Err(format!("{}: missing argument `{key}`", self.op)),
        }
    }
    fn opt_doc(&mut self, key: &str) -> Result<Document, String> {
        if self.doc.contains_key(key) {
            self.doc(key)
        } else {
            Ok(Document::new())
        }
    }
    fn docs(&mut self, key: &str) -> Result<Vec<Document>, String> {
        match self.take(key) {
            Some(Bson::Array(items)) => items
                .into_iter()
                .map(|b| match b {
                    Bson::Document(d) => Ok(d),
                    other => Err(format!(
                        "{}: `{key}` must hold documents, got {other}",
                        self.op
                    )),
                })
                .collect(),
            Some(other) => Err(format!(
                "{}: `{key}` must be an array, got {other}",
                self.op
            )),
            None => Err(format!("{}: missing argument `{key}`", self.op)),
        }
    }
    fn string(&mut self, key: &str) -> Result<String, String> {
        match self.take(key) {
            Some(Bson::String(s)) => Ok(s),
            Some(other) => Err(format!(
                "{}: `{key}` must be a string, got {other}",
                self.op
            )),
            None => Err(format!("{}: missing argument `{key}`", self.op)),
        }
    }
    fn int(&mut self, key: &str) -> Result<i64, String> {
        match self.take(key) {
            Some(Bson::Int32(i)) => Ok(i.into()),
            Some(Bson::Int64(i)) => Ok(i),
            Some(Bson::Double(d)) if d.fract() == 0.0 => Ok(d as i64),
            Some(other) => Err(format!(
                "{}: `{key}` must be an integer, got {other}",
                self.op
            )),
            None => Err(format!("{}: missing argument `{key}`", self.op)),
        }
    }
    fn update(&mut self) -> Result<UpdateModifications, String> {
        match self.take("update") {
            Some(Bson::Document(d)) => Ok(UpdateModifications::Document(d)),
            Some(Bson::Array(items)) => Ok(UpdateModifications::Pipeline(
                items
                    .into_iter()
                    .filter_map(|b| match b {
                        Bson::Document(d) => Some(d),
                        _ => None,
                    })
                    .collect(),
            )),
            _ => Err(format!(
                "{}: `update` must be a document or a pipeline",
                self.op
            )),
        }
    }
    /// The remaining arguments as a driver options struct (`None` when there are none). A key
    /// the struct does not read is an error, not dropped: `validate` already turned such an
    /// argument into a skip, so this only fires if the two disagree.
    fn options<T: DeserializeOwned>(&mut self) -> Result<Option<T>, String> {
        if self.doc.is_empty() {
            return Ok(None);
        }
        let rest = std::mem::take(&mut self.doc);
        let fields = struct_fields::<T>().unwrap_or_default();
        if let Some(key) = rest.keys().find(|k| !fields.contains(&k.as_str())) {
            return Err(format!(
                "{}: argument {key} would be dropped: the driver's {} does not read it",
                self.op,
                std::any::type_name::<T>()
            ));
        }
        bson::from_document(rest.clone())
            .map(Some)
            .map_err(|e| format!("{}: options {rest}: {e}", self.op))
    }
}

fn count(n: u64) -> Bson {
    Bson::Int64(n as i64)
}

fn update_result(r: UpdateResult) -> Bson {
    let mut d = doc! {
        "matchedCount": count(r.matched_count),
        "modifiedCount": count(r.modified_count),
        "upsertedCount": count(u64::from(r.upserted_id.is_some())),
    };
    if let Some(id) = r.upserted_id {
        d.insert("upsertedId", id);
    }
    Bson::Document(d)
}

fn delete_result(r: DeleteResult) -> Bson {
    Bson::Document(doc! {"deletedCount": count(r.deleted_count)})
}

/// Reads every document of a cursor the operation opened.
async fn drain_cursor<T>(
    cursor: Result<crate::mongodb::Cursor<T>, DriverError>,
) -> Result<Vec<T>, DriverError>
where
    T: DeserializeOwned + Unpin + Send + Sync,
{
    cursor?.try_collect().await
}

/// Reads every document of a cursor the operation opened in session `s`.
async fn drain_session_cursor<T>(
    cursor: Result<crate::mongodb::SessionCursor<T>, DriverError>,
    s: &mut ClientSession,
) -> Result<Vec<T>, DriverError>
where
    T: DeserializeOwned + Unpin + Send + Sync,
{
    cursor?.stream(s).try_collect().await
}

fn value(v: Option<Bson>) -> Produced {
    Produced::Value(v)
}

/// Runs one operation. The outer `Err` is a runner problem (bad entity, bad arguments); the
/// inner result is the driver's.
pub fn execute<'a>(
    ctx: &'a mut Ctx,
    op: &'a schema::Operation,
    active: Option<(&'a str, &'a mut ClientSession)>,
) -> BoxFuture<'a, Result<DriverResult, String>> {
    async move {
        let mut args = Args {
            doc: op.arguments.clone().unwrap_or_default(),
            op: op.name.clone(),
        };
        if op.object == "testRunner" {
            return test_runner(ctx, &mut args, active).await;
        }
        // The session argument, if any.
        let active_id = active.as_ref().map(|(id, _)| id.to_string());
        let mut active = active;
        let mut sess = match args.take("session") {
            Some(Bson::String(id)) => match active.take() {
                Some((a, s)) if a == id => Sess::Active(s),
                _ => {
                    let entity = ctx.entities.session(&id)?;
                    Sess::Owned(entity.session.clone().lock_owned().await)
                }
            },
            Some(other) => {
                return Err(format!(
                    "{}: `session` must be a name, got {other}",
                    op.name
                ))
            }
            None => Sess::None,
        };
        let object = ctx
            .entities
            .get(&op.object)
            .cloned()
            .ok_or_else(|| format!("no entity named {:?}", op.object))?;
        match object {
            Entity::Collection(coll) => collection_op(ctx, &coll, &mut args, &mut sess).await,
            Entity::Database(db) => database_op(&db, &mut args, &mut sess).await,
            Entity::Client(client) => client_op(&client, &mut args, &mut sess).await,
            Entity::Session(session) => {
                session_op(ctx, &op.object, &session, &mut args, active_id.as_deref()).await
            }
            Entity::Cursor(cursor) => cursor_op(ctx, &op.object, cursor, &mut args).await,
            Entity::ChangeStream(stream) => change_stream_op(ctx, &op.object, stream, &args).await,
            Entity::Bucket(bucket) => crate::gridfs::run(&bucket, &op.name, &mut args.doc)
                .await
                .map(|result| result.map(value)),
            Entity::Bson(_) | Entity::Thread(_) => Err(format!(
                "entity {:?} is not an object operations run on",
                op.object
            )),
        }
    }
    .boxed()
}

async fn collection_op(
    _ctx: &mut Ctx,
    coll: &Collection<Document>,
    args: &mut Args,
    sess: &mut Sess<'_>,
) -> Result<DriverResult, String> {
    let name = args.op.clone();
    let result: DriverResult = match name.as_str() {
        "insertOne" => {
            let document = args.doc("document")?;
            let options = args.options()?;
            run!(sess, coll.insert_one(document).with_options(options))
                .map(|r| value(Some(Bson::Document(doc! {"insertedId": r.inserted_id}))))
        }
        "insertMany" => {
            let documents = args.docs("documents")?;
            let options = args.options()?;
            run!(sess, coll.insert_many(documents).with_options(options)).map(|r| {
                let mut ids: Vec<_> = r.inserted_ids.into_iter().collect();
                ids.sort_by_key(|(i, _)| *i);
                let ids: Document = ids.into_iter().map(|(i, id)| (i.to_string(), id)).collect();
                value(Some(Bson::Document(doc! {"insertedIds": ids})))
            })
        }
        "updateOne" | "updateMany" => {
            let filter = args.doc("filter")?;
            let update = args.update()?;
            let options = args.options()?;
            let r = if name == "updateOne" {
                run!(sess, coll.update_one(filter, update).with_options(options))
            } else {
                run!(sess, coll.update_many(filter, update).with_options(options))
            };
            r.map(|r| value(Some(update_result(r))))
        }
        "replaceOne" => {
            let filter = args.doc("filter")?;
            let replacement = args.doc("replacement")?;
            let options = args.options()?;
            run!(
                sess,
                coll.replace_one(filter, replacement).with_options(options)
            )
            .map(|r| value(Some(update_result(r))))
        }
        "deleteOne" | "deleteMany" => {
            let filter = args.doc("filter")?;
            let options = args.options()?;
            let r = if name == "deleteOne" {
                run!(sess, coll.delete_one(filter).with_options(options))
            } else {
                run!(sess, coll.delete_many(filter).with_options(options))
            };
            r.map(|r| value(Some(delete_result(r))))
        }
        "find" | "createFindCursor" => {
            // Required by the format (valid-fail/entity-findCursor-malformed checks it).
            let filter = args.doc("filter")?;
            let cursor_type = args
                .take("cursorType")
                .map(|t| cursor_type(&t))
                .transpose()?;
            let max_await = args
                .take("maxAwaitTimeMS")
                .map(|v| millis(v, "maxAwaitTimeMS"))
                .transpose()?;
            let max_time = args
                .take("maxTimeMS")
                .map(|v| millis(v, "maxTimeMS"))
                .transpose()?;
            let mut options: crate::mongodb::options::FindOptions =
                args.options()?.unwrap_or_default();
            options.cursor_type = cursor_type;
            options.max_await_time = max_await;
            options.max_time = max_time;
            let action = coll.find(filter).with_options(options);
            drain_or_keep!(sess, action, name == "createFindCursor", name)
        }
        "findOne" => {
            let filter = args.opt_doc("filter")?;
            let options =
                options_with_max_time(args, |o: &mut FindOneOptions, t| o.max_time = Some(t))?;
            run!(sess, coll.find_one(filter).with_options(options))
                .map(|d| value(Some(d.map_or(Bson::Null, Bson::Document))))
        }
        "findOneAndDelete" => {
            let filter = args.doc("filter")?;
            let options = options_with_max_time(args, |o: &mut FindOneAndDeleteOptions, t| {
                o.max_time = Some(t)
            })?;
            run!(sess, coll.find_one_and_delete(filter).with_options(options))
                .map(|d| value(Some(d.map_or(Bson::Null, Bson::Document))))
        }
        "findOneAndReplace" => {
            let filter = args.doc("filter")?;
            let replacement = args.doc("replacement")?;
            let options = options_with_max_time(args, |o: &mut FindOneAndReplaceOptions, t| {
                o.max_time = Some(t)
            })?;
            run!(
                sess,
                coll.find_one_and_replace(filter, replacement)
                    .with_options(options)
            )
            .map(|d| value(Some(d.map_or(Bson::Null, Bson::Document))))
        }
        "findOneAndUpdate" => {
            let filter = args.doc("filter")?;
            let update = args.update()?;
            let options = options_with_max_time(args, |o: &mut FindOneAndUpdateOptions, t| {
                o.max_time = Some(t)
            })?;
            run!(
                sess,
                coll.find_one_and_update(filter, update)
                    .with_options(options)
            )
            .map(|d| value(Some(d.map_or(Bson::Null, Bson::Document))))
        }
        "aggregate" => {
            let pipeline = args.docs("pipeline")?;
            let options = aggregate_options(args)?;
            let action = coll.aggregate(pipeline).with_options(options);
            drain!(sess, action).map(Produced::Documents)
        }
        "countDocuments" => {
            let filter = args.opt_doc("filter")?;
            let options =
                options_with_max_time(args, |o: &mut CountOptions, t| o.max_time = Some(t))?;
            run!(sess, coll.count_documents(filter).with_options(options))
                .map(|n| value(Some(count(n))))
        }
        "estimatedDocumentCount" => {
            let options = args.options()?;
            coll.estimated_document_count()
                .with_options(options)
                .await
                .map(|n| value(Some(count(n))))
        }
        "distinct" => {
            let field = args.string("fieldName")?;
            let filter = args.opt_doc("filter")?;
            let options = args.options()?;
            run!(sess, coll.distinct(field, filter).with_options(options))
                .map(|v| value(Some(Bson::Array(v))))
        }
        "createIndex" => {
            let keys = args.doc("keys")?;
            // `maxTimeMS` and `timeoutMS` are options of the createIndexes command, not of the
            // index.
            let max_time = args
                .take("maxTimeMS")
                .map(|v| millis(v, "maxTimeMS"))
                .transpose()?;
            let timeout = args
                .take("timeoutMS")
                .map(|v| millis(v, "timeoutMS"))
                .transpose()?;
            let options: Option<IndexOptions> = args.options()?;
            let model = IndexModel::builder().keys(keys).options(options).build();
            let mut command_options = crate::mongodb::options::CreateIndexOptions::builder()
                .max_time(max_time)
                .build();
            crate::timeouts::set_create_index(&mut command_options, timeout)?;
            run!(sess, coll.create_index(model).with_options(command_options))
                .map(|r| value(Some(Bson::String(r.index_name))))
        }
        "dropIndex" => {
            let index = args.string("name")?;
            let options = args.options()?;
            run!(sess, coll.drop_index(index).with_options(options)).map(|()| value(None))
        }
        "dropIndexes" => {
            let options = args.options()?;
            run!(sess, coll.drop_indexes().with_options(options)).map(|()| value(None))
        }
        "listIndexes" | "listIndexNames" => {
            let options = args.options()?;
            if name == "listIndexNames" {
                run!(sess, coll.list_index_names().with_options(options)).map(|names| {
                    value(Some(Bson::Array(
                        names.into_iter().map(Bson::String).collect(),
                    )))
                })
            } else {
                let action = coll.list_indexes().with_options(options);
                drain!(sess, action).map(|models| {
                    let docs = models
                        .iter()
                        .filter_map(|m| bson::to_document(m).ok())
                        .collect();
                    Produced::Documents(docs)
                })
            }
        }
        "createSearchIndex"
        | "createSearchIndexes"
        | "dropSearchIndex"
        | "listSearchIndexes"
        | "updateSearchIndex" => search_index_op(coll, args).await?,
        "createChangeStream" => {
            let pipeline = args.docs("pipeline").unwrap_or_default();
            let options = change_stream_options(args)?;
            coll.watch()
                .pipeline(pipeline)
                .with_options(options)
                .await
                .map(change_stream_entity)
        }
        other => {
            return Err(format!(
                "operation {other} is not supported on a collection"
            ))
        }
    };
    Ok(result)
}

async fn database_op(
    db: &Database,
    args: &mut Args,
    sess: &mut Sess<'_>,
) -> Result<DriverResult, String> {
    let name = args.op.clone();
    let result: DriverResult = match name.as_str() {
        "runCommand" => {
            let command = args.doc("command")?;
            args.take("commandName");
            let read_preference = match args.take("readPreference") {
                Some(rp) => Some(read_preference_from(rp)?),
                None => None,
            };
            let timeout = args
                .take("timeoutMS")
                .map(|v| millis(v, "timeoutMS"))
                .transpose()?;
            let action = db.run_command(command);
            let action = match read_preference {
                Some(rp) => action.selection_criteria(SelectionCriteria::ReadPreference(rp)),
                None => action,
            };
            // `RunCommandOptions` has no `Deserialize` that reads `timeoutMS`: set it directly.
            let action = match timeout {
                Some(t) => crate::timeouts::run_command(action, t)?,
                None => action,
            };
            run!(sess, action).map(|d| value(Some(Bson::Document(d))))
        }
        "runCursorCommand" | "createCommandCursor" => {
            let command = args.doc("command")?;
            args.take("commandName");
            let options: Option<crate::mongodb::options::RunCursorCommandOptions> =
                args.options()?;
            let action = db.run_cursor_command(command).with_options(options);
            drain_or_keep!(sess, action, name == "createCommandCursor", name)
        }
        "createCollection" => {
            let collection = args.string("collection")?;
            let options = args.options()?;
            // The result is the new collection (a test may save it as an entity).
            run!(
                sess,
                db.create_collection(&collection).with_options(options)
            )
            .map(|()| Produced::Entity(Entity::Collection(db.collection::<Document>(&collection))))
        }
        "modifyCollection" => {
            // The driver has no collMod helper; the operation is the command with the
            // remaining arguments, as the format describes it.
            let collection = args.string("collection")?;
            let mut command = doc! { "collMod": collection };
            command.extend(std::mem::take(&mut args.doc));
            run!(sess, db.run_command(command)).map(|d| value(Some(Bson::Document(d))))
        }
        "dropCollection" => {
            let collection = args.string("collection")?;
            let options: Option<crate::mongodb::options::DropCollectionOptions> = args.options()?;
            let coll = db.collection::<Document>(&collection);
            run!(sess, coll.drop().with_options(options)).map(|()| value(None))
        }
        "listCollections" | "listCollectionObjects" => {
            // `filter` is a field of the options struct: `.filter()` before `with_options`
            // would be reset by it, so it goes through the struct with the other arguments.
            let options = args.options()?;
            let action = db.list_collections().with_options(options);
            drain!(sess, action).map(|specs| {
                let docs = specs
                    .iter()
                    .filter_map(|s| bson::to_document(s).ok())
                    .collect();
                Produced::Documents(docs)
            })
        }
        "listCollectionNames" => {
            let options = args.options()?;
            run!(sess, db.list_collection_names().with_options(options)).map(|names| {
                value(Some(Bson::Array(
                    names.into_iter().map(Bson::String).collect(),
                )))
            })
        }
        "aggregate" => {
            let pipeline = args.docs("pipeline")?;
            let options = aggregate_options(args)?;
            let action = db.aggregate(pipeline).with_options(options);
            drain!(sess, action).map(Produced::Documents)
        }
        "createChangeStream" => {
            let pipeline = args.docs("pipeline").unwrap_or_default();
            let options = change_stream_options(args)?;
            db.watch()
                .pipeline(pipeline)
                .with_options(options)
                .await
                .map(change_stream_entity)
        }
        other => return Err(format!("operation {other} is not supported on a database")),
    };
    Ok(result)
}

/// A read preference as the format writes it (`mode`, `tagSets`, `maxStalenessSeconds`,
/// `hedge`), read by the driver's own deserializer, which takes every one of those fields and
/// rejects any other, so nothing beyond `mode` is dropped.
fn read_preference_from(value: Bson) -> Result<ReadPreference, String> {
    if !matches!(value, Bson::Document(_)) {
        return Err(format!("readPreference must be a document, got {value}"));
    }
    bson::from_bson(value.clone()).map_err(|e| format!("readPreference {value}: {e}"))
}

/// An options struct from the remaining arguments, with the format's `maxTimeMS` (which `T`
/// does not read under that name) set by `set_max_time`.
fn options_with_max_time<T: DeserializeOwned + Default>(
    args: &mut Args,
    set_max_time: impl FnOnce(&mut T, Duration),
) -> Result<Option<T>, String> {
    let max_time = args
        .take("maxTimeMS")
        .map(|v| millis(v, "maxTimeMS"))
        .transpose()?;
    let mut options: Option<T> = args.options()?;
    if let Some(t) = max_time {
        set_max_time(options.get_or_insert_with(T::default), t);
    }
    Ok(options)
}

/// `aggregate`'s options, with the format's `maxAwaitTimeMS` (the struct reads `maxAwaitTime`).
fn aggregate_options(
    args: &mut Args,
) -> Result<Option<crate::mongodb::options::AggregateOptions>, String> {
    let max_await = args
        .take("maxAwaitTimeMS")
        .map(|v| millis(v, "maxAwaitTimeMS"))
        .transpose()?;
    let mut options: Option<crate::mongodb::options::AggregateOptions> = args.options()?;
    if max_await.is_some() {
        options.get_or_insert_with(Default::default).max_await_time = max_await;
    }
    Ok(options)
}

/// `createChangeStream`'s options, with the format's `maxAwaitTimeMS`.
fn change_stream_options(
    args: &mut Args,
) -> Result<Option<crate::mongodb::options::ChangeStreamOptions>, String> {
    let max_await = args
        .take("maxAwaitTimeMS")
        .map(|v| millis(v, "maxAwaitTimeMS"))
        .transpose()?;
    let mut options: Option<crate::mongodb::options::ChangeStreamOptions> = args.options()?;
    if max_await.is_some() {
        options.get_or_insert_with(Default::default).max_await_time = max_await;
    }
    Ok(options)
}

/// The Atlas Search index operations on a collection. The search index commands take no read
/// or write concern and no session in the format's files.
async fn search_index_op(
    coll: &Collection<Document>,
    args: &mut Args,
) -> Result<DriverResult, String> {
    use crate::mongodb::SearchIndexModel;
    let model =
        |d: Document| -> Result<SearchIndexModel, String> { from_bson(Bson::Document(d), "model") };
    Ok(match args.op.clone().as_str() {
        "createSearchIndex" => {
            let m = model(args.doc("model")?)?;
            coll.create_search_index(m)
                .await
                .map(|name| value(Some(Bson::String(name))))
        }
        "createSearchIndexes" => {
            let models = args
                .docs("models")?
                .into_iter()
                .map(model)
                .collect::<Result<Vec<_>, _>>()?;
            coll.create_search_indexes(models).await.map(|names| {
                value(Some(Bson::Array(
                    names.into_iter().map(Bson::String).collect(),
                )))
            })
        }
        "dropSearchIndex" => {
            let name = args.string("name")?;
            coll.drop_search_index(name).await.map(|()| value(None))
        }
        "updateSearchIndex" => {
            let name = args.string("name")?;
            let definition = args.doc("definition")?;
            coll.update_search_index(name, definition)
                .await
                .map(|()| value(None))
        }
        _ => {
            let mut action = coll.list_search_indexes();
            if let Some(name) = args.take("name") {
                let Bson::String(name) = name else {
                    return Err(format!(
                        "listSearchIndexes: name must be a string, got {name}"
                    ));
                };
                action = action.name(name);
            }
            if let Some(options) = args.take("aggregationOptions") {
                let fields = struct_fields::<crate::mongodb::options::AggregateOptions>()
                    .unwrap_or_default();
                if let Some(key) = options
                    .as_document()
                    .and_then(|d| d.keys().find(|k| !fields.contains(&k.as_str())))
                {
                    return Err(format!(
                        "listSearchIndexes: aggregationOptions.{key} would be dropped"
                    ));
                }
                let options: crate::mongodb::options::AggregateOptions =
                    from_bson(options, "aggregationOptions")?;
                action = action.aggregate_options(options);
            }
            drain_cursor(action.await).await.map(Produced::Documents)
        }
    })
}

fn namespace(model: &Document) -> Result<Namespace, String> {
    let ns = model
        .get_str("namespace")
        .map_err(|_| format!("bulk write model without a namespace: {model}"))?;
    let (db, coll) = ns
        .split_once('.')
        .ok_or_else(|| format!("namespace {ns:?} is not db.collection"))?;
    Ok(Namespace::new(db, coll))
}

fn write_model(model: &Document) -> Result<WriteModel, String> {
    let (kind, body) = model
        .iter()
        .next()
        .filter(|_| model.len() == 1)
        .ok_or_else(|| format!("a bulk write model has exactly one key: {model}"))?;
    let Bson::Document(body) = body else {
        return Err(format!("bulk write model {kind} must be a document"));
    };
    let mut allowed = vec!["namespace"];
    let ns = namespace(body)?;
    let get = |key: &str| -> Result<Document, String> {
        body.get_document(key)
            .cloned()
            .map_err(|_| format!("bulk write model {kind}: missing document `{key}`"))
    };
    // `validate` made a non-boolean `upsert` a skip; here it is an error, never dropped.
    let upsert = match body.get("upsert") {
        None => None,
        Some(Bson::Boolean(b)) => Some(*b),
        Some(other) => return Err(format!("bulk write model {kind}: upsert {other}")),
    };
    let opt_doc = |key: &str| -> Result<Option<Document>, String> {
        match body.get(key) {
            None => Ok(None),
            Some(Bson::Document(d)) => Ok(Some(d.clone())),
            Some(other) => Err(format!("bulk write model {kind}: {key} {other}")),
        }
    };
    let collation = opt_doc("collation")?;
    let sort = opt_doc("sort")?;
    let hint = body.get("hint").cloned();
    let array_filters = match body.get("arrayFilters") {
        None => None,
        Some(Bson::Array(a)) => Some(a.clone()),
        Some(other) => return Err(format!("bulk write model {kind}: arrayFilters {other}")),
    };
    let model = match kind.as_str() {
        "insertOne" => {
            allowed.push("document");
            WriteModel::InsertOne(
                InsertOneModel::builder()
                    .namespace(ns)
                    .document(get("document")?)
                    .build(),
            )
        }
        "updateOne" | "updateMany" => {
            allowed.extend([
                "filter",
                "update",
                "upsert",
                "collation",
                "hint",
                "arrayFilters",
            ]);
            let update = match body.get("update") {
                Some(Bson::Document(d)) => UpdateModifications::Document(d.clone()),
                Some(Bson::Array(a)) => UpdateModifications::Pipeline(
                    a.iter().filter_map(|b| b.as_document().cloned()).collect(),
                ),
                _ => return Err(format!("bulk write model {kind}: bad `update`")),
            };
            if kind == "updateOne" {
                allowed.push("sort");
                WriteModel::UpdateOne(
                    UpdateOneModel::builder()
                        .namespace(ns)
                        .filter(get("filter")?)
                        .update(update)
                        .upsert(upsert)
                        .collation(collation)
                        .hint(hint)
                        .array_filters(array_filters)
                        .sort(sort)
                        .build(),
                )
            } else {
                WriteModel::UpdateMany(
                    UpdateManyModel::builder()
                        .namespace(ns)
                        .filter(get("filter")?)
                        .update(update)
                        .upsert(upsert)
                        .collation(collation)
                        .hint(hint)
                        .array_filters(array_filters)
                        .build(),
                )
            }
        }
        "replaceOne" => {
            allowed.extend([
                "filter",
                "replacement",
                "upsert",
                "collation",
                "hint",
                "sort",
            ]);
            WriteModel::ReplaceOne(
                ReplaceOneModel::builder()
                    .namespace(ns)
                    .filter(get("filter")?)
                    .replacement(get("replacement")?)
                    .upsert(upsert)
                    .collation(collation)
                    .hint(hint)
                    .sort(sort)
                    .build(),
            )
        }
        "deleteOne" => {
            allowed.extend(["filter", "collation", "hint"]);
            WriteModel::DeleteOne(
                DeleteOneModel::builder()
                    .namespace(ns)
                    .filter(get("filter")?)
                    .collation(collation)
                    .hint(hint)
                    .build(),
            )
        }
        "deleteMany" => {
            allowed.extend(["filter", "collation", "hint"]);
            WriteModel::DeleteMany(
                DeleteManyModel::builder()
                    .namespace(ns)
                    .filter(get("filter")?)
                    .collation(collation)
                    .hint(hint)
                    .build(),
            )
        }
        other => return Err(format!("unknown bulk write model {other}")),
    };
    if let Some(extra) = body.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(format!(
            "bulk write model {kind}: unsupported field {extra}"
        ));
    }
    Ok(model)
}

async fn client_op(
    client: &ClientEntity,
    args: &mut Args,
    sess: &mut Sess<'_>,
) -> Result<DriverResult, String> {
    let c = &client.client;
    let name = args.op.clone();
    let result: DriverResult = match name.as_str() {
        "listDatabases" | "listDatabaseObjects" => {
            // `filter` stays among the arguments: it is a field of `ListDatabasesOptions`,
            // which `with_options` sets whole.
            let name_only = match args.take("nameOnly") {
                None => false,
                Some(Bson::Boolean(b)) => b,
                Some(other) => return Err(format!("{name}: nameOnly {other}")),
            };
            let options = args.options()?;
            if name_only {
                // The driver's names-only form sends `nameOnly: true`; the server then returns
                // documents holding only `name`, which is what the runner yields.
                return Ok(
                    run!(sess, c.list_database_names().with_options(options)).map(|names| {
                        Produced::Documents(names.into_iter().map(|n| doc! {"name": n}).collect())
                    }),
                );
            }
            run!(sess, c.list_databases().with_options(options)).map(|specs| {
                let docs = specs
                    .iter()
                    .filter_map(|s| bson::to_document(s).ok())
                    .collect();
                Produced::Documents(docs)
            })
        }
        "listDatabaseNames" => {
            let options = args.options()?;
            run!(sess, c.list_database_names().with_options(options)).map(|names| {
                value(Some(Bson::Array(
                    names.into_iter().map(Bson::String).collect(),
                )))
            })
        }
        "clientBulkWrite" => {
            let models = args
                .docs("models")?
                .iter()
                .map(write_model)
                .collect::<Result<Vec<_>, _>>()?;
            let verbose = match args.take("verboseResults") {
                None => false,
                Some(Bson::Boolean(b)) => b,
                Some(other) => return Err(format!("clientBulkWrite: verboseResults {other}")),
            };
            if let Some(other) = args.doc.get("ordered").filter(|o| o.as_bool().is_none()) {
                return Err(format!("clientBulkWrite: ordered {other}"));
            }
            // ordered, bypassDocumentValidation, comment, let and writeConcern.
            let options: Option<crate::mongodb::options::BulkWriteOptions> = args.options()?;
            if verbose {
                let action = c.bulk_write(models).verbose_results().with_options(options);
                run!(sess, action).map(|r| value(Some(outcome::verbose_bulk_result(&r))))
            } else {
                let action = c.bulk_write(models).with_options(options);
                run!(sess, action).map(|r| value(Some(outcome::summary_bulk_result(&r))))
            }
        }
        "createChangeStream" => {
            let pipeline = args.docs("pipeline").unwrap_or_default();
            let options = change_stream_options(args)?;
            c.watch()
                .pipeline(pipeline)
                .with_options(options)
                .await
                .map(change_stream_entity)
        }
        other => return Err(format!("operation {other} is not supported on a client")),
    };
    Ok(result)
}

async fn session_op(
    ctx: &mut Ctx,
    id: &str,
    session: &SessionEntity,
    args: &mut Args,
    active: Option<&str>,
) -> Result<DriverResult, String> {
    if active == Some(id) {
        return Err(format!(
            "{}: not allowed inside withTransaction on the same session",
            args.op
        ));
    }
    let mut guard = session.session.clone().lock_owned().await;
    if args.op == "endSession" {
        guard.take();
        return Ok(Ok(value(None)));
    }
    let Some(s) = guard.as_mut() else {
        return Err(format!("{}: session {id:?} was already ended", args.op));
    };
    let name = args.op.clone();
    let result: DriverResult = match name.as_str() {
        "startTransaction" => {
            let options: Option<TransactionOptions> = args.options()?;
            s.start_transaction()
                .with_options(options)
                .await
                .map(|()| value(None))
        }
        "commitTransaction" => {
            let timeout = taken_timeout(args)?;
            crate::timeouts::commit_transaction(s.commit_transaction(), timeout)
                .await?
                .map(|()| value(None))
        }
        // A snapshot session's time, once its first read chose one (or its options set one).
        "getSnapshotTime" => match s.snapshot_time() {
            Some(ts) => Ok(value(Some(Bson::Timestamp(ts)))),
            None => return Err("getSnapshotTime: the session has no snapshot time".into()),
        },
        "abortTransaction" => {
            let timeout = taken_timeout(args)?;
            crate::timeouts::abort_transaction(s.abort_transaction(), timeout)
                .await?
                .map(|()| value(None))
        }
        "withTransaction" => {
            let callback: Vec<schema::Operation> = match args.take("callback") {
                Some(b) => from_bson(b, "withTransaction.callback")?,
                None => return Err("withTransaction: missing callback".into()),
            };
            let timeout = taken_timeout(args)?;
            let options: Option<TransactionOptions> = args.options()?;
            let ctx_ref: &mut Ctx = ctx;
            let id = id.to_string();
            let state = (ctx_ref, callback, id);
            crate::timeouts::start_transaction(s.start_transaction(), timeout)?
                .with_options(options)
                .and_run(state, |session, state| {
                    async move {
                        let (ctx, callback, id) = state;
                        for op in callback.iter() {
                            let outcome =
                                execute(ctx, op, Some((id.as_str(), &mut *session))).await;
                            match outcome {
                                Err(runner) => {
                                    ctx.callback_failures.push(runner.clone());
                                    return Err(DriverError::custom(runner));
                                }
                                Ok(result) => {
                                    let error = match &result {
                                        Err(e) => Some(e.clone()),
                                        Ok(_) => None,
                                    };
                                    if let Err(f) =
                                        expect::check_operation(op, result, &mut ctx.entities)
                                    {
                                        ctx.callback_failures.push(f.clone());
                                        return Err(error.unwrap_or_else(|| DriverError::custom(f)));
                                    }
                                    if let Some(e) = error {
                                        return Err(e);
                                    }
                                }
                            }
                        }
                        Ok(())
                    }
                    .boxed()
                })
                .await
                .map(|()| value(None))
        }
        other => return Err(format!("operation {other} is not supported on a session")),
    };
    Ok(result)
}

async fn cursor_op(
    ctx: &mut Ctx,
    id: &str,
    cursor: Arc<AsyncMutex<crate::mongodb::Cursor<Document>>>,
    args: &mut Args,
) -> Result<DriverResult, String> {
    match args.op.as_str() {
        "iterateUntilDocumentOrError" => {
            let mut c = cursor.lock().await;
            match c.try_next().await {
                Ok(Some(d)) => Ok(Ok(value(Some(Bson::Document(d))))),
                Ok(None) => Err(format!("cursor {id:?} is exhausted")),
                Err(e) => Ok(Err(e)),
            }
        }
        "iterateOnce" => {
            let mut c = cursor.lock().await;
            Ok(c.advance().await.map(|_| value(None)))
        }
        "close" => {
            let timeout = args
                .take("timeoutMS")
                .map(|v| millis(v, "timeoutMS"))
                .transpose()?;
            ctx.entities.remove(id);
            // The entity was the cursor's only other holder.
            let cursor = Arc::try_unwrap(cursor)
                .map_err(|_| format!("cursor {id:?} is in use elsewhere"))?
                .into_inner();
            Ok(crate::timeouts::close_cursor(cursor, timeout)
                .await?
                .map(|()| value(None)))
        }
        other => Err(format!("operation {other} is not supported on a cursor")),
    }
}

/// A change stream entity. Its events are raw documents: the format matches what the server
/// sent (new fields, other `ns` shapes, projections), which the driver's typed
/// `ChangeStreamEvent` would reject or drop.
fn change_stream_entity(
    stream: crate::mongodb::change_stream::ChangeStream<
        crate::mongodb::change_stream::event::ChangeStreamEvent<Document>,
    >,
) -> Produced {
    Produced::Entity(Entity::ChangeStream(Arc::new(AsyncMutex::new(
        stream.with_type::<Document>(),
    ))))
}

async fn change_stream_op(
    ctx: &mut Ctx,
    id: &str,
    stream: Arc<AsyncMutex<crate::mongodb::change_stream::ChangeStream<Document>>>,
    args: &Args,
) -> Result<DriverResult, String> {
    match args.op.as_str() {
        "iterateUntilDocumentOrError" => {
            let mut cs = stream.lock().await;
            match cs.try_next().await {
                Ok(Some(event)) => Ok(Ok(value(Some(Bson::Document(event))))),
                Ok(None) => Err(format!("change stream {id:?} ended")),
                Err(e) => Ok(Err(e)),
            }
        }
        "iterateOnce" => {
            let mut cs = stream.lock().await;
            Ok(cs.next_if_any().await.map(|_| value(None)))
        }
        "close" => {
            ctx.entities.remove(id);
            Ok(Ok(value(None)))
        }
        other => Err(format!(
            "operation {other} is not supported on a change stream"
        )),
    }
}

async fn configure_fail_point(
    ctx: &mut Ctx,
    client: Client,
    command: Document,
) -> Result<DriverResult, String> {
    let name = command
        .get_str("configureFailPoint")
        .map_err(|_| format!("failPoint must be a configureFailPoint command: {command}"))?
        .to_string();
    match client.database("admin").run_command(command).await {
        Ok(_) => {
            ctx.failpoints.push((client, name));
            Ok(Ok(value(None)))
        }
        Err(e) => Err(format!("configureFailPoint {name} failed: {e}")),
    }
}

async fn test_runner(
    ctx: &mut Ctx,
    args: &mut Args,
    active: Option<(&str, &mut ClientSession)>,
) -> Result<DriverResult, String> {
    let name = args.op.clone();
    let ok = || Ok(Ok(value(None)));
    match name.as_str() {
        "failPoint" => {
            let client = ctx.entities.client(&args.string("client")?)?.client;
            let command = args.doc("failPoint")?;
            configure_fail_point(ctx, client, command).await
        }
        "targetedFailPoint" => {
            let id = args.string("session")?;
            let command = args.doc("failPoint")?;
            if !ctx.single_host {
                let entity = ctx.entities.session(&id)?;
                let client = ctx.entities.client(&entity.client)?.client;
                configure_fail_point(ctx, client, command).await
            } else {
                Err(
                    "targetedFailPoint on several mongoses needs the session's pinned server, \
                     which the Rust driver does not expose"
                        .into(),
                )
            }
        }
        "createEntities" => {
            let list = args.take("entities").unwrap_or(Bson::Null);
            let defs: Vec<EntityDef> = from_bson(list, "createEntities.entities")?;
            create_entities(ctx, &defs).await?;
            ok()
        }
        "waitForEvent" | "assertEventCount" => {
            let client = ctx.entities.client(&args.string("client")?)?;
            let event: ExpectedEvent =
                from_bson(args.take("event").unwrap_or(Bson::Null), "event")?;
            let wanted = args.int("count")? as usize;
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let seen = count_observed(&client, &event, &ctx.entities)
                    .map_err(|e| format!("{name}: {e}"))?;
                if name == "assertEventCount" {
                    return if seen == wanted {
                        ok()
                    } else {
                        Err(format!(
                            "expected {wanted} {} events, saw {seen}",
                            event.name()
                        ))
                    };
                }
                if seen >= wanted {
                    return ok();
                }
                if Instant::now() >= deadline {
                    return Err(format!(
                        "waitForEvent: saw {seen} of {wanted} {} events in 10 s",
                        event.name()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        "assertSameLsidOnLastTwoCommands" | "assertDifferentLsidOnLastTwoCommands" => {
            let client = ctx.entities.client(&args.string("client")?)?;
            let started: Vec<_> = client
                .observed()
                .into_iter()
                .filter(|e| e.name == "commandStartedEvent")
                .collect();
            let [.., a, b] = started.as_slice() else {
                return Err(format!("{name}: fewer than two commandStartedEvents"));
            };
            compare_lsids(name == "assertSameLsidOnLastTwoCommands", a, b)
                .map_err(|e| format!("{name}: {e}"))?;
            ok()
        }
        "assertCollectionExists" | "assertCollectionNotExists" => {
            let db = args.string("databaseName")?;
            let coll = args.string("collectionName")?;
            let names = ctx
                .internal
                .database(&db)
                .list_collection_names()
                .await
                .map_err(|e| format!("{name}: listCollections failed: {e}"))?;
            if names.contains(&coll) == (name == "assertCollectionExists") {
                ok()
            } else {
                Err(format!("{name}: {db}.{coll}; collections are {names:?}"))
            }
        }
        "assertIndexExists" | "assertIndexNotExists" => {
            let db = args.string("databaseName")?;
            let coll = args.string("collectionName")?;
            let index = args.string("indexName")?;
            let listed = ctx
                .internal
                .database(&db)
                .collection::<Document>(&coll)
                .list_index_names()
                .await;
            let names = index_names_or_none(listed).map_err(|e| format!("{name}: {e}"))?;
            if names.contains(&index) == (name == "assertIndexExists") {
                ok()
            } else {
                Err(format!(
                    "{name}: {index} on {db}.{coll}; indexes are {names:?}"
                ))
            }
        }
        "assertNumberConnectionsCheckedOut" => {
            let client = ctx.entities.client(&args.string("client")?)?;
            let wanted = args.int("connections")?;
            let have = client.connections_checked_out();
            if have == wanted {
                ok()
            } else {
                Err(format!(
                    "expected {wanted} connections checked out, found {have}"
                ))
            }
        }
        "runOnThread" => {
            let thread = ctx.entities.thread(&args.string("thread")?)?;
            let op: schema::Operation = from_bson(
                args.take("operation").unwrap_or(Bson::Null),
                "runOnThread.operation",
            )?;
            let mut thread_ctx = Ctx {
                entities: ctx.entities.clone(),
                uri: ctx.uri.clone(),
                single_host: ctx.single_host,
                internal: ctx.internal.clone(),
                failpoints: Vec::new(),
                callback_failures: Vec::new(),
            };
            let mut slot = thread
                .lock()
                .map_err(|_| "a thread entity's lock is poisoned")?;
            let previous = slot.take();
            *slot = Some(tokio::spawn(async move {
                if let Some(previous) = previous {
                    previous
                        .await
                        .map_err(|e| format!("thread task failed: {e}"))??;
                }
                let label = format!("{} on {}", op.name, op.object);
                let result = execute(&mut thread_ctx, &op, None)
                    .await
                    .map_err(|e| format!("{label}: {e}"))?;
                expect::check_operation(&op, result, &mut thread_ctx.entities)
                    .map_err(|e| format!("{label}: {e}"))
            }));
            ok()
        }
        "waitForThread" => {
            let id = args.string("thread")?;
            let thread = ctx.entities.thread(&id)?;
            join_thread(&id, &thread).await?;
            ok()
        }
        "wait" => {
            let ms = args.int("ms")?;
            tokio::time::sleep(Duration::from_millis(ms.max(0) as u64)).await;
            ok()
        }
        other => {
            let _ = active;
            Err(format!("test runner operation {other} is not supported"))
        }
    }
}

/// The server's NamespaceNotFound code: listIndexes on a collection that does not exist.
const NAMESPACE_NOT_FOUND: i32 = 26;

fn command_error_code(error: &DriverError) -> Option<i32> {
    match error.kind.as_ref() {
        crate::mongodb::error::ErrorKind::Command(c) => Some(c.code),
        _ => None,
    }
}

/// The index names listIndexes returned, or none when the collection does not exist
/// (NamespaceNotFound). Any other failure is an error: it proves nothing about the index.
fn index_names_or_none(listed: Result<Vec<String>, DriverError>) -> Result<Vec<String>, String> {
    match listed {
        Ok(names) => Ok(names),
        Err(e) if command_error_code(&e) == Some(NAMESPACE_NOT_FOUND) => Ok(Vec::new()),
        Err(e) => Err(format!("listIndexes failed: {e}")),
    }
}

/// How many events the client observed that match `event`, for `waitForEvent` and
/// `assertEventCount`. Only observed events count, with the format's exclusions (ignored and
/// sensitive commands, configureFailPoint): the filter `expectEvents` uses too. An event kind
/// the client does not observe is an error, since it could never be counted.
fn count_observed(
    client: &ClientEntity,
    event: &ExpectedEvent,
    entities: &EntityMap,
) -> Result<usize, String> {
    if !client.observe.iter().any(|o| o == event.name()) {
        return Err(format!(
            "the client does not observe {} (its observeEvents: {:?})",
            event.name(),
            client.observe
        ));
    }
    Ok(client
        .observed()
        .iter()
        .filter(|e| expect::event_matches(event, e, entities).is_ok())
        .count())
}

/// `assertSameLsidOnLastTwoCommands` (`same`) or `assertDifferentLsidOnLastTwoCommands`. Both
/// are about two sessions' ids: a command without an lsid proves neither, so it fails both.
fn compare_lsids(same: bool, a: &entities::Observed, b: &entities::Observed) -> Result<(), String> {
    let lsid = |e: &entities::Observed| e.command.as_ref().and_then(|c| c.get("lsid").cloned());
    let (Some(first), Some(second)) = (lsid(a), lsid(b)) else {
        return Err(format!(
            "a command has no lsid: {:?} {:?}, then {:?} {:?}",
            a.command_name,
            lsid(a),
            b.command_name,
            lsid(b)
        ));
    };
    if (first == second) == same {
        Ok(())
    } else {
        Err(format!("lsids were {first} and {second}"))
    }
}

/// Waits (10 s at most, as the format says for `waitForThread`) for the operations scheduled on
/// a thread, and reports the first that failed.
async fn join_thread(id: &str, thread: &entities::ThreadEntity) -> Result<(), String> {
    let handle = thread
        .lock()
        .map_err(|_| "a thread entity's lock is poisoned")?
        .take();
    let Some(handle) = handle else {
        return Ok(());
    };
    match tokio::time::timeout(Duration::from_secs(10), handle).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(format!("thread {id}: {e}")),
        Ok(Err(e)) => Err(format!("thread {id}: task failed: {e}")),
        Err(_) => Err(format!("thread {id} did not finish in 10 s")),
    }
}

/// Joins every thread entity that still has work no `waitForThread` collected, so that a
/// failure on a thread fails the test even when the test never waits for that thread.
pub async fn join_threads(entities: &EntityMap, when: &str) -> Result<(), String> {
    let mut threads = entities.threads();
    threads.sort_by(|a, b| a.0.cmp(&b.0));
    for (id, thread) in threads {
        join_thread(&id, &thread)
            .await
            .map_err(|e| format!("{when}: {e}"))?;
    }
    Ok(())
}

/// Creates entities in order, each able to refer to the ones before it.
pub async fn create_entities(ctx: &mut Ctx, defs: &[EntityDef]) -> Result<(), String> {
    if let Some(reason) = entities_skip_reason(defs) {
        return Err(reason);
    }
    for def in defs {
        let entity = match def {
            EntityDef::Client(c) => {
                Entity::Client(entities::create_client(c, &ctx.uri, ctx.single_host).await?)
            }
            EntityDef::Database(d) => {
                let client = ctx.entities.client(&d.client)?;
                let options = d.database_options.clone().unwrap_or_default();
                let mut db_options = crate::mongodb::options::DatabaseOptions::default();
                db_options.read_concern = options
                    .read_concern
                    .map(bson::from_document)
                    .transpose()
                    .map_err(|e| e.to_string())?;
                db_options.write_concern = options
                    .write_concern
                    .map(bson::from_document)
                    .transpose()
                    .map_err(|e| e.to_string())?;
                if let Some(rp) = options.read_preference {
                    db_options.selection_criteria = Some(SelectionCriteria::ReadPreference(
                        read_preference_from(Bson::Document(rp))?,
                    ));
                }
                crate::timeouts::set_database(
                    &mut db_options,
                    options.timeout_ms.map(Duration::from_millis),
                )?;
                Entity::Database(
                    client
                        .client
                        .database_with_options(&d.database_name, db_options),
                )
            }
            EntityDef::Collection(c) => {
                let db = ctx.entities.database(&c.database)?;
                let options = c.collection_options.clone().unwrap_or_default();
                let mut coll_options = crate::mongodb::options::CollectionOptions::default();
                coll_options.read_concern = options
                    .read_concern
                    .map(bson::from_document)
                    .transpose()
                    .map_err(|e| e.to_string())?;
                coll_options.write_concern = options
                    .write_concern
                    .map(bson::from_document)
                    .transpose()
                    .map_err(|e| e.to_string())?;
                if let Some(rp) = options.read_preference {
                    coll_options.selection_criteria = Some(SelectionCriteria::ReadPreference(
                        read_preference_from(Bson::Document(rp))?,
                    ));
                }
                crate::timeouts::set_collection(
                    &mut coll_options,
                    options.timeout_ms.map(Duration::from_millis),
                )?;
                Entity::Collection(db.collection_with_options(&c.collection_name, coll_options))
            }
            EntityDef::Session(s) => {
                let client = ctx.entities.client(&s.client)?;
                let mut options = crate::mongodb::options::SessionOptions::default();
                if let Some(o) = &s.session_options {
                    options.causal_consistency = o.causal_consistency;
                    options.snapshot = o.snapshot;
                    crate::timeouts::set_session(
                        &mut options,
                        o.default_timeout_ms.map(Duration::from_millis),
                    )?;
                    if let Some(saved) = &o.snapshot_time {
                        options.snapshot_time = match crate::matching::EntityLookup::bson_entity(
                            &ctx.entities,
                            saved,
                        ) {
                            Some(Bson::Timestamp(ts)) => Some(ts),
                            other => {
                                return Err(format!(
                                    "session {}: snapshotTime {saved:?} is not a saved \
                                     timestamp: {other:?}",
                                    s.id
                                ))
                            }
                        };
                    }
                    options.default_transaction_options = o
                        .default_transaction_options
                        .clone()
                        .map(bson::from_document)
                        .transpose()
                        .map_err(|e| format!("session {}: defaultTransactionOptions: {e}", s.id))?;
                }
                let session = client
                    .client
                    .start_session()
                    .with_options(options)
                    .await
                    .map_err(|e| format!("session {}: cannot start: {e}", s.id))?;
                Entity::Session(SessionEntity {
                    lsid: session.id().clone(),
                    session: Arc::new(AsyncMutex::new(Some(session))),
                    client: s.client.clone(),
                })
            }
            EntityDef::Thread(_) => Entity::Thread(Arc::default()),
            EntityDef::Bucket(b) => {
                let db = ctx.entities.database(&b.database)?;
                Entity::Bucket(crate::gridfs::create(&db, b.bucket_options.as_ref())?)
            }
            other => return Err(format!("entity {:?} cannot be created", other.id())),
        };
        ctx.entities.insert(def.id(), entity)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use bson::doc;

    use super::*;
    use crate::entities::Observed;
    use crate::mongodb::error::{CommandError, ErrorKind};
    use crate::mongodb::options::FindOptions;
    use crate::schema::EventType;

    fn operation(d: Document) -> schema::Operation {
        bson::from_document(d).expect("a well-formed operation")
    }

    /// The skip reason `validate` gives a valid operation.
    fn skip_reason(d: Document) -> Option<String> {
        validate(&operation(d), "t", &[]).expect("a valid operation")
    }

    #[cfg(not(feature = "upstream"))]
    #[test]
    fn timeout_arguments_run_only_where_the_driver_takes_them() {
        // Every operation with a per-call `.timeout()` runs with `timeoutMS`: its options struct
        // reads it, or (runCommand) the runner sets it.
        for (name, args) in [
            ("insertOne", doc! {"document": {}}),
            ("find", doc! {"filter": {}}),
            (
                "findOneAndUpdate",
                doc! {"filter": {}, "update": {"$set": {"x": 1}}},
            ),
            ("estimatedDocumentCount", doc! {}),
            (
                "runCommand",
                doc! {"command": {"ping": 1}, "commandName": "ping"},
            ),
        ] {
            let mut args = args;
            args.insert("timeoutMS", 100);
            let object = if name == "runCommand" { "d" } else { "c" };
            let reason = skip_reason(doc! {"name": name, "object": object, "arguments": args});
            assert_eq!(reason, None, "{name}");
        }
        // So do the catalog, index and list helpers, client bulkWrite and change streams.
        for (name, object, args) in [
            ("listCollections", "d", doc! {"filter": {}}),
            ("listDatabaseNames", "c", doc! {}),
            ("listIndexes", "c", doc! {}),
            ("createIndex", "c", doc! {"keys": {"x": 1}, "name": "x_1"}),
            ("dropIndexes", "c", doc! {}),
            ("createCollection", "d", doc! {"collection": "c"}),
            ("dropCollection", "d", doc! {"collection": "c"}),
            (
                "clientBulkWrite",
                "c",
                doc! {"models": [{"insertOne": {"namespace": "d.c", "document": {}}}]},
            ),
            ("createChangeStream", "c", doc! {"pipeline": []}),
            // And the cursors (stage 2), with their timeoutMode and their close.
            (
                "runCursorCommand",
                "d",
                doc! {"command": {"find": "c"}, "timeoutMode": "iteration"},
            ),
            (
                "createFindCursor",
                "c",
                doc! {"filter": {}, "timeoutMode": "cursorLifetime"},
            ),
            (
                "aggregate",
                "c",
                doc! {"pipeline": [], "timeoutMode": "iteration"},
            ),
            ("close", "cursor", doc! {}),
        ] {
            let mut args = args;
            args.insert("timeoutMS", 100);
            let reason = skip_reason(doc! {"name": name, "object": object, "arguments": args});
            assert_eq!(reason, None, "{name}");
        }
        // So do a session's own commands (stage 3); startTransaction has none of its own.
        for name in ["commitTransaction", "abortTransaction"] {
            let reason = skip_reason(doc! {"name": name, "object": "s",
            "arguments": {"timeoutMS": 100}});
            assert_eq!(reason, None, "{name}");
        }
        let reason = skip_reason(doc! {"name": "startTransaction", "object": "s",
        "arguments": {"timeoutMS": 100}});
        assert!(reason.is_some_and(|r| r.contains("no timeoutMS of its own")));
    }

    #[test]
    fn the_field_probe_sees_what_serde_drops() {
        let fields = struct_fields::<FindOptions>().expect("FindOptions is a derived struct");
        assert!(fields.contains(&"batchSize"), "{fields:?}");
        // `#[serde(skip)]` in the driver: a plain deserialization would drop these silently.
        assert!(!fields.contains(&"cursorType"), "{fields:?}");
        assert!(!fields.contains(&"maxAwaitTime"), "{fields:?}");
        assert_eq!(struct_fields::<Document>(), None);
    }

    #[test]
    fn arguments_the_runner_sets_itself_run_and_the_rest_are_skips() {
        let honoured = [
            doc! {"name": "find", "object": "c", "arguments": {"filter": {},
            "cursorType": "tailableAwait", "maxAwaitTimeMS": 10, "maxTimeMS": 5}},
            doc! {"name": "createFindCursor", "object": "c", "arguments": {"filter": {},
            "cursorType": "tailable"}},
            doc! {"name": "aggregate", "object": "c", "arguments": {"pipeline": [],
            "maxAwaitTimeMS": 10}},
            doc! {"name": "createChangeStream", "object": "c", "arguments": {"pipeline": [],
            "maxAwaitTimeMS": 10}},
            doc! {"name": "createIndex", "object": "c", "arguments": {"keys": {"x": 1},
            "maxTimeMS": 100}},
            doc! {"name": "listDatabases", "object": "c", "arguments": {"nameOnly": true}},
            doc! {"name": "countDocuments", "object": "c", "arguments": {"filter": {},
            "maxTimeMS": 100}},
            doc! {"name": "findOneAndUpdate", "object": "c", "arguments": {"filter": {},
            "update": {"$set": {"x": 1}}, "maxTimeMS": 100}},
            doc! {"name": "clientBulkWrite", "object": "c", "arguments": {"models": [],
            "ordered": false, "bypassDocumentValidation": true, "comment": "c",
            "let": {"a": 1}, "writeConcern": {"w": 1}}},
            doc! {"name": "runCommand", "object": "d", "arguments": {"command": {"ping": 1},
            "readPreference": {"mode": "secondary", "tagSets": [{"dc": "ny"}],
            "maxStalenessSeconds": 120}}},
        ];
        for op in honoured {
            assert_eq!(skip_reason(op.clone()), None, "{op}");
        }
        let reason = skip_reason(
            doc! {"name": "createCollection", "object": "d", "arguments": {"collection": "c",
            "encryptedFields": {}}},
        )
        .expect("encryptedFields cannot be honoured");
        assert!(
            reason.contains("createCollection.encryptedFields"),
            "{reason}"
        );
        let reason = skip_reason(
            doc! {"name": "listDatabases", "object": "c", "arguments": {"nameOnly": 1}},
        )
        .expect("a numeric nameOnly cannot be honoured");
        assert!(reason.contains("nameOnly"), "{reason}");
        let reason = skip_reason(
            doc! {"name": "find", "object": "c", "arguments": {"filter": {},
            "cursorType": "sideways"}},
        )
        .expect("an unknown cursor type cannot be honoured");
        assert!(reason.contains("cursorType"), "{reason}");
    }

    /// Every argument the format allows that the runner cannot honour, in one list: a new one
    /// (a driver update removing a field, a new allowed argument) fails here until it is
    /// honoured or knowingly added.
    #[test]
    fn the_unhonoured_arguments_are_exactly_these() {
        let mut unhonoured = Vec::new();
        for (op, allowed) in ARGUMENTS {
            if let Some(honoured) = honoured_arguments(op) {
                for arg in allowed.iter().filter(|a| !honoured.contains(a)) {
                    unhonoured.push(format!("{op}.{arg}"));
                }
            }
        }
        assert_eq!(unhonoured, UNHONOURED);
    }

    #[test]
    fn wrongly_typed_bulk_write_flags_are_skips() {
        let model = |upsert: Bson| {
            doc! {"updateOne": {"namespace": "d.c", "filter": {}, "update": {"$set": {"x": 1}},
            "upsert": upsert}}
        };
        let ok = doc! {"name": "clientBulkWrite", "object": "c",
        "arguments": {"models": [model(Bson::Boolean(true))], "ordered": false}};
        assert_eq!(skip_reason(ok), None);
        let reason = skip_reason(doc! {"name": "clientBulkWrite", "object": "c",
        "arguments": {"models": [model(Bson::String("yes".into()))]}})
        .expect("a string upsert cannot be honoured");
        assert!(reason.contains("models[0].upsert"), "{reason}");
        let reason = skip_reason(doc! {"name": "clientBulkWrite", "object": "c",
        "arguments": {"models": [], "ordered": "true"}})
        .expect("a string ordered cannot be honoured");
        assert!(reason.contains("ordered"), "{reason}");
        assert!(write_model(&model(Bson::Int32(1))).is_err());
    }

    #[test]
    fn read_preferences_keep_every_field() {
        let rp = read_preference_from(Bson::Document(doc! {"mode": "secondary",
        "tagSets": [{"dc": "ny"}], "maxStalenessSeconds": 120}))
        .expect("a full read preference");
        let ReadPreference::Secondary {
            options: Some(options),
        } = rp
        else {
            panic!("expected a secondary read preference with options, got {rp:?}");
        };
        assert_eq!(options.tag_sets.map(|t| t.len()), Some(1));
        assert_eq!(options.max_staleness, Some(Duration::from_secs(120)));
        assert!(read_preference_from(Bson::Document(doc! {"mode": "nearest", "x": 1})).is_err());
        let reason = skip_reason(doc! {"name": "runCommand", "object": "d", "arguments": {
        "command": {"ping": 1}, "readPreference": {"mode": "primary", "bogus": 1}}})
        .expect("an unreadable read preference cannot be honoured");
        assert!(reason.contains("readPreference"), "{reason}");
    }

    #[test]
    fn options_never_drop_an_argument() {
        let mut args = Args {
            doc: doc! {"batchSize": 2, "cursorType": "tailable"},
            op: "find".into(),
        };
        let err = args.options::<FindOptions>().unwrap_err();
        assert!(err.contains("cursorType"), "{err}");
        let mut args = Args {
            doc: doc! {"batchSize": 2},
            op: "find".into(),
        };
        let options = args.options::<FindOptions>().unwrap().unwrap();
        assert_eq!(options.batch_size, Some(2));
    }

    fn started(lsid: Option<Document>) -> Observed {
        let mut event = Observed::new("commandStartedEvent", EventType::Command);
        event.command_name = Some("ping".into());
        let mut command = doc! {"ping": 1};
        if let Some(lsid) = lsid {
            command.insert("lsid", lsid);
        }
        event.command = Some(command);
        event
    }

    #[test]
    fn a_command_without_an_lsid_fails_both_lsid_assertions() {
        let (a, b) = (doc! {"id": 1}, doc! {"id": 2});
        assert!(compare_lsids(false, &started(Some(a.clone())), &started(Some(b))).is_ok());
        assert!(compare_lsids(true, &started(Some(a.clone())), &started(Some(a.clone()))).is_ok());
        // The old check called "no lsid" different from any lsid.
        let err = compare_lsids(false, &started(Some(a)), &started(None)).unwrap_err();
        assert!(err.contains("no lsid"), "{err}");
        assert!(compare_lsids(true, &started(None), &started(None)).is_err());
    }

    fn command_error(code: i32) -> DriverError {
        let error: CommandError =
            bson::from_document(doc! {"code": code, "codeName": "X", "errmsg": "failed"})
                .expect("a command error");
        ErrorKind::Command(error).into()
    }

    #[test]
    fn only_namespace_not_found_means_no_index() {
        assert_eq!(index_names_or_none(Err(command_error(26))), Ok(Vec::new()));
        assert_eq!(
            index_names_or_none(Ok(vec!["_id_".to_string()])),
            Ok(vec!["_id_".to_string()])
        );
        // Unauthorized: the index may well exist; the old check called it absent.
        let err = index_names_or_none(Err(command_error(13))).unwrap_err();
        assert!(err.contains("listIndexes failed"), "{err}");
    }

    #[tokio::test]
    async fn event_counts_see_only_what_the_client_observes() {
        let client = Client::with_uri_str("mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=50")
            .await
            .expect("a client (it never connects)");
        let entity = ClientEntity {
            client: client.clone(),
            log: entities::EventLog::default(),
            observe: vec!["commandStartedEvent".into()],
            ignore_commands: vec!["hello".into()],
            observe_sensitive: false,
            logs: None,
        };
        for name in ["ping", "configureFailPoint", "hello"] {
            let mut event = started(None);
            event.command_name = Some(name.into());
            entity.log.push(event);
        }
        entity
            .log
            .push(Observed::new("poolClearedEvent", EventType::Cmap));
        let any_started: ExpectedEvent =
            bson::from_document(doc! {"commandStartedEvent": {}}).expect("an expected event");
        // The old count took every recorded event: 3 here.
        assert_eq!(
            count_observed(&entity, &any_started, &EntityMap::default()),
            Ok(1)
        );
        let cleared: ExpectedEvent =
            bson::from_document(doc! {"poolClearedEvent": {}}).expect("an expected event");
        let err = count_observed(&entity, &cleared, &EntityMap::default()).unwrap_err();
        assert!(err.contains("does not observe poolClearedEvent"), "{err}");
        client.shutdown().immediate(true).await;
    }

    #[tokio::test]
    async fn a_failed_thread_fails_the_test_without_wait_for_thread() {
        let mut entities = EntityMap::default();
        let thread: entities::ThreadEntity = Arc::default();
        *thread.lock().expect("a fresh lock") = Some(tokio::spawn(async {
            Err("insertOne: unexpected error".to_string())
        }));
        entities
            .insert("thread0", Entity::Thread(thread))
            .expect("a new entity");
        let err = join_threads(&entities, "at the end of the test")
            .await
            .unwrap_err();
        assert!(err.contains("thread thread0: insertOne"), "{err}");
        // Joined once: nothing is left to report.
        assert_eq!(join_threads(&entities, "again").await, Ok(()));
    }
}
