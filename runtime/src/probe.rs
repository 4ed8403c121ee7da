//! `approval-gateway probe URL` and `agent-worker probe URL`: one plain HTTP/1.1 GET, for
//! container healthchecks in images that have no shell and no curl. The process exits 0 when
//! the answer is 200 and 1 otherwise, saying why on stderr. It is checked before the service
//! reads its config or starts a runtime, so a probe costs one connection and nothing else.
//!
//! Only `http://host[:port][/path]` is understood: the probes listen without TLS.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// How long the whole probe may take: connecting, sending and reading the answer.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// The most of an answer that is read; the status line and a short body fit easily.
const MAX_ANSWER: usize = 16 * 1024;

/// Why a probe did not get a 200.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The URL is not `http://host[:port][/path]`.
    #[error("{0:?} is not an http://host[:port][/path] URL")]
    BadUrl(String),
    /// The host name did not resolve.
    #[error("cannot resolve {0}: {1}")]
    Resolve(String, std::io::Error),
    /// No connection could be made to the address.
    #[error("cannot connect to {0}: {1}")]
    Connect(String, std::io::Error),
    /// The answer did not come within the time given.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    /// Sending the request or reading the answer failed.
    #[error("the connection failed: {0}")]
    Io(std::io::Error),
    /// The answer does not start with an HTTP status line; its start.
    #[error("the answer is not HTTP: {0:?}")]
    NotHttp(String),
    /// The answer's status was not 200.
    #[error("answered {status}: {body}")]
    Status {
        /// The HTTP status the answer gave.
        status: u16,
        /// The start of the answer's body.
        body: String,
    },
}

/// What a probe URL names.
struct Target {
    /// `host:port`, as resolved and as sent in `Host`.
    authority: String,
    path: String,
}

fn parse(url: &str) -> Result<Target, ProbeError> {
    let bad = || ProbeError::BadUrl(url.to_string());
    let rest = url.strip_prefix("http://").ok_or_else(bad)?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() || authority.contains('@') || path.contains(char::is_whitespace) {
        return Err(bad());
    }
    // A port is present unless the authority ends in a host: `[::1]` or a name without ':'.
    let has_port = match authority.rfind(']') {
        Some(close) => authority[close..].contains(':'),
        None => authority.contains(':'),
    };
    let authority = if has_port {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    Ok(Target {
        authority,
        path: path.to_string(),
    })
}

/// GETs `url` and succeeds only on a 200, all within `timeout`.
pub fn probe(url: &str, timeout: Duration) -> Result<(), ProbeError> {
    let target = parse(url)?;
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(ProbeError::TimedOut(timeout))
    };
    let addrs: Vec<SocketAddr> = target
        .authority
        .to_socket_addrs()
        .map_err(|e| ProbeError::Resolve(target.authority.clone(), e))?
        .collect();
    let mut stream = None;
    let mut last_error = None;
    for addr in &addrs {
        match TcpStream::connect_timeout(addr, left()?) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last_error = Some(e),
        }
    }
    let mut stream = stream.ok_or_else(|| {
        let e = last_error.unwrap_or_else(|| std::io::Error::other("no address"));
        ProbeError::Connect(target.authority.clone(), e)
    })?;

    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            ProbeError::TimedOut(timeout)
        }
        _ => ProbeError::Io(e),
    };
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: countersign-probe\r\nConnection: close\r\n\r\n",
        target.path, target.authority
    );
    stream.set_write_timeout(Some(left()?)).map_err(io)?;
    stream.write_all(request.as_bytes()).map_err(io)?;

    // `Connection: close`: the answer ends when the server closes, or once enough is read.
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while answer.len() < MAX_ANSWER {
        stream.set_read_timeout(Some(left()?)).map_err(io)?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
    }
    status_of(&answer)
}

