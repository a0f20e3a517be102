//! The agent's side of the CNI plugin (`sdn-node-cni` forwards ADD, DEL and CHECK here, as
//! openshift-sdn's plugin did to its CNI server): IPAM, the pod's veth, its port and its
//! flows, as one request with one deadline.
//!
//! - ADD: the pod's VNID comes from its namespace in the model; an address is allocated from
//!   this node's HostSubnet and *reserved in the model* before anything is created (so two ADDs
//!   never get the same address); the veth is created (host end named from the container ID, the
//!   pod end moved into the sandbox, MAC `0a:58:` + the IPv4 bytes as openshift-sdn derives it,
//!   MTU from the cluster state, address, routes, TX checksum offload off); then port, record and
//!   flows exactly as a pod API setup. The address is recorded in the pod's record on its OVS
//!   port, written in the port's OVSDB transaction: the port and its address exist together or
//!   not at all, and a restarted agent knows every address in use. Any failure undoes every step.
//! - DEL: idempotent. A known pod is torn down (flows, port, veth); an unknown one still gets its
//!   veth removed by the name its container ID gives (a setup that died halfway).
//! - Both are durable before they are answered: an ADD's pod is in the agent's checkpoint
//!   ([`super::checkpoint`]; the ADD is undone if it cannot be written), a DEL's pod is no longer.
//! - CHECK: the pod is known with this container, its flows are desired and the switch is in
//!   sync, and the interface in the sandbox is as ADD made it.

use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::pods::{commit_reserved, finish_teardown, ready, refusal, remove_pod_iface};
use super::Node;
use crate::api::{ApiError, CniRecord, PodRequest, SandboxId};
use crate::cluster::state_file::{dns1123_label, dns1123_subdomain};
use crate::cluster::Problem;

/// A request from the plugin.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CniRequest {
    pub command: String,
    #[serde(rename = "containerID")]
    pub container_id: String,
    #[serde(default)]
    pub netns: String,
    pub if_name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, rename = "infraContainerID")]
    pub infra_container_id: String,
    #[serde(default)]
    pub cni_version: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Route {
    pub dst: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
}

/// ADD's answer, from which the plugin prints the CNI result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CniReply {
    pub host_veth: String,
    pub if_name: String,
    pub mac: String,
    pub sandbox: String,
    pub ip: String,
    pub gateway: String,
    pub routes: Vec<Route>,
    pub mtu: u32,
}

/// The host end of a container's veth: derived from the container ID, so that a DEL finds it
/// even when the ADD that created it never completed.
pub fn host_veth_name(container_id: &str) -> String {
    let hex: String = container_id.chars().filter(|c| c.is_ascii_hexdigit()).take(11).collect();
    format!("veth{hex}")
}

