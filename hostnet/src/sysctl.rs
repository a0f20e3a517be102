//! Sysctls through /proc/sys files (no `sysctl` command). /proc/sys/net is resolved against the
//! namespace of the thread that opens the file, so namespace-specific writes go through
//! `Netns::run`.

use std::{io::Write, path::PathBuf};

use crate::error::{Error, Result};

/// Builds /proc/sys/<a>/<b>/... from components, refusing any component that could leave the
/// intended directory (interface names end up here).
pub fn sysctl_path(components: &[&str]) -> Result<PathBuf> {
    let mut path = PathBuf::from("/proc/sys");
    for c in components {
        if c.is_empty() || *c == "." || *c == ".." || c.contains('/') || c.contains('\0') {
            return Err(Error::invalid(
                format!("sysctl path component {c:?}"),
                "empty, '.', '..' or containing '/' or NUL",
            ));
        }
        path.push(c);
    }
    Ok(path)
}

/// Writes `value` to the sysctl named by `components` (e.g. `["net","ipv4","ip_forward"]`).
pub fn write(components: &[&str], value: &str) -> Result<()> {
    let path = sysctl_path(components)?;
    let name = components.join(".");
    let mut f =
        std::fs::OpenOptions::new().write(true).open(&path).map_err(|e| Error::io("open sysctl", name.clone(), e))?;
    f.write_all(value.as_bytes()).map_err(|e| Error::io("write sysctl", format!("{name}={value}"), e))
}

/// Reads the sysctl named by `components`, trimmed.
pub fn read(components: &[&str]) -> Result<String> {
    let path = sysctl_path(components)?;
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_string())
        .map_err(|e| Error::io("read sysctl", components.join("."), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_components() {
        assert_eq!(
            sysctl_path(&["net", "ipv4", "conf", "tun0", "forwarding"]).unwrap(),
            PathBuf::from("/proc/sys/net/ipv4/conf/tun0/forwarding")
        );
        assert!(sysctl_path(&["net", "..", "x"]).is_err());
        assert!(sysctl_path(&["net", "a/b"]).is_err());
        assert!(sysctl_path(&["net", ""]).is_err());
    }
}
