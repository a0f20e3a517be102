//! The controller's configuration: flags, or the same keys from a file (a mounted ConfigMap),
//! flags winning. Checked once, before the controller talks to anyone: a bad value exits with
//! one line naming the flag or key.

use std::path::PathBuf;
use std::time::Duration;

use ipnet::{IpNet, Ipv6Net};
use serde::Deserialize;

use crate::domain::Plugin;

/// Where a Node's HostSubnet comes from.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeSubnets {
    /// The Node's `spec.podCIDRs` entry of the cluster network's family when it has one; the
    /// controller's own allocator for a Node without one, unless another Node has one (then
    /// the cluster allocates them: wait for kube-controller-manager, with an Event).
    Auto,
    /// Only `spec.podCIDRs` (kube-controller-manager `--allocate-node-cidrs`): a Node without
    /// one waits, with an Event.
    PodCidrs,
    /// Only the controller's allocator; `spec.podCIDRs` is ignored.
    Allocate,
}

/// `sdn-node controller`'s flags.
#[derive(clap::Args, Clone, Debug)]
pub struct ControllerArgs {
    /// A kubeconfig file.
    #[arg(long, conflicts_with = "in_cluster")]
    pub kubeconfig: Option<PathBuf>,
    /// Use the in-cluster service account.
    #[arg(long)]
    pub in_cluster: bool,
    /// The namespace of the leader-election Lease (default: the pod's own namespace, from
    /// POD_NAMESPACE or the service account, else sdn-node).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// A YAML file with the network keys (clusterNetwork, hostSubnetLength, serviceNetwork,
    /// clusterNetworkIpv6, hostSubnetLengthIpv6, serviceNetworkIpv6, plugin, vxlanPort, mtu,
    /// nodeSubnets); a flag given on the command line wins.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The cluster network the pods' subnets are carved from (CIDR). IPv4, or IPv6 for an
    /// IPv6-only cluster (then --service-network is IPv6 too, and no *-ipv6 flag is given).
    #[arg(long)]
    pub cluster_network: Option<String>,
    /// Host bits of each node's subnet (9: a /23 per node out of an IPv4 cluster network)
    /// [required for IPv4; default for an IPv6 --cluster-network: 64, a /64 per node].
    #[arg(long)]
    pub host_subnet_length: Option<u8>,
    /// The service network (CIDR), of --cluster-network's family.
    #[arg(long)]
    pub service_network: Option<String>,
    /// Dual-stack: the IPv6 cluster network (CIDR) each Node also gets an IPv6 subnet of; with
    /// --service-network-ipv6.
    #[arg(long)]
    pub cluster_network_ipv6: Option<String>,
    /// Host bits of each node's IPv6 subnet [default: 64, a /64 per node].
    #[arg(long)]
    pub host_subnet_length_ipv6: Option<u8>,
    /// Dual-stack: the IPv6 service network (CIDR); with --cluster-network-ipv6.
    #[arg(long)]
    pub service_network_ipv6: Option<String>,
    /// The openshift-sdn plugin the cluster runs [default: networkpolicy].
    #[arg(long)]
    pub plugin: Option<PluginArg>,
    /// VXLAN's UDP port [default: 4789].
    #[arg(long)]
    pub vxlan_port: Option<u16>,
    /// The pod network's MTU [default: 1450].
    #[arg(long)]
    pub mtu: Option<u32>,
    /// Where HostSubnets come from [default: auto].
    #[arg(long)]
    pub node_subnets: Option<NodeSubnets>,
    /// Namespaces whose NetNamespace gets the global VNID 0 when it is created (openshift-sdn:
    /// default only). Comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "default")]
    pub global_namespaces: Vec<String>,
    /// This replica's name in the Lease (default: hostname and process ID).
    #[arg(long)]
    pub identity: Option<String>,
    /// The leader-election Lease's name.
    #[arg(long, default_value = "sdn-node-controller")]
    pub lease_name: String,
    /// How long a Lease holds without renewal before another replica may take it (seconds).
    #[arg(long, default_value = "15", value_parser = crate::options::seconds)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops writing (seconds; less than
    /// the lease duration).
    #[arg(long, default_value = "10", value_parser = crate::options::seconds)]
    pub leader_elect_renew_deadline: Duration,
    /// How often a replica tries to take or renew the Lease (seconds).
    #[arg(long, default_value = "2", value_parser = crate::options::seconds)]
    pub leader_elect_retry_period: Duration,
    /// Writes per second to the API server (client-side rate limit).
    #[arg(long, default_value = "300")]
    pub kube_api_qps: u32,
    /// Writes allowed in a burst above the rate.
    #[arg(long, default_value = "600")]
    pub kube_api_burst: u32,
    /// Writes in flight at once.
    #[arg(long, default_value = "32")]
    pub concurrent_writes: usize,
    /// Deadline of one API call (seconds).
    #[arg(long, default_value = "10", value_parser = crate::options::seconds)]
    pub api_timeout: Duration,
    /// /healthz, /readyz and /status (JSON), or "none".
    #[arg(long, default_value = "0.0.0.0:9103", value_parser = crate::run::options::addr_or_none)]
    pub health_addr: std::option::Option<std::net::SocketAddr>,
}

