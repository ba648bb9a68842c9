//! The seeds' failure modes, replayed through the routers people use today and through
//! agent-reach. Each scenario runs a fresh fleet of four mock agents (20–60 ms, each with its own
//! fixed seed for its random draws) on loopback, drives `code-review` calls from 16 workers (each
//! giving up after 10 s; the number of workers is the scenario's: one in equal-pair, up to 288
//! during a burst) through one router, and breaks one agent (or two) a quarter of the way in.
//! Never asserts on time.
//!
//! Scenarios: **healthy**; **fake-online** (business calls get 429, `/healthz` 200);
//! **slow-dependency** (every call takes 2 s); **lock-held** (one call at a time);
//! **thread-pool-full** (every agent has a pool of 10 workers, excess calls wait in the agent's
//! own queue; at the break 30 % of the broken agent's calls take 4 s, so the pool fills and the
//! short ones queue behind them); **crash** (the agent process dies, its sidecar stays);
//! **crash-restart** (the whole pod dies, and 3 s later comes back at a new port);
//! **half-open** (a TCP relay on the path to one agent stops forwarding bytes both ways, on
//! pooled connections and new ones alike, without closing anything: routers see timeouts, not
//! errors); **retry-storm** (two agents go fake-online at once); **cold-start** (a fifth agent
//! joins the loaded fleet). crash-restart, half-open and cold-start run at least 60 s, so that a
//! slow ramp, or health checks at 10 s intervals, can act inside the run.
//!
//! Then the everyday faults of issue 13, each with its own measures, printed in a small table
//! of its own after the main one:
//!
//! - **burst** and **burst-3x**: every agent has a pool of 8 (its own queue holds the excess)
//!   and agent-reach's sidecars declare `max_concurrency` 8 and a queue of 16: the fleet's
//!   *room* is 4 × 24 = 96 calls, its *capacity* 4 × 8 ÷ 40 ms = 800 calls/s. For 5 s from the
//!   fault (half the run, if that is shorter) more callers join, so that 1.5× (144) or 3× (288)
//!   the room call at once; then the 16 go on alone, at least 1.5 s. In both burst scenarios a
//!   caller whose call failed waits 40 ms (one mean call) before its next, so that a refusal
//!   holds its place in the offered load instead of turning into a spin. Measures: *served/cap*,
//!   the successful calls that ended during the burst ÷ what the capacity serves in as long
//!   (goal ≥ 90 %); *left rot.*, the agents out of rotation from the burst on — for agent-reach
//!   by the caller's `/status` (any peer in probation or ejected, by the caller's view, the
//!   peer's own or the effective state), for the others by the traffic (an agent that got no
//!   call for a whole second); failed calls among those made in the first second after the
//!   burst (goal 0) and among all made after it. The static routers have no admission limit:
//!   their excess waits in the agents' queues.
//! - **slow-agent**: one agent goes from 20–60 ms to 400 ms (10× the mean), no errors. Its
//!   share of the calls that reached agents over the 5 s from the slowdown (goal ≤ 5 %) and
//!   after; the p95 of the calls made after the slowdown against the p95 of those made before
//!   it, in the same run (goal ≤ 1.25×); failed calls made after it (goal 0).
//! - **equal-pair**: two identical agents (4–6 ms, seeded), *one* caller making one call at a
//!   time for 60 s; half way, exactly one call (whichever agent gets it) takes 17 ms: both
//!   agents are slow until one business call reaches either, then normal again. Agent A's
//!   lowest and highest share over each 10 s window, before the slow call and after it (goal:
//!   35–65 % in every window).
//! - **crash-same-address**: like crash (the agent process dies, its sidecar stays, the fleet
//!   found by gossip), but agent-reach's sidecars declare no business probe, and 3 s later the
//!   agent is back on the same port; nobody is told. Failed calls among those in flight at the
//!   kill (these may fail), made after it until the return (goal 0) and made from the return on
//!   (the ramp, goal 0); the returned agent's share of the calls that reached agents in the
//!   10 s from its return (goal ≥ 15 %). Runs at least 17 s.
//!
//! lock-held (above) is the issue's fifth: its p95 against the healthy run's (goal ≤ 1.3×).
//!
//! And issue 19's predicted saturation:
//!
//! - **ramp**: one agent is weaker (a pool of 2, and its sidecar declares `max_concurrency` 2;
//!   the other three have 8), the fleet starts with 4 callers and from a quarter of the way in
//!   gains one more every `RAMP_EVERY` (closed loop, a caller waits 40 ms after a failed call)
//!   up to 64. agent-reach only, twice: with prediction (`estimates.horizon: 10s`, the default)
//!   and without (`agent-reach/h0`: `0s`). Measures: attempts refused as saturated (429, or 503
//!   `saturated`) counted at the caller's sidecar (every peer) and at the weak agent's sidecar,
//!   the weak agent's share of the calls that reached agents during the ramp, the p95 and the
//!   failed calls.
//! - **ramp-shared**: ramp with its callers spread over 4 caller sidecars (caller `k` calls
//!   through sidecar `k mod 4`: one each at the start, 16 each at the end), each a real sidecar
//!   that finds the fleet by gossip. ramp's one caller sidecar counts its own calls in flight to
//!   each peer exactly and at once, so a peer's prediction tells it nothing new; here each caller
//!   sidecar learns of the other three's load on the weak agent only from the agent's gossiped
//!   view, which is where a published trend could help. Same measures; refusals at the callers
//!   are summed over the four. Measured (`cargo bench --bench scenarios -- --only ramp-shared`,
//!   four full runs each way, 2-core machine shared with other builds): with prediction refused
//!   126/271/136/235 at the callers, 12/28/16/20 at the weak agent, weak share 6.7–8.0 %, p95
//!   130–135 ms; without, 191/226/127/159, 17/16/19/11, 7.1–7.9 %, 128–136 ms; no failed call.
//!   No difference beyond the run-to-run spread. Why (`--diag`): the weak agent's saturation is
//!   0, 0.5 or 1 (whole calls over a pool of 2) and its published prediction never once rose
//!   above it (the others' ran at most 0.09 ahead); from half way the 64 callers offer more than
//!   the fleet's 26 slots, every agent reads 1.0 now and predicted (a full pool is 1.0 whatever
//!   its queue), so nothing is left to rank by (docs/reach-model.md, "Predicted saturation").
//! - **ramp-under**: ramp-shared with a ramp that stays under the fleet's slots, so that the
//!   ranking has room to act on: the weak agent has a pool of 4 (its saturation moves in
//!   quarters), 4 callers and 20 more (24 in all, against 28 slots). Measured (`cargo bench
//!   --bench scenarios -- --only ramp-under`, three runs each way): no refusal either way; with
//!   prediction p95 68.5/68.1/72.0 ms and weak share 14.7–16.9 %, without 73.8/71.9/71.1 ms and
//!   15.7–16.6 %. Under capacity the callers' own counts and the gossiped saturation already keep
//!   the weak agent at about its share of the slots (4 of 28: 14 %), so the prediction has
//!   nothing left to prevent: its benefit is still not shown by a benchmark here.
//!
//! Per scenario and router it prints the task failure rate, mean and p95 latency, p95 against the
//! same router's healthy run (the goal is ≤ 1.3×), *bad out after* (from the fault to the end of
//! the first half second in which the broken agent got under 5 % of a fair share of the calls
//! that reached agents; in half-open, what counts for it is the calls sent into its broken path;
//! a half second in which callers are so stuck that the agents get under a tenth of their usual
//! calls says nothing either way), the retry storm's busiest survivor against its fair share,
//! and for cold-start and crash-restart *new at full* (from the new agent's start to the end of
//! the first 1 s window in which it got at least 90 % of a fair share of the calls that reached
//! agents) with *join fails* (calls that failed from its start to the end of the run).
//!
//! Routers: **agent-reach** (a sidecar per agent with a business probe, default policy,
//! `max_concurrency` 8 — 10 in thread-pool-full, the agents' pool size, as an operator would
//! declare it; the fleet finds itself by gossip through the caller's sidecar, the seed, as in
//! production, and a restarted or new agent's sidecar joins the same way); **baseline**
//! (round-robin over a static list, `/healthz` every 10 s, one immediate retry: what the seeds
//! started from); **haproxy** (`/healthz` checks, `observe layer7`, `retry-on` with redispatch);
//! **envoy** (active `/healthz` checks, outlier detection, retries on another host with a retry
//! budget, slow start; `no_traffic_interval` is set to the 10 s check interval, or a host that
//! has never served — the cold start's newcomer — would be checked only every 60 s). In
//! half-open the relay sits where the network does: between the caller's sidecar and the broken
//! agent's sidecar (which advertises the relay's address, 127.0.0.2, by gossip), and between the
//! router and the agent for the others, so their health checks cross it too.
//!
//! Membership for the static routers: in cold-start the fifth endpoint is listed from the start
//! at a reserved port that begins listening at the join (their health checks find it). In
//! crash-restart the baseline's static list cannot learn the new address: its row says `static`,
//! and the fleet runs on three agents from then on. HAProxy and Envoy get what a Kubernetes
//! operator would give them instead of DNS: the new address is pushed the instant the new agent
//! listens (an ideal control plane, kinder than any real one) — HAProxy through its runtime API
//! (`set server b/a1 addr`), Envoy through file-based EDS; their health checks and Envoy's slow
//! start then apply.
//!
//! Read with care: the 16 callers are a closed loop. A caller stuck on a slow or silent agent
//! makes no new calls, so a stall shows as fewer *calls* (and a higher mean) more than as
//! failures or p95: compare calls with the healthy run's (thread-pool-full and half-open above
//! all).
//!
//! Run: `cargo bench --bench scenarios` (`-- --seconds 30`, `-- --only fake-online,cold-start`,
//! `-- --routers agent-reach,envoy`, `-- --smoke`: healthy, fake-online, thread-pool-full and
//! burst, 3 s each, burst's burst 1.5 s; the newer scenarios alone: `-- --only
//! burst,burst-3x,slow-agent,equal-pair,crash-same-address,lock-held`; predicted saturation:
//! `-- --only ramp,ramp-shared,ramp-under`, in the smoke run too). `-- --diag DIR` writes, for each agent-reach run, the caller's view of every peer
//! each half second and its final `/status`; `-- --decision-log` turns on the policy's decision
//! log (printed with `RUST_LOG`, e.g. `RUST_LOG=agent_reach::decision=info`).

