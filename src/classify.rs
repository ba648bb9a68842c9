//! What an answer meant: the one place that decides it. Inbound measurement, the outbound retry
//! table, probes, the metrics' `outcome` label and `docs/reach-model.md` all ask [`Class`], and a
//! sidecar's `reach-reason` values (typed once, as [`Reason`]) are read only here.
//!
//! The classes (see the table test at the end for every case):
//!
//! | class | what happened | the view learns | retried |
//! |---|---|---|---|
//! | `Success` | the agent answered with a status of its own choosing (2xx–4xx) | success | no |
//! | `Failed` | it reached the agent, which failed (5xx, a broken exchange) | failure | idempotent only |
//! | `Failed`, `502 invalid_output` | the agent answered, but not in its capability's output schema | failure | idempotent, keyed or async: elsewhere, never the same agent |
//! | `Refused` | refused with a cooldown before anything ran (429; an agent's 503 with `retry-after`) | refusal | yes, elsewhere |
//! | `Shed` | a sidecar turned it away before any agent saw it (admission full, or the agent's listen backlog full while it serves others) | cooldown only | yes, elsewhere, at once when full |
//! | `Stale` | `404 unknown_capability`: the caller's registry is stale | nothing | yes, elsewhere |
//! | `TimedOut` | no answer in time (ours, or a peer sidecar's 504) | timeout | keyed: same agent; idempotent: elsewhere |
//! | `Unreachable` | no connection: the request never left | failure (refused: unreachable) | yes, elsewhere |
//! | `Rejected` | the request itself was refused (bad input, unknown path, conflict) | nothing | no |

use std::time::Duration;

use http::{Response, StatusCode};

use crate::error::{ReachError, Reason};
use crate::http::retry_after;
use crate::reach::Signal;

/// The cooldown a refusal gets when it names none.
const DEFAULT_COOLDOWN: Duration = Duration::from_secs(1);

/// What an answer meant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    Success,
    Failed,
    Refused { retry_after: Duration },
    Shed { retry_after: Duration, why: Refusal },
    Stale,
    TimedOut,
    Unreachable { refused: bool },
    Rejected,
}

/// Why a call was refused without running: what the retry table, the metrics and the decision
/// log say of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `429` (or an agent's `503` with `retry-after`): the agent or a rate limit refused.
    RateLimited,
    /// `503 saturated` / `idempotency_busy`: the peer is full right now.
    Full,
    /// `503 draining` / `ejected`: out of rotation by its own view.
    OutOfRotation,
    /// `502 upstream_connect_failed`: the peer's agent is not running.
    AgentUnreachable,
    /// `404 unknown_capability`: the caller's registry is stale.
    UnknownCapability,
}

impl Refusal {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Refusal::RateLimited => "rate_limited",
            Refusal::Full => "saturated",
            Refusal::OutOfRotation => "refused",
            Refusal::AgentUnreachable => "agent_unreachable",
            Refusal::UnknownCapability => "unknown_capability",
        }
    }

    /// Moving the call adds load to no agent: it never reached one (only a 429 did).
    pub(crate) fn never_reached_an_agent(self) -> bool {
        self != Refusal::RateLimited
    }
}

