//! redirect-init's command line and environment, as `init_shim::main_with` and `run::run`
//! turn them into rules, short of the kernel: flags::parse → Settings::from_resolved →
//! Settings::finish (with the facts the program reads from the system — the pod's address,
//! ENVOY_USER's UID, resolv.conf's servers — taken from the input instead) → plan → netlink
//! encoding and every --dry-run format.
//!
//! Skipped (they touch the system, not input parsing): entering --network-namespace,
//! detect_host_address (netlink), system_facts (NSS, /etc/resolv.conf), applying, validation.
#![no_main]

use std::ffi::OsString;
use std::net::IpAddr;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

use redirect_core::pod_facts::HostAddress;
use redirect_core::cli::flags::{self, Parsed, FLAGS};
use redirect_core::cli::settings::{DryRunFormat, Settings};
use redirect_core::render::{iptables_restore_all, nft_script};

#[path = "common.rs"]
mod common;

/// One argument: mostly known flags (so the fuzzer reaches the value parsers), sometimes raw.
#[derive(Arbitrary, Debug)]
enum Arg {
    Long {
        flag: u8,
        value: String,
        joined: bool,
    },
    Short {
        flag: u8,
        value: String,
    },
    Bare(u8),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
enum Var {
    /// The setting's own variable, or one of its aliases.
    Known {
        flag: u8,
        alias: u8,
        value: String,
    },
    Raw {
        name: String,
        value: String,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    args: Vec<Arg>,
    env: Vec<Var>,
    host_v6: bool,
    user_uid: Option<u32>,
    nameservers: Vec<(bool, u128)>,
}

fn pick(i: u8) -> &'static flags::Flag {
    &FLAGS[i as usize % FLAGS.len()]
}

fn argv(input: &Input) -> Vec<OsString> {
    let mut out = vec![OsString::from("redirect-init")];
    for a in &input.args {
        match a {
            Arg::Long {
                flag,
                value,
                joined,
            } => {
                let f = pick(*flag);
                if *joined {
                    out.push(format!("--{}={value}", f.key).into());
                } else {
                    out.push(format!("--{}", f.key).into());
                    out.push(value.into());
                }
            }
            Arg::Short { flag, value } => {
                let c = pick(*flag).short.unwrap_or('p');
                out.push(format!("-{c}").into());
                out.push(value.into());
            }
            Arg::Bare(flag) => out.push(format!("--{}", pick(*flag).key).into()),
            Arg::Raw(s) => out.push(s.into()),
        }
    }
    out
}

fn environment(input: &Input) -> Vec<(String, String)> {
    input
        .env
        .iter()
        .filter_map(|v| match v {
            Var::Known { flag, alias, value } => {
                let f = pick(*flag);
                let names: Vec<&str> = f
                    .env
                    .iter()
                    .copied()
                    .chain(f.aliases.iter().copied())
                    .collect();
                if names.is_empty() {
                    None
                } else {
                    Some((
                        names[*alias as usize % names.len()].to_string(),
                        value.clone(),
                    ))
                }
            }
            Var::Raw { name, value } => Some((name.clone(), value.clone())),
        })
        .collect()
}

fuzz_target!(|input: Input| {
    let args = argv(&input);
    let vars = environment(&input);
    let env = |name: &str| {
        vars.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let resolved = match flags::parse(args, &env) {
        Ok(Parsed::Run(r)) => r,
        _ => return,
    };
    let Ok(mut s) = Settings::from_resolved(&resolved) else {
        return;
    };
    let _ = s.wants_nameservers();
    let _ = s.probe_spec(input.host_v6);
    if s.cleanup_only {
        return;
    }
    let host = HostAddress {
        ip: if input.host_v6 {
            IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, 1u16])
        } else {
            IpAddr::from([10, 0, 0, 1u8])
        },
        ipv6: input.host_v6,
    };
    let nameservers: Vec<IpAddr> = input
        .nameservers
        .iter()
        .take(8)
        .map(|&(v6, n)| {
            if v6 {
                IpAddr::from(n.to_be_bytes())
            } else {
                IpAddr::from((n as u32).to_be_bytes())
            }
        })
        .collect();
    if s.finish(&host, input.user_uid, &nameservers).is_err() {
        return;
    }
    let Ok(rs) = s.config.plan(&common::fake_gid) else {
        return;
    };
    let _ = redirect_kernel::nft::testing::encode_running(&rs).bytes();
    match s.dry_run_format {
        DryRunFormat::Nft => {
            let _ = nft_script(&rs);
        }
        DryRunFormat::Iptables => {
            let _ = iptables_restore_all(&rs);
        }
        DryRunFormat::Json => {
            let doc = serde_json::json!({ "config": s.config, "ruleset": rs });
            // run.rs does the same `expect`: a config that does not serialize is a bug.
            let _ = serde_json::to_string_pretty(&doc).expect("serializable");
        }
    }
});
