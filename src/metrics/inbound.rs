//! One capability's inbound series, found once per call at intake and carried with it: the call
//! then records its first byte and its end without a lock or a lookup of its own (each cost a
//! mutex, a hash of the label and two reference counts, `docs/perf-levers.md`). A series is
//! registered on first use, as before: a capability nobody has called shows none.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics::{counter, histogram, Histogram};

use super::{
    count_request, Direction, Metrics, RequestHandles, INBOUND_TTFB, OUTCOMES, REQUESTS_TOTAL,
    REQUEST_DURATION,
};

/// The inbound series of one capability (its metric label).
pub(crate) struct InboundSeries {
    label: Box<str>,
    first_byte: OnceLock<Histogram>,
    /// By outcome, in `OUTCOMES` order; `{source="intercepted"}` apart.
    finished: [OnceLock<RequestHandles>; OUTCOMES.len()],
    intercepted: [OnceLock<RequestHandles>; OUTCOMES.len()],
}

impl std::fmt::Debug for InboundSeries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboundSeries")
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

impl InboundSeries {
    fn new(label: &str) -> Self {
        Self {
            label: label.into(),
            first_byte: OnceLock::new(),
            finished: Default::default(),
            intercepted: Default::default(),
        }
    }

    /// The capability's metric label.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// `reach_inbound_time_to_first_byte_seconds`: the agent's answer began.
    pub(crate) fn first_byte(&self, metrics: &Metrics, ttfb: Duration) {
        let histogram = self.first_byte.get_or_init(|| {
            let label = self.label.to_string();
            metrics.with(|| histogram!(INBOUND_TTFB, "capability" => label))
        });
        histogram.record(ttfb.as_secs_f64());
    }

    /// The call ended with `outcome` after `duration`. An intercepted call (redirected here from
    /// the agent's port) has series of its own, `{source="intercepted"}`: the mesh's keep their
    /// labels as they were (dashboards and alerts match them unchanged), a sum over all series
    /// still counts every call once, and the source picks out the work that came around the mesh.
    pub(crate) fn finished(
        &self,
        metrics: &Metrics,
        intercepted: bool,
        outcome: &'static str,
        duration: Duration,
    ) {
        let Some(o) = OUTCOMES.iter().position(|x| *x == outcome) else {
            count_request(&self.register(metrics, intercepted, outcome), duration);
            return;
        };
        let slots = match intercepted {
            true => &self.intercepted,
            false => &self.finished,
        };
        let handles = slots[o].get_or_init(|| self.register(metrics, intercepted, outcome));
        count_request(handles, duration);
    }

    fn register(
        &self,
        metrics: &Metrics,
        intercepted: bool,
        outcome: &'static str,
    ) -> RequestHandles {
        if !intercepted {
            return metrics.register_request(Direction::Inbound, &self.label, outcome);
        }
        let capability = self.label.to_string();
        let inbound = Direction::Inbound.as_str();
        metrics.with(|| {
            (
                counter!(REQUESTS_TOTAL, "direction" => inbound, "source" => "intercepted",
                    "capability" => capability.clone(), "outcome" => outcome),
                histogram!(REQUEST_DURATION, "direction" => inbound, "source" => "intercepted",
                    "capability" => capability, "outcome" => outcome),
            )
        })
    }
}

impl Metrics {
    /// The inbound series of `capability` (a configured name, so the map grows only as the
    /// declared names do).
    pub(crate) fn inbound_series(&self, capability: &str) -> Arc<InboundSeries> {
        let mut known = self.inbound.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(series) = known.get(capability) {
            return Arc::clone(series);
        }
        let series = Arc::new(InboundSeries::new(capability));
        known.insert(capability.to_owned(), Arc::clone(&series));
        series
    }
}
