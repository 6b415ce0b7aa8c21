//! Log message capture for `observeLogMessages` and the check of `expectLogMessages`.
//!
//! The driver (built with `tracing-unstable`) logs through `tracing`: one event per message,
//! target `mongodb::<component>`, every field of the unified format's message as a tracing
//! field, and `topologyId` naming the client that logged it. A process-wide subscriber
//! ([`install`]) turns each event into a document and hands it to the collector registered
//! for that topology id; a client entity registers its collector when its `topologyOpening`
//! SDAM event tells the runner its id. Only components and levels some live collector asked for
//! are enabled, so clients that observe nothing pay nothing (the driver asks the subscriber
//! before it formats a message).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use bson::{Bson, Document};
use serde::Deserialize;
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span;
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

use crate::matching::{match_root_document, EntityLookup};

/// The unified format's log components and the driver's tracing targets for them.
const COMPONENTS: &[(&str, &str)] = &[
    ("command", "mongodb::command"),
    ("topology", "mongodb::topology"),
    ("serverSelection", "mongodb::server_selection"),
    ("connection", "mongodb::connection"),
];

fn component_of_target(target: &str) -> Option<&'static str> {
    COMPONENTS
        .iter()
        .find(|(_, t)| *t == target)
        .map(|(c, _)| *c)
}

/// A unified-format severity as the most verbose tracing level it admits; `None` for `off`.
fn level_filter(name: &str) -> Result<Option<Level>, String> {
    Ok(Some(match name {
        "off" => return Ok(None),
        "emergency" | "alert" | "critical" | "error" => Level::ERROR,
        "warning" | "warn" => Level::WARN,
        "notice" | "informational" | "info" => Level::INFO,
        "debug" => Level::DEBUG,
        "trace" => Level::TRACE,
        other => return Err(format!("unknown log level {other:?}")),
    }))
}

/// Whether a message at tracing level `actual` has the unified-format severity `expected`.
/// tracing has five levels; the format's syslog-like names map onto them as in `level_filter`.
fn level_is(expected: &str, actual: Level) -> bool {
    matches!(level_filter(expected), Ok(Some(l)) if l == actual)
}

/// One captured message.
#[derive(Debug, Clone)]
pub struct LogMessage {
    pub level: Level,
    pub component: &'static str,
    pub data: Document,
}

/// The messages one client entity logged, and the components and levels it observes.
#[derive(Debug)]
pub struct Collector {
    /// Per component, the most verbose level to keep.
    levels: HashMap<&'static str, Level>,
    messages: Mutex<Vec<LogMessage>>,
}

impl Collector {
    /// A collector for an `observeLogMessages` document (`{component: level}`).
    pub fn new(observe: &Document) -> Result<Arc<Collector>, String> {
        let mut levels = HashMap::new();
        for (component, level) in observe {
            let Some((known, _)) = COMPONENTS.iter().find(|(c, _)| c == component) else {
                return Err(format!(
                    "observeLogMessages: unknown component {component:?}"
                ));
            };
            let Bson::String(level) = level else {
                return Err(format!(
                    "observeLogMessages: the level of {component} must be a string, got {level}"
                ));
            };
            if let Some(level) = level_filter(level)? {
                levels.insert(*known, level);
            }
        }
        Ok(Arc::new(Collector {
            levels,
            messages: Mutex::new(Vec::new()),
        }))
    }

    fn wants(&self, component: &str, level: Level) -> bool {
        // tracing orders levels by verbosity: TRACE is the greatest.
        self.levels.get(component).is_some_and(|max| level <= *max)
    }

    pub fn messages(&self) -> Vec<LogMessage> {
        self.messages.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

/// Live collectors by the hex topology id of their client. Weak: a collector lives as long as
/// its client entity.
fn registry() -> &'static Mutex<HashMap<String, Weak<Collector>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Weak<Collector>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Routes the messages a client with topology id `topology_id` (hex) logs to `collector`.
pub fn register(topology_id: String, collector: &Arc<Collector>) {
    if let Ok(mut map) = registry().lock() {
        map.retain(|_, c| c.strong_count() > 0);
        map.insert(topology_id, Arc::downgrade(collector));
    }
}

/// Installs the capturing subscriber as the process's global default, once. Fails when another
/// global subscriber was installed first (messages could then not be captured).
pub fn install() -> Result<(), String> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            tracing::subscriber::set_global_default(Capture).map_err(|e| {
                format!(
                    "cannot capture log messages: another tracing subscriber is installed ({e})"
                )
            })
        })
        .clone()
}

