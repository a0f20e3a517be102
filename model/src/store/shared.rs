//! Flows several owners share: conjunctive clause flows.
//!
//! A flow whose only instruction is `apply_actions` of `conjunction(...)` actions says "this
//! packet meets clause k of conjunction id". Two owners may want such a flow with the same
//! identity (table, priority, match) — the same source pod named by the NetworkPolicies of two
//! namespaces — and OVS holds one flow per identity, so the desired state merges them: one
//! flow carrying every owner's `conjunction` actions, sorted by (id, clause), under the
//! cookie of [`Owner::Shared`](super::Owner::Shared). With one owner left it is that owner's
//! flow again, with its own bytes and cookie.
//!
//! Merging is sound only if no conjunction id is used by two owners in one table: a clause
//! flow of one owner would otherwise complete another owner's conjunction. The desired state
//! keeps every (table, id) with its one owner and refuses a second
//! ([`super::Conflict`]); NetworkPolicy ids are unique per node by construction (the
//! namespace's VNID in the high 24 bits, see `pipeline::netpol::conj_id_on`).

use std::sync::Arc;

use openflow::{Action, Conjunction, Instruction};

use super::{Compiled, Owner};

/// The most `conjunction` actions one merged flow may carry: 16 bytes each, and a FLOW_MOD
/// (header, match and instruction header included) is at most 64 KiB.
pub const MAX_SHARED_CONJUNCTIONS: usize = 4000;

/// The `conjunction` actions of a flow whose instructions are nothing else (`None`: any other
/// flow, which no other owner may share). A cheap look at the first action's header first:
/// most flows are not clause flows and are not decoded.
pub(super) fn conjunctions(instructions: &[u8]) -> Option<Vec<Conjunction>> {
    // OFPIT_APPLY_ACTIONS (4), then an NX experimenter action (0xffff, vendor 0x00002320)
    // of subtype NXAST_CONJUNCTION (34).
    let head = instructions.get(..18)?;
    if head[0..2] != [0, 4] || head[8..10] != [0xff, 0xff] || head[12..16] != [0, 0, 0x23, 0x20] || head[16..18] != [0, 34] {
        return None;
    }
    let ins = openflow::instruction::decode_instructions(instructions).ok()?;
    let [Instruction::ApplyActions(actions)] = ins.as_slice() else { return None };
    actions
        .iter()
        .map(|a| match a {
            Action::Conjunction(c) => Some(*c),
            _ => None,
        })
        .collect()
}

/// One owner's part of a shared flow: its own instructions (what the flow is again when it is
/// the last owner left) and their conjunctions.
#[derive(Clone, Debug)]
pub(super) struct Part {
    pub(super) owner: Arc<Owner>,
    pub(super) instructions: Arc<[u8]>,
    pub(super) conjunctions: Vec<Conjunction>,
}

/// A flow two or more owners want: their parts and the flow the switch gets.
#[derive(Clone, Debug)]
pub(super) struct Shared {
    pub(super) parts: Vec<Part>,
    pub(super) merged: Compiled,
}

impl Shared {
    pub(super) fn new(key: crate::pipeline::FlowKey, parts: Vec<Part>) -> Shared {
        let merged = Compiled { key, instructions: merge(&parts) };
        Shared { parts, merged }
    }

    /// Recomputes the merged instructions after the parts changed.
    pub(super) fn remerge(&mut self) {
        self.merged.instructions = merge(&self.parts);
    }

    /// The conjunctions the flow would carry without `owner`'s part.
    pub(super) fn others_count(&self, owner: &Owner) -> usize {
        self.parts.iter().filter(|p| *p.owner != *owner).map(|p| p.conjunctions.len()).sum()
    }
}

/// Every part's conjunctions in one `apply_actions`, sorted by (id, clause).
fn merge(parts: &[Part]) -> Arc<[u8]> {
    let mut all: Vec<Conjunction> = parts.iter().flat_map(|p| p.conjunctions.iter().copied()).collect();
    all.sort_unstable_by_key(|c| (c.id(), c.clause()));
    let ins = [Instruction::ApplyActions(all.into_iter().map(Action::Conjunction).collect())];
    crate::pipeline::encoded_arc(|b| {
        // At most MAX_SHARED_CONJUNCTIONS actions (checked before merging): this fits.
        let _ = openflow::instruction::encode_instructions(&ins, b);
    })
}
