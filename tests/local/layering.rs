//! The library's layering, kept by a check (issue 35): which files of `src` import
//! which, read from the sources, two rules on the graph and two on what is public. Cargo keeps
//! the rest: the harness (`kubeloop-testenv`) and the command line (`kubeloop-cli`) are packages
//! that depend on the library, so the library cannot import them.
//!
//! 1. No import circles between files, of any length: a circle is a strongly connected
//!    component of more than one file (Tarjan). The only ones allowed are listed in
//!    [`ALLOWED_CYCLES`], each with the issue that will remove it; a listed circle that is no
//!    longer there fails the check too, so the list shrinks when the circle is broken.
//! 2. The layers point down: the machinery (backoff.rs, cache, client, workqueue,
//!    leaderelection, record, runtime, trace.rs, testing.rs) reaches neither ops nor
//!    controller; backoff.rs, cache, client, workqueue, leaderelection and record do not reach
//!    runtime.
//! 3. Modules are public only at the top level: only `lib.rs` declares a `pub mod` (outside any
//!    inline module), and no `pub use` re-exports a public module, so below the top level an
//!    item is public only through its parent's `pub use`s (STYLE.md: modules private,
//!    re-exported from the parent), under one path. `pub(crate) mod` is not public. The
//!    exceptions are listed in [`ALLOWED_PUBLIC_MODULES`], each with its reason (the two
//!    controllers' namespaces, `kubeloop::controller::{sample, vm}`); a listed module that is
//!    no longer public fails the check too.
//! 4. One public path per item: an item is not re-exported (`pub use`) by two public modules,
//!    nor by one beside the public module that defines it. The exceptions would be listed in
//!    [`ALLOWED_SECOND_PATHS`] (there are none), each with its owner; a listed one that is
//!    gone fails too.
//!
//! The reader is a token scanner, not a Rust parser. It drops comments and string literals,
//! skips `#[cfg(test)]` items and the files that are test modules (test code imports freely),
//! and takes two kinds of paths: every leaf of a `use` tree, and every path in code that starts
//! with `crate::`, `super::` or `self::`. A path resolves to the file of the deepest module it
//! names (`a/b.rs` or `a/b/mod.rs`); an item after that resolves to the file of that module,
//! unless the module only re-exports it (`pub use x::Item` in a `mod.rs`), in which case it
//! resolves, as the compiler does, to the file that defines it. A `mod.rs`'s own `pub use`
//! lines are imports like any other: a `mod.rs` that defines something its children use and
//! also re-exports them is a circle, which is why module roots hold `mod` lines and `pub use`s
//! only (STYLE.md, "Thin module roots"). An inline `mod x { .. }` that is not a test module is
//! read as part of its file (the library has none).
//!
//! Run it alone with `cargo test --all-features --test local layering -- --nocapture` to see the
//! graph's circles printed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

/// The circles still allowed, each as its set of files, with the issue that owns it. The check
/// fails when a listed circle is gone or has changed: trim the entry then.
const ALLOWED_CYCLES: &[(&str, &[&str])] = &[];

/// The modules still public below the top level, as (file, module, reason). The check fails
/// when a listed module is no longer public: trim the entry then.
const ALLOWED_PUBLIC_MODULES: &[(&str, &str, &str)] = &[
    // The two controllers are applications, not layers: each keeps a namespace of its own
    // (`kubeloop::controller::sample`, `kubeloop::controller::vm`), since their names clash
    // (`run`, `CONTROLLER_NAME`, their configs and errors). Their own files are private.
    (
        "controller/mod.rs",
        "sample",
        "an application's namespace; its files are private",
    ),
    (
        "controller/mod.rs",
        "vm",
        "an application's namespace; its files are private",
    ),
];

/// The items still public under two paths, each as its paths (sorted), with what removes the
/// second. The check fails when a listed item has one path again: trim the entry then.
const ALLOWED_SECOND_PATHS: &[(&[&str], &str)] = &[];

/// The machinery: the layers below the ops servers and the controllers.
const MACHINERY: &[&str] = &[
    "backoff",
    "cache",
    "client",
    "workqueue",
    "leaderelection",
    "record",
    "runtime",
    "trace",
    "testing",
];
/// The layers the controller runtime is built on.
const BELOW_RUNTIME: &[&str] = &[
    "backoff",
    "cache",
    "client",
    "workqueue",
    "leaderelection",
    "record",
];

