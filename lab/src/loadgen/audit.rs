//! The exactly-once audit (`lab run --audit WRITES`, `docs/lab.md` "Exactly-once audit"; at
//! small scale in `lab/tests/failover.rs`): closed-loop tasks of checkable writes against a
//! three-member emulated replica set under overload with retries, connection drops and
//! scheduled step-downs, then every write is looked up.
//!
//! Every write is checkable: inserts with unique `_id`s into `audit.inserts`, and `$inc` updates
//! on a few counter documents of `audit.counters` that also `$push` their own id, so the audit
//! counts how often each update was applied (and checks each counter's total against the
//! increments recorded in it). A write is *acknowledged* when the driver returned success.
//! Faults, on every member: the overload model (ingress limiter below the offered rate and
//! random 462s, both labelled `SystemOverloadedError` and `RetryableError`), `failCommand`
//! closing the connection before a share of inserts and updates, `onPrimaryTransactionalWrite`
//! closing it after a share of writes (applied, reply lost), and a step-down on a schedule
//! (`Emulator::schedule_step_downs`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use emulator::model::ModelConfig;
use emulator::{Emulator, EmulatorConfig, StepDown, Topology};
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// What one generated write was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// `insertOne({_id: id})` into `inserts`.
    Insert,
    /// `updateOne({_id: counter}, {$inc: {n: amount}, $push: {ops: id}})` on `counters`.
    Inc {
        /// The counter document's `_id`.
        counter: i64,
        /// The increment.
        amount: i64,
    },
}

/// The generator's log entry of one write.
#[derive(Debug, Clone)]
pub struct Logged {
    /// The write's id (the inserted `_id`, or the id the update pushes).
    pub id: i64,
    /// The write.
    pub write: Write,
    /// The driver returned success.
    pub acknowledged: bool,
    /// For an unacknowledged write, what the driver returned (server code or error kind).
    pub error: Option<String>,
}

/// The audit's figures for one driver.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Audit {
    /// Writes generated.
    pub writes: usize,
    /// Of those, acknowledged.
    pub acknowledged: usize,
    /// Acknowledged and applied exactly once.
    pub exactly_once: usize,
    /// Acknowledged but not applied.
    pub missing: usize,
    /// Writes (acknowledged or not) applied more than once.
    pub duplicates: usize,
    /// Unacknowledged writes applied 0, 1 and more than once.
    pub unacknowledged: [usize; 3],
    /// Applications of ids the generator never wrote, and counters whose total disagrees with
    /// the increments found in them (both must be 0: the audit itself would be unsound).
    pub inconsistencies: usize,
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
pub fn audit(log: &[Logged], inserted: &[i64], counters: &[Document]) -> Audit {
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
    let known: HashSet<i64> = log.iter().map(|l| l.id).collect();
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
pub const COUNTERS: i64 = 8;

/// The size, pace and faults of one audit run (the same for every driver).
#[derive(Debug, Clone, Serialize)]
pub struct AuditPlan {
    /// Closed-loop tasks.
    pub workers: u64,
    /// Writes per task (more while fewer than `min_step_downs` happened).
    pub per_worker: u64,
    /// Step-downs the run must see.
    pub min_step_downs: usize,
    /// Period of the step-downs.
    #[serde(serialize_with = "ser_secs")]
    pub step_down_every: Duration,
    /// The generator stops after this long, whatever it wrote.
    #[serde(serialize_with = "ser_secs")]
    pub max_duration: Duration,
    /// The whole run of one driver, generation and read-back, must finish within this.
    #[serde(serialize_with = "ser_secs")]
    pub limit: Duration,
    /// Seed of the writes and of the server model.
    pub seed: u64,
    /// Share of inserts and updates whose connection is closed before they run.
    pub drop_before: f64,
    /// Share of writes whose connection is closed after they were applied.
    pub drop_after: f64,
    /// The ingress limiter's rate (requests/s) on every member.
    pub limiter_rate: f64,
    /// Share of requests rejected at random with 462.
    pub reject_share: f64,
}

fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl AuditPlan {
    /// The plan for `writes` writes per driver: 32 tasks, a step-down every 2 s (at least
    /// two), the faults of `lab/tests/failover.rs` (limiter at 150 requests/s, 5 % random
    /// 462s, 2 % of writes dropped before and 3 % after).
    pub fn for_writes(writes: u64) -> AuditPlan {
        let workers = 32;
        AuditPlan {
            workers,
            per_worker: writes.max(1).div_ceil(workers),
            min_step_downs: 2,
            step_down_every: Duration::from_secs(2),
            max_duration: Duration::from_secs(3600),
            limit: Duration::from_secs(4000),
            seed: 11,
            drop_before: 0.02,
            drop_after: 0.03,
            limiter_rate: 150.0,
            reject_share: 0.05,
        }
    }

    /// The overload during the audit: the ingress limiter below the offered rate plus random
    /// rejections, on every member (so the new primary is overloaded too).
    pub fn overload(&self) -> ModelConfig {
        let mut m = ModelConfig {
            enabled: true,
            seed: self.seed,
            random_reject_share: self.reject_share,
            ..Default::default()
        };
        m.limiter.enabled = true;
        m.limiter.rate_per_sec = self.limiter_rate;
        m.limiter.burst_capacity_secs = 0.2;
        m.limiter.max_queue_depth = 0;
        m.limiter.allow_retries = true;
        m
    }
}

/// The drivers an audit runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuditDriver {
    /// The fork with its recommended retry budget (`retryBudget=true`).
    Fork,
    /// The fork with its defaults.
    ForkDefault,
    /// Upstream 3.9.1 with its defaults.
    Upstream,
}

