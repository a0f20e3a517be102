//! A route-netlink connection bound to one namespace, with a deadline on every request and
//! errors that name the object. Thin on purpose: the policy lives in `pod`, `host`.

use std::{
    future::Future,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{FromRawFd, IntoRawFd},
    time::Duration,
};

use futures::{Stream, TryStreamExt};
use ipnet::{Ipv4Net, Ipv6Net};
use rtnetlink::{
    packet_route::{
        address::{AddressAttribute, AddressFlags, AddressMessage, AddressScope},
        link::{LinkAttribute, LinkFlags, LinkMessage},
        route::{RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteScope},
        AddressFamily,
    },
    sys::{protocols::NETLINK_ROUTE, Socket, TokioSocket},
    Handle,
};

use crate::{
    error::{Error, Result},
    netns::Netns,
};

/// Deadline for one netlink request (a dump included).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What we read back about a link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mac: Option<[u8; 6]>,
    pub mtu: Option<u32>,
    pub up: bool,
    /// IFLA_LINK: for a veth, its peer's ifindex (in the peer's namespace).
    pub peer: Option<u32>,
}

/// What we read back about an IPv4 route in the main table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteInfo {
    pub dst: Ipv4Net,
    pub gateway: Option<Ipv4Addr>,
    pub oif: Option<u32>,
    pub scope: RouteScope,
}

/// What we read back about an IPv6 route in the main table. (IPv6 routes have no scope: the
/// kernel reports every one as universe, so "on-link" is "no gateway".)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route6Info {
    pub dst: Ipv6Net,
    pub gateway: Option<Ipv6Addr>,
    pub oif: Option<u32>,
}

/// What we read back about an IPv6 address: it, its flags (IFA_F_*: tentative while DAD runs,
/// dadfailed when it found a duplicate) and its scope (link for fe80::/10).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Addr6Info {
    pub net: Ipv6Net,
    pub flags: AddressFlags,
    pub scope: AddressScope,
}

impl Addr6Info {
    /// Still being checked by duplicate address detection (and not failed).
    pub fn tentative(&self) -> bool {
        self.flags.contains(AddressFlags::Tentative) && !self.dad_failed()
    }

    /// Duplicate address detection found another holder: the kernel keeps the address, unusable.
    pub fn dad_failed(&self) -> bool {
        self.flags.contains(AddressFlags::Dadfailed)
    }
}

/// A connection to rtnetlink inside one namespace. The background task is aborted on drop.
pub struct Nl {
    handle: Handle,
    task: tokio::task::JoinHandle<()>,
    ns: String,
}

impl Drop for Nl {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Nl {
    /// Opens a socket inside `ns` (see `Netns::run` for why on another thread) and drives it
    /// from the current tokio runtime.
    pub async fn connect(ns: &Netns) -> Result<Nl> {
        let fd = ns
            .run("create rtnetlink socket", || {
                Socket::new(NETLINK_ROUTE)
                    .map(|s| s.into_raw_fd())
                    .map_err(|e| Error::io("create", "rtnetlink socket", e))
            })
            .await?;
        // SAFETY: `fd` is a fresh socket whose ownership the worker thread gave up.
        let socket = unsafe { TokioSocket::from_raw_fd(fd) };
        let (conn, handle, _) = rtnetlink::from_socket(socket);
        let task = tokio::spawn(conn);
        Ok(Nl { handle, task, ns: ns.path().display().to_string() })
    }

