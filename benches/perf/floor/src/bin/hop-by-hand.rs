//! A proxy hop written by hand on tokio and httparse: each downstream connection gets one
//! keep-alive upstream connection, heads are parsed by httparse and written again without the
//! hop-by-hop headers, bodies are moved by `Content-Length` (a chunked message closes the
//! connection). What a hop costs without an HTTP library's machinery: a measuring stick for
//! benches/perf/hop.sh, not a proxy to deploy.
//!
//! With `typed`, each head also passes through the `http` crate's types on its way (a `HeaderMap`
//! of names and values sliced from the read buffer, as hyper builds it, the hop-by-hop headers
//! removed from it and the head written from it): what a hand-written codec costs that keeps
//! `http::Request` and `http::Response` between itself and a sidecar's steps.
//!
//! usage: hop-by-hand LISTEN UPSTREAM [typed]
use std::io;
use std::process::ExitCode;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HOP_BY_HOP: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    "te",
];
const MAX_HEADERS: usize = 64;
const CHUNKED: &str = "chunked bodies are not moved by this measuring stick";

fn main() -> ExitCode {
    hop_floor::run(
        "hop-by-hand LISTEN UPSTREAM [typed]",
        Some("typed"),
        |down, upstream, typed| async move {
            let _ = serve(down, upstream, typed).await;
        },
    )
}

