//! Authentication against the emulator, by the fork (`mongodb`) and by the unmodified official
//! driver (`mongodb_upstream`, crates.io 3.9.1): SCRAM-SHA-256 and SCRAM-SHA-1, mechanism
//! negotiation through `saslSupportedMechs`, speculative authentication in the handshake, a
//! wrong password, an unauthenticated command, and users created, updated and dropped at run
//! time.
//!
//! `auth_scenarios!` instantiates one module per driver crate; each test starts one emulator
//! with a root user and runs the fork's then the upstream driver's version of a scenario.
//! Server-side facts (how many conversations started with `saslStart` and how many in a hello)
//! come from `serverStatus.security`, mongod's authentication counters.

use std::time::Duration;

use bson::{doc, Bson, Document};
use emulator::{Emulator, EmulatorConfig, Topology, UserConfig};

const ROOT: &str = "root";
const ROOT_PASSWORD: &str = "pw:with%odd@chars";

struct Env {
    emu: Emulator,
    root: UserConfig,
}

impl Env {
    async fn start(topology: Topology) -> Env {
        let root = UserConfig::admin(ROOT, ROOT_PASSWORD);
        let emu = Emulator::start(EmulatorConfig {
            topology,
            users: vec![root.clone()],
            ..Default::default()
        })
        .await
        .expect("emulator starts");
        Env { emu, root }
    }

    /// The connection string without credentials.
    fn uri(&self) -> String {
        self.emu.uri()
    }

    /// The connection string with the root user's credentials.
    fn root_uri(&self) -> String {
        self.emu.uri_with_credentials(&self.root)
    }

    /// A connection string for `user` on `db` with `password`, and extra options.
    fn uri_for(&self, user: &str, db: &str, password: &str, options: &str) -> String {
        let mut uri = self.emu.uri_with_credentials(&UserConfig {
            db: db.into(),
            name: user.into(),
            password: password.into(),
            roles: Vec::new(),
        });
        if !options.is_empty() {
            uri.push('&');
            uri.push_str(options);
        }
        uri
    }

    async fn shutdown(self) {
        self.emu.shutdown().await;
    }
}

/// `security.authentication.mechanisms.<mechanism>.<section>.<field>` of a serverStatus reply.
fn auth_counter(status: &Document, mechanism: &str, section: &str, field: &str) -> i64 {
    let value = status
        .get_document("security")
        .and_then(|s| s.get_document("authentication"))
        .and_then(|a| a.get_document("mechanisms"))
        .and_then(|m| m.get_document(mechanism))
        .and_then(|m| m.get_document(section))
        .map(|s| s.get(field).cloned());
    match value {
        Ok(Some(Bson::Int64(n))) => n,
        Ok(Some(Bson::Int32(n))) => i64::from(n),
        other => panic!("{mechanism}.{section}.{field} in {status}: {other:?}"),
    }
}

/// Conversations of `mechanism` so far: (started with a `saslStart` command, started in a
/// hello's `speculativeAuthenticate`, successful).
fn conversations(status: &Document, mechanism: &str) -> (i64, i64, i64) {
    let all = auth_counter(status, mechanism, "authenticate", "received");
    let speculative = auth_counter(status, mechanism, "speculativeAuthenticate", "received");
    let successful = auth_counter(status, mechanism, "authenticate", "successful");
    (all - speculative, speculative, successful)
}

