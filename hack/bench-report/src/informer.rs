//! The report of `hack/bench-informer`: one table per object count and data/transform/store,
//! the median round of each side per figure and kubeloop's ratio to client-go, then the sizes
//! of a LIST body and of the compact store.
//!
//! Results: `<N> <data/transform/store> <side> key=value...`, one line per program run (the
//! side's `RESULT` line); meta `client-go`, `rounds`, `load`, `date`, `commit`.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::chart::{Bar, Figure, Group, Panel, Scale};
use crate::error::ReportError;
use crate::results::Results;
use crate::stats::Samples;

/// KiB in a MB (10^6 bytes): the tables print RSS in MB.
const KIB_PER_MB: f64 = 1000.0 / 1.024;

/// One row of a table: its label, the figure's key in the `RESULT` line, the unit it is
/// divided by and the decimals it is printed with.
struct Row {
    label: &'static str,
    key: &'static str,
    scale: f64,
    decimals: usize,
}

const ROWS: [Row; 8] = [
    row("time to synced (ms)", "synced_ms", 1.0, 0),
    row("CPU to synced (ms)", "cpu_ms", 1.0, 0),
    row("peak RSS (MB)", "peak_rss_kib", KIB_PER_MB, 1),
    row("RSS after sync (MB)", "rss_after_kib", KIB_PER_MB, 1),
    row("update latency p50 (ms)", "p50_ms", 1.0, 2),
    row("update latency p99 (ms)", "p99_ms", 1.0, 2),
    row("lister get p99 (us)", "get_p99_us", 1.0, 2),
    row("full list (ms)", "list_ms", 1.0, 1),
];

const fn row(label: &'static str, key: &'static str, scale: f64, decimals: usize) -> Row {
    Row {
        label,
        key,
        scale,
        decimals,
    }
}

/// A table's cell: one side's samples of one figure, for one N and configuration.
type Key<'a> = (&'a str, &'a str, &'a str, &'a str);

/// The sides of a run, in the tables' order, with the names the tables give them.
const SIDES: [(&str, &str); 4] = [
    ("client-go", "client-go"),
    ("kube-runtime", "kube-runtime"),
    ("kubeloop", "kubeloop"),
    ("kubeloop-json", "kubeloop JSON"),
];

/// A run's samples by cell, and its tables (N, configuration) in the order first seen.
struct Run<'a> {
    tables: Vec<(&'a str, &'a str)>,
    samples: HashMap<Key<'a>, Samples>,
    none: Samples,
}

impl<'a> Run<'a> {
    fn read(results: &'a Results) -> Result<Self, ReportError> {
        let mut tables: Vec<(&str, &str)> = Vec::new();
        let mut samples: HashMap<Key, Samples> = HashMap::new();
        for line in results.lines() {
            let [n, config, side, ..] = line.fields.as_slice() else {
                return Err(
                    line.error("expected `<N> <data/transform/store> <side> key=value...`".into())
                );
            };
            if !tables.contains(&(n.as_str(), config.as_str())) {
                tables.push((n, config));
            }
            for (key, value) in line.pairs(3)? {
                samples
                    .entry((n, config, side, key))
                    .or_default()
                    .add(value)
                    .map_err(|e| line.error(format!("{key}: {e}")))?;
            }
        }
        Ok(Run {
            tables,
            samples,
            none: Samples::default(),
        })
    }

    /// Whether `side` saw, in every round, the one number of objects client-go saw in every
    /// round: a ratio compares two sides only if they synced the same objects.
    fn saw_what_client_go_saw(&self, n: &'a str, config: &'a str, side: &'a str) -> bool {
        let (go, this) = (
            self.get(n, config, "client-go", "objects"),
            self.get(n, config, side, "objects"),
        );
        go.distinct_texts().len() == 1
            && this.distinct_texts().len() == 1
            && go.median() == this.median()
    }