/// The subscriber: keeps driver events some collector wants, drops everything else.
struct Capture;

impl Subscriber for Capture {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        // Events, and the hint callsites of the driver's `tracing::enabled!` checks.
        if !metadata.is_span() && component_of_target(metadata.target()).is_some() {
            // Whether it is wanted changes as clients come and go: ask `enabled` each time.
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::TRACE)
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        let Some(component) = component_of_target(metadata.target()) else {
            return false;
        };
        let level = *metadata.level();
        registry().lock().is_ok_and(|map| {
            map.values()
                .filter_map(Weak::upgrade)
                .any(|c| c.wants(component, level))
        })
    }

    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        // The driver logs events only; spans are neither recorded nor entered.
        span::Id::from_u64(1)
    }

    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}

    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}

    fn event(&self, event: &Event<'_>) {
        let metadata = event.metadata();
        let Some(component) = component_of_target(metadata.target()) else {
            return;
        };
        let mut fields = Fields::default();
        event.record(&mut fields);
        let Some(Bson::String(topology_id)) = fields.data.get("topologyId").cloned() else {
            return;
        };
        let collector = registry()
            .lock()
            .ok()
            .and_then(|map| map.get(&topology_id).and_then(Weak::upgrade));
        let Some(collector) = collector else {
            return;
        };
        if !collector.wants(component, *metadata.level()) {
            return;
        }
        let message = LogMessage {
            level: *metadata.level(),
            component,
            data: fields.data,
        };
        if let Ok(mut messages) = collector.messages.lock() {
            messages.push(message);
        };
    }

    fn enter(&self, _: &span::Id) {}

    fn exit(&self, _: &span::Id) {}
}

/// An event's fields as a document, with the types the format's `$$type` checks expect:
/// integers as int64, strings as strings, anything else by its `Debug` text.
#[derive(Default)]
struct Fields {
    data: Document,
}

