//! Desired and installed flows, and the diff between them.
//!
//! Every flow belongs to one [`Owner`] (a pod, a host subnet, a service, ...). Flows are kept
//! *compiled*: their match and instructions encoded once, as the switch stores them
//! ([`Compiled`]); comparing is comparing bytes, and a FLOW_MOD is a fixed head plus those bytes.
//! The desired state is indexed by owner; the installed state mirrors what the switch holds,
//! keyed by the flow's identity in OVS (table, priority, match). A change is the difference
//! between the two, as ADD / MODIFY_STRICT / DELETE_STRICT — never a loose delete, whose cost in
//! ovs-vswitchd grows with the table.
//!
//! Cookies: `kind (8 bits) | generation (24 bits) | owner hash (32 bits)`. The kind and hash let
//! `dump-flows --owner` ask the switch for one object's flows with a cookie mask; the generation
//! lets a restarted agent recognise flows written by a previous run.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::fmt;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use openflow::{FlowMod, FlowModCommand, FlowModFlags, FlowModHead, FlowStats, Instruction};

use crate::domain::Vnid;
use crate::pipeline::{Flow, FlowKey};

mod shared;
pub use shared::MAX_SHARED_CONJUNCTIONS;

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
    /// Table 80's NetworkPolicy flows for the local pods of one namespace (networkpolicy
    /// plugin): recomputed from the namespace's policies and what they select.
    NetworkPolicy { namespace: String },
    /// A conjunctive clause flow several owners want (see [`shared`]): its cookie while it has
    /// more than one owner.
    Shared,
}

impl Owner {
    /// The kinds' names, as [`Owner::parse`] spells them.
    pub fn kind_name(kind: u8) -> Option<&'static str> {
        Some(match kind {
            1 => "base",
            2 => "version",
            3 => "policy",
            4 => "pod",
            5 => "hostsubnet",
            6 => "service",
            7 => "egress",
            8 => "multicast",
            9 => "multicast-vxlan",
            10 => "vnid",
            11 => "netpol",
            12 => "shared",
            _ => return None,
        })
    }

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
            Owner::NetworkPolicy { .. } => 11,
            Owner::Shared => 12,
        }
    }

    /// FNV-1a of the owner's text form: stable across runs and versions of this program.
    /// Computed while formatting, without building the string.
    fn hash32(&self) -> u32 {
        struct Fnv(u32);
        impl fmt::Write for Fnv {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                for b in s.bytes() {
                    self.0 ^= b as u32;
                    self.0 = self.0.wrapping_mul(0x0100_0193);
                }
                Ok(())
            }
        }
        let mut h = Fnv(0x811c_9dc5);
        // The owners of every commit hash their parts directly (the text form through
        // `fmt::write` costs more than the rest of the diff); the others go through Display.
        let parts: [&str; 4] = match self {
            Owner::Pod { namespace, name } => ["pod/", namespace, "/", name],
            Owner::Service { namespace, name } => ["service/", namespace, "/", name],
            Owner::HostSubnet { host } => ["hostsubnet/", host, "", ""],
            Owner::NetworkPolicy { namespace } => ["netpol/", namespace, "", ""],
            _ => {
                let _ = fmt::write(&mut h, format_args!("{self}"));
                return h.0;
            }
        };
        for p in parts {
            let _ = fmt::Write::write_str(&mut h, p);
        }
        h.0
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
    /// `egress/VNID`, `multicast/VNID`, `multicast-vxlan`, `vnid/VNID`, `netpol/NS`, `shared`,
    /// `base`, `version`, `policy`).
    pub fn parse(s: &str) -> Result<Owner, String> {
        let parts: Vec<&str> = s.split('/').collect();
        let vnid = |v: &str| v.parse::<u32>().map_err(|e| format!("{s:?}: {e}")).and_then(Vnid::new);
        Ok(match parts.as_slice() {
            ["base"] => Owner::Base,
            ["version"] => Owner::Version,
            ["policy"] => Owner::PolicyPlugin,
            ["shared"] => Owner::Shared,
            ["multicast-vxlan"] => Owner::MulticastVxlan,
            ["pod", ns, name] => Owner::Pod { namespace: ns.to_string(), name: name.to_string() },
            ["service", ns, name] => Owner::Service { namespace: ns.to_string(), name: name.to_string() },
            ["hostsubnet", host] => Owner::HostSubnet { host: host.to_string() },
            ["egress", v] => Owner::EgressPolicy { vnid: vnid(v)? },
            ["multicast", v] => Owner::Multicast { vnid: vnid(v)? },
            ["vnid", v] => Owner::VnidRule { vnid: vnid(v)? },
            ["netpol", ns] => Owner::NetworkPolicy { namespace: ns.to_string() },
            _ => return Err(format!("unknown owner {s:?}: expected pod/NS/NAME, service/NS/NAME, hostsubnet/HOST, egress/VNID, multicast/VNID, vnid/VNID, netpol/NS, multicast-vxlan, shared, policy, base or version")),
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
            Owner::NetworkPolicy { namespace } => write!(f, "netpol/{namespace}"),
            Owner::Shared => f.write_str("shared"),
        }
    }
}

