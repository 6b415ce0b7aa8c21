//! What moves between the simulation's parts: an attempt as it reaches a server ([`Request`],
//! named by its [`Tag`]), a server's answer ([`Reply`]), and the [`Event`]s the loop orders in
//! virtual time. The engine (clients, routers) and the servers both push and handle them, so
//! they sit below both.

use arrivals::OpKind;

use crate::clock::Nanos;
use crate::queue::Handle;

/// Which attempt of which operation a request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag {
    pub op: Handle,
    pub attempt: u32,
}

/// One attempt as it reaches the server.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub tag: Tag,
    pub kind: OpKind,
    /// Its document key, which a router targets by (a server ignores it).
    pub key: i64,
    /// `maxTimeMS`, counted from arrival at the server.
    pub max_time: Option<Nanos>,
    /// When the application stops waiting (the lab's `labDeadlineMs` oracle): work completed
    /// later is wasted.
    pub client_deadline: Nanos,
    /// A uniform draw in `[0, 1)` keyed by the request and attempt, not by the run's random
    /// streams, so that every variant meets the same random rejections: the attempt is
    /// rejected at random when it is below [`crate::server::ServerConfig::random_rejection`].
    pub rejection_draw: f64,
}

/// The server's answer to one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The command succeeded.
    Ok,
    /// 462 with `SystemOverloadedError` and `RetryableError`.
    Overloaded,
    /// 50 `MaxTimeMSExpired`.
    Expired,
    /// An overload error with `SystemOverloadedError` alone: what a router answers when it
    /// gives up on a shard's overload error (mongos's label rule). No server model answers it.
    RouterOverloaded,
}

/// The events of the loop.
#[derive(Debug)]
pub enum Event {
    /// The next arrival of the open-loop schedule.
    Arrival,
    /// The schedule ended: the server's counters are read for the utilisation.
    ScheduleEnd,
    /// The application's deadline of an operation.
    AppDeadline { op: Handle },
    /// An operation waiting for a concurrency slot looks again (`wait` names the wait).
    SlotPoll { op: Handle, wait: u32 },
    /// An operation's backoff ended: send the retry.
    RetryDue { op: Handle, wait: u32 },
    /// An attempt reaches the server.
    ServerArrive(Request),
    /// A slice of a job of server `server` ended.
    SliceEnd { server: u32, job: Handle },
    /// A ticket wait reached its request's deadline.
    TicketTimeout { server: u32, job: Handle, wait: u32 },
    /// A ticket waiter woken by a release comes for the ticket.
    TicketWake { server: u32, job: Handle, wait: u32 },
    /// A server's reply reaches the client, or on a cluster its router.
    Reply { server: u32, tag: Tag, reply: Reply },
    /// A router's backoff before retrying `shard` for `call` ended; `expire`: the call's
    /// `maxTimeMS` ended it first.
    RouterRetry {
        call: Handle,
        shard: u32,
        expire: bool,
    },
    /// A router's answer reaches the client.
    RoutedReply { tag: Tag, reply: Reply },
}
