//! The real `sdn-node-cni` binary driven by libcni (the reference Go library runtimes use)
//! against a fake agent on a temporary unix socket.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{conflist, go_client, happy, Action, Cni, FakeAgent, TempDir, POD_ARGS};

macro_rules! client_or_skip {
    () => {
        match go_client() {
            Some(c) => c,
            None => return,
        }
    };
}

fn pod_flags() -> Vec<&'static str> {
    vec!["-args", POD_ARGS, "-containerid", "c0ffee", "-netns", "/var/run/netns/x", "-ifname", "eth0"]
}

const ROUTES: &str = r#"[{"dst":"0.0.0.0/0","gw":"10.128.0.1"},{"dst":"10.128.0.0/14"},{"dst":"224.0.0.0/4"}]"#;

/// ADD, CHECK and DEL at 1.0.0 through a conflist written by `write_conflist` (what the agent
/// will install): the result as libcni decoded it, and the requests the agent received.
#[test]
fn add_check_del_1_0_0() {
    let client = client_or_skip!();
    let tmp = TempDir::new("v1");
    let agent = FakeAgent::start(tmp.path(), happy);
    let written = sdn_node_cni::write_conflist(&tmp.path().join("net.d"), &agent.socket).unwrap();
    let cni = Cni::new(client, &std::fs::read_to_string(&written).unwrap());

    let add = cni.run("add", &pod_flags());
    assert_eq!(add.exit, 0, "{:?}", add.out);
    assert_eq!(add.out["version"], "1.0.0");
    let want = json!({
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": "veth1a2b3c4d"},
            {"name": "eth0", "mac": "0a:58:0a:80:00:05", "sandbox": "/var/run/netns/x"}
        ],
        "ips": [{"address": "10.128.0.5/23", "gateway": "10.128.0.1", "interface": 1}],
        "routes": serde_json::from_str::<Value>(ROUTES).unwrap(),
        "dns": {}
    });
    assert_eq!(add.out["result"], want, "{:?}", add.out);

    let check = cni.run("check", &pod_flags());
    assert_eq!(check.exit, 0, "{:?}", check.out);
    let del = cni.run("del", &pod_flags());
    assert_eq!(del.exit, 0, "{:?}", del.out);

    let reqs = agent.requests();
    let commands: Vec<_> = reqs.iter().map(|r| r.body["command"].as_str().unwrap_or("?").to_owned()).collect();
    assert_eq!(commands, ["ADD", "CHECK", "DEL"]);
    for r in &reqs {
        assert_eq!(r.request_line, "POST /v1/cni HTTP/1.1");
        assert!(r.headers.to_ascii_lowercase().contains("content-type: application/json"), "{}", r.headers);
    }
    assert_eq!(
        reqs[0].body,
        json!({
            "command": "ADD", "containerID": "c0ffee", "netns": "/var/run/netns/x", "ifName": "eth0",
            "namespace": "team-a", "name": "web-1", "infraContainerID": "c0ffee", "cniVersion": "1.0.0"
        })
    );
}

/// At 0.4.0 the result carries `"version":"4"` on each IP (libcni's 0.4.0 type keeps it, and
/// converting to 1.0.0 must give the same addresses); CHECK works at 0.4.0 too.
#[test]
fn add_check_del_0_4_0() {
    let client = client_or_skip!();
    let tmp = TempDir::new("v04");
    let agent = FakeAgent::start(tmp.path(), happy);
    let cni = Cni::new(client, &conflist("0.4.0", &agent.socket, ""));

    let add = cni.run("add", &pod_flags());
    assert_eq!(add.exit, 0, "{:?}", add.out);
    assert_eq!(add.out["version"], "0.4.0");
    assert_eq!(add.out["result"]["cniVersion"], "0.4.0");
    assert_eq!(
        add.out["result"]["ips"],
        json!([{"version": "4", "address": "10.128.0.5/23", "gateway": "10.128.0.1", "interface": 1}])
    );
    assert_eq!(add.out["result"]["interfaces"][1]["sandbox"], "/var/run/netns/x");
    assert_eq!(add.out["result100"]["ips"][0]["address"], "10.128.0.5/23");
    assert_eq!(add.out["result100"]["routes"], serde_json::from_str::<Value>(ROUTES).unwrap());

    assert_eq!(cni.run("check", &pod_flags()).exit, 0);
    assert_eq!(cni.run("del", &pod_flags()).exit, 0);
    let versions: Vec<_> = agent.requests().iter().map(|r| r.body["cniVersion"].clone()).collect();
    assert_eq!(versions, [json!("0.4.0"), json!("0.4.0"), json!("0.4.0")]);
}

