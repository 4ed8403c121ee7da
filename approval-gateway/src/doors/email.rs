//! The pages behind email links. `GET` (and `HEAD`) only shows what the link would do, with
//! a form; only the form's `POST` decides, and the decision script spends the token in the
//! same step that records the decision, so a form filled in wrong or a failure on the way
//! leaves the link working. A used, expired or superseded link shows a page saying so (and,
//! when it can tell, what was decided, by whom and when) and changes nothing. No script runs
//! on these pages, and they are neither cached nor sent as a referrer, since the token is in
//! the URL.
//!
//! They are the inbox's request page seen through one link: the same layout, request view
//! and forms (`crate::pages`), with the one action the link grants; a link to the run only for
//! a reader signed in to the inbox.

use crate::channels::email::grant::{Grant, parse_token};
use crate::decide::{self, DecideError, Decider};
use crate::pages::forms::{self, FieldErrors, Forms, Typed};
use crate::pages::layout::{self, Page, PageError};
use crate::pages::request_view::{CallView, decided, refusal_words};
use crate::pages::session::Session;
use crate::state::AppState;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use countersign_model::run::Action;
use countersign_store::RefusalCode;
use maud::html;

pub(crate) fn router() -> Router<AppState> {
    Router::new().route("/approvals/email/{token}", get(show).post(submit))
}

/// The channel email decisions are recorded as coming from.
const CHANNEL: &str = "email";

/// What a link's token is now.
enum Link {
    /// Still usable: its grant, the token's hash, and the grant as stored (the decision
    /// script spends it only if it is still that).
    Live(Grant, String, String),
    /// Used for a decision; what it was for.
    Spent(Grant),
    /// Expired, or never issued.
    Gone,
}

async fn link(state: &AppState, token: &str) -> Result<Link, PageError> {
    let Some((run, hash)) = parse_token(token) else {
        return Ok(Link::Gone);
    };
    let Some(raw) = state.store.peek_link_token(&run, &hash).await? else {
        return Ok(Link::Gone);
    };
    let parse = |text: &str| serde_json::from_str::<Grant>(text).ok();
    Ok(match raw.strip_prefix("spent:") {
        Some(spent) => parse(spent).map_or(Link::Gone, Link::Spent),
        None => parse(&raw).map_or(Link::Gone, |grant| Link::Live(grant, hash, raw)),
    })
}

fn title(action: Action) -> &'static str {
    match action {
        Action::Approve => "Approve this request?",
        Action::Reject => "Reject this request?",
        Action::Edit => "Edit and approve this request?",
    }
}

/// The page of a link that decides nothing any more: why, and how the request ended.
async fn closed(
    state: &AppState,
    session: Option<&Session>,
    status: StatusCode,
    heading: &str,
    grant: &Grant,
) -> Result<Response, PageError> {
    let view = CallView::load(state, grant.run_id.as_str(), &grant.call_id).await?;
    let mut page = Page::new(status, heading);
    page.signed_in = session.map(|s| (s.principal.as_str(), s.csrf.as_str()));
    Ok(page.render(html! {
        @match &view {
            Some(view) if view.open.is_some() => {
                p.outcome { "This request changed after the mail was sent, so this link can no longer decide it. A newer mail, or the inbox, has it as it is now." }
                h2 { (view.summary) }
                (view.render(session.is_some()))
            }
            Some(view) => {
                h2 { (view.summary) }
                (view.render(session.is_some()))
            }
            None => p.outcome { "The request no longer exists." },
        }
    }))
}

fn gone() -> Response {
    layout::message(
        StatusCode::GONE,
        "This link no longer works",
        "It expired, or was never issued. Nothing was changed.",
    )
}

/// The link's page with its form: what was typed and what was wrong, if it comes back.
async fn form_page(
    state: &AppState,
    session: Option<&Session>,
    grant: &Grant,
    view: &CallView,
    status: StatusCode,
    typed: &Typed,
    errors: &FieldErrors,
) -> Response {
    let mut page = Page::new(status, title(grant.action));
    page.signed_in = session.map(|s| (s.principal.as_str(), s.csrf.as_str()));
    page.digest = Some(&grant.digest);
    page.render(html! {
        h2 { (view.summary) }
        (view.render(session.is_some()))
        p { "You are deciding as " strong { (grant.principal) } "." }
        (Forms {
            csrf: None,
            digest: &grant.digest,
            actions: &[grant.action],
            schema: view.schema(state).as_ref(),
            input: &view.input,
            typed,
            errors,
        }.render())
    })
}

