//! `agent-reach inject`: the admission webhook that adds the sidecar to annotated pods, or, with
//! `--file`, the same change made to the pods of a manifest file.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use agent_reach::inject::{inject_manifests, Injector, InjectorConfig};

use super::{runtime, shutdown_signal, Logging};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
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
    #[command(flatten)]
    logging: Logging,
}

pub(crate) fn run(args: Args) -> ExitCode {
    args.logging.init();
    let config = match InjectorConfig::load(&args.config) {
        Ok(c) => c,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(file) = &args.file {
        return inject_file(&config, file, &args.namespace);
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

/// `--file`: the manifest's pod templates injected, printed to stdout (`-` reads stdin).
fn inject_file(config: &InjectorConfig, file: &Path, namespace: &str) -> ExitCode {
    let text = if file == Path::new("-") {
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
    match inject_manifests(config, &text, namespace) {
        Ok((out, n)) => {
            print!("{out}");
            eprintln!("{}: {n} pod template(s) injected", file.display());
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("{}: {err}", file.display());
            ExitCode::FAILURE
        }
    }
}
