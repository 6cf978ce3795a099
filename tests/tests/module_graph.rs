//! The architecture rules of the design, checked on the source tree:
//! - the dependency rule between crates: `models` ← `prefetcher`, `models` ← `pulse`,
//!   everything ← `tests`, nothing else;
//! - no module cycle inside a crate (a module is a `src/x.rs` file or a `src/x/` folder
//!   taken as one; its edges are the `crate::name` paths its production code names,
//!   unit tests left out);
//! - no production module of the prefetcher names its test harness (`testing`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file under `dir`, with the top-level module it belongs to.
fn files_by_module(src: &Path) -> Vec<(String, PathBuf)> {
    fn walk(dir: &Path, module: &str, out: &mut Vec<(String, PathBuf)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, module, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push((module.to_owned(), path));
            }
        }
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let module = path.file_stem().unwrap().to_str().unwrap().to_owned();
        if path.is_dir() {
            // `bin/` holds binaries, each a crate root of its own: not a module.
            if module != "bin" {
                walk(&path, &module, &mut out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push((module, path));
        }
    }
    out
}

/// The names a `crate::` path at the start of `rest` leads to: one name, or each
/// item's first name in a `crate::{a::X, b}` group.
fn crate_path_heads(rest: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let Some(group) = rest.strip_prefix('{') else {
        return vec![ident(rest)];
    };
    let (mut depth, mut heads, mut item_start) = (0usize, Vec::new(), 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                heads.push(ident(&group[item_start..i]));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                heads.push(ident(&group[item_start..i]));
                item_start = i + 1;
            }
            _ => {}
        }
    }
    heads.retain(|h| !h.is_empty());
    heads
}

/// Items the crate root defines itself (`pub const`, `pub fn`, ...): a path to them
/// is no module edge.
fn root_items(src: &Path) -> BTreeSet<String> {
    let root = std::fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
    root.lines()
        .filter_map(|l| {
            let l = l.trim_start().strip_prefix("pub ")?;
            let rest = ["const ", "fn ", "static ", "struct ", "enum ", "type "]
                .iter()
                .find_map(|kw| l.strip_prefix(kw))?;
            Some(
                rest.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect(),
            )
        })
        .collect()
}

/// The module graph of one crate. The crate root (`lib.rs`, `main.rs`) only
/// re-exports and assembles, so it is left out; comment lines and unit tests are
/// skipped.
fn module_graph(krate: &str) -> Graph {
    let src = workspace().join(krate).join("src");
    let root_items = root_items(&src);
    let mut graph = Graph::new();
    for (module, file) in files_by_module(&src) {
        if module == "lib" || module == "main" {
            continue;
        }
        let text: String = std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            // A module's unit tests (at its end, by convention) may use any module.
            .take_while(|l| !l.starts_with("#[cfg(test)]"))
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let uses = graph.entry(module.clone()).or_default();
        for (at, _) in text.match_indices("crate::") {
            for name in crate_path_heads(&text[at + "crate::".len()..]) {
                if name != module && !root_items.contains(&name) {
                    uses.insert(name);
                }
            }
        }
    }
    graph
}

/// A cycle in `graph` as the path of modules around it, if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if !done.insert(node.to_owned()) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// Checks one crate's graph: every edge names a module (a path through a root
/// re-export, `crate::Node`, would hide an edge) and there is no cycle.
fn check_crate(krate: &str) -> Graph {
    let graph = module_graph(krate);
    assert!(!graph.is_empty(), "{krate}: no modules found");
    for (module, uses) in &graph {
        for name in uses {
            assert!(
                graph.contains_key(name),
                "{krate}: {module} names crate::{name}, which is no module"
            );
        }
    }
    assert_eq!(find_cycle(&graph), None, "{krate}: {graph:#?}");
    graph
}

#[test]
fn no_crate_has_a_module_cycle() {
    for krate in ["models", "pulse", "prefetcher", "tests"] {
        check_crate(krate);
    }
}

#[test]
fn no_production_module_of_the_prefetcher_names_its_test_harness() {
    let graph = check_crate("prefetcher");
    assert!(graph.contains_key("proxy") && graph.contains_key("testing"));
    for (module, uses) in &graph {
        assert!(
            module == "testing" || !uses.contains("testing"),
            "{module} depends on the test harness"
        );
    }
}

/// The workspace crates a crate's manifest depends on (any dependency table).
fn workspace_dependencies(krate: &str) -> BTreeSet<String> {
    let manifest = std::fs::read_to_string(workspace().join(krate).join("Cargo.toml")).unwrap();
    let mut deps = BTreeSet::new();
    let mut in_deps = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line.contains("dependencies");
            continue;
        }
        let name = line.split(['=', '.', ' ']).next().unwrap_or_default();
        // A crate's dev-dependency on itself (to switch on a feature) is no edge.
        if in_deps && name != krate && ["models", "pulse", "prefetcher", "tests"].contains(&name) {
            deps.insert(name.to_owned());
        }
    }
    deps
}

#[test]
fn crates_follow_the_dependency_rule() {
    let allowed: [(&str, &[&str]); 4] = [
        ("models", &[]),
        ("prefetcher", &["models"]),
        ("pulse", &["models"]),
        ("tests", &["models", "prefetcher", "pulse"]),
    ];
    for (krate, allowed) in allowed {
        let deps = workspace_dependencies(krate);
        let extra: Vec<_> = deps
            .iter()
            .filter(|d| !allowed.contains(&d.as_str()))
            .collect();
        assert!(extra.is_empty(), "{krate} depends on {extra:?}");
    }
    // The reader sees what it must: the tests crate names all three.
    assert_eq!(workspace_dependencies("tests").len(), 3);
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    let graph: Graph = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(m, uses)| (m.into(), uses.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(find_cycle(&graph).unwrap(), ["a", "b", "c", "a"]);
}
