//! The report of `hack/bench-vs-client-go`: client-go's workqueue against kubeloop's, one table
//! per kubeloop key type (ops/s per workload, client-go's and kubeloop's, and the ratio), the
//! items the dedup workload handed out per side, the floor of one lock and one lookup; then
//! kubeloop's priority queue against controller-runtime's.
//!
//! Results: `<label> <workload> <value>` lines as the programs print them, Go's relabelled by
//! the script: `GO`, `GO_HANDED_OUT`, `GO_PQ`, `GO_PQ_HANDED_OUT`, and kubeloop's `RESULT*`,
//! `HANDED_OUT*` and `FLOOR*` (ns) per key type; meta `client-go`, `controller-runtime`,
//! `rounds`, `date`, `commit`.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::error::ReportError;
use crate::results::Results;
use crate::stats::Samples;

/// Which round of each workload and side a table reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stat {
    /// The (lower) median round.
    Median,
    /// The least disturbed round: the most ops/s, the lowest floor.
    Best,
}

impl Stat {
    /// `median`, `best` or `both` (two sets of tables, medians first).
    pub fn parse_list(text: &str) -> Result<Vec<Stat>, ReportError> {
        match text {
            "median" => Ok(vec![Stat::Median]),
            "best" => Ok(vec![Stat::Best]),
            "both" => Ok(vec![Stat::Median, Stat::Best]),
            other => Err(ReportError::Usage(format!(
                "--stat must be median, best or both, got `{other}`"
            ))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Stat::Median => "median",
            Stat::Best => "best",
        }
    }

    /// The reported ops/s.
    fn pick(self, samples: &Samples) -> Option<f64> {
        match self {
            Stat::Median => samples.median(),
            Stat::Best => samples.max(),
        }
    }

    /// The reported floor, in ns: lower is less disturbed.
    fn pick_floor(self, samples: &Samples) -> Option<f64> {
        match self {
            Stat::Median => samples.median(),
            Stat::Best => samples.min(),
        }
    }
}

/// One of kubeloop's key types: the table's title and its lines' labels.
struct KeyType {
    title: &'static str,
    result: &'static str,
    handed_out: &'static str,
    floor: &'static str,
}

const KEY_TYPES: [KeyType; 4] = [
    KeyType {
        title: "kubeloop with ObjectKey keys, as its controller runtime queues them (Go: string keys)",
        result: "RESULT_KEY",
        handed_out: "HANDED_OUT_KEY",
        floor: "FLOOR_KEY",
    },
    KeyType {
        title: "kubeloop with String keys (Go: string keys)",
        result: "RESULT_STRING",
        handed_out: "HANDED_OUT_STRING",
        floor: "FLOOR_STRING",
    },
    KeyType {
        title: "kubeloop with Arc<str> keys (Go: string keys)",
        result: "RESULT_ARC",
        handed_out: "HANDED_OUT_ARC",
        floor: "FLOOR_ARC",
    },
    KeyType {
        title: "kubeloop with &'static str keys (Go: string keys)",
        result: "RESULT",
        handed_out: "HANDED_OUT",
        floor: "FLOOR",
    },
];

/// The single-item round the floor is compared with.
const FLOOR_WORKLOAD: &str = "single/add-get-done";

/// The samples of one run, by label and workload, and the workloads in the order first seen.
#[derive(Default)]
struct Run {
    samples: HashMap<(String, String), Samples>,
    /// Client-go's workloads (`GO` lines): the rows of the key-type tables.
    workloads: Vec<String>,
    /// controller-runtime's workloads (`GO_PQ` lines): the rows of the priority-queue table.
    pq_workloads: Vec<String>,
    /// The workloads with handed-out counts, for the key-type tables.
    handed_out: Vec<String>,
    /// The workloads with handed-out counts, for the priority-queue table.
    pq_handed_out: Vec<String>,
}

impl Run {
    fn read(results: &Results) -> Result<Self, ReportError> {
        let mut run = Run::default();
        for line in results.lines() {
            let [label, workload, value] = line.fields.as_slice() else {
                return Err(line.error("expected `<label> <workload> <value>`".into()));
            };
            let order = match label.as_str() {
                "GO" => Some(&mut run.workloads),
                "GO_PQ" => Some(&mut run.pq_workloads),
                "GO_PQ_HANDED_OUT" | "HANDED_OUT_PQ_KEY" => Some(&mut run.pq_handed_out),
                l if l.contains("HANDED_OUT") => Some(&mut run.handed_out),
                _ => None,
            };
            if let Some(order) = order
                && !order.contains(workload)
            {
                order.push(workload.clone());
            }
            // A floor line's second field names what was measured (`lock+lookup`), the same on
            // every line: the floor of a key type is every round's.
            let workload = if label.starts_with("FLOOR") {
                String::new()
            } else {
                workload.clone()
            };
            run.samples
                .entry((label.clone(), workload))
                .or_default()
                .add(value)
                .map_err(|e| line.error(e))?;
        }
        Ok(run)
    }

