//! Lab-only reply mangling: the server answers some commands with replies a real mongod never
//! sends, on a seeded schedule, so tests can check that a driver neither panics, nor hangs past
//! its timeouts, nor reports success for a reply it could not read.
//!
//! Off by default. Turned on with `setParameter: {labMangleReplies: {...}}` (any member; the
//! schedule is deployment-wide) or [`Emulator::set_reply_mangling`](super::Emulator). Each
//! reply that qualifies (see [`MangleConfig`]) draws from a generator seeded with the
//! configuration's `seed` and the reply's sequence number, so the same request order mangles the
//! same replies the same way.
//!
//! Two families of damage:
//!
//! * **Document** damage, applied to the reply document before it is encoded: error replies
//!   whose `code` has the wrong type or is missing, `errorLabels` that are not an array or hold
//!   non-strings, overload errors whose `baseBackoffMS` is of any BSON type, malformed
//!   `writeErrors`, `writeConcernError` and cursor documents, `ok` of odd types. The connection
//!   stays usable.
//! * **Frame** damage, applied to the encoded bytes: truncation, a wrong `messageLength` (longer,
//!   shorter, negative, above `maxMessageSizeBytes`), an opcode other than OP_MSG, unknown
//!   required OP_MSG flag bits, random byte flips. The stream cannot be trusted afterwards, so
//!   the server closes the connection after sending the damaged frame, except for `stall`, which
//!   sends part of a frame and then sends nothing more until the client gives up (a timeout test).
//!
//! Every mangled reply carries a [`Verdict`]: whether a driver must not report success when this
//! was the last reply it read for an operation. Replies to requests that carry a string `comment`
//! are logged when `log` is on, so a test that gives each operation its own comment can tell
//! which reply ended it ([`MangleRecord`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use bson::{doc, oid::ObjectId, spec::BinarySubtype, Binary, Bson, Document, Timestamp};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::lock;
use crate::wire::{self, HEADER_LEN};

/// The `setParameter` / `getParameter` name of the knob.
pub const PARAMETER: &str = "labMangleReplies";

/// Longest time a `stall` keeps a connection open waiting for the client to close it.
pub(crate) const STALL_LIMIT: Duration = Duration::from_secs(120);

/// Most log records kept unless the configuration says otherwise.
const DEFAULT_LOG_LIMIT: usize = 1_000_000;

/// Commands whose replies are never mangled unless named in `commands`: the handshake and the
/// commands a test uses to steer the emulator, so monitoring and control keep working.
const NEVER_BY_DEFAULT: &[&str] = &[
    "hello",
    "isMaster",
    "ismaster",
    "configureFailPoint",
    "setParameter",
    "getParameter",
    "serverStatus",
    "labClientMetadata",
    "saslStart",
    "saslContinue",
    "authenticate",
];

/// One way of damaging a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MangleKind {
    /// An error reply whose `code` is a string, a fractional double, a document, null, …
    ErrorCodeWrongType,
    /// An error reply without `code`.
    ErrorCodeMissing,
    /// An error reply whose `errorLabels` is a string, a document, a number or null.
    ErrorLabelsNotArray,
    /// An error reply whose `errorLabels` array holds numbers, documents or null among strings.
    ErrorLabelsNonStrings,
    /// An overload error (462, `RetryableError` + `SystemOverloadedError`) whose
    /// `baseBackoffMS` is of a BSON type drawn from all of them (odd values of numbers too).
    BaseBackoffAnyType,
    /// A write reply (`insert`, `update`, `delete`) with a malformed `writeErrors`.
    WriteErrorsMalformed,
    /// A write reply with a malformed `writeConcernError`.
    WriteConcernErrorMalformed,
    /// A cursor reply whose `cursor.id` is missing, a string, a document or null.
    CursorIdMalformed,
    /// A cursor reply whose batch (`firstBatch` / `nextBatch`) is missing, not an array or holds
    /// non-documents, or whose `cursor` is not a document at all.
    CursorBatchMalformed,
    /// A cursor reply whose `cursor.ns` is missing or not a string.
    CursorNamespaceMalformed,
    /// `ok` missing or of an odd type or value (string, boolean, null, NaN, 2, …).
    OkOddType,
    /// The first bytes of the frame only, then the connection is closed.
    Truncated,
    /// `messageLength` larger than the frame (by a little, or past `maxMessageSizeBytes`),
    /// then the connection is closed.
    LengthTooLong,
    /// `messageLength` smaller than the frame (possibly below the header or negative), then the
    /// connection is closed.
    LengthTooShort,
    /// An opcode other than OP_MSG (OP_REPLY, OP_COMPRESSED, unknown), then close.
    WrongOpcode,
    /// OP_MSG flag bits that are required-to-understand (bits 2–15) but unknown, then close.
    UnknownRequiredFlags,
    /// One to four bytes of the frame XORed with random masks, then close.
    ByteFlips,
    /// Part of the frame, then nothing: the connection stays open until the client closes it.
    Stall,
}

