//! Kubernetes NetworkPolicy (networking.k8s.io/v1, ingress and egress) for the networkpolicy
//! plugin: the objects checked into a model, and resolved against the namespaces and pods in
//! view into what table 80 (ingress) and table 27 (egress) allow per local pod
//! ([`crate::pipeline::netpol`]).
//!
//! Where openshift-sdn and the Kubernetes specification disagree, the specification wins (the
//! docs/networkpolicy.md lists each difference). A part of a policy that
//! cannot be used is dropped with a problem naming its field, and never widens what is
//! allowed: a bad pod selector selects every pod of the namespace, a bad peer or port matches
//! nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;
use k8s_openapi::api::networking::v1 as knet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{Checked, ClusterState, FieldError, Problem};
use crate::domain::Vnid;
use crate::pipeline::netpol::{Audit, Dst, EgressRule, NamespacePolicy, RuleAllow, Side, Src, L4};

/// Labels of a namespace or pod.
pub type Labels = BTreeMap<String, String>;

/// The label every namespace carries with its name (set by the API server since 1.21).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A container port's or a policy port's protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    /// `TCP`, `UDP`, `SCTP` (Kubernetes' spelling); absent means TCP.
    pub fn parse(s: Option<&str>) -> Result<Proto, String> {
        match s {
            None | Some("TCP") => Ok(Proto::Tcp),
            Some("UDP") => Ok(Proto::Udp),
            Some("SCTP") => Ok(Proto::Sctp),
            Some(o) => Err(format!("unknown protocol {o:?} (TCP, UDP or SCTP)")),
        }
    }
}

/// One of a pod's `containerPorts`, which named policy ports resolve against.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerPort {
    pub name: Option<String>,
    pub port: u16,
    pub proto: Proto,
}

/// What NetworkPolicies use of a local pod beyond its identity and IP.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodMeta {
    pub labels: Labels,
    pub container_ports: Vec<ContainerPort>,
}

/// A pod on another node: only a policy peer, known by namespace, IP, labels and container
/// ports (which an egress rule's named ports resolve against).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemotePod {
    pub namespace: String,
    pub name: String,
    /// Its IPv4 address (`None` in an IPv6-only cluster).
    pub ip: Option<Ipv4Addr>,
    /// Its IPv6 address (dual-stack, IPv6-only; Kubernetes: the IPv6 one of status.podIPs).
    pub ip6: Option<std::net::Ipv6Addr>,
    pub labels: Labels,
    pub container_ports: Vec<ContainerPort>,
}

/// One `matchExpressions` requirement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A label selector (`matchLabels` and `matchExpressions`, ANDed); the empty one selects all.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Selector {
    pub match_labels: Labels,
    pub exprs: Vec<Requirement>,
}

impl Selector {
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.exprs.is_empty()
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.exprs.iter().all(|r| match r {
                Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
                Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
                Requirement::Exists(k) => labels.contains_key(k),
                Requirement::DoesNotExist(k) => !labels.contains_key(k),
            })
    }

    /// Checks a Kubernetes LabelSelector as the API server does.
    pub fn from_k8s(s: &LabelSelector, field: &str) -> Result<Selector, FieldError> {
        let mut out = Selector { match_labels: s.match_labels.clone().unwrap_or_default(), exprs: Vec::new() };
        for (i, e) in s.match_expressions.iter().flatten().enumerate() {
            let f = format!("{field}.matchExpressions[{i}]");
            if e.key.is_empty() {
                return Err((format!("{f}.key"), "must not be empty".into()));
            }
            let values: BTreeSet<String> = e.values.iter().flatten().cloned().collect();
            let r = match e.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err((format!("{f}.values"), format!("must not be empty for operator {}", e.operator)))
                }
                "In" => Requirement::In(e.key.clone(), values),
                "NotIn" => Requirement::NotIn(e.key.clone(), values),
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err((format!("{f}.values"), format!("must be empty for operator {}", e.operator)))
                }
                "Exists" => Requirement::Exists(e.key.clone()),
                "DoesNotExist" => Requirement::DoesNotExist(e.key.clone()),
                o => return Err((format!("{f}.operator"), format!("unknown operator {o:?} (In, NotIn, Exists, DoesNotExist)"))),
            };
            out.exprs.push(r);
        }
        Ok(out)
    }
}

