//! Hot reload through a Kubernetes-style `..data` symlink swap: a valid policy replaces the running
//! one; an invalid one is rejected, counted, and the old one keeps serving.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_reach::config::{self, ConfigPaths, Policy};
use agent_reach::{Bootstrap, Sidecar};
use support::*;
use testkit::MockConfig;

/// A directory laid out the way the kubelet mounts a ConfigMap.
struct ConfigMapDir {
    root: PathBuf,
    version: u32,
}

impl ConfigMapDir {
    fn new(tag: &str) -> Self {
        let root = std::env::temp_dir().join(format!("agent-reach-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        Self { root, version: 0 }
    }

    /// Writes files into a fresh timestamped dir and atomically repoints `..data` at it.
    fn publish(&mut self, files: &[(&str, &str)]) {
        self.version += 1;
        let dir_name = format!("..2026_11_30_00_00_0{}.{}", self.version, self.version);
        let dir = self.root.join(&dir_name);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
            let link = self.root.join(name);
            if link.symlink_metadata().is_err() {
                std::os::unix::fs::symlink(Path::new("..data").join(name), &link).unwrap();
            }
        }
        let tmp = self.root.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&dir_name, &tmp).unwrap();
        std::fs::rename(&tmp, self.root.join("..data")).unwrap();
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
}

impl Drop for ConfigMapDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A sidecar with `bootstrap` whose policy is `dir`'s `policy.yaml`, checked every 50 ms.
async fn watching_policy(mut bootstrap: Bootstrap, dir: &ConfigMapDir) -> Sidecar {
    bootstrap.watch_interval = config::HumanDuration::from_millis(50);
    let policy = config::load_policy(&dir.path("policy.yaml")).unwrap();
    let paths = ConfigPaths {
        bootstrap: None,
        policy: Some(dir.path("policy.yaml")),
    };
    sidecar_with(bootstrap, policy, paths).await
}

#[tokio::test]
async fn policy_symlink_swap_reloads_valid_and_rejects_invalid() {
    let agent = mock(MockConfig::new("coder-1")).await;
    let mut dir = ConfigMapDir::new("reload");
    dir.publish(&[("policy.yaml", "timeouts: { request: 7s }\n")]);
    let bootstrap = Bootstrap::local("coder-1", agent.addr, &[CAP]).unwrap();
    let sidecar = watching_policy(bootstrap, &dir).await;
    assert_eq!(
        sidecar.status().policy.timeouts.request.get(),
        Duration::from_secs(7)
    );

    // A valid new version is picked up.
    dir.publish(&[("policy.yaml", "timeouts: { request: 9s }\n")]);
    eventually(
        Duration::from_secs(10),
        "the new policy is live",
        || async { sidecar.status().policy.timeouts.request.get() == Duration::from_secs(9) },
    )
    .await;
    let generation = sidecar.status().config_generation;

    // An invalid one is rejected and counted; the running policy stays.
    dir.publish(&[("policy.yaml", "timeouts: { request: soon }\n")]);
    let admin = sidecar.addrs.admin;
    eventually(
        Duration::from_secs(10),
        "the rejection is counted",
        || async move {
            get(&client(), &format!("http://{admin}/metrics"))
                .await
                .body
                .contains("reach_config_reloads_total{file=\"policy\",result=\"error\"} 1")
        },
    )
    .await;
    let status = sidecar.status();
    assert_eq!(status.config_generation, generation);
    assert_eq!(status.policy.timeouts.request.get(), Duration::from_secs(9));

    // Still serving traffic.
    let reply = get(
        &client(),
        &format!("http://{}/review", sidecar.addrs.inbound),
    )
    .await;
    assert_eq!(reply.status, 200);

    // And a later valid version is taken again.
    dir.publish(&[("policy.yaml", "")]);
    eventually(
        Duration::from_secs(10),
        "an empty policy means defaults",
        || async { sidecar.status().policy == Policy::default() },
    )
    .await;
}

#[tokio::test]
async fn bootstrap_rewritten_in_place_updates_the_profile_and_peers() {
    let agent = mock(MockConfig::new("coder-1")).await;
    let peer = Pair::start(MockConfig::new("coder-2")).await;
    let dir = ConfigMapDir::new("bootstrap");
    let path = dir.path("agent-reach.yaml");
    let text = |peers: &str| {
        format!(
            "listen: {{ outbound: 127.0.0.1:0, inbound: 127.0.0.1:0, admin: 127.0.0.1:0 }}\nwatch_interval: 50ms\n\
             agent:\n  name: coder-1\n  address: {}\n  max_concurrency: 2\n  capabilities: [ {{ name: {CAP} }} ]\n{peers}",
            agent.addr
        )
    };
    std::fs::write(&path, text("")).unwrap();
    let bootstrap = config::load_bootstrap(&path).unwrap();
    let paths = ConfigPaths {
        bootstrap: Some(path.clone()),
        policy: None,
    };
    let sidecar = sidecar_with(bootstrap, Policy::default(), paths).await;
    let outbound = sidecar.addrs.outbound;
    assert_eq!(
        call(&client(), outbound).await.status,
        404,
        "no peer serves the capability yet"
    );

    let peers = format!(
        "peers:\n  - {{ name: coder-2, address: {}, capabilities: [{CAP}] }}\n",
        peer.callee.addrs.inbound
    );
    std::fs::write(&path, text(&peers)).unwrap();
    eventually(Duration::from_secs(10), "the new peer is known", || async {
        sidecar.status().peers.len() == 1
    })
    .await;
    let reply = call(&client(), outbound).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("reach-agent"), "coder-2");
    // The listener addresses stayed as bound.
    assert_eq!(sidecar.addrs.outbound, outbound);
}

