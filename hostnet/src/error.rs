//! One error type for the crate. Every variant names the kernel object it was about (a link,
//! an address, a route, a table, a namespace path) and the operation, because the agent logs
//! these errors verbatim and an operator must be able to tell *which* pod or interface failed
//! without a debugger.

use std::{io, time::Duration};

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors from host networking operations.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kernel (or the netlink library) rejected a request.
    #[error("{op} {object}: {source}")]
    Netlink {
        op: &'static str,
        object: String,
        #[source]
        source: rtnetlink::Error,
    },
    /// A system call failed (netns switch, socket, ioctl, sysctl file).
    #[error("{op} {object}: {source}")]
    Io {
        op: &'static str,
        object: String,
        #[source]
        source: io::Error,
    },
    /// The kernel did not answer within the deadline.
    #[error("{op} {object}: no answer within {after:?}")]
    Timeout { op: &'static str, object: String, after: Duration },
    /// An object that must exist does not.
    #[error("{kind} {name} not found")]
    NotFound { kind: &'static str, name: String },
    /// An object that must not exist already does.
    #[error("{kind} {name} already exists")]
    Exists { kind: &'static str, name: String },
    /// A caller-supplied parameter is unusable; rejected before touching the kernel.
    #[error("invalid {what}: {reason}")]
    Invalid { what: String, reason: String },
    /// A kernel reply did not have the shape we rely on.
    #[error("unexpected kernel reply for {object}: {reason}")]
    Reply { object: String, reason: String },
    /// `check` found differences between the expected and the actual state.
    #[error("check of {object} failed: {}", problems.join("; "))]
    Check { object: String, problems: Vec<String> },
    /// IPv6 duplicate address detection found `address` already in use on the link (the kernel
    /// marked it dadfailed): the pod is not usable. What was made is left as it is, for the
    /// caller to remove like after any other failure.
    #[error("duplicate address detection failed for {address} on {object}: another node on the link holds it")]
    DadFailed { address: ipnet::Ipv6Net, object: String },
    /// An operation failed and so did undoing its partial work: both are reported, since the
    /// second one means something is left behind.
    #[error("{first}; undoing also failed: {undo}")]
    Undo { first: Box<Error>, undo: Box<Error> },
}

impl Error {
    /// The errno behind this error, when there is one (netlink NACK or system call).
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Netlink { source: rtnetlink::Error::NetlinkError(m), .. } => m.to_io().raw_os_error(),
            Error::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    pub(crate) fn invalid(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Invalid { what: what.into(), reason: reason.into() }
    }

    pub(crate) fn io(op: &'static str, object: impl Into<String>, source: io::Error) -> Self {
        Error::Io { op, object: object.into(), source }
    }
}
