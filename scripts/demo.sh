#!/usr/bin/env bash
# The demo: a pod's network set up by the CNI reference client with redirect-cni chained after
# bridge + host-local, for a pod with Istio's default sidecar annotations; the table it wrote,
# Istio's validation probe, real connections next to `explain`, CHECK and DEL. Throwaway
# network namespaces, removed at the end. Exits 1 when capture does not work. As root.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo build -q -p cni-plugin -p validator --bins --example demo
target=${CARGO_TARGET_DIR:-target}
REDIRECT_BIN_DIR="$target/debug" CNITOOL=.tools/cnitool "$target/debug/examples/demo"
