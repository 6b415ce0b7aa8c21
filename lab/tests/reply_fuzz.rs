//! Fuzzed server replies (issue 16, item 3): the fork (`mongodb`) and the official driver
//! (`mongodb_upstream`, crates.io 3.9.1) run mixed operations against an emulator that damages
//! replies on a seeded schedule (`labMangleReplies`, `emulator/src/server/mangle.rs`).
//!
//! Each operation runs in its own task under an outer watchdog, so the run tells apart:
//!
//! * **panics**: the task's `JoinError::is_panic`, plus any panic anywhere in the process (a
//!   panic hook counts those of the driver's background tasks);
//! * **hangs**: the operation did not return within its timeouts plus a margin (the fork runs
//!   with `timeoutMS`; upstream has no operation timeout, so a reply that never completes holds
//!   it until the watchdog);
//! * **wrong successes**: the operation returned `Ok` although the last reply the server sent
//!   for it (found through the operation's unique `comment`, which the emulator logs with each
//!   reply) has the verdict `MustFail`: `ok` not the number 1, a write concern error, an
//!   unreadable write error, cursor id or batch, or a frame the driver cannot have read (see
//!   `MangleKind::verdict`). Byte flips and a cursor's namespace are `Undetermined` and only
//!   counted.
//!
//! The fork is asserted to have none of the three. Upstream's figures are printed beside the
//! fork's and not asserted. `seeded_mixed_operations_against_mangled_replies` runs in
//! `cargo xtask test` (480 operations per driver, about 280 mangled replies each; upstream's
//! run there leaves out `stall`, which would only measure its lack of a timeout); the ignored
//! `long_run_against_mangled_replies` is the lab run (at least 100,000 mangled replies per
//! driver by default; `REPLY_FUZZ_MANGLED` changes the target):
//! `cargo test -p lab --test reply_fuzz -- --ignored --nocapture`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use emulator::server::mangle::{MangleConfig, MangleKind, MangleRecord, Verdict};
use emulator::{Emulator, EmulatorConfig, Topology};

/// The fork's `timeoutMS` in these runs.
const FORK_TIMEOUT: Duration = Duration::from_millis(1500);
/// Time an operation may take beyond its timeouts before it counts as a hang.
const WATCHDOG_MARGIN: Duration = Duration::from_millis(2500);
/// Documents in the collection the cursor operations read.
const READ_DOCS: i32 = 6;
/// Driver calls a cursor operation makes at most (find with batch 3 over 6 documents: the find
/// and two getMores; aggregate with batch 4: the aggregate and one getMore), each bounded by
/// `timeoutMS` on its own.
const CURSOR_CALLS: u32 = 3;

/// How one operation ended.
#[derive(Debug, Clone, PartialEq)]
enum Ending {
    Ok,
    Err(String),
    Panic(String),
    Hang,
}

/// Panics seen by the process-wide hook (background tasks included), and the first messages.
static PANICS: AtomicU64 = AtomicU64::new(0);
static PANIC_MESSAGES: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn install_panic_counter() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            let mut messages = PANIC_MESSAGES.lock().unwrap_or_else(|p| p.into_inner());
            if messages.len() < 20 {
                messages.push(info.to_string());
            }
            drop(messages);
            previous(info);
        }));
    });
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".into()
    }
}

/// The mixed operations, by number (operation `i` runs kind `i % OP_KINDS`).
const OP_KINDS: u64 = 9;
const OP_NAMES: [&str; OP_KINDS as usize] = [
    "insertOne",
    "updateOne",
    "deleteOne",
    "find",
    "aggregate",
    "insertMany",
    "clientBulkWrite",
    "findOneAndUpdate",
    "countDocuments",
];

/// How long operation kind `kind` may take before it counts as a hang: the fork's `timeoutMS`
/// for each driver call the operation makes, plus the margin. Upstream has no operation timeout;
/// the same bound is its yardstick.
fn watchdog(kind: u64) -> Duration {
    let calls = if kind == 3 || kind == 4 {
        CURSOR_CALLS
    } else {
        1
    };
    FORK_TIMEOUT * calls + WATCHDOG_MARGIN
}

