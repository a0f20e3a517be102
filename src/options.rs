//! The option groups the entry points share, clap-derived so that a flag, its default and its
//! field are written once: [`OvsTarget`] (where Open vSwitch is: `dump-flows`, `apply`, `run`)
//! inside [`Bridge`] (the bridge and how it is programmed: `apply`, `run` and the reconciler's
//! [`crate::node::Config`]). `run`'s own groups are in [`crate::run::options`].
//!
//! Every group has the command line's defaults as its `Default` ([`defaults`]), so a library
//! user (a test, the harness) starts from what an operator gets and changes only what differs.

use std::path::PathBuf;
use std::time::Duration;

/// The pod API's socket unless `--pod-api-socket` says otherwise (also the CNI plugin's
/// default, and where `status`, `trace` and `pod` look for the agent).
pub const DEFAULT_SOCKET: &str = "/var/run/sdn-node/cni.sock";

/// Where ovsdb-server and ovs-vswitchd listen, and the bridge the agent programs.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct OvsTarget {
    /// Directory with ovsdb-server's db.sock and the bridge's <bridge>.mgmt socket.
    #[arg(long, default_value = "/var/run/openvswitch", env = "OVS_RUNDIR")]
    pub ovs_rundir: PathBuf,
    /// The integration bridge.
    #[arg(long, default_value = "br0")]
    pub bridge: String,
}

impl OvsTarget {
    /// ovsdb-server's socket, as the OVSDB client dials it.
    pub fn db_socket(&self) -> String {
        format!("unix:{}", self.ovs_rundir.join("db.sock").display())
    }

    /// The bridge's OpenFlow management socket, as the switch client dials it.
    pub fn mgmt_socket(&self) -> String {
        format!("unix:{}", self.ovs_rundir.join(format!("{}.mgmt", self.bridge)).display())
    }
}

/// A bridge's datapath (OVSDB `Bridge.datapath_type`), as far as this agent uses them.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DatapathType {
    /// The kernel datapath (OVSDB writes it `system`, or leaves the column empty).
    System,
    /// The userspace datapath.
    Netdev,
    /// ovs-vswitchd's test datapath (`--enable-dummy`): ports that are not devices.
    Dummy,
}

impl DatapathType {
    /// The value of `Bridge.datapath_type`.
    pub fn as_str(self) -> &'static str {
        match self {
            DatapathType::System => "system",
            DatapathType::Netdev => "netdev",
            DatapathType::Dummy => "dummy",
        }
    }

    /// Whether two values of `Bridge.datapath_type` name the same datapath (empty is system).
    pub fn same(a: &str, b: &str) -> bool {
        let norm = |t: &str| if t.is_empty() { "system".to_string() } else { t.to_ascii_lowercase() };
        norm(a) == norm(b)
    }
}

impl std::fmt::Display for DatapathType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for DatapathType {
    type Err = String;

    /// As the command line takes it (`system`, `netdev`, `dummy`).
    fn from_str(s: &str) -> Result<Self, String> {
        <DatapathType as clap::ValueEnum>::from_str(s, false)
            .map_err(|_| format!("{s:?} is not a datapath type (system, netdev or dummy)"))
    }
}

/// The bridge the agent programs, and how (shared by `apply`, `run` and the reconciler).
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct Bridge {
    #[command(flatten)]
    pub ovs: OvsTarget,
    /// Datapath of a bridge the agent creates: system (kernel; the default), netdev
    /// (userspace) or dummy (tests; ovs-vswitchd --enable-dummy). An existing bridge keeps
    /// its own unless --change-datapath-type is given too.
    // `None`: keep an existing bridge's datapath type; system for a new bridge.
    #[arg(long, value_enum)]
    pub datapath_type: Option<DatapathType>,
    /// Change an existing bridge's datapath type to --datapath-type (its ports move to the
    /// other datapath: traffic stops while they do). Without it, a bridge of another datapath
    /// type is refused.
    #[arg(long, requires = "datapath_type")]
    pub change_datapath_type: bool,
    /// Move the ports the agent needs (tun0, vxlan0, pods' ports) onto --bridge when another
    /// bridge holds them. Without it the agent refuses and changes nothing (a typo'd --bridge
    /// would otherwise strip the real bridge of its ports).
    #[arg(long)]
    pub take_ports_from_other_bridges: bool,
    /// Seconds to wait for a pod's port to get an ofport.
    #[arg(long, default_value = "10", value_parser = seconds)]
    pub port_timeout: Duration,
}

impl Bridge {
    /// The command line's defaults, on the Open vSwitch found in `ovs_rundir`.
    pub fn new(ovs_rundir: PathBuf) -> Bridge {
        let mut b = defaults::<Bridge>();
        b.ovs.ovs_rundir = ovs_rundir;
        b
    }

