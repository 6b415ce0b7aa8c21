//! The adapter between the scenario and the drivers: [`LabClient`], implemented for the fork
//! (`mongodb`) and for unmodified upstream 3.9.1 (`mongodb_upstream`) by one macro, and the
//! [`Sink`] that turns both drivers' command and pool events into per-request figures.
//!
//! Every operation carries `comment: {labReq: <id>}`. CommandStarted events read it back, so
//! each attempt (retries included) is booked to its request; the driver's `request_id` joins
//! Succeeded/Failed to Started. A connection's wait is the CheckedOut event's duration
//! (checkout started → checked out), booked to the next command that starts on that
//! connection.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::config::{with_options, Driver, LabConfig, OpKind, Variant};
use super::control::{COLL, DB};
use super::metrics::{AttemptReport, ErrorClass, Recorder};

/// A boxed, sendable future.
pub type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// One operation to run.
#[derive(Debug, Clone, PartialEq)]
pub struct OpSpec {
    /// Request id, sent as `comment.labReq`.
    pub req: u64,
    /// What to do.
    pub kind: OpKind,
    /// Target `_id`.
    pub key: i64,
    /// Documents per range read.
    pub range_len: i64,
    /// `maxTimeMS` for reads, if any.
    pub max_time: Option<Duration>,
    /// When the application stops waiting, sent as `comment.labDeadlineMs` (Unix epoch ms) so
    /// that the server model can count work finished after it as wasted.
    pub give_up_at: Option<SystemTime>,
}

impl OpSpec {
    /// `give_up_at` in Unix epoch milliseconds.
    pub fn give_up_at_epoch_ms(&self) -> Option<i64> {
        let since_epoch = self.give_up_at?.duration_since(UNIX_EPOCH).ok()?;
        Some(i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX))
    }
}

/// A fork client's overload statistics (`Client::overload_stats`), summed over a variant's
/// instances; upstream has none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ForkStats {
    /// Attempts that failed with an overload error.
    pub overload_errors: u64,
    /// Retries the driver sent.
    pub retries_made: u64,
    /// Retries the driver's retry budget refused.
    pub retries_refused: u64,
    /// Retries given back to the budget because their operation then succeeded.
    pub retries_refunded: u64,
    /// Application retries the shared budget admitted.
    pub app_retries_made: u64,
    /// Application retries the shared budget refused.
    pub app_retries_refused: u64,
    /// Backoff slept before retries, in all (ms).
    pub backoff_slept_ms: f64,
    /// First attempts the adaptive throttle rejected without sending them.
    pub local_rejections: u64,
    /// Operations that waited for a concurrency slot.
    pub concurrency_waits: u64,
    /// Of those, the ones whose deadline passed first.
    pub concurrency_wait_timeouts: u64,
    /// Of those, the ones that went back to server selection because their server changed
    /// while they waited (a cleared pool, a step-down).
    pub concurrency_wait_reselections: u64,
    /// The concurrency limits of the instances' servers, summed, at the end of the run.
    pub concurrency_limit: u64,
}

impl ForkStats {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &ForkStats) {
        self.overload_errors += other.overload_errors;
        self.retries_made += other.retries_made;
        self.retries_refused += other.retries_refused;
        self.retries_refunded += other.retries_refunded;
        self.app_retries_made += other.app_retries_made;
        self.app_retries_refused += other.app_retries_refused;
        self.backoff_slept_ms += other.backoff_slept_ms;
        self.local_rejections += other.local_rejections;
        self.concurrency_waits += other.concurrency_waits;
        self.concurrency_wait_timeouts += other.concurrency_wait_timeouts;
        self.concurrency_wait_reselections += other.concurrency_wait_reselections;
        self.concurrency_limit += other.concurrency_limit;
    }
}

