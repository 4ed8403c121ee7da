//! What the tests share: a receipt's claims, key sets, and a verifier of them.

use countersign_receipt::{Claims, Jwks, KeySet, SeenJtis, Signer, Verifier, input_digest};
use serde_json::Value;
use std::time::Duration;

pub(crate) const ISSUER: &str = "https://countersign.example.com";
/// The tool service's name: receipts' `aud`.
pub(crate) const AUDIENCE: &str = "refunds";
/// The tool's name in the agent's definition: receipts' `tool`.
pub(crate) const TOOL: &str = "issue_refund";

pub(crate) fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The `Idempotency-Key` of the call [`claims`] names, as a worker sends it.
pub(crate) const KEY: &str = "run_1:1:toolu_2";

/// Issued at a fixed second of today, so two made apart compare equal.
pub(crate) fn claims(input: &Value, jti: &str) -> Claims {
    let issued = now() / 86_400 * 86_400;
    Claims {
        iss: ISSUER.into(),
        aud: AUDIENCE.into(),
        iat: issued,
        exp: issued + 2 * 86_400,
        jti: jti.into(),
        run_id: "run_1".into(),
        turn: 1,
        call_id: "toolu_2".into(),
        tool: TOOL.into(),
        input_digest: input_digest(input),
        action: "approve".into(),
        decided_by: vec!["rita".into()],
        policy_version: "p1".into(),
        grant: None,
        risk: None,
        stages: Vec::new(),
        windows: Vec::new(),
    }
}

pub(crate) fn set(signers: &[&Signer]) -> KeySet {
    KeySet {
        keys: signers.iter().map(|s| s.public().clone()).collect(),
    }
}

/// A verifier for this tool service, with an in-memory jti store.
pub(crate) fn verifier(keys: Jwks) -> Verifier {
    Verifier::new(keys, ISSUER, AUDIENCE, SeenJtis::default())
}

pub(crate) fn body(input: &Value) -> Vec<u8> {
    serde_json::to_vec(input).unwrap()
}

/// Polls `check` until it returns `Some`, or panics naming `what` after 10 s.
pub(crate) async fn wait_for<T, Fut>(what: &str, mut check: impl FnMut() -> Fut) -> T
where
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
