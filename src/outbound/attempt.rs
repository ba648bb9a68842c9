//! One attempt on one peer: sending it, what the peer's answer meant, and whether that allows
//! another.

use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use super::Outbound;
use crate::error::ReachError;
use crate::http::deadline::{self, attempt_timeout, Deadline};
use crate::http::forward::forward;
use crate::http::upload::UploadWatch;
use crate::http::{headers, ReachBody};
use crate::peers::Scored;
use crate::reach::Signal;

/// How one attempt ended, as far as retrying cares.
pub(super) enum Attempt<B = Incoming> {
    Done(Response<B>),
    /// Refused without running the task (429, or a peer sidecar's 503): safe to try elsewhere.
    Refused(Response<B>, Refusal),
    Failed(ReachError),
}

impl<B> Attempt<B> {
    /// Whether and how this attempt may be retried: the reason, and whether the retry must go
    /// to the same agent.
    ///
    /// | attempt | retried |
    /// |---|---|
    /// | refused (429, a sidecar's 503), connection failed | always, on another peer: nothing ran |
    /// | timed out, keyed (`idempotency-key`) | on the *same* agent, whose sidecar joins or replays the original |
    /// | timed out, 502/503/504 from the agent, idempotent method | on another peer |
    /// | anything else (other 4xx, success, a POST that may have run) | never |
    pub(super) fn retry(&self, keyed: bool, idempotent: bool) -> Option<(&'static str, bool)> {
        let timed_out = match self {
            Attempt::Failed(ReachError::Timeout { .. }) => true,
            Attempt::Done(response) => Answer::of(response) == Answer::TimedOut,
            _ => false,
        };
        match self {
            Attempt::Refused(_, why) => Some((why.as_str(), false)),
            Attempt::Failed(ReachError::UpstreamConnect { .. }) => Some(("connect_failed", false)),
            _ if timed_out && keyed => Some(("timeout_keyed", true)),
            _ if timed_out && idempotent => Some(("timeout", false)),
            Attempt::Done(response)
                if idempotent && matches!(response.status().as_u16(), 502..=504) =>
            {
                Some(("server_error", false))
            }
            _ => None,
        }
    }
}

/// Why a peer refused a call that did not run: what the retry table, the metrics and the
/// decision log say of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// `429`: the agent (or a rate limit) refused; it saw the call.
    RateLimited,
    /// `503 saturated` / `idempotency_busy`: the peer is full right now.
    Full,
    /// `503 draining` / `ejected`: out of rotation by its own view.
    OutOfRotation,
    /// `502 upstream_connect_failed`: the peer's agent is not running.
    AgentUnreachable,
    /// `404 unknown_capability`: this caller's registry is stale.
    UnknownCapability,
}

impl Refusal {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Refusal::RateLimited => "rate_limited",
            Refusal::Full => "saturated",
            Refusal::OutOfRotation => "refused",
            Refusal::AgentUnreachable => "agent_unreachable",
            Refusal::UnknownCapability => "unknown_capability",
        }
    }

    /// Moving the call adds load to no agent: it never reached one (only a 429 did).
    pub(super) fn never_reached_an_agent(self) -> bool {
        self != Refusal::RateLimited
    }
}

/// What a peer's answer says about the call: the one place a peer sidecar's `reach-reason`
/// values are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// The agent answered (any status it chose).
    Served,
    /// `429`: the agent itself, or a rate limit, refused; nothing ran. A run of these from one
    /// agent is an outage (the fake-online signal).
    RateLimited(Duration),
    /// The peer's sidecar turned the call away before its agent saw it: `saturated` (full right
    /// now), `idempotency_busy`, `draining`, `ejected`, or `upstream_connect_failed` (its agent
    /// is not running). Load or the peer's own news, never this caller's evidence against it;
    /// any method may go to another peer.
    Shed { retry_after: Duration, why: Refusal },
    /// `404 unknown_capability`: this caller's registry is stale.
    UnknownCapability,
    /// The peer's sidecar gave up on its agent (`504 timeout` / `deadline_exceeded`).
    TimedOut,
}

