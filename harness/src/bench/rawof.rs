//! A bare OpenFlow 1.3 connection for the benchmarks' "switch limit" baselines: pre-encoded
//! bytes are written as they are, and the reader only looks at headers — it answers echoes,
//! counts every OFPT_ERROR (with its xid) and completes when the awaited BARRIER_REPLY
//! arrives. No encoding, no bookkeeping beyond that: what the switch itself can take.

use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use openflow::msg::{Header, HEADER_LEN, OFPT_BARRIER_REPLY, OFPT_BARRIER_REQUEST, OFPT_ECHO_REPLY, OFPT_ECHO_REQUEST, OFPT_ERROR};
use openflow::{BundleAdd, BundleControl, BundleCtrlType, BundleFlags, Message, OfMessage};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::BenchError;

/// Bound of one wait for the switch.
const WAIT: Duration = Duration::from_secs(60);

fn err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Baseline(format!("raw OpenFlow: {e}"))
}

/// One raw connection (a service connection on the bridge's `.mgmt` socket).
pub struct RawConn {
    stream: UnixStream,
    rbuf: BytesMut,
    /// Every OFPT_ERROR received so far: its xid.
    pub rejected: Vec<u32>,
}

impl RawConn {
    /// Connects and exchanges HELLOs (OpenFlow 1.3).
    pub async fn connect(mgmt: &std::path::Path) -> Result<RawConn, BenchError> {
        let stream = UnixStream::connect(mgmt).await.map_err(|e| err(format!("{}: {e}", mgmt.display())))?;
        let mut c = RawConn { stream, rbuf: BytesMut::with_capacity(64 * 1024), rejected: Vec::new() };
        c.stream.write_all(&[openflow::OFP_VERSION, 0, 0, 8, 0, 0, 0, 0]).await.map_err(err)?;
        // The peer's HELLO.
        let (h, _) = c.read_msg().await?;
        if h.msg_type != 0 {
            return Err(err(format!("expected HELLO, got type {}", h.msg_type)));
        }
        Ok(c)
    }

    async fn read_msg(&mut self) -> Result<(Header, Bytes), BenchError> {
        read_from(&mut self.stream, &mut self.rbuf).await
    }

    /// Writes `chunks` back to back, then waits for the barrier reply with `barrier_xid`
    /// (which the chunks must end with). Errors on the way are counted in `rejected`. The
    /// replies are read while writing: ovs-vswitchd stops reading a connection whose replies
    /// pile up unread, and then drops it when its echo requests go unanswered.
    pub async fn send_and_wait(&mut self, chunks: &[Bytes], barrier_xid: u32) -> Result<Duration, BenchError> {
        let t = Instant::now();
        let (mut rd, mut wr) = self.stream.split();
        let (rbuf, rejected) = (&mut self.rbuf, &mut self.rejected);
        let (echo_tx, mut echo_rx) = tokio::sync::mpsc::unbounded_channel::<BytesMut>();
        let writer = async {
            for c in chunks {
                wr.write_all(c).await.map_err(err)?;
            }
            // Echo replies until the reader has its barrier (it then drops the sender).
            while let Some(r) = echo_rx.recv().await {
                wr.write_all(&r).await.map_err(err)?;
            }
            Ok::<(), BenchError>(())
        };
        let reader = async move {
            loop {
                let (h, m) = read_from(&mut rd, rbuf).await?;
                match h.msg_type {
                    OFPT_BARRIER_REPLY if h.xid == barrier_xid => return Ok::<(), BenchError>(()),
                    OFPT_ERROR => rejected.push(h.xid),
                    OFPT_ECHO_REQUEST => {
                        let mut r = BytesMut::from(&m[..]);
                        r[1] = OFPT_ECHO_REPLY;
                        let _ = echo_tx.send(r);
                    }
                    _ => {}
                }
            }
        };
        tokio::try_join!(writer, reader)?;
        Ok(t.elapsed())
    }

    /// Reads until the BARRIER_REPLY with `xid`.
    pub async fn wait_barrier(&mut self, xid: u32) -> Result<(), BenchError> {
        loop {
            let (h, m) = self.read_msg().await?;
            match h.msg_type {
                OFPT_BARRIER_REPLY if h.xid == xid => return Ok(()),
                OFPT_ERROR => self.rejected.push(h.xid),
                OFPT_ECHO_REQUEST => {
                    let mut r = BytesMut::from(&m[..]);
                    r[1] = OFPT_ECHO_REPLY;
                    self.stream.write_all(&r).await.map_err(err)?;
                }
                _ => {}
            }
        }
    }
}

