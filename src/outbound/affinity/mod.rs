//! Session affinity: a call carrying a key (`reach-affinity`, `Mcp-Session-Id`, an A2A task or
//! context id) goes to the agent that answered the key before, while that agent is up.
//!
//! Why: A2A tasks and contexts and MCP sessions live in one agent's memory; a follow-up that
//! lands elsewhere fails. The caller binds each key to the peer that answered it (keys of the
//! request and those the answer assigns: an A2A task's id, an MCP session, an MCP server's
//! `requestState`) and, when the holder is out, refuses with `affinity_lost` (`strict`) or
//! routes afresh and rebinds (`fallback`). `docs/affinity.md` has the whole story.

mod body;
mod keys;
mod route;
mod table;

use std::sync::Arc;

use http::Response;

use super::call::{Call, Pinned, Routed};
use super::Outbound;
use crate::classify::{Class, Refusal};
use crate::config::{AffinityMode, Snapshot};
use crate::error::ReachError;
use crate::http::headers;
use crate::http::pool::UpstreamBody;
use crate::http::upload::Upload;

pub(crate) use body::Watched;
pub(super) use route::narrow;
pub(crate) use table::Table;
use table::{Bounds, Key, Kind};

/// Looks the call's keys up, routes it with `route` (to the holder when one is bound), and binds
/// what the answer confirms: the call routed with its affinity key's holder, and its answer
/// watched for keys to bind. Asked by `routing`, around the rest of it.
pub(super) async fn affine<F, R>(out: &Outbound, mut call: Call, route: F) -> Routed<Watched>
where
    F: FnOnce(Call) -> R,
    R: std::future::Future<Output = Routed>,
{
    let snapshot = call.snapshot.clone();
    let settings = snapshot.policy.capabilities.get(call.capability.as_str());
    let body = match &call.upload {
        Upload::Buffered(bytes) => Some(&bytes[..]),
        Upload::Stream(..) => None,
    };
    let protocol = settings.and_then(|c| c.protocol);
    let mut found = keys::of_request(&call.parts.headers, call.present, body, protocol);
    let capability: Option<Arc<str>> = (!found.keys.is_empty() || found.reader().is_some())
        .then(|| call.capability.as_str().into());
    let pinned = capability
        .as_ref()
        .and_then(|cap| lookup(out, &snapshot, cap, &found.keys))
        .map(|(holder, kind)| Pinned {
            holder,
            kind,
            mode: mode(kind, settings.map(|c| c.affinity)),
        });
    if let Some(pin) = &pinned {
        call.carried_mut().pinned = Some(pin.clone());
    }
    // A lost MCP session or A2A task is answered as a JSON-RPC error with the request's id:
    // the body is kept (a reference) and parsed only if the holder turns out lost.
    let bound_body = match (&pinned, &call.upload) {
        (Some(p), Upload::Buffered(bytes)) if p.kind != Kind::Header => Some(bytes.clone()),
        _ => None,
    };
    let ends_session = call.parts.method == http::Method::DELETE;
    let routed = route(call).await;
    let mut routed = match &pinned {
        Some(pin) if pin.mode == AffinityMode::Strict => lost_holder(out, routed, pin),
        _ => routed,
    };
    // Whichever step found the holder lost (`narrow` before any attempt, or `lost_holder`).
    if let Err(ReachError::AffinityLost { rpc_id, .. }) = &mut routed.answer {
        *rpc_id = bound_body.as_deref().and_then(keys::rpc_id).map(Box::new);
    }
    if let (Some(cap), true) = (&capability, ends_session) {
        end_session(out, cap, &mut found);
    }
    routed.map(|response, label, peer| {
        // Nothing to bind, the common case: no allocation, no watch.
        let reader = found.reader();
        let anything = !found.keys.is_empty()
            || reader.is_some()
            || response
                .headers()
                .contains_key(crate::http::headers::MCP_SESSION_ID);
        if !anything || !response.status().is_success() || peer == "-" {
            return response.map(body::plain);
        }
        let peer: Arc<str> = peer.into();
        let binding = body::Binding {
            table: out.affinity.clone(),
            metrics: out.metrics.clone(),
            capability: capability.unwrap_or_else(|| label.into()),
            peer,
            request: found.keys,
            bounds: bounds(&snapshot),
        };
        bind(response, binding, reader)
    })
}

