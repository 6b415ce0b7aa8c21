//! The report: summary table (terminal and Markdown), `report.md`, `series.csv`,
//! `summary.json` and SVG charts.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde::Serialize;

use super::config::ShardLayout;
use super::metrics::{pct_ms, ErrorClass, Second};
use super::runner::{LabRun, VariantRun};
use super::summary::{aggregate, Percentiles, RunSummary, Spread, VariantAggregate};

fn opt(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) => format!("{x:.digits$}"),
        None => "n/a".into(),
    }
}

fn pct(v: Option<f64>) -> String {
    match v {
        Some(x) => format!("{:.1}%", x * 100.0),
        None => "n/a".into(),
    }
}

fn recovery(r: &RunSummary) -> String {
    match (r.has_burst, r.recovery_secs) {
        (false, _) => "n/a".into(),
        (true, Some(s)) => format!("{s} s"),
        (true, None) => "not recovered".into(),
    }
}

fn flags(r: &RunSummary) -> String {
    let mut f = Vec::new();
    if !r.is_valid() {
        f.push(format!("INVALID ({})", r.invalid_why.join(", ")));
    }
    if r.saturated {
        f.push("CPU SATURATED".to_string());
    }
    f.join(", ")
}

fn errors_brief(r: &RunSummary) -> String {
    let get = |c: ErrorClass| r.errors.get(c.name()).copied().unwrap_or(0);
    let other = get(ErrorClass::Expired)
        + get(ErrorClass::PoolTimeout)
        + get(ErrorClass::Network)
        + get(ErrorClass::Other);
    format!(
        "{} (ovl {} / dl {} / oth {})",
        r.total_errors(),
        get(ErrorClass::Overload),
        get(ErrorClass::ClientDeadline),
        other
    )
}

/// Headline columns of one run.
fn row(r: &RunSummary, label: &str) -> Vec<String> {
    vec![
        label.to_string(),
        format!("{:.0}", r.goodput),
        opt(r.burst_goodput, 0),
        opt(r.latency.p99, 1),
        opt(r.attempts_per_request, 2),
        errors_brief(r),
        r.late_ok.to_string(),
        pct(r.wasted_share),
        recovery(r),
        flags(r),
    ]
}

const HEAD: [&str; 10] = [
    "variant",
    "goodput/s",
    "burst goodput/s",
    "p99 ms",
    "attempts/req",
    "errors",
    "late ok",
    "wasted work",
    "recovery",
    "flags",
];

fn spread(s: &Option<Spread>, digits: usize) -> String {
    match s {
        Some(s) if s.n > 1 => format!("{:.d$} [{:.d$}–{:.d$}]", s.median, s.min, s.max, d = digits),
        Some(s) => format!("{:.d$}", s.median, d = digits),
        None => "n/a".into(),
    }
}

fn agg_row(a: &VariantAggregate) -> Vec<String> {
    let wasted = match &a.wasted_share {
        Some(s) if s.n > 1 => format!(
            "{:.1}% [{:.1}–{:.1}%]",
            s.median * 100.0,
            s.min * 100.0,
            s.max * 100.0
        ),
        Some(s) => format!("{:.1}%", s.median * 100.0),
        None => "n/a".into(),
    };
    let mut rec = spread(&a.recovery_secs, 0);
    if a.not_recovered > 0 {
        rec = format!("{rec} ({} not recovered)", a.not_recovered);
    }
    let mut fl = Vec::new();
    if a.invalid > 0 {
        fl.push(format!("{} INVALID", a.invalid));
    }
    if a.saturated > 0 {
        fl.push(format!("{} CPU SATURATED", a.saturated));
    }
    vec![
        format!("{} (×{})", a.variant, a.runs),
        spread(&a.goodput, 0),
        spread(&a.burst_goodput, 0),
        spread(&a.p99_ms, 1),
        spread(&a.attempts_per_request, 2),
        spread(&a.errors, 0),
        spread(&a.late_ok, 0),
        wasted,
        rec,
        fl.join(", "),
    ]
}

fn rows(run: &LabRun) -> Vec<Vec<String>> {
    if run.config.repeats > 1 {
        let all: Vec<&RunSummary> = run.runs.iter().map(|r| &r.summary).collect();
        aggregate(&all).iter().map(agg_row).collect()
    } else {
        run.runs
            .iter()
            .map(|r| row(&r.summary, &r.summary.variant))
            .collect()
    }
}

