//! Async tasks with the embedded store: `cargo bench --bench tasks [-- --smoke]`.
//! Runs the real binary (`agent-reach run`, the bench profile's build) as its own process, its
//! task store (redb, fsync on every commit: redb's default durability) on the real disk under
//! the target directory, never on tmpfs.
//!
//! 1. **Submission**: `POST /review` with `prefer: respond-async` from 1, 16 and 64 concurrent
//!    clients (closed loop, a fresh process and file per level): submissions per second and the
//!    p50/p99 of the `202`. One client is one fsync per submission; more share a commit (the
//!    writer thread commits whatever has queued up). So that the runner does not compete for the
//!    store while submissions are measured, the caller has `tasks.workers: 1` and its one peer
//!    is a black hole (accepts, never answers; `timeouts.request: 1h`): the runner claims one
//!    task and waits on it, every other task stays `queued`. The states at the end are printed.
//! 2. **Kills**: four clients submit at a modest rate to a caller whose peer is a healthy mock
//!    agent (100 ms) behind its own (in-process) sidecar; 20 times, after a random 0.2–1.5 s (seeded),
//!    the caller gets SIGKILL and starts again on the same files (new ports; the clients follow).
//!    Only a `202` counts as accepted. At the end every accepted task must reach `done`: lost
//!    (accepted, then missing or not done by the deadline) must be 0. Agent executions against
//!    the tasks stored: at-least-once means ≥ 1 each; duplicates are the excess.
//!
//! `--smoke` (CI): 2 s per level, levels 1 and 16, 3 kills. `--seconds N`, `--clients 1,16,64`,
//! `--kills N`, `--seed N`, `--rate N` (submissions per second in the kill run), `--only
//! submission|kills`. Never asserts on time; in
//! smoke it exits 1 only when it cannot run or an accepted task is missing from the store.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use agent_reach::config::ConfigPaths;
use agent_reach::http::body;
use agent_reach::http::client::{self, UpstreamClient};
use agent_reach::{Bootstrap, ConfigStore, Policy, Sidecar};
use http_body_util::BodyExt;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use testkit::{Latency, MockAgent, MockConfig};

const CAP: &str = "code-review";

struct Options {
    smoke: bool,
    seconds: f64,
    levels: Vec<usize>,
    kills: usize,
    seed: u64,
    rate: f64,
    /// `--only submission` or `--only kills`.
    only: Option<String>,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke" || a == "--quick");
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let options = Options {
        smoke,
        seconds: arg("--seconds")
            .and_then(|s| s.parse().ok())
            .unwrap_or(if smoke { 2.0 } else { 5.0 }),
        levels: arg("--clients")
            .map(|l| l.split(',').filter_map(|n| n.trim().parse().ok()).collect())
            .unwrap_or_else(|| if smoke { vec![1, 16] } else { vec![1, 16, 64] }),
        kills: arg("--kills")
            .and_then(|s| s.parse().ok())
            .unwrap_or(if smoke { 3 } else { 20 }),
        seed: arg("--seed").and_then(|s| s.parse().ok()).unwrap_or(17),
        rate: arg("--rate").and_then(|s| s.parse().ok()).unwrap_or(25.0),
        only: arg("--only"),
    };
    let wanted = |part: &str| options.only.as_deref().is_none_or(|o| o == part);
    let binary = std::env::var_os("BENCH_BINARY")
        .map_or(PathBuf::from(env!("CARGO_BIN_EXE_agent-reach")), Into::into);
    // The target directory's scratch space: on the real disk, where the fsyncs mean something.
    let root =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tasks-bench-{}", std::process::id()));
    if let Err(err) = std::fs::create_dir_all(&root) {
        eprintln!("cannot create {}: {err}", root.display());
        std::process::exit(1);
    }
    let fs = fs_type(&root);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("cannot start a runtime: {err}");
            std::process::exit(1);
        }
    };
    println!(
        "async tasks, embedded store (redb, fsync per commit) in {} ({fs}); binary {}",
        root.display(),
        binary.display()
    );
    if fs == "tmpfs" || fs == "ramfs" {
        println!("  warning: the store is on {fs}: fsync costs nothing there, the figures flatter");
    }
    let started = Instant::now();
    let mut failed = false;
    if wanted("submission") {
        if let Err(err) = runtime.block_on(submission(&binary, &root, &options)) {
            println!("submission: cannot run: {err}");
            failed = true;
        }
    }
    if wanted("kills") {
        match runtime.block_on(kills(&binary, &root, &options)) {
            Ok(missing) => failed |= missing > 0,
            Err(err) => {
                println!("kills: cannot run: {err}");
                failed = true;
            }
        }
    }
    runtime.shutdown_timeout(Duration::from_secs(1));
    let _ = std::fs::remove_dir_all(&root);
    // What this run was given (cargo adds `--bench`), and the settings it used.
    let given: Vec<&str> = args
        .iter()
        .skip(1)
        .map(String::as_str)
        .filter(|a| *a != "--bench")
        .collect();
    println!(
        "\ntook {:.0} s ({} s per level, clients {:?}, {} kills, seed {}, {}/s); \
         reproduce: cargo bench --bench tasks{}",
        started.elapsed().as_secs_f64(),
        options.seconds,
        options.levels,
        options.kills,
        options.seed,
        options.rate,
        if given.is_empty() {
            String::new()
        } else {
            format!(" -- {}", given.join(" "))
        }
    );
    if failed && options.smoke {
        std::process::exit(1);
    }
}

