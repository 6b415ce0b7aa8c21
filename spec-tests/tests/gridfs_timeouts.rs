//! GridFS under `timeoutMS` (stage 4), against the emulator: one deadline over all of a bucket
//! call's commands. (The indexes a small upload must ensure are defect B14, in `defects.rs`.)

mod common;

use std::time::Instant;

use common::{block_commands, client_with, ms, Server};
use mongodb::{bson::doc, error::ErrorKind, options::GridFsBucketOptions, Client};

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
