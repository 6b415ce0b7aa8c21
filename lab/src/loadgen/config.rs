//! What a lab run does: scenario phases, operation mix, variants, server mode and client
//! settings.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

// The schedule's own types live in the `arrivals` crate, which the simulator shares.
pub use arrivals::{Arrivals, OpKind, OpMix, Phase, ShardKeys};

fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// A named sequence of phases; `burst` is the index of the overload phase after which
/// recovery is measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scenario {
    /// `burst`, `sustained` or `custom`.
    pub name: String,
    /// The phases, in order.
    pub phases: Vec<Phase>,
    /// Index of the phase whose end starts the recovery clock.
    pub burst: Option<usize>,
}

/// How long the runs are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Length {
    /// The suite's lengths (`lab run --suite`): the shortest runs that still show each
    /// scenario's effect, so that every scenario, variant and repetition fits 15 minutes.
    Suite,
    /// A short smoke run (about 12 s per variant).
    Quick,
    /// The default: fits three variants in three minutes on two cores.
    Default,
    /// Seed 004's lengths (10 s + 15 s + 20 s; sustained 30 s).
    Long,
}

impl Scenario {
    /// The `burst` scenario: 50 % → 130 % → 50 % of capacity.
    pub fn burst(len: Length) -> Scenario {
        let (a, b, c) = match len {
            Length::Suite => (1.0, 4.0, 3.0),
            Length::Quick => (2.0, 6.0, 4.0),
            Length::Default => (5.0, 15.0, 10.0),
            Length::Long => (10.0, 15.0, 20.0),
        };
        Scenario {
            name: "burst".into(),
            phases: vec![
                Phase::new("base", 0.5, a),
                Phase::new("burst", 1.3, b),
                Phase::new("after", 0.5, c),
            ],
            burst: Some(1),
        }
    }

    /// The `sustained` scenario: 200 % of capacity throughout.
    pub fn sustained(len: Length) -> Scenario {
        Scenario::steady("sustained", "overload", 2.0, Scenario::steady_secs(len))
    }

    /// One phase of constant load: `name` is the scenario's, `phase` the phase's.
    pub fn steady(name: &str, phase: &str, load: f64, secs: f64) -> Scenario {
        Scenario {
            name: name.into(),
            phases: vec![Phase::new(phase, load, secs)],
            burst: None,
        }
    }

    /// Length of a one-phase scenario (`sustained` and the others of constant load).
    pub fn steady_secs(len: Length) -> f64 {
        match len {
            Length::Suite => 5.0,
            Length::Quick => 8.0,
            Length::Default => 20.0,
            Length::Long => 30.0,
        }
    }

    /// Parses `LOAD%:SECS,...` (e.g. `50:5,130:15,50:10`); the phase with the highest load
    /// that is followed by another phase is the burst.
    pub fn parse_custom(spec: &str) -> Result<Scenario, String> {
        let mut phases = Vec::new();
        for (i, part) in spec.split(',').map(str::trim).enumerate() {
            let (load, secs) = part
                .split_once(':')
                .ok_or_else(|| format!("phase {part:?}: expected LOAD_PERCENT:SECONDS"))?;
            let load: f64 = load
                .trim()
                .trim_end_matches('%')
                .parse()
                .map_err(|_| format!("phase {part:?}: bad load"))?;
            let secs: f64 = secs
                .trim()
                .trim_end_matches('s')
                .parse()
                .map_err(|_| format!("phase {part:?}: bad duration"))?;
            if !(load.is_finite() && load >= 0.0 && secs.is_finite() && secs > 0.0) {
                return Err(format!(
                    "phase {part:?}: load must be >= 0 and duration > 0"
                ));
            }
            phases.push(Phase::new(&format!("p{}", i + 1), load / 100.0, secs));
        }
        if phases.is_empty() {
            return Err("no phases".into());
        }
        let burst = phases
            .iter()
            .enumerate()
            .take(phases.len().saturating_sub(1))
            .max_by(|a, b| a.1.load.total_cmp(&b.1.load))
            .map(|(i, _)| i);
        Ok(Scenario {
            name: "custom".into(),
            phases,
            burst,
        })
    }

    /// Total length of the schedule.
    pub fn duration(&self) -> Duration {
        self.phases.iter().map(|p| p.duration).sum()
    }

    /// Start offset of phase `i`.
    pub fn phase_start(&self, i: usize) -> Duration {
        self.phases.iter().take(i).map(|p| p.duration).sum()
    }

    /// Index of the phase that contains offset `t` (the last phase for `t` past the end).
    pub fn phase_at(&self, t: Duration) -> usize {
        let mut end = Duration::ZERO;
        for (i, p) in self.phases.iter().enumerate() {
            end += p.duration;
            if t < end {
                return i;
            }
        }
        self.phases.len().saturating_sub(1)
    }

    /// Offset at which the burst phase ends, if there is one.
    pub fn burst_end(&self) -> Option<Duration> {
        self.burst.map(|i| self.phase_start(i + 1))
    }
}

/// Which driver a variant links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Driver {
    /// The fork (`driver/`).
    Fork,
    /// Unmodified mongodb 3.9.1 from crates.io.
    Upstream,
}

impl fmt::Display for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Driver::Fork => "fork",
            Driver::Upstream => "upstream",
        })
    }
}

/// In a variant's URI options, stands for the application's deadline in milliseconds.
pub const DEADLINE_PLACEHOLDER: &str = "{deadline}";

/// `timeoutMS` equal to the application's deadline: the driver learns the deadline the
/// application enforces around the call.
const TIMEOUT_AT_DEADLINE: &str = "timeoutMS={deadline}";

