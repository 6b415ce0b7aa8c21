//! What a router does with a request before it runs on the shared store: find its target
//! shards, charge each target shard's overload model (concurrently for a scatter-gather), retry
//! a shard's overload rejections as mongos does, and turn the rejections it gives up on into
//! the reply mongos sends.
//!
//! # mongos's handling of a shard's overload error (docs/emulator.md, "Sharded persona")
//!
//! * mongos retries a shard's error that carries the `RetryableError` label itself: its
//!   `AsyncRequestsSender` asks the shard's retry strategy
//!   (`src/mongo/s/async_requests_sender.cpp`, `Shard::RetryStrategy` in
//!   `src/mongo/db/sharding_environment/client/shard.cpp`), at most
//!   `defaultClientMaxRetryAttempts` (3) times, waiting an exponential backoff from
//!   `defaultClientBaseBackoffMillis` (100), or the shard's `baseBackoffMS` when it sent one, up
//!   to `defaultClientMaxBackoffMillis` (10000) (`src/mongo/client/retry_strategy_server_parameters.idl`).
//!   The wait is interruptible by the operation's deadline. Reads and writes alike
//!   (`jstests/noPassthrough/admission/run_command_overload_retryability.js`).
//! * When it gives up, a command that is not a batch write fails with the shard's code and the
//!   one label mongos derives itself, `SystemOverloadedError`
//!   (`assertMongosIRRLCommandFailure` in
//!   `jstests/noPassthrough/admission/libs/ingress_request_rate_limiter_helper.js`); a
//!   scatter-gather fails as a whole when one shard gives up
//!   (`ingress_request_rate_limiter_scatter_gather_error_propagation.js`).
//! * A batch write (insert, update, delete) reports `ok: 1` with write errors and no labels
//!   (`ingress_request_rate_limiter_multi_shard_update_error_propagation.js`): mongos's
//!   `BatchWriteOp::noteBatchError` (`src/mongo/s/write_ops/batch_write_op.cpp`) turns a child
//!   batch's error into one write error for an ordered batch (the batch stops there) and one
//!   per statement of the child batch for an unordered one; the other shards' statements are
//!   applied.
//!
//! The emulator charges a shard's model before the command runs on the store, so a rejected
//! statement never ran: the store runs exactly the accepted statements, and a retryable write
//! remembers them so that a retry does not apply them twice (`failpoint::PartialWrite`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::Duration;

use bson::{Bson, Document};
use rand::Rng;

use super::error::CommandError;
use super::failpoint::StatementFailure;
use super::sharding::{Shard, Sharding};
use super::Shared;
use crate::model::{CommandInfo, Rejection, RejectionKind, RETRYABLE, SYSTEM_OVERLOADED};

/// mongos's retry knobs (server parameters of the routers, settable with `setParameter`).
pub(crate) const MAX_RETRY_ATTEMPTS_PARAM: &str = "defaultClientMaxRetryAttempts";
pub(crate) const BASE_BACKOFF_PARAM: &str = "defaultClientBaseBackoffMillis";
pub(crate) const MAX_BACKOFF_PARAM: &str = "defaultClientMaxBackoffMillis";
/// Lab-only: which labels a router's reply carries when it gives up on a shard's overload
/// error: `"mongos"` (the default) the one label mongos derives, `SystemOverloadedError`;
/// `"shard"` the shard's own labels as it sent them (`SystemOverloadedError` and, when the shard
/// allowed retries, `RetryableError`), the behaviour an older mongos test expects (see the module
/// documentation), for experiments on what drivers do with either.
pub(crate) const SHARD_ERROR_LABELS_PARAM: &str = "labRouterShardErrorLabels";
/// The values of [`SHARD_ERROR_LABELS_PARAM`].
pub(crate) const LABELS_AS_MONGOS: &str = "mongos";
const LABELS_AS_SHARD: &str = "shard";

