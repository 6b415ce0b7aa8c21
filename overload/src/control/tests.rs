use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::admission::ThrottleConfig;
use crate::backoff::ServerBaseBackoff;
use crate::budget::RetryBudgetConfig;
use crate::labels::Overload;
use crate::retry::Failure;

/// The injected clock: a fixed origin; tests pass `t0() + offset` as every reading.
fn t0() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

fn at(millis: u64) -> Instant {
    t0() + ms(millis)
}

/// Jitter pinned to 1: every backoff is its ceiling (200 ms, 400 ms, ... with the default base).
fn full() -> impl crate::backoff::Jitter {
    || 1.0
}

/// Counts releases, like the driver's Notify.
#[derive(Default)]
struct Releases(AtomicUsize);

impl ReleaseSignal for Releases {
    fn slot_released(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

type Ctl = Controller<String, Releases>;

fn controller(settings: Settings) -> Ctl {
    Controller::new(settings, t0).expect("valid settings")
}

fn settings() -> Settings {
    Settings {
        slot_wait: ms(30_000),
        ..Settings::default()
    }
}

/// A controller whose budget funds one retry per first attempt and nothing else (no floor).
fn one_retry_per_first_attempt() -> Ctl {
    controller(Settings {
        budget: Some(RetryBudgetConfig {
            min_retries_per_sec: 0,
            retry_percent: 100.0,
            ..RetryBudgetConfig::default()
        }),
        ..settings()
    })
}

fn overloaded() -> Failure {
    Failure::new(Overload::Retryable, None)
}

fn ordinary() -> Failure {
    Failure::new(Overload::None, None)
}

fn server() -> String {
    "a:27017".to_owned()
}

fn question<'a>(server: &'a String, deadline: Option<Deadline>) -> RetryQuestion<'a, String> {
    RetryQuestion {
        operation: "find",
        server: Some(server),
        deadline,
    }
}

/// A budget that never admits a retry (no reserve, no share of first attempts).
fn empty_budget() -> RetryBudgetConfig {
    RetryBudgetConfig {
        min_retries_per_sec: 0,
        retry_percent: 0.0,
        ..RetryBudgetConfig::default()
    }
}

// Question 1: the deadline.

#[test]
fn the_most_specific_timeout_wins_and_continuations_have_only_their_own() {
    let ctl = controller(Settings {
        client_timeout: Some(ms(300)),
        ..settings()
    });
    let all = Timeouts {
        operation: Some(ms(100)),
        target: Some(ms(200)),
    };
    assert_eq!(
        ctl.deadline("find", all, at(0)),
        Some(Deadline::at(at(100)))
    );
    let target = Timeouts {
        operation: None,
        ..all
    };
    assert_eq!(
        ctl.deadline("find", target, at(0)),
        Some(Deadline::at(at(200)))
    );
    assert_eq!(
        ctl.deadline("find", Timeouts::default(), at(0)),
        Some(Deadline::at(at(300)))
    );
    for name in EXEMPT_COMMANDS {
        // A getMore runs under what its cursor gives it, never under the client's timeoutMS.
        assert_eq!(ctl.deadline(name, target, at(0)), None, "{name}");
        assert_eq!(
            ctl.deadline(name, all, at(0)),
            Some(Deadline::at(at(100))),
            "{name}"
        );
        assert!(
            !crate::admission::throttles_command(name),
            "one list: {name}"
        );
    }
    let zero = Timeouts {
        operation: Some(Duration::ZERO),
        ..all
    };
    let unlimited = ctl
        .deadline("find", zero, at(0))
        .expect("timeoutMS=0 applies");
    assert!(unlimited.is_unlimited());
    assert!(!ctl.needs_min_rtt(unlimited));
    assert_eq!(
        ctl.max_time(unlimited, ServerTimeLimit::Remaining, ms(5), at(0)),
        Ok(None)
    );
    let none = controller(settings());
    assert_eq!(none.deadline("find", Timeouts::default(), at(0)), None);
}

#[test]
fn each_batch_gets_what_remains_of_the_one_deadline() {
    let deadline = Deadline::at(at(1_000));
    assert_eq!(next_batch(None, at(0)), BatchTime::AsGiven);
    assert_eq!(
        next_batch(Some(Deadline::unlimited()), at(0)),
        BatchTime::AsGiven
    );
    assert_eq!(
        next_batch(Some(deadline), at(400)),
        BatchTime::Remaining(ms(600))
    );
    assert_eq!(next_batch(Some(deadline), at(1_000)), BatchTime::Expired);
    assert_eq!(next_batch(Some(deadline), at(5_000)), BatchTime::Expired);
}

#[test]
fn max_time_leaves_the_round_trip_and_refuses_to_send_without_a_millisecond() {
    let ctl = controller(settings());
    let deadline = Deadline::at(at(1_000));
    assert!(ctl.needs_min_rtt(deadline));
    assert_eq!(
        ctl.max_time(deadline, ServerTimeLimit::Remaining, ms(10), at(0)),
        Ok(Some(ms(990)))
    );
    assert!(ctl
        .max_time(deadline, ServerTimeLimit::Remaining, ms(10), at(990))
        .is_err());
}

