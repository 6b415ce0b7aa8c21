//! The entity map: clients (with their event logs), databases, collections, sessions, cursors,
//! change streams and saved BSON values, by name.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use tokio::sync::Mutex as AsyncMutex;

use crate::matching::EntityLookup;
use crate::mongodb::change_stream::ChangeStream;
use crate::mongodb::event::cmap::{CmapEvent, ConnectionClosedReason};
use crate::mongodb::event::command::CommandEvent;
use crate::mongodb::event::sdam::SdamEvent;
use crate::mongodb::event::EventHandler;
use crate::mongodb::options::{ClientOptions, ServerApi, ServerApiVersion};
use crate::mongodb::{Client, ClientSession, Collection, Cursor, Database};
use crate::schema::{ClientDef, EventType};
use crate::skips;

/// Commands whose events are hidden unless `observeSensitiveCommands` is set.
const SENSITIVE_COMMANDS: &[&str] = &[
    "authenticate",
    "saslStart",
    "saslContinue",
    "getnonce",
    "createUser",
    "updateUser",
    "copydbgetnonce",
    "copydbsaslstart",
    "copydb",
];

/// An event as the runner records it, independent of the driver's event types.
#[derive(Debug, Clone)]
pub struct Observed {
    /// The unified-format name, e.g. `commandStartedEvent`.
    pub name: &'static str,
    pub kind: EventType,
    pub command_name: Option<String>,
    pub database_name: Option<String>,
    pub command: Option<Document>,
    pub reply: Option<Document>,
    pub has_service_id: bool,
    pub has_server_connection_id: bool,
    pub interrupt_in_use_connections: Option<bool>,
    pub reason: Option<String>,
    pub previous_type: Option<String>,
    pub new_type: Option<String>,
    pub awaited: Option<bool>,
    /// Commands on the sensitive list, or hellos the driver redacted (speculative auth).
    pub sensitive: bool,
    /// With `connection`, pairs a started event with its succeeded/failed event.
    pub request_id: Option<i32>,
    /// The connection a command event went over: its server's address and the driver's id for
    /// it. Request ids come from one process-wide counter that wraps; with the connection they
    /// name one command, which is how command monitoring pairs events.
    pub connection: Option<(String, u32)>,
}

impl Observed {
    pub fn new(name: &'static str, kind: EventType) -> Self {
        Observed {
            name,
            kind,
            command_name: None,
            database_name: None,
            command: None,
            reply: None,
            has_service_id: false,
            has_server_connection_id: false,
            interrupt_in_use_connections: None,
            reason: None,
            previous_type: None,
            new_type: None,
            awaited: None,
            sensitive: false,
            request_id: None,
            connection: None,
        }
    }

    /// Whether `self` (a succeeded or failed event) finishes the command `started` began.
    fn finishes(&self, started: &Observed) -> bool {
        started.name == "commandStartedEvent"
            && self.request_id.is_some()
            && self.request_id == started.request_id
            && self.connection == started.connection
    }
}

fn type_name<T: serde::Serialize>(value: &T) -> Option<String> {
    match bson::to_bson(value) {
        Ok(Bson::String(s)) => Some(s),
        _ => None,
    }
}

fn is_hello(name: &str) -> bool {
    name.eq_ignore_ascii_case("hello") || name.eq_ignore_ascii_case("isMaster")
}

/// Sensitive: on the list, or a hello whose body the driver redacted (it does so for hellos
/// carrying `speculativeAuthenticate`).
fn sensitive(name: &str, body: &Document) -> bool {
    SENSITIVE_COMMANDS
        .iter()
        .any(|s| s.eq_ignore_ascii_case(name))
        || (is_hello(name) && body.is_empty())
}