/// One `from` (ingress) or `to` (egress) entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    /// Pods: of the namespaces `namespaces` selects (`None`: the policy's own namespace), those
    /// `pods` selects (`None`: all of them). Both given = the intersection.
    Pods { namespaces: Option<Selector>, pods: Option<Selector> },
    /// Addresses (the source's for ingress, the destination's for egress) in `cidr` but in
    /// none of `except`, of either family (every `except` of `cidr`'s family, within it): a
    /// block allows packets of its own family only (an IPv6 block, `ipv6` flows; on a node
    /// without IPv6, no flow at all).
    IpBlock { cidr: IpNet, except: Vec<IpNet> },
}

/// What a policy port says about the destination port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortSpec {
    /// No `port`: every port of the protocol.
    All,
    /// `port` (and `endPort`): `start..=end`.
    Range(u16, u16),
    /// A named port, resolved against the destination pod's `containerPorts` (the selected
    /// pod's for ingress, the peer's for egress).
    Named(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyPort {
    pub proto: Proto,
    pub port: PortSpec,
}

/// One ingress or egress rule. `None` = the field was empty or absent: everything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// `from` (ingress) or `to` (egress).
    pub peers: Option<Vec<Peer>>,
    pub ports: Option<Vec<PolicyPort>>,
}

/// The annotation that opts a NetworkPolicy into the audit log: `allow`, `deny`, or `all`
/// (also `true`); `none` (also `false`) opts out.
pub const AUDIT_ANNOTATION: &str = "sdn-node.openshift.io/audit-log";

/// Which connections of a policy are logged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuditMode {
    pub allow: bool,
    pub deny: bool,
}

impl AuditMode {
    pub const ALL: AuditMode = AuditMode { allow: true, deny: true };

    pub fn parse(v: &str) -> Result<AuditMode, String> {
        match v {
            "all" | "true" => Ok(AuditMode::ALL),
            "allow" => Ok(AuditMode { allow: true, deny: false }),
            "deny" => Ok(AuditMode { allow: false, deny: true }),
            "none" | "false" => Ok(AuditMode::default()),
            o => Err(format!("{o:?} is not an audit mode (allow, deny, all, none)")),
        }
    }
}

/// The node's audit log: on when the agent writes one (`--audit-log`); `all`: every policy is
/// logged as if annotated `all` (`--audit-all-policies`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeAudit {
    pub enabled: bool,
    pub all: bool,
}

/// A checked NetworkPolicy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkPolicy {
    pub namespace: String,
    pub name: String,
    pub pod_selector: Selector,
    /// The ingress rules if the policy is of type Ingress (it then isolates the pods it
    /// selects); `None` if it is not.
    pub ingress: Option<Vec<Rule>>,
    /// The egress rules if the policy is of type Egress (it then isolates the pods it selects
    /// for egress); `None` if it is not.
    pub egress: Option<Vec<Rule>>,
    /// What the policy asks the audit log for ([`AUDIT_ANNOTATION`]).
    pub audit: AuditMode,
}

/// Checks one NetworkPolicy. Unusable parts are dropped with a problem (never allowing more).
pub fn network_policy(np: &knet::NetworkPolicy) -> Checked<NetworkPolicy> {
    let namespace = np.metadata.namespace.clone().unwrap_or_default();
    let name = np.metadata.name.clone().unwrap_or_default();
    if namespace.is_empty() {
        return Err(("metadata.namespace".into(), "must not be empty".into()));
    }
    if name.is_empty() {
        return Err(("metadata.name".into(), "must not be empty".into()));
    }
    let mut problems = Vec::new();
    let spec = np.spec.clone().unwrap_or_default();
    let pod_selector = match spec.pod_selector.as_ref().map(|s| Selector::from_k8s(s, "spec.podSelector")).transpose() {
        Ok(s) => s.unwrap_or_default(),
        Err((f, m)) => {
            problems.push(Problem::new("", f, format!("{m}; the policy selects every pod of its namespace")));
            Selector::default()
        }
    };
    for (i, t) in spec.policy_types.iter().flatten().enumerate() {
        if t != "Ingress" && t != "Egress" {
            problems.push(Problem::new("", format!("spec.policyTypes[{i}]"), format!("unknown policy type {t:?} (Ingress, Egress); ignored")));
        }
    }
    // Without policyTypes, the API server's default: Ingress.
    let ingress_type = spec.policy_types.as_ref().is_none_or(|types| types.iter().any(|t| t == "Ingress"));
    let egress_type = declares_egress(&spec);
    let ingress = ingress_type.then(|| {
        spec.ingress
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, r)| rule(r.from.as_deref(), r.ports.as_deref(), &format!("spec.ingress[{i}]"), "from", &mut problems))
            .collect()
    });
    let egress = egress_type.then(|| {
        spec.egress
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, r)| rule(r.to.as_deref(), r.ports.as_deref(), &format!("spec.egress[{i}]"), "to", &mut problems))
            .collect()
    });
    let annotation = np.metadata.annotations.as_ref().and_then(|a| a.get(AUDIT_ANNOTATION));
    let audit = match annotation.map(|v| AuditMode::parse(v)) {
        None => AuditMode::default(),
        Some(Ok(m)) => m,
        Some(Err(m)) => {
            problems.push(Problem::new("", format!("metadata.annotations[{AUDIT_ANNOTATION}]"), format!("{m}; not logged")));
            AuditMode::default()
        }
    };
    Ok((NetworkPolicy { namespace, name, pod_selector, ingress, egress, audit }, problems))
}

