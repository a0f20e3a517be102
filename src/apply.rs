//! `sdn-node apply`: converge a switch to a state file, once.
//!
//! source (state file) -> validated cluster state -> ports via OVSDB -> desired flows -> diff
//! against a fresh dump -> one atomic bundle -> verify with another dump.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use openflow::{FlowStatsRequest, FragMode};
use tracing::{info, warn};

use crate::cluster::desired::desired_state_with_warnings;
use crate::cluster::{state_file, ClusterState, PodKey, Problem};
use crate::model::OfPort;
use crate::ovsdb::{BridgeOptions, Ovs, OvsdbClient, PortSpec};
use crate::store::{diff, InstalledState, Plan};
use crate::switch::{Switch, SwitchOptions};

/// Bridge `external_ids` key holding the flow generation written into cookies.
pub const GENERATION_KEY: &str = "sdn-node-generation";

#[derive(Clone, Debug)]
pub struct ApplyOptions {
    pub state: PathBuf,
    /// Where ovsdb-server's `db.sock` and the bridge's `<bridge>.mgmt` live.
    pub ovs_rundir: PathBuf,
    pub bridge: String,
    /// `system` (kernel, the default), `netdev` (userspace) or `dummy` (tests).
    pub datapath_type: String,
    /// How long to wait for a pod's port to get an ofport.
    pub port_timeout: Duration,
    /// How long to wait for a DNS answer for an egress policy's dnsName.
    pub dns_timeout: Duration,
}

impl ApplyOptions {
    pub fn new(state: PathBuf, ovs_rundir: PathBuf) -> ApplyOptions {
        ApplyOptions {
            state,
            ovs_rundir,
            bridge: "br0".into(),
            datapath_type: "system".into(),
            port_timeout: Duration::from_secs(10),
            dns_timeout: Duration::from_secs(5),
        }
    }

    pub fn db_socket(&self) -> String {
        format!("unix:{}", self.ovs_rundir.join("db.sock").display())
    }

