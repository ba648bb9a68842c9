//! Requests the sidecar itself sends straight to its local agent, past admission: business
//! probes (`crate::probe`) and golden tasks (`crate::quality`). Marked `reach-probe`, so the
//! agent can tell them from production work.

use std::collections::BTreeMap;

use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;

use crate::classify::Class;
use crate::config::Snapshot;
use crate::http::body;
use crate::http::client::{self, AgentClient};

/// A request the sidecar itself sends to its agent: a probe or a golden task.
#[derive(Debug)]
pub(crate) struct AgentRequest<'a> {
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
    pub(crate) headers: &'a BTreeMap<String, String>,
    pub(crate) body: Option<&'a str>,
    /// The `reach-probe` header's value, so the agent can tell these from production work.
    pub(crate) marker: &'static str,
}

/// Sends `request` straight to the local agent; on failure, why and whether the connection was
/// refused.
pub(crate) async fn send(
    client: &AgentClient,
    snapshot: &Snapshot,
    request: AgentRequest<'_>,
) -> Result<(Class, StatusCode, String), (String, bool)> {
    let method = Method::from_bytes(request.method.as_bytes())
        .map_err(|_| (format!("bad method `{}`", request.method), false))?;
    let mut builder = Request::builder()
        .method(method)
        .uri(format!(
            "{}://{}{}",
            client.scheme(),
            snapshot.bootstrap.agent.address,
            request.path
        ))
        .header(
            http::header::HOST,
            snapshot.bootstrap.agent.address.as_str(),
        )
        .header("reach-probe", request.marker);
    for (k, v) in request.headers {
        builder = builder.header(k.as_str(), v.as_str());
    }
    let built = builder
        .body(body::full(request.body.unwrap_or_default().to_owned()))
        .map_err(|e| (format!("bad probe request: {e}"), false))?;
    let response = client.request(built).await.map_err(|e| {
        let failure = client::describe(&e);
        let kind = if failure.connect {
            "connect"
        } else {
            "upstream"
        };
        (
            format!("{kind} error: {}", failure.message),
            failure.refused,
        )
    })?;
    let status = response.status();
    let class = Class::of_response(&response);
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| (format!("body error: {e}"), false))?
        .to_bytes();
    Ok((class, status, String::from_utf8_lossy(&bytes).into_owned()))
}