/// `--plugin`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginArg {
    Networkpolicy,
    Multitenant,
    Subnet,
}

impl From<PluginArg> for Plugin {
    fn from(p: PluginArg) -> Plugin {
        match p {
            PluginArg::Networkpolicy => Plugin::NetworkPolicy,
            PluginArg::Multitenant => Plugin::Multitenant,
            PluginArg::Subnet => Plugin::Subnet,
        }
    }
}

/// The file's keys (the flags' names in camelCase).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct File {
    cluster_network: Option<String>,
    host_subnet_length: Option<u8>,
    service_network: Option<String>,
    cluster_network_ipv6: Option<String>,
    host_subnet_length_ipv6: Option<u8>,
    service_network_ipv6: Option<String>,
    plugin: Option<PluginArg>,
    vxlan_port: Option<u16>,
    mtu: Option<u32>,
    node_subnets: Option<NodeSubnets>,
}

/// Host bits of a node's subnet in an IPv6-only cluster when none is given: a /64 per node,
/// as `--host-subnet-length-ipv6` defaults to.
pub const IPV6_HOST_SUBNET_LENGTH: u8 = 64;

/// The network the controller writes into ClusterNetwork "default" and allocates from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Network {
    /// IPv4, or IPv6 in an IPv6-only cluster (`service_network` is of the same family, and
    /// `ipv6` is `None`): ClusterNetwork `network`/`clusterNetworks[0].CIDR` and HostSubnet
    /// `subnet` then hold IPv6 networks.
    pub cluster_network: IpNet,
    pub host_subnet_length: u8,
    pub service_network: IpNet,
    /// Dual-stack (`None`: IPv4 only).
    pub ipv6: Option<Network6>,
    pub plugin: Plugin,
    pub vxlan_port: u16,
    pub mtu: u32,
}

/// The IPv6 side of a dual-stack cluster network: ClusterNetwork "default" carries it in
/// annotations and each HostSubnet its IPv6 subnet (see [`crate::kube::types`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Network6 {
    pub cluster_network: Ipv6Net,
    /// Host bits of a node's IPv6 subnet.
    pub host_subnet_length: u8,
    pub service_network: Ipv6Net,
}

impl Network {
    /// Whether the cluster is IPv6-only (its one network IPv6).
    pub fn ipv6_only(&self) -> bool {
        matches!(self.cluster_network, IpNet::V6(_))
    }

    /// The prefix length of a node's subnet.
    pub fn subnet_prefix(&self) -> u8 {
        self.cluster_network.max_prefix_len() - self.host_subnet_length
    }
}

/// The checked configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub network: Network,
    pub node_subnets: NodeSubnets,
    pub global_namespaces: Vec<String>,
    pub namespace: String,
    pub identity: String,
    pub lease_name: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    pub qps: u32,
    pub burst: u32,
    pub concurrent_writes: usize,
    pub api_timeout: Duration,
    pub health_addr: Option<std::net::SocketAddr>,
    pub kubeconfig: Option<PathBuf>,
}

const SA_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

