//! VNIDs of NetNamespaces, as openshift-sdn's master allocates them (pkg/network/master/vnids.go):
//! the global VNID 0 for the admin namespaces (default), a unique VNID of 10 to 2^24-1 for every
//! other, shared only through a `join`, released when the last NetNamespace holding it is gone.
//! The multitenant operations (`pod.network.openshift.io/multitenant.change-network` on a
//! NetNamespace) are [`Vnids::change`].
//!
//! Unlike openshift-sdn (a random free VNID) the next VNID is the next free one after the last
//! handed out, wrapping: a released VNID is reused only after the whole range has been, so a
//! node that still holds flows of a deleted namespace never sees its VNID on another one soon.
//! A restarted controller marks what the NetNamespaces hold ([`Vnids::mark`]) and resumes
//! after the highest.

use std::collections::{BTreeMap, HashMap};

/// The global VNID: its namespaces reach and are reached by every other.
pub const GLOBAL: u32 = 0;
/// The lowest VNID handed out (1 to 9 are reserved, as in openshift-sdn).
pub const MIN: u32 = 10;
/// The highest (24 bits: VXLAN's VNI).
pub const MAX: u32 = (1 << 24) - 1;

/// The annotation that asks for a multitenant operation on a NetNamespace.
pub const CHANGE_NETWORK_ANNOTATION: &str = "pod.network.openshift.io/multitenant.change-network";

/// A multitenant operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// `global`: VNID 0.
    Global,
    /// `join:NS`: NS's VNID.
    Join(String),
    /// `isolate`: a VNID of its own.
    Isolate,
}

impl Change {
    /// The annotation's value (`global`, `join:NAMESPACE`, `isolate`).
    pub fn parse(value: &str) -> Result<Change, String> {
        match value.split_once(':') {
            None if value == "global" => Ok(Change::Global),
            None if value == "isolate" => Ok(Change::Isolate),
            Some(("join", ns)) if !ns.is_empty() => Ok(Change::Join(ns.to_string())),
            _ => Err(format!("{CHANGE_NETWORK_ANNOTATION}: {value:?} is not global, isolate or join:NAMESPACE")),
        }
    }
}

#[derive(Debug, Default)]
pub struct Vnids {
    /// NetNamespace → VNID.
    ids: HashMap<String, u32>,
    /// VNID → how many NetNamespaces hold it.
    counts: BTreeMap<u32, u32>,
    /// The last VNID handed out.
    last: u32,
}

impl Vnids {
    pub fn new() -> Vnids {
        Vnids { last: MIN - 1, ..Default::default() }
    }

    pub fn get(&self, name: &str) -> Option<u32> {
        self.ids.get(name).copied()
    }

    /// How many NetNamespaces hold `vnid`.
    pub fn count(&self, vnid: u32) -> u32 {
        self.counts.get(&vnid).copied().unwrap_or(0)
    }

    /// Records that NetNamespace `name` holds `vnid` (again: replaces what it held).
    pub fn mark(&mut self, name: &str, vnid: u32) {
        if self.get(name) == Some(vnid) {
            return;
        }
        self.unmark(name);
        self.ids.insert(name.to_string(), vnid);
        *self.counts.entry(vnid).or_default() += 1;
        if (MIN..=MAX).contains(&vnid) && vnid > self.last {
            self.last = vnid;
        }
    }

    /// NetNamespace `name` is gone (or about to hold another VNID).
    pub fn unmark(&mut self, name: &str) {
        let Some(v) = self.ids.remove(name) else { return };
        if let Some(n) = self.counts.get_mut(&v) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&v);
            }
        }
    }

    /// The next free VNID (not recorded: [`Vnids::mark`] it once it is written).
    pub fn next_free(&self) -> Option<u32> {
        let range = MAX - MIN + 1;
        if self.counts.range(MIN..=MAX).count() as u32 >= range {
            return None;
        }
        let mut v = self.last;
        loop {
            v = if v >= MAX { MIN } else { v + 1 };
            if !self.counts.contains_key(&v) {
                return Some(v);
            }
        }
    }

    /// The VNID a new NetNamespace gets: 0 for a global namespace, else a free one.
    pub fn for_new(&self, name: &str, global: &[String]) -> Result<u32, String> {
        if global.iter().any(|g| g == name) {
            return Ok(GLOBAL);
        }
        self.next_free().ok_or_else(|| format!("no free VNID left ({MIN} to {MAX} are all taken)"))
    }

    /// The VNID `name` gets from a multitenant operation, `None` if it keeps its own.
    pub fn change(&self, name: &str, change: &Change, global: &[String]) -> Result<Option<u32>, String> {
        let Some(old) = self.get(name) else { return Err(format!("NetNamespace {name:?} has no VNID yet")) };
        let new = match change {
            Change::Global => GLOBAL,
            Change::Join(other) => {
                self.get(other).ok_or_else(|| format!("cannot join {other:?}: it has no NetNamespace"))?
            }
            Change::Isolate => {
                if global.iter().any(|g| g == name) {
                    return Err(format!("network isolation for namespace {name:?} is not allowed"));
                }
                if old != GLOBAL && self.count(old) == 1 {
                    return Ok(None);
                }
                self.next_free().ok_or_else(|| format!("no free VNID left ({MIN} to {MAX} are all taken)"))?
            }
        };
        Ok((new != old).then_some(new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g() -> Vec<String> {
        vec!["default".into()]
    }

    #[test]
    fn default_is_global_and_others_unique() {
        let mut v = Vnids::new();
        for ns in ["default", "a", "b", "c"] {
            let id = v.for_new(ns, &g()).unwrap();
            v.mark(ns, id);
        }
        assert_eq!([v.get("default"), v.get("a"), v.get("b"), v.get("c")], [Some(0), Some(10), Some(11), Some(12)]);
        // Released, then not reused before the range wraps.
        v.unmark("b");
        assert_eq!(v.for_new("d", &g()), Ok(13));
    }

    #[test]
    fn a_restart_resumes_after_the_highest_and_wraps() {
        let mut v = Vnids::new();
        v.mark("x", 500);
        v.mark("y", 12);
        v.mark("default", 0);
        assert_eq!(v.next_free(), Some(501));
        v.mark("top", MAX);
        assert_eq!(v.next_free(), Some(10));
    }

    #[test]
    fn join_isolate_global() {
        let mut v = Vnids::new();
        v.mark("default", 0);
        v.mark("a", 10);
        v.mark("b", 11);
        assert_eq!(Change::parse("join:a"), Ok(Change::Join("a".into())));
        assert!(Change::parse("join:").is_err() && Change::parse("merge").is_err());
        assert_eq!(v.change("b", &Change::Join("a".into()), &g()), Ok(Some(10)));
        v.mark("b", 10);
        assert_eq!(v.count(11), 0);
        assert_eq!(v.count(10), 2);
        // Isolating a namespace that shares its VNID gives it a new one; one alone keeps it.
        assert_eq!(v.change("b", &Change::Isolate, &g()), Ok(Some(12)));
        v.mark("b", 12);
        assert_eq!(v.change("b", &Change::Isolate, &g()), Ok(None));
        assert_eq!(v.change("b", &Change::Global, &g()), Ok(Some(0)));
        assert!(v.change("default", &Change::Isolate, &g()).unwrap_err().contains("not allowed"));
        assert!(v.change("b", &Change::Join("nope".into()), &g()).unwrap_err().contains("nope"));
        // A global namespace isolated gets its own.
        v.mark("b", 0);
        assert_eq!(v.change("b", &Change::Isolate, &g()), Ok(Some(13)));
    }
}
