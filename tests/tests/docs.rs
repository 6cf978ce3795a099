//! The docs stay true to the tree. `README.md` and every page in `docs/` are read and
//! held to the files they name:
//! - every relative link points to a file that exists, and a link with an `#anchor`
//!   to a heading of that file (GitHub's slug rule);
//! - every `scripts/…` path they name exists and is executable (a `.sh` file is a
//!   helper the scripts source: it need only exist);
//! - every other repository path they name in backticks (`pulse/tests/…`) exists;
//! - every page in `docs/` is linked from the README;
//! - the README names the test command `.ci/run` runs, and stays under
//!   [`README_MAX_LINES`] lines.
//!
//! Each check is a function of a tree's root, run here on the workspace and, in the
//! unit tests at the end, on a small synthetic tree that makes it fail.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// The front door stays a front door.
const README_MAX_LINES: usize = 300;

/// The top-level folders whose paths the docs name in backticks (`scripts/` has a
/// check of its own, [`bad_scripts`]).
const ROOTS: &[&str] = &[
    "models/",
    "pulse/",
    "prefetcher/",
    "tests/",
    "fuzz/",
    "docs/",
    ".ci/",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One Markdown file: its path relative to the root, and its text.
struct Page {
    path: PathBuf,
    text: String,
}

/// `README.md` and every `docs/*.md`, in name order.
fn pages(root: &Path) -> Vec<Page> {
    let mut paths = vec![PathBuf::from("README.md")];
    if let Ok(entries) = std::fs::read_dir(root.join("docs")) {
        let mut docs: Vec<PathBuf> = entries
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .map(|p| Path::new("docs").join(p.file_name().unwrap()))
            .collect();
        docs.sort();
        paths.extend(docs);
    }
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(root.join(&path))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            Page { path, text }
        })
        .collect()
}

/// Each line of `text` with its number (from 1) and whether it is inside a fenced
/// code block (the fences themselves count as inside).
fn lines(text: &str) -> Vec<(usize, &str, bool)> {
    let mut in_fence = false;
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            let fence = line.trim_start().starts_with("```");
            if fence {
                in_fence = !in_fence;
            }
            (i + 1, line, in_fence || fence)
        })
        .collect()
}

/// `line` split at its backticks: the even pieces are prose, the odd ones code spans.
fn spans(line: &str) -> impl Iterator<Item = (bool, &str)> {
    line.split('`').enumerate().map(|(i, s)| (i % 2 == 1, s))
}

/// `line` without its code spans.
fn prose(line: &str) -> String {
    spans(line)
        .filter(|(code, _)| !code)
        .map(|(_, s)| s)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The targets of the inline links `[text](target)` in a line of prose.
fn link_targets(prose: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = prose;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find([')', ' ']).unwrap_or(after.len());
        out.push(after[..end].to_owned());
        rest = &after[end..];
    }
    out
}

/// A heading's text as GitHub renders it: link syntax reduced to the link's text.
fn rendered(heading: &str) -> String {
    let mut out = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](").map(|m| open + m) else {
            break;
        };
        let Some(close) = rest[mid..].find(')').map(|c| mid + c) else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&rest[open + 1..mid]);
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

