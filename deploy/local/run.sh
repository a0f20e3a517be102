#!/usr/bin/env bash
# The main job: a node networked by sdn-node, shown working with real packets.
#
# Installs Open vSwitch if missing, builds sdn-node and its CNI plugin sdn-node-cni (release),
# starts ovsdb-server and ovs-vswitchd (userspace datapath) in a temporary directory and their
# own network namespace (the "node"; its tap devices, tun0, routes and nftables vanish with it),
# runs `sdn-node run` inside that namespace with a multitenant cluster state, waits for the CNI
# configuration it writes once it serves pods, then creates four pods as network namespaces
# through the plugin, executed the way container runtimes execute it (CNI_* environment, the
# conflist's plugin configuration on stdin). It prints a connectivity matrix measured with
# ping, compares it with what multitenant isolation should give, traces one blocked pair with
# `sdn-node trace`, deletes every pod through the plugin and stops everything again.
# Exits non-zero if the matrix differs from the expectation. Needs root.
#
#   deploy/local/run.sh [--state FILE] [--keep]
#     --state FILE  the cluster state the agent runs with, instead of the generated one: it must
#                   give node-a's HostSubnet and netNamespaces default, team-a and team-b
#                   (the expectation follows its plugin and netids). A dual-stack state
#                   (deploy/examples/dual-stack.yaml) gives every pod an address of each family:
#                   the matrix is printed and checked for IPv4 and for IPv6, and the blocked pair
#                   traced in both. An IPv6-only state (deploy/examples/ipv6-only.yaml) gives
#                   every pod one IPv6 address and nothing IPv4: the IPv6 matrix, checked, and
#                   the trace (of an IPv6 packet)
#     --keep        leave the node, the agent and the pods running and print how to use and
#                   stop them (no DEL)
#   SDN_NODE_BIN_DIR=DIR  use sdn-node and sdn-node-cni from DIR instead of building release
#                   binaries (the test command passes its debug build)
set -euo pipefail
cd "$(dirname "$0")/../.."
STATE=
KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --state) STATE=$(realpath "$2"); shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" != 0 ]; then
  echo "run.sh needs root (network namespaces, Open vSwitch, the agent's host networking)" >&2
  exit 1
fi
T0=$(date +%s%N)
# elapsed START [END]: seconds between two `date +%s%N` readings (END: now), e.g. 8.147.
elapsed() { local ms=$(( (${2:-$(date +%s%N)} - $1) / 1000000 )); printf '%d.%03d' $((ms / 1000)) $((ms % 1000)); }

. deploy/local/packages.sh
ensure_packages
if [ -n "${SDN_NODE_BIN_DIR:-}" ]; then
  BIN_DIR=$(realpath "$SDN_NODE_BIN_DIR")
else
  cargo build --release --locked -p sdn-node --bin sdn-node -p sdn-node-cni --bin sdn-node-cni
  BIN_DIR=$(realpath "${CARGO_TARGET_DIR:-target}/release")
fi
for b in sdn-node sdn-node-cni; do
  [ -x "$BIN_DIR/$b" ] || { echo "no $b in $BIN_DIR" >&2; exit 1; }
done
BIN=$BIN_DIR/sdn-node
T1=$(date +%s%N)

D=$(mktemp -d /tmp/sdn-node-demo.XXXXXX)
NS=sdn-node-demo-$$
SOCK=$D/cni.sock
CONF_DIR=$D/net.d
CONFLIST=$CONF_DIR/80-sdn-node.conflist
AGENT_PID=
# The pods: namespace/name; their network namespaces are $NS-<name>.
PODS=(team-a/a1 team-a/a2 team-b/b1 default/d1)
# The gateways (tun0) of each family, from the CNI results.
GATEWAY=
GATEWAY6=

stop() {
  if [ -n "$AGENT_PID" ]; then
    kill "$AGENT_PID" 2>/dev/null || true
    wait "$AGENT_PID" 2>/dev/null || true
  fi
  for p in "${PODS[@]}"; do ip netns del "$NS-${p#*/}" 2>/dev/null || true; done
  for p in "$D/v.pid" "$D/s.pid"; do
    [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true
  done
  ip netns del "$NS" 2>/dev/null || true
  rm -rf "$D"
}
[ "$KEEP" = 1 ] || trap stop EXIT
fail() {
  echo "run.sh: $*" >&2
  echo "-- agent log (last 30 lines):" >&2
  tail -n 30 "$D/agent.log" >&2 2>/dev/null || true
  exit 1
}

if [ -z "$STATE" ]; then
  STATE=$D/state.yaml
  cat >"$STATE" <<'EOT'
# Written by deploy/local/run.sh. This node is node-a; its pods get addresses from its HostSubnet.
node: node-a
plugin: multitenant
clusterNetwork: 10.128.0.0/14
serviceNetwork: 172.30.0.0/16
hostSubnets:
  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.0.0/23}
  - {host: node-b, hostIP: 172.17.0.3, subnet: 10.128.2.0/23}
