//! `agent-reach status`: a sidecar's `/status` in the terminal, a header line for the agent and
//! one line per peer as its caller sees it (like `linkerd viz stat`); `--watch` redraws, `--json`
//! prints the document as it came. A plain blocking HTTP/1.0 GET: no runtime, no TLS (the admin
//! port speaks plaintext on the pod's own network).

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

use crate::reach::State;

/// The admin port's default address, as the bootstrap's default listener binds it.
pub const DEFAULT_ADMIN: &str = "http://127.0.0.1:4191";
/// How often `--watch` redraws.
const WATCH_EVERY: Duration = Duration::from_secs(2);
/// Connecting and each read give up after this.
const TIMEOUT: Duration = Duration::from_secs(5);
/// A status document larger than this is not one.
const MAX_BODY: u64 = 64 * 1024 * 1024;

/// Why `/status` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
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

/// Runs `agent-reach status`.
pub fn run(admin: &str, watch: bool, json: bool) -> ExitCode {
    let mut shown = false;
    loop {
        match fetch(admin) {
            Ok((text, doc)) => {
                let frame = if json { text } else { render(&doc) };
                if watch {
                    // Clear the screen and home the cursor, then redraw.
                    print!("\x1b[2J\x1b[H");
                }
                print!("{}", frame.trim_end());
                println!();
                shown = true;
            }
            // Said once and out: nothing answered, so there is nothing to watch.
            Err(err) if !shown => {
                eprintln!("agent-reach status: {err}");
                return ExitCode::FAILURE;
            }
            // While watching, a sidecar restarting is news, not the end.
            Err(err) => eprintln!("agent-reach status: {err}; retrying"),
        }
        if !watch {
            return ExitCode::SUCCESS;
        }
        let _ = std::io::stdout().flush();
        std::thread::sleep(WATCH_EVERY);
    }
}

/// `GET <admin>/status`: the body as sent, and parsed.
pub fn fetch(admin: &str) -> Result<(String, Value), FetchError> {
    let (status, text, url) = exchange(admin, "GET", "/status", b"")?;
    if status != 200 {
        return Err(FetchError::Status { url, status });
    }
    let doc = serde_json::from_str(&text).map_err(|source| FetchError::Json {
        url: url.clone(),
        source,
    })?;
    Ok((text, doc))
}

