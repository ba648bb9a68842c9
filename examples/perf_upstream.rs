//! The upstream of `benches/perf/hop.sh`: the same minimal hyper server as `benches/proxies.rs`
//! (128 bytes of text/plain, one thread), on the port given as the first argument.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

fn main() {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    rt.block_on(async move {
        let Ok(listener) = tokio::net::TcpListener::bind(("127.0.0.1", port)).await else {
            eprintln!("cannot bind 127.0.0.1:{port}");
            return;
        };
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        let _ = req.into_body().collect().await;
                        let response = hyper::Response::builder()
                            .header("content-type", "text/plain")
                            .body(Full::new(Bytes::from_static(&[b'x'; 128])));
                        Ok::<_, Infallible>(response.unwrap_or_default())
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}
