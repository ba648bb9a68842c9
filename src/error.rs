//! Errors the sidecar itself answers with, and the reasons (`reach-reason`) they give. They become
//! HTTP responses, and a response's reason is read back, in one place: `http::error_response`.

use std::time::Duration;

use http::StatusCode;

use crate::config::format_duration;

/// Which affinity key bound a call (`docs/affinity.md`): each kind is its own namespace (a task
/// id never matches a context id), and a lost holder is answered in its protocol's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AffinityKey {
    /// `reach-affinity`.
    Header,
    /// `Mcp-Session-Id`.
    McpSession,
    /// An A2A task id.
    Task,
    /// An A2A context id.
    Context,
    /// An MCP server's `requestState` (multi round-trip requests, revision 2026-07-28).
    RequestState,
}

impl AffinityKey {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AffinityKey::Header => "reach-affinity",
            AffinityKey::McpSession => "Mcp-Session-Id",
            AffinityKey::Task => "taskId",
            AffinityKey::Context => "contextId",
            AffinityKey::RequestState => "requestState",
        }
    }
}

impl std::fmt::Display for AffinityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the sidecar answered a request itself instead of passing on an agent's response.
#[derive(Debug, thiserror::Error)]
pub enum ReachError {
    #[error("the request names no capability: set the `reach-capability` header or call http://<capability>.reach/")]
    MissingCapability,
    #[error(
        "`{host}` is not a capability authority: this listener routes only to `<capability>.reach`"
    )]
    ForeignHost { host: String },
    #[error("no agent known to this sidecar serves capability `{capability}`")]
    UnknownCapability { capability: String },
    #[error("no agent known to this sidecar has tool `{tool}` of MCP capability `{capability}`")]
    UnknownTool { capability: String, tool: String },
    #[error("no capability of this agent serves `{path}`")]
    NoCapabilityAt { path: String },
    #[error("no peer can take capability `{capability}` right now")]
    NoAvailableInstance {
        capability: String,
        candidates: serde_json::Value,
        attempts: usize,
    },
    #[error("agent `{agent}` is out of rotation (ejected) and takes no new work")]
    Ejected { agent: String },
    #[error("agent `{agent}` is at its concurrency limit and its queue is full")]
    Saturated {
        agent: String,
        retry_after: Duration,
    },
    #[error("this sidecar is shutting down and takes no new work")]
    Draining,
    #[error("cannot connect to {target}: {message}")]
    UpstreamConnect {
        target: String,
        message: String,
        /// The connection was refused (nothing listens there), not timed out.
        refused: bool,
    },
    /// Up (it holds other connections open) but it accepted no new one in time: its listen
    /// backlog is full. Load, not failure: answered as `saturated`.
    #[error("{target} accepted no new connection within {}: it is serving others and its listen backlog is full", format_duration(*after))]
    Backlogged { target: String, after: Duration },
    #[error("{target} failed: {message}")]
    Upstream { target: String, message: String },
    #[error("{target} did not answer within {}", format_duration(*after))]
    Timeout { target: String, after: Duration },
    /// The capability's `first_event_timeout` passed before the answer's head (or a stream's
    /// first event) came: abandoned before anything reached the caller, so it may move.
    #[error("{target} sent no answer (or first event) within {}", format_duration(*after))]
    FirstEventTimeout { target: String, after: Duration },
    #[error("the request's deadline passed before an answer came")]
    DeadlineExceeded,
    #[error("a request with this idempotency-key already ran and its response cannot be replayed")]
    IdempotencyConflict,
    #[error("target `{target}` is over its rate limit")]
    RateLimited {
        target: String,
        retry_after: Duration,
    },
    #[error("this idempotency-key was used with a different request (method, path or body); use a new key for a new request")]
    IdempotencyMismatch,
    #[error("too many keyed requests from this caller are still running; retry later")]
    IdempotencyBusy,
    #[error("the request body broke off before it was complete")]
    ClientBody,
    #[error("the request body stopped arriving")]
    BodyTimeout,
    #[error("this caller is not allowed to call capability `{capability}`")]
    Forbidden { capability: String },
    #[error("capability `{capability}` is not served at `{path}`: the path belongs to another capability, or to none")]
    CapabilityPathMismatch { capability: String, path: String },
    #[error("{0}")]
    BadRequest(String),
    #[error("no such endpoint: {0}")]
    NotFound(String),
    #[error("the sidecar failed while handling this request")]
    Internal,
    #[error("async tasks are not configured on this sidecar: set `tasks.path` (or `tasks.store`) in its bootstrap")]
    TasksDisabled,
    #[error("the task store failed: {0}")]
    TaskStore(String),
    #[error("the task store is full: {0}; try again once finished tasks are removed (`tasks.retention`)")]
    TaskStoreFull(String),
    #[error("{0}")]
    TaskConflict(String),
    #[error("the request body is larger than the {limit} bytes a task may carry (`tasks.max_payload_bytes`)")]
    PayloadTooLarge { limit: usize },
    /// A task's `reach-callback` names a destination the policy does not allow.
    #[error("{0}")]
    CallbackRefused(String),
    /// `any.reach` or `reach-intent` and no intent rule matched: `candidates` lists every
    /// rule's capability and keywords.
    #[error("no intent rule matches this call: name a capability with `reach-capability`, or say what it is for with one of the keywords of {names}")]
    IntentUnresolved {
        names: String,
        candidates: serde_json::Value,
    },
    /// Two rules matched as well as each other, or the winner's confidence is under the policy's
    /// threshold: `candidates` lists each matched capability and its keyword.
    #[error("the call's intent is ambiguous ({why}): name a capability with `reach-capability`")]
    IntentAmbiguous {
        why: String,
        candidates: serde_json::Value,
    },
    #[error("agent `{agent}` answered `{capability}` with JSON that does not match its output schema: {}", errors.join("; "))]
    InvalidOutput {
        agent: String,
        capability: String,
        /// The first few validation errors: where (a JSON pointer) and what.
        errors: Vec<String>,
    },
    /// The call's affinity key is bound to `holder`, which is out; the capability's policy is
    /// `affinity: strict`, so the call is not moved to an agent that lacks its task or session.
    #[error("agent `{holder}` holds this call's {key} for `{capability}` and is out: its task or session is not on any other agent")]
    AffinityLost {
        capability: String,
        holder: String,
        /// Which key bound it.
        key: AffinityKey,
        /// The JSON-RPC request's `id`, for an answer in the protocol's own terms.
        rpc_id: Option<Box<serde_json::Value>>,
    },
    /// The call would enter an agent and capability already on its delegation chain, or take
    /// more hops than `chains.max_hops` (`docs/chains.md`).
    #[error("calling `{capability}` would {}: the call's delegation chain is {chain} ({hops} hops)", if *looped { "enter an agent already on it (a loop)".to_owned() } else { format!("take it past {max_hops} hops (`chains.max_hops`)") })]
    LoopDetected {
        capability: String,
        /// The chain, for people: `a > b/review > c/plan`.
        chain: String,
        hops: u32,
        max_hops: u32,
        /// A loop, rather than too many hops.
        looped: bool,
    },
}

