//! The controller's loop: one task owns the caches of what it watches (Nodes, Namespaces,
//! HostSubnets, NetNamespaces, ClusterNetwork "default") and the two allocators, decides per
//! key (ClusterNetwork, one Node, one Namespace) what single write brings the cluster to what
//! the configuration and the objects say, and hands that write to the [`Writer`] (rate limit,
//! leadership, deadline). One event is at most one write: O(1) API calls per Node or
//! Namespace event.
//!
//! - Only the leader decides and writes; a replica that gains the Lease starts with every key
//!   dirty (its caches are warm: it watched while waiting), so a new leader changes nothing
//!   that is already right.
//! - A write's answer updates the cache at once (the next decision sees it, before the watch
//!   event arrives); a watch event older than the cached object (by resourceVersion) is
//!   ignored.
//! - A subnet or VNID is taken in its allocator when the create is sent. A definite refusal
//!   gives it back; an unknown outcome (timeout, 5xx) keeps it for that name until the caches
//!   say what exists, so one subnet is never handed to two Nodes.
//! - Problems (a Node without a podCIDR or host IP, a podCIDR outside the cluster network, a
//!   ClusterNetwork that differs from the configuration) are Warning Events on the object,
//!   once per problem, and entries of `/status`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use ipnet::{IpNet, Ipv6Net};
use k8s_openapi::api::core::v1::{Namespace, Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::Client;
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use super::config::{Config, NodeSubnets};
use super::lease::Leader;
use super::objects::{self, NamespaceInfo, NodeInfo};
use super::status::{Problem, Status};
use super::subnets::Subnets;
use super::vnids::{self, Change, Vnids};
use super::writer::{WriteError, Writer};
use crate::kube::types::{annotations, ClusterNetwork, HostSubnet, NetNamespace};
use crate::domain::Plugin;

/// What a watcher reports.
enum Update<T> {
    Apply(T),
    Delete(T),
    /// A complete list (after a start or a 410 Gone).
    Relist(Vec<T>),
}

enum Input {
    Node(Update<NodeInfo>),
    Namespace(Update<NamespaceInfo>),
    HostSubnet(Update<HostSubnet>),
    NetNamespace(Update<NetNamespace>),
    ClusterNetwork(Update<ClusterNetwork>),
}

/// What a decision is about.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Key {
    ClusterNetwork,
    Node(String),
    Namespace(String),
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::ClusterNetwork => f.write_str("clusternetwork/default"),
            Key::Node(n) => write!(f, "node/{n}"),
            Key::Namespace(n) => write!(f, "namespace/{n}"),
        }
    }
}

/// One write.
#[derive(Debug)]
enum Action {
    CreateClusterNetwork(ClusterNetwork),
    /// IPv4 → dual-stack: the read ClusterNetwork with the IPv6 annotations added, replaced
    /// conditionally on its resourceVersion.
    ReplaceClusterNetwork(ClusterNetwork),
    CreateHostSubnet(HostSubnet),
    ReplaceHostSubnet(HostSubnet),
    DeleteHostSubnet { name: String, uid: Option<String>, rv: Option<String> },
    CreateNetNamespace(NetNamespace),
    ReplaceNetNamespace(NetNamespace),
    DeleteNetNamespace { name: String, uid: Option<String>, rv: Option<String> },
}

/// What a write did.
enum Written {
    ClusterNetwork(ClusterNetwork),
    HostSubnet(HostSubnet),
    HostSubnetGone(String),
    NetNamespace(NetNamespace),
    NetNamespaceGone(String),
}

type Outcome = (Key, Result<Written, WriteError>);

/// The watched kinds, for the synced flags.
const KINDS: usize = 5;

/// A Warning Event to publish.
struct Notice {
    reference: ObjectReference,
    reason: String,
    note: String,
}

pub struct Controller {
    cfg: Config,
    writer: Arc<Writer>,
    apis: Apis,
    nodes: HashMap<String, NodeInfo>,
    namespaces: HashMap<String, NamespaceInfo>,
    host_subnets: HashMap<String, HostSubnet>,
    net_namespaces: HashMap<String, NetNamespace>,
    cluster_network: Option<ClusterNetwork>,
    synced: [bool; KINDS],
    subnets: Subnets,
    /// Dual-stack: the IPv6 cluster network's allocator (marked from the HostSubnets' IPv6
    /// annotations as `subnets` is from their `subnet`).
    subnets6: Option<Subnets>,
    vnids: Vnids,
    dirty: BTreeSet<Key>,
    inflight: HashSet<Key>,
    /// Keys to try again, and when; attempts per key (for the backoff).
    retry: BTreeMap<Instant, Vec<Key>>,
    attempts: HashMap<Key, u32>,
    /// Problems by key: (reason, message); published once each.
    problems: BTreeMap<Key, (String, String)>,
    /// Whether ClusterNetwork "default" matches the configuration (None: not yet known).
    network_ok: Option<Result<(), String>>,
    notices: mpsc::UnboundedSender<Notice>,
    status: Arc<Mutex<Status>>,
    writes: u64,
}

#[derive(Clone)]
struct Apis {
    host_subnets: Api<HostSubnet>,
    net_namespaces: Api<NetNamespace>,
    cluster_networks: Api<ClusterNetwork>,
}

