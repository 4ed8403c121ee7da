//! Receipts signed here, checked here and by a JWT implementation nobody here wrote.

use countersign_receipt::{
    Claims, Expect, KeySet, Refusal, SeenJtis, Signer, input_digest, verify,
};
use serde_json::{Value, json};

const ISSUER: &str = "https://countersign.example.com";

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Issued at a fixed second of today, so two made apart compare equal.
fn claims(input: &Value, jti: &str) -> Claims {
    let issued = now() / 86_400 * 86_400;
    Claims {
        iss: ISSUER.into(),
        aud: "refunds".into(),
        iat: issued,
        exp: issued + 2 * 86_400,
        jti: jti.into(),
        run_id: "run_1".into(),
        call_id: "toolu_2".into(),
        tool: "issue_refund".into(),
        input_digest: input_digest(input),
        action: "approve".into(),
        decided_by: vec!["rita".into()],
        policy_version: "p1".into(),
    }
}

fn expect(input: &Value) -> Expect<'_> {
    Expect {
        issuer: ISSUER,
        audience: "refunds",
        tool: "issue_refund",
        input,
    }
}

fn set(signers: &[&Signer]) -> KeySet {
    KeySet {
        keys: signers.iter().map(|s| s.public().clone()).collect(),
    }
}

#[test]
fn an_approved_calls_receipt_verifies_once_with_its_claims() {
    let (signer, _) = Signer::generate("k1").unwrap();
    let input = json!({"order_id": "A-1001", "amount": 129});
    let token = signer.sign(&claims(&input, "j1"));
    let seen = SeenJtis::default();
    let got = verify(&token, &set(&[&signer]), &expect(&input), &seen).unwrap();
    assert_eq!(got, claims(&input, "j1"));
    assert_eq!(
        verify(&token, &set(&[&signer]), &expect(&input), &seen),
        Err(Refusal::Replayed)
    );
}

#[test]
fn a_receipt_for_other_input_another_tool_issuer_or_key_or_expired_is_refused_and_not_spent() {
    let (signer, _) = Signer::generate("k1").unwrap();
    let (stranger, _) = Signer::generate("k9").unwrap();
    let keys = set(&[&signer]);
    let approved = json!({"order_id": "A-1001", "amount": 20});
    let edited_away = json!({"order_id": "A-1001", "amount": 129});
    let seen = SeenJtis::default();
    let token = signer.sign(&claims(&approved, "j2"));

    // The body the tool received is not the one approved (an edit's original input with the
    // edit's receipt).
    assert_eq!(
        verify(&token, &keys, &expect(&edited_away), &seen),
        Err(Refusal::InputChanged)
    );
    let other_tool = Expect {
        audience: "emails",
        ..expect(&approved)
    };
    assert_eq!(
        verify(&token, &keys, &other_tool, &seen),
        Err(Refusal::OtherTool)
    );
    let other_name = Expect {
        tool: "send_email",
        ..expect(&approved)
    };
    assert_eq!(
        verify(&token, &keys, &other_name, &seen),
        Err(Refusal::OtherTool)
    );
    let other_issuer = Expect {
        issuer: "https://elsewhere.example.com",
        ..expect(&approved)
    };
    assert_eq!(
        verify(&token, &keys, &other_issuer, &seen),
        Err(Refusal::OtherIssuer)
    );
    let unknown = stranger.sign(&claims(&approved, "j3"));
    assert_eq!(
        verify(&unknown, &keys, &expect(&approved), &seen),
        Err(Refusal::UnknownKey("k9".into()))
    );
    // The stranger's signature under a published kid.
    let (impostor, _) = Signer::generate("k1").unwrap();
    let forged = impostor.sign(&claims(&approved, "j4"));
    assert_eq!(
        verify(&forged, &keys, &expect(&approved), &seen),
        Err(Refusal::BadSignature)
    );
    let mut old = claims(&approved, "j5");
    old.iat = now() - 7200;
    old.exp = now() - 3600;
    assert_eq!(
        verify(&signer.sign(&old), &keys, &expect(&approved), &seen),
        Err(Refusal::Expired)
    );
    assert!(matches!(
        verify("not.a.jwt", &keys, &expect(&approved), &seen),
        Err(Refusal::Malformed(_))
    ));
    // None of that spent the receipt.
    assert!(verify(&token, &keys, &expect(&approved), &seen).is_ok());
}

