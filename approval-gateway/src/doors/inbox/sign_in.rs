//! Signing in and out. Two ways in: the API key of a configured principal whose role may
//! decide (reviewer or admin), or a one-time link mailed to a person of the directory. The
//! mail form answers at once, the same whether or not the address is known, and only then
//! looks the address up and mails it (at most once a minute); the link's page only shows a
//! button, whose POST spends the token (link scanners fetch every link), in one `GETDEL`.
//! Every sign-in form carries the browser's pre-session token (`pre_session`), and the page
//! to go back to is checked before anything else happens.

use super::pre_session::{self, SignInForm};
use crate::mail::MailError;
use crate::pages::form_fields;
use crate::pages::layout::{self, Page, PageError};
use crate::pages::session::{Grant, Session, random_token, safe_next};
use crate::state::AppState;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use countersign_model::digest::sha256_hex;
use maud::{Markup, html};
use std::collections::HashMap;
use std::time::Duration;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/inbox/sign-in", get(form).post(with_key))
        .route("/inbox/sign-in/email", post(mail_link))
        .route("/inbox/sign-in/{token}", get(show_link).post(use_link))
        .route("/inbox/sign-out", post(sign_out))
}

/// How long an address waits before another sign-in link is mailed to it.
const MAIL_EVERY: Duration = Duration::from_secs(60);

fn forms(state: &AppState, next: &str, token: &str) -> Markup {
    html! {
        form #sign-in .decide method="post" action="/inbox/sign-in" {
            h2 { "With your API key" }
            input type="hidden" name=(pre_session::FIELD) value=(token);
            input type="hidden" name="next" value=(next);
            label for="key" { "API key" }
            input #key type="password" name="key" autocomplete="current-password" required;
            button type="submit" { "Sign in" }
        }
        @let mail = state.mailer.is_some() && state.config.public_base_url().is_some();
        form #email-link .decide method="post" action="/inbox/sign-in/email" {
            h2 { "With a link by email" }
            input type="hidden" name=(pre_session::FIELD) value=(token);
            @if !mail {
                p.notice { "This gateway is not set up to send mail, so it cannot send sign-in links." }
            }
            label for="email" { "Your email address" }
            input #email type="email" name="email" autocomplete="email" required disabled[!mail];
            button type="submit" disabled[!mail] { "Email me a sign-in link" }
        }
    }
}

fn sign_in_page(
    state: &AppState,
    status: StatusCode,
    error: Option<&str>,
    next: &str,
    token: &str,
) -> Response {
    Page::new(status, "Sign in to review requests").render(html! {
        @if let Some(error) = error {
            p.error role="alert" { (error) }
        }
        (forms(state, next, token))
    })
}

/// `page`, giving the browser its pre-session cookie if it had none.
fn giving(cookie: Option<HeaderValue>, mut page: Response) -> Response {
    if let Some(cookie) = cookie {
        page.headers_mut().append(header::SET_COOKIE, cookie);
    }
    page
}

/// The sign-in page. A page to go back to that is not the inbox's is left out here (the
/// visitor only asked for the page); a form that names one is refused.
async fn form(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let next = safe_next(query.get("next").map(String::as_str)).unwrap_or("/inbox");
    let (token, cookie) = pre_session::for_page(&state, &headers);
    giving(
        cookie,
        sign_in_page(&state, StatusCode::OK, None, next, &token),
    )
}

/// A sign-in form naming a page to go back to that is not the inbox's: 400, nobody is
/// signed in.
fn bad_next() -> Response {
    layout::message(
        StatusCode::BAD_REQUEST,
        "This sign-in form is broken",
        "It asks to go on to a page that is not one of this inbox's, so nobody was signed in. \
         Open the sign-in page again and sign in from there.",
    )
}

/// Signs in with an API key whose role may decide, and goes back where the reviewer was.
async fn with_key(
    State(state): State<AppState>,
    SignInForm { fields, token }: SignInForm,
) -> Result<Response, PageError> {
    let Some(next) = safe_next(fields.get("next").map(String::as_str)) else {
        return Ok(bad_next());
    };
    let key = fields.get("key").map(|k| k.trim()).unwrap_or_default();
    let Some(key) = state.api_key(key) else {
        let error =
            "That key is not one this gateway knows. Nothing changed; check it and try again.";
        return Ok(sign_in_page(
            &state,
            StatusCode::UNAUTHORIZED,
            Some(error),
            next,
            &token,
        ));
    };
    if !key.role.decides() {
        let error = format!(
            "The key of {} may not decide requests (its role is not reviewer or admin).",
            key.principal
        );
        return Ok(sign_in_page(
            &state,
            StatusCode::FORBIDDEN,
            Some(&error),
            next,
            &token,
        ));
    }
    let grant = Grant::Key {
        fingerprint: sha256_hex(key.key.expose()),
    };
    let cookie = Session::start(&state, &key.principal, grant).await?;
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to(next)).into_response())
}

