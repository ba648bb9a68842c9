//! How one attempt ended, and whether that allows another: the retry table.

use http::request::Parts;

use super::super::call::{Answer, Try};
pub(in crate::outbound) use crate::classify::Refusal;
use crate::classify::{self, Class, Outcome};
use crate::error::ReachError;
use crate::http::pool::UpstreamBody;
use crate::trace::{AttemptSpan, DeferredSpan};

/// How one attempt ended, as far as retrying cares.
pub(in crate::outbound) enum Attempt<B = UpstreamBody> {
    Done(Answer<B>),
    /// Refused without running the task (429, or a peer sidecar's 503): safe to try elsewhere.
    Refused(Answer<B>, Refusal),
    Failed(ReachError),
    /// Refused by this sidecar before anything was sent (an external target's rate limit).
    Limited(ReachError),
}

/// The client span of attempt `n` when the call is traced (the listener put its span in the
/// call's extensions), named in the attempt's `traceparent`; `retry` is why the attempt before
/// did not end the call. Synchronous, so the routing future holds one pointer, nothing more.
pub(in crate::outbound) fn span(
    attempt: &mut Try,
    call: &Parts,
    capability: &str,
    n: usize,
    retry: Option<&'static str>,
) -> Option<AttemptSpan> {
    let server = call.extensions.get()?;
    let (peer, score) = (
        attempt.candidate.peer.clone(),
        attempt.candidate.factors.score,
    );
    let headers = attempt.request.headers_mut();
    AttemptSpan::start(
        Some(server),
        headers,
        capability,
        &peer.name,
        n,
        score,
        retry,
    )
}

/// Ends the attempt's span, if it has one, with how the attempt ended; an external target's
/// answer whose tokens are read (`usage::Watch`) takes it instead, to end it with them when
/// its body has passed.
pub(in crate::outbound) fn end<B>(span: Option<AttemptSpan>, attempt: &mut Attempt<B>) {
    let Some(span) = span else { return };
    let (status, outcome) = attempt.outcome();
    let watch = match attempt {
        Attempt::Done(answer) | Attempt::Refused(answer, _) => answer.tokens.as_deref_mut(),
        Attempt::Failed(_) | Attempt::Limited(_) => None,
    };
    match watch {
        Some(watch) => {
            let provider = watch.provider.clone();
            watch.span = Some(DeferredSpan::new(span, status, outcome, provider));
        }
        None => span.finish(status, outcome),
    }
}

impl<B> Attempt<B> {
    /// What the caller gets when this attempt is the last: the response, refusal or not, or the
    /// error.
    pub(in crate::outbound) fn into_answer(self) -> Result<Answer<B>, ReachError> {
        match self {
            Attempt::Failed(err) | Attempt::Limited(err) => Err(err),
            Attempt::Done(answer) | Attempt::Refused(answer, _) => Ok(answer),
        }
    }

    /// The status of the answer, if one came back, and what the attempt meant (for its span).
    pub(in crate::outbound) fn outcome(&self) -> (Option<http::StatusCode>, Outcome) {
        match self {
            Attempt::Done(answer) | Attempt::Refused(answer, _) => (
                Some(answer.response.status()),
                Class::of_response(&answer.response).outcome(),
            ),
            Attempt::Failed(err) | Attempt::Limited(err) => (None, Class::of_error(err).outcome()),
        }
    }

    /// Why it ended as it did, in words: a sidecar's `reach-reason` with its message, the
    /// error, or the agent's status.
    pub(in crate::outbound) fn reason(&self) -> String {
        match self {
            Attempt::Failed(err) | Attempt::Limited(err) => format!("{}: {err}", err.code()),
            Attempt::Done(answer) | Attempt::Refused(answer, _) => {
                let response = &answer.response;
                match response.headers().get(crate::http::headers::REASON) {
                    Some(reason) => reason.to_str().unwrap_or("-").to_owned(),
                    None => format!("status {}", response.status().as_u16()),
                }
            }
        }
    }

    /// The attempt as a task records it.
    pub(in crate::outbound) fn note(
        &self,
        peer: &str,
        started: std::time::SystemTime,
    ) -> crate::tasks::AttemptNote {
        let (status, outcome) = self.outcome();
        crate::tasks::AttemptNote {
            peer: peer.to_owned(),
            started,
            duration: started.elapsed().unwrap_or_default(),
            outcome: outcome.as_str(),
            status: status.map(|s| s.as_u16()),
            reason: self.reason(),
        }
    }

    /// Whether the agent (or its sidecar) failed the call: an async chain hands it on.
    pub(in crate::outbound) fn failed(&self) -> bool {
        self.outcome().1 == Outcome::Failure
    }

