//! A fault run that measures routing around failures, shared by `benches/chaos.rs` (`cargo bench --bench
//! chaos`) and `tests/it/chaos.rs` (the same run at a small size); the fleet of processes is
//! `tests/it/faults.rs`'s too.
//!
//! A real fleet of sidecar processes — a gossip seed (`hub`, never hit), N workers each beside a
//! mock agent process, a caller keeping tasks in a file store (`c-file`, on a small tmpfs when
//! root) and one keeping them in Redis (`c-redis`) — finding each other by gossip, speaking
//! strict mutual TLS. A mixed load (sync, keyed, async tasks, SSE) runs through the hub and the
//! callers while a seeded schedule of faults hits workers, agents, callers, the disk and Redis.
//! Then [`check`] reads every accepted task and every agent's execution log.

pub mod check;
pub mod fleet;
pub mod load;
pub mod net;
pub mod schedule;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use fleet::{Fleet, Partition, Redis, SidecarSpec, Tmpfs};
use load::{Entry, Load, LoadPlan, Recorder, CAP};
use schedule::{Fault, Hands, Kind, Targets};

/// How big a run, and its seed.
#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    pub faults: usize,
    /// Accepted tasks to reach at least (the load runs on past the faults until then).
    pub tasks: usize,
    pub workers: usize,
    pub tasks_per_s: f64,
    pub sync_per_s: f64,
    pub keyed_per_s: f64,
    pub streams_per_s: f64,
    /// Pause before each fault, a draw in this range (ms).
    pub gap_ms: (u64, u64),
    pub partition: Duration,
    /// How long the checker waits for accepted tasks to finish.
    pub settle: Duration,
    /// The load stops this long after the faults at the latest, even short of `tasks`.
    pub overtime: Duration,
    pub tmpfs_mib: u64,
    /// Printed as the command that runs this again.
    pub reproduce: String,
}

impl Options {
    /// CI: 8 faults (each kind this machine allows once, then drawn), ≥ 200 tasks, about a
    /// minute.
    pub fn smoke() -> Self {
        Self {
            seed: 32,
            faults: 8,
            tasks: 200,
            workers: 3,
            tasks_per_s: 10.0,
            sync_per_s: 6.0,
            keyed_per_s: 3.0,
            streams_per_s: 1.0,
            gap_ms: (1000, 2500),
            partition: Duration::from_secs(15),
            settle: Duration::from_secs(60),
            overtime: Duration::from_secs(60),
            tmpfs_mib: 16,
            reproduce: String::new(),
        }
    }

    /// ≥ 20 faults, ≥ 2,000 accepted tasks.
    pub fn full() -> Self {
        Self {
            faults: 24,
            tasks: 2000,
            workers: 4,
            tasks_per_s: 20.0,
            sync_per_s: 10.0,
            keyed_per_s: 4.0,
            streams_per_s: 1.0,
            gap_ms: (1000, 4000),
            settle: Duration::from_secs(120),
            overtime: Duration::from_secs(180),
            tmpfs_mib: 64,
            ..Self::smoke()
        }
    }

    /// A test's size: every kind once, a short partition, ~100 tasks.
    pub fn small() -> Self {
        Self {
            faults: 6,
            tasks: 100,
            tasks_per_s: 6.0,
            sync_per_s: 4.0,
            keyed_per_s: 2.0,
            streams_per_s: 0.5,
            gap_ms: (800, 1500),
            partition: Duration::from_secs(5),
            ..Self::smoke()
        }
    }
}

/// What the run did and what the checker found.
#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    pub faults: Vec<Fault>,
    pub skipped: BTreeMap<Kind, String>,
    pub tasks: check::Tasks,
    pub refused_tasks: BTreeMap<String, u64>,
    pub executions: check::Executions,
    pub sync: check::Sync,
    pub streams: check::Streams,
    pub panics: Vec<String>,
    /// Store faults after which the store accepted no task within `schedule::HEAL_WITHIN`.
    pub unhealed: Vec<String>,
    pub took: Duration,
    pub dir: std::path::PathBuf,
    pub reproduce: String,
}

