//! [`Figure`]: a horizontal bar chart of a report's table, written as SVG.
//!
//! Hand-written rather than drawn with a plotting crate: the charts are bars, whiskers, labels
//! and an axis, about as many lines here as the calls to a crate would be, and this keeps
//! `bench-report` on std alone (the scripts build it before every run). It also lets each bar
//! carry what it shows, which a plotting crate's SVG backend does not write: `data-group`,
//! `data-series`, `data-value` (and `data-min`, `data-max` for a spread), and a `<title>` with
//! the number as the table prints it, which a browser shows on hover. Each panel says how its
//! axis maps values to x (`data-scale`, `data-domain-min`, `data-domain-max`, `data-x0`,
//! `data-x1`), so a test reads a chart back and checks that every bar is drawn at its value.
//!
//! A row the report gives no number (a ratio it refuses, a side that did not run) keeps its
//! label and says why, in place of a bar, so no row drops out of the chart silently.

use std::fmt::Write as _;

/// One chart: a title, notes under it, and one or more panels stacked top to bottom.
#[derive(Debug)]
pub struct Figure {
    pub title: String,
    /// Lines under the title: the run's stamp, how to read the chart.
    pub notes: Vec<String>,
    pub panels: Vec<Panel>,
}

/// One axis and its rows of bars.
#[derive(Debug)]
pub struct Panel {
    pub title: String,
    pub scale: Scale,
    /// The series' names, one colour each, in the legend's order; a [`Bar`] names its series
    /// by index.
    pub series: Vec<String>,
    /// A value drawn as a vertical line (1x on a ratio chart); bars start from it.
    pub reference: Option<f64>,
    pub groups: Vec<Group>,
}

/// How a panel's axis maps values to x.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale {
    /// From 0 (or the reference) up.
    Linear,
    /// Decades: for ratios, and for latencies whose settings differ a hundredfold.
    Log,
}

/// A row of the table: its label and a bar per series.
#[derive(Debug)]
pub struct Group {
    pub label: String,
    pub bars: Vec<Bar>,
}

/// One cell of the table.
#[derive(Debug)]
pub struct Bar {
    /// Index into the panel's `series`.
    pub series: usize,
    /// The value drawn, or `None` for a cell without one (then `text` says why).
    pub value: Option<f64>,
    /// The min-max over the rounds, drawn as a whisker when it is wider than a point.
    pub spread: Option<(f64, f64)>,
    /// The value as the table prints it, shown beside the bar and in its title.
    pub text: String,
}

/// Series colours (Tableau 10), in series order; the first is always the Go side.
const COLOURS: [&str; 6] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1",
];
const WIDTH: f64 = 960.0;
/// Room right of the plot for the value beside the longest bar.
const RIGHT: f64 = 150.0;
const BAR: f64 = 13.0;
const BAR_GAP: f64 = 2.0;
const GROUP_GAP: f64 = 9.0;
const LINE: f64 = 15.0;
/// Roughly the width of one character of the 11 px labels.
const CHAR: f64 = 6.4;

impl Figure {
    /// The figure as an SVG document.
    pub fn to_svg(&self) -> String {
        let label_width = self
            .panels
            .iter()
            .flat_map(|p| p.groups.iter())
            .map(|g| g.label.chars().count() as f64 * CHAR + 16.0)
            .fold(180.0, f64::max);
        let (x0, x1) = (label_width, WIDTH - RIGHT);
        let mut body = String::new();
        let mut y = 24.0;
        let _ = writeln!(
            body,
            r#"<text x="10" y="{y}" font-size="15" font-weight="bold">{}</text>"#,
            escape(&self.title)
        );
        for note in self.notes.iter().flat_map(|n| wrap(n, 150)) {
            y += LINE;
            let _ = writeln!(
                body,
                r##"<text class="note" x="10" y="{y}" font-size="11" fill="#444">{}</text>"##,
                escape(&note)
            );
        }
        y += 10.0;
        for panel in &self.panels {
            y = panel.draw(&mut body, y, x0, x1);
        }
        format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{h}" viewBox="0 0 {WIDTH} {h}" font-family="sans-serif">
<rect width="100%" height="100%" fill="white"/>
{body}</svg>
"#,
            h = y + 10.0
        )
    }
}

