//! What br0 itself says about the node, for a trace run without the model.
//!
//! Without a state file or the agent, an address alone does not say where a packet enters the
//! bridge, and guessing (tun0) gives wrong verdicts: a pod's packet would get VNID 0. The
//! pipeline the agent installed answers instead. Table 20 holds, per local pod,
//! `in_port=N,ip,nw_src=IP actions=load:VNID->NXM_NX_REG0[]` (and the ARP twin with the pod's
//! MAC and its container ID as a note); table 30 routes the local subnet (to 70), the cluster
//! network (to 90) and the service network (to 60); table 90 sends each other node's subnet to
//! its host IP. These are read over OpenFlow (a flow dump of the three tables), never by
//! exec'ing ovs-ofctl.
//!
//! A remote pod's VNID is not here: the sender's node puts it in the VXLAN header, and this node
//! keeps no record of other nodes' namespaces. Callers must get it elsewhere (`--vnid`).

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use ipnet::Ipv4Net;
use openflow::{Action, EthMatch, FlowStatsRequest, Instruction, Masked, Match, NxmField, SetField};

use crate::pipeline::{Reg, Table};
use crate::switch::{Switch, SwitchOptions};

/// A local pod as table 20 shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortPod {
    pub ip: Ipv4Addr,
    pub ofport: u32,
    /// The VNID table 20 loads into reg0 for the pod's packets.
    pub vnid: u32,
    /// `arp_sha` of the pod's ARP flow.
    pub mac: Option<String>,
    /// The ARP flow's note: the pod's container ID (hex).
    pub container_id: Option<String>,
}

/// Another node's subnet as table 90 shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteSubnet {
    pub subnet: Ipv4Net,
    pub host_ip: Ipv4Addr,
}

/// The pipeline's view of the node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwitchView {
    pub pods: Vec<PortPod>,
    pub remote: Vec<RemoteSubnet>,
    /// Table 30's route to table 70.
    pub local_subnet: Option<Ipv4Net>,
    /// Table 30's routes to table 90 (one per cluster network).
    pub cluster_networks: Vec<Ipv4Net>,
    /// Table 30's route to table 60.
    pub service_network: Option<Ipv4Net>,
}

/// The tables the view is built from.
const TABLES: [Table; 3] = [Table::PodIngress, Table::Routing, Table::RemoteIp];

fn net(m: &Masked<Ipv4Addr>) -> Option<Ipv4Net> {
    Ipv4Net::new(m.value(), m.prefix_len()?).ok()
}

fn host(m: &Option<Masked<Ipv4Addr>>) -> Option<Ipv4Addr> {
    m.as_ref().filter(|m| m.is_exact()).map(|m| m.value())
}

fn actions(ins: &[Instruction]) -> impl Iterator<Item = &Action> {
    ins.iter()
        .filter_map(|i| match i {
            Instruction::ApplyActions(a) | Instruction::WriteActions(a) => Some(a.iter()),
            _ => None,
        })
        .flatten()
}

fn goto(ins: &[Instruction]) -> Option<u8> {
    ins.iter().find_map(|i| match i {
        Instruction::GotoTable(t) => Some(*t),
        _ => None,
    })
}

/// The value a flow loads into the whole of `reg` (as `load:` or, as OVS may store it,
/// `set_field:`).
fn loaded(ins: &[Instruction], reg: Reg) -> Option<u32> {
    actions(ins).find_map(|a| match a {
        Action::RegLoad { dst, value } if dst.field() == NxmField::Reg(reg.n()) && dst.is_whole() => {
            u32::try_from(*value).ok()
        }
        Action::SetField(SetField::Reg(n, v)) if *n == reg.n() => Some(*v),
        _ => None,
    })
}

/// The container ID a pod's ARP flow carries as its note (32 bytes, then OVS's padding).
fn container_id(ins: &[Instruction]) -> Option<String> {
    actions(ins).find_map(|a| match a {
        Action::Note(n) if n.bytes().len() >= 32 => Some(n.bytes()[..32].iter().map(|b| format!("{b:02x}")).collect()),
        _ => None,
    })
}