#[test]
fn the_library_has_no_import_circles_but_the_allowed_ones() {
    let graph = Graph::read(&library_sources());
    let cycles = graph.cycles();
    println!("import circles in src ({}):", cycles.len());
    for cycle in &cycles {
        println!("{}", graph.describe(cycle));
    }

    let mut failures = Vec::new();
    for cycle in &cycles {
        if !ALLOWED_CYCLES
            .iter()
            .any(|(_, files)| same_files(files, cycle))
        {
            failures.push(format!("a circle of imports:\n{}", graph.describe(cycle)));
        }
    }
    for (owner, files) in ALLOWED_CYCLES {
        if !cycles.iter().any(|cycle| same_files(files, cycle)) {
            failures.push(format!(
                "the allowed circle {files:?} ({owner}) is gone or has changed: \
                 trim ALLOWED_CYCLES in tests/local/layering.rs"
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn the_machinery_does_not_reach_up() {
    let graph = Graph::read(&library_sources());
    let mut failures = graph.reaching(MACHINERY, &["ops", "controller"]);
    failures.extend(graph.reaching(BELOW_RUNTIME, &["runtime"]));
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn modules_are_public_only_at_the_top_level() {
    let found = public_modules_below_the_top(&library_sources());
    let mut failures: Vec<String> = found
        .iter()
        .filter(|m| {
            !ALLOWED_PUBLIC_MODULES
                .iter()
                .any(|(file, name, _)| m.file == *file && m.name == *name)
        })
        .map(|m| {
            format!(
                "{}:{}: {}
  make it `mod {}` (or `pub(crate) mod`) and `pub use` what users \
                 need from it in its parent",
                m.file, m.line, m.text, m.name
            )
        })
        .collect();
    for (file, name, reason) in ALLOWED_PUBLIC_MODULES {
        if !found.iter().any(|m| m.file == *file && m.name == *name) {
            failures.push(format!(
                "the allowed public module {name} in {file} ({reason}) is no longer public: \
                 trim ALLOWED_PUBLIC_MODULES in tests/local/layering.rs"
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn every_public_item_has_one_path_but_the_listed_ones() {
    let found = items_with_two_public_paths(&library_sources());
    let mut failures: Vec<String> = found
        .iter()
        .filter(|paths| {
            !ALLOWED_SECOND_PATHS
                .iter()
                .any(|(p, _)| *p == paths.as_slice())
        })
        .map(|paths| {
            format!(
                "one item, public as {}: keep one of these paths, drop the other `pub use`",
                paths.join(" and ")
            )
        })
        .collect();
    for (paths, owner) in ALLOWED_SECOND_PATHS {
        if !found.iter().any(|p| p.as_slice() == *paths) {
            failures.push(format!(
                "the allowed second path of {paths:?} ({owner}) is gone or has changed: \
                 trim ALLOWED_SECOND_PATHS in tests/local/layering.rs"
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Every `.rs` file under `src`, by its path from there (`cache/store.rs`).
fn library_sources() -> BTreeMap<String, String> {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    let mut files = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let name = path.strip_prefix(root).unwrap().to_str().unwrap();
                let text = std::fs::read_to_string(&path).unwrap();
                files.insert(name.replace('\\', "/"), text);
            }
        }
    }
    assert!(
        files.contains_key("lib.rs"),
        "no lib.rs under {}",
        root.display()
    );
    files
}

fn same_files(files: &[&str], cycle: &[String]) -> bool {
    let listed: BTreeSet<&str> = files.iter().copied().collect();
    let found: BTreeSet<&str> = cycle.iter().map(String::as_str).collect();
    listed == found
}

// ---------------------------------------------------------------------------------------------
// Tokens

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Ident,
    Punct,
    Str,
}

#[derive(Clone, Debug)]
struct Tok {
    kind: Kind,
    /// An identifier, `::`, one punctuation character, or a string literal with its quotes.
    text: String,
    line: usize,
}

impl Tok {
    fn is(&self, text: &str) -> bool {
        self.kind != Kind::Str && self.text == text
    }
}

/// The tokens of a source file, without comments; a string literal is one `Str` token.
fn lex(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut toks = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let start = (i, line);
        let push = |toks: &mut Vec<Tok>, kind, end: usize| {
            let text = c[start.0..end].iter().collect();
            toks.push(Tok {
                kind,
                text,
                line: start.1,
            });
        };
        match (at(i), at(i + 1)) {
            ('\n', _) => {
                line += 1;
                i += 1;
            }
            (ch, _) if ch.is_whitespace() => i += 1,
            ('/', '/') => {
                while i < c.len() && at(i) != '\n' {
                    i += 1;
                }
            }
            ('/', '*') => {
                let mut depth = 0;
                loop {
                    match (at(i), at(i + 1)) {
                        ('\0', _) => break,
                        ('/', '*') => (depth, i) = (depth + 1, i + 2),
                        ('*', '/') => {
                            (depth, i) = (depth - 1, i + 2);
                            if depth == 0 {
                                break;
                            }
                        }
                        (ch, _) => (line, i) = (line + usize::from(ch == '\n'), i + 1),
                    }
                }
            }
            // Raw strings: r"..", r#".."#, br#".."#.
            ('r' | 'b', _) if raw_string_hashes(&c, i).is_some() => {
                let (open, hashes) = raw_string_hashes(&c, i).unwrap();
                i = open + 1;
                while i < c.len() && !(at(i) == '"' && (1..=hashes).all(|h| at(i + h) == '#')) {
                    line += usize::from(at(i) == '\n');
                    i += 1;
                }
                i = (i + 1 + hashes).min(c.len());
                push(&mut toks, Kind::Str, i);
            }
            ('"', _) | ('b', '"') => {
                i += if at(i) == 'b' { 2 } else { 1 };
                while i < c.len() && at(i) != '"' {
                    line += usize::from(at(i) == '\n');
                    i += if at(i) == '\\' { 2 } else { 1 };
                }
                i = (i + 1).min(c.len());
                push(&mut toks, Kind::Str, i);
            }
            // A char literal ('a', '\n', '{'); otherwise a lifetime's quote.
            ('\'', '\\') => {
                i += 3;
                while i < c.len() && at(i) != '\'' {
                    i += 1;
                }
                i += 1;
                push(&mut toks, Kind::Str, i);
            }
            ('\'', _) if at(i + 2) == '\'' => {
                i += 3;
                push(&mut toks, Kind::Str, i);
            }
            (':', ':') => {
                i += 2;
                push(&mut toks, Kind::Punct, i);
            }
            // `$crate` in a macro is `crate`.
            ('$', 'c') if src_word(&c, i + 1) == "crate" => {
                i += 6;
                toks.push(Tok {
                    kind: Kind::Ident,
                    text: "crate".into(),
                    line,
                });
            }
            (ch, _) if ident(ch) => {
                while i < c.len() && ident(at(i)) {
                    i += 1;
                }
                push(&mut toks, Kind::Ident, i);
            }
            _ => {
                i += 1;
                push(&mut toks, Kind::Punct, i);
            }
        }
    }
    toks
}

/// Where a raw string starting at `i` opens its quote, and its number of `#`s.
fn raw_string_hashes(c: &[char], i: usize) -> Option<(usize, usize)> {
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return None;
    }
    let mut j = i + usize::from(c[i] == 'b');
    if c.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = c[j..].iter().take_while(|&&ch| ch == '#').count();
    (c.get(j + hashes) == Some(&'"')).then_some((j + hashes, hashes))
}

fn src_word(c: &[char], i: usize) -> String {
    c[i.min(c.len())..]
        .iter()
        .take_while(|ch| ch.is_alphanumeric() || **ch == '_')
        .collect()
}

/// Removes every item marked `#[cfg(test)]` (test modules, test-only functions and fields),
/// and returns the files of the test modules declared out of line (`mod tests;`, with their
/// `#[path]` if any), relative to the declaring file's directory for children.
fn without_test_items(toks: &[Tok]) -> (Vec<Tok>, Vec<TestChild>) {
    let mut kept = Vec::new();
    let mut children = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if !is_cfg_test(toks, i) {
            kept.push(toks[i].clone());
            i += 1;
            continue;
        }
        i += 7;
        // Further attributes, remembering a `#[path = ".."]`.
        let mut path = None;
        while toks.get(i).is_some_and(|t| t.is("#")) && toks.get(i + 1).is_some_and(|t| t.is("[")) {
            if toks.get(i + 2).is_some_and(|t| t.is("path")) {
                path = toks
                    .get(i + 4)
                    .map(|t| t.text.trim_matches('"').to_string());
            }
            i = skip_group(toks, i + 1);
        }
        let item = i;
        // The item: up to a `;` or a `,` at its own depth, or the end of its first `{}`.
        let mut depth = 0i32;
        while i < toks.len() {
            let t = &toks[i];
            if t.is("(") || t.is("[") || t.is("{") {
                depth += 1;
            } else if t.is(")") || t.is("]") || t.is("}") {
                if depth == 0 {
                    break;
                }
                depth -= 1;
                if depth == 0 && t.is("}") {
                    i += 1;
                    break;
                }
            } else if depth == 0 && t.is(",") {
                break;
            } else if depth == 0 && t.is(";") {
                i += 1;
                break;
            }
            i += 1;
        }
        let words: Vec<&Tok> = toks[item..i].iter().collect();
        if let Some(m) = words.iter().position(|t| t.is("mod"))
            && words.last().is_some_and(|t| t.is(";"))
            && let Some(name) = words.get(m + 1)
        {
            children.push(TestChild {
                name: name.text.clone(),
                path,
            });
        }
    }
    (kept, children)
}

/// A test module declared out of line: `#[cfg(test)] mod name;`.
struct TestChild {
    name: String,
    /// The `#[path]`, relative to the declaring file's directory.
    path: Option<String>,
}

fn is_cfg_test(toks: &[Tok], i: usize) -> bool {
    ["#", "[", "cfg", "(", "test", ")", "]"]
        .iter()
        .enumerate()
        .all(|(k, text)| toks.get(i + k).is_some_and(|t| t.is(text)))
}

/// The index after the bracketed group opening at `i`.
fn skip_group(toks: &[Tok], mut i: usize) -> usize {
    let mut depth = 0;
    while i < toks.len() {
        let t = &toks[i];
        if t.is("(") || t.is("[") || t.is("{") {
            depth += 1;
        } else if (t.is(")") || t.is("]") || t.is("}")) && {
            depth -= 1;
            depth == 0
        } {
            return i + 1;
        }
        i += 1;
    }
    i
}

// ---------------------------------------------------------------------------------------------
// Paths

/// A path a file names: a `use` leaf, or a `crate::`/`super::`/`self::` path in code.
#[derive(Debug)]
struct Named {
    path: Vec<String>,
    /// The name a `use` binds (the last segment, or its `as` alias); none for code paths and
    /// globs.
    binds: Option<String>,
    /// The line of the path's last segment, and of the statement's start (its `use`).
    line: usize,
    start: usize,
}

fn named_paths(toks: &[Tok]) -> Vec<Named> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let t = &toks[i];
        // Not a path's middle, nor a visibility (`pub(in crate::testenv)`).
        let after_path_or_in_visibility = i > 0 && toks[i - 1].is("::")
            || i > 2 && toks[i - 1].is("in") && toks[i - 2].is("(") && toks[i - 3].is("pub");
        if t.is("use") {
            i += 1;
            use_tree(toks, &mut i, Vec::new(), t.line, &mut out);
        } else if t.kind == Kind::Ident
            && ["crate", "super", "self"].contains(&t.text.as_str())
            && !after_path_or_in_visibility
            && toks.get(i + 1).is_some_and(|n| n.is("::"))
        {
            let mut path = vec![t.text.clone()];
            let mut line = t.line;
            i += 1;
            while toks.get(i).is_some_and(|n| n.is("::"))
                && let Some(seg) = toks.get(i + 1).filter(|s| s.kind == Kind::Ident)
            {
                path.push(seg.text.clone());
                line = seg.line;
                i += 2;
            }
            let start = t.line;
            out.push(Named {
                path,
                binds: None,
                line,
                start,
            });
        } else {
            i += 1;
        }
    }
    out
}

/// One `use` tree from `i` (after `use`, or inside a brace group), each leaf appended to
/// `prefix`.
fn use_tree(toks: &[Tok], i: &mut usize, prefix: Vec<String>, start: usize, out: &mut Vec<Named>) {
    let mut path = prefix;
    let mut line = toks.get(*i).map_or(0, |t| t.line);
    while let Some(t) = toks.get(*i) {
        if t.is("{") {
            *i += 1;
            while toks.get(*i).is_some_and(|t| !t.is("}")) {
                use_tree(toks, i, path.clone(), start, out);
                if toks.get(*i).is_some_and(|t| t.is(",")) {
                    *i += 1;
                }
            }
            *i += 1;
            return;
        }
        if t.kind == Kind::Ident || t.is("*") || (t.is("::") && path.is_empty()) {
            path.push(t.text.clone());
            line = t.line;
            *i += 1;
        } else {
            break;
        }
        if toks.get(*i).is_some_and(|t| t.is("::")) {
            *i += 1;
        } else {
            break;
        }
    }
    let mut binds = match path.last().map(String::as_str) {
        Some("*") | None => None,
        Some("self") => path.iter().rev().nth(1).cloned(),
        Some(last) => Some(last.to_string()),
    };
    if toks.get(*i).is_some_and(|t| t.is("as")) {
        binds = toks
            .get(*i + 1)
            .map(|t| t.text.clone())
            .filter(|a| a != "_");
        *i += 2;
    }
    if !path.is_empty() {
        out.push(Named {
            path,
            binds,
            line,
            start,
        });
    }
}

// ---------------------------------------------------------------------------------------------
// The graph

/// One file's imports of another, with the lines that make them: (statement start, path).
#[derive(Debug, Default)]
struct Edge {
    lines: BTreeSet<(usize, usize)>,
}

struct File {
    lines: Vec<String>,
    named: Vec<Named>,
}

struct Graph {
    files: BTreeMap<String, File>,
    /// Files that are test modules; they neither import nor are imported.
    tests: BTreeSet<String>,
    /// `edges[from][to]`.
    edges: BTreeMap<String, BTreeMap<String, Edge>>,
}

impl Graph {
    /// The import graph of a crate's sources, keyed by their path from the crate's root
    /// (`lib.rs`, `cache/store.rs`).
    fn read(sources: &BTreeMap<String, String>) -> Self {
        let mut files = BTreeMap::new();
        let mut tests = BTreeSet::new();
        for (name, src) in sources {
            let (toks, children) = without_test_items(&lex(src));
            let dir = child_dir(name);
            for child in children {
                tests.insert(match child.path {
                    Some(path) => format!("{}{path}", parent_dir(name)),
                    None if sources.contains_key(&format!("{dir}{}.rs", child.name)) => {
                        format!("{dir}{}.rs", child.name)
                    }
                    None => format!("{dir}{}/mod.rs", child.name),
                });
            }
            let file_name = name.rsplit('/').next().unwrap();
            if file_name == "tests.rs" || file_name.ends_with("_tests.rs") {
                tests.insert(name.clone());
            }
            let lines = src.lines().map(|l| l.trim().to_string()).collect();
            files.insert(
                name.clone(),
                File {
                    lines,
                    named: named_paths(&toks),
                },
            );
        }
        // A test module's own children are test code too.
        let names: Vec<String> = files.keys().cloned().collect();
        for name in &names {
            if tests.iter().any(|t| name.starts_with(&child_dir(t))) {
                tests.insert(name.clone());
            }
        }

        let mut graph = Graph {
            files,
            tests,
            edges: BTreeMap::new(),
        };
        let mut edges: BTreeMap<String, BTreeMap<String, Edge>> = BTreeMap::new();
        for (from, file) in &graph.files {
            if graph.tests.contains(from) {
                continue;
            }
            for named in &file.named {
                if let Some(to) = graph.resolve(from, &named.path, 0)
                    && to != *from
                    && !graph.tests.contains(&to)
                {
                    let edge = edges
                        .entry(from.clone())
                        .or_default()
                        .entry(to)
                        .or_default();
                    edge.lines.insert((named.start, named.line));
                }
            }
        }
        graph.edges = edges;
        graph
    }

    /// The file a path from `from` leads to; `None` for another crate's.
    fn resolve(&self, from: &str, path: &[String], depth: usize) -> Option<String> {
        let (mut module, rest) = start_of(from, path)?;
        if rest.len() == path.len() {
            // A child module (`pub use store::Store` in a `mod.rs`), or another crate.
            let mut child = module.clone();
            child.push(path[0].clone());
            self.module_file(&child)?;
        }
        for seg in rest {
            if seg == "self" || seg == "*" {
                break;
            }
            let mut child = module.clone();
            child.push(seg.clone());
            if self.module_file(&child).is_some() {
                module = child;
                continue;
            }
            // An item of `module`: its file, or the file it re-exports the item from.
            let file = self.module_file(&module)?;
            let reexport = self.files[&file]
                .named
                .iter()
                .find(|n| n.binds.as_deref() == Some(seg.as_str()));
            if let Some(reexport) = reexport
                && depth < 16
                && let Some(target) = self.resolve(&file, &reexport.path, depth + 1)
            {
                return Some(target);
            }
            return Some(file);
        }
        self.module_file(&module)
    }

    fn module_file(&self, module: &[String]) -> Option<String> {
        if module.is_empty() {
            return Some("lib.rs".into());
        }
        let base = module.join("/");
        [format!("{base}.rs"), format!("{base}/mod.rs")]
            .into_iter()
            .find(|f| self.files.contains_key(f))
    }

    /// The circles: strongly connected components of more than one file (Tarjan), each sorted,
    /// in file order.
    fn cycles(&self) -> Vec<Vec<String>> {
        let names: Vec<&String> = self.files.keys().collect();
        let index_of: BTreeMap<&String, usize> =
            names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let successors: Vec<Vec<usize>> = names
            .iter()
            .map(|n| {
                self.edges
                    .get(*n)
                    .map(|to| to.keys().map(|t| index_of[t]).collect())
                    .unwrap_or_default()
            })
            .collect();
        let mut tarjan = Tarjan {
            successors: &successors,
            index: vec![None; names.len()],
            low: vec![0; names.len()],
            on_stack: vec![false; names.len()],
            stack: Vec::new(),
            next: 0,
            components: Vec::new(),
        };
        for v in 0..names.len() {
            if tarjan.index[v].is_none() {
                tarjan.visit(v);
            }
        }
        let mut cycles: Vec<Vec<String>> = tarjan
            .components
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|c| {
                let mut files: Vec<String> = c.into_iter().map(|v| names[v].clone()).collect();
                files.sort();
                files
            })
            .collect();
        cycles.sort();
        cycles
    }

    /// A circle's files and the import lines between them.
    fn describe(&self, cycle: &[String]) -> String {
        let mut out = format!("  {}\n", cycle.join(" <-> "));
        for from in cycle {
            for (to, edge) in self.edges.get(from).into_iter().flatten() {
                if cycle.contains(to) {
                    out += &self.describe_edge(from, to, edge);
                }
            }
        }
        out
    }

    fn describe_edge(&self, from: &str, to: &str, edge: &Edge) -> String {
        let mut out = format!("    {from} -> {to}\n");
        let text = |line: usize| &self.files[from].lines[line - 1];
        for &(start, line) in &edge.lines {
            out += &if start == line {
                format!("      {from}:{line}: {}\n", text(line))
            } else {
                format!(
                    "      {from}:{start}-{line}: {} .. {}\n",
                    text(start),
                    text(line)
                )
            };
        }
        out
    }

    /// Every way the files of the `from` layers reach one of the `to` layers, as the chain of
    /// imports that gets there (one per file first reached in a `to` layer).
    fn reaching(&self, from: &[&str], to: &[&str]) -> Vec<String> {
        let mut parent: BTreeMap<&String, Option<&String>> = BTreeMap::new();
        let mut queue = VecDeque::new();
        for name in self.files.keys() {
            if from.contains(&layer(name)) && !self.tests.contains(name) {
                parent.insert(name, None);
                queue.push_back(name);
            }
        }
        let mut failures = Vec::new();
        while let Some(file) = queue.pop_front() {
            for next in self.edges.get(file).into_iter().flat_map(|e| e.keys()) {
                if parent.contains_key(next) {
                    continue;
                }
                parent.insert(next, Some(file));
                if !to.contains(&layer(next)) {
                    queue.push_back(next);
                    continue;
                }
                let mut chain = vec![next];
                while let Some(&Some(p)) = parent.get(chain.last().unwrap()) {
                    chain.push(p);
                }
                chain.reverse();
                let mut out = format!(
                    "{} ({}) reaches {} ({}):\n",
                    chain[0],
                    layer(chain[0]),
                    next,
                    layer(next)
                );
                for pair in chain.windows(2) {
                    out += &self.describe_edge(pair[0], pair[1], &self.edges[pair[0]][pair[1]]);
                }
                failures.push(out);
            }
        }
        failures
    }
}

struct Tarjan<'a> {
    successors: &'a [Vec<usize>],
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    next: usize,
    components: Vec<Vec<usize>>,
}

impl Tarjan<'_> {
    fn visit(&mut self, v: usize) {
        self.index[v] = Some(self.next);
        self.low[v] = self.next;
        self.next += 1;
        self.stack.push(v);
        self.on_stack[v] = true;
        for &w in self.successors[v].iter() {
            match self.index[w] {
                None => {
                    self.visit(w);
                    self.low[v] = self.low[v].min(self.low[w]);
                }
                Some(iw) if self.on_stack[w] => self.low[v] = self.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(self.low[v]) == self.index[v] {
            let mut component = Vec::new();
            loop {
                let w = self.stack.pop().unwrap();
                self.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            self.components.push(component);
        }
    }
}

/// Where a path from `from` starts: the module its `crate::`, `self::` or `super::`s lead to
/// and the segments after them; for any other first segment, `from`'s own module and the
/// whole path. `None` for a `super` above the crate.
fn start_of<'p>(from: &str, path: &'p [String]) -> Option<(Vec<String>, &'p [String])> {
    let mut module = module_of(from);
    let mut rest = path;
    match path.first()?.as_str() {
        "crate" => (module, rest) = (Vec::new(), &path[1..]),
        "self" => rest = &path[1..],
        "super" => {
            while rest.first().is_some_and(|s| s == "super") {
                module.pop()?;
                rest = &rest[1..];
            }
        }
        _ => {}
    }
    Some((module, rest))
}

/// The module a file is: `lib.rs` the crate, `a/mod.rs` and `a.rs` the module `a`.
fn module_of(file: &str) -> Vec<String> {
    let path = file.strip_suffix(".rs").unwrap_or(file);
    let mut module: Vec<String> = path.split('/').map(String::from).collect();
    if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
        module.pop();
    }
    module
}

/// The directory a file's child modules live in: `a/` for `a/mod.rs`, `a/b/` for `a/b.rs`.
fn child_dir(file: &str) -> String {
    let module = module_of(file);
    if module.is_empty() {
        String::new()
    } else {
        format!("{}/", module.join("/"))
    }
}

/// The directory a file is in, as a prefix (`a/` for `a/b.rs`, empty for `lib.rs`).
fn parent_dir(file: &str) -> &str {
    file.rfind('/').map_or("", |i| &file[..=i])
}

/// A file's layer: its top-level module (`cache`), or its name for a top-level file (`trace`).
fn layer(file: &str) -> &str {
    let top = file.split('/').next().unwrap();
    top.strip_suffix(".rs").unwrap_or(top)
}

// ---------------------------------------------------------------------------------------------
// Public modules

/// A module made public below the top level: a `pub mod` outside `lib.rs`'s top level, or a
/// `pub use` of a module of the crate.
#[derive(Debug, PartialEq, Eq)]
struct PublicModule {
    file: String,
    /// The module's name as its `pub mod` or `pub use` gives it.
    name: String,
    line: usize,
    /// The line, trimmed.
    text: String,
}

/// What the sources make public: the modules declared `pub mod`, those below the top level
/// (or re-exported), and every bare `pub use` leaf with its file.
struct Publics {
    /// Every module declared `pub mod`, by its path (`["cache"]`, `["controller", "vm"]`).
    declared: BTreeSet<Vec<String>>,
    /// The modules public below the top level.
    below_the_top: Vec<PublicModule>,
    /// `(file, leaf)` for every leaf of a `pub use`.
    re_exports: Vec<(String, Named)>,
}

/// Every module public below the top level, test items left out. Only a bare `pub` counts:
/// `pub(crate)`, `pub(super)` and `pub(in ..)` are not public. A `pub use` counts when it names
/// a module declared `pub mod` (the compiler refuses to re-export any other module; a function
/// of the same name as a private module, `pub use sharding::assign`, is not a module).
fn public_modules_below_the_top(sources: &BTreeMap<String, String>) -> Vec<PublicModule> {
    publics(sources).below_the_top
}

fn publics(sources: &BTreeMap<String, String>) -> Publics {
    let graph = Graph::read(sources);
    let mut declared = BTreeSet::new();
    let mut found = Vec::new();
    let mut re_exports = Vec::new();
    for (name, src) in sources {
        if graph.tests.contains(name) {
            continue;
        }
        let (toks, _) = without_test_items(&lex(src));
        let line_text = |line: usize| src.lines().nth(line - 1).unwrap_or("").trim().to_string();
        let mut depth = 0usize;
        for (i, t) in toks.iter().enumerate() {
            if t.is("{") {
                depth += 1;
            } else if t.is("}") {
                depth = depth.saturating_sub(1);
            }
            if !t.is("pub") {
                continue;
            }
            let next = toks.get(i + 1);
            if next.is_some_and(|n| n.is("mod")) {
                let module = toks.get(i + 2).map_or(String::new(), |m| m.text.clone());
                let mut path = module_of(name);
                path.push(module.clone());
                declared.insert(path);
                if !(name == "lib.rs" && depth == 0) {
                    found.push(PublicModule {
                        file: name.clone(),
                        name: module,
                        line: t.line,
                        text: line_text(t.line),
                    });
                }
            } else if next.is_some_and(|n| n.is("use")) {
                let (mut at, mut leaves) = (i + 2, Vec::new());
                use_tree(&toks, &mut at, Vec::new(), t.line, &mut leaves);
                re_exports.extend(leaves.into_iter().map(|leaf| (name.clone(), leaf)));
            }
        }
    }
    for (file, leaf) in &re_exports {
        if let Some(module) = graph.module_named(file, &leaf.path)
            && declared.contains(&module)
        {
            let text = sources[file].lines().nth(leaf.line - 1).unwrap_or("");
            found.push(PublicModule {
                file: file.clone(),
                name: leaf.binds.clone().unwrap_or_default(),
                line: leaf.line,
                text: text.trim().to_string(),
            });
        }
    }
    found.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    Publics {
        declared,
        below_the_top: found,
        re_exports,
    }
}

/// The items of the crate that have more than one public path, each with its paths
/// (`kubeloop::cache::X`), sorted. An item's paths: where it is defined, if that module is
/// public, and every `pub use` of it in a public module (one whose every step is a `pub mod`).
fn items_with_two_public_paths(sources: &BTreeMap<String, String>) -> Vec<Vec<String>> {
    let graph = Graph::read(sources);
    let publics = publics(sources);
    let public =
        |module: &[String]| (1..=module.len()).all(|n| publics.declared.contains(&module[..n]));
    let path_of = |module: &[String], name: &str| {
        let mut path = vec!["kubeloop".to_string()];
        path.extend(module.iter().cloned());
        path.push(name.to_string());
        path.join("::")
    };
    let mut paths: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for (file, leaf) in &publics.re_exports {
        let module = module_of(file);
        let (Some(binds), Some(name)) = (&leaf.binds, leaf.path.last()) else {
            continue;
        };
        if !public(&module) || graph.module_named(file, &leaf.path).is_some() {
            continue;
        }
        let Some(defined_in) = graph.resolve(file, &leaf.path, 0) else {
            continue;
        };
        let item = paths.entry((defined_in.clone(), name.clone())).or_default();
        item.insert(path_of(&module, binds));
        let home = module_of(&defined_in);
        if public(&home) {
            item.insert(path_of(&home, name));
        }
    }
    paths
        .into_values()
        .filter(|p| p.len() > 1)
        .map(|p| p.into_iter().collect())
        .collect()
}

impl Graph {
    /// The module of this crate a whole path from `from` names (`crate::cache`,
    /// `super::store`, `store::{self}`); `None` for an item, a glob or another crate.
    fn module_named(&self, from: &str, path: &[String]) -> Option<Vec<String>> {
        let (mut module, rest) = start_of(from, path)?;
        for seg in rest {
            match seg.as_str() {
                "self" => break,
                "*" => return None,
                _ => {
                    module.push(seg.clone());
                    self.module_file(&module)?;
                }
            }
        }
        (!module.is_empty()).then_some(module)
    }
}

// ---------------------------------------------------------------------------------------------
// The check's own tests: it must see what it claims to see.

/// The graph of an inline crate, as `from -> to` pairs.
fn edges_of(files: &[(&str, &str)]) -> Vec<(String, String)> {
    let graph = Graph::read(&sources(files));
    let mut out = Vec::new();
    for (from, to) in &graph.edges {
        out.extend(to.keys().map(|t| (from.clone(), t.clone())));
    }
    out
}

fn sources(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(n, s)| (n.to_string(), s.to_string()))
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn two_files_that_import_each_other_are_a_cycle() {
    let graph = Graph::read(&sources(&[
        ("lib.rs", "mod a; mod b;"),
        ("a.rs", "use crate::b::B;\npub struct A;"),
        ("b.rs", "pub struct B;\nfn f(_: crate::a::A) {}"),
    ]));
    assert_eq!(
        graph.cycles(),
        vec![vec!["a.rs".to_string(), "b.rs".to_string()]]
    );
    let described = graph.describe(&graph.cycles()[0]);
    assert!(
        described.contains("a.rs:1: use crate::b::B;"),
        "{described}"
    );
    assert!(
        described.contains("b.rs:2: fn f(_: crate::a::A) {}"),
        "{described}"
    );
}

#[test]
fn a_longer_circle_is_one_cycle_and_a_chain_is_none() {
    let circle = Graph::read(&sources(&[
        ("lib.rs", ""),
        ("a.rs", "use crate::b::B;"),
        ("b.rs", "use crate::c::C;"),
        ("c.rs", "use crate::a::A;"),
        ("d.rs", "use crate::a::A;"),
    ]));
    assert_eq!(circle.cycles(), vec![vec!["a.rs", "b.rs", "c.rs"]]);
    let chain = Graph::read(&sources(&[
        ("lib.rs", ""),
        ("a.rs", "use crate::b::B;"),
        ("b.rs", "use crate::c::C;"),
        ("c.rs", "pub struct C;"),
    ]));
    assert_eq!(chain.cycles(), Vec::<Vec<String>>::new());
    assert_eq!(
        edges_of(&[("lib.rs", ""), ("a.rs", "use crate::b::B;"), ("b.rs", "")]).len(),
        1
    );
}

#[test]
fn brace_groups_import_each_leaf_and_a_re_exported_item_its_defining_file() {
    let files = [
        ("lib.rs", "pub mod cache;\npub mod ops;"),
        (
            "cache/mod.rs",
            "mod store; mod labels;\npub use labels::Selector;\npub use store::Store;",
        ),
        ("cache/store.rs", "pub struct Store;"),
        ("cache/labels.rs", "pub struct Selector;"),
        (
            "ops/mod.rs",
            "use crate::{cache::{store::Store, Selector as S}, ops};\nuse std::fmt;",
        ),
    ];
    assert_eq!(
        edges_of(&files),
        pairs(&[
            ("cache/mod.rs", "cache/labels.rs"),
            ("cache/mod.rs", "cache/store.rs"),
            ("ops/mod.rs", "cache/labels.rs"),
            ("ops/mod.rs", "cache/store.rs"),
        ])
    );
    // `use crate::cache::{self}` and a glob name the module, so its root.
    let whole = [
        ("lib.rs", ""),
        ("cache/mod.rs", ""),
        ("a.rs", "use crate::cache::{self};\nuse crate::cache::*;"),
    ];
    assert_eq!(edges_of(&whole), pairs(&[("a.rs", "cache/mod.rs")]));
}

#[test]
fn super_climbs_from_the_file_s_module_and_self_stays_in_it() {
    let files = [
        ("lib.rs", ""),
        (
            "ops/mod.rs",
            "mod routes; mod server;\npub use routes::Check;",
        ),
        ("ops/routes.rs", "pub trait Check {}"),
        (
            "ops/server.rs",
            "use super::Check;\nfn f() { super::super::trace::follow(); }",
        ),
        (
            "ops/server/tls.rs",
            "use super::super::routes::Check;\nuse self::inner::X;",
        ),
        ("trace.rs", "pub fn follow() {}"),
    ];
    assert_eq!(
        edges_of(&files),
        pairs(&[
            ("ops/mod.rs", "ops/routes.rs"),
            ("ops/server.rs", "ops/routes.rs"),
            ("ops/server.rs", "trace.rs"),
            ("ops/server/tls.rs", "ops/routes.rs"),
        ])
    );
}

#[test]
fn test_code_comments_and_strings_import_nothing() {
    let files = [
        ("lib.rs", "mod a; mod b;"),
        (
            "a.rs",
            r##"//! Uses crate::b::B in a doc comment.
/* crate::b::B, /* nested */ crate::b::B */
const S: &str = "crate::b::B { ";
const R: &str = r#"use crate::b::B; "#;
const C: char = '{';
fn f<'a>(x: &'a str) -> &'a str { x }
#[cfg(test)]
pub(crate) fn helper() -> crate::b::B { crate::b::B }
#[cfg(test)]
mod tests {
    use crate::b::B;
    #[test]
    fn t() { let _ = crate::b::B; }
}
#[cfg(test)]
#[path = "a_fixtures.rs"]
mod fixtures;
#[cfg(test)]
mod more;
"##,
        ),
        ("b.rs", "pub struct B;"),
        ("a_fixtures.rs", "pub struct F; use crate::b::B;"),
        ("a/more.rs", "pub struct M; use crate::b::B;"),
        ("b/tests.rs", "use crate::a::A;"),
        ("b/x_tests.rs", "use crate::a::A;"),
    ];
    assert_eq!(edges_of(&files), Vec::new());
}

#[test]
fn a_mod_rs_that_re_exports_a_child_using_its_own_items_is_a_cycle() {
    let files = [
        ("lib.rs", ""),
        (
            "env/mod.rs",
            "mod cluster;\npub use cluster::Cluster;\npub enum Error {}",
        ),
        ("env/cluster.rs", "use super::Error;\npub struct Cluster;"),
    ];
    assert_eq!(
        Graph::read(&sources(&files)).cycles(),
        vec![vec!["env/cluster.rs", "env/mod.rs"]]
    );
}

#[test]
fn a_layer_reaching_up_is_named_with_its_import_chain() {
    let graph = Graph::read(&sources(&[
        ("lib.rs", ""),
        (
            "leaderelection/healthz.rs",
            "impl crate::ops::Check for H {}",
        ),
        ("leaderelection/elector.rs", "use super::healthz::H;"),
        ("ops/mod.rs", "pub trait Check {}"),
        ("cache/store.rs", "use crate::trace::follow;"),
        ("trace.rs", "fn f() { crate::runtime::go(); }"),
        ("runtime/mod.rs", ""),
    ]));
    let up = graph.reaching(&["leaderelection"], &["ops"]);
    assert_eq!(up.len(), 1, "{up:?}");
    assert!(
        up[0].contains("leaderelection/healthz.rs:1: impl crate::ops::Check for H {}"),
        "{up:?}"
    );
    let runtime = graph.reaching(&["cache"], &["runtime"]);
    assert_eq!(runtime.len(), 1, "{runtime:?}");
    assert!(
        runtime[0].contains("cache/store.rs -> trace.rs"),
        "{runtime:?}"
    );
    assert!(
        runtime[0].contains("trace.rs -> runtime/mod.rs"),
        "{runtime:?}"
    );
}

#[test]
fn a_public_module_below_the_top_or_a_module_re_exported_is_found_and_nothing_else() {
    let files = [
        (
            "lib.rs",
            "pub mod a;\npub mod b;\nmod c;\nmod inline {\n    pub mod deep {}\n}",
        ),
        (
            "a/mod.rs",
            r#"//! pub mod in_a_doc_comment;
pub mod x;
pub(crate) mod y;
pub(super) mod z;
mod w;
const S: &str = "pub mod in_a_string;";
#[cfg(test)]
pub mod fixtures;
pub use w::{Item, w};
pub use crate::b::{self as other};
"#,
        ),
        ("a/x.rs", ""),
        ("a/y.rs", ""),
        ("a/z.rs", ""),
        ("a/w.rs", "pub struct Item;\npub fn w() {}"),
        ("a/fixtures.rs", "pub mod inside_a_test_module;"),
        ("b.rs", "pub use super::a::x;\npub use std::collections;"),
        // A function named as the private module it is in, re-exported: not a module.
        ("c.rs", "pub mod d {}\npub use crate::a::w;"),
    ];
    let found: Vec<(String, String, usize)> = public_modules_below_the_top(&sources(&files))
        .into_iter()
        .map(|m| (m.file, m.name, m.line))
        .collect();
    assert_eq!(
        found,
        vec![
            ("a/mod.rs".to_string(), "x".to_string(), 2),
            ("a/mod.rs".to_string(), "other".to_string(), 10),
            ("b.rs".to_string(), "x".to_string(), 1),
            ("c.rs".to_string(), "d".to_string(), 1),
            ("lib.rs".to_string(), "deep".to_string(), 5),
        ]
    );
}

#[test]
fn an_item_re_exported_by_two_public_modules_has_two_paths() {
    let files = [
        (
            "lib.rs",
            "pub mod cache;\npub mod testing;\npub mod runtime;\npub mod trace;",
        ),
        (
            "cache/mod.rs",
            "mod fake;\nmod store;\npub use fake::Fake;\npub use store::Store;\n\
             pub use crate::trace::Stage;",
        ),
        ("cache/fake.rs", "pub struct Fake;"),
        ("cache/store.rs", "pub struct Store;"),
        // A second path, under another name too.
        (
            "testing.rs",
            "pub use crate::cache::{Fake, Store as CacheStore};",
        ),
        // Through a private module: one public path still.
        (
            "runtime/mod.rs",
            "mod inner;\npub use inner::Key;\n#[cfg(test)]\npub use crate::cache::Fake;",
        ),
        ("runtime/inner/mod.rs", "mod key;\npub use key::Key;"),
        ("runtime/inner/key.rs", "pub struct Key;"),
        // Defined in a public module and re-exported by another.
        (
            "trace.rs",
            "pub struct Stage;\npub use crate::runtime::Key as K;",
        ),
    ];
    assert_eq!(
        items_with_two_public_paths(&sources(&files)),
        vec![
            vec!["kubeloop::cache::Fake", "kubeloop::testing::Fake"],
            vec!["kubeloop::cache::Store", "kubeloop::testing::CacheStore"],
            vec!["kubeloop::runtime::Key", "kubeloop::trace::K"],
            vec!["kubeloop::cache::Stage", "kubeloop::trace::Stage"],
        ]
    );
}