#[tokio::test]
async fn a_nan_policy_is_refused_and_calls_keep_working() {
    let agent = mock(MockConfig::new("coder-2")).await;
    let callee = sidecar(Bootstrap::local("coder-2", agent.addr, &[CAP]).unwrap()).await;
    let mut dir = ConfigMapDir::new("reload-nan");
    dir.publish(&[("policy.yaml", "retry:\n  budget: { ratio: 0.5 }\n")]);
    let bootstrap = Bootstrap::local("caller", any_port(), &[])
        .unwrap()
        .with_peer("coder-2", callee.addrs.inbound, &[CAP])
        .unwrap();
    let caller = watching_policy(bootstrap, &dir).await;
    assert_eq!(call(&client(), caller.addrs.outbound).await.status, 200);
    let generation = caller.status().config_generation;

    // A NaN retry ratio once reloaded, and then every outbound call panicked in tower's budget.
    dir.publish(&[("policy.yaml", "retry:\n  budget: { ratio: .nan }\n")]);
    let admin = caller.addrs.admin;
    eventually(
        Duration::from_secs(10),
        "the NaN policy's rejection is counted",
        || async move {
            get(&client(), &format!("http://{admin}/metrics"))
                .await
                .body
                .contains("reach_config_reloads_total{file=\"policy\",result=\"error\"} 1")
        },
    )
    .await;
    let status = caller.status();
    assert_eq!(status.config_generation, generation);
    assert_eq!(status.policy.retry.budget.ratio, 0.5);
    let reply = call(&client(), caller.addrs.outbound).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("reach-agent"), "coder-2");
}

/// The `/status` document, over the admin listener as an operator reads it.
async fn status_json(admin: std::net::SocketAddr) -> serde_json::Value {
    get(&client(), &format!("http://{admin}/status"))
        .await
        .json()
}

