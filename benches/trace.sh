#!/usr/bin/env bash
# redirect-validate trace's time to first event: `trace --send --json` on a pod namespace holding
# Istio's default sidecar capture (written by redirect-init), outbound (UID 1000, redirected to
# 15001) and inbound (from the peer, redirected to 15006). Prints, per direction, the median and
# max of `first_event_ms` (from just before the packet is sent to the first trace report, in
# the process) and of the whole process's wall time (which includes the trace table's setup
# and removal and the 300 ms trace waits for the packet's last reports).
# Usage (root): bash benches/trace.sh [RUNS]   (default 20); BIN_DIR=DIR picks the binaries
# (default target/release, built when missing).
set -euo pipefail

RUNS=${1:-20}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN_DIR=${BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
if [ ! -x "$BIN_DIR/redirect-validate" ] || [ ! -x "$BIN_DIR/redirect-init" ]; then
  (cd "$ROOT" && cargo build --release -q -p validator -p init-shim)
fi
ISTIO=(-p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x '' -b '*' -d 15090,15021,15020)
POD="rdtrace$$pod"
PEER="rdtrace$$peer"
cleanup() { ip netns del "$POD" 2>/dev/null || true; ip netns del "$PEER" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$POD"
ip netns add "$PEER"
ip -n "$POD" link add eth0 type veth peer name peer0 netns "$PEER"
ip -n "$POD" addr add 10.77.0.2/24 dev eth0
ip -n "$PEER" addr add 10.77.0.1/24 dev peer0
for ns in "$POD" "$PEER"; do ip -n "$ns" link set lo up; done
ip -n "$POD" link set eth0 up
ip -n "$PEER" link set peer0 up
ip -n "$POD" route add default via 10.77.0.1
ip netns exec "$POD" "$BIN_DIR/redirect-init" "${ISTIO[@]}" >/dev/null 2>&1

measure() { # NAME ARGS...: RUNS runs, then the medians and maxima
  local name=$1; shift
  local first=() wall=()
  for _ in $(seq "$RUNS"); do
    local t0 t1 out
    t0=$(date +%s%N)
    out=$(ip netns exec "$PEER" "$BIN_DIR/redirect-validate" trace --netns "/run/netns/$POD" "$@" --send --json "${ISTIO[@]}")
    t1=$(date +%s%N)
    first+=("$(printf '%s' "$out" | sed -n 's/.*"first_event_ms": \([0-9.]*\).*/\1/p')")
    wall+=("$(( (t1 - t0) / 1000 ))")
  done
  printf '%s\n' "${first[@]}" | sort -g | awk -v n="$name" '{a[NR]=$1} END {printf "%-9s first event: median %.2f ms, max %.2f ms (%d runs)\n", n, a[int((NR+1)/2)], a[NR], NR}'
  printf '%s\n' "${wall[@]}" | sort -g | awk -v n="$name" '{a[NR]=$1} END {printf "%-9s whole process: median %.1f ms, max %.1f ms\n", n, a[int((NR+1)/2)]/1000, a[NR]/1000}'
}
measure outbound --to 10.77.0.1:80 --uid 1000
measure inbound --to 10.77.0.2:8080
