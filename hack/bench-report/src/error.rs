//! [`ReportError`]: what can go wrong while reading a run's results, rendering its report or
//! splicing it into a document. Each variant names the file, line or key at fault.

use std::fmt;
use std::path::PathBuf;

/// Why a report could not be made.
#[derive(Debug)]
pub enum ReportError {
    /// The command line is not one this program takes.
    Usage(String),
    /// Reading or writing a file failed.
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// A results file lacks a `# key: value` line the report needs.
    MissingMeta {
        /// The key.
        key: String,
    },
    /// A `# key: value` line of a results file holds no number where one is needed.
    BadMeta {
        /// The key.
        key: String,
        /// Its value.
        value: String,
    },
    /// A bench's printed output lacks a line the chart needs (named).
    MissingLine(String),
    /// A line of a results file is not what its report expects.
    BadLine {
        /// The line's number (from 1).
        line: usize,
        /// What is wrong with it.
        detail: String,
    },
    /// The document to splice into has no usable pair of markers.
    Marker {
        /// The document.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// `git rev-parse` failed while stamping a run.
    Git(String),
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReportError::Usage(detail) => write!(f, "{detail}\n\n{}", crate::USAGE),
            ReportError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            ReportError::MissingMeta { key } => {
                write!(f, "the results have no `# {key}: ...` line")
            }
            ReportError::BadMeta { key, value } => {
                write!(f, "the results' `# {key}: {value}` is not a number")
            }
            ReportError::MissingLine(what) => write!(f, "the bench's output has no {what}"),
            ReportError::BadLine { line, detail } => write!(f, "results line {line}: {detail}"),
            ReportError::Marker { path, detail } => write!(f, "{}: {detail}", path.display()),
            ReportError::Git(detail) => write!(f, "git rev-parse --short HEAD: {detail}"),
        }
    }
}

impl std::error::Error for ReportError {}
