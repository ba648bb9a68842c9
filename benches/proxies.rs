//! What a hop costs, side by side: a load generator (wrk) → a pair of proxies → a minimal hyper
//! upstream, for agent-reach, Envoy, nginx and HAProxy, against direct to the upstream. One
//! process per proxy, one worker thread each, on the same machine in one run, interleaved round
//! by round so noise hits every system alike; medians over rounds. Never asserts on time.
//!
//! Mutual TLS: `ar-mtls` and `envoy-mtls` are the same pairs with the hop between the two
//! proxies over TLS 1.3, both certificates verified (agent-reach: policy `mtls.mode: strict`, the
//! caller checks the callee's SPIFFE ID), beside their plaintext rows in the same rounds. Then
//! handshakes: the agent-reach pairs again with the caller keeping no idle connection
//! (`pool.max_idle_per_host: 0`), so every request dials the callee, and an in-memory loop of
//! full and resumed handshakes with the same certificates (`common/tls.rs` says why both).
//!
//! Run: `cargo bench --bench proxies` (or `-- --smoke`, `-- --runs 5 --seconds 5`, `-- --only
//! agent-reach,ar-mtls,handshakes` for those systems and sections alone). Missing tools are
//! installed by `benches/tools.sh` when possible, else reported and skipped.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;

use bench::tls::{handshake_loop, Pki};
use bench::{free_port, kib, write, Tools};
use http_body_util::channel::Channel;
use http_body_util::{BodyExt, Full};
use testkit::bench;

