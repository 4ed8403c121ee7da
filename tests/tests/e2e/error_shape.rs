//! Every error on every route is the API's JSON error, `{"error": {"code", "message"}}`,
//! including those axum makes itself; only the email pages are HTML.

use countersign_fake_model::refund_brain;
use countersign_tests::app::{ADMIN_KEY, TestApp};
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// Sends a request with the admin key and returns the status, the headers and the body.
async fn send(
    app: &TestApp,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
) -> (StatusCode, reqwest::header::HeaderMap, String) {
    let mut request = app
        .http
        .request(method, format!("{}{path}", app.gateway_url))
        .bearer_auth(ADMIN_KEY);
    if let Some(body) = body {
        request = request
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
    }
    let response = request.send().await.expect("gateway reachable");
    let (status, headers) = (response.status(), response.headers().clone());
    (status, headers, response.text().await.unwrap())
}

fn assert_json_error(
    what: &str,
    (status, headers, text): &(StatusCode, reqwest::header::HeaderMap, String),
    expected: StatusCode,
    code: &str,
) {
    assert_eq!(*status, expected, "{what}: {text}");
    assert_eq!(
        headers["content-type"], "application/json",
        "{what}: {text}"
    );
    let body: Value = serde_json::from_str(text).unwrap_or_else(|_| panic!("{what}: {text}"));
    assert_eq!(body["error"]["code"], code, "{what}: {body}");
    assert!(
        !body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{what}: {body}"
    );
}

#[tokio::test]
async fn bad_queries_wrong_methods_and_oversized_raw_bodies_get_json_errors() {
    let app = TestApp::builder(refund_brain)
        .workers(0)
        .gateway(|config| config.max_body_bytes = 2048)
        .start()
        .await;
    let too_big = vec![b'a'; 4096];

    let answer = send(&app, Method::GET, "/v1/approvals?limit=abc", None).await;
    assert_json_error(
        "a bad query string",
        &answer,
        StatusCode::BAD_REQUEST,
        "invalid_query",
    );

    let answer = send(&app, Method::DELETE, "/v1/runs", None).await;
    assert_json_error(
        "a wrong method",
        &answer,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );
    assert_eq!(
        answer.1["allow"], "POST",
        "a 405 still says what is allowed"
    );

    let answer = send(
        &app,
        Method::POST,
        "/slack/interactions",
        Some(too_big.clone()),
    )
    .await;
    assert_json_error(
        "an oversized Slack interaction",
        &answer,
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
    );

    let answer = send(
        &app,
        Method::POST,
        "/approvals/email/no-such-token",
        Some(too_big),
    )
    .await;
    assert_json_error(
        "an oversized email form",
        &answer,
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
    );

    let answer = send(&app, Method::GET, "/no/such/route", None).await;
    assert_json_error(
        "an unknown route",
        &answer,
        StatusCode::NOT_FOUND,
        "not_found",
    );

    // The email pages are for people: their errors stay pages.
    let (status, headers, _) =
        send(&app, Method::GET, "/approvals/email/no-such-token", None).await;
    assert!(status.is_client_error(), "{status}");
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html"),
        "{headers:?}"
    );
}
