//! A2A agent cards as profiles (`docs/a2a.md`). An A2A agent already says what it can do in its
//! card; writing the same skills again as capabilities is busywork that drifts. With `agent.a2a`
//! set, the sidecar reads its agent's card at start and every `refresh`, and each skill becomes a
//! capability. A change goes live like a bootstrap reload (`ConfigStore::set_card_capabilities`),
//! so admission, probes, metrics, `/status` and the gossiped profile all see one consistent set,
//! and peers route a new skill as soon as the republished profile reaches them.

pub(crate) mod card;
pub(crate) mod fetch;

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub(crate) use card::{import, rewrite_urls};
pub(crate) use fetch::{fetch, MAX_CARD_BYTES};

use crate::config::{ConfigStore, OnReload};
use crate::local::LocalAgent;

/// Where an A2A agent publishes its card, and where a sidecar answers with it.
pub(crate) const CARD_PATH: &str = "/.well-known/agent-card.json";

/// Until the first card is read, it is tried again this often (the agent may start after its
/// sidecar); with `agent.a2a` unset, this is how often the setting is looked at.
const RETRY: Duration = Duration::from_secs(1);

/// Starts the card watcher: it idles while `agent.a2a` is unset, and a reload that sets or
/// clears it takes effect at the next round.
pub(crate) fn spawn(
    store: Arc<ConfigStore>,
    local: Arc<LocalAgent>,
    on_reload: OnReload,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let client = crate::http::client::following(&store);
        let mut imported = false;
        let mut failing = false;
        loop {
            let snapshot = store.snapshot();
            let wait = match &snapshot.bootstrap.agent.a2a {
                None => {
                    if std::mem::take(&mut imported) {
                        local.set_card(None);
                        changed(&store, &on_reload, Vec::new());
                    }
                    RETRY
                }
                Some(config) => {
                    let agent = &snapshot.bootstrap.agent.address;
                    match fetch(&client, agent, &config.card).await {
                        Ok((bytes, json)) => {
                            let found = import(&json, config);
                            for (id, why) in &found.skipped {
                                tracing::warn!(skill = %id, %why, "a2a: skill not imported as a capability");
                            }
                            local.set_card(Some(bytes));
                            changed(&store, &on_reload, found.capabilities);
                            (imported, failing) = (true, false);
                            config.refresh.get()
                        }
                        Err(err) => {
                            // Once per failing streak: the last card read stays in force.
                            if !std::mem::replace(&mut failing, true) {
                                tracing::warn!(%err, "a2a: cannot read the agent's card; keeping the last one read");
                            }
                            if imported {
                                config.refresh.get().min(RETRY * 5)
                            } else {
                                RETRY
                            }
                        }
                    }
                }
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    })
}

/// Hands the card's capabilities to the store; a change is logged and counted as a reload.
fn changed(
    store: &ConfigStore,
    on_reload: &OnReload,
    capabilities: Vec<crate::config::Capability>,
) {
    let names: Vec<String> = capabilities.iter().map(|c| c.name.to_string()).collect();
    if store.set_card_capabilities(capabilities) {
        tracing::info!(skills = ?names, generation = store.snapshot().generation, "a2a: the agent's card changed; capabilities updated");
        on_reload("a2a", crate::config::ReloadResult::Ok);
    }
}
