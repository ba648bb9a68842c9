//! `idempotency-key`: no task runs twice because of us. The first request with a key runs; a
//! concurrent duplicate joins it and gets its outcome; a later one gets the stored response
//! (`reach-replayed: true`). Used by the inbound side for peers' retries and by the outbound
//! side for the local agent's own repeated calls. Bounded in keys, age and stored body size.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::ReachError;
use crate::http::{body, BoxError, ReachBody};

pub const HEADER: &str = "idempotency-key";
pub const REPLAYED: &str = "reach-replayed";

/// A response kept for replay.
#[derive(Debug)]
pub struct Stored {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

type Outcome = Option<Arc<Stored>>;
type Key = (String, String);

#[derive(Debug)]
enum Slot {
    Running(watch::Sender<Outcome>),
    Done(Arc<Stored>),
    /// Ran, but its response was too large to keep: a duplicate must not run it again.
    TooLarge,
}

/// What a request with a key must do.
#[derive(Debug)]
pub enum Claim {
    /// Run it; the ticket records the outcome.
    First(Ticket),
    /// The same key is running: wait for its outcome.
    Joined(watch::Receiver<Outcome>),
    Replay(Arc<Stored>),
    Conflict,
}

#[derive(Debug)]
pub struct IdempotencyTable {
    inner: Mutex<Inner>,
    capacity: usize,
    ttl: Duration,
    max_body: usize,
}

#[derive(Debug, Default)]
struct Inner {
    slots: HashMap<Key, (Slot, Instant)>,
    order: VecDeque<(Key, Instant)>,
}

impl IdempotencyTable {
    pub fn new(capacity: usize, ttl: Duration, max_body: usize) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::default(),
            capacity: capacity.max(1),
            ttl,
            max_body,
        })
    }

    pub fn claim(self: &Arc<Self>, capability: &str, key: &str) -> Claim {
        let now = Instant::now();
        let key = (capability.to_owned(), key.to_owned());
        let mut inner = self.lock();
        self.expire(&mut inner, now);
        if let Some((slot, _)) = inner.slots.get(&key) {
            return match slot {
                Slot::Running(tx) => Claim::Joined(tx.subscribe()),
                Slot::Done(stored) => Claim::Replay(stored.clone()),
                Slot::TooLarge => Claim::Conflict,
            };
        }
        while inner.slots.len() >= self.capacity {
            let Some((oldest, _)) = inner.order.pop_front() else {
                break;
            };
            inner.slots.remove(&oldest);
        }
        let (tx, _) = watch::channel(None);
        inner.slots.insert(key.clone(), (Slot::Running(tx), now));
        inner.order.push_back((key.clone(), now));
        if inner.order.len() > 2 * self.capacity {
            // Freed keys leave stale entries behind; keep the queue in proportion to the table.
            let Inner { slots, order } = &mut *inner;
            order.retain(|(k, at)| slots.get(k).is_some_and(|(_, t)| t == at));
        }
        Claim::First(Ticket {
            table: self.clone(),
            key: Some(key),
        })
    }

    /// Drops entries older than the TTL (the order queue is by insertion time).
    fn expire(&self, inner: &mut Inner, now: Instant) {
        while inner
            .order
            .front()
            .is_some_and(|(_, at)| now.saturating_duration_since(*at) >= self.ttl)
        {
            let Some((key, at)) = inner.order.pop_front() else {
                break;
            };
            if inner
                .slots
                .get(&key)
                .is_some_and(|(_, inserted)| *inserted == at)
            {
                inner.slots.remove(&key);
            }
        }
    }

    fn settle(&self, key: &Key, slot: Option<Slot>) {
        // What waiters learn follows from the new slot itself; no second look in the table.
        let outcome = match &slot {
            Some(Slot::Done(stored)) => Some(stored.clone()),
            _ => None,
        };
        let mut inner = self.lock();
        let previous = match slot {
            Some(slot) => inner
                .slots
                .get_mut(key)
                .map(|entry| std::mem::replace(&mut entry.0, slot)),
            None => inner.slots.remove(key).map(|(slot, _)| slot),
        };
        drop(inner);
        if let Some(Slot::Running(tx)) = previous {
            let _ = tx.send(outcome);
        }
    }

    /// Tells those waiting on `key` the outcome, then frees the key.
    fn settle_passing(&self, key: &Key, stored: Arc<Stored>) {
        let previous = self.lock().slots.remove(key).map(|(slot, _)| slot);
        if let Some(Slot::Running(tx)) = previous {
            let _ = tx.send(Some(stored));
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The right to run a keyed request. Dropped without an outcome (the request failed before a
/// response, or was cancelled), it frees the key: nothing is known to have run.
#[derive(Debug)]
pub struct Ticket {
    table: Arc<IdempotencyTable>,
    key: Option<Key>,
}

impl Ticket {
    /// Waits on this ticket's outcome, like a duplicate would.
    pub fn subscribe(&self) -> Claim {
        let inner = self.table.lock();
        match self.key.as_ref().and_then(|k| inner.slots.get(k)) {
            Some((Slot::Running(tx), _)) => Claim::Joined(tx.subscribe()),
            _ => Claim::Conflict,
        }
    }

    /// Settles the key with the original's response, driving its body to the end. A response the
    /// sidecar made itself (it carries `reach-reason`: the agent was never reached, or gave no
    /// answer) is passed to those waiting but not kept: a later retry may run the task.
    pub async fn settle(mut self, response: Response<ReachBody>) {
        use http_body_util::BodyExt;
        if response
            .headers()
            .contains_key(crate::http::headers::REASON)
        {
            let (parts, body) = response.into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let stored = Arc::new(Stored {
                status: parts.status,
                headers: parts.headers,
                body,
            });
            if let Some(key) = self.key.take() {
                self.table.settle_passing(&key, stored);
            }
            return;
        }
        let _ = self.record(response).into_body().collect().await;
    }

    /// Streams `response` to the caller while keeping a copy for duplicates.
    pub fn record<B>(mut self, response: Response<B>) -> Response<ReachBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let (parts, inner) = response.into_parts();
        let head = (parts.status, parts.headers.clone());
        let max = self.table.max_body;
        let tee = Tee {
            inner,
            buffer: Some(BytesMut::new()),
            max,
            head: Some(head),
            ticket: self.key.take().map(|k| (self.table.clone(), k)),
        };
        Response::from_parts(parts, body::boxed(tee))
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.table.settle(&key, None);
        }
    }
}

pin_project_lite::pin_project! {
    /// Passes a body through, copying it (up to `max`) into the table when it ends.
    struct Tee<B> {
        #[pin]
        inner: B,
        buffer: Option<BytesMut>,
        max: usize,
        head: Option<(StatusCode, HeaderMap)>,
        ticket: Option<(Arc<IdempotencyTable>, Key)>,
    }

    impl<B> PinnedDrop for Tee<B> {
        fn drop(this: Pin<&mut Self>) {
            // Abandoned mid-stream: the task ran, but we cannot replay it.
            if let Some((table, key)) = this.project().ticket.take() {
                table.settle(&key, Some(Slot::TooLarge));
            }
        }
    }
}

impl<B> Body for Tee<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let (Some(data), Some(buffer)) = (frame.data_ref(), this.buffer.as_mut()) {
                if buffer.len() + data.len() <= *this.max {
                    buffer.extend_from_slice(data);
                } else {
                    *this.buffer = None;
                }
            }
        }
        // hyper stops polling once a body says it has ended: settle on the last frame, too.
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            _ => false,
        };
        if ended {
            if let Some((table, key)) = this.ticket.take() {
                let slot = match (this.buffer.take(), this.head.take()) {
                    (Some(buffer), Some((status, headers))) => Slot::Done(Arc::new(Stored {
                        status,
                        headers,
                        body: buffer.freeze(),
                    })),
                    _ => Slot::TooLarge,
                };
                table.settle(&key, Some(slot));
            }
        }
        polled.map(|f| f.map(|r| r.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Stored {
    pub fn replay(&self) -> Response<ReachBody> {
        let mut response = Response::new(body::full(self.body.clone()));
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers.clone();
        response
            .headers_mut()
            .insert(REPLAYED, http::HeaderValue::from_static("true"));
        response
    }
}

/// The request's `idempotency-key`, when it has a usable one.
pub fn key_of(headers: &HeaderMap) -> Option<String> {
    let key = headers.get(HEADER)?.to_str().ok()?.trim();
    (!key.is_empty() && key.len() <= 256).then(|| key.to_owned())
}

/// Answers from a claim: the stored response, the joined original's, or a conflict.
pub async fn answer(claim: Claim) -> Response<ReachBody> {
    match claim {
        Claim::First(_) | Claim::Conflict => conflict(),
        Claim::Replay(stored) => stored.replay(),
        Claim::Joined(mut rx) => {
            let outcome = loop {
                if let Some(stored) = rx.borrow().clone() {
                    break Some(stored);
                }
                if rx.changed().await.is_err() {
                    break rx.borrow().clone();
                }
            };
            outcome.map_or_else(conflict, |stored| stored.replay())
        }
    }
}

fn conflict() -> Response<ReachBody> {
    ReachError::IdempotencyConflict.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn run_first(table: &Arc<IdempotencyTable>, text: &'static str) -> String {
        let Claim::First(ticket) = table.claim("c", "k") else {
            panic!("not first")
        };
        let response = ticket.record(Response::new(body::full(text)));
        let bytes = response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[tokio::test]
    async fn a_later_duplicate_gets_the_stored_response() {
        let table = IdempotencyTable::new(10, Duration::from_secs(60), 1024);
        assert_eq!(run_first(&table, "done").await, "done");
        let Claim::Replay(stored) = table.claim("c", "k") else {
            panic!("not stored")
        };
        let r = stored.replay();
        assert_eq!(r.headers()[REPLAYED], "true");
    }

    #[tokio::test]
    async fn a_concurrent_duplicate_joins_the_original() {
        let table = IdempotencyTable::new(10, Duration::from_secs(60), 1024);
        let Claim::First(ticket) = table.claim("c", "k") else {
            panic!("not first")
        };
        let joined = tokio::spawn(answer(table.claim("c", "k")));
        let response = ticket.record(Response::new(body::full("once")));
        let _ = response.into_body().collect().await;
        let replay = joined.await.ok().map(|r| r.status());
        assert_eq!(replay, Some(StatusCode::OK));
    }

    #[tokio::test]
    async fn a_response_too_large_to_keep_makes_duplicates_conflicts() {
        let table = IdempotencyTable::new(10, Duration::from_secs(60), 2);
        run_first(&table, "too long").await;
        assert!(matches!(table.claim("c", "k"), Claim::Conflict));
    }

    #[tokio::test]
    async fn a_ticket_dropped_before_a_response_frees_the_key() {
        let table = IdempotencyTable::new(10, Duration::from_secs(60), 1024);
        let first = table.claim("c", "k");
        drop(first);
        assert!(matches!(table.claim("c", "k"), Claim::First(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn keys_expire_and_the_table_is_bounded() {
        let table = IdempotencyTable::new(2, Duration::from_secs(60), 1024);
        run_first(&table, "x").await;
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(matches!(table.claim("c", "k"), Claim::First(_)), "expired");
        let _a = table.claim("c", "a");
        let _b = table.claim("c", "b");
        assert!(table.lock().slots.len() <= 2);
    }
}
