//! `currentOp` and the `$currentOp` aggregation stage: the operations in progress.
//!
//! mongod lists every operation in progress with its connection, client metadata and command
//! (<https://www.mongodb.com/docs/manual/reference/command/currentOp/>; the fields below are
//! those of its "Output Fields" section that clients read). The emulator runs one command at a
//! time under its state lock, so the only operation in progress while `currentOp` runs is
//! `currentOp` itself (or the `aggregate` holding `$currentOp`): that is what it lists, with the
//! requesting connection's handshake metadata. The command's other fields filter the list as a
//! query does, as mongod's; `$all` and `$ownOps` change nothing here (idle connections and
//! system operations are not modelled).

use bson::{doc, Bson, Document};

use super::commands::ConnCtx;
use super::error::{codes, CommandError};

/// Fields of the `currentOp` command that are not part of its filter.
fn is_option(key: &str) -> bool {
    key == "currentOp"
        || key.starts_with('$')
        || matches!(
            key,
            "lsid" | "txnNumber" | "autocommit" | "startTransaction" | "comment" | "maxTimeMS"
        )
}

/// The operation in progress: the command `body` on `db`, from `conn`, on the member at `host`.
pub(crate) fn own_operation(host: &str, conn: &ConnCtx, db: &str, body: &Document) -> Document {
    let mut command = body.clone();
    command.insert("$db", db);
    let mut op = doc! {
        "type": "op",
        "host": host,
        "desc": format!("conn{}", conn.connection_id),
        "connectionId": conn.connection_id,
        "client": conn.peer.to_string(),
        "active": true,
        "currentOpTime": bson::DateTime::now(),
        "opid": conn.connection_id,
        "secs_running": 0i64,
        "microsecs_running": 0i64,
        "op": "command",
        "ns": format!("{db}.$cmd"),
        "command": command,
        "numYields": 0i32,
        "waitingForLock": false,
    };
    if let Some(metadata) = &conn.client_metadata {
        op.insert("clientMetadata", metadata.clone());
    }
    if let Some(app) = &conn.app_name {
        op.insert("appName", app.clone());
    }
    op
}

/// `{currentOp: 1, <filter fields>}` on the admin database.
pub(crate) fn command(
    host: &str,
    conn: &ConnCtx,
    db: &str,
    body: &Document,
) -> Result<Document, CommandError> {
    if db != "admin" {
        return Err(CommandError::new(
            codes::UNAUTHORIZED,
            "currentOp may only be run against the admin database.",
        ));
    }
    let filter: Document = body
        .iter()
        .filter(|(k, _)| !is_option(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let op = own_operation(host, conn, db, body);
    let mut inprog = Vec::new();
    if crate::engine::matches(&filter, &op).map_err(CommandError::from)? {
        inprog.push(Bson::Document(op));
    }
    Ok(doc! { "inprog": inprog, "ok": 1.0 })
}

/// The input of a pipeline starting with `$currentOp`, or mongod's errors for a misplaced one:
/// it must run on `admin` with `{aggregate: 1}` (ErrorCodes::InvalidNamespace, 73).
pub(crate) fn stage_input(
    host: &str,
    conn: &ConnCtx,
    db: &str,
    body: &Document,
) -> Result<Option<Vec<Document>>, CommandError> {
    let first = body
        .get_array("pipeline")
        .ok()
        .and_then(|p| p.first())
        .and_then(Bson::as_document);
    if !first.is_some_and(|d| d.contains_key("$currentOp")) {
        return Ok(None);
    }
    let on_database = !matches!(body.get("aggregate"), Some(Bson::String(_)));
    if db != "admin" || !on_database {
        return Err(CommandError::new(
            73,
            "$currentOp must be run against the 'admin' database with {aggregate: 1}",
        ));
    }
    Ok(Some(vec![own_operation(host, conn, db, body)]))
}
