//! Every write the controller makes goes through here: the client-side rate limit (a token
//! bucket: `--kube-api-qps`, `--kube-api-burst`), then the leadership check right before the
//! request leaves (a replica whose renewal is overdue writes nothing), then the request under
//! its deadline. Writes are conditional: a replace carries the resourceVersion read, a delete
//! the uid and resourceVersion as preconditions.

use std::future::Future;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use super::lease::Leader;

/// Why a write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("not the leader")]
    NotLeader,
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Api(#[from] kube::Error),
}

impl WriteError {
    /// The API's status code, if it answered with one.
    pub fn code(&self) -> Option<u16> {
        match self {
            WriteError::Api(kube::Error::Api(s)) => Some(s.code),
            _ => None,
        }
    }
}

pub struct Writer {
    limiter: DefaultDirectRateLimiter,
    leader: Leader,
    timeout: Duration,
    /// Requests sent.
    pub sent: AtomicU64,
}

impl Writer {
    pub fn new(qps: u32, burst: u32, leader: Leader, timeout: Duration) -> Arc<Writer> {
        let qps = NonZeroU32::new(qps).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
        Arc::new(Writer {
            limiter: RateLimiter::direct(Quota::per_second(qps).allow_burst(burst)),
            leader,
            timeout,
            sent: AtomicU64::new(0),
        })
    }

    /// Sends one write: waits for the rate limit, checks leadership, applies the deadline.
    pub async fn send<T, F>(&self, call: F) -> Result<T, WriteError>
    where
        F: Future<Output = Result<T, kube::Error>>,
    {
        self.limiter.until_ready().await;
        if !self.leader.is_leading() {
            return Err(WriteError::NotLeader);
        }
        self.sent.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r.map_err(WriteError::Api),
            Err(_) => Err(WriteError::Timeout(self.timeout)),
        }
    }
}
