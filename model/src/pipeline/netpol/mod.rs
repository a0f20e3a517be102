//! The NetworkPolicy plugin's flows (plugin id 2): conntrack in table 21, isolation per
//! destination pod in table 80, per source pod in table 27 ([`egress`]); both directions share
//! one compiler (`compile.rs`, `cube.rs`), mirrored by [`Side`].
//!
//! The design is openshift-sdn's VERSION 4 one, not VERSION 3's (see
//! docs/networkpolicy.md): traffic from local pods to the cluster network is committed to
//! conntrack in table 21, and table 80 accepts replies of tracked connections before any policy
//! flow, so a policy never cuts the return direction of a connection it allowed.
//!
//! Table 80 in networkpolicy mode, highest priority first:
//!
//! | priority | match | action | owner |
//! |---|---|---|---|
//! | 300 | `ip,nw_src=<gateway>` | `output:NXM_NX_REG2[]` | base |
//! | 200 | `ip,ct_state=+rpl+trk` | `output:NXM_NX_REG2[]` | plugin: replies |
//! | 200 | `ct_state=+est+trk,tcp` / `…,udp` | `output:NXM_NX_REG2[]` | plugin: established TCP/UDP (not SCTP: OVS 3.1 keys SCTP conntrack entries without ports) |
//! | 200 | `ct_state=+trk,ct_mark=0x2/0x2,udp` | `output:NXM_NX_REG2[]` | plugin: UDP an allowed entry marked (a one-way stream is never `+est`) |
//! | 150 | `ip,nw_dst=<pod>` + source + port | `ct(commit,zone=Z,exec(load:1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]` ("allowed", below) | namespace: a small rule, plain |
//! | 150 | `ip,reg0=<VNID>` / `ip,nw_src=<CIDR>` | `conjunction(id,1/n),...` | namespaces: source clause (one flow per source on the node, shared) |
//! | 150 | `ip,nw_dst=<pod>` | `conjunction(id,k/n),...` | namespace: destination clause |
//! | 150 | `tcp,reg1=<ns VNID>,tp_dst=<port/mask>` (and its later-fragment twin) | `conjunction(id,n/n),...` | namespace: port clause |
//! | 150 | `conj_id=<id>,ip,reg1=<ns VNID>` | allowed | namespace: the rule |
//! | 100 | `ip,nw_dst=<pod>` | `drop` | namespace: a pod some policy selects |
//! | 50 | `ip` | `output:NXM_NX_REG2[]` | plugin: pods no policy selects |
//! | 0 | | `drop` | base |
//!
//! "Allowed" is `ct(commit,zone=64000,exec(load:1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]`:
//! every allowed entry (plain flow or `conj_id` flow) sets `ct_mark` bit 0x2 on the
//! connection's conntrack entry (committed already by table 21 or 30), so that the marked-UDP
//! flow at 200 passes a one-way UDP stream's later datagrams: the policy flows, whose
//! statistics are the per-policy connection counters ([`counted`]) and which carry the audit
//! log's copy, see it once ([`Side::allow_logged`], `allowed_udp`). Table 27 does the same
//! with bit 0x4 ([`egress`]). The datagrams the switch handles in one batch with the first,
//! before its verdict is committed, are judged too (a burst, at most a batch).
//!
//! A rule (one ingress rule of one policy, for the pods of the policy that share its resolved
//! ports) is a conjunctive match of up to three clauses — sources (absent for "any"),
//! destination pods, ports (absent for "any") — so it costs |sources| + |pods| + |ports| + 1
//! flows instead of their product; a clause flow whose match several rules use is one flow
//! with all their `conjunction` actions (sorted by id). When the product is no larger (a rule
//! with one source, one pod and one port; a rule with only the destination clause, which a
//! conjunction of one clause cannot express), the rule is plain flows with `nw_dst=<pod>`.
//!
//! Why this is safe with OVS's classifier (lib/classifier.c `classifier_lookup__`): a packet's
//! conjunctions at priority P are considered only when no non-conjunctive ("hard") flow of
//! priority ≥ P matches; every flow a packet matches is seen (per subtable the best, lower
//! ones of identical match on the way down), and at P any conjunction whose every clause
//! matched sends the packet to its `conj_id` flow (same priority). Every allowed entry —
//! plain flow or `conj_id` flow — has the same action, so whichever OVS picks among them,
//! and whether a plain allowed flow at 150 hides the conjunctions, the packet is output; no
//! drop or other action shares priority 150. tests/netpol_flows.rs walks every state's flows
//! with those rules (conjunctions expanded into the boxes they match) and fails on two
//! overlapping entries of one priority with different actions, on clause flows whose
//! conjunction has no `conj_id` flow at their priority, and on an id used twice.
//!
//! Namespaces apart: the destination clause names the pod, and the port clause and the
//! `conj_id` flow match the namespace's VNID in reg1 (table 70 loads the destination pod's VNID
//! there), so a namespace's conjunctions complete only for packets to its own pods. Source
//! clause flows do not name the namespace: a source (a pod's address, a VNID, a CIDR) that the
//! rules of several namespaces name is one flow on the node with all their `conjunction`
//! actions — the desired state merges the namespaces' identical clause flows (`store`'s
//! `shared` module), as Antrea shares its clause flows, while each namespace still computes
//! its own flows alone (one owner, recomputed by itself). Sources repeated in every namespace
//! (a monitoring namespace's VNID, the pods of `env=prod` namespaces) are what this saves.
//! Sharing needs conjunction ids unique on the node, so a namespace without a VNID of its own
//! (shared with another, or none) gets plain flows only; the store refuses an id two owners
//! use in one table.
//!
//! Conjunction ids ([`conj_id_on`]): the namespace's VNID in the high 24 bits, then 1 + FNV-1a
//! of namespace, policy name, rule index and the rule's ports for the pods concerned modulo
//! 255 — stable across recomputations (a pod or source joining a rule changes only its clause
//! flows), collisions within the namespace moved to the next free id in a deterministic
//! order; a namespace with more than 255 conjunctions in one direction makes the rest plain
//! flows and says so.
//!
//! IP fragments after the first carry no L4 header (OVS matches their `tp_dst` as 0), so a
//! port-restricted flow alone would drop them. The userspace datapath's `ct()` (table 21, or
//! table 80's priority 250) holds fragments until their datagram is complete (OVS's ipf),
//! passes the reassembled datagram through conntrack, then sends the original fragments on
//! together with its conntrack state; the first fragment, which has the ports, is judged by the
//! port-restricted flow. So each port-restricted allowed flow has a twin without the port,
//! `ct_state=-inv+trk,...,nw_frag=later` (same source and protocol): the datagram is whole at
//! the pod iff its first fragment was allowed (a pod cannot reassemble a datagram without it).
//! In a conjunction the twin is one more member of the port clause.
//! The conntrack original-direction port (`ct_tp_dst`) would be the exact match, but OVS 3.1
//! gives later fragments `ct_tp_dst=0` (tried with real packets: their datapath flow shows
//! `ct_tuple4(proto=17,tp_dst=0)`). tests/netpol_sctp.rs sends datagrams larger than the MTU
//! through such rules, on one node and across VXLAN.