impl MangleKind {
    /// Every kind, in declaration order.
    pub const ALL: [MangleKind; 18] = [
        MangleKind::ErrorCodeWrongType,
        MangleKind::ErrorCodeMissing,
        MangleKind::ErrorLabelsNotArray,
        MangleKind::ErrorLabelsNonStrings,
        MangleKind::BaseBackoffAnyType,
        MangleKind::WriteErrorsMalformed,
        MangleKind::WriteConcernErrorMalformed,
        MangleKind::CursorIdMalformed,
        MangleKind::CursorBatchMalformed,
        MangleKind::CursorNamespaceMalformed,
        MangleKind::OkOddType,
        MangleKind::Truncated,
        MangleKind::LengthTooLong,
        MangleKind::LengthTooShort,
        MangleKind::WrongOpcode,
        MangleKind::UnknownRequiredFlags,
        MangleKind::ByteFlips,
        MangleKind::Stall,
    ];

    /// The name used in `kinds` and in reports.
    pub fn name(self) -> &'static str {
        match self {
            MangleKind::ErrorCodeWrongType => "errorCodeWrongType",
            MangleKind::ErrorCodeMissing => "errorCodeMissing",
            MangleKind::ErrorLabelsNotArray => "errorLabelsNotArray",
            MangleKind::ErrorLabelsNonStrings => "errorLabelsNonStrings",
            MangleKind::BaseBackoffAnyType => "baseBackoffAnyType",
            MangleKind::WriteErrorsMalformed => "writeErrorsMalformed",
            MangleKind::WriteConcernErrorMalformed => "writeConcernErrorMalformed",
            MangleKind::CursorIdMalformed => "cursorIdMalformed",
            MangleKind::CursorBatchMalformed => "cursorBatchMalformed",
            MangleKind::CursorNamespaceMalformed => "cursorNamespaceMalformed",
            MangleKind::OkOddType => "okOddType",
            MangleKind::Truncated => "truncated",
            MangleKind::LengthTooLong => "lengthTooLong",
            MangleKind::LengthTooShort => "lengthTooShort",
            MangleKind::WrongOpcode => "wrongOpcode",
            MangleKind::UnknownRequiredFlags => "unknownRequiredFlags",
            MangleKind::ByteFlips => "byteFlips",
            MangleKind::Stall => "stall",
        }
    }

    /// The kind called `name`.
    pub fn from_name(name: &str) -> Option<MangleKind> {
        MangleKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether the kind damages the encoded frame (rather than the document).
    pub fn is_frame(self) -> bool {
        matches!(
            self,
            MangleKind::Truncated
                | MangleKind::LengthTooLong
                | MangleKind::LengthTooShort
                | MangleKind::WrongOpcode
                | MangleKind::UnknownRequiredFlags
                | MangleKind::ByteFlips
                | MangleKind::Stall
        )
    }

    /// What a driver may conclude from a reply damaged this way.
    ///
    /// [`Verdict::MustFail`]: the reply reports a failure (`ok` is not the number 1, or a write
    /// concern error is present) or lacks what the driver needs to report the result (the frame
    /// is incomplete or not an OP_MSG it may parse, a write error or a cursor's id or batch is
    /// unreadable). A driver must not report success when this was the last reply of an
    /// operation. [`Verdict::Undetermined`]: byte flips (a flip may leave a valid, different
    /// reply) and a cursor's namespace (a driver may use the namespace it sent).
    pub fn verdict(self) -> Verdict {
        match self {
            MangleKind::ByteFlips | MangleKind::CursorNamespaceMalformed => Verdict::Undetermined,
            _ => Verdict::MustFail,
        }
    }
}

/// What a driver may conclude from a reply (see [`MangleKind::verdict`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// Not mangled.
    Clean,
    /// Reporting success when this was an operation's last reply is a defect.
    MustFail,
    /// Success or failure are both defensible.
    Undetermined,
}

/// The schedule: which replies qualify and how many are mangled.
#[derive(Debug, Clone, PartialEq)]
pub struct MangleConfig {
    /// Seeds the generator (with each reply's sequence number).
    pub seed: u64,
    /// Share of qualifying replies that are mangled, in [0, 1].
    pub share: f64,
    /// Kinds drawn from (uniformly among those that apply to the reply); empty = all.
    pub kinds: Vec<MangleKind>,
    /// Only replies on connections whose handshake gave this application name qualify.
    pub app_name: Option<String>,
    /// Only replies to these commands qualify; empty = every command but the handshake and the
    /// control commands (`configureFailPoint`, `setParameter`, `serverStatus`, …).
    pub commands: Vec<String>,
    /// Record each qualifying reply to a request with a string `comment` (see [`MangleRecord`]).
    pub log: bool,
    /// Most records kept (later ones are dropped and counted as `logDropped`).
    pub log_limit: usize,
}

impl Default for MangleConfig {
    fn default() -> Self {
        MangleConfig {
            seed: 0,
            share: 0.0,
            kinds: Vec::new(),
            app_name: None,
            commands: Vec::new(),
            log: false,
            log_limit: DEFAULT_LOG_LIMIT,
        }
    }
}

/// Why a `labMangleReplies` document was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {PARAMETER}: {0}")]
pub struct ConfigError(String);

