use super::*;
use crate::http::body;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;

/// An upstream that answers every request with its path, counting connections.
async fn upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let path = req.uri().path().to_owned();
                    let _ = req.into_body().collect().await;
                    Ok::<_, std::convert::Infallible>(Response::new(body::full(path)))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, accepted)
}

fn tcp() -> crate::transport::ConnectTcp {
    crate::transport::ConnectTcp::new(crate::transport::TcpSettings {
        connect_timeout: Duration::from_secs(2),
        keepalive: Duration::from_secs(30),
        keepalive_interval: Duration::from_secs(5),
        keepalive_retries: 3,
    })
}

fn config() -> PoolConfig {
    PoolConfig {
        idle_timeout: Duration::from_secs(5),
        max_idle_per_host: 4,
        protocol: PeerProtocol::Http1,
    }
}

async fn get(pool: &Pool, authority: &str, path: &str) -> Result<String, ReachError> {
    let req = Request::get(path)
        .body(body::empty())
        .unwrap_or_else(|e| panic!("{e}"));
    let response = forward(pool, req, authority, None, &"test", Duration::from_secs(2)).await?;
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| ReachError::BadRequest(e.to_string()))?
        .to_bytes();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test]
async fn connections_are_reused_one_after_another() {
    let (addr, accepted) = upstream().await;
    let pool = Pool::new(config(), tcp());
    let authority = addr.to_string();
    for i in 0..5 {
        let path = format!("/r{i}");
        assert_eq!(
            get(&pool, &authority, &path).await.ok().as_deref(),
            Some(path.as_str())
        );
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    assert_eq!(pool.idle_count(), 1);
}

#[tokio::test]
async fn concurrent_requests_open_connections_and_keep_at_most_the_idle_maximum() {
    let (addr, accepted) = upstream().await;
    let pool = Pool::new(config(), tcp());
    let authority = addr.to_string();
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let (pool, authority) = (pool.clone(), authority.clone());
            tokio::spawn(async move { get(&pool, &authority, "/x").await.is_ok() })
        })
        .collect();
    for call in calls {
        assert!(call.await.unwrap_or(false));
    }
    assert!(accepted.load(Ordering::SeqCst) >= 1);
    assert!(pool.idle_count() <= 4);
}

#[tokio::test]
async fn nothing_listening_is_a_refused_connect_failure() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    drop(listener);
    let pool = Pool::new(config(), tcp());
    let err = get(&pool, &addr.to_string(), "/").await.err();
    assert!(
        matches!(err, Some(ReachError::UpstreamConnect { refused: true, .. })),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_pooled_connection_closed_by_the_upstream_is_skipped() {
    // An upstream that answers one request per connection with keep-alive, then closes it
    // while it sits idle in the pool.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                // Dropped here: closed while the connection sits in the caller's pool.
            });
        }
    });
    let pool = Pool::new(config(), tcp());
    let authority = addr.to_string();
    for _ in 0..3 {
        assert_eq!(
            get(&pool, &authority, "/").await.ok().as_deref(),
            Some("ok")
        );
        // Long enough for the close to arrive (the race with a close still in flight is
        // the upstream's idle timeout's business: callers' pools expire first).
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each call found the previous connection closed and opened another, without an error.
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn an_absolute_form_target_keeps_only_its_path() {
    let (addr, _) = upstream().await;
    let pool = Pool::new(config(), tcp());
    let req = Request::get("http://evil:80/x?y=1")
        .body(body::empty())
        .unwrap_or_else(|e| panic!("{e}"));
    let response = forward(
        &pool,
        req,
        &addr.to_string(),
        None,
        &"test",
        Duration::from_secs(2),
    )
    .await;
    let body = match response {
        Ok(r) => r.into_body().collect().await.map(|b| b.to_bytes()).ok(),
        Err(_) => None,
    };
    assert_eq!(body.as_deref(), Some(&b"/x"[..]));
}

/// A listener with a backlog of 1 that accepts one connection and serves it (`/slow` takes
/// `hold`), then accepts no more; the test fills its accept queue once the one is in.
#[cfg(target_os = "linux")]
async fn backlogged(hold: Duration) -> (SocketAddr, tokio::sync::oneshot::Receiver<()>) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap_or_else(|e| panic!("{e}"));
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .unwrap_or_else(|e| panic!("{e}"));
    let listener = socket.listen(1).unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let (accepted, first) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let _ = accepted.send(());
        let service = hyper::service::service_fn(move |req: Request<Incoming>| async move {
            if req.uri().path() == "/slow" {
                tokio::time::sleep(hold).await;
            }
            Ok::<_, std::convert::Infallible>(Response::new(body::full("ok")))
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service)
            .await;
        // Still listening, accepting nothing.
        std::future::pending::<()>().await;
        drop(listener);
    });
    (addr, first)
}

/// Connects until a connect no longer completes: the accept queue is full.
#[cfg(target_os = "linux")]
async fn fill(addr: SocketAddr) -> Vec<tokio::net::TcpStream> {
    let mut held = Vec::new();
    for _ in 0..64 {
        let connect = tokio::net::TcpStream::connect(addr);
        match tokio::time::timeout(Duration::from_millis(200), connect).await {
            Ok(Ok(stream)) => held.push(stream),
            _ => break,
        }
    }
    held
}

fn quick_connect() -> crate::transport::ConnectTcp {
    crate::transport::ConnectTcp::new(crate::transport::TcpSettings {
        connect_timeout: Duration::from_millis(100),
        ..crate::transport::TcpSettings::from_policy(&Policy::default())
    })
}

