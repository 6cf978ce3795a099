//! The architecture rules of the design, checked on the source tree. Each rule is a
//! function from a tree's root to the breaches it finds; each runs on this workspace
//! (or on the tree `MODULE_GRAPH_ROOT` names) and, in `breaches.rs`, on a small
//! synthetic tree that breaks it, so every check is seen to fail.
//! - The dependency rule between crates: `models` ← `prefetcher`, `models` ← `pulse`,
//!   everything ← `tests`, nothing else; `fuzz/` (a workspace of its own) may depend
//!   on `models`, `prefetcher` and `pulse`, and nothing depends on it.
//! - The machine-learning crates ([`ML_CRATES`]) are used by `pulse` only: no other
//!   manifest names them and no other crate's code (tests included) names them in a path.
//! - No module cycle inside a crate. A module is a `src/x.rs` file or a `src/x/` folder
//!   taken as one; its edges are the `crate::name` paths its code names: whole files,
//!   comments and string literals left out, and the unit tests, the brace-matched
//!   `#[cfg(test)] mod … { … }` blocks (they may use any module).
//! - No production module of the prefetcher or of pulse names its test harness
//!   (`testing`).
//! - No online module of pulse names the offline lab: `pulse/src/lab` exists, and no
//!   top-level module but `lab` itself (and the crate root) names `crate::lab`.
//! - No Rust file of the tree over [`MAX_LINES`] lines, but the data tables of
//!   [`LONG_FILE_EXEMPTIONS`].

mod breaches;
mod source;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use source::{code_only, rust_files, without_unit_tests};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The workspace's crates.
const CRATES: [&str; 4] = ["models", "pulse", "prefetcher", "tests"];
/// The fuzz targets' folder: its own workspace, outside the main one.
const FUZZ: &str = "fuzz";
/// The machine-learning crates, as manifests name them; pulse alone may use them.
const ML_CRATES: [&str; 3] = ["linfa", "linfa-linear", "ndarray"];
/// The longest a Rust source file may be.
const MAX_LINES: usize = 800;
/// Files allowed past [`MAX_LINES`], with the reason: data tables only. None today.
const LONG_FILE_EXEMPTIONS: [(&str, &str); 0] = [];

/// The tree the checks read: `MODULE_GRAPH_ROOT`, or this workspace.
fn workspace() -> PathBuf {
    match std::env::var_os("MODULE_GRAPH_ROOT") {
        Some(root) => PathBuf::from(root),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
    }
}

/// Panics listing `problems`, if there are any.
fn assert_none(rule: &str, problems: Vec<String>) {
    assert!(problems.is_empty(), "{rule}:\n  {}", problems.join("\n  "));
}

// ---- The module graph ------------------------------------------------------------

