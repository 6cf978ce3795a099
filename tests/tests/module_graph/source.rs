//! Reading Rust source: the code without comments and literals, without unit tests;
//! the Rust files of a folder.

use std::path::{Path, PathBuf};

/// `text` without its comments, and with every string and char literal emptied: what
/// is left is the code that names things.
pub(crate) fn code_only(text: &str) -> String {
    let s: Vec<char> = text.chars().collect();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < s.len() {
        let (c, next) = (s[i], s.get(i + 1).copied());
        let prev = i.checked_sub(1).map(|p| s[p]);
        if c == '/' && next == Some('/') {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < s.len() {
                if s[i] == '/' && s.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if s[i] == '*' && s.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r'
            && matches!(next, Some('"' | '#'))
            && (!prev.is_some_and(ident) || prev == Some('b'))
        {
            // A raw string (`r"…"`, `r#"…"#`), or a raw identifier (`r#type`).
            let mut j = i + 1;
            while s.get(j) == Some(&'#') {
                j += 1;
            }
            let hashes = j - i - 1;
            if s.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            while j < s.len() && !(s[j] == '"' && (1..=hashes).all(|k| s.get(j + k) == Some(&'#')))
            {
                j += 1;
            }
            out.push_str("\"\"");
            i = j + 1 + hashes;
        } else if c == '"' {
            i += 1;
            while i < s.len() && s[i] != '"' {
                i += if s[i] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i += 1;
        } else if c == '\'' && next == Some('\\') {
            // An escaped char: `'\n'`, `'\''`, `'\u{…}'`.
            let mut j = i + 3;
            while j < s.len() && s[j] != '\'' {
                j += 1;
            }
            out.push_str("' '");
            i = j + 1;
        } else if c == '\'' && s.get(i + 2) == Some(&'\'') {
            out.push_str("' '");
            i += 3;
        } else {
            // Anything else, a lifetime's quote included.
            out.push(c);
            i += 1;
        }
    }
    out
}

/// `code` (from [`code_only`]) without its unit tests: each `#[cfg(test)]` that
/// heads a `mod name { … }` (after further attributes and a visibility) is cut out
/// with the module, braces matched. Every other item, `#[cfg(test)]` or not, stays.
pub(crate) fn without_unit_tests(code: &str) -> String {
    const ATTR: &str = "#[cfg(test)]";
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find(ATTR) {
        out.push_str(&rest[..at]);
        let after = &rest[at + ATTR.len()..];
        match inline_module_len(after) {
            Some(len) => rest = &after[len..],
            None => {
                out.push_str(ATTR);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The length of the inline module `[#[attr]…] [pub[(…)]] mod name { … }` that
/// `text` opens with, if it does.
fn inline_module_len(text: &str) -> Option<usize> {
    let b = text.as_bytes();
    let mut i = 0;
    let skip_space = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // Matches the bracket or brace at `open`; the index after its closing one.
    let matching = |open: usize, (l, r): (u8, u8)| -> Option<usize> {
        let mut depth = 0usize;
        for (k, &c) in b.iter().enumerate().skip(open) {
            if c == l {
                depth += 1;
            } else if c == r {
                depth -= 1;
                if depth == 0 {
                    return Some(k + 1);
                }
            }
        }
        None
    };
    loop {
        skip_space(&mut i);
        if !text[i..].starts_with("#[") {
            break;
        }
        i = matching(i + 1, (b'[', b']'))?;
    }
    if text[i..].starts_with("pub") {
        i += 3;
        skip_space(&mut i);
        if text[i..].starts_with('(') {
            i = matching(i, (b'(', b')'))?;
        }
        skip_space(&mut i);
    }
    let after_mod = text[i..].strip_prefix("mod")?;
    if !after_mod.starts_with(|c: char| c.is_whitespace()) {
        return None;
    }
    i += "mod".len();
    skip_space(&mut i);
    let name_len = text[i..]
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len() - i);
    i += name_len;
    skip_space(&mut i);
    if name_len == 0 || !text[i..].starts_with('{') {
        return None;
    }
    matching(i, (b'{', b'}'))
}

/// Every `.rs` file under `dir`, recursively, but build output and dependencies.
pub(crate) fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !(name.starts_with('.') || name == "target" || name == "node_modules") {
                out.extend(rust_files(&path));
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}
