//! Traces across two hops: a caller sidecar and a callee sidecar export their spans to a real
//! OTLP/HTTP receiver started here, which decodes them with the `opentelemetry-proto` types.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::config::TracingConfig;
use agent_reach::trace::{key, parse_traceparent, SpanContext};
use agent_reach::Bootstrap;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use support::{client, echo_agent, eventually, send, sidecar, CAP};
use tokio::net::TcpListener;

/// A span as received, with the `service.name` of the sidecar that sent it.
type Received = Arc<Mutex<Vec<(String, Span)>>>;

/// A minimal OTLP/HTTP receiver: `POST /v1/traces`, protobuf in, protobuf out.
async fn receiver() -> (SocketAddr, Received) {
    let listener = TcpListener::bind(support::any_port()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received: Received = Arc::default();
    let store = received.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let store = store.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let store = store.clone();
                        async move {
                            assert_eq!(req.uri().path(), "/v1/traces");
                            assert_eq!(req.headers()["content-type"], "application/x-protobuf");
                            let bytes = req.into_body().collect().await.unwrap().to_bytes();
                            let export = ExportTraceServiceRequest::decode(bytes).unwrap();
                            for resource in export.resource_spans {
                                let attributes = resource.resource.unwrap_or_default().attributes;
                                let service = text(&attributes, "service.name").unwrap_or_default();
                                for scope in resource.scope_spans {
                                    for span in scope.spans {
                                        store.lock().unwrap().push((service.clone(), span));
                                    }
                                }
                            }
                            let answer = ExportTraceServiceResponse::default().encode_to_vec();
                            Ok::<_, std::convert::Infallible>(Response::new(Full::new(
                                bytes::Bytes::from(answer),
                            )))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, received)
}

fn text(attributes: &[KeyValue], name: &str) -> Option<String> {
    attributes.iter().find(|kv| kv.key == name).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.clone()),
            _ => None,
        }
    })
}

fn int(attributes: &[KeyValue], name: &str) -> Option<i64> {
    attributes.iter().find(|kv| kv.key == name).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            Value::IntValue(i) => Some(*i),
            _ => None,
        }
    })
}

fn traced(mut bootstrap: Bootstrap, collector: SocketAddr, service: &str) -> Bootstrap {
    bootstrap.tracing = Some(TracingConfig {
        otlp_endpoint: Some(format!("http://{collector}")),
        service_name: Some(service.to_owned()),
        sample_ratio: 1.0,
    });
    bootstrap
}

/// The spans of `trace` received so far.
fn of_trace(received: &Received, trace: &[u8]) -> Vec<(String, Span)> {
    let all = received.lock().unwrap();
    all.iter()
        .filter(|(_, s)| s.trace_id == trace)
        .cloned()
        .collect()
}

#[tokio::test]
async fn spans_link_across_two_hops_and_the_agent_sees_the_callee_span() {
    let (collector, received) = receiver().await;
    let (agent, seen) = echo_agent().await;
    let callee = Bootstrap::local("reviewer", agent, &[CAP]).unwrap();
    let callee = sidecar(traced(callee, collector, "callee")).await;
    let caller = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
        .unwrap()
        .with_peer("reviewer", callee.addrs.inbound, &[CAP])
        .unwrap();
    let caller = sidecar(traced(caller, collector, "caller")).await;
    let url = format!("http://{}/review", caller.addrs.outbound);
    let http = client();

    // 1. The agent sends its own traceparent and tracestate: the trace continues.
    let incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let given = parse_traceparent(incoming.as_bytes()).unwrap();
    let headers = [
        ("reach-capability", CAP),
        ("traceparent", incoming),
        ("tracestate", "vendor=abc"),
    ];
    let reply = send(&http, "POST", &url, &headers, "x = 1").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let spans = wait_for_three(&received, &given.trace_id).await;
    let agent_saw = seen.lock().unwrap().last().cloned().unwrap();
    check_hops(&spans, Some(&given), &agent_saw);
    assert_eq!(
        agent_saw["tracestate"], "vendor=abc",
        "tracestate passes through"
    );

    // 2. No traceparent (and then a malformed one): a new trace starts.
    for headers in [
        vec![("reach-capability", CAP)],
        vec![("reach-capability", CAP), ("traceparent", "00-nonsense-01")],
    ] {
        let before = seen.lock().unwrap().len();
        let reply = send(&http, "POST", &url, &headers, "x = 1").await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let agent_saw = seen.lock().unwrap()[before].clone();
        let theirs = agent_saw["traceparent"].to_str().unwrap();
        let theirs = parse_traceparent(theirs.as_bytes()).expect("a well-formed traceparent");
        assert_ne!(theirs.trace_id, given.trace_id);
        let spans = wait_for_three(&received, &theirs.trace_id).await;
        check_hops(&spans, None, &agent_saw);
    }

    callee.shutdown().await;
    caller.shutdown().await;
}

