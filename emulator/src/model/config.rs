//! [`ModelConfig`]: every knob of the load-shedding model, deserializable from a BSON document.

use bson::{Bson, Document};
use serde::{Deserialize, Serialize};

/// Commands the ingress limiter never limits, by default.
pub const DEFAULT_EXEMPT_COMMANDS: &[&str] = &[
    "hello",
    "isMaster",
    "ismaster",
    "configureFailPoint",
    "getParameter",
    "setParameter",
    "serverStatus",
    "buildInfo",
    "endSessions",
    "killAllSessions",
    "ping",
];

/// A configuration value the model cannot work with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The document does not have the expected shape (unknown field, wrong type, negative
    /// integer where a count is expected, ...).
    #[error("invalid labOverload configuration: {0}")]
    Shape(String),
    /// A field has the right type but an unusable value.
    #[error("invalid labOverload configuration: {field}: {reason}")]
    Value {
        /// Dotted path of the field, in the document's spelling (e.g. `limiter.ratePerSec`).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// How the ticket pools are sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TicketMode {
    /// `read` and `write` tickets, always.
    Fixed,
    /// Throughput probing moves both pools between `probing.min` and `probing.max`.
    Probing,
}

/// Which waiter a released ticket wakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Wakeup {
    /// A random waiter (seeded), which then races new arrivals for the ticket (mongod 8.0).
    Random,
    /// The longest-waiting waiter, and the ticket is handed to it: new arrivals queue behind
    /// waiters (a fair queue, for comparison).
    Fifo,
}

/// The whole model. `Default` is "model off": every request passes straight through.
///
/// Field names in documents are the camelCase spelling of the Rust names (`ratePerSec`,
/// `maxQueueDepth`, ...). Missing fields take their defaults; unknown fields are errors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Master switch. Off: no limiter, no tickets, no cores, no cost.
    pub enabled: bool,
    /// Seed of the random wake-up order of ticket waiters and of random rejections.
    pub seed: u64,
    /// Share of data requests (any kind but [`super::CommandKind::Command`]) that the model
    /// would otherwise admit and rejects at random instead, in [0, 1]: a transient overload
    /// error (462 with `SystemOverloadedError` and `RetryableError`). A request with a lab id
    /// (`comment.labReq`) draws from a hash of `seed`, the id and its attempt number, so every
    /// lab variant meets the same rejections; others draw from a generator seeded with `seed`.
    /// 0 (the default) never draws.
    pub random_reject_share: f64,
    /// Ingress request rate limiter (code 462).
    pub limiter: LimiterConfig,
    /// Read and write ticket pools (code 433 when the waiter queue is bounded and full).
    pub tickets: TicketConfig,
    /// Number of virtual cores.
    pub cores: u32,
    /// Longest slice of work done on a core before it is handed to the next runnable request
    /// (round-robin time sharing), in ms.
    pub quantum_ms: f64,
    /// Work yields (gives back its ticket and core, then queues again) after this much work, in
    /// ms. Transaction statements never yield.
    pub yield_period_ms: f64,
    /// Cost of each kind of command in ms of core time.
    pub costs: CostConfig,
    /// Stop a request whose client has disconnected at its next interrupt point, as mongod
    /// does for operations marked kill-on-client-disconnect: reads (`find`, `count`,
    /// `distinct`, an `aggregate` without `$out`/`$merge`) and authentication. Writes are never
    /// marked and run to the end. The client is checked at interrupt points only, at most once
    /// every `interruptCheckMs` and not before `interruptCheckMs` after execution starts
    /// (mongod's `_checkClientConnected`). Off: every request runs to the end. Work done for a
    /// gone client is counted as wasted either way.
    pub kill_on_client_disconnect: bool,
    /// How often a request waiting for a ticket wakes to check for interruption besides its
    /// deadline (mongod's ticket semaphore wakes every 500 ms ± 20 %), and the least time
    /// between two client-connected checks of one request (mongod: 500 ms), in ms.
    pub interrupt_check_ms: u64,
    /// Deadline of a request that carries no `maxTimeMS`, in ms from arrival, so that no wait is
    /// unbounded. Expiry is reported like maxTimeMS (code 50).
    pub safety_time_limit_ms: u64,
    /// `baseBackoffMS` attached to 462 and 433 rejections when > 0 (mongod's
    /// `externalClientBaseBackoffMS`).
    pub base_backoff_ms: u64,
    /// Length of the per-second time series, in seconds (samples kept).
    pub series_capacity_secs: u32,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            enabled: false,
            seed: 4,
            random_reject_share: 0.0,
            limiter: LimiterConfig::default(),
            tickets: TicketConfig::default(),
            cores: 2,
            quantum_ms: 1.0,
            yield_period_ms: 10.0,
            costs: CostConfig::default(),
            kill_on_client_disconnect: false,
            interrupt_check_ms: 500,
            safety_time_limit_ms: 600_000,
            base_backoff_ms: 0,
            series_capacity_secs: 3600,
        }
    }
}

