//! A node's timings and identity, and the SWIM settings they make.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::time::Duration;

use crate::gossip::clock::Clock;
use crate::gossip::envelope::{ClusterKey, OVERHEAD};
use crate::gossip::transport::MAX_DATAGRAM;

/// Timings and identity of one node.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    pub(crate) name: String,
    /// The gossip address others reach this node at.
    pub(crate) addr: SocketAddr,
    pub(crate) key: ClusterKey,
    /// Each period the node probes one member.
    pub probe_interval: Duration,
    /// A probe not answered in this time goes indirect.
    pub probe_timeout: Duration,
    /// A suspect that does not refute within this time is declared down.
    pub suspect_timeout: Duration,
    /// The live view is re-published at least this often.
    pub refresh_interval: Duration,
    /// …and at most this often, unless its state changed.
    pub min_publish_interval: Duration,
    /// Envelopes sent further than this from the receiver's clock are refused.
    pub(crate) replay_window: Duration,
    /// Times each item and membership update is passed on, from `expected_members` (see
    /// `max_transmissions`): fixed, not recounted as the fleet grows.
    pub max_transmissions: u8,
    /// Envelope stamps and epochs: the wall clock, or the runtime's for a simulation.
    pub clock: Clock,
    /// Seeds SWIM's random choices (whom to probe, whom to gossip to) for a repeatable
    /// simulation; `None` seeds from the system.
    pub seed: Option<u64>,
    /// For tests of a mixed-version fleet: this node writes its items as the next version of
    /// the sidecar would (`wire::future`). Never set by the sidecar itself.
    #[doc(hidden)]
    pub newer_wire: bool,
}

impl NodeOptions {
    pub fn new(name: impl Into<String>, addr: SocketAddr, key: ClusterKey) -> Self {
        Self {
            name: name.into(),
            addr,
            key,
            probe_interval: Duration::from_secs(1),
            probe_timeout: Duration::from_millis(300),
            suspect_timeout: Duration::from_secs(3),
            refresh_interval: Duration::from_secs(2),
            min_publish_interval: Duration::from_millis(250),
            replay_window: Duration::from_secs(30),
            max_transmissions: max_transmissions(256),
            clock: Clock::Wall,
            seed: None,
            newer_wire: false,
        }
    }

    /// SWIM's settings from these timings.
    pub(super) fn foca_config(&self) -> foca::Config {
        let mut c = foca::Config::new_lan(NonZeroU32::MIN);
        c.probe_period = self.probe_interval.max(Duration::from_millis(10));
        c.probe_rtt = self
            .probe_timeout
            .min(c.probe_period / 2)
            .max(Duration::from_millis(1));
        c.suspect_to_down_after = self.suspect_timeout.max(Duration::from_millis(10));
        c.max_transmissions = std::num::NonZeroU8::new(self.max_transmissions.max(1))
            .unwrap_or(std::num::NonZeroU8::MIN);
        c.max_packet_size = NonZeroUsize::new(MAX_DATAGRAM - OVERHEAD).unwrap_or(NonZeroUsize::MIN);
        // Ask a random member for its member list every few seconds (memberlist's push-pull):
        // a node that missed an update, or a large fleet's join storm, converges in seconds.
        c.periodic_announce = Some(foca::PeriodicParams {
            frequency: Duration::from_secs(5),
            num_members: NonZeroUsize::MIN,
        });
        // After a partition each side holds the other as down; asking one down member every
        // 10 s whether it is back heals the split in seconds (foca's LAN default waits 65 s).
        c.periodic_announce_to_down_members = Some(foca::PeriodicParams {
            frequency: Duration::from_secs(10),
            num_members: NonZeroUsize::MIN,
        });
        c
    }
}

/// Retransmissions for a fleet of `n`: memberlist's 4 × log10(n + 1), at least 4.
pub fn max_transmissions(n: u32) -> u8 {
    let m = (4.0 * (f64::from(n) + 1.0).log10()).ceil();
    (m as u8).max(4)
}
