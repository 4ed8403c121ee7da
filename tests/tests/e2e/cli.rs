//! The `countersign` command line, run as a process against a real gateway: a reviewer works
//! a paused run from the terminal, decisions quote the digest `show` displayed, the audit
//! chain is checked locally, `watch` follows runs, and the exit codes tell failures apart.

use countersign_fake_model::{
    anthropic_text, anthropic_tool_use, first_user_text, refund_brain, turn,
};
use countersign_model::run::RunId;
use countersign_runtime::names::Names;
use countersign_store::keys::Keys;
use countersign_tests::app::{
    ADMIN_KEY, INTEGRATION_KEY, PATIENCE, REQUESTER_KEY, REVIEWER_KEY, TestApp,
};
use serde_json::{Value, json};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// What a finished command left: its exit code, standard output and standard error.
struct Outcome {
    code: i32,
    out: String,
    err: String,
}

/// `line` split as a shell splits it when only single quotes are used: on spaces, but not
/// within quotes.
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                word.get_or_insert_default();
            }
            ' ' if !quoted => words.extend(word.take()),
            c => word.get_or_insert_default().push(c),
        }
    }
    words.extend(word);
    words
}

/// The command line `countersign LINE` with `key`, pointed at the app's gateway and at no
/// config file.
fn command(app: &TestApp, key: &str, line: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_countersign_cli"));
    command
        .args(words(line))
        .env("COUNTERSIGN_URL", &app.gateway_url)
        .env("COUNTERSIGN_API_KEY", key)
        .env(
            "XDG_CONFIG_HOME",
            std::env::temp_dir().join("cs-cli-no-config"),
        )
        .kill_on_drop(true);
    command
}

async fn run(mut command: Command) -> Outcome {
    finished(command.output().await.unwrap())
}

