//! sdn-node's pure core, as h2 keeps `frame/` free of I/O: everything the agent computes, and
//! nothing that talks to a peer. The compiler keeps it that way — this crate's dependencies
//! have no tokio, no OVSDB client and no netlink.
//!
//! From the sources to the switch, in order:
//! - [`cluster`]: the cluster's objects (HostSubnets, NetNamespaces, pods, Services, policies),
//!   read from a state file ([`cluster::state_file`]) or mapped from Kubernetes by the agent,
//!   every one checked by [`cluster::validate`]; and [`cluster::desired`], which turns a
//!   [`cluster::ClusterState`] into the flows the switch should hold, per owner.
//! - [`pipeline`]: the flows of each table, one pure `flows(&X) -> Vec<Flow>` per file.
//! - [`store`]: the desired and installed mirrors, and their diff as FLOW_MODs.
//! - [`domain`]: the domain's small values (Vnid, OfPort, ContainerId, Plugin).

pub mod cluster;
pub mod domain;
pub mod pipeline;
pub mod store;
