//! The per-agent state machine and its traffic caps (docs/reach-model.md, "State machine"), pure and clock-driven.
//!
//! parole → healthy → probation → ejected → recovering (ramp) → healthy, plus draining. The same
//! machine runs in an agent's own sidecar (fed by inbound traffic and probes) and in every caller
//! for every peer (fed by what that caller sees).
//!
//! `degraded` (golden tasks drifted from their baselines) is an overlay on these states, not a
//! seventh: it caps the share and is shown in place of `healthy`, while the machine's transitions
//! and every wire that carries a [`State`] stay as they were (`docs/reach-model.md`, "Quality and
//! `degraded`").

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Parole,
    Healthy,
    Probation,
    Ejected,
    Recovering,
    Draining,
}

impl State {
    pub(crate) const ALL: [State; 6] = [
        State::Parole,
        State::Healthy,
        State::Probation,
        State::Ejected,
        State::Recovering,
        State::Draining,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Parole => "parole",
            State::Healthy => "healthy",
            State::Probation => "probation",
            State::Ejected => "ejected",
            State::Recovering => "recovering",
            State::Draining => "draining",
        }
    }
}

/// What happened to the agent, as far as the state machine cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    Success,
    Failure,
    /// A 429 or a 503 with `retry-after`: one is load, a run of them is an outage.
    Refusal,
    ProbePassed,
    ProbeFailed,
    /// The score fell below the policy's floor.
    LowScore,
    /// The agent refused a connection: it is not running. Out at once — no run of failures
    /// needed, it is not noise.
    Unreachable,
    /// An agent that refused connections accepts them again (a TCP connect or a probe): back
    /// in at once, ramping, with no cool-off — the outage had a known cause and a known end.
    Reachable,
}

/// Thresholds and timings, from the policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct StateParams {
    pub(crate) parole_cap: f64,
    pub(crate) parole_successes: u32,
    pub(crate) parole_duration: Duration,
    pub(crate) parole_failures: u32,
    pub(crate) healthy_failures: u32,
    /// The cap of an agent whose golden tasks drifted (policy `states.degraded.cap`).
    pub(crate) degraded_cap: f64,
    pub(crate) probation_cap: f64,
    pub(crate) probation_window: Duration,
    pub(crate) recover_rate: f64,
    pub(crate) probation_min_samples: u32,
    pub(crate) probation_eject_failure_rate: f64,
    pub(crate) probation_failures: u32,
    pub(crate) cool_off: Duration,
    pub(crate) max_cool_off: Duration,
    pub(crate) recovering_start_cap: f64,
    pub(crate) ramp: Duration,
    pub(crate) recovering_failures: u32,
    /// Consecutive refusals after which each further one counts as a failure.
    pub(crate) refusals_as_failure: u32,
}

impl Default for StateParams {
    fn default() -> Self {
        Self {
            parole_cap: 0.05,
            parole_successes: 10,
            parole_duration: Duration::from_secs(30),
            parole_failures: 3,
            healthy_failures: 3,
            degraded_cap: 0.5,
            probation_cap: 0.2,
            probation_window: Duration::from_secs(30),
            recover_rate: 0.9,
            probation_min_samples: 5,
            probation_eject_failure_rate: 0.5,
            probation_failures: 2,
            cool_off: Duration::from_secs(60),
            max_cool_off: Duration::from_secs(600),
            recovering_start_cap: 0.05,
            ramp: Duration::from_secs(30),
            recovering_failures: 2,
            refusals_as_failure: 3,
        }
    }
}

/// What the last golden-task run said of the agent's answers.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct QualityMark {
    /// Mean similarity to the baselines, 0..1 (the lowest over capabilities with golden tasks).
    pub(crate) similarity: f64,
    /// Below a capability's threshold: the share is capped at `states.degraded.cap`.
    pub degraded: bool,
}

impl QualityMark {
    /// What a caller multiplies a degraded agent's capability-match factor by: answers half as
    /// close to the baseline make it half as good a match. Above the threshold, 1: an agent that
    /// checks its answers is not ranked below one that does not.
    pub(crate) fn match_factor(mark: Option<QualityMark>) -> f64 {
        match mark {
            Some(m) if m.degraded => m.similarity.clamp(0.0, 1.0),
            _ => 1.0,
        }
    }
}

