//! One agent as seen from one place: its estimates and its state machine, fed together.

use serde::Serialize;
use tokio::time::Instant;

use super::estimate::{EstimateParams, EstimateSnapshot, Estimates, Signal};
use super::state::{Event, QualityMark, State, StateMachine, StateParams, Transition};

/// Availability a newly seen agent starts with: it is on parole, neither trusted nor distrusted.
const PAROLE_AVAILABILITY: f64 = 0.7;

#[derive(Clone, Debug)]
pub(crate) struct ReachView {
    estimates: Estimates,
    machine: StateMachine,
}

/// A view at one instant, for scoring, `/status` and the wire.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct ViewSnapshot {
    pub state: State,
    pub(crate) cap: f64,
    /// Seconds in the current state.
    pub(crate) state_age_s: f64,
    #[serde(flatten)]
    pub estimates: EstimateSnapshot,
    /// The last golden-task verdict, for an agent that has golden tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<QualityMark>,
}

impl ViewSnapshot {
    /// The state as shown: `degraded` in place of a `healthy` whose answers drifted.
    pub(crate) fn shown_state(&self) -> &'static str {
        super::state::shown(self.state, self.quality)
    }
}

impl ReachView {
    pub(crate) fn new(now: Instant, probe_gated: bool) -> Self {
        Self {
            estimates: Estimates::new(PAROLE_AVAILABILITY, now),
            machine: StateMachine::new(now, probe_gated),
        }
    }

    /// A production request's outcome.
    pub(crate) fn observe(
        &mut self,
        signal: Signal,
        now: Instant,
        ep: &EstimateParams,
        sp: &StateParams,
    ) -> Option<Transition> {
        self.estimates.observe(signal, now, ep);
        let event = match signal {
            Signal::Success(_) => Event::Success,
            Signal::Failure(_) | Signal::Timeout(_) => Event::Failure,
            Signal::Refused { .. } => Event::Refusal,
            Signal::Unreachable(_) => Event::Unreachable,
            // Load, not health: the state machine does not hear of it.
            Signal::Shed { .. } => return None,
        };
        self.machine.on(event, now, sp)
    }

    /// A business probe's outcome: the signal feeds the estimates, pass/fail the state machine.
    pub(crate) fn probed(
        &mut self,
        signal: Signal,
        passed: bool,
        now: Instant,
        ep: &EstimateParams,
        sp: &StateParams,
    ) -> Option<Transition> {
        self.estimates.observe(signal, now, ep);
        let event = match (passed, signal) {
            (true, _) => Event::ProbePassed,
            (false, Signal::Unreachable(_)) => Event::Unreachable,
            (false, _) => Event::ProbeFailed,
        };
        self.machine.on(event, now, sp)
    }

    /// The recent latency (ms) and the age of its last sample (s): see [`Estimates`].
    pub(crate) fn recent_latency(&self, now: Instant) -> Option<(f64, f64)> {
        self.estimates.recent(now)
    }

    /// Out because the agent refuses connections.
    pub(crate) fn is_unreachable(&self) -> bool {
        self.machine.is_unreachable()
    }

    pub(crate) fn event(
        &mut self,
        event: Event,
        now: Instant,
        sp: &StateParams,
    ) -> Option<Transition> {
        self.machine.on(event, now, sp)
    }

    pub(crate) fn tick(&mut self, now: Instant, sp: &StateParams) -> Option<Transition> {
        self.machine.tick(now, sp)
    }

    pub(crate) fn vouch(&mut self, now: Instant) -> Option<Transition> {
        self.machine.vouch(now)
    }

    pub(crate) fn follow_recovery(&mut self, now: Instant) -> Option<Transition> {
        self.machine.follow_recovery(now)
    }

    pub(crate) fn drain(&mut self, now: Instant) -> Option<Transition> {
        self.machine.drain(now)
    }

    pub(crate) fn state(&self) -> State {
        self.machine.state()
    }

