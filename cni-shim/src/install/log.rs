//! Log lines on stderr, `level<TAB>message`, one per line. Callers never pass secrets.

use std::fmt::Arguments;
use std::io::Write;

fn line(level: &str, args: Arguments<'_>) {
    // One write per line so concurrent lines do not interleave; a closed stderr is not an error.
    let text = format!("{level}\t{args}\n");
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

pub(crate) fn info_line(args: Arguments<'_>) {
    line("info", args);
}

pub(crate) fn warn_line(args: Arguments<'_>) {
    line("warn", args);
}

pub(crate) fn error_line(args: Arguments<'_>) {
    line("error", args);
}

macro_rules! info {
    ($($t:tt)*) => { $crate::install::log::info_line(format_args!($($t)*)) };
}
macro_rules! warning {
    ($($t:tt)*) => { $crate::install::log::warn_line(format_args!($($t)*)) };
}
macro_rules! error {
    ($($t:tt)*) => { $crate::install::log::error_line(format_args!($($t)*)) };
}
pub(crate) use {error, info, warning};