mod compile;
pub mod counted;
mod cube;
pub mod egress;
mod family;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net};
use openflow::flow_match::{ct_state, Icmpv6Match, Ip6Proto, Ipv6Match};
use openflow::Match;

use super::{output_reg2, Flow, NodeConfig, Reg, Table};
use crate::domain::{PodIps, Vnid};
use compile::{compile, Direction, Group, Role};
pub use cube::port_masks;
pub use family::Family;
use family::{any_ip, dst_net, host_match, ip_match};

/// Which end of a connection a policy's rules judge: ingress rules the connections to the
/// pods they select (table 80, the peer is the source), egress rules the connections from them
/// (table 27, the peer is the destination).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    Ingress,
    Egress,
}

impl Side {
    pub fn table(self) -> Table {
        match self {
            Side::Ingress => Table::Policy,
            Side::Egress => Table::PolicyEgress,
        }
    }

    /// The register holding the selected pod's namespace VNID where the rules are judged:
    /// reg1 (table 70 loads the destination's) or reg0 (table 20 or 25 loads the source's).
    pub fn namespace_reg(self) -> Reg {
        match self {
            Side::Ingress => Reg::DstVnid,
            Side::Egress => Reg::SrcVnid,
        }
    }

    /// The selected pod's address in the packet, the destination or the source:
    /// `ip,nw_dst=<pod>` or `ipv6,ipv6_dst=<pod>` (ingress), `…_src=` (egress).
    pub fn pod_match(self, pod: IpAddr) -> Match {
        host_match(pod, self == Side::Egress)
    }

    /// An allowed entry: the connection marked allowed on this side ([`Side::allowed_mark`]),
    /// then delivered (`output:NXM_NX_REG2[]`) or committed and routed (`goto_table:28`).
    pub fn allow(self, priority: u16, m: Match) -> Flow {
        self.allow_logged(priority, m, None)
    }

    /// [`Side::allow`], first copying the packet to the audit log (`log`, a
    /// [`super::audit::log_action`]).
    ///
    /// The mark (`ct(commit,zone=Z,exec(load:1->NXM_NX_CT_MARK[n]))`) is what lets a one-way
    /// UDP stream, never `+est`, pass `allowed_udp` after its first datagram, so that it is
    /// counted and logged once. It is on every allowed entry, whatever its protocol: many
    /// match `ip` (any protocol), and a UDP-only commit would need a `udp` twin of each of
    /// them (and of their conjunctions); for the other protocols the commit only sets a bit
    /// on the entry that table 21, 28 or 30 committed already (no new entry; on egress, the
    /// entry table 28 commits right after), and nothing matches the bit but `…,udp`.
    pub fn allow_logged(self, priority: u16, m: Match, log: Option<openflow::Action>) -> Flow {
        let mark = super::via_host::commit_mark(self.allowed_mark());
        match self {
            Side::Ingress => {
                Flow::new(Table::Policy, priority, m, log.into_iter().chain([mark, output_reg2()]).collect(), None)
            }
            Side::Egress => Flow::new(
                Table::PolicyEgress,
                priority,
                m,
                log.into_iter().chain([mark]).collect(),
                Some(Table::PolicyEgressCommit),
            ),
        }
    }

    /// The `ct_mark` bit this side's allowed entries set: [`INGRESS_ALLOWED_MARK`] or
    /// [`EGRESS_ALLOWED_MARK`] (separate: one entry serves both tables for two pods of one node).
    ///
    /// [`INGRESS_ALLOWED_MARK`]: super::via_host::INGRESS_ALLOWED_MARK
    /// [`EGRESS_ALLOWED_MARK`]: super::via_host::EGRESS_ALLOWED_MARK
    pub fn allowed_mark(self) -> u32 {
        match self {
            Side::Ingress => super::via_host::INGRESS_ALLOWED_MARK,
            Side::Egress => super::via_host::EGRESS_ALLOWED_MARK,
        }
    }

    pub fn audit_direction(self) -> super::audit::Direction {
        match self {
            Side::Ingress => super::audit::Direction::Ingress,
            Side::Egress => super::audit::Direction::Egress,
        }
    }
}

/// What of a namespace's policy flows is copied to the audit log ([`super::audit`]): allowed
/// connections of some rules, denied ones of some pods. Empty: nothing (no controller action
/// in any flow). Only connections reach these flows, not their later packets: tables 80 and 27
/// pass replies, established TCP and UDP, and UDP an allowed flow marked (one-way streams) first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Audit {
    /// The meter the copies go through ([`super::audit::AUDIT_METER_ID`]).
    pub meter_id: u32,
    /// The rules whose allowed connections are logged: (side, policy, rule index).
    pub allow: BTreeSet<(Side, String, usize)>,
    /// The isolated pods whose denied connections are logged, by each of their addresses
    /// (IPv4 and IPv6), with the logged policies that isolate them (names, comma-separated:
    /// the log's `policy`).
    pub deny: BTreeMap<(Side, IpAddr), String>,
}

/// The rule index a deny is logged with: no rule matched (the pod's isolation).
pub const NO_RULE: u16 = u16::MAX;

impl Audit {
    fn allows(&self, side: Side, policy: &str, rule: usize) -> bool {
        !self.allow.is_empty() && self.allow.contains(&(side, policy.to_string(), rule))
    }

    /// Some rule of `side` is logged.
    fn any_allow(&self, side: Side) -> bool {
        self.allow.iter().any(|(s, _, _)| *s == side)
    }