/// The ingress token bucket (mongod's `ingressRequestRateLimiter*` parameters).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct LimiterConfig {
    /// Limit requests at all.
    pub enabled: bool,
    /// Tokens added per second (`ingressRequestAdmissionRatePerSec`).
    pub rate_per_sec: f64,
    /// Bucket size in seconds of rate (`ingressRequestAdmissionBurstCapacitySecs`); the bucket
    /// holds `max(1, ratePerSec × burstCapacitySecs)` tokens and starts full.
    pub burst_capacity_secs: f64,
    /// Requests that may wait for a token (`ingressRequestAdmissionMaxQueueDepth`); 0 rejects at
    /// once when the bucket is empty.
    pub max_queue_depth: u64,
    /// Rejections carry `RetryableError` (`ingressRequestRateLimiterAllowRetries`).
    pub allow_retries: bool,
    /// Command names (exact spelling) that bypass the limiter.
    pub exempt_commands: Vec<String>,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        LimiterConfig {
            enabled: false,
            rate_per_sec: 1000.0,
            burst_capacity_secs: 1.0,
            max_queue_depth: 0,
            allow_retries: true,
            exempt_commands: DEFAULT_EXEMPT_COMMANDS
                .iter()
                .map(|s| s.to_string())
                .collect(),
        }
    }
}

/// Read and write tickets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct TicketConfig {
    /// `fixed` or `probing`.
    pub mode: TicketMode,
    /// Read tickets in `fixed` mode.
    pub read: u32,
    /// Write tickets in `fixed` mode.
    pub write: u32,
    /// Most requests waiting for a ticket per pool; a request arriving at a full queue is shed
    /// with 433 AdmissionQueueOverflow. 0 = unbounded. Requests re-queueing after a yield are
    /// never shed.
    pub max_waiters: u64,
    /// Throughput probing parameters (used in `probing` mode).
    pub probing: ProbingConfig,
    /// `random` (default, unfair) or `fifo`.
    pub wakeup: Wakeup,
}

impl Default for TicketConfig {
    fn default() -> Self {
        TicketConfig {
            mode: TicketMode::Fixed,
            read: 128,
            write: 128,
            max_waiters: 0,
            probing: ProbingConfig::default(),
            wakeup: Wakeup::Random,
        }
    }
}

/// Throughput probing: every interval compare throughput with its moving average and move the
/// ticket count of both pools by `stepFraction` of its current value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct ProbingConfig {
    /// Tickets per pool at start; 0 = the number of virtual cores.
    pub initial: u32,
    /// Fewest tickets per pool.
    pub min: u32,
    /// Most tickets per pool.
    pub max: u32,
    /// Step as a fraction of the current count (at least one ticket).
    pub step_fraction: f64,
    /// Weight of the newest interval in the throughput moving average.
    pub ema_weight: f64,
    /// Length of one probing interval, in ms.
    pub interval_ms: u64,
}

impl Default for ProbingConfig {
    fn default() -> Self {
        ProbingConfig {
            initial: 0,
            min: 4,
            max: 128,
            step_fraction: 0.1,
            ema_weight: 0.2,
            interval_ms: 100,
        }
    }
}

/// Core time per kind of command, in ms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct CostConfig {
    /// A lookup by `_id`.
    pub point_read_ms: f64,
    /// A read of about 1,000 documents through an index (also each `getMore`).
    pub range_read_ms: f64,
    /// A collection scan.
    pub scan_ms: f64,
    /// An insert, update, delete or other write.
    pub write_ms: f64,
    /// Any other command (hello, commitTransaction, ...); 0 = takes no core and no ticket.
    pub command_ms: f64,
    /// Core time to reject a request with 462 or 433 (the reply waits for it); counted as
    /// wasted work. The default, 0.3 ms (0.15 × `pointReadMs`), is derived in docs/emulator.md
    /// ("What a rejection costs"); mongod pays for every rejection, so the model does too.
    pub rejection_ms: f64,
    /// Core time to stop a request at an interrupt point, once its `maxTimeMS` has passed or
    /// its client has gone: unwind, abort the storage transaction, build the error reply, log
    /// the slow operation (the reply waits for it). Charged on top of the work already done;
    /// counted as wasted work and as `expiryWorkMs`. The default, 0.5 ms (0.25 × `pointReadMs`),
    /// is derived in docs/emulator.md ("What mongod charges").
    pub expiry_ms: f64,
    /// Core time to accept a connection ([`super::Model::connection_opened`]); counted as
    /// overhead work.
    pub connection_ms: f64,
    /// Core time of one authentication conversation (charged to its `saslStart`, or to the
    /// hello carrying `speculativeAuthenticate`): the server's side of SCRAM (user lookup,
    /// nonce, proof check, signature). The default, 2.6 ms, is seed 004's measured price of
    /// opening an authenticated connection in mongod (0.62 ms) in units of its point read
    /// (0.47 ms ↔ `pointReadMs` 2), so that with `connectionMs` at 0 a new authenticated
    /// connection costs what it cost mongod; see docs/emulator.md.
    pub auth_ms: f64,
}

