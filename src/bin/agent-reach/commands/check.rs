//! `agent-reach check FILE…`: each file validated as the sidecar (or the injector) would load it,
//! then what holds only for a bootstrap and a policy together. Exit 1 naming file:line:col of
//! the first error in each file. The per-file checks are `agent_reach::config::check`; the TLS
//! files, the golden tasks' baselines and the injector's file are checked here, by the modules
//! that load them.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use agent_reach::config::{self, check::Parsed, Bootstrap, TlsFiles};

use agent_reach::inject::InjectorConfig;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

pub(crate) fn run(args: Args) -> ExitCode {
    let mut failed = false;
    let (mut bootstraps, mut policies) = (Vec::new(), Vec::new());
    for file in &args.files {
        match check_file(file) {
            Ok((summary, parsed)) => {
                println!("{}: ok ({summary})", file.display());
                match parsed {
                    Parsed::Bootstrap(b) => bootstraps.push((file, b)),
                    Parsed::Policy(p) => policies.push((file, p)),
                    Parsed::Injector(_) => {}
                }
            }
            Err(err) => {
                eprintln!("{err}");
                failed = true;
            }
        }
    }
    for (policy_file, policy) in &policies {
        for warning in config::warnings::policy_warnings(policy) {
            eprintln!("warning: {}: {warning}", policy_file.display());
        }
    }
    for (bootstrap_file, bootstrap) in &bootstraps {
        for (policy_file, policy) in &policies {
            if let Err(err) = may_serve_its_capabilities(bootstrap_file, bootstrap, policy) {
                eprintln!(
                    "{}: with {}: {err}",
                    bootstrap_file.display(),
                    policy_file.display()
                );
                failed = true;
            }
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

/// A bootstrap's capabilities that the policy's `served_by` names must be served under an
/// identity it lists: otherwise the sidecar would not announce them, and nobody would route
/// them to its agent.
fn may_serve_its_capabilities(
    path: &Path,
    bootstrap: &Bootstrap,
    policy: &config::Policy,
) -> Result<(), String> {
    let identity = bootstrap
        .tls
        .as_ref()
        .and_then(|files| agent_reach::transport::mtls::check(&files.resolved(path.parent())).ok())
        .map(|checked| checked.identity);
    let refused: Vec<&str> = bootstrap
        .agent
        .capabilities
        .iter()
        .map(|c| c.name.as_str())
        .filter(|c| !policy.authorization.may_serve(c, identity.as_ref()))
        .collect();
    if refused.is_empty() {
        return Ok(());
    }
    Err(format!(
        "capability {} is `served_by` other identities than this sidecar's ({}): it would not be served",
        refused.join(", "),
        identity.as_ref().map_or("no tls identity", |i| i.as_str())
    ))
}

fn check_file(path: &Path) -> Result<(String, Parsed), String> {
    let checked = config::check::file(path)?;
    let mut summary = checked.summary;
    match &checked.parsed {
        Parsed::Bootstrap(bootstrap) => {
            if let Some(golden) = check_baselines(path, bootstrap)? {
                summary = format!("{summary}; {golden}");
            }
            if let Some(files) = &bootstrap.tls {
                let tls = check_tls(&files.resolved(path.parent()))
                    .map_err(|e| format!("{}: tls: {e}", path.display()))?;
                summary = format!("{summary}; {tls}");
            }
        }
        Parsed::Injector(text) => {
            InjectorConfig::parse(path, text).map_err(|e| e.to_string())?;
        }
        Parsed::Policy(_) => {}
    }
    Ok((summary, checked.parsed))
}

/// The TLS files as the sidecar would load them (readable, key matching the certificate, a
/// SPIFFE URI SAN, a usable trust bundle), and the certificate's validity now.
fn check_tls(files: &TlsFiles) -> Result<String, String> {
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

/// Every golden task's baseline as a run would read it: present, readable, JSON where compared
/// as JSON. All problems at once, so one `check` lists every baseline still to record.
fn check_baselines(path: &Path, bootstrap: &Bootstrap) -> Result<Option<String>, String> {
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
