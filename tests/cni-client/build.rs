//! Builds the libcni test client (`main.go` beside this file) offline against Debian's
//! golang-github-appc-cni-dev. Shared by the test support of both crates that drive the CNI
//! plugin through it (`#[path]`-included; not a cargo build script).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds into `scratch` (cargo's per-target temp dir) under `name`; the build goes to a
/// private name and is renamed into place, so concurrent test runs never exec a half-written
/// file. The Go build cache lives there too, so reruns are quick without writing to $HOME
/// (which CI may not set).
pub fn build_cni_client(scratch: &Path, name: &str) -> Result<PathBuf, String> {
    let src = client_dir();
    let gopath = "/usr/share/gocode";
    if !Path::new(gopath).join("src/github.com/containernetworking/cni/libcni").is_dir() {
        return Err(format!("{gopath}/src/github.com/containernetworking/cni/libcni is missing (apt-get install golang-github-appc-cni-dev)"));
    }
    let out = scratch.join(name);
    let tmp = scratch.join(format!("{name}.{}.tmp", std::process::id()));
    let result = Command::new("go")
        .args(["build", "-o"])
        .arg(&tmp)
        .arg(".")
        .current_dir(&src)
        .env("GO111MODULE", "off")
        .env("GOPATH", gopath)
        .env("GOFLAGS", "")
        .env("GOCACHE", scratch.join("go-build-cache"))
        .output()
        .map_err(|e| format!("cannot run `go`: {e}"))?;
    if !result.status.success() {
        return Err(format!("go build failed: {}", String::from_utf8_lossy(&result.stderr)));
    }
    std::fs::rename(&tmp, &out).map_err(|e| format!("rename {} to {}: {e}", tmp.display(), out.display()))?;
    Ok(out)
}

/// `tests/cni-client` of the workspace: the including crate is the workspace root (the main
/// crate) or one of its members, one level down (cni/).
fn client_dir() -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let here = crate_dir.join("tests/cni-client");
    if here.join("main.go").is_file() {
        here
    } else {
        crate_dir.join("../tests/cni-client")
    }
}
