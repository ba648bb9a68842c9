//! `agent-reach inject`: the mutating admission webhook that adds the sidecar to pods annotated
//! `agent-reach.io/inject: enabled` (or in a namespace labelled so), and manual injection of
//! manifest files. The chart (`charts/agent-reach`) renders its config and registers it.

mod annotations;
mod config;
mod load;
mod manifest;
mod mtls;
mod overrides;
pub mod patch;
mod pod;
mod probes;
mod quantity;
mod review;
mod server;
mod tasks;
#[cfg(test)]
mod tests;

pub use config::InjectorConfig;
pub use manifest::inject_manifests;
pub use patch::apply;
pub use pod::{decide, Decision, OptIn};
pub use server::Injector;