/// openshift-sdn's MAC for a pod IP: `0a:58:` followed by the address's four bytes.
pub fn mac_for(ip: Ipv4Addr) -> String {
    let o = ip.octets();
    format!("0a:58:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3])
}

fn obj(r: &CniRequest) -> String {
    format!("pod {}/{}", r.namespace, r.name)
}

pub fn validate(r: &CniRequest) -> Result<(), ApiError> {
    let bad = |field: &str, m: String| Err(ApiError::Invalid(Problem::new(obj(r), field, m)));
    if !dns1123_label(&r.namespace) {
        return bad("namespace", format!("{:?} is not a DNS-1123 label", r.namespace));
    }
    if !dns1123_subdomain(&r.name) {
        return bad("name", format!("{:?} is not a DNS-1123 subdomain", r.name));
    }
    if let Err(e) = crate::model::ContainerId::parse(&r.container_id) {
        return bad("containerID", e);
    }
    if r.if_name.is_empty() || r.if_name.len() > 15 || !r.if_name.bytes().all(|b| b.is_ascii_graphic() && b != b'/' && b != b':') {
        return bad("ifName", format!("{:?} is not an interface name", r.if_name));
    }
    Ok(())
}

/// Serves one CNI request.
pub async fn handle(node: &Arc<Node>, req: CniRequest) -> Result<Option<CniReply>, ApiError> {
    match req.command.as_str() {
        "ADD" => add(node, req).await.map(Some),
        "DEL" => del(node, req).await.map(|_| None),
        "CHECK" => check(node, req).await.map(|_| None),
        other => Err(ApiError::Invalid(Problem::new(obj(&req), "command", format!("{other:?} is not ADD, DEL or CHECK")))),
    }
}

fn reply_of(rec: &CniRecord, host_veth: &str, mac: &str, cluster: Ipv4Net) -> CniReply {
    CniReply {
        host_veth: host_veth.to_string(),
        if_name: rec.if_name.clone(),
        mac: mac.to_string(),
        sandbox: rec.netns.clone(),
        ip: rec.address.clone(),
        gateway: rec.gateway.clone(),
        routes: vec![
            Route { dst: "0.0.0.0/0".into(), gw: Some(rec.gateway.clone()) },
            Route { dst: cluster.to_string(), gw: None },
            Route { dst: "224.0.0.0/4".into(), gw: None },
        ],
        mtu: rec.mtu,
    }
}

async fn add(node: &Arc<Node>, req: CniRequest) -> Result<CniReply, ApiError> {
    let deadline = crate::api::deadline::current(node.cfg.request_timeout);
    validate(&req)?;
    let key = (req.namespace.clone(), req.name.clone());
    let pod_ns = crate::api::sandbox::open(node, &obj(&req), &req.netns).await?;
    let sandbox: SandboxId =
        pod_ns.id().map_err(|e| ApiError::Failed(format!("{}: the identity of its sandbox: {e}", obj(&req))))?.into();
    let host_ns = hostnet::Netns::current().map_err(|e| ApiError::Failed(format!("the agent's own network namespace: {e}")))?;
    ready(node)?;
    // One pod per sandbox: records of pods in it whose sandbox is gone (its inode reused) do
    // not count.
    let stale = stale_holders(node, sandbox, &req, &key).await?;
    // A warm port, if one is ready: the pod's interface and port then come from it.
    let mut taken = Taken { spares: &node.spares, spare: node.spares.take() };
    // The host end's name comes from the container ID, unless an interface has it already (a
    // name shared with another container's, or anyone's): then another name, never a deletion.
    let derived = host_veth_name(&req.container_id);
    let derived_free = taken.spare.is_some() || matches!(hostnet::owned::ifindex(&host_ns, &derived).await, Ok(None));
    // Reserve an address and the names, all under one lock.
    let (pod, mut record, cluster) = {
        let mut m = node.model();
        let Some(st) = m.effective() else { return Err(ApiError::Unavailable("no cluster state yet".into())) };
        let cluster = st.cluster_network;
        let mtu = st.mtu;
        let Some(local) = st.local_subnet().cloned() else { return Err(ApiError::Unavailable("no HostSubnet for this node".into())) };
        // A repeated ADD of the same container answers what the first one did.
        if let Some((p, r)) = m.api_pod(&key) {
            return match &r.cni {
                Some(rec) if r.container_id == req.container_id => Ok(reply_of(rec, &p.host_veth, &p.mac.to_string(), cluster)),
                _ => Err(ApiError::Conflict(Problem::new(obj(&req), "containerID", "the pod is set up with another container; DEL it first"))),
            };
        }
        let (reserved, recorded) = m.sandbox_holders(sandbox, &req.netns);
        let holder = reserved.or_else(|| recorded.into_iter().map(|(k, _)| k).find(|k| !stale.contains(k)));
        if let Some(k) = holder.filter(|k| *k != key) {
            return Err(sandbox_taken(&req, &k));
        }
        let host_veth = match &taken.spare {
            Some((s, _, _)) => s.name.clone(),
            None if derived_free && !m.host_veth_taken(&derived) => derived.clone(),
            None => hostnet::pod::random_veth_name().map_err(|e| ApiError::Failed(format!("a name for the pod's interface: {e}")))?,
        };
        let ip = m.allocate_ip().map_err(refusal)?;
        let gateway = Ipv4Addr::from(u32::from(local.subnet.network()) + 1);
        let rec = CniRecord {
            netns: req.netns.clone(),
            if_name: req.if_name.clone(),
            address: format!("{ip}/{}", local.subnet.prefix_len()),
            gateway: gateway.to_string(),
            mtu,
            sandbox: Some(sandbox),
            // Known once the interface is made (below).
            host_ifindex: None,
        };
        let record = PodRequest {
            container_id: req.container_id.clone(),
            namespace: req.namespace.clone(),
            name: req.name.clone(),
            host_veth,
            ip: ip.to_string(),
            mac: mac_for(ip),
            // Bandwidth from the Pod's annotations (Kubernetes mode), as SetPodBandwidth.
            annotations: m.source().and_then(|l| l.pod_annotations.get(&key)).cloned().unwrap_or_default(),
            internal: false,
            cni: Some(rec),
        };
        let pod = record.to_pod().map_err(ApiError::Invalid)?;
        m.reserve(&pod).map_err(refusal)?;
        m.reserve_sandbox(&key, sandbox);
        (pod, record, cluster)
    };
    let Some(rec) = record.cni.clone() else { return Err(ApiError::Failed("no CNI record".into())) };
    let cfg = hostnet::PodConfig {
        ifname: rec.if_name.clone(),
        mac: record.mac.parse().ok(),
        mtu: rec.mtu,
        address: rec.address.parse().map_err(|_| ApiError::Failed(format!("address {}", rec.address)))?,
        gateway: rec.gateway.parse().map_err(|_| ApiError::Failed(format!("gateway {}", rec.gateway)))?,
        cluster_network: cluster,
        extra_routes: vec![],
        host_ifname: Some(pod.host_veth.clone()),
    };
    // A DEL of a pod of this sandbox may still be deleting its interface.
    drop(tokio::time::timeout_at(deadline, node.locks.lock(&super::pods::sandbox_lock(&req.netns))).await);
    // From here this ADD owns the spare: used, or destroyed with whatever failed.
    if let Some((spare, hold, ahead)) = taken.spare.take() {
        // The spare's host end is the agent's (it made it): its ifindex is the record's.
        if let Some(c) = record.cni.as_mut() {
            c.host_ifindex = hostnet::owned::ifindex(&host_ns, &spare.name).await.ok().flatten();
        }
        let r = add_warm(node, &pod, record, &cfg, (&spare, &hold, ahead), (&host_ns, &pod_ns), deadline).await;
        // The pod's now, or undone with it.
        node.spares.release(&spare.name);
        let iface = r.map_err(|e| e.into_api(&req))?;
        super::checkpoint::recorded(node, &key, deadline).await?;
        return Ok(reply_of(&rec, &iface.host_veth, &iface.mac.to_string(), cluster));
    }
    // A DEL of the same container may still be deleting the veth of that name.
    drop(tokio::time::timeout_at(deadline, node.locks.lock(&pod.host_veth)).await);
    let created = tokio::time::timeout_at(deadline, hostnet::setup_pod(&host_ns, &pod_ns, &cfg)).await;
    let iface = match created {
        Ok(Ok(i)) => i,
        failed => {
            // setup_pod undid its own steps; a timeout may have left the veth (and an
            // interface that had the name already is someone else's: left alone).
            undo_made(&host_ns, &pod.host_veth, &pod_ns, &cfg.ifname).await;
            node.model().unreserve(&key);
            return Err(IfaceError::from(failed).into_api(&req));
        }
    };
    // What a DEL or teardown may delete later: this interface, by its ifindex.
    match hostnet::veth_state(&host_ns, &iface.host_veth, None, &pod_ns, &cfg.ifname).await {
        Ok(hostnet::VethState::Paired { host_index }) => {
            if let Some(c) = record.cni.as_mut() {
                c.host_ifindex = Some(host_index);
            }
        }
        other => {
            undo_made(&host_ns, &pod.host_veth, &pod_ns, &cfg.ifname).await;
            node.model().unreserve(&key);
            return Err(ApiError::Failed(format!("{}: the interface just made is not there as made: {other:?}", obj(&req))));
        }
    }
    // The host end is a switch port, not an IP interface: it must never answer ARP for the
    // node's addresses (on the userspace datapath the kernel sees its packets too, and would
    // answer for the gateway, bypassing the pipeline). (A spare's was set when it was made.)
    if let Err(e) = hostnet::sysctl::write(&["net", "ipv4", "conf", &iface.host_veth, "arp_ignore"], "8") {
        tracing::warn!(veth = %iface.host_veth, error = %e, "could not set arp_ignore on the host veth");
    }
    let mac = iface.mac.to_string();
    tracing::debug!(pod = %obj(&req), "fresh pod interface ready");
    commit_reserved(node, pod.clone(), record, deadline, None).await?;
    // Durable before it is answered (undone if it cannot be).
    super::checkpoint::recorded(node, &key, deadline).await?;
    Ok(reply_of(&rec, &iface.host_veth, &mac, cluster))
}

/// Why an ADD failed: making the pod's interface, or the rest.
enum IfaceError {
    Iface(hostnet::Error),
    Timeout,
    Api(ApiError),
}

impl From<Result<hostnet::Result<hostnet::PodInterface>, tokio::time::error::Elapsed>> for IfaceError {
    fn from(r: Result<hostnet::Result<hostnet::PodInterface>, tokio::time::error::Elapsed>) -> Self {
        match r {
            Ok(Err(e)) => IfaceError::Iface(e),
            Ok(Ok(_)) | Err(_) => IfaceError::Timeout,
        }
    }
}

impl IfaceError {
    fn into_api(self, req: &CniRequest) -> ApiError {
        match self {
            IfaceError::Iface(e @ hostnet::Error::Exists { .. }) => ApiError::Conflict(Problem::new(obj(req), "ifName", e.to_string())),
            IfaceError::Iface(e) => ApiError::Failed(format!("pod interface: {e}")),
            IfaceError::Timeout => ApiError::Timeout("creating the pod interface took too long".into()),
            IfaceError::Api(e) => e,
        }
    }
}

/// ADD on a warm port ([`super::spares`]): the kernel moves the spare into the sandbox while
/// OVSDB records the pod on the spare's port and the switch commits its flows — the flows need
/// the port's ofport, not the interface — so the ADD costs the longer of the two rather than
/// their sum (the kernel's move, ~20 ms, and ovs-vswitchd's pass over the port's new record and
/// its reaction to the spare's carrier coming up, which the flow commit waits behind). Either
/// failing undoes both.
async fn add_warm(
    node: &Arc<Node>,
    pod: &crate::cluster::Pod,
    record: PodRequest,
    cfg: &hostnet::PodConfig,
    (spare, hold, ahead): (&super::spares::Spare, &hostnet::Netns, usize),
    (host_ns, pod_ns): (&hostnet::Netns, &hostnet::Netns),
    deadline: Instant,
) -> Result<hostnet::PodInterface, IfaceError> {
    let key = pod.key();
    let claim = async {
        let t = Instant::now();
        let r = tokio::time::timeout_at(deadline, hostnet::claim_spare(host_ns, hold, pod_ns, &spare.name, cfg)).await;
        node.spares.moved(t.elapsed(), ahead);
        r
    };
    let made = record.clone();
    let (moved, committed) = tokio::join!(claim, commit_reserved(node, pod.clone(), record, deadline, Some(spare.ofport)));
    tracing::debug!(pod = %format!("{}/{}", key.0, key.1), ahead, "warm port claimed");
    match (moved, committed) {
        (Ok(Ok(iface)), Ok(_)) => Ok(iface),
        (moved, Ok(_)) => {
            // On the switch without its interface: torn down as a DEL would.
            node.model().tear_down(&key);
            let _ = finish_teardown(node, &key, Instant::now() + std::time::Duration::from_secs(2)).await;
            Err(IfaceError::from(moved))
        }
        (_, Err(e)) => {
            // commit_reserved undid the port and flows, and deleted the interface if it was
            // there yet; a move that finished after that is deleted now.
            let _ = remove_pod_iface(&made).await;
            Err(IfaceError::Api(e))
        }
    }
}

/// A warm port taken for one ADD: back to the pool if the ADD returns before using it.
struct Taken<'a> {
    spares: &'a super::spares::Spares,
    spare: Option<(super::spares::Spare, hostnet::Netns, usize)>,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if let Some((s, _, _)) = self.spare.take() {
            self.spares.put_back(s);
        }
    }
}