/// The policy is of type Egress: `Egress` in policyTypes, or (without policyTypes, the API
/// server's default) egress rules.
fn declares_egress(spec: &knet::NetworkPolicySpec) -> bool {
    match &spec.policy_types {
        Some(types) => types.iter().any(|t| t == "Egress"),
        None => spec.egress.as_ref().is_some_and(|e| !e.is_empty()),
    }
}

/// How many NetworkPolicies of `state` this node enforces only in part: those `problems` name
/// (a part dropped as unusable). None unless the plugin is networkpolicy.
pub fn partly_enforced(state: &ClusterState, problems: &[Problem]) -> usize {
    if state.plugin != crate::domain::Plugin::NetworkPolicy {
        return 0;
    }
    problems.iter().filter(|p| p.object.starts_with("networkpolicy ")).map(|p| p.object.as_str()).collect::<BTreeSet<_>>().len()
}

fn rule(peers: Option<&[knet::NetworkPolicyPeer]>, ports: Option<&[knet::NetworkPolicyPort]>, field: &str, peers_field: &str, problems: &mut Vec<Problem>) -> Rule {
    let peers = peers.filter(|f| !f.is_empty()).map(|peers| {
        let mut out = Vec::new();
        for (i, p) in peers.iter().enumerate() {
            let f = format!("{field}.{peers_field}[{i}]");
            match peer(p, &f) {
                Ok(Some(p)) => out.push(p),
                Ok(None) => {}
                Err((f, m)) => problems.push(Problem::new("", f, format!("{m}; this peer matches nothing"))),
            }
        }
        out
    });
    let ports = ports.filter(|p| !p.is_empty()).map(|ports| {
        let mut out = Vec::new();
        for (i, p) in ports.iter().enumerate() {
            match port(p, &format!("{field}.ports[{i}]")) {
                Ok(p) => out.push(p),
                Err((f, m)) => problems.push(Problem::new("", f, format!("{m}; this port matches nothing"))),
            }
        }
        out
    });
    Rule { peers, ports }
}

fn peer(p: &knet::NetworkPolicyPeer, field: &str) -> Result<Option<Peer>, FieldError> {
    if let Some(b) = &p.ip_block {
        if p.pod_selector.is_some() || p.namespace_selector.is_some() {
            return Err((field.into(), "ipBlock excludes podSelector and namespaceSelector".into()));
        }
        let cidr: IpNet = b.cidr.parse().map_err(|_| (format!("{field}.ipBlock.cidr"), format!("{:?} is not a CIDR", b.cidr)))?;
        let mut except = Vec::new();
        for (i, e) in b.except.iter().flatten().enumerate() {
            let n: IpNet = e.parse().map_err(|_| (format!("{field}.ipBlock.except[{i}]"), format!("{e:?} is not a CIDR")))?;
            match (cidr, n) {
                (IpNet::V4(_), IpNet::V6(_)) | (IpNet::V6(_), IpNet::V4(_)) => {
                    let fam = |n: IpNet| if matches!(n, IpNet::V4(_)) { "IPv4" } else { "IPv6" };
                    return Err((
                        format!("{field}.ipBlock.except[{i}]"),
                        format!("{e} is {}, its cidr {} is {}: an except must be of its cidr's family", fam(n), b.cidr, fam(cidr)),
                    ));
                }
                _ if cidr.contains(&n) => except.push(n.trunc()),
                _ => return Err((format!("{field}.ipBlock.except[{i}]"), format!("{e} is not within {}", b.cidr))),
            }
        }
        return Ok(Some(Peer::IpBlock { cidr: cidr.trunc(), except }));
    }
    let sel = |s: &Option<LabelSelector>, f: &str| -> Result<Option<Selector>, FieldError> {
        s.as_ref().map(|s| Selector::from_k8s(s, &format!("{field}.{f}"))).transpose()
    };
    let namespaces = sel(&p.namespace_selector, "namespaceSelector")?;
    let pods = sel(&p.pod_selector, "podSelector")?;
    if namespaces.is_none() && pods.is_none() {
        return Err((field.into(), "one of podSelector, namespaceSelector and ipBlock is required".into()));
    }
    // An empty pod selector selects every pod of the namespaces: the same as none.
    Ok(Some(Peer::Pods { namespaces, pods: pods.filter(|s| !s.is_empty()) }))
}

