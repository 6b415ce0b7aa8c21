//! The named scenarios (`lab run --scenario NAME`, `docs/lab.md`): each is a schedule plus
//! the server and application settings that make one situation an overload control must
//! handle. Every parameter has a default here ([`ScenarioParams::default`]); the command line
//! overrides them.

use std::time::Duration;

use serde::Serialize;

use super::config::{
    HotMember, LabConfig, Length, Load, OnDeadline, Persona, ServerMode, ShardOptions, Variant,
};

/// A named scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ScenarioName {
    /// 50 % of capacity, a 130 % burst, 50 % again, behind the ingress limiter.
    Burst,
    /// 200 % of capacity throughout, behind the ingress limiter.
    Sustained,
    /// 50 % of capacity with a share of requests rejected at random: the case retries exist for.
    Transient,
    /// 200 % of capacity, and the application retries overload errors itself.
    AppRetries,
    /// 500 % of capacity or more, and every rejection costs the server core time.
    Flood,
    /// The 130 % burst without an ingress limiter: overload shows as queueing and latency.
    NoLimiter,
    /// No overload model, closed loop: what each driver costs when nothing is overloaded.
    FastPath,
    /// A three-member replica set serving reads from every member, one of which admits a third
    /// of the others' rate: it gets 150 % of its capacity, the others 50 %.
    HotMember,
    /// 200 % of capacity with half the mix inserts and updates, which take no `maxTimeMS` in
    /// upstream 3.9.1.
    WriteHeavy,
    /// `transient` at 1 % random rejections.
    #[value(name = "transient-1")]
    Transient1,
    /// `transient` at 5 % random rejections.
    #[value(name = "transient-5")]
    Transient5,
    /// `transient` at 15 % random rejections (above the retry budget's share).
    #[value(name = "transient-15")]
    Transient15,
    /// `transient` at 30 % random rejections.
    #[value(name = "transient-30")]
    Transient30,
    /// The exactly-once audit's faults (connection drops, step-downs, 5 % random rejections)
    /// under open-loop load below capacity.
    Faults,
    /// `burst`'s load from a fleet of 64 instances (one client each) instead of 4.
    #[value(name = "fleet-burst")]
    FleetBurst,
    /// `sustained`'s load from a fleet of 64 instances (one client each) instead of 4.
    #[value(name = "fleet-sustained")]
    FleetSustained,
    /// Three routers in front of three shards, the collection in equal `_id` thirds, one
    /// shard admitting a third of the others' rate: it gets 150 % of its capacity, the others
    /// 50 %. The figure to protect is the cold shards' goodput.
    #[value(name = "hot-shard")]
    HotShard,
    /// `hot-shard` with no hot shard (every shard at 50 %): the reference of its cold-shard
    /// goodput.
    #[value(name = "even-shards")]
    EvenShards,
}

impl ScenarioName {
    /// Every scenario.
    pub const ALL: [ScenarioName; 18] = [
        ScenarioName::Burst,
        ScenarioName::Sustained,
        ScenarioName::Transient,
        ScenarioName::AppRetries,
        ScenarioName::Flood,
        ScenarioName::NoLimiter,
        ScenarioName::FastPath,
        ScenarioName::HotMember,
        ScenarioName::WriteHeavy,
        ScenarioName::Transient1,
        ScenarioName::Transient5,
        ScenarioName::Transient15,
        ScenarioName::Transient30,
        ScenarioName::Faults,
        ScenarioName::FleetBurst,
        ScenarioName::FleetSustained,
        ScenarioName::HotShard,
        ScenarioName::EvenShards,
    ];

    /// The suite's scenarios, in its order. Left out for the suite's 15 minutes (docs/lab.md,
    /// "The suite and its verdict"): `app-retries`; `transient-1` and `transient-5`, where
    /// every variant of every suite so far kept 100.00 % (the sweep's shares that can fail,
    /// 15 and 30 %, stay; `faults` keeps 5 % random rejections among its faults), to make room
    /// for `fleet-sustained`; `fleet-burst`; `transient`, the sweep's `transient-5`; and
    /// `hot-member`, to make room for `hot-shard` and its reference `even-shards` (the same
    /// load and question, on the topology fleets run against).
    pub const SUITE: [ScenarioName; 12] = [
        ScenarioName::Burst,
        ScenarioName::Sustained,
        ScenarioName::FleetSustained,
        ScenarioName::WriteHeavy,
        ScenarioName::Transient15,
        ScenarioName::Transient30,
        ScenarioName::Faults,
        ScenarioName::Flood,
        ScenarioName::NoLimiter,
        ScenarioName::FastPath,
        ScenarioName::HotShard,
        ScenarioName::EvenShards,
    ];

    /// The name on the command line and in `verdict.json`.
    pub fn name(self) -> &'static str {
        match self {
            ScenarioName::Burst => "burst",
            ScenarioName::Sustained => "sustained",
            ScenarioName::Transient => "transient",
            ScenarioName::AppRetries => "app-retries",
            ScenarioName::Flood => "flood",
            ScenarioName::NoLimiter => "no-limiter",
            ScenarioName::FastPath => "fast-path",
            ScenarioName::HotMember => "hot-member",
            ScenarioName::WriteHeavy => "write-heavy",
            ScenarioName::Transient1 => "transient-1",
            ScenarioName::Transient5 => "transient-5",
            ScenarioName::Transient15 => "transient-15",
            ScenarioName::Transient30 => "transient-30",
            ScenarioName::Faults => "faults",
            ScenarioName::FleetBurst => "fleet-burst",
            ScenarioName::FleetSustained => "fleet-sustained",
            ScenarioName::HotShard => "hot-shard",
            ScenarioName::EvenShards => "even-shards",
        }
    }

    /// The scenario called `name`.
    pub fn parse(name: &str) -> Result<ScenarioName, String> {
        ScenarioName::ALL
            .into_iter()
            .find(|s| s.name() == name.trim())
            .ok_or_else(|| {
                let known: Vec<&str> = ScenarioName::ALL.iter().map(|s| s.name()).collect();
                format!("unknown scenario {name:?}: use one of {}", known.join(", "))
            })
    }
}