async fn del(node: &Arc<Node>, req: CniRequest) -> Result<(), ApiError> {
    let deadline = crate::api::deadline::current(node.cfg.request_timeout);
    let key = (req.namespace.clone(), req.name.clone());
    // The pod this DEL is for: the one whose record has this full container ID and interface
    // name; the pod's namespace and name, when the request gives them (CNI_ARGS), must match.
    let unnamed = req.namespace.is_empty() && req.name.is_empty();
    let target = node.model().cni_pod_of_container(&req.container_id).filter(|(k, r)| {
        (unnamed || *k == key) && r.cni.as_ref().is_some_and(|c| c.if_name == req.if_name)
    });
    if let Some((k, _)) = target {
        {
            let mut m = node.model();
            if m.is_api_pod(&k) {
                m.tear_down(&k);
            }
        }
        finish_teardown(node, &k, deadline).await?;
        return super::checkpoint::forgotten(node, &k, deadline).await;
    }
    // Not (or no longer) known: whatever a half-done ADD of this container left.
    if crate::model::ContainerId::parse(&req.container_id).is_ok() {
        remove_unrecorded(node, &req).await?;
    }
    // A retried DEL whose first attempt could not write the checkpoint writes it now.
    super::checkpoint::forgotten(node, &key, deadline).await
}

