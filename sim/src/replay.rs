//! A lab run's own arrivals, replayed.
//!
//! The lab draws each repetition's open-loop schedule from a fixed seed (`--seed` + 1000 ×
//! repetition; instance `i` from that seed + `i`), with the `arrivals` crate. A repetition's
//! schedule holds, by chance, more or fewer requests in a phase than its rate expects, and the
//! lab's figures carry that luck. So when the simulator is compared with a lab suite it draws
//! nothing itself: it rebuilds every repetition's schedule with the same crate, seeds and
//! capacity ([`LabSchedule`], from the scenario's `summary.json`) and replays it request by
//! request ([`Replay`]), each lab instance as one client. Both sides then meet the same
//! requests, and the comparison is between the models, not between two sets of draws.

use arrivals::{Arrivals, OpMix, Phase, ScheduleSpec};
use serde_json::Value;

use crate::clock::{self, Nanos};
use crate::limits::MAX_CLIENTS;
use crate::server::{OpKind, ServerConfig, ServerStats, DELAY_NAMES, TIMER_TICK_MS};

/// One request of a replayed schedule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplayedArrival {
    /// When it arrives (virtual time since the schedule's start).
    pub at: Nanos,
    /// The client that sends it: the lab instance whose schedule holds it.
    pub client: u32,
    pub kind: OpKind,
    /// Its document key (on a sharded cluster, which shards it touches).
    pub key: i64,
    /// Its phase, as the lab's generator assigned it.
    pub phase: usize,
}

/// A whole schedule to replay: every instance's arrivals, merged in time order.
#[derive(Clone, Debug, PartialEq)]
pub struct Replay {
    /// The instances the schedule was drawn for; the run needs as many clients.
    pub clients: u32,
    pub arrivals: Vec<ReplayedArrival>,
}

impl Replay {
    /// The schedules of [`arrivals::build`] (index = instance), merged: instance `i` is client
    /// `i`, and arrivals at the same instant keep the order of their instances.
    pub fn from_instances(schedules: &[Vec<arrivals::Arrival>]) -> Replay {
        let mut merged: Vec<ReplayedArrival> = schedules
            .iter()
            .enumerate()
            .flat_map(|(client, schedule)| {
                schedule.iter().map(move |a| ReplayedArrival {
                    at: clock::nanos(a.at),
                    client: client as u32,
                    kind: a.kind,
                    key: a.key,
                    phase: a.phase,
                })
            })
            .collect();
        // Stable: ties stay in instance order.
        merged.sort_by_key(|a| a.at);
        Replay {
            clients: schedules.len() as u32,
            arrivals: merged,
        }
    }

    /// Checks that a run of `clients` clients over phases ending at `phase_ends` can replay
    /// the schedule.
    ///
    /// # Errors
    ///
    /// A message saying what does not fit.
    pub fn validate(&self, clients: u32, phase_ends: &[Nanos]) -> Result<(), String> {
        if self.clients != clients {
            return Err(format!(
                "the replayed schedule is for {} clients, the run has {clients}",
                self.clients
            ));
        }
        let end = phase_ends.last().copied().unwrap_or(0);
        for a in &self.arrivals {
            if a.phase >= phase_ends.len() || a.at >= end {
                return Err(format!(
                    "a replayed arrival at {} ns in phase {} lies outside the scenario's {} \
                     phases ({end} ns)",
                    a.at,
                    a.phase,
                    phase_ends.len()
                ));
            }
        }
        Ok(())
    }
}

/// One lab run of a scenario: a variant in a repetition.
#[derive(Clone, Debug, PartialEq)]
pub struct LabRun {
    /// The variant's name in the lab (`fork-recommended`, ...).
    pub variant: String,
    pub repetition: usize,
    /// Requests its schedule held (every variant of a repetition meets the same schedule).
    pub offered: u64,
    /// Valid runs are the ones the lab's medians are over.
    pub valid: bool,
    /// What the host's scheduling cost the emulator in this run.
    pub host: HostLatencies,
    /// Where its completed requests' time went (`None` for runs before 2026-12-05 17:50).
    pub completions: Option<Completions>,
    /// Requests that sent at least one retry.
    pub retried: Option<u64>,
    /// How bunched its attempts reached the server (`None` for runs before 2026-12-05 18:30).
    pub arrival_gaps: Option<ArrivalGaps>,
}