impl Answer {
    pub(super) fn of<B>(response: &Response<B>) -> Self {
        let status = response.status();
        let reason = response
            .headers()
            .get(headers::REASON)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let retry_after =
            || headers::retry_after(response.headers()).unwrap_or(Duration::from_secs(1));
        match (status, reason) {
            (StatusCode::TOO_MANY_REQUESTS, _) => Answer::RateLimited(retry_after()),
            (StatusCode::SERVICE_UNAVAILABLE, "saturated" | "idempotency_busy") => Answer::Shed {
                retry_after: retry_after(),
                why: Refusal::Full,
            },
            (StatusCode::SERVICE_UNAVAILABLE, "draining" | "ejected") => Answer::Shed {
                retry_after: retry_after(),
                why: Refusal::OutOfRotation,
            },
            (StatusCode::BAD_GATEWAY, "upstream_connect_failed") => Answer::Shed {
                retry_after: Duration::from_secs(1),
                why: Refusal::AgentUnreachable,
            },
            (StatusCode::NOT_FOUND, "unknown_capability") => Answer::UnknownCapability,
            (StatusCode::GATEWAY_TIMEOUT, "timeout" | "deadline_exceeded") => Answer::TimedOut,
            _ => Answer::Served,
        }
    }
}

impl Outbound {
    /// Sends one attempt and tells the caller's view of the peer what happened.
    pub(super) async fn attempt(
        &self,
        mut request: Request<ReachBody>,
        candidate: &Scored,
        deadline: Option<Deadline>,
        keyed_deadline: Option<Deadline>,
        upload: &UploadWatch,
    ) -> Attempt {
        let peer = &candidate.peer;
        let (timeout, by_deadline) = attempt_timeout(candidate.timeout, deadline);
        // The callee enforces the same budget: it stops work the caller no longer waits for.
        let attempt_deadline = keyed_deadline.unwrap_or_else(|| Deadline::after(timeout));
        request
            .headers_mut()
            .insert(deadline::DEADLINE, attempt_deadline.header_value());
        let target = format!("peer {} ({})", peer.name, peer.address);
        let sent = Instant::now();
        let pending = self.peers.begin(peer, candidate.latency_ms);
        let forwarded = forward(&self.client, request, &peer.address, &target, timeout).await;
        if let Some(fault) = forwarded
            .as_ref()
            .err()
            .and_then(|err| upload.caller_fault(matches!(err, ReachError::Timeout { .. })))
        {
            // The agent's own upload broke or stalled: nothing against the peer.
            pending.discard();
            return Attempt::Failed(fault);
        }
        match forwarded {
            Ok(response) => {
                let elapsed = sent.elapsed();
                match Answer::of(&response) {
                    Answer::RateLimited(retry_after) => {
                        pending.finish(Signal::Refused { retry_after });
                        Attempt::Refused(response, Refusal::RateLimited)
                    }
                    Answer::Shed { retry_after, why } => {
                        // Never reached the agent: load, or news its own view carries.
                        pending.finish(Signal::Shed { retry_after });
                        Attempt::Refused(response, why)
                    }
                    Answer::TimedOut => {
                        // The peer's sidecar gave up on its agent: a timeout, as if it were ours.
                        pending.finish(Signal::Timeout(elapsed));
                        Attempt::Done(response)
                    }
                    Answer::UnknownCapability => {
                        // Our registry is stale: that peer no longer serves the capability.
                        // Nothing ran; try another, and do not credit this one with a success.
                        pending.discard();
                        Attempt::Refused(response, Refusal::UnknownCapability)
                    }
                    Answer::Served if response.status().is_server_error() => {
                        pending.finish(Signal::Failure(elapsed));
                        Attempt::Done(response)
                    }
                    Answer::Served => {
                        pending.finish(Signal::Success(elapsed));
                        Attempt::Done(response)
                    }
                }
            }
            Err(ReachError::Timeout { .. }) if by_deadline => {
                // The caller's budget ran out, not the peer's time: no evidence against the peer,
                // unless the wait was far past what the peer usually takes (see `Pending`).
                drop(pending);
                Attempt::Failed(ReachError::DeadlineExceeded)
            }
            Err(err) => {
                let signal = match err {
                    ReachError::Timeout { .. } => Signal::Timeout(sent.elapsed()),
                    _ => Signal::Failure(sent.elapsed()),
                };
                pending.finish(signal);
                Attempt::Failed(err)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, reason: Option<&'static str>) -> Response<()> {
        let mut r = Response::new(());
        *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
        if let Some(reason) = reason {
            r.headers_mut()
                .insert(headers::REASON, http::HeaderValue::from_static(reason));
        }
        r
    }

    fn timeout() -> Attempt<()> {
        Attempt::Failed(ReachError::Timeout {
            target: "p".into(),
            after: Duration::from_secs(1),
        })
    }

    #[test]
    fn what_a_peers_answer_means() {
        let cases = [
            (200, None, Answer::Served),
            (500, None, Answer::Served),
            (502, None, Answer::Served),
            (503, None, Answer::Served),
            (429, None, Answer::RateLimited(Duration::from_secs(1))),
            (503, Some("saturated"), shed(Refusal::Full)),
            (503, Some("idempotency_busy"), shed(Refusal::Full)),
            (503, Some("draining"), shed(Refusal::OutOfRotation)),
            (503, Some("ejected"), shed(Refusal::OutOfRotation)),
            (
                502,
                Some("upstream_connect_failed"),
                shed(Refusal::AgentUnreachable),
            ),
            (404, Some("unknown_capability"), Answer::UnknownCapability),
            (404, None, Answer::Served),
            (504, Some("timeout"), Answer::TimedOut),
            (504, Some("deadline_exceeded"), Answer::TimedOut),
            (504, None, Answer::Served),
        ];
        for (status, reason, meant) in cases {
            assert_eq!(
                Answer::of(&response(status, reason)),
                meant,
                "{status} {reason:?}"
            );
        }
    }

    fn shed(why: Refusal) -> Answer {
        Answer::Shed {
            retry_after: Duration::from_secs(1),
            why,
        }
    }

    #[test]
    fn the_retry_table() {
        let refused = Attempt::Refused(response(429, None), Refusal::RateLimited);
        let connect = Attempt::<()>::Failed(ReachError::UpstreamConnect {
            target: "p".into(),
            message: "refused".into(),
            refused: true,
        });
        let peer_timeout = Attempt::Done(response(504, Some("timeout")));
        let bad_gateway = Attempt::Done(response(502, None));
        let not_found = Attempt::Done(response(404, None));
        let ok = Attempt::Done(response(200, None));
        let broken = Attempt::<()>::Failed(ReachError::Upstream {
            target: "p".into(),
            message: "reset".into(),
        });

        // Nothing ran: always retried, elsewhere, whatever the method.
        assert_eq!(refused.retry(false, false), Some(("rate_limited", false)));
        assert_eq!(connect.retry(false, false), Some(("connect_failed", false)));
        // May have run: a POST is final…
        assert_eq!(timeout().retry(false, false), None);
        assert_eq!(peer_timeout.retry(false, false), None);
        assert_eq!(bad_gateway.retry(false, false), None);
        // …an idempotent call moves on…
        assert_eq!(timeout().retry(false, true), Some(("timeout", false)));
        assert_eq!(peer_timeout.retry(false, true), Some(("timeout", false)));
        assert_eq!(
            bad_gateway.retry(false, true),
            Some(("server_error", false))
        );
        // …and a keyed call goes back to the same agent, which answers from its table.
        assert_eq!(timeout().retry(true, false), Some(("timeout_keyed", true)));
        assert_eq!(
            peer_timeout.retry(true, true),
            Some(("timeout_keyed", true))
        );
        // Never: other 4xx, success, a broken response to a POST.
        assert_eq!(not_found.retry(true, true), None);
        assert_eq!(ok.retry(true, true), None);
        assert_eq!(broken.retry(false, false), None);
    }
}
