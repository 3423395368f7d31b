//! What a crate's sources name of the crate itself, read with `syn` as the compiler reads
//! them: `use` trees with their groups (`use crate::{a, b::{c, d}}`), `crate::`, `super::` and
//! `self::` paths (inline modules such as `mod tests` counted), a child module named bare
//! (`use repo::insert` in a `mod.rs`), and paths in expressions, types and macro arguments.
//! The architecture checks build their module and file graphs from it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// A module's path from its crate's root (`["billing", "ledger"]`; the root is `[]`).
pub type ModulePath = Vec<String>;

/// One source file: the paths of the crate it names, and what its top level re-exports
/// (`pub use a::B` as `"B" -> [.., "a", "B"]`).
#[derive(Debug, Default)]
pub struct Names {
    pub references: BTreeSet<ModulePath>,
    pub reexports: BTreeMap<String, ModulePath>,
    /// What its top level re-exports whole (`pub use a::*`).
    pub globs: Vec<ModulePath>,
    /// The names of the items its top level defines.
    pub items: BTreeSet<String>,
}

/// A crate's file modules, each with the paths of the crate its source names.
pub struct Crate {
    pub files: BTreeMap<ModulePath, Names>,
}

impl Crate {
    /// The crate whose sources are under `root` (its `src`).
    pub fn read(root: &Path) -> Self {
        let mut sources = Vec::new();
        collect(root, root, &mut sources);
        let borrowed: Vec<(&str, &str)> = sources.iter().map(|(f, s)| (f.as_str(), s.as_str())).collect();
        Self::from_sources(&borrowed)
    }

    /// A crate of `(file, source)` pairs, each file named from the crate's root as on disk
    /// (`lib.rs`, `billing/mod.rs`, `billing/ledger.rs`).
    pub fn from_sources(sources: &[(&str, &str)]) -> Self {
        let modules: Vec<(ModulePath, &str)> = sources
            .iter()
            .map(|(file, text)| (module_of(file), *text))
            .collect();
        let known: BTreeSet<ModulePath> = modules.iter().map(|(m, _)| m.clone()).collect();
        let files = modules
            .into_iter()
            .map(|(module, text)| {
                let parsed =
                    syn::parse_file(text).unwrap_or_else(|err| panic!("{module:?} does not parse: {err}"));
                let mut collector = Collector {
                    known: &known,
                    file: module.clone(),
                    current: module.clone(),
                    names: Names::default(),
                };
                collector.visit_file(&parsed);
                (module, collector.names)
            })
            .collect();
        Self { files }
    }

    /// Each top-level module with the other top-level modules its files name.
    pub fn module_graph(&self) -> BTreeMap<String, BTreeSet<String>> {
        let tops: BTreeSet<&String> = self.files.keys().filter_map(|m| m.first()).collect();
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (module, names) in &self.files {
            let Some(top) = module.first() else { continue };
            let uses = graph.entry(top.clone()).or_default();
            let named = names.references.iter().chain(names.reexports.values());
            for target in named.filter_map(|r| r.first()) {
                if target != top && tops.contains(target) {
                    uses.insert(target.clone());
                }
            }
        }
        graph
    }

    /// The file a crate path is in (`billing::ledger::Ledger` is `billing/ledger.rs`'s), a name
    /// a folder's `mod.rs` re-exports followed to the file it comes from.
    fn file_of(&self, path: &[String]) -> ModulePath {
        let mut path = path.to_vec();
        for _ in 0..8 {
            let Some(file) = (0..=path.len())
                .rev()
                .map(|n| &path[..n])
                .find(|m| self.files.contains_key(*m))
            else {
                return Vec::new();
            };
            let file = file.to_vec();
            let folder = self
                .files
                .keys()
                .any(|m| m.len() > file.len() && m.starts_with(&file));
            let names = &self.files[&file];
            let reexported = path.get(file.len()).filter(|_| folder).and_then(|name| {
                names.reexports.get(name).cloned().or_else(|| {
                    // From a glob: the globbed module that defines it.
                    names
                        .globs
                        .iter()
                        .find(|g| self.files.get(*g).is_some_and(|n| n.items.contains(name)))
                        .map(|g| g.iter().chain([name]).cloned().collect())
                })
            });
            match reexported.as_ref() {
                Some(source) => path = source.iter().chain(&path[file.len() + 1..]).cloned().collect(),
                None => return file,
            }
        }
        path
    }

    /// Each file (by its module path joined with `::`; the root left out) with the files it
    /// names. What a folder's `mod.rs` only re-exports (`pub use ledger::Ledger`) is counted as
    /// the file it comes from, and the re-export itself as no use: it is how the folder spells
    /// its names, not code of its own that needs them.
    pub fn file_graph(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (module, names) in &self.files {
            if module.is_empty() {
                continue;
            }
            let folder = self
                .files
                .keys()
                .any(|m| m.len() > module.len() && m.starts_with(module));
            let reexports = names.reexports.values().filter(|_| !folder);
            let uses = graph.entry(module.join("::")).or_default();
            for reference in names.references.iter().chain(reexports) {
                let to = self.file_of(reference);
                if !to.is_empty() && to != *module {
                    uses.insert(to.join("::"));
                }
            }
        }
        graph
    }
}

fn collect(root: &Path, dir: &Path, into: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).expect("a source folder") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            collect(root, &path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let name = path
                .strip_prefix(root)
                .expect("under the root")
                .to_string_lossy()
                .replace('\\', "/");
            into.push((name, std::fs::read_to_string(&path).expect("a source file")));
        }
    }
}

