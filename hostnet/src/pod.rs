//! Pod interface setup, CNI style (what openshift-sdn's pod manager did through the CNI
//! plugins): a veth pair whose host end stays in the host namespace (to be added to OVS by the
//! caller) and whose other end becomes the pod's `eth0`, addressed and routed.

use std::{
    fs::File,
    io::Write,
    net::{Ipv4Addr, Ipv6Addr},
    os::unix::fs::FileExt,
    time::Duration,
};

use ipnet::{Ipv4Net, Ipv6Net};
use rtnetlink::packet_route::{
    address::AddressFlags,
    link::{InfoData, InfoVeth, LinkAttribute, LinkMessage},
    route::RouteScope,
};

use crate::{
    error::{Error, Result},
    ethtool,
    mac::MacAddr,
    names::check_ifname,
    netns::Netns,
    nl::{Link, Nl},
    sysctl,
};

/// IPv4 multicast, routed on-link so pods can use multicast (openshift-sdn's CNI config did
/// the same; OVS decides who receives it).
pub const MULTICAST_NET: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(224, 0, 0, 0), 4);

/// IPv6 multicast, routed on-link for the same reason as [`MULTICAST_NET`].
pub const MULTICAST_NET6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8);

/// How long the pod's interface waits for an answer to its one duplicate address detection
/// probe (its `net.ipv6.neigh.<if>.retrans_time_ms` while DAD runs). A holder of the address
/// answers from the same node's switch within microseconds, from another node over VXLAN
/// within a round trip of the underlay (well under a millisecond in one site); the kernel's
/// own floor is HZ/100 (10 ms). Measured here (HZ 250): 1 s default -> ~1.0 s to a usable
/// address, 10 ms -> ~12-20 ms.
pub const DAD_RETRANS_TIME_MS: u32 = 10;

/// How often configure_pod looks at the pod's IPv6 address while DAD runs.
pub const DAD_POLL_INTERVAL: Duration = Duration::from_millis(2);

/// Bound on the wait for DAD's verdict (at most this / [`DAD_POLL_INTERVAL`] looks): far
/// beyond the ~10 ms DAD takes with our settings, for a loaded machine's delayed workqueues.
pub const DAD_TIMEOUT: Duration = Duration::from_secs(3);

/// Attempts at picking an unused random host-side name before giving up.
const NAME_ATTEMPTS: usize = 8;

/// One route inside the pod: via a gateway, or on-link (scope link) when `via` is None.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodRoute {
    pub dst: Ipv4Net,
    pub via: Option<Ipv4Addr>,
}

/// One IPv6 route inside the pod: via a gateway, or on-link when `via` is None.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodRoute6 {
    pub dst: Ipv6Net,
    pub via: Option<Ipv6Addr>,
}

/// The pod's IPv6 side (dual-stack, or the only one of an IPv6-only pod).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodIpv6 {
    /// The pod's address with the node's IPv6 subnet prefix, e.g. fd00:10:128:1::5/64.
    pub address: Ipv6Net,
    /// tun0's IPv6 address in the node's IPv6 subnet (subnet::1); the default route's next hop.
    pub gateway: Ipv6Addr,
    /// The whole IPv6 cluster network, reached on-link like the IPv4 one.
    pub cluster_network: Ipv6Net,
}

