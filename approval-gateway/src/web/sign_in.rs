//! Signing in and out. Two ways in: the API key of a configured principal whose role may
//! decide (reviewer or admin), or a one-time link mailed to a person of the directory. The
//! mail form answers the same whether or not the address is known, and mails an address at
//! most once a minute; the link's page only shows a button, whose POST spends the token (link
//! scanners fetch every link), in one `GETDEL`.

use super::form_fields;
use super::layout::{self, Page, PageError};
use super::session::{Grant, Session, random_token, safe_next};
use crate::channels::delivery::DeliveryError;
use crate::channels::email;
use crate::state::AppState;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use countersign_shared::digest::sha256_hex;
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

fn forms(state: &AppState, next: &str) -> Markup {
    html! {
        form #sign-in .decide method="post" action="/inbox/sign-in" {
            h2 { "With your API key" }
            input type="hidden" name="next" value=(next);
            label for="key" { "API key" }
            input #key type="password" name="key" autocomplete="current-password" required;
            button type="submit" { "Sign in" }
        }
        @let mail = state.mailer.is_some() && state.config.public_base_url().is_some();
        form #email-link .decide method="post" action="/inbox/sign-in/email" {
            h2 { "With a link by email" }
            @if !mail {
                p.notice { "This gateway is not set up to send mail, so it cannot send sign-in links." }
            }
            label for="email" { "Your email address" }
            input #email type="email" name="email" autocomplete="email" required disabled[!mail];
            button type="submit" disabled[!mail] { "Email me a sign-in link" }
        }
    }
}

fn sign_in_page(state: &AppState, status: StatusCode, error: Option<&str>, next: &str) -> Response {
    Page::new(status, "Sign in to review requests").render(html! {
        @if let Some(error) = error {
            p.error role="alert" { (error) }
        }
        (forms(state, next))
    })
}

async fn form(
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let next = safe_next(query.get("next").map(String::as_str));
    sign_in_page(&state, StatusCode::OK, None, next)
}

/// Signs in with an API key whose role may decide, and goes back where the reviewer was.
async fn with_key(State(state): State<AppState>, body: Bytes) -> Result<Response, PageError> {
    let form = form_fields(&body);
    let next = safe_next(form.get("next").map(String::as_str));
    let key = form.get("key").map(|k| k.trim()).unwrap_or_default();
    let Some(key) = state.api_key(key) else {
        let error =
            "That key is not one this gateway knows. Nothing changed; check it and try again.";
        return Ok(sign_in_page(
            &state,
            StatusCode::UNAUTHORIZED,
            Some(error),
            next,
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
        ));
    }
    let grant = Grant::Key {
        fingerprint: sha256_hex(key.key.expose()),
    };
    let cookie = Session::start(&state, &key.principal, grant).await?;
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to(next)).into_response())
}

/// Mails a one-time link to the person with that address, if there is one; says the same
/// either way, and answers before the mail goes, so neither words nor timing tell.
async fn mail_link(State(state): State<AppState>, body: Bytes) -> Result<Response, PageError> {
    let Some(base) = state
        .config
        .public_base_url()
        .filter(|_| state.mailer.is_some())
    else {
        return Ok(layout::message(
            StatusCode::NOT_FOUND,
            "Sign-in links are off",
            "This gateway is not set up to send mail, so it cannot send sign-in links. Sign in \
             with your API key instead.",
        ));
    };
    let form = form_fields(&body);
    let address = form.get("email").map(|a| a.trim()).unwrap_or_default();
    // Only a person whose role decides is mailed a link: the inbox is for deciding.
    let person = state.config.people.iter().find(|p| {
        p.email
            .as_deref()
            .is_some_and(|e| e.eq_ignore_ascii_case(address))
            && state.person_role(&p.id).decides()
    });
    if let Some(person) = person
        && state
            .store
            .throttle_sign_in_mail(&sha256_hex(address.to_lowercase()), MAIL_EVERY)
            .await?
    {
        let token = random_token();
        let ttl = state.config.inbox.sign_in_link_ttl_secs;
        state
            .store
            .put_sign_in_token(&sha256_hex(&token), &person.id, Duration::from_secs(ttl))
            .await?;
        let link = format!("{base}/inbox/sign-in/{token}");
        let to = person.email.clone().unwrap_or_default();
        let state = state.clone();
        tokio::spawn(async move {
            if let Err(e) = mail_sign_in_link(&state, &to, &link, ttl).await {
                tracing::warn!(error = ?e, "the sign-in link could not be mailed");
            }
        });
    }
    Ok(layout::message(
        StatusCode::OK,
        "Check your email",
        "If that address belongs to a reviewer here, a sign-in link is on its way. It works \
         once, for a short time.",
    ))
}

async fn mail_sign_in_link(
    state: &AppState,
    to: &str,
    link: &str,
    ttl_secs: u64,
) -> Result<(), DeliveryError> {
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
    email::send(state, to, "Your sign-in link", text, html.into_string()).await
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
    Path(token): Path<String>,
) -> Result<Response, PageError> {
    let Some(principal) = state.store.peek_sign_in_token(&sha256_hex(&token)).await? else {
        return Ok(used_link());
    };
    Ok(Page::new(StatusCode::OK, "Sign in").render(html! {
        form #use-link .decide method="post" {
            p { "Sign in as " strong { (principal) } " to review requests." }
            button type="submit" { "Sign in" }
        }
    }))
}

async fn use_link(
    State(state): State<AppState>,
    Path(token): Path<String>,
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