macro_rules! fuzz_driver {
    ($name:ident, $m:ident, $tweak:expr) => {
        mod $name {
            use super::*;
            use $m::options::ClientOptions;
            use $m::Client;

            async fn client(uri: &str, app: &str) -> Client {
                let mut opts = ClientOptions::parse(uri).await.expect("uri parses");
                if trace_on() {
                    use $m::event::{command::CommandEvent, EventHandler};
                    opts.command_event_handler =
                        Some(EventHandler::callback(|event: CommandEvent| match event {
                            CommandEvent::Started(e) => {
                                let comment = e.command.get_str("comment").ok();
                                trace_started(
                                    e.request_id,
                                    comment,
                                    &e.command_name,
                                    &e.connection,
                                );
                            }
                            CommandEvent::Succeeded(e) => trace_ended(e.request_id, "ok".into()),
                            CommandEvent::Failed(e) => {
                                trace_ended(e.request_id, format!("failed: {}", e.failure))
                            }
                            _ => {}
                        }));
                }
                opts.app_name = Some(app.to_string());
                opts.server_selection_timeout = Some(Duration::from_secs(2));
                opts.connect_timeout = Some(Duration::from_secs(2));
                opts.retry_writes = Some(true);
                opts.retry_reads = Some(true);
                let tweak: fn(&mut ClientOptions) = $tweak;
                tweak(&mut opts);
                Client::with_options(opts).expect("client builds")
            }

            /// Fills the read collection (over a client whose replies are not mangled).
            pub async fn prepare(uri: &str, db: &str) {
                let setup = client(uri, "reply-fuzz-setup").await;
                let coll = setup.database(db).collection::<Document>("read");
                let _ = coll.drop().await;
                let docs: Vec<Document> =
                    (0..READ_DOCS).map(|i| doc! { "_id": i, "v": i }).collect();
                coll.insert_many(docs)
                    .await
                    .expect("read collection filled");
                setup.shutdown().await;
            }

            /// Runs operation `i` (kind `i % OP_KINDS`) with comment `comment`.
            async fn operation(
                client: Client,
                db: String,
                i: u64,
                comment: String,
            ) -> Result<(), String> {
                use $m::options::{UpdateModifications, WriteModel};
                let database = client.database(&db);
                let read = database.collection::<Document>("read");
                let write = database.collection::<Document>("write");
                let c = Bson::String(comment.clone());
                let e = |e: $m::error::Error| e.to_string();
                match i % OP_KINDS {
                    0 => write
                        .insert_one(doc! { "_id": comment.clone() })
                        .comment(c)
                        .await
                        .map(drop)
                        .map_err(e),
                    1 => write
                        .update_one(doc! { "_id": "counter" }, doc! { "$inc": { "n": 1 } })
                        .upsert(true)
                        .comment(c)
                        .await
                        .map(drop)
                        .map_err(e),
                    2 => write
                        .delete_one(
                            doc! { "_id": format!("{db}-{}", i.saturating_sub(OP_KINDS + 2)) },
                        )
                        .comment(c)
                        .await
                        .map(drop)
                        .map_err(e),
                    3 => {
                        let mut cursor = read
                            .find(doc! {})
                            .batch_size(3)
                            .comment(c)
                            .await
                            .map_err(e)?;
                        let mut seen = 0;
                        while cursor.advance().await.map_err(e)? {
                            seen += 1;
                        }
                        // A reply that was read as success must have carried the real data.
                        if seen != READ_DOCS {
                            return Err(format!("find returned {seen} of {READ_DOCS} documents"));
                        }
                        Ok(())
                    }
                    4 => {
                        let mut cursor = read
                            .aggregate(vec![doc! { "$match": {} }])
                            .batch_size(4)
                            .comment(c)
                            .await
                            .map_err(e)?;
                        let mut seen = 0;
                        while cursor.advance().await.map_err(e)? {
                            seen += 1;
                        }
                        if seen != READ_DOCS {
                            return Err(format!(
                                "aggregate returned {seen} of {READ_DOCS} documents"
                            ));
                        }
                        Ok(())
                    }
                    5 => write
                        .insert_many((0..3).map(|k| doc! { "_id": format!("{comment}-{k}") }))
                        .comment(c)
                        .await
                        .map(drop)
                        .map_err(e),
                    6 => {
                        let ns = write.namespace();
                        let models = vec![
                            WriteModel::InsertOne(
                                $m::options::InsertOneModel::builder()
                                    .namespace(ns.clone())
                                    .document(doc! { "_id": format!("{comment}-bulk") })
                                    .build(),
                            ),
                            WriteModel::UpdateOne(
                                $m::options::UpdateOneModel::builder()
                                    .namespace(ns)
                                    .filter(doc! { "_id": "counter" })
                                    .update(UpdateModifications::Document(
                                        doc! { "$inc": { "b": 1 } },
                                    ))
                                    .upsert(true)
                                    .build(),
                            ),
                        ];
                        client
                            .bulk_write(models)
                            .comment(c)
                            .await
                            .map(drop)
                            .map_err(e)
                    }
                    7 => write
                        .find_one_and_update(doc! { "_id": "counter" }, doc! { "$inc": { "f": 1 } })
                        .upsert(true)
                        .comment(c)
                        .await
                        .map(drop)
                        .map_err(e),
                    _ => {
                        let n = read.count_documents(doc! {}).comment(c).await.map_err(e)?;
                        if n != READ_DOCS as u64 {
                            return Err(format!("count returned {n}, not {READ_DOCS}"));
                        }
                        Ok(())
                    }
                }
            }

            /// Runs `ops` operations on `workers` concurrent loops; each operation in its own
            /// task under the watchdog. Returns (comment, kind, ending) per operation.
            pub async fn run(
                uri: &str,
                db: &str,
                app: &str,
                ops: u64,
                workers: u64,
            ) -> Vec<(String, u64, Ending)> {
                let client = client(uri, app).await;
                let mut loops = tokio::task::JoinSet::new();
                for w in 0..workers {
                    let client = client.clone();
                    let db = db.to_string();
                    loops.spawn(async move {
                        let mut endings = Vec::new();
                        // Bounded: ops / workers iterations.
                        for i in (w..ops).step_by(workers as usize) {
                            let comment = format!("{db}-{i}");
                            if trace_on() {
                                trace_note(&comment, "spawned");
                            }
                            let task = tokio::spawn(operation(
                                client.clone(),
                                db.clone(),
                                i,
                                comment.clone(),
                            ));
                            let abort = task.abort_handle();
                            let ending =
                                match tokio::time::timeout(watchdog(i % OP_KINDS), task).await {
                                    Ok(Ok(Ok(()))) => Ending::Ok,
                                    Ok(Ok(Err(message))) => Ending::Err(message),
                                    Ok(Err(join)) if join.is_panic() => {
                                        Ending::Panic(panic_text(join.into_panic()))
                                    }
                                    Ok(Err(join)) => Ending::Err(format!("task failed: {join}")),
                                    Err(_) => {
                                        abort.abort();
                                        if trace_on() {
                                            trace_note(&comment, "watchdog fired");
                                        }
                                        Ending::Hang
                                    }
                                };
                            endings.push((comment, i % OP_KINDS, ending));
                        }
                        endings
                    });
                }
                let mut all = Vec::new();
                while let Some(done) = loops.join_next().await {
                    all.extend(
                        done.expect(
                            "worker loop does not panic (operations run in their own tasks)",
                        ),
                    );
                }
                // Dropping the client rather than `shutdown()`: a shutdown waits for every
                // operation's resources, and a hung upstream operation's may never come back.
                drop(client);
                all
            }
        }
    };
}

