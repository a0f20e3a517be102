#!/usr/bin/env bash
# The test command: installs Open vSwitch (and ping, ip) if missing, then runs clippy and every
# test of the workspace with warnings denied. Tests start their own private ovsdb-server and
# ovs-vswitchd in temporary directories (and network namespaces for real-packet tests); they
# need root for `ip netns`. Last, the main job (deploy/local/run.sh: pods through the CNI plugin,
# pings by VNID, a trace) with the debug binaries the tests just built.
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/local/packages.sh
ensure_packages
export RUSTFLAGS="${RUSTFLAGS:-} -D warnings"
# One build from a clean clone: incremental state would only take disk (CI's linker once died of
# a full disk). The free space is printed at each step so a next failure says whether it was that.
export CARGO_INCREMENTAL=0
df -h . | tail -1 >&2   # target/ may not exist yet on a clean clone
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
df -h . | tail -1 >&2
# Benchmarks are not run here (shared, noisy machines), only compiled.
cargo bench --workspace --locked --no-run
# The demo must work too. It needs root; under CI (CI set) it runs regardless, and fails.
if [ "$(id -u)" = 0 ] || [ -n "${CI:-}" ]; then
  SDN_NODE_BIN_DIR="${CARGO_TARGET_DIR:-target}/debug" bash deploy/local/run.sh
  # And dual-stack: every pod with an address of each family, both matrices checked.
  SDN_NODE_BIN_DIR="${CARGO_TARGET_DIR:-target}/debug" bash deploy/local/run.sh --state deploy/examples/dual-stack.yaml
  # And IPv6-only: one IPv6 address per pod, nothing IPv4, the IPv6 matrix checked.
  SDN_NODE_BIN_DIR="${CARGO_TARGET_DIR:-target}/debug" bash deploy/local/run.sh --state deploy/examples/ipv6-only.yaml
else
  echo "SKIPPED deploy/local/run.sh: needs root" >&2
fi
