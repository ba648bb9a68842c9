//! HTTP plumbing shared by every listener: body type, reach headers, the server loop, the client.

pub(crate) mod activity;
pub mod body;
pub mod client;
pub(crate) mod deadline;
mod error_response;
pub mod headers;
pub mod layers;
pub(crate) mod observed;
pub(crate) mod pool;
pub(crate) mod request_target;
pub(crate) mod retry_after;
pub mod server;
pub(crate) mod step;
pub(crate) mod upload;

pub use body::{BoxError, ReachBody};
