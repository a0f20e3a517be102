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
//! - Dual-stack: when this node's HostSubnet has an IPv6 subnet, every ADD also gets one IPv6
//!   address from it ([`crate::node::NodeState::allocate_ip6`], reserved with the IPv4 one), its
//!   gateway ([`crate::pipeline::gateway6`]) and routes (default, the IPv6 cluster network and
//!   `ff00::/8`); the reply lists both families. The MAC stays `0a:58:` + the IPv4 bytes (one
//!   MAC per interface, as openshift-sdn's rule gives it: the IPv6 address does not change it).
//!   The interface is ready only once duplicate address detection is over: an address another
//!   station on the link holds fails the ADD (409, field `ips`), undone like any other failure;
//!   IPAM's cursor has moved past that address, so a retry gets another one.
//! - IPv6-only: a node whose HostSubnet has only an IPv6 subnet gives each pod one IPv6
//!   address (and no IPv4 one); its MAC is `0a:58:` + the address's last four bytes
//!   ([`crate::domain::pod_mac`]), and its record's `ip` is that IPv6 address.
//! - DEL: idempotent. A known pod is torn down (flows, port, veth); an unknown one still gets its
//!   veth removed by the name its container ID gives (a setup that died halfway).
//! - Both are durable before they are answered: an ADD's pod is in the agent's checkpoint
//!   ([`super::checkpoint`]; the ADD is undone if it cannot be written), a DEL's pod is no longer.
//! - CHECK: the pod is known with this container, its flows are desired and the switch is in
//!   sync, and the interface in the sandbox is as ADD made it.

use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use tokio::time::Instant;

use super::setup::ready;
use super::teardown::finish_teardown;
use super::undo::{Step, Undo};
use super::Pods;
use crate::node::record::{CniIpv6, CniRecord, PodRecord, SandboxId};
use super::PodError;
use crate::cluster::validate::{dns1123_label, dns1123_subdomain};
use crate::cluster::Problem;
use crate::node::faults::FaultPoint;

/// A request from the plugin (the contract is the plugin crate's [`sdn_node_cni::wire`]).
pub use sdn_node_cni::wire::Request as CniRequest;
/// ADD's answer, from which the plugin prints the CNI result.
pub use sdn_node_cni::wire::{AddReply as CniReply, IpConfig, Route};

/// Opens `netns` as the sandbox of `object` (e.g. "pod team-a/web"), only if it is a pod's
/// network namespace: see [`hostnet::Netns::open_sandbox`] for what is refused and why.
/// Refusals are the request's fault (field `netns`); failing to look is the agent's.
async fn open_sandbox(pods: &Pods, object: &str, netns: &str) -> Result<hostnet::Netns, PodError> {
    let forbidden: Vec<hostnet::NsId> = pods.spares.hold_id().into_iter().collect();
    hostnet::Netns::open_sandbox(netns, &forbidden).await.map_err(|e| match e {
        hostnet::SandboxError::Refused(m) => PodError::Invalid(Problem::new(object, "netns", m)),
        hostnet::SandboxError::Failed(e) => PodError::Failed(format!("{object}: opening its sandbox: {e}")),
    })
}

/// The host end of a container's veth: derived from the container ID, so that a DEL finds it
/// even when the ADD that created it never completed.
pub fn host_veth_name(container_id: &str) -> String {
    let hex: String = container_id.chars().filter(|c| c.is_ascii_hexdigit()).take(11).collect();
    format!("veth{hex}")
}


fn obj(r: &CniRequest) -> String {
    format!("pod {}/{}", r.namespace, r.name)
}

pub fn validate(r: &CniRequest) -> Result<(), PodError> {
    let bad = |field: &str, m: String| Err(PodError::Invalid(Problem::new(obj(r), field, m)));
    if !dns1123_label(&r.namespace) {
        return bad("namespace", format!("{:?} is not a DNS-1123 label", r.namespace));
    }
    if !dns1123_subdomain(&r.name) {
        return bad("name", format!("{:?} is not a DNS-1123 subdomain", r.name));
    }
    if let Err(e) = crate::domain::ContainerId::parse(&r.container_id) {
        return bad("containerID", e);
    }
    // The workspace's one interface-name rule, which the plugin and hostnet apply too (so "."
    // and "..", which hostnet refuses, are refused here, before anything is reserved).
    if netif::check_ifname(&r.if_name).is_err() {
        return bad("ifName", format!("{:?} is not an interface name", r.if_name));
    }
    Ok(())
}

