//! The reviewer's pages in a real browser (headless Chromium, at desktop and phone widths):
//! what a person sees and does, down to the browser's own form checks. Elements are picked by
//! the pages' structure (forms, fields, buttons, the classes of the page contract), not by
//! their wording.

use crate::email::{app_with_email, mail_for};
use crate::slack::{app_with, interact, posted_run};
use countersign_fake_model::refund_brain;
use countersign_tests::app::{PATIENCE, REVIEWER_KEY, TestApp};
use countersign_tests::browser::{Browser, Screen};
use countersign_tests::fake_slack::{FakeSlack, click};
use countersign_tests::wait_for;
use serde_json::Value;

/// Signs in on the inbox's sign-in page with an API key, and waits for the inbox.
async fn sign_in(browser: &Browser, app: &TestApp, key: &str) {
    browser
        .goto(&format!("{}/inbox/sign-in", app.gateway_url))
        .await;
    browser.fill("form#sign-in input[name=key]", key).await;
    browser.click("form#sign-in button[type=submit]").await;
    browser
        .wait_until(
            "the inbox after signing in",
            "return location.pathname === '/inbox' && document.readyState === 'complete'",
        )
        .await;
}

/// The held call of a run once it has paused: its id and digest.
async fn held_call(app: &TestApp, run_id: &str) -> (String, String) {
    let run = app.wait_status(run_id, "awaiting_approval").await;
    let call = &run["pending"][0];
    let id = call["call_id"].as_str().unwrap().to_string();
    (id, call["digest"].as_str().unwrap().to_string())
}

/// Opens a held call's request page and waits until its forms are there.
async fn open_request(browser: &Browser, app: &TestApp, run_id: &str, call_id: &str) {
    let url = format!("{}/inbox/runs/{run_id}/calls/{call_id}", app.gateway_url);
    browser.goto(&url).await;
    browser.find("main[data-digest] form#approve").await;
}

/// A paused refund, its run id, and a reviewer's browser on `screen` signed in with its
/// request page open.
async fn a_paused_request_open(name: &str, screen: Screen) -> (TestApp, String, Browser) {
    let app = TestApp::spawn(refund_brain).await;
    let run_id = app.start_run("Refund A-1001 please.").await;
    let (call_id, _) = held_call(&app, &run_id).await;
    let browser = Browser::start(name, screen).await;
    sign_in(&browser, &app, REVIEWER_KEY).await;
    open_request(&browser, &app, &run_id, &call_id).await;
    (app, run_id, browser)
}

/// Waits until the page says how the request ended, and asserts that it offers no forms.
async fn assert_decided_page(browser: &Browser) {
    browser.find("p.outcome").await;
    let forms = browser
        .eval("return document.querySelectorAll('form#approve, form#edit, form#reject').length")
        .await;
    assert_eq!(forms, 0, "a decided request offers no forms");
}

/// Waits until the page after an inbox decision says it was recorded and how (`says`, any
/// case); that text.
async fn assert_recorded(browser: &Browser, says: &str) -> String {
    browser.wait_for_text("p.recorded", says).await
}

/// Where the Approve button is on the page as first shown (CSS px from the top of the
/// window), the window's height, and whether the button is wholly on the screen.
async fn approve_at(browser: &Browser) -> (f64, f64, bool) {
    let at = browser
        .eval(
            "const b = document.querySelector('form#approve button[type=submit]').getBoundingClientRect(); \
             return [b.top, innerHeight, b.top >= 0 && b.bottom <= innerHeight && b.width > 0];",
        )
        .await;
    (
        at[0].as_f64().unwrap(),
        at[1].as_f64().unwrap(),
        at[2] == true,
    )
}

/// Marks the page, so that `assert_not_reloaded` can tell it is still the same one.
async fn mark(browser: &Browser) {
    browser
        .eval("window.countersignMark = true; return true")
        .await;
}

async fn assert_not_reloaded(browser: &Browser) {
    let mark = browser.eval("return window.countersignMark === true").await;
    assert_eq!(mark, true, "the page was reloaded or left");
}

/// The `decided` entries of a run's audit trail.
async fn decisions(app: &TestApp, run_id: &str) -> Vec<Value> {
    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    let entries = trail["entries"].as_array().unwrap();
    let decided = entries.iter().filter(|e| e["entry"]["kind"] == "decided");
    decided.map(|e| e["entry"].clone()).collect()
}

/// The refund amount's field of the edit form.
const AMOUNT: &str = "form#edit [name='input.amount']";

/// Edits the refund's amount to `amount`, with a note, and sends the edit form.
async fn send_edit(browser: &Browser, amount: &str) {
    browser.fill(AMOUNT, amount).await;
    browser
        .fill(
            "form#edit textarea[name=note]",
            "The customer asked for more.",
        )
        .await;
    browser.click("form#edit button[type=submit]").await;
}

/// Waits for the edit form to come back with an error tied to the amount's field (named by
/// its `aria-describedby`, the field `aria-invalid`); asserts that it says `says`, is on the
/// screen without scrolling, and that what was typed is kept.
async fn assert_amount_refused(browser: &Browser, typed: &str, says: &str) {
    let script = format!(
        "const field = document.querySelector({AMOUNT:?}); if (!field) return null; \
         const ids = (field.getAttribute('aria-describedby') || '').split(' '); \
         const tied = ids.map(id => document.getElementById(id)) \
           .find(e => e && e.querySelector('p.field-error')); \
         if (!tied) return null; const at = tied.getBoundingClientRect(); \
         return [tied.innerText, field.value, \
           document.querySelector('form#edit textarea[name=note]').value, \
           at.top >= 0 && at.bottom <= window.innerHeight, \
           field.getAttribute('aria-invalid')];"
    );
    let shown = browser
        .wait_until("an error tied to the amount", &script)
        .await;
    let error = shown[0].as_str().unwrap();
    assert!(error.contains(says), "the error says {says:?}: {error}");
    assert_eq!(shown[1], typed, "what was typed is kept");
    assert_eq!(shown[2], "The customer asked for more.");
    assert_eq!(shown[3], true, "the error is on the screen");
    assert_eq!(shown[4], "true", "the field is marked invalid");
}

