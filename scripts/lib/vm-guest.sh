#!/bin/sh
# The kernel VMs' /init (busybox sh on arm64, dash on amd64), put in the initramfs by
# scripts/kernel-vm.sh; also run on this machine (VM_ROLE=host, VM_BIN=target/static/x86_64)
# for the x86_64 side of the comparison.
#
# Guest: reads /etc/vm.env (VM_NAME, VM_MODE=floor with VM_LEFT_OUT=MODULE for the floor
# checks), mounts /proc /sys /dev /tmp /run, loads the kernel modules listed in /lib/modules/load-order,
# then runs each check in a fresh network namespace (`unshare -n sleep`, joined with nsenter; a
# veth to the root namespace gives it an address and a default route). Each check prints
# `VM-TEST ok NAME` or `VM-TEST fail NAME: WHY`; each `inspect --json` is printed as
# `VM-OUT NAME JSON` for the host to compare with x86_64's; the last line is
# `VM-TEST done N passed, M failed`, then the guest powers off. After the capture checks an
# amd64 guest runs each kernel test executable in /tests as one check.
# Host: the same namespaces and rules, only the `inspect --json` lines (no probe, no connection).
set -u
set -f # '*' in Istio's flags
ROLE=${VM_ROLE:-guest}
BIN=${VM_BIN:-/opt/redirect}
VM_NAME=host VM_MODE= VM_LEFT_OUT=
[ "$ROLE" = guest ] && . /etc/vm.env
pass=0
fail=0
ok() { echo "VM-TEST ok $1"; pass=$((pass + 1)); }
bad() { echo "VM-TEST fail $1: $2"; fail=$((fail + 1)); }
# check NAME CMD...: ok when CMD exits 0, else fail with its exit code and the tail of its stderr.
check() {
  n=$1
  shift
  if "$@" >/tmp/out.$n 2>/tmp/err.$n; then ok "$n"; else
    rc=$?
    bad "$n" "exit $rc: $(tail -n 3 /tmp/err.$n | tr '\n' ' ')"
  fi
}
guest() { [ "$ROLE" = guest ]; }

if guest; then
  /bin/busybox mkdir -p /proc /sys /dev /tmp /run /usr/bin /usr/sbin /sbin
  /bin/busybox --install -s /bin
  export PATH=/usr/sbin:/usr/bin:/sbin:/bin # this machine's ip and nft (amd64) before busybox's
  mount -t proc proc /proc
  mount -t sysfs sysfs /sys
  mount -t devtmpfs devtmpfs /dev 2>/dev/null
  mount -t tmpfs tmpfs /tmp
  mkfifo /tmp/hold # the listeners' stdin (listen)
  mount -t tmpfs tmpfs /run
  echo "VM-TEST start: $VM_NAME: uptime $(cut -d' ' -f1 /proc/uptime) s, $(uname -m) kernel $(uname -r), $(nproc) cpu"
  while read -r m; do
    insmod "/lib/modules/$m.ko" 2>/tmp/insmod.err || bad "insmod_$m" "$(cat /tmp/insmod.err)"
  done </lib/modules/load-order
  ip link set lo up
else
  mkdir -p /tmp
fi