/// Checks a value for [`SHARD_ERROR_LABELS_PARAM`].
pub(crate) fn check_label_mode(value: &Bson) -> Result<(), CommandError> {
    match value {
        Bson::String(v) if v == LABELS_AS_MONGOS || v == LABELS_AS_SHARD => Ok(()),
        other => Err(CommandError::bad_value(format!(
            "{SHARD_ERROR_LABELS_PARAM} must be \"{LABELS_AS_MONGOS}\" or \"{LABELS_AS_SHARD}\", got {other}"
        ))),
    }
}
/// Defaults of the knobs above (`retry_strategy_server_parameters.idl`).
pub(crate) const DEFAULT_MAX_RETRY_ATTEMPTS: i32 = 3;
pub(crate) const DEFAULT_BASE_BACKOFF_MS: i32 = 100;
pub(crate) const DEFAULT_MAX_BACKOFF_MS: i32 = 10_000;
/// The emulator honours at most this many retries per child request whatever the parameter
/// says (every loop bounded).
const RETRY_ATTEMPTS_CAP: u32 = 100;

/// What the shard layer says about a request.
#[derive(Debug)]
pub(crate) enum Routed {
    /// Every target shard accepted (or the request has no target shard).
    Accepted { targets: Vec<usize> },
    /// A batch write some of whose statements a shard rejected.
    Statements(ShardRejections),
    /// The command fails as a whole; nothing runs on the store.
    Failed(CommandError),
}

/// What the shards did with a batch write's statements when some were rejected.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ShardRejections {
    /// Statements every target shard accepted (original indexes, in order): they run.
    pub(crate) accepted: Vec<usize>,
    /// Statements a target shard rejected: write errors.
    pub(crate) failing: Vec<StatementFailure>,
    /// Rejected statements some of whose target shards accepted them, with those shards: a
    /// multi-document statement (`update` with `multi: true`, `delete` with `limit: 0`) still
    /// runs on the documents those shards own, as each shard applies its part on mongos.
    pub(crate) partly_accepted: Vec<(usize, Vec<usize>)>,
}

/// The retry knobs in force.
#[derive(Debug, Clone, Copy)]
struct RetryKnobs {
    max_attempts: u32,
    base_backoff_ms: u64,
    max_backoff_ms: u64,
    /// Pass the shard's labels on instead of mongos's ([`SHARD_ERROR_LABELS_PARAM`]).
    shard_labels: bool,
}

fn knob(params: &Document, name: &str, default: i32) -> u64 {
    match params.get(name) {
        Some(Bson::Int32(i)) => u64::try_from(*i).unwrap_or(0),
        Some(Bson::Int64(i)) => u64::try_from(*i).unwrap_or(0),
        _ => u64::try_from(default).unwrap_or(0),
    }
}

fn retry_knobs(shared: &Shared) -> RetryKnobs {
    let st = shared.state();
    let p = &st.params.values;
    RetryKnobs {
        max_attempts: knob(p, MAX_RETRY_ATTEMPTS_PARAM, DEFAULT_MAX_RETRY_ATTEMPTS)
            .min(u64::from(RETRY_ATTEMPTS_CAP)) as u32,
        base_backoff_ms: knob(p, BASE_BACKOFF_PARAM, DEFAULT_BASE_BACKOFF_MS),
        max_backoff_ms: knob(p, MAX_BACKOFF_PARAM, DEFAULT_MAX_BACKOFF_MS),
        shard_labels: matches!(p.get(SHARD_ERROR_LABELS_PARAM), Some(Bson::String(v)) if v == LABELS_AS_SHARD),
    }
}

/// The wait before retry `attempt` (1 for the first): full jitter below
/// `min(max, base · 2^(attempt-1))`, `base` being the shard's `baseBackoffMS` when it sent one.
fn backoff(knobs: RetryKnobs, attempt: u32, shard_base_ms: Option<i64>) -> Duration {
    let base = shard_base_ms
        .and_then(|b| u64::try_from(b).ok())
        .filter(|b| *b > 0)
        .unwrap_or(knobs.base_backoff_ms);
    let ceiling = base
        .saturating_mul(1u64 << attempt.saturating_sub(1).min(30))
        .min(knobs.max_backoff_ms);
    if ceiling == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(rand::rng().random_range(0..=ceiling))
}