impl SwitchView {
    /// Learns from one installed flow; flows of other shapes are ignored.
    pub fn add(&mut self, table: u8, m: &Match, ins: &[Instruction]) {
        match table {
            t if t == Table::PodIngress.id() => self.add_pod_flow(m, ins),
            t if t == Table::Routing.id() => {
                let EthMatch::Ipv4(ip) = &m.eth else { return };
                let (None, None, Some(dst)) = (m.in_port, ip.src, ip.dst.as_ref().and_then(net)) else { return };
                match goto(ins) {
                    Some(t) if t == Table::PodIp.id() => self.local_subnet = Some(dst),
                    Some(t) if t == Table::RemoteIp.id() => self.cluster_networks.push(dst),
                    Some(t) if t == Table::ServiceIp.id() => self.service_network = Some(dst),
                    _ => {}
                }
            }
            t if t == Table::RemoteIp.id() => {
                let EthMatch::Ipv4(ip) = &m.eth else { return };
                let Some(subnet) = ip.dst.as_ref().and_then(net) else { return };
                let host_ip = actions(ins).find_map(|a| match a {
                    Action::SetField(SetField::TunDst(h)) => Some(*h),
                    _ => None,
                });
                if let Some(host_ip) = host_ip {
                    self.remote.push(RemoteSubnet { subnet, host_ip });
                }
            }
            _ => {}
        }
    }

