//! The demo's last act: identity and authorization. Every sidecar of the fleet has had a
//! certificate from the start (the fleet speaks mutual TLS in `permissive` mode, so the hostile
//! act's stranger could still talk plaintext). Now the fleet policy turns `strict` and allows
//! `code-review` only to the agents' namespace, live. An intruder with a valid certificate of
//! another namespace joins the fleet and calls `code-review`: every call is refused 403
//! `forbidden` by the agents' sidecars and none reaches an agent; a plaintext stranger is refused
//! at the handshake; the caller's own traffic goes on. Then the intruder goes around its sidecar
//! with its certificate: no `reach-capability` header, a dot-segment path, a forged
//! `x-forwarded-client-cert` claiming an allowed identity; and in plaintext, straight and through
//! a forwarded port (what a stray NAT rule amounts to; the kernel's own DNAT is in
//! `tests/it/intercept.rs`). Each way is counted tried, refused and reached (0). Last, a
//! hijacker with a certificate of another namespace joins with its own agent and claims
//! `code-review`, which the policy says only the agents' namespace serves (`served_by`): the
//! caller's calls meanwhile never reach it, and its claim is counted refused.

use std::time::Duration;

use serde::Serialize;

use super::drive::Calls;
use super::{DemoError, Fleet, CAPABILITY};
use agent_reach::config::{Bootstrap, CapabilityAuthorization, MtlsMode, Policy};
use agent_reach::http::{body, client, headers};
use agent_reach::identity::IdentityPattern;

/// Calls the intruder makes.
const INTRUDER_CALLS: u64 = 20;

#[derive(Clone, Debug, Serialize)]
pub struct AuthorizationSummary {
    /// The caller's SPIFFE ID, as the agents' sidecars saw it.
    pub caller_identity: String,
    /// What `code-review` was opened to.
    pub allowed: String,
    pub intruder_identity: String,
    pub intruder_calls: u64,
    /// Answered 403 with `reach-reason: forbidden`.
    pub intruder_forbidden: u64,
    /// Business calls the agents saw from anyone during the intruder's calls, beyond the
    /// caller's: must be 0.
    pub reached_agents: u64,
    /// `reach_authz_denied_total` summed over the agents' sidecars.
    pub denied_counted: u64,
    /// A plaintext request straight at an agent's inbound port in strict mode: its status.
    pub plaintext_status: u16,
    /// `reach_tls_handshake_failures_total{reason="plaintext"}` at that agent.
    pub plaintext_refusals_counted: u64,
    /// Every way around the mesh the intruder tried, with what came of it.
    pub ways: Vec<Way>,
    /// Requests of all the ways, refused, and how many reached an agent (must be 0).
    pub ways_tried: u64,
    pub ways_refused: u64,
    pub ways_reached: u64,
    /// The caller's traffic meanwhile, over mutual TLS.
    pub calls: u64,
    pub failed: u64,
    /// A member of another namespace claiming to serve `code-review`.
    pub hijacker_identity: String,
    /// The caller's calls its agent got (must be 0).
    pub hijacked_calls: u64,
    /// Claims the caller refused (`reach_claims_refused_total`).
    pub claims_refused: u64,
}

/// One way the intruder tried to reach an agent, and the answer it got.
#[derive(Clone, Debug, Serialize)]
pub struct Way {
    pub way: &'static str,
    /// The status it got (0: the connection was refused or reset).
    pub status: u16,
    pub refused: bool,
}

