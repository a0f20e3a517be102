//! Leader election through a coordination.k8s.io/v1 Lease, with client-go's rules
//! (k8s.io/client-go/tools/leaderelection):
//!
//! - A candidate takes the Lease when it is absent, released (no holder) or expired: its record
//!   (holder, renewTime, resourceVersion) has not changed for the lease duration *as this
//!   replica observed it* (its own clock only: no clock skew between replicas matters).
//! - The leader renews every retry period. Every take and renewal is a replace conditional on
//!   the resourceVersion read, so two replicas can never both win one round.
//! - The leader counts itself leading only until `renew deadline` after the *start* of its last
//!   successful renewal ([`Leader::is_leading`], checked before every write). The deadline is
//!   shorter than the lease duration, so a leader cut off from the API server stops writing
//!   before any other replica may take the Lease.
//! - On shutdown the leader releases the Lease (no holder), so that a rolling update hands over
//!   at once instead of after the lease duration.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::watch;
use tracing::{info, warn};

/// Leader-election settings.
#[derive(Clone, Debug)]
pub struct Election {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    pub api_timeout: Duration,
}

/// Whether this replica leads, for the writers.
#[derive(Clone, Debug)]
pub struct Leader {
    /// Start of the last successful take or renewal while leading; `None` when not leading.
    since: watch::Receiver<Option<Instant>>,
    renew_deadline: Duration,
}

impl Leader {
    /// Leading right now: the last renewal started less than the renew deadline ago.
    pub fn is_leading(&self) -> bool {
        matches!(*self.since.borrow(), Some(t) if t.elapsed() < self.renew_deadline)
    }