/// GitHub's anchor for a heading: lower case, spaces to hyphens, every character but
/// letters, digits, `-` and `_` dropped.
fn slug(heading: &str) -> String {
    rendered(heading)
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// The anchors of a page's headings, a repeated one numbered as GitHub does (`x`,
/// `x-1`, `x-2`).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (_, line, code) in lines(text) {
        if code {
            continue;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#'));
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// `path` with its `.` and `..` components resolved, without touching the disk.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// A relative link of `page`: the file it points to (relative to the root) and its
/// anchor, or `None` for a link that leaves the repository (a URL, `mailto:`).
fn resolve(page: &Path, target: &str) -> Option<(PathBuf, Option<String>)> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (file, anchor) = match target.split_once('#') {
        Some((file, anchor)) => (file, Some(anchor.to_owned())),
        None => (target, None),
    };
    let file = if file.is_empty() {
        page.to_owned()
    } else {
        normalise(&page.parent().unwrap_or(Path::new("")).join(file))
    };
    Some((file, anchor))
}

/// Every relative link of the pages that points to no file, or to no heading.
fn broken_links(root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for page in pages(root) {
        for (n, line, code) in lines(&page.text) {
            if code {
                continue;
            }
            for target in link_targets(&prose(line)) {
                let Some((file, anchor)) = resolve(&page.path, &target) else {
                    continue;
                };
                let at = format!("{}:{n}: link `{target}`", page.path.display());
                if !root.join(&file).exists() {
                    problems.push(format!("{at}: {} does not exist", file.display()));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                let Ok(text) = std::fs::read_to_string(root.join(&file)) else {
                    problems.push(format!("{at}: an anchor into a folder"));
                    continue;
                };
                if !anchors(&text).contains(&anchor) {
                    problems.push(format!("{at}: {} has no heading #{anchor}", file.display()));
                }
            }
        }
    }
    problems
}

/// The `scripts/…` paths a line names, in prose or code.
fn script_paths(line: &str) -> Vec<String> {
    let path_char = |c: char| c.is_ascii_alphanumeric() || "_.-/".contains(c);
    let mut out = Vec::new();
    for (at, _) in line.match_indices("scripts/") {
        if line[..at].chars().next_back().is_some_and(path_char) {
            continue;
        }
        let path: String = line[at..].chars().take_while(|c| path_char(*c)).collect();
        out.push(path.trim_end_matches('.').to_owned());
    }
    out
}

/// Every `scripts/…` path the pages name that does not exist, or is not executable.
fn bad_scripts(root: &Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let mut problems = Vec::new();
    for page in pages(root) {
        for (n, line, _) in lines(&page.text) {
            for path in script_paths(line) {
                let at = format!("{}:{n}: `{path}`", page.path.display());
                let Ok(meta) = std::fs::metadata(root.join(&path)) else {
                    problems.push(format!("{at} does not exist"));
                    continue;
                };
                if path.ends_with('/') {
                    if !meta.is_dir() {
                        problems.push(format!("{at} is not a folder"));
                    }
                } else if !meta.is_file() {
                    problems.push(format!("{at} is not a file"));
                } else if !path.ends_with(".sh") && meta.permissions().mode() & 0o111 == 0 {
                    problems.push(format!("{at} is not executable"));
                }
            }
        }
    }
    problems
}

/// The repository paths a line of prose names in backticks: a code span that starts
/// with one of [`ROOTS`] and is a plain path (no space, placeholder or wildcard).
fn named_paths(line: &str) -> Vec<String> {
    spans(line)
        .filter(|(code, span)| {
            *code
                && ROOTS.iter().any(|root| span.starts_with(root))
                && !span.contains(|c: char| c.is_whitespace() || "<>*{}…".contains(c))
        })
        .map(|(_, span)| span.to_owned())
        .collect()
}

/// Every repository path the pages name in backticks that does not exist.
fn missing_paths(root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for page in pages(root) {
        for (n, line, code) in lines(&page.text) {
            if code {
                continue;
            }
            for path in named_paths(line) {
                if !root.join(&path).exists() {
                    problems.push(format!(
                        "{}:{n}: `{path}` does not exist",
                        page.path.display()
                    ));
                }
            }
        }
    }
    problems
}

/// Every page in `docs/` that the README does not link to.
fn unlinked_pages(root: &Path) -> Vec<String> {
    let all = pages(root);
    let readme = &all[0];
    let linked: BTreeSet<PathBuf> = lines(&readme.text)
        .into_iter()
        .filter(|(_, _, code)| !code)
        .flat_map(|(_, line, _)| link_targets(&prose(line)))
        .filter_map(|target| resolve(&readme.path, &target).map(|(file, _)| file))
        .collect();
    all[1..]
        .iter()
        .filter(|page| !linked.contains(&page.path))
        .map(|page| format!("README.md links nowhere to {}", page.path.display()))
        .collect()
}

/// The command `.ci/run` runs: its last line that is neither a comment nor shell
/// set-up (`set`, `cd`).
fn ci_command(run: &str) -> Option<String> {
    run.lines()
        .map(str::trim)
        .rev()
        .find(|l| {
            !l.is_empty() && !l.starts_with('#') && !l.starts_with("set ") && !l.starts_with("cd ")
        })
        .map(str::to_owned)
}

/// What is wrong with the README: it does not show the command `.ci/run` runs (a line
/// of a code block that is the command, or starts with it and goes on after a space),
/// or it is too long.
fn readme_problems(root: &Path) -> Vec<String> {
    let run = std::fs::read_to_string(root.join(".ci/run")).unwrap_or_default();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap_or_default();
    let mut problems = Vec::new();
    match ci_command(&run) {
        None => problems.push(".ci/run runs no command".to_owned()),
        Some(command) => {
            let shown = lines(&readme).into_iter().any(|(_, line, code)| {
                let line = line.trim();
                code && line
                    .strip_prefix(command.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
            });
            if !shown {
                problems.push(format!(
                    "README.md shows no `{command}` in a code block: .ci/run runs it"
                ));
            }
        }
    }
    let count = readme.lines().count();
    if count >= README_MAX_LINES {
        problems.push(format!(
            "README.md has {count} lines, {README_MAX_LINES} at most: the reference goes to docs/"
        ));
    }
    problems
}

fn assert_none(problems: Vec<String>) {
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_relative_link_of_the_docs_resolves() {
    assert_none(broken_links(&workspace()));
}

#[test]
fn every_script_the_docs_name_exists_and_runs() {
    assert_none(bad_scripts(&workspace()));
}

#[test]
fn every_path_the_docs_name_exists() {
    assert_none(missing_paths(&workspace()));
}

#[test]
fn every_page_of_docs_is_linked_from_the_readme() {
    assert_none(unlinked_pages(&workspace()));
}

#[test]
fn the_readme_names_the_ci_command_and_stays_short() {
    assert_none(readme_problems(&workspace()));
}

/// Each check above, on a small tree that breaks it.
mod checks {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A tree of `files` (path, text) under a fresh folder; a path ending in `*` is
    /// written executable (without the `*`).
    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let (path, exec) = match path.strip_suffix('*') {
                Some(path) => (path, true),
                None => (*path, false),
            };
            let full = dir.path().join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(&full, text).unwrap();
            if exec {
                std::fs::set_permissions(&full, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
        dir
    }

    #[test]
    fn slugs_follow_github() {
        assert_eq!(
            slug("Pulse on several machines"),
            "pulse-on-several-machines"
        );
        assert_eq!(slug("`/healthz`"), "healthz");
        assert_eq!(
            slug("HTTP caching (RFC 9111), area by area"),
            "http-caching-rfc-9111-area-by-area"
        );
        assert_eq!(
            slug("The reference scenario (`scripts/demo`)"),
            "the-reference-scenario-scriptsdemo"
        );
        assert_eq!(slug("HTTP/2 bounds"), "http2-bounds");
        assert_eq!(slug("Why 60 s"), "why-60-s");
        assert_eq!(
            slug("Edge agent: nginx and Varnish"),
            "edge-agent-nginx-and-varnish"
        );
        assert_eq!(slug("see [the page](x.md) now"), "see-the-page-now");
        assert_eq!(slug("`AccessEvent` × 2 → raw_x"), "accessevent--2--raw_x");
        let repeated = anchors("# A\n## Tests\n```\n# not a heading\n```\n## Tests\n");
        let expected: BTreeSet<String> = ["a", "tests", "tests-1"].map(String::from).into();
        assert_eq!(repeated, expected);
    }

    #[test]
    fn a_link_to_a_missing_file_or_heading_fails() {
        let good = tree(&[
            (
                "README.md",
                "[a](docs/a.md#two) [top](#readme) [out](https://x.example/y)\n# README\n",
            ),
            (
                "docs/a.md",
                "# One\n## Two\nback to [the start](../README.md)\n`[not](a-link.md)`\n",
            ),
        ]);
        assert_none(broken_links(good.path()));

        let bad = tree(&[
            ("README.md", "[a](docs/a.md#three) and [b](docs/b.md)\n"),
            ("docs/a.md", "# One\n## Two\n```\n# Three\n```\n"),
        ]);
        let problems = broken_links(bad.path());
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].contains("has no heading #three"),
            "{problems:?}"
        );
        assert!(
            problems[1].contains("docs/b.md does not exist"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_missing_or_unexecutable_script_fails() {
        let good = tree(&[
            (
                "README.md",
                "```sh\nscripts/test --all\nBENCH=1 scripts/bench/run\n```\nsee `scripts/bench/lib.sh` and `scripts/bench/`.\n",
            ),
            ("scripts/test*", ""),
            ("scripts/bench/run*", ""),
            ("scripts/bench/lib.sh", ""),
        ]);
        assert_none(bad_scripts(good.path()));

        let bad = tree(&[
            ("README.md", "run `scripts/gone`, then scripts/plain.\n"),
            ("scripts/plain", ""),
        ]);
        let problems = bad_scripts(bad.path());
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].contains("`scripts/gone` does not exist"),
            "{problems:?}"
        );
        assert!(
            problems[1].contains("`scripts/plain` is not executable"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_missing_named_path_fails() {
        let good = tree(&[
            (
                "README.md",
                "`pulse/src/` and `pulse/tests/x.rs`, `pulse/tests/<name>.rs`, `pulse::start`\n",
            ),
            ("pulse/src/lib.rs", ""),
            ("pulse/tests/x.rs", ""),
        ]);
        assert_none(missing_paths(good.path()));

        let bad = tree(&[
            ("README.md", "see `pulse/src/lab/`\n"),
            ("pulse/src/lib.rs", ""),
        ]);
        let problems = missing_paths(bad.path());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("`pulse/src/lab/` does not exist"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_page_the_readme_does_not_link_fails() {
        let good = tree(&[("README.md", "[a](docs/a.md#x)\n"), ("docs/a.md", "# x\n")]);
        assert_none(unlinked_pages(good.path()));

        let bad = tree(&[
            ("README.md", "[a](docs/a.md) `[b](docs/b.md)`\n"),
            ("docs/a.md", "[b](b.md)\n"),
            ("docs/b.md", ""),
        ]);
        let problems = unlinked_pages(bad.path());
        assert_eq!(
            problems,
            vec!["README.md links nowhere to docs/b.md".to_owned()]
        );
    }

    #[test]
    fn a_readme_without_the_ci_command_or_too_long_fails() {
        let run =
            "#!/usr/bin/env bash\nset -euo pipefail\ncd \"$(dirname \"$0\")/..\"\nscripts/test\n";
        assert_eq!(ci_command(run).as_deref(), Some("scripts/test"));

        let good = tree(&[
            ("README.md", "```sh\nscripts/test     # all of it\n```\n"),
            (".ci/run", run),
        ]);
        assert_none(readme_problems(good.path()));

        let prose_only = tree(&[
            ("README.md", "run scripts/test\n```sh\nscripts/tests\n```\n"),
            (".ci/run", run),
        ]);
        let problems = readme_problems(prose_only.path());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("shows no `scripts/test`"),
            "{problems:?}"
        );

        let long = format!(
            "```sh\nscripts/test\n```\n{}",
            "line\n".repeat(README_MAX_LINES)
        );
        let long = tree(&[("README.md", &long), (".ci/run", run)]);
        let problems = readme_problems(long.path());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("lines, 300 at most"), "{problems:?}");
    }
}
