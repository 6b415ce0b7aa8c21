//! Which module of a crate refers to which, read from the crate's `src/` files, and the circles
//! in it (issue 53, item 10: no module imports one that imports it back). Shared by the
//! `module_imports` tests of `lab`, `sim` and `arrivals` (included with `#[path]`).
//!
//! The reader is a small lexer, not a compiler: it drops comments, string and character literals,
//! follows `mod name { .. }` blocks so that `super::` inside a test module means the file's own
//! module, and resolves every path that starts with `crate::`, `super::`, `self::` or a child
//! module's name, in `use` lines, expressions and macro arguments alike. A path that lands on an
//! ancestor module's item is followed through that module's `use` (its re-exports), so
//! `crate::run` counts as a reference to the module that defines `run`. References between a
//! module and its own ancestors are the module tree itself and are not counted; glob re-exports
//! (`pub use x::*`) are not followed. Binaries (`src/bin/`) are crates of their own and skipped.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

/// A module's absolute path inside its crate: `[]` is the crate root, `["loadgen", "soak"]` is
/// `crate::loadgen::soak`.
pub type ModPath = Vec<String>;

/// One reference from a module to another: where it is written.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Site {
    pub file: String,
    pub line: usize,
    pub path: String,
}

/// The modules of one crate and the references between them.
#[derive(Debug, Default)]
pub struct ImportGraph {
    /// Every module that has a file of its own.
    pub modules: BTreeSet<ModPath>,
    /// `from -> to -> where`; only between modules neither of which contains the other.
    pub edges: BTreeMap<ModPath, BTreeMap<ModPath, Vec<Site>>>,
}

/// A circle: modules each of which reaches every other through the graph's edges.
#[derive(Debug, PartialEq, Eq)]
pub struct Circle {
    pub modules: Vec<ModPath>,
    /// The edges inside the circle, each with its first site.
    pub edges: Vec<(ModPath, ModPath, Site)>,
}

impl fmt::Display for Circle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.modules.iter().map(|m| name(m)).collect();
        writeln!(f, "circle of {} modules: {}", names.len(), names.join(", "))?;
        for (from, to, site) in &self.edges {
            writeln!(
                f,
                "  {} -> {}  ({}:{} `{}`)",
                name(from),
                name(to),
                site.file,
                site.line,
                site.path
            )?;
        }
        Ok(())
    }
}

/// `crate::a::b` for `["a", "b"]`.
pub fn name(module: &[String]) -> String {
    std::iter::once("crate")
        .chain(module.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join("::")
}

/// The module path of a source file relative to `src/`, or `None` for binaries and non-Rust files.
fn module_of(relative: &Path) -> Option<ModPath> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.first().map(String::as_str) == Some("bin") {
        return None;
    }
    let file = parts.pop()?;
    let stem = file.strip_suffix(".rs")?;
    if parts.is_empty() && (stem == "lib" || stem == "main") {
        return Some(parts);
    }
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    Some(parts)
}

/// Every `.rs` file under `dir`, sorted; the walk is bounded by the directory tree itself.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

impl ImportGraph {
    /// The graph of the crate whose sources are under `src`.
    pub fn of_src_dir(src: &Path) -> Result<Self, String> {
        let mut files = Vec::new();
        rust_files(src, &mut files).map_err(|e| format!("reading {}: {e}", src.display()))?;
        let mut sources = Vec::new();
        for file in files {
            let relative = file.strip_prefix(src).map_err(|e| e.to_string())?;
            let Some(module) = module_of(relative) else {
                continue;
            };
            let text = std::fs::read_to_string(&file)
                .map_err(|e| format!("reading {}: {e}", file.display()))?;
            sources.push((module, relative.display().to_string(), text));
        }
        Ok(Self::of_sources(&sources))
    }

