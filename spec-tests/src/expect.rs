//! Checking what happened against what a test expects: an operation's result or error, the
//! events each client saw, and (in the runner) the collections' final contents.

use std::collections::BTreeMap;

use bson::{doc, Bson, Document};

use crate::entities::{Entity, EntityMap, Observed};
use crate::matching::{
    match_root, match_root_document, match_root_documents, match_root_optional, EntityLookup,
};
use crate::mongodb::error::{Error as DriverError, ErrorKind, WriteFailure};
use crate::outcome::{summary_bulk_result, verbose_bulk_result, DriverResult, Produced};
use crate::schema::{self, EventType, ExpectedError, ExpectedEvent};

/// The error and the errors it wraps, outermost first.
fn chain(error: &DriverError) -> Vec<&DriverError> {
    let mut out = vec![error];
    let mut current: &dyn std::error::Error = error;
    while let Some(next) = current.source() {
        if let Some(e) = next.downcast_ref::<DriverError>() {
            out.push(e);
        }
        current = next;
    }
    out
}

fn server_side(error: &DriverError) -> bool {
    chain(error).iter().any(|e| match e.kind.as_ref() {
        ErrorKind::Command(_) | ErrorKind::Write(_) | ErrorKind::InsertMany(_) => true,
        ErrorKind::BulkWrite(b) => !b.write_errors.is_empty() || !b.write_concern_errors.is_empty(),
        _ => false,
    })
}

/// The server codes and code names an error carries, for `errorCode` and `errorCodeName`: those
/// of the outermost error in the chain that has any. A collection-level write (insertMany)
/// aggregates several server errors, and the format says a match on any of them satisfies the
/// assertion. A client bulk write error contributes none of its write errors or write concern
/// errors (the format: runners "MUST NOT inspect" them for these fields); only its top-level
/// error counts, which the driver stores as the error's source, next in the chain.
fn codes(error: &DriverError) -> Vec<(i32, String)> {
    for e in chain(error) {
        let found: Vec<(i32, String)> = match e.kind.as_ref() {
            ErrorKind::Command(c) => vec![(c.code, c.code_name.clone())],
            ErrorKind::Write(WriteFailure::WriteConcernError(w)) => {
                vec![(w.code, w.code_name.clone())]
            }
            ErrorKind::Write(WriteFailure::WriteError(w)) => {
                vec![(w.code, w.code_name.clone().unwrap_or_default())]
            }
            ErrorKind::InsertMany(i) => i
                .write_errors
                .iter()
                .flatten()
                .map(|w| (w.code, w.code_name.clone().unwrap_or_default()))
                .chain(
                    i.write_concern_error
                        .iter()
                        .map(|w| (w.code, w.code_name.clone())),
                )
                .collect(),
            _ => Vec::new(),
        };
        if !found.is_empty() {
            return found;
        }
    }
    Vec::new()
}

/// Whether an error is a timeout, for `isTimeoutError`: the format means the error an operation
/// ends with when its `timeoutMS` deadline passes, which the driver reports as
/// `ErrorKind::Timeout` and nothing else (an I/O timeout under `connectTimeoutMS` is a network
/// error, not this). Looked for along the source chain, since a wrapping error (a client bulk
/// write's) keeps its cause as the source.
fn is_timeout(error: &DriverError) -> bool {
    chain(error)
        .iter()
        .any(|e| crate::timeouts::is_timeout(e.kind.as_ref()))
}

