//! Each rule fails on a small synthetic tree that breaks it.

use super::*;

/// A tree of `files` (path, text) in a fresh temporary folder.
fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

/// Manifests that keep the dependency rule, plus `extra` files.
fn crates(extra: &[(&str, &str)]) -> tempfile::TempDir {
    let mut files = vec![
        ("models/Cargo.toml", "[package]\nname = \"models\"\n"),
        (
            "prefetcher/Cargo.toml",
            "[dependencies]\nmodels.workspace = true\n",
        ),
        (
            "pulse/Cargo.toml",
            "[dependencies]\nmodels = { path = \"../models\" }\n",
        ),
        (
            "tests/Cargo.toml",
            "[dependencies]\nmodels.workspace = true\nprefetcher.workspace = true\npulse = { workspace = true }\n",
        ),
        (
            "fuzz/Cargo.toml",
            "[package]\nname = \"edge-pulse-fuzz\"\n\n[dependencies]\nmodels = { path = \"../models\" }\n",
        ),
    ];
    files.retain(|(path, _)| !extra.iter().any(|(p, _)| p == path));
    files.extend_from_slice(extra);
    tree(&files)
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

#[test]
fn a_cycle_after_the_unit_tests_is_found_and_one_inside_them_is_not() {
    let b = ("models/src/b.rs", "use crate::a::A;\npub struct B;\n");
    // The edge back to `b` comes after `a`'s unit tests: the whole file is read.
    let after = tree(&[
        (
            "models/src/a.rs",
            "pub struct A;\n#[cfg(test)]\nmod tests {\n    fn f() { let _ = \"}\"; }\n}\nfn late() -> crate::b::B { crate::b::B }\n",
        ),
        b,
    ]);
    let problems = graph_problems(after.path(), "models");
    assert!(
        problems.iter().any(|p| p.contains("a → b → a")),
        "{problems:?}"
    );
    // The same edge inside the unit tests (or a comment, or a string) is none.
    let inside = tree(&[
        (
            "models/src/a.rs",
            "pub struct A;\n// crate::b::B\nconst S: &str = \"crate::b\";\n#[cfg(test)]\n#[allow(unused)]\npub(crate) mod tests {\n    use crate::b::B;\n    mod inner { }\n}\n",
        ),
        b,
    ]);
    assert_eq!(
        graph_problems(inside.path(), "models"),
        Vec::<String>::new()
    );
}

#[test]
fn an_edge_through_a_root_re_export_is_found() {
    let root = tree(&[
        ("models/src/lib.rs", "mod a;\nmod b;\npub use a::A;\n"),
        ("models/src/a.rs", "pub struct A;\n"),
        ("models/src/b.rs", "use crate::A;\n"),
    ]);
    let problems = graph_problems(root.path(), "models");
    assert!(
        problems.iter().any(|p| p.contains("names crate::A")),
        "{problems:?}"
    );
}

#[test]
fn a_production_module_naming_the_harness_is_found() {
    let root = tree(&[
        ("pulse/src/testing.rs", "use crate::heat::Heat;\n"),
        (
            "pulse/src/heat.rs",
            "pub struct Heat;\nfn f() { crate::testing::free_port(); }\n",
        ),
    ]);
    assert_eq!(
        harness_problems(root.path(), "pulse"),
        ["pulse: heat depends on the test harness"]
    );
}

#[test]
fn a_dependency_against_the_rule_is_found() {
    assert_eq!(
        dependency_problems(crates(&[]).path()),
        Vec::<String>::new()
    );
    let breaches: [(&str, &str, &str); 4] = [
        (
            "models/Cargo.toml",
            "[dependencies]\npulse = { path = \"../pulse\" }\n",
            "models depends on [\"pulse\"]",
        ),
        (
            "pulse/Cargo.toml",
            "[dev-dependencies.prefetcher]\npath = \"../prefetcher\"\n",
            "pulse depends on [\"prefetcher\"]",
        ),
        (
            "tests/Cargo.toml",
            "[dev-dependencies]\nedge-pulse-fuzz = { path = \"../fuzz\" }\n",
            "tests depends on [\"fuzz\"]",
        ),
        (
            "fuzz/Cargo.toml",
            "[package]\nname = \"edge-pulse-fuzz\"\n[dependencies]\ntests = { path = \"../tests\" }\n",
            "fuzz depends on [\"tests\"]",
        ),
    ];
    for (path, text, problem) in breaches {
        let root = crates(&[(path, text)]);
        assert_eq!(dependency_problems(root.path()), [problem], "{path}");
    }
}

#[test]
fn a_machine_learning_crate_outside_pulse_is_found() {
    let fine = crates(&[
        (
            "pulse/Cargo.toml",
            "[dependencies]\nndarray.workspace = true\n",
        ),
        ("pulse/src/model.rs", "use ndarray::Array2;\n"),
        (
            "models/src/lib.rs",
            "//! Not `ndarray`: no machine learning here.\nconst S: &str = \"linfa::\";\n",
        ),
    ]);
    assert_eq!(ml_problems(fine.path()), Vec::<String>::new());
    let breaches: [(&str, &str); 4] = [
        (
            "prefetcher/Cargo.toml",
            "[dependencies]\nmodels.workspace = true\nndarray.workspace = true\n",
        ),
        (
            "models/Cargo.toml",
            "[dependencies]\nregression = { package = \"linfa-linear\", version = \"0.8\" }\n",
        ),
        (
            "models/src/score.rs",
            "fn f() { let _ = linfa::Dataset::new(); }\n",
        ),
        (
            "fuzz/fuzz_targets/fit.rs",
            "use linfa_linear::LinearRegression;\n",
        ),
    ];
    for (path, text) in breaches {
        let root = crates(&[(path, text)]);
        assert_eq!(ml_problems(root.path()).len(), 1, "{path}");
    }
}

#[test]
fn a_missing_lab_and_an_online_module_naming_it_are_found() {
    let missing = tree(&[("pulse/src/heat.rs", "pub struct Heat;\n")]);
    assert!(lab_problems(missing.path())[0].contains("is missing"));
    let root = tree(&[
        ("pulse/src/lab/mod.rs", "use crate::heat::Heat;\n"),
        ("pulse/src/lab/trace.rs", "use crate::heat::Heat;\n"),
        (
            "pulse/src/heat.rs",
            "pub struct Heat;\n#[cfg(test)]\nmod tests { use crate::lab::trace; }\n",
        ),
        (
            "pulse/src/ingest.rs",
            "use crate::{heat::Heat, lab::trace::generate};\n",
        ),
    ]);
    assert_eq!(
        lab_problems(root.path()),
        ["pulse: the online module ingest names crate::lab"]
    );
}

#[test]
fn a_file_over_the_limit_is_found() {
    let at_limit = "\n".repeat(MAX_LINES);
    let over = "\n".repeat(MAX_LINES + 1);
    let root = tree(&[
        ("pulse/src/a.rs", &at_limit),
        ("tests/tests/b.rs", &over),
        ("target/debug/build/c.rs", &over),
    ]);
    assert_eq!(
        long_file_problems(root.path()),
        [format!("tests/tests/b.rs: {} lines", MAX_LINES + 1)]
    );
}

#[test]
fn code_only_leaves_out_comments_and_literals() {
    let code = code_only(
        "let a = '\"'; let b = '\\''; /* x /* y */ z */ let c = r#\"crate::x\"#;\n\
         fn f<'a>(s: &'a str) {} // crate::y\nlet r#type = b\"{\";",
    );
    assert!(!code.contains("crate::"), "{code}");
    assert!(code.contains("fn f<'a>(s: &'a str) {}"), "{code}");
    assert!(code.contains("let r#type"), "{code}");
}

#[test]
fn a_re_export_from_another_crate_is_no_edge_and_one_of_a_module_is() {
    let root = tree(&[
        (
            "pulse/src/lib.rs",
            "mod a;\nmod b;\npub use a::A;\npub use models::{TOPIC, key as message_key};\n",
        ),
        ("pulse/src/a.rs", "pub struct A;\n"),
        (
            "pulse/src/b.rs",
            "fn f() { let _ = (crate::TOPIC, crate::message_key()); }\n",
        ),
    ]);
    assert_eq!(graph_problems(root.path(), "pulse"), Vec::<String>::new());
    std::fs::write(root.path().join("pulse/src/b.rs"), "use crate::A;\n").unwrap();
    assert_eq!(
        graph_problems(root.path(), "pulse"),
        ["pulse: b names crate::A, which is no module"]
    );
}