/// Reads one message from `rd`, buffering in `rbuf`.
async fn read_from(rd: &mut (impl tokio::io::AsyncRead + Unpin), rbuf: &mut BytesMut) -> Result<(Header, Bytes), BenchError> {
    loop {
        if rbuf.len() >= HEADER_LEN {
            let h = Header::decode(&rbuf[..HEADER_LEN]).map_err(err)?;
            let len = usize::from(h.length).max(HEADER_LEN);
            if rbuf.len() >= len {
                let m = rbuf.split_to(len).freeze();
                return Ok((h, m));
            }
        }
        let n = tokio::time::timeout(WAIT, rd.read_buf(rbuf))
            .await
            .map_err(|_| err("timed out waiting for the switch"))?
            .map_err(err)?;
        if n == 0 {
            return Err(err("the switch closed the connection"));
        }
    }
}

/// Pre-encodes messages with consecutive xids from `first_xid`, in chunks of about 256 KiB.
#[derive(Default)]
pub struct Encoder {
    pub chunks: Vec<Bytes>,
    buf: BytesMut,
    pub next_xid: u32,
    next_bundle: u32,
}

impl Encoder {
    pub fn new(first_xid: u32) -> Encoder {
        Encoder { chunks: Vec::new(), buf: BytesMut::with_capacity(256 * 1024), next_xid: first_xid.max(1), next_bundle: 1 }
    }

    fn xid(&mut self) -> u32 {
        let x = self.next_xid;
        self.next_xid = self.next_xid.wrapping_add(1).max(1);
        x
    }

    fn flush_if_big(&mut self) {
        if self.buf.len() >= 256 * 1024 {
            self.chunks.push(self.buf.split().freeze());
        }
    }

    /// The id of the next bundle (ids must be unique on a connection).
    pub fn set_bundle_id(&mut self, id: u32) {
        self.next_bundle = id;
    }

    /// One unbundled FLOW_MOD (body already encoded).
    pub fn flow_mod(&mut self, body: &[u8]) -> Result<u32, BenchError> {
        let x = self.xid();
        openflow::msg::encode_raw(&mut self.buf, openflow::msg::OFPT_FLOW_MOD, x, body).map_err(err)?;
        self.flush_if_big();
        Ok(x)
    }

    /// One atomic bundle: OPEN, an ADD per FLOW_MOD body, COMMIT (all pipelined; OVS answers
    /// the COMMIT after applying everything or nothing).
    pub fn bundle<'a>(&mut self, bodies: impl IntoIterator<Item = &'a Bytes>) -> Result<(), BenchError> {
        let id = self.bundle_adds(bodies)?;
        self.bundle_commit(id)
    }

    /// The first half of a bundle: OPEN and an ADD per FLOW_MOD body; returns the bundle id
    /// for [`Encoder::bundle_commit`].
    pub fn bundle_adds<'a>(&mut self, bodies: impl IntoIterator<Item = &'a Bytes>) -> Result<u32, BenchError> {
        let id = self.next_bundle;
        self.next_bundle += 1;
        let x = self.xid();
        OfMessage::new(x, Message::BundleControl(BundleControl::new(id, BundleCtrlType::OpenRequest, Self::FLAGS)))
            .encode(&mut self.buf)
            .map_err(err)?;
        for b in bodies {
            let x = self.xid();
            BundleAdd::encode_flow_mod_body(&mut self.buf, x, id, Self::FLAGS, b).map_err(err)?;
            self.flush_if_big();
        }
        Ok(id)
    }

    /// The COMMIT of bundle `id`.
    pub fn bundle_commit(&mut self, id: u32) -> Result<(), BenchError> {
        let x = self.xid();
        OfMessage::new(x, Message::BundleControl(BundleControl::new(id, BundleCtrlType::CommitRequest, Self::FLAGS)))
            .encode(&mut self.buf)
            .map_err(err)?;
        self.flush_if_big();
        Ok(())
    }

    const FLAGS: BundleFlags = BundleFlags::ATOMIC.union(BundleFlags::ORDERED);

    /// A BARRIER_REQUEST; returns its xid.
    pub fn barrier(&mut self) -> u32 {
        let x = self.xid();
        self.buf.put_u8(openflow::OFP_VERSION);
        self.buf.put_u8(OFPT_BARRIER_REQUEST);
        self.buf.put_u16(HEADER_LEN as u16);
        self.buf.put_u32(x);
        x
    }

    /// Takes what was encoded so far (e.g. one transaction and its barrier).
    pub fn take(&mut self) -> Vec<Bytes> {
        let mut out = std::mem::take(&mut self.chunks);
        if !self.buf.is_empty() {
            out.push(self.buf.split().freeze());
        }
        out
    }

    /// Everything encoded, as chunks.
    pub fn finish(mut self) -> Vec<Bytes> {
        if !self.buf.is_empty() {
            self.chunks.push(self.buf.split().freeze());
        }
        self.chunks
    }
}