/// The name shown for a state under a quality mark: `degraded` in place of `healthy`.
pub(crate) fn shown(state: State, quality: Option<QualityMark>) -> &'static str {
    match (state, quality) {
        (State::Healthy, Some(q)) if q.degraded => "degraded",
        _ => state.as_str(),
    }
}

/// A change of state, for metrics and the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Transition {
    pub(crate) from: State,
    pub(crate) to: State,
    pub(crate) reason: &'static str,
}

/// Every transition `StateMachine` makes (from, to, reason), kept in step with its `enter`
/// calls: the metrics export each at 0 from the start, so a dashboard's `increase()` sees the
/// first ejection (`docs/metrics.md`).
pub(crate) const TRANSITIONS: &[(State, State, &str)] = &[
    (State::Healthy, State::Probation, "score below the floor"),
    (
        State::Parole,
        State::Ejected,
        "the agent refuses connections",
    ),
    (
        State::Healthy,
        State::Ejected,
        "the agent refuses connections",
    ),
    (
        State::Probation,
        State::Ejected,
        "the agent refuses connections",
    ),
    (
        State::Recovering,
        State::Ejected,
        "the agent refuses connections",
    ),
    (
        State::Draining,
        State::Ejected,
        "the agent refuses connections",
    ),
    (
        State::Ejected,
        State::Recovering,
        "the agent accepts connections again",
    ),
    (State::Parole, State::Healthy, "proved itself on parole"),
    (State::Ejected, State::Recovering, "the agent answers again"),
    (
        State::Ejected,
        State::Recovering,
        "cool-off over and the probe passed",
    ),
    (State::Parole, State::Ejected, "failed on parole"),
    (State::Healthy, State::Probation, "business probe failed"),
    (State::Healthy, State::Probation, "consecutive failures"),
    (
        State::Probation,
        State::Ejected,
        "kept failing on probation",
    ),
    (
        State::Probation,
        State::Ejected,
        "failure rate on probation",
    ),
    (State::Recovering, State::Ejected, "failed while recovering"),
    (
        State::Parole,
        State::Healthy,
        "parole served without failures",
    ),
    (State::Probation, State::Healthy, "probation window passed"),
    (State::Probation, State::Ejected, "probation window failed"),
    (State::Ejected, State::Recovering, "cool-off over"),
    (State::Recovering, State::Healthy, "ramp complete"),
    (State::Parole, State::Healthy, "its own view is healthy"),
    (
        State::Ejected,
        State::Recovering,
        "its own view is recovering",
    ),
    (State::Parole, State::Draining, "draining"),
    (State::Healthy, State::Draining, "draining"),
    (State::Probation, State::Draining, "draining"),
    (State::Ejected, State::Draining, "draining"),
    (State::Recovering, State::Draining, "draining"),
];

#[derive(Clone, Debug)]
pub(crate) struct StateMachine {
    state: State,
    since: Instant,
    consecutive_failures: u32,
    consecutive_successes: u32,
    consecutive_refusals: u32,
    window_ok: u32,
    window_failed: u32,
    ejections: u32,
    /// Leaving `ejected` needs a passing probe, not just the cool-off (an agent's own view, when
    /// it has probes); a caller's view has no probes and leaves on the cool-off alone.
    probe_gated: bool,
    /// Ejected because the agent refused connections: it leaves when it accepts them again.
    unreachable: bool,
    /// Recovering from a restart (it refused connections, now it accepts them): the ramp is
    /// short, because the cause is known and gone; a misbehaving agent ramps over `ramp`.
    restarted: bool,
    /// The last golden-task verdict: caps the share while degraded, and never moves the state.
    quality: Option<QualityMark>,
}

/// The longest ramp after a restart: a restarted agent takes a fair share within seconds.
const RESTART_RAMP: Duration = Duration::from_secs(5);