const BODY_64K: usize = 64 * 1024;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| args.iter().any(|a| a == name);
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let smoke = flag("--smoke") || !flag("--bench");
    let runs = value("--runs").unwrap_or(if smoke { 1 } else { 3 }) as usize;
    let seconds = value("--seconds").unwrap_or(if smoke { 1 } else { 4 });
    let concurrency: Vec<usize> = if smoke { vec![1] } else { vec![1, 16, 64] };
    // --only a,b: those systems (direct always) and sections (bodies, handshakes, instructions).
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').map(str::to_owned).collect());
    let selected = |name: &str| only.as_ref().is_none_or(|o| o.iter().any(|n| n == name));

    let dir = std::env::temp_dir().join(format!("agent-reach-proxies-{}", std::process::id()));
    if std::fs::create_dir_all(&dir).is_err() {
        eprintln!("cannot create {}", dir.display());
        return;
    }
    let tools = Tools::find();
    let Some(wrk) = tools.wrk.clone() else {
        println!(
            "wrk not found (Debian package wrk; benches/tools.sh installs it): nothing to measure"
        );
        return;
    };
    let upstream = start_upstream();
    // One throwaway CA; the caller and callee certificates every mTLS pair uses.
    let pki = Pki::write(&dir)
        .map_err(|err| println!("cannot make certificates, mTLS rows skipped: {err}"))
        .ok();
    let mut systems: Vec<System> = vec![System::direct(upstream)];
    // BENCH_COMPARE=/path/to/agent-reach adds that build as a second system ("ar-compare"),
    // interleaved with the others round by round: before/after in one run.
    let compare = std::env::var_os("BENCH_COMPARE").map(PathBuf::from);
    for (name, found) in [
        ("agent-reach", Some(tools.agent_reach.clone())),
        ("ar-mtls", Some(tools.agent_reach.clone())),
        ("ar-compare", compare),
        ("envoy", tools.envoy.clone()),
        ("envoy-mtls", tools.envoy.clone()),
        ("nginx", tools.nginx.clone()),
        ("haproxy", tools.haproxy.clone()),
    ] {
        if !selected(name) {
            continue;
        }
        let Some(binary) = found else {
            println!("{name}: not found, skipped (benches/tools.sh installs it)");
            continue;
        };
        match System::pair(name, &binary, upstream, &dir, pki.as_ref()) {
            Ok(system) => systems.push(system),
            Err(err) => {
                println!("{name}: cannot start: {err}");
                // The smoke run (CI) exists to catch exactly this for our own proxy.
                if smoke && (name == "agent-reach" || name == "ar-mtls") {
                    std::process::exit(1);
                }
            }
        }
    }
    let script = dir.join("report.lua");
    let post_script = dir.join("post64k.lua");
    let _ = std::fs::write(&script, LUA_REPORT);
    let _ = std::fs::write(
        &post_script,
        format!("wrk.method = \"POST\"\nwrk.body = string.rep(\"x\", {BODY_64K})\n{LUA_REPORT}"),
    );

    println!(
        "\nagent-reach per-hop cost: wrk (1 thread) → proxy pair (1 worker thread each) → hyper upstream; {} round(s) of {} s per row, medians\n",
        runs, seconds
    );
    let mut results: BTreeMap<(usize, usize), Vec<Run>> = BTreeMap::new();
    for _ in 0..runs {
        for &c in &concurrency {
            for (i, system) in systems.iter_mut().enumerate() {
                let cpu_before = system.cpu_ticks();
                if let Some(run) = wrk_run(&wrk, &script, system.port, "/", c, seconds) {
                    let cpu = system.cpu_ticks().saturating_sub(cpu_before);
                    results.entry((c, i)).or_default().push(Run {
                        cpu_ticks: cpu,
                        ..run
                    });
                }
            }
        }
    }
    print_table(&systems, &concurrency, &results);
    print_mtls(&systems, &concurrency, &results);
    if !smoke && selected("instructions") {
        print_instructions(&tools.agent_reach);
    }

    // Bodies and streams: agent-reach against direct only.
    let mut extra: BTreeMap<(&str, usize), Vec<Run>> = BTreeMap::new();
    let reach = selected("bodies")
        .then(|| systems.iter().position(|s| s.name == "agent-reach"))
        .flatten();
    if reach.is_some() {
        for _ in 0..runs {
            for (case, path, script) in [
                ("64 KiB POST", "/", &post_script),
                ("SSE, 10 events", "/sse", &script),
            ] {
                for i in [Some(0), reach].into_iter().flatten() {
                    if let Some(run) = wrk_run(&wrk, script, systems[i].port, path, 16, seconds) {
                        extra.entry((case, i)).or_default().push(run);
                    }
                }
            }
        }
        println!(
            "\n{:<16} {:<14} {:>9} {:>9} {:>9} {:>9}",
            "case (16 conns)", "path", "req/s", "p50 µs", "p99 µs", "ratio"
        );
        for case in ["64 KiB POST", "SSE, 10 events"] {
            let direct = extra.get(&(case, 0)).map(|r| median(r));
            for i in [Some(0), reach].into_iter().flatten() {
                if let Some(m) = extra.get(&(case, i)).map(|r| median(r)) {
                    let ratio = direct.map_or(0.0, |d| m.rps / d.rps.max(1.0));
                    println!(
                        "{:<16} {:<14} {:>9.0} {:>9} {:>9} {:>9.2}",
                        case, systems[i].name, m.rps, m.p50, m.p99, ratio
                    );
                }
            }
        }
    }

    println!("\npeak RSS per proxy process (front / back), after every row:");
    for s in &systems[1..] {
        let rss: Vec<String> = s
            .pids()
            .iter()
            .map(|tree| {
                format!(
                    "{:.1} MiB",
                    tree.iter().map(|p| kib(*p, "VmHWM:")).sum::<f64>() / 1024.0
                )
            })
            .collect();
        println!("  {:<12} {}", s.name, rss.join(" / "));
    }
    if let Some(idle) = idle_rss(&tools.agent_reach, upstream, &dir) {
        println!("idle RSS of one agent-reach sidecar: {idle:.1} MiB");
    }
    drop(systems);

    if let Some(pki) = pki.as_ref().filter(|_| selected("handshakes")) {
        let conns = if smoke { 1 } else { 16 };
        if !handshakes(
            &tools.agent_reach,
            upstream,
            &dir,
            pki,
            &wrk,
            &script,
            conns,
            runs,
            seconds,
        ) && smoke
        {
            std::process::exit(1);
        }
    }
    let passed: Vec<&str> = args
        .iter()
        .skip(1)
        .map(String::as_str)
        .filter(|a| *a != "--bench")
        .collect();
    println!(
        "\nreproduce: cargo bench --bench proxies{}{}",
        if passed.is_empty() { "" } else { " -- " },
        passed.join(" ")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Instructions per request in each sidecar of the pair, counted by valgrind's callgrind through
/// `benches/perf/hop.sh` (16 keep-alive connections, an nginx `return 200` upstream): the one
/// figure a busy two-core machine measures without noise (`docs/perf-levers.md`).
fn print_instructions(binary: &Path) {
    if bench::which("valgrind").is_none() {
        println!(
            "\ninstructions per request: valgrind not found, skipped (Debian package valgrind)"
        );
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/perf/hop.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args(["callgrind", "16", "10"])
        .env("BIN", binary)
        .env("UPSTREAM", "nginx")
        .stderr(Stdio::null())
        .output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let per_request = |role: &str| {
        text.as_ref().ok().and_then(|t| {
            t.lines()
                .find(|l| l.starts_with(role))
                .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("Ir/req=")))
                .and_then(|v| v.parse::<f64>().ok())
        })
    };
    match (per_request("front "), per_request("back ")) {
        (Some(front), Some(back)) => println!(
            "\ninstructions per request (callgrind, 16 conns, nginx upstream): caller sidecar {:.1}k, callee sidecar {:.1}k\n  reproduce: UPSTREAM=nginx BIN={} bash benches/perf/hop.sh callgrind 16 10",
            front / 1000.0,
            back / 1000.0,
            binary.display()
        ),
        _ => println!("\ninstructions per request: benches/perf/hop.sh callgrind gave no figures"),
    }
}

