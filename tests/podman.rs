//! Containers that Kubernetes does not run (issue 34 items 4 and 5): Debian's podman (4.3, CNI
//! backend, runc) starts containers on sdn-node networks, calling the real `sdn-node-cni`
//! from the networks' conflists, served by `sdn-node run` on a netdev switch (the node of
//! tests/support/cninode.rs, in its own network namespace; podman runs in the host's and hands
//! the agent its containers' namespaces by path).
//!
//! podman runs with its own containers.conf and storage.conf (CONTAINERS_CONF,
//! CONTAINERS_STORAGE_CONF) in a temporary directory: runc, cgroupfs, explicit ulimits, file
//! locks and a private tmp_dir, storage and image, so nothing of the machine's podman is used
//! or changed. The image is one static busybox (Debian's busybox-static), imported offline.
//! Without root, podman, runc, the busybox or a container that runs, the test fails under CI
//! (`CI` set) and is skipped with the reason otherwise.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;
use support::cninode::*;

/// The image: a static busybox at /bin/busybox, nothing else.
const IMAGE: &str = "localhost/sdn-node-test-busybox:latest";
const BUSYBOX: &str = "/bin/busybox";

fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

/// podman with the test's own configuration (nothing of /etc/containers is read).
struct Podman {
    dir: PathBuf,
    /// podman's tmp_dir (per-boot state and file locks): on /run, a tmpfs, as it must be.
    run_dir: PathBuf,
    conf: PathBuf,
    storage: PathBuf,
}