#[test]
fn the_pool_size_bounds_the_concurrency_limit() {
    let pool = |configured| PoolSize {
        configured,
        default: 10,
    };
    let most = crate::admission::concurrency::MAX_MAX_LIMIT;
    assert_eq!(pool(None).limit_ceiling(), 10);
    assert_eq!(
        pool(Some(0)).limit_ceiling(),
        most,
        "maxPoolSize=0: no pool limit"
    );
    assert_eq!(pool(Some(u32::MAX)).limit_ceiling(), most);
    assert_eq!(pool(Some(3)).limit_ceiling(), 3);
    let config = ConcurrencyOptions::default().config(pool(Some(1)));
    assert_eq!((config.min_limit, config.max_limit), (1, 1));
    assert!(config.validate().is_ok(), "a pool of one is valid as it is");
    let config = ConcurrencyOptions {
        min_limit: Some(4),
        ..ConcurrencyOptions::default()
    }
    .config(pool(None));
    assert_eq!((config.min_limit, config.max_limit), (4, 10));
}

// Question 3: the retry gates, in order.

#[test]
fn an_overload_retry_waits_its_backoff_and_an_ordinary_one_goes_at_once() {
    let ctl = controller(settings());
    let server = server();
    let mut state = ctl.retry_state();
    state.record_failure(overloaded());
    assert_eq!(
        ctl.may_retry(&mut state, question(&server, None), at(0), &mut full()),
        RetryAnswer::RetryAfter(ms(200))
    );
    let mut state = ctl.retry_state();
    state.record_failure(ordinary());
    assert_eq!(
        ctl.may_retry(&mut state, question(&server, None), at(0), &mut full()),
        RetryAnswer::RetryAfter(Duration::ZERO)
    );
    state.record_failure(ordinary());
    assert_eq!(
        ctl.may_retry(&mut state, question(&server, None), at(0), &mut full()),
        RetryAnswer::ReturnLastError(Refusal::Exhausted),
        "one ordinary retry without a deadline"
    );
}

#[test]
fn the_deadline_comes_first_then_the_cap_then_the_budget() {
    let ctl = controller(Settings {
        max_adaptive_retries: Some(1),
        budget: Some(empty_budget()),
        ..settings()
    });
    let server = server();
    let deadline = Deadline::at(at(1_000));
    // Exhausted and past the deadline: the deadline answers.
    let mut state = ctl.retry_state();
    state.record_failure(overloaded());
    state.record_failure(overloaded());
    assert_eq!(
        ctl.may_retry(
            &mut state,
            question(&server, Some(deadline)),
            at(1_000),
            &mut full()
        ),
        RetryAnswer::TimedOut
    );
    // Exhausted, time left, and an empty budget: the cap answers, the budget is not asked.
    assert_eq!(
        ctl.may_retry(
            &mut state,
            question(&server, Some(deadline)),
            at(0),
            &mut full()
        ),
        RetryAnswer::ReturnLastError(Refusal::Exhausted)
    );
    assert_eq!(
        ctl.snapshot().retries_refused,
        0,
        "the budget was not charged"
    );
    // Within the cap, but the backoff (200 ms) does not fit: no budget asked either.
    let mut state = ctl.retry_state();
    state.record_failure(overloaded());
    assert_eq!(
        ctl.may_retry(
            &mut state,
            question(&server, Some(deadline)),
            at(800),
            &mut full()
        ),
        RetryAnswer::ReturnLastError(Refusal::BackoffPastDeadline)
    );
    assert_eq!(ctl.snapshot().retries_refused, 0);
    // Everything else admits it: the budget refuses and counts it.
    assert_eq!(
        ctl.may_retry(
            &mut state,
            question(&server, Some(deadline)),
            at(0),
            &mut full()
        ),
        RetryAnswer::ReturnLastError(Refusal::Budget)
    );
    assert_eq!(ctl.snapshot().retries_refused, 1);
}

#[test]
fn the_budget_is_charged_only_for_retries_after_overload_errors() {
    let ctl = controller(Settings {
        budget: Some(empty_budget()),
        ..settings()
    });
    let server = server();
    let mut state = ctl.retry_state();
    state.record_failure(ordinary());
    assert_eq!(
        ctl.may_retry(&mut state, question(&server, None), at(0), &mut full()),
        RetryAnswer::RetryAfter(Duration::ZERO)
    );
    assert_eq!(ctl.snapshot().retries_refused, 0);
    let mut state = ctl.retry_state();
    state.record_failure(overloaded());
    assert_eq!(
        ctl.may_retry(&mut state, question(&server, None), at(0), &mut full()),
        RetryAnswer::ReturnLastError(Refusal::Budget)
    );
    let funded = one_retry_per_first_attempt();
    funded.deposit(at(0));
    let mut state = funded.retry_state();
    state.record_failure(overloaded());
    assert_eq!(
        funded.may_retry(&mut state, question(&server, None), at(0), &mut full()),
        RetryAnswer::RetryAfter(ms(200)),
        "one first attempt funds one retry at 100 %"
    );
}

