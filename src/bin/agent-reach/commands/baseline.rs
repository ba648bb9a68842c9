//! `agent-reach baseline record`: one answer per golden task (`quality:` on a capability),
//! written where the task's `baseline` says.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use agent_reach::config;

use super::runtime;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
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

pub(crate) fn run(args: Args) -> ExitCode {
    let Action::Record {
        config,
        policy,
        capability,
    } = args.action;
    record(&config, policy.as_deref(), capability.as_deref())
}

fn record(config: &Path, policy: Option<&Path>, only: Option<&str>) -> ExitCode {
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
