//! The one layout every reviewer page uses, the inbox's and the email links' alike: a
//! viewport for phones, one small inline stylesheet, no external assets. Pages are never
//! cached nor sent as a referrer to another site (the email pages carry their token in the
//! URL; `same-origin` rather than `no-referrer`, under which browsers send `Origin: null`
//! with the pages' own forms, which `same_origin` then could not tell from another site's),
//! and a Content Security Policy lets run only the page's own inline script, by a nonce.

use crate::error::ApiError;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, PreEscaped, html};

/// One page: its title, who is signed in (for the header's sign-out form), and the inline
/// scripts that add live updates to what works without them.
pub(crate) struct Page<'a> {
    pub(crate) status: StatusCode,
    pub(crate) title: &'a str,
    /// The signed-in reviewer and their session's CSRF token.
    pub(crate) signed_in: Option<(&'a str, &'a str)>,
    pub(crate) scripts: Vec<&'a str>,
    /// Attributes of `<main>`: `data-digest` on the request page.
    pub(crate) digest: Option<&'a str>,
}

impl<'a> Page<'a> {
    pub(crate) fn new(status: StatusCode, title: &'a str) -> Self {
        Self {
            status,
            title,
            signed_in: None,
            scripts: Vec::new(),
            digest: None,
        }
    }

    pub(crate) fn render(self, body: Markup) -> Response {
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let markup = html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    title { (self.title) " · countersign" }
                    style nonce=(nonce) { (PreEscaped(STYLE)) }
                }
                body {
                    header {
                        nav.site aria-label="Inbox" {
                            a.brand href="/inbox" { "countersign" }
                            @if self.signed_in.is_some() {
                                a href="/inbox" { "Queue" }
                                a href="/inbox/grants" { "Grants" }
                                a href="/inbox/delegations" { "Delegations" }
                            }
                        }
                        @if let Some((who, csrf)) = self.signed_in {
                            form #sign-out method="post" action="/inbox/sign-out" {
                                span.who { (who) }
                                input type="hidden" name="csrf" value=(csrf);
                                button.link type="submit" { "Sign out" }
                            }
                        }
                    }
                    main data-digest=[self.digest] {
                        h1 { (self.title) }
                        (body)
                    }
                    @for script in &self.scripts {
                        script nonce=(nonce) { (PreEscaped(script)) }
                    }
                }
            }
        };
        let csp = format!(
            "default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
        );
        let mut response = (self.status, markup).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("same-origin"),
        );
        headers.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        if let Ok(csp) = HeaderValue::from_str(&csp) {
            headers.insert(header::CONTENT_SECURITY_POLICY, csp);
        }
        response
    }
}

/// A page that only says something: a title and a paragraph.
pub(crate) fn message(status: StatusCode, title: &str, text: &str) -> Response {
    Page::new(status, title).render(html! { p { (text) } })
}

