//! The tool's check of a receipt against the request it came with: signed by a published key,
//! issued by the expected gateway, for this tool (`aud` and `tool`), not expired (with a small
//! leeway for clocks), for exactly this input, and not used before.

use crate::{Claims, KeySet, input_digest};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use std::collections::HashMap;
use std::sync::Mutex;

/// How far clocks may disagree, in seconds.
const LEEWAY_SECS: u64 = 30;

/// What the tool expects of a receipt.
pub struct Expect<'a> {
    /// The gateway's public base URL.
    pub issuer: &'a str,
    /// The tool's own name for itself.
    pub audience: &'a str,
    /// The tool's name in the agent's definition.
    pub tool: &'a str,
    /// The input the tool received.
    pub input: &'a serde_json::Value,
}

/// Why a receipt does not let the call run; each says what is wrong.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the receipt is not a JWT this tool can read: {0}")]
    Malformed(String),
    #[error("the receipt is signed with key {0:?}, which is not published")]
    UnknownKey(String),
    #[error("the receipt's signature does not verify")]
    BadSignature,
    #[error("the receipt was issued by another gateway")]
    OtherIssuer,
    #[error("the receipt is for another tool")]
    OtherTool,
    #[error("the receipt has expired")]
    Expired,
    #[error("the input is not the one that was approved")]
    InputChanged,
    #[error("the receipt was used before")]
    Replayed,
}

/// Remembers the receipts a tool has run, so each runs once.
pub trait Replay {
    /// True the first time `jti` is seen; `exp` is when the receipt stops counting anyway, so
    /// it need not be remembered longer.
    fn first_use(&self, jti: &str, exp: i64) -> bool;
}

/// [`Replay`] in memory, for one process; expired entries are dropped as new ones come.
#[derive(Default)]
pub struct SeenJtis(Mutex<HashMap<String, i64>>);

impl Replay for SeenJtis {
    fn first_use(&self, jti: &str, exp: i64) -> bool {
        let mut seen = self.0.lock().expect("lock poisoned");
        let now = jsonwebtoken::get_current_timestamp() as i64;
        seen.retain(|_, until| *until + LEEWAY_SECS as i64 >= now);
        seen.insert(jti.to_string(), exp).is_none()
    }
}

/// Checks `token` as the receipt of a call of `expect`; its claims when it may run.
pub fn verify(
    token: &str,
    keys: &KeySet,
    expect: &Expect<'_>,
    replay: &impl Replay,
) -> Result<Claims, Refusal> {
    let header =
        jsonwebtoken::decode_header(token).map_err(|e| Refusal::Malformed(e.to_string()))?;
    if header.alg != Algorithm::EdDSA {
        return Err(Refusal::Malformed(format!(
            "alg {:?} is not EdDSA",
            header.alg
        )));
    }
    let kid = header
        .kid
        .ok_or_else(|| Refusal::Malformed("the header names no kid".into()))?;
    let key = keys.find(&kid).ok_or(Refusal::UnknownKey(kid))?;
    let key =
        DecodingKey::from_ed_components(&key.x).map_err(|e| Refusal::Malformed(e.to_string()))?;
    let mut validation = Validation::new(Algorithm::EdDSA);
    validation.leeway = LEEWAY_SECS;
    validation.set_audience(&[expect.audience]);
    validation.set_issuer(&[expect.issuer]);
    validation.set_required_spec_claims(&["exp", "iss", "aud"]);
    let claims = jsonwebtoken::decode::<Claims>(token, &key, &validation)
        .map_err(|e| match e.kind() {
            ErrorKind::InvalidSignature => Refusal::BadSignature,
            ErrorKind::ExpiredSignature => Refusal::Expired,
            ErrorKind::InvalidIssuer => Refusal::OtherIssuer,
            ErrorKind::InvalidAudience => Refusal::OtherTool,
            _ => Refusal::Malformed(e.to_string()),
        })?
        .claims;
    if claims.tool != expect.tool {
        return Err(Refusal::OtherTool);
    }
    if claims.input_digest != input_digest(expect.input) {
        return Err(Refusal::InputChanged);
    }
    // Last, so a receipt refused for anything else is not spent.
    if !replay.first_use(&claims.jti, claims.exp) {
        return Err(Refusal::Replayed);
    }
    Ok(claims)
}