    fn allow_action(&self, side: Side, namespace: &str, policy: &str, rule: usize) -> Option<openflow::Action> {
        self.allows(side, policy, rule).then(|| {
            let rule = u16::try_from(rule).unwrap_or(NO_RULE - 1);
            super::audit::log_action(self.meter_id, super::audit::Verdict::Allow, side.audit_direction(), namespace, policy, rule)
        })
    }

    fn deny_action(&self, side: Side, namespace: &str, pod: IpAddr) -> Option<openflow::Action> {
        let policies = self.deny.get(&(side, pod))?;
        Some(super::audit::log_action(self.meter_id, super::audit::Verdict::Deny, side.audit_direction(), namespace, policies, NO_RULE))
    }
}

/// The reply flow's priority (as openshift-sdn VERSION 4).
pub const REPLY_PRIORITY: u16 = 200;
/// Every allowed entry of table 80: plain allowed flows, conjunctive clause flows and their
/// `conj_id` flows (one priority: the allowed entries all have one action, and a
/// conjunction's clause flows must share their `conj_id` flow's priority).
pub const ALLOW_PRIORITY: u16 = 150;
/// A pod some policy selects: drop what no allowed flow took.
pub const ISOLATED_PRIORITY: u16 = 100;
/// Pods no policy selects accept everything.
pub const OPEN_PRIORITY: u16 = 50;

/// Where a connection comes from, as table 80 can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Src {
    /// Anywhere.
    Any,
    /// A VNID (reg0): every pod of the namespaces carrying it.
    Vnid(Vnid),
    /// A source address range of either family (a pod's IP is a /32 or a /128). It allows
    /// packets of its family only.
    Net(IpNet),
}

impl Src {
    /// The family of the packets this source can allow: `None` for either (any, a VNID).
    pub fn family(&self) -> Option<Family> {
        match self {
            Src::Net(n) => Some(Family::of_net(*n)),
            Src::Any | Src::Vnid(_) => None,
        }
    }

    /// An IPv4 range (the common case in tests and callers).
    pub fn v4(n: Ipv4Net) -> Src {
        Src::Net(IpNet::V4(n))
    }
}

/// An L4 protocol whose destination port the datapath matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum L4 {
    Tcp,
    Udp,
    Sctp,
}

/// What a connection goes to, beyond the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dst {
    /// Any protocol, any port.
    Any,
    /// One protocol, ports `start..=end` (`0..=65535`: the whole protocol).
    Ports { proto: L4, start: u16, end: u16 },
}

/// One allowed (source, destination port) box for a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Allow {
    pub src: Src,
    pub dst: Dst,
}

/// A local pod some policy selects, with everything its policies allow (the product form:
/// what [`plain_flows`] expands into one flow per box). For egress, `src` of each box is the
/// destination peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsolatedPod {
    /// One of the pod's addresses: its boxes are made in that address's family.
    pub ip: IpAddr,
    pub allows: Vec<Allow>,
}

/// One ingress rule of one policy, resolved: its sources and, per local pod the policy
/// selects, the rule's ports for that pod (named ports resolved against its containerPorts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleAllow {
    /// The policy's name and the rule's index in it: what the rule's conjunction ids derive from.
    pub policy: String,
    pub rule: usize,
    /// `None`: any source (no `from`).
    pub srcs: Option<Vec<Src>>,
    /// The selected pods, each with the rule's ports for it (empty: nothing, e.g. a named port
    /// the pod does not have).
    pub pods: Vec<(PodIps, Vec<Dst>)>,
}

/// One egress rule of one policy, resolved: the local pods the policy selects and the rule's
/// destinations, each with the rule's ports for it (named ports resolved against the
/// destination pod's containerPorts; an ipBlock or any destination has only numeric ports).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressRule {
    pub policy: String,
    pub rule: usize,
    /// The selected local pods (the connections' sources).
    pub pods: Vec<PodIps>,
    /// Destinations: [`Src::Any`] (no `to`), pod addresses and ipBlock ranges as [`Src::Net`],
    /// with their ports (empty: nothing). [`Src::Vnid`] is not a destination (the
    /// destination's VNID is not known where egress is judged) and matches nothing.
    pub peers: Vec<(Src, Vec<Dst>)>,
}

/// What the policies of one namespace make of its local pods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespacePolicy {
    pub namespace: String,
    /// The namespace's VNID (table 70 loads it into reg1 for its pods) when no other
    /// namespace carries it: conjunctive flows need it to keep their clause flows apart from
    /// other namespaces' (without it every rule is expanded into plain flows).
    pub vnid: Option<Vnid>,
    /// The pods some Ingress policy selects, in pod order.
    pub isolated: Vec<PodIps>,
    /// Every rule of every Ingress policy selecting some of them.
    pub rules: Vec<RuleAllow>,
    /// The namespace's VNID, shared with other namespaces or not: what table 25 reloads for
    /// an egress-isolated pod's connections that come back from the node. `None`: the
    /// namespace is unknown, its pods have no flows.
    pub pod_vnid: Option<Vnid>,
    /// The pods some Egress policy selects, in pod order.
    pub egress_isolated: Vec<PodIps>,
    /// Every rule of every Egress policy selecting some of them.
    pub egress_rules: Vec<EgressRule>,
    /// What is copied to the audit log.
    pub audit: Audit,
}

/// The networkpolicy plugin's fixed flows beyond table 80's ([`plugin_flows`]): table 21's
/// conntrack ([`conntrack_flows`]), tables 27 and 28 ([`egress::base_flows`]), tables 0, 25 and
/// 30 for connections through the node ([`super::via_host::base_flows`]).
pub fn base_flows(cfg: &NodeConfig) -> Vec<Flow> {
    let mut flows = conntrack_flows(cfg);
    flows.extend(egress::base_flows(cfg));
    flows.extend(super::via_host::base_flows(cfg));
    flows
}

