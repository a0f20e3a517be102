//! `sdn-node apply`: converge a switch to a state file, once — the reconciler of `sdn-node run`
//! ([`crate::reconcile`]) run a single time, then verified with a fresh dump.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use openflow::FlowStatsRequest;
use tracing::warn;

use crate::cluster::{state_file, ClusterState, Problem};
use crate::metrics::Telemetry;
use crate::options::Bridge;
use crate::ovsdb::{Ovs, OvsdbClient};
use crate::reconcile::dns::Dns;
use crate::node::Config;
use crate::reconcile::{ConvergeError, Reconciler};

use crate::run::source::Loaded;
use crate::store::{diff, InstalledState};
use crate::switch::{Switch, SwitchOptions};

pub use crate::node::ports::GENERATION_KEY;

/// `sdn-node apply`'s options.
#[derive(clap::Args, Clone, Debug)]
pub struct ApplyOptions {
    /// The cluster state (YAML), e.g. deploy/examples/cluster.yaml.
    #[arg(long)]
    pub state: PathBuf,
    #[command(flatten)]
    pub bridge: Bridge,
    /// How long to wait for a DNS answer for an egress policy's dnsName.
    #[arg(skip = crate::reconcile::dns::DEFAULT_TIMEOUT)]
    pub dns_timeout: Duration,
}

impl ApplyOptions {
    /// The command line's defaults, for `state` on the Open vSwitch found in `ovs_rundir`.
    pub fn new(state: PathBuf, ovs_rundir: PathBuf) -> ApplyOptions {
        ApplyOptions { state, bridge: Bridge::new(ovs_rundir), dns_timeout: crate::reconcile::dns::DEFAULT_TIMEOUT }
    }
}

/// What an apply did.
#[derive(Debug, Default)]
pub struct ApplyReport {
    /// Objects (or parts) that were rejected; everything else was applied.
    pub problems: Vec<Problem>,
    /// Operational conditions (e.g. an unresolvable egress dnsName: that VNID drops all egress).
    pub warnings: Vec<Problem>,
    pub adds: usize,
    pub modifies: usize,
    pub deletes: usize,
    /// Flows the switch holds now.
    pub flows: usize,
    pub ports_added: usize,
    pub ports_removed: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("state: {0}")]
    State(#[from] crate::cluster::Fatal),
    #[error("OVSDB: {0}")]
    Ovsdb(#[from] crate::ovsdb::OvsdbError),
    #[error("OpenFlow: {0}")]
    Switch(#[from] crate::switch::SwitchError),
    #[error("{0}")]
    Converge(#[from] ConvergeError),
    #[error("after the commit the switch still differs from the desired state ({0}); this is a bug")]
    NotConverged(String),
}

/// Applies the state file once.
pub async fn apply(opts: &ApplyOptions) -> Result<ApplyReport, ApplyError> {
    let (state, mut problems) = state_file::load(&opts.state)?;
    for p in &problems {
        warn!("rejected: {p}");
    }
    let mut report = converge(opts, &state).await?;
    problems.append(&mut report.problems);
    report.problems = problems;
    Ok(report)
}

/// Converges bridge, ports and flows to an already validated state: the reconciler of
/// `sdn-node run`, run once (DNS answers resolved first, since nothing waits for them later),
/// then checked against a fresh dump.
pub async fn converge(opts: &ApplyOptions, state: &ClusterState) -> Result<ApplyReport, ApplyError> {
    // `apply` programs the switch only: the node's own networking belongs to `run`.
    let cfg = Config { bridge: opts.bridge.clone(), host_network: false, ..Config::default() };
    let mut rec = Reconciler::standalone(cfg, Telemetry::default());
    let model = rec.state().clone();
    model.lock().set_source(Arc::new(Loaded { state: state.clone(), problems: vec![], live_pods: None, touched: None, seq: 0, pod_annotations: Default::default(), policies_seen: Default::default() }));
    let names = model.lock().dns_names();
    let answers = Dns::new(opts.dns_timeout).answers(&names).await;
    model.lock().set_dns(answers);

    rec.ovsdb_changed(Some(Ovs::new(OvsdbClient::connect(&opts.bridge.ovs.db_socket()).await?)));
    // Ports first: ensuring tun0 also waits for ovs-vswitchd to have set the bridge up, with
    // its management socket (connecting before that fails on a bridge created just now).
    let ports = rec.prepare().await?;
    let sw = connect_switch(&opts.bridge.ovs.mgmt_socket(), opts.bridge.port_timeout).await?;
    rec.switch_connected(sw.clone()).await;
    let pass = rec.converge().await?;
    let mut report = ApplyReport {
        adds: pass.outcome.adds,
        modifies: pass.outcome.modifies,
        deletes: pass.outcome.deletes,
        ports_added: ports.ports_added + pass.ports_added,
        ports_removed: ports.ports_removed + pass.ports_removed,
        warnings: pass.warnings,
        ..Default::default()
    };
    report.problems.extend(ports.problems);
    report.problems.extend(pass.problems);
    for p in std::mem::take(&mut model.lock().rebuild_problems) {
        report.problems.push(p);
    }
    let engine = rec.conns().engine().ok_or(ApplyError::NotConverged("the flow engine did not start".into()))?;
    let (desired, _, _) = engine.snapshot().await.map_err(|e| ApplyError::NotConverged(e.to_string()))?;
    let after = InstalledState::from_dump(sw.dump_flows(FlowStatsRequest::default()).await?);
    let left = diff(&desired, &after, rec.generation());
    if !left.is_empty() {
        let first = left.changes.first().and_then(|c| c.to_flow_mod().ok()).map(|f| format!("{} {f}", f.command.name())).unwrap_or_default();
        return Err(ApplyError::NotConverged(format!("{left}; first: {first}")));
    }
    report.flows = after.len();
    Ok(report)
}

/// Connects to the bridge's management socket, which ovs-vswitchd creates when it sets the
/// bridge up: a bridge created (or a port moved onto it) just now may not have it yet, even
/// once its ports have their ofports (a port that kept its `ofport_request` answers at once).
/// Retried while the socket is missing, within `within`; any other failure is returned.
async fn connect_switch(target: &str, within: std::time::Duration) -> Result<Switch, crate::switch::SwitchError> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match Switch::connect(target, SwitchOptions::default()).await {
            Err(crate::switch::SwitchError::Connect { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    /// An agent reconverges from a spawned task: `converge`'s future must be `Send`.
    #[test]
    fn converge_future_is_send() {
        let (state, _) = state_file::parse(include_str!("../deploy/examples/cluster.yaml")).unwrap();
        let opts = ApplyOptions::new(PathBuf::from("cluster.yaml"), PathBuf::from("/nonexistent"));
        let f = converge(&opts, &state);
        assert_send(&f);
        let f = apply(&opts);
        assert_send(&f);
    }

    // `converges_a_fresh_bridge_without_pods`, which needs a sandbox (sdn-harness, a crate
    // built on this library), is in tests/apply.rs.
}

