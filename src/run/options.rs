//! `sdn-node run`'s options: clap-derived groups, the reconciler's [`Config`] (with the shared
//! [`crate::options::Bridge`]) flattened into them, so the command line fills the structs the
//! agent runs with and nothing is copied field by field.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::audit::{AuditConfig, Sink};
use crate::cluster::netpol::NodeAudit;
use crate::options::{self, path_or_none, seconds};
use crate::ovsdb::ClientOptions;
use crate::node::Config;
use crate::switch::{Backoff, SwitchOptions};

/// Everything `sdn-node run` runs with but where its cluster state comes from (the state file
/// or the Kubernetes API, chosen by the command).
#[derive(clap::Args, Clone, Debug)]
pub struct RunOptions {
    /// The state file (empty when the cluster state comes from Kubernetes); set by the
    /// command from `--state`.
    #[arg(skip)]
    pub state: PathBuf,
    /// This node's name (Kubernetes mode).
    // Also the audit log's `node` (else the bridge's name).
    #[arg(id = "node", long = "node", value_name = "NODE", env = "NODE_NAME")]
    pub node_name: Option<String>,
    #[command(flatten)]
    pub node: Config,
    #[command(flatten)]
    pub peers: Peers,
    /// How often a dirty engine (after a failed commit) is repaired from a dump.
    #[arg(skip = Duration::from_secs(2))]
    pub repair_interval: Duration,
    /// Where /metrics, /healthz and /readyz are served; `none` disables them.
    #[arg(long, default_value = "127.0.0.1:9101", value_parser = addr_or_none)]
    pub metrics_addr: std::option::Option<SocketAddr>,
    /// /healthz fails when one reconcile pass has taken longer than this many seconds.
    #[arg(long, default_value = "120", value_parser = seconds)]
    pub watchdog: Duration,
    /// Name server (IP:PORT) for egress policies' dnsName rules, instead of the system's
    /// resolv.conf; repeatable.
    #[arg(long = "dns-server", value_name = "DNS_SERVER")]
    pub dns_servers: Vec<SocketAddr>,
    /// How long to wait for a DNS answer for an egress policy's dnsName.
    #[arg(skip = crate::reconcile::dns::DEFAULT_TIMEOUT)]
    pub dns_timeout: Duration,
    /// Where the agent keeps its own durable record of the pods (one file per pod), so that they
    /// outlive the loss of the Open vSwitch database; `none` disables it (OVSDB's records
    /// alone). One agent per directory. A checkpoint that cannot be read stops the agent
    /// (exit 1, the file named): see docs/pods.md, "Pod records".
    #[arg(long, default_value = "/var/lib/sdn-node", value_parser = path_or_none)]
    pub state_dir: std::option::Option<PathBuf>,
    #[command(flatten)]
    pub audit: AuditOptions,
    /// Seconds between reads of the NetworkPolicy flows' statistics for the per-policy
    /// counters (/metrics, `sdn-node status`); 0: off.
    #[arg(long, default_value = "10", value_parser = options::seconds_or_off)]
    pub policy_stats_interval: std::option::Option<Duration>,
}

impl RunOptions {
    /// The command line's defaults for `state` on the Open vSwitch in `ovs_rundir`, without
    /// what reaches outside it: no pod API socket, no metrics listener, no CNI configuration
    /// written, no checkpoint directory (a library user names its own).
    pub fn new(state: PathBuf, ovs_rundir: PathBuf) -> RunOptions {
        let mut o: RunOptions = options::defaults();
        o.state = state;
        o.node = Config { bridge: crate::options::Bridge::new(ovs_rundir), ..Config::default() };
        o.metrics_addr = None;
        o.state_dir = None;
        o
    }

    /// The reconciler's configuration: [`RunOptions::node`] with the audit log's switch.
    pub(super) fn config(&self) -> Config {
        Config { audit: self.audit.node(), ..self.node.clone() }
    }

