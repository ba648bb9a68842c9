//! The chains this sidecar issues and reads (`docs/chains.md`): its key, which seals the chain
//! handed to its agent and binds it to the inbound call that issued it (the table of calls in
//! flight), and the mesh's key, which signs the chains sent to peers and checks theirs.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderValue};

use super::{split_mesh_mac, Chain, HEADER, UNKNOWN};
use crate::error::ReachError;
use crate::fast_hash::FastMap;

/// `n` in lower-case hex, without the formatting machinery (every inbound call writes two).
fn push_hex(out: &mut String, n: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let digits = (64 - n.leading_zeros()).div_ceil(4).max(1);
    for i in (0..digits).rev() {
        out.push(char::from(DIGITS[((n >> (i * 4)) & 0xf) as usize]));
    }
}

/// The bytes of a MAC kept: 128 bits.
const MAC_BYTES: usize = 16;
/// A chain whose call has ended is still accepted this long: an agent's last calls may leave
/// just as its answer does.
const GRACE: Duration = Duration::from_secs(2);
/// A chain issued by an earlier run of this sidecar (before a restart) is accepted this long
/// after this run started: its call cannot be looked up any more.
const MAX_AGE: Duration = Duration::from_secs(15 * 60);
/// Ended calls remembered for [`GRACE`], at most.
const MAX_ENDED: usize = 4096;

/// Why a chain the agent passed on is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Not written by this sidecar, or changed since.
    Forged,
    /// Written for a call that has ended: an old value passed on again.
    Replayed,
}

impl Refused {
    /// The `why` of `reach_loops_refused_total`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Refused::Forged => "forged",
            Refused::Replayed => "replayed",
        }
    }

    fn error(self, detail: &str) -> ReachError {
        ReachError::BadRequest(match self {
            Refused::Forged => format!(
                "reach-chain {detail}: pass on the value this sidecar gave the agent, unchanged"
            ),
            Refused::Replayed => format!(
                "reach-chain {detail}: pass on the value of the call being served, not an older one"
            ),
        })
    }
}

/// This sidecar's keys for chains: the one it seals its agent's chains with (derived from the
/// gossip key, so it survives a restart; random without gossip), the mesh's, and the calls it
/// issued chains for that are still in flight.
pub(crate) struct Seal {
    key: ring::hmac::Key,
    /// Keys of the mesh: the first signs the chains sent to peers, any verifies theirs.
    mesh: Vec<ring::hmac::Key>,
    /// This run of the sidecar: a chain of another run is judged by when this one started.
    epoch: u32,
    started: Instant,
    next: AtomicU64,
    calls: Mutex<Calls>,
    /// How many calls are in flight, read without the lock by a call that carries no chain.
    live: AtomicUsize,
    /// First hops sealed already: a plain call's chain is the same for every call from one
    /// caller to one capability, so it is sealed once (its call is bound per call, cheaply).
    first_hops: std::sync::RwLock<FirstHops>,
}

/// Capability → caller (`-` for one the sidecar could not name) → (this agent, the peer form,
/// the peer form with its seal).
type FirstHops = FastMap<String, FastMap<String, (String, Arc<str>, Arc<str>)>>;

/// First hops kept at most (past it, the rest are sealed per call).
const MAX_FIRST_HOPS: usize = 4096;

#[derive(Debug, Default)]
struct Calls {
    /// Call → its chain's peer form.
    live: FastMap<u64, Arc<str>>,
    ended: VecDeque<(u64, Arc<str>, Instant)>,
}

/// An inbound call's chain, issued: in flight until dropped (when the call's answer is done).
pub(crate) struct InFlight {
    seal: Arc<Seal>,
    id: u64,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InFlight({})", self.id)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.seal.ended(self.id);
    }
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seal(..)")
    }
}

impl Default for Seal {
    /// Random keys: chains do not outlive this run, and no peer's is read by signature.
    fn default() -> Self {
        Self::with_keys(random_key(), Vec::new())
    }
}

fn random_key() -> ring::hmac::Key {
    let bytes: [u8; 32] = rand::random();
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &bytes)
}

impl Seal {
    /// The seal of the sidecar of `agent` in the mesh of `cluster` (its gossip key).
    pub(crate) fn for_mesh(cluster: &crate::gossip::ClusterKey, agent: &str) -> Self {
        let derive = |secret: &[u8]| ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
        let own = cluster.derive(format!("agent-reach chain seal v1\0{agent}").as_bytes());
        let mesh = cluster.derive(b"agent-reach chain mesh v1");
        let key = own
            .first()
            .map_or_else(random_key, |secret| derive(secret.as_ref()));
        Self::with_keys(key, mesh.iter().map(|s| derive(s.as_ref())).collect())
    }

