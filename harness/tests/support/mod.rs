//! What the harness's tests share.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Binary `bin` of workspace package `package` (the agent, the CNI plugin), which this
/// package's tests cannot name with `CARGO_BIN_EXE_*` (those are this package's own binaries):
/// next to `sdn-bench`, where cargo puts every binary of the workspace. `cargo test
/// --workspace` has built it (both packages have integration tests, so cargo builds their
/// binaries); if it is missing (`cargo test -p sdn-harness` on a fresh tree) it is built here,
/// as the agent's tests/support/cninode.rs does for the plugin.
pub fn workspace_bin(package: &str, bin: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_sdn-bench")).with_file_name(bin);
    if !p.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "-p", package, "--bin", bin])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap_or_else(|e| panic!("cargo build -p {package}: {e}"));
        assert!(st.success(), "building {bin} failed");
    }
    p
}
