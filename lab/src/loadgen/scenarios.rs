//! The named scenarios (`lab run --scenario NAME`, `docs/lab.md`): each is a schedule plus
//! the server and application settings that make one situation an overload control must
//! handle. Every parameter has a default here ([`ScenarioParams::default`]); the command line
//! overrides them.

use std::time::Duration;

use serde::Serialize;

use super::config::{HotMember, LabConfig, Length, Load, OnDeadline, ServerMode, Variant};

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
}

impl ScenarioName {
    /// Every scenario, in the suite's order.
    pub const ALL: [ScenarioName; 8] = [
        ScenarioName::Burst,
        ScenarioName::Sustained,
        ScenarioName::Transient,
        ScenarioName::AppRetries,
        ScenarioName::Flood,
        ScenarioName::NoLimiter,
        ScenarioName::FastPath,
        ScenarioName::HotMember,
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

/// The scenarios' parameters; [`Default`] holds the documented defaults.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScenarioParams {
    /// `transient`: share of admitted data requests rejected at random.
    pub reject_share: f64,
    /// `app-retries`: how often the application retries an overload error.
    pub app_retries: u32,
    /// `flood`: offered load as a multiple of capacity.
    pub flood_load: f64,
    /// `flood`: core time per rejection (ms).
    pub rejection_ms: f64,
    /// `fast-path`: closed-loop workers in all.
    pub workers: usize,
}

impl Default for ScenarioParams {
    fn default() -> Self {
        ScenarioParams {
            reject_share: TRANSIENT_REJECT_SHARE,
            app_retries: APP_RETRIES,
            flood_load: FLOOD_LOAD,
            rejection_ms: FLOOD_REJECTION_MS,
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
        if !(self.rejection_ms.is_finite() && (0.0..=100.0).contains(&self.rejection_ms)) {
            return Err("--rejection-ms must be between 0 and 100".into());
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
            ScenarioName::Transient => {
                cfg.scenario = Scenario::steady("transient", "base", 0.5, steady);
                cfg.random_reject_share = p.reject_share;
                cfg.deadline = TRANSIENT_DEADLINE;
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
                cfg.on_deadline = OnDeadline::Drop;
                model = serde_json::json!({
                    "cores": FLOOD_CORES,
                    "costs": { "rejectionMs": p.rejection_ms },
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
            ScenarioName::FastPath => {
                // Three times the steady length. Its variants take turns in quarter-second
                // slices (`runner::run_interleaved`), four rounds per second of the scenario, and
                // its figure, a ratio of two CPU-bound throughputs held to 2 %, needs many
                // slices: two slices taken in turn differ by 15–18 % on a shared 2-core machine,
                // so the 95 % interval of the suite's pooled ratio (3 repetitions of 15 s, 180
                // slices a variant) is about ±2.5 %; twice the slices narrow it by a third, for
                // 3 more minutes of a suite that must finish in 15 (`pathbench` and instruction
                // counts resolve less; docs/lab.md, "How precise the fast path is").
                let mut s = Scenario::steady("fast-path", "closed", 1.0, 3.0 * steady);
                // A closed loop has no burst to recover from.
                s.burst = None;
                cfg.scenario = s;
                cfg.server_mode = ServerMode::None;
                cfg.load = Load::Closed { workers: p.workers };
                cfg.saturation_expected = true;
            }
        }
        if let Some(user) = cfg.model_overrides.take() {
            merge_json(&mut model, user);
        }
        let empty = model.as_object().is_some_and(|o| o.is_empty());
        cfg.model_overrides = (!empty).then_some(model);
    }

    /// The variants this scenario runs when none are named: upstream's configurations, and
    /// the fork's controls where the scenario judges them (where they help and where they may
    /// hurt). `fork-default` (every control off, so upstream's behaviour) runs in `burst`, to
    /// show the fork without options behaves as upstream, and in `fast-path`, where the
    /// fork's cost is the question. `fork-timeout` and `fork-budget`, each half of the
    /// recommended settings, run where overload is sustained (`sustained`, `app-retries`, and
    /// `fork-timeout` in `no-limiter`). The suite's 15 minutes do not allow every variant in
    /// every scenario.
    pub fn default_variants(self) -> Vec<Variant> {
        let names: &[&str] = match self {
            ScenarioName::Burst => &[
                "upstream-default",
                "upstream-no-retries",
                "fork-default",
                "fork-budget-timeout",
                "fork-controls",
            ],
            ScenarioName::Sustained | ScenarioName::AppRetries => &[
                "upstream-default",
                "upstream-no-retries",
                "fork-timeout",
                "fork-budget",
                "fork-budget-timeout",
                "fork-controls",
            ],
            ScenarioName::Transient => &[
                "upstream-default",
                "upstream-no-retries",
                "fork-default",
                "fork-budget-timeout",
                "fork-controls",
            ],
            ScenarioName::Flood => &[
                "upstream-default",
                "upstream-no-retries",
                "fork-budget-timeout",
                "fork-throttle",
                "fork-controls",
            ],
            ScenarioName::NoLimiter => &[
                "upstream-default",
                "upstream-no-retries",
                "fork-timeout",
                "fork-concurrency",
                "fork-controls",
            ],
            ScenarioName::FastPath => &[
                "upstream-default",
                "fork-default",
                "fork-budget-timeout",
                "fork-controls",
            ],
            ScenarioName::HotMember => &[
                "upstream-default",
                "upstream-retargeting",
                "fork-retargeting",
                "fork-budget-timeout",
                "fork-controls",
            ],
        };
        names
            .iter()
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
        assert_eq!(cfg.scenario.duration(), Duration::from_secs(15));
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
        assert_eq!(names.len(), 5, "{names:?}");
        assert!(names.iter().any(|n| n == "fork-retargeting"));

        let mut cfg = LabConfig::default();
        ScenarioName::AppRetries.apply(&mut cfg, Length::Suite, &p);
        assert_eq!(cfg.app_retries, 2);
        assert!(cfg.model_overrides.is_none());
    }

    #[test]
    fn every_scenario_judges_fork_controls_against_upstream() {
        for s in ScenarioName::ALL {
            let v = s.default_variants();
            assert!(v.len() >= 3, "{s:?}: {v:?}");
            assert_eq!(v[0].name, "upstream-default", "{s:?}: the ratio base runs");
            assert!(v
                .iter()
                .any(|x| x.driver == super::super::config::Driver::Fork));
            // The recommended settings are judged everywhere but where they change nothing.
            if s != ScenarioName::NoLimiter {
                assert!(v.iter().any(|x| x.name == "fork-budget-timeout"), "{s:?}");
            }
            // Every control together is judged everywhere (issue 15).
            assert!(v.iter().any(|x| x.name == "fork-controls"), "{s:?}");
        }
        let mut cfg = LabConfig::default();
        ScenarioName::Flood.apply(&mut cfg, Length::Suite, &ScenarioParams::default());
        assert_eq!(cfg.on_deadline, OnDeadline::Drop);
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
        ];
        for p in bad {
            assert!(p.check().is_err(), "{p:?}");
        }
    }
}
