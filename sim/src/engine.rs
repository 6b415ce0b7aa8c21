//! The event loop: arrivals, each client's controller, the server (or a sharded cluster's
//! routers and shards), replies, deadlines.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use overload::control::{
    Attempt, AttemptEnd, AttemptKind, Controller, Refusal, RetryAnswer, RetryQuestion, SlotRequest,
    StartAnswer,
};
use overload::cursor::ServerTimeLimit;
use overload::deadline::Deadline;
use overload::labels::Overload;
use overload::retry::{Failure, RetryState};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::clock::{self, Nanos};
use crate::event::{Event, Reply, Request, Tag};
use crate::limits::MAX_CLIENTS;
use crate::queue::{Handle, Queue, Slab};
use crate::replay::Replay;
use crate::report::{Outcome, Report};
use crate::scenario::{Cluster, Scenario};
use crate::server::{keyed_unit, OpKind, Server, ServerConfig, ServerStats};
use crate::variant::{MaxTime, OnDeadline, Overrides, Variant};

/// The driver's default `maxPoolSize`, which the lab's variants keep.
pub const POOL_SIZE: u32 = 100;

/// The key of the one server every client talks to (on a cluster, each router is its index).
const SERVER: u32 = 0;
/// One second of virtual time: the per-second series' step.
const SECOND: Nanos = 1_000_000_000;

/// Salts that split the one seed into independent streams, so that every variant meets the same
/// arrivals whatever its policies draw.
const ARRIVAL_SALT: u64 = 0x243f_6a88_85a3_08d3;
const POLICY_SALT: u64 = 0x1319_8a2e_0370_7344;
const SERVER_SALT: u64 = 0xa409_3822_299f_31d0;
const TIMER_SALT: u64 = 0x082e_fa98_ec4e_6c89;
const ROUTER_SALT: u64 = 0xbe54_66cf_34e9_0c6c;

