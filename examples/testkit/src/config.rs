//! How a mock agent is set up: its fault mode, latency and the counters it keeps.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use agent_reach::config::parse_duration;

use super::provider::{ModelCall, ProviderBudget};

/// How business calls behave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Answers after the configured latency; fails at the configured failure rate.
    Normal,
    /// Business calls get 429 with `retry-after` while `/healthz` stays 200 ("fake online").
    RateLimited,
    /// A dependency got slow: every business call takes `slow_latency`.
    Slow,
    /// A workspace lock: one business call at a time, the rest wait.
    Locked,
    /// Accepts and reads the request, never answers.
    Hang,
    /// Serves N more business calls, then the process "dies": the port closes, connections drop.
    CrashAfter(u64),
    /// Long tasks: a share (`Workload::long_share`) of business calls take
    /// `Workload::long_latency`. With a worker pool (`Workload::pool`) they fill it, and the
    /// short calls wait behind them in the agent's own queue while `/healthz` stays 200.
    LongTasks,
    /// A plausible fake: business calls get 200 with a JSON body of the wrong shape (no `ok`
    /// field), what an agent's output schema is there to catch.
    WrongShape,
    /// Quality drift: business calls still get a 200 of the right shape, but the `language`
    /// field changed and the `summary` text is about nothing the request asked — what golden
    /// tasks compared with a baseline are there to catch (probes and traffic pass).
    Drift,
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        match text {
            "normal" | "healthy" => Ok(Mode::Normal),
            "rate-limited" => Ok(Mode::RateLimited),
            "slow" => Ok(Mode::Slow),
            "locked" => Ok(Mode::Locked),
            "hang" => Ok(Mode::Hang),
            "long-tasks" => Ok(Mode::LongTasks),
            "wrong-shape" | "plausible-fake" => Ok(Mode::WrongShape),
            "drift" => Ok(Mode::Drift),
            _ => match text.strip_prefix("crash-after") {
                Some(n) => n
                    .trim_start_matches(['=', ' ', ':'])
                    .parse()
                    .map(Mode::CrashAfter)
                    .map_err(|_| format!("`{text}`: crash-after needs a count, e.g. crash-after=5")),
                None => Err(format!(
                    "unknown mode `{text}` (normal, rate-limited, slow, locked, hang, long-tasks, wrong-shape, drift, crash-after=N)"
                )),
            },
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Normal => f.write_str("normal"),
            Mode::RateLimited => f.write_str("rate-limited"),
            Mode::Slow => f.write_str("slow"),
            Mode::Locked => f.write_str("locked"),
            Mode::Hang => f.write_str("hang"),
            Mode::LongTasks => f.write_str("long-tasks"),
            Mode::WrongShape => f.write_str("wrong-shape"),
            Mode::Drift => f.write_str("drift"),
            Mode::CrashAfter(n) => write!(f, "crash-after={n}"),
        }
    }
}

/// A latency: fixed (`50ms`) or uniform over a range (`20ms..80ms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Latency {
    pub min: Duration,
    pub max: Duration,
}

impl Latency {
    pub const fn fixed(d: Duration) -> Self {
        Self { min: d, max: d }
    }

    /// The latency at `u` in 0..1 of the range (a draw from the caller's own RNG).
    pub fn at(&self, u: f64) -> Duration {
        if self.max <= self.min {
            return self.min;
        }
        let span = (self.max - self.min).as_secs_f64();
        self.min + Duration::from_secs_f64(span * u.clamp(0.0, 1.0))
    }
}

impl FromStr for Latency {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text.split_once("..") {
            Some((lo, hi)) => {
                let (min, max) = (parse_duration(lo)?, parse_duration(hi)?);
                if max < min {
                    return Err(format!("latency range `{text}` ends before it starts"));
                }
                Ok(Self { min, max })
            }
            None => parse_duration(text).map(Self::fixed),
        }
    }
}

/// How a mock agent starts.
#[derive(Clone, Debug)]
pub struct MockConfig {
    pub name: String,
    pub latency: Latency,
    /// Share of normal business calls that fail with 500, 0..1.
    pub failure_rate: f64,
    pub mode: Mode,
    pub slow_latency: Duration,
    pub sse_events: u32,
    pub sse_interval: Duration,
    /// The budget of its mock model provider (`POST /v1/chat/completions`).
    pub provider: ProviderBudget,
    /// Each task first calls a model through the agent's own sidecar (None: no model call).
    pub model: Option<ModelCall>,
}

impl MockConfig {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            latency: Latency::fixed(Duration::from_millis(5)),
            failure_rate: 0.0,
            mode: Mode::Normal,
            slow_latency: Duration::from_secs(3),
            sse_events: 5,
            sse_interval: Duration::from_millis(100),
            provider: ProviderBudget::default(),
            model: None,
        }
    }
}

/// How a mock agent works, beyond its [`MockConfig`]: its own worker pool, a fixed seed for its
/// random draws, and what `long-tasks` mode does. Given to [`super::MockAgent::start_with`].
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// Worker slots. Business calls (probes included) beyond this many wait, first come first
    /// served, in the agent's own queue; `/healthz` and `/admin` never do. None: no limit.
    pub pool: Option<usize>,
    /// Seeds the agent's draws (latency, injected failures, long tasks), so the sequence of
    /// draws is the same on every run. None: the thread RNG.
    pub seed: Option<u64>,
    /// In `long-tasks` mode: the share of business calls, 0..1, that take `long_latency`.
    pub long_share: f64,
    pub long_latency: Duration,
}

impl Default for Workload {
    fn default() -> Self {
        Self {
            pool: None,
            seed: None,
            long_share: 0.3,
            long_latency: Duration::from_secs(5),
        }
    }
}

/// Counts of what the mock agent has seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MockStats {
    /// Business calls, probes excluded.
    pub business: u64,
    /// Business calls marked `reach-probe` by a sidecar's prober.
    pub probes: u64,
    pub health: u64,
    /// Business calls being served or waiting.
    pub in_flight: u64,
    /// Of those, the ones waiting for a worker slot.
    pub queued: u64,
}
