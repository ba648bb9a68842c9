//! The source layout stays honest: these tests read `src/` as text, the way a reviewer would.
//!
//! - No two modules import each other. A module imports another when one of its files names it
//!   through `use crate::…`, `crate::x::…`, `super::…` or `self::…` (in `use` trees and in paths
//!   in code alike; also a string that is nothing but such a path, as in serde's
//!   `deserialize_with = "…"`). This holds for the top-level modules of the crate and for the
//!   sibling submodules in any folder (`src/config/policy.rs` and `src/config/tasks.rs` are
//!   siblings). A path through a re-export is followed to where the item is defined, so a
//!   `super::Name` that the folder's `mod.rs` re-exports from a sibling still imports that
//!   sibling. Test modules (`#[cfg(test)] mod tests`) count too: a test that needs another
//!   module belongs above both. A parent using its children, or a child using its parent's own
//!   items, is not a cycle.
//! - No longer cycles either (a → b → c → a): [`no_import_cycles`].
//! - No function on the data path (`src/outbound`, `src/inbound`, `src/http`) is longer than
//!   [`MAX_FN_LINES`] lines, counted from the `fn` line to its closing brace. Functions inside
//!   test modules are not counted.
//! - Every source path `docs/architecture.md` names in backticks exists, so the page that says
//!   where each step of a request lives cannot go stale: [`architecture_names_files_that_exist`].
//! - The library is the sidecar: the subcommands and the terminal client are the binary's
//!   (`src/bin/agent-reach/`), the demo and the mock agent crates of their own (`examples/demo`,
//!   `examples/testkit`), and no library module names them; nothing in the workspace includes a
//!   file by `#[path]` or names its own crate through `extern crate self`:
//!   [`the_library_is_the_sidecar`]. The import rules above hold in every crate of the workspace.
//!
//! The scanner is deliberately simple: comments and literals are blanked out, then paths are
//! read and braces matched. It does not expand macros, see method calls (an inherent impl
//! written in another module is invisible), or follow `#[path]` attributes. `LAYOUT_EDGES=1
//! cargo test --test it layout:: -- --nocapture` prints every edge it found.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

/// The longest a data-path function may be, in lines.
const MAX_FN_LINES: usize = 80;

/// The folders whose functions [`MAX_FN_LINES`] applies to.
const DATA_PATH: [&str; 5] = ["outbound", "inbound", "http", "peers", "reach"];

