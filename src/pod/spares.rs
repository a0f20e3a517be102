//! Warm ports: a few pod interfaces kept ready on the bridge (`run --warm-ports N`), so that a
//! CNI ADD does not wait for ovs-vswitchd to add a port.
//!
//! Why: adding a port makes ovs-vswitchd reconfigure the whole bridge, and on the userspace
//! datapath open the device too — ~100 ms at 250 ports, seconds at 2,000 — and the pod's flows
//! wait behind it (the same main loop commits bundles). Every other step of an ADD takes a few
//! milliseconds. A spare is a veth pair made ahead of time ([`hostnet::create_spare`]: host
//! end on the bridge with its ofport known, other end waiting in a holding namespace only this
//! process holds) that an ADD moves into the pod's sandbox ([`hostnet::claim_spare`]); its
//! port then gets the pod's record in one OVSDB transaction that changes only `external_ids`
//! (ovs-vswitchd's pass over it is cheap: no device opens, no port added).
//!
//! The pool refills in the background, a short quiet moment after the last ADD took from it
//! (so a burst of ADDs is not slowed down by the refill's reconfiguration), all missing spares
//! in one transaction (one reconfiguration). An empty pool is no failure: ADD then makes its
//! interface and port itself. Spares are never reused once given to a pod; a DEL deletes the
//! pod's interface as before.
//!
//! Restart safety: the holding namespace has no name, so when the agent dies the kernel
//! destroys it with every waiting spare; their ports (marked [`SPARE_KEY`], no pod record) are
//! then ports nobody wants, and the reconcile loop removes them. A spare given to a pod carries
//! the pod's record like any pod port.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::debug;



/// How long the pool waits after the last take before refilling.
pub(super) const QUIET: Duration = Duration::from_millis(150);
/// How long the pool waits after a failed refill.
pub(super) const BACKOFF: Duration = Duration::from_secs(5);

/// One spare: its name (host end and, until claimed, the waiting end) and its ofport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spare {
    pub name: String,
    pub ofport: u32,
}

#[derive(Default)]
pub(super) struct Inner {
    pub(super) free: Vec<Spare>,
    /// Every name the pool owns: free, being made, or being given to a pod. The reconcile
    /// loop keeps these ports.
    pub(super) owned: HashSet<String>,
    pub(super) hold: Option<hostnet::Netns>,
    pub(super) last_take: Option<Instant>,
    /// Taken spares not yet moved into their sandbox.
    moving: usize,
    /// Recent cost of adding a port (OVSDB transaction to ofport) and of moving a spare into
    /// a sandbox, in ms (moving averages; None until measured).
    port_add_ms: Option<f64>,
    move_ms: Option<f64>,
}

/// Whether one more move (with `moving` under way) is expected to beat adding a port; one at
/// a time until both costs are known.
fn worth_moving(moving: usize, port_add_ms: Option<f64>, move_ms: Option<f64>) -> bool {
    match (port_add_ms, move_ms) {
        (Some(add), Some(mv)) => (moving + 1) as f64 * mv < add,
        _ => moving == 0,
    }
}

/// Weight of the newest sample in the moving averages.
const ALPHA: f64 = 0.3;

fn average(avg: &mut Option<f64>, d: Duration) {
    let x = d.as_secs_f64() * 1e3;
    *avg = Some(match *avg {
        Some(a) => a + ALPHA * (x - a),
        None => x,
    });
}

/// The pool; see the module documentation.
#[derive(Default)]
pub struct Spares {
    pub(super) want: usize,
    /// Use a spare whenever one is ready, whatever the costs measured (tests).
    always: bool,
    inner: Mutex<Inner>,
    pub(super) wake: Notify,
}

