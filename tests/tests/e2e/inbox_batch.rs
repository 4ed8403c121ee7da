//! The queue's batch form over HTTP, as a browser with JavaScript off sends it: the rows
//! selected are decided each with the digest its row showed, through the same session and
//! same-origin checks as every inbox form; a form sent from another site decides nothing.

use super::inbox::{Browser, Page};
use countersign_fake_model::refund_brain;
use countersign_tests::app::{REVIEWER_KEY, TestApp};
use reqwest::StatusCode;

/// Each row's selection as the queue renders it: the `call` checkbox's value.
fn picks(page: &Page) -> Vec<String> {
    let marker = "name=\"call\" value=\"";
    page.html
        .match_indices(marker)
        .map(|(at, _)| {
            let start = at + marker.len();
            let len = page.html[start..].find('"').unwrap();
            page.html[start..start + len].to_string()
        })
        .collect()
}

/// Two paused refunds, and the reviewer signed in on the queue that lists them; the runs, the
/// browser, the form's CSRF token and the rows' selections.
async fn two_rows_in_the_queue() -> (TestApp, Vec<String>, Browser, String, Vec<String>) {
    let app = TestApp::spawn(refund_brain).await;
    let inputs = [
        "Refund A-1001, case 1.".to_string(),
        "Refund A-1001, case 2.".to_string(),
    ];
    let runs: Vec<String> = app
        .paused_refunds(&inputs)
        .await
        .into_iter()
        .map(|(run, _)| run)
        .collect();
    let browser = Browser::signed_in(&app, REVIEWER_KEY).await;
    let queue = browser.get("/inbox").await;
    assert_eq!(queue.status, StatusCode::OK, "{}", queue.html);
    let picks = picks(&queue);
    assert_eq!(picks.len(), 2, "{}", queue.html);
    (app, runs, browser, queue.input("csrf"), picks)
}

/// Whether any decision was recorded on `run`, by its audit trail.
async fn decided(app: &TestApp, run: &str) -> bool {
    let (_, trail) = app.get(&format!("/v1/runs/{run}/audit")).await;
    trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["entry"]["kind"] == "decided")
}

#[tokio::test]
async fn a_batch_form_sent_from_another_site_is_refused_and_decides_nothing() {
    let (app, runs, browser, csrf, picks) = two_rows_in_the_queue().await;
    let mut fields = vec![("csrf", csrf.as_str()), ("action", "approve")];
    fields.extend(picks.iter().map(|p| ("call", p.as_str())));

    let page = browser
        .post_with(
            "/inbox/batch",
            &fields,
            &[("origin", "https://evil.example")],
        )
        .await;
    assert_eq!(page.status, StatusCode::FORBIDDEN, "{}", page.html);
    let page = browser
        .post_with("/inbox/batch", &fields, &[("sec-fetch-site", "cross-site")])
        .await;
    assert_eq!(page.status, StatusCode::FORBIDDEN, "{}", page.html);
    // Without the session's token, from the gateway's own origin, it is refused too.
    let forged: Vec<(&str, &str)> = fields
        .iter()
        .filter(|(n, _)| *n != "csrf")
        .cloned()
        .collect();
    let page = browser.post("/inbox/batch", &forged).await;
    assert_eq!(page.status, StatusCode::FORBIDDEN, "{}", page.html);
    for run in &runs {
        assert!(!decided(&app, run).await, "{run} was decided");
        assert_eq!(app.get_run_status(run).await, "awaiting_approval");
    }

    // The same form from the gateway's own page decides both.
    let origin = ("origin", app.gateway_url.as_str());
    let page = browser.post_with("/inbox/batch", &fields, &[origin]).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.html);
    assert_eq!(
        page.html.matches("data-outcome=\"recorded\"").count(),
        2,
        "{}",
        page.html
    );
    for run in &runs {
        app.wait_status(run, "completed").await;
    }
}

#[tokio::test]
async fn a_batch_rejection_needs_one_reason_and_then_rejects_each_selected_call() {
    let (app, runs, browser, csrf, picks) = two_rows_in_the_queue().await;
    let mut fields = vec![
        ("csrf", csrf.as_str()),
        ("action", "reject"),
        ("reason", " "),
    ];
    fields.extend(picks.iter().map(|p| ("call", p.as_str())));
    let page = browser.post("/inbox/batch", &fields).await;
    assert_eq!(
        page.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        page.html
    );
    assert!(page.html.contains("needs a reason"), "{}", page.html);
    assert!(!decided(&app, &runs[0]).await);

    // Nothing selected decides nothing either.
    let none = [("csrf", csrf.as_str()), ("action", "approve")];
    let page = browser.post("/inbox/batch", &none).await;
    assert_eq!(
        page.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        page.html
    );

    // Only the first row selected: only its run is rejected, with the reason.
    fields[2] = ("reason", "Duplicate request.");
    fields.pop();
    let page = browser.post("/inbox/batch", &fields).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.html);
    assert!(page.html.contains("Rejected 1 of 1"), "{}", page.html);
    let rejected = picks[0].split(' ').next().unwrap();
    let (_, trail) = app.get(&format!("/v1/runs/{rejected}/audit")).await;
    let decision = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entry"]["kind"] == "decided")
        .expect("the selected call was decided")
        .clone();
    assert_eq!(
        decision["entry"]["detail"]["action"], "reject",
        "{decision}"
    );
    assert_eq!(
        decision["entry"]["detail"]["reason"], "Duplicate request.",
        "{decision}"
    );
    let other = runs.iter().find(|r| *r != rejected).unwrap();
    assert!(!decided(&app, other).await);
}