impl ControllerArgs {
    /// Checks the flags and the file; an error is one line for the operator.
    pub fn check(self) -> Result<Config, String> {
        if self.kubeconfig.is_none() && !self.in_cluster {
            return Err("sdn-node controller: give --kubeconfig FILE or --in-cluster".into());
        }
        let file: File = match &self.config {
            None => File::default(),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| format!("--config {}: {e}", path.display()))?;
                if text.trim().is_empty() {
                    File::default()
                } else {
                    serde_saphyr::from_str(&text)
                        .map_err(|e| format!("--config {}: {}", path.display(), one_line(&e.to_string())))?
                }
            }
        };
        let cidr = |flag: &str, v: Option<String>| -> Result<IpNet, String> {
            let v = v.ok_or_else(|| format!("--{flag} (or {} in --config) is required", camel(flag)))?;
            let net: IpNet =
                v.trim().parse().map_err(|_| format!("--{flag} {v:?} is not a CIDR (e.g. 10.128.0.0/14, or fd00:10:128::/48 for an IPv6-only cluster)"))?;
            if net.network() != net.addr() {
                return Err(format!("--{flag} {v}: host bits are set (the network is {})", net.trunc()));
            }
            Ok(net)
        };
        let cluster_network = cidr("cluster-network", self.cluster_network.or(file.cluster_network))?;
        let service_network = cidr("service-network", self.service_network.or(file.service_network))?;
        // The family of --cluster-network decides the cluster's: IPv4 (and dual-stack with the
        // *-ipv6 keys) or IPv6-only, where ClusterNetwork and HostSubnets carry the IPv6
        // networks in their own fields.
        let ipv6_only = match (cluster_network, service_network) {
            (IpNet::V4(_), IpNet::V4(_)) => false,
            (IpNet::V6(_), IpNet::V6(_)) => true,
            _ => {
                return Err(format!(
                    "--cluster-network {cluster_network} and --service-network {service_network} must be of the same family: both IPv4 (dual-stack adds --cluster-network-ipv6 and --service-network-ipv6) or both IPv6 (an IPv6-only cluster)"
                ));
            }
        };
        if ipv6_only {
            // Named as the operator wrote them: the flag, or the file's key.
            let given: Vec<String> = [
                (self.cluster_network_ipv6.is_some(), file.cluster_network_ipv6.is_some(), "cluster-network-ipv6"),
                (self.host_subnet_length_ipv6.is_some(), file.host_subnet_length_ipv6.is_some(), "host-subnet-length-ipv6"),
                (self.service_network_ipv6.is_some(), file.service_network_ipv6.is_some(), "service-network-ipv6"),
            ]
            .into_iter()
            .filter_map(|(flag, key, name)| match (flag, key) {
                (true, _) => Some(format!("--{name}")),
                (false, true) => Some(format!("{} in --config", camel(name))),
                (false, false) => None,
            })
            .collect();
            if !given.is_empty() {
                return Err(format!(
                    "{} given with an IPv6 --cluster-network {cluster_network}: the IPv6 keys add IPv6 to an IPv4 cluster (dual-stack); an IPv6-only cluster has its networks in --cluster-network, --host-subnet-length and --service-network alone",
                    given.join(", ")
                ));
            }
        }
        if cluster_network.contains(&service_network.network()) || service_network.contains(&cluster_network.network())
        {
            return Err(format!("--service-network {service_network} overlaps --cluster-network {cluster_network}"));
        }
        let (host_subnet_length, default) = match self.host_subnet_length.or(file.host_subnet_length) {
            Some(h) => (h, ""),
            None if ipv6_only => (IPV6_HOST_SUBNET_LENGTH, " (the default for an IPv6 --cluster-network)"),
            None => return Err("--host-subnet-length (or hostSubnetLength in --config) is required".into()),
        };
        // Per family: the bits the cluster network leaves, and at least a gateway and a pod.
        let free = cluster_network.max_prefix_len() - cluster_network.prefix_len();
        if !(2..=free).contains(&host_subnet_length) {
            return Err(format!(
                "--host-subnet-length {host_subnet_length}{default}: must be 2 to {free} for --cluster-network {cluster_network} (a node's subnet is at most the whole network and holds a gateway and a pod)"
            ));
        }
        let (cluster6, host_bits6, service6) = (
            self.cluster_network_ipv6.or(file.cluster_network_ipv6),
            self.host_subnet_length_ipv6.or(file.host_subnet_length_ipv6),
            self.service_network_ipv6.or(file.service_network_ipv6),
        );
        let ipv6 = network6(cluster6, host_bits6, service6)?;
        let vxlan_port = self.vxlan_port.or(file.vxlan_port).unwrap_or(4789);
        if vxlan_port == 0 {
            return Err("--vxlan-port 0 is not a UDP port".into());
        }
        let mtu = self.mtu.or(file.mtu).unwrap_or(1450);
        if !(576..=65000).contains(&mtu) {
            return Err(format!("--mtu {mtu}: must be 576 to 65000"));
        }
        let plugin = self.plugin.or(file.plugin).unwrap_or(PluginArg::Networkpolicy).into();
        for ns in &self.global_namespaces {
            if !crate::cluster::validate::dns1123_label(ns) {
                return Err(format!("--global-namespaces: {ns:?} is not a namespace name (a DNS label)"));
            }
        }
        let namespace = match self.namespace.filter(|n| !n.is_empty()) {
            Some(ns) => ns,
            None => std::fs::read_to_string(SA_NAMESPACE)
                .map(|s| s.trim().to_string())
                .ok()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "sdn-node".into()),
        };
        let identity = match self.identity.filter(|i| !i.is_empty()) {
            Some(i) => i,
            None => format!("{}_{}", hostname(), std::process::id()),
        };
        if self.leader_elect_renew_deadline >= self.leader_elect_lease_duration {
            return Err(format!(
                "--leader-elect-renew-deadline ({:?}) must be less than --leader-elect-lease-duration ({:?}): a leader must stop writing before another may take the Lease",
                self.leader_elect_renew_deadline, self.leader_elect_lease_duration
            ));
        }
        if self.leader_elect_retry_period >= self.leader_elect_renew_deadline {
            return Err(format!(
                "--leader-elect-retry-period ({:?}) must be less than --leader-elect-renew-deadline ({:?})",
                self.leader_elect_retry_period, self.leader_elect_renew_deadline
            ));
        }
        if self.kube_api_qps == 0 || self.kube_api_burst == 0 || self.concurrent_writes == 0 {
            return Err("--kube-api-qps, --kube-api-burst and --concurrent-writes must be 1 or more".into());
        }
        Ok(Config {
            network: Network { cluster_network, host_subnet_length, service_network, ipv6, plugin, vxlan_port, mtu },
            node_subnets: self.node_subnets.or(file.node_subnets).unwrap_or(NodeSubnets::Auto),
            global_namespaces: self.global_namespaces,
            namespace,
            identity,
            lease_name: self.lease_name,
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
            qps: self.kube_api_qps,
            burst: self.kube_api_burst.max(1),
            concurrent_writes: self.concurrent_writes,
            api_timeout: self.api_timeout,
            health_addr: self.health_addr,
            kubeconfig: self.kubeconfig,
        })
    }
}