/// A flow with its match and instructions encoded once, exactly as OVS stores and returns
/// them (our encoding is canonical, and OVS re-encodes canonically in flow-stats replies).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Compiled {
    pub key: FlowKey,
    pub instructions: Arc<[u8]>,
}

fn encode_instructions(ins: &[Instruction]) -> Arc<[u8]> {
    // Instruction lists built by the pipeline are small; an encoding error would mean an
    // action list over 64 KiB, which no pipeline flow has. Keep what was encoded.
    crate::pipeline::encoded_arc(|b| {
        let _ = openflow::instruction::encode_instructions(ins, b);
    })
}

impl Compiled {
    pub fn compile(f: &Flow) -> Compiled {
        Compiled { key: f.key(), instructions: encode_instructions(&f.instructions) }
    }

    /// From a flow the switch reported.
    pub fn from_stats(s: &FlowStats) -> Compiled {
        Compiled { key: FlowKey::new(s.table_id, s.priority, &s.match_), instructions: encode_instructions(&s.instructions) }
    }

    /// The flow as a typed ADD (for display and tests).
    pub fn to_flow_mod(&self, cookie: u64) -> Result<FlowMod, openflow::DecodeError> {
        let mut fm = FlowMod::new(FlowModCommand::Add, self.key.table, self.key.priority, self.key.decode_match()?);
        fm.cookie = cookie;
        fm.instructions = openflow::instruction::decode_instructions(&self.instructions)?;
        Ok(fm)
    }
}

impl fmt::Display for Compiled {
    /// `dump-flows --no-stats` form, without cookie.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_flow_mod(0) {
            Ok(fm) => fm.fmt(f),
            Err(e) => write!(f, "table={}, priority={}, <undecodable: {e}>", self.key.table, self.key.priority),
        }
    }
}

/// Two owners want the same flow (same table, priority and match) and it is not a clause flow
/// both may share, or the same conjunction id in one table, or more conjunctions in one shared
/// flow than a FLOW_MOD carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{owner}: flow `{flow}` is already owned by {existing}")]
pub struct Conflict {
    pub owner: Owner,
    pub existing: Owner,
    pub flow: String,
}

/// Who holds a flow identity in the desired state.
#[derive(Clone, Debug)]
enum Slot {
    /// One owner, with the flow's instructions.
    Owned(Arc<Owner>, Arc<[u8]>),
    /// A clause flow of several owners (see [`shared`]).
    Shared(Box<shared::Shared>),
}

/// The owner shared flows are installed under.
static SHARED: Owner = Owner::Shared;

/// The flows the switch should hold, by owner.
///
/// Each owner's flows are kept as it set them; a flow identity two owners want is allowed only
/// for conjunctive clause flows, which are merged into one (see [`shared`]). [`DesiredState::iter`]
/// and the diffs see the merged flows.
#[derive(Clone, Debug, Default)]
pub struct DesiredState {
    owners: HashMap<Arc<Owner>, Vec<Compiled>>,
    keys: HashMap<FlowKey, Slot>,
    /// (table, conjunction id) to the one owner whose clause flows use it.
    conj_ids: HashMap<(u8, u32), Arc<Owner>>,
}

impl DesiredState {
    /// Sets `owner`'s flows (replacing what it had). On a conflict nothing changes.
    pub fn set(&mut self, owner: Owner, flows: Vec<Flow>) -> Result<(), Box<Conflict>> {
        self.set_compiled(owner, flows.iter().map(Compiled::compile).collect())
    }

