//! The pooled upstream client: to peer sidecars (outbound) and to the local agent (inbound).

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::ReachBody;
use crate::config::Policy;

/// The largest read buffer of one upstream connection.
const READ_BUFFER_MAX: usize = 64 * 1024;

pub type UpstreamClient = Client<HttpConnector, ReachBody>;

/// Builds a pooled HTTP/1.1 client. Idle connections expire, and TCP keepalive notices a peer that
/// vanished without a FIN, so a half-open pooled connection fails fast instead of hanging.
pub fn build(policy: &Policy) -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(policy.timeouts.connect.get()));
    connector.set_keepalive(Some(policy.pool.tcp_keepalive.get()));
    connector.set_keepalive_interval(Some(Duration::from_secs(5)));
    connector.set_keepalive_retries(Some(3));
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(policy.pool.idle_timeout.get())
        .pool_max_idle_per_host(policy.pool.max_idle_per_host)
        // Each pooled connection keeps its read buffer; hyper grows it to ~400 KiB for a large
        // response, so 64 idle connections could hold 25 MiB. Bodies stream in 64 KiB reads.
        .http1_max_buf_size(READ_BUFFER_MAX)
        // The sidecar sets Host itself: the capability authority is not the peer's address.
        .set_host(false)
        .build(connector)
}

/// How a client error happened: did the request ever reach the upstream?
#[derive(Debug)]
pub struct Failure {
    /// The connection was never established.
    pub connect: bool,
    /// …because it was refused: nothing listens at the address.
    pub refused: bool,
    pub message: String,
}

/// Classifies a client error for the caller.
pub fn describe(err: &hyper_util::client::legacy::Error) -> Failure {
    use std::error::Error as _;
    let mut message = err.to_string();
    let mut refused = false;
    let mut source = err.source();
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        refused |= s
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused);
        source = s.source();
    }
    Failure {
        connect: err.is_connect(),
        refused: refused && err.is_connect(),
        message,
    }
}