/// The uniform draw that decides whether an attempt meets a random rejection, keyed by the
/// request's client, arrival and attempt number (which every variant shares) and the seed:
/// splitmix64's finaliser over their mix, scaled to `[0, 1)`.
fn rejection_draw(seed: u64, client: u32, arrival: Nanos, attempt: u32) -> f64 {
    keyed_unit(
        (seed ^ SERVER_SALT)
            .wrapping_add(arrival.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .wrapping_add(u64::from(client) << 32 | u64::from(attempt)),
    )
}

/// The router an attempt goes to: drawn uniformly among the routers not in `avoided` (all of
/// them when it names every one), keyed like [`rejection_draw`] so that every variant draws the
/// same number for the same attempt of the same request.
fn router_draw(
    seed: u64,
    client: u32,
    arrival: Nanos,
    attempt: u32,
    routers: u32,
    avoided: Option<&HashSet<u32>>,
) -> u32 {
    let u = keyed_unit(
        (seed ^ ROUTER_SALT)
            .wrapping_add(arrival.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .wrapping_add(u64::from(client) << 32 | u64::from(attempt)),
    );
    let mut candidates: Vec<u32> = (0..routers)
        .filter(|r| avoided.is_none_or(|avoided| !avoided.contains(r)))
        .collect();
    if candidates.is_empty() {
        candidates = (0..routers).collect();
    }
    let i = ((u * candidates.len() as f64) as usize).min(candidates.len() - 1);
    candidates[i]
}

/// Everything one run needs.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub scenario: Scenario,
    pub variant: Variant,
    /// Clients (application instances), each with its own controller; the load is split
    /// equally among them (each arrival goes to a client drawn uniformly).
    pub clients: u32,
    pub seed: u64,
    /// The application's deadline per request (the lab's `--deadline-ms`, 100).
    pub deadline: Duration,
    /// The network round trip.
    pub rtt: Duration,
    /// 100 % load (ops/s); `None`: the server's nominal capacity for the mix.
    pub capacity: Option<f64>,
    /// The ingress limiter's rate as a share of capacity (the lab's 0.9; 0: no limiter).
    pub limiter_share: f64,
    /// The server's settings; the scenario's cores and rejection cost replace the defaults.
    pub server: ServerConfig,
    /// How long after the schedule the loop runs on for requests to end (virtual time).
    pub drain: Duration,
    /// Options set on every variant that has the control.
    pub overrides: Overrides,
    /// A lab run's schedule to replay instead of drawing arrivals (`crate::replay`); `None`:
    /// Poisson arrivals drawn from the seed.
    pub replay: Option<Arc<Replay>>,
    /// Whether to record the counters every second of virtual time ([`Report::seconds`]).
    /// Off by default: each second reads every client's concurrency limit.
    pub series: bool,
    /// Connections per client (the driver's `maxPoolSize`, 100 by default): an attempt
    /// beyond them waits for one to come back, first come first served.
    pub pool_size: u32,
}

impl RunConfig {
    /// The lab's settings for `scenario`, `variant` and `clients`.
    pub fn new(scenario: Scenario, variant: Variant, clients: u32, seed: u64) -> Self {
        let deadline = scenario.deadline.unwrap_or(Duration::from_millis(100));
        Self {
            scenario,
            variant,
            clients,
            seed,
            deadline,
            rtt: Duration::from_micros(200),
            capacity: None,
            limiter_share: 0.9,
            server: ServerConfig::default(),
            drain: Duration::from_secs(30),
            overrides: Overrides::default(),
            replay: None,
            series: false,
            pool_size: POOL_SIZE,
        }
    }

    /// The instants the phases end (virtual time).
    pub fn phase_ends(&self) -> Vec<Nanos> {
        let mut end = 0.0;
        self.scenario
            .phases
            .iter()
            .map(|p| {
                end += p.secs;
                clock::ms(end * 1000.0)
            })
            .collect()
    }

    /// The server's configuration for this run (on a cluster, every shard's but the hot
    /// one's limiter: [`Self::server_configs`]).
    pub fn server_config(&self) -> ServerConfig {
        let mut s = self.server.clone();
        if let Some((point, range)) = self.scenario.read_costs {
            (s.point_read_ms, s.range_read_ms) = (point, range);
        }
        s.cores = self.scenario.cores;
        s.rejection_ms = self.scenario.rejection_ms;
        s.random_rejection = self.scenario.random_rejection;
        s.half_rtt = clock::nanos(self.rtt) / 2;
        let cap = self.effective_capacity(&s);
        s.limiter_rate = (self.limiter_share > 0.0).then_some(self.limiter_share * cap);
        s
    }

    /// Every server's configuration: the one server's, or each shard's. A router reaches its
    /// shards in the same process, so a shard's reply takes no network time (the client's
    /// round trip is the router's); the hot shard's limiter admits its share of the others'
    /// rate.
    pub fn server_configs(&self) -> Vec<ServerConfig> {
        let one = self.server_config();
        let Some(cluster) = &self.scenario.cluster else {
            return vec![one];
        };
        (0..cluster.shards)
            .map(|i| {
                let mut s = one.clone();
                s.half_rtt = 0;
                if i == cluster.hot_index {
                    if let Some(share) = cluster.hot_share {
                        s.limiter_rate = s.limiter_rate.map(|rate| rate * share);
                    }
                }
                s
            })
            .collect()
    }

    /// 100 % load: the given capacity, else what the cores complete of the mix: cores × 1000 ÷
    /// the mix's mean time on a core in ms (its cost and its slices' hand-offs). On a cluster,
    /// one shard's (the lab's `hot-shard` calls that its capacity: the load is 150 % of it,
    /// a third of which reaches each shard).
    pub fn effective_capacity(&self, s: &ServerConfig) -> f64 {
        self.capacity.unwrap_or_else(|| {
            let mean: f64 = self
                .scenario
                .mix
                .iter()
                .map(|&(k, w)| w * s.core_ms(k))
                .sum();
            f64::from(s.cores) * 1000.0 / mean
        })
    }

    /// Checks every setting.
    ///
    /// # Errors
    ///
    /// A message naming the setting out of range.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_CLIENTS).contains(&self.clients) {
            return Err(format!(
                "clients: {} is not from 1 to {MAX_CLIENTS}",
                self.clients
            ));
        }
        if self.deadline.is_zero() || self.deadline > Duration::from_secs(3600) {
            return Err("deadline: must be above 0 and at most an hour".into());
        }
        if self.rtt > Duration::from_secs(10) {
            return Err("rtt: at most 10 s".into());
        }
        if let Some(c) = self.capacity {
            if !(c.is_finite() && c > 0.0 && c <= 1e7) {
                return Err(format!(
                    "capacity: {c} is not above 0 and at most 10,000,000 ops/s"
                ));
            }
        }
        if !(self.limiter_share.is_finite() && (0.0..=10.0).contains(&self.limiter_share)) {
            return Err("limiter share: must be from 0 to 10".into());
        }
        if self.drain > Duration::from_secs(3600) {
            return Err("drain: at most an hour".into());
        }
        if self.pool_size == 0 {
            return Err("pool size: at least 1 connection per client".into());
        }
        self.scenario.validate()?;
        Controller::<u32>::new(
            self.variant.settings(self.deadline, self.overrides),
            clock::now,
        )?;
        let s = self.server_config();
        s.validate()?;
        let cap = self.effective_capacity(&s);
        let peak = self
            .scenario
            .phases
            .iter()
            .map(|p| p.load)
            .fold(0.0, f64::max)
            * cap;
        if peak * self.scenario.secs() > 2e9 {
            return Err("the schedule asks for more than 2e9 requests".into());
        }
        if let Some(replay) = &self.replay {
            replay.validate(self.clients, &self.phase_ends())?;
        }
        Ok(())
    }
}

/// One attempt at a router, forwarded to its shards (mongos's `AsyncRequestsSender`). It
/// outlives the client's operation: a router goes on when its client stops waiting, as the
/// lab's routers do (they have no model of their own to watch the connection).
struct RouterCall {
    /// The client's attempt, to answer; also the child requests' tag at the shards.
    request: Request,
    /// Where `maxTimeMS` ends, counted from the router's receipt.
    max_time_end: Option<Nanos>,
    /// Shards still to answer (bit `i`: shard `i`).
    pending: u64,
    /// Retries made so far per shard.
    retries: [u8; 64],
}

