//! The first step of a capability call: which capability it names (refusing anything that would
//! make the listener an open proxy), the one config snapshot the whole call runs under, its
//! deadline, and its body — buffered when it may need replaying on another peer.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use http::{Request, Response};
use hyper::body::Incoming;
use tower::layer::{layer_fn, Layer};
use tower::{service_fn, ServiceExt};
use tracing::Span;

use super::call::Call;
use super::record;
use super::{capability_of, Outbound};
use crate::http::deadline::Deadline;
use crate::http::layers::field;
use crate::http::request_target::{self, Target};
use crate::http::step::{answer, Step};
use crate::http::{headers, upload, ReachBody};

pub(super) fn layer<S>(
    out: Arc<Outbound>,
) -> impl Layer<S, Service = impl Step<Request<Incoming>, Response = Response<ReachBody>>> + Clone
where
    S: Step<Call, Response = Response<ReachBody>>,
{
    layer_fn(move |inner: S| {
        let out = out.clone();
        service_fn(move |req| {
            let (out, inner) = (out.clone(), inner.clone());
            async move {
                Ok::<_, Infallible>(match resolve(&out, req).await {
                    Ok(call) => answer(inner.oneshot(call).await),
                    Err(refused) => refused,
                })
            }
        })
    })
}

#[allow(
    clippy::result_large_err,
    reason = "the refusal is the answer, moved once"
)]
async fn resolve(out: &Outbound, mut req: Request<Incoming>) -> Result<Call, Response<ReachBody>> {
    let started = Instant::now();
    let refuse = |err| record::refuse(&out.metrics, "-", "-", err, started);
    let target = request_target::of(&req);
    if let Ok(Target::ServerOptions) = target {
        return Err(request_target::server_options());
    }
    // First: a proxy request for a foreign host (CONNECT included) is `forbidden_host`.
    let capability = capability_of(&req).map_err(refuse)?;
    Span::current().record(field::CAPABILITY, capability.as_str());
    target.map_err(refuse)?;
    let deadline = Deadline::from_headers(req.headers()).map_err(refuse)?;
    // Before the sidecar adds its own headers: a `Connection` header naming them must not
    // remove them on the way out.
    headers::strip_hop_by_hop(req.headers_mut());
    let snapshot = out.store.snapshot();
    let (parts, incoming) = req.into_parts();
    let max_body = snapshot.policy.retry.max_body_bytes;
    let gap = snapshot.bootstrap.limits.body_read_timeout.get();
    // A body that may need replaying on another peer is buffered, up to the policy's size;
    // a larger one streams and gets a single attempt.
    let upload = upload::read(&parts.headers, incoming, max_body, gap)
        .await
        .map_err(refuse)?;
    Ok(Call {
        capability,
        parts,
        upload,
        deadline,
        snapshot,
        started,
    })
}
