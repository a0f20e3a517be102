//! The watchers: one kube-rs `watcher` + `reflector` store per watched kind, a readiness flag
//! per kind (set by its `InitDone`), and a publisher that rebuilds the state from the stores
//! (debounced) once every kind has listed.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::{watch, Notify};
use tracing::{error, info, warn};

use super::mapping::{self, Snapshot};
use super::types::{ClusterNetwork, EgressNetworkPolicy, HostSubnet, NetNamespace};
use super::KubeOptions;
use crate::metrics::{TargetLabel, Telemetry};
use crate::run::source::Loaded;

/// The label openshift-sdn sets on a node that cannot list EgressNetworkPolicies.
pub const EGRESS_FAILURE_LABEL: &str = "network.openshift.io/not-enforcing-egress-network-policy";

/// How long the publisher waits after a change for more changes (a relist is many events).
pub const DEBOUNCE: Duration = Duration::from_millis(50);

/// The kinds the daemon watches, in readiness-slot order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    ClusterNetwork,
    HostSubnet,
    NetNamespace,
    EgressNetworkPolicy,
    Service,
    Pod,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::ClusterNetwork,
        Kind::HostSubnet,
        Kind::NetNamespace,
        Kind::EgressNetworkPolicy,
        Kind::Service,
        Kind::Pod,
    ];

    /// (API group, plural resource): the [`super::WATCHED`] entry that allows watching it.
    pub fn resource(self) -> (&'static str, &'static str) {
        match self {
            Kind::ClusterNetwork => ("network.openshift.io", "clusternetworks"),
            Kind::HostSubnet => ("network.openshift.io", "hostsubnets"),
            Kind::NetNamespace => ("network.openshift.io", "netnamespaces"),
            Kind::EgressNetworkPolicy => ("network.openshift.io", "egressnetworkpolicies"),
            Kind::Service => ("", "services"),
            Kind::Pod => ("", "pods"),
        }
    }

    /// The verbs a watcher uses.
    pub const VERBS: [&'static str; 2] = ["list", "watch"];
}

#[derive(Default)]
struct Status {
    /// Per [`Kind::ALL`] slot: the kind's store is complete (it has seen `InitDone`).
    ready: [bool; 6],
    /// Listing EgressNetworkPolicies is forbidden: policies count as none (and as listed).
    egress_forbidden: bool,
}

struct Shared {
    status: Mutex<Status>,
    changed: Notify,
}

impl Shared {
    fn update(&self, f: impl FnOnce(&mut Status)) {
        f(&mut self.status.lock().unwrap_or_else(|e| e.into_inner()));
        self.changed.notify_one();
    }
}

struct Stores {
    cluster_networks: Store<ClusterNetwork>,
    host_subnets: Store<HostSubnet>,
    net_namespaces: Store<NetNamespace>,
    egress_policies: Store<EgressNetworkPolicy>,
    services: Store<Service>,
    pods: Store<Pod>,
}

async fn client(opts: &KubeOptions) -> Result<Client, String> {
    let config = match &opts.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| format!("{}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => kube::Config::incluster().map_err(|e| format!("in-cluster configuration: {e}"))?,
    };
    Client::try_from(config).map_err(|e| e.to_string())
}

/// See [`super::spawn`].
pub fn spawn(opts: KubeOptions, telemetry: Telemetry) -> watch::Receiver<Option<Arc<Loaded>>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let mut failures = 0u32;
        let client = loop {
            match client(&opts).await {
                Ok(c) => break c,
                Err(e) => {
                    error!(error = %e, "cannot configure the Kubernetes client; retrying");
                    failures = failures.saturating_add(1);
                    let delay = Duration::from_millis(500u64.saturating_mul(1 << failures.min(6)));
                    tokio::select! {
                        _ = tx.closed() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        };
        run(client, opts, telemetry, tx).await;
    });
    rx
}

