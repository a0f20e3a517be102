//! The pods a restarted agent takes back: the records on the OVS ports (`external_ids`) and
//! the agent's checkpoint ([`super::checkpoint`]), checked against the kernel.
//!
//! 1. **Union.** A pod recorded in either is a candidate: the checkpoint covers what the
//!    database lost (an OVS reinstall, a recreated `conf.db`), OVSDB what the checkpoint has
//!    not caught up with yet (a setup whose answer the agent never gave).
//! 2. **When both have the pod and disagree, OVSDB's record wins.** Every change is written to
//!    OVSDB first (the port and its record in one transaction) and to the checkpoint after it
//!    (before the answer), for setups and teardowns alike; so where both have a record of the
//!    pod, OVSDB's is the newer one, and the checkpoint's can only be older (a teardown whose
//!    checkpoint write did not happen). The checkpoint is the record that survives; OVSDB the
//!    one that is current while it lives. If the two name different containers, the kernel
//!    decides first: the record whose sandbox and interface are live is kept, OVSDB's if both
//!    are.
//! 3. **The kernel decides what is live.** A CNI pod is re-attached (its record, address and
//!    MAC; its port added again if the database lost it) only when its sandbox exists and its
//!    host veth is there and paired with its interface in that sandbox. Otherwise the pod is
//!    torn down: its interface deleted if it is still there (only the recorded one), its port
//!    and flows removed by the next converge, its address released. A pod set up through the
//!    pod API without CNI has no sandbox of the agent's to check and is re-attached as before.
//!
//! Until this has finished, the agent serves no pod request (the pod API waits for the switch
//! to be synced, which waits for the pods' ports): no address is handed out before every
//! address a live sandbox holds is known. A kernel query that fails fails the recovery, which
//! the next converge pass retries; nothing of the model changes before it succeeds.

use std::collections::BTreeMap;

use futures::StreamExt;
use tokio::time::Instant;
use tracing::{info, warn};

use super::checkpoint;
use super::Pods;
use crate::node::record::PodRecord;
use crate::cluster::{Pod, PodKey};

/// Where a candidate's record came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Ovsdb,
    Checkpoint,
}

/// The records of one pod.
#[derive(Clone, Debug, Default)]
pub struct Claim {
    pub ovsdb: Option<(Pod, PodRecord)>,
    pub checkpoint: Option<(Pod, PodRecord)>,
}

/// Whether a record's sandbox and interface are there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Liveness {
    Live,
    /// Why not (for the log).
    Gone(String),
}

/// What becomes of one pod's records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    pub keep: Option<(Origin, PodRecord)>,
    /// Records torn down, with why.
    pub tear_down: Vec<(PodRecord, String)>,
}

/// The union of both sources, by pod. Checkpoint records that are not valid pods cannot occur
/// (the file is validated when read) and are skipped.
pub fn merge(ovsdb: Vec<(Pod, PodRecord)>, saved: &[PodRecord]) -> BTreeMap<PodKey, Claim> {
    let mut claims: BTreeMap<PodKey, Claim> = BTreeMap::new();
    for (pod, req) in ovsdb {
        let key = pod.key();
        claims.entry(key).or_default().ovsdb = Some((pod, req));
    }
    for req in saved {
        if let Ok(pod) = req.to_pod() {
            let key = pod.key();
            claims.entry(key).or_default().checkpoint = Some((pod, req.clone()));
        }
    }
    claims
}

/// Which records of a pod to keep, given each record's liveness; see the module documentation.
pub fn decide(claim: &Claim, live: impl Fn(&PodRecord) -> Liveness) -> Decision {
    let mut d = Decision::default();
    let consider = |origin: Origin, r: &PodRecord, d: &mut Decision| match live(r) {
        Liveness::Live if d.keep.is_none() => d.keep = Some((origin, r.clone())),
        Liveness::Live => d.tear_down.push((r.clone(), "another record of the pod, newer in OVSDB, is live".into())),
        Liveness::Gone(why) => d.tear_down.push((r.clone(), why)),
    };
    match (&claim.ovsdb, &claim.checkpoint) {
        (Some((_, o)), Some((_, c))) if o.container_id == c.container_id => {
            if o != c {
                warn!(pod = %format!("{}/{}", o.namespace, o.name), ovsdb = ?o, checkpoint = ?c, "OVSDB and the checkpoint disagree about a pod; OVSDB's record (the newer) wins");
            }
            consider(Origin::Ovsdb, o, &mut d);
        }
        (o, c) => {
            if let Some((_, o)) = o {
                consider(Origin::Ovsdb, o, &mut d);
            }
            if let Some((_, c)) = c {
                consider(Origin::Checkpoint, c, &mut d);
            }
        }
    }
    d
}

