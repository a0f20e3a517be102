//! Desired and installed flows, and the diff between them.
//!
//! Every flow belongs to one [`Owner`] (a pod, a host subnet, a service, ...). The desired state
//! is indexed by owner; the installed state mirrors what the switch holds, keyed by the flow's
//! identity in OVS (table, priority, match). A change is the difference between the two, as
//! ADD / MODIFY_STRICT / DELETE_STRICT — never a loose delete, whose cost in ovs-vswitchd grows
//! with the table.
//!
//! Cookies: `kind (8 bits) | generation (24 bits) | owner hash (32 bits)`. The kind and hash let
//! `dump-flows --owner` ask the switch for one object's flows with a cookie mask; the generation
//! lets a restarted agent recognise flows written by a previous run.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use openflow::{FlowMod, FlowModCommand, FlowStats, Instruction};

use crate::model::Vnid;
use crate::pipeline::{Flow, FlowKey};

/// Who a flow belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// SetupOVS's fixed flows.
    Base,
    /// The version note in table 253.
    Version,
    /// The policy plugin's fixed table-80 rules.
    PolicyPlugin,
    Pod { namespace: String, name: String },
    HostSubnet { host: String },
    Service { namespace: String, name: String },
    EgressPolicy { vnid: Vnid },
    Multicast { vnid: Vnid },
    MulticastVxlan,
    /// Table 80's "same VNID may talk" rule.
    VnidRule { vnid: Vnid },
}

impl Owner {
    pub fn kind(&self) -> u8 {
        match self {
            Owner::Base => 1,
            Owner::Version => 2,
            Owner::PolicyPlugin => 3,
            Owner::Pod { .. } => 4,
            Owner::HostSubnet { .. } => 5,
            Owner::Service { .. } => 6,
            Owner::EgressPolicy { .. } => 7,
            Owner::Multicast { .. } => 8,
            Owner::MulticastVxlan => 9,
            Owner::VnidRule { .. } => 10,
        }
    }

    /// FNV-1a of the owner's text form: stable across runs and versions of this program.
    fn hash32(&self) -> u32 {
        let mut h: u32 = 0x811c_9dc5;
        for b in self.to_string().bytes() {
            h ^= b as u32;
            h = h.wrapping_mul(0x0100_0193);
        }
        h
    }

    pub fn cookie(&self, generation: u32) -> u64 {
        ((self.kind() as u64) << 56) | (((generation & 0xff_ffff) as u64) << 32) | self.hash32() as u64
    }

    /// The mask that selects this owner's flows whatever their generation.
    pub const OWNER_MASK: u64 = 0xff00_0000_ffff_ffff;
    /// The mask that selects the generation.
    pub const GENERATION_MASK: u64 = 0x00ff_ffff_0000_0000;

    /// The generation stored in a cookie.
    pub fn generation_of(cookie: u64) -> u32 {
        ((cookie & Self::GENERATION_MASK) >> 32) as u32
    }

    /// Parses the text form (`pod/NS/NAME`, `hostsubnet/HOST`, `service/NS/NAME`,
    /// `egress/VNID`, `multicast/VNID`, `multicast-vxlan`, `vnid/VNID`, `base`, `version`,
    /// `policy`).
    pub fn parse(s: &str) -> Result<Owner, String> {
        let parts: Vec<&str> = s.split('/').collect();
        let vnid = |v: &str| v.parse::<u32>().map_err(|e| format!("{s:?}: {e}")).and_then(Vnid::new);
        Ok(match parts.as_slice() {
            ["base"] => Owner::Base,
            ["version"] => Owner::Version,
            ["policy"] => Owner::PolicyPlugin,
            ["multicast-vxlan"] => Owner::MulticastVxlan,
            ["pod", ns, name] => Owner::Pod { namespace: ns.to_string(), name: name.to_string() },
            ["service", ns, name] => Owner::Service { namespace: ns.to_string(), name: name.to_string() },
            ["hostsubnet", host] => Owner::HostSubnet { host: host.to_string() },
            ["egress", v] => Owner::EgressPolicy { vnid: vnid(v)? },
            ["multicast", v] => Owner::Multicast { vnid: vnid(v)? },
            ["vnid", v] => Owner::VnidRule { vnid: vnid(v)? },
            _ => return Err(format!("unknown owner {s:?}: expected pod/NS/NAME, service/NS/NAME, hostsubnet/HOST, egress/VNID, multicast/VNID, vnid/VNID, multicast-vxlan, policy, base or version")),
        })
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Base => f.write_str("base"),
            Owner::Version => f.write_str("version"),
            Owner::PolicyPlugin => f.write_str("policy"),
            Owner::Pod { namespace, name } => write!(f, "pod/{namespace}/{name}"),
            Owner::HostSubnet { host } => write!(f, "hostsubnet/{host}"),
            Owner::Service { namespace, name } => write!(f, "service/{namespace}/{name}"),
            Owner::EgressPolicy { vnid } => write!(f, "egress/{vnid}"),
            Owner::Multicast { vnid } => write!(f, "multicast/{vnid}"),
            Owner::MulticastVxlan => f.write_str("multicast-vxlan"),
            Owner::VnidRule { vnid } => write!(f, "vnid/{vnid}"),
        }
    }
}

