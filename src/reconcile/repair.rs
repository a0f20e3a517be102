//! What someone else removed or changed in OVSDB, found by comparing the sentinel's
//! [`Snapshot`] with what the model says must be there. Pure: the reconciler turns each
//! [`Finding`] into a repair through its usual converge path (the base ports through
//! `ensure_base`, a pod's port through `add_pod_port` with its record), counts it in
//! `sdn_node_repairs_total{what}` and logs it.
//!
//! Only what the agent has confirmed is expected: a pod's port counts once the model holds its
//! [`PortState`] (a request still setting it up, or tearing it down, is not in that map), so a
//! request in flight is never "repaired" under its own feet.

use std::collections::BTreeMap;
use std::fmt;

use crate::cluster::PodKey;
use crate::ovsdb::sentinel::Snapshot;

use crate::node::ports::GENERATION_KEY;
use crate::node::ports::BaseSpec;
use crate::node::record::POD_KEY;
use crate::node::state::PortState;

/// What must be in OVSDB.
#[derive(Clone, Debug)]
pub struct Expected {
    pub bridge: String,
    /// The datapath type this run found or gave the bridge (`None`: not set up yet).
    pub datapath_type: Option<String>,
    pub base: BaseSpec,
    /// The flow generation stored on the bridge (once the agent has stored one).
    pub generation: Option<u32>,
    /// Confirmed pod ports, with the record an API pod's port carries.
    pub pods: BTreeMap<PodKey, (PortState, Option<String>)>,
}

