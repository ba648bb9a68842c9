//! Each external target's budget as its answers state it, and the headroom projected from it:
//! how much of the budget is left before its reset, against how fast the agent spends it
//! (docs/model-budgets.md, "Headroom").

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};
use tokio::time::Instant;

use super::headers::{self, Kind, Reading, MAX_BLOCK};
use super::{Figure, PublishedBudget, Usage};
use crate::fast_hash::FastMap;

/// Below this headroom the agent's own view shows `budget-limited`: callers are cutting its share.
pub(crate) const LIMITED_BELOW: f64 = 1.0;
/// The part of a window held back: a call already on its way may still spend it.
const RESERVE: f64 = 0.05;
/// Under this part of a window left, the share shrinks in proportion even at a slow pace.
const LOW_WATER: f64 = 0.25;
/// The pace of model calls is measured over this long.
const PACE_WINDOW: Duration = Duration::from_secs(60);
/// Answers remembered for the pace, at most.
const PACE_SAMPLES: usize = 256;
/// Accounts (target and credential) tracked at most; past it the one learned longest ago goes.
const MAX_ACCOUNTS: usize = 64;

/// The local agent's model budgets, one per model provider and credential that states one.
#[derive(Debug, Default)]
pub(crate) struct ModelBudgets {
    inner: Mutex<Accounts>,
}

/// The budgets learned, per target and credential, and which credential each target's latest
/// call carried: the agent's headroom is its current accounts', not those of a key it tried once.
#[derive(Debug, Default)]
struct Accounts {
    by_account: FastMap<(String, Option<u64>), TargetBudget>,
    current: FastMap<String, Option<u64>>,
}

impl Accounts {
    /// The budgets of the credentials the targets use now, with their targets' names.
    fn current(&self) -> impl Iterator<Item = (&str, Option<u64>, &TargetBudget)> {
        self.current.iter().filter_map(|(target, credential)| {
            let budget = self.by_account.get(&(target.clone(), *credential))?;
            Some((target.as_str(), *credential, budget))
        })
    }

    /// Room for one more account: the one learned longest ago goes.
    fn make_room(&mut self) {
        if self.by_account.len() < MAX_ACCOUNTS {
            return;
        }
        let stalest = self
            .by_account
            .iter()
            .min_by_key(|(_, b)| b.learned_at)
            .map(|(k, _)| k.clone());
        if let Some(k) = stalest {
            self.by_account.remove(&k);
        }
    }
}

/// The projected headroom of a budget: 0..1, until when it holds, and why.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Headroom {
    pub(crate) headroom: f64,
    pub(crate) reset_in: Duration,
    pub(crate) reason: String,
}

#[derive(Debug)]
struct TargetBudget {
    group: Option<String>,
    windows: Vec<Learned>,
    /// A 429's `retry-after`: no headroom at all until then.
    blocked_until: Option<Instant>,
    /// When the target's recent answers came: the pace of model calls.
    answers: VecDeque<Instant>,
    learned_at: Instant,
}

#[derive(Debug)]
struct Learned {
    kind: Kind,
    limit: Option<u64>,
    remaining: u64,
    reset_at: Option<Instant>,
    /// What one call spends of the window (a moving average; 1 for requests until seen).
    per_call: f64,
    /// `per_call` comes from the answers' own `usage`, not from the drops in `remaining`.
    measured: bool,
}

/// One answer of a model provider, as [`ModelBudgets::observe`] reads it.
#[derive(Debug)]
pub(crate) struct Answer<'a> {
    pub(crate) target: &'a str,
    /// The account its request was made with ([`super::credential`]).
    pub(crate) credential: Option<u64>,
    pub(crate) group: Option<&'a str>,
    pub(crate) status: StatusCode,
    pub(crate) headers: &'a HeaderMap,
    /// A wait its body asked for, read as a `retry-after` the headers lack.
    pub(crate) body_delay: Option<Duration>,
    /// The longest a 429 holds the budget at 0 (`model_budgets.max_wait`).
    pub(crate) max_wait: Duration,
}

