#!/usr/bin/env bash
# The kernel matrix: every VM of scripts/kernel-vm.sh, run in parallel, each failure fatal.
#
#   scripts/kernel-vms.sh [--only NAME]...   (root; after scripts/build-static.sh --aarch64)
#
#   amd64-bullseye  Debian 11's Linux 5.10 (the kernel floor), the guest checks and the kernel tests
#   amd64-bookworm  Debian 12's Linux 6.1, the same
#   amd64-trixie    Debian 13's Linux 6.12, the same
#   amd64-bullseye-no-nft_tproxy  Linux 5.10 without nft_tproxy: the floor checks (what needs it
#                   fails before changing anything, naming it; REDIRECT still works)
#   arm64-bookworm  Debian 12's arm64 Linux 6.1, our aarch64 binaries (the guest checks)
#
# The kernel tests are the workspace's test executables that program the kernel (the list below,
# built here with `cargo test --workspace --all-targets --no-run`), run whole in each amd64 guest
# with --include-ignored (their #[kernel_test]s; one left ignored fails): ambient's in-pod rules
# (15001, 15006, 15053, ztunnel's mark, the reply routing) and the host probe SNAT with real
# connections among them. Each VM's log is target/vm/NAME.log; a summary line per VM at the end.
# Sets REDIRECT_REQUIRE_VMS=1: a VM that cannot run fails, never skips.
set -euo pipefail
cd "$(dirname "$0")/.."
export REDIRECT_REQUIRE_VMS=1
all=(amd64-bullseye amd64-bookworm amd64-trixie amd64-bullseye-no-nft_tproxy arm64-bookworm)
only=()
while (($#)); do
  case "$1" in
    --only) only+=("$2"); shift 2 ;;
    *) echo "usage: $0 [--only NAME]... (NAME: ${all[*]})" >&2; exit 2 ;;
  esac
done
((${#only[@]})) || only=("${all[@]}")
out="${CARGO_TARGET_DIR:-target}/vm"
mkdir -p "$out"

# What the VMs need on this machine, installed once (the VMs run in parallel: one apt at a time).
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v qemu-system-aarch64 >/dev/null || need+=(qemu-system-arm)
command -v cpio >/dev/null || need+=(cpio)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
if ((${#need[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } >"$out/apt-install.log" 2>&1 \
    || { cat "$out/apt-install.log" >&2; echo "FAIL kernel-vms: could not install ${need[*]}" >&2; exit 1; }
fi

# The kernel tests, built for this machine: NAME PATH per line.
kernel_tests=(
  ambient branch_eni listeners nft_backend nft_consistency nft_faults nft_features nft_update routes_netns # redirect-kernel's
  ambient_namespace host_probe namespace_routes namespace_traffic         # redirect-core's
)
list="$out/kernel-tests.list"
t0=$EPOCHREALTIME
# The workspace's whole test build (what `cargo test --workspace --all-targets` runs next, so
# nothing is built twice), the executables of redirect-core's and redirect-kernel's picked.
cargo test --workspace --all-targets --no-run --quiet --message-format=json 2>"$out/kernel-tests.build.log" \
  | python3 -c '
import json, sys
want = set(sys.argv[1:])
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or m["target"]["kind"] != ["test"]:
        continue
    ours = m["manifest_path"].endswith(("/redirect-core/Cargo.toml", "/redirect-core/kernel/Cargo.toml"))
    if ours and m["target"]["name"] in want:
        print(m["target"]["name"], m["executable"])
' "${kernel_tests[@]}" >"$list" || { cat "$out/kernel-tests.build.log" >&2; echo "FAIL kernel-vms: the kernel tests did not build" >&2; exit 1; }
[ "$(wc -l <"$list")" = "${#kernel_tests[@]}" ] \
  || { cat "$list" >&2; echo "FAIL kernel-vms: found $(wc -l <"$list") of the ${#kernel_tests[@]} kernel test executables" >&2; exit 1; }
echo "kernel-vms: $(wc -l <"$list") kernel test executables ($(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }') s to build)"

run_vm() { # NAME
  case "$1" in
    amd64-bullseye-no-nft_tproxy) bash scripts/kernel-vm.sh --arch amd64 --suite bullseye --leave-out nft_tproxy --name "$1" ;;
    amd64-bullseye) # namespace_routes makes an apply fail with a table of `flags owner`, Linux
      # 5.12: on 5.10 the same take-back is the floor VM's init_tproxy_failure_changes_nothing.
      grep -v '^namespace_routes ' "$list" >"$list.5.10"
      bash scripts/kernel-vm.sh --arch amd64 --suite bullseye --kernel-tests "$list.5.10" --name "$1" --timeout 600 ;;
    amd64-*) bash scripts/kernel-vm.sh --arch amd64 --suite "${1#amd64-}" --kernel-tests "$list" --name "$1" --timeout 600 ;;
    arm64-*) bash scripts/kernel-vm.sh --arch arm64 --suite "${1#arm64-}" --name "$1" ;;
    *) echo "FAIL kernel-vms: no VM named $1 (${all[*]})" >&2; return 2 ;;
  esac
}
t0=$EPOCHREALTIME
declare -A pid=()
for n in "${only[@]}"; do
  run_vm "$n" >"$out/$n.log" 2>&1 &
  pid[$n]=$!
done
failed=()
for n in "${only[@]}"; do
  if wait "${pid[$n]}"; then :; else failed+=("$n"); fi
done
for n in "${only[@]}"; do
  grep -E '^(\[.*\] )?(VM-TEST fail|VM-LOG)|^FAIL' "$out/$n.log" || true
done
for n in "${only[@]}"; do
  grep -E "^vm $n: Linux" "$out/$n.log" || echo "vm $n: no result (see $out/$n.log)"
done
echo "kernel-vms: ${#only[@]} VMs in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }') s"
if ((${#failed[@]})); then
  echo "FAIL kernel-vms: ${failed[*]} (logs in $out/)" >&2
  exit 1
fi
echo "kernel-vms: ok"
