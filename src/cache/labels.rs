//! Label selectors: apimachinery `pkg/labels` (`selector.go`), the subset listers need.
//!
//! Grammar (comma-separated requirements, all must hold):
//! `key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (v1,v2)`,
//! `key notin (v1,v2)`. The empty string selects everything.
//!
//! Semantics follow Kubernetes: `!=` and `notin` also match objects without the label.
//! Not supported (an error, never silently ignored): the numeric `gt` / `lt` operators.

use std::collections::{BTreeMap, BTreeSet};

/// A parsed label selector. `LabelSelector::default()` selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key` present.
    Exists(String),
    /// `!key`: label absent.
    DoesNotExist(String),
    /// `key=value`.
    Equals(String, String),
    /// `key!=value` (true when absent).
    NotEquals(String, String),
    /// `key in (...)`.
    In(String, BTreeSet<String>),
    /// `key notin (...)` (true when absent).
    NotIn(String, BTreeSet<String>),
}

/// A selector string that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector {selector:?}: {problem}")]
pub struct LabelSelectorError {
    /// The whole selector as given.
    pub selector: String,
    /// What is wrong with it.
    pub problem: String,
}

impl LabelSelector {
    /// Selects everything.
    pub fn everything() -> Self {
        Self::default()
    }

    /// Parses a selector string.
    pub fn parse(selector: &str) -> Result<Self, LabelSelectorError> {
        let err = |problem: String| LabelSelectorError {
            selector: selector.to_string(),
            problem,
        };
        let mut requirements = Vec::new();
        for part in split_top_level(selector).map_err(&err)? {
            let part = part.trim();
            if part.is_empty() {
                if selector.trim().is_empty() {
                    continue;
                }
                return Err(err("empty requirement (stray comma?)".into()));
            }
            requirements.push(parse_requirement(part).map_err(&err)?);
        }
        Ok(Self { requirements })
    }

    /// A selector from `matchLabels` (all equalities).
    pub fn from_match_labels(labels: &BTreeMap<String, String>) -> Self {
        Self {
            requirements: labels
                .iter()
                .map(|(k, v)| Requirement::Equals(k.clone(), v.clone()))
                .collect(),
        }
    }

    /// Whether the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, in the order given.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether an object with `labels` is selected.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k));
        self.requirements.iter().all(|r| match r {
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::DoesNotExist(k) => get(k).is_none(),
            Requirement::Equals(k, v) => get(k) == Some(v),
            Requirement::NotEquals(k, v) => get(k) != Some(v),
            Requirement::In(k, vs) => get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|v| !vs.contains(v)),
        })
    }
}

