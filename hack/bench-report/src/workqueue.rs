//! The report of `hack/bench-vs-client-go`: client-go's workqueue against kubeloop's, one table
//! per kubeloop key type; kubeloop's priority queue against controller-runtime's; and the
//! fairness table (controller-runtime's priority queue, which has no fairness, against
//! kubeloop's without and with it).
//!
//! Every row is a fixed amount of work, and every cell a wall time: the median over the
//! rounds with the spread (min-max) beside it; the ratio is the ratio of the two medians,
//! Go's over kubeloop's (above 1: kubeloop is faster). Each side says what work it did (adds
//! and items handed out) on every line; a row whose two sides did not do the same work in
//! every round gets no ratio, and says so under its table.
//!
//! Results: `<label> <workload> ms=<wall> adds=<n> handed_out=<n>` lines as the programs print
//! them: Go's `GO` (client-go), `GO_PQ` (controller-runtime), `GO_FAIR` (controller-runtime on
//! the fairness workloads), kubeloop's `RESULT*` per key type, `RESULT_PQ_KEY`,
//! `RESULT_FAIR_OFF` and `RESULT_FAIR_ON`; and `FLOOR* lock+lookup ns=<ns>` per key type.
//! Meta: `client-go`, `controller-runtime`, `rounds`, `date`, `commit`, and if present
//! `uncommitted` (files that differed from the commit when the bench was built), `load before`
//! and `load after`.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use crate::chart::{Bar, Figure, Group, Panel, Scale};
use crate::error::ReportError;
use crate::results::Results;
use crate::stats::Samples;

/// One of kubeloop's key types: the table's title and its lines' labels.
struct KeyType {
    title: &'static str,
    result: &'static str,
    floor: &'static str,
    /// Its chart's file is `vs-client-go-<slug>.svg`.
    slug: &'static str,
    /// Whether the table has the `named/...` rows (run with this key type only).
    named_rows: bool,
}

const KEY_TYPES: [KeyType; 4] = [
    KeyType {
        title: "kubeloop with ObjectKey keys, as its controller runtime queues them (Go: string keys)",
        result: "RESULT_KEY",
        slug: "objectkey",
        floor: "FLOOR_KEY",
        named_rows: true,
    },
    KeyType {
        title: "kubeloop with String keys (Go: string keys)",
        result: "RESULT_STRING",
        slug: "string",
        floor: "FLOOR_STRING",
        named_rows: false,
    },
    KeyType {
        title: "kubeloop with Arc<str> keys (Go: string keys)",
        result: "RESULT_ARC",
        slug: "arc",
        floor: "FLOOR_ARC",
        named_rows: false,
    },
    KeyType {
        title: "kubeloop with &'static str keys (Go: string keys)",
        result: "RESULT",
        slug: "static",
        floor: "FLOOR",
        named_rows: false,
    },
];

/// The single-item round the floor is compared with.
const FLOOR_WORKLOAD: &str = "single/add-get-done";

/// The work one line says it did: adds made, items handed out.
type Counts = (u64, u64);

/// The samples of one run, by label and workload, and the workloads in the order first seen.
#[derive(Default)]
struct Run {
    /// Wall times in ms (floors: ns, under the workload "").
    samples: HashMap<(String, String), Samples>,
    /// The distinct (adds, handed out) a label's lines gave for a workload.
    counts: HashMap<(String, String), BTreeSet<Counts>>,
    /// Client-go's workloads (`GO` lines): the rows of the key-type tables.
    workloads: Vec<String>,
    /// controller-runtime's workloads (`GO_PQ` lines): the rows of the priority-queue table.
    pq_workloads: Vec<String>,
    /// controller-runtime's fairness workloads (`GO_FAIR`): the rows of the fairness table.
    fair_workloads: Vec<String>,
}

impl Run {
    fn read(results: &Results) -> Result<Self, ReportError> {
        let mut run = Run::default();
        for line in results.lines() {
            let (Some(label), Some(workload)) = (line.fields.first(), line.fields.get(1)) else {
                return Err(line.error("expected `<label> <workload> key=value...`".into()));
            };
            if label.starts_with("FLOOR") {
                // The second field names what was measured (`lock+lookup`), the same on every
                // line: the floor of a key type is every round's.
                run.add(line, label, "", line.value("ns")?)?;
                continue;
            }
            let order = match label.as_str() {
                "GO" => Some(&mut run.workloads),
                "GO_PQ" => Some(&mut run.pq_workloads),
                "GO_FAIR" => Some(&mut run.fair_workloads),
                _ => None,
            };
            if let Some(order) = order
                && !order.contains(workload)
            {
                order.push(workload.clone());
            }
            run.add(line, label, workload, line.value("ms")?)?;
            let counts = (
                line.number("adds")? as u64,
                line.number("handed_out")? as u64,
            );
            run.counts
                .entry((label.clone(), workload.clone()))
                .or_default()
                .insert(counts);
        }
        Ok(run)
    }

