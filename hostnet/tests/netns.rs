//! Netns: work runs inside the target namespace and never moves the calling thread.

mod common;

use common::{root_or_skip, TestNs};
use hostnet::{nl::Nl, Netns};

fn ns_inode(path: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

#[tokio::test]
async fn run_enters_the_namespace_and_leaves_the_caller_alone() {
    if !root_or_skip("run_enters_the_namespace_and_leaves_the_caller_alone") {
        return;
    }
    let t = TestNs::new("run");
    let target = ns_inode(&format!("/var/run/netns/{}", t.name));
    let before = ns_inode("/proc/thread-self/ns/net");
    let inside = t.ns.run("read own netns", || Ok(ns_inode("/proc/thread-self/ns/net"))).await.unwrap();
    assert_eq!(inside, target, "work did not run in the target namespace");
    assert_ne!(inside, before);
    assert_eq!(ns_inode("/proc/thread-self/ns/net"), before, "caller's thread moved");
}

#[tokio::test]
async fn netlink_socket_is_bound_to_the_namespace() {
    if !root_or_skip("netlink_socket_is_bound_to_the_namespace") {
        return;
    }
    let t = TestNs::new("nl");
    t.ip(&["link", "add", "probe0", "type", "bridge"]);
    let nl = Nl::connect(&t.ns).await.unwrap();
    assert!(nl.link_by_name("probe0").await.unwrap().is_some());
    assert!(nl.link_by_name("nonexistent0").await.unwrap().is_none());
    // The same name is not visible from the host namespace.
    let host = Nl::connect(&Netns::current().unwrap()).await.unwrap();
    assert!(host.link_by_name("probe0").await.unwrap().is_none());
}

#[test]
fn opening_a_missing_namespace_names_the_path() {
    let e = Netns::open("/var/run/netns/does-not-exist-hostnet").unwrap_err();
    assert!(e.to_string().contains("/var/run/netns/does-not-exist-hostnet"), "{e}");
}

#[tokio::test]
async fn a_named_namespace_is_created_and_removed_like_ip_netns_does() {
    if !root_or_skip("a_named_namespace_is_created_and_removed_like_ip_netns_does") {
        return;
    }
    let name = format!("hn-new-{}", std::process::id());
    let ns = Netns::create_named(&name).unwrap();
    // `ip netns` (the independent oracle) sees it, and it is a namespace of its own.
    assert!(common::run(&["ip", "netns", "list"]).contains(&name));
    let path = format!("/var/run/netns/{name}");
    assert_ne!(ns_inode(&path), ns_inode("/proc/self/ns/net"));
    // Empty but for lo; a veth pair made there is up at both ends.
    let pairs = vec![("hnva".to_string(), "hnvb".to_string())];
    hostnet::add_veth_pairs(&ns, &pairs, 1400).await.unwrap();
    let links = common::run(&["ip", "-n", &name, "-o", "link"]);
    for l in ["hnva@hnvb", "hnvb@hnva"] {
        let line = links.lines().find(|x| x.contains(l)).unwrap_or_else(|| panic!("{l} missing: {links}"));
        assert!(line.contains("mtu 1400") && line.contains(",UP"), "{line}");
    }
    // A second namespace of that name is refused; nothing of the first is lost.
    assert!(Netns::create_named(&name).is_err());
    assert!(common::run(&["ip", "netns", "list"]).contains(&name));
    Netns::remove_named(&name).unwrap();
    assert!(!common::run(&["ip", "netns", "list"]).contains(&name));
    assert!(!std::path::Path::new(&path).exists());
    // Removing what is gone is success; bad names are refused.
    Netns::remove_named(&name).unwrap();
    assert!(Netns::create_named("../etc").is_err());
}

/// Every kind of path that is not a pod's network namespace is refused, with a reason naming
/// the path and what it is; none of them blocks (a FIFO with no writer included), and a real
/// sandbox, by its bind mount or its /proc path, is accepted.
#[tokio::test]
async fn a_sandbox_must_be_a_network_namespace_other_than_the_agents() {
    use hostnet::netns::SandboxError;
    if !root_or_skip("a_sandbox_must_be_a_network_namespace_other_than_the_agents") {
        return;
    }
    let dir = tempdir();
    let fifo = format!("{dir}/fifo");
    let cfifo = std::ffi::CString::new(fifo.clone()).unwrap();
    // SAFETY: plain system call on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(cfifo.as_ptr(), 0o600) }, 0);
    let plain = format!("{dir}/plain");
    std::fs::write(&plain, b"").unwrap();
    let sock = format!("{dir}/sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let t = TestNs::new("sbx");
    let own_pid = format!("/proc/{}/ns/net", std::process::id());
    let cases: Vec<(String, &str)> = vec![
        (fifo.clone(), "is a FIFO"),
        (plain.clone(), "not a network namespace (nsfs)"),
        (dir.clone(), "is a directory"),
        ("/dev/null".into(), "is a character device"),
        (sock.clone(), "is a socket"),
        ("/proc/self/ns/net".into(), "the agent's own"),
        (own_pid, "the agent's own"),
        ("/var/run/netns/../../proc/self/ns/net".into(), "the agent's own"),
        ("/proc/thread-self/ns/net".into(), "the agent's own"),
        ("/proc/self/ns/mnt".into(), "a mount namespace"),
        ("/proc/self/ns/uts".into(), "a UTS namespace"),
        ("relative/path".into(), "not an absolute path"),
        ("/var/run/netns/does-not-exist-hostnet".into(), "cannot be opened"),
        (format!("/{}", "a".repeat(5000)), "longer than"),
        ("/var/run/netns/x\0y".into(), "NUL"),
    ];
    for (path, why) in &cases {
        let t0 = std::time::Instant::now();
        match Netns::open_sandbox(path, &[]).await {
            Err(SandboxError::Refused(m)) => {
                assert!(m.contains(why), "{path:?}: {m} (wanted {why:?})");
                assert!(m.contains(&format!("{path:?}")[..20.min(path.len())]), "{path:?}: the message names the path: {m}");
            }
            other => panic!("{path:?}: {other:?}"),
        }
        // Not a deadline (machines are shared): a FIFO open would block forever, not slowly.
        assert!(t0.elapsed() < hostnet::netns::NS_WORK_TIMEOUT, "{path:?} took {:?}", t0.elapsed());
    }
    // A namespace that is forbidden by identity, under whatever name.
    let id = t.ns.id().unwrap();
    match Netns::open_sandbox(&format!("/var/run/netns/{}", t.name), &[id]).await {
        Err(SandboxError::Refused(m)) => assert!(m.contains("private"), "{m}"),
        other => panic!("{other:?}"),
    }
    // The real thing: usable, and the same namespace.
    let ns = Netns::open_sandbox(&format!("/var/run/netns/{}", t.name), &[]).await.expect("a bind-mounted netns is a sandbox");
    assert_eq!(ns.id().unwrap(), id);
    let nl = Nl::connect(&ns).await.unwrap();
    assert!(nl.link_by_name("lo").await.unwrap().is_some());
    // A process's namespace by /proc path (docker's way): a sleeper inside the test namespace.
    let mut child = std::process::Command::new("ip").args(["netns", "exec", &t.name, "sleep", "30"]).spawn().unwrap();
    let pid = child.id();
    let proc_path = format!("/proc/{pid}/ns/net");
    let mut ok = None;
    for _ in 0..100 {
        // `ip netns exec` enters the namespace, then execs sleep (same pid).
        if ns_inode(&proc_path) == id.ino {
            ok = Some(Netns::open_sandbox(&proc_path, &[]).await);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(ok.expect("the child entered the namespace").expect("a /proc/PID/ns/net path is a sandbox").id().unwrap(), id);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempdir() -> String {
    let d = std::env::temp_dir().join(format!("hostnet-sbx-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d.display().to_string()
}
