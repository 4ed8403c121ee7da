//! A run's live events (`GET /v1/runs/{id}/events`): one connection follows a run from its
//! first words through the pause, the decision and the resume on whichever worker takes it,
//! numbered without a gap; a client that reconnects with `Last-Event-ID`, to any gateway, gets
//! exactly what it missed; clients at once on two gateways see the same events; an
//! announcement stored twice is counted once; a turn tried again starts again; heartbeats hold a waiting run's
//! stream open; a client that does not read is cut off without the gateway holding what it
//! does not read; only those who may read the run may follow it.

use approval_gateway::config::{ApiKey, Role};
use countersign_fake_model::{REFUND_ANSWER, refund_brain};
use countersign_model::run::RunId;
use countersign_runtime::names::msg_id;
use countersign_tests::app::{
    ADMIN_KEY, PATIENCE, READER_KEY, REQUESTER_KEY, REVIEWER_KEY, TestApp,
};
use countersign_tests::live::{LiveEvents, Received, kinds, text_of};
use countersign_tests::wait_for;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// What following a refund run shows, one connection from its start to its end.
const REFUND_RUN: [&str; 12] = [
    "turn.started",
    "text.delta",
    "tool.call",
    "tool.call",
    "tool.result",
    "approval.requested",
    "approval.decided",
    "run.resumed",
    "tool.result",
    "turn.started",
    "text.delta",
    "run.completed",
];

/// Checks a whole refund run's events: in order, numbered 1, 2, 3… without a gap, each
/// `seq` its `id`.
fn assert_refund_run_kinds(events: &[Received]) {
    assert_eq!(kinds(events), REFUND_RUN, "{events:#?}");
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event.id, Some(i as u64 + 1), "{event:?}");
        assert_eq!(event.data["seq"], i as u64 + 1, "{event:?}");
        assert_eq!(event.data["type"], event.kind.as_str());
    }
}

/// Checks a whole refund run's events as [`assert_refund_run_kinds`] does, with the turns'
/// text in pieces, the calls as the policy sorted them, and the decision as it was made.
fn assert_refund_run(events: &[Received]) {
    assert_refund_run_kinds(events);
    assert_eq!(
        text_of(events, 1),
        "The order arrived broken; I will check it and refund it."
    );
    assert_eq!(text_of(events, 2), REFUND_ANSWER);
    assert!(
        events.iter().filter(|e| e.kind == "text.delta").count() > 2,
        "the text came in pieces: {events:#?}"
    );
    let calls: Vec<(&Value, &Value)> = events
        .iter()
        .filter(|e| e.kind == "tool.call")
        .map(|e| (&e.data["call_id"], &e.data["disposition"]))
        .collect();
    assert_eq!(
        calls,
        [
            (&json!("toolu_1"), &json!("run")),
            (&json!("toolu_2"), &json!("held"))
        ]
    );
    let of = |kind: &str| events.iter().find(|e| e.kind == kind).unwrap();
    assert_eq!(
        of("approval.requested").data["calls"][0]["call_id"],
        "toolu_2"
    );
    let decided = &of("approval.decided").data;
    assert_eq!(
        (&decided["decided_by"], &decided["action"], &decided["door"]),
        (&json!("rita"), &json!("approve"), &json!("api"))
    );
    let results: Vec<(&Value, &Value)> = events
        .iter()
        .filter(|e| e.kind == "tool.result")
        .map(|e| (&e.data["call_id"], &e.data["outcome"]))
        .collect();
    assert_eq!(
        results,
        [
            (&json!("toolu_1"), &json!("executed")),
            (&json!("toolu_2"), &json!("approved"))
        ]
    );
    assert_eq!(of("run.completed").data["answer"], REFUND_ANSWER);
}

/// A refund app whose model writes its text a word at a time, a few milliseconds apart, as a
/// real model's tokens come.
async fn app() -> TestApp {
    let app = TestApp::spawn(refund_brain).await;
    app.model.pace_streams(std::time::Duration::from_millis(5));
    app
}

async fn follow(app: &TestApp, run: &str, after: Option<u64>) -> LiveEvents {
    let (status, events) = LiveEvents::open(app, run, REQUESTER_KEY, after).await;
    assert_eq!(status, StatusCode::OK);
    events.unwrap()
}

