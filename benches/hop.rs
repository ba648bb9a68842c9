//! Per-hop cost, in-process: direct to a mock agent vs through a caller sidecar and a callee
//! sidecar. Run: `cargo bench --bench hop` (the full comparison with nginx/HAProxy/Envoy is a
//! separate benchmark). Prints medians and tails; never asserts on time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach::config::{ConfigPaths, ConfigStore, Policy};
use agent_reach::http::{body, client};
use agent_reach::{Bootstrap, Sidecar};
use http_body_util::BodyExt;
use testkit::{Latency, MockAgent, MockConfig};

/// Requests per row; `--smoke` (CI) sends a few hundred.
fn requests() -> usize {
    if std::env::args().any(|a| a == "--smoke") {
        500
    } else {
        20_000
    }
}
const CONCURRENCY: [usize; 2] = [1, 16];

fn main() {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("cannot start a runtime: {err}");
            return;
        }
    };
    runtime.block_on(run());
}

async fn start(bootstrap: Bootstrap) -> Option<Sidecar> {
    let store = Arc::new(ConfigStore::new(
        bootstrap,
        Policy::default(),
        ConfigPaths::default(),
    ));
    Sidecar::start(store).await.ok()
}

async fn run() {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut config = MockConfig::new("bench");
    config.latency = Latency::fixed(Duration::ZERO);
    let Ok(agent) = MockAgent::start(any, config).await else {
        return;
    };
    let Some(callee) =
        start(Bootstrap::local("bench", agent.addr, &["bench"]).unwrap_or_else(|e| panic!("{e}")))
            .await
    else {
        return;
    };
    let caller_bootstrap = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
        .and_then(|b| b.with_peer("bench", callee.addrs.inbound, &["bench"]))
        .unwrap_or_else(|e| panic!("{e}"));
    let Some(caller) = start(caller_bootstrap).await else {
        return;
    };

    println!(
        "agent-reach per-hop benchmark: {} requests per row, keep-alive, load generator in the same process",
        requests()
    );
    println!("reproduce: cargo bench --bench hop\n");
    println!(
        "{:<30} {:>5} {:>10} {:>9} {:>9} {:>9}",
        "path", "conc", "req/s", "p50 µs", "p99 µs", "p99.9 µs"
    );
    for concurrency in CONCURRENCY {
        let direct = measure(format!("http://{}/x", agent.addr), None, concurrency).await;
        let pair = measure(
            format!("http://{}/x", caller.addrs.outbound),
            Some("bench"),
            concurrency,
        )
        .await;
        print_row("direct to agent", concurrency, &direct);
        print_row("caller → callee sidecar pair", concurrency, &pair);
        let added = (pair.p50 - direct.p50) / 2.0;
        println!(
            "  added p50 per hop: {added:.0} µs; throughput ratio to direct: {:.2}\n",
            pair.rps / direct.rps
        );
    }
}

struct Figures {
    rps: f64,
    p50: f64,
    p99: f64,
    p999: f64,
}

async fn measure(url: String, capability: Option<&'static str>, concurrency: usize) -> Figures {
    let client = client::build(&Policy::default());
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let mut micros = Vec::with_capacity(requests() / concurrency);
                for _ in 0..requests() / concurrency {
                    let mut request = http::Request::get(&url);
                    if let Some(cap) = capability {
                        request = request.header("reach-capability", cap);
                    }
                    let Ok(request) = request.body(body::empty()) else {
                        continue;
                    };
                    let t = Instant::now();
                    if let Ok(response) = client.request(request).await {
                        let _ = response.into_body().collect().await;
                    }
                    micros.push(t.elapsed().as_secs_f64() * 1e6);
                }
                micros
            })
        })
        .collect();
    let mut all = Vec::with_capacity(requests());
    for w in workers {
        all.extend(w.await.unwrap_or_default());
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    let q = |p: f64| agent_reach::reach::percentile(&all, p);
    Figures {
        rps: all.len() as f64 / elapsed,
        p50: q(0.5),
        p99: q(0.99),
        p999: q(0.999),
    }
}

fn print_row(name: &str, concurrency: usize, f: &Figures) {
    println!(
        "{name:<30} {concurrency:>5} {:>10.0} {:>9.0} {:>9.0} {:>9.0}",
        f.rps, f.p50, f.p99, f.p999
    );
}