/// Starts the watchers and runs the loop until the process ends.
pub async fn run(
    cfg: Config,
    client: Client,
    leader: Leader,
    writer: Arc<Writer>,
    status: Arc<Mutex<Status>>,
    recorder: kube::runtime::events::Recorder,
) {
    let (tx, mut rx) = mpsc::channel::<Input>(4096);
    watch(Api::<Node>::all(client.clone()), watcher::Config::default(), NodeInfo::from, Input::Node, tx.clone());
    watch(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default(),
        NamespaceInfo::from,
        Input::Namespace,
        tx.clone(),
    );
    watch(
        Api::<HostSubnet>::all(client.clone()),
        watcher::Config::default(),
        |h| Some(h.clone()),
        Input::HostSubnet,
        tx.clone(),
    );
    watch(
        Api::<NetNamespace>::all(client.clone()),
        watcher::Config::default(),
        |h| Some(h.clone()),
        Input::NetNamespace,
        tx.clone(),
    );
    watch(
        Api::<ClusterNetwork>::all(client.clone()),
        watcher::Config::default().fields("metadata.name=default"),
        |h| Some(h.clone()),
        Input::ClusterNetwork,
        tx.clone(),
    );
    drop(tx);
    let (notices, notices_rx) = mpsc::unbounded_channel();
    tokio::spawn(publish(recorder, writer.clone(), notices_rx));
    let subnets = match Subnets::new(cfg.network.cluster_network, cfg.network.host_subnet_length) {
        Ok(s) => s,
        Err(e) => {
            // Checked with the configuration; unreachable in practice.
            error!(error = %e, "cannot cut the cluster network");
            return;
        }
    };
    let subnets6 = match &cfg.network.ipv6 {
        None => None,
        Some(six) => match Subnets::new(IpNet::V6(six.cluster_network), six.host_subnet_length) {
            Ok(s) => Some(s),
            Err(e) => {
                // Checked with the configuration; unreachable in practice.
                error!(error = %e, "cannot cut the IPv6 cluster network");
                return;
            }
        },
    };
    let apis = Apis {
        host_subnets: Api::all(client.clone()),
        net_namespaces: Api::all(client.clone()),
        cluster_networks: Api::all(client.clone()),
    };
    let mut c = Controller {
        cfg,
        writer,
        apis,
        nodes: HashMap::new(),
        namespaces: HashMap::new(),
        host_subnets: HashMap::new(),
        net_namespaces: HashMap::new(),
        cluster_network: None,
        synced: [false; KINDS],
        subnets,
        subnets6,
        vnids: Vnids::new(),
        dirty: BTreeSet::new(),
        inflight: HashSet::new(),
        retry: BTreeMap::new(),
        attempts: HashMap::new(),
        problems: BTreeMap::new(),
        network_ok: None,
        notices,
        status,
        writes: 0,
    };
    let mut writes = FuturesUnordered::new();
    let mut gained = leader.clone();
    let mut lost = leader.clone();
    let mut leading = false;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        if leading && c.all_synced() {
            c.start_writes(&mut writes);
        }
        let next_retry = c.retry.keys().next().copied();
        tokio::select! {
            input = rx.recv() => match input {
                Some(i) => c.apply(i),
                None => return,
            },
            Some((key, result)) = writes.next(), if !writes.is_empty() => c.finish(key, result),
            _ = gained.leading(), if !leading => {
                leading = true;
                c.report(leading, writes.len());
                info!("leading: deciding every Node, Namespace and ClusterNetwork once the watches have listed");
                c.dirty_all();
            }
            _ = lost.lost(), if leading => {
                leading = false;
                c.report(leading, writes.len());
                warn!("not leading: writes stop");
            }
            _ = tokio::time::sleep_until(next_retry.unwrap_or_else(Instant::now).into()), if next_retry.is_some() => c.due(),
            _ = tick.tick() => c.report(leading, writes.len()),
        }
    }
}

/// Starts a watcher of `api` that converts each object with `conv` and sends it wrapped by
/// `wrap`; the initial list (and every relist) is sent whole, at its end.
fn watch<K, T>(
    api: Api<K>,
    config: watcher::Config,
    conv: fn(&K) -> Option<T>,
    wrap: fn(Update<T>) -> Input,
    tx: mpsc::Sender<Input>,
) where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    T: Send + 'static,
{
    tokio::spawn(async move {
        let kind = K::kind(&()).to_string();
        let mut stream = watcher(api, config).default_backoff().boxed();
        let mut buf: Vec<T> = vec![];
        let mut last_error: Option<Instant> = None;
        while let Some(ev) = stream.next().await {
            let update = match ev {
                Ok(watcher::Event::Init) => {
                    buf.clear();
                    continue;
                }
                Ok(watcher::Event::InitApply(o)) => {
                    buf.extend(conv(&o));
                    continue;
                }
                Ok(watcher::Event::InitDone) => Update::Relist(std::mem::take(&mut buf)),
                Ok(watcher::Event::Apply(o)) => match conv(&o) {
                    Some(t) => Update::Apply(t),
                    None => continue,
                },
                Ok(watcher::Event::Delete(o)) => match conv(&o) {
                    Some(t) => Update::Delete(t),
                    None => continue,
                },
                Err(e) => {
                    if last_error.is_none_or(|t| t.elapsed() > Duration::from_secs(30)) {
                        warn!(kind = %kind, error = %e, "watch failed; retrying");
                        last_error = Some(Instant::now());
                    }
                    continue;
                }
            };
            if tx.send(wrap(update)).await.is_err() {
                return;
            }
        }
    });
}

