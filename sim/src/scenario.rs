//! The load shapes, the lab's (`lab/src/loadgen/scenarios.rs` and `config.rs`): phases of
//! open-loop Poisson load as a multiple of the server's capacity, the server settings each
//! scenario changes, and for `hot-shard` and `even-shards` the sharded cluster they run on.

use crate::server::OpKind;

/// A scenario of the simulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum ScenarioName {
    /// 50 % of capacity, a 130 % burst, 50 % again, behind the ingress limiter.
    Burst,
    /// 200 % of capacity throughout, behind the ingress limiter.
    Sustained,
    /// 500 % of capacity on a one-core server; every rejection costs 0.3 ms of core time.
    Flood,
    /// 50 % of capacity with 30 % of attempts rejected at random for overload and a 1 s
    /// deadline: the lab's `transient-30`, where no control should take anything away.
    Transient,
    /// 150 % of one shard's capacity on three shards behind three routers, reads only, one
    /// shard admitting a third of the others' rate: the lab's `hot-shard`.
    HotShard,
    /// `hot-shard` with every shard at the same rate: the reference of its cold-shard figure
    /// (the lab's `even-shards`).
    EvenShards,
}

/// How long the phases last: the lab's lengths (`Length` in `lab/src/loadgen/config.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Length {
    /// The suite's: burst 1 + 4 + 3 s, steady 5 s.
    Suite,
    /// `--quick`: burst 2 + 6 + 4 s, steady 8 s.
    Quick,
    /// The default: burst 5 + 15 + 10 s, steady 20 s.
    Default,
    /// `--long`: burst 10 + 15 + 20 s, steady 30 s.
    Long,
}

/// One phase: `load` × capacity for `secs`.
#[derive(Clone, Debug, PartialEq)]
pub struct Phase {
    pub name: &'static str,
    pub load: f64,
    pub secs: f64,
}

/// A scenario's schedule and its server settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    pub name: ScenarioName,
    pub phases: Vec<Phase>,
    /// The phase whose goodput is the burst figure (`burst ÷ cap` in the lab).
    pub burst: Option<usize>,
    /// Virtual cores (the lab's 2; `flood`: 1).
    pub cores: u32,
    /// Core time per rejection (ms; the lab's 0.3 everywhere, `flood`'s named constant).
    pub rejection_ms: f64,
    /// Share of attempts the server rejects at random for overload, whatever its load (the
    /// emulator's `randomRejectionShare`): `transient`'s 0.3, 0 elsewhere.
    pub random_rejection: f64,
    /// The application's deadline, when the scenario has its own (`transient`: the lab's
    /// `TRANSIENT_DEADLINE`, 1 s); `--deadline-ms` overrides it.
    pub deadline: Option<std::time::Duration>,
    /// The operation mix: each kind's share of the requests.
    pub mix: [(OpKind, f64); 4],
    /// Core time of a point read and a range read (ms), when the scenario sets its own (the
    /// sharded scenarios: [`HOT_COSTS_MS`]).
    pub read_costs: Option<(f64, f64)>,
    /// The sharded cluster the scenario runs on; `None`: one server.
    pub cluster: Option<Cluster>,
}