/// Waits until the browser refused to send the edit form because the amount is above the
/// field's own maximum (the schema's), pointing at the amount.
async fn assert_stopped_by_the_browser(browser: &Browser) {
    let script = format!(
        "const field = document.querySelector({AMOUNT:?}); \
         return field && document.activeElement === field && field.validity.rangeOverflow \
           && field.max === '500';"
    );
    browser
        .wait_until(
            "the browser to point at the amount over its maximum",
            &script,
        )
        .await;
}

/// A paused run whose request was mailed to alice, its id, the mail's links (approve, reject,
/// edit) and a browser on `screen` for test `name`.
async fn mailed_links_on(name: &str, screen: Screen) -> (TestApp, String, Vec<String>, Browser) {
    let (app, sink) = app_with_email("\"email:alice@example.com\"", None).await;
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    let (_, links) = mail_for(&app, &sink, "alice@example.com").await;
    let browser = Browser::start(name, screen).await;
    (app, run_id, links, browser)
}

#[tokio::test]
async fn an_email_link_on_a_phone_fits_the_screen_and_its_form_approves_the_run() {
    approve_from_the_mailed_link("email_link_phone", Screen::Phone).await;
}

#[tokio::test]
async fn an_email_link_on_a_desktop_fits_the_window_and_its_form_approves_the_run() {
    approve_from_the_mailed_link("email_link_desktop", Screen::Desktop).await;
}

/// Opens the mailed approve link on `screen`: the page fits, opening decides nothing, its
/// form approves once and the page says so.
async fn approve_from_the_mailed_link(name: &str, screen: Screen) {
    let (app, run_id, links, browser) = mailed_links_on(name, screen).await;

    browser.goto(&links[0]).await;
    browser.find("form button[type=submit]").await;
    browser.assert_fits_the_screen().await;
    browser.screenshot("approve-page").await;
    assert_eq!(
        app.get_run_status(&run_id).await,
        "awaiting_approval",
        "opening the link decides nothing"
    );

    browser.click("form button[type=submit]").await;
    let outcome = browser.wait_for_text("p.outcome", "alice").await;
    assert!(
        outcome.to_lowercase().contains("approve"),
        "the page says what was decided: {outcome}"
    );
    assert_decided_page(&browser).await;
    browser.assert_fits_the_screen().await;
    browser.screenshot("recorded-page").await;
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
}

#[tokio::test]
async fn an_email_edit_link_on_a_phone_stops_5000_in_the_browser_shows_the_schemas_error_tied_to_the_field_and_stays_usable()
 {
    let (app, run_id, links, browser) = mailed_links_on("email_edit_phone", Screen::Phone).await;

    browser.goto(&links[2]).await;
    browser.find(AMOUNT).await;
    browser.assert_fits_the_screen().await;
    mark(&browser).await;
    send_edit(&browser, "5000").await;
    assert_stopped_by_the_browser(&browser).await;
    assert_not_reloaded(&browser).await;
    // 0 passes the field (HTML has no exclusive minimum) and is refused by the schema check.
    send_edit(&browser, "0").await;
    assert_amount_refused(&browser, "0", "amount: must be more than 0").await;
    browser.assert_fits_the_screen().await;
    browser.screenshot("edit-error").await;
    assert_eq!(app.get_run_status(&run_id).await, "awaiting_approval");

    // The link still works: the corrected form decides.
    send_edit(&browser, "49").await;
    browser.wait_for_text("p.outcome", "alice").await;
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds()[0]["amount"], 49);
}

#[tokio::test]
async fn a_reviewer_signs_in_finds_the_paused_run_in_the_inbox_and_approves_it() {
    let app = TestApp::spawn(refund_brain).await;
    let run_id = app.start_run("Refund A-1001 please.").await;
    let (call_id, digest) = held_call(&app, &run_id).await;
    let browser = Browser::start("inbox_approve", Screen::Desktop).await;
    sign_in(&browser, &app, REVIEWER_KEY).await;
    let item = format!("li.request[data-run='{run_id}'][data-call='{call_id}']");
    browser.find(&item).await;

    // A run that pauses while the inbox is open joins the list without a reload.
    mark(&browser).await;
    let second = app.start_run("Refund A-1001 please.").await;
    browser
        .find(&format!("li.request[data-run='{second}']"))
        .await;
    assert_not_reloaded(&browser).await;
    browser.screenshot("inbox").await;

    // The filters keep only what matches.
    let inbox = format!("{}/inbox", app.gateway_url);
    browser.goto(&format!("{inbox}?tool=get_order")).await;
    let listed = browser
        .wait_until(
            "the inbox filtered by tool",
            "return document.readyState === 'complete' && location.search === '?tool=get_order' \
             && [document.querySelectorAll('li.request').length]",
        )
        .await;
    assert_eq!(listed[0], 0, "no call of get_order waits");
    browser
        .goto(&format!("{inbox}?agent=refunds&tool=issue_refund"))
        .await;
    browser.find(&item).await;

    browser.click(&format!("{item} a.open")).await;
    let main = browser.find("main[data-digest]").await;
    let shown = main.attr("data-digest").await.unwrap();
    assert_eq!(shown.as_deref(), Some(digest.as_str()), "the page's digest");
    browser.find("form#approve").await;
    browser.assert_fits_the_screen().await;
    browser.screenshot("request").await;

    browser.click("form#approve button[type=submit]").await;
    // On to the other waiting request, which says what was recorded.
    assert_recorded(&browser, "approved by rita").await;
    let next = browser.eval("return location.pathname").await;
    assert!(next.as_str().unwrap().contains(&second), "{next}");
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
    let decided = decisions(&app, &run_id).await;
    assert_eq!(decided.len(), 1, "{decided:?}");
    assert_eq!(decided[0]["channel"], "web");
    assert_eq!(decided[0]["actor"], "rita");
}

