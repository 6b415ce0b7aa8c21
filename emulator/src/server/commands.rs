//! Request handling: generic arguments, failCommand, role checks, sessions, transactions,
//! retryable writes, dispatch and the reply envelope (labels, `$clusterTime`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson, DateTime, Document};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::auth;
use super::changes::{self, Capture};
use super::data::{self, DataCtx};
use super::error::{
    codes, computed_labels, is_retriable_code, set_labels, CommandError, LabelContext,
};
use super::failpoint::{self, CommandFacts};
use super::mangle;
use super::routing::{self, Routed};
use super::session::{SessionKey, Transaction, TxnState};
use super::sharding::Sharding;
use super::{
    cluster_time_doc, current_op, db_stats, explain, hello, lock, repl, snapshot, Member, Role,
    Shared, State,
};
use crate::engine::Store;
use crate::model::{CommandInfo, Rejection};
use crate::wire::OpMsg;

/// `onPrimaryTransactionalWrite` for one request: the key of its draws, and what it asks for
/// once a retryable write ran.
#[derive(Debug, Default)]
pub(crate) struct WriteFaults {
    /// The request's key for `activationProbability` draws ([`fail_point_rng`]).
    pub(crate) draws: Option<u64>,
    /// Close the connection instead of replying.
    pub(crate) close: bool,
    /// Step this member down (lab-only `labStepDown`).
    pub(crate) step_down: bool,
    /// On a router: the statements of a batch write its target shards accepted (run on the
    /// store) and rejected (write errors), when a shard rejected some (module `routing`).
    pub(crate) shard_rejections: Option<routing::ShardRejections>,
}

/// Per-connection facts.
pub(crate) struct ConnCtx {
    /// Emulator-internal connection serial (cursor ownership).
    pub(crate) serial: u64,
    /// `connectionId` reported in hello.
    pub(crate) connection_id: i64,
    /// `client.application.name` of the handshake.
    pub(crate) app_name: Option<String>,
    /// The handshake's `client` document (`currentOp` reports it as `clientMetadata`).
    pub(crate) client_metadata: Option<Document>,
    /// Whether the first hello was seen.
    pub(crate) handshaken: bool,
    /// Peer address (for logs and metadata records).
    pub(crate) peer: std::net::SocketAddr,
    /// Who the connection authenticated as, and a SCRAM conversation in progress.
    pub(crate) auth: auth::ConnAuth,
}

/// What to do after a request.
pub(crate) enum Outcome {
    /// Send this reply.
    Reply(Document),
    /// Close the connection without replying.
    Close,
}

/// The generic arguments of a command.
#[derive(Debug, Default)]
struct Generic {
    lsid: Option<Document>,
    txn_number: Option<i64>,
    start_transaction: bool,
    autocommit: Option<bool>,
    secondary_ok: bool,
}

impl Generic {
    fn parse(body: &Document) -> Result<Generic, CommandError> {
        let lsid = match body.get("lsid") {
            None => None,
            Some(Bson::Document(d)) => Some(d.clone()),
            Some(_) => return Err(CommandError::type_mismatch("'lsid' must be a document")),
        };
        let txn_number = match body.get("txnNumber") {
            None => None,
            Some(Bson::Int64(n)) => Some(*n),
            Some(Bson::Int32(n)) => Some(i64::from(*n)),
            Some(_) => {
                return Err(CommandError::type_mismatch(
                    "'txnNumber' must be a 64-bit integer",
                ))
            }
        };
        let autocommit = match body.get("autocommit") {
            None => None,
            Some(Bson::Boolean(b)) => Some(*b),
            Some(_) => {
                return Err(CommandError::type_mismatch(
                    "'autocommit' must be a boolean",
                ))
            }
        };
        let start_transaction = matches!(body.get("startTransaction"), Some(Bson::Boolean(true)));
        let secondary_ok = match body.get("$readPreference") {
            Some(Bson::Document(rp)) => rp.get_str("mode").map(|m| m != "primary").unwrap_or(false),
            _ => false,
        };
        Ok(Generic {
            lsid,
            txn_number,
            start_transaction,
            autocommit,
            secondary_ok,
        })
    }
}

fn namespace(db: &str, name: &str, body: &Document) -> String {
    match body.get(name) {
        Some(Bson::String(c)) if name != "getMore" => format!("{db}.{c}"),
        _ => match body.get("collection") {
            Some(Bson::String(c)) if name == "getMore" => format!("{db}.{c}"),
            _ => format!("{db}.$cmd"),
        },
    }
}

async fn sleep_or_shutdown(shared: &Shared, d: Duration) {
    let mut shutdown = shared.shutdown.clone();
    if *shutdown.borrow() {
        return;
    }
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = shutdown.changed() => {}
    }
}

