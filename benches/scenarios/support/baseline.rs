//! The baseline router: what the seeds started from.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// What the seeds started from: round-robin over agents whose `/healthz` answered 200 at the
/// last check (every 10 s), and one immediate retry on the next agent after an error, a 5xx
/// or a 429.
pub(crate) async fn baseline(
    agents: Vec<SocketAddr>,
) -> Result<(u16, tokio::task::JoinHandle<()>), String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let healthy: Arc<Vec<AtomicBool>> =
        Arc::new(agents.iter().map(|_| AtomicBool::new(true)).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let checker = {
        let (agents, healthy, client) = (agents.clone(), healthy.clone(), client.clone());
        tokio::spawn(async move {
            loop {
                for (i, a) in agents.iter().enumerate() {
                    let request = hyper::Request::get(format!("http://{a}/healthz"))
                        .body(Full::new(Bytes::new()));
                    let up = match request {
                        Ok(r) => {
                            matches!(tokio::time::timeout(Duration::from_secs(2), client.request(r)).await, Ok(Ok(resp)) if resp.status() == 200)
                        }
                        Err(_) => false,
                    };
                    healthy[i].store(up, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        })
    };
    let task = tokio::spawn(async move {
        let _checker = AbortOnDrop(checker);
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (agents, healthy, next, client) = (
                agents.clone(),
                healthy.clone(),
                next.clone(),
                client.clone(),
            );
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let (agents, healthy, next, client) = (
                            agents.clone(),
                            healthy.clone(),
                            next.clone(),
                            client.clone(),
                        );
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let mut last = hyper::Response::builder()
                                .status(502)
                                .body(Full::new(Bytes::new()));
                            for _attempt in 0..2 {
                                let pick = (0..agents.len())
                                    .map(|_| next.fetch_add(1, Ordering::Relaxed) % agents.len())
                                    .find(|i| healthy[*i].load(Ordering::Relaxed))
                                    .unwrap_or(0);
                                let request = hyper::Request::builder()
                                    .method(parts.method.clone())
                                    .uri(format!("http://{}{}", agents[pick], parts.uri.path()))
                                    .body(Full::new(body.clone()));
                                let Ok(request) = request else { break };
                                match client.request(request).await {
                                    Ok(resp) => {
                                        let status = resp.status();
                                        let bytes = resp
                                            .into_body()
                                            .collect()
                                            .await
                                            .map(|b| b.to_bytes())
                                            .unwrap_or_default();
                                        last = hyper::Response::builder()
                                            .status(status)
                                            .body(Full::new(bytes));
                                        if status.is_server_error() || status == 429 {
                                            continue;
                                        }
                                        break;
                                    }
                                    Err(_) => continue,
                                }
                            }
                            Ok::<_, std::convert::Infallible>(last.unwrap_or_default())
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((port, task))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
