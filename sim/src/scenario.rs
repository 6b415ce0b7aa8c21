//! The load shapes, the lab's (`lab/src/loadgen/scenarios.rs` and `config.rs`): phases of
//! open-loop Poisson load as a multiple of the server's capacity, and the server settings each
//! scenario changes.

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

impl ScenarioName {
    /// Every scenario.
    pub const ALL: [ScenarioName; 4] = [
        ScenarioName::Burst,
        ScenarioName::Sustained,
        ScenarioName::Flood,
        ScenarioName::Transient,
    ];

    /// The name on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            ScenarioName::Burst => "burst",
            ScenarioName::Sustained => "sustained",
            ScenarioName::Flood => "flood",
            ScenarioName::Transient => "transient",
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
        };
        let transient = self == ScenarioName::Transient;
        let mut s = Scenario {
            name: self,
            phases,
            burst,
            cores,
            rejection_ms: 0.3,
            random_rejection: if transient { TRANSIENT_REJECTION } else { 0.0 },
            deadline: transient.then_some(TRANSIENT_DEADLINE),
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
pub const MIX: [(crate::server::OpKind, f64); 4] = [
    (crate::server::OpKind::PointRead, 0.80),
    (crate::server::OpKind::RangeRead, 0.10),
    (crate::server::OpKind::Insert, 0.05),
    (crate::server::OpKind::Update, 0.05),
];