fn finished(out: std::process::Output) -> Outcome {
    Outcome {
        code: out.status.code().expect("the command line exited"),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `countersign LINE` with `input` on its standard input, as the right side of a pipe.
async fn fed(app: &TestApp, key: &str, line: &str, input: &str) -> Outcome {
    let mut command = command(app, key, line);
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    finished(child.wait_with_output().await.unwrap())
}

async fn countersign(app: &TestApp, key: &str, line: &str) -> Outcome {
    run(command(app, key, line)).await
}

/// Runs a command that must succeed, and gives its output.
pub(super) async fn ok(app: &TestApp, key: &str, line: &str) -> String {
    let done = countersign(app, key, line).await;
    assert_eq!(done.code, 0, "countersign {line} failed: {}", done.err);
    done.out
}

impl Outcome {
    /// Checks that the command exited with `code` and said each of `says` on its error output.
    fn failed(self, code: i32, says: &[&str]) -> Self {
        assert_eq!(self.code, code, "{}{}", self.out, self.err);
        for part in says {
            assert!(
                self.err.contains(part),
                "{part:?} missing from: {}",
                self.err
            );
        }
        self
    }
}

/// The digest `show` displayed for a call, as a person would copy it.
fn shown_digest(show: &str) -> String {
    show.lines()
        .find_map(|line| line.trim().strip_prefix("digest"))
        .map(|rest| rest.trim().to_string())
        .expect("show displays a digest")
}

/// Starts a refund run from the terminal, as the requester: its id.
async fn started_run(app: &TestApp) -> String {
    let started = ok(
        app,
        REQUESTER_KEY,
        "runs start refunds --input 'Order A-1001 arrived broken.'",
    )
    .await;
    let run = started.trim().to_string();
    assert!(
        run.starts_with("run_"),
        "runs start prints the run id: {started}"
    );
    run
}

/// Starts a refund run from the terminal, as the requester, and waits until it has paused.
async fn paused_run(app: &TestApp) -> String {
    let run = started_run(app).await;
    app.wait_status(&run, "awaiting_approval").await;
    run
}

#[tokio::test]
async fn a_reviewer_sees_a_paused_run_in_pending_and_show_and_approves_it_with_the_digest_shown() {
    let app = TestApp::spawn(refund_brain).await;
    let run = paused_run(&app).await;

    let pending = ok(&app, REVIEWER_KEY, "pending").await;
    let header = pending.lines().next().unwrap();
    for column in ["SUMMARY", "AGENT", "ASKED BY", "TIME LEFT", "RUN", "CALL"] {
        assert!(header.contains(column), "{pending}");
    }
    let row = pending.lines().find(|l| l.contains(&run)).expect(&pending);
    for cell in ["Refund $129 for order A-1001", "refunds", "rick", "toolu_2"] {
        assert!(row.contains(cell), "{cell} missing from {row}");
    }
    assert!(row.contains("h ") && row.contains(" left"), "{row}");
    let other_agent = ok(&app, REVIEWER_KEY, "pending --agent billing").await;
    // A filter that keeps nothing says so, and how much waits: a misspelt agent is not an
    // empty queue.
    assert_eq!(
        other_agent.trim(),
        "Nothing waiting matches --agent \"billing\"; 1 call waits in all."
    );
    let by_tool = ok(&app, REVIEWER_KEY, "pending --tool issue_refund").await;
    assert!(by_tool.contains(&run), "{by_tool}");

    let show = ok(&app, REVIEWER_KEY, &format!("show {run}")).await;
    for part in [
        "awaiting_approval",
        "The order arrived broken; I will check it and refund it.",
        "Call toolu_2 (issue_refund): Refund $129 for order A-1001",
        "Refund of $129 moves money",
        "costly: it spends money",
        "\"amount\": 129",
        "none yet",
    ] {
        assert!(show.contains(part), "{part:?} missing from:\n{show}");
    }
    let digest = shown_digest(&show);
    let (_, paused) = app.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(digest, paused["pending"][0]["digest"]);

    let approved = ok(
        &app,
        REVIEWER_KEY,
        &format!("approve {run} toolu_2 --digest {digest}"),
    )
    .await;
    assert!(
        approved.contains("rita approved call toolu_2: recorded"),
        "{approved}"
    );
    assert!(
        approved.contains(&format!("run {run} resumes")),
        "{approved}"
    );
    app.wait_status(&run, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);

    let got = ok(&app, REVIEWER_KEY, &format!("runs get {run}")).await;
    assert!(
        got.contains("completed") && got.contains("All done."),
        "{got}"
    );
}

/// A lookup in one turn, the refund in the next, so the refund's reviewer has evidence.
fn lookup_then_refund(request: &Value) -> Value {
    match turn(request) {
        0 => anthropic_tool_use(
            "Let me look the order up.",
            &[("toolu_1", "get_order", json!({"order_id": "A-1001"}))],
        ),
        1 => anthropic_tool_use(
            "It was delivered broken; I will refund it.",
            &[(
                "toolu_2",
                "issue_refund",
                json!({"order_id": "A-1001", "amount": 129, "reason": "arrived broken"}),
            )],
        ),
        _ => anthropic_text("Refunded."),
    }
}

#[tokio::test]
async fn runs_get_and_show_say_which_call_of_a_completed_run_failed_and_what_its_tool_answered() {
    let app = crate::failed_calls::loosened_app().await;
    let run = crate::failed_calls::refused_refund(&app).await;
    for command in ["runs get", "show"] {
        let out = ok(&app, REVIEWER_KEY, &format!("{command} {run}")).await;
        let field = |name: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|rest| rest.trim().to_string())
        };
        assert_eq!(field("status").as_deref(), Some("completed"), "{out}");
        assert_eq!(
            field("failed calls").as_deref(),
            Some("1, listed below (the agent was told)"),
            "{command}: {out}"
        );
        assert!(
            out.contains(
                "Call toolu_2 (issue_refund) failed: The tool issue_refund answered HTTP 401"
            ),
            "{command}: {out}"
        );
    }
}

#[tokio::test]
async fn show_lists_the_tool_results_the_agent_had_seen_before_the_call() {
    let app = TestApp::spawn(lookup_then_refund).await;
    let run = paused_run(&app).await;
    let show = ok(&app, REVIEWER_KEY, &format!("show {run}")).await;
    let seen = show
        .split_once("The agent had seen these results:\n")
        .map(|(_, rest)| rest)
        .expect(&show);
    let mut lines = seen.lines();
    assert_eq!(
        lines.next().unwrap().trim(),
        "get_order {\"order_id\":\"A-1001\"}:"
    );
    assert!(lines.next().unwrap().contains("delivered"), "{show}");
    assert!(
        show.contains("It was delivered broken; I will refund it."),
        "{show}"
    );
}