enum Stage<'c> {
    /// Asking for a concurrency slot (only with adaptive concurrency).
    Slot(SlotRequest<'c, 'static, u32, ()>),
    /// Sent by the controller, waiting for a connection of the client's pool.
    Checkout { attempt: Attempt<'c, u32, ()> },
    /// An attempt is at the server.
    InFlight {
        attempt: Attempt<'c, u32, ()>,
        sent: Nanos,
    },
    /// Sleeping the backoff before a retry.
    Backoff(Duration),
    /// Between two steps of one event (never seen by another event).
    Idle,
}

struct Op<'c> {
    client: u32,
    kind: OpKind,
    /// Its document key (a router targets by it), and whether it touches no hot shard.
    key: i64,
    cold: bool,
    /// The server (router) its latest attempt went to.
    server: u32,
    arrival: Nanos,
    app_deadline: Nanos,
    phase: usize,
    /// The application still waits for it.
    app_waiting: bool,
    retry: RetryState,
    deadline: Option<Deadline>,
    stage: Stage<'c>,
    /// Attempts sent so far; the number of the one in flight.
    attempts: u32,
    /// Names the current wait (slot or backoff), so that stale wake-ups are ignored.
    wait: u32,
}

/// Where the open-loop arrivals come from.
enum ArrivalSource<'c> {
    /// Drawn during the run: Poisson at each phase's rate, each to a client drawn uniformly.
    /// (Boxed: the generator's state is twenty times the other variant's.)
    Drawn(Box<StdRng>),
    /// A lab run's schedule, request by request; `next` indexes the next one to arrive.
    Replayed { schedule: &'c Replay, next: usize },
}

struct Sim<'c> {
    cfg: &'c RunConfig,
    controllers: &'c [Controller<u32>],
    ops: Slab<Op<'c>>,
    /// The one server, or a cluster's shards (index = shard).
    servers: Vec<Server>,
    cluster: Option<&'c Cluster>,
    calls: Slab<RouterCall>,
    q: Queue<Event>,
    arrivals: ArrivalSource<'c>,
    policy: StdRng,
    server_rng: StdRng,
    /// Per client, operations waiting for a slot (woken one per release).
    slot_waiters: Vec<VecDeque<(Handle, u32)>>,
    /// Per client, the connections checked out, and the operations waiting for one.
    connections: Vec<u32>,
    checkout_waiters: Vec<VecDeque<(Handle, u32)>>,
    /// Phase boundaries (ns) and arrival rates (per ns).
    phase_ends: Vec<Nanos>,
    rates: Vec<f64>,
    report: Report,
    latency: Histogram<u64>,
    max_time: MaxTime,
    on_deadline: OnDeadline,
    min_rtt: Duration,
    /// Whether the controllers have a concurrency limit (and so slot waiters to wake).
    slots: bool,
}

/// Runs one simulation.
///
/// # Errors
///
/// A message when the configuration is out of range.
pub fn run(cfg: &RunConfig) -> Result<Report, String> {
    cfg.validate()?;
    let started = Instant::now();
    clock::set(0);
    let settings = cfg.variant.settings(cfg.deadline, cfg.overrides);
    let controllers = (0..cfg.clients)
        .map(|_| Controller::<u32>::new(settings.clone(), clock::now))
        .collect::<Result<Vec<_>, _>>()?;
    let server_cfg = cfg.server_config();
    let capacity = cfg.effective_capacity(&server_cfg);
    let servers = cfg
        .server_configs()
        .into_iter()
        .zip(0u32..)
        .map(|(config, i)| {
            let mut server = Server::new(config).numbered(i);
            server.seed_timer((cfg.seed ^ TIMER_SALT).wrapping_add(u64::from(i)));
            server
        })
        .collect();
    let phase_ends = cfg.phase_ends();
    let rates = cfg
        .scenario
        .phases
        .iter()
        .map(|p| p.load * capacity / 1e9)
        .collect();
    let arrivals = match &cfg.replay {
        Some(schedule) => ArrivalSource::Replayed { schedule, next: 0 },
        None => ArrivalSource::Drawn(Box::new(StdRng::seed_from_u64(cfg.seed ^ ARRIVAL_SALT))),
    };
    let latency = Histogram::new_with_bounds(1, 3_600_000_000, 3)
        .map_err(|e| format!("latency histogram: {e}"))?;
    let mut sim = Sim {
        cfg,
        controllers: &controllers,
        ops: Slab::default(),
        servers,
        cluster: cfg.scenario.cluster.as_ref(),
        calls: Slab::default(),
        q: Queue::default(),
        arrivals,
        policy: StdRng::seed_from_u64(cfg.seed ^ POLICY_SALT),
        server_rng: StdRng::seed_from_u64(cfg.seed ^ SERVER_SALT),
        slot_waiters: (0..cfg.clients).map(|_| VecDeque::new()).collect(),
        connections: vec![0; cfg.clients as usize],
        checkout_waiters: (0..cfg.clients).map(|_| VecDeque::new()).collect(),
        phase_ends,
        rates,
        report: Report::new(&cfg.scenario, cfg.variant, cfg.clients, cfg.seed, capacity),
        latency,
        max_time: cfg.variant.max_time(),
        on_deadline: cfg.variant.on_deadline(),
        min_rtt: cfg.rtt,
        slots: settings.concurrency.is_some(),
    };
    sim.report.setup_secs = started.elapsed().as_secs_f64();
    sim.run();
    sim.report.real_secs = started.elapsed().as_secs_f64();
    Ok(sim.report)
}

