//! Issue 34 items 1, 2, 3 and 5: the image `deploy/image/build.sh` builds offline (`buildah
//! from scratch`, no base image), run by podman as a user runs it: `sdn-node --version`,
//! `install-cni` into a mounted directory, and `apply` and `run` against an Open vSwitch
//! started outside the container (a sandbox: ovsdb-server and ovs-vswitchd of this machine),
//! with the switch's run directory mounted at /var/run/openvswitch and the host network; flows
//! checked with ovs-ofctl.
//!
//! The image is built once per test binary (a OnceLock) from the binaries under test, the ones
//! cargo built for this run (`SDN_NODE_BIN_DIR`: the directory of `sdn-node`; the script's
//! default, a release build, is for users). Podman and buildah use the tests' own
//! containers.conf (runc, cgroupfs, explicit ulimits: this machine's defaults fail, see
//! /work/shared/testing.md) and their own storage (vfs, in target/tmp/image-tests, wiped at
//! the start of each run), through CONTAINERS_CONF and CONTAINERS_STORAGE_CONF: nothing in
//! /etc and nothing of the machine's own images is touched. Needs root (rootful podman, the
//! sockets of the switch), buildah, podman, runc and Open vSwitch: without them the tests
//! print why and pass, except under CI where they fail.

mod support;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use sdn_harness::sandbox::OvsSandbox;

fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        || Path::new("/usr/sbin").join(program).is_file()
}

/// Whether these tests can run; prints why not, and fails under CI.
fn can_run() -> bool {
    let why = if unsafe { libc::geteuid() } != 0 {
        Some("needs root (rootful podman; the switch's sockets are root's)".to_string())
    } else {
        ["buildah", "podman", "runc", "ovs-vswitchd", "ovs-ofctl"]
            .iter()
            .find(|p| !on_path(p))
            .map(|p| format!("{p} is not installed (deploy/local/packages.sh installs it)"))
    };
    match why {
        None => true,
        Some(w) if in_ci() => panic!("CI is set and this test cannot run: {w}"),
        Some(w) => {
            eprintln!("SKIPPED: {w}");
            false
        }
    }
}

/// The tests' container configuration and storage.
struct Containers {
    dir: PathBuf,
}

impl Containers {
    fn envs(&self) -> [(&'static str, PathBuf); 2] {
        [
            ("CONTAINERS_CONF", self.dir.join("containers.conf")),
            ("CONTAINERS_STORAGE_CONF", self.dir.join("storage.conf")),
        ]
    }

    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.envs(self.envs());
        c
    }

    fn podman(&self, args: &[&str]) -> Output {
        self.command("podman").args(args).output().expect("podman")
    }
}

/// Writes the configuration, after removing whatever a previous run left.
fn containers() -> Containers {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("image-tests");
    let c = Containers { dir: dir.clone() };
    if dir.join("storage.conf").exists() {
        // Containers of an interrupted run (their shm mounts would keep the files busy).
        let _ = c.podman(&["rm", "--all", "--force"]);
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("cannot remove {}: {e}", dir.display()));
    }
    std::fs::create_dir_all(dir.join("cni")).unwrap();
    // No CNI configuration of the machine's (these containers use the host network only).
    // runc, not crun (hybrid cgroups here); cgroupfs (no systemd session); ulimits below the
    // hard limits (the defaults exceed them here); events to a file (no journald).
    std::fs::write(
        dir.join("containers.conf"),
        format!(
            "[containers]\ndefault_ulimits = [\"nofile=1024:1024\", \"nproc=4096:4096\"]\n\n\
             [engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n\
             events_logfile_path = \"{d}/events.log\"\ntmp_dir = \"{d}/tmp\"\n\n\
             [network]\nnetwork_config_dir = \"{d}/cni\"\n",
            d = dir.display()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("storage.conf"),
        format!("[storage]\ndriver = \"vfs\"\ngraphroot = \"{d}/storage\"\nrunroot = \"{d}/run\"\n", d = dir.display()),
    )
    .unwrap();
    c
}

