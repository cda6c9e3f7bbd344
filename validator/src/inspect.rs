//! `inspect`: the rules a pod's namespace holds (our table read back over netlink, Istio's
//! leftovers, the TPROXY routing and `::6`), in readable form, and when given the expected
//! configuration (Istio's flags, or the pod's annotations) how they differ. Needs root.

use redirect_program::logging::stderr_line;
use std::ffi::OsString;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use redirect_core::error::NamespaceError;
use redirect_core::mesh::Decision;
use redirect_core::pod_facts::{self, HostAddress};
use redirect_core::probe::KernelView;
use redirect_core::view::{self, table_flags, text, Inspection, TABLE};
use redirect_core::{Mismatch, Namespace, Ruleset, TproxyRouting, ValidConfig};
use serde::Serialize;

use crate::Error;
use crate::{args, pod_file};
use crate::{EXIT_DIFFERS, EXIT_ERROR, EXIT_OK};

const ABOUT: &str = "Shows the capture rules in a pod's network namespace and, given the pod's flags or annotations, how they differ from what it should have (exit 0 equal, 2 different; needs root)";

#[derive(Serialize)]
struct Chain {
    name: String,
    base: Option<String>,
    rules: Vec<String>,
}

#[derive(Serialize)]
struct Set {
    name: String,
    elements: Vec<String>,
}

#[derive(Serialize)]
struct Report {
    netns: PathBuf,
    pod_address: Option<String>,
    table: Option<Vec<Chain>>,
    /// The table's flags as nft names them (`dormant`), when it has any.
    table_flags: Option<String>,
    sets: Vec<Set>,
    istio_nft_tables: Vec<String>,
    istio_iptables: Vec<String>,
    tproxy_routing: Vec<String>,
    lo_v6: bool,
    notes: Vec<String>,
    /// Where the expected configuration came from; `None` when none was given.
    expected_from: Option<String>,
    differences: Vec<String>,
    equal: Option<bool>,
}

pub fn main(args: Vec<OsString>, env: &dyn Fn(&str) -> Option<String>) -> i32 {
    let extra = vec![
        args::value("netns", "PATH", "The pod's network namespace: /proc/<pid>/ns/net, /var/run/netns/<name>, or CNI_NETNS").required(true),
        args::value("annotations", "FILE", "The expected configuration from the pod: `kubectl get pod -o json` output, a JSON object of annotations, or a Downward API annotations file; Istio's flags act as the plugin's defaults"),
        args::value("nameservers", "IPS", "The pod's resolv.conf servers, for --redirect-dns without --capture-all-dns (default: /proc/<pid>/root/etc/resolv.conf when --netns is /proc/<pid>/ns/net)"),
        args::switch("json", "Print one JSON object on stdout"),
    ];
    let r = match args::parse("redirect-validate inspect", ABOUT, extra, args, env) {
        Ok(r) => r,
        Err(code) => return code,
    };
    match run(&r) {
        Ok(found) => {
            if r.matches.get_flag("json") {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&found).expect("serializes")
                );
            } else {
                print!("{}", text(&found));
            }
            if found.equal == Some(false) {
                EXIT_DIFFERS
            } else {
                EXIT_OK
            }
        }
        Err(msg) => {
            stderr_line("error", &redirect_program::errors::chain(&msg));
            EXIT_ERROR
        }
    }
}

/// What the caller expects the namespace to hold: a plan, or "nothing" for a pod outside the mesh.
enum Expected {
    Rules(Box<ValidConfig>, Ruleset),
    Nothing(String),
}