#[tokio::test]
async fn a_stale_digest_is_refused_and_a_reject_without_a_reason_or_a_decision_without_a_digest_is_not_sent()
 {
    let app = TestApp::spawn(refund_brain).await;
    let run = paused_run(&app).await;

    let stale = format!("sha256:{}", "0".repeat(64));
    countersign(
        &app,
        REVIEWER_KEY,
        &format!("approve {run} toolu_2 --digest {stale}"),
    )
    .await
    .failed(
        3,
        &[
            "does not match what is pending now",
            "409 stale_digest",
            &format!("countersign show {run}`"),
        ],
    );
    countersign(&app, REVIEWER_KEY, &format!("approve {run} toolu_2"))
        .await
        .failed(
            2,
            &["--digest is required", &format!("countersign show {run}")],
        );
    let digest = shown_digest(&ok(&app, REVIEWER_KEY, &format!("show {run}")).await);
    countersign(
        &app,
        REVIEWER_KEY,
        &format!("reject {run} toolu_2 --digest {digest}"),
    )
    .await
    .failed(2, &["--reason is required"]);

    // Nothing above was recorded: the call still waits, and the stale digest is a refusal
    // in the trail's list.
    let (_, still) = app.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(still["status"], "awaiting_approval");
    assert_eq!(still["pending"][0]["decision"], Value::Null);
    let (_, trail) = app.get(&format!("/v1/runs/{run}/audit")).await;
    assert_eq!(trail["refusals"].as_array().unwrap().len(), 1, "{trail}");

    let rejected = ok(
        &app,
        REVIEWER_KEY,
        &format!("reject {run} toolu_2 --digest {digest} --reason 'Photos show it intact.'"),
    )
    .await;
    assert!(
        rejected.contains("rita rejected call toolu_2: recorded"),
        "{rejected}"
    );
    app.wait_status(&run, "completed").await;
    assert!(app.tools.refunds().is_empty());
}

#[tokio::test]
async fn an_edit_with_set_changes_only_the_named_existing_field_and_speaks_for_the_person_named() {
    let app = TestApp::spawn(refund_brain).await;
    let run = paused_run(&app).await;
    let digest = shown_digest(&ok(&app, REVIEWER_KEY, &format!("show {run}")).await);

    let edit = format!("edit {run} toolu_2 --digest {digest} --decided-by alice");
    countersign(&app, INTEGRATION_KEY, &format!("{edit} --set amount=20"))
        .await
        .failed(2, &["--note is required"]);
    countersign(
        &app,
        INTEGRATION_KEY,
        &format!("{edit} --set amount=lots --note n"),
    )
    .await
    .failed(3, &["422", "amount: must be a number"]);
    // A misspelt field is refused before anything is sent, and by the gateway for --input.
    countersign(
        &app,
        INTEGRATION_KEY,
        &format!("{edit} --set amout=50 --note typo"),
    )
    .await
    .failed(
        2,
        &[
            "nothing was sent",
            "amout: is not a field of issue_refund (its fields: amount, order_id, reason)",
        ],
    );
    let whole = r#"--input '{"order_id":"A-1001","amount":129,"amout":50,"reason":"r"}'"#;
    countersign(
        &app,
        INTEGRATION_KEY,
        &format!("{edit} {whole} --note typo"),
    )
    .await
    .failed(
        3,
        &[
            "422",
            "amout: is not a field of issue_refund (its fields: amount, order_id, reason)",
        ],
    );
    let (_, held) = app.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(
        held["pending"][0]["decision"],
        Value::Null,
        "nothing recorded"
    );

    let fix = "--set amount=20 --note 'Only the broken part.'";
    let said = ok(&app, INTEGRATION_KEY, &format!("{edit} {fix}")).await;
    assert!(said.contains("amount: 129 → 20"), "{said}");
    let done = app.wait_status(&run, "completed").await;
    let refunds = app.tools.refunds();
    assert_eq!(refunds.len(), 1);
    assert_eq!(refunds[0]["amount"], 20, "{refunds:?}");
    assert_eq!(
        refunds[0]["order_id"], "A-1001",
        "the other fields stay as shown"
    );
    let (_, trail) = app.get(&format!("/v1/runs/{run}/audit")).await;
    let decided = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entry"]["kind"] == "decided")
        .expect("the edit is audited");
    assert_eq!(decided["entry"]["actor"], "alice", "{done}");
    // The request is the agent's, not the worker process's that ran its turn.
    let requested = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entry"]["kind"] == "requested")
        .expect("the request is audited");
    assert_eq!(requested["entry"]["actor"], "refunds", "{requested}");
    assert_eq!(
        decided["entry"]["detail"]["changes"],
        json!([{"field": "amount", "before": 129, "after": 20}])
    );
}

