//! The command lines: Istio's flags (shared with redirect-init, from redirect-istio) plus each
//! mode's own, and the capture config they describe for a pod whose facts we are given.

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::Path;

use clap::{Arg, ArgAction, ArgMatches, Command};
use redirect_core::cli::flags::{self, Parsed, Resolved, Source};
use redirect_core::cli::settings::Settings;
use redirect_core::pod_facts::{self, HostAddress};

use crate::{Error, EXIT_ERROR, EXIT_OK};

/// Parse Istio's flags plus `extra` arguments. `Err` is the exit code once `--help` or
/// `--version` was printed (0) or a usage error was (1).
pub fn parse(
    name: &'static str,
    about: &'static str,
    extra: Vec<Arg>,
    args: Vec<OsString>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Box<Resolved>, i32> {
    let cmd = extra
        .into_iter()
        .fold(flags::istio_command(name, about), Command::arg);
    match flags::parse_command(cmd, args, env) {
        Ok(Parsed::Run(r)) => Ok(Box::new(r)),
        Ok(Parsed::Info(text)) => {
            print!("{text}");
            Err(EXIT_OK)
        }
        Err(msg) => {
            eprintln!("{msg}");
            Err(EXIT_ERROR)
        }
    }
}

/// Istio's settings, typed; the error names the flag or variable.
pub fn settings(r: &Resolved) -> Result<Settings, Error> {
    Ok(Settings::from_resolved(r)?)
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
pub fn ip_list(flag: &'static str, value: &str) -> Result<Vec<IpAddr>, Error> {
    redirect_core::cli::split_list(value)
        .map(|s| {
            s.parse::<IpAddr>().map_err(|_| Error::IpList {
                flag,
                value: value.to_string(),
                item: s.to_string(),
            })
        })
        .collect()
}

/// Finish `s` for a pod with address `host` and these DNS servers, as redirect-init derives
/// it in the pod; returns the warnings on the way. The config is `s.config`.
pub fn finish(
    s: &mut Settings,
    host: &HostAddress,
    nameservers: &[IpAddr],
) -> Result<Vec<String>, Error> {
    let uid = s.envoy_user_uid();
    Ok(s.finish(host, uid, nameservers)?)
}

/// The servers of a resolv.conf, or an error naming the file.
pub fn nameservers_of(path: &Path) -> Result<Vec<IpAddr>, Error> {
    Ok(pod_facts::read_resolv_conf(path)?.servers)
}