fn from_command(event: CommandEvent) -> Observed {
    match event {
        CommandEvent::Started(e) => {
            let mut o = Observed::new("commandStartedEvent", EventType::Command);
            o.sensitive = sensitive(&e.command_name, &e.command);
            o.request_id = Some(e.request_id);
            o.connection = Some((e.connection.address.to_string(), e.connection.id));
            o.command_name = Some(e.command_name);
            o.database_name = Some(e.db);
            o.command = Some(e.command);
            o.has_service_id = e.service_id.is_some();
            o.has_server_connection_id = e.connection.server_id.is_some();
            o
        }
        // The driver's succeeded and failed events carry no database name; `EventLog::push`
        // copies it, and the sensitivity, from the started event they finish.
        CommandEvent::Succeeded(e) => {
            let mut o = Observed::new("commandSucceededEvent", EventType::Command);
            o.sensitive = sensitive(&e.command_name, &e.reply);
            o.request_id = Some(e.request_id);
            o.connection = Some((e.connection.address.to_string(), e.connection.id));
            o.command_name = Some(e.command_name);
            o.reply = Some(e.reply);
            o.has_service_id = e.service_id.is_some();
            o.has_server_connection_id = e.connection.server_id.is_some();
            o
        }
        CommandEvent::Failed(e) => {
            let mut o = Observed::new("commandFailedEvent", EventType::Command);
            o.sensitive = sensitive(&e.command_name, &doc! {"redacted": false});
            o.request_id = Some(e.request_id);
            o.connection = Some((e.connection.address.to_string(), e.connection.id));
            o.command_name = Some(e.command_name);
            o.has_service_id = e.service_id.is_some();
            o.has_server_connection_id = e.connection.server_id.is_some();
            o
        }
        _ => Observed::new("unknownCommandEvent", EventType::Command),
    }
}

fn from_cmap(event: CmapEvent) -> Observed {
    let c = |name| Observed::new(name, EventType::Cmap);
    match event {
        CmapEvent::PoolCreated(_) => c("poolCreatedEvent"),
        CmapEvent::PoolReady(_) => c("poolReadyEvent"),
        CmapEvent::PoolCleared(e) => {
            let mut o = c("poolClearedEvent");
            o.has_service_id = e.service_id.is_some();
            o.interrupt_in_use_connections = Some(e.interrupt_in_use_connections);
            o
        }
        CmapEvent::PoolClosed(_) => c("poolClosedEvent"),
        CmapEvent::ConnectionCreated(_) => c("connectionCreatedEvent"),
        CmapEvent::ConnectionReady(_) => c("connectionReadyEvent"),
        CmapEvent::ConnectionClosed(e) => {
            let mut o = c("connectionClosedEvent");
            o.reason = Some(
                match e.reason {
                    ConnectionClosedReason::Stale => "stale",
                    ConnectionClosedReason::Idle => "idle",
                    ConnectionClosedReason::Error => "error",
                    ConnectionClosedReason::Dropped => "dropped",
                    ConnectionClosedReason::PoolClosed => "poolClosed",
                    _ => "unknown",
                }
                .to_string(),
            );
            o
        }
        CmapEvent::ConnectionCheckoutStarted(_) => c("connectionCheckOutStartedEvent"),
        CmapEvent::ConnectionCheckoutFailed(e) => {
            let mut o = c("connectionCheckOutFailedEvent");
            o.reason = type_name(&e.reason);
            o
        }
        CmapEvent::ConnectionCheckedOut(_) => c("connectionCheckedOutEvent"),
        CmapEvent::ConnectionCheckedIn(_) => c("connectionCheckedInEvent"),
        _ => c("unknownCmapEvent"),
    }
}

fn from_sdam(event: SdamEvent) -> Observed {
    let s = |name| Observed::new(name, EventType::Sdam);
    match event {
        SdamEvent::ServerDescriptionChanged(e) => {
            let mut o = s("serverDescriptionChangedEvent");
            o.previous_type = type_name(&e.previous_description.server_type());
            o.new_type = type_name(&e.new_description.server_type());
            o
        }
        SdamEvent::TopologyDescriptionChanged(e) => {
            let mut o = s("topologyDescriptionChangedEvent");
            o.previous_type = type_name(&e.previous_description.topology_type());
            o.new_type = type_name(&e.new_description.topology_type());
            o
        }
        SdamEvent::ServerHeartbeatStarted(e) => {
            let mut o = s("serverHeartbeatStartedEvent");
            o.awaited = Some(e.awaited);
            o
        }
        SdamEvent::ServerHeartbeatSucceeded(e) => {
            let mut o = s("serverHeartbeatSucceededEvent");
            o.awaited = Some(e.awaited);
            o
        }
        SdamEvent::ServerHeartbeatFailed(e) => {
            let mut o = s("serverHeartbeatFailedEvent");
            o.awaited = Some(e.awaited);
            o
        }
        SdamEvent::TopologyOpening(_) => s("topologyOpeningEvent"),
        SdamEvent::TopologyClosed(_) => s("topologyClosingEvent"),
        SdamEvent::ServerOpening(_) => s("serverOpeningEvent"),
        SdamEvent::ServerClosed(_) => s("serverClosedEvent"),
        _ => s("unknownSdamEvent"),
    }
}

/// Every event a client emitted, in order; the filters apply when the log is read.
#[derive(Clone, Default)]
pub struct EventLog {
    events: Arc<Mutex<Vec<Observed>>>,
}

