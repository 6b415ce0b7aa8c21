//! The overload situations the lab's scenarios build on, at the model level (no driver, paused
//! clock): random transient rejections (`transient`), rejection work under a flood (`flood`),
//! queueing without a limiter (`no-limiter`), one hot member of three (`hot-member`). How
//! members are wired to their own models is in `member_models.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use emulator::model::{
    CommandInfo, CommandKind, CostConfig, LimiterConfig, Model, ModelConfig, ModelSnapshot,
    RejectionKind, TicketConfig, RETRYABLE, SYSTEM_OVERLOADED,
};
use tokio::task::JoinSet;
use tokio::time::{Duration, Instant};

fn point_read() -> CommandInfo {
    CommandInfo::new("find", CommandKind::PointRead, Instant::now()).with_cost_ms(0.0)
}

/// Admits `n` point reads one after another; returns which were rejected at random.
async fn random_rejections(m: &Arc<Model>, n: usize) -> Vec<bool> {
    let mut rejected = Vec::with_capacity(n);
    for _ in 0..n {
        match m.admit(&point_read()).await {
            Ok(_) => rejected.push(false),
            Err(r) => {
                assert_eq!(r.kind, RejectionKind::Random, "{r:?}");
                assert_eq!(r.code, 462);
                assert_eq!(r.labels, [SYSTEM_OVERLOADED, RETRYABLE]);
                rejected.push(true);
            }
        }
    }
    rejected
}

fn transient(seed: u64) -> ModelConfig {
    ModelConfig {
        enabled: true,
        seed,
        random_reject_share: 0.05,
        costs: CostConfig {
            rejection_ms: 0.5,
            ..CostConfig::default()
        },
        ..ModelConfig::default()
    }
}

#[tokio::test(start_paused = true)]
async fn random_rejections_hit_their_share_with_both_labels_and_are_reproducible() {
    const N: usize = 4000;
    let m = Model::new(transient(11)).unwrap();
    let first = random_rejections(&m, N).await;
    let hits = first.iter().filter(|r| **r).count() as u64;
    // Binomial(4000, 0.05): mean 200, standard deviation 13.8; five deviations either side.
    assert!(
        (131..=269).contains(&hits),
        "{hits} random rejections of {N}"
    );
    let c = m.snapshot().counters;
    assert_eq!(c.random_rejections, hits);
    assert_eq!(
        c.rejected, 0,
        "the ingress limiter is off and counted apart"
    );
    assert_eq!(c.admitted, N as u64 - hits);
    // Each rejection was charged costs.rejectionMs of core time, as wasted work.
    let want_ms = hits as f64 * 0.5;
    assert!((c.rejection_work_ms - want_ms).abs() < 1e-6, "{c:?}");
    assert!((c.wasted_work_ms - want_ms).abs() < 1e-6, "{c:?}");
    assert!((c.busy_core_ms - want_ms).abs() < 1e-6, "{c:?}");

    // The same seed rejects the same requests; another seed other ones.
    let again = random_rejections(&Model::new(transient(11)).unwrap(), N).await;
    assert_eq!(first, again);
    let other = random_rejections(&Model::new(transient(12)).unwrap(), N).await;
    assert_ne!(first, other);

    // Reseeding at run time restarts the sequence.
    m.set_parameters(&bson::doc! { "seed": 12_i64 }).unwrap();
    m.set_parameters(&bson::doc! { "seed": 11_i64 }).unwrap();
    assert_eq!(random_rejections(&m, N).await, first);
}

