//! The network server: listeners, personas (standalone, replica set, mongos) and the
//! [`Emulator`] handle.
//!
//! Every member of the emulated deployment listens on its own loopback port; all members share
//! one document [`Store`], one session table and one cursor table, so
//! "replication" is instantaneous. Fail points and overload models are per member, like
//! mongod's resources.
//!
//! # Request path
//!
//! `conn` reads one OP_MSG at a time per connection (`wire`), then `commands::handle`:
//! client metadata on the first hello → overload model admission (ingress limiter; off by
//! default) → `failCommand` (never for `configureFailPoint`; labels, block, close, error,
//! write concern error) → generic arguments → awaitable hello / change-stream waits → overload
//! model execution (tickets, virtual cores) → on a router, the target shards' models
//! (`routing`: admission and execution per shard, mongos's retries, the shards of a
//! scatter-gather concurrently) → the command under the state lock → the reply envelope
//! (labels, `baseBackoffMS`, `writeConcernError`, `$clusterTime`, `operationTime`).
//!
//! # Behaviour worth knowing
//!
//! * Replica set: member 0 is primary until a step-down (`repl`: `replSetStepDown`,
//!   [`Emulator::step_down`]) hands over to another member; secondaries refuse writes (10107)
//!   and reads without a
//!   non-primary `$readPreference` (13435); "not primary" errors carry the member's
//!   `topologyVersion` as mongod's do. Sharded: every router is a mongos (`msg: "isdbgrid"`)
//!   with `recoveryToken`s in transactions, in front of `EmulatorConfig::shards` logical shards
//!   (`sharding`: shard keys and chunk ownership; data stays in the one store) whose models
//!   the routers charge for each request they forward (`routing`).
//! * Awaitable hello waits up to `maxAwaitTimeMS` (capped by `max_await_time`), in exhaust
//!   mode when `exhaustAllowed` is set. Elections bump every member's `topologyVersion` counter
//!   and answer pending awaitable hellos at once; after an error that makes a driver mark a
//!   member unknown without a `topologyVersion` (shutdown codes) pending awaitable hellos are
//!   answered 50 ms later instead of after the whole wait.
//! * Retryable writes: `(lsid, txnNumber)` → stored reply (a repeat returns it without
//!   executing; a lower number is 225). Transactions run on a private copy of the store and
//!   commit by swapping it in (nothing else wrote) or replaying their writes; documents changed
//!   by two open transactions give 112 WriteConflict; real statement errors abort.
//! * Change streams read a bounded change log that records writes once any stream was opened.
//! * Authentication (`auth`, `scram`): SCRAM-SHA-1/256, required only when users were
//!   configured at start; authorization is not modelled (any authenticated user may do all).
//! * Not modelled: OP_COMPRESSED (the connection is closed), load-balanced
//!   mode, `maxTimeMS` outside `blockConnection` and the overload model, read concern levels.

mod auth;
mod changes;
mod commands;
mod conn;
mod current_op;
mod cursor;
mod data;
mod db_stats;
pub mod error;
mod explain;
pub mod failpoint;
mod hello;
mod legacy;
pub mod mangle;
mod repl;
mod routing;
mod scram;
mod send;
mod session;
mod sharding;
mod snapshot;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bson::{doc, oid::ObjectId, Bson, Document, Timestamp};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::engine::Store;
use cursor::Cursors;
use failpoint::FailPoint;
use session::Sessions;

pub use auth::UserConfig;
pub use repl::{StepDown, StepDownSchedule};

/// Shape of the emulated deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One mongod without replication: no transactions, no retryable writes.
    Standalone,
    /// A replica set of `members` mongods; member 0 is the primary.
    ReplicaSet {
        /// `setName`.
        name: String,
        /// Number of members (at least 1).
        members: usize,
    },
    /// `routers` mongos processes in front of [`EmulatorConfig::shards`] logical shards that
    /// share one store (each shard with its own overload model).
    Sharded {
        /// Number of mongos (at least 1).
        routers: usize,
    },
}

