//! A fleet of real processes on 127.0.0.1: sidecars (`agent-reach run`) that find each other by
//! gossip from one seed (a cluster key file) and speak mutual TLS to each other (SVIDs from one
//! throwaway CA, `mtls.mode: strict`), mock agents (`mock-agent --log`), a private
//! `redis-server` with `appendonly yes, appendfsync always`, a tmpfs for a task store, and an
//! iptables partition. Every process is killed, every mount and rule undone, on drop.
//!
//! Ports are picked once (free ports from the OS) and kept across restarts: a container that
//! restarts keeps its pod's address, and the agent's address is in its sidecar's bootstrap.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use agent_reach::pki::DevCa;

use super::net;

/// A fresh scratch directory under the system's temp dir.
pub fn scratch(tag: &str) -> Result<PathBuf, String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir =
        std::env::temp_dir().join(format!("agent-reach-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

pub fn free_tcp() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

pub fn free_udp() -> Result<u16, String> {
    let socket = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    socket
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Sends `signal` (`TERM`, `KILL`) to `pid` with kill(1).
fn signal(pid: u32, signal: &str) -> Result<(), String> {
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("kill: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("kill -{signal} {pid}: {status}"))
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Lines of a log that report a panic.
pub fn panics_in(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("panicked"))
        .map(str::to_owned)
        .collect()
}

/// Reads a bound address from the start-up line (`outbound=127.0.0.1:PORT`).
fn bound(line: &str, key: &str) -> Option<SocketAddr> {
    let start = line.find(&format!("{key}="))? + key.len() + 1;
    line[start..].split_whitespace().next()?.parse().ok()
}

/// Copies a child's output into `log` (appended) on a thread; the first line `started` accepts
/// is sent on the returned channel.
fn pump(
    output: impl std::io::Read + Send + 'static,
    log: &Path,
    started: fn(&str) -> bool,
) -> Result<tokio::sync::oneshot::Receiver<String>, String> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(output).lines().map_while(Result::ok) {
            let _ = writeln!(file, "{line}");
            if started(&line) {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(line);
                }
            }
        }
    });
    Ok(rx)
}

// ---------------------------------------------------------------------------------------------
// Sidecars

/// What a sidecar is: its name, its agent, what it serves, its task store.
#[derive(Clone, Debug)]
pub struct SidecarSpec {
    pub name: String,
    /// The local agent's address (`127.0.0.1:9` for a caller with no agent).
    pub agent: SocketAddr,
    pub capabilities: Vec<String>,
    /// The bootstrap's `tasks` section as a YAML flow mapping, e.g. `{ path: tasks.db }`.
    pub tasks: Option<String>,
    pub max_concurrency: u32,
    pub drain_timeout: String,
}

impl SidecarSpec {
    pub fn new(name: &str, agent: SocketAddr, capabilities: &[&str]) -> Self {
        Self {
            name: name.to_owned(),
            agent,
            capabilities: capabilities.iter().map(|c| (*c).to_owned()).collect(),
            tasks: None,
            max_concurrency: 32,
            drain_timeout: "10s".to_owned(),
        }
    }

    /// A caller: no agent, no capabilities.
    pub fn caller(name: &str) -> Self {
        Self::new(name, local(9), &[])
    }

    pub fn tasks(mut self, tasks: &str) -> Self {
        self.tasks = Some(tasks.to_owned());
        self
    }
}

/// One sidecar process, restartable on the same files and ports.
pub struct SidecarProcess {
    pub name: String,
    pub outbound: SocketAddr,
    pub inbound: SocketAddr,
    pub admin: SocketAddr,
    pub gossip: SocketAddr,
    pub bootstrap: PathBuf,
    pub policy: PathBuf,
    /// Its stderr, every start appended.
    pub log: PathBuf,
    pub starts: u32,
    child: Option<Child>,
    bin: PathBuf,
}

