//! Correlation of replies and errors with the requests that caused them.
//!
//! Every request that expects an answer registers a [`Pending`] entry under its xid. A request
//! that covers other messages (a BARRIER after pipelined FLOW_MODs, a bundle COMMIT after its
//! ADDs) also registers the xid range of those messages: OFPT_ERRORs for xids in the range are
//! collected into the entry and handed over when the barrier/commit completes. OVS processes one
//! connection's messages in order, so every error for a covered message arrives before the
//! covering reply.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;
use std::ops::Range;

use openflow::{ErrorMsg, MultipartAssembler, MultipartReplyBody, OfMessage};
use tokio::sync::oneshot;
use tracing::warn;

use super::error::{CloseReason, Rejection, SwitchError};

/// What a single-reply request resolves to: the reply (or the error the switch sent for this
/// very xid) plus the errors collected for the covered xid range.
pub(crate) struct Completion {
    pub reply: Result<OfMessage, Rejection>,
    pub covered: Vec<Rejection>,
}

pub(crate) type ReplyTx = oneshot::Sender<Result<Completion, SwitchError>>;
pub(crate) type MultipartTx = oneshot::Sender<Result<MultipartReplyBody, SwitchError>>;

/// Parts of a streamed multipart reply, each with its "more parts follow" flag. Bounded: a
/// consumer that falls [`PART_QUEUE`] parts behind loses the dump (it sees the channel close
/// without a final part and fails), rather than the connection buffering without limit.
pub(crate) type PartTx = tokio::sync::mpsc::Sender<Result<(MultipartReplyBody, bool), SwitchError>>;

/// How many parts of a streamed dump may wait for their consumer (parts are at most 64 KiB).
pub(crate) const PART_QUEUE: usize = 1024;

pub(crate) enum Waiter {
    Reply(ReplyTx),
    Multipart(MultipartAssembler, MultipartTx),
    /// Every part handed over as it arrives (the channel closes after the last).
    Parts(PartTx),
}

struct Pending {
    waiter: Waiter,
    covered: Vec<Rejection>,
    cover: Option<Range<u32>>,
}

#[derive(Default)]
pub(crate) struct Table {
    pending: HashMap<u32, Pending>,
    /// start of a covered xid range -> (end, owner xid).
    ranges: BTreeMap<u32, (u32, u32)>,
    closed: Option<CloseReason>,
}

impl Table {
    pub fn register(&mut self, xid: u32, waiter: Waiter, cover: Option<Range<u32>>) -> Result<(), SwitchError> {
        if let Some(r) = &self.closed {
            return Err(SwitchError::Disconnected(r.clone()));
        }
        if let Some(c) = &cover {
            if !c.is_empty() {
                self.ranges.insert(c.start, (c.end, xid));
            }
        }
        self.pending.insert(xid, Pending { waiter, covered: Vec::new(), cover });
        Ok(())
    }

    /// Forgets a request (its caller gave up, e.g. on a timeout).
    pub fn forget(&mut self, xid: u32) {
        if let Some(p) = self.pending.remove(&xid) {
            self.drop_range(&p.cover);
        }
    }

    fn drop_range(&mut self, cover: &Option<Range<u32>>) {
        if let Some(c) = cover {
            self.ranges.remove(&c.start);
        }
    }

    /// Routes an OFPT_ERROR. Returns false if nobody was waiting for that xid.
    pub fn error(&mut self, xid: u32, error: ErrorMsg) -> bool {
        let rej = Rejection::new(xid, error);
        if let Some(p) = self.pending.remove(&xid) {
            self.drop_range(&p.cover);
            match p.waiter {
                Waiter::Reply(tx) => {
                    let _ = tx.send(Ok(Completion { reply: Err(rej), covered: p.covered }));
                }
                Waiter::Multipart(_, tx) => {
                    let _ = tx.send(Err(SwitchError::Rejected(Box::new(rej))));
                }
                Waiter::Parts(tx) => {
                    let _ = tx.try_send(Err(SwitchError::Rejected(Box::new(rej))));
                }
            }
            return true;
        }
        let owner = self.ranges.range(..=xid).next_back().and_then(|(_, &(end, owner))| (xid < end).then_some(owner));
        if let Some(p) = owner.and_then(|o| self.pending.get_mut(&o)) {
            p.covered.push(rej);
            return true;
        }
        warn!(xid, error = %rej, "error from the switch for a message nobody waits for");
        false
    }

