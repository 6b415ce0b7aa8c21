//! Instructions per operation, the fast path's layout-insensitive figure (`lab instructions`,
//! `docs/lab.md` "Instructions per operation"): `pathbench --count N --only VARIANT` under
//! `valgrind --tool=callgrind` at two counts; the difference of the two totals ÷ the difference
//! of the counts is the instructions of one operation, client and in-process emulator
//! together, with set-up and warm-up cancelled out.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::verdict::{InstructionCount, InstructionCounts};

/// A variant as `pathbench` runs it: the lab's name, `pathbench`'s name, and the fork options
/// `pathbench` gets for it (`None`: one of its built-in variants).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountedVariant {
    /// The lab's variant name (the verdict matches on it).
    pub name: &'static str,
    /// The name given to `pathbench --only`.
    pub bench_name: &'static str,
    /// `--fork-variant BENCH_NAME=OPTIONS`, for variants `pathbench` does not have built in.
    pub fork_options: Option<&'static str>,
}

/// The variants counted by default. `timeoutMS` is 60 s under valgrind: the lab's 100 ms
/// would expire while valgrind seeds the collection; the timer's cost is the same.
pub const COUNTED: [CountedVariant; 5] = [
    CountedVariant {
        name: "upstream-default",
        bench_name: "upstream-default",
        fork_options: None,
    },
    CountedVariant {
        name: "fork-default",
        bench_name: "fork-default",
        fork_options: None,
    },
    CountedVariant {
        name: "fork-budget-timeout",
        bench_name: "fbt-60s",
        fork_options: Some("retryBudget=true&timeoutMS=60000"),
    },
    CountedVariant {
        name: "fork-recommended",
        bench_name: "recommended-60s",
        fork_options: Some("retryBudget=true&timeoutMS=60000&adaptiveThrottle=true"),
    },
    CountedVariant {
        name: "fork-controls",
        bench_name: "controls-60s",
        fork_options: Some(
            "retryBudget=true&timeoutMS=60000&adaptiveThrottle=true&adaptiveConcurrency=true\
             &enableOverloadRetargeting=true",
        ),
    },
];

/// The total instructions (`Ir`) of a callgrind output file: its `totals:` line, else its
/// `summary:` line.
pub fn callgrind_total(out: &str) -> Option<u64> {
    let line = out
        .lines()
        .find(|l| l.starts_with("totals:"))
        .or_else(|| out.lines().find(|l| l.starts_with("summary:")))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Instructions per operation from the totals at two counts (`None` unless `high` ran more
/// operations and more instructions than `low`).
pub fn per_op(low: (u64, u64), high: (u64, u64)) -> Option<f64> {
    let ops = high.0.checked_sub(low.0).filter(|n| *n > 0)?;
    let ins = high.1.checked_sub(low.1).filter(|n| *n > 0)?;
    Some(ins as f64 / ops as f64)
}

/// Runs `pathbench` (at `bench`) under callgrind for `variant` at `count` operations, the
/// output into `dir`; returns its total instructions.
pub fn count_once(
    bench: &Path,
    dir: &Path,
    variant: &CountedVariant,
    count: u64,
) -> Result<u64, String> {
    let out_file: PathBuf = dir.join(format!("callgrind.{}.{count}", variant.name));
    let mut cmd = Command::new("valgrind");
    cmd.arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg(bench)
        .args(["--count", &count.to_string(), "--only", variant.bench_name]);
    if let Some(options) = variant.fork_options {
        cmd.arg("--fork-variant")
            .arg(format!("{}={options}", variant.bench_name));
    }
    let status = cmd
        .output()
        .map_err(|e| format!("valgrind: {e} (is valgrind installed?)"))?;
    if !status.status.success() {
        return Err(format!(
            "valgrind {} --count {count}: {}",
            variant.name,
            String::from_utf8_lossy(&status.stderr)
                .lines()
                .last()
                .unwrap_or("failed")
        ));
    }
    let text =
        std::fs::read_to_string(&out_file).map_err(|e| format!("{}: {e}", out_file.display()))?;
    callgrind_total(&text).ok_or_else(|| format!("{}: no totals line", out_file.display()))
}

/// Counts every variant of `variants` at `low` and `high` operations.
pub fn count_all(
    bench: &Path,
    dir: &Path,
    variants: &[CountedVariant],
    low: u64,
    high: u64,
    commit: String,
    progress: &dyn Fn(&str),
) -> Result<InstructionCounts, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut counts = Vec::new();
    for v in variants {
        progress(&format!("{}: {low} operations", v.name));
        let a = count_once(bench, dir, v, low)?;
        progress(&format!("{}: {high} operations", v.name));
        let b = count_once(bench, dir, v, high)?;
        let per_op = per_op((low, a), (high, b))
            .ok_or_else(|| format!("{}: {b} instructions at {high} ≤ {a} at {low}", v.name))?;
        counts.push(InstructionCount {
            name: v.name.to_string(),
            per_op,
            ratio: None,
        });
    }
    let mut out = InstructionCounts {
        ops: high - low,
        commit,
        variants: counts,
    };
    out.fill_ratios();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_and_per_operation_counts() {
        let out =
            "version: 1\ncreator: callgrind-3.22\nevents: Ir\nsummary: 500\n\ntotals: 1234567\n";
        assert_eq!(callgrind_total(out), Some(1_234_567));
        assert_eq!(callgrind_total("events: Ir\nsummary: 42\n"), Some(42));
        assert_eq!(callgrind_total("events: Ir\n"), None);
        assert_eq!(
            per_op((1_000, 200_000_000), (11_000, 1_500_000_000)),
            Some(130_000.0)
        );
        assert_eq!(per_op((1_000, 5), (1_000, 9)), None);
        assert_eq!(per_op((1_000, 9), (2_000, 5)), None);
    }

    #[test]
    fn counted_variants_are_lab_variants() {
        for v in COUNTED {
            assert!(
                super::super::config::Variant::parse(v.name).is_ok(),
                "{}",
                v.name
            );
        }
    }
}
