//! Helpers shared by the integration tests that drive the emulator with real drivers.

#![allow(dead_code)] // each test binary uses a different subset

use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use emulator::{Emulator, EmulatorConfig, Topology};

/// An emulator on its own runtime thread, so tests may pause their own clock without pausing
/// the server's.
pub struct Server {
    pub uri: String,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    pub fn start(topology: Topology) -> Self {
        let (uri_tx, uri_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("emulator runtime");
            rt.block_on(async move {
                let config = EmulatorConfig {
                    topology,
                    ..EmulatorConfig::default()
                };
                let emulator = Emulator::start(config).await.expect("emulator starts");
                uri_tx.send(emulator.uri()).expect("test waits for the uri");
                let _ = tokio::task::spawn_blocking(move || stop_rx.recv()).await;
                emulator.shutdown().await;
            });
        });
        let uri = uri_rx.recv().expect("emulator reports its uri");
        Self {
            uri,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    pub fn standalone() -> Self {
        Self::start(Topology::Standalone)
    }

    pub fn replica_set() -> Self {
        Self::replica_set_of(1)
    }

    pub fn replica_set_of(members: usize) -> Self {
        Self::start(Topology::ReplicaSet {
            name: "rs0".into(),
            members,
        })
    }

    /// A load-balanced connection string to the first router of a sharded emulator, with
    /// retryable reads and writes on: the driver pins cursors and transactions to one connection.
    pub fn load_balanced_uri(&self) -> String {
        let router = self
            .uri
            .trim_start_matches("mongodb://")
            .split(['/', '?', ','])
            .next()
            .expect("a router address");
        format!("mongodb://{router}/?loadBalanced=true&retryWrites=true&retryReads=true")
    }

    /// The connection string with extra options appended.
    pub fn uri_with(&self, options: &str) -> String {
        let sep = if self.uri.contains('?') { '&' } else { '?' };
        format!("{}{sep}{options}", self.uri)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Configures a fail point from inside a command-event callback, before the driver goes on: the
/// callback cannot await, so a helper thread with its own runtime and client does the work and
/// the callback waits for it.
pub fn fail_point_blocking(uri: &str, spec: mongodb::bson::Document) {
    let uri = uri.to_owned();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let client = mongodb::Client::with_uri_str(&uri).await.expect("client");
            client
                .database("admin")
                .run_command(spec)
                .await
                .expect("configureFailPoint");
        });
    })
    .join()
    .expect("fail point thread");
}

/// Every command a client started, in order, as its command event handler pushed them.
#[derive(Clone, Default)]
pub struct Started(pub Arc<Mutex<Vec<bson::Document>>>);

