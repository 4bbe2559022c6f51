//! `bench-report`: the reports of the `hack/bench-*` scripts, from the raw numbers a run saves
//! (medians, ratios, markdown tables), and the splice that puts a report into a README.
//!
//! Each script writes its run's measurements to a results file, starting with the lines of
//! `bench-report stamp` (the run's date and commit), and renders its report from the file, so
//! `REPORT_FROM=FILE hack/bench-...` renders a saved run again without running anything.
//! One module per report; `results.rs` reads the files, `stats.rs` holds the statistics.

mod error;
mod informer;
mod results;
mod sharding;
mod splice;
mod stamp;
mod stats;
mod vm_controller;
mod workqueue;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use error::ReportError;
use results::Results;
use stamp::Stamp;

const USAGE: &str = "usage: bench-report COMMAND ...
  stamp [--line]                  the run's `# date:` and `# commit:` lines (--line: `DATE at COMMIT`)
  informer RESULTS                hack/bench-informer's tables
  vs-client-go RESULTS            hack/bench-vs-client-go's tables
  sharding RESULTS                hack/bench-sharding's table
  vm-controller RESULTS           hack/bench-vm-controller's table
  splice DOCUMENT NAME REPORT     REPORT's text, fenced, between DOCUMENT's
                                  `<!-- NAME:start -->` and `<!-- NAME:end -->` lines";

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
        ["vs-client-go", file] => workqueue::render(&Results::read(Path::new(file))?),
        ["sharding", file] => sharding::render(&Results::read(Path::new(file))?),
        ["vm-controller", file] => vm_controller::render(&Results::read(Path::new(file))?),
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

/// Splices the report at `report` into the document at `document`, which is written only if
/// its markers are right.
fn splice_file(document: &Path, name: &str, report: &Path) -> Result<(), ReportError> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|source| ReportError::Io {
            path: path.to_owned(),
            source,
        })
    };
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