/// Handles one request.
///
/// `arrival` is when the request was read off the socket; `disconnected` completes if the
/// client goes away meanwhile (both feed the overload model).
pub(crate) async fn handle(
    shared: &Arc<Shared>,
    member: &Arc<Member>,
    conn: &mut ConnCtx,
    msg: OpMsg,
    arrival: tokio::time::Instant,
    disconnected: impl std::future::Future<Output = ()>,
) -> Outcome {
    let body = msg.body;
    let Some(name) = body.keys().next().cloned() else {
        return Outcome::Close;
    };
    tokio::pin!(disconnected);
    let counter = match name.as_str() {
        "insert" => &shared.counters.inserts,
        "find" => &shared.counters.queries,
        "update" => &shared.counters.updates,
        "delete" => &shared.counters.deletes,
        "getMore" => &shared.counters.getmores,
        _ => &shared.counters.commands,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    let db = match body.get("$db") {
        Some(Bson::String(db)) if !db.is_empty() => db.clone(),
        _ => {
            let e = CommandError::new(
                40414,
                "BSON field 'OP_MSG.$db' is missing but a required field",
            );
            return Outcome::Reply(e.to_document());
        }
    };
    let is_hello = hello::is_hello(&name);
    if is_hello && !conn.handshaken {
        conn.handshaken = true;
        if let Ok(client) = body.get_document("client") {
            conn.app_name = client
                .get_document("application")
                .ok()
                .and_then(|a| a.get_str("name").ok())
                .map(str::to_string);
            conn.client_metadata = Some(client.clone());
            let mut record = client.clone();
            if let Some(bp) = body.get("backpressure") {
                record.insert("backpressure", bp.clone());
            }
            shared.record_metadata(record);
        }
        tracing::debug!(conn = conn.connection_id, peer = %conn.peer, app = ?conn.app_name, "handshake");
    }

    let generic = Generic::parse(&body);
    let label_ctx = match &generic {
        Ok(g) => LabelContext {
            retryable_write: g.txn_number.is_some()
                && g.autocommit.is_none()
                && data::is_retryable_write(&name),
            in_transaction: g.autocommit == Some(false),
            commit_or_abort: matches!(name.as_str(), "commitTransaction" | "abortTransaction"),
            change_stream_get_more: name == "getMore" && is_change_stream_cursor(shared, &body),
        },
        Err(_) => LabelContext::default(),
    };

    // An awaitData getMore's maxTimeMS is how long it waits for new documents, not a deadline
    // (mongod: `getMore` on a tailable awaitData cursor does not set it on the operation;
    // jstests/core/tailable_getmore_no_timeout.js, SERVER-33942).
    let await_data = name == "getMore" && awaits_data(shared, &body);
    let deadline_body = if await_data {
        let mut without = body.clone();
        without.remove("maxTimeMS");
        std::borrow::Cow::Owned(without)
    } else {
        std::borrow::Cow::Borrowed(&body)
    };

    // Overload model, step 1: the ingress rate limiter (before failCommand, like mongod's).
    let info = CommandInfo::from_command(&deadline_body, arrival);
    let admission = match member.model.admit(&info).await {
        Ok(a) => a,
        Err(r) => return rejected(shared, member, &r, label_ctx),
    };

    // failCommand: after parsing and metadata, before anything else.
    let ns = namespace(&db, &name, &body);
    let action = {
        let facts = CommandFacts {
            name: &name,
            namespace: &ns,
            app_name: conn.app_name.as_deref(),
        };
        lock(&member.fail_point).evaluate(&facts, &mut fail_point_rng(admission.draws()))
    };
    let mut override_labels = None;
    let mut wce = None;
    if let Some(action) = action {
        tracing::debug!(conn = conn.connection_id, command = %name, ?action, "failCommand fired");
        override_labels = action.labels.clone();
        if let Some(d) = action.block {
            // The block is interruptible by the operation's maxTimeMS, like mongod's sleep on
            // the operation context.
            let max_time = max_time_ms(&deadline_body);
            match max_time {
                Some(limit) if limit < d => {
                    sleep_or_shutdown(shared, limit).await;
                    let err = CommandError::new(50, "operation exceeded time limit");
                    return Outcome::Reply(finish(shared, member, Err(err), label_ctx, None, None));
                }
                _ => sleep_or_shutdown(shared, d).await,
            }
        }
        if action.close {
            return Outcome::Close;
        }
        if let Some(err) = action.error() {
            // mongod labels ResumableChangeStreamError only on a getMore's own errors; the
            // fail point's error keeps the labels its data gave (or none).
            let ctx = LabelContext {
                change_stream_get_more: false,
                ..label_ctx
            };
            return Outcome::Reply(finish(shared, member, Err(err), ctx, None, None));
        }
        wce = action.write_concern_error;
    }
    // Authentication (when the deployment requires it): a known command other than the
    // handshake and authentication itself needs an authenticated connection. mongod checks this
    // right after evaluating failCommand (`ExecCommandDatabase::_initiateCommand`); an unknown
    // command is still 59 CommandNotFound.
    if is_known_command(&name) {
        if let Err(e) = auth::check(shared, &conn.auth, &name) {
            // The fail point's labels belong to errors it raises, not to this one.
            return Outcome::Reply(finish(shared, member, Err(e), label_ctx, None, None));
        }
    }
    let generic = match generic {
        Ok(g) => g,
        Err(e) => return Outcome::Reply(finish(shared, member, Err(e), label_ctx, None, None)),
    };

    if is_hello {
        // Register for wake-ups before comparing topology versions, so an election in between
        // is not missed.
        let woken = member.wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        if let Some(wait) = hello::await_time(shared, member, &body) {
            tokio::select! {
                _ = sleep_or_shutdown(shared, wait) => {}
                _ = woken => {}
                _ = &mut disconnected => return Outcome::Close,
            }
        }
        let mut r = hello::reply(shared, member, &name, &body, conn.connection_id);
        auth::hello_fields(shared, &mut conn.auth, &body, &mut r);
        if shared.is_replicated() {
            let ts = shared.state().tick();
            r.insert("$clusterTime", cluster_time_doc(ts));
            r.insert("operationTime", ts);
        }
        return Outcome::Reply(r);
    }

    if name == "getMore" {
        // Register for change notifications before looking, so none is missed in between.
        let notified = shared.changes_notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let wait = match change_stream_wait(shared, &body) {
            None if await_data => tail_wait(shared, &body),
            wait => wait,
        };
        if let Some(wait) = wait {
            tokio::select! {
                _ = sleep_or_shutdown(shared, wait) => {}
                _ = notified => {}
            }
        }
    }

    if name == "getMore" {
        // mongod's failGetMoreAfterCursorCheckout: the getMore fails once it holds its cursor.
        let fired = lock(&member.get_more_fail_point)
            .evaluate_mode(&mut fail_point_rng(admission.draws().map(|k| k ^ 1)));
        if let Some(data) = fired {
            if data.get_bool("closeConnection").unwrap_or(false) {
                return Outcome::Close;
            }
            let code = match data.get("errorCode") {
                Some(Bson::Int32(c)) => *c,
                Some(Bson::Int64(c)) => i32::try_from(*c).unwrap_or(codes::BAD_VALUE),
                _ => codes::BAD_VALUE,
            };
            let err = CommandError::new(
                code,
                "Failing command via 'failGetMoreAfterCursorCheckout' failpoint",
            );
            return Outcome::Reply(finish(shared, member, Err(err), label_ctx, None, None));
        }
    }

    // Overload model, step 2: ticket, virtual cores, yields and the deadline.
    let draws = admission.draws().map(|k| k ^ 2);
    let ran = match admission.execute(&mut disconnected).await {
        Ok(o) => o,
        Err(r) => return rejected(shared, member, &r, label_ctx),
    };
    let mut after = WriteFaults {
        draws,
        ..WriteFaults::default()
    };
    // A router forwards the request to its target shards: each shard's model admits and runs
    // it (concurrently for a scatter-gather) before it runs once on the shared store.
    let mut routed_targets = None;
    if let (Some(sharding), Role::Mongos) = (shared.sharding.as_ref(), member.role) {
        if routes_to_shards(&name) {
            let in_transaction = generic.autocommit == Some(false);
            match routing::route(shared, sharding, &name, &db, &body, &info, in_transaction).await {
                Routed::Accepted { targets } => routed_targets = Some(targets),
                Routed::Statements(rejections) => after.shard_rejections = Some(rejections),
                Routed::Failed(err) => {
                    return Outcome::Reply(finish(shared, member, Err(err), label_ctx, None, None));
                }
            }
        }
    }
    let mut result = execute(
        shared, member, conn, &name, &db, &body, &generic, &mut after,
    );
    if result.is_err() {
        member.model.record_failed(&ran);
    }
    if after.step_down {
        // Lab-only `onPrimaryTransactionalWrite` `labStepDown`: the write was applied, now this
        // member steps down (as if an election happened before the reply was sent).
        if let Err(e) = repl::step_down(shared, member.index, &repl::StepDown::default()) {
            tracing::warn!(member = member.index, error = %e.errmsg, "labStepDown: step-down failed");
        }
    }
    if let (Some(sharding), Role::Mongos, Ok(reply)) =
        (shared.sharding.as_ref(), member.role, &result)
    {
        track_routing(sharding, &name, &db, &body, reply, routed_targets);
    }
    if after.close {
        return Outcome::Close;
    }
    if member.role == Role::Mongos && generic.autocommit == Some(false) {
        // mongos hands out a recovery token with every transaction statement.
        if let Ok(reply) = &mut result {
            reply.insert("recoveryToken", doc! { "recoveryShardId": "shard0" });
        }
    }
    let supports_wc =
        data::is_write(&name) || matches!(name.as_str(), "commitTransaction" | "abortTransaction");
    let wce = if supports_wc && result.is_ok() {
        wce.or_else(|| unsatisfiable_write_concern(shared, &body))
    } else {
        None
    };
    Outcome::Reply(finish(
        shared,
        member,
        result,
        label_ctx,
        override_labels,
        wce,
    ))
}

/// Whether a router sends `name` to its shards (data commands and `dbStats`; everything else,
/// hello, sessions, parameters and the sharding commands, the router answers itself).
fn routes_to_shards(name: &str) -> bool {
    data::is_data_command(name) || name == "dbStats"
}

/// A router's bookkeeping after a command succeeded: the shards of a new cursor (its getMores
/// go there), cursors that ended, and the sharding of dropped collections.
fn track_routing(
    sharding: &Sharding,
    name: &str,
    db: &str,
    body: &Document,
    reply: &Document,
    targets: Option<Vec<usize>>,
) {
    let cursor_id = reply
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get_i64("id").ok());
    match name {
        "getMore" => {
            if let (Some(0), Some(Bson::Int64(id))) = (cursor_id, body.get("getMore")) {
                sharding.forget_cursor(*id);
            }
        }
        "killCursors" => {
            for id in body.get_array("cursors").map(Vec::as_slice).unwrap_or(&[]) {
                if let Bson::Int64(id) = id {
                    sharding.forget_cursor(*id);
                }
            }
        }
        "drop" => {
            if let Ok(coll) = body.get_str("drop") {
                sharding.forget_collection(db, Some(coll));
            }
        }
        "dropDatabase" => sharding.forget_collection(db, None),
        _ => {
            if let (Some(id), Some(targets)) = (cursor_id.filter(|id| *id != 0), targets) {
                sharding.remember_cursor(id, targets);
            }
        }
    }
}

/// Whether a getMore continues a change stream's cursor.
fn is_change_stream_cursor(shared: &Shared, body: &Document) -> bool {
    match body.get("getMore") {
        Some(Bson::Int64(id)) => shared.state().cursors.stream_position(*id).is_some(),
        _ => false,
    }
}

/// Whether a getMore continues a cursor that awaits data (a change stream's, or an awaitData
/// tailable cursor's).
fn awaits_data(shared: &Shared, body: &Document) -> bool {
    match body.get("getMore") {
        Some(Bson::Int64(id)) => shared.state().cursors.awaits_data(*id),
        _ => false,
    }
}

/// How long an awaitData getMore waits for new documents: its `maxTimeMS` (mongod's default
/// 1 s without one), none when documents are already there to return.
fn tail_wait(shared: &Shared, body: &Document) -> Option<Duration> {
    let id = match body.get("getMore") {
        Some(Bson::Int64(i)) => *i,
        _ => return None,
    };
    let st = shared.state();
    let tail = st.cursors.awaiting_tail(id)?;
    if !super::data::tail_documents(&st.store, tail).is_empty() {
        return None;
    }
    Some(max_time_ms(body).unwrap_or(Duration::from_secs(1)))
}

