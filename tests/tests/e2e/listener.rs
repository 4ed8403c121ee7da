//! The gateway's listener: slow or silent clients are cut off after the configured timeouts
//! (headers, body, and idle for a client that stops reading), they do not keep others from
//! being answered, connections beyond `max_connections` wait until a slot frees, and a
//! request in flight when the gateway stops is still answered.

use countersign_fake_model::refund_brain;
use countersign_tests::app::{PATIENCE, REQUESTER_KEY, TestApp};
use countersign_tests::wait_for;
use reqwest::StatusCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SLOW_CLIENTS: usize = 800;
const HEADER_TIMEOUT_MS: u64 = 3000;
const BODY_TIMEOUT_MS: u64 = 3000;
/// Room above a timeout for a loaded machine to get round to closing a connection. Without
/// the timeouts these connections would stay open for good, so any bound shows the behaviour.
const SLACK: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug)]
enum Slow {
    /// Connects and sends nothing.
    Silent,
    /// Sends a request line, then a header a byte at a time.
    Headers,
    /// Sends a whole head announcing a body, then the body a byte at a time.
    Body,
}

/// What a slow client saw: how long until the server closed the connection, and what it
/// answered before that.
struct Cut {
    after: Duration,
    answer: String,
}

/// Plays a slow client on `stream` until the server closes the connection.
async fn slow_client(mut stream: TcpStream, slow: Slow, host: String) -> Cut {
    let start = Instant::now();
    match slow {
        Slow::Silent => {}
        Slow::Headers => {
            let head = format!("GET /healthz HTTP/1.1\r\nhost: {host}\r\nx-slow: ");
            stream.write_all(head.as_bytes()).await.unwrap();
        }
        Slow::Body => {
            let head = format!(
                "POST /v1/runs HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {REQUESTER_KEY}\r\n\
                 content-type: application/json\r\ncontent-length: 1000\r\n\r\n{{"
            );
            stream.write_all(head.as_bytes()).await.unwrap();
        }
    }
    let (mut reader, mut writer) = stream.into_split();
    let mut answer = Vec::new();
    let mut drip = tokio::time::interval(Duration::from_millis(200));
    let mut buf = [0u8; 4096];
    loop {
        tokio::select! {
            read = reader.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            },
            _ = drip.tick(), if !matches!(slow, Slow::Silent) => {
                // A write may fail once the server has gone; the read then sees it too.
                let _ = writer.write_all(b"a").await;
            }
        }
    }
    Cut {
        after: start.elapsed(),
        answer: String::from_utf8_lossy(&answer).into_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_after_their_timeouts_while_the_api_keeps_answering() {
    let app = TestApp::builder(refund_brain)
        .workers(0)
        .gateway(|config| {
            config.header_read_timeout_ms = HEADER_TIMEOUT_MS;
            config.body_timeout_ms = BODY_TIMEOUT_MS;
        })
        .start()
        .await;
    let host = app.gateway_url.trim_start_matches("http://").to_string();
    let open = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for i in 0..SLOW_CLIENTS {
        let slow = [Slow::Silent, Slow::Headers, Slow::Body][i % 3];
        let stream = TcpStream::connect(&host).await.unwrap();
        let (open, host) = (open.clone(), host.clone());
        open.fetch_add(1, Ordering::SeqCst);
        clients.push(tokio::spawn(async move {
            let cut = slow_client(stream, slow, host).await;
            open.fetch_sub(1, Ordering::SeqCst);
            (slow, cut)
        }));
    }

    // (a) Normal requests are answered while the slow connections are held.
    let mut held_while_answering = usize::MAX;
    for _ in 0..20 {
        let (status, body) = app.get("/v1/approvals").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        held_while_answering = held_while_answering.min(open.load(Ordering::SeqCst));
    }
    assert_eq!(
        held_while_answering, SLOW_CLIENTS,
        "every slow connection was still open while the API answered"
    );

    // (b) The server closes every slow connection, each after its timeout.
    let mut slowest = [Duration::ZERO; 3];
    for client in clients {
        let (slow, cut) = tokio::time::timeout(
            Duration::from_millis(HEADER_TIMEOUT_MS.max(BODY_TIMEOUT_MS)) + SLACK,
            client,
        )
        .await
        .expect("the server closed the slow connection")
        .unwrap();
        let limit = match slow {
            Slow::Silent | Slow::Headers => HEADER_TIMEOUT_MS,
            Slow::Body => BODY_TIMEOUT_MS,
        };
        assert!(
            cut.after < Duration::from_millis(limit) + SLACK,
            "{slow:?} connection closed only after {:?}",
            cut.after
        );
        match slow {
            Slow::Silent | Slow::Headers => {
                assert!(cut.answer.is_empty(), "{slow:?} got {:?}", cut.answer);
            }
            Slow::Body => {
                assert!(
                    cut.answer.starts_with("HTTP/1.1 408"),
                    "a late body is answered 408: {:?}",
                    cut.answer
                );
                assert!(cut.answer.contains(r#""code":"body_timeout""#));
            }
        }
        let i = slow as usize;
        slowest[i] = slowest[i].max(cut.after);
    }
    println!(
        "{SLOW_CLIENTS} slow connections held; slowest cut after: silent {:?}, headers {:?}, \
         body {:?} (timeouts {HEADER_TIMEOUT_MS} ms / {BODY_TIMEOUT_MS} ms)",
        slowest[0], slowest[1], slowest[2]
    );
    let (status, _) = app.get("/v1/approvals").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_beyond_the_limit_waits_until_slow_ones_are_cut_off_then_is_served() {
    const LIMIT: usize = 50;
    let app = TestApp::builder(refund_brain)
        .workers(0)
        .gateway(|config| {
            config.header_read_timeout_ms = 1000;
            config.max_connections = LIMIT;
        })
        .start()
        .await;
    let host = app.gateway_url.trim_start_matches("http://").to_string();
    // Three times the limit: the first fill every slot, the rest wait in the backlog, each
    // accepted only when one before it is cut off.
    let cut = Arc::new(AtomicUsize::new(0));
    for _ in 0..3 * LIMIT {
        let stream = TcpStream::connect(&host).await.unwrap();
        let (cut, host) = (cut.clone(), host.clone());
        tokio::spawn(async move {
            slow_client(stream, Slow::Silent, host).await;
            cut.fetch_add(1, Ordering::SeqCst);
        });
    }
    let fresh = reqwest::Client::new();
    let response = fresh
        .get(format!("{}/healthz", app.gateway_url))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("the waiting connection is served in the end");
    assert_eq!(response.status(), StatusCode::OK);
    // It was accepted after the last silent one, so at least all but a slot's worth of them
    // had been cut off (one slot may have been the harness's own kept-alive connection).
    let cut_before = cut.load(Ordering::SeqCst);
    assert!(
        cut_before >= 2 * LIMIT - 1,
        "only {cut_before} slow connections were cut off before the waiting one was served"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_its_answers_is_cut_off_after_the_idle_timeout() {
    let app = TestApp::builder(refund_brain)
        .workers(0)
        .gateway(|config| {
            config.idle_timeout_ms = 1000;
            // Far off, so that only the idle timeout can end the connection.
            config.header_read_timeout_ms = 120_000;
        })
        .start()
        .await;
    let host = app.gateway_url.trim_start_matches("http://").to_string();
    let stream = TcpStream::connect(&host).await.unwrap();
    // Pipelined requests, never reading the answers: once the buffers are full both ways, the
    // server is stuck writing, nothing moves, and only the idle timeout can free it.
    let requests = format!("GET /livez HTTP/1.1\r\nhost: {host}\r\n\r\n").repeat(2000);
    let mut offset = 0;
    let started = Instant::now();
    let limit = Duration::from_secs(90);
    loop {
        assert!(
            started.elapsed() < limit,
            "the stalled connection was still open after {limit:?}"
        );
        match stream.try_write(&requests.as_bytes()[offset..]) {
            Ok(n) => offset = (offset + n) % requests.len(),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Full: wait until it drains or the server gives up on it.
                let _ = tokio::time::timeout(Duration::from_millis(100), stream.writable()).await;
            }
            Err(_) => break,
        }
    }
    println!(
        "a client that stopped reading was cut off {:?} after it started writing",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_when_the_gateway_stops_is_still_answered() {
    let app = TestApp::builder(refund_brain).workers(0).start().await;
    let host = app.gateway_url.trim_start_matches("http://").to_string();
    let body = r#"{"agent": "refunds", "input": "Refund A-1001 please."}"#;
    let mut stream = TcpStream::connect(&host).await.unwrap();
    // With `expect: 100-continue` the server says when the handler starts reading the body:
    // from then on the request is in flight.
    let head = format!(
        "POST /v1/runs HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {REQUESTER_KEY}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nexpect: 100-continue\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut buf = [0u8; 4096];
    let n = stream.read(&mut buf).await.unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 100"), "{answer:?}");

    app.stop_gateway();
    // No new connection is taken once it is stopping.
    wait_for("the gateway to stop accepting", PATIENCE, || async {
        TcpStream::connect(&host).await.err().map(|_| ())
    })
    .await;
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 202"),
        "the request in flight finished: {answer:?}"
    );
}