/// A record's sandbox and interface, as the kernel has them. `Err`: the kernel could not be
/// asked (the recovery is retried).
async fn liveness(host: &hostnet::Netns, r: &PodRecord) -> Result<Liveness, String> {
    let Some(cni) = &r.cni else { return Ok(Liveness::Live) };
    if !std::path::Path::new(&cni.netns).exists() {
        return Ok(Liveness::Gone(format!("its sandbox {} is gone", cni.netns)));
    }
    let sandbox = match hostnet::Netns::open(&cni.netns) {
        Ok(ns) => ns,
        Err(e) if e.errno() == Some(libc::ENOENT) => {
            return Ok(Liveness::Gone(format!("its sandbox {} is gone", cni.netns)))
        }
        Err(e) => return Err(format!("sandbox {} of pod {}/{}: {e}", cni.netns, r.namespace, r.name)),
    };
    let state = hostnet::veth_state(host, &r.host_veth, cni.host_ifindex, &sandbox, &cni.if_name)
        .await
        .map_err(|e| format!("interface {} of pod {}/{}: {e}", r.host_veth, r.namespace, r.name))?;
    Ok(match state {
        hostnet::VethState::Paired { .. } => Liveness::Live,
        hostnet::VethState::HostGone => Liveness::Gone(format!("its interface {} is gone", r.host_veth)),
        hostnet::VethState::PodGone { .. } => Liveness::Gone(format!(
            "{} is no longer paired with {} in its sandbox {}",
            r.host_veth, cni.if_name, cni.netns
        )),
        hostnet::VethState::NotOurs { .. } => Liveness::Gone(format!("{} is another interface now", r.host_veth)),
    })
}

/// Deletes what the agent made for a torn-down record: its host veth, if it is still the
/// recorded one (its ifindex; deleting it deletes the pod's end too).
async fn remove_interface(host: &hostnet::Netns, r: &PodRecord) -> Result<(), String> {
    let Some(cni) = &r.cni else { return Ok(()) };
    match hostnet::delete_owned(host, &r.host_veth, cni.host_ifindex).await {
        Ok(_) => Ok(()),
        Err(e) => Err(format!("deleting interface {} of pod {}/{}: {e}", r.host_veth, r.namespace, r.name)),
    }
}

/// How many kernel look-ups run at once.
const CONCURRENCY: usize = 16;