    /// [`DesiredState::set`] for flows compiled already.
    pub fn set_compiled(&mut self, owner: Owner, flows: Vec<Compiled>) -> Result<(), Box<Conflict>> {
        let conj: Vec<Option<Vec<openflow::Conjunction>>> = flows.iter().map(|f| shared::conjunctions(&f.instructions)).collect();
        let conflict = |existing: &Owner, flow: String| Box::new(Conflict { owner: owner.clone(), existing: existing.clone(), flow });
        for (f, c) in flows.iter().zip(&conj) {
            let adding = c.as_ref().map_or(0, Vec::len);
            match (self.keys.get(&f.key), c) {
                (None, _) => {}
                (Some(Slot::Owned(o, _)), _) if **o == owner => {}
                (Some(Slot::Owned(o, ins)), Some(_)) => match shared::conjunctions(ins) {
                    Some(theirs) if theirs.len() + adding <= shared::MAX_SHARED_CONJUNCTIONS => {}
                    Some(theirs) => return Err(conflict(o, too_many(f, theirs.len() + adding))),
                    None => return Err(conflict(o, f.to_string())),
                },
                (Some(Slot::Shared(s)), Some(_)) => {
                    if s.others_count(&owner) + adding > shared::MAX_SHARED_CONJUNCTIONS {
                        return Err(conflict(&SHARED, too_many(f, s.others_count(&owner) + adding)));
                    }
                }
                (Some(Slot::Owned(o, _)), None) => return Err(conflict(o, f.to_string())),
                (Some(Slot::Shared(s)), None) => return Err(conflict(&s.parts[0].owner, f.to_string())),
            }
            for x in c.iter().flatten() {
                if let Some(o) = self.conj_ids.get(&(f.key.table, x.id())).filter(|o| ***o != owner) {
                    return Err(conflict(o, format!("conjunction id {} in table {} ({f})", x.id(), f.key.table)));
                }
            }
        }
        self.remove(&owner);
        if flows.is_empty() {
            return Ok(());
        }
        let owner = Arc::new(owner);
        for (f, c) in flows.iter().zip(conj) {
            for x in c.iter().flatten() {
                self.conj_ids.insert((f.key.table, x.id()), owner.clone());
            }
            let mine = |conjunctions| shared::Part { owner: owner.clone(), instructions: f.instructions.clone(), conjunctions };
            let next = match (self.keys.get_mut(&f.key), c) {
                (Some(Slot::Shared(s)), Some(c)) => {
                    s.parts.push(mine(c));
                    s.remerge();
                    continue;
                }
                // The checks above let another owner's flow here only when both are clause flows.
                (Some(Slot::Owned(o, ins)), Some(c)) if !Arc::ptr_eq(o, &owner) => {
                    let theirs = shared::Part { owner: o.clone(), instructions: ins.clone(), conjunctions: shared::conjunctions(ins).unwrap_or_default() };
                    Slot::Shared(Box::new(shared::Shared::new(f.key.clone(), vec![theirs, mine(c)])))
                }
                _ => Slot::Owned(owner.clone(), f.instructions.clone()),
            };
            self.keys.insert(f.key.clone(), next);
        }
        self.owners.insert(owner, flows);
        Ok(())
    }

    pub fn remove(&mut self, owner: &Owner) -> Option<Vec<Compiled>> {
        let old = self.owners.remove(owner)?;
        for f in &old {
            let Some(slot) = self.keys.get_mut(&f.key) else { continue };
            match slot {
                Slot::Owned(o, _) if **o == *owner => {
                    self.keys.remove(&f.key);
                }
                Slot::Owned(..) => {}
                Slot::Shared(s) => {
                    s.parts.retain(|p| *p.owner != *owner);
                    if let [last] = s.parts.as_slice() {
                        *slot = Slot::Owned(last.owner.clone(), last.instructions.clone());
                    } else {
                        s.remerge();
                    }
                }
            }
            for c in shared::conjunctions(&f.instructions).into_iter().flatten() {
                if self.conj_ids.get(&(f.key.table, c.id())).is_some_and(|o| **o == *owner) {
                    self.conj_ids.remove(&(f.key.table, c.id()));
                }
            }
        }
        Some(old)
    }

    /// The flows `owner` set (a shared flow as its own part).
    pub fn flows_of(&self, owner: &Owner) -> &[Compiled] {
        self.owners.get(owner).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn owners(&self) -> impl Iterator<Item = &Owner> {
        self.owners.keys().map(|o| &**o)
    }

    /// Every flow the switch should hold, once, with the owner whose cookie it carries.
    pub fn iter(&self) -> impl Iterator<Item = (&Owner, &Compiled)> {
        let own = self.owners.iter().flat_map(move |(o, fs)| {
            fs.iter().filter(move |f| matches!(self.keys.get(&f.key), Some(Slot::Owned(x, _)) if Arc::ptr_eq(x, o))).map(move |f| (&**o, f))
        });
        let shared = self.keys.values().filter_map(|s| match s {
            Slot::Shared(s) => Some((&SHARED, &s.merged)),
            Slot::Owned(..) => None,
        });
        own.chain(shared)
    }

    /// Number of flows.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The owner whose cookie the flow `key` carries ([`Owner::Shared`] for a shared flow).
    pub fn owner_of(&self, key: &FlowKey) -> Option<&Owner> {
        self.effective(key).map(|(o, _)| o)
    }

    /// The flow the switch should hold under `key`: its cookie's owner and its instructions.
    pub fn effective(&self, key: &FlowKey) -> Option<(&Owner, &Arc<[u8]>)> {
        self.keys.get(key).map(|s| match s {
            Slot::Owned(o, ins) => (&**o, ins),
            Slot::Shared(s) => (&SHARED, &s.merged.instructions),
        })
    }

    /// The owners of the flow `key`: one, or each owner of a shared flow.
    pub fn owners_of(&self, key: &FlowKey) -> Vec<&Owner> {
        match self.keys.get(key) {
            None => vec![],
            Some(Slot::Owned(o, _)) => vec![&**o],
            Some(Slot::Shared(s)) => s.parts.iter().map(|p| &*p.owner).collect(),
        }
    }
}

fn too_many(f: &Compiled, n: usize) -> String {
    format!("{f}: {n} conjunctions in one shared flow, more than the {} a FLOW_MOD carries", shared::MAX_SHARED_CONJUNCTIONS)
}

/// A flow as the switch holds it: its cookie and encoded instructions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstalledFlow {
    pub cookie: u64,
    pub instructions: Arc<[u8]>,
}

