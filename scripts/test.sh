#!/usr/bin/env bash
# Runs every test, after the style (cargo fmt --check, clippy with warnings denied): the static release binaries are built first (x86_64, and aarch64 smoke-tested
# under qemu-user) and the kernel matrix (scripts/kernel-vms.sh: Debian's kernels 5.10, 6.1 and
# 6.12 and arm64's 6.1 under qemu, the capture checks, the kernel tests and the floor's error)
# and the real node's images; then the pure and kernel tests (fresh
# network namespaces, real sockets; root; the empty-root test runs the static binaries; the real
# node's scenarios run kubelet and containerd with the Helm chart's DaemonSet, about 5 minutes),
# the doc tests and the docs (no warning allowed), the image (built offline with podman and the
# node agent run from it), and the demo, which fails when capture does not work end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
REDIRECT_KUBE_LATER=1 bash scripts/install-deps.sh
# Kubernetes' build from source (scripts/install-kube.sh, its packages installed above) runs
# beside the style checks and the static builds, whose long link steps leave a core idle; it is
# waited for before the kernel matrix, whose guests want both cores.
mkdir -p target
bash scripts/install-kube.sh .tools/kube >target/install-kube.log 2>&1 &
kube_build=$!
kube_built() {
  if ! wait "$kube_build"; then
    cat target/install-kube.log >&2
    echo "FAIL: install-kube (its log above)" >&2
    exit 1
  fi
  cat target/install-kube.log >&2
}
# One build, never rebuilt piecemeal: incremental caches would only take disk (CI's is small).
export CARGO_INCREMENTAL=0
cargo fmt --all --check # the style holds: format and lints first, before the long runs
cargo clippy --workspace --all-targets --quiet -- -D warnings
bash scripts/build-static.sh --aarch64
kube_built
# The kernel matrix under qemu, in parallel (it builds the workspace's tests first): Linux 5.10,
# 6.1 and 6.12 (amd64: the guest checks and the kernel tests), 5.10 without nft_tproxy (the
# floor's error), and arm64's 6.1 with the aarch64 binaries; every VM must run and pass.
bash scripts/kernel-vms.sh
bash scripts/build-node-images.sh target/node-images # deploy/tests/real_node.rs
bash scripts/test-all.sh # every test; as root, the kernel tests too, and none may be ignored
cargo test --workspace --doc
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet # the library's docs build without a warning
# ...and alone, as a user's `cargo doc -p redirect-core` (or docs.rs) builds them: without the
# features that only the workspace's programs turn on.
RUSTDOCFLAGS="-D warnings" cargo doc -p redirect-core --no-deps --quiet
bash scripts/build-image.sh --rm-image
bash scripts/demo.sh
