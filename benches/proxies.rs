//! What a hop costs, side by side: a load generator (wrk) → a pair of proxies → a minimal hyper
//! upstream, for agent-reach, Envoy, nginx and HAProxy, against direct to the upstream. One
//! process per proxy, one worker thread each, on the same machine in one run, interleaved round
//! by round so noise hits every system alike; medians over rounds. Never asserts on time.
//!
//! Run: `cargo bench --bench proxies` (or `-- --smoke`, `-- --runs 5 --seconds 5`). Missing tools
//! are installed by `benches/tools.sh` when possible, else reported and skipped.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;

#[path = "common/mod.rs"]
mod common;
use common::{free_port, kib, write, Tools};
use http_body_util::channel::Channel;
use http_body_util::{BodyExt, Full};

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
    let mut systems: Vec<System> = vec![System::direct(upstream)];
    // BENCH_COMPARE=/path/to/agent-reach adds that build as a second system ("ar-compare"),
    // interleaved with the others round by round: before/after in one run.
    let compare = std::env::var_os("BENCH_COMPARE").map(PathBuf::from);
    for (name, found) in [
        ("agent-reach", Some(tools.agent_reach.clone())),
        ("ar-compare", compare),
        ("envoy", tools.envoy.clone()),
        ("nginx", tools.nginx.clone()),
        ("haproxy", tools.haproxy.clone()),
    ] {
        let Some(binary) = found else {
            println!("{name}: not found, skipped (benches/tools.sh installs it)");
            continue;
        };
        match System::pair(name, &binary, upstream, &dir) {
            Ok(system) => systems.push(system),
            Err(err) => {
                println!("{name}: cannot start: {err}");
                // The smoke run (CI) exists to catch exactly this for our own proxy.
                if smoke && name == "agent-reach" {
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

    // Bodies and streams: agent-reach against direct only.
    let mut extra: BTreeMap<(&str, usize), Vec<Run>> = BTreeMap::new();
    let reach = systems.iter().position(|s| s.name == "agent-reach");
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
    println!(
        "\nreproduce: cargo bench --bench proxies{}",
        if smoke { " -- --smoke" } else { "" }
    );
    drop(systems);
    let _ = std::fs::remove_dir_all(&dir);
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

/// A system under test: where wrk sends load, and the proxy processes behind it.
struct System {
    name: &'static str,
    port: u16,
    children: Vec<Child>,
}

impl System {
    fn direct(upstream: SocketAddr) -> Self {
        Self {
            name: "direct",
            port: upstream.port(),
            children: Vec::new(),
        }
    }

    /// Front proxy → back proxy → upstream.
    fn pair(
        name: &'static str,
        binary: &Path,
        upstream: SocketAddr,
        dir: &Path,
    ) -> Result<Self, String> {
        let (front, back) = (free_port()?, free_port()?);
        let children = match name {
            "agent-reach" | "ar-compare" => {
                let back_cfg = write(dir, &format!("{name}-back.yaml"), &format!(
                    "listen: {{ outbound: 127.0.0.1:{}, inbound: 127.0.0.1:{back}, admin: 127.0.0.1:{} }}\n\
                     agent: {{ name: back, address: {upstream}, max_concurrency: 4096, queue: {{ capacity: 4096 }},\n  \
                     capabilities: [ {{ name: bench }} ] }}\n",
                    free_port()?, free_port()?))?;
                let front_cfg = write(dir, &format!("{name}-front.yaml"), &format!(
                    "listen: {{ outbound: 127.0.0.1:{front}, inbound: 127.0.0.1:{}, admin: 127.0.0.1:{} }}\n\
                     agent: {{ name: front, address: 127.0.0.1:9, max_concurrency: 1 }}\n\
                     peers: [ {{ name: back, address: 127.0.0.1:{back}, capabilities: [bench] }} ]\n",
                    free_port()?, free_port()?))?;
                let run = |cfg: &Path| {
                    Command::new(binary)
                        .args(["run", "--worker-threads", "1", "--log", "error", "--config"])
                        .arg(cfg)
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .map_err(|e| e.to_string())
                };
                vec![run(&back_cfg)?, run(&front_cfg)?]
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
                let spawn = |cfg: PathBuf| common::spawn_quiet(common::haproxy(binary, &cfg));
                let back_addr = SocketAddr::from(([127, 0, 0, 1], back));
                vec![
                    spawn(conf("back", back, upstream)?)?,
                    spawn(conf("front", front, back_addr)?)?,
                ]
            }
            "envoy" => {
                let conf = |tag: &str, listen: u16, to: SocketAddr| {
                    write(
                        dir,
                        &format!("envoy-{tag}.yaml"),
                        &format!(
                            r#"
static_resources:
  listeners:
  - address: {{ socket_address: {{ address: 127.0.0.1, port_value: {listen} }} }}
    filter_chains:
    - filters:
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
    load_assignment:
      cluster_name: up
      endpoints: [ {{ lb_endpoints: [ {{ endpoint: {{ address: {{ socket_address: {{ address: {ip}, port_value: {port} }} }} }} }} ] }} ]
"#,
                            ip = to.ip(),
                            port = to.port()
                        ),
                    )
                };
                let spawn = |cfg: PathBuf, base_id: u16| {
                    common::spawn_quiet(common::envoy(binary, &cfg, base_id))
                };
                let back_addr = SocketAddr::from(([127, 0, 0, 1], back));
                vec![
                    spawn(conf("back", back, upstream)?, back)?,
                    spawn(conf("front", front, back_addr)?, front)?,
                ]
            }
            other => return Err(format!("unknown system {other}")),
        };
        let mut system = Self {
            name,
            port: front,
            children,
        };
        // Ready when the front answers a request end to end.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !answers(front) {
            if Instant::now() > deadline {
                system.stop();
                return Err("did not answer within 20 s".to_owned());
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
        for child in &mut self.children {
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