/// Configuration of an [`Emulator`].
#[derive(Debug, Clone)]
pub struct EmulatorConfig {
    /// Deployment shape.
    pub topology: Topology,
    /// Version reported by `buildInfo` (e.g. `"8.2.0"`).
    pub server_version: String,
    /// `maxWireVersion` reported by hello.
    pub max_wire_version: i32,
    /// Port of the first member (the others follow consecutively); `None` = ephemeral ports.
    pub port: Option<u16>,
    /// Address to bind.
    pub bind: IpAddr,
    /// Idle cursors are closed after this long (mongod's `cursorTimeoutMillis`, 10 minutes).
    pub cursor_timeout: Duration,
    /// `logicalSessionTimeoutMinutes` in hello.
    pub logical_session_timeout_minutes: i32,
    /// Report `topologyVersion` in hello and support awaitable hello (makes the driver stream).
    pub topology_version: bool,
    /// Answer awaitable hellos sent with `exhaustAllowed` in exhaust mode (`moreToCome`
    /// replies every `maxAwaitTimeMS` without further requests), as mongod does.
    pub exhaust_hello: bool,
    /// Upper bound on an awaitable hello's wait, whatever `maxAwaitTimeMS` says.
    pub max_await_time: Duration,
    /// Most cursors open at once, per connection.
    pub max_cursors_per_connection: usize,
    /// Most cursors open at once in total.
    pub max_cursors: usize,
    /// Most sessions tracked at once (older idle ones are forgotten).
    pub max_sessions: usize,
    /// Most handshake records kept for [`Emulator::client_metadata`].
    pub max_metadata_records: usize,
    /// Data-bearing members counted for a numeric write concern `w` (a larger `w` gets a
    /// 100 UnsatisfiableWriteConcern write concern error). `None`: 1 for standalone, otherwise
    /// at least 3, so suites written for three-member sets also pass on smaller emulated sets.
    pub write_concern_nodes: Option<usize>,
    /// Most transactions in progress at once (each holds a private copy of the store).
    pub max_transactions: usize,
    /// Transactions still open after this long are aborted (`transactionLifetimeLimitSeconds`).
    pub transaction_lifetime: Duration,
    /// Initial value of the `externalClientBaseBackoffMS` server parameter (0: no
    /// `baseBackoffMS` on overload errors).
    pub base_backoff_ms: i32,
    /// The load-shedding model (ingress limiter, tickets, virtual cores) of every member
    /// without an entry in `member_overload`; off by default. Each member runs a model of its
    /// own (its own cores, tickets, limiter and counters), as each mongod or mongos process has
    /// its own resources. Changeable at run time per member with
    /// `setParameter: {labOverload: {...}}` sent to that member, or for several members with
    /// `setParameter: {labOverloadMembers: {"<index>" | "all": {...}}}` sent to any. In a
    /// sharded deployment of two or more shards it is the model of every shard instead, and the
    /// routers' models are off unless `member_overload` names them (see [`EmulatorConfig::shards`]).
    pub overload: crate::model::ModelConfig,
    /// Per-member models by member index (0 = the first member: the primary of a replica set,
    /// the first router), replacing `overload` for that member. An index beyond the deployment's
    /// members makes [`Emulator::start`] fail.
    pub member_overload: std::collections::BTreeMap<usize, crate::model::ModelConfig>,
    /// Shards behind the routers of a [`Topology::Sharded`] deployment (at least 1; ignored
    /// otherwise). A field here rather than in the variant, so `Topology::Sharded { routers }`
    /// keeps meaning what it always did.
    ///
    /// Which model charges what: with one shard (the default) the deployment behaves as it
    /// always did: the routers' models are `member_overload[i]`, else `overload`, and the
    /// shard's model is `shard_overload[0]`, else off. With two or more shards, `overload` is the
    /// default of every shard (`shard_overload` replaces it per shard) and the routers' models
    /// are off unless `member_overload` names them, since the shards do the work a mongos
    /// forwards. Changeable at run time with `setParameter: {labOverloadShards: {...}}`.
    pub shards: usize,
    /// Per-shard models by shard index, replacing the default above for that shard. An index
    /// beyond the shards makes [`Emulator::start`] fail.
    pub shard_overload: std::collections::BTreeMap<usize, crate::model::ModelConfig>,
    /// Users created at start (SCRAM-SHA-1 and SCRAM-SHA-256 credentials each). When there are
    /// any, authentication is required, as on a mongod started with `--auth`: every command
    /// but the handshake, authentication and a few harmless ones needs an authenticated
    /// connection (13 Unauthorized otherwise). Empty (the default): no authentication required.
    pub users: Vec<UserConfig>,
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        EmulatorConfig {
            topology: Topology::Standalone,
            server_version: "8.2.0".to_string(),
            max_wire_version: 25,
            port: None,
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            cursor_timeout: Duration::from_secs(600),
            logical_session_timeout_minutes: 30,
            topology_version: true,
            exhaust_hello: true,
            max_await_time: Duration::from_secs(60),
            max_cursors_per_connection: 1000,
            max_cursors: 20_000,
            max_sessions: 10_000,
            max_metadata_records: 10_000,
            write_concern_nodes: None,
            max_transactions: 1000,
            transaction_lifetime: Duration::from_secs(60),
            overload: crate::model::ModelConfig::default(),
            member_overload: std::collections::BTreeMap::new(),
            base_backoff_ms: 0,
            shards: 1,
            shard_overload: std::collections::BTreeMap::new(),
            users: Vec::new(),
        }
    }
}

