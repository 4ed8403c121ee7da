//! The keys as a tool follows them: fetched over HTTP from a gateway's JWK Set, fetched again
//! for a key the copy lacks (at most once per interval) and when the copy is too old, and not
//! used once too old to trust.

use crate::support::{KEY, TOOL, body, claims, set, verifier, wait_for};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use countersign_receipt::{Jwks, KeySet, Refresh, Refusal, Signer, Verifier};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A gateway's `GET /.well-known/jwks.json`: the set it publishes (none while it is down),
/// and how many times it was fetched.
#[derive(Clone)]
struct Gateway {
    url: String,
    published: Arc<Mutex<Option<KeySet>>>,
    fetches: Arc<AtomicUsize>,
}

impl Gateway {
    async fn start(keys: KeySet) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gateway = Self {
            url: format!(
                "http://{}/.well-known/jwks.json",
                listener.local_addr().unwrap()
            ),
            published: Arc::new(Mutex::new(Some(keys))),
            fetches: Arc::default(),
        };
        let app = Router::new()
            .route("/.well-known/jwks.json", get(serve))
            .with_state(gateway.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        gateway
    }

    fn publish(&self, keys: Option<KeySet>) {
        *self.published.lock().unwrap() = keys;
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    fn verifier(&self, refresh: Refresh) -> Verifier {
        verifier(Jwks::from_url(&self.url, refresh))
    }
}

async fn serve(State(gateway): State<Gateway>) -> Result<Json<KeySet>, StatusCode> {
    gateway.fetches.fetch_add(1, Ordering::SeqCst);
    let published = gateway.published.lock().unwrap().clone();
    published.map(Json).ok_or(StatusCode::SERVICE_UNAVAILABLE)
}

/// A receipt of `signer` for the same input, and its body.
fn receipt(signer: &Signer, jti: &str) -> (String, Vec<u8>) {
    let input = json!({"order_id": "A-1001", "amount": 129});
    (signer.sign(&claims(&input, jti)), body(&input))
}

async fn check(verifier: &Verifier, (token, body): &(String, Vec<u8>)) -> Result<bool, Refusal> {
    let checked = verifier.check(Some(token), TOOL, Some(KEY), body).await;
    checked.map(|c| c.again)
}

const NO_WAIT: Refresh = Refresh {
    min_interval: Duration::ZERO,
    max_age: Duration::from_secs(300),
};

#[tokio::test]
async fn a_key_published_after_the_first_fetch_is_fetched_when_a_receipt_names_it() {
    let (k1, _) = Signer::generate("k1").unwrap();
    let (k2, _) = Signer::generate("k2").unwrap();
    let gateway = Gateway::start(set(&[&k1])).await;
    let verifier = gateway.verifier(NO_WAIT);

    assert_eq!(check(&verifier, &receipt(&k1, "j1")).await, Ok(false));
    assert_eq!(check(&verifier, &receipt(&k1, "j2")).await, Ok(false));
    assert_eq!(gateway.fetches(), 1, "the set is kept");
    gateway.publish(Some(set(&[&k2, &k1])));
    assert_eq!(check(&verifier, &receipt(&k2, "j3")).await, Ok(false));
    assert_eq!(gateway.fetches(), 2);
}

#[tokio::test]
async fn receipts_naming_unknown_keys_fetch_at_most_once_per_interval_and_refresh_fetches_now() {
    let (k1, _) = Signer::generate("k1").unwrap();
    let (k2, _) = Signer::generate("k2").unwrap();
    let (forger, _) = Signer::generate("forged").unwrap();
    let gateway = Gateway::start(set(&[&k1])).await;
    let verifier = Arc::new(gateway.verifier(Refresh::default()));

    // Receipts arriving together before the first fetch wait for one fetch.
    let mut first = tokio::task::JoinSet::new();
    for i in 0..8 {
        let (verifier, receipt) = (verifier.clone(), receipt(&k1, &format!("j{i}")));
        first.spawn(async move { check(&verifier, &receipt).await });
    }
    while let Some(checked) = first.join_next().await {
        assert_eq!(checked.unwrap(), Ok(false));
    }
    assert_eq!(gateway.fetches(), 1);

    gateway.publish(Some(set(&[&k2, &k1])));
    for i in 0..5 {
        assert_eq!(
            check(&verifier, &receipt(&forger, &format!("f{i}"))).await,
            Err(Refusal::UnknownKey("forged".into()))
        );
    }
    // Not even for a key that is now published: the set was fetched under 10 s ago.
    assert_eq!(
        check(&verifier, &receipt(&k2, "j10")).await,
        Err(Refusal::UnknownKey("k2".into()))
    );
    assert_eq!(gateway.fetches(), 1);
    verifier.keys().refresh().await.unwrap();
    assert_eq!(gateway.fetches(), 2);
    assert_eq!(check(&verifier, &receipt(&k2, "j10")).await, Ok(false));
}

#[tokio::test]
async fn after_a_rotation_the_old_keys_receipts_verify_until_it_is_withdrawn_and_refetched() {
    let (old, _) = Signer::generate("2026-11").unwrap();
    let (new, _) = Signer::generate("2026-12").unwrap();
    let gateway = Gateway::start(set(&[&new, &old])).await;
    let verifier = gateway.verifier(Refresh::default());
    let before = receipt(&old, "j1");

    assert_eq!(check(&verifier, &before).await, Ok(false));
    assert_eq!(check(&verifier, &receipt(&new, "j2")).await, Ok(false));
    gateway.publish(Some(set(&[&new])));
    verifier.keys().refresh().await.unwrap();
    assert_eq!(
        check(&verifier, &before).await,
        Err(Refusal::UnknownKey("2026-11".into()))
    );
    assert_eq!(check(&verifier, &receipt(&new, "j3")).await, Ok(false));
}

#[tokio::test]
async fn a_withdrawn_key_stops_verifying_once_the_copy_is_past_its_maximum_age() {
    let (old, _) = Signer::generate("old").unwrap();
    let (new, _) = Signer::generate("new").unwrap();
    let gateway = Gateway::start(set(&[&old])).await;
    let verifier = gateway.verifier(Refresh {
        min_interval: Duration::ZERO,
        max_age: Duration::from_millis(200),
    });
    let before = receipt(&old, "j1");
    assert_eq!(check(&verifier, &before).await, Ok(false));

    gateway.publish(Some(set(&[&new])));
    // Until the copy is refetched, the same request's retry still passes.
    let refused = wait_for("the withdrawn key to be refused", || async {
        check(&verifier, &before).await.err()
    })
    .await;
    assert_eq!(refused, Refusal::UnknownKey("old".into()));
}

#[tokio::test]
async fn a_copy_past_its_maximum_age_is_not_used_while_the_gateway_cannot_serve_a_new_one() {
    let (k1, _) = Signer::generate("k1").unwrap();
    let gateway = Gateway::start(set(&[&k1])).await;
    let verifier = gateway.verifier(Refresh {
        min_interval: Duration::ZERO,
        max_age: Duration::from_millis(200),
    });
    let token = receipt(&k1, "j1");
    assert_eq!(check(&verifier, &token).await, Ok(false));

    gateway.publish(None);
    let refused = wait_for("the out-of-date keys to be refused", || async {
        check(&verifier, &token).await.err()
    })
    .await;
    assert!(
        matches!(&refused, Refusal::KeysUnavailable(detail) if detail.contains("503")),
        "{refused:?}"
    );
    // Once keys are served again, the same request's retry goes through.
    gateway.publish(Some(set(&[&k1])));
    assert_eq!(check(&verifier, &token).await, Ok(true));
}

#[tokio::test]
async fn receipts_are_refused_as_uncheckable_while_the_key_set_was_never_fetched() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let keys = Jwks::from_url(format!("http://{closed}/.well-known/jwks.json"), NO_WAIT);
    assert!(keys.refresh().await.is_err());
    let (k1, _) = Signer::generate("k1").unwrap();
    let checked = check(&verifier(keys), &receipt(&k1, "j1")).await;
    assert!(
        matches!(checked, Err(Refusal::KeysUnavailable(_))),
        "{checked:?}"
    );
}
