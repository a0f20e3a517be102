//! The host executor: the node's own networking (SetupSDN's host part — tun0's address and
//! MTU, the cluster and service routes, forwarding sysctls, the nftables table) converged on
//! its own task, apart from OVSDB and the flows.
//!
//! Why a task of its own: a host detail (tun0 late, a sysctl that cannot be written, nftables
//! refusing a batch) must never keep pods' ports or flows off the switch, and what someone else
//! changes on the host (a route deleted, the gateway address removed, our table flushed) must
//! be put back without waiting for the model to change. So the executor applies its plan
//! whenever the plan changes, re-verifies it on every repair tick (each step reads the kernel
//! and writes only what differs; the nftables table is replaced in one atomic batch), and
//! retries a failure with capped backoff. Its health is reported as executor `host`.

use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::cluster::ClusterState;
use crate::metrics::{retry_delay, Executor};
use crate::domain::Plugin;


/// What the host must look like, from the model alone (pure).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPlan {
    pub host: hostnet::HostConfig,
    pub firewall: hostnet::FirewallConfig,
}

/// The plan for `st`: `None` until the state names this node's subnet.
pub fn plan(st: &ClusterState) -> Option<HostPlan> {
    st.local_subnet()?;
    // Each family exactly when the pipeline has it (IPv4, IPv6, or both on a dual-stack node).
    let (v4, v6) = (st.node_ipv4(), st.node_ipv6());
    if v4.is_none() && v6.is_none() {
        return None;
    }
    let host = hostnet::HostConfig {
        tun: "tun0".into(),
        mtu: st.mtu,
        ipv4: v4.map(|n| hostnet::HostIpv4 { node_subnet: n.local_subnet, cluster_network: n.cluster_network, service_network: n.service_network }),
        ipv6: v6.map(|n| hostnet::HostIpv6 { node_subnet: n.local_subnet, cluster_network: n.cluster_network, service_network: n.service_network }),
    };
    let fw6 = v6.map(|n| hostnet::FirewallIpv6 { cluster_network: n.cluster_network, service_network: n.service_network });
    let mut firewall = match (v4, fw6) {
        (Some(n), fw6) => hostnet::FirewallConfig { ipv6: fw6, ..hostnet::FirewallConfig::new(n.cluster_network, n.service_network) },
        (None, Some(fw6)) => hostnet::FirewallConfig::ipv6_only(fw6),
        (None, None) => return None,
    };
    firewall.vxlan_port = st.vxlan_port;
    // networkpolicy keeps pod addresses inside the cluster network (Service traffic included)
    // so that policies can judge them; see src/pipeline/via_host.rs.
    firewall.masquerade_within_cluster = st.plugin != Plugin::NetworkPolicy;
    Some(HostPlan { host, firewall })
}

/// Applies `plan` in the agent's namespace: every step checks the kernel first.
pub async fn apply(plan: &HostPlan) -> Result<hostnet::HostChanges, String> {
    let ns = hostnet::Netns::current().map_err(|e| e.to_string())?;
    let changes = hostnet::setup_host(&ns, &plan.host).await.map_err(|e| e.to_string())?;
    hostnet::install_firewall(&ns, &plan.firewall).await.map_err(|e| e.to_string())?;
    Ok(changes)
}

/// How the executor paces itself.
#[derive(Clone, Copy, Debug)]
pub struct Pacing {
    /// How often a converged host is verified again.
    pub verify_every: Duration,
    /// The first retry's delay after a failure (doubled per failure).
    pub retry_base: Duration,
    /// The longest delay between retries.
    pub retry_cap: Duration,
    /// The deadline of one apply.
    pub deadline: Duration,
}

/// Runs the host executor until `cancel`: applies the latest plan from `plans` when it changes,
/// when `kick` fires (tun0 was just recreated), on every `verify_every` and, after a failure,
/// with capped backoff.
pub async fn run(telemetry: crate::metrics::Telemetry, kick: crate::node::Kick, mut plans: watch::Receiver<Option<HostPlan>>, pacing: Pacing, cancel: CancellationToken) {
    let mut failures = 0u32;
    let mut applied: Option<HostPlan> = None;
    loop {
        let wait = if failures > 0 { retry_delay(failures, pacing.retry_base, pacing.retry_cap) } else { pacing.verify_every };
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = plans.changed() => if r.is_err() { return },
            _ = kick.kicked() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        let Some(plan) = plans.borrow_and_update().clone() else { continue };
        let r = match tokio::time::timeout(pacing.deadline, apply(&plan)).await {
            Ok(r) => r,
            Err(_) => Err(format!("host network: no answer from the kernel within {:?}", pacing.deadline)),
        };
        match &r {
            Ok(changes) => {
                failures = 0;
                if applied.as_ref() != Some(&plan) {
                    let subnets: Vec<String> = plan
                        .host
                        .ipv4
                        .iter()
                        .map(|v4| v4.node_subnet.to_string())
                        .chain(plan.host.ipv6.iter().map(|v6| v6.node_subnet.to_string()))
                        .collect();
                    info!(subnets = %subnets.join(", "), mtu = plan.host.mtu, ?changes, "host network configured (tun0, routes, sysctls, nftables)");
                    applied = Some(plan);
                } else if *changes != hostnet::HostChanges::default() {
                    telemetry.metrics.repaired("host");
                    info!(?changes, "host network repaired (someone changed tun0's addresses or legacy links)");
                }
            }
            Err(_) => failures = failures.saturating_add(1),
        }
        telemetry.executor_result(Executor::Host, &r.map(|_| ()).map_err(|e| format!("host network: {e}")));
    }
}
