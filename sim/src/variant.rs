//! The client configurations a run compares: the lab's variants (`docs/lab.md`, "Variants"),
//! each a controller's settings plus the application around the driver.

use std::time::Duration;

use overload::admission::ThrottleConfig;
use overload::budget::RetryBudgetConfig;
use overload::control::{ConcurrencyOptions, PoolSize, Settings};

/// The lab's `--max-pool-size`: the concurrency limit's ceiling.
pub const MAX_POOL_SIZE: u32 = 100;

/// `serverSelectionTimeoutMS`'s default: how long an operation without `timeoutMS` may wait for
/// a concurrency slot.
pub const SLOT_WAIT: Duration = Duration::from_secs(30);

/// What the application does when its deadline passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDeadline {
    /// The driver call goes on (retries included); only the application stops waiting.
    Continue,
    /// The driver call is dropped (`tokio::time::timeout` around it), or the driver returns at
    /// the deadline itself (`timeoutMS`): no further attempt is sent.
    Drop,
}

/// Where `maxTimeMS` comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxTime {
    /// None is sent.
    None,
    /// The application sets `maxTimeMS` = its deadline on reads (upstream 3.9.1 has the option
    /// on finds only).
    AppOnReads,
    /// The driver's `timeoutMS`: every command carries the time left less the round trip.
    Driver,
}

/// Options a run may set on every variant that has the control (the connection-string options
/// of the same names; unset: the variant's own, the fork's defaults).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Overrides {
    /// `retryBudgetMinPerSec`.
    pub budget_min_per_sec: Option<u32>,
    /// `retryBudgetPercent`.
    pub budget_percent: Option<f64>,
    /// `adaptiveThrottleMinRequests`.
    pub throttle_min_requests: Option<u32>,
}

/// A named client configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Variant {
    /// Upstream's defaults: spec retries (`maxAdaptiveRetries` 2, full-jitter backoff base
    /// 100 ms, cap 10 s), no `maxTimeMS`, the call goes on after the deadline.
    #[value(alias = "upstream")]
    UpstreamDefault,
    /// As `upstream-default` with `maxAdaptiveRetries=0`.
    UpstreamNoRetries,
    /// Upstream with `maxTimeMS` = deadline on finds; the call goes on after the deadline.
    UpstreamMaxtime,
    /// Upstream's best practice: `maxTimeMS` = deadline on finds, the call dropped at the
    /// deadline; default retries.
    UpstreamBest,
    /// As `upstream-best` with `maxAdaptiveRetries=0`.
    UpstreamBestNoRetries,
    /// The fork with `retryBudget=true` only; the application of `upstream-default`.
    ForkBudget,
    /// The fork with `timeoutMS={deadline}` only.
    ForkTimeout,
    /// The budget and `timeoutMS`: `retryBudget=true&timeoutMS={deadline}` (the recommended
    /// settings until 2026-12-04).
    ForkBudgetTimeout,
    /// The fork's recommended settings: `fork-budget-timeout` and the adaptive throttle
    /// (`adaptiveThrottle=true`, at its default `K = 2`).
    #[value(alias = "recommended")]
    ForkRecommended,
    /// Every control: budget, `timeoutMS`, adaptive throttle, adaptive concurrency.
    ForkControls,
}

impl Variant {
    /// Every variant, in the report's order.
    pub const ALL: [Variant; 10] = [
        Variant::UpstreamDefault,
        Variant::UpstreamNoRetries,
        Variant::UpstreamMaxtime,
        Variant::UpstreamBest,
        Variant::UpstreamBestNoRetries,
        Variant::ForkBudget,
        Variant::ForkTimeout,
        Variant::ForkBudgetTimeout,
        Variant::ForkRecommended,
        Variant::ForkControls,
    ];