/// A sharded cluster as the lab's emulator runs it (`docs/emulator.md`, "Sharded persona"):
/// routers with no model of their own in front of shards, each shard a [`crate::server`]
/// model with its own limiter, the collection sharded on `_id` in equal ranges of the keys
/// `0..docs`.
///
/// A router forwards each attempt to the shards its key touches, in the same process (no
/// network between them), and retries a shard's error labelled `RetryableError` itself, as
/// mongos does: at most `router_retries` times, after full-jitter backoff below
/// `min(router_max_backoff_ms, router_base_backoff_ms · 2^(n-1))` whole milliseconds,
/// interrupted by the attempt's `maxTimeMS` (answered 50). An overload error it gives up on
/// reaches the client with `SystemOverloadedError` alone (mongos's label rule), or with the
/// shard's labels when `shard_labels` is set (the emulator's `labRouterShardErrorLabels`).
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    /// Routers; the client sends each attempt to one drawn uniformly (every router is in the
    /// connection string and equally near), a retry to one of the others.
    pub routers: u32,
    pub shards: u32,
    /// The shard whose requests the cold-shard figure leaves out (named even where no shard is
    /// overloaded, so the reference counts the same requests).
    pub hot_index: u32,
    /// The hot shard's limiter rate as a share of the others' (`None`: the same).
    pub hot_share: Option<f64>,
    /// The keys `0..docs` and a range read's length (`{_id: {$gte: k, $lt: k + range_len}}`).
    pub docs: i64,
    pub range_len: i64,
    /// mongos's `defaultClientMaxRetryAttempts`, `defaultClientBaseBackoffMillis` and
    /// `defaultClientMaxBackoffMillis` (3, 100, 10,000).
    pub router_retries: u32,
    pub router_base_backoff_ms: u64,
    pub router_max_backoff_ms: u64,
    /// Whether a router passes on the shard's labels instead of `SystemOverloadedError` alone.
    pub shard_labels: bool,
}

impl Cluster {
    /// The lab's layout (`SHARD_ROUTERS`, `SHARDS`, `HOT_SHARD_INDEX`, the default `docs` and
    /// `range_len`) and mongos's retry defaults.
    pub fn lab(hot_share: Option<f64>) -> Cluster {
        Cluster {
            routers: 3,
            shards: 3,
            hot_index: 1,
            hot_share,
            docs: 1000,
            range_len: 20,
            router_retries: 3,
            router_base_backoff_ms: 100,
            router_max_backoff_ms: 10_000,
            shard_labels: false,
        }
    }

    /// The shards of `0..docs` and the hot one, as the lab attributes requests to them.
    fn keys(&self) -> arrivals::ShardKeys {
        arrivals::ShardKeys::new(self.docs, self.shards as usize, self.hot_index as usize)
    }

    /// The shard owning `key`.
    pub fn shard_of(&self, key: i64) -> u32 {
        self.keys().shard_of(key) as u32
    }

    /// The shards a request touches, lowest and highest (every shard between them too), as
    /// the emulator's routers target it ([`arrivals::ShardKeys::touched`]).
    pub fn touched(&self, kind: OpKind, key: i64) -> (u32, u32) {
        let (low, high) = self.keys().touched(kind, key, self.range_len);
        (low as u32, high as u32)
    }

    /// Whether a request touches only shards other than the hot one.
    pub fn is_cold(&self, kind: OpKind, key: i64) -> bool {
        self.keys().is_cold(kind, key, self.range_len)
    }

    /// Checks the layout.
    ///
    /// # Errors
    ///
    /// A message naming the setting out of range.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=64).contains(&self.routers) {
            return Err(format!("routers: {} is not from 1 to 64", self.routers));
        }
        // A request's shards are a bit set in a u64.
        if !(1..=64).contains(&self.shards) {
            return Err(format!("shards: {} is not from 1 to 64", self.shards));
        }
        if self.hot_index >= self.shards {
            return Err(format!(
                "hot shard: {} is not one of the {} shards",
                self.hot_index, self.shards
            ));
        }
        if let Some(share) = self.hot_share {
            if !(share.is_finite() && share > 0.0 && share <= 100.0) {
                return Err(format!("hot shard's share: {share} is not above 0"));
            }
        }
        if self.docs < i64::from(self.shards) || self.range_len < 0 {
            return Err("keys: each shard needs a key, and a range a length of 0 or more".into());
        }
        if self.router_retries > 100 || self.router_max_backoff_ms > 3_600_000 {
            return Err("router retries: at most 100, backoff at most an hour".into());
        }
        Ok(())
    }
}