/// A driver client as the lab uses it.
pub trait LabClient: Send + Sync + 'static {
    /// Runs one operation to its end (retries included) and reports it. The application's
    /// deadline is enforced by the caller around a spawned task, not here.
    fn run(&self, op: OpSpec) -> BoxFut<AttemptReport>;
    /// Pings the deployment once (not booked to any request).
    fn warm_up(&self) -> BoxFut<Result<(), String>>;
    /// Closes the client.
    fn shutdown(&self) -> BoxFut<()>;
    /// Called when the application dropped the call of request `req` before it returned:
    /// forgets its figures and returns the attempts it had started (0 when not tracked).
    fn forget(&self, req: u64) -> u32 {
        let _ = req;
        0
    }
    /// Asked by the application before it retries a failed call: whether the client's shared
    /// retry budget admits the retry (and charges it). `true` without a budget.
    fn app_may_retry(&self) -> bool {
        true
    }
    /// The client's overload statistics, where the driver keeps them (the fork).
    fn overload_stats(&self) -> Option<ForkStats> {
        None
    }
}

/// Per-request accumulation of attempt figures.
#[derive(Debug, Default, Clone, Copy)]
struct Acc {
    attempts: u32,
    conn_wait: Duration,
    service: Duration,
}

/// Receives both drivers' events (already converted to plain values) for one client.
#[derive(Debug)]
pub struct Sink {
    recorder: Arc<Recorder>,
    attempts_total: Arc<AtomicU64>,
    reqs: Mutex<HashMap<u64, Acc>>,
    by_request_id: Mutex<HashMap<i32, u64>>,
    conn_wait: Mutex<HashMap<u32, Duration>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Sink {
    /// A sink booking into `recorder`; `attempts_total` counts every lab command started.
    pub fn new(recorder: Arc<Recorder>, attempts_total: Arc<AtomicU64>) -> Sink {
        Sink {
            recorder,
            attempts_total,
            reqs: Mutex::new(HashMap::new()),
            by_request_id: Mutex::new(HashMap::new()),
            conn_wait: Mutex::new(HashMap::new()),
        }
    }

    /// CommandStarted: `req` is the command's `comment.labReq` (None for other commands).
    pub fn command_started(&self, req: Option<u64>, request_id: i32, conn_id: u32) {
        let wait = lock(&self.conn_wait).remove(&conn_id).unwrap_or_default();
        let Some(req) = req else { return };
        self.attempts_total.fetch_add(1, Ordering::Relaxed);
        self.recorder.attempt_started();
        lock(&self.by_request_id).insert(request_id, req);
        let mut reqs = lock(&self.reqs);
        let acc = reqs.entry(req).or_default();
        acc.attempts += 1;
        acc.conn_wait += wait;
    }

    /// CommandSucceeded / CommandFailed.
    pub fn command_done(&self, request_id: i32, duration: Duration, failure: Option<ErrorClass>) {
        let Some(req) = lock(&self.by_request_id).remove(&request_id) else {
            return;
        };
        if let Some(class) = failure {
            self.recorder.attempt_failed(class);
        }
        if let Some(acc) = lock(&self.reqs).get_mut(&req) {
            acc.service += duration;
        }
    }

    /// ConnectionCheckedOut.
    pub fn checked_out(&self, conn_id: u32, wait: Duration) {
        lock(&self.conn_wait).insert(conn_id, wait);
    }

    /// ConnectionCreated.
    pub fn conn_created(&self) {
        self.recorder.conn_opened();
    }

    /// ConnectionClosed.
    pub fn conn_closed(&self, conn_id: u32) {
        lock(&self.conn_wait).remove(&conn_id);
        self.recorder.conn_closed();
    }

    /// The report of request `req`, once the driver returned `outcome`.
    pub fn finish(&self, req: u64, outcome: Result<(), ErrorClass>) -> AttemptReport {
        let acc = lock(&self.reqs).remove(&req).unwrap_or_default();
        AttemptReport {
            outcome,
            attempts: acc.attempts,
            conn_wait: acc.conn_wait,
            service: acc.service,
            tries: 1,
        }
    }

    /// Forgets request `req` (its driver call was dropped) and returns the attempts it had
    /// started.
    pub fn forget(&self, req: u64) -> u32 {
        lock(&self.reqs).remove(&req).map_or(0, |a| a.attempts)
    }
}

/// Implements a [`LabClient`] for one driver crate, in a module of its own; `$extras` is the
/// module with what only the fork's API offers (statistics, the shared retry budget, per-call
/// timeouts), as functions of that crate's types.
macro_rules! lab_driver {
    ($module:ident, $krate:ident, $extras:path) => {
        /// The [`LabClient`](super::LabClient) of one driver crate.
        pub mod $module {
            use std::sync::Arc;

            use ::$krate as m;
            use bson::{doc, Bson, Document};
            use m::event::cmap::CmapEvent;
            use m::event::command::CommandEvent;
            use m::event::EventHandler;

            use super::{BoxFut, ForkStats, LabClient, OpSpec, Sink};
            use crate::loadgen::config::OpKind;
            use crate::loadgen::metrics::{AttemptReport, DriverErrorKind, ErrorClass};
            use $extras as extras;

            /// Classifies one of this driver's errors.
            pub fn classify(e: &m::error::Error) -> ErrorClass {
                use m::error::{ErrorKind, WriteFailure};
                if extras::is_timeout(e) {
                    return ErrorClass::Expired;
                }
                let (code, kind) = match &*e.kind {
                    ErrorKind::Command(c) => (Some(c.code), DriverErrorKind::Other),
                    ErrorKind::Write(WriteFailure::WriteError(w)) => {
                        (Some(w.code), DriverErrorKind::Other)
                    }
                    ErrorKind::Write(WriteFailure::WriteConcernError(w)) => {
                        (Some(w.code), DriverErrorKind::Other)
                    }
                    ErrorKind::ServerSelection { .. } => (None, DriverErrorKind::Selection),
                    ErrorKind::Io(_) | ErrorKind::ConnectionPoolCleared { .. } => {
                        (None, DriverErrorKind::Network)
                    }
                    _ => (None, DriverErrorKind::Other),
                };
                ErrorClass::from_parts(code, e.contains_label("SystemOverloadedError"), kind)
            }

            struct Inner {
                client: m::Client,
                db: m::Database,
                coll: m::Collection<Document>,
                sink: Arc<Sink>,
            }

            /// A client of this driver with the lab's event handlers.
            pub struct Client {
                inner: Arc<Inner>,
            }

            impl Client {
                /// Connects (lazily, like the driver) to `uri` as `app_name`, booking events
                /// into `sink`; operations go to `db.coll`.
                pub async fn connect(
                    uri: &str,
                    app_name: &str,
                    db: &str,
                    coll: &str,
                    sink: Arc<Sink>,
                ) -> Result<Client, String> {
                    let mut opts = m::options::ClientOptions::parse(uri)
                        .await
                        .map_err(|e| format!("{uri}: {e}"))?;
                    opts.app_name = Some(app_name.to_string());
                    let s = sink.clone();
                    opts.command_event_handler =
                        Some(EventHandler::callback(move |ev: CommandEvent| match ev {
                            CommandEvent::Started(e) => {
                                let req = e
                                    .command
                                    .get_document("comment")
                                    .ok()
                                    .and_then(|c| c.get_i64("labReq").ok())
                                    .map(|r| r as u64);
                                s.command_started(req, e.request_id, e.connection.id);
                            }
                            CommandEvent::Succeeded(e) => {
                                s.command_done(e.request_id, e.duration, None)
                            }
                            CommandEvent::Failed(e) => {
                                s.command_done(e.request_id, e.duration, Some(classify(&e.failure)))
                            }
                            _ => {}
                        }));
                    let s = sink.clone();
                    opts.cmap_event_handler =
                        Some(EventHandler::callback(move |ev: CmapEvent| match ev {
                            CmapEvent::ConnectionCheckedOut(e) => {
                                s.checked_out(e.connection_id, e.duration)
                            }
                            CmapEvent::ConnectionCreated(_) => s.conn_created(),
                            CmapEvent::ConnectionClosed(e) => s.conn_closed(e.connection_id),
                            _ => {}
                        }));
                    let client = m::Client::with_options(opts).map_err(|e| e.to_string())?;
                    let db = client.database(db);
                    let coll = db.collection::<Document>(coll);
                    Ok(Client {
                        inner: Arc::new(Inner {
                            client,
                            db,
                            coll,
                            sink,
                        }),
                    })
                }
            }

            async fn op(inner: &Inner, op: &OpSpec) -> Result<(), m::error::Error> {
                let mut comment = doc! { "labReq": op.req as i64 };
                if let Some(ms) = op.give_up_at_epoch_ms() {
                    comment.insert("labDeadlineMs", ms);
                }
                let comment = Bson::Document(comment);
                let coll = extras::collection_for_call(&inner.db, &inner.coll, op);
                match op.kind {
                    OpKind::PointRead => {
                        let mut a = coll.find_one(doc! { "_id": op.key }).comment(comment);
                        if let Some(t) = op.max_time {
                            a = a.max_time(t);
                        }
                        a.await.map(|_| ())
                    }
                    OpKind::RangeRead => {
                        let filter =
                            doc! { "_id": { "$gte": op.key, "$lt": op.key + op.range_len } };
                        let mut a = coll.find(filter).comment(comment);
                        if let Some(t) = op.max_time {
                            a = a.max_time(t);
                        }
                        let mut cursor = a.await?;
                        while cursor.advance().await? {}
                        Ok(())
                    }
                    OpKind::Insert => coll
                        .insert_one(doc! { "k": op.key, "n": 0i32, "pad": "x".repeat(64) })
                        .comment(comment)
                        .await
                        .map(|_| ()),
                    OpKind::Update => coll
                        .update_one(doc! { "_id": op.key }, doc! { "$inc": { "n": 1i32 } })
                        .comment(comment)
                        .await
                        .map(|_| ()),
                }
            }

            impl LabClient for Client {
                fn run(&self, spec: OpSpec) -> BoxFut<AttemptReport> {
                    let inner = self.inner.clone();
                    Box::pin(async move {
                        let outcome = op(&inner, &spec).await.map_err(|e| classify(&e));
                        inner.sink.finish(spec.req, outcome)
                    })
                }

                fn warm_up(&self) -> BoxFut<Result<(), String>> {
                    let inner = self.inner.clone();
                    Box::pin(async move {
                        inner
                            .client
                            .database("admin")
                            .run_command(doc! { "ping": 1 })
                            .await
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    })
                }

                fn shutdown(&self) -> BoxFut<()> {
                    let client = self.inner.client.clone();
                    Box::pin(async move { client.shutdown().immediate(true).await })
                }

                fn forget(&self, req: u64) -> u32 {
                    self.inner.sink.forget(req)
                }

                fn app_may_retry(&self) -> bool {
                    extras::app_may_retry(&self.inner.client)
                }

                fn overload_stats(&self) -> Option<ForkStats> {
                    extras::overload_stats(&self.inner.client)
                }
            }
        }
    };
}

/// The fork's own API, as the lab uses it.
mod fork_api {
    use std::time::{Duration, SystemTime};