/// Waits for the three spans of one call: the caller's server and client spans, the callee's
/// server span.
async fn wait_for_three(received: &Received, trace: &[u8; 16]) -> Vec<(String, Span)> {
    eventually(Duration::from_secs(10), "three spans of the trace", || {
        let n = of_trace(received, trace).len();
        async move { n >= 3 }
    })
    .await;
    of_trace(received, trace)
}

fn check_hops(spans: &[(String, Span)], given: Option<&SpanContext>, agent_saw: &http::HeaderMap) {
    let find = |service: &str, kind: SpanKind| {
        spans
            .iter()
            .find(|(s, span)| s == service && span.kind == kind as i32)
            .map(|(_, span)| span.clone())
            .unwrap_or_else(|| panic!("no {kind:?} span from the {service}: {spans:#?}"))
    };
    let outbound = find("caller", SpanKind::Server);
    let attempt = find("caller", SpanKind::Client);
    let inbound = find("callee", SpanKind::Server);

    // Parent and child, across the hop.
    match given {
        Some(given) => assert_eq!(outbound.parent_span_id, given.span_id.to_vec()),
        None => assert!(outbound.parent_span_id.is_empty(), "a new trace has a root"),
    }
    assert_eq!(attempt.parent_span_id, outbound.span_id);
    assert_eq!(inbound.parent_span_id, attempt.span_id);
    assert!(spans.iter().all(|(_, s)| s.trace_id == outbound.trace_id));

    // The agent is told the callee's span is its parent.
    let to_agent = agent_saw["traceparent"].to_str().unwrap();
    let to_agent = parse_traceparent(to_agent.as_bytes()).unwrap();
    assert_eq!(to_agent.trace_id.to_vec(), inbound.trace_id);
    assert_eq!(to_agent.span_id.to_vec(), inbound.span_id);

    // What each span says about the call.
    assert_eq!(
        text(&attempt.attributes, key::CAPABILITY).as_deref(),
        Some(CAP)
    );
    assert_eq!(
        text(&attempt.attributes, key::PEER).as_deref(),
        Some("reviewer")
    );
    assert_eq!(int(&attempt.attributes, key::ATTEMPT), Some(1));
    assert_eq!(
        text(&attempt.attributes, key::OUTCOME).as_deref(),
        Some("success")
    );
    assert!(attempt.attributes.iter().any(|kv| kv.key == key::SCORE));
    assert_eq!(
        text(&outbound.attributes, key::CAPABILITY).as_deref(),
        Some(CAP)
    );
    assert_eq!(
        text(&outbound.attributes, key::PEER).as_deref(),
        Some("reviewer")
    );
    assert_eq!(
        text(&outbound.attributes, key::OUTCOME).as_deref(),
        Some("success")
    );
    assert_eq!(
        text(&inbound.attributes, key::CAPABILITY).as_deref(),
        Some(CAP)
    );
    assert_eq!(
        text(&inbound.attributes, key::OUTCOME).as_deref(),
        Some("success")
    );
    for span in [&outbound, &attempt, &inbound] {
        let code = span.status.as_ref().map_or(0, |s| s.code);
        assert_ne!(code, StatusCode::Error as i32, "{span:?}");
        assert!(span.end_time_unix_nano >= span.start_time_unix_nano);
    }
}

