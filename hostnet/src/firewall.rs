//! The node's packet filter and NAT rules in our own nftables table (openshift-sdn's
//! node_iptables.go, translated to one nf_tables table instead of rules spliced into the
//! shared iptables chains).
//!
//! This module is the rule set alone; [`crate::nfbatch`] encodes and installs it. Installing
//! is one atomic netlink batch: "add table (a no-op if it exists), delete table,
//! add table, chains, rules". The kernel applies a batch all or nothing, so readers see either
//! the old rule set or the new one — never an empty or half-built table — and running it
//! again replaces rather than duplicates.
//!
//! Families: one table per overlay family, `ip` for an IPv4 cluster network, `ip6` (same name,
//! same rule set) for an IPv6 one, each optional, at least one there; installed by one batch:
//! one transaction replaces both families or neither. The batch removes the table of a family
//! the configuration does not have (left from an earlier configuration that had it), so an
//! IPv4 cluster becoming IPv6-only (or the reverse) never runs with a stale table.
//!
//! Overlay and underlay: the masquerade and forward rules are the overlay's (they match the
//! cluster network, so they exist per cluster family). The input rules (VXLAN from other
//! nodes, anything from tun) match no address; they sit in each family's table. An IPv6-only
//! cluster over an IPv4 underlay has no `ip` table, so no rule of ours names its IPv4 VXLAN
//! packets; this changes no packet's fate: our chains' policy is accept, and an accept in one
//! base chain decides nothing for the host's other tables (nf_tables runs every base chain on
//! a hook; only a drop is final), so those rules never were what let VXLAN in. They say what
//! the node expects; the packets get through the same with or without them.

use std::ffi::CString;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::{
    error::{Error, Result},
    names::check_ifname,
};

/// Default name of our tables (family `ip`, and `ip6` for dual-stack).
pub const DEFAULT_TABLE: &str = "sdn-node";

/// Parameters of the rule set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirewallConfig {
    /// Our table's name; one table per agent, so tests can use their own.
    pub table: String,
    /// The IPv4 overlay side; None: an IPv6-only cluster (no `ip` table; one left from before
    /// is removed).
    pub ipv4: Option<FirewallIpv4>,
    /// UDP port of VXLAN traffic from other nodes (4789).
    pub vxlan_port: u16,
    /// The gateway interface (tun0).
    pub tun: String,
    /// Whether traffic from the cluster network to the cluster network is masqueraded too.
    /// `true` (openshift-sdn VERSION 3, subnet and multitenant): a pod's Service traffic,
    /// DNATed by kube-proxy to another pod, leaves tun0 with the node's address, so the
    /// endpoint answers the node, which un-NATs the reply. `false` (VERSION 4, networkpolicy):
    /// the client's address is kept so that NetworkPolicy can judge it; the flows send the
    /// endpoint's replies back through tun0 for the un-NAT instead.
    pub masquerade_within_cluster: bool,
    /// The IPv6 overlay side: the same rules for IPv6 in an `ip6` table; None: IPv4 only (no
    /// `ip6` table; one left from before is removed). At least one of `ipv4` and `ipv6` is
    /// there.
    pub ipv6: Option<FirewallIpv6>,
}

/// The IPv4 networks of the rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirewallIpv4 {
    pub cluster_network: Ipv4Net,
    /// Accepted for completeness with the agent's configuration; openshift-sdn's node rules
    /// do not match on it (kube-proxy owns service traffic), so neither do ours.
    pub service_network: Ipv4Net,
}

/// The IPv6 networks of the rules (a dual-stack or IPv6-only cluster).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirewallIpv6 {
    pub cluster_network: Ipv6Net,
    /// Not matched on, as [`FirewallIpv4::service_network`].
    pub service_network: Ipv6Net,
}

impl FirewallConfig {
    /// The usual IPv4 configuration: table `sdn-node`, VXLAN port 4789, `tun0`, no IPv6 side.
    pub fn new(cluster_network: Ipv4Net, service_network: Ipv4Net) -> Self {
        FirewallConfig { ipv4: Some(FirewallIpv4 { cluster_network, service_network }), ..Self::defaults() }
    }

    /// An IPv6-only cluster's configuration, with the same defaults as [`FirewallConfig::new`].
    pub fn ipv6_only(v6: FirewallIpv6) -> Self {
        FirewallConfig { ipv6: Some(v6), ..Self::defaults() }
    }