macro_rules! auth_scenarios {
    ($name:ident, $m:ident) => {
        mod $name {
            use super::*;
            use $m::options::ClientOptions;
            use $m::Client;

            /// This driver's database.
            pub const DRIVER: &str = stringify!($name);

            pub async fn client(uri: &str) -> Client {
                let mut opts = ClientOptions::parse(uri).await.expect("uri parses");
                opts.server_selection_timeout = Some(Duration::from_secs(5));
                opts.connect_timeout = Some(Duration::from_secs(5));
                Client::with_options(opts).expect("client builds")
            }

            async fn server_status(env: &Env) -> Document {
                let root = client(&env.root_uri()).await;
                let status = root
                    .database("admin")
                    .run_command(doc! { "serverStatus": 1 })
                    .await
                    .expect("serverStatus as root");
                root.shutdown().await;
                status
            }

            fn command_code(err: &$m::error::Error) -> Option<i32> {
                match *err.kind {
                    $m::error::ErrorKind::Command(ref c) => Some(c.code),
                    _ => None,
                }
            }

            /// Authenticates with `mechanism` given explicitly, writes and reads, and sees
            /// itself in `connectionStatus`.
            async fn explicit_mechanism(env: &Env, mechanism: &str) {
                let uri = env.uri_for(
                    ROOT,
                    "admin",
                    ROOT_PASSWORD,
                    &format!("authMechanism={mechanism}"),
                );
                let before = conversations(&server_status(env).await, mechanism);
                let c = client(&uri).await;
                let coll = c.database(DRIVER).collection::<Document>(mechanism);
                coll.insert_one(doc! { "_id": 1, "via": mechanism })
                    .await
                    .expect("insert");
                let found = coll.find_one(doc! { "_id": 1 }).await.expect("find");
                assert_eq!(found, Some(doc! { "_id": 1, "via": mechanism }));
                let status = c
                    .database("admin")
                    .run_command(doc! { "connectionStatus": 1 })
                    .await
                    .expect("connectionStatus");
                let users = status
                    .get_document("authInfo")
                    .and_then(|a| a.get_array("authenticatedUsers"))
                    .expect("authInfo.authenticatedUsers");
                assert_eq!(
                    users,
                    &vec![Bson::Document(doc! { "user": ROOT, "db": "admin" })]
                );
                c.shutdown().await;
                let after = conversations(&server_status(env).await, mechanism);
                // The client's pool authenticated at least once with this mechanism, and every
                // conversation it started succeeded.
                assert!(after.2 > before.2, "{mechanism}: {before:?} -> {after:?}");
            }

            pub async fn scram_sha_256(env: &Env) {
                explicit_mechanism(env, "SCRAM-SHA-256").await;
            }

            pub async fn scram_sha_1(env: &Env) {
                explicit_mechanism(env, "SCRAM-SHA-1").await;
            }

            /// The handshake's hello carries the first SCRAM message, so no connection sends a
            /// `saslStart`: one round trip fewer per authenticated connection.
            pub async fn speculative(env: &Env) {
                let before = conversations(&server_status(env).await, "SCRAM-SHA-256");
                let c = client(&env.root_uri()).await;
                // Four operations at once make the pool open several connections.
                let pings: Vec<_> = (0..4)
                    .map(|_| {
                        let db = c.database(DRIVER);
                        tokio::spawn(async move { db.run_command(doc! { "ping": 1 }).await })
                    })
                    .collect();
                for p in pings {
                    p.await.expect("task").expect("ping");
                }
                c.shutdown().await;
                let after = conversations(&server_status(env).await, "SCRAM-SHA-256");
                let sasl_starts = after.0 - before.0;
                let speculative = after.1 - before.1;
                let successful = after.2 - before.2;
                // The default mechanism for a user with SCRAM-SHA-256 credentials is SHA-256;
                // the two serverStatus clients authenticate speculatively too.
                assert!(speculative >= 2, "{before:?} -> {after:?}");
                assert_eq!(sasl_starts, 0, "{before:?} -> {after:?}");
                assert_eq!(successful, speculative, "{before:?} -> {after:?}");
            }

            pub async fn wrong_password(env: &Env) {
                let c = client(&env.uri_for(ROOT, "admin", "not-the-password", "")).await;
                let err = c
                    .database(DRIVER)
                    .run_command(doc! { "ping": 1 })
                    .await
                    .expect_err("a wrong password fails");
                assert!(
                    matches!(*err.kind, $m::error::ErrorKind::Authentication { .. }),
                    "{err}"
                );
                assert!(err.to_string().contains("Authentication failed."), "{err}");
                c.shutdown().await;
            }

            pub async fn unauthenticated(env: &Env) {
                let c = client(&env.uri()).await;
                // The handshake and ping need no authentication, as on mongod.
                c.database(DRIVER)
                    .run_command(doc! { "ping": 1 })
                    .await
                    .expect("ping needs no authentication");
                let err = c
                    .database(DRIVER)
                    .collection::<Document>("c")
                    .find_one(doc! {})
                    .await
                    .expect_err("find needs authentication");
                assert_eq!(command_code(&err), Some(13), "{err}");
                assert!(
                    err.to_string()
                        .contains("Command find requires authentication"),
                    "{err}"
                );
                c.shutdown().await;
            }

            /// createUser, log in as the new user (on its own database), updateUser with a new
            /// password, usersInfo, dropUser.
            pub async fn user_lifecycle(env: &Env) {
                let root = client(&env.root_uri()).await;
                let appdb = root.database(&format!("{DRIVER}_app"));
                let user = format!("{DRIVER}_user");
                appdb
                    .run_command(
                        doc! { "createUser": &user, "pwd": "first", "roles": ["readWrite"] },
                    )
                    .await
                    .expect("createUser");
                let again = appdb
                    .run_command(doc! { "createUser": &user, "pwd": "x", "roles": [] })
                    .await
                    .expect_err("the user exists");
                assert_eq!(command_code(&again), Some(51003), "{again}");

                let uri = env.uri_for(&user, appdb.name(), "first", "");
                let app = client(&uri).await;
                let coll = app.database(appdb.name()).collection::<Document>("c");
                coll.insert_one(doc! { "_id": 1 })
                    .await
                    .expect("insert as the new user");
                assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 1);
                app.shutdown().await;

                let info = appdb
                    .run_command(doc! { "usersInfo": &user, "showCredentials": true })
                    .await
                    .expect("usersInfo");
                let users = info.get_array("users").expect("users");
                assert_eq!(users.len(), 1, "{info}");
                let Bson::Document(u) = &users[0] else {
                    panic!("{info}")
                };
                assert_eq!(
                    u.get_str("_id"),
                    Ok(format!("{}.{user}", appdb.name()).as_str())
                );
                assert_eq!(
                    u.get_array("roles").unwrap(),
                    &vec![Bson::Document(
                        doc! { "role": "readWrite", "db": appdb.name() }
                    )]
                );
                assert_eq!(
                    u.get_array("mechanisms").unwrap(),
                    &vec![Bson::from("SCRAM-SHA-1"), Bson::from("SCRAM-SHA-256")]
                );
                let creds = u.get_document("credentials").expect("credentials");
                let sha256 = creds
                    .get_document("SCRAM-SHA-256")
                    .expect("SHA-256 credential");
                assert_eq!(sha256.get_i32("iterationCount"), Ok(15_000));
                assert_eq!(
                    creds
                        .get_document("SCRAM-SHA-1")
                        .unwrap()
                        .get_i32("iterationCount"),
                    Ok(10_000)
                );
                // Credentials, never the password.
                assert!(!format!("{info}").contains("first"), "{info}");

                appdb
                    .run_command(doc! { "updateUser": &user, "pwd": "second" })
                    .await
                    .expect("updateUser");
                let old = client(&uri).await;
                let err = old
                    .database(appdb.name())
                    .run_command(doc! { "ping": 1 })
                    .await
                    .expect_err("the old password no longer works");
                assert!(err.to_string().contains("Authentication failed."), "{err}");
                old.shutdown().await;
                let new = client(&env.uri_for(&user, appdb.name(), "second", "")).await;
                new.database(appdb.name())
                    .run_command(doc! { "ping": 1 })
                    .await
                    .expect("the new password works");
                new.shutdown().await;

                appdb
                    .run_command(doc! { "dropUser": &user })
                    .await
                    .expect("dropUser");
                let gone = appdb
                    .run_command(doc! { "dropUser": &user })
                    .await
                    .expect_err("already dropped");
                assert_eq!(command_code(&gone), Some(11), "{gone}");
                root.shutdown().await;
            }

            /// A user with only SCRAM-SHA-1 credentials: the driver learns that from
            /// `saslSupportedMechs` in its handshake and authenticates with SHA-1 unasked.
            pub async fn negotiated_sha1(env: &Env) {
                let root = client(&env.root_uri()).await;
                let user = format!("{DRIVER}_sha1");
                root.database("admin")
                    .run_command(doc! {
                        "createUser": &user, "pwd": "pw1", "roles": ["root"],
                        "mechanisms": ["SCRAM-SHA-1"],
                    })
                    .await
                    .expect("createUser with SCRAM-SHA-1 only");
                root.shutdown().await;
                let before = conversations(&server_status(env).await, "SCRAM-SHA-1");
                let c = client(&env.uri_for(&user, "admin", "pw1", "")).await;
                c.database(DRIVER)
                    .run_command(doc! { "ping": 1 })
                    .await
                    .expect("ping");
                // The connection authenticates at its first use, so ping alone may not need it.
                c.database(DRIVER)
                    .collection::<Document>("sha1")
                    .insert_one(doc! {})
                    .await
                    .expect("insert as the SHA-1 user");
                c.shutdown().await;
                let after = conversations(&server_status(env).await, "SCRAM-SHA-1");
                assert!(after.2 > before.2, "{before:?} -> {after:?}");
            }
        }
    };
}