impl Started {
    /// The started commands called `name`.
    pub fn named(&self, name: &str) -> Vec<bson::Document> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.keys().next().map(String::as_str) == Some(name))
            .cloned()
            .collect()
    }

    /// Waits until a command called `name` has started; panics after 5 s, so that a test whose
    /// command never goes out fails instead of hanging.
    pub async fn wait_for(&self, name: &str) {
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while self.named(name).is_empty() {
            assert!(
                std::time::Instant::now() < give_up,
                "no {name} started within 5 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}

/// Counts the `find` commands a client starts: one per attempt sent.
#[derive(Clone, Default)]
pub struct FindAttempts(Arc<std::sync::atomic::AtomicUsize>);

impl FindAttempts {
    pub fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A fork client on `uri` that counts the `find` attempts it sends.
pub async fn client_counting_finds(uri: &str) -> (mongodb::Client, FindAttempts) {
    use mongodb::event::{command::CommandEvent, EventHandler};
    let mut options = mongodb::options::ClientOptions::parse(uri)
        .await
        .expect("valid uri");
    let attempts = FindAttempts::default();
    let sink = attempts.clone();
    options.command_event_handler = Some(EventHandler::callback(move |event: CommandEvent| {
        if let CommandEvent::Started(e) = event {
            if e.command_name == "find" {
                sink.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }));
    (
        mongodb::Client::with_options(options).expect("client"),
        attempts,
    )
}

/// Turns the `failCommand` fail point off through a separate client.
pub async fn fail_command_off(uri: &str) {
    let client = mongodb::Client::with_uri_str(uri).await.expect("client");
    client
        .database("admin")
        .run_command(mongodb::bson::doc! { "configureFailPoint": "failCommand", "mode": "off" })
        .await
        .expect("configureFailPoint off");
}

/// Starts `count` finds on `coll` in the background that the server at `uri` holds for
/// `block_ms` each (a `blockConnection` fail point on its next `count` finds), so that they
/// keep `count` of the client's connections and concurrency slots that long. The caller waits
/// for them to be in flight as its test needs.
pub async fn slow_finds(
    uri: &str,
    coll: &mongodb::Collection<mongodb::bson::Document>,
    count: i32,
    block_ms: i32,
) -> Vec<tokio::task::JoinHandle<mongodb::error::Result<()>>> {
    fail_find(
        uri,
        mongodb::bson::doc! { "times": count }.into(),
        mongodb::bson::doc! { "blockConnection": true, "blockTimeMS": block_ms },
    )
    .await;
    (0..count)
        .map(|_| {
            let coll = coll.clone();
            tokio::spawn(async move { coll.find_one(mongodb::bson::doc! {}).await.map(|_| ()) })
        })
        .collect()
}

/// [`slow_finds`] of one find.
pub async fn slow_find(
    uri: &str,
    coll: &mongodb::Collection<mongodb::bson::Document>,
    block_ms: i32,
) -> tokio::task::JoinHandle<mongodb::error::Result<()>> {
    let mut one = slow_finds(uri, coll, 1, block_ms).await;
    one.pop().expect("one find started")
}

/// Sets a `failCommand` fail point on `find` through a separate client (so that its commands
/// are not operations of the client under test).
pub async fn fail_find(uri: &str, mode: mongodb::bson::Bson, data: mongodb::bson::Document) {
    let client = mongodb::Client::with_uri_str(uri).await.expect("client");
    let mut data = data;
    data.insert("failCommands", vec!["find"]);
    client
        .database("admin")
        .run_command(
            mongodb::bson::doc! { "configureFailPoint": "failCommand", "mode": mode, "data": data },
        )
        .await
        .expect("configureFailPoint");
}

/// Whether `error` is the fork's local overload rejection (the throttle, or a slot wait without
/// `timeoutMS` that reached `serverSelectionTimeoutMS`).
pub fn is_local_rejection(error: &mongodb::error::Error) -> bool {
    matches!(
        *error.kind,
        mongodb::error::ErrorKind::LocalOverloadRejection { .. }
    )
}

// `timeoutMS` tests: the shared client, fail point and reading helpers of `timeouts.rs`,
// `cursor_timeouts.rs`, `session_timeouts.rs` and `gridfs_timeouts.rs`.

pub fn ms(millis: u64) -> std::time::Duration {
    std::time::Duration::from_millis(millis)
}

/// Whether `error` is the driver's `timeoutMS` expiry.
pub fn is_timeout(error: &mongodb::error::Error) -> bool {
    matches!(*error.kind, mongodb::error::ErrorKind::Timeout { .. })
}

/// The `maxTimeMS` of a started command (`None` when it has none).
pub fn max_time_of(command: &bson::Document) -> Option<i64> {
    match command.get("maxTimeMS") {
        Some(bson::Bson::Int64(v)) => Some(*v),
        Some(bson::Bson::Int32(v)) => Some(i64::from(*v)),
        Some(other) => panic!("maxTimeMS of unexpected type: {other:?}"),
        None => None,
    }
}

/// A fork client for `uri` with client-level `timeout`, recording every command it starts.
pub async fn client_with(
    uri: &str,
    timeout: Option<std::time::Duration>,
) -> (mongodb::Client, Started) {
    use mongodb::event::{command::CommandEvent, EventHandler};
    let mut options = mongodb::options::ClientOptions::parse(uri)
        .await
        .expect("valid uri");
    options.timeout = timeout;
    let started = Started::default();
    let sink = started.clone();
    options.command_event_handler = Some(EventHandler::callback(move |event: CommandEvent| {
        if let CommandEvent::Started(e) = event {
            sink.0.lock().unwrap().push(e.command);
        }
    }));
    (
        mongodb::Client::with_options(options).expect("client"),
        started,
    )
}

/// Configures fail point `spec` through a client of its own, so that the client under test has
/// no earlier successful attempt (whose service time would take part in its retry decisions).
pub async fn fail_point(uri: &str, spec: bson::Document) {
    let client = mongodb::Client::with_uri_str(uri).await.expect("client");
    client
        .database("admin")
        .run_command(spec)
        .await
        .expect("configureFailPoint");
}

/// Blocks the next `times` runs of `command` for `block_ms` before they are answered.
pub async fn block_commands(uri: &str, command: &str, times: i32, block_ms: i32) {
    fail_point(
        uri,
        bson::doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": times },
            "data": { "failCommands": [command], "blockConnection": true, "blockTimeMS": block_ms },
        },
    )
    .await;
}
