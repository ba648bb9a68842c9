//! Transparent inbound interception: `agent-reach init-net` redirects TCP connections to the
//! agent's ports from outside the pod to the sidecar's inbound listener, and the listener tells
//! such a connection apart by its original destination ([`original_dst`]).
//!
//! Why: work that does not come through a sidecar (an orchestrator, a UI, a cron job calling the
//! agent's Service) would otherwise never be admitted, measured or counted, and the sidecar's
//! picture of its agent would be wrong exactly when the agent is busiest. Why an init container
//! and not a CNI plugin, and what it needs: `docs/kubernetes.md`, "Inbound interception".
//!
//! Only inbound, only IPv4 (`iptables`, not `ip6tables`), only the nat table's PREROUTING hook:
//! see [`rules`] for why no loop is possible. The sidecar's UID (`--proxy-uid`) matters to rules
//! on OUTPUT, which inbound interception does not install; the flag keeps the injector, the
//! sidecar's `runAsUser` and the rules on one number for when outbound rules come.

pub(crate) mod original_dst;
pub mod rules;

use std::io::Write;
use std::process::Command;

pub(crate) use original_dst::intercepted;
use rules::{Backend, Plan, PlanError, Probe, Rule};

/// The sidecar's fixed UID when intercepting (the injector runs it as this user).
pub const DEFAULT_PROXY_UID: u32 = 2102;

/// What `init-net` was asked to do.
#[derive(Clone, Debug)]
pub struct Options {
    pub agent_ports: Vec<u16>,
    pub inbound_port: u16,
    pub proxy_uid: u32,
    pub exclude_ports: Vec<u16>,
    /// Source networks (IPv4 CIDRs) never redirected.
    pub exclude_cidrs: Vec<String>,
    pub dry_run: bool,
    /// The iptables binary to use instead of detecting one (`iptables-nft`, `iptables-legacy`,
    /// or a path).
    pub iptables: Option<String>,
}

/// Why `init-net` did not finish; the pod must not start half-intercepted, so any of these fails
/// the init container.
#[derive(Debug, thiserror::Error)]
pub enum InitNetError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("neither iptables-nft nor iptables-legacy can list the nat table (is NET_ADMIN granted?); pass --iptables to name one")]
    NoBackend,
    #[error("{binary}: cannot run it: {source}")]
    Spawn {
        binary: String,
        source: std::io::Error,
    },
    #[error("`{binary} {rule}` failed ({status}): {stderr}")]
    Failed {
        binary: String,
        rule: String,
        status: String,
        stderr: String,
    },
    #[error("writing the rules: {0}")]
    Print(std::io::Error),
}

/// Runs `init-net`: prints the rules with `--dry-run`, else installs them.
pub fn run(options: &Options, out: &mut impl Write) -> Result<(), InitNetError> {
    let plan = Plan::new(
        &options.agent_ports,
        options.inbound_port,
        &options.exclude_ports,
    )?
    .excluding_sources(&options.exclude_cidrs)?;
    if options.dry_run {
        // Detection only lists tables; where iptables is missing the generic name is printed.
        let binary = options
            .iptables
            .clone()
            .or_else(|| detect().ok().map(|b| b.binary().to_owned()))
            .unwrap_or_else(|| "iptables".to_owned());
        return print(&plan, &binary, options.proxy_uid, out).map_err(InitNetError::Print);
    }
    let binary = match &options.iptables {
        Some(binary) => binary.clone(),
        None => detect()?.binary().to_owned(),
    };
    apply(&plan.for_family(false), &mut |rule| exec(&binary, rule))?;
    writeln!(
        out,
        "init-net: {binary}: ports {:?} redirected to {} (chain {})",
        plan.agent_ports,
        plan.inbound_port,
        rules::CHAIN
    )
    .map_err(InitNetError::Print)?;
    // IPv6 too, where the pod has it: required with a global address (an IPv6 or dual-stack
    // pod), best effort with only loopback and link-local ones (a node without ip6 NAT).
    if let Some(required) = ipv6_here() {
        let six = Backend::six(&binary);
        match apply(&plan.for_family(true), &mut |rule| exec(&six, rule)) {
            Ok(()) => writeln!(out, "init-net: {six}: the same for IPv6"),
            Err(err) if !required => writeln!(
                out,
                "init-net: no IPv6 rules ({err}); the pod has no global IPv6 address"
            ),
            Err(err) => return Err(err),
        }
        .map_err(InitNetError::Print)?;
    }
    Ok(())
}

/// Whether the pod has IPv6 (`/proc/net/if_inet6` lists addresses), and whether one of them is
/// global (scope 00): then its IPv6 clients must be intercepted too.
fn ipv6_here() -> Option<bool> {
    let text = std::fs::read_to_string("/proc/net/if_inet6").ok()?;
    let mut lines = text.lines().peekable();
    lines.peek()?;
    Some(lines.any(|l| l.split_whitespace().nth(3) == Some("00")))
}

