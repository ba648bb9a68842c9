//! The `agent-reach` command: run the sidecar, check config files, run the demo.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use agent_reach::config::{self, ConfigPaths, ConfigStore, FileKind, HumanDuration};
use agent_reach::inject::{inject_manifests, Injector, InjectorConfig};
use agent_reach::{demo, Sidecar};

/// mimalloc instead of glibc malloc: a hop makes ~50 allocations, several of them hyper's 8 KiB
/// read buffers, which glibc serves from its slow path (no tcache above 1 KiB) and consolidates
/// on free; mimalloc serves both from per-thread free lists. Built with `no_thp`: with
/// transparent huge pages its arenas commit 2 MiB pages eagerly, +9 MiB of idle RSS.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "agent-reach",
    version,
    about = "A sidecar that routes each agent's capability calls to the peer able to take them now"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the sidecar.
    Run {
        /// The bootstrap file (listeners, the local agent's profile, peers). Without it, the
        /// bootstrap's text is read from `AGENT_REACH_BOOTSTRAP` (what the injector sets).
        #[arg(long, env = "AGENT_REACH_CONFIG")]
        config: Option<PathBuf>,
        /// The fleet policy file; all defaults when omitted.
        #[arg(long, env = "AGENT_REACH_POLICY")]
        policy: Option<PathBuf>,
        /// Log filter, e.g. `info` or `agent_reach=debug`.
        #[arg(long, env = "AGENT_REACH_LOG", default_value = "info")]
        log: String,
        /// Log format: `text`, or `json` (one JSON object per line, for a log collector).
        #[arg(long, env = "AGENT_REACH_LOG_FORMAT", value_enum, default_value_t)]
        log_format: LogFormat,
        /// Same as `--log-format json`.
        #[arg(long)]
        log_json: bool,
        /// Threads serving traffic (default: one per CPU). Match the pod's CPU limit.
        #[arg(long, env = "AGENT_REACH_WORKER_THREADS")]
        worker_threads: Option<usize>,
    },
    /// Validate bootstrap and policy files; exit 1 naming file:line:col of the first error in each.
    Check {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// The admission webhook that adds the sidecar to annotated pods (HTTPS); with `--file`,
    /// inject the pods in a manifest file and print it (`-` reads stdin).
    Inject {
        /// The injector's file (the Helm chart renders it).
        #[arg(long, env = "AGENT_REACH_INJECTOR_CONFIG")]
        config: PathBuf,
        /// Inject this manifest file instead of serving.
        #[arg(long)]
        file: Option<PathBuf>,
        /// The namespace the manifests go to, for objects that name none (gossip seeds are
        /// per namespace).
        #[arg(long, short = 'n', default_value = "default")]
        namespace: String,
        #[arg(long, env = "AGENT_REACH_LOG", default_value = "info")]
        log: String,
        #[arg(long, env = "AGENT_REACH_LOG_FORMAT", value_enum, default_value_t)]
        log_format: LogFormat,
        #[arg(long)]
        log_json: bool,
    },
    /// Write a throwaway CA and a SPIFFE workload certificate per name, for mutual TLS between
    /// sidecars run by hand (a cluster gets them from cert-manager: docs/kubernetes.md).
    DevCerts {
        /// Where to write `<name>/tls.crt`, `<name>/tls.key` and `<name>/ca.crt`.
        #[arg(long)]
        out: PathBuf,
        /// The trust domain of the SPIFFE IDs.
        #[arg(long, default_value = "dev.local")]
        trust_domain: String,
        /// The namespace part of the IDs.
        #[arg(long, default_value = "default")]
        namespace: String,
        /// One workload (service account) per name: `spiffe://<trust-domain>/ns/<ns>/sa/<name>`.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// This agent and its peers as a sidecar sees them, one line per peer, from its admin port.
    Status {
        /// The sidecar's admin address.
        #[arg(long, default_value = agent_reach::admin::cli::DEFAULT_ADMIN)]
        admin: String,
        /// Redraw every 2 s.
        #[arg(long)]
        watch: bool,
        /// Print the `/status` document as it is.
        #[arg(long)]
        json: bool,
    },
    /// A sidecar's async tasks, from its outbound port: list, show, retry or resolve them.
    Tasks {
        /// The sidecar's outbound address.
        #[arg(long, default_value = agent_reach::tasks::cli::DEFAULT_OUTBOUND, global = true)]
        outbound: String,
        /// Print the API's JSON as it is.
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        action: TasksAction,
    },
    /// Redirect TCP connections to the agent's ports from outside the pod to the sidecar's
    /// inbound listener (iptables nat PREROUTING; run as the pod's init container, needs
    /// NET_ADMIN and NET_RAW). Rerunning replaces its own chain, nothing else.
    InitNet {
        /// The agent's ports, comma separated: connections to them are redirected.
        #[arg(long, required = true, value_delimiter = ',')]
        agent_ports: Vec<u16>,
        /// The sidecar's inbound listener port.
        #[arg(long, default_value_t = 4143)]
        inbound_port: u16,
        /// The UID the sidecar runs as (the injector sets `runAsUser` to it).
        #[arg(long, default_value_t = agent_reach::intercept::DEFAULT_PROXY_UID)]
        proxy_uid: u32,
        /// Ports never redirected, comma separated.
        #[arg(long, value_delimiter = ',')]
        exclude_ports: Vec<u16>,
        /// Print the rules and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// The iptables binary (`iptables-nft`, `iptables-legacy` or a path) instead of
        /// detecting the backend the pod's tables use.
        #[arg(long)]
        iptables: Option<String>,
    },
    /// A mock agent on `--listen` until killed (for tests that run it in another network
    /// namespace, where the example binary is not built).
    #[command(hide = true)]
    MockAgent {
        #[arg(long)]
        listen: std::net::SocketAddr,
        #[arg(long, default_value = "mock-agent")]
        name: String,
        /// Append one JSON line per business call executed (its `idempotency-key`) to this file.
        #[arg(long)]
        log: Option<PathBuf>,
        /// Business call latency: fixed (`50ms`) or a range (`20ms..80ms`).
        #[arg(long, default_value = "5ms")]
        latency: agent_reach::mock_agent::Latency,
        /// Events sent by `GET /sse`, one per `--sse-interval`.
        #[arg(long, default_value_t = 5)]
        sse_events: u32,
        #[arg(long, default_value = "100ms", value_parser = parse_duration)]
        sse_interval: HumanDuration,
    },
    /// Container lifecycle hooks for the plain-container sidecar (images have no shell).
    #[command(hide = true)]
    Hook {
        #[command(subcommand)]
        hook: Hook,
    },
    /// Golden-task baselines (`quality:` on a capability).
    Baseline {
        #[command(subcommand)]
        action: BaselineAction,
    },
    /// Run a local fleet of mock agents with their sidecars and show routing at work.
    Demo {
        /// How long to drive traffic.
        #[arg(long, default_value = "15s", value_parser = parse_duration)]
        duration: HumanDuration,
        /// Calls in flight at once.
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum TasksAction {
    /// The tasks, newest first.
    List {
        /// Only tasks in this state (queued, running, retrying, done, failed, escalated, resolved).
        #[arg(long)]
        state: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// One task: every attempt with its reason, the answer, what it still owes.
    Show { id: String },
    /// Send an escalated, failed or resolved task through the chain again.
    Retry { id: String },
    /// Close a task by hand.
    Resolve {
        id: String,
        /// What was done.
        #[arg(long)]
        note: Option<String>,
        /// Who did it.
        #[arg(long)]
        by: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum BaselineAction {
    /// Send each golden task once to the local agent and write its answer as the task's
    /// baseline (relative paths beside the bootstrap). Exit 1 if any could not be written.
    Record {
        /// The bootstrap file that declares the golden tasks.
        #[arg(long, env = "AGENT_REACH_CONFIG")]
        config: PathBuf,
        /// The fleet policy file (timeouts); all defaults when omitted.
        #[arg(long, env = "AGENT_REACH_POLICY")]
        policy: Option<PathBuf>,
        /// Only this capability's golden tasks.
        #[arg(long)]
        capability: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum Hook {
    /// Wait until the sidecar answers `/live`, so the agent starts with a way out.
    PostStart {
        #[arg(long, default_value = "127.0.0.1:4191")]
        admin: std::net::SocketAddr,
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        timeout: HumanDuration,
    },
    /// Hold the sidecar's SIGTERM back while the agent finishes its last calls.
    PreStop {
        #[arg(long, default_value = "5s", value_parser = parse_duration)]
        delay: HumanDuration,
    },
}

fn parse_duration(text: &str) -> Result<HumanDuration, String> {
    config::parse_duration(text).map(HumanDuration)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { files } => check(&files),
        Command::DevCerts {
            out,
            trust_domain,
            namespace,
            names,
        } => dev_certs(&out, &trust_domain, &namespace, &names),
        Command::Run {
            config,
            policy,
            log,
            log_format,
            log_json,
            worker_threads,
        } => {
            init_tracing(&log, log_format.or_json(log_json));
            run(
                ConfigPaths {
                    bootstrap: config,
                    policy,
                },
                worker_threads,
            )
        }
        Command::Inject {
            config,
            file,
            namespace,
            log,
            log_format,
            log_json,
        } => {
            init_tracing(&log, log_format.or_json(log_json));
            inject(&config, file.as_deref(), &namespace)
        }
        Command::Status { admin, watch, json } => agent_reach::admin::cli::run(&admin, watch, json),
        Command::Tasks {
            outbound,
            json,
            action,
        } => {
            use agent_reach::tasks::cli::{self, Action};
            let action = match action {
                TasksAction::List { state, limit } => Action::List { state, limit },
                TasksAction::Show { id } => Action::Show { id },
                TasksAction::Retry { id } => Action::Retry { id },
                TasksAction::Resolve { id, note, by } => Action::Resolve { id, note, by },
            };
            cli::run(&outbound, action, json)
        }
        Command::Hook { hook } => run_hook(hook),
        Command::InitNet {
            agent_ports,
            inbound_port,
            proxy_uid,
            exclude_ports,
            dry_run,
            iptables,
        } => {
            let options = agent_reach::intercept::Options {
                agent_ports,
                inbound_port,
                proxy_uid,
                exclude_ports,
                dry_run,
                iptables,
            };
            match agent_reach::intercept::run(&options, &mut std::io::stdout().lock()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("init-net: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::MockAgent {
            listen,
            name,
            log,
            latency,
            sse_events,
            sse_interval,
        } => {
            let mut config = agent_reach::mock_agent::MockConfig::new(&name);
            config.latency = latency;
            config.sse_events = sse_events;
            config.sse_interval = sse_interval.get();
            mock_agent(listen, config, log.as_deref())
        }
        Command::Baseline {
            action:
                BaselineAction::Record {
                    config,
                    policy,
                    capability,
                },
        } => record_baselines(&config, policy.as_deref(), capability.as_deref()),
        Command::Demo {
            duration,
            concurrency,
            json,
        } => {
            init_tracing("warn", LogFormat::Text);
            demo_command(duration, concurrency, json)
        }
    }
}

fn dev_certs(out: &Path, trust_domain: &str, namespace: &str, names: &[String]) -> ExitCode {
    let issued = agent_reach::pki::DevCa::new("agent-reach dev CA").and_then(|ca| {
        names
            .iter()
            .map(|name| {
                let id = format!("spiffe://{trust_domain}/ns/{namespace}/sa/{name}");
                agent_reach::identity::SpiffeId::parse(&id)
                    .map_err(agent_reach::pki::PkiError::BadUri)?;
                ca.write_files(&out.join(name), &id)
                    .map(|files| (id, files))
            })
            .collect::<Result<Vec<_>, _>>()
    });
    match issued {
        Ok(issued) => {
            for (id, files) in issued {
                println!(
                    "{id}: {} {} {}",
                    files.cert.display(),
                    files.key.display(),
                    files.ca.display()
                );
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("{err}");
            ExitCode::FAILURE
        }
    }
}

fn check(files: &[PathBuf]) -> ExitCode {
    let mut failed = false;
    let (mut bootstraps, mut policies) = (Vec::new(), Vec::new());
    for file in files {
        match check_file(file) {
            Ok((summary, parsed)) => {
                println!("{}: ok ({summary})", file.display());
                match parsed {
                    Some(Parsed::Bootstrap(b)) => bootstraps.push((file, b)),
                    Some(Parsed::Policy(p)) => policies.push((file, p)),
                    None => {}
                }
            }
            Err(err) => {
                eprintln!("{err}");
                failed = true;
            }
        }
    }
    // What holds only for a bootstrap and a policy together.
    for (bootstrap_file, bootstrap) in &bootstraps {
        for (policy_file, policy) in &policies {
            for warning in config::warnings::warnings(bootstrap, policy) {
                eprintln!(
                    "warning: {} with {}: {warning}",
                    bootstrap_file.display(),
                    policy_file.display()
                );
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// A file `check` read, kept for the checks that need a bootstrap and a policy together.
enum Parsed {
    Bootstrap(Box<config::Bootstrap>),
    Policy(Box<config::Policy>),
}

/// Validates one file of any kind: a bootstrap (and the TLS files it names), a policy, or the
/// injector's.
fn check_file(path: &Path) -> Result<(String, Option<Parsed>), String> {
    let text = config::read_file(path).map_err(|e| e.to_string())?;
    let kind = config::detect_kind(path, &text).map_err(|e| e.to_string())?;
    let mut summary = kind.as_str().to_owned();
    match kind {
        FileKind::Bootstrap => {
            let bootstrap = config::parse_bootstrap(path, &text).map_err(|e| e.to_string())?;
            if let Some(golden) = check_baselines(path, &bootstrap)? {
                summary = format!("{summary}; {golden}");
            }
            if let Some(files) = &bootstrap.tls {
                let tls = check_tls(&files.resolved(path.parent()))
                    .map_err(|e| format!("{}: tls: {e}", path.display()))?;
                summary = format!("{summary}; {tls}");
            }
            if let Some(tasks) = &bootstrap.tasks {
                let location = tasks
                    .resolved(path.parent())
                    .location()
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                summary = match location {
                    config::StoreLocation::File(file) => {
                        format!("{summary}; tasks in {}", file.display())
                    }
                    config::StoreLocation::Redis(_) => format!("{summary}; tasks in Redis"),
                };
            }
            return Ok((summary, Some(Parsed::Bootstrap(Box::new(bootstrap)))));
        }
        FileKind::Policy => {
            let policy = config::parse_policy(path, &text).map_err(|e| e.to_string())?;
            if let Some(note) = check_escalation(path, &policy)? {
                summary = format!("{summary}; {note}");
            }
            return Ok((summary, Some(Parsed::Policy(Box::new(policy)))));
        }
        FileKind::Injector => drop(InjectorConfig::parse(path, &text).map_err(|e| e.to_string())?),
    }
    Ok((summary, None))
}

/// The escalation settings as the runner will use them: a webhook URL it can POST to, a key
/// file it can read.
fn check_escalation(path: &Path, policy: &config::Policy) -> Result<Option<String>, String> {
    let escalation = &policy.escalation;
    if let Some(url) = &escalation.webhook {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("{}: escalation.webhook `{url}`: {e}", path.display()))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(format!(
                "{}: escalation.webhook `{url}` is not an http:// or https:// URL",
                path.display()
            ));
        }
    }
    if let Some(key) = escalation.key_path(path.parent()) {
        std::fs::metadata(&key).map_err(|e| {
            format!(
                "{}: escalation.key_file {}: {e}",
                path.display(),
                key.display()
            )
        })?;
    }
    let escalates = policy.retry.fallback.final_fallback == config::FinalFallback::Escalate;
    Ok(match (escalates, &escalation.webhook) {
        (true, None) => Some(
            "final_fallback: escalate without escalation.webhook: escalated tasks wait for `agent-reach tasks`"
                .to_owned(),
        ),
        (true, Some(_)) => Some("escalations go to the webhook".to_owned()),
        _ => None,
    })
}

/// The TLS files as the sidecar would load them (readable, key matching the certificate, a
/// SPIFFE URI SAN, a usable trust bundle), and the certificate's validity now.
fn check_tls(files: &config::TlsFiles) -> Result<String, String> {
    const DAY: i64 = 24 * 3600;
    let checked = agent_reach::transport::mtls::check(files).map_err(|e| e.to_string())?;
    if checked.expires_in <= 0 {
        return Err(format!(
            "{}: the certificate of {} expired {} days ago",
            files.cert.display(),
            checked.identity,
            -checked.expires_in / DAY
        ));
    }
    if checked.valid_in > 0 {
        return Err(format!(
            "{}: the certificate of {} is not valid for another {} s",
            files.cert.display(),
            checked.identity,
            checked.valid_in
        ));
    }
    // cert-manager renews at two thirds of a certificate's life: past that, it is late.
    let lifetime = (checked.expires_in - checked.valid_in).max(1);
    let soon = if checked.expires_in * 3 < lifetime {
        " — past two thirds of its life: is its renewal running?"
    } else {
        ""
    };
    let left = if checked.expires_in >= DAY {
        format!("{} days", checked.expires_in / DAY)
    } else {
        format!("{} min", checked.expires_in / 60)
    };
    Ok(format!(
        "tls identity {}, certificate expires in {left}{soon}",
        checked.identity
    ))
}

fn run(paths: ConfigPaths, worker_threads: Option<usize>) -> ExitCode {
    let inline = std::env::var("AGENT_REACH_BOOTSTRAP").ok();
    let store = match ConfigStore::load(paths, inline.as_deref()) {
        Ok(store) => Arc::new(store),
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match runtime(worker_threads) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let code = runtime.block_on(async move {
        let sidecar = match Sidecar::start(store).await {
            Ok(s) => s,
            Err(err) => {
                eprintln!("{err}");
                return ExitCode::FAILURE;
            }
        };
        let signal = shutdown_signal().await;
        tracing::info!(signal, "shutting down");
        // A second signal during the drain exits at once.
        tokio::select! {
            _ = sidecar.shutdown() => ExitCode::SUCCESS,
            second = shutdown_signal() => {
                tracing::warn!(signal = second, "second signal: exiting without finishing the drain");
                ExitCode::FAILURE
            }
        }
    });
    // Everything that matters has drained; a blocking task stuck in a system call (a DNS
    // lookup, say) must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    code
}

#[cfg(unix)]
async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        },
        _ => {
            let _ = tokio::signal::ctrl_c().await;
            "ctrl-c"
        }
    }
}

#[cfg(not(unix))]
async fn shutdown_signal() -> &'static str {
    let _ = tokio::signal::ctrl_c().await;
    "ctrl-c"
}

fn inject(config: &std::path::Path, file: Option<&std::path::Path>, namespace: &str) -> ExitCode {
    let config = match InjectorConfig::load(config) {
        Ok(c) => c,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(file) = file {
        let text = if file == std::path::Path::new("-") {
            std::io::read_to_string(std::io::stdin())
        } else {
            std::fs::read_to_string(file)
        };
        let text = match text {
            Ok(t) => t,
            Err(err) => {
                eprintln!("{}: cannot read: {err}", file.display());
                return ExitCode::FAILURE;
            }
        };
        return match inject_manifests(&config, &text, namespace) {
            Ok((out, n)) => {
                print!("{out}");
                eprintln!("{}: {n} pod template(s) injected", file.display());
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("{}: {err}", file.display());
                ExitCode::FAILURE
            }
        };
    }
    let runtime = match runtime(None) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        let injector = match Injector::start(config).await {
            Ok(i) => i,
            Err(err) => {
                eprintln!("{err}");
                return ExitCode::FAILURE;
            }
        };
        let signal = shutdown_signal().await;
        tracing::info!(signal, "shutting down");
        injector.shutdown().await;
        ExitCode::SUCCESS
    })
}

fn run_hook(hook: Hook) -> ExitCode {
    match hook {
        Hook::PreStop { delay } => {
            std::thread::sleep(delay.get());
            ExitCode::SUCCESS
        }
        Hook::PostStart { admin, timeout } => {
            let deadline = std::time::Instant::now() + timeout.get();
            while std::time::Instant::now() < deadline {
                if live(admin) {
                    return ExitCode::SUCCESS;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            eprintln!("the sidecar did not answer http://{admin}/live within {timeout}");
            ExitCode::FAILURE
        }
    }
}

/// One blocking `GET /live` (no runtime needed for a hook).
fn live(admin: std::net::SocketAddr) -> bool {
    use std::io::{Read, Write};
    let timeout = std::time::Duration::from_millis(500);
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&admin, timeout) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let request = format!("GET /live HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.ends_with(b" 200")
}

/// `agent-reach baseline record`: one answer per golden task, written where the task's
/// `baseline` says.
fn record_baselines(config: &Path, policy: Option<&Path>, only: Option<&str>) -> ExitCode {
    let loaded = config::load_bootstrap(config).and_then(|bootstrap| {
        let policy = policy.map(config::load_policy).transpose()?;
        Ok((bootstrap, policy.unwrap_or_default()))
    });
    let (bootstrap, policy) = match loaded {
        Ok(loaded) => loaded,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::FAILURE;
        }
    };
    let snapshot = config::Snapshot::new(bootstrap, policy, 0);
    let chosen: Vec<_> = snapshot
        .bootstrap
        .agent
        .capabilities
        .iter()
        .filter(|c| c.quality.is_some() && only.is_none_or(|n| c.name.as_str() == n))
        .collect();
    if chosen.is_empty() {
        eprintln!(
            "{}: no capability{} has golden tasks (`quality:`)",
            config.display(),
            only.map(|n| format!(" named `{n}`")).unwrap_or_default()
        );
        return ExitCode::FAILURE;
    }
    let runtime = match runtime(Some(1)) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let failed = runtime.block_on(async {
        let client = agent_reach::http::client::AgentClient::new(&snapshot.policy);
        let mut failed = false;
        for capability in &chosen {
            let Some(spec) = &capability.quality else {
                continue;
            };
            for written in agent_reach::quality::record(&client, &snapshot, capability, spec).await
            {
                match written {
                    Ok(path) => println!("{}: wrote {}", capability.name, path.display()),
                    Err(err) => {
                        eprintln!("{}: {err}", capability.name);
                        failed = true;
                    }
                }
            }
        }
        failed
    });
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Every golden task's baseline as a run would read it: present, readable, JSON where compared
/// as JSON. All problems at once, so one `check` lists every baseline still to record.
fn check_baselines(path: &Path, bootstrap: &config::Bootstrap) -> Result<Option<String>, String> {
    let mut tasks = 0usize;
    let mut problems = Vec::new();
    for capability in &bootstrap.agent.capabilities {
        for task in capability.quality.iter().flat_map(|q| &q.tasks) {
            tasks += 1;
            if let Err(err) = agent_reach::quality::check_baseline(task) {
                problems.push(format!(
                    "{}: agent.capabilities[`{}`].quality: {err}",
                    path.display(),
                    capability.name
                ));
            }
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("\n"));
    }
    Ok((tasks > 0).then(|| format!("{tasks} golden task(s) with their baselines")))
}

fn mock_agent(
    listen: std::net::SocketAddr,
    config: agent_reach::mock_agent::MockConfig,
    log: Option<&std::path::Path>,
) -> ExitCode {
    use agent_reach::mock_agent::{MockAgent, Workload};
    let runtime = match runtime(Some(1)) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let name = config.name.clone();
    runtime.block_on(async {
        let started = match log {
            Some(log) => MockAgent::start_logged(listen, config, Workload::default(), log).await,
            None => MockAgent::start(listen, config).await,
        };
        match started {
            Ok(agent) => {
                println!("mock agent `{name}` on http://{}", agent.addr);
                agent.crashed().await;
                ExitCode::FAILURE
            }
            Err(err) => {
                eprintln!("mock agent: {listen}: {err}");
                ExitCode::FAILURE
            }
        }
    })
}

fn demo_command(duration: HumanDuration, concurrency: usize, json: bool) -> ExitCode {
    let runtime = match runtime(None) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let options = demo::DemoOptions {
        duration: duration.get(),
        concurrency,
    };
    match runtime.block_on(demo::run(options)) {
        Ok(summary) => {
            if json {
                match serde_json::to_string_pretty(&summary) {
                    Ok(text) => println!("{text}"),
                    Err(err) => {
                        eprintln!("cannot encode the summary: {err}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                print!("{}", demo::render_table(&summary));
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("demo failed: {err}");
            ExitCode::FAILURE
        }
    }
}

fn runtime(worker_threads: Option<usize>) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = worker_threads {
        builder.worker_threads(n.max(1));
    }
    builder.enable_all().build().map_err(|err| {
        eprintln!("cannot start the runtime: {err}");
        ExitCode::FAILURE
    })
}

/// How log lines are written (`--log-format`, `AGENT_REACH_LOG_FORMAT`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogFormat {
    /// `--log-json` (kept for existing manifests) asks for JSON whatever the format says.
    fn or_json(self, log_json: bool) -> Self {
        if log_json {
            LogFormat::Json
        } else {
            self
        }
    }
}

fn init_tracing(filter: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(filter))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a person at a terminal; a pipe or a log collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    if format == LogFormat::Json {
        // One object per line, the event's fields at the top level beside level, target and
        // timestamp, so a collector indexes `capability` or `chosen` without unpacking anything.
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init();
    } else {
        builder.init();
    }
}
