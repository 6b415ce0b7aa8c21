//! Helpers shared by the emulator's integration tests. They need no driver; the overload lab's
//! driver-based tests (`lab/tests`) include this file too, so each helper is written once.
#![allow(dead_code)]

use std::time::Duration;

use bson::Document;
use emulator::{Emulator, EmulatorConfig, Topology};

/// Starts an emulator with the given topology on ephemeral ports.
pub async fn start(topology: Topology) -> Emulator {
    Emulator::start(EmulatorConfig {
        topology,
        ..Default::default()
    })
    .await
    .expect("emulator starts")
}

/// A replica set of `n` members named rs0.
pub fn rs(n: usize) -> Topology {
    Topology::ReplicaSet {
        name: "rs0".into(),
        members: n,
    }
}

/// A bare wire-protocol client on a raw socket.
pub struct RawClient {
    pub stream: tokio::net::TcpStream,
    next_id: i32,
}

impl RawClient {
    pub async fn connect(addr: std::net::SocketAddr) -> RawClient {
        RawClient {
            stream: tokio::net::TcpStream::connect(addr).await.unwrap(),
            next_id: 1,
        }
    }

    /// Sends `body` as an OP_MSG and reads the reply (None if the server closed the socket).
    pub async fn command(&mut self, body: &Document) -> Option<Document> {
        use tokio::io::AsyncWriteExt;
        let bytes = emulator::wire::encode_op_msg(self.next_id, 0, 0, body).unwrap();
        self.next_id += 1;
        self.stream.write_all(&bytes).await.ok()?;
        self.read_reply().await
    }

    /// Reads one reply, or None at EOF / error.
    pub async fn read_reply(&mut self) -> Option<Document> {
        let msg = tokio::time::timeout(
            Duration::from_secs(5),
            emulator::wire::read_message(&mut self.stream),
        )
        .await
        .expect("reply within 5 s");
        msg.ok().flatten().map(|m| m.body)
    }

    /// Sends `query` as a legacy OP_QUERY on `namespace` and reads the OP_REPLY (None if the
    /// server closed the socket or sent something else).
    pub async fn legacy_query(
        &mut self,
        namespace: &str,
        query: &Document,
    ) -> Option<emulator::wire::OpReply> {
        use tokio::io::AsyncWriteExt;
        let bytes = emulator::wire::encode_op_query(self.next_id, namespace, -1, query).unwrap();
        self.next_id += 1;
        self.stream.write_all(&bytes).await.ok()?;
        let reply = tokio::time::timeout(
            Duration::from_secs(5),
            emulator::wire::read_reply(&mut self.stream),
        )
        .await
        .expect("reply within 5 s");
        reply.ok().flatten()
    }

    /// Writes raw bytes.
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        let _ = self.stream.write_all(bytes).await;
    }

    /// Whether the server closed the connection (EOF within 5 s).
    pub async fn closed_by_server(&mut self) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 64];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), self.stream.read(&mut buf)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }
}
