//! One NetworkPolicy change in Kubernetes mode at scale (1,000 NetworkPolicies, 5,000 pods in
//! view of which 1,250 on this node, 100 namespaces; networkpolicy plugin), in process (no API
//! server, no switch): the agent's CPU from the watch event to the FLOW_MOD plan, and the plan's
//! size.
//!
//! - `full`: what the reconciler did while `touched` was `None` for every NetworkPolicy change:
//!   the state assembled (`Objects::publish`), the effective state (source state plus this
//!   node's pods), the full desired state, and the whole table diffed.
//! - `touched`: the production path: the same publish, `owner_flows` for the touched owners
//!   only, and only their flows diffed (`store::diff_owners`).
//!
//! Each iteration toggles one policy's port (a real change each time) and applies the plan to
//! the mirror of the switch; both paths must end with the same flows.
//!
//! `cargo bench --bench kube_netpol -- --quick` (the summary line is printed first).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use sdn_node::cluster::desired::{desired_state_with_warnings, owner_flows};
use sdn_node::cluster::{validate, ClusterState, PodKey};
use sdn_node::kube::mapping::{self, Object, Objects, Update};
use sdn_node::kube::types::{ClusterNetwork, HostSubnet, NetNamespace};
use sdn_node::kube::watch::Kind;
use sdn_node::domain::OfPort;
use sdn_node::pipeline::egress::DnsAnswers;
use sdn_node::run::source::Loaded;
use sdn_node::store::{self, DesiredState, InstalledState, Plan};
use serde_json::json;

const NAMESPACES: usize = 100;
const PODS: usize = 5_000;
const POLICIES: usize = 1_000;
const NODE: &str = "node-a";
const GENERATION: u32 = 1;

fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

fn local(i: usize) -> bool {
    (i / NAMESPACES).is_multiple_of(4)
}

fn pod_ip(i: usize) -> Ipv4Addr {
    let base = if local(i) { Ipv4Addr::new(10, 128, 0, 10) } else { Ipv4Addr::new(10, 129, 0, 10) };
    Ipv4Addr::from(u32::from(base) + i as u32)
}

fn pod(i: usize) -> Pod {
    let node = if local(i) { NODE } else { "node-b" };
    obj(json!({"metadata": {"namespace": format!("ns-{}", i % NAMESPACES), "name": format!("p{i}"),
            "labels": {"app": format!("a{}", i % 5), "role": format!("r{}", i % 3)}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8000 + i % 3}]}]},
        "status": {"phase": "Running", "podIP": pod_ip(i).to_string()}}))
}

/// Policy `p`: every peer shape (own-namespace pods, namespace selectors, both, ipBlocks) and
/// port shape; its first rule's port is `port`.
fn policy(p: usize, port: u16) -> NetworkPolicy {
    let sel = |k: usize, key: &str, vals: usize| match k % 3 {
        0 => json!({}),
        1 => json!({"matchLabels": {key.to_string(): format!("{}{}", &key[..1], k % vals)}}),
        _ => json!({"matchExpressions": [{"key": key, "operator": "NotIn", "values": [format!("{}{}", &key[..1], k % vals)]}]}),
    };
    let from = match p % 5 {
        0 => json!([{"podSelector": sel(p / 5, "role", 3)}]),
        1 => json!([{"namespaceSelector": sel(p / 5, "team", 7)}]),
        2 => json!([{"namespaceSelector": sel(p / 5, "tier", 3), "podSelector": sel(p / 7, "app", 5)}]),
        3 => json!([{"ipBlock": {"cidr": "10.128.0.0/14", "except": ["10.129.0.0/17"]}}]),
        _ => json!([{"podSelector": sel(p / 5, "app", 5)}, {"ipBlock": {"cidr": format!("10.129.{}.0/24", p % 4)}}]),
    };
    obj(json!({"metadata": {"namespace": format!("ns-{}", (p * 37) % NAMESPACES), "name": format!("np{p}")},
        "spec": {"podSelector": sel(p / 11, "app", 5), "ingress": [
            {"from": from, "ports": [{"port": port}]},
            {"from": [{"podSelector": {"matchLabels": {"app": "a1"}}}], "ports": [{"port": "http"}]}]}}))
}

