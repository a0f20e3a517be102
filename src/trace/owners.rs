//! From a flow's cookie back to the object that owns it.
//!
//! A cookie is `kind (8) | generation (24) | owner hash (32)` ([`crate::store`]). The kind is
//! read straight off the cookie; the hash is one-way (FNV-1a of the owner's text form), so the
//! identity is found by hashing the owners the model knows — its pods, services, host subnets
//! and VNIDs — and looking the cookie's hash up. Kinds keyed by a VNID alone are also found
//! without a model, by hashing all 2^24 VNIDs once (a fraction of a second), because a trace
//! run without `--state` should still say *which* tenant's rule dropped a packet.

use std::collections::HashMap;

use serde::Serialize;

use crate::cluster::ClusterState;
use crate::domain::Vnid;
use crate::store::Owner;

/// What a cookie says about its flow's owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CookieOwner {
    pub cookie: String,
    /// `pod`, `service`, ...; `unknown` for a kind this version does not know; `none` for
    /// cookie 0 (a flow someone else added).
    pub kind: String,
    pub generation: u32,
    /// The owner (`pod/team-a/a1`, `vnid/11`), when it was identified.
    pub owner: Option<String>,
    /// What the owner is, for people (`the pipeline's fixed flows`, `EgressNetworkPolicy
    /// team-a/default`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl std::fmt::Display for CookieOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.owner, &self.detail) {
            (Some(o), Some(d)) => write!(f, "{o} ({d})"),
            (Some(o), None) => f.write_str(o),
            (None, _) if self.kind == "none" => f.write_str("no owner (cookie 0: not a flow of sdn-node)"),
            (None, _) => write!(f, "{} (unknown object)", self.kind),
        }
    }
}

/// Owners by (kind, hash).
#[derive(Debug, Default)]
pub struct OwnerIndex {
    by_key: HashMap<(u8, u32), Owner>,
    details: HashMap<Owner, String>,
    /// Search every VNID for VNID-keyed kinds the model does not name.
    pub brute_force_vnids: bool,
}

fn key(cookie: u64) -> (u8, u32) {
    ((cookie >> 56) as u8, cookie as u32)
}

impl OwnerIndex {
    pub fn new() -> OwnerIndex {
        let mut ix = OwnerIndex { brute_force_vnids: true, ..Default::default() };
        ix.add(Owner::Base, "the pipeline's fixed flows");
        ix.add(Owner::Version, "the pipeline's version note");
        ix.add(Owner::PolicyPlugin, "the policy plugin's fixed rules");
        ix.add(Owner::MulticastVxlan, "multicast to remote nodes");
        ix.add(Owner::Shared, "a NetworkPolicy source clause the rules of several namespaces name");
        ix
    }

    pub fn add(&mut self, owner: Owner, detail: impl Into<String>) {
        let detail = detail.into();
        if !detail.is_empty() {
            self.details.insert(owner.clone(), detail);
        }
        self.by_key.insert(key(owner.cookie(0)), owner);
    }

    /// Every owner `state` can give rise to.
    pub fn add_state(&mut self, state: &ClusterState) {
        for p in &state.pods {
            self.add(Owner::Pod { namespace: p.namespace.clone(), name: p.name.clone() }, "");
        }
        for s in &state.services {
            self.add(Owner::Service { namespace: s.namespace.clone(), name: s.name.clone() }, "");
        }
        for h in &state.host_subnets {
            self.add(
                Owner::HostSubnet { host: h.host.clone() },
                format!("node {} at {}, subnet {}", h.host, h.host_ip, h.subnet.map(ipnet::IpNet::V4).or(h.subnet6.map(ipnet::IpNet::V6)).map_or("none".into(), |n| n.to_string())),
            );
        }
        let mut vnids: HashMap<Vnid, Vec<String>> = HashMap::new();
        for n in &state.net_namespaces {
            vnids.entry(n.vnid).or_default().push(n.name.clone());
        }
        for (vnid, mut names) in vnids {
            names.sort();
            let ns = names.join(", ");
            let egress: Vec<String> = state
                .egress_policies
                .iter()
                .filter(|p| state.vnid_of(&p.namespace) == Some(vnid))
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .collect();
            let egress = if egress.is_empty() {
                format!("egress policy of {ns}")
            } else {
                format!("EgressNetworkPolicy {}", egress.join(", "))
            };
            self.add(Owner::EgressPolicy { vnid }, egress);
            self.add(Owner::Multicast { vnid }, format!("multicast of {ns}"));
            self.add(Owner::VnidRule { vnid }, format!("VNID {vnid} may talk to itself: {ns}"));
        }
        for v in state.host_subnets.iter().filter_map(|h| h.fixed_vnid) {
            for o in [Owner::EgressPolicy { vnid: v }, Owner::Multicast { vnid: v }, Owner::VnidRule { vnid: v }] {
                if !self.by_key.contains_key(&key(o.cookie(0))) {
                    self.add(o, "");
                }
            }
        }
    }

    /// The owner of a flow with `cookie`.
    pub fn resolve(&self, cookie: u64) -> CookieOwner {
        let (kind, _) = key(cookie);
        let generation = Owner::generation_of(cookie);
        let mut out = CookieOwner {
            cookie: format!("{cookie:#x}"),
            kind: match (cookie, Owner::kind_name(kind)) {
                (0, _) => "none".into(),
                (_, Some(k)) => k.into(),
                (_, None) => format!("unknown({kind})"),
            },
            generation,
            owner: None,
            detail: None,
        };
        if cookie == 0 {
            return out;
        }
        let owner = self.by_key.get(&key(cookie)).cloned().or_else(|| match kind {
            7 | 8 | 10 if self.brute_force_vnids => search_vnid(cookie),
            _ => None,
        });
        if let Some(o) = owner {
            out.detail = self.details.get(&o).cloned();
            out.owner = Some(o.to_string());
        }
        out
    }
}

/// The VNID-keyed owner whose cookie has `cookie`'s kind and hash, by trying every VNID.
fn search_vnid(cookie: u64) -> Option<Owner> {
    let (kind, _) = key(cookie);
    let make = |v: Vnid| match kind {
        7 => Owner::EgressPolicy { vnid: v },
        8 => Owner::Multicast { vnid: v },
        _ => Owner::VnidRule { vnid: v },
    };
    (0..=Vnid::MAX).filter_map(|v| Vnid::new(v).ok()).map(make).find(|o| key(o.cookie(0)) == key(cookie))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_known_and_searched_owners() {
        let mut ix = OwnerIndex::new();
        ix.add(Owner::Pod { namespace: "ns".into(), name: "p".into() }, "");
        let c = Owner::Pod { namespace: "ns".into(), name: "p".into() }.cookie(5);
        let r = ix.resolve(c);
        assert_eq!((r.kind.as_str(), r.owner.as_deref(), r.generation), ("pod", Some("pod/ns/p"), 5));
        let r = ix.resolve(Owner::Pod { namespace: "ns".into(), name: "q".into() }.cookie(1));
        assert_eq!(r.to_string(), "pod (unknown object)");
        let r = ix.resolve(Owner::VnidRule { vnid: Vnid::new(4242).unwrap() }.cookie(3));
        assert_eq!(r.owner.as_deref(), Some("vnid/4242"));
        assert_eq!(ix.resolve(Owner::Base.cookie(9)).to_string(), "base (the pipeline's fixed flows)");
        assert_eq!(ix.resolve(0).kind, "none");
        assert_eq!(ix.resolve(0xee00_0000_0000_0001).to_string(), "unknown(238) (unknown object)");
    }
}
