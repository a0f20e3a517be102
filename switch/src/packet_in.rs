//! Unsolicited packet-ins, and the requests that make the switch send them and meter them.
//!
//! Why a bounded channel with drops: the read loop also routes every reply and answers the
//! switch's echoes; if it waited for a slow packet-in consumer, a flood of packet-ins would stall
//! bundle commits and, after the echo timeout, get the connection closed. So a packet-in is
//! offered with `try_send`; when the channel is full it is dropped and counted.
//!
//! Why [`Switch::enable_packet_ins`]: the agent uses the bridge's management socket, a *service*
//! connection, and OVS 3.1 sends no asynchronous message on a service connection whose
//! `miss_send_len` is 0 (`ofproto/connmgr.c`, `ofconn_receives_async_msg`), which is its
//! default there. The userdata of a `controller(userdata=...)` action only reaches a controller
//! in NXT_PACKET_IN2, so the format is switched too. All three settings are per connection:
//! they must be sent again after every reconnect.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openflow::{
    AsyncConfig, MeterFeatures, MeterMod, Message, MultipartReplyBody, MultipartRequest, PacketIn, PacketIn2,
    NXPIF_NXT_PACKET_IN2,
};
use tokio::sync::mpsc;

use super::{Item, Switch, SwitchError};

/// A packet the switch sent to the controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PacketInMsg {
    /// OFPT_PACKET_IN (the standard format).
    Standard(PacketIn),
    /// NXT_PACKET_IN2 (after [`Switch::enable_packet_ins`]).
    Nx(PacketIn2),
}

/// Counts of one channel, readable at any time (for metrics).
#[derive(Debug, Default)]
pub struct PacketInCounters {
    delivered: AtomicU64,
    dropped: AtomicU64,
}

impl PacketInCounters {
    /// Packet-ins put into the channel.
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }
    /// Packet-ins dropped because the channel was full or its receiver gone.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The sending half, given to a connection with [`Switch::set_packet_in_sink`]; clones share
/// the channel and the counters, so one sink can serve every connection a supervisor makes.
#[derive(Clone, Debug)]
pub struct PacketInSink {
    tx: mpsc::Sender<PacketInMsg>,
    counters: Arc<PacketInCounters>,
}