async fn run(client: Client, opts: KubeOptions, telemetry: Telemetry, tx: watch::Sender<Option<Arc<Loaded>>>) {
    let shared = Arc::new(Shared { status: Mutex::new(Status::default()), changed: Notify::new() });
    let mut tasks = tokio::task::JoinSet::new();
    let start = |kind: Kind| (shared.clone(), telemetry.clone(), kind);

    let (cluster_networks, w) = reflector::store();
    let cfg = watcher::Config::default().fields("metadata.name=default");
    let (s, t, k) = start(Kind::ClusterNetwork);
    tasks.spawn(follow(Api::<ClusterNetwork>::all(client.clone()), cfg, w, k, s, t, None));

    let (host_subnets, w) = reflector::store();
    let (s, t, k) = start(Kind::HostSubnet);
    tasks.spawn(follow(Api::<HostSubnet>::all(client.clone()), watcher::Config::default(), w, k, s, t, None));

    let (net_namespaces, w) = reflector::store();
    let (s, t, k) = start(Kind::NetNamespace);
    tasks.spawn(follow(Api::<NetNamespace>::all(client.clone()), watcher::Config::default(), w, k, s, t, None));

    let (egress_policies, w) = reflector::store();
    let (s, t, k) = start(Kind::EgressNetworkPolicy);
    let label = EgressLabel { nodes: Api::<Node>::all(client.clone()), node: opts.node.clone(), set: None };
    tasks.spawn(follow(
        Api::<EgressNetworkPolicy>::all(client.clone()),
        watcher::Config::default(),
        w,
        k,
        s,
        t,
        Some(label),
    ));

    let (services, w) = reflector::store();
    let (s, t, k) = start(Kind::Service);
    tasks.spawn(follow(Api::<Service>::all(client.clone()), watcher::Config::default(), w, k, s, t, None));

    let (pods, w) = reflector::store();
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", opts.node));
    let (s, t, k) = start(Kind::Pod);
    tasks.spawn(follow(Api::<Pod>::all(client.clone()), cfg, w, k, s, t, None));

    let stores = Stores { cluster_networks, host_subnets, net_namespaces, egress_policies, services, pods };
    let mut last: Option<(serde_json::Value, std::collections::BTreeSet<crate::cluster::PodKey>)> = None;
    let mut last_error: Option<String> = None;
    loop {
        tokio::select! {
            // The consumer is gone: stop the watchers (dropping the JoinSet aborts them).
            _ = tx.closed() => return,
            _ = shared.changed.notified() => {}
        }
        tokio::time::sleep(DEBOUNCE).await;
        let (ready, forbidden) = {
            let st = shared.status.lock().unwrap_or_else(|e| e.into_inner());
            (st.ready, st.egress_forbidden)
        };
        if !ready.iter().enumerate().all(|(i, r)| *r || (forbidden && Kind::ALL[i] == Kind::EgressNetworkPolicy)) {
            continue;
        }
        let built = build(&stores, &opts.node, forbidden);
        let (value, live) = match built {
            Ok(v) => v,
            Err(e) => {
                if last_error.as_ref() != Some(&e) {
                    error!(error = %e, "the cluster state cannot be built; keeping the last good state");
                    last_error = Some(e);
                }
                continue;
            }
        };
        if last.as_ref().is_some_and(|(v, l)| *v == value && *l == live) {
            continue;
        }
        match mapping::load(value.clone(), live.clone()) {
            Ok(loaded) => {
                last_error = None;
                for p in &loaded.problems {
                    warn!(object = %p.object, field = %p.field, "rejected: {}", p.message);
                }
                info!(
                    host_subnets = loaded.state.host_subnets.len(),
                    net_namespaces = loaded.state.net_namespaces.len(),
                    services = loaded.state.services.len(),
                    egress_policies = loaded.state.egress_policies.len(),
                    live_pods = live.len(),
                    rejected = loaded.problems.len(),
                    "cluster state loaded"
                );
                last = Some((value, live));
                tx.send_replace(Some(Arc::new(loaded)));
            }
            Err(e) => {
                if last_error.as_ref() != Some(&e) {
                    error!(error = %e, "cluster state rejected; keeping the last good state");
                    last_error = Some(e);
                }
            }
        }
    }
}

