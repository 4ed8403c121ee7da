//! The web inbox over HTTP, as a browser with cookies and JavaScript off uses it: signing in
//! (by key, or by a link mailed once), the queue each reviewer may decide, and a request page
//! whose forms decide through the same path as every channel, refusing what is forged,
//! stale, incomplete or outside the tool's schema without recording anything.

use super::email::app_with_email;
use approval_gateway::config::{ApiKey, Role};
use countersign_fake_model::refund_brain;
use countersign_tests::app::{PATIENCE, TestApp};
use countersign_tests::wait_for;
use reqwest::StatusCode;
use reqwest::header::{LOCATION, SET_COOKIE};
use serde_json::Value;

pub(super) const ALICE_KEY: &str = "inbox-alice-key-0123456789";
pub(super) const CAROL_KEY: &str = "inbox-carol-key-0123456789";
/// rick asks for the runs (the requester key is his); this key lets him review too.
pub(super) const RICK_KEY: &str = "inbox-rick-key-0123456789";

/// A refund app whose refunds only the finance people (alice, bob, rick) may decide, with
/// reviewer keys for alice, carol and rick.
async fn app() -> TestApp {
    TestApp::builder(refund_brain)
        .policy("approvers = [\"role:finance\"]\n")
        .gateway(add_keys)
        .start()
        .await
}

pub(super) fn add_keys(config: &mut approval_gateway::config::Config) {
    for (key, principal) in [
        (ALICE_KEY, "alice"),
        (CAROL_KEY, "carol"),
        (RICK_KEY, "rick"),
    ] {
        config.api_keys.push(ApiKey {
            key: key.into(),
            role: Role::Reviewer,
            principal: principal.into(),
            speaks_for: Vec::new(),
        });
    }
}

/// A browser: keeps cookies, follows no redirect (the tests look at each).
pub(super) struct Browser {
    http: reqwest::Client,
    /// The gateway it talks to (cookies go to any port of the host, as in a real browser).
    pub(super) base: String,
}

pub(super) struct Page {
    pub(super) status: StatusCode,
    pub(super) location: Option<String>,
    set_cookie: Option<String>,
    pub(super) html: String,
}

impl Page {
    /// The value of the first `name="NAME"` input of the page.
    pub(super) fn input(&self, name: &str) -> String {
        let marker = format!("name=\"{name}\" value=\"");
        let start = self.html.find(&marker).unwrap_or_else(|| {
            panic!("no input {name} in\n{}", self.html);
        }) + marker.len();
        let len = self.html[start..].find('"').unwrap();
        self.html[start..start + len].to_string()
    }
}

impl Browser {
    pub(super) fn new(app: &TestApp) -> Self {
        Self {
            http: reqwest::Client::builder()
                .cookie_store(true)
                .redirect(reqwest::redirect::Policy::none())
                .pool_idle_timeout(std::time::Duration::from_secs(2))
                .build()
                .unwrap(),
            base: app.gateway_url.clone(),
        }
    }

    async fn page(response: reqwest::Response) -> Page {
        let header = |name| {
            response
                .headers()
                .get(name)
                .map(|v: &reqwest::header::HeaderValue| v.to_str().unwrap().to_string())
        };
        let (location, set_cookie) = (header(LOCATION), header(SET_COOKIE));
        Page {
            status: response.status(),
            location,
            set_cookie,
            html: response.text().await.unwrap(),
        }
    }

    pub(super) async fn get(&self, path: &str) -> Page {
        let url = format!("{}{path}", self.base);
        Self::page(self.http.get(url).send().await.unwrap()).await
    }

    pub(super) async fn post(&self, path: &str, fields: &[(&str, &str)]) -> Page {
        self.post_with(path, fields, &[]).await
    }

    /// Posts a form with these headers too (`Origin`, say).
    pub(super) async fn post_with(
        &self,
        path: &str,
        fields: &[(&str, &str)],
        headers: &[(&str, &str)],
    ) -> Page {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(serde_urlencoded::to_string(fields).unwrap());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        Self::page(request.send().await.unwrap()).await
    }

    /// Sends a sign-in form (`path`: the key form, the mail form or a mailed link's button)
    /// as the sign-in page of this browser does: with its pre-session token.
    pub(super) async fn sign_in_form(&self, path: &str, fields: &[(&str, &str)]) -> Page {
        let token = self.get("/inbox/sign-in").await.input("csrf");
        let mut all = fields.to_vec();
        all.push(("csrf", &token));
        self.post(path, &all).await
    }

