//! Mutual TLS between sidecars, over real sockets with certificates made in the test: strict and
//! permissive modes, identity from the certificate (never from the caller's headers),
//! per-capability authorization, certificate rotation under traffic, and a gossip member whose
//! certificate does not match the identity it announced.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::config::{
    Authorization, CapabilityAuthorization, ConfigPaths, MtlsMode, Policy, TlsFiles, Verdict,
};
use agent_reach::identity::{IdentityPattern, SpiffeId};
use agent_reach::pki::DevCa;
use agent_reach::transport::mtls::MeshTls;
use agent_reach::{Bootstrap, Sidecar};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use support::*;

const TRUST_DOMAIN: &str = "spiffe://test.example";

fn id(ns: &str, sa: &str) -> String {
    format!("{TRUST_DOMAIN}/ns/{ns}/sa/{sa}")
}

/// A CA and a scratch directory for this test's certificate files.
struct Pki {
    ca: DevCa,
    dir: PathBuf,
}

impl Pki {
    fn new(tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("agent-reach-mtls-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Self {
            ca: DevCa::new(&format!("test CA {tag}")).unwrap(),
            dir,
        }
    }

    /// `tls.crt`, `tls.key` and `ca.crt` for `spiffe_id`, in a directory named `who`.
    fn files(&self, who: &str, spiffe_id: &str) -> TlsFiles {
        self.ca.write_files(&self.dir.join(who), spiffe_id).unwrap()
    }
}

fn policy(mode: Option<MtlsMode>) -> Policy {
    let mut p = Policy::default();
    p.mtls.mode = mode;
    p
}

async fn start(bootstrap: Bootstrap, policy: Policy) -> Sidecar {
    sidecar_with(bootstrap, policy, ConfigPaths::default()).await
}

fn with_tls(mut b: Bootstrap, files: TlsFiles) -> Bootstrap {
    b.tls = Some(files);
    b
}

/// A sidecar started from `b` with a certificate for `identity` (files under `who`).
async fn meshed(
    pki: &Pki,
    b: Bootstrap,
    who: &str,
    identity: &str,
    mode: Option<MtlsMode>,
) -> Sidecar {
    start(with_tls(b, pki.files(who, identity)), policy(mode)).await
}

/// `coder-1` (agent at `agent`, identity `…/sa/coder`) behind its sidecar, and a caller
/// (`…/sa/caller`) that knows it as a static peer, both under `mode`.
async fn pair(pki: &Pki, agent: SocketAddr, mode: Option<MtlsMode>) -> (Sidecar, Sidecar) {
    let coder = id("agents", "coder");
    let callee = meshed(
        pki,
        Bootstrap::local("coder-1", agent, &[CAP]).unwrap(),
        "coder",
        &coder,
        mode,
    )
    .await;
    let caller = meshed(
        pki,
        caller_of("caller", &callee, "coder-1", &coder),
        "caller",
        &id("agents", "caller"),
        mode,
    )
    .await;
    (callee, caller)
}

/// `coder-1` (identity `…/sa/coder`) behind its sidecar in strict mode.
async fn strict_coder(pki: &Pki, agent: SocketAddr) -> Sidecar {
    let b = Bootstrap::local("coder-1", agent, &[CAP]).unwrap();
    meshed(
        pki,
        b,
        "coder",
        &id("agents", "coder"),
        Some(MtlsMode::Strict),
    )
    .await
}

/// A caller that knows `callee` as a static peer with `identity`.
fn caller_of(name: &str, callee: &Sidecar, callee_name: &str, identity: &str) -> Bootstrap {
    let mut b = Bootstrap::local(name, SocketAddr::from(([127, 0, 0, 1], 9)), &[])
        .unwrap()
        .with_peer(callee_name, callee.addrs.inbound, &[CAP])
        .unwrap();
    b.peers[0].identity = Some(SpiffeId::parse(identity).unwrap());
    b
}

async fn metrics(s: &Sidecar) -> String {
    get(&client(), &format!("http://{}/metrics", s.addrs.admin))
        .await
        .body
}

/// Sends one request straight to `addr` over TLS with `files`' certificate, as a hand-written
/// client (not a sidecar) would: headers are the caller's to choose.
async fn tls_request(
    addr: SocketAddr,
    files: TlsFiles,
    headers: &[(&str, &str)],
) -> Result<Reply, String> {
    tls_call(addr, files, "POST", "/review", headers).await
}

