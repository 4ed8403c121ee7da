//! Slack: a request is posted with its summary, reason, the agent's words, the evidence and
//! buttons; signed clicks and modal submissions decide; every decision, from any channel,
//! updates the message; forged, stale or unmapped clicks change nothing. What the model and
//! its tools wrote is never markup, every message fits Slack's limits, and a message Slack
//! refuses anyway is posted in short.

use approval_gateway::slack::signature;
use countersign_fake_model::{anthropic_text, anthropic_tool_use, refund_brain, turn};
use countersign_tests::app::{INTEGRATION_KEY, PATIENCE, TestApp};
use countersign_tests::fake_slack::{
    APP_ID, BOT_TOKEN, CHANNEL_ID, FakeSlack, SIGNING_SECRET, SlackCall, TEAM_ID, click, form_body,
    submit,
};
use countersign_tests::wait_for;
use reqwest::StatusCode;
use serde_json::{Value, json};

const POLICY: &str = "approvers = [\"role:finance\"]\nchannels = [\"slack:#refunds\"]\n";

async fn app_with_slack() -> (TestApp, FakeSlack) {
    app_with(FakeSlack::start().await, POLICY, |_| {}, refund_brain).await
}

pub(super) async fn app_with(
    slack: FakeSlack,
    policy: &str,
    configure: impl FnOnce(&mut approval_gateway::config::Config),
    brain: impl Fn(&Value) -> Value + Send + Sync + 'static,
) -> (TestApp, FakeSlack) {
    let slack_config = slack.config();
    let app = TestApp::builder(brain)
        .policy(policy)
        .gateway(move |config| {
            config.slack = Some(slack_config);
            configure(config);
        })
        .start()
        .await;
    (app, slack)
}

/// Starts a run and waits for its Slack message; returns the run id and the Approve button's value.
pub(super) async fn posted_run(app: &TestApp, slack: &FakeSlack) -> (String, SlackCall, String) {
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    let posted = wait_for("the Slack message", PATIENCE, || async {
        slack.calls("chat.postMessage").pop()
    })
    .await;
    let value = button(&posted.body, "approve");
    (run_id, posted, value)
}

fn button(message: &Value, action: &str) -> String {
    let blocks = message["blocks"].as_array().unwrap();
    let actions = blocks.iter().find(|b| b["type"] == "actions").unwrap();
    let button = actions["elements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action_id"] == action)
        .unwrap();
    button["value"].as_str().unwrap().to_string()
}