    /// Routes a reply. Returns false if nobody was waiting for it.
    pub fn reply(&mut self, msg: OfMessage) -> bool {
        let xid = msg.xid;
        let Some(mut p) = self.pending.remove(&xid) else { return false };
        let cover = p.cover.take();
        match p.waiter {
            Waiter::Reply(tx) => {
                self.drop_range(&cover);
                let _ = tx.send(Ok(Completion { reply: Ok(msg), covered: p.covered }));
            }
            Waiter::Multipart(mut asm, tx) => {
                let openflow::Message::MultipartReply(part) = msg.msg else {
                    let _ = tx.send(Err(SwitchError::UnexpectedReply { request: "MULTIPART_REQUEST", got: msg.msg.name() }));
                    return true;
                };
                match asm.push(part) {
                    Ok(Some(body)) => {
                        self.drop_range(&cover);
                        let _ = tx.send(Ok(body));
                    }
                    Ok(None) => {
                        let covered = std::mem::take(&mut p.covered);
                        self.pending.insert(xid, Pending { waiter: Waiter::Multipart(asm, tx), covered, cover });
                    }
                    Err(_) => {
                        self.drop_range(&cover);
                        let _ = tx.send(Err(SwitchError::UnexpectedReply {
                            request: "MULTIPART_REQUEST",
                            got: "a part of another multipart type",
                        }));
                    }
                }
            }
            Waiter::Parts(tx) => {
                let openflow::Message::MultipartReply(part) = msg.msg else {
                    let _ = tx.try_send(Err(SwitchError::UnexpectedReply { request: "MULTIPART_REQUEST", got: msg.msg.name() }));
                    return true;
                };
                let more = part.more();
                if tx.try_send(Ok((part.body, more))).is_err() {
                    warn!(xid, "dump consumer fell behind; abandoning the dump");
                    return true;
                }
                if more {
                    self.pending.insert(xid, Pending { waiter: Waiter::Parts(tx), covered: std::mem::take(&mut p.covered), cover });
                }
            }
        }
        true
    }

    /// Routes a reply that could not be decoded to its waiter, if any.
    pub fn bad_reply(&mut self, xid: u32, error: openflow::DecodeError) -> bool {
        let Some(p) = self.pending.remove(&xid) else { return false };
        self.drop_range(&p.cover);
        let e = SwitchError::BadReply { xid, error };
        match p.waiter {
            Waiter::Reply(tx) => {
                let _ = tx.send(Err(e));
            }
            Waiter::Multipart(_, tx) => {
                let _ = tx.send(Err(e));
            }
            Waiter::Parts(tx) => {
                let _ = tx.try_send(Err(e));
            }
        }
        true
    }

    /// Fails every waiter; later registrations fail at once.
    pub fn close(&mut self, reason: CloseReason) {
        if self.closed.is_some() {
            return;
        }
        self.closed = Some(reason.clone());
        self.ranges.clear();
        for (_, p) in self.pending.drain() {
            let e = SwitchError::Disconnected(reason.clone());
            match p.waiter {
                Waiter::Reply(tx) => {
                    let _ = tx.send(Err(e));
                }
                Waiter::Multipart(_, tx) => {
                    let _ = tx.send(Err(e));
                }
                Waiter::Parts(tx) => {
                    let _ = tx.try_send(Err(e));
                }
            }
        }
    }

    pub fn closed(&self) -> Option<&CloseReason> {
        self.closed.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use openflow::{ErrorCode, Message};

    fn err() -> ErrorMsg {
        ErrorMsg { code: ErrorCode::BAD_TABLE_ID, data: Bytes::new() }
    }

    #[test]
    fn covered_errors_reach_the_barrier() {
        let mut t = Table::default();
        let (tx, mut rx) = oneshot::channel();
        t.register(110, Waiter::Reply(tx), Some(100..110)).unwrap();
        assert!(t.error(103, err()));
        assert!(t.error(107, err()));
        assert!(!t.error(110 + 5, err()), "outside the range");
        assert!(!t.error(99, err()));
        assert!(t.reply(OfMessage::new(110, Message::BarrierReply)));
        let c = rx.try_recv().unwrap().unwrap();
        assert!(c.reply.is_ok());
        assert_eq!(c.covered.iter().map(|r| r.xid).collect::<Vec<_>>(), vec![103, 107]);
        assert!(!t.error(104, err()), "range removed with its owner");
    }

    #[test]
    fn close_fails_waiters() {
        let mut t = Table::default();
        let (tx, mut rx) = oneshot::channel();
        t.register(1, Waiter::Reply(tx), None).unwrap();
        t.close(CloseReason::Eof);
        assert!(matches!(rx.try_recv().unwrap(), Err(SwitchError::Disconnected(CloseReason::Eof))));
        let (tx, _rx) = oneshot::channel();
        assert!(t.register(2, Waiter::Reply(tx), None).is_err());
    }
}
