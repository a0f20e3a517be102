//! Validation of names that end up in netlink attributes or /proc paths. Checked up front so a
//! bad name is reported as such instead of as an obscure kernel errno, and so an interface name
//! can never walk out of /proc/sys/net/ipv4/conf/.

use crate::error::{Error, Result};

/// Linux interface names are at most IFNAMSIZ-1 = 15 bytes.
pub use netif::IFNAME_MAX;

/// Rejects names the kernel would refuse (`dev_valid_name`): empty, too long, `.`/`..`, or
/// containing `/`, `:`, whitespace or NUL; and, as the agent does, any byte that is not
/// printable ASCII (the workspace's one rule, [`netif::check_ifname`]).
pub fn check_ifname(name: &str) -> Result<()> {
    use netif::IfNameError as E;
    let reason = match netif::check_ifname(name) {
        Ok(()) => return Ok(()),
        Err(E::Empty) => "empty",
        Err(E::TooLong) => "longer than 15 bytes",
        Err(E::Reserved) => "reserved",
        Err(E::Separator) => "contains '/', ':', NUL or whitespace",
        Err(E::NotPrintable) => "contains a byte that is not printable ASCII",
    };
    Err(Error::invalid(format!("interface name {name:?}"), reason))
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
