#!/usr/bin/env bash
# The test command: installs Open vSwitch (and ping, ip) if missing, then runs clippy and every
# test of the workspace with warnings denied. Tests start their own private ovsdb-server and
# ovs-vswitchd in temporary directories (and network namespaces for real-packet tests); they
# need root for `ip netns`.
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/local/packages.sh
ensure_packages
export RUSTFLAGS="${RUSTFLAGS:-} -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
# Benchmarks are not run here (shared, noisy machines), only compiled.
cargo bench --workspace --locked --no-run
