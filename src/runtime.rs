//! What the listeners share: the sidecar's state, built once when it starts. `Inbound::new` and
//! `Outbound::new` borrow it and clone the `Arc`s their steps need; the background tasks and the
//! admin listener take theirs from it too.

use std::sync::Arc;

use crate::config::{ConfigStore, Policy};
use crate::idempotency::{Budget, IdempotencyTable};
use crate::local::{Admission, LocalAgent};
use crate::metrics::Metrics;
use crate::peers::PeerViews;
use crate::registry::Registry;

/// The sidecar's shared state.
#[derive(Clone, Debug)]
pub struct Shared {
    pub store: Arc<ConfigStore>,
    pub metrics: Arc<Metrics>,
    /// The peers that serve each capability.
    pub registry: Arc<Registry>,
    /// This caller's view of each peer.
    pub peers: Arc<PeerViews>,
    /// The local agent's own view.
    pub local: Arc<LocalAgent>,
    /// The local agent's slots and queue.
    pub admission: Arc<Admission>,
    /// One table for peers' keys and the local agent's own: one byte budget for both.
    pub idempotency: Arc<IdempotencyTable>,
    /// The key of the delegation chains this sidecar hands its agent (`src/chain.rs`).
    pub seal: Arc<crate::chain::Seal>,
}

impl Shared {
    /// The state of a sidecar running under `store`, its metrics in `metrics`.
    pub fn new(store: Arc<ConfigStore>, metrics: Arc<Metrics>) -> Self {
        let snapshot = store.snapshot();
        let admission = Admission::new(snapshot.bootstrap.agent.max_concurrency.get());
        let local = Arc::new(LocalAgent::new(
            store.clone(),
            metrics.clone(),
            admission.clone(),
        ));
        let peers =
            Arc::new(PeerViews::new(store.clone(), metrics.clone()).with_own_agent(local.clone()));
        Shared {
            idempotency: idempotency_table(&snapshot.policy),
            registry: Arc::new(Registry::new()),
            store,
            metrics,
            peers,
            local,
            admission,
            seal: Arc::default(),
        }
    }
}

fn idempotency_table(policy: &Policy) -> Arc<IdempotencyTable> {
    let p = &policy.idempotency;
    IdempotencyTable::new(Budget {
        max_keys: p.max_keys,
        ttl: p.ttl.get(),
        max_body: p.max_body_bytes,
        max_total_bytes: p.max_total_bytes,
        per_caller_share: p.per_caller_share.get(),
    })
}