async fn get_with(
    pool: &Pool,
    addr: SocketAddr,
    timeout: Duration,
    backlog: Backlog,
) -> Result<Response<UpstreamBody>, ReachError> {
    let req = Request::get("/")
        .body(body::empty())
        .unwrap_or_else(|e| panic!("{e}"));
    let authority = addr.to_string();
    forward_with(pool, req, &authority, None, &"test", timeout, backlog).await
}

/// One slow call holds the only accepted connection while the accept queue is full.
#[cfg(target_os = "linux")]
async fn busy_upstream(
    pool: &Pool,
    hold: Duration,
) -> (
    SocketAddr,
    Vec<tokio::net::TcpStream>,
    tokio::task::JoinHandle<bool>,
) {
    let (addr, first) = backlogged(hold).await;
    let slow = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let req = Request::get("/slow")
                .body(body::empty())
                .unwrap_or_else(|e| panic!("{e}"));
            let authority = addr.to_string();
            let sent = forward(
                &pool,
                req,
                &authority,
                None,
                &"test",
                Duration::from_secs(5),
            );
            match sent.await {
                Ok(response) => response.into_body().collect().await.is_ok(),
                Err(_) => false,
            }
        })
    };
    first.await.unwrap_or_else(|e| panic!("{e}"));
    let held = fill(addr).await;
    (addr, held, slow)
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_connect_timed_out_by_a_full_backlog_fails_unless_the_call_waits() {
    let pool = Pool::new(config(), quick_connect());
    let (addr, _held, slow) = busy_upstream(&pool, Duration::from_millis(500)).await;
    let failed = get_with(&pool, addr, Duration::from_secs(2), Backlog::Fail).await;
    assert!(
        matches!(
            failed,
            Err(ReachError::UpstreamConnect { refused: false, .. })
        ),
        "{failed:?}"
    );
    // Waiting, the call takes the connection the slow one frees.
    let waited = get_with(&pool, addr, Duration::from_secs(2), Backlog::Wait).await;
    assert!(waited.is_ok(), "{waited:?}");
    assert!(slow.await.unwrap_or(false));
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn time_run_out_waiting_on_a_full_backlog_is_backlogged_not_a_timeout() {
    let pool = Pool::new(config(), quick_connect());
    let (addr, _held, _slow) = busy_upstream(&pool, Duration::from_secs(3)).await;
    let waited = get_with(&pool, addr, Duration::from_millis(400), Backlog::Wait).await;
    assert!(
        matches!(waited, Err(ReachError::Backlogged { .. })),
        "{waited:?}"
    );
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_connect_timeout_to_an_upstream_never_seen_accepting_is_not_waited_out() {
    let (addr, first) = backlogged(Duration::ZERO).await;
    // Its one accepted connection is not this pool's.
    let _other = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    first.await.unwrap_or_else(|e| panic!("{e}"));
    let _held = fill(addr).await;
    let pool = Pool::new(config(), quick_connect());
    let started = Instant::now();
    let waited = get_with(&pool, addr, Duration::from_secs(2), Backlog::Wait).await;
    assert!(
        matches!(
            waited,
            Err(ReachError::UpstreamConnect { refused: false, .. })
        ),
        "{waited:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn a_refused_connect_is_not_waited_out() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    drop(listener);
    let pool = Pool::new(config(), quick_connect());
    let err = get_with(&pool, addr, Duration::from_secs(2), Backlog::Wait).await;
    assert!(
        matches!(err, Err(ReachError::UpstreamConnect { refused: true, .. })),
        "{err:?}"
    );
}

/// An upstream that answers at once, except `/hang`, which it never answers.
async fn hanging_upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    if req.uri().path() == "/hang" {
                        std::future::pending::<()>().await;
                    }
                    Ok::<_, std::convert::Infallible>(Response::new(body::full("ok")))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

async fn get_within(
    pool: &Pool,
    authority: &str,
    path: &str,
    timeout: Duration,
) -> Result<(), ReachError> {
    let req = Request::get(path)
        .body(body::empty())
        .unwrap_or_else(|e| panic!("{e}"));
    let response = forward(pool, req, authority, None, &"test", timeout).await?;
    let _ = response.into_body().collect().await;
    Ok(())
}

/// A hung request given 300 ms times out at 300 ms, whatever deadline its connection had before.
async fn times_out_at_300ms(pool: &Pool, authority: &str) {
    let started = tokio::time::Instant::now();
    let hung = get_within(pool, authority, "/hang", Duration::from_millis(300)).await;
    assert!(matches!(hung, Err(ReachError::Timeout { .. })), "{hung:?}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(1),
        "{took:?}"
    );
}

/// A connection keeps one timer for its exchanges: each request moves it, to an earlier deadline
/// as well as a later one, and after it has fired while the connection sat idle.
#[tokio::test(start_paused = true)]
async fn each_request_on_a_pooled_connection_gets_its_own_deadline() {
    let addr = hanging_upstream().await;
    let pool = Pool::new(config(), tcp());
    let authority = addr.to_string();
    // The connection's timer set a minute out, then a hung request given 300 ms on it.
    let long = Duration::from_secs(60);
    assert!(get_within(&pool, &authority, "/now", long).await.is_ok());
    assert_eq!(pool.idle_count(), 1);
    times_out_at_300ms(&pool, &authority).await;
    // A new connection whose timer fires while it sits idle, then is set again.
    assert!(
        get_within(&pool, &authority, "/now", Duration::from_millis(100))
            .await
            .is_ok()
    );
    assert_eq!(pool.idle_count(), 1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(get_within(&pool, &authority, "/now", long).await.is_ok());
    times_out_at_300ms(&pool, &authority).await;
}
