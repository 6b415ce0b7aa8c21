//! The `failCommand` fail point with mongod's semantics.

use std::time::Duration;

use bson::{Bson, Document};
use rand::Rng;

use super::error::{codes, CommandError};

/// Longest `blockTimeMS` honoured, so every wait has a deadline.
pub const MAX_BLOCK: Duration = Duration::from_secs(300);

/// How often a configured fail point fires.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// Never.
    Off,
    /// Always.
    AlwaysOn,
    /// The next `n` matching commands (mongod fires once even for `{times: 0}`).
    Times(i64),
    /// Not for the next `n` matching commands, then always.
    Skip(i64),
    /// Each matching command with this probability.
    Probability(f64),
}

/// One fail point's configuration and counter.
#[derive(Debug, Clone)]
pub struct FailPoint {
    /// Current mode.
    pub mode: Mode,
    /// The `data` document.
    pub data: Document,
    /// How many times the fail point fired since it was configured.
    pub times_entered: i64,
}

impl Default for FailPoint {
    fn default() -> Self {
        FailPoint {
            mode: Mode::Off,
            data: Document::new(),
            times_entered: 0,
        }
    }
}

/// What a fired `failCommand` does to the command.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FailAction {
    /// `errorLabels`: exactly these labels on the error (or on the write concern error).
    pub labels: Option<Vec<String>>,
    /// `blockConnection` + `blockTimeMS`.
    pub block: Option<Duration>,
    /// `closeConnection`: close the socket without replying.
    pub close: bool,
    /// `errorCode`: fail with this code.
    pub error_code: Option<i32>,
    /// `writeConcernError`: run the command, then append this document.
    pub write_concern_error: Option<Document>,
}

impl FailAction {
    /// The error a fired `errorCode` produces.
    pub fn error(&self) -> Option<CommandError> {
        self.error_code.map(|code| {
            let mut e = CommandError::new(code, "Failing command via 'failCommand' failpoint");
            e.labels = self.labels.clone();
            e
        })
    }
}

fn as_i64(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(d) if d.fract() == 0.0 && d.is_finite() => Some(*d as i64),
        _ => None,
    }
}

fn as_bool(v: Option<&Bson>) -> bool {
    match v {
        Some(Bson::Boolean(b)) => *b,
        Some(other) => as_i64(other).is_some_and(|i| i != 0),
        None => false,
    }
}

/// Parses `mode` of a `configureFailPoint` command.
pub fn parse_mode(mode: Option<&Bson>) -> Result<Mode, CommandError> {
    let Some(mode) = mode else {
        return Err(CommandError::new(
            codes::ILLEGAL_OPERATION,
            "When setting a failpoint, you must supply a 'mode'",
        ));
    };
    match mode {
        Bson::String(s) if s == "off" => Ok(Mode::Off),
        Bson::String(s) if s == "alwaysOn" => Ok(Mode::AlwaysOn),
        Bson::String(s) => Err(CommandError::bad_value(format!("unknown mode: {s}"))),
        Bson::Document(d) => {
            let Some((key, value)) = d.iter().next() else {
                return Err(CommandError::bad_value("empty mode document"));
            };
            match key.as_str() {
                "times" | "skip" => {
                    let n = as_i64(value).ok_or_else(|| {
                        CommandError::type_mismatch(format!("'{key}' must be a number"))
                    })?;
                    if n < 0 {
                        return Err(CommandError::bad_value(format!("'{key}' must be >= 0")));
                    }
                    Ok(if key == "times" {
                        Mode::Times(n)
                    } else {
                        Mode::Skip(n)
                    })
                }
                "activationProbability" => {
                    let p = match value {
                        Bson::Double(d) => *d,
                        other => as_i64(other).map(|i| i as f64).ok_or_else(|| {
                            CommandError::type_mismatch("'activationProbability' must be a number")
                        })?,
                    };
                    if !(0.0..=1.0).contains(&p) {
                        return Err(CommandError::bad_value(
                            "'activationProbability' must be between 0 and 1",
                        ));
                    }
                    Ok(Mode::Probability(p))
                }
                other => Err(CommandError::bad_value(format!("unknown mode: {other}"))),
            }
        }
        _ => Err(CommandError::type_mismatch(
            "'mode' must be a string or a document",
        )),
    }
}