/// What an ADD of `req`'s container that died before its pod was recorded may have left: the
/// veth under the name the container ID gives — only if no pod (set up, being set up or torn
/// down) has that name, and only if it is paired with `req`'s interface in `req`'s sandbox:
/// never an interface that merely has the name (another container's ID may give it too).
async fn remove_unrecorded(node: &Arc<Node>, req: &CniRequest) -> Result<(), ApiError> {
    let name = host_veth_name(&req.container_id);
    if node.model().host_veth_taken(&name) || node.spares.owns(&name) || req.netns.is_empty() {
        return Ok(());
    }
    // A sandbox that is gone (or not a sandbox) took whatever was paired into it with it.
    let Ok(sandbox) = crate::api::sandbox::open(node, &obj(req), &req.netns).await else { return Ok(()) };
    let host = hostnet::Netns::current().map_err(|e| ApiError::Failed(format!("the agent's own network namespace: {e}")))?;
    let failed = |e: hostnet::Error| ApiError::Failed(format!("{}: pod interface {name}: {e}", obj(req)));
    match hostnet::veth_state(&host, &name, None, &sandbox, &req.if_name).await.map_err(failed)? {
        hostnet::VethState::Paired { host_index } => {
            let _g = node.locks.lock(&name).await;
            hostnet::delete_owned(&host, &name, Some(host_index)).await.map(|_| ()).map_err(failed)
        }
        _ => Ok(()),
    }
}