/// [`tls_request`] with any method and path.
async fn tls_call(
    addr: SocketAddr,
    files: TlsFiles,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Reply, String> {
    let tls = MeshTls::load(files).map_err(|e| e.to_string())?;
    tls_with(addr, tls.current().client.clone(), method, path, headers).await
}

/// One request over TLS with `config`, as a hand-written client would send it.
async fn tls_with(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Reply, String> {
    let connector = tokio_rustls::TlsConnector::from(config);
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let stream = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let response = tx
        .send_request(builder.body(Full::new(Bytes::from_static(b"x"))).unwrap())
        .await
        .map_err(|e| e.to_string())?;
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    })
}

// Strict: a peer with a certificate from the trust bundle is served and named by it; plaintext
// and a certificate from another CA are refused at the handshake, counted, and never reach the
// agent.
#[tokio::test]
async fn strict_serves_verified_peers_and_refuses_plaintext_and_a_foreign_ca() {
    let pki = Pki::new("strict");
    let (agent, seen) = echo_agent().await;
    let (callee, caller) = pair(&pki, agent, Some(MtlsMode::Strict)).await;

    let reply = call(&client(), caller.addrs.outbound).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let headers = seen.lock().unwrap().pop().expect("the agent saw the call");
    assert_eq!(
        headers["reach-caller-identity"],
        id("agents", "caller").as_str()
    );
    assert_eq!(headers["reach-caller"], "caller");

    // Plaintext, straight at the inbound port.
    let plain = send(
        &client(),
        "POST",
        &format!("http://{}/review", callee.addrs.inbound),
        &[("reach-capability", CAP)],
        "x",
    )
    .await;
    assert_eq!(plain.status, 403, "{}", plain.body);
    assert_eq!(plain.header("reach-reason"), "mtls_required");

    // A certificate from another CA (the intruder trusts ours, so the refusal is the callee's).
    let other = Pki::new("strict-foreign");
    let mut intruder = other.files("intruder", &id("agents", "caller"));
    intruder.ca = pki.files("trust", &id("agents", "trust")).ca;
    let foreign = tls_request(callee.addrs.inbound, intruder, &[("reach-capability", CAP)]).await;
    assert!(
        foreign.is_err(),
        "a foreign certificate was served: {foreign:?}"
    );

    assert!(
        seen.lock().unwrap().is_empty(),
        "a refused call reached the agent"
    );
    let m = metrics(&callee).await;
    assert_eq!(
        counter(
            &m,
            "reach_tls_handshake_failures_total{reason=\"plaintext\"}"
        ),
        1,
        "{m}"
    );
    assert_eq!(
        counter(
            &m,
            "reach_tls_handshake_failures_total{reason=\"unknown_ca\"}"
        ),
        1,
        "{m}"
    );
}

// Permissive (the default with certificates): plaintext and TLS are both served; only the TLS
// caller gets an identity.
#[tokio::test]
async fn permissive_accepts_plaintext_and_tls() {
    let pki = Pki::new("permissive");
    let (agent, seen) = echo_agent().await;
    let coder = id("agents", "coder");
    let (callee, caller) = pair(&pki, agent, None).await;

    let tls = call(&client(), caller.addrs.outbound).await;
    assert_eq!(tls.status, 200, "{}", tls.body);
    let headers = seen.lock().unwrap().pop().unwrap();
    assert_eq!(
        headers["reach-caller-identity"],
        id("agents", "caller").as_str()
    );

    let plain = send(
        &client(),
        "POST",
        &format!("http://{}/review", callee.addrs.inbound),
        &[("reach-capability", CAP), ("reach-caller-identity", &coder)],
        "x",
    )
    .await;
    assert_eq!(plain.status, 200, "{}", plain.body);
    let headers = seen.lock().unwrap().pop().unwrap();
    assert!(
        !headers.contains_key("reach-caller-identity"),
        "a plaintext caller named its own identity: {headers:?}"
    );
    let m = metrics(&callee).await;
    assert!(!m.contains("reach_tls_handshake_failures_total{"), "{m}");
}