/// Mails a one-time link to the person with that address, if there is one; says the same
/// either way, and answers before even looking the address up, so neither words nor timing
/// tell.
async fn mail_link(State(state): State<AppState>, form: SignInForm) -> Response {
    let Some(base) = state
        .config
        .public_base_url()
        .filter(|_| state.mailer.is_some())
        .map(str::to_string)
    else {
        return layout::message(
            StatusCode::NOT_FOUND,
            "Sign-in links are off",
            "This gateway is not set up to send mail, so it cannot send sign-in links. Sign in \
             with your API key instead.",
        );
    };
    let address = form.fields.get("email").map(|a| a.trim().to_string());
    tokio::spawn(async move {
        let address = address.unwrap_or_default();
        if let Err(e) = mail_sign_in_link(&state, &address, &base).await {
            tracing::warn!(error = ?e, "the sign-in link could not be mailed");
        }
    });
    layout::message(
        StatusCode::OK,
        "Check your email",
        "If that address belongs to a reviewer here, a sign-in link is on its way. It works \
         once, for a short time.",
    )
}

/// Mails a one-time sign-in link to the person with `address`, if there is one and the
/// address was not asked for within the last minute. Every address is throttled, known or not,
/// so that this work, done while the next requests are answered, is the same for both.
async fn mail_sign_in_link(state: &AppState, address: &str, base: &str) -> Result<(), MailError> {
    let throttle = sha256_hex(address.to_lowercase());
    let first = state
        .store
        .throttle_sign_in_mail(&throttle, MAIL_EVERY)
        .await?;
    let person = state.config.people.iter().find(|p| {
        p.email
            .as_deref()
            .is_some_and(|e| e.eq_ignore_ascii_case(address))
            && state.person_role(&p.id).decides()
    });
    let Some(person) = person.filter(|_| first) else {
        return Ok(());
    };
    let token = random_token();
    let ttl_secs = state.config.inbox.sign_in_link_ttl_secs;
    state
        .store
        .put_sign_in_token(
            &sha256_hex(&token),
            &person.id,
            Duration::from_secs(ttl_secs),
        )
        .await?;
    let link = format!("{base}/inbox/sign-in/{token}");
    let to = person.email.as_deref().unwrap_or(address);
    let minutes = (ttl_secs / 60).max(1);
    let text = format!(
        "Sign in to review requests:\n\n{link}\n\nThe link works once, within {minutes} min. \
         If you did not ask for it, ignore this mail."
    );
    let html = html! {
        p { "Sign in to review requests:" }
        p { a href=(link) { "Sign in to countersign" } }
        p { "The link works once, within " (minutes) " min. If you did not ask for it, ignore this mail." }
    };
    crate::mail::send(state, to, "Your sign-in link", text, html.into_string()).await
}

fn used_link() -> Response {
    layout::message(
        StatusCode::GONE,
        "This sign-in link no longer works",
        "It was already used, or it expired. Ask for a new one from the sign-in page.",
    )
}

/// The emailed link's page: a button whose POST signs in. Opening it spends nothing.
async fn show_link(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(token): Path<String>,
) -> Result<Response, PageError> {
    let Some(principal) = state.store.peek_sign_in_token(&sha256_hex(&token)).await? else {
        return Ok(used_link());
    };
    let (form_token, cookie) = pre_session::for_page(&state, &headers);
    let page = Page::new(StatusCode::OK, "Sign in").render(html! {
        form #use-link .decide method="post" {
            input type="hidden" name=(pre_session::FIELD) value=(form_token);
            p { "Sign in as " strong { (principal) } " to review requests." }
            button type="submit" { "Sign in" }
        }
    });
    Ok(giving(cookie, page))
}

async fn use_link(
    State(state): State<AppState>,
    Path(token): Path<String>,
    _: SignInForm,
) -> Result<Response, PageError> {
    let Some(principal) = state.store.spend_sign_in_token(&sha256_hex(&token)).await? else {
        return Ok(used_link());
    };
    let cookie = Session::start(&state, &principal, Grant::Person).await?;
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/inbox")).into_response())
}

async fn sign_out(
    State(state): State<AppState>,
    session: Session,
    body: Bytes,
) -> Result<Response, PageError> {
    if let Err(refused) = session.check_csrf(&form_fields(&body)) {
        return Ok(refused.into_response());
    }
    let cookie = session.end(&state).await?;
    Ok((
        [(header::SET_COOKIE, cookie)],
        Redirect::to("/inbox/sign-in"),
    )
        .into_response())
}