/// Undoes an interface a failed ADD may have made: `name` in the host namespace, if it is
/// paired with `ifname` in `sandbox` (setup_pod checked `ifname` was free there first, and
/// the sandbox is this ADD's alone, so such a pair is this ADD's).
async fn undo_made(host: &hostnet::Netns, name: &str, sandbox: &hostnet::Netns, ifname: &str) {
    if let Ok(hostnet::VethState::Paired { host_index }) = hostnet::veth_state(host, name, None, sandbox, ifname).await {
        if let Err(e) = hostnet::delete_owned(host, name, Some(host_index)).await {
            tracing::warn!(veth = %name, error = %e, "could not remove a failed ADD's interface; a DEL of the container removes it");
        }
    }
}

/// 409: `req`'s sandbox holds pod `holder` already.
fn sandbox_taken(req: &CniRequest, holder: &crate::cluster::PodKey) -> ApiError {
    ApiError::Conflict(Problem::new(
        obj(req),
        "netns",
        format!("sandbox {:?} holds pod {}/{} already: one pod per sandbox", req.netns, holder.0, holder.1),
    ))
}

/// The pods recorded in `sandbox` whose record is stale: their namespace is gone and another
/// one got its inode. 409 if a live one is there (other than `key`, whose repeated ADD
/// answers what the first one did).
async fn stale_holders(
    node: &Node,
    sandbox: SandboxId,
    req: &CniRequest,
    key: &crate::cluster::PodKey,
) -> Result<std::collections::HashSet<crate::cluster::PodKey>, ApiError> {
    let (reserved, recorded) = node.model().sandbox_holders(sandbox, &req.netns);
    if let Some(k) = reserved.filter(|k| k != key) {
        return Err(sandbox_taken(req, &k));
    }
    let mut stale = std::collections::HashSet::new();
    for (k, c) in recorded {
        if k == *key {
            continue;
        }
        let want = c.sandbox.unwrap_or(sandbox);
        let path = c.netns.clone();
        let look = tokio::task::spawn_blocking(move || std::fs::metadata(&path).map(|m| SandboxId { dev: m.dev(), ino: m.ino() }));
        match tokio::time::timeout(std::time::Duration::from_secs(2), look).await {
            Ok(Ok(Ok(id))) if id != want => {}
            Ok(Ok(Err(e))) if e.kind() == std::io::ErrorKind::NotFound => {}
            // Still that namespace (or it cannot be told): the pod is live there.
            _ => return Err(sandbox_taken(req, &k)),
        }
        stale.insert(k);
    }
    Ok(stale)
}