fuzz_driver!(fork, mongodb, |opts| opts.timeout = Some(FORK_TIMEOUT));
fuzz_driver!(upstream, mongodb_upstream, |_| {});

/// `REPLY_FUZZ_TRACE=1`: record every command's events by the operation's comment, and print
/// them for the operations that hang, to find where they wait.
fn trace_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REPLY_FUZZ_TRACE").is_ok_and(|v| v == "1"))
}

/// Command events by operation comment, each with the time since the process first traced.
#[derive(Default)]
struct Traces {
    comment_of: HashMap<i32, String>,
    events: HashMap<String, Vec<String>>,
}

fn traces() -> &'static Mutex<Traces> {
    static TRACES: OnceLock<Mutex<Traces>> = OnceLock::new();
    TRACES.get_or_init(Default::default)
}

fn trace_clock() -> Duration {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed()
}

fn trace_started(
    request_id: i32,
    comment: Option<&str>,
    command: &str,
    connection: &impl std::fmt::Debug,
) {
    let Some(comment) = comment else { return };
    let mut t = traces().lock().unwrap_or_else(|p| p.into_inner());
    t.comment_of.insert(request_id, comment.to_string());
    let line = format!(
        "{:?} started {command} #{request_id} on {connection:?}",
        trace_clock()
    );
    t.events.entry(comment.to_string()).or_default().push(line);
}

