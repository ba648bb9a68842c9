//! The first step of a capability call: which capability it names (refusing anything that would
//! make the listener an open proxy) or asks for by intent, the one config snapshot the whole call
//! runs under, its deadline, and its body — buffered when it may need replaying on another peer.

mod intent;
mod target;

use std::time::Instant;

use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;

use super::attempts::decision::{self, Resolution};
use super::call::Call;
use super::{record, Outbound};
use target::{wanted, Wanted};

use crate::config::{Name, Snapshot};
use crate::error::ReachError;
use crate::http::deadline::Deadline;
use crate::http::layers::field;
use crate::http::request_target::{self, Target};
use crate::http::upload::Upload;
use crate::http::{headers, upload, ReachBody};
pub(crate) use target::capability_of;
pub(super) use target::path_prefix;

/// The answer, marked with how the capability was chosen when the call asked for intent
/// routing (`resolved`, set by [`resolve`]): on every answer of the call. `None` for a call
/// that named its capability.
pub(super) fn marked(
    mut response: Response<ReachBody>,
    resolved: Option<HeaderValue>,
) -> Response<ReachBody> {
    if let Some(value) = resolved {
        response
            .headers_mut()
            .insert(headers::RESOLVED_CAPABILITY, value);
    }
    response
}

#[allow(
    clippy::result_large_err,
    reason = "the refusal is the answer, moved once"
)]
pub(super) async fn resolve(
    out: &Outbound,
    mut req: Request<Incoming>,
    resolved: &mut Option<HeaderValue>,
) -> Result<Call, Response<ReachBody>> {
    let started = Instant::now();
    let head = headers::Head::of(req.headers());
    let mut present = head.present;
    let refuse = |err| record::refuse(&out.metrics, "-", "-", err, started);
    let target = request_target::of(&req);
    if let Ok(Target::ServerOptions) = target {
        return Err(request_target::server_options());
    }
    // First: a proxy request for a foreign host (CONNECT included) is `forbidden_host`.
    let wanted = wanted(&req, &head).map_err(refuse)?;
    if let Wanted::Named(capability) = &wanted {
        crate::http::layers::record_in_span(field::CAPABILITY, capability.as_str());
    }
    target.map_err(refuse)?;
    let deadline = Deadline::from_head(req.headers(), &head).map_err(refuse)?;
    // The delegation chain the agent passed on, opened — or, when it passed none while it
    // serves exactly one call, that call's (`src/chain/`).
    let carried = out
        .seal
        .carry(req.headers_mut(), present.has(headers::Present::CHAIN))
        .map_err(|(why, err)| {
            out.metrics.chain_refused(why.as_str());
            refuse(err)
        })?;
    if carried {
        present = present.with(headers::Present::CHAIN);
    }
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
    let capability = match wanted {
        Wanted::Named(capability) => capability,
        Wanted::Override(capability) => {
            decision::resolved(&snapshot, capability.as_str(), &Resolution::Override);
            *resolved = Some(intent::overridden(&capability));
            capability
        }
        Wanted::Intent => {
            let (capability, value) =
                by_intent(&snapshot, &parts.headers, &upload).map_err(refuse)?;
            *resolved = Some(value);
            capability
        }
    };
    if resolved.is_some() {
        crate::http::layers::record_in_span(field::CAPABILITY, capability.as_str());
    }
    Ok(Call {
        capability,
        parts: Box::new(parts),
        upload,
        deadline,
        snapshot,
        started,
        present,
        carried: None,
    })
}

/// The capability the policy's intent rules pick for the call's `reach-intent` text, or else its
/// buffered body; with the `reach-resolved-capability` value that says why.
fn by_intent(
    snapshot: &Snapshot,
    head: &http::HeaderMap,
    upload: &Upload<Incoming>,
) -> Result<(Name, HeaderValue), ReachError> {
    let text = match (head.get(headers::INTENT), upload) {
        (Some(value), _) => String::from_utf8_lossy(value.as_bytes()),
        (None, Upload::Buffered(body)) => intent::body_text(body),
        // A body too large to buffer is not read for its intent: it streams to the peer.
        (None, Upload::Stream(..)) => "".into(),
    };
    let policy = &snapshot.policy;
    let chosen = intent::resolve(&policy.intents, policy.intent_threshold.0, &text)?;
    let how = Resolution::Intent {
        keyword: chosen.keyword,
        confidence: chosen.confidence,
    };
    decision::resolved(snapshot, chosen.capability.as_str(), &how);
    Ok((chosen.capability.clone(), chosen.header()))
}
