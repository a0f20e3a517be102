//! One plugin invocation: environment and stdin in, stdout text and exit code out.
//!
//! Kept free of process globals (the environment is a function, stdin a reader) so the whole
//! protocol is testable in-process; `main` only wires it to the real process.

use std::ffi::OsString;
use std::io::Read;
use std::path::Path;

use serde_json::json;

use crate::agent::{self, ExchangeError, Request};
use crate::config::{self, NetConf, SUPPORTED_VERSIONS};
use crate::error::{self, CniError};
use crate::result;

/// The agent's endpoint for CNI commands.
pub const AGENT_URI: &str = "/v1/cni";
/// Stdin beyond this is not a network configuration (they are a few KiB).
const MAX_STDIN_BYTES: u64 = 16 << 20;

/// What the process prints on stdout and exits with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub stdout: String,
    pub exit_code: i32,
}

impl Outcome {
    fn ok(stdout: String) -> Outcome {
        Outcome { stdout, exit_code: 0 }
    }
    fn err(e: &CniError, cni_version: &str) -> Outcome {
        Outcome { stdout: e.to_json(cni_version) + "\n", exit_code: 1 }
    }
}

/// The VERSION answer.
pub fn version_json() -> String {
    let v = json!({"cniVersion": config::LATEST_VERSION, "supportedVersions": SUPPORTED_VERSIONS});
    serde_json::to_string(&v).unwrap_or_default() + "\n"
}

fn env_err(msg: String) -> CniError {
    CniError::new(
        error::INVALID_ENV,
        msg,
        format!(
            "sdn-node-cni {} is a CNI plugin: it is run by a container runtime with CNI_COMMAND, CNI_CONTAINERID, \
             CNI_NETNS, CNI_IFNAME, CNI_PATH and CNI_ARGS set (CNI protocol versions supported: {})",
            env!("CARGO_PKG_VERSION"),
            SUPPORTED_VERSIONS.join(", ")
        ),
    )
}

/// Runs one invocation. `getenv` reads the process environment; `stdin` is read only for
/// ADD, CHECK and DEL (VERSION ignores it, as the reference skeleton does).
pub fn run(getenv: &dyn Fn(&str) -> Option<OsString>, stdin: &mut dyn Read) -> Outcome {
    // Non-UTF-8 values cannot go into the JSON request, so they count as invalid.
    let var = |name: &str| -> Result<String, CniError> {
        match getenv(name) {
            None => Ok(String::new()),
            Some(v) => v.into_string().map_err(|_| env_err(format!("env variable {name}: not valid UTF-8"))),
        }
    };
    let command = match var("CNI_COMMAND") {
        Ok(c) => c,
        Err(e) => return Outcome::err(&e, config::LATEST_VERSION),
    };
    match command.as_str() {
        "VERSION" => return Outcome::ok(version_json()),
        "ADD" | "DEL" | "CHECK" => {}
        "" => {
            return Outcome::err(
                &env_err("required env variables [CNI_COMMAND] missing".into()),
                config::LATEST_VERSION,
            )
        }
        other => {
            return Outcome::err(
                &env_err(format!(
                    "env variable CNI_COMMAND: unknown command {other:?} (want ADD, DEL, CHECK or VERSION)"
                )),
                config::LATEST_VERSION,
            )
        }
    }

    let mut input = Vec::new();
    if let Err(e) = stdin.take(MAX_STDIN_BYTES + 1).read_to_end(&mut input) {
        let e = CniError::new(error::IO_FAILURE, format!("network config (stdin): read failed: {e}"), "");
        return Outcome::err(&e, config::LATEST_VERSION);
    }
    let out_version = config::output_version(&input);
    if input.len() as u64 > MAX_STDIN_BYTES {
        let e = CniError::new(
            error::DECODING_FAILURE,
            format!("network config (stdin): longer than {MAX_STDIN_BYTES} bytes"),
            "",
        );
        return Outcome::err(&e, out_version);
    }
    match invoke(&command, &var, &input) {
        Ok(stdout) => Outcome::ok(stdout),
        Err(e) => Outcome::err(&e, out_version),
    }
}