/// Validates a `failCommand` `data` document.
pub fn validate_data(data: &Document) -> Result<(), CommandError> {
    if let Some(v) = data.get("failCommands") {
        match v {
            Bson::Array(a) if a.iter().all(|x| matches!(x, Bson::String(_))) => {}
            _ => {
                return Err(CommandError::type_mismatch(
                    "'failCommands' must be an array of strings",
                ))
            }
        }
    }
    if as_bool(data.get("blockConnection")) {
        match data.get("blockTimeMS").and_then(as_i64) {
            Some(ms) if ms >= 0 => {}
            _ => {
                return Err(CommandError::bad_value(
                    "'blockTimeMS' must be a non-negative number with blockConnection",
                ))
            }
        }
    }
    if let Some(v) = data.get("errorCode") {
        if as_i64(v).and_then(|c| i32::try_from(c).ok()).is_none() {
            return Err(CommandError::type_mismatch(
                "'errorCode' must be a 32-bit integer",
            ));
        }
    }
    if let Some(v) = data.get("errorLabels") {
        match v {
            Bson::Array(a) if a.iter().all(|x| matches!(x, Bson::String(_))) => {}
            _ => {
                return Err(CommandError::type_mismatch(
                    "'errorLabels' must be an array of strings",
                ))
            }
        }
    }
    if let Some(v) = data.get("writeConcernError") {
        if !matches!(v, Bson::Document(_)) {
            return Err(CommandError::type_mismatch(
                "'writeConcernError' must be a document",
            ));
        }
    }
    Ok(())
}

/// Names under which a command may be listed in `failCommands`.
fn aliases(name: &str) -> &'static [&'static str] {
    match name {
        "hello" | "isMaster" | "ismaster" => &["hello", "isMaster", "ismaster"],
        _ => &[],
    }
}

/// The facts about one command that the predicate checks.
#[derive(Debug, Clone, Copy)]
pub struct CommandFacts<'a> {
    /// Command name (first key of the body).
    pub name: &'a str,
    /// `db.coll` (or `db.$cmd` for commands without a collection).
    pub namespace: &'a str,
    /// The connection's application name from its handshake.
    pub app_name: Option<&'a str>,
}

impl FailPoint {
    /// Replaces mode and data; resets the counter. Returns the previous `times_entered`.
    pub fn configure(&mut self, mode: Mode, data: Document) -> i64 {
        let before = self.times_entered;
        self.mode = mode;
        self.data = data;
        self.times_entered = 0;
        before
    }

    fn predicate(&self, facts: &CommandFacts<'_>) -> bool {
        if facts.name == "configureFailPoint" {
            return false;
        }
        let data = &self.data;
        if let Some(Bson::String(app)) = data.get("appName") {
            if facts.app_name != Some(app.as_str()) {
                return false;
            }
        }
        if let Some(Bson::String(ns)) = data.get("namespace") {
            if ns != facts.namespace {
                return false;
            }
        }
        let listed = if data.contains_key("failAllCommands") {
            true
        } else if let Some(Bson::Array(list)) = data.get("failCommands") {
            list.iter().any(|c| match c {
                Bson::String(c) => c == facts.name || aliases(facts.name).contains(&c.as_str()),
                _ => false,
            })
        } else {
            false
        };
        if !listed {
            return false;
        }
        as_bool(data.get("closeConnection"))
            || as_bool(data.get("blockConnection"))
            || data.contains_key("errorCode")
            || data.contains_key("errorExtraInfo")
            || data.contains_key("writeConcernError")
    }

    fn fire_by_mode<R: Rng>(&mut self, rng: &mut R) -> bool {
        match &mut self.mode {
            Mode::Off => false,
            Mode::AlwaysOn => true,
            Mode::Times(n) => {
                *n -= 1;
                if *n <= 0 {
                    self.mode = Mode::Off;
                }
                true
            }
            Mode::Skip(n) => {
                if *n > 0 {
                    *n -= 1;
                    false
                } else {
                    true
                }
            }
            Mode::Probability(p) => rng.random_bool(p.clamp(0.0, 1.0)),
        }
    }

