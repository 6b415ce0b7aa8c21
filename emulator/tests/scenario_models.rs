//! The overload situations the lab's scenarios build on, at the model level (no driver, paused
//! clock): random transient rejections (`transient`), rejection work under a flood (`flood`),
//! queueing without a limiter (`no-limiter`). Per-member models are in `member_models.rs`.

use std::sync::Arc;

use emulator::model::{
    CommandInfo, CommandKind, CostConfig, Model, ModelConfig, RejectionKind, RETRYABLE,
    SYSTEM_OVERLOADED,
};
use tokio::time::Instant;

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
