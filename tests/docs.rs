//! The README and docs/ (issue 32 item 7): plain file reads, no root. Every relative link in
//! README.md and docs/*.md resolves to a file (and its `#anchor` to a heading of it), the README
//! names every subcommand `sdn-node --help` lists, and the README stays short.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The README's length budget: what a newcomer reads in five minutes.
const README_MAX_LINES: usize = 200;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/*.md.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![repo().join("README.md")];
    let mut more: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    more.sort();
    docs.extend(more);
    docs
}

/// Markdown text with fenced code blocks blanked out (their lines kept, for line numbers).
fn outside_code(text: &str) -> Vec<String> {
    let mut fenced = false;
    text.lines()
        .map(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return String::new();
            }
            if fenced {
                String::new()
            } else {
                l.to_string()
            }
        })
        .collect()
}

/// Inline links `[text](target)` outside code spans, with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in outside_code(text).iter().enumerate() {
        // Drop code spans: a `](` inside backticks is not a link.
        let mut plain = String::new();
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                plain.push(c);
            }
        }
        let mut rest = plain.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((n + 1, after[..end].trim().to_string()));
            rest = &after[end..];
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-` and `_` dropped,
/// spaces made `-`; a repeated anchor gets `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for line in outside_code(text) {
        let t = line.trim_start();
        if !t.starts_with('#') {
            continue;
        }
        let title = t.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut unique = slug.clone();
        let mut k = 1;
        while seen.contains(&unique) {
            unique = format!("{slug}-{k}");
            k += 1;
        }
        seen.insert(unique);
    }
    seen
}

fn relative_to_repo(p: &Path) -> String {
    let canon = std::fs::canonicalize(repo()).unwrap();
    let mut parts: Vec<String> = Vec::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::CurDir => {}
            other => parts.push(other.as_os_str().to_string_lossy().into_owned()),
        }
    }
    let joined = PathBuf::from(parts.join("/"));
    let joined = if p.is_absolute() { PathBuf::from("/").join(joined) } else { joined };
    joined.strip_prefix(&canon).map(|r| r.display().to_string()).unwrap_or_else(|_| joined.display().to_string())
}

#[test]
fn every_relative_link_resolves() {
    let root = std::fs::canonicalize(repo()).unwrap();
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let dir = std::fs::canonicalize(doc.parent().unwrap()).unwrap();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() { doc.clone() } else { dir.join(path) };
            let name = relative_to_repo(&file);
            let place = format!("{}:{line}: {target}", relative_to_repo(&std::fs::canonicalize(&doc).unwrap()));
            checked += 1;
            if !file.exists() {
                broken.push(format!("{place}: no file {name}"));
                continue;
            }
            assert!(
                file.starts_with(&root) || std::fs::canonicalize(&file).unwrap().starts_with(&root),
                "{place}: outside the repository"
            );
            if let Some(anchor) = anchor {
                let body = std::fs::read_to_string(&file).unwrap_or_default();
                if !anchors(&body).contains(anchor) {
                    broken.push(format!("{place}: no heading #{anchor} in {name}"));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} links found: is the link parser broken?");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The workspace's source folders: a code span naming a path under one of them names a file of
/// this repository (a span like `tests/ofp-actions.at` elsewhere names one of OVS's).
const SOURCE_ROOTS: &[&str] =
    &["src/", "model/src/", "hostnet/src/", "cni/src/", "openflow/src/", "netif/src/", "harness/src/", "ovsdb/src/", "switch/src/"];

/// Code spans in the docs that name a source file or folder of the workspace: each exists (the
/// docs walk a reader through the code by these names; a file moved without them is a dead end).
#[test]
fn every_source_path_the_docs_name_exists() {
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for (n, line) in outside_code(&text).iter().enumerate() {
            for (i, span) in line.split('`').enumerate() {
                // Odd pieces are inside backticks.
                let named = i % 2 == 1
                    && SOURCE_ROOTS.iter().any(|r| span.starts_with(r))
                    && span.chars().all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c));
                if !named {
                    continue;
                }
                checked += 1;
                if !repo().join(span).exists() {
                    missing.push(format!("{}:{}: {span}", doc.file_name().unwrap().to_string_lossy(), n + 1));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} source paths found: is the span parser broken?");
    assert!(missing.is_empty(), "source paths the docs name that do not exist:\n{}", missing.join("\n"));
}

/// The commands a `--help` output lists (the lines under `Commands:`).
fn commands_listed(args: &[&str]) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_sdn-node")).args(args).arg("--help").output().unwrap();
    assert!(out.status.success(), "sdn-node {args:?} --help failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut names = Vec::new();
    let mut in_commands = false;
    for line in text.lines() {
        if line.trim_end() == "Commands:" {
            in_commands = true;
            continue;
        }
        if in_commands {
            if line.trim().is_empty() || !line.starts_with(' ') {
                break;
            }
            // A command line is indented by two spaces; a wrapped description by more.
            if line.starts_with("  ") && !line.starts_with("   ") {
                names.push(line.split_whitespace().next().unwrap().to_string());
            }
        }
    }
    names
}

/// Every command path (`run`, `pod add`, ...) `--help` lists, recursively. clap's own `help`
/// is kept at the top level (the README's row for it covers every level) and skipped below.
fn all_commands(prefix: &[&str], out: &mut Vec<String>) {
    for name in commands_listed(prefix) {
        if name == "help" && !prefix.is_empty() {
            continue;
        }
        let mut path: Vec<&str> = prefix.to_vec();
        path.push(&name);
        out.push(path.join(" "));
        if name != "help" {
            all_commands(&path, out);
        }
    }
}

#[test]
fn the_readme_names_every_subcommand() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let mut commands = Vec::new();
    all_commands(&[], &mut commands);
    for expected in ["apply", "run", "dump-flows", "trace", "status", "pod add", "pod list"] {
        assert!(commands.iter().any(|c| c == expected), "`sdn-node --help` parsing lost {expected}: {commands:?}");
    }
    let missing: Vec<&String> = commands
        .iter()
        .filter(|c| {
            let needle = format!("sdn-node {c}");
            !readme.match_indices(&needle).any(|(i, _)| {
                let next = readme[i + needle.len()..].chars().next();
                !next.is_some_and(|ch| ch.is_alphanumeric() || ch == '-')
            })
        })
        .collect();
    assert!(missing.is_empty(), "README.md does not name these subcommands (as `sdn-node CMD`): {missing:?}");
}

#[test]
fn the_readme_is_short() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move the depth into docs/"
    );
}

#[test]
fn the_link_and_anchor_rules_are_githubs() {
    // The parser's own check, so the tests above cannot pass by finding nothing.
    let text = "# Quick start\n## The node daemon: `sdn-node run`\n## Security: users, capabilities\n## Quick start\n```\n# not a heading\n[x](in-code.md)\n```\nsee [a](b.md#c) and `[no](link.md)`\n";
    let a = anchors(text);
    assert!(a.contains("quick-start") && a.contains("quick-start-1"), "{a:?}");
    assert!(a.contains("the-node-daemon-sdn-node-run"), "{a:?}");
    assert!(a.contains("security-users-capabilities"), "{a:?}");
    assert!(!a.contains("not-a-heading"), "{a:?}");
    assert_eq!(links(text), vec![(9, "b.md#c".to_string())]);
}
