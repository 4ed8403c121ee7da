//! Every door applies the one rule of who may act, tried the way an attacker would: a cookie
//! kept across a configuration change, an emailed sign-in or decision link of someone whose
//! role no longer decides, a Slack click by a person whose only key starts runs, a session an
//! admin ends. Each door only says who is asking; what they may do is the same answer on all.

use super::email::{BASE, any_mail_for, post_form};
use super::inbox::Browser;
use super::slack::{app_with, interact, posted_run};
use approval_gateway::config::{ApiKey, Config, Person, Role};
use countersign_fake_model::refund_brain;
use countersign_tests::app::{ADMIN_KEY, INTEGRATION_KEY, PATIENCE, REVIEWER_KEY, TestApp};
use countersign_tests::fake_slack::{FakeSlack, click};
use countersign_tests::smtp_sink::SmtpSink;
use countersign_tests::wait_for;
use reqwest::{Method, StatusCode};
use serde_json::Value;

const ALICE_KEY: &str = "doors-alice-key-0123456789";
const RHEA_KEY: &str = "doors-rhea-key-0123456789";
const QUINN_KEY: &str = "doors-quinn-key-0123456789";

/// alice reviews with a key; rhea is a person whose only key reads, quinn one whose only key
/// starts runs: neither holds a role that decides. rhea comes first among the people, so a
/// mail to everyone would reach her before anyone else.
fn add_people(config: &mut Config) {
    let key = |key: &str, role, principal: &str| ApiKey {
        key: key.into(),
        role,
        principal: principal.into(),
        speaks_for: Vec::new(),
    };
    // The integration key (a system that signs its own users in) speaks for them too.
    for key in &mut config.api_keys {
        if key.key.expose() == INTEGRATION_KEY {
            key.speaks_for
                .extend(["rhea".to_string(), "quinn".to_string()]);
        }
    }
    config.api_keys.extend([
        key(ALICE_KEY, Role::Reviewer, "alice"),
        key(RHEA_KEY, Role::Reader, "rhea"),
        key(QUINN_KEY, Role::Requester, "quinn"),
    ]);
    for id in ["quinn", "rhea"] {
        config.people.insert(
            0,
            Person {
                id: id.into(),
                roles: vec!["finance".into()],
                slack_user: Some(format!("U_{}", id.to_uppercase())),
                email: Some(format!("{id}@example.com")),
                role: None,
            },
        );
    }
}

/// A refund app whose calls name no approvers (anyone whose role decides), asking by email.
async fn app_with_mail() -> (TestApp, SmtpSink) {
    let sink = SmtpSink::start().await;
    let email = sink.email_config(BASE);
    let app = TestApp::builder(refund_brain)
        .policy("channels = [\"email:approvers\"]\n")
        .gateway(move |config| {
            add_people(config);
            config.email = Some(email);
        })
        .start()
        .await;
    (app, sink)
}

fn request_path(run_id: &str) -> String {
    format!("/inbox/runs/{run_id}/calls/toolu_2")
}

/// Asserts that the run still waits with its refund undecided and that nothing was paid.
async fn nothing_decided(app: &TestApp, run_id: &str) {
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "awaiting_approval", "{run}");
    assert!(run["pending"][0]["decision"].is_null(), "{run}");
    assert!(app.tools.refunds().is_empty());
}

/// Asserts that the browser is sent to sign in.
fn sent_to_sign_in(page: &super::inbox::Page) {
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.html);
    let location = page.location.as_deref().unwrap_or_default();
    assert!(location.starts_with("/inbox/sign-in"), "{location}");
}