fn trace_ended(request_id: i32, outcome: String) {
    let mut t = traces().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(comment) = t.comment_of.remove(&request_id) {
        let line = format!("{:?} #{request_id} {outcome}", trace_clock());
        t.events.entry(comment).or_default().push(line);
    }
}

/// Records `note` for operation `comment`.
fn trace_note(comment: &str, note: &str) {
    let mut t = traces().lock().unwrap_or_else(|p| p.into_inner());
    let line = format!("{:?} {note}", trace_clock());
    t.events.entry(comment.to_string()).or_default().push(line);
}

/// Prints the command events of the hung operation `comment`, and the damaged replies the
/// emulator logged for it (in the order it sent them).
fn print_trace(comment: &str, log: &[MangleRecord]) {
    let t = traces().lock().unwrap_or_else(|p| p.into_inner());
    eprintln!(
        "reply fuzz: trace of hung {comment} (now {:?}):",
        trace_clock()
    );
    for line in t.events.get(comment).into_iter().flatten() {
        eprintln!("    {line}");
    }
    for record in log.iter().filter(|r| r.comment == comment) {
        eprintln!("    reply to {}: {:?}", record.command, record.kind);
    }
}

/// One driver's figures.
#[derive(Debug, Default)]
struct Figures {
    driver: &'static str,
    operations: u64,
    ok: u64,
    errors: u64,
    op_panics: u64,
    process_panics: u64,
    hangs: u64,
    stalled_get_mores: u64,
    wrong_successes: Vec<(String, &'static str, MangleRecord)>,
    ok_after_undetermined: u64,
    ok_unlogged: u64,
    replies: u64,
    mangled: u64,
    mangled_by_kind: BTreeMap<&'static str, u64>,
    hangs_by_op: BTreeMap<String, u64>,
    panic_messages: Vec<String>,
    seconds: f64,
}

impl Figures {
    fn print(&self) {
        eprintln!(
            "reply fuzz [{}]: {} operations in {:.1} s ({} ok, {} errors), {} replies, {} mangled; \
             panics {} (in operations) / {} (process), hangs {} (+{} in a stalled getMore), \
             wrong successes {}, \
             ok after an undetermined mangle {}, ok without a logged reply {}",
            self.driver,
            self.operations,
            self.seconds,
            self.ok,
            self.errors,
            self.replies,
            self.mangled,
            self.op_panics,
            self.process_panics,
            self.hangs,
            self.stalled_get_mores,
            self.wrong_successes.len(),
            self.ok_after_undetermined,
            self.ok_unlogged,
        );
        eprintln!(
            "reply fuzz [{}]: mangled by kind {:?}",
            self.driver, self.mangled_by_kind
        );
        if !self.hangs_by_op.is_empty() {
            eprintln!(
                "reply fuzz [{}]: hangs by operation {:?}",
                self.driver, self.hangs_by_op
            );
        }
        if !self.wrong_successes.is_empty() {
            let mut by_kind: BTreeMap<&str, u64> = BTreeMap::new();
            for (_, _, record) in &self.wrong_successes {
                *by_kind
                    .entry(record.kind.map_or("clean", MangleKind::name))
                    .or_default() += 1;
            }
            eprintln!(
                "reply fuzz [{}]: wrong successes by the last reply's kind {by_kind:?}",
                self.driver
            );
        }
        for (comment, op, record) in self.wrong_successes.iter().take(10) {
            eprintln!(
                "reply fuzz [{}]: wrong success {comment} ({op}): last reply {} {:?}",
                self.driver, record.command, record.kind
            );
        }
        for message in self.panic_messages.iter().take(5) {
            eprintln!("reply fuzz [{}]: panic: {message}", self.driver);
        }
    }
}

/// Drives one driver against a fresh emulator with mangling on, and tallies.
async fn measure(
    driver: &'static str,
    seed: u64,
    share: f64,
    ops: u64,
    workers: u64,
    left_out: &[MangleKind],
) -> Figures {
    install_panic_counter();
    // Several routers: a frame damage makes the driver mark one router unknown (and wait for
    // its monitor to find it again); the others keep serving meanwhile.
    let emu = Emulator::start(EmulatorConfig {
        topology: Topology::Sharded { routers: 4 },
        ..Default::default()
    })
    .await
    .expect("emulator starts");
    let uri = emu.uri();
    let db = format!("fuzz_{driver}");
    let app = format!("reply-fuzz-{driver}");
    match driver {
        "fork" => fork::prepare(&uri, &db).await,
        _ => upstream::prepare(&uri, &db).await,
    }
    emu.set_reply_mangling(Some(MangleConfig {
        seed,
        share,
        kinds: MangleKind::ALL
            .into_iter()
            .filter(|k| !left_out.contains(k))
            .collect(),
        app_name: Some(app.clone()),
        log: true,
        ..Default::default()
    }));
    let before = emu.reply_mangling_report();
    let panics_before = PANICS.load(Ordering::SeqCst);
    let started = Instant::now();
    let endings = match driver {
        "fork" => fork::run(&uri, &db, &app, ops, workers).await,
        _ => upstream::run(&uri, &db, &app, ops, workers).await,
    };
    let seconds = started.elapsed().as_secs_f64();
    emu.set_reply_mangling(None);
    let after = emu.reply_mangling_report();
    let log = emu.take_reply_mangling_log();
    let process_panics = PANICS.load(Ordering::SeqCst) - panics_before;

    let mut last: HashMap<&str, &MangleRecord> = HashMap::new();
    for record in &log {
        // The log is in the order replies were sent; an operation's requests are sequential.
        last.insert(record.comment.as_str(), record);
    }
    let mut f = Figures {
        driver,
        operations: endings.len() as u64,
        process_panics,
        replies: after.qualifying - before.qualifying,
        mangled: after.mangled() - before.mangled(),
        seconds,
        ..Default::default()
    };
    for (kind, n) in &after.mangled_by_kind {
        let was = before.mangled_by_kind.get(kind).copied().unwrap_or(0);
        if n > &was {
            f.mangled_by_kind.insert(kind, n - was);
        }
    }
    for (comment, kind, ending) in &endings {
        let op = OP_NAMES[*kind as usize];
        match ending {
            Ending::Ok => {
                f.ok += 1;
                match last.get(comment.as_str()) {
                    // countDocuments reads its one batch and never the cursor id, so a result
                    // read past an unreadable id is a result it could read.
                    Some(record)
                        if op == "countDocuments"
                            && record.kind == Some(MangleKind::CursorIdMalformed) =>
                    {
                        f.ok_after_undetermined += 1
                    }
                    Some(record) if record.verdict == Verdict::MustFail => f
                        .wrong_successes
                        .push((comment.clone(), op, (*record).clone())),
                    Some(record) if record.verdict == Verdict::Undetermined => {
                        f.ok_after_undetermined += 1
                    }
                    Some(_) => {}
                    None => f.ok_unlogged += 1,
                }
            }
            Ending::Err(_) => f.errors += 1,
            Ending::Panic(message) => {
                f.op_panics += 1;
                f.panic_messages.push(format!("{op}: {message}"));
            }
            // A getMore whose reply never completes: counted apart, as upstream bounds no
            // getMore at all. The fork's are bounded by their cursor's timeoutMS (stage 2) and
            // asserted to be none; the long run of 2026-12-03 saw 1 in 25,000, those of
            // 2026-12-04 none in 75,000 (docs/results/2026-12-04-reply-fuzz.md).
            Ending::Hang
                if last.get(comment.as_str()).is_some_and(|r| {
                    r.command == "getMore" && r.kind == Some(MangleKind::Stall)
                }) =>
            {
                f.stalled_get_mores += 1;
                if trace_on() {
                    print_trace(comment, &log);
                }
            }
            Ending::Hang => {
                f.hangs += 1;
                if trace_on() {
                    print_trace(comment, &log);
                }
                let cause = last
                    .get(comment.as_str())
                    .map_or("no reply".to_string(), |r| {
                        format!("{} {}", r.command, r.kind.map_or("clean", MangleKind::name))
                    });
                *f.hangs_by_op
                    .entry(format!("{op} after {cause}"))
                    .or_default() += 1;
            }
        }
    }
    f.panic_messages.extend(
        PANIC_MESSAGES
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..),
    );
    emu.shutdown().await;
    f
}