fn build(
    stores: &Stores,
    node: &str,
    egress_forbidden: bool,
) -> Result<(serde_json::Value, std::collections::BTreeSet<crate::cluster::PodKey>), String> {
    let cns = stores.cluster_networks.state();
    let hs = stores.host_subnets.state();
    let nn = stores.net_namespaces.state();
    let svc = stores.services.state();
    let enp = if egress_forbidden { Vec::new() } else { stores.egress_policies.state() };
    let pods = stores.pods.state();
    fn refs_of<K>(v: &[Arc<K>]) -> Vec<&K> {
        v.iter().map(|a| &**a).collect()
    }
    let cn = cns.iter().find(|c| c.metadata.name.as_deref() == Some("default")).map(|a| &**a);
    mapping::to_value(&Snapshot {
        node,
        cluster_network: cn,
        host_subnets: &refs_of(&hs),
        net_namespaces: &refs_of(&nn),
        services: &refs_of(&svc),
        egress_policies: &refs_of(&enp),
        pods: &refs_of(&pods),
    })
}

/// The node label that says egress policies are not enforced, and whether it is set (`None`:
/// not known yet).
struct EgressLabel {
    nodes: Api<Node>,
    node: String,
    set: Option<bool>,
}

impl EgressLabel {
    /// Sets (`true`) or removes the label, as openshift-sdn's node does; a failure is logged and
    /// retried at the next list.
    async fn ensure(&mut self, failure: bool) {
        if self.set == Some(failure) {
            return;
        }
        if !failure && self.set.is_none() {
            // Unknown: look before writing (most nodes never had the label).
            match self.nodes.get(&self.node).await {
                Ok(n) if !n.metadata.labels.as_ref().is_some_and(|l| l.contains_key(EGRESS_FAILURE_LABEL)) => {
                    self.set = Some(false);
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    warn!(node = %self.node, error = %e, "cannot read the node to check the {EGRESS_FAILURE_LABEL} label");
                    return;
                }
            }
        }
        let value = if failure { json!("true") } else { serde_json::Value::Null };
        let patch = json!({"metadata": {"labels": {EGRESS_FAILURE_LABEL: value}}});
        match self.nodes.patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {
                info!(node = %self.node, label = EGRESS_FAILURE_LABEL, set = failure, "node label updated");
                self.set = Some(failure);
            }
            Err(e) => {
                warn!(node = %self.node, error = %e, "cannot update the {EGRESS_FAILURE_LABEL} label on the node")
            }
        }
    }
}

fn forbidden(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code == 403,
        watcher::Error::WatchError(s) => s.code == 403,
        _ => false,
    }
}

/// Follows one kind: watcher (retried with kube's default backoff) into its reflector store;
/// marks the kind listed at each `InitDone` and wakes the publisher on every change.
async fn follow<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    kind: Kind,
    shared: Arc<Shared>,
    telemetry: Telemetry,
    mut egress_label: Option<EgressLabel>,
) where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let slot = Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
    let stream = watcher::watcher(api, config).default_backoff().reflect(writer);
    futures::pin_mut!(stream);
    let mut failing = false;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::InitDone) => {
                if failing {
                    info!(kind = ?kind, "listed again");
                    failing = false;
                }
                if let Some(l) = egress_label.as_mut() {
                    shared.update(|s| s.egress_forbidden = false);
                    l.ensure(false).await;
                }
                shared.update(|s| s.ready[slot] = true);
            }
            Ok(Event::Init | Event::InitApply(_)) => {}
            Ok(Event::Apply(_) | Event::Delete(_)) => shared.changed.notify_one(),
            Err(e) => {
                telemetry
                    .metrics
                    .reconnects
                    .get_or_create(&TargetLabel { target: format!("kube-{}", kind.resource().1) })
                    .inc();
                if let (Some(l), true) = (egress_label.as_mut(), forbidden(&e)) {
                    if !failing {
                        error!("WARNING: EgressNetworkPolicy is not being enforced - please ensure this node may list egressnetworkpolicies.network.openshift.io");
                    }
                    shared.update(|s| s.egress_forbidden = true);
                    l.ensure(true).await;
                } else if !failing {
                    warn!(kind = ?kind, error = %e, "watch failed; retrying with backoff");
                } else {
                    tracing::debug!(kind = ?kind, error = %e, "watch failed again");
                }
                failing = true;
            }
        }
    }
}