fn port(p: &knet::NetworkPolicyPort, field: &str) -> Result<PolicyPort, FieldError> {
    let proto = Proto::parse(p.protocol.as_deref()).map_err(|m| (format!("{field}.protocol"), m))?;
    let number = |n: i32, f: &str| u16::try_from(n).ok().filter(|n| *n != 0).ok_or_else(|| (format!("{field}.{f}"), format!("{n} is not a port number (1..65535)")));
    let spec = match (&p.port, p.end_port) {
        (None, None) => PortSpec::All,
        (None, Some(_)) => return Err((format!("{field}.endPort"), "endPort needs a numeric port".into())),
        (Some(IntOrString::Int(n)), end) => {
            let start = number(*n, "port")?;
            let end = end.map(|e| number(e, "endPort")).transpose()?.unwrap_or(start);
            if end < start {
                return Err((format!("{field}.endPort"), format!("{end} is below port {start}")));
            }
            PortSpec::Range(start, end)
        }
        (Some(IntOrString::String(s)), None) => match s.parse::<i32>() {
            // "80" is how some clients write a number.
            Ok(n) => {
                let n = number(n, "port")?;
                PortSpec::Range(n, n)
            }
            Err(_) if !s.is_empty() && s.len() <= 15 => PortSpec::Named(s.clone()),
            Err(_) => return Err((format!("{field}.port"), format!("{s:?} is not a port name (1 to 15 characters)"))),
        },
        (Some(IntOrString::String(_)), Some(_)) => return Err((format!("{field}.endPort"), "endPort needs a numeric port".into())),
    };
    Ok(PolicyPort { proto, port: spec })
}

/// `cidr` without every `except` block, as disjoint CIDRs (an `except` of the other family
/// takes nothing away).
pub fn subtract(cidr: IpNet, except: &[IpNet]) -> Vec<IpNet> {
    let mut parts = vec![cidr];
    for e in except {
        let mut next = Vec::new();
        for p in parts {
            if e.contains(&p) {
                continue;
            }
            if !p.contains(e) {
                next.push(p);
                continue;
            }
            // Split p down to e: each step keeps the half without e.
            let mut cur = p;
            while cur.prefix_len() < e.prefix_len() {
                let Ok(mut halves) = cur.subnets(cur.prefix_len() + 1) else { break };
                let (Some(a), Some(b)) = (halves.next(), halves.next()) else { break };
                if a.contains(e) {
                    next.push(b);
                    cur = a;
                } else {
                    next.push(a);
                    cur = b;
                }
            }
        }
        parts = next;
    }
    parts
}

/// The namespaces and pods policies are resolved against.
pub struct View<'a> {
    /// Namespace name to (VNID, labels with [`NAMESPACE_NAME_LABEL`]).
    namespaces: BTreeMap<&'a str, (Vnid, Labels)>,
    /// VNID to the namespaces carrying it.
    by_vnid: HashMap<Vnid, Vec<&'a str>>,
    /// Every pod in view (local and remote).
    pods: Vec<ViewPod<'a>>,
}

/// A pod as policies see it.
struct ViewPod<'a> {
    namespace: &'a str,
    /// Its addresses (one per family it has).
    ips: crate::domain::PodIps,
    labels: &'a Labels,
    container_ports: &'a [ContainerPort],
}

impl ViewPod<'_> {
    /// The pod's addresses as peers, one per family it has.
    fn addresses(&self) -> impl Iterator<Item = Src> + '_ {
        self.ips.iter().map(|a| Src::Net(IpNet::from(a)))
    }
}