impl ModelBudgets {
    /// Learns from one answer of a model provider; the number of unreadable values it carried.
    pub(crate) fn observe(&self, answer: &Answer<'_>, now: Instant) -> u32 {
        let mut reading = headers::read(answer.headers, SystemTime::now());
        reading.retry_after = reading
            .retry_after
            .or(answer.body_delay)
            .map(|d| d.min(answer.max_wait).min(MAX_BLOCK));
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .current
            .insert(answer.target.to_owned(), answer.credential);
        let key = (answer.target.to_owned(), answer.credential);
        let known = inner.by_account.contains_key(&key);
        if !known && reading.is_empty() {
            return reading.malformed;
        }
        if !known {
            inner.make_room();
        }
        let budget = inner.by_account.entry(key).or_insert_with(|| TargetBudget {
            group: None,
            windows: Vec::new(),
            blocked_until: None,
            answers: VecDeque::new(),
            learned_at: now,
        });
        budget.group = answer.group.map(str::to_owned);
        budget.learn(&reading, answer.status, now);
        reading.malformed
    }

    /// What one answer of `target` reported it spent (`usage`): its token windows' spend per call
    /// from it, more precise than the drops in `remaining`, which mix calls in flight together
    /// and skip answers.
    pub(crate) fn spent(&self, target: &str, usage: &Usage) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Some(credential) = inner.current.get(target).copied() else {
            return;
        };
        let Some(budget) = inner.by_account.get_mut(&(target.to_owned(), credential)) else {
            return;
        };
        for l in &mut budget.windows {
            let tokens = match l.kind {
                Kind::Tokens => usage.input.saturating_add(usage.output),
                Kind::InputTokens => usage.input,
                Kind::OutputTokens => usage.output,
                Kind::Requests | Kind::Quota => continue,
            };
            if tokens == 0 {
                continue;
            }
            l.per_call = if l.measured {
                0.7 * l.per_call + 0.3 * tokens as f64
            } else {
                tokens as f64
            };
            l.measured = true;
        }
    }

    /// The tightest budget of the accounts the agent uses now, when any is learned.
    pub(crate) fn headroom(&self, now: Instant) -> Option<Headroom> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .current()
            .map(|(target, _, b)| b.headroom(target, now))
            .min_by(|a, b| a.headroom.total_cmp(&b.headroom))
    }

    /// The credential the agent uses now with a target of `group`, when it has called one.
    pub(crate) fn group_credential(&self, group: &str) -> Option<u64> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let found = inner
            .current()
            .find(|(_, _, b)| b.group.as_deref() == Some(group))
            .and_then(|(_, credential, _)| credential);
        found
    }

    /// What the agent publishes: its ungrouped targets folded into one figure, and one entry per
    /// group it belongs to (`groups`, from the config: also those it has learned nothing about),
    /// each with the credential it was learned with.
    pub(crate) fn published<'a>(
        &self,
        groups: impl Iterator<Item = &'a str>,
        now: Instant,
    ) -> Vec<PublishedBudget> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let figure = |b: &TargetBudget, target: &str| {
            let h = b.headroom(target, now);
            Figure {
                headroom: h.headroom,
                reset_in_s: h.reset_in.as_secs_f64(),
                age_s: now.saturating_duration_since(b.learned_at).as_secs_f64(),
            }
        };
        let mut own: Option<Figure> = None;
        let mut out: Vec<PublishedBudget> = Vec::new();
        for group in groups {
            if !out.iter().any(|p| p.group.as_deref() == Some(group)) {
                out.push(PublishedBudget {
                    group: Some(group.to_owned()),
                    ..PublishedBudget::default()
                });
            }
        }
        for (target, credential, b) in inner.current() {
            let f = figure(b, target);
            match b.group.as_deref() {
                None => own = Some(own.map_or(f, |o| if o.headroom <= f.headroom { o } else { f })),
                Some(g) => {
                    let Some(p) = out.iter_mut().find(|p| p.group.as_deref() == Some(g)) else {
                        continue;
                    };
                    if p.figure.is_none_or(|o| f.headroom < o.headroom) {
                        p.figure = Some(f);
                        p.credential = credential;
                    }
                }
            }
        }
        if own.is_some() {
            out.insert(
                0,
                PublishedBudget {
                    group: None,
                    figure: own,
                    credential: None,
                },
            );
        }
        out
    }
}

