//! Failover with both drivers (the fork `mongodb` and the unmodified `mongodb_upstream`) against
//! a three-member emulated replica set:
//!
//! * a retryable write applied on the primary whose reply is lost as the primary steps down is
//!   retried on the new primary and applied once;
//! * an exactly-once audit at small scale: concurrent inserts with unique `_id`s and `$inc`
//!   updates that also `$push` their own id, under overload from the server model (the ingress
//!   limiter and random rejections, 462 with `SystemOverloadedError` and `RetryableError`),
//!   connections closed at random before writes (`failCommand`) and after them
//!   (`onPrimaryTransactionalWrite`), and scheduled step-downs. Afterwards every write is
//!   looked up: acknowledged ones must be applied exactly once, unacknowledged ones at most once.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use emulator::model::ModelConfig;
use emulator::{Emulator, EmulatorConfig, StepDown};
use rand::{Rng, SeedableRng};

/// Starts a three-member replica set with `overload` as every member's model.
async fn start(overload: ModelConfig) -> Emulator {
    Emulator::start(EmulatorConfig {
        topology: common::rs(3),
        overload,
        ..Default::default()
    })
    .await
    .expect("emulator starts")
}

/// Runs an admin command on one member over a fresh raw connection; asserts it succeeded.
async fn admin(addr: SocketAddr, mut body: Document) -> Document {
    body.insert("$db", "admin");
    let mut raw = common::RawClient::connect(addr).await;
    let reply = raw.command(&body).await.expect("a reply");
    assert_eq!(reply.get_f64("ok"), Ok(1.0), "{body} -> {reply}");
    reply
}

/// What one generated write was.
#[derive(Debug, Clone, Copy)]
enum Write {
    /// `insertOne({_id: id})` into `inserts`.
    Insert,
    /// `updateOne({_id: counter}, {$inc: {n: amount}, $push: {ops: id}})` on `counters`.
    Inc { counter: i64, amount: i64 },
}

/// The generator's log entry of one write.
#[derive(Debug, Clone)]
struct Logged {
    id: i64,
    write: Write,
    /// The driver returned success.
    acknowledged: bool,
    /// For an unacknowledged write, what the driver returned (server code or error kind).
    error: Option<String>,
}

/// The audit's figures for one driver.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Audit {
    writes: usize,
    acknowledged: usize,
    /// Acknowledged and applied exactly once.
    exactly_once: usize,
    /// Acknowledged but not applied.
    missing: usize,
    /// Writes (acknowledged or not) applied more than once.
    duplicates: usize,
    /// Unacknowledged writes applied 0, 1 and more than once.
    unacknowledged: [usize; 3],
    /// Applications of ids the generator never wrote, and counters whose total disagrees with
    /// the increments found in them (both must be 0: the audit itself would be unsound).
    inconsistencies: usize,
}

impl std::fmt::Display for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "writes {}, acknowledged {}, exactly once {}, missing {}, duplicates {}, \
             unacknowledged applied 0/1/more {}/{}/{}, inconsistencies {}",
            self.writes,
            self.acknowledged,
            self.exactly_once,
            self.missing,
            self.duplicates,
            self.unacknowledged[0],
            self.unacknowledged[1],
            self.unacknowledged[2],
            self.inconsistencies
        )
    }
}

/// Compares the generator's log with the collections' contents: `inserted` holds the `_id` of
/// every document of `inserts`, `counters` every counter document (`{_id, n, ops}`).
fn audit(log: &[Logged], inserted: &[i64], counters: &[Document]) -> Audit {
    let mut applied: HashMap<i64, usize> = HashMap::new();
    for id in inserted {
        *applied.entry(*id).or_default() += 1;
    }
    let amounts: HashMap<i64, i64> = log
        .iter()
        .filter_map(|l| match l.write {
            Write::Inc { amount, .. } => Some((l.id, amount)),
            Write::Insert => None,
        })
        .collect();
    let mut result = Audit::default();
    for c in counters {
        let ops: Vec<i64> = c
            .get_array("ops")
            .map(|a| a.iter().filter_map(Bson::as_i64).collect())
            .unwrap_or_default();
        let n = c.get_i64("n").unwrap_or(-1);
        let mut total = 0;
        for op in ops {
            *applied.entry(op).or_default() += 1;
            match amounts.get(&op) {
                Some(a) => total += a,
                None => result.inconsistencies += 1,
            }
        }
        // `n` must be exactly the increments of the updates recorded in the document: the
        // $inc and the $push of one update are applied together or not at all.
        if n != total {
            result.inconsistencies += 1;
        }
    }
    let known: std::collections::HashSet<i64> = log.iter().map(|l| l.id).collect();
    result.inconsistencies += applied.keys().filter(|id| !known.contains(id)).count();
    for l in log {
        let times = applied.get(&l.id).copied().unwrap_or(0);
        result.writes += 1;
        if times > 1 {
            result.duplicates += 1;
        }
        if l.acknowledged {
            result.acknowledged += 1;
            match times {
                0 => result.missing += 1,
                1 => result.exactly_once += 1,
                _ => {}
            }
        } else {
            result.unacknowledged[times.min(2)] += 1;
        }
    }
    result
}