fn invoke(command: &str, var: &dyn Fn(&str) -> Result<String, CniError>, input: &[u8]) -> Result<String, CniError> {
    let container_id = var("CNI_CONTAINERID")?;
    let netns = var("CNI_NETNS")?;
    let if_name = var("CNI_IFNAME")?;
    let cni_path = var("CNI_PATH")?;
    let cni_args = var("CNI_ARGS")?;
    // As the reference skeleton: all are needed except CNI_NETNS on DEL (the namespace may
    // be gone) and CNI_ARGS. CNI_PATH is unused here but its absence means a broken runtime.
    let mut missing = Vec::new();
    for (name, value, required) in [
        ("CNI_CONTAINERID", &container_id, true),
        ("CNI_NETNS", &netns, command != "DEL"),
        ("CNI_IFNAME", &if_name, true),
        ("CNI_PATH", &cni_path, true),
    ] {
        if required && value.is_empty() {
            missing.push(name);
        }
    }
    if !missing.is_empty() {
        return Err(env_err(format!("required env variables [{}] missing", missing.join(","))));
    }

    let conf = config::parse(input)?;
    if command == "CHECK" && !config::has_check(&conf.cni_version) {
        return Err(CniError::new(
            error::INCOMPATIBLE_VERSION,
            format!("network config field cniVersion: {:?} does not allow CHECK", conf.cni_version),
            "CHECK was added in CNI 0.4.0",
        ));
    }
    if !config::valid_name(&container_id) {
        return Err(env_err(format!(
            "env variable CNI_CONTAINERID: {container_id:?} has characters other than [a-zA-Z0-9_.-] or does not start alphanumeric"
        )));
    }
    config::check_ifname(&if_name).map_err(|e| env_err(format!("env variable CNI_IFNAME: {e}")))?;
    let pod = config::parse_cni_args(&cni_args)?;

    // Whose pod: CNI_ARGS under Kubernetes; otherwise the network config's namespace and the
    // container's name or ID (config::identity). A Kubernetes DEL may come without CNI_ARGS:
    // the agent then finds the pod by its container ID. So does a non-Kubernetes DEL, sent
    // without a name: the container's is the same as at ADD, but the config's namespace may
    // have been edited since, and the container ID alone says which pod it was.
    let (namespace, name) = if command == "DEL" && pod.namespace.as_deref().unwrap_or_default().is_empty() {
        (String::new(), String::new())
    } else {
        let id = config::identity(&pod, &conf, &container_id, command)?;
        (id.namespace, id.name)
    };
    let object = if namespace.is_empty() && name.is_empty() {
        format!("container {container_id}")
    } else {
        format!("pod {namespace}/{name}")
    };
    if command == "CHECK" {
        if let Some(prev) = &conf.prev_result {
            result::check_prev_result(prev, &if_name)
                .map_err(|e| CniError { msg: format!("{object}: {}", e.msg), ..e })?;
        }
    }

    let req = Request {
        command: command.to_owned(),
        // Under CRI the sandbox (infra) container is the one CNI is called for, so its ID is
        // the right default when the runtime does not pass K8S_POD_INFRA_CONTAINER_ID.
        infra_container_id: pod.infra_container_id.filter(|s| !s.is_empty()).unwrap_or_else(|| container_id.clone()),
        container_id,
        netns: netns.clone(),
        if_name: if_name.clone(),
        namespace,
        name,
        cni_version: conf.cni_version.clone(),
    };
    let reply = ask_agent(&conf, &req, &object)?;
    match command {
        "ADD" => {
            let r = result::parse_add_reply(&reply.body, &object, &if_name, &netns)?;
            let v = result::format_result(&r, &conf.cni_version);
            Ok(serde_json::to_string_pretty(&v).unwrap_or_default() + "\n")
        }
        // DEL and CHECK print nothing on success.
        _ => Ok(String::new()),
    }
}