    /// Evaluates a fail point without a command predicate (mode only); returns its data when it
    /// fires.
    pub fn evaluate_mode<R: Rng>(&mut self, rng: &mut R) -> Option<Document> {
        if self.mode == Mode::Off || !self.fire_by_mode(rng) {
            return None;
        }
        self.times_entered += 1;
        Some(self.data.clone())
    }

    /// Evaluates the fail point for one command: predicate first (a miss consumes nothing), then
    /// the mode. Returns what to do when it fires.
    pub fn evaluate<R: Rng>(
        &mut self,
        facts: &CommandFacts<'_>,
        rng: &mut R,
    ) -> Option<FailAction> {
        if self.mode == Mode::Off || !self.predicate(facts) {
            return None;
        }
        if !self.fire_by_mode(rng) {
            return None;
        }
        self.times_entered += 1;
        let data = &self.data;
        let labels = match data.get("errorLabels") {
            Some(Bson::Array(a)) => Some(
                a.iter()
                    .filter_map(|l| l.as_str().map(str::to_string))
                    .collect(),
            ),
            _ => None,
        };
        let block = if as_bool(data.get("blockConnection")) {
            let ms = data.get("blockTimeMS").and_then(as_i64).unwrap_or(0).max(0) as u64;
            Some(Duration::from_millis(ms).min(MAX_BLOCK))
        } else {
            None
        };
        let error_code = data
            .get("errorCode")
            .and_then(as_i64)
            .and_then(|c| i32::try_from(c).ok());
        let write_concern_error = match data.get("writeConcernError") {
            Some(Bson::Document(d)) => Some(d.clone()),
            _ => None,
        };
        Some(FailAction {
            labels,
            block,
            close: as_bool(data.get("closeConnection")),
            error_code,
            write_concern_error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn facts<'a>(name: &'a str, app: Option<&'a str>) -> CommandFacts<'a> {
        CommandFacts {
            name,
            namespace: "db.coll",
            app_name: app,
        }
    }

    #[test]
    fn times_counts_only_matching_commands() {
        let mut fp = FailPoint::default();
        fp.configure(
            Mode::Times(2),
            doc! { "failCommands": ["find"], "errorCode": 462 },
        );
        let mut rng = rand::rng();
        assert!(fp.evaluate(&facts("insert", None), &mut rng).is_none());
        assert_eq!(
            fp.evaluate(&facts("find", None), &mut rng)
                .unwrap()
                .error_code,
            Some(462)
        );
        assert!(fp.evaluate(&facts("find", None), &mut rng).is_some());
        assert!(fp.evaluate(&facts("find", None), &mut rng).is_none());
        assert_eq!(fp.times_entered, 2);
    }

    #[test]
    fn skip_then_always_and_app_name_filter() {
        let mut fp = FailPoint::default();
        fp.configure(
            Mode::Skip(1),
            doc! { "failCommands": ["isMaster"], "appName": "a", "closeConnection": true },
        );
        let mut rng = rand::rng();
        assert!(fp.evaluate(&facts("hello", Some("b")), &mut rng).is_none());
        assert!(fp.evaluate(&facts("hello", Some("a")), &mut rng).is_none());
        assert!(
            fp.evaluate(&facts("hello", Some("a")), &mut rng)
                .unwrap()
                .close
        );
        assert!(fp
            .evaluate(&facts("ismaster", Some("a")), &mut rng)
            .is_some());
    }

    #[test]
    fn never_for_configure_fail_point_and_needs_an_effect() {
        let mut fp = FailPoint::default();
        fp.configure(
            Mode::AlwaysOn,
            doc! { "failAllCommands": true, "errorCode": 2 },
        );
        let mut rng = rand::rng();
        assert!(fp
            .evaluate(&facts("configureFailPoint", None), &mut rng)
            .is_none());
        fp.configure(Mode::AlwaysOn, doc! { "failCommands": ["ping"] });
        assert!(fp.evaluate(&facts("ping", None), &mut rng).is_none());
    }

    #[test]
    fn times_zero_fires_once() {
        let mut fp = FailPoint::default();
        fp.configure(
            Mode::Times(0),
            doc! { "failCommands": ["ping"], "errorCode": 2 },
        );
        let mut rng = rand::rng();
        assert!(fp.evaluate(&facts("ping", None), &mut rng).is_some());
        assert!(fp.evaluate(&facts("ping", None), &mut rng).is_none());
    }

    #[test]
    fn parse_modes() {
        assert_eq!(
            parse_mode(Some(&Bson::String("off".into()))).unwrap(),
            Mode::Off
        );
        assert_eq!(
            parse_mode(Some(&Bson::Document(doc! {"times": 3}))).unwrap(),
            Mode::Times(3)
        );
        assert_eq!(
            parse_mode(Some(&Bson::Document(doc! {"skip": 1i64}))).unwrap(),
            Mode::Skip(1)
        );
        assert!(parse_mode(Some(&Bson::Document(doc! {"activationProbability": 2.0}))).is_err());
        assert!(parse_mode(Some(&Bson::Document(doc! {"times": -1}))).is_err());
        assert!(parse_mode(None).is_err());
        assert!(validate_data(&doc! {"blockConnection": true}).is_err());
        assert!(validate_data(&doc! {"errorCode": "x"}).is_err());
    }
}

/// The message of a statement failed by `onPrimaryTransactionalWrite`'s
/// `failBeforeCommitExceptionCode`.
pub(crate) const FAIL_BEFORE_COMMIT_MESSAGE: &str =
    "Failing write for test before commit (onPrimaryTransactionalWrite)";

/// The array of statements of a retryable write command and whether it is ordered. Commands
/// without one (findAndModify) count as one statement.
fn statements<'a>(name: &str, body: &'a Document) -> (Option<&'a Vec<Bson>>, bool) {
    let field = match name {
        "insert" => "documents",
        "update" => "updates",
        "delete" => "deletes",
        "bulkWrite" => "ops",
        _ => return (None, true),
    };
    let ordered = !matches!(body.get("ordered"), Some(Bson::Boolean(false)));
    match body.get(field) {
        Some(Bson::Array(a)) => (Some(a), ordered),
        _ => (None, ordered),
    }
}

/// How many statements a write command has (1 for commands without a statement array).
pub(crate) fn statement_count(name: &str, body: &Document) -> usize {
    statements(name, body).0.map_or(1, Vec::len)
}

/// Whether failed statements of `name` are reported as write errors (insert, update, delete);
/// otherwise the failure is the command's.
pub(crate) fn has_statement_errors(name: &str) -> bool {
    matches!(name, "insert" | "update" | "delete")
}

/// What `onPrimaryTransactionalWrite` does to one retryable write, statement by statement.
#[derive(Debug, Default)]
pub(crate) struct StatementPlan {
    /// Statements (original indexes) to run, in order.
    pub(crate) run: Vec<usize>,
    /// Statements that fail without running: the fail point's (`failBeforeCommitExceptionCode`)
    /// and those a router's target shard rejected.
    pub(crate) failing: Vec<StatementFailure>,
    /// The connection is closed after the write (`closeConnection`, true unless `false`).
    pub(crate) close_after: bool,
    /// The member steps down after the write (lab-only `labStepDown: true`), so the retry
    /// after the closed connection meets a new primary.
    pub(crate) step_down_after: bool,
    /// Whether the command is ordered (a failure stops the statements after it).
    pub(crate) ordered: bool,
}

/// A statement that fails without running, reported as a write error at its index.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StatementFailure {
    /// The statement's index in the original command.
    pub(crate) index: usize,
    pub(crate) code: i32,
    pub(crate) errmsg: String,
}

/// Statements a partly applied retryable write already applied, and its counts so far.
#[derive(Debug, Clone, Default)]
pub(crate) struct PartialWrite {
    /// Original indexes of the applied statements.
    pub(crate) applied: Vec<usize>,
    /// `n`, `nModified` and `upserted` (original indexes) of the applied statements.
    pub(crate) counts: Document,
}

/// Evaluates `fail_point` once per statement of a retryable write that is not `applied`
/// already (mongod evaluates it as each statement is written, so `{skip: n}` lets n
/// statements through), and decides which statements run and which fail.
pub(crate) fn plan_statement_failures<R: Rng>(
    fail_point: &mut FailPoint,
    name: &str,
    body: &Document,
    applied: &[usize],
    rng: &mut R,
) -> StatementPlan {
    let (list, ordered) = statements(name, body);
    let total = list.map_or(1, Vec::len);
    let mut plan = StatementPlan {
        ordered,
        ..Default::default()
    };
    for index in (0..total).filter(|i| !applied.contains(i)) {
        if fail_point.mode == Mode::Off {
            plan.run.push(index);
            continue;
        }
        let Some(data) = fail_point.evaluate_mode(rng) else {
            plan.run.push(index);
            continue;
        };
        if !matches!(data.get("closeConnection"), Some(Bson::Boolean(false))) {
            plan.close_after = true;
        }
        if matches!(data.get("labStepDown"), Some(Bson::Boolean(true))) {
            plan.step_down_after = true;
        }
        match data.get("failBeforeCommitExceptionCode") {
            Some(code) => {
                let code = as_i64(code)
                    .and_then(|c| i32::try_from(c).ok())
                    .unwrap_or(1);
                plan.failing.push(StatementFailure {
                    index,
                    code,
                    errmsg: FAIL_BEFORE_COMMIT_MESSAGE.to_string(),
                });
                if ordered {
                    break;
                }
            }
            None => plan.run.push(index),
        }
    }
    plan
}

impl StatementPlan {
    /// Every statement of `name` runs (the plan shard rejections are then added to).
    pub(crate) fn every_statement(name: &str, body: &Document) -> StatementPlan {
        let (list, ordered) = statements(name, body);
        StatementPlan {
            run: (0..list.map_or(1, Vec::len)).collect(),
            ordered,
            ..StatementPlan::default()
        }
    }

