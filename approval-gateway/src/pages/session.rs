//! Reviewers' sessions. Signing in stores a session in Redis under the SHA-256 of a random
//! cookie value, with a TTL; the cookie is HttpOnly, SameSite=Strict, Path=/, and Secure when
//! the gateway's public base URL is https. Each session carries its own random CSRF token,
//! which every form of the inbox repeats and every POST must match.
//!
//! A session is bound to what created it: the fingerprint (SHA-256) of the API key signed in
//! with, or the person an emailed link signed in. Every request checks that grant against
//! the configuration as it is now: a key that is gone, a person who is gone, or a role that
//! no longer decides ends the session there and then (so a restart with a changed
//! configuration ends the sessions it no longer grants). The role it yields is what the
//! session decides with; what that allows on a call is `countersign_model::authority`'s
//! rule, applied by the decision script. Each principal's sessions are listed, so an admin
//! can end them all.

use super::layout;
use crate::config::Role;
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use countersign_model::digest::sha256_hex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Duration;

const COOKIE: &str = "countersign_session";

/// A signed-in reviewer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Session {
    /// Who decides: the key's principal, or the person the sign-in link was mailed to.
    pub(crate) principal: String,
    /// Repeated by every form, checked on every POST.
    pub(crate) csrf: String,
    /// What signed the reviewer in, checked on every request.
    grant: Grant,
    /// The role the grant yields under the configuration as it is now.
    #[serde(skip, default = "no_role")]
    pub(crate) role: Role,
    /// The hash of the cookie, to end the session by.
    #[serde(skip)]
    cookie_hash: String,
}

/// What signed a reviewer in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "by")]
pub(crate) enum Grant {
    /// An API key, by the SHA-256 of the key.
    Key { fingerprint: String },
    /// A sign-in link mailed to the person.
    Person,
}

fn no_role() -> Role {
    Role::Reader
}

/// A random secret for a cookie, a link or a form: 244 bits from two UUIDv4s, as hex.
pub(crate) fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

impl Session {
    /// Starts a session for `principal`, signed in by `grant`; the `Set-Cookie` value that
    /// holds it.
    pub(crate) async fn start(
        state: &AppState,
        principal: &str,
        grant: Grant,
    ) -> Result<HeaderValue, ApiError> {
        let cookie = random_token();
        let session = Session {
            principal: principal.to_string(),
            csrf: random_token(),
            grant,
            role: no_role(),
            cookie_hash: String::new(),
        };
        let ttl = state.config.inbox.session_ttl_secs;
        let value = serde_json::to_string(&session).expect("sessions serialize");
        state
            .store
            .put_session(
                principal,
                &sha256_hex(&cookie),
                &value,
                Duration::from_secs(ttl),
            )
            .await?;
        Ok(set_cookie(state, COOKIE, &cookie, ttl))
    }

    /// The role this session's grant yields now, if it still yields one that decides: the
    /// key it signed in with must still be configured for the same principal, the person
    /// still configured with a role that decides.
    fn granted_role(&self, state: &AppState) -> Option<Role> {
        let role = match &self.grant {
            Grant::Key { fingerprint } => state
                .api_key_by_fingerprint(fingerprint)
                .filter(|key| key.principal == self.principal)
                .map(|key| key.role),
            Grant::Person => state.config.person_role(&self.principal),
        };
        role.filter(|r| r.decides())
    }

    /// Ends the session; the `Set-Cookie` value that clears the cookie.
    pub(crate) async fn end(&self, state: &AppState) -> Result<HeaderValue, ApiError> {
        state
            .store
            .end_session(Some(&self.principal), &self.cookie_hash)
            .await?;
        Ok(set_cookie(state, COOKIE, "", 0))
    }

    /// Whether a submitted form carries this session's CSRF token (compared as hashes, so
    /// the time taken tells nothing about it).
    pub(crate) fn check_csrf(&self, form: &HashMap<String, String>) -> Result<(), CsrfRefused> {
        let sent = form.get("csrf").map(String::as_str).unwrap_or_default();
        if !sent.is_empty() && sha256_hex(sent) == sha256_hex(&self.csrf) {
            Ok(())
        } else {
            Err(CsrfRefused)
        }
    }

    /// The session a request's cookie names, if it names one that lasts and that the
    /// configuration still grants; one it no longer grants is ended here.
    async fn of(parts: &Parts, state: &AppState) -> Result<Option<Session>, ApiError> {
        let Some(cookie) = cookie(&parts.headers, COOKIE) else {
            return Ok(None);
        };
        let hash = sha256_hex(cookie);
        let Some(raw) = state.store.session(&hash).await? else {
            return Ok(None);
        };
        // A session stored by an older gateway (no grant) is one nobody can check.
        let Ok(mut session) = serde_json::from_str::<Session>(&raw) else {
            state.store.end_session(None, &hash).await?;
            return Ok(None);
        };
        session.cookie_hash = hash;
        match session.granted_role(state) {
            Some(role) => {
                session.role = role;
                Ok(Some(session))
            }
            None => {
                tracing::info!(principal = %session.principal, "a session the configuration no longer grants was ended");
                session.end(state).await?;
                Ok(None)
            }
        }
    }