impl StateMachine {
    pub(crate) fn new(now: Instant, probe_gated: bool) -> Self {
        Self {
            state: State::Parole,
            since: now,
            consecutive_failures: 0,
            consecutive_successes: 0,
            consecutive_refusals: 0,
            window_ok: 0,
            window_failed: 0,
            ejections: 0,
            probe_gated,
            unreachable: false,
            restarted: false,
            quality: None,
        }
    }

    /// How long the current recovery ramps.
    fn ramp(&self, p: &StateParams) -> Duration {
        if self.restarted {
            p.ramp.min(RESTART_RAMP)
        } else {
            p.ramp
        }
    }

    /// Out because the agent refuses connections (and waiting for it to accept them).
    pub(crate) fn is_unreachable(&self) -> bool {
        self.unreachable
    }

    pub(crate) fn state(&self) -> State {
        self.state
    }

    pub(crate) fn since(&self) -> Instant {
        self.since
    }

    pub(crate) fn set_probe_gated(&mut self, gated: bool) {
        self.probe_gated = gated;
    }

    pub(crate) fn quality(&self) -> Option<QualityMark> {
        self.quality
    }

    /// A golden-task run's verdict (`None`: the agent has no golden tasks any more). Returns
    /// whether `degraded` changed. Quality alone never moves the state: a drifting agent is
    /// worth less, not broken, and failures still take it to probation as from healthy.
    pub(crate) fn set_quality(&mut self, mark: Option<QualityMark>) -> bool {
        let was = self.quality.is_some_and(|q| q.degraded);
        self.quality = mark;
        was != mark.is_some_and(|q| q.degraded)
    }

    /// The share of traffic this agent may take now, in 0..1.
    pub(crate) fn cap(&self, now: Instant, p: &StateParams) -> f64 {
        let cap = self.state_cap(now, p);
        if self.quality.is_some_and(|q| q.degraded) {
            cap.min(p.degraded_cap)
        } else {
            cap
        }
    }

    fn state_cap(&self, now: Instant, p: &StateParams) -> f64 {
        match self.state {
            State::Parole => p.parole_cap,
            State::Healthy => 1.0,
            State::Probation => p.probation_cap,
            State::Ejected | State::Draining => 0.0,
            State::Recovering => {
                let ramp = self.ramp(p).as_secs_f64().max(1e-3);
                let done =
                    (now.saturating_duration_since(self.since).as_secs_f64() / ramp).min(1.0);
                p.recovering_start_cap + (1.0 - p.recovering_start_cap) * done
            }
        }
    }

    /// The cool-off for the current ejection: doubles with each repeat, up to the cap.
    pub(crate) fn cool_off(&self, p: &StateParams) -> Duration {
        let doublings = self.ejections.saturating_sub(1).min(16);
        (p.cool_off * 2u32.pow(doublings)).min(p.max_cool_off)
    }

    pub(crate) fn on(&mut self, event: Event, now: Instant, p: &StateParams) -> Option<Transition> {
        if self.state == State::Draining {
            return None;
        }
        match event {
            Event::Unreachable => return self.on_unreachable(now),
            Event::Reachable => return self.on_reachable(now),
            _ => {}
        }
        let event = match event {
            Event::Refusal => {
                self.consecutive_refusals += 1;
                if self.consecutive_refusals < p.refusals_as_failure {
                    return None;
                }
                Event::Failure
            }
            other => other,
        };
        match event {
            Event::Success | Event::ProbePassed => self.on_success(event, now, p),
            Event::Failure | Event::ProbeFailed => self.on_failure(event, now, p),
            Event::LowScore if self.state == State::Healthy => {
                self.enter(State::Probation, now, "score below the floor")
            }
            Event::LowScore | Event::Refusal | Event::Unreachable | Event::Reachable => None,
        }
    }

    fn on_unreachable(&mut self, now: Instant) -> Option<Transition> {
        self.consecutive_successes = 0;
        if self.state == State::Ejected {
            self.unreachable = true;
            return None;
        }
        let t = self.enter(State::Ejected, now, "the agent refuses connections");
        // Not a misbehaving agent: its return is not held off by a growing cool-off.
        self.ejections = self.ejections.saturating_sub(1);
        self.unreachable = true;
        t
    }