#[test]
fn an_operation_that_succeeds_gives_back_the_retries_the_budget_paid_for() {
    let ctl = one_retry_per_first_attempt();
    let server = server();
    ctl.deposit(at(0));
    ctl.deposit(at(0));
    let mut state = ctl.retry_state();
    for _ in 0..2 {
        state.record_failure(overloaded());
        assert!(matches!(
            ctl.may_retry(&mut state, question(&server, None), at(0), &mut full()),
            RetryAnswer::RetryAfter(_)
        ));
        assert_eq!(
            ctl.snapshot().budget_level,
            Some(2.0 - f64::from(state.budget_paid()))
        );
        assert!(ctl.send_retry(&mut state, "find", None, at(0)));
    }
    assert_eq!(state.budget_paid(), 2, "paid when sent, not when decided");
    assert_eq!(ctl.snapshot().budget_level, Some(0.0));
    ctl.succeeded(&state, at(1));
    let stats = ctl.snapshot();
    assert_eq!(stats.budget_level, Some(2.0));
    assert_eq!(stats.retries_refunded, 2);
    // An operation that failed gives nothing back: nothing calls `succeeded` for it, and one
    // that succeeded at once has nothing to give.
    ctl.succeeded(&ctl.retry_state(), at(1));
    assert_eq!(ctl.snapshot().retries_refunded, 2);
}

#[test]
fn no_retry_while_the_servers_reject_most_attempts_and_refunds_once_they_accept_again() {
    let ctl = one_retry_per_first_attempt();
    let server = server();
    let send = |t: u64| {
        ctl.deposit(at(t));
        let mut request = ctl.start_attempt("find", &server, AttemptKind::First, None, at(t));
        assert!(matches!(
            request.poll(at(t), &mut full()),
            StartAnswer::Send(_)
        ));
    };
    // Four first attempts sent, three rejected for overload: the servers accept a quarter.
    // The budget holds four retries' worth of credit, and refuses every retry: the servers
    // are shedding, not failing by chance.
    for _ in 0..4 {
        send(0);
    }
    for _ in 0..3 {
        ctl.failure(overloaded(), Some(462));
    }
    let mut state = ctl.retry_state();
    state.record_failure(overloaded());
    assert_eq!(
        ctl.may_retry(&mut state, question(&server, None), at(0), &mut full()),
        RetryAnswer::ReturnLastError(Refusal::Budget)
    );
    let budget = ctl.budget().expect("budget on");
    assert!(
        !budget.try_withdraw(),
        "application retries are refused too"
    );
    let stats = ctl.snapshot();
    assert_eq!(stats.budget_level, Some(4.0), "nothing was charged");
    // Once the servers accept most attempts again, a retry is made, and its success refunded.
    for _ in 0..10 {
        send(2);
    }
    let mut state = ctl.retry_state();
    state.record_failure(overloaded());
    assert!(matches!(
        ctl.may_retry(&mut state, question(&server, None), at(2), &mut full()),
        RetryAnswer::RetryAfter(_)
    ));
    assert!(ctl.send_retry(&mut state, "find", None, at(2)));
    ctl.succeeded(&state, at(3));
    assert_eq!(ctl.snapshot().retries_refunded, 1);
}

#[test]
fn a_retry_is_paid_for_when_it_is_sent_and_refused_if_the_credit_went_meanwhile() {
    let ctl = one_retry_per_first_attempt();
    let server = server();
    ctl.deposit(at(0));
    // Two operations fail at once; the one retry's worth of credit answers both.
    let (mut a, mut b) = (ctl.retry_state(), ctl.retry_state());
    for state in [&mut a, &mut b] {
        state.record_failure(overloaded());
        assert!(matches!(
            ctl.may_retry(state, question(&server, None), at(0), &mut full()),
            RetryAnswer::RetryAfter(_)
        ));
    }
    assert_eq!(
        ctl.snapshot().budget_level,
        Some(1.0),
        "nothing is held during the backoff"
    );
    // The first to wake pays; the second finds the credit gone and returns its last error.
    assert!(ctl.send_retry(&mut a, "find", Some(ms(50)), at(50)));
    assert!(!ctl.send_retry(&mut b, "find", Some(ms(80)), at(80)));
    let stats = ctl.snapshot();
    assert_eq!((stats.retries_made, stats.retries_refused), (1, 1));
    assert_eq!(stats.backoff_slept, ms(130), "both slept their backoff");
    // An ordinary retry costs nothing when sent.
    let mut c = ctl.retry_state();
    c.record_failure(ordinary());
    assert!(ctl.send_retry(&mut c, "find", None, at(90)));
    assert_eq!(c.budget_paid(), 0);
}

#[test]
fn a_retry_that_cannot_finish_before_the_deadline_is_declined() {
    let ctl = controller(settings());
    let server = server();
    // Successes under a deadline teach the controller that this server takes 500 ms.
    for i in 0..5 {
        let mut request = ctl.start_attempt(
            "find",
            &server,
            AttemptKind::First,
            Some(Deadline::unlimited()),
            at(i),
        );
        sent(request.poll(at(i), &mut full())).finish(
            AttemptEnd::Succeeded,
            Some(at(i)),
            at(i + 500),
        );
    }
    assert_eq!(ctl.typical_service(&server, at(600)), ms(500));
    let deadline = Some(Deadline::at(at(1_000)));
    // After an overload error, 400 ms left cannot hold the backoff and 500 ms of service.
    assert_eq!(
        overload_retry_without_jitter(&ctl, &server, deadline, at(600)),
        RetryAnswer::ReturnLastError(Refusal::CannotFinish)
    );
    assert!(matches!(
        overload_retry_without_jitter(&ctl, &server, deadline, at(400)),
        RetryAnswer::RetryAfter(_)
    ));
    // An ordinary failure is retried while any time remains (the CSOT specification).
    let mut state = ctl.retry_state();
    state.record_failure(ordinary());
    assert_eq!(
        ctl.may_retry(
            &mut state,
            question(&server, deadline),
            at(990),
            &mut full()
        ),
        RetryAnswer::RetryAfter(Duration::ZERO)
    );
}

