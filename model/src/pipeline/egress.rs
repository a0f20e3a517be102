//! UpdateEgressNetworkPolicyRules: table 100 for one VNID.
//!
//! The seed swaps rules with a temporary priority-65535 drop and cookie tricks; here the whole
//! new rule set of a VNID is computed up front and the store swaps it in one atomic bundle, so
//! there is no window where traffic is dropped or leaks.
//!
//! IPv6 (a dual-stack node, [`flows_for`] with `ipv6`): an EgressNetworkPolicy governs the
//! namespace's IPv6 egress too, and never lets it escape the policy:
//!
//! - an IPv6 `cidrSelector` ([`Target::Cidr6`]) matches IPv6 destinations (`ipv6` flows), an
//!   IPv4 one IPv4 destinations;
//! - `0.0.0.0/0` (and `0.0.0.0/32`, corrected to it as the seed does) is the policy's
//!   catch-all, "every destination", as openshift-sdn documents it: it matches IPv6 too, so the
//!   usual last rule `Deny 0.0.0.0/0` denies IPv6 egress and an `Allow 0.0.0.0/0` allows it;
//!   `::/0` is every IPv6 destination only;
//! - a `dnsName` matches the addresses its name resolves to ([`DnsAnswers`]: A and AAAA
//!   records), each in its family's flows. A name with no address of any family the node has
//!   is a failed lookup (every packet of the VNID dropped, as openshift-sdn drops them when a
//!   name does not resolve): on an IPv4 node a name with AAAA records alone, as before AAAA
//!   was asked; on an IPv6-only node one with A records alone;
//! - IPv6 traffic no rule matches is **denied** (`ipv6,reg0=<VNID>` drop at priority 1, the
//!   IPv6 rules one priority above their IPv4 twins' to make room; the two families' flows
//!   never overlap). IPv4 traffic no rule matches goes out, as openshift-sdn has it; for IPv6
//!   there is no such legacy, and a policy written with IPv4 rules only (a deny list of IPv4
//!   ranges, say) must not leave the namespace's IPv6 egress open: fail closed, allowed only
//!   where a rule says so.
//!
//! The error branches (a shared NetNamespace, several policies, an unresolved name) drop every
//! packet of the VNID whatever its family (`reg0=<VNID>`, no `ip` match), as before.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use openflow::flow_match::Ipv6Match;
use openflow::{Ipv4Match, Masked, Match};

use super::{cidr, host, output, Flow, Reg, Table};
use crate::domain::{OfPort, Vnid};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleType {
    Allow,
    Deny,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Cidr(Ipv4Net),
    /// An IPv6 `cidrSelector` (IPv6 destinations only; see the module documentation).
    Cidr6(Ipv6Net),
    DnsName(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub kind: RuleType,
    pub to: Target,
}

/// An EgressNetworkPolicy (namespaced).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub namespace: String,
    pub name: String,
    pub rules: Vec<Rule>,
}

/// The answers for the DNS names the policies use (A and AAAA records), resolved before the
/// flows are built.
pub type DnsAnswers = BTreeMap<String, Result<Vec<std::net::IpAddr>, String>>;

/// The table-100 flows of one VNID, plus what the seed reports as errors and warnings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub flows: Vec<Flow>,
    pub error: Option<String>,
    /// A DNS name could not be resolved, so the VNID drops all egress traffic (the seed's
    /// behaviour). An operational condition, not bad input: reported apart from `error`.
    pub dns_error: Option<String>,
    pub warnings: Vec<String>,
}

fn names(policies: &[Policy]) -> String {
    policies.iter().map(|p| format!("{}:{}", p.namespace, p.name)).collect::<Vec<_>>().join(", ")
}

fn drop_all(vnid: Vnid) -> Flow {
    Flow::drop(Table::EgressPolicy, 1, Match::any().reg(Reg::SrcVnid.n(), vnid.get()))
}

