//! What a task looks like outside the store: the API's JSON (secrets masked, the payload left
//! out), the escalation a person receives (the payload up to a limit and every attempt), and
//! the callback's final result.

use serde_json::{json, Value};

use super::callback::mask_userinfo;
use super::model::{encode_body, Delivery, Task};
use super::queue::TASKS_PATH;

/// A webhook or callback delivery: `state` (`pending`, `delivered`, `given_up` with its
/// `reason`), the tries, and the URL with any userinfo masked.
fn delivery(d: &Delivery) -> Value {
    let mut view = json!({
        "url": mask_userinfo(&d.url),
        "state": d.state(),
        "delivered": d.delivered,
        "tries": d.tries,
    });
    if let Some(obj) = view.as_object_mut() {
        let optional = [
            ("last_error", d.last_error.as_ref().map(|e| json!(e))),
            ("delivered_ms", d.delivered_ms.map(|t| json!(t))),
            ("first_try_ms", d.first_try_ms.map(|t| json!(t))),
            ("reason", d.given_up.as_ref().map(|r| json!(r))),
            ("given_up_ms", d.given_up_ms.map(|t| json!(t))),
        ];
        for (key, value) in optional {
            if let Some(value) = value {
                obj.insert(key.into(), value);
            }
        }
    }
    view
}

fn masked_headers(headers: &[(String, String)], extra: &[String]) -> Value {
    let map: serde_json::Map<String, Value> = headers
        .iter()
        .map(|(name, value)| {
            let shown = if crate::redact::is_sensitive(name, extra) {
                crate::redact::MASK
            } else {
                value.as_str()
            };
            (name.clone(), Value::String(shown.to_owned()))
        })
        .collect();
    Value::Object(map)
}

/// The API's view of a task (`GET /reach/v1/tasks/<id>`, the callback, `agent-reach tasks`).
pub(crate) fn api(task: &Task, extra: &[String]) -> Value {
    let mut view = json!({
        "id": task.id,
        "capability": task.capability,
        "state": task.state.as_str(),
        "priority": task.priority,
        "created_ms": task.created_ms,
        "updated_ms": task.updated_ms,
        "rounds": task.rounds,
        "request": {
            "method": task.request.method,
            "path": task.request.path,
            "headers": masked_headers(&task.request.headers, extra),
            "body_bytes": task.request.body.len(),
        },
        "attempts": task.attempts,
        "location": format!("{TASKS_PATH}/{}", task.id),
    });
    let obj = match view.as_object_mut() {
        Some(obj) => obj,
        None => return view,
    };
    if task.work() == Some(super::model::Work::Run) {
        obj.insert("next_ms".into(), json!(task.due_ms));
    }
    if let Some(response) = &task.response {
        obj.insert("response".into(), json!(response));
    }
    // The delegation chain the task was submitted in, which its runner routes it with.
    let chain = task
        .request
        .headers
        .iter()
        .find(|(n, _)| n == "reach-chain");
    if let Some(chain) = chain.and_then(|(_, v)| crate::chain::Chain::parse(v).ok()) {
        obj.insert(
            "chain".into(),
            json!({ "hops": chain.hops(), "agents": chain.display() }),
        );
    }
    if let Some(error) = &task.error {
        obj.insert("error".into(), json!(error));
    }
    if let Some(since) = task.waiting_since_ms {
        obj.insert("waiting_since_ms".into(), json!(since));
    }
    if let Some(lease) = &task.lease {
        obj.insert("lease".into(), json!(lease));
    }
    if let Some(callback) = &task.callback {
        obj.insert("callback".into(), delivery(callback));
    }
    if let Some(escalation) = &task.escalation {
        obj.insert("escalation".into(), delivery(escalation));
    }
    if let Some(resolution) = &task.resolution {
        obj.insert("resolution".into(), json!(resolution));
    }
    view
}

/// What the escalation webhook receives: the task, its payload up to `max_payload` bytes, and
/// every attempt with its reason — once each.
pub(crate) fn escalation(
    task: &Task,
    max_payload: usize,
    delivery: u32,
    extra: &[String],
) -> Value {
    let body = &task.request.body;
    let cut = body.len() > max_payload;
    let (text, encoding) = encode_body(&body[..body.len().min(max_payload)]);
    json!({
        "event": "task.escalated",
        "delivery": delivery,
        "task": {
            "id": task.id,
            "capability": task.capability,
            "priority": task.priority,
            "created_ms": task.created_ms,
            "rounds": task.rounds,
            "error": task.error,
        },
        "payload": {
            "method": task.request.method,
            "path": task.request.path,
            "headers": masked_headers(&task.request.headers, extra),
            "body": text,
            "encoding": encoding,
            "truncated": cut,
        },
        "attempts": task.attempts,
        "actions": {
            "retry": format!("POST {TASKS_PATH}/{}/retry", task.id),
            "resolve": format!("POST {TASKS_PATH}/{}/resolve", task.id),
        },
    })
}

/// What the caller's callback receives: the task as the API shows it.
pub(crate) fn callback(task: &Task, delivery: u32, extra: &[String]) -> Value {
    let mut view = api(task, extra);
    if let Some(obj) = view.as_object_mut() {
        obj.insert(
            "event".into(),
            json!(format!("task.{}", task.state.as_str())),
        );
        obj.insert("delivery".into(), json!(delivery));
    }
    view
}
