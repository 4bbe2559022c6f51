//! A QEMU process's usage as the host sees it, from `/proc/<pid>`:
//! - CPU% = the process's CPU time (`utime + stime` of `/proc/<pid>/stat`, all its threads:
//!   vCPUs, the TCG translator, I/O) over the wall time between two samples, times 100: 100 =
//!   one host core busy, as the Docker driver's column (a 2-vCPU guest spinning both reads
//!   about 200). With no earlier sample (the first refresh after the controller started), the
//!   average since the process started (`starttime` against `/proc/uptime`).
//! - MEMORY% = the process's resident set (`VmRSS` of `/proc/<pid>/status`) over the memory the
//!   guest was given, times 100. The RSS holds the guest pages the guest has touched plus
//!   QEMU's own (its code, TCG's translation buffer): an idle guest shows more than it uses
//!   inside, and a guest never shows less than it touched since boot (freed guest memory is
//!   not given back without a balloon).

use std::fs;
use std::io;
use std::time::Instant;

/// One CPU sample of a process.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct CpuSample {
    /// The QEMU process.
    pub pid: i32,
    /// `starttime` (clock ticks after boot): with the pid, identifies the process.
    pub start_ticks: u64,
    /// `utime + stime` in clock ticks.
    pub cpu_ticks: u64,
    /// When the sample was taken.
    pub at: Instant,
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
pub(crate) fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// Reads `/proc/<pid>/stat`.
pub(crate) fn sample(pid: i32) -> io::Result<CpuSample> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let (cpu_ticks, start_ticks) = parse_stat(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{pid}/stat: {text}"),
        )
    })?;
    Ok(CpuSample {
        pid,
        start_ticks,
        cpu_ticks,
        at: Instant::now(),
    })
}

/// (`utime + stime`, `starttime`) from a `/proc/<pid>/stat` line. The command name (field 2)
/// is in parentheses and may hold spaces and parentheses: fields are counted after the last
/// `)`, where field 3 (state) comes first.
pub(crate) fn parse_stat(text: &str) -> Option<(u64, u64)> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field n of proc(5) is fields[n - 3].
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    let start: u64 = fields.get(22 - 3)?.parse().ok()?;
    Some((utime + stime, start))
}

/// CPU% between `before` and `now` of the same process (0 if it is another process or no
/// time passed).
pub(crate) fn cpu_percent_between(
    before: &CpuSample,
    now: &CpuSample,
    ticks_per_second: f64,
) -> f64 {
    if before.pid != now.pid || before.start_ticks != now.start_ticks {
        return 0.0;
    }
    let wall = now.at.saturating_duration_since(before.at).as_secs_f64();
    if wall <= 0.0 {
        return 0.0;
    }
    let cpu = now.cpu_ticks.saturating_sub(before.cpu_ticks) as f64 / ticks_per_second;
    cpu / wall * 100.0
}

/// CPU% averaged over the process's life, for a first sample: `uptime_seconds` is the first
/// number of `/proc/uptime`.
pub(crate) fn cpu_percent_since_start(
    now: &CpuSample,
    uptime_seconds: f64,
    ticks_per_second: f64,
) -> f64 {
    let alive = uptime_seconds - now.start_ticks as f64 / ticks_per_second;
    if alive <= 0.0 {
        return 0.0;
    }
    now.cpu_ticks as f64 / ticks_per_second / alive * 100.0
}

/// The first number of `/proc/uptime`.
pub(crate) fn uptime_seconds() -> io::Result<f64> {
    let text = fs::read_to_string("/proc/uptime")?;
    text.split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("/proc/uptime: {text}")))
}

/// The process's resident set in bytes (`VmRSS` of `/proc/<pid>/status`).
pub(crate) fn rss_bytes(pid: i32) -> io::Result<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status"))?;
    parse_rss(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{pid}/status has no VmRSS"),
        )
    })
}

fn parse_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// MEMORY% = RSS over the guest's memory.
pub(crate) fn memory_percent(rss_bytes: u64, guest_bytes: u64) -> f64 {
    if guest_bytes == 0 {
        return 0.0;
    }
    rss_bytes as f64 / guest_bytes as f64 * 100.0
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        // A command name with a space and a parenthesis, as a thread may be named.
        let line = "4242 (qemu-system-x86 (x)) S 1 4242 4242 0 -1 4194560 1 0 0 0 250 50 0 0 20 0 5 0 123456 1000 100 18446744073709551615";
        assert_eq!(parse_stat(line), Some((300, 123_456)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn cpu_percent_is_cpu_time_over_wall_time_with_100_per_busy_core() {
        let t0 = Instant::now();
        let at = |ticks, secs| CpuSample {
            pid: 7,
            start_ticks: 10,
            cpu_ticks: ticks,
            at: t0 + Duration::from_secs(secs),
        };
        // 2 s of CPU in 1 s: two cores busy.
        assert_eq!(cpu_percent_between(&at(100, 0), &at(300, 1), 100.0), 200.0);
        assert_eq!(cpu_percent_between(&at(100, 0), &at(150, 2), 100.0), 25.0);
        // Another process (restarted under the same pid) or no time: 0.
        let mut other = at(300, 1);
        other.start_ticks = 11;
        assert_eq!(cpu_percent_between(&at(100, 0), &other, 100.0), 0.0);
        assert_eq!(cpu_percent_between(&at(100, 0), &at(200, 0), 100.0), 0.0);
        // Since start: started at 0.1 s after boot, 1 s of CPU over 10 s alive.
        assert_eq!(cpu_percent_since_start(&at(100, 0), 10.1, 100.0), 10.0);
    }

    #[test]
    fn memory_percent_is_rss_over_the_guests_memory() {
        assert_eq!(parse_rss("Name:\tq\nVmRSS:\t  1024 kB\n"), Some(1 << 20));
        assert_eq!(memory_percent(64 << 20, 256 << 20), 25.0);
        assert_eq!(memory_percent(1, 0), 0.0);
    }

    #[test]
    fn this_process_can_be_sampled() {
        let me = std::process::id() as i32;
        let s = sample(me).unwrap();
        assert!(s.start_ticks > 0);
        assert!(rss_bytes(me).unwrap() > 0);
        assert!(uptime_seconds().unwrap() > 0.0);
    }
}