/// Publishes the Warning Events (leader only, through the rate limit).
async fn publish(
    recorder: kube::runtime::events::Recorder,
    writer: Arc<Writer>,
    mut rx: mpsc::UnboundedReceiver<Notice>,
) {
    while let Some(n) = rx.recv().await {
        let ev = kube::runtime::events::Event {
            type_: EventType::Warning,
            reason: n.reason.clone(),
            note: Some(n.note.chars().take(1000).collect()),
            action: "Allocate".into(),
            secondary: None,
        };
        match writer.send(recorder.publish(&ev, &n.reference)).await {
            Ok(()) => {}
            Err(WriteError::NotLeader) => {}
            Err(e) => warn!(reason = %n.reason, error = %e, "cannot publish an Event"),
        }
    }
}

fn reference(kind: &str, api_version: &str, name: &str, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        kind: Some(kind.into()),
        api_version: Some(api_version.into()),
        name: Some(name.into()),
        uid,
        ..Default::default()
    }
}

/// Replaces `old` by `new` in a cache unless `new` is older (by resourceVersion).
fn newer(old: Option<&ObjectMeta>, new: &ObjectMeta) -> bool {
    match (old.and_then(objects::rv), objects::rv(new)) {
        (Some(o), Some(n)) => n >= o,
        _ => true,
    }
}

/// What is kept of Nodes and Namespaces, by name.
trait Info: PartialEq + Sized {
    fn name(&self) -> &str;
    fn key(name: String) -> Key;
    fn cache(c: &mut Controller) -> &mut HashMap<String, Self>;
}

impl Info for NodeInfo {
    fn name(&self) -> &str {
        &self.name
    }
    fn key(name: String) -> Key {
        Key::Node(name)
    }
    fn cache(c: &mut Controller) -> &mut HashMap<String, Self> {
        &mut c.nodes
    }
}

impl Info for NamespaceInfo {
    fn name(&self) -> &str {
        &self.name
    }
    fn key(name: String) -> Key {
        Key::Namespace(name)
    }
    fn cache(c: &mut Controller) -> &mut HashMap<String, Self> {
        &mut c.namespaces
    }
}

/// The objects the controller writes and keeps whole, by the name of the Node or Namespace
/// they are for (their allocator is resynced from the cache: [`Controller::resync`]).
trait Owned: Sized {
    fn meta(&self) -> &ObjectMeta;
    fn key(name: String) -> Key;
    fn cache(c: &mut Controller) -> &mut HashMap<String, Self>;
}

impl Owned for HostSubnet {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn key(name: String) -> Key {
        Key::Node(name)
    }
    fn cache(c: &mut Controller) -> &mut HashMap<String, Self> {
        &mut c.host_subnets
    }
}

impl Owned for NetNamespace {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn key(name: String) -> Key {
        Key::Namespace(name)
    }
    fn cache(c: &mut Controller) -> &mut HashMap<String, Self> {
        &mut c.net_namespaces
    }
}

impl Controller {
    fn all_synced(&self) -> bool {
        self.synced.iter().all(|s| *s)
    }

    fn plugin(&self) -> Plugin {
        self.cfg.network.plugin
    }

    fn dirty_all(&mut self) {
        self.dirty.insert(Key::ClusterNetwork);
        let nodes: Vec<Key> = self.nodes.keys().chain(self.host_subnets.keys()).map(|n| Key::Node(n.clone())).collect();
        self.dirty.extend(nodes);
        let nss: Vec<Key> =
            self.namespaces.keys().chain(self.net_namespaces.keys()).map(|n| Key::Namespace(n.clone())).collect();
        self.dirty.extend(nss);
    }

    /// A watch event into the caches (and allocators); dirties what it may change.
    fn apply(&mut self, input: Input) {
        match input {
            Input::Node(u) => {
                if self.update_info(u) {
                    self.synced[0] = true;
                }
            }
            Input::Namespace(u) => {
                if self.update_info(u) {
                    self.synced[1] = true;
                }
            }
            Input::HostSubnet(u) => {
                if self.update_owned(u) {
                    self.synced[2] = true;
                }
            }
            Input::NetNamespace(u) => {
                if self.update_owned(u) {
                    self.synced[3] = true;
                }
            }
            Input::ClusterNetwork(u) => {
                match u {
                    Update::Apply(cn) => {
                        if newer(self.cluster_network.as_ref().map(|c| &c.metadata), &cn.metadata) {
                            self.cluster_network = Some(cn);
                        }
                    }
                    Update::Delete(_) => self.cluster_network = None,
                    Update::Relist(list) => {
                        self.cluster_network = list.into_iter().find(|c| c.metadata.name.as_deref() == Some("default"));
                        self.synced[4] = true;
                    }
                }
                self.dirty.insert(Key::ClusterNetwork);
            }
        }
    }

