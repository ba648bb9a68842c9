//! The attempt policy: which candidate takes the next attempt, and how long to wait first. A
//! call is driven as a sequence of attempts that [`Attempts`] hands out one at a time — nearest
//! tier first, never the same peer twice (but a keyed call that timed out goes back to its
//! agent) — within the retry table, the capability's retry budget, the backoff and the deadline.

pub(super) mod budget;
pub(super) mod decision;
pub(super) mod hedge;
pub(super) mod observe;
mod request;
pub(super) mod retry;

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::Request;
use tower::retry::budget::TpsBudget;
use tower::ServiceExt;

use crate::http::headers::Present;

use super::call::{Answer, Carried, Routed, ServerSessions, Try};
use super::candidates::tiers::{self, Tier};
use super::candidates::Plan;
use super::{pick, Outbound};
use crate::config::{HedgeAfter, HedgePolicy, RouteMode, Snapshot};
use crate::error::ReachError;
use crate::http::deadline::{self, Deadline};
use crate::http::layers::field;
use crate::http::step::{answer, Step};
use crate::http::upload::UploadWatch;
use crate::http::{retry_after, ReachBody};
use crate::idempotency;
use crate::peers::Scored;
use crate::tasks::Journal;
use request::{sent_headers, upstream_request, Bodies};
use retry::{Attempt, Refusal};

/// Drives the call's attempts through the rest of the stack until one answers for good, the
/// policy says stop, or the deadline passes.
/// Asked by `routing` with the call's plan; `inner` is the `endpoint` step.
pub(super) async fn route<B, S>(out: &Outbound, inner: S, plan: Plan) -> Routed<B>
where
    S: Step<Try, Response = Attempt<B>>,
{
    if plan.call.snapshot.observe_only(&plan.route.capability) {
        // Boxed: observe-only mode is rare, and its future would otherwise add its size to
        // every call's.
        return Box::pin(observe::route(out, inner, plan)).await;
    }
    let Plan {
        call,
        route,
        scored,
        tiers,
        prefer,
    } = plan;
    let snapshot = call.snapshot;
    let mut parts = call.parts;
    // The relative form is for the calling agent; peers get the absolute deadline per attempt.
    parts.headers.remove(deadline::TIMEOUT);
    let mut bodies = Bodies::of(call.upload, &snapshot);
    let shape = CallShape {
        capability: &route.capability,
        parts: &parts,
        mode: route.mode,
        scored: &scored,
        deadline: call.deadline,
        replayable: bodies.replay.is_some(),
        present: call.present,
        carried: call.carried,
    };
    let mut attempts = Attempts::new(out, &snapshot, shape);
    // A bound call's first attempt goes to the holder of its key.
    attempts.sticky = prefer;
    let mut last: Option<(Attempt<B>, usize)> = None;
    loop {
        if attempts.deadline_passed() {
            // Retries never run past the deadline.
            let peer = last
                .as_ref()
                .map_or("-", |(_, i)| scored[*i].peer.name.as_str());
            return attempts.routed(Err(ReachError::DeadlineExceeded), peer);
        }
        let Some(mut chosen) = attempts.pick(&scored, &tiers) else {
            break;
        };
        let Some(body) = bodies.next() else { break };
        let n = attempts.made();
        let headers = sent_headers(&mut parts);
        let request = upstream_request(&parts, headers, body, &snapshot, &route.capability, n);
        let mut try_ = attempts.attempt(request, &scored[chosen], &bodies.watch, &snapshot);
        let retry = attempts.retry_reason;
        let span = retry::span(&mut try_, &parts, &route.capability, n, retry);
        let started = std::time::SystemTime::now();
        let mut attempt = match attempts.hedging() {
            None => answer(inner.clone().oneshot(try_).await),
            Some(wait) => {
                let call = (&scored[..], &tiers[..], &mut bodies, &*parts, &snapshot);
                let raced = attempts.race(inner.clone(), try_, wait, call).await;
                chosen = attempts.winner(raced.hedge, chosen, &scored);
                raced.attempt
            }
        };
        retry::end(span, &mut attempt);
        if !matches!(attempt, Attempt::Limited(_)) {
            out.metrics.tier_pick(tiers[chosen].as_str());
            let head = &parts.headers;
            decision::log(&snapshot, &route, &scored, chosen, n, &attempt, head);
            attempts.report(&attempt, &scored[chosen].peer.name, started);
        }
        let pause = attempts.after(&attempt, chosen, &scored, &tiers);
        last = Some((attempt, chosen));
        match pause {
            Some(pause) => tokio::time::sleep(pause).await,
            None => break,
        }
    }
    conclude(out, last, &attempts, &scored, &route.capability)
}