impl TargetBudget {
    fn learn(&mut self, reading: &Reading, status: StatusCode, now: Instant) {
        // The account answered: whatever a 429 or an empty window said of it is over.
        if status.is_success() {
            self.blocked_until = None;
            self.windows.retain(|w| w.remaining > 0);
        }
        self.answers.push_back(now);
        while self.answers.len() > PACE_SAMPLES
            || self
                .answers
                .front()
                .is_some_and(|t| now.saturating_duration_since(*t) > PACE_WINDOW)
        {
            self.answers.pop_front();
        }
        if reading.is_empty() {
            return;
        }
        self.learned_at = now;
        for w in &reading.windows {
            let Some(remaining) = w.remaining else {
                continue;
            };
            let reset_at = w.reset.map(|r| now + r.min(MAX_BLOCK));
            match self.windows.iter_mut().find(|l| l.kind == w.kind) {
                Some(l) => {
                    let same_period = l.reset_at.is_none_or(|at| at > now);
                    if same_period && !l.measured && l.remaining > remaining {
                        let spent = (l.remaining - remaining) as f64;
                        l.per_call = 0.7 * l.per_call + 0.3 * spent;
                    }
                    l.limit = w.limit;
                    l.remaining = remaining;
                    l.reset_at = reset_at;
                }
                None => self.windows.push(Learned {
                    kind: w.kind,
                    limit: w.limit,
                    remaining,
                    reset_at,
                    per_call: 1.0,
                    measured: false,
                }),
            }
        }
        if let Some(wait) = reading.retry_after {
            let exhausted = self.windows.iter().any(|l| l.remaining == 0);
            if status == StatusCode::TOO_MANY_REQUESTS || exhausted {
                self.blocked_until = Some(now + wait);
            }
        }
    }

    /// Model calls per second lately.
    fn pace(&self, now: Instant) -> f64 {
        let recent = self
            .answers
            .iter()
            .filter(|t| now.saturating_duration_since(**t) <= PACE_WINDOW);
        let (n, first) = recent.fold((0usize, None), |(n, first), t| (n + 1, first.or(Some(*t))));
        let span = first.map_or(0.0, |f| now.saturating_duration_since(f).as_secs_f64());
        if n < 3 || span < 1.0 {
            return 0.0;
        }
        n as f64 / span
    }

    fn headroom(&self, target: &str, now: Instant) -> Headroom {
        if let Some(until) = self.blocked_until.filter(|u| *u > now) {
            let reset_in = until.saturating_duration_since(now);
            return Headroom {
                headroom: 0.0,
                reset_in,
                reason: format!(
                    "{target}: refused (429), retry in {:.0}s",
                    reset_in.as_secs_f64()
                ),
            };
        }
        let whole = Headroom {
            headroom: 1.0,
            reset_in: Duration::ZERO,
            reason: format!("{target}: budget whole"),
        };
        // Bounded staleness: an answer this old says nothing about now.
        if now.saturating_duration_since(self.learned_at) > MAX_BLOCK {
            return whole;
        }
        let pace = self.pace(now);
        self.windows
            .iter()
            .filter_map(|w| w.headroom(target, pace, now))
            .min_by(|a, b| a.headroom.total_cmp(&b.headroom))
            .unwrap_or(whole)
    }
}