async fn post_signed(
    app: &TestApp,
    payload: &Value,
    timestamp: i64,
    secret: &str,
) -> (StatusCode, String) {
    let body = form_body(payload);
    let ts = timestamp.to_string();
    let response = app
        .http
        .post(format!("{}/slack/interactions", app.gateway_url))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", &ts)
        .header(
            "x-slack-signature",
            signature::sign(secret, &ts, body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    (response.status(), response.text().await.unwrap())
}

pub(super) async fn interact(app: &TestApp, payload: &Value) -> (StatusCode, String) {
    post_signed(app, payload, chrono::Utc::now().timestamp(), SIGNING_SECRET).await
}

async fn wait_update(slack: &FakeSlack) -> SlackCall {
    wait_for("chat.update", PATIENCE, || async {
        slack.calls("chat.update").pop()
    })
    .await
}

fn all_text(message: &Value) -> String {
    message["blocks"].to_string()
}

#[tokio::test]
async fn a_signed_approve_click_resumes_the_run_and_updates_the_message() {
    let (app, slack) = app_with_slack().await;
    let (run_id, posted, approve) = posted_run(&app, &slack).await;
    assert_eq!(posted.authorization, format!("Bearer {BOT_TOKEN}"));
    assert_eq!(posted.body["channel"], "#refunds");
    let text = all_text(&posted.body);
    assert!(text.contains("Refund $129 for order A-1001"), "{text}");
    assert!(text.contains("Refund of $129 moves money"), "{text}");
    assert!(
        text.contains("I will check it and refund it"),
        "the agent's words: {text}"
    );
    assert!(
        text.contains("Evidence") && text.contains("delivered"),
        "the order lookup: {text}"
    );
    assert!(
        !text.contains("\"amount\":129"),
        "a summary, not raw JSON: {text}"
    );

    let (status, _) = interact(&app, &click("U_ALICE", "approve", &approve)).await;
    assert_eq!(status, 200);
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
    let update = wait_update(&slack).await;
    assert_eq!(update.body["channel"], CHANNEL_ID);
    assert_eq!(
        update.body["ts"], "1700000000.000001",
        "the message that was posted"
    );
    let text = all_text(&update.body);
    assert!(text.contains("Approved by alice"), "{text}");
    assert!(
        !text.contains("\"actions\""),
        "the buttons are gone: {text}"
    );

    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    let entries = trail["entries"].as_array().unwrap();
    assert!(
        entries
            .iter()
            .any(|e| e["entry"]["kind"] == "notified" && e["entry"]["channel"] == "slack:#refunds")
    );
    let decided = entries
        .iter()
        .find(|e| e["entry"]["kind"] == "decided")
        .unwrap();
    assert_eq!(decided["entry"]["channel"], "slack");
    assert_eq!(decided["entry"]["actor"], "alice");
}

#[tokio::test]
async fn a_click_or_a_modal_from_another_workspace_or_app_is_refused_and_decides_nothing() {
    let (app, slack) = app_with_slack().await;
    let (run_id, posted, approve) = posted_run(&app, &slack).await;
    let from = |team: Option<&str>, app_id: Option<&str>, mut payload: Value| {
        let fields = payload.as_object_mut().unwrap();
        match team {
            Some(team) => fields["team"]["id"] = json!(team),
            None => drop(fields.remove("team")),
        }
        match app_id {
            Some(app_id) => fields["api_app_id"] = json!(app_id),
            None => drop(fields.remove("api_app_id")),
        }
        payload
    };
    // alice is a finance approver: signed by the app's secret, only the workspace or the app
    // is wrong.
    let alice_approves = click("U_ALICE", "approve", &approve);
    let reject = button(&posted.body, "reject");
    let alice_rejects = submit(
        "U_ALICE",
        "reject",
        &reject,
        &[("reason", "Photos show it intact.")],
    );
    for payload in [&alice_approves, &alice_rejects] {
        for (team, app_id) in [
            (Some("T0OTHER"), Some(APP_ID)),
            (None, Some(APP_ID)),
            (Some(TEAM_ID), Some("A0OTHER")),
            (Some(TEAM_ID), None),
        ] {
            let (status, body) = interact(&app, &from(team, app_id, payload.clone())).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{team:?} {app_id:?}: {body}");
        }
    }
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "awaiting_approval");
    assert!(run["pending"][0]["decision"].is_null());
    for method in ["chat.update", "chat.postEphemeral", "views.open"] {
        assert!(slack.calls(method).is_empty(), "{method} was called");
    }

    // The same click from the configured workspace and app decides.
    let (status, _) = interact(&app, &alice_approves).await;
    assert_eq!(status, StatusCode::OK);
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
}

#[tokio::test]
async fn forged_stale_and_unmapped_clicks_change_nothing() {
    let (app, slack) = app_with_slack().await;
    let (run_id, _, approve) = posted_run(&app, &slack).await;
    let now = chrono::Utc::now().timestamp();

    let (status, _) = post_signed(
        &app,
        &click("U_ALICE", "approve", &approve),
        now,
        "wrong-secret",
    )
    .await;
    assert_eq!(status, 401);
    let (status, _) = post_signed(
        &app,
        &click("U_ALICE", "approve", &approve),
        now - 600,
        SIGNING_SECRET,
    )
    .await;
    assert_eq!(status, 401);
    let (status, _) = interact(&app, &click("U_STRANGER", "approve", &approve)).await;
    assert_eq!(status, 200);
    let told = wait_for("an ephemeral answer", PATIENCE, || async {
        slack.calls("chat.postEphemeral").pop()
    })
    .await;
    assert_eq!(told.body["user"], "U_STRANGER");
    assert!(
        told.body["text"]
            .as_str()
            .unwrap()
            .contains("not an approver")
    );
    // Carol is a person, but not in finance: refused, and told why.
    let (status, _) = interact(&app, &click("U_CAROL", "approve", &approve)).await;
    assert_eq!(status, 200);
    let told = wait_for("a second ephemeral answer", PATIENCE, || async {
        let calls = slack.calls("chat.postEphemeral");
        (calls.len() == 2).then(|| calls[1].clone())
    })
    .await;
    assert!(
        told.body["text"]
            .as_str()
            .unwrap()
            .contains("not among the approvers")
    );

    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "awaiting_approval");
    assert!(run["pending"][0]["decision"].is_null());
    assert!(slack.calls("chat.update").is_empty());
}