impl SidecarProcess {
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts `agent-reach run` and waits for its start-up line (30 s at most).
    pub async fn start(&mut self) -> Result<(), String> {
        if self.child.is_some() {
            return Err(format!("{} is already running", self.name));
        }
        self.starts += 1;
        {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .map_err(|e| e.to_string())?;
            let _ = writeln!(
                file,
                "=== start {} at {} ms ===",
                self.starts,
                net::now_ms()
            );
        }
        let mut child = Command::new(&self.bin)
            .args(["run", "--worker-threads", "1", "--config"])
            .arg(&self.bootstrap)
            .arg("--policy")
            .arg(&self.policy)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", self.bin.display()))?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let started = pump(stderr, &self.log, |l| l.contains("sidecar started"))?;
        self.child = Some(child);
        match tokio::time::timeout(Duration::from_secs(30), started).await {
            Ok(Ok(line)) if bound(&line, "outbound") == Some(self.outbound) => Ok(()),
            Ok(Ok(line)) => {
                self.kill9();
                Err(format!(
                    "{} started on other addresses than its bootstrap's: {line}",
                    self.name
                ))
            }
            _ => {
                self.kill9();
                Err(format!(
                    "{} did not start; its log ends:\n{}",
                    self.name,
                    tail(&self.log, 15)
                ))
            }
        }
    }

    /// SIGKILL: no drain, no goodbye. Waits for the process to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM: the sidecar drains and exits on its own ([`SidecarProcess::wait_exit`]).
    pub fn sigterm(&mut self) -> Result<(), String> {
        let pid = self
            .pid()
            .ok_or_else(|| format!("{} is not running", self.name))?;
        signal(pid, "TERM")
    }