impl Learned {
    /// This window's headroom, `None` once its reset has passed (it is full again).
    fn headroom(&self, target: &str, pace: f64, now: Instant) -> Option<Headroom> {
        let reset_in = match self.reset_at {
            Some(at) if at <= now => return None,
            Some(at) => at.saturating_duration_since(now),
            None => MAX_BLOCK,
        };
        let limit = self.limit.unwrap_or(self.remaining).max(1) as f64;
        let reserve = (limit * RESERVE).ceil().max(1.0);
        let usable = self.remaining as f64 - reserve;
        let low = (usable / (limit * LOW_WATER)).clamp(0.0, 1.0);
        // Spent at this pace until the reset: more than is left means it runs dry first.
        let need = pace * self.per_call.max(0.0) * reset_in.as_secs_f64();
        let runway = if need > usable && need > 0.0 {
            (usable / need).clamp(0.0, 1.0)
        } else {
            1.0
        };
        let headroom = if usable <= 0.0 { 0.0 } else { low.min(runway) };
        Some(Headroom {
            headroom,
            reset_in,
            reason: format!(
                "{target}: {} {}/{} left, resets in {:.0}s",
                kind_name(self.kind),
                self.remaining,
                limit as u64,
                reset_in.as_secs_f64()
            ),
        })
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Requests => "requests",
        Kind::Tokens => "tokens",
        Kind::InputTokens => "input tokens",
        Kind::OutputTokens => "output tokens",
        Kind::Quota => "quota",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One answer with no credential, bounded only by [`MAX_BLOCK`].
    fn observe(
        b: &ModelBudgets,
        target: &str,
        group: Option<&str>,
        status: StatusCode,
        headers: &HeaderMap,
        body_delay: Option<Duration>,
        now: Instant,
    ) -> u32 {
        b.observe(
            &Answer {
                target,
                credential: None,
                group,
                status,
                headers,
                body_delay,
                max_wait: MAX_BLOCK,
            },
            now,
        )
    }

    fn answer(remaining: u64, reset: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        let mut put = |k: &'static str, v: String| {
            if let Ok(v) = http::HeaderValue::from_str(&v) {
                h.insert(k, v);
            }
        };
        put("x-ratelimit-limit-requests", "100".to_owned());
        put("x-ratelimit-remaining-requests", remaining.to_string());
        put("x-ratelimit-reset-requests", reset.to_owned());
        h
    }