/// The error's messages, for `errorContains` (a match in any one satisfies it): what the server
/// or the driver said, without the labels, wrapped source and server response the driver's
/// `Display` adds. A server error's message is its `errmsg`; an insertMany error's, each of its
/// write errors' and its write concern error's (the format: "examine the aggregated errors");
/// a client bulk write error's, only its top-level error's, which the driver keeps as the
/// source (its write errors are for `writeErrors` alone); any other kind's, the kind's text.
pub fn error_messages(error: &DriverError) -> Vec<String> {
    match error.kind.as_ref() {
        ErrorKind::Command(c) => vec![c.message.clone()],
        ErrorKind::Write(WriteFailure::WriteError(w)) => vec![w.message.clone()],
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => vec![w.message.clone()],
        ErrorKind::InsertMany(i) => i
            .write_errors
            .iter()
            .flatten()
            .map(|w| w.message.clone())
            .chain(i.write_concern_error.iter().map(|w| w.message.clone()))
            .collect(),
        ErrorKind::BulkWrite(_) => {
            let source =
                std::error::Error::source(error).and_then(|s| s.downcast_ref::<DriverError>());
            source.map(error_messages).unwrap_or_default()
        }
        other => vec![other.to_string()],
    }
}

/// Checks `expectError.writeErrors` (index → expected write error) against the write errors a
/// client bulk write reported, by index: each expected one must be there and match as a
/// root-level document, and there must be no others.
pub fn check_write_errors(
    expected: &Document,
    actual: &BTreeMap<usize, Document>,
    entities: &dyn EntityLookup,
) -> Result<(), String> {
    // The format: "MUST assert that the error does not contain any additional writeErrors".
    let extra: Vec<usize> = actual
        .keys()
        .copied()
        .filter(|i| !expected.contains_key(i.to_string()))
        .collect();
    if !extra.is_empty() {
        return Err(format!(
            "unexpected write errors at indexes {extra:?} (expected only {:?})",
            expected.keys().collect::<Vec<_>>()
        ));
    }
    for (index, want) in expected {
        let have = index
            .parse::<usize>()
            .ok()
            .and_then(|i| actual.get(&i))
            .ok_or_else(|| format!("no write error at index {index}"))?;
        match_root(want, &Bson::Document(have.clone()), entities)
            .map_err(|m| format!("writeErrors.{index} {m}"))?;
    }
    Ok(())
}