/// Where the time of the requests that did all their work went: from reaching the server to
/// holding a ticket (`wait`), and from then to completing (`run`), summed (ms) and counted in
/// the emulator's buckets ([`DELAY_NAMES`]). From a lab run's counters (`completedWaitMs`,
/// `completedWaits`, `completedRunMs`, `completedRuns`) or a simulation's [`ServerStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Completions {
    pub wait_ms: f64,
    pub run_ms: f64,
    pub waits: [f64; 11],
    pub runs: [f64; 11],
}

impl Completions {
    /// From a run's server counters; `None` if it has none of them.
    pub fn from_counters(server: &Value) -> Option<Completions> {
        Some(Completions {
            wait_ms: server["completedWaitMs"].as_f64()?,
            run_ms: server["completedRunMs"].as_f64()?,
            waits: sizes(server, "completedWaits")?,
            runs: sizes(server, "completedRuns")?,
        })
    }

    /// From a simulation's server counters.
    pub fn from_stats(stats: &ServerStats) -> Completions {
        Completions {
            wait_ms: stats.completed_waits.ns as f64 / 1e6,
            run_ms: stats.completed_runs.ns as f64 / 1e6,
            waits: stats.completed_waits.counts(),
            runs: stats.completed_runs.counts(),
        }
    }

    /// Requests counted.
    pub fn count(&self) -> f64 {
        self.runs.iter().sum()
    }

    /// The mean over several runs' figures (all zero for none).
    pub fn mean(all: &[Completions]) -> Completions {
        let mut m = Completions::default();
        let n = all.len().max(1) as f64;
        for c in all {
            m.wait_ms += c.wait_ms / n;
            m.run_ms += c.run_ms / n;
            for i in 0..11 {
                m.waits[i] += c.waits[i] / n;
                m.runs[i] += c.runs[i] / n;
            }
        }
        m
    }
}

/// Counts by size from a run's server counters (`{prefix}.le100us` and the other buckets of
/// [`DELAY_NAMES`]); `None` if one is missing.
fn sizes(server: &Value, prefix: &str) -> Option<[f64; 11]> {
    let mut out = [0.0; 11];
    for (o, name) in out.iter_mut().zip(DELAY_NAMES) {
        *o = server[format!("{prefix}.{name}")].as_f64()?;
    }
    Some(out)
}

/// How bunched the attempts reach the server: the gaps from each first attempt to the
/// previous one and from each retry to the previous one, counted by size; and, where they were
/// counted, from each first attempt to the previous retry and from each retry to the previous
/// first attempt (how the two kinds interleave). From a lab run's counters
/// (`firstAttemptGaps`, `retryGaps`, since 2026-12-05 18:30; `firstAttemptAfterRetryGaps`,
/// `retryAfterFirstAttemptGaps`, since 20:10) or a simulation's [`ServerStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ArrivalGaps {
    pub first: [f64; 11],
    pub retries: [f64; 11],
    pub first_after_retry: Option<[f64; 11]>,
    pub retry_after_first: Option<[f64; 11]>,
}

impl ArrivalGaps {
    /// From a run's server counters; `None` if it has none of them.
    pub fn from_counters(server: &Value) -> Option<ArrivalGaps> {
        Some(ArrivalGaps {
            first: sizes(server, "firstAttemptGaps")?,
            retries: sizes(server, "retryGaps")?,
            first_after_retry: sizes(server, "firstAttemptAfterRetryGaps"),
            retry_after_first: sizes(server, "retryAfterFirstAttemptGaps"),
        })
    }

    /// From a simulation's server counters.
    pub fn from_stats(stats: &ServerStats) -> ArrivalGaps {
        ArrivalGaps {
            first: stats.first_attempt_gaps.counts(),
            retries: stats.retry_gaps.counts(),
            first_after_retry: Some(stats.first_attempt_after_retry_gaps.counts()),
            retry_after_first: Some(stats.retry_after_first_attempt_gaps.counts()),
        }
    }