/// Sends the request and turns every failure into a CNI error (the table is in the crate
/// docs). DEL's 404 is a success: DEL must be idempotent, and an unknown pod is already gone.
fn ask_agent(conf: &NetConf, req: &Request, object: &str) -> Result<agent::Reply, CniError> {
    let socket = conf.agent_socket.as_path();
    let body = serde_json::to_vec(req).unwrap_or_default();
    let what = format!("{} of {object} (container {})", req.command, req.container_id);
    let reply = agent::post(socket, AGENT_URI, &body, conf.timeout).map_err(|e| exchange_error(e, socket, &what))?;
    let status = reply.status;
    if (200..300).contains(&status) || (status == 404 && req.command == "DEL") {
        return Ok(reply);
    }
    let (code, kind) = match status {
        400 | 422 => (error::INVALID_CONFIG, "rejected the request"),
        404 => (error::UNKNOWN_CONTAINER, "does not know the pod"),
        409 => (error::AGENT_CONFLICT, "found a conflict"),
        429 | 503 | 504 => (error::TRY_AGAIN_LATER, "is not ready"),
        500 => (error::AGENT_FAILED, "failed"),
        _ => (error::AGENT_UNEXPECTED_STATUS, "answered with an unexpected status"),
    };
    Err(CniError::new(
        code,
        agent_message(&reply.body, object),
        format!("sdn-node agent at {} {kind} (HTTP {status}) for {what}", socket.display()),
    ))
}

/// The message of an agent error body (`{"error","object","field"}`), made to name the object
/// and field even when the agent's own text does not.
fn agent_message(body: &[u8], fallback_object: &str) -> String {
    #[derive(serde::Deserialize)]
    struct ErrorBody {
        #[serde(default)]
        error: String,
        #[serde(default)]
        object: String,
        #[serde(default)]
        field: String,
    }
    let Ok(b) = serde_json::from_slice::<ErrorBody>(body) else {
        let text = String::from_utf8_lossy(body);
        let text: String = text.trim().chars().take(500).collect();
        return if text.is_empty() {
            format!("{fallback_object}: the agent gave no reason")
        } else {
            format!("{fallback_object}: {text}")
        };
    };
    let object = if b.object.is_empty() { fallback_object } else { &b.object };
    let error = if b.error.is_empty() { "the agent gave no reason" } else { &b.error };
    // The agent's text often already reads "pod ns/name: field f: message".
    let mut msg = String::new();
    if !error.contains(object) {
        msg.push_str(object);
        msg.push_str(": ");
    }
    if !b.field.is_empty() && !error.contains(&b.field) {
        msg.push_str("field ");
        msg.push_str(&b.field);
        msg.push_str(": ");
    }
    msg.push_str(error);
    msg
}

