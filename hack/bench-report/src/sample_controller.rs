//! The report of `hack/bench-sample-controller`: kubeloop's sample controller against
//! kubernetes/sample-controller (Go, its client throttle off), started over 300 Foos, the
//! two sides alternating round by round. Per side, the median of the rounds and their range,
//! and the ratio of kubeloop's median to Go's.
//!
//! Results: one line per round and side, `round=N side=go|kubeloop` then `all_s` (controller
//! started, its Foos already created -> the last Deployment seen), `controller_cpu_ticks` (the
//! controller's CPU from its start until the run settled), `peak_rss_kib` (its VmHWM),
//! `plane_cpu_ticks` (the control plane's CPU meanwhile), `request_bytes` (the request
//! bodies the apiserver received meanwhile, its `apiserver_request_body_size_bytes_sum`) and,
//! from 2026-12-01, `write_server_s` (the apiserver's time in the Deployment creates and Foo
//! status writes until the last Deployment, its `apiserver_request_duration_seconds_sum`;
//! shown per worker); a row no line has a value for is left out; meta `foos`, `settle` (s),
//! `clk_tck`, `cores`, `load`, `date`, `commit`.

use std::fmt::Write as _;

use crate::error::ReportError;
use crate::results::Results;
use crate::stats::{Samples, ratio};

/// The two sides, Go first.
const SIDES: [(&str, &str); 2] = [("go", "Go sample-controller"), ("kubeloop", "kubeloop")];
/// Workers on each side (both sides' defaults).
const WORKERS: f64 = 2.0;

