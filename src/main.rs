//! The `sdn-node` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use openflow::FlowStatsRequest;
use sdn_node::apply::{apply, ApplyOptions};
use sdn_node::options::OvsTarget;
use sdn_node::process::{self, LogFormat};
use sdn_node::run::RunOptions;
use sdn_node::store::Owner;
use sdn_node::switch::{Switch, SwitchOptions};

mod install_cni;
mod proc_sys_net;

#[derive(Parser)]
#[command(name = "sdn-node", version, about = "Programs Open vSwitch for a Kubernetes pod network (openshift-sdn's pipeline) over OpenFlow 1.3 and OVSDB")]
struct Cli {
    /// Log format: human or json (structured).
    #[arg(long, global = true, default_value = "human")]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Cmd,
}

/// `sdn-node run`'s options: where the cluster state comes from, and what the agent runs with.
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
    /// First make /proc/sys/net (only it) writable in the agent's mount namespace: bind-mount
    /// it onto itself and remount that read-write (needs CAP_SYS_ADMIN). For a container whose
    /// runtime mounts /proc/sys read-only (the DaemonSet); the image has no shell to do it.
    #[arg(long)]
    writable_proc_sys_net: bool,
    #[command(flatten)]
    opts: RunOptions,
}

impl RunArgs {
    /// The agent's options, and the Kubernetes source's if it follows the API.
    fn options(self) -> (RunOptions, Option<sdn_node::kube::KubeOptions>) {
        let RunArgs { state, kubeconfig, in_cluster, writable_proc_sys_net: _, mut opts } = self;
        opts.state = state.unwrap_or_default();
        let kube = (kubeconfig.is_some() || in_cluster).then(|| sdn_node::kube::KubeOptions { kubeconfig, node: opts.node_name.clone().unwrap_or_default() });
        (opts, kube)
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Converge the switch to a state file once: bridge, ports and flows. Exits 0 when the
    /// switch holds exactly the desired flows, 2 if some objects were rejected (the rest is
    /// applied), 1 on failure.
    Apply(ApplyOptions),
    /// Keep the switch equal to a state file for as long as it runs: checks its flags and
    /// files first (a bad one exits 1 with one line, before any write), converges, re-applies
    /// when the file changes (once running, a file that fails to parse keeps the last good
    /// state, and a rejected object its last good version), reconnects to ovs-vswitchd and ovsdb-server when they restart and replays what
    /// they lost. Stops on SIGTERM/SIGINT, leaving flows installed.
    Run(Box<RunArgs>),
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
        ovs: OvsTarget,
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
    /// The cluster side, for clusters without openshift-sdn's master: creates ClusterNetwork
    /// "default", a HostSubnet per Node and a NetNamespace per Namespace; leader-elected
    /// through a Lease (run two replicas). Checks its flags first (a bad one exits 1 with one
    /// line).
    Controller(Box<sdn_node::controller::ControllerArgs>),
    /// Install the CNI plugin (`sdn-node-cni`, beside this binary unless --from) into a
    /// node's plugin directory atomically: a temporary file there, fsync, mode 0755, rename.
    /// Prints what it installed; exits 1 with one line on an error. The DaemonSet's init
    /// container.
    InstallCni(install_cni::InstallCniArgs),
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
        /// A dual-stack pod's IPv6 address (from this node's IPv6 subnet).
        #[arg(long)]
        ip6: Option<String>,
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
    /// List the pods set up through the API, as a table (like kubectl).
    List {
        /// `wide` adds the container ID, internal and CNI columns; `json` prints the records
        /// as the API gives them (for scripts).
        #[arg(short = 'o', long)]
        output: Option<PodListOutput>,
    },
}

/// `pod list -o`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum PodListOutput {
    Wide,
    Json,
}