/// The IPv6 flags (or keys), checked: both networks or neither; the host subnet length only
/// with them.
fn network6(cluster: Option<String>, host_bits: Option<u8>, service: Option<String>) -> Result<Option<Network6>, String> {
    let net = |flag: &str, v: &str| -> Result<Ipv6Net, String> {
        let net: Ipv6Net = v.trim().parse().map_err(|_| {
            format!("--{flag} {v:?} is not an IPv6 CIDR (e.g. fd00:10:128::/48)")
        })?;
        if net.network() != net.addr() {
            return Err(format!("--{flag} {v}: host bits are set (the network is {})", net.trunc()));
        }
        Ok(net)
    };
    let (cluster, service) = match (cluster, service) {
        (None, None) => {
            return match host_bits {
                None => Ok(None),
                Some(_) => Err("--host-subnet-length-ipv6 is given without --cluster-network-ipv6".into()),
            };
        }
        (Some(c), Some(s)) => (net("cluster-network-ipv6", &c)?, net("service-network-ipv6", &s)?),
        (Some(_), None) | (None, Some(_)) => {
            return Err("--cluster-network-ipv6 and --service-network-ipv6 (or clusterNetworkIpv6 and serviceNetworkIpv6 in --config) go together: a dual-stack cluster has both, or neither".into());
        }
    };
    if cluster.contains(&service.network()) || service.contains(&cluster.network()) {
        return Err(format!("--service-network-ipv6 {service} overlaps --cluster-network-ipv6 {cluster}"));
    }
    let host_subnet_length = host_bits.unwrap_or(IPV6_HOST_SUBNET_LENGTH);
    let free = 128 - cluster.prefix_len();
    if !(2..=free).contains(&host_subnet_length) {
        return Err(format!(
            "--host-subnet-length-ipv6 {host_subnet_length}: must be 2 to {free} for --cluster-network-ipv6 {cluster} (a node's IPv6 subnet is at most the whole network)"
        ));
    }
    Ok(Some(Network6 { cluster_network: cluster, host_subnet_length, service_network: service }))
}

