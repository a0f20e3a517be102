//! The CNI error object and the codes this plugin uses (the table is in the crate docs).

use serde::Serialize;

/// Incompatible CNI version (spec code 1).
pub const INCOMPATIBLE_VERSION: u32 = 1;
/// Container unknown or does not exist (spec code 3).
pub const UNKNOWN_CONTAINER: u32 = 3;
/// Invalid necessary environment variables (spec code 4).
pub const INVALID_ENV: u32 = 4;
/// I/O failure (spec code 5).
pub const IO_FAILURE: u32 = 5;
/// Failed to decode content (spec code 6).
pub const DECODING_FAILURE: u32 = 6;
/// Invalid network configuration (spec code 7).
pub const INVALID_CONFIG: u32 = 7;
/// Try again later (spec code 11): the runtime should retry, the condition is transient.
pub const TRY_AGAIN_LATER: u32 = 11;
/// The agent refused the request because it conflicts with another pod or container (HTTP 409).
pub const AGENT_CONFLICT: u32 = 100;
/// The agent failed the change itself (HTTP 500).
pub const AGENT_FAILED: u32 = 101;
/// The agent answered with a status this plugin does not know.
pub const AGENT_UNEXPECTED_STATUS: u32 = 102;
/// The agent's answer is not valid HTTP/JSON or lacks a field the CNI result needs.
pub const AGENT_BAD_REPLY: u32 = 103;

/// A CNI error: printed on stdout as the spec's error object, with a non-zero exit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("CNI error {code}: {msg}{}", if details.is_empty() { String::new() } else { format!(" ({details})") })]
pub struct CniError {
    pub code: u32,
    /// Short message; names the object (pod, container, config) and the field at fault.
    pub msg: String,
    /// Longer explanation: what was asked of whom, and what to check.
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> CniError {
        CniError { code, msg: msg.into(), details: details.into() }
    }

    /// The spec's error object for `cni_version` (the version the runtime asked for, so that
    /// it decodes the error with the same rules as a result).
    pub fn to_json(&self, cni_version: &str) -> String {
        #[derive(Serialize)]
        struct Wire<'a> {
            #[serde(rename = "cniVersion")]
            cni_version: &'a str,
            code: u32,
            msg: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            details: &'a str,
        }
        let w = Wire { cni_version, code: self.code, msg: &self.msg, details: &self.details };
        // Serializing plain strings and integers cannot fail; fall back to a fixed object anyway
        // so that a runtime always gets JSON.
        serde_json::to_string_pretty(&w).unwrap_or_else(|_| {
            format!("{{\"cniVersion\":\"1.0.0\",\"code\":{},\"msg\":\"unprintable error\"}}", self.code)
        })
    }
}