/// The pods of `GET /v1/pods` as a table with a header, columns padded to their widest cell.
fn pod_table(pods: &[sdn_node::node::record::PodRecord], wide: bool) -> String {
    let mut rows: Vec<Vec<String>> = vec![];
    let mut header: Vec<String> = ["NAMESPACE", "NAME", "IP", "MAC", "HOST-VETH"].map(String::from).to_vec();
    if wide {
        header.extend(["CONTAINER-ID", "INTERNAL", "CNI"].map(String::from));
    }
    rows.push(header);
    let mut pods: Vec<_> = pods.iter().collect();
    pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    for p in pods {
        let mut row = vec![p.namespace.clone(), p.name.clone(), p.ip.to_string(), p.mac.to_string(), p.host_veth.clone()];
        if wide {
            row.push(p.container_id.clone());
            row.push(if p.internal { "yes" } else { "no" }.into());
            row.push(if p.cni.is_some() { "yes" } else { "no" }.into());
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len()).map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0)).collect();
    let mut text = String::new();
    for r in rows {
        let cells: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        text += cells.join("   ").trim_end();
        text += "\n";
    }
    text
}

/// How long `sdn-node pod` waits for the agent's answer.
const POD_CALL_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let _log = process::init_logging(cli.log_format);
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

/// Writes CLI output to stdout. A reader that went away (`sdn-node dump-flows | head`) ends the
/// command quietly with 141, the status of a process killed by SIGPIPE, as Unix tools do: no
/// panic, no message. Any other write error is said on stderr and exits 1.
fn out(s: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_all(s.as_bytes()).and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(141);
        }
        err(&format!("error: writing to stdout: {e}"));
        std::process::exit(1);
    }
}

/// One line to stderr that cannot panic (stderr closed: the line is dropped).
fn err(s: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{s}");
}

/// `println!` for CLI output, through [`out`].
macro_rules! outln {
    ($($t:tt)*) => { out(&(format!($($t)*) + "\n")) };
}

/// `eprintln!` that cannot panic, through [`err`].
macro_rules! errln {
    ($($t:tt)*) => { err(&format!($($t)*)) };
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}")) + "\n"
}