netNamespaces:
  - {name: default, netid: 0}
  - {name: team-a, netid: 11}
  - {name: team-b, netid: 12}
EOT
fi

# The node: Open vSwitch in its own network namespace.
export OVS_RUNDIR=$D OVS_LOGDIR=$D OVS_DBDIR=$D OVS_SYSCONFDIR=$D
ip netns add "$NS"
ip netns exec "$NS" ip link set lo up
ovsdb-tool create "$D/conf.db" /usr/share/openvswitch/vswitch.ovsschema
ip netns exec "$NS" ovsdb-server -vconsole:off "$D/conf.db" --remote="punix:$D/db.sock" --pidfile="$D/s.pid" \
  --detach --log-file="$D/s.log"
ip netns exec "$NS" ovs-vswitchd -vconsole:off "unix:$D/db.sock" --pidfile="$D/v.pid" --detach \
  --log-file="$D/v.log" --disable-system

# The agent, inside the node's namespace (tun0, routes, sysctls and nftables are the node's).
echo "== sdn-node run (in network namespace $NS), state $STATE"
RUST_LOG=info NO_COLOR=1 ip netns exec "$NS" "$BIN" run --state "$STATE" --ovs-rundir "$D" \
  --datapath-type netdev --pod-api-socket "$SOCK" --cni-conf-dir "$CONF_DIR" --metrics-addr none \
  --state-dir "$D/sdn-node-state" </dev/null >"$D/agent.log" 2>&1 &
AGENT_PID=$!
for _ in $(seq 600); do
  [ -f "$CONFLIST" ] && break
  kill -0 "$AGENT_PID" 2>/dev/null || fail "the agent exited"
  sleep 0.1
done
[ -f "$CONFLIST" ] || fail "no $CONFLIST after 60 s"
echo "== the agent serves pods: it wrote $CONFLIST"

# The plugin as a runtime has it: in a CNI_PATH directory, installed by copy + rename.
mkdir "$D/cni-bin"
cp "$BIN_DIR/sdn-node-cni" "$D/cni-bin/.sdn-node-cni.tmp"
mv "$D/cni-bin/.sdn-node-cni.tmp" "$D/cni-bin/sdn-node-cni"
# What libcni gives the plugin on stdin: the conflist's plugin object with the list's
# cniVersion and name added.
python3 - "$CONFLIST" >"$D/plugin.json" <<'EOT'
import json, sys
conf = json.load(open(sys.argv[1]))
assert len(conf["plugins"]) == 1, conf
plugin = dict(conf["plugins"][0], cniVersion=conf["cniVersion"], name=conf["name"])
assert plugin["type"] == "sdn-node-cni", plugin
print(json.dumps(plugin))
EOT

# cni COMMAND NAMESPACE/NAME: runs the plugin as a runtime does; its stdout goes to stdout.
cni() {
  local ns=${2%/*} name=${2#*/}
  CNI_COMMAND=$1 CNI_CONTAINERID=$(printf '%s' "$2" | sha256sum | cut -c1-64) \
    CNI_NETNS=/var/run/netns/$NS-$name CNI_IFNAME=eth0 CNI_PATH=$D/cni-bin \
    CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=$ns;K8S_POD_NAME=$name" \
    "$D/cni-bin/sdn-node-cni" <"$D/plugin.json"
}

declare -A IP IP6
for p in "${PODS[@]}"; do
  ip netns add "$NS-${p#*/}"
  out=$(cni ADD "$p") || fail "ADD $p: $out"
  # The CNI result's `ips`: one entry per family (a dual-stack node gives both), each with
  # its gateway. Prints "address gateway address6 gateway6" (the IPv6 pair "- -" if none).
  read -r a4 g4 a6 g6 < <(printf '%s' "$out" | python3 -c '
import json, sys
ips = json.load(sys.stdin)["ips"]
v4 = [i for i in ips if ":" not in i["address"]]
v6 = [i for i in ips if ":" in i["address"]]
pair = lambda l: (l[0]["address"], l[0].get("gateway", "-")) if l else ("-", "-")
print(*pair(v4), *pair(v6))')
  [ "$a4" != - ] || [ "$a6" != - ] || fail "ADD $p: no address in the result: $out"
  if [ "$a4" != - ]; then IP[$p]=${a4%/*}; GATEWAY=$g4; fi
  if [ "$a6" != - ]; then IP6[$p]=${a6%/*}; GATEWAY6=$g6; fi
  shown=("${IP[$p]:+$a4}" "${IP6[$p]:+$a6}")
  echo "== CNI ADD $p: eth0 ${shown[*]} in /var/run/netns/$NS-${p#*/}"
done

# Namespace -> VNID and the plugin, from the state file (flow or block style lists).
declare -A VNID
eval "$(python3 - "$STATE" <<'EOT'
import re, sys
plugin, section, items = "subnet", None, []
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].rstrip()
    if not line:
        continue
    m = re.match(r"^(\w+):\s*(.*)$", line)
    if m:
        section = m.group(1)
        if section == "plugin":
            plugin = m.group(2).strip()
        continue
    if section == "netNamespaces":
        if re.match(r"^\s*-", line):
            items.append("")
        if items:
            items[-1] += " " + line
