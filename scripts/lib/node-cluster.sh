#!/usr/bin/env bash
# node-cluster.sh up|run WORKDIR [--taint KEY] [--record-cni] | down WORKDIR
#
# A single-node Kubernetes cluster for the tests (cni-shim/testkit's `node` module), all of it in
# namespaces made for it: a PID namespace (killing its init, catatonit, kills every process of
# the cluster, containers included), a network namespace (the node's address 10.250.0.1 on a
# veth, pods on a bridge in 10.244.0.0/24) and a private mount namespace, in which scratch
# folders of WORKDIR are mounted over /var/lib, /var/log, /run and /opt, an overlay over /etc,
# and plain files over the three /proc/sys entries kubelet writes. Nothing on the machine
# changes but the cgroups kubelet makes under its own root (/rdnode-<WORKDIR's name> in each
# hierarchy), which `down` removes.
#
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler (1.20, .tools/kube), containerd
# with the images of WORKDIR/images/*.tar (scripts/build-node-images.sh), kubelet (node
# `node-1`, registered with the taint KEY=true:NoSchedule when asked) start in that order, each
# checked before the next. WORKDIR/ready appears once the node is Ready; WORKDIR/failed says why
# it is not (the logs are in WORKDIR/logs).
#   up    starts it in the background, waits until it is Ready, and writes WORKDIR/init.pid
#   run   starts it in the foreground (the test kit): it stops when this process dies
#   down  kills it (its PID namespace's init) and removes its cgroups
# kubectl, from the host:
#   nsenter -t $(cat WORKDIR/init.pid) -n kubectl --kubeconfig WORKDIR/pki/admin.kubeconfig ...
# The kubernetes Service (10.96.0.1:443) is DNATed to the API server in the node's namespace,
# standing in for kube-proxy, so in-cluster clients (the node agent) work unchanged.
set -euo pipefail
usage="usage: $0 up|run WORKDIR [--taint KEY] [--record-cni] | down WORKDIR"
cmd=${1:?$usage}
W=${2:?$usage}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KUBE=$ROOT/.tools/kube
NODE_IP=10.250.0.1

cgroup_root() { echo "rdnode-$(basename "$W")"; }

