//! The `sdn-node` command.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use openflow::FlowStatsRequest;
use sdn_node::apply::{apply, ApplyOptions};
use sdn_node::run::process::{self, LogFormat};
use sdn_node::store::Owner;
use sdn_node::switch::{Switch, SwitchOptions};

#[derive(Parser)]
#[command(name = "sdn-node", version, about = "Programs Open vSwitch for a Kubernetes pod network (openshift-sdn's pipeline) over OpenFlow 1.3 and OVSDB")]
struct Cli {
    /// Log format: human or json (structured).
    #[arg(long, global = true, default_value = "human")]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args)]
struct Ovs {
    /// Directory with ovsdb-server's db.sock and the bridge's <bridge>.mgmt socket.
    #[arg(long, default_value = "/var/run/openvswitch", env = "OVS_RUNDIR")]
    ovs_rundir: PathBuf,
    /// The integration bridge.
    #[arg(long, default_value = "br0")]
    bridge: String,
}

/// The bridge the agent programs, and how (shared by `apply` and `run`).
#[derive(clap::Args)]
struct BridgeArgs {
    #[command(flatten)]
    ovs: Ovs,
    /// Datapath of the bridge: system (kernel), netdev (userspace) or dummy (tests).
    #[arg(long, default_value = "system")]
    datapath_type: String,
    /// Seconds to wait for a pod's port to get an ofport.
    #[arg(long, default_value_t = 10)]
    port_timeout: u64,
}

/// `sdn-node run`'s options.
#[derive(clap::Args)]
struct RunArgs {
    /// The cluster state (YAML), watched for changes.
    #[arg(long, required_unless_present_any = ["kubeconfig", "in_cluster"], conflicts_with_all = ["kubeconfig", "in_cluster"])]
    state: Option<PathBuf>,
    /// Follow the Kubernetes API (openshift-sdn's objects) through this kubeconfig instead
    /// of a state file.
    #[arg(long, conflicts_with = "in_cluster", requires = "node")]
    kubeconfig: Option<PathBuf>,
    /// Follow the Kubernetes API with the in-cluster service account.
    #[arg(long, requires = "node")]
    in_cluster: bool,
    /// This node's name (Kubernetes mode).
    #[arg(long, env = "NODE_NAME")]
    node: Option<String>,
    #[command(flatten)]
    bridge: BridgeArgs,
    /// Seconds of silence from the switch before an echo request.
    #[arg(long, default_value_t = 5.0)]
    echo_interval: f64,
    /// Seconds an echo may take before the switch is declared dead.
    #[arg(long, default_value_t = 15.0)]
    echo_timeout: f64,
    /// Longest delay between reconnect attempts, in seconds.
    #[arg(long, default_value_t = 5.0)]
    max_backoff: f64,
    /// The pod API's unix socket (HTTP/JSON, mode 0600); `none` disables it.
    #[arg(long, default_value = sdn_node::api::DEFAULT_SOCKET)]
    pod_api_socket: String,
    /// Where /metrics, /healthz and /readyz are served; `none` disables them.
    #[arg(long, default_value = "127.0.0.1:9101")]
    metrics_addr: String,
    /// Deadline of one pod API request, in seconds (answered 504 when it passes, with
    /// nothing of the request left behind).
    #[arg(long, default_value_t = 30.0)]
    request_timeout: f64,
    /// Deadline of one OVSDB request, in seconds.
    #[arg(long, default_value_t = 10.0)]
    ovsdb_timeout: f64,
    /// OVSDB inactivity probe: an echo after this many idle seconds; a server silent for
    /// twice as long is declared dead and the connection re-established.
    #[arg(long, default_value_t = 5.0)]
    ovsdb_probe: f64,
    /// /healthz fails when one reconcile pass has taken longer than this many seconds.
    #[arg(long, default_value_t = 120.0)]
    watchdog: f64,
    /// Leave the node's own networking alone (tun0 address and routes, sysctls, the
    /// nftables NAT/filter table); the dummy datapath never touches it.
    #[arg(long)]
    no_host_network: bool,
    /// Where the CNI network configuration (80-sdn-node.conflist) is written once the agent
    /// serves pods; `none` disables it.
    #[arg(long, default_value = "/etc/cni/net.d")]
    cni_conf_dir: String,
    /// Name server (IP:PORT) for egress policies' dnsName rules, instead of the system's
    /// resolv.conf; repeatable.
    #[arg(long)]
    dns_server: Vec<std::net::SocketAddr>,
    /// Pod interfaces kept ready on the bridge, so that a CNI ADD moves one into the pod
    /// instead of waiting for ovs-vswitchd to add a port (the slow part of an ADD; see the
    /// README). Refilled in the background after ADDs; 0 disables them.
    #[arg(long, default_value_t = 0)]
    warm_ports: usize,
    /// Take a warm port whenever one is ready, even while adding a port is measured to be
    /// cheaper than moving one (for tests of the warm path on small bridges).
    #[arg(long, hide = true)]
    warm_ports_always: bool,
    /// Where the agent keeps its own durable record of the pods (pods.json), so that they
    /// outlive the loss of the Open vSwitch database; `none` disables it (OVSDB's records
    /// alone). One agent per directory. A checkpoint that cannot be read stops the agent
    /// (exit 1, the file named): see README "Pod records".
    #[arg(long, default_value = "/var/lib/sdn-node")]
    state_dir: String,
    /// The NetworkPolicy audit log: one JSON line per allowed or denied new connection of the
    /// policies annotated `sdn-node.openshift.io/audit-log` (allow, deny, all), to this file
    /// (appended) or `-` (stdout); `none`: off.
    #[arg(long, default_value = "none")]
    audit_log: String,
    /// Log every NetworkPolicy (as if annotated `all`), not only those that ask.
    #[arg(long)]
    audit_all_policies: bool,
    /// Audit events a second the switch passes to the agent (an OVS meter: a flood costs the
    /// agent no more than this).
    #[arg(long, default_value_t = 100)]
    audit_rate: u32,
    /// Audit events allowed above the rate in a burst.
    #[arg(long, default_value_t = 100)]
    audit_burst: u32,
    /// Seconds between reads of the NetworkPolicy flows' statistics for the per-policy
    /// counters (/metrics, `sdn-node status`); 0: off.
    #[arg(long, default_value_t = 10.0)]
    policy_stats_interval: f64,
}

/// `none` disables an optional path.
fn unless_none(s: String) -> Option<PathBuf> {
    (s != "none").then(|| PathBuf::from(s))
}

impl RunArgs {
    /// The agent's options, and the Kubernetes source's if it follows the API.
    fn options(self) -> Result<(sdn_node::run::RunOptions, Option<sdn_node::kube::KubeOptions>), String> {
        let RunArgs {
            state,
            kubeconfig,
            in_cluster,
            node,
            bridge,
            echo_interval,
            echo_timeout,
            max_backoff,
            pod_api_socket,
            metrics_addr,
            request_timeout,
            ovsdb_timeout,
            ovsdb_probe,
            watchdog,
            no_host_network,
            cni_conf_dir,
            dns_server,
            warm_ports,
            warm_ports_always,
            state_dir,
            audit_log,
            audit_all_policies,
            audit_rate,
            audit_burst,
            policy_stats_interval,
        } = self;
        let kube = (kubeconfig.is_some() || in_cluster).then(|| sdn_node::kube::KubeOptions { kubeconfig, node: node.unwrap_or_default() });
        let mut opts = sdn_node::run::RunOptions::new(state.unwrap_or_default(), bridge.ovs.ovs_rundir);
        opts.api_socket = unless_none(pod_api_socket);
        if metrics_addr != "none" {
            opts.metrics_addr = Some(metrics_addr.parse().map_err(|e| format!("--metrics-addr {metrics_addr:?}: {e}"))?);
        }
        opts.bridge = bridge.ovs.bridge;
        opts.datapath_type = bridge.datapath_type;
        opts.port_timeout = Duration::from_secs(bridge.port_timeout);
        opts.switch.echo_interval = Some(secs(echo_interval));
        opts.switch.echo_timeout = secs(echo_timeout);
        opts.backoff.max = secs(max_backoff);
        opts.request_timeout = secs(request_timeout);
        opts.ovsdb.request_timeout = Some(secs(ovsdb_timeout));
        opts.ovsdb.probe_interval = Some(secs(ovsdb_probe));
        opts.watchdog = secs(watchdog);
        opts.host_network = !no_host_network;
        opts.dns_servers = (!dns_server.is_empty()).then_some(dns_server);
        opts.cni_conf_dir = unless_none(cni_conf_dir);
        opts.warm_ports = warm_ports;
        opts.warm_ports_always = warm_ports_always;
        opts.state_dir = unless_none(state_dir);
        let sink = match audit_log.as_str() {
            "none" => None,
            "-" => Some(sdn_node::audit::Sink::Stdout),
            path => Some(sdn_node::audit::Sink::File(PathBuf::from(path))),
        };
        let name = opts.bridge.clone();
        opts.audit = sink.map(|s| sdn_node::audit::AuditConfig::new(audit_rate.max(1), audit_burst, s, kube.as_ref().map_or(name, |k| k.node.clone())));
        opts.audit_all_policies = audit_all_policies;
        opts.policy_stats_interval = (policy_stats_interval > 0.0).then(|| secs(policy_stats_interval));
        Ok((opts, kube))
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Converge the switch to a state file once: bridge, ports and flows. Exits 0 when the
    /// switch holds exactly the desired flows, 2 if some objects were rejected (the rest is
    /// applied), 1 on failure.
    Apply {
        /// The cluster state (YAML), e.g. deploy/examples/cluster.yaml.
        #[arg(long)]
        state: PathBuf,
        #[command(flatten)]
        bridge: BridgeArgs,
    },
    /// Keep the switch equal to a state file for as long as it runs: converges at start,
    /// re-applies when the file changes (a file that fails to parse keeps the last good
    /// state), reconnects to ovs-vswitchd and ovsdb-server when they restart and replays what
    /// they lost. Stops on SIGTERM/SIGINT, leaving flows installed.
    Run(RunArgs),
    /// Client for the pod API of a running agent.
    Pod {
        /// The pod API socket.
        #[arg(long, default_value = sdn_node::api::DEFAULT_SOCKET, global = true)]
        socket: PathBuf,
        #[command(subcommand)]
        op: PodCmd,
    },
    /// Print the flows the switch holds, as `ovs-ofctl dump-flows --no-stats` prints them.
    DumpFlows {
        #[command(flatten)]
        ovs: Ovs,
        /// Only this table.
        #[arg(long)]
        table: Option<u8>,
        /// Only the flows of one object: pod/NS/NAME, service/NS/NAME, hostsubnet/HOST,
        /// egress/VNID, multicast/VNID, vnid/VNID, multicast-vxlan, policy, base, version.
        #[arg(long)]
        owner: Option<String>,
        /// Include duration and packet/byte counters.
        #[arg(long)]
        stats: bool,
    },
    /// Follow one packet through the installed pipeline: every table hit with its flow and
    /// the object that owns it, and the verdict (delivered, tunnelled, dropped by whom).
    Trace(sdn_node::trace::TraceArgs),
    /// A running agent's status: connections, pipeline, flows per table and owner, last commit.
    Status {
        /// The agent's pod API socket.
        #[arg(long, default_value = sdn_node::api::DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum PodCmd {
    /// Set a pod up; returns once its flows are committed.
    Add {
        #[arg(long)]
        namespace: String,
        #[arg(long)]
        name: String,
        #[arg(long)]
        container_id: String,
        #[arg(long)]
        host_veth: String,
        #[arg(long)]
        ip: String,
        #[arg(long)]
        mac: String,
        /// kubernetes.io/ingress-bandwidth, e.g. 10M.
        #[arg(long)]
        ingress_bandwidth: Option<String>,
        /// kubernetes.io/egress-bandwidth, e.g. 10M.
        #[arg(long)]
        egress_bandwidth: Option<String>,
        /// Create an OVS internal port instead of attaching an existing device.
        #[arg(long)]
        internal: bool,
    },
    /// Tear a pod down.
    Del {
        #[arg(long)]
        namespace: String,
        #[arg(long)]
        name: String,
    },
    /// List the pods set up through the API.
    List,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    process::init_logging(cli.log_format);
    let rt = match process::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    rt.block_on(run(cli))
}

/// Resolves on SIGTERM or SIGINT.
async fn terminated() {
    use tokio::signal::unix::{signal, SignalKind};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

fn secs(v: f64) -> Duration {
    Duration::try_from_secs_f64(v.max(0.001)).unwrap_or(Duration::from_secs(5))
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}")) + "\n"
}

fn print_result<T>(r: Result<T, String>, show: impl FnOnce(&T) -> String) -> ExitCode {
    match r {
        Ok(v) => {
            print!("{}", show(&v));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> ExitCode {
    match cli.cmd {
        Cmd::Trace(args) => print_result(sdn_node::trace::run(&args).await, |r| if args.json { json(r) } else { r.text() }),
        Cmd::Status { socket, json: as_json } => {
            print_result(sdn_node::api::status::fetch(&socket).await, |s| if as_json { json(s) } else { s.to_string() })
        }
        Cmd::Pod { socket, op } => {
            let (method, path, body) = match op {
                PodCmd::Add { namespace, name, container_id, host_veth, ip, mac, ingress_bandwidth, egress_bandwidth, internal } => {
                    let mut annotations = std::collections::BTreeMap::new();
                    if let Some(v) = ingress_bandwidth {
                        annotations.insert(sdn_node::cluster::INGRESS_ANNOTATION.to_string(), v);
                    }
                    if let Some(v) = egress_bandwidth {
                        annotations.insert(sdn_node::cluster::EGRESS_ANNOTATION.to_string(), v);
                    }
                    let req = sdn_node::api::PodRequest { container_id, namespace, name, host_veth, ip, mac, annotations, internal, cni: None };
                    ("POST", "/v1/pods".to_string(), serde_json::to_string(&req).ok())
                }
                PodCmd::Del { namespace, name } => ("DELETE", format!("/v1/pods/{namespace}/{name}"), None),
                PodCmd::List => ("GET", "/v1/pods".to_string(), None),
            };
            match sdn_node::api::client::call(&socket, method, &path, body).await {
                Ok((status, body)) if (200..300).contains(&status) => {
                    if !body.is_empty() {
                        println!("{body}");
                    }
                    ExitCode::SUCCESS
                }
                Ok((status, body)) => {
                    eprintln!("error: {status}: {body}");
                    ExitCode::FAILURE
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Run(args) => {
            match sdn_node::rlimit::raise_nofile() {
                Ok((before, after)) if before != after => tracing::info!(before, after, "raised the open file limit to the hard limit"),
                Ok((_, now)) => tracing::info!(limit = now, "open file limit (already the hard limit)"),
                Err(e) => tracing::warn!(error = %e, "could not raise the open file limit"),
            }
            let (opts, kube) = match args.options() {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let result = match kube {
                Some(k) => {
                    let telemetry = sdn_node::metrics::Telemetry::default();
                    let t = telemetry.clone();
                    sdn_node::run::run_with(opts, telemetry, move |_| sdn_node::kube::spawn(k, t), terminated()).await
                }
                None => sdn_node::run::run(opts, terminated()).await,
            };
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Apply { state, bridge } => {
            let mut opts = ApplyOptions::new(state, bridge.ovs.ovs_rundir);
            opts.bridge = bridge.ovs.bridge;
            opts.datapath_type = bridge.datapath_type;
            opts.port_timeout = Duration::from_secs(bridge.port_timeout);
            match apply(&opts).await {
                Ok(r) => {
                    eprintln!(
                        "applied: {} flows on {} ({} added, {} modified, {} deleted; {} ports added, {} removed)",
                        r.flows, opts.bridge, r.adds, r.modifies, r.deletes, r.ports_added, r.ports_removed
                    );
                    if r.problems.is_empty() {
                        ExitCode::SUCCESS
                    } else {
                        eprintln!("{} object(s) rejected:", r.problems.len());
                        for p in &r.problems {
                            eprintln!("  {p}");
                        }
                        ExitCode::from(2)
                    }
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::DumpFlows { ovs, table, owner, stats } => {
            let mut req = FlowStatsRequest::default();
            if let Some(t) = table {
                req.table_id = t;
            }
            if let Some(o) = owner {
                match Owner::parse(&o) {
                    Ok(o) => {
                        req.cookie = o.cookie(0) & Owner::OWNER_MASK;
                        req.cookie_mask = Owner::OWNER_MASK;
                    }
                    Err(e) => {
                        eprintln!("error: --owner: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            let target = format!("unix:{}", ovs.ovs_rundir.join(format!("{}.mgmt", ovs.bridge)).display());
            let res = async {
                let sw = Switch::connect(&target, SwitchOptions::default()).await?;
                sw.dump_flows(req).await
            }
            .await;
            match res {
                Ok(mut flows) => {
                    flows.sort_by(|a, b| {
                        (a.table_id, std::cmp::Reverse(a.priority), a.no_stats().to_string())
                            .cmp(&(b.table_id, std::cmp::Reverse(b.priority), b.no_stats().to_string()))
                    });
                    for f in flows {
                        if stats {
                            println!(" {f}");
                        } else {
                            println!(" {}", f.no_stats());
                        }
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {target}: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