impl<'a> View<'a> {
    pub fn new(state: &'a ClusterState) -> View<'a> {
        let mut namespaces = BTreeMap::new();
        let mut by_vnid: HashMap<Vnid, Vec<&str>> = HashMap::new();
        for n in &state.net_namespaces {
            if namespaces.contains_key(n.name.as_str()) {
                continue;
            }
            let mut labels = n.labels.clone();
            labels.entry(NAMESPACE_NAME_LABEL.to_string()).or_insert_with(|| n.name.clone());
            namespaces.insert(n.name.as_str(), (n.vnid, labels));
            by_vnid.entry(n.vnid).or_default().push(n.name.as_str());
        }
        let pods = state
            .pods
            .iter()
            .map(|p| ViewPod { namespace: &p.namespace, ips: p.ips(), labels: state.pod_labels(p), container_ports: state.pod_container_ports(p) })
            .chain(state.remote_pods.iter().map(|p| ViewPod {
                namespace: &p.namespace,
                ips: crate::domain::PodIps { v4: p.ip, v6: p.ip6 },
                labels: &p.labels,
                container_ports: &p.container_ports,
            }))
            .collect();
        View { namespaces, by_vnid, pods }
    }

    fn selected_namespaces(&self, policy_ns: &str, sel: &Option<Selector>) -> BTreeSet<&'a str> {
        match sel {
            None => self.namespaces.keys().copied().filter(|n| *n == policy_ns).collect(),
            Some(s) => self.namespaces.iter().filter(|(_, (_, l))| s.matches(l)).map(|(n, _)| *n).collect(),
        }
    }

    /// The sources a peer allows.
    fn sources(&self, policy_ns: &str, p: &Peer, out: &mut Vec<Src>) {
        match p {
            Peer::IpBlock { cidr, except } => out.extend(subtract(*cidr, except).into_iter().map(Src::Net)),
            Peer::Pods { namespaces, pods } => {
                let selected = self.selected_namespaces(policy_ns, namespaces);
                let pod_ips = |nss: &BTreeSet<&str>, sel: Option<&Selector>, out: &mut Vec<Src>| {
                    for p in &self.pods {
                        if nss.contains(p.namespace) && sel.is_none_or(|s| s.matches(p.labels)) {
                            out.extend(p.addresses());
                        }
                    }
                };
                match pods {
                    Some(sel) => pod_ips(&selected, Some(sel), out),
                    None => {
                        // Whole namespaces: by VNID where every namespace of the VNID is
                        // selected, else pod by pod (the VNID would admit the others too).
                        let mut by_ip = BTreeSet::new();
                        let vnids: BTreeSet<Vnid> = selected.iter().filter_map(|n| self.namespaces.get(n).map(|(v, _)| *v)).collect();
                        for v in vnids {
                            let members = self.by_vnid.get(&v).map(Vec::as_slice).unwrap_or(&[]);
                            if members.iter().all(|m| selected.contains(m)) {
                                out.push(Src::Vnid(v));
                            } else {
                                by_ip.extend(members.iter().filter(|m| selected.contains(*m)).copied());
                            }
                        }
                        pod_ips(&by_ip, None, out);
                    }
                }
            }
        }
    }
}

impl View<'_> {
    /// The destinations an egress rule allows, each with the rule's ports for it: the numeric
    /// ports for every destination; a named port resolves on the destination pod — a pod peer,
    /// or any pod in view whose address the ipBlock holds (or any pod at all, without `to`):
    /// the specification looks a named port up on the destination pod, whichever way the
    /// destination was selected.
    fn destinations(&self, policy_ns: &str, r: &Rule) -> Vec<(Src, Vec<Dst>)> {
        let numeric: Vec<Dst> = match &r.ports {
            None => vec![Dst::Any],
            Some(ports) => ports.iter().filter(|p| !matches!(p.port, PortSpec::Named(_))).flat_map(|p| resolve(p, &[])).collect(),
        };
        let named: Vec<&PolicyPort> = r.ports.iter().flatten().filter(|p| matches!(p.port, PortSpec::Named(_))).collect();
        let named_on = |p: &ViewPod<'_>| -> Vec<Dst> { named.iter().flat_map(|n| resolve(n, p.container_ports)).collect() };
        let mut out = Vec::new();
        let Some(peers) = &r.peers else {
            out.push((Src::Any, numeric));
            if !named.is_empty() {
                out.extend(self.pods.iter().flat_map(|p| p.addresses().map(move |a| (a, p))).map(|(a, p)| (a, named_on(p))).filter(|(_, d)| !d.is_empty()));
            }
            return out;
        };
        for peer in peers {
            match peer {
                Peer::IpBlock { cidr, except } => {
                    let parts = subtract(*cidr, except);
                    if !named.is_empty() {
                        // Each of the pod's addresses the block holds (an IPv6 block, its IPv6 one).
                        for p in &self.pods {
                            for a in p.addresses() {
                                let Src::Net(host) = a else { continue };
                                if parts.iter().any(|n| n.contains(&host)) {
                                    let d = named_on(p);
                                    if !d.is_empty() {
                                        out.push((a, d));
                                    }
                                }
                            }
                        }
                    }
                    out.extend(parts.into_iter().map(|n| (Src::Net(n), numeric.clone())));
                }
                Peer::Pods { namespaces, pods } => {
                    let selected = self.selected_namespaces(policy_ns, namespaces);
                    for p in &self.pods {
                        if selected.contains(p.namespace) && pods.as_ref().is_none_or(|s| s.matches(p.labels)) {
                            let mut d = numeric.clone();
                            d.extend(named_on(p));
                            out.extend(p.addresses().map(|a| (a, d.clone())));
                        }
                    }
                }
            }
        }
        out
    }
}