#[tokio::test(start_paused = true)]
async fn random_rejections_spare_commands_and_a_switched_off_model() {
    let all = ModelConfig {
        random_reject_share: 1.0,
        ..transient(3)
    };
    let m = Model::new(all.clone()).unwrap();
    // hello, ping, commitTransaction, ...: not data requests.
    for name in ["ping", "hello", "commitTransaction", "endSessions"] {
        let info = CommandInfo::new(name, CommandKind::Command, Instant::now());
        assert!(m.admit(&info).await.is_ok(), "{name}");
    }
    // Every data kind is rejected at share 1.
    for kind in [
        CommandKind::PointRead,
        CommandKind::RangeRead,
        CommandKind::Scan,
        CommandKind::Write,
    ] {
        let info = CommandInfo::new("x", kind, Instant::now());
        assert!(m.admit(&info).await.is_err(), "{kind:?}");
    }
    let off = Model::new(ModelConfig {
        enabled: false,
        ..all
    })
    .unwrap();
    assert!(off.admit(&point_read()).await.is_ok());
    assert_eq!(off.snapshot().counters.random_rejections, 0);
}

/// The small server of the scenario tests: one core, 2 ms point reads (500 reads/s), 8 read
/// tickets, and (when `limited`) the ingress limiter at 90 % of capacity like the lab's.
fn small_server(limited: bool, rejection_ms: f64) -> ModelConfig {
    ModelConfig {
        enabled: true,
        cores: 1,
        tickets: TicketConfig {
            read: 8,
            write: 8,
            ..TicketConfig::default()
        },
        limiter: LimiterConfig {
            enabled: limited,
            rate_per_sec: 450.0,
            burst_capacity_secs: 0.25,
            ..LimiterConfig::default()
        },
        costs: CostConfig {
            point_read_ms: 2.0,
            rejection_ms,
            ..CostConfig::default()
        },
        ..ModelConfig::default()
    }
}

/// Capacity of [`small_server`] in point reads per second.
const CAPACITY: f64 = 500.0;

/// What the server answered to an offered load.
#[derive(Debug, Default)]
struct Tally {
    ok: u64,
    /// Error replies by code.
    errors: BTreeMap<i32, u64>,
    /// Errors labelled `SystemOverloadedError`.
    overload_errors: u64,
}

/// Offers `share` × [`CAPACITY`] point reads per second, evenly spaced, for `secs` seconds
/// (each with `maxTimeMS` 100, as the lab's deadlines), waits for every answer and tallies them.
async fn offer(m: &Arc<Model>, share: f64, secs: f64) -> Tally {
    let rate = share * CAPACITY;
    let n = (rate * secs).round() as u64;
    let gap = Duration::from_secs_f64(1.0 / rate);
    let t0 = Instant::now();
    let mut tasks = JoinSet::new();
    for i in 0..n {
        tokio::time::sleep_until(t0 + gap * i as u32).await;
        let m = m.clone();
        tasks.spawn(async move {
            let info = CommandInfo::new("find", CommandKind::PointRead, Instant::now())
                .with_max_time_ms(100);
            match m.admit(&info).await {
                Ok(a) => a.execute(std::future::pending()).await.map(|_| ()),
                Err(r) => Err(r),
            }
        });
    }
    let mut tally = Tally::default();
    while let Some(done) = tasks.join_next().await {
        match done.expect("no request task panics") {
            Ok(()) => tally.ok += 1,
            Err(r) => {
                *tally.errors.entry(r.code).or_default() += 1;
                if r.labels.contains(&SYSTEM_OVERLOADED) {
                    tally.overload_errors += 1;
                }
            }
        }
    }
    tally
}

fn shed(s: &ModelSnapshot) -> u64 {
    s.counters.rejected + s.counters.shed + s.counters.random_rejections
}