/// How long a change-stream getMore waits for events (none when events are already there).
fn change_stream_wait(shared: &Shared, body: &Document) -> Option<Duration> {
    let id = match body.get("getMore") {
        Some(Bson::Int64(i)) => *i,
        _ => return None,
    };
    let st = shared.state();
    let pos = st.cursors.stream_position(id)?;
    if pos < st.changes.next_seq() {
        return None;
    }
    let ms = match body.get("maxTimeMS") {
        Some(Bson::Int32(i)) => i64::from(*i),
        Some(Bson::Int64(i)) => *i,
        _ => 1000,
    };
    Some(Duration::from_millis(ms.clamp(0, 1000) as u64))
}

/// Wraps a result into the reply document: labels, baseBackoffMS, write concern error,
/// `$clusterTime` and `operationTime`.
fn finish(
    shared: &Shared,
    member: &Arc<Member>,
    result: Result<Document, CommandError>,
    ctx: LabelContext,
    override_labels: Option<Vec<String>>,
    wce: Option<Document>,
) -> Document {
    let (mut reply, labels) = match result {
        Ok(mut d) => {
            let mut labels = Vec::new();
            if let Some(w) = wce {
                let code = match w.get("code") {
                    Some(Bson::Int32(c)) => *c,
                    Some(Bson::Int64(c)) => i32::try_from(*c).unwrap_or(0),
                    Some(Bson::Double(c)) => *c as i32,
                    _ => 0,
                };
                if is_not_primary_code(code) || is_shutdown_code(code) {
                    wake_soon(member);
                }
                d.insert("writeConcernError", w);
                labels = match &override_labels {
                    Some(l) => l.clone(),
                    None if (ctx.retryable_write || ctx.commit_or_abort)
                        && is_retriable_code(code) =>
                    {
                        vec!["RetryableWriteError".to_string()]
                    }
                    None => Vec::new(),
                };
            }
            (d, labels)
        }
        Err(e) => {
            let labels = e
                .labels
                .clone()
                .unwrap_or_else(|| computed_labels(e.code, ctx));
            let mut d = e.to_document();
            if is_not_primary_code(e.code)
                && shared.is_replicated()
                && shared.config.topology_version
            {
                // mongod reports its current topologyVersion with "not primary" errors, so a
                // driver that already knows it ignores the error instead of marking the server
                // unknown.
                d.insert("topologyVersion", hello::topology_version(shared, member));
            } else if is_not_primary_code(e.code) || is_shutdown_code(e.code) {
                wake_soon(member);
            }
            (d, labels)
        }
    };
    set_labels(&mut reply, &labels);
    if labels.iter().any(|l| l == "SystemOverloadedError") {
        let (backoff, raw) = {
            let st = shared.state();
            let backoff = match st.params.values.get("externalClientBaseBackoffMS") {
                Some(Bson::Int32(i)) => i64::from(*i),
                Some(Bson::Int64(i)) => *i,
                _ => 0,
            };
            let raw = match st.params.values.get("labRawBaseBackoffMS") {
                Some(Bson::Document(d)) => d.get("value").cloned(),
                _ => None,
            };
            (backoff, raw)
        };
        if let Some(raw) = raw {
            reply.insert("baseBackoffMS", raw);
        } else if backoff > 0 {
            reply.insert("baseBackoffMS", backoff);
        }
    }
    if shared.is_replicated() {
        let ts = shared.state().tick();
        reply.insert("$clusterTime", cluster_time_doc(ts));
        reply.insert("operationTime", ts);
    }
    reply
}

/// The driver marks a member unknown after a state-change error without a topologyVersion and
/// then waits for its monitor; answer the monitor's pending awaitable hello shortly (once the
/// driver has processed the error) instead of after the whole maxAwaitTimeMS.
fn wake_soon(member: &Arc<Member>) {
    let member = member.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        member.wake.notify_waiters();
    });
}

fn ok() -> Document {
    doc! { "ok": 1.0 }
}

/// Commands [`execute`] answers other than data commands and authentication commands (it
/// answers anything else with 59 CommandNotFound). Keep in step with its arms.
const ADMIN_COMMANDS: &[&str] = &[
    "ping",
    "buildInfo",
    "buildinfo",
    "getParameter",
    "setParameter",
    "serverStatus",
    "configureFailPoint",
    "labClientMetadata",
    "endSessions",
    "killSessions",
    "killAllSessions",
    "killAllSessionsByPattern",
    "checkMetadataConsistency",
    "refreshSessions",
    "startSession",
    "commitTransaction",
    "abortTransaction",
    "whatsmyuri",
    "getCmdLineOpts",
    "hostInfo",
    "getLog",
    "replSetStepDown",
    "replSetFreeze",
    "replSetGetStatus",
    "explain",
    "currentOp",
    "createSearchIndexes",
    "updateSearchIndex",
    "dropSearchIndex",
    "dbStats",
    "enableSharding",
    "shardCollection",
    "split",
    "moveChunk",
    "listShards",
    "labShardingState",
];

/// Whether the emulator knows `name` (so an unauthenticated client gets 13 Unauthorized for
/// it, and 59 CommandNotFound for anything else, as from mongod).
fn is_known_command(name: &str) -> bool {
    hello::is_hello(name)
        || ADMIN_COMMANDS.contains(&name)
        || auth::is_auth_command(name)
        || data::is_data_command(name)
}

/// Runs a command under the state lock.
/// The generator of a fail point's `activationProbability` draws for one request: seeded from
/// the request's key when the lab names it (the model's common random numbers, so every variant
/// meets the same fail points for the same request and attempt), else from the thread's
/// generator.
fn fail_point_rng(key: Option<u64>) -> StdRng {
    match key {
        Some(key) => StdRng::seed_from_u64(key),
        None => StdRng::from_rng(&mut rand::rng()),
    }
}

#[allow(clippy::too_many_arguments)]
fn execute(
    shared: &Arc<Shared>,
    member: &Member,
    conn: &mut ConnCtx,
    name: &str,
    db: &str,
    body: &Document,
    g: &Generic,
    after: &mut WriteFaults,
) -> Result<Document, CommandError> {
    let admin_only = |n: &str| -> Result<(), CommandError> {
        if db != "admin" {
            return Err(CommandError::new(
                codes::UNAUTHORIZED,
                format!("{n} may only be run against the admin database."),
            ));
        }
        Ok(())
    };
    match name {
        "ping" => Ok(ok()),
        "buildInfo" | "buildinfo" => Ok(build_info(shared)),
        "getParameter" => get_parameter(shared, member, body),
        "setParameter" => {
            admin_only(name)?;
            set_parameter(shared, member, body)
        }
        "serverStatus" => Ok(server_status(shared, member)),
        "configureFailPoint" => {
            admin_only(name)?;
            configure_fail_point(member, body)
        }
        "labClientMetadata" => {
            let md: Vec<Bson> = lock(&shared.metadata)
                .iter()
                .cloned()
                .map(Bson::Document)
                .collect();
            Ok(doc! { "metadata": md, "ok": 1.0 })
        }
        "endSessions" | "killSessions" => {
            let lsids = match body.get(name) {
                Some(Bson::Array(a)) => a.clone(),
                _ => {
                    return Err(CommandError::type_mismatch(format!(
                        "'{name}' must be an array of session ids"
                    )))
                }
            };
            let mut st = shared.state();
            for l in lsids {
                if let Bson::Document(l) = l {
                    let key = SessionKey::from_lsid(&l);
                    st.sessions.end(&key);
                    st.cursors.close_session(&key);
                }
            }
            Ok(ok())
        }
        "killAllSessions" | "killAllSessionsByPattern" => {
            let mut st = shared.state();
            st.sessions.kill_all();
            st.cursors.close_all_sessions();
            Ok(ok())
        }
        "refreshSessions" => Ok(ok()),
        "startSession" => {
            let id = bson::Binary {
                subtype: bson::spec::BinarySubtype::Uuid,
                bytes: bson::Uuid::new().bytes().to_vec(),
            };
            Ok(
                doc! { "id": { "id": id }, "timeoutMinutes": shared.config.logical_session_timeout_minutes, "ok": 1.0 },
            )
        }
        "commitTransaction" | "abortTransaction" => {
            admin_only(name)?;
            check_role(shared, member, name, body, g)?;
            end_transaction(shared, name, g)
        }
        "whatsmyuri" => Ok(doc! { "you": conn.peer.to_string(), "ok": 1.0 }),
        // mongos 7.0+: the emulator's single catalog is always consistent, so the cursor of
        // inconsistencies is empty.
        "checkMetadataConsistency" if member.role == Role::Mongos => Ok(doc! {
            "cursor": { "id": 0i64, "ns": format!("{db}.$cmd.checkMetadataConsistency"), "firstBatch": [] },
            "ok": 1.0,
        }),
        "getCmdLineOpts" => Ok(doc! { "argv": ["labd"], "parsed": {}, "ok": 1.0 }),
        "hostInfo" => Ok(
            doc! { "system": { "hostname": member.host.clone() }, "os": {}, "extra": {}, "ok": 1.0 },
        ),
        "getLog" => Ok(doc! { "totalLinesWritten": 0i32, "log": [], "ok": 1.0 }),
        "replSetStepDown" => {
            admin_only(name)?;
            repl::step_down_command(shared, member, body)
        }
        "replSetFreeze" => {
            admin_only(name)?;
            repl::freeze_command(shared, member, body)
        }
        "currentOp" => current_op::command(&member.host, conn, db, body),
        "explain" => {
            // Explain is a read: a secondary answers it only with secondaryOk, as a find.
            check_role(shared, member, "find", body, g)?;
            let st = shared.state();
            explain::explain(
                &st.store,
                db,
                body,
                &member.host,
                &shared.config.server_version,
            )
        }
        // A router has no replica-set state: mongos does not know the command (59 below).
        "replSetGetStatus" if member.role != Role::Mongos => {
            admin_only(name)?;
            repl::status_command(shared, member)
        }
        "dbStats" => {
            let st = shared.state();
            match (shared.sharding.as_ref(), member.role) {
                (Some(sharding), Role::Mongos) => {
                    db_stats::run_on_router(&st.store, sharding, db, body)
                }
                _ => db_stats::run(&st.store, db, body),
            }
        }
        "enableSharding" | "shardCollection" | "split" | "moveChunk" | "listShards"
        | "labShardingState" => {
            let Some(sharding) = shared
                .sharding
                .as_ref()
                .filter(|_| member.role == Role::Mongos)
            else {
                return Err(CommandError::new(
                    codes::COMMAND_NOT_FOUND,
                    format!("no such command: '{name}' (sharding commands are served by the routers of a sharded deployment)"),
                ));
            };
            admin_only(name)?;
            sharding_command(shared, sharding, name, body)
        }
        // Like a mongod without mongot: the commands exist (so fail points and retries
        // apply to them) but always fail.
        "createSearchIndexes" | "updateSearchIndex" | "dropSearchIndex" => {
            Err(CommandError::search_not_enabled())
        }
        n if auth::is_auth_command(n) => auth::run(shared, &mut conn.auth, n, db, body),
        n if data::is_data_command(n) => {
            check_role(shared, member, name, body, g)?;
            run_data_command(shared, member, conn, name, db, body, g, after)
        }
        other => Err(CommandError::new(
            codes::COMMAND_NOT_FOUND,
            format!("no such command: '{other}'"),
        )),
    }
}

