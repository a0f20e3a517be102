//! A private, throw-away Open vSwitch (ovsdb-server + ovs-vswitchd) for
//! tests, benchmarks and demos.
//!
//! Everything lives in a fresh temporary directory: database, sockets, pid and
//! log files. The `OVS_*DIR` variables point the daemons there, but are set
//! only on the child processes so parallel tests in one process do not
//! interfere. ovs-vswitchd runs with `--enable-dummy --disable-system`, so
//! bridges with `datapath_type=dummy` need no kernel module and no privileges
//! beyond creating files; with [`SandboxOptions::netns`] both daemons run in a
//! network namespace of their own (created and deleted by the sandbox) so the
//! tap devices of a `netdev` datapath do not leak onto the host.
//!
//! The database is initialised through our own OVSDB client; this module never
//! runs `ovs-vsctl`, `ovs-ofctl` or `ovs-appctl`. Daemons are stopped by the
//! pid in their pid file (never by process name), after checking that the pid
//! still belongs to a process started for this sandbox directory; `Drop` does
//! this too, so a panicking test still cleans up.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tracing::{debug, warn};

use sdn_node::ovsdb::{BridgeOptions, Ovs, OvsdbClient, OvsdbError};

/// Where the distribution installs the `Open_vSwitch` schema.
pub const DEFAULT_SCHEMA: &str = "/usr/share/openvswitch/vswitch.ovsschema";

#[derive(Debug, Clone)]
pub struct SandboxOptions {
    /// Run both daemons under `ip netns exec NAME` (the sandbox runs
    /// `ip netns add NAME` and deletes it on drop). Needs root.
    pub netns: Option<String>,
    /// Start ovs-vswitchd too (otherwise only ovsdb-server).
    pub start_vswitchd: bool,
    pub schema: PathBuf,
    /// Bound for every readiness wait.
    pub ready_timeout: Duration,
    /// `--enable-dummy=override`: every netdev-class port (tun0 included) is a dummy, not a
    /// kernel device (to test a node whose host networking cannot be configured).
    pub dummy_override: bool,
}

impl Default for SandboxOptions {
    fn default() -> Self {
        SandboxOptions {
            netns: None,
            start_vswitchd: true,
            schema: PathBuf::from(DEFAULT_SCHEMA),
            ready_timeout: Duration::from_secs(20),
            dummy_override: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, String),
    #[error(transparent)]
    Ovsdb(#[from] OvsdbError),
}

/// The two daemons of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Daemon {
    OvsdbServer,
    Vswitchd,
}

impl Daemon {
    fn program(self) -> &'static str {
        match self {
            Daemon::OvsdbServer => "ovsdb-server",
            Daemon::Vswitchd => "ovs-vswitchd",
        }
    }
    fn pidfile(self) -> &'static str {
        match self {
            Daemon::OvsdbServer => "s.pid",
            Daemon::Vswitchd => "v.pid",
        }
    }
}

