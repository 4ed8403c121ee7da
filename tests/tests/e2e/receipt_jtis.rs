//! A tool's record of the receipts it ran, in Redis (`countersign_receipt::RedisJtis`):
//! shared by the tool's instances, one first use per receipt however many race for it, a
//! retry of the same request recognised, and no receipt let through while Redis is away.

use axum::routing::post;
use axum::{Extension, Router};
use countersign_receipt::{
    Checked, Claims, JtiStore, Jwks, KeySet, RedisJtis, RequireReceipt, Seen, Signer, Verifier,
    input_digest,
};
use countersign_tests::infra::Infra;
use futures::future::join_all;
use redis::AsyncCommands;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The jti store of one tool instance, under the test's own key prefix.
async fn jtis(infra: &Infra, prefix: &str) -> RedisJtis<ConnectionManager> {
    let client = redis::Client::open(infra.redis_url.as_str()).unwrap();
    // Fail fast once Redis is gone, as a tool answering 503 should.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_secs(1)))
        .set_number_of_retries(1);
    let conn = client
        .get_connection_manager_with_config(config)
        .await
        .unwrap();
    RedisJtis::new(conn, prefix)
}

fn prefix() -> String {
    format!("t{}:jti:", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

#[tokio::test]
async fn a_receipt_is_first_once_again_for_its_requests_retry_and_reused_by_any_other() {
    let infra = Infra::start().await;
    let prefix = prefix();
    let jtis = jtis(&infra, &prefix).await;
    let until = now() + 60;

    assert_eq!(
        jtis.first_use("j1", "run_1:1:toolu_2", until)
            .await
            .unwrap(),
        Seen::First
    );
    assert_eq!(
        jtis.first_use("j1", "run_1:1:toolu_2", until)
            .await
            .unwrap(),
        Seen::Again
    );
    assert_eq!(
        jtis.first_use("j1", "run_1:1:toolu_3", until)
            .await
            .unwrap(),
        Seen::Reused
    );
    assert_eq!(jtis.first_use("j1", "", until).await.unwrap(), Seen::Reused);
    // First used without a key, a receipt has no retry.
    assert_eq!(jtis.first_use("j2", "", until).await.unwrap(), Seen::First);
    assert_eq!(jtis.first_use("j2", "", until).await.unwrap(), Seen::Reused);

    // Remembered until the receipt stops verifying, not longer.
    let mut redis = infra.redis().await;
    let ttl: i64 = redis.pttl(format!("{prefix}j1")).await.unwrap();
    assert!((55_000..=60_000).contains(&ttl), "{ttl} ms");
    let recorded: String = redis.get(format!("{prefix}j1")).await.unwrap();
    assert_eq!(recorded, "run_1:1:toolu_2");
}

#[tokio::test]
async fn of_concurrent_first_uses_of_one_receipt_by_two_instances_exactly_one_is_first() {
    let infra = Infra::start().await;
    let prefix = prefix();
    let instances = [jtis(&infra, &prefix).await, jtis(&infra, &prefix).await];
    let until = now() + 60;

    // Different requests: one runs, the others are refused.
    let seen = join_all(
        (0..20).map(|i| instances[i % 2].first_use("j1", ["key-a", "key-b"][i % 2], until)),
    )
    .await;
    let seen: Vec<Seen> = seen.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        seen.iter().filter(|s| **s == Seen::First).count(),
        1,
        "{seen:?}"
    );
    // The same request sent twice at once: one runs, the other is its retry.
    let seen = join_all((0..20).map(|i| instances[i % 2].first_use("j2", "key-c", until))).await;
    let seen: Vec<Seen> = seen.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        seen.iter().filter(|s| **s == Seen::First).count(),
        1,
        "{seen:?}"
    );
    assert_eq!(
        seen.iter().filter(|s| **s == Seen::Again).count(),
        19,
        "{seen:?}"
    );
}

#[tokio::test]
async fn while_its_jti_store_is_down_a_tool_answers_503_and_runs_nothing() {
    let infra = Infra::start().await;
    let (signer, _) = Signer::generate("k1").unwrap();
    let keys = KeySet {
        keys: vec![signer.public().clone()],
    };
    let verifier = Verifier::new(
        Jwks::fixed(keys),
        "https://countersign.example.com",
        "refunds",
        jtis(&infra, &prefix()).await,
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let app = Router::new().route(
        "/refunds",
        post(move |Extension(_): Extension<Checked>| async move {
            counted.fetch_add(1, Ordering::SeqCst);
            "refunded"
        })
        .layer(RequireReceipt::new(Arc::new(verifier), "issue_refund")),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/refunds", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let input = json!({"order_id": "A-1001", "amount": 129});
    let call = |jti: &str| {
        let receipt = signer.sign(&Claims {
            iss: "https://countersign.example.com".into(),
            aud: "refunds".into(),
            iat: now(),
            exp: now() + 300,
            jti: jti.into(),
            run_id: "run_1".into(),
            turn: 1,
            call_id: "toolu_2".into(),
            tool: "issue_refund".into(),
            input_digest: input_digest(&input),
            action: "approve".into(),
            decided_by: vec!["rita".into()],
            policy_version: "p1".into(),
            grant: None,
            risk: None,
            stages: Vec::new(),
            windows: Vec::new(),
        });
        reqwest::Client::new()
            .post(&url)
            .header("Countersign-Receipt", receipt)
            .header("Idempotency-Key", "run_1:1:toolu_2")
            .json(&input)
            .send()
    };

    assert_eq!(call("j1").await.unwrap().status(), 200);
    infra.stop_redis().await;
    let refused = call("j2").await.unwrap();
    assert_eq!(refused.status(), 503);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "jti_store_unavailable", "{body}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
