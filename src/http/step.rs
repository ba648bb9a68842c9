//! The shape of one step of a listener's request path: a tower `Service` that is always ready,
//! never fails (a refusal is an answer, not an error), clones cheaply (it holds `Arc`s) and runs
//! on any worker. Steps are built with `tower::layer::layer_fn` and `tower::service_fn` around an
//! `async fn`, so a stack is statically typed: no boxed service or future per request.

use std::convert::Infallible;

use tower::Service;

/// One step of a request path taking `R`.
pub trait Step<R>: Service<R, Error = Infallible, Future: Send> + Clone + Send + 'static {}

impl<R, S> Step<R> for S
where
    S: Service<R, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
}

/// A step's answer: steps never fail.
pub fn answer<T>(result: Result<T, Infallible>) -> T {
    match result {
        Ok(t) => t,
        Err(never) => match never {},
    }
}