fn assert_fork_survived(f: &Figures) {
    assert_eq!(f.op_panics, 0, "fork panicked: {:?}", f.panic_messages);
    assert_eq!(f.process_panics, 0, "fork panicked: {:?}", f.panic_messages);
    assert_eq!(f.hangs, 0, "fork hung past timeoutMS: {:?}", f.hangs_by_op);
    assert_eq!(
        f.stalled_get_mores, 0,
        "a fork getMore outlived its cursor's timeoutMS"
    );
    assert!(
        f.wrong_successes.is_empty(),
        "fork reported success for replies it could not read: {:?}",
        f.wrong_successes.iter().take(10).collect::<Vec<_>>()
    );
    assert_eq!(
        f.ok_unlogged, 0,
        "every successful operation's replies are logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_mixed_operations_against_mangled_replies() {
    let (seed, share, ops, workers) = (16, 0.45, 480, 6);
    let fork = measure("fork", seed, share, ops, workers, &[]).await;
    fork.print();
    // Upstream has no operation timeout, so each stall would hold an operation until the
    // watchdog: left out here to keep the test short; the long run includes it.
    let upstream = measure("upstream", seed, share, ops, workers, &[MangleKind::Stall]).await;
    upstream.print();
    // The harness did its job: every kind was drawn (in one run or the other: the kinds that
    // fit only write or cursor replies are drawn a few times per run), and both outcomes
    // occurred.
    for kind in MangleKind::ALL {
        assert!(
            fork.mangled_by_kind.contains_key(kind.name())
                || upstream.mangled_by_kind.contains_key(kind.name()),
            "kind {} never drawn: {:?} {:?}",
            kind.name(),
            fork.mangled_by_kind,
            upstream.mangled_by_kind
        );
    }
    assert!(fork.mangled_by_kind.contains_key(MangleKind::Stall.name()));
    assert!(
        fork.mangled >= 100,
        "too few mangled replies: {}",
        fork.mangled
    );
    assert!(fork.ok > 0 && fork.errors > 0, "{fork:?}");
    assert_eq!(fork.operations, ops);
    assert_eq!(upstream.operations, ops);
    assert_fork_survived(&fork);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "lab run: at least 100,000 mangled replies per driver (minutes); run with --ignored"]
async fn long_run_against_mangled_replies() {
    let target: u64 = std::env::var("REPLY_FUZZ_MANGLED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let workers: u64 = std::env::var("REPLY_FUZZ_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    // `REPLY_FUZZ_DRIVERS=upstream` (or `fork`) runs one driver, e.g. to run both at once in
    // two processes: upstream's time goes mostly into waiting for its hung operations.
    let drivers: Vec<&'static str> = match std::env::var("REPLY_FUZZ_DRIVERS").as_deref() {
        Ok("fork") => vec!["fork"],
        Ok("upstream") => vec!["upstream"],
        _ => vec!["fork", "upstream"],
    };
    let share = 0.8;
    let mut totals: Vec<Figures> = Vec::new();
    for driver in drivers {
        // Rounds of 5,000 operations (each with its own seed) until the target is met; the
        // number of rounds is bounded by the target.
        let mut rounds = Vec::new();
        let mut mangled = 0;
        let mut round = 0u64;
        while mangled < target && round < target {
            let f = measure(driver, 1000 + round, share, 5_000, workers, &[]).await;
            f.print();
            mangled += f.mangled;
            round += 1;
            rounds.push(f);
        }
        let mut total = Figures {
            driver,
            ..Default::default()
        };
        for f in rounds {
            total.operations += f.operations;
            total.ok += f.ok;
            total.errors += f.errors;
            total.op_panics += f.op_panics;
            total.process_panics += f.process_panics;
            total.hangs += f.hangs;
            total.stalled_get_mores += f.stalled_get_mores;
            total.wrong_successes.extend(f.wrong_successes);
            total.ok_after_undetermined += f.ok_after_undetermined;
            total.ok_unlogged += f.ok_unlogged;
            total.replies += f.replies;
            total.mangled += f.mangled;
            total.seconds += f.seconds;
            for (k, n) in f.mangled_by_kind {
                *total.mangled_by_kind.entry(k).or_default() += n;
            }
            for (k, n) in f.hangs_by_op {
                *total.hangs_by_op.entry(k).or_default() += n;
            }
            total.panic_messages.extend(f.panic_messages);
        }
        eprintln!("==== total ====");
        total.print();
        totals.push(total);
    }
    for t in &totals {
        t.print();
    }
    if let Some(fork) = totals.iter().find(|t| t.driver == "fork") {
        assert_fork_survived(fork);
    }
}
