//! Standard Webhooks signatures: `webhook-signature` is `v1,` + base64 HMAC-SHA256 of
//! `{webhook-id}.{webhook-timestamp}.{body}`, keyed with the bytes of a `whsec_` secret.
//! Outbound webhooks are signed with it and inbound decisions may be authenticated by it.

use base64::Engine;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::fmt;

/// How far a signed request's timestamp may be from now, either way.
pub const TOLERANCE_SECS: i64 = 5 * 60;

/// A `whsec_` secret; it parses (and so is checked) where config is read, and never prints.
#[derive(Clone, serde::Deserialize)]
#[serde(try_from = "String")]
pub struct WebhookSecret(Vec<u8>);

impl TryFrom<String> for WebhookSecret {
    type Error = SignatureError;
    fn try_from(s: String) -> Result<Self, SignatureError> {
        Self::parse(&s)
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(<redacted>)")
    }
}

/// Why a secret or a signed request is refused.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum SignatureError {
    /// The secret is not `whsec_` and base64 of 24 to 64 bytes.
    #[error("the secret must be whsec_ followed by base64 of 24 to 64 bytes")]
    BadSecret,
    /// The request lacks one of the three `webhook-*` headers.
    #[error("webhook-id, webhook-timestamp and webhook-signature are all required")]
    MissingHeader,
    /// The request's timestamp is more than five minutes from now.
    #[error("webhook-timestamp is not within five minutes of now")]
    Stale,
    /// No signature in `webhook-signature` matches the body.
    #[error("no webhook-signature matches the body")]
    Mismatch,
}

impl WebhookSecret {
    /// The secret `secret`, checked: `whsec_` and base64 of 24 to 64 bytes (padding optional).
    pub fn parse(secret: &str) -> Result<Self, SignatureError> {
        // Padding is optional, as the Standard Webhooks libraries take it.
        const SECRET_B64: GeneralPurpose = GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
        );
        let key = secret
            .strip_prefix("whsec_")
            .and_then(|b64| SECRET_B64.decode(b64).ok())
            .filter(|k| (24..=64).contains(&k.len()))
            .ok_or(SignatureError::BadSecret)?;
        Ok(Self(key))
    }

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(format!("{id}.{timestamp}.").as_bytes());
        mac.update(body);
        mac
    }

    /// The `webhook-signature` value for a message.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let tag = self.mac(id, timestamp, body).finalize().into_bytes();
        format!("v1,{}", STANDARD.encode(tag))
    }

    /// Checks a signed message: the timestamp is recent and one of the space-separated
    /// `v1,` signatures matches (compared in constant time).
    pub fn verify(
        &self,
        id: &str,
        timestamp: &str,
        signatures: &str,
        body: &[u8],
        now_secs: i64,
    ) -> Result<(), SignatureError> {
        let ts: i64 = timestamp.parse().map_err(|_| SignatureError::Stale)?;
        if (now_secs - ts).abs() > TOLERANCE_SECS {
            return Err(SignatureError::Stale);
        }
        let matches = signatures
            .split_whitespace()
            .filter_map(|s| s.strip_prefix("v1,"))
            .filter_map(|b64| STANDARD.decode(b64).ok())
            .any(|tag| self.mac(id, ts, body).verify_slice(&tag).is_ok());
        if matches {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The known answer published with the Standard Webhooks specification.
    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
    const TS: i64 = 1649367553;
    const BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
    const SIGNATURE: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";

    #[test]
    fn signing_matches_the_specifications_example() {
        let secret = WebhookSecret::parse(SECRET).unwrap();
        assert_eq!(secret.sign(ID, TS, BODY), SIGNATURE);
    }

    #[test]
    fn verification_accepts_a_match_among_several_and_refuses_the_rest() {
        let secret = WebhookSecret::parse(SECRET).unwrap();
        let header = format!("v1,bm90IGl0 {SIGNATURE}");
        assert_eq!(
            secret.verify(ID, "1649367553", &header, BODY, TS + 10),
            Ok(())
        );
        assert_eq!(
            secret.verify(ID, "1649367553", SIGNATURE, b"{}", TS),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            secret.verify(ID, "1649367553", SIGNATURE, BODY, TS + 301),
            Err(SignatureError::Stale)
        );
    }

    #[test]
    fn secrets_must_have_the_prefix_and_a_sane_length() {
        assert!(WebhookSecret::parse("C2FVsBQIhrscChlQIMV+b5sSYspob7oD").is_err());
        assert!(WebhookSecret::parse("whsec_YWJj").is_err());
        assert!(!format!("{:?}", WebhookSecret::parse(SECRET).unwrap()).contains("C2FV"));
    }

    #[test]
    fn secrets_are_taken_with_or_without_padding() {
        let padded = WebhookSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let unpadded =
            WebhookSecret::parse("whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxw").unwrap();
        let padded_too =
            WebhookSecret::parse("whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxw=").unwrap();
        assert_eq!(unpadded.sign("m", 1, b"x"), padded_too.sign("m", 1, b"x"));
        assert_ne!(padded.sign("m", 1, b"x"), unpadded.sign("m", 1, b"x"));
    }
}
