//! The layers point one way: no top-level module of the web crate (`src/`) or of the core
//! (`core/src/`) reaches a module that reaches it back, and no file reaches a file that reaches
//! it back, every import form counted (`imports`). The core cannot name the web crate at all
//! (it is not a dependency), nor any HTTP crate (checked against its Cargo.toml).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::imports::Crate;

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
        let graph = Crate::read(&src).module_graph();
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
fn no_file_of_either_crate_is_in_a_dependency_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for src in [root.join("src"), root.join("core/src")] {
        let graph = Crate::read(&src).file_graph();
        assert!(
            graph.len() > 50,
            "{} read as {} files",
            src.display(),
            graph.len()
        );
        let found = cycles(&graph);
        // Each cycle with the uses inside it, to say where to cut.
        let uses: Vec<String> = found
            .iter()
            .flat_map(|cycle| {
                cycle.iter().flat_map(|from| {
                    graph[from]
                        .iter()
                        .filter(|to| cycle.contains(*to))
                        .map(move |to| format!("{from} -> {to}"))
                })
            })
            .collect();
        assert!(found.is_empty(), "{}: files in a cycle: {uses:#?}", src.display());
    }
}

#[test]
fn the_cycle_check_reads_every_import_form() {
    let edges = |sources: &[(&str, &str)]| Crate::from_sources(sources).module_graph();
    // Grouped and nested imports, a module's own `self::`, a `super::` out of a folder, a path
    // in an expression and one in a macro's arguments.
    let graph = edges(&[
        ("lib.rs", "mod a; mod b; mod c; mod d; mod e; mod f;"),
        ("a/mod.rs", "use crate::{b, c::{self, X}};"),
        ("a/inner.rs", "use super::super::d::Y;"),
        ("b.rs", "fn f() { let _ = crate::e::g(); }"),
        ("c.rs", "fn f() { tokio::select! { _ = crate::f::h() => {} } }"),
        ("d.rs", "use self::z::W; mod z { pub struct W; }"),
        ("e.rs", "#[cfg(test)] mod tests { use super::super::a::inner; }"),
        ("f.rs", "pub use crate::b as renamed;"),
    ]);
    let named = |m: &str| graph[m].iter().map(String::as_str).collect::<Vec<_>>();
    assert_eq!(named("a"), ["b", "c", "d"]);
    assert_eq!(named("b"), ["e"]);
    assert_eq!(named("c"), ["f"]);
    assert!(named("d").is_empty());
    assert_eq!(named("e"), ["a"]);
    assert_eq!(named("f"), ["b"]);
    assert_eq!(cycles(&graph).len(), 1, "{graph:?}");

    // Files: a folder's re-export is the file it comes from, and no use of its own.
    let files = Crate::from_sources(&[
        ("lib.rs", "mod billing;"),
        ("billing/mod.rs", "mod actor; mod charges; mod payments; pub use actor::Ledger; pub use charges::*; pub struct Error;"),
        ("billing/actor.rs", "use super::{Error, charge}; pub struct Ledger;"),
        ("billing/charges.rs", "pub fn charge() {} fn f(l: super::Ledger) { super::payments::pay(); }"),
        ("billing/payments.rs", "pub fn pay() {}"),
    ])
    .file_graph();
    let named = |m: &str| files[m].iter().map(String::as_str).collect::<Vec<_>>();
    assert!(named("billing").is_empty(), "{files:?}");
    assert_eq!(named("billing::actor"), ["billing", "billing::charges"]);
    assert_eq!(named("billing::charges"), ["billing::actor", "billing::payments"]);
    assert_eq!(cycles(&files).len(), 1);
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

/// The web crate calls services: the core's repositories and actors are visible inside the
/// core only (the compiler then refuses any path to them, under any alias), and the web crate
/// re-exports no module of the core under its own name.
#[test]
fn repositories_and_actors_are_the_cores_own_and_the_web_crate_reexports_no_core_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let declared = regex::Regex::new(r"(?m)^\s*(pub(?:\([a-z]+\))?\s+)?mod\s+(repo|actor)\s*;").unwrap();
    let mut seen = 0;
    for source in rust_files(&root.join("core/src")) {
        let text = std::fs::read_to_string(&source).expect("a source file");
        for found in declared.captures_iter(&text) {
            seen += 1;
            let visibility = found.get(1).map_or("", |v| v.as_str()).trim();
            assert!(
                visibility.is_empty() || visibility == "pub(crate)",
                "{}: `{} mod {}` is reachable from the web crate",
                source.display(),
                visibility,
                &found[2]
            );
        }
    }
    assert!(
        seen >= 14,
        "every domain's repo and the two actors were found ({seen})"
    );
    let reexport =
        regex::Regex::new(r"(?m)^\s*pub\s+use\s+keel_core::([a-z_]+(::[a-z_]+)*)(::\{[^}]*\})?\s*;").unwrap();
    for source in rust_files(&root.join("src")) {
        let text = std::fs::read_to_string(&source).expect("a source file");
        assert!(
            !text
                .lines()
                .any(|l| l.trim_start().starts_with("pub use keel_core") && l.contains('*')),
            "{} re-exports a core module wholesale",
            source.display()
        );
        for found in reexport.captures_iter(&text) {
            let group = found.get(3).map_or("", |g| g.as_str());
            let names: Vec<&str> = group
                .trim_start_matches("::{")
                .trim_end_matches('}')
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .collect();
            let last = found[1].rsplit("::").next().unwrap_or_default();
            // A module's name is lower case; a type's or a constant's is not.
            let modules: Vec<&str> = if group.is_empty() {
                vec![last]
            } else {
                names
                    .into_iter()
                    .filter(|n| n.chars().next().is_some_and(|c| c.is_ascii_lowercase()))
                    .collect()
            };
            assert!(
                modules.is_empty(),
                "{} re-exports the core's module(s) {modules:?}: name them as keel_core's",
                source.display()
            );
        }
    }
}

