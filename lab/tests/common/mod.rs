//! Helpers shared by the emulator's integration tests.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lab::{Emulator, EmulatorConfig, Topology};
use mongodb::bson::Document;
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::ClientOptions;
use mongodb::Client;

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

/// Recorded command events: (name, started/succeeded/failed, reply or failure).
#[derive(Clone, Default)]
pub struct Events(pub Arc<Mutex<Vec<CommandEvent>>>);

impl Events {
    pub fn started(&self, name: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|e| matches!(e, CommandEvent::Started(s) if s.command_name == name))
            .count()
    }

    pub fn started_commands(&self, name: &str) -> Vec<Document> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                CommandEvent::Started(s) if s.command_name == name => Some(s.command.clone()),
                _ => None,
            })
            .collect()
    }
}

/// A client for `uri` with short timeouts; `tweak` adjusts the options. Returns the command
/// events it observes.
pub async fn client_with(uri: &str, tweak: impl FnOnce(&mut ClientOptions)) -> (Client, Events) {
    let mut opts = ClientOptions::parse(uri).await.expect("uri parses");
    opts.server_selection_timeout = Some(Duration::from_secs(5));
    opts.connect_timeout = Some(Duration::from_secs(5));
    let events = Events::default();
    let sink = events.clone();
    opts.command_event_handler = Some(EventHandler::callback(move |ev: CommandEvent| {
        sink.0.lock().unwrap().push(ev);
    }));
    tweak(&mut opts);
    (Client::with_options(opts).expect("client builds"), events)
}

/// A client with default test options.
pub async fn client(uri: &str) -> (Client, Events) {
    client_with(uri, |_| {}).await
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
        let bytes = lab::wire::encode_op_msg(self.next_id, 0, 0, body).unwrap();
        self.next_id += 1;
        self.stream.write_all(&bytes).await.ok()?;
        self.read_reply().await
    }

    /// Reads one reply, or None at EOF / error.
    pub async fn read_reply(&mut self) -> Option<Document> {
        let msg = tokio::time::timeout(
            Duration::from_secs(5),
            lab::wire::read_message(&mut self.stream),
        )
        .await
        .expect("reply within 5 s");
        msg.ok().flatten().map(|m| m.body)
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