/// What the application around the driver does with its deadline: part of a variant, because
/// upstream's best practice is a driver setting *and* an application habit (`docs/lab.md`,
/// "Variants").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Application {
    /// The application sends `maxTimeMS` = its deadline on every operation upstream 3.9.1
    /// accepts it on: finds (`FindOptions::max_time`, `FindOneOptions::max_time`). Inserts and
    /// updates have no such option in 3.9.1. Not sent where the variant sets `timeoutMS`: the
    /// driver then sends `maxTimeMS` itself, on every command.
    pub max_time: bool,
    /// What the application does when its deadline passes.
    pub on_deadline: OnDeadline,
}

impl Default for Application {
    fn default() -> Self {
        Application::DEFAULT
    }
}

impl Application {
    /// Upstream's advice: no `maxTimeMS`, the driver call goes on after the deadline.
    pub const DEFAULT: Application = Application {
        max_time: false,
        on_deadline: OnDeadline::Continue,
    };
    /// Upstream's best practice: `maxTimeMS` on finds and the call dropped at the deadline.
    pub const BEST: Application = Application {
        max_time: true,
        on_deadline: OnDeadline::Drop,
    };

    /// Parses `maxtime`, `drop`, `continue` joined by `+` (e.g. `maxtime+drop`); `default`
    /// is `continue`. `None` when `spec` is not such a list.
    pub fn parse(spec: &str) -> Option<Application> {
        let mut app = Application::DEFAULT;
        for token in spec.split('+').map(str::trim) {
            match token {
                "maxtime" => app.max_time = true,
                "drop" => app.on_deadline = OnDeadline::Drop,
                "continue" | "default" => app.on_deadline = OnDeadline::Continue,
                _ => return None,
            }
        }
        Some(app)
    }

    /// The short form `parse` reads back (`maxtime+drop`, `continue`).
    pub fn spec(&self) -> String {
        let end = match self.on_deadline {
            OnDeadline::Continue => "continue",
            OnDeadline::Drop => "drop",
        };
        if self.max_time {
            format!("maxtime+{end}")
        } else {
            end.to_string()
        }
    }

    /// In words, for a variant with `uri_options`.
    pub fn describe(&self, uri_options: &str) -> String {
        let timeout = has_timeout(uri_options);
        let max_time = match (timeout, self.max_time) {
            (true, _) => "the driver sends maxTimeMS (timeoutMS) on every command",
            (false, true) => "maxTimeMS = deadline on finds",
            (false, false) => "no maxTimeMS",
        };
        let end = match (timeout, self.on_deadline) {
            (true, _) => "the driver returns at the deadline",
            (false, OnDeadline::Continue) => "the call goes on after the deadline",
            (false, OnDeadline::Drop) => "the call is dropped at the deadline",
        };
        format!("{max_time}; {end}")
    }
}

/// Whether URI options set `timeoutMS`.
fn has_timeout(uri_options: &str) -> bool {
    uri_options.split('&').any(|o| {
        o.split('=')
            .next()
            .is_some_and(|k| k.trim().eq_ignore_ascii_case("timeoutMS"))
    })
}

/// A variant: a driver, the connection-string options its clients get, and what the
/// application around it does.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Variant {
    /// Name in the report.
    pub name: String,
    /// Which driver.
    pub driver: Driver,
    /// URI options (`k=v&k2=v2`), appended to every instance's connection string.
    pub uri_options: String,
    /// The application's behaviour (the run's `--max-time-ms` / `--on-deadline` and a
    /// scenario's own requirement override it: [`LabConfig::application`]).
    pub app: Application,
}

/// Upstream's retries switched off.
const NO_RETRIES: &str = "maxAdaptiveRetries=0";
/// Overload retargeting switched on.
const RETARGETING: &str = "enableOverloadRetargeting=true";

/// The fork's recommended settings: the built-in variant the verdict judges first, the soak
/// runs and the sensitivity grid reports (named here, with the other built-in variants).
pub const RECOMMENDED: &str = "fork-recommended";

/// Every control of the fork together.
pub const CONTROLS: &str = "fork-controls";

impl Variant {
    /// A variant with the default application.
    pub fn new(name: &str, driver: Driver, uri_options: &str) -> Variant {
        Variant::with_app(name, driver, uri_options, Application::DEFAULT)
    }

    /// A variant with application `app`.
    pub fn with_app(name: &str, driver: Driver, uri_options: &str, app: Application) -> Variant {
        Variant {
            name: name.into(),
            driver,
            uri_options: uri_options.into(),
            app,
        }
    }

    /// Whether this variant is upstream 3.9.1.
    pub fn is_upstream(&self) -> bool {
        self.driver == Driver::Upstream
    }

    /// The built-in variants, in the default order.
    pub fn builtin() -> Vec<Variant> {
        use Driver::{Fork, Upstream};
        let best = Application::BEST;
        vec![
            Variant::new("upstream-default", Upstream, ""),
            Variant::new("upstream-no-retries", Upstream, NO_RETRIES),
            Variant::new("fork-default", Fork, ""),
            Variant::new("fork-no-retries", Fork, NO_RETRIES),
            Variant::new("upstream-retargeting", Upstream, RETARGETING),
            Variant::new("fork-retargeting", Fork, RETARGETING),
            Variant::new("fork-timeout", Fork, TIMEOUT_AT_DEADLINE),
            Variant::new("fork-budget", Fork, "retryBudget=true"),
            Variant::new(
                "fork-budget-timeout",
                Fork,
                &format!("retryBudget=true&{TIMEOUT_AT_DEADLINE}"),
            ),
            // The recommended settings (docs/admission.md, "The recommended settings"): the
            // budget, `timeoutMS` and the throttle (at its default `K = 2`, it engages only once
            // a server rejects more than half of a client's requests: a flood, not the 30 %
            // random rejections of `transient-30`).
            Variant::new(
                RECOMMENDED,
                Fork,
                &format!("retryBudget=true&{TIMEOUT_AT_DEADLINE}&adaptiveThrottle=true"),
            ),
            Variant::new("fork-throttle", Fork, "adaptiveThrottle=true"),
            Variant::new("fork-concurrency", Fork, "adaptiveConcurrency=true"),
            Variant::new(
                CONTROLS,
                Fork,
                &format!(
                    "retryBudget=true&{TIMEOUT_AT_DEADLINE}&adaptiveThrottle=true\
                     &adaptiveConcurrency=true&{RETARGETING}"
                ),
            ),
            // Upstream's best practice (issue 27): what a careful application does with
            // upstream 3.9.1 today.
            Variant::with_app(
                "upstream-maxtime",
                Upstream,
                "",
                Application {
                    max_time: true,
                    on_deadline: OnDeadline::Continue,
                },
            ),
            Variant::with_app("upstream-best", Upstream, "", best),
            Variant::with_app("upstream-best-no-retries", Upstream, NO_RETRIES, best),
            Variant::with_app("upstream-best-retargeting", Upstream, RETARGETING, best),
        ]
    }

