//! The `labd` binary: prints its connection string, serves, stops cleanly on SIGINT.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bson::doc;

/// Starts `labd` with `args` and reads the connection string it prints first: returns the
/// process, that string, and the first member's `host:port`.
fn start_labd(args: &[&str]) -> (Child, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_labd"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("labd starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let uri = line.trim().to_string();
    let first = uri
        .trim_start_matches("mongodb://")
        .split(['/', ','])
        .next()
        .unwrap()
        .to_string();
    (child, uri, first)
}

#[tokio::test]
async fn labd_serves_and_stops_on_sigint() {
    let (mut child, uri, first) =
        start_labd(&["--topology", "replicaset", "--members", "2", "--port", "0"]);
    assert!(
        uri.starts_with("mongodb://127.0.0.1:") && uri.ends_with("?replicaSet=rs0"),
        "{uri}"
    );
    let mut raw = common::RawClient::connect(first.parse().unwrap()).await;
    let r = raw
        .command(&doc! { "hello": 1, "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(r.get_str("setName"), Ok("rs0"));
    assert_eq!(r.get_array("hosts").unwrap().len(), 2);

    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status:?}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "labd did not stop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn labd_configures_each_members_model_from_json() {
    let (mut child, _, first) = start_labd(&[
        "--topology",
        "sharded",
        "--members",
        "2",
        "--port",
        "0",
        "--random-reject-share",
        "0.05",
        "--model-json",
        r#"{"enabled": true, "costs": {"rejectionMs": 0.25}}"#,
        "--member-model-json",
        r#"1={"cores": 3}"#,
    ]);
    let mut raw = common::RawClient::connect(first.parse().unwrap()).await;
    let r = raw
        .command(&doc! { "getParameter": 1, "labOverloadMembers": 1, "$db": "admin" })
        .await
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let members = r.get_document("labOverloadMembers").unwrap();
    let cores: Vec<i64> = ["0", "1"]
        .iter()
        .map(|i| members.get_document(i).unwrap().get_i64("cores").unwrap())
        .collect();
    assert_eq!(cores, [2, 3], "{r}");
    for i in ["0", "1"] {
        let m = members.get_document(i).unwrap();
        assert_eq!(m.get_bool("enabled"), Ok(true), "{m}");
        assert_eq!(m.get_f64("randomRejectShare"), Ok(0.05), "{m}");
        let costs = m.get_document("costs").unwrap();
        assert_eq!(costs.get_f64("rejectionMs"), Ok(0.25), "{m}");
    }
}

#[tokio::test]
async fn labd_starts_shards_behind_the_routers_with_their_own_models() {
    let (mut child, _, first) = start_labd(&[
        "--topology",
        "sharded",
        "--members",
        "1",
        "--shards",
        "3",
        "--port",
        "0",
        "--overload",
        "--shard-model-json",
        r#"2={"cores": 5}"#,
    ]);
    let mut raw = common::RawClient::connect(first.parse().unwrap()).await;
    let shards = raw
        .command(&doc! { "listShards": 1, "$db": "admin" })
        .await
        .unwrap();
    let models = raw
        .command(&doc! { "getParameter": 1, "labOverloadShards": 1, "labOverloadMembers": 1, "$db": "admin" })
        .await
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(shards.get_array("shards").map(Vec::len), Ok(3), "{shards}");
    let per_shard = models.get_document("labOverloadShards").unwrap();
    let cores: Vec<i64> = ["0", "1", "2"]
        .iter()
        .map(|i| per_shard.get_document(i).unwrap().get_i64("cores").unwrap())
        .collect();
    assert_eq!(cores, [2, 2, 5], "{models}");
    // With several shards, --overload applies to the shards; the router's model stays off.
    for i in ["0", "1", "2"] {
        assert_eq!(
            per_shard.get_document(i).unwrap().get_bool("enabled"),
            Ok(true)
        );
    }
    let router = models.get_document("labOverloadMembers").unwrap();
    assert_eq!(
        router.get_document("0").unwrap().get_bool("enabled"),
        Ok(false)
    );
}

#[test]
fn labd_refuses_bad_model_settings() {
    for args in [
        vec!["--random-reject-share", "1.5"],
        vec!["--model-json", "{not json"],
        vec!["--model-json", r#"{"cores": 0}"#],
        vec!["--member-model-json", r#"x={"cores": 1}"#],
        vec!["--member-model-json", r#"{"cores": 1}"#],
        vec![
            "--topology",
            "sharded",
            "--members",
            "2",
            "--member-model-json",
            r#"5={}"#,
        ],
        vec![
            "--topology",
            "sharded",
            "--shards",
            "2",
            "--shard-model-json",
            r#"2={}"#,
        ],
        vec!["--shard-model-json", r#"0={}"#],
        vec![
            "--topology",
            "sharded",
            "--shard-model-json",
            r#"0={"cores": 0}"#,
        ],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_labd"))
            .args(["--port", "0"])
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .expect("labd runs");
        assert!(!out.status.success(), "{args:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("labd:"), "{args:?}: {err}");
    }
}

#[tokio::test]
async fn labd_users_turn_authentication_on() {
    let (mut child, _, first) =
        start_labd(&["--port", "0", "--user", "alice:pw", "--user", "app.bob:pw2"]);
    let mut raw = common::RawClient::connect(first.parse().unwrap()).await;
    let find = raw
        .command(&doc! { "find": "c", "$db": "app" })
        .await
        .unwrap();
    let alice = raw
        .command(&doc! { "hello": 1, "saslSupportedMechs": "admin.alice", "$db": "admin" })
        .await
        .unwrap();
    let bob = raw
        .command(&doc! { "hello": 1, "saslSupportedMechs": "app.bob", "$db": "admin" })
        .await
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(find.get_i32("code"), Ok(13), "{find}");
    for reply in [alice, bob] {
        assert_eq!(
            reply.get_array("saslSupportedMechs").map(Vec::len),
            Ok(2),
            "{reply}"
        );
    }
}

#[test]
fn labd_refuses_malformed_users() {
    for user in ["alice", "alice:", ":pw", ".alice:pw"] {
        let out = Command::new(env!("CARGO_BIN_EXE_labd"))
            .args(["--port", "0", "--user", user])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .expect("labd runs");
        assert!(!out.status.success(), "{user:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--user"), "{user:?}: {err}");
    }
}