#[test]
fn a_client_that_has_seen_only_rejections_declines_a_retry_they_show_cannot_finish() {
    let ctl = controller(settings());
    let server = server();
    let deadline = Some(Deadline::at(at(1_000)));
    // The first attempt of an operation under a 1 s deadline is rejected after 600 ms; the
    // client has never seen a success from this server.
    let attempt = sent(
        ctl.start_attempt("find", &server, AttemptKind::First, deadline, at(0))
            .poll(at(0), &mut full()),
    );
    let end = AttemptEnd::Failed {
        overload: Overload::Retryable,
        replied: true,
    };
    attempt.finish(end, Some(at(0)), at(600));
    assert_eq!(ctl.typical_service(&server, at(600)), ms(600));
    // 400 ms are left: even with no backoff, a retry that takes as long as the rejection did
    // cannot be answered in time (before, the estimate was zero and the retry was sent).
    assert_eq!(
        overload_retry_without_jitter(&ctl, &server, deadline, at(600)),
        RetryAnswer::ReturnLastError(Refusal::CannotFinish)
    );
    // An operation without a deadline leaves no sample: only operations under one read it.
    let other = "b:27017".to_owned();
    let attempt = sent(
        ctl.start_attempt("find", &other, AttemptKind::First, None, at(0))
            .poll(at(0), &mut full()),
    );
    attempt.finish(end, Some(at(0)), at(600));
    assert_eq!(ctl.typical_service(&other, at(600)), Duration::ZERO);
}

#[test]
fn service_time_is_sampled_only_for_operations_under_a_deadline() {
    let ctl = controller(settings());
    let server = server();
    let mut request = ctl.start_attempt("find", &server, AttemptKind::First, None, at(0));
    let StartAnswer::Send(attempt) = request.poll(at(0), &mut full()) else {
        panic!("sent");
    };
    attempt.finish(AttemptEnd::Succeeded, Some(at(0)), at(700));
    assert_eq!(ctl.typical_service(&server, at(800)), Duration::ZERO);
}

#[test]
fn the_backoff_slept_is_the_backoff_the_deadline_checked() {
    let ctl = controller(settings());
    let server = server();
    let mut state = ctl.retry_state();
    state.record_failure(Failure::new(
        Overload::Retryable,
        ServerBaseBackoff::from_duration(ms(300)).ok(),
    ));
    let mut draws = [0.5, 0.9].into_iter();
    let mut jitter = move || draws.next().unwrap_or(0.0);
    let answer = ctl.may_retry(
        &mut state,
        question(&server, Some(Deadline::at(at(10_000)))),
        at(0),
        &mut jitter,
    );
    // 0.5 × 300 ms × 2: the first draw, kept for the sleep.
    assert_eq!(answer, RetryAnswer::RetryAfter(ms(300)));
}

#[test]
fn the_pinned_retry_asks_the_same_gates() {
    let ctl = controller(Settings {
        max_adaptive_retries: Some(2),
        ..settings()
    });
    let server = server();
    let mut state = ctl.retry_state();
    let ask = |state: &mut RetryState, failure, allowed| {
        ctl.may_retry_pinned(
            state,
            failure,
            allowed,
            question(&server, None),
            at(0),
            &mut full(),
        )
    };
    assert_eq!(
        ask(&mut state, ordinary(), true),
        RetryAnswer::ReturnLastError(Refusal::NotRetryable)
    );
    assert_eq!(
        ask(&mut state, overloaded(), false),
        RetryAnswer::ReturnLastError(Refusal::NotRetryable)
    );
    assert_eq!(state.retry_number(), 0, "refused failures are not counted");
    assert_eq!(
        ask(&mut state, overloaded(), true),
        RetryAnswer::RetryAfter(ms(200))
    );
    assert_eq!(
        ask(&mut state, overloaded(), true),
        RetryAnswer::RetryAfter(ms(400))
    );
    assert_eq!(
        ask(&mut state, overloaded(), true),
        RetryAnswer::ReturnLastError(Refusal::Exhausted)
    );
}

// Question 2: may this attempt start?

fn one_slot() -> Settings {
    Settings {
        concurrency: Some(ConcurrencyOptions::default().config(PoolSize {
            configured: Some(1),
            default: 10,
        })),
        ..settings()
    }
}

/// A first attempt sent at `at(0)` that holds a slot of `server` (the only one, with
/// [`one_slot`]) until dropped.
fn hold_the_slot<'c>(ctl: &'c Ctl, server: &String) -> Attempt<'c, String, Releases> {
    sent(
        ctl.start_attempt("find", server, AttemptKind::First, None, at(0))
            .poll(at(0), &mut full()),
    )
}

/// The answer to the first retry of a `find` on `server` that an overload error ended, with the
/// backoff's jitter at zero, so that only the deadline can decline it.
fn overload_retry_without_jitter(
    ctl: &Ctl,
    server: &String,
    deadline: Option<Deadline>,
    now: Instant,
) -> RetryAnswer {
    let mut state = ctl.retry_state();
    state.record_failure(overloaded());
    ctl.may_retry(&mut state, question(server, deadline), now, &mut || 0.0)
}