impl Panel {
    /// Draws the panel from `top`; the y under it.
    fn draw(&self, out: &mut String, top: f64, x0: f64, x1: f64) -> f64 {
        let axis = Axis::fit(self, x0, x1);
        let mut y = top + LINE;
        let _ = writeln!(
            out,
            r#"<g class="panel" data-title="{}" data-scale="{}" data-domain-min="{}" data-domain-max="{}" data-x0="{x0}" data-x1="{x1}">"#,
            escape(&self.title),
            match self.scale {
                Scale::Linear => "linear",
                Scale::Log => "log",
            },
            axis.min,
            axis.max,
        );
        let _ = writeln!(
            out,
            r#"<text x="10" y="{y}" font-size="13" font-weight="bold">{}</text>"#,
            escape(&self.title)
        );
        // The legend, on the title's line.
        let mut lx = x0;
        for (i, name) in self.series.iter().enumerate() {
            let _ = writeln!(
                out,
                r#"<rect x="{lx}" y="{}" width="10" height="10" fill="{}"/><text x="{}" y="{y}" font-size="11">{}</text>"#,
                y - 9.0,
                colour(i),
                lx + 14.0,
                escape(name)
            );
            lx += 14.0 + name.chars().count() as f64 * CHAR + 18.0;
        }
        y += 8.0;
        let plot_top = y;
        let mut rows = String::new();
        for group in &self.groups {
            let height = group.bars.len().max(1) as f64 * (BAR + BAR_GAP) - BAR_GAP;
            let _ = writeln!(
                rows,
                r#"<text x="{}" y="{}" font-size="11" text-anchor="end">{}</text>"#,
                x0 - 8.0,
                y + height / 2.0 + 4.0,
                escape(&group.label)
            );
            for bar in &group.bars {
                self.draw_bar(&mut rows, &axis, group, bar, y);
                y += BAR + BAR_GAP;
            }
            if group.bars.is_empty() {
                y += BAR + BAR_GAP;
            }
            y += GROUP_GAP - BAR_GAP;
        }
        let plot_bottom = y;
        // Grid and ticks first, so the bars sit on top of them.
        for (value, label) in axis.ticks() {
            let x = axis.x(value);
            let _ = writeln!(
                out,
                r##"<line x1="{x:.2}" y1="{plot_top}" x2="{x:.2}" y2="{plot_bottom}" stroke="#ddd"/><text x="{x:.2}" y="{}" font-size="10" text-anchor="middle" fill="#555">{label}</text>"##,
                plot_bottom + 12.0
            );
        }
        if let Some(reference) = self.reference {
            let x = axis.x(reference);
            let _ = writeln!(
                out,
                r##"<line class="reference" data-value="{reference}" x1="{x:.2}" y1="{plot_top}" x2="{x:.2}" y2="{plot_bottom}" stroke="#333" stroke-dasharray="3,2"/>"##
            );
        }
        out.push_str(&rows);
        out.push_str("</g>\n");
        plot_bottom + 22.0
    }