// Authorization: an identity outside a capability's allow list gets 403 `forbidden` naming the
// capability, counted; its agent never sees the call and the caller does not retry it
// elsewhere. An identity inside the list is served.
#[tokio::test]
async fn an_identity_outside_allow_is_forbidden_and_the_agent_never_sees_the_call() {
    let pki = Pki::new("authz");
    let (agent, seen) = echo_agent().await;
    let (agent_2, seen_2) = echo_agent().await;
    let coder = id("agents", "coder");
    let mut callee_policy = policy(Some(MtlsMode::Strict));
    callee_policy.authorization = Authorization {
        default: Verdict::Deny,
        capabilities: HashMap::from([(
            CAP.to_owned(),
            CapabilityAuthorization {
                allow: Some(vec![IdentityPattern::parse(&format!(
                    "{TRUST_DOMAIN}/ns/billing/sa/*"
                ))
                .unwrap()]),
                served_by: None,
            },
        )])
        .into_iter()
        .collect(),
    };
    let callee_files = pki.files("coder", &coder);
    let callee = start(
        with_tls(
            Bootstrap::local("coder-1", agent, &[CAP]).unwrap(),
            callee_files.clone(),
        ),
        callee_policy.clone(),
    )
    .await;
    let callee_2 = start(
        with_tls(
            Bootstrap::local("coder-2", agent_2, &[CAP]).unwrap(),
            callee_files,
        ),
        callee_policy,
    )
    .await;
    let mut stranger = caller_of("stranger", &callee, "coder-1", &coder)
        .with_peer("coder-2", callee_2.addrs.inbound, &[CAP])
        .unwrap();
    stranger.peers[1].identity = Some(SpiffeId::parse(&coder).unwrap());
    let stranger = start(
        with_tls(stranger, pki.files("stranger", &id("dev", "stranger"))),
        policy(Some(MtlsMode::Strict)),
    )
    .await;
    let billing = meshed(
        &pki,
        caller_of("billing", &callee, "coder-1", &coder),
        "billing",
        &id("billing", "invoices"),
        Some(MtlsMode::Strict),
    )
    .await;

    let denied = call(&client(), stranger.addrs.outbound).await;
    assert_eq!(denied.status, 403, "{}", denied.body);
    assert_eq!(denied.header("reach-reason"), "forbidden");
    assert!(denied.body.contains(CAP), "{}", denied.body);
    assert!(
        !denied.body.contains("billing"),
        "the policy leaked: {}",
        denied.body
    );
    assert!(seen.lock().unwrap().is_empty() && seen_2.lock().unwrap().is_empty());
    let refusals = counter(
        &metrics(&callee).await,
        &format!("reach_authz_denied_total{{capability=\"{CAP}\"}}"),
    ) + counter(
        &metrics(&callee_2).await,
        &format!("reach_authz_denied_total{{capability=\"{CAP}\"}}"),
    );
    assert_eq!(refusals, 1, "the 403 was retried on the other peer");

    let allowed = call(&client(), billing.addrs.outbound).await;
    assert_eq!(allowed.status, 200, "{}", allowed.body);
    let headers = seen
        .lock()
        .unwrap()
        .pop()
        .expect("the agent saw the allowed call");
    assert_eq!(
        headers["reach-caller-identity"],
        id("billing", "invoices").as_str()
    );
}

// The caller is who its certificate says: a client with a valid certificate that writes
// `reach-caller` and `reach-caller-identity` itself has both replaced.
#[tokio::test]
async fn a_forged_caller_header_is_replaced_by_the_certificates_identity() {
    let pki = Pki::new("forged");
    let (agent, seen) = echo_agent().await;
    let callee = strict_coder(&pki, agent).await;
    let reply = tls_request(
        callee.addrs.inbound,
        pki.files("writer", &id("agents", "writer")),
        &[
            ("reach-capability", CAP),
            ("reach-caller", "admin"),
            ("reach-caller-identity", &id("kube-system", "admin")),
        ],
    )
    .await
    .unwrap();
    assert_eq!(reply.status, 200, "{}", reply.body);
    let headers = seen.lock().unwrap().pop().unwrap();
    assert_eq!(
        headers["reach-caller-identity"],
        id("agents", "writer").as_str()
    );
    assert_eq!(
        headers["reach-caller"], "writer",
        "the service account, not the claim"
    );
    assert_eq!(headers.get_all("reach-caller-identity").iter().count(), 1);
}

// The inbound listener offers ALPN h2 and http/1.1: a client that speaks only h2 over TLS is
// served over h2.
#[tokio::test]
async fn an_h2_client_negotiates_h2_by_alpn() {
    let pki = Pki::new("alpn");
    let (agent, seen) = echo_agent().await;
    let callee = strict_coder(&pki, agent).await;
    let tls = MeshTls::load(pki.files("h2", &id("agents", "h2"))).unwrap();
    let mut config = (*tls.current().client).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(callee.addrs.inbound)
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let stream = connector.connect(name, tcp).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut tx, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let request = Request::post(format!("https://{}/review", callee.addrs.inbound))
        .header("reach-capability", CAP)
        .body(Full::new(Bytes::from_static(b"x")))
        .unwrap();
    let response = tx.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), http::Version::HTTP_2);
    let headers = seen.lock().unwrap().pop().unwrap();
    assert_eq!(
        headers["reach-caller-identity"],
        id("agents", "h2").as_str()
    );
}

