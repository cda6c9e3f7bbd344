//! A flag-table engine: Go-style flags with environment-variable fallbacks, the way Istio's
//! programs read them, described by a table of [`Flag`]s. It builds the clap [`Command`] and
//! resolves every setting with its source (a flag given on the command line, else the first
//! non-empty alias variable, else the flag's own variable, else the default). redirect-init's
//! istio-iptables flags (`flags`) and the installer's install-cni flags (in cni-shim) are two
//! tables over this one engine, so the two command lines cannot drift apart in how they parse.
//! Values stay strings here; each table's owner types them.

use std::collections::BTreeMap;
use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command};

/// A flag (or, with `long: false`, an environment-only setting).
#[derive(Debug, PartialEq, Eq)]
pub struct Flag {
    /// Long name without dashes; also the key of the resolved value.
    pub key: &'static str,
    /// Whether it exists on the command line.
    pub long: bool,
    /// Its one-letter name (`-p`), if it has one.
    pub short: Option<char>,
    /// The name used in messages when the value came from the command line or the default.
    pub label: &'static str,
    /// The flag's own variable, if it has one.
    pub env: Option<&'static str>,
    /// Variables that win over `env` (Istio's "additional env").
    pub aliases: &'static [&'static str],
    /// Other long names the flag also answers to, hidden from the help.
    pub flag_aliases: &'static [&'static str],
    /// The value when neither the command line nor a variable gives one.
    pub default: &'static str,
    /// Go's bool syntax: `--flag`, `--flag=true`, `--flag=false` (never `--flag false`).
    pub boolean: bool,
    /// The help line (the variables and the default are added when help is shown).
    pub help: &'static str,
}

impl Flag {
    /// `--key VALUE` with no variable, named `key` in messages; tables adjust the rest with
    /// struct update syntax.
    pub const fn new(key: &'static str, default: &'static str, help: &'static str) -> Flag {
        Flag {
            key,
            long: true,
            short: None,
            label: key,
            env: None,
            aliases: &[],
            flag_aliases: &[],
            default,
            boolean: false,
            help,
        }
    }

    /// The same flag, also read from variable `env` (`None`: a flag only).
    pub const fn with_env(self, env: Option<&'static str>) -> Flag {
        Flag { env, ..self }
    }

    /// The same flag as a Go bool: `--flag`, `--flag=true`, `--flag=false`.
    pub const fn go_bool(self) -> Flag {
        Flag {
            boolean: true,
            ..self
        }
    }
}

/// A program's flags and how its command line shows and checks them.
#[derive(Clone, Copy, Debug)]
pub struct Table {
    /// The flags, in help order.
    pub flags: &'static [Flag],
    /// Append `[default: "…"]` to each help line (istio-iptables' help shows none).
    pub show_defaults: bool,
    /// Flags accepted and ignored, hidden from the help; each takes an optional value.
    pub ignored: &'static [&'static str],
    /// Refuse an argument that is not UTF-8 naming its flag, before clap (whose own message
    /// names neither the flag nor the value).
    pub name_non_utf8: bool,
}

/// Where a resolved value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The command line.
    Flag,
    /// This variable (the flag's own or an alias).
    Env(&'static str),
    /// The flag's default.
    Default,
}

/// One resolved setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    /// The raw value, untrimmed (the table's owner types it).
    pub value: String,
    /// Where it came from.
    pub source: Source,
    /// The table row it resolves.
    pub flag: &'static Flag,
}

impl Value {
    /// How to name this setting in a message: the flag or the variable it came from.
    pub fn field(&self) -> &'static str {
        match self.source {
            Source::Env(name) => name,
            _ => self.flag.label,
        }
    }
}

/// Every setting, resolved, by key.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// Each flag's value, by its key.
    pub values: BTreeMap<&'static str, Value>,
    /// The whole parse, for the arguments a program adds of its own.
    pub matches: ArgMatches,
}

impl Resolved {
    /// The setting `flag` (one of the constants a [`flags!`](crate::flags) table declares, so
    /// a misspelled name does not compile).
    pub fn get(&self, flag: &Flag) -> &Value {
        self.values.get(flag.key).unwrap_or_else(|| {
            panic!(
                "setting {} is not in the table this command line was parsed with",
                flag.key
            )
        })
    }
}

