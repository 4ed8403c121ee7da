//! Standing grants from the web inbox, as a browser with JavaScript off uses it: the request
//! page's "Approve and allow similar" form approves the call and makes a grant that later
//! runs are approved under; the grants page lists grants and revokes them. Both go through
//! the same session, CSRF and same-origin checks as every inbox form, and terms the policy
//! or the condition refuses come back beside the form with nothing recorded.

use super::grants::{decision_actor, grant_state, held, refund_asked, start};
use super::inbox::{ALICE_KEY, Browser, FROM_ELSEWHERE, Page, RICK_KEY, add_keys, assert_shows};
use countersign_tests::app::{INTEGRATION_KEY, REVIEWER_KEY, TestApp};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A condition covering the refunds of the runs below, narrower than "every refund".
const COVERS: &str = r#"input.amount <= 50.0 && input.order_id.startsWith("A-")"#;

fn request_path(run: &str) -> String {
    format!("/inbox/runs/{run}/calls/toolu_2")
}

/// Text of the page as HTML escapes it, read back.
fn unescaped(html: &str) -> String {
    html.replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// The content of the page's `<textarea … id="ID" …>`.
fn textarea(page: &Page, id: &str) -> String {
    let id = format!(" id=\"{id}\"");
    let start = page
        .html
        .match_indices("<textarea")
        .map(|(at, _)| at)
        .find(|at| page.html[*at..].split('>').next().unwrap().contains(&id))
        .unwrap_or_else(|| panic!("no textarea{id} in\n{}", page.html));
    let start = start + page.html[start..].find('>').unwrap() + 1;
    let len = page.html[start..].find("</textarea>").unwrap();
    unescaped(&page.html[start..start + len])
}

/// The value of the page's `data-NAME="…"` attribute, first found.
fn data(page: &Page, name: &str) -> String {
    let marker = format!("data-{name}=\"");
    let start = page.html.find(&marker).unwrap_or_else(|| {
        panic!("no data-{name} in\n{}", page.html);
    }) + marker.len();
    let len = page.html[start..].find('"').unwrap();
    page.html[start..start + len].to_string()
}

/// A reviewer's browser on the request page of `run`'s held refund.
struct OnRequest {
    browser: Browser,
    path: String,
    page: Page,
}

impl OnRequest {
    async fn open(app: &TestApp, key: &str, run: &str) -> Self {
        held(app, run).await;
        let browser = Browser::signed_in(app, key).await;
        let path = request_path(run);
        let page = browser.get(&path).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.html);
        Self {
            browser,
            path,
            page,
        }
    }

    /// Sends the "Approve and allow similar" form with `terms` (its fields), the page's CSRF
    /// token and digest, from the gateway's own page (`origin`) or with `headers` of another.
    async fn allow(&self, terms: &[(&str, &str)], headers: &[(&str, &str)]) -> Page {
        let (csrf, digest) = (self.page.input("csrf"), self.page.input("digest"));
        let mut fields = vec![
            ("csrf", csrf.as_str()),
            ("digest", digest.as_str()),
            ("action", "allow"),
        ];
        fields.extend_from_slice(terms);
        self.browser.post_with(&self.path, &fields, headers).await
    }
}

fn terms(condition: &str, max_uses: &'static str) -> Vec<(&'static str, String)> {
    vec![
        ("condition", condition.to_string()),
        ("max_uses", max_uses.to_string()),
        ("expires_in", "1h".to_string()),
    ]
}

fn fields<'a>(terms: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    terms.iter().map(|(n, v)| (*n, v.as_str())).collect()
}

async fn no_grants(app: &TestApp) {
    let (_, grants) = app.get("/v1/grants").await;
    assert_eq!(grants["grants"], json!([]), "{grants}");
}

/// The decision recorded on `run`'s refund, if any.
async fn decision(app: &TestApp, run: &str) -> Value {
    let (_, r) = app.get(&format!("/v1/runs/{run}")).await;
    r["pending"][0]["decision"].clone()
}