/// What the policies of `namespace` make of its local pods: every pod some Ingress policy
/// selects, each rule of those policies with its sources and, per selected pod, its ports;
/// every pod some Egress policy selects, each egress rule with its destinations and their
/// ports. (No warnings today: kept for what a later version may not enforce.)
pub fn isolation(state: &ClusterState, view: &View<'_>, namespace: &str) -> (NamespacePolicy, Vec<Problem>) {
    let warnings = Vec::new();
    let policies: Vec<&NetworkPolicy> = state.network_policies.iter().filter(|p| p.namespace == namespace).collect();
    let pods: Vec<&super::Pod> = state.pods.iter().filter(|p| p.namespace == namespace).collect();
    // Per side (ingress, egress): which pods some policy of that type selects.
    let mut isolated = [vec![false; pods.len()], vec![false; pods.len()]];
    let (mut rules, mut egress_rules) = (Vec::new(), Vec::new());
    let mut audit = Audit { meter_id: crate::pipeline::audit::AUDIT_METER_ID, ..Default::default() };
    let mut deny: BTreeMap<(Side, IpAddr), Vec<&str>> = BTreeMap::new();
    for p in &policies {
        let selected: Vec<usize> = (0..pods.len()).filter(|i| p.pod_selector.matches(state.pod_labels(pods[*i]))).collect();
        if selected.is_empty() {
            continue;
        }
        // What the audit log takes of it: nothing unless the node writes one; then the
        // policy's annotation, or all of it with the node's `all`.
        let mode = match state.audit {
            NodeAudit { enabled: false, .. } => AuditMode::default(),
            NodeAudit { all: true, .. } => AuditMode::ALL,
            _ => p.audit,
        };
        for (side, side_rules) in [(Side::Ingress, &p.ingress), (Side::Egress, &p.egress)] {
            let Some(side_rules) = side_rules else { continue };
            for i in &selected {
                isolated[usize::from(side == Side::Egress)][*i] = true;
                if mode.deny {
                    for ip in pods[*i].ips().iter() {
                        deny.entry((side, ip)).or_default().push(&p.name);
                    }
                }
            }
            if mode.allow {
                audit.allow.extend((0..side_rules.len()).map(|ri| (side, p.name.clone(), ri)));
            }
            for (ri, r) in side_rules.iter().enumerate() {
                match side {
                    Side::Ingress => {
                        let srcs = r.peers.as_ref().map(|peers| {
                            let mut out = Vec::new();
                            for peer in peers {
                                view.sources(&p.namespace, peer, &mut out);
                            }
                            out.sort();
                            out.dedup();
                            out
                        });
                        let pods = selected.iter().map(|i| (pods[*i].ips(), destinations(r, state.pod_container_ports(pods[*i])))).collect();
                        rules.push(RuleAllow { policy: p.name.clone(), rule: ri, srcs, pods });
                    }
                    Side::Egress => {
                        let peers = view.destinations(&p.namespace, r);
                        let pods = selected.iter().map(|i| pods[*i].ips()).collect();
                        egress_rules.push(EgressRule { policy: p.name.clone(), rule: ri, pods, peers });
                    }
                }
            }
        }
    }
    audit.deny = deny.into_iter().map(|(k, v)| (k, v.join(","))).collect();
    // Conjunctions keep namespaces apart by the selected pod's VNID (reg1 for ingress, reg0
    // for egress): only a VNID no other namespace carries will do.
    let pod_vnid = state.vnid_of(namespace);
    let vnid = pod_vnid.filter(|v| !state.net_namespaces.iter().any(|n| n.vnid == *v && n.name != namespace));
    let [isolated, egress_isolated] = isolated.map(|flags| pods.iter().zip(flags).filter(|(_, i)| *i).map(|(p, _)| p.ips()).collect());
    (NamespacePolicy { namespace: namespace.to_string(), vnid, isolated, rules, pod_vnid, egress_isolated, egress_rules, audit }, warnings)
}

/// A rule's ports for one destination pod (named ports resolved against its containerPorts).
fn destinations(r: &Rule, container_ports: &[ContainerPort]) -> Vec<Dst> {
    let Some(ports) = &r.ports else { return vec![Dst::Any] };
    ports.iter().flat_map(|p| resolve(p, container_ports)).collect()
}

