//! One attempt on one peer: sent over the peer client with the attempt's deadline, and what its
//! answer meant told to this caller's view of the peer (and, from an external target, what it
//! said of the agent's model budget).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::attempts::retry::{Attempt, Refusal};
use super::call::{Answer, Try};
use super::first_event::within;
use super::{target_limit, Outbound};
use crate::budget::{usage, ModelBudgets};
use crate::classify::Class;
use crate::config::Snapshot;
use crate::error::ReachError;
use crate::http::deadline::{self, attempt_timeout, Deadline};
use crate::http::headers;
use crate::http::pool::{forward, Named, UpstreamBody};
use crate::http::retry_after;
use crate::http::step::{self, Step};
use crate::http::upload::UploadWatch;
use crate::metrics::Metrics;
use crate::peers::Pending;
use crate::reach::Signal;
use crate::registry::Peer;

/// Where an external target's answers teach the agent's model budget.
type Budgets<'a> = (&'a Arc<ModelBudgets>, &'a Arc<Metrics>);

/// The innermost outbound step.
pub(super) fn endpoint(out: Arc<Outbound>) -> impl Step<Try, Response = Attempt> {
    step::service!(out, attempt)
}

/// Sends one attempt and tells the caller's view of the peer what happened. An external
/// target's rate limit refuses it here, at once, before anything is sent (`target_limit`).
async fn attempt(out: Arc<Outbound>, attempt: Try) -> Attempt {
    if let Err(err) = target_limit::admit(&out, &attempt) {
        return Attempt::Limited(err);
    }
    let (client, peers) = (&out.client, &*out.peers);
    let budgets = (out.local.budgets(), &out.metrics);
    let Try {
        mut request,
        candidate,
        deadline,
        keyed_deadline,
        upload,
        snapshot,
        first_event,
        sessions,
    } = attempt;
    let peer = &candidate.peer;
    let (timeout, by_deadline) = attempt_timeout(candidate.timeout, deadline);
    internal_headers(peer, request.headers_mut(), keyed_deadline, timeout);
    if let Some(sessions) = sessions {
        sessions.apply(&peer.name, request.headers_mut());
    }
    // Named only if it fails: no string per attempt.
    let target =
        Named(|f: &mut std::fmt::Formatter<'_>| write!(f, "peer {} ({})", peer.name, peer.address));
    // The peers' views count on the runtime's clock (virtual in paused tests).
    let sent = tokio::time::Instant::now();
    // A provider's answer times its first token from here, on the wall clock `usage` reads;
    // its account is the one the agent's key names (read before the request is sent).
    let to_target = (peer.target.is_some())
        .then(|| (Instant::now(), crate::budget::credential(request.headers())));
    let pending = peers.begin(peer, candidate.latency_ms, sent);
    let identity = peer.dial_identity(snapshot.mtls_mode());
    // Pinned where it is built and awaited through the pin: awaited by value, the forward's
    // future (≈ 2.7 KB) was copied into the await's own slot (`benches/perf/copies.py`).
    let mut forwarded = std::pin::pin!(forward(
        client,
        request,
        &peer.address,
        identity.as_ref(),
        &target,
        timeout,
    ));
    let forwarded = match first_event.filter(|limit| *limit < timeout) {
        None => forwarded.as_mut().await,
        // Boxed: a capability with a first-event deadline is the rare case.
        Some(limit) => Box::pin(within(forwarded.as_mut(), limit, &target)).await,
    };
    // One clock reading for the attempt's time and the peer's view of its end.
    let ended = tokio::time::Instant::now();
    let elapsed = ended.saturating_duration_since(sent);
    let mut response = match forwarded {
        Ok(response) => response,
        Err(err) => {
            return failed(
                err,
                &upload,
                by_deadline,
                pending,
                &snapshot,
                ended,
                elapsed,
            );
        }
    };
    let body_delay = match peer.target.is_some() && holds_retry_delay(&response) {
        true => Box::pin(retry_delay_in_body(&mut response)).await,
        false => None,
    };
    let tokens = learn_budget(budgets, peer, &snapshot, &response, to_target, body_delay);
    let class = with_body_delay(Class::of_response(&response), &response, body_delay);
    match class.signal(elapsed) {
        Some(signal) => pending.finish(signal, &snapshot, ended),
        // Our registry is stale: nothing ran, and that peer earns no credit for it.
        None => pending.discard(),
    }
    answered(class, Answer::new(response, tokens))
}

/// An attempt that got no answer, ended at `ended` after `elapsed`: what the peer's view learns
/// from it, and what the policy sees.
fn failed(
    err: ReachError,
    upload: &UploadWatch,
    by_deadline: bool,
    pending: Pending<'_>,
    snapshot: &Snapshot,
    ended: tokio::time::Instant,
    elapsed: Duration,
) -> Attempt {
    if let Some(fault) = upload.caller_fault(Class::of_error(&err) == Class::TimedOut) {
        // The agent's own upload broke or stalled: nothing against the peer.
        pending.discard();
        return Attempt::Failed(fault);
    }
    if by_deadline && matches!(err, ReachError::Timeout { .. }) {
        // The caller's budget ran out, not the peer's time: no evidence against the
        // peer, unless the wait was far past what the peer usually takes (`Pending`).
        drop(pending);
        return Attempt::Failed(ReachError::DeadlineExceeded);
    }
    match Class::of_error(&err).signal(elapsed) {
        // A peer's sidecar that refuses connections: this caller has no prober to
        // see it come back, so it is a failure like any other here.
        Some(Signal::Unreachable(t)) => pending.finish(Signal::Failure(t), snapshot, ended),
        Some(signal) => pending.finish(signal, snapshot, ended),
        None => pending.finish(Signal::Failure(elapsed), snapshot, ended),
    }
    Attempt::Failed(err)
}

/// An answer as the attempt policy sees it: done, or refused (and why).
fn answered(class: Class, answer: Answer) -> Attempt {
    match class {
        Class::Refused { .. } => Attempt::Refused(answer, Refusal::RateLimited),
        // Never reached the agent: load, or news its own view carries.
        Class::Shed { why, .. } => Attempt::Refused(answer, why),
        Class::Stale => Attempt::Refused(answer, Refusal::UnknownCapability),
        _ => Attempt::Done(answer),
    }
}

/// A peer sidecar gets the attempt's deadline; a service outside the mesh (a model provider)
/// none of the sidecars' own headers.
fn internal_headers(
    peer: &Peer,
    headers: &mut http::HeaderMap,
    keyed_deadline: Option<Deadline>,
    timeout: Duration,
) {
    if peer.target.is_some() {
        headers::strip_internal(headers);
    } else {
        // The callee enforces the same budget: it stops work the caller no longer waits for.
        let attempt_deadline = keyed_deadline.unwrap_or_else(|| Deadline::after(timeout));
        headers.insert(deadline::DEADLINE, attempt_deadline.header_value());
    }
}

/// An external target's answer (a model provider's, typically): its rate-limit headers (and a
/// 429's `retryDelay`, read by [`retry_delay_in_body`]) teach the agent's model budget; the mark
/// returned has its tokens counted when its body has passed (`src/outbound/record.rs`). A peer
/// sidecar's answers are not read: nothing per call for them.
fn learn_budget(
    budgets: Budgets<'_>,
    peer: &Peer,
    snapshot: &Snapshot,
    response: &http::Response<UpstreamBody>,
    to_target: Option<(Instant, Option<u64>)>,
    body_delay: Option<Duration>,
) -> Option<usage::Watch> {
    let (Some(target), Some((sent, credential))) = (peer.target.as_deref(), to_target) else {
        return None;
    };
    let declared = snapshot
        .policy
        .targets
        .iter()
        .find(|t| t.name.as_str() == target);
    let tokens = usage::Watch {
        provider: Arc::from(target),
        metrics: budgets.1.clone(),
        sent,
        // Set by the attempt's span when the call is traced (`retry::end`).
        span: None,
        budgets: budgets.0.clone(),
    };
    // Only a model provider teaches the model budget: any other target's 429 cools that
    // target alone (its peer view), not the agent.
    let Some(provider) = declared.filter(|t| t.teaches_budget()) else {
        return Some(tokens);
    };
    let answer = crate::budget::Answer {
        target,
        credential,
        group: provider.budget_group.as_ref().map(|g| g.as_str()),
        status: response.status(),
        headers: response.headers(),
        body_delay,
        max_wait: snapshot.policy.model_budgets.max_wait.get(),
    };
    let malformed = budgets.0.observe(&answer, tokio::time::Instant::now());
    if malformed > 0 {
        budgets.1.model_budget_malformed(target, malformed);
    }
    Some(tokens)
}

/// A 429 body read for its wait, at most: Gemini's answers carry it there, not in a header.
const HELD_BODY_MAX: usize = 64 << 10;
/// How long a 429 body may take to come in before it is passed on unread.
const HELD_BODY_WITHIN: Duration = Duration::from_millis(500);

/// A small JSON 429: one whose body may say its wait (Gemini's `error.details[].retryDelay`).
fn holds_retry_delay(response: &http::Response<UpstreamBody>) -> bool {
    if response.status() != http::StatusCode::TOO_MANY_REQUESTS {
        return false;
    }
    let length = response
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    headers::is_json(response.headers()) && length.is_none_or(|n| n <= HELD_BODY_MAX as u64)
}

/// The wait a [`holds_retry_delay`] answer's body gives (docs/model-budgets.md); the body read
/// to find it is held and passed on to the agent unchanged. Awaited boxed: a provider's 429 is
/// rare, and this future would otherwise add its size to every call's (the edge then copied
/// that future whole: docs/perf-levers.md).
async fn retry_delay_in_body(response: &mut http::Response<UpstreamBody>) -> Option<Duration> {
    let body = response
        .body_mut()
        .hold(HELD_BODY_MAX, HELD_BODY_WITHIN)
        .await?;
    crate::budget::headers::retry_delay_in_body(&body)
}

/// A refusal's cool-down from the body's wait when no `retry-after` header gave one, bounded
/// like the header.
fn with_body_delay<B>(
    class: Class,
    response: &http::Response<B>,
    delay: Option<Duration>,
) -> Class {
    match (class, delay) {
        (Class::Refused { .. }, Some(wait)) if retry_after::wait(response.headers()).is_none() => {
            Class::Refused {
                retry_after: retry_after::bounded(wait),
            }
        }
        (class, _) => class,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_delay_sets_a_refusals_cool_down_only_without_a_header_and_bounded() {
        let refused = || Class::Refused {
            retry_after: Duration::from_secs(1),
        };
        let answer = |header: Option<&'static str>| {
            let mut r = http::Response::new(());
            if let Some(v) = header {
                let v = http::HeaderValue::from_static(v);
                r.headers_mut().insert(http::header::RETRY_AFTER, v);
            }
            r
        };
        let cool = |class: Class| match class {
            Class::Refused { retry_after } => Some(retry_after.as_secs()),
            _ => None,
        };
        let secs = |s| Some(Duration::from_secs(s));
        assert_eq!(
            cool(with_body_delay(refused(), &answer(None), secs(30))),
            Some(30)
        );
        let decade = secs(315_360_000);
        assert_eq!(
            cool(with_body_delay(refused(), &answer(None), decade)),
            Some(300)
        );
        let header = answer(Some("1"));
        assert_eq!(cool(with_body_delay(refused(), &header, secs(30))), Some(1));
        assert_eq!(
            cool(with_body_delay(refused(), &answer(None), None)),
            Some(1)
        );
    }
}