    fn draw_bar(&self, out: &mut String, axis: &Axis, group: &Group, bar: &Bar, y: f64) {
        let series = self.series.get(bar.series).map_or("", String::as_str);
        let data = format!(
            r#"data-group="{}" data-series="{}""#,
            escape(&group.label),
            escape(series)
        );
        let title = format!("{} — {series}: {}", group.label, bar.text);
        let value = match bar.value {
            Some(v) if v.is_finite() && (self.scale == Scale::Linear || v > 0.0) => v,
            _ => {
                let _ = writeln!(
                    out,
                    r##"<text class="missing" {data} x="{}" y="{}" font-size="10" fill="#a00">{}: {}<title>{}</title></text>"##,
                    axis.x0 + 4.0,
                    y + BAR - 3.0,
                    escape(series),
                    escape(&bar.text),
                    escape(&title)
                );
                return;
            }
        };
        let (from, to) = (axis.x(axis.base), axis.x(value));
        let spread = bar
            .spread
            .filter(|(min, max)| min < max && (self.scale == Scale::Linear || *min > 0.0));
        let spread_attrs = spread.map_or(String::new(), |(min, max)| {
            format!(r#" data-min="{min}" data-max="{max}""#)
        });
        let _ = writeln!(
            out,
            r#"<rect class="bar" {data} data-value="{value}"{spread_attrs} x="{:.2}" y="{y}" width="{:.2}" height="{BAR}" fill="{}"><title>{}</title></rect>"#,
            from.min(to),
            (to - from).abs(),
            colour(bar.series),
            escape(&title)
        );
        let mut text_x = from.max(to);
        if let Some((min, max)) = spread {
            let (a, b) = (axis.x(min), axis.x(max));
            let mid = y + BAR / 2.0;
            let _ = writeln!(
                out,
                r##"<path class="spread" {data} data-min="{min}" data-max="{max}" d="M{a:.2} {mid}H{b:.2}M{a:.2} {}V{}M{b:.2} {}V{}" stroke="#222" fill="none"/>"##,
                y + 3.0,
                y + BAR - 3.0,
                y + 3.0,
                y + BAR - 3.0,
            );
            text_x = text_x.max(b);
        }
        let _ = writeln!(
            out,
            r#"<text class="value" {data} x="{:.2}" y="{}" font-size="10">{}</text>"#,
            text_x + 4.0,
            y + BAR - 3.0,
            escape(&bar.text)
        );
    }
}

/// A panel's axis: the values its x range spans, and where bars start.
struct Axis {
    scale: Scale,
    min: f64,
    max: f64,
    base: f64,
    x0: f64,
    x1: f64,
}

impl Axis {
    /// The axis that holds every value, spread and the reference of `panel`.
    fn fit(panel: &Panel, x0: f64, x1: f64) -> Self {
        let values: Vec<f64> = panel
            .groups
            .iter()
            .flat_map(|g| g.bars.iter())
            .flat_map(|b| {
                let (min, max) = b.spread.unzip();
                [b.value, min, max]
            })
            .flatten()
            .chain(panel.reference)
            .filter(|v| v.is_finite() && (panel.scale == Scale::Linear || *v > 0.0))
            .collect();
        let high = values.iter().copied().fold(f64::MIN, f64::max);
        let low = values.iter().copied().fold(f64::MAX, f64::min);
        let (min, max) = match panel.scale {
            Scale::Linear if values.is_empty() => (0.0, 1.0),
            Scale::Linear => {
                let high = high.max(f64::MIN_POSITIVE);
                let step = nice_ceiling(high / 5.0);
                (low.min(0.0), (high / step).ceil() * step)
            }
            Scale::Log if values.is_empty() => (1.0, 10.0),
            Scale::Log => {
                let (a, b) = (low.log10().floor(), high.log10().ceil());
                (10f64.powf(a), 10f64.powf(if b > a { b } else { a + 1.0 }))
            }
        };
        let base = panel.reference.unwrap_or(match panel.scale {
            Scale::Linear => 0.0,
            Scale::Log => min,
        });
        Axis {
            scale: panel.scale,
            min,
            max,
            base,
            x0,
            x1,
        }
    }

    /// Where `value` is drawn.
    fn x(&self, value: f64) -> f64 {
        let at = match self.scale {
            Scale::Linear => (value - self.min) / (self.max - self.min),
            Scale::Log => {
                (value.log10() - self.min.log10()) / (self.max.log10() - self.min.log10())
            }
        };
        self.x0 + at * (self.x1 - self.x0)
    }

    /// The ticks and their labels.
    fn ticks(&self) -> Vec<(f64, String)> {
        match self.scale {
            Scale::Linear => {
                let step = nice_ceiling((self.max - self.min) / 5.0);
                let mut ticks = Vec::new();
                let mut v = (self.min / step).ceil() * step;
                while v <= self.max + step * 1e-9 {
                    ticks.push((v, number(v)));
                    v += step;
                }
                ticks
            }
            Scale::Log => {
                let decades = (self.max / self.min).log10().round() as i32;
                let mut ticks = Vec::new();
                let mut decade = self.min;
                for _ in 0..decades {
                    let steps: &[f64] = if decades <= 3 {
                        &[1.0, 2.0, 5.0]
                    } else {
                        &[1.0]
                    };
                    ticks.extend(steps.iter().map(|s| decade * s));
                    decade *= 10.0;
                }
                ticks.push(self.max);
                ticks.into_iter().map(|v| (v, number(v))).collect()
            }
        }
    }
}

/// The smallest of 1, 2, 5 times a power of ten that is at least `v` (`v` > 0).
fn nice_ceiling(v: f64) -> f64 {
    let decade = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|s| s * decade)
        .find(|n| *n >= v * (1.0 - 1e-12))
        .unwrap_or(10.0 * decade)
}

/// A tick label: `0.1`, `2`, `1500`.
fn number(v: f64) -> String {
    let text = format!("{:.3}", v);
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn colour(series: usize) -> &'static str {
    COLOURS[series % COLOURS.len()]
}

/// `text` with XML's five special characters escaped.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` cut into lines of at most `width` characters, at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split(' ') {
        let line = lines.last_mut().unwrap();
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(word.to_owned());
        } else {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
    }
    lines
}

/// Reading a written chart back, for the reports' tests.
#[cfg(test)]
pub mod read {
    use std::collections::BTreeMap;

    /// An element of the SVG, with its attributes, its text and its enclosing panel's.
    #[derive(Debug, Clone)]
    pub struct Element {
        pub name: String,
        pub attrs: BTreeMap<String, String>,
        /// The text directly inside it, unescaped.
        pub text: String,
        /// The text of its `<title>` child, if it has one.
        pub title: String,
        /// The attributes of the `<g class="panel">` it is in.
        pub panel: BTreeMap<String, String>,
    }