/// A link that can still decide: its grant, the token's hash, the grant as stored, and the
/// call as held now.
struct Open {
    grant: Grant,
    hash: String,
    raw: String,
    view: CallView,
}

/// The link's call, if the link still works and the call is held as the link was issued
/// for; else the page saying why it cannot decide (used, expired, or decided meanwhile).
async fn open(
    state: &AppState,
    session: Option<&Session>,
    token: &str,
) -> Result<Result<Open, Response>, PageError> {
    let (grant, hash, raw) = match link(state, token).await? {
        Link::Live(grant, hash, raw) => (grant, hash, raw),
        Link::Spent(grant) => {
            let heading = "This link was already used";
            return Ok(Err(closed(
                state,
                session,
                StatusCode::GONE,
                heading,
                &grant,
            )
            .await?));
        }
        Link::Gone => return Ok(Err(gone())),
    };
    match CallView::load(state, grant.run_id.as_str(), &grant.call_id).await? {
        Some(view) if view.open.is_some() && view.digest == grant.digest => Ok(Ok(Open {
            grant,
            hash,
            raw,
            view,
        })),
        _ => Ok(Err(closed(
            state,
            session,
            StatusCode::CONFLICT,
            "Already decided",
            &grant,
        )
        .await?)),
    }
}

async fn show(
    State(state): State<AppState>,
    session: Option<Session>,
    Path(token): Path<String>,
) -> Result<Response, PageError> {
    let session = session.as_ref();
    let Open { grant, view, .. } = match open(&state, session, &token).await? {
        Ok(open) => open,
        Err(page) => return Ok(page),
    };
    let (typed, errors) = (Typed::new(), FieldErrors::new());
    Ok(form_page(
        &state,
        session,
        &grant,
        &view,
        StatusCode::OK,
        &typed,
        &errors,
    )
    .await)
}

async fn submit(
    State(state): State<AppState>,
    session: Option<Session>,
    Path(token): Path<String>,
    body: Bytes,
) -> Result<Response, PageError> {
    let session = session.as_ref();
    let Open {
        grant,
        hash,
        raw,
        view,
    } = match open(&state, session, &token).await? {
        Ok(open) => open,
        Err(page) => return Ok(page),
    };
    let mut typed = crate::pages::form_fields(&body);
    // The link grants one action, whatever the form says.
    typed.insert("action".into(), grant.action.as_str().to_string());
    let again = |status, errors: FieldErrors| {
        let (state, grant, view, typed) = (&state, &grant, &view, &typed);
        async move { form_page(state, session, grant, view, status, typed, &errors).await }
    };
    let proposed = match forms::decision_from_form(&state, &view, &typed, &grant.digest) {
        Ok(proposed) => proposed,
        Err(errors) => return Ok(again(StatusCode::UNPROCESSABLE_ENTITY, errors).await),
    };
    let by = Decider {
        principal: &grant.principal,
        role: state.person_role(&grant.principal),
        door: CHANNEL,
        link: Some((&hash, &raw)),
        grant: None,
        delegation: None,
        model: false,
    };
    match decide::decide_one(&state, grant.run_id.as_str(), proposed, &by).await {
        Ok(_) => {
            let recorded = state.store.decisions(&grant.run_id).await?;
            let said = recorded
                .get(&grant.call_id)
                .map(decided)
                .unwrap_or_else(|| "Your decision was recorded.".into());
            let mut page = Page::new(StatusCode::OK, "Decision recorded");
            page.signed_in = session.map(|s| (s.principal.as_str(), s.csrf.as_str()));
            Ok(page.render(html! {
                p.outcome { (said) }
                p { strong { (view.summary) } }
                p { "The agent is told and goes on from here. You can close this page." }
            }))
        }
        Err(DecideError::Refused {
            code: RefusalCode::LinkUsed,
            ..
        }) => {
            let heading = "This link was already used";
            closed(&state, session, StatusCode::GONE, heading, &grant).await
        }
        Err(e) => {
            let (status, message) = refusal_words(&e);
            let status = status.unwrap_or_else(|| crate::error::ApiError::from(e).status);
            let errors = FieldErrors::from([("form".to_string(), vec![message])]);
            Ok(again(status, errors).await)
        }
    }
}
