//! A blocking HTTP/1.0 exchange for the command-line tools (`agent-reach status`, `agent-reach
//! tasks`): no runtime, no TLS — the admin and outbound ports speak plaintext on the pod's own
//! network.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Connecting and each read give up after this.
const TIMEOUT: Duration = Duration::from_secs(5);
/// An answer larger than this is not one of ours.
const MAX_BODY: u64 = 64 * 1024 * 1024;

/// Why a request could not be made or its answer read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("{0:?} is not an admin URL (expected http://HOST:PORT)")]
    BadUrl(String),
    #[error("cannot resolve {authority}: {source}")]
    Resolve {
        authority: String,
        source: std::io::Error,
    },
    #[error("the admin port at {url} does not answer: {source}")]
    Connect { url: String, source: std::io::Error },
    #[error("reading {url}: {source}")]
    Read { url: String, source: std::io::Error },
    #[error("{url} sent no HTTP response")]
    NotHttp { url: String },
    #[error("{url} answered HTTP {status} (is this an agent-reach admin port?)")]
    Status { url: String, status: u16 },
    #[error("{url} did not send a status document: {source}")]
    Json {
        url: String,
        source: serde_json::Error,
    },
}

/// One blocking HTTP/1.0 request to `base` (`http://host:port[/prefix]`) plus `path`: the
/// status, the body as text, and the URL asked.
pub(crate) fn exchange(
    base: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<(u16, String, String), FetchError> {
    let (authority, prefix) = split_url(base)?;
    let url = format!("http://{authority}{prefix}{path}");
    let addrs: Vec<_> = authority
        .to_socket_addrs()
        .map_err(|source| FetchError::Resolve {
            authority: authority.to_owned(),
            source,
        })?
        .collect();
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    let mut stream = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, TIMEOUT) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = e,
        }
    }
    let Some(mut stream) = stream else {
        return Err(FetchError::Connect { url, source: last });
    };
    let read = |source| FetchError::Read {
        url: url.clone(),
        source,
    };
    stream.set_read_timeout(Some(TIMEOUT)).map_err(read)?;
    stream.set_write_timeout(Some(TIMEOUT)).map_err(read)?;
    let request = format!(
        "{method} {prefix}{path} HTTP/1.0\r\nHost: {authority}\r\nAccept: application/json\r\n\
         User-Agent: agent-reach-cli\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(request.as_bytes()).map_err(read)?;
    stream.write_all(body).map_err(read)?;
    let mut raw = Vec::new();
    stream.take(MAX_BODY).read_to_end(&mut raw).map_err(read)?;
    let (status, body) =
        parse_response(&raw).ok_or_else(|| FetchError::NotHttp { url: url.clone() })?;
    Ok((status, String::from_utf8_lossy(&body).into_owned(), url))
}

/// `http://host:port/prefix` (or `host:port`) → (`host:port`, `/prefix` without a trailing `/`).
pub(crate) fn split_url(admin: &str) -> Result<(&str, &str), FetchError> {
    let bad = || FetchError::BadUrl(admin.to_owned());
    let rest = match admin.split_once("://") {
        Some(("http", rest)) => rest,
        Some(_) => return Err(bad()),
        None => admin,
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if authority.is_empty() || !authority.contains(':') {
        return Err(bad());
    }
    Ok((authority, path.trim_end_matches('/')))
}

/// The status code and the body (de-chunked if need be) of one whole HTTP/1.x response.
fn parse_response(raw: &[u8]) -> Option<(u16, Vec<u8>)> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let body = &raw[end + 4..];
    let mut lines = head.split("\r\n");
    let status = lines
        .next()?
        .strip_prefix("HTTP/1.")?
        .split(' ')
        .nth(1)?
        .parse()
        .ok()?;
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.eq_ignore_ascii_case("transfer-encoding") && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Some((status, body))
}

fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&body[..line_end]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_urls() {
        assert_eq!(
            split_url("http://127.0.0.1:4191").ok(),
            Some(("127.0.0.1:4191", ""))
        );
        assert_eq!(
            split_url("http://pod:4191/prefix/").ok(),
            Some(("pod:4191", "/prefix"))
        );
        assert_eq!(split_url("localhost:1").ok(), Some(("localhost:1", "")));
        assert!(split_url("https://x:1").is_err());
        assert!(split_url("http://nohost").is_err());
    }

    #[test]
    fn responses_plain_and_chunked() {
        let plain = b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_response(plain), Some((200, b"{}".to_vec())));
        let chunked =
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked), Some((404, b"abc".to_vec())));
        assert_eq!(parse_response(b"garbage"), None);
    }
}