fn sent<K, S: ReleaseSignal>(answer: StartAnswer<'_, K, S>) -> Attempt<'_, K, S> {
    match answer {
        StartAnswer::Send(attempt) => attempt,
        StartAnswer::WaitUntil(until) => panic!("waits until {until:?}"),
        StartAnswer::RejectLocally(why) => panic!("rejected: {why}"),
        StartAnswer::TimedOut(why) => panic!("timed out: {why}"),
        StartAnswer::Reselect => panic!("sent back to selection"),
    }
}

#[test]
fn without_admission_controls_every_attempt_is_sent() {
    let ctl = controller(settings());
    let server = server();
    let mut request = ctl.start_attempt("find", &server, AttemptKind::First, None, at(0));
    assert!(request.signal().is_none());
    let _attempt = sent(request.poll(at(0), &mut full()));
    assert!(ctl.avoided_servers(true, None, at(0)).is_none());
}

#[test]
fn a_slot_wait_under_a_deadline_ends_in_a_timeout() {
    let ctl = controller(one_slot());
    let server = server();
    let holder = hold_the_slot(&ctl, &server);
    let deadline = Some(Deadline::at(at(50)));
    let mut waiter = ctl.start_attempt("find", &server, AttemptKind::First, deadline, at(10));
    // Rechecks every 20 ms, the last one at the deadline.
    assert!(matches!(waiter.poll(at(10), &mut full()), StartAnswer::WaitUntil(t) if t == at(30)));
    assert!(matches!(waiter.poll(at(30), &mut full()), StartAnswer::WaitUntil(t) if t == at(50)));
    match waiter.poll(at(50), &mut full()) {
        StartAnswer::TimedOut(place) => assert!(place.contains("concurrency slot"), "{place}"),
        _ => panic!("the deadline ends the wait"),
    }
    let stats = ctl.snapshot();
    assert_eq!(
        (stats.concurrency_waits, stats.concurrency_wait_timeouts),
        (1, 1)
    );
    drop(holder);
}

#[test]
fn a_slot_wait_whose_server_changed_goes_back_to_selection_and_is_counted_apart() {
    let ctl = controller(one_slot());
    let server = server();
    let holder = hold_the_slot(&ctl, &server);
    let deadline = Some(Deadline::at(at(1_000)));
    let mut waiter = ctl.start_attempt("insert", &server, AttemptKind::First, deadline, at(10));
    assert!(matches!(
        waiter.poll(at(10), &mut full()),
        StartAnswer::WaitUntil(_)
    ));
    // A look after a wait in which the server did not change keeps waiting.
    assert!(matches!(
        waiter.after_wait(at(20), false, 0, &mut full()),
        StartAnswer::WaitUntil(_)
    ));
    // The primary stepped down while the insert waited: it selects again, sending nothing.
    assert!(matches!(
        waiter.after_wait(at(25), true, 0, &mut full()),
        StartAnswer::Reselect
    ));
    let stats = ctl.snapshot();
    assert_eq!(
        (
            stats.concurrency_waits,
            stats.concurrency_wait_timeouts,
            stats.concurrency_wait_reselections,
            stats.retries_made,
        ),
        (1, 0, 1, 0)
    );
    // The holder's slot is still its own: the abandoned wait took none.
    let in_flight: u32 = stats.concurrency_limits.values().map(|l| l.in_flight).sum();
    assert_eq!(in_flight, 1, "only the holder's slot is in use");

    // An attempt that already went back MAX_RESELECTIONS times keeps waiting on its server.
    let mut flapping = ctl.start_attempt("insert", &server, AttemptKind::First, deadline, at(30));
    assert!(matches!(
        flapping.poll(at(30), &mut full()),
        StartAnswer::WaitUntil(_)
    ));
    assert!(matches!(
        flapping.after_wait(at(40), true, MAX_RESELECTIONS, &mut full()),
        StartAnswer::WaitUntil(_)
    ));
    // And one that has not waited yet has no wait to end: an ordinary look, which sends it
    // once the slot is free.
    drop(holder);
    let mut fresh = ctl.start_attempt("insert", &server, AttemptKind::First, deadline, at(50));
    let _sent = sent(fresh.after_wait(at(50), true, 0, &mut full()));
    assert_eq!(ctl.snapshot().concurrency_wait_reselections, 1);
}

#[test]
fn a_slot_wait_without_a_deadline_ends_in_a_local_rejection_at_the_slot_wait() {
    let ctl = controller(Settings {
        slot_wait: ms(200),
        ..one_slot()
    });
    let server = server();
    let _holder = hold_the_slot(&ctl, &server);
    let mut waiter = ctl.start_attempt("find", &server, AttemptKind::First, None, at(0));
    assert!(matches!(waiter.poll(at(0), &mut full()), StartAnswer::WaitUntil(t) if t == at(20)));
    assert!(matches!(waiter.poll(at(190), &mut full()), StartAnswer::WaitUntil(t) if t == at(200)));
    match waiter.poll(at(200), &mut full()) {
        StartAnswer::RejectLocally(why) => {
            assert!(why.contains("serverSelectionTimeoutMS"), "{why}")
        }
        _ => panic!("the slot wait ends in a local rejection"),
    };
}

#[test]
fn a_released_slot_goes_to_a_waiter_and_wakes_it() {
    let ctl = controller(one_slot());
    let server = server();
    let holder = hold_the_slot(&ctl, &server);
    let mut waiter = ctl.start_attempt("find", &server, AttemptKind::First, None, at(0));
    assert!(matches!(
        waiter.poll(at(0), &mut full()),
        StartAnswer::WaitUntil(_)
    ));
    holder.finish(AttemptEnd::Succeeded, Some(at(0)), at(5));
    assert_eq!(waiter.signal().expect("signal").0.load(Ordering::SeqCst), 1);
    let _attempt = sent(waiter.poll(at(5), &mut full()));
    assert_eq!(ctl.snapshot().concurrency_waits, 1);
    assert_eq!(ctl.snapshot().concurrency_wait_timeouts, 0);
}

#[test]
fn a_huge_slot_wait_never_ends_and_never_panics() {
    let ctl = controller(Settings {
        slot_wait: Duration::MAX,
        ..one_slot()
    });
    let server = server();
    let _holder = hold_the_slot(&ctl, &server);
    let mut waiter = ctl.start_attempt("find", &server, AttemptKind::First, None, at(0));
    for t in [0, 1_000, 1_000_000_000] {
        assert!(
            matches!(waiter.poll(at(t), &mut full()), StartAnswer::WaitUntil(u) if u == at(t + 20))
        );
    }
}

fn throttled(min_requests: u32) -> Settings {
    Settings {
        throttle: Some(ThrottleConfig {
            min_requests,
            ..ThrottleConfig::default()
        }),
        ..settings()
    }
}

/// Sends `n` first attempts that the server rejects for overload.
fn overload_first_attempts(ctl: &Ctl, server: &String, n: u64) {
    for i in 0..n {
        let attempt = sent(
            ctl.start_attempt("find", server, AttemptKind::First, None, at(i))
                .poll(at(i), &mut full()),
        );
        let end = AttemptEnd::Failed {
            overload: Overload::Retryable,
            replied: true,
        };
        attempt.finish(end, Some(at(i)), at(i));
    }
}

#[test]
fn the_throttle_rejects_first_attempts_only() {
    let ctl = controller(throttled(5));
    let server = server();
    overload_first_attempts(&ctl, &server, 5);
    let mut never = || 0.0;
    match ctl
        .start_attempt("find", &server, AttemptKind::First, None, at(10))
        .poll(at(10), &mut never)
    {
        StartAnswer::RejectLocally(why) => assert!(why.contains("adaptiveThrottle"), "{why}"),
        _ => panic!("rejected locally"),
    }
    assert_eq!(ctl.snapshot().local_rejections, 1);
    // A retry, a statement inside a transaction, a continuation: never decided.
    let _retry = sent(
        ctl.start_attempt("find", &server, AttemptKind::Retry, None, at(10))
            .poll(at(10), &mut never),
    );
    let _more = sent(
        ctl.start_attempt("getMore", &server, AttemptKind::First, None, at(10))
            .poll(at(10), &mut never),
    );
    let _statement = sent(
        ctl.start_attempt("find", &server, AttemptKind::InTransaction, None, at(10))
            .poll(at(10), &mut never),
    );
    assert_eq!(
        ctl.snapshot().local_rejections,
        1,
        "none of them was rejected"
    );
    // Selection avoids the server for a first attempt only.
    let avoided = ctl.avoided_servers(true, None, at(10)).expect("avoided");
    assert!(avoided.contains(&server));
    let deprioritized = HashSet::from(["b:1".to_owned()]);
    assert!(ctl
        .avoided_servers(false, Some(&deprioritized), at(10))
        .is_none());
}

#[test]
fn the_slot_comes_before_the_throttle() {
    let ctl = controller(Settings {
        throttle: throttled(5).throttle,
        ..one_slot()
    });
    let server = server();
    overload_first_attempts(&ctl, &server, 5);
    let mut never = || 0.0;
    // A rejected attempt gives its slot back at once.
    let _ = ctl
        .start_attempt("find", &server, AttemptKind::First, None, at(10))
        .poll(at(10), &mut never);
    let limits = ctl.snapshot().concurrency_limits;
    assert_eq!(limits[&server].in_flight, 0, "{limits:?}");
    // An attempt that never got a slot never reached the throttle.
    let _holder = sent(
        ctl.start_attempt("find", &server, AttemptKind::Retry, None, at(10))
            .poll(at(10), &mut never),
    );
    let mut waiter = ctl.start_attempt(
        "find",
        &server,
        AttemptKind::First,
        Some(Deadline::at(at(11))),
        at(10),
    );
    assert!(matches!(
        waiter.poll(at(10), &mut never),
        StartAnswer::WaitUntil(_)
    ));
    assert!(matches!(
        waiter.poll(at(11), &mut never),
        StartAnswer::TimedOut(_)
    ));
    assert_eq!(
        ctl.snapshot().local_rejections,
        1,
        "only the first rejection"
    );
}

#[test]
fn a_failed_checkout_and_a_lost_reply_are_no_latency_samples() {
    let ctl = controller(one_slot());
    let server = server();
    for i in 0..20 {
        let attempt = sent(
            ctl.start_attempt("find", &server, AttemptKind::First, None, at(i))
                .poll(at(i), &mut full()),
        );
        let end = AttemptEnd::Failed {
            overload: Overload::None,
            replied: false,
        };
        let sent = (i % 2 == 0).then(|| at(i));
        attempt.finish(end, sent, at(i));
    }
    let limits = ctl.snapshot().concurrency_limits;
    assert_eq!(limits[&server].baseline, None, "{limits:?}");
    for i in 0..16 {
        let attempt = sent(
            ctl.start_attempt("find", &server, AttemptKind::First, None, at(i))
                .poll(at(i), &mut full()),
        );
        let end = AttemptEnd::Failed {
            overload: Overload::None,
            replied: true,
        };
        attempt.finish(end, Some(at(i)), at(i + 3));
    }
    let limits = ctl.snapshot().concurrency_limits;
    assert_eq!(limits[&server].baseline, Some(ms(3)), "replies are samples");
}

#[test]
fn idle_servers_are_dropped_beyond_the_bound() {
    let ctl = controller(one_slot());
    let busy = server();
    let _held = sent(
        ctl.start_attempt("find", &busy, AttemptKind::First, None, at(0))
            .poll(at(0), &mut full()),
    );
    for i in 0..200 {
        let key = format!("h{i}:1");
        let _ = sent(
            ctl.start_attempt("find", &key, AttemptKind::First, None, at(0))
                .poll(at(0), &mut full()),
        );
        let kept = ctl.admission.as_ref().expect("on").servers_kept();
        assert!(kept <= MAX_IDLE_SERVERS + 1, "{kept}");
    }
    let limits = ctl.snapshot().concurrency_limits;
    assert_eq!(limits[&busy].in_flight, 1, "a server in use is kept");
}

#[test]
fn every_decision_reaches_the_observer() {
    let ctl = controller(throttled(1));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    ctl.observe(Box::new(move |decision| {
        sink.lock().unwrap().push(format!("{decision:?}"));
    }));
    let server = server();
    overload_first_attempts(&ctl, &server, 1);
    let mut never = || 0.0;
    let _ = ctl
        .start_attempt("find", &server, AttemptKind::First, None, at(1))
        .poll(at(1), &mut never);
    let mut state = ctl.retry_state();
    state.record_failure(overloaded());
    let _ = ctl.may_retry(
        &mut state,
        question(&server, Some(Deadline::at(at(0)))),
        at(1),
        &mut full(),
    );
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen[0].starts_with("LocalRejection"), "{seen:?}");
    assert!(seen[1].contains("DeadlinePassed"), "{seen:?}");
}