/// The sharding commands a router answers itself (module `sharding`).
fn sharding_command(
    shared: &Shared,
    sharding: &Sharding,
    name: &str,
    body: &Document,
) -> Result<Document, CommandError> {
    match name {
        "enableSharding" => sharding.enable_sharding(body),
        "shardCollection" => {
            let ((db, coll), reply) = sharding.shard_collection(body)?;
            // mongos creates the collection when it does not exist yet.
            let mut st = shared.state();
            if !st.store.has_collection(&db, &coll) {
                if let Err(e) = st.store.create_collection(&db, &coll, &Document::new()) {
                    sharding.forget_collection(&db, Some(&coll));
                    return Err(e.into());
                }
                st.write_version += 1;
            }
            Ok(reply)
        }
        "split" => sharding.split(body),
        "moveChunk" => sharding.move_chunk(body),
        "listShards" => Ok(sharding.list_shards()),
        _ => Ok(sharding.state_document()),
    }
}

fn check_role(
    shared: &Shared,
    member: &Member,
    name: &str,
    body: &Document,
    g: &Generic,
) -> Result<(), CommandError> {
    if repl::role(shared, member) != Role::Secondary {
        return Ok(());
    }
    let writes = data::is_write(name)
        || matches!(name, "commitTransaction" | "abortTransaction")
        || (name == "aggregate" && data::pipeline_writes(body));
    if writes {
        return Err(CommandError::new(
            codes::NOT_WRITABLE_PRIMARY,
            "not primary",
        ));
    }
    if data::is_read(name) && !g.secondary_ok {
        return Err(CommandError::new(
            codes::NOT_PRIMARY_NO_SECONDARY_OK,
            "not primary and secondaryOk=false",
        ));
    }
    Ok(())
}

fn local_sessions(st: &State) -> Vec<Document> {
    let now = std::time::Instant::now();
    st.sessions
        .list()
        .into_iter()
        .map(|(lsid, last)| {
            let mut id = lsid.clone();
            id.insert(
                "uid",
                bson::Binary {
                    subtype: bson::spec::BinarySubtype::Generic,
                    bytes: vec![0u8; 32],
                },
            );
            let ago = now.saturating_duration_since(last);
            let last_use =
                DateTime::from_millis(DateTime::now().timestamp_millis() - ago.as_millis() as i64);
            doc! { "_id": id, "lastUse": last_use }
        })
        .collect()
}

fn wants_local_sessions(name: &str, body: &Document) -> bool {
    name == "aggregate"
        && matches!(body.get_array("pipeline").ok().and_then(|p| p.first()),
            Some(Bson::Document(d)) if d.contains_key("$listLocalSessions"))
}

fn has_write_errors(reply: &Document) -> bool {
    reply.contains_key("writeErrors") || reply.get_i32("nErrors").is_ok_and(|n| n > 0)
}