    use bson::Document;
    use mongodb::options::CollectionOptions;
    use mongodb::{Client, Collection, Database};

    use super::{ForkStats, OpSpec};

    /// How much of its deadline a request may have used and still run with the collection's
    /// timeoutMS unchanged.
    const FIRST_CALL_SLACK: Duration = Duration::from_millis(2);

    /// The collection to run `op` on: with `timeoutMS` in force, bounded by the time the
    /// application has left, as an application passes its remaining deadline down (it matters
    /// for the application's own retries, which start later than the request).
    pub fn collection_for_call(
        db: &Database,
        coll: &Collection<Document>,
        op: &OpSpec,
    ) -> Collection<Document> {
        let (Some(timeout), Some(give_up_at)) = (coll.timeout(), op.give_up_at) else {
            return coll.clone();
        };
        let left = give_up_at
            .duration_since(SystemTime::now())
            .unwrap_or_default()
            // Zero would mean "no limit".
            .max(Duration::from_millis(1));
        // A first call starts microseconds after its request: the collection's own timeoutMS
        // (the deadline) is then right, and building a handle per call would be work on the
        // hot path that measures nothing.
        if timeout.is_zero() || left + FIRST_CALL_SLACK >= timeout {
            return coll.clone();
        }
        let options = CollectionOptions::builder().timeout(left).build();
        db.collection_with_options(coll.name(), options)
    }