impl<'c> Sim<'c> {
    fn run(&mut self) {
        let schedule_end = self.phase_ends.last().copied().unwrap_or(0);
        let stop = schedule_end.saturating_add(clock::nanos(self.cfg.drain));
        if let Some(first) = self.next_arrival(0) {
            self.q.push(first, Event::Arrival);
        }
        self.q.push(schedule_end, Event::ScheduleEnd);
        // Bounded: arrivals stop at the schedule's end, every operation ends by its deadline or
        // its last retry, and the loop stops at `stop` whatever is left.
        let mut next_second = SECOND;
        while let Some((now, event)) = self.q.pop() {
            if now > stop {
                break;
            }
            // Bounded by the run's length: one record per second passed.
            while self.cfg.series && now >= next_second {
                self.record_second();
                next_second += SECOND;
            }
            clock::set(now);
            self.report.events += 1;
            self.handle(now, event);
        }
        // The last, partial second, so that the series adds up to the run's totals.
        if self.cfg.series {
            self.record_second();
        }
        self.report.peak_events = self.q.peak() as u64;
        self.report.unfinished = self.ops.len() as u64;
        self.report.server = self.server_stats();
        let hist = &self.latency;
        if !hist.is_empty() {
            self.report.p50_ms = hist.value_at_quantile(0.5) as f64 / 1000.0;
            self.report.p99_ms = hist.value_at_quantile(0.99) as f64 / 1000.0;
        }
    }

    fn handle(&mut self, now: Nanos, event: Event) {
        match event {
            Event::Arrival => {
                self.arrive(now);
                if let Some(next) = self.next_arrival(now) {
                    self.q.push(next, Event::Arrival);
                }
            }
            Event::ScheduleEnd => {
                self.report.busy_in_schedule_ns = self.server_stats().busy_ns;
            }
            Event::AppDeadline { op } => self.app_deadline(now, op),
            Event::SlotPoll { op, wait } => {
                if self.ops.get(op).is_some_and(|o| o.wait == wait) {
                    self.poll(now, op);
                }
            }
            Event::RetryDue { op, wait } => self.retry_due(now, op, wait),
            Event::ServerArrive(req) => match self.cluster {
                None => self.servers[0].arrive(now, req, &mut self.q),
                Some(_) => self.route(now, req),
            },
            Event::SliceEnd { server, job } => {
                self.servers[server as usize].slice_end(
                    now,
                    job,
                    &mut self.q,
                    &mut self.server_rng,
                );
            }
            Event::TicketTimeout { server, job, wait } => {
                self.servers[server as usize].ticket_timeout(
                    now,
                    job,
                    wait,
                    &mut self.q,
                    &mut self.server_rng,
                );
            }
            Event::TicketWake { server, job, wait } => {
                self.servers[server as usize].ticket_wake(
                    now,
                    job,
                    wait,
                    &mut self.q,
                    &mut self.server_rng,
                );
            }
            Event::Reply { server, tag, reply } => match self.cluster {
                None => self.reply(now, tag, reply),
                Some(_) => self.shard_reply(now, server, tag, reply),
            },
            Event::RouterRetry {
                call,
                shard,
                expire,
            } => self.router_retry(now, call, shard, expire),
            Event::RoutedReply { tag, reply } => self.reply(now, tag, reply),
        }
    }

    /// The instant of the next arrival after `now`, or `None` past the schedule. Drawn:
    /// exponential gaps at the phase's rate; a gap that crosses into the next phase is drawn
    /// again from the boundary at the new rate (the process is memoryless). Replayed: the next
    /// request's own instant.
    fn next_arrival(&mut self, now: Nanos) -> Option<Nanos> {
        let rng = match &mut self.arrivals {
            ArrivalSource::Drawn(rng) => rng,
            ArrivalSource::Replayed { schedule, next } => {
                return schedule.arrivals.get(*next).map(|a| a.at);
            }
        };
        let mut t = now;
        for (i, &end) in self.phase_ends.iter().enumerate() {
            if t >= end {
                continue;
            }
            let rate = self.rates[i];
            if rate <= 0.0 {
                t = end;
                continue;
            }
            let u: f64 = rng.random();
            let gap = -(1.0 - u).ln() / rate;
            let at = t as f64 + gap;
            if at < end as f64 {
                return Some(at as Nanos);
            }
            t = end;
        }
        None
    }

    fn phase_of(&self, t: Nanos) -> usize {
        self.phase_ends
            .iter()
            .position(|&end| t < end)
            .unwrap_or(self.phase_ends.len().saturating_sub(1))
    }