impl Spares {
    pub fn new(want: usize, always: bool) -> Spares {
        Spares { want, always, ..Default::default() }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many spares are ready now.
    pub fn ready(&self) -> usize {
        self.lock().free.len()
    }

    /// Whether `port` is one of the pool's (free, being made, or being claimed).
    pub fn owns(&self, port: &str) -> bool {
        self.lock().owned.contains(port)
    }

    /// The holding namespace's identity, if there is one: never a pod's sandbox.
    pub fn hold_id(&self) -> Option<hostnet::NsId> {
        self.lock().hold.as_ref().and_then(|h| h.id().ok())
    }

    /// Takes a ready spare (and the holding namespace it waits in) if one is ready and worth
    /// it. The pool still owns its name until [`Spares::release`]; the caller reports the
    /// move's end with [`Spares::moved`].
    ///
    /// Worth it: moving an interface between network namespaces costs the kernel an RCU
    /// barrier under the rtnl lock (~20 ms here, like deleting a veth, against ~3 ms for
    /// creating a pair with one end already in the sandbox), and moves run one after another.
    /// So a spare is taken only while waiting for the moves already under way plus this one
    /// is expected to cost less than adding a port (the moving averages of both): on a small
    /// bridge ovs-vswitchd adds a port in a few milliseconds and no spare is used; at 250
    /// ports a few moves may queue; at 2,000 (seconds per port) a whole burst does. An ADD
    /// that does not take one makes its own interface and port, and concurrent ones share a
    /// port transaction. Until both costs are measured, one move at a time.
    /// Also returns how many moves were under way already (for [`Spares::moved`]).
    pub fn take(&self) -> Option<(Spare, hostnet::Netns, usize)> {
        let mut g = self.lock();
        if !self.always && !worth_moving(g.moving, g.port_add_ms, g.move_ms) {
            return None;
        }
        let hold = g.hold.clone()?;
        let spare = g.free.pop()?;
        let ahead = g.moving;
        g.moving += 1;
        g.last_take = Some(Instant::now());
        drop(g);
        self.wake.notify_one();
        Some((spare, hold, ahead))
    }

    /// A taken spare that was not used goes back to the pool.
    pub fn put_back(&self, spare: Spare) {
        let mut g = self.lock();
        g.free.push(spare);
        g.moving = g.moving.saturating_sub(1);
    }

    /// A taken spare's move into its sandbox is over (done or failed) after `took`, with
    /// `ahead` moves under way when it was taken: moves queue in the kernel, so one move's
    /// cost is about `took / (ahead + 1)` (counting the queue in would make a burst look as
    /// if moves had become expensive, and send it down the slow path).
    pub fn moved(&self, took: Duration, ahead: usize) {
        let mut g = self.lock();
        g.moving = g.moving.saturating_sub(1);
        average(&mut g.move_ms, took / (ahead as u32 + 1));
        debug!(took_ms = took.as_secs_f64() * 1e3, ahead, move_ms = ?g.move_ms, port_add_ms = ?g.port_add_ms, "spare moved");
    }

    /// A new port (a pod's or the pool's) took `took` from its transaction to its ofport.
    pub fn port_added(&self, took: Duration) {
        let mut g = self.lock();
        average(&mut g.port_add_ms, took);
        debug!(took_ms = took.as_secs_f64() * 1e3, port_add_ms = ?g.port_add_ms, "port added");
    }

    /// A taken spare is a pod's now (or was destroyed): its name is no longer the pool's.
    pub fn release(&self, name: &str) {
        self.lock().owned.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_queue_while_they_beat_a_port() {
        // Small bridge: a port is cheaper than a move, no spare.
        assert!(!worth_moving(0, Some(5.0), Some(20.0)));
        // 250 ports: up to four moves of 20 ms beat a 100 ms port.
        assert!(worth_moving(3, Some(100.0), Some(20.0)));
        assert!(!worth_moving(4, Some(100.0), Some(20.0)));
        // 2,000 ports: a whole burst queues.
        assert!(worth_moving(29, Some(3000.0), Some(25.0)));
        // Unknown costs: one at a time.
        assert!(worth_moving(0, None, Some(20.0)) && !worth_moving(1, None, Some(20.0)));
        assert!(worth_moving(0, Some(100.0), None) && !worth_moving(1, Some(100.0), None));
    }

    #[test]
    fn a_move_is_charged_its_share_of_the_queue() {
        let s = Spares::new(4, false);
        s.lock().moving = 4;
        // Four moves queued ahead: 100 ms observed is 20 ms of moving.
        s.moved(Duration::from_millis(100), 4);
        assert_eq!(s.lock().move_ms.map(|m| m.round()), Some(20.0));
        s.moved(Duration::from_millis(20), 0);
        assert_eq!(s.lock().move_ms.map(|m| m.round()), Some(20.0));
        assert_eq!(s.lock().moving, 2);
        s.port_added(Duration::from_millis(100));
        s.port_added(Duration::from_millis(200));
        // Moving average: 100 + 0.3 * (200 - 100).
        assert_eq!(s.lock().port_add_ms.map(|m| m.round()), Some(130.0));
    }

    #[test]
    fn nothing_is_taken_without_a_holding_namespace_or_a_spare() {
        let s = Spares::new(2, true);
        assert!(s.take().is_none(), "no holding namespace yet");
        assert_eq!(s.lock().moving, 0, "a refused take leaves no trace");
    }
}