    fn defaults() -> Self {
        FirewallConfig {
            table: DEFAULT_TABLE.into(),
            ipv4: None,
            vxlan_port: 4789,
            tun: "tun0".into(),
            masquerade_within_cluster: true,
            ipv6: None,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        check_table_name(&self.table)?;
        check_ifname(&self.tun)?;
        if self.vxlan_port == 0 {
            return Err(Error::invalid("VXLAN port 0", "must be 1..=65535"));
        }
        if self.ipv4.is_none() && self.ipv6.is_none() {
            // Installing nothing is remove_firewall's job; a configuration without a cluster
            // family is a caller's bug.
            return Err(Error::invalid(
                format!("nftables table {}", self.table),
                "firewall configuration has neither an IPv4 nor an IPv6 side",
            ));
        }
        Ok(())
    }
}

/// The base chains of our table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainId {
    /// nat, hook postrouting, priority 100 (srcnat).
    Postrouting,
    /// filter, hook forward, priority 0, policy accept.
    Forward,
    /// filter, hook input, priority 0, policy accept.
    Input,
}

impl ChainId {
    pub const ALL: [ChainId; 3] = [ChainId::Postrouting, ChainId::Forward, ChainId::Input];

    pub fn name(self) -> &'static str {
        match self {
            ChainId::Postrouting => "postrouting",
            ChainId::Forward => "forward",
            ChainId::Input => "input",
        }
    }
}

/// One match of a rule; all matches of a rule must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Match {
    /// Source address in the network (the rule's family is the network's).
    SaddrIn(IpNet),
    DaddrIn(IpNet),
    DaddrNotIn(IpNet),
    CtStateInvalid,
    UdpDport(u16),
    IifName(String),
}

/// What a matching packet gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Accept,
    Drop,
    Masquerade,
}

/// One rule, in chain order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSpec {
    pub chain: ChainId,
    pub matches: Vec<Match>,
    pub action: Action,
    pub comment: &'static str,
}

/// The IPv4 rule set (empty without [`FirewallConfig::ipv4`]), as data (so its order and
/// content are unit-testable without a kernel).
pub fn rules(cfg: &FirewallConfig) -> Vec<RuleSpec> {
    match &cfg.ipv4 {
        Some(v4) => family_rules(cfg, IpNet::V4(v4.cluster_network.trunc())),
        None => Vec::new(),
    }
}

/// The IPv6 rule set (empty without [`FirewallConfig::ipv6`]): [`rules`] for the IPv6 cluster
/// network.
pub fn rules6(cfg: &FirewallConfig) -> Vec<RuleSpec> {
    match &cfg.ipv6 {
        Some(v6) => family_rules(cfg, IpNet::V6(v6.cluster_network.trunc())),
        None => Vec::new(),
    }
}

fn family_rules(cfg: &FirewallConfig, cn: IpNet) -> Vec<RuleSpec> {
    let rule = |chain, matches, action, comment| RuleSpec { chain, matches, action, comment };
    let masquerade = if cfg.masquerade_within_cluster {
        rule(ChainId::Postrouting, vec![Match::SaddrIn(cn)], Action::Masquerade, "masquerade pod-to-service and pod-to-external traffic")
    } else {
        rule(ChainId::Postrouting, vec![Match::SaddrIn(cn), Match::DaddrNotIn(cn)], Action::Masquerade, "masquerade pod-to-external traffic")
    };
    vec![
        masquerade,
        // INVALID first: a late retransmission after a connection closed must not be
        // forwarded by the accepts below.
        rule(
            ChainId::Forward,
            vec![Match::SaddrIn(cn), Match::CtStateInvalid],
            Action::Drop,
            "attempted resend after connection close",
        ),
        rule(ChainId::Forward, vec![Match::DaddrIn(cn)], Action::Accept, "forward traffic to SDN"),
        rule(ChainId::Forward, vec![Match::SaddrIn(cn)], Action::Accept, "forward traffic from SDN"),
        rule(ChainId::Input, vec![Match::UdpDport(cfg.vxlan_port)], Action::Accept, "VXLAN incoming"),
        rule(ChainId::Input, vec![Match::IifName(cfg.tun.clone())], Action::Accept, "from SDN to localhost"),
    ]
}