    impl Element {
        pub fn attr(&self, name: &str) -> &str {
            self.attrs.get(name).map_or("", String::as_str)
        }

        pub fn number(&self, name: &str) -> f64 {
            self.attr(name)
                .parse()
                .unwrap_or_else(|_| panic!("{name}={:?} of {self:?}", self.attr(name)))
        }

        /// The x the panel's axis draws `value` at.
        pub fn x_of(&self, value: f64) -> f64 {
            let p = |k: &str| self.panel[k].parse::<f64>().unwrap();
            let (min, max) = (p("data-domain-min"), p("data-domain-max"));
            let at = if self.panel["data-scale"] == "log" {
                (value.log10() - min.log10()) / (max.log10() - min.log10())
            } else {
                (value - min) / (max - min)
            };
            p("data-x0") + at * (p("data-x1") - p("data-x0"))
        }
    }

    /// Every element of `svg` in document order; panics if the document is not well formed
    /// (a tag left open or closed twice, an unknown entity, a stray `<` or `&`).
    pub fn elements(svg: &str) -> Vec<Element> {
        let mut all: Vec<Element> = Vec::new();
        let mut open: Vec<usize> = Vec::new();
        let mut rest = svg;
        while !rest.is_empty() {
            let Some(lt) = rest.find('<') else {
                text_into(&mut all, &open, rest);
                break;
            };
            text_into(&mut all, &open, &rest[..lt]);
            let gt = rest[lt..].find('>').expect("a tag without `>`") + lt;
            let tag = &rest[lt + 1..gt];
            rest = &rest[gt + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                let i = open.pop().expect("a closing tag with nothing open");
                assert_eq!(all[i].name, name, "</{name}> closes <{}>", all[i].name);
                continue;
            }
            let self_closing = tag.ends_with('/');
            let tag = tag.trim_end_matches('/');
            let (name, mut attrs_text) = tag.split_once(char::is_whitespace).unwrap_or((tag, ""));
            let mut attrs = BTreeMap::new();
            loop {
                attrs_text = attrs_text.trim_start();
                if attrs_text.is_empty() {
                    break;
                }
                let (key, after) = attrs_text
                    .split_once("=\"")
                    .expect("an attribute not key=\"");
                let (value, after) = after
                    .split_once('"')
                    .expect("an attribute value not closed");
                attrs.insert(key.to_owned(), unescape(value));
                attrs_text = after;
            }
            let panel = if name == "g" && attrs.get("class").is_some_and(|c| c == "panel") {
                attrs.clone()
            } else {
                open.last()
                    .map(|&i| all[i].panel.clone())
                    .unwrap_or_default()
            };
            all.push(Element {
                name: name.to_owned(),
                attrs,
                text: String::new(),
                title: String::new(),
                panel,
            });
            if !self_closing {
                open.push(all.len() - 1);
            }
        }
        assert!(
            open.is_empty(),
            "left open: {:?}",
            open.iter().map(|&i| &all[i].name).collect::<Vec<_>>()
        );
        all
    }

    fn text_into(all: &mut [Element], open: &[usize], text: &str) {
        let Some(&i) = open.last() else { return };
        let text = unescape(text);
        if all[i].name == "title" && open.len() >= 2 {
            all[open[open.len() - 2]].title.push_str(&text);
        }
        all[i].text.push_str(&text);
    }