/// Counter documents the `$inc` updates spread over.
const COUNTERS: i64 = 8;

macro_rules! driver {
    ($name:ident, $m:ident, $uri_options:expr) => {
        mod $name {
            use super::*;
            use $m::event::command::CommandEvent;
            use $m::options::ClientOptions;
            use $m::{Client, Collection};

            /// The driver's connection-string options on top of the emulator's.
            pub const URI_OPTIONS: &str = $uri_options;

            pub async fn client(emu: &Emulator) -> (Client, Arc<std::sync::Mutex<Vec<CommandEvent>>>) {
                let uri = format!("{}&{URI_OPTIONS}", emu.uri());
                let mut opts = ClientOptions::parse(uri.trim_end_matches('&'))
                    .await
                    .expect("uri parses");
                // Long enough to ride out the windows without a primary.
                opts.server_selection_timeout = Some(Duration::from_secs(10));
                opts.connect_timeout = Some(Duration::from_secs(5));
                let events: Arc<std::sync::Mutex<Vec<CommandEvent>>> = Arc::default();
                let sink = events.clone();
                opts.command_event_handler =
                    Some($m::event::EventHandler::callback(move |ev: CommandEvent| {
                        if let Ok(mut e) = sink.lock() {
                            // Bounded: the focused test needs only a few events; the audit's
                            // thousands are not needed.
                            if e.len() < 10_000 {
                                e.push(ev);
                            }
                        }
                    }));
                (Client::with_options(opts).expect("client builds"), events)
            }

            /// A short name for what an operation returned instead of success.
            fn classify(e: &$m::error::Error) -> String {
                match *e.kind {
                    $m::error::ErrorKind::Command(ref c) => format!("code {}", c.code),
                    $m::error::ErrorKind::Write($m::error::WriteFailure::WriteError(ref w)) => {
                        format!("write error {}", w.code)
                    }
                    ref other => {
                        let debug = format!("{other:?}");
                        debug.split(['(', ' ', '{']).next().unwrap_or("?").to_string()
                    }
                }
            }

            /// The addresses the started events of `name` went to, in order.
            fn targets(events: &std::sync::Mutex<Vec<CommandEvent>>, name: &str) -> Vec<String> {
                events
                    .lock()
                    .unwrap()
                    .iter()
                    .filter_map(|e| match e {
                        CommandEvent::Started(s) if s.command_name == name => {
                            Some(s.connection.address.to_string())
                        }
                        _ => None,
                    })
                    .collect()
            }

            /// An insert and an `$inc` whose replies are lost as the primary steps down right
            /// after applying them: each is retried on the new primary and applied once.
            pub async fn retried_across_step_down() {
                let emu = start(ModelConfig::default()).await;
                let (client, events) = client(&emu).await;
                let coll: Collection<Document> = client.database("db").collection("c");
                coll.insert_one(doc! { "_id": 0, "n": 0 }).await.expect("seed document");
                let addrs = emu.addresses();

                for (step, write) in ["insert", "update"].into_iter().enumerate() {
                    let primary = emu.primary().expect("a primary");
                    admin(
                        addrs[primary],
                        doc! {
                            "configureFailPoint": "onPrimaryTransactionalWrite",
                            "mode": { "times": 1 },
                            "data": { "closeConnection": true, "labStepDown": true },
                        },
                    )
                    .await;
                    let before = targets(&events, write).len();
                    match write {
                        "insert" => {
                            coll.insert_one(doc! { "_id": 1 })
                                .await
                                .expect("the retried insert succeeds");
                        }
                        _ => {
                            let r = coll
                                .update_one(doc! { "_id": 0 }, doc! { "$inc": { "n": 1 } })
                                .await
                                .expect("the retried update succeeds");
                            assert_eq!(r.modified_count, 1, "{r:?}");
                        }
                    }
                    let sent = targets(&events, write);
                    let sent = &sent[before..];
                    assert_eq!(sent.len(), 2, "{write}: one attempt and one retry: {sent:?}");
                    assert_eq!(sent[0], addrs[primary].to_string(), "{write}: first attempt");
                    assert_ne!(sent[1], sent[0], "{write}: the retry goes to the new primary");
                    assert_eq!(emu.elections(), step as u64 + 1);
                }
                let docs: Vec<Document> = {
                    let mut cursor = coll.find(doc! {}).sort(doc! { "_id": 1 }).await.unwrap();
                    let mut out = Vec::new();
                    while cursor.advance().await.unwrap() {
                        out.push(cursor.deserialize_current().unwrap());
                    }
                    out
                };
                assert_eq!(docs, vec![doc! { "_id": 0, "n": 1 }, doc! { "_id": 1 }]);
                drop(client);
                emu.shutdown().await;
            }

            /// Runs `workers` tasks of `per_worker` writes each (more if fewer than
            /// `min_step_downs` step-downs happened meanwhile, within `max_duration`), with a
            /// step-down every `step_down_every`. Returns the log and how many step-downs
            /// happened.
            pub async fn generate(
                emu: &Emulator,
                seed: u64,
                workers: u64,
                per_worker: u64,
                min_step_downs: usize,
                step_down_every: Duration,
                max_duration: Duration,
            ) -> (Vec<Logged>, usize) {
                let (client, _events) = client(emu).await;
                let db = client.database("audit");
                let counters: Collection<Document> = db.collection("counters");
                // Seeded before the faults start (the fail points are configured later).
                let seeds: Vec<Document> = (0..COUNTERS)
                    .map(|k| doc! { "_id": k, "n": 0i64, "ops": [] })
                    .collect();
                counters.insert_many(seeds).await.expect("counters seeded");
                for addr in emu.addresses() {
                    admin(
                        addr,
                        doc! {
                            "configureFailPoint": "failCommand",
                            "mode": { "activationProbability": 0.02 },
                            "data": { "failCommands": ["insert", "update"], "closeConnection": true },
                        },
                    )
                    .await;
                    admin(
                        addr,
                        doc! {
                            "configureFailPoint": "onPrimaryTransactionalWrite",
                            "mode": { "activationProbability": 0.03 },
                            "data": { "closeConnection": true },
                        },
                    )
                    .await;
                }
                let started = Instant::now();
                let done = Arc::new(AtomicBool::new(false));
                let step_downs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
                let mut tasks = Vec::new();
                for w in 0..workers {
                    let db = db.clone();
                    let done = done.clone();
                    let step_downs = step_downs.clone();
                    tasks.push(tokio::spawn(async move {
                        let inserts: Collection<Document> = db.collection("inserts");
                        let counters: Collection<Document> = db.collection("counters");
                        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (w << 32));
                        let mut log = Vec::new();
                        // Bounded by max_duration (checked every write) and a hard cap.
                        for i in 0..per_worker * 20 {
                            let enough = i >= per_worker
                                && step_downs.load(Ordering::Relaxed) >= min_step_downs;
                            if enough || started.elapsed() >= max_duration || done.load(Ordering::Relaxed) {
                                break;
                            }
                            let id = (w as i64) * 1_000_000 + i as i64;
                            let write = if rng.random_bool(0.5) {
                                Write::Insert
                            } else {
                                Write::Inc {
                                    counter: rng.random_range(0..COUNTERS),
                                    amount: rng.random_range(1..=5),
                                }
                            };
                            let outcome = match write {
                                Write::Insert => inserts
                                    .insert_one(doc! { "_id": id })
                                    .await
                                    .map(|_| ())
                                    .map_err(|e| classify(&e)),
                                Write::Inc { counter, amount } => counters
                                    .update_one(
                                        doc! { "_id": counter },
                                        doc! { "$inc": { "n": amount }, "$push": { "ops": id } },
                                    )
                                    .await
                                    .map_err(|e| classify(&e))
                                    .and_then(|r| {
                                        if r.matched_count == 1 {
                                            Ok(())
                                        } else {
                                            Err(format!("matched {}", r.matched_count))
                                        }
                                    }),
                            };
                            log.push(Logged {
                                id,
                                write,
                                acknowledged: outcome.is_ok(),
                                error: outcome.err(),
                            });
                        }
                        log
                    }));
                }
                // The failover fault: a step-down every period; the old primary may stand again
                // after a second, and the set is without a primary for 300 ms each time.
                let schedule = emu.schedule_step_downs(
                    step_down_every,
                    StepDown {
                        step_down_for: Duration::from_secs(1),
                        force: false,
                        election_delay: Duration::from_millis(300),
                    },
                );
                let counter = step_downs.clone();
                let watch = async {
                    // Publishes the schedule's count to the workers; ends with them.
                    while !done.load(Ordering::Relaxed) {
                        counter.store(schedule.step_downs(), Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                };
                let work = async {
                    let mut log = Vec::new();
                    for t in tasks {
                        log.extend(t.await.expect("worker task"));
                    }
                    done.store(true, Ordering::Relaxed);
                    log
                };
                let (log, ()) = tokio::join!(work, watch);
                let step_down_count = schedule.stop();
                // The faults stop before the audit reads.
                for addr in emu.addresses() {
                    admin(addr, doc! { "configureFailPoint": "failCommand", "mode": "off" }).await;
                    admin(
                        addr,
                        doc! { "configureFailPoint": "onPrimaryTransactionalWrite", "mode": "off" },
                    )
                    .await;
                }
                (log, step_down_count)
            }

            /// Reads the audited collections (retrying: the overload model stays on).
            pub async fn read_back(emu: &Emulator) -> (Vec<i64>, Vec<Document>) {
                let (client, _events) = client(emu).await;
                let db = client.database("audit");
                let mut last_error = None;
                for _ in 0..50 {
                    match read_once(&db).await {
                        Ok(r) => return r,
                        Err(e) => last_error = Some(e),
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                panic!("audit read failed 50 times: {last_error:?}");
            }

            async fn read_once(
                db: &$m::Database,
            ) -> Result<(Vec<i64>, Vec<Document>), $m::error::Error> {
                let mut inserted = Vec::new();
                let mut cursor = db.collection::<Document>("inserts").find(doc! {}).await?;
                while cursor.advance().await? {
                    let d = cursor.deserialize_current()?;
                    inserted.push(d.get_i64("_id").unwrap_or(-1));
                }
                let mut counters = Vec::new();
                let mut cursor = db.collection::<Document>("counters").find(doc! {}).await?;
                while cursor.advance().await? {
                    counters.push(cursor.deserialize_current()?);
                }
                Ok((inserted, counters))
            }
        }
    };
}

driver!(fork, mongodb, "retryBudget=true");
driver!(fork_default, mongodb, "");
driver!(upstream, mongodb_upstream, "");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_retried_across_a_step_down_is_applied_once() {
    tokio::time::timeout(Duration::from_secs(60), async {
        fork::retried_across_step_down().await;
        fork_default::retried_across_step_down().await;
        upstream::retried_across_step_down().await;
    })
    .await
    .expect("finishes within 60 s");
}

/// The overload during the audit: the ingress limiter below the offered rate plus random
/// rejections, on every member (so the new primary is overloaded too).
fn audit_overload(seed: u64) -> ModelConfig {
    let mut m = ModelConfig {
        enabled: true,
        seed,
        random_reject_share: 0.05,
        ..Default::default()
    };
    m.limiter.enabled = true;
    m.limiter.rate_per_sec = 150.0;
    m.limiter.burst_capacity_secs = 0.2;
    m.limiter.max_queue_depth = 0;
    m.limiter.allow_retries = true;
    m
}

/// The size and pace of one audit run (the same for both drivers).
struct AuditPlan {
    workers: u64,
    /// Writes per worker (more while fewer than `min_step_downs` happened).
    per_worker: u64,
    min_step_downs: usize,
    step_down_every: Duration,
    /// The generator stops after this long, whatever it wrote.
    max_duration: Duration,
    /// The whole run of one driver, generation and read-back, must finish within this.
    limit: Duration,
}

/// The drivers an audit runs: the fork with its recommended retry budget (`retryBudget=true`),
/// the fork with its defaults, and upstream with its defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Fork,
    ForkDefault,
    Upstream,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Fork => "fork (retryBudget=true)",
            Variant::ForkDefault => "fork (defaults)",
            Variant::Upstream => "upstream (defaults)",
        }
    }
}

