//! The binaries the process fleets run: the sidecar (`agent-reach`) and the mock agent
//! (`mock-agent`), found in the target directory of the test or bench that is running.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The sidecar binary under test: `BENCH_BINARY` when set (another build, e.g. of an older
/// commit), else the one cargo built beside the running test or bench.
pub fn sidecar() -> PathBuf {
    std::env::var_os("BENCH_BINARY").map_or_else(|| profile_dir().join("agent-reach"), Into::into)
}

/// The `mock-agent` binary of this package, built for the running profile. `cargo test
/// --workspace` builds it before any test runs (this package's `tests/mock_agent.rs` needs it);
/// a run of another package's tests or benches alone does not, so it is built here the first
/// time it is missing.
pub fn mock_agent() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let path = profile_dir().join("mock-agent");
            if !path.exists() {
                build_mock_agent(&path);
            }
            path
        })
        .clone()
}

/// `target/<profile>`: the running executable is `target/<profile>/deps/<name>-<hash>`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let deps = exe.parent().unwrap_or(Path::new("."));
    match deps.file_name().is_some_and(|n| n == "deps") {
        true => deps.parent().unwrap_or(deps).to_path_buf(),
        false => deps.to_path_buf(),
    }
}

fn build_mock_agent(path: &Path) {
    let profile = match profile_dir().file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_owned(),
        Some(other) => other.to_owned(),
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            "agent-reach-testkit",
            "--bin",
            "mock-agent",
        ])
        .args(["--profile", &profile])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status();
    match status {
        Ok(s) if s.success() && path.exists() => {}
        other => panic!(
            "cannot build the mock agent at {}: {other:?}",
            path.display()
        ),
    }
}
