//! [`Results`]: a run's raw numbers as a `hack/bench-*` script saves them, one line per
//! measurement (whitespace-separated fields, the script's own layout), and `# key: value`
//! lines that describe the run (its date and commit, the machine's load, its settings), so
//! that a saved file renders the same report later (`REPORT_FROM=FILE hack/bench-...`).

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::ReportError;

/// A parsed results file.
#[derive(Debug, Default)]
pub struct Results {
    meta: BTreeMap<String, String>,
    lines: Vec<Line>,
}

/// One measurement line.
#[derive(Debug)]
pub struct Line {
    /// Its number in the file, from 1, for errors.
    pub number: usize,
    /// Its whitespace-separated fields.
    pub fields: Vec<String>,
}

impl Results {
    /// Reads and parses the file at `path`.
    pub fn read(path: &Path) -> Result<Self, ReportError> {
        let text = std::fs::read_to_string(path).map_err(|source| ReportError::Io {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self::parse(&text))
    }

    /// Parses a results file's text: `# key: value` lines (a later one wins), measurement
    /// lines, and blank lines, which are skipped.
    pub fn parse(text: &str) -> Self {
        let mut results = Results::default();
        for (i, line) in text.lines().enumerate() {
            if let Some(comment) = line.strip_prefix('#') {
                if let Some((key, value)) = comment.split_once(':') {
                    results
                        .meta
                        .insert(key.trim().to_owned(), value.trim().to_owned());
                }
                continue;
            }
            let fields: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
            if !fields.is_empty() {
                results.lines.push(Line {
                    number: i + 1,
                    fields,
                });
            }
        }
        results
    }

    /// The value of the `# key: value` line, or an error naming the key.
    pub fn meta(&self, key: &str) -> Result<&str, ReportError> {
        self.meta
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| ReportError::MissingMeta {
                key: key.to_owned(),
            })
    }

    /// A `# key: value` line's value as a number.
    pub fn meta_number(&self, key: &str) -> Result<f64, ReportError> {
        let text = self.meta(key)?;
        text.parse().map_err(|_| ReportError::BadMeta {
            key: key.to_owned(),
            value: text.to_owned(),
        })
    }

    /// `<date> at <commit>`, from the `# date:` and `# commit:` lines: the stamp every report's
    /// first line carries.
    pub fn stamp(&self) -> Result<String, ReportError> {
        Ok(format!(
            "{} at {}",
            self.meta("date")?,
            self.meta("commit")?
        ))
    }

    /// The measurement lines, in file order.
    pub fn lines(&self) -> &[Line] {
        &self.lines
    }
}

impl Line {
    /// The `key=value` fields of the line from field `from` on, in order.
    pub fn pairs(&self, from: usize) -> Result<Vec<(&str, &str)>, ReportError> {
        self.fields
            .iter()
            .skip(from)
            .map(|field| {
                field
                    .split_once('=')
                    .ok_or_else(|| self.error(format!("`{field}` is not key=value")))
            })
            .collect()
    }

    /// The value of the `key=value` field named `key`.
    pub fn value(&self, key: &str) -> Result<&str, ReportError> {
        self.fields
            .iter()
            .filter_map(|field| field.split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
            .ok_or_else(|| self.error(format!("no {key}=")))
    }

    /// The `key=value` field named `key`, as a number.
    pub fn number(&self, key: &str) -> Result<f64, ReportError> {
        let text = self.value(key)?;
        text.parse()
            .map_err(|_| self.error(format!("{key}={text} is not a number")))
    }

    /// An error about this line.
    pub fn error(&self, detail: String) -> ReportError {
        ReportError::BadLine {
            line: self.number,
            detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# date: 2026-11-26\n# commit: abc1234\n\n10000 random/none/typed kubeloop objects=10001 synced_ms=228\n";

    #[test]
    fn meta_lines_describe_the_run_and_the_rest_are_measurements() {
        let results = Results::parse(FILE);
        assert_eq!(results.stamp().unwrap(), "2026-11-26 at abc1234");
        assert_eq!(results.lines().len(), 1);
        let line = &results.lines()[0];
        assert_eq!(line.number, 4);
        assert_eq!(line.fields[2], "kubeloop");
        assert_eq!(
            line.pairs(3).unwrap(),
            [("objects", "10001"), ("synced_ms", "228")]
        );
        assert_eq!(line.number("synced_ms").unwrap(), 228.0);
    }

    #[test]
    fn a_missing_meta_line_is_named() {
        let error = Results::parse("1 2 3\n").stamp().unwrap_err();
        assert_eq!(error.to_string(), "the results have no `# date: ...` line");
    }

    #[test]
    fn a_bad_field_names_its_line() {
        let results = Results::parse("# date: x\nreplicas=1 oops\n");
        let error = results.lines()[0].pairs(0).unwrap_err();
        assert_eq!(error.to_string(), "results line 2: `oops` is not key=value");
        let error = results.lines()[0].number("reconciles").unwrap_err();
        assert_eq!(error.to_string(), "results line 2: no reconciles=");
    }
}