/// Serves one CNI request.
pub async fn handle(pods: &Pods, req: CniRequest, deadline: Instant) -> Result<Option<CniReply>, PodError> {
    match req.command.as_str() {
        "ADD" => add(pods, req, deadline).await.map(Some),
        "DEL" => del(pods, req, deadline).await.map(|_| None),
        "CHECK" => check(pods, req).await.map(|_| None),
        other => Err(PodError::Invalid(Problem::new(obj(&req), "command", format!("{other:?} is not ADD, DEL or CHECK")))),
    }
}

/// The pod's interface as hostnet makes and checks it, from the pod's CNI record: `cluster`
/// and `cluster6` are the cluster networks (`None`: not known, the pod's own subnet stands for
/// it). The record's first address is IPv4 (with an IPv6 part: a dual-stack interface) or, on
/// an IPv6-only node, IPv6 alone.
fn pod_config(
    rec: &CniRecord,
    mac: Option<netif::MacAddr>,
    (cluster, cluster6): (Option<Ipv4Net>, Option<Ipv6Net>),
    host_ifname: Option<String>,
) -> Result<hostnet::PodConfig, PodError> {
    let v6 = |address: Ipv6Net, gateway| hostnet::PodIpv6 { address, gateway, cluster_network: cluster6.unwrap_or(address.trunc()) };
    let (ipv4, ipv6) = match (rec.address, rec.gateway, rec.ipv6) {
        (IpNet::V4(address), IpAddr::V4(gateway), second) => (
            Some(hostnet::PodIpv4 { address, gateway, cluster_network: cluster.unwrap_or(address), extra_routes: vec![] }),
            second.map(|s| v6(s.address, s.gateway)),
        ),
        (IpNet::V6(address), IpAddr::V6(gateway), None) => (None, Some(v6(address, gateway))),
        _ => return Err(PodError::Failed(format!("address {} (gateway {}): not one family, or a second IPv6 part", rec.address, rec.gateway))),
    };
    Ok(hostnet::PodConfig { ifname: rec.if_name.clone(), mac, mtu: rec.mtu, ipv4, host_ifname, ipv6 })
}

/// ADD's answer: the interface `cfg` describes (its addresses, gateways and routes, of both
/// families for a dual-stack pod: IPv4 first, as `ip`/`gateway` for plugins before `ips`
/// need; an IPv6-only pod's one IPv6 address), with host end `host_veth` and MAC `mac`, in
/// sandbox `sandbox`.
fn reply_of(cfg: &hostnet::PodConfig, host_veth: &str, mac: netif::MacAddr, sandbox: &str) -> CniReply {
    let routes4 = cfg.routes().into_iter().map(|r| Route { dst: Some(r.dst.into()), gw: r.via.map(IpAddr::from) });
    let routes6 = cfg.routes6().into_iter().map(|r| Route { dst: Some(r.dst.into()), gw: r.via.map(IpAddr::from) });
    let mut ips: Vec<IpConfig> =
        cfg.ipv4.iter().map(|v4| IpConfig { address: Some(v4.address.into()), gateway: Some(v4.gateway.into()) }).collect();
    ips.extend(cfg.ipv6.as_ref().map(|v6| IpConfig { address: Some(v6.address.into()), gateway: Some(v6.gateway.into()) }));
    CniReply {
        host_veth: Some(host_veth.to_string()),
        if_name: Some(cfg.ifname.clone()),
        mac: Some(mac),
        sandbox: Some(sandbox.to_string()),
        routes: routes4.chain(routes6).collect(),
        mtu: Some(cfg.mtu),
        ..Default::default()
    }
    .with_ips(ips)
}