    /// Signs in with `key` and checks it worked.
    /// A GET with these headers too, its answer unread (a stream, say).
    pub(super) async fn open(&self, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut request = self.http.get(format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send().await.unwrap()
    }

    pub(super) async fn signed_in(app: &TestApp, key: &str) -> Self {
        let browser = Self::new(app);
        let page = browser
            .sign_in_form("/inbox/sign-in", &[("key", key)])
            .await;
        assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.html);
        browser
    }
}

/// A run of rick's, paused on its refund (`toolu_2`); its id.
async fn paused_run(app: &TestApp) -> String {
    let run_id = app.start_run("Refund A-1001, it arrived broken.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    run_id
}

/// A paused run, and alice signed in with its request page open.
struct Opened {
    app: TestApp,
    run_id: String,
    alice: Browser,
    path: String,
    page: Page,
}

async fn alice_opens_a_request() -> Opened {
    let app = app().await;
    let run_id = paused_run(&app).await;
    let alice = Browser::signed_in(&app, ALICE_KEY).await;
    let path = request_path(&run_id);
    let page = alice.get(&path).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.html);
    Opened {
        app,
        run_id,
        alice,
        path,
        page,
    }
}

impl Opened {
    /// Sends a form of the page: `fields`, with the page's CSRF token and digest unless
    /// `fields` name their own.
    async fn submit(&self, fields: &[(&str, &str)]) -> Page {
        self.submit_with(fields, &[]).await
    }

    /// `submit`, with these headers too.
    async fn submit_with(&self, fields: &[(&str, &str)], headers: &[(&str, &str)]) -> Page {
        let (csrf, digest) = (self.page.input("csrf"), self.page.input("digest"));
        let mut all = fields.to_vec();
        for (name, value) in [("csrf", csrf.as_str()), ("digest", digest.as_str())] {
            if !fields.iter().any(|(n, _)| *n == name) {
                all.push((name, value));
            }
        }
        self.alice.post_with(&self.path, &all, headers).await
    }

    async fn reload(&self) -> Page {
        self.alice.get(&self.path).await
    }

    /// Asserts that the refund is still undecided and the run still waits.
    async fn nothing_recorded(&self) {
        let (decision, status) = recorded(&self.app, &self.run_id).await;
        assert_eq!(
            (decision, status.as_str()),
            (Value::Null, "awaiting_approval")
        );
    }
}

/// Asserts that the page shows each of `expected`.
pub(super) fn assert_shows(page: &Page, expected: &[&str]) {
    for text in expected {
        assert!(
            page.html.contains(text),
            "{text:?} missing from\n{}",
            page.html
        );
    }
}

fn request_path(run_id: &str) -> String {
    format!("/inbox/runs/{run_id}/calls/toolu_2")
}

/// The decision recorded on the refund, if any, and the run's status.
async fn recorded(app: &TestApp, run_id: &str) -> (Value, String) {
    let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
    let status = run["status"].as_str().unwrap_or_default().to_string();
    (run["pending"][0]["decision"].clone(), status)
}

/// The decisions in the run's audit trail.
async fn decided_entries(app: &TestApp, run_id: &str) -> Vec<Value> {
    let (_, trail) = app.get(&format!("/v1/runs/{run_id}/audit")).await;
    trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["entry"].clone())
        .filter(|e| e["kind"] == "decided")
        .collect()
}

