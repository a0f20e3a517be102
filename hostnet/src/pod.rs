//! Pod interface setup, CNI style (what openshift-sdn's pod manager did through the CNI
//! plugins): a veth pair whose host end stays in the host namespace (to be added to OVS by the
//! caller) and whose other end becomes the pod's `eth0`, addressed and routed.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use rtnetlink::packet_route::{
    link::{InfoData, InfoVeth, LinkAttribute, LinkMessage},
    route::RouteScope,
};

use crate::{
    error::{Error, Result},
    ethtool,
    mac::MacAddr,
    names::check_ifname,
    netns::Netns,
    nl::Nl,
};

/// IPv4 multicast, routed on-link so pods can use multicast (openshift-sdn's CNI config did
/// the same; OVS decides who receives it).
pub const MULTICAST_NET: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(224, 0, 0, 0), 4);

/// Attempts at picking an unused random host-side name before giving up.
const NAME_ATTEMPTS: usize = 8;

/// One route inside the pod: via a gateway, or on-link (scope link) when `via` is None.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodRoute {
    pub dst: Ipv4Net,
    pub via: Option<Ipv4Addr>,
}

/// What a pod's interface must look like.
#[derive(Clone, Debug)]
pub struct PodConfig {
    /// Name inside the pod, usually `eth0`.
    pub ifname: String,
    /// The pod side's MAC; None keeps the kernel's random one.
    pub mac: Option<MacAddr>,
    /// MTU of both ends (the overlay MTU: physical MTU minus VXLAN overhead).
    pub mtu: u32,
    /// The pod's address with the node subnet's prefix length, e.g. 10.128.0.5/23.
    pub address: Ipv4Net,
    /// The node subnet's gateway (tun0's address); the pod's default route goes there.
    pub gateway: Ipv4Addr,
    /// The whole cluster network, reached on-link so pod-to-pod traffic goes to OVS directly.
    pub cluster_network: Ipv4Net,
    /// Routes beyond the standard three (e.g. from the agent's configuration); empty for
    /// openshift-sdn's behaviour.
    pub extra_routes: Vec<PodRoute>,
    /// The host end's name; `None`: a fresh random one. A name derived from the container ID
    /// lets a later DEL find (and remove) the veth of a setup that never completed.
    pub host_ifname: Option<String>,
}

impl PodConfig {
    /// The routes setup installs: default via the gateway, cluster network and multicast
    /// on-link, then `extra_routes`.
    pub fn routes(&self) -> Vec<PodRoute> {
        let mut routes = vec![
            PodRoute { dst: Ipv4Net::default(), via: Some(self.gateway) },
            PodRoute { dst: self.cluster_network.trunc(), via: None },
            PodRoute { dst: MULTICAST_NET, via: None },
        ];
        routes.extend(self.extra_routes.iter().map(|r| PodRoute { dst: r.dst.trunc(), via: r.via }));
        routes
    }

    pub(crate) fn validate(&self) -> Result<()> {
        check_ifname(&self.ifname)?;
        if let Some(h) = &self.host_ifname {
            check_ifname(h)?;
        }
        if !(68..=65535).contains(&self.mtu) {
            return Err(Error::invalid(format!("MTU {}", self.mtu), "outside 68..=65535"));
        }
        if let Some(mac) = self.mac {
            if !mac.is_valid_unicast() {
                return Err(Error::invalid(format!("MAC {mac}"), "not a unicast address"));
            }
        }
        let subnet = self.address.trunc();
        let host_addr = |a: Ipv4Addr| subnet.contains(&a) && a != subnet.network() && a != subnet.broadcast();
        if !host_addr(self.address.addr()) {
            return Err(Error::invalid(
                format!("pod address {}", self.address),
                "is the network or broadcast address of its subnet",
            ));
        }
        if !host_addr(self.gateway) || self.gateway == self.address.addr() {
            return Err(Error::invalid(
                format!("gateway {}", self.gateway),
                format!("not another host address of the pod subnet {subnet}"),
            ));
        }
        Ok(())
    }
}

