//! Shared helpers for the kernel tests: root gating, throwaway namespaces that clean up after
//! themselves (also on panic), and `ip`/`nft`/`ethtool` as independent oracles.

#![allow(dead_code)]

use std::{
    process::Command,
    sync::atomic::{AtomicUsize, Ordering},
};

use hostnet::Netns;

/// True when the test may run. Without root it fails under CI (CI set) and skips, loudly,
/// only on a developer machine.
pub fn root_or_skip(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{test}: needs root (network namespaces, netlink writes) and CI is set: not skipping");
    }
    // Straight to the process's stderr: the test harness captures eprintln! of passing tests,
    // and a skip must be visible.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: needs root; CI would fail here instead of skipping");
    false
}

/// Runs a command and returns its stdout; panics with its stderr if it fails.
pub fn run(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("spawn {args:?}: {e}"));
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether a command succeeds (output discarded).
pub fn succeeds(args: &[&str]) -> bool {
    Command::new(args[0]).args(&args[1..]).output().map(|o| o.status.success()).unwrap_or(false)
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A named network namespace (`ip netns add`) deleted on drop.
pub struct TestNs {
    pub name: String,
    pub ns: Netns,
}

impl TestNs {
    pub fn new(tag: &str) -> TestNs {
        let name = format!("hn{}-{}-{}", std::process::id(), tag, COUNTER.fetch_add(1, Ordering::Relaxed));
        run(&["ip", "netns", "add", &name]);
        // Constructed before opening so a failed open still deletes the namespace.
        let guard = Deleter(name.clone());
        let ns = Netns::open(format!("/var/run/netns/{name}")).expect("open test netns");
        std::mem::forget(guard);
        TestNs { name, ns }
    }

    /// `ip -n NAME -j ARGS...` parsed as JSON.
    pub fn ip_json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = vec!["ip", "-n", &self.name, "-j"];
        a.extend_from_slice(args);
        let out = run(&a);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{a:?}: bad JSON {e}: {out}"))
    }

    /// `ip -n NAME ARGS...`.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut a = vec!["ip", "-n", &self.name];
        a.extend_from_slice(args);
        run(&a)
    }

    /// `ip netns exec NAME ARGS...`.
    pub fn exec(&self, args: &[&str]) -> String {
        let mut a = vec!["ip", "netns", "exec", &self.name];
        a.extend_from_slice(args);
        run(&a)
    }

    pub fn exec_ok(&self, args: &[&str]) -> bool {
        let mut a = vec!["ip", "netns", "exec", &self.name];
        a.extend_from_slice(args);
        succeeds(&a)
    }

    /// The single link called `name`, from `ip -j link show`, or None.
    pub fn link(&self, name: &str) -> Option<serde_json::Value> {
        let all = self.ip_json(&["link", "show"]);
        all.as_array()?.iter().find(|l| l["ifname"] == name).cloned()
    }

    /// IPv4 addresses (addr/prefix) on `dev`.
    pub fn addrs(&self, dev: &str) -> Vec<String> {
        let v = self.ip_json(&["-4", "addr", "show", "dev", dev]);
        let mut out = Vec::new();
        for l in v.as_array().into_iter().flatten() {
            for a in l["addr_info"].as_array().into_iter().flatten() {
                out.push(format!("{}/{}", a["local"].as_str().unwrap_or("?"), a["prefixlen"]));
            }
        }
        out
    }

    /// IPv4 main-table routes.
    pub fn routes(&self) -> Vec<serde_json::Value> {
        self.ip_json(&["-4", "route", "show", "table", "main"]).as_array().cloned().unwrap_or_default()
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

struct Deleter(String);

impl Drop for Deleter {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// Finds a route by destination as `ip -j route` prints it ("default" or "a.b.c.d/n").
pub fn route<'a>(routes: &'a [serde_json::Value], dst: &str) -> Option<&'a serde_json::Value> {
    routes.iter().find(|r| r["dst"] == dst)
}

/// The pod interface the pod tests ask for: `eth0`, 10.128.0.`host`/23 with openshift-sdn's
/// MAC for it, MTU 1400, gateway 10.128.0.1, cluster network 10.128.0.0/14.
pub fn pod_cfg(host: u8) -> hostnet::PodConfig {
    hostnet::PodConfig {
        ifname: "eth0".into(),
        mac: Some(format!("0a:58:0a:80:00:{host:02x}").parse().unwrap()),
        mtu: 1400,
        ipv4: Some(hostnet::PodIpv4 {
            address: format!("10.128.0.{host}/23").parse().unwrap(),
            gateway: "10.128.0.1".parse().unwrap(),
            cluster_network: "10.128.0.0/14".parse().unwrap(),
            extra_routes: vec![],
        }),
        host_ifname: None,
        ipv6: None,
    }
}

impl TestNs {
    /// `ethtool -k DEV`'s tx-checksumming state ("on", "off"), inside the namespace.
    pub fn tx_checksumming(&self, dev: &str) -> String {
        let out = self.exec(&["ethtool", "-k", dev]);
        out.lines()
            .find_map(|l| l.trim().strip_prefix("tx-checksumming:"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| panic!("no tx-checksumming in ethtool -k output: {out}"))
    }
}