    /// Waits for the process to exit, up to `within`; kills it past that. Its exit status,
    /// or None when it had to be killed.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            let child = self.child.as_mut()?;
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                self.kill9();
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether the process is alive (an exit is reaped and noted).
    pub fn running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                self.child = None;
                false
            }
            None => false,
        }
    }

    pub fn panics(&self) -> Vec<String> {
        panics_in(&self.log)
    }

    /// The names of the peers this sidecar's registry knows (`/status`).
    pub async fn peers(&self) -> Vec<String> {
        match net::get_json(self.admin, "/status").await {
            Ok((200, v)) => v["peers"]
                .as_array()
                .map(|peers| {
                    peers
                        .iter()
                        .filter_map(|p| p["name"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// The sidecar's `/metrics` text (empty when unreachable).
    pub async fn metrics(&self) -> String {
        net::call(
            self.admin,
            "GET",
            "/metrics",
            &[],
            bytes::Bytes::new(),
            Duration::from_secs(10),
        )
        .await
        .map(|a| a.text())
        .unwrap_or_default()
    }
}

impl Drop for SidecarProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

// ---------------------------------------------------------------------------------------------
// Mock agents

/// A mock agent process (`mock-agent`), restartable on the same port and log.
pub struct AgentProcess {
    pub name: String,
    pub addr: SocketAddr,
    /// One JSON line per business call it executed, every incarnation appended.
    pub executions: PathBuf,
    /// Its own stdout and stderr.
    pub log: PathBuf,
    pub latency: String,
    pub sse_events: u32,
    pub sse_interval: String,
    pub starts: u32,
    child: Option<Child>,
    bin: PathBuf,
}

impl AgentProcess {
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts the agent and waits until it says it listens (10 s at most).
    pub async fn start(&mut self) -> Result<(), String> {
        if self.child.is_some() {
            return Err(format!("agent {} is already running", self.name));
        }
        self.starts += 1;
        let mut child = Command::new(&self.bin)
            .args(["--listen", &self.addr.to_string(), "--name", &self.name])
            .arg("--log")
            .arg(&self.executions)
            .args(["--latency", &self.latency])
            .args(["--sse-events", &self.sse_events.to_string()])
            .args(["--sse-interval", &self.sse_interval])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", self.bin.display()))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let started = pump(stdout, &self.log, |l| l.starts_with("mock agent"))?;
        // Nothing to wait for on stderr: its receiver is dropped.
        drop(pump(stderr, &self.log, |_| false)?);
        self.child = Some(child);
        match tokio::time::timeout(Duration::from_secs(10), started).await {
            Ok(Ok(_)) => Ok(()),
            _ => {
                self.kill9();
                Err(format!(
                    "agent {} did not start: {}",
                    self.name,
                    tail(&self.log, 10)
                ))
            }
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn panics(&self) -> Vec<String> {
        panics_in(&self.log)
    }

    /// Every line of the execution log, parsed.
    pub fn executions(&self) -> Vec<Execution> {
        read_executions(&self.executions)
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// One business call an agent executed, from its log.
#[derive(Clone, Debug)]
pub struct Execution {
    pub t_ms: u64,
    pub agent: String,
    pub pid: u64,
    pub key: Option<String>,
    pub path: String,
    pub status: u16,
}

pub fn read_executions(path: &Path) -> Vec<Execution> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| Execution {
            t_ms: v["t_ms"].as_u64().unwrap_or(0),
            agent: v["agent"].as_str().unwrap_or("").to_owned(),
            pid: v["pid"].as_u64().unwrap_or(0),
            key: v["key"].as_str().map(str::to_owned),
            path: v["path"].as_str().unwrap_or("").to_owned(),
            status: v["status"].as_u64().unwrap_or(0) as u16,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The fleet

/// Gossip timings for every sidecar (a YAML fragment inside `gossip: { … }`): quick enough that
/// a test sees membership change in seconds, slow enough for a loaded two-core machine.
pub const GOSSIP_TIMINGS: &str =
    "probe_interval: 500ms, probe_timeout: 250ms, suspect_timeout: 2s, refresh_interval: 1s";

/// The trust domain of every SVID.
pub const TRUST_DOMAIN: &str = "chaos.example";

pub struct Fleet {
    pub dir: PathBuf,
    /// Ports handed out so far: never twice.
    used: std::collections::HashSet<u16>,
    pub policy: PathBuf,
    key: PathBuf,
    ca: DevCa,
    /// The first sidecar's gossip address: every other one's seed.
    seed: Option<SocketAddr>,
    pub sidecars: Vec<SidecarProcess>,
    pub agents: Vec<AgentProcess>,
    bin: PathBuf,
    /// Keep `dir` on drop (else it is removed, unless the thread is panicking: a failed test
    /// leaves its logs).
    pub keep_dir: bool,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for s in &mut self.sidecars {
            s.kill9();
        }
        for a in &mut self.agents {
            a.kill9();
        }
        if std::thread::panicking() {
            eprintln!("the fleet's logs are kept in {}", self.dir.display());
        } else if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Fleet {
    /// An empty fleet in `dir` with the shared `policy` (YAML) and a fresh cluster key and CA.
    pub fn new(dir: &Path, policy: &str) -> Result<Self, String> {
        let key = dir.join("gossip.key");
        let secret: [u8; 32] = rand::random();
        write(
            &key,
            &secret
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>(),
        )?;
        let policy_path = dir.join("policy.yaml");
        write(&policy_path, policy)?;
        Ok(Self {
            dir: dir.to_owned(),
            used: std::collections::HashSet::new(),
            policy: policy_path,
            key,
            ca: DevCa::new("agent-reach chaos CA").map_err(|e| e.to_string())?,
            seed: None,
            sidecars: Vec::new(),
            agents: Vec::new(),
            bin: crate::bins::sidecar(),
            keep_dir: false,
        })
    }

    /// A free TCP (or UDP) port not handed out before in this fleet.
    fn port(&mut self, udp: bool) -> Result<u16, String> {
        for _ in 0..100 {
            let port = if udp { free_udp()? } else { free_tcp()? };
            if self.used.insert(port) {
                return Ok(port);
            }
        }
        Err("no free port".to_owned())
    }

    /// Adds a mock agent (not started): `latency` like `20ms..60ms`; SSE events and interval.
    pub fn add_agent(
        &mut self,
        name: &str,
        latency: &str,
        sse_events: u32,
        sse_interval: &str,
    ) -> Result<usize, String> {
        let addr = local(self.port(false)?);
        self.agents.push(AgentProcess {
            name: name.to_owned(),
            addr,
            executions: self.dir.join(format!("{name}.executions.jsonl")),
            log: self.dir.join(format!("{name}.agent.log")),
            latency: latency.to_owned(),
            sse_events,
            sse_interval: sse_interval.to_owned(),
            starts: 0,
            child: None,
            bin: crate::bins::mock_agent(),
        });
        Ok(self.agents.len() - 1)
    }

    /// Adds a sidecar (not started), its bootstrap written: the first one added is the gossip
    /// seed of the others. Each gets an SVID `spiffe://chaos.example/ns/chaos/sa/<name>`.
    pub fn add_sidecar(&mut self, spec: &SidecarSpec) -> Result<usize, String> {
        let name = &spec.name;
        let (outbound, inbound, admin) = (self.port(false)?, self.port(false)?, self.port(false)?);
        let gossip = local(self.port(true)?);
        let tls = self
            .ca
            .write_files(
                &self.dir.join(format!("tls-{name}")),
                &format!("spiffe://{TRUST_DOMAIN}/ns/chaos/sa/{name}"),
            )
            .map_err(|e| e.to_string())?;
        let seeds = self.seed.map_or_else(String::new, |s| s.to_string());
        let capabilities = spec
            .capabilities
            .iter()
            .map(|c| format!("{{ name: {c} }}"))
            .collect::<Vec<_>>()
            .join(", ");
        let tasks = spec
            .tasks
            .as_ref()
            .map_or_else(String::new, |t| format!("tasks: {t}\n"));
        let bootstrap = self.dir.join(format!("{name}.yaml"));
        write(
            &bootstrap,
            &format!(
                "listen: {{ outbound: 127.0.0.1:{outbound}, inbound: 127.0.0.1:{inbound}, admin: 127.0.0.1:{admin} }}\n\
                 limits: {{ drain_timeout: {drain} }}\n\
                 agent:\n  name: {name}\n  address: {agent}\n  max_concurrency: {max}\n  capabilities: [{capabilities}]\n\
                 gossip: {{ listen: {gossip}, seeds: [{seeds}], key_file: {key}, {GOSSIP_TIMINGS} }}\n\
                 tls: {{ cert: {cert}, key: {tls_key}, ca: {ca} }}\n\
                 {tasks}",
                drain = spec.drain_timeout,
                agent = spec.agent,
                max = spec.max_concurrency,
                key = self.key.display(),
                cert = tls.cert.display(),
                tls_key = tls.key.display(),
                ca = tls.ca.display(),
            ),
        )?;
        if self.seed.is_none() {
            self.seed = Some(gossip);
        }
        self.sidecars.push(SidecarProcess {
            name: name.clone(),
            outbound: local(outbound),
            inbound: local(inbound),
            admin: local(admin),
            gossip,
            bootstrap,
            policy: self.policy.clone(),
            log: self.dir.join(format!("{name}.log")),
            starts: 0,
            child: None,
            bin: self.bin.clone(),
        });
        Ok(self.sidecars.len() - 1)
    }

    /// Starts every agent, then every sidecar in the order added (the seed first).
    pub async fn start_all(&mut self) -> Result<(), String> {
        for agent in &mut self.agents {
            agent.start().await?;
        }
        for sidecar in &mut self.sidecars {
            sidecar.start().await?;
        }
        Ok(())
    }

    pub fn sidecar(&self, name: &str) -> Option<usize> {
        self.sidecars.iter().position(|s| s.name == name)
    }

    pub fn agent(&self, name: &str) -> Option<usize> {
        self.agents.iter().position(|a| a.name == name)
    }

    /// Waits until sidecar `at` knows every one of `names` as a peer.
    pub async fn wait_peers(
        &self,
        at: usize,
        names: &[String],
        within: Duration,
    ) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            let known = self.sidecars[at].peers().await;
            if names.iter().all(|n| known.contains(n)) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} knows {known:?} after {within:?}, not all of {names:?}",
                    self.sidecars[at].name
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every panic any process logged, with its name.
    pub fn panics(&self) -> Vec<String> {
        let sidecars = self.sidecars.iter().flat_map(|s| {
            s.panics()
                .into_iter()
                .map(move |l| format!("{}: {l}", s.name))
        });
        let agents = self.agents.iter().flat_map(|a| {
            a.panics()
                .into_iter()
                .map(move |l| format!("agent {}: {l}", a.name))
        });
        sidecars.chain(agents).collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Redis

/// A private `redis-server` that keeps what it acknowledged across its own restart
/// (`appendonly yes`, `appendfsync always`), on one port for its whole life.
pub struct Redis {
    pub port: u16,
    dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    pub starts: u32,
}

impl Redis {
    /// Whether `redis-server` can be run at all.
    pub fn installed() -> bool {
        Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Starts a server on a free port with its files in `dir`.
    pub async fn start(dir: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut last = String::new();
        for _ in 0..3 {
            let mut redis = Self {
                port: free_tcp()?,
                dir: dir.to_owned(),
                log: dir.join("redis.log"),
                child: None,
                starts: 0,
            };
            match redis.spawn().await {
                Ok(()) => return Ok(redis),
                Err(e) => last = e,
            }
        }
        Err(format!("redis-server did not start: {last}"))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Starts the server again on the same port and files; waits for PONG.
    pub async fn spawn(&mut self) -> Result<(), String> {
        self.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| e.to_string())?;
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("redis-server: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if ping(self.port).await {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(format!("exited with {status}: {}", tail(&self.log, 5)));
            }
            if Instant::now() > deadline {
                self.kill9();
                return Err(format!("no PONG on port {} within 10 s", self.port));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL: what was acknowledged is in the append-only file already.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The server answers `PING` with `+PONG`.
async fn ping(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(local(port)).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut buf = [0u8; 7];
        stream.read_exact(&mut buf).await.ok()?;
        Some(&buf == b"+PONG\r\n")
    };
    matches!(
        tokio::time::timeout(Duration::from_millis(500), attempt).await,
        Ok(Some(true))
    )
}

// ---------------------------------------------------------------------------------------------
// A small disk, and a partition

/// A tmpfs of a few MiB mounted on a directory (root only), to fill and free.
pub struct Tmpfs {
    pub dir: PathBuf,
    filler: PathBuf,
}

impl Tmpfs {
    /// `mount -t tmpfs -o size=<mib>m` on `dir` (created), or why not.
    pub fn mount(dir: &Path, mib: u64) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Self {
            dir: dir.to_owned(),
            filler: dir.join("filler"),
        })
    }

    /// Writes a file until the disk is full; the bytes written.
    pub fn fill(&self) -> Result<u64, String> {
        let mut file = std::fs::File::create(&self.filler).map_err(|e| e.to_string())?;
        let mut written = 0u64;
        for chunk in [64 * 1024, 4096, 512, 1] {
            let buf = vec![0u8; chunk];
            while file.write_all(&buf).is_ok() {
                written += chunk as u64;
            }
        }
        let _ = file.sync_all();
        Ok(written)
    }

    pub fn free(&self) {
        let _ = std::fs::remove_file(&self.filler);
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        self.free();
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .stderr(Stdio::null())
            .status();
    }
}

/// iptables rules that drop every packet to or from some loopback ports: a sidecar cut off from
/// the network (its agent, on the same host, is not).
pub struct Partition {
    rules: Vec<Vec<String>>,
}

impl Partition {
    /// Whether iptables can be used here (root, and the kernel lets us).
    pub fn available() -> Result<(), String> {
        let out = Command::new("iptables")
            .args(["-w", "-S", "INPUT"])
            .output()
            .map_err(|e| format!("iptables: {e}"))?;
        out.status.success().then_some(()).ok_or_else(|| {
            format!(
                "iptables -S failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
    }

    /// Drops TCP on `tcp` ports and UDP on `udp` ports, both directions, on `lo`.
    pub fn cut(tcp: &[u16], udp: &[u16], tag: &str) -> Result<Self, String> {
        let mut partition = Self { rules: Vec::new() };
        let ports = tcp
            .iter()
            .map(|p| ("tcp", *p))
            .chain(udp.iter().map(|p| ("udp", *p)));
        for (proto, port) in ports {
            for dir in ["--dport", "--sport"] {
                let rule: Vec<String> = [
                    "INPUT",
                    "-i",
                    "lo",
                    "-p",
                    proto,
                    dir,
                    &port.to_string(),
                    "-m",
                    "comment",
                    "--comment",
                    tag,
                    "-j",
                    "DROP",
                ]
                .iter()
                .map(|s| (*s).to_owned())
                .collect();
                let out = Command::new("iptables")
                    .args(["-w", "-I"])
                    .args(&rule)
                    .output()
                    .map_err(|e| format!("iptables: {e}"))?;
                if !out.status.success() {
                    return Err(format!(
                        "iptables -I {}: {}",
                        rule.join(" "),
                        String::from_utf8_lossy(&out.stderr).trim()
                    ));
                }
                partition.rules.push(rule);
            }
        }
        Ok(partition)
    }

    /// Removes the rules.
    pub fn heal(&mut self) {
        for rule in self.rules.drain(..) {
            let _ = Command::new("iptables")
                .args(["-w", "-D"])
                .args(&rule)
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.heal();
    }
}