impl std::str::FromStr for LabelSelector {
    type Err = LabelSelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl std::fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |vs: &BTreeSet<String>| vs.iter().cloned().collect::<Vec<_>>().join(",");
        let parts: Vec<String> = self
            .requirements
            .iter()
            .map(|r| match r {
                Requirement::Exists(k) => k.clone(),
                Requirement::DoesNotExist(k) => format!("!{k}"),
                Requirement::Equals(k, v) => format!("{k}={v}"),
                Requirement::NotEquals(k, v) => format!("{k}!={v}"),
                Requirement::In(k, vs) => format!("{k} in ({})", set(vs)),
                Requirement::NotIn(k, vs) => format!("{k} notin ({})", set(vs)),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => {
                if depth > 0 {
                    return Err("nested parentheses".into());
                }
                depth += 1;
            }
            ')' => {
                if depth == 0 {
                    return Err("unbalanced ')'".into());
                }
                depth -= 1;
            }
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced '('".into());
    }
    parts.push(&s[start..]);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        let key = key.trim();
        check_key(key)?;
        return Ok(Requirement::DoesNotExist(key.to_string()));
    }
    if let Some((k, v)) = part.split_once("!=") {
        let (k, v) = (k.trim(), v.trim());
        check_key(k)?;
        check_value(v)?;
        return Ok(Requirement::NotEquals(k.into(), v.into()));
    }
    if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
        let (k, v) = (k.trim(), v.trim());
        check_key(k)?;
        check_value(v)?;
        return Ok(Requirement::Equals(k.into(), v.into()));
    }
    if part.contains('>') || part.contains('<') {
        return Err(format!("{part:?}: the gt/lt operators are not supported"));
    }
    let mut words = part.splitn(2, char::is_whitespace);
    let key = words.next().unwrap_or("").trim();
    let rest = words.next().unwrap_or("").trim();
    if rest.is_empty() {
        check_key(key)?;
        return Ok(Requirement::Exists(key.to_string()));
    }
    check_key(key)?;
    let (op, set) = if let Some(s) = rest.strip_prefix("notin") {
        ("notin", s)
    } else if let Some(s) = rest.strip_prefix("in") {
        ("in", s)
    } else {
        return Err(format!(
            "{part:?}: expected one of =, ==, !=, in, notin after key {key:?}"
        ));
    };
    let set = set.trim();
    let inner = set
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("{part:?}: {op} needs a parenthesised value list"))?;
    let mut values = BTreeSet::new();
    for v in inner.split(',') {
        let v = v.trim();
        check_value(v)?;
        values.insert(v.to_string());
    }
    if values.is_empty() || inner.trim().is_empty() {
        return Err(format!("{part:?}: {op} needs at least one value"));
    }
    Ok(if op == "in" {
        Requirement::In(key.into(), values)
    } else {
        Requirement::NotIn(key.into(), values)
    })
}

/// A label key: optional DNS prefix and `/`, then a name of letters, digits, `-_.`.
fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("empty label key".into());
    }
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && (p.is_empty()
            || !p
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'))
    {
        return Err(format!("label key {key:?} has an invalid prefix"));
    }
    if name.is_empty()
        || name.len() > 63
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
    {
        return Err(format!("invalid label key {key:?}"));
    }
    Ok(())
}

/// A label value: empty, or up to 63 letters, digits, `-_.`.
fn check_value(v: &str) -> Result<(), String> {
    if v.len() > 63
        || !v
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
    {
        return Err(format!("invalid label value {v:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    // apimachinery: TestSelectorMatches (table)
    #[test]
    fn selector_matches_table() {
        let l = labels(&[("app", "web"), ("tier", "front"), ("env", "prod")]);
        let cases: &[(&str, bool)] = &[
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app!=web", false),
            ("missing!=x", true),
            ("app in (web,db)", true),
            ("app in (db)", false),
            ("app notin (db)", true),
            ("missing notin (db)", true),
            ("app notin (web)", false),
            ("missing in (x)", false),
            ("tier", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app=web,tier=front", true),
            ("app=web,tier=back", false),
            ("app in (web, db), env notin (dev,test), !missing", true),
        ];
        for (sel, want) in cases {
            let s = LabelSelector::parse(sel).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(s.matches(Some(&l)), *want, "selector {sel:?}");
        }
        // No labels at all.
        assert!(LabelSelector::parse("!a").unwrap().matches(None));
        assert!(!LabelSelector::parse("a").unwrap().matches(None));
    }

    // apimachinery: TestSelectorParse errors
    #[test]
    fn bad_selectors_are_errors_naming_the_selector() {
        for bad in [
            "app in web",
            "app in ()",
            "a,,b",
            "app in (a,(b))",
            "x>1",
            "app=we b",
            "=x",
            "app in (a",
            "app foo (a)",
        ] {
            let err = LabelSelector::parse(bad).unwrap_err();
            assert_eq!(err.selector, bad);
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[test]
    fn display_round_trips() {
        let s = LabelSelector::parse("a=b, c in (x,y),!d,e!=f,g notin (z),h").unwrap();
        let again = LabelSelector::parse(&s.to_string()).unwrap();
        assert_eq!(s, again);
        assert_eq!(s.requirements().len(), 6);
    }
}