/// Whether mongos's retry strategy retries this rejection (it carries `RetryableError`).
fn retryable(r: &Rejection) -> bool {
    r.labels.contains(&RETRYABLE)
}

fn is_overload(r: &Rejection) -> bool {
    r.labels.contains(&SYSTEM_OVERLOADED)
}

/// Sends one child request to `shard`: its model's admission and execution, retried as mongos
/// retries a `RetryableError`. The client's disconnect is not watched here (the routers' own
/// model watches it); the deadline (`maxTimeMS` from the client's arrival) is.
async fn send_to_shard(
    shard: &Shard,
    info: &CommandInfo,
    shared: &Shared,
) -> Result<(), Rejection> {
    let deadline = info
        .max_time_ms
        .map(|ms| info.arrival + Duration::from_millis(ms.min(i32::MAX as u64)));
    let mut attempt = 0u32;
    // Read on the first rejection only: accepted requests never take the state lock here.
    let mut knobs: Option<RetryKnobs> = None;
    loop {
        shard.stats.requests.fetch_add(1, Ordering::Relaxed);
        // Each attempt reaches the shard now: the shard times it from here, not from the
        // client's arrival at the router (which still starts its maxTimeMS).
        let outcome = match shard.model.admit_forwarded(info).await {
            Ok(admission) => admission
                .execute(std::future::pending::<()>())
                .await
                .map(|_| ()),
            Err(r) => Err(r),
        };
        let rejection = match outcome {
            Ok(()) => return Ok(()),
            Err(r) => r,
        };
        if is_overload(&rejection) {
            shard.stats.overload_errors.fetch_add(1, Ordering::Relaxed);
        }
        let knobs = *knobs.get_or_insert_with(|| retry_knobs(shared));
        if !retryable(&rejection) || attempt >= knobs.max_attempts {
            shard.stats.failed.fetch_add(1, Ordering::Relaxed);
            return Err(rejection);
        }
        attempt += 1;
        let wait = backoff(knobs, attempt, rejection.base_backoff_ms);
        let now = tokio::time::Instant::now();
        if let Some(deadline) = deadline.filter(|d| *d < now + wait) {
            // The backoff is interrupted by the operation's deadline.
            tokio::time::sleep_until(deadline).await;
            shard.stats.failed.fetch_add(1, Ordering::Relaxed);
            return Err(expired());
        }
        shard.stats.overload_retries.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(wait).await;
    }
}

/// The 50 MaxTimeMSExpired a router answers when the deadline ends its backoff.
fn expired() -> Rejection {
    Rejection {
        kind: RejectionKind::MaxTimeExpired,
        code: 50,
        code_name: "MaxTimeMSExpired",
        errmsg: "operation exceeded time limit".to_string(),
        labels: Vec::new(),
        base_backoff_ms: None,
        work: Duration::ZERO,
    }
}

/// Runs the futures concurrently in this task until all are done, or until one output meets
/// `stop`; returns the outputs in order (None for futures stopped unfinished, which are
/// dropped). No task is spawned, so dropping the join cancels them all.
async fn join_until<F: Future>(
    futures: Vec<F>,
    stop: impl Fn(&F::Output) -> bool,
) -> Vec<Option<F::Output>> {
    let mut pending: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all_done = true;
        for (future, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(o) => {
                        let stopping = stop(&o);
                        *output = Some(o);
                        if stopping {
                            return Poll::Ready(());
                        }
                    }
                    Poll::Pending => all_done = false,
                }
            }
        }
        if all_done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs
}