/// Runs a data command with session, retryable-write and transaction semantics.
#[allow(clippy::too_many_arguments)]
fn run_data_command(
    shared: &Shared,
    member: &Member,
    conn: &ConnCtx,
    name: &str,
    db: &str,
    body: &Document,
    g: &Generic,
    after: &mut WriteFaults,
) -> Result<Document, CommandError> {
    let cfg = &shared.config;
    if g.txn_number.is_some() && !shared.is_replicated() {
        return Err(CommandError::new(
            codes::ILLEGAL_OPERATION,
            "Transaction numbers are only allowed on a replica set member or mongos",
        ));
    }
    let mut guard = shared.state();
    let key = g.lsid.as_ref().map(SessionKey::from_lsid);
    if let (Some(key), Some(lsid)) = (&key, &g.lsid) {
        guard.sessions.touch(key, lsid, cfg.max_sessions);
    }
    // After the touch: like mongod's session cache, the list holds the command's own session.
    let current_ops = if name == "aggregate" {
        current_op::stage_input(&member.host, conn, db, body)?
    } else {
        None
    };
    let local = if wants_local_sessions(name, body) {
        Some(local_sessions(&guard))
    } else {
        None
    };
    let st = &mut *guard;
    let replicated = shared.is_replicated();
    // A snapshot read outside a transaction reads a recorded copy of the store (`snapshot.rs`).
    let snapshot_read = match snapshot::requested(body).filter(|_| g.autocommit.is_none()) {
        Some(at) => {
            if let Some(refused) = snapshot::refusal(name, body, replicated) {
                return Err(refused);
            }
            Some(match at {
                Some(at) => (at, st.snapshots.at(at)?),
                None => {
                    let now = st.tick();
                    let copy = st.store.clone();
                    st.snapshots.record(now, &copy);
                    (now, copy)
                }
            })
        }
        None => None,
    };
    let bulk_write_batch_size = match st.params.values.get("labBulkWriteBatchSize") {
        Some(Bson::Int32(n)) if *n > 0 => usize::try_from(*n).ok(),
        _ => None,
    };
    // Writes outside transactions feed the change log (transactions feed it at commit).
    let capture = if g.autocommit.is_none() {
        Capture::take(
            &st.changes,
            &st.store,
            data::write_targets(name, db, body),
            changes::is_replacement(name, body),
        )
    } else {
        None
    };
    let mut ctx = DataCtx {
        conn_serial: conn.serial,
        lsid: key.clone(),
        max_cursors_per_connection: cfg.max_cursors_per_connection,
        max_cursors: cfg.max_cursors,
        replicated,
        local_sessions: local,
        current_ops,
        cursors: &mut st.cursors,
        changes: &mut st.changes,
        bulk_write_batch_size,
    };

    if let Some((at, mut view)) = snapshot_read {
        let mut reply = data::run(name, db, body, &mut view, &mut ctx)?;
        snapshot::stamp(&mut reply, at);
        return Ok(reply);
    }

    // Transaction statement.
    if g.autocommit.is_some() {
        if g.autocommit == Some(true) {
            return Err(CommandError::bad_value("autocommit may only be false"));
        }
        let (Some(key), Some(lsid), Some(n)) = (&key, &g.lsid, g.txn_number) else {
            return Err(CommandError::bad_value(
                "transactions need lsid and txnNumber",
            ));
        };
        let session = st.sessions.touch(key, lsid, cfg.max_sessions);
        if g.start_transaction {
            if session.txn_number.is_some_and(|cur| n < cur) {
                return Err(CommandError::new(
                    codes::TRANSACTION_TOO_OLD,
                    format!("Cannot start transaction {n} on session because a newer transaction has already started"),
                ));
            }
            let replacing = session
                .txn
                .as_ref()
                .is_some_and(|t| t.state == TxnState::InProgress);
            if !replacing && st.sessions.open_transactions() >= cfg.max_transactions {
                return Err(CommandError::new(
                    codes::OPERATION_FAILED,
                    format!(
                        "too many transactions in progress (the emulator allows {})",
                        cfg.max_transactions
                    ),
                ));
            }
            let session = st.sessions.touch(key, lsid, cfg.max_sessions);
            session.txn_number = Some(n);
            session.retry_reply = None;
            session.partial_write = None;
            session.txn = Some(Transaction {
                started: std::time::Instant::now(),
                number: n,
                state: TxnState::InProgress,
                snapshot: Some(st.store.clone()),
                base_version: st.write_version,
                writes: Vec::new(),
                written: Default::default(),
            });
        }
        let session = st.sessions.touch(key, lsid, cfg.max_sessions);
        let Some(txn) = session
            .txn
            .as_mut()
            .filter(|t| t.number == n && t.state == TxnState::InProgress)
        else {
            return Err(no_such_transaction(n, session.txn_number));
        };
        let Some(snapshot) = txn.snapshot.as_mut() else {
            return Err(no_such_transaction(n, session.txn_number));
        };
        // Which documents the statement changes, for write-conflict detection between
        // transactions (the engine does not report them, so compare before and after).
        let targets = data::write_targets(name, db, body);
        let before: Vec<Vec<Document>> = targets
            .iter()
            .map(|(d, c)| snapshot.documents(d, c).to_vec())
            .collect();
        let result = data::run(name, db, body, snapshot, &mut ctx);
        let succeeded = matches!(&result, Ok(reply) if !has_write_errors(reply));
        let mut touched = std::collections::BTreeSet::new();
        if succeeded {
            for ((d, c), old) in targets.iter().zip(&before) {
                for id in data::changed_ids(old, snapshot.documents(d, c)) {
                    touched.insert((format!("{d}.{c}"), id));
                }
            }
        }
        let conflict = succeeded && st.sessions.conflicts(key, &touched);
        let Some(txn) = st.sessions.get_mut(key).and_then(|s| s.txn.as_mut()) else {
            return result;
        };
        if succeeded && !conflict {
            if data::is_write(name) || (name == "aggregate" && data::pipeline_writes(body)) {
                txn.writes.push((db.to_string(), body.clone()));
            }
            txn.written.extend(touched);
            return result;
        }
        tracing::debug!(
            txn = n,
            command = name,
            conflict,
            "statement failed; transaction aborted"
        );
        txn.state = TxnState::Aborted;
        txn.snapshot = None;
        txn.writes.clear();
        txn.written.clear();
        if conflict {
            return Err(CommandError::new(
                112,
                "Write conflict during plan execution and yielding is disabled. :: Please retry your write.",
            ));
        }
        return result;
    }

    // Retryable write.
    if let (Some(key), Some(lsid), Some(n), true) =
        (&key, &g.lsid, g.txn_number, data::is_retryable_write(name))
    {
        let session = st.sessions.touch(key, lsid, cfg.max_sessions);
        match session.txn_number {
            Some(cur) if n < cur => {
                return Err(CommandError::new(
                    codes::TRANSACTION_TOO_OLD,
                    format!("Retryable write with txnNumber {n} is prohibited on session because a newer retryable write with txnNumber {cur} has already started on this session."),
                ))
            }
            Some(cur) if n == cur => {
                if let Some(stored) = &session.retry_reply {
                    tracing::debug!(txn = n, command = name, "retryable write already executed; returning stored reply");
                    return Ok(stored.clone());
                }
            }
            _ => {
                session.txn_number = Some(n);
                session.retry_reply = None;
                session.partial_write = None;
                session.txn = None;
            }
        }
        // mongod evaluates `onPrimaryTransactionalWrite` once per statement written, so
        // `skip: n` lets n statements (documents, updates, deletes) through, in order; a retry
        // does not evaluate it again for statements an earlier attempt applied.
        let earlier = st
            .sessions
            .get_mut(key)
            .and_then(|s| s.partial_write.take());
        let applied = earlier
            .as_ref()
            .map(|p| p.applied.clone())
            .unwrap_or_default();
        let mut plan = failpoint::plan_statement_failures(
            &mut lock(&member.primary_write_fail_point),
            name,
            body,
            &applied,
            &mut fail_point_rng(after.draws),
        );
        if let Some(rejections) = &after.shard_rejections {
            // A retryable write's statements are single-document ones: a statement one of its
            // shards rejected runs nowhere.
            let total = failpoint::statement_count(name, body);
            plan.add_shard_rejections(&rejections.accepted, &rejections.failing, &applied, total);
        }
        after.close = plan.close_after;
        after.step_down = plan.step_down_after;
        if !failpoint::has_statement_errors(name) && !plan.failing.is_empty() {
            // findAndModify and client bulkWrite: the failure is the command's, before any
            // of its statements is applied.
            let first = &plan.failing[0];
            return Err(CommandError::new(first.code, first.errmsg.clone()));
        }
        if failpoint::has_statement_errors(name) && (!plan.failing.is_empty() || earlier.is_some())
        {
            // Only the statements that neither failed nor were applied before run; the
            // failures are write errors at their own indexes, as mongod reports them.
            let reply = match failpoint::with_statements(name, body, &plan.run) {
                Some(sub) => Some(data::run(name, db, &sub, &mut st.store, &mut ctx)?),
                None => None,
            };
            st.write_version += 1;
            record_changes(shared, st, capture);
            let (reply, partial) =
                failpoint::merge_statement_results(name, reply, &plan, earlier.as_ref());
            if let Some(session) = st.sessions.get_mut(key) {
                if partial.is_none() && !has_write_errors(&reply) {
                    session.retry_reply = Some(reply.clone());
                }
                session.partial_write = partial;
            }
            return Ok(reply);
        }
        let result = data::run(name, db, body, &mut st.store, &mut ctx);
        st.write_version += 1;
        record_changes(shared, st, capture);
        if let Ok(reply) = &result {
            if !has_write_errors(reply) {
                if let Some(session) = st.sessions.get_mut(key) {
                    session.retry_reply = Some(reply.clone());
                }
            }
        }
        return result;
    }

    // A batch write some of whose statements a router's target shards rejected: only the
    // accepted statements run; the rejected ones are write errors.
    if let Some(rejections) = after.shard_rejections.take() {
        let total = failpoint::statement_count(name, body);
        let mut plan = failpoint::StatementPlan::every_statement(name, body);
        plan.add_shard_rejections(&rejections.accepted, &rejections.failing, &[], total);
        // A multi-document statement also runs on the documents of the shards that accepted
        // it (it is still reported failed): mongos's shards apply their parts independently.
        let restricted = shared.sharding.as_ref().and_then(|sharding| {
            restrict_to_shards(
                sharding,
                &st.store,
                name,
                db,
                body,
                &rejections.partly_accepted,
            )
        });
        if let Some((_, indexes)) = &restricted {
            plan.run.extend(indexes);
            plan.run.sort_unstable();
            plan.run.dedup();
        }
        let body = restricted.as_ref().map_or(body, |(b, _)| b);
        let reply = match failpoint::with_statements(name, body, &plan.run) {
            Some(sub) => Some(data::run(name, db, &sub, &mut st.store, &mut ctx)?),
            None => None,
        };
        st.write_version += 1;
        record_changes(shared, st, capture);
        let (reply, _) = failpoint::merge_statement_results(name, reply, &plan, None);
        return Ok(reply);
    }
    let catalog_before = catalog_facts(name, db, body, &st.store);
    let result = data::run(name, db, body, &mut st.store, &mut ctx);
    if data::is_write(name) || (name == "aggregate" && data::pipeline_writes(body)) {
        st.write_version += 1;
    }
    record_changes(shared, st, capture);
    if let (Ok(reply), Some(before)) = (&result, catalog_before) {
        let key = (db.to_string(), before.coll.clone());
        match name {
            "collMod" => {
                let images = body.get_document("changeStreamPreAndPostImages").ok();
                match images.map(|i| i.get_bool("enabled") == Ok(true)) {
                    Some(true) => {
                        st.pre_post_images.insert(key);
                    }
                    Some(false) => {
                        st.pre_post_images.remove(&key);
                    }
                    None => {}
                }
            }
            "drop" => {
                st.pre_post_images.remove(&key);
            }
            _ => {}
        }
        record_catalog_change(shared, st, name, db, body, reply, before);
    }
    result
}