impl EventLog {
    /// Records an event. A succeeded or failed command event takes the database name from its
    /// started event, which precedes it in the log: the driver emits command events in order from
    /// the task running the command. It also takes the started event's sensitivity, since a
    /// failed event has no body to judge by and a redacted command's reply is redacted too.
    pub(crate) fn push(&self, mut event: Observed) {
        let Ok(mut events) = self.events.lock() else {
            return;
        };
        if matches!(event.name, "commandSucceededEvent" | "commandFailedEvent") {
            if let Some(started) = events.iter().rev().find(|s| event.finishes(s)) {
                event.database_name = started.database_name.clone();
                event.sensitive |= started.sensitive;
            }
        }
        events.push(event);
    }

    pub fn snapshot(&self) -> Vec<Observed> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }

    pub fn clear(&self) {
        if let Ok(mut events) = self.events.lock() {
            events.clear();
        }
    }
}

/// A client entity and what the test asked it to observe.
#[derive(Clone)]
pub struct ClientEntity {
    pub client: Client,
    pub log: EventLog,
    pub observe: Vec<String>,
    pub ignore_commands: Vec<String>,
    pub observe_sensitive: bool,
    /// The log messages of a client with `observeLogMessages`.
    pub logs: Option<Arc<crate::logs::Collector>>,
}

impl ClientEntity {
    /// The recorded events the test observes, in order.
    pub fn observed(&self) -> Vec<Observed> {
        self.log
            .snapshot()
            .into_iter()
            .filter(|e| self.observe.iter().any(|o| o == e.name))
            .filter(|e| {
                e.command_name.as_ref().is_none_or(|name| {
                    name != "configureFailPoint"
                        && !self
                            .ignore_commands
                            .iter()
                            .any(|i| i.eq_ignore_ascii_case(name))
                        && (self.observe_sensitive || !e.sensitive)
                })
            })
            .collect()
    }

    /// Connections checked out and not yet checked in, from the CMAP events.
    pub fn connections_checked_out(&self) -> i64 {
        self.log.snapshot().iter().fold(0, |n, e| match e.name {
            "connectionCheckedOutEvent" => n + 1,
            "connectionCheckedInEvent" => n - 1,
            _ => n,
        })
    }
}

/// A session entity. The lsid is kept so that `$$sessionLsid` works after `endSession`.
#[derive(Clone)]
pub struct SessionEntity {
    pub session: Arc<AsyncMutex<Option<ClientSession>>>,
    pub lsid: Document,
    pub client: String,
}

/// A test-runner thread: the task running its latest operation (each waits for the one before).
pub type ThreadEntity = Arc<Mutex<Option<tokio::task::JoinHandle<Result<(), String>>>>>;

/// Anything the entity map can hold.
#[derive(Clone)]
pub enum Entity {
    Client(ClientEntity),
    Database(Database),
    Collection(Collection<Document>),
    Session(SessionEntity),
    Bson(Bson),
    Cursor(Arc<AsyncMutex<Cursor<Document>>>),
    ChangeStream(Arc<AsyncMutex<ChangeStream<Document>>>),
    Thread(ThreadEntity),
    Bucket(crate::mongodb::gridfs::GridFsBucket),
}

impl Entity {
    /// What kind of entity this is, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Entity::Client(_) => "client",
            Entity::Database(_) => "database",
            Entity::Collection(_) => "collection",
            Entity::Session(_) => "session",
            Entity::Bson(_) => "BSON value",
            Entity::Cursor(_) => "cursor",
            Entity::ChangeStream(_) => "change stream",
            Entity::Bucket(_) => "bucket",
            Entity::Thread(_) => "thread",
        }
    }
}

/// Entities by name. Names are unique; a lookup of the wrong type is an error.
#[derive(Default, Clone)]
pub struct EntityMap {
    entities: HashMap<String, Entity>,
}

macro_rules! getter {
    ($name:ident, $variant:ident, $ty:ty) => {
        pub fn $name(&self, id: &str) -> Result<$ty, String> {
            match self.entities.get(id) {
                Some(Entity::$variant(e)) => Ok(e.clone()),
                Some(other) => Err(format!(
                    "entity {id:?} is a {}, not a {}",
                    other.kind(),
                    stringify!($variant)
                )),
                None => Err(format!("no entity named {id:?}")),
            }
        }
    };
}

impl EntityMap {
    pub fn insert(&mut self, id: &str, entity: Entity) -> Result<(), String> {
        if self.entities.contains_key(id) {
            return Err(format!("an entity named {id:?} already exists"));
        }
        self.entities.insert(id.to_string(), entity);
        Ok(())
    }