/// Whether a shard layer's join waits for every target or stops at the first error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Join {
    /// Every child request's outcome matters (batch writes: each shard's statements).
    All,
    /// The first error decides (a command's reply): mongos's results merger fails the command
    /// at the first error and cancels the other remotes.
    UntilError,
}

/// Charges every shard in `targets` concurrently; the outcome per target, in `targets` order
/// (None for a child request cancelled after another's error with [`Join::UntilError`]).
async fn charge(
    sharding: &Sharding,
    targets: &[usize],
    info: &CommandInfo,
    shared: &Shared,
    join: Join,
) -> Vec<Option<Result<(), Rejection>>> {
    let sends: Vec<_> = targets
        .iter()
        .filter_map(|t| sharding.shards.get(*t))
        .map(|shard| send_to_shard(shard, info, shared))
        .collect();
    join_until(sends, |outcome| {
        join == Join::UntilError && outcome.is_err()
    })
    .await
}

/// The first error among `outcomes`.
fn first_error(outcomes: &[Option<Result<(), Rejection>>]) -> Option<&Rejection> {
    outcomes.iter().flatten().find_map(|o| o.as_ref().err())
}

/// A shard's rejection as mongos reports it for a command that is not a batch write: the
/// shard's code and message; an overload error carries only the `SystemOverloadedError` label
/// mongos derives (or the shard's labels with `shard_labels`; the router's own reply envelope
/// adds its `baseBackoffMS`), other errors get the router's usual labels.
fn command_error(r: &Rejection, shard_labels: bool) -> CommandError {
    let labels = if shard_labels {
        r.labels.iter().map(|l| l.to_string()).collect()
    } else {
        vec![SYSTEM_OVERLOADED.to_string()]
    };
    CommandError {
        code: r.code,
        code_name: std::borrow::Cow::Borrowed(r.code_name),
        errmsg: r.errmsg.clone(),
        labels: is_overload(r).then_some(labels),
        extra: None,
    }
}

fn statement_failure(index: usize, r: &Rejection) -> StatementFailure {
    StatementFailure {
        index,
        code: r.code,
        errmsg: r.errmsg.clone(),
    }
}

/// The statements of a batch write (insert documents, update or delete statements'
/// filters), or None for other commands.
fn statements<'a>(name: &str, body: &'a Document) -> Option<&'a Vec<Bson>> {
    let field = match name {
        "insert" => "documents",
        "update" => "updates",
        "delete" => "deletes",
        _ => return None,
    };
    body.get_array(field).ok()
}

/// Whether the command compares strings under a non-simple collation (its own `collation`).
fn simple_collation(body: &Document) -> bool {
    match body.get("collation") {
        Some(Bson::Document(c)) => {
            matches!(c.get("locale"), Some(Bson::String(l)) if l == "simple")
        }
        _ => true,
    }
}

/// The target shards of each statement of a batch write on `db.coll`.
fn statement_targets(
    sharding: &Sharding,
    name: &str,
    db: &str,
    coll: &str,
    list: &[Bson],
) -> Vec<Vec<usize>> {
    list.iter()
        .map(|statement| match (name, statement) {
            ("insert", Bson::Document(d)) => vec![sharding.owner_of_document(db, coll, d)],
            (_, Bson::Document(d)) => {
                let filter = d.get_document("q").ok();
                let collated = d
                    .get_document("collation")
                    .map(|c| c.get_str("locale") == Ok("simple"))
                    .unwrap_or(true);
                sharding.targets_for_filter(db, coll, filter, collated)
            }
            // A malformed statement: the store's parser reports it; charge the primary shard.
            _ => vec![sharding.primary_of(db)],
        })
        .collect()
}