/// What a member is in the emulated deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Standalone,
    Primary,
    Secondary,
    Mongos,
}

/// One listening member (a mongod or mongos).
pub(crate) struct Member {
    pub(crate) index: usize,
    pub(crate) role: Role,
    pub(crate) addr: SocketAddr,
    /// `host:port` as advertised (and as listed in the URI).
    pub(crate) host: String,
    pub(crate) process_id: ObjectId,
    pub(crate) fail_point: Mutex<FailPoint>,
    /// mongod's `onPrimaryTransactionalWrite`: acts on retryable writes (close the connection
    /// after the write, or fail before it with `failBeforeCommitExceptionCode`).
    pub(crate) primary_write_fail_point: Mutex<FailPoint>,
    /// mongod's `failGetMoreAfterCursorCheckout`: fails getMores (`errorCode`) or closes their
    /// connection (`closeConnection`).
    pub(crate) get_more_fail_point: Mutex<FailPoint>,
    /// Wakes pending awaitable hellos early (after errors that make drivers mark the member
    /// unknown).
    pub(crate) wake: tokio::sync::Notify,
    /// This member's overload model: every command it receives goes through it.
    pub(crate) model: Arc<crate::model::Model>,
}

/// Server parameters readable with getParameter and settable with setParameter.
#[derive(Debug, Clone)]
pub(crate) struct Params {
    pub(crate) values: Document,
}

/// State that every command may touch, guarded by one lock (commands are short and never await
/// while holding it).
pub(crate) struct State {
    pub(crate) store: Store,
    pub(crate) sessions: Sessions,
    pub(crate) cursors: Cursors,
    pub(crate) params: Params,
    pub(crate) changes: changes::ChangeLog,
    /// Store copies for snapshot reads at a cluster time (empty until the first one).
    pub(crate) snapshots: snapshot::SnapshotHistory,
    /// Collections (`(db, coll)`) with `changeStreamPreAndPostImages` enabled (`collMod`):
    /// their change events keep pre- and post-images.
    pub(crate) pre_post_images: std::collections::BTreeSet<(String, String)>,
    /// Bumped by every write to `store` (transactions commit by swapping in their copy when
    /// nothing else wrote meanwhile).
    pub(crate) write_version: u64,
    cluster_time: Timestamp,
}

impl State {
    /// Advances and returns the cluster time (seconds since the epoch, increment).
    pub(crate) fn tick(&mut self) -> Timestamp {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0) as u32;
        if now > self.cluster_time.time {
            self.cluster_time = Timestamp {
                time: now,
                increment: 1,
            };
        } else {
            self.cluster_time.increment = self.cluster_time.increment.wrapping_add(1).max(1);
        }
        self.cluster_time
    }
}

/// Counters for serverStatus.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) connections_current: AtomicI64,
    pub(crate) connections_total: AtomicI64,
    pub(crate) commands: AtomicI64,
    pub(crate) inserts: AtomicI64,
    pub(crate) queries: AtomicI64,
    pub(crate) updates: AtomicI64,
    pub(crate) deletes: AtomicI64,
    pub(crate) getmores: AtomicI64,
}

