#!/usr/bin/env bash
# The main job: sdn-node on a private Open vSwitch with an example cluster state.
#
# Installs Open vSwitch if missing, builds sdn-node, starts ovsdb-server and ovs-vswitchd
# (userspace datapath) in a temporary directory and their own network namespace (so the tap
# devices of the userspace datapath vanish with it), runs `sdn-node apply` on the state file,
# prints what the switch holds with `sdn-node dump-flows`, and stops everything again.
#
#   deploy/local/run.sh [--state FILE] [--keep]
#     --state FILE  cluster state to apply (default deploy/examples/cluster.yaml)
#     --keep        leave the switch running and print how to use and stop it
set -euo pipefail
cd "$(dirname "$0")/../.."
STATE=deploy/examples/cluster.yaml
KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --state) STATE=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
. deploy/local/packages.sh
ensure_packages
cargo build --release --locked --bin sdn-node
BIN=$PWD/target/release/sdn-node

D=$(mktemp -d /tmp/sdn-node-demo.XXXXXX)
NS=sdn-node-demo-$$
stop() {
  for p in "$D/v.pid" "$D/s.pid"; do
    [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true
  done
  ip netns del "$NS" 2>/dev/null || true
  rm -rf "$D"
}
[ "$KEEP" = 1 ] || trap stop EXIT

export OVS_RUNDIR=$D OVS_LOGDIR=$D OVS_DBDIR=$D OVS_SYSCONFDIR=$D
ip netns add "$NS"
ovsdb-tool create "$D/conf.db" /usr/share/openvswitch/vswitch.ovsschema
ip netns exec "$NS" ovsdb-server "$D/conf.db" --remote="punix:$D/db.sock" --pidfile="$D/s.pid" \
  --detach --log-file="$D/s.log"
ip netns exec "$NS" ovs-vswitchd "unix:$D/db.sock" --pidfile="$D/v.pid" --detach \
  --log-file="$D/v.log" --disable-system

echo "== sdn-node apply --state $STATE" >&2
set +e
"$BIN" apply --state "$STATE" --ovs-rundir "$D" --datapath-type netdev
rc=$?
set -e
echo "== sdn-node dump-flows" >&2
"$BIN" dump-flows --ovs-rundir "$D"
if [ "$KEEP" = 1 ]; then
  cat >&2 <<EOT

The switch keeps running in $D (network namespace $NS).
  $BIN dump-flows --ovs-rundir $D [--table N] [--owner pod/team-a/a1]
  $BIN apply --state FILE --ovs-rundir $D --datapath-type netdev
Stop it with:
  kill \$(cat $D/v.pid) \$(cat $D/s.pid); ip netns del $NS; rm -rf $D
EOT
fi
exit $rc