    /// A Node or Namespace event into its cache; dirties the keys whose object changed. True
    /// when a list completed.
    fn update_info<T: Info>(&mut self, u: Update<T>) -> bool {
        match u {
            Update::Apply(t) => {
                if T::cache(self).get(t.name()) != Some(&t) {
                    self.dirty.insert(T::key(t.name().to_string()));
                    T::cache(self).insert(t.name().to_string(), t);
                }
                false
            }
            Update::Delete(t) => {
                T::cache(self).remove(t.name());
                self.dirty.insert(T::key(t.name().to_string()));
                false
            }
            Update::Relist(list) => {
                let new: HashMap<String, T> = list.into_iter().map(|t| (t.name().to_string(), t)).collect();
                let keys: Vec<Key> = T::cache(self).keys().chain(new.keys()).map(|n| T::key(n.clone())).collect();
                self.dirty.extend(keys);
                *T::cache(self) = new;
                true
            }
        }
    }

    /// A HostSubnet or NetNamespace event into its cache and allocator; dirties its key. True
    /// when a list completed.
    fn update_owned<T: Owned>(&mut self, u: Update<T>) -> bool {
        match u {
            Update::Apply(o) => self.put(o),
            Update::Delete(o) => {
                let Some(name) = o.meta().name.clone() else { return false };
                let uid = &o.meta().uid;
                let same = T::cache(self).get(&name).is_none_or(|c| c.meta().uid.is_none() || &c.meta().uid == uid);
                if same {
                    T::cache(self).remove(&name);
                    self.resync(&T::key(name.clone()), false);
                    self.dirty.insert(T::key(name));
                }
            }
            Update::Relist(list) => {
                let old: Vec<String> = T::cache(self).drain().map(|(n, _)| n).collect();
                for o in list {
                    self.put(o);
                }
                let gone: Vec<String> = old.into_iter().filter(|n| !T::cache(self).contains_key(n)).collect();
                for name in gone {
                    self.resync(&T::key(name.clone()), false);
                    self.dirty.insert(T::key(name));
                }
                return true;
            }
        }
        false
    }

    /// A HostSubnet or NetNamespace (a watch event or a write's answer) into its cache, unless
    /// the cache holds a newer one; its allocator follows.
    fn put<T: Owned>(&mut self, o: T) {
        let Some(name) = o.meta().name.clone() else { return };
        if !newer(T::cache(self).get(&name).map(Owned::meta), o.meta()) {
            return;
        }
        T::cache(self).insert(name.clone(), o);
        let key = T::key(name);
        self.resync(&key, false);
        self.dirty.insert(key);
    }

    /// Decides dirty keys and starts their writes, up to `--concurrent-writes` in flight.
    /// Until ClusterNetwork "default" is known to match the configuration, only it is
    /// decided: the other keys are dropped, and all are dirtied again when it matches.
    fn start_writes(&mut self, writes: &mut FuturesUnordered<futures::future::BoxFuture<'static, Outcome>>) {
        let mut busy = vec![];
        while writes.len() < self.cfg.concurrent_writes {
            let Some(key) = self.dirty.pop_first() else { break };
            if self.inflight.contains(&key) {
                busy.push(key);
                continue;
            }
            if key != Key::ClusterNetwork && !matches!(self.network_ok, Some(Ok(()))) {
                continue;
            }
            let action = match &key {
                Key::ClusterNetwork => self.decide_cluster_network(),
                Key::Node(n) => self.decide_node(&n.clone()),
                Key::Namespace(n) => self.decide_namespace(&n.clone()),
            };
            if let Some(action) = action {
                self.inflight.insert(key.clone());
                writes.push(self.write(key, action));
            }
        }
        // Decided again when their write is answered.
        self.dirty.extend(busy);
    }

    /// Records (or clears) the problem of `key`; a new one is logged and published once.
    fn problem(&mut self, key: &Key, reference: Option<ObjectReference>, p: Option<(&str, String)>) {
        match p {
            None => {
                if self.problems.remove(key).is_some() {
                    info!(object = %key, "resolved");
                }
            }
            Some((reason, msg)) => {
                let new = (reason.to_string(), msg.clone());
                if self.problems.get(key) == Some(&new) {
                    return;
                }
                warn!(object = %key, reason, "{msg}");
                if let Some(r) = reference {
                    let _ = self.notices.send(Notice { reference: r, reason: reason.into(), note: msg });
                }
                self.problems.insert(key.clone(), new);
            }
        }
    }

