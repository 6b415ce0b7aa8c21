//! The same scenarios, written once, run by the unmodified official driver (`mongodb_upstream`,
//! crates.io 3.9.1) and by the fork (`mongodb`) against every persona of the emulator:
//! standalone, a replica set of three and a sharded cluster with two routers.
//!
//! `scenarios!` instantiates one module per driver crate; `both!` makes a test that starts one
//! emulator for a persona and runs the fork's then the upstream driver's version of a scenario
//! against it (each driver in its own database, fail points always switched off or used up).
//!
//! Fail points are per member, like mongod's. Scenarios that configure one do it on the
//! "target" member (the standalone, the primary, or the first router) over a raw wire-protocol
//! connection, and on a sharded cluster the client that meets it talks to that router only, so
//! that which router a retry lands on is not left to chance.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use emulator::{Emulator, EmulatorConfig, Topology};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Persona {
    Standalone,
    ReplicaSet,
    Sharded,
}

/// One running emulator of a persona.
struct Env {
    emu: Emulator,
    persona: Persona,
}

impl Env {
    async fn start(persona: Persona) -> Env {
        let topology = match persona {
            Persona::Standalone => Topology::Standalone,
            Persona::ReplicaSet => Topology::ReplicaSet {
                name: "rs0".into(),
                members: 3,
            },
            Persona::Sharded => Topology::Sharded { routers: 2 },
        };
        let emu = Emulator::start(EmulatorConfig {
            topology,
            ..Default::default()
        })
        .await
        .expect("emulator starts");
        Env { emu, persona }
    }

    /// The whole deployment's connection string.
    fn uri(&self) -> String {
        self.emu.uri()
    }

    /// The member that fail points are configured on: standalone, primary, first router.
    fn target(&self) -> SocketAddr {
        self.emu.addresses()[0]
    }

    /// A connection string whose operations all reach [`Env::target`].
    fn target_uri(&self) -> String {
        match self.persona {
            Persona::Sharded => format!("mongodb://{}/", self.target()),
            _ => self.uri(),
        }
    }

    /// Runs an admin command on the target member over a fresh raw connection.
    async fn admin(&self, mut body: Document) -> Document {
        use tokio::io::AsyncWriteExt;
        body.insert("$db", "admin");
        let mut stream = tokio::net::TcpStream::connect(self.target())
            .await
            .expect("connects to the target member");
        let bytes = emulator::wire::encode_op_msg(1, 0, 0, &body).expect("encodes");
        stream.write_all(&bytes).await.expect("sends");
        let reply = tokio::time::timeout(
            Duration::from_secs(5),
            emulator::wire::read_message(&mut stream),
        )
        .await
        .expect("reply within 5 s")
        .expect("well-formed reply")
        .expect("a reply, not EOF")
        .body;
        assert_eq!(reply.get_f64("ok"), Ok(1.0), "{body} -> {reply}");
        reply
    }

    async fn fail_point(&self, name: &str, mode: Bson, data: Document) -> Document {
        self.admin(doc! { "configureFailPoint": name, "mode": mode, "data": data })
            .await
    }

    /// Switches failCommand off; returns how often it fired since it was configured.
    async fn fail_command_off(&self) -> i64 {
        let r = self
            .admin(doc! { "configureFailPoint": "failCommand", "mode": "off" })
            .await;
        match r.get("count") {
            Some(Bson::Int32(n)) => i64::from(*n),
            Some(Bson::Int64(n)) => *n,
            other => panic!("count in {r}: {other:?}"),
        }
    }

    async fn shutdown(self) {
        self.emu.shutdown().await;
    }
}

/// Numeric value of a BSON number (the emulator and mongod may differ in int width).
fn num(v: Option<&Bson>) -> f64 {
    match v {
        Some(Bson::Int32(i)) => f64::from(*i),
        Some(Bson::Int64(i)) => *i as f64,
        Some(Bson::Double(d)) => *d,
        other => panic!("not a number: {other:?}"),
    }
}

fn ids(docs: &[Document]) -> Vec<i32> {
    docs.iter()
        .map(|d| d.get_i32("_id").expect("int _id"))
        .collect()
}

fn overload_data(command: &str) -> Document {
    doc! {
        "failCommands": [command],
        "errorCode": 462,
        "errorLabels": ["SystemOverloadedError", "RetryableError"],
    }
}