/// What the last attempt leaves the caller with.
fn conclude<B>(
    out: &Outbound,
    last: Option<(Attempt<B>, usize)>,
    attempts: &Attempts<'_>,
    scored: &[Scored],
    capability: &str,
) -> Routed<B> {
    let Some((attempt, chosen)) = last else {
        out.metrics.no_candidate(capability);
        let candidates = serde_json::to_value(decision::snapshot_of(scored)).unwrap_or_default();
        let err = ReachError::NoAvailableInstance {
            capability: capability.to_owned(),
            candidates,
            attempts: attempts.made(),
        };
        return Routed::refused(capability, err);
    };
    attempts.routed(attempt.into_answer(), &scored[chosen].peer.name)
}

/// The policy's state for one call.
struct Attempts<'a> {
    out: &'a Outbound,
    snapshot: &'a Snapshot,
    capability: &'a str,
    deadline: Option<Deadline>,
    /// A keyed call's original may run past one attempt's timeout (a retry joins it), but not
    /// past the time the whole call may take.
    keyed_deadline: Option<Deadline>,
    budget: Arc<TpsBudget>,
    max: usize,
    is_async: bool,
    keyed: bool,
    idempotent_method: bool,
    tried: Vec<usize>,
    /// The candidate the next attempt must go to (a keyed call back to its agent).
    sticky: Option<usize>,
    /// Why the last attempt was retried (for the next attempt's span).
    retry_reason: Option<&'static str>,
    /// The capability's `first_event_timeout`.
    first_event: Option<Duration>,
    /// The capability's `hedge`, when the call is safe to send twice.
    hedge: Option<&'a HedgePolicy>,
    /// A task's call: where each attempt is reported as it ends.
    journal: Option<Journal>,
    /// An MCP call on servers' sessions: each attempt carries them.
    sessions: Option<ServerSessions>,
}

impl<'a> Attempts<'a> {
    fn new(out: &'a Outbound, snapshot: &'a Snapshot, call: CallShape<'a, '_>) -> Self {
        let retry = &snapshot.policy.retry;
        let budget = out.budgets.get(call.capability, retry);
        // Every call earns its capability a fraction of a retry.
        budget::deposit(&budget);
        let is_async = call.mode == Some(RouteMode::Async);
        // An async call walks a fallback chain of its own length; a sync one gets the retries;
        // a body that streams gets one attempt.
        let max = match (call.replayable, is_async) {
            (false, _) => 1,
            (true, true) => retry.fallback.chain_length.clamp(2, 5) as usize,
            (true, false) => retry.max_retries as usize + 1,
        };
        let keyed = call.present.has(Present::IDEMPOTENCY_KEY)
            && call.parts.headers.contains_key(idempotency::HEADER);
        let keyed_deadline = keyed.then(|| {
            call.deadline.unwrap_or_else(|| {
                let longest = call
                    .scored
                    .iter()
                    .map(|s| s.timeout)
                    .max()
                    .unwrap_or_default();
                Deadline::after(longest.saturating_mul(max as u32))
            })
        });
        let own = snapshot.policy.capabilities.get(call.capability);
        let idempotent_method = call.parts.method.is_idempotent();
        // Only a call that may run twice is hedged: the loser may have started before it is
        // cut. A key or a task promises one run, and deduplication is per callee: those are
        // hedged only when every candidate declares its capability idempotent (the agents
        // deduplicate among themselves; `docs/chains.md`).
        let declared = !call.scored.is_empty() && call.scored.iter().all(|s| s.idempotent);
        let safe = call.replayable && ((idempotent_method && !keyed && !is_async) || declared);
        let Carried {
            journal, sessions, ..
        } = call.carried.map(|c| *c).unwrap_or_default();
        Attempts {
            first_event: own.and_then(|c| c.first_event_timeout).map(|d| d.get()),
            hedge: own.and_then(|c| c.hedge.as_ref()).filter(|_| safe),
            out,
            snapshot,
            capability: call.capability,
            deadline: call.deadline,
            keyed_deadline,
            budget,
            max,
            is_async,
            keyed,
            idempotent_method,
            tried: Vec::new(),
            sticky: None,
            retry_reason: None,
            journal,
            sessions,
        }
    }

