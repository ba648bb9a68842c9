//! `agent-reach tasks list|show|retry|resolve`: the task API of a sidecar's outbound port, for a
//! person at a terminal (in a pod: `kubectl exec … -c agent-reach -- agent-reach tasks list`).

use std::fmt::Write as _;
use std::process::ExitCode;

use serde_json::Value;

use crate::blocking::exchange;
use agent_reach::tasks::TASKS_PATH;

/// The outbound port's default address, as the bootstrap's default listener binds it.
const DEFAULT_OUTBOUND: &str = "http://127.0.0.1:4140";

/// `agent-reach tasks`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The sidecar's outbound address.
    #[arg(long, default_value = DEFAULT_OUTBOUND, global = true)]
    outbound: String,
    /// Print the API's JSON as it is.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    action: Action,
}

/// What to do.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum Action {
    /// The tasks, newest first.
    List {
        /// Only tasks in this state (queued, running, retrying, done, failed, escalated, resolved).
        #[arg(long)]
        state: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// One task: every attempt with its reason, the answer, what it still owes.
    Show { id: String },
    /// Send an escalated, failed or resolved task through the chain again.
    Retry { id: String },
    /// Close a task by hand.
    Resolve {
        id: String,
        /// What was done.
        #[arg(long)]
        note: Option<String>,
        /// Who did it.
        #[arg(long)]
        by: Option<String>,
    },
}

/// Runs one `agent-reach tasks` command against the outbound port.
pub(crate) fn run(args: Args) -> ExitCode {
    let Args {
        outbound,
        json,
        action,
    } = args;
    let (method, path, body) = match &action {
        Action::List { state, limit } => {
            let mut path = format!("{TASKS_PATH}?limit={limit}");
            if let Some(state) = state {
                let _ = write!(path, "&state={state}");
            }
            ("GET", path, Vec::new())
        }
        Action::Show { id } => ("GET", format!("{TASKS_PATH}/{id}"), Vec::new()),
        Action::Retry { id } => ("POST", format!("{TASKS_PATH}/{id}/retry"), Vec::new()),
        Action::Resolve { id, note, by } => {
            let body = serde_json::json!({ "note": note, "by": by });
            (
                "POST",
                format!("{TASKS_PATH}/{id}/resolve"),
                serde_json::to_vec(&body).unwrap_or_default(),
            )
        }
    };
    let (status, text, url) = match exchange(&outbound, method, &path, &body) {
        Ok(answer) => answer,
        Err(err) => {
            eprintln!("agent-reach tasks: {err}");
            return ExitCode::FAILURE;
        }
    };
    let doc: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    if status != 200 {
        let why = doc["message"]
            .as_str()
            .or(doc["error"].as_str())
            .unwrap_or(text.trim());
        eprintln!("agent-reach tasks: {url} answered {status}: {why}");
        return ExitCode::FAILURE;
    }
    if json {
        println!("{}", text.trim_end());
        return ExitCode::SUCCESS;
    }
    match action {
        Action::List { .. } => print!("{}", table(&doc)),
        _ => print!("{}", detail(&doc)),
    }
    ExitCode::SUCCESS
}

/// One line per task, newest first.
fn table(doc: &Value) -> String {
    let mut out = format!(
        "{:<36} {:<10} {:<18} {:>6} {:>8}  {}\n",
        "ID", "STATE", "CAPABILITY", "ROUNDS", "ATTEMPTS", "LAST"
    );
    let empty = Vec::new();
    let tasks = doc["tasks"].as_array().unwrap_or(&empty);
    for t in tasks {
        let attempts = t["attempts"].as_array().map_or(0, Vec::len);
        let _ = writeln!(
            out,
            "{:<36} {:<10} {:<18} {:>6} {:>8}  {}",
            t["id"].as_str().unwrap_or("-"),
            t["state"].as_str().unwrap_or("-"),
            t["capability"].as_str().unwrap_or("-"),
            t["rounds"].as_u64().unwrap_or(0),
            attempts,
            last(t),
        );
    }
    if tasks.is_empty() {
        out.push_str("(no tasks)\n");
    }
    out
}

/// The last attempt's agent and reason, or the answer's status.
fn last(t: &Value) -> String {
    if let Some(status) = t["response"]["status"].as_u64() {
        return format!("answered {status}");
    }
    match t["attempts"].as_array().and_then(|a| a.last()) {
        Some(a) => format!(
            "{}: {}",
            a["agent"].as_str().unwrap_or("-"),
            a["reason"].as_str().unwrap_or("-")
        ),
        None => "-".to_owned(),
    }
}

/// One task: its head, every attempt, and what it still owes.
fn detail(t: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "task {}  {}  capability {}  priority {}  rounds {}",
        t["id"].as_str().unwrap_or("-"),
        t["state"].as_str().unwrap_or("-"),
        t["capability"].as_str().unwrap_or("-"),
        t["priority"],
        t["rounds"],
    );
    let _ = writeln!(
        out,
        "request  {} {}  ({} bytes)",
        t["request"]["method"].as_str().unwrap_or("-"),
        t["request"]["path"].as_str().unwrap_or("-"),
        t["request"]["body_bytes"]
    );
    for a in t["attempts"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "  round {:<2} {:<16} {:>6} ms  {:<9} {}",
            a["round"],
            a["agent"].as_str().unwrap_or("-"),
            a["duration_ms"],
            a["outcome"].as_str().unwrap_or("-"),
            a["reason"].as_str().unwrap_or("-"),
        );
    }
    if let Some(error) = t["error"].as_str() {
        let _ = writeln!(out, "error    {error}");
    }
    if let Some(status) = t["response"]["status"].as_u64() {
        let body = t["response"]["body"].as_str().unwrap_or("");
        let shown: String = body.chars().take(200).collect();
        let _ = writeln!(out, "response {status}  {shown}");
    }
    for kind in ["escalation", "callback"] {
        let d = &t[kind];
        if d.is_object() {
            let state = if d["delivered"] == true {
                "delivered".to_owned()
            } else if d["state"] == "given_up" {
                format!(
                    "given up ({} tries; {})",
                    d["tries"],
                    d["reason"].as_str().unwrap_or("-")
                )
            } else {
                format!(
                    "pending ({} tries; {})",
                    d["tries"],
                    d["last_error"].as_str().unwrap_or("not tried yet")
                )
            };
            let _ = writeln!(
                out,
                "{kind:<8} {}  {state}",
                d["url"].as_str().unwrap_or("-")
            );
        }
    }
    if let Some(note) = t["resolution"]["note"].as_str() {
        let _ = writeln!(out, "resolved {note}");
    }
    out
}
