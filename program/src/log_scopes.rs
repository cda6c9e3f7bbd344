//! Istio's log scopes and their `scope:level` lists (`--log_output_level`,
//! `LOG_OUTPUT_LEVEL`, the chart's `logging.level`): `info`, or `default:info,ambient:debug`.
//! The scopes are the parts of our programs an operator tells apart; a line belongs to the
//! scope of the module that logs it ([`scope_of`]).

use tracing::level_filters::LevelFilter;

/// The scopes, each with the module paths (prefixes of a `tracing` target) it holds; a line of
/// no listed module is `default`'s. `cni` is Istio's older name of `cni-plugin`.
pub const SCOPES: &[(&str, &[&str])] = &[
    ("default", &[]),
    ("install", &["cni_node::install"]),
    (
        "repair",
        &["cni_node::repair", "cni_node::adopt", "cni_node::hand_back"],
    ),
    ("ambient", &["cni_node::ambient", "zds"]),
    ("cni-agent", &["cni_node", "redirect_cni_node"]),
    ("cni-plugin", &["cni_plugin", "redirect_cni"]),
    ("cni", &[]),
];

/// Istio's level names, and ours (`fatal` is Istio's highest; our programs log it as `error`).
const LEVELS: &[(&str, LevelFilter)] = &[
    ("debug", LevelFilter::DEBUG),
    ("info", LevelFilter::INFO),
    ("warn", LevelFilter::WARN),
    ("warning", LevelFilter::WARN),
    ("error", LevelFilter::ERROR),
    ("fatal", LevelFilter::ERROR),
    ("none", LevelFilter::OFF),
];

/// A parsed list: the `default` level, and each other scope named with its level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScopeLevels {
    /// `default`'s level (every scope not named).
    pub default: LevelFilter,
    /// The scopes named, with their levels (`cni` stored as `cni-plugin`).
    pub named: Vec<(&'static str, LevelFilter)>,
}

impl ScopeLevels {
    /// Every scope at `level`.
    pub fn all(level: LevelFilter) -> Self {
        ScopeLevels {
            default: level,
            named: Vec::new(),
        }
    }

    /// `info`, or `default:info,ambient:debug` (a bare level is `default`'s); an unknown scope
    /// or level is an error naming it and the known ones.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut out = ScopeLevels::all(LevelFilter::INFO);
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (scope, level) = item.split_once(':').unwrap_or(("default", item));
            let level = level_of(level.trim())?;
            let scope = match scope.trim() {
                "cni" => "cni-plugin",
                name => SCOPES
                    .iter()
                    .map(|(s, _)| *s)
                    .find(|s| *s == name)
                    .ok_or_else(|| {
                        format!(
                            "unknown log scope {name:?}: ours are {}",
                            SCOPES
                                .iter()
                                .map(|(s, _)| *s)
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    })?,
            };
            out.named.retain(|(s, _)| *s != scope);
            match scope {
                "default" => out.default = level,
                _ => out.named.push((scope, level)),
            }
        }
        Ok(out)
    }

    /// The `default` level of a list given to a program that has no scopes of its own
    /// (redirect-init, redirect-validate: Istio's injector passes them the proxy's list):
    /// a bare level or `default:<level>` counts, other scopes are not ours and are passed
    /// over; an unknown level is an error naming it.
    pub fn default_of(text: &str) -> Result<LevelFilter, String> {
        let mut level = LevelFilter::INFO;
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (scope, name) = item.split_once(':').unwrap_or(("default", item));
            let parsed = level_of(name.trim())?;
            if scope.trim() == "default" {
                level = parsed;
            }
        }
        Ok(level)
    }

    /// The level of `scope`: its own, else `default`'s.
    pub fn level(&self, scope: &str) -> LevelFilter {
        self.named
            .iter()
            .find(|(s, _)| *s == scope)
            .map_or(self.default, |(_, l)| *l)
    }

    /// The most verbose level of any scope.
    pub fn most(&self) -> LevelFilter {
        self.named
            .iter()
            .map(|(_, l)| *l)
            .fold(self.default, LevelFilter::max)
    }
}

/// The scope of a line by its `tracing` target: the scope of the longest module prefix that
/// matches, else `default`.
pub fn scope_of(target: &str) -> &'static str {
    let mut best: (&'static str, usize) = ("default", 0);
    for (scope, modules) in SCOPES {
        for m in *modules {
            let matches = target == *m
                || target
                    .strip_prefix(m)
                    .is_some_and(|rest| rest.starts_with("::"));
            if matches && m.len() > best.1 {
                best = (scope, m.len());
            }
        }
    }
    best.0
}

fn level_of(name: &str) -> Result<LevelFilter, String> {
    LEVELS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, l)| *l)
        .ok_or_else(|| {
            format!("unknown log level {name:?}: expected debug, info, warn, error, fatal or none")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_without_scopes_takes_the_default_and_passes_over_the_proxys() {
        let d = ScopeLevels::default_of;
        assert_eq!(
            d("default:debug,ads:warn,misc:error"),
            Ok(LevelFilter::DEBUG)
        );
        assert_eq!(d("warn"), Ok(LevelFilter::WARN));
        assert_eq!(d("ads:debug"), Ok(LevelFilter::INFO));
        assert_eq!(d(""), Ok(LevelFilter::INFO));
        let e = d("ads:loud").unwrap_err();
        assert!(e.contains("\"loud\""), "{e}");
    }

    #[test]
    fn a_list_sets_each_scope_and_a_bare_level_the_default() {
        let l = ScopeLevels::parse("default:warn, ambient:debug,cni:error").unwrap();
        assert_eq!(l.level("ambient"), LevelFilter::DEBUG);
        assert_eq!(l.level("cni-plugin"), LevelFilter::ERROR);
        assert_eq!(l.level("install"), LevelFilter::WARN);
        assert_eq!(l.most(), LevelFilter::DEBUG);
        assert_eq!(
            ScopeLevels::parse("debug").unwrap(),
            ScopeLevels::all(LevelFilter::DEBUG)
        );
        assert_eq!(
            ScopeLevels::parse("").unwrap(),
            ScopeLevels::all(LevelFilter::INFO)
        );
        let err = ScopeLevels::parse("default:info,xds:debug").unwrap_err();
        assert!(err.contains("\"xds\"") && err.contains("ambient"), "{err}");
        let err = ScopeLevels::parse("ambient:loud").unwrap_err();
        assert!(err.contains("\"loud\""), "{err}");
    }

    #[test]
    fn a_line_belongs_to_the_scope_of_its_module() {
        assert_eq!(scope_of("cni_node::install::watch"), "install");
        assert_eq!(scope_of("cni_node::ambient::controller"), "ambient");
        assert_eq!(scope_of("zds::server"), "ambient");
        assert_eq!(scope_of("cni_node::metrics"), "cni-agent");
        assert_eq!(scope_of("cni_node::installer"), "cni-agent");
        assert_eq!(scope_of("cni_plugin::plugin"), "cni-plugin");
        assert_eq!(scope_of("kube_client::client"), "default");
    }
}
