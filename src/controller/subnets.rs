//! The node-subnet allocator: the cluster network cut into equal subnets (one per node), the
//! lowest free one handed out. Family-agnostic (addresses as `u128`), so that an IPv6 cluster
//! network cuts the same way when HostSubnets carry one.
//!
//! What is taken comes from the HostSubnets that exist, by name ([`Subnets::mark`]), whatever
//! their origin (this allocator, a Node's podCIDR, an operator): a subnet that overlaps a slot,
//! or lies inside one, takes that slot. A slot is free again only when no HostSubnet overlaps
//! it any more ([`Subnets::unmark`], on the HostSubnet's deletion): a deleted Node's subnet is
//! reused only after its HostSubnet is gone. A restarted controller marks what exists and
//! allocates nothing twice.

use std::collections::{BTreeMap, HashMap};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// A subnet of more slots than this marks only this many (an absurd HostSubnet, e.g. a /8 in an
/// IPv6 network of /64 slots, must not make the controller walk 2^56 slots).
const MAX_SLOTS_PER_SUBNET: u128 = 1 << 20;

#[derive(Debug)]
pub struct Subnets {
    network: IpNet,
    /// Bits of a slot (host bits of a node subnet).
    slot_bits: u8,
    slots: u128,
    /// Slot → how many named subnets overlap it.
    taken: BTreeMap<u128, u32>,
    /// Name → (subnet, slots it took).
    by_name: HashMap<String, (IpNet, Vec<u128>)>,
    /// No free slot below this.
    cursor: u128,
}

fn start(net: &IpNet) -> u128 {
    match net {
        IpNet::V4(n) => u32::from(n.network()) as u128,
        IpNet::V6(n) => u128::from(n.network()),
    }
}

fn size_bits(net: &IpNet) -> u8 {
    net.max_prefix_len() - net.prefix_len()
}

impl Subnets {
    /// `host_bits`: the host bits of a node subnet (openshift-sdn's hostSubnetLength).
    pub fn new(network: IpNet, host_bits: u8) -> Result<Subnets, String> {
        let free = size_bits(&network);
        if host_bits > free || host_bits < 2 {
            return Err(format!("host subnet length {host_bits} does not fit {network}"));
        }
        let index_bits = free - host_bits;
        let slots = if index_bits >= 127 { u128::MAX } else { 1u128 << index_bits };
        Ok(Subnets { network, slot_bits: host_bits, slots, taken: BTreeMap::new(), by_name: HashMap::new(), cursor: 0 })
    }

    /// The subnet of slot `i`.
    fn slot(&self, i: u128) -> IpNet {
        let addr = start(&self.network) + (i << self.slot_bits);
        let prefix = self.network.max_prefix_len() - self.slot_bits;
        match self.network {
            IpNet::V4(_) => IpNet::V4(Ipv4Net::new((addr as u32).into(), prefix).expect("prefix within range")),
            IpNet::V6(_) => IpNet::V6(Ipv6Net::new(addr.into(), prefix).expect("prefix within range")),
        }
    }

    /// The slots `subnet` overlaps (none if it is outside the network or of the other family).
    fn slots_of(&self, subnet: &IpNet) -> Vec<u128> {
        let same_family =
            matches!((subnet, &self.network), (IpNet::V4(_), IpNet::V4(_)) | (IpNet::V6(_), IpNet::V6(_)));
        if !same_family {
            return vec![];
        }
        let (net_start, sub_start) = (start(&self.network), start(subnet));
        let overlaps = self.network.contains(&subnet.network()) || subnet.contains(&self.network.network());
        if !overlaps {
            return vec![];
        }
        let sub_bits = size_bits(subnet);
        if sub_bits <= self.slot_bits {
            // Inside one slot.
            return vec![(sub_start - net_start) >> self.slot_bits];
        }
        // Covers whole slots (perhaps the whole network and more).
        let first = sub_start.max(net_start);
        let first_slot = (first - net_start) >> self.slot_bits;
        let count = 1u128
            .checked_shl(u32::from(sub_bits - self.slot_bits))
            .unwrap_or(u128::MAX)
            .min(self.slots - first_slot)
            .min(MAX_SLOTS_PER_SUBNET);
        (first_slot..first_slot + count).collect()
    }

    /// Records that HostSubnet `name` holds `subnet` (again: replaces what it held).
    pub fn mark(&mut self, name: &str, subnet: IpNet) {
        if self.by_name.get(name).is_some_and(|(s, _)| *s == subnet) {
            return;
        }
        self.unmark(name);
        let slots = self.slots_of(&subnet);
        for s in &slots {
            *self.taken.entry(*s).or_default() += 1;
        }
        self.by_name.insert(name.to_string(), (subnet, slots));
    }

    /// The subnet `name` holds here (a HostSubnet, or a reservation for one being written).
    pub fn subnet_of(&self, name: &str) -> Option<IpNet> {
        self.by_name.get(name).map(|(s, _)| *s)
    }

    /// HostSubnet `name` is gone: its slots are free unless another still overlaps them.
    pub fn unmark(&mut self, name: &str) {
        let Some((_, slots)) = self.by_name.remove(name) else { return };
        for s in slots {
            if let Some(n) = self.taken.get_mut(&s) {
                *n -= 1;
                if *n == 0 {
                    self.taken.remove(&s);
                    self.cursor = self.cursor.min(s);
                }
            }
        }
    }