/// The mirror of the switch's flow table.
#[derive(Clone, Debug, Default)]
pub struct InstalledState {
    flows: HashMap<FlowKey, InstalledFlow>,
}

impl InstalledState {
    /// From a full flow dump.
    pub fn from_dump(stats: Vec<FlowStats>) -> InstalledState {
        let mut s = InstalledState::default();
        s.extend_from_dump(&stats);
        s
    }

    /// Adds flows from (a part of) a dump.
    pub fn extend_from_dump(&mut self, stats: &[FlowStats]) {
        self.flows.reserve(stats.len());
        for st in stats {
            let c = Compiled::from_stats(st);
            self.flows.insert(c.key, InstalledFlow { cookie: st.cookie, instructions: c.instructions });
        }
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

    pub fn iter(&self) -> impl Iterator<Item = (&FlowKey, &InstalledFlow)> {
        self.flows.iter()
    }

    /// Records that `plan` was committed.
    pub fn apply(&mut self, plan: &Plan) {
        for c in &plan.changes {
            match c {
                Change::Add { flow, cookie } => {
                    self.flows.insert(flow.key.clone(), InstalledFlow { cookie: *cookie, instructions: flow.instructions.clone() });
                }
                Change::Modify { flow, .. } => {
                    if let Some(f) = self.flows.get_mut(&flow.key) {
                        f.instructions = flow.instructions.clone();
                    }
                }
                Change::Delete { key, .. } => {
                    self.flows.remove(key);
                }
                Change::DeleteAll => self.flows.clear(),
            }
        }
    }
}

/// An empty `ofp_match` (type OXM, length 4, padded).
const EMPTY_MATCH: [u8; 8] = [0, 1, 0, 4, 0, 0, 0, 0];

/// One FLOW_MOD of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Add { flow: Compiled, cookie: u64 },
    /// MODIFY_STRICT: new instructions, counters kept. `cookie` is the flow's (unchanged: a
    /// MODIFY never changes a cookie on OF1.3); it decides the flags, as for an ADD.
    Modify { flow: Compiled, cookie: u64 },
    /// DELETE_STRICT, filtered by the installed cookie so it is a no-op if someone else replaced
    /// the flow meanwhile.
    Delete { key: FlowKey, cookie: u64 },
    /// DELETE of every flow in every table: only as the first message of a full replay bundle
    /// (the one loose delete the agent sends; it costs one pass over the table).
    DeleteAll,
}

impl Change {
    pub fn command(&self) -> FlowModCommand {
        match self {
            Change::Add { .. } => FlowModCommand::Add,
            Change::Modify { .. } => FlowModCommand::ModifyStrict,
            Change::Delete { .. } => FlowModCommand::DeleteStrict,
            Change::DeleteAll => FlowModCommand::Delete,
        }
    }

    /// The flow the change is about (`None` for DeleteAll).
    pub fn key(&self) -> Option<&FlowKey> {
        match self {
            Change::Add { flow, .. } | Change::Modify { flow, .. } => Some(&flow.key),
            Change::Delete { key, .. } => Some(key),
            Change::DeleteAll => None,
        }
    }

    /// The FLOW_MOD body (everything after the OpenFlow header).
    pub fn body(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(self.body_len());
        self.write_body(&mut b);
        b.freeze()
    }

    pub fn body_len(&self) -> usize {
        FlowMod::FIXED_LEN
            + self.key().map_or(EMPTY_MATCH.len(), |k| k.match_bytes.len())
            + match self {
                Change::Add { flow, .. } | Change::Modify { flow, .. } => flow.instructions.len(),
                Change::Delete { .. } | Change::DeleteAll => 0,
            }
    }

    /// Appends the FLOW_MOD body to `buf`.
    pub fn write_body(&self, buf: &mut BytesMut) {
        let Some(key) = self.key() else {
            let h = FlowModHead::new(FlowModCommand::Delete, openflow::OFPTT_ALL, openflow::msg::OFP_DEFAULT_PRIORITY);
            h.encode_body(buf, &EMPTY_MATCH, &[]);
            return;
        };
        let mut h = FlowModHead::new(self.command(), key.table, key.priority);
        let ins: &[u8] = match self {
            Change::Add { flow, cookie } => {
                h.cookie = *cookie;
                h.flags = flags_for(key.table, *cookie);
                &flow.instructions
            }
            Change::Modify { flow, cookie } => {
                // OVS gives the modified flow the FLOW_MOD's flags: repeat them.
                h.flags = flags_for(key.table, *cookie);
                &flow.instructions
            }
            Change::Delete { cookie, .. } => {
                h.cookie = *cookie;
                h.cookie_mask = u64::MAX;
                &[]
            }
            Change::DeleteAll => &[],
        };
        h.encode_body(buf, &key.match_bytes, ins);
    }

