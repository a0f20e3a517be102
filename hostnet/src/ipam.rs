//! Pod address allocation within the node subnet. Pure bookkeeping, no I/O: the caller
//! rebuilds it at start from the addresses its pods hold, and persists nothing through it.
//!
//! Allocation is round-robin from the last allocated address, like CNI host-local, so an
//! address freed by a deleted pod is not handed straight to the next pod while stale ARP
//! entries, conntrack entries or OVS flows for the old pod may still be around.

use std::{collections::BTreeSet, net::Ipv4Addr};

use ipnet::Ipv4Net;

/// Why an IPAM operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    #[error("subnet {0} has no room for pods (needs /30 or larger)")]
    SubnetTooSmall(Ipv4Net),
    #[error("{0} is not in the node subnet {1}")]
    OutOfRange(Ipv4Addr, Ipv4Net),
    #[error("{0} is the network, gateway or broadcast address of {1}")]
    Reserved(Ipv4Addr, Ipv4Net),
    #[error("{0} is already allocated")]
    InUse(Ipv4Addr),
    #[error("no free address left in {0}")]
    Exhausted(Ipv4Net),
}

/// Allocator for one node subnet. Network, gateway (first host) and broadcast are never
/// handed out.
#[derive(Clone, Debug)]
pub struct Ipam {
    subnet: Ipv4Net,
    /// First and last allocatable address, as integers.
    first: u32,
    last: u32,
    used: BTreeSet<u32>,
    /// Last address handed out; the next search starts after it.
    cursor: Option<u32>,
}

impl Ipam {
    /// An allocator for `subnet` (host bits ignored) with `in_use` already taken. Listing the
    /// network, gateway or broadcast address is harmless (they are never allocatable); an
    /// address outside the subnet is an error, since it means the caller's state is wrong.
    /// The round-robin cursor starts after the highest address in use.
    pub fn new(subnet: Ipv4Net, in_use: impl IntoIterator<Item = Ipv4Addr>) -> Result<Self, IpamError> {
        let subnet = subnet.trunc();
        if subnet.prefix_len() > 30 {
            return Err(IpamError::SubnetTooSmall(subnet));
        }
        let network = u32::from(subnet.network());
        let mut ipam = Ipam {
            subnet,
            first: network + 2,
            last: u32::from(subnet.broadcast()) - 1,
            used: BTreeSet::new(),
            cursor: None,
        };
        for ip in in_use {
            match ipam.reserve(ip) {
                Ok(()) | Err(IpamError::InUse(_)) | Err(IpamError::Reserved(..)) => {}
                Err(e) => return Err(e),
            }
        }
        ipam.cursor = ipam.used.last().copied();
        Ok(ipam)
    }

    /// The subnet being managed.
    pub fn subnet(&self) -> Ipv4Net {
        self.subnet
    }