#[tokio::test]
async fn a_reject_without_a_reason_is_stopped_by_the_browser_and_one_with_a_reason_is_recorded() {
    let (app, run_id, browser) = a_paused_request_open("inbox_reject_phone", Screen::Phone).await;
    browser.assert_fits_the_screen().await;
    browser.screenshot("request").await;

    mark(&browser).await;
    browser.click("form#reject button[type=submit]").await;
    // The browser does not send the form: it points at the empty reason instead.
    browser
        .wait_until(
            "the browser to point at the missing reason",
            "const reason = document.querySelector('form#reject textarea[name=reason]'); \
             return document.activeElement === reason && reason.validity.valueMissing",
        )
        .await;
    assert_not_reloaded(&browser).await;
    assert_eq!(app.get_run_status(&run_id).await, "awaiting_approval");
    assert!(decisions(&app, &run_id).await.is_empty());

    browser
        .fill(
            "form#reject textarea[name=reason]",
            "The order was never paid.",
        )
        .await;
    browser.click("form#reject button[type=submit]").await;
    assert_recorded(&browser, "rejected by rita").await;
    app.wait_status(&run_id, "completed").await;
    assert!(
        app.tools.refunds().is_empty(),
        "a rejected refund is not made"
    );
    let decided = decisions(&app, &run_id).await;
    assert_eq!(decided.len(), 1, "{decided:?}");
    assert_eq!(decided[0]["detail"]["action"], "reject");
    assert_eq!(decided[0]["detail"]["reason"], "The order was never paid.");
}

#[tokio::test]
async fn an_edit_above_the_schemas_maximum_is_stopped_by_the_browsers_own_constraint_and_decides_nothing()
 {
    let (app, run_id, browser) = a_paused_request_open("inbox_edit_error", Screen::Desktop).await;
    let hint = browser
        .eval(
            "const f = document.querySelector(\"form#edit [name='input.amount']\"); \
             return document.getElementById(f.getAttribute('aria-describedby')).innerText",
        )
        .await;
    assert_eq!(
        hint, "In US dollars. More than 0, at most 500.",
        "the schema's description and limits are the field's hint"
    );

    mark(&browser).await;
    send_edit(&browser, "5000").await;
    assert_stopped_by_the_browser(&browser).await;
    assert_not_reloaded(&browser).await;
    // The form says what the edit changes before it is sent.
    let change = browser
        .wait_for_text("form#edit output#change", "amount: 129 → 5000")
        .await;
    assert_eq!(change, "Your change: amount: 129 → 5000");
    browser.screenshot("edit-stopped").await;
    assert_eq!(app.get_run_status(&run_id).await, "awaiting_approval");
    assert!(decisions(&app, &run_id).await.is_empty());

    send_edit(&browser, "49").await;
    assert_recorded(&browser, "approved with changes by rita").await;
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds()[0]["amount"], 49);
}

#[tokio::test]
async fn a_request_decided_in_slack_while_its_page_is_open_shows_as_decided_without_a_reload() {
    let policy = "approvers = [\"role:finance\", \"rita\"]\nchannels = [\"slack:#refunds\"]\n";
    let (app, slack) = app_with(FakeSlack::start().await, policy, |_| {}, refund_brain).await;
    let (run_id, _, approve) = posted_run(&app, &slack).await;
    let (call_id, _) = held_call(&app, &run_id).await;
    let browser = Browser::start("inbox_decided_in_slack", Screen::Desktop).await;
    sign_in(&browser, &app, REVIEWER_KEY).await;
    open_request(&browser, &app, &run_id, &call_id).await;
    // The run live beside the request: the model's words up to the pause.
    browser
        .wait_for_text("#live pre.turn", "I will check it and refund it.")
        .await;
    mark(&browser).await;

    let (status, _) = interact(&app, &click("U_ALICE", "approve", &approve)).await;
    assert_eq!(status, 200);
    // The decision as it happened, through the channel it came from.
    browser
        .wait_for_text("#live", "approved by alice (slack)")
        .await;
    // Said in the action bar's live region, beside the buttons it disables.
    browser
        .wait_for_text("nav.actions #status[aria-live=polite] p.outcome", "alice")
        .await;
    let usable = browser
        .eval(
            "return [...document.querySelectorAll('form#approve button, form#edit button, \
             form#reject button')].filter(b => !b.disabled).length",
        )
        .await;
    assert_eq!(usable, 0, "no button of the page can decide any more");
    assert_not_reloaded(&browser).await;
    browser.screenshot("decided").await;
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
    assert_eq!(decisions(&app, &run_id).await[0]["channel"], "slack");
}

#[tokio::test]
async fn a_runs_page_shows_it_live_through_a_decision_made_elsewhere_to_its_end_without_a_reload() {
    let app = TestApp::spawn(refund_brain).await;
    let run_id = app.start_run("Refund A-1001 please.").await;
    let (call_id, digest) = held_call(&app, &run_id).await;
    let browser = Browser::start("inbox_run_live", Screen::Phone).await;
    sign_in(&browser, &app, REVIEWER_KEY).await;
    browser
        .goto(&format!("{}/inbox/runs/{run_id}", app.gateway_url))
        .await;
    // From its start: the model's words and the pause, from the run's live events.
    browser
        .wait_for_text("#live pre.turn", "I will check it and refund it.")
        .await;
    browser.wait_for_text("#live", "Paused for a person").await;
    mark(&browser).await;
    browser.assert_fits_the_screen().await;

    let (status, body) = app.approve(&run_id, &call_id, &Value::String(digest)).await;
    assert_eq!(status, 200, "{body}");
    browser
        .wait_for_text("#live", "approved by rita (api)")
        .await;
    browser.wait_for_text("#live", "All done.").await;
    browser.wait_for_text("#live .live-state", "ended").await;
    assert_not_reloaded(&browser).await;
    browser.screenshot("live").await;
}