/// 0.3.1 results decode in libcni; CHECK is refused by libcni itself before reaching us.
#[test]
fn add_0_3_1() {
    let client = client_or_skip!();
    let tmp = TempDir::new("v031");
    let agent = FakeAgent::start(tmp.path(), happy);
    let cni = Cni::new(client, &conflist("0.3.1", &agent.socket, ""));
    let add = cni.run("add", &pod_flags());
    assert_eq!(add.exit, 0, "{:?}", add.out);
    assert_eq!(add.out["result"]["ips"][0]["version"], "4");
}

/// VERSION and libcni's own validation of the config list against it.
#[test]
fn version_and_validate() {
    let client = client_or_skip!();
    let cni = Cni::new(client, &conflist("1.0.0", std::path::Path::new("/nonexistent.sock"), ""));
    let v = cni.run("version", &[]);
    assert_eq!(v.exit, 0, "{:?}", v.out);
    assert_eq!(v.out["versions"], json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0"]));
    let v = cni.run("validate", &[]);
    assert_eq!(v.exit, 0, "{:?}", v.out);
}

/// DEL is idempotent: an agent 404 (pod unknown) is a success, and so is a DEL without a
/// network namespace (the runtime may have lost it); both still reach the agent.
#[test]
fn del_is_idempotent() {
    let client = client_or_skip!();
    let tmp = TempDir::new("del");
    let agent = FakeAgent::start(tmp.path(), |_| {
        Action::Reply(404, r#"{"error":"pod team-a/web-1 is not set up","object":"pod team-a/web-1"}"#.into())
    });
    let cni = Cni::new(client, &conflist("1.0.0", &agent.socket, ""));
    let del = cni.run("del", &pod_flags());
    assert_eq!(del.exit, 0, "{:?}", del.out);
    let mut flags = pod_flags();
    flags[5] = "";
    let del = cni.run("del", &flags);
    assert_eq!(del.exit, 0, "{:?}", del.out);
    let reqs = agent.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[1].body["netns"], "");
    assert_eq!(reqs[1].body["command"], "DEL");
    // ADD's 404 is not a success: the pod is unknown (code 3).
    let add = cni.run("add", &pod_flags());
    assert_eq!(add.code(), Some(3), "{:?}", add.out);
}

/// No agent: a missing socket and a socket nobody listens on are both "try again later".
#[test]
fn agent_down_is_try_again_later() {
    let client = client_or_skip!();
    let tmp = TempDir::new("down");
    let missing = tmp.path().join("missing.sock");
    let cni = Cni::new(client, &conflist("1.0.0", &missing, ""));
    let add = cni.run("add", &pod_flags());
    assert_eq!(add.code(), Some(11), "{:?}", add.out);
    assert!(add.msg().contains("pod team-a/web-1") && add.msg().contains("missing.sock"), "{}", add.msg());
    assert_eq!(cni.run("del", &pod_flags()).code(), Some(11));

    let stale = tmp.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let cni = Cni::new(client, &conflist("1.0.0", &stale, ""));
    let add = cni.run("add", &pod_flags());
    assert_eq!(add.code(), Some(11), "{:?}", add.out);
}

/// A 400 becomes "invalid network configuration" whose msg names the agent's object and field.
#[test]
fn bad_request_names_object_and_field() {
    let client = client_or_skip!();
    let tmp = TempDir::new("400");
    let agent = FakeAgent::start(tmp.path(), |_| {
        Action::Reply(
            400,
            r#"{"error":"not in this node's subnet 10.128.0.0/23","object":"pod team-a/web-1","field":"ip"}"#.into(),
        )
    });
    let cni = Cni::new(client, &conflist("1.0.0", &agent.socket, ""));
    let add = cni.run("add", &pod_flags());
    assert_eq!(add.code(), Some(7), "{:?}", add.out);
    assert_eq!(add.msg(), "pod team-a/web-1: field ip: not in this node's subnet 10.128.0.0/23");
    assert!(add.out["details"].as_str().unwrap().contains("HTTP 400"), "{:?}", add.out);
}

/// Each agent status maps to its CNI code (the table in the crate docs).
#[test]
fn status_codes() {
    let client = client_or_skip!();
    let cases: &[(u16, &str, u64)] = &[
        (409, r#"{"error":"hostVeth in use","object":"pod team-a/web-2","field":"hostVeth"}"#, 100),
        (500, r#"{"error":"switch failed the change"}"#, 101),
        (503, r#"{"error":"switch not connected"}"#, 11),
        (504, "", 11),
        (418, "teapot", 102),
        (200, "not json", 103),
        (200, r#"{"hostVeth":"veth1","mac":"0a:58:0a:80:00:05"}"#, 103),
    ];
    for (status, body, code) in cases {
        let tmp = TempDir::new("st");
        let (status, body) = (*status, body.to_string());
        let agent = FakeAgent::start(tmp.path(), move |_| Action::Reply(status, body.clone()));
        let cni = Cni::new(client, &conflist("1.0.0", &agent.socket, ""));
        let add = cni.run("add", &pod_flags());
        assert_eq!(add.code(), Some(*code), "HTTP {status}: {:?}", add.out);
        assert!(add.msg().contains("pod team-a/web-"), "HTTP {status}: {}", add.msg());
    }
    // The field the agent's ADD answer lacks is named.
    let tmp = TempDir::new("st");
    let agent = FakeAgent::start(tmp.path(), |_| {
        Action::Reply(200, r#"{"hostVeth":"veth1","mac":"0a:58:0a:80:00:05"}"#.into())
    });
    let cni = Cni::new(client, &conflist("1.0.0", &agent.socket, ""));
    assert!(cni.run("add", &pod_flags()).msg().contains("agent reply field ip: missing"));
}

/// An agent that accepts and never answers: the plugin gives up within timeoutSeconds with
/// "try again later"; one that closes without answering is also "try again later".
#[test]
fn deadline() {
    let client = client_or_skip!();
    let tmp = TempDir::new("hang");
    let agent = FakeAgent::start(tmp.path(), |_| Action::Hang);
    let cni = Cni::new(client, &conflist("1.0.0", &agent.socket, r#","timeoutSeconds":1"#));
    let add = cni.run("add", &pod_flags());
    assert_eq!(add.code(), Some(11), "{:?}", add.out);
    assert!(add.msg().contains("no answer within 1s"), "{}", add.msg());
    assert!(add.elapsed >= Duration::from_secs(1), "{:?}", add.elapsed);
    // Generous: the client and plugin start on a shared, loaded machine; the msg above shows
    // that the plugin's own 1s deadline is what fired.
    assert!(add.elapsed < Duration::from_secs(8), "took {:?} with timeoutSeconds 1", add.elapsed);
    assert_eq!(agent.requests().len(), 1);

    let tmp = TempDir::new("close");
    let agent = FakeAgent::start(tmp.path(), |_| Action::Close);
    let cni = Cni::new(client, &conflist("1.0.0", &agent.socket, ""));
    assert_eq!(cni.run("add", &pod_flags()).code(), Some(11));
}

/// CNI_ARGS follows the reference parser: an unknown key is an error (and nothing reaches the
/// agent) unless IgnoreUnknown is true.
#[test]
fn cni_args_unknown_keys() {
    let client = client_or_skip!();
    let tmp = TempDir::new("args");
    let agent = FakeAgent::start(tmp.path(), happy);
    let cni = Cni::new(client, &conflist("1.0.0", &agent.socket, ""));
    let flags = ["-args", "K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=web-1;FOO=bar"];
    let add = cni.run("add", &flags);
    assert_eq!(add.code(), Some(4), "{:?}", add.out);
    assert!(add.msg().contains("FOO") && add.msg().contains("CNI_ARGS"), "{}", add.msg());
    assert!(agent.requests().is_empty());

    let flags = ["-args", "K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=web-1;FOO=bar;IgnoreUnknown=true"];
    let add = cni.run("add", &flags);
    assert_eq!(add.exit, 0, "{:?}", add.out);
    let reqs = agent.requests();
    assert_eq!(reqs.len(), 1);
    // Without K8S_POD_INFRA_CONTAINER_ID the sandbox container's ID stands in.
    assert_eq!(reqs[0].body["infraContainerID"], reqs[0].body["containerID"]);

    // ADD without the pod's name cannot say which pod it is for.
    let add = cni.run("add", &["-args", "K8S_POD_NAMESPACE=team-a"]);
    assert_eq!(add.code(), Some(4), "{:?}", add.out);
    assert!(add.msg().contains("K8S_POD_NAME"), "{}", add.msg());
}

/// Config problems reach the runtime as CNI errors, not crashes.
#[test]
fn config_errors() {
    let client = client_or_skip!();
    let tmp = TempDir::new("conf");
    let agent = FakeAgent::start(tmp.path(), happy);
    let cni = Cni::new(client, &conflist("1.0.0", &agent.socket, r#","timeoutSeconds":"soon""#));
    let add = cni.run("add", &pod_flags());
    assert_eq!(add.code(), Some(6), "{:?}", add.out);
    assert!(add.msg().contains("timeoutSeconds"), "{}", add.msg());
    let cni = Cni::new(client, &conflist("1.0.0", std::path::Path::new("relative.sock"), ""));
    let add = cni.run("add", &pod_flags());
    assert_eq!(add.code(), Some(7), "{:?}", add.out);
    assert!(add.msg().contains("agentSocket"), "{}", add.msg());
    let cni = Cni::new(client, &conflist("0.2.0", &agent.socket, ""));
    assert_eq!(cni.run("add", &pod_flags()).code(), Some(1));
    assert!(agent.requests().is_empty());
}

/// A runtime that is not Kubernetes (podman 4.3 sends `IgnoreUnknown=1;K8S_POD_NAME=<container
/// name>` and nothing else): the pod's namespace is the config's `namespace` (`default` when
/// it has none), its name the container's or the short container ID; DEL goes by container ID.
#[test]
fn runtime_without_kubernetes_args() {
    let client = client_or_skip!();
    let tmp = TempDir::new("podman");
    let agent = FakeAgent::start(tmp.path(), happy);
    let id = "04e97267aae6c4fc012009f4bd6ac26a9d294567f1b731bc4571a461e2cd12c3";
    let flags = |args: &'static str| vec!["-args", args, "-containerid", id, "-netns", "/var/run/netns/x", "-ifname", "eth0"];
    let cni = Cni::new(client, &conflist("1.0.0", &agent.socket, r#","namespace":"team-a""#));
    for (args, name) in [("IgnoreUnknown=1;K8S_POD_NAME=web1", "web1"), ("IgnoreUnknown=1;K8S_POD_NAME=Probe_1", "04e97267aae6")] {
        let add = cni.run("add", &flags(args));
        assert_eq!(add.exit, 0, "{:?}", add.out);
        let check = cni.run("check", &flags(args));
        assert_eq!(check.exit, 0, "{:?}", check.out);
        let del = cni.run("del", &flags(args));
        assert_eq!(del.exit, 0, "{:?}", del.out);
        let reqs = agent.requests();
        let last: Vec<_> = reqs[reqs.len() - 3..].iter().map(|r| (r.body["command"].clone(), r.body["namespace"].clone(), r.body["name"].clone())).collect();
        assert_eq!(
            last,
            vec![(json!("ADD"), json!("team-a"), json!(name)), (json!("CHECK"), json!("team-a"), json!(name)), (json!("DEL"), json!(""), json!(""))]
        );
    }
    // The conflist the agent writes (no namespace) puts them in `default`.
    let cni = Cni::new(client, &sdn_node_cni::conflist(&agent.socket));
    let add = cni.run("add", &flags(""));
    assert_eq!(add.exit, 0, "{:?}", add.out);
    let last = agent.requests().pop().unwrap();
    assert_eq!((last.body["namespace"].clone(), last.body["name"].clone()), (json!("default"), json!("04e97267aae6")));
    // Kubernetes' arguments still win over the config's namespace.
    let cni = Cni::new(client, &conflist("1.0.0", &agent.socket, r#","namespace":"team-b""#));
    let add = cni.run("add", &pod_flags());
    assert_eq!(add.exit, 0, "{:?}", add.out);
    let last = agent.requests().pop().unwrap();
    assert_eq!((last.body["namespace"].clone(), last.body["name"].clone()), (json!("team-a"), json!("web-1")));
    // A config namespace that is no namespace name is the config's error, named.
    let cni = Cni::new(client, &conflist("1.0.0", &agent.socket, r#","namespace":"Team_A""#));
    let add = cni.run("add", &flags(""));
    assert_eq!(add.code(), Some(7), "{:?}", add.out);
    assert!(add.msg().contains("field namespace"), "{}", add.msg());
}