pub(crate) fn check_table_name(name: &str) -> Result<()> {
    // NFT_NAME_MAXLEN is 256 including the NUL.
    if name.is_empty() || name.len() > 255 || CString::new(name).is_err() {
        return Err(Error::invalid(
            format!("nftables table name {name:?}"),
            "empty, longer than 255 bytes or containing NUL",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> FirewallConfig {
        FirewallConfig::new("10.128.0.0/14".parse().unwrap(), "172.30.0.0/16".parse().unwrap())
    }

    #[test]
    fn forward_chain_drops_invalid_first() {
        let r = rules(&cfg());
        let fwd: Vec<_> = r.iter().filter(|r| r.chain == ChainId::Forward).collect();
        assert_eq!(fwd.len(), 3);
        assert_eq!(fwd[0].action, Action::Drop);
        assert!(fwd[0].matches.contains(&Match::CtStateInvalid));
        assert!(fwd[1..].iter().all(|r| r.action == Action::Accept));
    }

    #[test]
    fn masquerade_everything_from_the_cluster_network_by_default() {
        let r = rules(&cfg());
        let cn: IpNet = "10.128.0.0/14".parse().unwrap();
        assert_eq!(r[0].matches, vec![Match::SaddrIn(cn)]);
        assert_eq!(r[0].action, Action::Masquerade);
    }

    #[test]
    fn masquerade_only_leaving_cluster_when_sources_are_kept() {
        let mut c = cfg();
        c.masquerade_within_cluster = false;
        let r = rules(&c);
        let cn: IpNet = "10.128.0.0/14".parse().unwrap();
        assert_eq!(r[0].matches, vec![Match::SaddrIn(cn), Match::DaddrNotIn(cn)]);
        assert_eq!(r[0].action, Action::Masquerade);
    }

    #[test]
    fn input_uses_parameters() {
        let mut c = cfg();
        c.vxlan_port = 8472;
        c.tun = "br-gw".into();
        let r = rules(&c);
        assert!(r.iter().any(|r| r.matches == vec![Match::UdpDport(8472)]));
        assert!(r.iter().any(|r| r.matches == vec![Match::IifName("br-gw".into())]));
    }

    #[test]
    fn host_bits_of_cluster_network_are_ignored() {
        let c = FirewallConfig::new("10.128.3.7/14".parse().unwrap(), "172.30.0.0/16".parse().unwrap());
        assert_eq!(rules(&c)[1].matches[0], Match::SaddrIn("10.128.0.0/14".parse().unwrap()));
    }

    #[test]
    fn ipv6_rules_are_the_ipv4_ones_for_the_ipv6_cluster_network() {
        assert!(rules6(&cfg()).is_empty());
        for within in [true, false] {
            let mut c = cfg();
            c.masquerade_within_cluster = within;
            c.ipv6 = Some(FirewallIpv6 {
                cluster_network: "fd00:10:128:5::/48".parse().unwrap(),
                service_network: "fd00:172:30::/112".parse().unwrap(),
            });
            let v4 = rules(&c);
            let v6 = rules6(&c);
            let cn4: IpNet = "10.128.0.0/14".parse().unwrap();
            let cn6: IpNet = "fd00:10:128::/48".parse().unwrap();
            let swap = |m: &Match| match m {
                Match::SaddrIn(n) if *n == cn4 => Match::SaddrIn(cn6),
                Match::DaddrIn(n) if *n == cn4 => Match::DaddrIn(cn6),
                Match::DaddrNotIn(n) if *n == cn4 => Match::DaddrNotIn(cn6),
                other => other.clone(),
            };
            let expected: Vec<RuleSpec> =
                v4.iter().map(|r| RuleSpec { matches: r.matches.iter().map(swap).collect(), ..r.clone() }).collect();
            assert_eq!(v6, expected);
            // The IPv4 rules do not depend on the IPv6 side.
            assert_eq!(v4, rules(&FirewallConfig { ipv6: None, ..c.clone() }));
            // Nor the IPv6 rules on the IPv4 side: an IPv6-only cluster has the same ones.
            assert_eq!(v6, rules6(&FirewallConfig { ipv4: None, ..c.clone() }));
        }
    }

    #[test]
    fn ipv6_only_has_no_ipv4_rules_and_the_usual_defaults() {
        let v6 = FirewallIpv6 {
            cluster_network: "fd00:10:128::/48".parse().unwrap(),
            service_network: "fd00:172:30::/112".parse().unwrap(),
        };
        let c = FirewallConfig::ipv6_only(v6.clone());
        c.validate().unwrap();
        assert!(rules(&c).is_empty());
        assert_eq!(rules6(&c).len(), 6);
        assert_eq!(c, FirewallConfig { ipv4: None, ipv6: Some(v6), ..cfg() });
        let e = FirewallConfig { ipv6: None, ..c }.validate().unwrap_err().to_string();
        assert!(e.contains("neither an IPv4 nor an IPv6"), "{e}");
    }

    #[test]
    fn table_names() {
        check_table_name("sdn-node").unwrap();
        assert!(check_table_name("").is_err());
        assert!(check_table_name("a\0b").is_err());
        assert!(check_table_name(&"x".repeat(256)).is_err());
    }
}