    fn get(&self, label: &str, workload: &str) -> Option<&Samples> {
        self.samples.get(&(label.to_owned(), workload.to_owned()))
    }

    fn spread(&self, label: &str, workload: &str) -> String {
        self.get(label, workload)
            .map_or_else(|| "missing".to_owned(), Samples::spread)
    }

    /// A key type's floor: one sample per round, in ns.
    fn floor(&self, label: &str) -> Option<&Samples> {
        self.get(label, "")
    }
}

/// Renders the report of `results` with one set of tables per stat.
pub fn render(results: &Results, stats: &[Stat]) -> Result<String, ReportError> {
    let run = Run::read(results)?;
    let rounds = results.meta("rounds")?;
    let mut out = format!(
        "client-go {} vs kubeloop: {rounds} alternating rounds, same machine, same run, {}\n",
        results.meta("client-go")?,
        results.stamp()?,
    );
    for &stat in stats {
        for key_type in &KEY_TYPES {
            key_type_table(&mut out, &run, key_type, stat, rounds);
        }
        if !run.pq_workloads.is_empty() {
            pq_table(
                &mut out,
                &run,
                results.meta("controller-runtime")?,
                stat,
                rounds,
            );
        }
    }
    Ok(out)
}

fn key_type_table(out: &mut String, run: &Run, key_type: &KeyType, stat: Stat, rounds: &str) {
    let _ = writeln!(
        out,
        "\n{}, {} of {rounds} rounds",
        key_type.title,
        stat.name()
    );
    let _ = writeln!(
        out,
        "| {:<42} | {:>15} | {:>15} | {:>6} |",
        "workload", "client-go ops/s", "kubeloop ops/s", "ratio"
    );
    out.push_str("|--------------------------------------------|-----------------|-----------------|--------|\n");
    for workload in &run.workloads {
        rate_row(out, run, 42, ("GO", key_type.result), workload, stat);
    }
    for workload in &run.handed_out {
        let _ = writeln!(
            out,
            "{workload}: items handed out to workers per run: client-go {}, kubeloop {}",
            run.spread("GO_HANDED_OUT", workload),
            run.spread(key_type.handed_out, workload)
        );
    }
    let floor = run.floor(key_type.floor).and_then(|s| stat.pick_floor(s));
    let single = run
        .get(key_type.result, FLOOR_WORKLOAD)
        .and_then(|s| stat.pick(s));
    if let (Some(floor), Some(ops)) = (floor, single) {
        let ns = 1e9 / ops;
        let _ = writeln!(
            out,
            "floor (one uncontended parking_lot lock/unlock + one hashbrown lookup, these keys): {floor:.1} ns; {FLOOR_WORKLOAD}: {ns:.1} ns a round = {:.1}x the floor",
            ns / floor
        );
    }
}

fn pq_table(out: &mut String, run: &Run, controller_runtime: &str, stat: Stat, rounds: &str) {
    let _ = writeln!(
        out,
        "\nkubeloop PriorityQueue<ObjectKey> vs controller-runtime {controller_runtime} priorityqueue (Go: reconcile.Request-shaped keys), {} of {rounds} rounds",
        stat.name()
    );
    let _ = writeln!(
        out,
        "| {:<44} | {:>15} | {:>15} | {:>6} |",
        "workload", "c-r ops/s", "kubeloop ops/s", "ratio"
    );
    out.push_str("|----------------------------------------------|-----------------|-----------------|--------|\n");
    for workload in &run.pq_workloads {
        rate_row(out, run, 44, ("GO_PQ", "RESULT_PQ_KEY"), workload, stat);
    }
    for workload in &run.pq_handed_out {
        let _ = writeln!(
            out,
            "{workload}: items handed out to workers per run: controller-runtime {}, kubeloop {}",
            run.spread("GO_PQ_HANDED_OUT", workload),
            run.spread("HANDED_OUT_PQ_KEY", workload)
        );
    }
}

/// `| workload | Go ops/s | kubeloop ops/s | ratio |`, or `missing` where kubeloop has none.
fn rate_row(
    out: &mut String,
    run: &Run,
    width: usize,
    (go_label, kubeloop_label): (&str, &str),
    workload: &str,
    stat: Stat,
) {
    let go = run
        .get(go_label, workload)
        .and_then(|s| stat.pick(s))
        .unwrap_or(0.0);
    match run.get(kubeloop_label, workload).and_then(|s| stat.pick(s)) {
        Some(kubeloop) => {
            let _ = writeln!(
                out,
                "| {workload:<width$} | {go:15.0} | {kubeloop:15.0} | {:5.2}x |",
                kubeloop / go
            );
        }
        None => {
            let _ = writeln!(
                out,
                "| {workload:<width$} | {go:15.0} | {:>15} | {:>6} |",
                "missing", "-"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two rounds of a run with ObjectKey and `&'static str` keys only (the other key types'
    /// lines are missing), and one priority-queue workload.
    const RESULTS: &str = "\
# client-go: v0.36.3
# controller-runtime: v0.23.1
# rounds: 2
# date: 2026-11-26
# commit: abc1234
GO single/add-get-done 2000000
GO dedup/4x4-100-keys 3000000
GO_HANDED_OUT dedup/4x4-100-keys 240000
GO_PQ pq/priority-mix 500000
GO_PQ_HANDED_OUT pq/priority-mix 9700
RESULT_KEY single/add-get-done 8000000
RESULT_KEY dedup/4x4-100-keys 4500000
HANDED_OUT_KEY dedup/4x4-100-keys 200000
FLOOR_KEY lock+lookup 24.0
RESULT single/add-get-done 9000000
RESULT_PQ_KEY pq/priority-mix 1500000
HANDED_OUT_PQ_KEY pq/priority-mix 9400
GO single/add-get-done 2500000
GO dedup/4x4-100-keys 2000000
GO_HANDED_OUT dedup/4x4-100-keys 260000
GO_PQ pq/priority-mix 600000
GO_PQ_HANDED_OUT pq/priority-mix 9900
RESULT_KEY single/add-get-done 7000000
RESULT_KEY dedup/4x4-100-keys 5500000
HANDED_OUT_KEY dedup/4x4-100-keys 210000
FLOOR_KEY lock+lookup 22.0
RESULT single/add-get-done 9500000
RESULT_PQ_KEY pq/priority-mix 1600000
HANDED_OUT_PQ_KEY pq/priority-mix 9300
";

    #[test]
    fn one_table_per_key_type_with_the_median_round_and_missing_sides_named() {
        let report = render(&Results::parse(RESULTS), &[Stat::Median]).unwrap();
        let expected = "\
client-go v0.36.3 vs kubeloop: 2 alternating rounds, same machine, same run, 2026-11-26 at abc1234

kubeloop with ObjectKey keys, as its controller runtime queues them (Go: string keys), median of 2 rounds
| workload                                   | client-go ops/s |  kubeloop ops/s |  ratio |
|--------------------------------------------|-----------------|-----------------|--------|
| single/add-get-done                        |         2000000 |         7000000 |  3.50x |
| dedup/4x4-100-keys                         |         2000000 |         4500000 |  2.25x |
dedup/4x4-100-keys: items handed out to workers per run: client-go 240000-260000 (median 240000), kubeloop 200000-210000 (median 200000)
floor (one uncontended parking_lot lock/unlock + one hashbrown lookup, these keys): 22.0 ns; single/add-get-done: 142.9 ns a round = 6.5x the floor

kubeloop with String keys (Go: string keys), median of 2 rounds
| workload                                   | client-go ops/s |  kubeloop ops/s |  ratio |
|--------------------------------------------|-----------------|-----------------|--------|
| single/add-get-done                        |         2000000 |         missing |      - |
| dedup/4x4-100-keys                         |         2000000 |         missing |      - |
dedup/4x4-100-keys: items handed out to workers per run: client-go 240000-260000 (median 240000), kubeloop missing

kubeloop with Arc<str> keys (Go: string keys), median of 2 rounds
| workload                                   | client-go ops/s |  kubeloop ops/s |  ratio |
|--------------------------------------------|-----------------|-----------------|--------|
| single/add-get-done                        |         2000000 |         missing |      - |
| dedup/4x4-100-keys                         |         2000000 |         missing |      - |
dedup/4x4-100-keys: items handed out to workers per run: client-go 240000-260000 (median 240000), kubeloop missing

kubeloop with &'static str keys (Go: string keys), median of 2 rounds
| workload                                   | client-go ops/s |  kubeloop ops/s |  ratio |
|--------------------------------------------|-----------------|-----------------|--------|
| single/add-get-done                        |         2000000 |         9000000 |  4.50x |
| dedup/4x4-100-keys                         |         2000000 |         missing |      - |
dedup/4x4-100-keys: items handed out to workers per run: client-go 240000-260000 (median 240000), kubeloop missing

kubeloop PriorityQueue<ObjectKey> vs controller-runtime v0.23.1 priorityqueue (Go: reconcile.Request-shaped keys), median of 2 rounds
| workload                                     |       c-r ops/s |  kubeloop ops/s |  ratio |
|----------------------------------------------|-----------------|-----------------|--------|
| pq/priority-mix                              |          500000 |         1500000 |  3.00x |
pq/priority-mix: items handed out to workers per run: controller-runtime 9700-9900 (median 9700), kubeloop 9300-9400 (median 9300)
";
        assert_eq!(report, expected);
    }

    #[test]
    fn the_best_round_is_the_most_ops_and_the_lowest_floor() {
        let report = render(&Results::parse(RESULTS), &[Stat::Best]).unwrap();
        assert!(report.contains("| single/add-get-done                        |         2500000 |         8000000 |  3.20x |"), "{report}");
        assert!(report.contains("\nfloor (one uncontended parking_lot lock/unlock + one hashbrown lookup, these keys): 22.0 ns; single/add-get-done: 125.0 ns a round = 5.7x the floor\n"), "{report}");
    }

    #[test]
    fn both_stats_give_the_median_tables_then_the_best() {
        let report = render(&Results::parse(RESULTS), &Stat::parse_list("both").unwrap()).unwrap();
        let median = report.find("median of 2 rounds").unwrap();
        let best = report.find("best of 2 rounds").unwrap();
        assert!(median < best);
        assert_eq!(report.matches("priorityqueue").count(), 2);
    }
}