    pub fn remove(&mut self, id: &str) -> Option<Entity> {
        self.entities.remove(id)
    }

    pub fn get(&self, id: &str) -> Option<&Entity> {
        self.entities.get(id)
    }

    getter!(client, Client, ClientEntity);
    getter!(database, Database, Database);
    getter!(collection, Collection, Collection<Document>);
    getter!(session, Session, SessionEntity);
    getter!(thread, Thread, ThreadEntity);
    getter!(cursor, Cursor, Arc<AsyncMutex<Cursor<Document>>>);
    getter!(
        change_stream,
        ChangeStream,
        Arc<AsyncMutex<ChangeStream<Document>>>
    );

    pub fn clients(&self) -> Vec<ClientEntity> {
        self.entities
            .values()
            .filter_map(|e| match e {
                Entity::Client(c) => Some(c.clone()),
                _ => None,
            })
            .collect()
    }

    /// Every thread entity, with its name.
    pub fn threads(&self) -> Vec<(String, ThreadEntity)> {
        self.entities
            .iter()
            .filter_map(|(id, e)| match e {
                Entity::Thread(t) => Some((id.clone(), t.clone())),
                _ => None,
            })
            .collect()
    }

    pub fn sessions(&self) -> Vec<SessionEntity> {
        self.entities
            .values()
            .filter_map(|e| match e {
                Entity::Session(s) => Some(s.clone()),
                _ => None,
            })
            .collect()
    }

    /// Drops every entity (ending sessions and closing cursors as they are dropped).
    pub fn clear(&mut self) {
        self.entities.clear();
    }
}

impl EntityLookup for EntityMap {
    fn bson_entity(&self, id: &str) -> Option<Bson> {
        match self.entities.get(id) {
            Some(Entity::Bson(b)) => Some(b.clone()),
            _ => None,
        }
    }

    fn session_lsid(&self, id: &str) -> Option<Document> {
        match self.entities.get(id) {
            Some(Entity::Session(s)) => Some(s.lsid.clone()),
            _ => None,
        }
    }
}

fn uri_value(value: &Bson) -> Result<String, String> {
    Ok(match value {
        Bson::String(s) => s.clone(),
        Bson::Boolean(b) => b.to_string(),
        Bson::Int32(i) => i.to_string(),
        Bson::Int64(i) => i.to_string(),
        Bson::Double(d) if d.fract() == 0.0 => format!("{}", *d as i64),
        Bson::Double(d) => d.to_string(),
        other => return Err(format!("cannot put {other} into a URI")),
    })
}

/// Adds `uriOptions` to a connection string's query.
pub fn uri_with_options(uri: &str, options: Option<&Document>) -> Result<String, String> {
    let Some(options) = options.filter(|o| !o.is_empty()) else {
        return Ok(uri.to_string());
    };
    let mut params = Vec::new();
    for (key, value) in options {
        if let Some(reason) = skips::client_uri_option(key) {
            return Err(format!("uriOptions.{key}: {reason}"));
        }
        params.push(format!("{key}={}", uri_value(value)?));
    }
    let (base, query) = match uri.split_once('?') {
        Some((base, query)) => (base.to_string(), Some(query)),
        None => (uri.to_string(), None),
    };
    // A path is needed before the query: mongodb://host/?opts.
    let after_scheme = base.split_once("://").map_or("", |(_, rest)| rest);
    let base = if after_scheme.contains('/') {
        base
    } else {
        format!("{base}/")
    };
    let mut all: Vec<String> = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    all.extend(params);
    Ok(format!("{base}?{}", all.join("&")))
}