impl MangleConfig {
    /// Reads `{seed, share, kinds, appName, commands, log, logLimit}`; `{}` means off (`None`).
    pub fn from_document(d: &Document) -> Result<Option<MangleConfig>, ConfigError> {
        if d.is_empty() {
            return Ok(None);
        }
        let mut c = MangleConfig::default();
        for (key, value) in d {
            match key.as_str() {
                "seed" => {
                    c.seed = match value {
                        Bson::Int32(n) => *n as u64,
                        Bson::Int64(n) => *n as u64,
                        _ => return Err(ConfigError("seed must be an integer".into())),
                    }
                }
                "share" => {
                    let share = match value {
                        Bson::Double(x) => *x,
                        Bson::Int32(n) => f64::from(*n),
                        Bson::Int64(n) => *n as f64,
                        _ => return Err(ConfigError("share must be a number".into())),
                    };
                    if !(0.0..=1.0).contains(&share) {
                        return Err(ConfigError(format!(
                            "share must be a number from 0 to 1, not {share}"
                        )));
                    }
                    c.share = share;
                }
                "kinds" => {
                    let Bson::Array(names) = value else {
                        return Err(ConfigError("kinds must be an array of names".into()));
                    };
                    for name in names {
                        let kind = name.as_str().and_then(MangleKind::from_name).ok_or_else(|| {
                            let known: Vec<&str> =
                                MangleKind::ALL.iter().map(|k| k.name()).collect();
                            ConfigError(format!(
                                "unknown kind {name} (known: {})",
                                known.join(", ")
                            ))
                        })?;
                        c.kinds.push(kind);
                    }
                }
                "appName" => match value {
                    Bson::String(s) => c.app_name = Some(s.clone()),
                    _ => return Err(ConfigError("appName must be a string".into())),
                },
                "commands" => {
                    let Bson::Array(names) = value else {
                        return Err(ConfigError("commands must be an array of names".into()));
                    };
                    for name in names {
                        let Bson::String(name) = name else {
                            return Err(ConfigError("commands must hold strings".into()));
                        };
                        c.commands.push(name.clone());
                    }
                }
                "log" => match value {
                    Bson::Boolean(b) => c.log = *b,
                    _ => return Err(ConfigError("log must be a boolean".into())),
                },
                "logLimit" => {
                    c.log_limit = match value {
                        Bson::Int32(n) if *n >= 0 => *n as usize,
                        Bson::Int64(n) if *n >= 0 => usize::try_from(*n).unwrap_or(usize::MAX),
                        _ => {
                            return Err(ConfigError(
                                "logLimit must be a non-negative integer".into(),
                            ))
                        }
                    }
                }
                other => {
                    return Err(ConfigError(format!(
                        "unknown field {other} (fields: seed, share, kinds, appName, commands, log, logLimit)"
                    )))
                }
            }
        }
        Ok(Some(c))
    }

    /// The configuration as `getParameter` shows it.
    pub fn to_document(&self) -> Document {
        let mut d = doc! {
            "seed": self.seed as i64,
            "share": self.share,
            "kinds": self.kinds.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "commands": self.commands.clone(),
            "log": self.log,
            "logLimit": i64::try_from(self.log_limit).unwrap_or(i64::MAX),
        };
        if let Some(app) = &self.app_name {
            d.insert("appName", app.clone());
        }
        d
    }

    fn command_qualifies(&self, command: &str) -> bool {
        if self.commands.is_empty() {
            !NEVER_BY_DEFAULT.contains(&command)
        } else {
            self.commands.iter().any(|c| c == command)
        }
    }
}

/// One logged reply (see [`MangleConfig::log`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MangleRecord {
    /// Sequence number among qualifying replies (the order they were sent in).
    pub sequence: u64,
    /// The request's `comment`.
    pub comment: String,
    /// The request's command name.
    pub command: String,
    /// How the reply was damaged, if it was.
    pub kind: Option<MangleKind>,
    /// What a driver may conclude from it.
    pub verdict: Verdict,
}

/// Counters since the emulator started (they survive reconfiguration).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MangleReport {
    /// Replies that qualified while mangling was on.
    pub qualifying: u64,
    /// Replies mangled, by kind name.
    pub mangled_by_kind: BTreeMap<&'static str, u64>,
    /// Log records dropped because the log was full.
    pub log_dropped: u64,
}

impl MangleReport {
    /// Replies mangled, all kinds together.
    pub fn mangled(&self) -> u64 {
        self.mangled_by_kind.values().sum()
    }

    /// The report as `getParameter` shows it (under `counters`).
    pub fn to_document(&self) -> Document {
        let mut by_kind = Document::new();
        for (k, v) in &self.mangled_by_kind {
            by_kind.insert(*k, *v as i64);
        }
        doc! {
            "qualifying": self.qualifying as i64,
            "mangled": self.mangled() as i64,
            "byKind": by_kind,
            "logDropped": self.log_dropped as i64,
        }
    }
}

/// The deployment-wide mangling state.
#[derive(Default)]
pub(crate) struct Mangler {
    config: Mutex<Option<MangleConfig>>,
    sequence: AtomicU64,
    report: Mutex<MangleReport>,
    log: Mutex<Vec<MangleRecord>>,
}

