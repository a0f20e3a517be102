//! Network interface identifiers, one definition each for every crate of sdn-node.
//!
//! - [`MacAddr`]: the Ethernet address. OpenFlow matches on it, the kernel sets it on a pod's
//!   interface, the CNI plugin reports it; it used to be two types (openflow's and hostnet's)
//!   converted into each other, and a third check in the plugin. The pod MAC *rule* (`0a:58:` +
//!   the IPv4 bytes) is not here: it is `sdn_model::model::pod_mac`.
//! - [`check_ifname`]: what an interface name may be, checked by the CNI plugin (`CNI_IFNAME`,
//!   the agent's `hostVeth`), by the agent (a CNI request's `ifName`, a pod's `hostVeth`) and by
//!   hostnet before any netlink request. One rule, so that no layer accepts a name another
//!   refuses; each layer words its refusal as it always has.
//!
//! Lowest crate of the workspace: no dependencies (serde only behind the `serde` feature, for
//! MacAddr's JSON text form), so the plugin and the codec stay small.

mod ifname;
mod mac;

pub use ifname::{check_ifname, IfNameError, IFNAME_MAX};
pub use mac::{MacAddr, MacParseError};
