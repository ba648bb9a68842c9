//! The outbound listener's first step, and the only one every request passes: the local API is
//! answered by its own service; a capability call is resolved (`resolve`) and then takes one of
//! two lanes. The plain lane is routing alone. The full lane runs the steps a call may need
//! first — `submit` (`prefer: respond-async`), `dedupe` (`idempotency-key`) and `mcp` (a
//! capability whose servers announce tools) — and is taken by a call that may need one of them.
//!
//! Why lanes and not one stack: each step a call passes through costs it work
//! (moving the call down and its answer up, polling one more level), whether the
//! step acts or not, and a plain call needs none of these (`docs/perf-levers.md`). The full
//! lane's steps keep their own checks, so a call that takes it needlessly is answered the same,
//! only slower.

use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use tower::ServiceExt;

use super::call::{Call, Recorded};
use super::{agent_card, local_api, resolve, Outbound};
use crate::http::headers::Present;
use crate::http::step::{self, answer, Step};
use crate::http::ReachBody;

/// What the first step holds: shared, one `Arc` cloned per request.
pub(super) struct Lanes<A, P, F> {
    pub(super) out: Arc<Outbound>,
    /// The local API's service (`local_api`).
    pub(super) api: A,
    /// Routing alone.
    pub(super) plain: P,
    /// `submit`, `dedupe`, `mcp`, then routing.
    pub(super) full: F,
}

/// The first step, over its lanes.
pub(super) fn service<A, P, F>(
    lanes: Lanes<A, P, F>,
) -> impl Step<Request<Incoming>, Response = Response<ReachBody>>
where
    A: Step<Request<Incoming>, Response = Response<ReachBody>>,
    P: Step<Call, Response = Recorded>,
    F: Step<Call, Response = Response<ReachBody>>,
{
    step::service!(Arc::new(lanes), first::<A, P, F>)
}

/// The request answered: by the local API, or resolved and routed down its lane; an agent
/// card's answer with its URLs rewritten (`agent_card`).
async fn first<A, P, F>(lanes: Arc<Lanes<A, P, F>>, req: Request<Incoming>) -> Response<ReachBody>
where
    A: Step<Request<Incoming>, Response = Response<ReachBody>>,
    P: Step<Call, Response = Recorded>,
    F: Step<Call, Response = Response<ReachBody>>,
{
    // Boxed, like every rare path here: the step's future stays the size of the plain lane's.
    if local_api::is_local_api(&req) {
        return answer(step::boxed(lanes.api.clone(), req).await);
    }
    // The path-prefix form (`/.reach/<capability>/…` on the loopback listener) in its place.
    let mut req = req;
    let prefixed = match resolve::path_prefix(&mut req) {
        Ok(base) => base,
        Err(err) => return err.into_response(),
    };
    let card = agent_card::card_request(&req);
    let mut resolved = None;
    let response = match resolve::resolve(&lanes.out, req, &mut resolved).await {
        Ok(call) if plain(&lanes.out, &call) => {
            answer(lanes.plain.clone().oneshot(call).await).response
        }
        Ok(call) => answer(step::boxed(lanes.full.clone(), call).await),
        Err(refused) => refused,
    };
    let response = resolve::marked(response, resolved);
    match card {
        Some(capability) => {
            Box::pin(agent_card::rewritten(
                &capability,
                prefixed.as_deref(),
                response,
            ))
            .await
        }
        None => response,
    }
}

/// A call none of the full lane's steps would act on: no `prefer` header (`submit`), no
/// `idempotency-key` (`dedupe`), and a capability no MCP server announces (`mcp`).
fn plain(out: &Outbound, call: &Call) -> bool {
    !call.present.has(Present::PREFER)
        && !call.present.has(Present::IDEMPOTENCY_KEY)
        && !out.registry.is_mcp(call.capability.as_str())
}
