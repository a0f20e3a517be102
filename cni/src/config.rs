//! The network configuration the runtime writes on stdin, and the CNI_ARGS variable.
//!
//! Parsed by hand from a `serde_json::Value` rather than derived, so that every rejection
//! names the field at fault (serde's messages give a line and column, which mean nothing to
//! whoever reads a kubelet event).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::error::{self, CniError};

/// The CNI versions whose ADD result shape this plugin can print. 1.1.0 is left out on
/// purpose: declaring it obliges a plugin to implement STATUS and GC.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0"];
/// The version used for output when the runtime's own cannot be used (missing or unsupported).
pub const LATEST_VERSION: &str = "1.0.0";
/// Where `sdn-node run` serves its API unless told otherwise.
pub const DEFAULT_AGENT_SOCKET: &str = "/var/run/sdn-node/cni.sock";
/// The agent's deadline when the config sets none: below kubelet's 4-minute runtime request
/// timeout, long enough for a setup queued behind a switch reconnect.
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 30;
/// Above this a "deadline" no longer protects the runtime from a stuck agent.
pub const MAX_TIMEOUT_SECONDS: u64 = 3600;

/// The fields of the network configuration this plugin reads (the others are ignored, as the
/// spec asks).
#[derive(Clone, Debug, PartialEq)]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    pub agent_socket: PathBuf,
    pub timeout: Duration,
    /// The previous result, given for CHECK and DEL (0.4.0 and later).
    pub prev_result: Option<Map<String, Value>>,
}

/// The cniVersion the runtime asked for, read leniently (used to shape errors even when the
/// rest of the config is broken); `None` when there is no usable string.
pub fn requested_version(stdin: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(stdin).ok()?;
    v.get("cniVersion")?.as_str().map(str::to_owned)
}

/// The version errors and results are printed for: the requested one when supported.
pub fn output_version(stdin: &[u8]) -> &'static str {
    match requested_version(stdin) {
        Some(v) => SUPPORTED_VERSIONS.iter().copied().find(|s| *s == v).unwrap_or(LATEST_VERSION),
        None => LATEST_VERSION,
    }
}

/// Whether `version` supports CHECK and prevResult on DEL (added in 0.4.0).
pub fn has_check(version: &str) -> bool {
    !version.starts_with("0.3.")
}

fn decode_err(field: &str, what: &str) -> CniError {
    CniError::new(
        error::DECODING_FAILURE,
        format!("network config field {field}: {what}"),
        "the network configuration on stdin is written by the container runtime from the .conflist file",
    )
}

fn invalid(field: &str, what: impl Into<String>) -> CniError {
    CniError::new(
        error::INVALID_CONFIG,
        format!("network config field {field}: {}", what.into()),
        "check the sdn-node .conflist file in the runtime's CNI config directory",
    )
}

/// Whether `s` is a valid CNI container ID or network name (the reference library's
/// `[a-zA-Z0-9][a-zA-Z0-9_.\-]*`): both end up in file names in the runtime's cache.
pub fn valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphanumeric() => {
            chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        }
        _ => false,
    }
}

/// Parses and validates the network configuration.
pub fn parse(stdin: &[u8]) -> Result<NetConf, CniError> {
    let v: Value = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(
            error::DECODING_FAILURE,
            format!("network config (stdin): not valid JSON: {e}"),
            "the container runtime must write the network configuration as a JSON object on stdin",
        )
    })?;
    let Value::Object(obj) = v else {
        return Err(decode_err("(top level)", "must be a JSON object"));
    };
    let string = |field: &str| -> Result<Option<&str>, CniError> {
        match obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(decode_err(field, "must be a string")),
        }
    };

    let cni_version = match string("cniVersion")? {
        Some(v) if SUPPORTED_VERSIONS.contains(&v) => v.to_owned(),
        other => {
            // The spec reads a missing cniVersion as 0.1.0, which has no result shape we print.
            let got = other.map_or_else(|| "missing (means 0.1.0)".to_owned(), |v| format!("{v:?} is not supported"));
            return Err(CniError::new(
                error::INCOMPATIBLE_VERSION,
                format!("network config field cniVersion: {got}"),
                format!("sdn-node-cni supports CNI versions {}", SUPPORTED_VERSIONS.join(", ")),
            ));
        }
    };

    let name = match string("name")? {
        None | Some("") => return Err(invalid("name", "missing")),
        Some(n) if !valid_name(n) => {
            return Err(invalid(
                "name",
                format!("{n:?} has characters other than [a-zA-Z0-9_.-] or does not start alphanumeric"),
            ))
        }
        Some(n) => n.to_owned(),
    };

    let agent_socket = match string("agentSocket")? {
        None => PathBuf::from(DEFAULT_AGENT_SOCKET),
        // Relative paths would resolve against whatever directory the runtime runs us in.
        Some(s) if !s.starts_with('/') => return Err(invalid("agentSocket", format!("{s:?} is not an absolute path"))),
        Some(s) => PathBuf::from(s),
    };

    let timeout_seconds = match obj.get("timeoutSeconds") {
        None | Some(Value::Null) => DEFAULT_TIMEOUT_SECONDS,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(t) if (1..=MAX_TIMEOUT_SECONDS).contains(&t) => t,
            _ => {
                return Err(invalid(
                    "timeoutSeconds",
                    format!("{n} is not a whole number of seconds from 1 to {MAX_TIMEOUT_SECONDS}"),
                ))
            }
        },
        Some(_) => return Err(decode_err("timeoutSeconds", "must be a number")),
    };

    let prev_result = match obj.get("prevResult") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m.clone()),
        Some(_) => return Err(decode_err("prevResult", "must be a JSON object (a CNI result)")),
    };

    Ok(NetConf { cni_version, name, agent_socket, timeout: Duration::from_secs(timeout_seconds), prev_result })
}

