//! Intake, the inbound stack's first step: what a request from outside may carry in. Its target, capability,
//! path and deadline are checked, its caller verified, its `reach-*` headers rewritten (see
//! `vouched`), and the call gets the one config snapshot it runs under. `GET /reach/v1/self` (the
//! agent's self-view, for callers without gossip) is answered here.

mod vouched;

use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use tower::ServiceExt;

use super::admit::gate;
use super::call::{Call, CallBody, Meta};
use super::{authorize, Inbound};
use crate::a2a::CARD_PATH;
use crate::config::Snapshot;
use crate::error::ReachError;
use crate::http::deadline::Deadline;
use crate::http::headers::{Head, Present};
use crate::http::layers::field;
use crate::http::request_target::{self, Target};
use crate::http::step::{self, answer, Step};
use crate::http::ReachBody;
use crate::identity::SpiffeId;
use crate::local::{LocalAgent, SELF_PATH};
use crate::transport::Accepted;

/// The label of refusals that belong to no capability.
const OTHER: &str = "other";

/// What the first step holds for one connection: shared, one `Arc` cloned per request.
pub(super) struct Lanes<P, K> {
    pub(super) inbound: Arc<Inbound>,
    /// The connection's client, as its accept learnt it.
    pub(super) accepted: Arc<Accepted>,
    /// Admission, the agent and its answer.
    pub(super) plain: P,
    /// The same after `keyed`: a call with an `idempotency-key` runs once.
    pub(super) keyed: K,
}

/// The first step, over its lanes. Two lanes rather than one stack: each step a call passes
/// through costs it whether it acts or not (`docs/perf-levers.md`), and
/// only a keyed call needs `keyed`.
pub(super) fn service<P, K>(
    lanes: Lanes<P, K>,
) -> impl Step<Request<Incoming>, Response = Response<ReachBody>>
where
    P: Step<Call, Response = Response<ReachBody>>,
    K: Step<Call, Response = Response<ReachBody>>,
{
    step::service!(Arc::new(lanes), take::<P, K>)
}

/// Takes a request in as a call and passes it down its lane, or answers it here: refused before
/// any work (`admit::gate`) included.
async fn take<P, K>(lanes: Arc<Lanes<P, K>>, req: Request<Incoming>) -> Response<ReachBody>
where
    P: Step<Call, Response = Response<ReachBody>>,
    K: Step<Call, Response = Response<ReachBody>>,
{
    let call = match intake(&lanes.inbound, &lanes.accepted, req) {
        Ok(call) => call,
        Err(answered) => return answered,
    };
    if let Some(refused) = gate::refuse_early(&lanes.inbound, &call) {
        return refused;
    }
    match call.keyed {
        // Boxed: the plain lane's future is the step's.
        true => answer(step::boxed(lanes.keyed.clone(), call).await),
        false => answer(lanes.plain.clone().oneshot(call).await),
    }
}

#[allow(
    clippy::result_large_err,
    reason = "the refusal is the answer, moved once"
)]
fn intake(
    inbound: &Inbound,
    accepted: &Accepted,
    req: Request<Incoming>,
) -> Result<Call, Response<ReachBody>> {
    let arrived = tokio::time::Instant::now();
    let head = Head::of(req.headers());
    let present = head.present;
    let target = match request_target::of(&req) {
        Ok(Target::Path(path)) => path,
        Ok(Target::ServerOptions) => return Err(request_target::server_options()),
        Err(err) => return Err(err.into_response()),
    };
    if target.path() == SELF_PATH && req.method() == http::Method::GET {
        return Err(self_view(&inbound.local));
    }
    let snapshot = inbound.store.snapshot();
    let refuse = |err: ReachError| err.into_response();
    let (identity, tls) = (accepted.identity.as_ref(), accepted.tls.as_ref());
    let (client, intercepted) = (&accepted.client, accepted.intercepted.is_some());
    let remote = Some(client.0);
    let named = named_capability(head.capability).map_err(refuse)?;
    // An intercepted client called the agent itself, whose card the agent serves.
    if !intercepted && target.path() == CARD_PATH && req.method() == http::Method::GET {
        if let Some(answer) = agent_card(inbound, &snapshot, identity) {
            return Err(answer);
        }
    }
    let authorized = authorize::check(
        &snapshot,
        &inbound.metrics,
        named,
        target.path(),
        identity,
        remote,
    )
    .map_err(refuse)?;
    let capability = authorized.capability.name.as_str();
    crate::http::layers::record_in_span(field::CAPABILITY, capability);
    // The agent is sent the path the decision was made on.
    let normalized = Some(authorized.path).filter(|p| matches!(p, std::borrow::Cow::Owned(_)));
    let deadline = Deadline::from_head(req.headers(), &head).map_err(refuse)?;
    let caller = caller_of(inbound, &req, &snapshot, identity, tls.is_some(), remote);
    let (mut parts, incoming) = req.into_parts();
    if let Some(path) = normalized {
        parts.uri = vouched::with_path(&parts.uri, path.as_ref()).map_err(refuse)?;
    }
    let who = (caller.as_deref(), identity.is_some());
    let (chain, in_flight) = inbound.chain(&snapshot, (&parts.headers, present), who, capability);
    let vouched = vouched::Vouched {
        chain: Some(chain),
        capability: Some(capability),
        deadline,
        deadline_as_sent: deadline.is_some() && !present.has(Present::TIMEOUT),
        caller: caller.as_deref(),
        identity,
        remote: Some(&client.1),
        client_cert: tls.and_then(|t| t.xfcc.as_ref()),
        pass: &snapshot.policy.pass_identity_headers,
    };
    vouched::rewrite(&mut parts.headers, vouched);
    let meta = Meta {
        series: inbound.metrics.inbound_series(capability),
        own_timeout: snapshot.capability_timeout(Some(capability)),
        left: deadline.map(Deadline::remaining),
        arrived,
        intercepted,
        chain: in_flight,
    };
    let keyed = present.has(Present::IDEMPOTENCY_KEY);
    let scope = scope_of(keyed, caller, Some(&client.1));
    Ok(Call {
        meta,
        snapshot,
        scope,
        parts: Box::new(parts),
        body: CallBody::Arriving(incoming),
        keyed,
    })
}