impl Class {
    /// What a response meant, whoever made it (an agent, or a peer's sidecar with its reason).
    pub(crate) fn of_response<B>(response: &Response<B>) -> Self {
        let status = response.status();
        let asked = || retry_after::wait(response.headers());
        let shed = |why| Class::Shed {
            retry_after: asked().unwrap_or(DEFAULT_COOLDOWN),
            why,
        };
        match (status, Reason::of(response)) {
            (StatusCode::TOO_MANY_REQUESTS, _) => Class::Refused {
                retry_after: asked().unwrap_or(DEFAULT_COOLDOWN),
            },
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Some(Reason::Saturated | Reason::IdempotencyBusy),
            ) => shed(Refusal::Full),
            (StatusCode::SERVICE_UNAVAILABLE, Some(Reason::Draining | Reason::Ejected)) => {
                shed(Refusal::OutOfRotation)
            }
            (StatusCode::BAD_GATEWAY, Some(Reason::UpstreamConnectFailed)) => Class::Shed {
                // Its own view says so at once; a second is enough to hear it.
                retry_after: DEFAULT_COOLDOWN,
                why: Refusal::AgentUnreachable,
            },
            (StatusCode::NOT_FOUND, Some(Reason::UnknownCapability)) => Class::Stale,
            // The fleet's policy refused the caller: any peer would say the same, and the
            // agent never saw the call.
            (StatusCode::FORBIDDEN, Some(Reason::Forbidden)) => Class::Rejected,
            // The caller's sidecar refused to move a bound call: no other agent holds its
            // task or session, so retrying elsewhere cannot help.
            // (503, or in the protocol's terms a 404 for MCP and a JSON-RPC error for A2A.)
            (_, Some(Reason::AffinityLost)) => Class::Rejected,
            // A sidecar down the chain refused a loop: the policy's answer, not the agent's
            // failure, and any peer would pass on the same.
            (_, Some(Reason::LoopDetected)) => Class::Rejected,
            (StatusCode::GATEWAY_TIMEOUT, Some(Reason::Timeout | Reason::DeadlineExceeded)) => {
                Class::TimedOut
            }
            // An agent's "come back later": it did not run the call.
            (StatusCode::SERVICE_UNAVAILABLE, None) => match asked() {
                Some(retry_after) => Class::Refused { retry_after },
                None => Class::Failed,
            },
            (s, _) if s.is_server_error() => Class::Failed,
            _ => Class::Success,
        }
    }

    /// What an error the sidecar met (or made) meant.
    pub(crate) fn of_error(err: &ReachError) -> Self {
        match err {
            ReachError::Timeout { .. }
            | ReachError::FirstEventTimeout { .. }
            | ReachError::DeadlineExceeded => Class::TimedOut,
            ReachError::UpstreamConnect { refused, .. } => Class::Unreachable { refused: *refused },
            ReachError::Upstream { .. }
            | ReachError::Internal
            | ReachError::InvalidOutput { .. } => Class::Failed,
            ReachError::RateLimited { retry_after, .. } => Class::Refused {
                retry_after: *retry_after,
            },
            ReachError::Saturated { retry_after, .. } => Class::Shed {
                retry_after: *retry_after,
                why: Refusal::Full,
            },
            // Up and serving others, with no room in its accept queue: load, like a full queue.
            ReachError::IdempotencyBusy | ReachError::Backlogged { .. } => Class::Shed {
                retry_after: DEFAULT_COOLDOWN,
                why: Refusal::Full,
            },
            ReachError::Draining | ReachError::Ejected { .. } => Class::Shed {
                retry_after: DEFAULT_COOLDOWN,
                why: Refusal::OutOfRotation,
            },
            ReachError::UnknownCapability { .. } => Class::Stale,
            _ => Class::Rejected,
        }
    }

    /// The `outcome` label of metrics and the inbound counters.
    pub(crate) fn outcome(self) -> Outcome {
        match self {
            Class::Success => Outcome::Success,
            Class::Failed | Class::Unreachable { .. } => Outcome::Failure,
            Class::TimedOut => Outcome::Timeout,
            Class::Refused { .. } | Class::Shed { .. } | Class::Stale | Class::Rejected => {
                Outcome::Rejected
            }
        }
    }

    /// What a view of the agent that answered learns from this, `elapsed` after it was sent.
    /// `None`: nothing about that agent (a stale registry, a request refused for its own sake).
    pub(crate) fn signal(self, elapsed: Duration) -> Option<Signal> {
        match self {
            Class::Success => Some(Signal::Success(elapsed)),
            Class::Failed | Class::Unreachable { refused: false } => Some(Signal::Failure(elapsed)),
            Class::Unreachable { refused: true } => Some(Signal::Unreachable(elapsed)),
            Class::TimedOut => Some(Signal::Timeout(elapsed)),
            Class::Refused { retry_after } => Some(Signal::Refused { retry_after }),
            Class::Shed { retry_after, .. } => Some(Signal::Shed { retry_after }),
            Class::Stale | Class::Rejected => None,
        }
    }
}

/// Whether an answer means the call timed out (`Class::TimedOut`): only a 504 can, so no other
/// answer has its `reach-reason` read.
pub(crate) fn timed_out<B>(response: &Response<B>) -> bool {
    response.status() == StatusCode::GATEWAY_TIMEOUT
        && Class::of_response(response) == Class::TimedOut
}

/// Whether a peer's sidecar refused its agent's answer as not matching the capability's output
/// schema (`502 invalid_output`): a failure of that agent, which would give the same answer
/// again, so a retry — when one is safe — goes to another.
pub(crate) fn invalid_output<B>(response: &Response<B>) -> bool {
    response.status() == StatusCode::BAD_GATEWAY
        && Reason::of(response) == Some(Reason::InvalidOutput)
}