/// The resident set of process `pid` in MiB (`/proc/PID/status`), 0 where unreadable. The
/// store's page cache is bounded, so this stays flat however many tasks are stored.
fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// The filesystem type of `dir` (`stat -f`), or `unknown`.
fn fs_type(dir: &Path) -> String {
    Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(dir)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

// ---------------------------------------------------------------------------------------------
// The sidecar process

struct Process {
    child: Child,
    outbound: SocketAddr,
    /// From spawn to the start-up line (the store opened, recovered, the listeners bound).
    start_time: Duration,
}

impl Process {
    /// `agent-reach run` on the files, its log appended to `log`; waits for the start-up line.
    fn start(binary: &Path, bootstrap: &Path, policy: &Path, log: &Path) -> Result<Self, String> {
        let began = Instant::now();
        let mut child = Command::new(binary)
            .args(["run", "--config"])
            .arg(bootstrap)
            .arg("--policy")
            .arg(policy)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| e.to_string())?;
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            use std::io::{BufRead, Write};
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let _ = writeln!(file, "{line}");
                let _ = tx.send(line);
            }
        });
        loop {
            let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) else {
                let _ = child.kill();
                let _ = child.wait();
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(10).collect();
                return Err(format!(
                    "the sidecar did not start; its log ends:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ));
            };
            if let Some(outbound) = bound(&line, "outbound") {
                return Ok(Self {
                    child,
                    outbound,
                    start_time: began.elapsed(),
                });
            }
        }
    }

    /// SIGKILL: nothing drained, nothing flushed.
    fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A bound address from the start-up line (`outbound=127.0.0.1:PORT`).
fn bound(line: &str, key: &str) -> Option<SocketAddr> {
    if !line.contains("sidecar started") {
        return None;
    }
    let start = line.find(&format!("{key}="))? + key.len() + 1;
    line[start..].split_whitespace().next()?.parse().ok()
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// HTTP

enum Outcome {
    Accepted(String),
    /// Nobody listening: the process was down.
    Refused,
    /// Sent, and no 202 came back (the process died under it, or another status).
    NoAnswer,
}

async fn submit(client: &UpstreamClient, outbound: SocketAddr) -> Outcome {
    let request = http::Request::post(format!("http://{outbound}/review"))
        .header("reach-capability", CAP)
        .header("prefer", "respond-async")
        .body(body::full("{\"diff\": 1}"));
    let Ok(request) = request else {
        return Outcome::NoAnswer;
    };
    let response =
        match tokio::time::timeout(Duration::from_secs(10), client.request(request)).await {
            Ok(Ok(r)) => r,
            Ok(Err(err)) if err.is_connect() => return Outcome::Refused,
            _ => return Outcome::NoAnswer,
        };
    let status = response.status();
    let Ok(bytes) = response.into_body().collect().await.map(|c| c.to_bytes()) else {
        return Outcome::NoAnswer;
    };
    if status != http::StatusCode::ACCEPTED {
        return Outcome::NoAnswer;
    }
    serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v["id"].as_str().map(str::to_owned))
        .map_or(Outcome::NoAnswer, Outcome::Accepted)
}

