//! How a task hears its chain's attempts as they end: the runner hands its chain a [`Journal`]
//! with the stored request, the routing step reports each attempt to it, and the runner
//! commits each one to the task's record. The seam between routing and tasks, owned here so
//! routing depends on tasks and not the other way round.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use http::{Request, Response};

use crate::http::ReachBody;

/// One attempt of a call.
#[derive(Clone, Debug)]
pub(crate) struct AttemptNote {
    pub(crate) peer: String,
    pub(crate) started: std::time::SystemTime,
    pub(crate) duration: std::time::Duration,
    /// The metrics' outcome label.
    pub(crate) outcome: &'static str,
    pub(crate) status: Option<u16>,
    /// The `reach-reason`, the error, or the status.
    pub(crate) reason: String,
}

/// Where a call's attempts are reported as they end.
#[derive(Clone, Debug)]
pub(crate) struct Journal(pub(crate) tokio::sync::mpsc::UnboundedSender<AttemptNote>);

impl Journal {
    pub(crate) fn note(&self, note: AttemptNote) {
        // The runner stopped listening (its lease was lost): nothing to tell.
        let _ = self.0.send(note);
    }
}

/// What runs a task's stored call: the outbound routing (`Outbound::run_task`).
pub(crate) trait Chain: Send + Sync + 'static {
    /// Routes `request` for `capability` as a call would be routed, reporting its attempts to
    /// `journal`.
    fn run<'a>(
        &'a self,
        capability: &'a str,
        request: Request<Bytes>,
        journal: Journal,
    ) -> Pin<Box<dyn Future<Output = Response<ReachBody>> + Send + 'a>>;
}
