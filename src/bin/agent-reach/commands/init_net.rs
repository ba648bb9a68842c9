//! `agent-reach init-net`: the pod's inbound interception rules (iptables nat PREROUTING), run as
//! the init container.

use std::process::ExitCode;

use agent_reach::intercept::{self, Options, DEFAULT_PROXY_UID};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The agent's ports, comma separated: connections to them are redirected.
    #[arg(long, required = true, value_delimiter = ',')]
    agent_ports: Vec<u16>,
    /// The sidecar's inbound listener port.
    #[arg(long, default_value_t = 4143)]
    inbound_port: u16,
    /// The UID the sidecar runs as (the injector sets `runAsUser` to it).
    #[arg(long, default_value_t = DEFAULT_PROXY_UID)]
    proxy_uid: u32,
    /// Ports never redirected, comma separated.
    #[arg(long, value_delimiter = ',')]
    exclude_ports: Vec<u16>,
    /// Source networks never redirected (IPv4 CIDRs), comma separated.
    #[arg(long, value_delimiter = ',')]
    exclude_cidrs: Vec<String>,
    /// Print the rules and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// The iptables binary (`iptables-nft`, `iptables-legacy` or a path) instead of
    /// detecting the backend the pod's tables use.
    #[arg(long)]
    iptables: Option<String>,
}

pub(crate) fn run(args: Args) -> ExitCode {
    let options = Options {
        agent_ports: args.agent_ports,
        inbound_port: args.inbound_port,
        proxy_uid: args.proxy_uid,
        exclude_ports: args.exclude_ports,
        exclude_cidrs: args.exclude_cidrs,
        dry_run: args.dry_run,
        iptables: args.iptables,
    };
    match intercept::run(&options, &mut std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("init-net: {err}");
            ExitCode::FAILURE
        }
    }
}
