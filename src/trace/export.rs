//! The exporter: finished spans queue in a bounded channel (a full queue drops the span and
//! counts it: a request never waits for tracing), and one background task sends them in batches
//! by OTLP over HTTP/protobuf (`POST <endpoint>`, `application/x-protobuf`) with the sidecar's
//! own HTTP client. On shutdown the queue is drained and sent once more.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use http::{header, Method, Request, Uri};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::span::{text, Finished};
use super::Shared;
use crate::http::body;
use crate::http::client::UpstreamClient;

/// Spans sent in one request at most.
pub(super) const MAX_BATCH: usize = 512;
/// A batch that is not full is sent after this long.
const INTERVAL: Duration = Duration::from_secs(1);
/// One export may take this long; then its spans are given up.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and as whom spans are sent.
pub(super) struct Destination {
    pub(super) endpoint: Uri,
    pub(super) service_name: String,
    pub(super) instance: String,
}

/// Sends what arrives on `queue` until `stop`, then what is left.
pub(super) async fn run(
    mut queue: mpsc::Receiver<Finished>,
    to: Destination,
    client: UpstreamClient,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let resource = Resource {
        attributes: vec![
            text("service.name", &to.service_name),
            text("service.instance.id", &to.instance),
        ],
        ..Resource::default()
    };
    let mut batch: Vec<Finished> = Vec::with_capacity(MAX_BATCH);
    let mut due = Instant::now() + INTERVAL;
    loop {
        let room = MAX_BATCH - batch.len();
        let stopped = tokio::select! {
            _ = stop.cancelled() => true,
            got = tokio::time::timeout_at(due, queue.recv_many(&mut batch, room)) => {
                matches!(got, Ok(0))
            }
        };
        if stopped {
            queue.close();
            while let Ok(span) = queue.try_recv() {
                batch.push(span);
                if batch.len() == MAX_BATCH {
                    send(&client, &to, &resource, &mut batch, &shared).await;
                }
            }
            send(&client, &to, &resource, &mut batch, &shared).await;
            return;
        }
        if batch.len() >= MAX_BATCH || Instant::now() >= due {
            send(&client, &to, &resource, &mut batch, &shared).await;
            due = Instant::now() + INTERVAL;
        }
    }
}

/// Sends `batch` (emptied whatever happens): a failed export is logged and its spans counted.
async fn send(
    client: &UpstreamClient,
    to: &Destination,
    resource: &Resource,
    batch: &mut Vec<Finished>,
    shared: &Shared,
) {
    if batch.is_empty() {
        return;
    }
    let spans: Vec<Span> = batch.drain(..).map(|Finished(span)| span).collect();
    let count = spans.len() as u64;
    let payload = encode(resource, spans);
    let request = Request::builder()
        .method(Method::POST)
        .uri(to.endpoint.clone())
        .header(
            header::HOST,
            to.endpoint.authority().map_or("", |a| a.as_str()),
        )
        .header(header::CONTENT_TYPE, "application/x-protobuf")
        .body(body::full(payload));
    let request = match request {
        Ok(request) => request,
        Err(err) => return failed(shared, count, &err.to_string()),
    };
    match tokio::time::timeout(EXPORT_TIMEOUT, client.request(request)).await {
        Ok(Ok(response)) if response.status().is_success() => {
            shared.exported.fetch_add(count, Ordering::Relaxed);
        }
        Ok(Ok(response)) => failed(shared, count, &format!("status {}", response.status())),
        Ok(Err(err)) => failed(shared, count, &err.to_string()),
        Err(_) => failed(shared, count, "timed out"),
    }
}

fn failed(shared: &Shared, count: u64, why: &str) {
    shared.failed.fetch_add(count, Ordering::Relaxed);
    tracing::warn!(
        spans = count,
        why,
        "cannot export spans to the OTLP endpoint"
    );
}

/// The OTLP request for `spans`, encoded.
pub(super) fn encode(resource: &Resource, spans: Vec<Span>) -> Vec<u8> {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource.clone()),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "agent-reach".to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..InstrumentationScope::default()
                }),
                spans,
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    }
    .encode_to_vec()
}