const LUA_REPORT: &str = r#"
wrk.headers["reach-capability"] = "bench"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %d %d %d %d %d %d\n", summary.requests, summary.duration,
    e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
"#;

#[derive(Clone, Copy, Debug, Default)]
struct Run {
    requests: u64,
    rps: f64,
    errors: u64,
    p50: u64,
    p99: u64,
    p999: u64,
    cpu_ticks: u64,
}

fn wrk_run(
    wrk: &Path,
    script: &Path,
    port: u16,
    path: &str,
    conns: usize,
    seconds: u64,
) -> Option<Run> {
    let out = Command::new(wrk)
        .args(["-t1", &format!("-c{conns}"), &format!("-d{seconds}s"), "-s"])
        .arg(script)
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("RESULT "))?;
    let n: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if n.len() < 7 {
        return None;
    }
    Some(Run {
        requests: n[0],
        rps: n[0] as f64 / (n[1] as f64 / 1e6).max(1e-6),
        errors: n[2] + n[3],
        p50: n[4],
        p99: n[5],
        p999: n[6],
        cpu_ticks: 0,
    })
}

fn median(runs: &[Run]) -> Run {
    let mut sorted = runs.to_vec();
    sorted.sort_by(|a, b| a.rps.total_cmp(&b.rps));
    let mid = sorted[sorted.len() / 2];
    let pick = |f: fn(&Run) -> u64| {
        let mut v: Vec<u64> = runs.iter().map(f).collect();
        v.sort_unstable();
        v[v.len() / 2]
    };
    Run {
        p50: pick(|r| r.p50),
        p99: pick(|r| r.p99),
        p999: pick(|r| r.p999),
        cpu_ticks: pick(|r| r.cpu_ticks),
        requests: pick(|r| r.requests),
        errors: runs.iter().map(|r| r.errors).sum(),
        ..mid
    }
}

fn print_table(
    systems: &[System],
    concurrency: &[usize],
    results: &BTreeMap<(usize, usize), Vec<Run>>,
) {
    println!(
        "{:<12} {:>5} {:>9} {:>8} {:>8} {:>9} {:>9} {:>12} {:>14} {:>7}",
        "system",
        "conns",
        "req/s",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "ratio",
        "added/hop µs",
        "CPU s/10k req",
        "errors"
    );
    for &c in concurrency {
        let direct = results.get(&(c, 0)).map(|r| median(r));
        for (i, s) in systems.iter().enumerate() {
            let Some(m) = results.get(&(c, i)).map(|r| median(r)) else {
                continue;
            };
            let (ratio, added) = match direct {
                Some(d) if i > 0 => (
                    format!("{:.2}", m.rps / d.rps.max(1.0)),
                    format!("{:.0}", (m.p50 as f64 - d.p50 as f64) / 2.0),
                ),
                _ => ("1.00".to_owned(), "-".to_owned()),
            };
            let cpu = if i > 0 {
                format!(
                    "{:.3}",
                    m.cpu_ticks as f64 / 100.0 / (m.requests as f64 / 10_000.0).max(1e-9)
                )
            } else {
                "-".to_owned()
            };
            println!(
                "{:<12} {:>5} {:>9.0} {:>8} {:>8} {:>9} {:>9} {:>12} {:>14} {:>7}",
                s.name, c, m.rps, m.p50, m.p99, m.p999, ratio, added, cpu, m.errors
            );
        }
    }
}