/// Item 2 of issue 38: rows carry the domain's types, not the raw column types, for every
/// id and amount keel owns (a mirrored reference may stay text; see docs/DECISIONS.md 88).
#[test]
fn entities_type_ids_and_money_with_the_domain_types() {
    let typed = [
        ("org_id", "OrgId"),
        ("project_id", "ProjectId"),
        ("balance_microcents", "Microcents"),
        ("amount_microcents", "Microcents"),
        ("balance_after_microcents", "Microcents"),
        ("cost_microcents", "Microcents"),
        ("charged_microcents", "Microcents"),
        ("amount_cents", "Cents"),
        ("cost_cents", "Cents"),
        ("status", "JobStatus"),
        ("action", "JobAction"),
        ("kind", "EntryKind"),
    ];
    // Tables whose column of that name is another value: free text (`None`) or another type.
    let exempt = [
        ("eval_run.rs", "status", None),
        ("flash_run.rs", "status", None),
        ("run.rs", "status", None),
        ("payment.rs", "status", Some("PaymentState")),
        ("console_session.rs", "kind", None),
        // What keel did on its own (`webhook.endpoint_disabled`), free text.
        ("console_event.rs", "kind", None),
        // A credit grant's kind is a grant kind (starter, promo, ...), not a ledger entry's.
        ("credit_grant.rs", "kind", Some("GrantKind")),
        // A webhook delivery's own states (pending, succeeded, failed), kept as text.
        ("webhook_delivery.rs", "status", None),
    ];
    let mut checked = 0;
    for source in rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("entities/src")) {
        let file = source
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        let text = std::fs::read_to_string(&source).expect("an entity");
        for line in text.lines().map(str::trim) {
            let Some((field, ty)) = line
                .strip_prefix("pub ")
                .and_then(|rest| rest.strip_suffix(','))
                .and_then(|rest| rest.split_once(": "))
            else {
                continue;
            };
            let Some((_, mut want)) = typed.iter().find(|(name, _)| *name == field).copied() else {
                continue;
            };
            if let Some((_, _, other)) = exempt.iter().find(|(f, name, _)| *f == file && *name == field) {
                match other {
                    Some(other) => want = other,
                    None => continue,
                }
            }
            let inner = ty
                .strip_prefix("Option<")
                .and_then(|t| t.strip_suffix('>'))
                .unwrap_or(ty);
            assert_eq!(inner, want, "{file}: {field} is {ty}");
            checked += 1;
        }
    }
    assert!(
        checked > 40,
        "only {checked} fields checked: the entity sources moved?"
    );
    // The key columns of the tables keel gives ids to.
    for (file, ty) in [
        ("organization.rs", "OrgId"),
        ("project.rs", "ProjectId"),
        ("training_job.rs", "JobId"),
        ("trace.rs", "TraceId"),
        ("api_key.rs", "ApiKeyId"),
        ("user.rs", "UserId"),
    ] {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("entities/src")
                .join(file),
        )
        .expect("an entity");
        assert!(text.contains(&format!("pub id: {ty},")), "{file}: id is not {ty}");
    }
}

/// The OpenAPI component names the web crate's types register (`ToSchema`: the type's name,
/// or its `#[schema(as = ...)]`), with the files that register each.
fn schema_names(root: &Path) -> BTreeMap<String, Vec<String>> {
    let item = regex::Regex::new(
        r"(?s)#\[derive\(([^)]*)\)\]((?:\s*(?:///[^\n]*|#\[[^\n]*\]))*)\s*pub(?:\([a-z]+\))?\s+(?:struct|enum)\s+([A-Za-z0-9_]+)",
    )
    .expect("a pattern");
    let renamed = regex::Regex::new(r"#\[schema\([^\]]*\bas\s*=\s*([A-Za-z0-9_:]+)").expect("a pattern");
    let mut names: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for path in rust_files(root) {
        let text = std::fs::read_to_string(&path).expect("a source file");
        for found in item.captures_iter(&text) {
            if !found[1].split(',').any(|d| d.trim().ends_with("ToSchema")) {
                continue;
            }
            let name = renamed
                .captures(&found[2])
                .map(|r| r[1].rsplit("::").next().unwrap_or_default().to_owned())
                .unwrap_or_else(|| found[3].to_owned());
            names.entry(name).or_default().push(path.display().to_string());
        }
    }
    names
}

#[test]
fn no_two_types_register_one_openapi_component_name() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let names = schema_names(&root);
    assert!(
        names.contains_key("JobView") && names.contains_key("ErrorCode"),
        "the scan finds the schemas"
    );
    let twice: Vec<_> = names.iter().filter(|(_, files)| files.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "one component name for two types (a generated client would read one as the other): {twice:?}"
    );
}

#[test]
fn the_component_name_check_finds_two_types_of_one_name() {
    let dir = tempfile::tempdir().unwrap();
    for (file, body) in [
        ("a.rs", "#[derive(Debug, Serialize, ToSchema)]\n#[serde(rename_all = \"camelCase\")]\npub struct AttemptView {}\n"),
        ("b.rs", "/// Other.\n#[derive(utoipa::ToSchema)]\npub struct AttemptView { x: i32 }\n#[derive(ToSchema)]\n#[schema(as = Renamed)]\npub enum Kept {}\n"),
    ] {
        std::fs::write(dir.path().join(file), body).unwrap();
    }
    let names = schema_names(dir.path());
    assert_eq!(names["AttemptView"].len(), 2);
    assert!(names.contains_key("Renamed") && !names.contains_key("Kept"));
}