print(f"PLUGIN={plugin}")
for item in items:
    name = re.search(r"\bname:\s*([\w.-]+)", item)
    netid = re.search(r"\bnetid:\s*(\d+)", item)
    if name and netid:
        print(f"VNID[{name.group(1)}]={netid.group(1)}")
EOT
)"
for p in "${PODS[@]}"; do
  [ -n "${VNID[${p%/*}]:-}" ] || fail "the state has no netid for namespace ${p%/*}"
done
# Whether a packet from namespace $1 should reach namespace $2.
expected() {
  [ "$PLUGIN" != multitenant ] && return 0
  local a=${VNID[$1]} b=${VNID[$2]}
  [ "$a" = "$b" ] || [ "$a" = 0 ] || [ "$b" = 0 ]
}

# matrix FAMILY: every ping of one family (4 or 6) at once (blocked ones wait out their
# second), each result in a file, then the table checked against the expectation.
mismatches=0
matrix() {
  local fam=$1 gw i j to addr got want mark from cells=0 bad=0 arr=IP
  gw=$GATEWAY W=13
  if [ "$fam" = 6 ]; then arr=IP6; gw=$GATEWAY6; W=20; fi
  local -n ADDR=$arr
  local T2
  T2=$(date +%s%N)
  mkdir -p "$D/ping$fam"
  COLS=("${PODS[@]}" gateway)
  PINGS=()
  for i in "${!PODS[@]}"; do
    for j in "${!COLS[@]}"; do
      [ "$i" = "$j" ] && continue
      to=${COLS[$j]}
      addr=$gw
      [ "$to" = gateway ] || addr=${ADDR[$to]}
      ( if ip netns exec "$NS-${PODS[$i]#*/}" ping -"$fam" -c1 -W1 -q "$addr" >/dev/null 2>&1; then
          echo 1; else echo 0; fi >"$D/ping$fam/$i-$j" ) &
      PINGS+=($!)
    done
  done
  wait "${PINGS[@]}"
  PING_S=$(elapsed "$T2")

  echo
  echo "Connectivity (IPv$fam): ping -$fam -c1 -W1 from the row's pod to the column's address (✓ reply, ✗ none;"
  echo "a cell marked ! differs from the expectation)."
  printf '%-17s' "from \\ to"
  for c in "${COLS[@]}"; do printf '%-*s' "$W" "$c"; done
  echo
  printf '%-17s' ""
  for c in "${COLS[@]}"; do
    if [ "$c" = gateway ]; then printf '%-*s' "$W" "$gw"; else printf '%-*s' "$W" "${ADDR[$c]}"; fi
  done
  echo
  for i in "${!PODS[@]}"; do
    from=${PODS[$i]}
    printf '%-17s' "$from (${VNID[${from%/*}]})"
    for j in "${!COLS[@]}"; do
      if [ "$i" = "$j" ]; then cell "·" 1; continue; fi
      to=${COLS[$j]}
      got=$(cat "$D/ping$fam/$i-$j")
      want=1
      [ "$to" = gateway ] || expected "${from%/*}" "${to%/*}" || want=0
      mark=✗; [ "$got" = 1 ] && mark=✓
      cells=$((cells + 1))
      if [ "$got" != "$want" ]; then
        cell "$mark!" 2; bad=$((bad + 1))
      else
        cell "$mark" 1
      fi
    done
    echo
  done
  if [ "$bad" = 0 ]; then
    echo "Result (IPv$fam): as expected, $cells of $cells pairs (the pings took ${PING_S}s, all at once)."
  else
    echo "Result (IPv$fam): NOT as expected, $bad of $cells pairs differ."
  fi
  mismatches=$((mismatches + bad))
}
# cell TEXT WIDTH: TEXT padded to $W columns (printf pads bytes, and ✓ is three).
W=13
cell() { printf '%s%*s' "$1" $((W - $2)) ''; }
if [ "$PLUGIN" = multitenant ]; then
  echo
  echo "Expected (multitenant; VNIDs in parentheses): the same VNID reaches, another VNID is blocked,"
  echo "VNID 0 reaches every pod and is reached by every pod, every pod reaches the gateway (tun0)."
