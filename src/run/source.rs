//! The state-file source: watches the file (inotify, through `notify`) and publishes each new
//! valid state. A file that fails to parse keeps the last good state; the error is logged. An
//! object of the file rejected on its own keeps its last good version (the one published).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use notify::{RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};
use tracing::{error, info, warn};

use crate::cluster::netpol::NetworkPolicy;
use crate::cluster::{state_file, ClusterState, PoliciesSeen, PolicyKey, PolicySeen};

pub use crate::cluster::Loaded;

/// Loads the file once and then follows it. The returned receiver always holds the last good
/// state (`None` until the file first parses). The watcher lives as long as the task.
pub fn watch_file(path: PathBuf) -> watch::Receiver<Option<Arc<Loaded>>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        // Each change carries the instant inotify reported it: a policy change's realization is
        // timed from there (the debounce and the parse are part of what it waits for).
        let (ev_tx, mut ev_rx) = mpsc::channel::<Instant>(16);
        // Watch the directory: editors and `kubectl cp` replace the file rather than write it.
        let dir = path.parent().map(Path::to_path_buf).filter(|d| !d.as_os_str().is_empty()).unwrap_or_else(|| ".".into());
        let name = path.file_name().map(|n| n.to_owned());
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            if let Ok(ev) = res {
                // Reads (ours included) are not changes.
                let change = matches!(ev.kind, notify::EventKind::Create(_) | notify::EventKind::Modify(_) | notify::EventKind::Remove(_));
                if change && ev.paths.iter().any(|p| p.file_name() == name.as_deref()) {
                    let _ = ev_tx.try_send(Instant::now());
                }
            }
        });
        let _watcher = match watcher {
            Ok(mut w) => match w.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => Some(w),
                Err(e) => {
                    error!(dir = %dir.display(), error = %e, "cannot watch the state file's directory; changes will not be picked up");
                    None
                }
            },
            Err(e) => {
                error!(error = %e, "cannot start a file watcher; changes will not be picked up");
                None
            }
        };
        let mut last = None;
        let mut policies = Policies::default();
        load_into(&path, &tx, &mut last, &mut policies, Instant::now());
        while let Some(first) = ev_rx.recv().await {
            // Debounce: an editor's save is several events (timed from the first).
            tokio::time::sleep(Duration::from_millis(50)).await;
            while ev_rx.try_recv().is_ok() {}
            load_into(&path, &tx, &mut last, &mut policies, first);
            if tx.is_closed() {
                return;
            }
        }
    });
    rx
}

/// Loads the file unless its content is what was loaded last; `at` is when the change was
/// detected.
fn load_into(path: &Path, tx: &watch::Sender<Option<Arc<Loaded>>>, last: &mut Option<String>, policies: &mut Policies, at: Instant) {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            error!(path = %path.display(), error = %e, "cannot read the state file; keeping the last good state");
            return;
        }
    };
    if last.as_deref() == Some(text.as_str()) {
        return;
    }
    // An object rejected now that the published state has keeps that version (as a rejected
    // Kubernetes update does): a typo does not tear a pod down.
    let previous = tx.borrow().clone();
    let parsed = state_file::parse_keeping(&text, previous.as_ref().map(|l| &l.state))
        .map_err(|crate::cluster::Fatal(m)| crate::cluster::Fatal(format!("{}: {m}", path.display())));
    *last = Some(text);
    match parsed {
        Ok((state, problems)) => {
            for p in &problems {
                warn!(object = %p.object, field = %p.field, "rejected: {}", p.message);
            }
            info!(path = %path.display(), pods = state.pods.len(), rejected = problems.len(), "state loaded");
            let policies_seen = policies.stamp(&state, at);
            tx.send_replace(Some(Arc::new(Loaded { state, problems, live_pods: None, touched: None, seq: 0, pod_annotations: Default::default(), policies_seen })));
        }
        Err(e) => {
            let kept = if tx.borrow().is_some() { "keeping the last good state" } else { "no state applied yet" };
            error!(error = %e, "state file rejected; {kept}");
        }
    }
}

/// The state file's NetworkPolicies as last loaded, each with its generation. A state file's
/// objects rarely carry `metadata.generation`, and nothing bumps it when the file is edited,
/// so the source counts itself: 1 when a policy first appears, one more each time a load finds
/// its checked form changed (an edit that changes nothing the agent uses is no new generation).
#[derive(Debug, Default)]
struct Policies(BTreeMap<PolicyKey, (NetworkPolicy, PolicySeen)>);

impl Policies {
    /// The generations of `state`'s policies, a changed or new one stamped `at`; policies no
    /// longer in the state are forgotten (one that comes back starts again at 1).
    fn stamp(&mut self, state: &ClusterState, at: Instant) -> PoliciesSeen {
        let mut next = BTreeMap::new();
        for p in &state.network_policies {
            let key = (p.namespace.clone(), p.name.clone());
            let seen = match self.0.get(&key) {
                Some((old, seen)) if old == p => *seen,
                Some((_, seen)) => PolicySeen { generation: seen.generation.saturating_add(1), at },
                None => PolicySeen { generation: 1, at },
            };
            next.insert(key, (p.clone(), seen));
        }
        self.0 = next;
        self.0.iter().map(|(k, (_, s))| (k.clone(), *s)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "node: node-a\nplugin: networkpolicy\nclusterNetwork: 10.128.0.0/14\nserviceNetwork: 172.30.0.0/16\nhostSubnets:\n  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.2.0/23}\nnetNamespaces:\n  - {name: a, netid: 11}\n";

    fn state(policies: &[(&str, &str)]) -> ClusterState {
        let mut text = format!("{HEADER}networkPolicies:\n");
        for (name, spec) in policies {
            text.push_str(&format!("  - {{apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {{name: {name}, namespace: a}}, spec: {spec}}}\n"));
        }
        let (state, problems) = state_file::parse(&text).expect("state");
        assert!(problems.is_empty() && state.network_policies.len() == policies.len(), "{problems:?}\n{text}");
        state
    }

    /// A policy's generation moves only when its checked form changes, and keeps the instant
    /// of the load that changed it: an unrelated edit of the file does not restart its clock.
    #[test]
    fn generations_count_changes_of_each_policy() {
        let (deny, open) = ("{podSelector: {}}", "{podSelector: {}, ingress: [{}]}");
        let (t0, t1, t2) = (Instant::now(), Instant::now() + Duration::from_secs(1), Instant::now() + Duration::from_secs(2));
        let key = |n: &str| ("a".to_string(), n.to_string());
        let mut p = Policies::default();
        let s = p.stamp(&state(&[("px", deny)]), t0);
        assert_eq!(s[&key("px")], PolicySeen { generation: 1, at: t0 });
        let s = p.stamp(&state(&[("px", deny), ("py", deny)]), t1);
        assert_eq!(s[&key("px")], PolicySeen { generation: 1, at: t0 }, "unchanged");
        assert_eq!(s[&key("py")], PolicySeen { generation: 1, at: t1 }, "new");
        let s = p.stamp(&state(&[("px", open)]), t2);
        assert_eq!(s[&key("px")], PolicySeen { generation: 2, at: t2 }, "changed");
        assert!(!s.contains_key(&key("py")), "gone");
        let s = p.stamp(&state(&[("px", open), ("py", deny)]), t2);
        assert_eq!(s[&key("py")].generation, 1, "back, as a new policy");
    }
}
