//! The node's shared state, as narrow handles: each is passed only where it is used.
//!
//! ```text
//! State ──── the one model of the node (cluster state, pods, ports, DNS answers)
//! Conns ──── the live OVSDB connection and the flow engine
//! PortLocks  one lock per port or interface name (ports.rs)
//! Kick ───── wakes the converge loop
//! ```
//!
//! The converge loop ([`crate::reconcile`]) and the pod path ([`crate::pod`]) sit above this
//! room and share these handles; neither reaches into the other's state. The model lives behind
//! a lock that is never held across I/O.

pub mod conns;
pub mod faults;
pub mod ports;
pub mod record;
pub mod state;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

pub use conns::Conns;
pub use ports::PortLocks;
pub use state::NodeState;

use crate::options::{self, Bridge};

/// What the converge loop and the pod path need to know of the node: the bridge, the pod
/// path's deadlines and where the pod API is announced. One option group of `sdn-node run`
/// (flattened into [`crate::run::RunOptions`]); `apply` sets the bridge only.
#[derive(clap::Args, Clone, Debug)]
pub struct Config {
    #[command(flatten)]
    pub bridge: Bridge,
    /// Deadline of one pod API request, in seconds (answered 504 when it passes, with
    /// nothing of the request left behind).
    #[arg(long, default_value = "30", value_parser = options::seconds)]
    pub request_timeout: Duration,
    /// Leave the node's own networking alone (tun0 address and routes, sysctls, the
    /// nftables NAT/filter table); the dummy datapath never touches it.
    // `host_network`: configured, as openshift-sdn's SetupSDN does, unless the flag is given;
    // never for the dummy datapath, whose ports are not real devices.
    #[arg(long = "no-host-network", action = clap::ArgAction::SetFalse)]
    pub host_network: bool,
    /// Where the CNI network configuration (80-sdn-node.conflist) is written once the agent
    /// serves pods; `none` disables it.
    #[arg(long, default_value = "/etc/cni/net.d", value_parser = options::path_or_none)]
    pub cni_conf_dir: std::option::Option<std::path::PathBuf>,
    /// The pod API's unix socket (HTTP/JSON, mode 0600); `none` disables it.
    // Also named in the CNI network configuration.
    #[arg(long = "pod-api-socket", value_name = "POD_API_SOCKET", default_value = options::DEFAULT_SOCKET, value_parser = options::path_or_none)]
    pub api_socket: std::option::Option<std::path::PathBuf>,
    /// Pod interfaces kept ready on the bridge, so that a CNI ADD moves one into the pod
    /// instead of waiting for ovs-vswitchd to add a port (the slow part of an ADD; see
    /// docs/pods.md, "Warm ports"). Refilled in the background after ADDs; 0 disables them.
    // See `spares`.
    #[arg(long, default_value_t = 0)]
    pub warm_ports: usize,
    /// Take a warm port whenever one is ready, even while adding a port is measured to be
    /// cheaper than moving one (for tests of the warm path on small bridges).
    #[arg(long, hide = true)]
    pub warm_ports_always: bool,
    /// Fail the next pod setups after these steps, one each, in order (tests of the undo path;
    /// see `node::faults`).
    #[arg(long, hide = true, value_delimiter = ',', value_enum)]
    pub fail_pod_steps: Vec<faults::FaultPoint>,
    /// The NetworkPolicy audit log (off: no policy flow copies packets to the agent); set
    /// from `run`'s audit options.
    #[arg(skip)]
    pub audit: crate::cluster::netpol::NodeAudit,
}

impl Default for Config {
    /// The command line's defaults, without the host's paths: no pod API socket and no CNI
    /// configuration written (a library user names its own).
    fn default() -> Self {
        Config { cni_conf_dir: None, api_socket: None, ..options::defaults() }
    }
}


impl Config {
    /// Whether this node configures its own networking (never on the dummy datapath, whose
    /// ports are not devices).
    pub fn manages_host(&self) -> bool {
        self.host_network && self.bridge.datapath_type != Some(crate::options::DatapathType::Dummy)
    }
}

/// The node's model ([`NodeState`]), shared: a short synchronous look or change, never across
/// an await.
#[derive(Clone, Default)]
pub struct State(Arc<Mutex<NodeState>>);

impl State {
    pub fn new(state: NodeState) -> State {
        State(Arc::new(Mutex::new(state)))
    }

    /// The model, locked (a poisoned lock is taken over: no code path panics while holding
    /// it, so it is never half-changed).
    pub fn lock(&self) -> MutexGuard<'_, NodeState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pod at `ip` (`namespace/name`, either family), for the audit log.
    pub fn pod_at(&self, ip: std::net::IpAddr) -> Option<String> {
        self.lock().pod_at(ip)
    }

    /// The node's name in the current cluster state (the state file's `node:`), if any.
    pub fn node_name(&self) -> Option<String> {
        self.lock().effective().map(|s| s.node.clone())
    }
}

/// Wakes the converge loop: something is left to clean up or converge.
#[derive(Clone, Default)]
pub struct Kick(Arc<Notify>);

impl Kick {
    pub fn kick(&self) {
        self.0.notify_one();
    }

    /// Resolves when [`Kick::kick`] was called (since the last wait).
    pub async fn kicked(&self) {
        self.0.notified().await
    }
}