    fn with_keys(key: ring::hmac::Key, mesh: Vec<ring::hmac::Key>) -> Self {
        Seal {
            key,
            mesh,
            epoch: rand::random(),
            started: Instant::now(),
            next: AtomicU64::new(1),
            calls: Mutex::default(),
            live: AtomicUsize::new(0),
            first_hops: Default::default(),
        }
    }

    fn mac(key: &ring::hmac::Key, text: &str) -> String {
        use base64::Engine as _;
        let tag = ring::hmac::sign(key, text.as_bytes());
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(&tag.as_ref()[..MAC_BYTES.min(tag.as_ref().len())])
    }

    fn verify(key: &ring::hmac::Key, text: &str, mac: &str) -> bool {
        use base64::Engine as _;
        let Ok(mac) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(mac.trim()) else {
            return false;
        };
        let tag = ring::hmac::sign(key, text.as_bytes());
        let expected = &tag.as_ref()[..MAC_BYTES.min(tag.as_ref().len())];
        bool::from(subtle::ConstantTimeEq::ct_eq(expected, mac.as_slice()))
    }

    /// `chain` for an inbound call now starting, as the agent is given it: sealed (this
    /// sidecar's MAC over the peer form) and bound to the call (`;<run>.<call>`). In flight
    /// until the guard drops.
    pub(crate) fn issue(self: &Arc<Self>, chain: &Chain) -> (HeaderValue, InFlight) {
        let text = chain.render();
        let sealed = format!("{text};{}", Self::mac(&self.key, &text));
        self.bind(Arc::from(text), &sealed)
    }

    /// The chain of a call that starts one — `caller` (if vouched for), then `me` serving
    /// `cap`, one hop — issued like [`Seal::issue`]; its seal made once per caller and
    /// capability, then read back.
    pub(crate) fn issue_first(
        self: &Arc<Self>,
        caller: Option<&str>,
        me: &str,
        cap: &str,
    ) -> (HeaderValue, InFlight) {
        let who = caller.unwrap_or(UNKNOWN);
        let known = {
            let hops = self.first_hops.read().unwrap_or_else(|p| p.into_inner());
            let hit = hops.get(cap).and_then(|by| by.get(who));
            hit.filter(|(agent, _, _)| agent == me)
                .map(|(_, text, sealed)| (text.clone(), sealed.clone()))
        };
        let (text, sealed) = known.unwrap_or_else(|| {
            let text = Chain::at_edge(None, caller, me, cap).render();
            let sealed: Arc<str> = Arc::from(format!("{text};{}", Self::mac(&self.key, &text)));
            let text: Arc<str> = Arc::from(text);
            let mut hops = self.first_hops.write().unwrap_or_else(|p| p.into_inner());
            if hops.values().map(|by| by.len()).sum::<usize>() < MAX_FIRST_HOPS {
                let by = hops.entry(cap.to_owned()).or_default();
                by.insert(
                    who.to_owned(),
                    (me.to_owned(), text.clone(), sealed.clone()),
                );
            }
            (text, sealed)
        });
        self.bind(text, &sealed)
    }

