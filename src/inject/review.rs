//! `admission.k8s.io/v1` AdmissionReview in, AdmissionReview out.

use base64::Engine;
use serde_json::{json, Value};

use super::config::InjectorConfig;
use super::pod::{decide, Decision, OptIn};

/// A request body that is not an AdmissionReview at all (the API server then applies the
/// webhook's failure policy).
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("not an admission.k8s.io/v1 AdmissionReview: {0}")]
pub struct BadReview(pub String);

/// What the webhook decided, for logs and metrics.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Injected,
    Skipped(&'static str),
    Denied(String),
}

impl Verdict {
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Injected => "injected",
            Verdict::Skipped(_) => "skipped",
            Verdict::Denied(_) => "denied",
        }
    }
}

/// Answers one review. Anything but a pod being created is allowed untouched.
pub fn answer(
    config: &InjectorConfig,
    body: &[u8],
    opt_in: OptIn,
) -> Result<(Value, Verdict), BadReview> {
    let review: Value = serde_json::from_slice(body).map_err(|e| BadReview(e.to_string()))?;
    if review.get("kind").and_then(Value::as_str) != Some("AdmissionReview") {
        return Err(BadReview("`kind` is not AdmissionReview".to_owned()));
    }
    let api_version = review
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if api_version != "admission.k8s.io/v1" {
        return Err(BadReview(format!(
            "apiVersion `{api_version}` (only admission.k8s.io/v1 is served)"
        )));
    }
    let request = review
        .get("request")
        .ok_or_else(|| BadReview("no `request`".to_owned()))?;
    let uid = request
        .get("uid")
        .and_then(Value::as_str)
        .ok_or_else(|| BadReview("the request has no `uid`".to_owned()))?;
    let is_pod = request.pointer("/kind/kind").and_then(Value::as_str) == Some("Pod")
        && request.pointer("/kind/group").and_then(Value::as_str) == Some("");
    let operation = request.get("operation").and_then(Value::as_str);
    let respond = |response: Value, verdict: Verdict| {
        let mut response = response;
        response["uid"] = json!(uid);
        (
            json!({ "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response }),
            verdict,
        )
    };
    if !is_pod || operation != Some("CREATE") {
        return Ok(respond(
            json!({ "allowed": true }),
            Verdict::Skipped("not a pod being created"),
        ));
    }
    let namespace = request
        .get("namespace")
        .and_then(Value::as_str)
        .or_else(|| {
            request
                .pointer("/object/metadata/namespace")
                .and_then(Value::as_str)
        })
        .unwrap_or("default");
    let pod = request.get("object").unwrap_or(&Value::Null);
    Ok(match decide(config, pod, namespace, opt_in) {
        Ok(Decision::Inject(ops)) => {
            let patch = serde_json::to_vec(&ops).map_err(|e| BadReview(e.to_string()))?;
            respond(
                json!({
                    "allowed": true,
                    "patchType": "JSONPatch",
                    "patch": base64::engine::general_purpose::STANDARD.encode(patch),
                }),
                Verdict::Injected,
            )
        }
        Ok(Decision::Skip { reason, warn }) => {
            let mut response = json!({ "allowed": true });
            if warn {
                response["warnings"] = json!([format!("agent-reach: {reason}")]);
            }
            respond(response, Verdict::Skipped(reason))
        }
        Err(err) => {
            let message = format!("agent-reach: {err}");
            respond(
                json!({
                    "allowed": false,
                    "status": { "status": "Failure", "code": 400, "reason": "BadRequest", "message": message },
                }),
                Verdict::Denied(message),
            )
        }
    })
}