impl PodIpv6 {
    /// The routes setup installs: `::/0` via the gateway, the cluster network and `ff00::/8`
    /// on-link.
    pub fn routes(&self) -> Vec<PodRoute6> {
        vec![
            PodRoute6 { dst: Ipv6Net::default(), via: Some(self.gateway) },
            PodRoute6 { dst: self.cluster_network.trunc(), via: None },
            PodRoute6 { dst: MULTICAST_NET6, via: None },
        ]
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let subnet = self.address.trunc();
        let addr = self.address.addr();
        if self.address.prefix_len() > 126 {
            return Err(Error::invalid(
                format!("pod IPv6 address {}", self.address),
                "its subnet needs room for the subnet-router anycast address, the gateway and the pod (at most /126)",
            ));
        }
        if !is_global_unicast(addr) {
            return Err(Error::invalid(
                format!("pod IPv6 address {}", self.address),
                "not a unicast address outside fe80::/10, ::1 and ::",
            ));
        }
        if addr == subnet.network() {
            return Err(Error::invalid(
                format!("pod IPv6 address {}", self.address),
                "is its subnet's first address (the subnet-router anycast address)",
            ));
        }
        let gw = self.gateway;
        if !subnet.contains(&gw) || gw == subnet.network() || gw == addr || !is_global_unicast(gw) {
            return Err(Error::invalid(
                format!("IPv6 gateway {gw}"),
                format!("not another unicast address of the pod's IPv6 subnet {subnet} (nor its first)"),
            ));
        }
        Ok(())
    }
}

/// Unicast, and neither unspecified, loopback nor link-local.
fn is_global_unicast(a: Ipv6Addr) -> bool {
    !a.is_multicast() && !a.is_unspecified() && !a.is_loopback() && (a.segments()[0] & 0xffc0) != 0xfe80
}

/// The pod's IPv4 side. Optional like the IPv6 one: a pod of an IPv6-only cluster has none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodIpv4 {
    /// The pod's address with the node subnet's prefix length, e.g. 10.128.0.5/23.
    pub address: Ipv4Net,
    /// The node subnet's gateway (tun0's address); the pod's default route goes there.
    pub gateway: Ipv4Addr,
    /// The whole cluster network, reached on-link so pod-to-pod traffic goes to OVS directly.
    pub cluster_network: Ipv4Net,
    /// Routes beyond the standard three (e.g. from the agent's configuration); empty for
    /// openshift-sdn's behaviour.
    pub extra_routes: Vec<PodRoute>,
}

impl PodIpv4 {
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

/// What a pod's interface must look like.
#[derive(Clone, Debug)]
pub struct PodConfig {
    /// Name inside the pod, usually `eth0`.
    pub ifname: String,
    /// The pod side's MAC; None keeps the kernel's random one.
    pub mac: Option<MacAddr>,
    /// MTU of both ends (the overlay MTU: physical MTU minus VXLAN overhead).
    pub mtu: u32,
    /// The IPv4 side; None: an IPv6-only pod (no IPv4 address, no IPv4 route: the pod's IPv4
    /// stack sees only its loopback).
    pub ipv4: Option<PodIpv4>,
    /// The host end's name; `None`: a fresh random one. A name derived from the container ID
    /// lets a later DEL find (and remove) the veth of a setup that never completed.
    pub host_ifname: Option<String>,
    /// The IPv6 side; None: IPv4 only. At least one of `ipv4` and `ipv6` is there.
    pub ipv6: Option<PodIpv6>,
}

impl PodConfig {
    /// The IPv4 routes setup installs (none for an IPv6-only pod): see [`PodIpv4::routes`].
    pub fn routes(&self) -> Vec<PodRoute> {
        self.ipv4.as_ref().map(PodIpv4::routes).unwrap_or_default()
    }

