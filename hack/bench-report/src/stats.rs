//! [`Samples`]: the rounds of one figure, and the statistics the reports take of them.
//!
//! The median is the lower middle value (the `(n + 1) / 2`-th smallest), so a reported median
//! is always a value some round measured, for an even count too; the awk these reports replace
//! took the same one, and the published tables were made with it.

/// The values one figure took over the rounds of a run, sorted, each with its text as the
/// run printed it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Samples {
    /// Sorted by value; equal values keep the order they were added in.
    values: Vec<(f64, String)>,
}

impl Samples {
    /// Adds one round's value, as text; an error names what is not a number.
    pub fn add(&mut self, text: &str) -> Result<(), String> {
        let value: f64 = text
            .parse()
            .map_err(|_| format!("`{text}` is not a number"))?;
        let at = self.values.partition_point(|(v, _)| *v <= value);
        self.values.insert(at, (value, text.to_owned()));
        Ok(())
    }

    /// How many values.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Samples of the given values, for tests.
    #[cfg(test)]
    pub fn of(texts: &[&str]) -> Self {
        let mut samples = Samples::default();
        for text in texts {
            samples.add(text).unwrap();
        }
        samples
    }

    /// The lower median: the middle value of an odd count, the lower middle of an even one.
    pub fn median(&self) -> Option<f64> {
        self.median_text()
            .map(|_| self.values[self.median_index()].0)
    }

    /// The median as the run printed it (`10001`, not `10001.0`).
    pub fn median_text(&self) -> Option<&str> {
        (!self.values.is_empty()).then(|| self.values[self.median_index()].1.as_str())
    }

    /// The smallest value.
    pub fn min(&self) -> Option<f64> {
        self.values.first().map(|(v, _)| *v)
    }

    /// The largest value.
    pub fn max(&self) -> Option<f64> {
        self.values.last().map(|(v, _)| *v)
    }

    /// The distinct values, smallest first, as the run printed each first.
    pub fn distinct_texts(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        let mut last = None;
        for (v, text) in &self.values {
            if last != Some(*v) {
                out.push(text);
                last = Some(*v);
            }
        }
        out
    }

    fn median_index(&self) -> usize {
        // The (n + 1) / 2-th smallest, counting from 1.
        self.values.len().div_ceil(2) - 1
    }
}

/// `a / b` as the tables print a ratio: two decimals and an `x` (`1.38x`).
pub fn ratio(a: f64, b: f64) -> String {
    format!("{:.2}x", a / b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_odd_count_is_the_middle_value() {
        let samples = Samples::of(&["30", "10", "20"]);
        assert_eq!(samples.median(), Some(20.0));
    }

    #[test]
    fn the_median_of_an_even_count_is_the_lower_middle_value() {
        assert_eq!(Samples::of(&["4", "1", "3", "2"]).median(), Some(2.0));
        assert_eq!(Samples::of(&["7", "5"]).median(), Some(5.0));
        assert_eq!(Samples::of(&["5"]).median(), Some(5.0));
    }

    #[test]
    fn values_sort_as_numbers_not_as_text() {
        let samples = Samples::of(&["9", "10", "100", "2.5"]);
        assert_eq!(samples.min(), Some(2.5));
        assert_eq!(samples.max(), Some(100.0));
        assert_eq!(samples.median(), Some(9.0));
    }

    #[test]
    fn the_median_keeps_the_text_the_run_printed() {
        assert_eq!(
            Samples::of(&["10001", "10000"]).median_text(),
            Some("10000")
        );
        assert_eq!(Samples::of(&["1.50"]).median_text(), Some("1.50"));
    }

    #[test]
    fn distinct_values_are_listed_once_smallest_first() {
        let samples = Samples::of(&["10001", "10000", "10001.0", "9999"]);
        assert_eq!(samples.distinct_texts(), ["9999", "10000", "10001"]);
        assert!(Samples::default().distinct_texts().is_empty());
    }

    #[test]
    fn no_samples_have_no_median() {
        let samples = Samples::default();
        assert_eq!(samples.median(), None);
        assert_eq!(samples.median_text(), None);
    }

    #[test]
    fn a_value_that_is_not_a_number_is_refused_by_name() {
        let mut samples = Samples::default();
        assert_eq!(samples.add("n/a"), Err("`n/a` is not a number".to_owned()));
    }

    #[test]
    fn a_ratio_has_two_decimals_and_an_x() {
        assert_eq!(ratio(228.0, 165.0), "1.38x");
        assert_eq!(ratio(1.0, 3.0), "0.33x");
        assert_eq!(ratio(5.0, 1.0), "5.00x");
    }
}