/// Rewrites a certificate pair in place the way a careless rotation would: the key first, the
/// certificate a moment later (a reader in between sees a pair that does not match).
fn rotate(ca: &DevCa, files: &TlsFiles, spiffe_id: &str) {
    let issued = ca.issue(spiffe_id, Duration::from_secs(3600)).unwrap();
    std::fs::write(&files.key, issued.key_pem).unwrap();
    std::thread::sleep(Duration::from_millis(60));
    std::fs::write(&files.cert, issued.cert_pem).unwrap();
}

// Rotation under traffic: both sides' certificates are rewritten (half-written pairs included)
// while calls keep flowing; not one call fails, and the renewed certificates are taken up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_the_certificates_under_traffic_loses_no_request() {
    let pki = Pki::new("rotate");
    let agent = mock(testkit::MockConfig::new("coder-1")).await;
    let coder = id("agents", "coder");
    let callee_files = pki.files("coder", &coder);
    let caller_files = pki.files("caller", &id("agents", "caller"));
    let fast = |mut b: Bootstrap| {
        b.watch_interval = agent_reach::config::HumanDuration::from_millis(20);
        b
    };
    let callee = start(
        fast(with_tls(
            Bootstrap::local("coder-1", agent.addr, &[CAP]).unwrap(),
            callee_files.clone(),
        )),
        policy(Some(MtlsMode::Strict)),
    )
    .await;
    let caller = start(
        fast(with_tls(
            caller_of("caller", &callee, "coder-1", &coder),
            caller_files.clone(),
        )),
        policy(Some(MtlsMode::Strict)),
    )
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(Mutex::new(Vec::new())),
    );
    let mut workers = Vec::new();
    for _ in 0..4 {
        let (stop, ok, failed, outbound) = (
            stop.clone(),
            ok.clone(),
            failed.clone(),
            caller.addrs.outbound,
        );
        workers.push(tokio::spawn(async move {
            // A fresh client now and then: new connections, so new handshakes, during rotation.
            let mut c = client();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let reply = call(&c, outbound).await;
                if reply.status == 200 {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed
                        .lock()
                        .unwrap()
                        .push(format!("{} {}", reply.status, reply.body));
                }
                n += 1;
                if n % 10 == 0 {
                    c = client();
                }
            }
        }));
    }
    let ca = Arc::new(pki.ca);
    for round in 0..4 {
        let (ca, callee_files, caller_files, coder) = (
            ca.clone(),
            callee_files.clone(),
            caller_files.clone(),
            coder.clone(),
        );
        tokio::task::spawn_blocking(move || {
            if round % 2 == 0 {
                rotate(&ca, &callee_files, &coder);
            } else {
                rotate(&ca, &caller_files, &id("agents", "caller"));
            }
        })
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let failed = failed.lock().unwrap().clone();
    assert!(
        failed.is_empty(),
        "failed calls during rotation: {failed:?}"
    );
    assert!(
        ok.load(Ordering::Relaxed) > 20,
        "too little traffic to tell"
    );
    let (callee_m, caller_m) = (metrics(&callee).await, metrics(&caller).await);
    let renewed = |m: &str| counter(m, "reach_config_reloads_total{file=\"tls\",result=\"ok\"}");
    assert_eq!(renewed(&callee_m), 2, "{callee_m}");
    assert_eq!(renewed(&caller_m), 2, "{caller_m}");
    // The renewed pair is what new handshakes get: the caller's new certificate is accepted.
    let reply = call(&client(), caller.addrs.outbound).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
}

fn gossip_key(pki: &Pki) -> PathBuf {
    std::fs::create_dir_all(&pki.dir).unwrap();
    let path = pki.dir.join("gossip.key");
    let secret: [u8; 32] = rand::random();
    std::fs::write(
        &path,
        secret
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>(),
    )
    .unwrap();
    path
}

