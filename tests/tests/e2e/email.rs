//! Email approvals: opening a link decides nothing; the page's form does, once; used,
//! expired and superseded links say so and change nothing; Slack and email racing on one
//! call record one decision and both show it.

use countersign_fake_model::refund_brain;
use countersign_tests::app::{INTEGRATION_KEY, PATIENCE, TestApp};
use countersign_tests::fake_slack::{FakeSlack, SIGNING_SECRET, click, form_body};
use countersign_tests::infra::Infra;
use countersign_tests::smtp_sink::{Mail, SmtpSink};
use countersign_tests::wait_for;
use reqwest::StatusCode;
use serde_json::Value;

pub(super) const BASE: &str = "http://approvals.test";

pub(super) async fn app_with_email(
    channels: &str,
    slack: Option<&FakeSlack>,
) -> (TestApp, SmtpSink) {
    app_with_email_on(Infra::start().await, channels, slack).await
}

async fn app_with_email_on(
    infra: Infra,
    channels: &str,
    slack: Option<&FakeSlack>,
) -> (TestApp, SmtpSink) {
    let sink = SmtpSink::start().await;
    let email = sink.email_config(BASE);
    let slack_config = slack.map(FakeSlack::config);
    let policy = format!("approvers = [\"role:finance\"]\nchannels = [{channels}]\n");
    let app = TestApp::builder(refund_brain)
        .policy(&policy)
        .gateway(move |config| {
            config.email = Some(email);
            config.slack = slack_config;
        })
        .on(infra)
        .start()
        .await;
    (app, sink)
}

/// The mail sent to `address` once the run paused, and its approve, reject and edit links
/// rewritten to the test gateway.
pub(super) async fn mail_for(app: &TestApp, sink: &SmtpSink, address: &str) -> (Mail, Vec<String>) {
    let (mail, links) = any_mail_for(app, sink, address).await;
    assert_eq!(links.len(), 3, "{}", mail.data);
    (mail, links)
}

/// The mail sent to `address` once the run paused, and its links rewritten to the gateway.
pub(super) async fn any_mail_for(
    app: &TestApp,
    sink: &SmtpSink,
    address: &str,
) -> (Mail, Vec<String>) {
    let mail = wait_for(&format!("mail to {address}"), PATIENCE, || async {
        sink.mails()
            .into_iter()
            .find(|m| m.to.iter().any(|t| t == address))
    })
    .await;
    let links = mail
        .links(BASE)
        .iter()
        .map(|l| l.replacen(BASE, &app.gateway_url, 1))
        .collect::<Vec<_>>();
    (mail, links)
}

pub(super) async fn post_form(
    app: &TestApp,
    link: &str,
    fields: &[(&str, &str)],
) -> (StatusCode, String) {
    let response = app
        .http
        .post(link)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(serde_urlencoded::to_string(fields).unwrap())
        .send()
        .await
        .unwrap();
    (response.status(), response.text().await.unwrap())
}

#[tokio::test]
async fn an_email_link_opened_decides_nothing_its_form_decides_once() {
    let (app, sink) = app_with_email("\"email:alice@example.com\"", None).await;
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    let (mail, links) = mail_for(&app, &sink, "alice@example.com").await;
    assert!(
        mail.data
            .contains("Subject: Approval needed: Refund $129 for order A-1001"),
        "{}",
        mail.data
    );
    assert!(mail.data.contains("Why: Refund of $129 moves money"));
    assert!(mail.data.contains("Risk: costly: it spends money"));
    assert!(mail.data.contains("Evidence from get_order"));

    // A scanner fetches every link, twice, and sends HEAD too.
    for link in &links {
        for _ in 0..2 {
            let page = app.http.get(link).send().await.unwrap();
            assert_eq!(page.status(), 200);
            assert_eq!(page.headers()["cache-control"], "no-store");
            assert_eq!(page.headers()["referrer-policy"], "same-origin");
            let html = page.text().await.unwrap();
            assert!(
                html.contains("method=\"post\"") && !html.contains("<script"),
                "{html}"
            );
            // The same request view as the inbox: who asked, by when, what the agent saw.
            for expected in [
                "Asked by",
                "rick",
                "Time left",
                "get_order",
                "name=\"viewport\"",
            ] {
                assert!(html.contains(expected), "{expected:?} missing from {html}");
            }
        }
        assert_eq!(app.http.head(link).send().await.unwrap().status(), 200);
    }
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "awaiting_approval");
    assert!(run["pending"][0]["decision"].is_null());

    let (status, html) = post_form(&app, &links[0], &[]).await;
    assert_eq!(status, 200, "{html}");
    assert!(html.contains("Approved by alice via email at "), "{html}");
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
    let (status, html) = post_form(&app, &links[0], &[]).await;
    assert_eq!(status, 410, "a used link: {html}");
    assert!(html.contains("already used"), "{html}");
    assert!(html.contains("Approved by alice via email at "), "{html}");
    // The other links of the mail now say the request was decided.
    let page = app.http.get(&links[1]).send().await.unwrap();
    assert_eq!(page.status(), 409);
    assert!(
        page.text()
            .await
            .unwrap()
            .contains("Approved by alice via email at ")
    );

    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    let entries = trail["entries"].as_array().unwrap();
    assert!(
        entries.iter().any(|e| e["entry"]["kind"] == "notified"
            && e["entry"]["channel"] == "email:alice@example.com")
    );
    let decided = entries
        .iter()
        .find(|e| e["entry"]["kind"] == "decided")
        .unwrap();
    assert_eq!(decided["entry"]["channel"], "email");
    assert_eq!(decided["entry"]["actor"], "alice");
}

