//! The interface-name rule.

/// Linux interface names are at most IFNAMSIZ-1 = 15 bytes.
pub const IFNAME_MAX: usize = 15;

/// Why a name is not an interface name. Each caller words it its own way (the plugin's CNI
/// error, the agent's 400, hostnet's `Error::Invalid`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IfNameError {
    Empty,
    /// Longer than [`IFNAME_MAX`] bytes.
    TooLong,
    /// `.` or `..`.
    Reserved,
    /// Contains `/`, `:` or ASCII whitespace (what the kernel's `dev_valid_name` refuses).
    Separator,
    /// Contains a byte that is not printable ASCII (a control character, NUL, non-ASCII).
    NotPrintable,
}

/// The names every layer accepts: 1 to 15 bytes, not `.` or `..`, every byte printable ASCII
/// other than `/` and `:`. The kernel refuses less (it takes non-ASCII bytes), but the agent
/// has always refused those in requests and records, so a looser check elsewhere only moved
/// the refusal further down (after an address was reserved, or into the agent).
pub fn check_ifname(name: &str) -> Result<(), IfNameError> {
    if name.is_empty() {
        return Err(IfNameError::Empty);
    }
    if name.len() > IFNAME_MAX {
        return Err(IfNameError::TooLong);
    }
    if name == "." || name == ".." {
        return Err(IfNameError::Reserved);
    }
    if name.bytes().any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace()) {
        return Err(IfNameError::Separator);
    }
    if !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(IfNameError::NotPrintable);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule() {
        for n in ["eth0", "tun0", "veth0123abcd", "a", "123456789012345", "veth-a1", "a.b"] {
            assert_eq!(check_ifname(n), Ok(()), "{n:?}");
        }
        for (n, e) in [
            ("", IfNameError::Empty),
            ("1234567890123456", IfNameError::TooLong),
            (".", IfNameError::Reserved),
            ("..", IfNameError::Reserved),
            ("a/b", IfNameError::Separator),
            ("a:b", IfNameError::Separator),
            ("a b", IfNameError::Separator),
            ("a\tb", IfNameError::Separator),
            ("x\0", IfNameError::NotPrintable),
            ("eth\u{e9}", IfNameError::NotPrintable),
            ("a\u{7f}", IfNameError::NotPrintable),
        ] {
            assert_eq!(check_ifname(n), Err(e), "{n:?}");
        }
    }
}
