//! Table 80 as openshift-sdn's policy plugins program it.

use openflow::Match;

use super::{output_reg2, Flow, Reg, Table};
use crate::domain::{Plugin, Vnid};

/// The plugin's fixed rules: subnet delivers everything; multitenant delivers from and to
/// VNID 0 (the global network); networkpolicy tracks, accepts replies and accepts pods no
/// policy selects ([`super::netpol::plugin_flows`], for each family the node has).
pub fn plugin_flows(cfg: &super::NodeConfig) -> Vec<Flow> {
    match cfg.plugin {
        Plugin::Subnet => vec![Flow::new(Table::Policy, 200, Match::any(), vec![output_reg2()], None)],
        Plugin::Multitenant => vec![
            Flow::new(Table::Policy, 200, Match::any().reg(Reg::SrcVnid.n(), 0), vec![output_reg2()], None),
            // Both VNID-0 accepts at priority 200, as openshift-sdn has them (its own
            // full-dump tests expect it, and a takeover must change no flow). They overlap
            // (reg0=0 and reg1=0 can both hold) at equal priority, but with identical actions,
            // so no packet's fate depends on which entry wins.
            Flow::new(Table::Policy, 200, Match::any().reg(Reg::DstVnid.n(), 0), vec![output_reg2()], None),
        ],
        Plugin::NetworkPolicy => super::netpol::plugin_flows(cfg),
    }
}

/// EnsureVNIDRules: within one VNID, delivery is allowed. Present exactly while a local pod
/// or a service uses the VNID (the store derives that set from the model: no dump parsing).
pub fn vnid_flow(vnid: Vnid) -> Flow {
    Flow::new(
        Table::Policy,
        100,
        Match::any().reg(Reg::SrcVnid.n(), vnid.get()).reg(Reg::DstVnid.n(), vnid.get()),
        vec![output_reg2()],
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text() {
        let cfg = |plugin| super::super::NodeConfig { plugin, ipv4: None, ipv6: None };
        assert_eq!(plugin_flows(&cfg(Plugin::Subnet))[0].to_string(), "table=80, priority=200 actions=output:NXM_NX_REG2[]");
        let m = plugin_flows(&cfg(Plugin::Multitenant));
        assert_eq!(m[1].to_string(), "table=80, priority=200,reg1=0 actions=output:NXM_NX_REG2[]");
        assert_eq!(vnid_flow(Vnid::new(11).unwrap()).to_string(), "table=80, priority=100,reg0=0xb,reg1=0xb actions=output:NXM_NX_REG2[]");
    }
}
