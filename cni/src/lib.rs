//! `sdn-node-cni`: the CNI plugin container runtimes call to network a pod sandbox.
//!
//! The plugin does no networking itself. It validates what the runtime gave it and forwards
//! the command to the `sdn-node` agent, which owns the bridge, the flows and the address
//! allocation; keeping all state in one long-lived process is what lets the agent repair the
//! switch after a restart. The plugin is a short-lived process, so it is built on blocking
//! std with no async runtime.
//!
//! # CNI side
//!
//! Versions `0.3.0`, `0.3.1`, `0.4.0` and `1.0.0` (1.1.0 would require STATUS and GC).
//! Commands, from `CNI_COMMAND`:
//!
//! - `VERSION`: prints `{"cniVersion":"1.0.0","supportedVersions":[...]}`; stdin is not read.
//! - `ADD`, `CHECK`, `DEL`: read the network configuration on stdin (`cniVersion`, `name`,
//!   `type`, `prevResult`, and ours: `agentSocket`, default `/var/run/sdn-node/cni.sock`;
//!   `timeoutSeconds`, default 30, 1 to 3600; `namespace`, default `default`, see below) and
//!   the environment: `CNI_CONTAINERID`, `CNI_IFNAME` and `CNI_PATH` are required, `CNI_NETNS`
//!   too except for DEL. `CNI_ARGS` carries the pod under Kubernetes (`K8S_POD_NAMESPACE`,
//!   `K8S_POD_NAME`, both required for ADD and CHECK when the namespace is given,
//!   `K8S_POD_INFRA_CONTAINER_ID`, `K8S_POD_UID`); any other key is an error unless
//!   `IgnoreUnknown` is `1`/`true`, as in the reference library's argument parser.
//! - Runtimes that are not Kubernetes (podman, nerdctl) send no `K8S_POD_NAMESPACE` (podman
//!   4.3 sends `IgnoreUnknown=1;K8S_POD_NAME=<container name>`). The pod's namespace is then
//!   the config's `namespace` (a DNS-1123 label; `default` when absent), its name
//!   `K8S_POD_NAME` if that is a DNS-1123 subdomain, else the container ID's first 12
//!   characters when the ID is longer and hexadecimal (the short ID runtimes show), else the
//!   whole ID if it is a usable name (else error 4). Their DEL goes without a name: the agent
//!   finds the pod by its container ID ([`config::identity`]).
//! - ADD prints the result in the requested version's shape: interfaces
//!   `[{"name":hostVeth}, {"name":ifName,"mac":..,"sandbox":..}]`, ips
//!   `[{"address","gateway","interface":1}]` (0.3.x/0.4.0 add `"version":"4"` or `"6"`),
//!   routes. CHECK and DEL print nothing on success. CHECK needs cniVersion 0.4.0 or later,
//!   and if a `prevResult` lists interfaces, one must be the requested pod interface.
//!
//! # Agent side
//!
//! One HTTP/1.1 request on the agent's unix socket, within `timeoutSeconds` for connect,
//! write and read together: `POST /v1/cni` with
//! `{"command":"ADD"|"DEL"|"CHECK","containerID","netns","ifName","namespace","name",
//! "infraContainerID","cniVersion"}` (all strings; `netns` may be empty on DEL, `namespace`
//! and `name` are empty on DEL when the runtime gave no `K8S_POD_NAMESPACE`, `infraContainerID`
//! defaults to `containerID`). The agent answers 200 with
//! `{"hostVeth","ifName","mac","sandbox","ips":[{"address":"10.128.0.5/23","gateway"}],"ip","gateway","routes":[{"dst","gw"}],"mtu"}`
//! for ADD (`ip` and `gateway` repeat `ips[0]`, for plugins before `ips`; an answer without
//! `ips`, from an agent before it, is read from them) and `{}` for CHECK and DEL, or an error
//! status with
//! `{"error":"message","object":"pod ns/name","field":"fieldName"}`.
//!
//! # Errors
//!
//! Printed on stdout as `{"cniVersion","code","msg","details"}` with exit status 1. `msg`
//! names the object (pod, container or network config) and the field at fault.
//!
//! | code | when |
//! |------|------|
//! | 1 | cniVersion missing or unsupported; CHECK with a 0.3.x config |
//! | 3 | agent answered 404 to ADD or CHECK (pod unknown) — DEL's 404 is a success |
//! | 4 | CNI_COMMAND unknown or missing; a required variable missing or not UTF-8; bad CNI_CONTAINERID or CNI_IFNAME; bad CNI_ARGS (syntax, unknown key without IgnoreUnknown, no pod name for ADD/CHECK: neither K8S_POD_NAME nor the container ID usable) |
//! | 5 | stdin unreadable; socket permission denied; other I/O errors talking to the agent |
//! | 6 | stdin not JSON or not an object; a known config field of the wrong JSON type |
//! | 7 | config value invalid (name, relative agentSocket, timeoutSeconds, namespace); prevResult without our interface; agent answered 400 or 422; socket path unusable |
//! | 11 | agent unreachable (socket missing, connection refused or reset); no answer within timeoutSeconds; agent answered 429, 503 or 504 |
//! | 100 | agent answered 409 (conflict with another pod or container) |
//! | 101 | agent answered 500 (it failed the change) |
//! | 102 | agent answered another non-2xx status |
//! | 103 | agent reply is not HTTP/1.x, or an ADD reply lacks or has a bad field (named in msg) |
//!
//! # Installing
//!
//! The agent writes the network config list with [`write_conflist`]; the runtime finds
//! `sdn-node-cni` by its `type` in its CNI bin directory.