#[tokio::test]
async fn signing_in_with_a_key_sets_a_strict_http_only_cookie_and_a_wrong_key_changes_nothing() {
    let app = app().await;
    let browser = Browser::new(&app);
    let page = browser.get("/inbox/runs/run_x").await;
    assert_eq!(page.status, StatusCode::SEE_OTHER);
    assert_eq!(
        page.location.as_deref(),
        Some("/inbox/sign-in?next=%2Finbox%2Fruns%2Frun_x")
    );
    let form = browser.get("/inbox/sign-in").await;
    assert_eq!(form.status, StatusCode::OK);
    assert!(
        form.html.contains("id=\"sign-in\" method="),
        "{}",
        form.html
    );
    assert!(form.html.contains("name=\"key\""));
    assert!(form.html.contains("name=\"viewport\""));
    // Without [email] the link form says it cannot send one, and sends none.
    assert_shows(&form, &["id=\"email-link\"", "cannot send sign-in links"]);
    let off = browser
        .sign_in_form("/inbox/sign-in/email", &[("email", "alice@example.com")])
        .await;
    assert_eq!(off.status, StatusCode::NOT_FOUND);

    let wrong = browser
        .sign_in_form("/inbox/sign-in", &[("key", "not-a-key-of-this-gateway")])
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(
        wrong.html.contains("not one this gateway knows"),
        "{}",
        wrong.html
    );
    assert!(wrong.set_cookie.is_none());
    assert_eq!(
        browser.get("/inbox").await.status,
        StatusCode::SEE_OTHER,
        "still signed out"
    );
    // A key that may not decide signs nobody in.
    let requester = browser
        .sign_in_form(
            "/inbox/sign-in",
            &[("key", countersign_tests::app::REQUESTER_KEY)],
        )
        .await;
    assert_eq!(requester.status, StatusCode::FORBIDDEN);
    assert!(requester.set_cookie.is_none());

    let page = browser
        .sign_in_form(
            "/inbox/sign-in",
            &[("key", ALICE_KEY), ("next", "/inbox/runs/run_x")],
        )
        .await;
    assert_eq!(page.status, StatusCode::SEE_OTHER);
    assert_eq!(page.location.as_deref(), Some("/inbox/runs/run_x"));
    let cookie = page.set_cookie.unwrap();
    for part in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(part), "{part} missing from {cookie}");
    }
    assert!(
        !cookie.contains("Secure"),
        "served over plain HTTP: {cookie}"
    );
    let inbox = browser.get("/inbox").await;
    assert_eq!(inbox.status, StatusCode::OK);
    assert!(inbox.html.contains("alice"));

    // Signing out needs the form's token, and ends the session.
    let forged = browser.post("/inbox/sign-out", &[]).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    assert_eq!(browser.get("/inbox").await.status, StatusCode::OK);
    let out = browser
        .post("/inbox/sign-out", &[("csrf", &inbox.input("csrf"))])
        .await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert_eq!(browser.get("/inbox").await.status, StatusCode::SEE_OTHER);
}

/// What another site's page can make a browser send: `Origin` of that site, or, from a
/// browser that leaves `Origin` out, only `Sec-Fetch-Site`.
pub(super) const FROM_ELSEWHERE: [(&str, &str); 5] = [
    ("origin", "https://evil.example"),
    ("origin", "http://localhost:1"),
    ("origin", "null"),
    ("sec-fetch-site", "cross-site"),
    ("sec-fetch-site", "same-site"),
];

#[tokio::test]
async fn a_sign_in_form_not_sent_from_this_browsers_sign_in_page_signs_nobody_in() {
    let app = app().await;
    let mallory = Browser::new(&app);
    let form = mallory.get("/inbox/sign-in").await;
    let cookie = form
        .set_cookie
        .clone()
        .expect("the page gives a pre-session cookie");
    for part in ["countersign_sign_in=", "HttpOnly", "SameSite=Strict"] {
        assert!(cookie.contains(part), "{part} missing from {cookie}");
    }
    let token = form.input("csrf");
    assert_eq!(mallory.get("/inbox/sign-in").await.input("csrf"), token);
    assert!(mallory.get("/inbox/sign-in").await.set_cookie.is_none());

    // A victim's browser that never opened the page, or has its own token: mallory's token,
    // none, or a wrong one signs nobody in, by key or by a mailed link's button.
    let (fresh, victim) = (Browser::new(&app), Browser::new(&app));
    let own = victim.get("/inbox/sign-in").await.input("csrf");
    assert_ne!(own, token);
    for browser in [&fresh, &victim] {
        for path in [
            "/inbox/sign-in",
            "/inbox/sign-in/email",
            "/inbox/sign-in/0123abcd",
        ] {
            for csrf in [None, Some(""), Some(token.as_str()), Some("0123")] {
                let mut fields = vec![("key", ALICE_KEY), ("email", "alice@example.com")];
                fields.extend(csrf.map(|c| ("csrf", c)));
                let refused = browser.post(path, &fields).await;
                assert_eq!(refused.status, StatusCode::FORBIDDEN, "{path} {csrf:?}");
                assert!(refused.set_cookie.is_none(), "{path} {csrf:?}");
                assert_shows(&refused, &["nobody was signed in"]);
            }
        }
        assert_eq!(browser.get("/inbox").await.status, StatusCode::SEE_OTHER);
    }

    // Its own page's form, sent from another site, is refused too.
    for header in FROM_ELSEWHERE {
        let fields = [("key", ALICE_KEY), ("csrf", own.as_str())];
        let refused = victim.post_with("/inbox/sign-in", &fields, &[header]).await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{header:?}");
        assert!(refused.set_cookie.is_none(), "{header:?}");
        assert_shows(&refused, &["nothing was changed"]);
    }
    assert_eq!(victim.get("/inbox").await.status, StatusCode::SEE_OTHER);

    // From the gateway's own origin, or from a client that is no browser, it signs in.
    let origin = ("origin", app.gateway_url.as_str());
    let fields = [("key", ALICE_KEY), ("csrf", own.as_str())];
    let signed_in = victim.post_with("/inbox/sign-in", &fields, &[origin]).await;
    assert_eq!(
        signed_in.status,
        StatusCode::SEE_OTHER,
        "{}",
        signed_in.html
    );
    assert!(
        victim
            .get("/inbox")
            .await
            .html
            .contains("<span class=\"who\">alice</span>")
    );
    let fields = [("key", CAROL_KEY), ("csrf", token.as_str())];
    assert_eq!(
        mallory.post("/inbox/sign-in", &fields).await.status,
        StatusCode::SEE_OTHER
    );
}

