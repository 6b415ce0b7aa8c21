//! Authentication over the wire, without a driver: the exact replies of `saslStart` /
//! `saslContinue` (conversation ids, `done`, `skipEmptyExchange`), speculative authentication
//! and `saslSupportedMechs` in hello, mongod's errors (18 AuthenticationFailed, 13
//! Unauthorized, 17 ProtocolError, 334 MechanismUnavailable), rights lost with a dropped user,
//! a server without users, and the overload model's price of an authentication storm.
//!
//! The SCRAM client here is written from RFC 5802 / 7677 (and mongod's SHA-1 password digest)
//! independently of the server's code.

mod common;

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use bson::{doc, spec::BinarySubtype, Binary, Bson, Document};
use common::RawClient;
use emulator::{Emulator, EmulatorConfig, Topology, UserConfig};
use hmac::{Hmac, KeyInit, Mac};
use md5::Md5;
use sha1::Sha1;
use sha2::{Digest, Sha256};

const USER: &str = "alice";
const PASSWORD: &str = "wonderland";

async fn start_with_users(topology: Topology, users: Vec<UserConfig>) -> Emulator {
    Emulator::start(EmulatorConfig {
        topology,
        users,
        ..Default::default()
    })
    .await
    .expect("emulator starts")
}

async fn start_auth() -> Emulator {
    start_with_users(
        Topology::Standalone,
        vec![UserConfig::admin(USER, PASSWORD)],
    )
    .await
}

fn bin(bytes: impl Into<Vec<u8>>) -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::Generic,
        bytes: bytes.into(),
    })
}

fn payload_text(reply: &Document) -> String {
    match reply.get("payload") {
        Some(Bson::Binary(b)) => String::from_utf8(b.bytes.clone()).expect("UTF-8 payload"),
        other => panic!("payload in {reply}: {other:?}"),
    }
}

#[derive(Clone, Copy)]
enum Mech {
    Sha1,
    Sha256,
}

impl Mech {
    fn name(self) -> &'static str {
        match self {
            Mech::Sha1 => "SCRAM-SHA-1",
            Mech::Sha256 => "SCRAM-SHA-256",
        }
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            Mech::Sha1 => {
                let mut m = Hmac::<Sha1>::new_from_slice(key).unwrap();
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
            Mech::Sha256 => {
                let mut m = Hmac::<Sha256>::new_from_slice(key).unwrap();
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Mech::Sha1 => Sha1::digest(data).to_vec(),
            Mech::Sha256 => Sha256::digest(data).to_vec(),
        }
    }

    /// SaltedPassword: PBKDF2 over the password (SHA-256; ASCII passwords need no SASLprep) or
    /// over mongod's `hex(MD5("user:mongo:password"))` (SHA-1).
    fn salted(self, user: &str, password: &str, salt: &[u8], i: u32) -> Vec<u8> {
        match self {
            Mech::Sha1 => {
                let digest = Md5::digest(format!("{user}:mongo:{password}").as_bytes());
                let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
                let mut out = [0u8; 20];
                pbkdf2::pbkdf2_hmac::<Sha1>(hex.as_bytes(), salt, i, &mut out);
                out.to_vec()
            }
            Mech::Sha256 => {
                let mut out = [0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password.as_bytes(), salt, i, &mut out);
                out.to_vec()
            }
        }
    }
}

/// The client's side of one conversation.
struct ScramClient {
    mech: Mech,
    user: String,
    password: String,
    client_first_bare: String,
}

impl ScramClient {
    fn new(mech: Mech, user: &str, password: &str) -> ScramClient {
        ScramClient {
            mech,
            user: user.into(),
            password: password.into(),
            client_first_bare: format!("n={user},r=clientNonce0123456789"),
        }
    }