#[tokio::test]
async fn audit_verify_passes_on_a_real_run_and_fails_once_the_chain_is_edited_in_redis() {
    let app = TestApp::spawn(refund_brain).await;
    let run = app.refund_cycle().await;

    let audit = ok(&app, ADMIN_KEY, &format!("audit {run} --verify")).await;
    for part in [
        "requested",
        "decided",
        "completed",
        "rita",
        "chain: holds",
        "chain: verified here",
        "receipts: 1 verified here",
    ] {
        assert!(audit.contains(part), "{part:?} missing from:\n{audit}");
    }
    // A reviewer's key is not shown the receipt, and the chain verifies all the same.
    let audit = ok(&app, REVIEWER_KEY, &format!("audit {run} --verify")).await;
    for part in [
        "chain: verified here",
        "receipts: 0 verified here",
        "receipts: 1 withheld",
    ] {
        assert!(audit.contains(part), "{part:?} missing from:\n{audit}");
    }

    // Someone with access to Redis makes the decision look like another person's.
    let key =
        Keys::of(&Names::new(&app.namespace).unwrap()).audit_key(&RunId::parse(&run).unwrap());
    let redis = redis::Client::open(app.infra.redis_url.as_str()).unwrap();
    let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
    let elements: Vec<String> = redis::cmd("LRANGE")
        .arg(&key)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let (at, element) = elements
        .iter()
        .enumerate()
        .find(|(_, e)| e.contains("\"decided\""))
        .unwrap();
    let mut forged: Value = serde_json::from_str(element).unwrap();
    forged["entry"]["actor"] = "mallory".into();
    let () = redis::cmd("LSET")
        .arg(&key)
        .arg(at)
        .arg(forged.to_string())
        .query_async(&mut conn)
        .await
        .unwrap();

    let broken = countersign(&app, REVIEWER_KEY, &format!("audit {run} --verify"))
        .await
        .failed(1, &[&format!("broken at element {at}")]);
    assert!(
        broken.out.contains("mallory"),
        "the trail is still shown: {}",
        broken.out
    );
    // Without --verify it is shown, the gateway's own check says so, and it exits 0.
    let shown = ok(&app, REVIEWER_KEY, &format!("audit {run}")).await;
    assert!(
        shown.contains(&format!("BROKEN at element {at}")),
        "{shown}"
    );
}

#[tokio::test]
async fn json_output_is_the_gateways_json() {
    let app = TestApp::spawn(refund_brain).await;
    let run = paused_run(&app).await;

    let parse = |text: String| -> Value {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    };
    let pending = parse(ok(&app, REVIEWER_KEY, "pending --json").await);
    let call = &pending["approvals"][0];
    assert_eq!(call["run_id"], run.as_str());
    assert!(call["deadline"].as_i64().is_some(), "{call}");
    let shown = parse(ok(&app, REVIEWER_KEY, &format!("--json show {run}")).await);
    let (_, from_api) = app.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(shown["pending"], from_api["pending"]);
    let digest = shown["pending"][0]["digest"].as_str().unwrap();

    let decided = parse(
        ok(
            &app,
            REVIEWER_KEY,
            &format!("approve {run} toolu_2 --digest {digest} --json"),
        )
        .await,
    );
    assert_eq!(decided["decisions"][0]["status"], "recorded");
    assert_eq!(decided["resumes"], true);
    app.wait_status(&run, "completed").await;
    let got = parse(ok(&app, REVIEWER_KEY, &format!("runs get {run} --json")).await);
    assert_eq!(got["answer"], "All done.");
    let trail = parse(ok(&app, REVIEWER_KEY, &format!("audit {run} --json --verify")).await);
    assert_eq!(trail["verified"], true);

    let start = "runs start refunds --input 'Refund A-1002.' --json --idempotency-key desk-42";
    let with_metadata = format!("{start} --metadata '{{\"ticket\": 42}}'");
    let started = parse(ok(&app, REQUESTER_KEY, &with_metadata).await);
    let again = parse(ok(&app, REQUESTER_KEY, &with_metadata).await);
    assert_eq!(
        started["run_id"], again["run_id"],
        "a retry is the same run"
    );
    let other = started["run_id"].as_str().unwrap();
    let (_, metadata) = app.get(&format!("/v1/runs/{other}")).await;
    assert_eq!(metadata["metadata"]["ticket"], 42);
    let cancel = format!("runs cancel {other} --json --reason 'Asked twice.'");
    let cancelled = parse(ok(&app, REQUESTER_KEY, &cancel).await);
    assert_eq!(cancelled["status"], "cancelling");
    app.wait_status(other, "cancelled").await;
    let got = ok(&app, REQUESTER_KEY, &format!("runs get {other}")).await;
    assert!(
        got.contains("asked by rick") && got.contains("Asked twice."),
        "{got}"
    );
    assert!(
        !got.contains("waiting"),
        "a cancelled run waits for nobody: {got}"
    );
}

