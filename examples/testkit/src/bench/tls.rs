//! Mutual TLS for the benchmarks: certificates for a caller and a callee sidecar from one
//! throwaway CA, and a handshake loop that measures what a handshake costs in CPU alone.
//!
//! Why a loop besides the sidecars: a pair whose caller keeps no idle connection does a
//! handshake per request, but rustls resumes sessions by default (the client caches tickets per
//! peer, the server keeps 256 sessions), so that pair measures resumed handshakes plus a TCP
//! connect, a request and a close. The loop runs the same configs with no sockets, full (no
//! resumption: both certificates sent and verified) and resumed, so the two can be told apart.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach::config::TlsFiles;
use agent_reach::pki::DevCa;
use agent_reach::transport::mtls::{identity_of, MeshTls};
use rustls::client::Resumption;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, HandshakeKind, ServerConfig, ServerConnection};

/// Certificates for a caller sidecar and a callee sidecar, signed by one throwaway CA.
pub struct Pki {
    pub caller: TlsFiles,
    pub callee: TlsFiles,
    /// The callee's SPIFFE ID: what the caller's static peer names as its `identity`.
    pub callee_id: String,
}

impl Pki {
    /// Writes `tls-caller/` and `tls-callee/` (`tls.crt`, `tls.key`, `ca.crt`) under `dir`.
    pub fn write(dir: &std::path::Path) -> Result<Self, String> {
        let ca = DevCa::new("agent-reach bench CA").map_err(|e| e.to_string())?;
        let id = |sa: &str| format!("spiffe://bench.example/ns/bench/sa/{sa}");
        let caller = ca
            .write_files(&dir.join("tls-caller"), &id("caller"))
            .map_err(|e| e.to_string())?;
        let callee = ca
            .write_files(&dir.join("tls-callee"), &id("callee"))
            .map_err(|e| e.to_string())?;
        Ok(Self {
            caller,
            callee,
            callee_id: id("callee"),
        })
    }
}

/// What the handshake loop measured.
#[derive(Clone, Copy, Debug)]
pub struct Handshakes {
    /// Client and server handshakes completed per second, both sides on one thread.
    pub per_second: f64,
    /// The share of them that were resumed.
    pub resumed: f64,
}

/// Handshakes between the caller's client config and the callee's strict server config (the
/// configs the sidecars load from these files), in memory, for `duration`; `resume` lets the
/// client offer the tickets the server gave it. Each also reads the peer's SPIFFE ID, as the
/// connector and the acceptor do.
pub fn handshake_loop(pki: &Pki, resume: bool, duration: Duration) -> Result<Handshakes, String> {
    let caller = MeshTls::load(pki.caller.clone())
        .map_err(|e| e.to_string())?
        .current();
    let callee = MeshTls::load(pki.callee.clone())
        .map_err(|e| e.to_string())?
        .current();
    let mut client = (*caller.client).clone();
    if !resume {
        client.resumption = Resumption::disabled();
    }
    let client = Arc::new(client);
    let (mut done, mut resumed) = (0u64, 0u64);
    let start = Instant::now();
    while start.elapsed() < duration {
        if handshake(&client, &callee.strict)? == HandshakeKind::Resumed {
            resumed += 1;
        }
        done += 1;
    }
    Ok(Handshakes {
        per_second: done as f64 / start.elapsed().as_secs_f64(),
        resumed: resumed as f64 / (done as f64).max(1.0),
    })
}

/// One handshake, bytes passed between the two ends in memory until neither has more to send
/// (the server's session tickets included, so the client can resume next time).
fn handshake(
    client: &Arc<ClientConfig>,
    server: &Arc<ServerConfig>,
) -> Result<HandshakeKind, String> {
    let name = ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    let mut c = ClientConnection::new(client.clone(), name).map_err(|e| e.to_string())?;
    let mut s = ServerConnection::new(server.clone()).map_err(|e| e.to_string())?;
    let mut buf = Vec::with_capacity(4096);
    for _ in 0..16 {
        if !(c.is_handshaking() || s.is_handshaking() || c.wants_write() || s.wants_write()) {
            let client_sees = c
                .peer_certificates()
                .and_then(|chain| identity_of(&chain[0]));
            let server_sees = s
                .peer_certificates()
                .and_then(|chain| identity_of(&chain[0]));
            if client_sees.is_none() || server_sees.is_none() {
                return Err("a side did not see its peer's SPIFFE ID".to_owned());
            }
            return c
                .handshake_kind()
                .ok_or_else(|| "no handshake kind".to_owned());
        }
        buf.clear();
        while c.wants_write() {
            c.write_tls(&mut buf).map_err(|e| e.to_string())?;
        }
        let mut rd = &buf[..];
        while !rd.is_empty() {
            s.read_tls(&mut rd).map_err(|e| e.to_string())?;
            s.process_new_packets().map_err(|e| e.to_string())?;
        }
        buf.clear();
        while s.wants_write() {
            s.write_tls(&mut buf).map_err(|e| e.to_string())?;
        }
        let mut rd = &buf[..];
        while !rd.is_empty() {
            c.read_tls(&mut rd).map_err(|e| e.to_string())?;
            c.process_new_packets().map_err(|e| e.to_string())?;
        }
    }
    Err("the handshake did not finish".to_owned())
}