async fn add(pods: &Pods, req: CniRequest, deadline: Instant) -> Result<CniReply, PodError> {
    validate(&req)?;
    let key = (req.namespace.clone(), req.name.clone());
    // Every step from here is recorded as it is taken, and undone together if one fails.
    let mut undo = Undo::new(pods, key.clone());
    let r = add_steps(pods, &req, key, deadline, &mut undo).await;
    undo.finish(r).await
}

/// The steps of an ADD, each recorded in `undo` as it is taken.
async fn add_steps<'a>(pods: &'a Pods, req: &CniRequest, key: crate::cluster::PodKey, deadline: Instant, undo: &mut Undo<'a>) -> Result<CniReply, PodError> {
    let req = req.clone();
    let pod_ns = open_sandbox(pods, &obj(&req), &req.netns).await?;
    let sandbox: SandboxId =
        pod_ns.id().map_err(|e| PodError::Failed(format!("{}: the identity of its sandbox: {e}", obj(&req))))?.into();
    let host_ns = hostnet::Netns::current().map_err(|e| PodError::Failed(format!("the agent's own network namespace: {e}")))?;
    ready(pods)?;
    // One pod per sandbox: records of pods in it whose sandbox is gone (its inode reused) do
    // not count.
    let stale = stale_holders(pods, sandbox, &req, &key).await?;
    // A warm port, if one is ready: the pod's interface and port then come from it.
    let mut taken = pods.spares.take();
    if let Some((spare, _, _)) = &taken {
        undo.done(Step::Spare { spare: spare.clone(), claimed: false });
    }
    // The host end's name comes from the container ID, unless an interface has it already (a
    // name shared with another container's, or anyone's): then another name, never a deletion.
    let derived = host_veth_name(&req.container_id);
    let derived_free = taken.is_some() || matches!(hostnet::owned::ifindex(&host_ns, &derived).await, Ok(None));
    // Reserve an address and the names, all under one lock.
    let (pod, mut record, cluster) = {
        let mut m = pods.state.lock();
        let Some(st) = m.effective() else { return Err(PodError::NotReady("no cluster state yet".into())) };
        let cluster = (st.cluster_network, st.cluster_network6);
        let mtu = st.mtu;
        let Some(local) = st.local_subnet().cloned() else { return Err(PodError::NotReady("no HostSubnet for this node".into())) };
        // A repeated ADD of the same container answers what the first one did.
        if let Some((p, r)) = m.api_pod(&key) {
            return match &r.cni {
                Some(rec) if r.container_id == req.container_id => {
                    pod_config(rec, None, cluster, None).map(|cfg| reply_of(&cfg, &p.host_veth, p.mac, &rec.netns))
                }
                _ => Err(PodError::Conflict(Problem::new(obj(&req), "containerID", "the pod is set up with another container; DEL it first"))),
            };
        }
        let (reserved, recorded) = m.sandbox_holders(sandbox, &req.netns);
        let holder = reserved.or_else(|| recorded.into_iter().map(|(k, _)| k).find(|k| !stale.contains(k)));
        if let Some(k) = holder.filter(|k| *k != key) {
            return Err(sandbox_taken(&req, &k));
        }
        let host_veth = match &taken {
            Some((s, _, _)) => s.name.clone(),
            None if derived_free && !m.host_veth_taken(&derived) => derived.clone(),
            None => hostnet::pod::random_veth_name().map_err(|e| PodError::Failed(format!("a name for the pod's interface: {e}")))?,
        };
        // An address of each family the node has, reserved with the pod below (under this lock).
        let ip = m.allocate_ip().map_err(PodError::from)?;
        let ip6 = m.allocate_ip6().map_err(PodError::from)?;
        let v4 = match (ip, local.subnet) {
            (Some(ip), Some(subnet)) => Some((
                IpNet::from(Ipv4Net::new(ip, subnet.prefix_len()).map_err(|e| PodError::Failed(format!("address {ip}: {e}")))?),
                IpAddr::from(crate::pipeline::gateway(subnet)),
            )),
            _ => None,
        };
        let v6 = match (ip6, local.subnet6) {
            (Some(ip6), Some(subnet6)) => Some(CniIpv6 {
                address: Ipv6Net::new(ip6, subnet6.prefix_len()).map_err(|e| PodError::Failed(format!("address {ip6}: {e}")))?,
                gateway: crate::pipeline::gateway6(subnet6),
            }),
            _ => None,
        };
        // The record's first address: IPv4 (and IPv6 as its second part on a dual-stack
        // node), or IPv6 alone on an IPv6-only node.
        let ((address, gateway), ipv6) = match (v4, v6) {
            (Some(first), second) => (first, second),
            (None, Some(only)) => ((IpNet::from(only.address), IpAddr::from(only.gateway)), None),
            (None, None) => return Err(PodError::NotReady("this node's HostSubnet has no subnet".into())),
        };
        let rec = CniRecord {
            netns: req.netns.clone(),
            if_name: req.if_name.clone(),
            address,
            gateway,
            ipv6,
            mtu,
            sandbox: Some(sandbox),
            // Known once the interface is made (below).
            host_ifindex: None,
        };
        let record = PodRecord {
            version: crate::node::record::VERSION,
            container_id: req.container_id.clone(),
            namespace: req.namespace.clone(),
            name: req.name.clone(),
            host_veth,
            ip: address.addr(),
            ip6: ipv6.map(|v| v.address.addr()),
            // The IPv4 address's bytes, dual-stack or not; an IPv6-only pod's from its IPv6
            // address (see the module documentation and `domain::pod_mac`).
            mac: crate::domain::pod_mac(address.addr()),
            // Bandwidth from the Pod's annotations (Kubernetes mode), as SetPodBandwidth.
            annotations: m.source().and_then(|l| l.pod_annotations.get(&key)).cloned().unwrap_or_default(),
            internal: false,
            cni: Some(rec),
        };
        let pod = record.to_pod().map_err(PodError::Invalid)?;
        m.reserve(&pod).map_err(PodError::from)?;
        undo.done(Step::Reserved);
        m.reserve_sandbox(&key, sandbox);
        (pod, record, cluster)
    };
    pods.faults.hit(FaultPoint::Netns).map_err(PodError::Failed)?;
    {
        let Some(rec) = record.cni.clone() else { return Err(PodError::Failed("no CNI record".into())) };
        let cfg = pod_config(&rec, Some(pod.mac), cluster, Some(pod.host_veth.clone()))?;
        // A DEL of a pod of this sandbox may still be deleting its interface.
        drop(tokio::time::timeout_at(deadline, pods.locks.lock(&super::teardown::sandbox_lock(&req.netns))).await);
        let iface = match taken.take() {
            // This ADD owns the spare now: used, or destroyed with whatever failed.
            Some((spare, hold, ahead)) => {
                undo.spare_claimed();
                // The spare's host end is the agent's (it made it): its ifindex is the record's.
                if let Some(c) = record.cni.as_mut() {
                    c.host_ifindex = hostnet::owned::ifindex(&host_ns, &spare.name).await.ok().flatten();
                }
                undo.interface_made(record.clone());
                add_warm(pods, &pod, record, &cfg, (&spare, &hold, ahead), (&host_ns, &pod_ns), deadline, undo)
                    .await
                    .map_err(|e| e.into_pod(&req))?
            }
            None => {
                let iface = fresh_interface(pods, &pod, &mut record, &cfg, (&host_ns, &pod_ns), deadline, undo)
                    .await
                    .map_err(|e| e.into_pod(&req))?;
                super::setup::port_and_flows(pods, pod.clone(), record, deadline, None, undo).await?;
                iface
            }
        };
        // Durable before it is answered.
        super::setup::recorded(pods, &key, deadline).await?;
        Ok(reply_of(&cfg, &iface.host_veth, iface.mac, &rec.netns))
    }
}