#![forbid(unsafe_code)]

pub mod agent;
pub mod config;
pub mod error;
pub mod result;
pub mod run;
pub mod wire;

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

pub use error::CniError;
pub use run::{run, Outcome};

/// The config list's file name: `80-` sorts after the runtimes' own examples (`10-`…) so a
/// node that has none of ours falls back to theirs, and before the usual `99-loopback`.
pub const CONFLIST_NAME: &str = "80-sdn-node.conflist";
/// The network name in the config list (and in the runtime's result cache).
pub const NETWORK_NAME: &str = "sdn-node";
/// The plugin's `type`, which is also its executable's name in the CNI bin directory.
pub const PLUGIN_TYPE: &str = "sdn-node-cni";

/// The network config list for an agent listening on `agent_socket`, as pretty JSON with a
/// trailing newline. A non-UTF-8 socket path is written lossily (JSON has only strings).
pub fn conflist(agent_socket: &Path) -> String {
    let v = serde_json::json!({
        "cniVersion": config::LATEST_VERSION,
        "name": NETWORK_NAME,
        "plugins": [
            {"type": PLUGIN_TYPE, "agentSocket": agent_socket.to_string_lossy()}
        ]
    });
    serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
}

/// Writes [`conflist`] to `dir/80-sdn-node.conflist` (creating `dir` if needed) and returns
/// its path.
///
/// Atomic: the runtime watches the directory and may load a file the moment it appears, so
/// the content goes to a hidden temporary file first (a name without a `.conf`, `.conflist`
/// or `.json` ending, which runtimes skip), is synced, and is renamed over the final name.
pub fn write_conflist(dir: &Path, agent_socket: &Path) -> io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir_all(dir)?;
    let path = dir.join(CONFLIST_NAME);
    let tmp = dir.join(format!(".{CONFLIST_NAME}.{}.tmp", std::process::id()));
    let write = || -> io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        // Runtimes read it as root, but operators reading it need not be.
        f.set_permissions(fs::Permissions::from_mode(0o644))?;
        f.write_all(conflist(agent_socket).as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, &path)?;
        // Persist the rename itself, so a crash cannot bring back an older list.
        fs::File::open(dir)?.sync_all()
    };
    write().inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflist_shape() {
        let v: serde_json::Value = serde_json::from_str(&conflist(Path::new("/run/x.sock"))).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "cniVersion": "1.0.0",
                "name": "sdn-node",
                "plugins": [{"type": "sdn-node-cni", "agentSocket": "/run/x.sock"}]
            })
        );
    }

    #[test]
    fn write_conflist_replaces_atomically() {
        let dir = std::env::temp_dir().join(format!("sdn-node-cni-unit-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let p = write_conflist(&dir.join("net.d"), Path::new("/a.sock")).unwrap();
        assert_eq!(p, dir.join("net.d").join(CONFLIST_NAME));
        let p = write_conflist(&dir.join("net.d"), Path::new("/b.sock")).unwrap();
        assert!(fs::read_to_string(&p).unwrap().contains("/b.sock"));
        let names: Vec<_> = fs::read_dir(dir.join("net.d")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from(CONFLIST_NAME)]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