    fn decide_cluster_network(&mut self) -> Option<Action> {
        let key = Key::ClusterNetwork;
        let Some(existing) = &self.cluster_network else {
            self.network_ok = None;
            return Some(Action::CreateClusterNetwork(objects::cluster_network(&self.cfg.network)));
        };
        match objects::cluster_network_change(existing, &self.cfg.network) {
            objects::ClusterNetworkChange::AddIpv6(new) => {
                // Nothing else is decided until the replace is answered and the result matches.
                self.network_ok = None;
                info!(
                    network = %self.cfg.network.cluster_network,
                    cluster_network_ipv6 = %self.cfg.network.ipv6.as_ref().map(|s| s.cluster_network.to_string()).unwrap_or_default(),
                    "ClusterNetwork \"default\" is this IPv4 network without IPv6: adding the IPv6 networks (dual-stack)"
                );
                return Some(Action::ReplaceClusterNetwork(*new));
            }
            objects::ClusterNetworkChange::Same => {
                if !matches!(self.network_ok, Some(Ok(()))) {
                    info!(network = %self.cfg.network.cluster_network, plugin = objects::plugin_name(self.plugin()), "ClusterNetwork \"default\" matches the configuration");
                    // Everything waited for it.
                    self.dirty_all();
                    self.dirty.remove(&Key::ClusterNetwork);
                }
                self.network_ok = Some(Ok(()));
                self.problem(&key, None, None);
            }
            objects::ClusterNetworkChange::Refused(field) => {
                let msg = format!(
                    "ClusterNetwork \"default\" differs from this controller's configuration and is not changed: {field}. Fix the configuration (or, on a new cluster, delete the ClusterNetwork to have it recreated); no HostSubnet or NetNamespace is written until then"
                );
                let r =
                    reference("ClusterNetwork", "network.openshift.io/v1", "default", existing.metadata.uid.clone());
                self.problem(&key, Some(r), Some(("ClusterNetworkConflict", msg.clone())));
                self.network_ok = Some(Err(msg));
            }
        }
        None
    }

    fn node_ref(&self, name: &str) -> ObjectReference {
        reference("Node", "v1", name, self.nodes.get(name).and_then(|n| n.uid.clone()))
    }

    fn decide_node(&mut self, name: &str) -> Option<Action> {
        let key = Key::Node(name.to_string());
        let hs = self.host_subnets.get(name).cloned();
        let Some(node) = self.nodes.get(name).cloned() else {
            self.problem(&key, None, None);
            return match hs {
                Some(h) if objects::managed(&h) => Some(Action::DeleteHostSubnet {
                    name: name.into(),
                    uid: h.metadata.uid.clone(),
                    rv: h.metadata.resource_version.clone(),
                }),
                Some(_) => None,
                None => {
                    // A reservation of an unknown outcome for a Node now gone.
                    self.subnets.unmark(name);
                    if let Some(a) = self.subnets6.as_mut() {
                        a.unmark(name);
                    }
                    None
                }
            };
        };
        let host_ip = match node.host_ip() {
            Ok(ip) => ip,
            Err(e) => {
                let r = self.node_ref(name);
                self.problem(
                    &key,
                    Some(r),
                    Some(("NoHostIP", format!("Node {name}: {e}; no HostSubnet until it has one"))),
                );
                return None;
            }
        };
        let network = self.cfg.network.cluster_network;
        let pod_cidr = node.pod_cidr(&network);
        if let Some(h) = hs {
            let mut problem = None;
            if let (Some(p), Ok(s)) = (pod_cidr, h.subnet.parse::<IpNet>()) {
                if p != s && self.cfg.node_subnets != NodeSubnets::Allocate {
                    problem = Some(("PodCIDRMismatch", format!("Node {name}: spec.podCIDRs has {p} but its HostSubnet has {s}, which stays (pods use it); delete the HostSubnet to have it recreated")));
                }
            }
            // A managed HostSubnet follows the Node's address and gains an IPv6 subnet when
            // dual-stack is configured after it was made (or its IPv6 subnet was not free).
            let mut new = h.clone();
            let mut changed = false;
            if objects::managed(&h) {
                if h.host_ip != host_ip.to_string() {
                    new.host_ip = host_ip.to_string();
                    changed = true;
                }
                if self.subnets6.is_some() && objects::subnet6_of(&h).is_none() {
                    match self.decide_subnet6(name, &node) {
                        Ok(Some(s6)) => {
                            objects::set_subnet6(&mut new, s6);
                            changed = true;
                        }
                        Ok(None) => {}
                        Err(p) => problem = problem.or(Some(p)),
                    }
                }
            }
            let r = self.node_ref(name);
            self.problem(&key, Some(r), problem);
            return changed.then_some(Action::ReplaceHostSubnet(new));
        }
        // A reservation from a write of unknown outcome is used again.
        let reserved = self.subnets.subnet_of(name);
        let subnet = match (reserved, self.cfg.node_subnets, pod_cidr) {
            (Some(s), _, _) => s,
            (None, NodeSubnets::Allocate, _) | (None, NodeSubnets::Auto, None) if !self.cluster_allocates() => {
                match self.subnets.allocate(name) {
                    Some(s) => s,
                    None => {
                        let (used, all) = self.subnets.usage();
                        let r = self.node_ref(name);
                        self.problem(
                            &key,
                            Some(r),
                            Some((
                                "ClusterNetworkFull",
                                format!("Node {name}: no free subnet left in {network} ({used} of {all} taken)"),
                            )),
                        );
                        return None;
                    }
                }
            }
            (None, _, None) => {
                let r = self.node_ref(name);
                let bad = if node.bad_pod_cidrs.is_empty() {
                    String::new()
                } else {
                    format!(" (not CIDRs: {})", node.bad_pod_cidrs.join(", "))
                };
                self.problem(
                    &key,
                    Some(r),
                    Some((
                        "NoPodCIDR",
                        format!("Node {name}: no podCIDR of the cluster network's family yet{bad}; the cluster allocates them (kube-controller-manager --allocate-node-cidrs, kubeadm init --pod-network-cidr): waiting"),
                    )),
                );
                return None;
            }
            (None, _, Some(p)) => {
                if !(network.contains(&p.network()) && network.contains(&p.broadcast())) {
                    let r = self.node_ref(name);
                    self.problem(&key, Some(r), Some(("PodCIDROutsideClusterNetwork", format!("Node {name}: podCIDR {p} is not inside the cluster network {network}; no HostSubnet (fix kube-controller-manager's --cluster-cidr or the controller's --cluster-network)"))));
                    return None;
                }
                let others = self.subnets.overlapping(&p, name);
                if !others.is_empty() {
                    let r = self.node_ref(name);
                    self.problem(
                        &key,
                        Some(r),
                        Some((
                            "SubnetConflict",
                            format!(
                                "Node {name}: podCIDR {p} overlaps the HostSubnet of {}; no HostSubnet",
                                others.join(", ")
                            ),
                        )),
                    );
                    return None;
                }
                self.subnets.mark(name, p);
                p
            }
        };
        // Dual-stack: the IPv6 subnet; without one yet the HostSubnet is made with IPv4 alone
        // (the node's IPv4 pods need not wait) and gains it later, with the problem meanwhile.
        let (subnet6, problem) = match self.decide_subnet6(name, &node) {
            Ok(s6) => (s6, None),
            Err(p) => (None, Some(p)),
        };
        let r = problem.is_some().then(|| self.node_ref(name));
        self.problem(&key, r, problem);
        Some(Action::CreateHostSubnet(objects::host_subnet(name, host_ip, subnet, subnet6)))
    }

