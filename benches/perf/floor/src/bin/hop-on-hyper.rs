//! A proxy hop on hyper alone: hyper's HTTP/1 server, and for each downstream connection one
//! hyper HTTP/1 client connection upstream (spawned as hyper's examples do), with nothing between
//! them — no pool, no layers, no headers changed. What hyper's own machinery costs a hop: a
//! measuring stick for benches/perf/hop.sh, not a proxy to deploy.
//!
//! usage: hop-on-hyper LISTEN UPSTREAM
use std::io;
use std::process::ExitCode;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::Mutex;

fn main() -> ExitCode {
    hop_floor::run("hop-on-hyper LISTEN UPSTREAM", None, |down, upstream, _| {
        serve(down, upstream)
    })
}

async fn serve(down: TcpStream, upstream: Arc<str>) {
    let sender: Arc<Mutex<Option<SendRequest<Incoming>>>> = Arc::default();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let sender = sender.clone();
        let upstream = upstream.clone();
        async move {
            let mut sender = sender.lock().await;
            let sender = match &mut *sender {
                Some(open) if !open.is_closed() => open,
                slot => slot.insert(connect(&upstream).await?),
            };
            sender.ready().await.map_err(io::Error::other)?;
            let res: Response<Incoming> =
                sender.send_request(req).await.map_err(io::Error::other)?;
            Ok::<_, io::Error>(res)
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(down), service)
        .await;
}

async fn connect(upstream: &str) -> io::Result<SendRequest<Incoming>> {
    let conn = TcpStream::connect(upstream).await?;
    conn.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(conn))
        .await
        .map_err(io::Error::other)?;
    tokio::spawn(conn);
    Ok(sender)
}