fn initial_objects() -> Objects {
    let mut o = Objects::new(NODE);
    for k in Kind::ALL {
        o.apply(Update::ListStart(k));
    }
    let mut add = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, object: Object| {
        o.apply(Update::ListApply(mapping::id_of(meta), object));
    };
    let cn: ClusterNetwork = obj(json!({"metadata": {"name": "default"}, "serviceNetwork": "172.30.0.0/16",
        "pluginName": "redhat/openshift-ovs-networkpolicy", "clusterNetworks": [{"CIDR": "10.128.0.0/14", "hostSubnetLength": 9}]}));
    add(&cn.metadata, Object::ClusterNetwork(mapping::cluster_network(&cn)));
    for (host, ip, subnet) in [(NODE, "172.17.0.2", "10.128.0.0/18"), ("node-b", "172.17.0.3", "10.129.0.0/16")] {
        let h: HostSubnet = obj(json!({"metadata": {"name": host}, "host": host, "hostIP": ip, "subnet": subnet}));
        add(&h.metadata, Object::HostSubnet(mapping::host_subnet(&h)));
    }
    for n in 0..NAMESPACES {
        let name = format!("ns-{n}");
        let nn: NetNamespace = obj(json!({"metadata": {"name": name}, "netname": name, "netid": 100 + n}));
        add(&nn.metadata, Object::NetNamespace(mapping::net_namespace(&nn)));
        let ns: Namespace = obj(json!({"metadata": {"name": name, "labels": {"team": format!("t{}", n % 7), "tier": format!("x{}", n % 3)}}}));
        add(&ns.metadata, Object::Namespace(mapping::namespace_labels(&ns)));
    }
    for i in 0..PODS {
        let p = pod(i);
        add(&p.metadata, Object::Pod(mapping::pod(&p)));
    }
    for p in 0..POLICIES {
        let np = policy(p, 7000);
        add(&np.metadata, Object::NetworkPolicy(mapping::network_policy(&np)));
    }
    for k in Kind::ALL {
        o.apply(Update::ListDone(k));
    }
    o
}