    fn on_reachable(&mut self, now: Instant) -> Option<Transition> {
        if !self.unreachable {
            return None;
        }
        self.unreachable = false;
        if self.state != State::Ejected {
            return None;
        }
        let t = self.enter(
            State::Recovering,
            now,
            "the agent accepts connections again",
        );
        self.restarted = true;
        t
    }

    fn on_success(&mut self, event: Event, now: Instant, p: &StateParams) -> Option<Transition> {
        self.consecutive_failures = 0;
        self.consecutive_refusals = 0;
        self.consecutive_successes += 1;
        match self.state {
            State::Parole if self.consecutive_successes >= p.parole_successes => {
                self.enter(State::Healthy, now, "proved itself on parole")
            }
            State::Probation => {
                self.window_ok += 1;
                None
            }
            State::Ejected if event == Event::ProbePassed && self.unreachable => {
                self.unreachable = false;
                let t = self.enter(State::Recovering, now, "the agent answers again");
                self.restarted = true;
                t
            }
            State::Ejected
                if event == Event::ProbePassed
                    && now.saturating_duration_since(self.since) >= self.cool_off(p) =>
            {
                self.enter(State::Recovering, now, "cool-off over and the probe passed")
            }
            _ => None,
        }
    }

    fn on_failure(&mut self, event: Event, now: Instant, p: &StateParams) -> Option<Transition> {
        self.consecutive_failures += 1;
        self.consecutive_successes = 0;
        let probe = event == Event::ProbeFailed;
        match self.state {
            State::Parole if self.consecutive_failures >= p.parole_failures => {
                self.enter(State::Ejected, now, "failed on parole")
            }
            State::Healthy if probe => self.enter(State::Probation, now, "business probe failed"),
            State::Healthy if self.consecutive_failures >= p.healthy_failures => {
                self.enter(State::Probation, now, "consecutive failures")
            }
            State::Probation => {
                self.window_failed += 1;
                let samples = self.window_ok + self.window_failed;
                let failure_rate = f64::from(self.window_failed) / f64::from(samples.max(1));
                if self.consecutive_failures >= p.probation_failures {
                    self.enter(State::Ejected, now, "kept failing on probation")
                } else if samples >= p.probation_min_samples
                    && failure_rate >= p.probation_eject_failure_rate
                {
                    // Do not feed a clearly failing agent its probation share for the whole window.
                    self.enter(State::Ejected, now, "failure rate on probation")
                } else {
                    None
                }
            }
            State::Recovering if probe || self.consecutive_failures >= p.recovering_failures => {
                self.enter(State::Ejected, now, "failed while recovering")
            }
            _ => None,
        }
    }

    /// Time-driven transitions; call before reading the cap.
    pub(crate) fn tick(&mut self, now: Instant, p: &StateParams) -> Option<Transition> {
        let elapsed = now.saturating_duration_since(self.since);
        match self.state {
            State::Parole if elapsed >= p.parole_duration && self.consecutive_failures == 0 => {
                self.enter(State::Healthy, now, "parole served without failures")
            }
            State::Probation if elapsed >= p.probation_window => {
                let samples = self.window_ok + self.window_failed;
                let rate = f64::from(self.window_ok) / f64::from(samples.max(1));
                if samples == 0 || rate >= p.recover_rate {
                    self.enter(State::Healthy, now, "probation window passed")
                } else {
                    self.enter(State::Ejected, now, "probation window failed")
                }
            }
            // An agent that refuses connections comes back when it accepts them, not on a timer.
            State::Ejected
                if !self.probe_gated && !self.unreachable && elapsed >= self.cool_off(p) =>
            {
                self.enter(State::Recovering, now, "cool-off over")
            }
            State::Recovering if elapsed >= self.ramp(p) => {
                self.enter(State::Healthy, now, "ramp complete")
            }
            State::Healthy if elapsed >= p.max_cool_off => {
                // Long enough healthy: a later ejection starts from the base cool-off again.
                self.ejections = 0;
                None
            }
            _ => None,
        }
    }

