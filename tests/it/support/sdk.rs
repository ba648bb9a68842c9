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
    installed("tests/sdk/venv.sh", "the Python SDK tests").await
}

/// The directory `tests/sdk/js/install.sh` installs the JS SDKs and scripts into; `None` when
/// Node or the npm registry is missing.
pub async fn js_sdks() -> Option<PathBuf> {
    installed("tests/sdk/js/install.sh", "tests/it/sdk_js.rs").await
}

/// What an install script names on its last line; `None` (a loud skip, `skip.rs`) on its exit
/// code 3, which says the package index or the toolchain is missing.
async fn installed(script: &'static str, what: &'static str) -> Option<PathBuf> {
    // A first install takes half a minute: off the runtime's threads.
    let out = tokio::task::spawn_blocking(move || {
        Command::new("bash")
            .arg(repo().join(script))
            .current_dir(repo())
            .output()
            .unwrap_or_else(|e| panic!("bash runs {script}: {e}"))
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {
            let stdout = String::from_utf8_lossy(&out.stdout);
            let last = stdout
                .lines()
                .last()
                .unwrap_or_else(|| panic!("{script} names nothing"));
            Some(PathBuf::from(last.trim()))
        }
        Some(3) => {
            let why = format!("{script} cannot install: {}", stderr.trim());
            super::skip::skip(what, &why, super::skip::InCi::Fails);
            None
        }
        _ => panic!("{script} failed ({}): {stderr}", out.status),
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