/// `flood`'s load as a multiple of capacity (`FLOOD_LOAD`).
pub const FLOOD_LOAD: f64 = 5.0;
/// `sustained`'s load (`Scenario::sustained`).
pub const SUSTAINED_LOAD: f64 = 2.0;
/// `transient`'s load and share of attempts rejected at random (the lab's `transient-30`).
pub const TRANSIENT_LOAD: f64 = 0.5;
pub const TRANSIENT_REJECTION: f64 = 0.3;
/// `transient`'s deadline: the lab's (`TRANSIENT_DEADLINE`), long enough that the spec's
/// backoff does not decide which requests fail.
pub const TRANSIENT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(1);
/// `transient`'s length in the suite (s): the lab's `transient-30` there
/// (`TRANSIENT_SWEEP_SUITE_SECS`), shorter than the other scenarios' 5 s.
pub const TRANSIENT_SUITE_SECS: f64 = 3.0;
/// The sharded scenarios' load, as a multiple of one shard's capacity (the lab's `HOT_LOAD`):
/// each shard receives a third of it.
pub const SHARDED_LOAD: f64 = 1.5;
/// The sharded scenarios' costs of a point read and a range read (ms; `HOT_COSTS_MS`), and
/// their mix (`HOT_MIX`: reads only).
pub const HOT_COSTS_MS: (f64, f64) = (4.0, 10.0);
pub const HOT_MIX: [(OpKind, f64); 4] = [
    (OpKind::PointRead, 0.90),
    (OpKind::RangeRead, 0.10),
    (OpKind::Insert, 0.0),
    (OpKind::Update, 0.0),
];
/// The hot shard's limiter as a share of the others' in `hot-shard` (the lab's `hot_share`).
pub const HOT_SHARE: f64 = 1.0 / 3.0;

impl ScenarioName {
    /// Every scenario.
    pub const ALL: [ScenarioName; 4] = [
        ScenarioName::Burst,
        ScenarioName::Sustained,
        ScenarioName::Flood,
        ScenarioName::Transient,
    ];

    /// The sharded scenarios, which `all` leaves out (a grid of them is its own question).
    pub const SHARDED: [ScenarioName; 2] = [ScenarioName::HotShard, ScenarioName::EvenShards];

    /// The name on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            ScenarioName::Burst => "burst",
            ScenarioName::Sustained => "sustained",
            ScenarioName::Flood => "flood",
            ScenarioName::Transient => "transient",
            ScenarioName::HotShard => "hot-shard",
            ScenarioName::EvenShards => "even-shards",
        }
    }

    /// The scenario at `len`; `secs` (if given) stretches its schedule to that many seconds.
    pub fn build(self, len: Length, secs: Option<f64>) -> Scenario {
        let steady = match len {
            Length::Suite => 5.0,
            Length::Quick => 8.0,
            Length::Default => 20.0,
            Length::Long => 30.0,
        };
        let (phases, burst, cores) = match self {
            ScenarioName::Burst => {
                let (a, b, c) = match len {
                    Length::Suite => (1.0, 4.0, 3.0),
                    Length::Quick => (2.0, 6.0, 4.0),
                    Length::Default => (5.0, 15.0, 10.0),
                    Length::Long => (10.0, 15.0, 20.0),
                };
                (
                    vec![
                        Phase {
                            name: "base",
                            load: 0.5,
                            secs: a,
                        },
                        Phase {
                            name: "burst",
                            load: 1.3,
                            secs: b,
                        },
                        Phase {
                            name: "after",
                            load: 0.5,
                            secs: c,
                        },
                    ],
                    Some(1),
                    2,
                )
            }
            ScenarioName::Sustained => (
                vec![Phase {
                    name: "overload",
                    load: SUSTAINED_LOAD,
                    secs: steady,
                }],
                Some(0),
                2,
            ),
            ScenarioName::Flood => (
                vec![Phase {
                    name: "flood",
                    load: FLOOD_LOAD,
                    secs: steady,
                }],
                Some(0),
                1,
            ),
            ScenarioName::Transient => (
                vec![Phase {
                    name: "transient",
                    load: TRANSIENT_LOAD,
                    secs: match len {
                        Length::Suite => TRANSIENT_SUITE_SECS,
                        _ => steady,
                    },
                }],
                None,
                2,
            ),
            ScenarioName::HotShard | ScenarioName::EvenShards => (
                vec![Phase {
                    name: if self == ScenarioName::HotShard {
                        "hot"
                    } else {
                        "even"
                    },
                    load: SHARDED_LOAD,
                    secs: steady,
                }],
                Some(0),
                3,
            ),
        };
        let transient = self == ScenarioName::Transient;
        let sharded = ScenarioName::SHARDED.contains(&self);
        let mut s = Scenario {
            name: self,
            phases,
            burst,
            cores,
            rejection_ms: 0.3,
            random_rejection: if transient { TRANSIENT_REJECTION } else { 0.0 },
            deadline: transient.then_some(TRANSIENT_DEADLINE),
            mix: if sharded { HOT_MIX } else { MIX },
            read_costs: sharded.then_some(HOT_COSTS_MS),
            cluster: sharded
                .then(|| Cluster::lab((self == ScenarioName::HotShard).then_some(HOT_SHARE))),
        };
        if let Some(secs) = secs {
            let total = s.secs();
            if total > 0.0 {
                for p in &mut s.phases {
                    p.secs *= secs / total;
                }
            }
        }
        s
    }
}