/// A GET on the outbound port: status and JSON body.
async fn get_json(
    client: &UpstreamClient,
    outbound: SocketAddr,
    path: &str,
) -> Result<(u16, serde_json::Value), String> {
    let request = http::Request::get(format!("http://{outbound}{path}"))
        .body(body::full(""))
        .map_err(|e| e.to_string())?;
    let response = tokio::time::timeout(Duration::from_secs(10), client.request(request))
        .await
        .map_err(|_| "timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    ))
}

/// How many tasks the list API shows in `state` (it lists at most 1000).
async fn count(client: &UpstreamClient, outbound: SocketAddr, state: &str) -> String {
    let query = if state.is_empty() {
        "limit=1000".to_owned()
    } else {
        format!("state={state}&limit=1000")
    };
    match get_json(client, outbound, &format!("/reach/v1/tasks?{query}")).await {
        Ok((200, v)) => {
            let n = v["tasks"].as_array().map_or(0, Vec::len);
            if n >= 1000 {
                "≥1000".to_owned()
            } else {
                n.to_string()
            }
        }
        Ok((status, v)) => format!("?({status} {v})"),
        Err(err) => format!("?({err})"),
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Submission

/// A peer that accepts connections and never answers.
async fn black_hole() -> Result<SocketAddr, String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    Ok(addr)
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

async fn submission(binary: &Path, root: &Path, options: &Options) -> Result<(), String> {
    let hole = black_hole().await?;
    println!(
        "\n1. submission: POST /review with `prefer: respond-async`, closed loop, {} s per level \
         (after 0.5 s of warm-up), a fresh process and store per level.\n   \
         runner kept off the store: tasks.workers 1, its one peer a black hole \
         (timeouts.request 1h): one task running, the rest queued.",
        options.seconds
    );
    println!(
        "\n{:>8} {:>11} {:>9} {:>9} {:>9} {:>7} {:>12} {:>16}  runner states at the end",
        "clients",
        "submits/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "errors",
        "store KiB/t",
        "RSS MiB start→end"
    );
    for &clients in &options.levels {
        let dir = root.join(format!("submit-{clients}"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let (bootstrap, policy) = (dir.join("agent-reach.yaml"), dir.join("policy.yaml"));
        write(
            &bootstrap,
            &format!(
                "listen: {{ outbound: 127.0.0.1:0, inbound: 127.0.0.1:0, admin: 127.0.0.1:0 }}\n\
                 agent:\n  name: caller\n  address: 127.0.0.1:9\n  max_concurrency: 64\n  capabilities: []\n\
                 peers:\n  - {{ name: coder-1, address: {hole}, capabilities: [{CAP}] }}\n\
                 tasks: {{ path: tasks.db, workers: 1 }}\n"
            ),
        )?;
        write(
            &policy,
            "timeouts: { request: 1h }\nretry:\n  fallback:\n    final_fallback: queue\n    \
             queue: { delay: 1h, max_delay: 1h, max_rounds: 1 }\n",
        )?;
        let process = Process::start(binary, &bootstrap, &policy, &dir.join("sidecar.log"))?;
        let outbound = process.outbound;
        let rss_start = rss_mib(process.child.id());
        let warm_until = Instant::now() + Duration::from_millis(500);
        let until = warm_until + Duration::from_secs_f64(options.seconds);
        let errors = Arc::new(AtomicU64::new(0));
        let workers: Vec<_> = (0..clients)
            .map(|_| {
                let errors = errors.clone();
                tokio::spawn(async move {
                    let client = client::build(&Policy::default());
                    let mut latencies = Vec::new();
                    loop {
                        let began = Instant::now();
                        if began >= until {
                            break;
                        }
                        let outcome = submit(&client, outbound).await;
                        let took = began.elapsed().as_micros() as u64;
                        match outcome {
                            Outcome::Accepted(_) if began >= warm_until => latencies.push(took),
                            Outcome::Accepted(_) => {}
                            _ => {
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    latencies
                })
            })
            .collect();
        let mut latencies = Vec::new();
        for worker in workers {
            latencies.extend(worker.await.unwrap_or_default());
        }
        latencies.sort_unstable();
        let client = client::build(&Policy::default());
        let mut states = Vec::new();
        for state in ["running", "retrying", "failed", "done"] {
            states.push(format!("{state} {}", count(&client, outbound, state).await));
        }
        let total = latencies.len() as f64;
        let rss_end = rss_mib(process.child.id());
        process.kill9();
        let size = std::fs::metadata(dir.join("tasks.db")).map_or(0, |m| m.len());
        println!(
            "{:>8} {:>11.0} {:>9.2} {:>9.2} {:>9.2} {:>7} {:>12.2} {:>16}  {}",
            clients,
            total / options.seconds,
            percentile(&latencies, 0.50),
            percentile(&latencies, 0.99),
            percentile(&latencies, 1.0),
            errors.load(Ordering::Relaxed),
            size as f64 / 1024.0 / total.max(1.0),
            format!("{rss_start:.1}→{rss_end:.1}"),
            states.join(", ")
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 2. Kills

#[derive(Default)]
struct Tally {
    accepted: Vec<String>,
    refused: u64,
    no_answer: u64,
}

/// Runs the kill scenario; returns how many accepted tasks the store does not know.
async fn kills(binary: &Path, root: &Path, options: &Options) -> Result<usize, String> {
    let mut config = MockConfig::new("coder-1");
    config.latency = Latency::fixed(Duration::from_millis(100));
    let agent = MockAgent::start(SocketAddr::from(([127, 0, 0, 1], 0)), config)
        .await
        .map_err(|e| format!("mock agent: {e}"))?;
    let callee_bootstrap =
        Bootstrap::local("coder-1", agent.addr, &[CAP]).map_err(|e| e.to_string())?;
    let callee = Sidecar::start(Arc::new(ConfigStore::new(
        callee_bootstrap,
        Policy::default(),
        ConfigPaths::default(),
    )))
    .await
    .map_err(|e| format!("callee sidecar: {e}"))?;
    let dir = root.join("kills");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let (bootstrap, policy) = (dir.join("agent-reach.yaml"), dir.join("policy.yaml"));
    write(
        &bootstrap,
        &format!(
            "listen: {{ outbound: 127.0.0.1:0, inbound: 127.0.0.1:0, admin: 127.0.0.1:0 }}\n\
             agent:\n  name: caller\n  address: 127.0.0.1:9\n  max_concurrency: 64\n  capabilities: []\n\
             peers:\n  - {{ name: coder-1, address: {}, capabilities: [{CAP}] }}\n\
             tasks: {{ path: tasks.db, lease: 5s }}\n",
            callee.addrs.inbound
        ),
    )?;
    write(
        &policy,
        "retry:\n  fallback:\n    interval: 50ms\n    final_fallback: queue\n    \
         queue: { delay: 1s, max_delay: 1s, max_rounds: 50 }\n",
    )?;
    let log = |generation: usize| dir.join(format!("sidecar-{generation:02}.log"));
    println!(
        "\n2. kills: 4 clients submitting {:.0}/s in all to a caller whose peer is a mock agent \
         (100 ms, so that kills land mid-attempt) behind its own sidecar;\n   {} × SIGKILL after a random 0.2–1.5 s (seed {}), \
         restarted at once on the same files (default tasks.workers, final_fallback queue 1 s).",
        options.rate, options.kills, options.seed
    );

    let mut process = Process::start(binary, &bootstrap, &policy, &log(0))?;
    let current = Arc::new(Mutex::new(Some(process.outbound)));
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let clients = 4;
    let gap = Duration::from_secs_f64(clients as f64 / options.rate.max(0.1));
    let submitters: Vec<_> = (0..clients)
        .map(|_| {
            let (current, stop, tally) = (current.clone(), stop.clone(), tally.clone());
            tokio::spawn(async move {
                let client = client::build(&Policy::default());
                let mut tick = tokio::time::interval(gap);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let addr = *current.lock().unwrap_or_else(PoisonError::into_inner);
                    let outcome = match addr {
                        Some(addr) => submit(&client, addr).await,
                        None => Outcome::Refused,
                    };
                    let mut tally = tally.lock().unwrap_or_else(PoisonError::into_inner);
                    match outcome {
                        Outcome::Accepted(id) => tally.accepted.push(id),
                        Outcome::Refused => tally.refused += 1,
                        Outcome::NoAnswer => tally.no_answer += 1,
                    }
                }
            })
        })
        .collect();

    let mut rng = StdRng::seed_from_u64(options.seed);
    let mut restarts = Vec::new();
    let began = Instant::now();
    for generation in 1..=options.kills {
        let pause = Duration::from_millis(rng.random_range(200..=1500));
        tokio::time::sleep(pause).await;
        *current.lock().unwrap_or_else(PoisonError::into_inner) = None;
        let killed = Instant::now();
        process.kill9();
        let (b, p, l) = (bootstrap.clone(), policy.clone(), log(generation));
        let binary = binary.to_owned();
        process = tokio::task::spawn_blocking(move || Process::start(&binary, &b, &p, &l))
            .await
            .map_err(|e| e.to_string())??;
        restarts.push((killed.elapsed(), process.start_time));
        *current.lock().unwrap_or_else(PoisonError::into_inner) = Some(process.outbound);
    }
    // A last stretch of submissions to the last process, then stop.
    tokio::time::sleep(Duration::from_millis(rng.random_range(200..=1500))).await;
    stop.store(true, Ordering::Relaxed);
    for submitter in submitters {
        let _ = submitter.await;
    }
    let submitting = began.elapsed();
    let tally = std::mem::take(&mut *tally.lock().unwrap_or_else(PoisonError::into_inner));
    let outbound = process.outbound;

    // Every accepted task must reach `done`.
    let client = client::build(&Policy::default());
    let deadline = Duration::from_secs(if options.smoke { 60 } else { 180 });
    let waiting = Instant::now();
    let mut pending: Vec<String> = tally.accepted.clone();
    let mut last: std::collections::HashMap<String, String> = Default::default();
    loop {
        let mut still = Vec::new();
        for id in pending {
            match get_json(&client, outbound, &format!("/reach/v1/tasks/{id}")).await {
                Ok((200, v)) if v["state"] == "done" => {}
                Ok((200, v)) => {
                    last.insert(id.clone(), v["state"].as_str().unwrap_or("?").to_owned());
                    still.push(id);
                }
                Ok((status, _)) => {
                    last.insert(id.clone(), format!("HTTP {status}"));
                    still.push(id);
                }
                Err(err) => {
                    last.insert(id.clone(), err);
                    still.push(id);
                }
            }
        }
        pending = still;
        if pending.is_empty() || waiting.elapsed() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let all_done_in = waiting.elapsed();
    let missing = pending
        .iter()
        .filter(|id| last.get(*id).is_some_and(|s| s == "HTTP 404"))
        .count();
    let accepted = tally.accepted.len();
    let done = accepted - pending.len();
    // Everything the store holds (accepted, and submissions stored whose 202 a kill cut off).
    let stored = count(&client, outbound, "").await;
    let stored_done = count(&client, outbound, "done").await;
    // Calls still arriving at the agent for tasks not done: let them land before counting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let executions = agent.stats().business;
    process.kill9();

    println!(
        "\n   submitting for {:.1} s: accepted (202) {accepted}, refused while down {}, \
         no answer (cut off by a kill) {}",
        submitting.as_secs_f64(),
        tally.refused,
        tally.no_answer
    );
    let (mut down, mut start): (Vec<f64>, Vec<f64>) = restarts
        .iter()
        .map(|(d, s)| (d.as_secs_f64() * 1000.0, s.as_secs_f64() * 1000.0))
        .unzip();
    down.sort_by(f64::total_cmp);
    start.sort_by(f64::total_cmp);
    let median = |v: &[f64]| v.get(v.len() / 2).copied().unwrap_or(0.0);
    println!(
        "   restarts: {} kills, down (kill → listening) median {:.0} ms, max {:.0} ms; \
         start-up median {:.0} ms",
        restarts.len(),
        median(&down),
        down.last().copied().unwrap_or(0.0),
        median(&start)
    );
    println!(
        "   accepted {accepted}, done {done}, lost {} (missing {missing}, not done within {} s: {}) \
         — must be 0; waited {:.1} s after the last submission",
        pending.len(),
        deadline.as_secs(),
        pending.len() - missing,
        all_done_in.as_secs_f64()
    );
    for id in pending.iter().take(10) {
        println!(
            "     lost: {id} ({})",
            last.get(id).map_or("?", String::as_str)
        );
    }
    let duplicates = stored_done.parse::<u64>().map_or("?".to_owned(), |n| {
        (executions as i64 - n as i64).to_string()
    });
    println!(
        "   store: {stored} tasks ({stored_done} done; the accepted and any stored submission \
         whose 202 a kill cut off); agent executions {executions} ({:.3} per accepted task), \
         duplicates (executions − tasks done) {duplicates}",
        executions as f64 / accepted.max(1) as f64
    );

    // What the sidecars logged: a store error after a kill would be a bug.
    let mut warnings = Vec::new();
    let mut resumed = 0;
    for generation in 0..=options.kills {
        let text = std::fs::read_to_string(log(generation)).unwrap_or_default();
        for line in text.lines() {
            if line.contains("resuming a task") {
                resumed += 1;
            }
            if line.contains("WARN") || line.contains("ERROR") {
                warnings.push(format!("[{generation:02}] {line}"));
            }
        }
    }
    println!(
        "   logs: {resumed} tasks resumed after a kill; {} warnings or errors{}",
        warnings.len(),
        if warnings.is_empty() { "" } else { ":" }
    );
    for line in warnings.iter().take(20) {
        println!("     {line}");
    }
    drop(callee);
    Ok(missing)
}
