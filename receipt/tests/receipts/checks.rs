//! Receipts signed here, checked here and by a JWT implementation nobody here wrote.

use crate::support::{AUDIENCE, ISSUER, KEY, TOOL, body, claims, now, set, verifier};
use countersign_receipt::{
    Checked, FileJtis, Jwks, KeySet, Refusal, SeenJtis, Signer, Verifier, idempotency_key,
    input_digest,
};
use serde_json::{Value, json};

#[tokio::test]
async fn a_receipt_runs_once_and_a_retry_with_the_same_idempotency_key_comes_through_again() {
    let (signer, _) = Signer::generate("k1").unwrap();
    let input = json!({"order_id": "A-1001", "amount": 129});
    let token = signer.sign(&claims(&input, "j1"));
    let verifier = verifier(Jwks::fixed(set(&[&signer])));
    let sent = body(&input);
    let check = |key| verifier.check(Some(&token), TOOL, key, &sent);

    assert_eq!(
        check(Some("run_1:1:toolu_2")).await,
        Ok(Checked {
            claims: claims(&input, "j1"),
            again: false
        })
    );
    assert_eq!(
        check(Some("run_1:1:toolu_2")).await,
        Ok(Checked {
            claims: claims(&input, "j1"),
            again: true
        })
    );
    // Another request of the same call (another turn's key) is not the call it was signed
    // for.
    assert_eq!(
        check(Some("run_1:2:toolu_2")).await,
        Err(Refusal::OtherCall)
    );
}

#[tokio::test]
async fn a_tool_that_takes_only_people_s_approvals_refuses_a_model_s_and_keeps_the_receipt_unspent()
{
    let (signer, _) = Signer::generate("k1").unwrap();
    let input = json!({"order_id": "A-1001", "amount": 12});
    let mut by_model = claims(&input, "j1");
    by_model.decided_by = vec!["model:claude-haiku@3f2a9c1d0b4e5f60".into()];
    assert!(by_model.approved_by_model() && !claims(&input, "j2").approved_by_model());
    let token = signer.sign(&by_model);
    let sent = body(&input);
    let strict = verifier(Jwks::fixed(set(&[&signer]))).people_only();
    assert_eq!(
        strict.check(Some(&token), TOOL, Some(KEY), &sent).await,
        Err(Refusal::ModelApproved)
    );
    assert_eq!(Refusal::ModelApproved.code(), "model_approved");
    // A person's receipt passes the same verifier.
    let by_person = signer.sign(&claims(&input, "j2"));
    assert!(
        strict
            .check(Some(&by_person), TOOL, Some(KEY), &sent)
            .await
            .is_ok()
    );
    // A verifier that takes models' approvals runs it.
    let open = verifier(Jwks::fixed(set(&[&signer])));
    let checked = open
        .check(Some(&token), TOOL, Some(KEY), &sent)
        .await
        .unwrap();
    assert!(!checked.again);
}

#[tokio::test]
async fn a_receipt_runs_only_for_the_run_and_call_its_request_names() {
    let (signer, _) = Signer::generate("k1").unwrap();
    let input = json!({"order_id": "A-1001", "amount": 129});
    let token = signer.sign(&claims(&input, "j1"));
    let verifier = verifier(Jwks::fixed(set(&[&signer])));
    let sent = body(&input);
    let check = |key| verifier.check(Some(&token), TOOL, key, &sent);

    // The same input asked by another call, or another run, or a request that names none:
    // refused, and the receipt is not spent.
    for key in [
        Some("run_1:1:toolu_3"),
        Some("run_2:1:toolu_2"),
        Some("run_1:toolu_2"),
        Some("run_1:x:toolu_2"),
        Some("run_11:1:toolu_2"),
        Some(""),
        None,
    ] {
        assert_eq!(check(key).await, Err(Refusal::OtherCall), "{key:?}");
    }
    assert!(check(Some(KEY)).await.is_ok());
}

