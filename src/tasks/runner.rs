//! The runner: claims due tasks (up to `tasks.workers` at once) and does what each owes — walk
//! the fallback chain, or deliver an escalation or a callback. Every step is committed before
//! the next is taken, and the lease is renewed while a chain runs; a runner that loses its
//! lease (its task was taken over) stops working on it.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use http::Request;
use http_body_util::BodyExt;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use super::callback;
use super::deliver::{self, PostError, Poster};
use super::journal::{AttemptNote, Chain, Journal};
use super::model::{
    encode_body, now_ms, AttemptRecord, Delivery, State, StoredResponse, Task, Work,
};
use super::queue::Queue;
use super::store::StoreError;
use super::view;
use crate::classify::Class;
use crate::config::{ConfigStore, FinalFallback, Snapshot};
use crate::http::ReachBody;

/// The longest a runner sleeps without looking at the store: a shared store gets work from
/// other replicas, which ring no bell here.
const IDLE_POLL: Duration = Duration::from_secs(1);
/// Finished tasks past their retention are removed this often.
const PURGE_EVERY: Duration = Duration::from_secs(60);
/// A claim the store failed is tried again after this, doubling up to `CLAIM_BACKOFF_MAX`.
const CLAIM_BACKOFF_FIRST: Duration = Duration::from_millis(100);
const CLAIM_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// When the runner may start claiming: once the sidecar's view of the fleet has settled after
/// start, so that tasks resumed at start are not judged against a registry gossip has not
/// filled yet (they would find nobody and wait; this saves them the round trip).
pub(crate) struct Settle {
    /// Whether the view has settled (gossip: joined, and members handed over).
    pub(crate) settled: Box<dyn Fn() -> bool + Send + Sync>,
    /// Claim no earlier than this after start (a static fleet's short grace)…
    pub(crate) at_least: Duration,
    /// …and no later, settled or not: a lone seed may wait long to be found.
    pub(crate) at_most: Duration,
}

impl std::fmt::Debug for Settle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settle")
            .field("at_least", &self.at_least)
            .field("at_most", &self.at_most)
            .finish_non_exhaustive()
    }
}

impl Settle {
    /// Peers named in the config only: they are known at once; a short grace for their first
    /// poll.
    pub(crate) fn static_fleet() -> Self {
        Self {
            settled: Box::new(|| true),
            at_least: Duration::from_millis(500),
            at_most: Duration::from_millis(500),
        }
    }