/// A script that has the page approve `call_id` through the API (as rita, with her key), then
/// holds the page's scripts until the run has ended, as a busy phone does: the run's events
/// then reach the page together, one after the other. Synchronous requests do both, the
/// second for the run's live events, a stream that ends with the run; what the API answered
/// is left in `countersignDecided`. Both are done in the page, so that nothing the test does
/// waits on the page while it is held.
fn approve_then_hold(run_id: &str, call_id: &str, digest: &str) -> String {
    let decisions = serde_json::json!({
        "decisions": [{"call_id": call_id, "digest": digest, "action": "approve"}]
    });
    format!(
        "setTimeout(() => {{ \
           const decide = new XMLHttpRequest(); \
           decide.open('POST', '/v1/runs/{run_id}/decisions', false); \
           decide.setRequestHeader('Authorization', 'Bearer {REVIEWER_KEY}'); \
           decide.setRequestHeader('Content-Type', 'application/json'); \
           decide.send({body}); \
           window.countersignDecided = decide.status; \
           const follow = new XMLHttpRequest(); \
           follow.open('GET', document.getElementById('live').getAttribute('data-events'), false); \
           follow.send(); \
         }}, 0); return true",
        // The body as a JavaScript string: JSON's string literal is one.
        body = Value::String(decisions.to_string())
    )
}

/// Waits for the gateway's answer to one more request of the page's, sent after those the
/// page's own scripts had sent: the gateway answers those at once, so theirs are back by then.
async fn round_trip(browser: &Browser) {
    let script = "const done = arguments[arguments.length - 1]; \
        fetch(location.pathname, {cache: 'no-store'}).then(() => setTimeout(() => done(true), 0));";
    browser
        .client
        .execute_async(script, Vec::new())
        .await
        .unwrap();
}

#[tokio::test]
async fn on_a_phone_a_request_decided_elsewhere_says_so_once_however_many_events_arrive_and_its_bar_offers_nothing()
 {
    let (app, run_id, browser) =
        a_paused_request_open("decided_elsewhere_phone", Screen::Phone).await;
    let (call_id, digest) = held_call(&app, &run_id).await;
    browser.wait_for_text("#live", "Paused for a person").await;
    mark(&browser).await;

    // Decided through the API while the page is held: the decision, the resumption, the
    // refund's result and the end reach it at once, each asking about the call.
    browser
        .eval(&approve_then_hold(&run_id, &call_id, &digest))
        .await;
    app.wait_status(&run_id, "completed").await;
    let decided = browser.eval("return window.countersignDecided").await;
    assert_eq!(decided, 200, "the API's answer to the decision");
    browser
        .wait_for_text("nav.actions #status p.outcome", "rita")
        .await;
    browser.wait_for_text("#live .live-state", "ended").await;
    round_trip(&browser).await;

    let shown = browser
        .eval(
            "const bar = document.querySelector('nav.actions'); \
             return [bar.querySelectorAll('p.outcome').length, \
               [...document.querySelectorAll('form.decide')].filter(f => !bar.contains(f)) \
                 .map(f => f.querySelectorAll('p.outcome').length), \
               bar.getBoundingClientRect().height, innerHeight, \
               [...document.querySelectorAll('form.decide button')].filter(b => !b.disabled).length];",
        )
        .await;
    assert_eq!(shown[0], 1, "the bar says it once: {shown}");
    let below = shown[1].as_array().unwrap();
    assert!(
        below.len() >= 2 && below.iter().all(|notes| notes == 1),
        "each form below (edit, reject, …) says it once: {shown}"
    );
    let (bar, height) = (shown[2].as_f64().unwrap(), shown[3].as_f64().unwrap());
    assert!(
        bar * 5.0 < height,
        "the fixed bar stays small: {bar} px of {height}"
    );
    assert_eq!(shown[4], 0, "no button of the page can decide any more");
    // The bar's Approve and its links to the forms are gone, not merely disabled.
    let offered = browser
        .client
        .find_all(fantoccini::Locator::Css(
            "nav.actions a, nav.actions button",
        ))
        .await
        .unwrap();
    assert!(!offered.is_empty());
    for element in offered {
        let what = element.text().await.unwrap();
        assert!(
            !element.is_displayed().await.unwrap(),
            "{what:?} is still shown"
        );
    }
    // The facts follow too: the deadline no longer counts down.
    browser
        .wait_until(
            "the facts of a decided request",
            "return !document.querySelector('section.request .left') \
               && document.querySelector('section.request dl.facts').innerText.includes('deadline')",
        )
        .await;
    assert_not_reloaded(&browser).await;
    browser.screenshot("decided").await;
}

#[tokio::test]
async fn a_runs_page_shows_its_status_what_waits_and_its_audit_trail_as_they_are_when_the_run_ends_without_a_reload()
 {
    let app = TestApp::spawn(refund_brain).await;
    let run_id = app.start_run("Refund A-1001 please.").await;
    let (call_id, digest) = held_call(&app, &run_id).await;
    let browser = Browser::start("run_page_follows", Screen::Desktop).await;
    sign_in(&browser, &app, REVIEWER_KEY).await;
    browser
        .goto(&format!("{}/inbox/runs/{run_id}", app.gateway_url))
        .await;
    browser.wait_for_text("#live", "Paused for a person").await;
    browser
        .wait_for_text("dd.status", "awaiting approval")
        .await;
    browser.find("section.waiting").await;
    mark(&browser).await;

    let (status, body) = app.approve(&run_id, &call_id, &Value::String(digest)).await;
    assert_eq!(status, 200, "{body}");
    app.wait_status(&run_id, "completed").await;
    browser.wait_for_text("dd.status", "completed").await;
    browser
        .wait_for_text("section.audit ol.audit", "decided")
        .await;
    browser
        .wait_for_text("section.audit ol.audit", "completed")
        .await;
    browser
        .wait_until(
            "nothing to wait for",
            "return !document.querySelector('section.waiting')",
        )
        .await;
    // The live log the page wrote stays as it was.
    browser
        .wait_for_text("#live", "approved by rita (api)")
        .await;
    assert_not_reloaded(&browser).await;
    browser.screenshot("ended").await;
}

/// The refund policy as the demo agent has it, which a test tightens.
const REFUND_WHEN: &str = "when = \"input.amount > 20.0\"";