/// One policy port for a destination with `container_ports` (a named port: the numbers of
/// its container ports of that name and protocol, none if it has none).
fn resolve(p: &PolicyPort, container_ports: &[ContainerPort]) -> Vec<Dst> {
    let proto = match p.proto {
        Proto::Tcp => L4::Tcp,
        Proto::Udp => L4::Udp,
        Proto::Sctp => L4::Sctp,
    };
    match &p.port {
        PortSpec::All => vec![Dst::Ports { proto, start: 0, end: u16::MAX }],
        PortSpec::Range(s, e) => vec![Dst::Ports { proto, start: *s, end: *e }],
        PortSpec::Named(n) => container_ports
            .iter()
            .filter(|c| c.name.as_deref() == Some(n.as_str()) && c.proto == p.proto)
            .map(|cp| Dst::Ports { proto, start: cp.port, end: cp.port })
            .collect(),
    }
}

/// The namespaces whose table-80 flows may change when a pod of `namespace` comes, goes or
/// changes labels: its own (as a destination) and those with a policy whose peers select pods
/// by label or list them one by one in `namespace`.
pub fn namespaces_watching_pods_of(state: &ClusterState, namespace: &str) -> BTreeSet<String> {
    let mut out = namespaces_affected(state, &BTreeSet::from([namespace.to_string()]), &BTreeMap::new());
    out.insert(namespace.to_string());
    out
}

/// The namespaces with policies whose flows may change when pods of `pods_of` come, go or
/// change (labels, IP, containerPorts), or when the namespaces of `relabelled` change labels
/// (given their labels before, as selectors saw them). `state` is the state after the
/// change; its policies are those the namespaces have then (a namespace whose policies changed
/// is touched by that change itself).
///
/// A policy of namespace N can see pods of P through a peer (ingress `from`, egress `to`)
/// without namespaceSelector (P = N) or through a namespaceSelector that matches P's labels,
/// before or after a relabelling; an ipBlock sees addresses, not pods; an egress rule with a
/// named port and no `to`, or an ipBlock in `to`, sees every pod (the port resolves on the
/// destination pod).
/// Conservative where cheap: a relabelled namespace's own policies count as affected.
pub fn namespaces_affected(state: &ClusterState, pods_of: &BTreeSet<String>, relabelled: &BTreeMap<String, Labels>) -> BTreeSet<String> {
    let view = View::new(state);
    let labels_now = |n: &str| view.namespaces.get(n).map(|(_, l)| l);
    let mut out = BTreeSet::new();
    for p in &state.network_policies {
        if out.contains(&p.namespace) {
            continue;
        }
        let own = pods_of.contains(&p.namespace) || relabelled.contains_key(&p.namespace);
        let any_destination_named = || {
            !pods_of.is_empty()
                && p.egress.iter().flatten().any(|r| {
                    r.ports.iter().flatten().any(|p| matches!(p.port, PortSpec::Named(_)))
                        && r.peers.as_ref().is_none_or(|peers| peers.iter().any(|p| matches!(p, Peer::IpBlock { .. })))
                })
        };
        let affected = own
            || any_destination_named()
            || p.ingress.iter().chain(p.egress.iter()).flatten().flat_map(|r| r.peers.iter().flatten()).any(|peer| match peer {
                // The policy's own namespace: `own` above.
                Peer::IpBlock { .. } | Peer::Pods { namespaces: None, .. } => false,
                Peer::Pods { namespaces: Some(sel), .. } => {
                    pods_of.iter().any(|n| labels_now(n).is_some_and(|l| sel.matches(l)))
                        || relabelled.iter().any(|(n, old)| {
                            sel.matches(old) || labels_now(n).is_some_and(|l| sel.matches(l))
                        })
                }
            });
        if affected {
            out.insert(p.namespace.clone());
        }
    }
    out
}