    /// The request arriving at `now`: its client, kind, key and phase (`None` past a replayed
    /// schedule's end, which the loop never asks for).
    fn next_request(&mut self, now: Nanos) -> Option<(u32, OpKind, i64, usize)> {
        let rng = match &mut self.arrivals {
            ArrivalSource::Drawn(rng) => rng,
            ArrivalSource::Replayed { schedule, next } => {
                let a = schedule.arrivals.get(*next)?;
                *next += 1;
                return Some((a.client, a.kind, a.key, a.phase));
            }
        };
        // One draw whatever the number of clients (no rejection sampling), so that runs with
        // different client counts meet the same arrival instants and kinds.
        let client =
            ((u128::from(rng.random::<u64>()) * u128::from(self.cfg.clients)) >> 64) as u32;
        let draw: f64 = rng.random();
        let mix = &self.cfg.scenario.mix;
        let mut kind = mix[mix.len() - 1].0;
        let mut acc = 0.0;
        for &(k, w) in mix {
            acc += w;
            if draw < acc {
                kind = k;
                break;
            }
        }
        // Only a cluster draws keys, so that the other scenarios keep their draws.
        let key = match self.cluster {
            Some(cluster) => rng.random_range(0..cluster.docs),
            None => 0,
        };
        Some((client, kind, key, self.phase_of(now)))
    }

    fn arrive(&mut self, now: Nanos) {
        let Some((client, kind, key, phase)) = self.next_request(now) else {
            return;
        };
        let cold = self.cluster.is_some_and(|c| c.is_cold(kind, key));
        self.report.requests += 1;
        self.report.cold_requests += u64::from(cold);
        if let Some(n) = self.report.phase_requests.get_mut(phase) {
            *n += 1;
        }
        let ctl = &self.controllers[client as usize];
        let at = clock::instant(now);
        let deadline = ctl.deadline(kind.command(), Default::default(), at);
        ctl.deposit(at);
        let app_deadline = now.saturating_add(clock::nanos(self.cfg.deadline));
        let op = self.ops.insert(Op {
            client,
            kind,
            key,
            cold,
            server: SERVER,
            arrival: now,
            app_deadline,
            phase,
            app_waiting: true,
            retry: ctl.retry_state(),
            deadline,
            stage: Stage::Idle,
            attempts: 0,
            wait: 0,
        });
        self.report.peak_ops = self.report.peak_ops.max(self.ops.len() as u64);
        self.q.push(app_deadline, Event::AppDeadline { op });
        self.start_attempt(now, op, AttemptKind::First);
    }

    fn start_attempt(&mut self, now: Nanos, op: Handle, kind: AttemptKind) {
        let controllers = self.controllers;
        let Some(o) = self.ops.get_mut(op) else {
            return;
        };
        let ctl = &controllers[o.client as usize];
        if let Some(cluster) = self.cluster {
            // Server selection as the driver makes it among the routers: a retry avoids the
            // router that failed (deprioritized on a sharded cluster), and any attempt avoids
            // the routers the controller calls busy (a full concurrency limit, or for a first
            // attempt a throttle that would reject it) while another can take it. The
            // driver's choice by operation count among two is not modelled: uniform.
            let deprioritized = (kind == AttemptKind::Retry).then(|| HashSet::from([o.server]));
            let avoided = ctl
                .avoided_servers(
                    kind == AttemptKind::First,
                    deprioritized.as_ref(),
                    clock::instant(now),
                )
                .or(deprioritized);
            o.server = router_draw(
                self.cfg.seed,
                o.client,
                o.arrival,
                o.attempts + 1,
                cluster.routers,
                avoided.as_ref(),
            );
        }
        let request = ctl.start_attempt(
            o.kind.command(),
            &o.server,
            kind,
            o.deadline,
            clock::instant(now),
        );
        o.stage = Stage::Slot(request);
        self.poll(now, op);
    }

    /// Asks the slot request of `op` again.
    fn poll(&mut self, now: Nanos, op: Handle) {
        let rng = &mut self.policy;
        let Some(o) = self.ops.get_mut(op) else {
            return;
        };
        let Stage::Slot(ref mut request) = o.stage else {
            return;
        };
        let mut jitter = || rng.random::<f64>();
        let answer = request.poll(clock::instant(now), &mut jitter);
        match answer {
            StartAnswer::Send(attempt) => {
                o.stage = Stage::Checkout { attempt };
                self.check_out(now, op);
            }
            StartAnswer::WaitUntil(until) => {
                o.wait = o.wait.wrapping_add(1);
                let wait = o.wait;
                let client = o.client as usize;
                let at = clock::nanos(until.saturating_duration_since(clock::origin())).max(now);
                self.q.push(at, Event::SlotPoll { op, wait });
                if let Some(waiters) = self.slot_waiters.get_mut(client) {
                    waiters.push_back((op, wait));
                }
                self.report.slot_waits += 1;
            }
            StartAnswer::RejectLocally(_) => {
                o.stage = Stage::Idle;
                self.report.local_rejections += 1;
                self.driver_end(now, op, Outcome::LocalRejection);
            }
            StartAnswer::TimedOut(_) => {
                o.stage = Stage::Idle;
                self.driver_end(now, op, Outcome::Deadline);
            }
            // Only an attempt whose caller reports a server change gets this, and the
            // simulated servers never change role: look again, as after a wait.
            StartAnswer::Reselect => {
                let wait = o.wait;
                self.q.push(now, Event::SlotPoll { op, wait });
            }
        }
    }

