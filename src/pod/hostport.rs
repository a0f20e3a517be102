//! Which node interface a pod API request may put on the bridge.
//!
//! `hostVeth` names a device in the node's namespace, which the agent then adds to br0 — on
//! the kernel datapath that takes the device over (its traffic goes to the bridge, its
//! addresses stop working). So only a pod's host end is accepted: a veth, or with `internal:
//! true` a name that is free (the agent creates the OVS internal port) or already that OVS
//! internal port; never a device carrying an address (other than the IPv6 link-local every
//! interface has) or the node's default route — those are the node's own interfaces, whatever
//! their kind.

use super::PodError;
use crate::cluster::{Pod, Problem};

/// IFLA_INFO_KIND of an OVS internal port on the kernel datapath.
const OVS_INTERNAL: &str = "openvswitch";
/// On the userspace (netdev) datapath, ovs-vswitchd makes internal ports as tap devices.
const TAP: &str = "tun";

/// Refuses `pod.host_veth` unless it is a pod's port (see the module documentation).
pub async fn check(pod: &Pod) -> Result<(), PodError> {
    let object = format!("pod {}/{}", pod.namespace, pod.name);
    let host =
        hostnet::Netns::current().map_err(|e| PodError::Failed(format!("the agent's own network namespace: {e}")))?;
    let found = hostnet::host_interface(&host, &pod.host_veth)
        .await
        .map_err(|e| PodError::Failed(format!("{object}: reading interface {:?}: {e}", pod.host_veth)))?;
    verdict(pod.internal, &pod.host_veth, found.as_ref())
        .map_err(|m| PodError::Invalid(Problem::new(object, "hostVeth", m)))
}

/// The policy alone: `Err` with the reason when `name` (as found, or `None`) is refused.
pub fn verdict(internal: bool, name: &str, found: Option<&hostnet::HostInterface>) -> Result<(), String> {
    let Some(i) = found else {
        return if internal {
            Ok(())
        } else {
            Err(format!("{name:?}: no such interface on the node (the pod's host veth must exist)"))
        };
    };
    let kind = i.kind.as_deref();
    let fits = if internal { matches!(kind, Some(OVS_INTERNAL | TAP)) } else { kind == Some("veth") };
    if !fits {
        let is = match kind {
            None => "a physical (or kind-less) device".to_string(),
            Some(OVS_INTERNAL) => "an OVS internal port".to_string(),
            Some(k) => format!("a {k} device"),
        };
        let hint = if internal {
            "with internal: true the name must be free or the pod's own OVS internal port"
        } else {
            "only a pod's veth can be attached"
        };
        return Err(format!("{name:?} is {is}, not a pod's port ({hint})"));
    }
    if i.default_route {
        return Err(format!("{name:?} carries the node's default route: a node interface, not a pod's"));
    }
    if let Some(a) = i.addresses.first() {
        return Err(format!("{name:?} carries address {a}: a node interface, not a pod's"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(kind: Option<&str>, addr: Option<&str>, default_route: bool) -> hostnet::HostInterface {
        hostnet::HostInterface {
            index: 7,
            name: "x".into(),
            kind: kind.map(str::to_string),
            addresses: addr.map(|a| a.parse().unwrap()).into_iter().collect(),
            default_route,
        }
    }

    #[test]
    fn only_a_pods_port_is_accepted() {
        let ok = [
            (false, Some(iface(Some("veth"), None, false))),
            (true, None),
            (true, Some(iface(Some("openvswitch"), None, false))),
            (true, Some(iface(Some("tun"), None, false))),
        ];
        for (internal, found) in ok {
            assert_eq!(verdict(internal, "v", found.as_ref()), Ok(()), "{internal} {found:?}");
        }
        let refused: &[(bool, Option<hostnet::HostInterface>, &str)] = &[
            (false, None, "no such interface"),
            (false, Some(iface(None, None, false)), "physical"),
            (false, Some(iface(Some("dummy"), None, false)), "a dummy device"),
            (false, Some(iface(Some("bridge"), None, false)), "a bridge device"),
            (false, Some(iface(Some("openvswitch"), None, false)), "an OVS internal port"),
            (false, Some(iface(Some("tun"), None, false)), "a tun device"),
            (true, Some(iface(Some("tun"), Some("10.8.0.1/24"), false)), "carries address"),
            (true, Some(iface(Some("veth"), None, false)), "a veth device"),
            (false, Some(iface(Some("veth"), Some("192.0.2.1/24"), false)), "carries address 192.0.2.1/24"),
            (false, Some(iface(Some("veth"), Some("2001:db8::1/64"), false)), "carries address 2001:db8::1/64"),
            (false, Some(iface(Some("veth"), None, true)), "default route"),
            (true, Some(iface(Some("openvswitch"), Some("10.0.0.1/8"), false)), "carries address"),
        ];
        for (internal, found, why) in refused {
            let e = verdict(*internal, "uplink0", found.as_ref()).unwrap_err();
            assert!(e.contains(why) && e.contains("\"uplink0\""), "{e} (wanted {why:?})");
        }
    }
}
