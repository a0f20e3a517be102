//! The CNI request path end to end, minus the kernel: the plugin (`sdn-node-cni`'s `run`, with
//! the runtime's environment and network configuration from the input) talks HTTP over a real
//! unix socket to a stand-in agent that answers with bytes from the input; whatever the plugin
//! sent is then taken apart as the agent does — headers (the caller's deadline), the JSON body
//! into `CniRequest`, `validate`, and the sandbox path through `Netns::open_sandbox`'s checks
//! (side-effect free: an `O_PATH` lookup, `stat`, and a real open only of an nsfs file).
//!
//! Input: NUL-separated fields `command, CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_PATH,
//! CNI_ARGS, stdin, reply`; the command's first byte 0..=3 picks ADD, DEL, CHECK, VERSION,
//! anything else is used as the command itself. A network configuration that is a JSON object
//! gets `agentSocket` pointed at the stand-in (and `timeoutSeconds: 1`), so the fuzzer never
//! talks to a real socket; its raw bytes are also parsed as they came.
//!
//! Checked: no panic; the plugin exits 0 or 1 and prints JSON (an error object with a code
//! and a message on 1; nothing for DEL/CHECK success); every request the plugin sends is a
//! `POST /v1/cni` with a deadline header that the agent's parser accepts and a body the agent
//! deserializes (plugin and agent agree on the wire); the agent's refusals name a field; a
//! refused sandbox path is named in its message.

#![no_main]

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// The stand-in agent: one thread answering each connection with the current reply and
/// handing what it received to the fuzz loop.
struct Agent {
    socket: PathBuf,
    reply: Mutex<Vec<u8>>,
    received: Mutex<mpsc::Receiver<Vec<u8>>>,
}

fn agent() -> &'static Agent {
    static AGENT: OnceLock<&'static Agent> = OnceLock::new();
    AGENT.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("cni-request-fuzz-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("agent.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let (tx, rx) = mpsc::channel();
        let agent: &'static Agent =
            Box::leak(Box::new(Agent { socket, reply: Mutex::new(Vec::new()), received: Mutex::new(rx) }));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut c) = conn else { continue };
                let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                // Handed over before the answer: once the plugin returns, it is there.
                let _ = tx.send(read_request(&mut c));
                let reply = agent.reply.lock().unwrap().clone();
                let _ = c.write_all(&reply);
            }
        });
        agent
    })
}

/// Reads one request: headers, then Content-Length bytes of body.
fn read_request(c: &mut impl Read) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return buf;
            }
        }
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => return buf,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Splits a request into (request line, headers, body).
fn split(req: &[u8]) -> Option<(String, axum::http::HeaderMap, Vec<u8>)> {
    let end = req.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&req[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let first = lines.next()?.to_string();
    let mut headers = axum::http::HeaderMap::new();
    for l in lines {
        let (k, v) = l.split_once(':')?;
        headers.append(axum::http::HeaderName::from_bytes(k.trim().as_bytes()).ok()?, v.trim().parse().ok()?);
    }
    Some((first, headers, req[end + 4..].to_vec()))
}

fn command(field: &[u8]) -> OsString {
    match field.first() {
        Some(0) => "ADD".into(),
        Some(1) => "DEL".into(),
        Some(2) => "CHECK".into(),
        Some(3) => "VERSION".into(),
        _ => os(field),
    }
}

fn os(b: &[u8]) -> OsString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::OsStr::from_bytes(b).to_os_string()
}

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(8, |b| *b == 0);
    let mut next = || parts.next().unwrap_or_default();
    let (cmd, container, netns, ifname, path, args, stdin, reply) =
        (next(), next(), next(), next(), next(), next(), next(), next());
    let agent = agent();
    *agent.reply.lock().unwrap() = reply.to_vec();

    // The configuration as it came, then pointed at the stand-in.
    let _ = sdn_node_cni::config::parse(stdin);
    let conf = match serde_json::from_slice::<Value>(stdin) {
        Ok(Value::Object(mut o)) => {
            o.insert("agentSocket".into(), Value::String(agent.socket.display().to_string()));
            o.insert("timeoutSeconds".into(), Value::from(1));
            serde_json::to_vec(&Value::Object(o)).unwrap()
        }
        _ => stdin.to_vec(),
    };
    let env = [
        ("CNI_COMMAND", command(cmd)),
        ("CNI_CONTAINERID", os(container)),
        ("CNI_NETNS", os(netns)),
        ("CNI_IFNAME", os(ifname)),
        ("CNI_PATH", os(path)),
        ("CNI_ARGS", os(args)),
    ];
    let getenv = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()).filter(|v| !v.is_empty());
    let out = sdn_node_cni::run(&getenv, &mut &conf[..]);
    assert!(out.exit_code == 0 || out.exit_code == 1, "exit {}", out.exit_code);
    if out.exit_code == 1 {
        let e: Value = serde_json::from_str(&out.stdout).expect("an error is JSON");
        assert!(e["code"].as_u64().is_some_and(|c| c > 0), "{e}");
        assert!(e["msg"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
    } else if !out.stdout.is_empty() {
        let _: Value = serde_json::from_str(&out.stdout).expect("a result is JSON");
    }

    // What reached the agent, as the agent reads it.
    let Ok(req) = agent.received.lock().unwrap().try_recv() else { return };
    let (first, headers, body) = split(&req).expect("the plugin sends well-formed HTTP");
    assert!(first.starts_with("POST /v1/cni HTTP/1.1"), "{first}");
    let deadline = sdn_node::api::deadline::from_headers(&headers).expect("the agent accepts the plugin's deadline");
    assert!(deadline.is_some(), "the plugin always sends its deadline");
    let r: sdn_node::pod::cni::CniRequest =
        serde_json::from_slice(&body).expect("the agent reads what the plugin sends");
    if let Err(e) = sdn_node::pod::cni::validate(&r) {
        let sdn_node::pod::PodError::Invalid(p) = &e else { panic!("validation is a 400: {e:?}") };
        assert!(!p.field.is_empty(), "{p}");
    }
    if !r.netns.is_empty() {
        match hostnet::netns::open_sandbox_blocking(&r.netns, &[]) {
            Ok(ns) => drop(ns),
            Err(hostnet::SandboxError::Refused(m)) => {
                let named: String = format!("{:?}", r.netns).chars().take(16).collect();
                assert!(m.starts_with(&named), "{m}");
            }
            Err(hostnet::SandboxError::Failed(_)) => {}
        }
    }
});
