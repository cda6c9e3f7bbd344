#!/usr/bin/env bash
# Whole-process cost of long port lists: redirect-cni ADD, then CHECK, for a pod whose
# `traffic.sidecar.istio.io/excludeInboundPorts` annotation lists many ports (any pod author can
# write up to Kubernetes' 256 KiB of annotations), each in a fresh namespace. Reports the median
# wall time and the kernel (system) time of each.
#
# Lists: Istio's default (3 ports), 43,000 contiguous ports (1-43000: a 247 KB annotation),
# 43,000 random ports (seeded), every other port (2, 4, ..., 65534: 32,767 ports that merge with
# nothing, the worst case of the interval form) and all 65,535 ports.
#
# Our binaries come from REDIRECT_BIN_DIR (default: the static build). BASE_BIN_DIR=DIR also
# runs an older build's redirect-cni (BASE_RUNS times, default 1: a build that lowers port lists
# to a bitmap set takes seconds per ADD).
#
# Usage (root): bash benches/ports.sh [RUNS]   (default 10)
set -euo pipefail

RUNS=${1:-${RUNS:-10}}
BASE_RUNS=${BASE_RUNS:-1}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/benches/lib.sh"
bash "$ROOT/scripts/install-deps.sh"
our_binaries "$ROOT"
NS_PREFIX="rdports$$"
DATA=$(mktemp -d /tmp/rdports.XXXXXX)
cleanup() {
  delete_namespaces "$NS_PREFIX"
  rm -rf "$DATA" "${BIN_COPY:-}"
}
trap cleanup EXIT

# One config per list: the chained entry with the pod's annotations from runtimeConfig.
python3 - "$DATA" <<'PY'
import json, random, sys
out = sys.argv[1]
status = '{"initContainers":["istio-validation"],"containers":["istio-proxy"],"volumes":[],"imagePullSecrets":null}'
random.seed(23)
lists = {
    "default-3": [15090, 15021, 15020],
    "contiguous-43000": list(range(1, 43001)),
    "random-43000": random.sample(range(1, 65536), 43000),
    "alternate-32767": list(range(2, 65535, 2)),
    "all-65535": list(range(1, 65536)),
}
for name, ports in lists.items():
    ann = {"sidecar.istio.io/status": status,
           "traffic.sidecar.istio.io/excludeInboundPorts": ",".join(map(str, ports))}
    conf = {"cniVersion": "1.0.0", "name": "podnet", "type": "redirect-cni", "proxy_uid": 1337,
            "runtimeConfig": {"io.kubernetes.cri.pod-annotations": ann}}
    with open(f"{out}/{name}.json", "w") as f:
        json.dump(conf, f)
PY
LISTS=(default-3 contiguous-43000 random-43000 alternate-32767 all-65535)

# timed BIN CMD NS CONF: "wall_us sys_us" of one plugin run from the host namespace: wall time
# around the child alone, its system time from getrusage (microseconds).
timed() {
  CNI_COMMAND=$2 CNI_CONTAINERID=bench CNI_NETNS=/run/netns/$3 CNI_IFNAME=v0 \
    CNI_PATH=/opt/cni/bin CNI_ARGS="K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0" \
    python3 -c '
import resource, subprocess, sys, time
conf = open(sys.argv[2], "rb")
before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime
t0 = time.perf_counter()
p = subprocess.run([sys.argv[1]], stdin=conf, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
wall = time.perf_counter() - t0
sys_s = resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime - before
if p.returncode != 0:
    sys.exit(f"{sys.argv[1]} failed ({p.returncode}): {p.stderr.decode()}")
print(int(wall * 1e6), int(sys_s * 1e6))' "$1" "$4"
}

# run LABEL BIN N: N rounds of ADD then CHECK per list; prints one line per list and command.
run() {
  local label=$1 bin=$2 n=$3 list i ns r
  for list in "${LISTS[@]}"; do
    declare -a add_w=() add_s=() chk_w=() chk_s=()
    for ((i = 0; i < n; i++)); do
      ns="$NS_PREFIX-$list-$i"
      fresh_pod_ns "$ns"
      read -r w s <<<"$(timed "$bin" ADD "$ns" "$DATA/$list.json")"; add_w+=("$w"); add_s+=("$s")
      read -r w s <<<"$(timed "$bin" CHECK "$ns" "$DATA/$list.json")"; chk_w+=("$w"); chk_s+=("$s")
      ip netns del "$ns"
    done
    r() { printf '%s\n' "$@" | median; }
    printf '%-10s %-18s ADD   %8s ms wall %8s ms sys    CHECK %8s ms wall %8s ms sys\n' "$label" "$list" \
      "$(awk -v v="$(r "${add_w[@]}")" 'BEGIN{printf "%.1f", v/1000}')" \
      "$(awk -v v="$(r "${add_s[@]}")" 'BEGIN{printf "%.1f", v/1000}')" \
      "$(awk -v v="$(r "${chk_w[@]}")" 'BEGIN{printf "%.1f", v/1000}')" \
      "$(awk -v v="$(r "${chk_s[@]}")" 'BEGIN{printf "%.1f", v/1000}')"
  done
}

echo "machine: $(nproc) cores, $(uname -r); medians of $RUNS runs (base: $BASE_RUNS), fresh namespace each"
echo "annotation sizes: $(for l in "${LISTS[@]}"; do printf '%s %s B; ' "$l" "$(stat -c %s "$DATA/$l.json")"; done)"
run ours "$BIN/redirect-cni" "$RUNS"
if [ -n "${BASE_BIN_DIR:-}" ]; then
  run base "$BASE_BIN_DIR/redirect-cni" "$BASE_RUNS"
fi