/// A running private Open vSwitch. Dropping it stops the daemons, deletes
/// the namespace (if any) and removes the directory.
#[derive(Debug)]
pub struct OvsSandbox {
    // Removed (by TempDir's own drop) only after Drop::drop has stopped the
    // daemons that write into it.
    dir: TempDir,
    opts: SandboxOptions,
    netns_created: bool,
    client: Option<OvsdbClient>,
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> SandboxError {
    let context = context.into();
    move |source| SandboxError::Io { context, source }
}

fn run(mut cmd: Command) -> Result<(), SandboxError> {
    let desc = format!("{cmd:?}");
    debug!(command = %desc, "running");
    let out = cmd.output().map_err(io_err(format!("cannot run {desc}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(SandboxError::Command {
            command: desc,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// True if `pid` is alive and not a zombie.
fn process_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence/permission.
    let exists = unsafe { libc::kill(pid, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    if !exists {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().chars().next()),
            Some(Some('Z' | 'X'))
        ),
        Err(_) => false,
    }
}

/// Polls (bounded) until `pid` is gone.
fn wait_gone(pid: i32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while process_alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

impl OvsSandbox {
    /// Creates the directory and database and starts the daemons.
    pub async fn start(opts: SandboxOptions) -> Result<Self, SandboxError> {
        let dir = tempfile::Builder::new()
            .prefix("ovs-sb")
            .tempdir()
            .map_err(io_err("cannot create sandbox directory"))?;
        // From here on, Drop cleans up whatever was started if we fail.
        let mut sb = OvsSandbox {
            dir,
            opts,
            netns_created: false,
            client: None,
        };
        if let Some(ns) = sb.opts.netns.clone() {
            let mut c = Command::new("ip");
            c.args(["netns", "add", &ns]);
            run(c)?;
            sb.netns_created = true;
        }
        let mut c = Command::new("ovsdb-tool");
        c.arg("create").arg(sb.conf_db()).arg(&sb.opts.schema);
        run(c)?;
        sb.start_ovsdb().await?;
        sb.ovs().init().await?;
        if sb.opts.start_vswitchd {
            sb.start_vswitchd().await?;
        }
        Ok(sb)
    }

    /// The sandbox directory (rundir, logdir, dbdir and sysconfdir).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn conf_db(&self) -> PathBuf {
        self.dir().join("conf.db")
    }

    pub fn db_socket_path(&self) -> PathBuf {
        self.dir().join("db.sock")
    }

    /// `unix:$D/db.sock`, for [`OvsdbClient::connect`] or `ovs-vsctl --db=`.
    pub fn db_socket(&self) -> String {
        format!("unix:{}", self.db_socket_path().display())
    }

    /// `$D/<bridge>.mgmt`: the bridge's OpenFlow management socket.
    pub fn mgmt_socket(&self, bridge: &str) -> PathBuf {
        self.dir().join(format!("{bridge}.mgmt"))
    }

    /// The network namespace the daemons run in, if any.
    pub fn netns(&self) -> Option<&str> {
        self.opts.netns.as_deref()
    }

    /// Environment that points OVS tools at this sandbox.
    pub fn ovs_env(&self) -> Vec<(String, String)> {
        let d = self.dir().display().to_string();
        ["OVS_RUNDIR", "OVS_LOGDIR", "OVS_DBDIR", "OVS_SYSCONFDIR"]
            .iter()
            .map(|k| (k.to_string(), d.clone()))
            .collect()
    }

    /// The sandbox's OVSDB connection (re-established by `start_ovsdb`).
    pub fn client(&self) -> OvsdbClient {
        self.client
            .clone()
            .expect("sandbox always holds a client after start")
    }

    /// Typed operations over [`client`](Self::client).
    pub fn ovs(&self) -> Ovs {
        Ovs::new(self.client())
    }

    /// Creates a bridge the way the agent configures it (fail_mode=secure,
    /// OpenFlow13) with the given datapath type, and, if vswitchd runs, waits
    /// until its management socket accepts connections.
    pub async fn add_bridge(&self, name: &str, datapath_type: &str) -> Result<(), SandboxError> {
        let opts = BridgeOptions {
            datapath_type: datapath_type.to_string(),
            ..Default::default()
        };
        self.ovs().ensure_bridge(name, &opts).await?;
        if self.pid(Daemon::Vswitchd).is_some() {
            self.wait_for_socket(&self.mgmt_socket(name)).await?;
        }
        Ok(())
    }

    fn daemon_command(&self, program: &str) -> Command {
        let mut c = match &self.opts.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, program]);
                c
            }
            None => Command::new(program),
        };
        c.envs(self.ovs_env());
        c
    }