/// Table 21 (base flows in networkpolicy mode): connections from local pods to the cluster
/// network and to Services are committed to conntrack (in [`via_host::CT_ZONE`]), so that table
/// 80 knows their replies — for a Service, the reply the node un-NATs and sends back through
/// tun0 (see [`super::via_host`]).
///
/// Connections to anywhere else (outside the cluster, through the node's masquerade) are
/// committed too, at a lower priority: their replies come back through tun0 untracked, and
/// table 30's lookup must find them as replies, or a pod some Ingress policy isolates could
/// not hear back from outside the cluster.
///
/// On a dual-stack node each has its `ipv6` twin (the IPv6 cluster and service networks).
///
/// [`via_host::CT_ZONE`]: super::via_host::CT_ZONE
pub fn conntrack_flows(cfg: &NodeConfig) -> Vec<Flow> {
    let commit = |priority: u16, m: Match| Flow::new(Table::PolicyConntrack, priority, m, vec![super::via_host::commit(Table::Routing)], None);
    let mut nets = vec![];
    let mut families = vec![];
    if let Some(v4) = &cfg.ipv4 {
        nets.extend([IpNet::V4(v4.cluster_network), IpNet::V4(v4.service_network)]);
        families.push(Family::V4);
    }
    if let Some(v6) = &cfg.ipv6 {
        nets.extend([IpNet::V6(v6.cluster_network), IpNet::V6(v6.service_network)]);
        families.push(Family::V6);
    }
    let mut flows: Vec<Flow> = nets.into_iter().map(|net| commit(200, dst_net(net))).collect();
    flows.extend(families.into_iter().map(|f| commit(100, any_ip(f))));
    flows
}

/// The plugin's fixed table-80 flows: accept replies, accept pods no policy selects. Every
/// packet reaches table 80 tracked: from a local pod through table 21, otherwise through table
/// 30's lookup of traffic to the local subnet (registers survive the recirculation). For each
/// family the node has: `ip` flows ([`plugin_flows4`]) and `ipv6` ones ([`plugin_flows6`]).
pub fn plugin_flows(cfg: &NodeConfig) -> Vec<Flow> {
    let mut flows = if cfg.ipv4.is_some() { plugin_flows4() } else { vec![] };
    if cfg.ipv6.is_some() {
        flows.extend(plugin_flows6());
    }
    flows
}

/// The `ip` table-80 plugin flows.
pub fn plugin_flows4() -> Vec<Flow> {
    plugin_flows_of(Family::V4)
}

/// The IPv6 twins of [`plugin_flows`] (a dual-stack node: `ipv6`, `tcp6`, `udp6`), and
/// neighbour discovery: solicitations and advertisements (ICMPv6 135 and 136) to a pod always
/// pass, as ARP never meets table 80 — they are no connection (conntrack leaves them
/// untracked or invalid) and an isolated pod that cannot resolve its neighbours cannot answer
/// even what its policies allow.
pub fn plugin_flows6() -> Vec<Flow> {
    let mut flows = plugin_flows_of(Family::V6);
    for typ in [135, 136] {
        let nd = Match::any().ipv6(Ipv6Match { proto: Some(Ip6Proto::Icmpv6(Icmpv6Match { typ: Some(typ), ..Default::default() })), ..Default::default() });
        flows.insert(flows.len() - 1, Flow::new(Table::Policy, REPLY_PRIORITY, nd, vec![output_reg2()], None));
    }
    flows
}

fn plugin_flows_of(family: Family) -> Vec<Flow> {
    vec![
        // OVS accepts ct_state bits only together with +trk.
        Flow::new(
            Table::Policy,
            REPLY_PRIORITY,
            any_ip(family).ct_state(ct_state::RPL | ct_state::TRK, ct_state::RPL | ct_state::TRK),
            vec![output_reg2()],
            None,
        ),
        // Established TCP and UDP connections (allowed when they began): so that only a
        // connection's first packet meets the policy flows (and the audit log). Not SCTP: OVS
        // 3.1's userspace conntrack keys SCTP by address pair, without ports, and an
        // established entry would let every SCTP port of the pair through.
        established(Table::Policy, family, openflow::IpProto::Tcp { dst: None }, vec![output_reg2()], None),
        established(Table::Policy, family, openflow::IpProto::Udp { dst: None }, vec![output_reg2()], None),
        // UDP an ingress policy flow allowed: a one-way stream (statsd, syslog) is never +est.
        allowed_udp(Side::Ingress, family, vec![output_reg2()], None),
        Flow::new(Table::Policy, OPEN_PRIORITY, any_ip(family), vec![output_reg2()], None),
    ]
}

/// `ct_state=+est+trk,<proto>` (`tcp`, `tcp6`...) at [`REPLY_PRIORITY`] with `actions`/`goto`.
pub(crate) fn established(table: Table, family: Family, proto: openflow::IpProto, actions: Vec<openflow::Action>, goto: Option<Table>) -> Flow {
    let m = ip_match(family, None, None, Some(proto), None).ct_state(ct_state::EST | ct_state::TRK, ct_state::EST | ct_state::TRK);
    Flow::new(table, REPLY_PRIORITY, m, actions, goto)
}

/// `ct_state=+trk,ct_mark=<bit>/<bit>,udp` (or `udp6`) at [`REPLY_PRIORITY`] with
/// `actions`/`goto`: UDP
/// whose conntrack entry an allowed flow of `side` marked ([`Side::allow_logged`]). A one-way
/// stream gets no reply, so conntrack never calls it `+est`; without this flow each of its
/// datagrams would meet the policy flows again (counted and logged as a new connection).
/// Like the `+est` flows, it passes the stream for as long as its entry lives (OVS's UDP
/// timeouts, refreshed by its traffic), even after a policy change that denies it now.
pub(crate) fn allowed_udp(side: Side, family: Family, actions: Vec<openflow::Action>, goto: Option<Table>) -> Flow {
    let m = Match {
        ct_mark: Some(super::via_host::has_mark(side.allowed_mark())),
        ..ip_match(family, None, None, Some(openflow::IpProto::Udp { dst: None }), None).ct_state(ct_state::TRK, ct_state::TRK)
    };
    Flow::new(side.table(), REPLY_PRIORITY, m, actions, goto)
}

/// Conjunction ids a namespace has per direction: the low 8 bits of an id (0 is never used).
pub const CONJUNCTIONS_PER_NAMESPACE: usize = 255;

/// The first conjunction id candidate of an ingress rule: see [`conj_id_on`].
pub fn conj_id(vnid: Vnid, namespace: &str, policy: &str, rule: usize, ports: &[Dst]) -> u32 {
    conj_id_on(Side::Ingress, vnid, namespace, policy, rule, ports)
}

