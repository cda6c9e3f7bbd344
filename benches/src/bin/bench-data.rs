//! Writes the inputs of `benches/compare.sh` into a directory: Istio's rules for the measured
//! configurations (iptables-restore input, `nft -f` scripts), our own rules as an `nft -f`
//! script, and the excluded-CIDR list as `-x` takes it.
//!
//! Usage: bench-data OUT_DIR ISTIO_CNI_BASIC_RESTORE [N_CIDRS]

use std::path::{Path, PathBuf};

use redirect_benches::{cidr_list, excluded_cidrs, istio_rules, sidecar_default, with_excluded};
use redirect_core::{plan, render};

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