#[tokio::test]
async fn a_link_pages_form_sent_from_another_site_is_refused_and_leaves_the_link_working() {
    let (app, sink) = app_with_email("\"email:alice@example.com\"", None).await;
    let run_id = app.start_run("Refund A-1001.").await;
    let (_, links) = mail_for(&app, &sink, "alice@example.com").await;
    let post_from = |header: (&'static str, &'static str)| {
        let request = app
            .http
            .post(&links[0])
            .header("content-type", "application/x-www-form-urlencoded")
            .header(header.0, header.1);
        async move {
            let response = request.send().await.unwrap();
            (response.status(), response.text().await.unwrap())
        }
    };
    for header in [
        ("origin", "https://evil.example"),
        ("origin", "https://approvals.test"),
        ("origin", "null"),
        ("sec-fetch-site", "cross-site"),
        ("sec-fetch-site", "same-site"),
    ] {
        let (status, html) = post_from(header).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{header:?}: {html}");
        assert!(html.contains("nothing was changed"), "{html}");
    }
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "awaiting_approval");
    assert!(run["pending"][0]["decision"].is_null());

    // From the configured public base URL (the gateway as reviewers reach it), it decides.
    let (status, html) = post_from(("origin", BASE)).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
}

#[tokio::test]
async fn the_reject_and_edit_forms_keep_the_link_until_they_are_filled_in_right() {
    let (app, sink) = app_with_email("\"email:approvers\"", None).await;
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    // Every finance person with an address got their own mail; carol (support) did not.
    let (_, links) = mail_for(&app, &sink, "bob@example.com").await;
    mail_for(&app, &sink, "alice@example.com").await;
    assert!(
        sink.mails()
            .iter()
            .all(|m| !m.to.contains(&"carol@example.com".to_string()))
    );

    let (status, html) = post_form(&app, &links[1], &[("reason", "  ")]).await;
    assert_eq!(status, 422, "{html}");
    assert!(
        html.contains("<p class=\"field-error\">Write a reason"),
        "{html}"
    );
    let edit = |amount| {
        [
            ("input.order_id", "A-1001"),
            ("input.amount", amount),
            ("input.reason", "lid"),
            ("note", "Only the lid."),
        ]
    };
    let (status, html) = post_form(&app, &links[2], &edit("x")).await;
    assert_eq!(status, 422);
    assert!(html.contains("amount: must be a number"), "{html}");
    let (status, html) = post_form(&app, &links[2], &edit("900")).await;
    assert_eq!(status, 422);
    assert!(html.contains("amount: must be at most 500"), "{html}");
    assert!(
        html.contains("value=\"900\""),
        "what was typed is kept: {html}"
    );
    let mut misspelt = edit("129").to_vec();
    misspelt.push(("input.amout", "50"));
    let (status, html) = post_form(&app, &links[2], &misspelt).await;
    assert_eq!(status, 422);
    assert!(
        html.contains(
            "amout: is not a field of issue_refund (its fields: amount, order_id, reason)"
        ),
        "{html}"
    );
    let (status, html) = post_form(&app, &links[2], &edit("49")).await;
    assert_eq!(status, 200, "{html}");
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds()[0]["amount"], 49);
    // Bob's reject link is superseded by his own edit.
    let (status, _) = post_form(&app, &links[1], &[("reason", "changed my mind")]).await;
    assert_eq!(status, 409);
}