    /// The bridge's name in OVSDB.
    pub fn name(&self) -> &str {
        &self.ovs.bridge
    }
}

/// An option group's defaults, exactly as the command line has them (no argument given).
/// Environment variables named by a group (`OVS_RUNDIR`) are ignored, so that a library user
/// gets the same value wherever it runs.
pub fn defaults<T: clap::Args + clap::FromArgMatches>() -> T {
    let cmd = T::augment_args(clap::Command::new("defaults").no_binary_name(true));
    // Drop `env = ...` so the defaults do not depend on the process's environment.
    let cmd = cmd.mut_args(|a| a.env(None::<&str>));
    // A group with a required argument has no defaults: a programming error, caught by the
    // unit test below for every group.
    let matches = cmd.try_get_matches_from(std::iter::empty::<String>()).expect("option groups have defaults for every argument");
    T::from_arg_matches(&matches).expect("option groups' defaults parse")
}

/// Seconds, as the command line writes durations (`2`, `0.5`); at least a millisecond, since
/// zero intervals and deadlines mean nothing here.
pub fn seconds(s: &str) -> Result<Duration, String> {
    let v = non_negative(s)?;
    Duration::try_from_secs_f64(v.max(0.001)).map_err(|e| format!("{s:?}: {e}"))
}

/// [`seconds`], where 0 turns the thing off (`None`).
pub fn seconds_or_off(s: &str) -> Result<Option<Duration>, String> {
    if non_negative(s)? == 0.0 {
        return Ok(None);
    }
    seconds(s).map(Some)
}

/// A finite number of seconds, 0 or more.
fn non_negative(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("{s:?}: seconds must be a finite number, 0 or more"));
    }
    Ok(v)
}

/// A path, or `none` for no path (the feature it names is off).
pub fn path_or_none(s: &str) -> Result<Option<PathBuf>, String> {
    match s {
        "" => Err("empty path (use `none` to turn it off)".into()),
        "none" => Ok(None),
        p => Ok(Some(PathBuf::from(p))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_command_lines() {
        let b = defaults::<Bridge>();
        assert_eq!(b.ovs.ovs_rundir, PathBuf::from("/var/run/openvswitch"));
        assert_eq!(b.name(), "br0");
        assert_eq!(b.datapath_type, None, "an existing bridge keeps its datapath type");
        assert!(!b.change_datapath_type && !b.take_ports_from_other_bridges);
        assert_eq!(b.port_timeout, Duration::from_secs(10));
        assert_eq!(Bridge::new("/tmp/x".into()).ovs.mgmt_socket(), "unix:/tmp/x/br0.mgmt");
        assert_eq!(Bridge::new("/tmp/x".into()).ovs.db_socket(), "unix:/tmp/x/db.sock");
    }

    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        bridge: Bridge,
    }

    /// Datapath types are the parser's to refuse; changing one needs both flags.
    #[test]
    fn datapath_type_is_an_enumeration() {
        use clap::Parser;
        let b = Cli::try_parse_from(["x", "--datapath-type", "netdev"]).unwrap().bridge;
        assert_eq!(b.datapath_type, Some(DatapathType::Netdev));
        let e = Cli::try_parse_from(["x", "--datapath-type", "foo"]).unwrap_err().to_string();
        assert!(e.contains("foo") && e.contains("--datapath-type") && e.contains("system"), "{e}");
        let e = Cli::try_parse_from(["x", "--change-datapath-type"]).unwrap_err().to_string();
        assert!(e.contains("--datapath-type"), "{e}");
        let b = Cli::try_parse_from(["x", "--datapath-type", "dummy", "--change-datapath-type", "--take-ports-from-other-bridges"]).unwrap().bridge;
        assert!(b.change_datapath_type && b.take_ports_from_other_bridges);
        assert_eq!("dummy".parse::<DatapathType>(), Ok(DatapathType::Dummy));
        assert!("Foo".parse::<DatapathType>().unwrap_err().contains("not a datapath type"));
        assert!(DatapathType::same("", "system") && DatapathType::same("netdev", "netdev") && !DatapathType::same("", "netdev"));
    }

    #[test]
    fn seconds_parse_and_refuse() {
        assert_eq!(seconds("2.5"), Ok(Duration::from_millis(2500)));
        assert_eq!(seconds("0"), Ok(Duration::from_millis(1)));
        assert!(seconds("-1").unwrap_err().contains("0 or more"));
        assert!(seconds("inf").is_err());
        assert!(seconds("5s").unwrap_err().contains("not a number"));
        assert_eq!(seconds_or_off("0"), Ok(None));
        assert_eq!(seconds_or_off("0.2"), Ok(Some(Duration::from_millis(200))));
        assert_eq!(path_or_none("none"), Ok(None));
        assert_eq!(path_or_none("/x"), Ok(Some(PathBuf::from("/x"))));
        assert!(path_or_none("").is_err());
    }
}
