//! The scenarios and what sets each apart: how long it runs, when its fault comes, which agents
//! it breaks and how, the agents' pools and latencies, the callers and the routers it runs
//! under. The scenarios with measures of their own have a file each (`burst`, `slow_agent`,
//! `equal_pair`, `crash_same_address`, `ramp`, and `half_open` for its relay).

use std::time::Duration;

use crate::{Latency, MockAgent, Mode, Workload, AGENTS, LATENCY, LONG_RUN, QUEUE, SEED, WORKERS};

/// thread-pool-full: the agents' worker pool, and the broken agent's long tasks.
const POOL: usize = 10;
const LONG_SHARE: f64 = 0.3;
const LONG_TASK: Duration = Duration::from_secs(4);
/// crash-restart (and crash-same-address): the pod is back this long after it died.
pub(crate) const RESTART_AFTER: Duration = Duration::from_secs(3);
/// burst and the ramps: a caller whose call failed waits this long (the agents' mean latency)
/// before its next one, so that a refusal keeps its place in the offered load instead of
/// becoming a spin.
pub(crate) const FAIL_PAUSE: Duration = Duration::from_millis(40);

// burst: `burst.rs`
/// How long the callers offer more than the fleet's room (half the run, if shorter).
pub(crate) const BURST: Duration = Duration::from_secs(5);

// crash_same_address: `crash_same_address.rs`
/// The returned agent's share is read over this long from its return.
pub(crate) const RETURN_WINDOW: Duration = Duration::from_secs(10);

// equal_pair: `equal_pair.rs`
/// Both agents' latency, and the one slow sample's.
pub(crate) const PAIR_LATENCY: Latency = Latency {
    min: Duration::from_millis(4),
    max: Duration::from_millis(6),
};
pub(crate) const PAIR_SLOW: Duration = Duration::from_millis(17);

// ramp: `ramp.rs`
/// The weak agent, its pool (and declared `max_concurrency`), the callers at the start, and
/// how many join, one every `Scenario::ramp_every` (over 20 s in a full run).
pub(crate) const RAMP_WEAK: usize = 1;
pub(crate) const RAMP_WEAK_POOL: usize = 2;
pub(crate) const RAMP_FROM: usize = 4;
pub(crate) const RAMP_ADDED: usize = 60;
/// ramp-under: the weak agent's pool, and the callers that join (from `RAMP_FROM`, to 24: under
/// the fleet's 28 slots).
pub(crate) const UNDER_WEAK_POOL: usize = 4;
pub(crate) const UNDER_ADDED: usize = 20;
/// agent-reach without prediction (`estimates.horizon: 0s`).
pub(crate) const REACH_NO_PREDICTION: &str = "agent-reach/h0";
/// ramp-shared: the caller sidecars the callers are spread over (caller `k` calls through
/// sidecar `k mod RAMP_CALLER_SIDECARS`).
pub(crate) const RAMP_CALLER_SIDECARS: usize = 4;

// slow_agent: `slow_agent.rs`
/// The broken agent's latency, 10× the fleet's mean.
pub(crate) const SLOW_AGENT: Duration = Duration::from_millis(400);
/// Its share is read over this long from the slowdown, then to the end of the run.
pub(crate) const SLOW_WINDOW: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Scenario {
    Healthy,
    FakeOnline,
    SlowDependency,
    LockHeld,
    ThreadPoolFull,
    Crash,
    CrashRestart,
    HalfOpen,
    RetryStorm,
    ColdStart,
    Burst,
    Burst3x,
    SlowAgent,
    EqualPair,
    CrashSameAddress,
    Ramp,
    RampShared,
    RampUnder,
}