    /// `op` (its attempt granted) takes one of its client's connections and is sent, or waits
    /// for one.
    fn check_out(&mut self, now: Nanos, op: Handle) {
        let Some(o) = self.ops.get_mut(op) else {
            return;
        };
        let client = o.client as usize;
        if self.connections[client] < self.cfg.pool_size {
            self.connections[client] += 1;
            self.report.peak_connections =
                self.report.peak_connections.max(self.connections[client]);
            if !self.send(now, op) {
                // Nobody waits while a connection is free.
                self.connections[client] -= 1;
            }
        } else {
            o.wait = o.wait.wrapping_add(1);
            self.checkout_waiters[client].push_back((op, o.wait));
            self.report.checkout_waits += 1;
        }
    }

    /// Sends the attempt of `op`, which holds a connection, with the `maxTimeMS` its
    /// application or driver gives it now. Returns false when `op` ended instead (its driver's
    /// deadline left no time to send), and the connection is still to be handed on.
    fn send(&mut self, now: Nanos, op: Handle) -> bool {
        let controllers = self.controllers;
        let Some(o) = self.ops.get_mut(op) else {
            return false;
        };
        let Stage::Checkout { attempt } = std::mem::replace(&mut o.stage, Stage::Idle) else {
            return false;
        };
        let max_time = match self.max_time {
            MaxTime::None => None,
            MaxTime::AppOnReads => o.kind.is_read().then(|| clock::nanos(self.cfg.deadline)),
            MaxTime::Driver => match o.deadline {
                None => None,
                Some(d) => match controllers[o.client as usize].max_time(
                    d,
                    ServerTimeLimit::Remaining,
                    self.min_rtt,
                    clock::instant(now),
                ) {
                    Ok(t) => t.map(clock::nanos),
                    Err(_) => {
                        // Time out without sending.
                        attempt.finish(
                            AttemptEnd::Failed {
                                overload: Overload::None,
                                replied: false,
                            },
                            None,
                            clock::instant(now),
                        );
                        self.wake_slot_waiter(now, op);
                        self.driver_end(now, op, Outcome::Deadline);
                        return false;
                    }
                },
            },
        };
        o.attempts += 1;
        if o.attempts == 1 {
            self.report.first_attempts += 1;
        } else {
            self.report.retries += 1;
            if o.attempts == 2 {
                self.report.retried_requests += 1;
            }
        }
        let tag = Tag {
            op,
            attempt: o.attempts,
        };
        let req = Request {
            tag,
            kind: o.kind,
            key: o.key,
            max_time,
            client_deadline: o.app_deadline,
            rejection_draw: rejection_draw(self.cfg.seed, o.client, o.arrival, o.attempts),
        };
        o.stage = Stage::InFlight { attempt, sent: now };
        self.q.push(
            now + self.cfg.server_config_half_rtt(),
            Event::ServerArrive(req),
        );
        true
    }

    /// A connection of `client` came back (a reply, or a call dropped in flight, which closes
    /// its connection): the first operation still waiting for one that can be sent takes it.
    fn check_in(&mut self, now: Nanos, client: u32) {
        let client = client as usize;
        // Bounded by the queue's length; stale entries (ended operations) are skipped.
        while let Some((waiter, wait)) = self.checkout_waiters[client].pop_front() {
            if self.ops.get(waiter).is_some_and(|o| o.wait == wait) && self.send(now, waiter) {
                return;
            }
        }
        self.connections[client] -= 1;
    }

    /// A slot of `op`'s client was released: the first operation of that client still waiting
    /// looks again now.
    fn wake_slot_waiter(&mut self, now: Nanos, op: Handle) {
        if !self.slots {
            return;
        }
        let Some(client) = self.ops.get(op).map(|o| o.client as usize) else {
            return;
        };
        let Some(waiters) = self.slot_waiters.get_mut(client) else {
            return;
        };
        // Bounded by the queue's length; stale entries (ended or re-polled waits) are skipped.
        while let Some((waiter, wait)) = waiters.pop_front() {
            if self.ops.get(waiter).is_some_and(|o| o.wait == wait) {
                self.q.push(now, Event::SlotPoll { op: waiter, wait });
                break;
            }
        }
    }

