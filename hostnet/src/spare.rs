//! Spare pod interfaces: veth pairs made before any pod asks for one, so that a pod's ADD only
//! has to move an interface into its sandbox instead of creating one and waiting for Open
//! vSwitch to add a port (which costs ovs-vswitchd a reconfiguration of the whole bridge, linear
//! in its number of ports: ~100 ms at 250 ports on the userspace datapath, seconds at 2,000).
//!
//! A spare's host end sits in the host namespace (the caller adds it to the bridge); its other
//! end waits, under the same name, in a *holding* namespace that nothing else sees
//! ([`Netns::create_anonymous`]: when its last handle closes, the kernel destroys it and every
//! spare pair with it, so an agent that dies leaves no interfaces behind). [`claim_spare`]
//! moves the waiting end into the pod's namespace, renamed, with the pod's MAC and MTU, in one
//! netlink request ([`move_spare`]), then configures it exactly as [`crate::setup_pod`] does
//! ([`configure_pod`]).

use rtnetlink::packet_route::link::{InfoData, InfoVeth, LinkAttribute, LinkMessage};

use crate::{
    error::{Error, Result},
    ethtool,
    names::check_ifname,
    netns::Netns,
    nl::Nl,
    pod::{configure_pod, delete_by_name, undone, PodConfig, PodInterface},
};

/// Creates spare pair `name`: the host end `name` in `host` (up, with `mtu`), the other end
/// `name` in `hold` with `mtu` and TX checksum offload off (a device property, kept when the
/// end later moves into a pod). On failure nothing of it is left.
pub async fn create_spare(host: &Netns, hold: &Netns, name: &str, mtu: u32) -> Result<()> {
    check_ifname(name)?;
    let host_nl = Nl::connect(host).await?;
    let mut peer = LinkMessage::default();
    peer.attributes.push(LinkAttribute::IfName(name.to_string()));
    peer.attributes.push(LinkAttribute::Mtu(mtu));
    peer.attributes.push(LinkAttribute::NetNsFd(hold.raw_fd()));
    let msg = rtnetlink::LinkVeth::new(name, name).mtu(mtu).set_info_data(InfoData::Veth(InfoVeth::Peer(peer))).build();
    host_nl.link_add(msg, &format!("spare veth {name}")).await?;
    let finish = async {
        let n = name.to_string();
        hold.run("disable tx checksum offload", move || ethtool::set_tx_checksum(&n, false)).await?;
        let link = host_nl.require_link("spare veth", name).await?;
        host_nl.link_up(&link, None).await
    };
    match finish.await {
        Ok(()) => Ok(()),
        Err(first) => Err(undone(first, delete_by_name(&host_nl, name).await)),
    }
}

/// Gives spare `name` (host end `name` in `host`, waiting in `hold`) to a pod: [`move_spare`],
/// then [`configure_pod`]. On failure the whole pair is deleted — a spare half-given to a pod is
/// never reused — and the error says why. (The agent runs the two steps itself, so that its one
/// undo path covers them; this is the whole for everyone else.)
pub async fn claim_spare(host: &Netns, hold: &Netns, pod: &Netns, name: &str, cfg: &PodConfig) -> Result<PodInterface> {
    move_spare(hold, pod, name, cfg).await?;
    match configure_pod(host, pod, cfg, name).await {
        Ok(made) => Ok(made),
        Err(first) => {
            // Deleting the host end deletes the pair, wherever its other end is.
            let undo = match Nl::connect(host).await {
                Ok(nl) => delete_by_name(&nl, name).await,
                Err(e) => Err(e),
            };
            Err(undone(first, undo))
        }
    }
}

/// Moves the waiting end of spare `name` from `hold` into `pod` as `cfg.ifname`, with `cfg.mac`
/// and `cfg.mtu`: one netlink request, so the end is moved and renamed or not at all. The host
/// end keeps `name` (`cfg.host_ifname` is ignored). A name already taken in the sandbox is
/// [`Error::Exists`] (nothing moved).
pub async fn move_spare(hold: &Netns, pod: &Netns, name: &str, cfg: &PodConfig) -> Result<()> {
    cfg.validate()?;
    check_ifname(name)?;
    let hold_nl = Nl::connect(hold).await?;
    let pod_nl = Nl::connect(pod).await?;
    if pod_nl.link_by_name(&cfg.ifname).await?.is_some() {
        return Err(Error::Exists { kind: "pod interface", name: format!("{} (netns {})", cfg.ifname, pod.path().display()) });
    }
    let spare = hold_nl.require_link("spare veth", name).await?;
    let mut msg = LinkMessage::default();
    msg.header.index = spare.index;
    msg.attributes.push(LinkAttribute::NetNsFd(pod.raw_fd()));
    msg.attributes.push(LinkAttribute::IfName(cfg.ifname.clone()));
    msg.attributes.push(LinkAttribute::Mtu(cfg.mtu));
    if let Some(mac) = cfg.mac {
        msg.attributes.push(LinkAttribute::Address(mac.0.to_vec()));
    }
    let what = format!("spare veth {name} -> {} (pod {})", cfg.ifname, pod.path().display());
    // From a thread of its own: the kernel moves the device inside the request (see
    // Nl::detached). `msg` names `pod` by descriptor: `pod` outlives the call.
    let w = what.clone();
    Nl::detached(hold, what, move |nl| async move { nl.link_set(msg, &w).await }).await
}