/// The facts about a request that decide whether its reply qualifies (read before the request
/// is handled, which consumes it).
pub(crate) struct RequestFacts {
    command: String,
    comment: Option<String>,
}

impl RequestFacts {
    pub(crate) fn of(body: &Document) -> RequestFacts {
        RequestFacts {
            command: body.keys().next().cloned().unwrap_or_default(),
            comment: match body.get("comment") {
                Some(Bson::String(s)) => Some(s.clone()),
                _ => None,
            },
        }
    }
}

/// What to do after sending a (possibly damaged) frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum After {
    /// Keep serving the connection.
    Continue,
    /// Close the connection.
    Close,
    /// Send nothing more; close when the client does (or after [`STALL_LIMIT`]).
    Stall,
}

/// The damage chosen for one reply.
pub(crate) struct Plan {
    kind: MangleKind,
    rng: StdRng,
}

/// A 64-bit mix (splitmix64's finaliser), so that consecutive sequence numbers give unrelated
/// generator seeds.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Mangler {
    /// Replaces the configuration (`None`: off). Returns the previous one.
    /// The schedule restarts: the next qualifying reply is number 0 again, so one seed gives
    /// two runs the same schedule.
    pub(crate) fn configure(&self, config: Option<MangleConfig>) -> Option<MangleConfig> {
        let mut guard = lock(&self.config);
        self.sequence.store(0, Ordering::Relaxed);
        std::mem::replace(&mut *guard, config)
    }

    pub(crate) fn config(&self) -> Option<MangleConfig> {
        lock(&self.config).clone()
    }

    pub(crate) fn report(&self) -> MangleReport {
        lock(&self.report).clone()
    }

    pub(crate) fn take_log(&self) -> Vec<MangleRecord> {
        std::mem::take(&mut *lock(&self.log))
    }

    /// `getParameter`'s view: the configuration (or `{}`) with the counters.
    pub(crate) fn parameter_document(&self) -> Document {
        let mut d = self.config().map(|c| c.to_document()).unwrap_or_default();
        d.insert("counters", self.report().to_document());
        d
    }

    /// Decides the fate of one reply: `None` leaves it alone. `streamed` replies (exhaust
    /// hello or getMore) never qualify.
    pub(crate) fn plan(
        &self,
        facts: &RequestFacts,
        app_name: Option<&str>,
        reply: &Document,
        streamed: bool,
    ) -> Option<Plan> {
        let config = {
            let guard = lock(&self.config);
            let config = guard.as_ref()?;
            if streamed
                || !config.command_qualifies(&facts.command)
                || config
                    .app_name
                    .as_deref()
                    .is_some_and(|wanted| app_name != Some(wanted))
            {
                return None;
            }
            config.clone()
        };
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let mut rng = StdRng::seed_from_u64(mix(config.seed ^ mix(sequence)));
        let kind = if rng.random_bool(config.share) {
            let pool: Vec<MangleKind> = if config.kinds.is_empty() {
                MangleKind::ALL.to_vec()
            } else {
                config.kinds.clone()
            };
            let fitting: Vec<MangleKind> = pool
                .into_iter()
                .filter(|k| applies(*k, &facts.command, reply))
                .collect();
            if fitting.is_empty() {
                None
            } else {
                Some(fitting[rng.random_range(0..fitting.len())])
            }
        } else {
            None
        };
        {
            let mut report = lock(&self.report);
            report.qualifying += 1;
            if let Some(kind) = kind {
                *report.mangled_by_kind.entry(kind.name()).or_default() += 1;
            }
        }
        if config.log {
            if let Some(comment) = &facts.comment {
                let mut log = lock(&self.log);
                if log.len() < config.log_limit {
                    log.push(MangleRecord {
                        sequence,
                        comment: comment.clone(),
                        command: facts.command.clone(),
                        kind,
                        verdict: kind.map_or(Verdict::Clean, MangleKind::verdict),
                    });
                } else {
                    drop(log);
                    lock(&self.report).log_dropped += 1;
                }
            }
        }
        kind.map(|kind| Plan { kind, rng })
    }
}

/// Write commands whose replies carry `n` and may carry `writeErrors`.
const WRITE_COMMANDS: &[&str] = &["insert", "update", "delete"];

/// Whether `kind` makes sense for this reply (a cursor damage needs a cursor, and so on).
fn applies(kind: MangleKind, command: &str, reply: &Document) -> bool {
    let ok = matches!(reply.get("ok"), Some(Bson::Double(x)) if *x == 1.0);
    match kind {
        MangleKind::WriteErrorsMalformed => ok && WRITE_COMMANDS.contains(&command),
        MangleKind::WriteConcernErrorMalformed => {
            ok && (WRITE_COMMANDS.contains(&command)
                || command == "findAndModify"
                || command == "bulkWrite")
        }
        MangleKind::CursorIdMalformed
        | MangleKind::CursorBatchMalformed
        | MangleKind::CursorNamespaceMalformed => ok && reply.get_document("cursor").is_ok(),
        _ => true,
    }
}

