//! The process's own CPU use, from `/proc/self/stat`.

use std::time::Duration;

/// Clock ticks per second of `/proc` times (`_SC_CLK_TCK`, 100 on Linux).
const TICKS_PER_SEC: f64 = 100.0;

/// User + system CPU time of this process so far, if `/proc/self/stat` is readable.
pub fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_stat(&stat)
}

/// Parses utime + stime out of a `/proc/<pid>/stat` line.
pub fn parse_stat(stat: &str) -> Option<Duration> {
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state); utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_secs_f64(
        (utime + stime) as f64 / TICKS_PER_SEC,
    ))
}

/// The machine's CPU time so far, from the first line of `/proc/stat`: every state's ticks
/// added up, and the ticks the hypervisor gave to other guests (steal).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MachineTicks {
    /// All ticks of every core (user, nice, system, idle, iowait, irq, softirq, steal).
    pub total: u64,
    /// Steal ticks.
    pub steal: u64,
}

impl MachineTicks {
    /// Steal as a percentage of all ticks between `self` and the later `end` (`None` when no
    /// tick passed).
    pub fn steal_pct_until(&self, end: &MachineTicks) -> Option<f64> {
        let total = end.total.checked_sub(self.total)?;
        let steal = end.steal.checked_sub(self.steal)?;
        (total > 0).then(|| 100.0 * steal as f64 / total as f64)
    }
}

/// The machine's ticks now, if `/proc/stat` is readable.
pub fn machine_ticks() -> Option<MachineTicks> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// Parses the `cpu` line of `/proc/stat` (guest time is already inside user time, so the first
/// eight fields are the total).
pub fn parse_proc_stat(stat: &str) -> Option<MachineTicks> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<Vec<u64>>>()?;
    if fields.len() < 4 {
        return None;
    }
    Some(MachineTicks {
        total: fields.iter().sum(),
        steal: fields.get(7).copied().unwrap_or(0),
    })
}

/// Cores available to this process.
pub fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Measures CPU use between calls, as a percentage of all cores.
#[derive(Debug)]
pub struct CpuMeter {
    last_cpu: Option<Duration>,
    last_wall: std::time::Instant,
}

impl CpuMeter {
    /// A meter starting now.
    pub fn new() -> CpuMeter {
        CpuMeter {
            last_cpu: process_cpu(),
            last_wall: std::time::Instant::now(),
        }
    }

    /// CPU use since the previous call (or creation), percent of all cores.
    pub fn sample(&mut self) -> Option<f64> {
        let now = std::time::Instant::now();
        let cpu = process_cpu();
        let pct = match (self.last_cpu, cpu) {
            (Some(a), Some(b)) => {
                let wall = now.duration_since(self.last_wall).as_secs_f64();
                (wall > 0.0)
                    .then(|| 100.0 * b.saturating_sub(a).as_secs_f64() / wall / cores() as f64)
            }
            _ => None,
        };
        self.last_cpu = cpu;
        self.last_wall = now;
        pct
    }
}

impl Default for CpuMeter {
    fn default() -> Self {
        CpuMeter::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_name() {
        let line = "123 (a b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0 1 1 1";
        assert_eq!(parse_stat(line), Some(Duration::from_secs(3)));
        assert!(parse_stat("garbage").is_none());
        assert!(process_cpu().is_some());
    }

    #[test]
    fn steal_is_a_share_of_all_ticks() {
        let a = parse_proc_stat("cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 1 2 3 4\n").unwrap();
        assert_eq!((a.total, a.steal), (1000, 40));
        let b = MachineTicks {
            total: 1200,
            steal: 60,
        };
        assert_eq!(a.steal_pct_until(&b), Some(10.0));
        assert_eq!(a.steal_pct_until(&a), None);
        // Older kernels without a steal column.
        assert_eq!(parse_proc_stat("cpu 1 2 3 4").map(|t| t.steal), Some(0));
        assert!(parse_proc_stat("intr 1 2").is_none());
    }
}