impl Report {
    pub fn lost(&self) -> usize {
        self.tasks.lost() + self.sync.lost()
    }

    pub fn duplicates(&self) -> usize {
        self.executions.duplicates.len()
    }

    /// Nothing lost, nothing run twice, nothing hung, nothing panicked.
    pub fn ok(&self) -> bool {
        self.lost() == 0
            && self.duplicates() == 0
            && self.streams.hung.is_empty()
            && self.panics.is_empty()
            && self.unhealed.is_empty()
            && self.tasks.unasked.is_empty()
    }

    pub fn faults_by_kind(&self) -> BTreeMap<&'static str, usize> {
        let mut by = BTreeMap::new();
        for f in &self.faults {
            *by.entry(f.kind.name()).or_default() += 1;
        }
        by
    }

    /// The findings, one paragraph each.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let t = &self.tasks;
        let kinds: Vec<String> = self
            .faults_by_kind()
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let _ = writeln!(
            s,
            "faults injected: {} ({})",
            self.faults.len(),
            kinds.join(", ")
        );
        for (kind, why) in &self.skipped {
            let _ = writeln!(s, "  skipped {}: {why}", kind.name());
        }
        let _ = writeln!(
            s,
            "tasks: accepted {} (202), done {}, escalated {}, resolved {}, failed with the agent's \
             answer {}; lost {} (failed by the fleet {}, missing {}, not finished within {:.0} s {})",
            t.accepted,
            t.done,
            t.escalated,
            t.resolved,
            t.failed_by_agent,
            t.lost(),
            t.failed.len(),
            t.missing.len(),
            t.waited.as_secs_f64(),
            t.stuck.len()
        );
        for (why, n) in &t.escalated_why {
            let _ = writeln!(s, "  escalated {n}: {why}");
        }
        if !t.unasked.is_empty() {
            let _ = writeln!(
                s,
                "  given up without asking any agent (nobody to ask must wait, docs/tasks.md): {}",
                t.unasked.len()
            );
        }
        for (id, why) in t.unasked.iter().take(5) {
            let _ = writeln!(s, "    {id}: {why}");
        }
        for (id, why) in t.failed.iter().take(10) {
            let _ = writeln!(s, "  failed by the fleet: {id}: {why}");
        }
        for id in t.missing.iter().take(10) {
            let _ = writeln!(s, "  missing: {id}");
        }
        for (id, state) in t.stuck.iter().take(10) {
            let _ = writeln!(s, "  not finished: {id} ({state})");
        }
        let refused: Vec<String> = self
            .refused_tasks
            .iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect();
        let _ = writeln!(
            s,
            "  submissions without a 202 (not accepted; keyed ones were submitted again): {}",
            if refused.is_empty() {
                "none".to_owned()
            } else {
                refused.join(", ")
            }
        );
        if t.done_unlogged > 0 {
            let _ = writeln!(
                s,
                "  done tasks whose answering round no agent logged: {}",
                t.done_unlogged
            );
        }
        let e = &self.executions;
        let _ = writeln!(
            s,
            "executions: {} logged by the agents ({} under a key); duplicates {} (one agent, one \
             key's round, twice, no fault on it between); reruns after a fault on that agent or \
             its sidecar {} (allowed); keys run by several agents {} (at least once across a crash)",
            e.total,
            e.keyed,
            e.duplicates.len(),
            e.excused,
            e.on_several_agents
        );
        for d in e.duplicates.iter().take(10) {
            let _ = writeln!(s, "  duplicate: {d}");
        }
        let y = &self.sync;
        let _ = writeln!(
            s,
            "sync calls: {} ({} keys, {} never answered), 200 {}, refused while down {}, cut off \
             by a SIGKILL of their sidecar {}; lost {} (by a draining sidecar {}, otherwise {})",
            y.calls,
            y.keys,
            y.keys_unanswered,
            y.ok,
            y.refused,
            y.cut_by_kill,
            y.lost(),
            y.lost_in_drain.len(),
            y.lost.len()
        );
        for (what, n) in &y.errors {
            let during = y.errors_in_drain.get(what).copied().unwrap_or(0);
            let _ = writeln!(s, "  answered {what}: {n} ({during} during a drain)");
        }
        for l in y.lost_in_drain.iter().chain(&y.lost).take(10) {
            let _ = writeln!(s, "  lost: {l}");
        }
        let st = &self.streams;
        let _ = writeln!(
            s,
            "streams: {}, complete {}, ended early but cleanly {}, not connected {}, hung {}",
            st.total,
            st.complete,
            st.ended,
            st.not_connected,
            st.hung.len()
        );
        for (what, n) in &st.statuses {
            let _ = writeln!(s, "  answered {what}: {n}");
        }
        for h in st.hung.iter().take(10) {
            let _ = writeln!(s, "  hung: {h}");
        }
        let _ = writeln!(
            s,
            "task stores that did not heal within {} s of their disk or Redis coming back: {}",
            schedule::HEAL_WITHIN.as_secs(),
            self.unhealed.len()
        );
        for u in &self.unhealed {
            let _ = writeln!(s, "  {u}");
        }
        let _ = writeln!(s, "panics: {}", self.panics.len());
        for p in self.panics.iter().take(10) {
            let _ = writeln!(s, "  {p}");
        }
        let _ = writeln!(
            s,
            "result: {} — accepted {}, done {}, escalated {} ({} without asking an agent), \
             failed {}, duplicates {}, lost {}, hung streams {}, stores unhealed {}, panics {}; \
             seed {}, {:.0} s",
            if self.ok() { "OK" } else { "FAILED" },
            t.accepted,
            t.done,
            t.escalated,
            t.unasked.len(),
            t.failed_by_agent + t.failed.len(),
            self.duplicates(),
            self.lost(),
            st.hung.len(),
            self.unhealed.len(),
            self.panics.len(),
            self.seed,
            self.took.as_secs_f64()
        );
        let _ = writeln!(s, "reproduce: {}", self.reproduce);
        s
    }
}