    /// Waits until settled, bounded; false if stopped meanwhile.
    async fn wait(&self, stop: &CancellationToken) -> bool {
        let start = tokio::time::Instant::now();
        loop {
            let waited = start.elapsed();
            if waited >= self.at_most || (waited >= self.at_least && (self.settled)()) {
                return true;
            }
            tokio::select! {
                () = stop.cancelled() => return false,
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    }
}

pub(crate) fn spawn(
    queue: Arc<Queue>,
    chain: Arc<dyn Chain>,
    config: Arc<ConfigStore>,
    settle: Settle,
    stop: CancellationToken,
) -> JoinHandle<()> {
    // Before the first await: submissions check callbacks against the live policy from here on.
    queue.attach(config.clone());
    tokio::spawn(async move {
        let poster = match Poster::new(&config.snapshot().bootstrap.listen) {
            Ok(p) => p,
            Err(err) => {
                tracing::error!(%err, "cannot build the webhook client; tasks will not run");
                return;
            }
        };
        let runner = Arc::new(Runner {
            queue,
            chain,
            config,
            poster,
        });
        let started = tokio::time::Instant::now();
        if !settle.wait(&stop).await {
            return;
        }
        tracing::info!(
            after_ms = started.elapsed().as_millis() as u64,
            "fleet view settled; the task runner starts"
        );
        runner.run(stop).await;
    })
}

struct Runner {
    queue: Arc<Queue>,
    chain: Arc<dyn Chain>,
    config: Arc<ConfigStore>,
    poster: Poster,
}

impl Runner {
    async fn run(self: Arc<Self>, stop: CancellationToken) {
        let slots = Arc::new(tokio::sync::Semaphore::new(
            self.queue.config.workers.max(1),
        ));
        let mut running = JoinSet::new();
        let mut purged = tokio::time::Instant::now();
        let lease = self.queue.config.lease.get();
        // While the store fails, claims back off (the store logs going down and coming back).
        let mut backoff: Option<Duration> = None;
        loop {
            while running.try_join_next().is_some() {}
            let permit = tokio::select! {
                permit = slots.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
                () = stop.cancelled() => break,
            };
            let now = now_ms();
            match self
                .queue
                .store
                .claim(&self.queue.owner, now, lease.as_millis() as u64)
                .await
            {
                Ok(Some(task)) => {
                    backoff = None;
                    if task.state == State::Running {
                        // Its runner died mid-chain (a crash, or a replica whose lease ran
                        // out): the chain runs again, and the task's key keeps each agent
                        // from running it twice.
                        self.queue.metrics.task_event("resumed");
                        tracing::info!(task = %task.id, "resuming a task whose runner stopped");
                    }
                    let me = self.clone();
                    running.spawn(async move {
                        me.work(task).await;
                        drop(permit);
                    });
                    continue;
                }
                Ok(None) => {
                    backoff = None;
                    drop(permit);
                }
                Err(err) => {
                    drop(permit);
                    let wait =
                        backoff.map_or(CLAIM_BACKOFF_FIRST, |w| (w * 2).min(CLAIM_BACKOFF_MAX));
                    backoff = Some(wait);
                    tracing::debug!(%err, wait_ms = wait.as_millis() as u64, "task store: cannot claim");
                    tokio::select! {
                        () = tokio::time::sleep(wait) => continue,
                        () = stop.cancelled() => break,
                    }
                }
            }
            if purged.elapsed() >= PURGE_EVERY {
                purged = tokio::time::Instant::now();
                let retention = self.queue.config.retention.get().as_millis() as u64;
                if let Err(err) = self.queue.store.purge(now_ms(), retention).await {
                    tracing::warn!(%err, "task store: cannot remove finished tasks");
                }
            }
            let pause = match self.queue.store.next_due().await {
                Ok(Some(due)) => Duration::from_millis(due.saturating_sub(now_ms())).min(IDLE_POLL),
                _ => IDLE_POLL,
            };
            tokio::select! {
                () = self.queue.wake.notified() => {}
                () = tokio::time::sleep(pause) => {}
                () = stop.cancelled() => break,
            }
        }
        // Whatever is mid-way stays leased: after the lease (or at the next start, for the
        // embedded store) it runs again — at least once, and once per agent by its key.
        running.abort_all();
    }

    async fn work(&self, task: Task) {
        let id = task.id.clone();
        let result = match task.work() {
            Some(Work::Run) => self.run_chain(task).await,
            Some(Work::Escalate) => self.deliver(task, Kind::Escalation).await,
            Some(Work::Callback) => self.deliver(task, Kind::Callback).await,
            None => self.release(task).await,
        };
        match result {
            Ok(()) => {}
            Err(StoreError::Conflict(_)) => {
                tracing::info!(task = %id, "task taken over by another runner; letting go");
            }
            // The lease runs out and the step is taken again (by its key, never run twice).
            Err(err) => tracing::debug!(task = %id, %err, "task store: cannot record a step"),
        }
    }

    async fn release(&self, mut task: Task) -> Result<(), StoreError> {
        task.lease = None;
        self.queue.store.save(&mut task).await
    }

    /// Walks the fallback chain once; then the task is done, queued for another round,
    /// escalated or failed.
    async fn run_chain(&self, mut task: Task) -> Result<(), StoreError> {
        let snapshot = self.config.snapshot();
        let lease = self.queue.config.lease.get();
        // A task found running was cut off mid-chain (its runner died): the same round again,
        // under the same key, so an agent that ran it answers from its record. A waiting task
        // has not run its round yet.
        if !matches!(task.state, State::Running | State::Waiting) {
            task.rounds += 1;
        }
        task.state = State::Running;
        task.updated_ms = now_ms();
        self.queue.store.save(&mut task).await?;
        let round = task.rounds;

        let (notes, mut heard) = tokio::sync::mpsc::unbounded_channel();
        let request = match replay(&task) {
            Ok(r) => r,
            Err(err) => {
                task.error = Some(err);
                return self.finish(task, State::Failed).await;
            }
        };
        let capability = task.capability.clone();
        let chain = self.chain.run(&capability, request, Journal(notes));
        tokio::pin!(chain);
        let mut renew = tokio::time::interval(lease / 3);
        renew.tick().await;
        let mut tried = 0usize;
        let answer = loop {
            tokio::select! {
                answer = &mut chain => break answer,
                Some(note) = heard.recv() => {
                    tried += 1;
                    task.attempts.push(record(note, round));
                    self.hold(&mut task, lease).await?;
                }
                _ = renew.tick() => self.hold(&mut task, lease).await?,
            }
        };
        while let Ok(note) = heard.try_recv() {
            tried += 1;
            task.attempts.push(record(note, round));
        }
        let class = Class::of_response(&answer);
        let response = stored_response(answer, self.queue.config.max_response_bytes).await;
        if tried == 0 {
            if let Some(reason) = nobody_to_ask(&response) {
                return self.wait(task, reason, &snapshot).await;
            }
        }
        task.waiting_since_ms = None;
        match class {
            Class::Success => {
                task.response = Some(response);
                task.error = None;
                self.finish(task, State::Done).await
            }
            // The request itself was refused (forbidden, malformed): no agent will take it.
            Class::Rejected => {
                task.error = Some(summary(&response));
                task.response = Some(response);
                self.finish(task, State::Failed).await
            }
            _ => {
                task.error = Some(summary(&response));
                self.after_failed_chain(task, &snapshot).await
            }
        }
    }

    /// Nothing was tried: no agent serves the capability yet (gossip still joining after a
    /// start, every server restarting). The task waits — due again with backoff, the round
    /// not spent — until one appears or `tasks.max_wait` passes; then the final fallback.
    async fn wait(
        &self,
        mut task: Task,
        reason: &'static str,
        snapshot: &Snapshot,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        let first = task.waiting_since_ms.is_none();
        let since = *task.waiting_since_ms.get_or_insert(now);
        let waited = Duration::from_millis(now.saturating_sub(since));
        let max_wait = self.queue.config.max_wait.get();
        if waited >= max_wait {
            task.waiting_since_ms = None;
            task.error = Some(format!(
                "{reason}: no agent served `{}` within tasks.max_wait ({})",
                task.capability,
                crate::config::format_duration(max_wait)
            ));
            return self.final_fallback(task, snapshot).await;
        }
        let pause = wait_backoff(waited).min(max_wait - waited);
        task.state = State::Waiting;
        task.error = Some(format!(
            "{reason}: no agent serves `{}` yet",
            task.capability
        ));
        task.due_ms = now.saturating_add(pause.as_millis() as u64);
        task.updated_ms = now;
        task.lease = None;
        self.queue.store.save(&mut task).await?;
        if first {
            self.queue.metrics.task_event("waiting");
            tracing::info!(task = %task.id, capability = %task.capability, reason,
                "no agent serves the task's capability yet; it waits");
        }
        Ok(())
    }

    /// Renews the lease, committing the attempts heard so far.
    async fn hold(&self, task: &mut Task, lease: Duration) -> Result<(), StoreError> {
        if let Some(l) = &mut task.lease {
            l.until_ms = now_ms().saturating_add(lease.as_millis() as u64);
        }
        task.updated_ms = now_ms();
        self.queue.store.save(task).await
    }

    /// The chain failed: another round later, or the final fallback.
    async fn after_failed_chain(
        &self,
        mut task: Task,
        snapshot: &Snapshot,
    ) -> Result<(), StoreError> {
        let fallback = &snapshot.policy.retry.fallback;
        let used = task.rounds.saturating_sub(task.round_base);
        if used <= fallback.rounds() {
            let wait = fallback.queue_rounds().delay_before(used);
            task.state = State::Retrying;
            task.due_ms = now_ms().saturating_add(wait.as_millis() as u64);
            task.updated_ms = now_ms();
            task.lease = None;
            self.queue.store.save(&mut task).await?;
            self.queue.metrics.task_event("requeued");
            tracing::info!(task = %task.id, round = task.rounds, wait_ms = wait.as_millis() as u64,
                "every agent failed the task; it runs again later");
            return Ok(());
        }
        self.final_fallback(task, snapshot).await
    }

    /// Nothing more will be tried by the queue: escalated to a person, or failed.
    async fn final_fallback(&self, mut task: Task, snapshot: &Snapshot) -> Result<(), StoreError> {
        match snapshot.policy.retry.fallback.final_fallback {
            FinalFallback::Escalate => {
                task.escalation = snapshot
                    .policy
                    .escalation
                    .webhook
                    .as_deref()
                    .map(Delivery::to);
                self.finish(task, State::Escalated).await
            }
            FinalFallback::Fail | FinalFallback::Queue => self.finish(task, State::Failed).await,
        }
    }

    /// Commits the task's new state and lets go of it; what it still owes (a webhook, a
    /// callback) is due at once.
    async fn finish(&self, mut task: Task, state: State) -> Result<(), StoreError> {
        task.state = state;
        let now = now_ms();
        task.updated_ms = now;
        task.due_ms = now;
        task.lease = None;
        self.queue.store.save(&mut task).await?;
        self.queue.metrics.task_event(state.as_str());
        tracing::info!(task = %task.id, state = state.as_str(), rounds = task.rounds, "task step");
        Ok(())
    }

    async fn deliver(&self, mut task: Task, kind: Kind) -> Result<(), StoreError> {
        let snapshot = self.config.snapshot();
        let extra = &snapshot.policy.redact_headers;
        let delivery = match kind {
            Kind::Escalation => task.escalation.clone(),
            Kind::Callback => task.callback.clone(),
        };
        let Some(mut delivery) = delivery else {
            return self.release(task).await;
        };
        let attempt = delivery.tries + 1;
        let since = *delivery.first_try_ms.get_or_insert_with(now_ms);
        let sent = match kind {
            Kind::Escalation => {
                let escalation = &snapshot.policy.escalation;
                let body = view::escalation(&task, escalation.max_payload_bytes, attempt, extra);
                let body = serde_json::to_vec(&body).unwrap_or_default();
                let key = self.escalation_key(&snapshot);
                self.poster
                    .post(&delivery.url, &task.id, attempt, body, key.as_deref())
                    .await
                    .map_err(PostError::Failed)
            }
            // Checked again, against the policy as it is now: a host taken off the list since
            // the submission is not called.
            Kind::Callback => {
                match callback::check(&delivery.url, &snapshot.policy, &snapshot.bootstrap.listen) {
                    Err(refused) => Err(PostError::Refused(refused)),
                    Ok(()) => {
                        let body = view::callback(&task, attempt, extra);
                        let body = serde_json::to_vec(&body).unwrap_or_default();
                        self.poster
                            .post_callback(&delivery.url, &task.id, attempt, body)
                            .await
                    }
                }
            }
        };
        let now = now_ms();
        match sent {
            Ok(()) => {
                delivery.tries = attempt;
                delivery.delivered = true;
                delivery.delivered_ms = Some(now);
                delivery.last_error = None;
                self.queue.metrics.task_delivery(kind.as_str(), "accepted");
            }
            // Nothing was sent: not a try, and never worth another.
            Err(PostError::Refused(refused)) => {
                let reason = refused.to_string();
                tracing::warn!(task = %task.id, kind = kind.as_str(), %reason,
                    "delivery refused by the callback policy; given up");
                delivery.given_up = Some(reason);
                delivery.given_up_ms = Some(now);
                self.queue.metrics.task_delivery(kind.as_str(), "given_up");
            }
            Err(PostError::Failed(err)) => {
                delivery.tries = attempt;
                self.queue.metrics.task_delivery(kind.as_str(), "refused");
                let next = now.saturating_add(deliver::backoff(attempt).as_millis() as u64);
                match kind {
                    Kind::Escalation => {
                        tracing::warn!(task = %task.id, kind = kind.as_str(), tries = attempt,
                            %err, "delivery refused; trying again later");
                        task.due_ms = next;
                    }
                    Kind::Callback => {
                        let bounds = &snapshot.policy.callbacks;
                        let window = bounds.give_up_after.get();
                        let deadline = since.saturating_add(window.as_millis() as u64);
                        if attempt >= bounds.max_tries || now >= deadline {
                            let reason = format!(
                                "no 2xx in {attempt} tries over {} (callbacks.give_up_after {}, max_tries {}); last: {err}",
                                crate::config::format_duration(std::time::Duration::from_millis(
                                    now.saturating_sub(since)
                                )),
                                crate::config::format_duration(window),
                                bounds.max_tries,
                            );
                            tracing::warn!(task = %task.id, tries = attempt, %reason,
                                "callback given up");
                            delivery.given_up = Some(reason);
                            delivery.given_up_ms = Some(now);
                            self.queue.metrics.task_delivery(kind.as_str(), "given_up");
                        } else {
                            tracing::warn!(task = %task.id, kind = kind.as_str(), tries = attempt,
                                %err, "delivery refused; trying again later");
                            // The last try lands on the deadline, not a backoff past it.
                            task.due_ms = next.min(deadline);
                        }
                    }
                }
                delivery.last_error = Some(err);
            }
        }
        match kind {
            Kind::Escalation => task.escalation = Some(delivery),
            Kind::Callback => task.callback = Some(delivery),
        }
        task.updated_ms = now;
        task.lease = None;
        self.queue.store.save(&mut task).await
    }

    /// The escalation key, read at each delivery so a rotated key applies at once.
    fn escalation_key(&self, snapshot: &Snapshot) -> Option<Vec<u8>> {
        let policy_dir = self.config.paths.policy.as_deref().and_then(|p| p.parent());
        let path = snapshot.policy.escalation.key_path(policy_dir)?;
        match std::fs::read(&path) {
            Ok(key) => Some(trim_key(key)),
            Err(err) => {
                tracing::warn!(path = %path.display(), %err, "cannot read the escalation key; sending unsigned");
                None
            }
        }
    }
}

/// A key file's trailing newline is not part of the key.
fn trim_key(mut key: Vec<u8>) -> Vec<u8> {
    while key.last().is_some_and(|b| b.is_ascii_whitespace()) {
        key.pop();
    }
    key
}

#[derive(Clone, Copy)]
enum Kind {
    Escalation,
    Callback,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Escalation => "escalation",
            Kind::Callback => "callback",
        }
    }
}