/// Each mTLS pair beside its plaintext pair from the same rounds: throughput as a ratio (the
/// median of the per-round ratios, and their range: the spread), p50, p99 and CPU per request.
fn print_mtls(
    systems: &[System],
    concurrency: &[usize],
    results: &BTreeMap<(usize, usize), Vec<Run>>,
) {
    let index = |name: &str| systems.iter().position(|s| s.name == name);
    let pairs: Vec<(usize, usize)> = [("agent-reach", "ar-mtls"), ("envoy", "envoy-mtls")]
        .into_iter()
        .filter_map(|(plain, mtls)| Some((index(plain)?, index(mtls)?)))
        .collect();
    if pairs.is_empty() {
        return;
    }
    println!(
        "\nmutual TLS between the two proxies (TLS 1.3, client certificates verified; connections pooled), against the same pair in plaintext, same rounds:\n"
    );
    println!(
        "{:<12} {:>5} {:>10} {:>13} {:>15} {:>15} {:>24}",
        "system", "conns", "req/s ×", "rounds", "p50 µs", "p99 µs", "CPU s/10k req (×)"
    );
    for &c in concurrency {
        for &(plain, mtls) in &pairs {
            let (Some(p), Some(m)) = (results.get(&(c, plain)), results.get(&(c, mtls))) else {
                continue;
            };
            let mut ratios: Vec<f64> = p
                .iter()
                .zip(m)
                .map(|(p, m)| m.rps / p.rps.max(1.0))
                .collect();
            ratios.sort_by(f64::total_cmp);
            let (pm, mm) = (median(p), median(m));
            let cpu =
                |r: &Run| r.cpu_ticks as f64 / 100.0 / (r.requests as f64 / 10_000.0).max(1e-9);
            println!(
                "{:<12} {:>5} {:>10.3} {:>13} {:>15} {:>15} {:>24}",
                systems[mtls].name,
                c,
                ratios[ratios.len() / 2],
                format!("{:.2}–{:.2}", ratios[0], ratios[ratios.len() - 1]),
                format!("{} → {}", pm.p50, mm.p50),
                format!("{} → {}", pm.p99, mm.p99),
                format!(
                    "{:.3} → {:.3} ({:.2})",
                    cpu(&pm),
                    cpu(&mm),
                    cpu(&mm) / cpu(&pm).max(1e-9)
                ),
            );
        }
    }
    println!(
        "(req/s ×: mTLS ÷ plaintext; rounds: its lowest and highest round; a → b: plaintext → mTLS)"
    );
}

/// Handshakes: the agent-reach pairs with a caller that keeps no idle connection, plaintext and
/// mTLS interleaved, then the in-memory loop. `false` when a pair could not start.
#[allow(clippy::too_many_arguments)]
fn handshakes(
    binary: &Path,
    upstream: SocketAddr,
    dir: &Path,
    pki: &Pki,
    wrk: &Path,
    script: &Path,
    conns: usize,
    runs: usize,
    seconds: u64,
) -> bool {
    let mut systems = Vec::new();
    for name in ["ar-nopool", "ar-mtls-nopool"] {
        match System::pair(name, binary, upstream, dir, Some(pki)) {
            Ok(system) => systems.push(system),
            Err(err) => {
                println!("{name}: cannot start: {err}");
                return false;
            }
        }
    }
    let mut results: Vec<Vec<Run>> = vec![Vec::new(); systems.len()];
    for _ in 0..runs {
        for (i, system) in systems.iter().enumerate() {
            let cpu_before = system.cpu_ticks();
            if let Some(run) = wrk_run(wrk, script, system.port, "/", conns, seconds) {
                let cpu = system.cpu_ticks().saturating_sub(cpu_before);
                results[i].push(Run {
                    cpu_ticks: cpu,
                    ..run
                });
            }
        }
    }
    println!(
        "\nconnections not reused: the caller's policy says pool.max_idle_per_host: 0, so every request opens (and closes) a caller → callee connection:\n"
    );
    println!(
        "{:<15} {:>5} {:>9} {:>8} {:>8} {:>14} {:>7}",
        "system", "conns", "req/s", "p50 µs", "p99 µs", "CPU s/10k req", "errors"
    );
    let cpu_per_request = |r: &Run| r.cpu_ticks as f64 / 100.0 / (r.requests as f64).max(1.0);
    let mut medians = Vec::new();
    for (system, runs) in systems.iter().zip(&results) {
        if runs.is_empty() {
            continue;
        }
        let m = median(runs);
        println!(
            "{:<15} {:>5} {:>9.0} {:>8} {:>8} {:>14.3} {:>7}",
            system.name,
            conns,
            m.rps,
            m.p50,
            m.p99,
            cpu_per_request(&m) * 10_000.0,
            m.errors
        );
        medians.push(m);
    }
    if let [plain, mtls] = medians[..] {
        let spread: Vec<String> = results[1].iter().map(|r| format!("{:.0}", r.rps)).collect();
        println!(
            "mTLS handshakes through the pair: {:.0}/s, one per request (rounds: {}); each costs {:.0} µs of CPU more than the plaintext pair's connect, both sidecars together.\n\
             These are resumed handshakes: rustls resumes by default (the caller keeps the callee's session tickets).",
            mtls.rps,
            spread.join(", "),
            (cpu_per_request(&mtls) - cpu_per_request(&plain)) * 1e6
        );
    }
    if let Some(series) = systems[1]
        .callee_admin
        .and_then(|port| metric_series(port, "reach_tls_handshake_failures_total"))
    {
        println!(
            "handshake failures the callee counted: {}",
            if series.is_empty() {
                "none".to_owned()
            } else {
                series.join(", ")
            }
        );
    }
    drop(systems);
    // What a full handshake costs against a resumed one: in memory, the same configs.
    let duration = Duration::from_millis(if runs > 1 { 2000 } else { 300 });
    for (label, resume) in [("full", false), ("resumed", true)] {
        match handshake_loop(pki, resume, duration) {
            Ok(h) => println!(
                "in-memory handshake loop, {label:<7}: {:>6.0}/s on one thread doing both ends ({:.0} µs each; {:.0}% resumed)",
                h.per_second,
                1e6 / h.per_second.max(1e-9),
                h.resumed * 100.0
            ),
            Err(err) => {
                println!("in-memory handshake loop, {label}: {err}");
                return false;
            }
        }
    }
    true
}

