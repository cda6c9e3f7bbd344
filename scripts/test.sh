#!/usr/bin/env bash
# Runs every test, after the style (cargo fmt --check, clippy with warnings denied): the static release binaries are built first (x86_64, and aarch64 smoke-tested
# under qemu-user, then run in an arm64 kernel under qemu-system-aarch64: the capture checks and
# inspect compared with x86_64's) and the real node's images from them; then the pure and kernel tests (fresh
# network namespaces, real sockets; root; the empty-root test runs the static binaries; the real
# node's scenarios run kubelet and containerd with the Helm chart's DaemonSet, about 5 minutes),
# the doc tests and the docs (no warning allowed), the image (built offline with podman and the
# node agent run from it), and the demo, which fails when capture does not work end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo fmt --all --check # the style holds: format and lints first, before the long runs
cargo clippy --workspace --all-targets --quiet -- -D warnings
bash scripts/build-static.sh --aarch64
bash scripts/arm64-vm.sh # the arm64 binaries in Debian's arm64 kernel under qemu-system-aarch64, ~10 s
bash scripts/build-node-images.sh target/node-images # deploy/tests/real_node.rs
cargo test --workspace --all-targets
cargo test --workspace --doc
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet # the library's docs build without a warning
bash scripts/build-image.sh --rm-image
bash scripts/demo.sh
