//! The vendors' SDKs as test processes: the pinned Python venv (`tests/sdk/venv.sh`) and Node
//! packages (`tests/sdk/js/install.sh`), and a process whose stdout lines are JSON.
//! An SDK that cannot be installed skips its test loudly (`skip.rs`), and fails it in CI.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's python, built by `tests/sdk/venv.sh` if needed; `None` when the index is
/// unreachable (its exit code 3).
pub async fn venv_python() -> Option<PathBuf> {
    // A first build takes half a minute: off the runtime's threads.
    let out = tokio::task::spawn_blocking(|| {
        Command::new("bash")
            .arg(repo().join("tests/sdk/venv.sh"))
            .current_dir(repo())
            .output()
            .expect("bash runs tests/sdk/venv.sh")
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {
            let stdout = String::from_utf8_lossy(&out.stdout);
            let python = stdout.lines().last().expect("venv.sh names python");
            Some(PathBuf::from(python.trim()))
        }
        Some(3) => {
            let why = format!("the SDK venv cannot be built: {}", stderr.trim());
            super::skip::skip("the Python SDK tests", &why, super::skip::InCi::Fails);
            None
        }
        _ => panic!("tests/sdk/venv.sh failed ({}): {stderr}", out.status),
    }
}

/// A Python process, killed when dropped; its stdout read line by line, its stderr kept in a log
/// file whose tail a failure shows.
pub struct Sdk {
    child: Child,
    lines: UnboundedReceiver<String>,
    log: PathBuf,
}

impl Sdk {
    /// `program` (a venv's python, or node) running `script` with `args`; its stderr in
    /// `logs/<name>.log`.
    pub fn spawn(program: &Path, script: &Path, args: &[&str], logs: &Path, name: &str) -> Self {
        let log = logs.join(format!("{name}.log"));
        let mut child = Command::new(program)
            .arg(script)
            .args(args)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = unbounded_channel();
        // Tokio's `process` feature is not enabled: a thread reads the pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Sdk { child, lines, log }
    }

    /// The next stdout line as JSON, within `within`; a failure shows the process' stderr.
    pub async fn next_json(&mut self, within: Duration, what: &str) -> Value {
        match tokio::time::timeout(within, self.lines.recv()).await {
            Ok(Some(line)) => serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {line}\n{}", self.stderr())),
            Ok(None) => panic!("{what}: the process ended\n{}", self.stderr()),
            Err(_) => panic!("{what}: nothing within {within:?}\n{}", self.stderr()),
        }
    }

    pub fn say(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    pub fn stderr(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(40)..].join("\n");
        format!("--- {} ---\n{tail}", self.log.display())
    }

    /// SIGKILL: the agent crashes, nothing said to anyone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Sdk {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The directory `tests/sdk/js/install.sh` installs the JS SDKs and scripts into; `None` (said
/// on stdout) when Node or the npm registry is missing outside CI.
pub async fn js_sdks() -> Option<PathBuf> {
    let out = tokio::task::spawn_blocking(|| {
        Command::new("bash")
            .arg(repo().join("tests/sdk/js/install.sh"))
            .current_dir(repo())
            .output()
            .expect("bash runs tests/sdk/js/install.sh")
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {
            let stdout = String::from_utf8_lossy(&out.stdout);
            let dir = stdout
                .lines()
                .last()
                .expect("install.sh names its directory");
            Some(PathBuf::from(dir.trim()))
        }
        Some(3) if std::env::var_os("CI").is_none() => {
            println!(
                "skipping: the JS SDKs cannot be installed: {}",
                stderr.trim()
            );
            None
        }
        _ => panic!("tests/sdk/js/install.sh failed ({}): {stderr}", out.status),
    }
}
