//! The watchers: one kube-rs `watcher` per watched kind, a readiness flag per kind (set by its
//! `InitDone`), and a publisher that rebuilds the state from the converted objects (debounced)
//! once every watched kind has listed. Which kinds are watched besides the plugin-independent
//! ones follows the plugin ([`Scope`]); NetworkPolicies of type Egress are reported as Events
//! ([`super::events`]).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tracing::{error, info, warn};

use super::events;
use super::mapping::{self, Object, Objects, Unusable, Update};
use super::types::{ClusterNetwork, EgressNetworkPolicy, HostSubnet, NetNamespace};
use super::KubeOptions;
use crate::metrics::{TargetLabel, Telemetry};
use crate::domain::Plugin;
use crate::cluster::Loaded;

/// The label openshift-sdn sets on a node that cannot list EgressNetworkPolicies.
pub const EGRESS_FAILURE_LABEL: &str = "network.openshift.io/not-enforcing-egress-network-policy";

/// How long the publisher waits after a change for more changes (a relist is many events).
pub const DEBOUNCE: Duration = Duration::from_millis(50);

pub use super::types::Kind;

pub(super) async fn client(opts: &KubeOptions) -> Result<Client, String> {
    client_for(opts.kubeconfig.as_deref()).await
}

/// A client from a kubeconfig file, or the in-cluster configuration (`None`); an error names
/// the file (the agent's watchers and the controller both start here).
pub(crate) async fn client_for(kubeconfig: Option<&std::path::Path>) -> Result<Client, String> {
    let config = match kubeconfig {
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

/// How many converted updates may wait for the publisher (a full queue holds the watchers back).
const QUEUE: usize = 1024;

/// The kinds whose watchers depend on the plugin (see [`Scope`]).
const SCOPED: [Kind; 3] = [Kind::Pod, Kind::NetworkPolicy, Kind::Namespace];

/// What the plugin needs watched beyond the kinds every plugin uses. Only the networkpolicy
/// plugin uses NetworkPolicies, Namespace labels and other nodes' pods (as policy peers); the
/// others watch this node's pods alone, so a cluster that runs them need not grant the agent
/// those lists. The plugin is known from ClusterNetwork "default" only: until it is, this
/// node's pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scope {
    NodePods,
    NetworkPolicy,
}

impl Scope {
    fn of(plugin: Option<Plugin>) -> Scope {
        match plugin {
            Some(Plugin::NetworkPolicy) => Scope::NetworkPolicy,
            _ => Scope::NodePods,
        }
    }
}

/// A converted update, tagged with the watcher it came from: its kind and epoch (the scoped
/// watchers' epoch changes when they are replaced, so what a stopped watcher had queued is
/// dropped).
struct Tagged {
    kind: Kind,
    epoch: u32,
    update: Update,
    /// The object's generation and the event's arrival (a policy's realization starts there).
    seen: Option<mapping::Seen>,
}

/// Starts the watchers of `scope` (tagged `epoch`) into `tasks`; tells `objects` which kinds
/// it now waits for.
fn start_scoped(ctx: &Ctx, scope: Scope, epoch: u32, tasks: &mut tokio::task::JoinSet<()>, objects: &mut Objects) {
    let t = &ctx.telemetry;
    // Each pod is converted at once to the small record used (the full object is not kept):
    // this node's (names, bandwidth annotations, labels, containerPorts) and, for the
    // networkpolicy plugin, other nodes' as policy peers (IP and labels).
    let pods = match scope {
        Scope::NetworkPolicy => watcher::Config::default(),
        Scope::NodePods => watcher::Config::default().fields(&format!("spec.nodeName={}", ctx.node)),
    };
    let stream = watcher::watcher(Api::<Pod>::all(ctx.client.clone()), pods);
    tasks.spawn(follow(stream, Kind::Pod, epoch, |p| Object::Pod(mapping::pod(p)), ctx.tx.clone(), t.clone(), None, |_, _| {}));
    objects.watch(Kind::Pod);
    if scope == Scope::NodePods {
        objects.unwatch(Kind::NetworkPolicy);
        objects.unwatch(Kind::Namespace);
        return;
    }
    let stream = watcher::watcher(Api::<NetworkPolicy>::all(ctx.client.clone()), watcher::Config::default());
    let notices = ctx.notices.clone();
    let report = move |ev: &Event<NetworkPolicy>, object: Option<&Object>| policy_notice(&notices, ev, object);
    let convert = |p: &NetworkPolicy| Object::NetworkPolicy(mapping::network_policy(p));
    tasks.spawn(follow(stream, Kind::NetworkPolicy, epoch, convert, ctx.tx.clone(), t.clone(), None, report));
    objects.watch(Kind::NetworkPolicy);
    let stream = watcher::watcher(Api::<Namespace>::all(ctx.client.clone()), watcher::Config::default());
    let convert = |n: &Namespace| Object::Namespace(mapping::namespace_labels(n));
    tasks.spawn(follow(stream, Kind::Namespace, epoch, convert, ctx.tx.clone(), t.clone(), None, |_, _| {}));
    objects.watch(Kind::Namespace);
}

/// What the scoped watchers share.
struct Ctx {
    client: Client,
    node: String,
    telemetry: Telemetry,
    tx: mpsc::Sender<Tagged>,
    notices: mpsc::UnboundedSender<events::Notice>,
}

/// Tells the events task about a NetworkPolicy, from its conversion: with parts dropped
/// (reported), or whole.
fn policy_notice(notices: &mpsc::UnboundedSender<events::Notice>, ev: &Event<NetworkPolicy>, object: Option<&Object>) {
    use kube::Resource;
    let dropped = match object {
        Some(Object::NetworkPolicy(c)) if !c.problems.is_empty() => {
            let fields = c.problems.iter().map(|p| format!("{}: {}", p.field, p.message)).collect::<Vec<_>>().join("; ");
            Some(if c.value.is_some() { fields } else { format!("{fields}; the policy is not used") })
        }
        _ => None,
    };
    let notice = match ev {
        Event::Apply(p) | Event::InitApply(p) => match dropped {
            Some(note) => events::Notice::PartlyEnforced {
                id: mapping::id_of(&p.metadata),
                reference: p.object_ref(&()),
                generation: p.metadata.generation.unwrap_or(0),
                note,
            },
            None => events::Notice::Quiet(mapping::id_of(&p.metadata)),
        },
        Event::Delete(p) => events::Notice::Quiet(mapping::id_of(&p.metadata)),
        Event::Init | Event::InitDone => return,
    };
    // The events task ends only with the publisher.
    let _ = notices.send(notice);
}

async fn run(client: Client, opts: KubeOptions, telemetry: Telemetry, tx: watch::Sender<Option<Arc<Loaded>>>) {
    let (up_tx, mut up_rx) = mpsc::channel::<Tagged>(QUEUE);
    let mut tasks = tokio::task::JoinSet::new();
    let t = &telemetry;

    // No reflector stores: each event is converted to the model once, in its watcher's task,
    // and only the converted objects are kept (by the publisher's `Objects`).
    let cfg = watcher::Config::default().fields("metadata.name=default");
    let stream = watcher::watcher(Api::<ClusterNetwork>::all(client.clone()), cfg);
    let convert = |c: &ClusterNetwork| Object::ClusterNetwork(mapping::cluster_network(c));
    tasks.spawn(follow(stream, Kind::ClusterNetwork, 0, convert, up_tx.clone(), t.clone(), None, |_, _| {}));

    let stream = watcher::watcher(Api::<HostSubnet>::all(client.clone()), watcher::Config::default());
    tasks.spawn(follow(stream, Kind::HostSubnet, 0, |h| Object::HostSubnet(mapping::host_subnet(h)), up_tx.clone(), t.clone(), None, |_, _| {}));

    let stream = watcher::watcher(Api::<NetNamespace>::all(client.clone()), watcher::Config::default());
    let convert = |n: &NetNamespace| Object::NetNamespace(mapping::net_namespace(n));
    tasks.spawn(follow(stream, Kind::NetNamespace, 0, convert, up_tx.clone(), t.clone(), None, |_, _| {}));

    let label = EgressLabel { nodes: Api::<Node>::all(client.clone()), node: opts.node.clone(), set: None };
    let stream = watcher::watcher(Api::<EgressNetworkPolicy>::all(client.clone()), watcher::Config::default());
    let convert = |p: &EgressNetworkPolicy| Object::EgressPolicy(mapping::egress_policy(p));
    tasks.spawn(follow(stream, Kind::EgressNetworkPolicy, 0, convert, up_tx.clone(), t.clone(), Some(label), |_, _| {}));

    let stream = watcher::watcher(Api::<Service>::all(client.clone()), watcher::Config::default());
    tasks.spawn(follow(stream, Kind::Service, 0, |s| Object::Service(mapping::service(s)), up_tx.clone(), t.clone(), None, |_, _| {}));

    let (notices, notices_rx) = mpsc::unbounded_channel();
    tasks.spawn(events::report(events::recorder(client.clone(), &opts.node), opts.node.clone(), notices_rx));
    // Once ready: this Node's NetworkUnavailable condition to False (once per start).
    tasks.spawn(super::node_status::announce(
        Api::<Node>::all(client.clone()),
        opts.node.clone(),
        telemetry.health.clone(),
    ));

    let ctx =
        Ctx { client, node: opts.node.clone(), telemetry: telemetry.clone(), tx: up_tx, notices: notices.clone() };
    let mut objects = Objects::new(&opts.node);
    let (mut scope, mut epoch) = (Scope::NodePods, 1u32);
    // Dropping the set (a scope change, or the publisher's end) aborts its watchers.
    let mut scoped = tokio::task::JoinSet::new();
    start_scoped(&ctx, scope, epoch, &mut scoped, &mut objects);
    // What no state could be built for, until one is (logged and reported once per wait).
    let mut waiting: Option<Unusable> = None;
    // Numbers each published state (see `Loaded::seq`).
    let mut seq: u64 = 0;
    loop {
        let first = tokio::select! {
            // The consumer is gone: stop the watchers (dropping the JoinSets aborts them).
            _ = tx.closed() => return,
            u = up_rx.recv() => match u {
                Some(u) => u,
                None => return,
            },
        };
        let current = |u: &Tagged| !SCOPED.contains(&u.kind) || u.epoch == epoch;
        if current(&first) {
            objects.apply_seen(first.update, first.seen);
        }
        tokio::time::sleep(DEBOUNCE).await;
        while let Ok(u) = up_rx.try_recv() {
            if current(&u) {
                objects.apply_seen(u.update, u.seen);
            }
        }
        // The plugin decides what else is watched: switch before publishing, so that no state
        // is published from the other scope's objects.
        let wanted = Scope::of(objects.plugin());
        if wanted != scope {
            info!(from = ?scope, to = ?wanted, "the plugin changes what is watched");
            (scope, epoch) = (wanted, epoch.wrapping_add(1));
            scoped = tokio::task::JoinSet::new();
            start_scoped(&ctx, scope, epoch, &mut scoped, &mut objects);
        }
        let last = tx.borrow().clone();
        match objects.publish(last.as_deref()) {
            None => {
                // Before the first state: the first lists (the API server) are waited for.
                let unlisted = objects.unlisted();
                if last.is_none() && waiting.is_none() && !unlisted.is_empty() {
                    let kinds: Vec<&str> = unlisted.iter().map(|k| k.resource().1).collect();
                    telemetry
                        .health
                        .set_waiting(Some(format!("waiting for the API server's first list of {}", kinds.join(", "))));
                }
            }
            Some(Ok(mut loaded)) => {
                if let Some(w) = waiting.take() {
                    info!(reason = w.reason(), "no longer waiting: the cluster state is complete");
                    // The events task ends only with the publisher.
                    let _ = notices.send(events::Notice::Proceeding);
                }
                telemetry.health.set_waiting(None);
                seq += 1;
                loaded.seq = seq;
                for p in &loaded.problems {
                    warn!(object = %p.object, field = %p.field, "rejected: {}", p.message);
                }
                info!(
                    host_subnets = loaded.state.host_subnets.len(),
                    net_namespaces = loaded.state.net_namespaces.len(),
                    services = loaded.state.services.len(),
                    egress_policies = loaded.state.egress_policies.len(),
                    network_policies = loaded.state.network_policies.len(),
                    live_pods = objects.live_pods().len(),
                    rejected = loaded.problems.len(),
                    touched = loaded.touched.as_ref().map_or(-1, |t| t.len() as i64),
                    "cluster state loaded"
                );
                tx.send_replace(Some(Arc::new(loaded)));
            }
            Some(Err(w)) if waiting.as_ref() != Some(&w) => {
                let kept = if last.is_some() { "; the last good state stays applied" } else { "" };
                warn!(reason = w.reason(), "{w}{kept}");
                telemetry.health.set_waiting(Some(w.to_string()));
                let _ = notices.send(events::Notice::Waiting(w.clone()));
                waiting = Some(w);
            }
            Some(Err(_)) => {}
        }
    }
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

/// Follows one kind: watcher events (retried with kube's default backoff) converted to the
/// model and queued for the publisher; the egress-policy label follows whether the kind can be
/// listed.
#[allow(clippy::too_many_arguments)]
async fn follow<K, S>(
    stream: S,
    kind: Kind,
    epoch: u32,
    convert: fn(&K) -> Object,
    tx: mpsc::Sender<Tagged>,
    telemetry: Telemetry,
    mut egress_label: Option<EgressLabel>,
    mut observe: impl FnMut(&Event<K>, Option<&Object>) + Send,
) where
    K: kube::Resource,
    S: futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send,
{
    let stream = stream.default_backoff();
    futures::pin_mut!(stream);
    let mut failing = false;
    while let Some(ev) = stream.next().await {
        let seen = match &ev {
            Ok(Event::Apply(o) | Event::InitApply(o)) => Some((o.meta().generation, std::time::Instant::now())),
            _ => None,
        };
        // Converted once: the observer (the events task's notices) reads the same conversion.
        let mut object = match &ev {
            Ok(Event::Apply(o) | Event::InitApply(o)) => Some(convert(o)),
            _ => None,
        };
        if let Ok(ev) = &ev {
            observe(ev, object.as_ref());
        }
        let update = match ev {
            Ok(Event::Init) => Update::ListStart(kind),
            Ok(Event::InitApply(o)) => Update::ListApply(mapping::id_of(o.meta()), object.take().unwrap_or_else(|| convert(&o))),
            Ok(Event::InitDone) => {
                if failing {
                    info!(kind = ?kind, "listed again");
                    failing = false;
                }
                if let Some(l) = egress_label.as_mut() {
                    l.ensure(false).await;
                }
                Update::ListDone(kind)
            }
            Ok(Event::Apply(o)) => Update::Apply(mapping::id_of(o.meta()), object.take().unwrap_or_else(|| convert(&o))),
            Ok(Event::Delete(o)) => Update::Delete(kind, mapping::id_of(o.meta())),
            Err(e) => {
                telemetry
                    .metrics
                    .reconnects
                    .get_or_create(&TargetLabel { target: format!("kube-{}", kind.resource().1) })
                    .inc();
                let is_forbidden = egress_label.is_some() && forbidden(&e);
                if let (Some(l), true) = (egress_label.as_mut(), is_forbidden) {
                    if !failing {
                        error!("WARNING: EgressNetworkPolicy is not being enforced - please ensure this node may list egressnetworkpolicies.network.openshift.io");
                    }
                    l.ensure(true).await;
                } else if !failing {
                    warn!(kind = ?kind, error = %e, "watch failed; retrying with backoff");
                } else {
                    tracing::debug!(kind = ?kind, error = %e, "watch failed again");
                }
                failing = true;
                if !is_forbidden {
                    continue;
                }
                Update::EgressForbidden
            }
        };
        if tx.send(Tagged { kind, epoch, update, seen }).await.is_err() {
            return;
        }
    }
}