/// Share of admitted data requests the `transient` scenario's server rejects at random.
pub const TRANSIENT_REJECT_SHARE: f64 = 0.05;
/// The application's deadline in `transient`: room for the backoff the backpressure
/// specification prescribes before each retry (up to 200 ms, then 400 ms), so that every request
/// the figure counts as failed is one a driver could have kept. At the lab's 100 ms, a retry
/// fitted the deadline only when its jitter fell below about one half: half of the random
/// rejections failed whatever the driver's controls did, and those coin flips moved one
/// variant's success share by 0.3 points from run to run (docs/lab.md, "Why `transient`'s
/// deadline is 1 s").
pub const TRANSIENT_DEADLINE: Duration = Duration::from_millis(1000);
/// Operation mix of `write-heavy` (and `faults`): half inserts and updates.
pub const WRITE_HEAVY_MIX: &str = "point=40,range=10,insert=25,update=25";
/// Offered load of `write-heavy`, as a multiple of capacity.
pub const WRITE_HEAVY_LOAD: f64 = 2.0;
/// Offered load of `faults` and of the `transient` sweep, as a multiple of capacity.
pub const BELOW_CAPACITY_LOAD: f64 = 0.5;
/// Replica-set members of `faults` (a step-down needs another electable member).
pub const FAULTS_MEMBERS: usize = 3;
/// The faults of `faults`: the exactly-once audit's (`audit::AuditPlan::for_writes`): 2 % of
/// inserts and updates lose their connection before they run, 3 % of applied writes before
/// their reply, and the primary steps down every 2 s.
pub const FAULTS: super::config::Faults = super::config::Faults {
    drop_before: 0.02,
    drop_after: 0.03,
    step_down_every: Duration::from_secs(2),
};
/// Instances of the `fleet-*` scenarios (issue 30); `--instances` overrides it (up to 256).
pub const FLEET_INSTANCES: usize = 64;
/// Random rejections in `faults` (the audit's 5 %).
pub const FAULTS_REJECT_SHARE: f64 = 0.05;
/// Suite length of each `transient-N` scenario (s): four of them share the suite's 15 minutes.
pub const TRANSIENT_SWEEP_SUITE_SECS: f64 = 3.0;
/// Suite length of `faults` (s): step-downs at 2, 4, 6 and 8 s that the run's requests meet
/// (and one at 10 s as it ends). At 6 s (two that counted) one run's success share moved by
/// about 4 points from run to run, eight times the half-point check it serves; the spread comes
/// from the few failovers, so more of them per run narrows it.
pub const FAULTS_SUITE_SECS: f64 = 10.0;

/// Retries of the application in `app-retries`.
pub const APP_RETRIES: u32 = 2;
/// Offered load of `flood`, as a multiple of capacity.
pub const FLOOD_LOAD: f64 = 5.0;
/// Core time per rejection in `flood` (ms): 0.15 × the lab's 2 ms point read, the value
/// `docs/emulator.md` ("What a rejection costs") derives from seed 004's mongod figures and
/// SERVER-131908, with 0.05–0.6 × a point read as its plausible range.
pub const FLOOD_REJECTION_MS: f64 = 0.3;
/// Virtual cores of the `flood` scenario's server: one, so that 500 % of its capacity stays a
/// load the generator's two real cores can send.
pub const FLOOD_CORES: f64 = 1.0;
/// Suite length of `fast-path` (s; 40 quarter-second slices a variant and repetition).
pub const FAST_PATH_SUITE_SECS: f64 = 10.0;
/// Closed-loop workers of `fast-path` (all instances together).
pub const FAST_PATH_WORKERS: usize = 32;
/// Replica-set members of `hot-member`.
pub const HOT_MEMBERS: usize = 3;
/// The hot member's index: a secondary, so the primary's writes never meet its model.
pub const HOT_INDEX: usize = 1;
/// Virtual cores of every `hot-member` member.
pub const COLD_CORES: f64 = 3.0;
/// Offered load of `hot-member` as a multiple of its capacity (three times the hot member's):
/// each member gets a third, 150 % of the hot member's capacity and 50 % of the others'.
pub const HOT_LOAD: f64 = 1.5;
/// Operation mix of `hot-member`: reads only, so every member serves the same share.
pub const HOT_MIX: &str = "point=90,range=10";
/// `hot-member`'s costs: twice the lab's, so 150 % of the hot member stays near the burst's
/// request rate.
pub const HOT_COSTS_MS: (f64, f64) = (4.0, 10.0);

/// Routers of `hot-shard` and `even-shards`.
pub const SHARD_ROUTERS: usize = 3;
/// Shards of `hot-shard` and `even-shards`, each owning a third of the keys.
pub const SHARDS: usize = 3;
/// The hot shard of `hot-shard` (and the shard `even-shards` leaves out of its cold-shard
/// figure): the middle third of the keys, so range reads cross into it from both sides.
pub const HOT_SHARD_INDEX: usize = 1;

/// The scenarios' parameters; [`Default`] holds the documented defaults.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScenarioParams {
    /// `transient`: share of admitted data requests rejected at random.
    pub reject_share: f64,
    /// `app-retries`: how often the application retries an overload error.
    pub app_retries: u32,
    /// `flood`: offered load as a multiple of capacity.
    pub flood_load: f64,
    /// Core time per rejection (ms), `costs.rejectionMs`: `flood`'s default is
    /// [`FLOOD_REJECTION_MS`]; elsewhere the model's own unless given.
    pub rejection_ms: Option<f64>,
    /// Core time to stop an expired or disconnected request (ms), `costs.expiryMs`: the
    /// model's own unless given (for the sensitivity table of `flood` and `no-limiter`).
    pub expiry_ms: Option<f64>,
    /// `fast-path`: closed-loop workers in all.
    pub workers: usize,
}

