//! `explain` (mongosh's `db.c.find().explain()`, the drivers' explain helpers).
//!
//! The emulator has no query planner: every read scans its collection. So the plan it reports
//! is the one mongod reports for a collection scan: a `COLLSCAN` stage carrying the filter, no
//! rejected plans. The reply has the fields of mongod's explain output
//! (<https://www.mongodb.com/docs/manual/reference/explain-results/>): `explainVersion` "1",
//! `queryPlanner` (`namespace`, `parsedQuery`, `winningPlan`, `rejectedPlans`), `command`,
//! `serverInfo`; with verbosity `executionStats` or `allPlansExecution` (mongod's default is
//! `allPlansExecution`; mongosh sends `queryPlanner`) `executionStats` too, for `find` and `count`
//! computed by running the query on the current data without changing it. Explaining a command
//! that explain does not cover fails as in mongod: 59 "Explain failed due to unknown command".

use bson::{doc, Bson, Document};

use super::error::{codes, CommandError};
use crate::engine::{FindSpec, Store};

/// Commands mongod can explain.
const EXPLAINABLE: &[&str] = &[
    "find",
    "count",
    "distinct",
    "aggregate",
    "update",
    "delete",
    "findAndModify",
    "findandmodify",
];

/// How much `explain` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verbosity {
    QueryPlanner,
    ExecutionStats,
    AllPlansExecution,
}

fn verbosity(body: &Document) -> Result<Verbosity, CommandError> {
    match body.get("verbosity") {
        None => Ok(Verbosity::AllPlansExecution),
        Some(Bson::String(s)) => match s.as_str() {
            "queryPlanner" => Ok(Verbosity::QueryPlanner),
            "executionStats" => Ok(Verbosity::ExecutionStats),
            "allPlansExecution" => Ok(Verbosity::AllPlansExecution),
            other => Err(CommandError::bad_value(format!(
                "verbosity string must be one of {{'queryPlanner', 'executionStats', 'allPlansExecution'}}, not '{other}'"
            ))),
        },
        Some(_) => Err(CommandError::failed_to_parse(
            "explain verbosity must be a string",
        )),
    }
}

/// The explained command, checked: a document naming a command explain covers.
pub(crate) fn inner_command(body: &Document) -> Result<(&str, &Document), CommandError> {
    let Some(Bson::Document(inner)) = body.get("explain") else {
        return Err(CommandError::type_mismatch(
            "explain command requires a nested object",
        ));
    };
    let Some(name) = inner.keys().next() else {
        return Err(CommandError::failed_to_parse(
            "explain command requires a nested object",
        ));
    };
    if !EXPLAINABLE.contains(&name.as_str()) {
        return Err(CommandError::new(
            codes::COMMAND_NOT_FOUND,
            format!("Explain failed due to unknown command: {name}"),
        ));
    }
    Ok((name.as_str(), inner))
}

/// The filter of the explained command, as its plan shows it.
fn filter_of(name: &str, inner: &Document) -> Document {
    let field = match name {
        "find" => "filter",
        "count" | "distinct" | "findAndModify" | "findandmodify" => "query",
        _ => "",
    };
    if let Ok(d) = inner.get_document(field) {
        return d.clone();
    }
    let statements = match name {
        "update" => "updates",
        "delete" => "deletes",
        _ => "",
    };
    inner
        .get_array(statements)
        .ok()
        .and_then(|a| a.first())
        .and_then(Bson::as_document)
        .and_then(|s| s.get_document("q").ok())
        .cloned()
        .unwrap_or_default()
}

/// Answers `{explain: <command>, verbosity}` run on `db` by the member at `host`.
pub(crate) fn explain(
    store: &Store,
    db: &str,
    body: &Document,
    host: &str,
    version: &str,
) -> Result<Document, CommandError> {
    let (name, inner) = inner_command(body)?;
    let verbosity = verbosity(body)?;
    let coll = match inner.get(name) {
        Some(Bson::String(c)) => c.clone(),
        _ if name == "aggregate" => "$cmd.aggregate".to_owned(),
        _ => {
            return Err(CommandError::type_mismatch(format!(
                "collection name has invalid type for {name}"
            )))
        }
    };
    let filter = filter_of(name, inner);
    let mut winning = doc! { "stage": "COLLSCAN" };
    if !filter.is_empty() {
        winning.insert("filter", filter.clone());
    }
    winning.insert("direction", "forward");
    let mut command = inner.clone();
    command.insert("$db", db);
    let (host_name, port) = host.rsplit_once(':').unwrap_or((host, "0"));
    let mut reply = doc! {
        "explainVersion": "1",
        "queryPlanner": {
            "namespace": format!("{db}.{coll}"),
            "parsedQuery": filter,
            "indexFilterSet": false,
            "winningPlan": winning,
            "rejectedPlans": [],
        },
    };
    if verbosity != Verbosity::QueryPlanner {
        let examined = store.find(db, &coll, &FindSpec::default())?.len();
        let returned = match name {
            "find" => Some(
                store
                    .find(db, &coll, &FindSpec::from_command(inner)?)?
                    .len(),
            ),
            "count" => {
                let spec = FindSpec {
                    filter: inner.get_document("query").cloned().unwrap_or_default(),
                    ..Default::default()
                };
                Some(store.find(db, &coll, &spec)?.len())
            }
            _ => None,
        };
        let mut stats = doc! {
            "executionSuccess": true,
            "executionTimeMillis": 0i64,
            "totalKeysExamined": 0i64,
            "totalDocsExamined": examined as i64,
        };
        if let Some(n) = returned {
            stats.insert("nReturned", n as i64);
        }
        let mut stage = doc! { "stage": "COLLSCAN", "docsExamined": examined as i64 };
        if let Some(n) = returned {
            stage.insert("nReturned", n as i64);
        }
        stats.insert("executionStages", stage);
        if verbosity == Verbosity::AllPlansExecution {
            stats.insert("allPlansExecution", Bson::Array(Vec::new()));
        }
        reply.insert("executionStats", stats);
    }
    reply.insert("command", command);
    reply.insert(
        "serverInfo",
        doc! {
            "host": host_name,
            "port": port.parse::<i32>().unwrap_or(0),
            "version": version,
            "gitVersion": "labd",
        },
    );
    reply.insert("ok", 1.0);
    Ok(reply)
}