/// Checks an error against `expectError`.
pub fn check_error(
    expected: &ExpectedError,
    error: &DriverError,
    entities: &EntityMap,
) -> Result<(), String> {
    let shown = || format!("(the error was: {error})");
    if let Some(client) = expected.is_client_error {
        if client == server_side(error) {
            return Err(format!(
                "expected {} error {}",
                if client {
                    "a client-side"
                } else {
                    "a server-side"
                },
                shown()
            ));
        }
    }
    if let Some(timeout) = expected.is_timeout_error {
        if timeout != is_timeout(error) {
            return Err(format!("expected isTimeoutError={timeout} {}", shown()));
        }
    }
    if let Some(text) = &expected.error_contains {
        let messages = error_messages(error);
        let wanted = text.to_lowercase();
        if !messages.iter().any(|m| m.to_lowercase().contains(&wanted)) {
            return Err(format!(
                "expected the error message to contain {text:?}, the messages were {messages:?} \
                 {}",
                shown()
            ));
        }
    }
    let codes = codes(error);
    if let Some(code) = expected.error_code {
        if !codes.iter().any(|(c, _)| *c == code) {
            return Err(format!(
                "expected error code {code}, the codes were {codes:?} {}",
                shown()
            ));
        }
    }
    if let Some(name) = &expected.error_code_name {
        // Case-insensitive, as the format says.
        if !codes.iter().any(|(_, n)| n.eq_ignore_ascii_case(name)) {
            return Err(format!(
                "expected code name {name}, the codes were {codes:?} {}",
                shown()
            ));
        }
    }
    let labels: Vec<String> = chain(error)
        .iter()
        .flat_map(|e| e.labels().iter().cloned())
        .collect();
    for label in expected.error_labels_contain.iter().flatten() {
        if !labels.contains(label) {
            return Err(format!(
                "expected label {label}, labels are {labels:?} {}",
                shown()
            ));
        }
    }
    for label in expected.error_labels_omit.iter().flatten() {
        if labels.contains(label) {
            return Err(format!(
                "expected no label {label}, labels are {labels:?} {}",
                shown()
            ));
        }
    }
    if let Some(response) = &expected.error_response {
        let raw = chain(error)
            .iter()
            .find_map(|e| e.server_response().cloned())
            .ok_or_else(|| format!("expected a server response in the error {}", shown()))?;
        let actual = Document::try_from(raw.as_ref())
            .map_err(|e| format!("cannot read the error's server response: {e}"))?;
        match_root_document(response, &actual, entities)
            .map_err(|m| format!("errorResponse {m}"))?;
    }
    let bulk = chain(error).iter().find_map(|e| match e.kind.as_ref() {
        ErrorKind::BulkWrite(b) => Some(b.clone()),
        _ => None,
    });
    if let Some(partial) = &expected.expect_result {
        let actual = match bulk.as_ref().and_then(|b| b.partial_result.as_ref()) {
            Some(crate::mongodb::error::PartialBulkWriteResult::Summary(s)) => {
                Some(summary_bulk_result(s))
            }
            Some(crate::mongodb::error::PartialBulkWriteResult::Verbose(v)) => {
                Some(verbose_bulk_result(v))
            }
            // insertMany's error carries no result the Rust API exposes: the result is unset.
            None => None,
        };
        match_root_optional(partial, actual.as_ref(), entities).map_err(|m| {
            format!(
                "partial result {m}; the partial result was {}",
                actual.map_or("unset".to_string(), |a| a.to_string())
            )
        })?;
    }
    if let Some(write_errors) = &expected.write_errors {
        let b = bulk
            .as_ref()
            .ok_or_else(|| format!("expected write errors {}", shown()))?;
        let actual: BTreeMap<usize, Document> = b
            .write_errors
            .iter()
            .map(|(i, w)| (*i, doc! {"code": w.code, "message": w.message.clone()}))
            .collect();
        check_write_errors(write_errors, &actual, entities)
            .map_err(|e| format!("{e} {}", shown()))?;
    }
    if let Some(wces) = &expected.write_concern_errors {
        let b = bulk
            .as_ref()
            .ok_or_else(|| format!("expected write concern errors {}", shown()))?;
        let have: Vec<Bson> = b
            .write_concern_errors
            .iter()
            .map(|w| Bson::Document(doc! {"code": w.code, "message": w.message.clone()}))
            .collect();
        let want = Bson::Array(wces.iter().cloned().map(Bson::Document).collect());
        // Each element is a root-level document, as the format lists.
        match_root_documents(&want, &Bson::Array(have), entities)
            .map_err(|m| format!("writeConcernErrors {m}"))?;
    }
    Ok(())
}

/// Checks a result against `expectResult`: a value (or none) as a root-level value, an
/// iterable's documents each as a root-level document.
pub fn check_result(
    expected: &Bson,
    actual: &Produced,
    entities: &dyn EntityLookup,
) -> Result<(), String> {
    let shown = || {
        actual
            .to_bson()
            .map_or_else(|| "no value".to_string(), |v| v.to_string())
    };
    let matched = match actual {
        Produced::Value(value) => match_root_optional(expected, value.as_ref(), entities),
        Produced::Documents(_) => {
            let array = actual.to_bson().unwrap_or(Bson::Null);
            match_root_documents(expected, &array, entities)
        }
        Produced::Entity(entity) => {
            return Err(format!(
                "expectResult cannot be checked: the operation produced a {} entity, which \
                 has no value to match",
                entity.kind()
            ))
        }
    };
    matched.map_err(|m| format!("result mismatch {m}; the result was {}", shown()))
}