#[tokio::test]
async fn a_receipt_is_spent_only_under_its_exact_run_turn_call_key_so_no_reader_spends_it_first() {
    let (signer, _) = Signer::generate("k1").unwrap();
    let input = json!({"order_id": "A-1001", "amount": 129});
    let mut signed = claims(&input, "j1");
    signed.turn = 3;
    let token = signer.sign(&signed);
    let verifier = verifier(Jwks::fixed(set(&[&signer])));
    let sent = body(&input);
    let check = |key| verifier.check(Some(&token), TOOL, key, &sent);
    let workers = "run_1:3:toolu_2";
    assert_eq!(idempotency_key(&signed), workers);

    // Someone who read the receipt sends it first under keys that name the same run, turn
    // and call in another form, or another turn: each is another request, and is refused
    // without spending the receipt.
    for key in [
        "run_1:03:toolu_2",
        "run_1:+3:toolu_2",
        "run_1:3.0:toolu_2",
        "run_1:1:toolu_2",
        "run_1:4:toolu_2",
        "run_1:3:toolu_2 ",
        " run_1:3:toolu_2",
        "RUN_1:3:toolu_2",
        "run_1:3:toolu_2:",
        "run_1::3:toolu_2",
    ] {
        assert_eq!(check(Some(key)).await, Err(Refusal::OtherCall), "{key:?}");
    }
    // The worker's own call, with the key it sends, runs.
    assert_eq!(
        check(Some(workers)).await,
        Ok(Checked {
            claims: signed.clone(),
            again: false
        })
    );
    // And its retry is recognised as one.
    assert!(check(Some(workers)).await.unwrap().again);
}

#[tokio::test]
async fn a_receipt_run_once_stays_spent_after_the_tool_restarts_when_its_store_is_a_file() {
    let (signer, _) = Signer::generate("k1").unwrap();
    let keys = || Jwks::fixed(set(&[&signer]));
    let input = json!({"order_id": "A-1001", "amount": 129});
    let token = signer.sign(&claims(&input, "j1"));
    let sent = body(&input);
    let folder = std::env::temp_dir().join(format!("receipts-{}", uuid_like()));
    std::fs::create_dir_all(&folder).unwrap();
    let file = folder.join("receipts-run.jsonl");

    // The tool runs the receipt, then restarts.
    let first = Verifier::new(keys(), ISSUER, AUDIENCE, FileJtis::open(&file).unwrap());
    let checked = first.check(Some(&token), TOOL, Some(KEY), &sent).await;
    assert!(!checked.unwrap().again);
    drop(first);
    // Remembered in memory only, the receipt would run again after the restart.
    let forgetful = Verifier::new(keys(), ISSUER, AUDIENCE, SeenJtis::default());
    let checked = forgetful.check(Some(&token), TOOL, Some(KEY), &sent).await;
    assert!(!checked.unwrap().again, "a store in memory forgets it");

    // Remembered in the file, it is spent: the same request is a retry, answered as the
    // first was and run no more (the tool must then hold that answer, or refuse).
    let restarted = Verifier::new(keys(), ISSUER, AUDIENCE, FileJtis::open(&file).unwrap());
    let checked = restarted.check(Some(&token), TOOL, Some(KEY), &sent).await;
    assert!(checked.unwrap().again);
    drop(restarted);

    // One line per first use; a line torn by a crash mid-write (a use never answered) and
    // receipts expired are dropped when the file is opened again, the rest kept.
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    let expired = format!(
        "{{\"jti\":\"old\",\"key\":\"run_0:1:toolu_1\",\"until\":{}}}\n",
        now() - 10
    );
    let mut kept = expired + &text;
    kept.push_str("{\"jti\":\"torn\",\"ke");
    std::fs::write(&file, &kept).unwrap();
    let reopened = Verifier::new(keys(), ISSUER, AUDIENCE, FileJtis::open(&file).unwrap());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    let checked = reopened.check(Some(&token), TOOL, Some(KEY), &sent).await;
    assert!(checked.unwrap().again);
    // A second receipt after reopening is appended on a line of its own.
    let other = signer.sign(&claims(&input, "j2"));
    let checked = reopened.check(Some(&other), TOOL, Some(KEY), &sent).await;
    assert!(!checked.unwrap().again);
    assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 2);
    std::fs::remove_dir_all(&folder).unwrap();
}

/// A name no other test run uses.
fn uuid_like() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