down() {
  local pid
  if [ -s "$W/init.pid" ]; then
    pid=$(cat "$W/init.pid")
    kill -KILL "$pid" 2>/dev/null || true
    # The namespace's processes die with its init; wait for them before removing cgroups.
    for _ in $(seq 100); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
  fi
  local root; root=$(cgroup_root)
  for _ in $(seq 50); do
    local left=0 d
    for h in /sys/fs/cgroup/*/; do
      [ -d "$h$root" ] || continue
      # Deepest first; a cgroup with processes left is retried.
      while IFS= read -r d; do rmdir "$d" 2>/dev/null || left=1; done < <(find "$h$root" -depth -type d)
    done
    [ "$left" = 0 ] && break
    sleep 0.2
  done
}

if [ "$cmd" = down ]; then
  down
  exit 0
fi
case $cmd in up | run) ;; *) echo "usage: $0 up|run WORKDIR [--taint KEY] | down WORKDIR" >&2; exit 2 ;; esac
taint="" record=""
shift 2
while [ $# -gt 0 ]; do
  case $1 in
    --taint) taint=${2:?--taint KEY}; shift 2 ;;
    --record-cni) record=1; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
for b in kube-apiserver kubelet kube-scheduler kube-controller-manager; do
  [ -x "$KUBE/$b" ] || { echo "$KUBE/$b is missing: run scripts/install-deps.sh" >&2; exit 1; }
done
for b in etcd containerd ctr runc catatonit kubectl openssl nft curl; do
  command -v "$b" >/dev/null || { echo "$b is missing: run scripts/install-deps.sh" >&2; exit 1; }
done

rm -f "$W/ready" "$W/failed"
mkdir -p "$W"/{pki/apiserver,logs,etcd,varlib,varlog,run,opt/cni/bin,etc-up,etc-work,sysctl,containerd/root,containerd/opt,flex,kubelet-plugins,kubectl-cache}
cp /usr/lib/cni/{bridge,host-local,loopback,portmap} "$W/opt/cni/bin/"
for s in vm/overcommit_memory kernel/panic kernel/panic_on_oops; do
  cat "/proc/sys/$s" >"$W/sysctl/${s//\//_}"
done

# Credentials: the service accounts' signing key; tokens for the admin, the components and
# kubelet (system:masters: this cluster is the test's alone).
openssl genrsa -out "$W/pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$W/pki/sa.key" -pubout -out "$W/pki/sa.pub" 2>/dev/null
: >"$W/pki/tokens.csv"
for who in admin controller-manager scheduler kubelet; do
  tok=$(openssl rand -hex 16)
  echo "$tok,$who,$who,system:masters" >>"$W/pki/tokens.csv"
  cat >"$W/pki/$who.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: node, cluster: {server: "https://$NODE_IP:6443", insecure-skip-tls-verify: true}}]
users: [{name: $who, user: {token: "$tok"}}]
contexts: [{name: node, context: {cluster: node, user: $who}}]
current-context: node
KC
done

cat >"$W/containerd.toml" <<TOML
version = 2
root = "$W/containerd/root"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$W/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:test"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
TOML

echo "nameserver 10.96.0.10" >"$W/resolv.conf"

# --record-cni: a plugin `record` after portmap writes what the runtime passes it (the CNI_
# variables and the config on stdin, runtimeConfig included) to /var/log/cni-record, one pair of
# files per call, and passes the result on. It asks for the capabilities our plugin asks for,
# so it receives what ours receives.
record_plugin=""
if [ -n "$record" ]; then
  cat >"$W/opt/cni/bin/record" <<'REC'
#!/bin/sh
d=/var/log/cni-record
mkdir -p $d
f=$d/$(date +%s%N)-$CNI_COMMAND
env | grep '^CNI_' | sort >$f.env
cat >$f.json
case $CNI_COMMAND in
ADD | CHECK) python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
r = c.get("prevResult") or {}
r["cniVersion"] = c["cniVersion"]
print(json.dumps(r))' $f.json ;;
VERSION) echo '{"cniVersion": "1.0.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0"]}' ;;
esac
REC
  chmod 755 "$W/opt/cni/bin/record"
  record_plugin=',
  {"type": "record", "capabilities": {"io.kubernetes.cri.pod-annotations": true, "portMappings": true}}'
fi

cat >"$W/init.sh" <<INIT
set -eu
fail() { echo "\$*" >"$W/failed"; exit 1; }
W=$W
# Mounts: the node's own view of the host's paths.
mount --make-rshared /
mount --bind "$W/varlib" /var/lib
mount --bind "$W/varlog" /var/log
mount --bind "$W/run" /run
mount --bind "$W/opt" /opt
mount -t overlay overlay -o lowerdir=/etc,upperdir=$W/etc-up,workdir=$W/etc-work /etc
for s in vm/overcommit_memory kernel/panic kernel/panic_on_oops; do
  mount --bind "$W/sysctl/\$(echo \$s | tr / _)" "/proc/sys/\$s"
done
mkdir -p /etc/cni/net.d /var/lib/kubelet
cat >/etc/cni/net.d/10-podnet.conflist <<'CNI'
{"cniVersion": "1.0.0", "name": "podnet", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "subnet": "10.244.0.0/24", "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}$record_plugin]}
CNI
# The node's network.
ip link set lo up
ip link add node0 type veth peer name node0p
ip addr add $NODE_IP/24 dev node0
ip link set node0 up
ip link set node0p up
ip route add default via 10.250.0.254 dev node0 onlink
nft -f - <<'NFT'
table ip rdnode-service {
  chain pre { type nat hook prerouting priority -100; ip daddr 10.96.0.1 tcp dport 443 dnat to $NODE_IP:6443; }
  chain out { type nat hook output priority -100; ip daddr 10.96.0.1 tcp dport 443 dnat to $NODE_IP:6443; }
}
NFT
for c in /sys/fs/cgroup/*/; do
  case "\$c" in */unified/) continue ;; esac
  mkdir -p "\${c}$(cgroup_root)"
done
log() { echo "\$(date +%T.%N | cut -c1-12) \$*" >>"$W/logs/node.log"; }
until_ok() { # until_ok WHAT SECONDS CMD...: poll CMD every 0.2 s
  what=\$1 n=\$((\$2 * 5)); shift 2
  while ! "\$@" >/dev/null 2>&1; do
    n=\$((n - 1)); [ \$n -gt 0 ] || fail "\$what: not up; see $W/logs"
    sleep 0.2
  done
  log "\$what up"
}
kc() { kubectl --kubeconfig $W/pki/admin.kubeconfig --cache-dir $W/kubectl-cache --request-timeout=5s "\$@"; }

etcd --data-dir $W/etcd --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 >$W/logs/etcd.log 2>&1 &
until_ok etcd 30 curl -fsS http://127.0.0.1:2379/health