/// One blocking HTTP/1.0 request to `base` (`http://host:port[/prefix]`) plus `path`: the
/// status, the body as text, and the URL asked.
pub fn exchange(
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
fn split_url(admin: &str) -> Result<(&str, &str), FetchError> {
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

/// The header line and the peer table.
pub fn render(doc: &Value) -> String {
    let mut out = String::new();
    let own = &doc["self"];
    let probe = match doc.get("last_probe").filter(|p| !p.is_null()) {
        None => "no probe yet".to_owned(),
        Some(p) if p["ok"].as_bool() == Some(true) => {
            format!("probe passed {} ago", secs(p["age_s"].as_f64()))
        }
        Some(p) => format!(
            "probe FAILED {} ago: {}",
            secs(p["age_s"].as_f64()),
            p["reason"].as_str().unwrap_or("unknown")
        ),
    };
    let _ = writeln!(
        out,
        "agent {} · {} · cap {} · saturation {} · in flight {}/{} · queued {} · {} · config gen {} · v{}",
        text(&doc["agent"]["name"]),
        text(&own["state"]),
        pct(own["cap"].as_f64()),
        pct(own["saturation"].as_f64()),
        text(&doc["load"]["in_flight"]),
        text(&doc["load"]["limit"]),
        text(&doc["load"]["queued"]),
        probe,
        text(&doc["config_generation"]),
        text(&doc["version"]),
    );
    if let Some(e) = doc.get("reload_error").filter(|e| !e.is_null()) {
        let _ = writeln!(
            out,
            "config reload rejected ({}): {}",
            text(&e["file"]),
            text(&e["message"])
        );
    }
    let mut peers: Vec<&Value> = doc["peer_views"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    peers.sort_by(|a, b| {
        let rank = |p: &Value| {
            serde_json::from_value::<State>(p["effective_state"].clone())
                .map_or(u8::MAX, super::severity)
        };
        rank(a)
            .cmp(&rank(b))
            .then_with(|| text(&a["name"]).cmp(&text(&b["name"])))
    });
    let mut rows = vec![[
        "PEER",
        "STATE",
        "CAP",
        "SCORE",
        "SUCCESS",
        "P50",
        "P95",
        "LAST TRANSITION",
    ]
    .map(str::to_owned)];
    for p in &peers {
        rows.push(peer_row(p));
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[i]);
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    if peers.is_empty() {
        let _ = writeln!(out, "(no peer scored yet)");
    }
    out
}

fn peer_row(p: &Value) -> [String; 8] {
    let o = &p["outcomes"];
    let count = |k: &str| o[k].as_u64().unwrap_or(0);
    let judged = ["success", "failure", "timeout", "refused", "unreachable"]
        .iter()
        .map(|k| count(k))
        .sum::<u64>();
    let success = if judged == 0 {
        "-".to_owned()
    } else {
        format!(
            "{:.1}% ({}/{judged})",
            count("success") as f64 * 100.0 / judged as f64,
            count("success")
        )
    };
    let mut why = Vec::new();
    let own = &p["self_view"];
    if !own.is_null() {
        let own_state = text(&own["view"]["state"]);
        if own_state == text(&p["effective_state"]) && own_state != text(&p["view"]["state"]) {
            why.push(format!("own view {own_state}"));
        }
        let probe = &own["last_probe"];
        if probe["ok"].as_bool() == Some(false) {
            why.push(format!(
                "its probe failed: {}",
                probe["reason"].as_str().unwrap_or("unknown")
            ));
        }
    }
    if let Some(t) = p.get("last_transition").filter(|t| !t.is_null()) {
        why.push(format!(
            "{}→{} {} ago ({})",
            text(&t["from"]),
            text(&t["to"]),
            secs(t["age_s"].as_f64()),
            text(&t["reason"])
        ));
    }
    let last = if why.is_empty() {
        "-".to_owned()
    } else {
        why.join("; ")
    };
    [
        text(&p["name"]),
        text(&p["effective_state"]),
        pct(p["effective_cap"].as_f64()),
        p["last_score"]
            .as_f64()
            .map_or_else(|| "-".to_owned(), |s| format!("{s:.2}")),
        success,
        ms(p["view"]["p50_ms"].as_f64()),
        ms(p["view"]["p95_ms"].as_f64()),
        last,
    ]
}

/// A JSON scalar as text; `-` when absent.
fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn pct(x: Option<f64>) -> String {
    x.filter(|x| x.is_finite())
        .map_or_else(|| "-".to_owned(), |x| format!("{:.0}%", x * 100.0))
}

fn ms(x: Option<f64>) -> String {
    match x.filter(|x| x.is_finite()) {
        Some(x) if x >= 1000.0 => format!("{:.2}s", x / 1000.0),
        Some(x) => format!("{x:.1}ms"),
        None => "-".to_owned(),
    }
}

fn secs(x: Option<f64>) -> String {
    match x.filter(|x| x.is_finite()) {
        Some(x) if x >= 3600.0 => format!("{:.1}h", x / 3600.0),
        Some(x) if x >= 60.0 => format!("{:.0}m", x / 60.0),
        Some(x) => format!("{x:.0}s"),
        None => "?".to_owned(),
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

    #[test]
    fn problems_come_first_in_the_table() {
        let doc = serde_json::json!({
            "agent": { "name": "caller" },
            "self": { "state": "healthy", "cap": 1.0, "saturation": 0.0 },
            "load": { "in_flight": 0, "queued": 0, "limit": 4 },
            "config_generation": 1,
            "version": "0.1.0",
            "peer_views": [
                { "name": "a", "effective_state": "healthy", "effective_cap": 1.0,
                  "view": { "state": "healthy", "p50_ms": 2.0, "p95_ms": 4.0 },
                  "outcomes": { "success": 9, "failure": 1 } },
                { "name": "b", "effective_state": "ejected", "effective_cap": 0.0,
                  "view": { "state": "healthy" },
                  "self_view": { "view": { "state": "ejected" },
                                 "last_probe": { "ok": false, "reason": "status 429" } } }
            ]
        });
        let out = render(&doc);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("agent caller · healthy"), "{out}");
        assert!(lines[1].starts_with("PEER"), "{out}");
        assert!(lines[2].starts_with("b "), "{out}");
        assert!(
            lines[2].contains("own view ejected; its probe failed: status 429"),
            "{out}"
        );
        assert!(lines[3].contains("90.0% (9/10)"), "{out}");
    }
}