    #[tokio::test(start_paused = true)]
    async fn headroom_shrinks_as_the_budget_drains_and_is_whole_at_the_reset() {
        let b = ModelBudgets::default();
        let ok = StatusCode::OK;
        assert_eq!(b.headroom(Instant::now()), None, "nothing learned yet");
        observe(
            &b,
            "openai",
            None,
            ok,
            &answer(90, "60s"),
            None,
            Instant::now(),
        );
        let h = b.headroom(Instant::now()).map(|h| h.headroom);
        assert_eq!(h, Some(1.0), "plenty left at no pace");
        observe(
            &b,
            "openai",
            None,
            ok,
            &answer(10, "60s"),
            None,
            Instant::now(),
        );
        let h = b.headroom(Instant::now()).map_or(1.0, |h| h.headroom);
        assert!(h > 0.0 && h < 1.0, "{h}");
        observe(
            &b,
            "openai",
            None,
            ok,
            &answer(5, "60s"),
            None,
            Instant::now(),
        );
        let h = b.headroom(Instant::now());
        assert_eq!(h.as_ref().map(|h| h.headroom), Some(0.0), "{h:?}");
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(b.headroom(Instant::now()).map(|h| h.headroom), Some(1.0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fast_pace_runs_out_before_the_reset() {
        let b = ModelBudgets::default();
        // Ten calls a second, 2 each, 60 s to the reset: 80 left will not last.
        for i in 0..20 {
            observe(
                &b,
                "openai",
                None,
                StatusCode::OK,
                &answer(120 - 2 * i, "60s"),
                None,
                Instant::now(),
            );
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        let h = b.headroom(Instant::now()).map_or(1.0, |h| h.headroom);
        assert!(h < 0.2, "{h}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hostile_retry_after_blocks_no_longer_than_the_bound() {
        let b = ModelBudgets::default();
        let mut h = answer(0, "99999h");
        h.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("999999999"),
        );
        observe(
            &b,
            "openai",
            None,
            StatusCode::TOO_MANY_REQUESTS,
            &h,
            None,
            Instant::now(),
        );
        assert_eq!(b.headroom(Instant::now()).map(|h| h.headroom), Some(0.0));
        tokio::time::advance(MAX_BLOCK + Duration::from_secs(1)).await;
        assert_eq!(b.headroom(Instant::now()).map(|h| h.headroom), Some(1.0));
    }

    fn tokens_answer(remaining: u64) -> HeaderMap {
        let mut h = HeaderMap::new();
        let mut set = |name: &'static str, value: String| {
            h.insert(name, http::HeaderValue::from_str(&value).unwrap());
        };
        set("x-ratelimit-limit-tokens", "100000".into());
        set("x-ratelimit-remaining-tokens", remaining.to_string());
        set("x-ratelimit-reset-tokens", "60s".into());
        h
    }

    fn per_call(b: &ModelBudgets) -> f64 {
        b.inner.lock().unwrap().by_account[&("openai".to_owned(), None)].windows[0].per_call
    }

    #[tokio::test(start_paused = true)]
    async fn the_answers_usage_sets_a_token_windows_spend_per_call_over_the_drops() {
        let b = ModelBudgets::default();
        let ok = StatusCode::OK;
        // Two calls in flight answered together: the drop (9 000) is two calls' and others'.
        observe(
            &b,
            "openai",
            None,
            ok,
            &tokens_answer(90_000),
            None,
            Instant::now(),
        );
        observe(
            &b,
            "openai",
            None,
            ok,
            &tokens_answer(81_000),
            None,
            Instant::now(),
        );
        assert!(per_call(&b) > 2000.0, "{}", per_call(&b));
        let usage = |input, output| Usage {
            input,
            output,
            model: None,
        };
        b.spent("openai", &usage(300, 100));
        assert_eq!(per_call(&b), 400.0, "the first usage replaces the guess");
        // From then on the drops say nothing of a call's spend; each usage moves the average.
        observe(
            &b,
            "openai",
            None,
            ok,
            &tokens_answer(60_000),
            None,
            Instant::now(),
        );
        assert_eq!(per_call(&b), 400.0);
        b.spent("openai", &usage(500, 300));
        assert!((per_call(&b) - 520.0).abs() < 1e-9, "{}", per_call(&b));
        // No usage (zero tokens), or a target never learned: nothing changes, nothing is added.
        b.spent("openai", &usage(0, 0));
        b.spent("claude", &usage(10, 10));
        assert!((per_call(&b) - 520.0).abs() < 1e-9);
        assert_eq!(b.inner.lock().unwrap().by_account.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_bodys_retry_delay_blocks_like_retry_after_bounded_alike() {
        let b = ModelBudgets::default();
        let none = HeaderMap::new();
        let delay = Some(Duration::from_secs(30));
        observe(
            &b,
            "gemini",
            None,
            StatusCode::OK,
            &none,
            delay,
            Instant::now(),
        );
        let h = b.headroom(Instant::now()).map_or(1.0, |h| h.headroom);
        assert_eq!(h, 1.0, "only a 429 blocks");
        let refused = StatusCode::TOO_MANY_REQUESTS;
        observe(&b, "gemini", None, refused, &none, delay, Instant::now());
        let h = b.headroom(Instant::now());
        assert_eq!(h.as_ref().map(|h| h.headroom), Some(0.0), "{h:?}");
        assert_eq!(h.map(|h| h.reset_in), Some(Duration::from_secs(30)));
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(b.headroom(Instant::now()).map(|h| h.headroom), Some(1.0));
        let decade = Some(Duration::from_secs(315_360_000));
        observe(&b, "gemini", None, refused, &none, decade, Instant::now());
        let h = b.headroom(Instant::now()).map(|h| h.reset_in);
        assert_eq!(h, Some(MAX_BLOCK));
    }

    #[tokio::test(start_paused = true)]
    async fn publishes_ungrouped_targets_as_one_figure_and_each_group() {
        let b = ModelBudgets::default();
        let now = Instant::now();
        observe(
            &b,
            "openai",
            None,
            StatusCode::OK,
            &answer(3, "30s"),
            None,
            now,
        );
        observe(
            &b,
            "claude",
            Some("acme"),
            StatusCode::OK,
            &answer(90, "30s"),
            None,
            now,
        );
        let p = b.published(["acme", "other"].into_iter(), now);
        assert_eq!(p.len(), 3, "{p:?}");
        assert_eq!(p[0].group, None);
        assert_eq!(p[0].figure.map(|f| f.headroom), Some(0.0));
        assert_eq!(p[1].group.as_deref(), Some("acme"));
        assert_eq!(p[1].figure.map(|f| f.headroom), Some(1.0));
        assert_eq!(
            p[2].figure, None,
            "a member that learned nothing says only that"
        );
    }

    /// One exhausted key of another account (a 429 with a long wait) says nothing of the
    /// account the agent uses next; the wait is bounded by `max_wait`; a success heals it.
    #[tokio::test(start_paused = true)]
    async fn a_429_holds_one_credential_for_max_wait_and_a_success_heals_it() {
        let b = ModelBudgets::default();
        let mut refused = answer(0, "600s");
        refused.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("600"),
        );
        fn at(credential: Option<u64>, status: StatusCode, headers: &HeaderMap) -> Answer<'_> {
            Answer {
                target: "openai",
                credential,
                group: Some("acme"),
                status,
                headers,
                body_delay: None,
                max_wait: Duration::from_secs(60),
            }
        }
        let now = Instant::now();
        b.observe(&at(Some(1), StatusCode::TOO_MANY_REQUESTS, &refused), now);
        let h = b.headroom(now);
        assert_eq!(h.as_ref().map(|h| h.headroom), Some(0.0));
        assert_eq!(
            h.map(|h| h.reset_in),
            Some(Duration::from_secs(60)),
            "max_wait"
        );
        assert_eq!(b.group_credential("acme"), Some(1));
        // The agent's own key next: its answer speaks for the agent now.
        b.observe(&at(Some(2), StatusCode::OK, &answer(90, "60s")), now);
        assert_eq!(b.headroom(now).map(|h| h.headroom), Some(1.0));
        let p = b.published(["acme"].into_iter(), now);
        assert_eq!(p[0].credential, Some(2));
        // Back to the refused key: still held … until that account answers.
        b.observe(&at(Some(1), StatusCode::TOO_MANY_REQUESTS, &refused), now);
        assert_eq!(b.headroom(now).map(|h| h.headroom), Some(0.0));
        b.observe(&at(Some(1), StatusCode::OK, &HeaderMap::new()), now);
        assert_eq!(b.headroom(now).map(|h| h.headroom), Some(1.0), "healed");
    }

    #[test]
    fn a_credential_is_a_fingerprint_of_the_key_never_the_key() {
        let mut h = HeaderMap::new();
        assert_eq!(crate::budget::credential(&h), None);
        h.insert(
            "authorization",
            http::HeaderValue::from_static("Bearer sk-a"),
        );
        let a = crate::budget::credential(&h);
        h.insert(
            "authorization",
            http::HeaderValue::from_static("Bearer sk-b"),
        );
        let b = crate::budget::credential(&h);
        assert!(a.is_some() && b.is_some() && a != b);
        let mut x = HeaderMap::new();
        x.insert("x-api-key", http::HeaderValue::from_static("Bearer sk-a"));
        assert_eq!(
            crate::budget::credential(&x),
            a,
            "the same key under another header"
        );
    }
}
