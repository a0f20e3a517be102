//! What a node interface is, for deciding whether a request may put it on the bridge: its
//! kind (veth, OVS internal port, a NIC...), the addresses it carries, and whether the node's
//! default route leaves through it. Read over rtnetlink in the node's namespace; the policy is
//! the caller's.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use rtnetlink::packet_route::{
    address::{AddressAttribute, AddressScope},
    link::{LinkAttribute, LinkInfo},
    route::{RouteAttribute, RouteHeader},
    AddressFamily,
};

use crate::{error::Result, nl::Nl, Netns};

/// A node interface as the kernel describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostInterface {
    pub index: u32,
    pub name: String,
    /// IFLA_INFO_KIND (`veth`, `openvswitch`, `bridge`...); `None` for a physical NIC.
    pub kind: Option<String>,
    /// Addresses other than IPv6 link-local ones (which every interface that is up gets).
    pub addresses: Vec<IpNet>,
    /// The main table's IPv4 or IPv6 default route leaves through it (alone or as one of its
    /// next hops).
    pub default_route: bool,
}

/// The interface called `name` in `ns`, or `None` if there is none.
pub async fn host_interface(ns: &Netns, name: &str) -> Result<Option<HostInterface>> {
    let nl = Nl::connect(ns).await?;
    let req = nl.handle().link().get().match_name(name.to_string()).execute();
    let links = match nl.collect("get link", &format!("link {name}"), req).await {
        Ok(l) => l,
        Err(e) if e.errno() == Some(libc::ENODEV) => return Ok(None),
        Err(e) => return Err(e),
    };
    let Some(link) = links.into_iter().next() else { return Ok(None) };
    let index = link.header.index;
    let mut kind = None;
    for a in &link.attributes {
        if let LinkAttribute::LinkInfo(infos) = a {
            for i in infos {
                if let LinkInfo::Kind(k) = i {
                    kind = Some(k.to_string());
                }
            }
        }
    }
    let req = nl.handle().address().get().set_link_index_filter(index).execute();
    let addrs = nl.collect("list", &format!("addresses of {name}"), req).await?;
    let addresses = addrs
        .iter()
        .filter(|m| m.header.index == index)
        .filter(|m| !(m.header.family == AddressFamily::Inet6 && m.header.scope == AddressScope::Link))
        .filter_map(|m| {
            let mut local = None;
            let mut address = None;
            for a in &m.attributes {
                match a {
                    AddressAttribute::Local(ip) => local = Some(*ip),
                    AddressAttribute::Address(ip) => address = Some(*ip),
                    _ => {}
                }
            }
            IpNet::new(local.or(address)?, m.header.prefix_len).ok()
        })
        .collect();
    let mut default_route = false;
    let v4 = nl.handle().route().get(rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new().build()).execute();
    let v6 = nl.handle().route().get(rtnetlink::RouteMessageBuilder::<Ipv6Addr>::new().build()).execute();
    let routes = [nl.collect("list", "IPv4 routes", v4).await?, nl.collect("list", "IPv6 routes", v6).await?];
    for m in routes.iter().flatten() {
        let mut table = u32::from(m.header.table);
        let mut oifs = Vec::new();
        for a in &m.attributes {
            match a {
                RouteAttribute::Table(t) => table = *t,
                RouteAttribute::Oif(i) => oifs.push(*i),
                RouteAttribute::MultiPath(hops) => oifs.extend(hops.iter().map(|h| h.interface_index)),
                _ => {}
            }
        }
        if table == u32::from(RouteHeader::RT_TABLE_MAIN)
            && m.header.destination_prefix_length == 0
            && oifs.contains(&index)
        {
            default_route = true;
        }
    }
    let name = link
        .attributes
        .iter()
        .find_map(|a| if let LinkAttribute::IfName(n) = a { Some(n.clone()) } else { None })
        .unwrap_or_else(|| name.to_string());
    Ok(Some(HostInterface { index, name, kind, addresses, default_route }))
}