    /// Adds the statements a router's target shards rejected (`accepted` is what the shards
    /// accepted, in order; `total` the command's statements): they fail without running, and in
    /// an ordered command nothing after the first failure runs. A statement `applied` by an
    /// earlier attempt is never reported as failed: an unordered command just does not run it
    /// again; in an ordered one the failure moves to the first statement after it that was not
    /// applied (the statements after the rejected one were not attempted), if any.
    pub(crate) fn add_shard_rejections(
        &mut self,
        accepted: &[usize],
        rejected: &[StatementFailure],
        applied: &[usize],
        total: usize,
    ) {
        self.run.retain(|i| accepted.contains(i));
        for failure in rejected {
            let index = if self.ordered {
                (failure.index..total).find(|i| !applied.contains(i))
            } else {
                Some(failure.index).filter(|i| !applied.contains(i))
            };
            if let Some(index) = index {
                if !self.failing.iter().any(|f| f.index == index) {
                    self.failing.push(StatementFailure {
                        index,
                        ..failure.clone()
                    });
                }
            }
        }
        self.failing.sort_by_key(|f| f.index);
        if self.ordered {
            if let Some(first) = self.failing.first().map(|f| f.index) {
                self.run.retain(|i| *i < first);
                self.failing.truncate(1);
            }
        }
    }
}

/// `body` with only the statements in `run` (None when no statement is left to run).
pub(crate) fn with_statements(name: &str, body: &Document, run: &[usize]) -> Option<Document> {
    if run.is_empty() {
        return None;
    }
    let (Some(list), _) = statements(name, body) else {
        return Some(body.clone());
    };
    let field = match name {
        "insert" => "documents",
        "update" => "updates",
        _ => "deletes",
    };
    let kept: Vec<Bson> = run.iter().filter_map(|&i| list.get(i).cloned()).collect();
    let mut sub = body.clone();
    sub.insert(field, kept);
    Some(sub)
}

fn count_of(doc: &Document, key: &str) -> i64 {
    doc.get(key).and_then(as_i64).unwrap_or(0)
}

/// Index fields of a sub-command's reply mapped back to the original statement indexes.
fn remap_indexes(entries: Option<&Bson>, run: &[usize]) -> Vec<Document> {
    let Some(Bson::Array(items)) = entries else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|e| match e {
            Bson::Document(d) => {
                let mut d = d.clone();
                let sub = d.get("index").and_then(as_i64).unwrap_or(0);
                let original = usize::try_from(sub)
                    .ok()
                    .and_then(|i| run.get(i).copied())
                    .unwrap_or(0);
                d.insert("index", original as i32);
                Some(d)
            }
            _ => None,
        })
        .collect()
}

