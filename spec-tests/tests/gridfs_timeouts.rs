//! GridFS under `timeoutMS` (stage 4), against the emulator: one deadline over all of a bucket
//! call's commands. (The indexes a small upload must ensure are defect B14, in `defects.rs`.)

mod common;

use std::time::{Duration, Instant};

use common::{Server, Started};
use mongodb::{
    bson::doc,
    error::ErrorKind,
    event::{command::CommandEvent, EventHandler},
    options::{ClientOptions, GridFsBucketOptions},
    Client,
};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

async fn client_with(uri: &str, timeout: Option<Duration>) -> (Client, Started) {
    let mut options = ClientOptions::parse(uri).await.expect("valid uri");
    options.timeout = timeout;
    let started = Started::default();
    let sink = started.clone();
    options.command_event_handler = Some(EventHandler::callback(move |event: CommandEvent| {
        if let CommandEvent::Started(e) = event {
            sink.0.lock().unwrap().push(e.command);
        }
    }));
    (Client::with_options(options).expect("client"), started)
}

async fn block_commands(uri: &str, command: &str, times: i32, block_ms: i32) {
    let client = Client::with_uri_str(uri).await.expect("client");
    client
        .database("admin")
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": times },
            "data": { "failCommands": [command], "blockConnection": true, "blockTimeMS": block_ms },
        })
        .await
        .expect("configureFailPoint");
}

async fn fresh_database(uri: &str, name: &str) {
    let client = Client::with_uri_str(uri).await.expect("client");
    client.database(name).drop().await.expect("drop");
}

#[tokio::test]
async fn a_delete_shares_one_deadline_over_its_commands() {
    let server = Server::standalone();
    fresh_database(&server.uri, "g").await;
    // The file's delete and its chunks' each take 150 ms: within a 250 ms timeoutMS apiece, not
    // together.
    let (client, sent) = client_with(&server.uri, None).await;
    let bucket = client
        .database("g")
        .gridfs_bucket(GridFsBucketOptions::builder().timeout(ms(250)).build());
    block_commands(&server.uri, "delete", 2, 150).await;
    let started = Instant::now();
    let error = bucket
        .delete(doc! { "x": 1 }.into())
        .await
        .expect_err("the second delete meets the deadline");
    assert!(
        matches!(*error.kind, ErrorKind::Timeout { .. }),
        "{error:?}"
    );
    assert!(started.elapsed() < ms(290), "{:?}", started.elapsed());
    assert_eq!(sent.named("delete").len(), 2, "both commands were sent");

    // The call's own timeout replaces the bucket's.
    block_commands(&server.uri, "delete", 2, 150).await;
    let error = bucket
        .delete(doc! { "x": 1 }.into())
        .timeout(ms(2_000))
        .await
        .expect_err("no such file");
    assert!(
        matches!(*error.kind, ErrorKind::GridFs(_)),
        "only the missing file remains: {error:?}"
    );
}
