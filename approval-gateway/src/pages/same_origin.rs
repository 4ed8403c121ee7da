//! The reviewers' pages (the inbox's and the email links') change things only for requests a
//! browser sent from one of this gateway's own pages. A layer on those routes checks every
//! request whose method may change something (anything but `GET`, `HEAD` and `OPTIONS`):
//!
//! - with an `Origin` header, it must be the origin of a configured public base URL
//!   (`inbox.public_base_url`, `email.public_base_url`) or name the host the request was sent
//!   to (its `Host`), which a browser sets only when the posting page is on that same host and
//!   port;
//! - without one, or with `Origin: null` (sent from sandboxed frames and `data:` pages, but
//!   also by browsers keeping a page's origin private), `Sec-Fetch-Site` must be
//!   `same-origin` or `none` (the person's own doing), and a `null` origin without it is
//!   refused;
//! - with neither, the sender is not a browser that can be tricked into posting (`curl`, a
//!   script), and nothing else is asked of it here.
//!
//! A refused request gets a 403 page and never reaches its handler, so it changes nothing.

use super::layout;
use crate::state::AppState;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

/// The layer's function: passes the request on, or answers 403.
pub(crate) async fn check(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    ) {
        return next.run(request).await;
    }
    let bases = [
        state.config.inbox.public_base_url.as_deref(),
        state
            .config
            .email
            .as_ref()
            .map(|e| e.public_base_url.as_str()),
    ];
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| {
            request
                .uri()
                .authority()
                .map(axum::http::uri::Authority::as_str)
        });
    match from_elsewhere(request.headers(), bases.into_iter().flatten(), host) {
        None => next.run(request).await,
        Some(sender) => {
            tracing::warn!(
                sender,
                path = request.uri().path(),
                "a form sent from another site was refused"
            );
            layout::message(
                StatusCode::FORBIDDEN,
                "This form was sent from another site",
                "Your browser sent it from a page that is not one of this gateway's, so it was \
                 refused and nothing was changed. If you meant to send it, open the page on \
                 this gateway and send it from there.",
            )
        }
    }
}

/// Who sent a request from another site (its `Origin` or `Sec-Fetch-Site`), if one did.
fn from_elsewhere<'a>(
    headers: &'a HeaderMap,
    bases: impl IntoIterator<Item = &'a str>,
    host: Option<&str>,
) -> Option<&'a str> {
    let value = |name: &str| {
        headers
            .get(name)
            .map(|v| v.to_str().unwrap_or("(not text)"))
    };
    let site = value("sec-fetch-site");
    match value(header::ORIGIN.as_str()) {
        Some("null") if site.is_none() => Some("null"),
        Some(origin) if origin != "null" => {
            let sent = origin_of(origin);
            let ours = sent.is_some()
                && (bases.into_iter().any(|base| origin_of(base) == sent)
                    || host.is_some_and(|host| {
                        host_of(origin).is_some_and(|h| h.eq_ignore_ascii_case(host))
                    }));
            (!ours).then_some(origin)
        }
        _ => site.filter(|site| !matches!(*site, "same-origin" | "none")),
    }
}

/// `scheme://host[:port]` of a URL, as browsers write it in `Origin` (lowercase, no default
/// port); `None` for what has no such origin (`null`, not a URL).
fn origin_of(url: &str) -> Option<String> {
    let url = reqwest::Url::parse(url).ok()?;
    Some(url.origin().ascii_serialization()).filter(|o| o != "null")
}

/// `host[:port]` of an origin, as a browser writes it in `Host` (no default port).
fn host_of(origin: &str) -> Option<String> {
    let url = reqwest::Url::parse(origin).ok()?;
    let host = url.host_str()?;
    Some(match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn sent(headers: &[(&'static str, &'static str)]) -> HeaderMap {
        headers
            .iter()
            .map(|(name, value)| (name.parse().unwrap(), HeaderValue::from_static(value)))
            .collect()
    }

    const BASE: [&str; 1] = ["https://approvals.example.com/"];

    #[test]
    fn the_configured_origin_and_the_requests_own_host_are_ours() {
        for origin in [
            "https://approvals.example.com",
            "https://APPROVALS.example.com",
            "https://approvals.example.com:443",
        ] {
            let headers = sent(&[("origin", origin)]);
            assert_eq!(from_elsewhere(&headers, BASE, Some("10.0.0.5:8080")), None);
        }
        let headers = sent(&[("origin", "http://127.0.0.1:8080")]);
        assert_eq!(from_elsewhere(&headers, [], Some("127.0.0.1:8080")), None);
        let headers = sent(&[("origin", "http://[::1]:8080")]);
        assert_eq!(from_elsewhere(&headers, [], Some("[::1]:8080")), None);
    }

    #[test]
    fn another_origin_or_a_null_one_is_not() {
        for origin in [
            "http://approvals.example.com",
            "https://approvals.example.com:8443",
            "https://evil.example",
            "http://localhost:8080",
            "http://127.0.0.1:9999",
            "null",
            "not a url",
        ] {
            let headers = sent(&[("origin", origin)]);
            assert_eq!(
                from_elsewhere(&headers, BASE, Some("127.0.0.1:8080")),
                Some(origin)
            );
        }
    }

    #[test]
    fn without_an_origin_the_fetch_site_decides_and_without_either_it_is_allowed() {
        for (site, refused) in [
            ("same-origin", false),
            ("none", false),
            ("same-site", true),
            ("cross-site", true),
        ] {
            let headers = sent(&[("sec-fetch-site", site)]);
            assert_eq!(from_elsewhere(&headers, BASE, None).is_some(), refused);
        }
        assert_eq!(from_elsewhere(&HeaderMap::new(), BASE, None), None);
    }

    #[test]
    fn a_null_origin_is_judged_by_the_fetch_site() {
        let ours = sent(&[("origin", "null"), ("sec-fetch-site", "same-origin")]);
        assert_eq!(from_elsewhere(&ours, BASE, None), None);
        let theirs = sent(&[("origin", "null"), ("sec-fetch-site", "cross-site")]);
        assert_eq!(from_elsewhere(&theirs, BASE, None), Some("cross-site"));
    }
}