/// Readable from 320 px up; forms stack on narrow screens; no web fonts. `[hidden]` comes
/// first and wins over every `display` below: the scripts hide with the attribute, and a rule
/// such as `a.action{display:inline-block}` would otherwise show what they hid.
const STYLE: &str = "
[hidden]{display:none!important}
*{box-sizing:border-box}
body{margin:0;font:16px/1.5 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#1d2330;background:#f5f6f8}
header{display:flex;justify-content:space-between;align-items:center;gap:.5em;padding:.6em 1em;background:#1d2330;color:#fff}
header a.brand{color:#fff;font-weight:600;text-decoration:none}
header nav.site{display:flex;flex-wrap:wrap;align-items:baseline;gap:.3em 1em}header nav.site a{color:#fff}
header form{display:flex;align-items:center;gap:.5em;margin:0}
header .who{opacity:.8}
main{max-width:46em;margin:0 auto;padding:1em}
h1{font-size:1.35em;line-height:1.3;margin:.2em 0 .6em}
h2{font-size:1.1em;margin:1.4em 0 .4em}
a{color:#1a56c4}
pre{white-space:pre-wrap;word-break:break-word;background:#fff;border:1px solid #d9dce3;border-radius:6px;padding:.6em;margin:.3em 0;max-height:22em;overflow:auto;font-size:.9em}
section,.card{background:#fff;border:1px solid #d9dce3;border-radius:8px;padding:.8em 1em;margin:.8em 0}
dl{display:grid;grid-template-columns:max-content 1fr;gap:.2em 1em;margin:.4em 0}
dt{color:#5b6475}dd{margin:0;word-break:break-word}
ul.requests{list-style:none;padding:0;margin:0}
li.request{display:flex;gap:.6em 1em;align-items:center;background:#fff;border:1px solid #d9dce3;border-radius:8px;padding:.7em 1em;margin:.6em 0}
li.request .row-main{flex:1 1 auto;min-width:0}
li.request .summary{font-weight:600}
li.request p{margin:.15em 0;overflow-wrap:anywhere}
li.request .asked{font-style:italic}
li.request .values{font-size:.9em}
li.request .meta{color:#5b6475;font-size:.9em}
li.request form.row-approve{margin:0}li.request form.row-approve button{margin:0}
li.request.selected{outline:3px solid #1a56c4;outline-offset:1px}
li.request.new{border-left:5px solid #1a56c4}
li.request .run-id{white-space:nowrap}
.badge{display:inline-block;font-size:.75em;font-weight:600;text-transform:uppercase;color:#fff;background:#1a56c4;border-radius:4px;padding:0 .35em;margin-right:.4em;vertical-align:middle}
.keys-hint{color:#5b6475;font-size:.85em;margin:.3em 0}
kbd{font-family:ui-monospace,monospace;font-size:.85em;border:1px solid #b8bdc9;border-radius:4px;padding:0 .3em;background:#fff}
.empty{color:#5b6475}
#live .happening{margin:.2em 0;font-size:.9em;overflow-wrap:anywhere}#live .live-state{color:#5b6475}
form.decide{background:#fff;border:1px solid #d9dce3;border-radius:8px;padding:.8em 1em;margin:.8em 0}
form.decide h2{margin-top:0}
label{display:block;margin:.5em 0 .2em;font-weight:500}
input[type=text],input[type=number],input[type=password],input[type=email],select,textarea{width:100%;font:inherit;padding:.45em .5em;border:1px solid #b8bdc9;border-radius:6px;background:#fff}
input[type=checkbox]{width:1.2em;height:1.2em}
textarea{min-height:4.5em}
button{font:inherit;padding:.5em 1.1em;margin-top:.6em;border:0;border-radius:6px;background:#1a56c4;color:#fff;cursor:pointer}
button.approve{background:#1b7a3e}button.reject{background:#b42318}
button.link{background:none;color:inherit;padding:0;margin:0;text-decoration:underline}
button:disabled,input:disabled,textarea:disabled,select:disabled{opacity:.55;cursor:not-allowed}
.field-error{color:#b42318;margin:.2em 0;font-weight:500}
.hint{color:#5b6475;font-size:.9em;margin:0 0 .2em}
label .name{font-weight:400;color:#5b6475;font-size:.9em}
[aria-invalid=true]{border-color:#b42318;outline-color:#b42318}
.error,.outcome,.notice{border-radius:8px;padding:.7em 1em;margin:.8em 0}
.error{background:#fdecea;border:1px solid #f3b8b2}
.outcome{background:#e8f3ec;border:1px solid #a9d3b7;font-weight:500}
.notice{background:#fff7e0;border:1px solid #f0d68a}
form.batch{display:flex;flex-wrap:wrap;gap:.3em 1em;align-items:end;background:#fff;border:1px solid #d9dce3;border-radius:8px;padding:.6em 1em;margin:.6em 0}
form.batch>label{flex:1 1 16em;margin:0}form.batch textarea{min-height:2.6em}
form.batch .buttons{display:flex;gap:.5em}form.batch button{margin:0}
label.select-all{flex:1 1 100%;font-weight:500}
li.request input.pick{flex:0 0 auto}
ul.batch-results{list-style:none;padding:0;margin:0}
li.batch-result{background:#fff;border:1px solid #d9dce3;border-left:5px solid #1b7a3e;border-radius:8px;padding:.6em 1em;margin:.5em 0}
li.batch-result[data-outcome=refused]{border-left-color:#b42318}
li.batch-result p{margin:.2em 0 0}
li.batch-result .run-id{color:#5b6475;font-size:.9em;white-space:nowrap}
.filters{display:flex;flex-wrap:wrap;gap:.5em;align-items:end}
.filters label{margin:0}.filters select{width:auto}
.digest{font-family:ui-monospace,monospace;font-size:.8em;word-break:break-all;color:#5b6475}
.turn{border-left:3px solid #d9dce3;padding-left:.7em;margin:.6em 0}
.turn .who{font-size:.85em;color:#5b6475;text-transform:uppercase;letter-spacing:.03em}
.turn .who code{text-transform:none}
h1,dd{overflow-wrap:anywhere}
.prose{white-space:pre-wrap;overflow-wrap:anywhere;margin:.3em 0}
nav.actions{position:sticky;top:0;z-index:5;display:flex;flex-wrap:wrap;align-items:center;gap:.4em 1em;margin:0 -1em .4em;padding:.5em 1em;background:#f5f6f8;border-bottom:1px solid #d9dce3}
nav.actions .buttons{display:flex;flex-wrap:wrap;gap:.5em;align-items:center}
nav.actions form.decide{margin:0;padding:0;border:0;background:none}
nav.actions button{margin:0}
a.action{display:inline-block;padding:.45em 1em;border:1px solid #1a56c4;border-radius:6px;background:#fff;text-decoration:none}
a.action.reject{color:#b42318;border-color:#b42318}
#status:empty{display:none}
nav.actions #status{flex:1 1 16em}nav.actions #status p{margin:0}
form.decide{scroll-margin-top:4.5em}
.reason{margin:.2em 0 .6em}
output.change{display:block;margin:.5em 0 0;font-weight:500}
.presence{color:#5b6475;font-size:.9em;margin:.2em 0}.presence:empty{display:none}
figure.asked{margin:.6em 0}
figure.asked figcaption{color:#5b6475;font-size:.9em}
blockquote.prose{padding:.4em .8em;border-left:3px solid #1a56c4;background:#f5f6f8;max-height:9em;overflow:auto}
.left.short{color:#b42318;background:#fdecea;padding:0 .3em;border-radius:4px}
details.evidence{background:#fff;border:1px solid #d9dce3;border-radius:8px;padding:.6em 1em;margin:.8em 0}
details.evidence summary{cursor:pointer;font-weight:600}
ul.grants{list-style:none;padding:0;margin:0}
li.grant{background:#fff;border:1px solid #d9dce3;border-left:5px solid #1b7a3e;border-radius:8px;padding:.6em 1em;margin:.6em 0}
li.grant:not([data-status=active]){border-left-color:#b8bdc9}
li.grant h2{margin:.2em 0 .4em}.grant-id,code.condition{font-family:ui-monospace,monospace;overflow-wrap:anywhere}
form.revoke{display:flex;flex-wrap:wrap;gap:.3em 1em;align-items:end}form.revoke label{flex:1 1 100%;margin:.3em 0 0}form.revoke input{flex:1 1 12em;width:auto}form.revoke button{margin:0}
textarea.condition{font-family:ui-monospace,monospace;font-size:.9em}
label.check{font-weight:400}
section.failed-calls{border-left:5px solid #b42318}.failed{color:#b42318;font-weight:500}
.recorded{background:#e8f3ec;border:1px solid #a9d3b7;border-radius:8px;padding:.7em 1em;margin:.8em 0;scroll-margin-top:50vh}
@media (max-width:40em){
nav.actions{position:fixed;top:auto;bottom:0;left:0;right:0;margin:0;padding:.5em .6em;border-bottom:0;border-top:1px solid #d9dce3;box-shadow:0 -2px 8px rgba(0,0,0,.1)}
body:has(nav.actions){padding-bottom:6em}
form.decide{scroll-margin-top:.5em}
form.decide button,form.decide input,form.decide textarea,form.decide select{scroll-margin-bottom:7em}}
@media (max-width:30em){main{padding:.6em}li.request{flex-wrap:wrap}.keys-hint{display:none}dl{grid-template-columns:1fr}dt{margin-top:.4em}}
";

/// An error of a page's handler, answered as a page (the API's are JSON).
pub(crate) struct PageError(pub(crate) ApiError);

impl<E: Into<ApiError>> From<E> for PageError {
    fn from(e: E) -> Self {
        Self(e.into())
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let title = if self.0.status.is_server_error() {
            "Try again in a moment"
        } else {
            "That did not work"
        };
        // A page of the inbox that cannot be shown keeps the way back to the queue.
        Page::new(self.0.status, title).render(html! {
            p { (self.0.message) }
            p { a href="/inbox" { "Back to the queue" } }
        })
    }
}

/// The end of a run id, enough to tell runs apart on a screen.
pub(crate) fn short_run_id(run_id: &str) -> &str {
    run_id
        .char_indices()
        .rev()
        .nth(5)
        .map_or(run_id, |(at, _)| &run_id[at..])
}