    /// The graph of in-memory sources: `(module, file name for messages, text)`.
    pub fn of_sources(sources: &[(ModPath, String, String)]) -> Self {
        let modules: BTreeSet<ModPath> = sources.iter().map(|(m, _, _)| m.clone()).collect();
        let files: Vec<FileRefs> = sources
            .iter()
            .map(|(module, file, text)| read_file(module, file, text, &modules))
            .collect();
        let imports: BTreeMap<&ModPath, &BTreeMap<String, ModPath>> =
            files.iter().map(|f| (&f.module, &f.imports)).collect();
        let mut graph = ImportGraph {
            modules: modules.clone(),
            edges: BTreeMap::new(),
        };
        for file in &files {
            for (target, site) in &file.references {
                let to = resolve(target, &modules, &imports);
                let from = &file.module;
                if to.starts_with(from) || from.starts_with(&to) {
                    continue;
                }
                graph
                    .edges
                    .entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_default()
                    .push(site.clone());
            }
        }
        graph
    }

    /// The number of distinct module-to-module references.
    pub fn edge_count(&self) -> usize {
        self.edges.values().map(BTreeMap::len).sum()
    }

    /// Whether `from` refers to `to` (both written as `a::b`, without `crate::`).
    pub fn refers(&self, from: &str, to: &str) -> bool {
        let split = |s: &str| -> ModPath { s.split("::").map(str::to_string).collect() };
        self.edges
            .get(&split(from))
            .is_some_and(|t| t.contains_key(&split(to)))
    }

    /// The circles: strongly connected components of more than one module (Tarjan's algorithm,
    /// iterative so that its depth is the heap's, not the stack's).
    pub fn circles(&self) -> Vec<Circle> {
        let nodes: Vec<&ModPath> = self.modules.iter().collect();
        let index_of: BTreeMap<&ModPath, usize> =
            nodes.iter().enumerate().map(|(i, m)| (*m, i)).collect();
        let succ: Vec<Vec<usize>> = nodes
            .iter()
            .map(|m| {
                self.edges
                    .get(*m)
                    .map(|t| t.keys().filter_map(|k| index_of.get(k).copied()).collect())
                    .unwrap_or_default()
            })
            .collect();
        let n = nodes.len();
        let mut index = vec![usize::MAX; n];
        let mut low = vec![0; n];
        let mut on_stack = vec![false; n];
        let mut stack = Vec::new();
        let mut next = 0;
        let mut components: Vec<Vec<usize>> = Vec::new();
        for root in 0..n {
            if index[root] != usize::MAX {
                continue;
            }
            // (node, position in its successor list)
            let mut work = vec![(root, 0usize)];
            index[root] = next;
            low[root] = next;
            next += 1;
            stack.push(root);
            on_stack[root] = true;
            while let Some(&mut (v, ref mut pos)) = work.last_mut() {
                if let Some(&w) = succ[v].get(*pos) {
                    *pos += 1;
                    if index[w] == usize::MAX {
                        index[w] = next;
                        low[w] = next;
                        next += 1;
                        stack.push(w);
                        on_stack[w] = true;
                        work.push((w, 0));
                    } else if on_stack[w] {
                        low[v] = low[v].min(index[w]);
                    }
                    continue;
                }
                work.pop();
                if let Some(&(parent, _)) = work.last() {
                    low[parent] = low[parent].min(low[v]);
                }
                if low[v] == index[v] {
                    let mut component = Vec::new();
                    while let Some(w) = stack.pop() {
                        on_stack[w] = false;
                        component.push(w);
                        if w == v {
                            break;
                        }
                    }
                    if component.len() > 1 {
                        component.sort_unstable();
                        components.push(component);
                    }
                }
            }
        }
        components
            .into_iter()
            .map(|component| {
                let members: BTreeSet<&ModPath> = component.iter().map(|&i| nodes[i]).collect();
                let mut edges = Vec::new();
                for from in &members {
                    for (to, sites) in self.edges.get(*from).into_iter().flatten() {
                        if members.contains(to) {
                            edges.push(((*from).clone(), to.clone(), sites[0].clone()));
                        }
                    }
                }
                Circle {
                    modules: members.into_iter().cloned().collect(),
                    edges,
                }
            })
            .collect()
    }
}

/// Follows `target` through the `use` declarations of the module it lands in, at most a few
/// hops, and answers the deepest module with a file that the path names.
fn resolve(
    target: &[String],
    modules: &BTreeSet<ModPath>,
    imports: &BTreeMap<&ModPath, &BTreeMap<String, ModPath>>,
) -> ModPath {
    let mut target: ModPath = target.to_vec();
    for _ in 0..8 {
        let module = deepest_module(&target, modules);
        let Some(item) = target.get(module.len()) else {
            return module;
        };
        match imports.get(&module).and_then(|m| m.get(item)) {
            Some(via) if via.as_slice() != &target[..=module.len()] => {
                let mut next = via.clone();
                next.extend_from_slice(&target[module.len() + 1..]);
                target = next;
            }
            _ => return module,
        }
    }
    deepest_module(&target, modules)
}