/// `billing/ledger.rs` is `["billing", "ledger"]`, `billing/mod.rs` is `["billing"]`, `lib.rs`
/// and `main.rs` are the root.
fn module_of(file: &str) -> ModulePath {
    let mut parts: Vec<String> = file
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_owned)
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

struct Collector<'a> {
    known: &'a BTreeSet<ModulePath>,
    /// The file's module.
    file: ModulePath,
    /// The module being read (the file's, or an inline module in it).
    current: ModulePath,
    names: Names,
}

impl Collector<'_> {
    /// The crate path `segments` names from the module being read, or `None` for another
    /// crate's (or a local item's) path.
    fn resolve(&self, segments: &[String]) -> Option<ModulePath> {
        let first = segments.first()?;
        match first.as_str() {
            "crate" => Some(segments[1..].to_vec()),
            "self" => Some(self.current.iter().chain(&segments[1..]).cloned().collect()),
            "super" => {
                let supers = segments.iter().take_while(|s| *s == "super").count();
                let mut base = self.current.clone();
                for _ in 0..supers {
                    base.pop()?;
                }
                base.extend(segments[supers..].iter().cloned());
                Some(base)
            }
            _ => {
                // A child module named bare (2018 paths): `repo::insert` in `billing/mod.rs`.
                let mut child = self.current.clone();
                child.push(first.clone());
                self.known
                    .iter()
                    .any(|m| m.starts_with(&child))
                    .then(|| child.into_iter().chain(segments[1..].iter().cloned()).collect())
            }
        }
    }

    fn note(&mut self, segments: &[String]) {
        if let Some(path) = self.resolve(segments) {
            self.names.references.insert(path);
        }
    }
}

/// Every path of a `use` tree, groups and renames flattened, with the name each binds.
fn flatten(tree: &syn::UseTree, prefix: &mut Vec<String>, into: &mut Vec<(Vec<String>, Option<String>)>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten(&p.tree, prefix, into);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut path = prefix.clone();
            let name = n.ident.to_string();
            // `use a::b::{self}` names `a::b`.
            if name != "self" {
                path.push(name.clone());
            }
            let bound = if name == "self" {
                prefix.last().cloned()
            } else {
                Some(name)
            };
            into.push((path, bound));
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            into.push((path, Some(r.rename.to_string())));
        }
        syn::UseTree::Glob(_) => into.push((prefix.clone(), None)),
        syn::UseTree::Group(g) => {
            for item in &g.items {
                flatten(item, prefix, into);
            }
        }
    }
}

/// The `a::b::c` paths in a macro's tokens (`tokio::select!`, `format!` and the like are not
/// parsed as code).
fn token_paths(tokens: TokenStream, into: &mut Vec<Vec<String>>) {
    let mut current: Vec<String> = Vec::new();
    let mut colons = 0;
    let flush = |current: &mut Vec<String>, into: &mut Vec<Vec<String>>| {
        if current.len() > 1 {
            into.push(std::mem::take(current));
        }
        current.clear();
    };
    for token in tokens {
        match token {
            TokenTree::Ident(ident) => {
                if colons == 2 && !current.is_empty() {
                    current.push(ident.to_string());
                } else {
                    flush(&mut current, into);
                    current.push(ident.to_string());
                }
                colons = 0;
            }
            TokenTree::Punct(p) if p.as_char() == ':' && colons < 2 => colons += 1,
            TokenTree::Group(g) => {
                flush(&mut current, into);
                colons = 0;
                token_paths(g.stream(), into);
            }
            _ => {
                flush(&mut current, into);
                colons = 0;
            }
        }
    }
    flush(&mut current, into);
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if self.current == self.file {
            let ident = match item {
                syn::Item::Const(i) => Some(&i.ident),
                syn::Item::Enum(i) => Some(&i.ident),
                syn::Item::Fn(i) => Some(&i.sig.ident),
                syn::Item::Mod(i) => Some(&i.ident),
                syn::Item::Static(i) => Some(&i.ident),
                syn::Item::Struct(i) => Some(&i.ident),
                syn::Item::Trait(i) => Some(&i.ident),
                syn::Item::Type(i) => Some(&i.ident),
                syn::Item::Union(i) => Some(&i.ident),
                syn::Item::Macro(i) => i.ident.as_ref(),
                _ => None,
            };
            if let Some(ident) = ident {
                self.names.items.insert(ident.to_string());
            }
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if item.content.is_some() {
            self.current.push(item.ident.to_string());
            syn::visit::visit_item_mod(self, item);
            self.current.pop();
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        let mut paths = Vec::new();
        flatten(&item.tree, &mut Vec::new(), &mut paths);
        let reexport = !matches!(item.vis, syn::Visibility::Inherited) && self.current == self.file;
        for (path, bound) in paths {
            let Some(resolved) = self.resolve(&path) else {
                continue;
            };
            match (reexport, bound) {
                (true, Some(name)) => {
                    self.names.reexports.insert(name, resolved);
                }
                (true, None) => self.names.globs.push(resolved),
                _ => {
                    self.names.references.insert(resolved);
                }
            }
        }
    }

    /// `pub(in crate::a)` says who may see an item, not what it needs.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1 {
            self.note(&segments);
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let mut paths = Vec::new();
        token_paths(mac.tokens.clone(), &mut paths);
        for path in paths {
            self.note(&path);
        }
        syn::visit::visit_macro(self, mac);
    }
}
