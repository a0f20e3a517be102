//! Shared test support: a private Open vSwitch with a bridge, and ovs-ofctl as the oracle.
#![allow(dead_code)]

pub mod agent;
pub mod cninode;
pub mod controller;
pub mod fake_kube;
pub mod inproc;
pub mod netpol_eval;
pub mod netpol_state;
pub mod nodes;
pub mod probe;
pub mod sctp;
pub mod traffic;

use std::net::Ipv4Addr;
use std::process::Command;

use openflow::{Action, FlowMod, Ipv4Match, Masked, Match};
use sdn_harness::sandbox::{OvsSandbox, SandboxOptions};

/// A sandbox with bridge `br0` (datapath_type=dummy, secure, OpenFlow13).
pub async fn sandbox_with_bridge() -> OvsSandbox {
    let sb = OvsSandbox::start(SandboxOptions::default()).await.expect("start ovs sandbox");
    sb.add_bridge("br0", "dummy").await.expect("add br0");
    sb
}

pub fn mgmt(sb: &OvsSandbox) -> String {
    format!("unix:{}", sb.mgmt_socket("br0").display())
}

/// Runs `ovs-ofctl -O OpenFlow13 ARGS` against the sandbox; panics with stderr on failure.
pub fn ofctl(sb: &OvsSandbox, args: &[&str]) -> String {
    let (ok, out, err) = ofctl_status(sb, args);
    assert!(ok, "ovs-ofctl {args:?} failed: {err}");
    out
}

pub fn ofctl_status(sb: &OvsSandbox, args: &[&str]) -> (bool, String, String) {
    let out = Command::new("ovs-ofctl")
        .arg("-O")
        .arg("OpenFlow13")
        .args(args)
        .envs(sb.ovs_env())
        .output()
        .expect("run ovs-ofctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The flow lines of `dump-flows --no-stats`, sorted, without the reply header.
pub fn dump_sorted(sb: &OvsSandbox, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["dump-flows", "--no-stats", "--no-names"];
    args.extend_from_slice(extra);
    args.push("br0");
    let mut v: Vec<String> = ofctl(sb, &args)
        .lines()
        .filter(|l| !l.starts_with("OFPST_FLOW") && !l.trim().is_empty())
        .map(|l| l.trim().to_string())
        .collect();
    v.sort();
    v
}

/// `table=70, priority=100, ip, nw_dst=<ip i>, actions=load:vnid->REG1, load:port->REG2, goto_table:80`:
/// the seed's per-pod IP delivery flow, for load tests.
pub fn pod_flow(i: u32) -> FlowMod {
    let ip = Ipv4Addr::from(0x0a80_0000 + i);
    FlowMod::add(
        70,
        100,
        Match::any().ipv4(Ipv4Match { dst: Some(Masked::exact(ip)), ..Default::default() }),
        vec![Action::load_reg(1, i % 4096), Action::load_reg(2, 3 + i % 60000)],
        Some(80),
    )
}