impl Plan {
    pub(crate) fn kind(&self) -> MangleKind {
        self.kind
    }

    /// Applies document damage (frame kinds leave the document alone).
    pub(crate) fn apply_to_document(&mut self, reply: Document) -> Document {
        let rng = &mut self.rng;
        match self.kind {
            MangleKind::ErrorCodeWrongType => {
                let mut e = error_reply(rng);
                e.insert("code", pick(rng, wrong_type_codes()));
                e
            }
            MangleKind::ErrorCodeMissing => {
                let mut e = error_reply(rng);
                e.remove("code");
                if rng.random_bool(0.5) {
                    e.remove("codeName");
                }
                e
            }
            MangleKind::ErrorLabelsNotArray => {
                let mut e = error_reply(rng);
                let labels = pick(
                    rng,
                    vec![
                        Bson::String("RetryableError".into()),
                        Bson::Document(
                            doc! { "0": "RetryableError", "1": "SystemOverloadedError" },
                        ),
                        Bson::Int32(1),
                        Bson::Null,
                        Bson::Boolean(true),
                    ],
                );
                e.insert("errorLabels", labels);
                e
            }
            MangleKind::ErrorLabelsNonStrings => {
                let mut e = error_reply(rng);
                let mut labels: Vec<Bson> = vec![
                    "RetryableError".into(),
                    Bson::Int32(7),
                    Bson::Document(doc! { "label": "SystemOverloadedError" }),
                    Bson::Null,
                    "SystemOverloadedError".into(),
                    Bson::Array(vec!["RetryableWriteError".into()]),
                ];
                // Keep a random non-empty prefix that holds at least one non-string.
                let keep = rng.random_range(2..=labels.len());
                labels.truncate(keep);
                e.insert("errorLabels", labels);
                e
            }
            MangleKind::BaseBackoffAnyType => {
                let mut e = overload_error();
                e.insert("baseBackoffMS", pick(rng, every_bson_type()));
                e
            }
            MangleKind::WriteErrorsMalformed => {
                let mut r = reply;
                let bad = pick(
                    rng,
                    vec![
                        Bson::String("duplicate key".into()),
                        Bson::Int32(1),
                        Bson::Document(doc! { "index": 0, "code": 11000 }),
                        Bson::Array(vec![Bson::String("E11000".into())]),
                        Bson::Array(vec![Bson::Document(
                            doc! { "index": 0, "errmsg": "no code" },
                        )]),
                        Bson::Array(vec![Bson::Document(
                            doc! { "index": 0, "code": "11000", "errmsg": "code as string" },
                        )]),
                        Bson::Array(vec![Bson::Document(
                            doc! { "index": "0", "code": 11000, "errmsg": "index as string" },
                        )]),
                        Bson::Array(vec![Bson::Document(
                            doc! { "index": 0, "code": 11000.5, "errmsg": "fractional code" },
                        )]),
                        Bson::Array(vec![Bson::Null]),
                    ],
                );
                r.insert("writeErrors", bad);
                r
            }
            MangleKind::WriteConcernErrorMalformed => {
                let mut r = reply;
                let bad = pick(
                    rng,
                    vec![
                        Bson::String("waiting for replication timed out".into()),
                        Bson::Int32(64),
                        Bson::Array(vec![Bson::Int32(64)]),
                        Bson::Document(doc! { "errmsg": "no code" }),
                        Bson::Document(doc! { "code": "64", "errmsg": "code as string" }),
                        Bson::Document(doc! { "code": 64, "errmsg": 5 }),
                        Bson::Document(doc! { "code": 64, "errmsg": "bad errInfo", "errInfo": 3 }),
                        Bson::Document(doc! { "code": Bson::Null }),
                    ],
                );
                r.insert("writeConcernError", bad);
                r
            }
            MangleKind::CursorIdMalformed => {
                let mut r = reply;
                let mut cursor = r.get_document("cursor").cloned().unwrap_or_default();
                match rng.random_range(0..4u8) {
                    0 => {
                        cursor.remove("id");
                    }
                    1 => {
                        cursor.insert("id", "0");
                    }
                    2 => {
                        cursor.insert("id", doc! { "id": 0i64 });
                    }
                    _ => {
                        cursor.insert("id", Bson::Null);
                    }
                }
                r.insert("cursor", cursor);
                r
            }
            MangleKind::CursorBatchMalformed => {
                let mut r = reply;
                let mut cursor = r.get_document("cursor").cloned().unwrap_or_default();
                let batch_key = if cursor.contains_key("nextBatch") {
                    "nextBatch"
                } else {
                    "firstBatch"
                };
                match rng.random_range(0..4u8) {
                    0 => {
                        cursor.remove(batch_key);
                    }
                    1 => {
                        cursor.insert(batch_key, "documents");
                    }
                    2 => {
                        cursor.insert(batch_key, vec![Bson::Int32(1), Bson::String("x".into())]);
                    }
                    _ => {
                        let not_a_document = pick(
                            rng,
                            vec![
                                Bson::String("cursor".into()),
                                Bson::Int64(0),
                                Bson::Array(vec![]),
                            ],
                        );
                        r.insert("cursor", not_a_document);
                        return r;
                    }
                }
                r.insert("cursor", cursor);
                r
            }
            MangleKind::CursorNamespaceMalformed => {
                let mut r = reply;
                let mut cursor = r.get_document("cursor").cloned().unwrap_or_default();
                match rng.random_range(0..3u8) {
                    0 => {
                        cursor.remove("ns");
                    }
                    1 => {
                        cursor.insert("ns", 42);
                    }
                    _ => {
                        cursor.insert("ns", doc! { "db": "x" });
                    }
                }
                r.insert("cursor", cursor);
                r
            }
            MangleKind::OkOddType => {
                let mut r = reply;
                let odd = pick(
                    rng,
                    vec![
                        None,
                        Some(Bson::String("1".into())),
                        Some(Bson::Boolean(true)),
                        Some(Bson::Null),
                        Some(Bson::Document(doc! { "ok": 1 })),
                        Some(Bson::Array(vec![Bson::Int32(1)])),
                        Some(Bson::Double(f64::NAN)),
                        Some(Bson::Double(1.5)),
                        Some(Bson::Int64(2)),
                        Some(Bson::Int32(-1)),
                        Some(Bson::Decimal128(bson::Decimal128::from_bytes([0u8; 16]))),
                    ],
                );
                match odd {
                    Some(v) => {
                        r.insert("ok", v);
                    }
                    None => {
                        r.remove("ok");
                    }
                }
                r
            }
            _ => reply,
        }
    }