proptest! {
    /// Whatever the failures and clock readings, the gates never allow more retries than the
    /// cap, never charge the budget for an ordinary retry, never sleep past the deadline, and
    /// never panic.
    #[test]
    fn the_retry_gates_keep_their_rules(
        failures in proptest::collection::vec(any::<bool>(), 1..12),
        cap in 0u32..5,
        budget_ms in prop::option::of(0u64..20_000),
        step in 0u64..3_000,
        draw in 0.0f64..=1.0,
    ) {
        let ctl = controller(Settings {
            max_adaptive_retries: Some(cap),
            budget: Some(empty_budget()),
            ..settings()
        });
        let server = server();
        let deadline = budget_ms.map(|b| Deadline::at(at(b)));
        let mut state = ctl.retry_state();
        let mut retries = 0u32;
        let mut now = 0;
        for overload in failures {
            state.record_failure(if overload { overloaded() } else { ordinary() });
            let refused_before = ctl.snapshot().retries_refused;
            let answer = ctl.may_retry(&mut state, question(&server, deadline), at(now), &mut || draw);
            match answer {
                RetryAnswer::RetryAfter(delay) => {
                    retries += 1;
                    prop_assert!(!overload, "the empty budget refuses every overload retry");
                    prop_assert_eq!(delay, Duration::ZERO);
                    if let Some(end) = deadline {
                        prop_assert!(at(now) + delay < end.instant().expect("limited"));
                    }
                    prop_assert!(!state.exhausted());
                }
                RetryAnswer::ReturnLastError(Refusal::Budget) => {
                    prop_assert!(overload);
                    prop_assert_eq!(ctl.snapshot().retries_refused, refused_before + 1);
                    break;
                }
                RetryAnswer::ReturnLastError(_) | RetryAnswer::TimedOut => {
                    prop_assert_eq!(ctl.snapshot().retries_refused, refused_before);
                    break;
                }
            }
            now += step;
        }
        if deadline.is_none() {
            prop_assert!(retries <= cap.max(1));
        }
    }

    /// Whatever the slot wait, the deadline and the clock readings, a slot request answers
    /// without panicking, never waits past its end, and ends (time out or reject) once the end
    /// has passed.
    #[test]
    fn slot_waits_end_where_they_should(
        slot_wait_ms in prop::option::of(0u64..u64::MAX),
        deadline_ms in prop::option::of(0u64..100_000),
        polls in proptest::collection::vec(0u64..200_000, 1..20),
    ) {
        let ctl = controller(Settings {
            slot_wait: slot_wait_ms.map_or(Duration::MAX, ms),
            ..one_slot()
        });
        let server = server();
        let _holder = sent(ctl.start_attempt("find", &server, AttemptKind::First, None, at(0)).poll(at(0), &mut full()));
        let deadline = deadline_ms.map(|d| Deadline::at(at(d)));
        let mut waiter = ctl.start_attempt("find", &server, AttemptKind::First, deadline, at(0));
        let mut polls = polls;
        polls.sort_unstable();
        for t in polls {
            let end = match deadline_ms {
                Some(d) => Some(d),
                None => slot_wait_ms,
            };
            match waiter.poll(at(t), &mut full()) {
                StartAnswer::WaitUntil(until) => {
                    prop_assert!(end.is_none_or(|end| t < end));
                    prop_assert!(until > at(t) && until <= at(t) + SLOT_RECHECK);
                    if let Some(end) = end {
                        prop_assert!(until <= at(end));
                    }
                }
                StartAnswer::TimedOut(_) => {
                    prop_assert!(deadline.is_some());
                    prop_assert!(end.is_some_and(|end| t >= end));
                    break;
                }
                StartAnswer::RejectLocally(_) => {
                    prop_assert!(deadline.is_none());
                    prop_assert!(end.is_some_and(|end| t >= end));
                    break;
                }
                StartAnswer::Send(_) => prop_assert!(false, "the only slot is held"),
                StartAnswer::Reselect => prop_assert!(false, "nobody said the server changed"),
            }
        }
    }
}

