//! `agent-reach inject`: the mutating admission webhook that adds the sidecar to pods annotated
//! `agent-reach.io/inject: enabled` (or in a namespace labelled so), and manual injection of
//! manifest files. The chart (`charts/agent-reach`) renders its config and registers it.

mod annotations;
mod config;
mod load;
mod manifest;
mod mtls;
mod overrides;
mod patch;
mod pod;
mod quantity;
mod review;
mod server;
mod tasks;
#[cfg(test)]
mod tests;

pub use annotations::{
    AnnotationError, Settings, A2A, AGENT_PORT, CAPABILITIES, CONFIG, INJECT, INJECTED_LABEL,
    INTERCEPT, MAX_CONCURRENCY, MTLS, PREFIX, PROBE_PATH, STATUS, TASKS, ZONE,
};
pub use config::{Defaults, InjectorConfig, Intercept, Mtls, Prometheus, Tasks, TlsFiles};
pub use manifest::{inject_manifests, ManifestError};
pub use mtls::{TLS_DIR, TLS_VOLUME};
pub use overrides::{
    SidecarOverrides, LOG_LEVEL, PROXY_CPU_LIMIT, PROXY_CPU_REQUEST, PROXY_MEMORY_LIMIT,
    PROXY_MEMORY_REQUEST,
};
pub use patch::{apply, escape, Op, PatchError};
pub use pod::{bootstrap_text, decide, Decision, OptIn, INIT_NET};
pub use review::{answer, Answer, BadReview, Verdict};
pub use server::{load_certified_key, InjectError, Injector};
pub use tasks::{TASKS_DIR, TASKS_VOLUME, WORKLOAD_ENV};
