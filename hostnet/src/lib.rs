//! Host networking for the sdn-node agent, done the way openshift-sdn's node did it but
//! without running any command: rtnetlink for links, addresses and routes; nf_tables over
//! netlink for the firewall; the ethtool ioctl for offloads; /proc/sys files for sysctls.
//!
//! Every operation takes the network namespace it acts in ([`Netns`]), so the agent passes the
//! host namespace and tests pass throwaway ones. Every kernel request has a deadline, replies
//! are never trusted enough to panic on, and errors name the object they concern.
//!
//! - [`setup_pod`] / [`teardown_pod`] / [`check_pod`]: a pod's veth interface (CNI ADD/DEL/CHECK).
//! - [`create_spare`] / [`claim_spare`]: pod interfaces made ahead of time, given to a pod by a
//!   move into its namespace.
//! - [`setup_host`]: the gateway interface (tun0), its routes and forwarding sysctls.
//! - [`install_firewall`] / [`remove_firewall`]: the node's nftables table.
//! - [`veth_state`] / [`delete_owned`]: a pod's veth as recorded (name and ifindex), never by a
//!   name alone.
//!
//! Families: each configuration has an optional IPv4 side and an optional IPv6 side
//! ([`PodConfig::ipv4`]/[`PodConfig::ipv6`], [`HostConfig::ipv4`]/[`HostConfig::ipv6`],
//! [`FirewallConfig::ipv4`]/[`FirewallConfig::ipv6`]), at least one of them: IPv4 only,
//! dual-stack, or IPv6 only (a cluster without an IPv4 overlay). A configuration with neither
//! is refused. A pod's IPv6 address has passed duplicate address detection when
//! [`configure_pod`] answers ([`Error::DadFailed`] when it did not).

pub mod error;
pub mod ethtool;
pub mod firewall;
pub mod host;
pub mod hostif;
pub mod mac;
pub mod names;
pub mod netns;
mod nfbatch;
mod nfnl;
pub mod nl;
pub mod owned;
pub mod pod;
pub mod spare;
pub mod sysctl;

pub use error::{Error, Result};
pub use firewall::{FirewallConfig, FirewallIpv4, FirewallIpv6, DEFAULT_TABLE};
pub use nfbatch::{install_firewall, remove_firewall};
pub use host::{gateway6_of, setup_host, HostChanges, HostConfig, HostIpv4, HostIpv6};
pub use hostif::{host_interface, HostInterface};
pub use mac::MacAddr;
pub use netns::{Netns, NsId, SandboxError};
pub use owned::{delete_owned, veth_state, Deleted, VethState};
pub use spare::{claim_spare, create_spare, move_spare};
pub use pod::{
    add_veth_pairs, check_pod, check_pod_config, configure_pod, make_pod_veth, setup_pod, teardown_pod, PodConfig, PodInterface,
    PodIpv4, PodIpv6, PodRoute, PodRoute6,
};