    /// The names of the HostSubnets that overlap `subnet`, except `except`.
    pub fn overlapping(&self, subnet: &IpNet, except: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .by_name
            .iter()
            .filter(|(n, (s, _))| {
                n.as_str() != except && (s.contains(&subnet.network()) || subnet.contains(&s.network()))
            })
            .map(|(n, _)| n.clone())
            .collect();
        names.sort();
        names
    }

    /// Takes the lowest free slot for `name`; `None` when the network is full.
    pub fn allocate(&mut self, name: &str) -> Option<IpNet> {
        let mut i = self.cursor;
        for (&t, _) in self.taken.range(self.cursor..) {
            if t != i {
                break;
            }
            i += 1;
        }
        if i >= self.slots {
            self.cursor = self.slots;
            return None;
        }
        self.cursor = i + 1;
        let subnet = self.slot(i);
        self.mark(name, subnet);
        Some(subnet)
    }

    /// How many slots are taken, and how many there are.
    pub fn usage(&self) -> (u128, u128) {
        (self.taken.len() as u128, self.slots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn lowest_free_first_and_reused_only_after_release() {
        let mut a = Subnets::new(net("10.128.0.0/14"), 9).unwrap();
        assert_eq!(a.usage(), (0, 512));
        assert_eq!(a.allocate("a"), Some(net("10.128.0.0/23")));
        assert_eq!(a.allocate("b"), Some(net("10.128.2.0/23")));
        assert_eq!(a.allocate("c"), Some(net("10.128.4.0/23")));
        a.unmark("b");
        assert_eq!(a.allocate("d"), Some(net("10.128.2.0/23")));
        assert_eq!(a.allocate("e"), Some(net("10.128.6.0/23")));
    }

    #[test]
    fn existing_subnets_of_any_origin_are_skipped() {
        let mut a = Subnets::new(net("10.0.0.0/16"), 8).unwrap();
        // kubeadm's podCIDRs, a /25 inside slot 1, and one outside the network.
        a.mark("n0", net("10.0.0.0/24"));
        a.mark("small", net("10.0.1.128/25"));
        a.mark("outside", net("192.168.0.0/24"));
        a.mark("wide", net("10.0.4.0/23"));
        assert_eq!(a.allocate("x"), Some(net("10.0.2.0/24")));
        assert_eq!(a.allocate("y"), Some(net("10.0.3.0/24")));
        assert_eq!(a.allocate("z"), Some(net("10.0.6.0/24")));
        assert_eq!(a.overlapping(&net("10.0.5.0/24"), ""), vec!["wide".to_string()]);
        // Two HostSubnets on one slot: free only when both are gone.
        a.mark("dup", net("10.0.0.0/24"));
        a.unmark("n0");
        assert_eq!(a.allocate("w"), Some(net("10.0.7.0/24")));
        a.unmark("dup");
        assert_eq!(a.allocate("v"), Some(net("10.0.0.0/24")));
    }

    #[test]
    fn a_full_network_says_so() {
        let mut a = Subnets::new(net("10.0.0.0/30"), 2).unwrap();
        assert_eq!(a.allocate("a"), Some(net("10.0.0.0/30")));
        assert_eq!(a.allocate("b"), None);
        a.unmark("a");
        assert_eq!(a.allocate("b"), Some(net("10.0.0.0/30")));
        assert!(Subnets::new(net("10.0.0.0/30"), 3).is_err());
    }

    #[test]
    fn ipv6_cuts_the_same_way() {
        let mut a = Subnets::new(net("fd00:10:128::/56"), 64).unwrap();
        assert_eq!(a.allocate("a"), Some(net("fd00:10:128::/64")));
        assert_eq!(a.allocate("b"), Some(net("fd00:10:128:1::/64")));
        a.mark("huge", net("fd00::/16"));
        assert_eq!(a.allocate("c"), None);
    }

    /// Dual-stack sizes: a /48 cut into /64s (65,536 slots), and a /8 into /64s (2^56 slots):
    /// u128 arithmetic, memory only for what is taken.
    #[test]
    fn ipv6_sizes_of_dual_stack_clusters() {
        let mut a = Subnets::new(net("fd00:10:128::/48"), 64).unwrap();
        assert_eq!(a.usage(), (0, 1 << 16));
        a.mark("kcm", net("fd00:10:128::/64"));
        assert_eq!(a.allocate("a"), Some(net("fd00:10:128:1::/64")));
        assert_eq!(a.allocate("b"), Some(net("fd00:10:128:2::/64")));
        a.mark("wide", net("fd00:10:128:4::/62"));
        assert_eq!(a.allocate("c"), Some(net("fd00:10:128:3::/64")));
        assert_eq!(a.allocate("d"), Some(net("fd00:10:128:8::/64")));
        assert_eq!(a.usage(), (9, 1 << 16));
        let mut big = Subnets::new(net("fd00::/8"), 64).unwrap();
        assert_eq!(big.usage(), (0, 1 << 56));
        big.mark("all-but", net("fd00::/9"));
        assert_eq!(big.usage().0, MAX_SLOTS_PER_SUBNET, "a huge subnet marks a bounded number of slots");
        assert!(big.allocate("x").is_some());
        assert!(Subnets::new(net("fd00:10:128::/48"), 81).is_err());
    }

    #[test]
    fn thousands_allocate_in_order() {
        let mut a = Subnets::new(net("10.0.0.0/8"), 8).unwrap();
        for i in 0..5000u32 {
            let s = a.allocate(&format!("n{i}")).unwrap();
            assert_eq!(start(&s), u128::from(u32::from(std::net::Ipv4Addr::new(10, 0, 0, 0)) + (i << 8)));
        }
    }
}