impl Default for CostConfig {
    fn default() -> Self {
        CostConfig {
            point_read_ms: 2.0,
            range_read_ms: 10.0,
            scan_ms: 30.0,
            write_ms: 3.0,
            command_ms: 0.0,
            rejection_ms: 0.3,
            expiry_ms: 0.5,
            connection_ms: 0.0,
            auth_ms: 2.6,
        }
    }
}

const MAX_COUNT: u64 = 1_000_000;
const MAX_COST_MS: f64 = 3_600_000.0;

fn bad(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Value {
        field,
        reason: reason.into(),
    }
}

fn finite_in(
    field: &'static str,
    v: f64,
    lo: f64,
    hi: f64,
    lo_open: bool,
) -> Result<(), ConfigError> {
    if !v.is_finite() {
        return Err(bad(field, format!("must be a finite number, got {v}")));
    }
    let below = if lo_open { v <= lo } else { v < lo };
    if below || v > hi {
        let open = if lo_open { "(" } else { "[" };
        return Err(bad(field, format!("must be in {open}{lo}, {hi}], got {v}")));
    }
    Ok(())
}

fn count_in(field: &'static str, v: u64, lo: u64, hi: u64) -> Result<(), ConfigError> {
    if v < lo || v > hi {
        return Err(bad(field, format!("must be in [{lo}, {hi}], got {v}")));
    }
    Ok(())
}

/// Turns integral doubles into Int64 (mongosh sends every number as a double), recursively.
fn normalize(doc: &Document) -> Document {
    fn value(v: &Bson) -> Bson {
        match v {
            Bson::Double(d) if d.is_finite() && d.fract() == 0.0 && d.abs() < 9.0e15 => {
                Bson::Int64(*d as i64)
            }
            Bson::Document(d) => Bson::Document(normalize(d)),
            Bson::Array(a) => Bson::Array(a.iter().map(value).collect()),
            other => other.clone(),
        }
    }
    doc.iter().map(|(k, v)| (k.clone(), value(v))).collect()
}

/// Finds the first field of `doc` that does not deserialize on its own, as a dotted path.
fn locate<T: serde::de::DeserializeOwned>(
    doc: &Document,
    prefix: &str,
) -> Option<(String, String)> {
    for (k, v) in doc {
        let path = format!("{prefix}{k}");
        let alone: Document = [(k.clone(), v.clone())].into_iter().collect();
        let Err(e) = bson::from_document::<T>(alone) else {
            continue;
        };
        let inner = match (path.as_str(), v) {
            ("limiter", Bson::Document(d)) => locate::<LimiterConfig>(d, "limiter."),
            ("tickets", Bson::Document(d)) => locate::<TicketConfig>(d, "tickets."),
            ("tickets.probing", Bson::Document(d)) => {
                locate::<ProbingConfig>(d, "tickets.probing.")
            }
            ("costs", Bson::Document(d)) => locate::<CostConfig>(d, "costs."),
            _ => None,
        };
        return Some(inner.unwrap_or((path, e.to_string())));
    }
    None
}