    /// The audit log's settings, if it is on; lines name this node.
    pub(super) fn audit_config(&self) -> Option<AuditConfig> {
        let node = self.node_name.clone().unwrap_or_else(|| self.node.bridge.name().to_string());
        self.audit.log.clone().map(|sink| AuditConfig::new(self.audit.rate.max(1), self.audit.burst, sink, node))
    }
}

/// Deadlines and keep-alives of the agent's two peers, ovs-vswitchd (OpenFlow) and
/// ovsdb-server (JSON-RPC), and how fast it reconnects to them.
#[derive(clap::Args, Clone, Debug)]
pub struct Peers {
    /// Seconds of silence from the switch before an echo request.
    #[arg(long, default_value = "5", value_parser = seconds)]
    pub echo_interval: Duration,
    /// Seconds an echo may take before the switch is declared dead.
    #[arg(long, default_value = "15", value_parser = seconds)]
    pub echo_timeout: Duration,
    /// Deadline of one OpenFlow request (a bundle commit, a dump, a barrier).
    #[arg(skip = SwitchOptions::default().request_timeout)]
    pub switch_request_timeout: Duration,
    /// Longest delay between reconnect attempts, in seconds.
    #[arg(long, default_value = "5", value_parser = seconds)]
    pub max_backoff: Duration,
    /// Deadline of one OVSDB request, in seconds.
    #[arg(long, default_value = "10", value_parser = seconds)]
    pub ovsdb_timeout: Duration,
    /// OVSDB inactivity probe: an echo after this many idle seconds; a server silent for
    /// twice as long is declared dead and the connection re-established.
    #[arg(long, default_value = "5", value_parser = seconds)]
    pub ovsdb_probe: Duration,
}

impl Peers {
    /// The OpenFlow connection's tunables.
    pub fn switch(&self) -> SwitchOptions {
        SwitchOptions { echo_interval: Some(self.echo_interval), echo_timeout: self.echo_timeout, request_timeout: self.switch_request_timeout, ..SwitchOptions::default() }
    }

    /// The OVSDB connection's tunables.
    pub fn ovsdb(&self) -> ClientOptions {
        ClientOptions { request_timeout: Some(self.ovsdb_timeout), probe_interval: Some(self.ovsdb_probe), ..ClientOptions::default() }
    }

    /// Reconnection delays, for both peers.
    pub fn backoff(&self) -> Backoff {
        Backoff { max: self.max_backoff, ..Backoff::default() }
    }
}

/// The NetworkPolicy audit log.
#[derive(clap::Args, Clone, Debug)]
pub struct AuditOptions {
    /// The NetworkPolicy audit log: one JSON line per allowed or denied new connection of the
    /// policies annotated `sdn-node.openshift.io/audit-log` (allow, deny, all), to this file
    /// (appended) or `-` (stdout); `none`: off.
    #[arg(id = "audit_log", long = "audit-log", value_name = "AUDIT_LOG", default_value = "none", value_parser = sink_or_none)]
    pub log: std::option::Option<Sink>,
    /// Log every NetworkPolicy (as if annotated `all`), not only those that ask.
    #[arg(id = "audit_all_policies", long = "audit-all-policies")]
    pub all_policies: bool,
    /// Audit events a second the switch passes to the agent (an OVS meter: a flood costs the
    /// agent no more than this).
    #[arg(id = "audit_rate", long = "audit-rate", value_name = "AUDIT_RATE", default_value_t = 100)]
    pub rate: u32,
    /// Audit events allowed above the rate in a burst.
    #[arg(id = "audit_burst", long = "audit-burst", value_name = "AUDIT_BURST", default_value_t = 100)]
    pub burst: u32,
}

impl AuditOptions {
    /// What the flows need to know: whether the log is on and whether every policy is logged.
    pub fn node(&self) -> NodeAudit {
        NodeAudit { enabled: self.log.is_some(), all: self.all_policies }
    }
}