    fn first_message(&self) -> Vec<u8> {
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    fn sasl_start(&self, skip_empty_exchange: bool) -> Document {
        doc! {
            "saslStart": 1,
            "mechanism": self.mech.name(),
            "payload": bin(self.first_message()),
            "options": { "skipEmptyExchange": skip_empty_exchange },
            "$db": "admin",
        }
    }

    /// The final message for `server_first`, and the server signature it must answer with.
    fn final_message(&self, server_first: &str) -> (Vec<u8>, String) {
        let field = |k: &str| {
            server_first
                .split(',')
                .find_map(|a| a.strip_prefix(k))
                .unwrap_or_else(|| panic!("{k} in {server_first}"))
                .to_string()
        };
        let nonce = field("r=");
        assert!(
            nonce.starts_with("clientNonce0123456789") && nonce.len() > 30,
            "{nonce}"
        );
        let salt = B64.decode(field("s=")).expect("base64 salt");
        let iterations: u32 = field("i=").parse().expect("iteration count");
        let salted = self
            .mech
            .salted(&self.user, &self.password, &salt, iterations);
        let client_key = self.mech.hmac(&salted, b"Client Key");
        let stored_key = self.mech.hash(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let signature = self.mech.hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let server_key = self.mech.hmac(&salted, b"Server Key");
        let server_signature = self.mech.hmac(&server_key, auth_message.as_bytes());
        (
            format!("{without_proof},p={}", B64.encode(proof)).into_bytes(),
            format!("v={}", B64.encode(server_signature)),
        )
    }
}

fn sasl_continue(payload: impl Into<Vec<u8>>) -> Document {
    doc! { "saslContinue": 1, "conversationId": 1, "payload": bin(payload), "$db": "admin" }
}

/// Runs a whole conversation on `c`; returns the replies.
async fn authenticate(c: &mut RawClient, mech: Mech, password: &str) -> Vec<Document> {
    let client = ScramClient::new(mech, USER, password);
    let first = c.command(&client.sasl_start(true)).await.expect("reply");
    if first.get_f64("ok") != Ok(1.0) {
        return vec![first];
    }
    let (final_message, _) = client.final_message(&payload_text(&first));
    let second = c
        .command(&sasl_continue(final_message))
        .await
        .expect("reply");
    vec![first, second]
}

/// Runs `find` on `app.c`: the command every test uses to see whether a connection is
/// authorized.
async fn find_in_app(c: &mut RawClient) -> Document {
    c.command(&doc! { "find": "c", "$db": "app" })
        .await
        .expect("reply")
}

fn error_of(reply: &Document) -> (i32, String, String) {
    assert_eq!(reply.get_f64("ok"), Ok(0.0), "{reply}");
    (
        reply.get_i32("code").expect("code"),
        reply.get_str("codeName").expect("codeName").to_string(),
        reply.get_str("errmsg").expect("errmsg").to_string(),
    )
}

#[tokio::test]
async fn commands_need_authentication_but_the_handshake_does_not() {
    let emu = start_auth().await;
    let mut c = RawClient::connect(emu.addresses()[0]).await;
    for allowed in [
        doc! { "hello": 1, "$db": "admin" },
        doc! { "isMaster": 1, "$db": "admin" },
        doc! { "ping": 1, "$db": "admin" },
        doc! { "buildInfo": 1, "$db": "admin" },
        doc! { "connectionStatus": 1, "$db": "admin" },
        // A test command mongod lets anyone run.
        doc! { "configureFailPoint": "failCommand", "mode": "off", "$db": "admin" },
    ] {
        let r = c.command(&allowed).await.expect("reply");
        assert_eq!(r.get_f64("ok"), Ok(1.0), "{allowed} -> {r}");
    }
    let r = c
        .command(&doc! { "find": "c", "filter": {}, "$db": "app" })
        .await
        .expect("reply");
    assert_eq!(
        error_of(&r),
        (
            13,
            "Unauthorized".into(),
            "Command find requires authentication".into()
        )
    );
    for (cmd, name) in [
        (
            doc! { "insert": "c", "documents": [{}], "$db": "app" },
            "insert",
        ),
        (doc! { "serverStatus": 1, "$db": "admin" }, "serverStatus"),
        (doc! { "usersInfo": 1, "$db": "admin" }, "usersInfo"),
        (doc! { "endSessions": [], "$db": "admin" }, "endSessions"),
        (doc! { "whatsmyuri": 1, "$db": "admin" }, "whatsmyuri"),
        (doc! { "logout": 1, "$db": "admin" }, "logout"),
    ] {
        let r = c.command(&cmd).await.expect("reply");
        assert_eq!(
            error_of(&r).2,
            format!("Command {name} requires authentication")
        );
    }
    // failCommand is evaluated before the authorization check, as in mongod: the fail point's
    // error wins over 13.
    let r = c
        .command(&doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": { "failCommands": ["find"], "errorCode": 91 },
            "$db": "admin",
        })
        .await
        .expect("reply");
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    let r = find_in_app(&mut c).await;
    assert_eq!(error_of(&r).0, 91, "{r}");
    let r = find_in_app(&mut c).await;
    assert_eq!(error_of(&r).0, 13, "{r}");
    // An unknown command is still 59, as from mongod.
    let r = c
        .command(&doc! { "noSuchThing": 1, "$db": "admin" })
        .await
        .expect("reply");
    assert_eq!(error_of(&r).0, 59);
    emu.shutdown().await;
}

#[tokio::test]
async fn a_full_conversation_with_and_without_the_empty_exchange() {
    let emu = start_auth().await;
    for mech in [Mech::Sha256, Mech::Sha1] {
        // Without skipEmptyExchange: three round trips, the last one empty.
        let mut c = RawClient::connect(emu.addresses()[0]).await;
        let client = ScramClient::new(mech, USER, PASSWORD);
        let first = c.command(&client.sasl_start(false)).await.expect("reply");
        assert_eq!(first.get_f64("ok"), Ok(1.0), "{first}");
        assert_eq!(first.get_i32("conversationId"), Ok(1));
        assert_eq!(first.get_bool("done"), Ok(false));
        let server_first = payload_text(&first);
        let iterations = match mech {
            Mech::Sha1 => "i=10000",
            Mech::Sha256 => "i=15000",
        };
        assert!(server_first.ends_with(iterations), "{server_first}");
        let (final_message, server_signature) = client.final_message(&server_first);
        let second = c
            .command(&sasl_continue(final_message))
            .await
            .expect("reply");
        assert_eq!(second.get_f64("ok"), Ok(1.0), "{second}");
        assert_eq!(second.get_bool("done"), Ok(false), "{second}");
        assert_eq!(payload_text(&second), server_signature);
        // Not authenticated until the exchange is done.
        let r = find_in_app(&mut c).await;
        assert_eq!(error_of(&r).0, 13, "{r}");
        // The find above did not end the conversation.
        let third = c.command(&sasl_continue(Vec::new())).await.expect("reply");
        assert_eq!(third.get_bool("done"), Ok(true), "{third}");
        assert_eq!(payload_text(&third), "");
        let r = find_in_app(&mut c).await;
        assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");

        // With skipEmptyExchange: done with the server's signature.
        let mut c = RawClient::connect(emu.addresses()[0]).await;
        let replies = authenticate(&mut c, mech, PASSWORD).await;
        assert_eq!(replies[1].get_bool("done"), Ok(true), "{}", replies[1]);
        let r = find_in_app(&mut c).await;
        assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
        let status = c
            .command(&doc! { "connectionStatus": 1, "$db": "admin" })
            .await
            .unwrap();
        assert_eq!(
            status
                .get_document("authInfo")
                .unwrap()
                .get_array("authenticatedUsers")
                .unwrap(),
            &vec![Bson::Document(doc! { "user": USER, "db": "admin" })]
        );
        // logout drops the rights.
        c.command(&doc! { "logout": 1, "$db": "admin" })
            .await
            .unwrap();
        let r = find_in_app(&mut c).await;
        assert_eq!(error_of(&r).0, 13, "{r}");
    }
    emu.shutdown().await;
}

#[tokio::test]
async fn failures_answer_as_mongod() {
    let emu = start_auth().await;
    let mut c = RawClient::connect(emu.addresses()[0]).await;
    let failed = (
        18,
        "AuthenticationFailed".to_string(),
        "Authentication failed.".to_string(),
    );
    // A wrong password: the proof does not check out.
    let replies = authenticate(&mut c, Mech::Sha256, "wrong").await;
    assert_eq!(error_of(&replies[1]), failed);
    // The failed conversation is over.
    let r = c.command(&sasl_continue(b"x".to_vec())).await.unwrap();
    assert_eq!(
        error_of(&r),
        (
            17,
            "ProtocolError".into(),
            "No SASL session state found".into()
        )
    );
    // An unknown user fails at once, with the same error.
    let stranger = ScramClient::new(Mech::Sha256, "mallory", PASSWORD);
    let r = c.command(&stranger.sasl_start(true)).await.unwrap();
    assert_eq!(error_of(&r), failed);
    // A user on another database is another user.
    let mut elsewhere = ScramClient::new(Mech::Sha256, USER, PASSWORD).sasl_start(true);
    elsewhere.insert("$db", "app");
    let r = c.command(&elsewhere).await.unwrap();
    assert_eq!(error_of(&r), failed);
    // A mechanism mongod does not offer.
    let r = c
        .command(&doc! { "saslStart": 1, "mechanism": "PLAIN", "payload": bin(b"x".to_vec()), "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(error_of(&r).0, 334, "{r}");
    // A wrong conversation id.
    let client = ScramClient::new(Mech::Sha1, USER, PASSWORD);
    let first = c.command(&client.sasl_start(true)).await.unwrap();
    let (final_message, _) = client.final_message(&payload_text(&first));
    let mut wrong_id = sasl_continue(final_message);
    wrong_id.insert("conversationId", 7);
    let r = c.command(&wrong_id).await.unwrap();
    assert_eq!(error_of(&r).0, 17, "{r}");
    // Still not authenticated after all that.
    let r = find_in_app(&mut c).await;
    assert_eq!(error_of(&r).0, 13, "{r}");
    emu.shutdown().await;
}

#[tokio::test]
async fn hello_negotiates_mechanisms_and_authenticates_speculatively() {
    let emu = start_auth().await;
    let mut c = RawClient::connect(emu.addresses()[0]).await;
    let client = ScramClient::new(Mech::Sha256, USER, PASSWORD);
    let mut spec = client.sasl_start(true);
    spec.remove("$db");
    spec.insert("db", "admin");
    let hello = c
        .command(&doc! {
            "hello": 1,
            "saslSupportedMechs": format!("admin.{USER}"),
            "speculativeAuthenticate": spec,
            "$db": "admin",
        })
        .await
        .unwrap();
    assert_eq!(
        hello.get_array("saslSupportedMechs").unwrap(),
        &vec![Bson::from("SCRAM-SHA-1"), Bson::from("SCRAM-SHA-256")]
    );
    let speculative = hello
        .get_document("speculativeAuthenticate")
        .expect("answered");
    assert_eq!(speculative.get_i32("conversationId"), Ok(1));
    assert_eq!(speculative.get_bool("done"), Ok(false));
    let (final_message, signature) = client.final_message(&payload_text(speculative));
    let r = c.command(&sasl_continue(final_message)).await.unwrap();
    assert_eq!(r.get_bool("done"), Ok(true), "{r}");
    assert_eq!(payload_text(&r), signature);
    let r = find_in_app(&mut c).await;
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");

    // An unknown user: no saslSupportedMechs, no speculativeAuthenticate, no error.
    let mut c = RawClient::connect(emu.addresses()[0]).await;
    let mut spec = ScramClient::new(Mech::Sha256, "mallory", "x").sasl_start(true);
    spec.remove("$db");
    let hello = c
        .command(&doc! {
            "hello": 1,
            "saslSupportedMechs": "admin.mallory",
            "speculativeAuthenticate": spec,
            "$db": "admin",
        })
        .await
        .unwrap();
    assert_eq!(hello.get_f64("ok"), Ok(1.0), "{hello}");
    assert!(!hello.contains_key("saslSupportedMechs"), "{hello}");
    assert!(!hello.contains_key("speculativeAuthenticate"), "{hello}");

    // serverStatus counts one speculative and one plain conversation... of which the first
    // succeeded; the connection above is unauthenticated, so ask on the first one.
    let mut c = RawClient::connect(emu.addresses()[0]).await;
    authenticate(&mut c, Mech::Sha256, PASSWORD).await;
    let status = c
        .command(&doc! { "serverStatus": 1, "$db": "admin" })
        .await
        .unwrap();
    let sha256 = status
        .get_document("security")
        .and_then(|s| s.get_document("authentication"))
        .and_then(|a| a.get_document("mechanisms"))
        .and_then(|m| m.get_document("SCRAM-SHA-256"))
        .expect("counters");
    assert_eq!(
        sha256,
        &doc! {
            "authenticate": { "received": 3i64, "successful": 2i64 },
            "speculativeAuthenticate": { "received": 2i64, "successful": 1i64 },
        }
    );
    emu.shutdown().await;
}

#[tokio::test]
async fn a_dropped_user_loses_its_rights_and_users_are_stored_as_credentials() {
    let emu = start_auth().await;
    let mut admin = RawClient::connect(emu.addresses()[0]).await;
    authenticate(&mut admin, Mech::Sha256, PASSWORD).await;
    let r = admin
        .command(&doc! { "createUser": "bob", "pwd": "builder", "roles": [], "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    let info = admin
        .command(&doc! { "usersInfo": "bob", "showCredentials": true, "$db": "admin" })
        .await
        .unwrap();
    let text = info.to_string();
    assert!(!text.contains("builder"), "{text}");
    for field in ["iterationCount", "salt", "storedKey", "serverKey"] {
        assert!(text.contains(field), "{field} in {text}");
    }
    let mut bob = RawClient::connect(emu.addresses()[0]).await;
    let client = ScramClient::new(Mech::Sha1, "bob", "builder");
    let first = bob.command(&client.sasl_start(true)).await.unwrap();
    let (final_message, _) = client.final_message(&payload_text(&first));
    let r = bob.command(&sasl_continue(final_message)).await.unwrap();
    assert_eq!(r.get_bool("done"), Ok(true), "{r}");
    let r = find_in_app(&mut bob).await;
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    admin
        .command(&doc! { "dropUser": "bob", "$db": "admin" })
        .await
        .unwrap();
    let r = find_in_app(&mut bob).await;
    assert_eq!(error_of(&r).0, 13, "{r}");
    // Bad arguments.
    for (cmd, code) in [
        (
            doc! { "createUser": "x", "pwd": "", "roles": [], "$db": "admin" },
            2,
        ),
        (
            doc! { "createUser": "x", "pwd": "p", "$db": "admin" },
            40414,
        ),
        (
            doc! { "createUser": "x", "pwd": "p", "roles": ["nope"], "$db": "admin" },
            31,
        ),
        (
            doc! { "createUser": "x", "pwd": "p", "roles": [], "mechanisms": ["MD5"], "$db": "admin" },
            2,
        ),
        (
            doc! { "updateUser": "nobody", "pwd": "p", "$db": "admin" },
            11,
        ),
        (doc! { "updateUser": USER, "$db": "admin" }, 2),
        (doc! { "dropUser": "nobody", "$db": "admin" }, 11),
    ] {
        let r = admin.command(&cmd).await.unwrap();
        assert_eq!(error_of(&r).0, code, "{cmd} -> {r}");
    }
    emu.shutdown().await;
}

#[tokio::test]
async fn without_users_nothing_requires_authentication_but_scram_works() {
    let emu = start_with_users(Topology::Standalone, Vec::new()).await;
    let mut c = RawClient::connect(emu.addresses()[0]).await;
    let r = find_in_app(&mut c).await;
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    let r = c
        .command(&doc! { "createUser": USER, "pwd": PASSWORD, "roles": ["root"], "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    let replies = authenticate(&mut c, Mech::Sha256, PASSWORD).await;
    assert_eq!(replies[1].get_bool("done"), Ok(true), "{}", replies[1]);
    emu.shutdown().await;
}

/// Every conversation costs `costs.authMs` of core time: a storm of new authenticated
/// connections occupies the cores like any other work.
#[tokio::test]
async fn an_authentication_storm_loads_the_overload_model() {
    let emu = start_auth().await;
    let model = emu.overload();
    let mut cfg = model.config().as_ref().clone();
    cfg.enabled = true;
    cfg.cores = 1;
    cfg.costs.auth_ms = 20.0;
    model.reconfigure(cfg).expect("valid model");
    let before = model.snapshot().counters.busy_core_ms;
    let started = std::time::Instant::now();
    let storm: Vec<_> = (0..5)
        .map(|_| {
            let addr = emu.addresses()[0];
            tokio::spawn(async move {
                let mut c = RawClient::connect(addr).await;
                let replies = authenticate(&mut c, Mech::Sha256, PASSWORD).await;
                replies.last().and_then(|r| r.get_bool("done").ok())
            })
        })
        .collect();
    for s in storm {
        assert_eq!(s.await.unwrap(), Some(true));
    }
    let busy = model.snapshot().counters.busy_core_ms - before;
    // Five conversations of 20 ms on one core: 100 ms of core time, one after another.
    assert!(busy >= 95.0, "busy {busy} ms");
    assert!(started.elapsed() >= Duration::from_millis(95));
    emu.shutdown().await;
}
