//! `bench-report`: the reports of the `hack/bench-*` scripts, from the raw numbers a run saves
//! (medians, ratios, markdown tables), and the splice that puts a report into a README.
//!
//! Each script writes its run's measurements to a results file, starting with the lines of
//! `bench-report stamp` (the run's date and commit), and renders its report from the file, so
//! `REPORT_FROM=FILE hack/bench-...` renders a saved run again without running anything.
//! One module per report; `results.rs` reads the files, `stats.rs` holds the statistics, and
//! `chart.rs` draws a report's tables as SVG (`--charts DIR`; `fairness.rs` charts the table
//! `hack/bench-fairness` prints itself).

mod chart;
mod error;
mod fairness;
mod informer;
mod results;
mod sample_controller;
mod shard_watches;
mod sharding;
mod splice;
mod stamp;
mod stats;
mod vm_controller;
mod workqueue;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use chart::Figure;
use error::ReportError;
use results::Results;
use stamp::Stamp;

const USAGE: &str = "usage: bench-report COMMAND ...
  stamp [--line]                  the run's `# date:` and `# commit:` lines (--line: `DATE at COMMIT`)
  informer RESULTS [--charts DIR]      hack/bench-informer's tables
  vs-client-go RESULTS [--charts DIR]  hack/bench-vs-client-go's tables
  fairness OUTPUT --charts DIR    the chart of hack/bench-fairness's table (OUTPUT: what it printed)
  sharding RESULTS                hack/bench-sharding's table
  vm-controller RESULTS           hack/bench-vm-controller's table
  sample-controller RESULTS       hack/bench-sample-controller's table
  shard-watches RESULTS           hack/bench-shard-watches's table
  splice DOCUMENT NAME REPORT     REPORT's text, fenced, between DOCUMENT's
                                  `<!-- NAME:start -->` and `<!-- NAME:end -->` lines
--charts DIR also writes an SVG chart of each table into DIR (made if missing) and names
each file on stderr.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench-report: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one command; what it prints on success.
fn run(args: &[String]) -> Result<String, ReportError> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["stamp"] => Ok(Stamp::now()?.meta_lines()),
        ["stamp", "--line"] => {
            let stamp = Stamp::now()?;
            Ok(format!("{} at {}\n", stamp.date, stamp.commit))
        }
        ["informer", file] => informer::render(&Results::read(Path::new(file))?),
        ["informer", file, "--charts", dir] => {
            let results = Results::read(Path::new(file))?;
            write_charts(Path::new(dir), informer::charts(&results)?)?;
            informer::render(&results)
        }
        ["vs-client-go", file] => workqueue::render(&Results::read(Path::new(file))?),
        ["vs-client-go", file, "--charts", dir] => {
            let results = Results::read(Path::new(file))?;
            write_charts(Path::new(dir), workqueue::charts(&results)?)?;
            workqueue::render(&results)
        }
        ["fairness", file, "--charts", dir] => {
            let text = read(Path::new(file))?;
            let chart = fairness::chart(&text)?;
            write_charts(Path::new(dir), vec![chart])?;
            Ok(String::new())
        }
        ["sharding", file] => sharding::render(&Results::read(Path::new(file))?),
        ["vm-controller", file] => vm_controller::render(&Results::read(Path::new(file))?),
        ["sample-controller", file] => sample_controller::render(&Results::read(Path::new(file))?),
        ["shard-watches", file] => shard_watches::render(&Results::read(Path::new(file))?),
        ["splice", document, name, report] => {
            splice_file(Path::new(document), name, Path::new(report))?;
            Ok(String::new())
        }
        [] => Err(ReportError::Usage("no command".into())),
        [command, ..] => Err(ReportError::Usage(format!(
            "`{command}` with these arguments is not a command"
        ))),
    }
}

/// Writes each `(file name, figure)` into `dir` as SVG, naming each file on stderr.
fn write_charts(dir: &Path, charts: Vec<(String, Figure)>) -> Result<(), ReportError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| ReportError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    for (name, figure) in charts {
        let path = dir.join(name);
        std::fs::write(&path, figure.to_svg()).map_err(io(&path))?;
        eprintln!("bench-report: wrote {}", path.display());
    }
    Ok(())
}

/// The text of the file at `path`.
fn read(path: &Path) -> Result<String, ReportError> {
    std::fs::read_to_string(path).map_err(|source| ReportError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Splices the report at `report` into the document at `document`, which is written only if
/// its markers are right.
fn splice_file(document: &Path, name: &str, report: &Path) -> Result<(), ReportError> {
    let text = splice::splice(&read(document)?, name, &read(report)?).map_err(|detail| {
        ReportError::Marker {
            path: document.to_owned(),
            detail,
        }
    })?;
    std::fs::write(document, text).map_err(|source| ReportError::Io {
        path: PathBuf::from(document),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::run;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn an_unknown_command_or_arguments_say_how_to_call() {
        let error = run(&args("medians x")).unwrap_err().to_string();
        assert!(
            error.starts_with(
                "`medians` with these arguments is not a command\n\nusage: bench-report"
            ),
            "{error}"
        );
        let error = run(&args("vs-client-go /dev/null --stat best"))
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("`vs-client-go` with these arguments is not a command"),
            "{error}"
        );
    }

    #[test]
    fn charts_are_written_into_the_directory_named_and_the_report_is_still_printed() {
        let dir = std::env::temp_dir().join(format!("bench-report-charts-{}", std::process::id()));
        let results = dir.join("results");
        let charts = dir.join("charts");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            &results,
            "# date: d\n# commit: c\n# client-go: v0\n# rounds: 1\n# load: l\n10 random/none/typed client-go objects=10 synced_ms=5 peak_rss_kib=100\n",
        )
        .unwrap();
        let report = run(&[
            "informer".into(),
            results.display().to_string(),
            "--charts".into(),
            charts.display().to_string(),
        ])
        .unwrap();
        assert!(
            report.contains("N=10, data/transform/store=random/none/typed"),
            "{report}"
        );
        let svg = std::fs::read_to_string(charts.join("informer-10.svg")).unwrap();
        assert!(svg.starts_with("<svg "), "{svg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_splice_with_a_missing_marker_leaves_the_document_alone() {
        let dir = std::env::temp_dir().join(format!("bench-report-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let document = dir.join("README.md");
        let report = dir.join("report");
        std::fs::write(&document, "<!-- t:start -->\nold\n").unwrap();
        std::fs::write(&report, "new\n").unwrap();
        let error = run(&[
            "splice".into(),
            document.display().to_string(),
            "t".into(),
            report.display().to_string(),
        ])
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("{}: no `<!-- t:end -->` line", document.display())
        );
        assert_eq!(
            std::fs::read_to_string(&document).unwrap(),
            "<!-- t:start -->\nold\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