/// How a request ended, as metrics and the inbound counters label it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Success,
    Failure,
    Timeout,
    /// Refused without running: by admission, a rate limit, the agent itself (429), or because
    /// of the request itself.
    Rejected,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failure => "failure",
            Outcome::Timeout => "timeout",
            Outcome::Rejected => "rejected",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::headers;

    fn response(status: u16, reason: Option<&str>, retry_after: Option<u64>) -> Response<()> {
        let mut r = Response::new(());
        *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
        if let Some(reason) = reason {
            let value =
                http::HeaderValue::from_str(reason).unwrap_or(http::HeaderValue::from_static("x"));
            r.headers_mut().insert(headers::REASON, value);
        }
        if let Some(secs) = retry_after {
            r.headers_mut()
                .insert(http::header::RETRY_AFTER, secs.into());
        }
        r
    }

    fn shed(why: Refusal) -> Class {
        Class::Shed {
            retry_after: DEFAULT_COOLDOWN,
            why,
        }
    }

    fn refused(secs: u64) -> Class {
        Class::Refused {
            retry_after: Duration::from_secs(secs),
        }
    }

    /// Every response case, with what it means, what the metrics call it and what a view learns.
    type Case = (
        u16,
        Option<&'static str>,
        Option<u64>,
        Class,
        Outcome,
        Option<Signal>,
    );

    #[test]
    fn what_a_response_means() {
        use Outcome::*;
        let t = Duration::from_millis(7);
        #[rustfmt::skip]
        let cases: &[Case] = &[
            (200, None, None, Class::Success, Success, Some(Signal::Success(t))),
            (404, None, None, Class::Success, Success, Some(Signal::Success(t))),
            (400, None, None, Class::Success, Success, Some(Signal::Success(t))),
            (500, None, None, Class::Failed, Failure, Some(Signal::Failure(t))),
            (502, None, None, Class::Failed, Failure, Some(Signal::Failure(t))),
            (503, None, None, Class::Failed, Failure, Some(Signal::Failure(t))),
            (504, None, None, Class::Failed, Failure, Some(Signal::Failure(t))),
            (429, None, None, refused(1), Rejected, Some(Signal::Refused { retry_after: Duration::from_secs(1) })),
            (429, None, Some(30), refused(30), Rejected, Some(Signal::Refused { retry_after: Duration::from_secs(30) })),
            (429, Some("rate_limited"), Some(2), refused(2), Rejected, Some(Signal::Refused { retry_after: Duration::from_secs(2) })),
            (503, None, Some(5), refused(5), Rejected, Some(Signal::Refused { retry_after: Duration::from_secs(5) })),
            (503, Some("saturated"), None, shed(Refusal::Full), Rejected, Some(Signal::Shed { retry_after: DEFAULT_COOLDOWN })),
            (503, Some("idempotency_busy"), None, shed(Refusal::Full), Rejected, Some(Signal::Shed { retry_after: DEFAULT_COOLDOWN })),
            (503, Some("draining"), None, shed(Refusal::OutOfRotation), Rejected, Some(Signal::Shed { retry_after: DEFAULT_COOLDOWN })),
            (503, Some("ejected"), None, shed(Refusal::OutOfRotation), Rejected, Some(Signal::Shed { retry_after: DEFAULT_COOLDOWN })),
            (503, Some("no_available_instance"), Some(1), Class::Failed, Failure, Some(Signal::Failure(t))),
            (502, Some("upstream_connect_failed"), None, shed(Refusal::AgentUnreachable), Rejected, Some(Signal::Shed { retry_after: DEFAULT_COOLDOWN })),
            (502, Some("upstream_failed"), None, Class::Failed, Failure, Some(Signal::Failure(t))),
            (502, Some("invalid_output"), None, Class::Failed, Failure, Some(Signal::Failure(t))),
            (404, Some("unknown_capability"), None, Class::Stale, Rejected, None),
            (504, Some("timeout"), None, Class::TimedOut, Timeout, Some(Signal::Timeout(t))),
            (504, Some("deadline_exceeded"), None, Class::TimedOut, Timeout, Some(Signal::Timeout(t))),
            (500, Some("internal"), None, Class::Failed, Failure, Some(Signal::Failure(t))),
            (503, Some("not-a-reason"), None, Class::Failed, Failure, Some(Signal::Failure(t))),
        ];
        for (status, reason, after, class, outcome, signal) in cases {
            let meant = Class::of_response(&response(*status, *reason, *after));
            assert_eq!(meant, *class, "{status} {reason:?} retry-after {after:?}");
            assert_eq!(meant.outcome(), *outcome, "{status} {reason:?}");
            assert_eq!(meant.signal(t), *signal, "{status} {reason:?}");
        }
    }

    /// Every error the sidecar meets or makes, with what it means.
    #[test]
    fn what_an_error_means() {
        let s = Duration::from_secs(3);
        let cases = [
            (
                ReachError::Timeout {
                    target: "p".into(),
                    after: s,
                },
                Class::TimedOut,
            ),
            (ReachError::DeadlineExceeded, Class::TimedOut),
            (
                ReachError::UpstreamConnect {
                    target: "p".into(),
                    message: "m".into(),
                    refused: true,
                },
                Class::Unreachable { refused: true },
            ),
            (
                ReachError::UpstreamConnect {
                    target: "p".into(),
                    message: "m".into(),
                    refused: false,
                },
                Class::Unreachable { refused: false },
            ),
            (
                ReachError::Upstream {
                    target: "p".into(),
                    message: "m".into(),
                },
                Class::Failed,
            ),
            (ReachError::Internal, Class::Failed),
            (
                ReachError::InvalidOutput {
                    agent: "a".into(),
                    capability: "c".into(),
                    errors: vec!["/: \"ok\" is a required property".into()],
                },
                Class::Failed,
            ),
            (
                ReachError::RateLimited {
                    target: "t".into(),
                    retry_after: s,
                },
                Class::Refused { retry_after: s },
            ),
            (
                ReachError::Saturated {
                    agent: "a".into(),
                    retry_after: s,
                },
                Class::Shed {
                    retry_after: s,
                    why: Refusal::Full,
                },
            ),
            (ReachError::IdempotencyBusy, shed(Refusal::Full)),
            (
                ReachError::Backlogged {
                    target: "agent a".into(),
                    after: s,
                },
                shed(Refusal::Full),
            ),
            (ReachError::Draining, shed(Refusal::OutOfRotation)),
            (
                ReachError::Ejected { agent: "a".into() },
                shed(Refusal::OutOfRotation),
            ),
            (
                ReachError::UnknownCapability {
                    capability: "c".into(),
                },
                Class::Stale,
            ),
            (ReachError::BadRequest("b".into()), Class::Rejected),
            (ReachError::ClientBody, Class::Rejected),
            (ReachError::BodyTimeout, Class::Rejected),
            (ReachError::IdempotencyMismatch, Class::Rejected),
            (
                ReachError::ForeignHost { host: "h".into() },
                Class::Rejected,
            ),
        ];
        for (err, class) in cases {
            assert_eq!(Class::of_error(&err), class, "{err:?}");
        }
        // The labels metrics give errors.
        assert_eq!(
            Class::of_error(&ReachError::DeadlineExceeded)
                .outcome()
                .as_str(),
            "timeout"
        );
        assert_eq!(
            Class::of_error(&ReachError::ClientBody).outcome().as_str(),
            "rejected"
        );
    }

    /// What the sidecar says of itself reads back as what it meant: one vocabulary both ways.
    #[test]
    fn a_sidecars_own_answers_read_back() {
        for reason in Reason::ALL {
            assert_eq!(Reason::parse(reason.as_str()), Some(reason));
        }
        let s = Duration::from_secs(2);
        for err in [
            ReachError::Saturated {
                agent: "a".into(),
                retry_after: s,
            },
            ReachError::Draining,
            ReachError::Ejected { agent: "a".into() },
            ReachError::IdempotencyBusy,
            ReachError::Backlogged {
                target: "agent a".into(),
                after: s,
            },
            ReachError::UnknownCapability {
                capability: "c".into(),
            },
            ReachError::Timeout {
                target: "t".into(),
                after: s,
            },
            ReachError::DeadlineExceeded,
            ReachError::RateLimited {
                target: "t".into(),
                retry_after: s,
            },
            ReachError::InvalidOutput {
                agent: "a".into(),
                capability: "c".into(),
                errors: Vec::new(),
            },
            ReachError::AffinityLost {
                capability: "c".into(),
                holder: "a".into(),
                key: crate::error::AffinityKey::Task,
                rpc_id: None,
            },
        ] {
            let class = Class::of_error(&err);
            let response = err.into_response();
            assert_eq!(Class::of_response(&response), class, "{response:?}");
        }
        let refused = ReachError::InvalidOutput {
            agent: "a".into(),
            capability: "c".into(),
            errors: Vec::new(),
        };
        assert!(invalid_output(&refused.into_response()));
        assert!(!invalid_output(&response(
            502,
            Some("upstream_failed"),
            None
        )));
        assert!(!invalid_output(&response(
            500,
            Some("invalid_output"),
            None
        )));
    }
}