else
  echo
  echo "Expected (plugin $PLUGIN): every pod reaches every pod and the gateway (tun0)."
fi
# An IPv4 or dual-stack node: the IPv4 matrix; an IPv6-only node has no IPv4 at all.
if [ -n "$GATEWAY" ]; then
  for p in "${PODS[@]}"; do [ -n "${IP[$p]:-}" ] || fail "$p has no IPv4 address on a node with IPv4"; done
  matrix 4
fi
# A dual-stack or IPv6-only node (the state gives it an IPv6 subnet): the matrix over IPv6.
if [ -n "$GATEWAY6" ]; then
  for p in "${PODS[@]}"; do [ -n "${IP6[$p]:-}" ] || fail "$p has no IPv6 address on a node with IPv6"; done
  matrix 6
fi
if [ -z "$GATEWAY" ]; then
  # IPv6-only: no pod may have an IPv4 address or route in its sandbox.
  for p in "${PODS[@]}"; do
    v4=$(ip netns exec "$NS-${p#*/}" ip -4 -o addr show dev eth0)
    [ -z "$v4" ] || fail "$p has an IPv4 address on an IPv6-only node: $v4"
  done
  echo "IPv6-only: no pod has an IPv4 address."
fi

# Why a blocked pair is blocked: the switch's own trace, with the owner of the dropping flow
# (on an IPv6-only node the trace between names is an IPv6 packet).
echo
echo "== sdn-node trace --from team-a/a1 --to team-b/b1"
trace=$("$BIN" trace --from team-a/a1 --to team-b/b1 --ovs-rundir "$D" --state "$STATE" --socket "$SOCK") \
  || fail "sdn-node trace failed: $trace"
echo "$trace"
if [ "$PLUGIN" = multitenant ] && ! expected team-a team-b; then
  grep -q '^verdict: DROPPED' <<<"$trace" || { echo "Result: the trace does not say DROPPED"; mismatches=$((mismatches + 1)); }
fi
if [ -n "$GATEWAY6" ] && [ -n "$GATEWAY" ]; then
  # The same pair over IPv6: the verdict must be the same.
  echo
  echo "== sdn-node trace --ipv6 --from team-a/a1 --to team-b/b1 (verdict)"
  trace6=$("$BIN" trace --ipv6 --from team-a/a1 --to team-b/b1 --ovs-rundir "$D" --state "$STATE" --socket "$SOCK") \
    || fail "sdn-node trace --ipv6 failed: $trace6"
  grep -E '^(trace br0|verdict):' <<<"$trace6"
  if [ "$PLUGIN" = multitenant ] && ! expected team-a team-b; then
    grep -q '^verdict: DROPPED' <<<"$trace6" || { echo "Result: the IPv6 trace does not say DROPPED"; mismatches=$((mismatches + 1)); }
  fi
fi

if [ "$KEEP" = 1 ]; then
  cat >&2 <<EOT

Everything keeps running in $D: the node is network namespace $NS (agent pid $AGENT_PID,
log $D/agent.log), the pods are network namespaces $NS-<name>.
  ip netns exec $NS-a1 ping -c1 ${IP[team-b/b1]:-${IP6[team-b/b1]:-}}
  $BIN trace --from team-a/a1 --to team-b/b1 --ovs-rundir $D --state $STATE --socket $SOCK
  $BIN status --socket $SOCK
  $BIN dump-flows --ovs-rundir $D [--table N] [--owner pod/team-a/a1]
Stop it with:
  kill $AGENT_PID; kill \$(cat $D/v.pid) \$(cat $D/s.pid)
  for n in a1 a2 b1 d1; do ip netns del $NS-\$n; done; ip netns del $NS; rm -rf $D
EOT
else
  echo
  for p in "${PODS[@]}"; do
    out=$(cni DEL "$p") || fail "DEL $p: $out"
    ip netns del "$NS-${p#*/}"
  done
  echo "== CNI DEL ${PODS[*]}: done"
  left=$(ip netns exec "$NS" ip -o link show type veth | wc -l)
  [ "$left" = 0 ] || fail "$left veths left on the node after DEL"
fi
echo "Took $(elapsed "$T0")s in all: $(elapsed "$T0" "$T1")s to install and build, $(elapsed "$T1")s for the demo."
[ "$mismatches" = 0 ]