    pub fn mgmt_socket(&self) -> String {
        format!("unix:{}", self.ovs_rundir.join(format!("{}.mgmt", self.bridge)).display())
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

/// Converges bridge, ports and flows to an already validated state.
pub async fn converge(opts: &ApplyOptions, state: &ClusterState) -> Result<ApplyReport, ApplyError> {
    let mut report = ApplyReport::default();
    let ovs = Ovs::new(OvsdbClient::connect(&opts.db_socket()).await?);
    ovs.init().await?;
    let bridge_opts = BridgeOptions { datapath_type: opts.datapath_type.clone(), ..Default::default() };
    ovs.ensure_bridge(&opts.bridge, &bridge_opts).await?;
    ovs.ensure_port(&opts.bridge, "vxlan0", &PortSpec::vxlan_flow(OfPort::VXLAN.0 as i64)).await?;
    // Waiting for tun0's ofport also waits for ovs-vswitchd to have set the bridge up, with its
    // management socket: connecting before that fails on a bridge created just now.
    ovs.add_port_and_wait_ofport(&opts.bridge, "tun0", &PortSpec::internal(Some(OfPort::TUN.0 as i64)), opts.port_timeout)
        .await?;

    let ofports = pod_ports(opts, &ovs, state, &mut report).await?;
    let dns = crate::run::dns::Dns::new(opts.dns_timeout)
        .answers(&crate::pipeline::egress::dns_names(&state.egress_policies))
        .await;
    let (desired, more, warnings) = desired_state_with_warnings(state, &ofports, &dns);
    for p in &more {
        warn!("rejected: {p}");
    }
    for w in &warnings {
        warn!("{w}");
    }
    report.problems.extend(more);
    report.warnings = warnings;

    let sw = Switch::connect(&opts.mgmt_socket(), SwitchOptions::default()).await?;
    sw.set_frag_mode(FragMode::NxMatch).await?;
    let generation = generation(&ovs, &opts.bridge).await?;
    let dump = sw.dump_flows(FlowStatsRequest::default()).await?;
    if crate::pipeline::base::already_set_up(&dump, state.plugin) {
        info!("switch already set up for this plugin and pipeline version; converging by difference");
    } else {
        info!(flows = dump.len(), "switch not set up for this plugin and pipeline version; installing the pipeline");
    }
    let installed = InstalledState::from_dump(dump);
    let plan = diff(&desired, &installed, generation);
    report.adds = plan.adds;
    report.modifies = plan.modifies;
    report.deletes = plan.deletes;
    if plan.is_empty() {
        info!(flows = installed.len(), "switch already holds the desired flows; nothing sent");
    } else {
        info!(%plan, "committing one atomic bundle");
        commit(&sw, &plan).await?;
    }
    let after = InstalledState::from_dump(sw.dump_flows(FlowStatsRequest::default()).await?);
    let left = diff(&desired, &after, generation);
    if !left.is_empty() {
        let first = left.changes.first().and_then(|c| c.to_flow_mod().ok()).map(|f| format!("{} {f}", f.command.name())).unwrap_or_default();
        return Err(ApplyError::NotConverged(format!("{left}; first: {first}")));
    }
    report.flows = after.len();
    Ok(report)
}

async fn commit(sw: &Switch, plan: &Plan) -> Result<(), ApplyError> {
    let mut b = sw.bundle();
    for body in plan.bodies() {
        b.add_body(body);
    }
    b.commit().await?;
    Ok(())
}

/// The generation stored on the bridge (created as 1 on first use).
async fn generation(ovs: &Ovs, bridge: &str) -> Result<u32, ApplyError> {
    let ids = ovs.bridge_external_ids(bridge).await?;
    if let Some(g) = ids.get(GENERATION_KEY).and_then(|v| v.parse::<u32>().ok()).filter(|g| *g <= 0xff_ffff) {
        return Ok(g);
    }
    ovs.set_bridge_external_id(bridge, GENERATION_KEY, "1").await?;
    Ok(1)
}

/// Adds every pod's port (waiting for its ofport, a few at a time), sets its bandwidth, and
/// removes ports of pods that are gone. A pod whose port fails is reported and gets no flows.
async fn pod_ports(
    opts: &ApplyOptions,
    ovs: &Ovs,
    state: &ClusterState,
    report: &mut ApplyReport,
) -> Result<HashMap<PodKey, OfPort>, ApplyError> {
    let existing = ovs.list_ports(&opts.bridge).await?;
    // The futures are built before they enter the stream: a `.map(|p| async move ..)` closure
    // inside the stream makes the whole `converge` future not `Send` (rustc cannot prove the
    // closure general over the borrow's lifetime), so it could not be `tokio::spawn`ed.
    let lookups: Vec<_> = state
        .pods
        .iter()
        .map(|p| async move {
            let spec = if p.internal { PortSpec::internal(None) } else { PortSpec::system() };
            let r = async {
                let ofport = ovs.add_port_and_wait_ofport(&opts.bridge, &p.host_veth, &spec, opts.port_timeout).await?;
                ovs.set_pod_bandwidth(&p.host_veth, p.ingress_bps, p.egress_bps).await?;
                Ok::<_, crate::ovsdb::OvsdbError>(ofport)
            }
            .await;
            (p, r)
        })
        .collect();
    let results: Vec<_> = futures::stream::iter(lookups).buffer_unordered(16).collect().await;
    let mut ofports = HashMap::new();
    for (p, r) in results {
        match r {
            Ok(port) => {
                if !existing.contains(&p.host_veth) {
                    report.ports_added += 1;
                }
                ofports.insert(p.key(), OfPort(port));
            }
            Err(e) => {
                let pr = Problem::new(format!("pod {}/{}", p.namespace, p.name), "hostVeth", format!("{:?}: {e}", p.host_veth));
                warn!("rejected: {pr}");
                report.problems.push(pr);
            }
        }
    }
    let keep: std::collections::HashSet<&str> = state
        .pods
        .iter()
        .map(|p| p.host_veth.as_str())
        .chain([opts.bridge.as_str(), "vxlan0", "tun0"])
        .collect();
    for port in existing.iter().filter(|p| !keep.contains(p.as_str())) {
        // TearDownPod: clear its QoS, then remove the port.
        ovs.set_pod_bandwidth(port, -1, -1).await?;
        ovs.delete_port(&opts.bridge, port).await?;
        report.ports_removed += 1;
    }
    Ok(ofports)
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

    /// Regression: on a bridge converge has just created, the agent must not connect to
    /// `<bridge>.mgmt` before ovs-vswitchd has created it. With pods, waiting for their ofports
    /// hid the race; without any, the connect failed with ENOENT now and then.
    #[tokio::test]
    async fn converges_a_fresh_bridge_without_pods() {
        for _ in 0..3 {
            let sb = crate::sandbox::OvsSandbox::start(Default::default()).await.unwrap();
            let (mut state, _) = state_file::parse(include_str!("../deploy/examples/cluster.yaml")).unwrap();
            state.pods.clear();
            state.egress_policies.clear();
            let mut opts = ApplyOptions::new(PathBuf::from("cluster.yaml"), sb.dir().to_path_buf());
            opts.datapath_type = "dummy".into();
            let r = tokio::time::timeout(Duration::from_secs(60), converge(&opts, &state)).await.expect("in time");
            assert!(r.is_ok(), "{r:?}");
        }
    }
}
