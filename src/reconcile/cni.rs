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
use std::sync::Arc;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::pods::{commit_reserved, finish_teardown, ready, refusal, remove_iface};
use super::Node;
use crate::api::{ApiError, CniRecord, PodRequest};
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
    let host_ns = hostnet::Netns::current().map_err(|e| ApiError::Failed(format!("the agent's own network namespace: {e}")))?;
    ready(node)?;
    // A warm port, if one is ready: the pod's interface and port then come from it.
    let mut taken = Taken { spares: &node.spares, spare: node.spares.take() };
    // Reserve an address and the names, all under one lock.
    let (pod, record, cluster) = {
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
        let ip = m.allocate_ip().map_err(refusal)?;
        let gateway = Ipv4Addr::from(u32::from(local.subnet.network()) + 1);
        let rec = CniRecord {
            netns: req.netns.clone(),
            if_name: req.if_name.clone(),
            address: format!("{ip}/{}", local.subnet.prefix_len()),
            gateway: gateway.to_string(),
            mtu,
        };
        let record = PodRequest {
            container_id: req.container_id.clone(),
            namespace: req.namespace.clone(),
            name: req.name.clone(),
            host_veth: taken.spare.as_ref().map(|(s, _, _)| s.name.clone()).unwrap_or_else(|| host_veth_name(&req.container_id)),
            ip: ip.to_string(),
            mac: mac_for(ip),
            // Bandwidth from the Pod's annotations (Kubernetes mode), as SetPodBandwidth.
            annotations: m.source().and_then(|l| l.pod_annotations.get(&key)).cloned().unwrap_or_default(),
            internal: false,
            cni: Some(rec),
        };
        let pod = record.to_pod().map_err(ApiError::Invalid)?;
        m.reserve(&pod).map_err(refusal)?;
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
            node.model().unreserve(&key);
            // setup_pod undid its own steps; a timeout may have left the veth.
            let _ = remove_iface(&pod.host_veth).await;
            return Err(IfaceError::from(failed).into_api(&req));
        }
    };
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
            let _ = remove_iface(&pod.host_veth).await;
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
    let ours = {
        let mut m = node.model();
        let same = |r: &PodRequest| r.container_id == req.container_id && r.cni.is_some();
        if m.api_pod(&key).is_some_and(|(_, r)| same(r)) {
            m.tear_down(&key);
            true
        } else {
            m.doomed(&key).is_some_and(|(_, r)| same(r))
        }
    };
    if ours {
        finish_teardown(node, &key, deadline).await?;
        return super::checkpoint::forgotten(node, &key, deadline).await;
    }
    // Not (or no longer) known: whatever a half-done ADD of this container left.
    if crate::model::ContainerId::parse(&req.container_id).is_ok() {
        remove_iface(&host_veth_name(&req.container_id)).await.map_err(|e| ApiError::Failed(format!("pod interface: {e}")))?;
    }
    // A retried DEL whose first attempt could not write the checkpoint writes it now.
    super::checkpoint::forgotten(node, &key, deadline).await
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
