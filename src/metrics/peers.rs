//! Per-peer series, bounded: at most `metrics.max_peer_series` peers get series of their own,
//! chosen among those this caller sends traffic to, and a peer idle for `metrics.idle_timeout`
//! (departed, ejected and forgotten, or simply no longer called) loses them.
//!
//! Why a table of our own and not the exporter's idle timeout: the exporter forgets an idle
//! series by dropping it from its registry, while the request path keeps cached handles to it;
//! an increment through such a handle would land in a counter nobody renders. Here the series
//! and their expiry live in one place, the limits follow the live policy, and the fleet-wide
//! figures stay in the aggregates (`reach_requests_total{capability}`, `reach_peers{state}`),
//! which are exact whatever this table keeps.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::fast_hash::FastMap;
use crate::reach::State;

pub(super) const PEER_REQUESTS_TOTAL: &str = "reach_peer_requests_total";
pub(super) const PEER_STATE: &str = "reach_peer_state";
pub(super) const PEER_CAP: &str = "reach_peer_cap_ratio";
pub(super) const PEER_SCORE: &str = "reach_peer_score";

/// Help texts, in render order.
const HELP: [(&str, &str, &str); 4] = [
    (
        PEER_REQUESTS_TOTAL,
        "counter",
        "Outbound calls answered by each tracked peer, by outcome (at most metrics.max_peer_series peers; idle ones expire).",
    ),
    (
        PEER_STATE,
        "gauge",
        "1 for the state this caller's view of each tracked peer is in, 0 for the others.",
    ),
    (
        PEER_CAP,
        "gauge",
        "The effective traffic cap of each tracked peer in 0..1.",
    ),
    (
        PEER_SCORE,
        "gauge",
        "The reach score of each tracked peer at its last routing decision.",
    ),
];

/// How many peers get series, and how long an idle one keeps them (the policy's `metrics`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Limits {
    pub(crate) max_peers: usize,
    pub(crate) idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_peers: 20,
            idle_timeout: Duration::from_secs(600),
        }
    }
}

/// What the views say of a peer, for its gauges.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct PeerGauges {
    pub(crate) state: State,
    pub(crate) cap: f64,
    pub(crate) score: f64,
}

/// The peers that have series now.
#[derive(Debug, Default)]
pub(super) struct PeerSeries {
    limits: Limits,
    peers: FastMap<String, Tracked>,
}

#[derive(Debug)]
struct Tracked {
    last_active: Instant,
    /// Calls by outcome; outcomes are a handful of static names.
    requests: Vec<(&'static str, u64)>,
    gauges: Option<PeerGauges>,
}

impl Tracked {
    fn request(&mut self, outcome: &'static str, now: Instant) {
        self.last_active = now;
        match self.requests.iter_mut().find(|(o, _)| *o == outcome) {
            Some((_, n)) => *n += 1,
            None => self.requests.push((outcome, 1)),
        }
    }
}

// === impl PeerSeries ===

impl PeerSeries {
    /// A call answered by `peer`: counted, and the peer tracked when there is room.
    pub(super) fn request(&mut self, peer: &str, outcome: &'static str, now: Instant) {
        // A tracked peer (every call but its first) is looked up once.
        if let Some(tracked) = self.peers.get_mut(peer) {
            return tracked.request(outcome, now);
        }
        if let Some(tracked) = self.admit(peer, now) {
            tracked.request(outcome, now);
        }
    }

    /// A state transition of a tracked peer keeps its series alive (an ejected peer gets no
    /// traffic, but its cool-off and probe move it along); an untracked one is not admitted.
    pub(super) fn touch(&mut self, peer: &str, now: Instant) {
        if let Some(t) = self.peers.get_mut(peer) {
            t.last_active = now;
        }
    }

    /// The views' figures for every known peer; only tracked ones are kept.
    pub(super) fn views<'a>(
        &mut self,
        limits: Limits,
        views: impl IntoIterator<Item = (&'a str, PeerGauges)>,
        now: Instant,
    ) {
        self.limits = limits;
        self.expire(now);
        for (name, gauges) in views {
            if let Some(t) = self.peers.get_mut(name) {
                t.gauges = Some(gauges);
            }
        }
    }