/// The library (`src/`), the binary (`src/bin/agent-reach/`) and the workspace's other crates'
/// libraries, each with the folder it is read from: the import rules hold in all of them.
fn crates() -> [(&'static str, Crate); 4] {
    [
        ("src", Crate::read()),
        (BINARY, Crate::read_from(BINARY, "main")),
        (
            "examples/demo/src",
            Crate::read_from("examples/demo/src", "lib"),
        ),
        (
            "examples/testkit/src",
            Crate::read_from("examples/testkit/src", "lib"),
        ),
    ]
}

/// The binary's folder, a crate of its own (its root is `main.rs`).
const BINARY: &str = "src/bin/agent-reach";

/// What belongs to the binary, never to the library: the subcommands and the terminal commands'
/// blocking client.
const BINARY_ONLY: [&str; 2] = ["commands", "blocking"];

/// The folders of the workspace's Rust sources.
const WORKSPACE: [&str; 4] = ["src", "tests", "benches", "examples"];

#[test]
fn the_library_is_the_sidecar() {
    let library = Crate::read();
    let mut report = String::new();
    for file in &library.files {
        let top = file.module.first().map_or("", String::as_str);
        if BINARY_ONLY.contains(&top) {
            let _ = writeln!(report, "{}: a library module `{top}`", file.path.display());
        }
        for name in BINARY_ONLY {
            for offset in words(&file.text, &format!("crate::{name}")) {
                let _ = writeln!(
                    report,
                    "{}:{}: names `crate::{name}`",
                    file.path.display(),
                    file.line_of(offset)
                );
            }
        }
    }
    let mut sources = Vec::new();
    for folder in WORKSPACE {
        walk(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join(folder),
            &mut sources,
        );
    }
    for path in sources {
        let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        for pattern in ["#[path", "extern crate self"] {
            if text.lines().any(|l| l.trim_start().starts_with(pattern)) {
                let _ = writeln!(report, "{}: `{pattern}`", path.display());
            }
        }
    }
    assert!(
        report.is_empty(),
        "the library imports what belongs to the binary ({BINARY}), or a file is included by \
         path:\n{report}"
    );
    let binary = Crate::read_from(BINARY, "main");
    for name in BINARY_ONLY {
        assert!(
            binary.modules.contains(&vec![name.to_owned()]),
            "{BINARY} has no module `{name}` (update BINARY_ONLY)"
        );
    }
}

#[test]
fn no_two_modules_import_each_other() {
    let mut report = String::new();
    for (root, crate_) in crates() {
        for (folder, graph) in &crate_.graphs() {
            for (from, tos) in graph {
                for (to, evidence) in tos {
                    let back = graph.get(to).and_then(|tos| tos.get(from));
                    if let (true, Some(back)) = (from < to, back) {
                        let _ = writeln!(
                        report,
                        "{}: {from} ↔ {to}\n    {from} → {to}: {evidence}\n    {to} → {from}: {back}",
                        place(root, folder)
                    );
                    }
                }
            }
        }
    }
    assert!(
        report.is_empty(),
        "modules that import each other (move the types to their owner, or invert the \
         dependency; a re-export does not break a cycle):\n{report}"
    );
}

#[test]
fn no_import_cycles() {
    let mut report = String::new();
    for (root, crate_) in crates() {
        for (folder, graph) in &crate_.graphs() {
            for cycle in cycles(graph) {
                let _ = writeln!(report, "{}: {}", place(root, folder), cycle.join(", "));
                let members: BTreeSet<&String> = cycle.iter().collect();
                for from in &cycle {
                    for (to, evidence) in &graph[from] {
                        if members.contains(to) {
                            let _ = writeln!(report, "    {from} → {to}: {evidence}");
                        }
                    }
                }
            }
        }
    }
    assert!(
        report.is_empty(),
        "modules that import each other through others:\n{report}"
    );
}

fn place(root: &str, folder: &[String]) -> String {
    if folder.is_empty() {
        format!("top-level modules of {root}")
    } else {
        format!("submodules of {root}/{}", folder.join("/"))
    }
}

#[test]
fn data_path_functions_are_short() {
    let crate_ = Crate::read();
    let mut long = Vec::new();
    for file in &crate_.files {
        let folder = file.module.first().map_or("", String::as_str);
        if !DATA_PATH.contains(&folder) || file.test_only {
            continue;
        }
        for f in functions(&file.text) {
            if f.lines > MAX_FN_LINES && !file.in_test_module(f.offset) {
                long.push(format!(
                    "{}:{}: fn {} is {} lines",
                    file.path.display(),
                    f.line,
                    f.name,
                    f.lines
                ));
            }
        }
    }
    assert!(
        long.is_empty(),
        "data-path functions longer than {MAX_FN_LINES} lines (split them into steps):\n{}",
        long.join("\n")
    );
}

/// A swap of the YAML parser to a maintained fork touches one file (`src/config/yaml.rs`).
#[test]
fn yaml_is_parsed_in_one_file() {
    let crate_ = Crate::read();
    let users: Vec<String> = crate_
        .files
        .iter()
        .filter(|f| f.path != Path::new("src/config/yaml.rs"))
        .filter(|f| words(&f.text, "serde_yaml").next().is_some())
        .map(|f| f.path.display().to_string())
        .collect();
    assert!(
        users.is_empty(),
        "serde_yaml named outside src/config/yaml.rs (use its functions instead): {users:?}"
    );
}

/// HMAC-SHA256 and SHA-256 come from ring, already linked through rustls.
#[test]
fn digests_come_from_ring() {
    let manifest = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .unwrap_or_else(|e| panic!("Cargo.toml: {e}"));
    let mut section = "";
    let mut found = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section.ends_with("dependencies]") {
            let name = line.split(['=', ' ', '.']).next().unwrap_or_default();
            if ["hmac", "sha2"].contains(&name) {
                found.push(format!("{section} {name}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "use ring::hmac / ring::digest instead: {found:?}"
    );
}

/// `docs/architecture.md` names the file of every step; a step moved or renamed without the page
/// fails here. A path is any backtick-quoted text that starts with `src/`, up to the first
/// character that cannot be in a path; a folder counts as well as a file.
#[test]
fn architecture_names_files_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = fs::read_to_string(root.join("docs/architecture.md"))
        .unwrap_or_else(|e| panic!("docs/architecture.md: {e}"));
    let named = source_paths_in_backticks(&page);
    // A page that names a handful of files is no map of the stacks; nor is a parse that found none.
    assert!(
        named.len() >= 40,
        "docs/architecture.md names only {} source paths in backticks: {named:?}",
        named.len()
    );
    let missing: Vec<&String> = named.iter().filter(|p| !root.join(p).exists()).collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md names source paths that do not exist (update the page with the \
         code): {missing:?}"
    );
    assert_eq!(
        source_paths_in_backticks(
            "a `src/a/b.rs` b `src/c/` (`src/d.rs`, `Outbound::stack`) `src/e.rs:12`)\n\
             ```text\nsrc/f.rs `src/g.rs\n```\n`src/h.rs`"
        ),
        BTreeSet::from(
            ["src/a/b.rs", "src/c/", "src/d.rs", "src/e.rs", "src/h.rs"].map(String::from)
        ),
    );
}

/// Every backtick-quoted span of `text` that starts with `src/`, cut at the first character
/// that is not part of a path. Fenced code blocks are left out (their fences are backticks too).
fn source_paths_in_backticks(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let prose: Vec<&str> = text
        .lines()
        .filter(|line| {
            let fence = line.trim_start().starts_with("```");
            fenced ^= fence;
            !fence && !fenced
        })
        .collect();
    prose
        .join("\n")
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| span.starts_with("src/"))
        .map(|span| {
            let end = span
                .find(|c: char| !(c.is_ascii_alphanumeric() || "_./-".contains(c)))
                .unwrap_or(span.len());
            span[..end].trim_end_matches('.').to_owned()
        })
        .collect()
}

/// The scanner's own checks, so a blind spot shows up here rather than as a silent pass.
#[test]
fn scanner_sees_what_it_should() {
    let text = scrub(
        "// crate::a::b\nlet s = \"crate::x::y {\"; let c = '{'; let l: &'a str = r#\"}\"#;\n\
         fn f<'a>(x: [u8; 2]) -> u8 {\n    if true { 1 } else { 2 }\n}\nfn g();\n",
    );
    assert!(!text.contains("crate::"), "{text}");
    let serde = scrub("#[serde(with = \"super::scalar::names\")] x: \"crate::a b\"");
    assert!(serde.contains(" super::scalar::names "), "{serde}");
    assert!(!serde.contains("crate"), "{serde}");
    let fs = functions(&text);
    assert_eq!(fs.len(), 1, "{fs:?}");
    assert_eq!((fs[0].name.as_str(), fs[0].line, fs[0].lines), ("f", 3, 3));

    let uses = use_trees("crate::{a::{B, c as d}, e::*}");
    let paths: Vec<String> = uses.iter().map(|u| u.render()).collect();
    assert_eq!(paths, ["crate::a::B", "crate::a::c as d", "crate::e::*"]);

    // A re-export is followed, and `super` in an inline module is relative to it.
    let crate_ = Crate::from_files(vec![
        ("x/mod.rs", "mod a; mod b; use a::Thing;"),
        ("x/a.rs", "pub struct Thing; fn f() { super::b::g() }"),
        (
            "x/b.rs",
            "#[cfg(test)] mod tests { use super::super::Thing; }",
        ),
    ]);
    let edges: Vec<String> = crate_
        .edges()
        .keys()
        .map(|(folder, from, to)| format!("{}: {from} → {to}", folder.join("/")))
        .collect();
    assert_eq!(edges, ["x: a → b", "x: b → a"]);
}

/// One `.rs` file of the crate.
struct File {
    path: PathBuf,
    /// The module this file defines, from the crate root: `src/config/policy.rs` is
    /// `["config", "policy"]`, `src/config/mod.rs` and `src/config.rs` are `["config"]`.
    module: Vec<String>,
    /// The text with comments and literals blanked out (same length, same lines).
    text: String,
    /// Inline modules: byte range of the body, name, whether it is `#[cfg(test)]`.
    inline: Vec<(std::ops::Range<usize>, String, bool)>,
    /// Declared as `#[cfg(test)] mod x;` by its parent.
    test_only: bool,
}

impl File {
    fn line_of(&self, offset: usize) -> usize {
        self.text[..offset].matches('\n').count() + 1
    }

    /// The module a position in this file is in, inline modules included.
    fn module_at(&self, offset: usize) -> Vec<String> {
        let mut module = self.module.clone();
        for (body, name, _) in &self.inline {
            if body.contains(&offset) {
                module.push(name.clone());
            }
        }
        module
    }

    fn in_test_module(&self, offset: usize) -> bool {
        self.inline
            .iter()
            .any(|(body, _, test)| *test && body.contains(&offset))
    }
}

struct Crate {
    files: Vec<File>,
    /// Every module that has a file.
    modules: BTreeSet<Vec<String>>,
}

/// `from` → `to` → where `from` names `to`.
type Graph = BTreeMap<String, BTreeMap<String, String>>;

impl Crate {
    /// The library: `src/` but the binary's folder.
    fn read() -> Crate {
        Crate::read_from("src", "lib")
    }

    /// The crate in `folder` (relative to the package), whose root file is `root.rs`.
    fn read_from(folder: &str, root: &str) -> Crate {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(folder);
        let mut found = Vec::new();
        walk(&src, &mut found);
        if root == "lib" {
            found.retain(|path| !path.starts_with(src.join("bin")) && *path != src.join("main.rs"));
        }
        let files = found
            .into_iter()
            .map(|path| {
                let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
                let relative = path
                    .strip_prefix(&src)
                    .unwrap_or_else(|e| panic!("{path:?}: {e}"))
                    .to_string_lossy()
                    .replace('\\', "/");
                (relative, text)
            })
            .collect();
        Crate::from_parts(files, Path::new(folder), root)
    }

    fn from_files(files: Vec<(&str, &str)>) -> Crate {
        let files = files
            .into_iter()
            .map(|(path, text)| (path.to_string(), text.to_string()))
            .collect();
        Crate::from_parts(files, Path::new(""), "lib")
    }

    /// `files` are (path relative to `src/`, text).
    fn from_parts(files: Vec<(String, String)>, root: &Path, root_file: &str) -> Crate {
        let mut out = Vec::new();
        for (relative, text) in files {
            let Some(stem) = relative.strip_suffix(".rs") else {
                continue;
            };
            let mut module: Vec<String> = stem.split('/').map(String::from).collect();
            if module.last().is_some_and(|last| last == "mod") {
                module.pop();
            }
            // The root file (lib.rs, or the binary's main.rs) is the crate root (its re-exports
            // are followed).
            if module.len() == 1 && module[0] == root_file {
                module.clear();
            }
            let text = scrub(&text);
            let inline = inline_modules(&text);
            out.push(File {
                path: root.join(&relative),
                module,
                text,
                inline,
                test_only: false,
            });
        }
        let modules: BTreeSet<Vec<String>> = out.iter().map(|f| f.module.clone()).collect();

        // A file declared `#[cfg(test)] mod x;` is test code throughout.
        let mut test_only = BTreeSet::new();
        for file in &out {
            for (offset, name) in file_mod_declarations(&file.text) {
                if attributes_before(&file.text, offset).contains("cfg(test)") {
                    let mut child = file.module_at(offset);
                    child.push(name);
                    test_only.insert(child);
                }
            }
        }
        for file in &mut out {
            file.test_only = test_only.contains(&file.module);
        }
        Crate {
            files: out,
            modules,
        }
    }

    /// The edges grouped by the folder they are in (the empty folder is the crate root).
    fn graphs(&self) -> BTreeMap<Vec<String>, Graph> {
        let edges = self.edges();
        let print = std::env::var_os("LAYOUT_EDGES").is_some();
        let mut graphs: BTreeMap<Vec<String>, Graph> = BTreeMap::new();
        for ((folder, from, to), evidence) in edges {
            if print {
                println!("{}: {from} → {to}  {evidence}", place("src", &folder));
            }
            graphs
                .entry(folder)
                .or_default()
                .entry(from)
                .or_default()
                .insert(to, evidence);
        }
        graphs
    }

    /// (folder, from, to) → evidence, for every reference that crosses between two modules
    /// that share `folder` as their nearest common parent.
    fn edges(&self) -> BTreeMap<(Vec<String>, String, String), String> {
        let imports = self.imports();
        let mut edges = BTreeMap::new();
        for file in &self.files {
            for reference in references(file) {
                let Some(path) = self.absolute(file, reference.offset, &reference.path) else {
                    continue;
                };
                let target = self.resolve(&path, &imports);
                let from = &file.module;
                let common = from.iter().zip(&target).take_while(|(a, b)| a == b).count();
                // A parent naming its child, or a child naming its ancestor, is not an edge.
                if common == from.len() || common == target.len() {
                    continue;
                }
                let key = (
                    from[..common].to_vec(),
                    from[common].clone(),
                    target[common].clone(),
                );
                edges.entry(key).or_insert_with(|| {
                    format!(
                        "{}:{} `{}`",
                        file.path.display(),
                        file.line_of(reference.offset),
                        reference.text
                    )
                });
            }
        }
        edges
    }

    /// Names each module brings into scope with a file-level `use`: (module, name) → the
    /// absolute path it stands for. Globs are not followed.
    fn imports(&self) -> BTreeMap<(Vec<String>, String), Vec<String>> {
        let mut imports = BTreeMap::new();
        for file in &self.files {
            for (offset, tree) in use_statements(&file.text) {
                if file.module_at(offset) != file.module {
                    continue;
                }
                for u in use_trees(tree) {
                    if u.glob {
                        continue;
                    }
                    let Some(path) = self.absolute(file, offset, &u.path) else {
                        continue;
                    };
                    let name = u.alias.clone().or_else(|| u.path.last().cloned());
                    if let Some(name) = name {
                        imports.insert((file.module.clone(), name), path);
                    }
                }
            }
        }
        imports
    }

    /// A path as written at `offset` in `file`, made absolute (from the crate root); `None`
    /// for paths into other crates or names this scanner cannot place.
    fn absolute(&self, file: &File, offset: usize, path: &[String]) -> Option<Vec<String>> {
        let here = file.module_at(offset);
        let first = path.first()?;
        let mut out = match first.as_str() {
            "crate" => return Some(path[1..].to_vec()),
            "self" | "super" => here,
            // Rust 2018: a `use` may start with a child module's name.
            name => {
                let mut child = here.clone();
                child.push(name.to_string());
                if !self.modules.contains(&child) {
                    return None;
                }
                here
            }
        };
        let mut rest = path;
        while let Some((segment, tail)) = rest.split_first() {
            match segment.as_str() {
                "self" => {}
                "super" => {
                    out.pop()?;
                }
                _ => break,
            }
            rest = tail;
        }
        out.extend(rest.iter().cloned());
        Some(out)
    }

    /// The module that defines what `path` names: the longest prefix that is a module with a
    /// file, following names that module imports (re-exports) from elsewhere.
    fn resolve(
        &self,
        path: &[String],
        imports: &BTreeMap<(Vec<String>, String), Vec<String>>,
    ) -> Vec<String> {
        let mut path = path.to_vec();
        for _ in 0..16 {
            let known = (0..=path.len())
                .rev()
                .find(|&n| n == 0 || self.modules.contains(&path[..n]))
                .unwrap_or(0);
            let module = path[..known].to_vec();
            let Some(name) = path.get(known) else {
                return module;
            };
            match imports.get(&(module.clone(), name.clone())) {
                Some(target) if *target != path[..=known] => {
                    let mut next = target.clone();
                    next.extend(path[known + 1..].iter().cloned());
                    path = next;
                }
                _ => return module,
            }
        }
        path
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{dir:?}: {e}"))
        .map(|entry| {
            entry
                .map(|e| e.path())
                .unwrap_or_else(|e| panic!("{dir:?}: {e}"))
        })
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// Strongly connected components with more than one module, each sorted.
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    let nodes: BTreeSet<&String> = graph
        .iter()
        .flat_map(|(from, tos)| std::iter::once(from).chain(tos.keys()))
        .collect();
    let reaches = |start: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![start.clone()];
        while let Some(node) = stack.pop() {
            for next in graph.get(&node).into_iter().flat_map(|tos| tos.keys()) {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|&node| (node, reaches(node))).collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    for &node in &nodes {
        if out.iter().any(|c| c.contains(node)) {
            continue;
        }
        let component: Vec<String> = nodes
            .iter()
            .filter(|&&other| {
                other == node || (reach[node].contains(other) && reach[other].contains(node))
            })
            .map(|&other| other.clone())
            .collect();
        if component.len() > 1 {
            out.push(component);
        }
    }
    out
}

/// Comments, strings and char literals replaced by spaces (newlines kept), so braces and
/// paths in them are not seen.
fn scrub(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let prev = if i == 0 { ' ' } else { chars[i - 1] };
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
        } else if c == 'r' && !is_ident(prev) || (c == 'b' || c == 'c') && next == Some('r') {
            // Possibly a raw string: r"…", r#"…"#, br"…", cr"…".
            let start = if c == 'r' { i + 1 } else { i + 2 };
            let hashes = chars[start.min(chars.len())..]
                .iter()
                .take_while(|&&h| h == '#')
                .count();
            if (c == 'r' || !is_ident(prev)) && chars.get(start + hashes) == Some(&'"') {
                let mut j = start + hashes + 1;
                loop {
                    if j >= chars.len() {
                        break;
                    }
                    if chars[j] == '"'
                        && chars[j + 1..].iter().take_while(|&&h| h == '#').count() >= hashes
                    {
                        j += 1 + hashes;
                        break;
                    }
                    j += 1;
                }
                for &k in &chars[i..j.min(chars.len())] {
                    blank(&mut out, k);
                }
                i = j;
            } else {
                out.push(c);
                i += 1;
            }
        } else if c == '"' {
            let start = i;
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            let end = (i + 1).min(chars.len());
            let content: String = chars[start + 1..i.min(chars.len())].iter().collect();
            if is_path(&content) {
                // serde's `with = "super::x::f"`: a path all the same.
                out.push(' ');
                out.push_str(&content);
                out.push(' ');
            } else {
                for &k in &chars[start..end] {
                    blank(&mut out, k);
                }
            }
            i = end;
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            // A char literal ('x', '\n', '\u{1F600}'); a lifetime ('a) has no closing quote.
            let mut j = i + 1;
            if chars.get(j) == Some(&'\\') {
                j += 2;
            } else {
                j += 1;
            }
            while j < chars.len() && chars[j] != '\'' {
                j += 1;
            }
            for &k in &chars[i..=j.min(chars.len() - 1)] {
                blank(&mut out, k);
            }
            i = j + 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// `crate::a::b`, `super::f`, `self::x`: a path into this crate and nothing else.
fn is_path(text: &str) -> bool {
    let mut segments = text.split("::");
    matches!(segments.next(), Some("crate" | "super" | "self"))
        && text.contains("::")
        && segments.all(|s| ident_at(s, 0) == Some(s))
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Offsets where `word` occurs as a whole word.
fn words<'a>(text: &'a str, word: &'a str) -> impl Iterator<Item = usize> + 'a {
    let bytes = text.as_bytes();
    text.match_indices(word)
        .map(|(at, _)| at)
        .filter(move |&at| {
            let before = at.checked_sub(1).map(|b| bytes[b]);
            let after = bytes.get(at + word.len()).copied();
            !before.is_some_and(|b| is_ident_byte(b) || b == b'$')
                && !after.is_some_and(is_ident_byte)
        })
}

fn skip_space(text: &str, mut at: usize) -> usize {
    let bytes = text.as_bytes();
    while at < bytes.len() && bytes[at].is_ascii_whitespace() {
        at += 1;
    }
    at
}

fn ident_at(text: &str, at: usize) -> Option<&str> {
    let bytes = text.as_bytes();
    let end = (at..bytes.len())
        .find(|&i| !is_ident_byte(bytes[i]))
        .unwrap_or(bytes.len());
    (end > at && !bytes[at].is_ascii_digit()).then(|| &text[at..end])
}

/// The offset of the brace that closes the one at `open`.
fn closing_brace(text: &str, open: usize) -> usize {
    let mut depth = 0usize;
    for (i, b) in text.bytes().enumerate().skip(open) {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    text.len()
}

/// The attributes (and visibility) written just before an item starting near `offset`.
fn attributes_before(text: &str, offset: usize) -> &str {
    let start = text[..offset].rfind([';', '{', '}']).map_or(0, |at| at + 1);
    &text[start..offset]
}

/// Inline modules: `mod name { … }` → (body range, name, is `#[cfg(test)]`).
fn inline_modules(text: &str) -> Vec<(std::ops::Range<usize>, String, bool)> {
    let mut out = Vec::new();
    for at in words(text, "mod") {
        let name_at = skip_space(text, at + 3);
        let Some(name) = ident_at(text, name_at) else {
            continue;
        };
        let open = skip_space(text, name_at + name.len());
        if text.as_bytes().get(open) == Some(&b'{') {
            let test = attributes_before(text, at).contains("cfg(test)");
            out.push((open..closing_brace(text, open), name.to_string(), test));
        }
    }
    out
}

/// `mod name;` declarations → (offset, name).
fn file_mod_declarations(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for at in words(text, "mod") {
        let name_at = skip_space(text, at + 3);
        if let Some(name) = ident_at(text, name_at) {
            let end = skip_space(text, name_at + name.len());
            if text.as_bytes().get(end) == Some(&b';') {
                out.push((at, name.to_string()));
            }
        }
    }
    out
}

/// `use` statements → (offset, the tree between `use` and `;`).
fn use_statements(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    for at in words(text, "use") {
        let start = skip_space(text, at + 3);
        let first = text.as_bytes().get(start).copied();
        // `use<'a>` in `impl Trait + use<'a>` is not an import.
        if !first.is_some_and(|b| is_ident_byte(b) || b == b'{' || b == b':') {
            continue;
        }
        if let Some(end) = text[start..].find(';') {
            out.push((at, &text[start..start + end]));
        }
    }
    out
}

/// One leaf of a `use` tree.
#[derive(Debug)]
struct UsePath {
    path: Vec<String>,
    alias: Option<String>,
    glob: bool,
}

impl UsePath {
    fn render(&self) -> String {
        let mut s = self.path.join("::");
        if self.glob {
            s.push_str("::*");
        }
        if let Some(alias) = &self.alias {
            let _ = write!(s, " as {alias}");
        }
        s
    }
}

/// `crate::{a::{B, c as d}, e::*}` → its leaves.
fn use_trees(tree: &str) -> Vec<UsePath> {
    let tokens: Vec<String> = {
        let mut tokens = Vec::new();
        let bytes = tree.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if is_ident_byte(bytes[i]) {
                let end = (i..bytes.len())
                    .find(|&j| !is_ident_byte(bytes[j]))
                    .unwrap_or(bytes.len());
                tokens.push(tree[i..end].to_string());
                i = end;
            } else if bytes[i] == b':' {
                i += 2;
            } else {
                if !bytes[i].is_ascii_whitespace() {
                    tokens.push((bytes[i] as char).to_string());
                }
                i += 1;
            }
        }
        tokens
    };
    let mut out = Vec::new();
    let mut at = 0;
    parse_tree(&tokens, &mut at, &mut Vec::new(), &mut out);
    out
}

fn parse_tree(tokens: &[String], at: &mut usize, prefix: &mut Vec<String>, out: &mut Vec<UsePath>) {
    let depth = prefix.len();
    loop {
        match tokens.get(*at).map(String::as_str) {
            Some("{") => {
                *at += 1;
                loop {
                    parse_tree(tokens, at, prefix, out);
                    match tokens.get(*at).map(String::as_str) {
                        Some(",") => *at += 1,
                        Some("}") => {
                            *at += 1;
                            break;
                        }
                        _ => break,
                    }
                    if tokens.get(*at).map(String::as_str) == Some("}") {
                        *at += 1;
                        break;
                    }
                }
                break;
            }
            Some("*") => {
                *at += 1;
                out.push(UsePath {
                    path: prefix.clone(),
                    alias: None,
                    glob: true,
                });
                break;
            }
            Some(token) if token != "," && token != "}" => {
                prefix.push(token.to_string());
                *at += 1;
                let next = tokens.get(*at).map(String::as_str);
                if next == Some("as") {
                    let alias = tokens.get(*at + 1).cloned();
                    *at += 2;
                    push_leaf(prefix, alias, out);
                    break;
                }
                // A path segment is followed by another segment or a group; anything else
                // ends the leaf.
                if !matches!(next, Some(t) if t == "{" || t == "*" || is_path_token(t)) {
                    push_leaf(prefix, None, out);
                    break;
                }
            }
            _ => break,
        }
    }
    prefix.truncate(depth);
}

fn is_path_token(token: &str) -> bool {
    token.bytes().all(is_ident_byte) && token != "as"
}

fn push_leaf(prefix: &[String], alias: Option<String>, out: &mut Vec<UsePath>) {
    // `use a::b::{self}` names `a::b`.
    let mut path = prefix.to_vec();
    if path.len() > 1 && path.last().is_some_and(|l| l == "self") {
        path.pop();
    }
    out.push(UsePath {
        path,
        alias,
        glob: false,
    });
}

/// A path that names another module of this crate, as written.
struct Reference {
    offset: usize,
    path: Vec<String>,
    text: String,
}

/// Every `use` leaf, and every `crate::…`, `super::…`, `self::…` path outside `use`.
fn references(file: &File) -> Vec<Reference> {
    let text = &file.text;
    let mut out = Vec::new();
    let mut spans = Vec::new();
    for (offset, tree) in use_statements(text) {
        let start = tree.as_ptr() as usize - text.as_ptr() as usize;
        spans.push(offset..start + tree.len());
        for u in use_trees(tree) {
            out.push(Reference {
                offset,
                text: format!("use {}", u.render()),
                path: u.path,
            });
        }
    }
    for root in ["crate", "super", "self"] {
        for at in words(text, root) {
            if spans.iter().any(|span| span.contains(&at)) {
                continue;
            }
            // Skip `a::super` (continuation of a path already seen) and a lone `self`.
            if text[..at].trim_end().ends_with("::")
                || !text[at..].starts_with(&format!("{root}::"))
            {
                continue;
            }
            let mut path = Vec::new();
            let mut i = at;
            while let Some(segment) = ident_at(text, i) {
                path.push(segment.to_string());
                i += segment.len();
                if text[i..].starts_with("::") {
                    i += 2;
                } else {
                    break;
                }
            }
            out.push(Reference {
                offset: at,
                text: path.join("::"),
                path,
            });
        }
    }
    out
}

/// A function definition in a file.
#[derive(Debug)]
struct Function {
    name: String,
    offset: usize,
    line: usize,
    lines: usize,
}

/// Every `fn name … { … }` (declarations without a body are skipped).
fn functions(text: &str) -> Vec<Function> {
    let bytes = text.as_bytes();
    let line_of = |offset: usize| text[..offset].matches('\n').count() + 1;
    let mut out = Vec::new();
    for at in words(text, "fn") {
        let name_at = skip_space(text, at + 2);
        let Some(name) = ident_at(text, name_at) else {
            continue;
        };
        // The body starts at the first `{` outside (), [] and <>; a `;` first means no body.
        let mut depth = 0i32;
        let mut open = None;
        for (i, &b) in bytes.iter().enumerate().skip(name_at) {
            match b {
                b'(' | b'[' | b'<' => depth += 1,
                b')' | b']' => depth -= 1,
                b'>' if bytes[i - 1] != b'-' && bytes[i - 1] != b'=' => depth -= 1,
                b'{' if depth == 0 => {
                    open = Some(i);
                    break;
                }
                b';' if depth == 0 => break,
                _ => {}
            }
        }
        let Some(open) = open else { continue };
        let close = closing_brace(text, open);
        let line = line_of(at);
        out.push(Function {
            name: name.to_string(),
            offset: at,
            line,
            lines: line_of(close) - line + 1,
        });
    }
    out
}