#[test]
fn receipts_of_a_retired_key_verify_while_it_is_published_and_not_after() {
    let (old, _) = Signer::generate("2026-11").unwrap();
    let (new, _) = Signer::generate("2026-12").unwrap();
    let input = json!({"amount": 5});
    let before = old.sign(&claims(&input, "j6"));
    let after = new.sign(&claims(&input, "j7"));
    let rotating = set(&[&new, &old]);
    assert!(verify(&before, &rotating, &expect(&input), &SeenJtis::default()).is_ok());
    assert!(verify(&after, &rotating, &expect(&input), &SeenJtis::default()).is_ok());
    let retired = set(&[&new]);
    assert_eq!(
        verify(&before, &retired, &expect(&input), &SeenJtis::default()),
        Err(Refusal::UnknownKey("2026-11".into()))
    );
}

#[test]
fn the_key_set_is_a_standard_jwk_set_and_a_key_survives_its_pem() {
    let (signer, pem) = Signer::generate("k1").unwrap();
    let jwks = serde_json::to_value(set(&[&signer])).unwrap();
    let key = &jwks["keys"][0];
    assert_eq!(
        (
            &key["kty"],
            &key["crv"],
            &key["alg"],
            &key["use"],
            &key["kid"]
        ),
        (
            &json!("OKP"),
            &json!("Ed25519"),
            &json!("EdDSA"),
            &json!("sig"),
            &json!("k1")
        )
    );
    assert_eq!(key["x"].as_str().unwrap().len(), 43, "32 bytes, base64url");
    let back: KeySet = serde_json::from_value(jwks).unwrap();
    assert_eq!(back, set(&[&signer]));
    let again = Signer::from_pem("k1", &pem).unwrap();
    assert_eq!(again.public(), signer.public());
    assert!(
        Signer::from_pem(
            "k1",
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----"
        )
        .is_err()
    );
    assert!(Signer::from_pem("a kid with spaces", &pem).is_err());
}

#[test]
fn another_jwt_implementation_verifies_the_receipt_through_the_published_key() {
    use base64::Engine;
    use jwt_simple::prelude::*;

    #[derive(Serialize, Deserialize)]
    struct Countersigned {
        run_id: String,
        call_id: String,
        tool: String,
        input_digest: String,
        decided_by: Vec<String>,
    }

    let (signer, _) = Signer::generate("k1").unwrap();
    let input = serde_json::json!({"order_id": "A-1001", "amount": 129});
    let token = signer.sign(&claims(&input, "j8"));
    let jwks = serde_json::to_value(set(&[&signer])).unwrap();
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(jwks["keys"][0]["x"].as_str().unwrap())
        .unwrap();
    let key = Ed25519PublicKey::from_bytes(&x).unwrap();
    let options = VerificationOptions {
        allowed_issuers: Some(HashSet::from_strings(&[ISSUER])),
        allowed_audiences: Some(HashSet::from_strings(&["refunds"])),
        required_key_id: Some("k1".into()),
        ..Default::default()
    };
    let verified = key
        .verify_token::<Countersigned>(&token, Some(options))
        .unwrap();
    assert_eq!(verified.custom.input_digest, input_digest(&input));
    assert_eq!(verified.custom.decided_by, vec!["rita".to_string()]);
    assert_eq!(verified.jwt_id.as_deref(), Some("j8"));
    // And it refuses a byte changed in the payload.
    let mut parts: Vec<String> = token.split('.').map(str::to_string).collect();
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(&parts[1])
        .unwrap();
    let changed = String::from_utf8(payload)
        .unwrap()
        .replace("\"toolu_2\"", "\"toolu_3\"");
    parts[1] = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(changed);
    assert!(
        key.verify_token::<Countersigned>(&parts.join("."), None)
            .is_err()
    );
}

#[test]
fn the_input_digest_is_over_rfc_8785_canonical_json() {
    use sha2::{Digest, Sha256};
    // Key order, number forms and white space do not change it.
    let a: Value =
        serde_json::from_str(r#"{ "b": 1, "a": 129.0, "c": 1e21, "d": 0.0000001 }"#).unwrap();
    let canonical = r#"{"a":129,"b":1,"c":1e+21,"d":1e-7}"#;
    assert_eq!(
        input_digest(&a),
        format!("sha256:{}", hex::encode(Sha256::digest(canonical)))
    );
    // Keys sort by UTF-16 code units: U+10000 (a surrogate pair, 0xD800…) before U+FB33.
    let b = json!({"\u{fb33}": 1, "\u{10000}": 2});
    let canonical = "{\"\u{10000}\":2,\"\u{fb33}\":1}";
    assert_eq!(
        input_digest(&b),
        format!("sha256:{}", hex::encode(Sha256::digest(canonical)))
    );
}
