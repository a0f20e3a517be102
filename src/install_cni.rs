//! `sdn-node install-cni`: installs the CNI plugin (`sdn-node-cni`) into a node's plugin
//! directory the way CNI plugins are installed, atomically: the bytes go to a hidden temporary
//! file in the target directory, which is flushed to disk (fsync), made executable (0755) and
//! then renamed over the plugin's name. A container runtime starting a pod meanwhile executes
//! either the old plugin or the new one, never a half-written file, and a running old plugin is
//! not overwritten in place (which would fail with ETXTBSY). The DaemonSet's init container runs
//! it, so the image needs no shell.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The temporary files' prefix: hidden (a leading dot), so nothing takes one for a plugin.
const TEMP_PREFIX: &str = ".sdn-node-cni.tmp-";

/// `sdn-node install-cni`'s arguments.
#[derive(clap::Args, Debug)]
pub struct InstallCniArgs {
    /// The node's CNI plugin directory (as mounted in the container), e.g. /host/opt/cni/bin.
    #[arg(long, value_name = "DIR")]
    pub cni_bin_dir: PathBuf,
    /// The plugin to install. Default: `sdn-node-cni` in the directory of the running
    /// `sdn-node`.
    #[arg(long, value_name = "PATH")]
    pub from: Option<PathBuf>,
}

/// What was installed.
#[derive(Debug, PartialEq, Eq)]
pub struct Installed {
    pub from: PathBuf,
    pub to: PathBuf,
    pub bytes: u64,
}

/// The plugin beside the running binary: `current_exe()`'s directory joined with the plugin's
/// name.
pub fn default_source() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the running sdn-node: {e}"))?;
    let dir = exe.parent().ok_or_else(|| format!("{}: no parent directory", exe.display()))?;
    Ok(dir.join(sdn_node_cni::PLUGIN_TYPE))
}

/// Runs the subcommand: installs `from` (or the default source) as
/// `DIR/sdn-node-cni`.
pub fn run(args: &InstallCniArgs) -> Result<Installed, String> {
    let from = match &args.from {
        Some(p) => p.clone(),
        None => default_source()?,
    };
    install(&from, &args.cni_bin_dir, sdn_node_cni::PLUGIN_TYPE)
}

/// Copies `from` to `dir/name` atomically (see the module documentation). On any error the
/// temporary file is removed and `dir/name` is left as it was.
pub fn install(from: &Path, dir: &Path, name: &str) -> Result<Installed, String> {
    let mut src = File::open(from).map_err(|e| format!("cannot read the plugin {}: {e}", from.display()))?;
    let meta = src.metadata().map_err(|e| format!("{}: {e}", from.display()))?;
    if !meta.is_file() {
        return Err(format!("the plugin {} is not a regular file", from.display()));
    }
    if meta.len() == 0 {
        return Err(format!("the plugin {} is empty", from.display()));
    }
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("--cni-bin-dir {} is not a directory", dir.display())),
        Err(e) => return Err(format!("--cni-bin-dir {}: {e}", dir.display())),
    }
    remove_stale_temp_files(dir);
    let to = dir.join(name);
    let tmp = dir.join(format!("{TEMP_PREFIX}{}", std::process::id()));
    let result = write_then_rename(&mut src, meta.len(), &tmp, &to);
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    let bytes = result?;
    Ok(Installed { from: from.to_path_buf(), to, bytes })
}

