#!/usr/bin/env bash
# Runs every test: pure ones and kernel ones (fresh network namespaces, real sockets; root),
# then the demo, which fails when capture does not work end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo test --workspace --all-targets
bash scripts/demo.sh
