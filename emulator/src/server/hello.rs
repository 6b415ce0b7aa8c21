//! The hello family (`hello`, `isMaster`, `ismaster`): persona replies and awaitable hello.

use std::time::Duration;

use bson::{doc, Bson, DateTime, Document};

use super::{lock, repl, Member, Role, Shared};
use crate::wire::{MAX_BSON_OBJECT_SIZE, MAX_MESSAGE_SIZE_BYTES};

/// Whether `name` is one of the hello commands.
pub(crate) fn is_hello(name: &str) -> bool {
    matches!(name, "hello" | "isMaster" | "ismaster")
}

/// Whether `cmd` is an awaitable hello (`topologyVersion` and `maxAwaitTimeMS` given).
pub(crate) fn is_awaitable(cmd: &Document) -> bool {
    cmd.keys().next().is_some_and(|n| is_hello(n))
        && cmd.contains_key("topologyVersion")
        && cmd.contains_key("maxAwaitTimeMS")
}

/// The `topologyVersion` this member reports: its process id and a counter that every
/// election (step-down, new primary) increases.
pub(crate) fn topology_version(shared: &Shared, member: &Member) -> Document {
    let counter = lock(&shared.repl)
        .counters
        .get(member.index)
        .copied()
        .unwrap_or(0);
    doc! { "processId": member.process_id, "counter": counter }
}

/// How long an awaitable hello should wait before replying, or `None` to reply at once.
pub(crate) fn await_time(shared: &Shared, member: &Member, cmd: &Document) -> Option<Duration> {
    if !shared.config.topology_version {
        return None;
    }
    let tv = cmd.get_document("topologyVersion").ok()?;
    let max_await = match cmd.get("maxAwaitTimeMS")? {
        Bson::Int32(i) => i64::from(*i),
        Bson::Int64(i) => *i,
        Bson::Double(d) if d.is_finite() => *d as i64,
        _ => return None,
    };
    let same_process = tv.get_object_id("processId").ok() == Some(member.process_id);
    let counter = match tv.get("counter") {
        Some(Bson::Int64(c)) => *c,
        Some(Bson::Int32(c)) => i64::from(*c),
        _ => return None,
    };
    // A client that knows another topology (other process or another counter) gets the current
    // state at once; one that is up to date waits for a change (an election wakes it).
    let current = lock(&shared.repl)
        .counters
        .get(member.index)
        .copied()
        .unwrap_or(0);
    if !same_process || counter != current || max_await <= 0 {
        return None;
    }
    Some(Duration::from_millis(max_await as u64).min(shared.config.max_await_time))
}

/// The hello reply body for `member`.
pub(crate) fn reply(
    shared: &Shared,
    member: &Member,
    cmd_name: &str,
    cmd: &Document,
    connection_id: i64,
) -> Document {
    let legacy = cmd_name != "hello";
    let role = repl::role(shared, member);
    let writable = matches!(role, Role::Standalone | Role::Primary | Role::Mongos);
    let mut r = Document::new();
    if cmd.get_bool("helloOk").unwrap_or(false)
        || matches!(cmd.get("helloOk"), Some(Bson::Int32(1)))
    {
        r.insert("helloOk", true);
    }
    r.insert(
        if legacy {
            "ismaster"
        } else {
            "isWritablePrimary"
        },
        writable,
    );
    if role == Role::Mongos {
        r.insert("msg", "isdbgrid");
    }
    if let Some(set_name) = shared.set_name() {
        let hosts: Vec<Bson> = shared
            .members
            .iter()
            .map(|m| Bson::String(m.host.clone()))
            .collect();
        let (primary, term) = {
            let repl = lock(&shared.repl);
            (repl.primary, repl.term)
        };
        r.insert("topologyVersion", topology_version(shared, member));
        r.insert("hosts", hosts);
        r.insert("setName", set_name);
        r.insert("setVersion", 1i32);
        r.insert("secondary", role == Role::Secondary);
        // Between a step-down and the next election no member reports a primary.
        if let Some(primary) = primary.and_then(|i| shared.members.get(i)) {
            r.insert("primary", primary.host.clone());
        }
        r.insert("me", member.host.clone());
        if role == Role::Primary {
            r.insert("electionId", repl::election_id(term));
        }
    } else if shared.config.topology_version {
        r.insert("topologyVersion", topology_version(shared, member));
    }
    if !shared.config.topology_version {
        r.remove("topologyVersion");
    }
    if cmd.get_bool("loadBalanced").unwrap_or(false) {
        r.insert("serviceId", member.process_id);
    }
    r.insert("maxBsonObjectSize", MAX_BSON_OBJECT_SIZE);
    r.insert("maxMessageSizeBytes", MAX_MESSAGE_SIZE_BYTES);
    r.insert("maxWriteBatchSize", 100_000i32);
    r.insert("localTime", DateTime::now());
    r.insert(
        "logicalSessionTimeoutMinutes",
        shared.config.logical_session_timeout_minutes,
    );
    r.insert("connectionId", connection_id);
    r.insert("minWireVersion", 0i32);
    r.insert("maxWireVersion", shared.config.max_wire_version);
    r.insert("readOnly", false);
    r.insert("ok", 1.0);
    r
}
