//! sdn-harness: what the sdn-node agent is tested and measured with, kept out of the agent.
//!
//! - [`sandbox`]: a private, throw-away Open vSwitch (ovsdb-server + ovs-vswitchd) for tests,
//!   benchmarks and demos.
//! - [`bench`]: the benchmarks of the `sdn-bench` binary (`churn`, `pods`, `commit`), each
//!   measured against baselines in the same run.
//!
//! This crate depends on the agent's library (`sdn_node`), not the other way round, so the
//! agent binary and library carry none of it. The agent's integration tests and benchmarks
//! use it as a dev-dependency of `sdn-node`; the agent's unit tests (`#[cfg(test)]` in its
//! library) cannot, since they are a second build of `sdn_node` whose types differ from the
//! ones this crate links — a test that needs a sandbox lives in `tests/`.

pub mod bench;
pub mod sandbox;
