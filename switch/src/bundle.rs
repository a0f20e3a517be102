//! Atomic bundles (ONF EXT-230 on OpenFlow 1.3).
//!
//! `commit` follows the only safe sequence with OVS 3.1 (wire reference §9.6): OPEN, all ADDs and
//! a BARRIER pipelined together; after the barrier, any error for an ADD means OVS silently left
//! that message out of the still-open bundle, so we DISCARD and report; otherwise COMMIT, which
//! either applies everything or (on a commit-time failure: the failing ADD's error, then
//! OFPBFC_MSG_FAILED) nothing. The bundle is discarded if the commit future is dropped midway.
//!
//! `commit_one_trip` skips the barrier for FLOW_MODs that cannot be refused when added (the
//! caller vouches for them, see [`openflow::accept`]): ADDs and COMMIT in one write, one round
//! trip instead of two, and no OPEN (the first ADD opens the bundle).

use bytes::Bytes;
use openflow::{BundleControl, BundleCtrlType, BundleFlags, FlowMod, Message, OfMessage};

use super::conn::Outgoing;
use super::{flow_mod_body, Item, Rejection, Switch, SwitchError};

/// A set of FLOW_MODs applied all-or-nothing.
pub struct Bundle {
    switch: Switch,
    flags: BundleFlags,
    /// FLOW_MOD bodies, encoded when added.
    bodies: Vec<Bytes>,
    /// The first FLOW_MOD that could not be encoded (reported by `commit`).
    error: Option<SwitchError>,
}

/// Sends DISCARD if dropped while armed (the caller gave up between OPEN and the outcome).
struct DiscardGuard<'a> {
    switch: &'a Switch,
    bundle_id: u32,
    flags: BundleFlags,
    armed: bool,
}

impl Drop for DiscardGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let xid = self.switch.alloc_xids(1);
            let m = ctrl(xid, self.bundle_id, BundleCtrlType::DiscardRequest, self.flags);
            // Best effort: if the queue is full or closed, OVS discards the bundle itself when
            // it times out (10 s idle) or when the connection closes.
            let _ = self.switch.inner.tx.try_send(Outgoing::Msg(Box::new(m)));
        }
    }
}

fn ctrl(xid: u32, bundle_id: u32, t: BundleCtrlType, flags: BundleFlags) -> OfMessage {
    OfMessage::new(xid, Message::BundleControl(BundleControl::new(bundle_id, t, flags)))
}

impl Bundle {
    pub(super) fn new(switch: Switch) -> Bundle {
        Bundle { switch, flags: BundleFlags::ATOMIC | BundleFlags::ORDERED, bodies: Vec::new(), error: None }
    }

    /// Bundle flags (default ATOMIC | ORDERED). OVS applies FLOW_MOD bundles atomically and in
    /// order either way; the flags are sent for switches that honour them.
    pub fn with_flags(mut self, flags: BundleFlags) -> Bundle {
        self.flags = flags;
        self
    }

    pub fn add(&mut self, fm: FlowMod) -> &mut Bundle {
        match flow_mod_body(&fm) {
            Ok(b) => self.bodies.push(b),
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
        self
    }

    pub fn extend(&mut self, fms: impl IntoIterator<Item = FlowMod>) -> &mut Bundle {
        for fm in fms {
            self.add(fm);
        }
        self
    }

    /// Adds a FLOW_MOD body that is already encoded (see [`openflow::FlowModHead::encode_body`]).
    pub fn add_body(&mut self, body: Bytes) -> &mut Bundle {
        self.bodies.push(body);
        self
    }

    pub fn len(&self) -> usize {
        self.bodies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bodies.is_empty()
    }

    /// Applies every FLOW_MOD or none. Returns after the switch confirmed the commit. On
    /// `BundleRejected` the switch is unchanged and each failure names the index of the
    /// FLOW_MOD in this bundle.
    pub async fn commit(self) -> Result<(), SwitchError> {
        let Bundle { switch, flags, bodies, error } = self;
        if let Some(e) = error {
            return Err(e);
        }
        if bodies.is_empty() {
            return Ok(());
        }
        commit_one(&switch, flags, &bodies).await
    }

    /// [`Bundle::commit`] in one round trip instead of two: the ADDs (the first opens the
    /// bundle) and COMMIT are written together and the COMMIT's reply is awaited. Only for FLOW_MODs the switch cannot
    /// refuse when they are added (see [`openflow::accept`]): OVS leaves a refused ADD out of the
    /// bundle and commits the rest. If that happens anyway, the result is
    /// [`SwitchError::BundlePartial`] — the others *were* applied — and the caller must repair.
    /// A failure at commit time still rolls everything back (`BundleRejected`).
    pub async fn commit_one_trip(self) -> Result<(), SwitchError> {
        let Bundle { switch, flags, bodies, error } = self;
        if let Some(e) = error {
            return Err(e);
        }
        if bodies.is_empty() {
            return Ok(());
        }
        commit_one_trip(&switch, flags, &bodies).await
    }

    /// Applies the FLOW_MODs as consecutive bundles of at most `max` messages: each chunk is
    /// atomic, the whole is not (use only where a partial application is acceptable, e.g. a
    /// replay that is retried until it converges). Stops at the first failing chunk.
    pub async fn commit_chunked(self, max: usize) -> Result<(), SwitchError> {
        let Bundle { switch, flags, bodies, error } = self;
        if let Some(e) = error {
            return Err(e);
        }
        for chunk in bodies.chunks(max.max(1)) {
            commit_one(&switch, flags, chunk).await?;
        }
        Ok(())
    }
}

async fn commit_one(switch: &Switch, flags: BundleFlags, bodies: &[Bytes]) -> Result<(), SwitchError> {
    let n = u32::try_from(bodies.len())
        .map_err(|_| openflow::EncodeError::TooLong { what: "bundle", len: bodies.len(), max: u32::MAX as usize })?;
    let bundle_id = switch.alloc_bundle_id();
    // xids: OPEN, n ADDs, BARRIER.
    let open = switch.alloc_xids(n + 2);
    let adds = open + 1..open + 1 + n;
    let barrier = adds.end;
    let open_msg = std::iter::once(Item::Msg(
        open,
        Box::new(Message::BundleControl(BundleControl::new(bundle_id, BundleCtrlType::OpenRequest, flags))),
    ));
    let add_msgs = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| Item::Bundled { xid: open + 1 + i as u32, bundle_id, flags, body });