    /// Another view vouches for the agent (its own sidecar has it healthy): a caller that merely has
    /// not called it yet need not hold it on parole. Only a parole without failures is cut short.
    pub(crate) fn vouch(&mut self, now: Instant) -> Option<Transition> {
        if self.state == State::Parole && self.consecutive_failures == 0 {
            return self.enter(State::Healthy, now, "its own view is healthy");
        }
        None
    }

    /// A caller's view of a peer whose own view is recovering: an ejected view follows it into
    /// recovering at once (with the short ramp: the peer's own ramp is the one that bounds it).
    pub(crate) fn follow_recovery(&mut self, now: Instant) -> Option<Transition> {
        if self.state != State::Ejected {
            return None;
        }
        let t = self.enter(State::Recovering, now, "its own view is recovering");
        self.restarted = true;
        t
    }

    /// The peer announced shutdown: no new work, for good.
    pub(crate) fn drain(&mut self, now: Instant) -> Option<Transition> {
        if self.state == State::Draining {
            return None;
        }
        self.enter(State::Draining, now, "draining")
    }

    fn enter(&mut self, to: State, now: Instant, reason: &'static str) -> Option<Transition> {
        let from = self.state;
        if from == to {
            return None;
        }
        self.state = to;
        self.since = now;
        self.restarted = false;
        self.window_ok = 0;
        self.window_failed = 0;
        match to {
            State::Ejected => self.ejections += 1,
            State::Healthy | State::Recovering => {
                self.consecutive_failures = 0;
                self.consecutive_refusals = 0;
            }
            _ => {}
        }
        Some(Transition { from, to, reason })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> StateParams {
        StateParams::default()
    }

    fn healthy(gated: bool) -> StateMachine {
        let now = Instant::now();
        let mut m = StateMachine::new(now, gated);
        for _ in 0..10 {
            m.on(Event::Success, now, &p());
        }
        assert_eq!(m.state(), State::Healthy);
        m
    }

    async fn advance(secs: u64) -> Instant {
        tokio::time::advance(Duration::from_secs(secs)).await;
        Instant::now()
    }

    #[tokio::test(start_paused = true)]
    async fn parole_graduates_on_successes_or_time_and_starts_with_a_small_cap() {
        let now = Instant::now();
        let m = StateMachine::new(now, false);
        assert_eq!((m.state(), m.cap(now, &p())), (State::Parole, 0.05));
        let _ = healthy(false);
        let mut m = StateMachine::new(Instant::now(), false);
        let later = advance(31).await;
        assert_eq!(m.tick(later, &p()).map(|t| t.to), Some(State::Healthy));
    }

    #[tokio::test(start_paused = true)]
    async fn one_error_never_ejects_a_healthy_agent() {
        let mut m = healthy(false);
        let now = Instant::now();
        assert_eq!(m.on(Event::Failure, now, &p()), None);
        assert_eq!(m.on(Event::Success, now, &p()), None);
        assert_eq!(m.on(Event::Failure, now, &p()), None);
        assert_eq!(m.state(), State::Healthy);
    }

    #[tokio::test(start_paused = true)]
    async fn three_consecutive_failures_put_a_healthy_agent_on_probation() {
        let mut m = healthy(false);
        let now = Instant::now();
        m.on(Event::Failure, now, &p());
        m.on(Event::Failure, now, &p());
        let t = m.on(Event::Failure, now, &p());
        assert_eq!(
            t.map(|t| (t.from, t.to)),
            Some((State::Healthy, State::Probation))
        );
        assert_eq!(m.cap(now, &p()), 0.2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_puts_a_healthy_agent_on_probation_and_a_second_ejects() {
        let mut m = healthy(true);
        let now = Instant::now();
        assert_eq!(
            m.on(Event::ProbeFailed, now, &p()).map(|t| t.to),
            Some(State::Probation)
        );
        assert_eq!(
            m.on(Event::ProbeFailed, now, &p()).map(|t| t.to),
            Some(State::Ejected)
        );
        assert_eq!(m.cap(now, &p()), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_connection_ejects_at_once_and_acceptance_brings_it_back_at_once() {
        let mut m = healthy(true);
        let now = Instant::now();
        let t = m.on(Event::Unreachable, now, &p());
        assert_eq!(
            t.map(|t| t.to),
            Some(State::Ejected),
            "the first refusal is enough"
        );
        assert!(m.is_unreachable());
        // No cool-off, no probe needed: it accepts connections again a moment later.
        let later = now + Duration::from_millis(300);
        assert_eq!(m.tick(later, &p()), None, "it stays out while it refuses");
        let t = m.on(Event::Reachable, later, &p());
        assert_eq!(t.map(|t| t.to), Some(State::Recovering));
        assert!(m.cap(later, &p()) > 0.0);
        // A restart ramps over seconds, not the full ramp: the cause is known and gone.
        let ramped = later + RESTART_RAMP;
        assert_eq!(m.cap(ramped, &p()), 1.0);
        assert_eq!(m.tick(ramped, &p()).map(|t| t.to), Some(State::Healthy));
        // A repeat is not punished with a doubled cool-off.
        assert_eq!(m.cool_off(&p()), p().cool_off);
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_count_as_failures_only_in_a_run() {
        let mut m = healthy(false);
        let now = Instant::now();
        m.on(Event::Refusal, now, &p());
        m.on(Event::Refusal, now, &p());
        m.on(Event::Success, now, &p());
        m.on(Event::Refusal, now, &p());
        m.on(Event::Refusal, now, &p());
        assert_eq!(
            m.state(),
            State::Healthy,
            "two refusals in a row are load, not an outage"
        );
        for _ in 0..3 {
            m.on(Event::Refusal, now, &p());
        }
        assert_eq!(m.state(), State::Probation);
    }

    #[tokio::test(start_paused = true)]
    async fn probation_recovers_after_a_good_window_or_ejects_after_a_bad_one() {
        let mut m = healthy(false);
        let now = Instant::now();
        for _ in 0..3 {
            m.on(Event::Failure, now, &p());
        }
        for _ in 0..10 {
            m.on(Event::Success, now, &p());
        }
        let later = advance(31).await;
        assert_eq!(m.tick(later, &p()).map(|t| t.to), Some(State::Healthy));

        for _ in 0..3 {
            m.on(Event::Failure, later, &p());
        }
        for _ in 0..3 {
            m.on(Event::Success, later, &p());
            m.on(Event::Success, later, &p());
        }
        m.on(Event::Failure, later, &p());
        let end = advance(31).await;
        assert_eq!(
            m.tick(end, &p()).map(|t| t.to),
            Some(State::Ejected),
            "6 of 7 is below 90%"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn probation_ends_early_when_clearly_failing() {
        let mut m = healthy(false);
        let now = Instant::now();
        for _ in 0..3 {
            m.on(Event::Failure, now, &p());
        }
        assert_eq!(m.state(), State::Probation);
        // Alternating, so never two failures in a row, but half of them fail.
        let mut ejected = false;
        for _ in 0..5 {
            m.on(Event::Success, now, &p());
            ejected |= m
                .on(Event::Failure, now, &p())
                .is_some_and(|t| t.to == State::Ejected);
        }
        assert!(
            ejected,
            "a 50% failure rate over enough samples ends probation early"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn ejection_cools_off_then_ramps_back_in() {
        let mut m = healthy(false);
        let now = Instant::now();
        for _ in 0..5 {
            m.on(Event::Failure, now, &p());
        }
        assert_eq!(m.state(), State::Ejected);
        assert_eq!(m.tick(advance(59).await, &p()), None);
        assert_eq!(
            m.tick(advance(1).await, &p()).map(|t| t.to),
            Some(State::Recovering)
        );
        let start = m.cap(Instant::now(), &p());
        let mid = m.cap(advance(15).await, &p());
        assert!((start - 0.05).abs() < 1e-9, "{start}");
        assert!(
            (mid - 0.525).abs() < 1e-6,
            "halfway through the ramp: {mid}"
        );
        assert_eq!(
            m.tick(advance(15).await, &p()).map(|t| t.to),
            Some(State::Healthy)
        );
        assert_eq!(m.cap(Instant::now(), &p()), 1.0);
    }

    #[tokio::test(start_paused = true)]
    async fn repeat_ejections_lengthen_the_cool_off_up_to_a_cap() {
        let mut m = healthy(false);
        let params = p();
        for round in 0..6u32 {
            let now = Instant::now();
            for _ in 0..5 {
                m.on(Event::Failure, now, &params);
            }
            assert_eq!(m.state(), State::Ejected);
            let expected = (params.cool_off * 2u32.pow(round)).min(params.max_cool_off);
            assert_eq!(m.cool_off(&params), expected);
            tokio::time::advance(expected).await;
            m.tick(Instant::now(), &params);
            assert_eq!(m.state(), State::Recovering);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn recovering_falls_back_on_renewed_failures() {
        let mut m = healthy(false);
        let now = Instant::now();
        for _ in 0..5 {
            m.on(Event::Failure, now, &p());
        }
        m.tick(advance(60).await, &p());
        assert_eq!(m.state(), State::Recovering);
        m.on(Event::Failure, Instant::now(), &p());
        let t = m.on(Event::Failure, Instant::now(), &p());
        assert_eq!(t.map(|t| t.to), Some(State::Ejected));
        assert_eq!(m.cool_off(&p()), Duration::from_secs(120));
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_gated_view_leaves_ejection_only_on_a_passing_probe() {
        let mut m = healthy(true);
        let now = Instant::now();
        m.on(Event::ProbeFailed, now, &p());
        m.on(Event::ProbeFailed, now, &p());
        assert_eq!(m.state(), State::Ejected);
        assert_eq!(
            m.tick(advance(120).await, &p()),
            None,
            "the cool-off alone is not enough"
        );
        assert_eq!(
            m.on(Event::ProbePassed, Instant::now(), &p()).map(|t| t.to),
            Some(State::Recovering)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_score_below_the_floor_puts_a_healthy_agent_on_probation() {
        let mut m = healthy(false);
        let t = m.on(Event::LowScore, Instant::now(), &p());
        assert_eq!(
            t.map(|t| (t.to, t.reason)),
            Some((State::Probation, "score below the floor"))
        );
        assert_eq!(
            m.on(Event::LowScore, Instant::now(), &p()),
            None,
            "only from healthy"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn degraded_caps_the_share_without_moving_the_state() {
        let mut m = healthy(true);
        let now = Instant::now();
        let drifted = QualityMark {
            similarity: 0.4,
            degraded: true,
        };
        assert!(m.set_quality(Some(drifted)));
        assert_eq!(
            m.state(),
            State::Healthy,
            "quality alone never moves the state"
        );
        assert_eq!(shown(m.state(), m.quality()), "degraded");
        assert_eq!(m.cap(now, &p()), 0.5);
        // Failures still go to probation as from healthy, and the lower cap wins there.
        assert_eq!(
            m.on(Event::ProbeFailed, now, &p()).map(|t| t.to),
            Some(State::Probation)
        );
        assert_eq!(shown(m.state(), m.quality()), "probation");
        assert_eq!(m.cap(now, &p()), 0.2);
        let mut m = healthy(true);
        m.set_quality(Some(drifted));
        let recovered = QualityMark {
            similarity: 0.95,
            degraded: false,
        };
        assert!(m.set_quality(Some(recovered)), "back above the threshold");
        assert_eq!(
            (shown(m.state(), m.quality()), m.cap(now, &p())),
            ("healthy", 1.0)
        );
        assert!(!m.set_quality(None));
        assert_eq!(QualityMark::match_factor(Some(drifted)), 0.4);
        assert_eq!(QualityMark::match_factor(Some(recovered)), 1.0);
        assert_eq!(QualityMark::match_factor(None), 1.0);
    }

    #[tokio::test(start_paused = true)]
    async fn draining_is_terminal_with_no_traffic() {
        let mut m = healthy(false);
        let now = Instant::now();
        assert_eq!(m.drain(now).map(|t| t.to), Some(State::Draining));
        assert_eq!(m.on(Event::Success, now, &p()), None);
        assert_eq!(m.cap(now, &p()), 0.0);
    }
}