macro_rules! scenarios {
    ($name:ident, $m:ident) => {
        mod $name {
            use super::*;
            use $m::event::command::CommandEvent;
            use $m::options::ClientOptions;
            use $m::{Client, Collection, Cursor};

            /// Names this driver's database, app names and so on.
            pub const DRIVER: &str = stringify!($name);

            #[derive(Clone, Default)]
            pub struct Events(Arc<Mutex<Vec<CommandEvent>>>);

            impl Events {
                pub fn started(&self, name: &str) -> usize {
                    self.started_commands(name).len()
                }

                pub fn started_commands(&self, name: &str) -> Vec<Document> {
                    self.0
                        .lock()
                        .unwrap()
                        .iter()
                        .filter_map(|e| match e {
                            CommandEvent::Started(s) if s.command_name == name => {
                                Some(s.command.clone())
                            }
                            _ => None,
                        })
                        .collect()
                }

                /// Server error codes of the failed events of `name`.
                pub fn failed_codes(&self, name: &str) -> Vec<Option<i32>> {
                    self.0
                        .lock()
                        .unwrap()
                        .iter()
                        .filter_map(|e| match e {
                            CommandEvent::Failed(f) if f.command_name == name => {
                                Some(code(&f.failure))
                            }
                            _ => None,
                        })
                        .collect()
                }
            }

            pub async fn client(
                uri: &str,
                tweak: impl FnOnce(&mut ClientOptions),
            ) -> (Client, Events) {
                let mut opts = ClientOptions::parse(uri).await.expect("uri parses");
                opts.server_selection_timeout = Some(Duration::from_secs(5));
                opts.connect_timeout = Some(Duration::from_secs(5));
                let events = Events::default();
                let sink = events.clone();
                opts.command_event_handler =
                    Some($m::event::EventHandler::callback(move |ev: CommandEvent| {
                        sink.0.lock().unwrap().push(ev);
                    }));
                tweak(&mut opts);
                (Client::with_options(opts).expect("client builds"), events)
            }

            fn coll(client: &Client, name: &str) -> Collection<Document> {
                client.database(DRIVER).collection(name)
            }

            async fn all(mut cursor: Cursor<Document>) -> Vec<Document> {
                let mut out = Vec::new();
                while cursor.advance().await.expect("cursor advances") {
                    out.push(cursor.deserialize_current().expect("document"));
                }
                out
            }

            async fn find_ids(c: &Collection<Document>, filter: Document) -> Vec<i32> {
                ids(&all(c.find(filter).sort(doc! { "_id": 1 }).await.unwrap()).await)
            }

            fn code(err: &$m::error::Error) -> Option<i32> {
                match *err.kind {
                    $m::error::ErrorKind::Command(ref c) => Some(c.code),
                    _ => None,
                }
            }

            /// Query and update operators, upsert, replace, deleteMany, sort/skip/limit/
            /// projection and an aggregate.
            pub async fn crud(env: &Env) {
                let (client, _) = client(&env.uri(), |_| {}).await;
                let c = coll(&client, "crud");
                c.insert_many(vec![
                    doc! { "_id": 1, "name": "ann", "age": 31, "tags": ["a", "b"], "team": "red",
                           "addr": { "city": "Oslo", "zip": "0150" },
                           "scores": [{ "k": "math", "v": 90 }, { "k": "art", "v": 60 }] },
                    doc! { "_id": 2, "name": "bob", "age": 25, "tags": ["b"], "team": "blue",
                           "addr": { "city": "Bergen" }, "scores": [{ "k": "math", "v": 40 }] },
                    doc! { "_id": 3, "name": "cy", "age": 40, "tags": [], "team": "red", "nick": "c" },
                    doc! { "_id": 4, "name": "dee", "age": 19, "tags": ["c"], "team": "blue",
                           "addr": { "city": "Oslo" }, "scores": [{ "k": "art", "v": 95 }] },
                    doc! { "_id": 5, "name": "eve", "age": 52, "tags": ["a"], "team": "green" },
                ])
                .await
                .unwrap();

                assert_eq!(find_ids(&c, doc! { "age": { "$gt": 30 } }).await, [1, 3, 5]);
                assert_eq!(
                    find_ids(&c, doc! { "tags": { "$in": ["a", "c"] } }).await,
                    [1, 4, 5]
                );
                assert_eq!(find_ids(&c, doc! { "nick": { "$exists": true } }).await, [3]);
                assert_eq!(find_ids(&c, doc! { "addr": { "$exists": false } }).await, [3, 5]);
                assert_eq!(
                    find_ids(
                        &c,
                        doc! { "scores": { "$elemMatch": { "k": "math", "v": { "$gte": 50 } } } }
                    )
                    .await,
                    [1]
                );
                assert_eq!(find_ids(&c, doc! { "addr.city": "Oslo" }).await, [1, 4]);
                assert_eq!(find_ids(&c, doc! { "scores.v": { "$gt": 80 } }).await, [1, 4]);

                let page = all(
                    c.find(doc! {})
                        .sort(doc! { "age": -1 })
                        .skip(1)
                        .limit(2)
                        .projection(doc! { "name": 1, "_id": 0 })
                        .await
                        .unwrap(),
                )
                .await;
                assert_eq!(page, vec![doc! { "name": "cy" }, doc! { "name": "ann" }]);

                let r = c
                    .update_one(
                        doc! { "_id": 2 },
                        doc! { "$set": { "addr.zip": "5003" }, "$inc": { "age": 1 }, "$push": { "tags": "z" } },
                    )
                    .await
                    .unwrap();
                assert_eq!((r.matched_count, r.modified_count), (1, 1));
                let bob = c.find_one(doc! { "_id": 2 }).await.unwrap().unwrap();
                assert_eq!(bob.get_i32("age"), Ok(26), "{bob}");
                assert_eq!(bob.get_array("tags").unwrap(), &vec![Bson::from("b"), Bson::from("z")]);
                assert_eq!(
                    bob.get_document("addr").unwrap(),
                    &doc! { "city": "Bergen", "zip": "5003" }
                );

                let r = c
                    .update_many(doc! { "team": "red" }, doc! { "$addToSet": { "tags": "a" } })
                    .await
                    .unwrap();
                assert_eq!(
                    (r.matched_count, r.modified_count),
                    (2, 1),
                    "ann already has tag a"
                );
                assert_eq!(find_ids(&c, doc! { "tags": "a" }).await, [1, 3, 5]);

                c.update_one(doc! { "_id": 5 }, doc! { "$unset": { "team": "" } })
                    .await
                    .unwrap();
                let eve = c.find_one(doc! { "_id": 5 }).await.unwrap().unwrap();
                assert!(!eve.contains_key("team"), "{eve}");

                let r = c
                    .update_one(
                        doc! { "_id": 6 },
                        doc! { "$set": { "name": "fay" }, "$inc": { "age": 3 } },
                    )
                    .upsert(true)
                    .await
                    .unwrap();
                assert_eq!(r.matched_count, 0);
                assert_eq!(r.upserted_id, Some(Bson::Int32(6)));
                assert_eq!(
                    c.find_one(doc! { "_id": 6 }).await.unwrap(),
                    Some(doc! { "_id": 6, "name": "fay", "age": 3 })
                );

                let r = c
                    .replace_one(doc! { "_id": 3 }, doc! { "name": "cyrus", "age": 41 })
                    .await
                    .unwrap();
                assert_eq!(r.modified_count, 1);
                assert_eq!(
                    c.find_one(doc! { "_id": 3 }).await.unwrap(),
                    Some(doc! { "_id": 3, "name": "cyrus", "age": 41 })
                );

                // ann 31 red, bob 26 blue, cyrus 41 -, dee 19 blue, eve 52 -, fay 3 -.
                let groups = all(
                    c.aggregate(vec![
                        doc! { "$match": { "age": { "$gte": 20 } } },
                        doc! { "$group": { "_id": "$team", "n": { "$sum": 1 }, "total": { "$sum": "$age" } } },
                        doc! { "$sort": { "_id": 1 } },
                    ])
                    .await
                    .unwrap(),
                )
                .await;
                let got: Vec<(Bson, f64, f64)> = groups
                    .iter()
                    .map(|g| {
                        (
                            g.get("_id").cloned().unwrap_or(Bson::Undefined),
                            num(g.get("n")),
                            num(g.get("total")),
                        )
                    })
                    .collect();
                assert_eq!(
                    got,
                    vec![
                        (Bson::Null, 2.0, 93.0),
                        (Bson::from("blue"), 1.0, 26.0),
                        (Bson::from("red"), 1.0, 31.0),
                    ]
                );

                let r = c
                    .delete_many(doc! { "age": { "$lt": 30 } })
                    .await
                    .unwrap();
                assert_eq!(r.deleted_count, 3);
                assert_eq!(find_ids(&c, doc! {}).await, [1, 3, 5]);
                assert_eq!(c.count_documents(doc! {}).await.unwrap(), 3);
            }

            /// batchSize 2 over 7 documents takes three getMores; a cursor dropped early is
            /// killed.
            pub async fn cursors(env: &Env) {
                let (client, events) = client(&env.uri(), |_| {}).await;
                let c = coll(&client, "cursors");
                c.insert_many((0..7).map(|i| doc! { "_id": i }).collect::<Vec<_>>())
                    .await
                    .unwrap();
                let docs = all(c.find(doc! {}).sort(doc! { "_id": 1 }).batch_size(2).await.unwrap()).await;
                assert_eq!(ids(&docs), [0, 1, 2, 3, 4, 5, 6]);
                let get_mores = events.started_commands("getMore");
                assert_eq!(get_mores.len(), 3, "2 + 2 + 2 + 1: {get_mores:?}");
                for g in &get_mores {
                    assert_eq!(num(g.get("batchSize")), 2.0, "{g}");
                }
                assert_eq!(events.started("killCursors"), 0, "an exhausted cursor needs no kill");

                let mut cursor = c.find(doc! {}).batch_size(2).await.unwrap();
                assert!(cursor.advance().await.unwrap());
                drop(cursor);
                let deadline = Instant::now() + Duration::from_secs(3);
                while events.started("killCursors") == 0 {
                    assert!(Instant::now() < deadline, "no killCursors after dropping the cursor");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let kill = events.started_commands("killCursors").remove(0);
                let id = match kill.get_array("cursors").unwrap().first() {
                    Some(Bson::Int64(id)) => *id,
                    other => panic!("cursor id in {kill}: {other:?}"),
                };
                assert_ne!(id, 0);
                // Give the reply time to arrive, then the cursor must be gone.
                tokio::time::sleep(Duration::from_millis(50)).await;
                let err = client
                    .database(DRIVER)
                    .run_command(doc! { "getMore": id, "collection": "cursors" })
                    .await
                    .unwrap_err();
                assert_eq!(code(&err), Some(43), "CursorNotFound: {err:?}");
            }

            /// A batch that fills up exactly keeps the cursor open, as mongod: the driver
            /// needs one more getMore, answered with an empty batch and id 0. A reached `limit`
            /// closes the cursor at once.
            pub async fn cursor_boundary(env: &Env) {
                let (client, events) = client(&env.uri(), |_| {}).await;
                let c = coll(&client, "boundary");
                c.insert_many((0..6).map(|i| doc! { "_id": i }).collect::<Vec<_>>())
                    .await
                    .unwrap();
                let docs = all(c.aggregate(vec![doc! { "$sort": { "_id": 1 } }]).batch_size(2).await.unwrap()).await;
                assert_eq!(ids(&docs), [0, 1, 2, 3, 4, 5]);
                assert_eq!(events.started("getMore"), 3, "2 | 2 | 2 | empty");
                let docs = all(c.find(doc! {}).batch_size(3).await.unwrap()).await;
                assert_eq!(docs.len(), 6);
                assert_eq!(events.started("getMore"), 3 + 2, "3 | 3 | empty");
                let docs = all(c.find(doc! {}).limit(4).batch_size(2).await.unwrap()).await;
                assert_eq!(docs.len(), 4);
                assert_eq!(events.started("getMore"), 5 + 1, "2 | 2, limit reached");
                assert_eq!(events.started("killCursors"), 0, "exhausted cursors need no kill");
            }

            /// `onPrimaryTransactionalWrite` with `skip: 3` fires on the fourth document of an
            /// insertMany of five (mongod counts statements, not commands); the retry is
            /// answered from the stored reply.
            pub async fn statement_skip(env: &Env) {
                let (client, events) = client(&env.target_uri(), |_| {}).await;
                let c = coll(&client, "statement_skip");
                client.database("admin").run_command(doc! { "ping": 1 }).await.unwrap();
                // `skip: 3` counts documents: the fourth document of one insert fires it.
                env.fail_point(
                    "onPrimaryTransactionalWrite",
                    doc! { "skip": 3 }.into(),
                    doc! { "closeConnection": true },
                )
                .await;
                c.insert_many((0..5).map(|i| doc! { "_id": i }).collect::<Vec<_>>())
                    .await
                    .unwrap();
                let inserts = events.started_commands("insert");
                assert_eq!(inserts.len(), 2, "closed at the 4th document, then retried: {inserts:?}");
                assert_eq!(inserts[0].get("txnNumber"), inserts[1].get("txnNumber"));
                assert_eq!(c.count_documents(doc! {}).await.unwrap(), 5, "applied once");
                let fired = env
                    .admin(doc! { "configureFailPoint": "onPrimaryTransactionalWrite", "mode": "off" })
                    .await;
                // The 4th and 5th documents; the retry returned the stored reply.
                assert_eq!(num(fired.get("count")), 2.0, "{fired}");
            }

            /// The connection closes after the insert was applied; the driver retries with the
            /// same txnNumber and the server answers from its record: one document.
            pub async fn retried_insert(env: &Env) {
                let (client, events) = client(&env.target_uri(), |_| {}).await;
                let c = coll(&client, "retried");
                client.database("admin").run_command(doc! { "ping": 1 }).await.unwrap();
                env.fail_point(
                    "onPrimaryTransactionalWrite",
                    doc! { "times": 1 }.into(),
                    doc! { "closeConnection": true },
                )
                .await;
                c.insert_one(doc! { "_id": "once", "v": 1 }).await.unwrap();
                let inserts = events.started_commands("insert");
                assert_eq!(inserts.len(), 2, "one retry: {inserts:?}");
                assert_eq!(inserts[0].get("txnNumber"), inserts[1].get("txnNumber"));
                assert!(inserts[0].get("txnNumber").is_some());
                assert_eq!(c.count_documents(doc! { "_id": "once" }).await.unwrap(), 1);
                assert_eq!(c.count_documents(doc! {}).await.unwrap(), 1);
                // The fail point was used up: the next write is not retried.
                c.insert_one(doc! { "_id": "twice" }).await.unwrap();
                assert_eq!(events.started("insert"), 3);
            }

            /// Writes in a transaction are invisible outside it until commit; aborted ones never
            /// appear.
            pub async fn transactions(env: &Env) {
                let (client, events) = client(&env.uri(), |_| {}).await;
                let c = coll(&client, "txn");
                c.insert_one(doc! { "_id": 0 }).await.unwrap();
                let mut s = client.start_session().await.unwrap();

                s.start_transaction().await.unwrap();
                c.insert_one(doc! { "_id": 1, "v": "commit" })
                    .session(&mut s)
                    .await
                    .unwrap();
                assert!(c
                    .find_one(doc! { "_id": 1 })
                    .session(&mut s)
                    .await
                    .unwrap()
                    .is_some());
                assert_eq!(c.find_one(doc! { "_id": 1 }).await.unwrap(), None, "uncommitted");
                s.commit_transaction().await.unwrap();
                assert_eq!(
                    c.find_one(doc! { "_id": 1 }).await.unwrap(),
                    Some(doc! { "_id": 1, "v": "commit" })
                );

                s.start_transaction().await.unwrap();
                c.insert_one(doc! { "_id": 2, "v": "abort" })
                    .session(&mut s)
                    .await
                    .unwrap();
                c.update_one(doc! { "_id": 1 }, doc! { "$set": { "v": "changed" } })
                    .session(&mut s)
                    .await
                    .unwrap();
                assert_eq!(c.find_one(doc! { "_id": 2 }).await.unwrap(), None);
                s.abort_transaction().await.unwrap();
                assert_eq!(c.find_one(doc! { "_id": 2 }).await.unwrap(), None, "aborted");
                assert_eq!(
                    c.find_one(doc! { "_id": 1 }).await.unwrap(),
                    Some(doc! { "_id": 1, "v": "commit" }),
                    "the aborted update is rolled back"
                );
                assert_eq!(find_ids(&c, doc! {}).await, [0, 1]);
                assert_eq!(events.started("commitTransaction"), 1);
                assert_eq!(events.started("abortTransaction"), 1);
            }

            /// failCommand `{times: 2}` with 462 + SystemOverloadedError/RetryableError: two
            /// overload retries, the third attempt succeeds. alwaysOn: the error surfaces after
            /// three attempts.
            pub async fn overload_retries(env: &Env) {
                env.admin(doc! { "setParameter": 1, "externalClientBaseBackoffMS": 1 })
                    .await;
                let (client, events) = client(&env.target_uri(), |_| {}).await;
                let c = coll(&client, "overload");
                c.insert_one(doc! { "_id": 1 }).await.unwrap();
                env.fail_point("failCommand", doc! { "times": 2 }.into(), overload_data("find"))
                    .await;
                let t = Instant::now();
                assert_eq!(
                    c.find_one(doc! { "_id": 1 }).await.unwrap(),
                    Some(doc! { "_id": 1 })
                );
                assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
                assert_eq!(events.started("find"), 3, "two failures, then success");
                assert_eq!(events.failed_codes("find"), [Some(462), Some(462)]);
                assert_eq!(env.fail_command_off().await, 2);

                env.fail_point("failCommand", "alwaysOn".into(), overload_data("find"))
                    .await;
                let err = c.find_one(doc! { "_id": 1 }).await.unwrap_err();
                assert_eq!(code(&err), Some(462), "{err:?}");
                assert!(err.contains_label("SystemOverloadedError"), "{err:?}");
                assert!(err.contains_label("RetryableError"), "{err:?}");
                assert_eq!(events.started("find"), 6, "1 + 2 retries");
                assert_eq!(env.fail_command_off().await, 3);
                c.find_one(doc! {}).await.unwrap();
            }

            /// blockConnection delays the reply by blockTimeMS.
            pub async fn block_connection(env: &Env) {
                let (client, _) = client(&env.target_uri(), |_| {}).await;
                let admin = client.database("admin");
                admin.run_command(doc! { "ping": 1 }).await.unwrap();
                env.fail_point(
                    "failCommand",
                    doc! { "times": 1 }.into(),
                    doc! { "failCommands": ["ping"], "blockConnection": true, "blockTimeMS": 150 },
                )
                .await;
                let t = Instant::now();
                admin.run_command(doc! { "ping": 1 }).await.unwrap();
                let took = t.elapsed();
                assert!(took >= Duration::from_millis(150), "{took:?}");
                assert!(took < Duration::from_secs(3), "{took:?}");
                assert_eq!(env.fail_command_off().await, 1);
            }

            /// closeConnection: with retryable reads off the driver reports a network error;
            /// the next read works on a new connection.
            pub async fn close_connection(env: &Env) {
                let (client, events) =
                    client(&env.target_uri(), |o| o.retry_reads = Some(false)).await;
                let c = coll(&client, "close");
                c.insert_one(doc! { "_id": 1 }).await.unwrap();
                env.fail_point(
                    "failCommand",
                    doc! { "times": 1 }.into(),
                    doc! { "failCommands": ["find"], "closeConnection": true },
                )
                .await;
                let err = c.find_one(doc! { "_id": 1 }).await.unwrap_err();
                assert!(
                    matches!(*err.kind, $m::error::ErrorKind::Io(_)),
                    "network error expected: {err:?}"
                );
                assert_eq!(events.started("find"), 1, "no retry");
                assert_eq!(
                    c.find_one(doc! { "_id": 1 }).await.unwrap(),
                    Some(doc! { "_id": 1 })
                );
                assert_eq!(env.fail_command_off().await, 1);
            }

            /// A fail point with appName fires for that application only.
            pub async fn app_name_filter(env: &Env) {
                let a_name = format!("{DRIVER}-a");
                let b_name = format!("{DRIVER}-b");
                let (a, _) = client(&env.target_uri(), |o| o.app_name = Some(a_name.clone())).await;
                let (b, _) = client(&env.target_uri(), |o| o.app_name = Some(b_name.clone())).await;
                env.fail_point(
                    "failCommand",
                    "alwaysOn".into(),
                    doc! { "failCommands": ["ping"], "appName": a_name.clone(), "errorCode": 2 },
                )
                .await;
                for _ in 0..2 {
                    let err = a
                        .database("admin")
                        .run_command(doc! { "ping": 1 })
                        .await
                        .unwrap_err();
                    assert_eq!(code(&err), Some(2), "{err:?}");
                    b.database("admin")
                        .run_command(doc! { "ping": 1 })
                        .await
                        .unwrap();
                }
                assert_eq!(env.fail_command_off().await, 2, "fired for a only");
                a.database("admin")
                    .run_command(doc! { "ping": 1 })
                    .await
                    .unwrap();
            }

            /// Every handshake of this driver carries `backpressure: "2"`, visible through
            /// `Emulator::client_metadata` and the `labClientMetadata` command.
            pub async fn handshake_metadata(env: &Env) {
                let app = format!("{DRIVER}-meta");
                let (client, _) = client(&env.uri(), |o| o.app_name = Some(app.clone())).await;
                let admin = client.database("admin");
                admin.run_command(doc! { "ping": 1 }).await.unwrap();
                let is_ours = |m: &Document| {
                    m.get_document("application")
                        .and_then(|a| a.get_str("name"))
                        .is_ok_and(|n| n == app)
                };
                let mine: Vec<Document> = env
                    .emu
                    .client_metadata()
                    .into_iter()
                    .filter(|m| is_ours(m))
                    .collect();
                assert!(!mine.is_empty(), "no handshake recorded for {app}");
                for m in &mine {
                    assert_eq!(m.get_str("backpressure"), Ok("2"), "{m}");
                    let driver = m.get_document("driver").unwrap().get_str("name").unwrap();
                    assert!(driver.starts_with("mongo-rust-driver"), "{m}");
                }
                let diag = admin
                    .run_command(doc! { "labClientMetadata": 1 })
                    .await
                    .unwrap();
                let listed: Vec<&Document> = diag
                    .get_array("metadata")
                    .unwrap()
                    .iter()
                    .filter_map(|m| m.as_document())
                    .filter(|m| is_ours(m))
                    .collect();
                assert!(listed.len() >= mine.len(), "{diag}");
                assert!(listed.iter().all(|m| m.get_str("backpressure") == Ok("2")));
            }
        }
    };
}

scenarios!(fork, mongodb);
scenarios!(upstream, mongodb_upstream);

macro_rules! both {
    ($(#[$attr:meta])* $test:ident, $scenario:ident, $persona:expr) => {
        $(#[$attr])*
        #[tokio::test]
        async fn $test() {
            let env = Env::start($persona).await;
            tokio::time::timeout(Duration::from_secs(20), async {
                fork::$scenario(&env).await;
                upstream::$scenario(&env).await;
            })
            .await
            .expect("scenario finishes within 20 s");
            env.shutdown().await;
        }
    };
}

both!(crud_standalone, crud, Persona::Standalone);
both!(crud_replica_set, crud, Persona::ReplicaSet);
both!(crud_sharded, crud, Persona::Sharded);

both!(cursors_standalone, cursors, Persona::Standalone);
both!(cursors_replica_set, cursors, Persona::ReplicaSet);
both!(cursors_sharded, cursors, Persona::Sharded);

both!(
    cursor_boundary_standalone,
    cursor_boundary,
    Persona::Standalone
);
both!(
    cursor_boundary_replica_set,
    cursor_boundary,
    Persona::ReplicaSet
);
both!(cursor_boundary_sharded, cursor_boundary, Persona::Sharded);

both!(
    retried_insert_replica_set,
    retried_insert,
    Persona::ReplicaSet
);
both!(retried_insert_sharded, retried_insert, Persona::Sharded);

both!(
    statement_skip_replica_set,
    statement_skip,
    Persona::ReplicaSet
);
both!(statement_skip_sharded, statement_skip, Persona::Sharded);

both!(transactions_replica_set, transactions, Persona::ReplicaSet);
both!(transactions_sharded, transactions, Persona::Sharded);

both!(
    overload_retries_standalone,
    overload_retries,
    Persona::Standalone
);
both!(
    overload_retries_replica_set,
    overload_retries,
    Persona::ReplicaSet
);
both!(overload_retries_sharded, overload_retries, Persona::Sharded);

both!(
    block_connection_standalone,
    block_connection,
    Persona::Standalone
);
both!(
    block_connection_replica_set,
    block_connection,
    Persona::ReplicaSet
);
both!(block_connection_sharded, block_connection, Persona::Sharded);

both!(
    close_connection_standalone,
    close_connection,
    Persona::Standalone
);
both!(
    close_connection_replica_set,
    close_connection,
    Persona::ReplicaSet
);
both!(close_connection_sharded, close_connection, Persona::Sharded);

both!(
    app_name_filter_standalone,
    app_name_filter,
    Persona::Standalone
);
both!(
    app_name_filter_replica_set,
    app_name_filter,
    Persona::ReplicaSet
);
both!(app_name_filter_sharded, app_name_filter, Persona::Sharded);

both!(
    handshake_metadata_standalone,
    handshake_metadata,
    Persona::Standalone
);
both!(
    handshake_metadata_replica_set,
    handshake_metadata,
    Persona::ReplicaSet
);
both!(
    handshake_metadata_sharded,
    handshake_metadata,
    Persona::Sharded
);