#[tokio::test]
async fn a_grant_made_from_the_request_page_approves_a_later_covered_run_in_the_reviewers_name() {
    let app = TestApp::spawn(refund_asked).await;
    let first = start(&app, 30, "A-1", None).await;
    let rita = OnRequest::open(&app, REVIEWER_KEY, &first).await;
    // Offered, prefilled to cover this call, within the policy's caps.
    assert_shows(&rita.page, &["href=\"#allow\"", "id=\"allow\""]);
    assert_eq!(
        textarea(&rita.page, "grant-condition"),
        r#"input.amount <= 30.0 && input.order_id == "A-1""#
    );
    assert_eq!(rita.page.input("max_uses"), "10");

    let own = [("origin", app.gateway_url.as_str())];
    let made = rita.allow(&fields(&terms(COVERS, "5")), &own).await;
    assert_eq!(made.status, StatusCode::OK, "{}", made.html);
    let id = data(&made, "grant");
    assert!(id.starts_with("grt_"), "{id}");
    assert_shows(
        &made,
        &[
            "Approved, and similar calls allowed",
            "0 of 5",
            "in the name of rita",
        ],
    );
    assert_shows(&made, &["href=\"/inbox/grants\""]);
    app.wait_status(&first, "completed").await;

    let covered = start(&app, 45, "A-2", None).await;
    app.wait_status(&covered, "completed").await;
    assert_eq!(
        decision_actor(&app, &covered).await,
        format!("rita, under grant {id}")
    );
    let state = grant_state(&app, &id).await;
    assert_eq!(
        (&state["channel"], &state["granted_by"], &state["uses"]),
        (&json!("web"), &json!(["rita"]), &json!(1)),
        "{state}"
    );

    // The grants page lists it, active, with its use, the call it was made on and a Revoke
    // button.
    let listed = rita.browser.get("/inbox/grants").await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.html);
    assert_shows(
        &listed,
        &[
            &format!("data-grant=\"{id}\" data-status=\"active\""),
            "1 of 5",
            &format!("/inbox/grants/{id}/revoke"),
            &request_path(&first),
        ],
    );
}

#[tokio::test]
async fn an_allow_similar_form_from_another_site_or_without_the_token_makes_nothing() {
    let app = TestApp::spawn(refund_asked).await;
    let run = start(&app, 30, "A-1", None).await;
    let rita = OnRequest::open(&app, REVIEWER_KEY, &run).await;
    let terms = terms(COVERS, "5");
    for header in FROM_ELSEWHERE {
        let refused = rita.allow(&fields(&terms), &[header]).await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{header:?}");
        assert_shows(&refused, &["nothing was changed"]);
    }
    let digest = rita.page.input("digest");
    let mut forged = fields(&terms);
    forged.push(("action", "allow"));
    forged.push(("digest", &digest));
    let refused = rita.browser.post(&rita.path, &forged).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.html);
    no_grants(&app).await;
    assert_eq!(decision(&app, &run).await, Value::Null);
    assert_eq!(app.get_run_status(&run).await, "awaiting_approval");
}

#[tokio::test]
async fn terms_the_condition_or_the_policy_refuses_come_back_beside_the_form_and_nothing_is_recorded()
 {
    let app = TestApp::builder(refund_asked)
        .policy("grant_max_uses = 20\ngrant_max_duration = \"8h\"\n")
        .start()
        .await;
    let run = start(&app, 30, "A-1", None).await;
    let rita = OnRequest::open(&app, REVIEWER_KEY, &run).await;
    // The durations offered keep within the policy's cap.
    assert_shows(&rita.page, &["value=\"8h\""]);
    assert!(
        !rita.page.html.contains("value=\"24h\""),
        "{}",
        rita.page.html
    );

    let mut over_time = terms(COVERS, "5");
    over_time[2].1 = "7d".into();
    let cases = [
        (
            terms("input.amount <=", "5"),
            StatusCode::BAD_REQUEST,
            "is not CEL",
        ),
        (
            terms("input.amount <= 10.0", "5"),
            StatusCode::BAD_REQUEST,
            "does not cover",
        ),
        (
            terms(COVERS, "21"),
            StatusCode::FORBIDDEN,
            "max_uses must be 1 to 20",
        ),
        (
            over_time,
            StatusCode::FORBIDDEN,
            "expires_in may be at most",
        ),
    ];
    for (terms, status, says) in cases {
        let page = rita.allow(&fields(&terms), &[]).await;
        assert_eq!(page.status, status, "{says}: {}", page.html);
        assert_shows(&page, &["id=\"allow\"", "role=\"alert\"", says]);
        // What was typed is kept.
        assert_eq!(textarea(&page, "grant-condition"), terms[0].1, "{says}");
    }
    // What cannot be read as terms is said beside its field.
    let page = rita.allow(&fields(&terms(COVERS, "many")), &[]).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST, "{}", page.html);
    assert_shows(
        &page,
        &[
            "id=\"grant-max-uses-error\"",
            "aria-invalid=\"true\"",
            "as a whole number",
        ],
    );
    no_grants(&app).await;
    assert_eq!(decision(&app, &run).await, Value::Null);
    assert_eq!(app.get_run_status(&run).await, "awaiting_approval");
}

#[tokio::test]
async fn a_tool_without_grants_offers_no_form_and_refuses_one_sent_by_hand() {
    let app = TestApp::builder(refund_asked)
        .policy("grants = false\n")
        .start()
        .await;
    let run = start(&app, 30, "A-1", None).await;
    let rita = OnRequest::open(&app, REVIEWER_KEY, &run).await;
    assert!(
        !rita.page.html.contains("id=\"allow\""),
        "{}",
        rita.page.html
    );
    let page = rita.allow(&fields(&terms(COVERS, "5")), &[]).await;
    assert_eq!(page.status, StatusCode::FORBIDDEN, "{}", page.html);
    assert_shows(&page, &["no grant was made", "grants = false"]);
    no_grants(&app).await;
    assert_eq!(decision(&app, &run).await, Value::Null);
}