#[tokio::test]
async fn the_reject_modal_needs_a_reason_and_its_submission_rejects() {
    let (app, slack) = app_with_slack().await;
    let (run_id, posted, _) = posted_run(&app, &slack).await;
    let reject = button(&posted.body, "reject");
    let (status, _) = interact(&app, &click("U_BOB", "reject", &reject)).await;
    assert_eq!(status, 200);
    let opened = slack
        .calls("views.open")
        .pop()
        .expect("a modal opened at once");
    assert_eq!(opened.body["trigger_id"], "12345.98765.abcd");
    let view = &opened.body["view"];
    assert_eq!(view["callback_id"], "reject");
    let meta = view["private_metadata"].as_str().unwrap();

    let (status, body) = interact(&app, &submit("U_BOB", "reject", meta, &[("reason", " ")])).await;
    assert_eq!(status, 200);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["response_action"], "errors");
    assert!(
        body["errors"]["reason"]
            .as_str()
            .unwrap()
            .contains("needs a reason")
    );

    let (status, body) = interact(
        &app,
        &submit(
            "U_BOB",
            "reject",
            meta,
            &[("reason", "Photos show it intact.")],
        ),
    )
    .await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
    app.wait_status(&run_id, "completed").await;
    assert!(app.tools.refunds().is_empty());
    let text = all_text(&wait_update(&slack).await.body);
    assert!(text.contains("Rejected by bob"), "{text}");
}

#[tokio::test]
async fn the_edit_modal_shows_errors_then_the_change_and_only_its_confirmation_runs_the_edit() {
    let (app, slack) = app_with_slack().await;
    let (run_id, posted, _) = posted_run(&app, &slack).await;
    let edit = button(&posted.body, "edit");
    interact(&app, &click("U_ALICE", "edit", &edit)).await;
    let opened = slack.calls("views.open").pop().expect("the edit modal");
    let view = &opened.body["view"];
    assert_eq!(view["callback_id"], "edit");
    let initial = view["blocks"][0]["element"]["initial_value"]
        .as_str()
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(initial).unwrap()["amount"],
        129
    );
    let meta = view["private_metadata"].as_str().unwrap();

    let bad = r#"{"order_id": "A-1001", "amount": "forty", "reason": "lid"}"#;
    let (_, body) = interact(
        &app,
        &submit(
            "U_ALICE",
            "edit",
            meta,
            &[("input", bad), ("note", "Only the lid.")],
        ),
    )
    .await;
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["response_action"], "errors");
    assert!(
        body["errors"]["input"]
            .as_str()
            .unwrap()
            .contains("amount: must be a number"),
        "{body}"
    );
    let misspelt = r#"{"order_id": "A-1001", "amount": 129, "amout": 50, "reason": "lid"}"#;
    let (_, body) = interact(
        &app,
        &submit(
            "U_ALICE",
            "edit",
            meta,
            &[("input", misspelt), ("note", "typo")],
        ),
    )
    .await;
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["response_action"], "errors", "{body}");
    assert!(
        body["errors"]["input"].as_str().unwrap().contains(
            "amout: is not a field of issue_refund (its fields: amount, order_id, reason)"
        ),
        "{body}"
    );
    assert_eq!(app.get_run_status(&run_id).await, "awaiting_approval");
    let (_, body) = interact(
        &app,
        &submit(
            "U_ALICE",
            "edit",
            meta,
            &[("input", "{not json"), ("note", "n")],
        ),
    )
    .await;
    assert!(body.contains("not valid JSON"), "{body}");

    // A valid edit records nothing yet: it pushes a view that shows the change.
    let mut good: Value = serde_json::from_str(initial).unwrap();
    good["amount"] = json!(50);
    let (status, body) = interact(
        &app,
        &submit(
            "U_ALICE",
            "edit",
            meta,
            &[("input", &good.to_string()), ("note", "Only the lid.")],
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let pushed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(pushed["response_action"], "push", "{pushed}");
    let confirmation = &pushed["view"];
    assert_eq!(confirmation["callback_id"], "confirm_edit");
    let shown = all_text(confirmation);
    assert!(
        shown.contains("amount: 129 → 50") && shown.contains("Only the lid."),
        "{shown}"
    );
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "awaiting_approval");
    assert!(run["pending"][0]["decision"].is_null(), "{run}");

    // Its submission records the edit as shown, and closes the modal.
    let carried = confirmation["private_metadata"].as_str().unwrap();
    let (status, body) = interact(&app, &submit("U_ALICE", "confirm_edit", carried, &[])).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["response_action"],
        "clear"
    );
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
    assert_eq!(app.tools.refunds()[0]["amount"], 50);
    assert!(all_text(&wait_update(&slack).await.body).contains("Approved with edits by alice"));

    // Slack retrying the confirmation records nothing more; another reviewer confirming the
    // same edit now records nothing, and the confirmation says why.
    let (_, body) = interact(&app, &submit("U_ALICE", "confirm_edit", carried, &[])).await;
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["response_action"],
        "clear"
    );
    let (_, body) = interact(&app, &submit("U_BOB", "confirm_edit", carried, &[])).await;
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["response_action"], "update", "{body}");
    assert!(
        all_text(&body["view"]).contains("Nothing was recorded"),
        "{body}"
    );
    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    let decided: Vec<Value> = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["entry"].clone())
        .filter(|e| e["kind"] == "decided")
        .collect();
    assert_eq!(decided.len(), 1, "{trail}");
    assert_eq!(
        (&decided[0]["actor"], &decided[0]["channel"]),
        (&json!("alice"), &json!("slack"))
    );
    assert_eq!(
        decided[0]["detail"]["changes"],
        json!([{"field": "amount", "before": 129, "after": 50}])
    );
    assert_eq!(app.tools.refunds().len(), 1);
}

