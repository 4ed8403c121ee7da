//! The tool's check of a receipt against the request it came with: signed by a published key,
//! issued by the expected gateway, for this tool (`aud` and `tool`), not expired (with a small
//! leeway for clocks), sent under exactly its call's `Idempotency-Key` (`RUN:TURN:CALL`, byte
//! for byte), for exactly this input, and not used before by another request.

use crate::jtis::{JtiStore, Seen, SeenJtis};
use crate::jwks::Jwks;
use crate::{Claims, KeySet, PublicKey, input_digest};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

/// How far clocks may disagree, in seconds.
const LEEWAY_SECS: u64 = 30;

/// Why a receipt does not let the call run; each says what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The request carries no receipt.
    #[error("the request carries no receipt")]
    Missing,
    /// The receipt is not a JWT the tool can decode; the decoder's message.
    #[error("the receipt is not a JWT this tool can read: {0}")]
    Malformed(String),
    /// The receipt's key id (`kid`) is not among the published keys.
    #[error("the receipt is signed with key {0:?}, which is not published")]
    UnknownKey(String),
    /// The signature does not verify with the published key.
    #[error("the receipt's signature does not verify")]
    BadSignature,
    /// The receipt's `iss` is not the gateway the tool expects.
    #[error("the receipt was issued by another gateway")]
    OtherIssuer,
    /// The receipt's `aud` or `tool` is not this tool.
    #[error("the receipt is for another tool")]
    OtherTool,
    /// The request's `Idempotency-Key` is not exactly the receipt's `RUN:TURN:CALL`, as the
    /// worker sends the call it was signed for.
    #[error("the receipt is for another call than the one this request makes")]
    OtherCall,
    /// The receipt's `exp` has passed (beyond the clock leeway).
    #[error("the receipt has expired")]
    Expired,
    /// The body's digest is not the one the receipt carries: the input is not the one approved.
    #[error("the input is not the one that was approved")]
    InputChanged,
    /// The body holds an integer past ±(2^53 − 1): the digest (RFC 8785) reads numbers as
    /// doubles, so it does not bind that integer exactly (`…993` and `…992` share one).
    #[error(
        "the input holds an integer past 2^53 - 1, which the receipt's digest does not bind exactly"
    )]
    InexactNumber,
    /// A reviewer model approved the call, and this tool takes only people's approvals
    /// ([`Verifier::people_only`]).
    #[error(
        "the call was approved by a reviewer model, and this tool takes only people's approvals"
    )]
    ModelApproved,
    /// The receipt was used before by a request with another `Idempotency-Key`.
    #[error("the receipt was used before, by another request")]
    Reused,
    /// The published keys are out of date and cannot be fetched; the detail is for the
    /// tool's log, not for its answer.
    #[error("the receipt's keys cannot be fetched now")]
    KeysUnavailable(String),
    /// The jti store did not answer; the detail is for the tool's log.
    #[error("the receipt cannot be checked for earlier use now")]
    JtiStoreUnavailable(String),
}

impl Refusal {
    /// A stable name for machines: the `code` of a refusal's HTTP answer.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Malformed(_) => "malformed",
            Self::UnknownKey(_) => "unknown_key",
            Self::BadSignature => "bad_signature",
            Self::OtherIssuer => "other_issuer",
            Self::OtherTool => "other_tool",
            Self::OtherCall => "other_call",
            Self::Expired => "expired",
            Self::InputChanged => "input_changed",
            Self::InexactNumber => "inexact_number",
            Self::ModelApproved => "model_approved",
            Self::Reused => "reused",
            Self::KeysUnavailable(_) => "keys_unavailable",
            Self::JtiStoreUnavailable(_) => "jti_store_unavailable",
        }
    }
}

/// A receipt that lets its call run.
#[derive(Clone, Debug, PartialEq)]
pub struct Checked {
    /// The receipt's claims, as signed.
    pub claims: Claims,
    /// The receipt was let through before for a request with the same `Idempotency-Key`:
    /// the tool answers as it answered that request, and runs nothing again.
    pub again: bool,
}