    /// A task's call: the attempt told to its runner.
    fn report<B>(&self, attempt: &Attempt<B>, peer: &str, started: std::time::SystemTime) {
        if let Some(journal) = &self.journal {
            journal.note(attempt.note(peer, started));
        }
    }

    fn made(&self) -> usize {
        self.tried.len()
    }

    fn deadline_passed(&self) -> bool {
        self.deadline.is_some_and(|d| d.remaining().is_zero())
    }

    /// The next candidate, or `None` when the call has had its attempts or nobody is left.
    fn pick(&mut self, scored: &[Scored], tiers: &[Tier]) -> Option<usize> {
        if self.tried.len() >= self.max {
            return None;
        }
        // Nearest tier first: skip the other tiers' candidates while the nearest can serve.
        let floor = self.snapshot.policy.zones.tier_min_score;
        let mut skip = tiers::outside_nearest(scored, tiers, &self.tried, floor);
        skip.extend_from_slice(&self.tried);
        let chosen = match self.sticky.take() {
            Some(same) => same,
            None => pick(scored, &skip, rand::random::<f64>)?,
        };
        self.tried.push(chosen);
        if let Some(span) = crate::http::layers::current_span() {
            span.record(field::ATTEMPT, self.tried.len());
            span.record(field::PEER, scored[chosen].peer.name.as_str());
        }
        Some(chosen)
    }

    /// Whether this attempt races a hedge (boxed there: a hedged capability is the rare case),
    /// and after how long (`None`: never, `after: p95` with too few samples yet): only a call's
    /// first attempt, when its capability hedges.
    fn hedging(&self) -> Option<Option<Duration>> {
        let hedge = self.hedge.filter(|_| self.made() == 1)?;
        let p95 = match hedge.after {
            HedgeAfter::P95 => self.out.head_times.p95(self.capability),
            HedgeAfter::Fixed(_) => None,
        };
        Some(hedge.after.wait(p95))
    }

