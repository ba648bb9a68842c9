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
pub(crate) struct Shared {
    pub(crate) store: Arc<ConfigStore>,
    pub(crate) metrics: Arc<Metrics>,
    /// The peers that serve each capability.
    pub(crate) registry: Arc<Registry>,
    /// This caller's view of each peer.
    pub(crate) peers: Arc<PeerViews>,
    /// The local agent's own view.
    pub(crate) local: Arc<LocalAgent>,
    /// The local agent's slots and queue.
    pub(crate) admission: Arc<Admission>,
    /// One table for peers' keys and the local agent's own: one byte budget for both.
    pub(crate) idempotency: Arc<IdempotencyTable>,
    /// The key of the delegation chains this sidecar hands its agent (`src/chain/`).
    pub(crate) seal: Arc<crate::chain::Seal>,
}

impl Shared {
    /// The state of a sidecar running under `store`, its metrics in `metrics`.
    pub(crate) fn new(store: Arc<ConfigStore>, metrics: Arc<Metrics>) -> Self {
        let snapshot = store.snapshot();
        let admission = Admission::new(snapshot.bootstrap.agent.max_concurrency.get());
        let local = Arc::new(LocalAgent::new(
            store.clone(),
            metrics.clone(),
            admission.clone(),
        ));
        let peers =
            Arc::new(PeerViews::new(store.clone(), metrics.clone()).with_own_agent(local.clone()));
        let seal = Arc::new(chain_seal(&store));
        Shared {
            idempotency: idempotency_table(&snapshot.policy),
            registry: Arc::new(Registry::new()),
            store,
            metrics,
            peers,
            local,
            admission,
            seal,
        }
    }
}

/// The chain seal of this sidecar: derived from the gossip key when it has one (its agent's
/// chains then survive a restart, and peers' signed chains are read), else random.
fn chain_seal(store: &ConfigStore) -> crate::chain::Seal {
    let snapshot = store.snapshot();
    let Some(gossip) = &snapshot.bootstrap.gossip else {
        return crate::chain::Seal::default();
    };
    match crate::gossip::ClusterKey::from_file(&gossip_key_path(store, gossip)) {
        Ok(key) => crate::chain::Seal::for_mesh(&key, snapshot.bootstrap.agent.name.as_str()),
        // Gossip reports an unreadable key itself (and the sidecar does not start).
        Err(_) => crate::chain::Seal::default(),
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

/// The gossip key file, a relative path taken from the bootstrap's folder.
pub(crate) fn gossip_key_path(
    store: &ConfigStore,
    gossip: &crate::config::GossipConfig,
) -> std::path::PathBuf {
    match (&store.paths.bootstrap, gossip.key_file.is_relative()) {
        (Some(bootstrap), true) => bootstrap
            .parent()
            .map_or(gossip.key_file.clone(), |dir| dir.join(&gossip.key_file)),
        _ => gossip.key_file.clone(),
    }
}
