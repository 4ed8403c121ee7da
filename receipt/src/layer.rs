//! [`RequireReceipt`]: a tower layer (for axum or any tower HTTP server) that lets a request
//! reach the tool only when the receipt in its `Countersign-Receipt` header checks against
//! it. The body is read whole (up to [`BODY_LIMIT`]) to compare its digest, then handed on
//! unchanged; the inner service finds the [`Checked`] receipt in the request's extensions.
//!
//! A refusal is answered here, and the inner service is never called: 401 with
//! `{"error": "<what is wrong>", "code": "<Refusal::code>"}`, or 503 with the same shape when
//! the keys or the jti store cannot be reached (the worker retries those). A body past the
//! limit is answered 413.

use crate::jtis::JtiStore;
use crate::verify::{Checked, Refusal, Verifier};
use bytes::Bytes;
use http::header::{CONTENT_TYPE, WWW_AUTHENTICATE};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

/// The largest request body the layer reads, in bytes: 1 MiB.
pub const BODY_LIMIT: usize = 1 << 20;

/// The header a worker sends a call's receipt in.
pub const RECEIPT_HEADER: &str = "countersign-receipt";

const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Requires a receipt for `tool` on every request through it.
pub struct RequireReceipt<R> {
    verifier: Arc<Verifier<R>>,
    tool: Arc<str>,
}

impl<R> RequireReceipt<R> {
    /// `tool` is the tool's name in the agent's definition, as receipts name it.
    pub fn new(verifier: Arc<Verifier<R>>, tool: impl Into<Arc<str>>) -> Self {
        Self {
            verifier,
            tool: tool.into(),
        }
    }
}

// By hand: derived, these would require `R: Clone`, which only the `Arc` needs.
impl<R> Clone for RequireReceipt<R> {
    fn clone(&self) -> Self {
        Self {
            verifier: self.verifier.clone(),
            tool: self.tool.clone(),
        }
    }
}

impl<S, R> Layer<S> for RequireReceipt<R> {
    type Service = RequireReceiptService<S, R>;

    fn layer(&self, inner: S) -> Self::Service {
        RequireReceiptService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`RequireReceipt`] wraps around the tool's.
pub struct RequireReceiptService<S, R> {
    inner: S,
    layer: RequireReceipt<R>,
}

impl<S: Clone, R> Clone for RequireReceiptService<S, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, R, B, ResBody> Service<Request<B>> for RequireReceiptService<S, R>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    R: JtiStore + 'static,
    B: Body + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    ResBody: From<Bytes>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The service polled ready is the one to call; the clone stays for the next request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let RequireReceipt { verifier, tool } = self.layer.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let body = match Limited::new(body, BODY_LIMIT).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => return Ok(unread(&e)),
            };
            // A header that is not visible ASCII reads as empty: a malformed receipt, no key.
            let header = |name| {
                parts
                    .headers
                    .get(name)
                    .map(|v: &HeaderValue| v.to_str().unwrap_or_default())
            };
            let checked = verifier
                .check(
                    header(RECEIPT_HEADER),
                    &tool,
                    header(IDEMPOTENCY_KEY),
                    &body,
                )
                .await;
            match checked {
                Ok(checked) => {
                    parts.extensions.insert::<Checked>(checked);
                    inner.call(Request::from_parts(parts, B::from(body))).await
                }
                Err(refusal) => {
                    tracing::debug!(%tool, code = refusal.code(), "receipt refused");
                    Ok(refused(&refusal))
                }
            }
        })
    }
}

/// The answer to a refused receipt, as the layer gives it, for a tool that calls
/// [`Verifier::check`] itself: 401 with the refusal's code and a `Countersign-Receipt`
/// challenge, or 503 when the keys or the jti store cannot be reached.
pub fn refused<B: From<Bytes>>(refusal: &Refusal) -> Response<B> {
    let status = match refusal {
        Refusal::KeysUnavailable(detail) | Refusal::JtiStoreUnavailable(detail) => {
            tracing::warn!(code = refusal.code(), detail, "receipt not checkable");
            StatusCode::SERVICE_UNAVAILABLE
        }
        _ => StatusCode::UNAUTHORIZED,
    };
    let mut response = answer(status, refusal.code(), &refusal.to_string());
    if status == StatusCode::UNAUTHORIZED {
        // A 401 names the way to authenticate (RFC 9110, 15.5.2), and here why it failed.
        let challenge = format!("Countersign-Receipt error=\"{}\"", refusal.code());
        response.headers_mut().insert(
            WWW_AUTHENTICATE,
            HeaderValue::from_str(&challenge).expect("codes are header-safe"),
        );
    }
    response
}

/// The answer to a body that could not be read whole.
fn unread<B: From<Bytes>>(error: &BoxError) -> Response<B> {
    if error.is::<LengthLimitError>() {
        answer(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            "the request body is larger than 1 MiB",
        )
    } else {
        answer(
            StatusCode::BAD_REQUEST,
            "body_unreadable",
            "the request body could not be read",
        )
    }
}

fn answer<B: From<Bytes>>(status: StatusCode, code: &str, message: &str) -> Response<B> {
    let body = serde_json::json!({"error": message, "code": code}).to_string();
    let mut response = Response::new(B::from(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