fn merge(base: &mut Document, overlay: &Document) {
    for (k, v) in overlay {
        match (base.get_mut(k), v) {
            (Some(Bson::Document(b)), Bson::Document(o)) => merge(b, o),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

impl ModelConfig {
    /// Parses a full configuration (missing fields take defaults) and validates it.
    pub fn from_document(doc: &Document) -> Result<ModelConfig, ConfigError> {
        let doc = normalize(doc);
        let cfg: ModelConfig = bson::from_document(doc.clone()).map_err(|e| {
            ConfigError::Shape(match locate::<ModelConfig>(&doc, "") {
                Some((field, why)) => format!("{field}: {why}"),
                None => e.to_string(),
            })
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// This configuration with the fields present in `changes` replaced (nested documents merge
    /// field by field), validated. For `setParameter`-style partial updates.
    pub fn merged(&self, changes: &Document) -> Result<ModelConfig, ConfigError> {
        let mut base = self.to_document();
        merge(&mut base, &normalize(changes));
        ModelConfig::from_document(&base)
    }

    /// The configuration as a document (the shape [`ModelConfig::from_document`] reads).
    pub fn to_document(&self) -> Document {
        // Every field is a number, bool, string or list, and no u64 field can exceed i64::MAX
        // after validation, so this cannot fail for a validated configuration; fall back to an
        // empty document rather than panic for an unvalidated one.
        bson::to_document(self).unwrap_or_default()
    }

    /// Checks every value; the model only ever runs with a configuration that passed.
    pub fn validate(&self) -> Result<(), ConfigError> {
        count_in("cores", u64::from(self.cores), 1, 1024)?;
        finite_in(
            "randomRejectShare",
            self.random_reject_share,
            0.0,
            1.0,
            false,
        )?;
        finite_in("quantumMs", self.quantum_ms, 0.0, 1000.0, true)?;
        finite_in(
            "yieldPeriodMs",
            self.yield_period_ms,
            0.0,
            MAX_COST_MS,
            true,
        )?;
        count_in(
            "safetyTimeLimitMs",
            self.safety_time_limit_ms,
            1,
            86_400_000,
        )?;
        count_in("baseBackoffMs", self.base_backoff_ms, 0, 86_400_000)?;
        count_in("interruptCheckMs", self.interrupt_check_ms, 1, 60_000)?;
        count_in(
            "seriesCapacitySecs",
            u64::from(self.series_capacity_secs),
            1,
            86_400,
        )?;
        let l = &self.limiter;
        finite_in("limiter.ratePerSec", l.rate_per_sec, 0.0, 1.0e9, true)?;
        finite_in(
            "limiter.burstCapacitySecs",
            l.burst_capacity_secs,
            0.0,
            86_400.0,
            false,
        )?;
        count_in("limiter.maxQueueDepth", l.max_queue_depth, 0, MAX_COUNT)?;
        if l.exempt_commands.len() > 1000 {
            return Err(bad("limiter.exemptCommands", "at most 1000 names"));
        }
        let t = &self.tickets;
        count_in("tickets.read", u64::from(t.read), 1, MAX_COUNT)?;
        count_in("tickets.write", u64::from(t.write), 1, MAX_COUNT)?;
        count_in("tickets.maxWaiters", t.max_waiters, 0, MAX_COUNT)?;
        let p = &t.probing;
        count_in("tickets.probing.min", u64::from(p.min), 1, 10_000)?;
        count_in(
            "tickets.probing.max",
            u64::from(p.max),
            u64::from(p.min),
            10_000,
        )?;
        if p.initial != 0 {
            count_in(
                "tickets.probing.initial",
                u64::from(p.initial),
                u64::from(p.min),
                u64::from(p.max),
            )?;
        }
        finite_in(
            "tickets.probing.stepFraction",
            p.step_fraction,
            0.0,
            1.0,
            true,
        )?;
        finite_in("tickets.probing.emaWeight", p.ema_weight, 0.0, 1.0, true)?;
        count_in("tickets.probing.intervalMs", p.interval_ms, 1, 3_600_000)?;
        let c = &self.costs;
        finite_in(
            "costs.pointReadMs",
            c.point_read_ms,
            0.0,
            MAX_COST_MS,
            false,
        )?;
        finite_in(
            "costs.rangeReadMs",
            c.range_read_ms,
            0.0,
            MAX_COST_MS,
            false,
        )?;
        finite_in("costs.scanMs", c.scan_ms, 0.0, MAX_COST_MS, false)?;
        finite_in("costs.writeMs", c.write_ms, 0.0, MAX_COST_MS, false)?;
        finite_in("costs.commandMs", c.command_ms, 0.0, MAX_COST_MS, false)?;
        finite_in("costs.rejectionMs", c.rejection_ms, 0.0, MAX_COST_MS, false)?;
        finite_in("costs.expiryMs", c.expiry_ms, 0.0, MAX_COST_MS, false)?;
        finite_in(
            "costs.connectionMs",
            c.connection_ms,
            0.0,
            MAX_COST_MS,
            false,
        )?;
        finite_in("costs.authMs", c.auth_ms, 0.0, MAX_COST_MS, false)?;
        Ok(())
    }

    /// Tokens the ingress bucket holds when full.
    pub fn burst_tokens(&self) -> f64 {
        (self.limiter.rate_per_sec * self.limiter.burst_capacity_secs).max(1.0)
    }

    /// Tickets per pool when probing starts.
    pub fn probing_initial(&self) -> u32 {
        let p = &self.tickets.probing;
        let start = if p.initial == 0 {
            self.cores
        } else {
            p.initial
        };
        start.clamp(p.min, p.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn default_is_off_and_valid() {
        let c = ModelConfig::default();
        assert!(!c.enabled);
        c.validate().unwrap();
        assert_eq!(ModelConfig::from_document(&doc! {}).unwrap(), c);
        assert_eq!(ModelConfig::from_document(&c.to_document()).unwrap(), c);
        assert!(c.limiter.exempt_commands.iter().any(|n| n == "ping"));
    }

    #[test]
    fn parses_camel_case_and_mongosh_doubles() {
        let c = ModelConfig::from_document(&doc! {
            "enabled": true,
            "cores": 4.0,
            "limiter": { "enabled": true, "ratePerSec": 100, "maxQueueDepth": 10.0 },
            "tickets": { "mode": "probing", "maxWaiters": 5 },
            "costs": { "pointReadMs": 7 },
        })
        .unwrap();
        assert!(c.enabled);
        assert_eq!(c.cores, 4);
        assert_eq!(c.limiter.rate_per_sec, 100.0);
        assert_eq!(c.limiter.max_queue_depth, 10);
        assert_eq!(c.tickets.mode, TicketMode::Probing);
        assert_eq!(c.costs.point_read_ms, 7.0);
        assert_eq!(c.probing_initial(), 4);
        // 0 and 1 are integral, so arrive as Int64 after normalisation; still accepted.
        for (share, want) in [
            (bson::Bson::Int32(1), 1.0),
            (bson::Bson::Double(0.05), 0.05),
        ] {
            let c = ModelConfig::from_document(&doc! { "randomRejectShare": share }).unwrap();
            assert_eq!(c.random_reject_share, want);
        }
    }

    #[test]
    fn merge_keeps_other_fields() {
        let base = ModelConfig {
            cores: 8,
            ..ModelConfig::default()
        };
        let c = base
            .merged(&doc! { "limiter": { "ratePerSec": 5 } })
            .unwrap();
        assert_eq!(c.cores, 8);
        assert_eq!(c.limiter.rate_per_sec, 5.0);
        assert!(!c.limiter.enabled);
    }

    #[test]
    fn bad_values_are_clear_errors() {
        let cases = [
            (
                doc! { "limiter": { "ratePerSec": -1 } },
                "limiter.ratePerSec",
            ),
            (
                doc! { "limiter": { "ratePerSec": f64::NAN } },
                "limiter.ratePerSec",
            ),
            (
                doc! { "limiter": { "burstCapacitySecs": f64::INFINITY } },
                "burstCapacitySecs",
            ),
            (doc! { "cores": 0 }, "cores"),
            (doc! { "randomRejectShare": 1.5 }, "randomRejectShare"),
            (doc! { "randomRejectShare": -0.1 }, "randomRejectShare"),
            (doc! { "randomRejectShare": f64::NAN }, "randomRejectShare"),
            (doc! { "randomRejectShare": "5%" }, "randomRejectShare"),
            (doc! { "quantumMs": 0 }, "quantumMs"),
            (doc! { "costs": { "scanMs": f64::NAN } }, "costs.scanMs"),
            (doc! { "costs": { "writeMs": -3.5 } }, "costs.writeMs"),
            (doc! { "costs": { "expiryMs": -0.5 } }, "costs.expiryMs"),
            (doc! { "costs": { "expiryMs": f64::NAN } }, "costs.expiryMs"),
            (doc! { "costs": { "expiryMs": 1.0e9 } }, "costs.expiryMs"),
            (doc! { "interruptCheckMs": 0 }, "interruptCheckMs"),
            (doc! { "interruptCheckMs": 600_000 }, "interruptCheckMs"),
            (doc! { "interruptCheckMs": -5 }, "interruptCheckMs"),
            (doc! { "tickets": { "read": 0 } }, "tickets.read"),
            (
                doc! { "tickets": { "probing": { "min": 10, "max": 5 } } },
                "tickets.probing.max",
            ),
            (doc! { "cores": -2 }, "cores"),
            (doc! { "cores": "four" }, "cores"),
            (doc! { "bogus": 1 }, "bogus"),
            (doc! { "tickets": { "mode": "lifo" } }, "lifo"),
        ];
        for (d, needle) in cases {
            let err = ModelConfig::from_document(&d).unwrap_err().to_string();
            assert!(err.contains(needle), "{d}: {err}");
        }
    }
}