/// What setup created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInterface {
    /// The host end of the veth, to add to OVS and to pass to `teardown_pod`.
    pub host_veth: String,
    /// The pod side's MAC as the kernel has it.
    pub mac: MacAddr,
}

/// Creates and configures the pod interface ([`make_pod_veth`], then [`configure_pod`]). On
/// failure everything created so far is removed (deleting one veth end deletes both), so a
/// retry starts clean. (The agent runs the two steps itself, so that its one undo path covers
/// them; this is the whole for everyone else.)
pub async fn setup_pod(host: &Netns, pod: &Netns, cfg: &PodConfig) -> Result<PodInterface> {
    let host_veth = make_pod_veth(host, pod, cfg).await?;
    match configure_pod(host, pod, cfg, &host_veth).await {
        Ok(made) => Ok(made),
        Err(first) => {
            let undo = match Nl::connect(host).await {
                Ok(nl) => delete_by_name(&nl, &host_veth).await,
                Err(e) => Err(e),
            };
            Err(undone(first, undo))
        }
    }
}

/// The first step of a pod's interface: the veth pair, the pod end in `pod` under its final
/// name (one netlink request: it is made whole or not at all). Answers the host end's name.
/// A name already taken in the sandbox is [`Error::Exists`].
pub async fn make_pod_veth(host: &Netns, pod: &Netns, cfg: &PodConfig) -> Result<String> {
    cfg.validate()?;
    let host_nl = Nl::connect(host).await?;
    let pod_nl = Nl::connect(pod).await?;
    if pod_nl.link_by_name(&cfg.ifname).await?.is_some() {
        return Err(Error::Exists {
            kind: "pod interface",
            name: format!("{} (netns {})", cfg.ifname, pod.path().display()),
        });
    }
    create_veth(&host_nl, &pod_nl, pod, cfg).await
}

/// The second step: the pod end in `pod` (named `cfg.ifname`, its peer `host_veth` in `host`)
/// gets its address, routes, MTU and state, the host end is set up. A failure leaves the pair
/// as it was made: deleting it is the caller's (the agent's undo; [`setup_pod`]'s own).
pub async fn configure_pod(host: &Netns, pod: &Netns, cfg: &PodConfig, host_veth: &str) -> Result<PodInterface> {
    cfg.validate()?;
    let host_nl = Nl::connect(host).await?;
    let pod_nl = Nl::connect(pod).await?;
    // A spare's host end was made with the MTU of its time.
    let host_link = host_nl.require_link("host veth", host_veth).await?;
    if host_link.mtu != Some(cfg.mtu) {
        host_nl.link_up(&host_link, Some(cfg.mtu)).await?;
    }
    let mac = configure(&host_nl, &pod_nl, pod, cfg, host_veth).await?;
    Ok(PodInterface { host_veth: host_veth.to_string(), mac })
}