/// A metric's series with a non-zero value on an agent-reach admin port's `/metrics`, as
/// `labels value`.
fn metric_series(admin: u16, name: &str) -> Option<Vec<String>> {
    let mut stream = TcpStream::connect(("127.0.0.1", admin)).ok()?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut stream, &mut text).ok()?;
    Some(
        text.lines()
            .filter_map(|l| l.strip_prefix(name))
            .filter(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) != Some(0.0))
            .map(str::to_owned)
            .collect(),
    )
}

/// A system under test: where wrk sends load, and the proxy processes behind it.
struct System {
    name: &'static str,
    port: u16,
    children: Vec<Child>,
    /// The back agent-reach sidecar's admin port (its `/metrics`).
    callee_admin: Option<u16>,
}

impl System {
    fn direct(upstream: SocketAddr) -> Self {
        Self {
            name: "direct",
            port: upstream.port(),
            children: Vec::new(),
            callee_admin: None,
        }
    }

    /// Front proxy → back proxy → upstream; the `-mtls` systems with the hop between them over
    /// mutual TLS, from `pki`'s certificates. A pair that does not start is tried once more on
    /// other ports: `free_port` hands out a port another process may take before ours binds it.
    fn pair(
        name: &'static str,
        binary: &Path,
        upstream: SocketAddr,
        dir: &Path,
        pki: Option<&Pki>,
    ) -> Result<Self, String> {
        Self::start(name, binary, upstream, dir, pki).or_else(|err| {
            println!("{name}: did not start, trying other ports: {err}");
            Self::start(name, binary, upstream, dir, pki)
        })
    }