#[tokio::test(start_paused = true)]
async fn hot_member_only_the_hot_members_model_sheds() {
    // Three routers with the same model: router 0 gets 150 % of its capacity, the others 50 %.
    let routers: Vec<Arc<Model>> = (0..3)
        .map(|i| Model::for_member(small_server(true, 0.0), i).unwrap())
        .collect();
    let (hot, cold_a, cold_b) = tokio::join!(
        offer(&routers[0], 1.5, 2.0),
        offer(&routers[1], 0.5, 2.0),
        offer(&routers[2], 0.5, 2.0),
    );
    let snaps: Vec<ModelSnapshot> = routers.iter().map(|m| m.snapshot()).collect();
    // The hot router's limiter admits 450/s plus its 112-token burst of the 1,500 offered.
    assert!(shed(&snaps[0]) >= 400, "{hot:?} {:?}", snaps[0].counters);
    assert_eq!(hot.overload_errors, shed(&snaps[0]));
    assert!(hot.ok >= 900, "{hot:?}");
    for (cold, snap) in [(&cold_a, &snaps[1]), (&cold_b, &snaps[2])] {
        assert_eq!(shed(snap), 0, "{:?}", snap.counters);
        assert_eq!(cold.ok, 500, "{cold:?}");
        assert!(cold.errors.is_empty(), "{cold:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn flood_rejections_take_a_visible_share_of_core_time() {
    // 500 % of capacity against the limiter, with and without a cost per rejection.
    let free = Model::new(small_server(true, 0.0)).unwrap();
    let free_tally = offer(&free, 5.0, 2.0).await;
    let costly = Model::new(small_server(true, 0.3)).unwrap();
    let t0 = Instant::now();
    let costly_tally = offer(&costly, 5.0, 2.0).await;
    let elapsed_ms = t0.elapsed().as_secs_f64() * 1000.0;

    let c = costly.snapshot().counters;
    assert!(c.rejected >= 3500, "{c:?}");
    // Every rejection was charged to the cores: 0.3 ms each, counted as busy core time.
    let charged = c.rejected as f64 * 0.3;
    assert!((c.rejection_work_ms - charged).abs() < 1.0, "{c:?}");
    assert!(
        c.busy_core_ms >= c.useful_work_ms + c.rejection_work_ms - 1.0,
        "{c:?}"
    );
    // The one core was busy throughout, and all of that time is accounted for: a rejection
    // shorter than a timer tick must not hold its core for the whole tick.
    assert!(
        c.busy_core_ms >= 0.95 * elapsed_ms,
        "{elapsed_ms} ms: {c:?}"
    );
    let share = c.rejection_work_ms / c.busy_core_ms;
    assert!(
        share > 0.25,
        "rejections took {share:.2} of core time: {c:?}"
    );
    assert_eq!(free.snapshot().counters.rejection_work_ms, 0.0);

    // Refusing work is work: with the same admissions, fewer requests complete in time.
    assert!(
        (costly_tally.ok as f64) < 0.9 * free_tally.ok as f64,
        "free {free_tally:?}, costly {costly_tally:?}"
    );
    // Requests that lost core time to rejections ran out of time.
    assert!(
        costly_tally.errors.get(&50).copied().unwrap_or(0) > 0,
        "{costly_tally:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn no_limiter_overload_shows_as_queue_waits_and_deadlines_not_overload_errors() {
    let calm = Model::new(small_server(false, 0.0)).unwrap();
    let calm_tally = offer(&calm, 0.5, 2.0).await;
    let calm_waits = calm.snapshot().queue_wait_ms;
    assert_eq!(calm_tally.ok, 500, "{calm_tally:?}");
    assert!(calm_waits.p95 < 5.0, "{calm_waits:?}");

    let burst = Model::new(small_server(false, 0.0)).unwrap();
    let tally = offer(&burst, 1.3, 2.0).await;
    let s = burst.snapshot();
    // No overload error reaches the client: the only errors are deadlines (50).
    assert_eq!(tally.overload_errors, 0, "{tally:?}");
    assert_eq!(shed(&s), 0, "{:?}", s.counters);
    let expired = tally.errors.get(&50).copied().unwrap_or(0);
    assert!(expired > 0, "{tally:?}");
    assert_eq!(tally.errors.len(), 1, "{tally:?}");
    // The overload shows as time in the server's ticket queue.
    let waits = s.queue_wait_ms;
    assert!(
        waits.p95 > 10.0 * calm_waits.p95.max(1.0),
        "{waits:?} vs {calm_waits:?}"
    );
    assert!(waits.max >= 50.0, "{waits:?}");
}