/// Combines the reply of the statements that ran (`reply`, indexes relative to `plan.run`)
/// with the statements applied by earlier attempts and the statements the fail point failed.
/// Returns the reply in mongod's shape and, when some statements failed, what a retry must
/// not apply again.
pub(crate) fn merge_statement_results(
    name: &str,
    reply: Option<Document>,
    plan: &StatementPlan,
    earlier: Option<&PartialWrite>,
) -> (Document, Option<PartialWrite>) {
    let reply = reply.unwrap_or_default();
    let mut errors = remap_indexes(reply.get("writeErrors"), &plan.run);
    let mut upserted = remap_indexes(reply.get("upserted"), &plan.run);
    let mut n = count_of(&reply, "n");
    let mut n_modified = count_of(&reply, "nModified");
    let mut applied: Vec<usize> = Vec::new();
    if let Some(earlier) = earlier {
        n += count_of(&earlier.counts, "n");
        n_modified += count_of(&earlier.counts, "nModified");
        // Already in original indexes.
        if let Some(Bson::Array(earlier_upserts)) = earlier.counts.get("upserted") {
            upserted.extend(
                earlier_upserts
                    .iter()
                    .filter_map(|u| u.as_document().cloned()),
            );
        }
        applied.extend(&earlier.applied);
    }
    // Statements that ran without a write error were applied; in an ordered command nothing
    // after the first real write error ran, and the fail point's statement was not reached.
    let first_error = errors
        .iter()
        .filter_map(|e| e.get("index").and_then(as_i64))
        .min();
    for &i in &plan.run {
        let failed = errors
            .iter()
            .any(|e| e.get("index").and_then(as_i64) == Some(i as i64));
        let unreached = plan.ordered && first_error.is_some_and(|f| i as i64 > f);
        if !failed && !unreached {
            applied.push(i);
        }
    }
    let reached = |i: usize| !(plan.ordered && first_error.is_some_and(|f| i as i64 > f));
    for failure in &plan.failing {
        if reached(failure.index) {
            errors.push(bson::doc! {
                "index": failure.index as i32,
                "code": failure.code,
                "errmsg": failure.errmsg.clone(),
            });
        }
    }
    errors.sort_by_key(|e| e.get("index").and_then(as_i64).unwrap_or(0));
    upserted.sort_by_key(|e| e.get("index").and_then(as_i64).unwrap_or(0));
    applied.sort_unstable();
    applied.dedup();
    let mut out = Document::new();
    out.insert("n", i32::try_from(n).unwrap_or(i32::MAX));
    if name == "update" {
        out.insert("nModified", i32::try_from(n_modified).unwrap_or(i32::MAX));
        if !upserted.is_empty() {
            out.insert("upserted", upserted.clone());
        }
    }
    let partial = (!plan.failing.is_empty()).then(|| {
        let mut counts = out.clone();
        if !upserted.is_empty() {
            counts.insert("upserted", upserted);
        }
        PartialWrite { applied, counts }
    });
    if !errors.is_empty() {
        out.insert("writeErrors", errors);
    }
    for (k, v) in reply {
        if !matches!(
            k.as_str(),
            "n" | "nModified" | "upserted" | "writeErrors" | "ok"
        ) {
            out.insert(k, v);
        }
    }
    out.insert("ok", 1.0);
    (out, partial)
}
