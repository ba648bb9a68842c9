//! Inbound interception for real: a "pod" network namespace (agent, sidecar, `init-net`) and a
//! "client" namespace joined by a veth pair. A plain client in the client namespace calls the
//! agent's port; the sidecar answers for it (its `reach-agent` header) and counts the call as
//! intercepted, in plaintext under `strict` only because the policy makes that port
//! `permissive`, while a plaintext call to the inbound port itself, or through an unrelated
//! DNAT rule, is refused; without the port exception strict refuses intercepted plaintext too. Needs root and `ip netns` (CI runs as
//! root); skips with a message elsewhere.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const POD_IP: &str = "10.231.0.1";
const CLIENT_IP: &str = "10.231.0.2";
const POD_IP6: &str = "fd00:231::1";
const CLIENT_IP6: &str = "fd00:231::2";
const AGENT_PORT: u16 = 8080;
const INBOUND_PORT: u16 = 4143;
const ADMIN_PORT: u16 = 4191;

/// The two namespaces and the processes in them, all removed on drop.
struct Netns {
    pod: String,
    client: String,
    children: Vec<Child>,
    dir: PathBuf,
    /// The veth ends: the pod's and the client's.
    veth: (String, String),
}

impl Netns {
    /// `None` (after saying why) where namespaces cannot be made.
    fn create(tag: u32) -> Option<Self> {
        let uid = Command::new("id").arg("-u").output().ok()?;
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            crate::support::skip::skip(
                "tests/it/intercept.rs",
                "not root (network namespaces and iptables need it)",
                crate::support::skip::InCi::Fails,
            );
            return None;
        }
        let id = std::process::id();
        let ns = Self {
            pod: format!("ar-pod{tag}-{id}"),
            client: format!("ar-cli{tag}-{id}"),
            children: Vec::new(),
            dir: std::env::temp_dir().join(format!("ar-intercept{tag}-{id}")),
            veth: (
                format!("arp{tag}{}", id % 100_000),
                format!("arc{tag}{}", id % 100_000),
            ),
        };
        if let Err(err) = ns.ip(&["netns", "add", &ns.pod]) {
            let why = format!("the kernel refused `ip netns add` ({err})");
            crate::support::skip::skip(
                "tests/it/intercept.rs",
                &why,
                crate::support::skip::InCi::Skips,
            );
            return None;
        }
        let (vp, vc) = ns.veth.clone();
        let steps: [&[&str]; 10] = [
            &["netns", "add", &ns.client],
            &["link", "add", &vp, "type", "veth", "peer", "name", &vc],
            &["link", "set", &vp, "netns", &ns.pod],
            &["link", "set", &vc, "netns", &ns.client],
            &[
                "-n",
                &ns.pod,
                "addr",
                "add",
                &format!("{POD_IP}/24"),
                "dev",
                &vp,
            ],
            &[
                "-n",
                &ns.client,
                "addr",
                "add",
                &format!("{CLIENT_IP}/24"),
                "dev",
                &vc,
            ],
            &["-n", &ns.pod, "link", "set", &vp, "up"],
            &["-n", &ns.client, "link", "set", &vc, "up"],
            &["-n", &ns.pod, "link", "set", "lo", "up"],
            &["-n", &ns.client, "link", "set", "lo", "up"],
        ];
        for step in steps {
            if let Err(err) = ns.ip(step) {
                let why = format!("the kernel refused `ip {}` ({err})", step.join(" "));
                crate::support::skip::skip(
                    "tests/it/intercept.rs",
                    &why,
                    crate::support::skip::InCi::Skips,
                );
                return None;
            }
        }
        std::fs::create_dir_all(&ns.dir).ok()?;
        Some(ns)
    }

    fn ip(&self, args: &[&str]) -> Result<(), String> {
        let out = Command::new("ip")
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }

    /// `cmd` run inside `ns`, to completion.
    fn exec(&self, ns: &str, cmd: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", ns])
            .args(cmd)
            .output()
            .unwrap_or_else(|e| panic!("ip netns exec {ns} {cmd:?}: {e}"))
    }

    /// IPv6 on the veth too (no duplicate address detection: usable at once); `false` where
    /// the kernel has IPv6 off.
    fn add_ipv6(&self) -> bool {
        let (vp, vc) = &self.veth;
        [
            self.ip(&[
                "-n",
                &self.pod,
                "addr",
                "add",
                &format!("{POD_IP6}/64"),
                "dev",
                vp,
                "nodad",
            ]),
            self.ip(&[
                "-n",
                &self.client,
                "addr",
                "add",
                &format!("{CLIENT_IP6}/64"),
                "dev",
                vc,
                "nodad",
            ]),
        ]
        .iter()
        .all(Result::is_ok)
    }

    /// `cmd` started inside the pod namespace, its output in the test directory.
    fn spawn(&mut self, name: &str, cmd: &[&str]) {
        self.spawn_with(name, cmd, &[]);
    }

    /// [`Netns::spawn`] with environment variables.
    fn spawn_with(&mut self, name: &str, cmd: &[&str], env: &[(&str, &str)]) {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.pod])
            .args(cmd)
            .envs(env.iter().copied())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        self.children.push(child);
    }

    /// One HTTP/1.1 GET from inside `ns` over bash's /dev/tcp (no curl needed): the whole
    /// response, or `None` when the connection failed.
    fn get(&self, ns: &str, host: &str, port: u16, path: &str) -> Option<String> {
        let script = format!(
            "exec 3<>/dev/tcp/{host}/{port} && printf 'GET {path} HTTP/1.1\\r\\nhost: {host}\\r\\nconnection: close\\r\\n\\r\\n' >&3 && cat <&3"
        );
        let out = self.exec(ns, &["timeout", "5", "bash", "-c", &script]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success() && text.starts_with("HTTP/1.1")).then_some(text)
    }

    /// `agent-reach init-net` for the agent's port, in the pod: what it printed.
    fn init_net(&self, bin: &str) -> String {
        let (ports, inbound) = (AGENT_PORT.to_string(), INBOUND_PORT.to_string());
        let args = [
            bin,
            "init-net",
            "--agent-ports",
            &ports,
            "--inbound-port",
            &inbound,
        ];
        let out = self.exec(&self.pod, &args);
        assert!(
            out.status.success(),
            "init-net: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Polls until `f` gives an answer, for up to 15 s.
    fn until<T>(&self, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within 15 s; logs in {}",
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Deleting a namespace deletes the veth end in it, and with it the pair.
        let _ = self.ip(&["netns", "del", &self.pod]);
        let _ = self.ip(&["netns", "del", &self.client]);
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A sample's value: the series of `name` carrying every one of `labels` (`key="value"`).
fn metric(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && labels.iter().all(|x| l.contains(x)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn a_plain_client_calling_the_agents_port_is_measured_by_the_sidecar() {
    let Some(mut ns) = Netns::create(1) else {
        return;
    };
    let bin = env!("CARGO_BIN_EXE_agent-reach");
    let mock_agent = testkit::bins::mock_agent().display().to_string();
    let bootstrap = ns.dir.join("bootstrap.yaml");
    // `strict`: peers must speak mutual TLS; an intercepted client of the agent's port, which
    // knows nothing of the mesh, is let through in plaintext because the policy says so for
    // that port.
    let policy = ns.dir.join("policy.yaml");
    std::fs::write(
        &policy,
        format!("mtls:\n  mode: strict\n  ports: {{ {AGENT_PORT}: permissive }}\n"),
    )
    .unwrap();
    std::fs::write(
        &bootstrap,
        format!(
            "listen:\n  outbound: 127.0.0.1:4140\n  inbound: 0.0.0.0:{INBOUND_PORT}\n  admin: 0.0.0.0:{ADMIN_PORT}\n\
             \x20 intercept: {{ ports: [{AGENT_PORT}] }}\n\
             agent:\n  name: intercepted-agent\n  address: 127.0.0.1:{AGENT_PORT}\n  max_concurrency: 4\n\
             \x20 capabilities:\n    - name: echo\n"
        ),
    )
    .unwrap();
    ns.spawn(
        "agent",
        &[&mock_agent, "--listen", &format!("0.0.0.0:{AGENT_PORT}")],
    );
    ns.spawn(
        "sidecar",
        &[
            bin,
            "run",
            "--config",
            bootstrap.to_str().unwrap(),
            "--policy",
            policy.to_str().unwrap(),
        ],
    );
    let pod = ns.pod.clone();
    let client = ns.client.clone();
    ns.until("the sidecar is live", || {
        ns.get(&pod, "127.0.0.1", ADMIN_PORT, "/live")
    });
    // Before interception the client reaches the agent itself: no sidecar header.
    let direct = ns.until("the agent answers the client", || {
        ns.get(&client, POD_IP, AGENT_PORT, "/work")
    });
    assert!(
        !direct.to_ascii_lowercase().contains("reach-agent:"),
        "{direct}"
    );

    let ports = AGENT_PORT.to_string();
    let inbound = INBOUND_PORT.to_string();
    let init = [
        bin,
        "init-net",
        "--agent-ports",
        &ports,
        "--inbound-port",
        &inbound,
    ];
    // Twice: a rerun replaces its own chain and adds no second jump.
    for _ in 0..2 {
        let out = ns.exec(&pod, &init);
        assert!(
            out.status.success(),
            "init-net: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let answer = ns
        .get(&client, POD_IP, AGENT_PORT, "/work")
        .expect("intercepted call");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("reach-agent: intercepted-agent"),
        "the sidecar did not answer: {answer}"
    );
    let metrics = ns.until("the intercepted call is counted", || {
        let text = ns.get(&pod, "127.0.0.1", ADMIN_PORT, "/metrics")?;
        let counted = metric(
            &text,
            "reach_requests_total",
            &[
                "direction=\"inbound\"",
                "source=\"intercepted\"",
                "capability=\"echo\"",
                "outcome=\"success\"",
            ],
        )?;
        (counted >= 1.0).then_some(text)
    });
    assert!(
        metrics.contains("reach_request_duration_seconds"),
        "{metrics}"
    );
    // A plaintext call to the inbound port itself is not intercepted (its original destination
    // is the listener's own address, though conntrack tracks it too), so `strict` refuses it.
    let peer = ns
        .get(&client, POD_IP, INBOUND_PORT, "/work")
        .expect("a call to the inbound port");
    assert!(peer.starts_with("HTTP/1.1 403"), "{peer}");
    assert!(peer.contains("mtls_required"), "{peer}");
    let metrics = ns.get(&pod, "127.0.0.1", ADMIN_PORT, "/metrics").unwrap();
    let intercepted: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("reach_requests_total{") && l.contains("source=\"intercepted\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(intercepted, 1.0, "{metrics}");
    // The sidecar's own call to the agent (loopback) was not redirected back to it: the agent
    // answered, which the 200 above shows; inside the pod the agent's port is still the agent's.
    let local = ns
        .get(&pod, "127.0.0.1", AGENT_PORT, "/work")
        .expect("the agent on loopback");
    assert!(
        !local.to_ascii_lowercase().contains("reach-agent:"),
        "{local}"
    );

    // An unrelated NAT rule in the pod (as a hostPort or NodePort adds) sends port 80 to the
    // inbound listener: not an intercepted port, so a direct connection, and `strict` refuses it.
    let dnat = ns.exec(
        &pod,
        &[
            "iptables",
            "-w",
            "-t",
            "nat",
            "-I",
            "PREROUTING",
            "-p",
            "tcp",
            "--dport",
            "80",
            "-j",
            "DNAT",
            "--to-destination",
            &format!("{POD_IP}:{INBOUND_PORT}"),
        ],
    );
    assert!(
        dnat.status.success(),
        "{}",
        String::from_utf8_lossy(&dnat.stderr)
    );
    let natted = ns
        .get(&client, POD_IP, 80, "/work")
        .expect("a call through the NAT'd port");
    assert!(natted.starts_with("HTTP/1.1 403"), "{natted}");
    assert!(natted.contains("mtls_required"), "{natted}");
}

// Strict means strict for intercepted clients too: with no port-level exception, a plaintext
// client of an agent that listens only on 127.0.0.1 (the README's pod) is refused at the
// sidecar, and the refusal is counted as `intercepted_plaintext`.
#[test]
fn strict_refuses_intercepted_plaintext_without_a_port_exception() {
    let Some(mut ns) = Netns::create(2) else {
        return;
    };
    let bin = env!("CARGO_BIN_EXE_agent-reach");
    let mock_agent = testkit::bins::mock_agent().display().to_string();
    let bootstrap = ns.dir.join("bootstrap.yaml");
    let policy = ns.dir.join("policy.yaml");
    std::fs::write(&policy, "mtls:\n  mode: strict\n").unwrap();
    std::fs::write(
        &bootstrap,
        format!(
            "listen:\n  outbound: 127.0.0.1:4140\n  inbound: 0.0.0.0:{INBOUND_PORT}\n  admin: 0.0.0.0:{ADMIN_PORT}\n\
             \x20 intercept: {{ ports: [{AGENT_PORT}] }}\n\
             agent:\n  name: loopback-agent\n  address: 127.0.0.1:{AGENT_PORT}\n  max_concurrency: 4\n\
             \x20 capabilities:\n    - name: echo\n"
        ),
    )
    .unwrap();
    let agent = format!("127.0.0.1:{AGENT_PORT}");
    ns.spawn("agent", &[&mock_agent, "--listen", &agent]);
    let (config, policy) = (bootstrap.to_str().unwrap(), policy.to_str().unwrap());
    ns.spawn(
        "sidecar",
        &[bin, "run", "--config", config, "--policy", policy],
    );
    let (pod, client) = (ns.pod.clone(), ns.client.clone());
    ns.until("the sidecar is live", || {
        ns.get(&pod, "127.0.0.1", ADMIN_PORT, "/live")
    });
    ns.until("the agent answers on loopback", || {
        ns.get(&pod, "127.0.0.1", AGENT_PORT, "/work")
    });
    ns.init_net(bin);
    let refused = ns
        .get(&client, POD_IP, AGENT_PORT, "/work")
        .expect("an answer from the sidecar");
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    assert!(refused.contains("mtls_required"), "{refused}");
    let metrics = ns.get(&pod, "127.0.0.1", ADMIN_PORT, "/metrics").unwrap();
    let counted = metric(
        &metrics,
        "reach_tls_handshake_failures_total",
        &["reason=\"intercepted_plaintext\""],
    );
    assert_eq!(counted, Some(1.0), "{metrics}");
}

/// The agent container of an injected pod: its kubelet probes, as `agent-reach inject --file`
/// rewrites them, and the originals it hands the sidecar (`AGENT_REACH_APP_PROBES`).
fn injected_probes(ns: &Netns, bin: &str) -> (String, String) {
    let pod = ns.dir.join("pod.yaml");
    std::fs::write(
        &pod,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: coder-0\n  annotations:\n    agent-reach.io/inject: enabled\n    agent-reach.io/intercept: inbound\n    agent-reach.io/agent-port: \"{AGENT_PORT}\"\n    agent-reach.io/capabilities: echo\n\
             spec:\n  containers:\n  - name: agent\n    image: agent:1\n    ports: [{{ containerPort: {AGENT_PORT} }}]\n\
             \x20   livenessProbe: {{ httpGet: {{ path: /healthz, port: {AGENT_PORT} }} }}\n\
             \x20   readinessProbe: {{ tcpSocket: {{ port: {AGENT_PORT} }} }}\n"
        ),
    )
    .unwrap();
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/config/injector.yaml");
    let out = Command::new(bin)
        .args(["inject", "--config", config, "--file"])
        .arg(&pod)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest: serde_json::Value = agent_reach::config::yaml::from_slice(&out.stdout).unwrap();
    let agent = &manifest["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "agent")
        .unwrap()
        .clone();
    let path = agent["livenessProbe"]["httpGet"]["path"]
        .as_str()
        .unwrap()
        .to_owned();
    let sidecar = manifest["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .chain(manifest["spec"]["containers"].as_array())
        .flatten()
        .find(|c| c["name"] == "agent-reach")
        .unwrap()
        .clone();
    let probes = sidecar["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "AGENT_REACH_APP_PROBES")
        .and_then(|e| e["value"].as_str())
        .unwrap()
        .to_owned();
    (path, probes)
}

// The injected pod under strict mTLS with interception, as the kubelet sees it from the node:
// the agent's port refuses its plaintext probe (the problem), the probes `inject` moved to the
// admin port are answered by the agent, over IPv4 and IPv6, idle and while the agent is busy;
// and IPv6 clients of the agent's port are intercepted too (ip6tables).
#[test]
fn an_injected_pods_probes_are_answered_by_its_agent_over_ipv4_and_ipv6() {
    let Some(mut ns) = Netns::create(3) else {
        return;
    };
    let v6 = ns.add_ipv6();
    if !v6 {
        eprintln!("tests/it/intercept.rs: no IPv6 in this kernel: IPv4 only");
    }
    let bin = env!("CARGO_BIN_EXE_agent-reach");
    let mock_agent = testkit::bins::mock_agent().display().to_string();
    let (path, probes) = injected_probes(&ns, bin);
    assert_eq!(path, "/app-health/agent/livez");
    let policy = ns.dir.join("policy.yaml");
    std::fs::write(&policy, "mtls:\n  mode: strict\n").unwrap();
    let bootstrap = ns.dir.join("bootstrap.yaml");
    std::fs::write(
        &bootstrap,
        format!(
            "listen:\n  outbound: 127.0.0.1:4140\n  inbound: \"[::]:{INBOUND_PORT}\"\n  admin: \"[::]:{ADMIN_PORT}\"\n\
             \x20 intercept: {{ ports: [{AGENT_PORT}] }}\n\
             agent:\n  name: busy-agent\n  address: 127.0.0.1:{AGENT_PORT}\n  max_concurrency: 1\n\
             \x20 queue: {{ capacity: 0, max_wait: 1s }}\n\
             \x20 capabilities:\n    - name: echo\n"
        ),
    )
    .unwrap();
    ns.spawn(
        "agent",
        &[
            &mock_agent,
            "--listen",
            &format!("127.0.0.1:{AGENT_PORT}"),
            "--mode",
            "slow",
        ],
    );
    ns.spawn_with(
        "sidecar",
        &[
            bin,
            "run",
            "--config",
            bootstrap.to_str().unwrap(),
            "--policy",
            policy.to_str().unwrap(),
        ],
        &[("AGENT_REACH_APP_PROBES", probes.as_str())],
    );
    let pod = ns.pod.clone();
    let client = ns.client.clone();
    ns.until("the sidecar is live", || {
        ns.get(&pod, "127.0.0.1", ADMIN_PORT, "/live")
    });
    let said = ns.init_net(bin);
    let mut addresses = vec![POD_IP];
    if v6 {
        assert!(said.contains("ip6tables"), "no IPv6 rules: {said}");
        addresses.push(POD_IP6);
    }
    let status = |answer: &str| answer.split_whitespace().nth(1).unwrap_or("").to_owned();
    for ip in &addresses {
        // What the kubelet probed before: refused by strict, since it is intercepted.
        let old = ns
            .get(&client, ip, AGENT_PORT, "/healthz")
            .expect("a plaintext probe");
        assert_eq!(status(&old), "403", "{ip}: {old}");
        assert!(old.contains("mtls_required"), "{old}");
        // What it probes now: the agent's own answer.
        let live = ns
            .get(&client, ip, ADMIN_PORT, &path)
            .expect("the rewritten probe");
        assert_eq!(status(&live), "200", "{ip}: {live}");
        let ready = ns
            .get(&client, ip, ADMIN_PORT, "/app-health/agent/readyz")
            .expect("the readiness probe");
        assert_eq!(status(&ready), "200", "{ip}: {ready}");
    }
    // Busy: the agent's workers taken by slow calls on loopback (not intercepted); the probe
    // runs beside them, outside any slot.
    for n in 0..6 {
        let script = format!(
            "exec 3<>/dev/tcp/127.0.0.1/{AGENT_PORT} && printf 'POST /work HTTP/1.1\\r\\nhost: x\\r\\ncontent-length: 0\\r\\nconnection: close\\r\\n\\r\\n' >&3 && cat <&3"
        );
        ns.spawn(
            &format!("busy-{n}"),
            &["timeout", "10", "bash", "-c", &script],
        );
    }
    ns.until("the agent is busy", || {
        let text = ns.get(&pod, "127.0.0.1", AGENT_PORT, "/admin/stats")?;
        let body = text.split("\r\n\r\n").nth(1)?;
        let stats: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
        (stats["in_flight"].as_u64()? >= 1).then_some(())
    });
    for ip in &addresses {
        let live = ns
            .get(&client, ip, ADMIN_PORT, &path)
            .expect("the probe while busy");
        assert_eq!(status(&live), "200", "busy, {ip}: {live}");
    }
}