    /// Several runs' counts added up; the gaps across kinds only if every run counted them.
    pub fn sum(all: &[ArrivalGaps]) -> ArrivalGaps {
        let add = |a: &mut [f64; 11], b: &[f64; 11]| a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
        let add_some = |a: &mut Option<[f64; 11]>, b: &Option<[f64; 11]>| match (a.as_mut(), b) {
            (Some(a), Some(b)) => add(a, b),
            _ => *a = None,
        };
        let mut s = ArrivalGaps {
            first_after_retry: Some([0.0; 11]),
            retry_after_first: Some([0.0; 11]),
            ..ArrivalGaps::default()
        };
        for g in all {
            add(&mut s.first, &g.first);
            add(&mut s.retries, &g.retries);
            add_some(&mut s.first_after_retry, &g.first_after_retry);
            add_some(&mut s.retry_after_first, &g.retry_after_first);
        }
        s
    }
}

/// The latencies of the lab's host that the model's server takes as inputs, as one lab run
/// measured them: the emulator's cores time each hand-off of a core to a waiting slice
/// (`requestHandoffMs` over `requestHandoffs`, `otherHandoffMs` over `otherHandoffs`) and its
/// ticket pools each woken waiter's way to its ticket (`ticketWakeMs` over `ticketWakeups`).
/// They follow how busy the host is, so they move with the variant and the run. `None` where
/// the run counted fewer than [`HostLatencies::MIN_EVENTS`] (too few to matter, or to
/// measure): the model's defaults stand in.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostLatencies {
    /// Whether the run recorded these counters at all (runs before 2026-12-05 08:00 did not).
    pub recorded: bool,
    /// Mean hand-off to a request's slice (ms): [`ServerConfig::handoff_ms`].
    pub handoff_ms: Option<f64>,
    /// Mean hand-off to work outside a request (ms): [`ServerConfig::rejection_handoff_ms`].
    pub rejection_handoff_ms: Option<f64>,
    /// Mean time a woken ticket waiter took to come (ms): [`ServerConfig::ticket_wake_ms`].
    pub ticket_wake_ms: Option<f64>,
    /// How late the timer fired after its tick, on average (ms):
    /// [`ServerConfig::timer_lateness_ms`]. The emulator counts how long each slice slept
    /// beyond what it asked (`sliceOversleepMs` over the `sliceOversleep` buckets, since
    /// 2026-12-05 13:00); a deadline falls half a tick before its tick on average, so the
    /// lateness is the mean oversleep less half a tick, at least 0.
    pub timer_lateness_ms: Option<f64>,
}

impl HostLatencies {
    /// Fewer events than this give no mean.
    pub const MIN_EVENTS: f64 = 100.0;

    /// From a run's server counters (`summary.json`'s `runs[].server`).
    pub fn from_counters(server: &Value) -> HostLatencies {
        let mean = |total: &str, count: &str| {
            let (t, n) = (server[total].as_f64()?, server[count].as_f64()?);
            (n >= Self::MIN_EVENTS && t.is_finite() && t >= 0.0).then(|| t / n)
        };
        HostLatencies {
            recorded: ["requestHandoffs", "otherHandoffs", "ticketWakeups"]
                .iter()
                .all(|k| server[*k].is_number()),
            handoff_ms: mean("requestHandoffMs", "requestHandoffs"),
            rejection_handoff_ms: mean("otherHandoffMs", "otherHandoffs"),
            ticket_wake_ms: mean("ticketWakeMs", "ticketWakeups"),
            timer_lateness_ms: Self::timer_lateness(server),
        }
    }

    /// The timer's mean lateness from the oversleep counters, where there are enough.
    fn timer_lateness(server: &Value) -> Option<f64> {
        let slept = server["sliceOversleepMs"].as_f64()?;
        let slices: f64 = (server.as_object()?.iter())
            .filter(|(k, _)| k.starts_with("sliceOversleep."))
            .filter_map(|(_, v)| v.as_f64())
            .sum();
        let half_tick = TIMER_TICK_MS / 2.0;
        (slices >= Self::MIN_EVENTS && slept.is_finite() && slept >= 0.0)
            .then(|| (slept / slices - half_tick).max(0.0))
    }