ISTIO="-p 15001 -z 15006 -u 1337 -i * -b *" # Istio's injector: the defaults of istio-init's args
NS=0
# newns N: a network namespace (its holder's PID in $P, its path in $NSP) with eth0 10.33.N.5/24,
# the root namespace's end 10.33.N.1 (veth rv<N>), default route through it.
newns() {
  NS=$1
  unshare -n sleep 3600 &
  P=$!
  NSP=/proc/$P/ns/net
  i=0
  while [ "$(readlink $NSP 2>/dev/null)" = "$(readlink /proc/self/ns/net)" ] && [ $i -lt 100 ]; do
    sleep 0.05
    i=$((i + 1))
  done
  # busybox's ip has no `peer name`: the kernel then names the peer veth<K>, the only veth* here.
  if ip link add rv$NS type veth peer name pv$NS 2>/dev/null && ip link show pv$NS >/dev/null 2>&1; then
    peer=pv$NS
  else
    ip link show rv$NS >/dev/null 2>&1 || ip link add rv$NS type veth
    peer=$(ip link show | sed -n 's/^[0-9]*: \(veth[0-9]*\)@.*/\1/p' | head -n 1)
  fi
  if [ -n "$peer" ] && ip link set $peer netns $P && ip addr add 10.33.$NS.1/24 dev rv$NS && ip link set rv$NS up \
    && nsenter -t $P -n sh -c "ip link set lo up && ip link set $peer name eth0 && ip addr add 10.33.$NS.5/24 dev eth0 && ip link set eth0 up && ip route add default via 10.33.$NS.1"; then
    ok netns_$NS
  else
    bad netns_$NS "could not give the namespace a veth (peer '$peer'): $(ip link show | tr '\n' ' ')"
  fi
}
dropns() {
  kill $P 2>/dev/null
  ip link del rv$NS 2>/dev/null
}
inns() { nsenter -t $P -n "$@"; }
# inspect NAME ARGS...: inspect --json of the current namespace must exit 0 and say "equal": true;
# the JSON goes to the console on one line (its indentation dropped) for the host's comparison.
inspect() {
  n=$1
  shift
  if "$BIN/redirect-validate" inspect --netns $NSP "$@" --json >/tmp/insp.$n 2>/tmp/err.$n; then
    if grep -q '"equal": true' /tmp/insp.$n; then ok "$n"; else bad "$n" "not equal: $(cat /tmp/insp.$n)"; fi
  else
    rc=$?
    bad "$n" "exit $rc: $(cat /tmp/insp.$n) $(tail -n 3 /tmp/err.$n | tr '\n' ' ')"
  fi
  echo "VM-OUT $n $(sed 's/^ *//' /tmp/insp.$n | tr -d '\n')"
}
# probe NAME ARGS: the validation probe as the proxy's UID 1337 (su to `proxy`), must exit 0.
probe() {
  n=$1
  shift
  check "$n" inns su -s /bin/sh proxy -c "set -f; $BIN/redirect-validate --run-validation --skip-rule-apply --probe-timeout 5s $*"
}
# listen PORT FILE [ns|root]: busybox nc accepting one connection, what it reads into FILE;
# fails when nothing listens on PORT after 10 s. Its stdin is a FIFO opened read-write, which
# never ends: with /dev/null busybox nc half-closes the connection as soon as it accepts it, and a
# sender whose words come after that FIN exits 0 without sending them (1 in 100 connections here,
# every one when the sender's stdin is 50 ms late).
listen() {
  rm -f "$2"
  if [ "${3:-ns}" = ns ]; then inns nc -l -p "$1" >"$2" <>/tmp/hold & else nc -l -p "$1" >"$2" <>/tmp/hold & fi
  L=$!
  i=0
  while [ $i -lt 100 ]; do
    if [ "${3:-ns}" = ns ]; then inns netstat -ltn; else netstat -ltn; fi | grep -q ":$1 " && return 0
    sleep 0.1
    i=$((i + 1))
  done
  return 1
}
# got FILE WORD: the listener got WORD within 3 s (the connection landed there); stops it.
got() {
  i=0
  while [ $i -lt 30 ] && ! grep -q "$2" "$1" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
  kill $L 2>/dev/null
  grep -q "$2" "$1" 2>/dev/null
}
# landing NAME PORT ns|root WORD SENDER...: a listener on PORT, SENDER sends WORD; ok when the
# listener got it, else fail with the sender's exit code, its last word and the guest's uptime.
landing() {
  n=$1 port=$2 where=$3 word=$4
  shift 4
  if ! listen "$port" /tmp/l$port "$where"; then
    kill $L 2>/dev/null
    bad "$n" "nothing listened on $port after 10 s"
    return
  fi
  t0=$(cut -d' ' -f1 /proc/uptime)
  echo "$word" | "$@" >/dev/null 2>/tmp/send.$n
  rc=$?
  # A sender its timeout killed (124, or 143 when the VM was so starved that SIGTERM came
  # first) never got to send: once more. A capture that sends it elsewhere fails both times.
  if { [ $rc = 124 ] || [ $rc = 143 ]; } && ! got /tmp/l$port "$word" && listen "$port" /tmp/l$port "$where"; then
    echo "$word" | "$@" >/dev/null 2>>/tmp/send.$n
    rc=$?
  fi
  if got /tmp/l$port "$word"; then ok "$n"; else
    bad "$n" "the listener got '$(cat /tmp/l$port 2>/dev/null)', not '$word' (sender exit $rc after $t0..$(cut -d' ' -f1 /proc/uptime) s uptime: $(tail -n 1 /tmp/send.$n))"
  fi
}
# Outbound: the app (root, not 1337) connects to 10.96.0.99:80, a Service address nothing answers;
# it must land on the proxy's 15001 inside the namespace.
outbound() { landing "$1" 15001 ns "out-$1" inns timeout 5 nc -w 3 10.96.0.99 80; }
# Inbound: the root namespace connects to the pod's 10.33.N.5:8080; must land on 15006.
inbound() { landing "$1" 15006 ns "in-$1" timeout 5 nc -w 3 10.33.$NS.5 8080; }
# The proxy's own traffic (UID 1337) is not captured: it reaches the root namespace's 10.33.N.1:8000.
bypass() { landing "$1" 8000 root "proxy-$1" inns su -s /bin/sh proxy -c "timeout 5 nc -w 3 10.33.$NS.1 8000"; }