#[tokio::test]
async fn an_edit_too_long_for_slack_to_carry_to_its_confirmation_is_recorded_at_once() {
    let (app, slack) = app_with_slack().await;
    let (run_id, posted, _) = posted_run(&app, &slack).await;
    interact(
        &app,
        &click("U_ALICE", "edit", &button(&posted.body, "edit")),
    )
    .await;
    let opened = slack.calls("views.open").pop().expect("the edit modal");
    let meta = opened.body["view"]["private_metadata"].as_str().unwrap();
    // Each fits its own text field, but not both in one view's 3,000 characters of metadata.
    let input = r#"{"order_id": "A-1001", "amount": 50, "reason": "arrived broken"}"#;
    let note = "n".repeat(2950);
    let (status, body) = interact(
        &app,
        &submit(
            "U_ALICE",
            "edit",
            meta,
            &[("input", input), ("note", &note)],
        ),
    )
    .await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds()[0]["amount"], 50);
}

#[tokio::test]
async fn slack_and_the_api_racing_on_one_call_record_exactly_one_decision_and_slack_shows_it() {
    let (app, slack) = app_with_slack().await;
    let (run_id, posted, approve) = posted_run(&app, &slack).await;
    let digest: Value = serde_json::from_str::<Value>(&approve).unwrap()["d"].clone();
    let reject =
        json!([{"call_id": "toolu_2", "digest": digest, "action": "reject", "reason": "no"}]);
    let path = format!("/v1/runs/{run_id}/decisions");
    let api_decision = app.request(
        reqwest::Method::POST,
        &path,
        Some(countersign_tests::app::INTEGRATION_KEY),
        Some(json!({"decided_by": "bob", "decisions": reject})),
    );
    let click = click("U_ALICE", "approve", &approve);
    let slack_decision = interact(&app, &click);
    let ((api_status, _), (slack_status, _)) = tokio::join!(api_decision, slack_decision);
    assert_eq!(slack_status, 200);
    app.wait_status(&run_id, "completed").await;

    let (_, run) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    let decided: Vec<&Value> = run["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["entry"]["kind"] == "decided")
        .collect();
    assert_eq!(decided.len(), 1, "exactly one decision is recorded");
    let winner = decided[0]["entry"]["actor"].as_str().unwrap();
    let update = all_text(&wait_update(&slack).await.body);
    if winner == "alice" {
        assert_eq!(app.tools.refunds().len(), 1);
        assert_eq!(api_status, 409);
        assert!(update.contains("Approved by alice"), "{update}");
    } else {
        assert!(app.tools.refunds().is_empty());
        assert_eq!(api_status, 200);
        assert!(update.contains("Rejected by bob"), "{update}");
        assert_eq!(
            slack.calls("chat.postEphemeral").len(),
            1,
            "alice is told she lost"
        );
    }
    assert_eq!(posted.body["channel"], "#refunds");
}

/// Slack markup an agent, or whoever wrote what its tools read, might slip in.
const MARKUP: &str = "<!channel> <@U123> <https://evil.example|x> ```";

/// Every string in `value` that Slack would parse as markup, with where it is: everything but
/// the `text` of rich text `text` elements, which Slack shows as it is.
fn parsed_strings(value: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match value {
        Value::String(s) => out.push((at.to_string(), s.clone())),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                parsed_strings(item, &format!("{at}/{i}"), out);
            }
        }
        Value::Object(fields) => {
            let literal = fields.get("type").and_then(Value::as_str) == Some("text");
            for (key, field) in fields {
                if !(literal && key == "text") {
                    parsed_strings(field, &format!("{at}/{key}"), out);
                }
            }
        }
        _ => {}
    }
}