/// Reads the status line; `Ok` for a 200, else the status and the start of the body.
fn status_of(answer: &[u8]) -> Result<(), ProbeError> {
    let text = String::from_utf8_lossy(answer);
    let status_line = text.lines().next().unwrap_or_default();
    let mut parts = status_line.split(' ');
    let version = parts.next().unwrap_or_default();
    let status = parts.next().and_then(|s| s.parse::<u16>().ok());
    let status = match status {
        Some(s) if version.starts_with("HTTP/1.") => s,
        _ => return Err(ProbeError::NotHttp(status_line.chars().take(80).collect())),
    };
    if status == 200 {
        return Ok(());
    }
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.trim())
        .unwrap_or_default();
    Err(ProbeError::Status {
        status,
        body: body.chars().take(300).collect(),
    })
}

/// When the program was started as `<program> probe URL`, probes and exits: 0 on a 200, 1
/// otherwise (2 for a missing URL). Otherwise returns, and the service starts as usual.
pub fn exit_if_asked() {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() != Some("probe") {
        return;
    }
    let Some(url) = args.next() else {
        eprintln!("usage: probe http://host:port/path");
        std::process::exit(2);
    };
    match probe(&url, TIMEOUT) {
        Ok(()) => {
            println!("{url}: 200");
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("{url}: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::thread;

    /// A listener that answers one connection with `answer` once it has read the request,
    /// and the URL to reach it.
    fn serve_once(answer: &'static str) -> (String, thread::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/readyz", listener.local_addr().unwrap());
        let server = thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.ends_with(b"\r\n\r\n") {
                let n = conn.read(&mut buf).unwrap();
                assert!(n > 0, "the probe closed before finishing its request");
                request.extend_from_slice(&buf[..n]);
            }
            conn.write_all(answer.as_bytes()).unwrap();
            String::from_utf8(request).unwrap()
        });
        (url, server)
    }

    #[test]
    fn a_200_answer_is_healthy_and_the_request_is_a_plain_get() {
        let (url, server) =
            serve_once("HTTP/1.1 200 OK\r\ncontent-length: 18\r\n\r\n{\"status\":\"ready\"}");
        probe(&url, TIMEOUT).unwrap();
        let request = server.join().unwrap();
        assert!(request.starts_with("GET /readyz HTTP/1.1\r\n"), "{request}");
        assert!(request.contains("\r\nHost: 127.0.0.1:"), "{request}");
    }

    #[test]
    fn a_503_answer_is_unhealthy_and_says_what_the_service_said() {
        let (url, server) = serve_once(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 25\r\n\r\n{\"error\":\"redis is away\"}",
        );
        let err = probe(&url, TIMEOUT).unwrap_err();
        server.join().unwrap();
        match err {
            ProbeError::Status { status, body } => {
                assert_eq!(status, 503);
                assert!(body.contains("redis is away"), "{body}");
            }
            other => panic!("expected a status error, got {other}"),
        }
    }

    #[test]
    fn nothing_listening_is_unhealthy() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/livez", listener.local_addr().unwrap());
        drop(listener);
        let err = probe(&url, TIMEOUT).unwrap_err();
        assert!(matches!(err, ProbeError::Connect(..)), "{err}");
    }

    #[test]
    fn a_silent_server_is_unhealthy_within_the_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/readyz", listener.local_addr().unwrap());
        let started = Instant::now();
        let err = probe(&url, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, ProbeError::TimedOut(_)), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2));
        drop(listener);
    }

    #[test]
    fn urls_other_than_plain_http_are_refused() {
        for url in [
            "https://x/readyz",
            "x:80/readyz",
            "http:///readyz",
            "http://u@x/",
        ] {
            assert!(matches!(parse(url), Err(ProbeError::BadUrl(_))), "{url}");
        }
        let t = parse("http://gateway:8080/readyz").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.path.as_str()),
            ("gateway:8080", "/readyz")
        );
        assert_eq!(parse("http://[::1]").unwrap().authority, "[::1]:80");
        assert_eq!(parse("http://[::1]:9090/").unwrap().authority, "[::1]:9090");
    }
}