async fn approve(app: &TestApp, run: &str, requested: &Received) {
    let digest = &requested.data["calls"][0]["digest"];
    let (status, body) = app.approve(run, "toolu_2", digest).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn one_connection_follows_a_run_through_the_pause_and_the_decision_to_its_end() {
    let app = app().await;
    let run = app.start_run("Refund A-1001 please.").await;
    let mut live = follow(&app, &run, None).await;
    let mut events = live.until("approval.requested").await;
    approve(&app, &run, events.last().unwrap()).await;
    events.extend(live.to_end().await);
    assert_refund_run(&events);

    // A client that has it all is told there is nothing more, which stops an EventSource.
    let (status, _) = LiveEvents::open(&app, &run, REQUESTER_KEY, Some(events.len() as u64)).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn the_stream_goes_on_when_the_worker_that_paused_the_run_is_killed_and_another_resumes_it() {
    let mut app = app().await;
    let run = app.start_run("Refund A-1001 please.").await;
    let mut live = follow(&app, &run, None).await;
    let mut events = live.until("approval.requested").await;
    app.kill_worker(0).await;
    app.spawn_worker();
    approve(&app, &run, events.last().unwrap()).await;
    events.extend(live.to_end().await);
    assert_refund_run(&events);
}

#[tokio::test]
async fn a_client_that_reconnects_with_last_event_id_to_another_gateway_gets_exactly_what_it_missed()
 {
    let mut app = app().await;
    let other = app.spawn_gateway(|_| {}).await;
    let run = app.start_run("Refund A-1001 please.").await;
    let mut live = follow(&app, &run, None).await;
    let first = live.until("approval.requested").await;
    drop(live);
    approve(&app, &run, first.last().unwrap()).await;
    app.wait_status(&run, "completed").await;

    let after = first.len() as u64;
    let (status, rest) = LiveEvents::open_at(&app, &other, &run, REQUESTER_KEY, Some(after)).await;
    assert_eq!(status, StatusCode::OK);
    let rest = rest.unwrap().to_end().await;
    assert_eq!(rest.first().unwrap().id, Some(after + 1));
    let whole = follow(&app, &run, None).await.to_end().await;
    assert_eq!(rest, whole[first.len()..]);
    assert_eq!(first, whole[..first.len()]);
    assert_refund_run(&whole);
}

#[tokio::test]
async fn a_turn_tried_again_starts_again_on_the_stream_and_a_client_shows_its_text_once() {
    let app = app().await;
    // The model's first answer breaks off after its first word; the worker tries again.
    app.model.cut_next_stream(1);
    let run = app.start_run("Refund A-1001 please.").await;
    let events = follow(&app, &run, None)
        .await
        .until("approval.requested")
        .await;
    let starts: Vec<usize> = (0..events.len())
        .filter(|&i| events[i].kind == "turn.started")
        .collect();
    assert_eq!(starts.len(), 2, "{events:#?}");
    assert!(starts.iter().all(|&i| events[i].data["turn"] == 1));
    assert_eq!(text_of(&events[..starts[1]], 1), "The ");
    // A client that starts the turn's text anew at each start shows it once, whole.
    assert_eq!(
        text_of(&events[starts[1]..], 1),
        "The order arrived broken; I will check it and refund it."
    );
    let ids: Vec<u64> = events.iter().map(|e| e.id.unwrap()).collect();
    assert_eq!(ids, (1..=events.len() as u64).collect::<Vec<_>>());
}

#[tokio::test]
async fn heartbeats_keep_a_waiting_runs_stream_open_past_the_idle_timeout_until_the_decision() {
    let app = TestApp::builder(refund_brain)
        .gateway(|config| {
            config.idle_timeout_ms = 600;
            config.live_heartbeat_ms = 150;
        })
        .start()
        .await;
    let run = app.start_run("Refund A-1001 please.").await;
    let mut live = follow(&app, &run, None).await;
    let mut events = live.until("approval.requested").await;
    // Quiet but for heartbeats for well over the idle timeout (about 1.5 s).
    let comments = live.comments;
    live.until_comments(comments + 10).await;
    approve(&app, &run, events.last().unwrap()).await;
    events.extend(live.to_end().await);
    assert_refund_run_kinds(&events);
}

#[tokio::test]
async fn only_those_who_may_read_the_run_follow_it_and_a_bad_last_event_id_is_refused() {
    let app = TestApp::builder(refund_brain)
        .gateway(|config| {
            config.api_keys.push(ApiKey {
                key: "other-requester-key-0123456789".into(),
                role: Role::Requester,
                principal: "mallory".into(),
                speaks_for: Vec::new(),
            });
        })
        .start()
        .await;
    let run = app.start_run("Refund A-1001 please.").await;
    for path in [format!("/v1/runs/{run}/events"), format!("/v1/runs/{run}")] {
        let (status, body) = app
            .request(
                reqwest::Method::GET,
                &path,
                Some("other-requester-key-0123456789"),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("mallory"),
            "{body}"
        );
    }
    let (status, _) = app
        .request(
            reqwest::Method::GET,
            &format!("/v1/runs/{run}/events"),
            None,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = LiveEvents::open(&app, "run_nosuchrun", ADMIN_KEY, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let response = app
        .http
        .get(format!("{}/v1/runs/{run}/events", app.gateway_url))
        .bearer_auth(REQUESTER_KEY)
        .header("last-event-id", "seven")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["error"]["message"].as_str().unwrap().contains("seven"),
        "{body}"
    );
}

/// This process's resident memory, in bytes.
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// An HTTP/1.1 chunked body's bytes, up to its last chunk.
fn dechunked(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(std::str::from_utf8(&body[..line_end]).unwrap(), 16);
        let size = size.unwrap();
        if size == 0 {
            return out;
        }
        let start = line_end + 2;
        out.extend_from_slice(&body[start..start + size]);
        body = &body[start + size + 2..];
    }
}

#[tokio::test]
async fn a_client_that_does_not_read_is_cut_off_and_its_events_are_not_held_for_it() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = TestApp::builder(refund_brain)
        .gateway(|config| config.live_slow_reader_ms = 300)
        .start()
        .await;
    let run = app.start_run("Refund A-1001 please.").await;
    app.wait_status(&run, "awaiting_approval").await;
    let series = |event: &str| format!("countersign_live_streams_total{{event=\"{event}\"}}");
    let metric = |event: &'static str| {
        let app = &app;
        let series = series(event);
        async move { countersign_tests::metric_value(&app.gateway_metrics().await, &series) }
    };

    // A client that asks for the stream and then reads nothing.
    let address = app.gateway_url.strip_prefix("http://").unwrap();
    let mut client = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!(
        "GET /v1/runs/{run}/events HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {REQUESTER_KEY}\r\n\r\n"
    );
    client.write_all(request.as_bytes()).await.unwrap();
    wait_for("the stream to open", PATIENCE, || async {
        metric("opened").await.filter(|n| *n == 1.0)
    })
    .await;

    // 100 MiB of the model's text for it, far more than the sockets' buffers hold.
    let before = resident_bytes();
    // As the worker sends it.
    let nats = app
        .infra
        .nats_client_as(&app.namespace, countersign_runtime::names::Service::Worker)
        .await;
    let js = async_nats::jetstream::new(nats);
    let piece = json!({"type": "text.delta", "turn": 1, "text": "x".repeat(256 * 1024)});
    let piece = bytes::Bytes::from(piece.to_string());
    let subject = format!("{}.live.{run}", app.namespace);
    for _ in 0..400 {
        let ack = js.publish(subject.clone(), piece.clone()).await.unwrap();
        ack.await.unwrap();
    }
    wait_for("the client to be cut off", PATIENCE, || async {
        metric("cut").await.filter(|n| *n == 1.0)
    })
    .await;
    let grown = resident_bytes().saturating_sub(before);
    eprintln!("resident memory grew by {} KiB", grown >> 10);
    assert!(
        grown < 40 << 20,
        "the gateway's process grew by {} MiB for a client that read nothing",
        grown >> 20
    );

    // When it reads at last: what was already on its way, the notice, and the stream's end.
    let mut received = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        let mut buffer = vec![0; 1 << 20];
        while !received.ends_with(b"\r\n0\r\n\r\n") {
            let n = client.read(&mut buffer).await.unwrap();
            assert!(n > 0, "the connection closed before the stream's end");
            received.extend_from_slice(&buffer[..n]);
        }
    })
    .await
    .expect("the stream's end within the patience");
    let head_end = received.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&received[..head_end]);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let events =
        countersign_model::sse::Decoder::default().push(&dechunked(&received[head_end + 4..]));
    let (notice, delivered) = events.split_last().unwrap();
    assert_eq!(notice.event, "stream.cut", "{notice:?}");
    assert!(notice.data.contains("Last-Event-ID"), "{notice:?}");
    let ids: Vec<u64> = delivered
        .iter()
        .map(|e| e.id.as_deref().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>());
    assert!(
        ids.len() < 400,
        "{} events were sent to a client that read none",
        ids.len()
    );
}