    /// `client-go 10001, kubeloop 10001`: the objects each side that ran saw (every distinct
    /// number over the rounds, `/` between them).
    fn objects_seen(&self, n: &'a str, config: &'a str) -> String {
        SIDES
            .iter()
            .filter_map(|(side, name)| {
                let seen = self.get(n, config, side, "objects").distinct_texts();
                (!seen.is_empty()).then(|| format!("{name} {}", seen.join("/")))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn get(&self, n: &'a str, config: &'a str, side: &'a str, key: &'a str) -> &Samples {
        self.samples
            .get(&(n, config, side, key))
            .unwrap_or(&self.none)
    }
}

/// Renders the report of `results`.
pub fn render(results: &Results) -> Result<String, ReportError> {
    let run = Run::read(results)?;
    let tables = run.tables.clone();
    let get = |n, config, side, key| run.get(n, config, side, key);

    let mut out = format!(
        "client-go {} vs kube-runtime vs kubeloop (protobuf; and JSON): {} alternating rounds, median per cell, {}, {}\n",
        results.meta("client-go")?,
        results.meta("rounds")?,
        results.meta("load")?,
        results.stamp()?,
    );
    for (n, config) in tables {
        let median = |side, key| get(n, config, side, key).median();
        let objects = get(n, config, "kubeloop", "objects");
        let _ = writeln!(
            out,
            "\nN={n}, data/transform/store={config} (objects seen: {})",
            run.objects_seen(n, config)
        );
        let _ = writeln!(
            out,
            "| {:<26} | {:>12} | {:>12} | {:>12} | {:>6} | {:>12} | {:>6} |",
            "", "client-go", "kube-runtime", "kubeloop", "kl/cg", "kubeloop JSON", "/cg"
        );
        out.push_str("|----------------------------|--------------|--------------|--------------|--------|--------------|--------|\n");
        for row in &ROWS {
            let [go, kube_runtime, kubeloop, json] =
                ["client-go", "kube-runtime", "kubeloop", "kubeloop-json"]
                    .map(|side| median(side, row.key));
            let cell = |v: Option<f64>| match v {
                Some(v) => format!("{:12.*}", row.decimals, v / row.scale),
                None => format!("{:>12}", "-"),
            };
            // A side with no sample, a missing client-go, or a side that saw other objects
            // than client-go has no ratio.
            let to_go = |side, v: Option<f64>| match (v, go) {
                (Some(v), Some(g)) if g > 0.0 && run.saw_what_client_go_saw(n, config, side) => {
                    format!("{:5.2}x", v / g)
                }
                _ => format!("{:>6}", "-"),
            };
            let _ = writeln!(
                out,
                "| {:<26} | {} | {} | {} | {} | {} | {} |",
                row.label,
                cell(go),
                cell(kube_runtime),
                cell(kubeloop),
                to_go("kubeloop", kubeloop),
                cell(json),
                to_go("kubeloop-json", json)
            );
        }
        for (side, name) in &SIDES[1..] {
            let seen = get(n, config, side, "objects");
            if seen.median().is_some() && !run.saw_what_client_go_saw(n, config, side) {
                let _ = writeln!(
                    out,
                    "{name} saw {} objects where client-go saw {}: no ratio",
                    seen.distinct_texts().join("/"),
                    get(n, config, "client-go", "objects")
                        .distinct_texts()
                        .join("/")
                );
            }
        }
        let objects = objects.median().unwrap_or(0.0);
        let per_object = |bytes: f64| if objects > 0.0 { bytes / objects } else { 0.0 };
        let protobuf = median("kubeloop", "list_bytes").unwrap_or(0.0);
        let json = median("kubeloop-json", "list_bytes").unwrap_or(0.0);
        let stored = median("kubeloop", "stored_bytes").unwrap_or(0.0);
        let base_rss = median("kubeloop", "base_rss_kib").unwrap_or(0.0);
        let _ = write!(
            out,
            "LIST body: protobuf {:.1} MB ({:.0} B/object)",
            protobuf / 1e6,
            per_object(protobuf)
        );
        if json > 0.0 {
            let _ = write!(
                out,
                ", JSON {:.1} MB ({:.0} B/object)",
                json / 1e6,
                per_object(json)
            );
        }
        if stored > 0.0 {
            let _ = write!(
                out,
                "; compact frames: {:.1} MB ({:.0} B/object)",
                stored / 1e6,
                per_object(stored)
            );
        }
        let _ = writeln!(
            out,
            "; kubeloop RSS before start: {:.1} MB",
            base_rss / KIB_PER_MB
        );
    }
    Ok(out)
}

/// The figures the charts draw: time to synced, and peak RSS.
const CHARTED: [&str; 2] = ["synced_ms", "peak_rss_kib"];

/// One chart per N: time to synced and peak RSS per data/transform/store, every side that ran
/// at that N against client-go, the median round with the min-max of the rounds; file
/// `informer-<N>.svg`.
pub fn charts(results: &Results) -> Result<Vec<(String, Figure)>, ReportError> {
    let run = Run::read(results)?;
    let mut sizes: Vec<&str> = Vec::new();
    for (n, _) in &run.tables {
        if !sizes.contains(n) {
            sizes.push(n);
        }
    }
    let mut figures = Vec::new();
    for n in sizes {
        let configs: Vec<&str> = run
            .tables
            .iter()
            .filter(|(t, _)| *t == n)
            .map(|(_, c)| *c)
            .collect();
        let sides: Vec<(&str, &str)> = SIDES
            .into_iter()
            .filter(|(side, _)| {
                configs
                    .iter()
                    .any(|c| run.get(n, c, side, "synced_ms").median().is_some())
            })
            .collect();
        let panels = CHARTED
            .iter()
            .map(|key| {
                let row = ROWS.iter().find(|r| r.key == *key).expect("a charted row");
                let groups = configs
                    .iter()
                    .map(|config| {
                        let go = run.get(n, config, "client-go", key).median();
                        let bars = sides
                            .iter()
                            .enumerate()
                            .map(|(series, (side, _))| {
                                let samples = run.get(n, config, side, key);
                                let scaled = |v: Option<f64>| v.map(|v| v / row.scale);
                                let value = scaled(samples.median());
                                let text = match (value, go) {
                                    (None, _) => "did not run".to_owned(),
                                    (Some(v), Some(g))
                                        if *side != "client-go"
                                            && g > 0.0
                                            && run.saw_what_client_go_saw(n, config, side) =>
                                    {
                                        format!(
                                            "{v:.*} ({:.2}x client-go)",
                                            row.decimals,
                                            v * row.scale / g
                                        )
                                    }
                                    (Some(v), _) => format!("{v:.*}", row.decimals),
                                };
                                Bar {
                                    series,
                                    value,
                                    spread: scaled(samples.min()).zip(scaled(samples.max())),
                                    text,
                                }
                            })
                            .collect();
                        Group {
                            label: config.to_string(),
                            bars,
                        }
                    })
                    .collect();
                Panel {
                    title: row.label.to_owned(),
                    scale: Scale::Linear,
                    series: sides.iter().map(|(_, name)| name.to_string()).collect(),
                    reference: None,
                    groups,
                }
            })
            .collect();
        figures.push((
            format!("informer-{n}.svg"),
            Figure {
                title: format!("Informer, N={n}: client-go {} against kubeloop", results.meta("client-go")?),
                notes: vec![
                    format!(
                        "{}; {} alternating rounds; bar: the median round, whisker: min-max over the rounds (rows: data/transform/store)",
                        results.stamp()?,
                        results.meta("rounds")?
                    ),
                ],
                panels,
            },
        ));
    }
    Ok(figures)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chart::read::{assert_drawn_at_their_values, elements, of_class};

    const RESULTS: &str = "\
# client-go: v0.36.3
# rounds: 2
# load: load average: 1.39, 1.19, 1.14
# date: 2026-11-26
# commit: abc1234
10000 random/none/typed client-go objects=10001 synced_ms=165 cpu_ms=142 peak_rss_kib=69727 rss_after_kib=69824 p50_ms=2.56 p99_ms=3.80 get_p99_us=0.38 list_ms=0.6
10000 random/none/typed kube-runtime objects=10001 synced_ms=232 cpu_ms=119 peak_rss_kib=72949 rss_after_kib=72949 p50_ms=2.65 p99_ms=4.01 get_p99_us=0.80 list_ms=0.1
10000 random/none/typed kubeloop objects=10001 synced_ms=228 cpu_ms=124 peak_rss_kib=57715 rss_after_kib=58398 p50_ms=3.03 p99_ms=3.98 get_p99_us=0.58 list_ms=0.7 list_bytes=12000000 stored_bytes=0 base_rss_kib=10058
10000 random/none/typed kubeloop-json objects=10001 synced_ms=300 cpu_ms=200 peak_rss_kib=60000 rss_after_kib=60000 p50_ms=3.00 p99_ms=4.00 get_p99_us=0.60 list_ms=0.7 list_bytes=14850000 stored_bytes=0 base_rss_kib=10058
10000 random/none/typed client-go objects=10001 synced_ms=175 cpu_ms=150 peak_rss_kib=69727 rss_after_kib=69824 p50_ms=2.56 p99_ms=3.80 get_p99_us=0.38 list_ms=0.6
10000 random/none/typed kubeloop objects=10001 synced_ms=220 cpu_ms=130 peak_rss_kib=57715 rss_after_kib=58398 p50_ms=3.03 p99_ms=3.98 get_p99_us=0.58 list_ms=0.7 list_bytes=12000000 stored_bytes=0 base_rss_kib=10058
10000 random/none/metadata client-go objects=10001 synced_ms=100 cpu_ms=90 peak_rss_kib=30000 rss_after_kib=30000 p50_ms=2 p99_ms=3 get_p99_us=0.3 list_ms=0.5
10000 random/none/metadata kubeloop objects=10001 synced_ms=120 cpu_ms=80 peak_rss_kib=20000 rss_after_kib=20000 p50_ms=2 p99_ms=3 get_p99_us=0.3 list_ms=0.5 list_bytes=5000000 stored_bytes=0 base_rss_kib=10000
";

    #[test]
    fn a_table_per_configuration_with_the_median_round_and_the_ratio_to_client_go() {
        let report = render(&Results::parse(RESULTS)).unwrap();
        let expected = "\
client-go v0.36.3 vs kube-runtime vs kubeloop (protobuf; and JSON): 2 alternating rounds, median per cell, load average: 1.39, 1.19, 1.14, 2026-11-26 at abc1234

N=10000, data/transform/store=random/none/typed (objects seen: client-go 10001, kube-runtime 10001, kubeloop 10001, kubeloop JSON 10001)
|                            |    client-go | kube-runtime |     kubeloop |  kl/cg | kubeloop JSON |    /cg |
|----------------------------|--------------|--------------|--------------|--------|--------------|--------|
| time to synced (ms)        |          165 |          232 |          220 |  1.33x |          300 |  1.82x |
| CPU to synced (ms)         |          142 |          119 |          124 |  0.87x |          200 |  1.41x |
| peak RSS (MB)              |         71.4 |         74.7 |         59.1 |  0.83x |         61.4 |  0.86x |
| RSS after sync (MB)        |         71.5 |         74.7 |         59.8 |  0.84x |         61.4 |  0.86x |
| update latency p50 (ms)    |         2.56 |         2.65 |         3.03 |  1.18x |         3.00 |  1.17x |
| update latency p99 (ms)    |         3.80 |         4.01 |         3.98 |  1.05x |         4.00 |  1.05x |
| lister get p99 (us)        |         0.38 |         0.80 |         0.58 |  1.53x |         0.60 |  1.58x |
| full list (ms)             |          0.6 |          0.1 |          0.7 |  1.17x |          0.7 |  1.17x |
LIST body: protobuf 12.0 MB (1200 B/object), JSON 14.8 MB (1485 B/object); kubeloop RSS before start: 10.3 MB

N=10000, data/transform/store=random/none/metadata (objects seen: client-go 10001, kubeloop 10001)
|                            |    client-go | kube-runtime |     kubeloop |  kl/cg | kubeloop JSON |    /cg |
|----------------------------|--------------|--------------|--------------|--------|--------------|--------|
| time to synced (ms)        |          100 |            - |          120 |  1.20x |            - |      - |
| CPU to synced (ms)         |           90 |            - |           80 |  0.89x |            - |      - |
| peak RSS (MB)              |         30.7 |            - |         20.5 |  0.67x |            - |      - |
| RSS after sync (MB)        |         30.7 |            - |         20.5 |  0.67x |            - |      - |
| update latency p50 (ms)    |         2.00 |            - |         2.00 |  1.00x |            - |      - |
| update latency p99 (ms)    |         3.00 |            - |         3.00 |  1.00x |            - |      - |
| lister get p99 (us)        |         0.30 |            - |         0.30 |  1.00x |            - |      - |
| full list (ms)             |          0.5 |            - |          0.5 |  1.00x |            - |      - |
LIST body: protobuf 5.0 MB (500 B/object); kubeloop RSS before start: 10.2 MB
";
        assert_eq!(report, expected);
    }

    #[test]
    fn a_chart_per_n_draws_every_sides_time_to_synced_and_peak_rss_per_store() {
        let charts = charts(&Results::parse(RESULTS)).unwrap();
        assert_eq!(charts.len(), 1);
        assert_eq!(charts[0].0, "informer-10000.svg");
        let svg = charts[0].1.to_svg();
        let all = elements(&svg);
        let bars: Vec<(String, &str, &str, f64)> = of_class(&all, "bar")
            .iter()
            .map(|b| {
                (
                    b.panel["data-title"].clone(),
                    b.attr("data-group"),
                    b.attr("data-series"),
                    b.number("data-value"),
                )
            })
            .collect();
        let mb = |kib: f64| kib / KIB_PER_MB;
        let (typed, metadata) = ("random/none/typed", "random/none/metadata");
        let (time, rss) = ("time to synced (ms)".to_owned(), "peak RSS (MB)".to_owned());
        assert_eq!(
            bars,
            [
                (time.clone(), typed, "client-go", 165.0),
                (time.clone(), typed, "kube-runtime", 232.0),
                (time.clone(), typed, "kubeloop", 220.0),
                (time.clone(), typed, "kubeloop JSON", 300.0),
                (time.clone(), metadata, "client-go", 100.0),
                (time.clone(), metadata, "kubeloop", 120.0),
                (rss.clone(), typed, "client-go", mb(69727.0)),
                (rss.clone(), typed, "kube-runtime", mb(72949.0)),
                (rss.clone(), typed, "kubeloop", mb(57715.0)),
                (rss.clone(), typed, "kubeloop JSON", mb(60000.0)),
                (rss.clone(), metadata, "client-go", mb(30000.0)),
                (rss.clone(), metadata, "kubeloop", mb(20000.0)),
            ]
        );
        assert_drawn_at_their_values(&all);
        // The rounds' spread: client-go 165-175 and kubeloop 220-228 for the typed sync.
        let spreads: Vec<(&str, f64, f64)> = of_class(&all, "spread")
            .iter()
            .map(|s| {
                (
                    s.attr("data-series"),
                    s.number("data-min"),
                    s.number("data-max"),
                )
            })
            .collect();
        assert_eq!(
            spreads,
            [("client-go", 165.0, 175.0), ("kubeloop", 220.0, 228.0)]
        );
        // A side that sat a store out keeps its place and says so.
        let missing: Vec<(&str, &str, &str)> = of_class(&all, "missing")
            .iter()
            .map(|m| (m.attr("data-group"), m.attr("data-series"), m.text.as_str()))
            .collect();
        assert_eq!(
            missing,
            [
                (metadata, "kube-runtime", "kube-runtime: did not run"),
                (metadata, "kubeloop JSON", "kubeloop JSON: did not run"),
            ]
            .repeat(2)
        );
        let kubeloop = of_class(&all, "value")
            .into_iter()
            .find(|v| v.attr("data-series") == "kubeloop")
            .unwrap();
        assert_eq!(kubeloop.text, "220 (1.33x client-go)");
    }

    #[test]
    fn a_side_that_saw_other_objects_than_client_go_has_no_ratio_and_says_so() {
        // kubeloop saw 10000 in one round; client-go 10001 in both.
        let text = RESULTS.replacen(
            "10000 random/none/typed kubeloop objects=10001 synced_ms=220",
            "10000 random/none/typed kubeloop objects=10000 synced_ms=220",
            1,
        );
        let report = render(&Results::parse(&text)).unwrap();
        assert!(
            report.contains("(objects seen: client-go 10001, kube-runtime 10001, kubeloop 10000/10001, kubeloop JSON 10001)"),
            "{report}"
        );
        assert!(
            report.contains("| time to synced (ms)        |          165 |          232 |          220 |      - |          300 |  1.82x |"),
            "{report}"
        );
        assert!(
            report.contains(
                "\nkubeloop saw 10000/10001 objects where client-go saw 10001: no ratio\nLIST body"
            ),
            "{report}"
        );
        // The metadata table's sides agree: its ratios stay.
        assert!(report.contains("| time to synced (ms)        |          100 |            - |          120 |  1.20x |"), "{report}");
    }

    #[test]
    fn a_line_without_a_side_is_refused_with_its_number() {
        let error = render(&Results::parse("# date: d\n10000 random/none/typed\n")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "results line 2: expected `<N> <data/transform/store> <side> key=value...`"
        );
    }
}
