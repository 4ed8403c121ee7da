//! `RequireReceipt` in front of a tool's axum handler: what reaches the handler, and what is
//! answered without it.

use crate::support::{KEY, TOOL, body, claims, now, set, verifier};
use axum::body::{Body, Bytes, to_bytes};
use axum::extract::State;
use axum::http::{Request, StatusCode, header};
use axum::routing::post;
use axum::{Extension, Json, Router};
use countersign_receipt::{BODY_LIMIT, Checked, Jwks, Refusal, RequireReceipt, Signer};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tower::ServiceExt;

/// The refunds tool: `POST /refunds` for `issue_refund`, `POST /emails` for `send_email`, each
/// behind the layer, counting the calls that reach it.
struct Tool {
    app: Router,
    calls: Arc<AtomicUsize>,
    signer: Signer,
}

impl Tool {
    fn new() -> Self {
        let (signer, _) = Signer::generate("k1").unwrap();
        let verifier = Arc::new(verifier(Jwks::fixed(set(&[&signer]))));
        let calls = Arc::new(AtomicUsize::new(0));
        let app = Router::new()
            .route(
                "/refunds",
                post(handle).layer(RequireReceipt::new(verifier.clone(), TOOL)),
            )
            .route(
                "/emails",
                post(handle).layer(RequireReceipt::new(verifier, "send_email")),
            )
            .with_state(calls.clone());
        Self { app, calls, signer }
    }

    /// `POST path` with `body` and the headers given; the status, the `WWW-Authenticate`
    /// header and the JSON answer.
    async fn post(
        &self,
        path: &str,
        receipt: Option<&str>,
        idempotency_key: Option<&str>,
        body: Vec<u8>,
    ) -> (StatusCode, Option<String>, Value) {
        let mut request = Request::post(path).header(header::CONTENT_TYPE, "application/json");
        if let Some(receipt) = receipt {
            request = request.header("Countersign-Receipt", receipt);
        }
        if let Some(key) = idempotency_key {
            request = request.header("Idempotency-Key", key);
        }
        let response = self
            .app
            .clone()
            .oneshot(request.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let challenge = response
            .headers()
            .get(header::WWW_AUTHENTICATE)
            .map(|v| v.to_str().unwrap().to_string());
        let answer = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, challenge, serde_json::from_slice(&answer).unwrap())
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// What the tool answers: what it was told of the receipt, and the body it received.
async fn handle(
    State(calls): State<Arc<AtomicUsize>>,
    Extension(checked): Extension<Checked>,
    body: Bytes,
) -> Json<Value> {
    calls.fetch_add(1, Ordering::SeqCst);
    Json(json!({
        "jti": checked.claims.jti,
        "again": checked.again,
        "body": String::from_utf8(body.to_vec()).unwrap(),
    }))
}

fn input() -> Value {
    json!({"order_id": "A-1001", "amount": 129})
}

#[tokio::test]
async fn a_call_with_its_receipt_reaches_the_tool_with_the_checked_receipt_and_its_body_as_sent() {
    let tool = Tool::new();
    let token = tool.signer.sign(&claims(&input(), "j1"));
    let sent = r#"{"amount": 129,  "order_id": "A-1001"}"#;
    let (status, _, answer) = tool
        .post(
            "/refunds",
            Some(&token),
            Some("run_1:1:toolu_2"),
            sent.into(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer, json!({"jti": "j1", "again": false, "body": sent}));
    assert_eq!(tool.calls(), 1);
}

#[tokio::test]
async fn a_retry_with_the_same_idempotency_key_reaches_the_tool_marked_again() {
    let tool = Tool::new();
    let token = tool.signer.sign(&claims(&input(), "j1"));
    for again in [false, true] {
        let (status, _, answer) = tool
            .post(
                "/refunds",
                Some(&token),
                Some("run_1:1:toolu_2"),
                body(&input()),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["again"], again);
    }
    assert_eq!(tool.calls(), 2);
}

#[tokio::test]
async fn every_refusal_is_answered_401_with_its_code_and_never_reaches_the_tool() {
    let tool = Tool::new();
    let (stranger, _) = Signer::generate("k9").unwrap();
    let token = tool.signer.sign(&claims(&input(), "j1"));
    let mut expired = claims(&input(), "j2");
    expired.iat = now() - 7200;
    expired.exp = now() - 3600;
    let changed = json!({"order_id": "A-1001", "amount": 1290});

    let (status, _, _) = tool
        .post("/refunds", Some(&token), Some(KEY), body(&input()))
        .await;
    assert_eq!(status, StatusCode::OK);
    let cases = [
        ("/refunds", None, body(&input()), Refusal::Missing),
        (
            "/emails",
            Some(token.clone()),
            body(&input()),
            Refusal::OtherTool,
        ),
        (
            "/refunds",
            Some(token.clone()),
            body(&changed),
            Refusal::InputChanged,
        ),
        (
            "/refunds",
            Some(tool.signer.sign(&expired)),
            body(&input()),
            Refusal::Expired,
        ),
        (
            "/refunds",
            Some(stranger.sign(&claims(&input(), "j3"))),
            body(&input()),
            Refusal::UnknownKey("k9".into()),
        ),
        // Spent already, and sent under another turn's key.
        ("/refunds", Some(token), body(&input()), Refusal::OtherCall),
    ];
    for (path, receipt, sent, refusal) in cases {
        let key = match refusal {
            Refusal::OtherCall => "run_1:2:toolu_2",
            _ => KEY,
        };
        let (status, challenge, answer) =
            tool.post(path, receipt.as_deref(), Some(key), sent).await;
        assert_eq!(
            (status, &answer),
            (
                StatusCode::UNAUTHORIZED,
                &json!({"error": refusal.to_string(), "code": refusal.code()})
            )
        );
        let expected = format!("Countersign-Receipt error=\"{}\"", refusal.code());
        assert_eq!(challenge.as_deref(), Some(expected.as_str()));
    }
    assert_eq!(
        Refusal::UnknownKey("k9".into()).code(),
        "unknown_key",
        "codes are snake case"
    );
    assert_eq!(tool.calls(), 1, "only the first call reached the tool");
}

#[tokio::test]
async fn a_body_over_one_mib_is_answered_413_and_never_reaches_the_tool() {
    let tool = Tool::new();
    let big = json!({"note": "x".repeat(BODY_LIMIT)});
    let token = tool.signer.sign(&claims(&big, "j1"));
    let (status, _, answer) = tool.post("/refunds", Some(&token), None, body(&big)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(answer["code"], "body_too_large");
    assert_eq!(tool.calls(), 0);
}