impl Visit for Fields {
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.data.insert(field.name(), value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        let value = i64::try_from(value).map_or(Bson::Double(value as f64), Bson::Int64);
        self.data.insert(field.name(), value);
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        let value = i64::try_from(value).map_or(Bson::Double(value as f64), Bson::Int64);
        self.data.insert(field.name(), value);
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        let value = i64::try_from(value).map_or(Bson::Double(value as f64), Bson::Int64);
        self.data.insert(field.name(), value);
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.data.insert(field.name(), value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.data.insert(field.name(), value);
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.data.insert(field.name(), value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // The message itself arrives as `fmt::Arguments`, whose Debug is its text.
        self.data.insert(field.name(), format!("{value:?}"));
    }
}

/// `expectLogMessages[i]`: the messages one client must have logged.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExpectedLogMessagesForClient {
    pub client: String,
    pub messages: Vec<ExpectedLogMessage>,
    pub ignore_messages: Option<Vec<ExpectedLogMessage>>,
    pub ignore_extra_messages: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExpectedLogMessage {
    pub level: String,
    pub component: String,
    pub failure_is_redacted: Option<bool>,
    pub data: Document,
}

/// Whether the driver's failure text (`Kind: …, server response: …`) had the server's error
/// redacted: the driver replaces a redacted command error's message with `REDACTED` and its
/// server response with `{"redacted": true}`.
fn failure_redacted(failure: &str) -> bool {
    failure.contains("REDACTED") || failure.contains("\"redacted\":true")
}

/// Matches one message against an expectation; `Err` says where it differs.
fn match_message(
    expected: &ExpectedLogMessage,
    actual: &LogMessage,
    entities: &dyn EntityLookup,
) -> Result<(), String> {
    if expected.component != actual.component {
        return Err(format!(
            "component: expected {}, found {}",
            expected.component, actual.component
        ));
    }
    if !level_is(&expected.level, actual.level) {
        return Err(format!(
            "level: expected {}, found {}",
            expected.level, actual.level
        ));
    }
    match_root_document(&expected.data, &actual.data, entities).map_err(|m| m.to_string())?;
    if let Some(redacted) = expected.failure_is_redacted {
        let Some(Bson::String(failure)) = actual.data.get("failure") else {
            return Err("failureIsRedacted: the message has no failure".to_string());
        };
        if failure_redacted(failure) != redacted {
            return Err(format!(
                "the failure should{} be redacted: {failure}",
                if redacted { "" } else { " not" }
            ));
        }
    }
    Ok(())
}

/// Checks one client's captured messages against `expected`: messages matching one of
/// `ignoreMessages` are dropped, the rest must match `messages` one for one and in order (with
/// `ignoreExtraMessages`, further messages at the end are allowed).
pub fn check(
    expected: &ExpectedLogMessagesForClient,
    captured: &[LogMessage],
    entities: &dyn EntityLookup,
) -> Result<(), String> {
    let ignored = expected.ignore_messages.as_deref().unwrap_or_default();
    let actual: Vec<&LogMessage> = captured
        .iter()
        .filter(|m| {
            !ignored
                .iter()
                .any(|i| match_message(i, m, entities).is_ok())
        })
        .collect();
    let describe = |m: &LogMessage| format!("{} {} {}", m.component, m.level, m.data);
    for (i, want) in expected.messages.iter().enumerate() {
        let Some(got) = actual.get(i) else {
            return Err(format!(
                "client {}: expected {} messages, captured {}: {:?}",
                expected.client,
                expected.messages.len(),
                actual.len(),
                actual.iter().map(|m| describe(m)).collect::<Vec<_>>()
            ));
        };
        match_message(want, got, entities).map_err(|e| {
            format!(
                "client {}: message {i}: {e}; the message was {}",
                expected.client,
                describe(got)
            )
        })?;
    }
    if actual.len() > expected.messages.len() && expected.ignore_extra_messages != Some(true) {
        return Err(format!(
            "client {}: {} unexpected extra messages, the first: {}",
            expected.client,
            actual.len() - expected.messages.len(),
            describe(actual[expected.messages.len()])
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matching::NoEntities;
    use bson::doc;

    fn message(data: Document) -> LogMessage {
        LogMessage {
            level: Level::DEBUG,
            component: "command",
            data,
        }
    }

    fn expectation(data: Document) -> ExpectedLogMessage {
        ExpectedLogMessage {
            level: "debug".into(),
            component: "command".into(),
            failure_is_redacted: None,
            data,
        }
    }

    #[test]
    fn messages_match_in_order_and_extra_ones_fail_unless_allowed() {
        let captured = [
            message(doc! { "message": "Command started", "commandName": "ping" }),
            message(doc! { "message": "Command succeeded", "commandName": "ping" }),
        ];
        let mut want = ExpectedLogMessagesForClient {
            client: "c".into(),
            messages: vec![expectation(doc! { "message": "Command started" })],
            ignore_messages: None,
            ignore_extra_messages: None,
        };
        assert!(check(&want, &captured, &NoEntities).is_err());
        want.ignore_extra_messages = Some(true);
        assert!(check(&want, &captured, &NoEntities).is_ok());
        want.ignore_extra_messages = None;
        want.ignore_messages = Some(vec![expectation(doc! { "message": "Command succeeded" })]);
        assert!(check(&want, &captured, &NoEntities).is_ok());
        want.messages = vec![expectation(doc! { "message": "Command succeeded" })];
        assert!(check(&want, &captured, &NoEntities).is_err());
    }

    #[test]
    fn level_component_and_redaction_are_checked() {
        let captured = [message(
            doc! { "message": "Command failed", "failure": "Error code 18: REDACTED" },
        )];
        let mut want = ExpectedLogMessagesForClient {
            client: "c".into(),
            messages: vec![expectation(doc! { "message": "Command failed" })],
            ignore_messages: None,
            ignore_extra_messages: None,
        };
        want.messages[0].failure_is_redacted = Some(true);
        assert!(check(&want, &captured, &NoEntities).is_ok());
        want.messages[0].failure_is_redacted = Some(false);
        assert!(check(&want, &captured, &NoEntities).is_err());
        want.messages[0].failure_is_redacted = None;
        want.messages[0].level = "info".into();
        assert!(check(&want, &captured, &NoEntities).is_err());
        want.messages[0].level = "debug".into();
        want.messages[0].component = "connection".into();
        assert!(check(&want, &captured, &NoEntities).is_err());
    }

    #[test]
    fn collectors_keep_only_their_components_and_levels() {
        let c = Collector::new(&doc! { "command": "debug", "topology": "off" }).unwrap();
        assert!(c.wants("command", Level::DEBUG));
        assert!(c.wants("command", Level::ERROR));
        assert!(!c.wants("command", Level::TRACE));
        assert!(!c.wants("topology", Level::ERROR));
        assert!(Collector::new(&doc! { "nonsense": "debug" }).is_err());
        assert!(Collector::new(&doc! { "command": "loud" }).is_err());
    }
}
