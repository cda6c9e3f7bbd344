#!/usr/bin/env bash
# What telling the node agent costs a pod: whole-process redirect-cni ADD (Istio's sidecar
# default, annotations from the runtime, each in a fresh namespace, from the host namespace as a
# runtime runs it) with the agent's run directory in each of these states, interleaved:
#
#   absent   no agent: no socket in the run directory (the datagram's sendto fails at once);
#   present  the real agent (`redirect-cni-node`, in a namespace of its own) reading the
#            events; afterwards its /metrics must have counted every ADD of this state;
#   hung     a socket bound by a process that never reads, its queue filled before the clock
#            starts (the sendto would block if it could);
#   base     BASE_BIN_DIR=DIR: an older build's redirect-cni (before the events), run dir empty.
#
# Our binaries come from REDIRECT_BIN_DIR (default: the static build). Prints the median µs of
# each state and its difference from `absent` (and from `base`).
#
# Usage (root): bash benches/agent.sh [RUNS]   (default 40)
set -euo pipefail

RUNS=${1:-${RUNS:-40}}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/benches/lib.sh"
bash "$ROOT/scripts/install-deps.sh"
our_binaries "$ROOT"
NS_PREFIX="rdagent$$"
DATA=$(mktemp -d /tmp/rdagent.XXXXXX)
LOGS=$(mktemp -d /dev/shm/rdagent.XXXXXX 2>/dev/null || mktemp -d /tmp/rdagent-logs.XXXXXX)
export OUT=$LOGS/out ERR=$LOGS/err
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  delete_namespaces "$NS_PREFIX"
  rm -rf "$DATA" "$LOGS" "${BIN_COPY:-}"
}
trap cleanup EXIT

STATES=(absent present hung)
[ -n "${BASE_BIN_DIR:-}" ] && STATES+=(base)
STATUS='{"initContainers":["istio-validation"],"containers":["istio-proxy"],"volumes":[],"imagePullSecrets":null}'
for s in "${STATES[@]}"; do
  mkdir -p "$DATA/$s/run"
  python3 - "$DATA/$s" "$STATUS" <<'PY'
import json, sys
d, status = sys.argv[1], sys.argv[2]
conf = {"cniVersion": "1.0.0", "name": "podnet", "type": "redirect-cni", "proxy_uid": 1337,
        "cni_agent_run_dir": f"{d}/run",
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"sidecar.istio.io/status": status}}}
json.dump(conf, open(f"{d}/conf.json", "w"))
PY
done

# present: the agent of this build, standalone, no repair, metrics in its own namespace.
AGENT_NS="${NS_PREFIX}-agent"
ip netns add "$AGENT_NS"
ip -n "$AGENT_NS" link set lo up
A=$DATA/present
mkdir -p "$A/net" "$A/bin" "$A/sa"
echo t0k3n >"$A/sa/token"
echo '-----BEGIN CERTIFICATE-----' >"$A/sa/ca.crt"
ip netns exec "$AGENT_NS" env -i KUBERNETES_SERVICE_HOST=10.96.0.1 KUBERNETES_SERVICE_PORT=443 \
  "$BIN/redirect-cni-node" --chained-cni-plugin=false --repair-enabled=false \
  --mounted-cni-net-dir "$A/net" --cni-bin-dir "$A/bin" --cni-agent-run-dir "$A/run" \
  --binary "$BIN/redirect-cni" --service-account-dir "$A/sa" --monitoring-port 15014 \
  2>"$DATA/agent.log" &
PIDS+=($!)
for _ in $(seq 100); do
  [ "$(cat "$A/run/agent-ready" 2>/dev/null)" = ready ] && break
  sleep 0.1
done
[ "$(cat "$A/run/agent-ready" 2>/dev/null)" = ready ] || { cat "$DATA/agent.log" >&2; exit 1; }

# hung: bound, never read, queue full.
python3 - "$DATA/hung/run/plugin-events.sock" <<'PY' &
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
c = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
c.setblocking(False)
n = 0
try:
    while True:
        c.sendto(b"x" * 300, sys.argv[1])
        n += 1
except BlockingIOError:
    pass
open(sys.argv[1] + ".full", "w").write(str(n))
time.sleep(100000)
PY
PIDS+=($!)
for _ in $(seq 100); do [ -e "$DATA/hung/run/plugin-events.sock.full" ] && break; sleep 0.1; done

declare -A RESULTS
n=0
for ((r = 0; r < RUNS; r++)); do
  for s in "${STATES[@]}"; do
    ns="${NS_PREFIX}-$((n++))"
    fresh_pod_ns "$ns"
    bin=$BIN/redirect-cni
    [ "$s" = base ] && bin=$BASE_BIN_DIR/redirect-cni
    RESULTS[$s]+="$(timed_plugin "$ns" "$bin" "$DATA/$s/conf.json") "
    ip netns del "$ns"
  done
done

# The present agent counted every ADD of its state.
counted=$(ip netns exec "$AGENT_NS" python3 -c '
import urllib.request
t = urllib.request.urlopen("http://127.0.0.1:15014/metrics").read().decode()
print(next((l.split()[-1] for l in t.splitlines()
  if l.startswith("istio_cni_plugin_requests_total{command=\"ADD\",response_code=\"0\"}")), 0))')
[ "$counted" = "$RUNS" ] || { echo "the agent counted $counted ADDs of $RUNS" >&2; exit 1; }

med() { tr ' ' '\n' <<<"${RESULTS[$1]}" | { grep . || true; } | median; }
echo "redirect-cni ADD, Istio's sidecar default, $RUNS runs per state, binaries $BIN"
echo "hung: $(cat "$DATA/hung/run/plugin-events.sock.full") datagrams queued before the clock; present: $counted ADDs counted"
ref=$(med absent)
printf '%-10s %10s %12s\n' state "median µs" "vs absent"
for s in "${STATES[@]}"; do
  m=$(med "$s")
  printf '%-10s %10s %+11.1f%%\n' "$s" "$m" "$(awk -v a="$m" -v b="$ref" 'BEGIN{print (a-b)*100/b}')"
done
