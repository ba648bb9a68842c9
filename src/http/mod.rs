//! HTTP plumbing shared by every listener: body type, reach headers, the server loop, the client.

pub mod body;
pub mod client;
pub mod deadline;
pub mod forward;
pub mod headers;
pub mod measured;
pub mod server;

pub use body::{BoxError, ReachBody};