/// A new veth for the pod (no warm port was ready): made, then recorded by its ifindex (what a
/// DEL or teardown may delete later), with ARP off on the host end.
async fn fresh_interface(
    pods: &Pods,
    pod: &crate::cluster::Pod,
    record: &mut PodRecord,
    cfg: &hostnet::PodConfig,
    (host_ns, pod_ns): (&hostnet::Netns, &hostnet::Netns),
    deadline: Instant,
    undo: &mut Undo<'_>,
) -> Result<hostnet::PodInterface, IfaceError> {
    // A DEL of the same container may still be deleting the veth of that name.
    drop(tokio::time::timeout_at(deadline, pods.locks.lock(&pod.host_veth)).await);
    // A failed or timed-out step may leave the veth (an interface that had the name already is
    // someone else's, and is not paired into this sandbox: left alone).
    undo.done(Step::MaybeInterface { host: host_ns.clone(), name: pod.host_veth.clone(), sandbox: pod_ns.clone(), ifname: cfg.ifname.clone() });
    let name = IfaceError::made(tokio::time::timeout_at(deadline, hostnet::make_pod_veth(host_ns, pod_ns, cfg)).await)?;
    match hostnet::veth_state(host_ns, &name, None, pod_ns, &cfg.ifname).await {
        Ok(hostnet::VethState::Paired { host_index }) => {
            if let Some(c) = record.cni.as_mut() {
                c.host_ifindex = Some(host_index);
            }
            undo.interface_made(record.clone());
        }
        other => return Err(IfaceError::Pod(PodError::Failed(format!("the interface just made is not there as made: {other:?}")))),
    }
    pods.faults.hit(FaultPoint::Veth).map_err(|e| IfaceError::Pod(PodError::Failed(e)))?;
    // The host end is a switch port, not an IP interface: it must never answer ARP for the
    // node's addresses (on the userspace datapath the kernel sees its packets too, and would
    // answer for the gateway, bypassing the pipeline). (A spare's was set when it was made.)
    if let Err(e) = hostnet::sysctl::write(&["net", "ipv4", "conf", &name, "arp_ignore"], "8") {
        tracing::warn!(veth = %name, error = %e, "could not set arp_ignore on the host veth");
    }
    let iface = IfaceError::made(tokio::time::timeout_at(deadline, hostnet::configure_pod(host_ns, pod_ns, cfg, &name)).await)?;
    pods.faults.hit(FaultPoint::Addresses).map_err(|e| IfaceError::Pod(PodError::Failed(e)))?;
    tracing::debug!(pod = %format!("{}/{}", pod.namespace, pod.name), "fresh pod interface ready");
    Ok(iface)
}