    /// Who this session decides as.
    pub(crate) fn principal(&self) -> countersign_model::authority::Principal<'_> {
        countersign_model::authority::Principal {
            id: &self.principal,
            role: self.role,
        }
    }
}

/// A form sent without this session's CSRF token: answered with a page saying so (403), and
/// nothing else happens.
pub(crate) struct CsrfRefused;

impl IntoResponse for CsrfRefused {
    fn into_response(self) -> Response {
        layout::message(
            StatusCode::FORBIDDEN,
            "This form has expired",
            "The form was not sent from a page of this session (it may be from before you \
             signed in again). Nothing was changed. Go back, reload the page and try again.",
        )
    }
}

/// A `Set-Cookie` value for cookie `name` of the reviewers' pages.
pub(crate) fn set_cookie(state: &AppState, name: &str, value: &str, max_age: u64) -> HeaderValue {
    let secure = state
        .config
        .public_base_url()
        .is_some_and(|url| url.starts_with("https://"));
    HeaderValue::from_str(&cookie_line(name, value, max_age, secure))
        .expect("cookie values are hex")
}

fn cookie_line(name: &str, value: &str, max_age: u64, secure: bool) -> String {
    format!(
        "{name}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{}",
        if secure { "; Secure" } else { "" }
    )
}

/// The value of cookie `name`, if the request carries one.
pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(found, value)| *found == name && !value.is_empty())
        .map(|(_, value)| value)
}

/// Where a visitor who is not signed in is sent: the sign-in page, which brings them back.
fn to_sign_in(parts: &Parts) -> Response {
    let back = parts.uri.path_and_query().map_or("/inbox", |p| p.as_str());
    let query = serde_urlencoded::to_string([("next", back)]).unwrap_or_default();
    Redirect::to(&format!("/inbox/sign-in?{query}")).into_response()
}

impl FromRequestParts<AppState> for Session {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        match Session::of(parts, state).await {
            Ok(Some(session)) => Ok(session),
            Ok(None) => Err(to_sign_in(parts)),
            Err(e) => Err(layout::message(
                e.status,
                "Try again in a moment",
                &e.message,
            )),
        }
    }
}

impl OptionalFromRequestParts<AppState> for Session {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Option<Self>, Response> {
        Session::of(parts, state)
            .await
            .map_err(|e| layout::message(e.status, "Try again in a moment", &e.message))
    }
}

/// A path inside the inbox to go back to after signing in (none or an empty one is the
/// inbox); `None` for anything else: another site, a sign-in page, or a character a
/// `Location` header cannot carry.
pub(crate) fn safe_next(next: Option<&str>) -> Option<&str> {
    match next {
        None | Some("") => Some("/inbox"),
        Some(path)
            if (path == "/inbox" || path.starts_with("/inbox/") || path.starts_with("/inbox?"))
                && !path.starts_with("/inbox/sign-")
                && !path.contains("//")
                && !path.contains('\\')
                && path.chars().all(|c| c.is_ascii_graphic()) =>
        {
            Some(path)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_inbox_paths_are_gone_back_to() {
        assert_eq!(safe_next(Some("/inbox/runs/r1")), Some("/inbox/runs/r1"));
        assert_eq!(safe_next(Some("/inbox?tool=x")), Some("/inbox?tool=x"));
        assert_eq!(safe_next(None), Some("/inbox"));
        assert_eq!(safe_next(Some("")), Some("/inbox"));
        for bad in [
            "https://evil.example/inbox",
            "//evil.example/inbox",
            "/inbox//evil.example",
            "/inbox\\evil.example",
            "/inbox/sign-out",
            "/inboxes",
            "/inbox\r\nSet-Cookie: a=b",
            "/inbox/runs/r1 x",
            "/inbox/runs/é",
        ] {
            assert_eq!(safe_next(Some(bad)), None, "{bad:?}");
        }
    }

    #[test]
    fn the_cookie_is_secure_only_where_the_gateway_is_reached_over_tls() {
        let line = cookie_line(COOKIE, "abc", 60, true);
        assert_eq!(
            line,
            "countersign_session=abc; Path=/; Max-Age=60; HttpOnly; SameSite=Strict; Secure"
        );
        assert!(!cookie_line(COOKIE, "abc", 60, false).contains("Secure"));
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; countersign_session=abc; b=2"),
        );
        assert_eq!(cookie(&headers, COOKIE), Some("abc"));
    }
}