    /// Bounded wait until a unix socket accepts connections.
    pub async fn wait_for_socket(&self, path: &Path) -> Result<(), SandboxError> {
        let deadline = Instant::now() + self.opts.ready_timeout;
        loop {
            match tokio::net::UnixStream::connect(path).await {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(SandboxError::Timeout(
                        self.opts.ready_timeout,
                        format!("socket {} ({e})", path.display()),
                    ))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    fn pid(&self, d: Daemon) -> Option<i32> {
        let path = self.dir().join(d.pidfile());
        let pid: i32 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
        if pid <= 0 || !process_alive(pid) {
            return None;
        }
        // Guard against pid reuse: the process must be the daemon we started
        // for this directory (its command line names our pid file).
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let cmdline = String::from_utf8_lossy(&cmdline);
        let ours =
            cmdline.contains(d.program()) && cmdline.contains(&self.dir().display().to_string());
        ours.then_some(pid)
    }

    /// Pid of ovsdb-server, if running.
    pub fn ovsdb_pid(&self) -> Option<i32> {
        self.pid(Daemon::OvsdbServer)
    }

    /// Pid of ovs-vswitchd, if running.
    pub fn vswitchd_pid(&self) -> Option<i32> {
        self.pid(Daemon::Vswitchd)
    }

    fn stop(&self, d: Daemon) -> Result<(), SandboxError> {
        let Some(pid) = self.pid(d) else {
            return Ok(());
        };
        debug!(daemon = d.program(), pid, "stopping");
        // SAFETY: plain signal delivery to a pid we just verified.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        if wait_gone(pid, Duration::from_secs(5)) {
            return Ok(());
        }
        warn!(
            daemon = d.program(),
            pid, "did not exit on SIGTERM; killing"
        );
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        if wait_gone(pid, Duration::from_secs(5)) {
            Ok(())
        } else {
            Err(SandboxError::Timeout(
                Duration::from_secs(10),
                format!("{} (pid {pid}) to exit", d.program()),
            ))
        }
    }

    /// Starts ovsdb-server on the sandbox database and (re)connects the
    /// sandbox's client.
    pub async fn start_ovsdb(&mut self) -> Result<(), SandboxError> {
        if self.pid(Daemon::OvsdbServer).is_none() {
            let d = self.dir().display().to_string();
            let mut c = self.daemon_command("ovsdb-server");
            c.arg(self.conf_db())
                .arg(format!("--remote=punix:{d}/db.sock"))
                // Lets tests add TCP remotes through Manager rows.
                .arg("--remote=db:Open_vSwitch,Open_vSwitch,manager_options")
                .arg(format!("--pidfile={d}/s.pid"))
                .arg("--detach")
                .arg(format!("--log-file={d}/s.log"));
            run(c)?;
        }
        self.wait_for_socket(&self.db_socket_path()).await?;
        let fresh = OvsdbClient::connect(&self.db_socket()).await?;
        if let Some(old) = self.client.replace(fresh) {
            old.close();
        }
        Ok(())
    }

    /// Replaces the (stopped) database with a new empty one, as an OVS reinstall or a lost
    /// `conf.db` leaves it: not even the `Open_vSwitch` row.
    pub fn recreate_empty_db(&mut self) -> Result<(), SandboxError> {
        let db = self.conf_db();
        std::fs::remove_file(&db).map_err(io_err("cannot remove conf.db"))?;
        let mut c = Command::new("ovsdb-tool");
        c.arg("create").arg(&db).arg(&self.opts.schema);
        run(c)
    }

    /// Stops ovsdb-server (the sandbox's client becomes disconnected).
    pub fn stop_ovsdb(&mut self) -> Result<(), SandboxError> {
        self.stop(Daemon::OvsdbServer)
    }

    /// Starts ovs-vswitchd against the sandbox database.
    pub async fn start_vswitchd(&mut self) -> Result<(), SandboxError> {
        if self.pid(Daemon::Vswitchd).is_some() {
            return Ok(());
        }
        let d = self.dir().display().to_string();
        let mut c = self.daemon_command("ovs-vswitchd");
        c.arg(format!("unix:{d}/db.sock"))
            .arg(format!("--pidfile={d}/v.pid"))
            .arg("--detach")
            .arg(format!("--log-file={d}/v.log"))
            .arg("--disable-system")
            .arg(if self.opts.dummy_override { "--enable-dummy=override" } else { "--enable-dummy" });
        // --detach returns once vswitchd has read and applied the database.
        run(c)?;
        let pid = self
            .pid(Daemon::Vswitchd)
            .ok_or_else(|| SandboxError::Command {
                command: "ovs-vswitchd".into(),
                status: "detached but no live process in pid file".into(),
                stderr: String::new(),
            })?;
        self.wait_for_socket(&self.dir().join(format!("ovs-vswitchd.{pid}.ctl")))
            .await
    }

    /// Stops ovs-vswitchd (e.g. to test restarts).
    pub fn stop_vswitchd(&mut self) -> Result<(), SandboxError> {
        self.stop(Daemon::Vswitchd)
    }

    /// Loses the database, as an Open vSwitch reinstall or a corrupted `conf.db` does: both
    /// daemons stopped, `conf.db` created again empty, both started again on it.
    pub async fn recreate_database(&mut self) -> Result<(), SandboxError> {
        self.stop_vswitchd()?;
        self.stop_ovsdb()?;
        let db = self.conf_db();
        std::fs::remove_file(&db).map_err(io_err(format!("cannot remove {}", db.display())))?;
        let mut c = Command::new("ovsdb-tool");
        c.arg("create").arg(&db).arg(&self.opts.schema);
        run(c)?;
        self.start_ovsdb().await?;
        self.ovs().init().await?;
        self.start_vswitchd().await
    }

    /// Contents of the vswitchd log, for test diagnostics.
    pub fn vswitchd_log(&self) -> String {
        std::fs::read_to_string(self.dir().join("v.log")).unwrap_or_default()
    }
}

impl Drop for OvsSandbox {
    fn drop(&mut self) {
        if let Some(c) = self.client.take() {
            c.close();
        }
        for d in [Daemon::Vswitchd, Daemon::OvsdbServer] {
            if let Err(e) = self.stop(d) {
                warn!(error = %e, "sandbox cleanup");
            }
        }
        if self.netns_created {
            if let Some(ns) = &self.opts.netns {
                let mut c = Command::new("ip");
                c.args(["netns", "del", ns]);
                if let Err(e) = run(c) {
                    warn!(error = %e, "sandbox cleanup");
                }
            }
        }
    }
}