/// Whose idempotency keys a keyed call's key is among: its caller's, else its address's. Only
/// a keyed call has one (nothing else reads it).
fn scope_of(keyed: bool, caller: Option<String>, remote_ip: Option<&http::HeaderValue>) -> String {
    if !keyed {
        return String::new();
    }
    let ip = || remote_ip.and_then(|v| v.to_str().ok()).map(str::to_owned);
    caller.or_else(ip).unwrap_or_default()
}

impl Inbound {
    /// The delegation chain the agent passes on to its own calls, bound to this call and
    /// sealed: the one the caller's sidecar sent when it is to be read (signed for the mesh, or
    /// from a caller whose certificate was verified), with this agent serving `capability`
    /// added (`src/chain/`). The call is in flight until the guard drops.
    fn chain(
        &self,
        snapshot: &Snapshot,
        (head, present): (&http::HeaderMap, Present),
        (caller, verified): (Option<&str>, bool),
        capability: &str,
    ) -> (http::HeaderValue, crate::chain::InFlight) {
        let me = snapshot.bootstrap.agent.name.as_str();
        let sent = present
            .has(Present::CHAIN)
            .then(|| head.get(crate::chain::HEADER));
        // Without a mesh key there is no signature to check: a caller named by its address is
        // as far as a plaintext mesh can vouch (`docs/chains.md`).
        let vouched = verified || (caller.is_some() && !self.seal.signs());
        let sent = sent
            .flatten()
            .and_then(|v| self.seal.read_from_peer(v, vouched));
        let Some(sent) = sent else {
            // A chain's first hop (most calls): sealed once per caller and capability.
            return self.seal.issue_first(caller, me, capability);
        };
        let chain = crate::chain::Chain::at_edge(Some(sent), caller, me, capability);
        if let Some(span) = crate::http::layers::current_span() {
            span.record(field::CHAIN, chain.display());
        }
        self.seal.issue(&chain)
    }
}

/// The `reach-capability` header's text, when the request has one.
fn named_capability(value: Option<&http::HeaderValue>) -> Result<Option<&str>, ReachError> {
    match value {
        Some(value) => value
            .to_str()
            .map(Some)
            .map_err(|_| ReachError::UnknownCapability {
                capability: String::from_utf8_lossy(value.as_bytes()).into_owned(),
            }),
        None => Ok(None),
    }
}

/// The caller's name the agent is told: from its certificate when it presented one; a TLS caller
/// without one is nobody (never named by where it connects from); a plaintext caller by a known
/// peer's name at its address.
fn caller_of<B>(
    inbound: &Inbound,
    req: &Request<B>,
    snapshot: &Snapshot,
    identity: Option<&SpiffeId>,
    tls: bool,
    remote: Option<std::net::SocketAddr>,
) -> Option<String> {
    match identity {
        Some(id) => Some(vouched::caller_named_by(
            req,
            id,
            remote,
            &inbound.registry,
            snapshot,
        )),
        None if tls => None,
        None => remote.and_then(|r| vouched::verified_caller(req, r, &inbound.registry, snapshot)),
    }
}

/// The agent's A2A card as last read (`agent.a2a`): not forwarded, so it takes no slot and no
/// capability's `paths` need list it. It lists every skill, so a caller may read it when it may
/// call at least one. `None`: no card was read (the path is then mapped like any other).
fn agent_card(
    inbound: &Inbound,
    snapshot: &Snapshot,
    identity: Option<&SpiffeId>,
) -> Option<Response<ReachBody>> {
    let card = inbound.local.card()?;
    let capabilities = &snapshot.bootstrap.agent.capabilities;
    if !authorize::may_call_any(capabilities, &snapshot.policy.authorization, identity) {
        inbound.metrics.authz_denied(OTHER);
        return Some(
            ReachError::Forbidden {
                capability: "agent card".to_owned(),
            }
            .into_response(),
        );
    }
    Some(crate::http::server::text(
        http::StatusCode::OK,
        "application/json",
        card.as_ref().clone(),
    ))
}

fn self_view(local: &LocalAgent) -> Response<ReachBody> {
    let body = serde_json::to_string(&local.self_view()).unwrap_or_else(|_| "{}".to_owned());
    crate::http::server::text(http::StatusCode::OK, "application/json", body)
}