    /// The variants run when none are named.
    pub fn defaults() -> Vec<Variant> {
        Variant::builtin().into_iter().take(3).collect()
    }

    /// Parses one `--variants` entry: a built-in name, or `NAME:DRIVER[:URI_OPTIONS[:APP]]`
    /// with DRIVER `fork` or `upstream` (e.g. `fork-r1:fork:maxAdaptiveRetries=1`) and APP
    /// the application's behaviour ([`Application::parse`], e.g.
    /// `u2:upstream:maxAdaptiveRetries=1:maxtime+drop`; default `continue`). In URI_OPTIONS,
    /// `{deadline}` stands for the application's deadline in ms (`timeoutMS={deadline}`).
    pub fn parse(entry: &str) -> Result<Variant, String> {
        let entry = entry.trim();
        if let Some(v) = Variant::builtin().into_iter().find(|v| v.name == entry) {
            return Ok(v);
        }
        let mut parts = entry.splitn(3, ':');
        let name = parts.next().unwrap_or_default();
        let driver = parts.next().ok_or_else(|| {
            let known: Vec<String> = Variant::builtin().into_iter().map(|v| v.name).collect();
            format!(
                "unknown variant {entry:?}: use one of {} or NAME:DRIVER[:URI_OPTIONS[:APP]]",
                known.join(", ")
            )
        })?;
        let driver = match driver {
            "fork" => Driver::Fork,
            "upstream" => Driver::Upstream,
            other => return Err(format!("variant {entry:?}: unknown driver {other:?}")),
        };
        if name.is_empty() {
            return Err(format!("variant {entry:?}: empty name"));
        }
        let rest = parts.next().unwrap_or_default();
        // The application is the last field when it reads as one; URI options may hold ':'
        // themselves (`readPreferenceTags=dc:ny`).
        let (opts, app) = match rest.rsplit_once(':') {
            Some((opts, app)) => match Application::parse(app) {
                Some(app) => (opts, app),
                None => (rest, Application::DEFAULT),
            },
            None => (rest, Application::DEFAULT),
        };
        let opts = opts.trim_start_matches('?');
        Ok(Variant::with_app(name, driver, opts, app))
    }
}

/// Where the overload comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ServerMode {
    /// The load-shedding server model (`labOverload` server parameter).
    Model,
    /// Fallback: the `failCommand` fail point rejects a share of the attempts with 462, set
    /// every 100 ms so that accepted attempts stay at capacity.
    Failpoint,
    /// No overload at all (for checking the generator).
    None,
}

/// Emulator persona.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Persona {
    /// A one-member replica set (retryable writes, sessions).
    Replicaset,
    /// A standalone mongod.
    Standalone,
    /// Routers (mongos) in front of shards, the lab's collection sharded on `_id` in equal
    /// ranges ([`ShardLayout`]; `hot-shard`, `even-shards`).
    Sharded,
}

/// What the application does when its deadline passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OnDeadline {
    /// Upstream's advice: the driver call runs in a spawned task and the application stops
    /// waiting on its handle, so the call goes on (retries and all) after the deadline.
    Continue,
    /// The application drops the driver's future (`tokio::time::timeout` around the call),
    /// which upstream warns about; closest to a client that cancels through a context.
    Drop,
}

/// How requests are issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Load {
    /// Open loop: the schedule of the scenario's phases, whatever comes back.
    Open,
    /// Closed loop: `workers` tasks (spread over the instances), each sending its next
    /// request when the previous one finished, for the scenario's length. Offered load is
    /// whatever they achieve; the phases' loads are ignored.
    Closed {
        /// Workers in all.
        workers: usize,
    },
}

/// One replica-set member whose server model is smaller than the others' (`hot-member`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HotMember {
    /// The member's index (0 is the primary).
    pub index: usize,
    /// Its virtual cores (`None`: the model's `cores`, like the others).
    pub cores: Option<f64>,
    /// Its capacity as a share of the run's capacity: its limiter admits
    /// `limiter_share × share × capacity` per second.
    pub share: f64,
}

/// The sharded deployment of persona `sharded` (`hot-shard`, `even-shards`): how many routers
/// and shards, how the collection is split, and which shard the cold-shard figure leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardLayout {
    /// Routers (mongos). Every one is in the connection string, so the drivers spread
    /// requests over them as mongos clients do.
    pub routers: usize,
    /// Shards. The collection is sharded on `_id` (ranged: the lab's keys are the integers
    /// `0..docs`) and split into `shards` equal ranges, range `i` on shard `i`
    /// ([`ShardLayout::split_points`]).
    pub shards: usize,
    /// The shard whose requests the cold-shard figure leaves out. It is named even where no
    /// shard is overloaded (`even-shards`), so the reference counts the same requests.
    pub hot_index: usize,
    /// The hot shard's capacity as a share of the run's capacity: its limiter admits
    /// `limiter_share × hot_share × capacity` per second (`None`: the same as the others').
    pub hot_share: Option<f64>,
    /// Every router's `defaultClientMaxRetryAttempts`: how often it retries a shard's overload
    /// error itself before passing it on (`None`: left at mongos's default, 3).
    pub router_retries: Option<u32>,
    /// Whether the routers pass a shard's overload error on with the shard's labels
    /// (`RetryableError` included; the emulator's `labRouterShardErrorLabels: "shard"`) instead
    /// of mongos's `SystemOverloadedError` alone.
    pub router_shard_labels: bool,
}

