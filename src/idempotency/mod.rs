//! `idempotency-key`: no task runs twice because of us. The first request with a key runs; a
//! concurrent duplicate joins it and gets its outcome; a later one gets the stored response
//! (`reach-replayed: true`). Used by the inbound side for peers' retries and by the outbound
//! side for the local agent's own repeated calls. A key belongs to one caller and capability,
//! and to one request: the same key with another method, path or body is refused (422), never
//! answered with someone else's response. Bounded in keys, age, bytes, and per caller.

mod record;
mod stored;
mod table;

use std::sync::Arc;

use http::request::Parts;
use http::{HeaderMap, Response};
use tokio::sync::watch;

pub(crate) use stored::Stored;
pub(crate) use table::{Budget, IdempotencyTable, TableUsage, Ticket};

use crate::error::ReachError;
use crate::http::upload::Upload;
use crate::http::ReachBody;

pub(crate) const HEADER: http::HeaderName = http::HeaderName::from_static("idempotency-key");
pub(crate) const REPLAYED: http::HeaderName = http::HeaderName::from_static("reach-replayed");

type Outcome = Option<Arc<Stored>>;

/// What identifies one request under a key: method, path and query, and the body.
pub(crate) type Fingerprint = [u8; 32];

/// What a request with a key must do.
#[derive(Debug)]
pub(crate) enum Claim {
    /// Run it; the ticket records the outcome.
    First(Ticket),
    /// The same key is running: wait for its outcome.
    Joined(watch::Receiver<Outcome>),
    Replay(Arc<Stored>),
    Conflict,
    /// The key came back with a different request.
    Mismatch,
    /// The caller's share of keys is all running tasks: no room without forgetting one.
    Busy,
}

/// The fingerprint of a request: method, path and query, and its body — or, for a body too
/// large to buffer, its declared length.
pub(crate) fn fingerprint<B>(head: &Parts, upload: &Upload<B>) -> Fingerprint {
    let path = head.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
    hash.update(head.method.as_str().as_bytes());
    hash.update(&[0]);
    hash.update(path.as_bytes());
    hash.update(&[0]);
    match upload {
        Upload::Buffered(bytes) => {
            hash.update(&[1]);
            hash.update(bytes);
        }
        Upload::Stream(_, length) => {
            hash.update(&[2]);
            hash.update(&length.unwrap_or(u64::MAX).to_be_bytes());
        }
    }
    let mut fingerprint = [0u8; 32];
    fingerprint.copy_from_slice(hash.finish().as_ref());
    fingerprint
}

/// The request's `idempotency-key`, when it has a usable one.
pub(crate) fn key_of(headers: &HeaderMap) -> Option<String> {
    let key = headers.get(HEADER)?.to_str().ok()?.trim();
    (!key.is_empty() && key.len() <= 256).then(|| key.to_owned())
}

/// Answers from a claim: the stored response, the joined original's, or a conflict.
pub(crate) async fn answer(claim: Claim) -> Response<ReachBody> {
    match claim {
        Claim::First(_) | Claim::Conflict => conflict(),
        Claim::Mismatch => ReachError::IdempotencyMismatch.into_response(),
        Claim::Busy => ReachError::IdempotencyBusy.into_response(),
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
    use crate::http::body;
    use http::StatusCode;
    use http_body_util::BodyExt;
    use std::time::Duration;

    const FP: Fingerprint = [0; 32];

    fn budget(max_keys: usize, max_body: usize) -> Budget {
        Budget {
            max_keys,
            ttl: Duration::from_secs(600),
            max_body,
            max_total_bytes: 1 << 20,
            per_caller_share: 1.0,
        }
    }

    fn table(max_keys: usize, max_body: usize) -> Arc<IdempotencyTable> {
        IdempotencyTable::new(budget(max_keys, max_body))
    }

    async fn run_first(table: &Arc<IdempotencyTable>, text: &'static str) -> String {
        let Claim::First(ticket) = table.claim("me", "c", "k", FP) else {
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
        let table = table(10, 1024);
        assert_eq!(run_first(&table, "done").await, "done");
        let Claim::Replay(stored) = table.claim("me", "c", "k", FP) else {
            panic!("not stored")
        };
        let r = stored.replay();
        assert_eq!(r.headers()[REPLAYED], "true");
    }

    #[tokio::test]
    async fn a_concurrent_duplicate_joins_the_original() {
        let table = table(10, 1024);
        let Claim::First(ticket) = table.claim("me", "c", "k", FP) else {
            panic!("not first")
        };
        let joined = tokio::spawn(answer(table.claim("me", "c", "k", FP)));
        let response = ticket.record(Response::new(body::full("once")));
        let _ = response.into_body().collect().await;
        let replay = joined.await.ok().map(|r| r.status());
        assert_eq!(replay, Some(StatusCode::OK));
    }

    #[tokio::test]
    async fn a_response_too_large_to_keep_makes_duplicates_conflicts() {
        let table = table(10, 2);
        run_first(&table, "too long").await;
        assert!(matches!(table.claim("me", "c", "k", FP), Claim::Conflict));
    }

    #[tokio::test]
    async fn a_ticket_dropped_before_a_response_frees_the_key() {
        let table = table(10, 1024);
        let first = table.claim("me", "c", "k", FP);
        drop(first);
        assert!(matches!(table.claim("me", "c", "k", FP), Claim::First(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn keys_expire_and_the_table_is_bounded() {
        let table = IdempotencyTable::new(Budget {
            ttl: Duration::from_secs(60),
            ..budget(2, 1024)
        });
        run_first(&table, "x").await;
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(
            matches!(table.claim("me", "c", "k", FP), Claim::First(_)),
            "expired"
        );
        // Two completed keys fill the table; a third evicts the oldest.
        run_first(&table, "x").await;
        let Claim::First(b) = table.claim("me", "c", "b", FP) else {
            panic!("not first")
        };
        let _ = b
            .record(Response::new(body::full("b")))
            .into_body()
            .collect()
            .await;
        let _c = table.claim("me", "c", "c", FP);
        assert!(matches!(table.claim("me", "c", "b", FP), Claim::Replay(_)));
        assert!(
            matches!(table.claim("me", "c", "k", FP), Claim::First(_)),
            "the oldest completed key made room for c"
        );
    }
}
