#!/usr/bin/env bash
# Runs every test: pure ones and kernel ones (fresh network namespaces, real sockets; root).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo test --workspace --all-targets
