//! One Service change at cluster scale (10,000 Services, 5,000 HostSubnets, 1,000 NetNamespaces,
//! multitenant), in process (no API server, no switch): the agent's CPU from the watch event to
//! the FLOW_MOD plan, and the plan's size.
//!
//! - `old`: the former path, rebuilt here from public pieces: every object mapped to the state
//!   file's JSON schema (`json!`), decoded and validated by `state_file::from_value`, the full
//!   desired state computed, and the whole table diffed.
//! - `new`: the production path: the changed object converted once (`kube::mapping::service`),
//!   the state assembled from the converted objects and validated (`Objects::publish`, which
//!   also says which owners are touched), `owner_flows` for those owners, and only their flows
//!   diffed (`store::diff_owners`).
//!
//! Each iteration toggles one Service's port (a real change each time) and applies the plan to
//! the mirror of the switch, so both paths see the same sequence.
//!
//! `cargo bench --bench kube_scale -- --quick` (or `--sample-size 10`).

use std::collections::HashMap;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sdn_node::cluster::desired::{desired_state_with_warnings, owner_flows};
use sdn_node::cluster::{state_file, PodKey};
use sdn_node::kube::mapping::{self, Object, Objects, Update};
use sdn_node::kube::types::{ClusterNetwork, ClusterNetworkEntry, HostSubnet, NetNamespace};
use sdn_node::kube::watch::Kind;
use sdn_node::domain::OfPort;
use sdn_node::pipeline::egress::DnsAnswers;
use sdn_node::store::{self, DesiredState, InstalledState, Plan};
use serde_json::{json, Value};

const SERVICES: usize = 10_000;
const HOST_SUBNETS: usize = 5_000;
const NAMESPACES: usize = 1_000;
const NODE: &str = "node-0";
const GENERATION: u32 = 1;

fn meta(ns: Option<&str>, name: &str) -> ObjectMeta {
    ObjectMeta { name: Some(name.into()), namespace: ns.map(Into::into), ..Default::default() }
}

struct Cluster {
    cn: ClusterNetwork,
    host_subnets: Vec<HostSubnet>,
    net_namespaces: Vec<NetNamespace>,
    services: Vec<Service>,
}

fn service(i: usize, port: i32) -> Service {
    let ns = format!("ns-{}", i % NAMESPACES);
    let ip = format!("172.30.{}.{}", 1 + i / 250, 1 + i % 250);
    serde_json::from_value(json!({"metadata": {"namespace": ns, "name": format!("svc-{i}")},
        "spec": {"clusterIP": ip, "ports": [{"protocol": "TCP", "port": port}, {"protocol": "UDP", "port": 53}]}}))
    .unwrap()
}

fn cluster() -> Cluster {
    let cn = ClusterNetwork {
        metadata: meta(None, "default"),
        network: None,
        host_subnet_length: None,
        service_network: Some("172.30.0.0/16".into()),
        plugin_name: Some("redhat/openshift-ovs-multitenant".into()),
        cluster_networks: vec![ClusterNetworkEntry { cidr: "10.0.0.0/8".into(), host_subnet_length: None }],
        vxlan_port: None,
        mtu: None,
    };
    let host_subnets = (0..HOST_SUBNETS)
        .map(|i| {
            let host = format!("node-{i}");
            let n = (i as u32) << 9; // a /23 each
            HostSubnet {
                metadata: meta(None, &host),
                host,
                host_ip: format!("172.16.{}.{}", i / 250, 1 + i % 250),
                subnet: format!("10.{}.{}.0/23", n >> 16, (n >> 8) & 0xff),
            }
        })
        .collect();
    let net_namespaces = (0..NAMESPACES)
        .map(|i| NetNamespace { metadata: meta(None, &format!("ns-{i}")), netname: format!("ns-{i}"), netid: (100 + i as u64).into() })
        .collect();
    let services = (0..SERVICES).map(|i| service(i, 80)).collect();
    Cluster { cn, host_subnets, net_namespaces, services }
}