// A holder of the gossip key announces a member that claims agent-b's identity at an address
// where a sidecar with another certificate listens. Callers route to it, find the certificate
// does not match, and move on: its agent gets no traffic and no call fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gossip_member_whose_certificate_does_not_match_its_identity_gets_no_traffic() {
    use agent_reach::gossip::{self, Live, NodeOptions, Profile};
    let pki = Pki::new("hijack");
    let key = gossip_key(&pki);
    let b_identity = id("agents", "coder-b");
    let fast = |mut b: Bootstrap| {
        if let Some(g) = b.gossip.as_mut() {
            g.probe_interval = agent_reach::config::HumanDuration::from_millis(200);
            // Generous under a loaded machine: a member suspected dead mid-test would leave.
            g.probe_timeout = agent_reach::config::HumanDuration::from_millis(300);
            g.suspect_timeout = agent_reach::config::HumanDuration::from_secs(3);
            g.refresh_interval = agent_reach::config::HumanDuration::from_millis(500);
        }
        b
    };
    let a = start(
        fast(with_tls(
            Bootstrap::local("agent-a", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
                .unwrap()
                .with_gossip(&[], key.clone()),
            pki.files("a", &id("agents", "caller")),
        )),
        policy(None),
    )
    .await;
    let seed = a.addrs.gossip.unwrap();
    let b_agent = mock(testkit::MockConfig::new("agent-b")).await;
    let _b = start(
        fast(with_tls(
            Bootstrap::local("agent-b", b_agent.addr, &[CAP])
                .unwrap()
                .with_gossip(&[seed], key.clone()),
            pki.files("b", &b_identity),
        )),
        policy(None),
    )
    .await;
    // The rogue's sidecar: a real certificate from the fleet's CA, under its own identity.
    let rogue_agent = mock(testkit::MockConfig::new("rogue")).await;
    let rogue = meshed(
        &pki,
        Bootstrap::local("rogue", rogue_agent.addr, &[CAP]).unwrap(),
        "rogue",
        &id("agents", "rogue"),
        None,
    )
    .await;
    // The forger's gossip node announces "agent-evil" at the rogue's address as agent-b.
    let stop = tokio_util::sync::CancellationToken::new();
    let (transport, inbox, bound) = gossip::transport::udp(any_port(), stop.clone())
        .await
        .unwrap();
    let cluster = gossip::ClusterKey::from_file(&key).unwrap();
    let mut options = NodeOptions::new("agent-evil", bound, cluster);
    options.probe_interval = Duration::from_millis(200);
    options.probe_timeout = Duration::from_millis(300);
    options.suspect_timeout = Duration::from_secs(3);
    options.refresh_interval = Duration::from_millis(500);
    let evil = gossip::spawn(options, transport, inbox, Arc::new(Quiet), stop.clone());
    evil.announce(vec![seed]);
    evil.publish_profile(Profile {
        inbound: rogue.addrs.inbound.to_string(),
        zone: String::new(),
        region: String::new(),
        max_concurrency: 64,
        capabilities: vec![wire_capability(CAP)],
        version: "forged".into(),
        identity: Some(SpiffeId::parse(&b_identity).unwrap()),
    });
    evil.publish_live(Live {
        profile_seq: 0,
        state: agent_reach::reach::State::Healthy,
        state_age_s: 0,
        cap: 1000,
        availability: 1000,
        saturation: 0,
        latency_ms: Some(1),
        p50_ms: None,
        p95_ms: None,
        busy: false,
        cooling_down: false,
        in_flight: 0,
        queued: 0,
        saturation_predicted: 0,
        quality_milli: None,
        degraded: false,
        budget: Vec::new(),
    });
    let knows = |name: &'static str| {
        let a = &a;
        async move { a.status().peers.iter().any(|p| p.name == name) }
    };
    eventually(
        Duration::from_secs(15),
        "A to know agent-b and agent-evil",
        || async {
            // As a sidecar does until it has members: announce again (a lost join, a member
            // declared dead while the machine was busy).
            evil.announce(vec![seed]);
            knows("agent-b").await && knows("agent-evil").await
        },
    )
    .await;

    for _ in 0..30 {
        let reply = call(&client(), a.addrs.outbound).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.json()["agent"], "agent-b");
    }
    assert_eq!(rogue_agent.stats().business, 0, "the rogue got work");
    assert!(b_agent.stats().business >= 30);
    stop.cancel();
}

// === attacks (an outside review's findings, each refused) ===

/// The paths the agent was sent, in order.
fn paths(seen: &Mutex<Vec<http::HeaderMap>>) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|h| h["x-seen-path"].to_str().unwrap().to_owned())
        .collect()
}

/// `pay-1`: an agent serving `payments` on `/pay` (billing only) and `review` on `/review`
/// (anyone), behind a sidecar in `mode`.
async fn payments_callee(pki: &Pki, agent: SocketAddr, mode: MtlsMode) -> Sidecar {
    let mut b = Bootstrap::local("pay-1", agent, &["payments", "review"]).unwrap();
    b.agent.capabilities[0].paths = vec!["/pay".to_owned()];
    b.agent.capabilities[1].paths = vec!["/review".to_owned()];
    let mut p = policy(Some(mode));
    p.authorization = Authorization {
        default: Verdict::Allow,
        capabilities: [(
            "payments".to_owned(),
            CapabilityAuthorization {
                allow: Some(vec![IdentityPattern::parse(&format!(
                    "{TRUST_DOMAIN}/ns/billing/sa/*"
                ))
                .unwrap()]),
                served_by: None,
            },
        )]
        .into_iter()
        .collect(),
    };
    start(with_tls(b, pki.files("pay", &id("payments", "pay"))), p).await
}