#[tokio::test]
async fn exit_codes_tell_usage_refusal_and_an_unreachable_gateway_apart() {
    let app = TestApp::spawn(refund_brain).await;

    countersign(&app, "", "pending")
        .await
        .failed(2, &["no API key"]);
    countersign(&app, "not-a-key-of-this-gateway", "pending")
        .await
        .failed(3, &["401"]);
    countersign(
        &app,
        REQUESTER_KEY,
        "runs start refunds --input x --metadata [1]",
    )
    .await
    .failed(2, &["--metadata must be a JSON object"]);
    countersign(&app, ADMIN_KEY, "show run_nope")
        .await
        .failed(3, &["no run \"run_nope\" (404 not_found)"]);
    countersign(&app, REVIEWER_KEY, "runs start refunds --input x")
        .await
        .failed(3, &["403"]);
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let away = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    countersign(&app, ADMIN_KEY, &format!("pending --url {away}"))
        .await
        .failed(4, &["could not talk to the gateway", "Connection refused"]);
    // A server that is not a gateway.
    let tools = &app.tools.base_url;
    countersign(&app, ADMIN_KEY, &format!("pending --url {tools}"))
        .await
        .failed(
            4,
            &["answered 404 Not Found, not as a countersign gateway does"],
        );

    // A config file stands in for the environment (an empty key is none), and the
    // environment beats it.
    let dir = std::env::temp_dir().join(format!("cs-cli-{}", app.namespace));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.toml");
    let from_file = |url: Option<&str>| {
        let mut command = command(&app, "", &format!("pending --config {}", config.display()));
        match url {
            Some(url) => command.env("COUNTERSIGN_URL", url),
            None => command.env_remove("COUNTERSIGN_URL"),
        };
        command
    };
    let file = format!("url = \"{}\"\napi_key = \"{ADMIN_KEY}\"\n", app.gateway_url);
    std::fs::write(&config, file).unwrap();
    let listed = run(from_file(None)).await;
    assert_eq!(listed.code, 0, "{}", listed.err);
    run(from_file(Some(&away))).await.failed(4, &[&away]);
    std::fs::write(&config, "url = \"x\"\napi_token = \"y\"\n").unwrap();
    run(from_file(None)).await.failed(2, &["api_token"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Lines a running command prints, as they come.
struct Lines {
    child: Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    seen: Vec<String>,
}

impl Lines {
    fn spawn(mut command: Command) -> Self {
        let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads until a line holds every one of `parts`, within the tests' patience.
    async fn until(&mut self, parts: &[&str]) -> String {
        let read = async {
            while let Some(line) = self.lines.next_line().await.unwrap() {
                self.seen.push(line.clone());
                if parts.iter().all(|p| line.contains(p)) {
                    return line;
                }
            }
            panic!(
                "the command ended without printing {parts:?}: {:?}",
                self.seen
            );
        };
        tokio::time::timeout(PATIENCE, read)
            .await
            .unwrap_or_else(|_| panic!("no line with {parts:?} in {PATIENCE:?}"))
    }
}

#[tokio::test]
async fn watch_follows_a_run_that_pauses_while_it_watches_until_it_completes() {
    let app = TestApp::spawn(refund_brain).await;
    let mut watch = command(&app, REVIEWER_KEY, "watch --interval-ms 200");
    watch.stderr(Stdio::piped());
    let mut everything = Lines::spawn(watch);
    // Runs already waiting when the watch first looks have their history skipped: the run
    // starts once it has looked.
    let stderr = everything.child.stderr.take().unwrap();
    let mut notices = BufReader::new(stderr).lines();
    let watching = tokio::time::timeout(PATIENCE, notices.next_line()).await;
    let watching = watching.expect("the watch looks within the tests' patience");
    assert_eq!(
        watching.unwrap().as_deref(),
        Some("countersign: watching; interrupt to stop")
    );

    let run = app.start_run("Order A-1001 arrived broken.").await;
    let requested = everything.until(&[&run, "requested", "toolu_2"]).await;
    // Asked by the agent, not by the worker process that ran its turn.
    assert!(
        requested.contains("  refunds  ") && !requested.contains("worker"),
        "{requested}"
    );
    let mut this_run = Lines::spawn(command(
        &app,
        REVIEWER_KEY,
        &format!("watch --run {run} --json --interval-ms 200"),
    ));
    // Following one run shows its live events from its start, as JSON lines: the model's
    // text in pieces as it came, then the pause.
    let paused: Value =
        serde_json::from_str(&this_run.until(&["\"type\":\"approval.requested\""]).await).unwrap();
    assert_eq!(paused["run_id"], run.as_str());
    let events: Vec<Value> = this_run
        .seen
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let text: String = events
        .iter()
        .filter(|e| e["type"] == "text.delta")
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        text,
        "The order arrived broken; I will check it and refund it."
    );
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());

    let paused = app.wait_status(&run, "awaiting_approval").await;
    let (status, body) = app
        .approve(&run, "toolu_2", &paused["pending"][0]["digest"])
        .await;
    assert_eq!(status, 200, "{body}");
    everything.until(&[&run, "decided", "rita"]).await;
    everything.until(&[&run, "completed"]).await;
    this_run.until(&["\"type\":\"run.completed\""]).await;
    // Following one run ends with it.
    let ended = tokio::time::timeout(PATIENCE, this_run.child.wait())
        .await
        .expect("watch --run ends with its run")
        .unwrap();
    assert!(ended.success());
    // The watch of everything goes on until interrupted.
    assert!(everything.child.try_wait().unwrap().is_none());

    // Without --json, for a person: the model's words as a line of text, a line per call,
    // pause, decision, resume and the end; a run that ended is shown whole and the command
    // ends.
    let shown = ok(&app, REVIEWER_KEY, &format!("watch --run {run}")).await;
    let lines: Vec<&str> = shown.lines().collect();
    assert!(
        lines.contains(&"The order arrived broken; I will check it and refund it."),
        "{shown}"
    );
    for (kind, gist) in [
        ("tool.call", "toolu_2 issue_refund"),
        (
            "approval.requested",
            "waiting for a person: toolu_2 issue_refund",
        ),
        ("approval.decided", "toolu_2 approve by rita (api)"),
        ("run.resumed", "turn 1"),
        ("run.completed", "All done."),
    ] {
        let part = format!("{run}  {kind:18}  {gist}");
        assert!(shown.contains(&part), "{part:?} in {shown}");
    }
    assert!(shown.contains("(waits for a person)"), "{shown}");
}

/// A refund of the amount the run's input names (`Refund 30 for A-1001.`), then an answer.
fn refund_of_the_amount_asked(request: &Value) -> Value {
    let amount: u64 = first_user_text(request)
        .split(' ')
        .find_map(|word| word.parse().ok())
        .expect("the input names an amount");
    match turn(request) {
        0 => anthropic_tool_use(
            "I will refund it.",
            &[(
                "toolu_2",
                "issue_refund",
                json!({"order_id": "A-1001", "amount": amount, "reason": "duplicate charge"}),
            )],
        ),
        _ => anthropic_text("Refunded."),
    }
}

#[tokio::test]
async fn pending_where_json_piped_to_approve_from_decides_exactly_the_listed_calls_and_reports_a_stale_one()
 {
    let app = TestApp::spawn(refund_of_the_amount_asked).await;
    let amounts = [30, 60, 40, 120, 45];
    let inputs: Vec<String> = amounts
        .iter()
        .map(|a| format!("Refund {a} for A-1001."))
        .collect();
    let runs: Vec<String> = app
        .paused_refunds(&inputs)
        .await
        .into_iter()
        .map(|(run, _)| run)
        .collect();
    let small: Vec<&String> = runs
        .iter()
        .zip(amounts)
        .filter(|(_, a)| *a < 50)
        .map(|(r, _)| r)
        .collect();

    let listing = ok(
        &app,
        REVIEWER_KEY,
        "pending --tool issue_refund --where 'input.amount < 50' --json",
    )
    .await;
    let listed: Value = serde_json::from_str(&listing).unwrap();
    let listed = listed["approvals"].as_array().unwrap();
    let mut listed_runs: Vec<&str> = listed
        .iter()
        .map(|a| a["run_id"].as_str().unwrap())
        .collect();
    listed_runs.sort_unstable();
    let mut expected: Vec<&str> = small.iter().map(|r| r.as_str()).collect();
    expected.sort_unstable();
    assert_eq!(listed_runs, expected, "{listing}");
    for call in listed {
        assert_eq!(call["call_id"], "toolu_2");
        assert!(
            call["digest"].as_str().unwrap().starts_with("sha256:"),
            "{call}"
        );
    }
    // The other filters: nobody but rick asked, and a condition that is not CEL is a usage
    // error that sends nothing.
    let nobody = ok(&app, REVIEWER_KEY, "pending --requested-by nobody --json").await;
    assert_eq!(
        serde_json::from_str::<Value>(&nobody).unwrap()["approvals"],
        json!([])
    );
    let rick = ok(&app, REVIEWER_KEY, "pending --requested-by rick --json").await;
    assert_eq!(
        serde_json::from_str::<Value>(&rick).unwrap()["approvals"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
    countersign(&app, REVIEWER_KEY, "pending --where 'input.amount <'")
        .await
        .failed(2, &["--where", "is not CEL"]);

    // One listed call changes between the listing and the decisions.
    let stale = small[1];
    app.change_held_call(stale, "toolu_2").await;
    let approved = fed(&app, REVIEWER_KEY, "approve --from -", &listing)
        .await
        .failed(
            1,
            &[
                "1 of the 3 listed calls were not decided",
                stale,
                "stale_digest",
            ],
        );
    for run in &small {
        let line = approved
            .out
            .lines()
            .find(|l| l.contains(run.as_str()))
            .expect(&approved.out);
        match *run == stale {
            true => assert!(
                line.contains("refused") && line.contains("409 stale_digest"),
                "{line}"
            ),
            false => assert!(line.contains("approved by rita, recorded"), "{line}"),
        }
    }

    for run in small.iter().filter(|r| **r != stale) {
        app.wait_status(run, "completed").await;
    }
    for run in runs.iter().filter(|r| !small.contains(r) || *r == stale) {
        assert_eq!(app.get_run_status(run).await, "awaiting_approval", "{run}");
    }
    assert_eq!(app.tools.refunds().len(), 2);
}

/// The grant id (`grt_…`) a command printed.
fn grant_id(out: &str) -> String {
    out.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .find(|w| w.starts_with("grt_"))
        .unwrap_or_else(|| panic!("no grant id in {out}"))
        .to_string()
}

#[tokio::test]
async fn a_grant_made_from_the_terminal_approves_later_calls_until_it_is_revoked() {
    let app = TestApp::spawn(refund_brain).await;
    let run = paused_run(&app).await;
    let digest = shown_digest(&ok(&app, REVIEWER_KEY, &format!("show {run}")).await);
    let grant = |when: &str| {
        format!("grant {run} toolu_2 --digest {digest} --when '{when}' --uses 5 --for 1h")
    };
    countersign(&app, REVIEWER_KEY, &grant("input.amount <="))
        .await
        .failed(2, &["--when", "is not CEL"]);
    countersign(&app, REVIEWER_KEY, &grant("input.amount <= 10.0"))
        .await
        .failed(3, &["does not cover"]);
    countersign(
        &app,
        REVIEWER_KEY,
        &format!("grant {run} toolu_2 --digest {digest} --when true --uses 5 --for soon"),
    )
    .await
    .failed(2, &["--for"]);
    assert_eq!(app.get_run_status(&run).await, "awaiting_approval");

    // From a listing, as `pending --json | grant --from -`: only one call may be meant.
    let listing = ok(&app, REVIEWER_KEY, "pending --json").await;
    let mut two: Value = serde_json::from_str(&listing).unwrap();
    let one = two["approvals"][0].clone();
    two["approvals"].as_array_mut().unwrap().push(one);
    let from = "grant --from - --when 'input.amount <= 200.0' --uses 5 --for 1h";
    fed(&app, REVIEWER_KEY, from, &two.to_string())
        .await
        .failed(2, &["names 2", "nothing was sent"]);
    assert_eq!(app.get_run_status(&run).await, "awaiting_approval");

    let made = fed(&app, REVIEWER_KEY, from, &listing).await;
    assert_eq!(made.code, 0, "{}", made.err);
    let made = made.out;
    assert!(
        made.contains(&format!(
            "rita approved call toolu_2 of run {run} and made grant grt_"
        )),
        "{made}"
    );
    for part in [
        "refunds calls of issue_refund where input.amount <= 200.0",
        "0 of 5",
    ] {
        assert!(made.contains(part), "{part:?} missing from:\n{made}");
    }
    let id = grant_id(&made);
    app.wait_status(&run, "completed").await;

    let covered = started_run(&app).await;
    app.wait_status(&covered, "completed").await;
    let listed = ok(&app, REVIEWER_KEY, "grants").await;
    let header = listed.lines().next().unwrap();
    for column in [
        "GRANT",
        "STATUS",
        "USES",
        "EXPIRES",
        "TOOL",
        "MADE BY",
        "CONDITION",
    ] {
        assert!(header.contains(column), "{listed}");
    }
    let row = listed.lines().find(|l| l.contains(&id)).expect(&listed);
    for cell in [
        "active",
        "1/5",
        "refunds/issue_refund",
        "rita",
        "input.amount <= 200.0",
    ] {
        assert!(row.contains(cell), "{cell} missing from {row}");
    }
    assert!(row.contains(" left"), "{row}");
    let active = ok(&app, REVIEWER_KEY, "grants --active --tool issue_refund").await;
    assert!(active.contains(&id), "{active}");
    let elsewhere = ok(&app, REVIEWER_KEY, "grants --agent billing").await;
    assert_eq!(elsewhere.trim(), "No standing grants.");
    let listed: Value =
        serde_json::from_str(&ok(&app, REVIEWER_KEY, "grants --json").await).unwrap();
    assert_eq!(listed["grants"][0]["id"], json!(id), "{listed}");
    let shown = ok(&app, REVIEWER_KEY, &format!("grants {id}")).await;
    for part in ["1 of 5", &run, &covered, "The calls it approved"] {
        assert!(shown.contains(part), "{part:?} missing from:\n{shown}");
    }

    let revoked = ok(
        &app,
        REVIEWER_KEY,
        &format!("revoke {id} --reason 'enough'"),
    )
    .await;
    assert!(
        revoked.contains(&format!("grant {id} is revoked (by rita)")),
        "{revoked}"
    );
    countersign(&app, REVIEWER_KEY, "revoke grt_000000000000000000000000")
        .await
        .failed(3, &["no grant", "404"]);
    let (_, state) = app.get(&format!("/v1/grants/{id}")).await;
    assert_eq!(state["revoked"]["reason"], "enough", "{state}");
    let shown = ok(&app, REVIEWER_KEY, &format!("grants {id}")).await;
    assert!(
        shown.contains("revoked") && shown.contains("enough"),
        "{shown}"
    );

    // The next call it would have covered waits for a person.
    let after = started_run(&app).await;
    app.wait_status(&after, "awaiting_approval").await;
    assert_eq!(app.tools.refunds().len(), 2);
}

#[tokio::test]
async fn policy_replay_prints_what_a_candidate_would_change_and_reads_only() {
    let app = TestApp::spawn(refund_brain).await;
    let run = started_run(&app).await;
    app.wait_status(&run, "awaiting_approval").await;
    let candidate = std::env::temp_dir().join(format!("cs-candidate-{run}.toml"));
    let live = std::fs::read_to_string(app.agents_dir().join("refunds.toml")).unwrap();
    std::fs::write(
        &candidate,
        live.replace("input.amount > 20.0", "input.amount > 200.0"),
    )
    .unwrap();
    let line = format!("policy replay refunds --candidate {}", candidate.display());
    let out = ok(&app, ADMIN_KEY, &line).await;
    assert!(out.contains("2 calls of 1 runs of refunds"), "{out}");
    let refunds = out
        .lines()
        .find(|l| l.starts_with("issue_refund"))
        .expect("a row per tool");
    let cells: Vec<&str> = refunds.split_whitespace().collect();
    assert_eq!(
        cells,
        ["issue_refund", "1", "0", "1", "0", "0", "0"],
        "{out}"
    );
    assert!(
        out.contains(&format!("released: {run} toolu_2 issue_refund")),
        "{out}"
    );
    let json: Value =
        serde_json::from_str(&ok(&app, ADMIN_KEY, &format!("--json {line}")).await).unwrap();
    assert_eq!(json["tools"]["issue_refund"]["newly_released"], 1);
    // Only an admin may replay; nothing changed.
    countersign(&app, REVIEWER_KEY, &line)
        .await
        .failed(3, &["forbidden"]);
    assert_eq!(app.get_run_status(&run).await, "awaiting_approval");
    std::fs::remove_file(candidate).unwrap();
}
