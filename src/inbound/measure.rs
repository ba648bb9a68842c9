//! An admitted call (asked by `admit`) forwarded to the agent (`agent`), its answer checked when
//! the capability has an output schema (`validate`), and what really happened, as the classifier
//! reads it, told to the agent's own view, the counters and the metrics. The call's slot is held
//! until its answer has been delivered: the agent is busy until then.
//!
//! The agent and the check are asked, not steps of their own: each step a call passes costs it
//! something (`docs/perf-levers.md`), and neither decides whether the call goes on.

use std::sync::Arc;

use http::{HeaderMap, Response};
use tokio::time::Instant;

use super::call::{Admitted, Meta};
use super::Inbound;
use super::{agent, validate};
use crate::classify::{Class, Outcome};
use crate::config::Snapshot;
use crate::error::ReachError;
use crate::http::observed::{BodyEnd, Observed};
use crate::http::upload::UploadWatch;
use crate::http::{body, headers, ReachBody};
use crate::metrics::Direction;
use crate::reach::Signal;

/// The call forwarded and measured.
pub(super) async fn measure(inbound: Arc<Inbound>, call: Admitted) -> Response<ReachBody> {
    let Admitted {
        meta,
        snapshot,
        request,
        upload,
        slot,
    } = call;
    let admitted = Instant::now();
    let (timeout, by_deadline) = meta.timeout_at(meta.own_timeout, admitted);
    let check = validate::check_for(&snapshot, meta.label(), request.method());
    let forwarded = agent::forward(&inbound.client, &snapshot, request, timeout).await;
    let checked = match forwarded {
        Ok(response) => validate::checked(&inbound, &snapshot, check, response, timeout).await,
        Err(err) => Err(err),
    };
    let response = match checked {
        Ok(response) => response,
        Err(err) => {
            let failed = Failed {
                err,
                upload: &upload,
                by_deadline,
                admitted,
            };
            return failed.answer(&inbound, &meta, &snapshot);
        }
    };
    let ttfb = admitted.elapsed();
    meta.series.first_byte(&inbound.metrics, ttfb);
    agent_reports(&inbound, response.headers(), &snapshot);
    let class = Class::of_response(&response);
    // A response to a broken or stalled upload says nothing about the agent.
    let signal = match upload.caller_fault(false) {
        Some(_) => None,
        None => class.signal(ttfb),
    };
    let (mut parts, incoming) = response.into_parts();
    parts
        .headers
        .insert(headers::AGENT, snapshot.agent_name.clone());
    let measured = Observed::new(incoming, move |end: BodyEnd| {
        let ended = Instant::now();
        let (outcome, signal) = match end {
            BodyEnd::Error => {
                let took = ended.saturating_duration_since(meta.arrived);
                (Outcome::Failure, Some(Signal::Failure(took)))
            }
            _ => (class.outcome(), signal),
        };
        inbound.finish(&snapshot, &meta, outcome, signal, ended);
        drop(slot);
    });
    Response::from_parts(parts, body::boxed(measured))
}

/// A forward that produced no response.
struct Failed<'a> {
    err: ReachError,
    upload: &'a UploadWatch,
    by_deadline: bool,
    admitted: Instant,
}

impl Failed<'_> {
    /// Whose fault it was decides what the view learns.
    fn answer(self, inbound: &Inbound, meta: &Meta, snapshot: &Snapshot) -> Response<ReachBody> {
        let timed_out = matches!(self.err, ReachError::Timeout { .. });
        let (outcome, signal, err) = match self.upload.caller_fault(timed_out) {
            // The caller's upload broke or stalled: no evidence against the agent.
            Some(fault) => (Outcome::Rejected, None, fault),
            // The caller's deadline, not the agent's timeout: no evidence against it.
            None if timed_out && self.by_deadline => {
                inbound.metrics.deadline_exceeded(Direction::Inbound);
                (Outcome::Timeout, None, ReachError::DeadlineExceeded)
            }
            // Otherwise as the classifier reads it; nothing listening where the agent should be
            // is `Unreachable`: it is not running, out at once.
            None => {
                let class = Class::of_error(&self.err);
                let elapsed = self.admitted.elapsed();
                (class.outcome(), class.signal(elapsed), self.err)
            }
        };
        inbound.finish(snapshot, meta, outcome, signal, Instant::now());
        tracing::debug!(%err, capability = meta.label(), "inbound request failed");
        let mut response = err.into_response();
        response
            .headers_mut()
            .insert(headers::AGENT, snapshot.agent_name.clone());
        response
    }
}

/// `reach-busy` / `reach-load` on any response: the agent telling us how loaded it is.
fn agent_reports(inbound: &Inbound, h: &HeaderMap, snapshot: &Snapshot) {
    // Most answers carry neither: one pass over the names instead of two hashed lookups.
    if !h.keys().any(|n| n == headers::BUSY || n == headers::LOAD) {
        return;
    }
    if let Some(busy) = h.get(headers::BUSY).and_then(|v| v.to_str().ok()) {
        let busy = busy.trim().eq_ignore_ascii_case("true");
        inbound.local.report_busy(busy, None, snapshot);
    }
    if let Some(load) = h
        .get(headers::LOAD)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
    {
        if load.is_finite() {
            inbound.local.report_load(load);
        }
    }
}