/// Declares a table of [`Flag`]s and a constant for each row, named after it: code reads a
/// setting by its constant (`resolved.get(&PROXY_UID)`), so a misspelled setting is a compile
/// error and every constant is a row of the table.
/// Attributes before a row (its `///` doc) go on its constant.
#[macro_export]
macro_rules! flags {
    ($(#[$meta:meta])* $vis:vis static $table:ident = [ $( $(#[$row:meta])* $name:ident = $flag:expr ),* $(,)? ];) => {
        $( $(#[$row])* $vis const $name: $crate::cli::flag_table::Flag = $flag; )*
        $(#[$meta])*
        $vis static $table: &[$crate::cli::flag_table::Flag] = &[ $( $name ),* ];
    };
}

/// What the command line asked for.
#[derive(Debug)]
pub enum Parsed {
    /// Run with these settings.
    Run(Resolved),
    /// `--help` or `--version`: print this and exit 0.
    Info(String),
}

impl Table {
    /// Every environment variable the flags read (their own and their aliases).
    pub fn env_names(self) -> impl Iterator<Item = &'static str> {
        self.flags
            .iter()
            .flat_map(|f| f.env.into_iter().chain(f.aliases.iter().copied()))
    }

    /// A command named `name` that takes every flag of the table; a program may add arguments
    /// of its own before [`Table::parse`].
    pub fn command(self, name: &'static str, about: &'static str) -> Command {
        let mut cmd = Command::new(name)
            .about(about)
            .version(env!("CARGO_PKG_VERSION"))
            .args_override_self(true)
            .disable_help_subcommand(true);
        for f in self.flags.iter().filter(|f| f.long) {
            // The help line's variables and default are added only when help is asked for
            // (`parse`): formatting them for every flag of every run cost more than the parse.
            let mut arg = Arg::new(f.key)
                .long(f.key)
                .aliases(f.flag_aliases.iter().copied())
                .help(f.help)
                .action(ArgAction::Set);
            if let Some(s) = f.short {
                arg = arg.short(s);
            }
            arg = if f.boolean {
                // Go's bool flags: `--flag`, `--flag=true`, `--flag=false`.
                arg.num_args(0..=1)
                    .require_equals(true)
                    .default_missing_value("true")
                    .value_name("BOOL")
            } else {
                arg.num_args(1).value_name("VALUE")
            };
            cmd = cmd.arg(arg);
        }
        for name in self.ignored {
            cmd = cmd.arg(
                Arg::new(*name)
                    .long(*name)
                    .num_args(0..=1)
                    .require_equals(false)
                    .default_missing_value("true")
                    .hide(true)
                    .action(ArgAction::Set),
            );
        }
        cmd
    }

    /// A flag's help line: its text, then its variables, then (if shown) its default.
    fn help(self, f: &Flag) -> String {
        let mut help = f.help.to_string();
        if let Some(e) = f.env {
            let aliases: String = f.aliases.iter().map(|a| format!(", {a}")).collect();
            help.push_str(&format!(" [env: {e}{aliases}]"));
        }
        if self.show_defaults {
            help.push_str(&format!(" [default: {:?}]", f.default));
        }
        help
    }

    /// Resolve every setting of the table with `cmd` (built by [`Table::command`]). `Err` is the
    /// message to print (clap's, trimmed), for a usage error.
    pub fn parse(
        self,
        cmd: Command,
        args: impl IntoIterator<Item = OsString>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Parsed, String> {
        let args: Vec<OsString> = args.into_iter().collect();
        if self.name_non_utf8 {
            non_utf8_argument(&args)?;
        }
        let wants_help = args.iter().skip(1).any(|a| a == "-h" || a == "--help");
        let cmd = if wants_help {
            let flags = self.flags;
            cmd.mut_args(
                |a| match flags.iter().find(|f| f.long && f.key == a.get_id()) {
                    Some(f) => a.help(self.help(f)),
                    None => a,
                },
            )
        } else {
            cmd
        };
        let matches = match cmd.try_get_matches_from(args) {
            Ok(m) => m,
            Err(e) => {
                return match e.kind() {
                    clap::error::ErrorKind::DisplayHelp
                    | clap::error::ErrorKind::DisplayVersion => Ok(Parsed::Info(e.to_string())),
                    _ => Err(e.to_string().trim_end().to_string()),
                }
            }
        };
        let values = self
            .flags
            .iter()
            .map(|f| (f.key, resolve(f, &matches, env)))
            .collect();
        Ok(Parsed::Run(Resolved { values, matches }))
    }
}

/// One setting: the command line, else the first non-empty alias or own variable, else the
/// default.
fn resolve(f: &'static Flag, matches: &ArgMatches, env: &dyn Fn(&str) -> Option<String>) -> Value {
    let from_flag = f
        .long
        .then(|| {
            (matches.value_source(f.key) == Some(ValueSource::CommandLine))
                .then(|| matches.get_one::<String>(f.key).cloned())
                .flatten()
        })
        .flatten();
    // Unset and empty variables both mean "not given", as Go's os.Getenv sees them.
    let from_env = || {
        f.aliases
            .iter()
            .chain(f.env.as_slice())
            .find_map(|name| env(name).filter(|v| !v.is_empty()).map(|v| (*name, v)))
    };
    let (value, source) = match (from_flag, from_env()) {
        (Some(value), _) => (value, Source::Flag),
        (None, Some((name, value))) => (value, Source::Env(name)),
        (None, None) => (f.default.to_string(), Source::Default),
    };
    Value {
        value,
        source,
        flag: f,
    }
}

/// A command-line argument that is not UTF-8, named with its flag.
fn non_utf8_argument(args: &[OsString]) -> Result<(), String> {
    for (i, a) in args.iter().enumerate().skip(1) {
        if a.to_str().is_some() {
            continue;
        }
        let text = a.to_string_lossy();
        let flag = match text.split_once('=') {
            Some((flag, _)) if flag.starts_with('-') => flag.to_string(),
            _ => args[i - 1].to_string_lossy().into_owned(),
        };
        return Err(format!(
            "error: the value of {flag} is not valid UTF-8 ({text:?}); pass it as UTF-8"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::flags! {
        static FLAGS = [
            PORT = Flag {
                short: Some('p'),
                label: "--port (-p)",
                env: Some("PORT"),
                aliases: &["OLD_PORT"],
                ..Flag::new("port", "80", "The port")
            },
            ON = Flag {
                env: Some("ON"),
                flag_aliases: &["on-too"],
                boolean: true,
                ..Flag::new("on", "false", "A switch")
            },
            ONLY_ENV = Flag {
                long: false,
                env: Some("ONLY_ENV"),
                ..Flag::new("ONLY_ENV", "x", "Not a flag")
            },
        ];
    }

    fn table(show_defaults: bool) -> Table {
        Table {
            flags: FLAGS,
            show_defaults,
            ignored: &["ignored"],
            name_non_utf8: true,
        }
    }

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Resolved, String> {
        let t = table(false);
        let argv = std::iter::once("prog")
            .chain(args.iter().copied())
            .map(Into::into);
        let lookup = |k: &str| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        match t.parse(t.command("prog", "about"), argv, &lookup)? {
            Parsed::Run(r) => Ok(r),
            Parsed::Info(text) => Err(text),
        }
    }

    #[test]
    fn help_names_the_variables_and_shows_defaults_only_when_asked() {
        // As a user sees it: `--help` through `parse` (the command alone leaves the variables
        // and defaults out until help is asked for).
        let help = |show| {
            let t = table(show);
            match t.parse(
                t.command("prog", "about"),
                ["prog".into(), "--help".into()],
                &|_| None,
            ) {
                Ok(Parsed::Info(text)) => text,
                other => panic!("{other:?}"),
            }
        };
        assert!(help(false).contains("The port [env: PORT, OLD_PORT]\n"));
        assert!(help(true).contains("The port [env: PORT, OLD_PORT] [default: \"80\"]\n"));
        assert!(help(true).contains("--on[=<BOOL>]"));
        assert!(!help(true).contains("on-too") && !help(true).contains("ignored"));
        assert!(!help(true).contains("ONLY_ENV"));
    }

    #[test]
    fn a_flag_wins_then_an_alias_then_the_variable_then_the_default() {
        let port = |args: &[&str], env: &[(&str, &str)]| {
            let r = run(args, env).unwrap();
            let v = r.get(&PORT);
            (v.value.clone(), v.source.clone(), v.field())
        };
        let both = [("PORT", "2"), ("OLD_PORT", "3")];
        assert_eq!(
            port(&["-p", "1"], &both),
            ("1".into(), Source::Flag, "--port (-p)")
        );
        assert_eq!(
            port(&[], &both),
            ("3".into(), Source::Env("OLD_PORT"), "OLD_PORT")
        );
        // An empty variable is not given, as Go's os.Getenv sees it.
        let empty_alias = [("PORT", "2"), ("OLD_PORT", "")];
        assert_eq!(
            port(&[], &empty_alias),
            ("2".into(), Source::Env("PORT"), "PORT")
        );
        assert_eq!(
            port(&[], &[]),
            ("80".into(), Source::Default, "--port (-p)")
        );
        assert_eq!(
            run(&[], &[("ONLY_ENV", "y")]).unwrap().get(&ONLY_ENV).value,
            "y"
        );
    }

    #[test]
    fn booleans_take_gos_syntax_and_flag_aliases_answer() {
        let on = |args: &[&str]| run(args, &[]).map(|r| r.get(&ON).value.clone());
        assert_eq!(on(&["--on"]).unwrap(), "true");
        assert_eq!(on(&["--on=false"]).unwrap(), "false");
        assert_eq!(on(&["--on-too=0"]).unwrap(), "0");
        let err = on(&["--on", "false"]).unwrap_err();
        assert!(
            err.starts_with("error: unexpected argument 'false' found"),
            "{err}"
        );
        assert_eq!(on(&["--ignored", "--on"]).unwrap(), "true");
    }

    #[test]
    fn a_value_that_is_not_utf8_is_named_with_its_flag() {
        use std::os::unix::ffi::OsStringExt;
        let t = table(false);
        let args = ["prog".into(), "-p".into(), OsString::from_vec(vec![0xff])];
        let err = t
            .parse(t.command("prog", "about"), args, &|_| None)
            .unwrap_err();
        assert_eq!(
            err,
            "error: the value of -p is not valid UTF-8 (\"\u{fffd}\"); pass it as UTF-8"
        );
    }
}