    /// The typed FLOW_MOD (for display and tests).
    pub fn to_flow_mod(&self) -> Result<FlowMod, openflow::DecodeError> {
        FlowMod::decode(&self.body())
    }
}

/// The tables whose NetworkPolicy flows carry the per-policy counts (ingress 80, egress 27).
pub const COUNTING_TABLES: [u8; 2] = [80, 27];

/// Whether a flow of `table` with `cookie` sends OFPT_FLOW_REMOVED when it goes: the
/// NetworkPolicy flows of the counting tables do, so the per-policy counters get what a flow
/// counted after their last read when a policy change deletes or replaces it.
pub fn sends_flow_removed(table: u8, cookie: u64) -> bool {
    COUNTING_TABLES.contains(&table) && (cookie >> 56) as u8 == Owner::NetworkPolicy { namespace: String::new() }.kind()
}

fn flags_for(table: u8, cookie: u64) -> FlowModFlags {
    if sends_flow_removed(table, cookie) {
        FlowModFlags::SEND_FLOW_REM
    } else {
        FlowModFlags::empty()
    }
}

/// The FLOW_MODs that turn the installed state into the desired one.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Deletes first, then modifies, then adds (one bundle makes the order invisible to
    /// packets; deleting first keeps the table small).
    pub changes: Vec<Change>,
    pub adds: usize,
    pub modifies: usize,
    pub deletes: usize,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Whether applying the plan to `installed` takes away a flow that carries per-policy
    /// counts ([`sends_flow_removed`]): deletes it, re-adds it under another cookie (a new
    /// flow for the switch), or clears the tables. A MODIFY keeps the flow and its counts.
    pub fn removes_counting_flows(&self, installed: &InstalledState) -> bool {
        self.changes.iter().any(|c| match c {
            Change::Delete { key, cookie } => sends_flow_removed(key.table, *cookie),
            Change::Add { flow, cookie } => installed
                .flows
                .get(&flow.key)
                .is_some_and(|i| i.cookie != *cookie && sends_flow_removed(flow.key.table, i.cookie)),
            Change::Modify { .. } => false,
            Change::DeleteAll => installed.flows.iter().any(|(k, i)| sends_flow_removed(k.table, i.cookie)),
        })
    }

    pub fn len(&self) -> usize {
        self.changes.len()
    }

    fn from_parts(deletes: Vec<Change>, modifies: Vec<Change>, adds: Vec<Change>) -> Plan {
        let (nd, nm, na) = (deletes.len(), modifies.len(), adds.len());
        let mut changes = deletes;
        changes.extend(modifies);
        changes.extend(adds);
        Plan { changes, adds: na, modifies: nm, deletes: nd }
    }

    /// The FLOW_MOD bodies, in order (sharing one allocation).
    pub fn bodies(&self) -> Vec<Bytes> {
        let mut buf = BytesMut::with_capacity(self.changes.iter().map(Change::body_len).sum());
        self.changes
            .iter()
            .map(|c| {
                c.write_body(&mut buf);
                buf.split().freeze()
            })
            .collect()
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} add, {} modify, {} delete", self.adds, self.modifies, self.deletes)
    }
}

/// A full replay: delete every flow, then add every desired flow, in one ordered atomic
/// bundle, so the switch goes from whatever it holds to exactly the desired state in one step.
pub fn replay(desired: &DesiredState, generation: u32) -> Plan {
    let mut changes = Vec::with_capacity(desired.len() + 1);
    changes.push(Change::DeleteAll);
    changes.extend(desired.iter().map(|(o, f)| Change::Add { flow: f.clone(), cookie: o.cookie(generation) }));
    let adds = changes.len() - 1;
    Plan { changes, adds, modifies: 0, deletes: 1 }
}

/// Whether the switch holds flows written by this pipeline at this generation: the desired
/// version note is installed as desired, and no flow of ours (by cookie kind) carries another
/// generation. If not, the switch is empty or stale and gets a full replay.
pub fn is_current(desired: &DesiredState, installed: &InstalledState, generation: u32) -> bool {
    let version_ok = desired
        .flows_of(&Owner::Version)
        .iter()
        .all(|f| installed.get(&f.key).is_some_and(|i| i.instructions == f.instructions));
    version_ok
        && installed.iter().all(|(_, i)| {
            let kind = (i.cookie >> 56) as u8;
            Owner::kind_name(kind).is_none() || Owner::generation_of(i.cookie) == (generation & 0xff_ffff)
        })
}

/// What a desired flow needs, given what is installed under its key.
fn change_for(flow: &Compiled, cookie: u64, installed: Option<&InstalledFlow>) -> Option<Change> {
    match installed {
        None => Some(Change::Add { flow: flow.clone(), cookie }),
        // MODIFY never changes a cookie on OF1.3: re-ADD to move the flow to its new owner or
        // generation.
        Some(i) if i.cookie != cookie => Some(Change::Add { flow: flow.clone(), cookie }),
        Some(i) if i.instructions != flow.instructions => Some(Change::Modify { flow: flow.clone(), cookie }),
        Some(_) => None,
    }
}

