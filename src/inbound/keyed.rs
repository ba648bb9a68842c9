//! Inbound requests with an `idempotency-key`: read and fingerprinted, claimed in the table, run
//! once, and answered from the original's outcome.

use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;

use super::{Call, Inbound, Outcome};
use crate::config::Snapshot;
use crate::error::ReachError;
use crate::http::deadline::attempt_timeout;
use crate::http::upload::{self, Upload, UploadWatch, WatchedUpload};
use crate::http::{body, ReachBody};
use crate::idempotency::{self, Claim};
use crate::metrics::Direction;

impl Inbound {
    /// A request with an `idempotency-key`: the first runs — to completion or the caller's
    /// deadline, whatever its connection does, so a retry with the same key joins it rather
    /// than running the task again — and every request with that key, the first included,
    /// answers from its outcome. The key is the caller's, and holds one request: the same key
    /// with another method, path or body gets 422.
    pub(super) async fn keyed(
        self: Arc<Self>,
        parts: http::request::Parts,
        incoming: Incoming,
        key: &str,
        scope: &str,
        snapshot: Arc<Snapshot>,
        call: Call,
    ) -> Response<ReachBody> {
        let gap = snapshot.bootstrap.limits.body_read_timeout.get();
        let max = snapshot.policy.retry.max_body_bytes;
        let read = match upload::read(&parts.headers, incoming, max, gap).await {
            Ok(read) => read,
            Err(err) => {
                self.finish(&call.label, Outcome::Rejected, None, call.arrived.elapsed());
                return err.into_response();
            }
        };
        let fingerprint = idempotency::fingerprint(&parts, &read);
        let (body, upload) = match read {
            Upload::Buffered(bytes) => (body::full(bytes), UploadWatch::complete()),
            Upload::Stream(incoming, _) => {
                let (body, upload) = WatchedUpload::new(incoming, gap);
                (body::boxed(body), upload)
            }
        };
        let (wait, by_deadline) = attempt_timeout(call.own_timeout, call.deadline);
        let claim = self.idempotency.claim(scope, &call.label, key, fingerprint);
        let (claim, first) = match claim {
            Claim::First(ticket) => {
                let joined = ticket.subscribe();
                let this = self.clone();
                // The agent is working on it: it runs until the caller's deadline (its retries
                // join it), or its own timeout when the caller set none.
                let retries = snapshot.policy.retry.max_retries.saturating_add(1);
                let longest = call.own_timeout.saturating_mul(retries);
                let run = Call {
                    // Capped: a caller's far-off deadline must not hold a slot for days.
                    own_timeout: call
                        .deadline
                        .map_or(call.own_timeout, |d| d.remaining().min(longest)),
                    ..call.clone()
                };
                let req = Request::from_parts(parts, body);
                tokio::spawn(async move {
                    let response = this.clone().run(req, upload, &snapshot, run).await;
                    ticket.settle(response).await;
                });
                (joined, true)
            }
            other => {
                self.metrics.idempotent_replay();
                (other, false)
            }
        };
        match tokio::time::timeout(wait, idempotency::answer(claim)).await {
            Ok(mut response) => {
                if first {
                    response.headers_mut().remove(idempotency::REPLAYED);
                }
                response
            }
            Err(_) if by_deadline => {
                self.metrics.deadline_exceeded(Direction::Inbound);
                ReachError::DeadlineExceeded.into_response()
            }
            Err(_) => ReachError::Timeout {
                target: "the keyed original".to_owned(),
                after: wait,
            }
            .into_response(),
        }
    }
}
