//! sdn-node: programs Open vSwitch for a Kubernetes pod network the way openshift-sdn's node
//! does, over OpenFlow 1.3 and OVSDB, without exec'ing ovs-ofctl or ovs-vsctl.
//!
//! Data flow: a source ([`cluster::state_file`]) gives a validated [`cluster::ClusterState`];
//! [`cluster::desired`] turns it into flows built by [`pipeline`]; [`store`] diffs them against
//! what the switch holds; [`switch`] commits the difference as one bundle; [`ovsdb`] manages the
//! bridge and ports. [`apply`] runs that chain once. The entry points' options are clap-derived
//! groups ([`options`], [`node::Config`], [`run::options`]), flattened where shared.
//!
//! The test sandbox (a private Open vSwitch) and the benchmarks are not here: they are the
//! `sdn-harness` crate (`harness/`, binary `sdn-bench`), which depends on this library.

pub use sdn_model::{cluster, domain, pipeline, store};
/// The OVSDB client and the typed `Open_vSwitch` operations (the `sdn-ovsdb` crate, `ovsdb/`).
pub use sdn_ovsdb as ovsdb;
/// The OpenFlow connection to the bridge (the `sdn-switch` crate, `switch/`).
pub use sdn_switch as switch;

pub mod api;
pub mod audit;
pub mod controller;
pub mod apply;
pub mod engine;
pub mod kube;
pub mod metrics;
pub mod options;
pub mod policy_report;
pub mod policy_stats;
pub mod process;
pub mod realize;
pub mod node;
pub mod pod;
pub mod reconcile;
pub mod rejections;
pub mod rlimit;
pub mod run;
pub mod trace;
