//! `sdn_node::apply::converge` on a real switch (moved from src/apply.rs's unit tests: the
//! sandbox is sdn-harness, a crate built on the sdn_node library, which the library's own unit
//! tests cannot use — they are a second build of it, with types of their own).

use std::path::PathBuf;
use std::time::Duration;

use sdn_node::apply::{converge, ApplyOptions};
use sdn_node::cluster::state_file;

/// Regression: on a bridge converge has just created, the agent must not connect to
/// `<bridge>.mgmt` before ovs-vswitchd has created it. With pods, waiting for their ofports
/// hid the race; without any, the connect failed with ENOENT now and then.
#[tokio::test]
async fn converges_a_fresh_bridge_without_pods() {
    for _ in 0..3 {
        let sb = sdn_harness::sandbox::OvsSandbox::start(Default::default()).await.unwrap();
        let (mut state, _) = state_file::parse(include_str!("../deploy/examples/cluster.yaml")).unwrap();
        state.pods.clear();
        state.egress_policies.clear();
        let mut opts = ApplyOptions::new(PathBuf::from("cluster.yaml"), sb.dir().to_path_buf());
        opts.bridge.datapath_type = "dummy".into();
        let r = tokio::time::timeout(Duration::from_secs(60), converge(&opts, &state)).await.expect("in time");
        assert!(r.is_ok(), "{r:?}");
    }
}
