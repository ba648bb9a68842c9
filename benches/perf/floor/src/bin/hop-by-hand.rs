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

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const HOP_BY_HOP: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    "te",
];
const MAX_HEADERS: usize = 64;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        eprintln!("usage: hop-by-hand LISTEN UPSTREAM [typed]");
        return ExitCode::from(2);
    };
    let typed = args.next().is_some_and(|arg| arg == "typed");
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let listener = match TcpListener::bind(&listen).await {
            Ok(listener) => listener,
            Err(err) => {
                eprintln!("bind {listen}: {err}");
                return ExitCode::FAILURE;
            }
        };
        loop {
            let Ok((down, _)) = listener.accept().await else {
                continue;
            };
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let _ = serve(down, &upstream, typed).await;
            });
        }
    })
}

async fn serve(mut down: TcpStream, upstream: &str, typed: bool) -> io::Result<()> {
    down.set_nodelay(true)?;
    let mut up: Option<TcpStream> = None;
    let mut down_buf = BytesMut::with_capacity(8192);
    let mut up_buf = BytesMut::with_capacity(8192);
    let mut out = Vec::with_capacity(1024);
    loop {
        out.clear();
        let Some(len) = head(&mut down, &mut down_buf, Kind::Request, typed, &mut out).await?
        else {
            return Ok(());
        };
        body(&mut down, &mut down_buf, len, &mut out).await?;
        let up = match &mut up {
            Some(up) => up,
            None => {
                let conn = TcpStream::connect(upstream).await?;
                conn.set_nodelay(true)?;
                up.insert(conn)
            }
        };
        up.write_all(&out).await?;
        out.clear();
        let Some(len) = head(up, &mut up_buf, Kind::Response, typed, &mut out).await? else {
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
async fn head(
    io: &mut TcpStream,
    buf: &mut BytesMut,
    kind: Kind,
    typed: bool,
    out: &mut Vec<u8>,
) -> io::Result<Option<usize>> {
    loop {
        if !buf.is_empty() {
            if typed {
                if let Some(len) = parse_typed(buf, kind, out)? {
                    return Ok(Some(len));
                }
            } else if let Some((parsed, len)) = parse(buf, kind, out)? {
                buf.advance(parsed);
                return Ok(Some(len));
            }
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

/// The head's length in `buf` and its body's, once the whole head is there.
fn parse(buf: &[u8], kind: Kind, out: &mut Vec<u8>) -> io::Result<Option<(usize, usize)>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let (parsed, count) = match kind {
        Kind::Request => {
            let mut req = httparse::Request::new(&mut headers);
            let httparse::Status::Complete(parsed) = req.parse(buf).map_err(invalid)? else {
                return Ok(None);
            };
            let (Some(method), Some(path)) = (req.method, req.path) else {
                return Err(invalid("request line"));
            };
            out.extend_from_slice(method.as_bytes());
            out.push(b' ');
            out.extend_from_slice(path.as_bytes());
            out.extend_from_slice(b" HTTP/1.1\r\n");
            (parsed, req.headers.len())
        }
        Kind::Response => {
            let mut res = httparse::Response::new(&mut headers);
            let httparse::Status::Complete(parsed) = res.parse(buf).map_err(invalid)? else {
                return Ok(None);
            };
            let Some(code) = res.code else {
                return Err(invalid("status line"));
            };
            out.extend_from_slice(format!("HTTP/1.1 {code} ").as_bytes());
            out.extend_from_slice(res.reason.unwrap_or("").as_bytes());
            out.extend_from_slice(b"\r\n");
            (parsed, res.headers.len())
        }
    };
    let mut len = 0;
    for header in &headers[..count] {
        if HOP_BY_HOP
            .iter()
            .any(|name| header.name.eq_ignore_ascii_case(name))
        {
            continue;
        }
        if header.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(invalid(
                "chunked bodies are not moved by this measuring stick",
            ));
        }
        if header.name.eq_ignore_ascii_case("content-length") {
            len = std::str::from_utf8(header.value)
                .ok()
                .and_then(|value| value.trim().parse().ok())
                .ok_or_else(|| invalid("content-length"))?;
        }
        out.extend_from_slice(header.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(header.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(Some((parsed, len)))
}

/// As `parse`, through a `HeaderMap`: the head is split off `buf` and its names and values are
/// slices of it (no copy), as hyper's parser makes them.
fn parse_typed(buf: &mut BytesMut, kind: Kind, out: &mut Vec<u8>) -> io::Result<Option<usize>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut spans = [(0usize, 0usize, 0usize, 0usize); MAX_HEADERS];
    let base = buf.as_ptr() as usize;
    let (parsed, count, line) = match kind {
        Kind::Request => {
            let mut req = httparse::Request::new(&mut headers);
            let httparse::Status::Complete(parsed) = req.parse(buf).map_err(invalid)? else {
                return Ok(None);
            };
            let (Some(method), Some(path)) = (req.method, req.path) else {
                return Err(invalid("request line"));
            };
            let method = http::Method::from_bytes(method.as_bytes()).map_err(invalid)?;
            let path = (path.as_ptr() as usize - base, path.len());
            (parsed, req.headers.len(), Line::Request(method, path))
        }
        Kind::Response => {
            let mut res = httparse::Response::new(&mut headers);
            let httparse::Status::Complete(parsed) = res.parse(buf).map_err(invalid)? else {
                return Ok(None);
            };
            let status = res.code.ok_or_else(|| invalid("status line"))?;
            let status = http::StatusCode::from_u16(status).map_err(invalid)?;
            (parsed, res.headers.len(), Line::Response(status))
        }
    };
    for (span, header) in spans.iter_mut().zip(&headers[..count]) {
        let name = header.name.as_ptr() as usize - base;
        let value = header.value.as_ptr() as usize - base;
        *span = (name, header.name.len(), value, header.value.len());
    }
    let head: Bytes = buf.split_to(parsed).freeze();
    let mut map = HeaderMap::with_capacity(count);
    for &(name, name_len, value, value_len) in &spans[..count] {
        let name = HeaderName::from_bytes(&head[name..name + name_len]).map_err(invalid)?;
        let value = HeaderValue::from_maybe_shared(head.slice(value..value + value_len))
            .map_err(invalid)?;
        map.append(name, value);
    }
    for name in HOP_BY_HOP {
        map.remove(name);
    }
    if map.contains_key(http::header::TRANSFER_ENCODING) {
        return Err(invalid(
            "chunked bodies are not moved by this measuring stick",
        ));
    }
    let len = match map.get(http::header::CONTENT_LENGTH) {
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|value| value.trim().parse().ok())
            .ok_or_else(|| invalid("content-length"))?,
        None => 0,
    };
    match line {
        Line::Request(method, (at, len)) => {
            let uri = http::Uri::from_maybe_shared(head.slice(at..at + len)).map_err(invalid)?;
            out.extend_from_slice(method.as_str().as_bytes());
            out.push(b' ');
            out.extend_from_slice(uri.path_and_query().map_or("/", |p| p.as_str()).as_bytes());
            out.extend_from_slice(b" HTTP/1.1\r\n");
        }
        Line::Response(status) => {
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
    Ok(Some(len))
}

enum Line {
    Request(http::Method, (usize, usize)),
    Response(http::StatusCode),
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