    /// Runs `f` on a connection to `ns` from a thread of its own, with a runtime of its own:
    /// for the requests the kernel carries out inside the request, blocking the thread that
    /// sends it — deleting a veth waits there for an RCU grace period, moving one into another
    /// namespace for the device's unregistration (`strace -T` here: RTM_DELLINK's and the
    /// move's `sendto` take ~15–35 ms, other requests well under 1 ms). Sent from a
    /// single-threaded runtime (the agent's), everything else stood still meanwhile: a CNI
    /// DEL's ready answer, the OVSDB reply and flow commit a warm ADD overlaps with its move,
    /// the other ADDs of a burst.
    pub(crate) async fn detached<T, F, Fut>(ns: &Netns, what: String, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Nl) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>>,
    {
        let ns = ns.clone();
        let object = format!("{what} (netns {})", ns.path().display());
        let work = tokio::task::spawn_blocking(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::io("start a runtime for", what, e))?;
            rt.block_on(async { f(Nl::connect(&ns).await?).await })
        });
        work.await.map_err(|e| Error::Reply { object, reason: format!("its thread failed: {e}") })?
    }

    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    fn object(&self, what: &str) -> String {
        format!("{what} (netns {})", self.ns)
    }

    async fn call<T>(
        &self,
        op: &'static str,
        what: &str,
        fut: impl Future<Output = Result<T, rtnetlink::Error>>,
    ) -> Result<T> {
        match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(Error::Netlink { op, object: self.object(what), source }),
            Err(_) => Err(Error::Timeout { op, object: self.object(what), after: REQUEST_TIMEOUT }),
        }
    }

    pub(crate) async fn collect<T>(
        &self,
        op: &'static str,
        what: &str,
        stream: impl Stream<Item = Result<T, rtnetlink::Error>>,
    ) -> Result<Vec<T>> {
        self.call(op, what, stream.try_collect::<Vec<T>>()).await
    }

    /// The link called `name`, or None.
    pub async fn link_by_name(&self, name: &str) -> Result<Option<Link>> {
        let req = self.handle.link().get().match_name(name).execute();
        match self.collect("get link", &format!("link {name}"), req).await {
            Ok(msgs) => Ok(msgs.iter().map(link_info).next()),
            Err(e) if e.errno() == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The link called `name`; its absence is an error naming `kind` (e.g. "pod interface").
    pub async fn require_link(&self, kind: &'static str, name: &str) -> Result<Link> {
        self.link_by_name(name).await?.ok_or_else(|| Error::NotFound { kind, name: self.object(name) })
    }

    /// Creates a link from a prepared message (NLM_F_EXCL: an existing name is EEXIST).
    pub async fn link_add(&self, msg: LinkMessage, what: &str) -> Result<()> {
        self.call("create", what, self.handle.link().add(msg).execute()).await
    }

    /// Changes a link (flags, MTU, address...) from a prepared message.
    pub async fn link_set(&self, msg: LinkMessage, what: &str) -> Result<()> {
        self.call("change", what, self.handle.link().set(msg).execute()).await
    }

    /// Sets the link up (and optionally its MTU).
    pub async fn link_up(&self, link: &Link, mtu: Option<u32>) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = link.index;
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
        if let Some(mtu) = mtu {
            msg.attributes.push(LinkAttribute::Mtu(mtu));
        }
        self.link_set(msg, &format!("link {}", link.name)).await
    }

    /// Deletes a link; a link that is already gone is success.
    pub async fn link_del(&self, index: u32, name: &str) -> Result<()> {
        let what = format!("link {name}");
        match self.call("delete", &what, self.handle.link().del(index).execute()).await {
            Err(e) if e.errno() == Some(libc::ENODEV) => Ok(()),
            other => other,
        }
    }

    /// IPv4 addresses on a link, as address/prefix.
    pub async fn addrs_v4(&self, link: &Link) -> Result<Vec<Ipv4Net>> {
        let req = self.handle.address().get().set_link_index_filter(link.index).execute();
        let what = format!("addresses of {}", link.name);
        let msgs = self.collect("list", &what, req).await?;
        Ok(msgs.iter().filter(|m| m.header.index == link.index).filter_map(addr_v4).collect())
    }

    /// Adds an IPv4 address. With `no_prefix_route` the kernel does not add the subnet route
    /// (IFA_F_NOPREFIXROUTE), for interfaces whose routes we manage ourselves.
    pub async fn addr_add(&self, link: &Link, addr: Ipv4Net, no_prefix_route: bool) -> Result<()> {
        let mut req = self.handle.address().add(link.index, IpAddr::V4(addr.addr()), addr.prefix_len());
        if no_prefix_route {
            req.message_mut().attributes.push(AddressAttribute::Flags(AddressFlags::Noprefixroute));
        }
        let what = format!("address {addr} on {}", link.name);
        self.call("add", &what, req.execute()).await
    }

    /// Removes an IPv4 address; one already gone is success.
    pub async fn addr_del(&self, link: &Link, addr: Ipv4Net) -> Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.family = AddressFamily::Inet;
        msg.header.index = link.index;
        msg.header.prefix_len = addr.prefix_len();
        msg.attributes.push(AddressAttribute::Local(IpAddr::V4(addr.addr())));
        msg.attributes.push(AddressAttribute::Address(IpAddr::V4(addr.addr())));
        let what = format!("address {addr} on {}", link.name);
        match self.call("delete", &what, self.handle.address().del(msg).execute()).await {
            Err(e) if e.errno() == Some(libc::EADDRNOTAVAIL) => Ok(()),
            other => other,
        }
    }

    /// IPv4 routes of the main table.
    pub async fn routes_v4(&self) -> Result<Vec<RouteInfo>> {
        let msg = rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new().build();
        let req = self.handle.route().get(msg).execute();
        let msgs = self.collect("list", "IPv4 routes", req).await?;
        Ok(msgs.iter().filter_map(route_info).collect())
    }

    /// Adds or replaces (NLM_F_REPLACE) an IPv4 route in the main table through `link`,
    /// via `gateway` or, without one, on-link (scope link).
    pub async fn route_replace(&self, dst: Ipv4Net, gateway: Option<Ipv4Addr>, link: &Link) -> Result<()> {
        let mut b = rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(dst.network(), dst.prefix_len())
            .output_interface(link.index);
        b = match gateway {
            Some(gw) => b.gateway(gw),
            None => b.scope(RouteScope::Link),
        };
        let what = route_name(dst, gateway, &link.name);
        let req = self.handle.route().add(b.build()).replace();
        self.call("add", &what, req.execute()).await
    }

    /// Deletes a main-table IPv4 route to `dst` through link index `oif`; a missing route is
    /// success.
    pub async fn route_del(&self, dst: Ipv4Net, oif: u32, dev: &str) -> Result<()> {
        let mut msg = rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(dst.network(), dst.prefix_len())
            .output_interface(oif)
            .build();
        // Match any protocol/scope: the kernel's own prefix routes are proto kernel.
        msg.header.protocol = Default::default();
        msg.header.scope = RouteScope::NoWhere;
        let what = route_name(dst, None::<Ipv4Addr>, dev);
        match self.call("delete", &what, self.handle.route().del(msg).execute()).await {
            Err(e) if e.errno() == Some(libc::ESRCH) => Ok(()),
            other => other,
        }
    }

    /// IPv6 addresses on a link, with their flags and scope (link-local ones included).
    pub async fn addrs_v6(&self, link: &Link) -> Result<Vec<Addr6Info>> {
        let req = self.handle.address().get().set_link_index_filter(link.index).execute();
        let what = format!("addresses of {}", link.name);
        let msgs = self.collect("list", &what, req).await?;
        Ok(msgs.iter().filter(|m| m.header.index == link.index).filter_map(addr_v6).collect())
    }

    /// Adds an IPv6 address with IFA_F_* `flags` (e.g. NOPREFIXROUTE, NODAD).
    pub async fn addr_add_v6(&self, link: &Link, addr: Ipv6Net, flags: AddressFlags) -> Result<()> {
        let mut req = self.handle.address().add(link.index, IpAddr::V6(addr.addr()), addr.prefix_len());
        if !flags.is_empty() {
            req.message_mut().attributes.push(AddressAttribute::Flags(flags));
        }
        let what = format!("address {addr} on {}", link.name);
        self.call("add", &what, req.execute()).await
    }

    /// Removes an IPv6 address; one already gone is success.
    pub async fn addr_del_v6(&self, link: &Link, addr: Ipv6Net) -> Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.family = AddressFamily::Inet6;
        msg.header.index = link.index;
        msg.header.prefix_len = addr.prefix_len();
        msg.attributes.push(AddressAttribute::Address(IpAddr::V6(addr.addr())));
        let what = format!("address {addr} on {}", link.name);
        match self.call("delete", &what, self.handle.address().del(msg).execute()).await {
            Err(e) if e.errno() == Some(libc::EADDRNOTAVAIL) => Ok(()),
            other => other,
        }
    }

    /// IPv6 routes of the main table.
    pub async fn routes_v6(&self) -> Result<Vec<Route6Info>> {
        let msg = rtnetlink::RouteMessageBuilder::<Ipv6Addr>::new().build();
        let req = self.handle.route().get(msg).execute();
        let msgs = self.collect("list", "IPv6 routes", req).await?;
        Ok(msgs.iter().filter_map(route6_info).collect())
    }

    /// Adds or replaces (NLM_F_REPLACE) an IPv6 route in the main table through `link`, via
    /// `gateway` or, without one, on-link.
    pub async fn route_replace_v6(&self, dst: Ipv6Net, gateway: Option<Ipv6Addr>, link: &Link) -> Result<()> {
        let mut b = rtnetlink::RouteMessageBuilder::<Ipv6Addr>::new()
            .destination_prefix(dst.network(), dst.prefix_len())
            .output_interface(link.index);
        if let Some(gw) = gateway {
            b = b.gateway(gw);
        }
        let what = route_name(dst, gateway, &link.name);
        let req = self.handle.route().add(b.build()).replace();
        self.call("add", &what, req.execute()).await
    }

    /// Deletes a main-table IPv6 route to `dst` through link index `oif`; a missing route is
    /// success.
    pub async fn route_del_v6(&self, dst: Ipv6Net, oif: u32, dev: &str) -> Result<()> {
        let mut msg = rtnetlink::RouteMessageBuilder::<Ipv6Addr>::new()
            .destination_prefix(dst.network(), dst.prefix_len())
            .output_interface(oif)
            .build();
        msg.header.protocol = Default::default();
        msg.header.scope = RouteScope::NoWhere;
        let what = route_name(dst, None::<Ipv6Addr>, dev);
        match self.call("delete", &what, self.handle.route().del(msg).execute()).await {
            Err(e) if e.errno() == Some(libc::ESRCH) => Ok(()),
            other => other,
        }
    }
}

