//! Which interfaces are the agent's: a pod's veth is known by what was recorded when it was
//! made (the host end's name and ifindex, the pod end's name in the pod's namespace), never by
//! a name alone. Another interface that happens to carry the name (a name derived from a
//! container ID can be shared by another container; a name can be reused once freed) is not
//! touched.

use crate::{
    error::Result,
    netns::Netns,
    nl::{Link, Nl},
};

/// A pod's veth pair as the kernel has it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VethState {
    /// The host end is there (with the recorded ifindex, when one was recorded) and its peer is
    /// the pod's interface in the pod's namespace.
    Paired { host_index: u32 },
    /// No interface of that name in the host namespace.
    HostGone,
    /// The host end is there but the pod's interface is not in the pod's namespace (or is
    /// not its peer).
    PodGone { host_index: u32 },
    /// An interface of that name exists, but it is another one than recorded (another ifindex).
    NotOurs { host_index: u32 },
}

/// Looks at the veth `host_veth` (host end) ↔ `ifname` (in `pod`), as recorded: `index` is the
/// host end's ifindex when it was made (`None`: not recorded, the name is trusted).
pub async fn veth_state(
    host: &Netns,
    host_veth: &str,
    index: Option<u32>,
    pod: &Netns,
    ifname: &str,
) -> Result<VethState> {
    let host_nl = Nl::connect(host).await?;
    let Some(h) = host_nl.link_by_name(host_veth).await? else { return Ok(VethState::HostGone) };
    if index.is_some_and(|i| i != h.index) {
        return Ok(VethState::NotOurs { host_index: h.index });
    }
    let pod_nl = Nl::connect(pod).await?;
    let p = pod_nl.link_by_name(ifname).await?;
    Ok(match p {
        Some(p) if paired(&h, &p) => VethState::Paired { host_index: h.index },
        _ => VethState::PodGone { host_index: h.index },
    })
}

/// Each end names the other as its peer (ifindexes are per namespace, so both directions are
/// checked).
fn paired(host: &Link, pod: &Link) -> bool {
    host.peer == Some(pod.index) && pod.peer == Some(host.index)
}

/// The ifindex of `name` in `ns`, if it exists.
pub async fn ifindex(ns: &Netns, name: &str) -> Result<Option<u32>> {
    let nl = Nl::connect(ns).await?;
    Ok(nl.link_by_name(name).await?.map(|l| l.index))
}

/// What [`delete_owned`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    /// The recorded interface was deleted.
    Yes,
    /// Nothing of that name: already gone (deleting one end of a veth, or its namespace,
    /// deletes both).
    Gone,
    /// An interface of that name exists but is not the recorded one: left alone.
    NotOurs { index: u32 },
}

/// Deletes the host end `host_veth` if it is the interface recorded with ifindex `index`
/// (`None`: not recorded, the name is trusted). Deleted by index, so an interface made under
/// the name after the look-up is never the one deleted.
pub async fn delete_owned(host: &Netns, host_veth: &str, index: Option<u32>) -> Result<Deleted> {
    crate::names::check_ifname(host_veth)?;
    let nl = Nl::connect(host).await?;
    let Some(link) = nl.link_by_name(host_veth).await? else { return Ok(Deleted::Gone) };
    if index.is_some_and(|i| i != link.index) {
        return Ok(Deleted::NotOurs { index: link.index });
    }
    // From a thread of its own: the kernel deletes a veth inside the request (see Nl::detached).
    let (index, name) = (link.index, host_veth.to_string());
    Nl::detached(host, format!("link {host_veth}"), move |nl| async move { nl.link_del(index, &name).await }).await?;
    Ok(Deleted::Yes)
}
