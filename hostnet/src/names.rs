//! Validation of names that end up in netlink attributes or /proc paths. Checked up front so a
//! bad name is reported as such instead of as an obscure kernel errno, and so an interface name
//! can never walk out of /proc/sys/net/ipv4/conf/.

use crate::error::{Error, Result};

/// Linux interface names are at most IFNAMSIZ-1 = 15 bytes.
pub const IFNAME_MAX: usize = 15;

/// Rejects names the kernel would refuse (`dev_valid_name`): empty, too long, `.`/`..`, or
/// containing `/`, `:`, whitespace or NUL.
pub fn check_ifname(name: &str) -> Result<()> {
    let bad = |reason: &str| Err(Error::invalid(format!("interface name {name:?}"), reason));
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > IFNAME_MAX {
        return bad("longer than 15 bytes");
    }
    if name == "." || name == ".." {
        return bad("reserved");
    }
    if name.bytes().any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace()) {
        return bad("contains '/', ':', NUL or whitespace");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_usual_names() {
        for n in ["eth0", "tun0", "veth0123abcd", "a", "123456789012345"] {
            check_ifname(n).unwrap();
        }
    }

    #[test]
    fn rejects_bad_names() {
        for n in ["", ".", "..", "a/b", "a b", "a:b", "1234567890123456", "x\0"] {
            assert!(check_ifname(n).is_err(), "{n:?}");
        }
    }
}
