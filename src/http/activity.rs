//! Whether a connection is carrying anything: requests in flight, counted until their response
//! body is done, and when the last one finished. The accept loop closes connections idle past
//! the listener's `idle_timeout`, and an HTTP/1 connection whose next head has not arrived
//! within `header_read_timeout` (the slowloris guard: see [`Activity::quiet_for`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Response;
use tokio::time::Instant;

use super::observed::{BodyEnd, Observed, Observer, OnEnd};

/// One connection's activity.
#[derive(Clone, Debug)]
pub(crate) struct Activity(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    opened: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds after `opened` when the connection last finished a request, plus one: zero
    /// until it has finished one.
    last_ms: AtomicU64,
    /// The connection has carried an h2 request: no HTTP/1 head is being read between requests.
    multiplexed: AtomicBool,
}

impl Activity {
    pub(crate) fn new() -> Self {
        Self(Arc::new(Inner {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
            multiplexed: AtomicBool::new(false),
        }))
    }

    /// A request started; it is in flight until the guard drops.
    pub(crate) fn begin(&self) -> Busy {
        self.0.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    /// No request has begun on the connection yet: closing it loses nothing.
    pub(crate) fn never_asked(&self) -> bool {
        self.0.in_flight.load(Ordering::Acquire) == 0 && self.0.last_ms.load(Ordering::Acquire) == 0
    }

    /// The connection speaks h2 (seen on its first request).
    pub(crate) fn multiplexed(&self) {
        if !self.0.multiplexed.load(Ordering::Relaxed) {
            self.0.multiplexed.store(true, Ordering::Relaxed);
        }
    }

    /// Resolves once nothing has been in flight for `idle`, or for `header_read` while the
    /// connection may be an HTTP/1 one. An HTTP/1 connection with nothing in flight is waiting
    /// for its next head, so this is its header-read deadline: from the connection's opening or
    /// its last answer until the next head is in. It replaces hyper's own `header_read_timeout`,
    /// which armed and dropped a timer on every request (`docs/perf-levers.md`); this one sleeps once per quiet period.
    pub(crate) async fn quiet_for(&self, header_read: Duration, idle: Duration) {
        loop {
            let idle = match self.0.multiplexed.load(Ordering::Relaxed) {
                true => idle,
                false => header_read.min(idle),
            };
            let ms = self.0.last_ms.load(Ordering::Acquire).saturating_sub(1);
            let last = self.0.opened + Duration::from_millis(ms);
            let busy = self.0.in_flight.load(Ordering::Acquire) > 0;
            if !busy && Instant::now() >= last + idle {
                return;
            }
            let until = if busy {
                Instant::now() + idle
            } else {
                last + idle
            };
            tokio::time::sleep_until(until).await;
        }
    }
}

impl Default for Activity {
    fn default() -> Self {
        Self::new()
    }
}

/// A request in flight on its connection.
#[derive(Debug)]
pub(crate) struct Busy(Activity);

impl Drop for Busy {
    fn drop(&mut self) {
        let inner = &self.0 .0;
        let ms = u64::try_from(inner.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        inner.last_ms.store(ms.saturating_add(1), Ordering::Release);
        inner.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request in flight until it is done or dropped.
pub(crate) type Tracked<B> = Observed<B, Busy>;

/// The request is done when its response body is: `Busy` is dropped then.
impl OnEnd for Busy {
    fn end(self, _: BodyEnd) {}
}

impl<D> Observer<D> for Busy {}

pin_project_lite::pin_project! {
    /// A response on its way: the request is in flight from the call until its body is done.
    pub(crate) struct TrackedFuture<F> {
        #[pin]
        inner: F,
        busy: Option<Busy>,
    }
}

impl<F> TrackedFuture<F> {
    pub(crate) fn new(inner: F, busy: Busy) -> Self {
        Self {
            inner,
            busy: Some(busy),
        }
    }
}

impl<F, B, E> Future for TrackedFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<Tracked<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx));
        let busy = this.busy.take();
        Poll::Ready(response.map(|r| r.map(|inner| Observed::maybe(inner, busy))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_only_after_the_last_request_is_done() {
        let activity = Activity::new();
        assert!(activity.never_asked());
        let busy = activity.begin();
        assert!(!activity.never_asked());
        let idle = activity.quiet_for(Duration::from_secs(1), Duration::from_secs(1));
        tokio::pin!(idle);
        let early = tokio::time::timeout(Duration::from_secs(5), idle.as_mut()).await;
        assert!(early.is_err(), "a request in flight is not idle");
        drop(busy);
        assert!(!activity.never_asked(), "it has answered one");
        let started = Instant::now();
        idle.await;
        assert!(started.elapsed() >= Duration::from_secs(1));
    }

    /// HTTP/1 waits for its next head for the header-read time; h2 has no head to wait for, so
    /// only the idle time counts.
    #[tokio::test(start_paused = true)]
    async fn the_header_read_time_bounds_http1_only() {
        let (head, idle) = (Duration::from_secs(1), Duration::from_secs(10));
        let http1 = Activity::new();
        drop(http1.begin());
        let started = Instant::now();
        http1.quiet_for(head, idle).await;
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        let h2 = Activity::new();
        h2.multiplexed();
        drop(h2.begin());
        let started = Instant::now();
        h2.quiet_for(head, idle).await;
        assert!(started.elapsed() >= idle, "{:?}", started.elapsed());
    }
}