// Findings 1, 3 and 5: a caller with a valid certificate of another namespace tries every way
// to `POST /pay` in strict — no header, another capability's header, dot segments, encoded
// names, merged slashes, a forged XFCC, plaintext — and none reaches the agent's /pay.
#[tokio::test]
async fn a_certified_stranger_tries_every_way_to_pay_and_none_reaches_the_agent() {
    let pki = Pki::new("attack");
    let (agent, seen) = echo_agent().await;
    let callee = payments_callee(&pki, agent, MtlsMode::Strict).await;
    let inbound = callee.addrs.inbound;
    let intruder = pki.files("intruder", &id("dev", "intruder"));
    // Path, headers, the status and reason it must get.
    type Attempt<'a> = (&'a str, &'a [(&'a str, &'a str)], u16, &'a str);
    let attempts: [Attempt<'_>; 9] = [
        ("/pay", &[], 403, "forbidden"),
        (
            "/pay",
            &[("reach-capability", "payments")],
            403,
            "forbidden",
        ),
        (
            "/pay",
            &[("reach-capability", "review")],
            400,
            "capability_path_mismatch",
        ),
        (
            "/review/../pay",
            &[("reach-capability", "review")],
            400,
            "bad_request",
        ),
        (
            "/review/%2e%2e/pay",
            &[("reach-capability", "review")],
            400,
            "bad_request",
        ),
        ("/p%61y", &[], 403, "forbidden"),
        (
            "//pay",
            &[("reach-capability", "review")],
            400,
            "capability_path_mismatch",
        ),
        ("/pay;x=1", &[], 403, "forbidden"),
        ("/admin", &[], 404, "unknown_capability"),
    ];
    for (path, headers, status, reason) in attempts {
        let reply = tls_call(inbound, intruder.clone(), "POST", path, headers)
            .await
            .unwrap();
        assert_eq!(reply.status, status, "{path} {headers:?}: {}", reply.body);
        assert_eq!(reply.header("reach-reason"), reason, "{path} {headers:?}");
    }
    let plain = send(
        &client(),
        "POST",
        &format!("http://{inbound}/pay"),
        &[],
        "x",
    )
    .await;
    assert_eq!(plain.status, 403, "{}", plain.body);
    assert_eq!(plain.header("reach-reason"), "mtls_required");
    assert!(
        paths(&seen).is_empty(),
        "reached the agent: {:?}",
        paths(&seen)
    );

    // What the stranger may call it gets, with forwarding headers that are the sidecar's.
    let forged =
        "By=spiffe://test.example/ns/payments/sa/pay;URI=spiffe://test.example/ns/billing/sa/api";
    let reply = tls_call(
        inbound,
        intruder.clone(),
        "POST",
        "/review",
        &[
            ("x-forwarded-client-cert", forged),
            ("x-forwarded-for", "10.9.9.9"),
            ("forwarded", "for=10.9.9.9"),
        ],
    )
    .await
    .unwrap();
    assert_eq!(reply.status, 200, "{}", reply.body);
    let head = seen.lock().unwrap().pop().unwrap();
    let xfcc = head["x-forwarded-client-cert"].to_str().unwrap();
    assert!(
        xfcc.starts_with(&format!("By={};Hash=", id("payments", "pay")))
            && xfcc.ends_with(&format!(";URI={}", id("dev", "intruder"))),
        "{xfcc}"
    );
    assert_eq!(head.get_all("x-forwarded-client-cert").iter().count(), 1);
    assert_eq!(head["x-forwarded-for"], "127.0.0.1");
    assert!(head.get("forwarded").is_none(), "{head:?}");

    // A billing workload pays, without naming the capability.
    let billing = pki.files("billing", &id("billing", "api"));
    let paid = tls_call(inbound, billing, "POST", "/pay", &[])
        .await
        .unwrap();
    assert_eq!(paid.status, 200, "{}", paid.body);
    assert_eq!(paths(&seen), ["/pay"]);
    let m = metrics(&callee).await;
    assert_eq!(
        counter(&m, "reach_authz_denied_total{capability=\"payments\"}"),
        4,
        "{m}"
    );
}

