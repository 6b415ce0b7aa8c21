//! Replica-set elections: `replSetStepDown`, `replSetFreeze` and the primary's hand-off.
//!
//! Every member shares one store and one session table, so "replication" is instantaneous and
//! every secondary is always caught up. What changes on an election is who accepts writes:
//! [`ReplState::primary`], the term (carried by `electionId`, an ObjectId whose last 8 bytes are
//! the term, as mongod's) and each member's `topologyVersion` counter, which makes drivers that
//! stream hello rediscover the set at once.
//!
//! As on mongod (with election hand-off, the default since 4.2), a primary that steps down
//! becomes a secondary at once, cannot be elected again for `stepDownSecs`, aborts every
//! transaction in progress, and an electable secondary wins an election shortly after (here
//! after a configurable delay, 100 ms by default). `setVersion` stays as it is: mongod changes it
//! on reconfiguration, not on elections.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, oid::ObjectId, Bson, Document};

use super::error::{codes, CommandError};
use super::{lock, Member, Role, Shared, Topology};

/// mongod's ExceededTimeLimit (no electable secondary caught up in time).
const EXCEEDED_TIME_LIMIT: i32 = 262;
/// mongod's NotSecondary (replSetFreeze on the primary).
const NOT_SECONDARY: i32 = 95;
/// Default of `secondaryCatchUpPeriodSecs` (mongod's).
const DEFAULT_CATCH_UP_SECS: f64 = 10.0;
/// Delay between a step-down and the hand-off election, unless `labElectionDelayMS` says
/// otherwise (mongod's hand-off election takes a few hundred milliseconds at most).
pub(crate) const DEFAULT_ELECTION_DELAY: Duration = Duration::from_millis(100);
/// Most times an election task waits for a member to become electable before giving up (each
/// wait lasts until the earliest embargo ends, so the bound is generous).
const MAX_ELECTION_ATTEMPTS: usize = 1000;

/// Who is primary, the term and each member's topology counter.
pub(crate) struct ReplState {
    /// The primary's member index; `None` between a step-down and the next election.
    pub(crate) primary: Option<usize>,
    /// The election term (1 at start).
    pub(crate) term: i64,
    /// Each member's `topologyVersion.counter`.
    pub(crate) counters: Vec<i64>,
    /// Members that cannot be elected until the given time (`stepDownSecs`, `replSetFreeze`).
    pub(crate) unelectable_until: Vec<Option<Instant>>,
    /// Bumped by every step-down, so an election task of an earlier one gives up.
    pub(crate) generation: u64,
    /// Elections held since start (for tests and the lab).
    pub(crate) elections: u64,
}

impl ReplState {
    /// The state at start: member 0 primary in term 1 (only for replica sets).
    pub(crate) fn new(topology: &Topology, members: usize) -> ReplState {
        ReplState {
            primary: matches!(topology, Topology::ReplicaSet { .. }).then_some(0),
            term: 1,
            counters: vec![0; members],
            unelectable_until: vec![None; members],
            generation: 0,
            elections: 0,
        }
    }

    fn electable(&self, index: usize, now: Instant) -> bool {
        self.unelectable_until
            .get(index)
            .is_some_and(|until| until.is_none_or(|t| t <= now))
    }

    /// Every member's topology changed (a new primary, or none): mongod bumps the counter
    /// whenever what its hello reports changes.
    fn bump_counters(&mut self) {
        for c in &mut self.counters {
            *c += 1;
        }
    }
}

/// The `electionId` of `term`: `7fffffff` then the term as 8 big-endian bytes, as mongod builds it.
pub(crate) fn election_id(term: i64) -> ObjectId {
    let mut bytes = [0u8; 12];
    bytes[..4].copy_from_slice(&[0x7f, 0xff, 0xff, 0xff]);
    bytes[4..].copy_from_slice(&term.to_be_bytes());
    ObjectId::from_bytes(bytes)
}