#[tokio::test]
async fn slack_and_email_racing_on_one_call_record_one_decision_and_both_show_it() {
    let slack = FakeSlack::start().await;
    let (app, sink) = app_with_email(
        "\"email:bob@example.com\", \"slack:#refunds\"",
        Some(&slack),
    )
    .await;
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    let (_, links) = mail_for(&app, &sink, "bob@example.com").await;
    let posted = wait_for("the Slack message", PATIENCE, || async {
        slack.calls("chat.postMessage").pop()
    })
    .await;
    let actions = posted.body["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "actions")
        .unwrap()
        .clone();
    let approve = actions["elements"][0]["value"]
        .as_str()
        .unwrap()
        .to_string();

    let body = form_body(&click("U_ALICE", "approve", &approve));
    let ts = chrono::Utc::now().timestamp().to_string();
    let slack_click = app
        .http
        .post(format!("{}/slack/interactions", app.gateway_url))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", &ts)
        .header(
            "x-slack-signature",
            approval_gateway::slack::signature::sign(SIGNING_SECRET, &ts, body.as_bytes()),
        )
        .body(body)
        .send();
    let email_reject = post_form(&app, &links[1], &[("reason", "Too much.")]);
    let (clicked, (email_status, _)) = tokio::join!(slack_click, email_reject);
    assert_eq!(clicked.unwrap().status(), 200);
    app.wait_status(&run_id, "completed").await;

    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    let decided: Vec<Value> = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["entry"]["kind"] == "decided")
        .cloned()
        .collect();
    assert_eq!(decided.len(), 1, "exactly one decision is recorded");
    let winner = decided[0]["entry"]["channel"].as_str().unwrap().to_string();
    let update = wait_for("chat.update", PATIENCE, || async {
        slack.calls("chat.update").pop()
    })
    .await;
    let shown = update.body["blocks"].to_string();
    let page = app
        .http
        .get(&links[0])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    if winner == "slack" {
        assert_eq!(email_status, 409);
        assert!(shown.contains("Approved by alice"), "{shown}");
        assert!(page.contains("Approved by alice via slack"), "{page}");
        assert_eq!(app.tools.refunds().len(), 1);
    } else {
        assert_eq!(email_status, 200);
        assert!(shown.contains("Rejected by bob"), "{shown}");
        assert!(page.contains("Rejected by bob via email"), "{page}");
        assert!(app.tools.refunds().is_empty());
    }
}

#[tokio::test]
async fn the_requester_gets_only_a_reject_link_and_a_failed_decision_leaves_a_link_working() {
    let (app, sink) = app_with_email_on(
        Infra::start_restartable().await,
        "\"email:approvers\"",
        None,
    )
    .await;
    // rick, in finance, asked for the run: he may turn it down, not approve it.
    let run_id = app.start_run("Refund A-1001.").await;
    let (mail, links) = any_mail_for(&app, &sink, "rick@example.com").await;
    assert_eq!(links.len(), 1, "{}", mail.data);
    assert!(mail.data.contains("Reject:"), "{}", mail.data);
    assert!(!mail.data.contains("Approve:"), "{}", mail.data);

    // Alice's approval fails on the way (Redis is down): her link still works afterwards.
    let (_, links) = mail_for(&app, &sink, "alice@example.com").await;
    app.infra.redis.stop().await.unwrap();
    let (status, _) = post_form(&app, &links[0], &[]).await;
    assert!(status.is_server_error(), "{status}");
    app.infra.redis.start().await.unwrap();
    let (status, html) = wait_for("Redis to be back for the form", PATIENCE, || async {
        let (status, html) = post_form(&app, &links[0], &[]).await;
        (!status.is_server_error()).then_some((status, html))
    })
    .await;
    assert_eq!(status, 200, "{html}");
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
    let (status, _) = post_form(&app, &links[0], &[]).await;
    assert_eq!(status, 410, "a link works once");
}

#[tokio::test]
async fn the_mail_is_text_and_html_with_the_input_and_the_headers_clients_expect() {
    let (app, sink) = app_with_email("\"email:approvers\"", None).await;
    app.start_run("Refund A-1001 please.").await;
    let (mail, _) = mail_for(&app, &sink, "alice@example.com").await;
    let data = &mail.data;
    for expected in [
        "MIME-Version: 1.0",
        "Message-ID: <",
        "multipart/alternative",
        "Content-Type: text/plain",
        "Content-Type: text/html",
        "Input: {",
        "\"order_id\": \"A-1001\"",
    ] {
        assert!(data.contains(expected), "{expected:?} missing from\n{data}");
    }
}

#[tokio::test]
async fn a_call_approved_under_a_grant_is_told_by_a_short_notice_and_nothing_else_is() {
    let (app, sink) = app_with_email("\"email:alice@example.com\"", None).await;
    let first = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&first, "awaiting_approval").await;
    mail_for(&app, &sink, "alice@example.com").await;
    let (status, made) = app
        .request(
            reqwest::Method::POST,
            "/v1/grants",
            Some(INTEGRATION_KEY),
            Some(serde_json::json!({"run_id": first, "call_id": "toolu_2",
                "digest": paused["pending"][0]["digest"], "condition": "input.amount <= 200.0",
                "max_uses": 5, "expires_in": "1h", "decided_by": "alice"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let id = made["grant"]["id"].as_str().unwrap().to_string();
    app.wait_status(&first, "completed").await;

    let covered = app.start_run("Refund A-1001.").await;
    app.wait_status(&covered, "completed").await;
    let notice = wait_for("the notice", PATIENCE, || async {
        sink.mails()
            .into_iter()
            .find(|m| m.data.contains("Nobody was asked"))
    })
    .await;
    assert_eq!(notice.to, ["alice@example.com"]);
    for part in [
        format!("Approved under grant {id} (made by alice)"),
        "Refund $129 for order A-1001".to_string(),
        format!("run {covered}, call toolu_2"),
        format!("countersign revoke {id}"),
    ] {
        assert!(notice.data.contains(&part), "{part:?} in {}", notice.data);
    }
    assert!(notice.links(BASE).is_empty(), "nothing to decide");
    // The request, then the notice: the approval of the first call mailed nothing.
    let mails = sink.mails();
    assert_eq!(mails.len(), 2, "{mails:?}");
}