/// The summary table for a terminal (aligned columns).
pub fn text_table(run: &LabRun) -> String {
    let rows = rows(run);
    let mut widths: Vec<usize> = HEAD.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let pad = widths[i] - c.chars().count();
            s.push_str(c);
            s.push_str(&" ".repeat(pad + 2));
        }
        s.trim_end().to_string()
    };
    let mut out = String::new();
    let head: Vec<String> = HEAD.iter().map(|s| s.to_string()).collect();
    out.push_str(&line(&head));
    out.push('\n');
    out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
    out.push('\n');
    for r in &rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    out
}

fn md_table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = format!("| {} |\n", head.join(" | "));
    s.push_str(&format!(
        "|{}\n",
        head.iter().map(|_| "---|").collect::<String>()
    ));
    for r in rows {
        s.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    s
}

fn p3(p: &Percentiles) -> String {
    format!("{} / {} / {}", opt(p.p50, 1), opt(p.p95, 1), opt(p.p99, 1))
}

fn run_label(r: &VariantRun, repeats: usize) -> String {
    if repeats > 1 {
        format!("{} #{}", r.variant.name, r.rep + 1)
    } else {
        r.variant.name.clone()
    }
}

/// The sharded cluster in words: routers, shards, the hot shard's limiter and what the
/// routers do with a shard's overload error (`--shards`, `--hot-share`, `--router-retries`,
/// `--router-shard-labels`).
fn layout_description(layout: &ShardLayout) -> String {
    let hot = match layout.hot_share {
        Some(share) => format!(
            "shard {}'s ingress limiter at {:.3} × the others' rate",
            layout.hot_index, share
        ),
        None => "every shard's limiter at the same rate".into(),
    };
    let retries = match layout.router_retries {
        Some(0) => "do not retry a shard's overload error (`defaultClientMaxRetryAttempts` 0, \
                    set by the lab)"
            .into(),
        Some(n) => format!(
            "retry a shard's overload error up to {n} times (`defaultClientMaxRetryAttempts`, \
             set by the lab)"
        ),
        None => "retry a shard's overload error up to 3 times (mongos's default)".into(),
    };
    let labels = if layout.router_shard_labels {
        "with the shard's labels (`labRouterShardErrorLabels: \"shard\"`)"
    } else {
        "with `SystemOverloadedError` alone (mongos's)"
    };
    format!(
        "{} routers in front of {} shards, each shard owning an equal range of the keys; {hot}. \
         The routers {retries}, then pass it on {labels}.",
        layout.routers, layout.shards
    )
}

/// The cold-shard figures of a sharded run (persona `sharded`): per run, the requests whose
/// keys touch only the cold shards, and their goodput beside the total, and the routers'
/// retries of a shard's overload error.
fn cold_shards_section(run: &LabRun) -> String {
    let layout = &run.config.sharding;
    let cold: Vec<String> = (0..layout.shards)
        .filter(|i| *i != layout.hot_index)
        .map(|i| i.to_string())
        .collect();
    let rows: Vec<Vec<String>> = run
        .runs
        .iter()
        .filter_map(|r| {
            let c = r.summary.cold_shards?;
            Some(vec![
                run_label(r, run.config.repeats),
                format!("{:.0}", c.goodput),
                format!("{:.0}", r.summary.goodput),
                c.offered.to_string(),
                c.good.to_string(),
                if c.offered > 0 {
                    format!("{:.2} %", 100.0 * c.good as f64 / c.offered as f64)
                } else {
                    "n/a".into()
                },
                r.summary
                    .server
                    .as_ref()
                    .and_then(|m| m.get("routing.overloadRetries"))
                    .map_or_else(|| "n/a".into(), |x| format!("{x:.0}")),
                flags(&r.summary),
            ])
        })
        .collect();
    format!(
        "## Cold shards\n\n{}\n\nRequests whose keys lie only on shard{} {} (not shard {}, {}): \
         a range read crossing into shard {} or a scatter-gather counts as touching it. Router \
         retries: the retries the routers sent after a shard's overload error \
         (`serverStatus.labOverloadShards[].routing.overloadRetries`).\n\n{}",
        layout_description(layout),
        if cold.len() == 1 { "" } else { "s" },
        match cold.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => cold.join(""),
        },
        layout.hot_index,
        if layout.hot_share.is_some() {
            "the hot one"
        } else {
            "the one `hot-shard` overloads; here no shard is"
        },
        layout.hot_index,
        md_table(
            &[
                "run",
                "cold-shard goodput/s",
                "total goodput/s",
                "cold offered",
                "cold good",
                "cold success",
                "router retries",
                "flags",
            ],
            &rows,
        )
    )
}

