//! The inbound edge as a step: what a request from outside may carry in. Its target, capability,
//! path and deadline are checked, its caller verified, its `reach-*` headers rewritten (see
//! `edge`), and the call gets the one config snapshot it runs under. `GET /reach/v1/self` (the
//! agent's self-view, for callers without gossip) is answered here.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use http::{Request, Response};
use hyper::body::Incoming;
use tower::layer::{layer_fn, Layer};
use tower::{service_fn, ServiceExt};
use tracing::Span;

use super::call::{Call, CallBody, Meta};
use super::{authorize, edge, Inbound};
use crate::a2a::CARD_PATH;
use crate::config::Snapshot;
use crate::error::ReachError;
use crate::http::deadline::Deadline;
use crate::http::layers::field;
use crate::http::request_target::{self, Target};
use crate::http::step::{answer, Step};
use crate::http::{headers, ClientAddr, ReachBody};
use crate::intercept::Intercepted;
use crate::local::{LocalAgent, SELF_PATH};
use crate::transport::PeerIdentity;

/// Capability label for requests that named none, or one this agent does not declare.
const OTHER: &str = "other";

pub(super) fn layer<S>(
    inbound: Arc<Inbound>,
) -> impl Layer<S, Service = impl Step<Request<Incoming>, Response = Response<ReachBody>>> + Clone
where
    S: Step<Call, Response = Response<ReachBody>>,
{
    layer_fn(move |inner: S| {
        let inbound = inbound.clone();
        service_fn(move |req| {
            let (inbound, inner) = (inbound.clone(), inner.clone());
            async move {
                Ok::<_, Infallible>(match intake(&inbound, req) {
                    Ok(call) => answer(inner.oneshot(call).await),
                    Err(answered) => answered,
                })
            }
        })
    })
}

#[allow(
    clippy::result_large_err,
    reason = "the refusal is the answer, moved once"
)]
fn intake(inbound: &Inbound, req: Request<Incoming>) -> Result<Call, Response<ReachBody>> {
    let arrived = Instant::now();
    let path = match request_target::of(&req) {
        Ok(Target::Path(path)) => path,
        Ok(Target::ServerOptions) => return Err(request_target::server_options()),
        Err(err) => return Err(err.into_response()),
    };
    if path.path() == SELF_PATH && req.method() == http::Method::GET {
        return Err(self_view(&inbound.local));
    }
    let snapshot = inbound.store.snapshot();
    let refuse = |err: ReachError| err.into_response();
    let intercepted = Intercepted::of(&req).is_some();
    let capability = capability_at_edge(inbound, &req, &snapshot, path.path(), intercepted)?;
    let deadline = Deadline::from_headers(req.headers()).map_err(refuse)?;
    let remote = req.extensions().get::<ClientAddr>().map(|a| a.0);
    let identity = PeerIdentity::of(&req).cloned();
    let label = capability.unwrap_or(OTHER);
    authorize::check(
        &snapshot,
        &inbound.metrics,
        capability,
        label,
        identity.as_ref(),
        remote,
    )
    .map_err(refuse)?;
    let caller = match &identity {
        Some(id) => Some(edge::caller_named_by(
            &req,
            id,
            remote,
            &inbound.registry,
            &snapshot,
        )),
        None => remote.and_then(|r| edge::verified_caller(&req, r, &inbound.registry, &snapshot)),
    };
    let (mut parts, incoming) = req.into_parts();
    let vouched = edge::Vouched {
        capability,
        deadline,
        caller: caller.clone(),
        identity: identity.as_ref(),
        attempt: edge::attempt_of(&parts.headers),
    };
    edge::rewrite(&mut parts.headers, vouched);
    let meta = Meta {
        label: label.to_owned(),
        own_timeout: snapshot.capability_timeout(capability),
        deadline,
        arrived,
        intercepted,
    };
    let scope = caller
        .or_else(|| remote.map(|r| r.ip().to_string()))
        .unwrap_or_default();
    Ok(Call {
        meta,
        snapshot,
        scope,
        parts,
        body: CallBody::Arriving(incoming),
    })
}

/// The capability the call is measured as, its path checked against it; or the edge's own
/// answer (a refusal, the agent's card).
#[allow(
    clippy::result_large_err,
    reason = "the refusal is the answer, moved once"
)]
fn capability_at_edge<'s>(
    inbound: &Inbound,
    req: &Request<Incoming>,
    snapshot: &'s Snapshot,
    path: &str,
    intercepted: bool,
) -> Result<Option<&'s str>, Response<ReachBody>> {
    let refuse = |err: ReachError| err.into_response();
    let capability = match capability_of(req, snapshot).map_err(refuse)? {
        None if intercepted => {
            edge::capability_by_path(&snapshot.bootstrap.agent.capabilities, path)
        }
        named => named,
    };
    if let Some(name) = capability {
        Span::current().record(field::CAPABILITY, name);
    }
    // An intercepted client called the agent itself, which answered every path (its card too)
    // before the redirect: the sidecar measures that traffic, it does not narrow or answer it.
    if intercepted {
        return Ok(capability);
    }
    if path == CARD_PATH && req.method() == http::Method::GET {
        if let Some(answer) = agent_card(inbound, req, snapshot, capability) {
            return Err(answer.unwrap_or_else(refuse));
        }
    }
    edge::check_path(snapshot, capability, path).map_err(refuse)?;
    Ok(capability)
}

/// The agent's A2A card as last read (`agent.a2a`), authorized like a call: not forwarded, so
/// it takes no slot and a capability's `paths` need not list it. `None`: no card was read.
fn agent_card(
    inbound: &Inbound,
    req: &Request<Incoming>,
    snapshot: &Snapshot,
    capability: Option<&str>,
) -> Option<Result<Response<ReachBody>, ReachError>> {
    let card = inbound.local.card()?;
    let remote = req.extensions().get::<ClientAddr>().map(|a| a.0);
    let identity = PeerIdentity::of(req).cloned();
    let label = capability.unwrap_or(OTHER);
    Some(
        authorize::check(
            snapshot,
            &inbound.metrics,
            capability,
            label,
            identity.as_ref(),
            remote,
        )
        .map(|()| {
            crate::http::server::text(
                http::StatusCode::OK,
                "application/json",
                card.as_ref().clone(),
            )
        }),
    )
}

fn self_view(local: &LocalAgent) -> Response<ReachBody> {
    let body = serde_json::to_string(&local.self_view()).unwrap_or_else(|_| "{}".to_owned());
    crate::http::server::text(http::StatusCode::OK, "application/json", body)
}

/// The capability a request was routed as. A name this agent does not serve is refused, so a
/// caller with a stale view moves on; a request with no name is served as plain traffic.
fn capability_of<'s>(
    req: &Request<Incoming>,
    snapshot: &'s Snapshot,
) -> Result<Option<&'s str>, ReachError> {
    let Some(value) = req.headers().get(headers::CAPABILITY) else {
        return Ok(None);
    };
    let name = value.to_str().unwrap_or_default();
    match snapshot.bootstrap.agent.capability(name) {
        Some(cap) => Ok(Some(cap.name.as_str())),
        None => Err(ReachError::UnknownCapability {
            capability: name.to_owned(),
        }),
    }
}
