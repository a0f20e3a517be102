//! Why a pod request failed, in the domain's words. The pod API maps these to HTTP statuses
//! (the api module) and the CNI plugin maps those to CNI error codes; nothing below the API
//! knows either. Every failure leaves nothing of the request behind (see [`super::pods`]).

use crate::cluster::Problem;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    /// A field of the request is malformed or invalid (HTTP 400).
    #[error("{0}")]
    Invalid(Problem),
    /// The request conflicts with another pod, port or sandbox (409).
    #[error("{0}")]
    Conflict(Problem),
    /// No such pod (404).
    #[error("{0}")]
    NotFound(String),
    /// OVSDB or the switch is not connected or not synced yet, or there is no cluster state
    /// (503, retry later).
    #[error("{0}")]
    NotReady(String),
    /// The request's deadline passed (504).
    #[error("{0}")]
    Deadline(String),
    /// The switch or OVSDB refused the change (500).
    #[error("{0}")]
    Refused(String),
    /// Anything else that failed on the node: the kernel, the checkpoint (500).
    #[error("{0}")]
    Failed(String),
}

impl From<super::model::Refusal> for PodError {
    fn from(r: super::model::Refusal) -> PodError {
        match r {
            super::model::Refusal::Invalid(p) => PodError::Invalid(p),
            super::model::Refusal::Conflict(p) => PodError::Conflict(p),
            super::model::Refusal::NoState => PodError::NotReady("no cluster state yet".into()),
        }
    }
}

impl PodError {
    /// The failure's message (a [`Problem`] with its object and field).
    pub fn message(&self) -> String {
        self.to_string()
    }
}