/// The effective state: the source's plus this node's pods (set up through the pod API in
/// production), and their ofports.
fn effective(l: &Loaded) -> (ClusterState, HashMap<PodKey, OfPort>) {
    let mut st = l.state.clone();
    let mut ofports = HashMap::new();
    for i in (0..PODS).filter(|i| local(*i)) {
        let o = pod_ip(i).octets();
        let raw = validate::RawPod {
            ips: Vec::new(),
            namespace: format!("ns-{}", i % NAMESPACES),
            name: format!("p{i}"),
            container_id: format!("{:064x}", i + 1),
            host_veth: format!("v{i}"),
            ip: pod_ip(i).to_string(),
            mac: format!("0a:58:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3]),
            ingress_bps: 0,
            egress_bps: 0,
            internal: true,
        };
        let p = validate::pod(raw).expect("a valid pod");
        ofports.insert(p.key(), OfPort(3 + i as u32));
        st.pods.push(p);
    }
    (st, ofports)
}

/// One policy change, recomputing every owner (the former `touched: None`).
fn full_path(objects: &mut Objects, update: Update, last: &mut Loaded, installed: &InstalledState, dns: &DnsAnswers) -> (DesiredState, Plan) {
    objects.apply(update);
    let loaded = objects.publish(Some(last)).expect("a change").expect("a valid state");
    let (st, ofports) = effective(&loaded);
    let (d, _, _) = desired_state_with_warnings(&st, &ofports, dns);
    let plan = store::diff(&d, installed, GENERATION);
    *last = loaded;
    (d, plan)
}

/// One policy change, recomputing the touched owners only.
fn touched_path(
    objects: &mut Objects,
    update: Update,
    last: &mut Loaded,
    desired: &mut DesiredState,
    installed: &InstalledState,
    dns: &DnsAnswers,
) -> (Plan, usize) {
    objects.apply(update);
    let loaded = objects.publish(Some(last)).expect("a change").expect("a valid state");
    let touched = loaded.touched.clone().expect("a policy change touches named owners");
    let (st, ofports) = effective(&loaded);
    let mut old = Vec::with_capacity(touched.len());
    for owner in &touched {
        let (flows, _, _) = owner_flows(&st, &ofports, dns, owner);
        old.push(desired.flows_of(owner).to_vec());
        desired.set(owner.clone(), flows).expect("no conflict");
    }
    let plan = store::diff_owners(desired, installed, touched.iter().zip(old.iter().map(Vec::as_slice)), GENERATION);
    *last = loaded;
    (plan, touched.len())
}

fn installed_from(d: &DesiredState) -> InstalledState {
    let mut i = InstalledState::default();
    i.apply(&store::replay(d, GENERATION));
    i
}

/// Process CPU time.
fn cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn change(p: usize, port: &mut u16) -> Update {
    *port = if *port == 7000 { 7001 } else { 7000 };
    let np = policy(p, *port);
    Update::Apply(mapping::id_of(&np.metadata), Object::NetworkPolicy(mapping::network_policy(&np)))
}

fn bench(cr: &mut Criterion) {
    let dns = DnsAnswers::new();
    let (mut full_objects, mut touched_objects) = (initial_objects(), initial_objects());
    let mut full_last = full_objects.publish(None).unwrap().unwrap();
    let mut touched_last = touched_objects.publish(None).unwrap().unwrap();
    assert!(full_last.problems.is_empty(), "{:?}", full_last.problems);
    let (st, ofports) = effective(&full_last);
    let (d0, _, _) = desired_state_with_warnings(&st, &ofports, &dns);
    let flows_total = d0.len();
    let mut full_installed = installed_from(&d0);
    let mut touched_desired = d0.clone();
    let mut touched_installed = installed_from(&d0);

    // A policy whose change reaches the switch (it selects local pods and its first rule allows
    // some source), found on a scratch copy through the touched path.
    let changed = {
        let mut o = initial_objects();
        let mut l = o.publish(None).unwrap().unwrap();
        let (mut d, i) = (d0.clone(), installed_from(&d0));
        (0..POLICIES)
            .find(|p| !touched_path(&mut o, change(*p, &mut 7000), &mut l, &mut d, &i, &dns).0.is_empty())
            .expect("a policy that selects local pods")
    };

    let (mut full_port, mut touched_port) = (7000, 7000);
    let runs = 10;
    let (mut full_cpu, mut touched_cpu) = (Duration::ZERO, Duration::ZERO);
    let (mut full_mods, mut touched_mods, mut touched) = (0, 0, 0);
    for _ in 0..runs {
        let t = cpu();
        let (d, plan) = full_path(&mut full_objects, change(changed, &mut full_port), &mut full_last, &full_installed, &dns);
        full_installed.apply(&plan);
        full_cpu += cpu() - t;
        full_mods = plan.len();
        let t = cpu();
        let u = change(changed, &mut touched_port);
        let (plan, n) = touched_path(&mut touched_objects, u, &mut touched_last, &mut touched_desired, &touched_installed, &dns);
        touched_installed.apply(&plan);
        touched_cpu += cpu() - t;
        touched_mods = plan.len();
        touched = n;
        // Same flows on both switches.
        assert_eq!(d.len(), touched_desired.len());
        assert!(store::diff(&d, &touched_installed, GENERATION).is_empty(), "the touched path missed a change");
    }
    println!(
        "kube_netpol: {POLICIES} NetworkPolicies, {PODS} pods in view, {NAMESPACES} namespaces, {flows_total} flows; one NetworkPolicy change (np{changed}):\n  \
         full (publish -> full desired -> full diff): {:.2} ms CPU, {full_mods} flow-mods\n  \
         touched (publish -> owner_flows({touched} touched) -> diff_owners): {:.2} ms CPU, {touched_mods} flow-mods",
        full_cpu.as_secs_f64() * 1e3 / runs as f64,
        touched_cpu.as_secs_f64() * 1e3 / runs as f64,
    );

    let mut g = cr.benchmark_group("kube_netpol_one_policy_change");
    g.sample_size(10);
    g.bench_function("full_recompute", |b| {
        b.iter(|| {
            let (_, plan) = full_path(&mut full_objects, change(changed, &mut full_port), &mut full_last, &full_installed, &dns);
            full_installed.apply(&plan);
            plan.len()
        })
    });
    g.bench_function("touched_owners", |b| {
        b.iter(|| {
            let u = change(changed, &mut touched_port);
            let (plan, _) = touched_path(&mut touched_objects, u, &mut touched_last, &mut touched_desired, &touched_installed, &dns);
            touched_installed.apply(&plan);
            plan.len()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