// Finding 1 in permissive: an anonymous plaintext caller that names nothing is judged by the
// capability its path maps to, not by `default`.
#[tokio::test]
async fn permissive_plaintext_without_a_header_is_refused_an_allow_listed_path() {
    let pki = Pki::new("attack-permissive");
    let (agent, seen) = echo_agent().await;
    let callee = payments_callee(&pki, agent, MtlsMode::Permissive).await;
    let url = |path: &str| format!("http://{}{path}", callee.addrs.inbound);
    let denied = send(&client(), "POST", &url("/pay"), &[], "x").await;
    assert_eq!(denied.status, 403, "{}", denied.body);
    assert_eq!(denied.header("reach-reason"), "forbidden");
    let review = send(&client(), "POST", &url("/review"), &[], "x").await;
    assert_eq!(review.status, 200, "{}", review.body);
    assert_eq!(paths(&seen), ["/review"]);
}

/// A client config presenting `issued` (from `ca`), trusting any server: the attacker's.
fn client_presenting(issued: &agent_reach::pki::Issued) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer))
        .with_client_auth_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// Trusts every server certificate (the attacker does not care who answers).
#[derive(Debug)]
struct AnyServer;

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

// Finding 4: certificates from the bundle's CA that are not SVIDs of the trust domain — no SAN,
// a DNS SAN only, two URI SANs, another trust domain — fail the handshake in both modes,
// counted by reason, and are never served as "nobody" (named by address).
#[tokio::test]
async fn a_certificate_that_is_not_an_svid_of_the_trust_domain_is_refused() {
    let pki = Pki::new("not-svid");
    let (agent, seen) = echo_agent().await;
    let week = Duration::from_secs(7 * 24 * 3600);
    let odd = [
        (
            "no_spiffe_id",
            pki.ca.issue_with("bare", &[], &[], week).unwrap(),
        ),
        (
            "no_spiffe_id",
            pki.ca
                .issue_with("dns", &[], &["coder-a.agents"], week)
                .unwrap(),
        ),
        (
            "several_uri_sans",
            pki.ca
                .issue_with("two", &[&id("billing", "api"), &id("dev", "x")], &[], week)
                .unwrap(),
        ),
        (
            "foreign_trust_domain",
            pki.ca
                .issue_with(
                    "other",
                    &["spiffe://elsewhere.example/ns/billing/sa/api"],
                    &[],
                    week,
                )
                .unwrap(),
        ),
    ];
    for mode in [MtlsMode::Strict, MtlsMode::Permissive] {
        let callee = payments_callee(&pki, agent, mode).await;
        for (reason, issued) in &odd {
            let reply = tls_with(
                callee.addrs.inbound,
                client_presenting(issued),
                "POST",
                "/review",
                &[("reach-caller", "coder-a")],
            )
            .await;
            assert!(reply.is_err(), "{mode:?} {reason}: served: {reply:?}");
        }
        let m = metrics(&callee).await;
        for (reason, want) in [
            ("no_spiffe_id", 2),
            ("several_uri_sans", 1),
            ("foreign_trust_domain", 1),
        ] {
            let series = format!("reach_tls_handshake_failures_total{{reason=\"{reason}\"}}");
            assert_eq!(counter(&m, &series), want, "{mode:?}: {m}");
        }
    }
    assert!(paths(&seen).is_empty(), "{:?}", paths(&seen));
}

