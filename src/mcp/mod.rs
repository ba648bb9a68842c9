//! MCP servers as capabilities (`docs/mcp.md`). With `agent.mcp` set, the sidecar reads its
//! local MCP server's tools at start and every `refresh`, and each tool becomes an entry of the
//! server's capability, gossiped in its profile; callers route each `tools/call` to a server
//! that has the tool and whose tool works (`src/outbound/mcp/`), and answer `tools/list` with
//! the fleet's tools. A change goes live like a bootstrap reload
//! (`ConfigStore::set_mcp_capability`), as an A2A card's does (`src/a2a/mod.rs`).

pub(crate) mod changes;
pub(crate) mod fetch;
pub mod jsonrpc;
pub(crate) mod tools;

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Capability, ConfigStore, HostPort, McpTools, OnReload};

/// Until the first list is read, it is tried again this often (the server may start after its
/// sidecar); with `agent.mcp` unset, this is how often the setting is looked at.
const RETRY: Duration = Duration::from_secs(1);

/// Starts the tool watcher: it idles while `agent.mcp` is unset, and a reload that sets or
/// clears it takes effect at the next round.
pub(crate) fn spawn(
    store: Arc<ConfigStore>,
    on_reload: OnReload,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let client = crate::http::client::following(&store);
        let mut imported = false;
        let mut failing = false;
        // The server's `notifications/tools/list_changed` wake the loop before `refresh`.
        let changed_now = Arc::new(Notify::new());
        let mut listener: Option<JoinHandle<()>> = None;
        // The importer's one session with the server, kept across reads and ended at the end.
        let mut session: Option<(HeaderValue, HostPort, String)> = None;
        loop {
            let snapshot = store.snapshot();
            let wait = match &snapshot.bootstrap.agent.mcp {
                None => {
                    if std::mem::take(&mut imported) {
                        changed(&store, &on_reload, None);
                    }
                    if let Some((id, address, path)) = session.take() {
                        fetch::end(&client, &address, &path, id).await;
                    }
                    RETRY
                }
                Some(config) => {
                    let agent = &snapshot.bootstrap.agent.address;
                    let last = session
                        .as_ref()
                        .filter(|(_, a, p)| a == agent && *p == config.path)
                        .map(|(id, ..)| id.clone());
                    match fetch::tools(&client, agent, &config.path, last).await {
                        Ok(listed) => {
                            session = listed
                                .session
                                .clone()
                                .map(|id| (id, agent.clone(), config.path.clone()));
                            if listener.as_ref().is_none_or(JoinHandle::is_finished) {
                                listener = Some(tokio::spawn(changes::listen(
                                    client.clone(),
                                    agent.clone(),
                                    config.path.clone(),
                                    listed.session.clone(),
                                    changed_now.clone(),
                                )));
                            }
                            let found = tools::import(&listed.tools);
                            for (name, why) in &found.skipped {
                                tracing::warn!(tool = %name, %why, "mcp: tool not imported");
                            }
                            let capability = Capability {
                                mcp: Some(McpTools {
                                    imported: true,
                                    tools: found.tools,
                                }),
                                ..Capability::named(config.capability.clone())
                            };
                            changed(&store, &on_reload, Some(capability));
                            (imported, failing) = (true, false);
                            config.refresh.get()
                        }
                        Err(err) => {
                            // Once per failing streak: the last list read stays in force.
                            if !std::mem::replace(&mut failing, true) {
                                tracing::warn!(%err, "mcp: cannot read the server's tools; keeping the last ones read");
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
                _ = stop.cancelled() => {
                    listener.iter().for_each(JoinHandle::abort);
                    if let Some((id, address, path)) = session.take() {
                        fetch::end(&client, &address, &path, id).await;
                    }
                    return;
                }
                _ = tokio::time::sleep(wait) => {}
                _ = changed_now.notified() => {}
            }
        }
    })
}

/// Hands the server's capability to the store; a change is logged and counted as a reload.
fn changed(store: &ConfigStore, on_reload: &OnReload, capability: Option<Capability>) {
    let tools: Vec<String> = capability
        .iter()
        .flat_map(|c| {
            c.mcp
                .iter()
                .flat_map(|m| m.tools.iter().map(|t| t.name.clone()))
        })
        .collect();
    if store.set_mcp_capability(capability) {
        tracing::info!(
            ?tools,
            generation = store.snapshot().generation,
            "mcp: the server's tools changed; capability updated"
        );
        on_reload("mcp", crate::config::ReloadResult::Ok);
    }
}