impl Default for ShardLayout {
    fn default() -> Self {
        ShardLayout {
            routers: 3,
            shards: 3,
            hot_index: 1,
            hot_share: None,
            router_retries: None,
            router_shard_labels: false,
        }
    }
}

/// Bounds of `lab run --shards`: two at least, so that there is a cold shard beside the hot
/// one (shard 1); a request's shards stay few enough to count.
pub const MIN_SHARDS: u32 = 2;
/// See [`MIN_SHARDS`].
pub const MAX_SHARDS: u32 = 16;
/// Most router retries `lab run --router-retries` sets (mongos's default is 3).
pub const MAX_ROUTER_RETRIES: u32 = 10;

/// `lab run`'s changes to the sharded cluster of `hot-shard` and `even-shards` (the simulator's
/// options of the same names), to measure per-router overload state where the hot shard holds
/// more of the keys or the routers do not retry. Every other scenario refuses them
/// (`ScenarioName::apply_shard_options`).
#[derive(Debug, Clone, Copy, Default, PartialEq, clap::Args)]
pub struct ShardOptions {
    /// hot-shard, even-shards: shards (2 to 16; default 3), each owning an equal range of the
    /// keys; shard 1 stays the hot one. The load and capacity stay the scenario's, so each
    /// shard receives 150 % ÷ N of one shard's capacity.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(i64::from(MIN_SHARDS)..=i64::from(MAX_SHARDS)))]
    pub shards: Option<u32>,
    /// hot-shard: the hot shard's ingress limiter rate as a share of the others' (above 0, at
    /// most 1; default 1/3). Not for even-shards, which has no hot shard.
    #[arg(long, value_name = "SHARE", value_parser = parse_hot_share)]
    pub hot_share: Option<f64>,
    /// hot-shard, even-shards: how often every router retries a shard's overload error itself
    /// (mongos's `defaultClientMaxRetryAttempts`, set on each router before the variants run;
    /// 0 to 10; default: mongos's 3, left alone).
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_ROUTER_RETRIES)))]
    pub router_retries: Option<u32>,
    /// hot-shard, even-shards: every router passes a shard's overload error on with the
    /// shard's labels, `RetryableError` included (`labRouterShardErrorLabels: "shard"`), instead
    /// of mongos's `SystemOverloadedError` alone.
    #[arg(long)]
    pub router_shard_labels: bool,
}

/// Parses `--hot-share`: above 0 (a shard admitting nothing is no overload) and at most 1 (the
/// hot shard is the smaller one).
pub fn parse_hot_share(s: &str) -> Result<f64, String> {
    let share: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if share.is_finite() && share > 0.0 && share <= 1.0 {
        Ok(share)
    } else {
        Err(format!("{s} is not above 0 and at most 1"))
    }
}

impl ShardOptions {
    /// Whether no option was given (every scenario accepts that).
    pub fn is_empty(&self) -> bool {
        *self == ShardOptions::default()
    }

    /// Refuses values out of range (the command line's parsers refuse them first).
    pub fn check(&self) -> Result<(), String> {
        if self
            .shards
            .is_some_and(|n| !(MIN_SHARDS..=MAX_SHARDS).contains(&n))
        {
            return Err(format!(
                "--shards must be between {MIN_SHARDS} and {MAX_SHARDS}"
            ));
        }
        if let Some(share) = self.hot_share {
            parse_hot_share(&share.to_string()).map_err(|e| format!("--hot-share: {e}"))?;
        }
        if self.router_retries.is_some_and(|n| n > MAX_ROUTER_RETRIES) {
            return Err(format!(
                "--router-retries must be between 0 and {MAX_ROUTER_RETRIES}"
            ));
        }
        Ok(())
    }

    /// Applies the options to a scenario's `layout`: `--hot-share` only where the layout has
    /// a hot shard.
    pub fn apply(&self, layout: &mut ShardLayout) -> Result<(), String> {
        self.check()?;
        if self.hot_share.is_some() && layout.hot_share.is_none() {
            return Err("--hot-share needs a hot shard, and this layout has none".into());
        }
        if let Some(n) = self.shards {
            layout.shards = n as usize;
        }
        layout.hot_share = self.hot_share.or(layout.hot_share);
        layout.router_retries = self.router_retries.or(layout.router_retries);
        layout.router_shard_labels |= self.router_shard_labels;
        Ok(())
    }
}

impl ShardLayout {
    /// Where the collection is split: `docs × i / shards` for `i` in `1..shards`, so shard
    /// `i` owns `[split i, split i+1)` (the first from MinKey, the last to MaxKey).
    pub fn split_points(&self, docs: i64) -> Vec<i64> {
        let keys = self.keys(docs);
        (1..self.shards.max(1)).map(|i| keys.split(i)).collect()
    }

    /// The attribution of requests to shards for a collection of `docs` documents.
    pub fn keys(&self, docs: i64) -> ShardKeys {
        ShardKeys::new(docs, self.shards, self.hot_index)
    }
}

/// Faults injected during every variant run (`faults`): connections closed on every member
/// and step-downs of the primary, as the exactly-once audit injects them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Faults {
    /// Share of inserts and updates whose connection is closed before they run
    /// (`failCommand` with `closeConnection`).
    pub drop_before: f64,
    /// Share of applied writes whose connection is closed before the reply
    /// (`onPrimaryTransactionalWrite` with `closeConnection`).
    pub drop_after: f64,
    /// Period of the primary's step-downs (the first one period after the schedule starts).
    #[serde(serialize_with = "ser_secs")]
    pub step_down_every: Duration,
}

