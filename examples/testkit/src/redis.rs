//! A throwaway `redis-server` for tests: started on a free port with persistence off, killed on
//! drop. Shared by the black-box tests and the library's own store tests
//! (`src/tasks/store/redis.rs`), so there is one launcher.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a fresh server may take to answer PING.
const READY_WITHIN: Duration = Duration::from_secs(10);
/// Starts tried before giving up (another process may grab the free port first).
const ATTEMPTS: usize = 3;

pub struct RedisServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl RedisServer {
    /// A running server, or `None` (with the reason printed) when `redis-server` is not
    /// installed — the caller skips. Panics when an installed server does not come up.
    pub fn start() -> Option<Self> {
        match Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
        {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {
                // CI installs it (`.ci/run`): there a missing server fails the test
                // (`tests/it/support/skip.rs`).
                assert!(
                    std::env::var_os("CI").is_none(),
                    "redis-server is not installed, and CI is set: a missing tool fails the run"
                );
                eprintln!(
                    "skipped: redis-server is not installed (Debian: apt-get install redis-server)"
                );
                return None;
            }
            Err(e) => panic!("cannot run redis-server: {e}"),
        }
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            match Self::spawn() {
                Ok(server) => return Some(server),
                Err(e) => last = e,
            }
        }
        panic!("redis-server did not start: {last}");
    }

    /// `redis://127.0.0.1:<port>/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A running server on `port` (a store that was down coming up where it is expected), or
    /// `None` when `redis-server` is not installed.
    pub fn start_on(port: u16) -> Option<Self> {
        Self::start()?;
        Some(Self::spawn_on(port).unwrap_or_else(|e| panic!("redis-server did not start: {e}")))
    }

    fn spawn() -> Result<Self, String> {
        let port = free_port().map_err(|e| format!("no free port: {e}"))?;
        Self::spawn_on(port)
    }

    fn spawn_on(port: u16) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("reach-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn: {e}"))?;
        // Built before the wait so a failed start is killed and cleaned up by Drop.
        let mut server = Self { child, port, dir };
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if ping(port) {
                return Ok(server);
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!("exited with {status} (port {port} taken?)"));
            }
            if Instant::now() > deadline {
                return Err(format!("no PONG on port {port} within {READY_WITHIN:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port nothing listens on right now (the OS picks it; the listener is dropped at once).
pub fn free_port() -> std::io::Result<u16> {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
    Ok(listener.local_addr()?.port())
}

/// The server answers `PING` with `+PONG`.
fn ping(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}