/// `report.md`.
pub fn markdown(run: &LabRun, charts: &[(String, PathBuf)]) -> String {
    let cfg = &run.config;
    let mut s = String::new();
    let _ = writeln!(s, "# Overload lab report\n");
    let invalid: Vec<&RunSummary> = run
        .runs
        .iter()
        .map(|r| &r.summary)
        .filter(|r| !r.is_valid())
        .collect();
    if !invalid.is_empty() {
        let _ = writeln!(
            s,
            "**INVALID** runs (schedule lag p99 > {} ms, CPU saturated, unfinished requests, \
             steal time > {} %, or a closed loop without the machine's cores): {}. Their \
             figures are not trustworthy.\n",
            cfg.max_lag_p99.as_millis(),
            super::summary::MAX_STEAL_PCT,
            invalid
                .iter()
                .map(|r| format!(
                    "{} #{} ({})",
                    r.variant,
                    r.rep + 1,
                    r.invalid_why.join(", ")
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    if run.runs.iter().any(|r| r.summary.saturated) {
        let _ = writeln!(
            s,
            "**CPU SATURATED:** the lab process used ≥ 90 % of the machine in some runs; \
             latency there reflects the machine, not the drivers.\n"
        );
    }
    let phases: Vec<String> = cfg
        .scenario
        .phases
        .iter()
        .map(|p| {
            format!(
                "{} {:.0}% × {:.0} s",
                p.name,
                p.load * 100.0,
                p.duration.as_secs_f64()
            )
        })
        .collect();
    let _ = writeln!(
        s,
        "Scenario **{}** ({}), capacity **{:.0} ops/s** ({}), {} arrivals, {} instances, \
         maxPoolSize {} each, deadline {} ms, server mode **{:?}**{}, {} run(s) per variant, \
         wall time {:.0} s.\n",
        cfg.scenario.name,
        phases.join(" → "),
        run.capacity,
        run.capacity_note,
        format!("{:?}", cfg.arrivals).to_lowercase(),
        cfg.instances,
        cfg.max_pool_size,
        cfg.deadline.as_millis(),
        cfg.server_mode,
        match (run.model_config.is_some(), cfg.limiter_share > 0.0) {
            (true, true) => format!(
                " (ingress limiter at {:.0} % of capacity)",
                cfg.limiter_share * 100.0
            ),
            (true, false) => " (no ingress limiter)".to_string(),
            (false, _) => String::new(),
        },
        cfg.repeats,
        run.wall.as_secs_f64()
    );
    let _ = writeln!(s, "## Summary\n");
    let _ = writeln!(s, "{}", md_table(&HEAD, &rows(run)));
    let _ = writeln!(
        s,
        "Goodput: successes within the deadline per second, by scheduled second (mean over \
         the schedule; burst = during the burst/overload phase). Errors: overload (462/433), \
         deadline (the application stopped waiting), other (50 expired, pool/selection, \
         network, other). Late ok: requests the application had given up on that succeeded \
         later (server work nobody used). Recovery: seconds after the burst until goodput stays ≥ 95 % of \
         offered. Wasted work: server core time spent on requests that expired, were killed, \
         orphaned, abandoned (finished after the application's deadline) or failed, and on \
         rejections, ÷ all core time (server model only).\n"
    );
    if run.runs.iter().any(|r| r.summary.cold_shards.is_some()) {
        let _ = writeln!(s, "{}", cold_shards_section(run));
    }
    let _ = writeln!(s, "## Details per run\n");
    let mut det = Vec::new();
    for r in &run.runs {
        let x = &r.summary;
        let errs: Vec<String> = ErrorClass::ALL
            .iter()
            .map(|c| format!("{} {}", c.name(), x.errors.get(c.name()).unwrap_or(&0)))
            .collect();
        let aerrs: Vec<String> = ErrorClass::ALL
            .iter()
            .filter(|c| x.attempt_errors.get(c.name()).copied().unwrap_or(0) > 0)
            .map(|c| format!("{} {}", c.name(), x.attempt_errors[c.name()]))
            .collect();
        det.push(vec![
            run_label(r, cfg.repeats),
            format!("{} / {} / {}", x.offered, x.attempts, x.good),
            errs.join(", "),
            if aerrs.is_empty() {
                "none".into()
            } else {
                aerrs.join(", ")
            },
            format!("{} ok / {} err", x.late_ok, x.late_err),
            format!("{} / {}", x.conns_opened, x.conns_closed),
            format!("{} / {}", opt(x.lag_p99_ms, 2), opt(x.lag_max_ms, 1)),
            format!("{} / {}", opt(x.cpu_pct, 0), opt(x.cpu_max_pct, 0)),
        ]);
    }
    let _ = writeln!(
        s,
        "{}",
        md_table(
            &[
                "run",
                "offered / attempts / good",
                "request errors",
                "attempt errors",
                "late completions",
                "conns opened / closed",
                "lag p99 / max ms",
                "CPU % mean / max",
            ],
            &det
        )
    );
    let _ = writeln!(s, "## Latency split (ms, p50 / p95 / p99)\n");
    let lat: Vec<Vec<String>> = run
        .runs
        .iter()
        .map(|r| {
            let x = &r.summary;
            vec![
                run_label(r, cfg.repeats),
                p3(&x.latency),
                p3(&x.conn_wait),
                x.server_queue
                    .as_ref()
                    .map(p3)
                    .unwrap_or_else(|| "n/a".into()),
                p3(&x.service),
            ]
        })
        .collect();
    let _ = writeln!(
        s,
        "{}",
        md_table(
            &[
                "run",
                "end to end (app)",
                "connection wait",
                "server queue",
                "service (command time)",
            ],
            &lat
        )
    );
    let _ = writeln!(
        s,
        "End to end is what the application saw (the deadline for requests it gave up on). \
         Connection wait and service time are summed over a request's attempts (late ones \
         included); service time is the command monitoring duration, so it contains the \
         server's queueing. Server queue is the time each request the server admitted spent in \
         its queues (ingress queue and ticket waits), per attempt, from the server model \
         (n/a without it).\n"
    );
    if run.runs.iter().any(|r| r.summary.server.is_some()) {
        let _ = writeln!(s, "## Server model counters (deltas over each run)\n");
        let keys = [
            "admitted",
            "rejected",
            "shed",
            "completed",
            "expired",
            "orphaned",
            "abandoned",
            "failed",
            "busyCoreMs",
            "wastedWorkMs",
        ];
        let srv: Vec<Vec<String>> = run
            .runs
            .iter()
            .map(|r| {
                let mut v = vec![run_label(r, cfg.repeats)];
                for k in keys {
                    v.push(
                        r.summary
                            .server
                            .as_ref()
                            .and_then(|m| m.get(k))
                            .map(|x| format!("{x:.0}"))
                            .unwrap_or_else(|| "n/a".into()),
                    );
                }
                v
            })
            .collect();
        let mut head = vec!["run"];
        head.extend(keys);
        let _ = writeln!(s, "{}", md_table(&head, &srv));
    } else {
        let _ = writeln!(
            s,
            "Server model counters: n/a (no `labOverload` section in serverStatus).\n"
        );
    }
    let fork_stats: Vec<Vec<String>> = run
        .runs
        .iter()
        .filter_map(|r| {
            let f = r.summary.fork_stats?;
            Some(vec![
                run_label(r, cfg.repeats),
                f.overload_errors.to_string(),
                format!("{} / {}", f.retries_made, f.retries_refused),
                format!("{} / {}", f.app_retries_made, f.app_retries_refused),
                format!("{:.0}", f.backoff_slept_ms),
                f.local_rejections.to_string(),
                format!(
                    "{} / {} / {}",
                    f.concurrency_waits,
                    f.concurrency_wait_timeouts,
                    f.concurrency_wait_reselections
                ),
                f.concurrency_limit.to_string(),
            ])
        })
        .collect();
    if !fork_stats.is_empty() {
        let _ = writeln!(
            s,
            "## Fork overload statistics (`Client::overload_stats`, all instances)\n"
        );
        let _ = writeln!(
            s,
            "{}",
            md_table(
                &[
                    "run",
                    "overload errors",
                    "driver retries made / refused",
                    "application retries made / refused",
                    "backoff slept ms",
                    "local rejections",
                    "slot waits / timed out / reselected",
                    "concurrency limits (sum)",
                ],
                &fork_stats
            )
        );
        let _ = writeln!(
            s,
            "Refused retries are those the retry budget declined (`retryBudget=true`); \
             application retries go through the client's shared budget handle.\n"
        );
    }
    if !charts.is_empty() {
        let _ = writeln!(s, "## Charts\n");
        for (title, path) in charts {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let _ = writeln!(s, "### {title}\n\n![{title}]({name})\n");
        }
    }
    let _ = writeln!(s, "## Configuration\n");
    let _ = writeln!(s, "Emulator: `{}`\n", run.uri);
    for r in run.runs.iter().filter(|r| r.rep == 0) {
        let overridden = if cfg.app_overridden(&r.variant) {
            format!(
                " (overridden by the run: the variant's own is {})",
                r.variant.app.describe(&r.variant.uri_options)
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "- `{}`: driver {}, URI options `{}`; application: {}{}",
            r.variant.name,
            r.variant.driver,
            cfg.uri_options(&r.variant),
            cfg.application(&r.variant).describe(&r.variant.uri_options),
            overridden
        );
    }
    if let Some(m) = &run.model_config {
        let _ = writeln!(s, "\nServer model (`labOverload`): `{m}`");
    }
    let json = serde_json::to_string_pretty(cfg).unwrap_or_default();
    let _ = writeln!(s, "\n```json\n{json}\n```");
    let _ = writeln!(
        s,
        "\nRaw figures: `series.csv` (one row per variant run and second), `summary.json`."
    );
    s
}

/// `series.csv`: one row per variant run and second.
pub fn csv(run: &LabRun) -> String {
    let mut server_keys: Vec<String> = Vec::new();
    for r in &run.runs {
        for s in &r.seconds {
            for k in s.server.keys() {
                if !server_keys.contains(k) {
                    server_keys.push(k.clone());
                }
            }
        }
    }
    let mut out =
        String::from("variant,run,second,phase,offered,attempts,goodput,attempts_per_request");
    for c in ErrorClass::ALL {
        out.push_str(&format!(",err_{}", c.name()));
    }
    for c in ErrorClass::ALL {
        out.push_str(&format!(",attempt_err_{}", c.name()));
    }
    out.push_str(",late_ok,late_err,p50_ms,p95_ms,p99_ms,conn_wait_p99_ms,service_p99_ms,conns_opened,conns_closed,lag_p99_ms,cpu_pct,concurrency_limit,concurrency_waits");
    for k in &server_keys {
        out.push_str(&format!(",server_{}", k.replace('.', "_")));
    }
    out.push('\n');
    let o = |v: Option<f64>| v.map(|x| format!("{x:.3}")).unwrap_or_default();
    let opt_count = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_default();
    for r in &run.runs {
        for (t, s) in r.seconds.iter().enumerate() {
            let phase = run
                .config
                .scenario
                .phases
                .get(
                    run.config
                        .scenario
                        .phase_at(std::time::Duration::from_secs(t as u64)),
                )
                .map(|p| p.name.clone())
                .unwrap_or_default();
            let phase = if t >= r.summary.secs {
                "drain".to_string()
            } else {
                phase
            };
            let _ = write!(
                out,
                "{},{},{},{},{},{},{},{}",
                r.variant.name,
                r.rep + 1,
                t,
                phase,
                s.offered,
                s.attempts,
                s.good,
                o(s.attempts_per_request())
            );
            for c in ErrorClass::ALL {
                let _ = write!(out, ",{}", s.error(c));
            }
            for c in ErrorClass::ALL {
                let _ = write!(out, ",{}", s.attempt_errors[c as usize]);
            }
            let _ = write!(
                out,
                ",{},{},{},{},{},{},{},{},{},{},{},{},{}",
                s.late_ok,
                s.late_err,
                o(pct_ms(&s.latency, 50.0)),
                o(pct_ms(&s.latency, 95.0)),
                o(pct_ms(&s.latency, 99.0)),
                o(pct_ms(&s.conn_wait, 99.0)),
                o(pct_ms(&s.service, 99.0)),
                s.conns_opened,
                s.conns_closed,
                o(pct_ms(&s.lag, 99.0)),
                o(s.cpu_pct),
                opt_count(s.concurrency_limit),
                opt_count(s.concurrency_waits)
            );
            for k in &server_keys {
                let _ = write!(out, ",{}", o(s.server.get(k).copied()));
            }
            out.push('\n');
        }
    }
    out
}

#[derive(Serialize)]
struct SummaryJson<'a> {
    config: &'a super::config::LabConfig,
    capacity: f64,
    capacity_note: &'a str,
    wall_secs: f64,
    model_config: Option<serde_json::Value>,
    runs: Vec<&'a RunSummary>,
    aggregate: Vec<VariantAggregate>,
}

/// `summary.json`.
pub fn json(run: &LabRun) -> String {
    let runs: Vec<&RunSummary> = run.runs.iter().map(|r| &r.summary).collect();
    let doc = SummaryJson {
        config: &run.config,
        capacity: run.capacity,
        capacity_note: &run.capacity_note,
        wall_secs: run.wall.as_secs_f64(),
        model_config: run
            .model_config
            .as_ref()
            .and_then(|d| serde_json::to_value(d).ok()),
        aggregate: aggregate(&runs),
        runs,
    };
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

type Series = (String, Vec<(f64, f64)>);

fn line_chart(
    path: &Path,
    title: &str,
    y_desc: &str,
    series: &[Series],
    dashed_first: bool,
) -> Result<(), String> {
    let x_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(x, _)| *x))
        .fold(1.0f64, f64::max);
    let y_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
        .filter(|y| y.is_finite())
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    let root = SVGBackend::new(path, (960, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("second")
        .y_desc(y_desc)
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = if dashed_first && i == 0 {
            BLACK.to_rgba()
        } else {
            Palette99::pick(i).to_rgba()
        };
        let style = ShapeStyle::from(&color).stroke_width(2);
        chart
            .draw_series(LineSeries::new(points.iter().copied(), style))
            .map_err(|e| e.to_string())?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}

fn points(seconds: &[Second], len: usize, f: impl Fn(&Second) -> Option<f64>) -> Vec<(f64, f64)> {
    seconds
        .iter()
        .take(len)
        .enumerate()
        .filter_map(|(t, s)| f(s).map(|y| (t as f64 + 0.5, y)))
        .collect()
}

/// Draws the charts into `dir`; returns (title, path) of each chart drawn.
pub fn charts(run: &LabRun, dir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let first: Vec<&VariantRun> = run.runs.iter().filter(|r| r.rep == 0).collect();
    let Some(any) = first.first() else {
        return Ok(Vec::new());
    };
    let len = any.summary.secs;
    let mut out = Vec::new();

    let mut s: Vec<Series> = vec![(
        "offered".into(),
        points(&any.seconds, len, |x| Some(x.offered as f64)),
    )];
    for r in &first {
        s.push((
            format!("goodput {}", r.variant.name),
            points(&r.seconds, len, |x| Some(x.good as f64)),
        ));
    }
    let p = dir.join("goodput.svg");
    line_chart(&p, "Offered load and goodput", "requests / s", &s, true)?;
    out.push(("Offered load and goodput per second".into(), p));

    let mut s: Vec<Series> = Vec::new();
    for r in &first {
        s.push((
            format!("p99 {}", r.variant.name),
            points(&r.seconds, len, |x| pct_ms(&x.latency, 99.0)),
        ));
    }
    for r in &first {
        s.push((
            format!("p50 {}", r.variant.name),
            points(&r.seconds, len, |x| pct_ms(&x.latency, 50.0)),
        ));
    }
    let p = dir.join("latency.svg");
    line_chart(&p, "Latency percentiles (end to end)", "ms", &s, false)?;
    out.push(("Latency p50 and p99 per second".into(), p));

    let mut s: Vec<Series> = Vec::new();
    for r in &first {
        s.push((
            r.variant.name.clone(),
            points(&r.seconds, len, |x| {
                (x.offered > 0).then(|| x.attempts as f64 / x.offered as f64)
            }),
        ));
    }
    let p = dir.join("amplification.svg");
    line_chart(
        &p,
        "Amplification: attempts sent ÷ requests offered",
        "attempts / request",
        &s,
        false,
    )?;
    out.push(("Retry amplification per second".into(), p));
    Ok(out)
}

/// Writes `report.md`, `series.csv`, `summary.json` and the charts into `dir` (created).
/// Chart failures are reported in the Markdown, never fatal.
pub fn write_all(run: &LabRun, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let charts = match charts(run, dir) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("charts not drawn: {e}");
            Vec::new()
        }
    };
    let w = |name: &str, body: String| {
        let p = dir.join(name);
        std::fs::write(&p, body).map_err(|e| format!("{}: {e}", p.display()))
    };
    w("report.md", markdown(run, &charts))?;
    w("series.csv", csv(run))?;
    w("summary.json", json(run))?;
    Ok(())
}