    fn reply(&mut self, now: Nanos, tag: Tag, reply: Reply) {
        let controllers = self.controllers;
        let Some(o) = self.ops.get_mut(tag.op) else {
            return;
        };
        if o.attempts != tag.attempt || !matches!(o.stage, Stage::InFlight { .. }) {
            return;
        }
        let Stage::InFlight { attempt, sent } = std::mem::replace(&mut o.stage, Stage::Idle) else {
            return;
        };
        let client = o.client;
        self.check_in(now, client);
        let Some(o) = self.ops.get_mut(tag.op) else {
            return;
        };
        let at = clock::instant(now);
        let ctl = &controllers[o.client as usize];
        match reply {
            Reply::Ok => {
                attempt.finish(AttemptEnd::Succeeded, Some(clock::instant(sent)), at);
                if o.attempts > 1 {
                    ctl.succeeded(&o.retry, at);
                }
                self.wake_slot_waiter(now, tag.op);
                self.driver_end(now, tag.op, Outcome::Success);
            }
            Reply::Expired => {
                attempt.finish(
                    AttemptEnd::Failed {
                        overload: Overload::None,
                        replied: true,
                    },
                    Some(clock::instant(sent)),
                    at,
                );
                self.wake_slot_waiter(now, tag.op);
                self.driver_end(now, tag.op, Outcome::Deadline);
            }
            Reply::Overloaded => {
                attempt.finish(
                    AttemptEnd::Failed {
                        overload: Overload::Retryable,
                        replied: true,
                    },
                    Some(clock::instant(sent)),
                    at,
                );
                let failure = Failure::new(Overload::Retryable, None);
                ctl.failure(failure, Some(462));
                o.retry.record_failure(failure);
                let question = RetryQuestion {
                    operation: o.kind.command(),
                    server: Some(&o.server),
                    deadline: o.deadline,
                };
                let rng = &mut self.policy;
                let mut jitter = || rng.random::<f64>();
                let answer = ctl.may_retry(&mut o.retry, question, at, &mut jitter);
                match answer {
                    RetryAnswer::RetryAfter(delay) => {
                        o.wait = o.wait.wrapping_add(1);
                        let wait = o.wait;
                        o.stage = Stage::Backoff(delay);
                        self.q.push(
                            now.saturating_add(clock::nanos(delay)),
                            Event::RetryDue { op: tag.op, wait },
                        );
                        self.wake_slot_waiter(now, tag.op);
                    }
                    RetryAnswer::ReturnLastError(reason) => {
                        match reason {
                            Refusal::Budget => self.report.budget_refusals += 1,
                            Refusal::CannotFinish => self.report.cannot_finish += 1,
                            Refusal::BackoffPastDeadline => self.report.backoff_past_deadline += 1,
                            _ => {}
                        }
                        self.wake_slot_waiter(now, tag.op);
                        self.driver_end(now, tag.op, Outcome::Rejected);
                    }
                    RetryAnswer::TimedOut => {
                        self.wake_slot_waiter(now, tag.op);
                        self.driver_end(now, tag.op, Outcome::Deadline);
                    }
                }
            }
            Reply::RouterOverloaded => {
                // `SystemOverloadedError` without `RetryableError`: the driver counts the
                // overload and returns the error, since no ordinary rule retries code 462.
                let failure = Failure::new(Overload::NotRetryable, None);
                attempt.finish(
                    AttemptEnd::Failed {
                        overload: failure.overload,
                        replied: true,
                    },
                    Some(clock::instant(sent)),
                    at,
                );
                ctl.failure(failure, Some(462));
                self.wake_slot_waiter(now, tag.op);
                self.driver_end(now, tag.op, Outcome::Rejected);
            }
        }
    }

    /// A router receives an attempt: it forwards it at once to every shard its key touches.
    fn route(&mut self, now: Nanos, req: Request) {
        let Some(cluster) = self.cluster else {
            return;
        };
        let (low, high) = cluster.touched(req.kind, req.key);
        let pending = (low..=high).fold(0u64, |mask, shard| mask | 1 << shard);
        let call = self.calls.insert(RouterCall {
            request: req,
            max_time_end: req.max_time.map(|t| now.saturating_add(t)),
            pending,
            retries: [0; 64],
        });
        for shard in low..=high {
            self.forward(now, call, shard);
        }
    }

    /// Sends `call`'s child request to `shard`, with what is left of its `maxTimeMS`.
    fn forward(&mut self, now: Nanos, call: Handle, shard: u32) {
        let Some(c) = self.calls.get(call) else {
            return;
        };
        let child = Request {
            tag: Tag {
                op: call,
                attempt: c.request.tag.attempt,
            },
            max_time: c.max_time_end.map(|end| end.saturating_sub(now)),
            ..c.request
        };
        self.servers[shard as usize].arrive(now, child, &mut self.q);
    }

    /// A shard answers a router's child request. The call succeeds when every shard has; a
    /// `RetryableError` is retried after mongos's backoff while retries are left and the
    /// backoff ends within `maxTimeMS`; any other error fails the whole call at once (mongos's
    /// results merger: the first error wins, the other shards' answers are not waited for).
    fn shard_reply(&mut self, now: Nanos, shard: u32, tag: Tag, reply: Reply) {
        let Some(cluster) = self.cluster else {
            return;
        };
        let call = tag.op;
        let Some(c) = self.calls.get_mut(call) else {
            // The call already failed on another shard.
            return;
        };
        match reply {
            Reply::Ok => {
                c.pending &= !(1 << shard);
                if c.pending == 0 {
                    self.answer(now, call, Reply::Ok);
                }
            }
            Reply::Overloaded => {
                let done = u32::from(c.retries[shard as usize]);
                if done >= cluster.router_retries {
                    let reply = if cluster.shard_labels {
                        Reply::Overloaded
                    } else {
                        Reply::RouterOverloaded
                    };
                    self.answer(now, call, reply);
                    return;
                }
                c.retries[shard as usize] += 1;
                let ceiling = cluster
                    .router_base_backoff_ms
                    .saturating_mul(1 << done.min(30))
                    .min(cluster.router_max_backoff_ms);
                let wait = clock::ms(self.server_rng.random_range(0..=ceiling) as f64);
                match c.max_time_end.filter(|&end| end < now.saturating_add(wait)) {
                    Some(end) => self.q.push(
                        end,
                        Event::RouterRetry {
                            call,
                            shard,
                            expire: true,
                        },
                    ),
                    None => {
                        self.report.router_retries += 1;
                        self.q.push(
                            now.saturating_add(wait),
                            Event::RouterRetry {
                                call,
                                shard,
                                expire: false,
                            },
                        );
                    }
                }
            }
            Reply::Expired | Reply::RouterOverloaded => self.answer(now, call, reply),
        }
    }

