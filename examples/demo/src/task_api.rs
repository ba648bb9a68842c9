//! The demo's reads of the task API: a task as JSON, a response's JSON body.

use http::{Request, Response};
use http_body_util::BodyExt;

use agent_reach::http::{body, client};

pub(super) async fn read_json(response: Response<hyper::body::Incoming>) -> serde_json::Value {
    match response.into_body().collect().await {
        Ok(b) => serde_json::from_slice(&b.to_bytes()).unwrap_or_default(),
        Err(_) => serde_json::Value::Null,
    }
}

pub(super) async fn task(
    http: &client::UpstreamClient,
    outbound: std::net::SocketAddr,
    id: &str,
) -> serde_json::Value {
    let Ok(request) =
        Request::get(format!("http://{outbound}/reach/v1/tasks/{id}")).body(body::empty())
    else {
        return serde_json::Value::Null;
    };
    match http.request(request).await {
        Ok(response) => read_json(response).await,
        Err(_) => serde_json::Value::Null,
    }
}
