//! The seeds' failure modes, replayed through the routers people use today and through
//! agent-reach. Each scenario runs a fresh fleet of four mock agents (20–60 ms, each with its own
//! fixed seed for its random draws) on loopback, drives `code-review` calls from 16 workers (each
//! giving up after 10 s; the number of workers is the scenario's: one in equal-pair, up to 288
//! during a burst) through one router, and breaks one agent (or two) a quarter of the way in.
//! Never asserts on time.
//!
//! Scenarios: **healthy**; **fake-online** (business calls get 429, `/healthz` 200);
//! **slow-dependency** (every call takes 2 s); **lock-held** (one call at a time);
//! **thread-pool-full** (every agent has a pool of 10 workers, excess calls wait in the agent's
//! own queue; at the break 30 % of the broken agent's calls take 4 s, so the pool fills and the
//! short ones queue behind them); **crash** (the agent process dies, its sidecar stays);
//! **crash-restart** (the whole pod dies, and 3 s later comes back at a new port);
//! **half-open** (a TCP relay on the path to one agent stops forwarding bytes both ways, on
//! pooled connections and new ones alike, without closing anything: routers see timeouts, not
//! errors); **retry-storm** (two agents go fake-online at once); **cold-start** (a fifth agent
//! joins the loaded fleet). crash-restart, half-open and cold-start run at least 60 s, so that a
//! slow ramp, or health checks at 10 s intervals, can act inside the run.
//!
//! Then the everyday faults, each with its own measures, printed in a small table
//! of its own after the main one: **burst** and **burst-3x** (`burst.rs`), **slow-agent**
//! (`slow_agent.rs`), **equal-pair** (`equal_pair.rs`) and **crash-same-address**
//! (`crash_same_address.rs`); each file says what it does and measures. lock-held (above) is the
//! issue's fifth: its p95 against the healthy run's (goal ≤ 1.3×).
//!
//! And predicted saturation (docs/reach-model.md): **ramp**, **ramp-shared** and **ramp-under**
//! (`ramp.rs`), agent-reach with and without prediction.
//!
//! Then two that run fleets of three of their own, each with its own table: **slow-tail**
//! (`slow_tail.rs`: one agent 10× slower on 5 % of its calls; agent-reach with and
//! without hedging, Envoy's hedge on per-try timeout, HAProxy's retry on response timeout) and
//! **provider-budget** (`provider_budget.rs`: agents calling their own model provider
//! for each task, one account small; agent-reach with budget awareness and with the agents
//! calling their providers directly, HAProxy and Envoy retrying 429s where they can).
//!
//! Per scenario and router it prints the task failure rate, mean and p95 latency, p95 against the
//! same router's healthy run (the goal is ≤ 1.3×), *bad out after* (from the fault to the end of
//! the first half second in which the broken agent got under 5 % of a fair share of the calls
//! that reached agents; in half-open, what counts for it is the calls sent into its broken path;
//! a half second in which callers are so stuck that the agents get under a tenth of their usual
//! calls says nothing either way), the retry storm's busiest survivor against its fair share,
//! and for cold-start and crash-restart *new at full* (from the new agent's start to the end of
//! the first 1 s window in which it got at least 90 % of a fair share of the calls that reached
//! agents) with *join fails* (calls that failed from its start to the end of the run).
//!
//! Routers: **agent-reach** (a sidecar per agent with a business probe, default policy,
//! `max_concurrency` 8 — 10 in thread-pool-full, the agents' pool size, as an operator would
//! declare it; the fleet finds itself by gossip through the caller's sidecar, the seed, as in
//! production, and a restarted or new agent's sidecar joins the same way); **baseline**
//! (round-robin over a static list, `/healthz` every 10 s, one immediate retry: what the seeds
//! started from); **haproxy** (`/healthz` checks, `observe layer7`, `retry-on` with redispatch);
//! **envoy** (active `/healthz` checks, outlier detection, retries on another host with a retry
//! budget, slow start; `no_traffic_interval` is set to the 10 s check interval, or a host that
//! has never served — the cold start's newcomer — would be checked only every 60 s). In
//! half-open the relay sits where the network does: between the caller's sidecar and the broken
//! agent's sidecar (which advertises the relay's address, 127.0.0.2, by gossip), and between the
//! router and the agent for the others, so their health checks cross it too.
//!
//! Membership for the static routers: in cold-start the fifth endpoint is listed from the start
//! at a reserved port that begins listening at the join (their health checks find it). In
//! crash-restart the baseline's static list cannot learn the new address: its row says `static`,
//! and the fleet runs on three agents from then on. HAProxy and Envoy get what a Kubernetes
//! operator would give them instead of DNS: the new address is pushed the instant the new agent
//! listens (an ideal control plane, kinder than any real one) — HAProxy through its runtime API
//! (`set server b/a1 addr`), Envoy through file-based EDS; their health checks and Envoy's slow
//! start then apply.
//!
//! Read with care: the 16 callers are a closed loop. A caller stuck on a slow or silent agent
//! makes no new calls, so a stall shows as fewer *calls* (and a higher mean) more than as
//! failures or p95: compare calls with the healthy run's (thread-pool-full and half-open above
//! all).
//!
//! Run: `cargo bench --bench scenarios` (`-- --seconds 30`, `-- --only fake-online,cold-start`,
//! `-- --routers agent-reach,envoy`, `-- --smoke`: healthy, fake-online, thread-pool-full and
//! burst, 3 s each, burst's burst 1.5 s; the newer scenarios alone: `-- --only
//! burst,burst-3x,slow-agent,equal-pair,crash-same-address,lock-held`; predicted saturation:
//! `-- --only ramp,ramp-shared,ramp-under`, in the smoke run too; `-- --only
//! slow-tail,provider-budget`, in the smoke run too, slow-tail's runs 2 s each there). `-- --diag DIR` writes, for each agent-reach run, the caller's view of every peer
//! each half second and its final `/status`; `-- --decision-log` turns on the policy's decision
//! log (printed with `RUST_LOG`, e.g. `RUST_LOG=agent_reach::decision=info`).
//!
//! This file is the command line, the run loop and the main table; `scenario.rs` says what sets
//! each scenario apart; `support/` holds the agents, callers, routers and measures they share.

