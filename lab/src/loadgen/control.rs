//! Control: the lab's own connection to the emulator, which seeds the collection, switches the
//! server model, sets fail points and reads `serverStatus.labOverload`; and the model settings
//! it applies.

use std::collections::BTreeMap;
use std::time::Duration;

use bson::{doc, Bson, Document};
use tokio::time::Instant;

use super::config::{with_options, LabConfig, MODEL_CORES};

/// Database and collection the lab uses.
pub const DB: &str = "lab";
/// Collection of the lab's documents.
pub const COLL: &str = "items";

/// The `labOverload` settings of model mode at `capacity`: the ingress limiter admits
/// `cfg.limiter_share × capacity` per second (off when the share is 0).
pub fn model_document(cfg: &LabConfig, capacity: f64) -> Result<Document, String> {
    let mut d = doc! {
        "enabled": true,
        "seed": cfg.seed as i64,
        "cores": MODEL_CORES as i64,
        "costs": {
            "pointReadMs": 2.0, "rangeReadMs": 5.0, "writeMs": 3.0, "scanMs": 30.0,
        },
        "tickets": { "mode": "fixed", "read": 8i64, "write": 8i64 },
        "limiter": {
            "enabled": cfg.limiter_share > 0.0,
            "ratePerSec": (capacity * cfg.limiter_share).max(1.0),
            "burstCapacitySecs": 0.25,
            "maxQueueDepth": 0i64,
        },
    };
    if cfg.random_reject_share > 0.0 {
        d.insert("randomRejectShare", cfg.random_reject_share);
    }
    if let Some(v) = &cfg.model_overrides {
        let over = bson::to_bson(v).map_err(|e| format!("--model-json: {e}"))?;
        match over {
            Bson::Document(o) => merge(&mut d, &o),
            _ => return Err("--model-json must be a JSON object".into()),
        }
    }
    Ok(d)
}