/// Why an ADD failed: making the pod's interface, or the rest.
enum IfaceError {
    Iface(hostnet::Error),
    Timeout,
    Pod(PodError),
}

impl IfaceError {
    /// The interface, or why it was not made in time.
    fn made<T>(r: Result<hostnet::Result<T>, tokio::time::error::Elapsed>) -> Result<T, IfaceError> {
        match r {
            Ok(Ok(i)) => Ok(i),
            Ok(Err(e)) => Err(IfaceError::Iface(e)),
            Err(_) => Err(IfaceError::Timeout),
        }
    }

    fn into_pod(self, req: &CniRequest) -> PodError {
        match self {
            IfaceError::Iface(e @ hostnet::Error::Exists { .. }) => PodError::Conflict(Problem::new(obj(req), "ifName", e.to_string())),
            // Another station on the link holds the pod's IPv6 address.
            IfaceError::Iface(e @ hostnet::Error::DadFailed { .. }) => PodError::Conflict(Problem::new(obj(req), "ips", e.to_string())),
            IfaceError::Iface(e) => PodError::Failed(format!("{}: pod interface: {e}", obj(req))),
            IfaceError::Timeout => PodError::Deadline("creating the pod interface took too long".into()),
            IfaceError::Pod(PodError::Failed(m)) => PodError::Failed(format!("{}: {m}", obj(req))),
            IfaceError::Pod(e) => e,
        }
    }
}

