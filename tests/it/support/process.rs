//! A sidecar run as its own process (the built binary), to be killed with SIGKILL and started
//! again on the same files: what a crash and a container restart look like.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_agent-reach");

pub struct SidecarProcess {
    child: Child,
    pub outbound: SocketAddr,
    pub inbound: SocketAddr,
    pub admin: SocketAddr,
    pub log: Receiver<String>,
}

/// Reads a bound address from the sidecar's start-up log line.
fn bound_addr(line: &str, key: &str) -> Option<SocketAddr> {
    let start = line.find(&format!("{key}="))? + key.len() + 1;
    line[start..].split_whitespace().next()?.parse().ok()
}

impl SidecarProcess {
    /// Starts `agent-reach run` on the files and waits for its start-up line.
    pub fn start(bootstrap: &Path, policy: Option<&Path>, env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(BIN);
        command.args(["run", "--config"]).arg(bootstrap);
        if let Some(policy) = policy {
            command.arg("--policy").arg(policy);
        }
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let (tx, log) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        loop {
            let Ok(line) = log.recv_timeout(Duration::from_secs(30)) else {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the sidecar did not log its start");
            };
            if let (Some(outbound), Some(inbound), Some(admin)) = (
                bound_addr(&line, "outbound"),
                bound_addr(&line, "inbound"),
                bound_addr(&line, "admin"),
            ) {
                return Self {
                    child,
                    outbound,
                    inbound,
                    admin,
                    log,
                };
            }
        }
    }

    /// SIGKILL: no drain, no goodbye, nothing flushed.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for SidecarProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
