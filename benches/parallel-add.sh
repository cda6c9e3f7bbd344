#!/usr/bin/env bash
# N pods start at once on one node: N redirect-cni ADDs in parallel, each into its own fresh
# namespace, released together by a gate. Reports failures, p50/p99/max latency and the wall
# time, then checks every namespace holds our table. For comparison, the same burst with Istio's
# rules through iptables-nft-restore and iptables-legacy-restore (which serialise on the global
# /run/xtables.lock even across namespaces); those run under `ip netns exec`, whose own cost is
# reported as the `ip netns exec true` line.
#
# Usage (root): bash benches/parallel-add.sh [N]   (default 200)
set -euo pipefail

N=${1:-${N:-200}}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${SHARED:-$ROOT/../shared}
REL=$ROOT/target/release
. "$ROOT/benches/lib.sh"
bash "$ROOT/scripts/install-deps.sh"
our_binaries "$ROOT"
[ -x "$REL/bench-data" ] || (cd "$ROOT" && cargo build --release -q -p redirect-benches)
BASIC=$SHARED/testdata/istio/cni/basic.restore
[ -r "$BASIC" ] || { echo "missing $BASIC (set SHARED=path/to/shared)" >&2; exit 1; }

PREFIX="rdpar$$"
WORK=$(mktemp -d /tmp/rdpar.XXXXXX)
cleanup() {
  delete_namespaces "$PREFIX"
  rm -rf "$WORK" "${BIN_COPY:-}"
}
trap cleanup EXIT

"$REL/bench-data" "$WORK" "$BASIC" 10 # the ADD config: cni-default.json

make_namespaces() { # $1: tag
  for ((i = 0; i < N; i++)); do
    local ns="$PREFIX-$1-$i"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ns" link add v0 type veth peer name v1
    ip -n "$ns" addr add 10.99.0.2/24 dev v0
    ip -n "$ns" link set v0 up
  done
}

# burst TAG COMMAND: start N copies of COMMAND (bash; $NS is the namespace name) behind a gate,
# each writing "exit-code µs" to its own file.
burst() {
  local tag=$1 cmd=$2
  mkdir -p "$WORK/$tag"
  exec 9>"$WORK/gate"
  flock -x 9
  for ((i = 0; i < N; i++)); do
    NS="$PREFIX-$tag-$i" OUT="$WORK/$tag/$i" GATE="$WORK/gate" CMD="$cmd" bash -c '
      flock -s "$GATE" true
      t0=$EPOCHREALTIME
      rc=0; eval "$CMD" >"$OUT.stdout" 2>"$OUT.stderr" || rc=$?
      t1=$EPOCHREALTIME
      echo "$rc $(( ${t1/./} - ${t0/./} ))" >"$OUT.res"' &
  done
  sleep 1 # let every job reach the gate
  local t0=$EPOCHREALTIME
  flock -u 9
  wait
  local t1=$EPOCHREALTIME
  exec 9>&-
  echo $(( (${t1/./} - ${t0/./}) / 1000 )) >"$WORK/$tag.wall"
}

report() { # $1: tag, $2: label
  local tag=$1
  local fails
  fails=$(cat "$WORK/$tag"/*.res | awk '$1 != 0' | wc -l)
  cat "$WORK/$tag"/*.res | awk '{print $2}' | sort -n | awk -v label="$2" -v n="$N" \
    -v fails="$fails" -v wall="$(cat "$WORK/$tag.wall")" '
    {a[NR] = $1}
    END {
      p50 = a[int((NR + 1) * 0.50)]; p99 = a[int(NR * 0.99 + 0.999)]
      printf "%-40s %4d/%d ok  p50 %8.1f ms  p99 %8.1f ms  max %8.1f ms  wall %6d ms\n",
        label, NR - fails, n, p50 / 1000, p99 / 1000, a[NR] / 1000, wall
    }'
  if [ "$fails" -gt 0 ]; then
    echo "  failures in $tag, first one:" >&2
    for f in "$WORK/$tag"/*.res; do
      [ "$(cut -d' ' -f1 "$f")" != 0 ] && { cat "${f%.res}.stdout" "${f%.res}.stderr" >&2; break; }
    done
  fi
}

echo "machine: $(nproc) cores, $(uname -r); $N namespaces per burst"

make_namespaces cni
burst cni 'CNI_COMMAND=ADD CNI_CONTAINERID=c$NS CNI_NETNS=/run/netns/$NS CNI_IFNAME=v0 CNI_PATH=/opt/cni/bin CNI_ARGS="K8S_POD_NAMESPACE=default;K8S_POD_NAME=$NS" '"$BIN/redirect-cni <$WORK/cni-default.json"
report cni "redirect-cni ADD"
missing=0
for ((i = 0; i < N; i++)); do
  ip netns exec "$PREFIX-cni-$i" nft list table inet redirect_capture >/dev/null 2>&1 || missing=$((missing + 1))
done
echo "  namespaces without our table after the burst: $missing"
for ((i = 0; i < N; i++)); do ip netns del "$PREFIX-cni-$i"; done

make_namespaces floor
burst floor 'ip netns exec $NS true'
report floor "ip netns exec true"
for ((i = 0; i < N; i++)); do ip netns del "$PREFIX-floor-$i"; done

for variant in nft legacy; do
  make_namespaces "$variant"
  burst "$variant" "ip netns exec \$NS iptables-$variant-restore -w --noflush $BASIC"
  report "$variant" "ip netns exec iptables-$variant-restore"
  for ((i = 0; i < N; i++)); do ip netns del "$PREFIX-$variant-$i"; done
done

[ "$missing" -eq 0 ] && [ "$(cat "$WORK/cni"/*.res | awk '$1 != 0' | wc -l)" -eq 0 ]
