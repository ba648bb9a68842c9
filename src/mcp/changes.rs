//! The local server's change notifications: one GET on the MCP endpoint, an event stream the
//! server keeps open, read for `notifications/tools/list_changed`; each one wakes the tool
//! watcher (`super::spawn`) to read the list again now rather than at the next `refresh`. A
//! server that offers no stream (it may answer `405`) is simply read every `refresh`.

use std::sync::Arc;

use http::{header, HeaderValue, Request};
use http_body_util::BodyExt;
use tokio::sync::Notify;

use super::fetch::SESSION_HEADER;
use super::jsonrpc::{CLIENT_REVISION, VERSION_HEADER};
use crate::config::HostPort;
use crate::http::body;
use crate::http::client::UpstreamClient;

const LIST_CHANGED: &str = "notifications/tools/list_changed";
/// Text kept while looking for the notification: enough for one event, bounded.
const MAX_PENDING: usize = 64 * 1024;

/// Listens until the stream ends (the server restarted or closed the session); the watcher
/// starts another after its next read.
pub(crate) async fn listen(
    client: UpstreamClient,
    address: HostPort,
    path: String,
    session: Option<HeaderValue>,
    changed: Arc<Notify>,
) {
    let request = Request::get(format!("http://{address}{path}"))
        .header(header::HOST, address.as_str())
        .header(header::ACCEPT, "text/event-stream")
        .header(VERSION_HEADER, CLIENT_REVISION)
        .body(body::empty());
    let Ok(mut request) = request else { return };
    if let Some(session) = session {
        request.headers_mut().insert(SESSION_HEADER, session);
    }
    let Ok(response) = client.request(request).await else {
        return;
    };
    let streams = crate::http::headers::is_event_stream(response.headers());
    if !response.status().is_success() || !streams {
        return;
    }
    let mut incoming = response.into_body();
    let mut pending = String::new();
    while let Some(Ok(frame)) = incoming.frame().await {
        let Ok(data) = frame.into_data() else {
            continue;
        };
        pending.push_str(&String::from_utf8_lossy(&data));
        if announces_a_change(&mut pending) {
            changed.notify_one();
        }
    }
}

/// Whether the text read so far holds the notification; what is consumed is dropped, and the
/// rest kept within [`MAX_PENDING`].
fn announces_a_change(pending: &mut String) -> bool {
    let found = pending.contains(LIST_CHANGED);
    // Keep only what may be the start of an event not yet complete.
    match pending.rfind("\n\n") {
        Some(end) => {
            pending.drain(..end + 2);
        }
        None if pending.len() > MAX_PENDING => pending.clear(),
        None => {}
    }
    if found {
        pending.clear();
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_found_across_frames_and_the_text_stays_bounded() {
        let mut pending = String::from("event: message\ndata: {\"method\":\"notifications/tools/");
        assert!(!announces_a_change(&mut pending));
        pending.push_str("list_changed\"}\n\n");
        assert!(announces_a_change(&mut pending));
        assert!(pending.is_empty());
        pending.push_str(&"x".repeat(MAX_PENDING + 1));
        assert!(!announces_a_change(&mut pending));
        assert!(pending.is_empty());
        pending.push_str("data: {\"method\":\"notifications/progress\"}\n\ndata: {");
        assert!(!announces_a_change(&mut pending));
        assert_eq!(pending, "data: {");
    }
}
