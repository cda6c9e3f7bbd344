//! Generates the CRI client from the api.proto that `scripts/install-containerd2.sh` unpacks
//! (`$REDIRECT_CRI_PROTO`, else `<workspace>/.tools/containerd2/api.proto`): parsed by protox
//! in Rust (no protoc), the client written by tonic-prost-build. Without the proto the crate
//! still builds, with `cfg(cri_proto_missing)`, and its tests fail saying what to run.

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(cri_proto_missing)");
    println!("cargo::rerun-if-env-changed=REDIRECT_CRI_PROTO");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let proto = std::env::var_os("REDIRECT_CRI_PROTO")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../../.tools/containerd2/api.proto"));
    println!("cargo::rerun-if-changed={}", proto.display());
    if !proto.is_file() {
        println!("cargo::rustc-cfg=cri_proto_missing");
        println!(
            "cargo::rustc-env=CRI_PROTO_MISSING={} is missing: run `bash scripts/install-deps.sh` \
             (scripts/install-containerd2.sh .tools/containerd2 unpacks it from Debian's \
             golang-k8s-cri-api-dev), then build again",
            proto.display()
        );
        return;
    }
    let dir = proto.parent().expect("a file has a folder");
    let name = proto.file_name().expect("a file has a name");
    let fds = protox::compile([name], [dir])
        .unwrap_or_else(|e| panic!("parsing {}: {e}", proto.display()));
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating the CRI client from {}: {e}", proto.display()));
}