/// The former `kube::mapping::to_value`: every object to the state file's JSON schema.
fn to_value(c: &Cluster) -> Value {
    let cn = &c.cn;
    let mut host_subnets: Vec<Value> =
        c.host_subnets.iter().map(|h| json!({"host": h.host, "hostIP": h.host_ip, "subnet": h.subnet})).collect();
    host_subnets.sort_by_key(|v| v["host"].as_str().unwrap_or_default().to_string());
    let mut net_namespaces: Vec<Value> =
        c.net_namespaces.iter().map(|n| json!({"name": n.netname, "netid": n.netid.0.clone().unwrap(), "multicast": false})).collect();
    net_namespaces.sort_by_key(|v| v["name"].as_str().unwrap_or_default().to_string());
    let mut services: Vec<(String, String, Value)> = c
        .services
        .iter()
        .filter_map(|svc| {
            let spec = svc.spec.as_ref()?;
            let ip = spec.cluster_ip.as_deref().unwrap_or("");
            let ports: Vec<Value> = spec
                .ports
                .iter()
                .flatten()
                .map(|p| json!({"protocol": p.protocol.as_deref().unwrap_or("TCP"), "port": p.port}))
                .collect();
            let (ns, name) = (svc.metadata.namespace.clone().unwrap_or_default(), svc.metadata.name.clone().unwrap_or_default());
            Some((ns.clone(), name.clone(), json!({"namespace": ns, "name": name, "clusterIP": ip, "ports": ports})))
        })
        .collect();
    services.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    json!({
        "node": NODE,
        "plugin": "multitenant",
        "clusterNetwork": cn.cluster_networks[0].cidr,
        "serviceNetwork": cn.service_network,
        "hostSubnets": host_subnets,
        "netNamespaces": net_namespaces,
        "services": services.into_iter().map(|t| t.2).collect::<Vec<_>>(),
        "pods": [],
        "egressNetworkPolicies": [],
    })
}

/// The former path, for one change: everything rebuilt, the whole table diffed.
fn old_path(c: &Cluster, installed: &InstalledState, ofports: &HashMap<PodKey, OfPort>, dns: &DnsAnswers) -> (DesiredState, Plan) {
    let (state, _problems) = state_file::from_value(to_value(c)).unwrap();
    let (d, _, _) = desired_state_with_warnings(&state, ofports, dns);
    let plan = store::diff(&d, installed, GENERATION);
    (d, plan)
}

/// The production path, for one change: `update` applied to the converted objects, the state
/// assembled, and only the touched owners recomputed and diffed.
fn new_path(
    objects: &mut Objects,
    update: Update,
    last: &mut sdn_node::run::source::Loaded,
    desired: &mut DesiredState,
    installed: &InstalledState,
    ofports: &HashMap<PodKey, OfPort>,
    dns: &DnsAnswers,
) -> (Plan, usize) {
    objects.apply(update);
    let loaded = objects.publish(Some(last)).expect("a change").expect("a valid state");
    let touched = loaded.touched.clone().expect("a Service change touches named owners");
    let mut old = Vec::with_capacity(touched.len());
    for owner in &touched {
        let (flows, _problems, _warnings) = owner_flows(&loaded.state, ofports, dns, owner);
        old.push(desired.flows_of(owner).to_vec());
        desired.set(owner.clone(), flows).expect("no conflict");
    }
    let plan = store::diff_owners(desired, installed, touched.iter().zip(old.iter().map(Vec::as_slice)), GENERATION);
    *last = loaded;
    (plan, touched.len())
}