/// Applies an operation's expectations to its outcome, and stores `saveResultAsEntity`.
pub fn check_operation(
    op: &schema::Operation,
    result: DriverResult,
    entities: &mut EntityMap,
) -> Result<(), String> {
    if op.ignore_result_and_error == Some(true) {
        return Ok(());
    }
    match (result, &op.expect_error) {
        (Err(error), Some(expected)) => check_error(expected, &error, entities),
        (Err(error), None) => Err(format!("unexpected error: {error}")),
        (Ok(produced), Some(_)) => {
            let shown = match &produced {
                Produced::Entity(entity) => format!("a {} entity", entity.kind()),
                other => other
                    .to_bson()
                    .map_or_else(|| "no value".to_string(), |v| v.to_string()),
            };
            Err(format!(
                "expected an error, but the operation succeeded with {shown}"
            ))
        }
        (Ok(produced), None) => {
            if let Some(expected) = &op.expect_result {
                check_result(expected, &produced, entities)?;
            }
            let Some(id) = &op.save_result_as_entity else {
                return Ok(());
            };
            let entity = match produced {
                Produced::Entity(entity) => entity,
                other => Entity::Bson(other.to_bson().ok_or_else(|| {
                    format!("saveResultAsEntity {id:?}: the operation returned no result")
                })?),
            };
            entities.insert(id, entity)
        }
    }
}

fn same<T: PartialEq + std::fmt::Debug>(
    field: &str,
    want: Option<&T>,
    have: Option<&T>,
) -> Result<(), String> {
    match want {
        Some(w) if Some(w) != have => Err(format!("{field}: expected {w:?}, found {have:?}")),
        _ => Ok(()),
    }
}

/// Whether an observed event matches an expected one.
pub fn event_matches(
    expected: &ExpectedEvent,
    actual: &Observed,
    entities: &EntityMap,
) -> Result<(), String> {
    if expected.name() != actual.name {
        return Err(format!(
            "expected {}, found {}",
            expected.name(),
            actual.name
        ));
    }
    let ids = |service: Option<bool>, conn: Option<bool>| -> Result<(), String> {
        same(
            "hasServiceId",
            service.as_ref(),
            Some(&actual.has_service_id),
        )?;
        same(
            "hasServerConnectionId",
            conn.as_ref(),
            Some(&actual.has_server_connection_id),
        )
    };
    match expected {
        ExpectedEvent::CommandStartedEvent(m) => {
            same(
                "commandName",
                m.command_name.as_ref(),
                actual.command_name.as_ref(),
            )?;
            same(
                "databaseName",
                m.database_name.as_ref(),
                actual.database_name.as_ref(),
            )?;
            ids(m.has_service_id, m.has_server_connection_id)?;
            if let Some(command) = &m.command {
                let have = actual.command.clone().unwrap_or_default();
                match_root_document(command, &have, entities)
                    .map_err(|e| format!("command {e}; the command was {have}"))?;
            }
        }
        ExpectedEvent::CommandSucceededEvent(m) => {
            same(
                "commandName",
                m.command_name.as_ref(),
                actual.command_name.as_ref(),
            )?;
            same(
                "databaseName",
                m.database_name.as_ref(),
                actual.database_name.as_ref(),
            )?;
            ids(m.has_service_id, m.has_server_connection_id)?;
            if let Some(reply) = &m.reply {
                let have = actual.reply.clone().unwrap_or_default();
                match_root_document(reply, &have, entities)
                    .map_err(|e| format!("reply {e}; the reply was {have}"))?;
            }
        }
        ExpectedEvent::CommandFailedEvent(m) => {
            same(
                "commandName",
                m.command_name.as_ref(),
                actual.command_name.as_ref(),
            )?;
            same(
                "databaseName",
                m.database_name.as_ref(),
                actual.database_name.as_ref(),
            )?;
            ids(m.has_service_id, m.has_server_connection_id)?;
        }
        ExpectedEvent::PoolClearedEvent(m) => {
            same(
                "hasServiceId",
                m.has_service_id.as_ref(),
                Some(&actual.has_service_id),
            )?;
            same(
                "interruptInUseConnections",
                m.interrupt_in_use_connections.as_ref(),
                actual.interrupt_in_use_connections.as_ref(),
            )?;
        }
        ExpectedEvent::ConnectionClosedEvent(m)
        | ExpectedEvent::ConnectionCheckOutFailedEvent(m) => {
            same("reason", m.reason.as_ref(), actual.reason.as_ref())?;
        }
        ExpectedEvent::ServerDescriptionChangedEvent(m)
        | ExpectedEvent::TopologyDescriptionChangedEvent(m) => {
            let prev = m
                .previous_description
                .as_ref()
                .and_then(|d| d.kind.as_ref());
            let new = m.new_description.as_ref().and_then(|d| d.kind.as_ref());
            same(
                "previousDescription.type",
                prev,
                actual.previous_type.as_ref(),
            )?;
            same("newDescription.type", new, actual.new_type.as_ref())?;
        }
        ExpectedEvent::ServerHeartbeatStartedEvent(m)
        | ExpectedEvent::ServerHeartbeatSucceededEvent(m)
        | ExpectedEvent::ServerHeartbeatFailedEvent(m) => {
            same("awaited", m.awaited.as_ref(), actual.awaited.as_ref())?;
        }
        _ => {}
    }
    Ok(())
}