    /// Waits until this replica leads.
    pub async fn leading(&mut self) {
        loop {
            if self.is_leading() {
                return;
            }
            if self.since.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Waits until this replica no longer leads (deadline passed or Lease lost).
    pub async fn lost(&mut self) {
        loop {
            let deadline = match *self.since.borrow_and_update() {
                None => return,
                Some(t) => t + self.renew_deadline,
            };
            tokio::select! {
                _ = tokio::time::sleep_until(deadline.into()) => {
                    if !self.is_leading() {
                        return;
                    }
                }
                r = self.since.changed() => if r.is_err() { return },
            }
        }
    }
}

/// What a candidate last saw of the Lease.
#[derive(Default)]
struct Observed {
    record: Option<(Option<String>, Option<MicroTime>, Option<String>)>,
    at: Option<Instant>,
}

/// Starts the election; the task runs until `stop` resolves, then releases the Lease if held.
pub fn spawn(
    client: Client,
    e: Election,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> (Leader, tokio::task::JoinHandle<()>) {
    let (tx, since) = watch::channel(None);
    let leader = Leader { since, renew_deadline: e.renew_deadline };
    let handle = tokio::spawn(run(client, e, tx, stop));
    (leader, handle)
}

async fn run(
    client: Client,
    e: Election,
    tx: watch::Sender<Option<Instant>>,
    stop: impl std::future::Future<Output = ()>,
) {
    let api: Api<Lease> = Api::namespaced(client, &e.namespace);
    let mut observed = Observed::default();
    tokio::pin!(stop);
    loop {
        let started = Instant::now();
        let leading_before = tx.borrow().is_some();
        match tokio::time::timeout(e.api_timeout, round(&api, &e, &mut observed)).await {
            Ok(Ok(true)) => {
                if !leading_before {
                    info!(lease = %format!("{}/{}", e.namespace, e.name), identity = %e.identity, "leading: this replica holds the Lease and writes");
                }
                tx.send_replace(Some(started));
            }
            Ok(Ok(false)) => {
                if leading_before {
                    warn!(lease = %e.name, "lost the Lease to another replica: not writing");
                }
                tx.send_replace(None);
            }
            Ok(Err(err)) => {
                warn!(lease = %e.name, error = %err, "cannot read or write the Lease; will retry");
                expire(&tx, e.renew_deadline, &e.name);
            }
            Err(_) => {
                warn!(lease = %e.name, timeout = ?e.api_timeout, "the Lease call timed out; will retry");
                expire(&tx, e.renew_deadline, &e.name);
            }
        }
        // Candidates retry with jitter (client-go: up to 1.2 retry periods more) so that two
        // replicas do not collide round after round; the leader renews on the period.
        let wait = if tx.borrow().is_some() { e.retry_period } else { jitter(e.retry_period) };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = &mut stop => {
                if tx.borrow().is_some() {
                    tx.send_replace(None);
                    let _ = tokio::time::timeout(e.api_timeout, release(&api, &e)).await;
                    info!(lease = %e.name, "released the Lease");
                }
                return;
            }
        }
    }
}

/// A failed renewal: still leading until the deadline passes ([`Leader::is_leading`]); past
/// it, say so once.
fn expire(tx: &watch::Sender<Option<Instant>>, deadline: Duration, name: &str) {
    let gone = matches!(*tx.borrow(), Some(t) if t.elapsed() >= deadline);
    if gone {
        warn!(lease = %name, "could not renew the Lease within the renew deadline: not writing");
        tx.send_replace(None);
    }
}

fn jitter(d: Duration) -> Duration {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|t| t.subsec_nanos()).unwrap_or(0);
    d + d.mul_f64(1.2 * f64::from(nanos % 1000) / 1000.0)
}

fn now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

/// One try to take or renew the Lease; `Ok(true)` when this replica holds it.
async fn round(api: &Api<Lease>, e: &Election, observed: &mut Observed) -> Result<bool, kube::Error> {
    let lease = match api.get_opt(&e.name).await? {
        Some(l) => l,
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(e.name.clone()),
                    namespace: Some(e.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(spec(e, 0, now())),
            };
            return match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(err) => Err(err),
            };
        }
    };
    let s = lease.spec.clone().unwrap_or_default();
    let holder = s.holder_identity.clone().filter(|h| !h.is_empty());
    let record = (holder.clone(), s.renew_time.clone(), lease.metadata.resource_version.clone());
    if observed.record.as_ref() != Some(&record) {
        observed.record = Some(record);
        observed.at = Some(Instant::now());
    }
    let mine = holder.as_deref() == Some(e.identity.as_str());
    if !mine && holder.is_some() {
        let duration =
            s.lease_duration_seconds.map(|d| Duration::from_secs(d.max(1) as u64)).unwrap_or(e.lease_duration);
        let expired = observed.at.is_some_and(|at| at.elapsed() >= duration);
        if !expired {
            return Ok(false);
        }
    }
    let transitions = s.lease_transitions.unwrap_or(0);
    let mut new = lease.clone();
    let mut spec_ = if mine { s.clone() } else { spec(e, transitions.saturating_add(1), now()) };
    spec_.renew_time = Some(now());
    spec_.lease_duration_seconds = Some(secs(e.lease_duration));
    new.spec = Some(spec_);
    // The replace carries the resourceVersion read: a concurrent take makes it fail (409).
    match api.replace(&e.name, &PostParams::default(), &new).await {
        Ok(_) => {
            if !mine {
                info!(lease = %e.name, previous = ?holder, "took the Lease");
            }
            Ok(true)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(err) => Err(err),
    }
}

fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

fn spec(e: &Election, transitions: i32, at: MicroTime) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(e.identity.clone()),
        lease_duration_seconds: Some(secs(e.lease_duration)),
        acquire_time: Some(at.clone()),
        renew_time: Some(at),
        lease_transitions: Some(transitions),
        ..Default::default()
    }
}

/// Gives the Lease up (client-go's ReleaseOnCancel): no holder, so another replica takes it
/// at its next try.
async fn release(api: &Api<Lease>, e: &Election) -> Result<(), kube::Error> {
    let Some(mut lease) = api.get_opt(&e.name).await? else { return Ok(()) };
    let Some(s) = lease.spec.as_mut() else { return Ok(()) };
    if s.holder_identity.as_deref() != Some(e.identity.as_str()) {
        return Ok(());
    }
    s.holder_identity = None;
    s.lease_duration_seconds = Some(1);
    s.renew_time = Some(now());
    api.replace(&e.name, &PostParams::default(), &lease).await.map(|_| ())
}