fn deepest_module(target: &[String], modules: &BTreeSet<ModPath>) -> ModPath {
    (0..=target.len())
        .rev()
        .map(|len| target[..len].to_vec())
        .find(|prefix| modules.contains(prefix))
        .unwrap_or_default()
}

/// What one file refers to, and the names its top level brings in with `use`.
struct FileRefs {
    module: ModPath,
    references: Vec<(ModPath, Site)>,
    imports: BTreeMap<String, ModPath>,
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

/// The tokens of `text` that matter for paths and blocks, each with its line; comments and
/// literals are dropped.
fn lex(text: &str) -> Vec<(Tok, usize)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let count_lines = |from: usize, to: usize, line: &mut usize| {
        *line += chars[from..to.min(chars.len())]
            .iter()
            .filter(|&&c| c == '\n')
            .count();
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let start = i;
            let mut depth = 0usize;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            count_lines(start, i, &mut line);
        } else if c == '"' {
            let start = i;
            i = skip_quoted(&chars, i + 1, '"');
            count_lines(start, i, &mut line);
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{7b}') or a lifetime / label ('a, 'static).
            if next == Some('\\') {
                i = skip_quoted(&chars, i + 1, '\'');
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let at = chars.get(i).copied();
            match (word.as_str(), at) {
                ("r" | "br" | "cr", Some('"' | '#')) if raw_string_follows(&chars, i) => {
                    let begin = i;
                    i = skip_raw(&chars, i);
                    count_lines(begin, i, &mut line);
                }
                ("r", Some('#')) => i += 1, // a raw identifier: `r#type`
                ("b" | "c", Some('"')) => {
                    let begin = i;
                    i = skip_quoted(&chars, i + 1, '"');
                    count_lines(begin, i, &mut line);
                }
                ("b", Some('\'')) => i = skip_quoted(&chars, i + 1, '\''),
                _ => out.push((Tok::Ident(word), line)),
            }
        } else if c == ':' && next == Some(':') {
            out.push((Tok::PathSep, line));
            i += 2;
        } else {
            out.push((Tok::Punct(c), line));
            i += 1;
        }
    }
    out
}

/// The index after the closing `quote` of a literal whose body starts at `i`.
fn skip_quoted(chars: &[char], mut i: usize, quote: char) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// Whether `#*"` follows at `i` (a raw string rather than a raw identifier).
fn raw_string_follows(chars: &[char], mut i: usize) -> bool {
    while chars.get(i) == Some(&'#') {
        i += 1;
    }
    chars.get(i) == Some(&'"')
}

/// The index after a raw string whose `#`s start at `i`.
fn skip_raw(chars: &[char], mut i: usize) -> usize {
    let mut hashes = 0;
    while chars.get(i) == Some(&'#') {
        hashes += 1;
        i += 1;
    }
    i += 1; // the opening quote
    while i < chars.len() {
        if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        i += 1;
    }
    i
}

/// One leaf of a path tree: its segments as written, and the name it binds in a `use`.
struct Leaf {
    segments: Vec<String>,
    binds: Option<String>,
}