/// Two owners want the same flow (same table, priority and match).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{owner}: flow `{flow}` is already owned by {existing}")]
pub struct Conflict {
    pub owner: Owner,
    pub existing: Owner,
    pub flow: String,
}

/// The flows the switch should hold, by owner.
#[derive(Clone, Debug, Default)]
pub struct DesiredState {
    owners: BTreeMap<Owner, Vec<Flow>>,
    keys: HashMap<FlowKey, Owner>,
}

impl DesiredState {
    /// Sets `owner`'s flows (replacing what it had). On a conflict nothing changes.
    pub fn set(&mut self, owner: Owner, flows: Vec<Flow>) -> Result<(), Box<Conflict>> {
        for f in &flows {
            if let Some(existing) = self.keys.get(&f.key()).filter(|o| **o != owner) {
                return Err(Box::new(Conflict { owner, existing: existing.clone(), flow: f.to_string() }));
            }
        }
        self.remove(&owner);
        for f in &flows {
            self.keys.insert(f.key(), owner.clone());
        }
        if !flows.is_empty() {
            self.owners.insert(owner, flows);
        }
        Ok(())
    }

    pub fn remove(&mut self, owner: &Owner) -> Option<Vec<Flow>> {
        let old = self.owners.remove(owner)?;
        for f in &old {
            self.keys.remove(&f.key());
        }
        Some(old)
    }

    pub fn flows_of(&self, owner: &Owner) -> &[Flow] {
        self.owners.get(owner).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn owners(&self) -> impl Iterator<Item = &Owner> {
        self.owners.keys()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Owner, &Flow)> {
        self.owners.iter().flat_map(|(o, fs)| fs.iter().map(move |f| (o, f)))
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn owner_of(&self, key: &FlowKey) -> Option<&Owner> {
        self.keys.get(key)
    }
}

/// A flow as the switch holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstalledFlow {
    pub table: u8,
    pub priority: u16,
    pub match_: openflow::Match,
    pub cookie: u64,
    pub instructions: Vec<Instruction>,
}

/// The mirror of the switch's flow table.
#[derive(Clone, Debug, Default)]
pub struct InstalledState {
    flows: HashMap<FlowKey, InstalledFlow>,
}

impl InstalledState {
    /// From a full flow dump.
    pub fn from_dump(stats: Vec<FlowStats>) -> InstalledState {
        let flows = stats
            .into_iter()
            .map(|s| {
                let key = FlowKey::new(s.table_id, s.priority, &s.match_);
                (
                    key,
                    InstalledFlow {
                        table: s.table_id,
                        priority: s.priority,
                        match_: s.match_,
                        cookie: s.cookie,
                        instructions: s.instructions,
                    },
                )
            })
            .collect();
        InstalledState { flows }
    }

