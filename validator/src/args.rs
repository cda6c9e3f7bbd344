//! The command lines: Istio's flags (shared with redirect-init, from redirect-core) plus each
//! mode's own, and the capture config they describe for a pod whose facts we are given.

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::Path;

use clap::{Arg, ArgAction, ArgMatches, Command};
use redirect_core::config::CaptureConfig;
use redirect_core::derived::{self, HostAddress};
use redirect_core::istio_cli::flags::{self, Parsed, Resolved, Source};
use redirect_core::istio_cli::settings::Settings;

/// What a mode's command line asked for.
pub enum Parse {
    Run(Box<Resolved>),
    /// `--help` / `--version` text: print, exit 0.
    Info(String),
    /// A usage error: print, exit 1.
    Error(String),
}

/// Parse Istio's flags plus `extra` arguments.
pub fn parse(
    name: &'static str,
    about: &'static str,
    extra: Vec<Arg>,
    args: Vec<OsString>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Parse {
    let cmd = extra
        .into_iter()
        .fold(flags::istio_command(name, about), Command::arg);
    match flags::parse_command(cmd, args, env) {
        Ok(Parsed::Run(r)) => Parse::Run(Box::new(r)),
        Ok(Parsed::Info(text)) => Parse::Info(text),
        Err(msg) => Parse::Error(msg),
    }
}

/// `--NAME`, a switch.
pub fn switch(name: &'static str, help: &'static str) -> Arg {
    Arg::new(name)
        .long(name)
        .help(help)
        .action(ArgAction::SetTrue)
}

/// `--NAME VALUE`.
pub fn value(name: &'static str, value_name: &'static str, help: &'static str) -> Arg {
    Arg::new(name)
        .long(name)
        .value_name(value_name)
        .help(help)
        .action(ArgAction::Set)
}

pub fn get<'a>(m: &'a ArgMatches, name: &str) -> Option<&'a String> {
    m.get_one::<String>(name)
}

/// Whether any of Istio's settings came from the command line or the environment, i.e. the
/// caller described a configuration.
pub fn config_given(r: &Resolved) -> bool {
    r.values.values().any(|v| v.source != Source::Default)
}

/// A comma-separated list of IP addresses (`--pod-ip`, `--nameservers`).
pub fn ip_list(flag: &str, value: &str) -> Result<Vec<IpAddr>, String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<IpAddr>().map_err(|_| {
                format!("--{flag} {value:?}: {s:?} is not an IP address; expected e.g. 10.244.1.7,fd00::7")
            })
        })
        .collect()
}

/// The capture config Istio's flags describe for a pod with address `host` and these DNS
/// servers, plus the warnings on the way (as redirect-init derives it in the pod).
pub fn config_for(
    r: &Resolved,
    host: &HostAddress,
    nameservers: &[IpAddr],
) -> Result<(Settings, CaptureConfig, Vec<String>), String> {
    let mut s = Settings::from_resolved(r).map_err(|e| e.to_string())?;
    let uid = s
        .proxy_uid_from_user
        .then(|| derived::uid_of_user(&s.envoy_user))
        .flatten();
    let warnings = s
        .finish(host, uid, nameservers)
        .map_err(|e| e.to_string())?;
    let cfg = s.config.clone();
    Ok((s, cfg, warnings))
}

/// The servers of a resolv.conf, or an error naming the file.
pub fn nameservers_of(path: &Path) -> Result<Vec<IpAddr>, String> {
    derived::read_resolv_conf(path)
        .map(|n| n.servers)
        .map_err(|e| e.to_string())
}

/// The settings redirect-init would use for DNS: the servers when they matter.
pub fn wants_nameservers(r: &Resolved) -> bool {
    Settings::from_resolved(r).is_ok_and(|s| s.wants_nameservers())
}