fn run(r: &redirect_core::cli::flags::Resolved) -> Result<Report, Error> {
    let path = PathBuf::from(args::get(&r.matches, "netns").expect("required"));
    // Opened once: both reads below enter this descriptor, whatever the path names later.
    let ns = redirect_core::Netns::open(&path).map_err(|e| match e {
        NamespaceError::Open { path, cause } => Error::Netns {
            path,
            source: cause,
        },
        other => other.into(),
    })?;
    let mut settings = args::settings(r)?;
    let decision = pod_file::from_args(r, &settings)?;
    // The pod's address decides IPv6, as where the rules were written.
    let dual_stack = pod_file::dual_stack(decision.as_ref(), &settings);
    let host = Namespace::addresses_of(&ns)
        .ok()
        .and_then(|a| pod_facts::detect_host_address(&a, dual_stack).ok());
    let expected = match decision {
        Some(Decision::Skip(why)) => {
            Some(("the pod's annotations".to_string(), Expected::Nothing(why)))
        }
        Some(Decision::NeedSpec(why)) => {
            unreachable!("pod_file::decision returns it as an error: {why}")
        }
        Some(Decision::Capture { config, .. }) => {
            let h = host.ok_or(Error::NoNamespaceAddress)?;
            let config = config.with_ipv6(h.ipv6);
            let rs = config.plan(&redirect_core::SystemGroups)?;
            Some((
                "the pod's annotations".to_string(),
                Expected::Rules(Box::new(config), rs),
            ))
        }
        None if args::config_given(r) => {
            let h = host.ok_or(Error::NoNamespaceAddress)?;
            let servers = nameservers(r, settings.wants_nameservers(), &path)?;
            args::finish(&mut settings, &h, &servers)?;
            let rs = settings.config.plan(&redirect_core::SystemGroups)?;
            Some((
                "Istio's flags".to_string(),
                Expected::Rules(Box::new(settings.config), rs),
            ))
        }
        None => None,
    };
    let routing = match &expected {
        Some((_, Expected::Rules(cfg, _))) => view::routing_of(cfg),
        _ => redirect_core::foreign::TPROXY_ROUTING,
    };
    let want = expected.as_ref().map(|(_, e)| e);
    let kernel = read(&ns, &routing, want).map_err(Error::KernelRead)?;
    Ok(report(path, host, kernel, expected))
}

/// The pod's resolv.conf servers: `--nameservers`, else the pod's own file through /proc.
fn nameservers(
    r: &redirect_core::cli::flags::Resolved,
    wanted: bool,
    netns: &Path,
) -> Result<Vec<IpAddr>, Error> {
    if !wanted {
        return Ok(Vec::new());
    }
    if let Some(v) = args::get(&r.matches, "nameservers") {
        return args::ip_list("nameservers", v);
    }
    let pid_root = netns
        .strip_prefix("/proc")
        .ok()
        .and_then(|rest| rest.components().next())
        .map(|pid| Path::new("/proc").join(pid).join("root/etc/resolv.conf"));
    match pid_root {
        Some(file) => args::nameservers_of(&file),
        None => Err(Error::NameserversNeeded),
    }
}

/// Our table and Istio's rules (`diagnosis::read_kernel`), the TPROXY routing and `::6`, and
/// when the expected configuration is known, how the namespace differs (`capture::compare`, as
/// CNI CHECK and the repair controller ask it).
struct Kernel {
    view: KernelView,
    tproxy: Vec<String>,
    lo_v6: bool,
    differences: Vec<Mismatch>,
}

fn read(
    ns: &redirect_core::Netns,
    routing: &TproxyRouting,
    want: Option<&Expected>,
) -> redirect_core::Result<Kernel> {
    let expected = match want {
        Some(Expected::Rules(cfg, rs)) => view::Expected::Sidecar(cfg, rs),
        Some(Expected::Nothing(_)) => view::Expected::Uncaptured,
        None => view::Expected::Unknown,
    };
    // Read once: shown below, and judged against the expectation.
    let Inspection {
        kernel: view,
        routes,
        differences,
    } = Namespace::open_in(ns)?.inspect(routing, expected)?;
    let tproxy = routes
        .tproxy
        .iter()
        .filter(|(_, st)| !st.is_absent())
        .map(|(family, st)| {
            format!(
                "{family}: {} rule(s) fwmark {} lookup {}, local default route in table {}: {}",
                st.rules,
                routing.mark,
                routing.table,
                routing.table,
                if st.route { "present" } else { "missing" }
            )
        })
        .collect();
    Ok(Kernel {
        view,
        tproxy,
        lo_v6: routes.lo_v6,
        differences,
    })
}