fn initial_objects(c: &Cluster) -> Objects {
    let mut o = Objects::new(NODE);
    for k in Kind::ALL {
        o.apply(Update::ListStart(k));
    }
    o.apply(Update::ListApply(mapping::id_of(&c.cn.metadata), Object::ClusterNetwork(mapping::cluster_network(&c.cn))));
    for h in &c.host_subnets {
        o.apply(Update::ListApply(mapping::id_of(&h.metadata), Object::HostSubnet(mapping::host_subnet(h))));
    }
    for n in &c.net_namespaces {
        o.apply(Update::ListApply(mapping::id_of(&n.metadata), Object::NetNamespace(mapping::net_namespace(n))));
    }
    for s in &c.services {
        o.apply(Update::ListApply(mapping::id_of(&s.metadata), Object::Service(mapping::service(s))));
    }
    for k in Kind::ALL {
        o.apply(Update::ListDone(k));
    }
    o
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

fn bench(cr: &mut Criterion) {
    let ofports = HashMap::new();
    let dns = DnsAnswers::new();
    let changed = 4242;

    // Old path state.
    let mut c = cluster();
    let (state, problems) = state_file::from_value(to_value(&c)).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    let (d0, _, _) = desired_state_with_warnings(&state, &ofports, &dns);
    let flows_total = d0.len();
    let mut old_installed = installed_from(&d0);

    // New path state.
    let mut objects = initial_objects(&c);
    let mut last = objects.publish(None).unwrap().unwrap();
    assert_eq!(last.state, state, "both paths build the same state");
    let mut new_desired = d0.clone();
    let mut new_installed = installed_from(&d0);

    // A summary run (process CPU per change, FLOW_MODs per change), then criterion.
    let toggle = |port: &mut i32| {
        *port = if *port == 80 { 81 } else { 80 };
        *port
    };
    let (mut old_port, mut new_port) = (80, 80);
    let runs = 20;
    let (mut old_cpu, mut new_cpu) = (Duration::ZERO, Duration::ZERO);
    let (mut old_mods, mut new_mods, mut touched) = (0, 0, 0);
    for _ in 0..runs {
        let t = cpu();
        c.services[changed] = service(changed, toggle(&mut old_port));
        let (d, plan) = old_path(&c, &old_installed, &ofports, &dns);
        old_installed.apply(&plan);
        old_cpu += cpu() - t;
        old_mods = plan.len();
        let t = cpu();
        let s = service(changed, toggle(&mut new_port));
        let update = Update::Apply(mapping::id_of(&s.metadata), Object::Service(mapping::service(&s)));
        let (plan, n) = new_path(&mut objects, update, &mut last, &mut new_desired, &new_installed, &ofports, &dns);
        new_installed.apply(&plan);
        new_cpu += cpu() - t;
        new_mods = plan.len();
        touched = n;
        // Same flows on both switches.
        assert_eq!(d.len(), new_desired.len());
        assert!(store::diff(&d, &new_installed, GENERATION).is_empty(), "the incremental path missed a change");
    }
    println!(
        "kube_scale: {SERVICES} services, {HOST_SUBNETS} host subnets, {NAMESPACES} namespaces, {flows_total} flows; one Service change:\n  \
         old (to_value -> from_value -> full desired -> full diff): {:.2} ms CPU, {old_mods} flow-mods\n  \
         new (convert one -> assemble+validate -> owner_flows({touched} touched) -> diff_owners): {:.2} ms CPU, {new_mods} flow-mods",
        old_cpu.as_secs_f64() * 1e3 / runs as f64,
        new_cpu.as_secs_f64() * 1e3 / runs as f64,
    );

    let mut g = cr.benchmark_group("kube_scale_one_service_change");
    g.sample_size(10);
    g.bench_function("old_full_rebuild", |b| {
        b.iter(|| {
            c.services[changed] = service(changed, toggle(&mut old_port));
            let (_, plan) = old_path(&c, &old_installed, &ofports, &dns);
            old_installed.apply(&plan);
            plan.len()
        })
    });
    g.bench_function("new_incremental", |b| {
        b.iter(|| {
            let s = service(changed, toggle(&mut new_port));
            let update = Update::Apply(mapping::id_of(&s.metadata), Object::Service(mapping::service(&s)));
            let (plan, _) = new_path(&mut objects, update, &mut last, &mut new_desired, &new_installed, &ofports, &dns);
            new_installed.apply(&plan);
            plan.len()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