fn camel(flag: &str) -> String {
    let mut out = String::new();
    let mut up = false;
    for c in flag.chars() {
        if c == '-' {
            up = true;
        } else if up {
            out.extend(c.to_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "sdn-node-controller".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ControllerArgs,
    }

    fn check(args: &[&str]) -> Result<Config, String> {
        let mut all = vec!["x", "--kubeconfig", "/k"];
        all.extend(args);
        Cli::try_parse_from(all).map_err(|e| e.to_string())?.args.check()
    }

    const OK: [&str; 6] =
        ["--cluster-network", "10.128.0.0/14", "--host-subnet-length", "9", "--service-network", "172.30.0.0/16"];

    #[test]
    fn defaults_and_flags() {
        let c = check(&OK).unwrap();
        assert_eq!(c.network.plugin, Plugin::NetworkPolicy);
        assert_eq!(c.network.subnet_prefix(), 23);
        assert_eq!((c.network.vxlan_port, c.network.mtu), (4789, 1450));
        assert_eq!(c.node_subnets, NodeSubnets::Auto);
        assert_eq!(c.global_namespaces, vec!["default".to_string()]);
        assert_eq!(
            (c.lease_duration, c.renew_deadline, c.retry_period),
            (Duration::from_secs(15), Duration::from_secs(10), Duration::from_secs(2))
        );
    }

    #[test]
    fn refusals_name_the_flag() {
        let with = |extra: &[&str]| {
            let mut a = OK.to_vec();
            a.extend(extra);
            check(&a).unwrap_err()
        };
        assert!(check(&OK[2..]).unwrap_err().contains("--cluster-network (or clusterNetwork in --config) is required"));
        assert!(check(&[
            "--cluster-network",
            "10.128.0.1/14",
            "--host-subnet-length",
            "9",
            "--service-network",
            "172.30.0.0/16"
        ])
        .unwrap_err()
        .contains("host bits"));
        assert!(check(&[
            "--cluster-network",
            "10.128.0.0/14",
            "--host-subnet-length",
            "19",
            "--service-network",
            "172.30.0.0/16"
        ])
        .unwrap_err()
        .contains("2 to 18"));
        assert!(check(&[
            "--cluster-network",
            "10.128.0.0/14",
            "--host-subnet-length",
            "9",
            "--service-network",
            "10.128.0.0/16"
        ])
        .unwrap_err()
        .contains("overlaps"));
        assert!(with(&["--plugin", "flannel"]).contains("flannel"));
        assert!(with(&["--mtu", "100"]).contains("--mtu 100"));
        assert!(with(&["--leader-elect-renew-deadline", "20"]).contains("less than --leader-elect-lease-duration"));
        let e = Cli::try_parse_from(["x", "--cluster-network", "10.0.0.0/8"]).unwrap().args.check().unwrap_err();
        assert!(e.contains("--kubeconfig FILE or --in-cluster"), "{e}");
    }

    #[test]
    fn a_file_gives_the_keys_and_flags_win() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.yaml");
        std::fs::write(&f, "clusterNetwork: 10.0.0.0/16\nhostSubnetLength: 8\nserviceNetwork: 10.96.0.0/12\nplugin: multitenant\nnodeSubnets: allocate\n").unwrap();
        let c = check(&["--config", f.to_str().unwrap(), "--mtu", "1400"]).unwrap();
        assert_eq!(c.network.cluster_network.to_string(), "10.0.0.0/16");
        assert_eq!(c.network.plugin, Plugin::Multitenant);
        assert_eq!(c.network.mtu, 1400);
        assert_eq!(c.node_subnets, NodeSubnets::Allocate);
        let c = check(&["--config", f.to_str().unwrap(), "--plugin", "subnet"]).unwrap();
        assert_eq!(c.network.plugin, Plugin::Subnet);
        std::fs::write(&f, "clusterNetwrk: 10.0.0.0/16\n").unwrap();
        let e = check(&["--config", f.to_str().unwrap()]).unwrap_err();
        assert!(e.contains("clusterNetwrk") && e.contains("c.yaml"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn ipv6_networks_are_checked_before_anything() {
        let with = |extra: &[&str]| {
            let mut a = OK.to_vec();
            a.extend(extra);
            check(&a)
        };
        assert_eq!(check(&OK).unwrap().network.ipv6, None);
        let c = with(&["--cluster-network-ipv6", "fd00:10:128::/48", "--service-network-ipv6", "fd00:172:30::/112"]).unwrap();
        let six = c.network.ipv6.unwrap();
        assert_eq!(six.cluster_network.to_string(), "fd00:10:128::/48");
        assert_eq!(six.service_network.to_string(), "fd00:172:30::/112");
        assert_eq!(six.host_subnet_length, 64);
        let e = with(&["--cluster-network-ipv6", "fd00:10:128::/48"]).unwrap_err();
        assert!(e.contains("go together"), "{e}");
        let e = with(&["--cluster-network-ipv6", "10.0.0.0/8", "--service-network-ipv6", "fd00:172:30::/112"]).unwrap_err();
        assert_eq!(e, "--cluster-network-ipv6 \"10.0.0.0/8\" is not an IPv6 CIDR (e.g. fd00:10:128::/48)");
        let e = with(&["--cluster-network-ipv6", "fd00:10:128::1/48", "--service-network-ipv6", "fd00:172:30::/112"]).unwrap_err();
        assert!(e.contains("host bits are set (the network is fd00:10:128::/48)"), "{e}");
        let e = with(&["--cluster-network-ipv6", "fd00::/16", "--service-network-ipv6", "fd00:172:30::/112"]).unwrap_err();
        assert!(e.contains("overlaps"), "{e}");
        let e = with(&["--cluster-network-ipv6", "fd00:10:128::/96", "--service-network-ipv6", "fd00:172:30::/112"]).unwrap_err();
        assert!(e.contains("--host-subnet-length-ipv6 64: must be 2 to 32"), "{e}");
        let e = with(&["--host-subnet-length-ipv6", "64"]).unwrap_err();
        assert!(e.contains("without --cluster-network-ipv6"), "{e}");
        let e = check(&["--cluster-network", "fd00::/48", "--host-subnet-length", "9", "--service-network", "172.30.0.0/16"]).unwrap_err();
        assert!(e.contains("must be of the same family") && e.contains("--cluster-network-ipv6"), "{e}");
        assert!(!e.contains('\n'));
        // The file's keys.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.yaml");
        std::fs::write(&f, "clusterNetwork: 10.128.0.0/14\nhostSubnetLength: 9\nserviceNetwork: 172.30.0.0/16\nclusterNetworkIpv6: fd00:10:128::/56\nhostSubnetLengthIpv6: 64\nserviceNetworkIpv6: fd00:172:30::/112\n").unwrap();
        let c = check(&["--config", f.to_str().unwrap()]).unwrap();
        assert_eq!(c.network.ipv6.unwrap().cluster_network.to_string(), "fd00:10:128::/56");
    }

    const V6: [&str; 4] = ["--cluster-network", "fd00:10:128::/48", "--service-network", "fd00:172:30::/112"];

    /// An IPv6 --cluster-network makes the cluster IPv6-only: the one network is IPv6, the
    /// host subnet length defaults to 64 (a /64 per node), and no IPv6 side is configured.
    #[test]
    fn an_ipv6_cluster_network_is_an_ipv6_only_cluster() {
        let c = check(&V6).unwrap();
        let n = &c.network;
        assert!(n.ipv6_only());
        assert_eq!(n.cluster_network, "fd00:10:128::/48".parse::<IpNet>().unwrap());
        assert_eq!(n.service_network, "fd00:172:30::/112".parse::<IpNet>().unwrap());
        assert_eq!((n.host_subnet_length, n.subnet_prefix()), (64, 64));
        assert_eq!(n.ipv6, None);
        assert!(!check(&OK).unwrap().network.ipv6_only());
        // Given: per family's limits (128 bits).
        let c = check(&[&V6[..], &["--host-subnet-length", "72"]].concat()).unwrap();
        assert_eq!(c.network.subnet_prefix(), 56);
        let e = check(&[&V6[..], &["--host-subnet-length", "81"]].concat()).unwrap_err();
        assert_eq!(e, "--host-subnet-length 81: must be 2 to 80 for --cluster-network fd00:10:128::/48 (a node's subnet is at most the whole network and holds a gateway and a pod)");
        let e = check(&["--cluster-network", "fd00:10:128::/96", "--service-network", "fd00:172:30::/112"]).unwrap_err();
        assert_eq!(e, "--host-subnet-length 64 (the default for an IPv6 --cluster-network): must be 2 to 32 for --cluster-network fd00:10:128::/96 (a node's subnet is at most the whole network and holds a gateway and a pod)");
        // IPv4 keeps no default.
        let e = check(&["--cluster-network", "10.128.0.0/14", "--service-network", "172.30.0.0/16"]).unwrap_err();
        assert_eq!(e, "--host-subnet-length (or hostSubnetLength in --config) is required");
        let e = check(&["--cluster-network", "fd00:10:128::/48", "--service-network", "fd00:10:128::/112"]).unwrap_err();
        assert_eq!(e, "--service-network fd00:10:128::/112 overlaps --cluster-network fd00:10:128::/48");
    }

    #[test]
    fn ipv6_only_refusals_are_one_line_naming_the_flags() {
        // Mixed families, either way round.
        for args in [
            ["--cluster-network", "fd00:10:128::/48", "--service-network", "172.30.0.0/16"],
            ["--cluster-network", "10.128.0.0/14", "--service-network", "fd00:172:30::/112"],
        ] {
            let e = check(&[&args[..], &["--host-subnet-length", "9"]].concat()).unwrap_err();
            assert!(e.starts_with(&format!("--cluster-network {} and --service-network {} must be of the same family", args[1], args[3])), "{e}");
            assert!(!e.contains('\n'));
        }
        // The IPv6 (dual-stack) keys with an IPv6 cluster network, named as given.
        let e = check(&[&V6[..], &["--cluster-network-ipv6", "fd00:20::/48", "--service-network-ipv6", "fd00:30::/112"]].concat()).unwrap_err();
        assert!(e.starts_with("--cluster-network-ipv6, --service-network-ipv6 given with an IPv6 --cluster-network fd00:10:128::/48: "), "{e}");
        assert!(!e.contains('\n'));
        let e = check(&[&V6[..], &["--host-subnet-length-ipv6", "64"]].concat()).unwrap_err();
        assert!(e.starts_with("--host-subnet-length-ipv6 given with an IPv6 --cluster-network"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.yaml");
        std::fs::write(&f, "clusterNetwork: fd00:10:128::/48\nserviceNetwork: fd00:172:30::/112\nclusterNetworkIpv6: fd00:20::/48\n").unwrap();
        let e = check(&["--config", f.to_str().unwrap()]).unwrap_err();
        assert!(e.starts_with("clusterNetworkIpv6 in --config given with an IPv6 --cluster-network"), "{e}");
        // The file's keys make an IPv6-only cluster as the flags do.
        std::fs::write(&f, "clusterNetwork: fd00:10:128::/48\nhostSubnetLength: 64\nserviceNetwork: fd00:172:30::/112\n").unwrap();
        let c = check(&["--config", f.to_str().unwrap()]).unwrap();
        assert!(c.network.ipv6_only());
        assert_eq!(c.network.host_subnet_length, 64);
    }
}
