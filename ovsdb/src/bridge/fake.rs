//! A scripted ovsdb-server for the unit tests: each `transact` is answered with what a closure
//! returns for its operations, and recorded; other requests get an empty object.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio_util::codec::FramedRead;

use super::Ovs;
use crate::client::{ClientOptions, OvsdbClient};
use crate::framing::JsonCodec;

pub(crate) struct Fake {
    pub ovs: Ovs,
    log: Arc<Mutex<Vec<Vec<Value>>>>,
}

impl Fake {
    /// Serves `answer(ops)` as the result of each transaction of `ops`.
    pub fn start(mut answer: impl FnMut(&[Value]) -> Value + Send + 'static) -> Fake {
        let (a, b) = tokio::io::duplex(1 << 20);
        let client = OvsdbClient::from_stream(a, ClientOptions { probe_interval: None, ..Default::default() });
        let log: Arc<Mutex<Vec<Vec<Value>>>> = Arc::default();
        let seen = log.clone();
        tokio::spawn(async move {
            let (rd, mut wr) = tokio::io::split(b);
            let mut frames = FramedRead::new(rd, JsonCodec::default());
            while let Some(Ok(msg)) = frames.next().await {
                let result = match msg["method"].as_str() {
                    Some("transact") => {
                        let ops = msg["params"].as_array().map(|p| p[1..].to_vec()).unwrap_or_default();
                        seen.lock().unwrap().push(ops.clone());
                        answer(&ops)
                    }
                    _ => json!({}),
                };
                let reply = json!({"id": msg["id"], "result": result, "error": null});
                if wr.write_all(reply.to_string().as_bytes()).await.is_err() {
                    return;
                }
            }
        });
        Fake { ovs: Ovs::new(client), log }
    }

    /// The operations of every transaction so far.
    pub fn transactions(&self) -> Vec<Vec<Value>> {
        self.log.lock().unwrap().clone()
    }
}