/// Signs `address` in by the link mailed to it.
async fn signed_in_by_mail(app: &TestApp, sink: &SmtpSink, address: &str) -> Browser {
    let browser = Browser::new(app);
    let asked = browser
        .sign_in_form("/inbox/sign-in/email", &[("email", address)])
        .await;
    assert_eq!(asked.status, StatusCode::OK, "{}", asked.html);
    let mail = wait_for(
        &format!("a sign-in link for {address}"),
        PATIENCE,
        || async {
            sink.mails().into_iter().find(|m| {
                m.to.iter().any(|t| t == address) && m.data.contains("Subject: Your sign-in link")
            })
        },
    )
    .await;
    let link = mail.links("http://approvals.test/inbox/sign-in/")[0].replacen(
        "http://approvals.test",
        "",
        1,
    );
    let page = browser.sign_in_form(&link, &[]).await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.html);
    assert_eq!(browser.get("/inbox").await.status, StatusCode::OK);
    browser
}

#[tokio::test]
async fn a_kept_cookie_decides_nothing_once_its_key_is_gone_from_the_configuration() {
    let mut app = TestApp::builder(refund_brain)
        .gateway(add_people)
        .start()
        .await;
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    let mut alice = Browser::signed_in(&app, ALICE_KEY).await;
    let path = request_path(&run_id);
    let page = alice.get(&path).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.html);
    let (csrf, digest) = (page.input("csrf"), page.input("digest"));

    // The gateway comes back without alice's key; she kept her cookie and the form.
    alice.base = app
        .spawn_gateway(|c| c.api_keys.retain(|k| k.principal != "alice"))
        .await;
    let form = [
        ("action", "approve"),
        ("csrf", csrf.as_str()),
        ("digest", digest.as_str()),
    ];
    sent_to_sign_in(&alice.post(&path, &form).await);
    sent_to_sign_in(&alice.get("/inbox").await);
    nothing_decided(&app, &run_id).await;

    // The session is gone, not just refused: the gateway that still knows her key does not
    // bring it back.
    alice.base = app.gateway_url.clone();
    sent_to_sign_in(&alice.get("/inbox").await);
}

#[tokio::test]
async fn a_session_from_an_emailed_link_ends_when_the_person_loses_a_deciding_role_or_leaves() {
    let (mut app, sink) = app_with_mail().await;
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    let mut alice = signed_in_by_mail(&app, &sink, "alice@example.com").await;
    let mut bob = signed_in_by_mail(&app, &sink, "bob@example.com").await;
    let path = request_path(&run_id);
    let page = alice.get(&path).await;
    assert!(page.html.contains("value=\"approve\""), "{}", page.html);
    let (csrf, digest) = (page.input("csrf"), page.input("digest"));

    // Restarted with alice made a reader and bob taken out of [[people]].
    let url = app
        .spawn_gateway(|c| {
            c.people.retain(|p| p.id != "bob");
            let alice = c.people.iter_mut().find(|p| p.id == "alice").unwrap();
            alice.role = Some(Role::Reader);
        })
        .await;
    alice.base = url.clone();
    bob.base = url;
    let form = [
        ("action", "approve"),
        ("csrf", csrf.as_str()),
        ("digest", digest.as_str()),
    ];
    sent_to_sign_in(&alice.post(&path, &form).await);
    sent_to_sign_in(&bob.get("/inbox").await);
    nothing_decided(&app, &run_id).await;
}

#[tokio::test]
async fn an_admin_ends_every_session_of_a_person_and_nobody_else_may() {
    let app = TestApp::builder(refund_brain)
        .gateway(add_people)
        .start()
        .await;
    let alice = Browser::signed_in(&app, ALICE_KEY).await;
    let second = Browser::signed_in(&app, ALICE_KEY).await;
    let end = |key| app.request(Method::DELETE, "/v1/people/alice/sessions", Some(key), None);

    let (status, body) = end(REVIEWER_KEY).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(alice.get("/inbox").await.status, StatusCode::OK);

    let (status, body) = end(ADMIN_KEY).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["ended"], 2, "{body}");
    sent_to_sign_in(&alice.get("/inbox").await);
    sent_to_sign_in(&second.get("/inbox").await);
}