auth_scenarios!(fork, mongodb);
auth_scenarios!(upstream, mongodb_upstream);

macro_rules! both {
    ($test:ident, $scenario:ident, $topology:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let env = Env::start($topology).await;
            tokio::time::timeout(Duration::from_secs(60), async {
                fork::$scenario(&env).await;
                upstream::$scenario(&env).await;
            })
            .await
            .expect("scenario finishes within 60 s");
            env.shutdown().await;
        }
    };
}

fn replica_set() -> Topology {
    Topology::ReplicaSet {
        name: "rs0".into(),
        members: 3,
    }
}

both!(
    scram_sha_256_standalone,
    scram_sha_256,
    Topology::Standalone
);
both!(scram_sha_256_replica_set, scram_sha_256, replica_set());
both!(scram_sha_1_standalone, scram_sha_1, Topology::Standalone);
both!(
    scram_sha_1_sharded,
    scram_sha_1,
    Topology::Sharded { routers: 2 }
);
both!(speculative_standalone, speculative, Topology::Standalone);
both!(
    wrong_password_standalone,
    wrong_password,
    Topology::Standalone
);
both!(
    unauthenticated_standalone,
    unauthenticated,
    Topology::Standalone
);
both!(unauthenticated_replica_set, unauthenticated, replica_set());
both!(
    user_lifecycle_standalone,
    user_lifecycle,
    Topology::Standalone
);
both!(user_lifecycle_replica_set, user_lifecycle, replica_set());
both!(
    negotiated_sha1_standalone,
    negotiated_sha1,
    Topology::Standalone
);