#[tokio::test]
async fn clients_following_at_once_through_two_gateways_see_the_same_events() {
    let mut app = app().await;
    let other = app.spawn_gateway(|_| {}).await;
    let run = app.start_run("Refund A-1001 please.").await;
    let mut clients = Vec::new();
    for base in [&app.gateway_url, &app.gateway_url, &other] {
        let (status, live) = LiveEvents::open_at(&app, base, &run, REQUESTER_KEY, None).await;
        assert_eq!(status, StatusCode::OK);
        clients.push(live.unwrap());
    }
    let paused = clients[0].until("approval.requested").await;
    approve(&app, &run, paused.last().unwrap()).await;
    let seen = futures::future::join_all(
        clients
            .iter_mut()
            .map(countersign_tests::live::LiveEvents::to_end),
    )
    .await;
    let mut first = paused;
    first.extend(seen[0].clone());
    assert_refund_run(&first);
    for other in &seen[1..] {
        assert_eq!(other, &first);
    }
}

#[tokio::test]
async fn an_announcement_stored_twice_is_shown_and_counted_once() {
    use async_nats::jetstream::message::PublishMessage;
    let app = app().await;
    let run = app.start_run("Refund A-1001 please.").await;
    let paused = follow(&app, &run, None)
        .await
        .until("approval.requested")
        .await;

    // The outbox sends an announcement again when NATS took it but its ack was lost; past
    // JetStream's two-minute duplicate window that is a second copy. The window is shortened
    // here so that the repeat of the pause is stored without waiting for it.
    let js = app.infra.jetstream().await;
    let mut stream = js
        .get_stream(format!("{}_LIVE", app.namespace))
        .await
        .unwrap();
    let mut config = stream.info().await.unwrap().config.clone();
    config.duplicate_window = std::time::Duration::from_millis(100);
    js.update_stream(config).await.unwrap();
    let id = RunId::parse(&run).unwrap();
    let requested = paused.last().unwrap().data.clone();
    let mut payload = requested.as_object().unwrap().clone();
    payload.remove("seq");
    let payload = bytes::Bytes::from(Value::Object(payload).to_string());
    let subject = format!("{}.live.{run}", app.namespace);
    wait_for("the repeat to be stored", PATIENCE, || async {
        let repeat = PublishMessage::build()
            .payload(payload.clone())
            .message_id(msg_id::requested(&id, 1));
        let ack = js.send_publish(subject.clone(), repeat).await.unwrap();
        (!ack.await.unwrap().duplicate).then_some(())
    })
    .await;

    approve(&app, &run, paused.last().unwrap()).await;
    let whole = follow(&app, &run, None).await.to_end().await;
    assert_refund_run(&whole);
}

