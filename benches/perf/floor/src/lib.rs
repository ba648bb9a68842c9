//! What the measuring sticks share: the command line, the runtime a sidecar under test gets (one
//! worker thread) and the accept loop, and mimalloc as agent-reach's binary has it.
use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `NAME LISTEN UPSTREAM [OPTION]`: serves each connection accepted on LISTEN (`TCP_NODELAY`
/// set) with `serve`, given UPSTREAM and whether `option` was named.
pub fn run<F, Fut>(usage: &str, option: Option<&str>, serve: F) -> ExitCode
where
    F: Fn(TcpStream, Arc<str>, bool) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        eprintln!("usage: {usage}");
        return ExitCode::from(2);
    };
    let chosen = match (args.next(), option) {
        (None, _) => false,
        (Some(arg), Some(option)) if arg == option => true,
        (Some(_), _) => {
            eprintln!("usage: {usage}");
            return ExitCode::from(2);
        }
    };
    let upstream: Arc<str> = upstream.into();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let listener = match TcpListener::bind(&listen).await {
            Ok(listener) => listener,
            Err(err) => {
                eprintln!("bind {listen}: {err}");
                return ExitCode::FAILURE;
            }
        };
        loop {
            let Ok((down, _)) = listener.accept().await else {
                continue;
            };
            let _ = down.set_nodelay(true);
            tokio::spawn(serve(down, upstream.clone(), chosen));
        }
    })
}