    fn add(
        &mut self,
        line: &crate::results::Line,
        label: &str,
        workload: &str,
        value: &str,
    ) -> Result<(), ReportError> {
        self.samples
            .entry((label.to_owned(), workload.to_owned()))
            .or_default()
            .add(value)
            .map_err(|e| line.error(e))
    }

    fn get(&self, label: &str, workload: &str) -> Option<&Samples> {
        self.samples.get(&(label.to_owned(), workload.to_owned()))
    }

    fn counts(&self, label: &str, workload: &str) -> Option<&BTreeSet<Counts>> {
        self.counts.get(&(label.to_owned(), workload.to_owned()))
    }

    /// The work both labels did on `workload`, when every line of both said the same.
    fn same_work(&self, labels: &[&str], workload: &str) -> Option<Counts> {
        let mut all = BTreeSet::new();
        for label in labels {
            all.extend(self.counts(label, workload)?);
        }
        (all.len() == 1).then(|| *all.first().unwrap())
    }

    /// `adds / handed out` of one label's lines: `400000 / 100`, or every distinct pair.
    fn counts_text(&self, label: &str, workload: &str) -> String {
        match self.counts(label, workload) {
            None => "missing".to_owned(),
            Some(set) => set
                .iter()
                .map(|(adds, handed_out)| format!("{adds} / {handed_out}"))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

/// Renders the report of `results`.
pub fn render(results: &Results) -> Result<String, ReportError> {
    let run = Run::read(results)?;
    let rounds = results.meta("rounds")?;
    let mut out = format!(
        "client-go {} vs kubeloop: {rounds} alternating rounds, same machine, same run, {}\n",
        results.meta("client-go")?,
        results.stamp()?,
    );
    if let Ok(files) = results.meta("uncommitted")
        && !files.is_empty()
    {
        let _ = writeln!(
            out,
            "Built from that commit with uncommitted changes to: {files}"
        );
    }
    if let (Ok(before), Ok(after)) = (results.meta("load before"), results.meta("load after")) {
        let _ = writeln!(
            out,
            "Load average (1, 5, 15 min) before: {before}; after: {after}"
        );
    }
    out.push_str(
        "Cells: wall time in ms for the row's fixed work, median (min-max) over the rounds; \
         ratio: Go's median / kubeloop's (above 1: kubeloop is faster).\n",
    );
    for key_type in &KEY_TYPES {
        key_type_table(&mut out, &run, key_type);
    }
    if !run.pq_workloads.is_empty() || !run.fair_workloads.is_empty() {
        let controller_runtime = results.meta("controller-runtime")?;
        if !run.pq_workloads.is_empty() {
            pq_table(&mut out, &run, controller_runtime);
        }
        if !run.fair_workloads.is_empty() {
            fair_table(&mut out, &run, controller_runtime);
        }
    }
    Ok(out)
}

/// How wide the workload column is at least (wider for a longer name).
const WORKLOAD: usize = 46;
/// How wide a time cell is.
const CELL: usize = 22;

fn key_type_table(out: &mut String, run: &Run, key_type: &KeyType) {
    let _ = writeln!(out, "\n{}", key_type.title);
    let workloads: Vec<&String> = run
        .workloads
        .iter()
        .filter(|w| key_type.named_rows || !w.starts_with("named/"))
        .collect();
    comparison_table(
        out,
        run,
        ("client-go ms", "GO"),
        ("kubeloop ms", key_type.result),
        &workloads,
    );
    let floor = run.get(key_type.floor, "").and_then(Samples::median);
    let single = run.get(key_type.result, FLOOR_WORKLOAD).and_then(|s| {
        let (adds, _) = *run.counts(key_type.result, FLOOR_WORKLOAD)?.first()?;
        Some(s.median()? * 1e6 / adds as f64)
    });
    if let (Some(floor), Some(ns)) = (floor, single) {
        let _ = writeln!(
            out,
            "floor (one uncontended parking_lot lock/unlock + one hashbrown lookup, these keys), median: {floor:.1} ns; {FLOOR_WORKLOAD}: {ns:.1} ns a round = {:.1}x the floor",
            ns / floor
        );
    }
}

fn pq_table(out: &mut String, run: &Run, controller_runtime: &str) {
    let _ = writeln!(
        out,
        "\nkubeloop PriorityQueue<ObjectKey> vs controller-runtime {controller_runtime} priorityqueue (Go: reconcile.Request-shaped keys)"
    );
    let workloads: Vec<&String> = run.pq_workloads.iter().collect();
    comparison_table(
        out,
        run,
        ("c-r ms", "GO_PQ"),
        ("kubeloop ms", "RESULT_PQ_KEY"),
        &workloads,
    );
}

/// `| workload | Go | kubeloop | ratio | adds / handed out |`, then a line for each row whose
/// sides did different work, and the counts of the dedup rows.
fn comparison_table(
    out: &mut String,
    run: &Run,
    (go_title, go): (&str, &str),
    (kubeloop_title, kubeloop): (&str, &str),
    workloads: &[&String],
) {
    let width = workload_width(workloads.iter().copied());
    let _ = writeln!(
        out,
        "| {:<width$} | {go_title:>CELL$} | {kubeloop_title:>CELL$} | {:>6} | {:>17} |",
        "workload", "ratio", "adds / handed out"
    );
    let _ = writeln!(
        out,
        "|{}|{}|{}|--------|-------------------|",
        "-".repeat(width + 2),
        "-".repeat(CELL + 2),
        "-".repeat(CELL + 2)
    );
    let mut notes = Vec::new();
    for workload in workloads {
        let go_samples = run.get(go, workload);
        let kubeloop_samples = run.get(kubeloop, workload);
        let same = run.same_work(&[go, kubeloop], workload);
        let (ratio, work) = match (go_samples, kubeloop_samples, same) {
            (Some(g), Some(k), Some((adds, handed_out))) => {
                (ratio_of_medians(g, k), format!("{adds} / {handed_out}"))
            }
            (Some(_), Some(_), None) => {
                notes.push(format!(
                    "{workload}: the sides did different work (adds / handed out per run: {} {}, {} {}): no ratio",
                    side_name(go),
                    run.counts_text(go, workload),
                    side_name(kubeloop),
                    run.counts_text(kubeloop, workload)
                ));
                ("-".to_owned(), "differ".to_owned())
            }
            _ => ("-".to_owned(), "-".to_owned()),
        };
        let _ = writeln!(
            out,
            "| {workload:<width$} | {:>CELL$} | {:>CELL$} | {ratio:>6} | {work:>17} |",
            time_cell(go_samples),
            time_cell(kubeloop_samples),
        );
    }
    for note in notes {
        let _ = writeln!(out, "{note}");
    }
    for workload in workloads.iter().filter(|w| w.contains("dedup/")) {
        let _ = writeln!(
            out,
            "{workload}: adds / items handed out per run: {} {}, {} {}",
            side_name(go),
            run.counts_text(go, workload),
            side_name(kubeloop),
            run.counts_text(kubeloop, workload)
        );
    }
}

fn fair_table(out: &mut String, run: &Run, controller_runtime: &str) {
    const SIDES: [&str; 3] = ["GO_FAIR", "RESULT_FAIR_OFF", "RESULT_FAIR_ON"];
    let _ = writeln!(
        out,
        "\nfairness: keys over 100 namespaces; controller-runtime {controller_runtime} priorityqueue (no fairness) vs kubeloop PriorityQueue<ObjectKey> without and with namespace fairness"
    );
    let width = workload_width(run.fair_workloads.iter());
    let _ = writeln!(
        out,
        "| {:<width$} | {:>CELL$} | {:>CELL$} | {:>CELL$} | {:>10} | {:>10} | {:>12} | {:>17} |",
        "workload",
        "c-r ms",
        "kubeloop unfair ms",
        "kubeloop fair ms",
        "c-r/unfair",
        "c-r/fair",
        "fair/unfair",
        "adds / handed out"
    );
    let _ = writeln!(
        out,
        "|{}|{}|{}|{}|------------|------------|--------------|-------------------|",
        "-".repeat(width + 2),
        "-".repeat(CELL + 2),
        "-".repeat(CELL + 2),
        "-".repeat(CELL + 2)
    );
    let mut notes = Vec::new();
    for workload in &run.fair_workloads {
        let [cr, unfair, fair] = SIDES.map(|label| run.get(label, workload));
        let same = run.same_work(&SIDES, workload);
        let ratio = |a: Option<&Samples>, b: Option<&Samples>| match (a, b, same) {
            (Some(a), Some(b), Some(_)) => ratio_of_medians(a, b),
            _ => "-".to_owned(),
        };
        let work = match same {
            Some((adds, handed_out)) => format!("{adds} / {handed_out}"),
            None if cr.is_some() && unfair.is_some() && fair.is_some() => {
                notes.push(format!(
                    "{workload}: the sides did different work (adds / handed out per run: controller-runtime {}, kubeloop unfair {}, kubeloop fair {}): no ratio",
                    run.counts_text(SIDES[0], workload),
                    run.counts_text(SIDES[1], workload),
                    run.counts_text(SIDES[2], workload)
                ));
                "differ".to_owned()
            }
            None => "-".to_owned(),
        };
        let _ = writeln!(
            out,
            "| {workload:<width$} | {:>CELL$} | {:>CELL$} | {:>CELL$} | {:>10} | {:>10} | {:>12} | {work:>17} |",
            time_cell(cr),
            time_cell(unfair),
            time_cell(fair),
            ratio(cr, unfair),
            ratio(cr, fair),
            ratio(fair, unfair),
        );
    }
    for note in notes {
        let _ = writeln!(out, "{note}");
    }
    if let Some(workload) = run.fair_workloads.first() {
        let [cr, unfair, fair] =
            SIDES.map(|label| run.get(label, workload).map_or(0, Samples::len));
        let _ = writeln!(
            out,
            "runs a cell: controller-runtime {cr}, kubeloop unfair {unfair}, kubeloop fair {fair} (the two kubeloop sides interleaved in each round)"
        );
    }
    let _ = writeln!(
        out,
        "c-r/unfair and c-r/fair: controller-runtime's median / kubeloop's (above 1: kubeloop is faster); fair/unfair: the cost of fairness (above 1: fairness is slower)"
    );
}

/// The workload column's width: [`WORKLOAD`], or the longest name's.
fn workload_width<'a>(workloads: impl Iterator<Item = &'a String>) -> usize {
    workloads.map(String::len).fold(WORKLOAD, usize::max)
}

/// Who a label is, in the notes under a table.
fn side_name(label: &str) -> &'static str {
    match label {
        "GO" => "client-go",
        "GO_PQ" | "GO_FAIR" => "controller-runtime",
        _ => "kubeloop",
    }
}

/// `median (min-max)` in ms, or `missing`.
fn time_cell(samples: Option<&Samples>) -> String {
    match samples.and_then(|s| Some((s.median()?, s.min()?, s.max()?))) {
        Some((median, min, max)) => format!("{} ({}-{})", ms(median), ms(min), ms(max)),
        None => "missing".to_owned(),
    }
}

/// A wall time in ms with three significant figures or more: `1234`, `123`, `12.3`, `1.23`.
fn ms(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// `a`'s median over `b`'s, as `2.15x`.
fn ratio_of_medians(a: &Samples, b: &Samples) -> String {
    match (a.median(), b.median()) {
        (Some(a), Some(b)) => crate::stats::ratio(a, b),
        _ => "-".to_owned(),
    }
}

/// One chart per table, each row its ratio of medians (log axis, 1x marked) with a whisker
/// over the rounds' extremes; a row the table gives no ratio keeps its label and says why.
pub fn charts(results: &Results) -> Result<Vec<(String, Figure)>, ReportError> {
    let run = Run::read(results)?;
    let stamp = format!(
        "{}; {} alternating rounds",
        results.stamp()?,
        results.meta("rounds")?
    );
    let whisker = "whisker: the Go side's fastest round over kubeloop's slowest to its slowest over kubeloop's fastest";
    let mut charts = Vec::new();
    for key_type in &KEY_TYPES {
        let workloads: Vec<&String> = run
            .workloads
            .iter()
            .filter(|w| key_type.named_rows || !w.starts_with("named/"))
            .collect();
        charts.push((
            format!("vs-client-go-{}.svg", key_type.slug),
            Figure {
                title: format!("client-go {} against {}", results.meta("client-go")?, key_type.title),
                notes: vec![
                    stamp.clone(),
                    format!("bar: client-go's median / kubeloop's (right of 1x: kubeloop is faster); {whisker}"),
                ],
                panels: vec![ratio_panel(
                    &run,
                    "client-go / kubeloop",
                    &workloads,
                    &[("GO", key_type.result, "client-go / kubeloop")],
                )],
            },
        ));
    }
    if !run.pq_workloads.is_empty() || !run.fair_workloads.is_empty() {
        let controller_runtime = results.meta("controller-runtime")?;
        if !run.pq_workloads.is_empty() {
            let workloads: Vec<&String> = run.pq_workloads.iter().collect();
            charts.push((
                "vs-client-go-pq.svg".to_owned(),
                Figure {
                    title: format!("controller-runtime {controller_runtime} priorityqueue against kubeloop PriorityQueue<ObjectKey>"),
                    notes: vec![
                        stamp.clone(),
                        format!("bar: controller-runtime's median / kubeloop's (right of 1x: kubeloop is faster); {whisker}"),
                    ],
                    panels: vec![ratio_panel(
                        &run,
                        "controller-runtime / kubeloop",
                        &workloads,
                        &[("GO_PQ", "RESULT_PQ_KEY", "controller-runtime / kubeloop")],
                    )],
                },
            ));
        }
        if !run.fair_workloads.is_empty() {
            let workloads: Vec<&String> = run.fair_workloads.iter().collect();
            charts.push((
                "vs-client-go-fair.svg".to_owned(),
                Figure {
                    title: format!("Fairness: controller-runtime {controller_runtime} priorityqueue (no fairness) against kubeloop without and with namespace fairness"),
                    notes: vec![
                        stamp,
                        "c-r / kubeloop: right of 1x, kubeloop is faster; fair / unfair: the cost of fairness (right of 1x: fairness is slower)".to_owned(),
                        "whisker: the numerator's fastest round over the denominator's slowest to its slowest over the denominator's fastest".to_owned(),
                    ],
                    panels: vec![ratio_panel(
                        &run,
                        "ratios of medians",
                        &workloads,
                        &[
                            ("GO_FAIR", "RESULT_FAIR_OFF", "c-r / kubeloop unfair"),
                            ("GO_FAIR", "RESULT_FAIR_ON", "c-r / kubeloop fair"),
                            ("RESULT_FAIR_ON", "RESULT_FAIR_OFF", "kubeloop fair / unfair"),
                        ],
                    )],
                },
            ));
        }
    }
    Ok(charts)
}

/// A panel of ratios: per workload, one bar per `(numerator, denominator, name)`. A ratio is
/// drawn only when every label of the row did the same work, as in the tables.
fn ratio_panel(
    run: &Run,
    title: &str,
    workloads: &[&String],
    ratios: &[(&str, &str, &str)],
) -> Panel {
    let mut labels: Vec<&str> = Vec::new();
    for (a, b, _) in ratios {
        for label in [a, b] {
            if !labels.contains(label) {
                labels.push(label);
            }
        }
    }
    let groups = workloads
        .iter()
        .map(|workload| {
            let same = run.same_work(&labels, workload).is_some();
            let bars = ratios
                .iter()
                .enumerate()
                .map(|(series, (a, b, _))| {
                    let (a, b) = (run.get(a, workload), run.get(b, workload));
                    let medians = a.and_then(Samples::median).zip(b.and_then(Samples::median));
                    match (medians, same) {
                        (Some((ma, mb)), true) => {
                            let (a, b) = (a.unwrap(), b.unwrap());
                            let spread = a.min().zip(b.max()).zip(a.max().zip(b.min()));
                            Bar {
                                series,
                                value: Some(ma / mb),
                                spread: spread.map(|((a_min, b_max), (a_max, b_min))| {
                                    (a_min / b_max, a_max / b_min)
                                }),
                                text: crate::stats::ratio(ma, mb),
                            }
                        }
                        (Some(_), false) => Bar {
                            series,
                            value: None,
                            spread: None,
                            text: "no ratio: the sides did different work".to_owned(),
                        },
                        (None, _) => Bar {
                            series,
                            value: None,
                            spread: None,
                            text: "no ratio: a side is missing".to_owned(),
                        },
                    }
                })
                .collect();
            Group {
                label: workload.to_string(),
                bars,
            }
        })
        .collect();
    Panel {
        title: title.to_owned(),
        scale: Scale::Log,
        series: ratios.iter().map(|(_, _, name)| name.to_string()).collect(),
        reference: Some(1.0),
        groups,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chart::read::{assert_drawn_at_their_values, elements, of_class};

    /// Three rounds: ObjectKey and `&'static str` keys only (the other key types' lines are
    /// missing), a named row, a dedup row, a row whose sides did different work, a
    /// priority-queue row and a fairness row.
    const RESULTS: &str = "\
# client-go: v0.36.3
# controller-runtime: v0.24.1
# rounds: 3
# date: 2026-11-27
# commit: abc1234
GO single/add-get-done ms=400 adds=1000000 handed_out=1000000
GO dedup/4x100k-adds-100-keys-then-4-workers ms=30 adds=400000 handed_out=100
GO named/single/add-get-done ms=1500 adds=1000000 handed_out=1000000
GO uneven ms=10 adds=10 handed_out=10
GO_PQ pq/single/add-get-done ms=5000 adds=1000000 handed_out=1000000
GO_FAIR fair/4x4 ms=1400 adds=200000 handed_out=200000
RESULT_KEY single/add-get-done ms=130 adds=1000000 handed_out=1000000
RESULT_KEY dedup/4x100k-adds-100-keys-then-4-workers ms=12 adds=400000 handed_out=100
RESULT_KEY named/single/add-get-done ms=200 adds=1000000 handed_out=1000000
RESULT_KEY uneven ms=5 adds=10 handed_out=9
FLOOR_KEY lock+lookup ns=25.0
RESULT single/add-get-done ms=80 adds=1000000 handed_out=1000000
RESULT_PQ_KEY pq/single/add-get-done ms=150 adds=1000000 handed_out=1000000
RESULT_FAIR_OFF fair/4x4 ms=100 adds=200000 handed_out=200000
RESULT_FAIR_ON fair/4x4 ms=110 adds=200000 handed_out=200000
GO single/add-get-done ms=380 adds=1000000 handed_out=1000000
GO dedup/4x100k-adds-100-keys-then-4-workers ms=25 adds=400000 handed_out=100
GO named/single/add-get-done ms=1400 adds=1000000 handed_out=1000000
GO uneven ms=11 adds=10 handed_out=10
GO_PQ pq/single/add-get-done ms=5200 adds=1000000 handed_out=1000000
GO_FAIR fair/4x4 ms=1500 adds=200000 handed_out=200000
RESULT_KEY single/add-get-done ms=120 adds=1000000 handed_out=1000000
RESULT_KEY dedup/4x100k-adds-100-keys-then-4-workers ms=10 adds=400000 handed_out=100
RESULT_KEY named/single/add-get-done ms=210 adds=1000000 handed_out=1000000
RESULT_KEY uneven ms=6 adds=10 handed_out=10
FLOOR_KEY lock+lookup ns=24.0
RESULT single/add-get-done ms=85 adds=1000000 handed_out=1000000
RESULT_PQ_KEY pq/single/add-get-done ms=140 adds=1000000 handed_out=1000000
RESULT_FAIR_OFF fair/4x4 ms=90 adds=200000 handed_out=200000
RESULT_FAIR_ON fair/4x4 ms=120 adds=200000 handed_out=200000
GO single/add-get-done ms=420 adds=1000000 handed_out=1000000
GO dedup/4x100k-adds-100-keys-then-4-workers ms=28.5 adds=400000 handed_out=100
GO named/single/add-get-done ms=1600 adds=1000000 handed_out=1000000
GO uneven ms=12 adds=10 handed_out=10
GO_PQ pq/single/add-get-done ms=5100 adds=1000000 handed_out=1000000
GO_FAIR fair/4x4 ms=1450 adds=200000 handed_out=200000
RESULT_KEY single/add-get-done ms=125 adds=1000000 handed_out=1000000
RESULT_KEY dedup/4x100k-adds-100-keys-then-4-workers ms=11 adds=400000 handed_out=100
RESULT_KEY named/single/add-get-done ms=190 adds=1000000 handed_out=1000000
RESULT_KEY uneven ms=7 adds=10 handed_out=10
FLOOR_KEY lock+lookup ns=26.0
RESULT single/add-get-done ms=90 adds=1000000 handed_out=1000000
RESULT_PQ_KEY pq/single/add-get-done ms=160 adds=1000000 handed_out=1000000
RESULT_FAIR_OFF fair/4x4 ms=95 adds=200000 handed_out=200000
RESULT_FAIR_ON fair/4x4 ms=105 adds=200000 handed_out=200000
";

    fn report() -> String {
        render(&Results::parse(RESULTS)).unwrap()
    }

    #[test]
    fn the_headline_table_gives_medians_spreads_the_ratio_of_medians_and_the_work() {
        let report = report();
        let expected = "\
client-go v0.36.3 vs kubeloop: 3 alternating rounds, same machine, same run, 2026-11-27 at abc1234
Cells: wall time in ms for the row's fixed work, median (min-max) over the rounds; ratio: Go's median / kubeloop's (above 1: kubeloop is faster).

kubeloop with ObjectKey keys, as its controller runtime queues them (Go: string keys)
| workload                                       |           client-go ms |            kubeloop ms |  ratio | adds / handed out |
|------------------------------------------------|------------------------|------------------------|--------|-------------------|
| single/add-get-done                            |          400 (380-420) |          125 (120-130) |  3.20x | 1000000 / 1000000 |
| dedup/4x100k-adds-100-keys-then-4-workers      |       28.5 (25.0-30.0) |       11.0 (10.0-12.0) |  2.59x |      400000 / 100 |
";
        assert!(report.starts_with(expected), "{report}");
    }

    #[test]
    fn a_row_whose_sides_did_different_work_has_no_ratio_and_says_so() {
        let report = report();
        assert!(
            report.contains("| uneven                                         |       11.0 (10.0-12.0) |       6.00 (5.00-7.00) |      - |            differ |\n"),
            "{report}"
        );
        assert!(
            report.contains("\nuneven: the sides did different work (adds / handed out per run: client-go 10 / 10, kubeloop 10 / 9, 10 / 10): no ratio\n"),
            "{report}"
        );
    }

    #[test]
    fn the_dedup_rows_counts_are_printed_per_side_under_the_table() {
        let report = report();
        assert!(
            report.contains("\ndedup/4x100k-adds-100-keys-then-4-workers: adds / items handed out per run: client-go 400000 / 100, kubeloop 400000 / 100\n"),
            "{report}"
        );
    }

    #[test]
    fn named_rows_are_in_the_objectkey_table_only() {
        let report = report();
        assert_eq!(report.matches("| named/single/add-get-done").count(), 1);
        assert!(
            report.contains("| named/single/add-get-done                      |       1500 (1400-1600) |          200 (190-210) |  7.50x | 1000000 / 1000000 |"),
            "{report}"
        );
        let string_table = report.split("kubeloop with String keys").nth(1).unwrap();
        assert!(
            string_table.contains("| single/add-get-done                            |          400 (380-420) |                missing |      - |                 - |"),
            "{report}"
        );
    }

    #[test]
    fn the_floor_is_compared_with_the_median_single_round() {
        let report = report();
        assert!(
            report.contains("\nfloor (one uncontended parking_lot lock/unlock + one hashbrown lookup, these keys), median: 25.0 ns; single/add-get-done: 125.0 ns a round = 5.0x the floor\n"),
            "{report}"
        );
    }

    #[test]
    fn the_priority_queue_table_compares_with_controller_runtime() {
        let report = report();
        assert!(
            report.contains("\nkubeloop PriorityQueue<ObjectKey> vs controller-runtime v0.24.1 priorityqueue (Go: reconcile.Request-shaped keys)\n| workload                                       |                 c-r ms |            kubeloop ms |"),
            "{report}"
        );
        assert!(
            report.contains("| pq/single/add-get-done                         |       5100 (5000-5200) |          150 (140-160) | 34.00x | 1000000 / 1000000 |"),
            "{report}"
        );
    }

    #[test]
    fn the_fairness_table_states_the_cost_of_fairness() {
        let report = report();
        assert!(
            report.contains("| fair/4x4                                       |       1450 (1400-1500) |        95.0 (90.0-100) |          110 (105-120) |     15.26x |     13.18x |        1.16x |   200000 / 200000 |"),
            "{report}"
        );
        assert!(
            report
                .contains("runs a cell: controller-runtime 3, kubeloop unfair 3, kubeloop fair 3 "),
            "{report}"
        );
    }

    #[test]
    fn uncommitted_files_and_the_load_are_named_under_the_stamp() {
        let text = RESULTS.replace(
            "# commit: abc1234\n",
            "# commit: abc1234\n# uncommitted: src/a.rs src/b.rs\n# load before: 1.0 2.0 3.0\n# load after: 4.0 5.0 6.0\n",
        );
        let report = render(&Results::parse(&text)).unwrap();
        let lines: Vec<&str> = report.lines().take(3).collect();
        assert_eq!(
            lines[1..3],
            [
                "Built from that commit with uncommitted changes to: src/a.rs src/b.rs",
                "Load average (1, 5, 15 min) before: 1.0 2.0 3.0; after: 4.0 5.0 6.0",
            ],
            "{report}"
        );
    }

    #[test]
    fn a_long_workload_name_widens_its_table() {
        let long = "fair/200k-keys-100-namespaces-queued-then-4-workers";
        let report = render(&Results::parse(&RESULTS.replace("fair/4x4", long))).unwrap();
        let table: Vec<&str> = report
            .lines()
            .skip_while(|l| !l.starts_with("fairness:"))
            .skip(1)
            .take(3)
            .collect();
        assert!(table[2].starts_with(&format!("| {long} | ")), "{report}");
        assert_eq!(table[0].len(), table[1].len(), "{report}");
        assert_eq!(table[1].len(), table[2].len(), "{report}");
    }

    #[test]
    fn a_chart_per_table_draws_every_rows_ratio_with_its_spread() {
        let charts = charts(&Results::parse(RESULTS)).unwrap();
        let names: Vec<&str> = charts.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            [
                "vs-client-go-objectkey.svg",
                "vs-client-go-string.svg",
                "vs-client-go-arc.svg",
                "vs-client-go-static.svg",
                "vs-client-go-pq.svg",
                "vs-client-go-fair.svg",
            ]
        );
        let read = |i: usize| elements(&charts[i].1.to_svg());
        let objectkey = read(0);
        assert_drawn_at_their_values(&objectkey);
        // (row, ratio of medians, spread: Go's min / kubeloop's max to Go's max / kubeloop's min)
        let bars: Vec<(&str, f64, f64, f64)> = of_class(&objectkey, "bar")
            .iter()
            .map(|b| {
                (
                    b.attr("data-group"),
                    b.number("data-value"),
                    b.number("data-min"),
                    b.number("data-max"),
                )
            })
            .collect();
        assert_eq!(
            bars,
            [
                (
                    "single/add-get-done",
                    400.0 / 125.0,
                    380.0 / 130.0,
                    420.0 / 120.0
                ),
                (
                    "dedup/4x100k-adds-100-keys-then-4-workers",
                    28.5 / 11.0,
                    25.0 / 12.0,
                    30.0 / 10.0
                ),
                (
                    "named/single/add-get-done",
                    1500.0 / 200.0,
                    1400.0 / 210.0,
                    1600.0 / 190.0
                ),
            ]
        );
        // The row whose sides did different work keeps its label and gets no bar.
        let missing = of_class(&objectkey, "missing");
        assert_eq!(missing.len(), 1);
        assert_eq!(missing[0].attr("data-group"), "uneven");
        assert_eq!(
            missing[0].text,
            "client-go / kubeloop: no ratio: the sides did different work"
        );
        assert_eq!(
            of_class(&objectkey, "reference")[0].number("data-value"),
            1.0
        );
        // No String lines in the run: every row says a side is missing.
        let string = read(1);
        assert!(of_class(&string, "bar").is_empty());
        assert_eq!(of_class(&string, "missing").len(), 3);
        let pq: Vec<f64> = of_class(&read(4), "bar")
            .iter()
            .map(|b| b.number("data-value"))
            .collect();
        assert_eq!(pq, [5100.0 / 150.0]);
        let fair = read(5);
        assert_drawn_at_their_values(&fair);
        let fair: Vec<(&str, f64)> = of_class(&fair, "bar")
            .iter()
            .map(|b| (b.attr("data-series"), b.number("data-value")))
            .collect();
        assert_eq!(
            fair,
            [
                ("c-r / kubeloop unfair", 1450.0 / 95.0),
                ("c-r / kubeloop fair", 1450.0 / 110.0),
                ("kubeloop fair / unfair", 110.0 / 95.0),
            ]
        );
    }

    #[test]
    fn a_line_without_its_counts_is_refused_by_number() {
        let results = Results::parse("# rounds: 1\nGO single ms=1\n");
        let error = render(&results).unwrap_err();
        assert_eq!(error.to_string(), "results line 2: no adds=");
    }
}
