//! DNS for egress policies' `dnsName` rules, off the reconcile path: a task resolves the names
//! the model uses (concurrently, a bounded number at a time, each with a deadline), caches each
//! answer for the record's TTL, re-resolves it when it expires, and sends the answers to the
//! reconciler whenever they change; a changed answer swaps that VNID's rules atomically through
//! the normal converge path. Until a name's first answer arrives, its VNID is treated as for a
//! failed lookup (all egress dropped), as openshift-sdn does on failure.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use hickory_resolver::TokioResolver;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::pipeline::egress::DnsAnswers;

/// How many names are resolved at the same time.
const PARALLEL: usize = 8;
/// Bounds on how long an answer is trusted.
const MIN_TTL: Duration = Duration::from_secs(5);
const MAX_TTL: Duration = Duration::from_secs(1800);
/// How soon a failed lookup is retried.
const NEGATIVE_TTL: Duration = Duration::from_secs(30);
/// The cache lifetime of an answer from the system resolver (which gives no TTL).
/// How long an egress policy's dnsName lookup may take (`apply` and `run`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

const FALLBACK_TTL: Duration = Duration::from_secs(60);

struct Entry {
    answer: Result<Vec<IpAddr>, String>,
    expires: Instant,
}

/// A resolver with a per-name cache.
pub struct Dns {
    resolver: Option<TokioResolver>,
    cache: BTreeMap<String, Entry>,
    timeout: Duration,
}

impl Dns {
    /// Uses the system configuration (/etc/resolv.conf, /etc/hosts); falls back to the C
    /// library's resolver if it cannot be read.
    pub fn new(timeout: Duration) -> Dns {
        let resolver = match TokioResolver::builder_tokio() {
            Ok(b) => Some(b.build()),
            Err(e) => {
                warn!(error = %e, "no DNS configuration for the native resolver; using the system resolver without TTLs");
                None
            }
        };
        Dns { resolver, cache: BTreeMap::new(), timeout }
    }