    /// Whether `e` is the driver's `timeoutMS` expiry (booked with the server's code 50).
    pub fn is_timeout(e: &mongodb::error::Error) -> bool {
        matches!(*e.kind, mongodb::error::ErrorKind::Timeout { .. })
    }

    /// Whether the client's shared retry budget admits an application retry (charging it).
    pub fn app_may_retry(client: &Client) -> bool {
        client.retry_budget().is_none_or(|b| b.try_withdraw())
    }

    /// The client's overload statistics.
    pub fn overload_stats(client: &Client) -> Option<ForkStats> {
        let s = client.overload_stats();
        Some(ForkStats {
            overload_errors: s.overload_errors(),
            retries_made: s.retries_made,
            retries_refused: s.retries_refused,
            retries_refunded: s.retries_refunded,
            app_retries_made: s.application_retries_made,
            app_retries_refused: s.application_retries_refused,
            backoff_slept_ms: s.backoff_slept.as_secs_f64() * 1000.0,
            local_rejections: s.local_rejections,
            concurrency_waits: s.concurrency_waits,
            concurrency_wait_timeouts: s.concurrency_wait_timeouts,
            concurrency_wait_reselections: s.concurrency_wait_reselections,
            concurrency_limit: s
                .concurrency_limits
                .values()
                .map(|limit| u64::from(limit.limit))
                .sum(),
        })
    }
}

/// Upstream has none of the fork's API: no per-call timeout, no budget, no statistics.
mod upstream_api {
    use bson::Document;
    use mongodb_upstream::{Client, Collection, Database};