pub(super) async fn run(
    fleet: &mut Fleet,
    duration: Duration,
    concurrency: usize,
) -> Result<AuthorizationSummary, DemoError> {
    let allowed = format!("{}/ns/agents/sa/*", super::TRUST_DOMAIN);
    let pattern = IdentityPattern::parse(&allowed).map_err(DemoError::Config)?;
    fleet.update_policy(|p| strict(p, &pattern));

    // The intruder: a certificate from the fleet's CA, but of another namespace.
    let intruder_identity = format!("{}/ns/guests/sa/intruder", super::TRUST_DOMAIN);
    let bootstrap = Bootstrap::local("intruder", ([127, 0, 0, 1], 9).into(), &[])
        .map_err(DemoError::Config)?
        .with_gossip(&fleet.seed, fleet.key_dir.join("gossip.key"));
    let bootstrap = fleet.with_tls(bootstrap, &intruder_identity)?;
    let files = bootstrap.tls.clone();
    let intruder = super::start_sidecar(bootstrap, fleet.policy.clone()).await?;
    let knows_all = super::poll(Duration::from_secs(10), || {
        intruder.status().peers.len() >= fleet.agents.len()
    })
    .await
    .is_some();
    // Its calls alone, so what reaches an agent meanwhile is exactly what it got through.
    if !knows_all {
        return Err(DemoError::Config(
            "the intruder did not find the fleet within 10 s".to_owned(),
        ));
    }
    let denied_before = fleet.metric_sum("reach_authz_denied_total{").await;
    let agents_before: u64 = fleet.agents.iter().map(|(a, _)| a.stats().business).sum();
    let mut forbidden = 0;
    let http = client::build(&Policy::default());
    for _ in 0..INTRUDER_CALLS {
        let request = http::Request::post(format!("http://{}/review", intruder.addrs.outbound))
            .header(headers::CAPABILITY, CAPABILITY)
            .body(body::full("steal the code"))
            .map_err(|e| DemoError::Config(e.to_string()))?;
        if let Ok(response) = http.request(request).await {
            let reason = response.headers().get(headers::REASON).cloned();
            if response.status() == 403 && reason.is_some_and(|r| r == "forbidden") {
                forbidden += 1;
            }
        }
    }
    let agents_after: u64 = fleet.agents.iter().map(|(a, _)| a.stats().business).sum();
    let reached = agents_after.saturating_sub(agents_before);
    let denied_counted = fleet
        .metric_sum("reach_authz_denied_total{")
        .await
        .saturating_sub(denied_before);

    // A plaintext stranger at an agent's inbound port.
    let (_, target) = &fleet.agents[0];
    let plain = http::Request::post(format!("http://{}/review", target.addrs.inbound))
        .header(headers::CAPABILITY, CAPABILITY)
        .body(body::full("x"))
        .map_err(|e| DemoError::Config(e.to_string()))?;
    let plaintext_status = http.request(plain).await.map_or(0, |r| r.status().as_u16());
    let plaintext_refusals_counted = super::metric(
        target,
        "reach_tls_handshake_failures_total{reason=\"plaintext\"}",
    )
    .await;
    intruder.shutdown().await;

    // Around its sidecar, with its certificate, and in plaintext.
    let before: u64 = fleet.agents.iter().map(|(a, _)| a.stats().business).sum();
    let ways = around(target.addrs.inbound, files).await;
    let after: u64 = fleet.agents.iter().map(|(a, _)| a.stats().business).sum();
    let ways_reached = after.saturating_sub(before);

    // A hijacker claims code-review: its own sidecar (a policy without served_by) announces it.
    let hijacker_identity = format!("{}/ns/guests/sa/hijacker", super::TRUST_DOMAIN);
    let hijack_agent = super::start_agent("hijacker", &fleet.key_dir.join("hijacker.log")).await?;
    let bootstrap = Bootstrap::local("hijacker", hijack_agent.addr, &[CAPABILITY])
        .map_err(DemoError::Config)?
        .with_gossip(&fleet.seed, fleet.key_dir.join("gossip.key"));
    let bootstrap = fleet.with_tls(bootstrap, &hijacker_identity)?;
    let mut own_policy = fleet.policy.clone();
    own_policy.authorization.capabilities.clear();
    let hijacker = super::start_sidecar(bootstrap, own_policy).await?;
    let caller = &fleet.caller;
    let claimed = super::poll(Duration::from_secs(10), || {
        caller
            .status()
            .refused_claims
            .iter()
            .any(|c| c.peer == "hijacker")
    })
    .await;
    if claimed.is_none() {
        return Err(DemoError::Config(
            "the caller did not hear the hijacker's claim within 10 s".to_owned(),
        ));
    }

    // The caller's own calls go on over strict mutual TLS.
    let calls = Calls::default();
    fleet.traffic(duration, concurrency, calls.clone()).await;
    let calls = calls.take();
    let hijacked_calls = hijack_agent.stats().business;
    let claims_refused = super::metric(caller, "reach_claims_refused_total{").await;
    hijacker.shutdown().await;
    Ok(AuthorizationSummary {
        hijacker_identity,
        hijacked_calls,
        claims_refused,
        caller_identity: format!("{}/ns/agents/sa/caller", super::TRUST_DOMAIN),
        allowed,
        intruder_identity,
        intruder_calls: INTRUDER_CALLS,
        intruder_forbidden: forbidden,
        reached_agents: reached,
        denied_counted,
        plaintext_status,
        plaintext_refusals_counted,
        ways_tried: ways.len() as u64,
        ways_refused: ways.iter().filter(|w| w.refused).count() as u64,
        ways_reached,
        ways,
        calls: calls.len() as u64,
        failed: calls.iter().filter(|c| !c.ok).count() as u64,
    })
}

