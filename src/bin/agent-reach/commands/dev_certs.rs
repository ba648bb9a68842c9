//! `agent-reach dev-certs`: a throwaway CA and a SPIFFE workload certificate per name, for mutual
//! TLS between sidecars run by hand (a cluster gets them from cert-manager: docs/kubernetes.md).

use std::path::PathBuf;
use std::process::ExitCode;

use agent_reach::identity::SpiffeId;
use agent_reach::pki::{DevCa, PkiError};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
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
}

pub(crate) fn run(args: Args) -> ExitCode {
    let Args {
        out,
        trust_domain,
        namespace,
        names,
    } = args;
    let issued = DevCa::new("agent-reach dev CA").and_then(|ca| {
        names
            .iter()
            .map(|name| {
                let id = format!("spiffe://{trust_domain}/ns/{namespace}/sa/{name}");
                SpiffeId::parse(&id).map_err(PkiError::BadUri)?;
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