    /// The name, as the lab spells it.
    pub fn name(self) -> &'static str {
        match self {
            Variant::UpstreamDefault => "upstream-default",
            Variant::UpstreamNoRetries => "upstream-no-retries",
            Variant::UpstreamMaxtime => "upstream-maxtime",
            Variant::UpstreamBest => "upstream-best",
            Variant::UpstreamBestNoRetries => "upstream-best-no-retries",
            Variant::ForkBudget => "fork-budget",
            Variant::ForkTimeout => "fork-timeout",
            Variant::ForkBudgetTimeout => "fork-budget-timeout",
            Variant::ForkRecommended => "fork-recommended",
            Variant::ForkControls => "fork-controls",
        }
    }

    /// Whether this variant runs the fork's controls (else upstream's retry rules only, which
    /// the controller without a budget, deadline or admission control applies).
    pub fn is_fork(self) -> bool {
        matches!(
            self,
            Variant::ForkBudget
                | Variant::ForkTimeout
                | Variant::ForkBudgetTimeout
                | Variant::ForkRecommended
                | Variant::ForkControls
        )
    }

    /// Where `maxTimeMS` comes from.
    pub fn max_time(self) -> MaxTime {
        match self {
            Variant::UpstreamDefault | Variant::UpstreamNoRetries | Variant::ForkBudget => {
                MaxTime::None
            }
            Variant::UpstreamMaxtime | Variant::UpstreamBest | Variant::UpstreamBestNoRetries => {
                MaxTime::AppOnReads
            }
            Variant::ForkTimeout
            | Variant::ForkBudgetTimeout
            | Variant::ForkRecommended
            | Variant::ForkControls => MaxTime::Driver,
        }
    }

    /// What the application does at its deadline.
    pub fn on_deadline(self) -> OnDeadline {
        match self {
            Variant::UpstreamDefault
            | Variant::UpstreamNoRetries
            | Variant::UpstreamMaxtime
            | Variant::ForkBudget => OnDeadline::Continue,
            _ => OnDeadline::Drop,
        }
    }

    /// Whether the variant has the retry budget.
    pub fn has_budget(self) -> bool {
        self.is_fork() && self != Variant::ForkTimeout
    }

    /// The controller's settings for an application whose deadline is `deadline`, as the
    /// driver builds them from the variant's connection string, with `overrides`.
    pub fn settings(self, deadline: Duration, overrides: Overrides) -> Settings {
        let timeout = (self.max_time() == MaxTime::Driver).then_some(deadline);
        let budget = self.has_budget().then(|| {
            let defaults = RetryBudgetConfig::default();
            RetryBudgetConfig {
                min_retries_per_sec: overrides
                    .budget_min_per_sec
                    .unwrap_or(defaults.min_retries_per_sec),
                retry_percent: overrides.budget_percent.unwrap_or(defaults.retry_percent),
                ..defaults
            }
        });
        let controls = self == Variant::ForkControls;
        let no_retries = matches!(
            self,
            Variant::UpstreamNoRetries | Variant::UpstreamBestNoRetries
        );
        Settings {
            max_adaptive_retries: Some(if no_retries { 0 } else { 2 }),
            budget,
            throttle: (controls || self == Variant::ForkRecommended).then(|| {
                let defaults = ThrottleConfig::default();
                ThrottleConfig {
                    min_requests: overrides
                        .throttle_min_requests
                        .unwrap_or(defaults.min_requests),
                    ..defaults
                }
            }),
            concurrency: controls.then(|| {
                ConcurrencyOptions::default().config(PoolSize {
                    configured: Some(MAX_POOL_SIZE),
                    default: MAX_POOL_SIZE,
                })
            }),
            slot_wait: SLOT_WAIT,
            client_timeout: timeout,
        }
    }

    /// Parses a comma-separated list of names (`all`: every variant).
    ///
    /// # Errors
    ///
    /// A message naming the unknown entry and the known names.
    pub fn parse_list(list: &str) -> Result<Vec<Variant>, String> {
        let mut out = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if entry == "all" {
                out.extend(Variant::ALL);
                continue;
            }
            let found = <Variant as clap::ValueEnum>::from_str(entry, false).map_err(|_| {
                let known: Vec<&str> = Variant::ALL.iter().map(|v| v.name()).collect();
                format!(
                    "unknown variant {entry:?}: use one of {} (or recommended, all)",
                    known.join(", ")
                )
            })?;
            out.push(found);
        }
        if out.is_empty() {
            return Err("no variant given".into());
        }
        out.dedup();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_settings_are_valid() {
        for v in Variant::ALL {
            assert_eq!(Variant::parse_list(v.name()), Ok(vec![v]));
            let settings = v.settings(Duration::from_millis(100), Overrides::default());
            overload::control::Controller::<u32>::new(settings, crate::clock::now)
                .expect("valid settings");
        }
        assert_eq!(
            Variant::parse_list("recommended"),
            Ok(vec![Variant::ForkRecommended])
        );
        let throttle = |v: Variant| {
            v.settings(Duration::from_millis(100), Overrides::default())
                .throttle
                .map(|t| t.k)
        };
        let default_k = Some(ThrottleConfig::default().k);
        assert_eq!(throttle(Variant::ForkRecommended), default_k);
        assert_eq!(throttle(Variant::ForkControls), default_k);
        assert_eq!(throttle(Variant::ForkBudgetTimeout), None);
        assert!(Variant::parse_list("nope").is_err());
        assert!(Variant::parse_list(" , ").is_err());
    }
}
