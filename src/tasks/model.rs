//! A task as it is stored: the call, where it stands, every attempt, and what is still owed
//! (a chain to run, a webhook or a callback to deliver). One JSON document per task, the same in
//! every store.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use serde::{Deserialize, Serialize};

/// Where a task stands.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum State {
    /// Accepted, waiting for a runner.
    Queued,
    /// A runner is walking its fallback chain.
    Running,
    /// Every agent failed it; the whole chain runs again at `due_ms` (`final_fallback: queue`).
    Retrying,
    /// No agent serves its capability yet (none known, or every one out of rotation: draining,
    /// its sidecar unreachable; so nothing was tried): it is asked again at `due_ms`, with
    /// backoff, until one appears or `tasks.max_wait` passes. A wait is not a round.
    Waiting,
    /// An agent answered; the answer is kept.
    Done,
    /// Every agent failed it and nothing more will be tried.
    Failed,
    /// Handed to a person; waits for `retry` or `resolve`.
    Escalated,
    /// A person closed it.
    Resolved,
}

impl State {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Running => "running",
            State::Retrying => "retrying",
            State::Waiting => "waiting",
            State::Done => "done",
            State::Failed => "failed",
            State::Escalated => "escalated",
            State::Resolved => "resolved",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    pub(crate) const ALL: [State; 8] = [
        State::Queued,
        State::Running,
        State::Retrying,
        State::Waiting,
        State::Done,
        State::Failed,
        State::Escalated,
        State::Resolved,
    ];

    /// Nothing will run again unless a person asks.
    pub(crate) fn is_final(self) -> bool {
        matches!(self, State::Done | State::Failed | State::Resolved)
    }
}

/// The call as the local agent made it, kept to be replayed on each attempt.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub(crate) struct StoredRequest {
    pub(crate) method: String,
    /// Path and query.
    pub(crate) path: String,
    pub(crate) headers: Vec<(String, String)>,
    #[serde(with = "b64")]
    pub(crate) body: Vec<u8>,
}

/// One attempt on one agent.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub(crate) struct AttemptRecord {
    /// Which chain (1 for the first; a queue round or a person's retry adds one).
    pub(crate) round: u32,
    pub(crate) agent: String,
    pub(crate) started_ms: u64,
    pub(crate) duration_ms: u64,
    /// `success`, `failure`, `refused`, `timeout`, … (the metrics' outcome label).
    pub(crate) outcome: String,
    /// The HTTP status the caller saw, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<u16>,
    /// Why: the `reach-reason`, the error, or the status.
    pub(crate) reason: String,
}

/// The agent's answer to a task that is done.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub(crate) struct StoredResponse {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    /// The body as text when it is UTF-8, else base64 (`encoding`).
    pub(crate) body: String,
    pub(crate) encoding: BodyEncoding,
    /// The body was longer than `tasks.max_response_bytes` and is cut.
    #[serde(default)]
    pub(crate) truncated: bool,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum BodyEncoding {
    Utf8,
    Base64,
}

/// Text when the bytes are UTF-8, else base64.
pub(crate) fn encode_body(bytes: &[u8]) -> (String, BodyEncoding) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (text.to_owned(), BodyEncoding::Utf8),
        Err(_) => (
            base64::engine::general_purpose::STANDARD.encode(bytes),
            BodyEncoding::Base64,
        ),
    }
}

/// A POST still owed to someone (the escalation webhook or the caller's callback): retried with
/// backoff until it is accepted — or, for a callback, given up (`callbacks.give_up_after`,
/// `callbacks.max_tries`, or a destination the policy refuses).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub(crate) struct Delivery {
    pub(crate) url: String,
    pub(crate) delivered: bool,
    pub(crate) tries: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) delivered_ms: Option<u64>,
    /// The first try: the give-up clock starts here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) first_try_ms: Option<u64>,
    /// Why no more tries will be made, once none will.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) given_up: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) given_up_ms: Option<u64>,
}