fn route_name(dst: impl std::fmt::Display, gateway: Option<impl std::fmt::Display>, dev: &str) -> String {
    match gateway {
        Some(gw) => format!("route {dst} via {gw} dev {dev}"),
        None => format!("route {dst} dev {dev}"),
    }
}

fn link_info(m: &LinkMessage) -> Link {
    let mut link = Link {
        index: m.header.index,
        name: String::new(),
        mac: None,
        mtu: None,
        up: m.header.flags.contains(LinkFlags::Up),
        peer: None,
    };
    for a in &m.attributes {
        match a {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Address(a) => link.mac = <[u8; 6]>::try_from(a.as_slice()).ok(),
            LinkAttribute::Mtu(m) => link.mtu = Some(*m),
            LinkAttribute::Link(p) => link.peer = Some(*p),
            _ => {}
        }
    }
    link
}

fn addr_v4(m: &AddressMessage) -> Option<Ipv4Net> {
    if m.header.family != AddressFamily::Inet {
        return None;
    }
    // IFA_LOCAL is the interface's own address; IFA_ADDRESS is the peer on point-to-point
    // links, so prefer LOCAL.
    let mut local = None;
    let mut address = None;
    for a in &m.attributes {
        match a {
            AddressAttribute::Local(IpAddr::V4(ip)) => local = Some(*ip),
            AddressAttribute::Address(IpAddr::V4(ip)) => address = Some(*ip),
            _ => {}
        }
    }
    Ipv4Net::new(local.or(address)?, m.header.prefix_len).ok()
}

