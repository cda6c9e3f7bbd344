//! Writes the inputs of the scripts in `benches/` into a directory: Istio's rules for the
//! measured configurations (iptables-restore input, `nft -f` scripts), our own rules as an
//! `nft -f` script (also with counters, and 1,000-rule stacks with and without a counter for
//! `counters.sh`), the excluded-CIDR list as `-x` takes it, and redirect-cni ADD configs.
//!
//! Usage: `bench-data OUT_DIR ISTIO_CNI_BASIC_RESTORE [N_CIDRS]`

use std::path::{Path, PathBuf};

use redirect_benches::{cidr_list, excluded_cidrs, istio_rules, sidecar_default, with_excluded};
use redirect_model::render;
use redirect_testkit::plan;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (out, basic, n) = match args.as_slice() {
        [out, basic] => (out, basic, 10_000),
        [out, basic, n] => (
            out,
            basic,
            n.parse::<usize>()
                .unwrap_or_else(|_| fail(&format!("N_CIDRS {n:?} is not a number"))),
        ),
        _ => fail("usage: bench-data OUT_DIR ISTIO_CNI_BASIC_RESTORE [N_CIDRS]"),
    };
    let out = PathBuf::from(out);
    std::fs::create_dir_all(&out)
        .unwrap_or_else(|e| fail(&format!("cannot create {}: {e}", out.display())));
    let basic = std::fs::read_to_string(basic).unwrap_or_else(|e| {
        fail(&format!(
            "cannot read Istio's CNI basic golden {basic}: {e} (set SHARED)"
        ))
    });
    let cidrs = excluded_cidrs(n);
    let ours = |cfg| {
        let rs = plan(&cfg).unwrap_or_else(|e| fail(&format!("plan: {e}")));
        render::nft_script(&rs)
    };

    write(
        &out,
        "istio-default.restore",
        &istio_rules::iptables_v4(&basic, &[]),
    );
    write(
        &out,
        "istio-default.restore6",
        &istio_rules::iptables_v6(&basic),
    );
    write(
        &out,
        "istio-default.nft",
        &istio_rules::nft_sidecar_default(&[]),
    );
    write(&out, "ours-default.nft", &ours(sidecar_default()));
    let counted = redirect_model::CaptureConfig {
        counters: true,
        ..sidecar_default()
    };
    write(&out, "ours-counted.nft", &ours(counted));
    for (name, statement) in [("stack-plain.nft", ""), ("stack-counted.nft", " counter")] {
        write(&out, name, &stack(1000, statement));
    }
    write(
        &out,
        "istio-exclude.restore",
        &istio_rules::iptables_v4(&basic, &cidrs),
    );
    write(
        &out,
        "istio-exclude.nft",
        &istio_rules::nft_sidecar_default(&cidrs),
    );
    write(&out, "ours-exclude.nft", &ours(with_excluded(n)));
    write(&out, "exclude.list", &cidr_list(&cidrs));
    write(&out, "cni-default.json", &cni_conf(None));
    let exclude = (
        "traffic.sidecar.istio.io/excludeOutboundIPRanges",
        cidr_list(&cidrs),
    );
    write(&out, "cni-exclude.json", &cni_conf(Some(exclude)));
}

/// A table of `n` rules that every new outbound TCP connection walks, each with `statement`
/// (or none): set beside our rules, the cost of `n` counters per connection shows.
fn stack(n: usize, statement: &str) -> String {
    let mut s = String::from(
        "table inet redirect_bench_stack {\n  chain out {\n    type nat hook output priority -110;\n",
    );
    for _ in 0..n {
        s.push_str(&format!("    meta l4proto tcp{statement}\n"));
    }
    s.push_str("  }\n}\n");
    s
}

/// A chained plugin's ADD config for a sidecar pod: the annotations from the runtime (no API
/// call) and the previous plugin's result (the pod's address on v0).
fn cni_conf(extra_annotation: Option<(&str, String)>) -> String {
    let status = r#"{"initContainers":["istio-validation"],"containers":["istio-proxy"],"volumes":[],"imagePullSecrets":null}"#;
    let mut annotations = serde_json::json!({ "sidecar.istio.io/status": status });
    if let Some((k, v)) = extra_annotation {
        annotations[k] = v.into();
    }
    let conf = serde_json::json!({
        "cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "redirect-cni",
        "proxy_uid": 1337, "proxy_gid": 1337,
        "runtimeConfig": { "io.kubernetes.cri.pod-annotations": annotations },
        "prevResult": {
            "cniVersion": "1.0.0", "interfaces": [{ "name": "v0", "sandbox": "x" }],
            "ips": [{ "address": "10.99.0.2/24", "interface": 0 }], "dns": {}
        }
    });
    conf.to_string() + "\n"
}

fn write(dir: &Path, name: &str, text: &str) {
    let p = dir.join(name);
    std::fs::write(&p, text)
        .unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", p.display())));
}

fn fail(msg: &str) -> ! {
    eprintln!("bench-data: {msg}");
    std::process::exit(1)
}
