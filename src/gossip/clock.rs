//! The clock a node stamps envelopes and epochs with: the wall clock in production, or the
//! runtime's clock for a simulation on tokio's paused time.

use tokio::time::Instant;

use super::envelope;

/// Where a node reads "now" in microseconds since the Unix epoch.
///
/// Under a paused runtime clock simulated time runs ahead of (or behind) the wall clock, so
/// envelope stamps, epochs and the replay window must follow the runtime's clock there, or
/// every envelope would look stale or from the future (`docs/gossip.md`, "Measured").
#[derive(Clone, Copy, Debug, Default)]
pub enum Clock {
    /// The system's wall clock: peers on other hosts agree with it (NTP).
    #[default]
    Wall,
    /// A fixed Unix time plus the runtime clock's time since `origin`; every node of one
    /// simulation shares one, so they agree with each other.
    Runtime {
        unix_us_at_origin: u64,
        origin: Instant,
    },
}

impl Clock {
    /// The runtime clock, starting at a given Unix time (a repeatable simulation).
    pub fn runtime_from(unix_us_at_origin: u64) -> Self {
        Self::Runtime {
            unix_us_at_origin,
            origin: Instant::now(),
        }
    }

    /// Microseconds since the Unix epoch by this clock.
    pub(crate) fn unix_us(&self) -> u64 {
        match self {
            Self::Wall => envelope::unix_us(),
            Self::Runtime {
                unix_us_at_origin,
                origin,
            } => {
                let elapsed = u64::try_from(origin.elapsed().as_micros()).unwrap_or(u64::MAX);
                unix_us_at_origin.saturating_add(elapsed)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_runtime_clock_follows_paused_time() {
        let clock = Clock::runtime_from(1_000_000);
        assert_eq!(clock.unix_us(), 1_000_000);
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(clock.unix_us(), 1_000_000 + 3_600_000_000);
    }
}
