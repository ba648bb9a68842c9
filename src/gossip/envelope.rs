//! The authenticated envelope every gossip datagram travels in.
//!
//! ```text
//! "ARG" | version (1) | kind (1) | sent_at unix µs (8, BE) | body | tag (16)
//! ```
//! The tag is HMAC-SHA256 over everything before it, truncated to 128 bits, under the cluster key.
//! A packet that fails the tag is dropped before a single byte of its body is decoded. A packet
//! older (or newer) than the replay window is dropped, and so is an exact copy of one already
//! accepted within the window: a captured packet cannot be played back.

use std::collections::HashMap;
use std::path::Path;

use ring::hmac;
use subtle::ConstantTimeEq;

const MAGIC: &[u8; 3] = b"ARG";
/// 2: items framed and versioned one by one (`wire`). Version 1 sidecars and these count each
/// other's datagrams `malformed`.
const VERSION: u8 = 2;
const HEADER: usize = 3 + 1 + 1 + 8;
const TAG: usize = 16;
/// Bytes the envelope adds to a body.
pub(crate) const OVERHEAD: usize = HEADER + TAG;
/// Shortest accepted cluster key, in bytes (`openssl rand -base64 32` gives 44).
const MIN_KEY_BYTES: usize = 32;

/// What a datagram carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A SWIM message (foca's own encoding).
    Swim = 0,
    /// State items sent directly to one member (a newcomer's catch-up, a profile on request).
    Items = 1,
    /// "Send me your profile": the receiver answers with `Items`.
    Want = 2,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Self> {
        match b {
            0 => Some(Self::Swim),
            1 => Some(Self::Items),
            2 => Some(Self::Want),
            _ => None,
        }
    }
}

/// Why a datagram (or one item in it) was dropped; the `reason` label of
/// `reach_gossip_rejected_total`. The last five are items that were authenticated but refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("not an agent-reach gossip packet, or a version this sidecar does not speak")]
    Malformed,
    #[error("larger than the largest packet this sidecar accepts")]
    Oversized,
    #[error("authentication failed: wrong cluster key or tampered packet")]
    BadMac,
    #[error("sent outside the replay window (stale, replayed or clock skew)")]
    Expired,
    #[error("an exact copy of a packet already accepted")]
    Replayed,
    #[error("authenticated, but its body does not decode")]
    Undecodable,
    #[error("an item about another node than the one that sent it")]
    NotSender,
    #[error("an item claiming the name of another node that is alive")]
    NameTaken,
    #[error("a profile whose inbound address is not on its node's IP, or has port 0")]
    BadAddress,
    #[error("an item from the future, or with a seq beyond what its node can have published")]
    OutOfRange,
    #[error("an item of a kind this sidecar does not know (a newer sidecar sent it): skipped")]
    UnknownKind,
}

impl Rejected {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Oversized => "oversized",
            Self::BadMac => "bad_mac",
            Self::Expired => "expired",
            Self::Replayed => "replayed",
            Self::Undecodable => "undecodable",
            Self::NotSender => "not_sender",
            Self::NameTaken => "name_taken",
            Self::BadAddress => "bad_address",
            Self::OutOfRange => "out_of_range",
            Self::UnknownKind => "unknown_kind",
        }
    }

    pub(crate) const ALL: [Rejected; 11] = [
        Self::Malformed,
        Self::Oversized,
        Self::BadMac,
        Self::Expired,
        Self::Replayed,
        Self::Undecodable,
        Self::NotSender,
        Self::NameTaken,
        Self::BadAddress,
        Self::OutOfRange,
        Self::UnknownKind,
    ];
}

/// The cluster key file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{path}: cannot read the gossip key: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: a gossip key must be at least {MIN_KEY_BYTES} bytes (line {line} has {len}); make one with `openssl rand -base64 32`")]
    Short {
        path: String,
        line: usize,
        len: usize,
    },
    #[error("{path}: the gossip key file holds no key")]
    Empty { path: String },
}

/// The cluster keys: the first signs, any verifies (so a key can be rotated in two rollouts).
#[derive(Clone)]
pub struct ClusterKey {
    keys: Vec<hmac::Key>,
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterKey({} key(s), redacted)", self.keys.len())
    }
}