/// Parses a path tree starting at `i` (`a::b`, `a::{b, c::d as e, self}`, `a::*`), appending its
/// leaves under `prefix`; answers the index after it. Bounded by the token count.
fn path_tree(toks: &[(Tok, usize)], mut i: usize, prefix: &[String], out: &mut Vec<Leaf>) -> usize {
    let mut segments = prefix.to_vec();
    loop {
        match toks.get(i).map(|t| &t.0) {
            Some(Tok::Ident(word)) => {
                let is_self = word == "self" && !segments.is_empty() && i > 0;
                if !is_self {
                    segments.push(word.clone());
                }
                i += 1;
                if toks.get(i).map(|t| &t.0) == Some(&Tok::PathSep) {
                    i += 1;
                    continue;
                }
                let mut binds = segments.last().cloned();
                if matches!(toks.get(i).map(|t| &t.0), Some(Tok::Ident(w)) if w == "as") {
                    binds = match toks.get(i + 1).map(|t| &t.0) {
                        Some(Tok::Ident(alias)) => Some(alias.clone()),
                        _ => None,
                    };
                    i += 2;
                }
                out.push(Leaf { segments, binds });
                return i;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                while i < toks.len() {
                    match toks[i].0 {
                        Tok::Punct('}') => return i + 1,
                        Tok::Punct(',') => i += 1,
                        _ => {
                            let before = i;
                            i = path_tree(toks, i, &segments, out);
                            if i == before {
                                i += 1;
                            }
                        }
                    }
                }
                return i;
            }
            Some(Tok::Punct('*')) => {
                out.push(Leaf {
                    segments,
                    binds: None,
                });
                return i + 1;
            }
            _ => {
                if segments.len() > prefix.len() {
                    let binds = segments.last().cloned();
                    out.push(Leaf { segments, binds });
                }
                return i;
            }
        }
    }
}

/// The absolute path a written path names from `scope` (the module it is written in), or `None`
/// when it names something outside the crate (`std::..`, another crate).
fn absolute(written: &[String], scope: &[String], modules: &BTreeSet<ModPath>) -> Option<ModPath> {
    let first = written.first()?;
    let mut base: ModPath;
    let mut rest = written;
    match first.as_str() {
        "crate" => {
            base = Vec::new();
            rest = &rest[1..];
        }
        "self" => {
            base = scope.to_vec();
            rest = &rest[1..];
        }
        "super" => {
            base = scope.to_vec();
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        child => {
            let mut candidate = scope.to_vec();
            candidate.push(child.to_string());
            if !modules.contains(&candidate) {
                return None;
            }
            base = scope.to_vec();
        }
    }
    base.extend_from_slice(rest);
    Some(base)
}

fn read_file(module: &ModPath, file: &str, text: &str, modules: &BTreeSet<ModPath>) -> FileRefs {
    let toks = lex(text);
    let mut refs = FileRefs {
        module: module.clone(),
        references: Vec::new(),
        imports: BTreeMap::new(),
    };
    // Inline modules open here: (name, brace depth inside them).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let (tok, line) = (&toks[i].0, toks[i].1);
        match tok {
            Tok::Punct('{') => {
                depth += 1;
                i += 1;
                continue;
            }
            Tok::Punct('}') => {
                if inline.last().is_some_and(|&(_, d)| d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
                continue;
            }
            Tok::Ident(word) if word == "mod" => {
                if let (Some((Tok::Ident(name), _)), Some((Tok::Punct('{'), _))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    inline.push((name.clone(), depth + 1));
                    depth += 1;
                    i += 3;
                    continue;
                }
            }
            _ => {}
        }
        let starts_path = matches!(tok, Tok::Ident(_))
            && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::PathSep)
            && (i == 0 || toks[i - 1].0 != Tok::PathSep);
        if !starts_path {
            i += 1;
            continue;
        }
        let in_use = i > 0 && matches!(&toks[i - 1].0, Tok::Ident(w) if w == "use");
        let mut scope = module.clone();
        scope.extend(inline.iter().map(|(n, _)| n.clone()));
        let mut leaves = Vec::new();
        let after = path_tree(&toks, i, &[], &mut leaves);
        for leaf in leaves {
            let Some(target) = absolute(&leaf.segments, &scope, modules) else {
                continue;
            };
            if in_use && inline.is_empty() {
                if let Some(name) = &leaf.binds {
                    refs.imports.insert(name.clone(), target.clone());
                }
            }
            refs.references.push((
                target,
                Site {
                    file: file.to_string(),
                    line,
                    path: leaf.segments.join("::"),
                },
            ));
        }
        i = after.max(i + 1);
    }
    refs
}

/// Panics with every circle listed, or answers the graph; used by each crate's test.
pub fn assert_no_circles(src: &Path) -> ImportGraph {
    let graph = ImportGraph::of_src_dir(src).unwrap_or_else(|e| panic!("{e}"));
    let circles = graph.circles();
    let report: String = circles.iter().map(|c| c.to_string()).collect();
    assert!(
        circles.is_empty(),
        "modules of {} import modules that import them back; move the shared helper to a \
         module below both:\n{report}",
        src.display()
    );
    graph
}