    /// A Node's IPv6 subnet (dual-stack; `Ok(None)` without an IPv6 cluster network): a
    /// reservation for it first, else as for IPv4 by `nodeSubnets`: its IPv6 podCIDR
    /// (kube-controller-manager with an IPv6 `--cluster-cidr`), else the IPv6 allocator
    /// unless the cluster gives other Nodes IPv6 podCIDRs. `Err`: the problem (reason,
    /// message).
    fn decide_subnet6(&mut self, name: &str, node: &NodeInfo) -> Result<Option<Ipv6Net>, (&'static str, String)> {
        let Some(network) = self.cfg.network.ipv6.as_ref().map(|six| IpNet::V6(six.cluster_network)) else {
            return Ok(None);
        };
        let cluster_allocates = match self.cfg.node_subnets {
            NodeSubnets::Allocate => false,
            NodeSubnets::PodCidrs => true,
            NodeSubnets::Auto => self.nodes.values().any(|n| n.pod_cidr(&network).is_some()),
        };
        let pod_cidr = match self.cfg.node_subnets {
            NodeSubnets::Allocate => None,
            _ => node.pod_cidr(&network),
        };
        let Some(alloc) = self.subnets6.as_mut() else { return Ok(None) };
        let v6 = |s: IpNet| match s {
            IpNet::V6(s) => Ok(Some(s)),
            IpNet::V4(s) => Err(("SubnetConflict", format!("Node {name}: {s} is not an IPv6 subnet"))),
        };
        if let Some(s) = alloc.subnet_of(name) {
            return v6(s);
        }
        match pod_cidr {
            None if cluster_allocates => Err(("NoPodCIDR", format!("Node {name}: no IPv6 podCIDR yet{}; the cluster allocates them (kube-controller-manager --allocate-node-cidrs with an IPv6 --cluster-cidr): its HostSubnet has no IPv6 subnet until then", if node.bad_pod_cidrs.is_empty() { String::new() } else { format!(" (not CIDRs: {})", node.bad_pod_cidrs.join(", ")) }))),
            None => match alloc.allocate(name) {
                Some(s) => v6(s),
                None => {
                    let (used, all) = alloc.usage();
                    Err(("ClusterNetworkFull", format!("Node {name}: no free IPv6 subnet left in {network} ({used} of {all} taken); its HostSubnet has no IPv6 subnet")))
                }
            },
            Some(p) => {
                if !(network.contains(&p.network()) && network.contains(&p.broadcast())) {
                    return Err(("PodCIDROutsideClusterNetwork", format!("Node {name}: IPv6 podCIDR {p} is not inside the IPv6 cluster network {network}; its HostSubnet has no IPv6 subnet (fix kube-controller-manager's --cluster-cidr or the controller's --cluster-network-ipv6)")));
                }
                let others = alloc.overlapping(&p, name);
                if !others.is_empty() {
                    return Err(("SubnetConflict", format!("Node {name}: IPv6 podCIDR {p} overlaps the HostSubnet of {}; no IPv6 subnet", others.join(", "))));
                }
                alloc.mark(name, p);
                v6(p)
            }
        }
    }

    /// `auto`: whether the cluster gives Nodes podCIDRs (some Node has one), so that a Node
    /// without one waits rather than taking a subnet the cluster may hand out too.
    fn cluster_allocates(&self) -> bool {
        match self.cfg.node_subnets {
            NodeSubnets::Allocate => false,
            NodeSubnets::PodCidrs => true,
            NodeSubnets::Auto => {
                let network = self.cfg.network.cluster_network;
                self.nodes.values().any(|n| n.pod_cidr(&network).is_some())
            }
        }
    }

    fn ns_ref(&self, name: &str) -> ObjectReference {
        reference("Namespace", "v1", name, self.namespaces.get(name).and_then(|n| n.uid.clone()))
    }

