//! What the benchmark reads about a server process and its files: CPU time and
//! resident memory from `/proc/<pid>/`, sizes of files on disk.
//!
//! Linux only. `/proc/<pid>/stat` reports CPU time in clock ticks of `USER_HZ`,
//! which is 100 on every Linux architecture qd targets.

use std::path::Path;

/// Clock ticks per second in `/proc/<pid>/stat` (`USER_HZ`).
const TICKS_PER_SEC: f64 = 100.0;

/// CPU seconds (user + system) process `pid` has used so far; `None` when it is gone.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces: count fields after its ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / TICKS_PER_SEC)
}

/// CPU seconds process `pid` and its live children have used so far (PostgreSQL:
/// the postmaster and its backends); `None` when `pid` is gone.
pub fn tree_cpu_secs(pid: u32) -> Option<f64> {
    let own = cpu_secs(pid)?;
    let children: f64 = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| parent(*child) == Some(pid))
        .filter_map(cpu_secs)
        .sum();
    Some(own + children)
}

/// The parent of process `pid` (field 4 of `/proc/<pid>/stat`).
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Resident memory of process `pid` in bytes (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Size of the file at `path` in bytes, 0 when it does not exist.
pub fn file_bytes(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// CPU seconds this benchmark process has used so far.
pub fn own_cpu_secs() -> Option<f64> {
    cpu_secs(std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let pid = std::process::id();
        assert!(cpu_secs(pid).is_some_and(|s| s >= 0.0));
        assert_eq!(parent(pid), Some(std::os::unix::process::parent_id()));
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep");
        assert_eq!(parent(child.id()), Some(pid));
        let own = cpu_secs(pid).expect("this process");
        let tree = tree_cpu_secs(pid).expect("this process");
        let _ = child.kill();
        let _ = child.wait();
        assert!(tree >= own, "the tree {tree} s, this process alone {own} s");
        assert!(rss_bytes(pid).is_some_and(|b| b > 0));
        assert_eq!(file_bytes(Path::new("/nonexistent/qd-bench")), 0);
    }
}
