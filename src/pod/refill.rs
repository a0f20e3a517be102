//! Keeps the warm-port pool ([`super::spares`]) filled: in the background, a short quiet moment
//! after the last ADD took from it, all missing spares in one OVSDB transaction.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::spares::{Spare, BACKOFF, QUIET};
use super::Pods;
use crate::node::ports::SPARE_KEY;
use crate::ovsdb::PortSpec;

/// Keeps the pool filled for as long as `cancel` is not cancelled.
pub async fn keep_filled(pods: Arc<Pods>, cancel: CancellationToken) {
    let spares = &pods.spares;
    if spares.want == 0 {
        return;
    }
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = spares.wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        // Let a burst of takes finish first.
        loop {
            let since = spares.lock().last_take.map(|t| t.elapsed());
            match since {
                Some(s) if s < QUIET => tokio::time::sleep(QUIET - s).await,
                _ => break,
            }
        }
        if let Err(e) = refill(&pods).await {
            warn!(error = %e, "could not refill the warm ports; retrying later");
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(BACKOFF) => {}
            }
        }
    }
}

/// Makes the missing spares: the veths one by one (a few hundred microseconds each), then all
/// their ports in one OVSDB transaction (group-committed), then their ofports.
async fn refill(pods: &Pods) -> Result<(), String> {
    let spares = &pods.spares;
    let need = spares.want.saturating_sub(spares.ready());
    if need == 0 {
        return Ok(());
    }
    // Only once pods can be served: the reconcile loop has taken stock of the bridge's ports.
    let (Some(ovs), Some(_)) = (pods.conns.ovs(), pods.conns.engine_ready()) else { return Ok(()) };
    let Some(mtu) = pods.state.lock().effective().map(|s| s.mtu) else { return Ok(()) };
    let held = spares.lock().hold.clone();
    let hold = match held {
        Some(h) => h,
        None => {
            let h = tokio::task::spawn_blocking(|| hostnet::Netns::create_anonymous("warm ports"))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            spares.lock().hold = Some(h.clone());
            h
        }
    };
    let host = hostnet::Netns::current().map_err(|e| e.to_string())?;
    let mut made = Vec::with_capacity(need);
    let mut failure = None;
    for _ in 0..need {
        let name = hostnet::pod::random_veth_name().map_err(|e| e.to_string())?;
        spares.lock().owned.insert(name.clone());
        match hostnet::create_spare(&host, &hold, &name, mtu).await {
            Ok(()) => {
                // As for every pod's host end: a switch port never answers ARP itself.
                if let Err(e) = hostnet::sysctl::write(&["net", "ipv4", "conf", &name, "arp_ignore"], "8") {
                    warn!(veth = %name, error = %e, "could not set arp_ignore on a spare veth");
                }
                made.push(name);
            }
            Err(e) => {
                spares.release(&name);
                failure = Some(format!("spare veth {name}: {e}"));
                break;
            }
        }
    }
    let mut spec = PortSpec::system();
    spec.external_ids.insert(SPARE_KEY.into(), "true".into());
    let (bridge, timeout) = (pods.cfg.bridge.name(), pods.cfg.bridge.port_timeout);
    let t = Instant::now();
    let added = futures::future::join_all(made.iter().map(|name| {
        let (ovs, spec) = (&ovs, &spec);
        async move {
            let _g = pods.locks.lock(name).await;
            (name, ovs.add_port_fast(bridge, name, spec, timeout).await)
        }
    }))
    .await;
    if !made.is_empty() {
        spares.port_added(t.elapsed());
    }
    let mut ready = Vec::new();
    for (name, r) in added {
        match r {
            Ok((ofport, _)) => ready.push(Spare { name: name.clone(), ofport }),
            Err(e) => {
                failure.get_or_insert(format!("port of spare {name}: {e}"));
                let _ = crate::node::ports::remove_port(&ovs, bridge, name).await;
                let _ = hostnet::teardown_pod(&host, name).await;
                spares.release(name);
            }
        }
    }
    if !ready.is_empty() {
        debug!(spares = ready.len(), "warm ports ready");
        let mut g = spares.lock();
        g.free.extend(ready);
    }
    match failure {
        Some(f) => Err(f),
        None => Ok(()),
    }
}
