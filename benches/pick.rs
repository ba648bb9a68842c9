//! The routing decision alone: score every candidate (this caller's view joined with the peer's
//! own) and choose one by power of two choices, among 10, 100, 1,000 and 5,000 candidates.
//! Goal: ≤ 2 µs at 5,000. Run: `cargo bench --bench pick` (CI: `-- --sample-count 3`).

use std::net::SocketAddr;
use std::sync::Arc;

use agent_reach::config::{ConfigPaths, ConfigStore, Policy};
use agent_reach::metrics::Metrics;
use agent_reach::outbound::{pick, score_candidates};
use agent_reach::peers::{PeerViews, RouteRequest};
use agent_reach::registry::Registry;
use agent_reach::Bootstrap;

fn main() {
    divan::main();
}

struct Fleet {
    store: Arc<ConfigStore>,
    views: PeerViews,
    registry: Registry,
    request: RouteRequest,
}

fn fleet(n: usize) -> Fleet {
    let mut bootstrap = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
        .unwrap_or_else(|e| panic!("{e}"));
    for i in 0..n {
        let addr = SocketAddr::from(([10, 0, (i / 250) as u8, (i % 250) as u8 + 1], 4143));
        bootstrap = bootstrap
            .with_peer(&format!("agent-{i}"), addr, &["code-review"])
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let store = Arc::new(ConfigStore::new(
        bootstrap,
        Policy::default(),
        ConfigPaths::default(),
    ));
    let views = PeerViews::new(store.clone(), Arc::new(Metrics::new("bench")));
    Fleet {
        store,
        views,
        registry: Registry::new(),
        request: RouteRequest {
            capability: "code-review".to_owned(),
            ..RouteRequest::default()
        },
    }
}

#[divan::bench(args = [10, 100, 1000, 5000])]
fn score_and_pick(bencher: divan::Bencher, n: usize) {
    let f = fleet(n);
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    bencher.bench_local(|| {
        let snapshot = f.store.snapshot();
        // xorshift: the pick's randomness without a syscall per call
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let scored = score_candidates(&f.registry, &f.views, &snapshot, &f.request, |n| {
            (next() % n as u64) as usize
        });
        pick(&scored, &[], || (next() >> 11) as f64 / (1u64 << 53) as f64)
    });
}