#[test]
fn without_a_deadline_the_delay_answered_is_the_delay_slept() {
    let ctl = controller(settings());
    let server = server();
    let mut state = ctl.retry_state();
    state.record_failure(overloaded());
    let answer = ctl.may_retry(&mut state, question(&server, None), at(0), &mut || 0.25);
    assert_eq!(answer, RetryAnswer::RetryAfter(ms(50)));
    // The loop asks the state for the delay to sleep with its own jitter source: the kept one.
    assert_eq!(state.backoff(&mut || 0.75), ms(50));
}

#[test]
fn a_statement_inside_a_transaction_is_never_a_first_attempt() {
    assert_eq!(AttemptKind::of(false, false), AttemptKind::First);
    assert_eq!(AttemptKind::of(true, false), AttemptKind::Retry);
    assert_eq!(AttemptKind::of(false, true), AttemptKind::InTransaction);
    assert_eq!(AttemptKind::of(true, true), AttemptKind::InTransaction);
}

#[test]
fn an_observer_hears_retries_whatever_the_log_level() {
    let ctl = controller(settings());
    assert_eq!(ctl.hears_retries(), cfg!(feature = "metrics"));
    let heard = Arc::new(AtomicUsize::new(0));
    let sink = Arc::clone(&heard);
    ctl.observe(Box::new(move |decision| {
        if matches!(decision, Decision::Retry(_)) {
            sink.fetch_add(1, Ordering::SeqCst);
        }
    }));
    assert!(ctl.hears_retries());
    ctl.retrying(crate::trace::RetryAttempt {
        operation: "find",
        attempt: 1,
        max_retries: 2,
        server: "a:27017",
        error_code: Some(462),
        error_labels: &["SystemOverloadedError"],
        backoff: Some(ms(200)),
    });
    assert_eq!(heard.load(Ordering::SeqCst), 1);
}