    /// `first` raced against a hedge (`hedge::race`), boxed: while it runs, the call's future
    /// holds one pointer for it.
    fn race<'f, B, S>(
        &'f mut self,
        inner: S,
        first: Try,
        wait: Option<Duration>,
        call: HedgeCall<'f>,
    ) -> std::pin::Pin<Box<impl std::future::Future<Output = hedge::Raced<B>> + use<'f, 'a, B, S>>>
    where
        S: Step<Try, Response = Attempt<B>> + 'f,
        B: 'f,
    {
        let out = self.out;
        let capability = self.capability;
        let (scored, tiers, bodies, parts, snapshot) = call;
        let hedge = move || self.hedge(scored, tiers, bodies, parts, snapshot);
        let on = (&*out.metrics, &out.head_times, capability);
        Box::pin(hedge::race(inner, first, wait, hedge, on))
    }

    /// Whose answer a race took: the hedge's candidate when it won, else the first's, named on
    /// the request's span (the hedge's pick named its own).
    fn winner(&self, hedge: Option<usize>, first: usize, scored: &[Scored]) -> usize {
        let chosen = hedge.unwrap_or(first);
        crate::http::layers::record_in_span(field::PEER, scored[chosen].peer.name.as_str());
        chosen
    }

    /// The hedge: another candidate's attempt, if one is left and the retry budget allows.
    fn hedge(
        &mut self,
        scored: &[Scored],
        tiers: &[Tier],
        bodies: &mut Bodies,
        parts: &Parts,
        snapshot: &Arc<Snapshot>,
    ) -> Option<(Try, usize)> {
        let chosen = self.pick(scored, tiers)?;
        if !budget::withdraw(&self.budget) {
            self.tried.pop();
            self.out.metrics.hedge("no_budget");
            return None;
        }
        let Some(body) = bodies.next() else {
            self.tried.pop();
            return None;
        };
        let headers = parts.headers.clone();
        let request =
            upstream_request(parts, headers, body, snapshot, self.capability, self.made());
        Some((
            self.attempt(request, &scored[chosen], &bodies.watch, snapshot),
            chosen,
        ))
    }

    /// The attempt on `candidate`.
    fn attempt(
        &self,
        request: Request<ReachBody>,
        candidate: &Scored,
        upload: &UploadWatch,
        snapshot: &Arc<Snapshot>,
    ) -> Try {
        Try {
            request,
            candidate: candidate.clone(),
            deadline: self.deadline,
            keyed_deadline: self.keyed_deadline,
            upload: upload.clone(),
            snapshot: snapshot.clone(),
            first_event: self.first_event,
            sessions: self.sessions.clone(),
        }
    }

    /// Whether another attempt follows this one, and after what pause.
    fn after<B>(
        &mut self,
        attempt: &Attempt<B>,
        chosen: usize,
        scored: &[Scored],
        tiers: &[Tier],
    ) -> Option<Duration> {
        if let Attempt::Limited(_) = attempt {
            // Refused here before anything was sent: the next candidate, at once, for free.
            self.retry_reason = Some("target_limited");
            return Some(Duration::ZERO);
        }
        // A capability the agent deduplicates itself is safe to repeat on any agent.
        let declared = scored[chosen].idempotent;
        let keyed = self.keyed && !declared;
        let idempotent = self.idempotent_method || declared;
        let (reason, same_peer) = match attempt.retry(keyed, idempotent, self.is_async) {
            Some(retry) => retry,
            // An async chain hands a task its agent failed to the next agent, after the
            // cleanup interval: a task's key makes each agent run it at most once.
            None if self.is_async && attempt.failed() => ("chain_next", false),
            None => return None,
        };
        if self.tried.len() >= self.max {
            return None;
        }
        // Nobody left to try: the answer goes back at once — no retry counted, no budget
        // spent, no backoff paid for an attempt that will not happen.
        if !same_peer && !self.untried_left(scored, tiers) {
            return None;
        }
        if same_peer {
            self.sticky = Some(chosen);
        }
        // A shed never reached an agent: moving it adds no load to any agent, so it does not
        // spend the budget that guards agents against retry storms (429s do).
        let shed = matches!(attempt, Attempt::Refused(_, why) if why.never_reached_an_agent());
        if !shed && !budget::withdraw(&self.budget) {
            // Fail fast with what we have: this is what stops a correlated retry storm.
            self.out.metrics.retry_budget_exhausted(self.capability);
            return None;
        }
        self.out.metrics.retry(self.capability, reason);
        self.retry_reason = Some(reason);
        let pause = self.pause(attempt, scored);
        Some(self.deadline.map_or(pause, |d| pause.min(d.remaining())))
    }

    /// Whether `pick` would find a candidate not yet tried.
    fn untried_left(&self, scored: &[Scored], tiers: &[Tier]) -> bool {
        let floor = self.snapshot.policy.zones.tier_min_score;
        let mut skip = tiers::outside_nearest(scored, tiers, &self.tried, floor);
        skip.extend_from_slice(&self.tried);
        pick(scored, &skip, || 0.5).is_some()
    }

    /// The pause before the next attempt.
    fn pause<B>(&self, attempt: &Attempt<B>, scored: &[Scored]) -> Duration {
        let policy = &self.snapshot.policy.retry;
        let pause = if self.is_async {
            // Give the previous agent time to clean up before the next takes over.
            policy.fallback.interval.get()
        } else {
            budget::backoff(
                self.tried.len() as u32,
                policy.backoff_base.get(),
                policy.backoff_max.get(),
                rand::random::<f64>(),
            )
        };
        match attempt {
            // A full peer answered at once and nothing ran: the next may have a free slot now.
            // No backoff; when every candidate is full, the last refusal (`503 saturated`, with
            // its retry-after) is the answer.
            Attempt::Refused(_, Refusal::Full) => Duration::ZERO,
            // `retry-after` is honoured as a minimum when everyone left is cooling down after
            // refusing us: the next attempt waits for it (within the deadline) instead of
            // hammering a fleet that asked for a pause.
            Attempt::Refused(answer, Refusal::RateLimited) if self.only_cooling_left(scored) => {
                let after = retry_after::wait(answer.response.headers());
                after.map_or(pause, |after| pause.max(after))
            }
            _ => pause,
        }
    }

    fn only_cooling_left(&self, scored: &[Scored]) -> bool {
        let mut rest = scored
            .iter()
            .enumerate()
            .filter(|(i, s)| s.excluded.is_none() && !self.tried.contains(i));
        rest.clone().next().is_some() && rest.all(|(_, s)| s.cooling_down)
    }

    fn routed<B>(&self, answer: Result<Answer<B>, ReachError>, peer: &str) -> Routed<B> {
        Routed::answered(answer, self.capability, peer, self.made())
    }
}