    /// Whether and how this attempt may be retried: the reason, and whether the retry must go
    /// to the same agent.
    ///
    /// | attempt | retried |
    /// |---|---|
    /// | refused (429, a sidecar's 503), connection failed | always, on another peer: nothing ran |
    /// | no head (or first event) within `first_event_timeout`, idempotent | on another peer |
    /// | no head (or first event) within `first_event_timeout`, keyed or async | on the *same* agent, whose sidecar joins the original |
    /// | timed out, keyed (`idempotency-key`) | on the *same* agent, whose sidecar joins or replays the original |
    /// | timed out, 502/503/504 from the agent, idempotent method | on another peer |
    /// | `502 invalid_output`, idempotent, or async (a chain) without a key | on another peer: the same agent would answer the same |
    /// | anything else (other 4xx, success, a POST that may have run) | never |
    pub(in crate::outbound) fn retry(
        &self,
        keyed: bool,
        idempotent: bool,
        chain: bool,
    ) -> Option<(&'static str, bool)> {
        let timed_out = match self {
            Attempt::Failed(ReachError::Timeout { .. }) => true,
            Attempt::Done(answer) => classify::timed_out(&answer.response),
            _ => false,
        };
        match self {
            Attempt::Refused(_, why) => Some((why.as_str(), false)),
            Attempt::Failed(ReachError::UpstreamConnect { .. }) => Some(("connect_failed", false)),
            // Abandoned before a byte reached the caller: elsewhere when safe to repeat, never
            // back to the peer that was too slow to start.
            Attempt::Failed(ReachError::FirstEventTimeout { .. }) if idempotent => {
                Some(("first_event_timeout", false))
            }
            // A keyed call or a task may be running there already: only its own agent, whose
            // sidecar joins the original, may be asked again — never a second agent.
            Attempt::Failed(ReachError::FirstEventTimeout { .. }) if keyed || chain => {
                Some(("first_event_timeout_keyed", true))
            }
            // It ran: elsewhere only when running it twice is safe (a keyed call runs once).
            Attempt::Done(answer) if classify::invalid_output(&answer.response) => {
                (idempotent || (chain && !keyed)).then_some(("invalid_output", false))
            }
            _ if timed_out && keyed => Some(("timeout_keyed", true)),
            _ if timed_out && idempotent => Some(("timeout", false)),
            Attempt::Done(answer)
                if idempotent && matches!(answer.response.status().as_u16(), 502..=504) =>
            {
                Some(("server_error", false))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::{Response, StatusCode};

    use super::*;
    use crate::http::headers;

    fn response(status: u16, reason: Option<&'static str>) -> Answer<()> {
        let mut r = Response::new(());
        *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
        if let Some(reason) = reason {
            r.headers_mut()
                .insert(headers::REASON, http::HeaderValue::from_static(reason));
        }
        r.into()
    }

    fn timeout() -> Attempt<()> {
        Attempt::Failed(ReachError::Timeout {
            target: "p".into(),
            after: Duration::from_secs(1),
        })
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
        let invalid = Attempt::Done(response(502, Some("invalid_output")));

        // Nothing ran: always retried, elsewhere, whatever the method.
        assert_eq!(
            refused.retry(false, false, false),
            Some(("rate_limited", false))
        );
        assert_eq!(
            connect.retry(false, false, false),
            Some(("connect_failed", false))
        );
        // May have run: a POST is final…
        assert_eq!(timeout().retry(false, false, false), None);
        assert_eq!(peer_timeout.retry(false, false, false), None);
        assert_eq!(bad_gateway.retry(false, false, false), None);
        // …an idempotent call moves on…
        assert_eq!(
            timeout().retry(false, true, false),
            Some(("timeout", false))
        );
        assert_eq!(
            peer_timeout.retry(false, true, false),
            Some(("timeout", false))
        );
        assert_eq!(
            bad_gateway.retry(false, true, false),
            Some(("server_error", false))
        );
        // …and a keyed call goes back to the same agent, which answers from its table.
        assert_eq!(
            timeout().retry(true, false, false),
            Some(("timeout_keyed", true))
        );
        assert_eq!(
            peer_timeout.retry(true, true, false),
            Some(("timeout_keyed", true))
        );
        // An answer its schema refused: elsewhere when safe (never back to the same agent, even
        // keyed: it would answer the same), or when it is an async chain's step.
        assert_eq!(invalid.retry(false, false, false), None);
        assert_eq!(
            invalid.retry(true, false, false),
            None,
            "a keyed call ran once"
        );
        for (keyed, idempotent, chain) in [(false, true, false), (false, false, true)] {
            assert_eq!(
                invalid.retry(keyed, idempotent, chain),
                Some(("invalid_output", false)),
                "keyed {keyed}, idempotent {idempotent}, chain {chain}"
            );
        }
        // No head in time (`first_event_timeout`): nothing reached the caller; elsewhere, never
        // back to the slow peer, when the call is safe to repeat.
        let late = Attempt::<()>::Failed(ReachError::FirstEventTimeout {
            target: "p".into(),
            after: Duration::from_millis(500),
        });
        assert_eq!(late.retry(false, false, false), None);
        assert_eq!(
            late.retry(false, true, false),
            Some(("first_event_timeout", false))
        );
        // Keyed or a task: it may be running there; asked again only of the same agent.
        for (keyed, chain) in [(true, false), (false, true)] {
            assert_eq!(
                late.retry(keyed, false, chain),
                Some(("first_event_timeout_keyed", true))
            );
        }
        // Never: other 4xx, success, a broken response to a POST.
        assert_eq!(not_found.retry(true, true, false), None);
        assert_eq!(ok.retry(true, true, false), None);
        assert_eq!(broken.retry(false, false, false), None);
    }
}
