//! The networkpolicy plugin's flows without packets:
//!
//! - no two flows of equal priority in one table overlap with different actions, for every
//!   plugin (the example states and generated NetworkPolicy states): no packet's fate depends on
//!   how OVS breaks a tie;
//! - every new flow shape decodes in Open vSwitch (`ovs-ofctl ofp-parse`) to the text our
//!   `Display` prints (the oracle pattern of openflow/tests/ofp_parse.rs);
//! - scale: one policy change at 1,000 policies and 5,000 pods in view recomputes one namespace;
//!   the agent CPU and FLOW_MODs of that change are printed.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::process::Command;

use openflow::{EthMatch, IpProto, Masked, Match};
use sdn_node::cluster::desired::{desired_state_with_warnings, owner_flows};
use sdn_node::cluster::state_file::parse;
use sdn_node::cluster::{ClusterState, PodKey};
use sdn_node::domain::OfPort;
use sdn_node::pipeline::egress::DnsAnswers;
use sdn_node::store::{diff, diff_owners, Compiled, InstalledState, Owner};

fn m_disjoint_u32(a: Option<(u32, u32)>, b: Option<(u32, u32)>) -> bool {
    matches!((a, b), (Some((va, ma)), Some((vb, mb))) if (va ^ vb) & ma & mb != 0)
}

fn ip(m: Option<Masked<Ipv4Addr>>) -> Option<(u32, u32)> {
    m.map(|m| (u32::from(m.value()), u32::from(m.mask())))
}

fn u16m(m: Option<Masked<u16>>) -> Option<(u32, u32)> {
    m.map(|m| (m.value() as u32, m.mask() as u32))
}

/// Two matches are disjoint when some field is specified by both with values that cannot
/// both hold; otherwise a packet may match both.
fn disjoint(a: &Match, b: &Match) -> bool {
    if matches!((a.in_port, b.in_port), (Some(x), Some(y)) if x != y) {
        return true;
    }
    if matches!((a.eth.eth_type(), b.eth.eth_type()), (Some(x), Some(y)) if x != y) {
        return true;
    }
    match (&a.eth, &b.eth) {
        (EthMatch::Ipv4(x), EthMatch::Ipv4(y)) => {
            if m_disjoint_u32(ip(x.src), ip(y.src)) || m_disjoint_u32(ip(x.dst), ip(y.dst)) {
                return true;
            }
            if let (Some(fx), Some(fy)) = (x.frag, y.frag) {
                let ((vx, mx), (vy, my)) = (fx.value_mask(), fy.value_mask());
                if (vx ^ vy) & mx & my != 0 {
                    return true;
                }
            }
            // A later fragment has no L4 header: OVS matches its tp_dst as 0.
            let later = |m: &openflow::Ipv4Match| m.frag == Some(openflow::IpFrag::Later);
            let port_of = |m: &openflow::Ipv4Match| match m.proto {
                Some(IpProto::Tcp { dst }) | Some(IpProto::Udp { dst }) | Some(IpProto::Sctp { dst }) => u16m(dst),
                _ => None,
            };
            if (later(x) && m_disjoint_u32(Some((0, 0xffff)), port_of(y))) || (later(y) && m_disjoint_u32(Some((0, 0xffff)), port_of(x))) {
                return true;
            }
            match (x.proto, y.proto) {
                (Some(px), Some(py)) if px.number() != py.number() => return true,
                (Some(IpProto::Tcp { dst: dx }), Some(IpProto::Tcp { dst: dy }))
                | (Some(IpProto::Udp { dst: dx }), Some(IpProto::Udp { dst: dy }))
                | (Some(IpProto::Sctp { dst: dx }), Some(IpProto::Sctp { dst: dy }))
                    if m_disjoint_u32(u16m(dx), u16m(dy)) =>
                {
                    return true;
                }
                _ => {}
            }
        }
        (EthMatch::Arp(x), EthMatch::Arp(y)) | (EthMatch::Rarp(x), EthMatch::Rarp(y)) => {
            if matches!((x.op, y.op), (Some(p), Some(q)) if p != q)
                || m_disjoint_u32(ip(x.spa), ip(y.spa))
                || m_disjoint_u32(ip(x.tpa), ip(y.tpa))
            {
                return true;
            }
            for (p, q) in [(x.sha, y.sha), (x.tha, y.tha)] {
                if let (Some(p), Some(q)) = (p, q) {
                    let (vp, mp, vq, mq) = (p.value().0, p.mask().0, q.value().0, q.mask().0);
                    if (0..6).any(|i| (vp[i] ^ vq[i]) & mp[i] & mq[i] != 0) {
                        return true;
                    }
                }
            }
        }
        _ => {}
    }
    if let (Some(x), Some(y)) = (a.tun_id, b.tun_id) {
        if (x.value() ^ y.value()) & x.mask() & y.mask() != 0 {
            return true;
        }
    }
    if m_disjoint_u32(ip(a.tun_src), ip(b.tun_src)) || m_disjoint_u32(ip(a.tun_dst), ip(b.tun_dst)) {
        return true;
    }
    for i in 0..16 {
        if m_disjoint_u32(a.regs[i].map(|m| (m.value(), m.mask())), b.regs[i].map(|m| (m.value(), m.mask()))) {
            return true;
        }
    }
    if m_disjoint_u32(a.ct_state.map(|m| (m.value(), m.mask())), b.ct_state.map(|m| (m.value(), m.mask())))
        || m_disjoint_u32(a.ct_mark.map(|m| (m.value(), m.mask())), b.ct_mark.map(|m| (m.value(), m.mask())))
        || matches!((a.ct_zone, b.ct_zone), (Some(x), Some(y)) if x != y)
    {
        return true;
    }
    // Unmodelled fields: the same field with different bytes (conservative: equal headers
    // with different payloads are taken as disjoint only when both are exact).
    a.other.iter().any(|x| b.other.iter().any(|y| x.header == y.header && x.header & 0x100 == 0 && x.payload != y.payload))
}