/// Everything shared by the listeners and connection tasks.
pub(crate) struct Shared {
    pub(crate) config: EmulatorConfig,
    pub(crate) members: Vec<Arc<Member>>,
    pub(crate) state: Mutex<State>,
    pub(crate) metadata: Mutex<std::collections::VecDeque<Document>>,
    pub(crate) counters: Counters,
    pub(crate) next_connection_id: AtomicI64,
    pub(crate) next_conn_serial: AtomicU64,
    /// Who is primary, the term and the members' topology counters (replica sets).
    pub(crate) repl: Mutex<repl::ReplState>,
    pub(crate) started: Instant,
    pub(crate) shutdown: watch::Receiver<bool>,
    /// Signalled when change events were recorded (wakes waiting change-stream getMores).
    pub(crate) changes_notify: tokio::sync::Notify,
    /// Every user (mongod's `admin.system.users`), shared by all members as if replicated.
    pub(crate) users: Mutex<auth::Users>,
    /// Whether commands need an authenticated connection (users were configured at start).
    pub(crate) auth_required: bool,
    /// Lab-only reply mangling (`labMangleReplies`), off by default.
    pub(crate) mangler: mangle::Mangler,
    /// The shard layer behind the routers (sharded deployments only).
    pub(crate) sharding: Option<sharding::Sharding>,
}

/// Locks a mutex, recovering the data if a previous holder panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub(crate) fn is_replicated(&self) -> bool {
        !matches!(self.config.topology, Topology::Standalone)
    }

    pub(crate) fn set_name(&self) -> Option<&str> {
        match &self.config.topology {
            Topology::ReplicaSet { name, .. } => Some(name),
            _ => None,
        }
    }

    pub(crate) fn record_metadata(&self, record: Document) {
        let mut md = lock(&self.metadata);
        while md.len() >= self.config.max_metadata_records.max(1) {
            md.pop_front();
        }
        md.push_back(record);
    }
}