/// Everything a run needs.
#[derive(Debug, Clone, Serialize)]
pub struct LabConfig {
    /// The phases.
    pub scenario: Scenario,
    /// Variants, run one after another.
    pub variants: Vec<Variant>,
    /// Runs of each variant (3 with `--full`).
    pub repeats: usize,
    /// Operations per second the server sustains (100 % load).
    pub capacity: f64,
    /// Arrival process.
    pub arrivals: Arrivals,
    /// Simulated service instances, each with its own client.
    pub instances: usize,
    /// `maxPoolSize` of every instance's client.
    pub max_pool_size: u32,
    /// `minPoolSize` of every instance's client.
    pub min_pool_size: u32,
    /// Further URI options for every client (`k=v&...`).
    pub client_options: String,
    /// Application deadline per request.
    #[serde(serialize_with = "ser_secs")]
    pub deadline: Duration,
    /// `--max-time-ms`: every variant's application sends `maxTimeMS` on finds, whatever the
    /// variant's own application does (`None`: each variant's own).
    pub max_time_override: Option<bool>,
    /// Longest wait for late completions after the schedule ends.
    #[serde(serialize_with = "ser_secs")]
    pub drain: Duration,
    /// Operation mix.
    pub mix: OpMix,
    /// Documents seeded into the collection.
    pub docs: i64,
    /// RNG seed (arrivals, mix, keys).
    pub seed: u64,
    /// Overload source.
    pub server_mode: ServerMode,
    /// Emulator persona.
    pub persona: Persona,
    /// The ingress limiter's rate as a share of `capacity` (0: no limiter). Below 1 so the
    /// work the limiter admits stays below what the server completes; at exactly 1 the ticket
    /// queues are a random walk and runs become bistable (see `docs/lab.md`).
    pub limiter_share: f64,
    /// Extra `labOverload` settings (JSON object), merged over the lab's defaults.
    pub model_overrides: Option<serde_json::Value>,
    /// Schedule-lag p99 above which a run is INVALID.
    #[serde(serialize_with = "ser_secs")]
    pub max_lag_p99: Duration,
    /// What every variant's application does at its deadline, whatever the variant's own does:
    /// the scenario's requirement (`flood` drops) or `--on-deadline`, which wins over it
    /// (`None`: each variant's own).
    pub on_deadline_override: Option<OnDeadline>,
    /// Times the application retries an operation that failed with an overload error, while
    /// its deadline has not passed (0: the application does not retry).
    pub app_retries: u32,
    /// Share of otherwise admitted data requests the server model rejects at random with
    /// both overload labels (`randomRejectShare`; 0: none, and the field is not sent).
    pub random_reject_share: f64,
    /// Open or closed loop.
    pub load: Load,
    /// Replica-set members (persona `replicaset`); each runs a server model of its own.
    pub members: usize,
    /// A member with a smaller model than the others, if any.
    pub hot_member: Option<HotMember>,
    /// Routers, shards and the hot shard (persona `sharded` only).
    pub sharding: ShardLayout,
    /// Whether a closed-loop run saturating the process's CPU is the intent (`fast-path`):
    /// then CPU saturation is reported but does not make the run invalid.
    pub saturation_expected: bool,
    /// Faults during every variant run (`faults`).
    pub faults: Option<Faults>,
}

impl Default for LabConfig {
    fn default() -> Self {
        LabConfig {
            scenario: Scenario::burst(Length::Default),
            variants: Variant::defaults(),
            repeats: 1,
            capacity: 0.0,
            arrivals: Arrivals::Poisson,
            instances: 4,
            max_pool_size: 100,
            min_pool_size: 0,
            client_options: String::new(),
            deadline: Duration::from_millis(100),
            max_time_override: None,
            drain: Duration::from_secs(2),
            mix: OpMix::default(),
            docs: 1000,
            seed: 4,
            server_mode: ServerMode::Model,
            persona: Persona::Replicaset,
            limiter_share: 0.9,
            model_overrides: None,
            max_lag_p99: Duration::from_millis(5),
            on_deadline_override: None,
            app_retries: 0,
            random_reject_share: 0.0,
            load: Load::Open,
            members: 1,
            hot_member: None,
            sharding: ShardLayout::default(),
            saturation_expected: false,
            faults: None,
        }
    }
}

/// Cores of the lab's default server model.
pub const MODEL_CORES: f64 = 2.0;
/// Core time per operation kind in the lab's default server model (ms).
pub const MODEL_COST_MS: [(OpKind, f64); 4] = [
    (OpKind::PointRead, 2.0),
    (OpKind::RangeRead, 5.0),
    (OpKind::Insert, 3.0),
    (OpKind::Update, 3.0),
];
/// Capacity in failpoint mode when none is given (ops/s).
pub const FAILPOINT_CAPACITY: f64 = 800.0;

impl LabConfig {
    /// The attribution of requests to shards, in persona `sharded` (`None` otherwise): what
    /// the cold-shard figure needs.
    pub fn shard_keys(&self) -> Option<ShardKeys> {
        (self.persona == Persona::Sharded).then(|| self.sharding.keys(self.docs))
    }

    /// Capacity in ops/s: the given one, else derived from the server model's cores and the
    /// mix's mean cost (model mode), else [`FAILPOINT_CAPACITY`].
    pub fn effective_capacity(&self) -> f64 {
        if self.capacity > 0.0 {
            return self.capacity;
        }
        match self.server_mode {
            ServerMode::Model => {
                let cores = self
                    .model_overrides
                    .as_ref()
                    .and_then(|v| v.get("cores"))
                    .and_then(|v| v.as_f64())
                    .unwrap_or(MODEL_CORES);
                let mean_ms: f64 = MODEL_COST_MS
                    .iter()
                    .map(|(k, ms)| self.mix.share(*k) * self.model_cost_ms(*k, *ms))
                    .sum();
                if mean_ms > 0.0 {
                    cores * 1000.0 / mean_ms
                } else {
                    FAILPOINT_CAPACITY
                }
            }
            _ => FAILPOINT_CAPACITY,
        }
    }

