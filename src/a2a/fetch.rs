//! Reading the local agent's card: one bounded GET over the agent client.

use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Limited};

use crate::config::HostPort;
use crate::http::body;
use crate::http::client::UpstreamClient;

/// A card larger than this is refused: a card is a few KiB, and it is held in memory.
pub(crate) const MAX_CARD_BYTES: usize = 256 * 1024;
/// One read of the card; the agent answers it from memory.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Why the card could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("agent card {url}: {message}")]
    Request { url: String, message: String },
    #[error("agent card {url}: the agent answered {status}")]
    Status { url: String, status: StatusCode },
    #[error("agent card {url}: no answer within {TIMEOUT:?}")]
    Timeout { url: String },
    #[error("agent card {url}: the body is not JSON or over {MAX_CARD_BYTES} bytes: {message}")]
    Body { url: String, message: String },
}

/// GETs `path` from the agent at `address`; the card's bytes and its JSON.
pub(crate) async fn fetch(
    client: &UpstreamClient,
    address: &HostPort,
    path: &str,
) -> Result<(Bytes, serde_json::Value), FetchError> {
    let url = format!("http://{address}{path}");
    let request = Request::get(&url)
        .header(header::HOST, address.as_str())
        .header(header::ACCEPT, "application/json")
        .body(body::empty())
        .map_err(|e| FetchError::Request {
            url: url.clone(),
            message: e.to_string(),
        })?;
    let response = match tokio::time::timeout(TIMEOUT, client.request(request)).await {
        Err(_) => return Err(FetchError::Timeout { url }),
        Ok(Err(e)) => {
            return Err(FetchError::Request {
                message: crate::http::client::describe(&e).message,
                url,
            })
        }
        Ok(Ok(response)) => response,
    };
    if response.status() != StatusCode::OK {
        return Err(FetchError::Status {
            url,
            status: response.status(),
        });
    }
    let read = tokio::time::timeout(
        TIMEOUT,
        Limited::new(response.into_body(), MAX_CARD_BYTES).collect(),
    )
    .await;
    let bytes = match read {
        Err(_) => return Err(FetchError::Timeout { url }),
        Ok(Err(e)) => {
            return Err(FetchError::Body {
                url,
                message: e.to_string(),
            })
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    let json = serde_json::from_slice(&bytes).map_err(|e| FetchError::Body {
        url,
        message: e.to_string(),
    })?;
    Ok((bytes, json))
}