/// The first conjunction id candidate of a rule on `side`: the namespace's VNID in the high 24
/// bits (a namespace with conjunctions has a VNID no other namespace has, so ids are unique on
/// the node, as shared peer clause flows need), and in the low 8 bits 1 + FNV-1a of namespace,
/// policy, rule index and the rule's ports for the pods of this conjunction, modulo 255 (never
/// 0: `conj_id=0` is what every packet carries outside a conjunction). Stable across
/// recomputations: a pod or peer joining a rule changes only its clause flows. Collisions
/// within the namespace move to [`next_conj_id`] in the order of the namespace's units (sorted
/// by policy, rule, ports); a namespace with more than [`CONJUNCTIONS_PER_NAMESPACE`] units in
/// one direction makes the rest plain flows. An egress rule's hash also eats `egress` first
/// (ids are per table anyway).
pub fn conj_id_on(side: Side, vnid: Vnid, namespace: &str, policy: &str, rule: usize, ports: &[Dst]) -> u32 {
    conj_id_for(side, Family::V4, vnid, namespace, policy, rule, ports)
}

/// [`conj_id_on`] for the conjunction of one family: a dual-stack rule is two conjunctions
/// (each of one family: its clause flows are `ip` or `ipv6` flows), with ids from the same
/// 255 of the namespace and direction; the IPv6 one's hash eats `ipv6` first (an IPv4
/// conjunction's id is the same as on an IPv4-only node).
pub fn conj_id_for(side: Side, family: Family, vnid: Vnid, namespace: &str, policy: &str, rule: usize, ports: &[Dst]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    let mut eat = |b: &[u8]| {
        for x in b {
            h ^= u32::from(*x);
            h = h.wrapping_mul(0x0100_0193);
        }
    };
    if family == Family::V6 {
        eat(b"ipv6\0");
    }
    if side == Side::Egress {
        eat(b"egress\0");
    }
    eat(namespace.as_bytes());
    eat(&[0]);
    eat(policy.as_bytes());
    eat(&[0]);
    eat(&(rule as u64).to_be_bytes());
    for d in ports {
        match d {
            Dst::Any => eat(b"*"),
            Dst::Ports { proto, start, end } => {
                eat(&[*proto as u8]);
                eat(&start.to_be_bytes());
                eat(&end.to_be_bytes());
            }
        }
    }
    (vnid.get() << 8) | (h % CONJUNCTIONS_PER_NAMESPACE as u32 + 1)
}

/// The id after `id` in its namespace's 255 (1 follows 255).
pub fn next_conj_id(id: u32) -> u32 {
    (id & !0xff) | ((id & 0xff) % CONJUNCTIONS_PER_NAMESPACE as u32 + 1)
}

/// The product form for ingress (table 80): see [`cube::plain_flows_on`].
pub fn plain_flows(pods: &[IsolatedPod]) -> Vec<Flow> {
    cube::plain_flows_on(Side::Ingress, pods, |_, _| None)
}

/// A rule's resolved ports as a group's key: sorted, deduplicated; `None` when there are none
/// (the rule allows nothing there).
fn port_key(dsts: &[Dst]) -> Option<Vec<Dst>> {
    let mut d = dsts.to_vec();
    d.sort_unstable();
    d.dedup();
    (!d.is_empty()).then_some(d)
}

/// A namespace's policy flows: per rule, conjunctive clauses (peers; selected pods; ports)
/// when that is fewer flows than their product, else the product as plain flows; the
/// isolated pods' drops — table 80 for ingress, table 27 for egress, with the egress-isolated
/// pods' hooks into table 27 ([`egress::pod_hooks`]). See the module documentation.
pub fn namespace_flows(ns: &NamespacePolicy) -> (Vec<Flow>, Vec<String>) {
    let (flows, _, errors) = build(ns, false);
    (flows, errors)
}

