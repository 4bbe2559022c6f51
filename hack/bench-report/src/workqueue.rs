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
