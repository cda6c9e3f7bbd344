#!/usr/bin/env bash
# Every test of the workspace, all targets (`cargo test --workspace --all-targets`), with the
# kernel tests: those marked `#[kernel_test]` (redirect_testkit), which need root and network
# namespaces and which libtest reports ignored, with their reason, unless asked for.
#
#   scripts/test-all.sh [-p PACKAGE]...   (scripts/test.sh runs it; the whole workspace without -p)
#
# As root, where `unshare -n true` works: `-- --include-ignored`, and it fails when any test is
# still reported ignored (the sum of each `test result:` line's `N ignored`), naming them. Else
# the kernel tests are reported ignored, and one line says so and why.
set -euo pipefail
cd "$(dirname "$0")/.."
which=("$@")
((${#which[@]})) || which=(--workspace)
log="${CARGO_TARGET_DIR:-target}/test-all.log"
mkdir -p "$(dirname "$log")"
why=
if [ "$(id -u)" != 0 ]; then
  why="not root (uid $(id -u))"
elif ! unshare -n true 2>/dev/null; then
  why="a network namespace cannot be created here (unshare -n failed)"
fi
if [ -n "$why" ]; then
  notice="NOTICE: the kernel tests (#[kernel_test]) are reported ignored: $why; they need root and network namespaces (run scripts/test.sh as root)"
  echo "$notice" >&2
  cargo test "${which[@]}" --all-targets
  echo "$notice" >&2
  exit
fi
cargo test "${which[@]}" --all-targets -- --include-ignored 2>&1 | tee "$log"
ignored=$(awk '/^test result:/ { for (i = 2; i <= NF; i++) if ($i == "ignored;") s += $(i - 1) } END { print s + 0 }' "$log")
if [ "$ignored" != 0 ]; then
  # Each ignored test with the test executable that reported it.
  awk '/^ *Running / { bin = $0; sub(/^ *Running /, "", bin) } /^test .* \.\.\. ignored/ { sub(/^test /, ""); print "  " bin ": " $0 }' "$log" >&2
  echo "FAIL test-all: $ignored test(s) reported ignored in a run as root with --include-ignored (above); every kernel test must run here" >&2
  exit 1
fi
echo "test-all: every test ran, the kernel tests included (none ignored)"
