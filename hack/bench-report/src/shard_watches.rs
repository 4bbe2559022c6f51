//! The report of `hack/bench-shard-watches`: replicas that list and watch only the shards they
//! hold against one unsharded informer over the same ConfigMaps, and the takeover of a killed
//! replica's shards.
//!
//! Results: per round, `side=unsharded` (one line) and `side=replica identity=.. held=..` (one
//! per replica), each with `objects`, `synced_ms`, `cpu_ms`, `peak_rss_kib`, `rx_bytes`; and
//! `side=takeover identity=.. gained=.. objects=.. listed_ms=.. listed=..` for each survivor
//! that took over shards of the killed one (its `objects` counted after the takeover, `listed`
//! the objects its LISTs brought while taking over). Meta `objects`,
//! `namespaces`, `replicas`, `shards`, `bounds` (`balanced` or `even`; runs before it was
//! recorded used even ones), `cores`, `load`, `date`, `commit`.

use std::fmt::Write as _;

use crate::error::ReportError;
use crate::results::{Line, Results};
use crate::stats::{Samples, ratio};

/// Renders the report of `results`.
pub fn render(results: &Results) -> Result<String, ReportError> {
    let mut out = format!(
        "{} ConfigMaps of 1 KiB over {} namespaces: {} replicas on a ring of {} shards ({} bounds), each listing and watching only its shards (KEP-5866, gate on), against {}; local control plane, {}\n(machine: {} cores; load at the end: {})\n\n",
        results.meta("objects")?,
        results.meta("namespaces")?,
        results.meta("replicas")?,
        results.meta("shards")?,
        results.meta("bounds").unwrap_or("even"),
        match results.meta("unsharded") {
            Ok("controller") => "one unsharded replica of the same controller",
            _ => "one unsharded informer",
        },
        results.stamp()?,
        results.meta("cores")?,
        results.meta("load")?,
    );
    let side = |name: &'static str| move |line: &&Line| line.value("side").is_ok_and(|s| s == name);
    let unsharded: Vec<&Line> = results.lines().iter().filter(side("unsharded")).collect();
    let replicas: Vec<&Line> = results.lines().iter().filter(side("replica")).collect();
    let takeovers: Vec<&Line> = results.lines().iter().filter(side("takeover")).collect();
    let samples = |lines: &[&Line], key: &str| -> Result<Samples, ReportError> {
        let mut samples = Samples::default();
        for line in lines {
            samples.add(line.value(key)?).map_err(|e| line.error(e))?;
        }
        Ok(samples)
    };
    let _ = writeln!(
        out,
        "| median (min-max) | unsharded: {} rounds | a replica: {} of them | replica / unsharded, median | the largest replica / unsharded |",
        unsharded.len(),
        replicas.len()
    );
    out.push_str("|---|---|---|---|---|\n");
    // (row title, the results key, how a value is scaled for the table, its unit)
    let rows: [(&str, &str, f64, &str); 7] = [
        ("objects cached", "objects", 1.0, ""),
        ("time to synced", "synced_ms", 1e-3, " s"),
        ("CPU to synced", "cpu_ms", 1e-3, " s"),
        (
            "time to every key reconciled once",
            "reconciled_ms",
            1e-3,
            " s",
        ),
        (
            "CPU to every key reconciled once",
            "reconciled_cpu_ms",
            1e-3,
            " s",
        ),
        ("peak RSS", "peak_rss_kib", 1.0 / 1024.0, " MiB"),
        ("bytes read", "rx_bytes", 1.0 / 1048576.0, " MiB"),
    ];
    for (title, key, scale, unit) in rows {
        // Runs before 2026-11-30's second run recorded no reconciles.
        if key.starts_with("reconciled") && unsharded.iter().any(|l| l.value(key).is_err()) {
            continue;
        }
        let whole = samples(&unsharded, key)?;
        let each = samples(&replicas, key)?;
        let (Some(base), Some(median), Some(largest)) = (whole.median(), each.median(), each.max())
        else {
            return Err(ReportError::MissingLine("round of each side".into()));
        };
        let cell = |s: &Samples| {
            format!(
                "{:.2}{unit} ({:.2}-{:.2})",
                s.median().unwrap_or_default() * scale,
                s.min().unwrap_or_default() * scale,
                s.max().unwrap_or_default() * scale
            )
        };
        let _ = writeln!(
            out,
            "| {title} | {} | {} | {} | {} |",
            cell(&whole),
            cell(&each),
            ratio(median, base),
            ratio(largest, base)
        );
    }

    // A loss: the keys the survivors gained in its round (each one's objects after, less its
    // objects at synced in the same round), and per takeover how long it took from holding
    // the shards to caching them and the objects listed meanwhile.
    let mut moved_by_round = std::collections::BTreeMap::<String, f64>::new();
    let total = results.meta_number("objects")?;
    for line in &takeovers {
        let (round, identity) = (line.value("round")?, line.value("identity")?);
        let before = replicas
            .iter()
            .find(|r| {
                r.value("round").is_ok_and(|v| v == round)
                    && r.value("identity").is_ok_and(|v| v == identity)
            })
            .ok_or_else(|| line.error(format!("no replica line of {identity} in round {round}")))?;
        let gained = line.number("objects")? - before.number("objects")?;
        *moved_by_round.entry(round.to_string()).or_default() += gained / total;
    }
    let mut moved = Samples::default();
    for share in moved_by_round.values() {
        moved
            .add(&share.to_string())
            .expect("a number's text is a number");
    }
    let listed = samples(&takeovers, "listed_ms")?;
    let read = samples(&takeovers, "listed")?;
    let synced = samples(&unsharded, "synced_ms")?;
    let whole_read = samples(&unsharded, "objects")?;
    let (Some(listed_median), Some(read_median), Some(moved_max), Some(base), Some(read_base)) = (
        listed.median(),
        read.median(),
        moved.max(),
        synced.median(),
        whole_read.median(),
    ) else {
        return Err(ReportError::MissingLine("takeover".into()));
    };
    let _ = writeln!(
        out,
        "\nA replica killed (SIGKILL) in each of {} rounds: a loss moved {:.1}% of the keys at most (median {:.1}%), to {} takeovers. From holding the shards to caching their objects: {:.2} s median ({:.2}-{:.2}), {} of the unsharded sync time; objects listed meanwhile: {:.0} median ({:.0}-{:.0}), {} of the unsharded side's.",
        moved_by_round.len(),
        moved_max * 100.0,
        moved.median().unwrap_or_default() * 100.0,
        takeovers.len(),
        listed_median / 1e3,
        listed.min().unwrap_or_default() / 1e3,
        listed.max().unwrap_or_default() / 1e3,
        ratio(listed_median, base),
        read_median,
        read.min().unwrap_or_default(),
        read.max().unwrap_or_default(),
        ratio(read_median, read_base),
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const META: &str = "# objects: 1000\n# namespaces: 20\n# replicas: 2\n# shards: 2\n# cores: 2\n# load: 1.00 0.90 0.80\n# date: 2026-11-29\n# commit: abc1234\n";

    #[test]
    fn an_unsharded_controller_and_the_reconciles_get_their_rows() {
        let results = Results::parse(&format!(
            "# bounds: balanced\n# unsharded: controller\n{META}\
             round=1 side=unsharded objects=1000 synced_ms=2000 cpu_ms=1000 reconciled_ms=2500 reconciled_cpu_ms=1200 peak_rss_kib=102400 rx_bytes=10485760\n\
             round=1 side=replica identity=a held=0 objects=500 synced_ms=1000 cpu_ms=300 reconciled_ms=1100 reconciled_cpu_ms=330 peak_rss_kib=40960 rx_bytes=4194304\n\
             round=1 side=takeover identity=a gained=1 held=0,1 objects=1000 listed_ms=500 listed=500\n"
        ));
        let report = render(&results).unwrap();
        assert!(
            report.contains("a ring of 2 shards (balanced bounds)")
                && report.contains("against one unsharded replica of the same controller;"),
            "{report}"
        );
        assert!(
            report.contains("| time to every key reconciled once | 2.50 s (2.50-2.50) | 1.10 s (1.10-1.10) | 0.44x | 0.44x |\n\
                 | CPU to every key reconciled once | 1.20 s (1.20-1.20) | 0.33 s (0.33-0.33) | 0.28x | 0.28x |\n"),
            "{report}"
        );
    }

    #[test]
    fn replicas_against_the_unsharded_side_and_the_takeover() {
        let results = Results::parse(&format!(
            "{META}\
             round=1 side=unsharded objects=1000 synced_ms=2000 cpu_ms=1000 peak_rss_kib=102400 rx_bytes=10485760\n\
             round=1 side=replica identity=a held=0 objects=400 synced_ms=1000 cpu_ms=300 peak_rss_kib=40960 rx_bytes=4194304\n\
             round=1 side=replica identity=b held=1 objects=600 synced_ms=1200 cpu_ms=400 peak_rss_kib=51200 rx_bytes=6291456\n\
             round=1 side=takeover identity=b gained=0 held=0,1 objects=1000 listed_ms=500 listed=200\n"
        ));
        assert_eq!(
            render(&results).unwrap(),
            "1000 ConfigMaps of 1 KiB over 20 namespaces: 2 replicas on a ring of 2 shards (even bounds), each listing and watching only its shards (KEP-5866, gate on), against one unsharded informer; local control plane, 2026-11-29 at abc1234\n\
             (machine: 2 cores; load at the end: 1.00 0.90 0.80)\n\n\
             | median (min-max) | unsharded: 1 rounds | a replica: 2 of them | replica / unsharded, median | the largest replica / unsharded |\n\
             |---|---|---|---|---|\n\
             | objects cached | 1000.00 (1000.00-1000.00) | 400.00 (400.00-600.00) | 0.40x | 0.60x |\n\
             | time to synced | 2.00 s (2.00-2.00) | 1.00 s (1.00-1.20) | 0.50x | 0.60x |\n\
             | CPU to synced | 1.00 s (1.00-1.00) | 0.30 s (0.30-0.40) | 0.30x | 0.40x |\n\
             | peak RSS | 100.00 MiB (100.00-100.00) | 40.00 MiB (40.00-50.00) | 0.40x | 0.50x |\n\
             | bytes read | 10.00 MiB (10.00-10.00) | 4.00 MiB (4.00-6.00) | 0.40x | 0.60x |\n\
             \nA replica killed (SIGKILL) in each of 1 rounds: a loss moved 40.0% of the keys at most (median 40.0%), to 1 takeovers. From holding the shards to caching their objects: 0.50 s median (0.50-0.50), 0.25x of the unsharded sync time; objects listed meanwhile: 200 median (200-200), 0.20x of the unsharded side's.\n"
        );
    }

    #[test]
    fn a_takeover_without_its_replica_line_is_an_error() {
        let results = Results::parse(&format!(
            "{META}\
             round=1 side=unsharded objects=1 synced_ms=1 cpu_ms=1 peak_rss_kib=1 rx_bytes=1\n\
             round=1 side=replica identity=a held=0 objects=1 synced_ms=1 cpu_ms=1 peak_rss_kib=1 rx_bytes=1\n\
             round=1 side=takeover identity=b gained=1 held=0,1 objects=1 listed_ms=1 listed=1\n"
        ));
        let err = render(&results).unwrap_err().to_string();
        assert!(err.contains("no replica line of b in round 1"), "{err}");
    }
}
