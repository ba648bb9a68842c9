//! Token buckets for external targets: over the limit, a call is refused at once with 429 and
//! `retry-after` — never a queue that grows.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::RateLimit;

#[derive(Debug, Default)]
pub(crate) struct RateLimiters {
    buckets: Mutex<crate::fast_hash::FastMap<String, Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    limit: RateLimit,
    tokens: f64,
    at: Instant,
}

impl RateLimiters {
    /// Takes a token for `target`; when there is none, how long until there will be one.
    pub(crate) fn take(&self, target: &str, limit: RateLimit) -> Result<(), Duration> {
        let now = Instant::now();
        let per_second = limit.per_second.max(1e-6);
        let burst = f64::from(limit.burst.max(1));
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if !buckets.contains_key(target) {
            buckets.insert(
                target.to_owned(),
                Bucket {
                    limit,
                    tokens: burst,
                    at: now,
                },
            );
        }
        let Some(bucket) = buckets.get_mut(target) else {
            unreachable!("inserted above")
        };
        if bucket.limit != limit {
            // The policy changed: start from a full bucket of the new size.
            *bucket = Bucket {
                limit,
                tokens: burst,
                at: now,
            };
        }
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * per_second).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                ((1.0 - bucket.tokens) / per_second).min(3600.0),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_bucket_allows_its_burst_then_its_rate() {
        let limiters = RateLimiters::default();
        let limit = RateLimit {
            per_second: 2.0,
            burst: 3,
        };
        for _ in 0..3 {
            assert_eq!(limiters.take("t", limit), Ok(()));
        }
        let wait = limiters.take("t", limit).err().unwrap_or_default();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(500),
            "{wait:?}"
        );
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(limiters.take("t", limit), Ok(()));
    }
}