/// Runs the audit with each of `variants`, each against a fresh emulator with the same seed;
/// prints and returns each one's figures after checking what every driver must satisfy (0
/// duplicates, 0 acknowledged writes missing) and, for the fork, that no unacknowledged write
/// was applied twice and enough writes were acknowledged for the audit to mean something.
async fn run_audit(plan: &AuditPlan, variants: &[Variant]) -> Vec<(Variant, Audit)> {
    let mut figures = Vec::new();
    let seed = 11u64;
    for &variant in variants {
        let driver = variant.name();
        let emu = start(audit_overload(seed)).await;
        let (log, step_downs, inserted, counters) = tokio::time::timeout(plan.limit, async {
            let (w, p, m, e, d) = (
                plan.workers,
                plan.per_worker,
                plan.min_step_downs,
                plan.step_down_every,
                plan.max_duration,
            );
            let (log, step_downs) = match variant {
                Variant::Fork => fork::generate(&emu, seed, w, p, m, e, d).await,
                Variant::ForkDefault => fork_default::generate(&emu, seed, w, p, m, e, d).await,
                Variant::Upstream => upstream::generate(&emu, seed, w, p, m, e, d).await,
            };
            let (inserted, counters) = match variant {
                Variant::Fork => fork::read_back(&emu).await,
                Variant::ForkDefault => fork_default::read_back(&emu).await,
                Variant::Upstream => upstream::read_back(&emu).await,
            };
            (log, step_downs, inserted, counters)
        })
        .await
        .unwrap_or_else(|_| panic!("{driver}: the audit run finishes within {:?}", plan.limit));
        let rejections: u64 = emu
            .overload_models()
            .iter()
            .map(|m| {
                let c = m.snapshot().counters;
                c.rejected + c.random_rejections
            })
            .sum();
        let result = audit(&log, &inserted, &counters);
        let mut errors: std::collections::BTreeMap<&str, usize> = Default::default();
        for e in log.iter().filter_map(|l| l.error.as_deref()) {
            *errors.entry(e).or_default() += 1;
        }
        eprintln!(
            "exactly-once audit, {driver}: {result}; step-downs {step_downs}, elections {}, \
             overload rejections {rejections}; errors returned {errors:?}",
            emu.elections()
        );
        assert!(
            step_downs >= plan.min_step_downs,
            "{driver}: {step_downs} step-downs"
        );
        assert!(
            rejections > 0,
            "{driver}: the overload model rejected nothing"
        );
        assert_eq!(result.inconsistencies, 0, "{driver}: {result}");
        // Retryable writes are deduplicated by the server's records, so no driver may
        // duplicate or lose an acknowledged write. How many each acknowledges differs: the
        // retry budget refuses retries under sustained overload, upstream retries without one.
        assert_eq!(result.duplicates, 0, "{driver}: {result}");
        assert_eq!(result.missing, 0, "{driver}: {result}");
        if variant != Variant::Upstream {
            assert_eq!(result.unacknowledged[2], 0, "{driver}: {result}");
            assert!(result.acknowledged >= 100, "{driver}: {result}");
        }
        figures.push((variant, result));
        emu.shutdown().await;
    }
    figures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_audit_under_overload_drops_and_step_downs() {
    let plan = AuditPlan {
        workers: 12,
        per_worker: 60,
        min_step_downs: 2,
        step_down_every: Duration::from_secs(2),
        max_duration: Duration::from_secs(15),
        limit: Duration::from_secs(45),
    };
    run_audit(&plan, &[Variant::Fork, Variant::Upstream]).await;
}

/// The audit at the scale: `FAILOVER_AUDIT_WRITES` writes per driver (default 20,000),
/// 32 tasks, a step-down every 2 s; the fork with its defaults too (`FAILOVER_AUDIT_VARIANTS`). Minutes long, so not part of `cargo xtask test`:
/// `FAILOVER_AUDIT_WRITES=20000 cargo test -p lab --test failover -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long: the full-scale audit, run by hand"]
async fn exactly_once_audit_at_scale() {
    let writes: u64 = std::env::var("FAILOVER_AUDIT_WRITES")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(20_000);
    let workers = 32;
    let plan = AuditPlan {
        workers,
        per_worker: writes.div_ceil(workers),
        min_step_downs: 2,
        step_down_every: Duration::from_secs(2),
        max_duration: Duration::from_secs(3600),
        limit: Duration::from_secs(4000),
    };
    // FAILOVER_AUDIT_VARIANTS=fork,fork-default,upstream (the default) picks the drivers.
    let chosen = std::env::var("FAILOVER_AUDIT_VARIANTS")
        .unwrap_or_else(|_| "fork,fork-default,upstream".to_string());
    let variants: Vec<Variant> = chosen
        .split(',')
        .map(|v| match v.trim() {
            "fork" => Variant::Fork,
            "fork-default" => Variant::ForkDefault,
            "upstream" => Variant::Upstream,
            other => panic!("FAILOVER_AUDIT_VARIANTS: unknown variant {other:?}"),
        })
        .collect();
    run_audit(&plan, &variants).await;
}