    fn model_cost_ms(&self, kind: OpKind, default: f64) -> f64 {
        let key = match kind {
            OpKind::PointRead => "pointReadMs",
            OpKind::RangeRead => "rangeReadMs",
            OpKind::Insert | OpKind::Update => "writeMs",
        };
        self.model_overrides
            .as_ref()
            .and_then(|v| v.get("costs"))
            .and_then(|v| v.get(key))
            .and_then(|v| v.as_f64())
            .unwrap_or(default)
    }

    /// What `variant`'s application does in this run: its own behaviour, with the run's
    /// overrides ([`LabConfig::max_time_override`], [`LabConfig::on_deadline_override`]) over
    /// it. Where the variant sets `timeoutMS` the application sends no `maxTimeMS` of its own.
    pub fn application(&self, variant: &Variant) -> Application {
        let mut app = variant.app;
        if let Some(m) = self.max_time_override {
            app.max_time = m;
        }
        if let Some(d) = self.on_deadline_override {
            app.on_deadline = d;
        }
        if has_timeout(&variant.uri_options) || has_timeout(&self.client_options) {
            app.max_time = false;
        }
        app
    }

    /// Whether this run's overrides change what `variant`'s application does (the report
    /// says so beside the variant).
    pub fn app_overridden(&self, variant: &Variant) -> bool {
        // Compared as described: under `timeoutMS` the driver returns at the deadline itself,
        // so whether the application would drop the call changes nothing.
        let effective = self.application(variant).describe(&variant.uri_options);
        effective != variant.app.describe(&variant.uri_options)
    }

    /// The connection string options every client of `variant` gets (pool settings, the
    /// run's client options, then the variant's own, which win).
    pub fn uri_options(&self, variant: &Variant) -> String {
        let mut opts = vec![
            format!("maxPoolSize={}", self.max_pool_size),
            format!("minPoolSize={}", self.min_pool_size),
        ];
        for extra in [&self.client_options, &variant.uri_options] {
            opts.extend(
                extra
                    .split('&')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string),
            );
        }
        // Later settings of the same key win.
        let deadline_ms = self.deadline.as_millis().to_string();
        let mut out: Vec<String> = Vec::new();
        for o in opts {
            let o = o.replace(DEADLINE_PLACEHOLDER, &deadline_ms);
            let key = o.split('=').next().unwrap_or_default().to_ascii_lowercase();
            out.retain(|p| p.split('=').next().unwrap_or_default().to_ascii_lowercase() != key);
            out.push(o);
        }
        out.join("&")
    }
}

