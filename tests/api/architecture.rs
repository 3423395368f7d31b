//! The layers point one way: no top-level module of the web crate (`src/`) or of the core
//! (`core/src/`) reaches, through `crate::` paths, a module that reaches it back. The core
//! cannot name the web crate at all (it is not a dependency), nor any HTTP crate (checked
//! against its Cargo.toml).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module of the crate under `root` with the top-level modules its sources
/// name as `crate::<module>` (comments left out).
fn module_graph(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(root).expect("the crate's sources") {
        let path = entry.expect("an entry").path();
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_owned();
        if path.is_dir() {
            files.insert(name, rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") && name != "lib" && name != "main" {
            files.insert(name, vec![path]);
        }
    }
    let reference = regex::Regex::new(r"crate::([a-z_][a-z0-9_]*)").expect("a pattern");
    let comment = regex::Regex::new(r"//[^\n]*").expect("a pattern");
    let modules: BTreeSet<String> = files.keys().cloned().collect();
    files
        .iter()
        .map(|(module, paths)| {
            let mut uses = BTreeSet::new();
            for path in paths {
                let text = std::fs::read_to_string(path).expect("a source file");
                let code = comment.replace_all(&text, "");
                for found in reference.captures_iter(&code) {
                    let target = &found[1];
                    if target != module && modules.contains(target) {
                        uses.insert(target.to_owned());
                    }
                }
            }
            (module.clone(), uses)
        })
        .collect()
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a module's folder") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            found.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
    found
}

/// Every cycle's modules (strongly connected components of more than one module).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let reaches = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_owned()];
        while let Some(module) = todo.pop() {
            for next in graph.get(&module).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&String, BTreeSet<String>> = graph.keys().map(|m| (m, reaches(m))).collect();
    let mut found: Vec<BTreeSet<String>> = Vec::new();
    for module in graph.keys() {
        let component: BTreeSet<String> = graph
            .keys()
            .filter(|other| {
                *other == module || (reach[module].contains(*other) && reach[*other].contains(module))
            })
            .cloned()
            .collect();
        if component.len() > 1 && !found.contains(&component) {
            found.push(component);
        }
    }
    found
}

#[test]
fn no_top_level_module_of_either_crate_is_in_a_dependency_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for src in [root.join("src"), root.join("core/src")] {
        let graph = module_graph(&src);
        assert!(
            graph.len() > 10,
            "{} read as a crate of {} modules",
            src.display(),
            graph.len()
        );
        let found = cycles(&graph);
        assert!(
            found.is_empty(),
            "{}: modules in a cycle: {found:?}",
            src.display()
        );
    }
}

#[test]
fn the_cycle_check_finds_a_cycle_when_there_is_one() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(m, to)| (m.to_owned(), to.into_iter().map(str::to_owned).collect()))
    .collect();
    let found = cycles(&graph);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0], ["a", "b", "c"].into_iter().map(str::to_owned).collect());
}

#[test]
fn the_core_depends_on_no_http_server_template_or_openapi_crate() {
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("core/Cargo.toml"))
        .expect("the core's manifest");
    let dependencies = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("a [dependencies] table");
    for forbidden in ["actix-web", "utoipa", "askama", "keel ="] {
        assert!(
            !dependencies
                .lines()
                .any(|l| l.trim_start().starts_with(forbidden)),
            "the core depends on {forbidden}"
        );
    }
    for source in rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("core/src")) {
        let text = std::fs::read_to_string(&source).expect("a source file");
        for forbidden in ["actix_web::", "utoipa::", "askama::", "keel::"] {
            assert!(
                !text.contains(forbidden),
                "{} names {forbidden}",
                source.display()
            );
        }
    }
}