#[test]
fn service_times_stay_bounded_and_per_server() {
    let ctl = controller(settings());
    for i in 0..200u64 {
        let key = format!("h{i}:1");
        let request = ctl.start_attempt(
            "find",
            &key,
            AttemptKind::First,
            Some(Deadline::unlimited()),
            at(i),
        );
        let mut request = request;
        let attempt = sent(request.poll(at(i), &mut full()));
        attempt.finish(AttemptEnd::Succeeded, Some(at(i)), at(i + 1 + i % 7));
        assert!(ctl.service_times.servers_kept() <= MAX_IDLE_SERVERS);
    }
    let last = "h199:1".to_owned();
    assert_eq!(ctl.typical_service(&last, at(300)), ms(1 + 199 % 7));
    assert_eq!(ctl.typical_service(&server(), at(300)), Duration::ZERO);
}

#[test]
fn a_checkout_ends_at_the_deadline_or_at_server_selection_timeout_whichever_is_first() {
    let ctl = controller(Settings {
        slot_wait: ms(1_000),
        ..settings()
    });
    let selection_started = t0() + ms(100);
    // A deadline well past serverSelectionTimeoutMS: selection and checkout share the latter.
    let far = Deadline::start(t0(), ms(10_000));
    assert_eq!(
        ctl.checkout_deadline(Some(far), selection_started)
            .and_then(|d| d.instant()),
        Some(t0() + ms(1_100))
    );
    // A deadline that comes first is kept.
    let near = Deadline::start(t0(), ms(500));
    assert_eq!(
        ctl.checkout_deadline(Some(near), selection_started),
        Some(near)
    );
    // An unlimited deadline (timeoutMS=0) leaves serverSelectionTimeoutMS.
    assert_eq!(
        ctl.checkout_deadline(Some(Deadline::unlimited()), selection_started)
            .and_then(|d| d.instant()),
        Some(t0() + ms(1_100))
    );
}

#[test]
fn a_huge_server_selection_timeout_leaves_the_checkout_to_the_deadline() {
    let ctl = controller(Settings {
        slot_wait: Duration::MAX,
        ..settings()
    });
    let deadline = Deadline::start(t0(), ms(500));
    assert_eq!(ctl.checkout_deadline(Some(deadline), t0()), Some(deadline));
    assert!(ctl
        .checkout_deadline(Some(Deadline::unlimited()), t0())
        .is_some_and(|d| d.is_unlimited()));
    // Without timeoutMS there is no bound at all.
    assert_eq!(ctl.checkout_deadline(None, t0()), None);
}
