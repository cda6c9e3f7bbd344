//! A crate's modules as a graph, read with syn (issue 48). Each `.rs` file under `src/` is a
//! module (`a/b.rs` and `a/b/mod.rs` are `a::b`); A uses B when A's code, outside its
//! `#[cfg(test)]` parts, names a path into B through `crate::`, `super::` or `self::`, resolved
//! to the longest module that exists. A module naming its own descendants is no use (a parent
//! declares and composes its children); a child naming its parent's items is one. Macro calls'
//! tokens are read too: a `crate::` path in `format!` is a use like any other.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// A module's path in its crate; `[]` is the crate's root.
pub type Module = Vec<String>;

/// One crate's modules, what each uses, and where its types' inherent impl blocks are.
pub struct Crate {
    pub name: String,
    /// Every module read (test-only files aside).
    pub modules: BTreeSet<Module>,
    /// module → the modules it uses, each with the first place it does (`file:line path`).
    pub uses: BTreeMap<Module, BTreeMap<Module, String>>,
    /// A type (its name, the file defining it) → the files with an inherent impl of it.
    pub impls: BTreeMap<(String, String), BTreeSet<String>>,
    /// Inherent impl blocks whose type could not be told from others of its name.
    pub unresolved: Vec<String>,
}

impl Crate {
    /// module → the modules it uses.
    pub fn graph(&self) -> BTreeMap<Module, BTreeSet<Module>> {
        self.uses
            .iter()
            .map(|(m, u)| (m.clone(), u.keys().cloned().collect()))
            .collect()
    }
}

/// `a::b`, or `crate` for the root.
pub fn show(m: &[String]) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// The module a file under `src/` is.
fn module_of(rel: &Path) -> Module {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod")
        || (parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main"))
    {
        parts.pop();
    }
    parts
}

/// The items of one file: the paths it names, its types, imports and inherent impls.
struct Names {
    /// The file's module, then the inline modules around the item being read.
    scope: Module,
    /// (absolute path, line, as written).
    paths: Vec<(Vec<String>, usize, String)>,
    /// `#[cfg(test)] mod x;`: the files of tests.
    test_mods: Vec<Module>,
    defined: BTreeSet<String>,
    /// A name brought in by `use` → its absolute path.
    imports: BTreeMap<String, Vec<String>>,
    /// (the type's path as written, the scope of the impl).
    impls: Vec<(Vec<String>, Module)>,
}

/// `path` (starting `crate`, `self` or `super`) made absolute from `scope`; `None` for a path
/// that starts elsewhere (another crate, a local name).
fn absolute(scope: &[String], path: &[String]) -> Option<Vec<String>> {
    let (mut base, mut rest) = match path.first()?.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (scope.to_vec(), &path[1..]),
        "super" => (scope.to_vec(), path),
        _ => return None,
    };
    while rest.first().is_some_and(|s| s == "super") {
        base.pop()?;
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().segments.last().is_some_and(|s| s.ident == "test")
            || (a.path().is_ident("cfg")
                && a.meta.require_list().is_ok_and(|l| {
                    let t = l.tokens.to_string();
                    t == "test" || t.starts_with("all (test")
                }))
    })
}

fn attrs_of(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item::*;
    match item {
        Const(i) => &i.attrs,
        Enum(i) => &i.attrs,
        ExternCrate(i) => &i.attrs,
        Fn(i) => &i.attrs,
        ForeignMod(i) => &i.attrs,
        Impl(i) => &i.attrs,
        Macro(i) => &i.attrs,
        Mod(i) => &i.attrs,
        Static(i) => &i.attrs,
        Struct(i) => &i.attrs,
        Trait(i) => &i.attrs,
        TraitAlias(i) => &i.attrs,
        Type(i) => &i.attrs,
        Union(i) => &i.attrs,
        Use(i) => &i.attrs,
        _ => &[],
    }
}

impl Names {
    fn name(&mut self, path: Vec<String>, line: usize) {
        if let Some(abs) = absolute(&self.scope, &path) {
            self.paths.push((abs, line, path.join("::")));
        }
    }