#[tokio::test]
async fn a_runs_page_tells_a_policy_change_that_closes_a_waiting_call_and_a_call_to_check_in_plain_words()
 {
    let app = TestApp::builder(refund_brain)
        .worker(|c| c.agents_reload_ms = 50)
        .start()
        .await;
    let run_id = app.start_run("Refund A-1001 please.").await;
    held_call(&app, &run_id).await;
    let browser = Browser::start("live_policy_change", Screen::Desktop).await;
    sign_in(&browser, &app, REVIEWER_KEY).await;
    browser
        .goto(&format!("{}/inbox/runs/{run_id}", app.gateway_url))
        .await;
    browser.wait_for_text("#live", "Paused for a person").await;

    app.rewrite_agent(|agent| agent.replace(REFUND_WHEN, &format!("{REFUND_WHEN}\nquorum = 2")));
    browser
        .wait_for_text(
            "#live",
            "toolu_2: closed: its policy changed, so it is checked again",
        )
        .await;
    browser
        .wait_for_text("#live", "asked again as toolu_2.r2")
        .await;
    // Asked again: the page's list of what waits names the new call.
    browser
        .find("section.waiting a[href$='/calls/toolu_2.r2']")
        .await;
    // A call whose outcome a crash lost, as a worker tells the run's followers of it.
    let attention = serde_json::json!({
        "type": "run.attention", "version": 1, "run_id": run_id, "call_id": "toolu_1",
        "tool": "get_order", "input": {"order_id": "A-1001"},
        "reason": "The outcome of this get_order call is unknown.",
    });
    app.publish_event(&format!("live.{run_id}"), &attention)
        .await;
    browser
        .wait_for_text(
            "#live",
            "get_order (toolu_1) needs a person to look: The outcome of this get_order call is unknown.",
        )
        .await;
    let lines = browser
        .eval(
            "return [...document.querySelectorAll('#live-log p.happening')].map(p => p.innerText)",
        )
        .await;
    for line in lines.as_array().unwrap() {
        let line = line.as_str().unwrap();
        assert!(
            !line
                .split_whitespace()
                .any(|word| ["run.", "approval.", "tool."]
                    .iter()
                    .any(|kind| word.starts_with(kind))),
            "an event's name, not words: {line:?}"
        );
        assert!(
            !line.contains("reject"),
            "a change is no rejection: {line:?}"
        );
    }
    browser.screenshot("policy-changed").await;
}

#[tokio::test]
async fn a_reviewer_signs_in_with_a_mailed_link_on_a_phone_reaching_the_gateway_at_its_own_address()
{
    // The mails' links say http://approvals.test; the phone reaches the gateway at its
    // address, so its forms are sent from there, not from the public base URL's origin.
    let (app, sink) = app_with_email("\"email:approvers\"", None).await;
    let browser = Browser::start("inbox_link_sign_in", Screen::Phone).await;
    browser
        .goto(&format!("{}/inbox/sign-in", app.gateway_url))
        .await;
    browser
        .fill("form#email-link input[name=email]", "alice@example.com")
        .await;
    browser.click("form#email-link button[type=submit]").await;
    let mail = wait_for("the sign-in mail", PATIENCE, || async {
        sink.mails()
            .into_iter()
            .find(|m| m.data.contains("Subject: Your sign-in link"))
    })
    .await;
    let base = "http://approvals.test";
    let link = mail.links(&format!("{base}/inbox/sign-in/"))[0].replacen(base, &app.gateway_url, 1);

    browser.goto(&link).await;
    browser.assert_fits_the_screen().await;
    browser.click("form#use-link button[type=submit]").await;
    browser
        .wait_until(
            "the inbox after signing in",
            "return location.pathname === '/inbox' && document.readyState === 'complete'",
        )
        .await;
    assert_eq!(signed_in_as(&browser).await, serde_json::json!(["alice"]));
}

/// mallory's key: she may review, and would like others' decisions recorded as hers.
const MALLORY_KEY: &str = "test-mallory-key-0123456789";

/// A page of another site (`localhost`, while the gateway is `127.0.0.1`: another host, so
/// another site) that, once opened, posts `fields` to `action` from a form of its own; its URL.
async fn attackers_page(action: &str, fields: &[(&str, &str)]) -> String {
    let inputs: String = fields
        .iter()
        .map(|(name, value)| format!("<input type=\"hidden\" name=\"{name}\" value=\"{value}\">"))
        .collect();
    let html = format!(
        "<!doctype html><title>Win a prize</title><form id=\"f\" method=\"post\" \
         action=\"{action}\">{inputs}</form><script>document.getElementById('f').submit()</script>"
    );
    let page = axum::Router::new().route(
        "/",
        axum::routing::get(move || async move { axum::response::Html(html) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, page).await });
    format!("http://localhost:{port}/")
}

/// Who the inbox's header says is signed in, on the page the browser shows.
async fn signed_in_as(browser: &Browser) -> Value {
    browser
        .eval("return [...document.querySelectorAll('header .who')].map(e => e.innerText)")
        .await
}

