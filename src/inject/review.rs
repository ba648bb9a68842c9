//! `admission.k8s.io/v1` AdmissionReview in, AdmissionReview out.

use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};

use super::config::InjectorConfig;
use super::pod::{decide, Decision, OptIn};

/// A request body that is not an AdmissionReview at all (the API server then applies the
/// webhook's failure policy).
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("not an admission.k8s.io/v1 AdmissionReview: {0}")]
pub(super) struct BadReview(pub String);

/// What the webhook decided, for logs and metrics.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Verdict {
    Injected,
    Skipped(&'static str),
    Denied(String),
}

/// The parts of an AdmissionReview the webhook reads. Typed, so that a body that is not one
/// fails at its first token instead of being built into a tree first, and the fields not read
/// here (`oldObject`, `userInfo`, …) are skipped without being kept.
#[derive(Deserialize)]
struct Review {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    request: Option<Request>,
}

#[derive(Deserialize)]
struct Request {
    uid: Option<String>,
    kind: Option<Kind>,
    namespace: Option<String>,
    operation: Option<String>,
    #[serde(default)]
    object: Value,
}

#[derive(Deserialize)]
struct Kind {
    #[serde(default)]
    group: String,
    #[serde(default)]
    kind: String,
}

/// An answered review: the response, the verdict and `namespace/name` of the object, for logs.
pub(super) type Answer = (Value, Verdict, String);

/// Answers one review. Anything but a pod being created is allowed untouched.
pub(super) fn answer(
    config: &InjectorConfig,
    body: &[u8],
    opt_in: OptIn,
) -> Result<Answer, BadReview> {
    let review: Review = serde_json::from_slice(body).map_err(|e| BadReview(e.to_string()))?;
    if review.kind != "AdmissionReview" {
        return Err(BadReview("`kind` is not AdmissionReview".to_owned()));
    }
    if review.api_version != "admission.k8s.io/v1" {
        return Err(BadReview(format!(
            "apiVersion `{}` (only admission.k8s.io/v1 is served)",
            review.api_version
        )));
    }
    let request = review
        .request
        .ok_or_else(|| BadReview("no `request`".to_owned()))?;
    let uid = request
        .uid
        .clone()
        .ok_or_else(|| BadReview("the request has no `uid`".to_owned()))?;
    let is_pod = request
        .kind
        .as_ref()
        .is_some_and(|k| k.kind == "Pod" && k.group.is_empty());
    let namespace = request
        .namespace
        .as_deref()
        .or_else(|| {
            request
                .object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
        })
        .unwrap_or("default");
    let who = object_name(namespace, &request.object);
    let respond = |mut response: Value, verdict: Verdict| {
        response["uid"] = json!(uid);
        (
            json!({ "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response }),
            verdict,
            who.clone(),
        )
    };
    if !is_pod || request.operation.as_deref() != Some("CREATE") {
        return Ok(respond(
            json!({ "allowed": true }),
            Verdict::Skipped("not a pod being created"),
        ));
    }
    Ok(match decide(config, &request.object, namespace, opt_in) {
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

/// `namespace/name` (or `namespace/generateName…`) of the reviewed object.
fn object_name(namespace: &str, object: &Value) -> String {
    let meta = object.get("metadata");
    let field = |k: &str| meta.and_then(|m| m.get(k)).and_then(Value::as_str);
    let name = field("name")
        .map(str::to_owned)
        .or_else(|| field("generateName").map(|g| format!("{g}…")))
        .unwrap_or_default();
    format!("{namespace}/{name}")
}
