//! The switch's limit for a pod setup, for `sdn-bench pods`: after the same
//! netns/veth/address work as the agent, exactly one raw OVSDB transaction (insert Interface
//! and Port, mutate Bridge.ports), a wait for the ofport on a monitor that is already open, and
//! one pre-encoded atomic OpenFlow bundle of the pod's flows (encoded before the clock starts:
//! the port is inserted with `ofport_request`, so its number is known in advance). Nothing
//! else: no validation, no bookkeeping, no records.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use openflow::msg::{Header, HEADER_LEN, OFPT_BARRIER_REPLY, OFPT_ECHO_REPLY, OFPT_ECHO_REQUEST, OFPT_ERROR};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::oneshot;

use super::rawof::Encoder;
use super::BenchError;
use sdn_node::ovsdb::{
    Bridge, Condition, Interface, MonitorRequest, Mutation, NamedUuid, Operation, OvsdbClient, Port, Ref, Set, Table, Uuid,
};

const WAIT: Duration = Duration::from_secs(60);

fn err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Baseline(format!("limit: {e}"))
}

type Waiters = Arc<Mutex<HashMap<u32, oneshot::Sender<()>>>>;

/// A raw OpenFlow connection shared by concurrent pods: writes are pre-encoded bytes, a reader
/// task completes barrier waiters by xid and counts OFPT_ERRORs.
pub struct RawMux {
    write: tokio::sync::Mutex<OwnedWriteHalf>,
    waiters: Waiters,
    pub rejected: Arc<AtomicUsize>,
    next_xid: std::sync::atomic::AtomicU32,
}