impl Delivery {
    pub(crate) fn to(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            delivered: false,
            tries: 0,
            last_error: None,
            delivered_ms: None,
            first_try_ms: None,
            given_up: None,
            given_up_ms: None,
        }
    }

    /// Whether it is still to be tried.
    pub(crate) fn owed(&self) -> bool {
        !self.delivered && self.given_up.is_none()
    }

    /// `pending`, `delivered` or `given_up`.
    pub(crate) fn state(&self) -> &'static str {
        if self.delivered {
            "delivered"
        } else if self.given_up.is_some() {
            "given_up"
        } else {
            "pending"
        }
    }
}

/// How a person closed the task.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub(crate) struct Resolution {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) note: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) by: Option<String>,
    #[serde(default)]
    pub(crate) at_ms: u64,
}

/// Who holds a claimed task, until when.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub(crate) struct Lease {
    pub(crate) owner: String,
    pub(crate) until_ms: u64,
}

/// What a runner should do with a task next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Work {
    /// Walk the fallback chain.
    Run,
    /// POST the escalation to the webhook.
    Escalate,
    /// POST the final result to the caller's callback.
    Callback,
}

/// A task.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub(crate) struct Task {
    pub(crate) id: String,
    pub(crate) capability: String,
    /// The caller's key when it gave one, else the task id. Each attempt sends
    /// `idempotency-key: <key>#<round>`: a rerun of the same round after a crash reaches an
    /// agent that already ran it as a replay, while a later round runs afresh.
    pub(crate) key: String,
    /// 0..9, higher first.
    pub(crate) priority: u8,
    pub(crate) state: State,
    pub(crate) request: StoredRequest,
    pub(crate) created_ms: u64,
    pub(crate) updated_ms: u64,
    /// When the next piece of work may start.
    pub(crate) due_ms: u64,
    /// Chains run so far.
    pub(crate) rounds: u32,
    /// `rounds` when a person last sent the task back: the queue's rounds count from here.
    #[serde(default)]
    pub(crate) round_base: u32,
    pub(crate) attempts: Vec<AttemptRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) response: Option<StoredResponse>,
    /// Why the last chain ended without an answer (while `waiting`: why nothing was tried).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// Since when the task has waited for an agent to serve its capability (`State::Waiting`);
    /// cleared once a chain runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) waiting_since_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) callback: Option<Delivery>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) escalation: Option<Delivery>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) resolution: Option<Resolution>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) lease: Option<Lease>,
    /// Bumped by every write; a write names the version it read (`store` module).
    #[serde(default)]
    pub(crate) version: u64,
}

impl Task {
    /// What is owed next, if anything: a store keeps the tasks with work in its queue.
    pub(crate) fn work(&self) -> Option<Work> {
        match self.state {
            State::Queued | State::Retrying | State::Waiting | State::Running => Some(Work::Run),
            State::Escalated => match &self.escalation {
                Some(d) if d.owed() => Some(Work::Escalate),
                _ => None,
            },
            State::Done | State::Failed | State::Resolved => match &self.callback {
                Some(d) if d.owed() => Some(Work::Callback),
                _ => None,
            },
        }
    }

    /// The queue's order: higher priority first (rank 0 is priority 9).
    pub(crate) fn rank(&self) -> u8 {
        9 - self.priority.min(9)
    }

    /// A finished task older than `retention` may be removed.
    pub(crate) fn expired(&self, now_ms: u64, retention_ms: u64) -> bool {
        self.work().is_none()
            && self.state.is_final()
            && now_ms.saturating_sub(self.updated_ms) > retention_ms
    }

    /// The round the next attempt belongs to.
    pub(crate) fn current_round(&self) -> u32 {
        self.rounds.max(1)
    }
}

/// Milliseconds since the Unix epoch, the stores' clock.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

mod b64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}