/// Every `.rs` file under `src`, with the top-level module it belongs to.
fn files_by_module(src: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let module = path.file_stem().unwrap().to_str().unwrap().to_owned();
        if path.is_dir() {
            // `bin/` holds binaries, each a crate root of its own: not a module.
            if module != "bin" {
                out.extend(rust_files(&path).into_iter().map(|f| (module.clone(), f)));
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

/// Items the crate root defines itself (`pub const`, `pub fn`, ...) or re-exports
/// from another crate (`pub use models::{A, B as C}`): a path to them is no module
/// edge. (A re-export of one of its own modules is: it would hide the edge.)
fn root_items(src: &Path) -> BTreeSet<String> {
    let root = code_only(&std::fs::read_to_string(src.join("lib.rs")).unwrap_or_default());
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut items = BTreeSet::new();
    let mut modules = BTreeSet::new();
    for l in root.lines().map(str::trim_start) {
        let l = l.strip_prefix("pub ").unwrap_or(l);
        if let Some(name) = l.strip_prefix("mod ") {
            modules.insert(ident(name));
        }
        for kw in ["const ", "fn ", "static ", "struct ", "enum ", "type "] {
            if let Some(name) = l.strip_prefix(kw) {
                items.insert(ident(name));
            }
        }
    }
    for statement in root.split(';') {
        let Some((_, path)) = statement.split_once("pub use ") else {
            continue;
        };
        let (head, rest) = path.trim().split_once("::").unwrap_or((path.trim(), ""));
        if modules.contains(head) || head == "crate" || head == "self" {
            continue;
        }
        for item in rest.split([',', '{', '}']) {
            let name = item.rsplit([' ', ':']).find(|w| !w.is_empty());
            items.extend(name.map(ident).filter(|n| !n.is_empty()));
        }
    }
    items
}

/// The module graph of crate `krate` of the tree at `root`. The crate root
/// (`lib.rs`, `main.rs`) only re-exports and assembles, so it is left out.
fn module_graph(root: &Path, krate: &str) -> Graph {
    let src = root.join(krate).join("src");
    let root_items = root_items(&src);
    let mut graph = Graph::new();
    for (module, file) in files_by_module(&src) {
        if module == "lib" || module == "main" {
            continue;
        }
        let text = without_unit_tests(&code_only(&std::fs::read_to_string(&file).unwrap()));
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

/// One crate's graph breaches: an edge that names no module (a path through a root
/// re-export, `crate::Node`, would hide an edge), or a cycle.
fn graph_problems(root: &Path, krate: &str) -> Vec<String> {
    let graph = module_graph(root, krate);
    if graph.is_empty() {
        return vec![format!("{krate}: no modules found")];
    }
    let mut problems = Vec::new();
    for (module, uses) in &graph {
        for name in uses.iter().filter(|n| !graph.contains_key(*n)) {
            problems.push(format!(
                "{krate}: {module} names crate::{name}, which is no module"
            ));
        }
    }
    if let Some(cycle) = find_cycle(&graph) {
        problems.push(format!("{krate}: a module cycle: {}", cycle.join(" → ")));
    }
    problems
}

/// Production modules of `krate` that name its test harness `testing`.
fn harness_problems(root: &Path, krate: &str) -> Vec<String> {
    let graph = module_graph(root, krate);
    if !graph.contains_key("testing") {
        return vec![format!("{krate}: no `testing` module")];
    }
    graph
        .iter()
        .filter(|(module, uses)| *module != "testing" && uses.contains("testing"))
        .map(|(module, _)| format!("{krate}: {module} depends on the test harness"))
        .collect()
}

/// The lab rule: `pulse/src/lab` exists, and no top-level pulse module but `lab`
/// names `crate::lab`.
fn lab_problems(root: &Path) -> Vec<String> {
    let src = root.join("pulse/src");
    if !src.join("lab").is_dir() && !src.join("lab.rs").is_file() {
        return vec![format!(
            "{} is missing: the offline lab (trace, backtest, the honest scorer, \
             offline) lives there",
            src.join("lab").display()
        )];
    }
    module_graph(root, "pulse")
        .iter()
        .filter(|(module, uses)| *module != "lab" && uses.contains("lab"))
        .map(|(module, _)| format!("pulse: the online module {module} names crate::lab"))
        .collect()
}

// ---- Manifests -------------------------------------------------------------------

/// The package names of every dependency table of a manifest (`[dependencies]`,
/// `[dev-dependencies]`, `[target.….dependencies]`, `[dependencies.name]`), renamed
/// ones under both names.
fn dependency_names(manifest: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut in_deps = false;
    for line in manifest.lines().map(str::trim) {
        if let Some(header) = line.strip_prefix('[') {
            let header = header.trim_end_matches(']');
            in_deps = header.ends_with("dependencies");
            match header.rsplit_once('.') {
                Some((table, name)) if table.ends_with("dependencies") => {
                    names.insert(name.trim_matches('"').to_owned());
                }
                _ => {}
            }
            continue;
        }
        if !in_deps || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name = line.split(['=', '.', ' ']).next().unwrap_or_default();
        names.insert(name.trim_matches('"').to_owned());
        if let Some((_, renamed)) = line.split_once("package") {
            let renamed = renamed.trim_start_matches([' ', '=', '"']);
            names.insert(renamed.split('"').next().unwrap_or_default().to_owned());
        }
    }
    names
}

/// The manifest of `krate` (a crate folder of the tree), if it has one.
fn manifest(root: &Path, krate: &str) -> Option<String> {
    std::fs::read_to_string(root.join(krate).join("Cargo.toml")).ok()
}

/// The package name a manifest declares.
fn package_name(manifest: &str) -> Option<String> {
    let package = manifest.split("[package]").nth(1)?;
    let line = package
        .lines()
        .find(|l| l.trim_start().starts_with("name"))?;
    Some(line.split('"').nth(1)?.to_owned())
}

/// The crates of the tree (the workspace's and `fuzz`) a crate's manifest depends
/// on; the fuzz package under the name `fuzz`. A crate's dev-dependency on itself
/// (to switch on a feature) is no edge.
fn internal_dependencies(root: &Path, krate: &str) -> BTreeSet<String> {
    let fuzz_package = manifest(root, FUZZ).as_deref().and_then(package_name);
    let Some(manifest) = manifest(root, krate) else {
        return BTreeSet::new();
    };
    dependency_names(&manifest)
        .into_iter()
        .filter_map(|name| {
            if Some(&name) == fuzz_package.as_ref() || name == FUZZ {
                Some(FUZZ.to_owned())
            } else {
                CRATES.contains(&name.as_str()).then_some(name)
            }
        })
        .filter(|name| name != krate)
        .collect()
}

/// Breaches of the dependency rule, `fuzz` included.
fn dependency_problems(root: &Path) -> Vec<String> {
    let allowed: [(&str, &[&str]); 5] = [
        ("models", &[]),
        ("prefetcher", &["models"]),
        ("pulse", &["models"]),
        ("tests", &["models", "prefetcher", "pulse"]),
        (FUZZ, &["models", "prefetcher", "pulse"]),
    ];
    let mut problems = Vec::new();
    for (krate, allowed) in allowed {
        if manifest(root, krate).is_none() {
            problems.push(format!("{krate}: no Cargo.toml"));
        }
        let extra: Vec<_> = internal_dependencies(root, krate)
            .into_iter()
            .filter(|d| !allowed.contains(&d.as_str()))
            .collect();
        if !extra.is_empty() {
            problems.push(format!("{krate} depends on {extra:?}"));
        }
    }
    problems
}

/// Breaches of the machine-learning rule: a crate other than pulse whose manifest
/// names an ML crate, or whose code (tests included) names one in a path.
fn ml_problems(root: &Path) -> Vec<String> {
    let idents: Vec<String> = ML_CRATES.iter().map(|c| c.replace('-', "_")).collect();
    let mut problems = Vec::new();
    for krate in CRATES.into_iter().chain([FUZZ]).filter(|&k| k != "pulse") {
        if let Some(manifest) = manifest(root, krate) {
            let named: Vec<_> = dependency_names(&manifest)
                .into_iter()
                .filter(|d| ML_CRATES.contains(&d.as_str()))
                .collect();
            if !named.is_empty() {
                problems.push(format!("{krate}/Cargo.toml depends on {named:?}"));
            }
        }
        for file in rust_files(&root.join(krate)) {
            let code = code_only(&std::fs::read_to_string(&file).unwrap());
            let words: BTreeSet<&str> = code
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .collect();
            for ident in idents.iter().filter(|i| words.contains(i.as_str())) {
                problems.push(format!("{} names {ident}", file.display()));
            }
        }
    }
    problems
}

// ---- File length -----------------------------------------------------------------

/// Rust files of the tree over [`MAX_LINES`] lines, but the exempt data tables.
fn long_file_problems(root: &Path) -> Vec<String> {
    rust_files(root)
        .into_iter()
        .filter_map(|file| {
            let relative = file
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let lines = std::fs::read_to_string(&file).unwrap().lines().count();
            let exempt = LONG_FILE_EXEMPTIONS
                .iter()
                .any(|(path, _)| *path == relative);
            (lines > MAX_LINES && !exempt).then(|| format!("{relative}: {lines} lines"))
        })
        .collect()
}

// ---- The rules on this workspace ---------------------------------------------------

#[test]
fn no_crate_has_a_module_cycle() {
    let root = workspace();
    let problems = CRATES
        .iter()
        .flat_map(|k| graph_problems(&root, k))
        .collect();
    assert_none("module graphs", problems);
}

#[test]
fn no_production_module_names_its_test_harness() {
    let root = workspace();
    assert!(module_graph(&root, "prefetcher").contains_key("proxy"));
    let problems = ["prefetcher", "pulse"]
        .iter()
        .flat_map(|k| harness_problems(&root, k))
        .collect();
    assert_none("test harness named by production code", problems);
}

#[test]
fn crates_follow_the_dependency_rule() {
    let root = workspace();
    assert_none("the dependency rule", dependency_problems(&root));
    // The reader sees what it must: the tests crate names all three.
    assert_eq!(internal_dependencies(&root, "tests").len(), 3);
}

#[test]
fn only_pulse_uses_the_machine_learning_crates() {
    let root = workspace();
    let pulse = dependency_names(&manifest(&root, "pulse").unwrap());
    assert!(
        ML_CRATES.iter().all(|c| pulse.contains(*c)),
        "pulse depends on {ML_CRATES:?}: {pulse:?}"
    );
    assert_none("the machine-learning rule", ml_problems(&root));
}

#[test]
fn no_online_module_of_pulse_names_the_lab() {
    assert_none("the lab rule", lab_problems(&workspace()));
}

#[test]
fn no_source_file_is_over_the_line_limit() {
    assert_none(
        &format!("files over {MAX_LINES} lines"),
        long_file_problems(&workspace()),
    );
}