fn exchange_error(e: ExchangeError, socket: &Path, what: &str) -> CniError {
    use std::io::ErrorKind as K;
    let agent = format!("sdn-node agent at {}", socket.display());
    match &e {
        ExchangeError::Connect { source, .. } => {
            let (code, hint) = match source.kind() {
                K::PermissionDenied => (error::IO_FAILURE, "the plugin must run as root (the socket is mode 0600)"),
                // ENAMETOOLONG and the like: the path in the config cannot be a unix socket.
                K::InvalidInput => (error::INVALID_CONFIG, "check agentSocket in the .conflist"),
                _ => (error::TRY_AGAIN_LATER, "is `sdn-node run` up on this node?"),
            };
            CniError::new(code, format!("{what}: {agent} unreachable: {source}"), hint)
        }
        ExchangeError::Timeout { .. } => CniError::new(
            error::TRY_AGAIN_LATER,
            format!("{what}: {agent}: {e}"),
            "the agent is busy or stuck; the runtime will retry (timeoutSeconds in the .conflist sets the deadline)",
        ),
        ExchangeError::Io { source, .. } => {
            let code = match source.kind() {
                K::BrokenPipe | K::ConnectionReset | K::ConnectionAborted | K::UnexpectedEof => error::TRY_AGAIN_LATER,
                _ => error::IO_FAILURE,
            };
            CniError::new(code, format!("{what}: {agent}: {e}"), "the agent closed the connection (restarting?)")
        }
        ExchangeError::Malformed(_) => CniError::new(
            error::AGENT_BAD_REPLY,
            format!("{what}: {agent}: {e}"),
            "is agentSocket the sdn-node agent's socket?",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn run_with(env: &[(&str, &str)], stdin: &str) -> Outcome {
        let map: HashMap<String, OsString> = env.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
        run(&|k| map.get(k).cloned(), &mut stdin.as_bytes())
    }

    fn parse(o: &Outcome) -> serde_json::Value {
        serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", o.stdout))
    }

    const CONF: &str =
        r#"{"cniVersion":"0.4.0","name":"sdn-node","type":"sdn-node-cni","agentSocket":"/nonexistent/sdn.sock"}"#;
    const BASE: &[(&str, &str)] = &[
        ("CNI_CONTAINERID", "abc"),
        ("CNI_NETNS", "/var/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        ("CNI_ARGS", "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p"),
    ];

    fn env(cmd: &str, skip: &str) -> Vec<(&'static str, &'static str)> {
        let cmd: &'static str = Box::leak(cmd.to_owned().into_boxed_str());
        let mut v: Vec<_> = BASE.iter().copied().filter(|(k, _)| *k != skip).collect();
        v.push(("CNI_COMMAND", cmd));
        v
    }

    #[test]
    fn version() {
        let o = run_with(&[("CNI_COMMAND", "VERSION")], "");
        assert_eq!(o.exit_code, 0);
        assert_eq!(parse(&o), json!({"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}));
    }

    #[test]
    fn env_errors() {
        let o = run_with(&[], "");
        assert_eq!((o.exit_code, parse(&o)["code"].clone()), (1, json!(4)));
        let o = run_with(&[("CNI_COMMAND", "FOO")], "");
        assert!(parse(&o)["msg"].as_str().unwrap().contains("\"FOO\""));
        let o = run_with(&env("ADD", "CNI_NETNS"), CONF);
        let v = parse(&o);
        assert_eq!((v["code"].clone(), v["cniVersion"].clone()), (json!(4), json!("0.4.0")));
        assert!(v["msg"].as_str().unwrap().contains("[CNI_NETNS]"), "{v}");
        assert!(v["details"].as_str().unwrap().contains("CNI plugin"), "{v}");
        // No CNI_ARGS (a runtime that is not Kubernetes): the pod is default/<container ID>,
        // and the request goes to the agent (absent here).
        let o = run_with(&env("ADD", "CNI_ARGS"), CONF);
        let v = parse(&o);
        assert_eq!(v["code"], 11, "{v}");
        assert!(v["msg"].as_str().unwrap().contains("ADD of pod default/abc"), "{v}");
        // A container ID that cannot be a pod name, and no name: the error says so.
        let mut e = env("ADD", "CNI_ARGS");
        e.retain(|(k, _)| *k != "CNI_CONTAINERID");
        e.push(("CNI_CONTAINERID", "Not_A_Name"));
        let v = parse(&run_with(&e, CONF));
        assert_eq!(v["code"], 4, "{v}");
        let msg = v["msg"].as_str().unwrap();
        assert!(msg.contains("no pod name") && msg.contains("CNI_CONTAINERID") && msg.contains("K8S_POD_NAME"), "{v}");
        // DEL of such a container goes unnamed: the agent finds it by its container ID.
        let o = run_with(&env("DEL", "CNI_ARGS"), CONF);
        assert!(parse(&o)["msg"].as_str().unwrap().contains("DEL of container abc"), "{}", o.stdout);
        let mut e = env("ADD", "CNI_IFNAME");
        e.push(("CNI_IFNAME", "a/b"));
        assert!(parse(&run_with(&e, CONF))["msg"].as_str().unwrap().contains("CNI_IFNAME"));
        let mut e = env("ADD", "CNI_CONTAINERID");
        e.push(("CNI_CONTAINERID", "../x"));
        assert!(parse(&run_with(&e, CONF))["msg"].as_str().unwrap().contains("CNI_CONTAINERID"));
    }

    #[test]
    fn non_utf8_env_is_an_error() {
        use std::os::unix::ffi::OsStringExt;
        let o = run(
            &|k| match k {
                "CNI_COMMAND" => Some("ADD".into()),
                _ => Some(OsString::from_vec(vec![0xff])),
            },
            &mut CONF.as_bytes(),
        );
        let v = parse(&o);
        assert_eq!(v["code"], 4);
        assert!(v["msg"].as_str().unwrap().contains("not valid UTF-8"), "{v}");
    }

    #[test]
    fn config_errors_use_their_codes() {
        assert_eq!(parse(&run_with(&env("ADD", ""), "not json"))["code"], 6);
        let o = run_with(&env("ADD", ""), r#"{"cniVersion":"0.2.0","name":"n"}"#);
        assert_eq!(parse(&o)["code"], 1);
        assert_eq!(parse(&o)["cniVersion"], "1.0.0");
        let o = run_with(&env("CHECK", ""), r#"{"cniVersion":"0.3.1","name":"n"}"#);
        assert_eq!(parse(&o)["code"], 1);
        assert!(parse(&o)["msg"].as_str().unwrap().contains("CHECK"));
    }

    #[test]
    fn missing_agent_is_try_again_later_even_for_del_without_netns() {
        let o = run_with(&env("DEL", "CNI_NETNS"), CONF);
        let v = parse(&o);
        assert_eq!((o.exit_code, v["code"].clone()), (1, json!(11)), "{v}");
        assert!(v["msg"].as_str().unwrap().contains("pod ns/p"), "{v}");
        assert!(v["msg"].as_str().unwrap().contains("/nonexistent/sdn.sock"), "{v}");
    }

    /// Mangled stdin, CNI_ARGS and agent replies never panic: every input is the runtime's or
    /// the agent's, and a panic would print no CNI error at all.
    #[test]
    fn mangled_inputs_do_not_panic() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let reply = br#"{"hostVeth":"veth1","ifName":"eth0","mac":"0a:58:0a:80:00:05","sandbox":"/n","ip":"10.128.0.5/23","gateway":"10.128.0.1","routes":[{"dst":"0.0.0.0/0","gw":"10.128.0.1"}],"mtu":1450}"#;
        let conf = br#"{"cniVersion":"0.4.0","name":"n","agentSocket":"/nonexistent/s","timeoutSeconds":1,"prevResult":{"interfaces":[{"name":"eth0","sandbox":"/n"}]}}"#;
        let args = b"IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=abc";
        let alphabet = b"{}[]\":,0123456789./-=;aeE \\\x00\xff";
        let mut mangle = |src: &[u8]| {
            let mut b = src.to_vec();
            for _ in 0..(1 + rnd() % 4) {
                if b.is_empty() {
                    break;
                }
                let i = (rnd() as usize) % b.len();
                match rnd() % 3 {
                    0 => b[i] = alphabet[(rnd() as usize) % alphabet.len()],
                    1 => drop(b.remove(i)),
                    _ => b.insert(i, alphabet[(rnd() as usize) % alphabet.len()]),
                }
            }
            b
        };
        for _ in 0..3000 {
            let r = mangle(reply);
            let _ = result::parse_add_reply(&r, "pod a/b", "eth0", "/n").map(|a| result::format_result(&a, "0.4.0"));
            let c = mangle(conf);
            if let Ok(parsed) = config::parse(&c) {
                if let Some(prev) = &parsed.prev_result {
                    let _ = result::check_prev_result(prev, "eth0");
                }
            }
            let a = String::from_utf8_lossy(&mangle(args)).into_owned();
            let _ = config::parse_cni_args(&a);
            let _ = agent_message(&r, "pod a/b");
        }
        // A few whole invocations (each fails fast: the socket does not exist).
        for _ in 0..50 {
            let c = String::from_utf8_lossy(&mangle(conf)).into_owned();
            let o = run_with(&env("CHECK", ""), &c);
            assert_eq!(o.exit_code, 1);
            assert!(parse(&o)["code"].as_u64().is_some());
        }
    }

    #[test]
    fn agent_messages() {
        let m = agent_message(br#"{"error":"bad","object":"pod a/b","field":"ip"}"#, "pod x/y");
        assert_eq!(m, "pod a/b: field ip: bad");
        let m = agent_message(br#"{"error":"pod a/b: field ip: bad","object":"pod a/b","field":"ip"}"#, "pod x/y");
        assert_eq!(m, "pod a/b: field ip: bad");
        assert_eq!(agent_message(b"", "pod x/y"), "pod x/y: the agent gave no reason");
        assert_eq!(agent_message(b"oops\n", "pod x/y"), "pod x/y: oops");
        assert_eq!(agent_message(br#"{"error":"gone"}"#, "pod x/y"), "pod x/y: gone");
    }
}
