//! Slack request signing: `X-Slack-Signature` is `v0=` + hex HMAC-SHA256 of
//! `v0:{X-Slack-Request-Timestamp}:{raw body}` keyed with the app's signing secret. It is
//! checked, with the timestamp within five minutes, before the body is read.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

const TOLERANCE_SECS: i64 = 5 * 60;

fn mac(secret: &str, timestamp: &str, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(format!("v0:{timestamp}:").as_bytes());
    mac.update(body);
    mac
}

/// The `X-Slack-Signature` Slack would send for this body.
pub fn sign(secret: &str, timestamp: &str, body: &[u8]) -> String {
    format!(
        "v0={}",
        hex::encode(mac(secret, timestamp, body).finalize().into_bytes())
    )
}

/// Why a request was refused.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum SlackAuthError {
    /// The request lacks the timestamp or the signature header.
    #[error("missing X-Slack-Request-Timestamp or X-Slack-Signature")]
    Missing,
    /// The request's timestamp is more than five minutes from `now_secs`.
    #[error("the request timestamp is more than five minutes off")]
    Stale,
    /// The signature is not the one the signing secret gives for this body.
    #[error("the signature does not match")]
    Mismatch,
}

/// Checks a Slack request: its `X-Slack-Request-Timestamp` within five minutes of `now_secs`
/// (seconds since the epoch) and its `X-Slack-Signature` made with the signing secret `secret`
/// over `body`.
pub fn verify(
    secret: &str,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now_secs: i64,
) -> Result<(), SlackAuthError> {
    let (Some(timestamp), Some(signature)) = (timestamp, signature) else {
        return Err(SlackAuthError::Missing);
    };
    let ts: i64 = timestamp.parse().map_err(|_| SlackAuthError::Stale)?;
    if (now_secs - ts).abs() > TOLERANCE_SECS {
        return Err(SlackAuthError::Stale);
    }
    let tag = signature
        .strip_prefix("v0=")
        .and_then(|h| hex::decode(h).ok())
        .ok_or(SlackAuthError::Mismatch)?;
    mac(secret, timestamp, body)
        .verify_slice(&tag)
        .map_err(|_| SlackAuthError::Mismatch)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Slack's own worked example.
    const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const TS: &str = "1531420618";
    const BODY: &str = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const SIGNATURE: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

    #[test]
    fn signing_matches_slacks_example() {
        assert_eq!(sign(SECRET, TS, BODY.as_bytes()), SIGNATURE);
    }

    #[test]
    fn forged_stale_and_missing_signatures_are_refused() {
        let now = 1531420618 + 60;
        assert_eq!(
            verify(SECRET, Some(TS), Some(SIGNATURE), BODY.as_bytes(), now),
            Ok(())
        );
        let forged = SIGNATURE.replace("a2", "b2");
        assert_eq!(
            verify(SECRET, Some(TS), Some(&forged), BODY.as_bytes(), now),
            Err(SlackAuthError::Mismatch)
        );
        assert_eq!(
            verify(
                SECRET,
                Some(TS),
                Some(SIGNATURE),
                BODY.as_bytes(),
                now + 600
            ),
            Err(SlackAuthError::Stale)
        );
        assert_eq!(
            verify(SECRET, None, Some(SIGNATURE), BODY.as_bytes(), now),
            Err(SlackAuthError::Missing)
        );
    }
}
