//! Helpers shared by the overload lab's driver-based tests of the emulator: recorded command
//! events and driver clients, plus the emulator's own driver-free helpers (`start`, `rs`,
//! `RawClient`), included from `emulator/tests/common` so that each is written once.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::Document;
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::ClientOptions;
use mongodb::Client;

#[path = "../../../emulator/tests/common/mod.rs"]
mod emulator_common;
// Not every test file uses the emulator's helpers.
#[allow(unused_imports)]
pub use emulator_common::*;

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