pub(crate) fn addr_or_none(s: &str) -> Result<Option<SocketAddr>, String> {
    match s {
        "none" => Ok(None),
        a => a.parse().map(Some).map_err(|e| format!("{a:?} is not an IP:PORT ({e}); `none` turns it off")),
    }
}

fn sink_or_none(s: &str) -> Result<Option<Sink>, String> {
    Ok(match path_or_none(s)? {
        None => None,
        Some(p) if p.as_os_str() == "-" => Some(Sink::Stdout),
        Some(p) => Some(Sink::File(p)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunOptions,
    }

    /// The library's defaults are the command line's (but for the host's paths), and the
    /// flags land where the agent reads them.
    #[test]
    fn flags_fill_the_groups() {
        let d = RunOptions::new("s.yaml".into(), "/r".into());
        let cli: RunOptions = options::defaults();
        assert_eq!(d.peers.switch().echo_timeout, cli.peers.switch().echo_timeout);
        assert_eq!(d.node.request_timeout, Duration::from_secs(30));
        assert_eq!((d.node.api_socket, d.metrics_addr, d.state_dir, d.node.cni_conf_dir), (None, None, None, None));
        assert_eq!(cli.node.api_socket.as_deref(), Some(std::path::Path::new(crate::api::DEFAULT_SOCKET)));
        assert_eq!(cli.metrics_addr, Some("127.0.0.1:9101".parse().unwrap()));
        assert_eq!(cli.policy_stats_interval, Some(Duration::from_secs(10)));
        assert!(cli.node.host_network && cli.audit.log.is_none());

        let args = [
            "x", "--bridge", "br1", "--ovs-rundir", "/o", "--datapath-type", "netdev", "--port-timeout", "2.5",
            "--no-host-network", "--pod-api-socket", "none", "--metrics-addr", "none", "--cni-conf-dir", "/c",
            "--echo-interval", "1", "--ovsdb-timeout", "3", "--max-backoff", "0.5", "--dns-server", "10.0.0.1:53",
            "--dns-server", "10.0.0.2:53", "--state-dir", "none", "--audit-log", "-", "--audit-rate", "7",
            "--audit-all-policies", "--policy-stats-interval", "0", "--warm-ports", "4", "--node", "n1",
        ];
        let o = Cli::try_parse_from(args).unwrap().run;
        assert_eq!(o.node.bridge.ovs.mgmt_socket(), "unix:/o/br1.mgmt");
        assert_eq!((o.node.bridge.datapath_type, o.node.bridge.port_timeout), (Some(crate::options::DatapathType::Netdev), Duration::from_millis(2500)));
        assert!(!o.node.host_network);
        assert_eq!((&o.node.api_socket, o.metrics_addr, &o.state_dir), (&None, None, &None));
        assert_eq!(o.node.cni_conf_dir, Some(PathBuf::from("/c")));
        assert_eq!(o.peers.switch().echo_interval, Some(Duration::from_secs(1)));
        assert_eq!(o.peers.ovsdb().request_timeout, Some(Duration::from_secs(3)));
        assert_eq!(o.peers.backoff().max, Duration::from_millis(500));
        assert_eq!(o.dns_servers.len(), 2);
        assert_eq!(o.policy_stats_interval, None);
        assert_eq!(o.node.warm_ports, 4);
        let a = o.audit_config().unwrap();
        assert_eq!((a.sink, a.rate_per_sec, a.node.as_str()), (Sink::Stdout, 7, "n1"));
        assert_eq!(o.config().audit, NodeAudit { enabled: true, all: true });

        let e = Cli::try_parse_from(["x", "--port-timeout=-1"]).err().unwrap().to_string();
        assert!(e.contains("--port-timeout") && e.contains("0 or more"), "{e}");
        let e = Cli::try_parse_from(["x", "--metrics-addr", "localhost"]).err().unwrap().to_string();
        assert!(e.contains("--metrics-addr") && e.contains("IP:PORT"), "{e}");
    }
}
