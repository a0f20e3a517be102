//! The pod path's use of the checkpoint ([`super::checkpoint`]): what a request writes before
//! it is answered (its own pod's file), and the background writer for changes no request
//! wrote.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::checkpoint::{CheckpointError, PARALLEL_WRITES, WRITE_TIMEOUT};
use super::{PodError, Pods};
use crate::cluster::PodKey;
use crate::node::record::PodRecord;

/// Pod `key` as the model has it, with a write number drawn under the model's lock.
fn pod_snapshot<'a>(pods: &'a Pods, key: &'a PodKey) -> impl FnOnce() -> (Option<PodRecord>, u64) + 'a {
    move || {
        let m = pods.state.lock();
        (m.saved_pod(key), pods.checkpoint.next_seq())
    }
}

/// Pod `key`'s file and IPAM's as the model has them, within `deadline`: what a request
/// writes before it is answered (its cost does not depend on the number of pods).
pub async fn persist_pod(pods: &Pods, key: &PodKey, deadline: Instant) -> Result<(), CheckpointError> {
    let cp = &pods.checkpoint;
    let (ipam, pod) = tokio::join!(
        cp.persist_ipam(|| pods.state.lock().ipam_cursor(), deadline),
        cp.persist_pod(key, pod_snapshot(pods, key), deadline)
    );
    ipam.and(pod)
}

/// Every file as the model has it, within `deadline`: after the recovery, and in the
/// background for changes no request wrote. Only files that differ are written.
pub async fn persist(pods: &Pods, deadline: Instant) -> Result<(), CheckpointError> {
    let cp = &pods.checkpoint;
    if !cp.begin_full_pass()? {
        return Ok(());
    }
    let held = pods.state.lock().held_records();
    let keys = cp.differing(&held);
    let ipam = cp.persist_ipam(|| pods.state.lock().ipam_cursor(), deadline).await;
    let writes: Vec<Result<(), CheckpointError>> = futures::stream::iter(keys)
        .map(|k| async move { cp.persist_pod(&k, pod_snapshot(pods, &k), deadline).await })
        .buffer_unordered(PARALLEL_WRITES)
        .collect()
        .await;
    writes.into_iter().fold(ipam, |acc, r| acc.and(r))
}

/// After a teardown: the pod's file is gone before the request is answered (a failure fails
/// the request, whose retry writes again). After a failed write, every file is brought up to
/// date too: the pod a retried DEL was for may not be the one it names any more.
pub(super) async fn forgotten(pods: &Pods, key: &PodKey, deadline: Instant) -> Result<(), PodError> {
    let mut r = persist_pod(pods, key, deadline).await;
    if r.is_ok() && pods.checkpoint.is_dirty() {
        r = persist(pods, deadline).await;
    }
    r.map_err(|e| {
        PodError::Failed(format!(
            "pod {}/{}: torn down, but the agent's record of it remains: {e}; retry",
            key.0, key.1
        ))
    })
}

/// How often [`keep_written`] looks for changes nobody wrote (a sandbox collected, a pod the
/// cluster deleted, a teardown finished by the reconcile loop).
const BACKGROUND_INTERVAL: Duration = Duration::from_secs(1);

/// Writes the files whenever the model's pods changed without a request writing them.
pub async fn keep_written(pods: Arc<Pods>, cancel: CancellationToken) {
    if !pods.checkpoint.enabled() {
        return;
    }
    let mut last_error = None;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(BACKGROUND_INTERVAL) => {}
        }
        match persist(&pods, Instant::now() + WRITE_TIMEOUT).await {
            Ok(()) => last_error = None,
            Err(CheckpointError::NotRecovered { .. }) => {}
            Err(e) => {
                let msg = e.to_string();
                if last_error.as_ref() != Some(&msg) {
                    tracing::warn!(error = %msg, "could not write the checkpoint; will retry");
                }
                last_error = Some(msg);
            }
        }
    }
}
