//! A fault run that proves it: `cargo bench --bench chaos [-- --smoke]`.
//!
//! A real fleet of sidecar processes (the binary cargo built: `agent-reach run`) finding each
//! other by gossip from one seed, strict mutual TLS between them, each worker beside a mock
//! agent process that logs every business call it executes with its `idempotency-key`; a caller
//! keeping tasks in the embedded store (on a small tmpfs when root) and one keeping them in a
//! private Redis (`appendonly yes`, `appendfsync always`). A mixed load — sync calls, keyed
//! calls, async tasks (`prefer: respond-async`), SSE streams — runs while a seeded schedule of
//! faults hits the fleet: SIGKILL and restart of sidecars and agents, SIGTERM (drain) of
//! sidecars, a 15 s partition of a worker (iptables DROP on its ports), the task store's disk
//! filled and freed, a Redis restart. A fault this machine cannot inject (not root, no
//! iptables, no redis-server) is skipped and said so. Then the checker (`examples/testkit/src/chaos/`)
//! reads every accepted task and every execution log: every `202` must end `done`, `escalated`
//! or `resolved` (or `failed` with the agent's own answer) — but not escalated for
//! `unknown_capability` (nobody to ask must wait, `docs/tasks.md`) — no agent may run one key's
//! round twice (unless it or its sidecar was hit in between), no sync call taken by a draining
//! sidecar may be lost, no stream may hang, the task store must accept a task within 20 s of
//! its disk or Redis coming back, no process may panic.
//!
//! `--smoke` (CI): 8 faults (each kind once, then drawn), ≥ 200 tasks, about a minute.
//! Default: 24 faults, ≥ 2,000 tasks. `--faults N`, `--tasks N`, `--seed N`, `--workers N`,
//! `--partition SECS`; `BENCH_BINARY=path` runs another build's sidecars (the mock agents stay
//! this build's). Never asserts on time; exits 1 when it cannot run or the checker finds lost or
//! duplicated work (or a task given up unasked, an unhealed store, a hung stream, a panic).

use std::time::Duration;

use testkit::chaos;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke" || a == "--quick");
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let mut options = if smoke {
        chaos::Options::smoke()
    } else {
        chaos::Options::full()
    };
    if let Some(n) = arg("--faults") {
        options.faults = n as usize;
    }
    if let Some(n) = arg("--tasks") {
        options.tasks = n as usize;
    }
    if let Some(n) = arg("--seed") {
        options.seed = n;
    }
    if let Some(n) = arg("--workers") {
        options.workers = (n as usize).max(2);
    }
    if let Some(n) = arg("--partition") {
        options.partition = Duration::from_secs(n);
    }
    options.reproduce = format!(
        "cargo bench --bench chaos -- {}--seed {} --faults {} --tasks {} --workers {} --partition {}",
        if smoke { "--smoke " } else { "" },
        options.seed,
        options.faults,
        options.tasks,
        options.workers,
        options.partition.as_secs()
    );
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
    let result = runtime.block_on(chaos::run(&options));
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(report) => {
            print!("{}", report.render());
            if !report.ok() {
                std::process::exit(1);
            }
        }
        Err(err) => {
            println!("chaos: cannot run: {err}\nreproduce: {}", options.reproduce);
            std::process::exit(1);
        }
    }
}