/// Creates the pair in one request: the host end under a fresh random name, the peer directly
/// in the pod namespace under its final name with its MTU and MAC. Doing it in one request
/// (rather than create, move, rename) means the pod name never has to be free in the host
/// namespace (where `eth0` usually exists) and nothing half-made is ever visible.
async fn create_veth(host_nl: &Nl, pod_nl: &Nl, pod: &Netns, cfg: &PodConfig) -> Result<String> {
    let mut last = None;
    let attempts = if cfg.host_ifname.is_some() { 1 } else { NAME_ATTEMPTS };
    for _ in 0..attempts {
        let name = match &cfg.host_ifname {
            Some(n) => n.clone(),
            None => random_veth_name()?,
        };
        let mut peer = LinkMessage::default();
        peer.attributes.push(LinkAttribute::IfName(cfg.ifname.clone()));
        peer.attributes.push(LinkAttribute::Mtu(cfg.mtu));
        if let Some(mac) = cfg.mac {
            peer.attributes.push(LinkAttribute::Address(mac.0.to_vec()));
        }
        peer.attributes.push(LinkAttribute::NetNsFd(pod.raw_fd()));
        let msg = rtnetlink::LinkVeth::new(&name, &cfg.ifname)
            .mtu(cfg.mtu)
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
            .build();
        let what = format!("veth {name} <-> {} (pod {})", cfg.ifname, pod.path().display());
        match host_nl.link_add(msg, &what).await {
            Ok(()) => return Ok(name),
            Err(e) if e.errno() == Some(libc::EEXIST) => {
                // A name clash on our side is worth another random name; the pod name having
                // appeared meanwhile is not.
                if pod_nl.link_by_name(&cfg.ifname).await?.is_some() {
                    return Err(e);
                }
                last = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| Error::invalid("veth name", "no attempt made")))
}

async fn configure(host_nl: &Nl, pod_nl: &Nl, pod: &Netns, cfg: &PodConfig, host_veth: &str) -> Result<MacAddr> {
    let link = pod_nl.require_link("pod interface", &cfg.ifname).await?;
    let lo = pod_nl.require_link("loopback", "lo").await?;
    pod_nl.link_up(&lo, None).await?;
    pod_nl.addr_add(&link, cfg.address, false).await?;
    // Routes through a link need it up.
    pod_nl.link_up(&link, None).await?;
    for r in cfg.routes() {
        pod_nl.route_replace(r.dst, r.via, &link).await?;
    }
    let ifname = cfg.ifname.clone();
    pod.run("disable tx checksum offload", move || ethtool::set_tx_checksum(&ifname, false)).await?;
    let host_link = host_nl.require_link("host veth", host_veth).await?;
    host_nl.link_up(&host_link, None).await?;
    let link = pod_nl.require_link("pod interface", &cfg.ifname).await?;
    let mac = link.mac.map(MacAddr).ok_or_else(|| Error::Reply {
        object: format!("pod interface {}", cfg.ifname),
        reason: "no 6-byte hardware address".into(),
    })?;
    if let Some(want) = cfg.mac {
        if want != mac {
            return Err(Error::Reply {
                object: format!("pod interface {}", cfg.ifname),
                reason: format!("MAC is {mac}, asked for {want}"),
            });
        }
    }
    Ok(mac)
}

/// The error of a step that failed (`first`), given how undoing it went.
pub(crate) fn undone(first: Error, undo: Result<()>) -> Error {
    match undo {
        Ok(()) => first,
        Err(undo) => Error::Undo { first: Box::new(first), undo: Box::new(undo) },
    }
}

pub(crate) async fn delete_by_name(nl: &Nl, name: &str) -> Result<()> {
    match nl.link_by_name(name).await? {
        Some(link) => nl.link_del(link.index, name).await,
        None => Ok(()),
    }
}

/// Removes a pod interface by its host-side name. Idempotent: a missing veth is success (the
/// pod namespace may already be gone, which deletes the pair with it).
pub async fn teardown_pod(host: &Netns, host_veth: &str) -> Result<()> {
    check_ifname(host_veth)?;
    let nl = Nl::connect(host).await?;
    delete_by_name(&nl, host_veth).await
}

/// Verifies what `setup_pod` did (for CNI CHECK): the interface exists and is up, has `mac`
/// (when given) and `address`, each of `routes` goes through it, and TX checksum offload is
/// off. All differences are reported together.
pub async fn check_pod(
    pod: &Netns,
    ifname: &str,
    address: Ipv4Net,
    mac: Option<MacAddr>,
    routes: &[PodRoute],
) -> Result<()> {
    check_ifname(ifname)?;
    let nl = Nl::connect(pod).await?;
    let link = nl.require_link("pod interface", ifname).await?;
    let mut problems = Vec::new();
    if !link.up {
        problems.push("interface is down".to_string());
    }
    if let Some(want) = mac {
        match link.mac {
            Some(have) if have == want.0 => {}
            have => problems.push(format!("MAC is {:?}, expected {want}", have.map(MacAddr))),
        }
    }
    let addrs = nl.addrs_v4(&link).await?;
    if !addrs.contains(&address) {
        problems.push(format!("address {address} missing (has {addrs:?})"));
    }
    let table = nl.routes_v4().await?;
    for r in routes {
        let found = table.iter().any(|t| {
            t.dst == r.dst
                && t.oif == Some(link.index)
                && t.gateway == r.via
                && (r.via.is_some() || t.scope == RouteScope::Link)
        });
        if !found {
            match r.via {
                Some(gw) => problems.push(format!("route {} via {gw} missing", r.dst)),
                None => problems.push(format!("on-link route {} missing", r.dst)),
            }
        }
    }
    let name = ifname.to_string();
    if pod.run("read tx checksum offload", move || ethtool::tx_checksum(&name)).await? {
        problems.push("tx checksum offload is on".to_string());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Check { object: format!("{ifname} (netns {})", pod.path().display()), problems })
    }
}

