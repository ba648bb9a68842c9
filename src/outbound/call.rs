//! What passes between the outbound steps: a call, one attempt, and the routed answer (a call's
//! plan, its candidates, is the candidates step's own: [`super::candidates::Plan`]).

use std::sync::Arc;
use std::time::Instant;

use http::request::Parts;
use http::{Request, Response};
use hyper::body::Incoming;

use crate::config::{AffinityMode, Name, Snapshot};
use crate::error::{AffinityKey, ReachError};
use crate::http::deadline::Deadline;
use crate::http::headers::Present;
use crate::http::pool::UpstreamBody;
use crate::http::upload::{Upload, UploadWatch};
use crate::http::ReachBody;
use crate::peers::Scored;
use crate::tasks::Journal;

/// One call from the local agent, its body read (or ready to stream), under one config snapshot.
pub(super) struct Call {
    pub(super) capability: Name,
    pub(super) parts: Box<Parts>,
    pub(super) upload: Upload<Incoming>,
    pub(super) deadline: Option<Deadline>,
    pub(super) snapshot: Arc<Snapshot>,
    pub(super) started: Instant,
    /// Which of the headers the steps read the agent sent (one pass over the names).
    pub(super) present: Present,
    /// What a step learned of the call for a later one (`None` for most calls). Boxed: every
    /// step's future holds the call.
    pub(super) carried: Option<Box<Carried>>,
}

/// What a call carries from the step (or the task's runner) that set it to the steps that act on
/// it.
#[derive(Clone, Debug, Default)]
pub(super) struct Carried {
    /// A task's stored call: where the routing step reports each attempt as it ends (the task's
    /// runner listens, `src/tasks/runner.rs`).
    pub(super) journal: Option<Journal>,
    /// A call whose affinity key is bound: the key's holder, for the candidates step to route to
    /// (set by `affinity`).
    pub(super) pinned: Option<Pinned>,
}

impl Call {
    /// What the call carries, made when a step first sets some of it.
    pub(super) fn carried_mut(&mut self) -> &mut Carried {
        self.carried.get_or_insert_with(Box::default)
    }
}

/// A bound call's holder: the agent that answered its key before.
#[derive(Clone, Debug)]
pub(super) struct Pinned {
    pub(super) holder: Arc<str>,
    pub(super) kind: AffinityKey,
    pub(super) mode: AffinityMode,
}

/// One attempt on one peer.
pub(super) struct Try {
    pub(super) request: Request<ReachBody>,
    pub(super) candidate: Scored,
    pub(super) deadline: Option<Deadline>,
    /// A keyed call's original may run past one attempt's timeout, up to this.
    pub(super) keyed_deadline: Option<Deadline>,
    pub(super) upload: UploadWatch,
    pub(super) snapshot: Arc<Snapshot>,
    /// The capability's `first_event_timeout`, when it has one.
    pub(super) first_event: Option<std::time::Duration>,
}

/// What routing came to, for the record step to answer with.
pub(super) struct Routed<B = UpstreamBody> {
    pub(super) answer: Result<Response<B>, ReachError>,
    /// The capability's metric label (never a caller's typo: see `candidates`).
    pub(super) label: String,
    /// The peer that gave the answer, `-` when none did.
    pub(super) peer: String,
    /// Attempts made, for `reach-attempts`; `None` when routing never started.
    pub(super) attempts: Option<usize>,
}

/// On a refusal's response, inside the sidecar only: the peer the last attempt went to (an MCP
/// tool call's timeout is that server's tool's, `src/outbound/mcp/tool_call.rs`). Set on the
/// refusal path alone: an answer from a peer names its agent in `reach-agent`.
#[derive(Clone, Debug)]
pub(super) struct LastTried(pub(super) String);

impl<B> Routed<B> {
    pub(super) fn refused(label: &str, err: ReachError) -> Self {
        Routed {
            answer: Err(err),
            label: label.to_owned(),
            peer: "-".to_owned(),
            attempts: None,
        }
    }
}