    /// Applies frame damage to the encoded reply; returns the bytes to send and what to do
    /// afterwards. Document kinds send the frame as is and keep the connection.
    pub(crate) fn apply_to_frame(&mut self, mut bytes: Vec<u8>) -> (Vec<u8>, After) {
        let rng = &mut self.rng;
        let len = bytes.len();
        let set_length = |bytes: &mut Vec<u8>, value: i32| {
            if bytes.len() >= 4 {
                bytes[..4].copy_from_slice(&value.to_le_bytes());
            }
        };
        match self.kind {
            MangleKind::Truncated => {
                bytes.truncate(rng.random_range(0..len.max(1)));
                (bytes, After::Close)
            }
            MangleKind::LengthTooLong => {
                let claimed = match rng.random_range(0..3u8) {
                    0 => len as i64 + rng.random_range(1..=64),
                    1 => len as i64 + rng.random_range(65..=1_000_000),
                    _ => i64::from(wire::MAX_MESSAGE_SIZE_BYTES) + rng.random_range(1..=1_000_000),
                };
                set_length(&mut bytes, i32::try_from(claimed).unwrap_or(i32::MAX));
                (bytes, After::Close)
            }
            MangleKind::LengthTooShort => {
                let claimed = match rng.random_range(0..3u8) {
                    0 => rng.random_range(HEADER_LEN as i64..len as i64),
                    1 => rng.random_range(0..HEADER_LEN as i64),
                    _ => -rng.random_range(1..=i64::from(i32::MAX)),
                };
                set_length(&mut bytes, i32::try_from(claimed).unwrap_or(0));
                (bytes, After::Close)
            }
            MangleKind::WrongOpcode => {
                let opcode = pick(
                    rng,
                    vec![
                        wire::OP_REPLY,
                        wire::OP_COMPRESSED,
                        wire::OP_QUERY,
                        0,
                        -1,
                        9999,
                    ],
                );
                if bytes.len() >= HEADER_LEN {
                    bytes[12..16].copy_from_slice(&opcode.to_le_bytes());
                }
                (bytes, After::Close)
            }
            MangleKind::UnknownRequiredFlags => {
                // Bits 2..=15 are required-to-understand; none is defined for replies.
                let bit = rng.random_range(2..16u32);
                if bytes.len() >= HEADER_LEN + 4 {
                    let flags = u32::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19]])
                        | (1 << bit);
                    bytes[16..20].copy_from_slice(&flags.to_le_bytes());
                }
                (bytes, After::Close)
            }
            MangleKind::ByteFlips => {
                for _ in 0..rng.random_range(1..=4u8) {
                    let at = rng.random_range(0..len.max(1));
                    if let Some(byte) = bytes.get_mut(at) {
                        *byte ^= rng.random_range(1..=255u8);
                    }
                }
                (bytes, After::Close)
            }
            MangleKind::Stall => {
                bytes.truncate(rng.random_range(0..len.max(1)));
                (bytes, After::Stall)
            }
            _ => (bytes, After::Continue),
        }
    }
}

/// After a `stall` frame: sends nothing more and discards whatever the client sends, until it
/// closes the connection, the emulator stops, or [`STALL_LIMIT`] passes (so a client that never
/// gives up cannot hold the task for ever).
pub(crate) async fn stall<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut R,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::AsyncReadExt;
    let drain = async {
        let mut sink = [0u8; 4096];
        // Ends at end of stream or an error; every iteration consumes bytes, and the whole
        // loop is bounded by STALL_LIMIT below.
        while let Ok(n) = reader.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    };
    tokio::select! {
        _ = tokio::time::timeout(STALL_LIMIT, drain) => {}
        _ = shutdown.changed() => {}
    }
}