impl Scenario {
    /// A scenario of one phase at `load` × capacity for `secs` (tests, and `--load`).
    pub fn steady(load: f64, secs: f64) -> Scenario {
        Scenario {
            name: ScenarioName::Sustained,
            phases: vec![Phase {
                name: "steady",
                load,
                secs,
            }],
            burst: Some(0),
            cores: 2,
            rejection_ms: 0.3,
            random_rejection: 0.0,
            deadline: None,
            mix: MIX,
            read_costs: None,
            cluster: None,
        }
    }

    /// The schedule's length (s).
    pub fn secs(&self) -> f64 {
        self.phases.iter().map(|p| p.secs).sum()
    }

    /// Checks the phases.
    ///
    /// # Errors
    ///
    /// A message naming the phase out of range.
    pub fn validate(&self) -> Result<(), String> {
        if self.phases.is_empty() {
            return Err("a scenario needs a phase".into());
        }
        if !(0.0..=1.0).contains(&self.random_rejection) {
            return Err(format!(
                "random rejection share {} is not from 0 to 1",
                self.random_rejection
            ));
        }
        let shares: f64 = self.mix.iter().map(|&(_, w)| w).sum();
        if self.mix.iter().any(|&(_, w)| !(w.is_finite() && w >= 0.0))
            || (shares - 1.0).abs() > 1e-9
        {
            return Err("mix: the shares must be 0 or more and add up to 1".into());
        }
        if let Some(cluster) = &self.cluster {
            cluster.validate()?;
        }
        for p in &self.phases {
            if !(p.load.is_finite() && (0.0..=1000.0).contains(&p.load)) {
                return Err(format!(
                    "phase {}: load {} is not from 0 to 1000",
                    p.name, p.load
                ));
            }
            if !(p.secs.is_finite() && p.secs > 0.0 && p.secs <= 86_400.0) {
                return Err(format!(
                    "phase {}: {} s is not a length from 0 to 86400",
                    p.name, p.secs
                ));
            }
        }
        Ok(())
    }
}

/// The lab's operation mix (`OpMix::default`): 80 % point reads, 10 % range reads, 5 % inserts,
/// 5 % updates.
pub const MIX: [(OpKind, f64); 4] = [
    (OpKind::PointRead, 0.80),
    (OpKind::RangeRead, 0.10),
    (OpKind::Insert, 0.05),
    (OpKind::Update, 0.05),
];