    pub fn len(&self) -> usize {
        self.flows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    pub fn get(&self, key: &FlowKey) -> Option<&InstalledFlow> {
        self.flows.get(key)
    }

    /// Records that `plan` was committed.
    pub fn apply(&mut self, plan: &Plan) {
        for fm in &plan.flow_mods {
            let key = FlowKey::new(fm.table_id, fm.priority, &fm.match_);
            match fm.command {
                FlowModCommand::Add => {
                    self.flows.insert(
                        key,
                        InstalledFlow {
                            table: fm.table_id,
                            priority: fm.priority,
                            match_: fm.match_.clone(),
                            cookie: fm.cookie,
                            instructions: fm.instructions.clone(),
                        },
                    );
                }
                FlowModCommand::ModifyStrict => {
                    if let Some(f) = self.flows.get_mut(&key) {
                        f.instructions = fm.instructions.clone();
                    }
                }
                FlowModCommand::DeleteStrict => {
                    self.flows.remove(&key);
                }
                _ => {}
            }
        }
    }
}

/// The FLOW_MODs that turn the installed state into the desired one.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Deletes first, then modifies, then adds (one bundle makes the order invisible to
    /// packets; deleting first keeps the table small).
    pub flow_mods: Vec<FlowMod>,
    pub adds: usize,
    pub modifies: usize,
    pub deletes: usize,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.flow_mods.is_empty()
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} add, {} modify, {} delete", self.adds, self.modifies, self.deletes)
    }
}

/// Diffs the whole desired state against the whole installed state.
pub fn diff(desired: &DesiredState, installed: &InstalledState, generation: u32) -> Plan {
    let mut deletes = Vec::new();
    let mut modifies = Vec::new();
    let mut adds = Vec::new();
    for (key, inst) in &installed.flows {
        if desired.owner_of(key).is_none() {
            deletes.push(delete_strict(inst));
        }
    }
    for (owner, flow) in desired.iter() {
        let cookie = owner.cookie(generation);
        match installed.get(&flow.key()) {
            None => adds.push(flow.add(cookie)),
            // MODIFY never changes a cookie on OF1.3: re-ADD to move the flow to its new owner
            // or generation.
            Some(i) if i.cookie != cookie => adds.push(flow.add(cookie)),
            Some(i) if i.instructions != flow.instructions => modifies.push(flow.modify_strict()),
            Some(_) => {}
        }
    }
    // Deterministic order (by table, priority, match) makes plans comparable and logs readable.
    let by_key = |a: &FlowMod, b: &FlowMod| {
        (a.table_id, std::cmp::Reverse(a.priority), a.to_string()).cmp(&(b.table_id, std::cmp::Reverse(b.priority), b.to_string()))
    };
    deletes.sort_by(by_key);
    modifies.sort_by(by_key);
    adds.sort_by(by_key);
    let (nd, nm, na) = (deletes.len(), modifies.len(), adds.len());
    deletes.extend(modifies);
    deletes.extend(adds);
    Plan { flow_mods: deletes, adds: na, modifies: nm, deletes: nd }
}

/// Diffs only the flows of the owners that changed: `changed` holds each touched owner with the
/// flows it had before; its new flows are in `desired`. Cost is proportional to the owners'
/// flows, not to the table.
pub fn diff_owners(
    desired: &DesiredState,
    installed: &InstalledState,
    changed: &[(Owner, Vec<Flow>)],
    generation: u32,
) -> Plan {
    let mut plan = Plan::default();
    let mut deletes = Vec::new();
    let mut modifies = Vec::new();
    let mut adds = Vec::new();
    for (owner, old) in changed {
        let new = desired.flows_of(owner);
        let cookie = owner.cookie(generation);
        for flow in new {
            match installed.get(&flow.key()) {
                None => adds.push(flow.add(cookie)),
                Some(i) if i.cookie != cookie => adds.push(flow.add(cookie)),
                Some(i) if i.instructions != flow.instructions => modifies.push(flow.modify_strict()),
                Some(_) => {}
            }
        }
        for flow in old {
            let key = flow.key();
            if desired.owner_of(&key).is_none() {
                if let Some(i) = installed.get(&key) {
                    deletes.push(delete_strict(i));
                }
            }
        }
    }
    plan.deletes = deletes.len();
    plan.modifies = modifies.len();
    plan.adds = adds.len();
    deletes.extend(modifies);
    deletes.extend(adds);
    plan.flow_mods = deletes;
    plan
}

