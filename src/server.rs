//! The connection layer under the router: accepts TCP connections and serves
//! HTTP/1 on each, with what `axum::serve` does not offer. A connection must
//! deliver a request's headers within the header-read timeout; a kept-alive
//! connection idle past the keep-alive timeout is closed; at most
//! `max_connections` are open, and a new one makes room by closing the
//! connection idle the longest (so idle sockets cannot lock out `/healthz`);
//! and a connection the server ends is closed lingering, reading what the
//! client still sends, so a client that writes a whole rejected body before
//! reading receives the response instead of a reset.
//!
//! Nothing here knows routes or the API: requests go to the router as they are.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// How long a connection the server ends keeps reading (and discarding) what
/// the client still sends after the response: long enough for a client to
/// finish writing a rejected body before it reads the answer.
const LINGER: Duration = Duration::from_secs(5);

/// The connection settings (`[server]` in the configuration).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// From a connection's opening, or its previous response, until the next
    /// request's headers are complete.
    pub header_read_timeout: Duration,
    /// A kept-alive connection with no request in flight for this long after
    /// a response is closed; zero turns keep-alive off.
    pub keep_alive_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then stops
/// accepting and returns once every connection has finished its requests
/// and closed (the caller bounds that wait).
pub async fn serve(listener: TcpListener, router: Router, limits: Limits, shutdown: CancellationToken) {
    let registry = Arc::new(Registry::default());
    let tracker = TaskTracker::new();
    'accept: loop {
        // Make room before accepting: close the idlest connection, or wait
        // for one to end while every connection has a request in flight.
        loop {
            let freed = registry.closed.notified();
            if registry.len() < limits.max_connections || registry.evict_idlest() {
                break;
            }
            tokio::select! {
                _ = freed => {}
                _ = shutdown.cancelled() => break 'accept,
            }
        }
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before
                    // it was accepted: pause rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let conn = registry.register();
        tracker.spawn(serve_connection(stream, router.clone(), conn, registry.clone(), limits, shutdown.clone()));
    }
    drop(listener);
    tracker.close();
    tracker.wait().await;
}

/// The open connections, so that the accept loop can count them and close
/// an idle one.
#[derive(Default)]
struct Registry {
    conns: Mutex<HashMap<u64, Arc<ConnState>>>,
    next_id: AtomicU64,
    /// Signalled whenever a connection leaves the registry.
    closed: tokio::sync::Notify,
}

/// What the registry knows of one connection. Written by its requests (in
/// flight, idle since) and read by the accept loop.
struct ConnState {
    id: u64,
    /// Requests whose response has not been fully written yet.
    in_flight: AtomicUsize,
    /// Responses fully written so far.
    served: AtomicUsize,
    /// When the last response finished (or the connection opened).
    idle_since: Mutex<Instant>,
    /// Cancelled to close the connection at once.
    evict: CancellationToken,
    /// Signalled when a request ends, so the keep-alive wait starts.
    request_ended: tokio::sync::Notify,
}

impl Registry {
    fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<ConnState>>> {
        self.conns.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn register(&self) -> Arc<ConnState> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(ConnState {
            id,
            in_flight: AtomicUsize::new(0),
            served: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            evict: CancellationToken::new(),
            request_ended: tokio::sync::Notify::new(),
        });
        self.lock().insert(id, conn.clone());
        conn
    }

    fn remove(&self, id: u64) {
        if self.lock().remove(&id).is_some() {
            self.closed.notify_one();
        }
    }

    /// Closes the connection idle the longest, if any has no request in
    /// flight. A connection still sending its headers counts as idle: it
    /// holds no work, only a socket.
    fn evict_idlest(&self) -> bool {
        let mut conns = self.lock();
        let idlest = conns
            .values()
            .filter(|c| c.in_flight.load(Ordering::Acquire) == 0)
            .min_by_key(|c| *c.idle_since.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
            .map(|c| c.id);
        match idlest.and_then(|id| conns.remove(&id)) {
            Some(conn) => {
                conn.evict.cancel();
                true
            }
            None => false,
        }
    }
}

impl ConnState {
    fn idle_since(&self) -> Instant {
        *self.idle_since.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Counts a request as in flight until its response body has been written
/// (hyper drops the body then) or abandoned.
struct InFlight(Arc<ConnState>);

impl InFlight {
    fn enter(conn: Arc<ConnState>) -> InFlight {
        conn.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(conn)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
        self.0.served.fetch_add(1, Ordering::AcqRel);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.request_ended.notify_one();
    }
}

/// A response body that holds its request's [`InFlight`].
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

async fn serve_connection(
    stream: TcpStream,
    router: Router,
    conn: Arc<ConnState>,
    registry: Arc<Registry>,
    limits: Limits,
    shutdown: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let state = conn.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| -> ResponseFuture {
        let in_flight = InFlight::enter(state.clone());
        let router = router.clone();
        Box::pin(async move {
            let response = router.oneshot(req.map(Body::new)).await?;
            Ok(response.map(|body| Body::new(Tracked { body, _in_flight: in_flight })))
        })
    });
    let keep_alive = !limits.keep_alive_timeout.is_zero();
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout).keep_alive(keep_alive);
    let mut http = builder.serve_connection(TokioIo::new(stream), service);
    let mut closing = false;
    loop {
        // Keep-alive: the wait after a response, while nothing is in flight.
        let idle = conn.served.load(Ordering::Acquire) > 0 && conn.in_flight.load(Ordering::Acquire) == 0;
        let idle_deadline = conn.idle_since() + limits.keep_alive_timeout;
        tokio::select! {
            done = std::future::poll_fn(|cx| http.poll_without_shutdown(cx)) => {
                if let Err(e) = done {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                break;
            }
            _ = conn.evict.cancelled() => {
                tracing::debug!("closing an idle connection to make room for a new one");
                registry.remove(conn.id);
                return;
            }
            _ = shutdown.cancelled(), if !closing => {
                closing = true;
                Pin::new(&mut http).graceful_shutdown();
            }
            _ = conn.request_ended.notified() => {}
            _ = tokio::time::sleep_until(idle_deadline), if idle && keep_alive && !closing => {
                let expired = conn.idle_since() + limits.keep_alive_timeout <= Instant::now();
                if conn.in_flight.load(Ordering::Acquire) == 0 && expired {
                    closing = true;
                    Pin::new(&mut http).graceful_shutdown();
                }
            }
        }
    }
    let stream = http.into_parts().io.into_inner();
    tokio::select! {
        _ = linger(stream) => {}
        _ = conn.evict.cancelled() => {}
    }
    registry.remove(conn.id);
}

/// Ends a connection the way a client that is still writing can read the
/// response: send FIN, then read and discard until the client closes too (or
/// [`LINGER`] passes). Closing with unread data in the socket would send a
/// reset, which destroys the response before the client reads it.
async fn linger(mut stream: TcpStream) {
    if stream.shutdown().await.is_err() {
        return;
    }
    let mut sink = vec![0u8; 64 * 1024];
    let drain = async {
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}