/// The pod identity from CNI_ARGS (`K=V;K=V`), as Kubernetes runtimes set it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodArgs {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub infra_container_id: Option<String>,
    /// Accepted (containerd and CRI-O pass it) but not forwarded: the agent keys pods by name.
    pub uid: Option<String>,
}

fn args_err(msg: String) -> CniError {
    CniError::new(
        error::INVALID_ENV,
        msg,
        "CNI_ARGS is KEY=VALUE pairs separated by ';'; known keys: IgnoreUnknown, K8S_POD_NAMESPACE, K8S_POD_NAME, \
         K8S_POD_INFRA_CONTAINER_ID, K8S_POD_UID",
    )
}

/// Parses CNI_ARGS with the reference library's rules (`types.LoadArgs` with `CommonArgs`):
/// unknown keys are an error unless `IgnoreUnknown` is `1`/`true` (case-insensitive) anywhere
/// in the list. Unlike the reference, empty segments (a trailing `;`) are skipped: they carry
/// nothing and some runtimes emit them.
pub fn parse_cni_args(s: &str) -> Result<PodArgs, CniError> {
    let mut out = PodArgs::default();
    let mut ignore_unknown = false;
    let mut unknown = Vec::new();
    for pair in s.split(';').filter(|p| !p.is_empty()) {
        let mut kv = pair.split('=');
        let (Some(key), Some(value), None) = (kv.next(), kv.next(), kv.next()) else {
            return Err(args_err(format!("CNI_ARGS: invalid pair {pair:?} (want exactly one '=')")));
        };
        let value = value.to_owned();
        match key {
            "IgnoreUnknown" => {
                ignore_unknown = match value.to_ascii_lowercase().as_str() {
                    "1" | "true" => true,
                    "0" | "false" => false,
                    _ => {
                        return Err(args_err(format!(
                            "CNI_ARGS: key IgnoreUnknown: {value:?} is not a boolean (1, true, 0, false)"
                        )))
                    }
                }
            }
            "K8S_POD_NAMESPACE" => out.namespace = Some(value),
            "K8S_POD_NAME" => out.name = Some(value),
            "K8S_POD_INFRA_CONTAINER_ID" => out.infra_container_id = Some(value),
            "K8S_POD_UID" => out.uid = Some(value),
            _ => unknown.push(key.to_owned()),
        }
    }
    if !unknown.is_empty() && !ignore_unknown {
        return Err(args_err(format!("CNI_ARGS: unknown keys {unknown:?} (add IgnoreUnknown=1 to allow them)")));
    }
    Ok(out)
}

