//! The pooled client the prober uses to the local agent ([`AgentClient`]), over its own
//! transport (`transport::connect`); the data path and the self-view poller use `http::pool`.

use std::ops::Deref;
use std::sync::Arc;

use http::uri::Scheme;
use http::Request;
use hyper_util::client::legacy::{self, ResponseFuture};
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::ReachBody;
use crate::config::{ConfigStore, Policy};
use crate::transport::{Connect, ConnectTcp, TcpSettings};

/// The largest read buffer of one upstream connection.
const READ_BUFFER_MAX: usize = 64 * 1024;

/// A pooled HTTP/1.1 client sending absolute URIs (tests, the demo and the benchmarks use it as
/// a plain HTTP client).
pub type UpstreamClient<C = ConnectTcp> = legacy::Client<C, ReachBody>;

/// A pooled client bound to its transport: it knows the scheme its connections speak.
#[derive(Clone, Debug)]
pub struct Upstream<C = ConnectTcp> {
    client: UpstreamClient<C>,
    scheme: Scheme,
}

/// The client to the local agent.
#[derive(Clone, Debug)]
pub struct AgentClient(Upstream);

/// How a client error happened: did the request ever reach the upstream?
#[derive(Debug)]
pub(crate) struct Failure {
    /// The connection was never established.
    pub(crate) connect: bool,
    /// …because it was refused: nothing listens at the address.
    pub(crate) refused: bool,
    /// …because it timed out: on a listener that is up, its accept queue is full.
    pub(crate) timed_out: bool,
    pub(crate) message: String,
}

impl Failure {
    /// A connection that was never made (or a request given back unsent): safe to retry
    /// elsewhere, and neither refused nor timed out.
    pub(crate) fn connect(message: String) -> Self {
        Self {
            connect: true,
            refused: false,
            timed_out: false,
            message,
        }
    }
}

/// A plain-TCP pooled client with the policy's connect and pool settings.
pub fn build(policy: &Policy) -> UpstreamClient {
    pooled(policy, ConnectTcp::new(TcpSettings::from_policy(policy)))
}

/// The same, its connections following the live policy's `timeouts.connect` and
/// `pool.tcp_keepalive`; the pool's own settings are the ones at build (restart-only keys).
pub(crate) fn following(store: &Arc<ConfigStore>) -> UpstreamClient {
    pooled(
        &store.snapshot().policy,
        ConnectTcp::following(store.clone()),
    )
}

/// Pools connections made by `connect`. Idle connections expire, and the transport's keepalive
/// notices a peer that vanished without a FIN.
fn pooled<C: Connect>(policy: &Policy, connect: C) -> UpstreamClient<C> {
    legacy::Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(policy.pool.idle_timeout.get())
        .pool_max_idle_per_host(policy.pool.max_idle_per_host)
        // Each pooled connection keeps its read buffer; hyper grows it to ~400 KiB for a large
        // response, so 64 idle connections could hold 25 MiB. Bodies stream in 64 KiB reads.
        .http1_max_buf_size(READ_BUFFER_MAX)
        // The sidecar sets Host itself: the capability authority is not the peer's address.
        .set_host(false)
        .build(connect)
}

// === impl Upstream ===

impl<C: Connect> Upstream<C> {
    pub(crate) fn new(policy: &Policy, connect: C) -> Self {
        let scheme = connect.scheme().clone();
        Self {
            client: pooled(policy, connect),
            scheme,
        }
    }

    /// The scheme of this client's upstream URIs.
    pub(crate) fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    pub(crate) fn request(&self, req: Request<ReachBody>) -> ResponseFuture {
        self.client.request(req)
    }
}

// === impl AgentClient ===

impl AgentClient {
    pub fn new(policy: &Policy) -> Self {
        Self(Upstream::new(
            policy,
            ConnectTcp::new(TcpSettings::from_policy(policy)),
        ))
    }
}

impl AgentClient {
    /// Its connections follow the live policy's connect settings (see [`following`]).
    pub(crate) fn following(store: &Arc<ConfigStore>) -> Self {
        Self(Upstream::new(
            &store.snapshot().policy,
            ConnectTcp::following(store.clone()),
        ))
    }
}

impl Deref for AgentClient {
    type Target = Upstream;

    fn deref(&self) -> &Upstream {
        &self.0
    }
}

/// Classifies a client error for the caller.
pub(crate) fn describe(err: &legacy::Error) -> Failure {
    Failure {
        connect: err.is_connect(),
        refused: err.is_connect() && refused(err),
        timed_out: err.is_connect() && timed_out(err),
        message: chain(err),
    }
}

/// An error and its sources, one after another.
pub(crate) fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    message
}

/// Whether a connection was refused (nothing listens there): an `io::Error` of that kind
/// anywhere in the chain.
pub(crate) fn refused(err: &(dyn std::error::Error + 'static)) -> bool {
    io_kind_in_chain(err, std::io::ErrorKind::ConnectionRefused)
}

/// Whether a connect timed out (the transport's connect timeout, or the kernel's): an
/// `io::Error` of that kind anywhere in the chain.
pub(crate) fn timed_out(err: &(dyn std::error::Error + 'static)) -> bool {
    io_kind_in_chain(err, std::io::ErrorKind::TimedOut)
}

fn io_kind_in_chain(err: &(dyn std::error::Error + 'static), kind: std::io::ErrorKind) -> bool {
    let mut source = Some(err);
    while let Some(s) = source {
        let io = s.downcast_ref::<std::io::Error>();
        if io.is_some_and(|io| io.kind() == kind) {
            return true;
        }
        source = s.source();
    }
    false
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::http::body;

    #[tokio::test]
    async fn a_refused_connection_is_described_as_refused_before_reaching_anyone() {
        let addr = {
            let stub = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            stub.local_addr().unwrap()
        };
        let client = AgentClient::new(&Policy::default());
        let uri = format!("{}://{addr}/", client.scheme());
        let err = client
            .request(Request::get(uri).body(body::empty()).unwrap())
            .await
            .expect_err("nothing listens");
        let failure = describe(&err);
        assert!(failure.connect && failure.refused, "{failure:?}");
    }
}
