//! `sdn-node controller`: the master openshift-sdn had, for clusters that do not run it. It
//! creates what the agents read: ClusterNetwork "default" from its configuration, a HostSubnet
//! per Node (the Node's podCIDR where the cluster allocates them, else its own allocator) and,
//! under the multitenant and networkpolicy plugins, a NetNamespace per Namespace (VNIDs as
//! openshift-sdn's master allocates them, with the multitenant join/isolate/global operations).
//!
//! Rooms: [`config`] (flags and file, checked before anything), [`lease`] (leader election),
//! [`subnets`] and [`vnids`] (pure allocators), [`objects`] (what is kept of Nodes and
//! Namespaces, and the objects written), [`reconcile`] (the one loop that decides and writes),
//! [`writer`] (rate limit, leadership check and deadline of every write), [`status`] (probes).
//!
//! HostSubnet carries one IPv4 `subnet`. Dual-stack (`--cluster-network-ipv6`,
//! `--host-subnet-length-ipv6`, `--service-network-ipv6`): a Node's IPv6 subnet travels beside
//! it as the HostSubnet's annotation `sdn-node.openshift.io/subnet-ipv6`, which openshift-sdn's
//! agents ignore — the Node's IPv6 podCIDR where the cluster allocates them, else a second
//! [`subnets::Subnets`] over the IPv6 cluster network — and the IPv6 networks as annotations
//! of ClusterNetwork "default" (`sdn-node.openshift.io/cluster-network-ipv6`,
//! `.../host-subnet-length-ipv6`, `.../service-network-ipv6`): openshift-sdn's agents refuse a
//! ClusterNetwork with an IPv6 `clusterNetworks` entry ([`crate::kube::types`]). An existing
//! IPv4 ClusterNetwork gains those annotations when the controller is restarted dual-stack
//! (the one change it makes to one: [`objects::ClusterNetworkChange`]), and the HostSubnets it
//! manages gain their IPv6 subnets.
//!
//! IPv6-only (an IPv6 `--cluster-network` and `--service-network`): the IPv6 networks are in
//! ClusterNetwork's own fields and each HostSubnet's `subnet` is the node's IPv6 subnet, with
//! no annotation; the one allocator cuts the IPv6 cluster network (`--host-subnet-length`
//! default 64).

pub mod config;
pub mod lease;
pub mod objects;
pub mod reconcile;
pub mod status;
pub mod subnets;
pub mod vnids;
pub mod writer;

use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use tracing::{error, info};

pub use config::ControllerArgs;

/// One RBAC rule: (API group, resource, verbs).
pub type Rule = (&'static str, &'static str, &'static [&'static str]);

/// What the controller may do cluster-wide: read Nodes and Namespaces, write only what it owns,
/// and publish Events. deploy/kubernetes/07-controller.yaml's ClusterRole must equal this
/// (tests/deploy.rs).
pub const CLUSTER_RULES: &[Rule] = &[
    ("", "nodes", &["get", "list", "watch"]),
    ("", "namespaces", &["get", "list", "watch"]),
    // update: only to add the IPv6 networks to an IPv4 one (IPv4 → dual-stack).
    ("network.openshift.io", "clusternetworks", &["get", "list", "watch", "create", "update"]),
    ("network.openshift.io", "hostsubnets", &["get", "list", "watch", "create", "update", "delete"]),
    ("network.openshift.io", "netnamespaces", &["get", "list", "watch", "create", "update", "delete"]),
    ("events.k8s.io", "events", &["create", "patch"]),
    ("", "events", &["create", "patch"]),
];

/// What it may do in its own namespace only: the leader-election Lease.
pub const NAMESPACE_RULES: &[Rule] = &[("coordination.k8s.io", "leases", &["get", "create", "update"])];

/// Runs the controller until SIGTERM/SIGINT (`terminated`); the configuration was checked.
pub async fn run(args: ControllerArgs, terminated: impl std::future::Future<Output = ()> + Send + 'static) -> ExitCode {
    let cfg = match args.check() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sdn-node controller: {e}");
            return ExitCode::from(1);
        }
    };
    let client = match client(&cfg).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sdn-node controller: {e}");
            return ExitCode::from(1);
        }
    };
    let status = Arc::new(Mutex::new(status::Status { identity: cfg.identity.clone(), ..Default::default() }));
    if let Some(addr) = cfg.health_addr {
        if let Err(e) = status::serve(addr, status.clone()).await {
            eprintln!("sdn-node controller: {e}");
            return ExitCode::from(1);
        }
    }
    info!(
        identity = %cfg.identity,
        lease = %format!("{}/{}", cfg.namespace, cfg.lease_name),
        cluster_network = %cfg.network.cluster_network,
        host_subnet_length = cfg.network.host_subnet_length,
        cluster_network_ipv6 = %cfg.network.ipv6.as_ref().map(|s| s.cluster_network.to_string()).unwrap_or_default(),
        plugin = objects::plugin_name(cfg.network.plugin),
        node_subnets = ?cfg.node_subnets,
        "sdn-node controller starting"
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let election = lease::Election {
        namespace: cfg.namespace.clone(),
        name: cfg.lease_name.clone(),
        identity: cfg.identity.clone(),
        lease_duration: cfg.lease_duration,
        renew_deadline: cfg.renew_deadline,
        retry_period: cfg.retry_period,
        api_timeout: cfg.api_timeout,
    };
    let (leader, elector) = lease::spawn(client.clone(), election, async move {
        let _ = stop_rx.await;
    });
    let writer = writer::Writer::new(cfg.qps, cfg.burst, leader.clone(), cfg.api_timeout);
    let recorder = kube::runtime::events::Recorder::new(
        client.clone(),
        kube::runtime::events::Reporter {
            controller: "sdn-node-controller".into(),
            instance: Some(cfg.identity.clone()),
        },
    );
    let mut main = tokio::spawn(reconcile::run(cfg, client, leader, writer, status, recorder));
    tokio::select! {
        _ = terminated => {
            info!("terminating: releasing the Lease");
            let _ = stop_tx.send(());
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), elector).await;
            main.abort();
            ExitCode::SUCCESS
        }
        r = &mut main => {
            error!(result = ?r.err(), "the controller loop ended");
            ExitCode::from(1)
        }
    }
}

async fn client(cfg: &config::Config) -> Result<kube::Client, String> {
    crate::kube::watch::client_for(cfg.kubeconfig.as_deref()).await.map_err(|e| match cfg.kubeconfig {
        Some(_) => format!("--kubeconfig {e}"),
        None => format!("--in-cluster: {e}"),
    })
}
