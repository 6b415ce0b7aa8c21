//! Serde types for the unified test format.
//!
//! Every struct rejects unknown fields, so a field this runner does not understand fails the parse
//! instead of being silently ignored. Operation arguments stay a free-form document here; the
//! `operations` module gives them their per-operation types (also strict).

use std::fmt;
use std::path::Path;

use bson::{Bson, Document};
use serde::Deserialize;

/// The highest `schemaVersion` this runner implements. Files of major version 1 up to this minor
/// version are accepted; anything else is rejected when the file is loaded.
pub const MAX_SCHEMA_VERSION: (u32, u32) = (1, 26);

/// A file that could not be loaded: names the file, and the JSON path inside it when known.
#[derive(Debug, Clone)]
pub struct LoadError {
    pub file: String,
    pub path: Option<String>,
    pub message: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{}: at `{}`: {}", self.file, path, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for LoadError {}

/// Parses a `major.minor[.patch]` schema version.
pub fn parse_schema_version(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |p| p.parse().ok())?;
    let patch = parts.next().map_or(Some(0), |p| p.parse().ok())?;
    if parts.next().is_some() {
        return None;
    }
    Some((major, minor, patch))
}

/// Checks a file's `schemaVersion` against [`MAX_SCHEMA_VERSION`].
pub fn check_schema_version(text: &str) -> Result<(), String> {
    let (max_major, max_minor) = MAX_SCHEMA_VERSION;
    match parse_schema_version(text) {
        None => Err(format!("schemaVersion {text:?} is not a version string")),
        Some((major, minor, _)) if major == max_major && minor <= max_minor => Ok(()),
        Some(_) => Err(format!(
            "schemaVersion {text} is not supported: this runner implements {max_major}.0 up to \
             {max_major}.{max_minor}"
        )),
    }
}

/// Reads and strictly parses one unified-format file.
pub fn load_file(path: &Path) -> Result<TestFile, LoadError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| LoadError {
        file: file.clone(),
        path: None,
        message: format!("cannot read: {e}"),
    })?;
    parse_file(&file, &text)
}

/// Strictly parses the text of a unified-format file; `file` names it in errors.
pub fn parse_file(file: &str, text: &str) -> Result<TestFile, LoadError> {
    let err = |path: Option<String>, message: String| LoadError {
        file: file.to_string(),
        path,
        message,
    };
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| err(None, format!("invalid JSON: {e}")))?;
    // The version decides whether the rest may be interpreted at all, so check it first.
    match value.get("schemaVersion") {
        Some(serde_json::Value::String(v)) => {
            check_schema_version(v).map_err(|m| err(Some("schemaVersion".into()), m))?
        }
        Some(_) => {
            return Err(err(
                Some("schemaVersion".into()),
                "schemaVersion must be a string".into(),
            ))
        }
        None => return Err(err(None, "missing required field `schemaVersion`".into())),
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        err(Some(path), e.into_inner().to_string())
    })
}

/// A whole test file.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TestFile {
    pub description: String,
    pub schema_version: String,
    pub run_on_requirements: Option<Vec<RunOnRequirement>>,
    pub create_entities: Option<Vec<EntityDef>>,
    pub initial_data: Option<Vec<CollectionData>>,
    pub tests: Vec<Test>,
    /// YAML anchors carried into the JSON by the converter; never interpreted.
    #[serde(rename = "_yamlAnchors")]
    pub yaml_anchors: Option<serde_json::Value>,
}

/// One entry of `runOnRequirements`; a list of them is satisfied when any one is.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunOnRequirement {
    pub min_server_version: Option<String>,
    pub max_server_version: Option<String>,
    pub topologies: Option<Vec<TopologyKind>>,
    pub serverless: Option<ServerlessRequirement>,
    pub server_parameters: Option<Document>,
    pub auth: Option<bool>,
    pub auth_mechanism: Option<String>,
    pub csfle: Option<CsfleRequirement>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
pub enum TopologyKind {
    #[serde(rename = "single")]
    Single,
    #[serde(rename = "replicaset")]
    ReplicaSet,
    #[serde(rename = "sharded")]
    Sharded,
    /// Legacy alias of `sharded` (older schema versions).
    #[serde(rename = "sharded-replicaset")]
    ShardedReplicaSet,
    #[serde(rename = "load-balanced")]
    LoadBalanced,
}