    fn start(
        name: &'static str,
        binary: &Path,
        upstream: SocketAddr,
        dir: &Path,
        pki: Option<&Pki>,
    ) -> Result<Self, String> {
        let (front, back) = (free_port()?, free_port()?);
        let mut callee_admin = None;
        let children = match name {
            "agent-reach" | "ar-compare" | "ar-mtls" | "ar-nopool" | "ar-mtls-nopool" => {
                let mtls = match name.contains("mtls") {
                    true => Some(pki.ok_or("no certificates")?),
                    false => None,
                };
                let (children, admin) = agent_reach_pair(
                    name,
                    binary,
                    upstream,
                    dir,
                    (front, back),
                    mtls,
                    !name.ends_with("nopool"),
                )?;
                callee_admin = Some(admin);
                children
            }
            "nginx" => {
                let conf = |tag: &str, listen: u16, to: SocketAddr| -> Result<PathBuf, String> {
                    let prefix = dir.join(format!("nginx-{tag}"));
                    std::fs::create_dir_all(prefix.join("logs")).map_err(|e| e.to_string())?;
                    write(&prefix, "nginx.conf", &format!(
                        "worker_processes 1;\ndaemon off;\npid {p}/nginx.pid;\nerror_log {p}/logs/error.log error;\n\
                         events {{ worker_connections 4096; }}\n\
                         http {{\n  access_log off;\n  client_body_temp_path {p}/body;\n  proxy_temp_path {p}/proxy;\n\
                         \x20 upstream up {{ server {to}; keepalive 256; }}\n\
                         \x20 server {{\n    listen 127.0.0.1:{listen};\n    client_max_body_size 1m;\n\
                         \x20   location / {{ proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off; proxy_request_buffering off; }}\n  }}\n}}\n",
                        p = prefix.display()))
                };
                let spawn = |cfg: PathBuf| {
                    let prefix = cfg.parent().map(Path::to_path_buf).unwrap_or_default();
                    Command::new(binary)
                        .arg("-p")
                        .arg(&prefix)
                        .arg("-c")
                        .arg(&cfg)
                        .arg("-e")
                        .arg(prefix.join("logs/error.log"))
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .map_err(|e| e.to_string())
                };
                let back_addr = SocketAddr::from(([127, 0, 0, 1], back));
                vec![
                    spawn(conf("back", back, upstream)?)?,
                    spawn(conf("front", front, back_addr)?)?,
                ]
            }
            "haproxy" => {
                let conf = |tag: &str, listen: u16, to: SocketAddr| {
                    write(dir, &format!("haproxy-{tag}.cfg"), &format!(
                        "global\n  nbthread 1\n  maxconn 4096\n\
                         defaults\n  mode http\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n  option http-keep-alive\n\
                         frontend f\n  bind 127.0.0.1:{listen}\n  default_backend b\n\
                         backend b\n  http-reuse always\n  server s1 {to}\n"))
                };
                let spawn = |cfg: PathBuf| bench::spawn_quiet(bench::haproxy(binary, &cfg));
                let back_addr = SocketAddr::from(([127, 0, 0, 1], back));
                vec![
                    spawn(conf("back", back, upstream)?)?,
                    spawn(conf("front", front, back_addr)?)?,
                ]
            }
            "envoy" | "envoy-mtls" => {
                // With mTLS the back's listener requires a client certificate and the front's
                // cluster presents one and accepts only the back's SPIFFE ID.
                let mtls = match name == "envoy-mtls" {
                    true => Some(pki.ok_or("no certificates")?),
                    false => None,
                };
                let conf = |tag: &str,
                            listen: u16,
                            to: SocketAddr,
                            downstream: String,
                            upstream: String| {
                    write(
                        dir,
                        &format!("{name}-{tag}.yaml"),
                        &format!(
                            r#"
static_resources:
  listeners:
  - address: {{ socket_address: {{ address: 127.0.0.1, port_value: {listen} }} }}
    filter_chains:
    - {downstream}filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: bench
          route_config:
            virtual_hosts: [ {{ name: all, domains: ["*"], routes: [ {{ match: {{ prefix: "/" }}, route: {{ cluster: up, timeout: 0s }} }} ] }} ]
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {{ "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }}
  clusters:
  - name: up
    type: STATIC
    connect_timeout: 1s
    {upstream}load_assignment:
      cluster_name: up
      endpoints: [ {{ lb_endpoints: [ {{ endpoint: {{ address: {{ socket_address: {{ address: {ip}, port_value: {port} }} }} }} }} ] }} ]
"#,
                            ip = to.ip(),
                            port = to.port()
                        ),
                    )
                };
                let (downstream, upstream_tls) = match mtls {
                    Some(pki) => (
                        format!(
                            "transport_socket: {}\n      ",
                            envoy_tls(
                                &pki.callee,
                                "DownstreamTlsContext",
                                "require_client_certificate: true, ",
                                None
                            )
                        ),
                        format!(
                            "transport_socket: {}\n    ",
                            envoy_tls(&pki.caller, "UpstreamTlsContext", "", Some(&pki.callee_id))
                        ),
                    ),
                    None => (String::new(), String::new()),
                };
                let spawn = |cfg: PathBuf, base_id: u16| {
                    bench::spawn_quiet(bench::envoy(binary, &cfg, base_id))
                };
                let back_addr = SocketAddr::from(([127, 0, 0, 1], back));
                vec![
                    spawn(
                        conf("back", back, upstream, downstream, String::new())?,
                        back,
                    )?,
                    spawn(
                        conf("front", front, back_addr, String::new(), upstream_tls)?,
                        front,
                    )?,
                ]
            }
            other => return Err(format!("unknown system {other}")),
        };
        let mut system = Self {
            name,
            port: front,
            children,
            callee_admin,
        };
        // Ready when the front answers a request end to end.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !answers(front) {
            if Instant::now() > deadline {
                system.stop();
                let logs: String = ["back", "front"]
                    .iter()
                    .filter_map(|tag| {
                        let text =
                            std::fs::read_to_string(dir.join(format!("{name}-{tag}.log"))).ok()?;
                        Some(format!("\n  {tag}: {}", text.trim()))
                    })
                    .collect();
                return Err(format!("did not answer within 20 s{logs}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(system)
    }

    /// Each proxy's processes (nginx: master and worker), front first.
    fn pids(&self) -> Vec<Vec<u32>> {
        let mut pids: Vec<Vec<u32>> = self
            .children
            .iter()
            .map(|c| {
                let mut tree = vec![c.id()];
                tree.extend(children_of(c.id()));
                tree
            })
            .collect();
        pids.reverse();
        pids
    }

    /// User + system CPU ticks of every proxy process so far.
    fn cpu_ticks(&self) -> u64 {
        self.pids()
            .iter()
            .flatten()
            .filter_map(|pid| stat_fields(*pid))
            .filter_map(|f| Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?))
            .sum()
    }

    fn stop(&mut self) {
        for mut child in self.children.drain(..) {
            // SIGTERM first: an nginx master killed outright leaves its workers running.
            let _ = std::process::Command::new("sh")
                .args(["-c", &format!("kill -TERM {}", child.id())])
                .status();
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for System {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An agent-reach pair: the front (caller) sidecar routes capability `bench` to the back
/// (callee) sidecar, a static peer, whose agent is the upstream. With `mtls`, both name their
/// certificate files, both policies say `mtls.mode: strict`, and the peer carries the callee's
/// SPIFFE ID; without `pooled`, the caller keeps no idle connection to the callee. Returns the
/// processes (back first) and the back's admin port.
fn agent_reach_pair(
    name: &str,
    binary: &Path,
    upstream: SocketAddr,
    dir: &Path,
    (front, back): (u16, u16),
    mtls: Option<&Pki>,
    pooled: bool,
) -> Result<(Vec<Child>, u16), String> {
    let tls = |files: &agent_reach::config::TlsFiles| {
        format!(
            "tls: {{ cert: {}, key: {}, ca: {} }}\n",
            files.cert.display(),
            files.key.display(),
            files.ca.display()
        )
    };
    let back_admin = free_port()?;
    let back_cfg = write(dir, &format!("{name}-back.yaml"), &format!(
        "listen: {{ outbound: 127.0.0.1:{}, inbound: 127.0.0.1:{back}, admin: 127.0.0.1:{back_admin} }}\n\
         agent: {{ name: back, address: {upstream}, max_concurrency: 4096, queue: {{ capacity: 4096 }},\n  \
         capabilities: [ {{ name: bench }} ] }}\n{}",
        free_port()?, mtls.map(|p| tls(&p.callee)).unwrap_or_default()))?;
    let identity = mtls
        .map(|p| format!(", identity: \"{}\"", p.callee_id))
        .unwrap_or_default();
    let front_cfg = write(dir, &format!("{name}-front.yaml"), &format!(
        "listen: {{ outbound: 127.0.0.1:{front}, inbound: 127.0.0.1:{}, admin: 127.0.0.1:{} }}\n\
         agent: {{ name: front, address: 127.0.0.1:9, max_concurrency: 1 }}\n\
         peers: [ {{ name: back, address: 127.0.0.1:{back}, capabilities: [bench]{identity} }} ]\n{}",
        free_port()?, free_port()?, mtls.map(|p| tls(&p.caller)).unwrap_or_default()))?;
    let strict = if mtls.is_some() {
        "mtls: { mode: strict }\n"
    } else {
        ""
    };
    let back_policy = write(dir, &format!("{name}-back-policy.yaml"), strict)?;
    let front_policy = write(
        dir,
        &format!("{name}-front-policy.yaml"),
        &format!(
            "{strict}{}",
            if pooled {
                ""
            } else {
                "pool: { max_idle_per_host: 0 }\n"
            }
        ),
    )?;
    // Errors go to `<name>-<tag>.log` in `dir`, shown when the pair does not start.
    let run = |cfg: &Path, policy: &Path| {
        let log = std::fs::File::create(cfg.with_extension("log")).map_err(|e| e.to_string())?;
        Command::new(binary)
            .args(["run", "--worker-threads", "1", "--log", "error", "--config"])
            .arg(cfg)
            .arg("--policy")
            .arg(policy)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| e.to_string())
    };
    let back_child = run(&back_cfg, &back_policy)?;
    Ok((
        vec![back_child, run(&front_cfg, &front_policy)?],
        back_admin,
    ))
}

/// An Envoy `transport_socket` (flow YAML) presenting `files`' certificate and verifying the
/// peer's against its CA, TLS 1.3 only; `san`: the URI SAN the peer must carry.
fn envoy_tls(
    files: &agent_reach::config::TlsFiles,
    context: &str,
    extra: &str,
    san: Option<&str>,
) -> String {
    let san = san
        .map(|id| {
            format!(", match_typed_subject_alt_names: [ {{ san_type: URI, matcher: {{ exact: \"{id}\" }} }} ]")
        })
        .unwrap_or_default();
    format!(
        "{{ name: envoy.transport_sockets.tls, typed_config: {{ \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.{context}, {extra}\
         common_tls_context: {{ tls_params: {{ tls_minimum_protocol_version: TLSv1_3, tls_maximum_protocol_version: TLSv1_3 }}, \
         tls_certificates: [ {{ certificate_chain: {{ filename: \"{}\" }}, private_key: {{ filename: \"{}\" }} }} ], \
         validation_context: {{ trusted_ca: {{ filename: \"{}\" }}{san} }} }} }} }}",
        files.cert.display(),
        files.key.display(),
        files.ca.display()
    )
}

/// The fields of `/proc/<pid>/stat` after the command name.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    Some(after.split_whitespace().map(str::to_owned).collect())
}

fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            stat_fields(*pid)
                .and_then(|f| f.get(1)?.parse::<u32>().ok())
                .is_some_and(|ppid| ppid == parent)
        })
        .collect()
}

fn answers(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request =
        "GET / HTTP/1.1\r\nHost: bench\r\nreach-capability: bench\r\nConnection: close\r\n\r\n";
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut buf = [0u8; 12];
    std::io::Read::read_exact(&mut stream, &mut buf).is_ok() && buf.starts_with(b"HTTP/1.1 200")
}

fn idle_rss(binary: &Path, upstream: SocketAddr, dir: &Path) -> Option<f64> {
    let cfg = write(
        dir,
        "idle.yaml",
        &format!(
            "listen: {{ outbound: 127.0.0.1:0, inbound: 127.0.0.1:0, admin: 127.0.0.1:0 }}\n\
         agent: {{ name: idle, address: {upstream}, max_concurrency: 4 }}\n"
        ),
    )
    .ok()?;
    let mut child = Command::new(binary)
        .args(["run", "--log", "error", "--config"])
        .arg(cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    std::thread::sleep(Duration::from_secs(2));
    let rss = kib(child.id(), "VmRSS:") / 1024.0;
    let _ = child.kill();
    let _ = child.wait();
    Some(rss)
}

/// The upstream: fast, never the bottleneck — a small fixed body, a 64 KiB POST read whole, and
/// a 10-event SSE stream. Its own runtime on one thread.
fn start_upstream() -> SocketAddr {
    let listener = match std::net::TcpListener::bind("127.0.0.1:0") {
        Ok(l) => l,
        Err(err) => panic!("cannot bind the upstream: {err}"),
    };
    let addr = listener
        .local_addr()
        .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)));
    let _ = listener.set_nonblocking(true);
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        |req: hyper::Request<hyper::body::Incoming>| async move {
                            let sse = req.uri().path() == "/sse";
                            let _ = req.into_body().collect().await;
                            let response = if sse {
                                let (mut tx, body) =
                                    Channel::<Bytes, std::convert::Infallible>::new(16);
                                tokio::spawn(async move {
                                    for i in 0..10 {
                                        if tx
                                            .send_data(Bytes::from(format!("data: event {i}\n\n")))
                                            .await
                                            .is_err()
                                        {
                                            return;
                                        }
                                    }
                                });
                                hyper::Response::builder()
                                    .header("content-type", "text/event-stream")
                                    .body(body.boxed())
                            } else {
                                hyper::Response::builder()
                                    .header("content-type", "text/plain")
                                    .body(
                                        Full::new(Bytes::from_static(&[b'x'; 128]))
                                            .map_err(|never| match never {})
                                            .boxed(),
                                    )
                            };
                            Ok::<_, std::convert::Infallible>(response.unwrap_or_default())
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
    });
    addr
}
