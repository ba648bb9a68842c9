//! The waker a pooled connection registers everywhere inside hyper (socket readiness, the request
//! channel, the response promise, the body channel's want). It wakes the task now using the
//! connection — except while that task is inside [`Wakes::drive`], where the wake is only noted
//! and the loop goes round again. Sending a request, fulfilling the promise and asking for body
//! data are all done by the connection, polled by that same loop: without the guard each would
//! wake the task that is already running, for one more poll of everything.
//!
//! A locked instruction costs ~18 ordinary ones (`docs/perf-levers.md`, "What the count does not
//! price"), so a round of the loop takes one (the swap that leaves it), and the task's waker is
//! stored under the lock only when the task changes: once per request, not once per round.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// Rounds of the loop before falling back to an ordinary self-wake.
const ROUNDS: usize = 8;

/// `Guard::state`: the task is inside the loop.
const POLLING: u8 = 1;
/// `Guard::state`: the connection was woken since the round began.
const WOKEN: u8 = 2;

/// A connection's wakes: the guard hyper holds (as `waker`) and the task registered in it.
pub(super) struct Wakes {
    guard: Arc<Guard>,
    waker: Waker,
}

#[derive(Default)]
struct Guard {
    task: Mutex<Option<Waker>>,
    state: AtomicU8,
    /// Which task's waker `task` holds: its data and vtable addresses, what `Waker::will_wake`
    /// compares; zero for none (no waker has a null vtable). The clone in `task` keeps that
    /// task alive, so no other task can have the same. Written only by the connection's holder
    /// (`&mut Wakes`), so relaxed: plain loads and stores, no locked instruction. Here, not in
    /// `Wakes`: every pooled connection and the futures that hold one stay their size.
    registered: [AtomicUsize; 2],
}

impl std::task::Wake for Guard {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // One read-modify-write orders this wake against the loop's leaving: either the loop
        // sees WOKEN and goes round again, or this sees it gone and wakes the task.
        if self.state.fetch_or(WOKEN, Ordering::AcqRel) & POLLING == 0 {
            let task = self.task.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(waker) = task.as_ref() {
                waker.wake_by_ref();
            }
        }
    }
}

impl Wakes {
    pub(super) fn new() -> Self {
        let guard = Arc::new(Guard::default());
        Self {
            waker: Waker::from(guard.clone()),
            guard,
        }
    }

    /// Polls `poll` with the connection's waker for the task of `cx`, again while the connection
    /// was woken during a round, until it is ready or nothing more happened.
    // Inlined: its answer is a response or a request given back (~250 bytes), copied out of a
    // call that is not.
    #[inline(always)]
    pub(super) fn drive<T>(
        &mut self,
        cx: &Context<'_>,
        mut poll: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        self.register(cx.waker());
        let mut inner = Context::from_waker(&self.waker);
        for _ in 0..ROUNDS {
            // A plain store: a wake before it finds POLLING clear and wakes the task itself.
            self.guard.state.store(POLLING, Ordering::Release);
            let polled = poll(&mut inner);
            let woken = self.guard.state.swap(0, Ordering::AcqRel) & WOKEN != 0;
            if polled.is_ready() || !woken {
                return polled;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    #[inline(always)]
    fn register(&mut self, task: &Waker) {
        let key = [task.data() as usize, task.vtable() as *const _ as usize];
        let [data, vtable] = &self.guard.registered;
        if data.load(Ordering::Relaxed) != key[0] || vtable.load(Ordering::Relaxed) != key[1] {
            self.register_new(task, key);
        }
    }

    #[cold]
    fn register_new(&mut self, task: &Waker, key: [usize; 2]) {
        *self.guard.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task.clone());
        self.set_registered(key);
    }

    fn set_registered(&mut self, key: [usize; 2]) {
        for (at, value) in self.guard.registered.iter().zip(key) {
            at.store(value, Ordering::Relaxed);
        }
    }

    /// The connection goes idle in the pool: its wakes (a close, the next request being queued
    /// before the next task's first poll) wake nobody.
    pub(super) fn idle(&mut self) {
        *self.guard.task.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.set_registered([0, 0]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    /// A task's waker that counts its wakes.
    #[derive(Default)]
    struct Task(AtomicUsize);

    impl Wake for Task {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn task() -> (Arc<Task>, Waker) {
        let task = Arc::new(Task::default());
        (task.clone(), Waker::from(task))
    }

    #[test]
    fn a_wake_inside_the_loop_polls_again_instead_of_waking_the_task() {
        let mut wakes = Wakes::new();
        let (task, waker) = task();
        let mut rounds = 0;
        let polled = wakes.drive(&Context::from_waker(&waker), |inner| {
            rounds += 1;
            if rounds < 3 {
                inner.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(())
        });
        assert_eq!((polled, rounds), (Poll::Ready(()), 3));
        assert_eq!(
            task.0.load(Ordering::SeqCst),
            0,
            "the running task is not woken"
        );
    }

    #[test]
    fn a_wake_outside_the_loop_wakes_the_task_that_last_drove_it() {
        let mut wakes = Wakes::new();
        let (first, first_waker) = task();
        let (second, second_waker) = task();
        let mut hyper_holds = None;
        let pending = wakes.drive(&Context::from_waker(&first_waker), |inner| {
            hyper_holds = Some(inner.waker().clone());
            Poll::<()>::Pending
        });
        assert!(pending.is_pending());
        let held = hyper_holds.take().expect("polled once");
        held.wake_by_ref();
        assert_eq!(first.0.load(Ordering::SeqCst), 1);

        // The next request's task takes the connection over.
        let _ = wakes.drive(&Context::from_waker(&second_waker), |_| Poll::<()>::Pending);
        held.wake_by_ref();
        assert_eq!(first.0.load(Ordering::SeqCst), 1);
        assert_eq!(second.0.load(Ordering::SeqCst), 1);

        // Idle in the pool: nobody to wake, and the next driver is registered afresh.
        wakes.idle();
        held.wake_by_ref();
        assert_eq!(second.0.load(Ordering::SeqCst), 1);
        let _ = wakes.drive(&Context::from_waker(&second_waker), |_| Poll::<()>::Pending);
        held.wake_by_ref();
        assert_eq!(second.0.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_connection_woken_every_round_yields_after_its_rounds() {
        let mut wakes = Wakes::new();
        let (task, waker) = task();
        let mut rounds = 0;
        let polled = wakes.drive(&Context::from_waker(&waker), |inner| {
            rounds += 1;
            inner.waker().wake_by_ref();
            Poll::<()>::Pending
        });
        assert!(polled.is_pending());
        assert_eq!(rounds, ROUNDS);
        assert_eq!(
            task.0.load(Ordering::SeqCst),
            1,
            "woken once, to be polled again"
        );
    }
}