/// A running emulator. Dropping it without [`Emulator::shutdown`] stops the listeners too (the
/// tasks notice the closed shutdown channel).
pub struct Emulator {
    shared: Arc<Shared>,
    shutdown_tx: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

fn default_params() -> Document {
    doc! {
        "externalClientBaseBackoffMS": 0i32,
        // Lab-only: `{value: <any BSON>}` is sent verbatim as `baseBackoffMS` on overload
        // errors (instead of externalClientBaseBackoffMS), so tests can check how drivers cope
        // with doubles, negatives or strings there. `{}` turns it off.
        "labRawBaseBackoffMS": {},
        // Lab-only: results in a client bulkWrite's first batch (0: all), see DataCtx.
        "labBulkWriteBatchSize": 0i32,
        "featureCompatibilityVersion": { "version": "8.0" },
        "requireApiVersion": false,
        "enableTestCommands": 1i32,
        "authenticationMechanisms": ["SCRAM-SHA-1", "SCRAM-SHA-256"],
        // Iterations of new SCRAM credentials (createUser, updateUser), as mongod's defaults.
        "scramIterationCount": 10_000i32,
        "scramSHA256IterationCount": 15_000i32,
        "transactionLifetimeLimitSeconds": 60i32,
        "cursorTimeoutMillis": 600_000i64,
        "logicalSessionRefreshMillis": 300_000i32,
        "maxTransactionLockRequestTimeoutMillis": 5i32,
        // mongos's retries of a shard's RetryableError (server/routing.rs), mongos's defaults.
        routing::MAX_RETRY_ATTEMPTS_PARAM: routing::DEFAULT_MAX_RETRY_ATTEMPTS,
        routing::BASE_BACKOFF_PARAM: routing::DEFAULT_BASE_BACKOFF_MS,
        routing::MAX_BACKOFF_PARAM: routing::DEFAULT_MAX_BACKOFF_MS,
        // Lab-only: the labels of a shard's overload error a router gives up on (routing.rs).
        routing::SHARD_ERROR_LABELS_PARAM: routing::LABELS_AS_MONGOS,
    }
}

impl Emulator {
    /// Binds one listener per member and starts serving.
    pub async fn start(config: EmulatorConfig) -> std::io::Result<Emulator> {
        let roles: Vec<Role> = match &config.topology {
            Topology::Standalone => vec![Role::Standalone],
            Topology::ReplicaSet { members, .. } => (0..(*members).max(1))
                .map(|i| {
                    if i == 0 {
                        Role::Primary
                    } else {
                        Role::Secondary
                    }
                })
                .collect(),
            Topology::Sharded { routers } => vec![Role::Mongos; (*routers).max(1)],
        };
        let mut listeners = Vec::new();
        for i in 0..roles.len() {
            let port = match config.port {
                Some(p) => p.checked_add(i as u16).ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, "port range overflows")
                })?,
                None => 0,
            };
            listeners.push(TcpListener::bind(SocketAddr::new(config.bind, port)).await?);
        }
        let advertised_ip = if config.bind.is_unspecified() {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            config.bind
        };
        if let Some(index) = config
            .member_overload
            .keys()
            .find(|i| **i >= listeners.len())
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "member_overload names member {index}, but the deployment has {} member(s)",
                    listeners.len()
                ),
            ));
        }
        let shard_count = match config.topology {
            Topology::Sharded { .. } => config.shards.max(1),
            _ => 0,
        };
        if let Some(index) = config.shard_overload.keys().find(|i| **i >= shard_count) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "shard_overload names shard {index}, but the deployment has {shard_count} shard(s)"
                ),
            ));
        }
        // With two or more shards the shards carry `overload` and the routers are off unless
        // named; otherwise every member carries it, as always (see EmulatorConfig::shards).
        let off = crate::model::ModelConfig::default();
        let member_default = if shard_count >= 2 {
            &off
        } else {
            &config.overload
        };
        let mut members = Vec::new();
        for (index, (listener, role)) in listeners.iter().zip(roles).enumerate() {
            let model_config = config
                .member_overload
                .get(&index)
                .unwrap_or(member_default)
                .clone();
            let model = crate::model::Model::for_member(model_config, index).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("overload model of member {index}: {e}"),
                )
            })?;
            let addr = listener.local_addr()?;
            let host = SocketAddr::new(advertised_ip, addr.port()).to_string();
            members.push(Arc::new(Member {
                index,
                role,
                addr,
                host,
                process_id: ObjectId::new(),
                fail_point: Mutex::new(FailPoint::default()),
                primary_write_fail_point: Mutex::new(FailPoint::default()),
                get_more_fail_point: Mutex::new(FailPoint::default()),
                wake: tokio::sync::Notify::new(),
                model,
            }));
        }
        let sharding = if shard_count > 0 {
            let shard_default = if shard_count >= 2 {
                &config.overload
            } else {
                &off
            };
            let mut models = Vec::new();
            for index in 0..shard_count {
                let model_config = config
                    .shard_overload
                    .get(&index)
                    .unwrap_or(shard_default)
                    .clone();
                // Salted after the members, so shards and routers sharing a seed draw apart.
                let model = crate::model::Model::for_member(model_config, members.len() + index)
                    .map_err(|e| {
                        std::io::Error::new(
                            std::io::ErrorKind::InvalidInput,
                            format!("overload model of shard {index}: {e}"),
                        )
                    })?;
                models.push(model);
            }
            Some(sharding::Sharding::new(models, config.max_cursors))
        } else {
            None
        };
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let mut params = default_params();
        params.insert(
            "cursorTimeoutMillis",
            config.cursor_timeout.as_millis() as i64,
        );
        params.insert("externalClientBaseBackoffMS", config.base_backoff_ms.max(0));
        let version: Vec<&str> = config.server_version.split('.').collect();
        if version.len() >= 2 {
            params.insert(
                "featureCompatibilityVersion",
                doc! { "version": format!("{}.{}", version[0], version[1]) },
            );
        }
        // PBKDF2 at mongod's iteration counts: worth keeping off the runtime's threads.
        let user_configs = config.users.clone();
        let users = tokio::task::spawn_blocking(move || auth::Users::from_config(&user_configs))
            .await
            .map_err(|e| std::io::Error::other(format!("deriving user credentials: {e}")))?
            .map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("users: {e}"))
            })?;
        let auth_required = !config.users.is_empty();
        let repl_state = repl::ReplState::new(&config.topology, members.len());
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                store: Store::new(),
                sessions: Sessions::default(),
                cursors: Cursors::default(),
                params: Params { values: params },
                changes: Default::default(),
                snapshots: Default::default(),
                pre_post_images: Default::default(),
                write_version: 0,
                cluster_time: Timestamp {
                    time: 0,
                    increment: 0,
                },
            }),
            members,
            metadata: Mutex::new(Default::default()),
            counters: Counters::default(),
            next_connection_id: AtomicI64::new(1),
            next_conn_serial: AtomicU64::new(1),
            repl: Mutex::new(repl_state),
            started: Instant::now(),
            shutdown: shutdown_rx,
            changes_notify: tokio::sync::Notify::new(),
            users: Mutex::new(users),
            auth_required,
            mangler: mangle::Mangler::default(),
            sharding,
            config,
        });
        let mut tasks = JoinSet::new();
        for (listener, member) in listeners.into_iter().zip(shared.members.clone()) {
            tasks.spawn(accept_loop(shared.clone(), member, listener));
        }
        tasks.spawn(reaper(shared.clone()));
        tracing::info!(uri = %uri_for(&shared), "emulator started");
        Ok(Emulator {
            shared,
            shutdown_tx,
            tasks,
        })
    }

    /// The connection string of the deployment.
    pub fn uri(&self) -> String {
        uri_for(&self.shared)
    }

    /// The connection string with `user`'s credentials (percent-encoded) and its
    /// `authSource`, for a deployment started with [`EmulatorConfig::users`].
    pub fn uri_with_credentials(&self, user: &UserConfig) -> String {
        let plain = uri_for(&self.shared);
        let rest = plain.strip_prefix("mongodb://").unwrap_or(&plain);
        let (hosts, options) = rest.split_once("/").unwrap_or((rest, ""));
        let options = options.strip_prefix('?').unwrap_or(options);
        let mut query = format!("authSource={}", percent_encode(&user.db));
        if !options.is_empty() {
            query = format!("{options}&{query}");
        }
        format!(
            "mongodb://{}:{}@{hosts}/?{query}",
            percent_encode(&user.name),
            percent_encode(&user.password)
        )
    }

    /// The address of every member, in member order.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        self.shared.members.iter().map(|m| m.addr).collect()
    }

    /// The `client` document of every handshake so far (oldest first, bounded), each with the
    /// handshake's `backpressure` value added under the key `backpressure` when it was sent.
    pub fn client_metadata(&self) -> Vec<Document> {
        lock(&self.shared.metadata).iter().cloned().collect()
    }

    /// The overload model of the first member (the standalone, the replica set's primary, the
    /// first router): [`Model::snapshot`](crate::model::Model::snapshot) for counters, gauges
    /// and queue waits, [`Model::series`](crate::model::Model::series) for the per-second
    /// samples, [`Model::set_parameters`](crate::model::Model::set_parameters) to change it (the
    /// same as `serverStatus` / `setParameter` of `labOverload` on that member). Other members'
    /// models: [`Emulator::member_overload`].
    pub fn overload(&self) -> Arc<crate::model::Model> {
        // start() always creates at least one member.
        match self.shared.members.first() {
            Some(m) => m.model.clone(),
            None => crate::model::Model::disabled(),
        }
    }

    /// The overload model of member `index` (in [`Emulator::addresses`] order), or `None` past
    /// the last member.
    pub fn member_overload(&self, index: usize) -> Option<Arc<crate::model::Model>> {
        self.shared.members.get(index).map(|m| m.model.clone())
    }

    /// Every member's overload model, in member order.
    pub fn overload_models(&self) -> Vec<Arc<crate::model::Model>> {
        self.shared
            .members
            .iter()
            .map(|m| m.model.clone())
            .collect()
    }

    /// The overload model of shard `index` of a sharded deployment (`shard0` is 0), or `None`
    /// past the last shard and for other deployments. The same model `serverStatus` reports in
    /// `labOverloadShards` and `setParameter: {labOverloadShards: ...}` changes.
    pub fn shard_overload(&self, index: usize) -> Option<Arc<crate::model::Model>> {
        self.shared
            .sharding
            .as_ref()
            .and_then(|s| s.shards.get(index))
            .map(|s| s.model.clone())
    }

    /// Every shard's overload model, in shard order (empty unless the deployment is sharded).
    pub fn shard_overload_models(&self) -> Vec<Arc<crate::model::Model>> {
        self.shared
            .sharding
            .as_ref()
            .map(|s| s.shards.iter().map(|s| s.model.clone()).collect())
            .unwrap_or_default()
    }

    /// Turns lab-only reply mangling on (`Some`) or off (`None`), as `setParameter:
    /// {labMangleReplies: …}` does; returns the previous configuration. See
    /// [`mangle`](crate::server::mangle).
    pub fn set_reply_mangling(
        &self,
        config: Option<mangle::MangleConfig>,
    ) -> Option<mangle::MangleConfig> {
        self.shared.mangler.configure(config)
    }

    /// Reply-mangling counters since the emulator started.
    pub fn reply_mangling_report(&self) -> mangle::MangleReport {
        self.shared.mangler.report()
    }

    /// Takes (and clears) the log of replies to requests that carried a string `comment`,
    /// recorded while mangling was on with `log: true`.
    pub fn take_reply_mangling_log(&self) -> Vec<mangle::MangleRecord> {
        self.shared.mangler.take_log()
    }

    /// Steps the replica set's primary down, as `replSetStepDown` sent to it does: it becomes a
    /// secondary at once, aborts the transactions in progress, cannot be elected again for
    /// `step_down_for`, and another electable member becomes primary after `election_delay`.
    /// Fails if the deployment is not a replica set, has no primary right now, or (without
    /// `force`) has no other electable member.
    pub fn step_down(&self, request: &StepDown) -> Result<(), String> {
        if self.shared.set_name().is_none() {
            return Err("not a replica set".to_string());
        }
        let Some(primary) = self.primary() else {
            return Err("the replica set has no primary right now".to_string());
        };
        repl::step_down(&self.shared, primary, request).map_err(|e| e.errmsg)
    }

    /// Steps the primary down every `every` with `request` (the lab's failover fault) until the
    /// returned schedule is dropped or the emulator shuts down. Needs a Tokio runtime.
    pub fn schedule_step_downs(&self, every: Duration, request: StepDown) -> StepDownSchedule {
        StepDownSchedule::start(self.shared.clone(), every, request)
    }

    /// The member index of the replica set's primary (`None` during an election, and for
    /// other deployments).
    pub fn primary(&self) -> Option<usize> {
        lock(&self.shared.repl).primary
    }

    /// Elections won since start (each step-down is followed by one, unless no member is
    /// electable).
    pub fn elections(&self) -> u64 {
        lock(&self.shared.repl).elections
    }

    /// Closes the listeners and all connections and waits for every task to finish.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown_tx.send(true);
        while self.tasks.join_next().await.is_some() {}
        tracing::info!("emulator stopped");
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters (user names and passwords in
/// a connection string).
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn uri_for(shared: &Shared) -> String {
    let hosts: Vec<&str> = shared.members.iter().map(|m| m.host.as_str()).collect();
    let mut uri = format!("mongodb://{}/", hosts.join(","));
    if let Some(name) = shared.set_name() {
        uri.push_str(&format!("?replicaSet={name}"));
    }
    uri
}

async fn accept_loop(shared: Arc<Shared>, member: Arc<Member>, listener: TcpListener) {
    let mut shutdown = shared.shutdown.clone();
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            res = listener.accept() => match res {
                Ok((stream, peer)) => {
                    let serial = shared.next_conn_serial.fetch_add(1, Ordering::Relaxed);
                    conns.spawn(conn::serve(shared.clone(), member.clone(), stream, peer, serial));
                }
                Err(e) => {
                    tracing::warn!(member = member.index, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

/// Closes idle cursors periodically.
async fn reaper(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.clone();
    let period =
        (shared.config.cursor_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {
                let mut st = shared.state();
                st.cursors.reap(shared.config.cursor_timeout);
                let idle = Duration::from_secs(60 * shared.config.logical_session_timeout_minutes.max(1) as u64);
                st.sessions.reap(idle, shared.config.transaction_lifetime);
            }
            _ = shutdown.changed() => break,
        }
    }
}

/// `$clusterTime` document for a reply.
pub(crate) fn cluster_time_doc(ts: Timestamp) -> Bson {
    Bson::Document(doc! {
        "clusterTime": ts,
        "signature": {
            "hash": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![0u8; 20] },
            "keyId": 0i64,
        },
    })
}
