//! Admission for the local agent: at most `max_concurrency` requests at once, a bounded FIFO queue
//! behind them, and an immediate refusal when both are full.
//!
//! Why refuse at once instead of queueing without bound: a caller's sidecar that hears
//! `503 saturated` moves to another agent now; one that waits discovers the same thing only after
//! its timeout, and the work piles up here until it melts down.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

/// The limits in force for one request (read from the current config snapshot).
#[derive(Clone, Copy, Debug)]
pub(crate) struct AdmissionLimits {
    pub(crate) max_concurrency: usize,
    pub(crate) queue_capacity: usize,
    pub(crate) max_wait: Duration,
}

/// Why a request was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Every slot busy and the queue full.
    Full,
    /// Queued, but no slot freed up within `max_wait`.
    WaitedTooLong,
}

#[derive(Debug, Default)]
pub(crate) struct Admission {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    limit: usize,
    in_flight: usize,
    waiters: VecDeque<Waiter>,
    next_id: u64,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    grant: oneshot::Sender<Slot>,
}

/// A concurrency slot; the agent is considered busy with this request until it is dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    admission: Option<Arc<Admission>>,
}

/// The current load, for gauges and `/status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Load {
    pub in_flight: usize,
    pub queued: usize,
    pub(crate) limit: usize,
}

// === impl Admission ===

impl Admission {
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                limit,
                ..State::default()
            }),
        })
    }

    /// Takes a slot now, or waits in the queue for one, or refuses.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        limits: AdmissionLimits,
    ) -> Result<Slot, Refusal> {
        let (id, mut granted) = {
            let mut state = self.lock();
            if state.limit != limits.max_concurrency {
                // Hot-reloaded profile: a higher limit may free waiters at once.
                state.limit = limits.max_concurrency;
                self.grant_waiting(&mut state);
            }
            if state.in_flight < state.limit && state.waiters.is_empty() {
                state.in_flight += 1;
                return Ok(Slot {
                    admission: Some(self.clone()),
                });
            }
            if state.waiters.len() >= limits.queue_capacity {
                return Err(Refusal::Full);
            }
            let (grant, granted) = oneshot::channel();
            let id = state.next_id;
            state.next_id += 1;
            state.waiters.push_back(Waiter { id, grant });
            (id, granted)
        };
        // Leaves the queue if this request is cancelled while waiting.
        let _leave = LeaveQueue {
            admission: self,
            id,
        };
        match tokio::time::timeout(limits.max_wait, &mut granted).await {
            Ok(Ok(slot)) => Ok(slot),
            Ok(Err(_)) => Err(Refusal::WaitedTooLong),
            Err(_) => {
                // A slot may have been granted just as the wait ran out: take it rather than waste it.
                let still_queued = self.lock().waiters.iter().any(|w| w.id == id);
                match granted.try_recv() {
                    Ok(slot) if !still_queued => Ok(slot),
                    _ => Err(Refusal::WaitedTooLong),
                }
            }
        }
    }

    pub(crate) fn load(&self) -> Load {
        let state = self.lock();
        Load {
            in_flight: state.in_flight,
            queued: state.waiters.len(),
            limit: state.limit,
        }
    }

    fn release(self: &Arc<Self>) {
        let mut state = self.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        self.grant_waiting(&mut state);
    }

    /// Hands free slots to waiters in arrival order, skipping any that stopped waiting.
    fn grant_waiting(self: &Arc<Self>, state: &mut State) {
        while state.in_flight < state.limit {
            let Some(waiter) = state.waiters.pop_front() else {
                break;
            };
            state.in_flight += 1;
            if let Err(mut slot) = waiter.grant.send(Slot {
                admission: Some(self.clone()),
            }) {
                // The waiter is gone; defuse the slot so its drop does not re-enter this lock.
                slot.admission = None;
                state.in_flight -= 1;
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere; the counters are still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct LeaveQueue<'a> {
    admission: &'a Arc<Admission>,
    id: u64,
}

impl Drop for LeaveQueue<'_> {
    fn drop(&mut self) {
        self.admission.lock().waiters.retain(|w| w.id != self.id);
    }
}

// === impl Slot ===

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(admission) = self.admission.take() {
            admission.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_concurrency: usize, queue_capacity: usize) -> AdmissionLimits {
        AdmissionLimits {
            max_concurrency,
            queue_capacity,
            max_wait: Duration::from_secs(1),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refuses_at_once_when_slots_and_queue_are_full() {
        let a = Admission::new(1);
        let first = a.acquire(limits(1, 1)).await;
        assert!(first.is_ok());
        let a2 = a.clone();
        let queued = tokio::spawn(async move { a2.acquire(limits(1, 1)).await.map(|_| ()) });
        tokio::task::yield_now().await;
        assert_eq!(a.load().queued, 1);
        assert_eq!(a.acquire(limits(1, 1)).await.err(), Some(Refusal::Full));
        drop(first);
        assert_eq!(queued.await.ok(), Some(Ok(())));
        assert_eq!(
            a.load(),
            Load {
                in_flight: 0,
                queued: 0,
                limit: 1
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_queued_request_gives_up_after_max_wait() {
        let a = Admission::new(1);
        let _held = a.acquire(limits(1, 4)).await;
        let refused = a.acquire(limits(1, 4)).await.err();
        assert_eq!(refused, Some(Refusal::WaitedTooLong));
        assert_eq!(a.load().queued, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_leaves_the_queue_and_frees_nothing_twice() {
        let a = Admission::new(1);
        let held = a.acquire(limits(1, 4)).await;
        let a2 = a.clone();
        let waiter = tokio::spawn(async move { a2.acquire(limits(1, 4)).await.map(|_| ()) });
        tokio::task::yield_now().await;
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(a.load().queued, 0);
        drop(held);
        assert_eq!(a.load().in_flight, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn raising_the_limit_admits_waiters() {
        let a = Admission::new(1);
        let _held = a.acquire(limits(1, 4)).await;
        let a2 = a.clone();
        let waiter = tokio::spawn(async move { a2.acquire(limits(1, 4)).await.map(|_| ()) });
        tokio::task::yield_now().await;
        let _second = a.acquire(limits(3, 4)).await;
        assert_eq!(waiter.await.ok(), Some(Ok(())));
    }
}