#[tokio::test]
async fn a_page_of_another_site_cannot_sign_a_visitor_in_as_the_attacker() {
    let add_mallory = |config: &mut approval_gateway::config::Config| {
        config.api_keys.push(approval_gateway::config::ApiKey {
            key: MALLORY_KEY.into(),
            role: approval_gateway::config::Role::Reviewer,
            principal: "mallory".into(),
            speaks_for: Vec::new(),
        });
    };
    let app = TestApp::builder(refund_brain)
        .gateway(add_mallory)
        .start()
        .await;
    // mallory's page carries all she can get: her key, and the token of a sign-in page she
    // opened herself.
    let form = app
        .http
        .get(format!("{}/inbox/sign-in", app.gateway_url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let token = form
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the sign-in page has a token")
        .to_string();
    let action = format!("{}/inbox/sign-in", app.gateway_url);
    let fields = [("key", MALLORY_KEY), ("csrf", &token), ("next", "/inbox")];
    let page = attackers_page(&action, &fields).await;
    let browser = Browser::start("login_csrf", Screen::Desktop).await;
    let inbox = format!("{}/inbox", app.gateway_url);
    let gateway = serde_json::json!(app.gateway_url);

    // Twice: a visitor not signed in, then one signed in as herself.
    for before in [None, Some("rita")] {
        browser.goto(&page).await;
        let landed = browser
            .wait_until(
                "the gateway's answer to the other site's form",
                &format!(
                    "return location.origin === {gateway} && document.readyState === 'complete' \
                     && location.pathname"
                ),
            )
            .await;
        browser.screenshot("posted").await;
        assert_eq!(
            landed, "/inbox/sign-in",
            "the post was answered, not followed"
        );
        browser.goto(&inbox).await;
        let at = browser
            .wait_until(
                "the inbox, or the sign-in page it sends to",
                "return document.readyState === 'complete' && location.pathname",
            )
            .await;
        match before {
            None => assert_eq!(at, "/inbox/sign-in", "still signed out"),
            Some(who) => {
                assert_eq!(at, "/inbox");
                assert_eq!(signed_in_as(&browser).await, serde_json::json!([who]));
            }
        }
        assert_ne!(signed_in_as(&browser).await, serde_json::json!(["mallory"]));
        if before.is_none() {
            sign_in(&browser, &app, REVIEWER_KEY).await;
        }
    }
}

#[tokio::test]
async fn on_a_desktop_approve_is_on_the_first_screen_every_page_fits_and_a_decision_leads_to_the_next_request()
 {
    work_through_two_requests("inbox_desktop", Screen::Desktop).await;
}

#[tokio::test]
async fn on_a_phone_approve_is_on_the_first_screen_every_page_fits_and_a_decision_leads_to_the_next_request()
 {
    work_through_two_requests("inbox_phone", Screen::Phone).await;
}

/// Two refunds wait; on `screen` the reviewer opens the queue, then the first request, whose
/// Approve button is on the first screen with what the decision needs; approving it leads to
/// the second, which says what was recorded. No page is wider than the screen. The fold
/// position is written to the artifacts as `<name>-fold.txt`.
async fn work_through_two_requests(name: &str, screen: Screen) {
    let app = TestApp::spawn(refund_brain).await;
    let first = app.start_run("Refund A-1001 please.").await;
    let (first_call, _) = held_call(&app, &first).await;
    let second = app
        .start_run("The mug from A-1001 arrived in pieces, please refund it.")
        .await;
    held_call(&app, &second).await;
    let browser = Browser::start(name, screen).await;
    browser
        .goto(&format!("{}/inbox/sign-in", app.gateway_url))
        .await;
    browser.find("form#sign-in").await;
    browser.assert_fits_the_screen().await;
    sign_in(&browser, &app, REVIEWER_KEY).await;
    browser.find("li.request").await;
    browser.assert_fits_the_screen().await;
    browser.screenshot("queue").await;

    open_request(&browser, &app, &first, &first_call).await;
    browser.assert_fits_the_screen().await;
    let (top, height, visible) = approve_at(&browser).await;
    assert!(
        visible,
        "Approve is on the first screen: its top at {top} px of {height}"
    );
    // What the decision needs is above the fold too: the policy's reason, what the person
    // asked, the exact input and the time left.
    let above = browser
        .eval(
            "const bar = document.querySelector('nav.actions').getBoundingClientRect(); \
             const limit = getComputedStyle(document.querySelector('nav.actions')).position === 'fixed' \
               ? bar.top : innerHeight; \
             return ['p.reason', 'figure.asked', 'pre.input', '.left'].filter(css => { \
               const r = document.querySelector(css).getBoundingClientRect(); \
               return !(r.top >= 0 && r.top < limit); });",
        )
        .await;
    assert_eq!(above, serde_json::json!([]), "not on the first screen");
    let text = browser.text().await;
    assert!(text.contains("Refund A-1001 please."), "{text}");
    std::fs::write(
        countersign_tests::browser::artifacts_dir().join(format!("{name}-fold.txt")),
        format!("top of Approve: {top} px of a {height} px window\n"),
    )
    .unwrap();
    browser.screenshot("request").await;

    browser.click("form#approve button[type=submit]").await;
    assert_recorded(&browser, "approved by rita").await;
    let path = browser.eval("return location.pathname").await;
    assert!(path.as_str().unwrap().contains(&second), "{path}");
    assert!(
        approve_at(&browser).await.2,
        "the next one's Approve is shown too"
    );
    browser.assert_fits_the_screen().await;
    browser.screenshot("next").await;

    // The decided request, and its run's page, whose heading is the long run id.
    browser.click("p.recorded a").await;
    browser.find("main #status p.outcome").await;
    browser.assert_fits_the_screen().await;
    browser
        .goto(&format!("{}/inbox/runs/{first}", app.gateway_url))
        .await;
    browser.find("main").await;
    browser.assert_fits_the_screen().await;
    app.wait_status(&first, "completed").await;
    assert_eq!(decisions(&app, &first).await.len(), 1);
    assert!(decisions(&app, &second).await.is_empty());
}

#[tokio::test]
async fn on_a_desktop_after_an_edit_and_a_rejection_the_next_request_opens_at_the_focused_recorded_note_not_at_its_own_forms()
 {
    decide_by_forms_then_land_on_the_note("after_forms_desktop", Screen::Desktop).await;
}

#[tokio::test]
async fn on_a_phone_after_an_edit_and_a_rejection_the_next_request_opens_at_the_focused_recorded_note_not_at_its_own_forms()
 {
    decide_by_forms_then_land_on_the_note("after_forms_phone", Screen::Phone).await;
}

/// Three refunds wait; on `screen` the reviewer edits the first, then rejects the next. Each
/// form posts to its own fragment (`#edit`, `#reject`); the page each decision leads to (the
/// next request) shows the note of what was recorded, in view and focused, and neither of its
/// own edit and reject forms: a reviewer does not land in another call's form thinking it is
/// the one just sent.
async fn decide_by_forms_then_land_on_the_note(name: &str, screen: Screen) {
    let app = TestApp::spawn(refund_brain).await;
    let mut runs = Vec::new();
    for asked in [
        "Refund A-1001 please.",
        "Refund A-1001 again.",
        "Refund A-1001 once more.",
    ] {
        let run_id = app.start_run(asked).await;
        let (call_id, _) = held_call(&app, &run_id).await;
        runs.push((run_id, call_id));
    }
    let browser = Browser::start(name, screen).await;
    sign_in(&browser, &app, REVIEWER_KEY).await;
    open_request(&browser, &app, &runs[0].0, &runs[0].1).await;

    send_edit(&browser, "49").await;
    assert_recorded(&browser, "approved with changes by rita").await;
    let after_edit = assert_at_the_note(&browser, "edit").await;
    browser.screenshot("after-edit").await;

    browser
        .fill(
            "form#reject textarea[name=reason]",
            "The order was never paid.",
        )
        .await;
    browser.click("form#reject button[type=submit]").await;
    browser
        .wait_until(
            "the page after the rejection",
            &format!(
                "return location.pathname !== {after_edit:?} && document.readyState === 'complete'"
            ),
        )
        .await;
    assert_recorded(&browser, "rejected by rita").await;
    assert_at_the_note(&browser, "reject").await;
    browser.screenshot("after-reject").await;

    // One run edited, one rejected, the third still waiting: each form decided its own call.
    let mut actions = Vec::new();
    for (run_id, _) in &runs {
        let decided = decisions(&app, run_id).await;
        let said: Vec<&str> = decided
            .iter()
            .map(|d| d["detail"]["action"].as_str().unwrap_or_default())
            .collect();
        actions.push(said.join(","));
    }
    actions.sort();
    assert_eq!(actions, ["", "edit", "reject"]);
}

/// Asserts that the page the browser shows after a decision sent from the `form` form opened
/// at the note of what was recorded: named by the address's fragment, wholly on the screen,
/// focused, and no edit or reject form of the request shown on the screen; its path.
async fn assert_at_the_note(browser: &Browser, form: &str) -> String {
    let at = browser
        .wait_until(
            "the page loaded with its note",
            "const note = document.querySelector('p.recorded'); \
             if (!note || document.readyState !== 'complete') return null; \
             const r = e => e.getBoundingClientRect(); \
             const bar = document.querySelector('nav.actions'); \
             const bottom = bar && getComputedStyle(bar).position === 'fixed' ? r(bar).top : innerHeight; \
             const shown = e => r(e).bottom > 0 && r(e).top < bottom; \
             return [location.hash, r(note).top >= 0 && r(note).bottom <= bottom, \
               document.activeElement === note, \
               [...document.querySelectorAll('form#edit, form#reject')].filter(shown).map(f => f.id), \
               location.pathname, [r(note).top, r(note).bottom, bottom, scrollY]];",
        )
        .await;
    assert_eq!(at[0], "#recorded", "after the {form} form: {at}");
    assert_eq!(
        at[1], true,
        "after the {form} form, the note is on the screen: {at}"
    );
    assert_eq!(
        at[2], true,
        "after the {form} form, the note has the focus: {at}"
    );
    assert_eq!(
        at[3],
        serde_json::json!([]),
        "after the {form} form, no form of the next request is on the screen: {at}"
    );
    at[4].as_str().unwrap().to_string()
}

#[tokio::test]
async fn the_queue_tells_requests_apart_counts_them_and_is_worked_from_the_keyboard_with_a_confirmation()
 {
    let app = TestApp::spawn(refund_brain).await;
    let first = app.start_run("Refund A-1001 please.").await;
    held_call(&app, &first).await;
    let second = app
        .start_run("The mug from A-1001 arrived in pieces, please refund it.")
        .await;
    held_call(&app, &second).await;
    let browser = Browser::start("queue_keyboard", Screen::Desktop).await;
    sign_in(&browser, &app, REVIEWER_KEY).await;
    browser.find("li.request").await;
    let title = browser.eval("return document.title").await;
    assert_eq!(title, "Waiting for you (2) · countersign");

    // Each row says what its person asked, the input's values and which run it is.
    let rows = browser
        .eval(
            "return [...document.querySelectorAll('li.request')].map(r => \
               [r.getAttribute('data-run'), r.querySelector('.asked').innerText, \
                r.querySelector('.values').innerText, r.querySelector('.run-id').innerText, \
                r.querySelector('.meta').innerText]);",
        )
        .await;
    let rows = rows.as_array().unwrap();
    for (run, asked) in [
        (&first, "Refund A-1001 please."),
        (&second, "The mug from A-1001 arrived in pieces"),
    ] {
        let row = rows.iter().find(|r| r[0] == run.as_str()).unwrap();
        assert!(row[1].as_str().unwrap().contains(asked), "{row}");
        assert!(row[2].as_str().unwrap().contains("amount 129"), "{row}");
        assert!(
            run.ends_with(row[3].as_str().unwrap().trim_start_matches('…')),
            "{row}"
        );
        assert!(row[4].as_str().unwrap().contains("waited"), "{row}");
        assert!(row[4].as_str().unwrap().contains("left"), "{row}");
    }
    assert_ne!(rows[0][3], rows[1][3], "short run ids tell the runs apart");

    // A request that arrives while the queue is open is marked new and counted.
    mark(&browser).await;
    let third = app.start_run("Refund A-1001 again.").await;
    browser
        .find(&format!("li.request.new[data-run='{third}']"))
        .await;
    browser
        .wait_until(
            "the count to follow",
            "return document.title === 'Waiting for you (3) · countersign' \
               && document.querySelector('main h1').innerText === 'Waiting for you (3)'",
        )
        .await;
    assert_not_reloaded(&browser).await;
    browser.screenshot("queue").await;

    // ? shows the keys; j selects the first row; a asks first, and No decides nothing.
    browser.press("?").await;
    browser
        .wait_until("the keys", "return !document.getElementById('keys').hidden")
        .await;
    browser.press("j").await;
    let selected = browser
        .wait_until(
            "a selected row",
            "const r = document.querySelector('li.request.selected'); \
             return r && document.activeElement === r.querySelector('a.open') && r.getAttribute('data-run')",
        )
        .await;
    let chosen = selected.as_str().unwrap().to_string();
    browser.press("j").await;
    browser.press("k").await;
    let again = browser
        .eval("return document.querySelector('li.request.selected').getAttribute('data-run')")
        .await;
    assert_eq!(again, chosen.as_str(), "k comes back to the first row");
    browser.press("a").await;
    let asked = browser.answer_confirm(false).await;
    assert!(asked.starts_with("Approve"), "{asked}");
    assert_not_reloaded(&browser).await;
    assert!(decisions(&app, &chosen).await.is_empty());

    browser.press("a").await;
    browser.answer_confirm(true).await;
    assert_recorded(&browser, "approved by rita").await;
    let path = browser.eval("return location.pathname").await;
    assert_eq!(path, "/inbox", "deciding from the queue stays in the queue");
    app.wait_status(&chosen, "completed").await;
    let decided = decisions(&app, &chosen).await;
    assert_eq!(decided.len(), 1, "{decided:?}");
    assert_eq!(decided[0]["detail"]["action"], "approve");
    assert_eq!(decided[0]["channel"], "web");
    let title = browser.eval("return document.title").await;
    assert_eq!(title, "Waiting for you (2) · countersign");
}

#[tokio::test]
async fn a_reviewer_batch_approves_three_calls_and_the_one_that_changed_since_is_refused_and_listed()
 {
    let app = TestApp::spawn(refund_brain).await;
    let inputs: Vec<String> = (1..=3)
        .map(|i| format!("Refund order A-1001, case {i}."))
        .collect();
    let paused = app.paused_refunds(&inputs).await;
    let browser = Browser::start("inbox_batch", Screen::Desktop).await;
    sign_in(&browser, &app, REVIEWER_KEY).await;
    browser
        .wait_until(
            "three rows to select",
            "return document.querySelectorAll('li.request input.pick').length === 3",
        )
        .await;

    // "Select all" is the script's: it selects every row the filter lets through.
    browser.click("#select-all").await;
    let selected = browser
        .eval("return document.querySelectorAll('li.request input.pick:checked').length")
        .await;
    assert_eq!(selected, 3);
    // Once the page showed them, one of the calls changes.
    let changed = &paused[1].0;
    app.change_held_call(changed, "toolu_2").await;
    browser.screenshot("selected").await;
    browser.click("form#batch button[value=approve]").await;

    browser.find("ul#batch-results").await;
    browser.screenshot("batch-results").await;
    let outcomes = browser
        .eval(
            "return Array.from(document.querySelectorAll('li.batch-result')) \
             .map(li => [li.getAttribute('data-run'), li.getAttribute('data-outcome'), li.innerText]);",
        )
        .await;
    let outcomes = outcomes.as_array().unwrap();
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    for outcome in outcomes {
        let (run, said) = (outcome[0].as_str().unwrap(), outcome[2].as_str().unwrap());
        if run == changed {
            assert_eq!(outcome[1], "refused", "{said}");
            assert!(said.contains("changed since the queue showed it"), "{said}");
        } else {
            assert_eq!(outcome[1], "recorded", "{said}");
        }
    }
    let title = browser.eval("return document.title").await;
    assert_eq!(title, "Approved 2 of 3 · countersign");

    app.wait_status(&paused[0].0, "completed").await;
    app.wait_status(&paused[2].0, "completed").await;
    assert_eq!(app.get_run_status(changed).await, "awaiting_approval");
    assert!(decisions(&app, changed).await.is_empty());
    let decided = decisions(&app, &paused[0].0).await;
    assert_eq!(decided[0]["channel"], "web", "{decided:?}");
}

#[tokio::test]
async fn a_reviewer_approves_and_allows_similar_calls_sees_the_grant_and_a_later_run_is_approved_under_it()
 {
    let (app, run_id, browser) =
        a_paused_request_open("inbox_allow_similar", Screen::Desktop).await;
    let run = app.wait_status(&run_id, "awaiting_approval").await;
    let suggested = countersign_model::condition::suggested(&run["pending"][0]["input"]);

    // The action bar leads to the form, prefilled to cover this call.
    browser.click("nav.actions a[href='#allow']").await;
    let condition = browser
        .eval("return document.querySelector('form#allow textarea[name=condition]').value")
        .await;
    assert_eq!(condition, suggested.as_str(), "the condition proposed");
    browser.assert_fits_the_screen().await;
    browser.screenshot("request").await;
    browser.click("form#allow button[type=submit]").await;

    let granted = browser.find("p.outcome#granted").await;
    let id = granted.attr("data-grant").await.unwrap().unwrap();
    assert!(id.starts_with("grt_"), "{id}");
    browser.assert_fits_the_screen().await;
    browser.screenshot("granted").await;
    app.wait_status(&run_id, "completed").await;

    // The grants page, from the header, lists it as active with a Revoke button.
    browser.click("header a[href='/inbox/grants']").await;
    let listed = format!("li.grant[data-grant='{id}'][data-status='active']");
    browser.find(&format!("{listed} form.revoke")).await;

    // A later run asking the same is approved under it, in the reviewer's name.
    let later = app.start_run("Refund A-1001 please.").await;
    app.wait_status(&later, "completed").await;
    let decided = decisions(&app, &later).await;
    assert_eq!(decided.len(), 1, "{decided:?}");
    assert_eq!(decided[0]["actor"], format!("rita, under grant {id}"));
    assert_eq!(decided[0]["channel"], "grant");
    assert_eq!(app.tools.refunds().len(), 2);
    browser
        .goto(&format!("{}/inbox/grants", app.gateway_url))
        .await;
    browser
        .wait_for_text(&format!("{listed} dd.uses"), "1 of 10")
        .await;
    browser.assert_fits_the_screen().await;
    browser.screenshot("grants").await;
}