/// ADD on a warm port ([`super::spares`]): the kernel moves the spare into the sandbox while
/// OVSDB records the pod on the spare's port and the switch commits its flows — the flows need
/// the port's ofport, not the interface — so the ADD costs the longer of the two rather than
/// their sum (the kernel's move, ~20 ms, and ovs-vswitchd's pass over the port's new record and
/// its reaction to the spare's carrier coming up, which the flow commit waits behind). Either
/// failing fails the ADD, whose steps (both) are then undone.
#[allow(clippy::too_many_arguments)]
async fn add_warm<'a>(
    pods: &'a Pods,
    pod: &crate::cluster::Pod,
    record: PodRecord,
    cfg: &hostnet::PodConfig,
    (spare, hold, ahead): (&super::spares::Spare, &hostnet::Netns, usize),
    (host_ns, pod_ns): (&hostnet::Netns, &hostnet::Netns),
    deadline: Instant,
    undo: &mut Undo<'a>,
) -> Result<hostnet::PodInterface, IfaceError> {
    let claim = async {
        let t = Instant::now();
        let moved = IfaceError::made(tokio::time::timeout_at(deadline, hostnet::move_spare(hold, pod_ns, &spare.name, cfg)).await);
        pods.spares.moved(t.elapsed(), ahead);
        moved?;
        pods.faults.hit(FaultPoint::Rename).map_err(|e| IfaceError::Pod(PodError::Failed(e)))?;
        let iface = IfaceError::made(tokio::time::timeout_at(deadline, hostnet::configure_pod(host_ns, pod_ns, cfg, &spare.name)).await)?;
        pods.faults.hit(FaultPoint::Addresses).map_err(|e| IfaceError::Pod(PodError::Failed(e)))?;
        Ok(iface)
    };
    let port = super::setup::port_and_flows(pods, pod.clone(), record, deadline, Some(spare.ofport), undo);
    let (moved, committed) = tokio::join!(claim, port);
    tracing::debug!(pod = %format!("{}/{}", pod.namespace, pod.name), ahead, "warm port claimed");
    committed.map_err(IfaceError::Pod)?;
    moved
}

async fn del(pods: &Pods, req: CniRequest, deadline: Instant) -> Result<(), PodError> {
    let key = (req.namespace.clone(), req.name.clone());
    // The pod this DEL is for: the one whose record has this full container ID and interface
    // name; the pod's namespace and name, when the request gives them (CNI_ARGS), must match.
    let unnamed = req.namespace.is_empty() && req.name.is_empty();
    let target = pods.state.lock().cni_pod_of_container(&req.container_id).filter(|(k, r)| {
        (unnamed || *k == key) && r.cni.as_ref().is_some_and(|c| c.if_name == req.if_name)
    });
    if let Some((k, _)) = target {
        {
            let mut m = pods.state.lock();
            if m.is_api_pod(&k) {
                m.tear_down(&k);
            }
        }
        finish_teardown(pods, &k, deadline).await?;
        return super::durable::forgotten(pods, &k, deadline).await;
    }
    // Not (or no longer) known: whatever a half-done ADD of this container left.
    if crate::domain::ContainerId::parse(&req.container_id).is_ok() {
        remove_unrecorded(pods, &req).await?;
    }
    // A retried DEL whose first attempt could not write the checkpoint writes it now.
    super::durable::forgotten(pods, &key, deadline).await
}

/// What an ADD of `req`'s container that died before its pod was recorded may have left: the
/// veth under the name the container ID gives — only if no pod (set up, being set up or torn
/// down) has that name, and only if it is paired with `req`'s interface in `req`'s sandbox:
/// never an interface that merely has the name (another container's ID may give it too).
async fn remove_unrecorded(pods: &Pods, req: &CniRequest) -> Result<(), PodError> {
    let name = host_veth_name(&req.container_id);
    if pods.state.lock().host_veth_taken(&name) || pods.spares.owns(&name) || req.netns.is_empty() {
        return Ok(());
    }
    // A sandbox that is gone (or not a sandbox) took whatever was paired into it with it.
    let Ok(sandbox) = open_sandbox(pods, &obj(req), &req.netns).await else { return Ok(()) };
    let host = hostnet::Netns::current().map_err(|e| PodError::Failed(format!("the agent's own network namespace: {e}")))?;
    let failed = |e: hostnet::Error| PodError::Failed(format!("{}: pod interface {name}: {e}", obj(req)));
    match hostnet::veth_state(&host, &name, None, &sandbox, &req.if_name).await.map_err(failed)? {
        hostnet::VethState::Paired { host_index } => {
            let _g = pods.locks.lock(&name).await;
            hostnet::delete_owned(&host, &name, Some(host_index)).await.map(|_| ()).map_err(failed)
        }
        _ => Ok(()),
    }
}