use testkit::bench;

mod burst;
mod crash_same_address;
mod equal_pair;
mod half_open;
mod provider_budget;
mod ramp;
mod scenario;
mod slow_agent;
mod slow_tail;
mod support;

use std::collections::HashMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench::{free_port, Tools};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use testkit::{Latency, MockAgent, MockConfig, Mode, Workload};

use scenario::{Scenario, RESTART_AFTER};
use support::front::{Front, Kind};
use support::measures::{outcome, Observed, Outcome};
use support::{Caller, Sample, Slot};

const AGENTS: usize = 4;
const WORKERS: usize = 16;
const CAP: &str = "code-review";
/// Agent `i` draws its latencies (and long tasks) from a generator seeded with `SEED + i`.
const SEED: u64 = 0x5eed_0006;
/// What each worker waits for one call before counting it failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// crash-restart and cold-start run at least this long, so that a slow ramp ends inside the run.
const LONG_RUN: u64 = 60;
/// The agents' latency, uniform over this range (mean 40 ms), in every scenario but equal-pair.
const LATENCY: Latency = Latency {
    min: Duration::from_millis(20),
    max: Duration::from_millis(60),
};
/// What an agent-reach sidecar queues beyond its `max_concurrency` (up to 1 s each); in burst,
/// the fleet's room is `AGENTS × (max_concurrency + QUEUE)`.
const QUEUE: usize = 16;