/// A stream past a cap: answered 429 `too_many_streams`, with `Retry-After`.
async fn assert_refused(refused: Result<LiveEvents, reqwest::Response>, cap: &str) {
    let Err(response) = refused else {
        panic!("a stream past the {cap} cap was let open");
    };
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{cap}");
    let retry_after = response.headers()["retry-after"].to_str().unwrap();
    assert!(retry_after.parse::<u64>().unwrap() > 0, "{retry_after}");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_streams", "{cap}: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_past_a_keys_cap_are_refused_and_those_open_leave_probes_and_decisions_answering() {
    // Fewer connections than streams: open streams must not hold them.
    let app = TestApp::builder(refund_brain)
        .gateway(|config| {
            config.max_connections = 4;
            config.live_max_streams_per_principal = 3;
            config.live_max_streams_per_run = 5;
            config.live_max_streams = 6;
        })
        .start()
        .await;
    // A client that keeps no connection it is done with, as one opening streams in a loop.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let open = |run: String, key: &'static str| {
        let (http, base) = (http.clone(), app.gateway_url.clone());
        async move {
            let opened = LiveEvents::open_on(&http, &base, &run, key, None);
            tokio::time::timeout(PATIENCE, opened)
                .await
                .expect("the gateway answers a stream's request")
        }
    };
    let run = app.start_run("Refund A-1001 please.").await;
    let other = app.start_run("Refund A-1001 please.").await;
    let requested = app.wait_status(&run, "awaiting_approval").await;

    // One reader key, streams one after another: its cap, then refusals.
    let mut streams = Vec::new();
    for _ in 0..3 {
        streams.push(
            open(run.clone(), READER_KEY)
                .await
                .expect("under the key's cap"),
        );
    }
    for _ in 0..20 {
        assert_refused(open(run.clone(), READER_KEY).await, "principal").await;
    }
    // Other principals still follow the run, up to the run's cap.
    for _ in 0..2 {
        streams.push(
            open(run.clone(), REQUESTER_KEY)
                .await
                .expect("under the run's cap"),
        );
    }
    assert_refused(open(run.clone(), ADMIN_KEY).await, "run").await;
    // And other runs, up to the gateway's cap.
    let mut on_other = open(other.clone(), ADMIN_KEY)
        .await
        .expect("under every cap");
    assert_refused(open(other.clone(), REVIEWER_KEY).await, "gateway").await;

    // Six streams open on four connections' budget: probes, listings and decisions answer.
    let answered = |status: StatusCode, what: &str| assert_eq!(status, StatusCode::OK, "{what}");
    let probe = tokio::time::timeout(
        PATIENCE,
        app.http.get(format!("{}/livez", app.gateway_url)).send(),
    );
    answered(
        probe.await.expect("/livez answers").unwrap().status(),
        "/livez",
    );
    let listing = tokio::time::timeout(
        PATIENCE,
        app.request(
            reqwest::Method::GET,
            "/v1/approvals",
            Some(REVIEWER_KEY),
            None,
        ),
    );
    answered(listing.await.expect("the approvals answer").0, "approvals");
    // Decided once the pause is on the stream, as a reviewer told of it would.
    for live in &mut streams {
        live.until("approval.requested").await;
    }
    let digest = &requested["pending"][0]["digest"];
    let decision = tokio::time::timeout(PATIENCE, app.approve(&run, "toolu_2", digest));
    let (status, body) = decision.await.expect("a decision is answered");
    assert_eq!(status, StatusCode::OK, "{body}");

    // Every stream open on the run follows it to its end; the other run's goes on.
    for live in &mut streams {
        let events = live.to_end().await;
        assert_eq!(events.last().unwrap().kind, "run.completed");
    }
    assert_eq!(on_other.next().await.unwrap().kind, "turn.started");
    drop(streams);
    // Ended streams give their places back: the reader follows the run again.
    let mut again = wait_for(
        "the ended streams' places to be given back",
        PATIENCE,
        || {
            let opened = open(run.clone(), READER_KEY);
            async move { opened.await.ok() }
        },
    )
    .await;
    let events = again.to_end().await;
    assert_refund_run_kinds(&events);
}