/// Every pair of equal-priority entries of one table with overlapping matches and different
/// actions, as text: only such a pair makes a packet's fate depend on which entry the switch
/// picks (an overlap with identical actions, like openshift-sdn's two VNID-0 accepts in
/// table 80, is harmless).
///
/// Conjunctive matches as OVS's classifier runs them (lib/classifier.c): a flow whose actions
/// are `conjunction(id,k/n)` is no entry of its own (every such flow a packet matches is
/// collected, none is chosen); conjunction `id` is an entry at its `conj_id` flow's priority
/// that matches the packets matching one flow of each clause and the `conj_id` flow's other
/// fields, with that flow's actions — expanded here into one box per choice of clause
/// members (masked fields: a set of matches has a common packet iff every two of them do). A
/// non-conjunctive flow of the same priority that a packet matches hides the conjunction
/// (OVS considers conjunctions only above the best such flow): an overlap with different
/// actions is reported like any tie. Also reported: a flow mixing `conjunction` with other
/// actions, clause flows of one id at another priority than its `conj_id` flow, with
/// different `n`, a clause without flows, an id without or with two `conj_id` flows in one
/// table.
fn ties(flows: &[Compiled]) -> Vec<String> {
    use openflow::{Action, Instruction};
    /// An entry: the matches a packet must all match, the encoded instructions, the text.
    type Entry = (Vec<Match>, Vec<u8>, String);
    /// A clause membership: priority, k, n, match, text.
    type Member = (u16, u8, u8, Match, String);
    /// A `conj_id` flow: priority, match, encoded instructions, text.
    type ConjFlow = (u16, Match, Vec<u8>, String);
    let mut groups: BTreeMap<(u8, u16), Vec<Entry>> = BTreeMap::new();
    // (table, id) -> (priority, k, n, match, text) of every clause membership.
    let mut clauses: BTreeMap<(u8, u32), Vec<Member>> = BTreeMap::new();
    // (table, id) -> the conj_id flows.
    let mut conj: BTreeMap<(u8, u32), Vec<ConjFlow>> = BTreeMap::new();
    let mut out = Vec::new();
    for c in flows {
        let m = c.key.decode_match().expect("decode match");
        let text = c.to_string();
        let ins = openflow::instruction::decode_instructions(&c.instructions).expect("decode instructions");
        let actions: Vec<&Action> = ins.iter().flat_map(|i| match i { Instruction::ApplyActions(a) | Instruction::WriteActions(a) => a.iter().collect(), _ => vec![] }).collect();
        let conjunctions: Vec<openflow::Conjunction> = actions.iter().filter_map(|a| match a { Action::Conjunction(c) => Some(*c), _ => None }).collect();
        if !conjunctions.is_empty() {
            if conjunctions.len() != actions.len() || ins.len() != 1 || !matches!(ins[0], Instruction::ApplyActions(_)) {
                out.push(format!("{text}\n    mixes conjunction with other actions or instructions"));
            }
            for cj in conjunctions {
                clauses.entry((c.key.table, cj.id())).or_default().push((c.key.priority, cj.clause(), cj.n_clauses(), m.clone(), text.clone()));
            }
            continue;
        }
        // What decides the packet's fate: the instructions without the audit log's copy to the
        // controller (which rule's name the log gets when several allow a packet is OVS's
        // choice; the verdict is not).
        let verdict: Vec<u8> = format!("{:?}", without_audit(&ins)).into_bytes();
        if let Some(id) = m.conj_id {
            conj.entry((c.key.table, id)).or_default().push((c.key.priority, m, verdict, text));
            continue;
        }
        groups.entry((c.key.table, c.key.priority)).or_default().push((vec![m], verdict, text));
    }
    for ((table, id), cf) in &conj {
        if cf.len() != 1 {
            out.push(format!("conj_id={id} in table {table}: {} flows\n    {}", cf.len(), cf.iter().map(|c| c.3.as_str()).collect::<Vec<_>>().join("\n    ")));
        }
        if !clauses.contains_key(&(*table, *id)) {
            out.push(format!("{}\n    has no clause flows", cf[0].3));
        }
    }
    for ((table, id), members) in &clauses {
        let Some([(prio, cm, ins, ctext)]) = conj.get(&(*table, *id)).map(Vec::as_slice) else {
            out.push(format!("{}\n    conjunction {id} has no single conj_id flow in table {table}", members[0].4));
            continue;
        };
        let n = members[0].2;
        let mut by_k: Vec<Vec<&Match>> = vec![Vec::new(); n as usize];
        for (p, k, nn, m, text) in members {
            if p != prio || *nn != n {
                out.push(format!("{text}\n    clause of {id} at priority {p} with n={nn}; its conj_id flow: {ctext}"));
                continue;
            }
            by_k[*k as usize - 1].push(m);
        }
        if let Some(k) = by_k.iter().position(Vec::is_empty) {
            out.push(format!("{ctext}\n    clause {} of {n} has no flow", k + 1));
            continue;
        }
        // The boxes: one member per clause, every two compatible (and with the conj_id flow's
        // other fields).
        let mut base = cm.clone();
        base.conj_id = None;
        let mut boxes: Vec<Vec<Match>> = vec![vec![base]];
        for clause in &by_k {
            let mut next = Vec::new();
            for b in &boxes {
                for m in clause {
                    if b.iter().all(|x| !disjoint(x, m)) {
                        let mut nb = b.clone();
                        nb.push((*m).clone());
                        next.push(nb);
                    }
                }
            }
            boxes = next;
        }
        let g = groups.entry((*table, *prio)).or_default();
        for b in boxes {
            let text = format!("{ctext} via {}", b[1..].iter().map(|m| m.to_string()).collect::<Vec<_>>().join(" & "));
            g.push((b, ins.clone(), text));
        }
    }
    for g in groups.values() {
        for (i, (a, ia, ta)) in g.iter().enumerate() {
            for (b, ib, tb) in &g[i + 1..] {
                if ia != ib && a.iter().all(|x| b.iter().all(|y| !disjoint(x, y))) {
                    out.push(format!("{ta}\n    overlaps {tb}"));
                }
            }
        }
    }
    out
}