    // OPEN's own outcome is covered too: an error for it lands in the barrier's list.
    let mut guard = DiscardGuard { switch, bundle_id, flags, armed: true };
    let size = 32 + bodies.iter().map(|b| 32 + b.len()).sum::<usize>();
    let c = switch.batch(open_msg.chain(add_msgs), size, open..barrier, barrier).await?;
    c.reply.map_err(|r| SwitchError::Rejected(Box::new(r)))?;
    if !c.covered.is_empty() {
        let failures = index_failures(c.covered, open);
        discard(switch, bundle_id, flags).await;
        guard.armed = false;
        return Err(SwitchError::BundleRejected { failures });
    }
    let commit = switch.alloc_xids(1);
    let res = switch
        .round_trip(Outgoing::Msg(Box::new(ctrl(commit, bundle_id, BundleCtrlType::CommitRequest, flags))), commit, Some(adds), "a bundle commit")
        .await;
    // After a COMMIT attempt OVS has discarded the bundle whatever the outcome.
    guard.armed = !matches!(res, Ok(_) | Err(SwitchError::Disconnected(_)));
    let c = res?;
    guard.armed = false;
    match c.reply {
        Ok(OfMessage { msg: Message::BundleControl(b), .. }) if b.ctrl_type == BundleCtrlType::CommitReply => Ok(()),
        Ok(other) => Err(SwitchError::UnexpectedReply { request: "BUNDLE COMMIT", got: other.msg.name() }),
        Err(commit_err) => {
            let mut failures = index_failures(c.covered, open);
            if failures.is_empty() {
                failures.push((usize::MAX, commit_err));
            }
            Err(SwitchError::BundleRejected { failures })
        }
    }
}

async fn commit_one_trip(switch: &Switch, flags: BundleFlags, bodies: &[Bytes]) -> Result<(), SwitchError> {
    let n = u32::try_from(bodies.len())
        .map_err(|_| openflow::EncodeError::TooLong { what: "bundle", len: bodies.len(), max: u32::MAX as usize })?;
    let bundle_id = switch.alloc_bundle_id();
    // No OPEN: the first ADD opens the bundle with its flags (OVS's ofp_bundle_add_message,
    // wire reference §9.4 D), which spares the switch a message and a reply, and us a read.
    // xids: n ADDs, COMMIT.
    let first = switch.alloc_xids(n + 1);
    let commit = first + n;
    let add_msgs = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| Item::Bundled { xid: first + i as u32, bundle_id, flags, body });
    let commit_msg = Message::BundleControl(BundleControl::new(bundle_id, BundleCtrlType::CommitRequest, flags));
    // Dropped before the COMMIT went out, the bundle would stay open: discard it then.
    let mut guard = DiscardGuard { switch, bundle_id, flags, armed: true };
    // A COMMIT is 24 bytes, an ADD 24 + the FLOW_MOD's header and body.
    let size = 24 + bodies.iter().map(|b| 32 + b.len()).sum::<usize>();
    let res = switch.pipeline(add_msgs, size, first..commit, commit, commit_msg, "a bundle commit").await;
    // After a COMMIT attempt OVS has discarded the bundle whatever the outcome; a timeout may
    // mean the COMMIT never ran.
    guard.armed = !matches!(res, Ok(_) | Err(SwitchError::Disconnected(_)));
    let c = res?;
    guard.armed = false;
    match c.reply {
        Ok(OfMessage { msg: Message::BundleControl(b), .. }) if b.ctrl_type == BundleCtrlType::CommitReply => {
            if c.covered.is_empty() {
                Ok(())
            } else {
                Err(SwitchError::BundlePartial { failures: index_failures(c.covered, first - 1) })
            }
        }
        Ok(other) => Err(SwitchError::UnexpectedReply { request: "BUNDLE COMMIT", got: other.msg.name() }),
        Err(commit_err) => {
            let mut failures = index_failures(c.covered, first - 1);
            if failures.is_empty() {
                failures.push((usize::MAX, commit_err));
            }
            Err(SwitchError::BundleRejected { failures })
        }
    }
}

/// Maps ADD xids to indexes in the caller's list (the OPEN, xid `open`, maps to `usize::MAX`).
fn index_failures(rs: Vec<Rejection>, open: u32) -> Vec<(usize, Rejection)> {
    rs.into_iter()
        .map(|r| {
            let i = if r.xid > open { (r.xid - open - 1) as usize } else { usize::MAX };
            (i, r)
        })
        .collect()
}

async fn discard(switch: &Switch, bundle_id: u32, flags: BundleFlags) {
    let xid = switch.alloc_xids(1);
    let m = ctrl(xid, bundle_id, BundleCtrlType::DiscardRequest, flags);
    if let Err(e) = switch.round_trip(Outgoing::Msg(Box::new(m)), xid, None, "a bundle discard").await {
        tracing::debug!(error = %e, bundle_id, "bundle discard failed (the switch drops it on its own)");
    }
}