impl fmt::Display for TopologyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Single => "single",
            Self::ReplicaSet => "replicaset",
            Self::Sharded => "sharded",
            Self::ShardedReplicaSet => "sharded-replicaset",
            Self::LoadBalanced => "load-balanced",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerlessRequirement {
    Require,
    Forbid,
    Allow,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum CsfleRequirement {
    Flag(bool),
    Options(CsfleOptions),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CsfleOptions {
    pub min_libmongocrypt_version: Option<String>,
}

/// One item of `createEntities`: a single-key document naming the entity type.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum EntityDef {
    Client(ClientDef),
    Database(DatabaseDef),
    Collection(CollectionDef),
    Session(SessionDef),
    Bucket(BucketDef),
    Thread(ThreadDef),
    ClientEncryption(ClientEncryptionDef),
}

impl EntityDef {
    pub fn id(&self) -> &str {
        match self {
            Self::Client(d) => &d.id,
            Self::Database(d) => &d.id,
            Self::Collection(d) => &d.id,
            Self::Session(d) => &d.id,
            Self::Bucket(d) => &d.id,
            Self::Thread(d) => &d.id,
            Self::ClientEncryption(d) => &d.id,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientDef {
    pub id: String,
    pub uri_options: Option<Document>,
    pub use_multiple_mongoses: Option<bool>,
    pub observe_events: Option<Vec<String>>,
    pub ignore_command_monitoring_events: Option<Vec<String>>,
    pub observe_sensitive_commands: Option<bool>,
    pub store_events_as_entities: Option<Vec<StoreEventsAsEntity>>,
    pub server_api: Option<ServerApiDef>,
    pub observe_log_messages: Option<Document>,
    #[serde(rename = "awaitMinPoolSizeMS")]
    pub await_min_pool_size_ms: Option<u64>,
    pub auto_encrypt_opts: Option<Document>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StoreEventsAsEntity {
    pub id: String,
    pub events: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServerApiDef {
    pub version: String,
    pub strict: Option<bool>,
    pub deprecation_errors: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CollectionOrDatabaseOptions {
    pub read_concern: Option<Document>,
    pub read_preference: Option<Document>,
    pub write_concern: Option<Document>,
    #[serde(rename = "timeoutMS")]
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DatabaseDef {
    pub id: String,
    pub client: String,
    pub database_name: String,
    pub database_options: Option<CollectionOrDatabaseOptions>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CollectionDef {
    pub id: String,
    pub database: String,
    pub collection_name: String,
    pub collection_options: Option<CollectionOrDatabaseOptions>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionDef {
    pub id: String,
    pub client: String,
    pub session_options: Option<SessionOptionsDef>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionOptionsDef {
    pub causal_consistency: Option<bool>,
    pub snapshot: Option<bool>,
    /// The id of a saved entity holding the snapshot time (a timestamp).
    pub snapshot_time: Option<String>,
    pub default_transaction_options: Option<Document>,
    #[serde(rename = "defaultTimeoutMS")]
    pub default_timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BucketDef {
    pub id: String,
    pub database: String,
    pub bucket_options: Option<Document>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ThreadDef {
    pub id: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientEncryptionDef {
    pub id: String,
    pub client_encryption_opts: Document,
}

/// An `initialData` or `outcome` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CollectionData {
    pub collection_name: String,
    pub database_name: String,
    pub create_options: Option<Document>,
    pub documents: Vec<Document>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Test {
    pub description: String,
    pub run_on_requirements: Option<Vec<RunOnRequirement>>,
    pub skip_reason: Option<String>,
    pub operations: Vec<Operation>,
    pub expect_events: Option<Vec<ExpectedEventsForClient>>,
    pub expect_log_messages: Option<Vec<crate::logs::ExpectedLogMessagesForClient>>,
    pub outcome: Option<Vec<CollectionData>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Operation {
    pub name: String,
    pub object: String,
    pub arguments: Option<Document>,
    pub expect_error: Option<ExpectedError>,
    pub expect_result: Option<Bson>,
    pub save_result_as_entity: Option<String>,
    pub ignore_result_and_error: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExpectedError {
    pub is_error: Option<bool>,
    pub is_client_error: Option<bool>,
    pub is_timeout_error: Option<bool>,
    pub error_contains: Option<String>,
    pub error_code: Option<i32>,
    pub error_code_name: Option<String>,
    pub error_labels_contain: Option<Vec<String>>,
    pub error_labels_omit: Option<Vec<String>>,
    pub error_response: Option<Document>,
    pub write_errors: Option<Document>,
    pub write_concern_errors: Option<Vec<Document>>,
    pub expect_result: Option<Bson>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventType {
    #[default]
    Command,
    Cmap,
    Sdam,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExpectedEventsForClient {
    pub client: String,
    pub event_type: Option<EventType>,
    pub events: Vec<ExpectedEvent>,
    pub ignore_extra_events: Option<bool>,
}

/// An expected event: a single-key document naming the event type.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum ExpectedEvent {
    CommandStartedEvent(CommandStartedMatcher),
    CommandSucceededEvent(CommandSucceededMatcher),
    CommandFailedEvent(CommandFailedMatcher),
    PoolCreatedEvent(Empty),
    PoolReadyEvent(Empty),
    PoolClearedEvent(PoolClearedMatcher),
    PoolClosedEvent(Empty),
    ConnectionCreatedEvent(Empty),
    ConnectionReadyEvent(Empty),
    ConnectionClosedEvent(ReasonMatcher),
    ConnectionCheckOutStartedEvent(Empty),
    ConnectionCheckOutFailedEvent(ReasonMatcher),
    ConnectionCheckedOutEvent(Empty),
    ConnectionCheckedInEvent(Empty),
    ServerDescriptionChangedEvent(DescriptionChangedMatcher),
    TopologyDescriptionChangedEvent(DescriptionChangedMatcher),
    ServerHeartbeatStartedEvent(HeartbeatMatcher),
    ServerHeartbeatSucceededEvent(HeartbeatMatcher),
    ServerHeartbeatFailedEvent(HeartbeatMatcher),
    TopologyOpeningEvent(Empty),
    TopologyClosingEvent(Empty),
}

impl ExpectedEvent {
    /// The event's name as written in test files.
    pub fn name(&self) -> &'static str {
        match self {
            Self::CommandStartedEvent(_) => "commandStartedEvent",
            Self::CommandSucceededEvent(_) => "commandSucceededEvent",
            Self::CommandFailedEvent(_) => "commandFailedEvent",
            Self::PoolCreatedEvent(_) => "poolCreatedEvent",
            Self::PoolReadyEvent(_) => "poolReadyEvent",
            Self::PoolClearedEvent(_) => "poolClearedEvent",
            Self::PoolClosedEvent(_) => "poolClosedEvent",
            Self::ConnectionCreatedEvent(_) => "connectionCreatedEvent",
            Self::ConnectionReadyEvent(_) => "connectionReadyEvent",
            Self::ConnectionClosedEvent(_) => "connectionClosedEvent",
            Self::ConnectionCheckOutStartedEvent(_) => "connectionCheckOutStartedEvent",
            Self::ConnectionCheckOutFailedEvent(_) => "connectionCheckOutFailedEvent",
            Self::ConnectionCheckedOutEvent(_) => "connectionCheckedOutEvent",
            Self::ConnectionCheckedInEvent(_) => "connectionCheckedInEvent",
            Self::ServerDescriptionChangedEvent(_) => "serverDescriptionChangedEvent",
            Self::TopologyDescriptionChangedEvent(_) => "topologyDescriptionChangedEvent",
            Self::ServerHeartbeatStartedEvent(_) => "serverHeartbeatStartedEvent",
            Self::ServerHeartbeatSucceededEvent(_) => "serverHeartbeatSucceededEvent",
            Self::ServerHeartbeatFailedEvent(_) => "serverHeartbeatFailedEvent",
            Self::TopologyOpeningEvent(_) => "topologyOpeningEvent",
            Self::TopologyClosingEvent(_) => "topologyClosingEvent",
        }
    }
}

/// An event matcher without fields (`{}`); anything else in it is rejected.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandStartedMatcher {
    pub command: Option<Document>,
    pub command_name: Option<String>,
    pub database_name: Option<String>,
    pub has_service_id: Option<bool>,
    pub has_server_connection_id: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandSucceededMatcher {
    pub reply: Option<Document>,
    pub command_name: Option<String>,
    pub database_name: Option<String>,
    pub has_service_id: Option<bool>,
    pub has_server_connection_id: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandFailedMatcher {
    pub command_name: Option<String>,
    pub database_name: Option<String>,
    pub has_service_id: Option<bool>,
    pub has_server_connection_id: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolClearedMatcher {
    pub has_service_id: Option<bool>,
    pub interrupt_in_use_connections: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReasonMatcher {
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DescriptionChangedMatcher {
    pub previous_description: Option<DescriptionMatcher>,
    pub new_description: Option<DescriptionMatcher>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DescriptionMatcher {
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeartbeatMatcher {
    pub awaited: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minimal(extra_top: &str, test_body: &str) -> String {
        format!(
            r#"{{"description": "d", "schemaVersion": "1.0"{extra_top},
                "tests": [{{"description": "t", "operations": [{test_body}]}}]}}"#
        )
    }

    #[test]
    fn accepts_a_minimal_file() {
        let file = parse_file("x.json", &minimal("", "")).unwrap();
        assert_eq!(file.tests[0].description, "t");
    }

    #[test]
    fn rejects_unknown_top_level_field() {
        let err = parse_file("x.json", &minimal(r#", "bogus": 1"#, "")).unwrap_err();
        assert_eq!(err.file, "x.json");
        assert!(err.message.contains("bogus"), "{err}");
    }

    #[test]
    fn names_the_path_of_an_unknown_nested_field() {
        let op = r#"{"name": "find", "object": "c", "expectError": {"isErorr": true}}"#;
        let err = parse_file("x.json", &minimal("", op)).unwrap_err();
        assert_eq!(
            err.path.as_deref(),
            Some("tests[0].operations[0].expectError.isErorr")
        );
        assert!(err.message.contains("isErorr"), "{err}");
    }

    #[test]
    fn rejects_unknown_entity_fields_and_types() {
        let entities = r#", "createEntities": [{"client": {"id": "c", "observeEvent": []}}]"#;
        let err = parse_file("x.json", &minimal(entities, "")).unwrap_err();
        assert!(err.to_string().contains("createEntities[0]"), "{err}");
        let entities = r#", "createEntities": [{"widget": {"id": "c"}}]"#;
        assert!(parse_file("x.json", &minimal(entities, "")).is_err());
    }

    #[test]
    fn rejects_unknown_event_matcher_fields() {
        let events = r#"[{"client": "c", "events": [{"commandStartedEvent": {"cmd": {}}}]}]"#;
        let text = format!(
            r#"{{"description": "d", "schemaVersion": "1.0", "tests": [{{"description": "t",
                 "operations": [], "expectEvents": {events}}}]}}"#
        );
        let err = parse_file("x.json", &text).unwrap_err();
        assert!(err
            .path
            .unwrap()
            .starts_with("tests[0].expectEvents[0].events[0]"));
    }

    #[test]
    fn schema_version_bounds() {
        assert!(check_schema_version("1.0").is_ok());
        assert!(check_schema_version("1.26").is_ok());
        assert!(check_schema_version("1.5.1").is_ok());
        assert!(check_schema_version("1.27")
            .unwrap_err()
            .contains("not supported"));
        assert!(check_schema_version("2.0").is_err());
        assert!(check_schema_version("one").is_err());
        let text = r#"{"description": "d", "schemaVersion": "2.1", "tests": []}"#;
        let err = parse_file("x.json", text).unwrap_err();
        assert_eq!(err.path.as_deref(), Some("schemaVersion"));
    }

    #[test]
    fn reads_extended_json_numbers() {
        let data = r#", "initialData": [{"collectionName": "c", "databaseName": "d",
            "documents": [{"_id": {"$numberLong": "5"}, "x": 1.5}]}]"#;
        let file = parse_file("x.json", &minimal(data, "")).unwrap();
        let doc = &file.initial_data.unwrap()[0].documents[0];
        assert_eq!(doc.get("_id"), Some(&Bson::Int64(5)));
        assert_eq!(doc.get("x"), Some(&Bson::Double(1.5)));
    }

    #[test]
    fn bad_json_is_an_error_not_a_panic() {
        let err = parse_file("x.json", "{").unwrap_err();
        assert!(err.message.contains("invalid JSON"));
    }
}