/// `ins` without `controller(...)` actions (the audit log's).
fn without_audit(ins: &[openflow::Instruction]) -> Vec<openflow::Instruction> {
    use openflow::{Action, Instruction};
    ins.iter()
        .filter_map(|i| match i {
            Instruction::ApplyActions(a) => {
                let kept: Vec<Action> = a.iter().filter(|a| !matches!(a, Action::Controller(_))).cloned().collect();
                // An action list that held only the copy is no instruction at all.
                (!kept.is_empty()).then_some(Instruction::ApplyActions(kept))
            }
            other => Some(other.clone()),
        })
        .collect()
}

/// The NetworkPolicy flows of a desired state (the namespaces' own and the clause flows they
/// share), and how many of them are shared.
fn netpol_counts(d: &sdn_node::store::DesiredState) -> (usize, usize) {
    let own = d.iter().filter(|(o, _)| matches!(o, Owner::NetworkPolicy { .. })).count();
    let shared = d.iter().filter(|(o, _)| matches!(o, Owner::Shared)).count();
    (own + shared, shared)
}

fn ofports(state: &ClusterState) -> HashMap<PodKey, OfPort> {
    state.pods.iter().enumerate().map(|(i, p)| (p.key(), OfPort(3 + i as u32))).collect()
}

fn all_flows(state: &ClusterState) -> Vec<Compiled> {
    let mut dns = DnsAnswers::new();
    dns.insert("www.example.com".into(), Ok(vec!["93.184.216.34".parse().unwrap()]));
    let (d, problems, _) = desired_state_with_warnings(state, &ofports(state), &dns);
    assert!(problems.is_empty(), "{problems:?}");
    d.iter().map(|(_, c)| c.clone()).collect()
}

/// A generated networkpolicy state: `namespaces` namespaces, `pods` pods (a quarter local),
/// `policies` policies of every rule shape, from a seed. With `egress`, remote pods have
/// containerPorts too and each policy is of type Ingress, Egress or both (the same rule shapes
/// with `to`); without, every policy is of type Ingress (the scale figures' states).
fn generated(seed: u64, namespaces: usize, pods: usize, policies: usize, egress: bool) -> String {
    let mut r = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move |n: usize| {
        r ^= r >> 12;
        r ^= r << 25;
        r ^= r >> 27;
        (r.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64) as usize
    };
    let mut s = String::from(
        "node: node-a\nplugin: networkpolicy\nclusterNetwork: 10.128.0.0/14\nserviceNetwork: 172.30.0.0/16\nhostSubnets:\n  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.0.0/18}\n  - {host: node-b, hostIP: 172.17.0.3, subnet: 10.129.0.0/16}\nnetNamespaces:\n",
    );
    for n in 0..namespaces {
        s += &format!("  - {{name: ns-{n}, netid: {}, labels: {{team: t{}, tier: x{}}}}}\n", 100 + n, n % 7, n % 3);
    }
    let (mut local, mut remote) = (String::from("pods:\n"), String::from("remotePods:\n"));
    for i in 0..pods {
        let ns = i % namespaces;
        let labels = format!("{{app: a{}, role: r{}}}", i % 5, i % 3);
        // A quarter of every namespace's pods are local.
        if (i / namespaces).is_multiple_of(4) {
            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 10)) + i as u32);
            let o = ip.octets();
            local += &format!(
                "  - {{namespace: ns-{ns}, name: p{i}, containerID: \"{:064x}\", hostVeth: v{i}, internal: true, ip: {ip}, mac: \"0a:58:{:02x}:{:02x}:{:02x}:{:02x}\", labels: {labels}, containerPorts: [{{name: http, containerPort: {}, protocol: TCP}}, {{name: assoc, containerPort: {}, protocol: SCTP}}]}}\n",
                i + 1,
                o[0],
                o[1],
                o[2],
                o[3],
                8000 + i % 3,
                8000 + i % 2
            );
        } else {
            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 129, 0, 10)) + i as u32);
            let ports = if egress { format!(", containerPorts: [{{name: http, containerPort: {}, protocol: TCP}}]", 8000 + i % 3) } else { String::new() };
            remote += &format!("  - {{namespace: ns-{ns}, name: p{i}, ip: {ip}, labels: {labels}{ports}}}\n");
        }
    }
    s += &local;
    s += &remote;
    s += "networkPolicies:\n";
    let sel = |k: usize, key: &str, vals: usize| match k % 4 {
        0 => "{}".to_string(),
        1 => format!("{{matchLabels: {{{key}: {}{}}}}}", &key[..1], k % vals),
        2 => format!("{{matchExpressions: [{{key: {key}, operator: NotIn, values: [{}{}]}}]}}", &key[..1], k % vals),
        _ => format!("{{matchExpressions: [{{key: {key}, operator: In, values: [{}{}, {}{}]}}]}}", &key[..1], k % vals, &key[..1], (k + 1) % vals),
    };
    for p in 0..policies {
        let ns = next(namespaces);
        let pod_sel = sel(next(8), "app", 5);
        let kind = if egress { next(3) } else { 0 };
        let mut rules_of = |key: &str| {
            let mut rules = Vec::new();
            for _ in 0..next(3) {
                let from = match next(6) {
                    0 => String::new(),
                    1 => format!("{key}: [{{podSelector: {}}}]", sel(next(8), "role", 3)),
                    2 => format!("{key}: [{{namespaceSelector: {}}}]", sel(next(8), "team", 7)),
                    3 => format!("{key}: [{{namespaceSelector: {}, podSelector: {}}}]", sel(next(8), "tier", 3), sel(next(8), "app", 5)),
                    4 => format!("{key}: [{{ipBlock: {{cidr: 10.128.0.0/14, except: [10.129.0.0/17, 10.128.0.64/26]}}}}]"),
                    _ => format!("{key}: [{{podSelector: {}}}, {{ipBlock: {{cidr: 10.129.{}.0/24}}}}]", sel(next(8), "app", 5), next(4)),
                };
                let ports = match next(6) {
                    0 => String::new(),
                    1 => format!("ports: [{{port: {}}}]", 8000 + next(3)),
                    2 => "ports: [{port: http}, {protocol: UDP, port: 53}, {protocol: SCTP, port: assoc}]".to_string(),
                    3 => format!("ports: [{{protocol: TCP, port: {}, endPort: {}}}]", 1000 + next(100), 2000 + next(3000)),
                    4 => "ports: [{protocol: UDP}, {protocol: SCTP}]".to_string(),
                    _ => "ports: [{port: 8000, endPort: 8002}, {port: 8001}, {protocol: SCTP, port: 8000, endPort: 8003}]".to_string(),
                };
                let parts: Vec<String> = [from, ports].into_iter().filter(|x| !x.is_empty()).collect();
                rules.push(format!("{{{}}}", parts.join(", ")));
            }
            rules.join(", ")
        };
        let body = match kind {
            0 => format!("ingress: [{}]", rules_of("from")),
            1 => format!("policyTypes: [Egress], egress: [{}]", rules_of("to")),
            _ => format!("policyTypes: [Ingress, Egress], ingress: [{}], egress: [{}]", rules_of("from"), rules_of("to")),
        };
        let annotations = if egress && p % 3 == 0 { format!(", annotations: {{sdn-node.openshift.io/audit-log: {}}}", ["all", "allow", "deny"][p % 9 / 3]) } else { String::new() };
        s += &format!("  - {{apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {{name: np{p}, namespace: ns-{ns}{annotations}}}, spec: {{podSelector: {pod_sel}, {body}}}}}\n");
    }
    s
}

