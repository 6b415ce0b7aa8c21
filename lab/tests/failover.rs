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
//!   The generator and the audit live in the lab library (`lab::loadgen::audit`), which the
//!   lab's `--audit WRITES` runs at full scale.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Document};
use emulator::model::ModelConfig;
use emulator::{Emulator, EmulatorConfig};
use lab::loadgen::audit::{self, AuditDriver, AuditPlan, AuditRun};

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

macro_rules! driver {
    ($name:ident, $m:ident, $uri_options:expr) => {
        mod $name {
            use super::*;
            use $m::event::command::CommandEvent;
            use $m::options::ClientOptions;
            use $m::{Client, Collection};

            /// The driver's connection-string options on top of the emulator's.
            pub const URI_OPTIONS: &str = $uri_options;

            pub async fn client(
                emu: &Emulator,
            ) -> (Client, Arc<std::sync::Mutex<Vec<CommandEvent>>>) {
                let uri = format!("{}&{URI_OPTIONS}", emu.uri());
                let mut opts = ClientOptions::parse(uri.trim_end_matches('&'))
                    .await
                    .expect("uri parses");
                // Long enough to ride out the windows without a primary.
                opts.server_selection_timeout = Some(Duration::from_secs(10));
                opts.connect_timeout = Some(Duration::from_secs(5));
                let events: Arc<std::sync::Mutex<Vec<CommandEvent>>> = Arc::default();
                let sink = events.clone();
                opts.command_event_handler = Some($m::event::EventHandler::callback(
                    move |ev: CommandEvent| {
                        if let Ok(mut e) = sink.lock() {
                            // Bounded: the focused test needs only a few events; the audit's
                            // thousands are not needed.
                            if e.len() < 10_000 {
                                e.push(ev);
                            }
                        }
                    },
                ));
                (Client::with_options(opts).expect("client builds"), events)
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
                coll.insert_one(doc! { "_id": 0, "n": 0 })
                    .await
                    .expect("seed document");
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
                    assert_eq!(
                        sent.len(),
                        2,
                        "{write}: one attempt and one retry: {sent:?}"
                    );
                    assert_eq!(
                        sent[0],
                        addrs[primary].to_string(),
                        "{write}: first attempt"
                    );
                    assert_ne!(
                        sent[1], sent[0],
                        "{write}: the retry goes to the new primary"
                    );
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

/// Runs the audit with each of `drivers` (each against a fresh emulator with the same seed),
/// prints each one's figures and asserts what every driver must satisfy
/// ([`AuditRun::failures`]: 0 duplicates, 0 acknowledged writes missing, the planned
/// step-downs, some overload; for the fork no unacknowledged write applied twice) and, for the
/// fork, that enough writes were acknowledged for the audit to mean something.
async fn run_audit(plan: &AuditPlan, drivers: &[AuditDriver]) -> Vec<AuditRun> {
    let mut runs = Vec::new();
    for &driver in drivers {
        let run = audit::run_one(plan, driver)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", driver.name()));
        eprintln!(
            "exactly-once audit, {}: {}; step-downs {}, elections {}, overload rejections {}; \
             errors returned {:?}",
            driver.name(),
            run.audit,
            run.step_downs,
            run.elections,
            run.rejections,
            run.errors
        );
        assert_eq!(
            run.failures(plan),
            Vec::<String>::new(),
            "{}",
            driver.name()
        );
        if driver != AuditDriver::Upstream {
            assert!(
                run.audit.acknowledged >= 100,
                "{}: {}",
                driver.name(),
                run.audit
            );
        }
        runs.push(run);
    }
    runs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_audit_under_overload_drops_and_step_downs() {
    let plan = AuditPlan {
        workers: 12,
        per_worker: 60,
        min_step_downs: 2,
        max_duration: Duration::from_secs(15),
        limit: Duration::from_secs(45),
        ..AuditPlan::for_writes(720)
    };
    run_audit(&plan, &[AuditDriver::Fork, AuditDriver::Upstream]).await;
}

/// The audit at the scale: `FAILOVER_AUDIT_WRITES` writes per driver (default 20,000),
/// 32 tasks, a step-down every 2 s; the fork with its defaults too (`FAILOVER_AUDIT_VARIANTS`).
/// Minutes long, so not part of `cargo xtask test`; the lab runs the same with
/// `cargo xtask lab --audit 20000`.
/// `FAILOVER_AUDIT_WRITES=20000 cargo test -p lab --test failover -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long: the full-scale audit, run by hand"]
async fn exactly_once_audit_at_scale() {
    let writes: u64 = std::env::var("FAILOVER_AUDIT_WRITES")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(20_000);
    // FAILOVER_AUDIT_VARIANTS=fork,fork-default,upstream (the default) picks the drivers.
    let chosen = std::env::var("FAILOVER_AUDIT_VARIANTS")
        .unwrap_or_else(|_| "fork,fork-default,upstream".to_string());
    let drivers: Vec<AuditDriver> = chosen
        .split(',')
        .map(|v| AuditDriver::parse(v).unwrap_or_else(|e| panic!("FAILOVER_AUDIT_VARIANTS: {e}")))
        .collect();
    run_audit(&AuditPlan::for_writes(writes), &drivers).await;
}