/// The target shards of a command that is not a batch write.
pub(crate) fn command_targets(
    sharding: &Sharding,
    name: &str,
    db: &str,
    body: &Document,
) -> Vec<usize> {
    let coll = body.get(name).and_then(Bson::as_str);
    let collated = simple_collation(body);
    match (name, coll) {
        ("find", Some(c)) => {
            sharding.targets_for_filter(db, c, body.get_document("filter").ok(), collated)
        }
        ("count" | "distinct", Some(c)) => {
            sharding.targets_for_filter(db, c, body.get_document("query").ok(), collated)
        }
        ("findAndModify" | "findandmodify", Some(c)) => {
            sharding.targets_for_filter(db, c, body.get_document("query").ok(), collated)
        }
        ("aggregate", Some(c)) => {
            let first_match = body
                .get_array("pipeline")
                .ok()
                .and_then(|p| p.first())
                .and_then(Bson::as_document)
                .and_then(|stage| stage.get_document("$match").ok());
            sharding.targets_for_filter(db, c, first_match, collated)
        }
        // Statements of a batch write inside a transaction: every statement's shards.
        ("insert" | "update" | "delete", Some(c)) => {
            let list = statements(name, body).map(Vec::as_slice).unwrap_or(&[]);
            let mut all: Vec<usize> = statement_targets(sharding, name, db, c, list)
                .into_iter()
                .flatten()
                .collect();
            all.sort_unstable();
            all.dedup();
            all
        }
        ("getMore", _) => match body.get("getMore") {
            Some(Bson::Int64(id)) => sharding.cursor_targets(*id),
            _ => Vec::new(),
        },
        ("killCursors", _) => Vec::new(),
        (
            "create" | "drop" | "createIndexes" | "dropIndexes" | "collMod" | "listIndexes",
            Some(c),
        ) => sharding.holders(db, c),
        ("listDatabases" | "dropDatabase" | "bulkWrite" | "dbStats" | "aggregate", _) => {
            sharding.every_shard()
        }
        _ => vec![sharding.primary_of(db)],
    }
}

/// Routes one request: charges its target shards and says what runs on the store.
/// `info` is the router's view of the request (its arrival, `maxTimeMS`, cost, lab id);
/// `in_transaction` requests are never split into statements (a transaction statement fails
/// as a whole).
pub(crate) async fn route(
    shared: &Shared,
    sharding: &Sharding,
    name: &str,
    db: &str,
    body: &Document,
    info: &CommandInfo,
    in_transaction: bool,
) -> Routed {
    let batch = statements(name, body).zip(body.get(name).and_then(Bson::as_str));
    if let (Some((list, coll)), false) = (batch, in_transaction) {
        let ordered = !matches!(body.get("ordered"), Some(Bson::Boolean(false)));
        let per_statement = statement_targets(sharding, name, db, coll, list);
        return if ordered {
            route_ordered(sharding, &per_statement, info, shared).await
        } else {
            route_unordered(sharding, &per_statement, info, shared).await
        };
    }
    let targets = command_targets(sharding, name, db, body);
    let outcomes = charge(sharding, &targets, info, shared, Join::UntilError).await;
    match first_error(&outcomes) {
        Some(r) => Routed::Failed(command_error(r, retry_knobs(shared).shard_labels)),
        None => Routed::Accepted { targets },
    }
}

/// An unordered batch write: one child batch per shard, all sent at once; a rejected child
/// batch fails each of its statements (a statement sent to several shards fails if one of
/// them rejected it).
async fn route_unordered(
    sharding: &Sharding,
    per_statement: &[Vec<usize>],
    info: &CommandInfo,
    shared: &Shared,
) -> Routed {
    let mut targets: Vec<usize> = per_statement.iter().flatten().copied().collect();
    targets.sort_unstable();
    targets.dedup();
    let outcomes = charge(sharding, &targets, info, shared, Join::All).await;
    let rejection_of = |shard: usize| {
        targets
            .iter()
            .position(|t| *t == shard)
            .and_then(|i| outcomes.get(i))
            .and_then(|o| o.as_ref())
            .and_then(|o| o.as_ref().err())
    };
    let mut outcome = ShardRejections::default();
    for (index, shards) in per_statement.iter().enumerate() {
        match shards.iter().find_map(|s| rejection_of(*s)) {
            Some(r) => {
                outcome.failing.push(statement_failure(index, r));
                let accepting: Vec<usize> = shards
                    .iter()
                    .copied()
                    .filter(|s| rejection_of(*s).is_none())
                    .collect();
                if !accepting.is_empty() {
                    outcome.partly_accepted.push((index, accepting));
                }
            }
            None => outcome.accepted.push(index),
        }
    }
    if outcome.failing.is_empty() {
        Routed::Accepted { targets }
    } else {
        Routed::Statements(outcome)
    }
}