/// Diffs the whole desired state against the whole installed state.
pub fn diff(desired: &DesiredState, installed: &InstalledState, generation: u32) -> Plan {
    let mut deletes = Vec::new();
    let mut modifies = Vec::new();
    let mut adds = Vec::new();
    for (key, inst) in installed.iter() {
        if desired.owner_of(key).is_none() {
            deletes.push(Change::Delete { key: key.clone(), cookie: inst.cookie });
        }
    }
    for (owner, flow) in desired.iter() {
        match change_for(flow, owner.cookie(generation), installed.get(&flow.key)) {
            Some(c @ Change::Add { .. }) => adds.push(c),
            Some(c) => modifies.push(c),
            None => {}
        }
    }
    // Adds and modifies follow the desired state's owner order; deletes come in hash order
    // (within one atomic bundle the order of distinct flows is invisible).
    Plan::from_parts(deletes, modifies, adds)
}

/// Diffs only the flows of the owners that changed: `changed` holds each touched owner with the
/// flows it had before; its new flows are in `desired`. Cost is proportional to the owners'
/// flows, not to the table. A flow the owner shares with others, or had and another owner has
/// now, is compared as the switch should hold it (merged, under its cookie), once.
pub fn diff_owners<'a>(
    desired: &DesiredState,
    installed: &InstalledState,
    changed: impl IntoIterator<Item = (&'a Owner, &'a [Compiled])>,
    generation: u32,
) -> Plan {
    let mut deletes = Vec::new();
    let mut modifies = Vec::new();
    let mut adds = Vec::new();
    let mut push = |c: Option<Change>| match c {
        Some(c @ Change::Add { .. }) => adds.push(c),
        Some(c @ Change::Delete { .. }) => deletes.push(c),
        Some(c) => modifies.push(c),
        None => {}
    };
    // An owner touched twice (two updates of one group): its first previous state is what the
    // switch has. Most groups are a single owner: compare directly rather than hash owners.
    let changed: Vec<(&Owner, &[Compiled])> = changed.into_iter().collect();
    let mut seen: HashSet<&Owner> = HashSet::default();
    // Every flow is compared once, however many of the changed owners had or have it.
    let mut done: HashSet<&FlowKey> = HashSet::default();
    for (i, &(owner, old)) in changed.iter().enumerate() {
        let again = if changed.len() <= 16 { changed[..i].iter().any(|(o, _)| *o == owner) } else { !seen.insert(owner) };
        if again {
            continue;
        }
        let cookie = owner.cookie(generation);
        for flow in desired.flows_of(owner) {
            if !done.insert(&flow.key) {
                continue;
            }
            match desired.effective(&flow.key) {
                Some((o, _)) if o == owner => push(change_for(flow, cookie, installed.get(&flow.key))),
                Some((o, ins)) => push(change_for_key(&flow.key, ins, o.cookie(generation), installed.get(&flow.key))),
                None => {}
            }
        }
        for flow in old {
            if !done.insert(&flow.key) {
                continue;
            }
            match desired.effective(&flow.key) {
                None => push(installed.get(&flow.key).map(|i| Change::Delete { key: flow.key.clone(), cookie: i.cookie })),
                Some((o, ins)) => push(change_for_key(&flow.key, ins, o.cookie(generation), installed.get(&flow.key))),
            }
        }
    }
    Plan::from_parts(deletes, modifies, adds)
}