impl RawMux {
    pub async fn connect(mgmt: &Path) -> Result<Arc<RawMux>, BenchError> {
        let mut s = UnixStream::connect(mgmt).await.map_err(|e| err(format!("{}: {e}", mgmt.display())))?;
        s.write_all(&[openflow::OFP_VERSION, 0, 0, 8, 0, 0, 0, 0]).await.map_err(err)?;
        let (mut r, w) = s.into_split();
        let waiters: Waiters = Arc::default();
        let rejected = Arc::new(AtomicUsize::new(0));
        let mux = Arc::new(RawMux { write: tokio::sync::Mutex::new(w), waiters: waiters.clone(), rejected: rejected.clone(), next_xid: 1.into() });
        let weak = Arc::downgrade(&mux);
        tokio::spawn(async move {
            let mut buf = BytesMut::with_capacity(64 * 1024);
            loop {
                while buf.len() >= HEADER_LEN {
                    let Ok(h) = Header::decode(&buf[..HEADER_LEN]) else { return };
                    let len = usize::from(h.length).max(HEADER_LEN);
                    if buf.len() < len {
                        break;
                    }
                    let m = buf.split_to(len);
                    match h.msg_type {
                        OFPT_BARRIER_REPLY => {
                            let w = waiters.lock().ok().and_then(|mut t| t.remove(&h.xid));
                            if let Some(tx) = w {
                                let _ = tx.send(());
                            }
                        }
                        OFPT_ERROR => {
                            rejected.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(xid = h.xid, "limit baseline: OFPT_ERROR");
                        }
                        OFPT_ECHO_REQUEST => {
                            if let Some(mux) = weak.upgrade() {
                                let mut r = BytesMut::from(&m[..]);
                                r[1] = OFPT_ECHO_REPLY;
                                let _ = mux.write.lock().await.write_all(&r).await;
                            }
                        }
                        _ => {}
                    }
                }
                match r.read_buf(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        });
        Ok(mux)
    }

    /// Reserves `n` xids for a caller's pre-encoded messages.
    pub fn xids(&self, n: u32) -> u32 {
        self.next_xid.fetch_add(n, Ordering::Relaxed)
    }

    /// Writes `msg` (pre-encoded, ending with a BARRIER_REQUEST with `barrier`) and waits for
    /// that barrier's reply.
    pub async fn send(&self, msg: &[Bytes], barrier: u32) -> Result<(), BenchError> {
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().map_err(|_| err("poisoned"))?.insert(barrier, tx);
        {
            let mut w = self.write.lock().await;
            for c in msg {
                w.write_all(c).await.map_err(err)?;
            }
        }
        tokio::time::timeout(WAIT, rx).await.map_err(|_| err("barrier timed out"))?.map_err(|_| err("connection closed"))
    }
}

/// Waiters for ofports, fed by one long-lived monitor on Interface(name, ofport).
pub struct OfportWatch {
    want: Arc<Mutex<HashMap<String, oneshot::Sender<i64>>>>,
    seen: Arc<Mutex<HashMap<String, i64>>>,
}

impl OfportWatch {
    pub async fn start(client: &OvsdbClient) -> Result<OfportWatch, BenchError> {
        let mut req = std::collections::BTreeMap::new();
        req.insert("Interface".to_string(), MonitorRequest::columns(["name", "ofport"]));
        let mut mon = client.monitor("Open_vSwitch", &req).await?;
        let want: Arc<Mutex<HashMap<String, oneshot::Sender<i64>>>> = Arc::default();
        let seen: Arc<Mutex<HashMap<String, i64>>> = Arc::default();
        let (w, s) = (want.clone(), seen.clone());
        tokio::spawn(async move {
            while let Some(u) = mon.updates.recv().await {
                for (_, ru) in u.get("Interface").into_iter().flatten() {
                    let Some(new) = &ru.new else { continue };
                    let name = new.get("name").and_then(Value::as_str).unwrap_or_default();
                    let ofport = new.get("ofport").and_then(Value::as_i64).unwrap_or(0);
                    if ofport <= 0 || name.is_empty() {
                        continue;
                    }
                    let tx = w.lock().ok().and_then(|mut t| t.remove(name));
                    match tx {
                        Some(tx) => {
                            let _ = tx.send(ofport);
                        }
                        None => {
                            if let Ok(mut s) = s.lock() {
                                s.insert(name.to_string(), ofport);
                            }
                        }
                    }
                }
            }
        });
        Ok(OfportWatch { want, seen })
    }

    /// Registers interest in `name`'s ofport (before the transaction that creates it).
    pub fn expect(&self, name: &str) -> Result<oneshot::Receiver<i64>, BenchError> {
        let (tx, rx) = oneshot::channel();
        if let Some(p) = self.seen.lock().map_err(|_| err("poisoned"))?.remove(name) {
            let _ = tx.send(p);
        } else {
            self.want.lock().map_err(|_| err("poisoned"))?.insert(name.to_string(), tx);
        }
        Ok(rx)
    }

    pub async fn wait(rx: oneshot::Receiver<i64>) -> Result<i64, BenchError> {
        tokio::time::timeout(WAIT, rx).await.map_err(|_| err("no ofport in time"))?.map_err(|_| err("monitor ended"))
    }
}

/// The transaction adding `ports` (name, ofport_request) to the bridge with uuid `bridge`.
pub fn add_ports_ops(bridge: &str, ports: &[(String, u32)]) -> Vec<Operation> {
    let mut ops = Vec::with_capacity(2 * ports.len() + 1);
    let mut refs = Vec::with_capacity(ports.len());
    for (k, (name, ofport)) in ports.iter().enumerate() {
        let (i, p) = (format!("i{k}"), format!("p{k}"));
        let iface = Interface { name: Some(name.clone()), ofport_request: Some(Some(i64::from(*ofport))), ..Default::default() };
        ops.push(iface.insert(Some(&i)));
        let port = Port { name: Some(name.clone()), interfaces: Some(Set::one(Ref::named(i))), ..Default::default() };
        ops.push(port.insert(Some(&p)));
        refs.push(NamedUuid::new(p));
    }
    ops.push(Bridge::mutate(where_uuid(bridge), vec![Mutation::insert(Bridge::PORTS, Set(refs))]));
    ops
}

fn where_uuid(bridge: &str) -> Vec<Condition> {
    vec![Condition::eq(Bridge::UUID, Uuid::new(bridge))]
}

/// The transaction removing the Port rows `ports` (uuids) from the bridge; their Interface
/// rows go with them (unreferenced rows of non-root tables are collected).
pub fn del_ports_ops(bridge: &str, ports: &[String]) -> Vec<Operation> {
    let refs: Set<Uuid> = ports.iter().map(Uuid::new).collect();
    vec![Bridge::mutate(where_uuid(bridge), vec![Mutation::delete(Bridge::PORTS, refs)])]
}

/// The uuid of bridge `name`.
pub async fn bridge_uuid(client: &OvsdbClient, name: &str) -> Result<String, BenchError> {
    let select = Bridge::select(vec![Condition::eq(Bridge::NAME, name)], &[Bridge::UUID]);
    let r = client.transact("Open_vSwitch", vec![select]).await?;
    let bridges: Vec<Bridge> = r.into_iter().next().unwrap_or_default().into_table()?;
    match bridges.first() {
        Some(b) => Ok(b.uuid()?.to_string()),
        None => Err(err(format!("no bridge {name}"))),
    }
}

/// One pod's pre-encoded flows: a bundle + barrier, with the barrier's xid.
pub struct Encoded {
    pub bytes: Vec<Bytes>,
    pub barrier: u32,
}

/// Encodes one bundle of `bodies` followed by a barrier, with xids reserved on `mux`.
pub fn encode_bundle(mux: &RawMux, bodies: &[Bytes]) -> Result<Encoded, BenchError> {
    let n = bodies.len() as u32 + 3;
    let mut e = Encoder::new(mux.xids(n));
    e.set_bundle_id(mux.xids(1));
    e.bundle(bodies.iter())?;
    let barrier = e.barrier();
    Ok(Encoded { bytes: e.finish(), barrier })
}
