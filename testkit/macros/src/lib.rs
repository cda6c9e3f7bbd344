//! `#[kernel_test]`: marks a test as a kernel test, one that needs root and network namespaces
//! (it creates namespaces, sends real traffic, programs nftables). Re-exported by
//! `redirect_testkit` as `redirect_testkit::kernel_test`; use it from there.
//!
//! ```ignore
//! use redirect_testkit::{kernel_test, TestNetns};
//!
//! #[kernel_test]
//! fn a_fresh_namespace_has_a_loopback() {
//!     let ns = TestNetns::new();
//!     // ...
//! }
//! ```
//!
//! expands to
//!
//! ```ignore
//! #[test]
//! #[ignore = "kernel test: needs root and network namespaces (CAP_NET_ADMIN, CAP_SYS_ADMIN); scripts/test.sh runs it as root"]
//! fn a_fresh_namespace_has_a_loopback() {
//!     ::redirect_testkit::require_kernel();
//!     let ns = TestNetns::new();
//!     // ...
//! }
//! ```
//!
//! So a plain `cargo test` reports every kernel test as *ignored* with its reason, and
//! `cargo test -- --include-ignored` (what `scripts/test.sh` runs as root) runs them, each
//! first checking that it can: `require_kernel` panics naming what is missing (root, a new
//! network namespace) rather than letting the test pass without running.
//!
//! No dependency: the function is read as tokens, its body being its last token (a `{ ... }`
//! group), into which the check is inserted as the first statement.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

use proc_macro::{Delimiter, Group, Span, TokenStream, TokenTree};

/// The reason libtest prints beside `ignored` (`test x ... ignored, <reason>`).
const REASON: &str = "kernel test: needs root and network namespaces (CAP_NET_ADMIN, \
                      CAP_SYS_ADMIN); scripts/test.sh runs it as root";

/// Marks a `fn` as a kernel test: `#[test]`, ignored with the reason above unless run with
/// `--include-ignored`, and its body preceded by `::redirect_testkit::require_kernel()`.
/// Takes no arguments.
#[proc_macro_attribute]
pub fn kernel_test(args: TokenStream, item: TokenStream) -> TokenStream {
    if let Some(t) = args.into_iter().next() {
        return error(t.span(), "#[kernel_test] takes no arguments");
    }
    let mut tokens: Vec<TokenTree> = item.into_iter().collect();
    let is_fn = tokens
        .iter()
        .any(|t| matches!(t, TokenTree::Ident(i) if i.to_string() == "fn"));
    let body = match tokens.last() {
        Some(TokenTree::Group(g)) if is_fn && g.delimiter() == Delimiter::Brace => g.clone(),
        _ => {
            return error(
                Span::call_site(),
                "#[kernel_test] applies to a `fn` with a body",
            )
        }
    };
    let check: TokenStream = "::redirect_testkit::require_kernel();".parse().unwrap();
    let mut inner = check;
    inner.extend(body.stream());
    let mut new_body = Group::new(Delimiter::Brace, inner);
    new_body.set_span(body.span());
    *tokens.last_mut().unwrap() = TokenTree::Group(new_body);

    let mut out: TokenStream = format!("#[test] #[ignore = {REASON:?}]").parse().unwrap();
    out.extend(tokens);
    out
}

/// `::core::compile_error!("message");`, every token at `span`.
fn error(span: Span, message: &str) -> TokenStream {
    let text = format!("::core::compile_error!({message:?});");
    let tokens: TokenStream = text.parse().unwrap();
    tokens.into_iter().map(|t| at(t, span)).collect()
}

/// `t` with `span`, groups' insides included.
fn at(t: TokenTree, span: Span) -> TokenTree {
    let mut t = match t {
        TokenTree::Group(g) => {
            let inner = g.stream().into_iter().map(|t| at(t, span)).collect();
            TokenTree::Group(Group::new(g.delimiter(), inner))
        }
        t => t,
    };
    t.set_span(span);
    t
}
