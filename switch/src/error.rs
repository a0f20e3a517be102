//! Errors of the OpenFlow switch connection.

use std::time::Duration;

use openflow::{ErrorMsg, OfMessage};
use thiserror::Error;

/// An OFPT_ERROR the switch sent for one of our messages, with that message decoded.
#[derive(Debug, Clone)]
pub struct Rejection {
    /// The xid of the rejected message.
    pub xid: u32,
    pub error: ErrorMsg,
    /// The offending message as the switch echoed it back (for a bundled message this is the
    /// BUNDLE_ADD_MESSAGE), if it could be decoded.
    pub offending: Option<OfMessage>,
}

impl Rejection {
    pub fn new(xid: u32, error: ErrorMsg) -> Rejection {
        let offending = error.offending().ok();
        Rejection { xid, error, offending }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "xid {:#x}: {}", self.xid, self.error.code)?;
        if let Some(m) = &self.offending {
            match &m.msg {
                openflow::Message::FlowMod(fm) => write!(f, " for FLOW_MOD {} {fm}", fm.command.name())?,
                openflow::Message::BundleAdd(b) => {
                    if let openflow::Message::FlowMod(fm) = &b.message.msg {
                        write!(f, " for bundled FLOW_MOD {} {fm}", fm.command.name())?
                    }
                }
                other => write!(f, " for {}", other.name())?,
            }
        }
        Ok(())
    }
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// The switch closed the socket.
    Eof,
    /// A read or write failed.
    Io(String),
    /// The byte stream could not be framed any more.
    Framing(String),
    /// The switch did not answer our echo in time.
    EchoTimeout,
    /// We closed it (all handles dropped or `close()` called).
    Local,
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloseReason::Eof => f.write_str("switch closed the connection"),
            CloseReason::Io(e) => write!(f, "I/O error: {e}"),
            CloseReason::Framing(e) => write!(f, "framing error: {e}"),
            CloseReason::EchoTimeout => f.write_str("switch did not answer echo requests"),
            CloseReason::Local => f.write_str("closed locally"),
        }
    }
}

#[derive(Debug, Error)]
pub enum SwitchError {
    #[error("bad switch address {0:?}: expected unix:PATH or tcp:HOST:PORT")]
    BadAddress(String),
    #[error("connecting to {target}: {source}")]
    Connect { target: String, source: std::io::Error },
    #[error("OpenFlow handshake with {target}: {detail}")]
    Handshake { target: String, detail: String },
    #[error("switch at {target} does not speak OpenFlow 1.3 (it offers versions {offered:?}); set protocols=OpenFlow13 on the bridge")]
    VersionUnsupported { target: String, offered: Vec<u8> },
    #[error("connection to the switch is closed: {0}")]
    Disconnected(CloseReason),
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: &'static str, after: Duration },
    #[error("switch rejected {0}")]
    Rejected(Box<Rejection>),
    #[error("switch rejected {} of a batch of {total} messages; first: {}", .failures.len(), .failures.first().map(|f| f.1.to_string()).unwrap_or_default())]
    Batch { total: usize, failures: Vec<(usize, Rejection)> },
    #[error("bundle not committed: {} message(s) rejected; first: {}; the switch is unchanged", .failures.len(), .failures.first().map(|f| f.1.to_string()).unwrap_or_default())]
    BundleRejected { failures: Vec<(usize, Rejection)> },
    /// A one-trip commit ([`crate::Bundle::commit_one_trip`]) in which the switch
    /// refused messages when they were added: it left them out and applied the others.
    #[error("bundle committed without {} refused message(s); first: {}; the switch holds the rest and must be repaired", .failures.len(), .failures.first().map(|f| f.1.to_string()).unwrap_or_default())]
    BundlePartial { failures: Vec<(usize, Rejection)> },
    #[error("unexpected reply {got} to {request}")]
    UnexpectedReply { request: &'static str, got: &'static str },
    #[error("switch sent an undecodable reply (xid {xid:#x}): {error}")]
    BadReply { xid: u32, error: openflow::DecodeError },
    #[error(transparent)]
    Encode(#[from] openflow::EncodeError),
    #[error("switch reports fragment mode {got} after we set {want}")]
    FragModeNotApplied { want: &'static str, got: &'static str },
}

impl SwitchError {
    /// True if the connection is gone (the caller should reconnect and resync).
    pub fn is_disconnect(&self) -> bool {
        matches!(self, SwitchError::Disconnected(_))
    }
}
