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
    /// The namespace (VNID, policies) of containers whose runtime sends no
    /// `K8S_POD_NAMESPACE` (podman, nerdctl): key `namespace`, [`DEFAULT_NAMESPACE`] when absent.
    pub namespace: String,
}

/// The namespace of non-Kubernetes containers when the network config names none.
pub const DEFAULT_NAMESPACE: &str = "default";
/// How many characters of a hex container ID make a pod name (as podman, Docker and nerdctl
/// show IDs): 48 bits, and a clash is the agent's 409, never two containers sharing a pod.
pub const SHORT_ID_LEN: usize = 12;

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

    let namespace = match string("namespace")? {
        None => DEFAULT_NAMESPACE.to_owned(),
        Some(n) if !dns1123_label(n) => {
            return Err(invalid(
                "namespace",
                format!("{n:?} is not a namespace name (a DNS-1123 label: [a-z0-9-], at most 63, alphanumeric at both ends)"),
            ))
        }
        Some(n) => n.to_owned(),
    };

    Ok(NetConf {
        cni_version,
        name,
        agent_socket,
        timeout: Duration::from_secs(timeout_seconds),
        prev_result,
        namespace,
    })
}

/// A DNS-1123 label: what a namespace name is (the agent applies the same rule).
pub fn dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain: what a pod name is (the agent applies the same rule).
pub fn dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(dns1123_label)
}

/// Whose request this is: the pod's namespace and name as the agent keys it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub namespace: String,
    pub name: String,
    /// True when CNI_ARGS named no namespace (podman, nerdctl, any non-Kubernetes runtime).
    pub standalone: bool,
}

/// The pod a request is for. Under Kubernetes (`K8S_POD_NAMESPACE` given) CNI_ARGS says it,
/// as always; both keys are then needed for ADD and CHECK and go to the agent as they are.
/// Otherwise (a runtime that is not Kubernetes) the namespace is the network config's
/// (`namespace`, default `default`) and the name is `K8S_POD_NAME` when it is a DNS-1123
/// subdomain (podman puts the container's name there), else the container ID: its first 12
/// characters when it is longer and hexadecimal (podman's, Docker's and nerdctl's short ID),
/// else the whole ID if it is a usable name. `command` only shapes the error.
pub fn identity(pod: &PodArgs, conf: &NetConf, container_id: &str, command: &str) -> Result<Identity, CniError> {
    let namespace = pod.namespace.clone().unwrap_or_default();
    let name = pod.name.clone().unwrap_or_default();
    if !namespace.is_empty() {
        if name.is_empty() && command != "DEL" {
            return Err(args_err(format!(
                "env variable CNI_ARGS: container {container_id}: [K8S_POD_NAME] missing (the pod this sandbox is for; \
                 K8S_POD_NAMESPACE={namespace} is given)"
            )));
        }
        return Ok(Identity { namespace, name, standalone: false });
    }
    if dns1123_subdomain(&name) {
        return Ok(Identity { namespace: conf.namespace.clone(), name, standalone: true });
    }
    let hex = container_id.len() > SHORT_ID_LEN && container_id.bytes().all(|b| b.is_ascii_hexdigit());
    let from_id = if hex { &container_id[..SHORT_ID_LEN] } else { container_id };
    if dns1123_subdomain(from_id) {
        return Ok(Identity { namespace: conf.namespace.clone(), name: from_id.to_owned(), standalone: true });
    }
    let given = if name.is_empty() { "no K8S_POD_NAME".to_owned() } else { format!("K8S_POD_NAME {name:?} is not a DNS-1123 subdomain") };
    Err(args_err(format!(
        "env variable CNI_ARGS: container {container_id}: no pod name: [K8S_POD_NAMESPACE] missing, {given}, and \
         CNI_CONTAINERID {container_id:?} is not one either (lowercase [a-z0-9.-], or hexadecimal)"
    )))
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

    fn conf(extra: &str) -> Result<NetConf, CniError> {
        parse(format!(r#"{{"cniVersion":"1.0.0","name":"n"{extra}}}"#).as_bytes())
    }

    #[test]
    fn namespace_of_the_network() {
        assert_eq!(conf("").unwrap().namespace, "default");
        assert_eq!(conf(r#","namespace":"team-a""#).unwrap().namespace, "team-a");
        assert_eq!(conf(r#","namespace":null"#).unwrap().namespace, "default");
        for (bad, code) in [(r#","namespace":"Team_A""#, 7), (r#","namespace":"""#, 7), (r#","namespace":"-a""#, 7), (r#","namespace":3"#, 6)] {
            let e = conf(bad).unwrap_err();
            assert_eq!(e.code, code, "{bad}: {e}");
            assert!(e.msg.contains("field namespace"), "{bad}: {e}");
        }
        let long = format!(r#","namespace":"{}""#, "a".repeat(64));
        assert!(conf(&long).unwrap_err().msg.contains("namespace"));
    }

    fn who(args: &str, ns_conf: &str, id: &str, command: &str) -> Result<(String, String, bool), String> {
        let c = conf(ns_conf).unwrap();
        identity(&parse_cni_args(args).unwrap(), &c, id, command)
            .map(|i| (i.namespace, i.name, i.standalone))
            .map_err(|e| format!("{} {}", e.code, e.msg))
    }

    #[test]
    fn identity_under_kubernetes_and_without() {
        let id = "04e97267aae6c4fc012009f4bd6ac26a9d294567f1b731bc4571a461e2cd12c3";
        let team_a = r#","namespace":"team-a""#;
        let t = |a: &str, b: &str, s: bool| Ok((a.to_owned(), b.to_owned(), s));
        // Kubernetes: CNI_ARGS wins over the config's namespace.
        assert_eq!(who("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p", team_a, id, "ADD"), t("ns", "p", false));
        // podman 4.3 sends exactly this: the container's name, no namespace.
        assert_eq!(who("IgnoreUnknown=1;K8S_POD_NAME=web1", team_a, id, "ADD"), t("team-a", "web1", true));
        assert_eq!(who("IgnoreUnknown=1;K8S_POD_NAME=web1", "", id, "CHECK"), t("default", "web1", true));
        // A container name that is no pod name (podman's generated ones have '_'): the short ID.
        assert_eq!(who("IgnoreUnknown=1;K8S_POD_NAME=Probe_1", team_a, id, "ADD"), t("team-a", "04e97267aae6", true));
        // No CNI_ARGS at all (nerdctl-like).
        assert_eq!(who("", "", id, "ADD"), t("default", "04e97267aae6", true));
        // A short or non-hex ID that is a name is used whole.
        assert_eq!(who("", "", "abc", "ADD"), t("default", "abc", true));
        assert_eq!(who("", "", "ctr-7.x", "ADD"), t("default", "ctr-7.x", true));
        // Neither usable: named.
        let e = who("K8S_POD_NAME=A_b", "", "Ctr_1", "ADD").unwrap_err();
        assert!(e.starts_with("4 ") && e.contains("\"A_b\"") && e.contains("CNI_CONTAINERID \"Ctr_1\""), "{e}");
        let e = who("", "", &"A".repeat(70), "ADD").unwrap_err();
        assert!(e.contains("no K8S_POD_NAME"), "{e}");
        // A namespace without a name is still Kubernetes' and still an error for ADD.
        let e = who("K8S_POD_NAMESPACE=ns", team_a, id, "ADD").unwrap_err();
        assert!(e.contains("[K8S_POD_NAME] missing"), "{e}");
        assert_eq!(who("K8S_POD_NAMESPACE=ns", team_a, id, "DEL"), t("ns", "", false));
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