/// Switches that change how a run is observed, not what it measures.
#[derive(Clone, Debug, Default)]
struct Options {
    diag: Option<PathBuf>,
    decision_log: bool,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke") || !args.iter().any(|a| a == "--bench");
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let seconds: u64 = arg("--seconds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(if smoke { 3 } else { 20 });
    let only: Option<Vec<String>> =
        arg("--only").map(|o| o.split(',').map(|s| s.trim().to_owned()).collect());
    let routers_wanted: Option<Vec<String>> =
        arg("--routers").map(|o| o.split(',').map(|s| s.trim().to_owned()).collect());
    let options = Options {
        diag: arg("--diag").map(PathBuf::from),
        decision_log: args.iter().any(|a| a == "--decision-log"),
    };
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    if let Some(d) = &options.diag {
        let _ = std::fs::create_dir_all(d);
    }
    let tools = Tools::find();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("cannot start a runtime: {err}");
            if smoke {
                std::process::exit(1);
            }
            return;
        }
    };
    let dir = std::env::temp_dir().join(format!("agent-reach-scenarios-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let routers: Vec<&str> = ["agent-reach", "baseline", "haproxy", "envoy"]
        .into_iter()
        .filter(|r| match *r {
            "haproxy" => tools.haproxy.is_some(),
            "envoy" => tools.envoy.is_some(),
            _ => true,
        })
        .filter(|r| {
            routers_wanted
                .as_ref()
                .is_none_or(|w| w.iter().any(|n| n == r))
        })
        .collect();
    println!(
        "failure scenarios: {AGENTS} mock agents (20–60 ms), {WORKERS} concurrent callers, {seconds} s per run \
         ({} s for crash-restart, half-open and cold-start), fault at {:.1} s\n",
        seconds.max(LONG_RUN),
        seconds as f64 / 4.0
    );
    println!(
        "{:<18} {:<12} {:>6} {:>8} {:>8} {:>8} {:>7} {:>9} {:>9} {:>10} {:>6}",
        "scenario",
        "router",
        "calls",
        "failed %",
        "mean ms",
        "p95 ms",
        "p95/hl",
        "bad out",
        "peak/fair",
        "new full",
        "j.fail"
    );
    let started = Instant::now();
    let mut healthy_p95: HashMap<&str, f64> = HashMap::new();
    let mut reach_failed = false;
    let mut extras: Vec<(Scenario, &str, Extra)> = Vec::new();
    for scenario in Scenario::ALL {
        if only
            .as_ref()
            .is_some_and(|o| !o.iter().any(|n| n == scenario.name()))
        {
            continue;
        }
        if smoke
            && !matches!(
                scenario,
                Scenario::Healthy
                    | Scenario::FakeOnline
                    | Scenario::ThreadPoolFull
                    | Scenario::Burst
                    | Scenario::Ramp
                    | Scenario::RampShared
                    | Scenario::RampUnder
            )
        {
            continue;
        }
        for router in &scenario.routers(&routers) {
            let result = runtime.block_on(run(scenario, router, &tools, &dir, seconds, &options));
            match result {
                Ok(r) => {
                    if scenario == Scenario::Healthy {
                        healthy_p95.insert(router, r.p95_ms);
                    }
                    println!("{}", row(scenario, router, &r, healthy_p95.get(router)));
                    if let Some(extra) = r.extra {
                        extras.push((scenario, router, extra));
                    }
                }
                Err(err) => {
                    println!("{:<18} {:<12} cannot run: {err}", scenario.name(), router);
                    reach_failed |= *router == "agent-reach";
                }
            }
            let _ = std::io::stdout().flush();
        }
    }
    println!(
        "\np95/hl: p95 ÷ the same router's healthy p95. bad out: from the fault until the broken agent \
         gets under 5 % of a fair share.\nnew full: from the newcomer's start to its first second at \
         ≥ 90 % of a fair share; j.fail: calls failed from then on; static: a static list cannot \
         learn a new address."
    );
    print_extras(&extras, seconds);
    // slow-tail and provider-budget run their own fleets of three, in the smoke run too.
    let selected = |name: &str| only.as_ref().is_none_or(|o| o.iter().any(|n| n == name));
    if selected("slow-tail") {
        let run_for = if smoke { 2 } else { seconds };
        runtime.block_on(slow_tail::run_all(&tools, &dir, run_for, &routers));
    }
    if selected("provider-budget") {
        runtime.block_on(provider_budget::run_all(&tools, &dir, seconds, &routers));
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "\ntook {:.0} s; reproduce: cargo bench --bench scenarios{}{}",
        started.elapsed().as_secs_f64(),
        if smoke {
            " -- --smoke".to_owned()
        } else {
            format!(" -- --seconds {seconds}")
        },
        only.map_or(String::new(), |o| format!(" --only {}", o.join(",")))
    );
    if smoke && reach_failed {
        std::process::exit(1);
    }
}

/// The measures of the newer scenarios: a small table for each.
fn print_extras(extras: &[(Scenario, &str, Extra)], seconds: u64) {
    let (mut burst, mut slow, mut pair, mut crash, mut ramp) =
        (vec![], vec![], vec![], vec![], vec![]);
    for (scenario, router, extra) in extras {
        let (scenario, router) = (*scenario, *router);
        match extra {
            Extra::Burst(m) => burst.push((scenario, router, m)),
            Extra::SlowAgent(m) => slow.push((scenario, router, m)),
            Extra::EqualPair(m) => pair.push((scenario, router, m)),
            Extra::CrashSameAddress(m) => crash.push((scenario, router, m)),
            Extra::Ramp(m) => ramp.push((scenario, router, m)),
        }
    }
    burst::print(&burst, seconds);
    slow_agent::print(&slow);
    equal_pair::print(&pair);
    crash_same_address::print(&crash);
    ramp::print(&ramp, seconds);
}

fn row(scenario: Scenario, router: &str, r: &Outcome, healthy_p95: Option<&f64>) -> String {
    let secs = |d: Option<Duration>, missing: &str| {
        d.map_or_else(
            || missing.to_owned(),
            |d| format!("{:.1} s", d.as_secs_f64()),
        )
    };
    let out = if scenario.measures_out() {
        secs(r.out_after, "never")
    } else {
        "-".to_owned()
    };
    let (full, join_fails) = match scenario.newcomer() {
        Some(_) if scenario == Scenario::CrashRestart && router == "baseline" => {
            ("static".to_owned(), r.join_failed.to_string())
        }
        Some(_) => (secs(r.full_after, "never"), r.join_failed.to_string()),
        None => ("-".to_owned(), "-".to_owned()),
    };
    format!(
        "{:<18} {:<12} {:>6} {:>7.2}% {:>8.1} {:>8.1} {:>7} {:>9} {:>9} {:>10} {:>6}",
        scenario.name(),
        router,
        r.calls,
        r.failed_pct,
        r.mean_ms,
        r.p95_ms,
        healthy_p95
            .filter(|h| **h > 0.0 && scenario.compares_healthy())
            .map_or("-".to_owned(), |h| format!("{:.2}x", r.p95_ms / h)),
        out,
        r.peak_ratio.map_or("-".into(), |p| format!("{p:.2}x")),
        full,
        join_fails,
    )
}

/// The measures of burst, slow-agent, equal-pair, crash-same-address and the ramps.
enum Extra {
    Burst(burst::Measures),
    SlowAgent(slow_agent::Measures),
    EqualPair(equal_pair::Measures),
    CrashSameAddress(crash_same_address::Measures),
    Ramp(ramp::Measures),
}

impl Extra {
    /// A scenario's own measures of a run, if it has any.
    fn measure(scenario: Scenario, seconds: u64, o: &Observed) -> Option<Self> {
        Some(match scenario {
            Scenario::Burst | Scenario::Burst3x => {
                Extra::Burst(burst::measure(scenario, seconds, o))
            }
            Scenario::SlowAgent => Extra::SlowAgent(slow_agent::measure(o)),
            Scenario::EqualPair => Extra::EqualPair(equal_pair::measure(o)),
            Scenario::CrashSameAddress => Extra::CrashSameAddress(crash_same_address::measure(o)),
            Scenario::Ramp | Scenario::RampShared | Scenario::RampUnder => {
                Extra::Ramp(ramp::measure(o))
            }
            _ => return None,
        })
    }
}

async fn run(
    scenario: Scenario,
    router: &str,
    tools: &Tools,
    dir: &Path,
    seconds: u64,
    options: &Options,
) -> Result<Outcome, String> {
    let duration = scenario.duration(seconds);
    let fault_at = scenario.fault_at(seconds);
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut slots: Vec<Slot> = (0..scenario.slots())
        .map(|_| Slot {
            agent: None,
            before: 0,
        })
        .collect();
    let mut addrs = Vec::new();
    for (i, slot) in slots.iter_mut().enumerate().take(scenario.agents()) {
        addrs.push(slot.start(scenario, i, any).await?);
    }
    if scenario == Scenario::ColdStart {
        // Reserved for the newcomer: listed by the static routers, listening from the join.
        addrs.push(SocketAddr::from(([127, 0, 0, 1], free_port()?)));
    }
    let mut front = Front::start(router, scenario, &addrs, tools, dir, options).await?;

    let caller = Caller {
        client: Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>(),
        urls: front.urls(),
        spawned: Arc::default(),
        calls: Arc::default(),
        stop: Arc::new(AtomicBool::new(false)),
        started: Instant::now(),
        pause: scenario.fail_pause(),
    };
    let started = caller.started;
    let burst_until = fault_at + scenario.burst_length(seconds);
    let mut workers: Vec<_> = (0..scenario.workers())
        .map(|_| caller.spawn(Duration::ZERO, None))
        .collect();
    workers
        .extend((0..scenario.burst_workers()).map(|_| caller.spawn(fault_at, Some(burst_until))));
    if let Some(every) = scenario.ramp_every(seconds) {
        workers.extend(
            (1..=scenario.ramp_added()).map(|k| caller.spawn(fault_at + every * k as u32, None)),
        );
    }
    // Watch what reaches each agent, every 100 ms; break, restart and join on time.
    let restart_at = matches!(
        scenario,
        Scenario::CrashRestart | Scenario::CrashSameAddress
    )
    .then_some(fault_at + RESTART_AFTER);
    let mut samples: Vec<Sample> = Vec::new();
    let (mut faulted, mut restarted) = (false, false);
    // When the fault came, to the loop's tick.
    let mut broke_at = fault_at;
    let mut joined_at: Option<Duration> = None;
    let mut next_diag = Duration::ZERO;
    let mut diag = Vec::new();
    // burst: the peers agent-reach's caller took out of rotation, with the worst state seen.
    let mut left: Option<HashMap<String, &'static str>> = None;
    while started.elapsed() < duration {
        let now = started.elapsed();
        if !faulted && now >= fault_at {
            faulted = true;
            broke_at = started.elapsed();
            for i in scenario.broken() {
                if let Some(agent) = &slots[*i].agent {
                    scenario.breaks(agent);
                }
            }
            match scenario {
                Scenario::HalfOpen => front.break_path(),
                Scenario::CrashRestart => {
                    slots[1].die().await;
                    front.pod_gone(1).await;
                }
                // The agent's process dies; its sidecar stays.
                Scenario::CrashSameAddress => slots[1].die().await,
                Scenario::EqualPair => equal_pair::slow_sample(&slots).await,
                Scenario::ColdStart => {
                    joined_at = Some(started.elapsed());
                    // agent-reach's newcomer listens anywhere: its sidecar announces it.
                    let listen = if router == "agent-reach" {
                        any
                    } else {
                        addrs[AGENTS]
                    };
                    let addr = slots[AGENTS].start(scenario, AGENTS, listen).await?;
                    front.pod_started(AGENTS, addr).await?;
                }
                _ => {}
            }
        }
        if restart_at.is_some_and(|at| !restarted && now >= at) {
            restarted = true;
            joined_at = Some(started.elapsed());
            if scenario == Scenario::CrashSameAddress {
                // Back on the same port, behind the sidecar that stayed: nobody is told.
                slots[1].start_again(scenario, 1, addrs[1]).await?;
            } else {
                let addr = slots[1].start(scenario, 1, any).await?;
                front.pod_started(1, addr).await?;
            }
        }
        if faulted && scenario.burst().is_some() {
            if let Some(out) = front.peers_out() {
                let seen = left.get_or_insert_with(HashMap::new);
                for (name, state) in out {
                    let worst = seen.entry(name).or_insert(state);
                    if state == "ejected" {
                        *worst = state;
                    }
                }
            }
        }
        let mut reached: Vec<u64> = slots.iter().map(Slot::reached).collect();
        if let Some(sent) = front.sent_into_path() {
            // In half-open the agent gets nothing once the path is broken; what counts is what
            // the router still sends into it.
            reached[1] = sent;
        }
        let n = caller.calls.lock().unwrap_or_else(|p| p.into_inner()).len();
        samples.push(Sample {
            at: started.elapsed(),
            reached,
            calls: n,
        });
        if options.diag.is_some() && now >= next_diag {
            next_diag = now + Duration::from_millis(500);
            if let Some(line) = front.diag_line(now) {
                diag.push(line);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    caller.stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.await;
    }
    if let (Some(d), Some(status)) = (&options.diag, front.final_status()) {
        // `agent-reach/h0` names a file, not a folder.
        let router = router.replace('/', "-");
        let name = |what: &str| d.join(format!("{}-{router}-{what}", scenario.name()));
        let _ = std::fs::write(name("timeline.jsonl"), diag.join("\n"));
        let _ = std::fs::write(name("status.json"), status);
    }
    let reach = matches!(front.kind, Kind::Reach(_));
    let refusals = front.refusals(scenario::RAMP_WEAK);
    front.stop().await;
    for slot in &mut slots {
        slot.die().await;
    }
    let calls = caller
        .calls
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let observed = Observed {
        calls: &calls,
        samples: &samples,
        fault_at,
        broke_at,
        joined_at,
        // Read from /status for agent-reach (none seen: an empty map), from the traffic for
        // the others.
        left: if reach {
            Some(left.unwrap_or_default())
        } else {
            None
        },
        refusals,
    };
    let mut outcome = outcome(scenario, &calls, &samples, fault_at, joined_at);
    outcome.extra = Extra::measure(scenario, seconds, &observed);
    Ok(outcome)
}