fn kind_of(name: &str) -> EventType {
    if name.starts_with("command") {
        EventType::Command
    } else if name.starts_with("pool") || name.starts_with("connection") {
        EventType::Cmap
    } else {
        EventType::Sdam
    }
}

/// Checks `expectEvents` for every client listed.
pub fn check_events(
    expected: &[schema::ExpectedEventsForClient],
    entities: &EntityMap,
) -> Result<(), String> {
    for group in expected {
        let client = entities.client(&group.client)?;
        let kind = group.event_type.unwrap_or_default();
        let actual: Vec<Observed> = client
            .observed()
            .into_iter()
            .filter(|e| kind_of(e.name) == kind)
            .collect();
        let names = || {
            actual
                .iter()
                .map(|e| e.command_name.as_deref().unwrap_or(e.name))
                .collect::<Vec<_>>()
        };
        let extra_ok = group.ignore_extra_events == Some(true);
        if actual.len() < group.events.len() || (!extra_ok && actual.len() != group.events.len()) {
            return Err(format!(
                "client {}: expected {} {:?} events, saw {}: {:?}",
                group.client,
                group.events.len(),
                kind,
                actual.len(),
                names()
            ));
        }
        for (i, (want, have)) in group.events.iter().zip(&actual).enumerate() {
            event_matches(want, have, entities).map_err(|e| {
                format!(
                    "client {}: event {i}: {e} (events: {:?})",
                    group.client,
                    names()
                )
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expected(event: Document) -> ExpectedEvent {
        bson::from_document(event).expect("a valid expected event")
    }

    /// A finished command event as `EventLog` records it once paired with its started event.
    fn observed(name: &'static str, database_name: Option<&str>) -> Observed {
        let mut event = Observed::new(name, EventType::Command);
        event.command_name = Some("ping".to_owned());
        event.database_name = database_name.map(str::to_owned);
        event.reply = Some(doc! {"ok": 1});
        event
    }

    #[test]
    fn finished_command_events_compare_the_database_name() {
        let entities = EntityMap::default();
        for name in ["commandSucceededEvent", "commandFailedEvent"] {
            let want = expected(doc! {name: {"commandName": "ping", "databaseName": "admin"}});
            assert_eq!(
                event_matches(&want, &observed(name, Some("admin")), &entities),
                Ok(())
            );
            let err = event_matches(&want, &observed(name, Some("test")), &entities).unwrap_err();
            assert!(err.contains("databaseName"), "{name}: {err}");
            // Unpaired (no started event seen): a database name was expected, none is known.
            let err = event_matches(&want, &observed(name, None), &entities).unwrap_err();
            assert!(err.contains("databaseName"), "{name}: {err}");

            let any_database = expected(doc! {name: {"commandName": "ping"}});
            assert_eq!(
                event_matches(&any_database, &observed(name, Some("test")), &entities),
                Ok(())
            );
        }
    }

    fn operation(d: Document) -> schema::Operation {
        bson::from_document(d).expect("a well-formed operation")
    }

    #[test]
    fn write_errors_reject_extra_errors() {
        let entities = EntityMap::default();
        let actual: BTreeMap<usize, Document> = [
            (0, doc! {"code": 11000, "message": "dup"}),
            (2, doc! {"code": 121, "message": "invalid"}),
        ]
        .into_iter()
        .collect();
        let both = doc! {"0": {"code": 11000}, "2": {"code": 121}};
        assert_eq!(check_write_errors(&both, &actual, &entities), Ok(()));
        // The old check looked only at the expected indexes.
        let err = check_write_errors(&doc! {"0": {"code": 11000}}, &actual, &entities).unwrap_err();
        assert!(err.contains("[2]"), "{err}");
        let err = check_write_errors(&doc! {"1": {"code": 1}}, &actual, &entities).unwrap_err();
        assert!(err.contains("indexes [0, 2]"), "{err}");
    }

    fn command_error(code_name: &str, message: &str) -> DriverError {
        let error: crate::mongodb::error::CommandError =
            bson::from_document(doc! {"code": 59, "codeName": code_name, "errmsg": message})
                .expect("a command error");
        ErrorKind::Command(error).into()
    }

    #[test]
    fn is_timeout_error_is_the_timeout_kind_only() {
        let entities = EntityMap::default();
        let expect = |timeout: bool| ExpectedError {
            is_timeout_error: Some(timeout),
            ..ExpectedError::default()
        };
        // An I/O timeout (connectTimeoutMS, a socket) whose text says "timed out" is not one.
        let io: DriverError =
            std::io::Error::new(std::io::ErrorKind::TimedOut, "connection timed out").into();
        assert!(check_error(&expect(true), &io, &entities).is_err());
        assert_eq!(check_error(&expect(false), &io, &entities), Ok(()));
        // The positive case needs a driver-made `ErrorKind::Timeout` (the variant cannot be
        // built outside the driver): the CSOT files' `isTimeoutError: true` cases are it.
    }

    #[test]
    fn error_contains_reads_the_message_only() {
        let entities = EntityMap::default();
        let contains = |text: &str| ExpectedError {
            error_contains: Some(text.into()),
            ..ExpectedError::default()
        };
        let error = command_error("CommandNotFound", "no such command: 'x'");
        assert_eq!(
            check_error(&contains("NO SUCH command"), &error, &entities),
            Ok(())
        );
        // In the displayed error (code name, labels, response), not in the message.
        for text in ["CommandNotFound", "labels", "server response"] {
            assert!(
                check_error(&contains(text), &error, &entities).is_err(),
                "{text}"
            );
        }
        let custom = DriverError::custom("boom".to_string());
        assert!(check_error(&contains("source"), &custom, &entities).is_err());
    }

    #[test]
    fn aggregated_write_errors_match_any_and_client_bulk_write_errors_do_not_count() {
        let entities = EntityMap::default();
        let insert_many: crate::mongodb::error::InsertManyError = bson::from_document(doc! {
            "writeErrors": [
                {"index": 0, "code": 11000, "codeName": "DuplicateKey", "errmsg": "E11000 dup"},
                {"index": 1, "code": 121, "codeName": "DocumentValidationFailure",
                 "errmsg": "Document failed validation"},
            ],
        })
        .expect("an insertMany error");
        let error: DriverError = ErrorKind::InsertMany(insert_many).into();
        let expect = |contains: &str, code: i32, name: &str| ExpectedError {
            error_contains: Some(contains.into()),
            error_code: Some(code),
            error_code_name: Some(name.into()),
            ..ExpectedError::default()
        };
        // The second write error, name compared case-insensitively.
        assert_eq!(
            check_error(
                &expect("failed VALIDATION", 121, "documentvalidationfailure"),
                &error,
                &entities
            ),
            Ok(())
        );
        // A client bulk write's write errors are only for `writeErrors`; with no top-level
        // error there is no message or code at all. The old check found both.
        let write_error: crate::mongodb::error::WriteError =
            bson::from_document(doc! {"code": 11000, "codeName": "DuplicateKey",
            "errmsg": "E11000 dup"})
            .expect("a write error");
        let mut bulk = crate::mongodb::error::BulkWriteError::default();
        bulk.write_errors.insert(0, write_error);
        let error: DriverError = ErrorKind::BulkWrite(bulk).into();
        let contains = ExpectedError {
            error_contains: Some("E11000".into()),
            ..ExpectedError::default()
        };
        assert!(check_error(&contains, &error, &entities).is_err());
        let code = ExpectedError {
            error_code: Some(11000),
            ..ExpectedError::default()
        };
        assert!(check_error(&code, &error, &entities).is_err());
        let listed = ExpectedError {
            write_errors: Some(doc! {"0": {"code": 11000}}),
            ..ExpectedError::default()
        };
        assert_eq!(check_error(&listed, &error, &entities), Ok(()));
    }

    #[test]
    fn save_result_as_entity_needs_a_result() {
        let mut entities = EntityMap::default();
        let op = operation(doc! {"name": "commitTransaction", "object": "s",
        "saveResultAsEntity": "saved"});
        // The old runner stored Null.
        let err = check_operation(&op, Ok(Produced::Value(None)), &mut entities).unwrap_err();
        assert!(err.contains("no result"), "{err}");
        assert!(entities.get("saved").is_none());
        check_operation(
            &op,
            Ok(Produced::Value(Some(Bson::Int32(3)))),
            &mut entities,
        )
        .expect("a value is saved");
        assert!(matches!(
            entities.get("saved"),
            Some(Entity::Bson(Bson::Int32(3)))
        ));
    }

    #[test]
    fn expect_result_is_never_ignored() {
        let mut entities = EntityMap::default();
        let op = operation(doc! {"name": "createFindCursor", "object": "c",
        "arguments": {"filter": {}}, "expectResult": {"x": 1}});
        let cursor_like = Entity::Thread(std::sync::Arc::default());
        // The old runner skipped expectResult when the operation produced an entity.
        let err =
            check_operation(&op, Ok(Produced::Entity(cursor_like)), &mut entities).unwrap_err();
        assert!(err.contains("expectResult cannot be checked"), "{err}");
        // No value matches only what accepts an absent value.
        let unset = Bson::Document(doc! {"$$unsetOrMatches": {"x": 1}});
        assert_eq!(
            check_result(&unset, &Produced::Value(None), &entities),
            Ok(())
        );
        assert!(check_result(&Bson::Null, &Produced::Value(None), &entities).is_err());
    }

    #[test]
    fn iterable_documents_are_root_level_and_values_are_not() {
        let entities = EntityMap::default();
        let expected = Bson::Array(vec![Bson::Document(doc! {"_id": 1})]);
        let found = Produced::Documents(vec![doc! {"_id": 1, "x": 2}]);
        assert_eq!(check_result(&expected, &found, &entities), Ok(()));
        // The same documents as a plain array value (`distinct`): nested, no extra fields.
        let distinct = Produced::Value(Some(Bson::Array(vec![Bson::Document(
            doc! {"_id": 1, "x": 2},
        )])));
        let err = check_result(&expected, &distinct, &entities).unwrap_err();
        assert!(err.contains("$[0].x"), "{err}");
    }
}