/// What a tool checks receipts with: the gateway's keys, who the tool expects receipts from
/// and for, and the receipts it has run.
pub struct Verifier<R = SeenJtis> {
    keys: Jwks,
    issuer: String,
    audience: String,
    jtis: R,
    people_only: bool,
}

impl<R: JtiStore> Verifier<R> {
    /// `issuer` is the gateway's public base URL, `audience` the tool service's own name.
    pub fn new(
        keys: Jwks,
        issuer: impl Into<String>,
        audience: impl Into<String>,
        jtis: R,
    ) -> Self {
        Self {
            keys,
            issuer: issuer.into(),
            audience: audience.into(),
            jtis,
            people_only: false,
        }
    }

    /// Refuses every call a reviewer model approved ([`Claims::approved_by_model`]), for a
    /// tool whose calls only people may approve, whatever an agent's policy lets a model do.
    pub fn people_only(mut self) -> Self {
        self.people_only = true;
        self
    }

    /// The gateway's published keys the verifier checks signatures with.
    pub fn keys(&self) -> &Jwks {
        &self.keys
    }

    /// Checks `token`, the receipt a request came with, for a call of `tool` (its name in the
    /// agent's definition) whose input is the JSON `body`, sent with `idempotency_key`.
    pub async fn check(
        &self,
        token: Option<&str>,
        tool: &str,
        idempotency_key: Option<&str>,
        body: &[u8],
    ) -> Result<Checked, Refusal> {
        let token = token.ok_or(Refusal::Missing)?;
        let kid = kid_of(token)?;
        let key = match self.keys.find(&kid).await {
            Ok(Some(key)) => key,
            Ok(None) => return Err(Refusal::UnknownKey(kid)),
            Err(e) => return Err(Refusal::KeysUnavailable(e.to_string())),
        };
        let claims = self.signed_claims(token, &key)?;
        if claims.tool != tool {
            return Err(Refusal::OtherTool);
        }
        if self.people_only && claims.approved_by_model() {
            return Err(Refusal::ModelApproved);
        }
        // Byte for byte: a key that names the run and call in another form (`RUN:01:CALL`,
        // another turn) is another request, which would spend the receipt before the
        // worker's own call and have that refused.
        let idempotency_key = match idempotency_key {
            Some(key) if key == idempotency_key_of(&claims) => key,
            _ => return Err(Refusal::OtherCall),
        };
        // A body that is not JSON cannot be the input anyone approved.
        let input: serde_json::Value =
            serde_json::from_slice(body).map_err(|_| Refusal::InputChanged)?;
        if has_inexact_integer(body) {
            return Err(Refusal::InexactNumber);
        }
        if claims.input_digest != input_digest(&input) {
            return Err(Refusal::InputChanged);
        }
        // Last, so a receipt refused for anything else is not spent. Remembered for a leeway
        // past the last second this tool accepts it, as another instance's clock may be
        // behind this one's by as much.
        let until = claims.exp.saturating_add(2 * LEEWAY_SECS as i64);
        let seen = self
            .jtis
            .first_use(&claims.jti, idempotency_key, until)
            .await
            .map_err(|e| Refusal::JtiStoreUnavailable(e.to_string()))?;
        match seen {
            Seen::First => Ok(Checked {
                claims,
                again: false,
            }),
            Seen::Again => Ok(Checked {
                claims,
                again: true,
            }),
            Seen::Reused => Err(Refusal::Reused),
        }
    }

