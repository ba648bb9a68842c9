//! HTTP plumbing shared by every listener: body type, reach headers, the server loop, the client.

pub mod activity;
pub mod body;
pub mod client;
pub mod deadline;
mod error_response;
pub mod headers;
pub mod layers;
pub mod observed;
pub mod pool;
pub mod request_target;
pub mod retry_after;
pub mod server;
pub mod step;
pub mod upload;

pub use body::BoxError;
pub use body::ReachBody;

/// The address a request's connection came from, in the request's extensions (put there by the
/// accept loop; defined with the transport, where the TLS peer identity will join it).
pub(crate) use crate::transport::ClientAddr;