# The sidecar's annotations, for redirect-cni's runtimeConfig.
STATUS='{\"initContainers\":[\"istio-validation\"],\"containers\":[\"istio-proxy\"],\"volumes\":[],\"imagePullSecrets\":null}'
cni() {
  CNI_COMMAND=$1 CNI_CONTAINERID=c0ffee CNI_NETNS=$NSP CNI_IFNAME=eth0 CNI_PATH=/opt/cni/bin \
    CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=u1" \
    "$BIN/redirect-cni" </tmp/cni.json
}

# The capture checks (the arm64 VM's since the start).
capture_checks() {
# ---- redirect-init, Istio's defaults (REDIRECT)
newns 1
check init_redirect_apply inns "$BIN/redirect-init" $ISTIO -m REDIRECT
inspect inspect_redirect $ISTIO -m REDIRECT
if guest; then
  check init_redirect_again inns "$BIN/redirect-init" $ISTIO -m REDIRECT # in place: nothing to do, exit 0
  probe probe_redirect $ISTIO -m REDIRECT
  outbound outbound_redirect_lands_15001
  inbound inbound_redirect_lands_15006
  bypass proxy_uid_not_captured
  check init_cleanup inns "$BIN/redirect-init" --cleanup-only
  if "$BIN/redirect-validate" inspect --netns $NSP --json >/tmp/insp.clean 2>&1 && grep -q '"table": null' /tmp/insp.clean; then
    ok cleanup_leaves_no_table
  else bad cleanup_leaves_no_table "$(cat /tmp/insp.clean)"; fi
  # Without rules nothing lands on 15001 (so a landing above was the capture's doing).
  listen 15001 /tmp/l15001
  echo "out-nocapture" | inns timeout 3 nc -w 1 10.96.0.99 80 >/dev/null 2>&1
  sleep 0.3
  kill $L 2>/dev/null
  if [ -s /tmp/l15001 ]; then bad outbound_without_rules_not_captured "15001 got '$(cat /tmp/l15001)'"; else ok outbound_without_rules_not_captured; fi
  # The probe must fail where no rule is: exit 126, diagnosis no_rules (its connections
  # refused). 10 s, not 2: a guest starved by four other TCG guests on two cores once got no
  # answer at all within 2 s, and the diagnosis then said "no answer" (rules_stale).
  inns su -s /bin/sh proxy -c "set -f; $BIN/redirect-validate --run-validation --skip-rule-apply --probe-timeout 10s $ISTIO" >/tmp/out.norules 2>&1
  rc=$?
  if [ $rc = 126 ] && grep -q no_rules /tmp/out.norules; then ok probe_without_rules_fails; else
    bad probe_without_rules_fails "exit $rc: $(tail -n 3 /tmp/out.norules | tr '\n' ' ')"
  fi
fi
dropns

# ---- redirect-init, TPROXY
newns 2
check init_tproxy_apply inns "$BIN/redirect-init" $ISTIO -m TPROXY
inspect inspect_tproxy $ISTIO -m TPROXY
if guest; then
  if inns ip rule | grep -q 'fwmark 0x539 lookup 133'; then ok tproxy_policy_rule; else bad tproxy_policy_rule "$(inns ip rule | tr '\n' ' ')"; fi
  probe probe_tproxy $ISTIO -m TPROXY
  outbound outbound_tproxy_lands_15001
fi
dropns

# ---- redirect-cni: ADD, CHECK, DEL with the sidecar's annotations in runtimeConfig
echo "{\"cniVersion\":\"1.0.0\",\"name\":\"podnet\",\"type\":\"redirect-cni\",\"proxy_uid\":1337,\"runtimeConfig\":{\"io.kubernetes.cri.pod-annotations\":{\"sidecar.istio.io/status\":\"$STATUS\"}}}" >/tmp/cni.json
echo "{\"sidecar.istio.io/status\":\"$STATUS\"}" >/tmp/annotations.json
newns 3
check cni_add cni ADD
grep -q '"cniVersion"' /tmp/out.cni_add || bad cni_add_output "$(cat /tmp/out.cni_add)"
inspect inspect_cni --annotations /tmp/annotations.json
if guest; then
  check cni_check cni CHECK
  probe probe_cni $ISTIO
  outbound outbound_cni_lands_15001
  inbound inbound_cni_lands_15006
  check cni_del cni DEL
  if "$BIN/redirect-validate" inspect --netns $NSP --json >/tmp/insp.del 2>&1 && grep -q '"table": null' /tmp/insp.del; then
    ok cni_del_leaves_no_table
  else bad cni_del_leaves_no_table "$(cat /tmp/insp.del)"; fi
  check cni_del_again cni DEL
fi
dropns

}

