//! The listener: an accept loop over hyper's HTTP/1 server, because `axum::serve` sets no
//! limits and a client that opens connections and sends nothing, or sends a request a byte at
//! a time, would otherwise hold a task and a socket for ever.
//!
//! - at most `max_connections` connections are served; beyond that the loop stops accepting
//!   and new ones wait in the kernel's backlog. A connection whose answer is a run's live
//!   events gives its place back ([`ConnectionSlot`]): those streams live for hours and are
//!   capped on their own (`crate::live`), so they can never leave probes and decisions
//!   waiting in the backlog;
//! - a request's headers must arrive within `header_read_timeout_ms` (hyper times this from
//!   the moment it waits for them, so it also ends a kept-alive connection whose next request
//!   does not come);
//! - its body within `body_timeout_ms` of its headers, or it is answered 408 and the
//!   connection closed;
//! - a connection on which no byte moves either way for `idle_timeout_ms` (a client that
//!   stopped reading its answer) is closed.
//!
//! On shutdown the loop stops accepting, idle connections close, and requests in flight
//! finish.

use crate::config::Config;
use crate::error::ApiError;
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, header};
use axum::response::IntoResponse;
use bytes::Bytes;
use http_body::Frame;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Serves `app` on `listener` until `shutdown` is cancelled, then lets requests in flight
/// finish.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    config: &Config,
    shutdown: CancellationToken,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(config.header_read_timeout_ms));
    let body_timeout = Duration::from_millis(config.body_timeout_ms);
    let idle_timeout = Duration::from_millis(config.idle_timeout_ms);
    let permits = Arc::new(Semaphore::new(config.max_connections));
    let graceful = GracefulShutdown::new();
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, mostly: accepting again at once would spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let app = app.clone();
        let slot = ConnectionSlot(Arc::new(std::sync::Mutex::new(Some(permit))));
        let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(slot.clone());
            answer(app.clone(), req, body_timeout)
        });
        let io = TokioIo::new(IdleTimeout::new(stream, idle_timeout));
        let connection = graceful.watch(http.serve_connection(io, service));
        tokio::spawn(async move {
            // The service, and with it the slot, is dropped when the connection ends.
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection closed with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// A connection's place among the `max_connections` served, in each of its requests'
/// extensions. It is given back when the connection closes, or earlier by
/// [`ConnectionSlot::give_back`].
#[derive(Clone)]
pub(crate) struct ConnectionSlot(Arc<std::sync::Mutex<Option<OwnedSemaphorePermit>>>);

impl ConnectionSlot {
    /// Frees the connection's place for another: for an answer that holds the connection
    /// for long and is counted elsewhere (a run's live events), which must also close the
    /// connection once done (`Connection: close`), so it serves nothing more unbudgeted.
    pub(crate) fn give_back(&self) {
        drop(self.0.lock().expect("lock poisoned").take());
    }
}

/// Runs one request through the router with a deadline on its body.
async fn answer(
    app: Router,
    req: Request<Incoming>,
    body_timeout: Duration,
) -> Result<axum::response::Response, std::convert::Infallible> {
    let late = Arc::new(AtomicBool::new(false));
    let req = req.map(|body| {
        Body::new(Deadline {
            body,
            timer: Box::pin(tokio::time::sleep(body_timeout)),
            late: late.clone(),
        })
    });
    let response = app.oneshot(req).await?;
    if !late.load(Ordering::Relaxed) {
        return Ok(response);
    }
    // Whatever the route made of a truncated body, the truth is that it came too slowly.
    let mut response = ApiError::body_timeout(format!(
        "the request body did not arrive within {} ms",
        body_timeout.as_millis()
    ))
    .into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    Ok(response)
}

/// A request body that fails once its deadline passes, however it trickles in.
struct Deadline {
    body: Incoming,
    timer: Pin<Box<Sleep>>,
    late: Arc<AtomicBool>,
}

#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
struct BodyTimeout;

impl http_body::Body for Deadline {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        ready!(self.timer.as_mut().poll(cx));
        self.late.store(true, Ordering::Relaxed);
        Poll::Ready(Some(Err(BodyTimeout.into())))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A socket that fails with `TimedOut` once no byte has moved either way for `timeout`.
struct IdleTimeout<T> {
    io: T,
    timeout: Duration,
    timer: Pin<Box<Sleep>>,
}

impl<T> IdleTimeout<T> {
    fn new(io: T, timeout: Duration) -> Self {
        Self {
            io,
            timeout,
            timer: Box::pin(tokio::time::sleep(timeout)),
        }
    }

    fn moved(&mut self) {
        self.timer.as_mut().reset(Instant::now() + self.timeout);
    }

    /// Called when the socket is not ready: pending until the connection has idled too long.
    fn expired<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        ready!(self.timer.as_mut().poll(cx));
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the connection was idle too long",
        )))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleTimeout<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    this.moved();
                }
                Poll::Ready(result)
            }
            Poll::Pending => this.expired(cx),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Ready(result) => {
                if matches!(result, Ok(n) if n > 0) {
                    this.moved();
                }
                Poll::Ready(result)
            }
            Poll::Pending => this.expired(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write_vectored(cx, bufs) {
            Poll::Ready(result) => {
                if matches!(result, Ok(n) if n > 0) {
                    this.moved();
                }
                Poll::Ready(result)
            }
            Poll::Pending => this.expired(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Ready(result) => Poll::Ready(result),
            Poll::Pending => this.expired(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
