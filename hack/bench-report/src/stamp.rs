//! [`Stamp`]: the date (UTC) and commit of a run, which every report's first line carries.
//! A script records it in its results file when the run starts (`bench-report stamp`), so a
//! report rendered later from the file still names the run, not the rendering.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::ReportError;

/// When and on what code a run happened.
#[derive(Debug, PartialEq, Eq)]
pub struct Stamp {
    /// `YYYY-MM-DD`, UTC.
    pub date: String,
    /// `git rev-parse --short HEAD` of the working directory's repository.
    pub commit: String,
}

impl Stamp {
    /// Today's date and the checked-out commit.
    pub fn now() -> Result<Self, ReportError> {
        let seconds = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let output = Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .output()
            .map_err(|e| ReportError::Git(e.to_string()))?;
        if !output.status.success() {
            return Err(ReportError::Git(
                String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            ));
        }
        Ok(Stamp {
            date: utc_date(seconds),
            commit: String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        })
    }

    /// The `# date:` and `# commit:` lines of a results file.
    pub fn meta_lines(&self) -> String {
        format!("# date: {}\n# commit: {}\n", self.date, self.commit)
    }
}

/// `YYYY-MM-DD` of a Unix time, UTC (Howard Hinnant's `civil_from_days`).
fn utc_date(unix_seconds: u64) -> String {
    let days = (unix_seconds / 86_400) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_times_become_utc_dates() {
        assert_eq!(utc_date(0), "1970-01-01");
        // 2026-11-26 21:13:52 UTC, and the last second of that day.
        assert_eq!(utc_date(1_795_727_632), "2026-11-26");
        assert_eq!(utc_date(1_795_737_599), "2026-11-26");
        assert_eq!(utc_date(1_795_737_600), "2026-11-27");
        // A leap day and the turn of a century that is a leap year.
        assert_eq!(utc_date(1_709_164_800), "2024-02-29");
        assert_eq!(utc_date(951_782_400), "2000-02-29");
        assert_eq!(utc_date(978_307_199), "2000-12-31");
    }

    #[test]
    fn the_meta_lines_are_what_results_read() {
        let stamp = Stamp {
            date: "2026-11-26".into(),
            commit: "abc1234".into(),
        };
        let results = crate::results::Results::parse(&stamp.meta_lines());
        assert_eq!(results.stamp().unwrap(), "2026-11-26 at abc1234");
    }
}
