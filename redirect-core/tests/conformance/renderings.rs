//! The renderings load with the real tools: `nft -f` for the script, `iptables-restore` and
//! `ip6tables-restore` for the restore inputs, each into a fresh namespace.

use std::io::Write;
use std::process::{Command, Stdio};

use redirect_core::render::{iptables_restore_all, nft_script};
use redirect_core::Family;
use redirect_core::{CaptureConfig, DnsCapture, InterceptionMode, Selection};
use redirect_kernel::nft;
use redirect_testkit::plan;
use redirect_testkit::{kernel_test, TestNetns};

fn configs() -> Vec<(&'static str, CaptureConfig)> {
    vec![
        ("istio default", CaptureConfig::istio_sidecar_default()),
        (
            "tproxy dns ipv6 lists",
            CaptureConfig {
                ipv6: true,
                mode: InterceptionMode::Tproxy,
                dns: DnsCapture::Servers {
                    v4: vec!["10.96.0.10".parse().unwrap()],
                    v6: vec!["fd00::10".parse().unwrap()],
                },
                drop_invalid: true,
                inbound_ports: Selection::List(vec![8080, 9090]),
                outbound_include_cidrs: Selection::List(vec![
                    "10.0.0.0/8".parse().unwrap(),
                    "172.16.0.0/12".parse().unwrap(),
                    "fd00::/8".parse().unwrap(),
                ]),
                outbound_exclude_cidrs: vec![
                    "10.96.0.0/12".parse().unwrap(),
                    "fd00:1::/32".parse().unwrap(),
                    "fd00:2::/32".parse().unwrap(),
                ],
                outbound_exclude_ports: vec![15020, 9000],
                outbound_include_ports: vec![3306, 5432],
                exclude_interfaces: vec!["eth9".into()],
                reroute_interfaces: vec!["tap0".into()],
                proxy_uids: vec![1337, 1000620000],
                proxy_gids: vec![1337, 1000620000],
                ..CaptureConfig::istio_sidecar_default()
            },
        ),
        (
            // Long lists in both long forms: inbound, a run and ports that merge with nothing
            // (under two ports per run: hashed); outbound, runs of three (an interval set).
            "long port lists",
            CaptureConfig {
                inbound_exclude_ports: (1..=300).chain((1000..1600).step_by(2)).collect(),
                outbound_exclude_ports: (0..300u16).map(|i| 2000 + 4 * (i / 3) + i % 3).collect(),
                ..CaptureConfig::istio_sidecar_default()
            },
        ),
        (
            "capture all dns",
            CaptureConfig {
                dns: DnsCapture::All,
                ipv6: true,
                ..CaptureConfig::default()
            },
        ),
    ]
}

fn pipe(ns: &TestNetns, cmd: &str, input: &str) -> Result<(), String> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns.name(), "sh", "-c", cmd])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{cmd}: {e}"))?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd}: {}\n--- input ---\n{input}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// nft keeps adjacent ranges apart (an end and a start on one key); we merge them. Both
/// describe the same addresses: drop such end/start pairs before comparing.
fn canonical(elements: &[String]) -> Vec<String> {
    elements
        .iter()
        .filter(|e| match e.strip_prefix('-') {
            Some(k) => !elements.contains(&k.to_string()),
            None => !elements.contains(&format!("-{e}")),
        })
        .cloned()
        .collect()
}

#[kernel_test]
fn nft_script_loads_with_nft_and_holds_the_same_rules() {
    for (name, cfg) in configs() {
        let rs = plan(&cfg).unwrap();
        let ns = TestNetns::new();
        let script = nft_script(&rs);
        pipe(&ns, "nft -f -", &script).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Loading twice replaces (the script deletes the table first).
        pipe(&ns, "nft -f -", &script).unwrap_or_else(|e| panic!("{name}: {e}"));
        let state = redirect_kernel::testing::nft_in(ns.path())
            .read()
            .unwrap()
            .expect("table exists");
        let expected = nft::expected(&rs);
        // Same chains, sets and rule counts as the netlink backend writes.
        let shape = |t: &nft::TableState| {
            (
                t.chains
                    .iter()
                    .map(|c| (c.name.clone(), c.base.clone(), c.rules.len()))
                    .collect::<Vec<_>>(),
                t.sets
                    .iter()
                    .map(|s| {
                        let keys: Vec<String> = s.elements.iter().map(nft::text::key).collect();
                        (s.name.clone(), canonical(&keys))
                    })
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(shape(&state), shape(&expected), "{name}");
    }
}

#[kernel_test]
fn iptables_restore_input_loads_with_both_variants() {
    for (name, cfg) in configs() {
        let rs = plan(&cfg).unwrap();
        let (v4, v6) = iptables_restore_all(&rs);
        assert_eq!(v6.is_some(), rs.families().contains(&Family::V6));
        for variant in ["nft", "legacy"] {
            let ns = TestNetns::new();
            pipe(&ns, &format!("iptables-{variant}-restore --noflush"), &v4)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            if let Some(v6) = &v6 {
                pipe(&ns, &format!("ip6tables-{variant}-restore --noflush"), v6)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            }
            // Every rendered rule is in the kernel.
            let saved = ns.sh(&format!("iptables-{variant}-save"));
            let want = v4.lines().filter(|l| l.starts_with("-A ")).count();
            let got = saved.lines().filter(|l| l.starts_with("-A ")).count();
            assert_eq!(got, want, "{name} {variant}");
        }
    }
}
