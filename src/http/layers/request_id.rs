//! `x-request-id`: kept when the client sent one, made when not (128 random bits in hex, from the
//! thread's generator: no system call, no lock), and set on the response unless the service
//! below already named one.
//!
//! By hand rather than tower-http's `SetRequestId` + `PropagateRequestId`: those keep the id in
//! the request's and the response's extensions too (a map allocated per message, which nothing
//! here reads) and look the header up four times; this looks it up once each way
//! (`docs/performance.md`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response};
use tower::{Layer, Service};

use super::X_REQUEST_ID;

/// A random 32-hex-digit request id.
fn random_id() -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // A byte at a time, two digits each, rather than shifting a `u128` per digit.
    let bytes = rand::random::<u128>().to_le_bytes();
    let mut id = [0u8; 32];
    for (pair, byte) in id.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0xf)];
    }
    // Hex digits are always a valid header value.
    HeaderValue::from_bytes(&id).unwrap_or(HeaderValue::from_static("0"))
}

/// Gives every request an id and every response its request's id.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RequestIdLayer;

impl<S> Layer<S> for RequestIdLayer {
    type Service = RequestId<S>;

    fn layer(&self, inner: S) -> RequestId<S> {
        RequestId { inner }
    }
}

/// See [`RequestIdLayer`].
#[derive(Clone, Debug)]
pub(super) struct RequestId<S> {
    inner: S,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for RequestId<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = Named<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        let id = match req.headers().get(X_REQUEST_ID) {
            Some(id) => id.clone(),
            None => {
                let id = random_id();
                req.headers_mut().insert(X_REQUEST_ID, id.clone());
                id
            }
        };
        Named {
            inner: self.inner.call(req),
            id: Some(id),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`RequestId`].
    #[derive(Debug)]
    pub(super) struct Named<F> {
        #[pin]
        inner: F,
        id: Option<HeaderValue>,
    }
}

impl<F, B, E> Future for Named<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = std::task::ready!(this.inner.poll(cx))?;
        if let Some(id) = this.id.take() {
            response.headers_mut().entry(X_REQUEST_ID).or_insert(id);
        }
        Poll::Ready(Ok(response))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use tower::ServiceExt;

    #[test]
    fn ids_are_32_hex_digits_and_differ() {
        let (a, b) = (random_id(), random_id());
        let a = a.to_str().unwrap_or_default();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(Some(a), b.to_str().ok());
    }

    #[tokio::test]
    async fn a_sent_id_is_kept_and_answered_and_a_missing_one_is_made() {
        let echo = tower::service_fn(|req: Request<()>| async move {
            let seen = req.headers().get(X_REQUEST_ID).cloned();
            let mut res = Response::new(());
            if let Some(seen) = seen {
                res.headers_mut().insert("x-seen", seen);
            }
            Ok::<_, Infallible>(res)
        });
        let svc = RequestIdLayer.layer(echo);
        let sent = Request::builder()
            .header(X_REQUEST_ID, "abc")
            .body(())
            .unwrap_or_default();
        let res = svc.clone().oneshot(sent).await.unwrap_or_default();
        assert_eq!(res.headers()[X_REQUEST_ID], "abc");
        assert_eq!(res.headers()["x-seen"], "abc");
        let res = svc.oneshot(Request::new(())).await.unwrap_or_default();
        assert_eq!(res.headers()[X_REQUEST_ID].len(), 32);
        assert_eq!(res.headers()[X_REQUEST_ID], res.headers()["x-seen"]);
    }

    #[tokio::test]
    async fn an_id_the_service_set_is_not_replaced() {
        let named = tower::service_fn(|_req: Request<()>| async move {
            let mut res = Response::new(());
            res.headers_mut()
                .insert(X_REQUEST_ID, HeaderValue::from_static("inner"));
            Ok::<_, Infallible>(res)
        });
        let res = RequestIdLayer
            .layer(named)
            .oneshot(Request::new(()))
            .await
            .unwrap_or_default();
        assert_eq!(res.headers()[X_REQUEST_ID], "inner");
    }
}