/// Recovers the API pods into the model (see the module documentation); `from_ovsdb` are the
/// records on the bridge's ports.
pub async fn recover(pods: &Pods, from_ovsdb: Vec<(Pod, PodRecord)>) -> Result<(), String> {
    let saved = pods.checkpoint.loaded().unwrap_or_default();
    let claims = merge(from_ovsdb, &saved.pods);
    let host = hostnet::Netns::current().map_err(|e| format!("the agent's network namespace: {e}"))?;
    // Every record's liveness, looked up concurrently.
    let records: Vec<PodRecord> =
        claims.values().flat_map(|c| c.ovsdb.iter().chain(c.checkpoint.iter())).map(|(_, r)| r.clone()).collect();
    let looked: Vec<Result<(String, Liveness), String>> = futures::stream::iter(records)
        .map(|r| {
            let host = host.clone();
            async move { liveness(&host, &r).await.map(|l| (identity(&r), l)) }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let mut live = std::collections::HashMap::new();
    for l in looked {
        let (id, l) = l?;
        live.insert(id, l);
    }
    let decisions: Vec<(PodKey, Decision)> = claims
        .iter()
        .map(|(k, c)| (k.clone(), decide(c, |r| live.get(&identity(r)).cloned().unwrap_or(Liveness::Live))))
        .collect();
    // Torn-down records' interfaces: deleted now, before any of their addresses is free.
    for (_, d) in &decisions {
        for (r, why) in &d.tear_down {
            info!(pod = %format!("{}/{}", r.namespace, r.name), container = %r.container_id, ip = %r.ip, "{why}: tearing the pod down and releasing its address");
            remove_interface(&host, r).await?;
        }
    }
    let (mut from_checkpoint, mut kept) = (0, Vec::new());
    for (_, d) in decisions.iter() {
        if let Some((origin, r)) = &d.keep {
            if let Ok(pod) = r.to_pod() {
                if *origin == Origin::Checkpoint && claims.get(&pod.key()).is_none_or(|c| c.ovsdb.is_none()) {
                    from_checkpoint += 1;
                }
                kept.push((pod, r.clone()));
            }
        }
    }
    let torn: usize = decisions.iter().map(|(_, d)| d.tear_down.len()).sum();
    if !kept.is_empty() || torn > 0 {
        info!(pods = kept.len(), from_checkpoint_alone = from_checkpoint, torn_down = torn, "pods recovered");
    }
    {
        let mut m = pods.state.lock();
        m.recover(kept);
        m.restore_ipam_cursor(saved.ipam);
        // No checkpoint (or a corrupt one moved aside, or one from before dual-stack without an
        // IPv6 position): IPAM resumes, per family, after the highest address OVSDB and the
        // kernel still held, kept or just torn down, rather than at the bottom of the subnet,
        // where it would hand out a recently released address first.
        let held: Vec<&PodRecord> =
            decisions.iter().flat_map(|(_, d)| d.keep.iter().map(|(_, r)| r).chain(d.tear_down.iter().map(|(r, _)| r))).collect();
        let ips: Vec<crate::domain::PodIps> =
            held.iter().filter_map(|r| crate::domain::PodIps::from_first_and_second(r.ip, r.ip6)).collect();
        m.restore_ipam_cursor(crate::node::state::IpamCursor {
            v4: ips.iter().filter_map(|p| p.v4).max(),
            v6: ips.iter().filter_map(|p| p.v6).max(),
        });
        for p in std::mem::take(&mut m.rebuild_problems) {
            warn!("rejected: {p}");
        }
    }
    pods.checkpoint.recovered();
    // The checkpoint as the recovery left it (the periodic writer retries if this fails).
    if let Err(e) = super::durable::persist(pods, Instant::now() + checkpoint::WRITE_TIMEOUT).await {
        warn!(error = %e, "could not write the checkpoint after the recovery; will retry");
    }
    Ok(())
}

/// One record's identity among the candidates (a pod has at most two records, of different
/// containers when they are compared).
fn identity(r: &PodRecord) -> String {
    format!("{}/{}/{}", r.namespace, r.name, r.container_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::record::CniRecord;

    fn record(name: &str, container: u8, ip: &str) -> PodRecord {
        PodRecord {
            version: 1,
            container_id: format!("{container:02x}").repeat(32),
            namespace: "team-a".into(),
            name: name.into(),
            host_veth: format!("veth{container:02x}{name}"),
            ip: ip.parse().unwrap(),
            ip6: None,
            mac: netif::MacAddr([0x0a, 0x58, 0x0a, 0x80, 0x00, 0x05]),
            annotations: Default::default(),
            internal: false,
            cni: Some(CniRecord {
                netns: format!("/var/run/netns/{name}-{container}"),
                if_name: "eth0".into(),
                address: format!("{ip}/23").parse().unwrap(),
                gateway: [10, 128, 0, 1].into(),
                ipv6: None,
                mtu: 1450,
                sandbox: None,
                host_ifindex: None,
            }),
        }
    }

    fn with_pod(r: PodRecord) -> (Pod, PodRecord) {
        (r.to_pod().unwrap(), r)
    }

    fn all_live(_: &PodRecord) -> Liveness {
        Liveness::Live
    }

    #[test]
    fn the_union_of_both_sources_is_recovered() {
        let a = record("a", 1, "10.128.0.5");
        let b = record("b", 2, "10.128.0.6");
        let claims = merge(vec![with_pod(a.clone())], std::slice::from_ref(&b));
        assert_eq!(claims.len(), 2);
        let kept: Vec<_> = claims.values().map(|c| decide(c, all_live).keep).collect();
        assert_eq!(kept, vec![Some((Origin::Ovsdb, a)), Some((Origin::Checkpoint, b))]);
    }

    #[test]
    fn ovsdb_wins_when_both_have_the_pod() {
        let o = record("a", 1, "10.128.0.5");
        let mut c = o.clone();
        c.annotations.insert("x".into(), "y".into());
        let claims = merge(vec![with_pod(o.clone())], &[c]);
        let d = decide(&claims.values().next().unwrap().clone(), all_live);
        assert_eq!(d, Decision { keep: Some((Origin::Ovsdb, o)), tear_down: vec![] });
    }

    #[test]
    fn different_containers_the_kernel_decides_then_ovsdb() {
        let o = record("a", 1, "10.128.0.5");
        let c = record("a", 2, "10.128.0.7");
        let claims = merge(vec![with_pod(o.clone())], std::slice::from_ref(&c));
        let claim = claims.values().next().unwrap().clone();
        // Both live: OVSDB's, and the checkpoint's is torn down (its interface deleted).
        let d = decide(&claim, all_live);
        assert_eq!(d.keep, Some((Origin::Ovsdb, o.clone())));
        assert_eq!(d.tear_down.len(), 1);
        assert_eq!(d.tear_down[0].0, c);
        // Only the checkpoint's sandbox is live: it is kept.
        let only_c = |r: &PodRecord| {
            if r.container_id == c.container_id {
                Liveness::Live
            } else {
                Liveness::Gone("gone".into())
            }
        };
        let d = decide(&claim, only_c);
        assert_eq!(d.keep, Some((Origin::Checkpoint, c.clone())));
        assert_eq!(d.tear_down, vec![(o.clone(), "gone".to_string())]);
        // Neither: both torn down.
        let d = decide(&claim, |_| Liveness::Gone("gone".into()));
        assert_eq!(d.keep, None);
        assert_eq!(d.tear_down.len(), 2);
    }

    #[test]
    fn a_pod_whose_sandbox_is_gone_is_torn_down() {
        let a = record("a", 1, "10.128.0.5");
        let claims = merge(vec![], std::slice::from_ref(&a));
        let d = decide(claims.values().next().unwrap(), |_| Liveness::Gone("its sandbox is gone".into()));
        assert_eq!(d, Decision { keep: None, tear_down: vec![(a, "its sandbox is gone".into())] });
    }
}