    /// Sets the measured ones on `server`.
    pub fn apply(&self, server: &mut ServerConfig) {
        if let Some(ms) = self.handoff_ms {
            server.handoff_ms = ms;
        }
        if let Some(ms) = self.rejection_handoff_ms {
            server.rejection_handoff_ms = ms;
        }
        if let Some(ms) = self.ticket_wake_ms {
            server.ticket_wake_ms = ms;
        }
        if let Some(ms) = self.timer_lateness_ms {
            server.timer_lateness_ms = ms;
        }
    }
}

/// How a lab scenario drew its arrivals, from its `summary.json`: what
/// [`arrivals::build`] needs to draw each repetition's schedule again, and the runs.
#[derive(Clone, Debug, PartialEq)]
pub struct LabSchedule {
    pub phases: Vec<Phase>,
    /// The capacity the lab calibrated for the scenario (ops/s). The lab calibrates once per
    /// scenario, before the first repetition, and every repetition's schedule and limiter use
    /// it (`lab/src/loadgen/runner.rs`); `summary.json` records that one figure.
    pub capacity: f64,
    pub instances: usize,
    pub spacing: Arrivals,
    pub mix: OpMix,
    /// Keys are drawn too: they are part of the draw order, and on a sharded cluster they
    /// decide which shards a request touches.
    pub docs: i64,
    /// The lab run's `--seed`. The lab does not write each repetition's seed down; it is
    /// [`arrivals::repetition_seed`] of this one, the formula the lab's runner calls.
    pub base_seed: u64,
    /// The sharded cluster the lab ran on (`config.sharding` of persona `sharded`), if any.
    pub sharding: Option<LabSharding>,
    pub runs: Vec<LabRun>,
}

/// A lab run's sharded cluster (`ShardLayout` in `lab/src/loadgen/config.rs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LabSharding {
    pub routers: u32,
    pub shards: u32,
    pub hot_index: u32,
    /// The hot shard's limiter as a share of the others' (`None`: the same).
    pub hot_share: Option<f64>,
    /// The routers' `defaultClientMaxRetryAttempts` where the run set it (`None`: mongos's
    /// default), and whether they passed the shard's labels on (lab runs before these were
    /// recorded left both at their defaults).
    pub router_retries: Option<u32>,
    pub router_shard_labels: bool,
}

impl LabSharding {
    fn from_config(sharding: &Value) -> Option<LabSharding> {
        let count = |key: &str| sharding[key].as_u64().and_then(|n| u32::try_from(n).ok());
        Some(LabSharding {
            routers: count("routers")?,
            shards: count("shards")?,
            hot_index: count("hotIndex")?,
            hot_share: sharding["hotShare"].as_f64(),
            router_retries: count("routerRetries"),
            router_shard_labels: sharding["routerShardLabels"].as_bool() == Some(true),
        })
    }

    /// The cluster the lab ran, over the keys `0..docs` with range reads of `range_len`.
    pub fn cluster(&self, docs: i64, range_len: i64) -> crate::scenario::Cluster {
        let mut cluster = crate::scenario::Cluster::lab(self.hot_share);
        cluster.routers = self.routers;
        cluster.shards = self.shards;
        cluster.hot_index = self.hot_index;
        cluster.docs = docs;
        cluster.range_len = range_len;
        if let Some(n) = self.router_retries {
            cluster.router_retries = n;
        }
        cluster.shard_labels = self.router_shard_labels;
        cluster
    }
}