/// Appends `options` to a connection string.
pub fn with_options(uri: &str, options: &str) -> String {
    if options.is_empty() {
        return uri.to_string();
    }
    let sep = if uri.contains('?') {
        "&"
    } else if uri.ends_with('/') {
        "?"
    } else {
        "/?"
    };
    format!("{uri}{sep}{options}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_belong_to_the_shard_of_their_third_and_ranges_touch_what_the_routers_target() {
        let layout = ShardLayout::default();
        assert_eq!(layout.split_points(1000), vec![333, 666]);
        assert_eq!(layout.split_points(3), vec![1, 2]);
        let k = layout.keys(1000);
        // Boundaries: a split point belongs to the chunk it starts.
        for (key, shard) in [
            (0, 0),
            (332, 0),
            (333, 1),
            (665, 1),
            (666, 2),
            (999, 2),
            (5000, 2),
            (-1, 0),
        ] {
            assert_eq!(k.shard_of(key), shard, "{key}");
        }
        use OpKind::*;
        assert!(k.is_cold(PointRead, 332, 20));
        assert!(!k.is_cold(PointRead, 333, 20));
        assert!(!k.is_cold(Update, 400, 20));
        assert!(k.is_cold(PointRead, 666, 20));
        // `[313, 332]` stays on shard 0, but its bound `$lt: 333` is a split point and the
        // routers treat it as inclusive, so shard 1 is touched.
        assert_eq!(k.touched(RangeRead, 313, 20), (0, 1));
        assert!(!k.is_cold(RangeRead, 313, 20));
        assert_eq!(k.touched(RangeRead, 312, 20), (0, 0));
        assert!(k.is_cold(RangeRead, 312, 20));
        // Crossing from the hot shard into a cold one, and across all three.
        assert!(!k.is_cold(RangeRead, 660, 20));
        assert_eq!(k.touched(RangeRead, 300, 400), (0, 2));
        assert!(
            k.is_cold(RangeRead, 990, 20),
            "past the last key: the last shard"
        );
        // An insert's ObjectId `_id` sorts after every number.
        assert_eq!(k.touched(Insert, 400, 20), (2, 2));
        // No overflow at the edges.
        assert_eq!(k.touched(RangeRead, i64::MAX - 1, 20), (2, 2));
        let huge = ShardLayout::default().keys(i64::MAX);
        assert_eq!(huge.shard_of(i64::MAX), 2);
        // One shard: everything on shard 0, which is then cold unless it is the hot one.
        let one = ShardLayout {
            shards: 1,
            hot_index: 1,
            ..ShardLayout::default()
        };
        assert!(one.split_points(1000).is_empty());
        assert!(one.keys(1000).is_cold(RangeRead, 990, 20));
        // Only the sharded persona attributes requests.
        let mut cfg = LabConfig::default();
        assert!(cfg.shard_keys().is_none());
        cfg.persona = Persona::Sharded;
        assert_eq!(cfg.shard_keys(), Some(layout.keys(cfg.docs)));
    }

    #[test]
    fn two_and_four_shards_split_the_keys_evenly_and_shard_1_stays_out_of_the_cold_figure() {
        use OpKind::*;
        let two = ShardLayout {
            shards: 2,
            ..ShardLayout::default()
        };
        assert_eq!(two.split_points(1000), vec![500]);
        let k = two.keys(1000);
        for (key, shard) in [(0, 0), (499, 0), (500, 1), (999, 1), (-1, 0), (5000, 1)] {
            assert_eq!(k.shard_of(key), shard, "{key}");
        }
        // Shard 0 alone is cold: a range up to the split point touches shard 1.
        assert!(k.is_cold(PointRead, 499, 20));
        assert!(!k.is_cold(PointRead, 500, 20));
        assert_eq!(k.touched(RangeRead, 480, 20), (0, 1));
        assert!(k.is_cold(RangeRead, 479, 20));
        // Inserts land on the last shard, which is the hot one here.
        assert_eq!(k.touched(Insert, 0, 20), (1, 1));
        assert!(!k.is_cold(Insert, 0, 20));

        let four = ShardLayout {
            shards: 4,
            ..ShardLayout::default()
        };
        assert_eq!(four.split_points(1000), vec![250, 500, 750]);
        assert_eq!(four.split_points(4), vec![1, 2, 3]);
        let k = four.keys(1000);
        for (key, shard) in [(249, 0), (250, 1), (499, 1), (500, 2), (749, 2), (750, 3)] {
            assert_eq!(k.shard_of(key), shard, "{key}");
        }
        // Shards 0, 2 and 3 are cold, a range across two of them too; shard 1 is not.
        assert!(k.is_cold(PointRead, 100, 20));
        assert!(!k.is_cold(Update, 300, 20));
        assert!(k.is_cold(RangeRead, 740, 20));
        assert_eq!(k.touched(RangeRead, 740, 20), (2, 3));
        assert!(!k.is_cold(RangeRead, 490, 20));
        assert!(!k.is_cold(RangeRead, 230, 20));
        assert!(k.is_cold(Insert, 0, 20));
        let cfg = LabConfig {
            persona: Persona::Sharded,
            sharding: four,
            ..LabConfig::default()
        };
        assert_eq!(cfg.shard_keys(), Some(k));
    }

    #[test]
    fn sharding_options_are_parsed_within_their_bounds_and_change_only_what_they_name() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            o: ShardOptions,
        }
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("lab").chain(args.iter().copied())).map(|c| c.o)
        };
        assert_eq!(parse(&[]).ok(), Some(ShardOptions::default()));
        assert!(ShardOptions::default().is_empty());
        let o = parse(&[
            "--shards",
            "2",
            "--hot-share",
            "0.05",
            "--router-retries",
            "0",
            "--router-shard-labels",
        ])
        .expect("valid options");
        assert_eq!(
            o,
            ShardOptions {
                shards: Some(2),
                hot_share: Some(0.05),
                router_retries: Some(0),
                router_shard_labels: true,
            }
        );
        assert!(!o.is_empty());
        for ok in [
            &["--shards", "16"][..],
            &["--hot-share", "1"],
            &["--router-retries", "10"],
        ] {
            assert!(parse(ok).is_ok(), "{ok:?}");
        }
        for bad in [
            &["--shards", "1"][..],
            &["--shards", "17"],
            &["--hot-share", "0"],
            &["--hot-share", "-0.1"],
            &["--hot-share", "1.01"],
            &["--hot-share", "NaN"],
            &["--hot-share", "inf"],
            &["--router-retries", "11"],
            &["--router-retries", "-1"],
        ] {
            // Usage errors: `lab` exits with clap's code 2.
            let e = parse(bad).expect_err("out of range");
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }

        // The same bounds for callers that build the options themselves.
        for bad in [
            ShardOptions {
                shards: Some(1),
                ..ShardOptions::default()
            },
            ShardOptions {
                hot_share: Some(0.0),
                ..ShardOptions::default()
            },
            ShardOptions {
                router_retries: Some(11),
                ..ShardOptions::default()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
            assert!(bad.apply(&mut ShardLayout::default()).is_err(), "{bad:?}");
        }

        // Applied: what they name changes, the rest stays the scenario's.
        let mut layout = ShardLayout {
            hot_share: Some(1.0 / 3.0),
            ..ShardLayout::default()
        };
        o.apply(&mut layout).expect("a hot shard to share");
        assert_eq!(
            layout,
            ShardLayout {
                routers: 3,
                shards: 2,
                hot_index: 1,
                hot_share: Some(0.05),
                router_retries: Some(0),
                router_shard_labels: true,
            }
        );
        let mut layout = ShardLayout {
            hot_share: Some(1.0 / 3.0),
            ..ShardLayout::default()
        };
        ShardOptions::default().apply(&mut layout).expect("nothing");
        assert_eq!(layout.hot_share, Some(1.0 / 3.0));
        assert_eq!((layout.shards, layout.router_retries), (3, None));
        // No hot shard, no share to set.
        assert!(o.apply(&mut ShardLayout::default()).is_err());

        // `summary.json` records them beside the layout, `null` where mongos's default stays.
        assert_eq!(
            serde_json::to_value(ShardLayout::default()).expect("json"),
            serde_json::json!({
                "routers": 3, "shards": 3, "hotIndex": 1, "hotShare": null,
                "routerRetries": null, "routerShardLabels": false,
            })
        );
    }

    #[test]
    fn scenarios_and_phases() {
        let s = Scenario::burst(Length::Default);
        assert_eq!(s.duration(), Duration::from_secs(30));
        assert_eq!(s.burst_end(), Some(Duration::from_secs(20)));
        assert_eq!(s.phase_at(Duration::from_secs(4)), 0);
        assert_eq!(s.phase_at(Duration::from_secs(5)), 1);
        assert_eq!(s.phase_at(Duration::from_secs(99)), 2);
        let c = Scenario::parse_custom("50:5, 200%:3s, 50:2").unwrap();
        assert_eq!(c.burst, Some(1));
        assert_eq!(c.phases[1].load, 2.0);
        assert!(Scenario::parse_custom("50").is_err());
        assert!(Scenario::sustained(Length::Long).burst.is_none());
    }

    #[test]
    fn variants_parse() {
        assert_eq!(
            Variant::parse("upstream-no-retries").unwrap().uri_options,
            "maxAdaptiveRetries=0"
        );
        let v = Variant::parse("f1:fork:maxAdaptiveRetries=1&maxPoolSize=4").unwrap();
        assert_eq!(v.driver, Driver::Fork);
        assert_eq!(v.uri_options, "maxAdaptiveRetries=1&maxPoolSize=4");
        assert!(Variant::parse("nope").is_err());
        assert!(Variant::parse("x:mongo").is_err());
        let cfg = LabConfig::default();
        assert_eq!(
            cfg.uri_options(&v),
            "minPoolSize=0&maxAdaptiveRetries=1&maxPoolSize=4"
        );
        assert_eq!(
            with_options("mongodb://h:1/?replicaSet=lab", "a=1"),
            "mongodb://h:1/?replicaSet=lab&a=1"
        );
        assert_eq!(with_options("mongodb://h:1", "a=1"), "mongodb://h:1/?a=1");
    }

    #[test]
    fn a_variant_carries_its_application_and_overrides_say_so() {
        let best = Variant::parse("upstream-best").unwrap();
        assert_eq!(best.app, Application::BEST);
        assert_eq!(
            Variant::parse("upstream-maxtime").unwrap().app,
            Application {
                max_time: true,
                on_deadline: OnDeadline::Continue
            }
        );
        assert_eq!(
            Variant::parse("upstream-default").unwrap().app,
            Application::DEFAULT
        );
        // A fourth field states the application; options may hold ':' themselves.
        let v = Variant::parse("u1:upstream:maxAdaptiveRetries=1:maxtime+drop").unwrap();
        assert_eq!(
            (v.uri_options.as_str(), v.app),
            ("maxAdaptiveRetries=1", Application::BEST)
        );
        let tags = Variant::parse("u2:upstream:readPreferenceTags=dc:ny").unwrap();
        assert_eq!(
            (tags.uri_options.as_str(), tags.app),
            ("readPreferenceTags=dc:ny", Application::DEFAULT)
        );
        assert_eq!(
            Variant::parse("u3:upstream::drop").unwrap().app.on_deadline,
            OnDeadline::Drop
        );
        assert_eq!(Application::parse("maxtime+nope"), None);
        for app in [Application::DEFAULT, Application::BEST] {
            assert_eq!(Application::parse(&app.spec()), Some(app));
        }

        let cfg = LabConfig::default();
        assert_eq!(cfg.application(&best), Application::BEST);
        assert!(!cfg.app_overridden(&best));
        // The run's override applies to every variant, and says so where it changes one.
        let dropping = LabConfig {
            on_deadline_override: Some(OnDeadline::Drop),
            ..LabConfig::default()
        };
        let default = Variant::parse("upstream-default").unwrap();
        assert_eq!(dropping.application(&default).on_deadline, OnDeadline::Drop);
        assert!(dropping.app_overridden(&default));
        assert!(!dropping.app_overridden(&best));
        // With timeoutMS the driver sends maxTimeMS itself; the application does not.
        let with_max_time = LabConfig {
            max_time_override: Some(true),
            ..LabConfig::default()
        };
        let fbt = Variant::parse("fork-budget-timeout").unwrap();
        assert!(!with_max_time.application(&fbt).max_time);
        assert!(!with_max_time.app_overridden(&fbt));
        assert!(!dropping.app_overridden(&fbt));
        assert!(with_max_time.application(&default).max_time);
        assert!(fbt.app.describe(&fbt.uri_options).contains("timeoutMS"));
    }

    #[test]
    fn timeout_variants_get_the_applications_deadline() {
        let cfg = LabConfig {
            deadline: Duration::from_millis(250),
            ..LabConfig::default()
        };
        let v = Variant::parse("fork-budget-timeout").unwrap();
        assert_eq!(
            cfg.uri_options(&v),
            "maxPoolSize=100&minPoolSize=0&retryBudget=true&timeoutMS=250"
        );
        let recommended = Variant::parse(RECOMMENDED).unwrap();
        assert_eq!(
            cfg.uri_options(&recommended),
            "maxPoolSize=100&minPoolSize=0&retryBudget=true&timeoutMS=250&adaptiveThrottle=true"
        );
        let custom = Variant::parse("t:fork:timeoutMS={deadline}").unwrap();
        assert!(cfg.uri_options(&custom).ends_with("&timeoutMS=250"));
    }

    #[test]
    fn mix_and_capacity() {
        let mix = OpMix::parse("point=1,insert=1").unwrap();
        assert_eq!(mix.pick(0.1), OpKind::PointRead);
        assert_eq!(mix.pick(0.9), OpKind::Insert);
        assert!(OpMix::parse("scan=1").is_err());
        assert!(OpMix::parse("point=0").is_err());
        let cfg = LabConfig::default();
        // 0.8 × 2 + 0.1 × 5 + 0.1 × 3 = 2.4 ms per op on 2 cores.
        assert!((cfg.effective_capacity() - 2000.0 / 2.4).abs() < 1e-6);
        let fp = LabConfig {
            server_mode: ServerMode::Failpoint,
            ..LabConfig::default()
        };
        assert_eq!(fp.effective_capacity(), FAILPOINT_CAPACITY);
    }
}
