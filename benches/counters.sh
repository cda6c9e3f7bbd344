#!/usr/bin/env bash
# The cost of the opt-in capture counters (CAPTURE_COUNTERS, `CaptureConfig::counters`): new
# outbound TCP connections per second through the nat OUTPUT REDIRECT path (connrate), for
#   plain            our rules for Istio's sidecar defaults, without counters
#   counted          the same rules with counters (the connection meets one: ISTIO_REDIRECT's)
#   stack-plain      plain, behind a table of 1,000 rules `meta l4proto tcp` that every new
#                    connection walks
#   stack-counted    the same 1,000 rules each with a counter
# Counters sit in the nat stage, which sees a connection's first packet only: an established
# connection's packets meet none. The stack pair gives the cost of one counter per packet:
# (1/rate(stack-counted) - 1/rate(stack-plain)) / 1000.
# Each measurement gets a fresh namespace; rule sets are interleaved within each round.
# Usage (root): bash benches/counters.sh [ROUNDS] [SECONDS]   (defaults 5 and 3)
set -euo pipefail

ROUNDS=${1:-5}
SECS=${2:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${SHARED:-$ROOT/../shared}
REL=${CARGO_TARGET_DIR:-$ROOT/target}/release
. "$ROOT/benches/lib.sh"
CNI_BASIC=$SHARED/testdata/istio/cni/basic.restore
[ -r "$CNI_BASIC" ] || { echo "missing $CNI_BASIC (set SHARED=path/to/shared)" >&2; exit 1; }
(cd "$ROOT" && cargo build --release -q -p redirect-benches)

NS_PREFIX="rdcount$$"
DATA=$(mktemp -d)
cleanup() {
  delete_namespaces "$NS_PREFIX"
  rm -rf "$DATA"
}
trap cleanup EXIT
"$REL/bench-data" "$DATA" "$CNI_BASIC" 10 >/dev/null

fresh_ns() {
  fresh_pod_ns "$1"
  ip -n "$1" link set v1 up
  ip -n "$1" route add 10.0.0.0/8 via 10.99.0.1 dev v0
  ip netns exec "$1" sysctl -q -w net.ipv4.ip_local_port_range="1024 65000"
}

declare -A LOAD=(
  [plain]="$DATA/ours-default.nft"
  [counted]="$DATA/ours-counted.nft"
  [stack-plain]="$DATA/ours-default.nft $DATA/stack-plain.nft"
  [stack-counted]="$DATA/ours-default.nft $DATA/stack-counted.nft"
)
SETS=(plain counted stack-plain stack-counted)
field() { sed -n "s/.*\"$1\": \([0-9.]*\).*/\1/p"; }

declare -A RATES
n=0
for ((r = 1; r <= ROUNDS; r++)); do
  for key in "${SETS[@]}"; do
    ns="$NS_PREFIX-$n"; n=$((n + 1))
    fresh_ns "$ns"
    for f in ${LOAD[$key]}; do ip netns exec "$ns" nft -f "$f"; done
    sleep 1
    out=$("$REL/connrate" --netns "/run/netns/$ns" --seconds "$SECS") ||
      { echo "connrate failed for $key: $out" >&2; exit 1; }
    [ "$key" = counted ] && ip netns exec "$ns" nft list ruleset | grep -c 'counter packets' >&2
    ip netns del "$ns"
    RATES[$key]+="$(field per_second <<<"$out") "
    echo "round $r $key: $out" >&2
  done
done

echo "machine: $(nproc) cores, $(uname -r); $ROUNDS rounds x ${SECS}s, fresh namespace each"
printf '%-16s %14s %20s\n' "rule set" "median conn/s" "min-max"
declare -A MED
for key in "${SETS[@]}"; do
  MED[$key]=$(tr ' ' '\n' <<<"${RATES[$key]}" | grep . | median)
  range=$(tr ' ' '\n' <<<"${RATES[$key]}" | grep . | sort -n | sed -n '1p;$p' | paste -sd-)
  printf '%-16s %14s %20s\n' "$key" "${MED[$key]}" "$range"
done
awk -v p="${MED[plain]}" -v c="${MED[counted]}" -v sp="${MED[stack-plain]}" \
  -v sc="${MED[stack-counted]}" 'BEGIN {
    printf "our rules: counted/plain = %.3f (%.2f us per connection more)\n", c / p, 1e6 / c - 1e6 / p
    printf "one counter per packet: %.1f ns ((1/%d - 1/%d) / 1000)\n", (1e9 / sc - 1e9 / sp) / 1000, sc, sp
  }'