impl Scenario {
    pub(crate) const ALL: [Scenario; 18] = [
        Scenario::Healthy,
        Scenario::FakeOnline,
        Scenario::SlowDependency,
        Scenario::LockHeld,
        Scenario::ThreadPoolFull,
        Scenario::Crash,
        Scenario::CrashRestart,
        Scenario::HalfOpen,
        Scenario::RetryStorm,
        Scenario::ColdStart,
        Scenario::Burst,
        Scenario::Burst3x,
        Scenario::SlowAgent,
        Scenario::EqualPair,
        Scenario::CrashSameAddress,
        Scenario::Ramp,
        Scenario::RampShared,
        Scenario::RampUnder,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Scenario::Healthy => "healthy",
            Scenario::FakeOnline => "fake-online",
            Scenario::SlowDependency => "slow-dependency",
            Scenario::LockHeld => "lock-held",
            Scenario::ThreadPoolFull => "thread-pool-full",
            Scenario::Crash => "crash",
            Scenario::CrashRestart => "crash-restart",
            Scenario::HalfOpen => "half-open",
            Scenario::RetryStorm => "retry-storm",
            Scenario::ColdStart => "cold-start",
            Scenario::Burst => "burst",
            Scenario::Burst3x => "burst-3x",
            Scenario::SlowAgent => "slow-agent",
            Scenario::EqualPair => "equal-pair",
            Scenario::CrashSameAddress => "crash-same-address",
            Scenario::Ramp => "ramp",
            Scenario::RampShared => "ramp-shared",
            Scenario::RampUnder => "ramp-under",
        }
    }

    /// The agents it breaks.
    pub(crate) fn broken(self) -> &'static [usize] {
        match self {
            Scenario::Healthy
            | Scenario::ColdStart
            | Scenario::Burst
            | Scenario::Burst3x
            | Scenario::EqualPair
            | Scenario::Ramp
            | Scenario::RampShared
            | Scenario::RampUnder => &[],
            Scenario::RetryStorm => &[0, 1],
            _ => &[1],
        }
    }

    /// Whether *bad out after* means anything: a dead agent gets nothing under any router.
    pub(crate) fn measures_out(self) -> bool {
        !self.broken().is_empty()
            && !matches!(
                self,
                Scenario::Crash | Scenario::CrashRestart | Scenario::CrashSameAddress
            )
    }

    /// The agent that (re)joins mid-run, measured for *new at full*.
    pub(crate) fn newcomer(self) -> Option<usize> {
        match self {
            Scenario::ColdStart => Some(AGENTS),
            Scenario::CrashRestart | Scenario::CrashSameAddress => Some(1),
            _ => None,
        }
    }

    /// The agents running from the start.
    pub(crate) fn agents(self) -> usize {
        if self == Scenario::EqualPair {
            2
        } else {
            AGENTS
        }
    }

    /// Agent slots, including the one a cold start fills.
    pub(crate) fn slots(self) -> usize {
        if self == Scenario::ColdStart {
            AGENTS + 1
        } else {
            self.agents()
        }
    }

    pub(crate) fn duration(self, seconds: u64) -> Duration {
        let run = Duration::from_secs(seconds);
        let fault_at = self.fault_at(seconds);
        match self {
            Scenario::CrashRestart
            | Scenario::HalfOpen
            | Scenario::ColdStart
            | Scenario::EqualPair => Duration::from_secs(seconds.max(LONG_RUN)),
            // At least 1.5 s of normal load after the burst.
            Scenario::Burst | Scenario::Burst3x => {
                run.max(fault_at + self.burst_length(seconds) + Duration::from_millis(1500))
            }
            Scenario::SlowAgent => run.max(fault_at + SLOW_WINDOW + Duration::from_secs(2)),
            // A 20 s ramp in a full run; the smoke run's 3 s as they are.
            Scenario::Ramp | Scenario::RampShared | Scenario::RampUnder if seconds >= 10 => {
                run.max(fault_at + Duration::from_secs(21))
            }
            Scenario::CrashSameAddress => {
                run.max(fault_at + RESTART_AFTER + RETURN_WINDOW + Duration::from_secs(1))
            }
            _ => run,
        }
    }

    /// When the fault comes: a quarter of the way in; in equal-pair (the slow sample), half way,
    /// on a window's edge.
    pub(crate) fn fault_at(self, seconds: u64) -> Duration {
        if self == Scenario::EqualPair {
            Duration::from_secs(seconds.max(LONG_RUN)) / 2
        } else {
            Duration::from_secs(seconds) / 4
        }
    }

    /// burst: the load offered, as a multiple of the fleet's room.
    pub(crate) fn burst(self) -> Option<f64> {
        match self {
            Scenario::Burst => Some(1.5),
            Scenario::Burst3x => Some(3.0),
            _ => None,
        }
    }

    /// burst: how long the load is offered, from the fault.
    pub(crate) fn burst_length(self, seconds: u64) -> Duration {
        BURST.min(Duration::from_secs(seconds) / 2)
    }

    /// Calls agent-reach's sidecars take at once, queued included.
    pub(crate) fn room(self) -> usize {
        self.agents() * (self.max_concurrency() + QUEUE)
    }

    /// The fleet's capacity in calls a second: every agent's pool busy at the mean latency.
    pub(crate) fn capacity(self) -> f64 {
        let mean = (LATENCY.min + LATENCY.max).as_secs_f64() / 2.0;
        (self.agents() * self.max_concurrency()) as f64 / mean
    }

    /// Callers in a closed loop for the whole run.
    pub(crate) fn workers(self) -> usize {
        match self {
            Scenario::EqualPair => 1,
            Scenario::Ramp | Scenario::RampShared | Scenario::RampUnder => RAMP_FROM,
            _ => WORKERS,
        }
    }

    /// Whether demand ramps onto a fleet with one weaker agent (ramp, ramp-shared).
    pub(crate) fn ramps(self) -> bool {
        matches!(
            self,
            Scenario::Ramp | Scenario::RampShared | Scenario::RampUnder
        )
    }

    /// The caller sidecars agent-reach's callers are spread over; the first is the gossip seed.
    pub(crate) fn caller_sidecars(self) -> usize {
        if matches!(self, Scenario::RampShared | Scenario::RampUnder) {
            RAMP_CALLER_SIDECARS
        } else {
            1
        }
    }

    /// ramp: how often one more caller joins, from the fault to a second before the end.
    pub(crate) fn ramp_every(self, seconds: u64) -> Option<Duration> {
        self.ramps().then(|| {
            let span = self
                .duration(seconds)
                .saturating_sub(self.fault_at(seconds) + Duration::from_secs(1));
            span / self.ramp_added() as u32
        })
    }

    /// ramp: the callers that join during the ramp.
    pub(crate) fn ramp_added(self) -> usize {
        if self == Scenario::RampUnder {
            UNDER_ADDED
        } else {
            RAMP_ADDED
        }
    }

    /// ramp: the weak agent's pool (and declared `max_concurrency`).
    pub(crate) fn weak_pool(self) -> usize {
        if self == Scenario::RampUnder {
            UNDER_WEAK_POOL
        } else {
            RAMP_WEAK_POOL
        }
    }

    /// The routers it runs under: ramp compares agent-reach with and without prediction.
    pub(crate) fn routers<'a>(self, all: &[&'a str]) -> Vec<&'a str> {
        if self.ramps() {
            vec!["agent-reach", REACH_NO_PREDICTION]
        } else {
            all.to_vec()
        }
    }

    /// Callers that join only during the burst, so that all together offer its load.
    pub(crate) fn burst_workers(self) -> usize {
        self.burst().map_or(0, |factor| {
            ((factor * self.room() as f64).ceil() as usize).saturating_sub(self.workers())
        })
    }

    /// How long a caller waits after a failed call before its next one.
    pub(crate) fn fail_pause(self) -> Duration {
        if self.burst().is_some() || self.ramps() {
            FAIL_PAUSE
        } else {
            Duration::ZERO
        }
    }

    /// Whether agent-reach's sidecars declare a business probe. crash-same-address has none:
    /// the agent that comes back must be found without one.
    pub(crate) fn probe(self) -> bool {
        self != Scenario::CrashSameAddress
    }

    /// Whether p95 compares with the healthy run's (equal-pair's agents are faster).
    pub(crate) fn compares_healthy(self) -> bool {
        self != Scenario::EqualPair
    }

    pub(crate) fn latency(self) -> Latency {
        if self == Scenario::EqualPair {
            PAIR_LATENCY
        } else {
            LATENCY
        }
    }

    /// What `Mode::Slow` costs a call.
    pub(crate) fn slow_latency(self) -> Duration {
        match self {
            Scenario::SlowAgent => SLOW_AGENT,
            Scenario::EqualPair => PAIR_SLOW,
            _ => Duration::from_secs(2),
        }
    }

    pub(crate) fn workload(self, agent: usize) -> Workload {
        Workload {
            pool: match self {
                Scenario::ThreadPoolFull => Some(POOL),
                Scenario::Burst | Scenario::Burst3x => Some(self.max_concurrency()),
                Scenario::Ramp | Scenario::RampShared | Scenario::RampUnder => {
                    Some(self.max_concurrency_of(agent))
                }
                _ => None,
            },
            seed: Some(SEED + agent as u64),
            long_share: LONG_SHARE,
            long_latency: LONG_TASK,
        }
    }

    /// The `max_concurrency` agent-reach's sidecars declare for their agents.
    pub(crate) fn max_concurrency(self) -> usize {
        if self == Scenario::ThreadPoolFull {
            POOL
        } else {
            8
        }
    }

    /// …and for the agent in `slot` (ramp's weak agent declares its smaller pool).
    pub(crate) fn max_concurrency_of(self, slot: usize) -> usize {
        if self.ramps() && slot == RAMP_WEAK {
            self.weak_pool()
        } else {
            self.max_concurrency()
        }
    }

    /// Breaks a running agent in place (the scenarios that change membership or the network
    /// are handled by the run loop).
    pub(crate) fn breaks(self, agent: &MockAgent) {
        match self {
            Scenario::FakeOnline | Scenario::RetryStorm => agent.set_mode(Mode::RateLimited),
            Scenario::SlowDependency | Scenario::SlowAgent => agent.set_mode(Mode::Slow),
            Scenario::LockHeld => agent.set_mode(Mode::Locked),
            Scenario::ThreadPoolFull => agent.set_mode(Mode::LongTasks),
            Scenario::Crash => agent.kill(),
            Scenario::Healthy
            | Scenario::CrashRestart
            | Scenario::HalfOpen
            | Scenario::ColdStart
            | Scenario::Burst
            | Scenario::Burst3x
            | Scenario::EqualPair
            | Scenario::CrashSameAddress
            | Scenario::Ramp
            | Scenario::RampShared
            | Scenario::RampUnder => {}
        }
    }
}