/// The `reach-reason` a sidecar puts on the answers it makes itself: the JSON `error` field too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    MissingCapability,
    ForbiddenHost,
    UnknownCapability,
    NoAvailableInstance,
    Saturated,
    Ejected,
    Draining,
    UpstreamConnectFailed,
    UpstreamFailed,
    Timeout,
    DeadlineExceeded,
    IdempotencyConflict,
    RateLimited,
    IdempotencyMismatch,
    IdempotencyBusy,
    ClientBodyError,
    BodyTimeout,
    CapabilityPathMismatch,
    BadRequest,
    NotFound,
    Internal,
    Forbidden,
    TasksDisabled,
    TaskStoreUnavailable,
    TaskStoreFull,
    TaskConflict,
    PayloadTooLarge,
    CallbackRefused,
    IntentUnresolved,
    IntentAmbiguous,
    InvalidOutput,
    AffinityLost,
    LoopDetected,
}

impl Reason {
    pub(crate) const ALL: [Reason; 33] = [
        Reason::MissingCapability,
        Reason::ForbiddenHost,
        Reason::UnknownCapability,
        Reason::NoAvailableInstance,
        Reason::Saturated,
        Reason::Ejected,
        Reason::Draining,
        Reason::UpstreamConnectFailed,
        Reason::UpstreamFailed,
        Reason::Timeout,
        Reason::DeadlineExceeded,
        Reason::IdempotencyConflict,
        Reason::RateLimited,
        Reason::IdempotencyMismatch,
        Reason::IdempotencyBusy,
        Reason::ClientBodyError,
        Reason::BodyTimeout,
        Reason::CapabilityPathMismatch,
        Reason::BadRequest,
        Reason::NotFound,
        Reason::Internal,
        Reason::Forbidden,
        Reason::TasksDisabled,
        Reason::TaskStoreUnavailable,
        Reason::TaskStoreFull,
        Reason::TaskConflict,
        Reason::PayloadTooLarge,
        Reason::CallbackRefused,
        Reason::IntentUnresolved,
        Reason::IntentAmbiguous,
        Reason::InvalidOutput,
        Reason::AffinityLost,
        Reason::LoopDetected,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::MissingCapability => "missing_capability",
            Reason::ForbiddenHost => "forbidden_host",
            Reason::UnknownCapability => "unknown_capability",
            Reason::NoAvailableInstance => "no_available_instance",
            Reason::Saturated => "saturated",
            Reason::Ejected => "ejected",
            Reason::Draining => "draining",
            Reason::UpstreamConnectFailed => "upstream_connect_failed",
            Reason::UpstreamFailed => "upstream_failed",
            Reason::Timeout => "timeout",
            Reason::DeadlineExceeded => "deadline_exceeded",
            Reason::IdempotencyConflict => "idempotency_conflict",
            Reason::RateLimited => "rate_limited",
            Reason::IdempotencyMismatch => "idempotency_mismatch",
            Reason::IdempotencyBusy => "idempotency_busy",
            Reason::ClientBodyError => "client_body_error",
            Reason::BodyTimeout => "body_timeout",
            Reason::CapabilityPathMismatch => "capability_path_mismatch",
            Reason::BadRequest => "bad_request",
            Reason::NotFound => "not_found",
            Reason::Internal => "internal",
            Reason::Forbidden => "forbidden",
            Reason::TasksDisabled => "tasks_disabled",
            Reason::TaskStoreUnavailable => "task_store_unavailable",
            Reason::TaskStoreFull => "task_store_full",
            Reason::TaskConflict => "task_conflict",
            Reason::PayloadTooLarge => "payload_too_large",
            Reason::CallbackRefused => "callback_refused",
            Reason::IntentUnresolved => "intent_unresolved",
            Reason::IntentAmbiguous => "intent_ambiguous",
            Reason::InvalidOutput => "invalid_output",
            Reason::AffinityLost => "affinity_lost",
            Reason::LoopDetected => "loop_detected",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Self> {
        Reason::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

impl ReachError {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            ReachError::MissingCapability
            | ReachError::BadRequest(_)
            | ReachError::CapabilityPathMismatch { .. }
            | ReachError::ClientBody
            | ReachError::CallbackRefused(_)
            | ReachError::IntentUnresolved { .. }
            | ReachError::IntentAmbiguous { .. } => StatusCode::BAD_REQUEST,
            ReachError::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            ReachError::IdempotencyMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            ReachError::ForeignHost { .. } | ReachError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ReachError::IdempotencyConflict => StatusCode::CONFLICT,
            ReachError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ReachError::UnknownCapability { .. }
            | ReachError::UnknownTool { .. }
            | ReachError::NoCapabilityAt { .. }
            | ReachError::NotFound(_) => StatusCode::NOT_FOUND,
            ReachError::NoAvailableInstance { .. }
            | ReachError::Saturated { .. }
            | ReachError::Backlogged { .. }
            | ReachError::Ejected { .. }
            | ReachError::IdempotencyBusy
            | ReachError::Draining => StatusCode::SERVICE_UNAVAILABLE,
            // In the protocol's own terms (`docs/affinity.md`): MCP's unknown session is a 404
            // (its client starts a new one); A2A's task-not-found is a JSON-RPC error.
            ReachError::AffinityLost { key, .. } => match key {
                AffinityKey::McpSession => StatusCode::NOT_FOUND,
                AffinityKey::Task | AffinityKey::Context | AffinityKey::RequestState => {
                    StatusCode::OK
                }
                AffinityKey::Header => StatusCode::SERVICE_UNAVAILABLE,
            },
            ReachError::UpstreamConnect { .. }
            | ReachError::Upstream { .. }
            | ReachError::InvalidOutput { .. } => StatusCode::BAD_GATEWAY,
            ReachError::Timeout { .. }
            | ReachError::FirstEventTimeout { .. }
            | ReachError::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            ReachError::LoopDetected { .. } => StatusCode::LOOP_DETECTED,
            ReachError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ReachError::TasksDisabled => StatusCode::NOT_IMPLEMENTED,
            ReachError::TaskStore(_) | ReachError::TaskStoreFull(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ReachError::TaskConflict(_) => StatusCode::CONFLICT,
            ReachError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }

    /// Why, typed: what the `reach-reason` header and the JSON `error` field say.
    pub(crate) fn reason(&self) -> Reason {
        match self {
            ReachError::MissingCapability => Reason::MissingCapability,
            ReachError::ForeignHost { .. } => Reason::ForbiddenHost,
            ReachError::UnknownCapability { .. }
            | ReachError::UnknownTool { .. }
            | ReachError::NoCapabilityAt { .. } => Reason::UnknownCapability,
            ReachError::NoAvailableInstance { .. } => Reason::NoAvailableInstance,
            ReachError::Saturated { .. } | ReachError::Backlogged { .. } => Reason::Saturated,
            ReachError::Ejected { .. } => Reason::Ejected,
            ReachError::Draining => Reason::Draining,
            ReachError::UpstreamConnect { .. } => Reason::UpstreamConnectFailed,
            ReachError::Upstream { .. } => Reason::UpstreamFailed,
            ReachError::Timeout { .. } | ReachError::FirstEventTimeout { .. } => Reason::Timeout,
            ReachError::DeadlineExceeded => Reason::DeadlineExceeded,
            ReachError::IdempotencyConflict => Reason::IdempotencyConflict,
            ReachError::RateLimited { .. } => Reason::RateLimited,
            ReachError::IdempotencyMismatch => Reason::IdempotencyMismatch,
            ReachError::IdempotencyBusy => Reason::IdempotencyBusy,
            ReachError::ClientBody => Reason::ClientBodyError,
            ReachError::BodyTimeout => Reason::BodyTimeout,
            ReachError::CapabilityPathMismatch { .. } => Reason::CapabilityPathMismatch,
            ReachError::BadRequest(_) => Reason::BadRequest,
            ReachError::NotFound(_) => Reason::NotFound,
            ReachError::Internal => Reason::Internal,
            ReachError::Forbidden { .. } => Reason::Forbidden,
            ReachError::TasksDisabled => Reason::TasksDisabled,
            ReachError::TaskStore(_) => Reason::TaskStoreUnavailable,
            ReachError::TaskStoreFull(_) => Reason::TaskStoreFull,
            ReachError::TaskConflict(_) => Reason::TaskConflict,
            ReachError::PayloadTooLarge { .. } => Reason::PayloadTooLarge,
            ReachError::CallbackRefused(_) => Reason::CallbackRefused,
            ReachError::IntentUnresolved { .. } => Reason::IntentUnresolved,
            ReachError::IntentAmbiguous { .. } => Reason::IntentAmbiguous,
            ReachError::InvalidOutput { .. } => Reason::InvalidOutput,
            ReachError::AffinityLost { .. } => Reason::AffinityLost,
            ReachError::LoopDetected { .. } => Reason::LoopDetected,
        }
    }

    /// The machine-readable code: the JSON `error` field and the `reach-reason` header.
    pub fn code(&self) -> &'static str {
        self.reason().as_str()
    }

    /// How long the caller should wait before trying this agent again, when it should wait.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            ReachError::Saturated { retry_after, .. }
            | ReachError::RateLimited { retry_after, .. } => Some(*retry_after),
            ReachError::Draining
            | ReachError::IdempotencyBusy
            | ReachError::Backlogged { .. }
            | ReachError::Ejected { .. }
            | ReachError::NoAvailableInstance { .. } => Some(Duration::from_secs(1)),
            // The store reopens within seconds once it can (disk space back, Redis up).
            ReachError::TaskStore(_) => Some(Duration::from_secs(2)),
            // Room comes back as finished tasks age out.
            ReachError::TaskStoreFull(_) => Some(Duration::from_secs(30)),
            _ => None,
        }
    }
}
