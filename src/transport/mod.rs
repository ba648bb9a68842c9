//! The transport seam: everything below HTTP. How a client opens a connection to an upstream
//! (plain TCP now, [`connect`]). Routing code never sees which: mutual TLS between sidecars adds
//! a connector here, and nothing above changes.

pub mod connect;

pub use connect::{Connect, ConnectTcp, TcpSettings};