impl Default for ScenarioParams {
    fn default() -> Self {
        ScenarioParams {
            reject_share: TRANSIENT_REJECT_SHARE,
            app_retries: APP_RETRIES,
            flood_load: FLOOD_LOAD,
            rejection_ms: None,
            expiry_ms: None,
            workers: FAST_PATH_WORKERS,
        }
    }
}

impl ScenarioParams {
    /// Refuses values no scenario can run with.
    pub fn check(&self) -> Result<(), String> {
        if !(self.reject_share.is_finite() && (0.0..1.0).contains(&self.reject_share)) {
            return Err("--reject-share must be in [0, 1)".into());
        }
        if self.app_retries > 20 {
            return Err("--app-retries must be at most 20".into());
        }
        if !(self.flood_load.is_finite() && self.flood_load >= 5.0 && self.flood_load <= 20.0) {
            return Err("--flood-load must be between 500 and 2000 (%)".into());
        }
        for (flag, v) in [
            ("--rejection-ms", self.rejection_ms),
            ("--expiry-ms", self.expiry_ms),
        ] {
            if v.is_some_and(|v| !(v.is_finite() && (0.0..=100.0).contains(&v))) {
                return Err(format!("{flag} must be between 0 and 100"));
            }
        }
        if self.workers == 0 || self.workers > 4096 {
            return Err("--workers must be in 1..=4096".into());
        }
        Ok(())
    }
}

