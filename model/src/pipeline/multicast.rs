//! UpdateLocalMulticastFlows / UpdateVXLANMulticastFlows.

use std::net::IpAddr;

use openflow::Match;

use super::{output, subnet::move_reg0_to_tun_id, subnet::set_tun_dst, Flow, Reg, Table, DEFAULT_PRIORITY};
use crate::domain::{OfPort, Vnid};

/// A VNID's local multicast flows: allowed out (110) if enabled, delivered to its local pods
/// (120) if enabled and it has any. Outputs are ordered as the seed orders them: sorted as the
/// strings `output:N` (so `output:10` comes before `output:3`).
pub fn local_flows(vnid: Vnid, enabled: bool, ofports: &[OfPort]) -> Vec<Flow> {
    let mut out = Vec::new();
    if !enabled {
        return out;
    }
    let by_vnid = Match::any().reg(Reg::SrcVnid.n(), vnid.get());
    out.push(Flow::new(Table::MulticastOut, DEFAULT_PRIORITY, by_vnid.clone(), vec![], Some(Table::MulticastVxlan)));
    if !ofports.is_empty() {
        let mut ports: Vec<OfPort> = ofports.to_vec();
        ports.sort_by_key(|p| p.0.to_string());
        ports.dedup();
        out.push(Flow::new(Table::MulticastLocal, 100, by_vnid, ports.into_iter().map(output).collect(), None));
    }
    out
}

/// Table 111's single flow: copy to every remote node (sorted as the seed sorts the strings
/// `set_field:IP->tun_dst,output:1`), then deliver locally.
pub fn vxlan_flow(remote_ips: &[IpAddr]) -> Flow {
    let mut ips: Vec<IpAddr> = remote_ips.to_vec();
    let field = |ip: &IpAddr| if ip.is_ipv4() { "tun_dst" } else { "tun_ipv6_dst" };
    ips.sort_by_key(|ip| format!("set_field:{ip}->{},output:1", field(ip)));
    ips.dedup();
    let mut actions = Vec::new();
    if !ips.is_empty() {
        actions.push(move_reg0_to_tun_id());
        for ip in ips {
            actions.push(set_tun_dst(ip));
            actions.push(output(OfPort::VXLAN));
        }
    }
    Flow::new(Table::MulticastVxlan, 100, Match::any(), actions, Some(Table::MulticastLocal))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_ordering() {
        let v = Vnid::new(11).unwrap();
        let f = local_flows(v, true, &[OfPort(3), OfPort(10), OfPort(25)]);
        assert_eq!(f[0].to_string(), "table=110, reg0=0xb actions=goto_table:111");
        assert_eq!(f[1].to_string(), "table=120, priority=100,reg0=0xb actions=output:10,output:25,output:3");
        assert!(local_flows(v, false, &[OfPort(3)]).is_empty());
        assert_eq!(local_flows(v, true, &[]).len(), 1);
        let x = vxlan_flow(&["172.17.0.4".parse().unwrap(), "172.17.0.10".parse().unwrap()]);
        assert_eq!(
            x.to_string(),
            "table=111, priority=100 actions=move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31],set_field:172.17.0.10->tun_dst,output:1,set_field:172.17.0.4->tun_dst,output:1,goto_table:120"
        );
        assert_eq!(vxlan_flow(&[]).to_string(), "table=111, priority=100 actions=goto_table:120");
    }
}
