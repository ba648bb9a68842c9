//! The `agent-reach` command. The library is the sidecar (and the injector, `agent_reach::inject`);
//! this binary adds the subcommands (`commands/`, one file each) and the blocking client of the
//! terminal commands (`blocking.rs`). The demo and the mock agent are crates of their own
//! (`examples/demo`, `examples/testkit`).

mod blocking;
mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use commands::{
    baseline, check, dev_certs, hook, init_net, inject as inject_cmd, run, status, tasks,
};

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
    Run(run::Args),
    /// Validate bootstrap, policy and injector files; exit 1 naming file:line:col of the first
    /// error in each.
    Check(check::Args),
    /// The admission webhook that adds the sidecar to annotated pods (HTTPS); with `--file`,
    /// inject the pods in a manifest file and print it (`-` reads stdin).
    Inject(inject_cmd::Args),
    /// Write a throwaway CA and a SPIFFE workload certificate per name, for mutual TLS between
    /// sidecars run by hand (a cluster gets them from cert-manager: docs/kubernetes.md).
    DevCerts(dev_certs::Args),
    /// This agent and its peers as a sidecar sees them, one line per peer, from its admin port.
    Status(status::Args),
    /// A sidecar's async tasks, from its outbound port: list, show, retry or resolve them.
    Tasks(tasks::Args),
    /// Redirect TCP connections to the agent's ports from outside the pod to the sidecar's
    /// inbound listener (iptables nat PREROUTING; run as the pod's init container, needs
    /// NET_ADMIN and NET_RAW). Rerunning replaces its own chain, nothing else.
    InitNet(init_net::Args),
    /// Container lifecycle hooks for the plain-container sidecar (images have no shell).
    #[command(hide = true)]
    Hook(hook::Args),
    /// Golden-task baselines (`quality:` on a capability).
    Baseline(baseline::Args),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Run(args) => run::run(args),
        Command::Check(args) => check::run(args),
        Command::Inject(args) => inject_cmd::run(args),
        Command::DevCerts(args) => dev_certs::run(args),
        Command::Status(args) => status::run(args),
        Command::Tasks(args) => tasks::run(args),
        Command::InitNet(args) => init_net::run(args),
        Command::Hook(args) => hook::run(args),
        Command::Baseline(args) => baseline::run(args),
    }
}