/// The capability's affinity mode; always strict for a server's `requestState`, which means
/// nothing to another server (`docs/mcp.md`).
fn mode(kind: Kind, configured: Option<AffinityMode>) -> AffinityMode {
    match kind {
        Kind::RequestState => AffinityMode::Strict,
        _ => configured.unwrap_or_default(),
    }
}

/// MCP's `DELETE` ends the session whatever the holder answers: its binding is gone for good,
/// and the answer binds it to nobody. (A binding otherwise outlives a holder that is only out
/// for now: it may come back with the task.)
fn end_session(out: &Outbound, capability: &Arc<str>, found: &mut keys::Found) {
    for (_, value) in found.keys.iter().filter(|(k, _)| *k == Kind::McpSession) {
        let left = out.affinity.forget(&Key {
            capability: capability.clone(),
            kind: Kind::McpSession,
            value: value.as_str().into(),
        });
        out.metrics.affinity_entries(left);
    }
    found.keys.retain(|(k, _)| *k != Kind::McpSession);
}

/// The agent the first bound key names, with the key's kind.
fn lookup(
    out: &Outbound,
    snapshot: &Snapshot,
    capability: &Arc<str>,
    found: &[(Kind, String)],
) -> Option<(Arc<str>, Kind)> {
    let now = tokio::time::Instant::now();
    let idle = snapshot.policy.affinity.idle_timeout.get();
    found.iter().find_map(|(kind, value)| {
        let key = Key {
            capability: capability.clone(),
            kind: *kind,
            value: value.as_str().into(),
        };
        out.affinity.get(&key, now, idle).map(|peer| (peer, *kind))
    })
}

/// A strict call's only attempt went to its holder and found it out: `affinity_lost`, since
/// no other agent has its task or session.
fn lost_holder(out: &Outbound, routed: Routed, pin: &Pinned) -> Routed {
    if routed.peer != *pin.holder {
        return routed;
    }
    let out_of_rotation = match &routed.answer {
        Err(err) => matches!(err, ReachError::UpstreamConnect { .. }),
        Ok(response) => matches!(
            Class::of_response(response),
            Class::Shed {
                why: Refusal::OutOfRotation | Refusal::AgentUnreachable,
                ..
            }
        ),
    };
    if !out_of_rotation {
        return routed;
    }
    out.metrics.affinity_lost(&routed.label);
    let err = ReachError::AffinityLost {
        capability: routed.label.clone(),
        holder: pin.holder.to_string(),
        key: pin.kind,
        rpc_id: None,
    };
    Routed {
        answer: Err(err),
        ..routed
    }
}

/// A successful answer binds the call's keys (and those it assigns) to the peer that gave it.
/// An A2A or MCP answer's body is watched as it passes (by `reader`), for the task and context
/// or the request state it names.
fn bind(
    response: Response<UpstreamBody>,
    mut binding: body::Binding,
    reader: Option<keys::Reader>,
) -> Response<Watched> {
    binding
        .request
        .extend(keys::of_response_head(response.headers()));
    let Some(reader) = reader else {
        binding.finish(Some(Vec::new()));
        return response.map(body::plain);
    };
    let head = response.headers();
    let shape = if headers::is_json(head) {
        body::Shape::Json
    } else if headers::is_event_stream(head) {
        // A stream's first event names the task; its request keys are bound now, before it.
        binding.bind_request();
        body::Shape::Stream
    } else {
        binding.finish(Some(Vec::new()));
        return response.map(body::plain);
    };
    response.map(|incoming| body::watching(incoming, binding, shape, reader))
}

fn bounds(snapshot: &Snapshot) -> Bounds {
    let policy = &snapshot.policy.affinity;
    Bounds {
        max_entries: policy.max_entries,
        max_bytes: policy.max_bytes,
        idle: policy.idle_timeout.get(),
    }
}
