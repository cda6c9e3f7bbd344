//! One error, printed once: the checks behind the project's convention that a wrapping error
//! says its own context and leaves its cause to `source()` (DESIGN.md, "Conventions"), shared
//! by every crate's error tests.

use std::error::Error;

/// The messages of `e`'s chain, outermost first: `Display`, then each `source()`.
pub fn messages(e: &dyn Error) -> Vec<String> {
    let mut out = vec![e.to_string()];
    let mut next = e.source();
    while let Some(s) = next {
        out.push(s.to_string());
        next = s.source();
    }
    out
}

/// Asserts that walking `e`'s chain finds no message twice (none equal to, or standing inside,
/// one before it), so a chain reporter prints each thing once, and that the first message
/// names `names` (the value). `kind` names the error in a failure. Returns the messages.
pub fn assert_each_message_once(kind: &str, e: &dyn Error, names: &str) -> Vec<String> {
    let msgs = messages(e);
    for (i, outer) in msgs.iter().enumerate() {
        for inner in &msgs[i + 1..] {
            assert!(
                !outer.contains(inner.as_str()),
                "{kind}: a chain reporter would print {inner:?} twice: {msgs:#?}"
            );
        }
    }
    assert!(
        msgs[0].contains(names),
        "{kind}: {:?} does not name {names:?}",
        msgs[0]
    );
    msgs
}

/// Asserts that `line` (a program's one line for an error, e.g. `redirect_program::errors::chain`)
/// shows each of `msgs` exactly once.
pub fn assert_shown_once(kind: &str, line: &str, msgs: &[String]) {
    for m in msgs {
        assert_eq!(
            line.matches(m.as_str()).count(),
            1,
            "{kind}: {m:?} is not shown once in {line:?}"
        );
    }
}
