//! No shipped function is over 80 lines: every `fn` in the `src/` of the library crates and
//! the programs (test modules aside), measured from its `fn` line to its closing brace with
//! `syn`, so strings and comments holding braces count right.

use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::Visit;

const LIMIT: usize = 80;

/// The folders of shipped code: the library crates and the programs.
const SHIPPED: [&str; 11] = [
    "redirect-core/src",
    "redirect-core/model/src",
    "redirect-core/kernel/src",
    "redirect-core/istio/src",
    "program/src",
    "init-shim/src",
    "cni-shim/protocol/src",
    "cni-shim/zds/src",
    "cni-shim/plugin/src",
    "cni-shim/node/src",
    "validator/src",
];

/// Every function of a file with its length in lines, test modules and tests skipped.
struct Lengths<'a> {
    file: &'a str,
    found: Vec<(String, usize)>,
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("test")
            || (a.path().is_ident("cfg")
                && a.meta.require_list().is_ok_and(|l| {
                    let tokens = l.tokens.to_string();
                    tokens == "test" || tokens.starts_with("test,")
                }))
    })
}

impl Lengths<'_> {
    fn record(&mut self, name: &syn::Ident, sig: &syn::Signature, block: &syn::Block) {
        let first = sig.fn_token.span().start().line;
        let last = block.brace_token.span.close().end().line;
        self.found
            .push((format!("{}:{first} {name}", self.file), last + 1 - first));
    }
}

impl<'ast> Visit<'ast> for Lengths<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test(&f.attrs) {
            self.record(&f.sig.ident, &f.sig, &f.block);
            syn::visit::visit_item_fn(self, f);
        }
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test(&f.attrs) {
            self.record(&f.sig.ident, &f.sig, &f.block);
            syn::visit::visit_impl_item_fn(self, f);
        }
    }
    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.record(&f.sig.ident, &f.sig, block);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every shipped function with its length, longest first.
fn shipped_functions() -> Vec<(String, usize)> {
    let root = redirect_testkit::docs::workspace();
    let mut all = Vec::new();
    for dir in SHIPPED {
        let mut files = Vec::new();
        rust_files(&root.join(dir), &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            let rel = f.strip_prefix(&root).unwrap().display().to_string();
            let mut v = Lengths {
                file: &rel,
                found: Vec::new(),
            };
            v.visit_file(&ast);
            all.extend(v.found);
        }
    }
    all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    all
}

#[test]
fn no_shipped_function_is_over_80_lines() {
    let all = shipped_functions();
    assert!(all.len() > 500, "too few functions found: {}", all.len());
    // The measure itself: a known short function is found with its real length.
    assert!(
        all.iter()
            .any(|(at, n)| at.ends_with(" redirect_port") && *n == 6),
        "the measure is off: {:?}",
        all.iter().find(|(at, _)| at.ends_with(" redirect_port"))
    );
    let long: Vec<String> = all
        .iter()
        .filter(|(_, n)| *n > LIMIT)
        .map(|(at, n)| format!("{at}: {n} lines"))
        .collect();
    eprintln!(
        "{} shipped functions; the longest: {:?}",
        all.len(),
        &all[..5.min(all.len())]
    );
    assert!(
        long.is_empty(),
        "shipped functions over {LIMIT} lines:\n{}",
        long.join("\n")
    );
}