#[path = "common/mod.rs"]
mod common;

// The binary's mock agent (src/bin/agent-reach/mock_agent), included by path: it is not part of
// the library.
#[path = "../src/bin/agent-reach/mock_agent/mod.rs"]
#[allow(dead_code, unreachable_pub, unused_imports)]
mod mock_agent;

use std::collections::HashMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_reach::config::{yaml, ConfigPaths, ConfigStore, Policy};
use agent_reach::{Bootstrap, Sidecar};
use bytes::Bytes;
use common::{free_port, write, Tools};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mock_agent::{Latency, MockAgent, MockConfig, Mode, Workload};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const AGENTS: usize = 4;
const WORKERS: usize = 16;
const CAP: &str = "code-review";
/// Agent `i` draws its latencies (and long tasks) from a generator seeded with `SEED + i`.
const SEED: u64 = 0x5eed_0006;
/// What each worker waits for one call before counting it failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// thread-pool-full: the agents' worker pool, and the broken agent's long tasks.
const POOL: usize = 10;
const LONG_SHARE: f64 = 0.3;
const LONG_TASK: Duration = Duration::from_secs(4);
/// crash-restart: the pod is back, at a new port, this long after it died.
const RESTART_AFTER: Duration = Duration::from_secs(3);
/// crash-restart and cold-start run at least this long, so that a slow ramp ends inside the run.
const LONG_RUN: u64 = 60;
/// A new agent is at full traffic at this fraction of a fair share, over one second.
const FULL_SHARE: f64 = 0.9;
/// The address a half-open agent's sidecar advertises (the relay listens there).
const RELAY_IP: [u8; 4] = [127, 0, 0, 2];
/// The agents' latency, uniform over this range (mean 40 ms), in every scenario but equal-pair.
const LATENCY: Latency = Latency {
    min: Duration::from_millis(20),
    max: Duration::from_millis(60),
};
/// What an agent-reach sidecar queues beyond its `max_concurrency` (up to 1 s each); in burst,
/// the fleet's room is `AGENTS × (max_concurrency + QUEUE)`.
const QUEUE: usize = 16;
/// burst: how long the callers offer more than the fleet's room (half the run, if shorter).
const BURST: Duration = Duration::from_secs(5);
/// burst: a caller whose call failed waits this long (the agents' mean latency) before its
/// next one, so that a refusal keeps its place in the offered load instead of becoming a spin.
const FAIL_PAUSE: Duration = Duration::from_millis(40);
/// slow-agent: the broken agent's latency, 10× the fleet's mean.
const SLOW_AGENT: Duration = Duration::from_millis(400);
/// slow-agent: its share is read over this long from the slowdown, then to the end of the run.
const SLOW_WINDOW: Duration = Duration::from_secs(5);
/// equal-pair: both agents' latency, and the one slow sample's.
const PAIR_LATENCY: Latency = Latency {
    min: Duration::from_millis(4),
    max: Duration::from_millis(6),
};
const PAIR_SLOW: Duration = Duration::from_millis(17);
/// equal-pair: agent A's share is read over each window of this length.
const PAIR_WINDOW: Duration = Duration::from_secs(10);
/// crash-same-address: the returned agent's share is read over this long from its return.
const RETURN_WINDOW: Duration = Duration::from_secs(10);
/// ramp: the weak agent, its pool (and declared `max_concurrency`), the callers at the start,
/// and how many join, one every `RAMP_EVERY` (over 20 s in a full run).
const RAMP_WEAK: usize = 1;
const RAMP_WEAK_POOL: usize = 2;
const RAMP_FROM: usize = 4;
const RAMP_ADDED: usize = 60;
/// ramp-under: the weak agent's pool, and the callers that join (from `RAMP_FROM`, to 24: under
/// the fleet's 28 slots).
const UNDER_WEAK_POOL: usize = 4;
const UNDER_ADDED: usize = 20;
/// ramp: agent-reach without prediction (`estimates.horizon: 0s`).
const REACH_NO_PREDICTION: &str = "agent-reach/h0";
/// ramp-shared: the caller sidecars the callers are spread over (caller `k` calls through
/// sidecar `k mod RAMP_CALLER_SIDECARS`).
const RAMP_CALLER_SIDECARS: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Scenario {
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
    const ALL: [Scenario; 18] = [
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

    fn name(self) -> &'static str {
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
    fn broken(self) -> &'static [usize] {
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
    fn measures_out(self) -> bool {
        !self.broken().is_empty()
            && !matches!(
                self,
                Scenario::Crash | Scenario::CrashRestart | Scenario::CrashSameAddress
            )
    }

    /// The agent that (re)joins mid-run, measured for *new at full*.
    fn newcomer(self) -> Option<usize> {
        match self {
            Scenario::ColdStart => Some(AGENTS),
            Scenario::CrashRestart | Scenario::CrashSameAddress => Some(1),
            _ => None,
        }
    }

    /// The agents running from the start.
    fn agents(self) -> usize {
        if self == Scenario::EqualPair {
            2
        } else {
            AGENTS
        }
    }

    /// Agent slots, including the one a cold start fills.
    fn slots(self) -> usize {
        if self == Scenario::ColdStart {
            AGENTS + 1
        } else {
            self.agents()
        }
    }

    fn duration(self, seconds: u64) -> Duration {
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
    fn fault_at(self, seconds: u64) -> Duration {
        if self == Scenario::EqualPair {
            Duration::from_secs(seconds.max(LONG_RUN)) / 2
        } else {
            Duration::from_secs(seconds) / 4
        }
    }

    /// burst: the load offered, as a multiple of the fleet's room.
    fn burst(self) -> Option<f64> {
        match self {
            Scenario::Burst => Some(1.5),
            Scenario::Burst3x => Some(3.0),
            _ => None,
        }
    }

    /// burst: how long the load is offered, from the fault.
    fn burst_length(self, seconds: u64) -> Duration {
        BURST.min(Duration::from_secs(seconds) / 2)
    }

    /// Calls agent-reach's sidecars take at once, queued included.
    fn room(self) -> usize {
        self.agents() * (self.max_concurrency() + QUEUE)
    }

    /// The fleet's capacity in calls a second: every agent's pool busy at the mean latency.
    fn capacity(self) -> f64 {
        let mean = (LATENCY.min + LATENCY.max).as_secs_f64() / 2.0;
        (self.agents() * self.max_concurrency()) as f64 / mean
    }

    /// Callers in a closed loop for the whole run.
    fn workers(self) -> usize {
        match self {
            Scenario::EqualPair => 1,
            Scenario::Ramp | Scenario::RampShared | Scenario::RampUnder => RAMP_FROM,
            _ => WORKERS,
        }
    }

    /// Whether demand ramps onto a fleet with one weaker agent (ramp, ramp-shared).
    fn ramps(self) -> bool {
        matches!(
            self,
            Scenario::Ramp | Scenario::RampShared | Scenario::RampUnder
        )
    }

    /// The caller sidecars agent-reach's callers are spread over; the first is the gossip seed.
    fn caller_sidecars(self) -> usize {
        if matches!(self, Scenario::RampShared | Scenario::RampUnder) {
            RAMP_CALLER_SIDECARS
        } else {
            1
        }
    }

    /// ramp: how often one more caller joins, from the fault to a second before the end.
    fn ramp_every(self, seconds: u64) -> Option<Duration> {
        self.ramps().then(|| {
            let span = self
                .duration(seconds)
                .saturating_sub(self.fault_at(seconds) + Duration::from_secs(1));
            span / self.ramp_added() as u32
        })
    }

    /// ramp: the callers that join during the ramp.
    fn ramp_added(self) -> usize {
        if self == Scenario::RampUnder {
            UNDER_ADDED
        } else {
            RAMP_ADDED
        }
    }

    /// ramp: the weak agent's pool (and declared `max_concurrency`).
    fn weak_pool(self) -> usize {
        if self == Scenario::RampUnder {
            UNDER_WEAK_POOL
        } else {
            RAMP_WEAK_POOL
        }
    }

    /// The routers it runs under: ramp compares agent-reach with and without prediction.
    fn routers<'a>(self, all: &[&'a str]) -> Vec<&'a str> {
        if self.ramps() {
            vec!["agent-reach", REACH_NO_PREDICTION]
        } else {
            all.to_vec()
        }
    }

    /// Callers that join only during the burst, so that all together offer its load.
    fn burst_workers(self) -> usize {
        self.burst().map_or(0, |factor| {
            ((factor * self.room() as f64).ceil() as usize).saturating_sub(self.workers())
        })
    }

    /// How long a caller waits after a failed call before its next one.
    fn fail_pause(self) -> Duration {
        if self.burst().is_some() || self.ramps() {
            FAIL_PAUSE
        } else {
            Duration::ZERO
        }
    }

    /// Whether agent-reach's sidecars declare a business probe. crash-same-address has none:
    /// the agent that comes back must be found without one.
    fn probe(self) -> bool {
        self != Scenario::CrashSameAddress
    }

    /// Whether p95 compares with the healthy run's (equal-pair's agents are faster).
    fn compares_healthy(self) -> bool {
        self != Scenario::EqualPair
    }

    fn latency(self) -> Latency {
        if self == Scenario::EqualPair {
            PAIR_LATENCY
        } else {
            LATENCY
        }
    }

    /// What `Mode::Slow` costs a call.
    fn slow_latency(self) -> Duration {
        match self {
            Scenario::SlowAgent => SLOW_AGENT,
            Scenario::EqualPair => PAIR_SLOW,
            _ => Duration::from_secs(2),
        }
    }

    fn workload(self, agent: usize) -> Workload {
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
    fn max_concurrency(self) -> usize {
        if self == Scenario::ThreadPoolFull {
            POOL
        } else {
            8
        }
    }

    /// …and for the agent in `slot` (ramp's weak agent declares its smaller pool).
    fn max_concurrency_of(self, slot: usize) -> usize {
        if self.ramps() && slot == RAMP_WEAK {
            self.weak_pool()
        } else {
            self.max_concurrency()
        }
    }

    /// Breaks a running agent in place (the scenarios that change membership or the network
    /// are handled by the run loop).
    fn breaks(self, agent: &MockAgent) {
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

/// Switches that change how a run is observed, not what it measures.
#[derive(Clone, Debug, Default)]
struct Options {
    diag: Option<PathBuf>,
    decision_log: bool,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke") || !args.iter().any(|a| a == "--bench");
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let seconds: u64 = arg("--seconds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(if smoke { 3 } else { 20 });
    let only: Option<Vec<String>> =
        arg("--only").map(|o| o.split(',').map(|s| s.trim().to_owned()).collect());
    let routers_wanted: Option<Vec<String>> =
        arg("--routers").map(|o| o.split(',').map(|s| s.trim().to_owned()).collect());
    let options = Options {
        diag: arg("--diag").map(PathBuf::from),
        decision_log: args.iter().any(|a| a == "--decision-log"),
    };
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    if let Some(d) = &options.diag {
        let _ = std::fs::create_dir_all(d);
    }
    let tools = Tools::find();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("cannot start a runtime: {err}");
            if smoke {
                std::process::exit(1);
            }
            return;
        }
    };
    let dir = std::env::temp_dir().join(format!("agent-reach-scenarios-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let routers: Vec<&str> = ["agent-reach", "baseline", "haproxy", "envoy"]
        .into_iter()
        .filter(|r| match *r {
            "haproxy" => tools.haproxy.is_some(),
            "envoy" => tools.envoy.is_some(),
            _ => true,
        })
        .filter(|r| {
            routers_wanted
                .as_ref()
                .is_none_or(|w| w.iter().any(|n| n == r))
        })
        .collect();
    println!(
        "failure scenarios: {AGENTS} mock agents (20–60 ms), {WORKERS} concurrent callers, {seconds} s per run \
         ({} s for crash-restart, half-open and cold-start), fault at {:.1} s\n",
        seconds.max(LONG_RUN),
        seconds as f64 / 4.0
    );
    println!(
        "{:<18} {:<12} {:>6} {:>8} {:>8} {:>8} {:>7} {:>9} {:>9} {:>10} {:>6}",
        "scenario",
        "router",
        "calls",
        "failed %",
        "mean ms",
        "p95 ms",
        "p95/hl",
        "bad out",
        "peak/fair",
        "new full",
        "j.fail"
    );
    let started = Instant::now();
    let mut healthy_p95: HashMap<&str, f64> = HashMap::new();
    let mut reach_failed = false;
    let mut extras: Vec<(Scenario, &str, Extra)> = Vec::new();
    for scenario in Scenario::ALL {
        if only
            .as_ref()
            .is_some_and(|o| !o.iter().any(|n| n == scenario.name()))
        {
            continue;
        }
        if smoke
            && !matches!(
                scenario,
                Scenario::Healthy
                    | Scenario::FakeOnline
                    | Scenario::ThreadPoolFull
                    | Scenario::Burst
                    | Scenario::Ramp
                    | Scenario::RampShared
                    | Scenario::RampUnder
            )
        {
            continue;
        }
        for router in &scenario.routers(&routers) {
            let result = runtime.block_on(run(scenario, router, &tools, &dir, seconds, &options));
            match result {
                Ok(r) => {
                    if scenario == Scenario::Healthy {
                        healthy_p95.insert(router, r.p95_ms);
                    }
                    println!("{}", row(scenario, router, &r, healthy_p95.get(router)));
                    if let Some(extra) = r.extra {
                        extras.push((scenario, router, extra));
                    }
                }
                Err(err) => {
                    println!("{:<18} {:<12} cannot run: {err}", scenario.name(), router);
                    reach_failed |= *router == "agent-reach";
                }
            }
            let _ = std::io::stdout().flush();
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "\np95/hl: p95 ÷ the same router's healthy p95. bad out: from the fault until the broken agent \
         gets under 5 % of a fair share.\nnew full: from the newcomer's start to its first second at \
         ≥ 90 % of a fair share; j.fail: calls failed from then on; static: a static list cannot \
         learn a new address."
    );
    print_extras(&extras, seconds);
    println!(
        "\ntook {:.0} s; reproduce: cargo bench --bench scenarios{}{}",
        started.elapsed().as_secs_f64(),
        if smoke {
            " -- --smoke".to_owned()
        } else {
            format!(" -- --seconds {seconds}")
        },
        only.map_or(String::new(), |o| format!(" --only {}", o.join(",")))
    );
    if smoke && reach_failed {
        std::process::exit(1);
    }
}

/// The measures of the newer scenarios: a small table for each.
fn print_extras(extras: &[(Scenario, &str, Extra)], seconds: u64) {
    let pct = |s: Option<f64>| s.map_or("-".to_owned(), |s| format!("{:.1}%", 100.0 * s));
    let span = |r: Option<(f64, f64)>| {
        r.map_or("-".to_owned(), |(lo, hi)| {
            format!("{:.0}–{:.0}%", 100.0 * lo, 100.0 * hi)
        })
    };
    let burst: Vec<_> = extras
        .iter()
        .filter(|e| matches!(e.2, Extra::Burst { .. }))
        .collect();
    if !burst.is_empty() {
        let s = Scenario::Burst;
        println!(
            "\nburst: {:.1} s at 1.5× (burst) or 3× (burst-3x) the fleet's room of {} calls ({} agents × \
             (max_concurrency {} + queue {})), then normal load;\ncapacity {:.0} calls/s ({} agents × a pool \
             of {} ÷ {} ms mean latency); a caller waits {} ms after a failed call",
            s.burst_length(seconds).as_secs_f64(),
            s.room(),
            s.agents(),
            s.max_concurrency(),
            QUEUE,
            s.capacity(),
            s.agents(),
            s.max_concurrency(),
            (LATENCY.min + LATENCY.max).as_millis() / 2,
            FAIL_PAUSE.as_millis()
        );
        println!(
            "{:<18} {:<12} {:>7} {:>10} {:>11} {:>9} {:>10}",
            "scenario", "router", "callers", "served/cap", "left rot.", "fail ≤1s", "fail after"
        );
        for (scenario, router, extra) in burst {
            if let Extra::Burst {
                callers,
                served_pct,
                left,
                failed_1s,
                failed_after,
            } = extra
            {
                println!(
                    "{:<18} {:<12} {:>7} {:>9.1}% {:>11} {:>9} {:>10}",
                    scenario.name(),
                    router,
                    callers,
                    served_pct,
                    left,
                    failed_1s,
                    failed_after
                );
            }
        }
        println!(
            "served/cap: successful calls that ended during the burst ÷ what the fleet's capacity serves in as \
             long (goal ≥ 90 %). left rot.: agents out of rotation\nfrom the burst on, by the caller's /status for \
             agent-reach (prob.: probation, ej.: ejected), by the traffic for the others (tr.: no call for a whole \
             second).\nfail ≤1s: failed calls among those made in the first second after the burst (goal 0); \
             fail after: among all made after it."
        );
    }
    let slow: Vec<_> = extras
        .iter()
        .filter(|e| matches!(e.2, Extra::SlowAgent { .. }))
        .collect();
    if !slow.is_empty() {
        println!(
            "\nslow-agent: one of four agents goes from 20–60 ms to {} ms",
            SLOW_AGENT.as_millis()
        );
        println!(
            "{:<18} {:<12} {:>9} {:>9} {:>10} {:>9} {:>7} {:>8}",
            "scenario",
            "router",
            "share 5s",
            "share >5s",
            "p95 before",
            "p95 after",
            "ratio",
            "failed"
        );
        for (scenario, router, extra) in slow {
            if let Extra::SlowAgent {
                share_first,
                share_later,
                p95_before,
                p95_after,
                failed_after,
            } = extra
            {
                let ratio = if *p95_before > 0.0 {
                    format!("{:.2}x", p95_after / p95_before)
                } else {
                    "-".to_owned()
                };
                println!(
                    "{:<18} {:<12} {:>9} {:>9} {:>10.1} {:>9.1} {:>7} {:>8}",
                    scenario.name(),
                    router,
                    pct(*share_first),
                    pct(*share_later),
                    p95_before,
                    p95_after,
                    ratio,
                    failed_after
                );
            }
        }
        println!(
            "share 5s: the slow agent's share of the calls that reached agents in the 5 s from the slowdown \
             (goal ≤ 5 %); share >5s: after them.\np95 of the calls made before / after the slowdown, and \
             ratio (goal ≤ 1.25×); failed: calls made after the slowdown that failed (goal 0)."
        );
    }
    let pair: Vec<_> = extras
        .iter()
        .filter(|e| matches!(e.2, Extra::EqualPair { .. }))
        .collect();
    if !pair.is_empty() {
        println!(
            "\nequal-pair: two agents at {}–{} ms, one caller, one call at a time; one call of {} ms half way",
            PAIR_LATENCY.min.as_millis(),
            PAIR_LATENCY.max.as_millis(),
            PAIR_SLOW.as_millis()
        );
        println!(
            "{:<18} {:<12} {:>14} {:>14}",
            "scenario", "router", "A before", "A after"
        );
        for (scenario, router, extra) in pair {
            if let Extra::EqualPair { before, after } = extra {
                println!(
                    "{:<18} {:<12} {:>14} {:>14}",
                    scenario.name(),
                    router,
                    span(*before),
                    span(*after)
                );
            }
        }
        println!(
            "agent A's lowest–highest share over each {} s window, before and after the slow call (goal: \
             35–65 % in every window).",
            PAIR_WINDOW.as_secs()
        );
    }
    let crash: Vec<_> = extras
        .iter()
        .filter(|e| matches!(e.2, Extra::CrashSameAddress { .. }))
        .collect();
    if !crash.is_empty() {
        println!(
            "\ncrash-same-address: the agent dies, its sidecar stays (no business probe); {} s later it is back on its port",
            RESTART_AFTER.as_secs()
        );
        println!(
            "{:<18} {:<12} {:>9} {:>9} {:>9} {:>9}",
            "scenario", "router", "in flight", "later", "back 10s", "ramp"
        );
        for (scenario, router, extra) in crash {
            if let Extra::CrashSameAddress {
                in_flight_failed,
                later_failed,
                share_back,
                ramp_failed,
            } = extra
            {
                println!(
                    "{:<18} {:<12} {:>9} {:>9} {:>9} {:>9}",
                    scenario.name(),
                    router,
                    in_flight_failed,
                    later_failed,
                    pct(*share_back),
                    ramp_failed
                );
            }
        }
        println!(
            "failed calls: in flight: made before the kill (these may fail); later: made from the kill to the \
             return (goal 0);\nramp: made from the return on (goal 0). back 10s: the returned agent's share of \
             the calls that reached agents in the {} s from its return (goal ≥ 15 %).",
            RETURN_WINDOW.as_secs()
        );
    }
    let ramp: Vec<_> = extras
        .iter()
        .filter(|e| matches!(e.2, Extra::Ramp { .. }))
        .collect();
    if !ramp.is_empty() {
        // Each ramp scenario run, once: its callers and the weak agent's pool.
        let mut shown: Vec<Scenario> = ramp.iter().map(|e| e.0).collect();
        shown.dedup();
        println!();
        for s in shown {
            println!(
                "{}: {RAMP_FROM} callers, then one more every {:.0} ms from {:.1} s (up to {}); agent-{} has a \
                 pool of {} (max_concurrency {}), the others {}{}",
                s.name(),
                s.ramp_every(seconds).unwrap_or_default().as_secs_f64() * 1000.0,
                s.fault_at(seconds).as_secs_f64(),
                RAMP_FROM + s.ramp_added(),
                RAMP_WEAK + 1,
                s.weak_pool(),
                s.weak_pool(),
                s.max_concurrency(),
                if s.caller_sidecars() > 1 {
                    format!(
                        "; callers spread over {RAMP_CALLER_SIDECARS} caller sidecars (caller k \
                         through sidecar k mod {RAMP_CALLER_SIDECARS}), each finding the fleet by gossip"
                    )
                } else {
                    String::new()
                }
            );
        }
        println!(
            "{:<18} {:<15} {:>11} {:>10} {:>10} {:>8} {:>7}",
            "scenario", "router", "refused@clr", "refused@wk", "weak share", "p95 ms", "failed"
        );
        for (scenario, router, extra) in ramp {
            if let Extra::Ramp {
                refused_caller,
                refused_weak,
                weak_share,
                p95,
                failed,
            } = extra
            {
                let count = |n: &Option<u64>| n.map_or("-".to_owned(), |n| n.to_string());
                println!(
                    "{:<18} {:<15} {:>11} {:>10} {:>10} {:>8.1} {:>7}",
                    scenario.name(),
                    router,
                    count(refused_caller),
                    count(refused_weak),
                    pct(*weak_share),
                    p95,
                    failed
                );
            }
        }
        println!(
            "refused@clr: attempts refused as saturated (429, or 503 saturated) counted by the callers' sidecars, \
             every peer, summed; refused@wk: turned away\nby the weak agent's sidecar. weak share: its share of the calls \
             that reached agents from the ramp's start. agent-reach predicts (estimates.horizon 10s);\n{} does not \
             (0s).",
            REACH_NO_PREDICTION
        );
    }
}

fn row(scenario: Scenario, router: &str, r: &Outcome, healthy_p95: Option<&f64>) -> String {
    let secs = |d: Option<Duration>, missing: &str| {
        d.map_or_else(
            || missing.to_owned(),
            |d| format!("{:.1} s", d.as_secs_f64()),
        )
    };
    let out = if scenario.measures_out() {
        secs(r.out_after, "never")
    } else {
        "-".to_owned()
    };
    let (full, join_fails) = match scenario.newcomer() {
        Some(_) if scenario == Scenario::CrashRestart && router == "baseline" => {
            ("static".to_owned(), r.join_failed.to_string())
        }
        Some(_) => (secs(r.full_after, "never"), r.join_failed.to_string()),
        None => ("-".to_owned(), "-".to_owned()),
    };
    format!(
        "{:<18} {:<12} {:>6} {:>7.2}% {:>8.1} {:>8.1} {:>7} {:>9} {:>9} {:>10} {:>6}",
        scenario.name(),
        router,
        r.calls,
        r.failed_pct,
        r.mean_ms,
        r.p95_ms,
        healthy_p95
            .filter(|h| **h > 0.0 && scenario.compares_healthy())
            .map_or("-".to_owned(), |h| format!("{:.2}x", r.p95_ms / h)),
        out,
        r.peak_ratio.map_or("-".into(), |p| format!("{p:.2}x")),
        full,
        join_fails,
    )
}

struct Outcome {
    calls: usize,
    failed_pct: f64,
    mean_ms: f64,
    p95_ms: f64,
    out_after: Option<Duration>,
    peak_ratio: Option<f64>,
    /// From the newcomer's start to its first second at full traffic.
    full_after: Option<Duration>,
    /// Calls that failed from the newcomer's start to the end of the run.
    join_failed: usize,
    /// The measures of burst, slow-agent, equal-pair and crash-same-address.
    extra: Option<Extra>,
}

/// A run's record, for the measures of the newer scenarios.
struct Observed<'a> {
    calls: &'a [Call],
    samples: &'a [Sample],
    fault_at: Duration,
    /// When the fault came: `fault_at`, to the watching loop's tick.
    broke_at: Duration,
    joined_at: Option<Duration>,
    /// agent-reach: the peers its caller took out of rotation, with the worst state seen.
    left: Option<HashMap<String, &'static str>>,
    /// agent-reach: attempts refused as saturated, at the caller's sidecar and at ramp's weak
    /// agent's.
    refusals: Option<(u64, u64)>,
}

enum Extra {
    Burst {
        /// Callers during the burst, all together.
        callers: usize,
        /// Successful calls that ended during the burst ÷ what the fleet can serve in as long.
        served_pct: f64,
        /// Agents out of rotation: by the caller's `/status` (agent-reach), by the traffic.
        left: String,
        /// Failed calls among those made in the first second after the burst, and after it.
        failed_1s: usize,
        failed_after: usize,
    },
    SlowAgent {
        /// The slow agent's share of the calls that reached agents, over the first 5 s and
        /// after.
        share_first: Option<f64>,
        share_later: Option<f64>,
        /// p95 of the calls made before the slowdown and of those made after it.
        p95_before: f64,
        p95_after: f64,
        failed_after: usize,
    },
    EqualPair {
        /// Agent A's lowest and highest share over each window, before the slow sample and
        /// after it.
        before: Option<(f64, f64)>,
        after: Option<(f64, f64)>,
    },
    CrashSameAddress {
        /// Failed calls made before the kill (in flight at it), and made after it until the
        /// agent's return.
        in_flight_failed: usize,
        later_failed: usize,
        /// The returned agent's share of the calls that reached agents, over 10 s from its
        /// return, and the calls made from its return that failed.
        share_back: Option<f64>,
        ramp_failed: usize,
    },
    Ramp {
        /// Attempts refused as saturated: at the caller's sidecar (every peer), at the weak
        /// agent's sidecar.
        refused_caller: Option<u64>,
        refused_weak: Option<u64>,
        /// The weak agent's share of the calls that reached agents during the ramp.
        weak_share: Option<f64>,
        p95: f64,
        failed: usize,
    },
}

/// One call as the caller saw it: when it ended, whether it succeeded, how long it took.
type Call = (Duration, bool, f64);

/// What reached each agent slot by `at`, and how many calls had ended.
struct Sample {
    at: Duration,
    reached: Vec<u64>,
    calls: usize,
}

/// One agent slot: the agent running in it now, and the calls its earlier incarnations got.
struct Slot {
    agent: Option<MockAgent>,
    before: u64,
}

impl Slot {
    async fn start(
        &mut self,
        scenario: Scenario,
        index: usize,
        listen: SocketAddr,
    ) -> Result<SocketAddr, String> {
        let mut config = MockConfig::new(&format!("agent-{}", index + 1));
        config.latency = scenario.latency();
        config.slow_latency = scenario.slow_latency();
        let agent = MockAgent::start_with(listen, config, scenario.workload(index))
            .await
            .map_err(|e| format!("agent {} on {listen}: {e}", index + 1))?;
        let addr = agent.addr;
        self.agent = Some(agent);
        Ok(addr)
    }

    /// The process dies: its port closes and its connections drop.
    async fn die(&mut self) {
        if let Some(agent) = self.agent.take() {
            self.before += agent.stats().business;
            agent.stop().await;
        }
    }

    /// The process comes back on `listen`, its old address: a port just closed may take a
    /// moment to bind again.
    async fn start_again(
        &mut self,
        scenario: Scenario,
        index: usize,
        listen: SocketAddr,
    ) -> Result<SocketAddr, String> {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match self.start(scenario, index, listen).await {
                Ok(addr) => return Ok(addr),
                Err(err) if Instant::now() > deadline => return Err(err),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    fn reached(&self) -> u64 {
        self.before + self.agent.as_ref().map_or(0, |a| a.stats().business)
    }
}

async fn run(
    scenario: Scenario,
    router: &str,
    tools: &Tools,
    dir: &Path,
    seconds: u64,
    options: &Options,
) -> Result<Outcome, String> {
    let duration = scenario.duration(seconds);
    let fault_at = scenario.fault_at(seconds);
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut slots: Vec<Slot> = (0..scenario.slots())
        .map(|_| Slot {
            agent: None,
            before: 0,
        })
        .collect();
    let mut addrs = Vec::new();
    for (i, slot) in slots.iter_mut().enumerate().take(scenario.agents()) {
        addrs.push(slot.start(scenario, i, any).await?);
    }
    if scenario == Scenario::ColdStart {
        // Reserved for the newcomer: listed by the static routers, listening from the join.
        addrs.push(SocketAddr::from(([127, 0, 0, 1], free_port()?)));
    }
    let mut front = Front::start(router, scenario, &addrs, tools, dir, options).await?;

    let caller = Caller {
        client: Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>(),
        urls: front.urls(),
        spawned: Arc::default(),
        calls: Arc::default(),
        stop: Arc::new(AtomicBool::new(false)),
        started: Instant::now(),
        pause: scenario.fail_pause(),
    };
    let started = caller.started;
    let burst_until = fault_at + scenario.burst_length(seconds);
    let mut workers: Vec<_> = (0..scenario.workers())
        .map(|_| caller.spawn(Duration::ZERO, None))
        .collect();
    workers
        .extend((0..scenario.burst_workers()).map(|_| caller.spawn(fault_at, Some(burst_until))));
    if let Some(every) = scenario.ramp_every(seconds) {
        workers.extend(
            (1..=scenario.ramp_added()).map(|k| caller.spawn(fault_at + every * k as u32, None)),
        );
    }
    // Watch what reaches each agent, every 100 ms; break, restart and join on time.
    let restart_at = matches!(
        scenario,
        Scenario::CrashRestart | Scenario::CrashSameAddress
    )
    .then_some(fault_at + RESTART_AFTER);
    let mut samples: Vec<Sample> = Vec::new();
    let (mut faulted, mut restarted) = (false, false);
    // When the fault came, to the loop's tick.
    let mut broke_at = fault_at;
    let mut joined_at: Option<Duration> = None;
    let mut next_diag = Duration::ZERO;
    let mut diag = Vec::new();
    // burst: the peers agent-reach's caller took out of rotation, with the worst state seen.
    let mut left: Option<HashMap<String, &'static str>> = None;
    while started.elapsed() < duration {
        let now = started.elapsed();
        if !faulted && now >= fault_at {
            faulted = true;
            broke_at = started.elapsed();
            for i in scenario.broken() {
                if let Some(agent) = &slots[*i].agent {
                    scenario.breaks(agent);
                }
            }
            match scenario {
                Scenario::HalfOpen => front.break_path(),
                Scenario::CrashRestart => {
                    slots[1].die().await;
                    front.pod_gone(1).await;
                }
                // The agent's process dies; its sidecar stays.
                Scenario::CrashSameAddress => slots[1].die().await,
                Scenario::EqualPair => slow_sample(&slots).await,
                Scenario::ColdStart => {
                    joined_at = Some(started.elapsed());
                    // agent-reach's newcomer listens anywhere: its sidecar announces it.
                    let listen = if router == "agent-reach" {
                        any
                    } else {
                        addrs[AGENTS]
                    };
                    let addr = slots[AGENTS].start(scenario, AGENTS, listen).await?;
                    front.pod_started(AGENTS, addr).await?;
                }
                _ => {}
            }
        }
        if restart_at.is_some_and(|at| !restarted && now >= at) {
            restarted = true;
            joined_at = Some(started.elapsed());
            if scenario == Scenario::CrashSameAddress {
                // Back on the same port, behind the sidecar that stayed: nobody is told.
                slots[1].start_again(scenario, 1, addrs[1]).await?;
            } else {
                let addr = slots[1].start(scenario, 1, any).await?;
                front.pod_started(1, addr).await?;
            }
        }
        if faulted && scenario.burst().is_some() {
            if let Some(out) = front.peers_out() {
                let seen = left.get_or_insert_with(HashMap::new);
                for (name, state) in out {
                    let worst = seen.entry(name).or_insert(state);
                    if state == "ejected" {
                        *worst = state;
                    }
                }
            }
        }
        let mut reached: Vec<u64> = slots.iter().map(Slot::reached).collect();
        if let Some(sent) = front.sent_into_path() {
            // In half-open the agent gets nothing once the path is broken; what counts is what
            // the router still sends into it.
            reached[1] = sent;
        }
        let n = caller.calls.lock().unwrap_or_else(|p| p.into_inner()).len();
        samples.push(Sample {
            at: started.elapsed(),
            reached,
            calls: n,
        });
        if options.diag.is_some() && now >= next_diag {
            next_diag = now + Duration::from_millis(500);
            if let Some(line) = front.diag_line(now) {
                diag.push(line);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    caller.stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.await;
    }
    if let (Some(d), Some(status)) = (&options.diag, front.final_status()) {
        // `agent-reach/h0` names a file, not a folder.
        let router = router.replace('/', "-");
        let name = |what: &str| d.join(format!("{}-{router}-{what}", scenario.name()));
        let _ = std::fs::write(name("timeline.jsonl"), diag.join("\n"));
        let _ = std::fs::write(name("status.json"), status);
    }
    let reach = matches!(front.kind, Kind::Reach(_));
    let refusals = front.refusals(RAMP_WEAK);
    front.stop().await;
    for slot in &mut slots {
        slot.die().await;
    }
    let calls = caller
        .calls
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let observed = Observed {
        calls: &calls,
        samples: &samples,
        fault_at,
        broke_at,
        joined_at,
        // Read from /status for agent-reach (none seen: an empty map), from the traffic for
        // the others.
        left: if reach {
            Some(left.unwrap_or_default())
        } else {
            None
        },
        refusals,
    };
    let mut outcome = outcome(scenario, &calls, &samples, fault_at, joined_at);
    outcome.extra = extra(scenario, seconds, &observed);
    Ok(outcome)
}

/// One `code-review` call after another, each recorded, from `from` until the run stops or
/// `until`; after a failed call, a pause of `pause`. The callers take the router's front doors
/// in turn (ramp-shared has one per caller sidecar).
#[derive(Clone)]
struct Caller {
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    urls: Vec<String>,
    /// Callers spawned so far: the next one takes the next front door.
    spawned: Arc<AtomicUsize>,
    calls: Arc<Mutex<Vec<Call>>>,
    stop: Arc<AtomicBool>,
    started: Instant,
    pause: Duration,
}

impl Caller {
    fn spawn(&self, from: Duration, until: Option<Duration>) -> tokio::task::JoinHandle<()> {
        let k = self.spawned.fetch_add(1, Ordering::Relaxed);
        let Caller {
            client,
            urls,
            calls,
            stop,
            started,
            pause,
            ..
        } = self.clone();
        tokio::spawn(async move {
            let Some(url) = urls.iter().cycle().nth(k) else {
                return;
            };
            tokio::time::sleep_until(tokio::time::Instant::from_std(started + from)).await;
            while !stop.load(Ordering::Relaxed) && until.is_none_or(|u| started.elapsed() < u) {
                let sent = Instant::now();
                let request = hyper::Request::post(url)
                    .header("reach-capability", CAP)
                    .body(Full::new(Bytes::from_static(b"def f(): pass")));
                let ok = match request {
                    Ok(r) => match tokio::time::timeout(CALL_TIMEOUT, client.request(r)).await {
                        Ok(Ok(response)) => {
                            let status = response.status();
                            let body = tokio::time::timeout(
                                CALL_TIMEOUT.saturating_sub(sent.elapsed()),
                                response.into_body().collect(),
                            )
                            .await;
                            matches!(body, Ok(Ok(_))) && status == 200
                        }
                        _ => false,
                    },
                    Err(_) => false,
                };
                let ms = sent.elapsed().as_secs_f64() * 1000.0;
                calls
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((started.elapsed(), ok, ms));
                if !ok && !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
        })
    }
}

/// equal-pair: exactly one slow call. Both agents take `PAIR_SLOW` for the next business call
/// to reach either (the one caller makes one call at a time), then are normal again.
async fn slow_sample(slots: &[Slot]) {
    let total = || slots.iter().map(Slot::reached).sum::<u64>();
    let set = |mode: Mode| {
        for agent in slots.iter().filter_map(|s| s.agent.as_ref()) {
            agent.set_mode(mode);
        }
    };
    let before = total();
    set(Mode::Slow);
    let deadline = Instant::now() + Duration::from_secs(2);
    while total() == before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The call has read its mode by now; the next cannot start before it ends.
    tokio::time::sleep(Duration::from_millis(5)).await;
    set(Mode::Normal);
}

fn outcome(
    scenario: Scenario,
    calls: &[Call],
    samples: &[Sample],
    fault_at: Duration,
    joined_at: Option<Duration>,
) -> Outcome {
    let mut ms: Vec<f64> = calls.iter().map(|c| c.2).collect();
    ms.sort_by(f64::total_cmp);
    let failed = calls.iter().filter(|c| !c.1).count();
    let p95 = ms
        .get(((ms.len() as f64 * 0.95) as usize).min(ms.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0);
    let mean = if ms.is_empty() {
        0.0
    } else {
        ms.iter().sum::<f64>() / ms.len() as f64
    };
    // How long the broken agent kept getting calls: from the fault to the end of the first
    // 500 ms in which it got under 5 % of its fair share of the calls that reached any agent
    // (sent into its path, in half-open). A half second in which the agents got less than a
    // tenth of what they got in an average half second before the fault (callers stuck) says
    // nothing either way.
    let bad = scenario.broken();
    let fair = 1.0 / AGENTS as f64;
    let arrived = |s: &Sample| s.reached.iter().sum::<u64>();
    let before = samples.iter().rfind(|s| s.at < fault_at);
    let quiet = before.map_or(0.0, |b| {
        let first = samples.first().map_or(0, arrived);
        arrived(b).saturating_sub(first) as f64 / b.at.as_secs_f64().max(0.1) * 0.5 * 0.1
    });
    let out_after = scenario
        .measures_out()
        .then(|| {
            samples
                .windows(6)
                .filter(|w| w[0].at >= fault_at)
                .find(|w| {
                    let (first, last) = (&w[0], &w[w.len() - 1]);
                    let got = |i: usize| last.reached[i].saturating_sub(first.reached[i]);
                    let all: u64 = (0..first.reached.len()).map(got).sum();
                    let reached: u64 = bad.iter().map(|i| got(*i)).sum();
                    all > 0
                        && all as f64 >= quiet
                        && reached as f64 / all as f64 / bad.len() as f64 <= 0.05 * fair
                })
                .map(|w| w[w.len() - 1].at.saturating_sub(fault_at))
        })
        .flatten();
    // Retry storm: the busiest 500 ms of the busiest survivor against its fair share of the
    // calls made (they are two: a half each).
    let peak_ratio = (scenario == Scenario::RetryStorm).then(|| {
        samples
            .windows(6)
            .filter(|w| w[0].at >= fault_at)
            .map(|w| {
                let (first, last) = (&w[0], &w[w.len() - 1]);
                let made = last.calls.saturating_sub(first.calls).max(1) as f64;
                (2..AGENTS)
                    .map(|i| last.reached[i].saturating_sub(first.reached[i]) as f64 / (made / 2.0))
                    .fold(0.0, f64::max)
            })
            .fold(0.0, f64::max)
    });
    // A newcomer at full traffic: the first second, from its start, in which it got at least
    // 90 % of a fair share of the calls that reached any agent.
    let full_after = scenario.newcomer().zip(joined_at).and_then(|(new, join)| {
        let fair = 1.0 / scenario.slots() as f64;
        samples
            .windows(11)
            .filter(|w| w[0].at >= join)
            .find(|w| {
                let (first, last) = (&w[0], &w[w.len() - 1]);
                let all: u64 = (0..first.reached.len())
                    .map(|i| last.reached[i].saturating_sub(first.reached[i]))
                    .sum();
                let mine = last.reached[new].saturating_sub(first.reached[new]);
                all > 0 && mine as f64 / all as f64 >= FULL_SHARE * fair
            })
            .map(|w| w[w.len() - 1].at.saturating_sub(join))
    });
    let join_failed = joined_at.map_or(0, |join| {
        calls.iter().filter(|c| !c.1 && c.0 >= join).count()
    });
    Outcome {
        calls: calls.len(),
        failed_pct: 100.0 * failed as f64 / calls.len().max(1) as f64,
        mean_ms: mean,
        p95_ms: p95,
        out_after,
        peak_ratio,
        full_after,
        join_failed,
        extra: None,
    }
}

/// When a call was made.
fn sent(c: &Call) -> Duration {
    c.0.saturating_sub(Duration::from_secs_f64(c.2 / 1000.0))
}

/// The calls that reached each agent from `from` to `to`, by the samples.
fn reached_between(samples: &[Sample], from: Duration, to: Duration) -> Option<Vec<u64>> {
    let first = samples.iter().rfind(|s| s.at <= from).or(samples.first())?;
    let last = samples.iter().rfind(|s| s.at <= to)?;
    (last.at > first.at).then(|| {
        last.reached
            .iter()
            .zip(&first.reached)
            .map(|(l, f)| l.saturating_sub(*f))
            .collect()
    })
}

/// Agent `slot`'s share of the calls that reached any agent from `from` to `to`.
fn share(samples: &[Sample], slot: usize, from: Duration, to: Duration) -> Option<f64> {
    let got = reached_between(samples, from, to)?;
    let all: u64 = got.iter().sum();
    (all > 0).then(|| got.get(slot).copied().unwrap_or(0) as f64 / all as f64)
}

fn p95(calls: &[&Call]) -> f64 {
    let mut ms: Vec<f64> = calls.iter().map(|c| c.2).collect();
    ms.sort_by(f64::total_cmp);
    ms.get(((ms.len() as f64 * 0.95) as usize).min(ms.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0)
}

/// The lowest and highest of some shares.
fn range(shares: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    shares.fold(None, |r, s| match r {
        None => Some((s, s)),
        Some((lo, hi)) => Some((f64::min(lo, s), f64::max(hi, s))),
    })
}

fn extra(scenario: Scenario, seconds: u64, o: &Observed) -> Option<Extra> {
    let failed_sent = |from: Duration, to: Duration| {
        o.calls
            .iter()
            .filter(|c| !c.1 && sent(c) >= from && sent(c) < to)
            .count()
    };
    let end = o.samples.last().map_or(Duration::ZERO, |s| s.at);
    let forever = Duration::MAX;
    match scenario {
        Scenario::Burst | Scenario::Burst3x => {
            let until = o.fault_at + scenario.burst_length(seconds);
            let served = o
                .calls
                .iter()
                .filter(|c| c.1 && c.0 >= o.fault_at && c.0 < until)
                .count();
            let could = scenario.capacity() * (until - o.fault_at).as_secs_f64();
            let left = match &o.left {
                Some(seen) => {
                    let ejected = seen.values().filter(|s| **s == "ejected").count();
                    match (seen.len(), ejected) {
                        (0, _) => "0".to_owned(),
                        (n, 0) => format!("{n} prob."),
                        (n, e) => format!("{n} ({e} ej.)"),
                    }
                }
                // An agent that got no call for a whole second while the others got some.
                None => {
                    let out = (0..scenario.agents())
                        .filter(|i| {
                            o.samples
                                .windows(11)
                                .filter(|w| w[0].at >= o.fault_at)
                                .any(|w| {
                                    let (first, last) = (&w[0], &w[w.len() - 1]);
                                    let got =
                                        |j: usize| last.reached[j].saturating_sub(first.reached[j]);
                                    got(*i) == 0
                                        && (0..first.reached.len()).map(got).sum::<u64>() > 0
                                })
                        })
                        .count();
                    format!("{out} (tr.)")
                }
            };
            Some(Extra::Burst {
                callers: scenario.workers() + scenario.burst_workers(),
                served_pct: 100.0 * served as f64 / could.max(1.0),
                left,
                failed_1s: failed_sent(until, until + Duration::from_secs(1)),
                failed_after: failed_sent(until, forever),
            })
        }
        Scenario::SlowAgent => {
            let split = o.broke_at + SLOW_WINDOW;
            let before: Vec<&Call> = o.calls.iter().filter(|c| sent(c) < o.broke_at).collect();
            let after: Vec<&Call> = o.calls.iter().filter(|c| sent(c) >= o.broke_at).collect();
            Some(Extra::SlowAgent {
                share_first: share(o.samples, 1, o.broke_at, split),
                share_later: share(o.samples, 1, split, end),
                p95_before: p95(&before),
                p95_after: p95(&after),
                failed_after: failed_sent(o.broke_at, forever),
            })
        }
        Scenario::EqualPair => {
            let windows = |from: Duration, to: Duration| {
                let count = ((to.saturating_sub(from)).as_secs_f64() / PAIR_WINDOW.as_secs_f64())
                    .round() as u32;
                range((0..count).filter_map(move |k| {
                    let start = from + PAIR_WINDOW * k;
                    share(o.samples, 0, start, start + PAIR_WINDOW)
                }))
            };
            Some(Extra::EqualPair {
                before: windows(Duration::ZERO, o.fault_at),
                after: windows(o.fault_at, end),
            })
        }
        Scenario::CrashSameAddress => {
            let back = o.joined_at.unwrap_or(forever);
            Some(Extra::CrashSameAddress {
                in_flight_failed: o
                    .calls
                    .iter()
                    .filter(|c| !c.1 && sent(c) < o.broke_at && c.0 >= o.broke_at)
                    .count(),
                later_failed: failed_sent(o.broke_at, back),
                share_back: o
                    .joined_at
                    .and_then(|at| share(o.samples, 1, at, at + RETURN_WINDOW)),
                ramp_failed: failed_sent(back, forever),
            })
        }
        Scenario::Ramp | Scenario::RampShared | Scenario::RampUnder => {
            let all: Vec<&Call> = o.calls.iter().collect();
            Some(Extra::Ramp {
                refused_caller: o.refusals.map(|r| r.0),
                refused_weak: o.refusals.map(|r| r.1),
                weak_share: share(o.samples, RAMP_WEAK, o.fault_at, end),
                p95: p95(&all),
                failed: failed_sent(Duration::ZERO, forever),
            })
        }
        _ => None,
    }
}

/// The router under test, in front of the agents, with the relay of a half-open run.
struct Front {
    kind: Kind,
    relay: Option<Relay>,
    /// The address the router was given for each agent slot.
    endpoints: Vec<SocketAddr>,
}

enum Kind {
    Reach(Box<Reach>),
    Baseline {
        port: u16,
        task: tokio::task::JoinHandle<()>,
    },
    Haproxy {
        port: u16,
        child: Child,
        /// The runtime API.
        socket: PathBuf,
    },
    Envoy {
        port: u16,
        child: Child,
        /// The EDS file, when the endpoints come from one (crash-restart).
        eds: Option<PathBuf>,
    },
}

/// agent-reach: the caller's sidecar (the gossip seed), ramp-shared's other caller sidecars,
/// and one sidecar per agent slot.
struct Reach {
    caller: Sidecar,
    other_callers: Vec<Sidecar>,
    sidecars: Vec<Option<Sidecar>>,
    key: PathBuf,
    policy: Policy,
    scenario: Scenario,
    /// Whether the sidecars declare a business probe.
    probe: bool,
}

impl Reach {
    /// Every caller sidecar, the seed first.
    fn callers(&self) -> impl Iterator<Item = &Sidecar> {
        std::iter::once(&self.caller).chain(&self.other_callers)
    }

    /// A sidecar for the agent in `slot`, joining the fleet through the caller's sidecar.
    async fn sidecar(
        &self,
        slot: usize,
        agent: SocketAddr,
        ip: [u8; 4],
    ) -> Result<Sidecar, String> {
        let name = format!("agent-{}", slot + 1);
        let seed: Vec<SocketAddr> = self.caller.addrs.gossip.into_iter().collect();
        let mut b = Bootstrap::local(&name, agent, &[CAP])?.with_gossip(&seed, self.key.clone());
        b.agent.max_concurrency =
            yaml::from_str(&self.scenario.max_concurrency_of(slot).to_string())
                .map_err(|e| e.to_string())?;
        b.agent.queue.capacity = QUEUE;
        if let Some(g) = b.gossip.as_mut() {
            g.listen = SocketAddr::from((ip, 0));
        }
        if self.probe {
            for c in &mut b.agent.capabilities {
                c.probe = Some(mock_agent::probe_spec());
            }
        }
        start_sidecar(b, self.policy.clone()).await
    }
}

async fn start_sidecar(b: Bootstrap, policy: Policy) -> Result<Sidecar, String> {
    let store = Arc::new(ConfigStore::new(b, policy, ConfigPaths::default()));
    Sidecar::start(store).await.map_err(|e| e.to_string())
}

/// A fresh gossip cluster key in `dir`.
fn key_file(dir: &Path) -> Result<PathBuf, String> {
    let secret: [u8; 32] = rand::random();
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    write(
        dir,
        &format!("gossip-{:x}.key", rand::random::<u64>()),
        &hex,
    )
}

impl Front {
    async fn start(
        router: &str,
        scenario: Scenario,
        agents: &[SocketAddr],
        tools: &Tools,
        dir: &Path,
        options: &Options,
    ) -> Result<Self, String> {
        let mut endpoints = agents.to_vec();
        let mut relay = None;
        if scenario == Scenario::HalfOpen && router != "agent-reach" {
            let r = Relay::start(SocketAddr::from(([127, 0, 0, 1], 0)), agents[1]).await?;
            endpoints[1] = r.addr;
            relay = Some(r);
        }
        // A cold start's fifth agent is not running yet: agent-reach learns of it when it joins.
        let live = scenario.agents().min(agents.len());
        let kind = match router {
            "agent-reach" | REACH_NO_PREDICTION => {
                let key = key_file(dir)?;
                let mut policy = Policy {
                    decision_log: options.decision_log,
                    ..Policy::default()
                };
                if router == REACH_NO_PREDICTION {
                    policy.estimates.horizon = agent_reach::config::HumanDuration(Duration::ZERO);
                }
                let nowhere = SocketAddr::from(([127, 0, 0, 1], 9));
                let caller = start_sidecar(
                    Bootstrap::local("caller", nowhere, &[])?.with_gossip(&[], key.clone()),
                    policy.clone(),
                )
                .await?;
                let seed: Vec<SocketAddr> = caller.addrs.gossip.into_iter().collect();
                let mut other_callers = Vec::new();
                for i in 2..=scenario.caller_sidecars() {
                    let b = Bootstrap::local(&format!("caller-{i}"), nowhere, &[])?
                        .with_gossip(&seed, key.clone());
                    other_callers.push(start_sidecar(b, policy.clone()).await?);
                }
                let mut reach = Reach {
                    caller,
                    other_callers,
                    sidecars: (0..agents.len()).map(|_| None).collect(),
                    key,
                    policy,
                    scenario,
                    probe: scenario.probe(),
                };
                for (i, addr) in agents.iter().enumerate().take(live) {
                    let half_open = scenario == Scenario::HalfOpen && i == 1;
                    let ip = if half_open { RELAY_IP } else { [127, 0, 0, 1] };
                    let sidecar = reach.sidecar(i, *addr, ip).await?;
                    if half_open {
                        // The network path: peers reach this sidecar at the advertised
                        // 127.0.0.2:<inbound port>, where the relay listens.
                        let inbound = sidecar.addrs.inbound;
                        let r = Relay::start(SocketAddr::from((RELAY_IP, inbound.port())), inbound)
                            .await?;
                        endpoints[1] = r.addr;
                        relay = Some(r);
                    }
                    reach.sidecars[i] = Some(sidecar);
                }
                // Ready when every caller knows every agent by gossip (other callers offer no
                // capability: they do not count).
                let deadline = Instant::now() + Duration::from_secs(20);
                let agents_known = |s: &Sidecar| {
                    s.status()
                        .peers
                        .iter()
                        .filter(|p| p.capabilities.iter().any(|c| c == CAP))
                        .count()
                };
                while let Some(short) = reach
                    .callers()
                    .map(agents_known)
                    .filter(|n| *n < live)
                    .min()
                {
                    if Instant::now() > deadline {
                        return Err(format!(
                            "a caller found {short} of {live} agents by gossip within 20 s"
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Kind::Reach(Box::new(reach))
            }
            "baseline" => {
                let (port, task) = baseline(endpoints.clone()).await?;
                Kind::Baseline { port, task }
            }
            "haproxy" => {
                let binary = tools.haproxy.clone().ok_or("haproxy not found")?;
                let port = free_port()?;
                let socket = dir.join(format!("haproxy-{port}.sock"));
                let servers: String = endpoints
                    .iter()
                    .enumerate()
                    .map(|(i, a)| format!("  server a{i} {a} check\n"))
                    .collect();
                let cfg = write(dir, "haproxy.cfg", &format!(
                    "global\n  nbthread 1\n  maxconn 4096\n  stats socket {} mode 600 level admin\n\
                     defaults\n  mode http\n  timeout connect 1s\n  timeout client 30s\n  timeout server 30s\n  option http-keep-alive\n\
                     \x20 retries 1\n  option redispatch 1\n  retry-on conn-failure empty-response response-timeout 500 502 503 504\n\
                     frontend f\n  bind 127.0.0.1:{port}\n  default_backend b\n\
                     backend b\n  balance roundrobin\n  option httpchk GET /healthz\n  http-check expect status 200\n\
                     \x20 default-server inter 10s fall 3 rise 2 observe layer7 error-limit 10 on-error mark-down\n{servers}",
                    socket.display()))?;
                let child = common::spawn_quiet(common::haproxy(&binary, &cfg))?;
                Kind::Haproxy {
                    port,
                    child,
                    socket,
                }
            }
            "envoy" => {
                let binary = tools.envoy.clone().ok_or("envoy not found")?;
                let port = free_port()?;
                // crash-restart: endpoints from a watched file, as a control plane would push them.
                let eds = if scenario == Scenario::CrashRestart {
                    let eds_dir = dir.join(format!("eds-{port}"));
                    std::fs::create_dir_all(&eds_dir).map_err(|e| e.to_string())?;
                    let path = eds_dir.join("eds.yaml");
                    write_eds(&path, &endpoints)?;
                    Some(path)
                } else {
                    None
                };
                let cfg = write(
                    dir,
                    "envoy.yaml",
                    &envoy_config(port, &endpoints, eds.as_deref()),
                )?;
                let child = common::spawn_quiet(common::envoy(&binary, &cfg, port))?;
                Kind::Envoy { port, child, eds }
            }
            other => return Err(format!("unknown router {other}")),
        };
        let front = Front {
            kind,
            relay,
            endpoints,
        };
        // Ready when a call goes through every front door.
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let deadline = Instant::now() + Duration::from_secs(20);
        for url in front.urls() {
            loop {
                let request = hyper::Request::post(&url)
                    .header("reach-capability", CAP)
                    .body(Full::new(Bytes::from_static(b"x")))
                    .map_err(|e| e.to_string())?;
                if let Ok(Ok(r)) =
                    tokio::time::timeout(Duration::from_secs(2), client.request(request)).await
                {
                    if r.status() == 200 {
                        break;
                    }
                }
                if Instant::now() > deadline {
                    front.stop().await;
                    return Err(format!("the router did not answer at {url} within 20 s"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(front)
    }

    /// Where callers send their calls: one URL, or one per caller sidecar.
    fn urls(&self) -> Vec<String> {
        let ports: Vec<u16> = match &self.kind {
            Kind::Reach(r) => r.callers().map(|c| c.addrs.outbound.port()).collect(),
            Kind::Baseline { port, .. } | Kind::Haproxy { port, .. } | Kind::Envoy { port, .. } => {
                vec![*port]
            }
        };
        ports
            .into_iter()
            .map(|port| format!("http://127.0.0.1:{port}/review"))
            .collect()
    }

    fn break_path(&self) {
        if let Some(r) = &self.relay {
            r.broken.store(true, Ordering::SeqCst);
        }
    }

    /// Calls sent into the relayed path so far, in a half-open run.
    fn sent_into_path(&self) -> Option<u64> {
        self.relay
            .as_ref()
            .map(|r| r.requests.load(Ordering::Relaxed))
    }

    /// The pod in `slot` died: for agent-reach its sidecar goes too, without a goodbye.
    async fn pod_gone(&mut self, slot: usize) {
        if let Kind::Reach(r) = &mut self.kind {
            if let Some(s) = r.sidecars.get_mut(slot).and_then(Option::take) {
                s.kill().await;
            }
        }
    }

    /// The agent in `slot` listens at `addr`: agent-reach starts its sidecar, which joins by
    /// gossip; HAProxy and Envoy are told a changed address; the baseline cannot be.
    async fn pod_started(&mut self, slot: usize, addr: SocketAddr) -> Result<(), String> {
        let moved = self.endpoints.get(slot) != Some(&addr);
        match &mut self.kind {
            Kind::Reach(r) => {
                let sidecar = r.sidecar(slot, addr, [127, 0, 0, 1]).await?;
                r.sidecars[slot] = Some(sidecar);
                return Ok(());
            }
            Kind::Baseline { .. } => return Ok(()),
            Kind::Haproxy { socket, .. } if moved => {
                haproxy_command(
                    socket,
                    &format!(
                        "set server b/a{slot} addr {} port {}",
                        addr.ip(),
                        addr.port()
                    ),
                )?;
            }
            Kind::Envoy {
                eds: Some(path), ..
            } if moved => {
                let mut endpoints = self.endpoints.clone();
                endpoints[slot] = addr;
                write_eds(path, &endpoints)?;
            }
            Kind::Haproxy { .. } | Kind::Envoy { .. } => {}
        }
        if moved {
            self.endpoints[slot] = addr;
        }
        Ok(())
    }

    /// agent-reach: the caller's view of each peer, one JSON line.
    fn diag_line(&self, at: Duration) -> Option<String> {
        let Kind::Reach(r) = &self.kind else {
            return None;
        };
        let views: Vec<serde_json::Value> = r
            .caller
            .status()
            .peer_views
            .iter()
            .map(|p| {
                let view = serde_json::to_value(p.view).unwrap_or_default();
                serde_json::json!({
                    "peer": p.name,
                    "address": p.address,
                    "effective": p.effective_state,
                    "cap": p.effective_cap,
                    "score": p.last_score,
                    "view": view,
                    "self": p.self_view.as_ref().map(|v| serde_json::to_value(v).unwrap_or_default()),
                })
            })
            .collect();
        Some(serde_json::json!({ "t": at.as_secs_f64(), "peers": views }).to_string())
    }

    /// agent-reach: the peers the caller sees in probation or ejected (by its own view, the
    /// peer's, or the effective state), each with the worse of the two states.
    fn peers_out(&self) -> Option<Vec<(String, &'static str)>> {
        let Kind::Reach(r) = &self.kind else {
            return None;
        };
        let status = serde_json::to_value(r.caller.status()).ok()?;
        let views = status.get("peer_views")?.as_array()?;
        Some(
            views
                .iter()
                .filter_map(|p| {
                    let states: Vec<&str> = [
                        p.get("effective_state"),
                        p.pointer("/view/state"),
                        p.pointer("/self_view/view/state"),
                    ]
                    .into_iter()
                    .flatten()
                    .filter_map(serde_json::Value::as_str)
                    .collect();
                    let worst = if states.contains(&"ejected") {
                        "ejected"
                    } else if states.contains(&"probation") {
                        "probation"
                    } else {
                        return None;
                    };
                    Some((p.get("name")?.as_str()?.to_owned(), worst))
                })
                .collect(),
        )
    }

    /// agent-reach: attempts refused as saturated (429, or 503 `saturated`) as the callers'
    /// sidecars counted them over every peer, all together, and as the sidecar of the agent in
    /// `slot` did.
    fn refusals(&self, slot: usize) -> Option<(u64, u64)> {
        let Kind::Reach(r) = &self.kind else {
            return None;
        };
        let at_callers = r
            .callers()
            .flat_map(|c| c.status().peer_views)
            .map(|p| p.outcomes.refused + p.outcomes.shed)
            .sum();
        let at_agent = r.sidecars.get(slot)?.as_ref()?.status().inbound.rejected;
        Some((at_callers, at_agent))
    }

    fn final_status(&self) -> Option<String> {
        let Kind::Reach(r) = &self.kind else {
            return None;
        };
        serde_json::to_string_pretty(&r.caller.status()).ok()
    }

    async fn stop(self) {
        let Front { kind, relay, .. } = self;
        if let Some(r) = relay {
            r.stop.cancel();
        }
        match kind {
            Kind::Reach(r) => {
                let Reach {
                    caller,
                    other_callers,
                    sidecars,
                    ..
                } = *r;
                caller.kill().await;
                for c in other_callers {
                    c.kill().await;
                }
                for s in sidecars.into_iter().flatten() {
                    s.kill().await;
                }
            }
            Kind::Baseline { task, .. } => task.abort(),
            Kind::Haproxy { mut child, .. } | Kind::Envoy { mut child, .. } => {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// One command on HAProxy's runtime API; its answer must not be an error.
fn haproxy_command(socket: &Path, command: &str) -> Result<(), String> {
    use std::io::Read as _;
    let mut stream = std::os::unix::net::UnixStream::connect(socket)
        .map_err(|e| format!("{}: {e}", socket.display()))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(format!("{command}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    if answer.to_ascii_lowercase().contains("error") || answer.contains("No such") {
        return Err(format!("haproxy `{command}`: {}", answer.trim()));
    }
    Ok(())
}

fn envoy_endpoints(endpoints: &[SocketAddr], indent: &str) -> String {
    endpoints
        .iter()
        .map(|a| {
            format!(
                "{indent}- endpoint: {{ address: {{ socket_address: {{ address: {}, port_value: {} }} }} }}\n",
                a.ip(),
                a.port()
            )
        })
        .collect()
}

/// The EDS file, replaced whole by a rename so Envoy's directory watch sees one change.
fn write_eds(path: &Path, endpoints: &[SocketAddr]) -> Result<(), String> {
    let text = format!(
        "resources:\n- \"@type\": type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment\n  cluster_name: agents\n  endpoints:\n  - lb_endpoints:\n{}",
        envoy_endpoints(endpoints, "    ")
    );
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, path).map_err(|e| e.to_string())
}

fn envoy_config(port: u16, endpoints: &[SocketAddr], eds: Option<&Path>) -> String {
    let discovery = match eds {
        Some(path) => format!(
            "    type: EDS\n    eds_cluster_config:\n      eds_config:\n        resource_api_version: V3\n        path_config_source:\n          path: {}\n          watched_directory: {{ path: {} }}\n",
            path.display(),
            path.parent().map_or(String::new(), |d| d.display().to_string())
        ),
        None => format!(
            "    type: STATIC\n    load_assignment:\n      cluster_name: agents\n      endpoints:\n      - lb_endpoints:\n{}",
            envoy_endpoints(endpoints, "        ")
        ),
    };
    format!(
        r#"
node: {{ id: scenario, cluster: scenario }}
static_resources:
  listeners:
  - address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: scenario
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route:
                  cluster: agents
                  timeout: 10s
                  retry_policy:
                    retry_on: "5xx,reset,connect-failure,retriable-status-codes"
                    retriable_status_codes: [429]
                    num_retries: 1
                    retry_host_predicate: [ {{ name: envoy.retry_host_predicates.previous_hosts, typed_config: {{ "@type": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate }} }} ]
                    host_selection_retry_max_attempts: 3
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {{ "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }}
  clusters:
  - name: agents
    connect_timeout: 1s
    lb_policy: ROUND_ROBIN
    round_robin_lb_config: {{ slow_start_config: {{ slow_start_window: 30s }} }}
    circuit_breakers: {{ thresholds: [ {{ retry_budget: {{ budget_percent: {{ value: 20 }}, min_retry_concurrency: 3 }} }} ] }}
    health_checks:
    - timeout: 2s
      interval: 10s
      unhealthy_threshold: 3
      healthy_threshold: 2
      no_traffic_interval: 10s
      http_health_check: {{ path: /healthz }}
    outlier_detection:
      consecutive_5xx: 5
      consecutive_gateway_failure: 5
      interval: 1s
      base_ejection_time: 30s
      max_ejection_percent: 50
{discovery}"#
    )
}

/// A TCP relay standing for the network path to one agent. Until it is broken it forwards both
/// ways and passes a close on; once broken it forwards nothing, on open connections and new ones
/// (accepted, then read and discarded), and closes nothing: a black hole, so the sender waits
/// for a timeout. It counts the HTTP/1.1 POSTs sent into it, delivered or not.
struct Relay {
    addr: SocketAddr,
    broken: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl Relay {
    async fn start(listen: SocketAddr, upstream: SocketAddr) -> Result<Self, String> {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| format!("relay on {listen}: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let relay = Self {
            addr,
            broken: Arc::default(),
            requests: Arc::default(),
            stop: CancellationToken::new(),
        };
        let (broken, requests, stop) = (
            relay.broken.clone(),
            relay.requests.clone(),
            relay.stop.clone(),
        );
        tokio::spawn(async move {
            loop {
                let client = tokio::select! {
                    _ = stop.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => stream,
                        Err(_) => continue,
                    },
                };
                let (broken, requests, stop) = (broken.clone(), requests.clone(), stop.clone());
                tokio::spawn(async move {
                    let _ = client.set_nodelay(true);
                    let upstream = if broken.load(Ordering::SeqCst) {
                        None
                    } else {
                        tokio::net::TcpStream::connect(upstream).await.ok()
                    };
                    let (client_read, client_write) = client.into_split();
                    match upstream {
                        Some(upstream) => {
                            let _ = upstream.set_nodelay(true);
                            let (up_read, up_write) = upstream.into_split();
                            tokio::join!(
                                pump(client_read, up_write, &broken, Some(&requests), &stop),
                                pump(up_read, client_write, &broken, None, &stop),
                            );
                        }
                        None if broken.load(Ordering::SeqCst) => {
                            // Accept, then swallow: hold the write half so nothing closes.
                            let _held = client_write;
                            pump_into_nothing(client_read, &requests, &stop).await;
                        }
                        // The agent is not there (before the break): refuse like it would.
                        None => {}
                    }
                });
            }
        });
        Ok(relay)
    }
}

/// Forwards `from` to `to` until the break, then reads and discards; a close before the break
/// is passed on, after it is kept quiet until the relay stops.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    broken: &AtomicBool,
    requests: Option<&AtomicU64>,
    stop: &CancellationToken,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            _ = stop.cancelled() => return,
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
        };
        if let Some(r) = requests {
            if buf[..n].starts_with(b"POST ") {
                r.fetch_add(1, Ordering::Relaxed);
            }
        }
        if broken.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    if broken.load(Ordering::SeqCst) {
        let _held = (from, to);
        stop.cancelled().await;
    } else {
        let _ = to.shutdown().await;
    }
}

async fn pump_into_nothing(
    mut from: tokio::net::tcp::OwnedReadHalf,
    requests: &AtomicU64,
    stop: &CancellationToken,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if buf[..n].starts_with(b"POST ") {
                        requests.fetch_add(1, Ordering::Relaxed);
                    }
                }
            },
        }
    }
    let _held = from;
    stop.cancelled().await;
}

/// What the seeds started from: round-robin over agents whose `/healthz` answered 200 at the
/// last check (every 10 s), and one immediate retry on the next agent after an error, a 5xx
/// or a 429.
async fn baseline(agents: Vec<SocketAddr>) -> Result<(u16, tokio::task::JoinHandle<()>), String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let healthy: Arc<Vec<AtomicBool>> =
        Arc::new(agents.iter().map(|_| AtomicBool::new(true)).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let checker = {
        let (agents, healthy, client) = (agents.clone(), healthy.clone(), client.clone());
        tokio::spawn(async move {
            loop {
                for (i, a) in agents.iter().enumerate() {
                    let request = hyper::Request::get(format!("http://{a}/healthz"))
                        .body(Full::new(Bytes::new()));
                    let up = match request {
                        Ok(r) => {
                            matches!(tokio::time::timeout(Duration::from_secs(2), client.request(r)).await, Ok(Ok(resp)) if resp.status() == 200)
                        }
                        Err(_) => false,
                    };
                    healthy[i].store(up, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        })
    };
    let task = tokio::spawn(async move {
        let _checker = AbortOnDrop(checker);
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (agents, healthy, next, client) = (
                agents.clone(),
                healthy.clone(),
                next.clone(),
                client.clone(),
            );
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let (agents, healthy, next, client) = (
                            agents.clone(),
                            healthy.clone(),
                            next.clone(),
                            client.clone(),
                        );
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let mut last = hyper::Response::builder()
                                .status(502)
                                .body(Full::new(Bytes::new()));
                            for _attempt in 0..2 {
                                let pick = (0..agents.len())
                                    .map(|_| next.fetch_add(1, Ordering::Relaxed) % agents.len())
                                    .find(|i| healthy[*i].load(Ordering::Relaxed))
                                    .unwrap_or(0);
                                let request = hyper::Request::builder()
                                    .method(parts.method.clone())
                                    .uri(format!("http://{}{}", agents[pick], parts.uri.path()))
                                    .body(Full::new(body.clone()));
                                let Ok(request) = request else { break };
                                match client.request(request).await {
                                    Ok(resp) => {
                                        let status = resp.status();
                                        let bytes = resp
                                            .into_body()
                                            .collect()
                                            .await
                                            .map(|b| b.to_bytes())
                                            .unwrap_or_default();
                                        last = hyper::Response::builder()
                                            .status(status)
                                            .body(Full::new(bytes));
                                        if status.is_server_error() || status == 429 {
                                            continue;
                                        }
                                        break;
                                    }
                                    Err(_) => continue,
                                }
                            }
                            Ok::<_, std::convert::Infallible>(last.unwrap_or_default())
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((port, task))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