impl LabSchedule {
    /// Reads a lab scenario's `summary.json` (`source` names it in messages).
    ///
    /// # Errors
    ///
    /// A message naming the field that is missing or out of range.
    pub fn from_summary(json: &str, source: &str) -> Result<LabSchedule, String> {
        let summary: Value =
            serde_json::from_str(json).map_err(|e| format!("{source}: not a summary.json: {e}"))?;
        let missing = |field: &str| format!("{source}: no {field}");
        let config = &summary["config"];
        let mut phases = Vec::new();
        for p in config["scenario"]["phases"]
            .as_array()
            .ok_or_else(|| missing("config.scenario.phases"))?
        {
            let (Some(load), Some(secs)) = (p["load"].as_f64(), p["duration"].as_f64()) else {
                return Err(missing("phase load or duration"));
            };
            phases.push(Phase::new(
                p["name"].as_str().unwrap_or_default(),
                load,
                secs,
            ));
        }
        let spacing = match config["arrivals"].as_str() {
            Some("poisson") => Arrivals::Poisson,
            Some("fixed") => Arrivals::Fixed,
            other => return Err(format!("{source}: unknown arrivals {other:?}")),
        };
        let mix = &config["mix"];
        let weight = |kind: &str| {
            mix[kind]
                .as_f64()
                .ok_or_else(|| missing(&format!("mix.{kind}")))
        };
        let mix = OpMix {
            point: weight("point")?,
            range: weight("range")?,
            insert: weight("insert")?,
            update: weight("update")?,
            range_len: mix["range_len"]
                .as_i64()
                .ok_or_else(|| missing("mix.range_len"))?,
        };
        let mut runs = Vec::new();
        for r in summary["runs"].as_array().ok_or_else(|| missing("runs"))? {
            let (Some(variant), Some(repetition), Some(offered)) = (
                r["variant"].as_str(),
                r["rep"].as_u64(),
                r["offered"].as_u64(),
            ) else {
                return Err(missing("variant, rep or offered in a run"));
            };
            runs.push(LabRun {
                variant: variant.to_owned(),
                repetition: repetition as usize,
                offered,
                valid: r["invalid"].as_bool() == Some(false),
                host: HostLatencies::from_counters(&r["server"]),
                completions: Completions::from_counters(&r["server"]),
                retried: r["retried"].as_u64(),
                arrival_gaps: ArrivalGaps::from_counters(&r["server"]),
            });
        }
        let schedule = LabSchedule {
            phases,
            capacity: summary["capacity"]
                .as_f64()
                .ok_or_else(|| missing("capacity"))?,
            instances: config["instances"]
                .as_u64()
                .ok_or_else(|| missing("config.instances"))? as usize,
            spacing,
            mix,
            docs: config["docs"]
                .as_i64()
                .ok_or_else(|| missing("config.docs"))?,
            base_seed: config["seed"]
                .as_u64()
                .ok_or_else(|| missing("config.seed"))?,
            // Every summary holds a layout; only the sharded persona runs on it.
            sharding: match config["persona"].as_str() {
                Some("sharded") => Some(
                    LabSharding::from_config(&config["sharding"])
                        .ok_or_else(|| missing("config.sharding's routers, shards or hotIndex"))?,
                ),
                _ => None,
            },
            runs,
        };
        if !(schedule.capacity.is_finite() && schedule.capacity > 0.0) {
            return Err(format!(
                "{source}: capacity {} is not above 0",
                schedule.capacity
            ));
        }
        if !(1..=MAX_CLIENTS as usize).contains(&schedule.instances) {
            return Err(format!(
                "{source}: {} instances is not from 1 to {}",
                schedule.instances, MAX_CLIENTS
            ));
        }
        Ok(schedule)
    }

    /// The seed repetition `rep` drew its schedule from.
    pub fn seed(&self, rep: usize) -> u64 {
        arrivals::repetition_seed(self.base_seed, rep)
    }

    /// Repetition `rep`'s schedule, drawn by the lab's generator at `capacity` ops/s: at the
    /// lab's calibrated capacity it is the schedule the lab ran; at another capacity, the same
    /// draws at other rates.
    pub fn replay(&self, rep: usize, capacity: f64) -> Replay {
        Replay::from_instances(&arrivals::build(&ScheduleSpec {
            phases: &self.phases,
            capacity,
            instances: self.instances,
            arrivals: self.spacing,
            mix: &self.mix,
            docs: self.docs,
            seed: self.seed(rep),
        }))
    }

    /// The repetitions in which `variant` ran valid, in order: the runs its lab medians are
    /// over.
    pub fn valid_repetitions(&self, variant: &str) -> Vec<usize> {
        let mut reps: Vec<usize> = self
            .runs
            .iter()
            .filter(|r| r.variant == variant && r.valid)
            .map(|r| r.repetition)
            .collect();
        reps.sort_unstable();
        reps.dedup();
        reps
    }

    /// What the host cost the emulator when `variant` ran repetition `rep` (all `None` if
    /// no such run).
    pub fn host(&self, variant: &str, rep: usize) -> HostLatencies {
        self.run(variant, rep).map(|r| r.host).unwrap_or_default()
    }

    /// Where the completed requests' time went when `variant` ran repetition `rep`, if the
    /// run recorded it.
    pub fn completions(&self, variant: &str, rep: usize) -> Option<Completions> {
        self.run(variant, rep).and_then(|r| r.completions)
    }