async fn serve(mut down: TcpStream, upstream: Arc<str>, typed: bool) -> io::Result<()> {
    let mut up: Option<TcpStream> = None;
    let mut down_buf = BytesMut::with_capacity(8192);
    let mut up_buf = BytesMut::with_capacity(8192);
    let mut out = Vec::with_capacity(1024);
    let mut spans = Vec::with_capacity(MAX_HEADERS);
    loop {
        out.clear();
        let Some(len) = head(
            &mut down,
            &mut down_buf,
            Kind::Request,
            typed,
            &mut spans,
            &mut out,
        )
        .await?
        else {
            return Ok(());
        };
        body(&mut down, &mut down_buf, len, &mut out).await?;
        let up = match &mut up {
            Some(up) => up,
            None => {
                let conn = TcpStream::connect(&*upstream).await?;
                conn.set_nodelay(true)?;
                up.insert(conn)
            }
        };
        up.write_all(&out).await?;
        out.clear();
        let Some(len) = head(up, &mut up_buf, Kind::Response, typed, &mut spans, &mut out).await?
        else {
            return Ok(());
        };
        body(up, &mut up_buf, len, &mut out).await?;
        down.write_all(&out).await?;
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Request,
    Response,
}

/// Reads one head from `io` (past what `buf` holds already), writes it to `out` without the
/// hop-by-hop headers, and returns the body's length; `None` when the peer closed between messages.
/// `spans` is the connection's room for where a typed head's headers lie.
async fn head(
    io: &mut TcpStream,
    buf: &mut BytesMut,
    kind: Kind,
    typed: bool,
    spans: &mut Vec<(Span, Span)>,
    out: &mut Vec<u8>,
) -> io::Result<Option<usize>> {
    loop {
        if typed {
            let base = buf.as_ptr() as usize;
            let span = |part: &[u8]| (part.as_ptr() as usize - base, part.len());
            let found = scan(buf, kind, |line, headers| {
                spans.clear();
                spans.extend(
                    headers
                        .iter()
                        .map(|h| (span(h.name.as_bytes()), span(h.value))),
                );
                Ok(line.map(span))
            })?;
            if let Some((parsed, line)) = found {
                return write_typed(line, spans, &buf.split_to(parsed).freeze(), out).map(Some);
            }
        } else if let Some((parsed, len)) =
            scan(buf, kind, |line, headers| write(line, headers, out))?
        {
            buf.advance(parsed);
            return Ok(Some(len));
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(8192);
        }
        if io.read_buf(buf).await? == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
    }
}

fn invalid(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Where a part of a head lies in the buffer it was read into: offset and length.
type Span = (usize, usize);

/// A head's start line, its parts as bytes or as [`Span`]s.
enum Line<P> {
    Request { method: P, path: P },
    Response { code: u16, reason: P },
}

impl<P> Line<P> {
    fn map<Q>(self, f: impl Fn(P) -> Q) -> Line<Q> {
        match self {
            Line::Request { method, path } => Line::Request {
                method: f(method),
                path: f(path),
            },
            Line::Response { code, reason } => Line::Response {
                code,
                reason: f(reason),
            },
        }
    }
}

/// Parses the head at the start of `buf`, once it is all there, and hands its start line and
/// headers to `then`: the head's length and what `then` made of it.
fn scan<T>(
    buf: &[u8],
    kind: Kind,
    then: impl FnOnce(Line<&[u8]>, &[httparse::Header<'_>]) -> io::Result<T>,
) -> io::Result<Option<(usize, T)>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    match kind {
        Kind::Request => {
            let mut req = httparse::Request::new(&mut headers);
            let httparse::Status::Complete(parsed) = req.parse(buf).map_err(invalid)? else {
                return Ok(None);
            };
            let (Some(method), Some(path)) = (req.method, req.path) else {
                return Err(invalid("request line"));
            };
            let line = Line::Request {
                method: method.as_bytes(),
                path: path.as_bytes(),
            };
            Ok(Some((parsed, then(line, req.headers)?)))
        }
        Kind::Response => {
            let mut res = httparse::Response::new(&mut headers);
            let httparse::Status::Complete(parsed) = res.parse(buf).map_err(invalid)? else {
                return Ok(None);
            };
            let code = res.code.ok_or_else(|| invalid("status line"))?;
            let line = Line::Response {
                code,
                reason: res.reason.unwrap_or("").as_bytes(),
            };
            Ok(Some((parsed, then(line, res.headers)?)))
        }
    }
}

/// Writes a head to `out` as it was read, less the hop-by-hop headers; returns the body's length.
fn write(
    line: Line<&[u8]>,
    headers: &[httparse::Header<'_>],
    out: &mut Vec<u8>,
) -> io::Result<usize> {
    match line {
        Line::Request { method, path } => {
            out.extend_from_slice(method);
            out.push(b' ');
            out.extend_from_slice(path);
            out.extend_from_slice(b" HTTP/1.1\r\n");
        }
        Line::Response { code, reason } => {
            out.extend_from_slice(format!("HTTP/1.1 {code} ").as_bytes());
            out.extend_from_slice(reason);
            out.extend_from_slice(b"\r\n");
        }
    }
    let mut len = 0;
    for header in headers {
        if HOP_BY_HOP
            .iter()
            .any(|name| header.name.eq_ignore_ascii_case(name))
        {
            continue;
        }
        if header.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(invalid(CHUNKED));
        }
        if header.name.eq_ignore_ascii_case("content-length") {
            len = content_length(header.value)?;
        }
        out.extend_from_slice(header.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(header.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(len)
}

/// As [`write`], through a `HeaderMap` whose names and values are slices of `head`, the head split
/// off the read buffer (no copy), as hyper's parser makes them.
fn write_typed(
    line: Line<Span>,
    spans: &[(Span, Span)],
    head: &Bytes,
    out: &mut Vec<u8>,
) -> io::Result<usize> {
    let at = |(offset, len): Span| head.slice(offset..offset + len);
    let mut map = HeaderMap::with_capacity(spans.len());
    for &(name, value) in spans {
        let name = HeaderName::from_bytes(&at(name)).map_err(invalid)?;
        let value = HeaderValue::from_maybe_shared(at(value)).map_err(invalid)?;
        map.append(name, value);
    }
    for name in HOP_BY_HOP {
        map.remove(name);
    }
    if map.contains_key(http::header::TRANSFER_ENCODING) {
        return Err(invalid(CHUNKED));
    }
    let len = match map.get(http::header::CONTENT_LENGTH) {
        Some(value) => content_length(value.as_bytes())?,
        None => 0,
    };
    match line {
        Line::Request { method, path } => {
            let method = http::Method::from_bytes(&at(method)).map_err(invalid)?;
            let uri = http::Uri::from_maybe_shared(at(path)).map_err(invalid)?;
            out.extend_from_slice(method.as_str().as_bytes());
            out.push(b' ');
            out.extend_from_slice(uri.path_and_query().map_or("/", |p| p.as_str()).as_bytes());
            out.extend_from_slice(b" HTTP/1.1\r\n");
        }
        Line::Response { code, .. } => {
            let status = http::StatusCode::from_u16(code).map_err(invalid)?;
            out.extend_from_slice(b"HTTP/1.1 ");
            out.extend_from_slice(status.as_str().as_bytes());
            out.push(b' ');
            out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
    for (name, value) in &map {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(len)
}

fn content_length(value: &[u8]) -> io::Result<usize> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|value| value.trim().parse().ok())
        .ok_or_else(|| invalid("content-length"))
}

/// Appends `len` body bytes to `out`: what `buf` holds first, then from `io`.
async fn body(
    io: &mut TcpStream,
    buf: &mut BytesMut,
    len: usize,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    let have = buf.len().min(len);
    out.extend_from_slice(&buf[..have]);
    buf.advance(have);
    let mut left = len - have;
    while left > 0 {
        buf.reserve(left.min(65536));
        let n = io.read_buf(buf).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let take = n.min(left);
        out.extend_from_slice(&buf[..take]);
        buf.advance(take);
        left -= take;
    }
    Ok(())
}