    fn decide_namespace(&mut self, name: &str) -> Option<Action> {
        if self.plugin() == Plugin::Subnet {
            return None;
        }
        let key = Key::Namespace(name.to_string());
        let netns = self.net_namespaces.get(name).cloned();
        if !self.namespaces.contains_key(name) {
            self.problem(&key, None, None);
            return match netns {
                Some(n) => Some(Action::DeleteNetNamespace {
                    name: name.into(),
                    uid: n.metadata.uid.clone(),
                    rv: n.metadata.resource_version.clone(),
                }),
                None => {
                    self.vnids.unmark(name);
                    None
                }
            };
        }
        let Some(netns) = netns else {
            let vnid = match self.vnids.get(name) {
                Some(v) => v,
                None => match self.vnids.for_new(name, &self.cfg.global_namespaces) {
                    Ok(v) => v,
                    Err(e) => {
                        let r = self.ns_ref(name);
                        self.problem(&key, Some(r), Some(("NoFreeVNID", format!("Namespace {name}: {e}"))));
                        return None;
                    }
                },
            };
            self.vnids.mark(name, vnid);
            self.problem(&key, None, None);
            return Some(Action::CreateNetNamespace(objects::net_namespace(name, vnid)));
        };
        let value = annotations(&netns.metadata).get(vnids::CHANGE_NETWORK_ANNOTATION).cloned()?;
        let mut new = netns.clone();
        if let Some(a) = new.metadata.annotations.as_mut() {
            a.remove(vnids::CHANGE_NETWORK_ANNOTATION);
        }
        let r = self.ns_ref(name);
        if self.plugin() != Plugin::Multitenant {
            self.problem(&key, Some(r), Some(("ChangeNetworkRefused", format!("NetNamespace {name}: {}={value:?} ignored: the {} plugin does not allow NetNamespace renumbering (only multitenant does)", vnids::CHANGE_NETWORK_ANNOTATION, objects::plugin_name(self.plugin())))));
            return Some(Action::ReplaceNetNamespace(new));
        }
        let change = Change::parse(&value).and_then(|c| self.vnids.change(name, &c, &self.cfg.global_namespaces));
        match change {
            Err(e) => {
                self.problem(
                    &key,
                    Some(r),
                    Some((
                        "ChangeNetworkRefused",
                        format!("NetNamespace {name}: {e}; the annotation is removed and the VNID kept"),
                    )),
                );
            }
            Ok(None) => self.problem(&key, None, None),
            Ok(Some(vnid)) => {
                info!(namespace = name, change = %value, vnid, "multitenant change-network");
                self.vnids.mark(name, vnid);
                new.netid = u64::from(vnid).into();
                self.problem(&key, None, None);
            }
        }
        Some(Action::ReplaceNetNamespace(new))
    }