/// `body` with each multi-document statement of `partly_accepted` (an `update` with
/// `multi: true`, a `delete` with `limit: 0`) limited to the documents the shards that
/// accepted it own (its filter ANDed with their `_id`s), and those statements' indexes; None
/// when there is none.
fn restrict_to_shards(
    sharding: &Sharding,
    store: &Store,
    name: &str,
    db: &str,
    body: &Document,
    partly_accepted: &[(usize, Vec<usize>)],
) -> Option<(Document, Vec<usize>)> {
    let (field, coll) = match (name, body.get(name)) {
        ("update", Some(Bson::String(c))) => ("updates", c.as_str()),
        ("delete", Some(Bson::String(c))) => ("deletes", c.as_str()),
        _ => return None,
    };
    let mut statements = body.get_array(field).ok()?.clone();
    let mut restricted = Vec::new();
    for (index, shards) in partly_accepted {
        let Some(Bson::Document(statement)) = statements.get_mut(*index) else {
            continue;
        };
        let multi = match name {
            "update" => matches!(statement.get("multi"), Some(Bson::Boolean(true))),
            _ => matches!(
                statement.get("limit"),
                Some(Bson::Int32(0) | Bson::Int64(0))
            ),
        };
        if !multi {
            continue;
        }
        let ids: Vec<Bson> = store
            .documents(db, coll)
            .iter()
            .filter(|d| shards.contains(&sharding.owner_of_document(db, coll, d)))
            .filter_map(|d| d.get("_id").cloned())
            .collect();
        let filter = statement.get_document("q").cloned().unwrap_or_default();
        statement.insert("q", doc! { "$and": [filter, { "_id": { "$in": ids } }] });
        restricted.push(*index);
    }
    if restricted.is_empty() {
        return None;
    }
    let mut body = body.clone();
    body.insert(field, statements);
    Some((body, restricted))
}

/// The collection a catalog command names, and whether it existed before the command ran.
struct CatalogFacts {
    coll: String,
    existed: bool,
}

/// For catalog commands that make change events (`create`, `drop`, `createIndexes`,
/// `dropIndexes`, `collMod`), what the event needs from before the command.
fn catalog_facts(name: &str, db: &str, body: &Document, store: &Store) -> Option<CatalogFacts> {
    if !matches!(
        name,
        "create" | "drop" | "createIndexes" | "dropIndexes" | "collMod"
    ) {
        return None;
    }
    let coll = body.get_str(name).ok()?.to_string();
    let existed = store.has_collection(db, &coll);
    Some(CatalogFacts { coll, existed })
}

/// Records the change event of a catalog command that succeeded, as mongod 6.0+ reports them:
/// `drop` (and the `invalidate` of the streams on the collection) to every stream, the others
/// (`create`, `createIndexes`, `dropIndexes`, `modify`) only to streams with
/// `showExpandedEvents`. A collection created implicitly by a write makes no `create` event
/// here (mongod's does).
fn record_catalog_change(
    shared: &Shared,
    st: &mut State,
    name: &str,
    db: &str,
    body: &Document,
    reply: &Document,
    before: CatalogFacts,
) {
    if !st.changes.enabled {
        return;
    }
    let coll = before.coll.as_str();
    let ns = doc! { "db": db, "coll": coll };
    let (event, expanded) = match name {
        "drop" if before.existed => (doc! { "operationType": "drop", "ns": ns }, false),
        "create" if !before.existed => {
            let (description, ns_type) = match body.get_str("viewOn") {
                Ok(view_on) => (
                    doc! {
                        "viewOn": view_on,
                        "pipeline": body.get("pipeline").cloned().unwrap_or(Bson::Array(Vec::new())),
                    },
                    "view",
                ),
                Err(_) => (
                    doc! { "idIndex": { "v": 2, "key": { "_id": 1 }, "name": "_id_" } },
                    "collection",
                ),
            };
            (
                doc! {
                    "operationType": "create",
                    "ns": ns,
                    "operationDescription": description,
                    "nsType": ns_type,
                },
                true,
            )
        }
        "createIndexes" => {
            let created = match (reply.get("numIndexesBefore"), reply.get("numIndexesAfter")) {
                (Some(b), Some(a)) => b != a,
                _ => true,
            };
            if !created {
                return;
            }
            let indexes = body
                .get("indexes")
                .cloned()
                .unwrap_or(Bson::Array(Vec::new()));
            (
                doc! {
                    "operationType": "createIndexes",
                    "ns": ns,
                    "operationDescription": { "indexes": indexes },
                },
                true,
            )
        }
        "dropIndexes" => {
            let index = body.get("index").cloned().unwrap_or(Bson::Null);
            (
                doc! {
                    "operationType": "dropIndexes",
                    "ns": ns,
                    "operationDescription": { "indexes": [index] },
                },
                true,
            )
        }
        "collMod" => {
            let mut description = body.clone();
            description.remove("collMod");
            for field in data::GENERIC_FIELDS {
                description.remove(*field);
            }
            (
                doc! { "operationType": "modify", "ns": ns, "operationDescription": description },
                true,
            )
        }
        _ => return,
    };
    let ts = st.tick();
    st.changes.record_catalog(db, coll, ts, event, expanded);
    shared.changes_notify.notify_waiters();
}

/// mongod's write concern error for a numeric `w` above the number of data-bearing members.
fn unsatisfiable_write_concern(shared: &Shared, body: &Document) -> Option<Document> {
    let wc = body.get_document("writeConcern").ok()?;
    let w = match wc.get("w")? {
        Bson::Int32(w) => i64::from(*w),
        Bson::Int64(w) => *w,
        Bson::Double(w) => *w as i64,
        _ => return None,
    };
    let nodes = shared
        .config
        .write_concern_nodes
        .unwrap_or(match &shared.config.topology {
            super::Topology::Standalone => 1,
            super::Topology::ReplicaSet { members, .. } => (*members).max(3),
            super::Topology::Sharded { .. } => 3,
        });
    if w <= nodes as i64 {
        return None;
    }
    Some(doc! {
        "code": 100,
        "codeName": "UnsatisfiableWriteConcern",
        "errmsg": "Not enough data-bearing nodes",
        "errInfo": { "writeConcern": wc.clone() },
    })
}

/// `maxTimeMS` of a command (absent or 0: no limit).
fn max_time_ms(body: &Document) -> Option<Duration> {
    let ms = match body.get("maxTimeMS")? {
        Bson::Int32(i) => i64::from(*i),
        Bson::Int64(i) => *i,
        Bson::Double(d) if d.is_finite() => *d as i64,
        _ => return None,
    };
    (ms > 0).then(|| Duration::from_millis(ms as u64))
}

fn is_not_primary_code(code: i32) -> bool {
    matches!(code, 10107 | 13435 | 13436 | 11602 | 189)
}

fn is_shutdown_code(code: i32) -> bool {
    matches!(code, 91 | 11600)
}

/// The error reply of an overload-model rejection (its labels are final).
/// The reply to a request the overload model rejected (before it reached the engine).
fn rejected(
    shared: &Shared,
    member: &Arc<Member>,
    r: &Rejection,
    label_ctx: LabelContext,
) -> Outcome {
    Outcome::Reply(finish(
        shared,
        member,
        Err(rejection_error(r)),
        label_ctx,
        None,
        None,
    ))
}

fn rejection_error(r: &Rejection) -> CommandError {
    CommandError {
        code: r.code,
        code_name: std::borrow::Cow::Borrowed(r.code_name),
        errmsg: r.errmsg.clone(),
        // 462/433 carry fixed labels; for 50 and 279 the server's usual rules apply (for
        // example TransientTransactionError inside a transaction).
        labels: r.fixed_labels(),
        extra: None,
    }
}

/// Turns a capture taken before a write into change events.
fn record_changes(shared: &Shared, st: &mut State, capture: Option<Capture>) {
    if let Some(c) = capture {
        let ts = st.tick();
        let images = &st.pre_post_images;
        c.finish(&mut st.changes, &st.store, ts, |d, c| {
            images.contains(&(d.to_string(), c.to_string()))
        });
        shared.changes_notify.notify_waiters();
    }
}

fn no_such_transaction(n: i64, active: Option<i64>) -> CommandError {
    let msg = match active {
        Some(a) => format!("Given transaction number {n} does not match any in-progress transactions. The active transaction number is {a}"),
        None => format!("Given transaction number {n} does not match any in-progress transactions."),
    };
    CommandError::new(codes::NO_SUCH_TRANSACTION, msg)
}

