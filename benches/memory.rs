//! Memory of one sidecar under keyed traffic: `cargo bench --bench memory [-- --keys N]`.
//! Runs the real binary (`agent-reach run`) in front of an upstream that answers every request
//! with 256 KiB, sends N requests with unique `idempotency-key`s from four callers (source
//! addresses 127.0.0.2–5, so four scopes), and prints the sidecar's RSS before, after and at
//! peak against the idempotency byte budget. Every stored response must stay within
//! `idempotency.max_total_bytes`, whatever N is: `--budget-mib M` sets it (default 32, the
//! shipped default).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use bench::{free_port, kib, terminate, write};
use testkit::bench;

const RESPONSE_BYTES: usize = 256 * 1024;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke");
    let keys = args
        .iter()
        .position(|a| a == "--keys")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(if smoke { 400 } else { 10_000 });
    let budget_mib: usize = args
        .iter()
        .position(|a| a == "--budget-mib")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(32);
    let dir = std::env::temp_dir().join(format!("agent-reach-memory-{}", std::process::id()));
    if let Err(err) = std::fs::create_dir_all(&dir) {
        eprintln!("cannot create {}: {err}", dir.display());
        return;
    }
    let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    else {
        eprintln!("cannot start a runtime");
        return;
    };
    // BENCH_BINARY: run another build, or the binary under a profiler (`valgrind --tool=massif`
    // in a wrapper script).
    let binary = std::env::var_os("BENCH_BINARY")
        .map_or(PathBuf::from(env!("CARGO_BIN_EXE_agent-reach")), Into::into);
    runtime.block_on(run(&binary, &dir, keys, budget_mib));
    let _ = std::fs::remove_dir_all(&dir);
}

async fn run(binary: &Path, dir: &Path, keys: usize, budget_mib: usize) {
    let upstream = start_upstream().await;
    // A port found free can be taken before the sidecar binds it: try a few.
    let started = (0..3).find_map(|_| start_sidecar(binary, dir, upstream, budget_mib));
    let Some((mut sidecar, inbound)) = started else {
        let log = std::fs::read_to_string(dir.join("sidecar.log")).unwrap_or_default();
        eprintln!("the sidecar did not start: {log}");
        return;
    };
    let pid = sidecar.id();
    let before = kib(pid, "VmRSS:");
    let started = Instant::now();
    let mut failed = 0;
    let per_caller = keys.div_ceil(4);
    let callers = (2..=5u8).map(|last| {
        tokio::spawn(async move {
            let mut failed = 0;
            for i in 0..per_caller {
                let key = format!("caller{last}-key{i}");
                if !keyed_post(inbound, [127, 0, 0, last], &key).await {
                    failed += 1;
                }
            }
            failed
        })
    });
    for caller in callers.collect::<Vec<_>>() {
        failed += caller.await.unwrap_or(per_caller);
    }
    let elapsed = started.elapsed();
    let (after, peak) = (kib(pid, "VmRSS:"), kib(pid, "VmHWM:"));
    stop(&mut sidecar);
    let mib = |k: f64| k / 1024.0;
    println!(
        "\nagent-reach memory under keyed traffic: {} keys × {} KiB responses from 4 callers \
         in {:.1} s ({failed} failed)",
        per_caller * 4,
        RESPONSE_BYTES / 1024,
        elapsed.as_secs_f64()
    );
    println!(
        "  idempotency budget {budget_mib} MiB (max_total_bytes), {:.0} MiB of responses sent",
        (per_caller * 4 * RESPONSE_BYTES) as f64 / f64::from(1 << 20)
    );
    println!(
        "  sidecar RSS: before {:.1} MiB, after {:.1} MiB, peak {:.1} MiB",
        mib(before),
        mib(after),
        mib(peak)
    );
    println!("  reproduce: cargo bench --bench memory -- --keys {keys} --budget-mib {budget_mib}");
}

/// One keyed POST to the sidecar's inbound port from `source`; true on a 200 read whole.
async fn keyed_post(inbound: SocketAddr, source: [u8; 4], key: &str) -> bool {
    let Ok(socket) = tokio::net::TcpSocket::new_v4() else {
        return false;
    };
    if socket.bind(SocketAddr::from((source, 0))).is_err() {
        return false;
    }
    let Ok(stream) = socket.connect(inbound).await else {
        return false;
    };
    let io = hyper_util::rt::TokioIo::new(stream);
    let Ok((mut sender, conn)) = hyper::client::conn::http1::handshake(io).await else {
        return false;
    };
    tokio::spawn(conn);
    let Ok(request) = hyper::Request::post("/work")
        .header("host", "sidecar")
        .header("reach-capability", "work")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"task")))
    else {
        return false;
    };
    let Ok(response) = sender.send_request(request).await else {
        return false;
    };
    let ok = response.status() == 200;
    ok && response.into_body().collect().await.is_ok()
}

fn start_sidecar(
    binary: &Path,
    dir: &Path,
    upstream: SocketAddr,
    budget_mib: usize,
) -> Option<(Child, SocketAddr)> {
    let (inbound, outbound, admin) = (free_port().ok()?, free_port().ok()?, free_port().ok()?);
    let cfg = write(
        dir,
        "memory.yaml",
        &format!(
            "listen: {{ outbound: 127.0.0.1:{outbound}, inbound: 127.0.0.1:{inbound}, admin: 127.0.0.1:{admin} }}\n\
             agent: {{ name: keeper, address: {upstream}, max_concurrency: 64, capabilities: [ {{ name: work }} ] }}\n"
        ),
    )
    .ok()?;
    let policy = write(
        dir,
        "memory-policy.yaml",
        &format!("idempotency: {{ max_total_bytes: {} }}\n", budget_mib << 20),
    )
    .ok()?;
    let mut command = Command::new(binary);
    let child = command
        .args(["run", "--log", "error", "--config"])
        .arg(cfg)
        .arg("--policy")
        .arg(policy)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("sidecar.log")).ok()?)
        .spawn()
        .ok()?;
    let addr = SocketAddr::from(([127, 0, 0, 1], inbound));
    let mut child = child;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return None;
        }
        if std::net::TcpStream::connect(addr).is_ok() {
            return Some((child, addr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    stop(&mut child);
    None
}

/// The sidecar drains its in-flight responses before it exits.
fn stop(child: &mut Child) {
    terminate(child, Duration::from_secs(40));
}

/// An upstream that answers everything with 256 KiB.
async fn start_upstream() -> SocketAddr {
    let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
        Ok(l) => l,
        Err(err) => panic!("cannot bind the upstream: {err}"),
    };
    let addr = listener
        .local_addr()
        .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)));
    let body = Bytes::from(vec![b'x'; RESPONSE_BYTES]);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let body = body.clone();
                        async move {
                            let _ = req.into_body().collect().await;
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(body)))
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}
