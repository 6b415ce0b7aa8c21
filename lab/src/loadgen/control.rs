//! Control: the lab's own connection to the emulator, which seeds the collection, switches the
//! server model, sets fail points and reads `serverStatus.labOverload`; and the model settings
//! it applies.

use std::collections::BTreeMap;
use std::time::Duration;

use bson::{doc, Bson, Document};
use tokio::time::Instant;

use super::config::{with_options, LabConfig, Persona, ShardLayout, MODEL_CORES};

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

/// The per-member settings of a run over its [`model_document`] (per shard in persona
/// `sharded`): the hot member's limiter rate (`limiter_share × share × capacity`) and cores,
/// if it has its own; in persona `sharded`, the hot shard's limiter rate
/// (`limiter_share × hot_share × capacity`), if it has one.
pub fn member_documents(cfg: &LabConfig, capacity: f64) -> Vec<(usize, Document)> {
    if cfg.persona == Persona::Sharded {
        let layout = &cfg.sharding;
        return match layout.hot_share {
            Some(share) => vec![(
                layout.hot_index,
                doc! {
                    "limiter": { "ratePerSec": (capacity * share * cfg.limiter_share).max(1.0) },
                },
            )],
            None => Vec::new(),
        };
    }
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

/// mongos's server parameter for how often a router retries a shard's overload error
/// (`emulator/src/server/routing.rs`).
const ROUTER_RETRIES_PARAM: &str = "defaultClientMaxRetryAttempts";
/// The emulator's parameter for the labels a router passes a shard's overload error on with:
/// `"shard"` passes the shard's own.
const ROUTER_LABELS_PARAM: &str = "labRouterShardErrorLabels";

/// The router parameters `layout` sets (`setParameter` fields): empty where it leaves mongos's
/// defaults, so that runs without `--router-retries` or `--router-shard-labels` send nothing.
pub fn router_parameters(layout: &ShardLayout) -> Document {
    let mut d = Document::new();
    if let Some(n) = layout.router_retries {
        d.insert(ROUTER_RETRIES_PARAM, i32::try_from(n).unwrap_or(i32::MAX));
    }
    if layout.router_shard_labels {
        d.insert(ROUTER_LABELS_PARAM, "shard");
    }
    d
}

/// Sets `layout`'s router parameters ([`router_parameters`]) on every router of `uri`, each
/// through a direct connection (every mongos has parameters of its own), and reads them back:
/// a router that did not take them fails the run rather than measure mongos's defaults
/// under another name.
pub(crate) async fn set_router_parameters(uri: &str, layout: &ShardLayout) -> Result<(), String> {
    let wanted = router_parameters(layout);
    if wanted.is_empty() {
        return Ok(());
    }
    for host in super::members::member_hosts(uri) {
        let client = mongodb::Client::with_uri_str(format!(
            "mongodb://{host}/?directConnection=true&appName=lab-control"
        ))
        .await
        .map_err(|e| format!("router {host}: {e}"))?;
        let admin = client.database("admin");
        let mut set = doc! { "setParameter": 1 };
        set.extend(wanted.clone());
        let mut get = doc! { "getParameter": 1 };
        get.extend(wanted.keys().map(|k| (k.clone(), Bson::Int32(1))));
        let result = match admin.run_command(set).await {
            Ok(_) => admin.run_command(get).await,
            Err(e) => Err(e),
        };
        client.shutdown().immediate(true).await;
        let got = result.map_err(|e| format!("router {host}: setting {wanted}: {e}"))?;
        for (k, v) in &wanted {
            if got.get(k) != Some(v) {
                return Err(format!(
                    "router {host}: {k} reads {:?} after setting it to {v}",
                    got.get(k)
                ));
            }
        }
    }
    Ok(())
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
/// `memberN.counters.X` → `memberN.X`, a shard's `shardN.counters.X` → `shardN.X`; the
/// routers' counters of a shard keep their names (`routing.X`, `shardN.routing.X`); `None` for
/// figures that are not counters.
fn counter_name(key: &str) -> Option<String> {
    if let Some(rest) = key.strip_prefix("counters.") {
        return Some(rest.to_string());
    }
    if key.starts_with("routing.") {
        return Some(key.to_string());
    }
    let (part, rest) = key.split_once('.')?;
    let (kind, index) = match part.strip_prefix("member") {
        Some(index) => ("member", index),
        None => ("shard", part.strip_prefix("shard")?),
    };
    if index.is_empty() || !index.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    match rest.strip_prefix("counters.") {
        Some(counter) => Some(format!("{part}.{counter}")),
        None => (kind == "shard" && rest.starts_with("routing.")).then(|| key.to_string()),
    }
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
/// answered (the primary). With two or more shards (`serverStatus.labOverloadShards`) the
/// shards' models do the work and the routers' are off, so the sums are over the shards and
/// each shard's counters are `shardN.counters.*`; the routers' requests, overload errors,
/// retries and failures on each shard are `shardN.routing.*`, summed as `routing.*` (where a
/// run's `--router-retries` shows).
pub fn deployment_status(status: &Document) -> Option<BTreeMap<String, f64>> {
    let mut out = flatten_numbers(status.get_document("labOverload").ok()?);
    let listed = |field: &str| -> Vec<&Document> {
        status
            .get_array(field)
            .map(|a| a.iter().filter_map(|m| m.as_document()).collect())
            .unwrap_or_default()
    };
    let shards = listed("labOverloadShards");
    let (parts, index_field, prefix) = if shards.len() > 1 {
        (shards, "shard", "shard")
    } else {
        (listed("labOverloadMembers"), "member", "member")
    };
    if parts.len() > 1 {
        out.retain(|k, _| !k.starts_with("counters.") && !k.starts_with("gauges."));
        for (i, m) in parts.iter().enumerate() {
            let index = m
                .get_i64(index_field)
                .ok()
                .and_then(|x| usize::try_from(x).ok())
                .unwrap_or(i);
            for (k, v) in flatten_numbers(m) {
                if ["counters.", "gauges.", "routing."]
                    .iter()
                    .any(|p| k.starts_with(p))
                {
                    *out.entry(k.clone()).or_insert(0.0) += v;
                }
                if k.starts_with("counters.") || k.starts_with("routing.") {
                    out.insert(format!("{prefix}{index}.{k}"), v);
                }
            }
        }
    }
    Some(out)
}

/// The control connection to the emulator (the fork, without lab event handlers).
pub(crate) struct Control {
    pub(crate) client: mongodb::Client,
    /// The sharded deployment's layout (persona `sharded`): seeding shards the collection
    /// and the server models addressed are the shards'.
    sharding: Option<ShardLayout>,
}

/// The parameter addressing every replica-set member's (or router's) model.
const MEMBER_MODELS: &str = "labOverloadMembers";
/// The parameter addressing every shard's model.
const SHARD_MODELS: &str = "labOverloadShards";

impl Control {
    pub(crate) async fn connect(uri: &str) -> Result<Control, String> {
        let client = mongodb::Client::with_uri_str(with_options(uri, "appName=lab-control"))
            .await
            .map_err(|e| e.to_string())?;
        Ok(Control {
            client,
            sharding: None,
        })
    }

    /// A control connection for `cfg`'s deployment: in persona `sharded` it shards the
    /// collection when seeding and sets the shards' models.
    pub(crate) async fn connect_for(uri: &str, cfg: &LabConfig) -> Result<Control, String> {
        let mut control = Control::connect(uri).await?;
        if cfg.persona == Persona::Sharded {
            control.sharding = Some(cfg.sharding);
        }
        Ok(control)
    }

    /// The parameter that addresses the models doing the work.
    fn models_parameter(&self) -> &'static str {
        if self.sharding.is_some() {
            SHARD_MODELS
        } else {
            MEMBER_MODELS
        }
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
        // Dropping forgets the shard key, so every seeding shards the collection again,
        // before the documents go in (each then lands on its chunk's shard).
        if let Some(layout) = &self.sharding {
            self.shard_collection(layout, docs).await?;
        }
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

    /// Shards the lab's collection on `_id` as a user would through a router: ranged, split
    /// at the layout's split points, chunk `i` moved to shard `i`.
    async fn shard_collection(&self, layout: &ShardLayout, docs: i64) -> Result<(), String> {
        let ns = format!("{DB}.{COLL}");
        // Fewer documents than shards would split twice at the same key.
        if docs < layout.shards as i64 {
            return Err(format!(
                "persona sharded: {docs} documents cannot fill {} shards",
                layout.shards
            ));
        }
        let splits = layout.split_points(docs);
        let mut steps = vec![
            ("enableSharding", doc! { "enableSharding": DB }),
            (
                "shardCollection",
                doc! { "shardCollection": &ns, "key": { "_id": 1 } },
            ),
        ];
        steps.extend(
            splits
                .iter()
                .map(|at| ("split", doc! { "split": &ns, "middle": { "_id": *at } })),
        );
        // The first chunk stays on the primary shard, shard 0; chunk `i` goes to shard `i`.
        steps.extend(splits.iter().enumerate().map(|(i, at)| {
            let to = format!("shard{}", i + 1);
            (
                "moveChunk",
                doc! { "moveChunk": &ns, "find": { "_id": *at }, "to": to },
            )
        }));
        for (what, cmd) in steps {
            self.admin(cmd)
                .await
                .map_err(|e| format!("sharding {ns}: {what}: {e}"))?;
        }
        Ok(())
    }

    /// Switches every member's (every shard's, when sharded) server model on or off, keeping
    /// its settings.
    pub(crate) async fn set_model_enabled(&self, enabled: bool) -> Result<(), String> {
        let mut cmd = doc! { "setParameter": 1 };
        cmd.insert(
            self.models_parameter(),
            doc! { "all": { "enabled": enabled } },
        );
        self.admin(cmd).await.map(|_| ())
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
    /// every member and each `(index, settings)` of `members` over it; when sharded, the same
    /// on the shards (the routers' models stay off: the shards do the work).
    pub(crate) async fn set_model(
        &self,
        model: &Document,
        members: &[(usize, Document)],
    ) -> Result<(), String> {
        let mut all = doc! { "all": model.clone() };
        for (i, m) in members {
            all.insert(i.to_string(), m.clone());
        }
        let parameter = self.models_parameter();
        let mut set = doc! { "setParameter": 1 };
        set.insert(parameter, all);
        self.set_model_enabled(false)
            .await
            .and(self.admin(set).await)
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
    fn a_sharded_run_models_its_shards_and_only_the_hot_one_is_limited_further() {
        use super::super::config::ShardLayout;
        let mut cfg = LabConfig {
            persona: Persona::Sharded,
            sharding: ShardLayout {
                hot_share: Some(0.5),
                ..ShardLayout::default()
            },
            ..LabConfig::default()
        };
        let docs = member_documents(&cfg, 1000.0);
        assert_eq!(docs.len(), 1);
        assert_eq!(docs[0].0, 1);
        let rate = docs[0]
            .1
            .get_document("limiter")
            .and_then(|l| l.get_f64("ratePerSec"))
            .expect("a rate");
        assert!((rate - 1000.0 * 0.5 * 0.9).abs() < 1e-9, "{rate}");
        cfg.sharding.hot_share = None;
        assert!(member_documents(&cfg, 1000.0).is_empty());

        // The shards' figures, not the routers' (whose models are off), make the totals.
        let part = |field: &str, i: i64, rejected: i64| {
            doc! { field: i, "counters": { "rejected": rejected }, "gauges": { "inFlight": 1i64 } }
        };
        let status = doc! {
            "labOverload": { "counters": { "rejected": 0i64 } },
            "labOverloadMembers": [part("member", 0, 0), part("member", 1, 0)],
            "labOverloadShards": [part("shard", 0, 1), part("shard", 1, 9), part("shard", 2, 0)],
        };
        let flat = deployment_status(&status).expect("status");
        assert_eq!(flat.get("counters.rejected"), Some(&10.0));
        assert_eq!(flat.get("gauges.inFlight"), Some(&3.0));
        assert_eq!(flat.get("shard1.counters.rejected"), Some(&9.0));
        assert!(!flat.contains_key("member1.counters.rejected"));
        let deltas = counter_deltas(&BTreeMap::new(), &flat);
        assert_eq!(deltas.get("shard1.rejected"), Some(&9.0));
        assert_eq!(counter_name("shardx.counters.a"), None);
    }

    #[test]
    fn the_routers_are_set_only_where_the_run_changes_mongos_defaults_and_their_retries_count() {
        use super::super::config::ShardLayout;
        assert!(router_parameters(&ShardLayout::default()).is_empty());
        let layout = ShardLayout {
            router_retries: Some(0),
            router_shard_labels: true,
            ..ShardLayout::default()
        };
        assert_eq!(
            router_parameters(&layout),
            doc! { "defaultClientMaxRetryAttempts": 0i32, "labRouterShardErrorLabels": "shard" }
        );
        let retries_only = ShardLayout {
            router_retries: Some(5),
            ..ShardLayout::default()
        };
        assert_eq!(
            router_parameters(&retries_only),
            doc! { "defaultClientMaxRetryAttempts": 5i32 }
        );

        // The routers' figures per shard (`routing`) are counters too: summed, and per shard.
        let shard = |i: i64, retries: i64| {
            doc! {
                "shard": i,
                "routing": { "requests": 10i64, "overloadRetries": retries },
                "counters": { "rejected": 0i64 },
            }
        };
        let status = doc! {
            "labOverload": { "counters": { "rejected": 0i64 } },
            "labOverloadShards": [shard(0, 0), shard(1, 7)],
        };
        let flat = deployment_status(&status).expect("status");
        assert_eq!(flat.get("routing.overloadRetries"), Some(&7.0));
        assert_eq!(flat.get("routing.requests"), Some(&20.0));
        assert_eq!(flat.get("shard1.routing.overloadRetries"), Some(&7.0));
        let deltas = counter_deltas(&BTreeMap::new(), &flat);
        assert_eq!(deltas.get("routing.overloadRetries"), Some(&7.0));
        assert_eq!(deltas.get("shard1.routing.overloadRetries"), Some(&7.0));
        assert_eq!(deltas.get("shard1.rejected"), Some(&0.0));
        assert_eq!(counter_name("member1.routing.requests"), None);
        assert_eq!(counter_name("shard1.other.x"), None);
    }

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