/// Builds a client entity against `uri`. `single_host` keeps only the first host (the
/// `useMultipleMongoses: false` rule for sharded targets).
pub async fn create_client(
    def: &ClientDef,
    uri: &str,
    single_host: bool,
) -> Result<ClientEntity, String> {
    let uri = uri_with_options(uri, def.uri_options.as_ref())?;
    let mut options = ClientOptions::parse(&uri)
        .await
        .map_err(|e| format!("client {}: cannot parse {uri}: {e}", def.id))?;
    if single_host && def.use_multiple_mongoses != Some(true) {
        options.hosts.truncate(1);
    }
    if let Some(api) = &def.server_api {
        let version = match api.version.as_str() {
            "1" => ServerApiVersion::V1,
            other => {
                return Err(format!(
                    "client {}: unknown serverApi version {other}",
                    def.id
                ))
            }
        };
        let mut server_api = ServerApi::builder().version(version).build();
        server_api.strict = api.strict;
        server_api.deprecation_errors = api.deprecation_errors;
        options.server_api = Some(server_api);
    }
    let log = EventLog::default();
    let l = log.clone();
    options.command_event_handler = Some(EventHandler::callback(move |e| l.push(from_command(e))));
    let l = log.clone();
    options.cmap_event_handler = Some(EventHandler::callback(move |e| l.push(from_cmap(e))));
    let logs = match &def.observe_log_messages {
        Some(observe) => {
            crate::logs::install()?;
            Some(
                crate::logs::Collector::new(observe)
                    .map_err(|e| format!("client {}: {e}", def.id))?,
            )
        }
        None => None,
    };
    let l = log.clone();
    let collector = logs.clone();
    options.sdam_event_handler = Some(EventHandler::callback(move |e| {
        // The driver tags each log message with the client's topology id, which only this
        // event tells.
        if let (SdamEvent::TopologyOpening(opening), Some(collector)) = (&e, &collector) {
            crate::logs::register(opening.topology_id.to_hex(), collector);
        }
        l.push(from_sdam(e))
    }));
    let min_pool = options.min_pool_size.unwrap_or(0);
    let client = Client::with_options(options)
        .map_err(|e| format!("client {}: cannot create: {e}", def.id))?;
    let entity = ClientEntity {
        client,
        log,
        observe: def.observe_events.clone().unwrap_or_default(),
        ignore_commands: def
            .ignore_command_monitoring_events
            .clone()
            .unwrap_or_default(),
        observe_sensitive: def.observe_sensitive_commands.unwrap_or(false),
        logs,
    };
    if let Some(ms) = def.await_min_pool_size_ms {
        let deadline = Instant::now() + Duration::from_millis(ms);
        loop {
            let ready = entity
                .log
                .snapshot()
                .iter()
                .filter(|e| e.name == "connectionReadyEvent")
                .count();
            if ready >= min_pool as usize {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "client {}: the pool did not reach minPoolSize {min_pool} in {ms} ms",
                    def.id
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    Ok(entity)
}

#[cfg(test)]
mod tests {
    use bson::doc;

    use super::*;

    #[test]
    fn uri_options_are_appended() {
        let opts = doc! {"retryWrites": false, "appname": "x", "heartbeatFrequencyMS": 500};
        assert_eq!(
            uri_with_options("mongodb://h:1", Some(&opts)).unwrap(),
            "mongodb://h:1/?retryWrites=false&appname=x&heartbeatFrequencyMS=500"
        );
        assert_eq!(
            uri_with_options("mongodb://h:1/?replicaSet=rs", Some(&doc! {"w": 1})).unwrap(),
            "mongodb://h:1/?replicaSet=rs&w=1"
        );
        let err = uri_with_options("mongodb://h", Some(&doc! {"socketTimeoutMS": 1})).unwrap_err();
        assert!(err.contains("socketTimeoutMS"));
    }

    fn command_event(name: &'static str, request_id: i32, address: &str) -> Observed {
        let mut event = Observed::new(name, EventType::Command);
        event.command_name = Some("find".to_owned());
        event.request_id = Some(request_id);
        event.connection = Some((address.to_owned(), 1));
        event
    }

    #[test]
    fn finished_events_take_database_name_from_their_started_event() {
        let log = EventLog::default();
        let mut started = command_event("commandStartedEvent", 7, "a:27017");
        started.database_name = Some("db".to_owned());
        started.sensitive = true;
        log.push(started);
        // Same request id on another connection: not the started event's command.
        log.push(command_event("commandFailedEvent", 7, "b:27017"));
        log.push(command_event("commandSucceededEvent", 7, "a:27017"));
        log.push(command_event("commandFailedEvent", 8, "a:27017"));

        let events = log.snapshot();
        let names: Vec<_> = events
            .iter()
            .map(|e| (e.database_name.as_deref(), e.sensitive))
            .collect();
        assert_eq!(
            names,
            [
                (Some("db"), true),
                (None, false),
                (Some("db"), true),
                (None, false)
            ]
        );
    }

    #[test]
    fn duplicate_and_mistyped_entities_are_errors() {
        let mut map = EntityMap::default();
        map.insert("a", Entity::Bson(Bson::Int32(1))).unwrap();
        assert!(map.insert("a", Entity::Bson(Bson::Int32(2))).is_err());
        assert!(map.session("a").err().unwrap().contains("BSON value"));
        assert!(map.client("b").err().unwrap().contains("no entity"));
    }
}