# Floor: the kernel lacks $VM_LEFT_OUT (left out of the initramfs). What needs it fails before
# changing anything, naming it; what does not need it works.
floor_checks() {
  newns 1
  rules_before=$(inns ip rule; inns ip -6 rule)
  inns "$BIN/redirect-init" $ISTIO -m TPROXY >/tmp/out.floor 2>/tmp/err.floor
  rc=$?
  if [ $rc != 0 ] && grep -q "$VM_LEFT_OUT" /tmp/err.floor && grep -q -- '--backend iptables' /tmp/err.floor; then
    ok "init_tproxy_fails_naming_$VM_LEFT_OUT (exit $rc: $(grep -m1 "$VM_LEFT_OUT" /tmp/err.floor))"
  else
    bad "init_tproxy_fails_naming_$VM_LEFT_OUT" "exit $rc, stderr: $(tail -n 5 /tmp/err.floor | tr '\n' ' ')"
  fi
  if [ "$(inns ip rule; inns ip -6 rule)" = "$rules_before" ] && [ -z "$(inns ip route show table 133 2>/dev/null)" ] \
    && "$BIN/redirect-validate" inspect --netns $NSP --json >/tmp/insp.floor 2>&1 && grep -q '"table": null' /tmp/insp.floor \
    && [ -z "$(inns nft list ruleset)" ]; then
    ok init_tproxy_failure_changes_nothing
  else
    bad init_tproxy_failure_changes_nothing "rules: $(inns ip rule | tr '\n' ' '); table 133: $(inns ip route show table 133 | tr '\n' ' '); ruleset: $(inns nft list ruleset | tr '\n' ' ')"
  fi
  # REDIRECT needs no tproxy: it works on this kernel.
  check init_redirect_apply inns "$BIN/redirect-init" $ISTIO -m REDIRECT
  outbound outbound_redirect_lands_15001
  dropns
  # The plugin, asked for TPROXY by the pod's annotation: an error naming the module, no table.
  echo "{\"cniVersion\":\"1.0.0\",\"name\":\"podnet\",\"type\":\"redirect-cni\",\"proxy_uid\":1337,\"runtimeConfig\":{\"io.kubernetes.cri.pod-annotations\":{\"sidecar.istio.io/status\":\"$STATUS\",\"sidecar.istio.io/interceptionMode\":\"TPROXY\"}}}" >/tmp/cni.json
  newns 2
  cni ADD >/tmp/out.floorcni 2>/tmp/err.floorcni
  rc=$?
  if [ $rc != 0 ] && grep -q "$VM_LEFT_OUT" /tmp/out.floorcni && "$BIN/redirect-validate" inspect --netns $NSP --json 2>/dev/null | grep -q '"table": null'; then
    ok "cni_tproxy_fails_naming_$VM_LEFT_OUT"
  else
    bad "cni_tproxy_fails_naming_$VM_LEFT_OUT" "exit $rc: $(cat /tmp/out.floorcni) $(tail -n 3 /tmp/err.floorcni | tr '\n' ' ')"
  fi
  dropns
}