    use super::{ForkStats, OpSpec};

    /// The client's collection as it is.
    pub fn collection_for_call(
        _db: &Database,
        coll: &Collection<Document>,
        _op: &OpSpec,
    ) -> Collection<Document> {
        coll.clone()
    }

    /// Never: upstream has no `timeoutMS`.
    pub fn is_timeout(_e: &mongodb_upstream::error::Error) -> bool {
        false
    }

    /// Always: upstream has no retry budget.
    pub fn app_may_retry(_client: &Client) -> bool {
        true
    }

    /// None: upstream keeps no statistics.
    pub fn overload_stats(_client: &Client) -> Option<ForkStats> {
        None
    }
}

lab_driver!(fork, mongodb, super::fork_api);
lab_driver!(upstream, mongodb_upstream, super::upstream_api);

/// Connects a client of `driver`.
pub async fn connect(
    driver: Driver,
    uri: &str,
    app_name: &str,
    db: &str,
    coll: &str,
    sink: Arc<Sink>,
) -> Result<Arc<dyn LabClient>, String> {
    Ok(match driver {
        Driver::Fork => Arc::new(fork::Client::connect(uri, app_name, db, coll, sink).await?),
        Driver::Upstream => {
            Arc::new(upstream::Client::connect(uri, app_name, db, coll, sink).await?)
        }
    })
}

/// Connects `cfg.instances` clients of `variant`, booking into `recorder` and counting their
/// commands in `attempts`, and warms them up.
pub(crate) async fn connect_instances(
    cfg: &LabConfig,
    uri: &str,
    variant: &Variant,
    recorder: &Arc<Recorder>,
    attempts: &Arc<AtomicU64>,
) -> Result<Vec<Arc<dyn LabClient>>, String> {
    let client_uri = with_options(uri, &cfg.uri_options(variant));
    let mut clients: Vec<Arc<dyn LabClient>> = Vec::new();
    for i in 0..cfg.instances.max(1) {
        let sink = Arc::new(Sink::new(recorder.clone(), attempts.clone()));
        let c = connect(
            variant.driver,
            &client_uri,
            &format!("lab-{}-{i}", variant.name),
            DB,
            COLL,
            sink,
        )
        .await?;
        c.warm_up()
            .await
            .map_err(|e| format!("{}: instance {i}: {e}", variant.name))?;
        clients.push(c);
    }
    Ok(clients)
}

/// The overload statistics of `clients` added up (`None` where the driver keeps none).
pub(crate) fn overload_stats_of(clients: &[Arc<dyn LabClient>]) -> Option<ForkStats> {
    let mut all: Option<ForkStats> = None;
    for stats in clients.iter().filter_map(|c| c.overload_stats()) {
        all.get_or_insert_with(ForkStats::default).add(&stats);
    }
    all
}