/// `strict` mutual TLS, and `code-review` opened to `allowed` only and served by them only.
fn strict(policy: &mut Policy, allowed: &IdentityPattern) {
    policy.mtls.mode = Some(MtlsMode::Strict);
    policy.authorization.capabilities.insert(
        CAPABILITY.to_owned(),
        CapabilityAuthorization {
            allow: Some(vec![allowed.clone()]),
            served_by: Some(vec![allowed.clone()]),
        },
    );
}

/// One TLS way in: its name, the path, the headers it adds.
type Attempt<'a> = (&'static str, &'a str, Vec<(&'a str, &'a str)>);

/// The ways around the mesh, each tried once at an agent's inbound `addr`.
async fn around(
    addr: std::net::SocketAddr,
    files: Option<agent_reach::config::TlsFiles>,
) -> Vec<Way> {
    let forged = format!(
        "By={td}/ns/agents/sa/agent;URI={td}/ns/agents/sa/caller",
        td = super::TRUST_DOMAIN
    );
    let claimed = format!("{}/ns/agents/sa/caller", super::TRUST_DOMAIN);
    let tls: [Attempt<'_>; 3] = [
        ("TLS, no reach-capability header", "/review", vec![]),
        (
            "TLS, a dot-segment path",
            "/other/../review",
            vec![("reach-capability", CAPABILITY)],
        ),
        (
            "TLS, a forged x-forwarded-client-cert",
            "/review",
            vec![
                ("x-forwarded-client-cert", forged.as_str()),
                ("reach-caller-identity", claimed.as_str()),
            ],
        ),
    ];
    let mut ways = Vec::new();
    let config = files
        .and_then(|f| agent_reach::transport::mtls::MeshTls::load(f).ok())
        .map(|t| t.current().client.clone());
    for (way, path, extra) in tls {
        let status = match &config {
            Some(config) => direct_tls(addr, config.clone(), path, &extra).await,
            None => 0,
        };
        ways.push(Way {
            way,
            status,
            refused: status != 200,
        });
    }
    let plain = raw(addr, "/review").await;
    ways.push(Way {
        way: "plaintext, no header",
        status: plain,
        refused: plain != 200,
    });
    let forwarded = match forward_port(addr).await {
        Some(relay) => raw(relay, "/review").await,
        None => 0,
    };
    ways.push(Way {
        way: "plaintext through a forwarded port",
        status: forwarded,
        refused: forwarded != 200,
    });
    ways
}

/// One POST over TLS with the intruder's certificate, as a hand-written client sends it: the
/// status, or 0 when the handshake or the connection failed.
async fn direct_tls(
    addr: std::net::SocketAddr,
    config: std::sync::Arc<rustls::ClientConfig>,
    path: &str,
    extra: &[(&str, &str)],
) -> u16 {
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        let name = rustls::pki_types::ServerName::try_from("agent").ok()?;
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .ok()?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut tx, conn) = hyper::client::conn::http1::handshake(io).await.ok()?;
        tokio::spawn(conn);
        let mut request = http::Request::post(path).header(http::header::HOST, "agent");
        for (k, v) in extra {
            request = request.header(*k, *v);
        }
        let response = tx
            .send_request(request.body(body::full("steal the code")).ok()?)
            .await
            .ok()?;
        Some(response.status().as_u16())
    };
    tokio::time::timeout(Duration::from_secs(5), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(0)
}

/// One plaintext POST with no capability header: the status, or 0.
async fn raw(addr: std::net::SocketAddr, path: &str) -> u16 {
    let http = client::build(&Policy::default());
    let Ok(request) = http::Request::post(format!("http://{addr}{path}")).body(body::full("x"))
    else {
        return 0;
    };
    match tokio::time::timeout(Duration::from_secs(5), http.request(request)).await {
        Ok(Ok(response)) => response.status().as_u16(),
        _ => 0,
    }
}

/// A relay from a new loopback port to `to`, for one connection: the port, as a stray
/// port-forward would expose it.
async fn forward_port(to: std::net::SocketAddr) -> Option<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.ok()?;
    let port = listener.local_addr().ok()?;
    tokio::spawn(async move {
        if let Ok((mut client, _)) = listener.accept().await {
            if let Ok(mut upstream) = tokio::net::TcpStream::connect(to).await {
                let _ = tokio::time::timeout(
                    Duration::from_secs(5),
                    tokio::io::copy_bidirectional(&mut client, &mut upstream),
                )
                .await;
            }
        }
    });
    Some(port)
}