    /// A router's backoff for `call`'s child at `shard` ended: retry it, or answer 50 when the
    /// call's `maxTimeMS` ended the backoff.
    fn router_retry(&mut self, now: Nanos, call: Handle, shard: u32, expire: bool) {
        if expire {
            self.answer(now, call, Reply::Expired);
        } else {
            self.forward(now, call, shard);
        }
    }

    /// The router answers `call` to its client (if nothing answered it yet).
    fn answer(&mut self, now: Nanos, call: Handle, reply: Reply) {
        if let Some(c) = self.calls.remove(call) {
            self.q.push(
                now + self.cfg.server_config_half_rtt(),
                Event::RoutedReply {
                    tag: c.request.tag,
                    reply,
                },
            );
        }
    }

    /// Every server's counters, summed over a cluster's shards.
    fn server_stats(&self) -> ServerStats {
        let mut stats = ServerStats::default();
        for server in &self.servers {
            stats.add(&server.stats);
        }
        stats
    }

    fn retry_due(&mut self, now: Nanos, op: Handle, wait: u32) {
        let controllers = self.controllers;
        let Some(o) = self.ops.get_mut(op) else {
            return;
        };
        if o.wait != wait {
            return;
        }
        let Stage::Backoff(delay) = o.stage else {
            return;
        };
        o.stage = Stage::Idle;
        let ctl = &controllers[o.client as usize];
        if ctl.send_retry(
            &mut o.retry,
            o.kind.command(),
            Some(delay),
            clock::instant(now),
        ) {
            self.start_attempt(now, op, AttemptKind::Retry);
        } else {
            self.report.budget_refusals += 1;
            self.driver_end(now, op, Outcome::Rejected);
        }
    }

    fn app_deadline(&mut self, now: Nanos, op: Handle) {
        let Some(o) = self.ops.get_mut(op) else {
            return;
        };
        if !o.app_waiting {
            return;
        }
        o.app_waiting = false;
        let (arrival, phase) = (o.arrival, o.phase);
        if self.on_deadline == OnDeadline::Drop {
            // The driver's future is dropped (or the driver returns at its own deadline): a
            // slot or an attempt in flight is given back as abandoned, a backoff ends.
            let released = matches!(
                o.stage,
                Stage::InFlight { .. } | Stage::Slot(_) | Stage::Checkout { .. }
            );
            let connected = matches!(o.stage, Stage::InFlight { .. });
            let client = o.client;
            o.stage = Stage::Idle;
            if released {
                self.wake_slot_waiter(now, op);
            }
            if connected {
                self.check_in(now, client);
            }
            if let Some(o) = self.ops.remove(op) {
                if o.attempts == 0 {
                    self.report.unsent += 1;
                }
            }
        }
        self.record(now, arrival, phase, Outcome::Deadline);
    }

    /// The driver's operation ended with `outcome`; the application hears of it if it still
    /// waits.
    fn driver_end(&mut self, now: Nanos, op: Handle, outcome: Outcome) {
        let Some(o) = self.ops.remove(op) else {
            return;
        };
        if o.attempts == 0 {
            self.report.unsent += 1;
        }
        if o.app_waiting {
            if o.cold && outcome == Outcome::Success {
                self.report.cold_success += 1;
            }
            self.record(now, o.arrival, o.phase, outcome);
        } else {
            self.report.late_driver_ends += 1;
        }
    }

    /// Appends the counters as they stand to the report's per-second series.
    fn record_second(&mut self) {
        let limit = self.slots.then(|| {
            self.controllers
                .iter()
                .flat_map(|c| c.snapshot().concurrency_limits.into_values())
                .map(|l| u64::from(l.limit))
                .sum()
        });
        let stats = self.server_stats();
        let counters = self.report.counters(&stats, limit);
        self.report.seconds.push(counters);
    }

    fn record(&mut self, now: Nanos, arrival: Nanos, phase: usize, outcome: Outcome) {
        self.report.count(outcome, phase);
        let micros = now.saturating_sub(arrival) / 1000;
        // Within the histogram's bounds by construction (an hour at most).
        let _ = self.latency.record(micros.clamp(1, 3_600_000_000));
    }
}

impl RunConfig {
    fn server_config_half_rtt(&self) -> Nanos {
        clock::nanos(self.rtt) / 2
    }
}