fn addr_v6(m: &AddressMessage) -> Option<Addr6Info> {
    if m.header.family != AddressFamily::Inet6 {
        return None;
    }
    let mut local = None;
    let mut address = None;
    // IFA_FLAGS (32 bits) supersedes the header's 8 when present.
    let mut flags = AddressFlags::from_bits_retain(u32::from(m.header.flags.bits()));
    for a in &m.attributes {
        match a {
            AddressAttribute::Local(IpAddr::V6(ip)) => local = Some(*ip),
            AddressAttribute::Address(IpAddr::V6(ip)) => address = Some(*ip),
            AddressAttribute::Flags(f) => flags = *f,
            _ => {}
        }
    }
    let net = Ipv6Net::new(local.or(address)?, m.header.prefix_len).ok()?;
    Some(Addr6Info { net, flags, scope: m.header.scope })
}

fn route6_info(m: &RouteMessage) -> Option<Route6Info> {
    if m.header.address_family != AddressFamily::Inet6 {
        return None;
    }
    let mut table = u32::from(m.header.table);
    let mut dst = Ipv6Addr::UNSPECIFIED;
    let mut gateway = None;
    let mut oif = None;
    for a in &m.attributes {
        match a {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(RouteAddress::Inet6(ip)) => dst = *ip,
            RouteAttribute::Gateway(RouteAddress::Inet6(ip)) => gateway = Some(*ip),
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    if table != u32::from(RouteHeader::RT_TABLE_MAIN) {
        return None;
    }
    Some(Route6Info { dst: Ipv6Net::new(dst, m.header.destination_prefix_length).ok()?, gateway, oif })
}

fn route_info(m: &RouteMessage) -> Option<RouteInfo> {
    if m.header.address_family != AddressFamily::Inet {
        return None;
    }
    let mut table = u32::from(m.header.table);
    let mut dst = Ipv4Addr::UNSPECIFIED;
    let mut gateway = None;
    let mut oif = None;
    for a in &m.attributes {
        match a {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = *ip,
            RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gateway = Some(*ip),
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    if table != u32::from(RouteHeader::RT_TABLE_MAIN) {
        return None;
    }
    Some(RouteInfo {
        dst: Ipv4Net::new(dst, m.header.destination_prefix_length).ok()?,
        gateway,
        oif,
        scope: m.header.scope,
    })
}
