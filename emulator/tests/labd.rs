//! The `labd` binary: prints its connection string, serves, stops cleanly on SIGINT.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use bson::doc;

#[tokio::test]
async fn labd_serves_and_stops_on_sigint() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_labd"))
        .args(["--topology", "replicaset", "--members", "2", "--port", "0"])
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
    assert!(
        uri.starts_with("mongodb://127.0.0.1:") && uri.ends_with("?replicaSet=rs0"),
        "{uri}"
    );
    let first = uri
        .trim_start_matches("mongodb://")
        .split(['/', ','])
        .next()
        .unwrap()
        .to_string();
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
