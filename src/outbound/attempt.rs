//! One attempt on one peer: how it ended, and whether that allows another.

use std::time::Duration;

use http::{Response, StatusCode};
use hyper::body::Incoming;

use crate::error::ReachError;
use crate::http::headers;

/// How one attempt ended, as far as retrying cares.
pub(super) enum Attempt<B = Incoming> {
    Done(Response<B>),
    /// Refused without running the task (429, or a peer sidecar's 503): safe to try elsewhere.
    Refused(Response<B>, &'static str),
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
            Attempt::Refused(_, why) => Some((why, false)),
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
    Shed {
        retry_after: Duration,
        why: &'static str,
    },
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
                why: "saturated",
            },
            (StatusCode::SERVICE_UNAVAILABLE, "draining" | "ejected") => Answer::Shed {
                retry_after: retry_after(),
                why: "refused",
            },
            (StatusCode::BAD_GATEWAY, "upstream_connect_failed") => Answer::Shed {
                retry_after: Duration::from_secs(1),
                why: "agent_unreachable",
            },
            (StatusCode::NOT_FOUND, "unknown_capability") => Answer::UnknownCapability,
            (StatusCode::GATEWAY_TIMEOUT, "timeout" | "deadline_exceeded") => Answer::TimedOut,
            _ => Answer::Served,
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
            (503, Some("saturated"), shed("saturated")),
            (503, Some("idempotency_busy"), shed("saturated")),
            (503, Some("draining"), shed("refused")),
            (503, Some("ejected"), shed("refused")),
            (
                502,
                Some("upstream_connect_failed"),
                shed("agent_unreachable"),
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

    fn shed(why: &'static str) -> Answer {
        Answer::Shed {
            retry_after: Duration::from_secs(1),
            why,
        }
    }

    #[test]
    fn the_retry_table() {
        let refused = Attempt::Refused(response(429, None), "rate_limited");
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