    /// The IPv6 routes setup installs (none for an IPv4-only pod): see [`PodIpv6::routes`].
    pub fn routes6(&self) -> Vec<PodRoute6> {
        self.ipv6.as_ref().map(PodIpv6::routes).unwrap_or_default()
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
        if self.ipv4.is_none() && self.ipv6.is_none() {
            // An interface without an address would be a pod that cannot talk at all: a
            // caller's bug, not a configuration.
            return Err(Error::invalid(
                format!("pod interface {}", self.ifname),
                "has neither an IPv4 nor an IPv6 side",
            ));
        }
        if let Some(v4) = &self.ipv4 {
            v4.validate()?;
        }
        if let Some(v6) = &self.ipv6 {
            v6.validate()?;
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
    if let Some(v4) = &cfg.ipv4 {
        pod_nl.addr_add(&link, v4.address, false).await?;
    }
    let dad = match &cfg.ipv6 {
        Some(v6) => {
            let dad = prepare_ipv6(pod, &cfg.ifname).await?;
            pod_nl.addr_add_v6(&link, v6.address, AddressFlags::empty()).await?;
            Some(dad)
        }
        None => None,
    };
    // Routes through a link need it up.
    pod_nl.link_up(&link, None).await?;
    for r in cfg.routes() {
        pod_nl.route_replace(r.dst, r.via, &link).await?;
    }
    for r in cfg.routes6() {
        pod_nl.route_replace_v6(r.dst, r.via, &link).await?;
    }
    let ifname = cfg.ifname.clone();
    pod.run("disable tx checksum offload", move || ethtool::set_tx_checksum(&ifname, false)).await?;
    let host_link = host_nl.require_link("host veth", host_veth).await?;
    // With both ends up the pod end has carrier: the kernel starts DAD now.
    host_nl.link_up(&host_link, None).await?;
    if let (Some(v6), Some(dad)) = (&cfg.ipv6, dad) {
        wait_for_dad(pod_nl, pod, &link, v6.address).await?;
        dad.restore()?;
    }
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

/// The pod interface's neighbour retransmission time as it was before DAD, to put back when
/// DAD is over. The sysctl file stays open: /proc/sys/net resolves the namespace at open, so
/// the write needs no second trip into the pod's namespace.
struct DadRestore {
    file: File,
    name: String,
    value: String,
}

impl DadRestore {
    fn restore(self) -> Result<()> {
        // At offset 0: the kernel ignores numeric sysctl writes at a later position
        // (kernel.sysctl_writes_strict), and the first write moved this file's.
        self.file
            .write_all_at(self.value.as_bytes(), 0)
            .map_err(|e| Error::io("write sysctl", format!("{}={}", self.name, self.value), e))
    }
}

/// Makes the pod interface `ifname` ready for its IPv6 address, inside the pod's namespace:
/// IPv6 on (`disable_ipv6=0`: a sandbox may inherit it off), no router advertisements
/// (`accept_ra=0`: routes are ours), and a duplicate address detection that is real but quick.
/// What the kernel does (net/ipv6/addrconf.c): addrconf_dad_kick waits a random
/// 0..`router_solicitation_delay` (1 s) before the first probe, then addrconf_dad_work sends
/// `dad_transmits` probes (1) one neighbour retransmission time apart
/// (`neigh.<if>.retrans_time_ms`, 1 s; at least HZ/100) and declares success when the last
/// one went unanswered. So: the delay 0, one probe, and [`DAD_RETRANS_TIME_MS`] to wait for an
/// answer; `accept_dad=1` so the sandbox's defaults cannot skip DAD. The retransmission time
/// also paces address resolution later (3 tries at 10 ms would give up on a slow neighbour in
/// 30 ms), so it is put back when DAD is over.
async fn prepare_ipv6(pod: &Netns, ifname: &str) -> Result<DadRestore> {
    let ifname = ifname.to_string();
    pod.run("prepare IPv6 on the pod interface", move || {
        let conf = |key: &str, value: &str| sysctl::write(&["net", "ipv6", "conf", &ifname, key], value);
        conf("disable_ipv6", "0")?;
        conf("accept_ra", "0")?;
        conf("accept_dad", "1")?;
        conf("dad_transmits", "1")?;
        conf("router_solicitation_delay", "0")?;
        let components = ["net", "ipv6", "neigh", ifname.as_str(), "retrans_time_ms"];
        let name = components.join(".");
        let value = sysctl::read(&components)?;
        let path = sysctl::sysctl_path(&components)?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| Error::io("open sysctl", name.clone(), e))?;
        let short = DAD_RETRANS_TIME_MS.to_string();
        file.write_all(short.as_bytes()).map_err(|e| Error::io("write sysctl", format!("{name}={short}"), e))?;
        Ok(DadRestore { file, name, value })
    })
    .await
}

/// Waits until DAD is over for `address` on `link`: Ok once it is no longer tentative,
/// [`Error::DadFailed`] when the kernel marked it dadfailed, [`Error::Timeout`] after
/// [`DAD_TIMEOUT`]. Looks at the address flags every [`DAD_POLL_INTERVAL`], a bounded number of
/// times.
async fn wait_for_dad(nl: &Nl, pod: &Netns, link: &Link, address: Ipv6Net) -> Result<()> {
    let object = || format!("{} (netns {})", link.name, pod.path().display());
    let polls = (DAD_TIMEOUT.as_micros() / DAD_POLL_INTERVAL.as_micros()).max(1);
    let deadline = tokio::time::Instant::now() + DAD_TIMEOUT;
    for _ in 0..polls {
        let addrs = nl.addrs_v6(link).await?;
        let Some(a) = addrs.iter().find(|a| a.net == address) else {
            return Err(Error::Reply { object: object(), reason: format!("IPv6 address {address} vanished during DAD") });
        };
        if a.dad_failed() {
            return Err(Error::DadFailed { address, object: object() });
        }
        if !a.tentative() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(DAD_POLL_INTERVAL).await;
    }
    Err(Error::Timeout { op: "wait for duplicate address detection of", object: format!("{address} on {}", object()), after: DAD_TIMEOUT })
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
    check_interface(pod, ifname, Some(address), mac, routes, None).await
}

/// [`check_pod`] for everything `cfg` asks for: its IPv4 address and routes (`cfg.routes()`)
/// when it has an IPv4 side, its IPv6 address (present and not dadfailed) and routes
/// (`cfg.routes6()`) when it has an IPv6 side. All differences are reported together. A side
/// the configuration does not have is not looked at (an IPv6-only pod's IPv4 stack is not
/// checked for emptiness: nothing of ours would be there to find).
pub async fn check_pod_config(pod: &Netns, cfg: &PodConfig, mac: Option<MacAddr>) -> Result<()> {
    cfg.validate()?;
    let address = cfg.ipv4.as_ref().map(|v4| v4.address);
    check_interface(pod, &cfg.ifname, address, mac, &cfg.routes(), cfg.ipv6.as_ref()).await
}

/// `address`: the IPv4 address to find (None: an IPv6-only pod, no IPv4 address expected).
async fn check_interface(
    pod: &Netns,
    ifname: &str,
    address: Option<Ipv4Net>,
    mac: Option<MacAddr>,
    routes: &[PodRoute],
    ipv6: Option<&PodIpv6>,
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
    if let Some(address) = address {
        let addrs = nl.addrs_v4(&link).await?;
        if !addrs.contains(&address) {
            problems.push(format!("address {address} missing (has {addrs:?})"));
        }
    }
    let table = if routes.is_empty() { Vec::new() } else { nl.routes_v4().await? };
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
    if let Some(v6) = ipv6 {
        let addrs = nl.addrs_v6(&link).await?;
        match addrs.iter().find(|a| a.net == v6.address) {
            None => problems.push(format!(
                "IPv6 address {} missing (has {:?})",
                v6.address,
                addrs.iter().map(|a| a.net).collect::<Vec<_>>()
            )),
            Some(a) if a.dad_failed() => {
                problems.push(format!("IPv6 address {} failed duplicate address detection", v6.address))
            }
            Some(_) => {}
        }
        let table = nl.routes_v6().await?;
        for r in v6.routes() {
            if !table.iter().any(|t| t.dst == r.dst && t.oif == Some(link.index) && t.gateway == r.via) {
                match r.via {
                    Some(gw) => problems.push(format!("route {} via {gw} missing", r.dst)),
                    None => problems.push(format!("on-link route {} missing", r.dst)),
                }
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
            ipv4: Some(v4()),
            host_ifname: None,
            ipv6: None,
        }
    }

    fn v4() -> PodIpv4 {
        PodIpv4 {
            address: "10.128.0.5/23".parse().unwrap(),
            gateway: "10.128.0.1".parse().unwrap(),
            cluster_network: "10.128.0.0/14".parse().unwrap(),
            extra_routes: vec![],
        }
    }

    /// The pod config with its IPv4 side changed by `f`.
    fn with_v4(f: impl FnOnce(&mut PodIpv4)) -> PodConfig {
        let mut v = v4();
        f(&mut v);
        PodConfig { ipv4: Some(v), ..cfg() }
    }

    fn v6() -> PodIpv6 {
        PodIpv6 {
            address: "fd00:10:128:1::5/64".parse().unwrap(),
            gateway: "fd00:10:128:1::1".parse().unwrap(),
            cluster_network: "fd00:10:128::/48".parse().unwrap(),
        }
    }

    #[test]
    fn ipv6_routes_are_default_cluster_multicast() {
        assert!(cfg().routes6().is_empty());
        let c = PodConfig { ipv6: Some(v6()), ..cfg() };
        let r = c.routes6();
        assert_eq!(r.len(), 3);
        assert_eq!(r[0], PodRoute6 { dst: "::/0".parse().unwrap(), via: Some("fd00:10:128:1::1".parse().unwrap()) });
        assert_eq!(r[1], PodRoute6 { dst: "fd00:10:128::/48".parse().unwrap(), via: None });
        assert_eq!(r[2], PodRoute6 { dst: "ff00::/8".parse().unwrap(), via: None });
        // The IPv4 routes are not affected.
        assert_eq!(c.routes(), cfg().routes());
    }

    #[test]
    fn ipv6_validation() {
        PodConfig { ipv6: Some(v6()), ..cfg() }.validate().unwrap();
        let bad = |f: fn(&mut PodIpv6), needle: &str| {
            let mut v = v6();
            f(&mut v);
            let e = PodConfig { ipv6: Some(v), ..cfg() }.validate().unwrap_err().to_string();
            assert!(e.contains(needle), "{needle} not in {e}");
        };
        bad(|v| v.address = "fd00:10:128:1::/64".parse().unwrap(), "first address");
        bad(|v| v.gateway = "fd00:10:128:2::1".parse().unwrap(), "fd00:10:128:2::1");
        bad(|v| v.gateway = "fd00:10:128:1::".parse().unwrap(), "gateway");
        bad(|v| v.gateway = "fd00:10:128:1::5".parse().unwrap(), "gateway");
        bad(|v| v.address = "fe80::5/64".parse().unwrap(), "unicast");
        bad(|v| v.address = "ff02::5/64".parse().unwrap(), "unicast");
        bad(|v| v.address = "fd00:10:128:1::5/127".parse().unwrap(), "/126");
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
        assert!(with_v4(|v| v.gateway = "10.130.0.1".parse().unwrap()).validate().is_err());
        assert!(with_v4(|v| v.gateway = "10.128.1.255".parse().unwrap()).validate().is_err());
        assert!(with_v4(|v| v.address = "10.128.0.0/23".parse().unwrap()).validate().is_err());
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
    fn ipv6_only_pods_have_no_ipv4_routes_and_need_some_family() {
        let c = PodConfig { ipv4: None, ipv6: Some(v6()), ..cfg() };
        c.validate().unwrap();
        assert!(c.routes().is_empty());
        assert_eq!(c.routes6(), v6().routes());
        let e = PodConfig { ipv4: None, ipv6: None, ..cfg() }.validate().unwrap_err().to_string();
        assert!(e.contains("neither an IPv4 nor an IPv6"), "{e}");
        // The IPv4 side's routes are the config's.
        assert_eq!(cfg().routes(), v4().routes());
    }

    #[test]
    fn veth_names_fit() {
        let n = random_veth_name().unwrap();
        assert!(n.starts_with("veth") && n.len() == 12);
        check_ifname(&n).unwrap();
    }
}