fn pick<T: Clone>(rng: &mut StdRng, choices: Vec<T>) -> T {
    let i = rng.random_range(0..choices.len().max(1));
    choices[i.min(choices.len().saturating_sub(1))].clone()
}

/// An error reply with well-formed fields, which the error kinds then damage: an overload error
/// (retryable by backpressure), a retryable-write error, or a plain error.
fn error_reply(rng: &mut StdRng) -> Document {
    match rng.random_range(0..3u8) {
        0 => overload_error(),
        1 => doc! {
            "ok": 0.0,
            "errmsg": "interrupted at shutdown (mangled reply)",
            "code": 11600,
            "codeName": "InterruptedAtShutdown",
            "errorLabels": ["RetryableWriteError"],
        },
        _ => doc! {
            "ok": 0.0,
            "errmsg": "bad value (mangled reply)",
            "code": 2,
            "codeName": "BadValue",
        },
    }
}

fn overload_error() -> Document {
    doc! {
        "ok": 0.0,
        "errmsg": "server overloaded (mangled reply)",
        "code": 462,
        "codeName": "IngressRequestRateLimitExceeded",
        "errorLabels": ["RetryableError", "SystemOverloadedError"],
    }
}

fn wrong_type_codes() -> Vec<Bson> {
    vec![
        Bson::String("462".into()),
        Bson::Double(462.5),
        Bson::Double(f64::NAN),
        Bson::Document(doc! { "code": 462 }),
        Bson::Array(vec![Bson::Int32(462)]),
        Bson::Null,
        Bson::Boolean(true),
        Bson::Int64(i64::MAX),
        Bson::Int64(i64::from(i32::MIN) - 1),
    ]
}