/// An ordered batch write: consecutive statements with the same target shards form one child
/// batch; child batches go one after another, and the first rejected one ends the batch with
/// one write error at its first statement (the statements after it are not attempted).
async fn route_ordered(
    sharding: &Sharding,
    per_statement: &[Vec<usize>],
    info: &CommandInfo,
    shared: &Shared,
) -> Routed {
    let mut all_targets: Vec<usize> = Vec::new();
    let mut start = 0;
    // Each turn consumes at least one statement.
    while start < per_statement.len() {
        let shards = &per_statement[start];
        let end = per_statement[start..]
            .iter()
            .position(|s| s != shards)
            .map_or(per_statement.len(), |len| start + len);
        let outcomes = charge(sharding, shards, info, shared, Join::All).await;
        if let Some(r) = first_error(&outcomes) {
            // The shards that accepted this child batch applied all of it.
            let accepting: Vec<usize> = shards
                .iter()
                .zip(&outcomes)
                .filter(|(_, o)| matches!(o, Some(Ok(()))))
                .map(|(s, _)| *s)
                .collect();
            let partly_accepted = if accepting.is_empty() {
                Vec::new()
            } else {
                (start..end).map(|i| (i, accepting.clone())).collect()
            };
            return Routed::Statements(ShardRejections {
                accepted: (0..start).collect(),
                failing: vec![statement_failure(start, r)],
                partly_accepted,
            });
        }
        all_targets.extend(shards);
        start = end.max(start + 1);
    }
    all_targets.sort_unstable();
    all_targets.dedup();
    Routed::Accepted {
        targets: all_targets,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_stays_under_the_ceiling() {
        let knobs = RetryKnobs {
            max_attempts: 3,
            base_backoff_ms: 100,
            max_backoff_ms: 250,
            shard_labels: false,
        };
        for attempt in 1..=10 {
            let ceiling = (100u64 << (attempt - 1)).min(250);
            for _ in 0..50 {
                assert!(backoff(knobs, attempt, None) <= Duration::from_millis(ceiling));
            }
        }
        // The shard's baseBackoffMS replaces the router's base.
        for _ in 0..50 {
            assert!(backoff(knobs, 1, Some(5)) <= Duration::from_millis(5));
        }
        let none = RetryKnobs {
            shard_labels: false,
            max_backoff_ms: 0,
            ..knobs
        };
        assert_eq!(backoff(none, 4, None), Duration::ZERO);
    }

    #[tokio::test]
    async fn join_keeps_the_order_and_stops_at_the_first_error() {
        let futures = |fail: Option<u64>| {
            (0..5u64)
                .map(move |i| async move {
                    tokio::time::sleep(Duration::from_millis(10 * (5 - i))).await;
                    if Some(i) == fail {
                        Err(i)
                    } else {
                        Ok(i)
                    }
                })
                .collect::<Vec<_>>()
        };
        let all = join_until(futures(None), Result::is_err).await;
        assert_eq!(all, (0..5).map(|i| Some(Ok(i))).collect::<Vec<_>>());
        // Future 3 fails after 20 ms: 4 (10 ms) finished, 0 to 2 were still running.
        let stopped = join_until(futures(Some(3)), Result::is_err).await;
        assert_eq!(stopped, vec![None, None, None, Some(Err(3)), Some(Ok(4))]);
    }
}