    /// Drops the series of peers idle for `idle_timeout`, and the most idle beyond `max_peers`
    /// (after the limit was lowered).
    pub(super) fn expire(&mut self, now: Instant) {
        let idle = self.limits.idle_timeout;
        self.peers
            .retain(|_, t| now.saturating_duration_since(t.last_active) < idle);
        if self.peers.len() > self.limits.max_peers {
            let mut by_age: Vec<(Instant, String)> = self
                .peers
                .iter()
                .map(|(name, t)| (t.last_active, name.clone()))
                .collect();
            by_age.sort();
            let excess = self.peers.len() - self.limits.max_peers;
            for (_, name) in by_age.into_iter().take(excess) {
                self.peers.remove(&name);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.peers.len()
    }

    /// An untracked peer's new entry, when there is room for it.
    fn admit(&mut self, peer: &str, now: Instant) -> Option<&mut Tracked> {
        if self.peers.len() >= self.limits.max_peers {
            self.expire(now);
        }
        if self.peers.len() >= self.limits.max_peers {
            return None;
        }
        let tracked = Tracked {
            last_active: now,
            requests: Vec::new(),
            gauges: None,
        };
        Some(self.peers.entry(peer.to_owned()).or_insert(tracked))
    }

    /// The series in the Prometheus text format, peers in name order. Families with no sample
    /// are left out.
    pub(super) fn render(&mut self, out: &mut String, now: Instant) {
        self.expire(now);
        if self.peers.is_empty() {
            return;
        }
        let mut peers: Vec<(&String, &Tracked)> = self.peers.iter().collect();
        peers.sort_by(|a, b| a.0.cmp(b.0));
        for (name, kind, help) in HELP {
            let mut body = String::new();
            for (peer, t) in &peers {
                let peer = escape(peer);
                match name {
                    PEER_REQUESTS_TOTAL => {
                        for (outcome, n) in &t.requests {
                            let _ = writeln!(
                                body,
                                "{name}{{peer=\"{peer}\",outcome=\"{outcome}\"}} {n}"
                            );
                        }
                    }
                    PEER_STATE => {
                        if let Some(g) = t.gauges {
                            for s in State::ALL {
                                let v = u8::from(s == g.state);
                                let s = s.as_str();
                                let _ =
                                    writeln!(body, "{name}{{peer=\"{peer}\",state=\"{s}\"}} {v}");
                            }
                        }
                    }
                    PEER_CAP => {
                        if let Some(g) = t.gauges {
                            let _ = writeln!(body, "{name}{{peer=\"{peer}\"}} {}", number(g.cap));
                        }
                    }
                    _ => {
                        if let Some(g) = t.gauges {
                            let _ = writeln!(body, "{name}{{peer=\"{peer}\"}} {}", number(g.score));
                        }
                    }
                }
            }
            if !body.is_empty() {
                let _ = writeln!(out, "# HELP {name} {help}");
                let _ = writeln!(out, "# TYPE {name} {kind}");
                out.push_str(&body);
                out.push('\n');
            }
        }
    }
}

/// A sample value in the text format, which spells infinities `+Inf`/`-Inf`.
pub(super) fn number(v: f64) -> String {
    match v {
        f64::INFINITY => "+Inf".to_owned(),
        f64::NEG_INFINITY => "-Inf".to_owned(),
        v => v.to_string(),
    }
}

/// A label value in the text format: backslash, double quote and newline escaped.
pub(super) fn escape(value: &str) -> std::borrow::Cow<'_, str> {
    if !value.contains(['\\', '"', '\n']) {
        return value.into();
    }
    value
        .replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(max_peers: usize, idle_s: u64) -> PeerSeries {
        PeerSeries {
            limits: Limits {
                max_peers,
                idle_timeout: Duration::from_secs(idle_s),
            },
            peers: FastMap::default(),
        }
    }

    fn rendered(s: &mut PeerSeries, now: Instant) -> String {
        let mut out = String::new();
        s.render(&mut out, now);
        out
    }

    #[test]
    fn at_most_max_peers_are_tracked_first_come() {
        let t0 = Instant::now();
        let mut s = series(2, 60);
        for peer in ["a", "b", "c", "a"] {
            s.request(peer, "success", t0);
        }
        let text = rendered(&mut s, t0);
        assert!(text.contains(r#"reach_peer_requests_total{peer="a",outcome="success"} 2"#));
        assert!(text.contains(r#"reach_peer_requests_total{peer="b",outcome="success"} 1"#));
        assert!(!text.contains(r#"peer="c""#), "{text}");
    }

    #[test]
    fn an_idle_peer_expires_and_frees_its_slot() {
        let t0 = Instant::now();
        let mut s = series(1, 10);
        s.request("a", "failure", t0);
        s.request("b", "success", t0 + Duration::from_secs(5));
        assert_eq!(s.len(), 1, "b waits for a slot");
        s.request("b", "success", t0 + Duration::from_secs(11));
        let text = rendered(&mut s, t0 + Duration::from_secs(11));
        assert!(!text.contains(r#"peer="a""#), "{text}");
        assert!(text.contains(r#"reach_peer_requests_total{peer="b",outcome="success"} 1"#));
        assert_eq!(rendered(&mut s, t0 + Duration::from_secs(30)), "");
    }

    #[test]
    fn a_transition_keeps_a_tracked_peer_but_admits_none() {
        let t0 = Instant::now();
        let mut s = series(5, 10);
        s.request("a", "failure", t0);
        s.touch("a", t0 + Duration::from_secs(8));
        s.touch("z", t0 + Duration::from_secs(8));
        assert_eq!(s.len(), 1);
        assert!(rendered(&mut s, t0 + Duration::from_secs(15)).contains(r#"peer="a""#));
    }

    #[test]
    fn gauges_only_for_tracked_peers_and_the_limit_follows_the_policy() {
        let t0 = Instant::now();
        let mut s = series(5, 60);
        s.request("a", "success", t0);
        s.request("b", "success", t0 + Duration::from_secs(1));
        let g = PeerGauges {
            state: State::Ejected,
            cap: 0.0,
            score: -0.5,
        };
        let lower = Limits {
            max_peers: 1,
            idle_timeout: Duration::from_secs(60),
        };
        s.views(
            lower,
            [("a", g), ("b", g), ("c", g)],
            t0 + Duration::from_secs(2),
        );
        let text = rendered(&mut s, t0 + Duration::from_secs(2));
        assert!(!text.contains(r#"peer="a""#), "the most idle went: {text}");
        assert!(text.contains(r#"reach_peer_state{peer="b",state="ejected"} 1"#));
        assert!(text.contains(r#"reach_peer_state{peer="b",state="healthy"} 0"#));
        assert!(text.contains(r#"reach_peer_cap_ratio{peer="b"} 0"#));
        assert!(text.contains(r#"reach_peer_score{peer="b"} -0.5"#));
        assert!(!text.contains(r#"peer="c""#));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape("plain"), "plain");
    }
}