/// One value of every BSON type the `bson` crate can build (DBPointer cannot be), with odd
/// values for the numeric ones.
fn every_bson_type() -> Vec<Bson> {
    vec![
        Bson::Double(1.5),
        Bson::Double(-100.0),
        Bson::Double(f64::NAN),
        Bson::Double(f64::INFINITY),
        Bson::Double(f64::NEG_INFINITY),
        Bson::Double(1e300),
        Bson::Double(0.0),
        Bson::String("100".into()),
        Bson::Document(doc! { "ms": 100 }),
        Bson::Array(vec![Bson::Int32(100)]),
        Bson::Binary(Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![0, 100],
        }),
        Bson::Undefined,
        Bson::ObjectId(ObjectId::from_bytes([7; 12])),
        Bson::Boolean(true),
        Bson::DateTime(bson::DateTime::from_millis(100)),
        Bson::Null,
        Bson::RegularExpression(bson::Regex {
            pattern: "100".into(),
            options: String::new(),
        }),
        Bson::JavaScriptCode("100".into()),
        Bson::JavaScriptCodeWithScope(bson::JavaScriptCodeWithScope {
            code: "ms".into(),
            scope: doc! { "ms": 100 },
        }),
        Bson::Symbol("ms".into()),
        Bson::Int32(i32::MIN),
        Bson::Int32(-1),
        Bson::Int32(i32::MAX),
        Bson::Timestamp(Timestamp {
            time: 100,
            increment: 1,
        }),
        Bson::Int64(i64::MIN),
        Bson::Int64(i64::MAX),
        Bson::Decimal128(bson::Decimal128::from_bytes([0xff; 16])),
        Bson::MaxKey,
        Bson::MinKey,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(kinds: Vec<MangleKind>) -> MangleConfig {
        MangleConfig {
            seed: 7,
            share: 1.0,
            kinds,
            log: true,
            ..Default::default()
        }
    }

    fn insert_reply() -> Document {
        doc! { "n": 1, "ok": 1.0 }
    }

    #[test]
    fn configuration_round_trips_and_refuses_bad_fields() {
        let d = doc! { "seed": 3, "share": 0.25, "kinds": ["truncated", "okOddType"], "appName": "x", "commands": ["find"], "log": true, "logLimit": 10 };
        let c = MangleConfig::from_document(&d).unwrap().unwrap();
        assert_eq!(c.kinds, vec![MangleKind::Truncated, MangleKind::OkOddType]);
        assert_eq!(
            MangleConfig::from_document(&c.to_document()).unwrap(),
            Some(c)
        );
        assert_eq!(MangleConfig::from_document(&doc! {}).unwrap(), None);
        for bad in [
            doc! { "share": 1.5 },
            doc! { "share": "half" },
            doc! { "kinds": ["nope"] },
            doc! { "sede": 1 },
            doc! { "logLimit": -1 },
        ] {
            let e = MangleConfig::from_document(&bad).unwrap_err();
            assert!(e.to_string().starts_with("invalid labMangleReplies"), "{e}");
        }
    }

    #[test]
    fn every_kind_name_round_trips() {
        for k in MangleKind::ALL {
            assert_eq!(MangleKind::from_name(k.name()), Some(k));
        }
    }

    #[test]
    fn schedule_is_seeded_and_filters_commands_and_app_names() {
        let run = |seed: u64| {
            let m = Mangler::default();
            m.configure(Some(MangleConfig {
                seed,
                share: 0.5,
                app_name: Some("fuzz".into()),
                ..config(vec![])
            }));
            let facts = RequestFacts::of(&doc! { "insert": "c", "comment": "op1" });
            let kinds: Vec<Option<MangleKind>> = (0..200)
                .map(|_| {
                    m.plan(&facts, Some("fuzz"), &insert_reply(), false)
                        .map(|p| p.kind())
                })
                .collect();
            (kinds, m)
        };
        let (a, m) = run(1);
        let (b, _) = run(1);
        let (c, _) = run(2);
        assert_eq!(a, b, "same seed, same schedule");
        assert_ne!(a, c, "another seed, another schedule");
        let mangled = a.iter().flatten().count();
        assert!(
            (60..140).contains(&mangled),
            "about half mangled: {mangled}"
        );
        assert_eq!(m.report().qualifying, 200);
        assert_eq!(m.report().mangled(), mangled as u64);
        assert_eq!(m.take_log().len(), 200);
        // Another application, the handshake, a streamed reply: never.
        let facts = RequestFacts::of(&doc! { "insert": "c" });
        assert!(m
            .plan(&facts, Some("other"), &insert_reply(), false)
            .is_none());
        assert!(m.plan(&facts, None, &insert_reply(), false).is_none());
        assert!(m
            .plan(&facts, Some("fuzz"), &insert_reply(), true)
            .is_none());
        let hello = RequestFacts::of(&doc! { "hello": 1 });
        assert!(m
            .plan(&hello, Some("fuzz"), &doc! { "ok": 1.0 }, false)
            .is_none());
    }

    #[test]
    fn kinds_that_do_not_fit_the_reply_are_not_drawn() {
        let m = Mangler::default();
        m.configure(Some(config(vec![MangleKind::CursorIdMalformed])));
        let facts = RequestFacts::of(&doc! { "insert": "c" });
        assert!(m.plan(&facts, None, &insert_reply(), false).is_none());
        let find = RequestFacts::of(&doc! { "find": "c" });
        let reply = doc! { "cursor": { "id": 0i64, "ns": "d.c", "firstBatch": [] }, "ok": 1.0 };
        assert!(m.plan(&find, None, &reply, false).is_some());
    }

    #[test]
    fn document_damage_leaves_no_readable_success() {
        // Every document kind, many draws: the damaged reply is never an intact success.
        for kind in MangleKind::ALL.into_iter().filter(|k| !k.is_frame()) {
            let m = Mangler::default();
            m.configure(Some(config(vec![kind])));
            let (command, reply) = match kind {
                MangleKind::CursorIdMalformed
                | MangleKind::CursorBatchMalformed
                | MangleKind::CursorNamespaceMalformed => (
                    "find",
                    doc! { "cursor": { "id": 5i64, "ns": "d.c", "firstBatch": [{ "a": 1 }] }, "ok": 1.0 },
                ),
                _ => ("insert", insert_reply()),
            };
            let facts = RequestFacts::of(&doc! { command: "c" });
            for _ in 0..100 {
                let mut plan = m
                    .plan(&facts, None, &reply, false)
                    .expect("share 1 mangles");
                let damaged = plan.apply_to_document(reply.clone());
                assert_ne!(damaged, reply, "{kind:?} changed nothing");
                let intact_ok = matches!(damaged.get("ok"), Some(Bson::Double(x)) if *x == 1.0);
                match kind {
                    MangleKind::WriteErrorsMalformed => {
                        assert!(damaged.contains_key("writeErrors"))
                    }
                    MangleKind::WriteConcernErrorMalformed => {
                        assert!(damaged.contains_key("writeConcernError"))
                    }
                    MangleKind::CursorIdMalformed
                    | MangleKind::CursorBatchMalformed
                    | MangleKind::CursorNamespaceMalformed => {}
                    _ => assert!(!intact_ok, "{kind:?} left ok: 1: {damaged}"),
                }
                // Whatever the damage, the document still encodes (frame damage is separate).
                wire::encode_op_msg(1, 1, 0, &damaged).expect("encodes");
            }
        }
    }

    #[test]
    fn frame_damage_breaks_the_frame() {
        let reply = doc! { "n": 1, "ok": 1.0 };
        let frame = wire::encode_op_msg(1, 1, 0, &reply).unwrap();
        for kind in MangleKind::ALL.into_iter().filter(|k| k.is_frame()) {
            let m = Mangler::default();
            m.configure(Some(config(vec![kind])));
            let facts = RequestFacts::of(&doc! { "insert": "c" });
            for _ in 0..200 {
                let mut plan = m.plan(&facts, None, &reply, false).unwrap();
                let (bytes, after) = plan.apply_to_frame(frame.clone());
                assert_ne!(after, After::Continue, "{kind:?} keeps a broken stream");
                if kind.verdict() == Verdict::MustFail {
                    // The emulator's own decoder refuses it too (or it is incomplete).
                    assert!(
                        wire::decode_message(&bytes).is_err() || bytes.len() < frame.len(),
                        "{kind:?} left a decodable frame"
                    );
                }
            }
        }
    }
}
