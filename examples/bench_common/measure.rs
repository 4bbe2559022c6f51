//! What the benchmark programs measure of their own process (CPU time, /proc/self fields).
//! Each program includes this file (`#[path]`) and uses what it needs of it.
#![allow(dead_code)]

use std::time::Duration;

pub fn cpu_time() -> Duration {
    // SAFETY: rusage is plain integers, for which all zeroes is a value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we pass.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// A KiB field of /proc/self/status.
pub fn proc_status(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The bytes this process has received over its open TCP connections (the sum of
/// `tcpi_bytes_received` of each socket among its file descriptors). A connection closed
/// before the call no longer counts: call it while the connections that matter are open.
pub fn tcp_bytes_received() -> u64 {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    let mut total = 0;
    for fd in fds.flatten() {
        let is_socket = std::fs::read_link(fd.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        let Some(fd) = fd.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if !is_socket {
            continue;
        }
        // SAFETY: tcp_info is plain integers, for which all zeroes is a value.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `info`; a descriptor that is not
        // a TCP socket (or no longer open) makes it fail, and it is skipped.
        let ok = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            )
        } == 0;
        if ok {
            total += info.tcpi_bytes_received;
        }
    }
    total
}