$KUBE/kube-apiserver --etcd-servers=http://127.0.0.1:2379 --bind-address=0.0.0.0 --secure-port=6443 \
  --advertise-address=$NODE_IP --insecure-port=0 --cert-dir=$W/pki/apiserver \
  --token-auth-file=$W/pki/tokens.csv --authorization-mode=RBAC --allow-privileged=true \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file=$W/pki/sa.pub --service-account-signing-key-file=$W/pki/sa.key \
  --api-audiences=https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range=10.96.0.0/24 --endpoint-reconciler-type=none \
  --kubelet-preferred-address-types=InternalIP >$W/logs/kube-apiserver.log 2>&1 &
until_ok kube-apiserver 60 kc get --raw /readyz

$KUBE/kube-controller-manager --kubeconfig=$W/pki/controller-manager.kubeconfig --leader-elect=false \
  --port=0 --service-account-private-key-file=$W/pki/sa.key --root-ca-file=$W/pki/apiserver/apiserver.crt \
  --flex-volume-plugin-dir=$W/flex --allocate-node-cidrs=false --controllers='*,-nodeipam' \
  >$W/logs/kube-controller-manager.log 2>&1 &
$KUBE/kube-scheduler --kubeconfig=$W/pki/scheduler.kubeconfig --leader-elect=false --port=0 \
  >$W/logs/kube-scheduler.log 2>&1 &
until_ok "the default service account" 60 kc get serviceaccount default -n default

containerd --config $W/containerd.toml >$W/logs/containerd.log 2>&1 &
until_ok containerd 30 ctr -a /run/containerd/containerd.sock version
for img in $W/images/*.tar; do
  ctr -a /run/containerd/containerd.sock -n k8s.io images import "\$img" >>$W/logs/node.log 2>&1 \
    || fail "importing \$img failed; see $W/logs/node.log"
done
log "images imported"

$KUBE/kubelet --kubeconfig=$W/pki/kubelet.kubeconfig --container-runtime=remote \
  --container-runtime-endpoint=unix:///run/containerd/containerd.sock --cgroup-driver=cgroupfs \
  --cgroups-per-qos=true --cgroup-root=/$(cgroup_root) --enforce-node-allocatable= --fail-swap-on=false \
  --hostname-override=node-1 --node-ip=$NODE_IP --volume-plugin-dir=$W/kubelet-plugins \
  --resolv-conf=$W/resolv.conf --pod-infra-container-image=localhost/pause:test \
  --eviction-hard='memory.available<1Mi,nodefs.available<1%,imagefs.available<1%,nodefs.inodesFree<1%' \
  --image-gc-high-threshold=100 --image-gc-low-threshold=99 --node-status-update-frequency=2s \
  --read-only-port=0 --runtime-request-timeout=2m ${taint:+--register-with-taints=$taint=true:NoSchedule} \
  >$W/logs/kubelet.log 2>&1 &
node_ready() { kc get node node-1 -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -qx True; }
until_ok "node-1 Ready" 90 node_ready
echo 1 >$W/ready
wait
INIT

# The namespaces' init is catatonit (it reaps what it adopts). `run` execs unshare in the
# foreground: unshare keeps any parent-death signal its caller set (the test kit sets SIGKILL),
# and --kill-child kills catatonit, so every process of the node, when unshare dies.
if [ "$cmd" = run ]; then
  exec unshare --pid --fork --kill-child --mount-proc --mount --net --propagation private \
    catatonit -- sh "$W/init.sh" </dev/null >"$W/logs/init.log" 2>&1
fi
# up: the same in the background, then wait for the node.
setsid unshare --pid --fork --kill-child --mount-proc --mount --net --propagation private \
  catatonit -- sh "$W/init.sh" </dev/null >"$W/logs/init.log" 2>&1 &
launcher=$!
for _ in $(seq 50); do
  child=$(cat "/proc/$launcher/task/$launcher/children" 2>/dev/null | awk '{print $1}')
  [ -n "$child" ] && break
  sleep 0.05
done
[ -n "${child:-}" ] || { echo "the namespaces' init did not start" >&2; exit 1; }
echo "$child" >"$W/init.pid"
started=$SECONDS
while [ ! -e "$W/ready" ]; do
  if [ -e "$W/failed" ] || [ ! -d "/proc/$child" ]; then
    echo "the node did not come up: $(cat "$W/failed" 2>/dev/null || echo "its init exited"); logs in $W/logs" >&2
    tail -5 "$W"/logs/*.log >&2 || true
    exit 1
  fi
  [ $((SECONDS - started)) -lt 300 ] || { echo "the node was not up within 300 s; logs in $W/logs" >&2; exit 1; }
  sleep 0.2
done
echo "node up in $((SECONDS - started)) s (init PID $child)"