/// Merges `over` into the JSON object `base` (objects recursively, other values replaced).
fn merge_json(base: &mut serde_json::Value, over: serde_json::Value) {
    match (base, over) {
        (serde_json::Value::Object(b), serde_json::Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge_json(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

impl ScenarioName {
    /// Sets `cfg` up for this scenario: schedule, server settings and application behaviour.
    /// Model settings the user gave (`cfg.model_overrides`) win over the scenario's.
    pub fn apply(self, cfg: &mut LabConfig, len: Length, p: &ScenarioParams) {
        use super::config::Scenario;
        let steady = Scenario::steady_secs(len);
        let mut model = serde_json::json!({});
        match self {
            ScenarioName::Burst => cfg.scenario = Scenario::burst(len),
            ScenarioName::Sustained => cfg.scenario = Scenario::sustained(len),
            // The same total load as `burst` and `sustained`, split over a fleet: each client
            // sees a sixteenth of what one of the four does, which is what the per-client
            // controls (budget floor, throttle minimum, concurrency limit) must cope with.
            ScenarioName::FleetBurst => {
                let mut s = Scenario::burst(len);
                s.name = self.name().into();
                cfg.scenario = s;
                cfg.instances = FLEET_INSTANCES;
            }
            ScenarioName::FleetSustained => {
                let mut s = Scenario::sustained(len);
                s.name = self.name().into();
                cfg.scenario = s;
                cfg.instances = FLEET_INSTANCES;
            }
            ScenarioName::Transient => {
                cfg.scenario = Scenario::steady("transient", "base", BELOW_CAPACITY_LOAD, steady);
                cfg.random_reject_share = p.reject_share;
                cfg.deadline = TRANSIENT_DEADLINE;
            }
            ScenarioName::Transient1
            | ScenarioName::Transient5
            | ScenarioName::Transient15
            | ScenarioName::Transient30 => {
                // The share is the scenario's name; `--reject-share` is `transient`'s.
                let share = self.sweep_share().unwrap_or(TRANSIENT_REJECT_SHARE);
                let secs = if len == Length::Suite {
                    TRANSIENT_SWEEP_SUITE_SECS
                } else {
                    steady
                };
                cfg.scenario = Scenario::steady(self.name(), "base", BELOW_CAPACITY_LOAD, secs);
                cfg.random_reject_share = share;
                cfg.deadline = TRANSIENT_DEADLINE;
            }
            ScenarioName::WriteHeavy => {
                cfg.scenario =
                    Scenario::steady("write-heavy", "overload", WRITE_HEAVY_LOAD, steady);
                // `OpMix::parse` accepts this constant.
                if let Ok(mix) = super::config::OpMix::parse(WRITE_HEAVY_MIX) {
                    cfg.mix = mix;
                }
            }
            ScenarioName::Faults => {
                let secs = if len == Length::Suite {
                    FAULTS_SUITE_SECS
                } else {
                    steady
                };
                cfg.scenario = Scenario::steady("faults", "faults", BELOW_CAPACITY_LOAD, secs);
                cfg.persona = super::config::Persona::Replicaset;
                cfg.members = FAULTS_MEMBERS;
                if let Ok(mix) = super::config::OpMix::parse(WRITE_HEAVY_MIX) {
                    cfg.mix = mix;
                }
                cfg.random_reject_share = FAULTS_REJECT_SHARE;
                // Room for the specification's backoff and a failover, as in `transient`.
                cfg.deadline = TRANSIENT_DEADLINE;
                cfg.faults = Some(FAULTS);
            }
            ScenarioName::AppRetries => {
                cfg.scenario = Scenario::steady("app-retries", "overload", 2.0, steady);
                cfg.app_retries = p.app_retries;
            }
            ScenarioName::Flood => {
                cfg.scenario = Scenario::steady("flood", "flood", p.flood_load, steady);
                // At five times capacity, an application that lets each driver call go on
                // after its deadline piles up tens of seconds of calls in the pools (upstream's
                // defaults left 3,500 of 8,300 requests unfinished 8 s after the schedule), so
                // no run would finish and the pools, not the server, would set the pace. The
                // flood's application drops the call at its deadline instead, as applications
                // using `tokio::time::timeout` do, and every attempt sent reaches the server
                // at the offered rate.
                cfg.on_deadline_override = Some(OnDeadline::Drop);
                model = serde_json::json!({
                    "cores": FLOOD_CORES,
                    "costs": { "rejectionMs": p.rejection_ms.unwrap_or(FLOOD_REJECTION_MS) },
                });
            }
            ScenarioName::NoLimiter => {
                let mut s = Scenario::burst(len);
                s.name = "no-limiter".into();
                cfg.scenario = s;
                cfg.limiter_share = 0.0;
            }
            ScenarioName::HotMember => {
                cfg.scenario = Scenario::steady("hot-member", "hot", HOT_LOAD, steady);
                cfg.persona = super::config::Persona::Replicaset;
                cfg.members = HOT_MEMBERS;
                // The hot member admits a third of the others' rate with the same cores: its
                // rejections are as quick as theirs, so the drivers' choice of the member with
                // fewer operations in flight cannot move load off it. (With a third of the
                // cores instead, the member's longer service times did move it: in a first
                // suite run member 1 received about 200 requests/s, near its capacity, and the
                // others 400 each, and it never shed.)
                cfg.hot_member = Some(HotMember {
                    index: HOT_INDEX,
                    cores: None,
                    share: 1.0 / 3.0,
                });
                // Every member serves reads; without this the primary would serve them all.
                cfg.client_options = if cfg.client_options.is_empty() {
                    "readPreference=nearest".into()
                } else {
                    format!("readPreference=nearest&{}", cfg.client_options)
                };
                // `OpMix::parse` accepts this constant.
                if let Ok(mix) = super::config::OpMix::parse(HOT_MIX) {
                    cfg.mix = mix;
                }
                model = serde_json::json!({
                    "cores": COLD_CORES,
                    "costs": { "pointReadMs": HOT_COSTS_MS.0, "rangeReadMs": HOT_COSTS_MS.1 },
                });
                // Capacity: three members like the hot one, i.e. one member's cores at these
                // costs (nominal, not calibrated: calibration reads from the primary only).
                if cfg.capacity <= 0.0 {
                    let mean_ms = cfg.mix.share(super::config::OpKind::PointRead) * HOT_COSTS_MS.0
                        + cfg.mix.share(super::config::OpKind::RangeRead) * HOT_COSTS_MS.1;
                    cfg.capacity = COLD_CORES * 1000.0 / mean_ms;
                }
            }
            ScenarioName::HotShard | ScenarioName::EvenShards => {
                let hot = self == ScenarioName::HotShard;
                cfg.scenario = Scenario::steady(
                    self.name(),
                    if hot { "hot" } else { "even" },
                    HOT_LOAD,
                    steady,
                );
                cfg.persona = super::config::Persona::Sharded;
                // The hot shard admits a third of the others' rate with the same cores, for
                // `hot-member`'s reason (its rejections are as quick as theirs). The reference
                // names the same shard, so its cold-shard figure counts the same requests.
                cfg.sharding = super::config::ShardLayout {
                    routers: SHARD_ROUTERS,
                    shards: SHARDS,
                    hot_index: HOT_SHARD_INDEX,
                    hot_share: hot.then_some(1.0 / 3.0),
                    // mongos's retry defaults unless `--router-retries` and
                    // `--router-shard-labels` say otherwise (`apply_shard_options`).
                    ..super::config::ShardLayout::default()
                };
                // Reads only, as in `hot-member`: inserts would all land on the last shard
                // (their ObjectId `_id`s sort after every number).
                if let Ok(mix) = super::config::OpMix::parse(HOT_MIX) {
                    cfg.mix = mix;
                }
                model = serde_json::json!({
                    "cores": COLD_CORES,
                    "costs": { "pointReadMs": HOT_COSTS_MS.0, "rangeReadMs": HOT_COSTS_MS.1 },
                });
                // Capacity: three shards like the hot one, i.e. one shard's cores at these
                // costs (nominal: calibration would read through one shard's share only).
                // Each shard gets a third of the load: 150 % of the hot shard's capacity and
                // 50 % of a cold one's.
                if cfg.capacity <= 0.0 {
                    let mean_ms = cfg.mix.share(super::config::OpKind::PointRead) * HOT_COSTS_MS.0
                        + cfg.mix.share(super::config::OpKind::RangeRead) * HOT_COSTS_MS.1;
                    cfg.capacity = COLD_CORES * 1000.0 / mean_ms;
                }
            }
            ScenarioName::FastPath => {
                // Three times the steady length, 10 s in the suite. Its variants take turns in
                // quarter-second slices (`runner::run_interleaved`), four rounds per second of
                // the scenario, and its figure is a ratio of two CPU-bound throughputs: two
                // slices taken in turn differ by 15–18 % on a shared 2-core machine, and
                // repetitions differ more than seconds within one, so the verdict's interval
                // resamples repetitions and then blocks of seconds. The suite's 15 minutes allow
                // 10 s a repetition (120 slices a variant over three); `--repeats` narrows the
                // interval when a figure sits near its target, and instruction counts
                // (`lab instructions`) are the layout-insensitive figure beside it (docs/lab.md,
                // "How precise the fast path is").
                let secs = if len == Length::Suite {
                    FAST_PATH_SUITE_SECS
                } else {
                    3.0 * steady
                };
                let mut s = Scenario::steady("fast-path", "closed", 1.0, secs);
                // A closed loop has no burst to recover from.
                s.burst = None;
                cfg.scenario = s;
                cfg.server_mode = ServerMode::None;
                cfg.load = Load::Closed { workers: p.workers };
                cfg.saturation_expected = true;
            }
        }
        // The cost flags apply to every scenario that has the model (the sensitivity table).
        let mut costs = serde_json::Map::new();
        if let Some(ms) = p.rejection_ms {
            costs.insert("rejectionMs".into(), ms.into());
        }
        if let Some(ms) = p.expiry_ms {
            costs.insert("expiryMs".into(), ms.into());
        }
        if !costs.is_empty() {
            merge_json(
                &mut model,
                serde_json::json!({ "costs": serde_json::Value::Object(costs) }),
            );
        }
        if let Some(user) = cfg.model_overrides.take() {
            merge_json(&mut model, user);
        }
        let empty = model.as_object().is_some_and(|o| o.is_empty());
        cfg.model_overrides = (!empty).then_some(model);
    }

    /// Applies `lab run`'s sharding options (`--shards`, `--hot-share`, `--router-retries`,
    /// `--router-shard-labels`) to `cfg`, which [`ScenarioName::apply`] set up for this
    /// scenario. Only `hot-shard` and `even-shards` run the sharded cluster they change, and
    /// only `hot-shard` has a hot shard whose share `--hot-share` could set; given elsewhere
    /// they are refused rather than ignored, so no run claims a layout it did not have.
    pub fn apply_shard_options(
        self,
        cfg: &mut LabConfig,
        options: &ShardOptions,
    ) -> Result<(), String> {
        if options.is_empty() {
            return Ok(());
        }
        let sharded = matches!(self, ScenarioName::HotShard | ScenarioName::EvenShards);
        if !sharded || cfg.persona != Persona::Sharded {
            return Err(format!(
                "--shards, --hot-share, --router-retries and --router-shard-labels are for the \
                 sharded scenarios (hot-shard, even-shards), not {}",
                self.name()
            ));
        }
        if options.hot_share.is_some() && cfg.sharding.hot_share.is_none() {
            return Err(format!(
                "--hot-share is for hot-shard: {} has no hot shard",
                self.name()
            ));
        }
        options.apply(&mut cfg.sharding)
    }

    /// Seconds of schedule one repetition of this scenario takes in the suite with its default
    /// variants (length × variants; `fast-path`'s variants take turns, so the same product).
    pub fn suite_schedule_secs(self) -> f64 {
        let mut cfg = LabConfig::default();
        self.apply(&mut cfg, Length::Suite, &ScenarioParams::default());
        cfg.scenario.duration().as_secs_f64() * self.default_variants().len() as f64
    }

    /// The random rejection share of a `transient-N` scenario.
    pub fn sweep_share(self) -> Option<f64> {
        match self {
            ScenarioName::Transient1 => Some(0.01),
            ScenarioName::Transient5 => Some(0.05),
            ScenarioName::Transient15 => Some(0.15),
            ScenarioName::Transient30 => Some(0.30),
            _ => None,
        }
    }

    /// The variants this scenario runs when none are named: the strongest upstream
    /// configurations for the scenario (upstream's best practice: `maxTimeMS` on finds and
    /// the call dropped at the deadline, with and without retries), upstream's defaults where
    /// a check compares with them or they show what the scenario is about, and the fork's
    /// recommended settings and every control everywhere. Every upstream configuration runs
    /// in at least one scenario, so each has a row in the dominance tables. The suite's
    /// 15 minutes do not allow every variant everywhere; docs/lab.md ("Which variants each
    /// scenario runs") lists what was cut and why.
    pub fn default_variants(self) -> Vec<Variant> {
        const FORK: [&str; 2] = ["fork-recommended", "fork-controls"];
        let upstream: &[&str] = match self {
            // `upstream-default` is the base of `fast-path`'s ratio and of the success-share
            // checks; elsewhere upstream's best practice is what the fork must beat.
            ScenarioName::Burst | ScenarioName::FleetBurst => {
                &["upstream-best", "upstream-best-no-retries"]
            }
            // A fleet's sustained overload: the two strongest upstream configurations of
            // `sustained` (the suite's 15 minutes leave no room for the others).
            ScenarioName::FleetSustained => &["upstream-best", "upstream-best-no-retries"],
            ScenarioName::Sustained | ScenarioName::AppRetries => &[
                "upstream-no-retries",
                "upstream-maxtime",
                "upstream-best",
                "upstream-best-no-retries",
            ],
            // Not `upstream-maxtime`: its writes carry no bound and its application waits
            // for them, so at twice capacity every run ends with 500-900 calls still running
            // (invalid by construction; 0.09-0.12 of capacity as counted). `upstream-best` is
            // the same configuration with the call dropped at the deadline.
            ScenarioName::WriteHeavy => &["upstream-best", "upstream-best-no-retries"],
            ScenarioName::Transient => &[
                "upstream-default",
                "upstream-best",
                "upstream-best-no-retries",
            ],
            // Under random rejections below capacity retries are what succeeds: upstream's
            // configurations without them lose a share of the rejected requests (0.85 × in
            // `transient-15` at 2026-12-04 03:40) and are judged where they are strongest.
            ScenarioName::Transient1
            | ScenarioName::Transient5
            | ScenarioName::Transient15
            | ScenarioName::Transient30 => &["upstream-default", "upstream-best"],
            ScenarioName::Faults => &["upstream-default", "upstream-best"],
            // The flood's application drops every call (the scenario's requirement), so
            // `upstream-maxtime` is `upstream-best` there; and retries make upstream's best
            // practice worse in a flood (0.05 of capacity against 0.21 without them in the
            // suite of 2026-12-04 23:20, and below in every suite before), so its strongest
            // configuration is the one without them. Retargeting runs here: an application
            // that turns it on for a hot member has it on in a flood as well, and no other
            // scenario of the suite can tell it apart from the fork.
            ScenarioName::Flood => &["upstream-best-no-retries", "upstream-best-retargeting"],
            // No overload error reaches the driver: its retry setting changes nothing.
            ScenarioName::NoLimiter => &["upstream-default", "upstream-best"],
            ScenarioName::FastPath => &["upstream-default"],
            ScenarioName::HotMember => &["upstream-best", "upstream-best-retargeting"],
            // mongos retries a shard's overload error itself and passes on what it gives up on
            // without `RetryableError` (docs/emulator.md, "Sharded persona"), so no driver
            // retries it: with retargeting or without retries upstream's best practice is
            // the same configuration here.
            ScenarioName::HotShard => &["upstream-best"],
            // The reference of `hot-shard`'s cold-shard check, which compares each fork
            // variant with itself: upstream's runs here would judge nothing.
            ScenarioName::EvenShards => &[],
        };
        upstream
            .iter()
            .chain(FORK.iter())
            .filter_map(|name| Variant::parse(name).ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_scenario_parses_back_from_its_name() {
        for s in ScenarioName::ALL {
            assert_eq!(ScenarioName::parse(s.name()), Ok(s));
        }
        assert!(ScenarioName::parse("nope").is_err());
    }

    #[test]
    fn scenarios_set_what_they_promise() {
        let p = ScenarioParams::default();
        let mut cfg = LabConfig::default();
        ScenarioName::Transient.apply(&mut cfg, Length::Suite, &p);
        assert_eq!(cfg.random_reject_share, 0.05);
        assert_eq!(cfg.deadline, TRANSIENT_DEADLINE);
        assert_eq!(cfg.scenario.phases[0].load, 0.5);

        let mut cfg = LabConfig {
            model_overrides: Some(serde_json::json!({ "costs": { "writeMs": 4 } })),
            ..LabConfig::default()
        };
        ScenarioName::Flood.apply(&mut cfg, Length::Suite, &p);
        assert!(cfg.scenario.phases[0].load >= 5.0);
        let m = cfg.model_overrides.expect("flood sets the model");
        assert_eq!(m["costs"]["rejectionMs"], 0.3);
        // The user's settings are kept beside the scenario's.
        assert_eq!(m["costs"]["writeMs"], 4);

        let mut cfg = LabConfig::default();
        ScenarioName::NoLimiter.apply(&mut cfg, Length::Quick, &p);
        assert_eq!(cfg.limiter_share, 0.0);
        assert_eq!(cfg.scenario.burst, Some(1));

        let mut cfg = LabConfig::default();
        ScenarioName::FastPath.apply(&mut cfg, Length::Suite, &p);
        assert_eq!(cfg.repeats, LabConfig::default().repeats);
        assert_eq!(cfg.scenario.duration(), Duration::from_secs(10));
        assert_eq!(cfg.server_mode, ServerMode::None);
        assert_eq!(cfg.load, Load::Closed { workers: 32 });

        let mut cfg = LabConfig::default();
        ScenarioName::HotMember.apply(&mut cfg, Length::Suite, &p);
        assert_eq!(cfg.members, 3);
        let hot = cfg.hot_member.expect("a hot member");
        assert_eq!((hot.index, hot.cores), (1, None));
        // One member's 3 cores at 0.9 × 4 + 0.1 × 10 = 4.6 ms per read.
        assert!(
            (cfg.capacity - 3000.0 / 4.6).abs() < 1e-6,
            "{}",
            cfg.capacity
        );
        let names: Vec<String> = ScenarioName::HotMember
            .default_variants()
            .into_iter()
            .map(|v| v.name)
            .collect();
        assert!(
            names.iter().any(|n| n == "upstream-best-retargeting"),
            "{names:?}"
        );

        let mut cfg = LabConfig::default();
        ScenarioName::AppRetries.apply(&mut cfg, Length::Suite, &p);
        assert_eq!(cfg.app_retries, 2);
        assert!(cfg.model_overrides.is_none());

        for (s, share) in [
            (ScenarioName::Transient1, 0.01),
            (ScenarioName::Transient15, 0.15),
            (ScenarioName::Transient30, 0.30),
        ] {
            let mut cfg = LabConfig::default();
            s.apply(&mut cfg, Length::Suite, &p);
            assert_eq!(cfg.random_reject_share, share);
            assert_eq!(cfg.scenario.name, s.name());
            assert_eq!(cfg.deadline, TRANSIENT_DEADLINE);
            assert_eq!(cfg.scenario.phases[0].load, 0.5);
        }

        let mut cfg = LabConfig::default();
        ScenarioName::WriteHeavy.apply(&mut cfg, Length::Suite, &p);
        assert_eq!(cfg.scenario.phases[0].load, 2.0);
        let writes = cfg.mix.share(super::super::config::OpKind::Insert)
            + cfg.mix.share(super::super::config::OpKind::Update);
        assert!((writes - 0.5).abs() < 1e-9, "{:?}", cfg.mix);

        let mut cfg = LabConfig::default();
        ScenarioName::Faults.apply(&mut cfg, Length::Suite, &p);
        assert_eq!(cfg.members, 3);
        assert_eq!(cfg.random_reject_share, 0.05);
        assert!(cfg.scenario.phases[0].load < 1.0, "below capacity");
        let f = cfg.faults.expect("faults");
        assert_eq!((f.drop_before, f.drop_after), (0.02, 0.03));
    }

    #[test]
    fn hot_shard_has_one_shard_at_a_third_of_the_others_and_its_reference_none() {
        use super::super::config::{OpKind, Persona};
        let p = ScenarioParams::default();
        let (mut hot, mut even) = (LabConfig::default(), LabConfig::default());
        ScenarioName::HotShard.apply(&mut hot, Length::Suite, &p);
        ScenarioName::EvenShards.apply(&mut even, Length::Suite, &p);
        for cfg in [&hot, &even] {
            assert_eq!(cfg.persona, Persona::Sharded);
            assert_eq!((cfg.sharding.routers, cfg.sharding.shards), (3, 3));
            assert_eq!(cfg.sharding.hot_index, 1);
            assert_eq!(cfg.sharding.split_points(cfg.docs), vec![333, 666]);
            assert_eq!(cfg.mix.share(OpKind::PointRead), 0.9);
            assert_eq!(cfg.mix.share(OpKind::RangeRead), 0.1);
            // One shard's 3 cores at 0.9 × 4 + 0.1 × 10 = 4.6 ms per read.
            assert!(
                (cfg.capacity - 3000.0 / 4.6).abs() < 1e-6,
                "{}",
                cfg.capacity
            );
            assert_eq!(cfg.scenario.phases.len(), 1);
            assert_eq!(cfg.scenario.phases[0].load, HOT_LOAD);
            let m = cfg.model_overrides.as_ref().expect("the model");
            assert_eq!(m["cores"], 3.0);
            assert_eq!(m["costs"]["pointReadMs"], 4.0);
            assert!(cfg.hot_member.is_none());
        }
        assert_eq!(hot.sharding.hot_share, Some(1.0 / 3.0));
        assert_eq!(even.sharding.hot_share, None);
        // The same load and layout: only the hot shard's limiter differs.
        assert_eq!(
            hot.scenario.phases[0].duration,
            even.scenario.phases[0].duration
        );
        assert_eq!(hot.model_overrides, even.model_overrides);
        let names = |s: ScenarioName| -> Vec<String> {
            s.default_variants().into_iter().map(|v| v.name).collect()
        };
        assert_eq!(
            names(ScenarioName::HotShard),
            ["upstream-best", "fork-recommended", "fork-controls"]
        );
        assert_eq!(
            names(ScenarioName::EvenShards),
            ["fork-recommended", "fork-controls"]
        );
        // Seconds of schedule a suite repetition needs: 5 s × 3 variants, 5 s × 2.
        assert_eq!(ScenarioName::HotShard.suite_schedule_secs(), 15.0);
        assert_eq!(ScenarioName::EvenShards.suite_schedule_secs(), 10.0);
    }

    #[test]
    fn only_the_sharded_scenarios_take_the_sharding_options_and_only_hot_shard_its_share() {
        use super::super::config::OpKind;
        let p = ScenarioParams::default();
        let configured = |s: ScenarioName, o: &ShardOptions| {
            let mut cfg = LabConfig::default();
            s.apply(&mut cfg, Length::Suite, &p);
            s.apply_shard_options(&mut cfg, o).map(|()| cfg)
        };
        // Without options every scenario runs as before, the sharded ones on mongos's
        // defaults.
        for s in ScenarioName::ALL {
            let cfg = configured(s, &ShardOptions::default()).expect("no options");
            assert_eq!(cfg.sharding.router_retries, None, "{s:?}");
            assert!(!cfg.sharding.router_shard_labels, "{s:?}");
        }

        // Half the keys on a hot shard admitting a twentieth, behind routers that do not
        // retry: split once, shard 0 the only cold one.
        let two = ShardOptions {
            shards: Some(2),
            hot_share: Some(0.05),
            router_retries: Some(0),
            router_shard_labels: true,
        };
        let hot = configured(ScenarioName::HotShard, &two).expect("hot-shard takes them");
        assert_eq!((hot.sharding.routers, hot.sharding.shards), (3, 2));
        assert_eq!(hot.sharding.hot_index, HOT_SHARD_INDEX);
        assert_eq!(hot.sharding.hot_share, Some(0.05));
        assert_eq!(hot.sharding.router_retries, Some(0));
        assert!(hot.sharding.router_shard_labels);
        assert_eq!(hot.sharding.split_points(hot.docs), vec![500]);
        let keys = hot.shard_keys().expect("sharded");
        assert!(keys.is_cold(OpKind::PointRead, 499, 20));
        assert!(!keys.is_cold(OpKind::PointRead, 500, 20));
        // The load and capacity stay the scenario's: the options change the cluster only.
        let default = configured(ScenarioName::HotShard, &ShardOptions::default()).expect("ok");
        assert_eq!(hot.capacity, default.capacity);
        assert_eq!(hot.scenario, default.scenario);

        // The reference takes the layout and the routers' settings, but has no hot shard.
        let four = ShardOptions {
            shards: Some(4),
            router_retries: Some(5),
            ..ShardOptions::default()
        };
        let even = configured(ScenarioName::EvenShards, &four).expect("even-shards takes them");
        assert_eq!(even.sharding.split_points(even.docs), vec![250, 500, 750]);
        assert_eq!(
            (even.sharding.hot_share, even.sharding.router_retries),
            (None, Some(5))
        );
        let keys = even.shard_keys().expect("sharded");
        assert!(keys.is_cold(OpKind::PointRead, 750, 20));
        assert!(!keys.is_cold(OpKind::PointRead, 250, 20));
        let e = configured(ScenarioName::EvenShards, &two).expect_err("no hot shard");
        assert!(
            e.contains("--hot-share") && e.contains("even-shards"),
            "{e}"
        );

        // Every other scenario refuses each of them, even on the sharded persona.
        let each = [
            ShardOptions {
                shards: Some(2),
                ..ShardOptions::default()
            },
            ShardOptions {
                hot_share: Some(0.5),
                ..ShardOptions::default()
            },
            ShardOptions {
                router_retries: Some(0),
                ..ShardOptions::default()
            },
            ShardOptions {
                router_shard_labels: true,
                ..ShardOptions::default()
            },
        ];
        for s in ScenarioName::ALL {
            if matches!(s, ScenarioName::HotShard | ScenarioName::EvenShards) {
                continue;
            }
            for o in &each {
                let e = configured(s, o).expect_err("not sharded");
                assert!(e.contains(s.name()), "{s:?}: {e}");
            }
            let mut cfg = LabConfig {
                persona: Persona::Sharded,
                ..LabConfig::default()
            };
            s.apply(&mut cfg, Length::Suite, &p);
            assert!(s.apply_shard_options(&mut cfg, &each[2]).is_err(), "{s:?}");
        }
    }

    #[test]
    fn a_fleet_offers_the_same_total_load_from_sixteen_times_the_instances() {
        let p = ScenarioParams::default();
        for (fleet, base) in [
            (ScenarioName::FleetBurst, ScenarioName::Burst),
            (ScenarioName::FleetSustained, ScenarioName::Sustained),
        ] {
            let (mut f, mut b) = (LabConfig::default(), LabConfig::default());
            fleet.apply(&mut f, Length::Suite, &p);
            base.apply(&mut b, Length::Suite, &p);
            assert_eq!(f.instances, FLEET_INSTANCES);
            assert_eq!(b.instances * 16, FLEET_INSTANCES);
            assert_eq!(f.scenario.name, fleet.name());
            assert_eq!(f.scenario.phases, b.scenario.phases, "{fleet:?}");
            assert_eq!(f.scenario.burst, b.scenario.burst, "{fleet:?}");
            assert_eq!((f.capacity, f.deadline), (b.capacity, b.deadline));
        }
    }

    #[test]
    fn every_scenario_judges_fork_controls_against_upstream() {
        use super::super::config::Application;
        for s in ScenarioName::ALL {
            let v = s.default_variants();
            // `even-shards` is only the reference of `hot-shard`'s cold-shard check, which
            // compares each fork variant with itself (docs/lab.md, "Which variants each
            // scenario runs"); the verdict judges nothing else there.
            if s == ScenarioName::EvenShards {
                assert!(v.iter().all(|x| !x.is_upstream()), "{v:?}");
                assert!(v.iter().any(|x| x.name == "fork-recommended"));
                assert!(v.iter().any(|x| x.name == "fork-controls"));
                continue;
            }
            assert!(v.len() >= 3, "{s:?}: {v:?}");
            assert!(v[0].is_upstream(), "{s:?}: upstream runs");
            // The recommended settings and every control are judged everywhere (issue 27).
            assert!(v.iter().any(|x| x.name == "fork-recommended"), "{s:?}");
            assert!(v.iter().any(|x| x.name == "fork-controls"), "{s:?}");
            // Upstream's best practice runs wherever an application could use it.
            if s != ScenarioName::FastPath {
                assert!(
                    v.iter()
                        .any(|x| x.is_upstream() && x.app == Application::BEST),
                    "{s:?}: {v:?}"
                );
            }
        }
        // The success-share checks compare with upstream's defaults.
        for s in ScenarioName::SUITE {
            if s.sweep_share().is_some() || s == ScenarioName::Faults || s == ScenarioName::FastPath
            {
                assert!(
                    s.default_variants()
                        .iter()
                        .any(|x| x.name == "upstream-default"),
                    "{s:?}"
                );
            }
        }
        // Every built-in upstream configuration but retargeting alone runs somewhere in the
        // suite, so each has a row in the dominance tables.
        for u in super::super::config::Variant::builtin()
            .into_iter()
            .filter(|v| v.is_upstream() && v.name != "upstream-retargeting")
        {
            assert!(
                ScenarioName::SUITE
                    .iter()
                    .any(|s| s.default_variants().iter().any(|x| x.name == u.name)),
                "{} runs nowhere",
                u.name
            );
        }
        let mut cfg = LabConfig::default();
        ScenarioName::Flood.apply(&mut cfg, Length::Suite, &ScenarioParams::default());
        assert_eq!(cfg.on_deadline_override, Some(OnDeadline::Drop));
        // The cost flags reach the model in `flood` and `no-limiter` alike.
        let costs = ScenarioParams {
            rejection_ms: Some(0.9),
            expiry_ms: Some(1.5),
            ..ScenarioParams::default()
        };
        for s in [ScenarioName::Flood, ScenarioName::NoLimiter] {
            let mut cfg = LabConfig::default();
            s.apply(&mut cfg, Length::Suite, &costs);
            let m = cfg.model_overrides.expect("costs");
            assert_eq!(m["costs"]["rejectionMs"], 0.9, "{s:?}");
            assert_eq!(m["costs"]["expiryMs"], 1.5, "{s:?}");
        }
    }

    /// The suite's 15 minutes: three repetitions of every scenario's schedule, plus about
    /// 70 s of calibration and set-up (71 s in the suite of 2026-12-04 23:20; docs/lab.md,
    /// "Which variants each scenario runs"). A scenario or variant added to the suite must
    /// fit, or something else must go: `hot-shard` and `even-shards` (25 s a repetition) took
    /// `hot-member`'s 20 s and `flood`'s `upstream-best` (5 s).
    #[test]
    fn one_repetition_of_the_suite_fits_its_budget() {
        let per_rep: f64 = ScenarioName::SUITE
            .iter()
            .map(|s| s.suite_schedule_secs())
            .sum();
        assert_eq!(per_rep, 273.0, "update docs/lab.md's estimate");
        assert!(3.0 * per_rep + 70.0 <= 900.0, "{per_rep} s a repetition");
    }

    #[test]
    fn parameters_out_of_range_are_refused() {
        assert!(ScenarioParams::default().check().is_ok());
        let bad = [
            ScenarioParams {
                reject_share: 1.0,
                ..ScenarioParams::default()
            },
            ScenarioParams {
                flood_load: 2.0,
                ..ScenarioParams::default()
            },
            ScenarioParams {
                workers: 0,
                ..ScenarioParams::default()
            },
            ScenarioParams {
                expiry_ms: Some(-1.0),
                ..ScenarioParams::default()
            },
        ];
        for p in bad {
            assert!(p.check().is_err(), "{p:?}");
        }
    }
}