    /// A golden-task run's verdict; whether `degraded` changed.
    pub(crate) fn set_quality(&mut self, mark: Option<QualityMark>) -> bool {
        self.machine.set_quality(mark)
    }

    #[cfg(test)]
    pub(crate) fn cap(&self, now: Instant, sp: &StateParams) -> f64 {
        self.machine.cap(now, sp)
    }

    pub(crate) fn estimates_mut(&mut self) -> &mut Estimates {
        &mut self.estimates
    }

    pub(crate) fn set_probe_gated(&mut self, gated: bool) {
        self.machine.set_probe_gated(gated);
    }

    pub(crate) fn snapshot(
        &self,
        now: Instant,
        ep: &EstimateParams,
        sp: &StateParams,
    ) -> ViewSnapshot {
        self.with_estimates(now, sp, self.estimates.snapshot(now, ep))
    }

    /// The view as a score reads it (no latency percentiles): the per-request path.
    pub(crate) fn scoring_snapshot(
        &self,
        now: Instant,
        ep: &EstimateParams,
        sp: &StateParams,
    ) -> ViewSnapshot {
        self.with_estimates(now, sp, self.estimates.scoring_snapshot(now, ep))
    }

    fn with_estimates(
        &self,
        now: Instant,
        sp: &StateParams,
        estimates: EstimateSnapshot,
    ) -> ViewSnapshot {
        ViewSnapshot {
            state: self.machine.state(),
            cap: self.machine.cap(now, sp),
            state_age_s: now
                .saturating_duration_since(self.machine.since())
                .as_secs_f64(),
            estimates,
            quality: self.machine.quality(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn healthy_view() -> ReachView {
        let (ep, sp) = (EstimateParams::default(), StateParams::default());
        let mut v = ReachView::new(Instant::now(), false);
        for _ in 0..10 {
            v.observe(
                Signal::Success(Duration::from_millis(50)),
                Instant::now(),
                &ep,
                &sp,
            );
        }
        assert_eq!(v.state(), State::Healthy);
        v
    }

    #[tokio::test(start_paused = true)]
    async fn a_single_slow_response_or_error_never_ejects() {
        let (ep, sp) = (EstimateParams::default(), StateParams::default());
        let mut v = healthy_view();
        v.observe(
            Signal::Success(Duration::from_secs(25)),
            Instant::now(),
            &ep,
            &sp,
        );
        assert_eq!(v.state(), State::Healthy, "slow but answered");
        v.observe(
            Signal::Timeout(Duration::from_secs(30)),
            Instant::now(),
            &ep,
            &sp,
        );
        assert_eq!(v.state(), State::Healthy, "one timeout");
        v.observe(
            Signal::Success(Duration::from_millis(50)),
            Instant::now(),
            &ep,
            &sp,
        );
        v.observe(
            Signal::Failure(Duration::from_millis(5)),
            Instant::now(),
            &ep,
            &sp,
        );
        assert_eq!(v.state(), State::Healthy, "one error");
        assert_eq!(v.cap(Instant::now(), &sp), 1.0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_lowers_the_score_through_saturation_not_availability() {
        let (ep, sp) = (EstimateParams::default(), StateParams::default());
        let mut v = healthy_view();
        let before = v.snapshot(Instant::now(), &ep, &sp);
        v.observe(
            Signal::Refused {
                retry_after: Duration::from_secs(5),
            },
            Instant::now(),
            &ep,
            &sp,
        );
        let after = v.snapshot(Instant::now(), &ep, &sp);
        assert_eq!(after.estimates.availability, before.estimates.availability);
        assert_eq!(after.estimates.saturation, 1.0);
        let w = crate::reach::Weights::SYNC;
        let score = |s: &ViewSnapshot| {
            crate::reach::score(
                s.estimates.availability,
                1.0,
                0.0,
                s.estimates.saturation,
                &w,
            )
            .score
        };
        assert!(score(&after) < score(&before) - 0.5);
        assert_eq!(v.state(), State::Healthy);
    }
}