impl AuditDriver {
    /// Every driver, in report order.
    pub const ALL: [AuditDriver; 3] = [
        AuditDriver::Fork,
        AuditDriver::ForkDefault,
        AuditDriver::Upstream,
    ];

    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            AuditDriver::Fork => "fork (retryBudget=true)",
            AuditDriver::ForkDefault => "fork (defaults)",
            AuditDriver::Upstream => "upstream 3.9.1 (defaults)",
        }
    }

    /// The driver called `name` (`fork`, `fork-default`, `upstream`).
    pub fn parse(name: &str) -> Result<AuditDriver, String> {
        match name.trim() {
            "fork" => Ok(AuditDriver::Fork),
            "fork-default" => Ok(AuditDriver::ForkDefault),
            "upstream" => Ok(AuditDriver::Upstream),
            other => Err(format!(
                "unknown audit driver {other:?}: use fork, fork-default or upstream"
            )),
        }
    }
}

/// One driver's audit run.
#[derive(Debug, Clone, Serialize)]
pub struct AuditRun {
    /// The driver.
    pub driver: AuditDriver,
    /// The figures.
    pub audit: Audit,
    /// Step-downs carried out.
    pub step_downs: usize,
    /// Elections won.
    pub elections: u64,
    /// Requests the overload model rejected (limiter and random).
    pub rejections: u64,
    /// What the driver returned for unacknowledged writes, by kind.
    pub errors: BTreeMap<String, usize>,
    /// Wall-clock seconds of the run.
    pub seconds: f64,
}

impl AuditRun {
    /// What every driver must satisfy: a sound audit (0 inconsistencies), 0 duplicates, 0
    /// acknowledged writes missing, the planned step-downs and some overload; for the fork
    /// also no unacknowledged write applied twice. Each failure in words.
    pub fn failures(&self, plan: &AuditPlan) -> Vec<String> {
        let a = &self.audit;
        let mut f = Vec::new();
        if a.inconsistencies > 0 {
            f.push(format!("{} inconsistencies", a.inconsistencies));
        }
        if a.duplicates > 0 {
            f.push(format!("{} writes applied more than once", a.duplicates));
        }
        if a.missing > 0 {
            f.push(format!("{} acknowledged writes missing", a.missing));
        }
        if self.step_downs < plan.min_step_downs {
            f.push(format!("only {} step-downs", self.step_downs));
        }
        if self.rejections == 0 {
            f.push("the overload model rejected nothing".into());
        }
        if self.driver != AuditDriver::Upstream && a.unacknowledged[2] > 0 {
            f.push(format!(
                "{} unacknowledged writes applied more than once",
                a.unacknowledged[2]
            ));
        }
        f
    }
}

/// Runs one admin command on one member over a fresh connection of the fork.
async fn admin(addr: SocketAddr, cmd: Document) -> Result<Document, String> {
    let client = mongodb::Client::with_uri_str(format!(
        "mongodb://{addr}/?directConnection=true&appName=lab-audit-admin"
    ))
    .await
    .map_err(|e| e.to_string())?;
    let r = client.database("admin").run_command(cmd.clone()).await;
    client.shutdown().immediate(true).await;
    r.map_err(|e| format!("{addr}: {cmd}: {e}"))
}

