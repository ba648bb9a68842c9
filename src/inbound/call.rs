//! What passes between the inbound steps: one call from a peer, and the same call holding a slot.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use http::request::Parts;
use http::Request;
use hyper::body::Incoming;

use crate::config::{CompiledSchema, Snapshot};
use crate::http::deadline::within;
use crate::http::upload::{UploadWatch, WatchedUpload};
use crate::http::{body, ReachBody};
use crate::local::Slot;
use crate::metrics::InboundSeries;

/// What one inbound call is, as the steps after intake need it.
#[derive(Debug)]
pub(super) struct Meta {
    /// The capability's metric series, its label among them.
    pub(super) series: Arc<InboundSeries>,
    /// How long the agent may take to answer (the capability's timeout).
    pub(super) own_timeout: Duration,
    /// The time the caller's deadline left when the call `arrived`: the steps after intake
    /// count down from it on the clock they already read, not from the wall clock again.
    pub(super) left: Option<Duration>,
    /// When intake took the call (tokio's clock: the agent's view reads it).
    pub(super) arrived: Instant,
    /// Redirected here by `init-net` from the agent's port (`reach_requests_total{source="intercepted"}`).
    pub(super) intercepted: bool,
    /// The call's delegation chain, in flight while the call is (`src/chain/`): the agent's
    /// own calls meanwhile may carry it.
    #[expect(
        dead_code,
        reason = "held, not read: the chain is in flight while the call lives"
    )]
    pub(super) chain: crate::chain::InFlight,
}

impl Meta {
    /// The capability's metric label.
    pub(super) fn label(&self) -> &str {
        self.series.label()
    }

    /// The time a wait begun at `now` may take: `own`, cut short by the deadline (and whether the
    /// deadline is what limits it).
    pub(super) fn timeout_at(&self, own: Duration, now: Instant) -> (Duration, bool) {
        let waited = now.saturating_duration_since(self.arrived);
        within(own, self.left.map(|left| left.saturating_sub(waited)))
    }
}

/// One call from a peer, checked at intake, under one config snapshot.
pub(super) struct Call {
    pub(super) meta: Meta,
    pub(super) snapshot: Arc<Snapshot>,
    /// Idempotency keys are scoped by caller: the verified name, else the connection's address.
    pub(super) scope: String,
    pub(super) parts: Box<Parts>,
    pub(super) body: CallBody,
    /// The call carries an `idempotency-key` (`headers::Present`, read at intake).
    pub(super) keyed: bool,
}

/// The call's body: as it arrives, or already read (a keyed call's, fingerprinted).
pub(super) enum CallBody {
    Arriving(Incoming),
    Ready(ReachBody, UploadWatch),
}

impl Call {
    /// The request to forward, and the watch on its upload.
    pub(super) fn into_request(self) -> (Meta, Arc<Snapshot>, Request<ReachBody>, UploadWatch) {
        let (body, upload) = match self.body {
            // No body (a GET, most often): nothing to watch.
            CallBody::Arriving(incoming) if http_body::Body::is_end_stream(&incoming) => {
                (body::empty(), UploadWatch::complete())
            }
            CallBody::Arriving(incoming) => {
                let gap = self.snapshot.bootstrap.limits.body_read_timeout.get();
                let (body, upload) = WatchedUpload::new(incoming, gap);
                (body::boxed(body), upload)
            }
            CallBody::Ready(body, upload) => (body, upload),
        };
        let request = Request::from_parts(*self.parts, body);
        (self.meta, self.snapshot, request, upload)
    }
}

/// A call admitted to the agent: it holds a slot until its answer has been delivered.
pub(super) struct Admitted {
    pub(super) meta: Meta,
    pub(super) snapshot: Arc<Snapshot>,
    pub(super) request: Request<ReachBody>,
    pub(super) upload: UploadWatch,
    pub(super) slot: Slot,
}

/// What the answer of a call to a capability with an output schema is checked against.
#[derive(Clone, Debug)]
pub(super) struct Check {
    pub(super) capability: String,
    pub(super) schema: Arc<CompiledSchema>,
}
