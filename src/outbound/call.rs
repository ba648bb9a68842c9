//! What passes between the outbound steps: a call, one attempt, and the routed answer (a call's
//! plan, its candidates, is the candidates step's own: [`super::candidates::Plan`]).

use std::sync::Arc;
use std::time::Instant;

use http::request::Parts;
use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;

use crate::budget::usage;
use crate::config::{AffinityMode, Name, Snapshot};
use crate::error::{AffinityKey, ReachError};
use crate::fast_hash::FastMap;
use crate::http::deadline::Deadline;
use crate::http::headers::{self, Present};
use crate::http::pool::UpstreamBody;
use crate::http::upload::{Upload, UploadWatch};
use crate::http::ReachBody;
use crate::mcp::jsonrpc::VERSION_HEADER;
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
    /// An MCP call: which of the capability's servers may take it, for the candidates step (set
    /// by the MCP step, `mcp/`).
    pub(super) mcp_route: Option<McpRoute>,
    /// An MCP call on servers' sessions: the candidates step keeps only these servers, and each
    /// attempt carries them to set its server's session (set by `mcp/broker.rs`).
    pub(super) sessions: Option<ServerSessions>,
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

/// Who may take an MCP call.
#[derive(Clone, Debug)]
pub(super) enum McpRoute {
    /// A `tools/call`: a server with the tool, not one this call already failed on.
    Tool { tool: String, excluded: Vec<String> },
    /// One server's part of a federated `tools/list`, or a call on that server's session.
    Server(String),
    /// Any server of the capability (a method that names no tool).
    Any,
}

/// One server's session, as a client's session (or the sidecar's shared one) holds it.
#[derive(Clone, Debug)]
pub(super) struct ServerSession {
    /// `None` for a server that keeps no sessions.
    pub(super) id: Option<HeaderValue>,
    /// The revision the server answered `initialize` with.
    pub(super) revision: HeaderValue,
}

/// The sessions a call may use, by server: the candidates step keeps only these servers, and
/// each attempt carries its server's session (`apply`).
#[derive(Clone, Debug, Default)]
pub(super) struct ServerSessions(pub(super) Arc<FastMap<String, ServerSession>>);

impl ServerSessions {
    /// The revision of the server that gave `response` (its `reach-agent`), when known.
    pub(super) fn revision_of(&self, response: &Response<ReachBody>) -> Option<&str> {
        let peer = response.headers().get(headers::AGENT)?.to_str().ok()?;
        self.0.get(peer)?.revision.to_str().ok()
    }

    /// Sets the request's session and revision headers to those of the server it goes to.
    pub(super) fn apply(&self, peer: &str, request_headers: &mut http::HeaderMap) {
        let Some(server) = self.0.get(peer) else {
            return;
        };
        match &server.id {
            Some(id) => request_headers.insert(headers::MCP_SESSION_ID, id.clone()),
            None => request_headers.remove(headers::MCP_SESSION_ID),
        };
        request_headers.insert(VERSION_HEADER, server.revision.clone());
    }
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
    /// An MCP call on servers' sessions: the endpoint sets the session of the server the attempt
    /// goes to.
    pub(super) sessions: Option<ServerSessions>,
}

/// A peer's answer to one attempt.
pub(super) struct Answer<B = UpstreamBody> {
    pub(super) response: Response<B>,
    /// An external target's answer: its tokens are counted as its body passes (and the
    /// attempt's span, when the call is traced, ends with them: `attempts/retry.rs`). `None`
    /// for most answers; boxed: the answer passes up through the routing future by value.
    pub(super) tokens: Option<Box<usage::Watch>>,
}

impl<B> Answer<B> {
    /// `response`, whose tokens `tokens` counts.
    pub(super) fn new(response: Response<B>, tokens: Option<usage::Watch>) -> Self {
        let tokens = tokens.map(Box::new);
        Answer { response, tokens }
    }
}

impl<B> From<Response<B>> for Answer<B> {
    fn from(response: Response<B>) -> Self {
        Answer {
            response,
            tokens: None,
        }
    }
}

/// What routing came to, for the record step to answer with.
pub(super) struct Routed<B = UpstreamBody> {
    pub(super) answer: Result<Response<B>, ReachError>,
    /// The answer's token count (see [`Answer`]).
    pub(super) tokens: Option<Box<usage::Watch>>,
    /// The capability's metric label (never a caller's typo: see `candidates`).
    pub(super) label: String,
    /// The peer that gave the answer, `-` when none did.
    pub(super) peer: String,
    /// Attempts made, for `reach-attempts`; `None` when routing never started.
    pub(super) attempts: Option<usize>,
}

/// A routed call's answer, recorded: what the routing step gives the steps above it.
pub(super) struct Recorded {
    pub(super) response: Response<ReachBody>,
    /// On the sidecar's own refusal, the peer the last attempt went to: an MCP tool call's
    /// timeout is that server's tool's (`mcp/tool_call.rs`). `None` on an answer from a peer,
    /// which names its agent in `reach-agent`.
    pub(super) last_tried: Option<String>,
}

impl<B> Routed<B> {
    pub(super) fn refused(label: &str, err: ReachError) -> Self {
        Routed {
            answer: Err(err),
            tokens: None,
            label: label.to_owned(),
            peer: "-".to_owned(),
            attempts: None,
        }
    }

    /// The same, its answer's response made another by `f` (given the label and the peer).
    pub(super) fn map<C>(
        self,
        f: impl FnOnce(Response<B>, &str, &str) -> Response<C>,
    ) -> Routed<C> {
        let Routed {
            answer,
            tokens,
            label,
            peer,
            attempts,
        } = self;
        let answer = answer.map(|response| f(response, &label, &peer));
        Routed {
            answer,
            tokens,
            label,
            peer,
            attempts,
        }
    }

    /// `answer`, from `peer`, after `attempts`.
    pub(super) fn answered(
        answer: Result<Answer<B>, ReachError>,
        label: &str,
        peer: &str,
        attempts: usize,
    ) -> Self {
        let (answer, tokens) = match answer {
            Ok(Answer { response, tokens }) => (Ok(response), tokens),
            Err(err) => (Err(err), None),
        };
        Routed {
            answer,
            tokens,
            label: label.to_owned(),
            peer: peer.to_owned(),
            attempts: Some(attempts),
        }
    }
}