impl ClusterKey {
    /// One key per non-empty line; surrounding whitespace is ignored.
    pub fn from_file(path: &Path) -> Result<Self, KeyError> {
        let text = std::fs::read(path).map_err(|source| KeyError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// The keys in a key file's contents (`path` names it in errors).
    pub fn parse(path: &Path, text: &[u8]) -> Result<Self, KeyError> {
        let display = || path.display().to_string();
        let mut keys = Vec::new();
        for (i, line) in text.split(|b| *b == b'\n').enumerate() {
            let line = line.trim_ascii();
            if line.is_empty() {
                continue;
            }
            if line.len() < MIN_KEY_BYTES {
                return Err(KeyError::Short {
                    path: display(),
                    line: i + 1,
                    len: line.len(),
                });
            }
            keys.push(line.to_vec());
        }
        if keys.is_empty() {
            return Err(KeyError::Empty { path: display() });
        }
        Ok(Self::from_secrets(&keys))
    }

    /// Keys from raw secrets (the demo and tests make theirs at random).
    pub fn from_secrets(secrets: &[Vec<u8>]) -> Self {
        let keys = secrets
            .iter()
            .map(|s| hmac::Key::new(hmac::HMAC_SHA256, s))
            .collect();
        Self { keys }
    }

    /// A secret derived from each key for another use (`label` names it): HMAC-SHA256 of the
    /// label under the key, first key first.
    pub(crate) fn derive(&self, label: &[u8]) -> Vec<hmac::Tag> {
        self.keys.iter().map(|k| hmac::sign(k, label)).collect()
    }

    /// A fresh random key.
    pub fn random() -> Self {
        let secret: [u8; 32] = rand::random();
        Self::from_secrets(&[secret.to_vec()])
    }

    /// Wraps `body` in an envelope signed with the first key.
    pub fn seal(&self, kind: Kind, sent_at_us: u64, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(OVERHEAD + body.len());
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(kind as u8);
        out.extend_from_slice(&sent_at_us.to_be_bytes());
        out.extend_from_slice(body);
        if let Some(key) = self.keys.first() {
            let tag = hmac::sign(key, &out);
            out.extend_from_slice(&tag.as_ref()[..TAG]);
        }
        out
    }

    /// Checks an envelope and returns its kind, send time, body and tag.
    pub(crate) fn open<'p>(
        &self,
        packet: &'p [u8],
        max_len: usize,
    ) -> Result<Opened<'p>, Rejected> {
        if packet.len() > max_len {
            return Err(Rejected::Oversized);
        }
        if packet.len() < OVERHEAD || &packet[..3] != MAGIC || packet[3] != VERSION {
            return Err(Rejected::Malformed);
        }
        let (signed, tag) = packet.split_at(packet.len() - TAG);
        // `ring::hmac::verify` wants the whole 32-byte tag and ours is truncated, so the
        // truncated tags are compared in constant time here.
        let genuine = self.keys.iter().any(|key| {
            let full = hmac::sign(key, signed);
            bool::from(full.as_ref()[..TAG].ct_eq(tag))
        });
        if !genuine {
            return Err(Rejected::BadMac);
        }
        let kind = Kind::from_u8(signed[4]).ok_or(Rejected::Malformed)?;
        let mut at = [0u8; 8];
        at.copy_from_slice(&signed[5..HEADER]);
        let mut tag_bytes = [0u8; TAG];
        tag_bytes.copy_from_slice(tag);
        Ok(Opened {
            kind,
            sent_at_us: u64::from_be_bytes(at),
            body: &signed[HEADER..],
            tag: tag_bytes,
        })
    }
}

/// An envelope whose tag verified.
#[derive(Debug)]
pub(crate) struct Opened<'p> {
    pub(crate) kind: Kind,
    pub(crate) sent_at_us: u64,
    pub(crate) body: &'p [u8],
    pub(crate) tag: [u8; TAG],
}

/// Tags of packets accepted within the replay window.
#[derive(Debug, Default)]
pub(crate) struct ReplayGuard {
    seen: HashMap<[u8; TAG], u64>,
}

impl ReplayGuard {
    /// Accepts a packet sent at `sent_at_us` if it is inside the window around `now_us` and not
    /// a copy of one already accepted.
    pub(crate) fn admit(
        &mut self,
        opened: &Opened<'_>,
        now_us: u64,
        window_us: u64,
    ) -> Result<(), Rejected> {
        if opened.sent_at_us.abs_diff(now_us) > window_us {
            return Err(Rejected::Expired);
        }
        if self.seen.contains_key(&opened.tag) {
            return Err(Rejected::Replayed);
        }
        self.seen
            .insert(opened.tag, opened.sent_at_us.saturating_add(window_us));
        Ok(())
    }

    /// Forgets tags whose packets have left the window (they would be `Expired` now).
    pub(crate) fn prune(&mut self, now_us: u64) {
        self.seen.retain(|_, expires| *expires >= now_us);
    }
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// Microseconds since the Unix epoch (the envelope's clock: peers need roughly synced clocks, as
/// NTP gives every Kubernetes node).
pub fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> ClusterKey {
        ClusterKey::from_secrets(&[vec![b; 32]])
    }