fn report(
    netns: PathBuf,
    host: Option<HostAddress>,
    k: Kernel,
    expected: Option<(String, Expected)>,
) -> Report {
    let Kernel {
        view: k,
        tproxy,
        lo_v6,
        differences,
    } = k;
    let mut notes: Vec<String> = k.unread.iter().map(|u| format!("not read: {u}")).collect();
    let expected_from = match expected {
        None => None,
        Some((from, Expected::Nothing(why))) => {
            notes.push(format!("this pod is not captured: {why}"));
            Some(from)
        }
        Some((from, Expected::Rules(..))) => Some(from),
    };
    let differences: Vec<String> = differences.iter().map(|d| d.to_string()).collect();
    let equal = expected_from.as_ref().map(|_| differences.is_empty());
    Report {
        netns,
        pod_address: host.map(|h| {
            format!(
                "{} ({})",
                h.ip,
                if h.ipv6 {
                    "IPv6 rules expected"
                } else {
                    "IPv4 rules only"
                }
            )
        }),
        table_flags: k
            .table
            .as_ref()
            .filter(|t| t.flags != 0)
            .map(|t| table_flags(t.flags)),
        sets: k
            .table
            .as_ref()
            .map(|t| {
                t.sets
                    .iter()
                    .map(|s| Set {
                        name: s.name.clone(),
                        elements: text::set_elements(s),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        table: k.table.map(|t| {
            let mut chains = t.chains;
            // Hooked chains first: where packets enter.
            chains.sort_by_key(|c| c.base.is_none());
            chains
                .into_iter()
                .map(|c| Chain {
                    rules: c.rules.iter().map(|r| text::exprs(r)).collect(),
                    name: c.name,
                    base: c.base.map(|b| b.to_string()),
                })
                .collect()
        }),
        istio_nft_tables: k.istio_nft_tables,
        istio_iptables: k.istio_iptables,
        tproxy_routing: tproxy,
        lo_v6,
        notes,
        expected_from,
        differences,
        equal,
    }
}

fn text(f: &Report) -> String {
    let mut s = format!("network namespace {}\n", f.netns.display());
    if let Some(a) = &f.pod_address {
        s += &format!("pod address: {a}\n");
    }
    match &f.table {
        None => s += &format!("table inet {}: absent (no capture rules of ours)\n", TABLE),
        Some(chains) => {
            let rules: usize = chains.iter().map(|c| c.rules.len()).sum();
            let flags = match &f.table_flags {
                Some(fl) if fl.contains("dormant") => {
                    format!("flags {fl} (its chains are unhooked: nothing is captured), ")
                }
                Some(fl) => format!("flags {fl}, "),
                None => String::new(),
            };
            s += &format!(
                "table inet {}: {flags}{}, {}, {}\n",
                TABLE,
                counted(chains.len(), "chain"),
                counted(rules, "rule"),
                counted(f.sets.len(), "set")
            );
            for set in &f.sets {
                s += &format!("  set {} {{ {} }}\n", set.name, set.elements.join(", "));
            }
            for c in chains {
                match &c.base {
                    Some(b) => s += &format!("  chain {} ({b})\n", c.name),
                    None => s += &format!("  chain {}\n", c.name),
                }
                for (i, r) in c.rules.iter().enumerate() {
                    s += &format!("    {:>2}  {r}\n", i + 1);
                }
            }
        }
    }
    let leftovers: Vec<String> = f
        .istio_nft_tables
        .iter()
        .map(|t| format!("nft table {t}"))
        .chain(f.istio_iptables.iter().cloned())
        .collect();
    if leftovers.is_empty() {
        s += "Istio's rules: none (no ISTIO_* iptables chains, no istio nft tables)\n";
    } else {
        s += "Istio's rules (leftovers next to ours, or another capture tool's):\n";
        for l in leftovers {
            s += &format!("  {l}\n");
        }
    }
    if f.tproxy_routing.is_empty() {
        s += "TPROXY routing: none\n";
    } else {
        for t in &f.tproxy_routing {
            s += &format!("TPROXY routing {t}\n");
        }
    }
    s += &format!("::6 on lo: {}\n", if f.lo_v6 { "yes" } else { "no" });
    for n in &f.notes {
        s += &format!("note: {n}\n");
    }
    match (&f.expected_from, f.equal) {
        (Some(from), Some(true)) => s += &format!("expected ({from}): the rules match\n"),
        (Some(from), Some(false)) => {
            s += &format!("expected ({from}): {} difference(s)\n", f.differences.len());
            for d in &f.differences {
                s += &format!("  - {d}\n");
            }
        }
        _ => s +=
            "expected: not given (pass the pod's Istio flags or --annotations FILE to compare)\n",
    }
    s
}

/// "1 set", "3 sets".
fn counted(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}
