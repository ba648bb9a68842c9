//! A test that cannot run here says so, loudly: on stderr, and in `target/skipped-tests.txt`,
//! which `.ci/run` prints after the suite (one line per skip: a local green run shows what it
//! did not check). Under `CI` a missing tool fails the test instead: CI installs every tool
//! (`.ci/run`), so a skip there means a check silently lost. Only what the kernel refuses
//! (network namespaces in a sandbox) may skip in CI.

use std::io::Write;
use std::path::PathBuf;

/// Whether a skip is allowed in CI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InCi {
    /// The tool should be there: in CI the test fails.
    Fails,
    /// The kernel refuses (no network namespaces in this sandbox): a skip everywhere.
    Skips,
}

fn record() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"),
        PathBuf::from,
    );
    target.join("skipped-tests.txt")
}

/// `what` cannot run here, because `why`.
pub fn skip(what: &str, why: &str, in_ci: InCi) {
    if in_ci == InCi::Fails && std::env::var_os("CI").is_some() {
        panic!("{what} cannot run: {why} (CI is set: a missing tool fails the run, see .ci/run)");
    }
    eprintln!("SKIPPED {what}: {why}");
    let line = format!("SKIPPED {what}: {why}\n");
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(record())
    {
        let _ = file.write_all(line.as_bytes());
    }
}