/// A realistic NetworkPolicy state, after the generator: `namespaces` namespaces (the
/// first is `monitoring`, the second `dns`; the others alternate env=prod/dev/staging, 20
/// teams), `local` pods on this node and `remote` pods spread over nodes of 200 pods each,
/// five apps (frontend, backend, db, cache, worker) with named container ports (`http` 8080,
/// `metrics` 9090 or 9187 on db, `postgres` 5432, `redis` 6379, `dns` 53), and ten policies per
/// namespace: default-deny, same namespace, from env=prod, frontend → backend on 8080,
/// backend → db on the named port, monitoring on `metrics` and 9090, an ipBlock with except,
/// an endPort range, cache from backend or worker, and a cross-team rule with a namespace and
/// pod selector. With `egress`, default-deny and same-namespace are both directions, and two
/// policies are egress ones (DNS to the dns namespace on port 53; frontend to backend 8080 and
/// outside the cluster on 443).
fn realistic(namespaces: usize, local: usize, remote: usize, egress: bool) -> String {
    assert!(namespaces >= 3);
    let pods_per_node = 200;
    let nodes = remote.div_ceil(pods_per_node);
    let mut s = String::from("node: node-a\nplugin: networkpolicy\nclusterNetwork: 10.128.0.0/14\nserviceNetwork: 172.30.0.0/16\nhostSubnets:\n  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.0.0/22}\n");
    for n in 0..nodes {
        s += &format!("  - {{host: node-{n}, hostIP: 172.18.{}.{}, subnet: 10.{}.{}.0/23}}\n", n / 250, n % 250 + 2, 128 + (n + 2) / 128, ((n + 2) % 128) * 2);
    }
    let ns_name = |n: usize| match n {
        0 => "monitoring".to_string(),
        1 => "dns".to_string(),
        _ => format!("ns-{n}"),
    };
    s += "netNamespaces:\n";
    for n in 0..namespaces {
        let labels = match n {
            0 => "{team: monitoring, env: prod}".to_string(),
            1 => "{name: dns, env: prod}".to_string(),
            _ => format!("{{team: t{}, env: {}}}", n % 20, ["prod", "dev", "prod", "staging"][n % 4]),
        };
        s += &format!("  - {{name: {}, netid: {}, labels: {labels}}}\n", ns_name(n), 100 + n);
    }
    let app_of = |i: usize, ns: usize| match ns {
        0 => "prometheus",
        1 => "dns",
        _ => ["frontend", "backend", "backend", "db", "cache", "worker", "frontend", "worker"][i % 8],
    };
    let ports_of = |app: &str| match app {
        "frontend" => "[{name: http, containerPort: 8080, protocol: TCP}, {name: metrics, containerPort: 9090, protocol: TCP}]",
        "backend" => "[{name: http, containerPort: 8080, protocol: TCP}, {name: grpc, containerPort: 50051, protocol: TCP}, {name: metrics, containerPort: 9090, protocol: TCP}]",
        "db" => "[{name: postgres, containerPort: 5432, protocol: TCP}, {name: metrics, containerPort: 9187, protocol: TCP}]",
        "cache" => "[{name: redis, containerPort: 6379, protocol: TCP}, {name: metrics, containerPort: 9121, protocol: TCP}]",
        "dns" => "[{name: dns, containerPort: 53, protocol: UDP}, {name: dns-tcp, containerPort: 53, protocol: TCP}, {name: metrics, containerPort: 9153, protocol: TCP}]",
        _ => "[{name: metrics, containerPort: 9090, protocol: TCP}]",
    };
    s += "pods:\n";
    for i in 0..local {
        let ns = i % namespaces;
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 2)) + i as u32);
        let o = ip.octets();
        let app = app_of(i / namespaces, ns);
        s += &format!(
            "  - {{namespace: {}, name: l{i}, containerID: \"{:064x}\", hostVeth: v{i}, internal: true, ip: {ip}, mac: \"0a:58:{:02x}:{:02x}:{:02x}:{:02x}\", labels: {{app: {app}, pod-template-hash: h{}}}, containerPorts: {}}}\n",
            ns_name(ns), i + 1, o[0], o[1], o[2], o[3], i % 3, ports_of(app)
        );
    }
    s += "remotePods:\n";
    for i in 0..remote {
        let ns = (i * 7 + 3) % namespaces;
        let node = i / pods_per_node;
        let base = u32::from(Ipv4Addr::new(10, 128 + ((node + 2) / 128) as u8, (((node + 2) % 128) * 2) as u8, 2));
        let ip = Ipv4Addr::from(base + (i % pods_per_node) as u32);
        let app = app_of(i / namespaces, ns);
        // Remote pods' ports matter only to egress (named ports resolve on the destination).
        let ports = if egress { format!(", containerPorts: {}", ports_of(app)) } else { String::new() };
        s += &format!("  - {{namespace: {}, name: r{i}, ip: {ip}, labels: {{app: {app}}}{ports}}}\n", ns_name(ns));
    }
    s += "networkPolicies:\n";
    for n in 0..namespaces {
        let ns = ns_name(n);
        let both = if egress { "[Ingress, Egress]" } else { "[Ingress]" };
        let same_ns_egress = if egress { ", egress: [{to: [{podSelector: {}}]}]" } else { "" };
        let mut specs = vec![
            ("default-deny", format!("{{podSelector: {{}}, policyTypes: {both}}}")),
            ("same-namespace", format!("{{podSelector: {{}}, policyTypes: {both}, ingress: [{{from: [{{podSelector: {{}}}}]}}]{same_ns_egress}}}")),
            ("from-prod", "{podSelector: {matchLabels: {app: frontend}}, ingress: [{from: [{namespaceSelector: {matchLabels: {env: prod}}}], ports: [{port: 8080}]}]}".to_string()),
            ("frontend-to-backend", "{podSelector: {matchLabels: {app: backend}}, ingress: [{from: [{podSelector: {matchLabels: {app: frontend}}}], ports: [{protocol: TCP, port: 8080}]}]}".to_string()),
            ("backend-to-db", "{podSelector: {matchLabels: {app: db}}, ingress: [{from: [{podSelector: {matchLabels: {app: backend}}}], ports: [{port: postgres}]}]}".to_string()),
            ("monitoring", "{podSelector: {}, ingress: [{from: [{namespaceSelector: {matchLabels: {team: monitoring}}, podSelector: {matchLabels: {app: prometheus}}}], ports: [{port: metrics}, {port: 9090}]}]}".to_string()),
            ("from-outside", "{podSelector: {matchLabels: {app: frontend}}, ingress: [{from: [{ipBlock: {cidr: 0.0.0.0/0, except: [10.128.0.0/14, 172.30.0.0/16]}}, {ipBlock: {cidr: 10.0.0.0/8, except: [10.128.0.0/14]}}], ports: [{port: 8443}, {port: 8080}]}]}".to_string()),
            ("node-ports", format!("{{podSelector: {{matchLabels: {{app: worker}}}}, ingress: [{{from: [{{namespaceSelector: {{matchLabels: {{team: t{}}}}}}}], ports: [{{port: 30000, endPort: 32767}}, {{protocol: UDP, port: 30000, endPort: 30100}}]}}]}}", n % 20)),
            ("cache", "{podSelector: {matchLabels: {app: cache}}, ingress: [{from: [{podSelector: {matchExpressions: [{key: app, operator: In, values: [backend, worker]}]}}], ports: [{port: redis}]}]}".to_string()),
            ("cross-team", format!("{{podSelector: {{matchLabels: {{app: backend}}}}, ingress: [{{from: [{{namespaceSelector: {{matchLabels: {{team: t{}}}}}, podSelector: {{matchLabels: {{app: backend}}}}}}], ports: [{{port: 8080}}, {{port: grpc}}]}}]}}", (n + 1) % 20)),
        ];
        if egress {
            specs[8] = ("allow-dns", "{podSelector: {}, policyTypes: [Egress], egress: [{to: [{namespaceSelector: {matchLabels: {name: dns}}, podSelector: {matchLabels: {app: dns}}}], ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: dns-tcp}]}]}".to_string());
            specs[9] = ("frontend-egress", "{podSelector: {matchLabels: {app: frontend}}, policyTypes: [Egress], egress: [{to: [{podSelector: {matchLabels: {app: backend}}}], ports: [{port: http}]}, {to: [{ipBlock: {cidr: 0.0.0.0/0, except: [10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16]}}], ports: [{port: 443}]}]}".to_string());
        }
        for (name, spec) in specs {
            s += &format!("  - {{apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {{name: {name}, namespace: {ns}}}, spec: {spec}}}\n");
        }
    }
    s
}

