//! Failure injection for tests of the pod path's one undo path (`run --fail-pod-steps`, hidden):
//! the next pod setup that reaches the first listed point fails there, right after the step
//! before it did its work, as if that step had failed halfway. Each point is used once, in
//! order, so one agent can fail a series of ADDs, each at a later step. Off (an empty list)
//! unless the flag is given; the check is one uncontended lock.

use std::collections::VecDeque;
use std::sync::Mutex;

/// Where a pod setup can be made to fail: after the named step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FaultPoint {
    /// The sandbox is opened and the pod's name, address and port are reserved in the model.
    Netns,
    /// The veth pair is made (fresh path).
    Veth,
    /// The warm port's pod end is moved into the sandbox and renamed (warm path).
    Rename,
    /// The pod end has its address, routes and state.
    Addresses,
    /// The port and the pod's record are in OVSDB.
    Ovsdb,
    /// The pod is in the model and its flows are committed on the switch.
    Flows,
    /// The checkpoint write (it fails instead of writing).
    Checkpoint,
}

/// The points still to fail at.
#[derive(Debug, Default)]
pub struct Faults(Mutex<VecDeque<FaultPoint>>);

impl Faults {
    pub fn new(points: &[FaultPoint]) -> Faults {
        Faults(Mutex::new(points.iter().copied().collect()))
    }

    /// `Err` (naming the point) if `at` is the next point to fail at; the point is used up.
    pub fn hit(&self, at: FaultPoint) -> Result<(), String> {
        let mut q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if q.front() == Some(&at) {
            q.pop_front();
            return Err(format!("injected failure after step {at:?} (--fail-pod-steps)"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_point_fails_once_in_order() {
        let f = Faults::new(&[FaultPoint::Veth, FaultPoint::Flows]);
        assert!(f.hit(FaultPoint::Flows).is_ok(), "not before the points ahead of it");
        assert!(f.hit(FaultPoint::Veth).is_err());
        assert!(f.hit(FaultPoint::Veth).is_ok(), "used up");
        assert!(f.hit(FaultPoint::Flows).unwrap_err().contains("Flows"));
        assert!(Faults::default().hit(FaultPoint::Netns).is_ok());
    }
}