    /// `sealed` bound to a new call: the call is in flight with its chain `text`.
    fn bind(self: &Arc<Self>, text: Arc<str>, sealed: &str) -> (HeaderValue, InFlight) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        {
            let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
            calls.live.insert(id, text);
            self.live.store(calls.live.len(), Ordering::Relaxed);
        }
        let mut value = String::with_capacity(sealed.len() + 26);
        value.push_str(sealed);
        value.push(';');
        push_hex(&mut value, u64::from(self.epoch));
        value.push('.');
        push_hex(&mut value, id);
        let guard = InFlight {
            seal: self.clone(),
            id,
        };
        // The value's own bytes become the header's: no copy.
        let value = HeaderValue::from_maybe_shared(bytes::Bytes::from(value))
            .unwrap_or_else(|_| HeaderValue::from_static(""));
        (value, guard)
    }

    fn ended(&self, id: u64) {
        let now = Instant::now();
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        let Some(text) = calls.live.remove(&id) else {
            return;
        };
        self.live.store(calls.live.len(), Ordering::Relaxed);
        while calls.ended.len() >= MAX_ENDED
            || calls
                .ended
                .front()
                .is_some_and(|(_, _, at)| now.duration_since(*at) > GRACE)
        {
            calls.ended.pop_front();
        }
        calls.ended.push_back((id, text, now));
    }

    /// Whether call `id` of this run, with chain `text`, is in flight or ended within
    /// [`GRACE`]: the table, not the seal, says which chain a call has.
    fn current(&self, id: u64, text: &str) -> bool {
        let calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        calls.live.get(&id).is_some_and(|t| &**t == text)
            || calls
                .ended
                .iter()
                .any(|(e, t, at)| *e == id && &**t == text && at.elapsed() <= GRACE)
    }

    /// The chain in a value this sidecar issued, its peer form; refused when this sidecar did
    /// not seal it or it was changed since (`Forged`), or when its call has ended (`Replayed`).
    /// A value of this run is judged by the call table alone; one of an earlier run (before a
    /// restart) by its seal, within [`MAX_AGE`] of this run's start.
    pub(crate) fn open(&self, value: &HeaderValue) -> Result<String, (Refused, ReachError)> {
        let forged = |why: &str| (Refused::Forged, Refused::Forged.error(why));
        let replayed = || {
            (
                Refused::Replayed,
                Refused::Replayed.error("belongs to a call that has ended"),
            )
        };
        let text = value.to_str().map_err(|_| forged("is not text"))?;
        let (sealed, tag) = text
            .rsplit_once(';')
            .ok_or_else(|| forged("carries no call"))?;
        let (chain, mac) = sealed
            .rsplit_once(';')
            .ok_or_else(|| forged("carries no seal"))?;
        let (epoch, id) = tag
            .split_once('.')
            .and_then(|(e, i)| {
                Some((
                    u64::from_str_radix(e, 16).ok()?,
                    u64::from_str_radix(i, 16).ok()?,
                ))
            })
            .ok_or_else(|| forged("carries no call"))?;
        if epoch == u64::from(self.epoch) && self.current(id, chain) {
            return Ok(chain.to_owned());
        }
        if !Self::verify(&self.key, chain, mac) {
            return Err(forged("was not written by this sidecar"));
        }
        let earlier_run = epoch != u64::from(self.epoch);
        if !earlier_run || self.started.elapsed() > MAX_AGE {
            return Err(replayed());
        }
        Chain::parse(chain).map_err(|why| forged(&why))?;
        Ok(chain.to_owned())
    }

    /// The chain of the one call in flight, when exactly one is.
    fn sole_call(&self) -> Option<Arc<str>> {
        if self.live.load(Ordering::Relaxed) != 1 {
            return None;
        }
        let calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        (calls.live.len() == 1)
            .then(|| calls.live.values().next().cloned())
            .flatten()
    }

    /// The chain an outbound call carries to peers, in `headers`: the one the agent passed on
    /// (`sent`), opened; or, when it passed none while its agent serves exactly one call, that
    /// call's. Signed for the mesh. `Ok(true)` when the call carries one.
    pub(crate) fn carry(
        &self,
        headers: &mut HeaderMap,
        sent: bool,
    ) -> Result<bool, (Refused, ReachError)> {
        let text: Arc<str> = match sent.then(|| headers.get(HEADER)).flatten() {
            Some(value) => Arc::from(self.open(value)?),
            None => match self.sole_call() {
                Some(text) => text,
                None => return Ok(false),
            },
        };
        headers.insert(HEADER, self.to_peers(&text));
        Ok(true)
    }

    /// The peer form as sent to peers: signed with the mesh's key when there is one.
    fn to_peers(&self, text: &str) -> HeaderValue {
        match self.mesh.first() {
            Some(key) => crate::http::headers::value(&format!("{text};m{}", Self::mac(key, text))),
            None => crate::http::headers::value(text),
        }
    }

    /// Whether this sidecar signs the chains it sends (it has the gossip key).
    pub(crate) fn signs(&self) -> bool {
        !self.mesh.is_empty()
    }

    /// The chain a caller sent, when it is to be read: signed by a key of the mesh, or from a
    /// caller `vouched` for (its certificate verified; without a mesh key, its address). Anything
    /// else — in a mesh with a key, a plaintext process on a peer's host among it — starts a new
    /// chain.
    pub(crate) fn read_from_peer<'v>(
        &self,
        sent: &'v HeaderValue,
        vouched: bool,
    ) -> Option<&'v str> {
        let text = sent.to_str().ok()?;
        let (chain, mac) = split_mesh_mac(text);
        let signed = mac.is_some_and(|mac| self.mesh.iter().any(|k| Self::verify(k, chain, mac)));
        (signed || vouched).then_some(chain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str) -> HeaderValue {
        HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    #[test]
    fn an_unsigned_chain_from_an_unverified_caller_is_not_read_and_a_mismatched_one_keeps_everything(
    ) {
        let seal = Seal::default();
        let forged = value("0;x");
        assert_eq!(seal.read_from_peer(&forged, false), None);
        let c = Chain::at_edge(seal.read_from_peer(&forged, false), None, "coder", "review");
        assert_eq!(c.render(), "1;->coder/review");
        let c = Chain::at_edge(Some("3;a>b/x>c/y"), Some("d"), "e", "z");
        assert_eq!(c.render(), "4;a>b/x>c/y>d>e/z");
    }

    #[test]
    fn a_chain_signed_for_the_mesh_is_read_from_any_caller_and_a_forged_signature_is_not() {
        let cluster = crate::gossip::ClusterKey::random();
        let a = Arc::new(Seal::for_mesh(&cluster, "a"));
        let b = Seal::for_mesh(&cluster, "b");
        let (sealed, _call) = a.issue(&Chain::at_edge(None, Some("x"), "a", "plan"));
        let mut h = HeaderMap::new();
        h.insert(HEADER, sealed);
        assert_eq!(a.carry(&mut h, true).ok(), Some(true));
        let sent = h[HEADER].clone();
        assert_eq!(b.read_from_peer(&sent, false), Some("1;x>a/plan"));
        assert_eq!(
            Chain::parse(sent.to_str().unwrap()).map(|c| c.hops()),
            Ok(1)
        );
        let outsider = Seal::for_mesh(&crate::gossip::ClusterKey::random(), "b");
        assert_eq!(outsider.read_from_peer(&sent, false), None);
        assert_eq!(
            outsider.read_from_peer(&sent, true),
            Some("1;x>a/plan"),
            "a verified caller"
        );
    }

    #[test]
    fn a_sealed_chain_opens_while_its_call_is_in_flight_and_a_changed_one_is_refused() {
        let seal = Arc::new(Seal::default());
        let chain = Chain::at_edge(None, Some("a"), "b", "review");
        let (sealed, call) = seal.issue(&chain);
        assert_eq!(seal.open(&sealed).ok(), Some(chain.render()));
        let text = sealed.to_str().unwrap_or_default();
        let shortened = text.replacen("1;a>", "0;", 1);
        assert_eq!(
            seal.open(&value(&shortened)).err().map(|e| e.0),
            Some(Refused::Forged)
        );
        assert!(seal.open(&value("0;x")).is_err());
        let other = Seal::default();
        assert_eq!(
            other.open(&sealed).err().map(|e| e.0),
            Some(Refused::Forged)
        );
        drop(call);
        assert!(seal.open(&sealed).is_ok(), "within the grace");
    }

    #[tokio::test(start_paused = true)]
    async fn an_old_value_is_refused_as_replayed() {
        let seal = Arc::new(Seal::default());
        let (sealed, call) = seal.issue(&Chain::at_edge(None, Some("a"), "b", "review"));
        drop(call);
        // Past the grace (the table ages by the monotonic clock).
        let mut calls = seal.calls.lock().unwrap_or_else(|p| p.into_inner());
        calls.ended.clear();
        drop(calls);
        assert_eq!(
            seal.open(&sealed).err().map(|e| e.0),
            Some(Refused::Replayed)
        );
    }

    #[test]
    fn a_call_without_a_chain_continues_the_one_call_in_flight() {
        let seal = Arc::new(Seal::default());
        let mut h = HeaderMap::new();
        assert_eq!(
            seal.carry(&mut h, false).ok(),
            Some(false),
            "nothing in flight"
        );
        let (_, one) = seal.issue(&Chain::at_edge(None, Some("a"), "b", "review"));
        assert_eq!(seal.carry(&mut h, false).ok(), Some(true));
        assert_eq!(h[HEADER], "1;a>b/review");
        let (_, two) = seal.issue(&Chain::at_edge(None, Some("c"), "b", "review"));
        let mut h = HeaderMap::new();
        assert_eq!(
            seal.carry(&mut h, false).ok(),
            Some(false),
            "two in flight: whose?"
        );
        drop((one, two));
    }

    #[test]
    fn a_chain_survives_a_restart_of_its_sidecar() {
        let cluster = crate::gossip::ClusterKey::random();
        let before = Arc::new(Seal::for_mesh(&cluster, "b"));
        let (sealed, _call) = before.issue(&Chain::at_edge(None, Some("a"), "b", "review"));
        let after = Seal::for_mesh(&cluster, "b");
        assert_eq!(after.open(&sealed).ok().as_deref(), Some("1;a>b/review"));
        let elsewhere = Seal::for_mesh(&cluster, "c");
        assert!(elsewhere.open(&sealed).is_err(), "another agent's sidecar");
    }

    #[test]
    fn hex_is_written_as_format_writes_it() {
        for n in [0u64, 1, 15, 16, 255, 0xdead_beef, u64::MAX] {
            let mut out = String::new();
            push_hex(&mut out, n);
            assert_eq!(out, format!("{n:x}"));
        }
    }
}