impl Podman {
    /// Writes the configuration (`plugins` is the CNI bin directory, `networks` the conflist
    /// directory) and imports the image; `Err` says why podman cannot run containers here.
    fn new(plugins: &Path, networks: &Path) -> Result<Podman, String> {
        for tool in ["podman", "runc"] {
            let found =
                Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().map(|o| o.status.success());
            if !found.unwrap_or(false) {
                return Err(format!("{tool} is not installed (deploy/local/packages.sh installs it)"));
            }
        }
        if !Path::new(BUSYBOX).exists() {
            return Err(format!(
                "{BUSYBOX} is missing (Debian's busybox-static; deploy/local/packages.sh installs it)"
            ));
        }
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("podman-{}", std::process::id()));
        let run_dir = PathBuf::from(format!("/run/sdn-node-test-podman-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("image/bin")).map_err(|e| format!("{}: {e}", dir.display()))?;
        std::fs::create_dir_all(&run_dir).map_err(|e| format!("{}: {e}", run_dir.display()))?;
        let conf = dir.join("containers.conf");
        let storage = dir.join("storage.conf");
        // Ulimits within this machine's hard limits (podman's defaults exceed them), cgroupfs
        // and runc (crun fails on hybrid cgroups); file locks in the private tmp_dir, so that
        // this podman never frees the locks of the machine's own (shm locks are shared).
        let text = format!(
            "[containers]\ndefault_ulimits = [\"nofile=1024:1024\", \"nproc=1024:1024\"]\n\n\
             [engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n\
             lock_type = \"file\"\ntmp_dir = \"{}\"\n\n\
             [network]\nnetwork_backend = \"cni\"\ncni_plugin_dirs = [\"{}\"]\nnetwork_config_dir = \"{}\"\n",
            run_dir.display(),
            plugins.display(),
            networks.display()
        );
        std::fs::write(&conf, text).map_err(|e| e.to_string())?;
        let text = format!(
            "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
            dir.join("storage").display(),
            run_dir.join("storage").display()
        );
        std::fs::write(&storage, text).map_err(|e| e.to_string())?;
        let p = Podman { dir, run_dir, conf, storage };
        std::fs::copy(BUSYBOX, p.dir.join("image/bin/busybox")).map_err(|e| format!("copy {BUSYBOX}: {e}"))?;
        let tar = p.dir.join("image.tar");
        let out = sh(&["tar", "-C", &p.dir.join("image").to_string_lossy(), "-cf", &tar.to_string_lossy(), "bin"]);
        if !out.status.success() {
            return Err(format!("tar: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let out = p.run(&["import", &tar.to_string_lossy(), IMAGE]);
        if !out.status.success() {
            return Err(format!("podman import: {}", String::from_utf8_lossy(&out.stderr)));
        }
        // A container that runs at all (no network): the runtime, cgroups and ulimits work.
        let out = p.run(&["run", "--rm", "--network", "none", IMAGE, BUSYBOX, "true"]);
        if !out.status.success() {
            return Err(format!("podman cannot run a container here: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(p)
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("podman")
            .env("CONTAINERS_CONF", &self.conf)
            .env("CONTAINERS_STORAGE_CONF", &self.storage)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("podman {args:?}: {e}"))
    }

    /// `podman run -d` of a container on `network` that sleeps; returns its ID or podman's error.
    fn start(&self, name: Option<&str>, network: &str) -> Result<String, String> {
        let mut args = vec!["run", "-d", "--network", network, "--cap-add", "NET_RAW"];
        if let Some(n) = name {
            args.extend(["--name", n]);
        }
        args.extend([IMAGE, BUSYBOX, "sleep", "3600"]);
        let out = self.run(&args);
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// The container's IPv4 address on eth0, as the container itself sees it.
    fn addr(&self, ctr: &str) -> String {
        let out = self.run(&["exec", ctr, BUSYBOX, "ip", "-4", "-o", "addr", "show", "eth0"]);
        let text = String::from_utf8_lossy(&out.stdout);
        let cidr = text.split_whitespace().skip_while(|w| *w != "inet").nth(1).unwrap_or_default();
        assert!(cidr.ends_with("/23"), "{ctr}: eth0 has {text:?} {}", String::from_utf8_lossy(&out.stderr));
        cidr.trim_end_matches("/23").to_string()
    }

    /// Whether `from` gets an answer from `to` (one echo, up to three tries: the first may be
    /// spent on ARP).
    fn ping(&self, from: &str, to: &str, tries: u32) -> bool {
        (0..tries).any(|_| self.run(&["exec", from, BUSYBOX, "ping", "-c", "1", "-W", "2", to]).status.success())
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.run(&["rm", "-a", "-f", "-t", "0"]);
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

/// The agent's pods, `namespace/name`, from `sdn-node pod list -o json` (the pod API).
fn api_pods(node: &CniNode) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_sdn-node"))
        .args(["pod", "list", "-o", "json", "--socket"])
        .arg(&node.agent.socket)
        .output()
        .expect("sdn-node pod list");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "pod list: {text}{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("pod list -o json: {e}: {text}"));
    let list = v.as_array().or_else(|| v["pods"].as_array()).cloned().unwrap_or_default();
    let mut pods: Vec<String> = list
        .iter()
        .map(|p| format!("{}/{}", p["namespace"].as_str().unwrap_or("?"), p["name"].as_str().unwrap_or("?")))
        .collect();
    pods.sort();
    pods
}

/// The pods in the agent's checkpoint.
fn checkpointed(node: &CniNode) -> Vec<String> {
    let mut pods: Vec<String> = node
        .agent
        .checkpointed()
        .values()
        .map(|p| format!("{}/{}", p["namespace"].as_str().unwrap_or("?"), p["name"].as_str().unwrap_or("?")))
        .collect();
    pods.sort();
    pods
}

/// An sdn-node network for namespace `namespace` (none: the config names none).
fn write_network(dir: &Path, name: &str, namespace: Option<&str>, socket: &Path) {
    let mut plugin = serde_json::json!({"type": "sdn-node-cni", "agentSocket": socket});
    if let Some(ns) = namespace {
        plugin["namespace"] = ns.into();
    }
    let list = serde_json::json!({"cniVersion": "1.0.0", "name": name, "plugins": [plugin]});
    std::fs::write(dir.join(format!("50-{name}.conflist")), list.to_string()).unwrap();
}

fn podman_or_skip(node: &CniNode) -> Option<Podman> {
    match Podman::new(&node.agent.rundir.join("cni-bin"), &node.agent.conf_dir) {
        Ok(p) => Some(p),
        Err(why) if in_ci() => panic!("CI is set and this test cannot run: {why}"),
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            None
        }
    }
}

#[tokio::test]
async fn podman_containers_on_sdn_networks_reach_by_vnid_and_leave_nothing() {
    if !can_run() {
        return;
    }
    let node = CniNode::start(MULTITENANT).await;
    let conf_dir = node.agent.conf_dir.clone();
    write_network(&conf_dir, "sdn-a", Some("team-a"), &node.agent.socket);
    write_network(&conf_dir, "sdn-b", Some("team-b"), &node.agent.socket);
    write_network(&conf_dir, "sdn-x", Some("nowhere"), &node.agent.socket);
    let Some(pm) = podman_or_skip(&node) else { return };
    let (ports, veths, flows) = (node.ports(), node.veths(), node.flows());

    // Named containers keep their names; one without a name (podman makes one up, with a '_')
    // is the pod of its short ID, in `default`: the network is the agent's own conflist,
    // as the agent wrote it.
    let a1 = pm.start(Some("a1"), "sdn-a").unwrap_or_else(|e| panic!("a1: {e}\n{}", node.log()));
    let a2 = pm.start(Some("a2"), "sdn-a").unwrap_or_else(|e| panic!("a2: {e}\n{}", node.log()));
    let b1 = pm.start(Some("b1"), "sdn-b").unwrap_or_else(|e| panic!("b1: {e}\n{}", node.log()));
    let d = pm.start(None, "sdn-node").unwrap_or_else(|e| panic!("default: {e}\n{}", node.log()));
    let short = &d[..12];
    let mut want = vec!["team-a/a1".to_string(), "team-a/a2".into(), "team-b/b1".into(), format!("default/{short}")];
    want.sort();
    assert_eq!(api_pods(&node), want, "the agent's pods");
    assert_eq!(checkpointed(&node), want, "the checkpoint");

    // Addresses from the node's subnet (10.128.0.0/23), each once.
    let ips: Vec<String> = [&a1, &a2, &b1, &d].iter().map(|c| pm.addr(c)).collect();
    for ip in &ips {
        assert!(ip.starts_with("10.128.0.") || ip.starts_with("10.128.1."), "{ip} is not of 10.128.0.0/23");
    }
    let distinct: std::collections::BTreeSet<_> = ips.iter().collect();
    assert_eq!(distinct.len(), 4, "{ips:?}");
    let (ip_a1, ip_a2, ip_b1, ip_d) = (&ips[0], &ips[1], &ips[2], &ips[3]);

    // Real packets, between containers podman runs.
    assert!(pm.ping("a1", ip_a2, 3), "a1 reaches a2 (same VNID)\n{}", node.log());
    assert!(pm.ping("a2", ip_a1, 3), "a2 reaches a1");
    assert!(pm.ping("a1", "10.128.0.1", 3), "a1 reaches the gateway (tun0)");
    assert!(pm.ping(&b1, "10.128.0.1", 3), "b1 reaches the gateway");
    assert!(pm.ping(&d, ip_a1, 3), "VNID 0 reaches team-a");
    assert!(pm.ping(&d, ip_b1, 3), "VNID 0 reaches team-b");
    assert!(pm.ping("b1", ip_d, 3), "team-b reaches VNID 0");
    assert!(!pm.ping("b1", ip_a1, 1), "team-b does not reach team-a");
    assert!(!pm.ping("a1", ip_b1, 1), "nor team-a team-b");

    // A network whose namespace the state does not have: podman's error names it, and the
    // failed ADD leaves nothing.
    let e = pm.start(Some("x1"), "sdn-x").expect_err("a namespace without a NetNamespace");
    assert!(e.contains("unknown namespace \"nowhere\""), "{e}");
    let _ = pm.run(&["rm", "-f", "-t", "0", "x1"]);
    // One pod per sandbox: a container on two sdn-node networks is refused on the second.
    let e = pm.start(Some("ab"), "sdn-a,sdn-b").expect_err("a container on two sdn-node networks");
    assert!(e.contains("one pod per sandbox"), "{e}");
    let _ = pm.run(&["rm", "-f", "-t", "0", "ab"]);

    // `podman rm -f` tears each down: no port, no veth, no flow, no pod, no record.
    for c in [&a1, &a2, &b1, &d] {
        let out = pm.run(&["rm", "-f", "-t", "0", c]);
        assert!(out.status.success(), "podman rm {c}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let mut left = None;
    for _ in 0..300 {
        let now = (node.ports(), node.veths(), api_pods(&node), checkpointed(&node));
        if now == (ports.clone(), veths.clone(), vec![], vec![]) && node.flows() == flows {
            left = None;
            break;
        }
        left = Some(now);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        left.is_none(),
        "after podman rm: (ports, veths, pods, checkpoint) {left:?}, before {:?} (or flows differ)\n{}",
        (ports, veths),
        node.log()
    );
    node.ready_again("after podman rm").await;
}