    /// The gateway address (first host), never allocated.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.first - 1)
    }

    /// How many addresses can be handed out in total.
    pub fn capacity(&self) -> usize {
        (self.last - self.first + 1) as usize
    }

    /// How many are free now.
    pub fn available(&self) -> usize {
        self.capacity() - self.used.len()
    }

    /// Whether `ip` is currently allocated.
    pub fn is_allocated(&self, ip: Ipv4Addr) -> bool {
        self.used.contains(&u32::from(ip))
    }

    /// Hands out the next free address after the last one handed out, wrapping around.
    pub fn allocate(&mut self) -> Result<Ipv4Addr, IpamError> {
        let start = match self.cursor {
            Some(c) if c < self.last => c + 1,
            _ => self.first,
        };
        let found = (start..=self.last)
            .chain(self.first..start)
            .find(|a| !self.used.contains(a))
            .ok_or(IpamError::Exhausted(self.subnet))?;
        self.used.insert(found);
        self.cursor = Some(found);
        Ok(Ipv4Addr::from(found))
    }

    /// Marks a specific address allocated (e.g. one a pod already has). Does not move the
    /// round-robin cursor.
    pub fn reserve(&mut self, ip: Ipv4Addr) -> Result<(), IpamError> {
        let a = self.check(ip)?;
        if !self.used.insert(a) {
            return Err(IpamError::InUse(ip));
        }
        Ok(())
    }

    /// Frees an address; returns whether it was allocated.
    pub fn release(&mut self, ip: Ipv4Addr) -> bool {
        self.used.remove(&u32::from(ip))
    }

    fn check(&self, ip: Ipv4Addr) -> Result<u32, IpamError> {
        if !self.subnet.contains(&ip) {
            return Err(IpamError::OutOfRange(ip, self.subnet));
        }
        let a = u32::from(ip);
        if a < self.first || a > self.last {
            return Err(IpamError::Reserved(ip, self.subnet));
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn skips_network_gateway_broadcast() {
        let mut a = Ipam::new(net("10.128.0.0/29"), []).unwrap();
        assert_eq!(a.gateway(), ip("10.128.0.1"));
        assert_eq!(a.capacity(), 5);
        let got: Vec<_> = (0..5).map(|_| a.allocate().unwrap()).collect();
        assert_eq!(got, ["10.128.0.2", "10.128.0.3", "10.128.0.4", "10.128.0.5", "10.128.0.6"].map(ip).to_vec());
    }

    #[test]
    fn exhaustion_and_recovery() {
        let mut a = Ipam::new(net("10.0.0.0/30"), []).unwrap();
        assert_eq!(a.capacity(), 1);
        assert_eq!(a.allocate().unwrap(), ip("10.0.0.2"));
        assert_eq!(a.allocate(), Err(IpamError::Exhausted(net("10.0.0.0/30"))));
        assert_eq!(a.available(), 0);
        assert!(a.release(ip("10.0.0.2")));
        assert_eq!(a.allocate().unwrap(), ip("10.0.0.2"));
    }

    #[test]
    fn freed_address_not_reused_immediately() {
        let mut a = Ipam::new(net("10.0.0.0/28"), []).unwrap();
        let x = a.allocate().unwrap();
        let y = a.allocate().unwrap();
        assert!(a.release(x));
        let z = a.allocate().unwrap();
        assert_ne!(z, x);
        assert!(z > y);
    }

    #[test]
    fn wraps_around_to_freed_addresses() {
        let mut a = Ipam::new(net("10.0.0.0/29"), []).unwrap();
        let all: Vec<_> = (0..5).map(|_| a.allocate().unwrap()).collect();
        a.release(all[1]);
        a.release(all[3]);
        assert_eq!(a.allocate().unwrap(), all[1]);
        assert_eq!(a.allocate().unwrap(), all[3]);
        assert!(a.allocate().is_err());
    }

    #[test]
    fn built_from_used_list() {
        let used = [ip("10.0.0.2"), ip("10.0.0.5"), ip("10.0.0.1"), ip("10.0.0.2")];
        let mut a = Ipam::new(net("10.0.0.0/29"), used).unwrap();
        assert!(a.is_allocated(ip("10.0.0.2")));
        assert!(a.is_allocated(ip("10.0.0.5")));
        assert_eq!(a.available(), 3);
        // Continues after the highest used address, then wraps.
        assert_eq!(a.allocate().unwrap(), ip("10.0.0.6"));
        assert_eq!(a.allocate().unwrap(), ip("10.0.0.3"));
        assert_eq!(a.allocate().unwrap(), ip("10.0.0.4"));
        assert!(matches!(a.allocate(), Err(IpamError::Exhausted(_))));
        assert_eq!(
            Ipam::new(net("10.0.0.0/29"), [ip("10.0.1.2")]).unwrap_err(),
            IpamError::OutOfRange(ip("10.0.1.2"), net("10.0.0.0/29"))
        );
    }

    #[test]
    fn reserve_and_release() {
        let mut a = Ipam::new(net("10.0.0.0/24"), []).unwrap();
        a.reserve(ip("10.0.0.2")).unwrap();
        assert_eq!(a.reserve(ip("10.0.0.2")), Err(IpamError::InUse(ip("10.0.0.2"))));
        assert!(matches!(a.reserve(ip("10.0.0.0")), Err(IpamError::Reserved(..))));
        assert!(matches!(a.reserve(ip("10.0.0.1")), Err(IpamError::Reserved(..))));
        assert!(matches!(a.reserve(ip("10.0.0.255")), Err(IpamError::Reserved(..))));
        assert!(matches!(a.reserve(ip("10.0.1.3")), Err(IpamError::OutOfRange(..))));
        // reserve does not move the cursor: allocation still starts at the bottom.
        assert_eq!(a.allocate().unwrap(), ip("10.0.0.3"));
        assert!(a.release(ip("10.0.0.2")));
        assert!(!a.release(ip("10.0.0.2")));
    }

    #[test]
    fn too_small_and_host_bits() {
        assert!(matches!(Ipam::new(net("10.0.0.0/31"), []), Err(IpamError::SubnetTooSmall(_))));
        let a = Ipam::new(net("10.0.0.77/24"), []).unwrap();
        assert_eq!(a.subnet(), net("10.0.0.0/24"));
    }
}
