//! Whether a connection is carrying anything: requests in flight, counted until their response
//! body is done, and when the last one finished. The accept loop closes connections idle past
//! the listener's `idle_timeout`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Response;
use tokio::time::Instant;

use super::observed::{BodyEnd, Observed, Observer, OnEnd};

/// One connection's activity.
#[derive(Clone, Debug)]
pub struct Activity(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    opened: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds after `opened` when the connection last finished a request.
    last_ms: AtomicU64,
}

impl Activity {
    pub fn new() -> Self {
        Self(Arc::new(Inner {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
        }))
    }

    /// A request started; it is in flight until the guard drops.
    pub fn begin(&self) -> Busy {
        self.0.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    /// Resolves once nothing has been in flight for `idle`.
    pub async fn idle_for(&self, idle: Duration) {
        loop {
            let last =
                self.0.opened + Duration::from_millis(self.0.last_ms.load(Ordering::Acquire));
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
pub struct Busy(Activity);

impl Drop for Busy {
    fn drop(&mut self) {
        let inner = &self.0 .0;
        let ms = u64::try_from(inner.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        inner.last_ms.store(ms, Ordering::Release);
        inner.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request in flight until it is done or dropped.
pub type Tracked<B> = Observed<B, Busy>;

/// The request is done when its response body is: `Busy` is dropped then.
impl OnEnd for Busy {
    fn end(self, _: BodyEnd) {}
}

impl<D> Observer<D> for Busy {}

pin_project_lite::pin_project! {
    /// A response on its way: the request is in flight from the call until its body is done.
    pub struct TrackedFuture<F> {
        #[pin]
        inner: F,
        busy: Option<Busy>,
    }
}

impl<F> TrackedFuture<F> {
    pub fn new(inner: F, busy: Busy) -> Self {
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
        let busy = activity.begin();
        let idle = activity.idle_for(Duration::from_secs(1));
        tokio::pin!(idle);
        let early = tokio::time::timeout(Duration::from_secs(5), idle.as_mut()).await;
        assert!(early.is_err(), "a request in flight is not idle");
        drop(busy);
        let started = Instant::now();
        idle.await;
        assert!(started.elapsed() >= Duration::from_secs(1));
    }
}
