//! [`splice`]: a report put into a document (README.md, benches/README.md) as a fenced block
//! between two marker comments, `<!-- NAME:start -->` and `<!-- NAME:end -->`, each on a line of
//! its own. Only the lines between the markers change; a document without exactly one pair
//! is left alone and the error says which marker is wrong.

/// `document` with the lines between the `NAME` markers replaced by `report` in a ```` ``` ````
/// fence, or what is wrong with the markers.
pub fn splice(document: &str, name: &str, report: &str) -> Result<String, String> {
    let start = format!("<!-- {name}:start -->");
    let end = format!("<!-- {name}:end -->");
    let lines: Vec<&str> = document.split_inclusive('\n').collect();
    let find = |marker: &str| -> Result<usize, String> {
        let found: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].contains(marker))
            .collect();
        match found.as_slice() {
            [one] => Ok(*one),
            [] => Err(format!("no `{marker}` line")),
            [first, second, ..] => Err(format!(
                "`{marker}` on more than one line ({} and {})",
                first + 1,
                second + 1
            )),
        }
    };
    let (start_at, end_at) = (find(&start)?, find(&end)?);
    if end_at < start_at {
        return Err(format!(
            "`{end}` (line {}) comes before `{start}` (line {})",
            end_at + 1,
            start_at + 1
        ));
    }
    let mut out: String = lines[..=start_at].concat();
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str("```\n");
    out.push_str(report);
    if !report.is_empty() && !report.ends_with('\n') {
        out.push('\n');
    }
    out.push_str("```\n");
    out.push_str(&lines[end_at..].concat());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::splice;

    const DOC: &str =
        "# Bench\nintro\n<!-- t:start -->\n```\nold table\n```\n<!-- t:end -->\nafter\n";

    #[test]
    fn only_the_lines_between_the_markers_change() {
        let out = splice(DOC, "t", "new 1\nnew 2\n").unwrap();
        assert_eq!(
            out,
            "# Bench\nintro\n<!-- t:start -->\n```\nnew 1\nnew 2\n```\n<!-- t:end -->\nafter\n"
        );
    }

    #[test]
    fn a_report_without_a_final_newline_gets_one_and_the_document_end_is_kept() {
        let doc = "<!-- t:start -->\n<!-- t:end -->";
        assert_eq!(
            splice(doc, "t", "row").unwrap(),
            "<!-- t:start -->\n```\nrow\n```\n<!-- t:end -->"
        );
    }

    #[test]
    fn splicing_twice_is_splicing_once() {
        let once = splice(DOC, "t", "new\n").unwrap();
        assert_eq!(splice(&once, "t", "new\n").unwrap(), once);
    }

    #[test]
    fn a_missing_marker_is_named_and_nothing_is_written() {
        let no_end = "<!-- t:start -->\nold\nrest of the document\n";
        assert_eq!(
            splice(no_end, "t", "new\n").unwrap_err(),
            "no `<!-- t:end -->` line"
        );
        assert_eq!(
            splice("text\n", "t", "new\n").unwrap_err(),
            "no `<!-- t:start -->` line"
        );
        // Another report's markers are not this one's.
        assert_eq!(
            splice(DOC, "other", "new\n").unwrap_err(),
            "no `<!-- other:start -->` line"
        );
    }

    #[test]
    fn markers_out_of_order_or_twice_are_refused() {
        let reversed = "<!-- t:end -->\n<!-- t:start -->\n";
        assert_eq!(
            splice(reversed, "t", "x\n").unwrap_err(),
            "`<!-- t:end -->` (line 1) comes before `<!-- t:start -->` (line 2)"
        );
        let twice = "<!-- t:start -->\n<!-- t:start -->\n<!-- t:end -->\n";
        assert_eq!(
            splice(twice, "t", "x\n").unwrap_err(),
            "`<!-- t:start -->` on more than one line (1 and 2)"
        );
    }
}