fn write_then_rename(src: &mut File, expected: u64, tmp: &Path, to: &Path) -> Result<u64, String> {
    // O_EXCL: never write through a file (or symlink) someone else put there.
    let mut out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(tmp)
        .map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
    let bytes = std::io::copy(src, &mut out).map_err(|e| format!("copying the plugin to {}: {e}", tmp.display()))?;
    if bytes != expected {
        return Err(format!("the plugin changed while it was copied ({expected} bytes expected, {bytes} read)"));
    }
    out.set_permissions(std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod 0755 {}: {e}", tmp.display()))?;
    out.sync_all().map_err(|e| format!("fsync {}: {e}", tmp.display()))?;
    drop(out);
    std::fs::rename(tmp, to).map_err(|e| format!("cannot rename {} to {}: {e}", tmp.display(), to.display()))?;
    // The rename itself on disk: fsync the directory (best effort; some file systems refuse
    // to open a directory for that, and the rename has happened either way).
    if let Some(dir) = to.parent() {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(bytes)
}

/// Temporary files a killed installer left behind (their process is gone).
fn remove_stale_temp_files(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(TEMP_PREFIX)) else { continue };
        let alive = pid.parse::<u32>().is_ok_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn installs_over_an_older_plugin_with_mode_0755_and_nothing_else() {
        let scratch = tempfile::tempdir().unwrap();
        let src = scratch.path().join("new");
        let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&src, &payload).unwrap();
        std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o600)).unwrap();
        let dir = scratch.path().join("bin");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("sdn-node-cni"), b"old").unwrap();
        std::fs::write(dir.join("loopback"), b"another plugin").unwrap();

        let r = install(&src, &dir, "sdn-node-cni").unwrap();
        assert_eq!(r, Installed { from: src.clone(), to: dir.join("sdn-node-cni"), bytes: payload.len() as u64 });
        assert_eq!(std::fs::read(dir.join("sdn-node-cni")).unwrap(), payload);
        assert_eq!(mode(&dir.join("sdn-node-cni")), 0o755, "executable whatever the source's mode");
        assert_eq!(names(&dir), ["loopback", "sdn-node-cni"], "no temporary file left");
        assert_eq!(std::fs::read(dir.join("loopback")).unwrap(), b"another plugin");
    }

    /// The old plugin's inode is not written: a runtime that has it open (or is executing it)
    /// keeps the old bytes, i.e. the new file was renamed over it.
    #[test]
    fn replaces_by_rename_not_in_place() {
        let scratch = tempfile::tempdir().unwrap();
        let src = scratch.path().join("new");
        std::fs::write(&src, b"new plugin").unwrap();
        let dir = scratch.path().join("bin");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("sdn-node-cni"), b"old plugin").unwrap();
        let mut held = File::open(dir.join("sdn-node-cni")).unwrap();
        install(&src, &dir, "sdn-node-cni").unwrap();
        let mut old = String::new();
        held.read_to_string(&mut old).unwrap();
        assert_eq!(old, "old plugin");
        assert_eq!(std::fs::read(dir.join("sdn-node-cni")).unwrap(), b"new plugin");
    }

    #[test]
    fn stale_temporary_files_of_dead_installers_are_removed() {
        let scratch = tempfile::tempdir().unwrap();
        let src = scratch.path().join("new");
        std::fs::write(&src, b"x").unwrap();
        let dir = scratch.path().join("bin");
        std::fs::create_dir(&dir).unwrap();
        // No process has pid 2^31-2 (above pid_max), so this file is a dead installer's.
        std::fs::write(dir.join(format!("{TEMP_PREFIX}2147483646")), b"half").unwrap();
        install(&src, &dir, "sdn-node-cni").unwrap();
        assert_eq!(names(&dir), ["sdn-node-cni"]);
    }

    #[test]
    fn errors_are_one_line_and_change_nothing() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("bin");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("sdn-node-cni"), b"old").unwrap();
        let empty = scratch.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        let file = scratch.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let cases: [(&Path, &Path, &str); 5] = [
            (&scratch.path().join("missing"), &dir, "cannot read the plugin"),
            (scratch.path(), &dir, "is not a regular file"),
            (&empty, &dir, "is empty"),
            (&file, &scratch.path().join("nodir"), "--cni-bin-dir"),
            (&file, &file, "is not a directory"),
        ];
        for (from, to, want) in cases {
            let e = install(from, to, "sdn-node-cni").unwrap_err();
            assert!(e.contains(want), "{e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
        assert_eq!(names(&dir), ["sdn-node-cni"]);
        assert_eq!(std::fs::read(dir.join("sdn-node-cni")).unwrap(), b"old");
    }

    /// A directory the installer cannot write (not as root: root writes anyway): the error
    /// names it and nothing is left behind.
    #[test]
    fn an_unwritable_directory_is_a_clear_error() {
        if unsafe { libc::geteuid() } == 0 {
            eprintln!("SKIPPED: root writes a 0555 directory anyway");
            return;
        }
        let scratch = tempfile::tempdir().unwrap();
        let src = scratch.path().join("new");
        std::fs::write(&src, b"x").unwrap();
        let dir = scratch.path().join("bin");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o555)).unwrap();
        let e = install(&src, &dir, "sdn-node-cni").unwrap_err();
        assert!(e.starts_with("cannot create ") && e.contains("Permission denied"), "{e}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(names(&dir).is_empty());
    }

    #[test]
    fn the_default_source_is_beside_the_running_binary() {
        let exe = std::env::current_exe().unwrap();
        assert_eq!(default_source().unwrap(), exe.parent().unwrap().join("sdn-node-cni"));
    }
}