#[tokio::test]
async fn email_reaches_only_people_whose_role_decides_and_a_link_is_checked_again_when_used() {
    let (mut app, sink) = app_with_mail().await;
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    // The mails go out in the order people are configured, rhea and quinn first: once alice's
    // and bob's arrived, theirs would have too.
    let (_, alice_links) = any_mail_for(&app, &sink, "alice@example.com").await;
    let (_, bob_links) = any_mail_for(&app, &sink, "bob@example.com").await;
    assert_eq!(alice_links.len(), 3);
    for nobody in ["rhea@example.com", "quinn@example.com"] {
        assert!(
            sink.mails()
                .iter()
                .all(|m| !m.to.iter().any(|t| t == nobody)),
            "{nobody} may decide nothing and was mailed"
        );
    }

    // alice's role changes to reader while her mail waits: her link decides nothing.
    let url = app
        .spawn_gateway(|c| {
            let alice = c.people.iter_mut().find(|p| p.id == "alice").unwrap();
            alice.role = Some(Role::Reader);
        })
        .await;
    let at = |link: &str| link.replacen(&app.gateway_url, &url, 1);
    let (status, html) = post_form(&app, &at(&alice_links[0]), &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{html}");
    assert!(
        html.contains("your role in countersign does not decide"),
        "{html}"
    );
    nothing_decided(&app, &run_id).await;

    // bob's link still decides.
    let (status, html) = post_form(&app, &at(&bob_links[0]), &[]).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    app.wait_status(&run_id, "completed").await;
}

#[tokio::test]
async fn a_slack_click_by_a_person_whose_role_does_not_decide_changes_nothing() {
    let (app, slack) = app_with(
        FakeSlack::start().await,
        "channels = [\"slack:#refunds\"]\n",
        add_people,
        refund_brain,
    )
    .await;
    let (run_id, _, value) = posted_run(&app, &slack).await;
    for user in ["U_QUINN", "U_RHEA"] {
        for action in ["approve", "reject", "edit"] {
            let (status, body) = interact(&app, &click(user, action, &value)).await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
    }
    let told: Vec<Value> = wait_for("six private refusals", PATIENCE, || async {
        let told = slack.calls("chat.postEphemeral");
        (told.len() == 6).then_some(told.into_iter().map(|c| c.body).collect())
    })
    .await;
    for body in &told {
        let text = body["text"].as_str().unwrap();
        assert!(text.contains("role") || text.contains("approver"), "{text}");
    }
    assert!(slack.calls("views.open").is_empty(), "no modal opened");
    nothing_decided(&app, &run_id).await;

    // alice, a person with no key (so a reviewer), decides it from the same message.
    let (status, _) = interact(&app, &click("U_ALICE", "approve", &value)).await;
    assert_eq!(status, StatusCode::OK);
    app.wait_status(&run_id, "completed").await;
}

#[tokio::test]
async fn a_key_speaking_for_a_person_decides_with_that_persons_role() {
    let app = TestApp::builder(refund_brain)
        .gateway(add_people)
        .start()
        .await;
    let run_id = app.start_run("Refund A-1001.").await;
    let paused = app.wait_status(&run_id, "awaiting_approval").await;
    let digest = &paused["pending"][0]["digest"];
    let approve = serde_json::json!({"call_id": "toolu_2", "digest": digest, "action": "approve"});
    let reject = serde_json::json!({"call_id": "toolu_2", "digest": digest, "action": "reject", "reason": "no"});
    for (person, decision) in [("rhea", approve.clone()), ("quinn", reject)] {
        let (status, body) = app.decide_as(person, &run_id, decision).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert_eq!(body["error"]["code"], "not_an_approver", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("does not hold a role that decides"),
            "{message}"
        );
    }
    nothing_decided(&app, &run_id).await;
    let (status, body) = app
        .decide_as(
            "alice",
            &run_id,
            serde_json::json!({"call_id": "toolu_2", "digest": digest, "action": "approve"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}