impl PacketInSink {
    /// Never waits: a full channel drops `m` (counted).
    pub(crate) fn offer(&self, m: PacketInMsg) {
        match self.tx.try_send(m) {
            Ok(()) => self.counters.delivered.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.counters.dropped.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// The receiving half.
#[derive(Debug)]
pub struct PacketIns {
    pub rx: mpsc::Receiver<PacketInMsg>,
    pub counters: Arc<PacketInCounters>,
}

/// A channel for at most `capacity` waiting packet-ins.
pub fn packet_in_channel(capacity: usize) -> (PacketInSink, PacketIns) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let counters = Arc::new(PacketInCounters::default());
    (PacketInSink { tx, counters: counters.clone() }, PacketIns { rx, counters })
}

impl Switch {
    /// Delivers this connection's packet-ins to `sink` from now on (replacing any earlier sink).
    pub fn set_packet_in_sink(&self, sink: PacketInSink) {
        *self.inner.shared.packet_ins() = Some(sink);
    }

    /// Asks for packet-ins on this (service) connection: NXT_PACKET_IN2 format, only the
    /// packet-ins of `controller` actions and table-miss flows (SET_ASYNC: no port status; the
    /// flow-removed reasons the per-policy counters need, as [`Switch::enable_flow_removed`]
    /// asks), and a non-zero `miss_send_len` (the bridge's fragment mode is kept).
    /// Behind one barrier; a refusal is an error. Per connection: call again after a reconnect.
    pub async fn enable_packet_ins(&self, miss_send_len: u16) -> Result<(), SwitchError> {
        let _config = self.inner.config.lock().await;
        let mut cfg = self.get_config().await?;
        cfg.miss_send_len = miss_send_len.max(1);
        // OFPR_NO_MATCH too: OVS reports a controller action in a table-miss flow as an
        // explicit miss, which OF1.3 calls no_match.
        let both = (1 << openflow::controller::OFPR_NO_MATCH) | (1 << openflow::controller::OFPR_ACTION);
        let asynch = AsyncConfig { packet_in: [both, both], ..async_base() };
        self.send_covered(vec![
            Message::SetPacketInFormat(NXPIF_NXT_PACKET_IN2),
            Message::SetAsync(asynch),
            Message::SetConfig(cfg),
        ])
        .await
    }

    /// Asks for OFPT_FLOW_REMOVED on this (service) connection, for the per-policy counters:
    /// SET_ASYNC with the flow-removed reasons (and the packet-ins the audit log asks for, so
    /// neither undoes the other) and a non-zero `miss_send_len` (OVS sends a service
    /// connection no asynchronous message while it is 0), the current one kept if set. Behind
    /// one barrier. Per connection: call again after a reconnect.
    pub async fn enable_flow_removed(&self) -> Result<(), SwitchError> {
        let _config = self.inner.config.lock().await;
        let mut cfg = self.get_config().await?;
        cfg.miss_send_len = cfg.miss_send_len.max(1);
        let both = (1 << openflow::controller::OFPR_NO_MATCH) | (1 << openflow::controller::OFPR_ACTION);
        self.send_covered(vec![
            Message::SetAsync(AsyncConfig { packet_in: [both, both], ..async_base() }),
            Message::SetConfig(cfg),
        ])
        .await
    }

    /// Sends a METER_MOD and waits for a barrier behind it; a refusal (e.g. OFPMMFC_METER_EXISTS
    /// for an ADD of a meter that is there) is `Rejected`.
    pub async fn meter_mod(&self, mm: MeterMod) -> Result<(), SwitchError> {
        self.send_covered(vec![Message::MeterMod(mm)]).await
    }

    /// The datapath's meter support (OFPMP_METER_FEATURES).
    pub async fn meter_features(&self) -> Result<MeterFeatures, SwitchError> {
        match self.multipart(MultipartRequest::meter_features(), "meter features").await? {
            MultipartReplyBody::MeterFeatures(f) => Ok(f),
            _ => Err(SwitchError::UnexpectedReply { request: "OFPMP_METER_FEATURES", got: "another multipart type" }),
        }
    }

    /// A meter's counters (OFPMP_METER): for the audit meter, `packet_in_count` minus the drop
    /// band's packets is what reached the agent, the band's packets what the switch dropped.
    pub async fn meter_stats(&self, meter_id: u32) -> Result<Vec<openflow::MeterStats>, SwitchError> {
        let req = MultipartRequest { flags: 0, body: openflow::MultipartRequestBody::MeterStats(meter_id) };
        match self.multipart(req, "meter stats").await? {
            MultipartReplyBody::MeterStats(v) => Ok(v),
            _ => Err(SwitchError::UnexpectedReply { request: "OFPMP_METER", got: "another multipart type" }),
        }
    }

    /// Sends messages that have no reply, then a barrier; the first refusal is returned.
    async fn send_covered(&self, msgs: Vec<Message>) -> Result<(), SwitchError> {
        let n = msgs.len() as u32;
        let xid = self.alloc_xids(n + 1);
        let size = msgs.len() * 64;
        let items = msgs.into_iter().enumerate().map(|(i, m)| Item::Msg(xid + i as u32, Box::new(m)));
        let c = self.batch(items, size, xid..xid + n, xid + n).await?;
        c.reply.map_err(|r| SwitchError::Rejected(Box::new(r)))?;
        match c.covered.into_iter().next() {
            Some(r) => Err(SwitchError::Rejected(Box::new(r))),
            None => Ok(()),
        }
    }
}

/// What every SET_ASYNC of the agent asks for besides packet-ins: no port status; the
/// flow-removed messages of deleted and timed-out flows (only the NetworkPolicy counting flows
/// set `send_flow_rem`).
fn async_base() -> AsyncConfig {
    let removed = (1 << openflow::OFPRR_IDLE_TIMEOUT) | (1 << openflow::OFPRR_HARD_TIMEOUT) | (1 << openflow::OFPRR_DELETE);
    AsyncConfig { flow_removed: [removed, removed], ..AsyncConfig::default() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn full_channel_drops_and_counts() {
        let (sink, mut ins) = packet_in_channel(2);
        for _ in 0..5 {
            sink.offer(PacketInMsg::Nx(PacketIn2 { packet: Bytes::from_static(b"x"), ..Default::default() }));
        }
        assert_eq!((ins.counters.delivered(), ins.counters.dropped()), (2, 3));
        assert!(ins.rx.try_recv().is_ok());
        assert!(ins.rx.try_recv().is_ok());
        assert!(ins.rx.try_recv().is_err());
        drop(ins.rx);
        sink.offer(PacketInMsg::Nx(PacketIn2::default()));
        assert_eq!(ins.counters.dropped(), 4);
    }
}