/// Checks an interface name as the kernel and the reference library do — 1 to 15 bytes, not
/// `.` or `..`, no `/`, `:` or whitespace — and as the agent does: printable ASCII only (the
/// workspace's one rule, [`netif::check_ifname`]; a name the agent would refuse is refused
/// here, before anything is sent).
pub fn check_ifname(name: &str) -> Result<(), String> {
    use netif::IfNameError as E;
    match netif::check_ifname(name) {
        Ok(()) => Ok(()),
        Err(E::Empty) => Err("is empty".into()),
        Err(E::TooLong) => Err(format!("{name:?} is longer than 15 bytes")),
        Err(E::Reserved) => Err(format!("{name:?} is not a name")),
        Err(E::Separator) => Err(format!("{name:?} contains '/', ':' or whitespace")),
        Err(E::NotPrintable) => Err(format!("{name:?} contains a character that is not printable ASCII")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_defaults_and_fields() {
        let c = parse(br#"{"cniVersion":"1.0.0","name":"sdn-node","type":"sdn-node-cni"}"#).unwrap();
        assert_eq!(c.agent_socket, PathBuf::from(DEFAULT_AGENT_SOCKET));
        assert_eq!(c.timeout, Duration::from_secs(30));
        assert!(c.prev_result.is_none());
        let c = parse(
            br#"{"cniVersion":"0.4.0","name":"n","agentSocket":"/tmp/a.sock","timeoutSeconds":1,"prevResult":{"ips":[]},"x":[1]}"#,
        )
        .unwrap();
        assert_eq!((c.cni_version.as_str(), c.timeout), ("0.4.0", Duration::from_secs(1)));
        assert_eq!(c.agent_socket, PathBuf::from("/tmp/a.sock"));
        assert!(c.prev_result.is_some());
    }

    #[test]
    fn rejects_with_code_and_field() {
        let cases: &[(&[u8], u32, &str)] = &[
            (b"", 6, "not valid JSON"),
            (b"{", 6, "not valid JSON"),
            (b"[1]", 6, "top level"),
            (br#"{"cniVersion":1,"name":"n"}"#, 6, "cniVersion"),
            (br#"{"name":"n"}"#, 1, "cniVersion: missing"),
            (br#"{"cniVersion":"0.2.0","name":"n"}"#, 1, "\"0.2.0\" is not supported"),
            (br#"{"cniVersion":"1.1.0","name":"n"}"#, 1, "cniVersion"),
            (br#"{"cniVersion":"1.0.0"}"#, 7, "field name: missing"),
            (br#"{"cniVersion":"1.0.0","name":"a b"}"#, 7, "field name"),
            (br#"{"cniVersion":"1.0.0","name":"n","agentSocket":"rel.sock"}"#, 7, "agentSocket"),
            (br#"{"cniVersion":"1.0.0","name":"n","agentSocket":5}"#, 6, "agentSocket"),
            (br#"{"cniVersion":"1.0.0","name":"n","timeoutSeconds":0}"#, 7, "timeoutSeconds"),
            (br#"{"cniVersion":"1.0.0","name":"n","timeoutSeconds":1.5}"#, 7, "timeoutSeconds"),
            (br#"{"cniVersion":"1.0.0","name":"n","timeoutSeconds":-3}"#, 7, "timeoutSeconds"),
            (br#"{"cniVersion":"1.0.0","name":"n","timeoutSeconds":"5"}"#, 6, "timeoutSeconds"),
            (br#"{"cniVersion":"1.0.0","name":"n","prevResult":[]}"#, 6, "prevResult"),
        ];
        for (input, code, needle) in cases {
            let e = parse(input).unwrap_err();
            assert_eq!(e.code, *code, "{}: {e}", String::from_utf8_lossy(input));
            assert!(e.msg.contains(needle), "{}: {e}", String::from_utf8_lossy(input));
        }
    }

    #[test]
    fn output_version_falls_back() {
        assert_eq!(output_version(br#"{"cniVersion":"0.4.0"}"#), "0.4.0");
        assert_eq!(output_version(br#"{"cniVersion":"9.9.9"}"#), "1.0.0");
        assert_eq!(output_version(b"junk"), "1.0.0");
    }

    #[test]
    fn cni_args() {
        let a =
            parse_cni_args("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=abc;X=y;")
                .unwrap();
        assert_eq!(a.namespace.as_deref(), Some("ns"));
        assert_eq!(a.name.as_deref(), Some("p"));
        assert_eq!(a.infra_container_id.as_deref(), Some("abc"));
        assert_eq!(parse_cni_args("").unwrap(), PodArgs::default());
        // IgnoreUnknown may come after the unknown key.
        assert!(parse_cni_args("X=y;IgnoreUnknown=TRUE").is_ok());
        let e = parse_cni_args("K8S_POD_NAME=p;X=y").unwrap_err();
        assert_eq!(e.code, 4);
        assert!(e.msg.contains("unknown keys [\"X\"]"), "{e}");
        assert!(parse_cni_args("X=y;IgnoreUnknown=0").is_err());
        assert!(parse_cni_args("IgnoreUnknown=yes").unwrap_err().msg.contains("IgnoreUnknown"));
        assert!(parse_cni_args("novalue").unwrap_err().msg.contains("invalid pair"));
        assert!(parse_cni_args("a=b=c").unwrap_err().msg.contains("invalid pair"));
    }

    #[test]
    fn names() {
        assert!(valid_name("abc-1.2_3"));
        assert!(!valid_name(""));
        assert!(!valid_name("-a"));
        assert!(!valid_name("a/b"));
        assert!(check_ifname("eth0").is_ok());
        assert!(check_ifname("").is_err());
        assert!(check_ifname("0123456789abcdef").is_err());
        assert!(check_ifname("..").is_err());
        assert!(check_ifname("a:b").is_err());
        assert!(check_ifname("a b").is_err());
    }
}
