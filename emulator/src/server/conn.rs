//! One task per connection: read a request, handle it, write the reply, repeat.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;

use super::commands::{self, ConnCtx, Outcome};
use bson::Bson;

use super::mangle::{self, After, RequestFacts};
use super::send;
use super::{hello, Member, Shared};
use crate::wire::{self, WireError};

/// Whether an exhaust getMore's reply is followed by another: its cursor is still open and the
/// batch was not empty.
fn more_batches_follow(reply: &bson::Document) -> bool {
    let Ok(cursor) = reply.get_document("cursor") else {
        return false;
    };
    let open = matches!(cursor.get("id"), Some(Bson::Int64(id)) if *id != 0);
    let non_empty = cursor
        .get_array("nextBatch")
        .is_ok_and(|batch| !batch.is_empty());
    open && non_empty
}

/// Serves one client connection until it closes, sends a bad frame, or the emulator stops.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    member: Arc<Member>,
    stream: TcpStream,
    peer: SocketAddr,
    serial: u64,
) {
    let connection_id = shared.next_connection_id.fetch_add(1, Ordering::Relaxed);
    shared
        .counters
        .connections_current
        .fetch_add(1, Ordering::Relaxed);
    shared
        .counters
        .connections_total
        .fetch_add(1, Ordering::Relaxed);
    let _ = stream.set_nodelay(true);
    tracing::debug!(member = member.index, conn = connection_id, %peer, "connection accepted");
    // The overload model's price of a new connection (`costs.connectionMs`: mongod's thread,
    // TCP and TLS set-up), on this member's cores before the first request is read, so the
    // handshake waits for it as in mongod. Zero by default: no wait at all.
    let mut shutdown = shared.shutdown.clone();
    tokio::select! {
        _ = member.model.connection_opened() => {}
        _ = shutdown.changed() => {}
    }
    let mut ctx = ConnCtx {
        serial,
        connection_id,
        app_name: None,
        client_metadata: None,
        handshaken: false,
        peer,
        auth: Default::default(),
    };
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let mut next_reply_id: i32 = 1;
    let reason: String = loop {
        let msg = tokio::select! {
            m = wire::read_request(&mut rd) => m,
            _ = shutdown.changed() => break "emulator shutting down".into(),
        };
        let msg = match msg {
            Ok(Some(wire::Request::Msg(m))) => m,
            Ok(Some(legacy)) => {
                let answered = super::legacy::serve(
                    &shared,
                    &member,
                    &mut ctx,
                    legacy,
                    &mut rd,
                    &mut wr,
                    &mut next_reply_id,
                )
                .await;
                match answered {
                    Ok(()) => continue,
                    Err(reason) => break reason,
                }
            }
            Ok(None) => break "client closed the connection".into(),
            Err(WireError::Io(e)) => break format!("i/o error: {e}"),
            Err(e) => {
                tracing::warn!(member = member.index, conn = connection_id, %peer, error = %e, "closing connection: bad frame");
                break format!("bad frame: {e}");
            }
        };
        let request_id = msg.header.request_id;
        let more_to_come = msg.more_to_come();
        // An awaitable hello with `exhaustAllowed` is answered with `moreToCome` replies, one
        // per `maxAwaitTimeMS`, until the client closes the connection or a reply is an error.
        let exhaust =
            shared.config.exhaust_hello && msg.exhaust_allowed() && hello::is_awaitable(&msg.body);
        // A getMore with `exhaustAllowed` is answered the same way, one `moreToCome` reply per
        // batch, until the cursor is exhausted, a reply is an error (an overload rejection
        // included), a batch comes back empty (a change stream with nothing new: the client asks
        // again rather than the server spinning), or the client stops reading.
        let exhaust_get_more =
            msg.exhaust_allowed() && msg.body.keys().next().map(String::as_str) == Some("getMore");
        // Read before the request is consumed: whether lab-only reply mangling applies.
        let mangle_facts = RequestFacts::of(&msg.body);
        let mut response_to = request_id;
        let mut pending = Some(msg);
        let mut stop: Option<String> = None;
        while let Some(msg) = pending.take() {
            let mut repeat = if exhaust || exhaust_get_more {
                Some(msg.clone())
            } else {
                None
            };
            let arrival = tokio::time::Instant::now();
            // Completes if the client goes away while its request is being handled. The request
            // is fully read, so the reader is idle; `fill_buf` is cancel-safe and keeps any
            // pipelined bytes for the next read.
            let disconnected = async {
                match rd.fill_buf().await {
                    Ok([]) | Err(_) => {}
                    Ok(_) => std::future::pending::<()>().await,
                }
            };
            match commands::handle(&shared, &member, &mut ctx, msg, arrival, disconnected).await {
                Outcome::Close => {
                    stop = Some(
                        "closed while handling a request (closeConnection or client gone)".into(),
                    );
                }
                Outcome::Reply(_) if more_to_come => {}
                Outcome::Reply(reply) => {
                    // Lab-only: a reply damaged on the seeded schedule of `labMangleReplies`
                    // (never a streamed one). Document damage here, frame damage once encoded.
                    let mut mangle_plan = shared.mangler.plan(
                        &mangle_facts,
                        ctx.app_name.as_deref(),
                        &reply,
                        exhaust || exhaust_get_more,
                    );
                    let reply = match mangle_plan.as_mut() {
                        Some(plan) => plan.apply_to_document(reply),
                        None => reply,
                    };
                    // The next exhaust reply waits on the topologyVersion just sent; without a
                    // wait (e.g. maxAwaitTimeMS 0) streaming would spin, so it stops instead.
                    if let (Some(next), Ok(tv)) =
                        (repeat.as_mut(), reply.get_document("topologyVersion"))
                    {
                        next.body.insert("topologyVersion", tv.clone());
                    }
                    let ok = matches!(reply.get("ok"), Some(Bson::Double(ok)) if *ok == 1.0);
                    let stream = ok
                        && ((exhaust
                            && repeat.as_ref().is_some_and(|m| {
                                hello::await_time(&shared, &member, &m.body).is_some()
                            }))
                            || (exhaust_get_more && more_batches_follow(&reply)));
                    let flags = if stream { wire::FLAG_MORE_TO_COME } else { 0 };
                    let bytes = match wire::encode_op_msg(next_reply_id, response_to, flags, &reply)
                    {
                        Ok(b) => b,
                        Err(e) => {
                            tracing::error!(conn = connection_id, error = %e, "could not encode reply");
                            stop = Some(format!("reply encoding failed: {e}"));
                            break;
                        }
                    };
                    let (bytes, after) = match mangle_plan.as_mut() {
                        Some(plan) => plan.apply_to_frame(bytes),
                        None => (bytes, After::Continue),
                    };
                    if stream {
                        response_to = next_reply_id;
                        pending = repeat;
                    }
                    next_reply_id = next_reply_id.wrapping_add(1);
                    if let Err(reason) = send::write_reply(&mut wr, &bytes).await {
                        stop = Some(reason);
                    }
                    match (after, mangle_plan.as_ref()) {
                        (After::Continue, _) | (_, None) => {}
                        (After::Close, Some(plan)) => {
                            stop.get_or_insert(format!(
                                "closed after a mangled frame ({})",
                                plan.kind().name()
                            ));
                        }
                        (After::Stall, Some(_)) => {
                            if stop.is_none() {
                                mangle::stall(&mut rd, &mut shutdown).await;
                                stop = Some("closed after a stalled frame".into());
                            }
                        }
                    }
                }
            }
            if stop.is_some() {
                break;
            }
        }
        if let Some(reason) = stop {
            break reason;
        }
    };
    tracing::debug!(member = member.index, conn = connection_id, %peer, %reason, "connection closed");
    shared.state().cursors.close_connection(serial);
    shared
        .counters
        .connections_current
        .fetch_sub(1, Ordering::Relaxed);
}
