//! The option groups the entry points share, clap-derived so that a flag, its default and its
//! field are written once: [`OvsTarget`] (where Open vSwitch is: `dump-flows`, `apply`, `run`)
//! inside [`Bridge`] (the bridge and how it is programmed: `apply`, `run` and the reconciler's
//! [`crate::reconcile::Config`]). `run`'s own groups are in [`crate::run::options`].
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

/// The bridge the agent programs, and how (shared by `apply`, `run` and the reconciler).
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct Bridge {
    #[command(flatten)]
    pub ovs: OvsTarget,
    /// Datapath of the bridge: system (kernel), netdev (userspace) or dummy (tests).
    #[arg(long, default_value = "system")]
    pub datapath_type: String,
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
        assert_eq!(b.datapath_type, "system");
        assert_eq!(b.port_timeout, Duration::from_secs(10));
        assert_eq!(Bridge::new("/tmp/x".into()).ovs.mgmt_socket(), "unix:/tmp/x/br0.mgmt");
        assert_eq!(Bridge::new("/tmp/x".into()).ovs.db_socket(), "unix:/tmp/x/db.sock");
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