/// The shared policy: strict mTLS, short timeouts and cool-offs so the fleet heals in seconds,
/// and a failed chain (three agents tried, 100 ms apart) escalated at once — no queue rounds to
/// paper over a chain that should not have failed: every escalation is shown with its reason.
pub const POLICY: &str = "timeouts: { connect: 500ms, request: 5s }\n\
mtls: { mode: strict }\n\
states:\n  parole: { duration: 5s }\n  ejected: { cool_off: 3s, max_cool_off: 15s }\n\
retry:\n  fallback:\n    interval: 100ms\n    chain_length: 3\n    final_fallback: escalate\n";

/// The processes and what they stand on; dropped in this order (sidecars before the disk).
struct Rig {
    fleet: Fleet,
    redis: Option<Redis>,
    tmpfs: Option<Tmpfs>,
}

/// Runs the whole thing; `Err` when it cannot run at all.
pub async fn run(options: &Options) -> Result<Report, String> {
    let began = Instant::now();
    let dir = fleet::scratch("chaos")?;
    println!(
        "chaos: seed {}, {} faults, ≥ {} tasks, {} workers; sidecar binary {}; files in {}",
        options.seed,
        options.faults,
        options.tasks,
        options.workers,
        crate::bins::sidecar().display(),
        dir.display()
    );
    let redis = if Redis::installed() {
        Some(Redis::start(&dir.join("redis")).await?)
    } else {
        None
    };
    let store = dir.join("c-file-store");
    let (tmpfs, disk) = match Tmpfs::mount(&store, options.tmpfs_mib) {
        Ok(t) => (Some(t), Ok(())),
        Err(e) => {
            std::fs::create_dir_all(&store).map_err(|e| e.to_string())?;
            (None, Err(format!("no tmpfs for the store ({e})")))
        }
    };
    let partition = Partition::available();
    let mut fleet = Fleet::new(&dir, POLICY)?;
    // Removed below, once the tmpfs in it is unmounted (or kept when the run failed).
    fleet.keep_dir = true;
    let mut rig = Rig {
        fleet,
        redis,
        tmpfs,
    };
    let result = drive(&mut rig, options, &store, partition, disk, began).await;
    let keep = !matches!(&result, Ok(r) if r.ok());
    drop(rig);
    if keep {
        println!("logs kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

async fn drive(
    rig: &mut Rig,
    options: &Options,
    store: &std::path::Path,
    partition: Result<(), String>,
    disk: Result<(), String>,
    began: Instant,
) -> Result<Report, String> {
    let fleet = &mut rig.fleet;
    fleet.add_sidecar(&SidecarSpec::caller("hub"))?;
    let mut workers = Vec::new();
    for i in 1..=options.workers {
        let name = format!("w{i}");
        let a = fleet.add_agent(&name, "50ms..150ms", 10, "100ms")?;
        let addr = fleet.agents[a].addr;
        fleet.add_sidecar(&SidecarSpec::new(&name, addr, &[CAP]))?;
        workers.push(name);
    }
    let file_tasks = format!(
        "{{ path: {}, lease: 5s }}",
        store.join("tasks.db").display()
    );
    fleet.add_sidecar(&SidecarSpec::caller("c-file").tasks(&file_tasks))?;
    if let Some(redis) = &rig.redis {
        let tasks = format!(
            "{{ store: \"{}\", prefix: \"agent-reach:tasks:chaos\", lease: 5s }}",
            redis.url()
        );
        fleet.add_sidecar(&SidecarSpec::caller("c-redis").tasks(&tasks))?;
    }
    fleet.start_all().await?;
    let entry = |name: &str| {
        fleet.sidecar(name).map(|i| Entry {
            name: name.to_owned(),
            outbound: fleet.sidecars[i].outbound,
        })
    };
    let task_entries: Vec<Entry> = ["c-file", "c-redis"]
        .iter()
        .filter_map(|n| entry(n))
        .collect();
    let mut sync_entries: Vec<Entry> = entry("hub").into_iter().collect();
    sync_entries.extend(task_entries.iter().cloned());
    for e in &sync_entries {
        let i = fleet.sidecar(&e.name).ok_or("no entry")?;
        fleet
            .wait_peers(i, &workers, Duration::from_secs(30))
            .await?;
        warm(e).await?;
    }
    println!(
        "fleet up in {:.1} s: hub (seed) + {} workers with agents + {} (mTLS strict, gossip)",
        began.elapsed().as_secs_f64(),
        workers.len(),
        task_entries
            .iter()
            .map(|e| e.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );

    let targets = Targets {
        sidecars: workers
            .iter()
            .cloned()
            .chain(task_entries.iter().map(|e| e.name.clone()))
            .collect(),
        workers: workers.clone(),
        agents: workers.clone(),
        disk: rig.tmpfs.as_ref().map(|_| "c-file".to_owned()),
        redis: rig.redis.is_some(),
    };
    let (kinds, skipped) = schedule::available(&targets, partition, disk);
    for (kind, why) in &skipped {
        println!("  skipping {}: {why}", kind.name());
    }
    let planned = schedule::plan(
        options.seed,
        options.faults,
        &kinds,
        &targets,
        options.gap_ms,
        options.partition,
    );

    let recorder = Arc::new(Recorder::default());
    let stop = CancellationToken::new();
    let plan = LoadPlan {
        seed: options.seed,
        sync_per_s: options.sync_per_s,
        keyed_per_s: options.keyed_per_s,
        tasks_per_s: options.tasks_per_s,
        streams_per_s: options.streams_per_s,
        sync_entries: sync_entries.clone(),
        task_entries: task_entries.clone(),
        call_deadline: Duration::from_secs(30),
        stream_deadline: Duration::from_secs(40),
        stream_events: 10,
    };
    let load = Load::start(&plan, &recorder, &stop);
    let load_began = Instant::now();
    let mut faults = Vec::new();
    let mut hands = Hands {
        fleet: &mut rig.fleet,
        redis: rig.redis.as_mut(),
        tmpfs: rig.tmpfs.as_ref(),
        disk_store: Some("c-file".to_owned()),
        redis_store: Some("c-redis".to_owned()),
    };
    let mut failure = None;
    for (n, p) in planned.iter().enumerate() {
        tokio::time::sleep(p.gap).await;
        match schedule::inject(&mut hands, p).await {
            Ok(fault) => {
                if let Some((store, Some(id))) = &fault.healed {
                    recorder.accept(store, id, Some(format!("heal-probe-{}", fault.start_ms)));
                }
                println!(
                    "  [{:>2}] +{:>5.1} s {:<15} {:<8} {} (accepted so far {})",
                    n + 1,
                    load_began.elapsed().as_secs_f64(),
                    fault.kind.name(),
                    fault.target,
                    fault.note,
                    recorder.accepted()
                );
                faults.push(fault);
            }
            Err(e) => {
                failure = Some(format!(
                    "fault {} ({} {}): {e}",
                    n + 1,
                    p.kind.name(),
                    p.target
                ));
                break;
            }
        }
    }
    // Past the faults: until enough tasks were accepted, then a last second.
    let faults_done = Instant::now();
    while failure.is_none()
        && recorder.accepted() < options.tasks
        && faults_done.elapsed() < options.overtime
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    load.join().await;
    println!(
        "load stopped after {:.1} s: {} tasks accepted; checking",
        load_began.elapsed().as_secs_f64(),
        recorder.accepted()
    );
    if let Some(failure) = failure {
        return Err(failure);
    }

    let fleet = &rig.fleet;
    let entries: HashMap<String, std::net::SocketAddr> = task_entries
        .iter()
        .map(|e| (e.name.clone(), e.outbound))
        .collect();
    let task_records = recorder.task_records();
    let (mut tasks, finished) = check::tasks(&task_records, &entries, options.settle).await;
    // Calls still landing on agents (a round being resumed) get a moment before the logs are read.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let all: Vec<fleet::Execution> = fleet.agents.iter().flat_map(|a| a.executions()).collect();
    tasks.done_unlogged = check::done_unlogged(&task_records, &finished, &all);
    let executions = check::executions(&all, &faults);
    let sync = check::sync(&recorder.sync_records(), &faults);
    let streams = check::streams(&recorder.stream_records());
    let mut panics = fleet.panics();
    for s in &fleet.sidecars {
        let counted = counter(&s.metrics().await, "reach_panics_total");
        if counted > 0 {
            panics.push(format!(
                "{}: reach_panics_total {counted} since its last start",
                s.name
            ));
        }
    }
    let unhealed = faults
        .iter()
        .filter(|f| matches!(&f.healed, Some((_, None))))
        .map(|f| format!("{} at {} ms: {}", f.kind.name(), f.start_ms, f.note))
        .collect();
    Ok(Report {
        seed: options.seed,
        unhealed,
        faults,
        skipped,
        tasks,
        refused_tasks: recorder.refused(),
        executions,
        sync,
        streams,
        panics,
        took: began.elapsed(),
        dir: fleet.dir.clone(),
        reproduce: options.reproduce.clone(),
    })
}

/// Sync calls through `entry` until one is answered 200 (20 s at most).
async fn warm(entry: &Entry) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = net::call(
            entry.outbound,
            "POST",
            "/review",
            &[("reach-capability", CAP)],
            "warm",
            Duration::from_secs(10),
        )
        .await;
        match answer {
            Ok(a) if a.status == 200 => return Ok(()),
            other if Instant::now() > deadline => {
                return Err(format!(
                    "{} does not route {CAP} after 20 s: {}",
                    entry.name,
                    match other {
                        Ok(a) => format!("{} {}", a.status, a.text()),
                        Err(f) => f.to_string(),
                    }
                ))
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The sum of a counter's series in a `/metrics` page.
pub fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}