fn record(note: AttemptNote, round: u32) -> AttemptRecord {
    AttemptRecord {
        round,
        agent: note.peer,
        started_ms: note
            .started
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        duration_ms: note.duration.as_millis() as u64,
        outcome: note.outcome.to_owned(),
        status: note.status,
        reason: note.reason,
    }
}

/// The stored call, as a request for the chain.
fn replay(task: &Task) -> Result<Request<Bytes>, String> {
    let mut builder = Request::builder()
        .method(task.request.method.as_str())
        .uri(task.request.path.as_str());
    for (name, value) in &task.request.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    // One key per round: each agent runs a round at most once (a crash rerun is answered from
    // its record), while a later round — the queue's, or a person's retry — runs afresh.
    let key = format!("{}#{}", task.key, task.current_round());
    builder = builder.header(crate::idempotency::HEADER, key);
    builder
        .body(Bytes::from(task.request.body.clone()))
        .map_err(|e| format!("the stored request is invalid: {e}"))
}

/// The answer, its body kept up to `max` bytes.
async fn stored_response(response: http::Response<ReachBody>, max: usize) -> StoredResponse {
    let (parts, mut body) = response.into_parts();
    let mut kept = Vec::new();
    let mut truncated = false;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        if let Ok(data) = frame.into_data() {
            let room = max.saturating_sub(kept.len());
            if data.len() > room {
                kept.extend_from_slice(&data[..room]);
                truncated = true;
                break;
            }
            kept.extend_from_slice(&data);
        }
    }
    let (body, encoding) = encode_body(&kept);
    StoredResponse {
        status: parts.status.as_u16(),
        headers: parts
            .headers
            .iter()
            .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect(),
        body,
        encoding,
        truncated,
    }
}