fn end_transaction(shared: &Shared, name: &str, g: &Generic) -> Result<Document, CommandError> {
    if !shared.is_replicated() {
        return Err(CommandError::new(
            codes::ILLEGAL_OPERATION,
            "Transaction numbers are only allowed on a replica set member or mongos",
        ));
    }
    let (Some(lsid), Some(n)) = (&g.lsid, g.txn_number) else {
        return Err(CommandError::bad_value(format!(
            "{name} requires lsid and txnNumber"
        )));
    };
    let key = SessionKey::from_lsid(lsid);
    let mut guard = shared.state();
    let st = &mut *guard;
    let session = st.sessions.touch(&key, lsid, shared.config.max_sessions);
    let active = session.txn_number;
    let Some(txn) = session.txn.as_mut().filter(|t| t.number == n) else {
        return Err(no_such_transaction(n, active));
    };
    let commit = name == "commitTransaction";
    match (txn.state, commit) {
        (TxnState::InProgress, true) => {
            let snapshot = txn.snapshot.take();
            let writes = std::mem::take(&mut txn.writes);
            txn.state = TxnState::Committed;
            let base = txn.base_version;
            if !writes.is_empty() {
                let mut targets: Vec<(String, String)> = Vec::new();
                for (db, body) in &writes {
                    let cmd = body.keys().next().map(String::as_str).unwrap_or_default();
                    for t in data::write_targets(cmd, db, body) {
                        if !targets.contains(&t) {
                            targets.push(t);
                        }
                    }
                }
                let capture = Capture::take(&st.changes, &st.store, targets, false);
                match snapshot {
                    // Nothing else wrote since the transaction started: its copy is the new state.
                    Some(snap) if base == st.write_version => st.store = snap,
                    _ => {
                        let mut scratch = super::cursor::Cursors::default();
                        let mut scratch_log = changes::ChangeLog::default();
                        let mut ctx = DataCtx {
                            conn_serial: 0,
                            lsid: None,
                            max_cursors_per_connection: 0,
                            max_cursors: 0,
                            replicated: true,
                            local_sessions: None,
                            current_ops: None,
                            cursors: &mut scratch,
                            changes: &mut scratch_log,
                            bulk_write_batch_size: None,
                        };
                        for (db, body) in &writes {
                            let cmd = body.keys().next().cloned().unwrap_or_default();
                            if let Err(e) = data::run(&cmd, db, body, &mut st.store, &mut ctx) {
                                tracing::warn!(error = ?e, "replaying a committed transaction write failed");
                            }
                        }
                    }
                }
                st.write_version += 1;
                record_changes(shared, st, capture);
            }
            Ok(ok())
        }
        (TxnState::Committed, true) => Ok(ok()),
        (TxnState::Aborted, true) => Err(no_such_transaction(n, active)),
        (TxnState::InProgress, false) => {
            txn.state = TxnState::Aborted;
            txn.snapshot = None;
            txn.writes.clear();
            Ok(ok())
        }
        (TxnState::Committed, false) => Err(CommandError::new(
            codes::TRANSACTION_COMMITTED,
            "Cannot abort a transaction that has already been committed",
        )),
        (TxnState::Aborted, false) => Err(no_such_transaction(n, active)),
    }
}

fn build_info(shared: &Shared) -> Document {
    let mut parts: Vec<i32> = shared
        .config
        .server_version
        .split(['.', '-'])
        .take(3)
        .map(|p| p.parse::<i32>().unwrap_or(0))
        .collect();
    parts.resize(3, 0);
    parts.push(0);
    doc! {
        "version": shared.config.server_version.clone(),
        "gitVersion": "0000000000000000000000000000000000000000",
        "versionArray": parts,
        "bits": 64i32,
        "debug": false,
        "maxBsonObjectSize": crate::wire::MAX_BSON_OBJECT_SIZE,
        "storageEngines": ["inMemory"],
        "modules": [],
        "ok": 1.0,
    }
}

/// The parameter holding the receiving member's overload model configuration.
const LAB_OVERLOAD: &str = "labOverload";
/// The parameter addressing every member's overload model by index (lab-only).
const LAB_OVERLOAD_MEMBERS: &str = "labOverloadMembers";
/// The parameter addressing every shard's overload model by index (lab-only, sharded
/// deployments).
const LAB_OVERLOAD_SHARDS: &str = "labOverloadShards";
/// The key of `labOverloadMembers` / `labOverloadShards` that addresses every model.
const ALL_MEMBERS: &str = "all";

/// The models one of the parameters above addresses, by index.
fn member_models(shared: &Shared) -> Vec<(usize, &crate::model::Model)> {
    shared
        .members
        .iter()
        .map(|m| (m.index, &*m.model))
        .collect()
}

fn shard_models(shared: &Shared) -> Vec<(usize, &crate::model::Model)> {
    shared
        .sharding
        .iter()
        .flat_map(|s| s.shards.iter().map(|shard| (shard.index, &*shard.model)))
        .collect()
}

/// `{"0": <config>, "1": <config>, ...}`: the models' configurations.
fn model_configs(models: &[(usize, &crate::model::Model)]) -> Document {
    models
        .iter()
        .map(|(index, model)| {
            (
                index.to_string(),
                Bson::Document(model.config().to_document()),
            )
        })
        .collect()
}

/// The value of `getParameter` for `labOverloadMembers` or `labOverloadShards`.
fn lab_models_parameter(shared: &Shared, name: &str) -> Option<Document> {
    match name {
        LAB_OVERLOAD_MEMBERS => Some(model_configs(&member_models(shared))),
        LAB_OVERLOAD_SHARDS => Some(model_configs(&shard_models(shared))),
        _ => None,
    }
}

fn get_parameter(
    shared: &Shared,
    member: &Member,
    body: &Document,
) -> Result<Document, CommandError> {
    let st = shared.state();
    let params = &st.params.values;
    let all = matches!(body.get("getParameter"), Some(Bson::String(s)) if s == "*")
        || matches!(body.get("getParameter"), Some(Bson::Document(d)) if d.get_bool("allParameters").unwrap_or(false));
    let mut r = Document::new();
    if all {
        for (k, v) in params {
            r.insert(k.clone(), v.clone());
        }
        r.insert(LAB_OVERLOAD, member.model.config().to_document());
        r.insert(LAB_OVERLOAD_MEMBERS, model_configs(&member_models(shared)));
        if shared.sharding.is_some() {
            r.insert(LAB_OVERLOAD_SHARDS, model_configs(&shard_models(shared)));
        }
        r.insert(mangle::PARAMETER, shared.mangler.parameter_document());
    } else {
        for (k, _) in body.iter().skip(1) {
            if data::GENERIC_FIELDS.contains(&k.as_str()) {
                continue;
            }
            if k == LAB_OVERLOAD {
                r.insert(k.clone(), member.model.config().to_document());
                continue;
            }
            if let Some(configs) = lab_models_parameter(shared, k) {
                r.insert(k.clone(), configs);
                continue;
            }
            if k == mangle::PARAMETER {
                r.insert(k.clone(), shared.mangler.parameter_document());
                continue;
            }
            match params.get(k) {
                Some(v) => {
                    r.insert(k.clone(), v.clone());
                }
                None => {
                    return Err(CommandError::new(
                        codes::INVALID_OPTIONS,
                        format!("no option found to get: {k}"),
                    ));
                }
            }
        }
        if r.is_empty() {
            return Err(CommandError::new(
                codes::INVALID_OPTIONS,
                "no option found to get",
            ));
        }
    }
    r.insert("ok", 1.0);
    Ok(r)
}

/// Applies `labOverloadMembers` or `labOverloadShards` (`parameter`): `{"<index>" | "all":
/// {<partial labOverload>}, ...}` in document order (so `{all: {...}, "1": {...}}` sets every
/// model, then model 1). Every entry is checked against the configuration it will merge into
/// before any is applied, so a bad entry changes nothing. Returns the configurations before, by
/// index.
fn set_models(
    parameter: &str,
    models: &[(usize, &crate::model::Model)],
    value: &Bson,
) -> Result<Document, CommandError> {
    let what = if parameter == LAB_OVERLOAD_SHARDS {
        "shard"
    } else {
        "member"
    };
    let Bson::Document(entries) = value else {
        return Err(CommandError::type_mismatch(format!(
            "{parameter} must be a document of {what} index (or \"{ALL_MEMBERS}\") to labOverload settings"
        )));
    };
    if models.is_empty() {
        return Err(CommandError::bad_value(format!(
            "{parameter}: the deployment has no {what}s (it is not sharded)"
        )));
    }
    let mut plan: Vec<(usize, &crate::model::Model, &Document)> = Vec::new();
    for (key, changes) in entries {
        let Bson::Document(changes) = changes else {
            return Err(CommandError::type_mismatch(format!(
                "{parameter}.{key} must be a document"
            )));
        };
        if key == ALL_MEMBERS {
            plan.extend(models.iter().map(|(i, m)| (*i, *m, changes)));
            continue;
        }
        let target = key
            .parse::<usize>()
            .ok()
            .and_then(|i| models.iter().find(|(index, _)| *index == i))
            .ok_or_else(|| {
                CommandError::bad_value(format!(
                    "{parameter}: no {what} {key:?} ({what}s are 0 to {}, or \"{ALL_MEMBERS}\")",
                    models.len().saturating_sub(1)
                ))
            })?;
        plan.push((target.0, target.1, changes));
    }
    // Dry run: each model's entries merged in order must give a valid configuration.
    for (index, model) in models {
        let mut cfg = (*model.config()).clone();
        for (_, _, changes) in plan.iter().filter(|(i, _, _)| i == index) {
            cfg = cfg
                .merged(changes)
                .map_err(|e| CommandError::bad_value(format!("{parameter}.{index}: {e}")))?;
        }
    }
    let before = model_configs(models);
    for (index, model, changes) in plan {
        model
            .set_parameters(changes)
            .map_err(|e| CommandError::bad_value(format!("{parameter}.{index}: {e}")))?;
        tracing::info!(parameter, index, value = %changes, "setParameter");
    }
    Ok(before)
}