    /// The claims of `token` if `key` signed it, for this gateway and tool service, unexpired.
    fn signed_claims(&self, token: &str, key: &PublicKey) -> Result<Claims, Refusal> {
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.leeway = LEEWAY_SECS;
        validation.set_audience(&[&self.audience]);
        validation.set_issuer(&[&self.issuer]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        decode(token, key, &validation)
    }
}

/// The claims of a receipt kept as a record, if one of `keys` signed it, whatever its age,
/// issuer or audience: for an audit, long after the call ran. Never a reason to run a call
/// (that is [`Verifier::check`]).
pub fn signed_by(token: &str, keys: &KeySet) -> Result<Claims, Refusal> {
    let kid = kid_of(token)?;
    let key = keys.find(&kid).ok_or(Refusal::UnknownKey(kid))?;
    let mut validation = Validation::new(Algorithm::EdDSA);
    validation.validate_exp = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    decode(token, key, &validation)
}

fn decode(token: &str, key: &PublicKey, validation: &Validation) -> Result<Claims, Refusal> {
    let key =
        DecodingKey::from_ed_components(&key.x).map_err(|e| Refusal::Malformed(e.to_string()))?;
    jsonwebtoken::decode::<Claims>(token, &key, validation)
        .map(|data| data.claims)
        .map_err(|e| match e.kind() {
            ErrorKind::InvalidSignature => Refusal::BadSignature,
            ErrorKind::ExpiredSignature => Refusal::Expired,
            ErrorKind::InvalidIssuer => Refusal::OtherIssuer,
            ErrorKind::InvalidAudience => Refusal::OtherTool,
            _ => Refusal::Malformed(e.to_string()),
        })
}

/// The `Idempotency-Key` the call a receipt was signed for is sent with: `RUN:TURN:CALL`,
/// the turn in decimal without leading zeros, as workers send it.
pub fn idempotency_key(claims: &Claims) -> String {
    idempotency_key_of(claims)
}

fn idempotency_key_of(claims: &Claims) -> String {
    format!("{}:{}:{}", claims.run_id, claims.turn, claims.call_id)
}

/// The largest integer an IEEE double, and so the RFC 8785 digest, holds exactly.
const MAX_EXACT_INTEGER: u128 = (1 << 53) - 1;

/// Whether the JSON text `body` writes an integer (a number with no fraction and no
/// exponent) past ±(2^53 − 1). Read from the text, not from a parsed value: a parser that
/// turns a long integer into a double has already lost what the tool's own parser (Python's,
/// a big-integer type) may keep.
fn has_inexact_integer(body: &[u8]) -> bool {
    let mut i = 0;
    let mut in_string = false;
    while i < body.len() {
        let b = body[i];
        if in_string {
            match b {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i + usize::from(b == b'-');
                let mut end = start;
                while end < body.len() && body[end].is_ascii_digit() {
                    end += 1;
                }
                let integer = !matches!(body.get(end), Some(b'.' | b'e' | b'E'));
                let digits = &body[start..end];
                let past = digits.len() >= 16
                    && std::str::from_utf8(digits)
                        .ok()
                        .and_then(|d| d.parse::<u128>().ok())
                        .is_none_or(|n| n > MAX_EXACT_INTEGER);
                if integer && past {
                    return true;
                }
                // The rest of the number (fraction, exponent) is skipped as it comes.
                i = end.max(i + 1);
            }
            _ => i += 1,
        }
    }
    false
}

/// The `kid` of an EdDSA receipt's header.
fn kid_of(token: &str) -> Result<String, Refusal> {
    let header =
        jsonwebtoken::decode_header(token).map_err(|e| Refusal::Malformed(e.to_string()))?;
    if header.alg != Algorithm::EdDSA {
        return Err(Refusal::Malformed(format!(
            "alg {:?} is not EdDSA",
            header.alg
        )));
    }
    header
        .kid
        .ok_or_else(|| Refusal::Malformed("the header names no kid".into()))
}

#[cfg(test)]
mod tests {
    use super::has_inexact_integer;

    #[test]
    fn integers_past_two_to_the_53_are_found_in_the_text() {
        for body in [
            r#"{"a": 9007199254740992}"#,
            r#"{"a": -9007199254740993}"#,
            r#"[1, {"b": 18446744073709551616}]"#,
            r#"{"a": 123456789012345678901234567890123456789012}"#,
        ] {
            assert!(has_inexact_integer(body.as_bytes()), "{body}");
        }
        for body in [
            r#"{"a": 9007199254740991, "b": -9007199254740991}"#,
            r#"{"a": 1e300, "b": 90071992547409930.5, "c": 9007199254740993e0}"#,
            r#"{"a": "9007199254740993", "b\"": "x\"9007199254740993"}"#,
        ] {
            assert!(!has_inexact_integer(body.as_bytes()), "{body}");
        }
    }
}