/// One thing that is not as the model says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// No `Open_vSwitch` row: the database is empty.
    EmptyDatabase,
    BridgeMissing,
    /// A bridge column differs (`fail_mode`, `protocols`, `datapath_type`).
    BridgeSetting { column: &'static str, want: String, have: String },
    /// vxlan0 or tun0 is missing or differs (`what`: which column).
    BasePort { port: &'static str, what: String },
    /// The flow generation key is missing or differs.
    Generation { want: u32, have: Option<String> },
    PodPort { pod: PodKey, port: String },
    PodRecord { pod: PodKey, port: String },
    PodQos { pod: PodKey, port: String, what: &'static str },
}

impl Finding {
    /// The `what` label of `sdn_node_repairs_total`.
    pub fn what(&self) -> &'static str {
        match self {
            Finding::EmptyDatabase | Finding::BridgeMissing => "bridge",
            Finding::BridgeSetting { .. } => "bridge_setting",
            Finding::BasePort { .. } => "base_port",
            Finding::Generation { .. } => "generation",
            Finding::PodPort { .. } => "pod_port",
            Finding::PodRecord { .. } => "pod_record",
            Finding::PodQos { .. } => "qos",
        }
    }

    /// The pod whose port needs setting up again, if it is a pod's.
    pub fn pod(&self) -> Option<&PodKey> {
        match self {
            Finding::PodPort { pod, .. } | Finding::PodRecord { pod, .. } | Finding::PodQos { pod, .. } => Some(pod),
            _ => None,
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::EmptyDatabase => write!(f, "the database has no Open_vSwitch row (empty database)"),
            Finding::BridgeMissing => write!(f, "the bridge is gone"),
            Finding::BridgeSetting { column, want, have } => write!(f, "bridge {column} is {have:?}, not {want:?}"),
            Finding::BasePort { port, what } => write!(f, "{port}: {what}"),
            Finding::Generation { want, have } => write!(f, "bridge external_ids:{GENERATION_KEY} is {have:?}, not {want}"),
            Finding::PodPort { pod, port } => write!(f, "pod {}/{}: port {port:?} is gone from the bridge", pod.0, pod.1),
            Finding::PodRecord { pod, port } => write!(f, "pod {}/{}: port {port:?} lost its record (external_ids:{POD_KEY})", pod.0, pod.1),
            Finding::PodQos { pod, port, what } => write!(f, "pod {}/{}: port {port:?} lost its {what}", pod.0, pod.1),
        }
    }
}

/// Everything in `snap` that differs from `want`. An empty database or a missing bridge is
/// reported alone: everything on it is gone too, and the base repair brings the pods back.
pub fn inspect(snap: &Snapshot, want: &Expected) -> Vec<Finding> {
    if !snap.root {
        return vec![Finding::EmptyDatabase];
    }
    let Some(br) = snap.bridges.get(&want.bridge) else { return vec![Finding::BridgeMissing] };
    let mut out = Vec::new();
    let opts = crate::ovsdb::BridgeOptions::default();
    let want_protocols: std::collections::BTreeSet<String> = opts.protocols.iter().cloned().collect();
    if br.fail_mode != opts.fail_mode {
        out.push(Finding::BridgeSetting { column: "fail_mode", want: opts.fail_mode.unwrap_or_default(), have: br.fail_mode.clone().unwrap_or_default() });
    }
    if br.protocols != want_protocols {
        out.push(Finding::BridgeSetting {
            column: "protocols",
            want: opts.protocols.join(","),
            have: br.protocols.iter().cloned().collect::<Vec<_>>().join(","),
        });
    }
    if let Some(dp) = want.datapath_type.as_ref().filter(|dp| !crate::options::DatapathType::same(dp, &br.datapath_type)) {
        out.push(Finding::BridgeSetting { column: "datapath_type", want: dp.clone(), have: br.datapath_type.clone() });
    }
    if let Some(g) = want.generation {
        let have = br.external_ids.get(GENERATION_KEY);
        if have.map(String::as_str) != Some(g.to_string().as_str()) {
            out.push(Finding::Generation { want: g, have: have.cloned() });
        }
    }
    out.extend(base_port(snap, &br.ports, "vxlan0", |i| {
        let mut options: BTreeMap<String, String> = [("remote_ip", "flow"), ("key", "flow")].into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        if want.base.vxlan_port != 4789 {
            options.insert("dst_port".into(), want.base.vxlan_port.to_string());
        }
        if i.iface_type != "vxlan" {
            Some(format!("type is {:?}, not \"vxlan\"", i.iface_type))
        } else if i.options != options {
            Some(format!("options are {:?}, not {options:?}", i.options))
        } else if i.ofport_request != Some(1) {
            Some(format!("ofport_request is {:?}, not 1", i.ofport_request))
        } else {
            None
        }
    }));
    out.extend(base_port(snap, &br.ports, "tun0", |i| {
        let mac = want.base.tun_mac.map(|m| m.to_string());
        if i.iface_type != "internal" {
            Some(format!("type is {:?}, not \"internal\"", i.iface_type))
        } else if i.ofport_request != Some(2) {
            Some(format!("ofport_request is {:?}, not 2", i.ofport_request))
        } else if mac.is_some() && i.mac != mac {
            Some(format!("mac is {:?}, not {mac:?}", i.mac))
        } else {
            None
        }
    }));
    for (pod, (port, record)) in &want.pods {
        let name = &port.host_veth;
        let Some(p) = snap.ports.get(name).filter(|_| br.ports.contains(name)) else {
            out.push(Finding::PodPort { pod: pod.clone(), port: name.clone() });
            continue;
        };
        if let Some(r) = record {
            if p.external_ids.get(POD_KEY) != Some(r) {
                out.push(Finding::PodRecord { pod: pod.clone(), port: name.clone() });
            }
        }
        let (ingress, egress) = port.bandwidth;
        if ingress > 0 && !p.has_qos {
            out.push(Finding::PodQos { pod: pod.clone(), port: name.clone(), what: "QoS (ingress limit)" });
        }
        if egress > 0 && snap.interfaces.get(name).and_then(|i| i.ingress_policing_rate) != Some(egress / 1024) {
            out.push(Finding::PodQos { pod: pod.clone(), port: name.clone(), what: "ingress_policing_rate (egress limit)" });
        }
    }
    out
}

fn base_port(
    snap: &Snapshot,
    on_bridge: &std::collections::BTreeSet<String>,
    port: &'static str,
    check: impl Fn(&crate::ovsdb::sentinel::InterfaceRow) -> Option<String>,
) -> Option<Finding> {
    if !on_bridge.contains(port) {
        return Some(Finding::BasePort { port, what: "port is gone from the bridge".into() });
    }
    match snap.interfaces.get(port) {
        None => Some(Finding::BasePort { port, what: "interface is gone".into() }),
        Some(i) => check(i).map(|what| Finding::BasePort { port, what }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ovsdb::sentinel::{BridgeRow, InterfaceRow, PortRow};

    fn healthy() -> (Snapshot, Expected) {
        let mut s = Snapshot { root: true, ..Default::default() };
        let mut br = BridgeRow {
            fail_mode: Some("secure".into()),
            protocols: ["OpenFlow13".to_string()].into(),
            datapath_type: "netdev".into(),
            external_ids: [(GENERATION_KEY.to_string(), "3".to_string())].into(),
            ports: Default::default(),
        };
        for (name, t, req) in [("vxlan0", "vxlan", 1), ("tun0", "internal", 2)] {
            br.ports.insert(name.into());
            s.ports.insert(name.into(), PortRow::default());
            let options = if t == "vxlan" { [("remote_ip", "flow"), ("key", "flow")].into_iter().map(|(k, v)| (k.into(), v.into())).collect() } else { BTreeMap::new() };
            s.interfaces.insert(name.into(), InterfaceRow { iface_type: t.into(), options, ofport_request: Some(req), mac: None, ingress_policing_rate: Some(0) });
        }
        br.ports.insert("veth1".into());
        s.ports.insert("veth1".into(), PortRow { external_ids: [(POD_KEY.to_string(), "{\"r\":1}".to_string())].into(), has_qos: true });
        s.interfaces.insert("veth1".into(), InterfaceRow { ingress_policing_rate: Some(2), ..Default::default() });
        s.bridges.insert("br0".into(), br);
        let pod = ("ns".to_string(), "a".to_string());
        let port = PortState { host_veth: "veth1".into(), internal: false, ofport: 3, bandwidth: (1000, 2048) };
        let want = Expected {
            bridge: "br0".into(),
            datapath_type: Some("netdev".into()),
            base: BaseSpec::default(),
            generation: Some(3),
            pods: [(pod, (port, Some("{\"r\":1}".to_string())))].into(),
        };
        (s, want)
    }

    #[test]
    fn nothing_to_repair_when_all_is_in_place() {
        let (s, want) = healthy();
        assert_eq!(inspect(&s, &want), vec![]);
    }

    #[test]
    fn each_removal_or_change_is_found() {
        let (s, want) = healthy();
        let mut t = s.clone();
        t.root = false;
        assert_eq!(inspect(&t, &want), vec![Finding::EmptyDatabase]);
        let mut t = s.clone();
        t.bridges.clear();
        assert_eq!(inspect(&t, &want), vec![Finding::BridgeMissing]);
        let mut t = s.clone();
        t.bridges.get_mut("br0").unwrap().fail_mode = Some("standalone".into());
        let f = inspect(&t, &want);
        assert!(matches!(&f[..], [Finding::BridgeSetting { column: "fail_mode", .. }]), "{f:?}");
        assert_eq!(f[0].to_string(), "bridge fail_mode is \"standalone\", not \"secure\"");
        let mut t = s.clone();
        t.bridges.get_mut("br0").unwrap().external_ids.clear();
        assert_eq!(inspect(&t, &want), vec![Finding::Generation { want: 3, have: None }]);
        let mut t = s.clone();
        t.bridges.get_mut("br0").unwrap().ports.remove("tun0");
        assert_eq!(inspect(&t, &want)[0].what(), "base_port");
        let mut t = s.clone();
        t.interfaces.get_mut("vxlan0").unwrap().options.clear();
        assert_eq!(inspect(&t, &want)[0].what(), "base_port");
        let mut t = s.clone();
        t.bridges.get_mut("br0").unwrap().ports.remove("veth1");
        let f = inspect(&t, &want);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].pod(), Some(&("ns".to_string(), "a".to_string())));
        assert_eq!(f[0].what(), "pod_port");
        let mut t = s.clone();
        t.ports.get_mut("veth1").unwrap().external_ids.clear();
        assert_eq!(inspect(&t, &want)[0].what(), "pod_record");
        let mut t = s.clone();
        t.ports.get_mut("veth1").unwrap().has_qos = false;
        t.interfaces.get_mut("veth1").unwrap().ingress_policing_rate = Some(0);
        assert_eq!(inspect(&t, &want).iter().map(Finding::what).collect::<Vec<_>>(), ["qos", "qos"]);
    }
}
