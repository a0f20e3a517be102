//! Native OVSDB client (RFC 7047, JSON-RPC 1.0) used to configure Open vSwitch.
//!
//! The agent must not exec `ovs-vsctl`: besides the fork/exec cost per pod,
//! `ovs-vsctl` cannot wait for an interface's `ofport` without polling and
//! cannot express "change this only if nobody else did". Talking OVSDB
//! directly gives us single atomic transactions with `wait` guards and
//! monitors that push changes to us.
//!
//! * [`framing`]: splitting the byte stream into JSON messages.
//! * [`rpc`]: the JSON-RPC messages, typed.
//! * [`client`]: the JSON-RPC connection (requests, echo, monitors); [`monitor`]: what a
//!   monitor asks for and the table updates it delivers.
//! * [`datum`]: the wire encodings of atoms, sets, maps and uuids, typed.
//! * [`rows`]: typed rows of the tables the agent writes; [`types`]: generic rows of others.
//! * [`txn`]: transaction operations, typed, and their results.
//! * [`bridge`]: idempotent, race-safe operations on the `Open_vSwitch` DB ([`Ovs`]).
//! * [`ifwatch`], [`sentinel`]: long-lived monitors mirrored in memory.
//!
//! No JSON literals here outside tests (no `serde_json::json` macro): every message, operation
//! and row is built from types, and what the server sends is read through checked parsers that
//! never panic.

pub mod bridge;
pub mod client;
pub mod datum;
pub mod framing;
pub mod ifwatch;
mod mirror;
pub mod monitor;
pub mod rows;
pub mod rpc;
pub mod sentinel;
pub mod txn;
pub mod types;

pub use bridge::{BridgeInfo, BridgeOptions, Ensured, Ovs, PortSpec};
pub use client::{ClientOptions, OvsdbClient};
pub use datum::{FromDatum, NamedUuid, Ref, Set, ToDatum, Uuid};
pub use framing::{FramingError, JsonCodec};
pub use monitor::{
    Monitor, MonitorEnd, MonitorRequest, MonitorSelect, MonitorStream, RowUpdate, RowUpdate2, TableUpdates,
    TableUpdates2,
};
pub use rows::{Bridge, Interface, OpenVswitch, Port, Qos, Table};
pub use txn::{Condition, Mutation, Operation, OperationResult};
pub use types::Row;

use serde_json::Value;

/// Name of the database Open vSwitch keeps its configuration in.
pub const VSWITCH_DB: &str = "Open_vSwitch";

/// Everything that can go wrong talking to ovsdb-server.
#[derive(Debug, thiserror::Error)]
pub enum OvsdbError {
    #[error("invalid OVSDB address {0:?} (expected unix:PATH or tcp:HOST:PORT)")]
    InvalidAddress(String),
    #[error("cannot connect to {address}: {source}")]
    Connect {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Framing(#[from] FramingError),
    #[error("connection to ovsdb-server closed")]
    Disconnected,
    /// The server sent something that does not follow the protocol/schema.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A JSON-RPC request was answered with a non-null `error`.
    #[error("{method} failed: {error}")]
    Rpc { method: String, error: Value },
    /// A transaction was rejected; `index` is the failing operation (an index
    /// equal to the number of operations means the commit itself failed, e.g.
    /// a constraint or referential-integrity violation).
    #[error("transaction failed at operation {index} ({op}): {error}{}", details.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    TransactionFailed {
        index: usize,
        op: String,
        error: String,
        details: Option<String>,
    },
    /// Optimistic concurrency gave up after repeated `wait` conflicts.
    #[error("{what}: database kept changing, gave up after {attempts} attempts")]
    Conflict { what: String, attempts: u32 },
    /// A row of a typed table ([`rows`]) lacks a column it needs, or has one of the wrong shape.
    #[error("malformed {table} row: column {column:?}: {problem}")]
    BadRow {
        table: &'static str,
        column: &'static str,
        problem: String,
    },
    #[error("{table} {name:?} not found")]
    NotFound { table: &'static str, name: String },
    /// Open vSwitch could not create the interface (`Interface.error`).
    #[error("interface {name:?} failed: {error}")]
    InterfaceError { name: String, error: String },
    #[error("timed out: {0}")]
    Timeout(String),
    /// The port exists on another bridge, and the caller did not allow taking it
    /// ([`PortSpec::take_from_other_bridge`]).
    #[error("port {port:?} is on bridge {on:?}, not {bridge:?}")]
    OnOtherBridge { port: String, on: String, bridge: String },
}

impl OvsdbError {
    /// True when the connection is gone (or never came up): reconnect, then retry.
    pub fn is_disconnect(&self) -> bool {
        matches!(self, OvsdbError::Disconnected | OvsdbError::Connect { .. } | OvsdbError::Framing(_))
    }

    /// True when a transaction failed only because a `wait` guard did not
    /// hold, i.e. someone else changed the rows we had read: retry it.
    pub fn is_wait_conflict(&self) -> bool {
        matches!(self, OvsdbError::TransactionFailed { op, error, .. } if op == "wait" && error == "timed out")
    }
}

/// Locks ignoring poisoning: no code panics while holding these locks, and a client must not
/// turn an unrelated panic into more panics.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