    /// Each path of a `use` tree, with the name it brings in.
    fn use_tree(&mut self, tree: &syn::UseTree, prefix: &mut Vec<String>) {
        let leaf =
            |names: &mut Names, prefix: &[String], ident: &syn::Ident, alias: Option<String>| {
                let mut path = prefix.to_vec();
                if ident != "self" {
                    path.push(ident.to_string());
                }
                if let (Some(abs), Some(alias)) = (absolute(&names.scope, &path), alias) {
                    names.imports.insert(alias, abs);
                }
                names.name(path, ident.span().start().line);
            };
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let alias = (n.ident != "self").then(|| n.ident.to_string());
                leaf(self, prefix, &n.ident, alias.or(prefix.last().cloned()));
            }
            syn::UseTree::Rename(r) => leaf(self, prefix, &r.ident, Some(r.rename.to_string())),
            syn::UseTree::Glob(g) => self.name(prefix.clone(), g.star_token.spans[0].start().line),
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.use_tree(t, prefix)),
        }
    }

    /// The `crate::`, `super::` and `self::` paths in a macro call's tokens.
    fn tokens(&mut self, tokens: TokenStream) {
        let flat: Vec<TokenTree> = tokens.into_iter().collect();
        for (i, t) in flat.iter().enumerate() {
            match t {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) if ["crate", "super", "self"].contains(&&*id.to_string()) => {
                    let mut path = vec![id.to_string()];
                    let mut j = i + 1;
                    while let [TokenTree::Punct(a), TokenTree::Punct(b), TokenTree::Ident(n), ..] =
                        &flat[j.min(flat.len())..]
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        path.push(n.to_string());
                        j += 3;
                    }
                    if path.len() > 1 {
                        self.name(path, id.span().start().line);
                    }
                }
                _ => {}
            }
        }
    }
}

impl<'ast> Visit<'ast> for Names {
    fn visit_item(&mut self, i: &'ast syn::Item) {
        if !is_test(attrs_of(i)) {
            syn::visit::visit_item(self, i);
        } else if let syn::Item::Mod(m) = i {
            let mut test = self.scope.clone();
            test.push(m.ident.to_string());
            self.test_mods.push(test);
        }
    }
    fn visit_impl_item(&mut self, i: &'ast syn::ImplItem) {
        let attrs = match i {
            syn::ImplItem::Fn(f) => &f.attrs,
            syn::ImplItem::Const(c) => &c.attrs,
            syn::ImplItem::Type(t) => &t.attrs,
            _ => return syn::visit::visit_impl_item(self, i),
        };
        if !is_test(attrs) {
            syn::visit::visit_impl_item(self, i);
        }
    }
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.scope.push(m.ident.to_string());
            syn::visit::visit_item_mod(self, m);
            self.scope.pop();
        }
    }
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if u.leading_colon.is_none() {
            self.use_tree(&u.tree, &mut Vec::new());
        }
    }
    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() {
            if let Some(first) = p.segments.first() {
                let path = p.segments.iter().map(|s| s.ident.to_string()).collect();
                self.name(path, first.ident.span().start().line);
            }
        }
        syn::visit::visit_path(self, p);
    }
    // `pub(in crate::a)` says who may see an item; it uses nothing.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}
    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        syn::visit::visit_macro(self, m);
        self.tokens(m.tokens.clone());
    }
    fn visit_item_struct(&mut self, s: &'ast syn::ItemStruct) {
        self.defined.insert(s.ident.to_string());
        syn::visit::visit_item_struct(self, s);
    }
    fn visit_item_enum(&mut self, e: &'ast syn::ItemEnum) {
        self.defined.insert(e.ident.to_string());
        syn::visit::visit_item_enum(self, e);
    }
    fn visit_item_union(&mut self, u: &'ast syn::ItemUnion) {
        self.defined.insert(u.ident.to_string());
        syn::visit::visit_item_union(self, u);
    }
    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if let (None, syn::Type::Path(t)) = (&i.trait_, &*i.self_ty) {
            if t.qself.is_none() {
                let path = t.path.segments.iter().map(|s| s.ident.to_string());
                self.impls.push((path.collect(), self.scope.clone()));
            }
        }
        syn::visit::visit_item_impl(self, i);
    }
}

/// One file read: its path under the crate's folder, its module, its names.
struct File {
    rel: String,
    module: Module,
    names: Names,
}

/// The files of `src/` (each binary of `src/bin/` is a crate of its own file, not read), less
/// those that are `#[cfg(test)]` modules.
fn files(dir: &Path) -> Vec<File> {
    let src = dir.join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    let mut out = Vec::new();
    for f in paths {
        let rel = f.strip_prefix(&src).unwrap();
        if rel.starts_with("bin") {
            assert!(
                rel.iter().count() == 2,
                "{}: a binary of several files; the module test reads one-file binaries only",
                f.display()
            );
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let module = module_of(rel);
        let mut names = Names {
            scope: module.clone(),
            paths: Vec::new(),
            test_mods: Vec::new(),
            defined: BTreeSet::new(),
            imports: BTreeMap::new(),
            impls: Vec::new(),
        };
        names.visit_file(&file);
        let rel = f.strip_prefix(dir).unwrap().display().to_string();
        out.push(File { rel, module, names });
    }
    let tests: Vec<Module> = out.iter().flat_map(|f| f.names.test_mods.clone()).collect();
    out.retain(|f| !tests.iter().any(|t| f.module.starts_with(t)));
    out
}

/// The longest module of `modules` that `path` starts with.
fn longest(modules: &BTreeSet<Module>, path: &[String]) -> Module {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|m| modules.contains(m))
        .unwrap_or_default()
}

