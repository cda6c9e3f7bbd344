#!/usr/bin/env bash
# The demo: Istio's default sidecar capture programmed over netlink into a throwaway network
# namespace, read back, checked with real connections, and removed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo run -q -p redirect-core --example demo
