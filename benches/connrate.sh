#!/usr/bin/env bash
# Per-connection cost of the capture rules: new outbound TCP connections per second through the
# nat OUTPUT REDIRECT path, with 0 and with 10,000 excluded CIDRs, for
#   ours               redirect-init (release), the CIDRs in nftables sets (10,000 /25s: one sized hash set, masked lookup)
#   iptables-nft       Istio's rules via iptables-nft-restore (one `-d CIDR -j RETURN` per CIDR)
#   iptables-legacy    the same via iptables-legacy-restore
#   istio-nft          Istio's native nftables backend via `nft -f` (one rule per CIDR)
# The destinations (10.1.x.y) lie outside every excluded CIDR, so linear rule sets walk all of
# them on each new connection; later packets of a connection skip the nat table (conntrack).
#
# Each measurement gets a fresh namespace (lo, veth v0 with 10.99.0.2/24, route to 10.0.0.0/8);
# connrate (benches/src/bin/connrate.rs) runs a listener on :15001 and a uid-1000 client there.
# Rule sets are interleaved within each round so drift on the machine hits all alike.
# Usage (root): bash benches/connrate.sh [ROUNDS] [SECONDS]   (defaults 5 and 3)
set -euo pipefail

ROUNDS=${1:-5}
SECS=${2:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${SHARED:-$ROOT/../shared}
REL=$ROOT/target/release
. "$ROOT/benches/lib.sh"
CNI_BASIC=$SHARED/testdata/istio/cni/basic.restore
[ -r "$CNI_BASIC" ] || { echo "missing $CNI_BASIC (set SHARED=path/to/shared)" >&2; exit 1; }
our_binaries "$ROOT"
if [ ! -x "$REL/connrate" ] || [ ! -x "$REL/bench-data" ]; then
  (cd "$ROOT" && cargo build --release -q -p redirect-benches)
fi

NS_PREFIX="rdconn$$"
DATA=$(mktemp -d)
cleanup() {
  delete_namespaces "$NS_PREFIX"
  rm -rf "$DATA" "${BIN_COPY:-}"
}
trap cleanup EXIT
"$REL/bench-data" "$DATA" "$CNI_BASIC" 10000

# fresh_ns NAME: lo up, veth v0 (peer v1 in the same namespace) with 10.99.0.2/24 and a route
# so that 10.1.x.y is routable before nat OUTPUT rewrites it; wide ephemeral port range.
fresh_ns() {
  fresh_pod_ns "$1"
  ip -n "$1" link set v1 up
  ip -n "$1" route add 10.0.0.0/8 via 10.99.0.1 dev v0
  ip netns exec "$1" sysctl -q -w net.ipv4.ip_local_port_range="1024 65000"
}

OURS="$BIN/redirect-init -p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -b '*' -d 15090,15021,15020 -o 15020"
declare -A CMDS=(
  [ours-0]="$OURS -x ''"
  [ours-10k]="$OURS -x \"\$(cat $DATA/exclude.list)\""
  [iptables-nft-0]="iptables-nft-restore --noflush $DATA/istio-default.restore"
  [iptables-nft-10k]="iptables-nft-restore --noflush $DATA/istio-exclude.restore"
  [iptables-legacy-0]="iptables-legacy-restore --noflush $DATA/istio-default.restore"
  [iptables-legacy-10k]="iptables-legacy-restore --noflush $DATA/istio-exclude.restore"
  [istio-nft-0]="nft -f $DATA/istio-default.nft"
  [istio-nft-10k]="nft -f $DATA/istio-exclude.nft"
)
TOOLS=(ours iptables-nft iptables-legacy istio-nft)

field() { sed -n "s/.*\"$1\": \([0-9.]*\).*/\1/p"; }

declare -A RATES FAILS ACCEPTED CONNS
n=0
for ((r = 1; r <= ROUNDS; r++)); do
  for tool in "${TOOLS[@]}"; do
    for size in 0 10k; do
      key=$tool-$size ns="$NS_PREFIX-$n"; n=$((n + 1))
      fresh_ns "$ns"
      ip netns exec "$ns" bash -c "${CMDS[$key]}" >/dev/null 2>"$DATA/load.err" ||
        { echo "loading $key failed:" >&2; cat "$DATA/load.err" >&2; exit 1; }
      # The kernel tears down the previous namespace (and its conntrack entries) in the
      # background; let that finish so it does not compete with this measurement.
      sleep 1
      out=$("$REL/connrate" --netns "/run/netns/$ns" --seconds "$SECS") ||
        { echo "connrate failed for $key: $out" >&2; exit 1; }
      ip netns del "$ns"
      RATES[$key]+="$(field per_second <<<"$out") "
      FAILS[$key]=$(( ${FAILS[$key]:-0} + $(field failures <<<"$out") ))
      CONNS[$key]=$(( ${CONNS[$key]:-0} + $(field connections <<<"$out") ))
      ACCEPTED[$key]=$(( ${ACCEPTED[$key]:-0} + $(field accepted <<<"$out") ))
      echo "round $r $key: $out" >&2
    done
  done
done

echo "machine: $(nproc) cores, $(uname -r); $ROUNDS rounds x ${SECS}s, fresh namespace each"
printf '%-20s %14s %14s %12s %12s %9s\n' "rule set" "median conn/s" "min-max" "connections" \
  "accepted" "failures"
declare -A MED
for tool in "${TOOLS[@]}"; do
  for size in 0 10k; do
    key=$tool-$size
    MED[$key]=$(tr ' ' '\n' <<<"${RATES[$key]}" | grep . | median)
    range=$(tr ' ' '\n' <<<"${RATES[$key]}" | grep . | sort -n | sed -n '1p;$p' | paste -sd-)
    printf '%-20s %14s %14s %12s %12s %9s\n' "$key" "${MED[$key]}" "$range" "${CONNS[$key]}" \
      "${ACCEPTED[$key]}" "${FAILS[$key]}"
  done
done
# Paired ratio: 10k and 0 ran back to back in each round, so their ratio cancels slow drift.
for tool in "${TOOLS[@]}"; do
  paired=$(paste <(tr ' ' '\n' <<<"${RATES[$tool-10k]}" | grep .) \
    <(tr ' ' '\n' <<<"${RATES[$tool-0]}" | grep .) | awk '{printf "%d\n", 1000 * $1 / $2}' | median)
  awk -v t="$tool" -v a="${MED[$tool-10k]}" -v b="${MED[$tool-0]}" -v p="$paired" \
    'BEGIN { printf "%s: 10k/0 = %.2f (median of per-round ratios %.2f)\n", t, a / b, p / 1000 }'
done
