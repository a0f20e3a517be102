//! DNS for egress policies' `dnsName` rules: resolved before flows are built, cached for the
//! record's TTL, re-resolved when it expires; a changed answer triggers a new (atomic) swap of
//! that VNID's rules through the normal reconcile path.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::Duration;

use hickory_resolver::TokioResolver;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::pipeline::egress::DnsAnswers;

/// Bounds on how long an answer is trusted.
const MIN_TTL: Duration = Duration::from_secs(5);
const MAX_TTL: Duration = Duration::from_secs(1800);
/// How soon a failed lookup is retried.
const NEGATIVE_TTL: Duration = Duration::from_secs(30);
/// The cache lifetime of an answer from the system resolver (which gives no TTL).
const FALLBACK_TTL: Duration = Duration::from_secs(60);

struct Entry {
    answer: Result<Vec<Ipv4Addr>, String>,
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

    async fn lookup(&self, name: &str) -> Entry {
        let now = Instant::now();
        let Some(r) = &self.resolver else {
            let answer = match tokio::time::timeout(self.timeout, tokio::net::lookup_host((name, 0))).await {
                Err(_) => Err(format!("no answer within {:?}", self.timeout)),
                Ok(Err(e)) => Err(e.to_string()),
                Ok(Ok(addrs)) => non_empty(
                    addrs
                        .filter_map(|a| match a.ip() {
                            std::net::IpAddr::V4(v4) => Some(v4),
                            std::net::IpAddr::V6(_) => None,
                        })
                        .collect(),
                ),
            };
            let ttl = if answer.is_ok() { FALLBACK_TTL } else { NEGATIVE_TTL };
            return Entry { answer, expires: now + ttl };
        };
        // A trailing dot: the name is absolute (no search domains).
        let fqdn = format!("{}.", name.trim_end_matches('.'));
        match tokio::time::timeout(self.timeout, r.ipv4_lookup(fqdn.as_str())).await {
            Err(_) => Entry { answer: Err(format!("no answer within {:?}", self.timeout)), expires: now + NEGATIVE_TTL },
            Ok(Err(e)) => Entry { answer: Err(e.to_string()), expires: now + NEGATIVE_TTL },
            Ok(Ok(lookup)) => {
                let ttl = lookup.valid_until().saturating_duration_since(std::time::Instant::now()).clamp(MIN_TTL, MAX_TTL);
                let answer = non_empty(lookup.iter().map(|a| a.0).collect());
                Entry { answer, expires: now + ttl }
            }
        }
    }

    /// The answers for `names`, from the cache where fresh; unused names are forgotten.
    pub async fn answers(&mut self, names: &BTreeSet<String>) -> DnsAnswers {
        self.cache.retain(|n, _| names.contains(n));
        let now = Instant::now();
        for name in names {
            if self.cache.get(name).is_none_or(|e| e.expires <= now) {
                let e = self.lookup(name).await;
                debug!(%name, answer = ?e.answer, "resolved");
                self.cache.insert(name.clone(), e);
            }
        }
        self.cache.iter().map(|(n, e)| (n.clone(), e.answer.clone())).collect()
    }

    /// Re-resolves the names whose answer expired; true if any answer changed.
    pub async fn refresh(&mut self) -> bool {
        let now = Instant::now();
        let due: Vec<String> = self.cache.iter().filter(|(_, e)| e.expires <= now).map(|(n, _)| n.clone()).collect();
        let mut changed = false;
        for name in due {
            let e = self.lookup(&name).await;
            if self.cache.get(&name).is_none_or(|old| old.answer != e.answer) {
                changed = true;
            }
            self.cache.insert(name, e);
        }
        changed
    }
}

fn non_empty(mut v: Vec<Ipv4Addr>) -> Result<Vec<Ipv4Addr>, String> {
    v.sort();
    v.dedup();
    if v.is_empty() {
        Err("no IPv4 address".to_string())
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
        assert_eq!(a["localhost"], Ok(vec![Ipv4Addr::LOCALHOST]), "{a:?}");
        assert!(a["no-such-host.invalid"].is_err());
        // Nothing expired yet: no change.
        assert!(!d.refresh().await);
        let only: BTreeSet<String> = ["localhost".to_string()].into();
        assert_eq!(d.answers(&only).await.len(), 1, "unused names are forgotten");
    }
}
