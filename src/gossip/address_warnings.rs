//! Saying loudly that a peer's gossip datagrams break the address rule — a node is heard only
//! from the gossip address it advertises — so a sidecar behind NAT, multi-homed, or with
//! `gossip.advertise` set to an address its datagrams do not leave from is not silently
//! unroutable (docs/gossip.md). At most once a minute per source, for a bounded set of sources.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use super::envelope::Rejected;

/// A source is warned about at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// Sources remembered for that; past this many at once (a key holder spoofing sources), new
/// ones go unwarned until some age out.
const MAX_SOURCES: usize = 1024;

/// Which address rule a peer's datagrams break.
#[derive(Clone, Copy, Debug)]
pub(super) enum AddressRule {
    /// Items sent directly, about a node at another address than their source.
    NotSender,
    /// A `want` naming another address than its source: it is not answered.
    WantSource,
    /// A SWIM message whose sender identity is at another address than its source: its items
    /// count as relayed, never first-hand.
    SwimSource,
}

impl AddressRule {
    fn as_str(self) -> &'static str {
        match self {
            Self::NotSender => Rejected::NotSender.as_str(),
            Self::WantSource => "want_source",
            Self::SwimSource => "swim_source",
        }
    }
}

/// When each source was last warned about.
#[derive(Debug, Default)]
pub(super) struct AddressWarnings(HashMap<SocketAddr, Instant>);

impl AddressWarnings {
    pub(super) fn warn(&mut self, from: SocketAddr, advertised: SocketAddr, rule: AddressRule) {
        let now = Instant::now();
        let recently = self
            .0
            .get(&from)
            .is_some_and(|at| now.saturating_duration_since(*at) < WARN_EVERY);
        if recently || (self.0.len() >= MAX_SOURCES && !self.0.contains_key(&from)) {
            return;
        }
        self.0.insert(from, now);
        tracing::warn!(
            source = %from,
            advertised = %advertised,
            rule = rule.as_str(),
            "gossip: datagrams from {from} come from the sidecar advertising {advertised}; a \
             node is heard only from the gossip address it advertises, so that sidecar's items \
             are refused and it is not routable from here. Set its gossip.advertise to the IP \
             its datagrams leave from, with no NAT between sidecars"
        );
    }

    /// Forgets sources warned about longer ago than the interval.
    pub(super) fn prune(&mut self, now: Instant) {
        self.0
            .retain(|_, at| now.saturating_duration_since(*at) < WARN_EVERY);
    }
}