/// The `text` of every section, context element and rich text element of a message.
fn block_texts(message: &Value) -> Vec<String> {
    let mut texts = Vec::new();
    fn walk(value: &Value, texts: &mut Vec<String>) {
        match value {
            Value::Array(items) => items.iter().for_each(|i| walk(i, texts)),
            Value::Object(fields) => {
                if let Some(Value::String(text)) = fields.get("text") {
                    texts.push(text.clone());
                }
                fields.values().for_each(|v| walk(v, texts));
            }
            _ => {}
        }
    }
    walk(&message["blocks"], &mut texts);
    texts
}

#[tokio::test]
async fn markup_in_tool_results_and_the_agents_words_is_posted_inert() {
    let brain = |request: &Value| match turn(request) {
        0 => anthropic_tool_use(
            &format!("The order arrived broken {MARKUP}; I will refund it."),
            &[
                ("toolu_1", "get_order", json!({"order_id": MARKUP})),
                (
                    "toolu_2",
                    "issue_refund",
                    json!({"order_id": format!("A-1001 {MARKUP}"), "amount": 129, "reason": "broken"}),
                ),
            ],
        ),
        _ => anthropic_text("All done."),
    };
    let (app, slack) = app_with(FakeSlack::start().await, POLICY, |_| {}, brain).await;
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    let posted = wait_for("the Slack message", PATIENCE, || async {
        slack.accepted("chat.postMessage").pop()
    })
    .await;

    let mut parsed = Vec::new();
    parsed_strings(&posted.body, "", &mut parsed);
    for (at, text) in &parsed {
        for raw in ["<!channel>", "<@U123>", "<https://evil.example"] {
            assert!(!text.contains(raw), "{raw} is markup at {at}: {text}");
        }
    }
    let summary = posted.body["blocks"][0]["text"]["text"].as_str().unwrap();
    assert!(
        summary.contains("A-1001 &lt;!channel&gt; &lt;@U123&gt; &lt;https://evil.example|x&gt;"),
        "the summary, escaped: {summary}"
    );
    let risk = posted.body["blocks"][2]["text"]["text"].as_str().unwrap();
    assert_eq!(risk, "*Risk:* costly: it spends money");
    let words = posted.body["blocks"][3]["text"]["text"].as_str().unwrap();
    assert!(words.contains("broken &lt;!channel&gt;"), "{words}");
    assert!(
        posted.body["text"]
            .as_str()
            .unwrap()
            .contains("&lt;!channel&gt;"),
        "the notification text, escaped: {}",
        posted.body["text"]
    );
    // The lookup failed and its answer quotes the id: shown whole, fence and all, as
    // preformatted rich text, which Slack does not parse.
    let evidence = posted.body["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "rich_text")
        .expect("the evidence, as rich text");
    let result = &evidence["elements"][1];
    assert_eq!(result["type"], "rich_text_preformatted");
    let content = result["elements"][0]["text"].as_str().unwrap();
    assert!(content.contains(MARKUP), "{content}");
    assert_eq!(result["elements"][0]["type"], "text");
}

#[tokio::test]
async fn sixty_tool_results_and_a_ten_thousand_character_argument_fit_in_one_message() {
    let long_id = format!("A-{}", "9".repeat(10_000));
    let refund_id = long_id.clone();
    let brain = move |request: &Value| match turn(request) {
        0 => {
            let mut calls: Vec<(String, &str, Value)> = (0..60)
                .map(|i| {
                    (
                        format!("toolu_g{i}"),
                        "get_order",
                        json!({"order_id": "A-1001"}),
                    )
                })
                .collect();
            calls.push((
                "toolu_2".into(),
                "issue_refund",
                json!({"order_id": refund_id, "amount": 129, "reason": "arrived broken"}),
            ));
            let calls: Vec<(&str, &str, Value)> = calls
                .iter()
                .map(|(id, name, input)| (id.as_str(), *name, input.clone()))
                .collect();
            anthropic_tool_use("Checking it many times.", &calls)
        }
        _ => anthropic_text("All done."),
    };
    let (app, slack) = app_with(FakeSlack::start().await, POLICY, |_| {}, brain).await;
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    let posted = wait_for("the Slack message", PATIENCE, || async {
        slack.accepted("chat.postMessage").pop()
    })
    .await;
    assert!(
        slack.calls("chat.postMessage").len() == 1,
        "posted at the first try, nothing refused"
    );

    let blocks = posted.body["blocks"].as_array().unwrap();
    assert!(blocks.len() <= 50, "{} blocks", blocks.len());
    for block in blocks.iter().filter(|b| b["type"] == "section") {
        let text = block["text"]["text"].as_str().unwrap();
        assert!(text.chars().count() <= 3000, "{}", text.chars().count());
    }
    let total: usize = block_texts(&posted.body)
        .iter()
        .map(|t| t.chars().count())
        .sum();
    assert!(
        total < 12_000,
        "{total} characters of block text, over what Slack takes in one message"
    );
    let summary = blocks[0]["text"]["text"].as_str().unwrap();
    assert!(
        summary.contains("A-9999") && summary.ends_with('…'),
        "{summary}"
    );
    let shown = blocks.iter().filter(|b| b["type"] == "rich_text").count();
    assert!((1..60).contains(&shown), "{shown} results shown");
    let all = all_text(&posted.body);
    assert!(
        all.contains(&format!("and {} more: see the run `{run_id}`", 60 - shown)),
        "{all}"
    );
    assert!(posted.body["text"].as_str().unwrap().chars().count() <= 4000);

    // The arguments are longer than a Slack text field holds: the edit modal says to use the
    // API instead of offering a field that would cut them.
    let edit = button(&posted.body, "edit");
    let (status, _) = interact(&app, &click("U_ALICE", "edit", &edit)).await;
    assert_eq!(status, 200);
    let opened = slack.calls("views.open").pop().expect("a modal");
    let view = &opened.body["view"];
    assert_eq!(view["callback_id"], "edit_by_api");
    assert!(view.get("submit").is_none(), "nothing to submit: {view}");
    let text = view.to_string();
    assert!(!text.contains("plain_text_input"), "{text}");
    assert!(
        text.contains(&format!("/v1/runs/{run_id}/decisions")) && text.contains("toolu_2"),
        "{text}"
    );
    let title = view["title"]["text"].as_str().unwrap();
    assert!(title.chars().count() <= 24, "Slack's limit for a title");
}

#[tokio::test]
async fn a_request_slack_refuses_is_posted_in_short_with_buttons_that_still_decide() {
    let slack = FakeSlack::start().await;
    slack.refuse_next("chat.postMessage", "invalid_blocks");
    let (app, slack) = app_with(slack, POLICY, |_| {}, refund_brain).await;
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    let posted = wait_for("the short Slack message", PATIENCE, || async {
        slack.accepted("chat.postMessage").pop()
    })
    .await;
    let attempts = slack.calls("chat.postMessage");
    assert_eq!(attempts.len(), 2, "the full message, then the short one");
    assert_eq!(attempts[0].refused.as_deref(), Some("invalid_blocks"));
    assert!(all_text(&attempts[0].body).contains("Evidence"));

    let text = all_text(&posted.body);
    assert!(text.contains("Refund $129 for order A-1001"), "{text}");
    assert!(text.contains(&run_id), "{text}");
    assert!(!text.contains("Evidence"), "in short: {text}");
    let approve = button(&posted.body, "approve");
    let (status, _) = interact(&app, &click("U_ALICE", "approve", &approve)).await;
    assert_eq!(status, 200);
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
    let update = wait_update(&slack).await;
    assert_eq!(update.body["ts"], posted_ts(&slack));
    assert!(all_text(&update.body).contains("Approved by alice"));
}

/// The `ts` Slack gave the message it took.
fn posted_ts(slack: &FakeSlack) -> String {
    let calls = slack.calls("chat.postMessage");
    let index = calls.iter().position(|c| c.refused.is_none()).unwrap();
    format!("1700000000.{:06}", index + 1)
}

#[tokio::test]
async fn the_context_line_gives_the_deadline_for_each_reader_to_see_in_their_own_time_zone() {
    let (app, slack) = app_with_slack().await;
    let (run_id, posted, _) = posted_run(&app, &slack).await;
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    let deadline = run["pending"][0]["deadline"].as_i64().expect("a deadline");
    let context = posted.body["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "context")
        .unwrap()["elements"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let token = format!(
        "<!date^{}^{{date_short_pretty}} at {{time}}|",
        deadline / 1000
    );
    assert!(context.contains(&token), "{context}");
    assert!(context.contains("decide by"), "{context}");
    assert!(!context.contains("no deadline"), "{context}");
}

#[tokio::test]
async fn a_rate_limited_request_is_posted_after_the_wait_slack_asks_for() {
    let slack = FakeSlack::start().await;
    slack.rate_limit_next("chat.postMessage", 2);
    // The queue's own backoff would take ten minutes: only Retry-After can explain a post
    // within the test's patience.
    let slow_backoff = |config: &mut approval_gateway::config::Config| {
        config.delivery_retry_base_ms = 600_000;
    };
    let (app, slack) = app_with(slack, POLICY, slow_backoff, refund_brain).await;
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    let posted = wait_for("the Slack message", PATIENCE, || async {
        slack.accepted("chat.postMessage").pop()
    })
    .await;
    let attempts = slack.calls("chat.postMessage");
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0].refused.as_deref(), Some("ratelimited"));
    let waited = posted.at - attempts[0].at;
    assert!(
        waited >= std::time::Duration::from_secs(2),
        "waited {waited:?}"
    );
}

#[tokio::test]
async fn an_escalated_call_that_expires_says_so_in_its_message() {
    let policy = "approvers = [\"alice\"]\ntimeout = \"1s\"\non_expiry = \"escalate\"\nescalate_to = [\"bob\"]\nchannels = [\"slack:#refunds\"]\n";
    let (app, slack) = app_with(FakeSlack::start().await, policy, |_| {}, refund_brain).await;
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "completed").await;
    let update = wait_update(&slack).await;
    let text = all_text(&update.body);
    assert!(
        text.contains("Expired: nobody decided by <!date^"),
        "{text}"
    );
    assert!(text.contains("escalated"), "{text}");
    assert!(!text.contains("\"actions\""), "no buttons: {text}");
    let reply = slack
        .accepted("chat.postMessage")
        .into_iter()
        .find(|c| c.body.get("thread_ts").is_some())
        .expect("the escalation, in the thread");
    let reply = reply.body["text"].as_str().unwrap();
    assert!(
        reply.contains("<@U_BOB>") && reply.contains("<!date^"),
        "{reply}"
    );
}