// Finding 6: a strict caller whose static peer names no identity still calls it — over TLS,
// to any SVID of the trust domain — instead of dialling plaintext and ejecting it.
#[tokio::test]
async fn a_strict_caller_speaks_tls_to_a_static_peer_that_names_no_identity() {
    let pki = Pki::new("strict-unnamed");
    let (agent, seen) = echo_agent().await;
    let callee = strict_coder(&pki, agent).await;
    let mut b = caller_of("caller", &callee, "coder-1", &id("agents", "coder"));
    b.peers[0].identity = None;
    let caller = meshed(
        &pki,
        b,
        "caller",
        &id("agents", "caller"),
        Some(MtlsMode::Strict),
    )
    .await;
    for _ in 0..3 {
        let reply = call(&client(), caller.addrs.outbound).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let head = seen.lock().unwrap().pop().unwrap();
    assert_eq!(
        head["reach-caller-identity"],
        id("agents", "caller").as_str()
    );
    let m = metrics(&callee).await;
    assert_eq!(
        counter(
            &m,
            "reach_tls_handshake_failures_total{reason=\"plaintext\"}"
        ),
        0,
        "{m}"
    );
}

/// Gossip timings short enough for a test, generous enough for a loaded machine.
fn fast_gossip(mut b: Bootstrap) -> Bootstrap {
    if let Some(g) = b.gossip.as_mut() {
        g.probe_interval = agent_reach::config::HumanDuration::from_millis(200);
        g.probe_timeout = agent_reach::config::HumanDuration::from_millis(300);
        g.suspect_timeout = agent_reach::config::HumanDuration::from_secs(3);
        g.refresh_interval = agent_reach::config::HumanDuration::from_millis(500);
    }
    b
}

// A member with a valid certificate of its own and the gossip key claims `code-review`, which
// the policy says only `billing/payee` serves: not one call (nor its body) reaches it, the
// refusal is counted and shown, and the member's own sidecar, under the same policy, does not
// even announce it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_claiming_a_capability_served_by_another_identity_gets_none_of_its_calls() {
    let pki = Pki::new("served-by");
    let key = gossip_key(&pki);
    let payee = id("billing", "payee");
    let served_by = |mode| {
        let mut p = policy(Some(mode));
        p.authorization.capabilities.insert(
            CAP.to_owned(),
            CapabilityAuthorization {
                allow: None,
                served_by: Some(vec![IdentityPattern::parse(&payee).unwrap()]),
            },
        );
        p
    };
    let caller = start(
        fast_gossip(with_tls(
            Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
                .unwrap()
                .with_gossip(&[], key.clone()),
            pki.files("caller", &id("agents", "caller")),
        )),
        served_by(MtlsMode::Permissive),
    )
    .await;
    let seed = caller.addrs.gossip.unwrap();
    let member = |name: &'static str, identity: String, policy: Policy| {
        let (pki, key) = (&pki, key.clone());
        async move {
            let agent = mock(testkit::MockConfig::new(name)).await;
            let sidecar = start(
                fast_gossip(with_tls(
                    Bootstrap::local(name, agent.addr, &[CAP])
                        .unwrap()
                        .with_gossip(&[seed], key),
                    pki.files(name, &identity),
                )),
                policy,
            )
            .await;
            (agent, sidecar)
        }
    };
    let (payee_agent, _payee) =
        member("payee", payee.clone(), served_by(MtlsMode::Permissive)).await;
    // Mallory runs her own sidecar with a policy of her own: no served_by there.
    let (mallory_agent, _mallory) = member(
        "mallory",
        id("dev", "mallory"),
        policy(Some(MtlsMode::Permissive)),
    )
    .await;
    // A member under the fleet's policy whose identity is not listed: it does not announce it.
    let (_honest_agent, honest) = member(
        "bystander",
        id("dev", "bystander"),
        served_by(MtlsMode::Permissive),
    )
    .await;
    eventually(
        Duration::from_secs(15),
        "the caller to know all three",
        || async {
            let peers = caller.status().peers;
            ["payee", "mallory", "bystander"]
                .iter()
                .all(|n| peers.iter().any(|p| p.name == *n))
        },
    )
    .await;
    let peers = caller.status().peers;
    let bystander = peers.iter().find(|p| p.name == "bystander").unwrap();
    assert!(
        !bystander.capabilities.iter().any(|c| c == CAP),
        "a sidecar not listed in served_by announced {CAP}: {:?}",
        bystander.capabilities
    );
    assert!(honest.status().ready);

    for _ in 0..40 {
        let reply = call(&client(), caller.addrs.outbound).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.json()["agent"], "payee");
    }
    assert_eq!(mallory_agent.stats().business, 0, "mallory got work");
    assert!(payee_agent.stats().business >= 40);
    let status = caller.status();
    assert!(
        status.refused_claims.iter().any(|c| c.peer == "mallory"
            && c.capability == CAP
            && c.identity.as_deref() == Some(id("dev", "mallory").as_str())),
        "{:?}",
        status.refused_claims
    );
    let m = metrics(&caller).await;
    assert_eq!(
        counter(
            &m,
            &format!("reach_claims_refused_total{{kind=\"serve\",subject=\"{CAP}\"}}")
        ),
        1,
        "{m}"
    );
}

// Without mutual TLS nothing is proven: a capability with served_by is routed to nobody rather
// than to whoever claims it.
#[tokio::test]
async fn served_by_without_mtls_routes_to_nobody() {
    let agent = mock(testkit::MockConfig::new("plain")).await;
    let callee = start(
        Bootstrap::local("plain", agent.addr, &[CAP]).unwrap(),
        Policy::default(),
    )
    .await;
    let mut p = Policy::default();
    p.authorization.capabilities.insert(
        CAP.to_owned(),
        CapabilityAuthorization {
            allow: None,
            served_by: Some(vec![IdentityPattern::parse(&id("billing", "*")).unwrap()]),
        },
    );
    let b = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
        .unwrap()
        .with_peer("plain", callee.addrs.inbound, &[CAP])
        .unwrap();
    let caller = start(b, p).await;
    let reply = call(&client(), caller.addrs.outbound).await;
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert_eq!(agent.stats().business, 0);
    assert_eq!(caller.status().refused_claims.len(), 1);
}