/// What a member is now (a replica-set member's role follows the elections).
pub(crate) fn role(shared: &Shared, member: &Member) -> Role {
    match member.role {
        Role::Primary | Role::Secondary => {
            if lock(&shared.repl).primary == Some(member.index) {
                Role::Primary
            } else {
                Role::Secondary
            }
        }
        other => other,
    }
}

/// How a step-down is asked for.
#[derive(Debug, Clone)]
pub struct StepDown {
    /// How long the old primary cannot be elected again (`stepDownSecs`).
    pub step_down_for: Duration,
    /// Step down even without an electable secondary (`force`).
    pub force: bool,
    /// How long the set stays without a primary before the hand-off election.
    pub election_delay: Duration,
}

impl Default for StepDown {
    fn default() -> Self {
        StepDown {
            step_down_for: Duration::from_secs(60),
            force: false,
            election_delay: DEFAULT_ELECTION_DELAY,
        }
    }
}

/// Steps member `from` down. Fails with 10107 if it is not the primary, and with 262 if no other
/// member is electable and `force` is not set.
pub(crate) fn step_down(
    shared: &Arc<Shared>,
    from: usize,
    request: &StepDown,
) -> Result<(), CommandError> {
    // The state lock first, then the replica-set lock (the order used everywhere both are
    // held), so that the role change and the transaction aborts are one step for every command
    // that runs under the state lock.
    let mut st = shared.state();
    let generation = {
        let mut repl = lock(&shared.repl);
        if repl.primary != Some(from) {
            return Err(CommandError::new(
                codes::NOT_WRITABLE_PRIMARY,
                "not primary so can't step down",
            ));
        }
        let now = Instant::now();
        let others = (0..repl.counters.len()).any(|i| i != from && repl.electable(i, now));
        if !others && !request.force {
            return Err(CommandError::new(
                EXCEEDED_TIME_LIMIT,
                "No electable secondaries caught up as of the end of the catch-up period",
            ));
        }
        repl.primary = None;
        if let Some(until) = repl.unelectable_until.get_mut(from) {
            *until = Some(now + request.step_down_for);
        }
        repl.bump_counters();
        repl.generation += 1;
        repl.generation
    };
    let aborted = st.sessions.abort_in_progress();
    drop(st);
    tracing::info!(
        member = from,
        aborted_transactions = aborted,
        "stepped down"
    );
    wake_all(shared);
    let shared = shared.clone();
    let delay = request.election_delay;
    tokio::spawn(async move { elect_after(shared, generation, from, delay).await });
    Ok(())
}

/// Holds the hand-off election after `delay`, then again whenever an embargo ends while no
/// member is electable. Gives up when a later step-down started its own election.
async fn elect_after(shared: Arc<Shared>, generation: u64, previous: usize, delay: Duration) {
    let mut shutdown = shared.shutdown.clone();
    let mut wait = delay;
    for _ in 0..MAX_ELECTION_ATTEMPTS {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => return,
        }
        let next = {
            let mut repl = lock(&shared.repl);
            if repl.generation != generation || repl.primary.is_some() {
                return;
            }
            let now = Instant::now();
            let n = repl.counters.len();
            // The member after the old primary, in index order, that may stand.
            match (1..=n)
                .map(|k| (previous + k) % n)
                .find(|&i| repl.electable(i, now))
            {
                Some(winner) => {
                    repl.primary = Some(winner);
                    repl.term += 1;
                    repl.elections += 1;
                    repl.bump_counters();
                    tracing::info!(member = winner, term = repl.term, "elected primary");
                    None
                }
                None => repl
                    .unelectable_until
                    .iter()
                    .flatten()
                    .min()
                    .map(|t| t.saturating_duration_since(now) + Duration::from_millis(1)),
            }
        };
        match next {
            None => {
                wake_all(&shared);
                return;
            }
            Some(w) => wait = w,
        }
    }
    tracing::warn!("no member became electable; the set has no primary");
}

/// Answers every pending awaitable hello (the topology changed).
fn wake_all(shared: &Shared) {
    for m in &shared.members {
        m.wake.notify_waiters();
    }
}