/// [`change_for`] of the flow `key` with `instructions`.
fn change_for_key(key: &FlowKey, instructions: &Arc<[u8]>, cookie: u64, installed: Option<&InstalledFlow>) -> Option<Change> {
    let flow = || Compiled { key: key.clone(), instructions: instructions.clone() };
    match installed {
        None => Some(Change::Add { flow: flow(), cookie }),
        Some(i) if i.cookie != cookie => Some(Change::Add { flow: flow(), cookie }),
        Some(i) if i.instructions != *instructions => Some(Change::Modify { flow: flow(), cookie }),
        Some(_) => None,
    }
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
    fn owner_hash_is_fnv_of_the_text_form() {
        fn fnv(s: &str) -> u32 {
            s.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ b as u32).wrapping_mul(0x0100_0193))
        }
        for s in ["base", "version", "policy", "multicast-vxlan", "pod/ns/a", "service/ns/web", "hostsubnet/node-b", "egress/11", "multicast/11", "vnid/0", "netpol/ns"] {
            assert_eq!(Owner::parse(s).unwrap().hash32(), fnv(s), "{s}");
        }
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
    fn compiled_bodies_equal_typed_flow_mods() {
        let fl = f(7, 3);
        let c = Compiled::compile(&fl);
        let add = Change::Add { flow: c.clone(), cookie: 0x42 };
        assert_eq!(add.to_flow_mod().unwrap(), fl.add(0x42));
        assert_eq!(Change::Modify { flow: c.clone(), cookie: 0 }.to_flow_mod().unwrap(), fl.modify_strict());
        let del = Change::Delete { key: c.key.clone(), cookie: 9 }.to_flow_mod().unwrap();
        assert_eq!(del, FlowMod::delete_strict(fl.table.id(), 7, fl.match_.clone()).with_cookie(9, u64::MAX));
        assert_eq!(c.to_string(), fl.to_string());
    }

    /// Only a NetworkPolicy flow of tables 80/27 that goes (deleted, re-added under another
    /// cookie, cleared) is a removal the per-policy counters wait for; a MODIFY keeps it.
    #[test]
    fn removals_of_counting_flows() {
        let np = Owner::NetworkPolicy { namespace: "ns".into() };
        let pod = Owner::Pod { namespace: "ns".into(), name: "a".into() };
        let counting = Compiled::compile(&Flow::new(Table::Policy, 150, Match::any().reg(0, 7), vec![Action::output(3)], None));
        let other = Compiled::compile(&f(7, 3));
        let mut installed = InstalledState::default();
        let plan = |changes: Vec<Change>| Plan { changes, ..Plan::default() };
        installed.apply(&plan(vec![
            Change::Add { flow: counting.clone(), cookie: np.cookie(1) },
            Change::Add { flow: other.clone(), cookie: pod.cookie(1) },
        ]));
        let removes = |c: Change| plan(vec![c]).removes_counting_flows(&installed);
        assert!(removes(Change::Delete { key: counting.key.clone(), cookie: np.cookie(1) }));
        assert!(!removes(Change::Delete { key: other.key.clone(), cookie: pod.cookie(1) }));
        assert!(removes(Change::Add { flow: counting.clone(), cookie: np.cookie(2) }), "a new generation is a new flow");
        assert!(!removes(Change::Add { flow: other.clone(), cookie: pod.cookie(2) }));
        assert!(!removes(Change::Modify { flow: counting.clone(), cookie: np.cookie(1) }));
        assert!(removes(Change::DeleteAll));
        assert!(!plan(vec![Change::DeleteAll]).removes_counting_flows(&InstalledState::default()));
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
    fn replay_and_staleness() {
        let mut d = DesiredState::default();
        d.set(Owner::Version, vec![crate::pipeline::base::version_flow(crate::domain::Plugin::Subnet)]).unwrap();
        d.set(Owner::Pod { namespace: "n".into(), name: "p".into() }, vec![f(1, 1)]).unwrap();
        let mut inst = InstalledState::default();
        assert!(!is_current(&d, &inst, 3), "empty switch");
        let p = replay(&d, 3);
        assert_eq!(p.changes[0], Change::DeleteAll);
        assert_eq!(p.changes[0].to_flow_mod().unwrap().command, FlowModCommand::Delete);
        assert_eq!(p.changes[0].to_flow_mod().unwrap().table_id, openflow::OFPTT_ALL);
        inst.apply(&diff(&d, &InstalledState::default(), 3));
        inst.apply(&p);
        assert_eq!(inst.len(), 2);
        assert!(is_current(&d, &inst, 3));
        assert!(!is_current(&d, &inst, 4), "flows of another generation are stale");
        // A foreign flow (cookie kind 0) does not make the switch stale; the diff removes it.
        let mut extra = InstalledState::default();
        extra.apply(&diff(&d, &InstalledState::default(), 3));
        assert!(is_current(&d, &extra, 3));
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
        let p = diff_owners(&d, &inst, [(&a, &old[..])], 1);
        assert_eq!((p.adds, p.modifies, p.deletes), (0, 1, 1));
        inst.apply(&p);
        assert!(diff(&d, &inst, 1).is_empty());
        // A flow handed from one owner to another is re-added with the new cookie, not deleted.
        let old_b = d.flows_of(&b).to_vec();
        let old_a = d.flows_of(&a).to_vec();
        d.remove(&b);
        d.set(a.clone(), vec![f(1, 5), f(3, 1)]).unwrap();
        let p = diff_owners(&d, &inst, [(&b, &old_b[..]), (&a, &old_a[..])], 1);
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
        assert_eq!(p.changes[0].command(), FlowModCommand::DeleteStrict);
        assert!(is_current(&d, &inst, 1) || d.flows_of(&Owner::Version).is_empty());
        inst.apply(&p);
        assert!(diff(&d, &inst, 1).is_empty());
        // A new generation re-adds everything (cookies change).
        assert_eq!(diff(&d, &inst, 2).adds, 2);
    }

    /// A clause flow: `table=80, priority=150, reg0=<src>` with `conjunction(id,1/2)` per id.
    fn clause(src: u32, ids: &[u32]) -> Flow {
        let acts = ids.iter().map(|id| Action::conjunction(*id, 1, 2).unwrap()).collect();
        Flow::new(Table::Policy, 150, Match::any().reg(0, src), acts, None)
    }

    fn ns(n: &str) -> Owner {
        Owner::NetworkPolicy { namespace: n.into() }
    }

    #[test]
    fn clause_flows_of_two_owners_are_one_merged_flow() {
        let mut d = DesiredState::default();
        d.set(ns("a"), vec![clause(7, &[0x1401]), f(1, 1)]).unwrap();
        d.set(ns("b"), vec![clause(7, &[0x1502, 0x1501]), clause(8, &[0x1501])]).unwrap();
        assert_eq!(d.len(), 3);
        let key = Compiled::compile(&clause(7, &[])).key;
        assert_eq!(d.owner_of(&key), Some(&Owner::Shared));
        assert_eq!(d.owners_of(&key), vec![&ns("a"), &ns("b")]);
        let text: Vec<String> = d.iter().map(|(o, c)| format!("{o}: {c}")).collect();
        assert!(text.contains(&"shared: table=80, priority=150,reg0=0x7 actions=conjunction(5121,1/2),conjunction(5377,1/2),conjunction(5378,1/2)".to_string()), "{text:?}");
        assert_eq!(text.len(), 3, "{text:?}");
        // Each owner keeps its own part.
        assert_eq!(d.flows_of(&ns("a")).len(), 2);
        // One owner left: its own flow again, under its cookie.
        d.remove(&ns("b"));
        assert_eq!(d.owner_of(&key), Some(&ns("a")));
        assert_eq!(d.effective(&key).unwrap().1, &Compiled::compile(&clause(7, &[0x1401])).instructions);
        assert_eq!(d.len(), 2);
    }

    #[test]
    fn what_may_not_be_shared_is_refused_without_change() {
        let mut d = DesiredState::default();
        d.set(ns("a"), vec![clause(7, &[0x1401]), f(1, 1)]).unwrap();
        // The same match with another action than `conjunction`.
        let plain = Flow::new(Table::Policy, 150, Match::any().reg(0, 7), vec![Action::output(3)], None);
        let e = d.set(ns("b"), vec![plain]).unwrap_err();
        assert_eq!(e.existing, ns("a"));
        // A conjunction id another owner uses in the table (on another match).
        let e = d.set(ns("b"), vec![clause(9, &[0x1401])]).unwrap_err();
        assert!(e.flow.contains("conjunction id 5121 in table 80"), "{e}");
        // A non-clause flow of another owner.
        assert!(d.set(ns("b"), vec![f(1, 2)]).is_err());
        assert!(d.flows_of(&ns("b")).is_empty());
        // More conjunctions in one merged flow than a FLOW_MOD carries.
        let many: Vec<u32> = (0..MAX_SHARED_CONJUNCTIONS as u32).map(|i| 0x10_0000 + i).collect();
        let e = d.set(ns("c"), vec![clause(7, &many)]).unwrap_err();
        assert!(e.flow.contains("more than the 4000"), "{e}");
        assert_eq!(d.len(), 2);
        // The same id in another table is another conjunction.
        let other_table = Flow::new(Table::PolicyEgress, 150, Match::any().reg(0, 7), vec![Action::conjunction(0x1401, 1, 2).unwrap()], None);
        d.set(ns("b"), vec![other_table]).unwrap();
    }

    proptest::proptest! {
        /// Random owners setting random flows from a small pool (clause flows over a few matches,
        /// each owner its own conjunction ids; plain flows refused when another owner has the
        /// match): applying every incremental diff keeps the mirror equal to the desired state,
        /// and the full diff finds nothing left.
        #[test]
        fn incremental_diffs_with_shared_flows_match_the_full_diff(steps in proptest::collection::vec((0u8..4, proptest::collection::vec((0u32..5, proptest::bool::ANY, 0u32..3), 0..6)), 1..40)) {
            let mut d = DesiredState::default();
            let mut installed = InstalledState::default();
            for (o, picks) in steps {
                let owner = ns(&format!("n{o}"));
                // One flow per match in an owner's list (as every owner's flows are).
                let mut seen_match = HashSet::default();
                let flows: Vec<Flow> = picks.iter().filter(|&&(src, plain, _)| seen_match.insert((src, plain))).map(|&(src, plain, k)| {
                    if plain { f(src as u16 + 1, k) } else { clause(src, &[((o as u32 + 1) << 8) | (k + 1)]) }
                }).collect();
                let old = d.flows_of(&owner).to_vec();
                if d.set(owner.clone(), flows).is_err() {
                    continue;
                }
                let plan = diff_owners(&d, &installed, [(&owner, &old[..])], 1);
                let keys: Vec<&FlowKey> = plan.changes.iter().filter_map(Change::key).collect();
                let distinct: HashSet<&FlowKey> = keys.iter().copied().collect();
                proptest::prop_assert_eq!(keys.len(), distinct.len(), "one change per flow");
                installed.apply(&plan);
                let full = diff(&d, &installed, 1);
                proptest::prop_assert!(full.is_empty(), "left after the owner diff: {}", full);
                proptest::prop_assert_eq!(installed.len(), d.len());
                for (o, c) in d.iter() {
                    let i = installed.get(&c.key).unwrap();
                    proptest::prop_assert_eq!(i.cookie, o.cookie(1));
                    proptest::prop_assert_eq!(&i.instructions, &c.instructions);
                }
            }
        }
    }
}