    /// The write of `action`, as a future of its outcome.
    fn write(&mut self, key: Key, action: Action) -> futures::future::BoxFuture<'static, Outcome> {
        let w = self.writer.clone();
        let apis = self.apis.clone();
        self.writes += 1;
        let pp = PostParams { field_manager: Some("sdn-node-controller".into()), ..Default::default() };
        let dp = |uid: Option<String>, rv: Option<String>| DeleteParams {
            preconditions: Some(Preconditions { uid, resource_version: rv }),
            ..Default::default()
        };
        async move {
            let r = match action {
                Action::CreateClusterNetwork(cn) => {
                    w.send(apis.cluster_networks.create(&pp, &cn)).await.map(Written::ClusterNetwork)
                }
                Action::ReplaceClusterNetwork(cn) => {
                    w.send(apis.cluster_networks.replace("default", &pp, &cn)).await.map(Written::ClusterNetwork)
                }
                Action::CreateHostSubnet(h) => w.send(apis.host_subnets.create(&pp, &h)).await.map(Written::HostSubnet),
                Action::ReplaceHostSubnet(h) => {
                    let name = h.metadata.name.clone().unwrap_or_default();
                    w.send(apis.host_subnets.replace(&name, &pp, &h)).await.map(Written::HostSubnet)
                }
                Action::DeleteHostSubnet { name, uid, rv } => {
                    w.send(apis.host_subnets.delete(&name, &dp(uid, rv))).await.map(|_| Written::HostSubnetGone(name))
                }
                Action::CreateNetNamespace(n) => {
                    w.send(apis.net_namespaces.create(&pp, &n)).await.map(Written::NetNamespace)
                }
                Action::ReplaceNetNamespace(n) => {
                    let name = n.metadata.name.clone().unwrap_or_default();
                    w.send(apis.net_namespaces.replace(&name, &pp, &n)).await.map(Written::NetNamespace)
                }
                Action::DeleteNetNamespace { name, uid, rv } => w
                    .send(apis.net_namespaces.delete(&name, &dp(uid, rv)))
                    .await
                    .map(|_| Written::NetNamespaceGone(name)),
            };
            (key, r)
        }
        .boxed()
    }

    /// A write's outcome into the caches; failures are retried with backoff.
    fn finish(&mut self, key: Key, result: Result<Written, WriteError>) {
        self.inflight.remove(&key);
        match result {
            Ok(w) => {
                self.attempts.remove(&key);
                match w {
                    Written::ClusterNetwork(cn) => {
                        info!(resource_version = %cn.metadata.resource_version.clone().unwrap_or_default(), "ClusterNetwork \"default\" written");
                        self.cluster_network = Some(cn);
                        self.dirty.insert(Key::ClusterNetwork);
                    }
                    Written::HostSubnet(h) => {
                        let subnet6 = objects::subnet6_of(&h).map(|s| s.to_string()).unwrap_or_default();
                        info!(node = %h.host, subnet = %h.subnet, subnet6 = %subnet6, host_ip = %h.host_ip, "HostSubnet written");
                        self.put(h);
                        // Nothing more to do for this key unless something changes.
                        self.dirty.remove(&key);
                    }
                    Written::HostSubnetGone(name) => {
                        info!(node = %name, "HostSubnet of a deleted Node deleted");
                        self.host_subnets.remove(&name);
                        self.subnets.unmark(&name);
                        if let Some(a) = self.subnets6.as_mut() {
                            a.unmark(&name);
                        }
                    }
                    Written::NetNamespace(n) => {
                        self.put(n);
                        self.dirty.remove(&key);
                    }
                    Written::NetNamespaceGone(name) => {
                        info!(namespace = %name, "NetNamespace of a deleted Namespace deleted");
                        self.net_namespaces.remove(&name);
                        self.vnids.unmark(&name);
                    }
                }
            }
            Err(WriteError::NotLeader) => {
                self.resync(&key, false);
                self.dirty.insert(key);
            }
            Err(e) => {
                let code = e.code();
                // 404 on a delete: already gone (the watch says so too). 409: the cache was
                // behind (AlreadyExists, or a stale resourceVersion): decide again once the
                // watch catches up. A timeout or 5xx: the outcome is unknown, the reservation
                // is kept for this name.
                let unknown = code.is_none_or(|c| c >= 500 || c == 429);
                self.resync(&key, unknown);
                if key == Key::ClusterNetwork && code != Some(409) {
                    // In /status and /readyz: e.g. a 403 when the ClusterRole lacks `update`
                    // (manifests older than the binary) while IPv6 is being added.
                    self.network_ok = Some(Err(format!("writing ClusterNetwork \"default\" failed ({e}); retrying")));
                }
                let n = self.attempts.entry(key.clone()).or_default();
                *n = n.saturating_add(1);
                let delay = match code {
                    Some(404) | Some(409) => Duration::from_millis(200),
                    _ => Duration::from_millis(500u64.saturating_mul(1 << (*n).min(6))).min(Duration::from_secs(30)),
                };
                if code != Some(409) || *n > 3 {
                    warn!(object = %key, error = %e, retry_in = ?delay, "write failed");
                }
                self.retry.entry(Instant::now() + delay).or_default().push(key);
            }
        }
    }

    /// After a failed write: the allocators hold what the caches say for this key's name
    /// (a reservation of unknown outcome is kept when `keep`).
    fn resync(&mut self, key: &Key, keep: bool) {
        match key {
            Key::Node(name) => {
                match self.host_subnets.get(name).and_then(|h| h.subnet.parse::<IpNet>().ok()) {
                    Some(s) => self.subnets.mark(name, s),
                    None if !keep => self.subnets.unmark(name),
                    None => {}
                }
                // An IPv6 subnet being added by a replace in flight stays reserved while a
                // watch event brings the HostSubnet as it was.
                let keep6 = keep || self.inflight.contains(key);
                if let Some(a) = self.subnets6.as_mut() {
                    match self.host_subnets.get(name).and_then(objects::subnet6_of) {
                        Some(s) => a.mark(name, IpNet::V6(s)),
                        None if !keep6 => a.unmark(name),
                        None => {}
                    }
                }
            }
            Key::Namespace(name) => match self.net_namespaces.get(name).and_then(objects::vnid_of) {
                Some(v) => self.vnids.mark(name, v),
                None if !keep => self.vnids.unmark(name),
                None => {}
            },
            Key::ClusterNetwork => {}
        }
    }

    fn due(&mut self) {
        let now = Instant::now();
        let later = self.retry.split_off(&(now + Duration::from_nanos(1)));
        let due = std::mem::replace(&mut self.retry, later);
        for (_, keys) in due {
            self.dirty.extend(keys);
        }
    }

    fn report(&self, leading: bool, in_flight: usize) {
        let Ok(mut s) = self.status.lock() else { return };
        s.leading = leading;
        s.synced = self.all_synced();
        s.cluster_network = match &self.network_ok {
            None => "not checked yet".into(),
            Some(Ok(())) => "ok".into(),
            Some(Err(e)) => e.clone(),
        };
        s.nodes = self.nodes.len();
        s.host_subnets = self.host_subnets.len();
        s.namespaces = self.namespaces.len();
        s.net_namespaces = self.net_namespaces.len();
        s.pending = self.dirty.len() + in_flight + self.retry.values().map(Vec::len).sum::<usize>();
        s.writes = self.writes;
        let (used, all) = self.subnets.usage();
        s.subnets_used = used as u64;
        s.subnets_total = u64::try_from(all).unwrap_or(u64::MAX);
        s.problems = self
            .problems
            .iter()
            .map(|(k, (reason, message))| Problem {
                object: k.to_string(),
                reason: reason.clone(),
                message: message.clone(),
            })
            .collect();
        s.updated = Some(Instant::now());
    }
}