/// The four branches of the seed: no policy; VNID 0 (ignored, error); a shared NetNamespace or
/// several policies (drop all, error); one policy (its rules in order, first rule highest).
/// IPv4 only (a node without IPv6): [`flows_for`] without `ipv6`.
pub fn flows(vnid: Vnid, policies: &[Policy], namespaces: &[String], dns: &DnsAnswers) -> Outcome {
    flows_for(vnid, policies, namespaces, dns, Families { ipv4: true, ipv6: false })
}

/// The node's IP families: which of a policy's flows exist (an IPv6-only node has no `ip`
/// flow, an IPv4 node no `ipv6` one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Families {
    pub ipv4: bool,
    pub ipv6: bool,
}

/// [`flows`] for the node's `families`: with `ipv6` (a dual-stack or IPv6-only node) the
/// policy's IPv6 flows: its IPv6 rules, the catch-all `0.0.0.0/0`'s IPv6 twin, and the IPv6
/// default deny (see the module documentation). Without `ipv6`, IPv6 rules make no flow (no
/// IPv6 packet reaches table 100); without `ipv4` (an IPv6-only node), IPv4 rules make none.
pub fn flows_for(vnid: Vnid, policies: &[Policy], namespaces: &[String], dns: &DnsAnswers, families: Families) -> Outcome {
    let Families { ipv4, ipv6 } = families;
    let mut out = Outcome::default();
    if policies.is_empty() {
        return out;
    }
    if vnid == Vnid::GLOBAL {
        out.error =
            Some(format!("EgressNetworkPolicy in global network namespace is not allowed ({}); ignoring", names(policies)));
        return out;
    }
    if namespaces.len() > 1 {
        out.error = Some(format!(
            "EgressNetworkPolicy not allowed in shared NetNamespace ({}); dropping all traffic",
            namespaces.join(", ")
        ));
        out.flows.push(drop_all(vnid));
        return out;
    }
    if policies.len() > 1 {
        out.error = Some(format!(
            "multiple EgressNetworkPolicies in same network namespace ({}) is not allowed; dropping all traffic",
            names(policies)
        ));
        out.flows.push(drop_all(vnid));
        return out;
    }
    let policy = &policies[0];
    let n = policy.rules.len();
    let mut dns_failure = None;
    for (i, rule) in policy.rules.iter().enumerate() {
        // n is bounded by validation (at most 10,000 rules), so this fits.
        let priority = (n - i) as u16;
        let actions = match rule.kind {
            RuleType::Allow => vec![output(OfPort::TUN)],
            RuleType::Deny => vec![],
        };
        let mut dsts: Vec<Option<openflow::Masked<Ipv4Addr>>> = Vec::new();
        // IPv6 destinations (`Some(None)`: every one).
        let mut dsts6: Vec<Option<Masked<Ipv6Addr>>> = Vec::new();
        match &rule.to {
            Target::Cidr(net) if net.prefix_len() == 0 => {
                dsts.push(None);
                dsts6.push(None);
            }
            Target::Cidr(net) if *net == Ipv4Net::new(Ipv4Addr::UNSPECIFIED, 32).unwrap_or_default() => {
                out.warnings.push(format!(
                    "Correcting CIDRSelector '0.0.0.0/32' to '0.0.0.0/0' in EgressNetworkPolicy {}:{}",
                    policy.namespace, policy.name
                ));
                dsts.push(None);
                dsts6.push(None);
            }
            Target::Cidr6(net) if net.prefix_len() == 0 => dsts6.push(None),
            Target::Cidr6(net) => dsts6.push(Some(Masked::cidr(net.network(), net.prefix_len()).unwrap_or(Masked::exact(net.network())))),
            Target::Cidr(net) => {
                dsts.push(Some(cidr(*net)));
            }
            Target::DnsName(name) => match dns.get(name) {
                Some(Ok(ips)) => {
                    let mut usable = false;
                    for ip in ips {
                        match ip {
                            std::net::IpAddr::V4(a) if ipv4 => {
                                usable = true;
                                if !dsts.contains(&Some(host(*a))) {
                                    dsts.push(Some(host(*a)));
                                }
                            }
                            std::net::IpAddr::V6(a) if ipv6 => {
                                usable = true;
                                let m = Some(Masked::exact(*a));
                                if !dsts6.contains(&m) {
                                    dsts6.push(m);
                                }
                            }
                            _ => {}
                        }
                    }
                    if !usable {
                        let want = match (ipv4, ipv6) {
                            (true, false) => "IPv4 address",
                            (false, true) => "IPv6 address",
                            _ => "address",
                        };
                        dns_failure = Some(format!("{name}: no {want}"));
                    }
                }
                Some(Err(e)) => dns_failure = Some(format!("{name}: {e}")),
                None => dns_failure = Some(format!("{name}: not resolved")),
            },
        }
        for dst in dsts.into_iter().filter(|_| ipv4) {
            out.flows.push(Flow::new(
                Table::EgressPolicy,
                priority,
                Match::any().reg(Reg::SrcVnid.n(), vnid.get()).ipv4(Ipv4Match { dst, ..Default::default() }),
                actions.clone(),
                None,
            ));
        }
        if ipv6 {
            for dst in dsts6 {
                out.flows.push(Flow::new(
                    Table::EgressPolicy,
                    priority + 1,
                    Match::any().reg(Reg::SrcVnid.n(), vnid.get()).ipv6(Ipv6Match { dst, ..Default::default() }),
                    actions.clone(),
                    None,
                ));
            }
        }
    }
    if ipv6 {
        // IPv6 no rule matched: denied (fail closed; see the module documentation).
        out.flows.push(Flow::drop(Table::EgressPolicy, 1, Match::any().reg(Reg::SrcVnid.n(), vnid.get()).ipv6(Ipv6Match::default())));
    }
    if let Some(e) = dns_failure {
        let ns = &policy.namespace;
        out.dns_error = Some(format!("DNS resolver failed: {e}, dropping all traffic for namespace: {ns:?}"));
        out.flows = vec![drop_all(vnid)];
    }
    out
}