/// `veth` + 8 random hex digits: 12 bytes, within IFNAMSIZ, and the prefix the CNI plugins use
/// so operators recognise the interfaces.
pub fn random_veth_name() -> Result<String> {
    let mut b = [0u8; 4];
    // SAFETY: writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(Error::io("read random bytes for", "veth name", std::io::Error::last_os_error()));
    }
    Ok(format!("veth{:08x}", u32::from_be_bytes(b)))
}

/// Creates veth pairs `(a, b)` in `ns`, both ends with `mtu` and up (what a benchmark's
/// pre-populated pods need: no addresses, no second namespace).
pub async fn add_veth_pairs(ns: &Netns, pairs: &[(String, String)], mtu: u32) -> Result<()> {
    let nl = Nl::connect(ns).await?;
    for (a, b) in pairs {
        let msg = rtnetlink::LinkVeth::new(a, b).mtu(mtu).build();
        nl.link_add(msg, &format!("veth {a} <-> {b}")).await?;
        for name in [a, b] {
            let link = nl.require_link("veth", name).await?;
            nl.link_up(&link, Some(mtu)).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> PodConfig {
        PodConfig {
            ifname: "eth0".into(),
            mac: None,
            mtu: 1450,
            address: "10.128.0.5/23".parse().unwrap(),
            gateway: "10.128.0.1".parse().unwrap(),
            cluster_network: "10.128.0.0/14".parse().unwrap(),
            extra_routes: vec![],
            host_ifname: None,
        }
    }

    #[test]
    fn routes_are_default_cluster_multicast() {
        let r = cfg().routes();
        assert_eq!(r[0].dst.to_string(), "0.0.0.0/0");
        assert_eq!(r[0].via, Some("10.128.0.1".parse().unwrap()));
        assert_eq!(r[1].dst.to_string(), "10.128.0.0/14");
        assert_eq!(r[1].via, None);
        assert_eq!(r[2].dst.to_string(), "224.0.0.0/4");
    }

    #[test]
    fn validation() {
        cfg().validate().unwrap();
        let mut c = cfg();
        c.gateway = "10.130.0.1".parse().unwrap();
        assert!(c.validate().is_err());
        let mut c = cfg();
        c.gateway = "10.128.1.255".parse().unwrap();
        assert!(c.validate().is_err());
        let mut c = cfg();
        c.address = "10.128.0.0/23".parse().unwrap();
        assert!(c.validate().is_err());
        let mut c = cfg();
        c.mtu = 10;
        assert!(c.validate().is_err());
        let mut c = cfg();
        c.mac = Some(MacAddr([1, 0, 0, 0, 0, 0]));
        assert!(c.validate().is_err());
        let mut c = cfg();
        c.ifname = "this-name-is-too-long".into();
        assert!(c.validate().is_err());
    }

    #[test]
    fn veth_names_fit() {
        let n = random_veth_name().unwrap();
        assert!(n.starts_with("veth") && n.len() == 12);
        check_ifname(&n).unwrap();
    }
}