fn seconds(body: &Document, key: &str) -> Result<Option<f64>, CommandError> {
    match body.get(key) {
        None => Ok(None),
        Some(Bson::Int32(i)) => Ok(Some(f64::from(*i))),
        Some(Bson::Int64(i)) => Ok(Some(*i as f64)),
        Some(Bson::Double(d)) if d.is_finite() => Ok(Some(*d)),
        Some(_) => Err(CommandError::type_mismatch(format!(
            "'{key}' must be a number"
        ))),
    }
}

fn not_replica_set() -> CommandError {
    CommandError::new(76, "not running with --replSet")
}

/// `{replSetStepDown: <secs>, secondaryCatchUpPeriodSecs, force, labElectionDelayMS}` on `member`.
pub(crate) fn step_down_command(
    shared: &Arc<Shared>,
    member: &Member,
    body: &Document,
) -> Result<Document, CommandError> {
    if shared.set_name().is_none() {
        return Err(not_replica_set());
    }
    let secs = seconds(body, "replSetStepDown")?.unwrap_or(60.0);
    let catch_up = seconds(body, "secondaryCatchUpPeriodSecs")?.unwrap_or(DEFAULT_CATCH_UP_SECS);
    if secs < 0.0 || catch_up < 0.0 {
        return Err(CommandError::bad_value(
            "stepdown period and secondaryCatchUpPeriodSecs must be non-negative",
        ));
    }
    if secs < catch_up {
        return Err(CommandError::bad_value(
            "stepdown period must be longer than secondaryCatchUpPeriodSecs",
        ));
    }
    let force = match body.get("force") {
        None => false,
        Some(Bson::Boolean(b)) => *b,
        Some(_) => return Err(CommandError::type_mismatch("'force' must be a boolean")),
    };
    let delay = seconds(body, "labElectionDelayMS")?
        .map(|ms| Duration::from_millis(ms.clamp(0.0, 600_000.0) as u64))
        .unwrap_or(DEFAULT_ELECTION_DELAY);
    step_down(
        shared,
        member.index,
        &StepDown {
            step_down_for: Duration::from_secs_f64(secs.min(1e9)),
            force,
            election_delay: delay,
        },
    )?;
    Ok(doc! { "ok": 1.0 })
}

/// `{replSetGetStatus: 1}` (mongosh's `rs.status()`): the set as `member` sees it. The fields
/// are those of mongod's reply that a client reads (<https://www.mongodb.com/docs/manual/reference/command/replSetGetStatus/>):
/// `set`, `date`, `myState`, `term`, `heartbeatIntervalMillis` and one `members` entry per member
/// with `_id`, `name`, `health`, `state`, `stateStr`, `uptime`, `optime` and `optimeDate`, `self`
/// on the answering member. Every member shares one store, so every optime is the current cluster
/// time (all caught up). A standalone answers 76 NoReplicationEnabled as mongod does.
pub(crate) fn status_command(shared: &Shared, member: &Member) -> Result<Document, CommandError> {
    let Some(set_name) = shared.set_name() else {
        return Err(not_replica_set());
    };
    let (primary, term) = {
        let repl = lock(&shared.repl);
        (repl.primary, repl.term)
    };
    let optime = shared.state().tick();
    let optime_date = bson::DateTime::from_millis(i64::from(optime.time) * 1000);
    let uptime = shared.started.elapsed().as_secs() as i64;
    // mongod's MemberState numbers: 1 PRIMARY, 2 SECONDARY.
    let state_of = |index: usize| -> (i32, &'static str) {
        if primary == Some(index) {
            (1, "PRIMARY")
        } else {
            (2, "SECONDARY")
        }
    };
    let members: Vec<Bson> = shared
        .members
        .iter()
        .map(|m| {
            let (state, state_str) = state_of(m.index);
            let mut entry = doc! {
                "_id": m.index as i32,
                "name": m.host.clone(),
                "health": 1.0,
                "state": state,
                "stateStr": state_str,
                "uptime": uptime,
                "optime": { "ts": optime, "t": term },
                "optimeDate": optime_date,
            };
            if m.index == member.index {
                entry.insert("self", true);
            }
            Bson::Document(entry)
        })
        .collect();
    Ok(doc! {
        "set": set_name,
        "date": bson::DateTime::now(),
        "myState": state_of(member.index).0,
        "term": term,
        "heartbeatIntervalMillis": 2000i64,
        "members": members,
        "ok": 1.0,
    })
}