/// The "Approve + allow similar" presets of a posted request: (action id, label, value).
fn presets(message: &Value) -> Vec<(String, String, String)> {
    let blocks = message["blocks"].as_array().unwrap();
    blocks
        .iter()
        .filter(|b| b["block_id"] == "approve_grant")
        .flat_map(|b| b["elements"].as_array().unwrap().clone())
        .map(|e| {
            let text = |v: &Value| v.as_str().unwrap().to_string();
            (
                text(&e["action_id"]),
                text(&e["text"]["text"]),
                text(&e["value"]),
            )
        })
        .collect()
}

/// The ephemeral answers Slack users were given, in order.
async fn ephemeral_texts(slack: &FakeSlack, count: usize) -> Vec<String> {
    wait_for(&format!("{count} ephemeral answers"), PATIENCE, || async {
        let calls = slack.calls("chat.postEphemeral");
        (calls.len() >= count).then(|| {
            calls
                .iter()
                .map(|c| c.body["text"].as_str().unwrap().to_string())
                .collect()
        })
    })
    .await
}

#[tokio::test]
async fn a_call_decided_under_a_grant_is_posted_once_naming_the_grant_and_its_maker() {
    let (app, slack) = app_with_slack().await;
    let (first, _, approve) = posted_run(&app, &slack).await;
    let digest = serde_json::from_str::<Value>(&approve).unwrap()["d"].clone();
    let (status, made) = app
        .request(
            reqwest::Method::POST,
            "/v1/grants",
            Some(INTEGRATION_KEY),
            Some(
                json!({"run_id": first, "call_id": "toolu_2", "digest": digest,
                "condition": "input.amount <= 200.0", "max_uses": 5, "expires_in": "1h",
                "decided_by": "alice"}),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let id = made["grant"]["id"].as_str().unwrap().to_string();
    app.wait_status(&first, "completed").await;
    // The approval's message says what grant it made.
    let update = all_text(&wait_update(&slack).await.body);
    assert!(
        update.contains("Approved by alice")
            && update.contains(&format!("Grant `{id}` made"))
            && update
                .contains("up to 5 more `issue_refund` calls where `input.amount &lt;= 200.0`"),
        "{update}"
    );

    // A later call it covers was shown to nobody: once decided, it is posted, decided.
    let covered = app.start_run("Refund A-1001.").await;
    app.wait_status(&covered, "completed").await;
    let naming = || {
        slack
            .accepted("chat.postMessage")
            .into_iter()
            .filter(|c| all_text(&c.body).contains(&format!("under grant {id}")))
            .collect::<Vec<_>>()
    };
    let posted = wait_for("the granted call's message", PATIENCE, || async {
        naming().pop()
    })
    .await;
    let text = all_text(&posted.body);
    assert!(
        text.contains(&format!(
            "Approved under grant {id} (made by alice) at <!date^"
        )),
        "{text}"
    );
    assert!(text.contains("Refund $129 for order A-1001"), "{text}");
    assert!(!text.contains("\"actions\""), "nothing to decide: {text}");
    assert_eq!(posted.body["channel"], "#refunds");
    assert_eq!(naming().len(), 1, "posted once");
    assert!(
        slack
            .calls("chat.update")
            .iter()
            .all(|u| !all_text(&u.body).contains("under grant")),
        "nothing was waiting to be updated"
    );
}

#[tokio::test]
async fn an_approve_and_allow_similar_preset_makes_a_grant_only_for_someone_who_may_approve() {
    let (app, slack) = app_with_slack().await;
    let (first, posted, approve) = posted_run(&app, &slack).await;
    let offered = presets(&posted.body);
    let labels: Vec<&str> = offered.iter().map(|(_, l, _)| l.as_str()).collect();
    assert_eq!(labels, ["10 more for 1h", "50 more for 8h"]);
    let context = all_text(&posted.body);
    assert!(
        context.contains("Approve + allow similar")
            && context
                .contains("input.amount &lt;= 129.0 &amp;&amp; input.order_id == \\\"A-1001\\\""),
        "{context}"
    );
    let (action, _, value) = &offered[0];

    // carol is a person, but not in finance: the preset is refused as Approve is, and no
    // grant is made.
    interact(&app, &click("U_CAROL", "approve", &approve)).await;
    interact(&app, &click("U_CAROL", action, value)).await;
    let told = ephemeral_texts(&slack, 2).await;
    assert!(told[0].contains("not among the approvers"), "{told:?}");
    assert_eq!(told[0], told[1], "the same refusal");
    let (_, grants) = app.get("/v1/grants").await;
    assert_eq!(grants["grants"], json!([]), "{grants}");
    assert_eq!(app.get_run_status(&first).await, "awaiting_approval");

    let (status, _) = interact(&app, &click("U_ALICE", action, value)).await;
    assert_eq!(status, 200);
    app.wait_status(&first, "completed").await;
    let (_, grants) = app.get("/v1/grants").await;
    let grant = &grants["grants"][0];
    assert_eq!(grant["granted_by"], json!(["alice"]), "{grants}");
    assert_eq!(grant["channel"], "slack");
    assert_eq!(grant["max_uses"], 10);
    assert_eq!(
        grant["requester"],
        Value::Null,
        "not limited to the requester"
    );
    assert_eq!(
        grant["condition"],
        r#"input.amount <= 129.0 && input.order_id == "A-1001""#
    );
    let hour = grant["expires_at"].as_i64().unwrap() - grant["created_at"].as_i64().unwrap();
    assert_eq!(hour, 3_600_000);
    let id = grant["id"].as_str().unwrap().to_string();
    let update = all_text(&wait_update(&slack).await.body);
    assert!(
        update.contains("Approved by alice") && update.contains(&format!("Grant `{id}` made")),
        "{update}"
    );

    let covered = app.start_run("Refund A-1001.").await;
    app.wait_status(&covered, "completed").await;
    let (_, used) = app.get(&format!("/v1/grants/{id}")).await;
    assert_eq!(used["uses"], 1, "{used}");
    assert_eq!(used["used_by"][0]["run_id"], json!(covered), "{used}");
    assert_eq!(app.tools.refunds().len(), 2);
}

#[tokio::test]
async fn a_call_whose_policy_changed_while_it_waited_is_closed_in_slack_and_asked_about_again() {
    let (app, slack) = app_with_slack().await;
    let (run_id, _, _) = posted_run(&app, &slack).await;
    app.rewrite_agent(|agent| agent.replace(POLICY, &format!("{POLICY}quorum = 2\n")));
    // The first message says why it can no longer be decided; the call held again under the
    // new terms is posted anew, asking for two approvals.
    let closed = wait_for("the message to be closed", PATIENCE, || async {
        slack
            .calls("chat.update")
            .into_iter()
            .find(|u| all_text(&u.body).contains("policy changed"))
    })
    .await;
    assert!(
        !all_text(&closed.body).contains("Rejected"),
        "{}",
        closed.body
    );
    let again = wait_for("the call to be posted again", PATIENCE, || async {
        let posted = slack.calls("chat.postMessage");
        (posted.len() == 2).then(|| posted[1].clone())
    })
    .await;
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["pending"][0]["call_id"], "toolu_2.r2");
    assert_eq!(run["pending"][0]["quorum"], 2);
    assert!(
        button(&again.body, "approve").contains("toolu_2.r2"),
        "{}",
        again.body
    );
}