#[cfg(test)]
mod reader {
    use super::*;

    fn graph(files: &[(&str, &str)]) -> ImportGraph {
        let sources: Vec<(ModPath, String, String)> = files
            .iter()
            .map(|(m, text)| {
                let module: ModPath = if m.is_empty() {
                    Vec::new()
                } else {
                    m.split("::").map(str::to_string).collect()
                };
                (module, format!("{m}.rs"), text.to_string())
            })
            .collect();
        ImportGraph::of_sources(&sources)
    }

    #[test]
    fn a_circle_of_three_through_use_lines_expressions_and_groups() {
        let g = graph(&[
            ("", "pub mod a; pub mod b; pub mod c;"),
            ("a", "use crate::b::Thing;"),
            ("b", "fn f() { super::c::helper(); }"),
            ("c", "use super::{a::{self, X}, d};"),
        ]);
        let circles = g.circles();
        assert_eq!(circles.len(), 1, "{circles:?}");
        assert_eq!(circles[0].modules.len(), 3);
        assert_eq!(circles[0].edges.len(), 3);
        assert!(circles[0].to_string().contains("crate::b -> crate::c"));
    }

    #[test]
    fn comments_and_literals_are_not_references() {
        let g = graph(&[
            ("", "mod a; mod b;"),
            ("a", "use crate::b::X;"),
            (
                "b",
                "/// [`crate::a`]\n// crate::a::Y\n/* crate::a /* nested */ crate::a */\n\
                 const S: &str = \"crate::a::Z\"; const R: &str = r#\"super::a\"#;\n\
                 const C: char = '{'; fn f<'x>(s: &'x str) {}",
            ),
        ]);
        assert!(g.refers("a", "b"));
        assert!(!g.refers("b", "a"), "{:?}", g.edges);
        assert!(g.circles().is_empty());
    }

    #[test]
    fn super_in_an_inline_module_means_the_files_module() {
        let g = graph(&[
            ("", "mod a; mod b;"),
            ("a", "use crate::b::X;"),
            (
                "b",
                "fn g() {} mod tests { use super::*; fn t() { super::g(); super::super::a::f(); } }",
            ),
        ]);
        assert!(
            g.refers("b", "a"),
            "a test module's `super::super::a` is a reference"
        );
        assert_eq!(g.circles().len(), 1);
        // After the test module's block closes, `super::` is the crate root again.
        let g = graph(&[
            ("", "mod a; mod b;"),
            ("a", "use crate::b::X;"),
            ("b", "mod tests { fn t() {} } fn g() { super::a::f(); }"),
        ]);
        assert!(g.refers("b", "a"));
    }

    #[test]
    fn re_exports_are_followed_to_the_module_that_defines_the_item() {
        let g = graph(&[
            (
                "",
                "pub mod a; pub mod b; pub use a::run; pub use b::{Report as Rep};",
            ),
            ("a", "use crate::Rep;"),
            ("b", "fn f() { crate::run(); }"),
        ]);
        assert!(g.refers("a", "b"));
        assert!(g.refers("b", "a"));
        assert_eq!(g.circles().len(), 1);
        // The root re-exporting its children is the module tree, not a circle.
        let g = graph(&[("", "pub mod a; pub use a::run;"), ("a", "use crate::X;")]);
        assert_eq!(g.edge_count(), 0);
    }

    #[test]
    fn nested_file_modules_resolve_through_super() {
        let g = graph(&[
            ("", "pub mod m;"),
            ("m", "pub mod x; pub mod y; pub use x::X;"),
            ("m::x", "use super::y::Y;"),
            ("m::y", "fn f() -> crate::m::X { todo!() }"),
        ]);
        assert!(g.refers("m::x", "m::y"));
        assert!(g.refers("m::y", "m::x"));
        assert_eq!(g.circles().len(), 1);
    }

    #[test]
    fn a_chain_is_no_circle() {
        let g = graph(&[
            ("", "mod a; mod b; mod c;"),
            ("a", "use crate::b::X; use std::fmt;"),
            ("b", "use crate::c::Y;"),
            ("c", "use serde::Serialize;"),
        ]);
        assert_eq!(g.edge_count(), 2);
        assert!(g.circles().is_empty());
    }
}
