//! `agent-reach hook`: container lifecycle hooks for the plain-container sidecar (images have no
//! shell).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use agent_reach::config::HumanDuration;

use super::parse_duration;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    #[command(subcommand)]
    hook: Hook,
}

#[derive(clap::Subcommand, Debug)]
enum Hook {
    /// Wait until the sidecar answers `/live`, so the agent starts with a way out.
    PostStart {
        #[arg(long, default_value = "127.0.0.1:4191")]
        admin: SocketAddr,
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        timeout: HumanDuration,
    },
    /// Hold the sidecar's SIGTERM back while the agent finishes its last calls.
    PreStop {
        #[arg(long, default_value = "5s", value_parser = parse_duration)]
        delay: HumanDuration,
    },
}

pub(crate) fn run(args: Args) -> ExitCode {
    match args.hook {
        Hook::PreStop { delay } => {
            std::thread::sleep(delay.get());
            ExitCode::SUCCESS
        }
        Hook::PostStart { admin, timeout } => {
            let deadline = Instant::now() + timeout.get();
            while Instant::now() < deadline {
                if live(admin) {
                    return ExitCode::SUCCESS;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            eprintln!("the sidecar did not answer http://{admin}/live within {timeout}");
            ExitCode::FAILURE
        }
    }
}

/// One blocking `GET /live` (no runtime needed for a hook).
fn live(admin: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let timeout = Duration::from_millis(500);
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