/// Renders the report of `results`.
pub fn render(results: &Results) -> Result<String, ReportError> {
    let clk_tck = results.meta_number("clk_tck")?;
    let mut out = format!(
        "Sample controller from a standing start over {} Foos, 2 workers each, local control plane, {}\n(machine: {} cores; load at the end: {}; figures until {} s after the last Deployment)\n\n",
        results.meta("foos")?,
        results.stamp()?,
        results.meta("cores")?,
        results.meta("load")?,
        results.meta("settle")?,
    );
    // (row title, the results key, how a value is scaled for the table, its unit)
    let rows: [(&str, &str, f64, &str); 6] = [
        ("all Deployments", "all_s", 1.0, "s"),
        (
            "apiserver time in its creates and status writes, per worker",
            "write_server_s",
            1.0 / WORKERS,
            "s",
        ),
        ("controller CPU", "controller_cpu_ticks", 1.0 / clk_tck, "s"),
        ("controller peak RSS", "peak_rss_kib", 1.0 / 1024.0, "MiB"),
        ("control plane CPU", "plane_cpu_ticks", 1.0 / clk_tck, "s"),
        (
            "request bytes to the apiserver",
            "request_bytes",
            1.0 / 1024.0,
            "KiB",
        ),
    ];
    let rounds = results
        .lines()
        .iter()
        .filter(|line| line.value("side").is_ok_and(|s| s == SIDES[0].0))
        .count();
    let _ = writeln!(
        out,
        "| {rounds} rounds, median (min-max) | {} | {} | kubeloop / Go |",
        SIDES[0].1, SIDES[1].1
    );
    out.push_str("|---|---|---|---|\n");
    for (title, key, scale, unit) in rows {
        // A measurement added later (`write_server_s`) is in no line of an older file.
        if results.lines().iter().all(|l| l.value(key).is_err()) {
            continue;
        }
        let mut medians = Vec::new();
        let mut cells = Vec::new();
        for (side, _) in SIDES {
            let mut samples = Samples::default();
            for line in results.lines() {
                if line.value("side")? == side {
                    samples.add(line.value(key)?).map_err(|e| line.error(e))?;
                }
            }
            let (Some(median), Some(min), Some(max)) =
                (samples.median(), samples.min(), samples.max())
            else {
                return Err(ReportError::MissingLine(format!("round of side {side}")));
            };
            medians.push(median);
            cells.push(format!(
                "{:.2} {unit} ({:.2}-{:.2})",
                median * scale,
                min * scale,
                max * scale
            ));
        }
        let _ = writeln!(
            out,
            "| {title} | {} | {} | {} |",
            cells[0],
            cells[1],
            ratio(medians[1], medians[0])
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const META: &str = "# foos: 300\n# settle: 3\n# clk_tck: 100\n# cores: 2\n# load: 1.00 0.90 0.80\n# date: 2026-11-29\n# commit: abc1234\n";

    #[test]
    fn each_row_is_the_median_of_a_sides_rounds_with_its_range_and_the_ratio() {
        let results = Results::parse(&format!(
            "{META}\
             round=1 side=go all_s=3.0 controller_cpu_ticks=360 peak_rss_kib=36864 plane_cpu_ticks=900 request_bytes=1048576 write_server_s=2.6\n\
             round=1 side=kubeloop all_s=1.5 controller_cpu_ticks=100 peak_rss_kib=20480 plane_cpu_ticks=600 request_bytes=524288 write_server_s=2.2\n\
             round=2 side=kubeloop all_s=1.2 controller_cpu_ticks=90 peak_rss_kib=18432 plane_cpu_ticks=500 request_bytes=524288 write_server_s=2.0\n\
             round=2 side=go all_s=2.0 controller_cpu_ticks=300 peak_rss_kib=34816 plane_cpu_ticks=800 request_bytes=1048576 write_server_s=2.4\n\
             round=3 side=go all_s=2.5 controller_cpu_ticks=330 peak_rss_kib=35840 plane_cpu_ticks=850 request_bytes=1048576 write_server_s=2.8\n\
             round=3 side=kubeloop all_s=1.0 controller_cpu_ticks=80 peak_rss_kib=19456 plane_cpu_ticks=550 request_bytes=524288 write_server_s=1.8\n"
        ));
        assert_eq!(
            render(&results).unwrap(),
            "Sample controller from a standing start over 300 Foos, 2 workers each, local control plane, 2026-11-29 at abc1234\n\
             (machine: 2 cores; load at the end: 1.00 0.90 0.80; figures until 3 s after the last Deployment)\n\n\
             | 3 rounds, median (min-max) | Go sample-controller | kubeloop | kubeloop / Go |\n\
             |---|---|---|---|\n\
             | all Deployments | 2.50 s (2.00-3.00) | 1.20 s (1.00-1.50) | 0.48x |\n\
             | apiserver time in its creates and status writes, per worker | 1.30 s (1.20-1.40) | 1.00 s (0.90-1.10) | 0.77x |\n\
             | controller CPU | 3.30 s (3.00-3.60) | 0.90 s (0.80-1.00) | 0.27x |\n\
             | controller peak RSS | 35.00 MiB (34.00-36.00) | 19.00 MiB (18.00-20.00) | 0.54x |\n\
             | control plane CPU | 8.50 s (8.00-9.00) | 5.50 s (5.00-6.00) | 0.65x |\n\
             | request bytes to the apiserver | 1024.00 KiB (1024.00-1024.00) | 512.00 KiB (512.00-512.00) | 0.50x |\n"
        );
    }

    #[test]
    fn a_results_file_from_before_the_write_time_has_no_such_row() {
        let results = Results::parse(&format!(
            "{META}\
             round=1 side=go all_s=3.0 controller_cpu_ticks=360 peak_rss_kib=36864 plane_cpu_ticks=900 request_bytes=1048576\n\
             round=1 side=kubeloop all_s=1.5 controller_cpu_ticks=100 peak_rss_kib=20480 plane_cpu_ticks=600 request_bytes=524288\n"
        ));
        let table = render(&results).unwrap();
        assert!(table.contains("| all Deployments | 3.00 s"), "{table}");
        assert!(!table.contains("apiserver time"), "{table}");
    }

    #[test]
    fn a_side_without_rounds_is_an_error_not_an_empty_cell() {
        let results = Results::parse(&format!(
            "{META}round=1 side=go all_s=3.0 controller_cpu_ticks=1 peak_rss_kib=1 plane_cpu_ticks=1 request_bytes=1\n"
        ));
        assert!(
            render(&results)
                .unwrap_err()
                .to_string()
                .contains("no round of side kubeloop"),
            "{:?}",
            render(&results)
        );
    }
}