struct Built {
    containers: Containers,
    /// The script's last line.
    image: String,
    /// Everything it printed.
    output: String,
}

/// Builds the image once per test binary with deploy/image/build.sh.
fn image() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let containers = containers();
        let agent = Path::new(env!("CARGO_BIN_EXE_sdn-node"));
        let plugin = support::cninode::plugin_binary();
        assert_eq!(plugin.parent(), agent.parent());
        let out = containers
            .command(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/image/build.sh").to_str().unwrap())
            .env("SDN_NODE_BIN_DIR", agent.parent().unwrap())
            .env_remove("SDN_NODE_IMAGE")
            .output()
            .expect("deploy/image/build.sh");
        let output = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "build.sh failed:\n{output}{}", String::from_utf8_lossy(&out.stderr));
        let image = output.lines().last().expect("build.sh printed nothing").to_string();
        Built { containers, image, output }
    })
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The files of the image: `podman create`, `podman export` (a tar), listed with their modes.
fn image_files(b: &Built) -> Vec<(String, u32)> {
    let name = format!("files-{}", std::process::id());
    let o = b.containers.podman(&["create", "--name", &name, &b.image]);
    assert!(o.status.success(), "{}", text(&o));
    let tar = b.containers.dir.join(format!("{name}.tar"));
    let o = b.containers.podman(&["export", "-o", tar.to_str().unwrap(), &name]);
    assert!(o.status.success(), "{}", text(&o));
    let _ = b.containers.podman(&["rm", &name]);
    let o = Command::new("tar").args(["-tvf", tar.to_str().unwrap()]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    std::fs::remove_file(&tar).unwrap();
    let mut files = Vec::new();
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        // -rwxr-xr-x 0/0 79701976 2026-12-05 12:15 usr/local/bin/sdn-node
        let mode = line.split_whitespace().next().unwrap();
        if mode.starts_with('d') {
            continue;
        }
        let path = line.split_whitespace().nth(5).unwrap().trim_start_matches("./").to_string();
        let bits = mode[1..].chars().fold(0u32, |acc, c| (acc << 1) | u32::from(c != '-'));
        files.push((format!("/{path}"), bits));
    }
    files.sort();
    files
}

