//! The report of `hack/bench-vm-controller`: one row per scenario (driver and VM count) with
//! the time to all Active, the engine's own rate, CPU, and over the steady-state window the
//! refreshes done against those due, the refresh round, status writes, memory and CPU.
//!
//! Results: one line per scenario of `key=value` fields: `driver`, `vms`, the seconds
//! `create_s`, `active_s`, `cpu_active_s`, `plane_active_s`, `delete_s` and, for an engine
//! measured alone, `engine_s` (N containers started); the window's counters before and after
//! (`reconciles_*`, `reconcile_s_*`: the reconcile time sum, `writes_*`: status writes,
//! `cpu_s_*`: the controller's CPU seconds); `rss_kib` (VmHWM). Meta `threads`,
//! `refresh_workers`, `interval` and `window` (s), `cores`, `load`, `date`, `commit`.

use std::fmt::Write as _;

use crate::error::ReportError;
use crate::results::Results;

/// Renders the report of `results`.
pub fn render(results: &Results) -> Result<String, ReportError> {
    let interval = results.meta_number("interval")?;
    let window = results.meta_number("window")?;
    let workers = results.meta_number("refresh_workers")?;
    let mut out = format!(
        "VM controller, one replica (release build, --threads {}, --refresh-workers {}, --refresh-interval {}s), local control plane, {}\n(machine: {} cores; load at the end: {})\n\n",
        results.meta("threads")?,
        results.meta("refresh_workers")?,
        results.meta("interval")?,
        results.stamp()?,
        results.meta("cores")?,
        results.meta("load")?,
    );
    out.push_str("| driver | VMs | kubectl create | controller start -> all Active | engine alone | controller CPU to all Active | control plane CPU meanwhile | refresh interval | refresh round | refreshes done / due | status writes/s | peak RSS | CPU (cores) at steady state | delete all |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for line in results.lines() {
        let vms = line.number("vms")?;
        let delta = |name: &str| -> Result<f64, ReportError> {
            Ok(line.number(&format!("{name}_after"))? - line.number(&format!("{name}_before"))?)
        };
        let reconciles = delta("reconciles")?;
        // Every VM is due once per interval.
        let done_per_due = reconciles / (vms * window / interval);
        // Refreshing all N back to back with the lane's workers, at the mean reconcile time.
        let round = if reconciles > 0.0 {
            format!(
                "{:.2}",
                vms * (delta("reconcile_s")? / reconciles) / workers
            )
        } else {
            "n/a".to_owned()
        };
        let engine = match line.value("engine_s") {
            Ok(_) => format!("{:.1} VMs/s", vms / line.number("engine_s")?),
            Err(_) => "-".to_owned(),
        };
        let text = |key| line.value(key);
        let _ = writeln!(
            out,
            "| {} | {} | {} s | **{} s** ({:.1} VMs/s) | {engine} | {} s | {} s | {} s | {round} s | {done_per_due:.2} | {:.1} | {:.0} MB | {:.3} | {} s |",
            text("driver")?,
            text("vms")?,
            text("create_s")?,
            text("active_s")?,
            vms / line.number("active_s")?,
            text("cpu_active_s")?,
            text("plane_active_s")?,
            results.meta("interval")?,
            delta("writes")? / window,
            line.number("rss_kib")? / 1024.0,
            delta("cpu_s")? / window,
            text("delete_s")?,
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const META: &str = "# threads: 2\n# refresh_workers: 4\n# interval: 20\n# window: 40\n# cores: 2\n# load: 0.50 0.40 0.30\n# date: 2026-11-26\n# commit: abc1234\n";

    #[test]
    fn a_row_per_scenario_with_the_window_s_rates() {
        let results = Results::parse(&format!(
            "{META}driver=fake vms=500 create_s=2.1 active_s=4.0 cpu_active_s=1.20 plane_active_s=3.4 delete_s=5.5 \
             reconciles_before=1000.000000 reconciles_after=2000.000000 reconcile_s_before=10.000000 reconcile_s_after=12.000000 \
             writes_before=50 writes_after=90 cpu_s_before=1.50 cpu_s_after=2.30 rss_kib=40960\n\
             driver=docker vms=100 create_s=0.5 active_s=20.0 engine_s=25.0 cpu_active_s=0.80 plane_active_s=1.0 delete_s=9.0 \
             reconciles_before=5 reconciles_after=5 reconcile_s_before=0 reconcile_s_after=0 \
             writes_before=0 writes_after=0 cpu_s_before=1 cpu_s_after=1 rss_kib=30000\n"
        ));
        let report = render(&results).unwrap();
        let rows: Vec<&str> = report.lines().skip(5).collect();
        assert_eq!(
            rows,
            [
                "| fake | 500 | 2.1 s | **4.0 s** (125.0 VMs/s) | - | 1.20 s | 3.4 s | 20 s | 0.25 s | 1.00 | 1.0 | 40 MB | 0.020 | 5.5 s |",
                "| docker | 100 | 0.5 s | **20.0 s** (5.0 VMs/s) | 4.0 VMs/s | 0.80 s | 1.0 s | 20 s | n/a s | 0.00 | 0.0 | 29 MB | 0.000 | 9.0 s |",
            ]
        );
        assert!(report.starts_with("VM controller, one replica (release build, --threads 2, --refresh-workers 4, --refresh-interval 20s), local control plane, 2026-11-26 at abc1234\n(machine: 2 cores; load at the end: 0.50 0.40 0.30)\n\n| driver |"));
    }
}