fn print(plan: &Plan, binary: &str, uid: u32, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(out, "# agent-reach init-net (dry run): nothing changed")?;
    writeln!(
        out,
        "# sidecar UID {uid}: its traffic leaves through OUTPUT, which these rules do not touch"
    )?;
    writeln!(
        out,
        "# a rerun flushes {} instead of creating it, and adds the jump only when missing",
        rules::CHAIN
    )?;
    for rule in plan.for_family(false).fresh_install() {
        writeln!(out, "{binary} -w {rule}")?;
    }
    let six = Backend::six(binary);
    writeln!(out, "# where the pod has IPv6, the same through {six}")?;
    for rule in plan.for_family(true).fresh_install() {
        writeln!(out, "{six} -w {rule}")?;
    }
    Ok(())
}

/// Installs the plan idempotently through `exec`: our chain is created or flushed and refilled,
/// and the one jump into it is added only when it is missing. Nothing else is touched.
pub(crate) fn apply(
    plan: &Plan,
    exec: &mut impl FnMut(&Rule) -> Result<(), InitNetError>,
) -> Result<(), InitNetError> {
    if exec(&Rule::list_chain()).is_ok() {
        exec(&Rule::flush_chain())?;
    } else {
        exec(&Rule::new_chain())?;
    }
    for rule in plan.chain_rules() {
        exec(&rule)?;
    }
    if exec(&Rule::jump("-C")).is_err() {
        exec(&Rule::jump("-A"))?;
    }
    Ok(())
}

/// Probes both backends and picks one ([`Backend::choose`]).
fn detect() -> Result<Backend, InitNetError> {
    let probes: Vec<Probe> = [Backend::Nft, Backend::Legacy]
        .into_iter()
        .map(|backend| {
            let listing = Command::new(backend.binary())
                .args(["-w", "-t", "nat", "-S"])
                .output();
            match listing {
                Ok(out) if out.status.success() => Probe {
                    backend,
                    works: true,
                    rules: Backend::count_rules(&String::from_utf8_lossy(&out.stdout)),
                },
                _ => Probe {
                    backend,
                    works: false,
                    rules: 0,
                },
            }
        })
        .collect();
    Backend::choose(&probes).ok_or(InitNetError::NoBackend)
}

/// One iptables command; `-w` waits for the xtables lock instead of failing when another
/// writer (kube-proxy, a mesh's init) holds it.
fn exec(binary: &str, rule: &Rule) -> Result<(), InitNetError> {
    let output = Command::new(binary)
        .arg("-w")
        .args(&rule.args)
        .output()
        .map_err(|source| InitNetError::Spawn {
            binary: binary.to_owned(),
            source,
        })?;
    if output.status.success() {
        return Ok(());
    }
    Err(InitNetError::Failed {
        binary: binary.to_owned(),
        rule: rule.to_string(),
        status: output.status.to_string(),
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A fake iptables: which chains exist and which jump is there, and every call made.
    #[derive(Default)]
    struct Tables {
        chain: bool,
        jump: bool,
        calls: Vec<String>,
    }

    impl Tables {
        fn exec(&mut self, rule: &Rule) -> Result<(), InitNetError> {
            let text = rule.to_string();
            self.calls.push(text.clone());
            let refuse = || InitNetError::NoBackend;
            match rule.args[2].as_str() {
                "-S" if !self.chain => Err(refuse()),
                "-N" => {
                    self.chain = true;
                    Ok(())
                }
                "-C" if !self.jump => Err(refuse()),
                "-A" if text.contains("PREROUTING") => {
                    self.jump = true;
                    Ok(())
                }
                _ => Ok(()),
            }
        }
    }

    #[test]
    fn a_rerun_flushes_and_adds_no_second_jump() {
        let plan = Plan::new(&[8080], 4143, &[]).unwrap();
        let mut tables = Tables::default();
        apply(&plan, &mut |r| tables.exec(r)).unwrap();
        assert!(tables
            .calls
            .contains(&"-t nat -N AGENT_REACH_INBOUND".to_owned()));
        assert!(tables.jump);
        tables.calls.clear();
        apply(&plan, &mut |r| tables.exec(r)).unwrap();
        assert!(tables
            .calls
            .contains(&"-t nat -F AGENT_REACH_INBOUND".to_owned()));
        assert!(!tables.calls.iter().any(|c| c.contains("-N ")));
        assert!(!tables.calls.iter().any(|c| c.contains("-A PREROUTING")));
    }

    #[test]
    fn a_dry_run_prints_every_rule_and_runs_nothing() {
        let options = Options {
            agent_ports: vec![8080],
            inbound_port: 4143,
            proxy_uid: DEFAULT_PROXY_UID,
            exclude_ports: vec![],
            exclude_cidrs: vec![],
            dry_run: true,
            iptables: Some("/nonexistent/iptables".to_owned()),
        };
        let mut out = Vec::new();
        run(&options, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains(
            "/nonexistent/iptables -w -t nat -A AGENT_REACH_INBOUND -p tcp --dport 8080 -j REDIRECT --to-ports 4143"
        ));
        assert!(text.contains(
            "/nonexistent/iptables -w -t nat -A PREROUTING -p tcp -j AGENT_REACH_INBOUND"
        ));
    }
}