#[test]
fn no_equal_priority_flows_overlap_in_any_plugin() {
    let mut states: Vec<(String, String)> = vec![
        ("cluster.yaml (multitenant)".into(), include_str!("../deploy/examples/cluster.yaml").into()),
        ("subnet.yaml".into(), include_str!("../deploy/examples/subnet.yaml").into()),
        ("networkpolicy.yaml".into(), include_str!("../deploy/examples/networkpolicy.yaml").into()),
    ];
    for seed in 0..12 {
        states.push((format!("generated seed {seed}"), generated(seed, 6, 60, 20, seed % 4 != 0)));
    }
    states.push(("realistic".into(), realistic(8, 40, 400, false)));
    states.push(("realistic with egress".into(), realistic(8, 40, 400, true)));
    let (mut total, mut conjunctions, mut egress_conjunctions) = (0, 0, 0);
    let mut audited = 0;
    for (i, (name, text)) in states.iter().enumerate() {
        let (mut state, problems) = parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(problems.is_empty(), "{name}: {problems:?}");
        // The audit log on for most states (every policy logged in some).
        state.audit = sdn_node::cluster::netpol::NodeAudit { enabled: i % 4 != 3, all: i % 5 == 0 };
        let flows = all_flows(&state);
        total += flows.len();
        let conj_ids = |t: Option<u8>| flows.iter().filter(|c| t.is_none_or(|t| c.key.table == t) && c.key.decode_match().unwrap().conj_id.is_some()).count();
        conjunctions += conj_ids(None);
        egress_conjunctions += conj_ids(Some(27));
        audited += flows.iter().filter(|c| c.to_string().contains("controller(")).count();
        let t = ties(&flows);
        assert!(t.is_empty(), "{name}: {} overlapping equal-priority pairs:\n{}", t.len(), t.join("\n"));
    }
    // The checker itself finds a tie (openshift-sdn VERSION 3's table 80).
    let v3 = [
        "table=80, priority=50, ip, actions=ct(commit,table=81)",
        "table=80, priority=50, reg1=11, actions=output:NXM_NX_REG2[]",
    ];
    let a = Match::any().ipv4(Default::default());
    let b = Match::any().reg(1, 11);
    assert!(!disjoint(&a, &b), "{v3:?} overlap");
    use sdn_node::pipeline::{Flow, Table};
    let out = || vec![openflow::Action::output_reg(3)];
    let tie = [
        Compiled::compile(&Flow::new(Table::Policy, 50, a.clone(), out(), None)),
        Compiled::compile(&Flow::drop(Table::Policy, 50, b.clone())),
    ];
    assert_eq!(ties(&tie).len(), 1, "different actions at a tie are found");
    let same = [
        Compiled::compile(&Flow::new(Table::Policy, 50, a, out(), None)),
        Compiled::compile(&Flow::new(Table::Policy, 50, b, out(), None)),
    ];
    assert!(ties(&same).is_empty(), "identical actions at a tie are not a conflict");
    // Conjunctions: a conjunction whose conj_id flow drops, and a plain output overlapping it at
    // its priority (which would hide it whenever it matches): a tie. Disjoint from it (another
    // source): none. A clause flow without its conj_id flow, or at another priority: reported.
    let conj = |id: u32, k: u8, n: u8| vec![openflow::Action::conjunction(id, k, n).unwrap()];
    let src = |a: &str| Match::any().ipv4(openflow::Ipv4Match { src: Some(Masked::exact(a.parse().unwrap())), ..Default::default() });
    let dst = |a: &str| Match::any().ipv4(openflow::Ipv4Match { dst: Some(Masked::exact(a.parse().unwrap())), ..Default::default() });
    let conjunction = |prio: u16| {
        vec![
            Compiled::compile(&Flow::new(Table::Policy, prio, src("10.0.0.1"), conj(7, 1, 2), None)),
            Compiled::compile(&Flow::new(Table::Policy, prio, dst("10.0.0.2"), conj(7, 2, 2), None)),
            Compiled::compile(&Flow::drop(Table::Policy, 60, Match::any().conj_id(7))),
        ]
    };
    let mut hidden = conjunction(60);
    hidden.push(Compiled::compile(&Flow::new(Table::Policy, 60, src("10.0.0.1"), out(), None)));
    assert_eq!(ties(&hidden).len(), 1, "{:?}", ties(&hidden));
    let mut apart = conjunction(60);
    apart.push(Compiled::compile(&Flow::new(Table::Policy, 60, src("10.0.0.3"), out(), None)));
    assert!(ties(&apart).is_empty(), "{:?}", ties(&apart));
    let misplaced = conjunction(61);
    assert_eq!(ties(&misplaced).len(), 3, "{:?}", ties(&misplaced));
    assert_eq!(ties(&conjunction(60)[..2]).len(), 1, "no conj_id flow");
    assert!(conjunctions > 0, "the states have conjunctions");
    assert!(egress_conjunctions > 0, "the states have egress conjunctions (table 27)");
    assert!(audited > 0, "the states have audit log flows");
    eprintln!("no ties: {} states, {total} flows, {conjunctions} conjunctions ({egress_conjunctions} egress), {audited} logged", states.len());
}