fn print_result<T>(r: Result<T, String>, show: impl FnOnce(&T) -> String) -> ExitCode {
    match r {
        Ok(v) => {
            out(&show(&v));
            ExitCode::SUCCESS
        }
        Err(e) => {
            errln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> ExitCode {
    match cli.cmd {
        Cmd::Controller(args) => sdn_node::controller::run(*args, terminated()).await,
        Cmd::Trace(args) => print_result(sdn_node::trace::run(&args).await, |r| if args.json { json(r) } else { r.text() }),
        Cmd::Status { socket, json: as_json } => {
            print_result(sdn_node::api::status::fetch(&socket).await, |s| if as_json { json(s) } else { s.to_string() })
        }
        Cmd::Pod { socket, op } => pod(socket, op).await,
        Cmd::InstallCni(args) => match install_cni::run(&args) {
            Ok(i) => {
                outln!("installed {} as {} ({} bytes, mode 0755)", i.from.display(), i.to.display(), i.bytes);
                ExitCode::SUCCESS
            }
            Err(e) => {
                errln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Run(args) => run_agent(*args).await,
        Cmd::Apply(opts) => apply_once(opts).await,
        Cmd::DumpFlows { ovs, table, owner, stats } => dump_flows(ovs, table, owner, stats).await,
    }
}

/// `sdn-node pod`: one call to the pod API.
async fn pod(socket: std::path::PathBuf, op: PodCmd) -> ExitCode {
    let list_output = match &op {
        PodCmd::List { output } => Some(*output),
        _ => None,
    };
    let (method, path, body) = match op {
        PodCmd::Add { namespace, name, container_id, host_veth, ip, ip6, mac, ingress_bandwidth, egress_bandwidth, internal } => {
            let mut annotations = std::collections::BTreeMap::new();
            if let Some(v) = ingress_bandwidth {
                annotations.insert(sdn_node::cluster::INGRESS_ANNOTATION.to_string(), v);
            }
            if let Some(v) = egress_bandwidth {
                annotations.insert(sdn_node::cluster::EGRESS_ANNOTATION.to_string(), v);
            }
            // Kubernetes' podIPs shape: the IPv4 address first.
            let ips = ip6.map(|ip6| vec![ip.clone(), ip6]).unwrap_or_default();
            let req = sdn_node::api::PodRequest { container_id, namespace, name, host_veth, ip, ips, mac, annotations, internal, cni: None };
            ("POST", "/v1/pods".to_string(), serde_json::to_string(&req).ok())
        }
        PodCmd::Del { namespace, name } => ("DELETE", format!("/v1/pods/{namespace}/{name}"), None),
        PodCmd::List { .. } => ("GET", "/v1/pods".to_string(), None),
    };

    // A bound on the whole call: an agent that does not answer is said, not waited for
    // forever (pod setup itself is bounded by the agent's --port-timeout, well under it).
    let call = sdn_node::api::client::call(&socket, method, &path, body);
    let answer = match tokio::time::timeout(POD_CALL_DEADLINE, call).await {
        Ok(a) => a,
        Err(_) => Err(format!(
            "{}: the agent did not answer within {}s (is it stuck? `sdn-node status --socket {}`)",
            socket.display(),
            POD_CALL_DEADLINE.as_secs(),
            socket.display()
        )),
    };
    match answer {
        Ok((status, body)) if (200..300).contains(&status) && matches!(list_output, Some(None | Some(PodListOutput::Wide))) => {
            match serde_json::from_str::<Vec<sdn_node::node::record::PodRecord>>(&body) {
                Ok(pods) if pods.is_empty() => {
                    errln!("No pods set up through the pod API at {}.", socket.display());
                }
                Ok(pods) => out(&pod_table(&pods, list_output == Some(Some(PodListOutput::Wide)))),
                Err(e) => {
                    errln!("error: {}: unreadable pod list: {e}", socket.display());
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Ok((status, body)) if (200..300).contains(&status) => {
            if list_output.is_some() {
                // -o json: the records, one array, pretty.
                match serde_json::from_str::<serde_json::Value>(&body) {
                    Ok(v) => out(&json(&v)),
                    Err(_) => outln!("{body}"),
                }
            } else if !body.is_empty() {
                outln!("{body}");
            }
            ExitCode::SUCCESS
        }
        Ok((status, body)) => {
            errln!("error: {status}: {body}");
            ExitCode::FAILURE
        }
        Err(e) => {
            errln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `sdn-node run`.
async fn run_agent(args: RunArgs) -> ExitCode {
    if args.writable_proc_sys_net {
        if let Err(e) = proc_sys_net::make_writable() {
            errln!("error: --writable-proc-sys-net: {e}");
            return ExitCode::FAILURE;
        }
    }
    let (opts, kube) = args.options();
    // One line and exit 1 on a bad configuration, before anything is logged or done.
    if let Err(e) = sdn_node::run::startup::check(&opts, kube.as_ref()).await {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    match sdn_node::rlimit::raise_nofile() {
        Ok((before, after)) if before != after => tracing::info!(before, after, "raised the open file limit to the hard limit"),
        Ok((_, now)) => tracing::info!(limit = now, "open file limit (already the hard limit)"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open file limit"),
    }
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
            errln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `sdn-node apply`.
async fn apply_once(opts: ApplyOptions) -> ExitCode {
    match apply(&opts).await {
        Ok(r) => {
            errln!(
                "applied: {} flows on {} ({} added, {} modified, {} deleted; {} ports added, {} removed)",
                r.flows, opts.bridge.name(), r.adds, r.modifies, r.deletes, r.ports_added, r.ports_removed
            );
            if r.problems.is_empty() {
                ExitCode::SUCCESS
            } else {
                errln!("{} object(s) rejected:", r.problems.len());
                for p in &r.problems {
                    errln!("  {p}");
                }
                ExitCode::from(2)
            }
        }
        Err(e) => {
            errln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `sdn-node dump-flows`.
async fn dump_flows(ovs: OvsTarget, table: Option<u8>, owner: Option<String>, stats: bool) -> ExitCode {
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
                errln!("error: --owner: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let target = ovs.mgmt_socket();
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
            let mut text = String::new();
            for f in flows {
                if stats {
                    text += &format!(" {f}\n");
                } else {
                    text += &format!(" {}\n", f.no_stats());
                }
            }
            out(&text);
            ExitCode::SUCCESS
        }
        Err(e) => {
            errln!("error: {target}: {e}");
            ExitCode::FAILURE
        }
    }
}
