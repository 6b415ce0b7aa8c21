//! The legacy opcodes, answered as mongod answers them since it dropped them (5.1/6.0).
//!
//! * OP_QUERY of `hello`/`isMaster`/`ismaster` on `<db>.$cmd`: served like the OP_MSG hello and
//!   answered with an OP_REPLY. Drivers without `serverApi` or `loadBalanced` (the Node.js driver,
//!   mongosh) open every connection this way, then switch to OP_MSG.
//! * Any other OP_QUERY command: an OP_REPLY holding a command error, 352
//!   `UnsupportedOpQueryCommand`. An OP_QUERY on a collection (a legacy find): an OP_REPLY with
//!   the `QueryFailure` flag and a `$err` document, code 5739101. OP_GET_MORE gets the same.
//! * OP_INSERT, OP_UPDATE, OP_DELETE, OP_KILL_CURSORS expect no reply: mongod logs the refusal
//!   and sends nothing, and so does the emulator. The connection stays open in every case.

use std::sync::Arc;

use bson::{doc, Document};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::commands::{self, ConnCtx, Outcome};
use super::{hello, Member, Shared};
use crate::wire::{self, OpMsg, Request};

/// mongod's code for an OP_QUERY command other than the handshake's.
pub(crate) const UNSUPPORTED_OP_QUERY_COMMAND: i32 = 352;
/// mongod's code for a legacy find (OP_QUERY on a collection) or OP_GET_MORE.
pub(crate) const LEGACY_OPCODE_REMOVED: i32 = 5739101;
/// The sentence mongod appends to every legacy-opcode refusal.
const UPGRADE_HINT: &str = "The client driver may require an upgrade. For more details see https://dochub.mongodb.org/core/legacy-opcode-removal";

/// What the server sends back for one legacy request.
#[derive(Debug, PartialEq)]
pub(crate) enum LegacyAnswer {
    /// An OP_REPLY with these `responseFlags` and this one document.
    Reply { flags: u32, document: Document },
    /// Nothing (fire-and-forget opcodes).
    Nothing,
    /// Close the connection without a reply (a `closeConnection` fail point on the hello).
    Close,
}

/// The command error mongod returns for an OP_QUERY command other than the handshake's.
pub(crate) fn unsupported_command(name: &str) -> Document {
    doc! {
        "ok": 0.0,
        "errmsg": format!("Unsupported OP_QUERY command: {name}. {UPGRADE_HINT}"),
        "code": UNSUPPORTED_OP_QUERY_COMMAND,
        "codeName": "UnsupportedOpQueryCommand",
    }
}

/// The `$err` document of a refused legacy find or OP_GET_MORE.
fn removed_opcode(what: &str) -> Document {
    doc! {
        "$err": format!("{what} is no longer supported. {UPGRADE_HINT}"),
        "code": LEGACY_OPCODE_REMOVED,
        "ok": 0.0,
    }
}

/// Handles one legacy request and writes its answer. `Err` carries the reason to close the
/// connection (a write failure or a `closeConnection` fail point).
pub(crate) async fn serve(
    shared: &Arc<Shared>,
    member: &Arc<Member>,
    ctx: &mut ConnCtx,
    request: Request,
    rd: &mut BufReader<OwnedReadHalf>,
    wr: &mut OwnedWriteHalf,
    next_reply_id: &mut i32,
) -> Result<(), String> {
    let (request_id, answer) = match request {
        Request::Msg(_) => return Err("OP_MSG passed to the legacy handler".into()),
        Request::Query(query) => {
            let request_id = query.header.request_id;
            let answer = match query.command_database() {
                None => LegacyAnswer::Reply {
                    flags: wire::REPLY_QUERY_FAILURE,
                    document: removed_opcode("OP_QUERY"),
                },
                Some(db) => {
                    let mut command = query.command();
                    let name = command.keys().next().cloned().unwrap_or_default();
                    if hello::is_hello(&name) {
                        if !command.contains_key("$db") {
                            command.insert("$db", db);
                        }
                        // The handshake runs exactly as over OP_MSG (metadata, fail points,
                        // overload model); only the framing of the answer differs.
                        // OP_QUERY's flag bits mean other things than OP_MSG's (its bit 1 is
                        // `TailableCursor`, OP_MSG's is `moreToCome`): none carries over.
                        let msg = OpMsg {
                            header: query.header,
                            flags: 0,
                            body: command,
                        };
                        let arrival = tokio::time::Instant::now();
                        let disconnected = async {
                            match rd.fill_buf().await {
                                Ok([]) | Err(_) => {}
                                Ok(_) => std::future::pending::<()>().await,
                            }
                        };
                        match commands::handle(shared, member, ctx, msg, arrival, disconnected)
                            .await
                        {
                            Outcome::Reply(document) => LegacyAnswer::Reply { flags: 0, document },
                            Outcome::Close => LegacyAnswer::Close,
                        }
                    } else {
                        tracing::warn!(conn = ctx.connection_id, command = %name, "refusing OP_QUERY command");
                        LegacyAnswer::Reply {
                            flags: 0,
                            document: unsupported_command(&name),
                        }
                    }
                }
            };
            (request_id, answer)
        }
        Request::Legacy(header) if header.op_code == wire::OP_GET_MORE => (
            header.request_id,
            LegacyAnswer::Reply {
                flags: wire::REPLY_QUERY_FAILURE,
                document: removed_opcode("OP_GET_MORE"),
            },
        ),
        Request::Legacy(header) => {
            tracing::warn!(
                conn = ctx.connection_id,
                op_code = header.op_code,
                "ignoring a removed legacy opcode (no reply, as mongod)"
            );
            (header.request_id, LegacyAnswer::Nothing)
        }
    };
    match answer {
        LegacyAnswer::Nothing => Ok(()),
        LegacyAnswer::Close => {
            Err("closed while handling a legacy hello (closeConnection or client gone)".into())
        }
        LegacyAnswer::Reply { flags, document } => {
            let bytes = wire::encode_op_reply(*next_reply_id, request_id, flags, &[document])
                .map_err(|e| format!("reply encoding failed: {e}"))?;
            *next_reply_id = next_reply_id.wrapping_add(1);
            super::send::write_reply(wr, &bytes).await
        }
    }
}