fn delete_strict(i: &InstalledFlow) -> FlowMod {
    // The cookie filter makes the delete a no-op if someone else replaced the flow meanwhile.
    FlowMod::delete_strict(i.table, i.priority, i.match_.clone()).with_cookie(i.cookie, u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::{Flow, Table};
    use openflow::{Action, Match};

    fn f(p: u16, port: u32) -> Flow {
        Flow::new(Table::PodIp, p, Match::any().reg(0, p as u32), vec![Action::output(port)], None)
    }

    #[test]
    fn owner_text_round_trips() {
        for s in ["base", "version", "policy", "multicast-vxlan", "pod/ns/a", "service/ns/web", "hostsubnet/node-b", "egress/11", "multicast/11", "vnid/0"] {
            assert_eq!(Owner::parse(s).unwrap().to_string(), s);
        }
        assert!(Owner::parse("pod/x").is_err());
        assert!(Owner::parse("vnid/16777216").unwrap_err().contains("24-bit"));
    }

    #[test]
    fn cookies() {
        let o = Owner::Pod { namespace: "ns".into(), name: "a".into() };
        let c = o.cookie(5);
        assert_eq!(c >> 56, 4);
        assert_eq!(Owner::generation_of(c), 5);
        assert_eq!(c & Owner::OWNER_MASK, o.cookie(9) & Owner::OWNER_MASK);
        assert_ne!(c & Owner::OWNER_MASK, Owner::Pod { namespace: "ns".into(), name: "b".into() }.cookie(5) & Owner::OWNER_MASK);
    }

    #[test]
    fn conflicts_are_rejected_without_change() {
        let mut d = DesiredState::default();
        let a = Owner::Pod { namespace: "ns".into(), name: "a".into() };
        let b = Owner::Pod { namespace: "ns".into(), name: "b".into() };
        d.set(a.clone(), vec![f(1, 1), f(2, 1)]).unwrap();
        let e = d.set(b.clone(), vec![f(3, 1), f(2, 2)]).unwrap_err();
        assert_eq!(e.existing, a);
        assert_eq!(d.len(), 2);
        assert!(d.flows_of(&b).is_empty());
        // Replacing one's own flows is fine.
        d.set(a.clone(), vec![f(2, 9)]).unwrap();
        assert_eq!(d.len(), 1);
    }

    #[test]
    fn owner_diff_touches_only_the_owner() {
        let mut d = DesiredState::default();
        let a = Owner::Pod { namespace: "ns".into(), name: "a".into() };
        let b = Owner::Pod { namespace: "ns".into(), name: "b".into() };
        d.set(a.clone(), vec![f(1, 1), f(2, 1)]).unwrap();
        d.set(b.clone(), vec![f(3, 1)]).unwrap();
        let mut inst = InstalledState::default();
        inst.apply(&diff(&d, &inst, 1));
        let old = d.flows_of(&a).to_vec();
        d.set(a.clone(), vec![f(1, 5)]).unwrap();
        let p = diff_owners(&d, &inst, &[(a.clone(), old)], 1);
        assert_eq!((p.adds, p.modifies, p.deletes), (0, 1, 1));
        inst.apply(&p);
        assert!(diff(&d, &inst, 1).is_empty());
        // A flow handed from one owner to another is re-added with the new cookie, not deleted.
        let old_b = d.flows_of(&b).to_vec();
        let old_a = d.flows_of(&a).to_vec();
        d.remove(&b);
        d.set(a.clone(), vec![f(1, 5), f(3, 1)]).unwrap();
        let p = diff_owners(&d, &inst, &[(b, old_b), (a, old_a)], 1);
        assert_eq!((p.adds, p.modifies, p.deletes), (1, 0, 0));
    }

    #[test]
    fn diff_adds_modifies_deletes_and_is_idempotent() {
        let mut d = DesiredState::default();
        let a = Owner::Pod { namespace: "ns".into(), name: "a".into() };
        d.set(a.clone(), vec![f(1, 1), f(2, 1)]).unwrap();
        let mut inst = InstalledState::default();
        let p = diff(&d, &inst, 1);
        assert_eq!((p.adds, p.modifies, p.deletes), (2, 0, 0));
        inst.apply(&p);
        assert!(diff(&d, &inst, 1).is_empty());
        d.set(a.clone(), vec![f(1, 7), f(3, 1)]).unwrap();
        let p = diff(&d, &inst, 1);
        assert_eq!((p.adds, p.modifies, p.deletes), (1, 1, 1));
        assert_eq!(p.flow_mods[0].command, FlowModCommand::DeleteStrict);
        inst.apply(&p);
        assert!(diff(&d, &inst, 1).is_empty());
        // A new generation re-adds everything (cookies change).
        assert_eq!(diff(&d, &inst, 2).adds, 2);
    }
}
