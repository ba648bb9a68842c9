//! The shape of one step of a listener's request path: a tower `Service` that is always ready,
//! never fails (a refusal is an answer, not an error), clones cheaply (it holds `Arc`s) and runs
//! on any worker.
//!
//! A step is written as an `async fn (state, next, request) -> answer` and made a layer by
//! `step::layer!` (the innermost step, with no next, by `step::service!`), so a stack is
//! statically typed: per request the state (`Arc`s) and the next step are cloned into the step's
//! future, and nothing is boxed or allocated. The future is the `async fn`'s own, wrapped in [`Answering`]
//! rather than awaited inside an `async` block: a block that captured it would hold it twice
//! over (as the captured value and as the value awaited), and stacks nest.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tower::Service;

/// One step of a request path taking `R`.
pub(crate) trait Step<R>:
    Service<R, Error = Infallible, Future: Send> + Clone + Send + Sync + 'static
{
}

impl<R, S> Step<R> for S
where
    S: Service<R, Error = Infallible> + Clone + Send + Sync + 'static,
    S::Future: Send,
{
}

/// The layer of a step: `step!(state, step)`, where `step(state, next, request)` answers each
/// request, `next` being the rest of the stack; `state` (`Arc`s) and `next` are cloned for each
/// request. Used inside a step's `fn layer<S>`.
///
/// A macro, not a generic function: the layer is a closure of the step's own `fn layer<S>`, so
/// its type names the next step's type once. A helper function's closure (or a struct holding
/// the step) would name it once more for each of its type parameters that contains it (the
/// step function `step::<S>` itself, its future), and a stack nests a dozen steps: the types,
/// and their debug info, grow as a power of the depth.
macro_rules! layer {
    ($state:expr, $step:expr) => {{
        let state = $state;
        ::tower::layer::layer_fn(move |next| {
            let next = $crate::http::step::Next::new(next);
            let state = ::std::clone::Clone::clone(&state);
            ::tower::service_fn(move |request| {
                $crate::http::step::Answering::new($step(
                    ::std::clone::Clone::clone(&state),
                    ::std::clone::Clone::clone(&next),
                    request,
                ))
            })
        })
    }};
}
pub(crate) use layer;

/// The innermost step of a stack: `service!(state, step)`, where `step(state, request)` answers
/// each request; `state` is cloned for each.
macro_rules! service {
    ($state:expr, $step:expr) => {{
        let state = $state;
        ::tower::service_fn(move |request| {
            $crate::http::step::Answering::new($step(::std::clone::Clone::clone(&state), request))
        })
    }};
}
pub(crate) use service;

/// The rest of a stack, as a step holds it: shared, so that a request's clone of it is one
/// `Arc`, not a copy of every step below (each holding the rest in turn: a stack of `n` steps
/// cloned `n²/2` `Arc`s per request).
#[derive(Debug)]
pub(crate) struct Next<S>(std::sync::Arc<S>);

impl<S> Next<S> {
    pub(crate) fn new(next: S) -> Self {
        Self(std::sync::Arc::new(next))
    }
}

impl<S> Clone for Next<S> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<S: Service<R> + Clone, R> Service<R> for Next<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Steps are always ready (see [`Step`]).
        Poll::Ready(Ok(()))
    }

    // Inlined, so the step's future is built where `Oneshot` keeps it: returned from a call,
    // it would be copied there whole (the rest of the stack's future, at every step).
    #[inline(always)]
    fn call(&mut self, request: R) -> S::Future {
        // The step's own clone holds its state and a `Next`: two `Arc`s.
        S::clone(&self.0).call(request)
    }
}

pin_project_lite::pin_project! {
    /// A step's future: its `async fn`'s, whose answer is never an error.
    #[derive(Debug)]
    pub(crate) struct Answering<F> {
        #[pin]
        step: F,
    }
}

impl<F> Answering<F> {
    pub(crate) fn new(step: F) -> Self {
        Self { step }
    }
}

impl<F: Future> Future for Answering<F> {
    type Output = Result<F::Output, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().step.poll(cx).map(Ok)
    }
}

/// The future of `service` answering `request`, boxed where it starts: a step that takes a rare
/// path holds a pointer, not the rest of the stack's future, and the listener's own future is
/// never built on the stack and copied (`docs/perf-levers.md`).
///
/// Written into the box by a function that takes the box's memory: only the service and the
/// request are stored there, the future's other states left as they are. Returning the
/// `Oneshot` into the box left it to the optimizer to aim the return at the heap; when it did
/// not, every call copied the whole future (`docs/perf-levers.md`).
pub(crate) fn boxed<S: Service<R>, R>(
    service: S,
    request: R,
) -> Pin<Box<tower::util::Oneshot<S, R>>> {
    Box::into_pin(start_in(Box::new_uninit(), service, request))
}

#[inline(never)]
fn start_in<S: Service<R>, R>(
    slot: Box<std::mem::MaybeUninit<tower::util::Oneshot<S, R>>>,
    service: S,
    request: R,
) -> Box<tower::util::Oneshot<S, R>> {
    Box::write(slot, tower::ServiceExt::oneshot(service, request))
}

/// A step's answer: steps never fail.
pub(crate) fn answer<T>(result: Result<T, Infallible>) -> T {
    match result {
        Ok(t) => t,
        Err(never) => match never {},
    }
}