/// An IPv4 address from text, or why not.
pub fn ipv4(s: &str) -> Result<Ipv4Addr, String> {
    match s.parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) => Ok(a),
        _ => Err(format!("{s:?} is not an IPv4 address")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtract_leaves_disjoint_blocks() {
        let c: IpNet = "10.0.0.0/8".parse().unwrap();
        let parts = subtract(c, &["10.1.0.0/16".parse().unwrap(), "10.2.3.0/24".parse().unwrap()]);
        for a in ["10.0.0.1", "10.2.2.9", "10.255.0.1", "10.2.4.0"] {
            let a: IpAddr = a.parse().unwrap();
            assert_eq!(parts.iter().filter(|p| p.contains(&a)).count(), 1, "{a} {parts:?}");
        }
        for a in ["10.1.0.1", "10.2.3.200", "11.0.0.1"] {
            let a: IpAddr = a.parse().unwrap();
            assert!(parts.iter().all(|p| !p.contains(&a)), "{a} {parts:?}");
        }
        assert!(subtract(c, &[c]).is_empty());
    }

    #[test]
    fn selectors() {
        let l: Labels = [("app".to_string(), "db".to_string())].into();
        let s = |m: &[(&str, &str)], e: Vec<Requirement>| Selector { match_labels: m.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(), exprs: e };
        assert!(s(&[], vec![]).matches(&l));
        assert!(s(&[("app", "db")], vec![]).matches(&l));
        assert!(!s(&[("app", "web")], vec![]).matches(&l));
        assert!(s(&[], vec![Requirement::NotIn("app".into(), ["web".into()].into())]).matches(&l));
        assert!(s(&[], vec![Requirement::NotIn("tier".into(), ["web".into()].into())]).matches(&l));
        assert!(!s(&[], vec![Requirement::In("tier".into(), ["web".into()].into())]).matches(&l));
        assert!(s(&[], vec![Requirement::DoesNotExist("tier".into())]).matches(&l));
        assert!(!s(&[], vec![Requirement::Exists("tier".into())]).matches(&l));
    }

    #[test]
    fn egress_named_ports_resolve_on_the_destination_pod() {
        let text = r#"
node: node-a
plugin: networkpolicy
clusterNetwork: 10.128.0.0/14
serviceNetwork: 172.30.0.0/16
hostSubnets:
  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.0.0/23}
  - {host: node-b, hostIP: 172.17.0.3, subnet: 10.128.2.0/23}
netNamespaces:
  - {name: a, netid: 11}
  - {name: b, netid: 12}
pods:
  - {namespace: a, name: client, containerID: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", hostVeth: v1, internal: true, ip: 10.128.0.5, mac: "0a:58:0a:80:00:05"}
remotePods:
  - {namespace: b, name: db1, ip: 10.128.2.5, labels: {app: db}, containerPorts: [{name: sql, containerPort: 5432}]}
  - {namespace: b, name: db2, ip: 10.128.2.6, labels: {app: db}, containerPorts: [{name: sql, containerPort: 5433}]}
  - {namespace: b, name: web, ip: 10.128.2.7, labels: {app: web}}
networkPolicies:
  - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: out, namespace: a}, spec: {podSelector: {}, policyTypes: [Egress], egress: [{to: [{namespaceSelector: {}}], ports: [{port: sql}, {port: 80}]}, {to: [{ipBlock: {cidr: 10.128.2.0/24}}], ports: [{port: sql}]}]}}
"#;
        let (state, problems) = crate::cluster::state_file::parse(text).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        let view = View::new(&state);
        let (ns, warnings) = isolation(&state, &view, "a");
        assert!(warnings.is_empty() && ns.isolated.is_empty(), "{warnings:?} {ns:?}");
        assert_eq!(ns.egress_isolated, vec!["10.128.0.5".parse::<crate::domain::PodIps>().unwrap()]);
        let tcp = |p: u16| Dst::Ports { proto: L4::Tcp, start: p, end: p };
        let net = |a: &str| Src::Net(a.parse().unwrap());
        // Rule 0: every pod of every namespace on 80, and on its own "sql" port where it has one.
        let r0: BTreeSet<(Src, Vec<Dst>)> = ns.egress_rules[0].peers.iter().cloned().collect();
        for want in [(net("10.128.2.5/32"), vec![tcp(80), tcp(5432)]), (net("10.128.2.6/32"), vec![tcp(80), tcp(5433)]), (net("10.128.2.7/32"), vec![tcp(80)]), (net("10.128.0.5/32"), vec![tcp(80)])] {
            assert!(r0.contains(&want), "{want:?} in {r0:?}");
        }
        // Rule 1: the block itself has no numeric port (nothing); the pods in it their "sql".
        let r1: BTreeSet<(Src, Vec<Dst>)> = ns.egress_rules[1].peers.iter().cloned().collect();
        assert_eq!(r1, BTreeSet::from([(net("10.128.2.0/24"), vec![]), (net("10.128.2.5/32"), vec![tcp(5432)]), (net("10.128.2.6/32"), vec![tcp(5433)])]));
        // A change to pods of b touches a's policies (rule 0 selects b's pods; rule 1's block).
        assert!(namespaces_affected(&state, &BTreeSet::from(["b".to_string()]), &BTreeMap::new()).contains("a"));
    }
}