    fn unescape(text: &str) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(amp) = rest.find('&') {
            out.push_str(&rest[..amp]);
            let semi = rest[amp..].find(';').expect("`&` without `;`") + amp;
            out.push(match &rest[amp + 1..semi] {
                "amp" => '&',
                "lt" => '<',
                "gt" => '>',
                "quot" => '"',
                "apos" => '\'',
                other => panic!("unknown entity &{other};"),
            });
            rest = &rest[semi + 1..];
        }
        assert!(!rest.contains('<'), "a stray `<`");
        out.push_str(rest);
        out
    }

    /// The elements of class `class`.
    pub fn of_class<'a>(all: &'a [Element], class: &str) -> Vec<&'a Element> {
        all.iter().filter(|e| e.attr("class") == class).collect()
    }

    /// Asserts that every bar of `svg` is drawn where its panel's axis puts its value (from the
    /// reference or the axis' start), and every whisker at its min and max.
    pub fn assert_drawn_at_their_values(all: &[Element]) {
        for bar in of_class(all, "bar") {
            let value = bar.number("data-value");
            let (x, width) = (bar.number("x"), bar.number("width"));
            let ends = [x, x + width];
            let at = bar.x_of(value);
            assert!(
                ends.iter().any(|e| (e - at).abs() < 0.02),
                "bar {:?} {:?} of {value} ends at {ends:?}, not at {at}",
                bar.attr("data-group"),
                bar.attr("data-series"),
            );
        }
        for spread in of_class(all, "spread") {
            let d = spread.attr("d");
            for key in ["data-min", "data-max"] {
                let at = spread.x_of(spread.number(key));
                assert!(
                    d.contains(&format!("M{at:.2} ")),
                    "{key} of {spread:?} not at {at:.2}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::read::{assert_drawn_at_their_values, elements, of_class};
    use super::*;

    fn figure(scale: Scale, reference: Option<f64>) -> Figure {
        Figure {
            title: "a <chart> & its \"title\"".into(),
            notes: vec!["one note".into()],
            panels: vec![Panel {
                title: "time".into(),
                scale,
                series: vec!["go".into(), "rust".into()],
                reference,
                groups: vec![
                    Group {
                        label: "first".into(),
                        bars: vec![
                            Bar {
                                series: 0,
                                value: Some(4.0),
                                spread: Some((3.0, 6.0)),
                                text: "4 ms".into(),
                            },
                            Bar {
                                series: 1,
                                value: Some(0.5),
                                spread: None,
                                text: "0.5 ms".into(),
                            },
                        ],
                    },
                    Group {
                        label: "second".into(),
                        bars: vec![Bar {
                            series: 1,
                            value: None,
                            spread: None,
                            text: "no ratio".into(),
                        }],
                    },
                ],
            }],
        }
    }

    #[test]
    fn every_bar_carries_its_value_and_is_drawn_at_it() {
        for (scale, reference) in [
            (Scale::Linear, None),
            (Scale::Log, None),
            (Scale::Log, Some(1.0)),
        ] {
            let svg = figure(scale, reference).to_svg();
            let all = elements(&svg);
            let bars = of_class(&all, "bar");
            let values: Vec<(&str, &str, f64)> = bars
                .iter()
                .map(|b| {
                    (
                        b.attr("data-group"),
                        b.attr("data-series"),
                        b.number("data-value"),
                    )
                })
                .collect();
            assert_eq!(
                values,
                [("first", "go", 4.0), ("first", "rust", 0.5)],
                "{svg}"
            );
            assert_eq!(bars[0].title, "first — go: 4 ms");
            assert_drawn_at_their_values(&all);
            let spreads = of_class(&all, "spread");
            assert_eq!(spreads.len(), 1);
            assert_eq!(
                (spreads[0].number("data-min"), spreads[0].number("data-max")),
                (3.0, 6.0)
            );
            let missing = of_class(&all, "missing");
            assert_eq!(missing.len(), 1);
            assert_eq!(missing[0].attr("data-group"), "second");
            assert_eq!(missing[0].text, "rust: no ratio");
            // Escaped text reads back as written.
            assert!(all.iter().any(|e| e.text == "a <chart> & its \"title\""));
        }
    }

    #[test]
    fn a_log_axis_spans_whole_decades_and_bars_start_at_the_reference() {
        let svg = figure(Scale::Log, Some(1.0)).to_svg();
        let all = elements(&svg);
        let panel = all.iter().find(|e| e.attr("class") == "panel").unwrap();
        assert_eq!(
            (
                panel.number("data-domain-min"),
                panel.number("data-domain-max")
            ),
            (0.1, 10.0)
        );
        let bars = of_class(&all, "bar");
        let one = bars[0].x_of(1.0);
        // 4 is right of 1x, 0.5 left of it; both bars touch 1x.
        assert!((bars[0].number("x") - one).abs() < 0.02);
        assert!((bars[1].number("x") + bars[1].number("width") - one).abs() < 0.02);
    }

    #[test]
    fn a_linear_axis_starts_at_zero_and_ends_on_the_tick_above_the_highest_value() {
        let all = elements(&figure(Scale::Linear, None).to_svg());
        let panel = all.iter().find(|e| e.attr("class") == "panel").unwrap();
        // The highest value is the spread's 6; ticks every 2.
        assert_eq!(
            (
                panel.number("data-domain-min"),
                panel.number("data-domain-max")
            ),
            (0.0, 6.0)
        );
        assert_eq!(nice_ceiling(6.0), 10.0);
        assert_eq!(nice_ceiling(4470.0), 5000.0);
        assert_eq!(nice_ceiling(0.3), 0.5);
        assert_eq!(nice_ceiling(200.0), 200.0);
    }
}