#[tokio::test]
async fn an_event_whose_type_holds_a_line_break_does_not_stop_the_run_s_stream() {
    let app = app().await;
    let run = app.start_run("Refund A-1001 please.").await;
    let paused = follow(&app, &run, None)
        .await
        .until("approval.requested")
        .await;

    // Anything may be published on a run's live subject (a worker host, or whoever holds
    // its NATS user): a type with a line break would end the SSE field it is written in.
    let hostile = json!({"type": "text.delta\nevent: run.completed\r\ndata: {}\n", "text": "x"});
    app.publish_event(&format!("live.{run}"), &hostile).await;

    approve(&app, &run, paused.last().unwrap()).await;
    // A client from the start, and one that reconnects after the hostile event, both follow
    // the run to its end: the event is passed on under a name with no line break, its type
    // kept as it was in its data.
    let whole = follow(&app, &run, None).await.to_end().await;
    let at = paused.len();
    let odd = &whole[at];
    assert_eq!(odd.kind, "text.delta_event__run.completed__data_____");
    assert_eq!(odd.data["type"], hostile["type"]);
    assert_eq!(odd.id, Some(at as u64 + 1));
    let mut rest = whole.clone();
    rest.remove(at);
    assert_eq!(kinds(&rest), REFUND_RUN, "{whole:#?}");
    let after = follow(&app, &run, Some(at as u64)).await.to_end().await;
    assert_eq!(after.first().map(|e| e.id), Some(Some(at as u64 + 1)));
    assert_eq!(after.last().map(|e| e.kind.as_str()), Some("run.completed"));
}