    /// The run of `variant` in repetition `rep`, if the summary has it.
    pub fn run(&self, variant: &str, rep: usize) -> Option<&LabRun> {
        self.runs
            .iter()
            .find(|r| r.variant == variant && r.repetition == rep)
    }

    /// Checks that `replay`, drawn for repetition `rep` at the lab's capacity, holds as many
    /// requests as every lab run of that repetition offered: the generator, its seeds and its
    /// inputs are the lab's.
    ///
    /// # Errors
    ///
    /// A message with both counts when a run of the repetition offered another number.
    pub fn check(&self, rep: usize, replay: &Replay) -> Result<(), String> {
        let drawn = replay.arrivals.len() as u64;
        match self
            .runs
            .iter()
            .find(|r| r.repetition == rep && r.offered != drawn)
        {
            Some(r) => Err(format!(
                "repetition {rep}: the lab's generator with seed {} draws {drawn} requests, \
                 but the lab's {} run offered {}: the schedule replayed is not the lab's",
                self.seed(rep),
                r.variant,
                r.offered
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first repetition of the suite of 2026-12-05 01:17's `burst` (`lab-runs/suite-0103`),
    /// trimmed to what the simulator reads.
    const SUMMARY: &str = r#"{
        "config": {
            "scenario": {"name": "burst", "phases": [
                {"name": "base", "load": 0.5, "duration": 1.0},
                {"name": "burst", "load": 1.3, "duration": 4.0},
                {"name": "after", "load": 0.5, "duration": 3.0}]},
            "arrivals": "poisson", "instances": 4, "docs": 1000, "seed": 4,
            "mix": {"point": 80.0, "range": 10.0, "insert": 5.0, "update": 5.0, "range_len": 20}
        },
        "capacity": 754.0,
        "runs": [
            {"variant": "upstream-best", "rep": 0, "offered": 5413, "invalid": false},
            {"variant": "fork-controls", "rep": 0, "offered": 5413, "invalid": true},
            {"variant": "upstream-best", "rep": 1, "offered": 5487, "invalid": false,
             "server": {"requestHandoffs": 4000.0, "requestHandoffMs": 160.0,
                        "otherHandoffs": 50.0, "otherHandoffMs": 9.0,
                        "ticketWakeups": 1000.0, "ticketWakeMs": 250.0,
                        "sliceOversleepMs": 180.0, "sliceOversleep.le1ms": 150.0,
                        "sliceOversleep.le2ms": 50.0}}
        ]
    }"#;

    #[test]
    fn a_summary_rebuilds_the_labs_own_schedules() {
        let s = LabSchedule::from_summary(SUMMARY, "summary.json").expect("a summary");
        assert_eq!(s.instances, 4);
        assert_eq!(s.phases.len(), 3);
        assert_eq!(s.seed(1), 1004);
        assert_eq!(s.valid_repetitions("upstream-best"), [0, 1]);
        assert!(s.valid_repetitions("fork-controls").is_empty());
        // The lab's counts: 5,413 requests in repetition 0, 5,487 in repetition 1.
        for rep in 0..2 {
            let replay = s.replay(rep, s.capacity);
            s.check(rep, &replay).expect("the lab's schedule");
            assert_eq!(replay.clients, 4);
            assert!(replay.arrivals.windows(2).all(|w| w[0].at <= w[1].at));
            let end = clock::ms(8000.0);
            replay
                .validate(4, &[clock::ms(1000.0), clock::ms(5000.0), end])
                .expect("fits the scenario");
            assert!(replay.validate(16, &[end]).is_err());
        }
        // Another repetition's schedule is not repetition 0's.
        let other = s.replay(1, s.capacity);
        assert!(s.check(0, &other).is_err());
    }

    #[test]
    fn a_runs_host_latencies_are_its_counters_means_where_it_counted_enough() {
        let s = LabSchedule::from_summary(SUMMARY, "summary.json").expect("a summary");
        let host = s.host("upstream-best", 1);
        assert_eq!(host.handoff_ms, Some(0.04));
        assert_eq!(host.ticket_wake_ms, Some(0.25));
        // 50 hand-offs to other work are too few for a mean.
        assert_eq!(host.rejection_handoff_ms, None);
        // 200 slices overslept 0.9 ms on average: the timer is 0.4 ms late.
        assert_eq!(host.timer_lateness_ms, Some(0.9 - TIMER_TICK_MS / 2.0));
        assert!(host.recorded);
        let mut server = ServerConfig::default();
        host.apply(&mut server);
        assert_eq!(server.handoff_ms, 0.04);
        assert_eq!(server.ticket_wake_ms, 0.25);
        assert_eq!(server.timer_lateness_ms, 0.9 - TIMER_TICK_MS / 2.0);
        assert_eq!(
            server.rejection_handoff_ms,
            ServerConfig::default().rejection_handoff_ms
        );
        // Runs from before the counters, or not in the summary, measured nothing.
        assert_eq!(s.host("upstream-best", 0), HostLatencies::default());
        assert_eq!(s.host("fork-recommended", 1), HostLatencies::default());
    }

    #[test]
    fn a_runs_completion_times_are_read_when_it_has_them_all() {
        let mut server = serde_json::json!({"completedWaitMs": 30.0, "completedRunMs": 70.0});
        for (i, name) in DELAY_NAMES.iter().enumerate() {
            server[format!("completedWaits.{name}")] = (i as f64).into();
            server[format!("completedRuns.{name}")] = f64::from(u8::from(i == 8)).into();
        }
        let c = Completions::from_counters(&server).expect("every counter");
        assert_eq!(c.count(), 1.0);
        assert_eq!((c.wait_ms, c.run_ms), (30.0, 70.0));
        assert_eq!(c.waits[10], 10.0);
        let twice = Completions::mean(&[c, c]);
        assert_eq!(twice, c);
        // A bucket missing (a run from before the counters, or a partial one): nothing.
        server
            .as_object_mut()
            .map(|o| o.remove("completedRuns.le5ms"));
        assert_eq!(Completions::from_counters(&server), None);
        let s = LabSchedule::from_summary(SUMMARY, "summary.json").expect("a summary");
        assert_eq!(s.completions("upstream-best", 1), None);
    }

    #[test]
    fn a_runs_arrival_gaps_are_read_and_added_up_over_runs() {
        let mut gaps = serde_json::json!({});
        for (i, name) in DELAY_NAMES.iter().enumerate() {
            gaps[format!("firstAttemptGaps.{name}")] = f64::from(u8::from(i == 3)).into();
            gaps[format!("retryGaps.{name}")] = f64::from(u8::from(i == 0)).into();
        }
        // A run from before the gaps across kinds, and one with them.
        let before = ArrivalGaps::from_counters(&gaps).expect("every counter");
        assert_eq!(before.first_after_retry, None);
        for (i, name) in DELAY_NAMES.iter().enumerate() {
            gaps[format!("firstAttemptAfterRetryGaps.{name}")] = f64::from(u8::from(i == 4)).into();
            gaps[format!("retryAfterFirstAttemptGaps.{name}")] = f64::from(u8::from(i == 1)).into();
        }
        let g = ArrivalGaps::from_counters(&gaps).expect("every counter");
        let two = ArrivalGaps::sum(&[g, g]);
        assert_eq!(
            (two.first[3], two.retries[0], two.first[0]),
            (2.0, 2.0, 0.0)
        );
        assert_eq!(two.first_after_retry.map(|c| c[4]), Some(2.0));
        assert_eq!(two.retry_after_first.map(|c| c[1]), Some(2.0));
        let mixed = ArrivalGaps::sum(&[g, before]);
        assert_eq!((mixed.first[3], mixed.first_after_retry), (2.0, None));
        // A run with none of them (the completion counters only): nothing.
        let server = serde_json::json!({"completedWaitMs": 30.0, "completedRunMs": 70.0});
        assert_eq!(ArrivalGaps::from_counters(&server), None);
    }

    #[test]
    fn a_summary_without_what_the_schedule_needs_is_refused() {
        assert!(LabSchedule::from_summary("{}", "s.json").is_err());
        assert!(LabSchedule::from_summary("not json", "s.json").is_err());
        let no_seed = SUMMARY.replace("\"seed\": 4,", "");
        assert!(LabSchedule::from_summary(&no_seed, "s.json").is_err());
    }
}