#[tokio::test]
async fn a_restart_only_key_keeps_its_running_value_and_is_shown_pending() {
    let agent = mock(MockConfig::new("coder-1")).await;
    let mut dir = ConfigMapDir::new("reload-restart-only");
    let policy_text = |idle: u32, request: &str| {
        format!("pool: {{ max_idle_per_host: {idle} }}\ntimeouts: {{ request: {request} }}\n")
    };
    dir.publish(&[("policy.yaml", &policy_text(64, "7s"))]);
    let bootstrap = Bootstrap::local("coder-1", agent.addr, &[CAP]).unwrap();
    let sidecar = watching_policy(bootstrap, &dir).await;
    let admin = sidecar.addrs.admin;

    // One change: a restart-only key and a live one.
    dir.publish(&[("policy.yaml", &policy_text(3, "9s"))]);
    eventually(
        Duration::from_secs(10),
        "the reload is counted as needing a restart",
        || async move {
            let metrics = get(&client(), &format!("http://{admin}/metrics"))
                .await
                .body;
            counter(
                &metrics,
                "reach_config_reloads_total{file=\"policy\",result=\"restart_required\"}",
            ) == 1
        },
    )
    .await;
    let status = sidecar.status();
    assert_eq!(
        status.policy.timeouts.request.get(),
        Duration::from_secs(9),
        "the live key went live"
    );
    assert_eq!(
        status.policy.pool.max_idle_per_host, 64,
        "what runs is what /status shows"
    );
    let doc = status_json(admin).await;
    let pending = doc["pending_restart"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(pending.len(), 1, "{doc}");
    assert_eq!(pending[0]["key"], "pool.max_idle_per_host");
    assert_eq!(pending[0]["file"], "policy");
    assert!(pending[0]["since_unix_ms"].as_u64().unwrap_or(0) > 0);
    let metrics = get(&client(), &format!("http://{admin}/metrics"))
        .await
        .body;
    assert_eq!(
        counter(
            &metrics,
            "reach_config_reloads_total{file=\"policy\",result=\"ok\"}"
        ),
        0,
        "not counted as a plain success: {metrics}"
    );
    let page = get(&client(), &format!("http://{admin}/?format=html"))
        .await
        .body;
    assert!(page.contains("policy: pool.max_idle_per_host"), "{page}");

    // The file goes back to the running value: nothing is pending any more.
    dir.publish(&[("policy.yaml", &policy_text(64, "9s"))]);
    eventually(
        Duration::from_secs(10),
        "the pending list empties",
        || async move {
            status_json(admin).await["pending_restart"]
                .as_array()
                .is_some_and(Vec::is_empty)
        },
    )
    .await;
    assert!(sidecar.status().pending_restart.is_empty());
}

/// A listener whose accept queue is full: a connection to it is neither refused nor accepted,
/// so a connect waits out the connect timeout.
async fn a_listener_that_never_completes_a_connect(
) -> (tokio::net::TcpListener, Vec<tokio::net::TcpStream>) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(any_port()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut held = Vec::new();
    for _ in 0..16 {
        let attempt = tokio::time::timeout(
            Duration::from_millis(300),
            tokio::net::TcpStream::connect(addr),
        )
        .await;
        match attempt {
            Ok(Ok(stream)) => held.push(stream),
            // The queue is full: this one hung.
            Err(_) => return (listener, held),
            Ok(Err(err)) => panic!("{err}"),
        }
    }
    panic!("the accept queue never filled");
}

#[tokio::test]
async fn a_reloaded_connect_timeout_applies_to_the_next_connection() {
    let (blackhole, _held) = a_listener_that_never_completes_a_connect().await;
    let mut dir = ConfigMapDir::new("reload-connect");
    dir.publish(&[("policy.yaml", "timeouts: { connect: 20s, request: 4s }\n")]);
    let bootstrap = Bootstrap::local("coder-1", blackhole.local_addr().unwrap(), &[CAP]).unwrap();
    let sidecar = watching_policy(bootstrap, &dir).await;

    dir.publish(&[("policy.yaml", "timeouts: { connect: 200ms, request: 4s }\n")]);
    eventually(
        Duration::from_secs(10),
        "the new policy is live",
        || async { sidecar.status().policy.timeouts.connect.get() == Duration::from_millis(200) },
    )
    .await;
    assert!(sidecar.status().pending_restart.is_empty());

    // With the start-up 20 s the call would wait out its 4 s request timeout (504).
    let started = std::time::Instant::now();
    let reply = get(
        &client(),
        &format!("http://{}/review", sidecar.addrs.inbound),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(reply.status, 502, "{}", reply.body);
    assert!(
        took < Duration::from_secs(2),
        "gave up on the connect after {took:?}"
    );
}