/// Why a chain that tried nobody had nobody to ask, when that is so: nobody serves the
/// capability (`unknown_capability`, or `no_available_instance` saying why there is no
/// candidate at all), or every server is out of rotation — draining, or its
/// sidecar unreachable, as in a restart (`no_available_instance` whose every candidate is so).
/// Servers passed over for what they did (ejected after failing or refusing) are a failed
/// chain: the final fallback judges those.
fn nobody_to_ask(response: &StoredResponse) -> Option<&'static str> {
    let reason = response
        .headers
        .iter()
        .find(|(n, _)| n == crate::http::headers::REASON.as_str())
        .map(|(_, v)| v.as_str())?;
    let unknown = crate::error::Reason::UnknownCapability.as_str();
    let unavailable = crate::error::Reason::NoAvailableInstance.as_str();
    if reason == unknown {
        return Some(unknown);
    }
    if reason != unavailable {
        return None;
    }
    let body: serde_json::Value = serde_json::from_str(&response.body).ok()?;
    // No candidate at all, and the caller said why (it knows no member of its mesh, or the
    // policy refused every claimant): nobody to ask yet.
    if body["candidates"]["why"].is_string() {
        return Some(unavailable);
    }
    let candidates = body["candidates"].as_array()?;
    let out_of_rotation = |c: &serde_json::Value| {
        c["state"] == "draining"
            || c["self_state"] == "draining"
            || c["passed_over"]
                .as_str()
                .is_some_and(|p| p.starts_with("sidecar unreachable") || p.starts_with("draining"))
    };
    (!candidates.is_empty() && candidates.iter().all(out_of_rotation)).then_some(unavailable)
}

/// The pause before a waiting task is asked again: a quarter of the time it has waited, from
/// 250 ms to 5 s, so a fleet that is joining is met at once and a long wait costs little.
fn wait_backoff(waited: Duration) -> Duration {
    (waited / 4).clamp(Duration::from_millis(250), Duration::from_secs(5))
}

/// Why a chain's last answer was not a success, in one line.
fn summary(response: &StoredResponse) -> String {
    let reason = response
        .headers
        .iter()
        .find(|(n, _)| n == crate::http::headers::REASON.as_str())
        .map(|(_, v)| v.clone());
    match reason {
        Some(reason) => format!("{} {reason}", response.status),
        None => format!("status {}", response.status),
    }
}