#[tokio::test]
async fn a_receipt_missing_or_for_other_input_tool_issuer_or_key_or_expired_is_refused_and_not_spent()
 {
    let (signer, _) = Signer::generate("k1").unwrap();
    let (stranger, _) = Signer::generate("k9").unwrap();
    let keys = set(&[&signer]);
    let approved = json!({"order_id": "A-1001", "amount": 20});
    let edited_away = json!({"order_id": "A-1001", "amount": 129});
    let verifier = verifier(Jwks::fixed(keys.clone()));
    let check = |token: String, tool, input: &Value| {
        let body = body(input);
        let verifier = &verifier;
        async move { verifier.check(Some(&token), tool, Some(KEY), &body).await }
    };
    let token = signer.sign(&claims(&approved, "j2"));

    assert_eq!(
        verifier
            .check(None, TOOL, Some(KEY), &body(&approved))
            .await,
        Err(Refusal::Missing)
    );
    // The body the tool received is not the one approved (an edit's original input with the
    // edit's receipt), or not JSON at all.
    assert_eq!(
        check(token.clone(), TOOL, &edited_away).await,
        Err(Refusal::InputChanged)
    );
    assert_eq!(
        verifier
            .check(Some(&token), TOOL, Some(KEY), b"amount=20")
            .await,
        Err(Refusal::InputChanged)
    );
    assert_eq!(
        check(token.clone(), "send_email", &approved).await,
        Err(Refusal::OtherTool)
    );
    let other_service = Verifier::new(
        Jwks::fixed(keys.clone()),
        ISSUER,
        "emails",
        SeenJtis::default(),
    );
    assert_eq!(
        other_service
            .check(Some(&token), TOOL, Some(KEY), &body(&approved))
            .await,
        Err(Refusal::OtherTool)
    );
    let other_gateway = Verifier::new(
        Jwks::fixed(keys),
        "https://elsewhere.example.com",
        AUDIENCE,
        SeenJtis::default(),
    );
    assert_eq!(
        other_gateway
            .check(Some(&token), TOOL, Some(KEY), &body(&approved))
            .await,
        Err(Refusal::OtherIssuer)
    );
    assert_eq!(
        check(stranger.sign(&claims(&approved, "j3")), TOOL, &approved).await,
        Err(Refusal::UnknownKey("k9".into()))
    );
    // The stranger's signature under a published kid.
    let (impostor, _) = Signer::generate("k1").unwrap();
    assert_eq!(
        check(impostor.sign(&claims(&approved, "j4")), TOOL, &approved).await,
        Err(Refusal::BadSignature)
    );
    let mut old = claims(&approved, "j5");
    old.iat = now() - 7200;
    old.exp = now() - 3600;
    assert_eq!(
        check(signer.sign(&old), TOOL, &approved).await,
        Err(Refusal::Expired)
    );
    assert!(matches!(
        check("not.a.jwt".into(), TOOL, &approved).await,
        Err(Refusal::Malformed(_))
    ));
    // None of that spent the receipt.
    assert!(check(token, TOOL, &approved).await.is_ok());
}

#[tokio::test]
async fn the_body_is_compared_as_canonical_json_so_key_order_and_spacing_do_not_matter() {
    let (signer, _) = Signer::generate("k1").unwrap();
    let approved = json!({"order_id": "A-1001", "amount": 129});
    let token = signer.sign(&claims(&approved, "j9"));
    let sent = br#"{ "amount": 129.0,
        "order_id": "A-1001" }"#;
    let verifier = verifier(Jwks::fixed(set(&[&signer])));
    assert!(
        verifier
            .check(Some(&token), TOOL, Some(KEY), sent)
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn a_body_with_an_integer_past_two_to_the_53_is_refused_not_rounded() {
    // The attack: a receipt for account 9007199254740993, a body saying …992. RFC 8785
    // reads both as the double 9007199254740992, so the digests agree; a tool that parses
    // integers exactly would pay into another account.
    let (signer, _) = Signer::generate("k1").unwrap();
    let approved = json!({"account": 9_007_199_254_740_993_u64, "amount": 20});
    let token = signer.sign(&claims(&approved, "j10"));
    let verifier = verifier(Jwks::fixed(set(&[&signer])));
    let forged = br#"{"account": 9007199254740992, "amount": 20}"#;
    assert_eq!(
        input_digest(&serde_json::from_slice(forged).unwrap()),
        input_digest(&approved),
        "one digest for two integers"
    );
    for sent in [
        &forged[..],
        &body(&approved),
        br#"{"account": 18446744073709551617, "amount": 20}"#,
    ] {
        assert_eq!(
            verifier.check(Some(&token), TOOL, Some(KEY), sent).await,
            Err(Refusal::InexactNumber),
            "{}",
            String::from_utf8_lossy(sent)
        );
    }
    assert_eq!(Refusal::InexactNumber.code(), "inexact_number");
    // Integers within ±(2^53 − 1), and numbers written as doubles, are bound as before.
    let exact = json!({"account": 9_007_199_254_740_991_u64, "amount": 20.5});
    let token = signer.sign(&claims(&exact, "j11"));
    assert!(
        verifier
            .check(Some(&token), TOOL, Some(KEY), &body(&exact))
            .await
            .is_ok()
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