/// Copies `path` out of the image (`podman create` + `podman cp`, nothing run).
fn copy_out(b: &Built, path: &str, to: &Path) {
    let name = format!("cp-{}-{}", std::process::id(), to.file_name().unwrap().to_string_lossy());
    let o = b.containers.podman(&["create", "--name", &name, &b.image]);
    assert!(o.status.success(), "{}", text(&o));
    let o = b.containers.podman(&["cp", &format!("{name}:{path}"), to.to_str().unwrap()]);
    let _ = b.containers.podman(&["rm", &name]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn the_image_is_built_from_scratch_with_the_binaries_their_libraries_and_labels() {
    if !can_run() {
        return;
    }
    let b = image();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(b.image, format!("localhost/sdn-node:{version}"), "tagged with the crate's version:\n{}", b.output);
    assert!(b.output.contains("image size: "), "the script says the image's size:\n{}", b.output);

    // The version from the image's own binary.
    // `--network none`: podman's default network would make a bridge on the host and turn the
    // host's IPv4 forwarding on (new namespaces inherit it: it broke a hostnet test once).
    let o = b.containers.podman(&["run", "--rm", "--network", "none", &b.image, "--version"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), format!("sdn-node {version}"));

    // Nothing but the binaries, what they load and the few files they read.
    let files = image_files(b);
    let names: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    for want in ["/usr/local/bin/sdn-node", "/usr/local/bin/sdn-node-cni"] {
        let mode = files.iter().find(|(p, _)| p == want).unwrap_or_else(|| panic!("{want} missing: {names:?}")).1;
        assert_eq!(mode, 0o755, "{want}");
    }
    let mut expected: Vec<String> = [
        "/etc/group",
        "/etc/nsswitch.conf",
        "/etc/passwd",
        "/etc/ssl/certs/ca-certificates.crt",
        "/usr/local/bin/sdn-node",
        "/usr/local/bin/sdn-node-cni",
    ]
    .map(String::from)
    .to_vec();
    // Every library ldd names for the two binaries, the ELF interpreter included, and no
    // other file: podman itself adds only empty mount points (/etc/hosts, /etc/resolv.conf,
    // /etc/hostname, /run/.containerenv), which have size 0 and are not in the list.
    for bin in [env!("CARGO_BIN_EXE_sdn-node").to_string(), support::cninode::plugin_binary().display().to_string()] {
        let o = Command::new("ldd").arg(&bin).output().unwrap();
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let lib = match words.as_slice() {
                [_, "=>", path, ..] if path.starts_with('/') => path,
                [path, ..] if path.starts_with('/') => path,
                _ => continue,
            };
            if !expected.iter().any(|e| e == lib) {
                expected.push(lib.to_string());
            }
        }
    }
    expected.sort();
    assert!(expected.iter().any(|p| p.contains("libnftnl")) && expected.iter().any(|p| p.contains("ld-linux")));
    let extra_mount_points = ["/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/run/.containerenv"];
    let shipped: Vec<String> =
        names.iter().filter(|n| !extra_mount_points.contains(n)).map(|n| n.to_string()).collect();
    assert_eq!(shipped, expected, "exactly these files");

    // One layer, no base image; the OCI labels.
    let o = b.containers.podman(&["image", "inspect", "--format", "{{len .RootFS.Layers}} {{json .Labels}}", &b.image]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (layers, labels) = out.trim().split_once(' ').unwrap();
    assert_eq!(layers, "1", "FROM scratch: one layer");
    let labels: serde_json::Value = serde_json::from_str(labels).unwrap();
    let label =
        |k: &str| labels.get(format!("org.opencontainers.image.{k}")).and_then(|v| v.as_str()).map(str::to_string);
    assert_eq!(label("version").as_deref(), Some(version));
    assert_eq!(label("licenses").as_deref(), Some("Apache-2.0"));
    let head =
        Command::new("git").args(["rev-parse", "HEAD"]).current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap();
    if head.status.success() {
        let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
        assert!(
            label("revision").is_some_and(|r| r.starts_with(&head)),
            "revision {:?} is HEAD {head}",
            label("revision")
        );
    }
    // The same as annotations of the image's manifest.
    let o = b.containers.command("buildah").args(["inspect", "--type", "image", &b.image]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let inspect: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let manifest: serde_json::Value =
        serde_json::from_str(inspect.get("Manifest").and_then(|m| m.as_str()).expect("Manifest")).unwrap();
    let annotations = manifest.get("annotations").cloned().unwrap_or_default();
    assert_eq!(
        annotations.get("org.opencontainers.image.version").and_then(|v| v.as_str()),
        Some(version),
        "{annotations}"
    );
    assert_eq!(annotations.get("org.opencontainers.image.licenses").and_then(|v| v.as_str()), Some("Apache-2.0"));
}

/// `install-cni` run from the image, as the DaemonSet's init container runs it: the plugin
/// lands in the mounted directory under its name, mode 0755, with the bytes the image holds
/// (the built plugin, stripped of debug info), over an older one; nothing else is left there;
/// and what it installed works as a CNI plugin on the host.
#[test]
fn install_cni_from_the_image_into_a_mounted_directory() {
    if !can_run() {
        return;
    }
    let b = image();
    let scratch = tempfile::tempdir().unwrap();
    let bin = scratch.path().join("opt-cni-bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::write(bin.join("sdn-node-cni"), b"an older plugin").unwrap();
    std::fs::write(bin.join("loopback"), b"another plugin").unwrap();
    let o = b.containers.podman(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--user",
        "0",
        "--read-only",
        "--cap-drop",
        "all",
        "-v",
        &format!("{}:/host/opt/cni/bin", bin.display()),
        &b.image,
        "install-cni",
        "--cni-bin-dir",
        "/host/opt/cni/bin",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(stdout.lines().collect::<Vec<_>>().len(), 1, "one line saying what was installed: {stdout}");
    assert!(stdout.starts_with("installed /usr/local/bin/sdn-node-cni as /host/opt/cni/bin/sdn-node-cni"), "{stdout}");

    let installed = bin.join("sdn-node-cni");
    let from_image = scratch.path().join("from-image");
    copy_out(b, "/usr/local/bin/sdn-node-cni", &from_image);
    assert_eq!(std::fs::read(&installed).unwrap(), std::fs::read(&from_image).unwrap(), "the image's plugin");
    assert_eq!(std::fs::metadata(&installed).unwrap().permissions().mode() & 0o7777, 0o755);
    // The image's plugin is the built one without its debug sections.
    let stripped = scratch.path().join("stripped");
    std::fs::copy(support::cninode::plugin_binary(), &stripped).unwrap();
    let o = Command::new("strip").arg("--strip-debug").arg(&stripped).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read(&installed).unwrap(), std::fs::read(&stripped).unwrap(), "the built plugin");
    let mut names: Vec<String> =
        std::fs::read_dir(&bin).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, ["loopback", "sdn-node-cni"], "no temporary file left");

    // It runs as a plugin: CNI VERSION answers with the versions it supports.
    let o = Command::new(&installed).env("CNI_COMMAND", "VERSION").output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert!(v.get("supportedVersions").is_some(), "{v}");
}

/// A state with two pods on node-a (internal ports: no veths needed) and no DNS names (the
/// container resolves nothing).
const STATE: &str = r#"
node: node-a
plugin: multitenant
clusterNetwork: 10.128.0.0/14
serviceNetwork: 172.30.0.0/16
hostSubnets:
  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.2.0/23}
  - {host: node-b, hostIP: 172.17.0.3, subnet: 10.129.0.0/23}
netNamespaces:
  - {name: default, netid: 0}
  - {name: team-a, netid: 11}
services:
  - {namespace: team-a, name: web, clusterIP: 172.30.0.10, ports: [{protocol: TCP, port: 80}]}
pods:
  - {namespace: team-a, name: a1, containerID: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
     hostVeth: veth-a1, internal: true, ip: 10.128.2.5, mac: "0a:58:0a:80:02:05"}
"#;

const SECOND_POD: &str = r#"  - {namespace: team-a, name: a2, containerID: "1123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
     hostVeth: veth-a2, internal: true, ip: 10.128.2.9, mac: "0a:58:0a:80:02:09"}
"#;

/// The podman arguments of the recipe (README, deploy/README.md): the host network, the
/// switch's run directory and a state directory mounted, root (the switch's sockets are
/// root-owned). No capability is added: `--no-host-network` (a dummy-datapath switch, no kernel
/// networking to do).
fn recipe(sb: &OvsSandbox, state_dir: &Path) -> Vec<String> {
    [
        "--network",
        "host",
        "--user",
        "0",
        "--read-only",
        "-v",
        &format!("{}:/var/run/openvswitch", sb.dir().display()),
        "-v",
        &format!("{}:/state:ro", state_dir.display()),
    ]
    .map(String::from)
    .to_vec()
}

fn flows_with(sb: &OvsSandbox, ip: &str) -> usize {
    let (ok, out, _) = support::ofctl_status(sb, &["dump-flows", "--no-stats", "br0"]);
    if ok {
        out.lines().filter(|l| l.contains(ip)).count()
    } else {
        0
    }
}

/// `sdn-node apply` from the image against a switch outside it: exit 0, the pod's flows on the
/// switch, and the host's own `sdn-node apply` of the same state then finds nothing to change.
#[tokio::test]
async fn apply_from_the_image_against_a_switch_outside_it() {
    if !can_run() {
        return;
    }
    let b = image();
    let sb = OvsSandbox::start(Default::default()).await.unwrap();
    let state_dir = tempfile::tempdir().unwrap();
    std::fs::write(state_dir.path().join("state.yaml"), STATE).unwrap();
    let mut args = vec!["run".to_string(), "--rm".to_string()];
    args.extend(recipe(&sb, state_dir.path()));
    args.push(b.image.clone());
    args.extend(["apply", "--state", "/state/state.yaml", "--datapath-type", "dummy"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = b.containers.podman(&args);
    assert!(o.status.success(), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("applied: ") && stderr.contains("on br0"), "{stderr}");
    assert!(flows_with(&sb, "10.128.2.5") >= 4, "the pod's flows: {:?}", support::dump_sorted(&sb, &[]));
    let ports = Command::new("ovs-vsctl").envs(sb.ovs_env()).args(["list-ports", "br0"]).output().unwrap();
    assert!(String::from_utf8_lossy(&ports.stdout).lines().any(|l| l == "veth-a1"), "{}", text(&ports));

    // The host's binary agrees: nothing left to do.
    let state = state_dir.path().join("state.yaml");
    let o = Command::new(env!("CARGO_BIN_EXE_sdn-node"))
        .args(["apply", "--state", state.to_str().unwrap(), "--datapath-type", "dummy", "--ovs-rundir"])
        .arg(sb.dir())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("(0 added, 0 modified, 0 deleted; 0 ports added, 0 removed)"), "{stderr}");
}

/// GET `path` on 127.0.0.1:`port`; the status code, or None if nothing answers.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    reply.split_whitespace().nth(1)?.parse().ok()
}

/// Polls `cond` every 100 ms, at most `n` times.
fn poll(n: usize, mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..n {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    cond()
}

/// `sdn-node run` from the image, detached, against a switch outside it: it converges the
/// switch, answers /readyz on the host network, follows a change of its (mounted) state file,
/// and stops on SIGTERM (`podman stop`) with status 0, leaving its flows installed.
#[tokio::test]
async fn run_from_the_image_follows_its_state_file_and_stops_on_sigterm() {
    if !can_run() {
        return;
    }
    let b = image();
    let sb = OvsSandbox::start(Default::default()).await.unwrap();
    let state_dir = tempfile::tempdir().unwrap();
    let state = state_dir.path().join("state.yaml");
    std::fs::write(&state, STATE).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let name = format!("sdn-node-run-{}", std::process::id());
    let mut args = vec!["run".to_string(), "-d".to_string(), "--name".to_string(), name.clone()];
    args.extend(recipe(&sb, state_dir.path()));
    args.push(b.image.clone());
    let metrics = format!("127.0.0.1:{port}");
    args.extend(
        [
            "run",
            "--state",
            "/state/state.yaml",
            "--datapath-type",
            "dummy",
            "--no-host-network",
            "--pod-api-socket",
            "none",
            "--cni-conf-dir",
            "none",
            "--state-dir",
            "none",
            "--metrics-addr",
            &metrics,
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = b.containers.podman(&args);
    assert!(o.status.success(), "{}", text(&o));
    struct Remove<'a>(&'a Containers, String);
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            let _ = self.0.podman(&["rm", "--force", "--time", "5", &self.1]);
        }
    }
    let _remove = Remove(&b.containers, name.clone());
    let logs = || text(&b.containers.podman(&["logs", &name]));

    // Converged, and ready on the host network.
    assert!(poll(600, || flows_with(&sb, "10.128.2.5") >= 4), "the first pod's flows; logs:\n{}", logs());
    assert!(poll(600, || http_status(port, "/readyz") == Some(200)), "/readyz; logs:\n{}", logs());

    // A new state, written the way editors do (a new file renamed over the old one).
    let tmp = state_dir.path().join(".state.yaml.tmp");
    std::fs::write(&tmp, format!("{STATE}{SECOND_POD}")).unwrap();
    std::fs::rename(&tmp, &state).unwrap();
    assert!(poll(600, || flows_with(&sb, "10.128.2.9") >= 4), "the second pod's flows; logs:\n{}", logs());

    // SIGTERM: exit 0, flows kept.
    let o = b.containers.podman(&["stop", "--time", "30", &name]);
    assert!(o.status.success(), "{}", text(&o));
    let o = b.containers.podman(&["inspect", "--format", "{{.State.ExitCode}}", &name]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "0", "exit status after SIGTERM; logs:\n{}", logs());
    assert!(flows_with(&sb, "10.128.2.5") >= 4 && flows_with(&sb, "10.128.2.9") >= 4, "flows stay installed");
}