/// `ovs-ofctl ofp-parse` of the message bytes.
fn ofp_parse(dir: &std::path::Path, name: &str, bytes: &[u8]) -> Option<String> {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let out = match Command::new("ovs-ofctl").arg("ofp-parse").arg(&path).output() {
        Ok(o) => o,
        Err(e) => {
            assert!(std::env::var_os("CI").is_none_or(|v| v.is_empty()), "ovs-ofctl is needed and CI is set: {e}");
            eprintln!("SKIPPED: no ovs-ofctl ({e})");
            return None;
        }
    };
    assert!(out.status.success(), "ofp-parse {name}: {}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn every_networkpolicy_flow_shape_decodes_in_ovs_as_displayed() {
    let (mut state, _) = parse(include_str!("../deploy/examples/networkpolicy.yaml")).unwrap();
    // With the audit log on (the example's egress policy asks for it).
    state.audit = sdn_node::cluster::netpol::NodeAudit { enabled: true, all: false };
    let flows = all_flows(&state);
    assert!(flows.iter().any(|c| c.to_string().contains("controller(")), "the example has audit log flows");
    let dir = tempfile::tempdir().unwrap();
    // One flow per shape: the table, priority class and the set of fields and actions.
    let mut shapes: BTreeMap<String, Compiled> = BTreeMap::new();
    for c in flows.iter().filter(|c| [21, 25, 27, 28, 60, 80].contains(&c.key.table)) {
        let text = c.to_string();
        let shape: String = text.chars().map(|ch| if ch.is_ascii_digit() { '9' } else { ch }).collect();
        shapes.entry(shape).or_insert_with(|| c.clone());
    }
    assert!(shapes.len() >= 10, "{} shapes", shapes.len());
    let mut failures = Vec::new();
    for (i, c) in shapes.values().enumerate() {
        let fm = c.to_flow_mod(0).unwrap();
        let msg = openflow::OfMessage::new(0x10 + i as u32, openflow::Message::FlowMod(fm.clone()));
        let bytes = msg.to_bytes().unwrap();
        let Some(got) = ofp_parse(dir.path(), &format!("f{i}"), &bytes) else { return };
        // OVS prints "OFPT_FLOW_MOD (OF1.3) (xid=..): ADD table:80 priority=..,MATCH actions=..".
        let body = got.split_once("): ").map(|x| x.1).unwrap_or(&got).trim();
        let body = body.strip_prefix("ADD ").unwrap_or(body);
        let body = body.split_once(' ').filter(|(t, _)| t.starts_with("table:")).map(|x| x.1).unwrap_or(body);
        let shown = c.to_string();
        let ours = shown.split_once(", ").filter(|(t, _)| t.starts_with("table=")).map(|x| x.1).unwrap_or(&shown);
        if body != ours {
            failures.push(format!("ours: {ours}\novs:  {body}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!("ofp-parse: {} networkpolicy flow shapes", shapes.len());
}

/// CPU time of this thread.
fn thread_cpu() -> std::time::Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The scale tests' policy change: the first policy with ingress rules whose namespace has
/// flows gets another pod selector and its first rule another port (TCP 7000).
fn change_one_policy(state: &ClusterState, d: &sdn_node::store::DesiredState) -> (ClusterState, Owner) {
    let mut changed = state.clone();
    let i = changed
        .network_policies
        .iter()
        .position(|p| p.ingress.as_ref().is_some_and(|r| !r.is_empty()) && !d.flows_of(&Owner::NetworkPolicy { namespace: p.namespace.clone() }).is_empty())
        .unwrap();
    let p = &mut changed.network_policies[i];
    p.pod_selector = Default::default();
    if let Some(r) = p.ingress.as_mut().and_then(|r| r.first_mut()) {
        r.ports = Some(vec![sdn_node::cluster::netpol::PolicyPort {
            proto: sdn_node::cluster::netpol::Proto::Tcp,
            port: sdn_node::cluster::netpol::PortSpec::Range(7000, 7000),
        }]);
    }
    let owner = Owner::NetworkPolicy { namespace: p.namespace.clone() };
    (changed, owner)
}

/// 100 namespaces, 5,000 pods (1,250 local), 1,000 policies: one policy change recomputes its
/// namespace's owner only; prints the CPU and FLOW_MODs of that change. Run with --release for
/// the figures (ignored by default: about a minute in release, far longer in debug):
/// `cargo test --release --test netpol_flows scale -- --ignored --nocapture`.
#[test]
#[ignore = "scale figures: run with --release --ignored"]
fn scale_one_policy_change_recomputes_one_namespace() {
    let text = generated(7, 100, 5000, 1000, false);
    let t0 = thread_cpu();
    let (state, problems) = parse(&text).unwrap();
    let parse_cpu = thread_cpu() - t0;
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!((state.pods.len() + state.remote_pods.len(), state.network_policies.len()), (5000, 1000));
    let ports = ofports(&state);
    let dns = DnsAnswers::new();
    let t0 = thread_cpu();
    let (d, _, _) = desired_state_with_warnings(&state, &ports, &dns);
    let full_cpu = thread_cpu() - t0;
    let (netpol_flows, shared) = netpol_counts(&d);

    // Change one policy: another pod selector and port.
    let (changed, owner) = change_one_policy(&state, &d);
    let Owner::NetworkPolicy { namespace: ns } = &owner else { unreachable!() };
    let before: BTreeSet<String> = d.flows_of(&owner).iter().map(|c| c.to_string()).collect();
    let t0 = thread_cpu();
    let (flows, _, _) = owner_flows(&changed, &ports, &dns, &owner);
    let compiled: Vec<Compiled> = flows.iter().map(Compiled::compile).collect();
    let change_cpu = thread_cpu() - t0;
    let after: BTreeSet<String> = compiled.iter().map(|c| c.to_string()).collect();
    // The FLOW_MODs of the change, as the engine plans them (shared clause flows included).
    let mut installed = InstalledState::default();
    installed.apply(&diff(&d, &installed, 1));
    let mut staged = d.clone();
    let old = staged.flows_of(&owner).to_vec();
    let t0 = thread_cpu();
    staged.set_compiled(owner.clone(), compiled.clone()).unwrap();
    let plan = diff_owners(&staged, &installed, [(&owner, &old[..])], 1);
    let plan_cpu = thread_cpu() - t0;
    // Every other owner is untouched: the full computation of the changed state agrees.
    let (d2, _, _) = desired_state_with_warnings(&changed, &ports, &dns);
    for o in d2.owners().filter(|o| **o != owner) {
        assert_eq!(d2.flows_of(o), d.flows_of(o), "{o} changed");
    }
    assert_eq!(d2.flows_of(&owner).len(), compiled.len());
    installed.apply(&plan);
    assert!(diff(&d2, &installed, 1).is_empty(), "the owner's plan brings the switch to the full computation");
    eprintln!(
        "netpol scale: 5000 pods (1250 local), 1000 policies, 100 namespaces: {} desired flows ({netpol_flows} NetworkPolicy, \
         {shared} of them shared clause flows); parse {parse_cpu:?}, full desired state {full_cpu:?} CPU; one policy change in {ns}: \
         owner recomputed in {change_cpu:?} CPU, set and diffed in {plan_cpu:?}, {} -> {} flows of its own, {} FLOW_MODs ({plan})",
        d.len(),
        before.len(),
        after.len(),
        plan.len()
    );
}

/// The `scale` state on a real ovs-vswitchd (dummy datapath): the full desired state installed
/// as the engine installs it (one resync), the switch's and this process's memory once it holds
/// it, then one policy change committed and acknowledged.
/// `cargo test --release --test netpol_flows scale_on_a_real_switch -- --ignored --nocapture`.
#[test]
#[ignore = "scale figures: run with --release --ignored"]
fn scale_on_a_real_switch() {
    on_a_real_switch("scale (100 namespaces, 5,000 pods, 1,000 policies)", &generated(7, 100, 5000, 1000, false));
}

/// The realistic state: 200 namespaces, 400 local pods, 10,000 remote pods, 2,000
/// policies (see [`realistic`]), ingress only as the issue measured it, on a real switch.
/// `cargo test --release --test netpol_flows realistic_on_a_real_switch -- --ignored --nocapture`.
#[test]
#[ignore = "scale figures: run with --release --ignored"]
fn realistic_on_a_real_switch() {
    on_a_real_switch("realistic (200 namespaces, 400 local + 10,000 remote pods, 2,000 policies)", &realistic(200, 400, 10_000, false));
}

/// The realistic state with egress: default-deny and same-namespace both ways, DNS and
/// frontend egress policies.
/// `cargo test --release --test netpol_flows realistic_egress_on_a_real_switch -- --ignored --nocapture`.
#[test]
#[ignore = "scale figures: run with --release --ignored"]
fn realistic_egress_on_a_real_switch() {
    on_a_real_switch("realistic with egress (200 namespaces, 400 local + 10,000 remote pods, 2,000 policies)", &realistic(200, 400, 10_000, true));
}

/// A state on a real ovs-vswitchd: its desired flows (and the CPU to compute them), the time
/// to install them all (one engine resync), both processes' memory, one policy change acked.
fn on_a_real_switch(label: &str, text: &str) {
    use sdn_node::engine::Engine;
    use sdn_harness::sandbox::{OvsSandbox, SandboxOptions};
    use sdn_node::switch::{Switch, SwitchOptions};
    use std::time::Instant;
    fn cpu_ticks(pid: &str) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let f: Vec<&str> = s.rsplit_once(')').map(|x| x.1).unwrap_or("").split_whitespace().collect();
        f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0) + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
    }
    fn rss_kib(pid: &str) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0)
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let t0 = thread_cpu();
        let (state, problems) = parse(text).unwrap();
        let parse_cpu = thread_cpu() - t0;
        assert!(problems.is_empty(), "{problems:?}");
        let ports = ofports(&state);
        let dns = DnsAnswers::new();
        // The agent's memory for the flows: from before the desired state is computed to after
        // the engine holds it and its mirror of the switch (the test keeps no copy).
        let me0 = rss_kib("self");
        let t0 = thread_cpu();
        let (d, _, _) = desired_state_with_warnings(&state, &ports, &dns);
        let compute_cpu = thread_cpu() - t0;
        let flows = d.len();
        let (netpol, shared) = netpol_counts(&d);
        let in_table = |t: u8| d.iter().filter(|(_, c)| c.key.table == t).count();
        let (in80, in27) = (in_table(80), in_table(27));
        let conj = d.iter().filter(|(_, c)| c.key.decode_match().is_ok_and(|m| m.conj_id.is_some())).count();
        let (changed, owner) = change_one_policy(&state, &d);
        let sb = OvsSandbox::start(SandboxOptions::default()).await.expect("a private switch (Open vSwitch installed?)");
        sb.add_bridge("br0", "dummy").await.unwrap();
        let sw = Switch::connect(&format!("unix:{}", sb.mgmt_socket("br0").display()), SwitchOptions::default()).await.unwrap();
        let engine = Engine::start(sw, 1);
        let vswitchd = sb.vswitchd_pid().unwrap().to_string();
        let vs0 = rss_kib(&vswitchd);
        let t = Instant::now();
        engine.resync(Some(d)).await.unwrap();
        let install = t.elapsed();
        let (vs1, me1) = (rss_kib(&vswitchd), rss_kib("self"));
        // One policy change, as the scale test makes it, committed and acknowledged.
        let t = Instant::now();
        let c0 = thread_cpu();
        let (new, _, _) = owner_flows(&changed, &ports, &dns, &owner);
        let change_cpu = thread_cpu() - c0;
        let out = engine.update(vec![(owner.clone(), new)]).await.unwrap();
        let change = t.elapsed();
        // The engine's mirror holds the new state (the engine only records what was acked).
        let (desired, installed, _) = engine.snapshot().await.unwrap();
        // The resync replayed the empty switch at the engine's next generation: cookies carry it.
        let generation = engine.status().await.unwrap().generation;
        let left = diff(&desired, &installed, generation);
        assert!(left.changes.is_empty(), "installed flows after the change: {} left ({:?})", left.changes.len(), left.changes.first());
        // What the counters read: the NetworkPolicy owners' own flows in tables 80 and 27
        // (shared clause flows count nothing and carry another cookie kind).
        let policy_after = desired.iter().filter(|(o, c)| matches!(o, Owner::NetworkPolicy { .. }) && [80, 27].contains(&c.key.table)).count();
        // One read of the per-policy counters (src/policy_stats): tables 80 and 27 dumped by
        // the NetworkPolicy cookie kind, as the task asks every --policy-stats-interval.
        let sw = Switch::connect(&format!("unix:{}", sb.mgmt_socket("br0").display()), SwitchOptions::default()).await.unwrap();
        let kind = u64::from(Owner::NetworkPolicy { namespace: String::new() }.kind()) << 56;
        let (vcpu0, t) = (cpu_ticks(&vswitchd), Instant::now());
        let mut dumped = 0;
        for table in [80u8, 27] {
            let req = openflow::FlowStatsRequest { table_id: table, cookie: kind, cookie_mask: 0xff << 56, ..Default::default() };
            dumped += sw.dump_flows(req).await.unwrap().len();
        }
        let (read, read_vcpu) = (t.elapsed(), (cpu_ticks(&vswitchd) - vcpu0) * 10);
        assert_eq!(dumped, policy_after, "the counters' dump holds the NetworkPolicy flows of tables 80 and 27");
        eprintln!(
            "netpol {label}: {flows} desired flows ({netpol} NetworkPolicy, {shared} of them shared clause flows: table 80 {}, table 27 {}, \
             {conj} conj_id); parse {parse_cpu:?}, \
             desired state {compute_cpu:?} CPU; installed in {install:?}; ovs-vswitchd RSS {} -> {} MiB ({:.2} KiB/flow), \
             the agent (this process) {} -> {} MiB ({:.2} KiB/flow: desired state and installed mirror); one policy change in {owner}: \
             owner recomputed in {change_cpu:?} CPU, committed and acked in {change:?} ({out:?}); one counters read: {dumped} flows in {read:?}, \
             ovs-vswitchd CPU {read_vcpu} ms",
            in80, in27,
            vs0 >> 10, vs1 >> 10, (vs1.saturating_sub(vs0)) as f64 / flows as f64,
            me0 >> 10, me1 >> 10, (me1.saturating_sub(me0)) as f64 / flows as f64,
        );
    });
}
