#!/usr/bin/env bash
# Whole-process time to program a pod's capture in a fresh network namespace:
#   redirect-init (release build, native netlink backend)
#   vs Istio's rules for the same config loaded with iptables-restore (nft and legacy variants).
#
# Scenario "default": Istio's real sidecar default as the CNI plugin programs it (IPv4 pod):
#   redirect-init -p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -b '*' -d 15090,15021,15020 -o 15020
#   vs iptables-restore --noflush testdata/istio/cni/basic.restore
# Scenario "dual-stack": Istio's dns-uid-gid case (DNS capture, 2 UIDs, 2 GIDs, IPv4 + IPv6):
#   redirect-init --dual-stack --redirect-dns -u 3,4 -g 1,2 (servers from resolv.conf)
#   vs iptables-restore + ip6tables-restore of testdata/istio/iptables/dns-uid-gid.restore{,6}
#
# Each run gets its own namespace (veth with a pod address, lo up); the time is taken inside the
# namespace around the command alone (bash $EPOCHREALTIME, no extra fork), so `ip netns exec`
# is not counted for either side. Prints the median and the ratio per scenario.
# Usage (root): bash benches/compare-init.sh [RUNS]   (default 30)
set -euo pipefail

RUNS=${1:-${RUNS:-30}}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${SHARED:-$ROOT/../shared}
BIN=${BIN:-$ROOT/target/release/redirect-init}
if [ ! -x "$BIN" ]; then
  (cd "$ROOT" && cargo build --release -q -p init-shim)
fi
CNI_BASIC=$SHARED/testdata/istio/cni/basic.restore
DNS4=$SHARED/testdata/istio/iptables/dns-uid-gid.restore
DNS6=$SHARED/testdata/istio/iptables/dns-uid-gid.restore6
for f in "$CNI_BASIC" "$DNS4" "$DNS6"; do
  [ -r "$f" ] || { echo "missing $f (set SHARED=path/to/shared)" >&2; exit 1; }
done

NS_PREFIX="rdbench$$"
cleanup() {
  for ns in $(ip netns list | awk '{print $1}' | grep "^$NS_PREFIX" || true); do
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
}
trap cleanup EXIT

# fresh_ns NAME: a namespace with lo up and a veth carrying 10.99.0.2/24 and fd99::2/64.
fresh_ns() {
  ip netns add "$1"
  ip -n "$1" link set lo up
  ip -n "$1" link add v0 type veth peer name v1
  ip -n "$1" addr add 10.99.0.2/24 dev v0
  ip -n "$1" addr add fd99::2/64 dev v0 nodad
  ip -n "$1" link set v0 up
  mkdir -p "/etc/netns/$1"
  printf 'nameserver 127.0.0.53\nnameserver ::127.0.0.53\n' > "/etc/netns/$1/resolv.conf"
}

# timed NAME SCRIPT: run SCRIPT with bash inside namespace NAME; print its duration in µs.
timed() {
  ip netns exec "$1" bash -c '
    t0=$EPOCHREALTIME
    eval "$0" >/dev/null 2>/tmp/rdbench.err || { cat /tmp/rdbench.err >&2; exit 1; }
    t1=$EPOCHREALTIME
    echo $(( (${t1/./} - ${t0/./}) ))' "$2"
}

median() { sort -n | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.0f", m}'; }

declare -A CMDS
CMDS[default/redirect-init]="$BIN -p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x '' -b '*' -d 15090,15021,15020 -o 15020"
CMDS[default/iptables-nft-restore]="iptables-nft-restore --noflush $CNI_BASIC"
CMDS[default/iptables-legacy-restore]="iptables-legacy-restore --noflush $CNI_BASIC"
CMDS[dual-stack/redirect-init]="$BIN -p 15001 -z 15006 -u 3,4 -g 1,2 --redirect-dns --dual-stack"
CMDS[dual-stack/iptables-nft-restore]="iptables-nft-restore --noflush $DNS4 && ip6tables-nft-restore --noflush $DNS6"
CMDS[dual-stack/iptables-legacy-restore]="iptables-legacy-restore --noflush $DNS4 && ip6tables-legacy-restore --noflush $DNS6"
ORDER=(default/redirect-init default/iptables-nft-restore default/iptables-legacy-restore
       dual-stack/redirect-init dual-stack/iptables-nft-restore dual-stack/iptables-legacy-restore)

declare -A RESULTS
n=0
for ((i = 0; i < RUNS; i++)); do
  # Interleave the tools so drift on the machine affects all alike.
  for key in "${ORDER[@]}"; do
    ns="$NS_PREFIX-$n"; n=$((n + 1))
    fresh_ns "$ns"
    RESULTS[$key]+="$(timed "$ns" "${CMDS[$key]}") "
    ip netns del "$ns"; rm -rf "/etc/netns/$ns"
  done
done

echo "machine: $(nproc) cores, $(uname -r), runs per command: $RUNS, fresh namespace each"
printf '%-40s %12s %10s\n' "command" "median µs" "vs ours"
for scen in default dual-stack; do
  ours=$(tr ' ' '\n' <<<"${RESULTS[$scen/redirect-init]}" | grep . | median)
  for key in "${ORDER[@]}"; do
    [[ $key == $scen/* ]] || continue
    m=$(tr ' ' '\n' <<<"${RESULTS[$key]}" | grep . | median)
    printf '%-40s %12s %9.1fx\n' "$key" "$m" "$(awk -v a="$m" -v b="$ours" 'BEGIN{print a/b}')"
  done
done