    /// Asks the given name servers (`IP:PORT`, UDP then TCP) instead of the system's.
    pub fn with_servers(timeout: Duration, servers: &[std::net::SocketAddr]) -> Dns {
        use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig};
        let mut group = NameServerConfigGroup::new();
        for s in servers {
            group.merge(NameServerConfigGroup::from_ips_clear(&[s.ip()], s.port(), true));
        }
        let config = ResolverConfig::from_parts(None, vec![], group);
        let resolver =
            TokioResolver::builder_with_config(config, hickory_resolver::name_server::TokioConnectionProvider::default()).build();
        Dns { resolver: Some(resolver), cache: BTreeMap::new(), timeout }
    }

    async fn lookup(&self, name: &str) -> Entry {
        let now = Instant::now();
        let Some(r) = &self.resolver else {
            let answer = match tokio::time::timeout(self.timeout, tokio::net::lookup_host((name, 0))).await {
                Err(_) => Err(format!("no answer within {:?}", self.timeout)),
                Ok(Err(e)) => Err(e.to_string()),
                Ok(Ok(addrs)) => non_empty(addrs.map(|a| a.ip()).collect()),
            };
            let ttl = if answer.is_ok() { FALLBACK_TTL } else { NEGATIVE_TTL };
            return Entry { answer, expires: now + ttl };
        };
        // A trailing dot: the name is absolute (no search domains). A and AAAA, asked at once
        // under one deadline: the answer is every address either gave (which family a node
        // uses is the egress policy's business); the name failed only if neither answered.
        let fqdn = format!("{}.", name.trim_end_matches('.'));
        let both = async { tokio::join!(r.ipv4_lookup(fqdn.as_str()), r.ipv6_lookup(fqdn.as_str())) };
        let (a, aaaa) = match tokio::time::timeout(self.timeout, both).await {
            Err(_) => return Entry { answer: Err(format!("no answer within {:?}", self.timeout)), expires: now + NEGATIVE_TTL },
            Ok(both) => both,
        };
        let mut addrs = Vec::new();
        let mut until: Option<std::time::Instant> = None;
        let mut errors = Vec::new();
        match a {
            Ok(l) => {
                until = Some(l.valid_until());
                addrs.extend(l.iter().map(|r| IpAddr::V4(r.0)));
            }
            Err(e) => errors.push(e.to_string()),
        }
        match aaaa {
            Ok(l) => {
                until = Some(until.map_or(l.valid_until(), |u| u.min(l.valid_until())));
                addrs.extend(l.iter().map(|r| IpAddr::V6(r.0)));
            }
            Err(e) => errors.push(e.to_string()),
        }
        match until {
            // Both failed: the A lookup's error says why (the AAAA one says the same or less).
            None => Entry { answer: Err(errors.into_iter().next().unwrap_or_default()), expires: now + NEGATIVE_TTL },
            Some(u) => {
                let ttl = u.saturating_duration_since(std::time::Instant::now()).clamp(MIN_TTL, MAX_TTL);
                Entry { answer: non_empty(addrs), expires: now + ttl }
            }
        }
    }

    /// Resolves `names` concurrently, [`PARALLEL`] at a time.
    async fn lookup_all(&self, names: Vec<String>) -> Vec<(String, Entry)> {
        use futures::StreamExt;
        futures::stream::iter(names.into_iter().map(|n| async move {
            let e = self.lookup(&n).await;
            debug!(name = %n, answer = ?e.answer, "resolved");
            (n, e)
        }))
        .buffer_unordered(PARALLEL)
        .collect()
        .await
    }

    /// The answers for `names`, from the cache where fresh; unused names are forgotten.
    pub async fn answers(&mut self, names: &BTreeSet<String>) -> DnsAnswers {
        self.cache.retain(|n, _| names.contains(n));
        let now = Instant::now();
        let due: Vec<String> = names.iter().filter(|n| self.cache.get(*n).is_none_or(|e| e.expires <= now)).cloned().collect();
        for (n, e) in self.lookup_all(due).await {
            self.cache.insert(n, e);
        }
        self.current()
    }

    fn current(&self) -> DnsAnswers {
        self.cache.iter().map(|(n, e)| (n.clone(), e.answer.clone())).collect()
    }

    /// Re-resolves the names whose answer expired; true if any answer changed.
    pub async fn refresh(&mut self) -> bool {
        let now = Instant::now();
        let due: Vec<String> = self.cache.iter().filter(|(_, e)| e.expires <= now).map(|(n, _)| n.clone()).collect();
        let mut changed = false;
        for (name, e) in self.lookup_all(due).await {
            if self.cache.get(&name).is_none_or(|old| old.answer != e.answer) {
                changed = true;
            }
            self.cache.insert(name, e);
        }
        changed
    }

    /// Runs the resolver as a task: `names` says which names are in use; every change of the
    /// answers is sent on the returned channel (bounded; only the latest answers matter).
    pub fn spawn(mut self, mut names: watch::Receiver<BTreeSet<String>>, cancel: CancellationToken) -> mpsc::Receiver<DnsAnswers> {
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut last = DnsAnswers::new();
            loop {
                let wanted = names.borrow_and_update().clone();
                let mut answers = self.answers(&wanted).await;
                if self.refresh().await {
                    answers = self.current();
                }
                if answers != last {
                    last = answers.clone();
                    if tx.send(answers).await.is_err() {
                        return;
                    }
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    r = names.changed() => if r.is_err() { return },
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        });
        rx
    }
}

fn non_empty(mut v: Vec<IpAddr>) -> Result<Vec<IpAddr>, String> {
    v.sort();
    v.dedup();
    if v.is_empty() {
        Err("no address".to_string())
    } else {
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn localhost_and_failures_are_cached() {
        let mut d = Dns::new(Duration::from_secs(5));
        let names: BTreeSet<String> = ["localhost".to_string(), "no-such-host.invalid".to_string()].into();
        let a = d.answers(&names).await;
        let local = a["localhost"].as_ref().expect("localhost resolves");
        assert!(local.contains(&IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)), "{a:?}");
        assert!(a["no-such-host.invalid"].is_err());
        // Nothing expired yet: no change.
        assert!(!d.refresh().await);
        let only: BTreeSet<String> = ["localhost".to_string()].into();
        assert_eq!(d.answers(&only).await.len(), 1, "unused names are forgotten");
    }
}