/// The DNS names a set of policies needs resolved.
pub fn dns_names(policies: &[Policy]) -> BTreeSet<String> {
    policies
        .iter()
        .flat_map(|p| p.rules.iter())
        .filter_map(|r| match &r.to {
            Target::DnsName(n) => Some(n.clone()),
            Target::Cidr(_) | Target::Cidr6(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(rules: Vec<Rule>) -> Policy {
        Policy { namespace: "team-a".into(), name: "default".into(), rules }
    }
    fn allow(to: Target) -> Rule {
        Rule { kind: RuleType::Allow, to }
    }
    fn deny(to: Target) -> Rule {
        Rule { kind: RuleType::Deny, to }
    }
    fn text(o: &Outcome) -> Vec<String> {
        o.flows.iter().map(|f| f.to_string()).collect()
    }

    #[test]
    fn one_policy_in_order() {
        let v = Vnid::new(11).unwrap();
        let mut dns = DnsAnswers::new();
        dns.insert("www.example.com".into(), Ok(vec!["93.184.216.34".parse().unwrap()]));
        let p = policy(vec![
            allow(Target::Cidr("1.2.3.0/24".parse().unwrap())),
            allow(Target::DnsName("www.example.com".into())),
            deny(Target::Cidr("0.0.0.0/0".parse().unwrap())),
        ]);
        let o = flows(v, &[p], &["team-a".into()], &dns);
        assert_eq!(o.error, None);
        assert_eq!(
            text(&o),
            vec![
                "table=100, priority=3,ip,reg0=0xb,nw_dst=1.2.3.0/24 actions=output:2",
                "table=100, priority=2,ip,reg0=0xb,nw_dst=93.184.216.34 actions=output:2",
                "table=100, priority=1,ip,reg0=0xb actions=drop",
            ]
        );
    }

    #[test]
    fn branches() {
        let v = Vnid::new(11).unwrap();
        let p = policy(vec![deny(Target::Cidr("0.0.0.0/32".parse().unwrap()))]);
        let dns = DnsAnswers::new();
        assert_eq!(flows(v, &[], &["team-a".into()], &dns), Outcome::default());
        let g = flows(Vnid::GLOBAL, std::slice::from_ref(&p), &["default".into()], &dns);
        assert!(g.flows.is_empty() && g.error.unwrap().contains("global"));
        let shared = flows(v, std::slice::from_ref(&p), &["a".into(), "b".into()], &dns);
        assert_eq!(text(&shared), vec!["table=100, priority=1,reg0=0xb actions=drop"]);
        assert!(shared.error.unwrap().contains("shared NetNamespace (a, b)"));
        let two = flows(v, &[p.clone(), p.clone()], &["team-a".into()], &dns);
        assert!(two.error.unwrap().contains("multiple"));
        let fixed = flows(v, &[p], &["team-a".into()], &dns);
        assert_eq!(text(&fixed), vec!["table=100, priority=1,ip,reg0=0xb actions=drop"]);
        assert!(fixed.warnings[0].contains("0.0.0.0/32"));
        let unresolved = flows(v, &[policy(vec![allow(Target::DnsName("nx.invalid".into()))])], &["team-a".into()], &dns);
        assert_eq!(text(&unresolved), vec!["table=100, priority=1,reg0=0xb actions=drop"]);
        assert!(unresolved.dns_error.unwrap().contains("DNS resolver failed"));
        assert!(unresolved.error.is_none());
    }

    #[test]
    fn ipv6_obeys_the_policy() {
        let v = Vnid::new(11).unwrap();
        let mut dns = DnsAnswers::new();
        dns.insert("www.example.com".into(), Ok(vec!["93.184.216.34".parse().unwrap()]));
        let p = policy(vec![
            allow(Target::Cidr("1.2.3.0/24".parse().unwrap())),
            allow(Target::Cidr6("2001:db8:1::/48".parse().unwrap())),
            allow(Target::DnsName("www.example.com".into())),
            deny(Target::Cidr("0.0.0.0/0".parse().unwrap())),
        ]);
        let o = flows_for(v, std::slice::from_ref(&p), &["team-a".into()], &dns, Families { ipv4: true, ipv6: true });
        assert_eq!(o.error, None);
        assert_eq!(
            text(&o),
            vec![
                "table=100, priority=4,ip,reg0=0xb,nw_dst=1.2.3.0/24 actions=output:2",
                "table=100, priority=4,ipv6,reg0=0xb,ipv6_dst=2001:db8:1::/48 actions=output:2",
                "table=100, priority=2,ip,reg0=0xb,nw_dst=93.184.216.34 actions=output:2",
                // The catch-all is both families'.
                "table=100, priority=1,ip,reg0=0xb actions=drop",
                "table=100, priority=2,ipv6,reg0=0xb actions=drop",
                "table=100, priority=1,ipv6,reg0=0xb actions=drop",
            ]
        );
        // Without IPv6 on the node: exactly the IPv4 flows of `flows`, the IPv6 rule makes none.
        assert_eq!(text(&flows_for(v, std::slice::from_ref(&p), &["team-a".into()], &dns, Families { ipv4: true, ipv6: false })), text(&flows(v, &[p], &["team-a".into()], &dns)));
        // IPv4 rules only (a deny list): IPv4 goes out past them, IPv6 is denied by default.
        let deny_list = policy(vec![deny(Target::Cidr("10.0.0.0/8".parse().unwrap()))]);
        assert_eq!(
            text(&flows_for(v, &[deny_list], &["team-a".into()], &dns, Families { ipv4: true, ipv6: true })),
            vec!["table=100, priority=1,ip,reg0=0xb,nw_dst=10.0.0.0/8 actions=drop", "table=100, priority=1,ipv6,reg0=0xb actions=drop"]
        );
        // Allow everything: both families (`::/0` too).
        let open = policy(vec![allow(Target::Cidr6("::/0".parse().unwrap())), allow(Target::Cidr("0.0.0.0/0".parse().unwrap()))]);
        assert_eq!(
            text(&flows_for(v, &[open], &["team-a".into()], &dns, Families { ipv4: true, ipv6: true })),
            vec![
                "table=100, priority=3,ipv6,reg0=0xb actions=output:2",
                "table=100, priority=1,ip,reg0=0xb actions=output:2",
                "table=100, priority=2,ipv6,reg0=0xb actions=output:2",
                "table=100, priority=1,ipv6,reg0=0xb actions=drop",
            ]
        );
        // A shared NetNamespace: every packet of the VNID, both families.
        let shared = flows_for(v, &[policy(vec![])], &["a".into(), "b".into()], &dns, Families { ipv4: true, ipv6: true });
        assert_eq!(text(&shared), vec!["table=100, priority=1,reg0=0xb actions=drop"]);
    }

    /// An IPv6-only node: the policy's IPv6 flows and its IPv6 default deny, no `ip` flow.
    #[test]
    fn ipv6_only_has_no_ipv4_flow() {
        let v = Vnid::new(11).unwrap();
        let p = Policy {
            namespace: "team-a".into(),
            name: "default".into(),
            rules: vec![
                Rule { kind: RuleType::Allow, to: Target::Cidr("10.0.0.0/8".parse().unwrap()) },
                Rule { kind: RuleType::Allow, to: Target::Cidr6("fd00:aa::/32".parse().unwrap()) },
                Rule { kind: RuleType::Deny, to: Target::Cidr("0.0.0.0/0".parse().unwrap()) },
            ],
        };
        let o = flows_for(v, &[p], &["team-a".into()], &Default::default(), Families { ipv4: false, ipv6: true });
        let t: Vec<String> = o.flows.iter().map(|f| f.to_string()).collect();
        assert_eq!(
            t,
            vec![
                "table=100, priority=3,ipv6,reg0=0xb,ipv6_dst=fd00:aa::/32 actions=output:2",
                "table=100, priority=2,ipv6,reg0=0xb actions=drop",
                "table=100, priority=1,ipv6,reg0=0xb actions=drop",
            ]
        );
    }

    /// A dnsName's A and AAAA records, each in its family's flows; a name with no address of
    /// the node's families is a failed lookup (drop all), in IPv4 as before AAAA was asked.
    #[test]
    fn dns_names_match_both_families() {
        let v = Vnid::new(11).unwrap();
        let mut dns = DnsAnswers::new();
        dns.insert("both.example".into(), Ok(vec!["192.0.2.7".parse().unwrap(), "2001:db8::7".parse().unwrap()]));
        dns.insert("six.example".into(), Ok(vec!["2001:db8::6".parse().unwrap()]));
        let p = |name: &str| policy(vec![allow(Target::DnsName(name.into())), deny(Target::Cidr("0.0.0.0/0".parse().unwrap()))]);
        let dual = Families { ipv4: true, ipv6: true };
        let o = flows_for(v, &[p("both.example")], &["team-a".into()], &dns, dual);
        assert_eq!(o.dns_error, None);
        let t = text(&o);
        assert!(t.contains(&"table=100, priority=2,ip,reg0=0xb,nw_dst=192.0.2.7 actions=output:2".to_string()), "{t:#?}");
        assert!(t.contains(&"table=100, priority=3,ipv6,reg0=0xb,ipv6_dst=2001:db8::7 actions=output:2".to_string()), "{t:#?}");
        // IPv6 alone: fine on a dual-stack or IPv6-only node, a failure on an IPv4 one.
        assert_eq!(flows_for(v, &[p("six.example")], &["team-a".into()], &dns, dual).dns_error, None);
        let v6only = flows_for(v, &[p("six.example")], &["team-a".into()], &dns, Families { ipv4: false, ipv6: true });
        assert_eq!(v6only.dns_error, None);
        assert!(text(&v6only).contains(&"table=100, priority=3,ipv6,reg0=0xb,ipv6_dst=2001:db8::6 actions=output:2".to_string()));
        let v4 = flows(v, &[p("six.example")], &["team-a".into()], &dns);
        assert!(v4.dns_error.as_deref().is_some_and(|e| e.contains("six.example: no IPv4 address")), "{v4:?}");
        assert_eq!(text(&v4), vec!["table=100, priority=1,reg0=0xb actions=drop"]);
    }
}