# The workspace's kernel tests (amd64 guests: /tests, this machine's test executables), each
# executable a check: every test in it must run and pass on this kernel. Its kernel tests
# (#[kernel_test]) are ignored unless asked for: --include-ignored, and none may be ignored.
kernel_tests() {
  for n in $(ls /tests); do # (set -f: no globbing here)
    t=/tests/$n
    [ -x "$t" ] || continue
    t0=$(cut -d' ' -f1 /proc/uptime)
    # 8021q is loaded: branch_eni's layout must be a real VLAN there, not its stand-in.
    if (cd /tmp && REDIRECT_REQUIRE_VLAN=1 "$t" --include-ignored --test-threads=2) >/tmp/kt.$n 2>&1; then
      ignored=$(grep '^test result:' /tmp/kt.$n | grep -o '[0-9][0-9]* ignored' | awk '{ s += $1 } END { print s + 0 }')
      if [ "$ignored" != 0 ]; then
        bad "kernel_tests_$n" "$ignored test(s) ignored: $(grep -E '^test .* \.\.\. ignored' /tmp/kt.$n | head -n 20 | tr '\n' ' ')"
        continue
      fi
      ok "kernel_tests_$n ($(grep -o '[0-9]* passed' /tmp/kt.$n | awk '{ s += $1 } END { print s }') passed, $t0 s to $(cut -d' ' -f1 /proc/uptime) s)"
    else
      bad "kernel_tests_$n" "$(grep -E '^test .* FAILED|panicked|^---- ' /tmp/kt.$n | head -n 20 | tr '\n' ' ')"
      grep -A 15 '^---- ' /tmp/kt.$n | head -n 60 | sed "s/^/VM-LOG $n: /"
    fi
  done
}

if [ "$VM_MODE" = floor ]; then
  floor_checks
else
  capture_checks
  guest && kernel_tests
fi

echo "VM-TEST done $pass passed, $fail failed (uptime $(cut -d' ' -f1 /proc/uptime) s)"
if guest; then
  sync
  poweroff -f
fi
[ $fail = 0 ]