/// The crate `name` in `dir`: its modules' uses and its types' inherent impls.
pub fn read(name: &str, dir: &Path) -> Crate {
    let files = files(dir);
    let mut modules: BTreeSet<Module> = files.iter().map(|f| f.module.clone()).collect();
    modules.insert(Vec::new());
    let mut uses: BTreeMap<Module, BTreeMap<Module, String>> = BTreeMap::new();
    for f in &files {
        for (abs, line, written) in &f.names.paths {
            let to = longest(&modules, abs);
            if !to.starts_with(&f.module) {
                let here = format!("{}:{line} {written}", f.rel);
                uses.entry(f.module.clone())
                    .or_default()
                    .entry(to)
                    .or_insert(here);
            }
        }
    }
    let (impls, unresolved) = impls(&files, &modules);
    Crate {
        name: name.to_string(),
        modules,
        uses,
        impls,
        unresolved,
    }
}

/// Each inherent impl's type (its name, the file defining it) → the files of its impls; and
/// the impls whose type could not be told.
#[allow(clippy::type_complexity)]
fn impls(
    files: &[File],
    modules: &BTreeSet<Module>,
) -> (BTreeMap<(String, String), BTreeSet<String>>, Vec<String>) {
    let mut definers: BTreeMap<&str, Vec<&File>> = BTreeMap::new();
    for f in files {
        for d in &f.names.defined {
            definers.entry(d).or_default().push(f);
        }
    }
    let mut out: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    let mut unresolved = Vec::new();
    for f in files {
        for (path, scope) in &f.names.impls {
            let name = path.last().unwrap();
            let candidates = definers.get(name.as_str()).cloned().unwrap_or_default();
            match owner(f, path, scope, &candidates, modules) {
                Some(def) => {
                    out.entry((name.clone(), def.rel.clone()))
                        .or_default()
                        .insert(f.rel.clone());
                }
                None if candidates.is_empty() => {} // a type made by a macro
                None => unresolved.push(format!("{}: impl {}", f.rel, path.join("::"))),
            }
        }
    }
    (out, unresolved)
}

/// Which of `candidates` (the files defining a type of that name) an impl in `f` is for:
/// the only one, the impl's own file, or the one its path or `use` leads to.
fn owner<'a>(
    f: &File,
    path: &[String],
    scope: &[String],
    candidates: &[&'a File],
    modules: &BTreeSet<Module>,
) -> Option<&'a File> {
    if let [only] = candidates {
        return Some(only);
    }
    if path.len() == 1 {
        if let Some(own) = candidates.iter().find(|c| c.rel == f.rel) {
            return Some(own);
        }
    }
    let abs = match path {
        [name] => f.names.imports.get(name)?.clone(),
        _ => absolute(scope, path)?,
    };
    let module = longest(modules, &abs[..abs.len() - 1]);
    let within: Vec<_> = candidates
        .iter()
        .filter(|c| c.module.starts_with(&module))
        .collect();
    match within[..] {
        [one] => Some(one),
        _ => None,
    }
}

/// The cycles of `graph` (node → the nodes it uses): for each node on one, the shortest path
/// back to it, each cycle once.
pub fn cycles<T: Ord + Clone>(graph: &BTreeMap<T, BTreeSet<T>>) -> Vec<Vec<T>> {
    let mut found: Vec<Vec<T>> = Vec::new();
    for start in graph.keys() {
        let mut from: BTreeMap<&T, &T> = BTreeMap::new();
        let mut todo = VecDeque::from([start]);
        while let Some(at) = todo.pop_front() {
            for next in graph.get(at).into_iter().flatten() {
                if next == start {
                    let mut path = vec![start.clone()];
                    let mut back = at;
                    while back != start {
                        path.push(back.clone());
                        back = from[back];
                    }
                    path[1..].reverse();
                    path.push(start.clone());
                    let same =
                        |c: &Vec<T>| c.len() == path.len() && path.iter().all(|n| c.contains(n));
                    if !found.iter().any(same) {
                        found.push(path);
                    }
                    todo.clear();
                    break;
                }
                if next != start && !from.contains_key(next) {
                    from.insert(next, at);
                    todo.push_back(next);
                }
            }
        }
    }
    found
}

pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}
