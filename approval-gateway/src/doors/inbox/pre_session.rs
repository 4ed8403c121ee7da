//! The sign-in forms' defence against login CSRF: another site making a visitor's browser sign
//! in as the attacker, so that what the visitor then decides is recorded as the attacker's.
//! Rendering a sign-in page (the key and email forms, or an emailed link's button) gives the
//! browser a pre-session cookie, random, `HttpOnly` and `SameSite=Strict`, unless it has one,
//! and its forms repeat the cookie's value; a sign-in `POST` counts only when the form's value
//! matches the cookie's (compared as hashes, so the time taken tells nothing). Another site can
//! make a browser post a form, but cannot read the cookie, nor have it sent with its post.

use crate::pages::form_fields;
use crate::pages::layout::Page;
use crate::pages::session::{cookie, random_token, set_cookie};
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use countersign_model::digest::sha256_hex;
use maud::html;
use std::collections::HashMap;

const COOKIE: &str = "countersign_sign_in";

/// How long a rendered sign-in page stays usable: a day.
const MAX_AGE_SECS: u64 = 24 * 3600;

/// The form field that repeats the cookie's value.
pub(super) const FIELD: &str = "csrf";

/// The pre-session token a sign-in page's forms carry: the browser's, or a new one with the
/// `Set-Cookie` value that gives it to the browser.
pub(super) fn for_page(state: &AppState, headers: &HeaderMap) -> (String, Option<HeaderValue>) {
    match cookie(headers, COOKIE).filter(|token| is_token(token)) {
        Some(token) => (token.to_string(), None),
        None => {
            let token = random_token();
            let set = set_cookie(state, COOKIE, &token, MAX_AGE_SECS);
            (token, Some(set))
        }
    }
}

/// What `random_token` makes: 64 lowercase hex digits. Anything else in the cookie is not one
/// of ours and is replaced.
fn is_token(value: &str) -> bool {
    value.len() == 64
        && value
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A sign-in form sent from a page of this gateway in this browser: its fields, and the
/// pre-session token, to render the page again with if the sign-in fails.
pub(super) struct SignInForm {
    pub(super) fields: HashMap<String, String>,
    pub(super) token: String,
}

impl FromRequest<AppState> for SignInForm {
    type Rejection = Response;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Response> {
        let token = cookie(request.headers(), COOKIE).map(str::to_string);
        let body = Bytes::from_request(request, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let fields = form_fields(&body);
        let sent = fields.get(FIELD).map(String::as_str).unwrap_or_default();
        match token {
            Some(token) if !sent.is_empty() && sha256_hex(sent) == sha256_hex(&token) => {
                Ok(Self { fields, token })
            }
            _ => Err(refused()),
        }
    }
}

/// A sign-in form that did not come from this browser's sign-in page: 403, nothing happens.
fn refused() -> Response {
    Page::new(StatusCode::FORBIDDEN, "This sign-in form has expired").render(html! {
        p { "It was not sent from this gateway's sign-in page in this browser, so nobody was \
             signed in and nothing was changed." }
        p { a href="/inbox/sign-in" { "Open the sign-in page" } " and sign in from there." }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_random_tokens_are_taken_from_the_cookie() {
        assert!(is_token(&random_token()));
        assert!(!is_token(""));
        assert!(!is_token(&"A".repeat(64)));
        assert!(!is_token(&"a".repeat(63)));
        assert!(!is_token(&format!("{}\"", "a".repeat(63))));
    }
}