/// Sets the connection-drop fail points on every member (or switches them off).
async fn set_drops(emu: &Emulator, plan: &AuditPlan, on: bool) -> Result<(), String> {
    for addr in emu.addresses() {
        let (before, after) = if on {
            (
                doc! {
                    "configureFailPoint": "failCommand",
                    "mode": { "activationProbability": plan.drop_before },
                    "data": { "failCommands": ["insert", "update"], "closeConnection": true },
                },
                doc! {
                    "configureFailPoint": "onPrimaryTransactionalWrite",
                    "mode": { "activationProbability": plan.drop_after },
                    "data": { "closeConnection": true },
                },
            )
        } else {
            (
                doc! { "configureFailPoint": "failCommand", "mode": "off" },
                doc! { "configureFailPoint": "onPrimaryTransactionalWrite", "mode": "off" },
            )
        };
        admin(addr, before).await?;
        admin(addr, after).await?;
    }
    Ok(())
}

macro_rules! audit_driver {
    ($name:ident, $m:ident) => {
        /// The audit's generator and read-back for one driver crate.
        pub mod $name {
            use super::*;
            use $m::options::ClientOptions;
            use $m::{Client, Collection};

            /// A client of `emu` with `uri_options`, patient enough to ride out the windows
            /// without a primary.
            pub async fn client(emu: &Emulator, uri_options: &str) -> Result<Client, String> {
                let uri = format!("{}&{uri_options}", emu.uri());
                let mut opts = ClientOptions::parse(uri.trim_end_matches('&'))
                    .await
                    .map_err(|e| e.to_string())?;
                opts.server_selection_timeout = Some(Duration::from_secs(10));
                opts.connect_timeout = Some(Duration::from_secs(5));
                Client::with_options(opts).map_err(|e| e.to_string())
            }

            /// A short name for what an operation returned instead of success.
            pub fn classify(e: &$m::error::Error) -> String {
                match *e.kind {
                    $m::error::ErrorKind::Command(ref c) => format!("code {}", c.code),
                    $m::error::ErrorKind::Write($m::error::WriteFailure::WriteError(ref w)) => {
                        format!("write error {}", w.code)
                    }
                    ref other => {
                        let debug = format!("{other:?}");
                        debug
                            .split(['(', ' ', '{'])
                            .next()
                            .unwrap_or("?")
                            .to_string()
                    }
                }
            }

            /// Runs `plan.workers` tasks of `plan.per_worker` writes each (more while fewer
            /// than `plan.min_step_downs` step-downs happened, within `plan.max_duration`),
            /// with the faults on and a step-down every `plan.step_down_every`. Returns the
            /// log and how many step-downs happened.
            pub async fn generate(
                emu: &Emulator,
                plan: &AuditPlan,
                uri_options: &str,
            ) -> Result<(Vec<Logged>, usize), String> {
                let client = client(emu, uri_options).await?;
                let db = client.database("audit");
                let counters: Collection<Document> = db.collection("counters");
                // Seeded before the faults start.
                let seeds: Vec<Document> = (0..COUNTERS)
                    .map(|k| doc! { "_id": k, "n": 0i64, "ops": [] })
                    .collect();
                counters
                    .insert_many(seeds)
                    .await
                    .map_err(|e| format!("seeding the counters: {e}"))?;
                set_drops(emu, plan, true).await?;
                let started = Instant::now();
                let done = Arc::new(AtomicBool::new(false));
                let step_downs = Arc::new(AtomicUsize::new(0));
                let mut tasks = Vec::new();
                for w in 0..plan.workers {
                    let (db, done, step_downs) = (db.clone(), done.clone(), step_downs.clone());
                    let (seed, per_worker, min_step_downs, max_duration) = (
                        plan.seed,
                        plan.per_worker,
                        plan.min_step_downs,
                        plan.max_duration,
                    );
                    tasks.push(tokio::spawn(async move {
                        let inserts: Collection<Document> = db.collection("inserts");
                        let counters: Collection<Document> = db.collection("counters");
                        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (w << 32));
                        let mut log = Vec::new();
                        // Bounded by max_duration (checked every write) and a hard cap.
                        for i in 0..per_worker * 20 {
                            let enough = i >= per_worker
                                && step_downs.load(Ordering::Relaxed) >= min_step_downs;
                            if enough
                                || started.elapsed() >= max_duration
                                || done.load(Ordering::Relaxed)
                            {
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
                // The failover fault: a step-down every period; the old primary may stand
                // again after a second, and the set is without a primary for 300 ms each time.
                let schedule = emu.schedule_step_downs(
                    plan.step_down_every,
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
                    let mut failed = None;
                    for t in tasks {
                        match t.await {
                            Ok(l) => log.extend(l),
                            Err(e) => failed = Some(format!("a writer task failed: {e}")),
                        }
                    }
                    done.store(true, Ordering::Relaxed);
                    (log, failed)
                };
                let ((log, failed), ()) = tokio::join!(work, watch);
                let step_down_count = schedule.stop();
                // The faults stop before the audit reads.
                set_drops(emu, plan, false).await?;
                client.shutdown().immediate(true).await;
                match failed {
                    Some(e) => Err(e),
                    None => Ok((log, step_down_count)),
                }
            }

            /// Reads the audited collections (retrying: the overload model stays on).
            pub async fn read_back(emu: &Emulator) -> Result<(Vec<i64>, Vec<Document>), String> {
                let client = client(emu, "").await?;
                let db = client.database("audit");
                let mut last_error = String::new();
                // Bounded: 50 tries, 100 ms apart.
                for _ in 0..50 {
                    match read_once(&db).await {
                        Ok(r) => {
                            client.shutdown().immediate(true).await;
                            return Ok(r);
                        }
                        Err(e) => last_error = e.to_string(),
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                client.shutdown().immediate(true).await;
                Err(format!("the audit's read failed 50 times: {last_error}"))
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

audit_driver!(fork_audit, mongodb);
audit_driver!(upstream_audit, mongodb_upstream);

/// Runs the audit with `driver` against a fresh three-member replica set (the same seed for
/// every driver); `progress` is told what happens.
pub async fn run_one(plan: &AuditPlan, driver: AuditDriver) -> Result<AuditRun, String> {
    let emu = Emulator::start(EmulatorConfig {
        topology: Topology::ReplicaSet {
            name: "audit".into(),
            members: 3,
        },
        overload: plan.overload(),
        ..Default::default()
    })
    .await
    .map_err(|e| format!("cannot start the emulator: {e}"))?;
    let started = Instant::now();
    let result = tokio::time::timeout(plan.limit, async {
        let (log, step_downs) = match driver {
            AuditDriver::Fork => fork_audit::generate(&emu, plan, "retryBudget=true").await?,
            AuditDriver::ForkDefault => fork_audit::generate(&emu, plan, "").await?,
            AuditDriver::Upstream => upstream_audit::generate(&emu, plan, "").await?,
        };
        let (inserted, counters) = match driver {
            AuditDriver::Upstream => upstream_audit::read_back(&emu).await?,
            _ => fork_audit::read_back(&emu).await?,
        };
        Ok::<_, String>((log, step_downs, inserted, counters))
    })
    .await;
    let rejections: u64 = emu
        .overload_models()
        .iter()
        .map(|m| {
            let c = m.snapshot().counters;
            c.rejected + c.random_rejections
        })
        .sum();
    let elections = emu.elections();
    emu.shutdown().await;
    let (log, step_downs, inserted, counters) = match result {
        Ok(r) => r?,
        Err(_) => {
            return Err(format!(
                "{}: the audit run did not finish within {:?}",
                driver.name(),
                plan.limit
            ))
        }
    };
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for e in log.iter().filter_map(|l| l.error.clone()) {
        *errors.entry(e).or_default() += 1;
    }
    Ok(AuditRun {
        driver,
        audit: audit(&log, &inserted, &counters),
        step_downs,
        elections,
        rejections,
        errors,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// `audit.md`: one row per driver, its errors and each failed requirement.
pub fn markdown(plan: &AuditPlan, runs: &[AuditRun]) -> String {
    let mut out = format!(
        "# Exactly-once audit\n\n{} tasks × {} writes per driver (more until {} step-downs), \
         three members; faults: ingress limiter at {:.0} requests/s and {:.0} % random 462s \
         on every member, connections closed before {:.0} % of writes and after {:.0} %, a \
         step-down every {} s.\n\n\
         | driver | writes | acknowledged | exactly once | missing | duplicates | \
         unacknowledged applied 0 / 1 / more | step-downs | overload rejections | seconds |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        plan.workers,
        plan.per_worker,
        plan.min_step_downs,
        plan.limiter_rate,
        plan.reject_share * 100.0,
        plan.drop_before * 100.0,
        plan.drop_after * 100.0,
        plan.step_down_every.as_secs_f64(),
    );
    for r in runs {
        let a = &r.audit;
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} / {} / {} | {} | {} | {:.0} |\n",
            r.driver.name(),
            a.writes,
            a.acknowledged,
            a.exactly_once,
            a.missing,
            a.duplicates,
            a.unacknowledged[0],
            a.unacknowledged[1],
            a.unacknowledged[2],
            r.step_downs,
            r.rejections,
            r.seconds
        ));
    }
    out.push('\n');
    for r in runs {
        out.push_str(&format!(
            "- {}: errors returned {:?}; {}\n",
            r.driver.name(),
            r.errors,
            match r.failures(plan) {
                f if f.is_empty() => "every requirement met".to_string(),
                f => format!("FAILED: {}", f.join("; ")),
            }
        ));
    }
    out
}

/// Writes `audit.md` and `audit.json` into `out`.
pub fn write(plan: &AuditPlan, runs: &[AuditRun], out: &std::path::Path) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let json = serde_json::to_string_pretty(&serde_json::json!({ "plan": plan, "runs": runs }))
        .map_err(|e| e.to_string())?;
    std::fs::write(out.join("audit.json"), json).map_err(|e| format!("audit.json: {e}"))?;
    std::fs::write(out.join("audit.md"), markdown(plan, runs)).map_err(|e| format!("audit.md: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logged(id: i64, write: Write, acknowledged: bool) -> Logged {
        Logged {
            id,
            write,
            acknowledged,
            error: None,
        }
    }

    #[test]
    fn audit_counts_each_outcome() {
        let inc = |counter, amount| Write::Inc { counter, amount };
        let log = vec![
            logged(1, Write::Insert, true),  // applied once
            logged(2, Write::Insert, true),  // missing
            logged(3, Write::Insert, false), // applied once, unacknowledged
            logged(4, inc(0, 2), true),      // applied twice
            logged(5, inc(0, 3), false),     // not applied
        ];
        let counters = vec![doc! { "_id": 0i64, "n": 7i64, "ops": [4i64, 4i64, 3i64] }];
        let a = audit(&log, &[1, 3], &counters);
        // Id 3 is pushed into a counter although it was an insert: the increments of the
        // recorded ids (2 + 2) disagree with n, and id 3 has no increment: 2 inconsistencies.
        assert_eq!(a.inconsistencies, 2, "{a}");
        assert_eq!(
            (
                a.writes,
                a.acknowledged,
                a.exactly_once,
                a.missing,
                a.duplicates
            ),
            (5, 3, 1, 1, 2),
            "{a}"
        );
        assert_eq!(a.unacknowledged, [1, 0, 1], "{a}");

        let clean = vec![doc! { "_id": 0i64, "n": 2i64, "ops": [4i64] }];
        let a = audit(&log[..4], &[1, 3], &clean);
        assert_eq!(
            (a.inconsistencies, a.duplicates, a.missing),
            (0, 0, 1),
            "{a}"
        );
    }

    #[test]
    fn failures_name_what_a_driver_broke() {
        let plan = AuditPlan::for_writes(20_000);
        assert_eq!(plan.per_worker, 625);
        let run = AuditRun {
            driver: AuditDriver::Fork,
            audit: Audit {
                writes: 10,
                acknowledged: 8,
                exactly_once: 8,
                unacknowledged: [1, 1, 0],
                ..Audit::default()
            },
            step_downs: 2,
            elections: 2,
            rejections: 5,
            errors: BTreeMap::new(),
            seconds: 1.0,
        };
        assert!(run.failures(&plan).is_empty());
        let bad = AuditRun {
            audit: Audit {
                missing: 1,
                duplicates: 1,
                unacknowledged: [0, 0, 1],
                ..run.audit.clone()
            },
            step_downs: 1,
            ..run.clone()
        };
        assert_eq!(bad.failures(&plan).len(), 4, "{:?}", bad.failures(&plan));
        // Upstream may apply an unacknowledged write twice without failing the audit.
        let upstream = AuditRun {
            driver: AuditDriver::Upstream,
            audit: Audit {
                unacknowledged: [0, 0, 1],
                ..run.audit.clone()
            },
            ..run
        };
        assert!(upstream.failures(&plan).is_empty());
        assert_eq!(
            AuditDriver::parse("fork-default"),
            Ok(AuditDriver::ForkDefault)
        );
        assert!(AuditDriver::parse("nope").is_err());
    }
}