    /// The wire bytes of a fixed key, time and body: HMAC-SHA256 truncated to 128 bits, as the
    /// hmac crate computed it before the switch to ring (and any HMAC-SHA256 does).
    #[test]
    fn the_tag_is_known_answer_hmac_sha256_truncated() {
        let packet = key(7).seal(Kind::Items, 1_700_000_000_000_000, b"known answer");
        let hex: String = packet.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            concat!(
                "415247020100060a24181e40006b6e6f776e20616e73776572",
                "5df97c8f30c29494cf1b069dbac66026"
            )
        );
        assert!(key(7).open(&packet, 1400).is_ok());
    }

    #[test]
    fn a_sealed_packet_opens_under_the_same_key_only() {
        let packet = key(1).seal(Kind::Items, 42, b"hello");
        let opened = key(1).open(&packet, 1400);
        assert!(
            matches!(&opened, Ok(o) if o.body == b"hello" && o.kind == Kind::Items && o.sent_at_us == 42)
        );
        assert_eq!(key(2).open(&packet, 1400).err(), Some(Rejected::BadMac));
    }

    #[test]
    fn any_flipped_bit_is_caught() {
        let packet = key(1).seal(Kind::Swim, 42, b"hello world");
        for i in 0..packet.len() {
            let mut bad = packet.clone();
            bad[i] ^= 0x01;
            assert!(key(1).open(&bad, 1400).is_err(), "byte {i}");
        }
    }

    #[test]
    fn garbage_and_oversized_packets_are_rejected_without_panicking() {
        let k = key(1);
        assert_eq!(k.open(b"", 1400).err(), Some(Rejected::Malformed));
        assert_eq!(k.open(b"ARG", 1400).err(), Some(Rejected::Malformed));
        assert_eq!(k.open(&[0u8; 64], 1400).err(), Some(Rejected::Malformed));
        assert_eq!(k.open(&[0u8; 2000], 1400).err(), Some(Rejected::Oversized));
    }

    #[test]
    fn an_envelope_of_another_version_is_malformed() {
        // Version 1 is what sidecars before per-item versioning send.
        let mut packet = key(1).seal(Kind::Items, 42, b"x");
        packet[3] = 1;
        assert_eq!(key(1).open(&packet, 1400).err(), Some(Rejected::Malformed));
    }

    #[test]
    fn a_rotated_key_verifies_while_the_first_signs() {
        let both = ClusterKey::from_secrets(&[vec![2; 32], vec![1; 32]]);
        let old = key(1).seal(Kind::Swim, 1, b"x");
        assert!(both.open(&old, 1400).is_ok(), "old key still verifies");
        let new = both.seal(Kind::Swim, 1, b"x");
        assert!(key(2).open(&new, 1400).is_ok(), "new key signs");
    }

    #[test]
    fn a_replayed_or_stale_packet_is_refused() {
        let k = key(1);
        let mut guard = ReplayGuard::default();
        let packet = k.seal(Kind::Swim, 10_000, b"x");
        let opened = k.open(&packet, 1400);
        assert!(opened.is_ok());
        if let Ok(o) = opened {
            assert_eq!(guard.admit(&o, 10_500, 30_000), Ok(()));
            assert_eq!(guard.admit(&o, 10_600, 30_000), Err(Rejected::Replayed));
            assert_eq!(guard.admit(&o, 50_000, 30_000), Err(Rejected::Expired));
            guard.prune(50_000);
            assert!(guard.is_empty());
        }
    }

    mod properties {
        use proptest::collection::vec;
        use proptest::prelude::*;

        use super::*;

        fn kind() -> impl Strategy<Value = Kind> {
            prop_oneof![Just(Kind::Swim), Just(Kind::Items), Just(Kind::Want)]
        }

        proptest! {
            #[test]
            fn arbitrary_bytes_open_or_give_a_reason(bytes in vec(any::<u8>(), 0..1600)) {
                match key(1).open(&bytes, 1400) {
                    Ok(opened) => prop_assert!(opened.body.len() + OVERHEAD == bytes.len()),
                    Err(reason) => prop_assert!(Rejected::ALL.contains(&reason)),
                }
            }

            #[test]
            fn arbitrary_bytes_behind_a_valid_header_do_not_open(
                kind in 0u8..=255,
                rest in vec(any::<u8>(), 0..1400),
            ) {
                let mut bytes = b"ARG".to_vec();
                bytes.push(VERSION);
                bytes.push(kind);
                bytes.extend_from_slice(&rest);
                let opened = key(1).open(&bytes, 1400);
                prop_assert!(opened.is_err(), "{:?}", opened);
            }

            #[test]
            fn a_sealed_envelope_opens_to_what_was_sealed(
                kind in kind(),
                sent_at in any::<u64>(),
                body in vec(any::<u8>(), 0..(1400 - OVERHEAD)),
            ) {
                let packet = key(1).seal(kind, sent_at, &body);
                let opened = key(1).open(&packet, 1400);
                prop_assert!(
                    matches!(&opened, Ok(o) if o.kind == kind && o.sent_at_us == sent_at && o.body == body.as_slice()),
                    "{:?}", opened
                );
            }

            #[test]
            fn a_changed_sealed_envelope_never_opens(
                body in vec(any::<u8>(), 0..64),
                at in any::<prop::sample::Index>(),
                bits in 1u8..=255,
            ) {
                let mut packet = key(1).seal(Kind::Items, 42, &body);
                let i = at.index(packet.len());
                packet[i] ^= bits;
                prop_assert!(key(1).open(&packet, 1400).is_err());
            }
        }
    }
}