#[tokio::test]
async fn revoking_from_the_grants_page_leaves_the_next_covered_run_waiting_for_a_person() {
    // Only rita decides refunds: ops-bot, a reviewer too, neither sees nor revokes her grant.
    let app = TestApp::builder(refund_asked)
        .policy("approvers = [\"rita\"]\n")
        .start()
        .await;
    let first = start(&app, 30, "A-1", None).await;
    let rita = OnRequest::open(&app, REVIEWER_KEY, &first).await;
    let made = rita.allow(&fields(&terms(COVERS, "5")), &[]).await;
    assert_eq!(made.status, StatusCode::OK, "{}", made.html);
    let id = data(&made, "grant");
    let revoke = format!("/inbox/grants/{id}/revoke");

    let bot = Browser::signed_in(&app, INTEGRATION_KEY).await;
    let theirs = bot.get("/inbox/grants").await;
    assert_eq!(theirs.status, StatusCode::OK, "{}", theirs.html);
    assert!(!theirs.html.contains(&id), "{}", theirs.html);
    let csrf = theirs.input("csrf");
    let refused = bot.post(&revoke, &[("csrf", &csrf)]).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.html);

    let page = rita.browser.get("/inbox/grants").await;
    let csrf = page.input("csrf");
    let form = [("csrf", csrf.as_str()), ("reason", "Enough for today.")];
    for header in FROM_ELSEWHERE {
        let refused = rita.browser.post_with(&revoke, &form, &[header]).await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{header:?}");
    }
    let forged = rita.browser.post(&revoke, &form[1..]).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN, "{}", forged.html);
    assert_eq!(grant_state(&app, &id).await["status"], "active");

    let own = [("origin", app.gateway_url.as_str())];
    let done = rita.browser.post_with(&revoke, &form, &own).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.html);
    let back = rita.browser.get(done.location.as_deref().unwrap()).await;
    assert_shows(
        &back,
        &[
            "Revoked: ",
            &format!("data-grant=\"{id}\" data-status=\"revoked\""),
            "revoked by rita",
            "Enough for today.",
        ],
    );
    assert!(
        !back.html.contains(&revoke),
        "an ended grant has no Revoke button"
    );
    let state = grant_state(&app, &id).await;
    assert_eq!(state["revoked"]["by"], "rita", "{state}");
    assert_eq!(state["revoked"]["reason"], "Enough for today.", "{state}");

    // The next run it would have covered waits for a person, who decides it.
    let late = start(&app, 30, "A-2", None).await;
    let on_late = OnRequest::open(&app, REVIEWER_KEY, &late).await;
    let approved = on_late
        .browser
        .post(
            &on_late.path,
            &[
                ("csrf", &on_late.page.input("csrf")),
                ("digest", &on_late.page.input("digest")),
                ("action", "approve"),
            ],
        )
        .await;
    assert_eq!(approved.status, StatusCode::SEE_OTHER, "{}", approved.html);
    app.wait_status(&late, "completed").await;
    assert_eq!(decision_actor(&app, &late).await, "rita");
    assert_eq!(grant_state(&app, &id).await["uses"], 0);
}

#[tokio::test]
async fn on_a_call_that_needs_two_approvals_the_grant_waits_for_the_second_with_the_same_terms() {
    let app = TestApp::builder(refund_asked)
        .policy("approvers = [\"role:finance\"]\nquorum = 2\n")
        .gateway(add_keys)
        .start()
        .await;
    let first = start(&app, 30, "A-1", Some("carol")).await;
    let alice = OnRequest::open(&app, ALICE_KEY, &first).await;
    assert_shows(&alice.page, &["needs 2 approvals"]);
    // Both keep the form as proposed: the same terms.
    let proposed = |page: &Page| {
        vec![
            ("condition", textarea(page, "grant-condition")),
            ("max_uses", page.input("max_uses")),
            ("expires_in", "8h".to_string()),
        ]
    };
    let counted = alice.allow(&fields(&proposed(&alice.page)), &[]).await;
    assert_eq!(counted.status, StatusCode::OK, "{}", counted.html);
    assert_shows(
        &counted,
        &["Your approval is counted", "1 of 2", "same terms"],
    );
    no_grants(&app).await;

    let rick = OnRequest::open(&app, RICK_KEY, &first).await;
    let made = rick.allow(&fields(&proposed(&rick.page)), &[]).await;
    assert_eq!(made.status, StatusCode::OK, "{}", made.html);
    let id = data(&made, "grant");
    assert_shows(&made, &["in the name of alice, rick"]);
    app.wait_status(&first, "completed").await;

    let covered = start(&app, 25, "A-1", Some("carol")).await;
    app.wait_status(&covered, "completed").await;
    assert_eq!(
        decision_actor(&app, &covered).await,
        format!("alice, rick, under grant {id}")
    );
}