    fn add_pod_flow(&mut self, m: &Match, ins: &[Instruction]) {
        let Some(ofport) = m.in_port.map(|p| p.0) else { return };
        match &m.eth {
            EthMatch::Ipv4(ip) => {
                let (Some(ip), Some(vnid)) = (host(&ip.src), loaded(ins, Reg::SrcVnid)) else { return };
                match self.pods.iter_mut().find(|p| p.ip == ip && p.ofport == ofport) {
                    Some(p) => p.vnid = vnid,
                    None => self.pods.push(PortPod { ip, ofport, vnid, mac: None, container_id: None }),
                }
            }
            EthMatch::Arp(arp) => {
                let Some(ip) = host(&arp.spa) else { return };
                let mac = arp.sha.filter(|m| m.is_exact()).map(|m| m.value().to_string());
                let container_id = container_id(ins);
                match self.pods.iter_mut().find(|p| p.ip == ip && p.ofport == ofport) {
                    Some(p) => (p.mac, p.container_id) = (mac, container_id),
                    // The VNID comes with the IP flow; an ARP flow alone says nothing of it.
                    None => {
                        if let Some(vnid) = loaded(ins, Reg::SrcVnid) {
                            self.pods.push(PortPod { ip, ofport, vnid, mac, container_id });
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// The local pods table 20 admits with source address `ip` (more than one is a conflict
    /// the caller reports).
    pub fn pods_with_ip(&self, ip: Ipv4Addr) -> Vec<&PortPod> {
        self.pods.iter().filter(|p| p.ip == ip).collect()
    }

    pub fn remote_of(&self, ip: Ipv4Addr) -> Option<&RemoteSubnet> {
        self.remote.iter().filter(|r| r.subnet.contains(&ip)).max_by_key(|r| r.subnet.prefix_len())
    }

    /// True if table 30 routes any address at all: the pipeline is there.
    pub fn has_pipeline(&self) -> bool {
        self.local_subnet.is_some() || !self.cluster_networks.is_empty()
    }
}

/// Reads tables 20, 30 and 90 of `bridge` through its management socket `mgmt`.
pub async fn read(mgmt: &Path, timeout: Duration) -> Result<SwitchView, String> {
    let target = format!("unix:{}", mgmt.display());
    let opts = SwitchOptions {
        request_timeout: timeout,
        handshake_timeout: timeout,
        echo_interval: None,
        ..SwitchOptions::default()
    };
    let dump = async {
        let sw = Switch::connect(&target, opts).await.map_err(|e| e.to_string())?;
        let dumps = TABLES.map(|t| sw.dump_flows(FlowStatsRequest { table_id: t.id(), ..FlowStatsRequest::default() }));
        let mut view = SwitchView::default();
        for flows in futures::future::join_all(dumps).await {
            for f in flows.map_err(|e| format!("flow dump: {e}"))? {
                view.add(f.table_id, &f.match_, &f.instructions);
            }
        }
        Ok::<_, String>(view)
    };
    tokio::time::timeout(timeout, dump)
        .await
        .map_err(|_| format!("{target}: no answer within {timeout:?}"))?
        .map_err(|e| format!("{target}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ContainerId, OfPort, Plugin, Vnid};
    use crate::pipeline::{base, pod, subnet, NodeConfig};

    fn view_of(flows: &[crate::pipeline::Flow]) -> SwitchView {
        let mut v = SwitchView::default();
        for f in flows {
            v.add(f.table.id(), &f.match_, &f.instructions);
        }
        v
    }

    fn pod_port(ofport: u32, ip: &str, vnid: u32) -> pod::PodPort {
        pod::PodPort {
            ip6: None,
            ofport: OfPort(ofport),
            ip: ip.parse().unwrap(),
            mac: format!("0a:58:0a:80:02:{ofport:02x}").parse().unwrap(),
            container_id: ContainerId::parse(&format!("{ofport:02x}").repeat(32)).unwrap(),
            vnid: Vnid::new(vnid).unwrap(),
        }
    }

    #[test]
    fn the_pipeline_names_its_pods_and_networks() {
        let cfg = NodeConfig {
            ipv6: None,
            plugin: Plugin::Multitenant,
            cluster_network: "10.128.0.0/14".parse().unwrap(),
            service_network: "172.30.0.0/16".parse().unwrap(),
            local_subnet: "10.128.2.0/23".parse().unwrap(),
        };
        let mut flows = base::flows(&cfg);
        flows.extend(pod::flows(&pod_port(3, "10.128.2.5", 11)));
        flows.extend(pod::flows(&pod_port(4, "10.128.3.200", 4097)));
        let remote = subnet::RemoteSubnet {
            subnet6: None,
            host_ip: "172.17.0.3".parse().unwrap(),
            subnet: "10.129.0.0/23".parse().unwrap(),
            fixed_vnid: Some(Vnid::new(7).unwrap()),
        };
        flows.extend(subnet::flows(&remote));
        let v = view_of(&flows);
        assert_eq!(
            v.pods,
            vec![
                PortPod {
                    ip: "10.128.2.5".parse().unwrap(),
                    ofport: 3,
                    vnid: 11,
                    mac: Some("0a:58:0a:80:02:03".into()),
                    container_id: Some("03".repeat(32)),
                },
                PortPod {
                    ip: "10.128.3.200".parse().unwrap(),
                    ofport: 4,
                    vnid: 4097,
                    mac: Some("0a:58:0a:80:02:04".into()),
                    container_id: Some("04".repeat(32)),
                },
            ]
        );
        assert_eq!(v.local_subnet, Some("10.128.2.0/23".parse().unwrap()));
        assert_eq!(v.cluster_networks, vec!["10.128.0.0/14".parse::<Ipv4Net>().unwrap()]);
        assert_eq!(v.service_network, Some("172.30.0.0/16".parse().unwrap()));
        assert_eq!(
            v.remote_of("10.129.1.7".parse().unwrap()).map(|r| r.host_ip.to_string()).as_deref(),
            Some("172.17.0.3")
        );
        assert_eq!(v.remote_of("10.130.0.1".parse().unwrap()), None);
        assert!(v.has_pipeline());
        assert!(v.pods_with_ip("10.128.2.6".parse().unwrap()).is_empty());
    }

    #[test]
    fn a_set_field_load_is_read_as_well() {
        // OVS may hand a whole-register load back as set_field.
        let m = Match { in_port: Some(OfPort(9).into()), ..Match::any() }.ipv4(openflow::Ipv4Match {
            src: Some(Masked::exact("10.128.2.9".parse().unwrap())),
            ..Default::default()
        });
        let ins =
            vec![Instruction::ApplyActions(vec![Action::SetField(SetField::Reg(0, 12))]), Instruction::GotoTable(21)];
        let mut v = SwitchView::default();
        v.add(20, &m, &ins);
        assert_eq!(v.pods.len(), 1);
        assert_eq!((v.pods[0].ofport, v.pods[0].vnid), (9, 12));
        // A flow without a VNID load is not a pod's.
        let mut v = SwitchView::default();
        v.add(20, &m, &[Instruction::GotoTable(21)]);
        assert!(v.pods.is_empty());
        assert!(!v.has_pipeline());
    }
}