fn set_parameter(
    shared: &Shared,
    member: &Member,
    body: &Document,
) -> Result<Document, CommandError> {
    let mut st = shared.state();
    let mut was = None;
    let mut changed = Vec::new();
    for (k, v) in body.iter().skip(1) {
        if data::GENERIC_FIELDS.contains(&k.as_str()) {
            continue;
        }
        if k == LAB_OVERLOAD {
            // The overload model's configuration: a partial document merges into the current one.
            let Bson::Document(changes) = v else {
                return Err(CommandError::type_mismatch(format!(
                    "{LAB_OVERLOAD} must be a document"
                )));
            };
            let before = member.model.config().to_document();
            member
                .model
                .set_parameters(changes)
                .map_err(|e| CommandError::bad_value(format!("{LAB_OVERLOAD}: {e}")))?;
            tracing::info!(parameter = LAB_OVERLOAD, value = %changes, "setParameter");
            was.get_or_insert(Bson::Document(before));
            continue;
        }
        if k == LAB_OVERLOAD_MEMBERS || k == LAB_OVERLOAD_SHARDS {
            let models = if k == LAB_OVERLOAD_SHARDS {
                shard_models(shared)
            } else {
                member_models(shared)
            };
            let before = set_models(k, &models, v)?;
            was.get_or_insert(Bson::Document(before));
            continue;
        }
        if k == mangle::PARAMETER {
            // Lab-only reply mangling (server/mangle.rs): validated, applied at once.
            let Bson::Document(d) = v else {
                return Err(CommandError::type_mismatch(format!(
                    "{} must be a document",
                    mangle::PARAMETER
                )));
            };
            let config = mangle::MangleConfig::from_document(d)
                .map_err(|e| CommandError::bad_value(e.to_string()))?;
            let before = shared.mangler.configure(config);
            tracing::info!(parameter = mangle::PARAMETER, value = %d, "setParameter");
            was.get_or_insert(Bson::Document(
                before.map(|c| c.to_document()).unwrap_or_default(),
            ));
            continue;
        }
        if k == routing::SHARD_ERROR_LABELS_PARAM {
            routing::check_label_mode(v)?;
        }
        let Some(old) = st.params.values.get(k).cloned() else {
            return Err(CommandError::bad_value(format!(
                "attempted to set unrecognized parameter [{k}]"
            )));
        };
        let new = match (&old, v) {
            (
                Bson::Int32(_) | Bson::Int64(_),
                Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_),
            ) => {
                let n = match v {
                    Bson::Int32(i) => i64::from(*i),
                    Bson::Int64(i) => *i,
                    Bson::Double(d) if d.fract() == 0.0 && d.is_finite() => *d as i64,
                    _ => return Err(CommandError::bad_value(format!("{k} must be an integer"))),
                };
                if n < 0 {
                    return Err(CommandError::bad_value(format!("{k} must be non-negative")));
                }
                match old {
                    Bson::Int32(_) => Bson::Int32(
                        i32::try_from(n)
                            .map_err(|_| CommandError::bad_value(format!("{k} is out of range")))?,
                    ),
                    _ => Bson::Int64(n),
                }
            }
            (Bson::Boolean(_), Bson::Boolean(b)) => Bson::Boolean(*b),
            (Bson::String(_), Bson::String(s)) => Bson::String(s.clone()),
            (Bson::Document(_), Bson::Document(d)) => Bson::Document(d.clone()),
            _ => {
                return Err(CommandError::type_mismatch(format!(
                    "wrong type for parameter {k}"
                )))
            }
        };
        was.get_or_insert(old);
        changed.push((k.clone(), new));
    }
    if changed.is_empty() && was.is_none() {
        return Err(CommandError::bad_value(
            "no option found to set, use help:true to see options",
        ));
    }
    for (k, v) in changed {
        tracing::info!(parameter = %k, value = %v, "setParameter");
        st.params.values.insert(k, v);
    }
    Ok(doc! { "was": was.unwrap_or(Bson::Null), "ok": 1.0 })
}

fn server_status(shared: &Shared, member: &Member) -> Document {
    let c = &shared.counters;
    let (cursors, sessions) = {
        let st = shared.state();
        (st.cursors.len() as i64, st.sessions.len() as i64)
    };
    let uptime = shared.started.elapsed();
    let mut status = doc! {
        "host": member.host.clone(),
        "version": shared.config.server_version.clone(),
        "process": if member.role == Role::Mongos { "mongos" } else { "mongod" },
        "pid": i64::from(std::process::id()),
        "uptime": uptime.as_secs_f64(),
        "uptimeMillis": uptime.as_millis() as i64,
        "localTime": DateTime::now(),
        "connections": {
            "current": c.connections_current.load(Ordering::Relaxed),
            "totalCreated": c.connections_total.load(Ordering::Relaxed),
            "available": 1_000_000i64,
        },
        "opcounters": {
            "insert": c.inserts.load(Ordering::Relaxed),
            "query": c.queries.load(Ordering::Relaxed),
            "update": c.updates.load(Ordering::Relaxed),
            "delete": c.deletes.load(Ordering::Relaxed),
            "getmore": c.getmores.load(Ordering::Relaxed),
            "command": c.commands.load(Ordering::Relaxed),
        },
        "metrics": { "cursor": { "open": { "total": cursors } } },
        "logicalSessionRecordCache": { "activeSessionsCount": sessions },
        "security": auth::server_status(shared),
        "labOverload": overload_status(&member.model),
        "labOverloadMembers": member_statuses(shared),
    };
    if let Some(sharding) = shared.sharding.as_ref() {
        status.insert(LAB_OVERLOAD_SHARDS, shard_statuses(sharding));
    }
    status.insert("ok", 1.0);
    status
}

/// `serverStatus.labOverloadShards`: every shard's model snapshot (without the series), in
/// shard order, each with `shard` (index), `name` and `routing` (the routers' requests,
/// overload errors, retries and failures on that shard).
fn shard_statuses(sharding: &Sharding) -> Vec<Bson> {
    sharding
        .shards
        .iter()
        .map(|s| {
            let mut d = doc! {
                "shard": s.index as i64,
                "name": s.name.clone(),
                "routing": s.stats.to_document(),
            };
            d.extend(s.model.snapshot().to_document());
            Bson::Document(d)
        })
        .collect()
}

/// `serverStatus.labOverloadMembers`: every member's model snapshot (without the series), in
/// member order, each with `member` (index) and `host`.
fn member_statuses(shared: &Shared) -> Vec<Bson> {
    shared
        .members
        .iter()
        .map(|m| {
            let mut d = doc! { "member": m.index as i64, "host": m.host.clone() };
            d.extend(m.model.snapshot().to_document());
            Bson::Document(d)
        })
        .collect()
}

/// Seconds of the overload model's per-second series that `serverStatus` returns.
const STATUS_SERIES_SECS: usize = 60;

/// `serverStatus.labOverload`: the model's snapshot plus its last minute of samples.
fn overload_status(model: &crate::model::Model) -> Document {
    let mut d = model.snapshot().to_document();
    let series: Vec<Bson> = model
        .series(STATUS_SERIES_SECS)
        .iter()
        .map(|s| Bson::Document(s.to_document()))
        .collect();
    d.insert("series", series);
    d
}

fn configure_fail_point(member: &Member, body: &Document) -> Result<Document, CommandError> {
    let name = match body.get("configureFailPoint") {
        Some(Bson::String(s)) => s.as_str(),
        _ => {
            return Err(CommandError::type_mismatch(
                "'configureFailPoint' must be a fail point name",
            ))
        }
    };
    let slot = match name {
        "failCommand" => &member.fail_point,
        "onPrimaryTransactionalWrite" => &member.primary_write_fail_point,
        "failGetMoreAfterCursorCheckout" => &member.get_more_fail_point,
        _ => {
            return Err(CommandError::bad_value(format!(
                "Cannot find FailPoint named {name} (the emulator has failCommand, \
                 onPrimaryTransactionalWrite and failGetMoreAfterCursorCheckout)"
            )))
        }
    };
    let mode = failpoint::parse_mode(body.get("mode"))?;
    let data = match body.get("data") {
        None => Document::new(),
        Some(Bson::Document(d)) => d.clone(),
        Some(_) => return Err(CommandError::type_mismatch("'data' must be a document")),
    };
    if name == "failCommand" {
        failpoint::validate_data(&data)?;
    }
    tracing::info!(member = member.index, fail_point = name, ?mode, %data, "configureFailPoint");
    let count = lock(slot).configure(mode, data);
    Ok(doc! { "count": count, "ok": 1.0 })
}