#[tokio::test]
async fn a_failed_attempt_is_an_error_span_and_the_retry_says_why() {
    let (collector, received) = receiver().await;
    let (agent, _) = echo_agent().await;
    let callee = sidecar(Bootstrap::local("reviewer", agent, &[CAP]).unwrap()).await;
    // A peer first in line that refuses connections, then the live one.
    let dead = TcpListener::bind(support::any_port()).await.unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let caller = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
        .unwrap()
        .with_peer("gone", dead_addr, &[CAP])
        .unwrap()
        .with_peer("reviewer", callee.addrs.inbound, &[CAP])
        .unwrap();
    let caller = sidecar(traced(caller, collector, "caller")).await;
    let url = format!("http://{}/review", caller.addrs.outbound);
    let http = client();
    // Until a call tries the dead peer first (the pick is random), then it is retried.
    let mut retried = None;
    for _ in 0..40 {
        let reply = send(&http, "POST", &url, &[("reach-capability", CAP)], "x").await;
        if reply.header("reach-attempts") == "2" {
            retried = Some(reply);
            break;
        }
    }
    assert!(retried.is_some(), "no call tried the dead peer first");
    eventually(Duration::from_secs(10), "a retried attempt's span", || {
        let found = received.lock().unwrap().iter().any(|(_, s)| {
            int(&s.attributes, key::ATTEMPT) == Some(2)
                && text(&s.attributes, key::RETRY_REASON).as_deref() == Some("connect_failed")
        });
        async move { found }
    })
    .await;
    let all = received.lock().unwrap().clone();
    let failed = all
        .iter()
        .find(|(_, s)| {
            text(&s.attributes, key::PEER).as_deref() == Some("gone")
                && s.kind == SpanKind::Client as i32
        })
        .map(|(_, s)| s.clone())
        .expect("the failed attempt's span");
    assert_eq!(
        failed.status.map(|s| s.code),
        Some(StatusCode::Error as i32)
    );
    assert_eq!(
        text(&failed.attributes, key::OUTCOME).as_deref(),
        Some("failure")
    );
    // Counted once the receiver has answered, a moment after it stored the spans.
    eventually(
        Duration::from_secs(10),
        "the exporter counts what it sent",
        || {
            let exported = caller.trace_counts().exported;
            async move { exported > 0 }
        },
    )
    .await;
    caller.shutdown().await;
    callee.shutdown().await;
}

fn double(attributes: &[KeyValue], name: &str) -> Option<f64> {
    attributes.iter().find(|kv| kv.key == name).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            Value::DoubleValue(d) => Some(*d),
            _ => None,
        }
    })
}

/// A call to a model provider (an external target) is an `attempt` span with OpenTelemetry's
/// GenAI attributes, read from the answer's `usage` once its body has passed: a JSON answer and
/// a stream (which also says when its first event came).
#[tokio::test]
async fn an_attempt_on_a_model_provider_carries_its_tokens() {
    use agent_reach::config::{ExternalTarget, Name, Policy, TargetEndpoint};
    use testkit::{MockConfig, ProviderBudget, ProviderHeaders};
    let (collector, received) = receiver().await;
    let mut config = MockConfig::new("provider");
    config.provider = ProviderBudget {
        requests: Some(100),
        window: Duration::from_secs(60),
        headers: ProviderHeaders::Honest,
        ..ProviderBudget::default()
    };
    let provider = support::mock(config).await;
    let mut policy = Policy::default();
    policy.targets.push(ExternalTarget {
        name: Name::parse("llm").unwrap(),
        capability: Name::parse("llm").unwrap(),
        endpoints: vec![TargetEndpoint::parse(&provider.addr.to_string()).unwrap()],
        ca_file: None,
        timeout: None,
        max_concurrency: None,
        rate_limit: None,
        budget_group: None,
        model_provider: true,
    });
    let caller = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap();
    let caller = support::sidecar_with(
        traced(caller, collector, "caller"),
        policy,
        Default::default(),
    )
    .await;
    let url = format!("http://{}/v1/chat/completions", caller.addrs.outbound);
    for body in [
        r#"{"model":"gpt-test"}"#,
        r#"{"model":"gpt-test","stream":true}"#,
    ] {
        let reply = send(
            &client(),
            "POST",
            &url,
            &[("reach-capability", "llm")],
            body,
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let model_spans = || -> Vec<Span> {
        received
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, s)| {
                s.kind == SpanKind::Client as i32
                    && text(&s.attributes, key::GEN_AI_PROVIDER).as_deref() == Some("llm")
            })
            .map(|(_, s)| s.clone())
            .collect()
    };
    eventually(Duration::from_secs(10), "both attempts' spans", || {
        let n = model_spans().len();
        async move { n == 2 }
    })
    .await;
    let spans = model_spans();
    for span in &spans {
        let a = &span.attributes;
        assert_eq!(
            text(a, key::GEN_AI_REQUEST_MODEL).as_deref(),
            Some("gpt-test")
        );
        assert!(
            int(a, key::GEN_AI_INPUT_TOKENS).is_some_and(|n| n > 0),
            "{a:?}"
        );
        assert!(
            int(a, key::GEN_AI_OUTPUT_TOKENS).is_some_and(|n| n > 0),
            "{a:?}"
        );
        assert_eq!(text(a, key::OUTCOME).as_deref(), Some("success"));
    }
    let first_tokens: Vec<f64> = spans
        .iter()
        .filter_map(|s| double(&s.attributes, key::TIME_TO_FIRST_TOKEN))
        .collect();
    assert_eq!(first_tokens.len(), 1, "only the stream has a first token");
    assert!(
        first_tokens[0] > 0.0 && first_tokens[0] < 10.0,
        "{first_tokens:?}"
    );
    caller.shutdown().await;
}