#[tokio::test]
async fn a_page_to_go_back_to_that_is_not_the_inboxs_is_a_400_that_signs_nobody_in() {
    let app = app().await;
    let browser = Browser::new(&app);
    // Asked for with one, the page leaves it out.
    let form = browser
        .get("/inbox/sign-in?next=https%3A%2F%2Fevil.example%2F")
        .await;
    assert_eq!(form.status, StatusCode::OK);
    assert_eq!(form.input("next"), "/inbox");
    let token = form.input("csrf");
    for next in [
        "/inbox\r\nSet-Cookie: countersign_session=0",
        "/inbox/runs/x\n",
        "https://evil.example/inbox",
        "//evil.example/inbox",
        "/inbox/sign-out",
        "/inbox/runs/\u{e9}",
    ] {
        let fields = [("key", ALICE_KEY), ("csrf", token.as_str()), ("next", next)];
        let refused = browser.post("/inbox/sign-in", &fields).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{next:?}");
        assert!(refused.set_cookie.is_none(), "{next:?}");
        assert!(refused.location.is_none(), "{next:?}");
        assert_shows(&refused, &["nobody was signed in"]);
    }
    assert_eq!(browser.get("/inbox").await.status, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn the_inbox_lists_a_paused_call_only_for_reviewers_who_may_approve_it() {
    let app = app().await;
    let run_id = paused_run(&app).await;
    let line = format!("data-run=\"{run_id}\" data-call=\"toolu_2\"");

    let alice = Browser::signed_in(&app, ALICE_KEY).await;
    let inbox = alice.get("/inbox").await;
    assert!(inbox.html.contains(&line), "{}", inbox.html);
    assert!(inbox.html.contains("Refund $129 for order A-1001"));
    assert!(
        inbox
            .html
            .contains("“Refund A-1001, it arrived broken.” — rick"),
        "{}",
        inbox.html
    );
    assert!(inbox.html.contains("<h1>Waiting for you (1)</h1>"));
    assert!(inbox.html.contains(&format!(
        "class=\"open\" href=\"{}\"",
        request_path(&run_id)
    )));
    // The fragment the page's script polls holds the same line; the filters narrow it.
    assert!(alice.get("/inbox/list").await.html.contains(&line));
    assert!(alice.get("/inbox?agent=refunds").await.html.contains(&line));
    assert!(
        !alice
            .get("/inbox?tool=get_order")
            .await
            .html
            .contains(&line)
    );

    // carol is not in finance; rick asked for the run and may not approve it.
    for key in [CAROL_KEY, RICK_KEY] {
        let other = Browser::signed_in(&app, key).await;
        let inbox = other.get("/inbox").await;
        assert_eq!(inbox.status, StatusCode::OK);
        assert!(!inbox.html.contains(&line), "{key}: {}", inbox.html);
        assert!(inbox.html.contains("Nothing is waiting for you"));
    }
    // carol may open the request but is offered no form, and a decision she posts anyway
    // is refused by the decision script.
    let carol = Browser::signed_in(&app, CAROL_KEY).await;
    let page = carol.get(&request_path(&run_id)).await;
    assert!(
        !page.html.contains("id=\"approve\" method="),
        "{}",
        page.html
    );
    let csrf = carol.get("/inbox").await.input("csrf");
    let digest = alice.get(&request_path(&run_id)).await.input("digest");
    let refused = carol
        .post(
            &request_path(&run_id),
            &[("csrf", &csrf), ("digest", &digest), ("action", "approve")],
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.html);
    assert_eq!(recorded(&app, &run_id).await.0, Value::Null);
}

#[tokio::test]
async fn approving_from_the_request_page_completes_the_run_and_the_next_page_and_the_request_say_who_did()
 {
    let opened = alice_opens_a_request().await;
    let (app, run_id, digest) = (&opened.app, &opened.run_id, opened.page.input("digest"));
    assert!(digest.starts_with("sha256:"));
    assert_shows(
        &opened.page,
        &[
            "Refund $129 for order A-1001",
            "Refund of $129 moves money",
            "<strong>Risk: </strong>costly: it spends money",
            "The order arrived broken; I will check it and refund it.",
            "get_order",
            "&quot;amount&quot;: 129",
            "Asked by",
            "id=\"approve\" method=",
            "id=\"edit\" method=",
            "id=\"reject\" method=",
            "name=\"input.amount\"",
            &format!("data-digest=\"{digest}\""),
            &format!("href=\"/inbox/runs/{run_id}\""),
        ],
    );

    let done = opened.submit(&[("action", "approve")]).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.html);
    // Nothing else waits for alice: back to the queue, which says what was recorded.
    let next = done.location.clone().unwrap_or_default();
    assert_eq!(
        next,
        format!("/inbox?recorded_run={run_id}&recorded_call=toolu_2#recorded")
    );
    assert_shows(
        &opened.alice.get(&next).await,
        &["<strong>Recorded: </strong>Refund $129 for order A-1001. Approved by alice via web at "],
    );
    app.wait_status(run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
    let decided = decided_entries(app, run_id).await;
    assert_eq!(decided.len(), 1);
    assert_eq!(decided[0]["actor"], "alice");
    assert_eq!(decided[0]["channel"], "web");
    assert_eq!(decided[0]["digest"], digest.as_str());

    let after = opened.reload().await;
    assert_shows(
        &after,
        &["<p class=\"outcome\">Approved by alice via web at "],
    );
    assert!(!after.html.contains("id=\"approve\" method="));
    assert!(!after.html.contains("id=\"edit\" method="));
    // The same form sent again records nothing more.
    let again = opened
        .submit(&[("action", "reject"), ("reason", "too late")])
        .await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert_eq!(decided_entries(app, run_id).await.len(), 1);

    let run_page = opened.alice.get(&format!("/inbox/runs/{run_id}")).await;
    assert_eq!(run_page.status, StatusCode::OK);
    assert_shows(
        &run_page,
        &[
            "completed",
            "Audit trail",
            "verifies",
            "decided",
            "by alice via web",
        ],
    );
}

#[tokio::test]
async fn an_open_page_learns_that_its_call_was_decided_elsewhere() {
    let opened = alice_opens_a_request().await;
    let state_path = format!("{}/state", opened.path);
    let open = opened.alice.get(&state_path).await;
    let state: Value = serde_json::from_str(&open.html).unwrap();
    assert_eq!(state["open"], true);
    assert_eq!(state["digest"], opened.page.input("digest").as_str());

    // bob approves in another channel while alice's page is open.
    let digest = Value::String(opened.page.input("digest"));
    let (status, body) = opened
        .app
        .decide_as(
            "bob",
            &opened.run_id,
            serde_json::json!({"call_id": "toolu_2", "digest": digest, "action": "approve"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let state: Value = serde_json::from_str(&opened.alice.get(&state_path).await.html).unwrap();
    assert_eq!(state["open"], false);
    let outcome = state["outcome"].as_str().unwrap();
    assert!(
        outcome.starts_with("Approved by bob via api at "),
        "{outcome}"
    );
    // What alice then sends is refused, and the page says what happened.
    let late = opened.submit(&[("action", "approve")]).await;
    assert_eq!(late.status, StatusCode::CONFLICT);
    assert_shows(&late, &["Approved by bob via api"]);
    // Without a session the state is not told.
    let stranger = Browser::new(&opened.app).get(&state_path).await;
    assert_eq!(stranger.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_request_page_says_who_else_has_it_open_and_nobody_once_it_is_decided() {
    let opened = alice_opens_a_request().await;
    let state_path = format!("{}/state", opened.path);
    let state = |page: Page| serde_json::from_str::<Value>(&page.html).unwrap();
    assert_eq!(
        state(opened.alice.get(&state_path).await)["others"],
        serde_json::json!([])
    );

    // carol opens it too: her page names alice, and alice's next poll names carol.
    let carol = Browser::signed_in(&opened.app, CAROL_KEY).await;
    let carols = carol.get(&opened.path).await;
    assert_shows(&carols, &["Also looking at this: alice"]);
    assert_eq!(
        state(opened.alice.get(&state_path).await)["others"],
        serde_json::json!(["carol"])
    );
    assert!(
        !opened
            .reload()
            .await
            .html
            .contains("Also looking at this: alice")
    );

    let done = opened.submit(&[("action", "approve")]).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.html);
    assert_eq!(
        state(carol.get(&state_path).await)["others"],
        serde_json::json!([]),
        "a decided request has nobody to look out for"
    );
}

#[tokio::test]
async fn a_form_without_the_sessions_csrf_token_is_refused_and_decides_nothing() {
    let opened = alice_opens_a_request().await;
    let carol = Browser::signed_in(&opened.app, CAROL_KEY).await;
    let carols = carol.get("/inbox").await.input("csrf");
    for csrf in ["", "0123", carols.as_str()] {
        let refused = opened
            .submit(&[("csrf", csrf), ("action", "approve")])
            .await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
        assert_shows(&refused, &["Nothing was changed"]);
    }
    opened.nothing_recorded().await;
}

#[tokio::test]
async fn a_decision_or_a_sign_out_sent_from_another_site_is_refused_and_changes_nothing() {
    let opened = alice_opens_a_request().await;
    for header in FROM_ELSEWHERE {
        let refused = opened
            .submit_with(&[("action", "approve")], &[header])
            .await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{header:?}");
        assert_shows(&refused, &["nothing was changed"]);
        let csrf = opened.page.input("csrf");
        let out = opened
            .alice
            .post_with("/inbox/sign-out", &[("csrf", &csrf)], &[header])
            .await;
        assert_eq!(out.status, StatusCode::FORBIDDEN, "{header:?}");
    }
    opened.nothing_recorded().await;
    assert_eq!(opened.alice.get("/inbox").await.status, StatusCode::OK);
    let (_, audit) = opened
        .app
        .get(&format!("/v1/runs/{}/audit", opened.run_id))
        .await;
    assert!(audit["refusals"].as_array().unwrap().is_empty(), "{audit}");

    // From the gateway's own page it decides.
    let own = [
        ("origin", opened.app.gateway_url.as_str()),
        ("sec-fetch-site", "same-origin"),
    ];
    let done = opened.submit_with(&[("action", "approve")], &own).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.html);
    opened.app.wait_status(&opened.run_id, "completed").await;
}

#[tokio::test]
async fn an_edit_outside_the_schema_or_of_an_unknown_field_or_without_a_note_is_shown_and_records_nothing()
 {
    let opened = alice_opens_a_request().await;
    let edit = |amount: &'static str, note: &'static str| {
        let fields = [
            ("action", "edit"),
            ("input.order_id", "A-1001"),
            ("input.amount", amount),
            ("input.reason", "arrived broken"),
            ("note", note),
        ];
        let opened = &opened;
        async move { opened.submit(&fields).await }
    };

    let too_much = edit("900", "Customer asked for more.").await;
    assert_eq!(too_much.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_shows(
        &too_much,
        &[
            "<p class=\"field-error\">amount: must be at most 500</p>",
            // What was typed is kept.
            "value=\"900\"",
            "Customer asked for more.",
        ],
    );
    let not_a_number = edit("12,50", "Half.").await;
    assert_eq!(not_a_number.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_shows(&not_a_number, &["amount: must be a number"]);
    // A field the form does not have, sent by hand: refused by name, not left out.
    let misspelt = opened
        .submit(&[
            ("action", "edit"),
            ("input.order_id", "A-1001"),
            ("input.amount", "129"),
            ("input.amout", "50"),
            ("input.reason", "arrived broken"),
            ("note", "typo"),
        ])
        .await;
    assert_eq!(misspelt.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_shows(
        &misspelt,
        &["amout: is not a field of issue_refund (its fields: amount, order_id, reason)"],
    );
    let no_note = edit("49", " ").await;
    assert_eq!(no_note.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_shows(&no_note, &["<p class=\"field-error\">Write a note"]);
    opened.nothing_recorded().await;

    let done = edit("49", "Only the lid broke.").await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.html);
    opened.app.wait_status(&opened.run_id, "completed").await;
    assert_eq!(opened.app.tools.refunds()[0]["amount"], 49);
    assert_shows(
        &opened.reload().await,
        &["Approved with changes by alice via web"],
    );
}

#[tokio::test]
async fn a_reject_without_a_reason_and_a_stale_digest_are_refused_and_record_nothing() {
    let opened = alice_opens_a_request().await;
    let no_reason = opened
        .submit(&[("action", "reject"), ("reason", "  ")])
        .await;
    assert_eq!(no_reason.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_shows(&no_reason, &["<p class=\"field-error\">Write a reason"]);

    let stale = format!("sha256:{}", "0".repeat(64));
    let changed = opened
        .submit(&[("digest", &stale), ("action", "approve")])
        .await;
    assert_eq!(changed.status, StatusCode::CONFLICT);
    assert_shows(&changed, &["changed since you opened it"]);
    // The page is shown again from what is held now, with its digest.
    assert_eq!(changed.input("digest"), opened.page.input("digest"));
    opened.nothing_recorded().await;
    let (_, audit) = opened
        .app
        .get(&format!("/v1/runs/{}/audit", opened.run_id))
        .await;
    assert!(
        audit["refusals"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["code"] == "stale_digest" && r["channel"] == "web")
    );

    let rejected = opened
        .submit(&[("action", "reject"), ("reason", "Too much.")])
        .await;
    assert_eq!(rejected.status, StatusCode::SEE_OTHER);
    opened.app.wait_status(&opened.run_id, "completed").await;
    assert!(opened.app.tools.refunds().is_empty());
    assert_shows(
        &opened.reload().await,
        &["Rejected by alice via web", "Reason: Too much."],
    );
}

#[tokio::test]
async fn an_emailed_sign_in_link_signs_in_once_and_unknown_addresses_get_the_same_answer() {
    let (app, sink) = app_with_email("\"email:approvers\"", None).await;
    let browser = Browser::new(&app);
    let known = browser
        .sign_in_form("/inbox/sign-in/email", &[("email", "alice@example.com")])
        .await;
    let unknown = browser
        .sign_in_form("/inbox/sign-in/email", &[("email", "nobody@example.com")])
        .await;
    assert_eq!(known.status, StatusCode::OK);
    assert_eq!(unknown.status, known.status);
    assert_eq!(unknown.set_cookie, known.set_cookie);
    assert_eq!(
        unknown.html.split("<main").nth(1),
        known.html.split("<main").nth(1),
        "the answer does not tell whether the address is known"
    );
    let mail = wait_for("the sign-in mail", PATIENCE, || async {
        sink.mails()
            .into_iter()
            .find(|m| m.data.contains("Subject: Your sign-in link"))
    })
    .await;
    assert_eq!(mail.to, ["alice@example.com"]);
    assert!(
        sink.mails()
            .iter()
            .all(|m| !m.to.contains(&"nobody@example.com".to_string()))
    );
    let link = mail.links("http://approvals.test/inbox/sign-in/")[0].replacen(
        "http://approvals.test",
        "",
        1,
    );

    // Opening the link (as a mail scanner does) spends nothing.
    for _ in 0..2 {
        let page = browser.get(&link).await;
        assert_eq!(page.status, StatusCode::OK);
        assert!(
            page.html.contains("Sign in as <strong>alice</strong>"),
            "{}",
            page.html
        );
    }
    assert_eq!(browser.get("/inbox").await.status, StatusCode::SEE_OTHER);
    // Its button, sent by another browser or from another site, signs nobody in and
    // leaves the link working.
    let token = browser.get(&link).await.input("csrf");
    let refused = Browser::new(&app).post(&link, &[("csrf", &token)]).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let origin = ("origin", "https://evil.example");
    let refused = browser
        .post_with(&link, &[("csrf", &token)], &[origin])
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert_eq!(browser.get(&link).await.status, StatusCode::OK);
    let used = browser.sign_in_form(&link, &[]).await;
    assert_eq!(used.status, StatusCode::SEE_OTHER);
    assert!(used.set_cookie.unwrap().contains("HttpOnly"));
    let inbox = browser.get("/inbox").await;
    assert_eq!(inbox.status, StatusCode::OK);
    assert!(
        inbox.html.contains("<span class=\"who\">alice</span>"),
        "{}",
        inbox.html
    );

    let stranger = Browser::new(&app);
    assert_eq!(
        stranger.sign_in_form(&link, &[]).await.status,
        StatusCode::GONE
    );
    assert_eq!(stranger.get(&link).await.status, StatusCode::GONE);
    assert_eq!(stranger.get("/inbox").await.status, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn a_call_asked_about_again_after_a_policy_change_says_so_and_its_old_page_says_why_it_closed()
 {
    let app = app().await;
    let run_id = paused_run(&app).await;
    app.rewrite_agent(|agent| {
        agent.replace(
            "approvers = [\"role:finance\"]\n",
            "approvers = [\"role:finance\"]\nquorum = 2\n",
        )
    });
    countersign_tests::wait_for("the call to be held again", PATIENCE, || async {
        let (_, run) = app.get(&format!("/v1/runs/{run_id}")).await;
        (run["pending"][0]["call_id"] == "toolu_2.r2").then_some(())
    })
    .await;
    let alice = Browser::signed_in(&app, ALICE_KEY).await;
    let again = alice
        .get(&format!("/inbox/runs/{run_id}/calls/toolu_2.r2"))
        .await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.html);
    assert_shows(
        &again,
        &[
            "Asked again:",
            "the tool's policy changed",
            "toolu_2",
            "Nobody had decided it.",
        ],
    );
    let old = alice.get(&request_path(&run_id)).await;
    assert_shows(
        &old,
        &["the tool's policy changed, so the call is checked again"],
    );
}

#[tokio::test]
async fn a_run_pages_live_events_need_a_session_and_carry_on_after_the_last_event_id() {
    let app = app().await;
    let run_id = paused_run(&app).await;
    let path = format!("/inbox/runs/{run_id}/events");
    let anonymous = Browser::new(&app).open(&path, &[]).await;
    assert_ne!(anonymous.status(), StatusCode::OK);

    let alice = Browser::signed_in(&app, ALICE_KEY).await;
    let mut answer = alice.open(&path, &[("last-event-id", "3")]).await;
    assert_eq!(answer.status(), StatusCode::OK);
    let mut decoder = countersign_model::sse::Decoder::default();
    let mut ids = Vec::new();
    let read = async {
        while let Some(chunk) = answer.chunk().await.unwrap() {
            for event in decoder.push(&chunk) {
                ids.push(event.id.clone().unwrap());
                if event.event == "approval.requested" {
                    return;
                }
            }
        }
        panic!("the stream ended before the pause");
    };
    tokio::time::timeout(PATIENCE, read).await.unwrap();
    assert_eq!(ids[0], "4", "{ids:?}");
}

/// A mistyped inbox address, or a run that is not there, is a page with the inbox's header and
/// the way back to the queue, not the API's JSON; the API's unknown routes stay JSON.
#[tokio::test]
async fn a_page_that_is_not_there_keeps_the_header_and_the_way_back_to_the_queue() {
    let app = app().await;
    let alice = Browser::signed_in(&app, ALICE_KEY).await;
    for path in ["/inbox/nope", "/inbox/runs/run_nope"] {
        let page = alice.get(path).await;
        assert_eq!(page.status, StatusCode::NOT_FOUND, "{path}");
        for part in ["<header>", "href=\"/inbox\"", ">Back to the queue</a>"] {
            assert!(
                page.html.contains(part),
                "{path}: {part} missing from {}",
                page.html
            );
        }
    }
    let (status, body) = app.get("/v1/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "not_found", "{body}");
}
