//! The chart of `hack/bench-fairness` (the noisy neighbour): the quiet namespace's latency
//! with the queue's fairness on and off, from the table `examples/bench_fairness.rs` prints.
//!
//! The example prints its own table (one row per round, then a `median` row per setting:
//! `<median> (<min>-<max>)` per column); this reads what it printed, the `median` rows, so the
//! chart shows the numbers of the table beside it.

use crate::chart::{Bar, Figure, Group, Panel, Scale};
use crate::error::ReportError;

/// The columns charted: the quiet namespace's latency, and where its p99 went.
const COLUMNS: [&str; 4] = [
    "quiet p50",
    "quiet p99",
    "p99 to quiet-only watch",
    "p99 in queue",
];

/// A `median` row's cell: (median, min, max).
type Spread = (f64, f64, f64);

/// The chart of the bench's printed `output`, as `fairness.svg`.
pub fn chart(output: &str) -> Result<(String, Figure), ReportError> {
    let stamp = output
        .lines()
        .find_map(|l| l.strip_prefix("hack/bench-fairness, "))
        .ok_or_else(|| {
            ReportError::MissingLine("`hack/bench-fairness, <date> at <commit>` line".into())
        })?;
    let (header_at, header) = output
        .lines()
        .enumerate()
        .find(|(_, l)| l.starts_with("| round | fairness |"))
        .ok_or_else(|| ReportError::MissingLine("`| round | fairness | ...` header line".into()))?;
    let names = cells(header);
    let column = |name: &str| {
        names
            .iter()
            .position(|n| *n == name)
            .ok_or_else(|| ReportError::BadLine {
                line: header_at + 1,
                detail: format!("the header has no `{name}` column"),
            })
    };
    let columns = COLUMNS
        .iter()
        .map(|name| column(name))
        .collect::<Result<Vec<_>, _>>()?;
    // Per setting, its charted columns' (median, min, max).
    let mut settings: Vec<(String, Vec<Spread>)> = Vec::new();
    for (i, line) in output.lines().enumerate().skip(header_at + 1) {
        let row = cells(line);
        if row.first() != Some(&"median") {
            continue;
        }
        let error = |detail: String| ReportError::BadLine {
            line: i + 1,
            detail,
        };
        if row.len() != names.len() {
            return Err(error(format!(
                "{} cells where the header has {}",
                row.len(),
                names.len()
            )));
        }
        let figures = columns
            .iter()
            .map(|&c| {
                spread_cell(row[c]).ok_or_else(|| {
                    error(format!(
                        "{}: `{}` is not `<ms> ms (<min> ms-<max> ms)`",
                        names[c], row[c]
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        settings.push((row[1].to_owned(), figures));
    }
    if settings.is_empty() {
        return Err(ReportError::MissingLine(
            "`| median | <fairness> | ...` row".into(),
        ));
    }
    let groups = COLUMNS
        .iter()
        .enumerate()
        .map(|(c, name)| Group {
            label: name.to_string(),
            bars: settings
                .iter()
                .enumerate()
                .map(|(series, (_, figures))| {
                    let (median, min, max) = figures[c];
                    Bar {
                        series,
                        value: Some(median),
                        spread: Some((min, max)),
                        text: format!("{median:.1} ms ({min:.1}-{max:.1})"),
                    }
                })
                .collect(),
        })
        .collect();
    Ok((
        "fairness.svg".to_owned(),
        Figure {
            title: "The noisy neighbour: the quiet namespace's latency, fairness on and off"
                .to_owned(),
            notes: vec![
                format!("hack/bench-fairness, {stamp}"),
                "create returned -> reconcile started; to quiet-only watch: the apiserver's share; in queue: the queue's. Bar: median over rounds, whisker: min-max (log axis)".to_owned(),
            ],
            panels: vec![Panel {
                title: "ms (log axis)".to_owned(),
                scale: Scale::Log,
                series: settings
                    .iter()
                    .map(|(setting, _)| format!("fairness {setting}"))
                    .collect(),
                reference: None,
                groups,
            }],
        },
    ))
}

/// The cells of a markdown table row, trimmed; empty for a line that is not one.
fn cells(line: &str) -> Vec<&str> {
    let Some(inner) = line
        .trim()
        .strip_prefix('|')
        .and_then(|l| l.strip_suffix('|'))
    else {
        return Vec::new();
    };
    inner.split('|').map(str::trim).collect()
}

/// `14.2 ms (5.5 ms-17.4 ms)` as (median, min, max) in ms.
fn spread_cell(cell: &str) -> Option<Spread> {
    let ms = |t: &str| t.trim().strip_suffix(" ms")?.parse::<f64>().ok();
    let (median, spread) = cell.split_once(" (")?;
    let (min, max) = spread.strip_suffix(')')?.split_once('-')?;
    Some((ms(median)?, ms(min)?, ms(max)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chart::read::{assert_drawn_at_their_values, elements, of_class};

    /// The head of a real run's output (2026-11-27, benches/README.md), one round per setting.
    const OUTPUT: &str = "\
hack/bench-fairness, 2026-11-27 at c9a687c
busy: 10000 ConfigMaps at once
| round | fairness | quiet n | quiet p50 | quiet p99 | quiet max | p99 from send | p99 to quiet-only watch | p99 to watch event | p99 informer | p99 in queue | busy created in | busy drain | left after creates | drain rate after creates | max depth |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
| 0 | on | 128 | 5.5 ms | 93.0 ms | 102.6 ms | 194.4 ms | 88.3 ms | 92.2 ms | 4.3 ms | 5.4 ms | 9.29 s | 12.79 s | 3220 | 922/s | 3292 |
| median | on | 155 (128-161) | 14.2 ms (5.5 ms-17.4 ms) | 93.0 ms (68.5 ms-140.5 ms) | 102.6 ms (74.2 ms-191.3 ms) | 251.2 ms (194.4 ms-275.5 ms) | 88.3 ms (59.9 ms-133.1 ms) | 92.2 ms (66.2 ms-134.5 ms) | 0.9 ms (0.3 ms-4.3 ms) | 9.8 ms (5.4 ms-11.0 ms) | 13.66 s (9.29 s-14.62 s) | 15.43 s (12.79 s-16.05 s) | 1324 (796-3220) | 925/s (917/s-932/s) | 1330 (974-3292) |
| median | off | 161 (144-178) | 1042.0 ms (193.7 ms-1148.4 ms) | 1761.1 ms (1349.9 ms-2495.4 ms) | 1779.0 ms (1354.6 ms-2495.6 ms) | 1853.9 ms (1403.2 ms-2533.8 ms) | 68.0 ms (52.1 ms-107.8 ms) | 68.1 ms (52.8 ms-108.0 ms) | 0.8 ms (0.5 ms-1.1 ms) | 1735.1 ms (1333.8 ms-2488.5 ms) | 15.11 s (12.27 s-16.73 s) | 16.01 s (14.34 s-17.80 s) | 1179 (712-1939) | 922/s (855/s-935/s) | 1191 (978-1964) |
";

    #[test]
    fn each_latency_column_has_a_bar_per_setting_at_its_median_with_its_spread() {
        let (name, figure) = chart(OUTPUT).unwrap();
        assert_eq!(name, "fairness.svg");
        let svg = figure.to_svg();
        let all = elements(&svg);
        let bars: Vec<(&str, &str, f64, f64, f64)> = of_class(&all, "bar")
            .iter()
            .map(|b| {
                (
                    b.attr("data-group"),
                    b.attr("data-series"),
                    b.number("data-value"),
                    b.number("data-min"),
                    b.number("data-max"),
                )
            })
            .collect();
        assert_eq!(
            bars,
            [
                ("quiet p50", "fairness on", 14.2, 5.5, 17.4),
                ("quiet p50", "fairness off", 1042.0, 193.7, 1148.4),
                ("quiet p99", "fairness on", 93.0, 68.5, 140.5),
                ("quiet p99", "fairness off", 1761.1, 1349.9, 2495.4),
                ("p99 to quiet-only watch", "fairness on", 88.3, 59.9, 133.1),
                ("p99 to quiet-only watch", "fairness off", 68.0, 52.1, 107.8),
                ("p99 in queue", "fairness on", 9.8, 5.4, 11.0),
                ("p99 in queue", "fairness off", 1735.1, 1333.8, 2488.5),
            ]
        );
        assert_drawn_at_their_values(&all);
        assert_eq!(of_class(&all, "spread").len(), 8);
        assert!(
            all.iter()
                .any(|e| e.text == "hack/bench-fairness, 2026-11-27 at c9a687c")
        );
    }

    #[test]
    fn a_cell_that_is_not_a_spread_of_milliseconds_is_named_with_its_line() {
        let bad = OUTPUT.replace("9.8 ms (5.4 ms-11.0 ms)", "9.8 ms");
        let error = chart(&bad).unwrap_err().to_string();
        assert_eq!(
            error,
            "results line 6: p99 in queue: `9.8 ms` is not `<ms> ms (<min> ms-<max> ms)`"
        );
    }

    #[test]
    fn output_without_median_rows_or_header_is_refused() {
        let no_medians: String = OUTPUT
            .lines()
            .filter(|l| !l.starts_with("| median"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            chart(&no_medians).unwrap_err().to_string(),
            "the bench's output has no `| median | <fairness> | ...` row"
        );
        let error = chart("hack/bench-fairness, d at c\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "the bench's output has no `| round | fairness | ...` header line"
        );
    }
}