async fn check(node: &Arc<Node>, req: CniRequest) -> Result<(), ApiError> {
    validate(&req)?;
    let key = (req.namespace.clone(), req.name.clone());
    let (pod, rec) = {
        let m = node.model();
        match m.api_pod(&key) {
            Some((p, r)) if r.container_id == req.container_id && r.cni.is_some() => (p.clone(), r.cni.clone().unwrap_or_default()),
            _ => return Err(ApiError::NotFound(format!("{} is not set up with container {}", obj(&req), req.container_id))),
        }
    };
    let ofport_known = node.model().ports().contains_key(&key);
    let engine = node.engine_ready().ok_or_else(|| ApiError::Unavailable("the switch is not connected or not synced".into()))?;
    let owner = crate::store::Owner::Pod { namespace: pod.namespace.clone(), name: pod.name.clone() };
    let (desired, installed, dirty) = engine.snapshot().await.map_err(|e| ApiError::Unavailable(e.to_string()))?;
    let flows = desired.flows_of(&owner);
    let want = flows.len();
    let on_switch = flows.iter().filter(|c| installed.get(&c.key).is_some()).count();
    if !ofport_known || want == 0 || dirty || on_switch != want {
        return Err(ApiError::Failed(format!("{}: its flows are not on the switch ({want} desired)", obj(&req))));
    }
    let ns = crate::api::sandbox::open(node, &obj(&req), &rec.netns).await?;
    let address: Ipv4Net = rec.address.parse().map_err(|_| ApiError::Failed("bad recorded address".into()))?;
    let cfg = hostnet::PodConfig {
        ifname: rec.if_name.clone(),
        mac: None,
        mtu: rec.mtu,
        address,
        gateway: rec.gateway.parse().map_err(|_| ApiError::Failed("bad recorded gateway".into()))?,
        cluster_network: node.model().effective().map(|s| s.cluster_network).unwrap_or(address),
        extra_routes: vec![],
        host_ifname: None,
    };
    hostnet::check_pod(&ns, &req.if_name, address, Some(hostnet::MacAddr(pod.mac.0)), &cfg.routes())
        .await
        .map_err(|e| ApiError::Failed(format!("{}: {e}", obj(&req))))
}