/// `{replSetFreeze: <secs>}`: a secondary does not stand for election for `secs` (0 ends it).
pub(crate) fn freeze_command(
    shared: &Arc<Shared>,
    member: &Member,
    body: &Document,
) -> Result<Document, CommandError> {
    if shared.set_name().is_none() {
        return Err(not_replica_set());
    }
    let secs = seconds(body, "replSetFreeze")?.unwrap_or(0.0);
    if secs < 0.0 {
        return Err(CommandError::bad_value(
            "replSetFreeze must be non-negative",
        ));
    }
    let (unfrozen_without_primary, generation) = {
        let mut repl = lock(&shared.repl);
        if repl.primary == Some(member.index) {
            return Err(CommandError::new(
                NOT_SECONDARY,
                "cannot freeze node when primary or running for election. state: Primary",
            ));
        }
        let until = (secs > 0.0).then(|| Instant::now() + Duration::from_secs_f64(secs.min(1e9)));
        if let Some(slot) = repl.unelectable_until.get_mut(member.index) {
            *slot = until;
        }
        (until.is_none() && repl.primary.is_none(), repl.generation)
    };
    if unfrozen_without_primary {
        // An unfrozen member of a set without a primary stands at once.
        let shared = shared.clone();
        let index = member.index;
        let n = shared.members.len().max(1);
        tokio::spawn(async move {
            elect_after(shared, generation, (index + n - 1) % n, Duration::ZERO).await
        });
    }
    Ok(doc! { "ok": 1.0 })
}

/// A running schedule of step-downs ([`crate::Emulator::schedule_step_downs`]): the lab's
/// failover fault. Stops when dropped or stopped.
pub struct StepDownSchedule {
    task: tokio::task::JoinHandle<()>,
    done: Arc<std::sync::atomic::AtomicUsize>,
    refused: Arc<std::sync::atomic::AtomicUsize>,
}

impl StepDownSchedule {
    /// Steps the primary down every `every` (the first after one period) until dropped. A
    /// step-down that fails (no primary during an election, no electable member) is counted
    /// in [`StepDownSchedule::refused`] and the schedule goes on.
    pub(crate) fn start(shared: Arc<Shared>, every: Duration, request: StepDown) -> Self {
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let refused = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (d, r) = (done.clone(), refused.clone());
        // A zero period would spin; a millisecond is already far below any election.
        let every = every.max(Duration::from_millis(1));
        let task = tokio::spawn(async move {
            let mut shutdown = shared.shutdown.clone();
            // Ends with the emulator (shutdown) or when the schedule is dropped (abort).
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = shutdown.changed() => return,
                }
                let primary = lock(&shared.repl).primary;
                let outcome = match primary {
                    Some(p) => step_down(&shared, p, &request).map_err(|e| e.errmsg),
                    None => Err("no primary".to_string()),
                };
                match outcome {
                    Ok(()) => d.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                    Err(e) => {
                        tracing::debug!(error = %e, "scheduled step-down refused");
                        r.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    }
                };
            }
        });
        StepDownSchedule {
            task,
            done,
            refused,
        }
    }

    /// Step-downs carried out so far.
    pub fn step_downs(&self) -> usize {
        self.done.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Scheduled step-downs that could not happen (no primary, no electable member).
    pub fn refused(&self) -> usize {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops the schedule; returns the step-downs carried out.
    pub fn stop(self) -> usize {
        self.step_downs()
    }
}

impl Drop for StepDownSchedule {
    fn drop(&mut self) {
        self.task.abort();
    }
}