fn merge(base: &mut Document, over: &Document) {
    for (k, v) in over {
        match (base.get_mut(k), v) {
            (Some(Bson::Document(b)), Bson::Document(o)) => merge(b, o),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

/// The per-member settings of a run over its [`model_document`]: the hot member's limiter
/// rate (`limiter_share × share × capacity`) and cores, if it has its own.
pub fn member_documents(cfg: &LabConfig, capacity: f64) -> Vec<(usize, Document)> {
    match cfg.hot_member {
        Some(h) => {
            let mut d = doc! {
                "limiter": { "ratePerSec": (capacity * h.share * cfg.limiter_share).max(1.0) },
            };
            if let Some(cores) = h.cores {
                d.insert("cores", cores);
            }
            vec![(h.index, d)]
        }
        None => Vec::new(),
    }
}

/// Numeric fields of a document, flattened to dotted keys.
pub fn flatten_numbers(d: &Document) -> BTreeMap<String, f64> {
    fn walk(prefix: &str, d: &Document, out: &mut BTreeMap<String, f64>) {
        for (k, v) in d {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                Bson::Double(x) => {
                    out.insert(key, *x);
                }
                Bson::Int32(x) => {
                    out.insert(key, f64::from(*x));
                }
                Bson::Int64(x) => {
                    out.insert(key, *x as f64);
                }
                Bson::Document(sub) => walk(&key, sub, out),
                _ => {}
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", d, &mut out);
    out
}

/// The name a counter's delta goes by: `counters.X` → `X`, a member's
/// `memberN.counters.X` → `memberN.X`; `None` for figures that are not counters.
fn counter_name(key: &str) -> Option<String> {
    if let Some(rest) = key.strip_prefix("counters.") {
        return Some(rest.to_string());
    }
    let (member, rest) = key.split_once(".counters.")?;
    let index = member.strip_prefix("member")?;
    (!index.is_empty() && index.chars().all(|c| c.is_ascii_digit()))
        .then(|| format!("{member}.{rest}"))
}

/// Deltas of the counters (`counters.*`, and each member's `memberN.counters.*`) between two
/// flattened snapshots.
pub fn counter_deltas(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let name = counter_name(k)?;
            let d = v - before.get(k).copied().unwrap_or(0.0);
            Some((name, d.max(0.0)))
        })
        .collect()
}

/// The flattened `labOverload` figures of a deployment: with one member, its
/// `serverStatus.labOverload`; with several, `counters.*` and `gauges.*` summed over the
/// members (so the run's totals cover the whole deployment), each member's own counters as
/// `memberN.counters.*`, and the other figures (queue-wait percentiles) of the member that
/// answered (the primary).
pub fn deployment_status(status: &Document) -> Option<BTreeMap<String, f64>> {
    let mut out = flatten_numbers(status.get_document("labOverload").ok()?);
    let members: Vec<&Document> = status
        .get_array("labOverloadMembers")
        .map(|a| a.iter().filter_map(|m| m.as_document()).collect())
        .unwrap_or_default();
    if members.len() > 1 {
        out.retain(|k, _| !k.starts_with("counters.") && !k.starts_with("gauges."));
        for (i, m) in members.iter().enumerate() {
            let index = m
                .get_i64("member")
                .ok()
                .and_then(|x| usize::try_from(x).ok())
                .unwrap_or(i);
            for (k, v) in flatten_numbers(m) {
                if k.starts_with("counters.") || k.starts_with("gauges.") {
                    *out.entry(k.clone()).or_insert(0.0) += v;
                }
                if k.starts_with("counters.") {
                    out.insert(format!("member{index}.{k}"), v);
                }
            }
        }
    }
    Some(out)
}

/// The control connection to the emulator (the fork, without lab event handlers).
pub(crate) struct Control {
    pub(crate) client: mongodb::Client,
}

impl Control {
    pub(crate) async fn connect(uri: &str) -> Result<Control, String> {
        let client = mongodb::Client::with_uri_str(with_options(uri, "appName=lab-control"))
            .await
            .map_err(|e| e.to_string())?;
        Ok(Control { client })
    }

    pub(crate) async fn admin(&self, cmd: Document) -> Result<Document, String> {
        self.client
            .database("admin")
            .run_command(cmd)
            .await
            .map_err(|e| e.to_string())
    }

    pub(crate) async fn seed(&self, docs: i64) -> Result<(), String> {
        let coll = self.client.database(DB).collection::<Document>(COLL);
        coll.drop().await.map_err(|e| e.to_string())?;
        let pad = "x".repeat(200);
        let mut batch = Vec::new();
        for i in 0..docs {
            batch.push(doc! { "_id": i, "n": 0i32, "pad": pad.clone() });
            if batch.len() == 1000 || i == docs - 1 {
                coll.insert_many(std::mem::take(&mut batch))
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// Switches every member's server model on or off, keeping its settings.
    pub(crate) async fn set_model_enabled(&self, enabled: bool) -> Result<(), String> {
        self.admin(
            doc! { "setParameter": 1, "labOverloadMembers": { "all": { "enabled": enabled } } },
        )
        .await
        .map(|_| ())
    }

    /// `serverStatus.labOverload`, flattened; `None` when the server has no model section.
    pub(crate) async fn overload_status(&self) -> Option<BTreeMap<String, f64>> {
        let st = self.admin(doc! { "serverStatus": 1 }).await.ok()?;
        deployment_status(&st)
    }

    /// Waits (at most `limit`) until the server model has no request in flight, so that one
    /// variant's leftovers do not load the next. True when idle (or without a model).
    pub(crate) async fn wait_idle(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            // With several members `gauges.inFlight` is their sum.
            let busy = self
                .overload_status()
                .await
                .and_then(|m| m.get("gauges.inFlight").copied())
                .unwrap_or(0.0);
            if busy <= 0.0 {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Switches every member's model off (which resets its figures), then sets `model` on
    /// every member and each `(index, settings)` of `members` over it.
    pub(crate) async fn set_model(
        &self,
        model: &Document,
        members: &[(usize, Document)],
    ) -> Result<(), String> {
        let mut all = doc! { "all": model.clone() };
        for (i, m) in members {
            all.insert(i.to_string(), m.clone());
        }
        self.admin(doc! { "setParameter": 1, "labOverloadMembers": { "all": { "enabled": false } } })
            .await
            .and(
                self.admin(doc! { "setParameter": 1, "labOverloadMembers": all })
                    .await,
            )
            .map(|_| ())
            .map_err(|e| {
                let short = e.split(", labels:").next().unwrap_or(&e).to_string();
                format!("server model not available (setParameter labOverload failed: {short}); use --server failpoint")
            })
    }

    pub(crate) async fn fail_point(&self, probability: f64) -> Result<(), String> {
        let cmd = if probability <= 0.0 {
            doc! { "configureFailPoint": "failCommand", "mode": "off" }
        } else {
            doc! {
                "configureFailPoint": "failCommand",
                "mode": { "activationProbability": probability },
                "data": {
                    "failCommands": ["find", "insert", "update"],
                    "errorCode": 462i32,
                    "errorLabels": ["SystemOverloadedError", "RetryableError"],
                },
            }
        };
        self.admin(cmd).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_members_add_up_and_keep_their_own_counters() {
        let member = |i: i64, rejected: i64, in_flight: i64| {
            doc! {
                "member": i,
                "host": format!("h:{i}"),
                "counters": { "rejected": rejected, "busyCoreMs": 10.0 },
                "gauges": { "inFlight": in_flight },
            }
        };
        let status = doc! {
            "labOverload": {
                "counters": { "rejected": 1i64, "busyCoreMs": 10.0 },
                "gauges": { "inFlight": 0i64 },
                "queueWaitMs": { "p99": 3.0 },
            },
            "labOverloadMembers": [member(0, 1, 0), member(1, 7, 2), member(2, 0, 1)],
        };
        let flat = deployment_status(&status).expect("status");
        assert_eq!(flat.get("counters.rejected"), Some(&8.0));
        assert_eq!(flat.get("counters.busyCoreMs"), Some(&30.0));
        assert_eq!(flat.get("gauges.inFlight"), Some(&3.0));
        assert_eq!(flat.get("member1.counters.rejected"), Some(&7.0));
        assert_eq!(flat.get("queueWaitMs.p99"), Some(&3.0));
        let zero = BTreeMap::new();
        let deltas = counter_deltas(&zero, &flat);
        assert_eq!(deltas.get("rejected"), Some(&8.0));
        assert_eq!(deltas.get("member1.rejected"), Some(&7.0));
        assert!(!deltas.contains_key("inFlight"));
        // One member: its own section, as before.
        let one = doc! {
            "labOverload": { "counters": { "rejected": 2i64 } },
            "labOverloadMembers": [member(0, 2, 0)],
        };
        let flat = deployment_status(&one).expect("status");
        assert_eq!(flat.get("counters.rejected"), Some(&2.0));
        assert!(!flat.contains_key("member0.counters.rejected"));
        assert_eq!(counter_name("memberx.counters.a"), None);
    }
}
