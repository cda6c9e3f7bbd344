//! An error as the operator reads it: its message and its causes, each once.
//!
//! Our errors follow one rule (DESIGN.md, "Conventions"): a wrapping error says its own context
//! (the path, the pod, the request) and leaves the inner error to `source()`, so that a chain
//! reporter (anyhow's `{:#}`, a loop over `source()`) prints each thing once. The flip side:
//! an error's `Display` alone no longer carries its cause. Whatever shows an error to someone
//! (a log line, a stderr line, an HTTP or CNI answer, a test's assertion) writes it with
//! [`chain`] (or [`Chain`] in a format string), never with `{e}` or `e.to_string()`.
//!
//! ```
//! use std::io;
//!
//! #[derive(Debug)]
//! struct Read(io::Error);
//!
//! impl std::fmt::Display for Read {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
//!         f.write_str("cannot read /host/proc")
//!     }
//! }
//!
//! impl std::error::Error for Read {
//!     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
//!         Some(&self.0)
//!     }
//! }
//!
//! let e = Read(io::Error::new(io::ErrorKind::PermissionDenied, "permission denied"));
//! assert_eq!(e.to_string(), "cannot read /host/proc");
//! assert_eq!(
//!     redirect_program::errors::chain(&e),
//!     "cannot read /host/proc: permission denied"
//! );
//! ```

use std::error::Error;
use std::fmt;

/// `e`'s message, then each of its causes (`source()`, then that one's `source()`, ...),
/// joined with `": "`: `cannot read /host/proc: Permission denied (os error 13)`.
///
/// A cause whose message the message before it already contains (an error that still prints
/// its inner one, or an empty message) is skipped, so each text appears once whichever way an
/// error is written. The same as `Chain(e).to_string()`.
pub fn chain(e: &dyn Error) -> String {
    Chain(e).to_string()
}

/// [`chain`] as a `Display`, for a format string without an intermediate `String`:
/// `tracing::warn!("pod {who}: {}", Chain(&e))`.
#[derive(Clone, Copy, Debug)]
pub struct Chain<'a>(pub &'a dyn Error);

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut previous = self.0.to_string();
        f.write_str(&previous)?;
        let mut next = self.0.source();
        while let Some(cause) = next {
            let message = cause.to_string();
            if !previous.contains(message.as_str()) {
                write!(f, ": {message}")?;
            }
            previous = message;
            next = cause.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test error: its message, and optionally a cause.
    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);

    impl fmt::Display for E {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for E {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|e| e as &(dyn Error + 'static))
        }
    }

    fn e(msg: &'static str, cause: Option<E>) -> E {
        E(msg, cause.map(Box::new))
    }

    #[test]
    fn joins_each_cause_after_the_message() {
        assert_eq!(chain(&e("alone", None)), "alone");
        let three = e(
            "pod a/b",
            Some(e("cannot read /proc", Some(e("denied", None)))),
        );
        assert_eq!(chain(&three), "pod a/b: cannot read /proc: denied");
        assert_eq!(Chain(&three).to_string(), chain(&three));
    }

    #[test]
    fn a_cause_the_message_before_already_says_is_skipped() {
        // An error that prints its inner one, and whose inner one is also its source.
        let twice = e("cannot read /proc: denied", Some(e("denied", None)));
        assert_eq!(chain(&twice), "cannot read /proc: denied");
        // Skipped in the middle: the next cause is still compared with the one skipped.
        let middle = e(
            "pod a/b: cannot read /proc",
            Some(e("cannot read /proc", Some(e("denied", None)))),
        );
        assert_eq!(chain(&middle), "pod a/b: cannot read /proc: denied");
        // An empty message adds nothing.
        assert_eq!(chain(&e("pod a/b", Some(e("", None)))), "pod a/b");
    }
}