/// [`namespace_flows`], and with `roles` what each flow counts (one per flow, with its
/// direction; empty without `roles`): the one computation behind both the flows and the
/// counters ([`counted`]), so they cannot drift apart.
fn build(ns: &NamespacePolicy, roles: bool) -> (Vec<Flow>, Vec<(Side, Role<'_>)>, Vec<String>) {
    // A pod's addresses: one per family it has (IPv4, IPv6, or both on a dual-stack node).
    // Every group is made once per family its pods have, with the peers of that family (or of
    // any); IPv4 first.
    let of_family = |peers: &Option<Vec<Src>>, family: Family| -> Option<Vec<Src>> {
        peers.as_ref().map(|p| p.iter().copied().filter(|s| s.family().is_none_or(|f| f == family)).collect())
    };
    let in_family = |ips: &[PodIps], family: Family| -> Vec<IpAddr> { ips.iter().filter_map(|p| family.pick(p)).collect() };
    let both = |ips: &[PodIps]| -> Vec<IpAddr> {
        let mut all = in_family(ips, Family::V4);
        all.extend(in_family(ips, Family::V6));
        all
    };
    let mut ingress = Vec::new();
    for r in &ns.rules {
        let mut by_ports: BTreeMap<Vec<Dst>, Vec<PodIps>> = BTreeMap::new();
        for (ip, dsts) in &r.pods {
            if let Some(d) = port_key(dsts) {
                by_ports.entry(d).or_default().push(*ip);
            }
        }
        for (ports, pods) in by_ports {
            for family in [Family::V4, Family::V6] {
                let pods = in_family(&pods, family);
                if !pods.is_empty() {
                    ingress.push(Group { family, policy: &r.policy, rule: r.rule, peers: of_family(&r.srcs, family), pods, ports: ports.clone() });
                }
            }
        }
    }
    let isolated = both(&ns.isolated);
    let (mut flows, ingress_roles, mut errors) = compile(Direction {
        side: Side::Ingress,
        namespace: &ns.namespace,
        vnid: ns.vnid,
        isolated,
        groups: ingress,
        audit: &ns.audit,
        roles,
    });
    let mut all_roles: Vec<(Side, Role<'_>)> = ingress_roles.into_iter().map(|r| (Side::Ingress, r)).collect();
    if ns.egress_isolated.is_empty() {
        return (flows, all_roles, errors);
    }
    let mut groups = Vec::new();
    for r in &ns.egress_rules {
        let mut by_ports: BTreeMap<Vec<Dst>, Vec<Src>> = BTreeMap::new();
        for (peer, dsts) in &r.peers {
            if let Src::Vnid(v) = peer {
                errors.push(format!("policy {}, egress rule {}: VNID {v} is not a destination; it matches nothing", r.policy, r.rule));
                continue;
            }
            if let Some(d) = port_key(dsts) {
                by_ports.entry(d).or_default().push(*peer);
            }
        }
        for (ports, mut peers) in by_ports {
            peers.sort_unstable();
            peers.dedup();
            let peers = (!peers.contains(&Src::Any)).then_some(peers);
            for family in [Family::V4, Family::V6] {
                let pods = in_family(&r.pods, family);
                if !pods.is_empty() {
                    groups.push(Group { family, policy: &r.policy, rule: r.rule, peers: of_family(&peers, family), pods, ports: ports.clone() });
                }
            }
        }
    }
    let egress_isolated = both(&ns.egress_isolated);
    let (egress, egress_roles, e) = compile(Direction {
        side: Side::Egress,
        namespace: &ns.namespace,
        vnid: ns.vnid,
        isolated: egress_isolated.clone(),
        groups,
        audit: &ns.audit,
        roles,
    });
    flows.extend(egress);
    errors.extend(e);
    all_roles.extend(egress_roles.into_iter().map(|r| (Side::Egress, r)));
    let hooks = egress::pod_hooks(&egress_isolated, ns.pod_vnid);
    if roles {
        // Tables 21 and 25 only send packets on to table 27: nothing to count there.
        all_roles.extend(hooks.iter().map(|_| (Side::Egress, Role::Uncounted)));
    }
    flows.extend(hooks);
    (flows, all_roles, errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeSet, HashMap};

    pub(super) fn cfg(dual: bool) -> NodeConfig {
        NodeConfig {
            plugin: crate::domain::Plugin::NetworkPolicy,
            ipv4: Some(crate::pipeline::NodeIpv4 {
                cluster_network: "10.128.0.0/14".parse().unwrap(),
                service_network: "172.30.0.0/16".parse().unwrap(),
                local_subnet: "10.128.2.0/23".parse().unwrap(),
            }),
            ipv6: dual.then(|| crate::pipeline::NodeIpv6 {
                cluster_network: "fd00:10:128::/48".parse().unwrap(),
                service_network: "fd00:172:30::/112".parse().unwrap(),
                local_subnet: "fd00:10:128:2::/64".parse().unwrap(),
            }),
        }
    }

    #[test]
    fn text() {
        assert_eq!(
            conntrack_flows(&cfg(false))
                .iter()
                .map(|f| f.to_string())
                .collect::<Vec<_>>(),
            vec![
                "table=21, priority=200,ip,nw_dst=10.128.0.0/14 actions=ct(commit,table=30,zone=64000)",
                "table=21, priority=200,ip,nw_dst=172.30.0.0/16 actions=ct(commit,table=30,zone=64000)",
                "table=21, priority=100,ip actions=ct(commit,table=30,zone=64000)",
            ]
        );
        let f: Vec<String> = plugin_flows4().iter().map(|f| f.to_string()).collect();
        assert_eq!(
            f,
            vec![
                "table=80, priority=200,ct_state=+rpl+trk,ip actions=output:NXM_NX_REG2[]",
                "table=80, priority=200,ct_state=+est+trk,tcp actions=output:NXM_NX_REG2[]",
                "table=80, priority=200,ct_state=+est+trk,udp actions=output:NXM_NX_REG2[]",
                "table=80, priority=200,ct_state=+trk,ct_mark=0x2/0x2,udp actions=output:NXM_NX_REG2[]",
                "table=80, priority=50,ip actions=output:NXM_NX_REG2[]",
            ]
        );
        let pod = IsolatedPod {
            ip: "10.128.2.5".parse().unwrap(),
            allows: vec![
                Allow { src: Src::Vnid(Vnid::new(11).unwrap()), dst: Dst::Ports { proto: L4::Tcp, start: 8080, end: 8081 } },
                Allow { src: Src::Net("10.128.2.6/32".parse().unwrap()), dst: Dst::Any },
                // Contained in the first: dropped.
                Allow { src: Src::Vnid(Vnid::new(11).unwrap()), dst: Dst::Ports { proto: L4::Tcp, start: 8080, end: 8080 } },
            ],
        };
        let t: Vec<String> = plain_flows(&[pod]).iter().map(|f| f.to_string()).collect();
        assert_eq!(
            t,
            vec![
                "table=80, priority=150,ip,nw_src=10.128.2.6,nw_dst=10.128.2.5 actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]",
                "table=80, priority=150,tcp,reg0=0xb,nw_dst=10.128.2.5,tp_dst=0x1f90/0xfffe actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]",
                "table=80, priority=150,ct_state=-inv+trk,tcp,reg0=0xb,nw_dst=10.128.2.5,nw_frag=later actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]",
                "table=80, priority=100,ip,nw_dst=10.128.2.5 actions=drop",
            ]
        );
    }

    fn pods(ips: &[&str], d: &[Dst]) -> Vec<(PodIps, Vec<Dst>)> {
        ips.iter().map(|ip| (ip.parse().unwrap(), d.to_vec())).collect()
    }

    #[test]
    fn rules_become_conjunctions() {
        let tcp80 = Dst::Ports { proto: L4::Tcp, start: 80, end: 80 };
        let v = |n| Src::Vnid(Vnid::new(n).unwrap());
        let ns = NamespacePolicy {
            namespace: "team-a".into(),
            vnid: Some(Vnid::new(20).unwrap()),
            isolated: ["10.128.0.5", "10.128.0.6", "10.128.0.7"].iter().map(|a| a.parse().unwrap()).collect(),
            rules: vec![
                // Two sources, three pods, one port: 2 + 3 + 2 + 1 flows, not 2 * 3 * 2.
                RuleAllow { policy: "web".into(), rule: 0, srcs: Some(vec![v(11), v(12)]), pods: pods(&["10.128.0.5", "10.128.0.6", "10.128.0.7"], &[tcp80]) },
                // Any source, any port to one pod: a plain flow (and the pod leaves the conjunction).
                RuleAllow { policy: "open".into(), rule: 0, srcs: None, pods: pods(&["10.128.0.7"], &[Dst::Any]) },
                // One source, one pod, any port: plain.
                RuleAllow { policy: "one".into(), rule: 0, srcs: Some(vec![v(11)]), pods: pods(&["10.128.0.5"], &[Dst::Any]) },
                // Any source, two pods, one port: two clauses, sharing the pods' and port's flows.
                RuleAllow { policy: "web".into(), rule: 1, srcs: None, pods: pods(&["10.128.0.5", "10.128.0.6"], &[tcp80, Dst::Ports { proto: L4::Udp, start: 53, end: 53 }]) },
            ],
            ..Default::default()
        };
        let (flows, errors) = namespace_flows(&ns);
        assert!(errors.is_empty(), "{errors:?}");
        let vnid = Vnid::new(20).unwrap();
        let a = conj_id(vnid, "team-a", "web", 0, &[tcp80]);
        let b = conj_id(vnid, "team-a", "web", 1, &[tcp80, Dst::Ports { proto: L4::Udp, start: 53, end: 53 }]);
        assert_ne!(a, b);
        assert_eq!((a >> 8, b >> 8), (20, 20), "the namespace's VNID in the high bits");
        let t: Vec<String> = flows.iter().map(|f| f.to_string()).collect();
        let (lo, hi) = (a.min(b), a.max(b));
        let (ka, kb) = if a < b { ("2/3", "1/2") } else { ("1/2", "2/3") };
        let (pa, pb) = if a < b { ("3/3", "2/2") } else { ("2/2", "3/3") };
        let want = vec![
            "table=80, priority=150,ip,reg0=0xb,nw_dst=10.128.0.5 actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]".to_string(),
            "table=80, priority=100,ip,nw_dst=10.128.0.5 actions=drop".into(),
            "table=80, priority=100,ip,nw_dst=10.128.0.6 actions=drop".into(),
            "table=80, priority=150,ip,nw_dst=10.128.0.7 actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]".into(),
            "table=80, priority=100,ip,nw_dst=10.128.0.7 actions=drop".into(),
            // Sources do not name the namespace (shared with other namespaces' rules on the node).
            format!("table=80, priority=150,ip,reg0=0xb actions=conjunction({a},1/3)"),
            format!("table=80, priority=150,ip,reg0=0xc actions=conjunction({a},1/3)"),
            format!("table=80, priority=150,ip,nw_dst=10.128.0.5 actions=conjunction({lo},{ka}),conjunction({hi},{kb})"),
            format!("table=80, priority=150,ip,nw_dst=10.128.0.6 actions=conjunction({lo},{ka}),conjunction({hi},{kb})"),
            format!("table=80, priority=150,tcp,reg1=0x14,tp_dst=80 actions=conjunction({lo},{pa}),conjunction({hi},{pb})"),
            format!("table=80, priority=150,ct_state=-inv+trk,tcp,reg1=0x14,nw_frag=later actions=conjunction({lo},{pa}),conjunction({hi},{pb})"),
            format!("table=80, priority=150,conj_id={a},ip,reg1=0x14 actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]"),
        ];
        // (The udp members and b's conj_id flow follow; checked by presence.)
        for w in &want {
            assert!(t.contains(w), "missing {w}\n{}", t.join("\n"));
        }
        for w in [
            format!("table=80, priority=150,udp,reg1=0x14,tp_dst=53 actions=conjunction({b},2/2)"),
            format!("table=80, priority=150,ct_state=-inv+trk,udp,reg1=0x14,nw_frag=later actions=conjunction({b},2/2)"),
            format!("table=80, priority=150,conj_id={b},ip,reg1=0x14 actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]"),
        ] {
            assert!(t.contains(&w), "missing {w}\n{}", t.join("\n"));
        }
        assert_eq!(t.len(), want.len() + 3, "{}", t.join("\n"));
        // Without a VNID of its own, the namespace's rules are plain flows.
        let (plain, _) = namespace_flows(&NamespacePolicy { vnid: None, ..ns.clone() });
        assert!(plain.iter().all(|f| f.match_.conj_id.is_none() && f.to_string().contains("nw_dst=")), "{plain:?}");
        // .5: web/1's four boxes (any source holds web/0's) and one's; .6: web/1's four; .7: open; drops.
        assert_eq!(plain.len(), 5 + 4 + 1 + 3, "{}", plain.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("\n"));
    }

    #[test]
    fn conj_ids_are_stable_nonzero_and_unique_on_the_node() {
        let d = [Dst::Any];
        let (v20, v21) = (Vnid::new(20).unwrap(), Vnid::new(21).unwrap());
        assert_eq!(conj_id(v20, "a", "p", 0, &d), conj_id(v20, "a", "p", 0, &d));
        assert_ne!(conj_id(v20, "a", "p", 0, &d), conj_id(v20, "a", "p", 1, &d));
        // Another namespace (another VNID) never has the same id, whatever the hash.
        for i in 0..1000 {
            assert_ne!(conj_id(v20, "a", &format!("p{i}"), 0, &d) >> 8, conj_id(v21, "b", &format!("p{i}"), 0, &d) >> 8);
        }
        // Never 0 in the low bits, even for VNID 0.
        assert!((0..1000).all(|i| conj_id(Vnid::GLOBAL, "x", &format!("p{i}"), 0, &d) & 0xff != 0));
        assert_eq!(next_conj_id(20 << 8 | 255), 20 << 8 | 1);
        assert_eq!(next_conj_id(20 << 8 | 7), 20 << 8 | 8);
        // Two policies whose ids collide: the second in order moves to the next id.
        let mut seen: HashMap<u32, String> = HashMap::new();
        let (p1, p2) = (0..1000)
            .find_map(|i| {
                let name = format!("p{i}");
                seen.insert(conj_id(v20, "x", &name, 0, &d), name.clone()).map(|other| (other, name))
            })
            .expect("a collision among 1000 ids in 255");
        let id = conj_id(v20, "x", &p1, 0, &d);
        let v = |n| Src::Vnid(Vnid::new(n).unwrap());
        let rule = |policy: &str| RuleAllow {
            policy: policy.into(),
            rule: 0,
            srcs: Some(vec![v(11), v(12), v(13)]),
            pods: pods(&["10.128.0.5", "10.128.0.6", "10.128.0.7"], &d),
        };
        let ns = NamespacePolicy { namespace: "x".into(), vnid: Some(v20), isolated: vec![], rules: vec![rule(&p2), rule(&p1)], ..Default::default() };
        let (flows, errors) = namespace_flows(&ns);
        assert!(errors.is_empty());
        let ids: BTreeSet<u32> = flows.iter().filter_map(|f| f.match_.conj_id).collect();
        let (first, second) = if p1 < p2 { (p1, p2) } else { (p2, p1) };
        assert_eq!(ids, BTreeSet::from([id, next_conj_id(id)]), "{first} keeps {id}, {second} moves on");
    }

    /// More rules in one namespace and direction than it has conjunction ids: the first 255
    /// (in unit order) are conjunctions, the rest plain flows, the error says how many; every
    /// flow encodes, and no rule is lost (each later rule's port has its plain flows).
    #[test]
    fn a_namespace_beyond_its_conjunction_ids_makes_plain_flows_and_says_so() {
        let v = |n| Src::Vnid(Vnid::new(n).unwrap());
        let over = CONJUNCTIONS_PER_NAMESPACE + 5;
        // Three sources, three pods, one port each (3 + 3 + 1 + 1 flows beat 3 * 3 * 1).
        let rules: Vec<RuleAllow> = (0..over)
            .map(|i| RuleAllow {
                policy: format!("p{i:03}"),
                rule: 0,
                srcs: Some(vec![v(11), v(12), v(13)]),
                pods: pods(&["10.128.0.5", "10.128.0.6", "10.128.0.7"], &[Dst::Ports { proto: L4::Tcp, start: 1000 + i as u16, end: 1000 + i as u16 }]),
            })
            .collect();
        let isolated = ["10.128.0.5", "10.128.0.6", "10.128.0.7"].iter().map(|a| a.parse().unwrap()).collect();
        let ns = NamespacePolicy { namespace: "big".into(), vnid: Some(Vnid::new(20).unwrap()), isolated, rules, ..Default::default() };
        let (flows, errors) = namespace_flows(&ns);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains(&format!("{over} Ingress rules")) && errors[0].contains("5 of them are plain flows"), "{errors:?}");
        assert_eq!(flows.iter().filter(|f| f.match_.conj_id.is_some()).count(), CONJUNCTIONS_PER_NAMESPACE);
        for f in &flows {
            let fm = crate::store::Compiled::compile(f).to_flow_mod(0).expect("encodes");
            openflow::OfMessage::new(1, openflow::Message::FlowMod(fm)).to_bytes().expect("fits one message");
        }
        // The last five rules (p255..p259): 3 pods x 3 sources x (port + later-fragment twin).
        let t: Vec<String> = flows.iter().map(|f| f.to_string()).collect();
        for i in CONJUNCTIONS_PER_NAMESPACE..over {
            let port = format!("tp_dst={}", 1000 + i);
            let plain: Vec<&String> = t.iter().filter(|f| f.contains(&port) && f.contains("nw_dst=")).collect();
            assert_eq!(plain.len(), 9, "p{i}: {plain:?}");
        }
        let first = format!("tp_dst={} ", 1000);
        assert!(t.iter().any(|f| f.contains(&first) && f.contains("conjunction(")), "p000 is a conjunction");
    }

    #[test]
    fn egress_rules_mirror_ingress_in_table_27() {
        let tcp = |p: u16| Dst::Ports { proto: L4::Tcp, start: p, end: p };
        let net = |a: &str| Src::Net(a.parse().unwrap());
        let pods: Vec<PodIps> = ["10.128.0.5", "10.128.0.6"].iter().map(|a| a.parse().unwrap()).collect();
        let ns = NamespacePolicy {
            namespace: "team-b".into(),
            vnid: Some(Vnid::new(12).unwrap()),
            pod_vnid: Some(Vnid::new(12).unwrap()),
            egress_isolated: pods.clone(),
            egress_rules: vec![
                // A named port resolved per destination: 5432 on two pods, 5433 on a third.
                EgressRule {
                    policy: "db".into(),
                    rule: 0,
                    pods: pods.clone(),
                    peers: vec![(net("10.129.0.8/32"), vec![tcp(5432)]), (net("10.129.0.9/32"), vec![tcp(5432)]), (net("10.129.0.10/32"), vec![tcp(5433)])],
                },
                // Anywhere on 443.
                EgressRule { policy: "https".into(), rule: 0, pods: pods.clone(), peers: vec![(Src::Any, vec![tcp(443)])] },
            ],
            ..Default::default()
        };
        let (flows, errors) = namespace_flows(&ns);
        assert!(errors.is_empty(), "{errors:?}");
        let t: Vec<String> = flows.iter().map(|f| f.to_string()).collect();
        let a = conj_id_on(Side::Egress, Vnid::new(12).unwrap(), "team-b", "db", 0, &[tcp(5432)]);
        assert_ne!(a, conj_id(Vnid::new(12).unwrap(), "team-b", "db", 0, &[tcp(5432)]), "egress ids start apart from ingress");
        for w in [
            "table=21, priority=300,ip,nw_src=10.128.0.5 actions=ct(table=27,zone=64000)".to_string(),
            "table=25, priority=150,ip,nw_src=10.128.0.6 actions=load:0xc->NXM_NX_REG0[],ct(table=27,zone=64000)".into(),
            "table=27, priority=100,ip,nw_src=10.128.0.5 actions=drop".into(),
            // The two 5432 destinations are one conjunction: destinations, pods, port.
            format!("table=27, priority=150,ip,nw_dst=10.129.0.8 actions=conjunction({a},1/3)"),
            format!("table=27, priority=150,ip,nw_src=10.128.0.5 actions=conjunction({a},2/3)"),
            format!("table=27, priority=150,tcp,reg0=0xc,tp_dst=5432 actions=conjunction({a},3/3)"),
            format!("table=27, priority=150,conj_id={a},ip,reg0=0xc actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[2])),goto_table:28"),
            // The one 5433 destination: plain flows (1 x 2 x 2 is no more than 1 + 2 + 2 + 1).
            "table=27, priority=150,tcp,nw_src=10.128.0.5,nw_dst=10.129.0.10,tp_dst=5433 actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[2])),goto_table:28".into(),
        ] {
            assert!(t.contains(&w), "missing {w}\n{}", t.join("\n"));
        }
        // Any destination on 443: pods and port clauses (or plain), never an nw_dst.
        let https: Vec<&String> = t.iter().filter(|f| f.contains("tp_dst=443")).collect();
        assert!(!https.is_empty() && https.iter().all(|f| !f.contains("nw_dst=")), "{https:?}");
        // No ingress isolation: nothing in table 80.
        assert!(flows.iter().all(|f| f.table != Table::Policy), "{}", t.join("\n"));
    }
}