/// What a hedge is made from: the candidates, their tiers, the call's body, head and snapshot.
type HedgeCall<'f> = (
    &'f [Scored],
    &'f [Tier],
    &'f mut Bodies,
    &'f Parts,
    &'f Arc<Snapshot>,
);

/// What the policy needs to know of a call to set its limits.
struct CallShape<'a, 'p> {
    capability: &'a str,
    parts: &'p Parts,
    mode: Option<RouteMode>,
    scored: &'a [Scored],
    deadline: Option<Deadline>,
    replayable: bool,
    present: Present,
    carried: Option<Box<Carried>>,
}

/// The policy driven against a scripted peer (a stub inner step) on paused time: no sockets.
#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::convert::Infallible;
    use std::sync::Mutex;

    use http::{Response, StatusCode};
    use tokio::time::Instant;

    use super::*;
    use crate::config::Policy;
    use crate::http::headers;
    use crate::http::upload::Upload;
    use crate::outbound::call::Call;
    use crate::outbound::candidates::balance::tests::candidate;
    use crate::outbound::for_tests;
    use crate::peers::RouteRequest;
    use bytes::Bytes;

    /// What the stub peer answers, in order, and the peers it was asked.
    #[derive(Clone, Default)]
    struct Script {
        answers: Arc<Mutex<VecDeque<Attempt<()>>>>,
        asked: Arc<Mutex<Vec<(String, Duration)>>>,
    }

    fn status(code: u16, reason: Option<&'static str>) -> Attempt<()> {
        let mut r = Response::new(());
        *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
        if let Some(reason) = reason {
            r.headers_mut()
                .insert(headers::REASON, http::HeaderValue::from_static(reason));
        }
        match crate::classify::Class::of_response(&r) {
            crate::classify::Class::Refused { .. } => {
                Attempt::Refused(r.into(), Refusal::RateLimited)
            }
            crate::classify::Class::Shed { why, .. } => Attempt::Refused(r.into(), why),
            _ => Attempt::Done(r.into()),
        }
    }

    fn timeout() -> Attempt<()> {
        Attempt::Failed(ReachError::Timeout {
            target: "p".into(),
            after: Duration::from_secs(1),
        })
    }

    fn plan(out: &Outbound, method: &str, key: bool, peers: &[&str]) -> Plan {
        let mut builder = Request::builder().method(method).uri("/review");
        if key {
            builder = builder.header(idempotency::HEADER, "k-1");
        }
        let (parts, ()) = builder.body(()).unwrap_or_default().into_parts();
        let scored: Vec<Scored> = peers.iter().map(|p| candidate(p, 1.0, 0.9)).collect();
        Plan {
            call: Call {
                capability: crate::config::Name::parse("review").unwrap_or_else(|e| panic!("{e}")),
                parts: Box::new(parts),
                upload: Upload::Buffered(Bytes::from_static(b"{}")),
                deadline: None,
                present: Present::ALL,
                snapshot: out.store.snapshot(),
                started: std::time::Instant::now(),
                carried: None,
            },
            route: RouteRequest {
                capability: "review".into(),
                ..RouteRequest::default()
            },
            tiers: vec![Tier::Any; scored.len()],
            scored,
            prefer: None,
        }
    }

    /// Routes `plan` against the script; returns the routed answer and who was asked when.
    async fn run(
        out: &Arc<Outbound>,
        plan: Plan,
        answers: Vec<Attempt<()>>,
    ) -> (Routed<()>, Vec<(String, Duration)>) {
        let script = Script {
            answers: Arc::new(Mutex::new(answers.into())),
            ..Script::default()
        };
        let start = Instant::now();
        let stub = {
            let script = script.clone();
            tower::service_fn(move |t: Try| {
                let script = script.clone();
                async move {
                    let mut asked = script.asked.lock().unwrap_or_else(|p| p.into_inner());
                    asked.push((t.candidate.peer.name.clone(), start.elapsed()));
                    let mut answers = script.answers.lock().unwrap_or_else(|p| p.into_inner());
                    Ok::<_, Infallible>(answers.pop_front().unwrap_or_else(|| status(200, None)))
                }
            })
        };
        let routed = route(out, stub, plan).await;
        let asked = script
            .asked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        (routed, asked)
    }

    fn names(asked: &[(String, Duration)]) -> Vec<&str> {
        asked.iter().map(|(n, _)| n.as_str()).collect()
    }

    fn answered(routed: &Routed<()>) -> Option<u16> {
        routed.answer.as_ref().ok().map(|r| r.status().as_u16())
    }

    /// With one candidate answering 429 nothing is retried: the answer
    /// comes back at once, no retry is counted and no budget spent (before: a retry counted,
    /// budget withdrawn and a backoff paid while the answer said `reach-attempts: 1`).
    #[tokio::test(start_paused = true)]
    async fn a_lone_candidates_refusal_is_answered_at_once_without_a_retry() {
        let mut policy = Policy::default();
        policy.retry.backoff_base = crate::config::HumanDuration::from_millis(100);
        let out = for_tests(policy);
        let p = plan(&out, "POST", false, &["a"]);
        let began = Instant::now();
        let (routed, asked) = run(&out, p, vec![status(429, Some("rate_limited"))]).await;
        assert_eq!(answered(&routed), Some(429));
        assert_eq!(routed.attempts, Some(1));
        assert_eq!(asked.len(), 1);
        assert_eq!(began.elapsed(), Duration::ZERO, "no backoff");
        let metrics = out.metrics.render();
        assert!(
            !metrics
                .lines()
                .any(|l| l.starts_with("reach_retries_total{") && !l.ends_with(" 0")),
            "no retry counted: {metrics}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_moves_the_call_to_another_peer() {
        let out = for_tests(Policy::default());
        let p = plan(&out, "POST", false, &["a", "b"]);
        let (routed, asked) = run(&out, p, vec![status(429, None)]).await;
        assert_eq!(answered(&routed), Some(200));
        assert_eq!(routed.attempts, Some(2));
        assert_eq!(asked.len(), 2);
        assert_ne!(asked[0].0, asked[1].0, "never the same peer twice");
        assert_eq!(routed.peer, asked[1].0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_peer_is_followed_at_once_and_a_shed_costs_no_budget() {
        let mut policy = Policy::default();
        // No budget at all: only retries that never reached an agent may go on.
        policy.retry.budget.ratio = 0.0;
        policy.retry.budget.min_per_second = 0;
        policy.retry.backoff_base = crate::config::HumanDuration::from_millis(100);
        let out = for_tests(policy);
        let p = plan(&out, "POST", false, &["a", "b", "c"]);
        let full = || status(503, Some("saturated"));
        let (routed, asked) = run(&out, p, vec![full(), full()]).await;
        assert_eq!(answered(&routed), Some(200), "{:?}", names(&asked));
        assert_eq!(asked.len(), 3);
        assert!(
            asked.iter().all(|(_, at)| at.is_zero()),
            "no backoff: {asked:?}"
        );
        // A 429 reached an agent: with the budget spent, the call fails fast with it.
        let p = plan(&out, "POST", false, &["a", "b", "c"]);
        let (routed, asked) = run(&out, p, vec![status(429, None)]).await;
        assert_eq!(answered(&routed), Some(429));
        assert_eq!(asked.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn what_may_have_run_is_retried_only_when_safe() {
        let out = for_tests(Policy::default());
        // A POST that timed out may have run: final.
        let p = plan(&out, "POST", false, &["a", "b"]);
        let (routed, asked) = run(&out, p, vec![timeout()]).await;
        assert!(matches!(routed.answer, Err(ReachError::Timeout { .. })));
        assert_eq!(asked.len(), 1);
        // A GET moves on.
        let p = plan(&out, "GET", false, &["a", "b"]);
        let (routed, asked) = run(&out, p, vec![timeout()]).await;
        assert_eq!(answered(&routed), Some(200));
        assert_eq!(asked.len(), 2);
        assert_ne!(asked[0].0, asked[1].0);
        // A keyed POST goes back to the same agent, whose sidecar joins the original.
        let p = plan(&out, "POST", true, &["a", "b"]);
        let (routed, asked) = run(&out, p, vec![timeout()]).await;
        assert_eq!(answered(&routed), Some(200));
        assert_eq!(names(&asked)[0], names(&asked)[1]);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_stop_at_the_limit_and_the_deadline() {
        let mut policy = Policy::default();
        policy.retry.max_retries = 1;
        let out = for_tests(policy);
        let p = plan(&out, "GET", false, &["a", "b", "c"]);
        let (routed, asked) = run(&out, p, vec![status(429, None), status(429, None)]).await;
        assert_eq!(asked.len(), 2, "one retry");
        assert_eq!(answered(&routed), Some(429));
        // A deadline already spent: no attempt at all.
        let mut p = plan(&out, "GET", false, &["a", "b"]);
        p.call.deadline = Some(Deadline::after(Duration::ZERO));
        tokio::time::advance(Duration::from_millis(5)).await;
        let (routed, asked) = run(&out, p, vec![]).await;
        assert!(asked.is_empty());
        assert!(matches!(routed.answer, Err(ReachError::DeadlineExceeded)));
        assert_eq!(routed.attempts, Some(0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_bound_call_goes_to_its_holder_first_and_moves_on_only_when_it_is_out() {
        let out = for_tests(Policy::default());
        for _ in 0..10 {
            let mut p = plan(&out, "POST", false, &["a", "b", "c"]);
            p.prefer = Some(2);
            let (routed, asked) = run(&out, p, vec![]).await;
            assert_eq!(names(&asked), ["c"]);
            assert_eq!(routed.peer, "c");
        }
        // `fallback`: the holder refuses the connection; the call moves to another agent.
        let mut p = plan(&out, "POST", false, &["a", "b", "c"]);
        p.prefer = Some(2);
        let refused = Attempt::Failed(ReachError::UpstreamConnect {
            target: "c".into(),
            message: "refused".into(),
            refused: true,
        });
        let (routed, asked) = run(&out, p, vec![refused]).await;
        assert_eq!(names(&asked)[0], "c");
        assert_eq!(asked.len(), 2);
        assert_ne!(routed.peer, "c");
        assert_eq!(answered(&routed), Some(200));
    }

    #[tokio::test(start_paused = true)]
    async fn nobody_left_is_no_available_instance_with_every_candidate() {
        let out = for_tests(Policy::default());
        let mut p = plan(&out, "GET", false, &["a", "b"]);
        for s in &mut p.scored {
            s.excluded = Some("ejected".into());
        }
        let (routed, asked) = run(&out, p, vec![]).await;
        assert!(asked.is_empty());
        match routed.answer {
            Err(ReachError::NoAvailableInstance { candidates, .. }) => {
                assert_eq!(candidates.as_array().map(Vec::len), Some(2));
            }
            other => panic!("{:?}", other.map(|r| r.status())),
        }
    }
}
