//! The kubelet's probes of the agent, answered through the sidecar's admin port
//! (`docs/kubernetes.md`, "Probes"). With interception the agent's port belongs to the inbound
//! listener: a probe sent there would be judged as a call (refused `403` under strict mTLS,
//! `503 saturated` when the agent is busy, counted as capability traffic). The injector rewrites
//! each HTTP, TCP and gRPC probe of an agent container to `GET /app-health/<container>/<kind>` on
//! the admin port and hands the sidecar the original; the sidecar runs it against the agent on
//! loopback, outside admission, and answers what the agent answered. So a busy agent's liveness
//! answers what the agent answers, and the sidecar's own readiness stays its own (`/ready`).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use crate::config::AppProbe;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// The path prefix of the rewritten probes on the admin port.
pub(crate) const PREFIX: &str = "/app-health/";

/// Runs `probe` against the agent on loopback: the agent's status for HTTP (the kubelet
/// reads 200–399 as success), 200 or 503 for TCP and gRPC, 503 on no answer in time.
pub(crate) async fn run(probe: &AppProbe) -> (StatusCode, String) {
    let timeout = probe.timeout();
    let outcome = tokio::time::timeout(timeout, async {
        match probe {
            AppProbe::Http {
                port,
                path,
                headers,
                ..
            } => http(*port, path, headers).await,
            AppProbe::Tcp { port, .. } => tokio::net::TcpStream::connect(agent(*port))
                .await
                .map(|_| (StatusCode::OK, format!("port {port} accepted\n")))
                .map_err(|e| format!("port {port}: {e}")),
            AppProbe::Grpc { port, service, .. } => grpc(*port, service).await,
        }
    })
    .await;
    match outcome {
        Ok(Ok(answer)) => answer,
        Ok(Err(why)) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the agent did not answer within {timeout:?}\n"),
        ),
    }
}

fn agent(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

async fn http(
    port: u16,
    path: &str,
    headers: &BTreeMap<String, String>,
) -> Result<(StatusCode, String), String> {
    let tcp = tokio::net::TcpStream::connect(agent(port))
        .await
        .map_err(|e| format!("port {port}: {e}"))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut request = Request::get(path).header(http::header::HOST, format!("127.0.0.1:{port}"));
    request = request.header(http::header::USER_AGENT, "kube-probe (agent-reach)");
    for (name, value) in headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let request = request
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let response = send
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    // The kubelet reads at most 10 KiB of a probe's body; so does this.
    let mut body = response.into_body();
    let mut text = Vec::new();
    while let Some(Ok(frame)) = body.frame().await {
        if let Ok(data) = frame.into_data() {
            text.extend_from_slice(&data);
            if text.len() > 10 << 10 {
                break;
            }
        }
    }
    text.truncate(10 << 10);
    Ok((status, String::from_utf8_lossy(&text).into_owned()))
}

/// The standard gRPC health check (`grpc.health.v1.Health/Check`) over h2 with prior knowledge:
/// 200 when the agent answers `SERVING`.
async fn grpc(port: u16, service: &str) -> Result<(StatusCode, String), String> {
    let tcp = tokio::net::TcpStream::connect(agent(port))
        .await
        .map_err(|e| format!("port {port}: {e}"))?;
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    // HealthCheckRequest { service = 1 }, length-prefixed as gRPC frames its messages.
    let mut message = Vec::new();
    if !service.is_empty() {
        message.push(0x0a);
        message.push(u8::try_from(service.len()).map_err(|_| "service name too long")?);
        message.extend_from_slice(service.as_bytes());
    }
    let mut frame = vec![0u8];
    frame.extend_from_slice(&u32::try_from(message.len()).unwrap_or(0).to_be_bytes());
    frame.extend_from_slice(&message);
    let request = Request::post(format!(
        "http://127.0.0.1:{port}/grpc.health.v1.Health/Check"
    ))
    .header(http::header::CONTENT_TYPE, "application/grpc")
    .header("te", "trailers")
    .body(Full::new(Bytes::from(frame)))
    .map_err(|e| e.to_string())?;
    let response = send
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let collected = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    let trailers = collected.trailers().cloned();
    let bytes = collected.to_bytes();
    let grpc_status = trailers
        .as_ref()
        .and_then(|t| t.get("grpc-status"))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("0");
    // HealthCheckResponse { status = 1 }: SERVING is 1.
    let serving = grpc_status == "0" && bytes.get(5..7) == Some(&[0x08, 0x01][..]);
    Ok(if serving {
        (StatusCode::OK, "SERVING\n".to_owned())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not SERVING (grpc-status {grpc_status})\n"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn nothing_listening_is_503_saying_why() {
        let free = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(9);
        let probe = AppProbe::Tcp {
            port: free,
            timeout_ms: Some(500),
        };
        let (status, why) = run(&probe).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(why.contains(&free.to_string()), "{why}");
    }
}