/// 409: `req`'s sandbox holds pod `holder` already.
fn sandbox_taken(req: &CniRequest, holder: &crate::cluster::PodKey) -> PodError {
    PodError::Conflict(Problem::new(
        obj(req),
        "netns",
        format!("sandbox {:?} holds pod {}/{} already: one pod per sandbox", req.netns, holder.0, holder.1),
    ))
}

/// The pods recorded in `sandbox` whose record is stale: their namespace is gone and another
/// one got its inode. 409 if a live one is there (other than `key`, whose repeated ADD
/// answers what the first one did).
async fn stale_holders(
    pods: &Pods,
    sandbox: SandboxId,
    req: &CniRequest,
    key: &crate::cluster::PodKey,
) -> Result<std::collections::HashSet<crate::cluster::PodKey>, PodError> {
    let (reserved, recorded) = pods.state.lock().sandbox_holders(sandbox, &req.netns);
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

async fn check(pods: &Pods, req: CniRequest) -> Result<(), PodError> {
    validate(&req)?;
    let key = (req.namespace.clone(), req.name.clone());
    let found = pods.state.lock().api_pod(&key).filter(|(_, r)| r.container_id == req.container_id).and_then(|(p, r)| Some((p.clone(), r.cni.clone()?)));
    let Some((pod, rec)) = found else {
        return Err(PodError::NotFound(format!("{} is not set up with container {}", obj(&req), req.container_id)));
    };
    let ofport_known = pods.state.lock().ports().contains_key(&key);
    let engine = pods.conns.engine_ready().ok_or_else(|| PodError::NotReady("the switch is not connected or not synced".into()))?;
    let owner = crate::store::Owner::Pod { namespace: pod.namespace.clone(), name: pod.name.clone() };
    let (desired, installed, dirty) = engine.snapshot().await.map_err(|e| PodError::NotReady(e.to_string()))?;
    let flows = desired.flows_of(&owner);
    let want = flows.len();
    let on_switch = flows.iter().filter(|c| installed.get(&c.key).is_some()).count();
    if !ofport_known || want == 0 || dirty || on_switch != want {
        return Err(PodError::Failed(format!("{}: its flows are not on the switch ({want} desired)", obj(&req))));
    }
    let ns = open_sandbox(pods, &obj(&req), &rec.netns).await?;
    let cluster = pods.state.lock().effective().map(|s| (s.cluster_network, s.cluster_network6)).unwrap_or_default();
    let mut cfg = pod_config(&rec, None, cluster, None)?;
    cfg.ifname = req.if_name.clone();
    hostnet::check_pod_config(&ns, &cfg, Some(pod.mac))
        .await
        .map_err(|e| PodError::Failed(format!("{}: {e}", obj(&req))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(namespace: &str, name: &str) -> CniRequest {
        CniRequest {
            command: "ADD".into(),
            container_id: "04e97267aae6c4fc012009f4bd6ac26a9d294567f1b731bc4571a461e2cd12c3".into(),
            netns: "/run/netns/x".into(),
            if_name: "eth0".into(),
            namespace: namespace.into(),
            name: name.into(),
            ..Default::default()
        }
    }

    /// ADD's answer as the agent writes it: `ips`, and `ip`/`gateway` as plugins before `ips`
    /// read them (this JSON is what the plugin of commit 8c5aee0 was checked to accept), with
    /// the routes the pod's interface got.
    #[test]
    fn the_reply_is_what_plugins_old_and_new_read() {
        let rec = CniRecord {
            netns: "/var/run/netns/x".into(),
            if_name: "eth0".into(),
            address: "10.128.0.5/23".parse().unwrap(),
            gateway: [10, 128, 0, 1].into(),
            ipv6: None,
            mtu: 1450,
            sandbox: None,
            host_ifindex: None,
        };
        let cfg = pod_config(&rec, None, (Some("10.128.0.0/14".parse().unwrap()), None), None).unwrap();
        let reply = reply_of(&cfg, "veth1", crate::domain::pod_mac(std::net::Ipv4Addr::from([10, 128, 0, 5])), &rec.netns);
        let json = serde_json::to_string(&reply).unwrap();
        assert_eq!(
            json,
            r#"{"hostVeth":"veth1","ifName":"eth0","mac":"0a:58:0a:80:00:05","sandbox":"/var/run/netns/x","ips":[{"address":"10.128.0.5/23","gateway":"10.128.0.1"}],"ip":"10.128.0.5/23","gateway":"10.128.0.1","routes":[{"dst":"0.0.0.0/0","gw":"10.128.0.1"},{"dst":"10.128.0.0/14"},{"dst":"224.0.0.0/4"}],"mtu":1450}"#
        );
        let checked = sdn_node_cni::result::parse_add_reply(json.as_bytes(), "pod a/b", "eth0", "/ns").unwrap();
        assert_eq!(checked.ips, reply.ips);
    }

    /// A dual-stack pod's answer: both addresses (IPv4 first, which `ip`/`gateway` copy) and
    /// both families' routes, and the plugin takes it.
    #[test]
    fn a_dual_stack_reply_lists_both_families() {
        let rec = CniRecord {
            netns: "/var/run/netns/x".into(),
            if_name: "eth0".into(),
            address: "10.128.2.5/23".parse().unwrap(),
            gateway: [10, 128, 2, 1].into(),
            ipv6: Some(CniIpv6 { address: "fd00:10:128:2::5/64".parse().unwrap(), gateway: "fd00:10:128:2::1".parse().unwrap() }),
            mtu: 1450,
            sandbox: None,
            host_ifindex: None,
        };
        let cfg = pod_config(&rec, None, (Some("10.128.0.0/14".parse().unwrap()), Some("fd00:10:128::/48".parse().unwrap())), None).unwrap();
        let reply = reply_of(&cfg, "veth1", crate::domain::pod_mac(std::net::Ipv4Addr::from([10, 128, 2, 5])), &rec.netns);
        let json = serde_json::to_string(&reply).unwrap();
        assert_eq!(
            json,
            r#"{"hostVeth":"veth1","ifName":"eth0","mac":"0a:58:0a:80:02:05","sandbox":"/var/run/netns/x","ips":[{"address":"10.128.2.5/23","gateway":"10.128.2.1"},{"address":"fd00:10:128:2::5/64","gateway":"fd00:10:128:2::1"}],"ip":"10.128.2.5/23","gateway":"10.128.2.1","routes":[{"dst":"0.0.0.0/0","gw":"10.128.2.1"},{"dst":"10.128.0.0/14"},{"dst":"224.0.0.0/4"},{"dst":"::/0","gw":"fd00:10:128:2::1"},{"dst":"fd00:10:128::/48"},{"dst":"ff00::/8"}],"mtu":1450}"#
        );
        let checked = sdn_node_cni::result::parse_add_reply(json.as_bytes(), "pod a/b", "eth0", "/ns").unwrap();
        assert_eq!(checked.ips, reply.ips);
        // Without a known IPv6 cluster network, the pod's own IPv6 subnet stands for it.
        let cfg = pod_config(&rec, None, (None, None), None).unwrap();
        assert_eq!(cfg.ipv6.map(|v6| v6.cluster_network.to_string()), Some("fd00:10:128:2::/64".into()));
    }

    /// The names `sdn-node-cni` gives containers of runtimes that are not Kubernetes (the
    /// container's name, or the short container ID) are pod names the agent takes.
    #[test]
    fn container_names_and_short_ids_are_pod_names() {
        for name in ["04e97267aae6", "web1", "ctr-7.x"] {
            assert!(validate(&req("default", name)).is_ok(), "{name}");
        }
        for (ns, name, field) in [("default", "Probe_1", "name"), ("Team_A", "web1", "namespace")] {
            match validate(&req(ns, name)) {
                Err(PodError::Invalid(p)) => assert_eq!(p.field, field, "{ns}/{name}: {p:?}"),
                other => panic!("{ns}/{name}: {other:?}"),
            }
        }
    }
}
